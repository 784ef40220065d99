"""Forward FlashAttention kernels, numbered in the order lesson 07 builds them. All compute the same function.

- v1  the plain loop of lesson 03: one program per (query tile, batch*head); online softmax with ``exp``;
      the scale multiplied into every score; every key tile masked (bounds and causal); tiles wholly above
      the diagonal skipped by the loop bound.
- v2  ``exp2`` with the scale and log2(e) folded into one multiply: ``exp(x*s) = exp2(x * s*log2(e))``,
      so a score costs one FMA and one MUFU.EX2 instead of a multiply, a multiply by log2(e) and an exp.
- v3  causal split: the off-diagonal key tiles (every key visible) run a loop with no mask at all; only
      the diagonal and tail tiles pay for the masks.
- v4  the v3 kernel with tiles, warps and stages chosen for the device (``configs.forward_config``)
      instead of the textbook 64x64 / 4 warps / 2 stages.
- v5  causal only: the heaviest query tiles (bottom rows, most keys) are launched first, so the last wave is
      made of short programs instead of long ones.
- v6  Hopper: Q, K, V and O move through tensor descriptors (the TMA copy engine) instead of pointer tiles;
      other GPUs fall back to v5 (Triton's interpreter emulates the descriptors, so on a CPU v6 runs as is).

Shapes: q (B, H, N_q, D), k and v (B, H, N_kv, D), any strides; o like q; lse (B, H, N_q) float32, natural log.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from . import configs
from ._checks import dot_precision, padded_head_dim

LOG2E = 1.4426950408889634  # log2(e): exp(x) == exp2(x * LOG2E)
# Initial running max: finite, so exp2(m_old - m_new) never sees (-inf) - (-inf). A constexpr, since kernels
# may read only constexpr globals.
MASKED_FILL = tl.constexpr(-1.0e30)


# ------------------------------------------------------------------------------------------ shared helpers
@triton.jit
def _load_tile(ptrs, rows, n_rows, offs_d, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
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
def _store_output(O, LSE, acc, l_i, m_i, pid_bh, offs_m, offs_d, o_base, stride_on, stride_od, N_Q,
                  HEAD_DIM: tl.constexpr, LOG2_DOMAIN: tl.constexpr):
    """Normalise acc by the row sums once, at the end, and store o and lse; empty rows give 0 and -inf."""
    empty = l_i == 0.0
    l_safe = tl.where(empty, 1.0, l_i)
    o = acc / l_safe[:, None]
    if LOG2_DOMAIN:  # m and l are in base 2: lse = ln(2) * (m + log2 l)
        lse = (m_i + tl.log2(l_safe)) * 0.6931471805599453
    else:
        lse = m_i + tl.log(l_safe)
    lse = tl.where(empty, float("-inf"), lse)
    row_ok = offs_m < N_Q
    o_ptrs = O + o_base + offs_m[:, None] * stride_on + offs_d[None, :] * stride_od
    tl.store(o_ptrs, o.to(O.dtype.element_ty), mask=row_ok[:, None] & (offs_d[None, :] < HEAD_DIM))
    tl.store(LSE + pid_bh.to(tl.int64) * N_Q + offs_m, lse, mask=row_ok)


# ------------------------------------------------------------------------------------------ v1
@triton.jit
def _fwd_v1_kernel(
    Q, K, V, O, LSE, scale,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_on, stride_od,
    H, N_Q, N_KV,
    CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = (pid_bh // H).to(tl.int64)  # int64: b * stride can pass 2**31 on large batches
    h = (pid_bh % H).to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)

    q_ptrs = Q + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qn + offs_d[None, :] * stride_qd
    q = _load_tile(q_ptrs, offs_m, N_Q, offs_d, HEAD_DIM, BLOCK_D, True)  # (BLOCK_M, BLOCK_D)
    k_base = K + b * stride_kb + h * stride_kh
    v_base = V + b * stride_vb + h * stride_vh

    m_i = tl.full([BLOCK_M], MASKED_FILL, dtype=tl.float32)  # running row max of the scores
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)  # running row sum of exp(score - m_i)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)  # running unnormalised output

    hi = N_KV
    if CAUSAL:  # key tiles that start right of the tile's last query are all masked: skip them
        hi = tl.minimum(N_KV, (pid_m + 1) * BLOCK_M)
    for start_n in range(0, hi, BLOCK_N):
        cols = start_n + offs_n
        k = _load_tile(k_base + cols[:, None] * stride_kn + offs_d[None, :] * stride_kd,
                       cols, N_KV, offs_d, HEAD_DIM, BLOCK_D, True)  # (BLOCK_N, BLOCK_D)
        v = _load_tile(v_base + cols[:, None] * stride_vn + offs_d[None, :] * stride_vd,
                       cols, N_KV, offs_d, HEAD_DIM, BLOCK_D, True)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale  # (BLOCK_M, BLOCK_N)
        valid = cols[None, :] < N_KV
        if CAUSAL:
            valid = valid & (cols[None, :] <= offs_m[:, None])
        s = tl.where(valid, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.exp(s - m_new[:, None])
        alpha = tl.exp(m_i - m_new)  # how much the old statistics shrink under the new max
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new

    o_base = b * stride_ob + h * stride_oh
    _store_output(O, LSE, acc, l_i, m_i, pid_bh, offs_m, offs_d, o_base, stride_on, stride_od, N_Q,
                  HEAD_DIM, False)


# ------------------------------------------------------------------------------------------ v2
@triton.jit
def _fwd_v2_kernel(
    Q, K, V, O, LSE, qk_scale,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_on, stride_od,
    H, N_Q, N_KV,
    CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    # Same loop as v1, but scores live in base 2: qk_scale = scale * log2(e), p = exp2(qk*qk_scale - m).
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = (pid_bh // H).to(tl.int64)
    h = (pid_bh % H).to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)

    q_ptrs = Q + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qn + offs_d[None, :] * stride_qd
    q = _load_tile(q_ptrs, offs_m, N_Q, offs_d, HEAD_DIM, BLOCK_D, True)
    k_base = K + b * stride_kb + h * stride_kh
    v_base = V + b * stride_vb + h * stride_vh

    m_i = tl.full([BLOCK_M], MASKED_FILL, dtype=tl.float32)  # base-2 running max
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    hi = N_KV
    if CAUSAL:
        hi = tl.minimum(N_KV, (pid_m + 1) * BLOCK_M)
    for start_n in range(0, hi, BLOCK_N):
        cols = start_n + offs_n
        k = _load_tile(k_base + cols[:, None] * stride_kn + offs_d[None, :] * stride_kd,
                       cols, N_KV, offs_d, HEAD_DIM, BLOCK_D, True)
        v = _load_tile(v_base + cols[:, None] * stride_vn + offs_d[None, :] * stride_vd,
                       cols, N_KV, offs_d, HEAD_DIM, BLOCK_D, True)
        qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)  # (BLOCK_M, BLOCK_N), unscaled
        valid = cols[None, :] < N_KV
        if CAUSAL:
            valid = valid & (cols[None, :] <= offs_m[:, None])
        qk = tl.where(valid, qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)  # max commutes with the positive scale
        p = tl.exp2(qk * qk_scale - m_new[:, None])  # one FMA + one exp2 per score
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new

    o_base = b * stride_ob + h * stride_oh
    _store_output(O, LSE, acc, l_i, m_i, pid_bh, offs_m, offs_d, o_base, stride_on, stride_od, N_Q,
                  HEAD_DIM, True)


# ------------------------------------------------------------------------------------------ v3 .. v5
@triton.jit
def _attend_tiles(acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd,
                  offs_m, lo, hi, N_KV, qk_scale,
                  MASKED: tl.constexpr, CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                  BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Online softmax over key tiles [lo, hi). MASKED=False: every key is in range and visible (no mask)."""
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + offs_n
        k = _load_tile(k_base + cols[:, None] * stride_kn + offs_d[None, :] * stride_kd,
                       cols, N_KV, offs_d, HEAD_DIM, BLOCK_D, MASKED)  # (BLOCK_N, BLOCK_D)
        v = _load_tile(v_base + cols[:, None] * stride_vn + offs_d[None, :] * stride_vd,
                       cols, N_KV, offs_d, HEAD_DIM, BLOCK_D, MASKED)
        qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)  # (BLOCK_M, BLOCK_N)
        if MASKED:
            valid = cols[None, :] < N_KV
            if CAUSAL:
                valid = valid & (cols[None, :] <= offs_m[:, None])
            qk = tl.where(valid, qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
        p = tl.exp2(qk * qk_scale - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _fwd_split_kernel(
    Q, K, V, O, LSE, qk_scale,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_on, stride_od,
    H, N_Q, N_KV,
    CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr,
    HEAVY_FIRST: tl.constexpr,
):
    pid_m = tl.program_id(0)
    if HEAVY_FIRST:  # causal: bottom query tiles see the most keys; start them first
        pid_m = tl.num_programs(0) - 1 - pid_m
    pid_bh = tl.program_id(1)
    b = (pid_bh // H).to(tl.int64)
    h = (pid_bh % H).to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)

    q_ptrs = Q + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qn + offs_d[None, :] * stride_qd
    q = _load_tile(q_ptrs, offs_m, N_Q, offs_d, HEAD_DIM, BLOCK_D, True)
    k_base = K + b * stride_kb + h * stride_kh
    v_base = V + b * stride_vb + h * stride_vh

    m_i = tl.full([BLOCK_M], MASKED_FILL, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    # Key tiles [0, full_end) are whole and (for causal) left of this query tile's diagonal: no masks.
    full_end = (N_KV // BLOCK_N) * BLOCK_N
    masked_end = N_KV
    if CAUSAL:
        full_end = tl.minimum(full_end, pid_m * BLOCK_M)  # a multiple of BLOCK_N: BLOCK_M % BLOCK_N == 0
        masked_end = tl.minimum(N_KV, (pid_m + 1) * BLOCK_M)
    acc, l_i, m_i = _attend_tiles(acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd,
                                  offs_m, 0, full_end, N_KV, qk_scale,
                                  False, CAUSAL, HEAD_DIM, BLOCK_D, BLOCK_N, DOT_PRECISION)
    # The diagonal tiles (causal) and the tail tile past the last whole one: masked.
    acc, l_i, m_i = _attend_tiles(acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd,
                                  offs_m, full_end, masked_end, N_KV, qk_scale,
                                  True, CAUSAL, HEAD_DIM, BLOCK_D, BLOCK_N, DOT_PRECISION)

    o_base = b * stride_ob + h * stride_oh
    _store_output(O, LSE, acc, l_i, m_i, pid_bh, offs_m, offs_d, o_base, stride_on, stride_od, N_Q,
                  HEAD_DIM, True)


# ------------------------------------------------------------------------------------------ v6 (Hopper)
@triton.jit
def _attend_tiles_desc(acc, l_i, m_i, q, k_desc, v_desc, offs_m, lo, hi, N_KV, qk_scale,
                       MASKED: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_N: tl.constexpr,
                       DOT_PRECISION: tl.constexpr, ABLATE: tl.constexpr):
    """As _attend_tiles, with K and V read through tensor descriptors (rows past N_KV come back as 0).

    ABLATE (lesson 09's wrong-on-purpose timing variants; 0 in every real version): 1 drops the rescaling of l
    and acc by alpha = exp2(m_old - m_new); 2 also drops the exponentials (p = the scaled scores).
    """
    offs_n = tl.arange(0, BLOCK_N)
    for start_n in range(lo, hi, BLOCK_N):
        k = k_desc.load([start_n, 0])  # (BLOCK_N, BLOCK_D)
        v = v_desc.load([start_n, 0])
        qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
        if MASKED:
            cols = start_n + offs_n
            valid = cols[None, :] < N_KV
            if CAUSAL:
                valid = valid & (cols[None, :] <= offs_m[:, None])
            qk = tl.where(valid, qk, float("-inf"))
        if ABLATE == 0:
            m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
            p = tl.exp2(qk * qk_scale - m_new[:, None])
            alpha = tl.exp2(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
            m_i = m_new
        elif ABLATE == 1:
            m_i = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
            p = tl.exp2(qk * qk_scale - m_i[:, None])
            l_i = l_i + tl.sum(p, 1)
            acc = acc + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        else:
            p = qk * qk_scale
            l_i = l_i + tl.sum(p, 1)
            acc = acc + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
    return acc, l_i, m_i


@triton.jit
def _fwd_desc_kernel(
    Q, K, V, O, LSE, qk_scale,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_on, stride_od,
    H, N_Q, N_KV,
    CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr,
    HEAVY_FIRST: tl.constexpr, ABLATE: tl.constexpr = 0,
):
    pid_m = tl.program_id(0)
    if HEAVY_FIRST:
        pid_m = tl.num_programs(0) - 1 - pid_m
    pid_bh = tl.program_id(1)
    b = (pid_bh // H).to(tl.int64)
    h = (pid_bh % H).to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    # One 2-D (N, D) view per (batch, head): the descriptor's bounds do the tail and head-dim padding.
    q_desc = tl.make_tensor_descriptor(Q + b * stride_qb + h * stride_qh, shape=[N_Q, HEAD_DIM],
                                       strides=[stride_qn, 1], block_shape=[BLOCK_M, BLOCK_D])
    k_desc = tl.make_tensor_descriptor(K + b * stride_kb + h * stride_kh, shape=[N_KV, HEAD_DIM],
                                       strides=[stride_kn, 1], block_shape=[BLOCK_N, BLOCK_D])
    v_desc = tl.make_tensor_descriptor(V + b * stride_vb + h * stride_vh, shape=[N_KV, HEAD_DIM],
                                       strides=[stride_vn, 1], block_shape=[BLOCK_N, BLOCK_D])
    q = q_desc.load([pid_m * BLOCK_M, 0])

    m_i = tl.full([BLOCK_M], MASKED_FILL, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    full_end = (N_KV // BLOCK_N) * BLOCK_N
    masked_end = N_KV
    if CAUSAL:
        full_end = tl.minimum(full_end, pid_m * BLOCK_M)
        masked_end = tl.minimum(N_KV, (pid_m + 1) * BLOCK_M)
    acc, l_i, m_i = _attend_tiles_desc(acc, l_i, m_i, q, k_desc, v_desc, offs_m, 0, full_end, N_KV, qk_scale,
                                       False, CAUSAL, BLOCK_N, DOT_PRECISION, ABLATE)
    acc, l_i, m_i = _attend_tiles_desc(acc, l_i, m_i, q, k_desc, v_desc, offs_m, full_end, masked_end, N_KV,
                                       qk_scale, True, CAUSAL, BLOCK_N, DOT_PRECISION, ABLATE)
    o_base = b * stride_ob + h * stride_oh
    _store_output(O, LSE, acc, l_i, m_i, pid_bh, offs_m, offs_d, o_base, stride_on, stride_od, N_Q,
                  HEAD_DIM, True)


# ------------------------------------------------------------------------------------------ launching
@dataclass(frozen=True)
class ForwardVersion:
    """One numbered forward kernel: what it changed, what we predicted, and how to run it."""

    name: str
    title: str
    changes: str
    prediction: str
    kernel: Callable
    tuned: bool  # device-tuned launch (configs.forward_config) rather than the textbook one
    heavy_first: bool | None  # None: the kernel has no HEAVY_FIRST switch
    exp2: bool  # the kernel takes scale * log2(e) rather than scale
    descriptors: bool = False


def _strides(t: torch.Tensor) -> tuple[int, int, int, int]:
    return t.stride(0), t.stride(1), t.stride(2), t.stride(3)


def _descriptors_usable(props, *tensors) -> bool:
    """TMA needs Hopper (the interpreter emulates it), a unit stride in the last dim, 16-byte aligned rows."""
    if not (configs.supports_tensor_descriptors(props) or props.interpreter):
        return False
    for t in tensors:
        es = t.element_size()
        if t.stride(3) != 1 or any((s * es) % 16 for s in t.stride()[:3]) or t.data_ptr() % 16:
            return False
    return True


def _tma_scratch(device: torch.device):
    """The allocator Triton calls for the global scratch where a kernel builds its tensor descriptors."""
    return lambda size, alignment, stream: torch.empty(size, dtype=torch.int8, device=device)


def run_forward(version: ForwardVersion, q, k, v, *, causal: bool, scale: float | None,
                config: configs.KernelConfig | None = None, ablate: int = 0):
    """Launch one forward version on checked inputs; returns (o, lse). ``config`` overrides the launch.

    ``ablate`` (v6 only, for timing what the softmax costs; the output is then WRONG on purpose): 1 removes the
    rescaling by exp(m_old - m_new), 2 removes the exponentials too.
    """
    if ablate and version.name != "v6":
        raise ValueError(f"ablate needs version v6, got {version.name}")
    batch, heads, n_q, head_dim = q.shape
    n_kv = k.shape[2]
    scale = 1.0 / math.sqrt(head_dim) if scale is None else float(scale)
    block_d = padded_head_dim(head_dim)
    props = configs.device_props(q.device)
    if config is None and version.tuned:
        config = configs.forward_config(props, block_d, q.element_size(), causal=causal)
    elif config is None:
        config = configs.baseline_forward_config(props, block_d, q.element_size())
    o = torch.empty_like(q)
    lse = torch.empty((batch, heads, n_q), device=q.device, dtype=torch.float32)
    if batch * heads * n_q == 0:
        return o, lse
    kernel = version.kernel
    if version.descriptors:
        if _descriptors_usable(props, q, k, v):
            triton.set_allocator(_tma_scratch(q.device))
        else:
            kernel = _fwd_split_kernel
    extra = {} if version.heavy_first is None else {"HEAVY_FIRST": bool(version.heavy_first and causal)}
    if ablate:
        if kernel is not _fwd_desc_kernel:
            raise ValueError("ablate needs tensor descriptors (a Hopper GPU or the interpreter)")
        extra["ABLATE"] = ablate
    grid = (triton.cdiv(n_q, config.block_m), batch * heads)
    kernel[grid](
        q, k, v, o, lse, scale * LOG2E if version.exp2 else scale,
        *_strides(q), *_strides(k), *_strides(v), *_strides(o),
        heads, n_q, n_kv,
        CAUSAL=causal, HEAD_DIM=head_dim, BLOCK_D=block_d,
        BLOCK_M=config.block_m, BLOCK_N=config.block_n, DOT_PRECISION=dot_precision(q.dtype),
        num_warps=config.num_warps, num_stages=config.num_stages, **extra,
    )
    return o, lse


FORWARD_VERSIONS: dict[str, ForwardVersion] = {
    v.name: v
    for v in [
        ForwardVersion("v1", "plain loop", "lesson 03's loop: exp, scale on every score, every tile masked",
                       "about the textbook kernel (381 TFLOP/s at D=128, N=16K on the H200)",
                       _fwd_v1_kernel, tuned=False, heavy_first=None, exp2=False),
        ForwardVersion("v2", "exp2, scale folded", "exp2(qk * scale*log2e - m): one FMA + one EX2 per score",
                       "+5-10%: the softmax issue slots shrink, the two matmuls are unchanged",
                       _fwd_v2_kernel, tuned=False, heavy_first=None, exp2=True),
        ForwardVersion("v3", "causal split", "off-diagonal tiles loop with no masks; only diagonal/tail masked",
                       "non-causal +0-5% (no bounds mask), causal +10-15% (mask only on 1 of N/64 tiles)",
                       _fwd_split_kernel, tuned=False, heavy_first=False, exp2=True),
        ForwardVersion("v4", "tuned launch",
                       "tiles/warps/stages from configs.forward_config (128-row tiles; causal D=128 on sm_90: 64x64)",
                       "+30-50% on sm_90: 128x128 tiles halve K/V re-reads and fill the warpgroup MMA",
                       _fwd_split_kernel, tuned=True, heavy_first=False, exp2=True),
        ForwardVersion("v5", "heavy tiles first", "causal: launch bottom query tiles (most keys) first",
                       "causal +3-8% (shorter tail wave), non-causal unchanged",
                       _fwd_split_kernel, tuned=True, heavy_first=True, exp2=True),
        ForwardVersion("v6", "tensor descriptors", "Hopper: TMA loads of Q/K/V tiles via tensor descriptors",
                       "+5-15% on sm_90: copies leave the warps' issue slots; falls back to v5 elsewhere",
                       _fwd_desc_kernel, tuned=True, heavy_first=True, exp2=True, descriptors=True),
    ]
}
