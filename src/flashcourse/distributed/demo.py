"""What ``python -m flashcourse.distributed.launch`` runs in every rank: ring attention or Ulysses on this rank's
shard of one random sequence, forward and backward, compared with one process's attention on the whole sequence.

Every rank draws the same inputs from one seed, so no rank needs to send the others the sequence.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from .. import reference, tiled
from ._group import current
from .ring import block_work, ring_attention
from .schedule import kv_source, sequence_indices
from .sharding import shard, unshard
from .ulysses import ulysses_attention

__all__ = ["DemoOptions", "compare_with_one_process"]


@dataclass(frozen=True)
class DemoOptions:
    method: str  # "ring" | "ulysses"
    n: int
    heads: int
    head_dim: int
    causal: bool
    layout: str  # "contiguous" | "zigzag" ("contiguous" for Ulysses)
    seed: int = 0


def _ranges(positions: np.ndarray) -> str:
    """[0 1 2 9 10 11] -> '0-2, 9-11'."""
    breaks = np.flatnonzero(np.diff(positions) != 1) + 1
    return ", ".join(f"{run[0]}-{run[-1]}" for run in np.split(positions, breaks))


def _describe_ring_steps(world: int, rank: int, options: DemoOptions, n_local: int) -> None:
    for step in range(world):
        work = block_work(world, rank, step, n_local=n_local, causal=options.causal, layout=options.layout)
        source = kv_source(world, rank, step)
        if work is None:
            print(f"  step {step}: K/V of rank {source}: skipped, the causal mask hides every key")
            continue
        kind = "causal (lower triangle)" if work.causal else "full"
        print(f"  step {step}: K/V of rank {source}: local rows {work.rows.start}-{work.rows.stop - 1} x key rows "
              f"{work.cols.start}-{work.cols.stop - 1}, {kind}")


def compare_with_one_process(options: DemoOptions) -> None:
    """Run options.method across the group, then print this rank's share of the work and the largest error of
    o, dq, dk, dv against the float64 reference on the whole sequence."""
    ring = current(what="compare_with_one_process")
    generator = torch.Generator().manual_seed(options.seed)
    shape = (1, options.heads, options.n, options.head_dim)  # (B, H, N, D), the same on every rank
    q, k, v, do = (torch.randn(shape, generator=generator) for _ in range(4))

    positions = sequence_indices(options.n, ring.world, ring.rank, options.layout)
    print(f"{options.method}, {options.layout} layout, {'causal' if options.causal else 'not causal'}, "
          f"N={options.n}: this rank holds positions {_ranges(positions)}")
    if options.method == "ring":
        _describe_ring_steps(ring.world, ring.rank, options, len(positions))
    else:
        per_rank = options.heads // ring.world if options.heads % ring.world == 0 else None
        if per_rank is not None:
            print(f"  after the all-to-all: heads {ring.rank * per_rank}-{(ring.rank + 1) * per_rank - 1}, "
                  f"all {options.n} positions")

    local = [shard(x, layout=options.layout).requires_grad_() for x in (q, k, v)]
    started = time.perf_counter()
    if options.method == "ring":
        o_local = ring_attention(*local, causal=options.causal, layout=options.layout)
    else:
        o_local = ulysses_attention(*local, causal=options.causal)
    o_local.backward(shard(do, layout=options.layout))
    seconds = time.perf_counter() - started

    got = [unshard(t, layout=options.layout) for t in (o_local.detach(), *(x.grad for x in local))]
    q64, k64, v64, do64 = (x[0].double().numpy() for x in (q, k, v, do))  # (H, N, D)
    o_ref, lse_ref = reference.attention_lse(q64, k64, v64, causal=options.causal)
    grads_ref = tiled.flash_backward(q64, k64, v64, o_ref, lse_ref, do64, causal=options.causal)
    errors = {name: float(np.abs(mine[0].numpy() - ref).max())
              for name, mine, ref in zip(("o", "dq", "dk", "dv"), got, (o_ref, *grads_ref), strict=True)}
    print(f"  forward + backward took {seconds:.1f} s (Triton interpreter); largest error vs one process, "
          + ", ".join(f"{name} {err:.1e}" for name, err in errors.items()))
