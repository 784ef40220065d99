"""DeepSpeed-Ulysses (Jacobs et al. 2023): trade the sequence split for a head split, attend locally, trade back.

Each rank starts with its contiguous chunk of the sequence for all H heads, (B, H, N/P, D). One all-to-all turns
that into the whole sequence for H/P heads, (B, H/P, N, D); attention is then ordinary single-device attention
(heads are independent); a second all-to-all turns the output back into the sequence split. Each rank sends and
receives (P-1)/P of its q, k, v and o shards, whatever N: the volume per rank does not grow with P, unlike
gathering K/V. The cost: P cannot exceed the number of heads, and H must divide evenly.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from .. import kernels
from ..kernels._checks import check_call
from ._group import current

__all__ = ["ulysses_attention"]


def _all_to_all(x: torch.Tensor, *, split_dim: int, cat_dim: int, group) -> torch.Tensor:
    """Cut x into P equal pieces along ``split_dim``, send piece j to rank j, and concatenate the P pieces
    received (in rank order) along ``cat_dim``."""
    world = dist.get_world_size(group)
    sent = [piece.contiguous() for piece in x.chunk(world, dim=split_dim)]
    received = [torch.empty_like(sent[0]) for _ in range(world)]
    try:
        dist.all_to_all(received, sent, group=group)
    except RuntimeError as error:  # some builds' gloo (torch 2.11's, seen on the GPU machine) has no all-to-all
        if "does not support alltoall" not in str(error):
            raise
        all_to_all_by_pairs(received, sent, group=group)
    return torch.cat(received, dim=cat_dim)


def all_to_all_by_pairs(received: list[torch.Tensor], sent: list[torch.Tensor], *, group=None) -> None:
    """The same exchange as ``dist.all_to_all``, as P - 1 send/receive pairs per rank (what every backend has)."""
    me = dist.get_rank(group)
    received[me].copy_(sent[me])
    ops = []
    for peer in range(dist.get_world_size(group)):
        if peer != me:
            other = peer if group is None else dist.get_global_rank(group, peer)
            ops += [dist.P2POp(dist.isend, sent[peer], other, group), dist.P2POp(dist.irecv, received[peer], other,
                                                                                 group)]
    for request in dist.batch_isend_irecv(ops):
        request.wait()


class _AllToAll(torch.autograd.Function):
    """Differentiable all-to-all: its gradient is the all-to-all the other way (split and cat dims swapped)."""

    @staticmethod
    def forward(ctx, x, split_dim, cat_dim, group):
        ctx.dims, ctx.group = (split_dim, cat_dim), group
        return _all_to_all(x, split_dim=split_dim, cat_dim=cat_dim, group=group)

    @staticmethod
    def backward(ctx, grad):
        split_dim, cat_dim = ctx.dims
        return _all_to_all(grad, split_dim=cat_dim, cat_dim=split_dim, group=ctx.group), None, None, None


def ulysses_attention(q, k, v, *, causal: bool = False, scale: float | None = None, group=None,
                      enable_gqa: bool = False) -> torch.Tensor:
    """Attention over the whole sequence from contiguous shards, by a head split (DeepSpeed Ulysses).

    One all-to-all turns each rank's (B, H, N / P, D) into (B, H / P, N, D): a few whole heads, every position.
    Each rank runs ``kernels.flash_attention`` on its heads, and a second all-to-all gives the rows back.
    Differentiable (the backward's all-to-alls go the other way).

    Args:
        q: (B, H, N / P, D), this rank's contiguous chunk (``shard(x, layout="contiguous")``), one shape on every
            rank. H must be a multiple of the number of ranks P (else :func:`ring_attention`).
        k, v: (B, H_kv, N / P, D), sharded as q. H_kv = H, or with ``enable_gqa=True`` a divisor of H; a multiple of
            P too.
        causal: False (default) or True: key j hidden from query i when j > i, in the whole sequence's order.
        scale: the factor on q.k; None (default) means 1/sqrt(D).
        group: the process group (default: the whole world), already initialised; every rank calls.
        enable_gqa: False (default) or True: fewer K/V heads than query heads (grouped-query attention). Rank r
            receives query heads r H / P to (r + 1) H / P - 1 and the K/V heads they read, so each rank's kernel
            sees the same grouping.

    Returns:
        o: (B, H, N / P, D), q's dtype: this rank's rows of the whole attention.

    Example::

        o_local = ulysses_attention(*(shard(x, layout="contiguous") for x in (q, k, v)), causal=True)
    """
    ring = current(group, what="ulysses_attention")
    heads = q.shape[1] if q.dim() == 4 else None
    if heads is None or k.shape != v.shape or q.shape[0] != k.shape[0] or q.shape[2:] != k.shape[2:]:
        raise ValueError(
            f"q, k, v have shapes {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}: Ulysses expects shards "
            "(B, H, N/P, D) of q and (B, H_kv, N/P, D) of k and v")
    check_call(q, k, v, enable_gqa=enable_gqa, scale=scale, block_mask=None)  # refused before any rank sends a byte
    for what, count, name in (("heads", heads, "H"), ("K/V heads", k.shape[1], "H_kv")):
        if count % ring.world:
            raise ValueError(
                f"Ulysses splits the {count} {what} over {ring.world} ranks, so {name} must be a multiple of the "
                f"number of ranks, and {count} % {ring.world} = {count % ring.world}: use a number of ranks that "
                f"divides {name}, or ring_attention, which has no such limit")
    # (B, H, N/P, D) -> (B, H/P, N, D): heads scattered over the ranks, sequence chunks gathered in rank order
    q_heads, k_heads, v_heads = (_AllToAll.apply(x, 1, 2, group) for x in (q, k, v))
    o_heads = kernels.flash_attention(q_heads, k_heads, v_heads, causal=causal, scale=scale, enable_gqa=enable_gqa)
    return _AllToAll.apply(o_heads, 2, 1, group)  # (B, H/P, N, D) -> (B, H, N/P, D)
