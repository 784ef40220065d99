"""What every kernel shares: the base-2 constants, the default scale, the host's allocators (TMA scratch, the
per-row statistics), a masked tile load, the online softmax and the store of its output.

The kernels keep scores in base 2 (``exp2`` is one hardware instruction, ``exp`` is two): with
``qk_scale = scale * LOG2E``, ``exp(scale * x - m) == exp2(qk_scale * x - m * LOG2E)``, and a row's natural
logsumexp is ``LN2 * (m2 + log2(l))`` where ``m2`` is its base-2 running max.
"""

from __future__ import annotations

import functools
import math

import torch
import triton
import triton.language as tl

LOG2E = 1.4426950408889634  # log2(e): exp(x) == exp2(x * LOG2E)
LN2 = 0.6931471805599453  # ln(2): log(x) == log2(x) * LN2
# @triton.jit code may read only constexpr globals: the same two numbers, for use inside kernels.
LOG2E_IN_KERNEL = tl.constexpr(LOG2E)
LN2_IN_KERNEL = tl.constexpr(LN2)
# v1's initial running max (lesson 07 explains it): finite, so exp(m_old - m_new) never sees (-inf) - (-inf) = NaN
# on a masked row. It doubles as "no key yet", so a row whose finite scores all lie below it is taken for no key.
MASKED_FILL = tl.constexpr(-1.0e30)
# Every other kernel's initial running max (v2-v7, decode, FP8): -inf, no finite score mistaken for it. Their update
# (online_softmax_weights) is -inf-safe: a row whose max is still -inf subtracts 0 instead.
NO_KEY_YET = tl.constexpr(float("-inf"))
# The least normal float32. A score factor that is 0 (an FP8 descale of 0: every score 0, uniform weights) would
# turn a masked key's -inf into 0 * -inf = NaN; floored here, its scores are 0 to float32's rounding and masked
# keys stay -inf. The floor is a normal number, so no GPU flushes it to 0.
LEAST_SCORE_FACTOR = tl.constexpr(1.1754943508222875e-38)


def default_scale(head_dim: int, scale: float | None) -> float:
    """``scale`` as a float, or 1/sqrt(head_dim) when it is None (the scale of "Attention Is All You Need")."""
    return 1.0 / math.sqrt(head_dim) if scale is None else float(scale)


@functools.cache  # one allocator per device, so setting it again on every call costs nothing new
def tma_scratch(device: torch.device):
    """The allocator Triton calls for the global scratch where a kernel builds its tensor descriptors."""
    return lambda size, alignment, stream: torch.empty(size, dtype=torch.int8, device=device)


def row_stats_allocator(shape: tuple[int, int, int], device: torch.device, *, in_graph: bool):
    """``new() -> tensor``: a new (B, H, N_q) float32 tensor, a call's per-row statistics (the forward's lse, the
    backward's delta), on ``device``.

    Eagerly, ``empty_like`` of a template, a 4-byte tensor seen with zero strides whose ``empty_like`` is
    contiguous: half the host time of ``torch.empty(shape, dtype=...)``, which parses a shape and a dtype on every
    call (0.9 us against 1.6-1.8 us on a CPU). A plan made inside a compiled graph (``in_graph``) keeps no tensor:
    under ``torch.compile(mode="reduce-overhead")`` its first calls run in the CUDA graphs' memory pool, and the
    graphs refuse to record while an allocation of that pool is alive that no output owns (the template would be
    one); there the host time is recorded away anyway."""
    if in_graph:
        return functools.partial(torch.empty, tuple(shape), dtype=torch.float32, device=device)
    return functools.partial(torch.empty_like, torch.empty((), dtype=torch.float32, device=device).expand(shape))


@triton.jit
def load_tile(ptrs, rows, n_rows, offs_d, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
              CHECK_ROWS: tl.constexpr):
    """Load a (rows, BLOCK_D) tile, zero past the last row and past the real head dim."""
    if CHECK_ROWS:
        mask = (rows[:, None] < n_rows) & (offs_d[None, :] < HEAD_DIM)
        tile = tl.load(ptrs, mask=mask, other=0.0)
    elif HEAD_DIM == BLOCK_D:
        tile = tl.load(ptrs)
    else:
        tile = tl.load(ptrs, mask=offs_d[None, :] < HEAD_DIM, other=0.0)
    return tile


@triton.jit
def online_softmax_weights(l_i, m_i, qk, qk_scale):
    """The statistics half of one key tile of the online softmax (lesson 02), in base 2: the tile's weights
    ``p`` = exp2(scaled score - new max), the factor ``alpha`` the old accumulators shrink by, the new running sum
    and max. ``qk`` (rows, keys) is unscaled."""
    m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)  # max commutes with the positive scale
    # A row with no visible key yet keeps m = -inf; it subtracts 0, so exp2(-inf - 0) = 0 and not NaN.
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp2(qk * qk_scale - m_use[:, None])  # one FMA + one EX2 per score
    alpha = tl.exp2(m_i - m_use)  # how much the old statistics shrink under the new max
    return p, alpha, l_i * alpha + tl.sum(p, 1), m_new


@triton.jit
def online_softmax_update(acc, l_i, m_i, qk, v, qk_scale, DOT_PRECISION: tl.constexpr):
    """One key tile of the online softmax: fold the scores ``qk`` (rows, keys), unscaled, and their values ``v``
    (keys, D) into the running max ``m_i``, sum ``l_i`` and unnormalised output ``acc``."""
    p, alpha, l_i, m_new = online_softmax_weights(l_i, m_i, qk, qk_scale)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
    return acc, l_i, m_new


@triton.jit
def normalise_rows(acc, l_i, m_i):
    """The end of the online softmax: o = acc / l and the natural lse from the base-2 max; a row that saw no
    key (l = 0) gives o = 0 and lse = -inf, never NaN."""
    empty = l_i == 0.0
    l_safe = tl.where(empty, 1.0, l_i)
    o = acc / l_safe[:, None]
    lse = tl.where(empty, float("-inf"), (m_i + tl.log2(l_safe)) * LN2_IN_KERNEL)
    return o, lse


@triton.jit
def store_output(O, LSE, o, lse, pid_bh, offs_m, offs_d, o_base, stride_on, stride_od, N_Q,
                 HEAD_DIM: tl.constexpr):
    """Write a tile of o (in O's dtype) and its lse; rows past N_Q and head-dim padding are not written."""
    row_ok = offs_m < N_Q
    o_ptrs = O + o_base + offs_m[:, None] * stride_on + offs_d[None, :] * stride_od
    tl.store(o_ptrs, o.to(O.dtype.element_ty), mask=row_ok[:, None] & (offs_d[None, :] < HEAD_DIM))
    tl.store(LSE + pid_bh.to(tl.int64) * N_Q + offs_m, lse, mask=row_ok)


@triton.jit
def key_tile_range(first_row, last_row, N_KV, UPPER, LOWER, HAS_UPPER: tl.constexpr, HAS_LOWER: tl.constexpr,
                   BLOCK_N: tl.constexpr):
    """Key tiles of a query tile (rows first_row..last_row) from the bounds ``i + LOWER <= j <= i + UPPER``:
    keys [lo, hi) reach some row; tiles inside [full_lo, full_hi) are whole and visible to every row (no mask)."""
    lo = 0
    hi = N_KV
    full_lo = 0
    full_hi = N_KV
    if HAS_UPPER:
        hi = tl.minimum(N_KV, tl.maximum(last_row + UPPER + 1, 0))
        full_hi = tl.minimum(N_KV, tl.maximum(first_row + UPPER + 1, 0))
    if HAS_LOWER:
        lo = tl.minimum(tl.maximum(first_row + LOWER, 0), N_KV) // BLOCK_N * BLOCK_N
        full_lo = (tl.maximum(last_row + LOWER, 0) + BLOCK_N - 1) // BLOCK_N * BLOCK_N
    full_lo = tl.minimum(tl.maximum(full_lo, lo), hi)  # every bound is >= 0 before it is divided
    full_hi = tl.minimum(tl.maximum(full_hi // BLOCK_N * BLOCK_N, full_lo), hi)
    return lo, hi, full_lo, full_hi


@triton.jit
def query_tile_range(start_n, N_Q, N_KV, UPPER, LOWER, HAS_UPPER: tl.constexpr, HAS_LOWER: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Query tiles of a key tile (keys start_n..start_n + BLOCK_N - 1) from the same bounds, seen from the key:
    key j is seen by rows ``j - UPPER <= i <= j - LOWER``. Rows [lo, hi) see some key of the tile; query tiles
    inside [full_lo, full_hi) see all of them (no mask). The transpose of ``key_tile_range``."""
    lo = 0
    hi = N_Q
    full_lo = 0
    full_hi = N_Q
    if HAS_UPPER:
        lo = tl.minimum(tl.maximum(start_n - UPPER, 0), N_Q) // BLOCK_M * BLOCK_M
        full_lo = (tl.maximum(start_n + BLOCK_N - 1 - UPPER, 0) + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    if HAS_LOWER:
        hi = tl.minimum(N_Q, tl.maximum(tl.minimum(start_n + BLOCK_N, N_KV) - LOWER, 0))
        full_hi = tl.minimum(N_Q, tl.maximum(start_n - LOWER + 1, 0))
    full_lo = tl.minimum(tl.maximum(full_lo, lo), hi)  # every bound is >= 0 before it is divided
    full_hi = tl.minimum(tl.maximum(full_hi // BLOCK_M * BLOCK_M, full_lo), hi)
    return lo, hi, full_lo, full_hi


def strides(t, name: str, axes: str = "bhnd") -> dict[str, int]:
    """A tensor's strides as the kernels' keyword arguments: ``strides(q, "q")`` -> {"stride_qb": ..., ...}."""
    return {f"stride_{name}{axis}": s for axis, s in zip(axes, t.stride(), strict=True)}


# ------------------------------------------------------------------------------------------ variant rules
# The rules of kernels/rules.py inside a kernel. Indices arrive as broadcastable tiles: q_idx (BLOCK_M, 1) and
# kv_idx (1, BLOCK_N) in the forward, the transpose in the dK/dV kernel, so one helper serves every layout.
@triton.jit
def visible(b, h, q_idx, kv_idx, N_Q, N_KV, UPPER, LOWER, doc_ids,
            HAS_UPPER: tl.constexpr, HAS_LOWER: tl.constexpr, HAS_DOCS: tl.constexpr, MASK_MOD: tl.constexpr):
    """True where query q_idx may see key kv_idx: both in range, q_idx + LOWER <= kv_idx <= q_idx + UPPER,
    same document (``doc_ids`` points at batch b's ids), and ``MASK_MOD(b, h, q_idx, kv_idx)``."""
    ok = (q_idx < N_Q) & (kv_idx < N_KV)
    if HAS_UPPER:
        ok = ok & (kv_idx <= q_idx + UPPER)
    if HAS_LOWER:
        ok = ok & (kv_idx >= q_idx + LOWER)
    if HAS_DOCS:
        doc_q = tl.load(doc_ids + q_idx, mask=q_idx < N_Q, other=0)
        doc_k = tl.load(doc_ids + kv_idx, mask=kv_idx < N_KV, other=0)
        ok = ok & (doc_q == doc_k)
    if MASK_MOD is not None:
        keep = MASK_MOD(b, h, q_idx, kv_idx)
        # `ok & keep` is bitwise: an int answer (0 or 2, say) would hide keys its truth shows, without a word
        tl.static_assert(keep.dtype == tl.int1, "mask_mod returned a tile that is not boolean: return a "
                         "comparison (True = the query sees the key), e.g. q_idx >= kv_idx, as FlexAttention's")
        ok = ok & keep
    return ok


@triton.jit
def tanh_via_exp2(x):
    """tanh(x) from one EX2, accurate to float32 at every size of x; works in the interpreter as on every GPU (no
    libdevice). For |x| >= 0.1, sign(x) * (1 - e) / (1 + e) with e = exp(-2|x|) in (0, 0.82]: no overflow, exact
    limits +-1, and 1 - e loses at most 3 bits. Below, 1 - e would cancel (at |x| = 1e-7 the answer had no correct
    digit: a huge softcap then capped every score to noise), so the series x - x^3/3 + 2x^5/15, whose next term,
    17x^7/315, is under float32's rounding there."""
    ax = tl.abs(x)
    e = tl.exp2(ax * (-2.0 * LOG2E_IN_KERNEL))
    far = (1.0 - e) / (1.0 + e)
    far = tl.where(x < 0.0, -far, far)
    x2 = x * x
    near = x + x * x2 * (-1.0 / 3.0 + x2 * (2.0 / 15.0))
    return tl.where(ax < 0.1, near, far)


@triton.jit
def modified_scores(qk, q_idx, kv_idx, qk_scale, softcap2, slope2, SHIFT,
                    HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr):
    """Scores in base 2 (``qk * qk_scale``), soft-capped, then ALiBi-biased; also tanh of the cap (for the
    backward: d cap(s) / ds = 1 - tanh^2). In base 2 the cap is ``softcap2 = softcap * log2(e)`` and the slope
    ``slope2 = slope * log2(e)``; query q_idx sits at key position q_idx + SHIFT."""
    s = qk * qk_scale
    t = s  # unused unless HAS_SOFTCAP; a tensor of the right shape either way
    if HAS_SOFTCAP:
        t = tanh_via_exp2(s / softcap2)
        s = softcap2 * t
    if HAS_ALIBI:
        s = s - slope2 * tl.abs(q_idx + SHIFT - kv_idx).to(tl.float32)
    return s, t
