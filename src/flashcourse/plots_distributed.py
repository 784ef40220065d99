"""Lesson 12's figures: who computes which causal block in ring attention, and when compute hides the transfers.

Every function returns a matplotlib Figure and computes nothing that ``flashcourse.distributed.schedule`` and
``flashcourse.distributed.cost`` do not already return.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.colors import ListedColormap

from .distributed import cost, schedule

__all__ = ["ring_schedule", "step_time"]


def ring_schedule(world: int, layouts=schedule.LAYOUTS):
    """Per layout, the causal chunk-by-chunk attention matrix, each block coloured by the rank computing it and
    labelled with the ring step (and "/2" for a diagonal block, of which only the lower triangle is computed);
    blank blocks are skipped."""
    fig, axes = plt.subplots(1, len(layouts), figsize=(5 * len(layouts), 4.6), squeeze=False)
    colours = ListedColormap(plt.get_cmap("tab10").colors[:world])
    for ax, layout in zip(axes[0], layouts, strict=True):
        chunks = world * schedule.chunks_per_rank(layout)
        owner = np.full((chunks, chunks), np.nan)
        for rank in range(world):
            for step in range(world):
                for (qc, kc), kind in schedule.block_schedule(world, rank, step, layout).items():
                    if kind == "skip":
                        continue
                    owner[qc, kc] = rank
                    ax.text(kc, qc, f"s{step}" + ("/2" if kind == "lower" else ""), ha="center", va="center",
                            fontsize=9 if chunks <= 8 else 7)
        ax.imshow(owner, cmap=colours, vmin=-0.5, vmax=world - 0.5, alpha=0.6)
        work = [sum({"full": 1.0, "lower": 0.5, "skip": 0.0}[k] for s in range(world)
                    for k in schedule.block_schedule(world, r, s, layout).values()) for r in range(world)]
        ax.set_title(f"{layout}: share of the work per rank " + ", ".join(f"{w / sum(work):.0%}" for w in work))
        ax.set_xlabel("key chunk")
        ax.set_ylabel("query chunk")
        ax.set_xticks(range(chunks))
        ax.set_yticks(range(chunks))
    handles = [plt.Rectangle((0, 0), 1, 1, color=colours(r), alpha=0.6) for r in range(world)]
    fig.legend(handles, [f"rank {r}" for r in range(world)], loc="lower center", ncol=world)
    fig.suptitle(f"Causal ring attention over {world} ranks: who computes each block, at which step (s)")
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    return fig


def step_time(seq_lens, *, world: int, heads: int, head_dim: int, tflops: float, link_gbs: float,
              element_bytes: int = 2):
    """Per ring step, forward: milliseconds to compute a block at ``tflops`` and to send a K/V shard at
    ``link_gbs`` GB/s, against the sequence length (causal, zigzag, B = 1). Compute grows as N^2, the transfer
    as N, so above the crossing the transfer hides behind the compute."""
    seq_lens = np.asarray(seq_lens)
    compute = [cost.ring_step_flops(1, heads, n, head_dim, world) / (tflops * 1e12) * 1e3 for n in seq_lens]
    transfer = [cost.ring_step_bytes(1, heads, n, head_dim, world, element_bytes) / (link_gbs * 1e9) * 1e3
                for n in seq_lens]
    fig, ax = plt.subplots(figsize=(6.5, 4))
    ax.loglog(seq_lens, compute, "o-", label=f"compute a block at {tflops:.0f} TFLOP/s")
    ax.loglog(seq_lens, transfer, "s-", label=f"send a K/V shard at {link_gbs:.0f} GB/s")
    ax.set_xlabel("sequence length N (tokens, whole sequence)")
    ax.set_ylabel("time per ring step (ms)")
    ax.set_title(f"One ring step on {world} GPUs: H={heads}, D={head_dim}, bf16, causal")
    ax.legend()
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    return fig
