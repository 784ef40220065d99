"""Split a sequence across the ranks of a process group, and put it back together.

``shard`` keeps this rank's positions (no communication: every rank already has the whole tensor, e.g. from one
seed); ``unshard`` all-gathers the shards and undoes the layout's order, so every rank ends with the whole.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ._group import current
from .schedule import sequence_indices

__all__ = ["shard", "unshard"]


def shard(x: torch.Tensor, *, dim: int = 2, layout: str = "zigzag", group=None) -> torch.Tensor:
    """This rank's part of the sequence ``x``, as a new tensor: what :func:`ring_attention` and
    :func:`ulysses_attention` take.

    Args:
        x: a tensor holding the whole sequence along ``dim``, e.g. (B, H, N, D), the same on every rank.
        dim: the sequence dim (default 2, N of (B, H, N, D)).
        layout: "zigzag" (default) or "contiguous". Contiguous: the sequence cut into P equal chunks, rank r
            holding chunk r. Zigzag: 2P equal chunks, rank r holding chunks r and 2P - 1 - r, so that under a
            causal mask every rank has the same work (``zigzag_indices(8, 2, 0)`` is [0, 1, 6, 7]).
        group: the process group (default: the whole world, ``torch.distributed``'s default group), already
            initialised; every rank of it must make the same call.

    Returns:
        x's positions held by this rank, in ascending order: N / P of them along ``dim``, x's dtype and device.
        Raises ValueError when N does not split into equal chunks (P of them, 2P for zigzag).

    Example::

        torch.distributed.init_process_group("gloo")  # torchrun, or python -m flashcourse.distributed.launch
        q_local = shard(q)  # (B, H, N / P, D), this rank's two zigzag chunks
    """
    ring = current(group, what="shard")
    index = torch.from_numpy(sequence_indices(x.shape[dim], ring.world, ring.rank, layout)).to(x.device)
    return x.index_select(dim, index)


def unshard(x_local: torch.Tensor, *, dim: int = 2, layout: str = "zigzag", group=None) -> torch.Tensor:
    """The whole sequence on every rank, from each rank's shard along ``dim``: all-gather, then reorder.

    The inverse of :func:`shard`: ``unshard(shard(x)) == x`` on every rank.

    Args:
        x_local: this rank's shard, as :func:`shard` returns it (N / P positions along ``dim``).
        dim: the sequence dim (default 2).
        layout: "zigzag" (default) or "contiguous". Contiguous: the sequence cut into P equal chunks, rank r
            holding chunk r. Zigzag: 2P equal chunks, rank r holding chunks r and 2P - 1 - r, so that under a
            causal mask every rank has the same work (``zigzag_indices(8, 2, 0)`` is [0, 1, 6, 7]).
        group: the process group (default: the whole world, ``torch.distributed``'s default group), already
            initialised; every rank of it must make the same call.

    Returns:
        The whole sequence (N positions along ``dim``, in order), x_local's dtype and device, on every rank.
        Not differentiable (an all-gather).

    Example::

        o = unshard(ring_attention(shard(q), shard(k), shard(v), causal=True))  # (B, H, N, D) on every rank
    """
    ring = current(group, what="unshard")
    gathered = [torch.empty_like(x_local) for _ in range(ring.world)]
    dist.all_gather(gathered, x_local.contiguous(), group=group)
    n = x_local.shape[dim] * ring.world
    positions = torch.cat([torch.from_numpy(sequence_indices(n, ring.world, r, layout)) for r in range(ring.world)])
    in_rank_order = torch.cat(gathered, dim=dim)
    whole = torch.empty_like(in_rank_order)
    return whole.index_copy_(dim, positions.to(x_local.device), in_rank_order)  # position i goes to row i
