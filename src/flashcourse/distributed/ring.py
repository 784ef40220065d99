"""Ring attention (Liu, Zaharia, Abbeel 2023): each rank keeps its queries and passes its K/V shard around the
ring of ranks; after P steps every query has met every key, one shard at a time.

Forward, at each step: start sending the K/V shard we hold to rank + 1 (and receiving the next from rank - 1),
compute attention of our queries against the shard we hold with ``kernels.flash_attention_forward`` (which also
returns the logsumexp), merge that partial (o, lse) into the running one with lesson 02's rule
(``reference.merge_partials``), then wait for the transfer. Under a causal mask the blocks that the mask hides
are skipped (``schedule.block_schedule``).

Backward: the same ring again. Each block's gradients are recomputed from the *merged* o and lse (P of a block is
exp(S - lse) with the lse over all keys), so ``kernels.flash_attention_backward`` gives that block's exact share
of dQ, dK and dV. dQ stays home; the dK/dV of a shard travel behind its keys, each rank adding its share, and the
hop after the last step brings them home (``schedule.dkv_route``).

Overlap: every transfer is started before the compute it must hide behind and waited for after it. On GPUs
PyTorch's NCCL backend already runs point-to-point transfers on its own CUDA stream, which waits for the data to
be ready and which ``wait()`` joins back into the compute stream; that internal stream is the side stream, so the
code here needs none of its own. With gloo, transfers run on gloo's background threads.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .. import kernels
from ..kernels._checks import check_call
from ..kernels.rules import causal_alignment
from ._group import Ring, current
from .schedule import block_schedule, chunks_per_rank, kv_source, rank_chunks

__all__ = ["BlockWork", "block_work", "merge_partials", "ring_attention"]


def merge_partials(o1, lse1, o2, lse2):
    """``reference.merge_partials`` for torch tensors: o (..., D), lse (...); empty parts (lse -inf) weigh 0."""
    lse = torch.logaddexp(lse1, lse2)
    lse_safe = torch.where(torch.isneginf(lse), 0.0, lse)  # two empty parts: weights exp(-inf) = 0, not NaN
    w1, w2 = torch.exp(lse1 - lse_safe), torch.exp(lse2 - lse_safe)
    return w1[..., None] * o1 + w2[..., None] * o2, lse


@dataclass(frozen=True)
class BlockWork:
    """One ring step's attention: local query rows x rows of the K/V shard held; ``causal``: top-left mask."""

    rows: slice
    cols: slice
    causal: bool


def block_work(world: int, rank: int, step: int, *, n_local: int, causal: bool, layout: str) -> BlockWork | None:
    """What rank ``rank`` computes at ring step ``step`` (None: the causal mask hides the whole block).

    The causal schedule per chunk pair always makes one rectangle: the diagonal step (own K/V) is the shard's
    causal block, since a rank stores its chunks in ascending order on both sides, so the top-left mask inside
    the shard is the global one; any other step is a set of whole query chunks x whole key chunks.
    """
    everything = slice(0, n_local)
    if not causal:
        return BlockWork(everything, everything, causal=False)
    schedule = block_schedule(world, rank, step, layout)
    if "lower" in schedule.values():
        return BlockWork(everything, everything, causal=True)
    q_chunks = rank_chunks(world, rank, layout)
    k_chunks = rank_chunks(world, kv_source(world, rank, step), layout)
    rows = [i for i, qc in enumerate(q_chunks) if any(schedule[qc, kc] == "full" for kc in k_chunks)]
    cols = [j for j, kc in enumerate(k_chunks) if any(schedule[qc, kc] == "full" for qc in q_chunks)]
    if not rows:
        return None
    size = n_local // chunks_per_rank(layout)
    return BlockWork(slice(rows[0] * size, (rows[-1] + 1) * size), slice(cols[0] * size, (cols[-1] + 1) * size),
                     causal=False)


def _ring_forward(q, k, v, *, causal, scale, enable_gqa, layout, ring: Ring):
    n_local = q.shape[2]
    o = torch.zeros(q.shape, dtype=torch.float32, device=q.device)  # (B, H, n_local, D), merged in fp32
    lse = torch.full(q.shape[:3], -math.inf, dtype=torch.float32, device=q.device)  # (B, H, n_local)
    kv = [k, v]
    for step in range(ring.world):
        incoming = ring.shift(kv) if step + 1 < ring.world else None  # the next shard travels during this block
        work = block_work(ring.world, ring.rank, step, n_local=n_local, causal=causal, layout=layout)
        if work is not None:
            rows, cols = work.rows, work.cols
            o_block, lse_block = kernels.flash_attention_forward(
                q[:, :, rows], kv[0][:, :, cols], kv[1][:, :, cols], causal=work.causal, scale=scale,
                enable_gqa=enable_gqa)
            o[:, :, rows], lse[:, :, rows] = merge_partials(o[:, :, rows], lse[:, :, rows], o_block.float(),
                                                            lse_block)
        if incoming is not None:
            kv = incoming.wait()
    return o.to(q.dtype), lse


def _ring_backward(q, k, v, o, lse, do, *, causal, scale, enable_gqa, layout, ring: Ring):
    n_local = q.shape[2]
    dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)  # summed over P shards: fp32
    kv = [k, v]
    own = travelling = None  # own: dK/dV of our keys from our queries; travelling: an accumulator in flight
    for step in range(ring.world):
        incoming = ring.shift(kv) if step + 1 < ring.world else None
        dk_part = torch.zeros(k.shape, dtype=torch.float32, device=k.device)  # (B, H_kv, n_local, D)
        dv_part = torch.zeros(v.shape, dtype=torch.float32, device=v.device)
        work = block_work(ring.world, ring.rank, step, n_local=n_local, causal=causal, layout=layout)
        if work is not None:
            rows, cols = work.rows, work.cols
            dq_block, dk_block, dv_block = kernels.flash_attention_backward(
                q[:, :, rows], kv[0][:, :, cols], kv[1][:, :, cols], o[:, :, rows],
                lse[:, :, rows].contiguous(), do[:, :, rows], causal=work.causal, scale=scale, enable_gqa=enable_gqa)
            dq[:, :, rows] += dq_block
            dk_part[:, :, cols] += dk_block
            dv_part[:, :, cols] += dv_block
        if step == 0:
            own = (dk_part, dv_part)
        else:
            if travelling is not None:  # from rank - 1: the same shard's dK/dV from the ranks it visited before
                dk_before, dv_before = travelling.wait()
                dk_part += dk_before
                dv_part += dv_before
            travelling = ring.shift([dk_part, dv_part])  # hides behind the next step's compute
        if incoming is not None:
            kv = incoming.wait()
    dk, dv = own
    if travelling is not None:  # the last hop: our keys' dK/dV from every other rank
        dk_others, dv_others = travelling.wait()
        dk, dv = dk + dk_others, dv + dv_others
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal, scale, enable_gqa, layout, ring):
        o, lse = _ring_forward(q, k, v, causal=causal, scale=scale, enable_gqa=enable_gqa, layout=layout, ring=ring)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.options = {"causal": causal, "scale": scale, "enable_gqa": enable_gqa, "layout": layout, "ring": ring}
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = _ring_backward(q, k, v, o, lse, do.contiguous(), **ctx.options)
        return dq, dk, dv, None, None, None, None, None


def ring_attention(q, k, v, *, causal: bool = False, scale: float | None = None, layout: str = "zigzag",
                   group=None, enable_gqa: bool = False) -> torch.Tensor:
    """Attention of this rank's queries over the whole sequence, its keys spread over the ranks of ``group``.

    K/V shards travel around the ring of P ranks, one step per rank, while each rank computes its queries
    against the shard it holds (``kernels.flash_attention_forward``); the partial results are merged by their
    log-sum-exp (``reference.merge_partials``). Under a causal mask the blocks the mask hides are skipped.
    Differentiable: the backward sends dK/dV around the ring the same way, recomputing from the merged o, lse.

    Args:
        q: (B, H, N / P, D), this rank's shard in ``layout`` (from :func:`shard`), the same shape and dtype on
            every rank. Dtypes and head dims as ``kernels.flash_attention``'s (CPU tensors and gloo run the kernels
            in Triton's interpreter; CUDA tensors use NCCL).
        k, v: (B, H_kv, N / P, D), sharded as q, q's dtype. H_kv = H, or with ``enable_gqa=True`` a divisor of H
            (grouped-query attention: the ring then carries H / H_kv times fewer K/V bytes).
        causal: False (default) or True: key j hidden from query i when j > i, positions counted in the whole
            sequence's order (self-attention, so top-left and bottom-right coincide).
        scale: the factor on q.k; None (default) means 1/sqrt(D).
        layout: "zigzag" (default) or "contiguous". Contiguous: the sequence cut into P equal chunks, rank r
            holding chunk r. Zigzag: 2P equal chunks, rank r holding chunks r and 2P - 1 - r, so that under a
            causal mask every rank has the same work (``zigzag_indices(8, 2, 0)`` is [0, 1, 6, 7]).
        group: the process group (default: the whole world, ``torch.distributed``'s default group), already
            initialised; every rank of it must make the same call.
        enable_gqa: False (default) or True: fewer K/V heads than query heads, as in
            ``F.scaled_dot_product_attention``; query head h reads K/V head h // (H / H_kv).

    Returns:
        o: (B, H, N / P, D), q's dtype: this rank's rows of attention over all N positions, in ``layout``
        (``unshard(o, layout=layout)`` gives the whole output).

    Example::

        o_local = ring_attention(shard(q), shard(k), shard(v), causal=True)  # zigzag: equal work per rank
    """
    # The kernels' rule for causal (any truthy value once meant True); top-left and bottom-right coincide here
    causal = causal_alignment(causal) is not None
    ring = current(group, what="ring_attention")
    if layout not in ("contiguous", "zigzag"):
        raise ValueError(f"layout must be 'contiguous' or 'zigzag', got {layout!r}")
    if q.dim() != 4 or k.shape != v.shape or q.shape[0] != k.shape[0] or q.shape[2:] != k.shape[2:]:
        raise ValueError(
            f"q, k, v have shapes {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}: ring attention expects "
            "shards (B, H, N/P, D) of q and (B, H_kv, N/P, D) of k and v, each rank's part of one sequence "
            "(self-attention)")
    if layout == "zigzag" and q.shape[2] % 2:
        raise ValueError(
            f"the local shard has {q.shape[2]} positions, but a zigzag shard is two equal chunks, so an even "
            "number: shard the sequence with flashcourse.distributed.shard(x, layout='zigzag')")
    # Before the first transfer: a call the kernels refuse at step 0 would leave the ranks' sends in flight
    check_call(q, k, v, enable_gqa=enable_gqa, scale=scale, block_mask=None)
    return _RingAttention.apply(q, k, v, causal, scale, enable_gqa, layout, ring)
