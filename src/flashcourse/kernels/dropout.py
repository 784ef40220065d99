"""Dropout on the attention weights, regenerated in the backward instead of stored.

Semantics as ``F.scaled_dot_product_attention(dropout_p=p)``: each weight P[i, j] of the softmax is dropped with
probability p and the kept ones are scaled by 1 / (1 - p), so the output keeps its expected value; the logsumexp
the forward returns is the undropped softmax's (the backward needs P, not the dropped weights).

The mask is never written to memory. Its bit for (batch b, query head h, query i, key j) is a pure function of a
seed and of that position: ``tl.rand(seed, offset)`` with ``offset = ((b * H_q + h) * N_q + i) * N_k + j``, Triton's
Philox 4x32-10, a counter-based generator (Salmon et al. 2011, "Parallel random numbers: as easy as 1, 2, 3"): the
counter is the offset and the key is the seed, so any program can draw the number of any position without drawing
the ones before it. The forward tile (queries x keys), the dK/dV tile (keys x queries) and :func:`dropout_mask`
all compute the same offsets and so the same mask. FlashAttention does the same (Dao et al. 2022, section 3.1 and
Algorithm 2; Dao 2023): an N x N mask per head would be as large as the attention matrix the algorithm avoids.

Each call draws a fresh seed from torch's generator on q's device (:func:`draw_seed`), so ``torch.manual_seed``
makes a call repeatable; PyTorch and flash-attn keep one seed per generator and advance an offset instead, which
separates the streams of two calls as a fresh seed does. The seed is a one-element int64 tensor the kernels read,
so a new seed never recompiles a kernel.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from ..validation import foreign_number_hint, shown_number
from .common import online_softmax_weights

SEED_RANGE = 2**62  # seeds are drawn from [0, 2**62): any int64 works, this keeps them positive


def check_dropout_p(dropout_p) -> float | None:
    """``dropout_p`` as a float, None for 0 (no dropout); anything outside [0, 1) or not a number is refused."""
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, (int, float)):
        raise TypeError(f"dropout_p is {dropout_p!r} ({type(dropout_p).__name__}): expected a float in [0, 1), "
                        "the probability of dropping each attention weight (0.0: no dropout)"
                        + foreign_number_hint("dropout_p", dropout_p))
    if dropout_p != dropout_p:  # nan (math.isnan would raise OverflowError on a huge int)
        raise ValueError("dropout_p is nan: expected a float in [0, 1), the probability of dropping each "
                         "attention weight")
    if dropout_p == 1:
        raise ValueError("dropout_p is 1.0: every attention weight would be dropped and the output would be all "
                         "zeros (SDPA returns zeros there); expected a float in [0, 1). For a zero output use "
                         "torch.zeros_like(q)")
    if not 0 <= dropout_p < 1:
        raise ValueError(f"dropout_p is {shown_number(dropout_p)}: expected a float in [0, 1), the probability of "
                         "dropping each attention weight (0.0: no dropout)")
    return float(dropout_p) if dropout_p > 0 else None


def draw_seed(device) -> torch.Tensor:
    """A fresh seed from torch's generator on ``device``: a (1,) int64 tensor there (no copy from the host)."""
    return torch.randint(SEED_RANGE, (1,), dtype=torch.int64, device=device)


def seed_tensor(seed, device) -> torch.Tensor:
    """A seed given by the caller (an int, or a (1,) int64 tensor such as :func:`draw_seed` returns) on ``device``."""
    if isinstance(seed, torch.Tensor):
        if seed.shape != (1,) or seed.dtype != torch.int64:
            raise ValueError(f"dropout_seed has shape {tuple(seed.shape)} and dtype {seed.dtype}: expected a (1,) "
                             "int64 tensor (as kernels.dropout.draw_seed returns) or an int")
        return seed.to(device)
    if isinstance(seed, bool) or not isinstance(seed, int) or not -2**63 <= seed < 2**63:
        raise TypeError(f"dropout_seed is {seed!r}: expected an int64 value or a (1,) int64 tensor")
    return torch.tensor([seed], dtype=torch.int64, device=device)


class Dropout(NamedTuple):
    """A call's dropout: the probability and the seed tensor its forward drew (its backward reuses both)."""

    p: float
    seed: torch.Tensor


def kernel_args(dropout: Dropout | None, q: torch.Tensor) -> dict:
    """The arguments the v7 forward and b3's kernels take for dropout (q stands in for an absent seed: a pointer
    the kernel never reads)."""
    if dropout is None:
        return {"SEED": q, "dropout_p": 0.0, "DROPOUT": False}
    return {"SEED": dropout.seed, "dropout_p": dropout.p, "DROPOUT": True}


@triton.jit
def kept_weight_factor(seed, bh, q_idx, kv_idx, N_Q, N_KV, dropout_p):
    """1 / (1 - p) where the weight of (query q_idx, key kv_idx) of head row ``bh`` = b * H_q + h is kept, 0 where
    it is dropped. Indices arrive as broadcastable tiles, (BLOCK_M, 1) and (1, BLOCK_N) or transposed: each
    element's Philox counter is its own position, so any tile shape gives the same numbers."""
    offset = (bh * N_Q + q_idx.to(tl.int64)) * N_KV + kv_idx.to(tl.int64)
    keep = tl.rand(seed, offset) >= dropout_p  # uniform in [0, 1): kept with probability 1 - p
    return tl.where(keep, 1.0 / (1.0 - dropout_p), 0.0)


@triton.jit
def _mask_kernel(SEED, MASK, N_Q, N_KV, dropout_p, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    bh = tl.program_id(2).to(tl.int64)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    factor = kept_weight_factor(tl.load(SEED), bh, rows[:, None], cols[None, :], N_Q, N_KV, dropout_p)
    ok = (rows[:, None] < N_Q) & (cols[None, :] < N_KV)
    tl.store(MASK + (bh * N_Q + rows[:, None]) * N_KV + cols[None, :], factor > 0.0, mask=ok)


def dropout_mask(seed, shape, dropout_p: float, device=None) -> torch.Tensor:
    """The keep-mask a forward with this seed and ``dropout_p`` applies: a bool tensor of ``shape`` =
    (B, H_q, N_q, N_k), True where a weight is kept. For tests and lessons (it is the N x N array the kernels never
    store). ``seed``: an int or the (1,) int64 tensor :func:`draw_seed` gave; ``device``: where to compute it
    (default: the seed tensor's, else the CPU)."""
    p = check_dropout_p(dropout_p)
    if len(shape) != 4:  # else an unpacking error that names nothing
        raise ValueError(f"shape is {tuple(shape)}: expected (B, H_q, N_q, N_k), the attention weights' shape")
    batch, heads, n_q, n_kv = shape
    if device is None:
        device = seed.device if isinstance(seed, torch.Tensor) else torch.device("cpu")
    mask = torch.ones(shape, dtype=torch.bool, device=device)
    if p is None or mask.numel() == 0:
        return mask
    block = 16
    _mask_kernel[(triton.cdiv(n_q, block), triton.cdiv(n_kv, block), batch * heads)](
        seed_tensor(seed, device), mask, n_q, n_kv, p, BLOCK_M=block, BLOCK_N=block)
    return mask


@triton.jit
def online_softmax_update_dropped(acc, l_i, m_i, qk, v, qk_scale, factor, DOT_PRECISION: tl.constexpr):
    """``common.online_softmax_update`` with dropout: the running max and sum take every weight (the logsumexp is
    the undropped softmax's), the output only the kept ones, times 1 / (1 - p) (``factor``, 0 where dropped)."""
    p, alpha, l_i, m_new = online_softmax_weights(l_i, m_i, qk, qk_scale)
    acc = acc * alpha[:, None] + tl.dot((p * factor).to(v.dtype), v, input_precision=DOT_PRECISION)
    return acc, l_i, m_new
