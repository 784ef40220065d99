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
    """This rank's part of ``x`` along ``dim`` (the sequence dim; 2 for (B, H, N, D)), as a new tensor.

    Raises ValueError when the length does not split into equal chunks for the layout.
    """
    ring = current(group, what="shard")
    index = torch.from_numpy(sequence_indices(x.shape[dim], ring.world, ring.rank, layout)).to(x.device)
    return x.index_select(dim, index)


def unshard(x_local: torch.Tensor, *, dim: int = 2, layout: str = "zigzag", group=None) -> torch.Tensor:
    """The whole sequence on every rank, from each rank's shard along ``dim``: all-gather, then reorder."""
    ring = current(group, what="unshard")
    gathered = [torch.empty_like(x_local) for _ in range(ring.world)]
    dist.all_gather(gathered, x_local.contiguous(), group=group)
    n = x_local.shape[dim] * ring.world
    positions = torch.cat([torch.from_numpy(sequence_indices(n, ring.world, r, layout)) for r in range(ring.world)])
    in_rank_order = torch.cat(gathered, dim=dim)
    whole = torch.empty_like(in_rank_order)
    return whole.index_copy_(dim, positions.to(x_local.device), in_rank_order)  # position i goes to row i
