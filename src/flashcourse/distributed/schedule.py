"""Who holds which part of the sequence, and which attention blocks each rank computes at each ring step.

Pure Python and NumPy (no torch, no process group): the ring and the shard functions follow these maps, the
lesson draws them and exercise 11 asks for them.

The sequence of N positions is cut into equal chunks. ``"contiguous"``: P chunks, rank r holds chunk r.
``"zigzag"``: 2P chunks, rank r holds chunks r and 2P-1-r, so that under a causal mask every rank has the same
amount of work (one early chunk, one late chunk). Zigzag is the "load-balanced" layout of ring-attention
implementations; Brandon et al. 2023 ("Striped Attention") balance the same work with a round-robin layout.

Ring attention (Liu, Zaharia, Abbeel 2023) keeps each rank's queries in place and passes the K/V shards around
the ring: at step s rank r holds the K/V of rank (r - s) mod P.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "LAYOUTS",
    "block_kind",
    "block_schedule",
    "chunks_per_rank",
    "dkv_route",
    "kv_source",
    "rank_chunks",
    "sequence_indices",
    "zigzag_indices",
]

LAYOUTS = ("contiguous", "zigzag")


def _check_world_rank(world: int, rank: int) -> None:
    if isinstance(world, bool) or not isinstance(world, (int, np.integer)) or world < 1:
        raise ValueError(f"world must be a positive int (the number of ranks), got {world!r}")
    if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or not 0 <= rank < world:
        raise ValueError(f"rank must be an int in [0, {world}), got {rank!r}")


def _check_layout(layout: str) -> None:
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")


def chunks_per_rank(layout: str) -> int:
    """How many chunks of the sequence each rank holds: 1 (contiguous) or 2 (zigzag)."""
    _check_layout(layout)
    return 1 if layout == "contiguous" else 2


def rank_chunks(world: int, rank: int, layout: str = "zigzag") -> list[int]:
    """The chunk ids rank ``rank`` holds, in the order it stores them (ascending), out of P or 2P chunks."""
    _check_world_rank(world, rank)
    _check_layout(layout)
    return [rank] if layout == "contiguous" else [rank, 2 * world - 1 - rank]


def _chunk_size(n: int, world: int, layout: str) -> int:
    pieces = world * chunks_per_rank(layout)
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1 or n % pieces:
        raise ValueError(
            f"a sequence of {n!r} positions cannot be split into {pieces} equal chunks ({layout} layout over "
            f"{world} ranks): N must be a multiple of {pieces}; pad the sequence (and mask the padding) or pick "
            "another N"
        )
    return n // pieces


def sequence_indices(n: int, world: int, rank: int, layout: str = "zigzag") -> np.ndarray:
    """The sequence positions (int64, ascending) that rank ``rank`` holds, in the given layout."""
    _check_world_rank(world, rank)
    size = _chunk_size(n, world, layout)
    return np.concatenate([np.arange(c * size, (c + 1) * size) for c in rank_chunks(world, rank, layout)])


def zigzag_indices(n: int, world: int, rank: int) -> np.ndarray:
    """Positions of chunks ``rank`` and ``2*world-1-rank`` of 2*world equal chunks: zigzag_indices(8, 2, 0) is
    [0, 1, 6, 7]."""
    return sequence_indices(n, world, rank, "zigzag")


def kv_source(world: int, rank: int, step: int) -> int:
    """Whose K/V shard rank ``rank`` holds at ring step ``step``: K/V move one rank forward per step."""
    _check_world_rank(world, rank)
    if not 0 <= step < world:
        raise ValueError(f"step must be in [0, {world}) for a ring of {world} ranks, got {step!r}")
    return (rank - step) % world


def block_kind(q_chunk: int, k_chunk: int) -> str:
    """Under a causal mask, a block of query chunk x key chunk (equal sizes) is "full" when every key comes
    before every query, "lower" (its lower triangle, diagonal included) on the diagonal, "skip" above it."""
    if k_chunk < q_chunk:
        return "full"
    return "lower" if k_chunk == q_chunk else "skip"


def block_schedule(world: int, rank: int, step: int, layout: str = "zigzag") -> dict[tuple[int, int], str]:
    """Causal work of rank ``rank`` at ring step ``step``: {(q_chunk, k_chunk): "full" | "lower" | "skip"} for
    every pair of a query chunk it holds and a key chunk of the K/V shard it holds then."""
    q_chunks = rank_chunks(world, rank, layout)
    k_chunks = rank_chunks(world, kv_source(world, rank, step), layout)
    return {(qc, kc): block_kind(qc, kc) for qc in q_chunks for kc in k_chunks}


def dkv_route(world: int, rank: int, step: int) -> list[int]:
    """The ranks that the dK/dV partial computed by ``rank`` at ring step ``step`` passes through, in order,
    the last being the owner of those keys; [] at step 0 (the keys are the rank's own).

    The backward sends one dK/dV accumulator per K/V shard around the ring behind its keys: each rank adds its
    partial and forwards it to rank + 1, and the hop after the last step brings it home.
    """
    owner = kv_source(world, rank, step)
    return [(rank + hop) % world for hop in range(1, (owner - rank) % world + 1)]
