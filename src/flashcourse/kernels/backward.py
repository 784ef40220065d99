"""Backward FlashAttention kernels (FA2 style): recompute P from (q, k, lse) instead of storing it.

With S = scale * Q K^T, P = softmax(S) = exp(S - lse), dO the incoming gradient:
    dV = P^T dO          dP = dO V^T          dS = P * (dP - Delta),  Delta = rowsum(dO * O)
    dQ = scale * dS K    dK = scale * dS^T Q
Three launches:
1. ``_bwd_preprocess``: Delta (B, H, N_q), one pass over O and dO.
2. ``_bwd_dkdv_kernel``: K/V-stationary; a program owns BLOCK_N keys, keeps dK and dV in registers and streams
   every query tile that sees them. No two programs write the same dK/dV rows, so no atomics.
3. the dQ scheme, one of two (``BACKWARD_VERSIONS``):
   - "b1" ``_bwd_dq_kernel``: Q-stationary, streams K/V tiles; recomputes Q K^T and dO V^T a second time
     (7 matmuls in all instead of 5) but writes dQ once, with plain stores.
   - "b2" dQ accumulated by the dK/dV kernel with fp32 atomic adds into a (B, H, N_q, D) buffer (FA2's own
     scheme): 5 matmuls, but every (key tile, query tile) pair adds a BLOCK_M x D tile into L2.
Scores are kept in base 2 as in the forward: p = exp2(qk * scale*log2(e) - lse*log2(e)).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from . import configs
from ._checks import dot_precision, padded_head_dim
from .common import LOG2E, LOG2E_IN_KERNEL, default_scale, load_tile, strides


@triton.jit
def _bwd_preprocess(O, DO, DELTA, stride_ob, stride_oh, stride_on, stride_od,
                    stride_dob, stride_doh, stride_don, stride_dod, H, N_Q,
                    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = (pid_bh // H).to(tl.int64)
    h = (pid_bh % H).to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    o = load_tile(O + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_on + offs_d[None, :] * stride_od,
                   offs_m, N_Q, offs_d, HEAD_DIM, BLOCK_D, True)
    do = load_tile(DO + b * stride_dob + h * stride_doh + offs_m[:, None] * stride_don
                    + offs_d[None, :] * stride_dod, offs_m, N_Q, offs_d, HEAD_DIM, BLOCK_D, True)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)  # (BLOCK_M,)
    tl.store(DELTA + pid_bh.to(tl.int64) * N_Q + offs_m, delta, mask=offs_m < N_Q)


@triton.jit
def _dkdv_tiles(dk, dv, k, v, q_base, do_base, dq_base, lse_base, delta_base,
                stride_qn, stride_qd, stride_don, stride_dod, stride_dqn, stride_dqd,
                offs_n, lo, hi, N_Q, qk_scale, scale,
                MASKED: tl.constexpr, CAUSAL: tl.constexpr, ATOMIC_DQ: tl.constexpr,
                HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
                DOT_PRECISION: tl.constexpr):
    """Accumulate dK, dV of one key tile over query tiles [lo, hi); MASKED adds bounds and causal masks.

    Query rows past N_Q load as q = dO = 0 and lse = Delta = 0, so they add nothing to dK or dV.
    """
    offs_d = tl.arange(0, BLOCK_D)
    for start_m in range(lo, hi, BLOCK_M):
        rows = start_m + tl.arange(0, BLOCK_M)
        q = load_tile(q_base + rows[:, None] * stride_qn + offs_d[None, :] * stride_qd,
                       rows, N_Q, offs_d, HEAD_DIM, BLOCK_D, MASKED)  # (BLOCK_M, BLOCK_D)
        do = load_tile(do_base + rows[:, None] * stride_don + offs_d[None, :] * stride_dod,
                        rows, N_Q, offs_d, HEAD_DIM, BLOCK_D, MASKED)
        if MASKED:
            lse2 = tl.load(lse_base + rows, mask=rows < N_Q, other=0.0) * LOG2E_IN_KERNEL
            delta = tl.load(delta_base + rows, mask=rows < N_Q, other=0.0)
        else:
            lse2 = tl.load(lse_base + rows) * LOG2E_IN_KERNEL
            delta = tl.load(delta_base + rows)
        qk_t = tl.dot(k, tl.trans(q), input_precision=DOT_PRECISION)  # (BLOCK_N, BLOCK_M)
        p_t = tl.exp2(qk_t * qk_scale - lse2[None, :])
        if MASKED and CAUSAL:
            p_t = tl.where(offs_n[:, None] <= rows[None, :], p_t, 0.0)
        dv += tl.dot(p_t.to(do.dtype), do, input_precision=DOT_PRECISION)  # (BLOCK_N, BLOCK_D)
        dp_t = tl.dot(v, tl.trans(do), input_precision=DOT_PRECISION)  # (BLOCK_N, BLOCK_M)
        ds_t = p_t * (dp_t - delta[None, :])
        dk += tl.dot(ds_t.to(q.dtype), q, input_precision=DOT_PRECISION)
        if ATOMIC_DQ:  # dQ rows of this query tile get this key tile's share: scale * dS K
            dq_part = tl.dot(tl.trans(ds_t.to(k.dtype)), k, input_precision=DOT_PRECISION) * scale
            dq_ptrs = dq_base + rows[:, None] * stride_dqn + offs_d[None, :] * stride_dqd
            tl.atomic_add(dq_ptrs, dq_part, mask=(rows[:, None] < N_Q) & (offs_d[None, :] < HEAD_DIM))
    return dk, dv


@triton.jit
def _bwd_dkdv_kernel(
    Q, K, V, DO, DK, DV, DQ, LSE, DELTA, scale, qk_scale,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_dob, stride_doh, stride_don, stride_dod,
    stride_dkb, stride_dkh, stride_dkn, stride_dkd,
    stride_dvb, stride_dvh, stride_dvn, stride_dvd,
    stride_dqb, stride_dqh, stride_dqn, stride_dqd,
    H, N_Q, N_KV,
    CAUSAL: tl.constexpr, ATOMIC_DQ: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = (pid_bh // H).to(tl.int64)
    h = (pid_bh % H).to(tl.int64)
    start_n = pid_n * BLOCK_N
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    k = load_tile(K + b * stride_kb + h * stride_kh + offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kd,
                   offs_n, N_KV, offs_d, HEAD_DIM, BLOCK_D, True)  # (BLOCK_N, BLOCK_D), stays resident
    v = load_tile(V + b * stride_vb + h * stride_vh + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd,
                   offs_n, N_KV, offs_d, HEAD_DIM, BLOCK_D, True)
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    q_base = Q + b * stride_qb + h * stride_qh
    do_base = DO + b * stride_dob + h * stride_doh
    dq_base = DQ + b * stride_dqb + h * stride_dqh
    lse_base = LSE + pid_bh.to(tl.int64) * N_Q
    delta_base = DELTA + pid_bh.to(tl.int64) * N_Q

    # Query tiles [full_lo, full_end) are whole and see every key of this tile: no masks.
    full_end = (N_Q // BLOCK_M) * BLOCK_M
    full_lo = 0
    if CAUSAL:
        # Queries before start_n see none of these keys; [start_n, start_n + BLOCK_N) is the diagonal.
        full_lo = tl.minimum(start_n + BLOCK_N, full_end)  # a multiple of BLOCK_M: BLOCK_N % BLOCK_M == 0
        dk, dv = _dkdv_tiles(dk, dv, k, v, q_base, do_base, dq_base, lse_base, delta_base,
                             stride_qn, stride_qd, stride_don, stride_dod, stride_dqn, stride_dqd,
                             offs_n, start_n, tl.minimum(start_n + BLOCK_N, N_Q), N_Q, qk_scale, scale,
                             True, CAUSAL, ATOMIC_DQ, HEAD_DIM, BLOCK_D, BLOCK_M, DOT_PRECISION)
    dk, dv = _dkdv_tiles(dk, dv, k, v, q_base, do_base, dq_base, lse_base, delta_base,
                         stride_qn, stride_qd, stride_don, stride_dod, stride_dqn, stride_dqd,
                         offs_n, full_lo, full_end, N_Q, qk_scale, scale,
                         False, CAUSAL, ATOMIC_DQ, HEAD_DIM, BLOCK_D, BLOCK_M, DOT_PRECISION)
    # The tail tile past the last whole query tile (if not already covered by the diagonal).
    tail_lo = full_end
    if CAUSAL:
        tail_lo = tl.maximum(full_end, start_n + BLOCK_N)
    dk, dv = _dkdv_tiles(dk, dv, k, v, q_base, do_base, dq_base, lse_base, delta_base,
                         stride_qn, stride_qd, stride_don, stride_dod, stride_dqn, stride_dqd,
                         offs_n, tail_lo, N_Q, N_Q, qk_scale, scale,
                         True, CAUSAL, ATOMIC_DQ, HEAD_DIM, BLOCK_D, BLOCK_M, DOT_PRECISION)

    store_mask = (offs_n[:, None] < N_KV) & (offs_d[None, :] < HEAD_DIM)
    dk_ptrs = DK + b * stride_dkb + h * stride_dkh + offs_n[:, None] * stride_dkn + offs_d[None, :] * stride_dkd
    dv_ptrs = DV + b * stride_dvb + h * stride_dvh + offs_n[:, None] * stride_dvn + offs_d[None, :] * stride_dvd
    tl.store(dk_ptrs, (dk * scale).to(DK.dtype.element_ty), mask=store_mask)
    tl.store(dv_ptrs, dv.to(DV.dtype.element_ty), mask=store_mask)


@triton.jit
def _dq_tiles(dq, q, do, lse2, delta, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd,
              offs_m, lo, hi, N_KV, qk_scale,
              MASKED: tl.constexpr, CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
              BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Accumulate (unscaled) dQ of one query tile over key tiles [lo, hi)."""
    offs_d = tl.arange(0, BLOCK_D)
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + tl.arange(0, BLOCK_N)
        k = load_tile(k_base + cols[:, None] * stride_kn + offs_d[None, :] * stride_kd,
                       cols, N_KV, offs_d, HEAD_DIM, BLOCK_D, MASKED)  # (BLOCK_N, BLOCK_D)
        v = load_tile(v_base + cols[:, None] * stride_vn + offs_d[None, :] * stride_vd,
                       cols, N_KV, offs_d, HEAD_DIM, BLOCK_D, MASKED)
        qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)  # (BLOCK_M, BLOCK_N)
        p = tl.exp2(qk * qk_scale - lse2[:, None])
        if MASKED:
            valid = cols[None, :] < N_KV
            if CAUSAL:
                valid = valid & (cols[None, :] <= offs_m[:, None])
            p = tl.where(valid, p, 0.0)
        dp = tl.dot(do, tl.trans(v), input_precision=DOT_PRECISION)  # (BLOCK_M, BLOCK_N)
        ds = p * (dp - delta[:, None])
        dq += tl.dot(ds.to(k.dtype), k, input_precision=DOT_PRECISION)
    return dq


@triton.jit
def _bwd_dq_kernel(
    Q, K, V, DO, DQ, LSE, DELTA, scale, qk_scale,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_dob, stride_doh, stride_don, stride_dod,
    stride_dqb, stride_dqh, stride_dqn, stride_dqd,
    H, N_Q, N_KV,
    CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = (pid_bh // H).to(tl.int64)
    h = (pid_bh % H).to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    q = load_tile(Q + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qn + offs_d[None, :] * stride_qd,
                   offs_m, N_Q, offs_d, HEAD_DIM, BLOCK_D, True)  # (BLOCK_M, BLOCK_D)
    do = load_tile(DO + b * stride_dob + h * stride_doh + offs_m[:, None] * stride_don
                    + offs_d[None, :] * stride_dod, offs_m, N_Q, offs_d, HEAD_DIM, BLOCK_D, True)
    row_ok = offs_m < N_Q
    lse2 = tl.load(LSE + pid_bh.to(tl.int64) * N_Q + offs_m, mask=row_ok, other=0.0) * LOG2E_IN_KERNEL
    delta = tl.load(DELTA + pid_bh.to(tl.int64) * N_Q + offs_m, mask=row_ok, other=0.0)
    k_base = K + b * stride_kb + h * stride_kh
    v_base = V + b * stride_vb + h * stride_vh
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    full_end = (N_KV // BLOCK_N) * BLOCK_N
    masked_end = N_KV
    if CAUSAL:
        full_end = tl.minimum(full_end, pid_m * BLOCK_M)  # a multiple of BLOCK_N: BLOCK_M % BLOCK_N == 0
        masked_end = tl.minimum(N_KV, (pid_m + 1) * BLOCK_M)
    dq = _dq_tiles(dq, q, do, lse2, delta, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd,
                   offs_m, 0, full_end, N_KV, qk_scale, False, CAUSAL, HEAD_DIM, BLOCK_D, BLOCK_N, DOT_PRECISION)
    dq = _dq_tiles(dq, q, do, lse2, delta, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd,
                   offs_m, full_end, masked_end, N_KV, qk_scale, True, CAUSAL, HEAD_DIM, BLOCK_D, BLOCK_N,
                   DOT_PRECISION)
    dq_ptrs = DQ + b * stride_dqb + h * stride_dqh + offs_m[:, None] * stride_dqn + offs_d[None, :] * stride_dqd
    tl.store(dq_ptrs, (dq * scale).to(DQ.dtype.element_ty), mask=row_ok[:, None] & (offs_d[None, :] < HEAD_DIM))


@dataclass(frozen=True)
class BackwardVersion:
    """One dQ scheme of the backward: what it changes and what we predicted."""

    name: str
    title: str
    changes: str
    prediction: str
    atomic_dq: bool


BACKWARD_VERSIONS: dict[str, BackwardVersion] = {
    v.name: v
    for v in [
        BackwardVersion("b1", "separate dQ kernel", "Q-stationary dQ kernel after the K/V-stationary dK/dV one",
                        "7 matmuls instead of 5 (+40% FLOPs), but no atomics: about SDPA flash's speed",
                        atomic_dq=False),
        BackwardVersion("b2", "atomic dQ", "dQ added by the dK/dV kernel with fp32 atomics (FA2's scheme)",
                        "5 matmuls, but N/BLOCK_N atomic passes over dQ through L2: slower at large N",
                        atomic_dq=True),
    ]
}
DEFAULT_BACKWARD = "b1"


def check_backward_launch(cfg_dkdv: configs.KernelConfig, cfg_dq: configs.KernelConfig, *, causal: bool) -> None:
    """A launch that breaks a kernel's own rule is an error, never silently wrong gradients."""
    if causal and cfg_dkdv.block_n % cfg_dkdv.block_m:
        raise ValueError(
            f"the dK/dV kernel with causal=True starts its unmasked query tiles at a key-tile edge, so its BLOCK_N "
            f"({cfg_dkdv.block_n}) must be a multiple of its BLOCK_M ({cfg_dkdv.block_m})"
        )
    if causal and cfg_dq.block_m % cfg_dq.block_n:
        raise ValueError(
            f"the dQ kernel with causal=True splits each row's keys at a query-tile edge, so its BLOCK_M "
            f"({cfg_dq.block_m}) must be a multiple of its BLOCK_N ({cfg_dq.block_n})"
        )


def run_backward(version: BackwardVersion, q, k, v, o, lse, do, *, causal: bool, scale: float | None,
                 configs_override: tuple[configs.KernelConfig, configs.KernelConfig] | None = None):
    """dq, dk, dv from the forward's saved (o, lse); all (B, H, N, D) tensors of q's dtype."""
    batch, heads, n_q, head_dim = q.shape
    n_kv = k.shape[2]
    scale = default_scale(head_dim, scale)
    block_d = padded_head_dim(head_dim)
    props = configs.device_props(q.device)
    cfg_dkdv, cfg_dq = configs_override or configs.backward_config(props, block_d, q.element_size(),
                                                                           causal=causal)
    check_backward_launch(cfg_dkdv, cfg_dq, causal=causal)
    dk = torch.empty_like(k)
    dv = torch.empty_like(v)
    if version.atomic_dq:
        dq_acc = torch.zeros(q.shape, device=q.device, dtype=torch.float32)
    else:
        dq_acc = torch.empty_like(q)
    if batch * heads * n_q == 0 or n_kv == 0:
        return torch.zeros_like(q), dk.zero_(), dv.zero_()
    delta = torch.empty((batch, heads, n_q), device=q.device, dtype=torch.float32)
    precision = dot_precision(q.dtype)
    pre_block = 64
    _bwd_preprocess[(triton.cdiv(n_q, pre_block), batch * heads)](
        O=o, DO=do, DELTA=delta, **strides(o, "o"), **strides(do, "do"), H=heads, N_Q=n_q,
        HEAD_DIM=head_dim, BLOCK_D=block_d, BLOCK_M=pre_block,
    )
    _bwd_dkdv_kernel[(triton.cdiv(n_kv, cfg_dkdv.block_n), batch * heads)](
        Q=q, K=k, V=v, DO=do, DK=dk, DV=dv, DQ=dq_acc, LSE=lse, DELTA=delta, scale=scale, qk_scale=scale * LOG2E,
        **strides(q, "q"), **strides(k, "k"), **strides(v, "v"), **strides(do, "do"), **strides(dk, "dk"),
        **strides(dv, "dv"), **strides(dq_acc, "dq"),
        H=heads, N_Q=n_q, N_KV=n_kv,
        CAUSAL=causal, ATOMIC_DQ=version.atomic_dq, HEAD_DIM=head_dim, BLOCK_D=block_d,
        BLOCK_M=cfg_dkdv.block_m, BLOCK_N=cfg_dkdv.block_n, DOT_PRECISION=precision,
        num_warps=cfg_dkdv.num_warps, num_stages=cfg_dkdv.num_stages,
    )
    if version.atomic_dq:
        return dq_acc.to(q.dtype), dk, dv
    _bwd_dq_kernel[(triton.cdiv(n_q, cfg_dq.block_m), batch * heads)](
        Q=q, K=k, V=v, DO=do, DQ=dq_acc, LSE=lse, DELTA=delta, scale=scale, qk_scale=scale * LOG2E,
        **strides(q, "q"), **strides(k, "k"), **strides(v, "v"), **strides(do, "do"), **strides(dq_acc, "dq"),
        H=heads, N_Q=n_q, N_KV=n_kv,
        CAUSAL=causal, HEAD_DIM=head_dim, BLOCK_D=block_d,
        BLOCK_M=cfg_dq.block_m, BLOCK_N=cfg_dq.block_n, DOT_PRECISION=precision,
        num_warps=cfg_dq.num_warps, num_stages=cfg_dq.num_stages,
    )
    return dq_acc, dk, dv
