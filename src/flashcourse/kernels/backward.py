"""Backward FlashAttention kernels (FA2 style): recompute P from (q, k, lse) instead of storing it.

With S = scale * Q K^T, P = softmax(S) = exp(S - lse), dO the incoming gradient:
    dV = P^T dO          dP = dO V^T          dS = P * (dP - Delta),  Delta = rowsum(dO * O)
    dQ = scale * dS K    dK = scale * dS^T Q
Three launches:
1. ``_bwd_preprocess``: Delta (B, H, N_q), one pass over O and dO.
2. ``_bwd_dkdv_kernel``: K/V-stationary; a program owns BLOCK_N keys, keeps dK and dV in registers and streams
   every query tile that sees them. No two programs write the same dK/dV rows, so no atomics.
3. the dQ scheme, one of five (``BACKWARD_VERSIONS``):
   - "b1" ``_bwd_dq_kernel``: Q-stationary, streams K/V tiles; recomputes Q K^T and dO V^T a second time
     (7 matmuls in all instead of 5) but writes dQ once, with plain stores.
   - "b2" dQ accumulated by the dK/dV kernel with fp32 atomic adds into a (B, H, N_q, D) buffer (FA2's own
     scheme): 5 matmuls, but every (key tile, query tile) pair adds a BLOCK_M x D tile into L2.
   - "b3" ``_bwd_dkdv_b3_kernel`` + ``_bwd_dq_b3_kernel``: b1's scheme under the variant rules (``rules.py``)
     as compile-time switches; a dK/dV program loops over the query heads of its K/V head's group, so GQA's
     dK, dV are summed in registers (no atomics, no expanded K/V).
   - "b4" b2 with relaxed atomics (``sem="relaxed"``): atomic adds without an acquire-release order each.
   - "b5" b2 with each dQ tile staged in shared memory and added by a TMA reduce-add through a tensor
     descriptor (the Tensor Memory Accelerator, a copy unit in each SM of a Hopper GPU, not one of the GPU's
     copy engines), as FlashAttention-3 sums dQ; sm_90 and newer.
Scores are kept in base 2 as in the forward: p = exp2(qk * scale*log2(e) - lse*log2(e)).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import blockmask, configs
from ._checks import dot_precision, padded_head_dim
from .common import (
    LOG2E,
    LOG2E_IN_KERNEL,
    default_scale,
    key_tile_range,
    load_tile,
    modified_scores,
    query_tile_range,
    strides,
    tma_scratch,
    visible,
)
from .dropout import Dropout, kept_weight_factor
from .dropout import kernel_args as dropout_args
from .launch import prepare_launch
from .rules import Rules, causal_rules, refuse_missing
from .stepdown import launch_fitting
from .teaching import backward as teaching
from .versions import DQ_KERNEL, DQ_RELAXED, DQ_TMA, BackwardVersion


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
                   offs_m, N_Q, offs_d, HEAD_DIM, BLOCK_D, CHECK_ROWS=True)
    do = load_tile(DO + b * stride_dob + h * stride_doh + offs_m[:, None] * stride_don
                    + offs_d[None, :] * stride_dod, offs_m, N_Q, offs_d, HEAD_DIM, BLOCK_D, CHECK_ROWS=True)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)  # (BLOCK_M,)
    tl.store(DELTA + pid_bh.to(tl.int64) * N_Q + offs_m, delta, mask=offs_m < N_Q)


@triton.jit
def _dkdv_tiles(dk, dv, k, v, q_base, do_base, dq_base, lse_base, delta_base,
                stride_qn, stride_qd, stride_don, stride_dod, stride_dqn, stride_dqd,
                offs_n, lo, hi, N_Q, qk_scale, scale,
                MASKED: tl.constexpr, CAUSAL: tl.constexpr, DQ_MODE: tl.constexpr,
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
        if DQ_MODE != DQ_KERNEL:  # dQ rows of this query tile get this key tile's share: dS K (scaled later)
            dq_part = tl.dot(tl.trans(ds_t.to(k.dtype)), k, input_precision=DOT_PRECISION)
            if DQ_MODE == DQ_TMA:  # dq_base is a tensor descriptor; rows past N_Q are clipped by the copy
                dq_base.atomic_add([start_m, 0], dq_part)
            else:
                dq_ptrs = dq_base + rows[:, None] * stride_dqn + offs_d[None, :] * stride_dqd
                dq_mask = (rows[:, None] < N_Q) & (offs_d[None, :] < HEAD_DIM)
                if DQ_MODE == DQ_RELAXED:
                    tl.atomic_add(dq_ptrs, dq_part, mask=dq_mask, sem="relaxed")
                else:
                    tl.atomic_add(dq_ptrs, dq_part, mask=dq_mask)
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
    CAUSAL: tl.constexpr, DQ_MODE: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
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
                   offs_n, N_KV, offs_d, HEAD_DIM, BLOCK_D, CHECK_ROWS=True)  # (BLOCK_N, BLOCK_D), stays resident
    v = load_tile(V + b * stride_vb + h * stride_vh + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd,
                   offs_n, N_KV, offs_d, HEAD_DIM, BLOCK_D, CHECK_ROWS=True)
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    q_base = Q + b * stride_qb + h * stride_qh
    do_base = DO + b * stride_dob + h * stride_doh
    dq_base = DQ + b * stride_dqb + h * stride_dqh
    if DQ_MODE == DQ_TMA:  # this head's (N_Q, HEAD_DIM) slice of the fp32 accumulator, in BLOCK_M-row tiles
        dq_base = tl.make_tensor_descriptor(dq_base, shape=[N_Q, HEAD_DIM], strides=[stride_dqn, 1],
                                            block_shape=[BLOCK_M, BLOCK_D])
    lse_base = LSE + pid_bh.to(tl.int64) * N_Q
    delta_base = DELTA + pid_bh.to(tl.int64) * N_Q

    # Query tiles [full_lo, full_end) are whole and see every key of this tile: no masks.
    full_end = (N_Q // BLOCK_M) * BLOCK_M
    full_lo = 0
    if CAUSAL:
        # Queries before start_n see none of these keys; [start_n, start_n + BLOCK_N) is the diagonal.
        full_lo = tl.minimum(start_n + BLOCK_N, full_end)  # a multiple of BLOCK_M: BLOCK_N % BLOCK_M == 0
        dk, dv = _dkdv_tiles(
            dk, dv, k, v, q_base=q_base, do_base=do_base, dq_base=dq_base, lse_base=lse_base, delta_base=delta_base,
            stride_qn=stride_qn, stride_qd=stride_qd, stride_don=stride_don, stride_dod=stride_dod,
            stride_dqn=stride_dqn, stride_dqd=stride_dqd, offs_n=offs_n, lo=start_n,
            hi=tl.minimum(start_n + BLOCK_N, N_Q), N_Q=N_Q, qk_scale=qk_scale, scale=scale, MASKED=True, CAUSAL=CAUSAL,
            DQ_MODE=DQ_MODE, HEAD_DIM=HEAD_DIM, BLOCK_D=BLOCK_D, BLOCK_M=BLOCK_M, DOT_PRECISION=DOT_PRECISION)
    dk, dv = _dkdv_tiles(
        dk, dv, k, v, q_base=q_base, do_base=do_base, dq_base=dq_base, lse_base=lse_base, delta_base=delta_base,
        stride_qn=stride_qn, stride_qd=stride_qd, stride_don=stride_don, stride_dod=stride_dod, stride_dqn=stride_dqn,
        stride_dqd=stride_dqd, offs_n=offs_n, lo=full_lo, hi=full_end, N_Q=N_Q, qk_scale=qk_scale, scale=scale,
        MASKED=False, CAUSAL=CAUSAL, DQ_MODE=DQ_MODE, HEAD_DIM=HEAD_DIM, BLOCK_D=BLOCK_D, BLOCK_M=BLOCK_M,
        DOT_PRECISION=DOT_PRECISION)
    # The tail tile past the last whole query tile (if not already covered by the diagonal).
    tail_lo = full_end
    if CAUSAL:
        tail_lo = tl.maximum(full_end, start_n + BLOCK_N)
    dk, dv = _dkdv_tiles(
        dk, dv, k, v, q_base=q_base, do_base=do_base, dq_base=dq_base, lse_base=lse_base, delta_base=delta_base,
        stride_qn=stride_qn, stride_qd=stride_qd, stride_don=stride_don, stride_dod=stride_dod, stride_dqn=stride_dqn,
        stride_dqd=stride_dqd, offs_n=offs_n, lo=tail_lo, hi=N_Q, N_Q=N_Q, qk_scale=qk_scale, scale=scale, MASKED=True,
        CAUSAL=CAUSAL, DQ_MODE=DQ_MODE, HEAD_DIM=HEAD_DIM, BLOCK_D=BLOCK_D, BLOCK_M=BLOCK_M,
        DOT_PRECISION=DOT_PRECISION)

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
                   offs_m, N_Q, offs_d, HEAD_DIM, BLOCK_D, CHECK_ROWS=True)  # (BLOCK_M, BLOCK_D)
    do = load_tile(DO + b * stride_dob + h * stride_doh + offs_m[:, None] * stride_don
                    + offs_d[None, :] * stride_dod, offs_m, N_Q, offs_d, HEAD_DIM, BLOCK_D, CHECK_ROWS=True)
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
    dq = _dq_tiles(
        dq, q, do, lse2, delta=delta, k_base=k_base, v_base=v_base, stride_kn=stride_kn, stride_kd=stride_kd,
        stride_vn=stride_vn, stride_vd=stride_vd, offs_m=offs_m, lo=0, hi=full_end, N_KV=N_KV, qk_scale=qk_scale,
        MASKED=False, CAUSAL=CAUSAL, HEAD_DIM=HEAD_DIM, BLOCK_D=BLOCK_D, BLOCK_N=BLOCK_N, DOT_PRECISION=DOT_PRECISION)
    dq = _dq_tiles(
        dq, q, do, lse2, delta=delta, k_base=k_base, v_base=v_base, stride_kn=stride_kn, stride_kd=stride_kd,
        stride_vn=stride_vn, stride_vd=stride_vd, offs_m=offs_m, lo=full_end, hi=masked_end, N_KV=N_KV,
        qk_scale=qk_scale, MASKED=True, CAUSAL=CAUSAL, HEAD_DIM=HEAD_DIM, BLOCK_D=BLOCK_D, BLOCK_N=BLOCK_N,
        DOT_PRECISION=DOT_PRECISION)
    dq_ptrs = DQ + b * stride_dqb + h * stride_dqh + offs_m[:, None] * stride_dqn + offs_d[None, :] * stride_dqd
    tl.store(dq_ptrs, (dq * scale).to(DQ.dtype.element_ty), mask=row_ok[:, None] & (offs_d[None, :] < HEAD_DIM))


# ------------------------------------------------------------------------------------------ b3 (rules)
@triton.jit
def _dkdv_tile_b3(dk, dv, k, v, seed, bh, dropout_p, DROPOUT: tl.constexpr,
                  q_base, do_base, lse_base, delta_base, stride_qn, stride_qd, stride_don,
                  stride_dod, start_m, b, h, offs_n, N_Q, N_KV, qk_scale, UPPER, LOWER, SHIFT, doc_ids, softcap2,
                  slope2, MASKED: tl.constexpr, HAS_UPPER: tl.constexpr, HAS_LOWER: tl.constexpr,
                  HAS_DOCS: tl.constexpr, MASK_MOD: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
                  HAS_ALIBI: tl.constexpr, SCORE_MOD: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                  BLOCK_M: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """dK, dV of one key tile from the query tile [start_m, start_m + BLOCK_M) of head h, under the rules.
    Transposed layout, as b1: scores are (BLOCK_N keys, BLOCK_M queries)."""
    offs_d = tl.arange(0, BLOCK_D)
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
    if SCORE_MOD:
        s_t, tanh_t = modified_scores(
            qk=qk_t, q_idx=rows[None, :], kv_idx=offs_n[:, None], qk_scale=qk_scale, softcap2=softcap2, slope2=slope2,
            SHIFT=SHIFT, HAS_SOFTCAP=HAS_SOFTCAP, HAS_ALIBI=HAS_ALIBI)
    else:
        s_t = qk_t * qk_scale
    p_t = tl.exp2(s_t - lse2[None, :])
    if MASKED:  # after exp2: a row with no visible key has lse = -inf, and its p must become 0, not inf
        ok = visible(
            b, h, q_idx=rows[None, :], kv_idx=offs_n[:, None], N_Q=N_Q, N_KV=N_KV, UPPER=UPPER, LOWER=LOWER,
            doc_ids=doc_ids, HAS_UPPER=HAS_UPPER, HAS_LOWER=HAS_LOWER, HAS_DOCS=HAS_DOCS, MASK_MOD=MASK_MOD)
        p_t = tl.where(ok, p_t, 0.0)
    dp_t = tl.dot(v, tl.trans(do), input_precision=DOT_PRECISION)  # (BLOCK_N, BLOCK_M)
    if DROPOUT:  # the forward's mask, regenerated: O used the dropped weights, so dV and dP go through it
        factor_t = kept_weight_factor(seed, bh, q_idx=rows[None, :], kv_idx=offs_n[:, None], N_Q=N_Q, N_KV=N_KV,
                                      dropout_p=dropout_p)
        dv += tl.dot((p_t * factor_t).to(do.dtype), do, input_precision=DOT_PRECISION)
        dp_t = dp_t * factor_t
    else:
        dv += tl.dot(p_t.to(do.dtype), do, input_precision=DOT_PRECISION)  # (BLOCK_N, BLOCK_D)
    ds_t = p_t * (dp_t - delta[None, :])  # delta = rowsum(dO * O) holds with dropout too: O is the dropped one
    if HAS_SOFTCAP:  # through the cap: d(c * tanh(s / c)) / ds = 1 - tanh^2
        ds_t = ds_t * (1.0 - tanh_t * tanh_t)
    dk += tl.dot(ds_t.to(q.dtype), q, input_precision=DOT_PRECISION)
    return dk, dv


@triton.jit
def _bwd_dkdv_b3_kernel(
    Q, K, V, DO, DK, DV, LSE, DELTA, scale, qk_scale,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_dob, stride_doh, stride_don, stride_dod,
    stride_dkb, stride_dkh, stride_dkn, stride_dkd,
    stride_dvb, stride_dvh, stride_dvn, stride_dvd,
    H_KV, GROUP, N_Q, N_KV,
    UPPER, LOWER, SHIFT, DOC_IDS, stride_doc_b, softcap2, ALIBI_SLOPES,
    FULL_COUNTS, FULL_TILES, PARTIAL_COUNTS, PARTIAL_TILES, B_MASK, H_MASK, TILES_PER_ROW, SEED, dropout_p,
    HAS_UPPER: tl.constexpr, HAS_LOWER: tl.constexpr, HAS_DOCS: tl.constexpr, MASK_MOD: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr, SCORE_MOD: tl.constexpr, BLOCK_SPARSE: tl.constexpr,
    DROPOUT: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_bkv = tl.program_id(1)  # over B * H_kv: one program owns a K/V tile of one K/V head
    b = (pid_bkv // H_KV).to(tl.int64)
    h_kv = (pid_bkv % H_KV).to(tl.int64)
    start_n = pid_n * BLOCK_N
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    k = load_tile(K + b * stride_kb + h_kv * stride_kh + offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kd,
                  offs_n, N_KV, offs_d, HEAD_DIM, BLOCK_D, CHECK_ROWS=True)  # (BLOCK_N, BLOCK_D), stays resident
    v = load_tile(V + b * stride_vb + h_kv * stride_vh + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd,
                  offs_n, N_KV, offs_d, HEAD_DIM, BLOCK_D, CHECK_ROWS=True)
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    doc_ids = DOC_IDS + b * stride_doc_b
    seed = 0
    if DROPOUT:
        seed = tl.load(SEED)

    # Query rows from the bounds alone (key j is seen by rows j - UPPER <= i <= j - LOWER): rows [lo, hi) see
    # some key of this tile; the query tiles inside [full_lo, full_hi) see all of them (no mask).
    lo, hi, full_lo, full_hi = query_tile_range(
        start_n, N_Q, N_KV, UPPER, LOWER=LOWER, HAS_UPPER=HAS_UPPER, HAS_LOWER=HAS_LOWER, BLOCK_M=BLOCK_M,
        BLOCK_N=BLOCK_N)

    # Every query head of the group adds into the same dK, dV registers: the sum over the group, no atomics.
    for g in range(0, GROUP):
        h = h_kv * GROUP + g
        bh = b * H_KV * GROUP + h  # the dropout stream's row of heads (int64), as the forward numbers it
        q_base = Q + b * stride_qb + h * stride_qh
        do_base = DO + b * stride_dob + h * stride_doh
        lse_base = LSE + (b * H_KV * GROUP + h) * N_Q
        delta_base = DELTA + (b * H_KV * GROUP + h) * N_Q
        slope2 = 0.0
        if HAS_ALIBI:
            slope2 = tl.load(ALIBI_SLOPES + h) * LOG2E_IN_KERNEL
        if BLOCK_SPARSE:  # the block mask lists this key tile's full and partial query tiles
            row = ((b % B_MASK) * H_MASK + h % H_MASK) * tl.num_programs(0) + pid_n  # B_MASK, H_MASK: 1 = broadcast
            for i in range(0, tl.load(FULL_COUNTS + row)):
                start_m = tl.load(FULL_TILES + row * TILES_PER_ROW + i) * BLOCK_M
                dk, dv = _dkdv_tile_b3(
                    dk, dv, k, v, seed=seed, bh=bh, dropout_p=dropout_p, DROPOUT=DROPOUT,
                    q_base=q_base, do_base=do_base, lse_base=lse_base, delta_base=delta_base,
                    stride_qn=stride_qn, stride_qd=stride_qd, stride_don=stride_don, stride_dod=stride_dod,
                    start_m=start_m, b=b, h=h, offs_n=offs_n, N_Q=N_Q, N_KV=N_KV, qk_scale=qk_scale, UPPER=UPPER,
                    LOWER=LOWER, SHIFT=SHIFT, doc_ids=doc_ids, softcap2=softcap2, slope2=slope2, MASKED=False,
                    HAS_UPPER=HAS_UPPER, HAS_LOWER=HAS_LOWER, HAS_DOCS=HAS_DOCS, MASK_MOD=MASK_MOD,
                    HAS_SOFTCAP=HAS_SOFTCAP, HAS_ALIBI=HAS_ALIBI, SCORE_MOD=SCORE_MOD, HEAD_DIM=HEAD_DIM,
                    BLOCK_D=BLOCK_D, BLOCK_M=BLOCK_M, DOT_PRECISION=DOT_PRECISION)
            for i in range(0, tl.load(PARTIAL_COUNTS + row)):
                start_m = tl.load(PARTIAL_TILES + row * TILES_PER_ROW + i) * BLOCK_M
                dk, dv = _dkdv_tile_b3(
                    dk, dv, k, v, seed=seed, bh=bh, dropout_p=dropout_p, DROPOUT=DROPOUT,
                    q_base=q_base, do_base=do_base, lse_base=lse_base, delta_base=delta_base,
                    stride_qn=stride_qn, stride_qd=stride_qd, stride_don=stride_don, stride_dod=stride_dod,
                    start_m=start_m, b=b, h=h, offs_n=offs_n, N_Q=N_Q, N_KV=N_KV, qk_scale=qk_scale, UPPER=UPPER,
                    LOWER=LOWER, SHIFT=SHIFT, doc_ids=doc_ids, softcap2=softcap2, slope2=slope2, MASKED=True,
                    HAS_UPPER=HAS_UPPER, HAS_LOWER=HAS_LOWER, HAS_DOCS=HAS_DOCS, MASK_MOD=MASK_MOD,
                    HAS_SOFTCAP=HAS_SOFTCAP, HAS_ALIBI=HAS_ALIBI, SCORE_MOD=SCORE_MOD, HEAD_DIM=HEAD_DIM,
                    BLOCK_D=BLOCK_D, BLOCK_M=BLOCK_M, DOT_PRECISION=DOT_PRECISION)
        else:
            if HAS_UPPER:  # the diagonal: rows that see only part of the tile
                for start_m in range(lo, full_lo, BLOCK_M):
                    dk, dv = _dkdv_tile_b3(
                        dk, dv, k, v, seed=seed, bh=bh, dropout_p=dropout_p, DROPOUT=DROPOUT,
                        q_base=q_base, do_base=do_base, lse_base=lse_base, delta_base=delta_base,
                        stride_qn=stride_qn, stride_qd=stride_qd, stride_don=stride_don, stride_dod=stride_dod,
                        start_m=start_m, b=b, h=h, offs_n=offs_n, N_Q=N_Q, N_KV=N_KV, qk_scale=qk_scale, UPPER=UPPER,
                        LOWER=LOWER, SHIFT=SHIFT, doc_ids=doc_ids, softcap2=softcap2, slope2=slope2, MASKED=True,
                        HAS_UPPER=HAS_UPPER, HAS_LOWER=HAS_LOWER, HAS_DOCS=HAS_DOCS, MASK_MOD=MASK_MOD,
                        HAS_SOFTCAP=HAS_SOFTCAP, HAS_ALIBI=HAS_ALIBI, SCORE_MOD=SCORE_MOD, HEAD_DIM=HEAD_DIM,
                        BLOCK_D=BLOCK_D, BLOCK_M=BLOCK_M, DOT_PRECISION=DOT_PRECISION)
            for start_m in range(full_lo, full_hi, BLOCK_M):
                dk, dv = _dkdv_tile_b3(
                    dk, dv, k, v, seed=seed, bh=bh, dropout_p=dropout_p, DROPOUT=DROPOUT,
                    q_base=q_base, do_base=do_base, lse_base=lse_base, delta_base=delta_base,
                    stride_qn=stride_qn, stride_qd=stride_qd, stride_don=stride_don, stride_dod=stride_dod,
                    start_m=start_m, b=b, h=h, offs_n=offs_n, N_Q=N_Q, N_KV=N_KV, qk_scale=qk_scale, UPPER=UPPER,
                    LOWER=LOWER, SHIFT=SHIFT, doc_ids=doc_ids, softcap2=softcap2, slope2=slope2, MASKED=False,
                    HAS_UPPER=HAS_UPPER, HAS_LOWER=HAS_LOWER, HAS_DOCS=HAS_DOCS, MASK_MOD=MASK_MOD,
                    HAS_SOFTCAP=HAS_SOFTCAP, HAS_ALIBI=HAS_ALIBI, SCORE_MOD=SCORE_MOD, HEAD_DIM=HEAD_DIM,
                    BLOCK_D=BLOCK_D, BLOCK_M=BLOCK_M, DOT_PRECISION=DOT_PRECISION)
            # The window's far edge and the tail tile past the last whole query tile.
            for start_m in range(full_hi, hi, BLOCK_M):
                dk, dv = _dkdv_tile_b3(
                    dk, dv, k, v, seed=seed, bh=bh, dropout_p=dropout_p, DROPOUT=DROPOUT,
                    q_base=q_base, do_base=do_base, lse_base=lse_base, delta_base=delta_base,
                    stride_qn=stride_qn, stride_qd=stride_qd, stride_don=stride_don, stride_dod=stride_dod,
                    start_m=start_m, b=b, h=h, offs_n=offs_n, N_Q=N_Q, N_KV=N_KV, qk_scale=qk_scale, UPPER=UPPER,
                    LOWER=LOWER, SHIFT=SHIFT, doc_ids=doc_ids, softcap2=softcap2, slope2=slope2, MASKED=True,
                    HAS_UPPER=HAS_UPPER, HAS_LOWER=HAS_LOWER, HAS_DOCS=HAS_DOCS, MASK_MOD=MASK_MOD,
                    HAS_SOFTCAP=HAS_SOFTCAP, HAS_ALIBI=HAS_ALIBI, SCORE_MOD=SCORE_MOD, HEAD_DIM=HEAD_DIM,
                    BLOCK_D=BLOCK_D, BLOCK_M=BLOCK_M, DOT_PRECISION=DOT_PRECISION)

    store_mask = (offs_n[:, None] < N_KV) & (offs_d[None, :] < HEAD_DIM)
    dk_ptrs = DK + b * stride_dkb + h_kv * stride_dkh + offs_n[:, None] * stride_dkn + offs_d[None, :] * stride_dkd
    dv_ptrs = DV + b * stride_dvb + h_kv * stride_dvh + offs_n[:, None] * stride_dvn + offs_d[None, :] * stride_dvd
    tl.store(dk_ptrs, (dk * scale).to(DK.dtype.element_ty), mask=store_mask)
    tl.store(dv_ptrs, dv.to(DV.dtype.element_ty), mask=store_mask)


@triton.jit
def _dq_tile_b3(dq, q, do, lse2, seed, bh, dropout_p, DROPOUT: tl.constexpr,
                delta, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd, start_n,
                b, h, offs_m, N_Q, N_KV, qk_scale, UPPER, LOWER, SHIFT, doc_ids, softcap2, slope2,
                MASKED: tl.constexpr, HAS_UPPER: tl.constexpr, HAS_LOWER: tl.constexpr, HAS_DOCS: tl.constexpr,
                MASK_MOD: tl.constexpr, HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr,
                SCORE_MOD: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
                DOT_PRECISION: tl.constexpr):
    """(Unscaled) dQ of one query tile from the key tile [start_n, start_n + BLOCK_N), under the rules."""
    offs_d = tl.arange(0, BLOCK_D)
    cols = start_n + tl.arange(0, BLOCK_N)
    k = load_tile(k_base + cols[:, None] * stride_kn + offs_d[None, :] * stride_kd,
                  cols, N_KV, offs_d, HEAD_DIM, BLOCK_D, MASKED)  # (BLOCK_N, BLOCK_D)
    v = load_tile(v_base + cols[:, None] * stride_vn + offs_d[None, :] * stride_vd,
                  cols, N_KV, offs_d, HEAD_DIM, BLOCK_D, MASKED)
    qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)  # (BLOCK_M, BLOCK_N)
    if SCORE_MOD:
        s, tanh_s = modified_scores(
            qk, q_idx=offs_m[:, None], kv_idx=cols[None, :], qk_scale=qk_scale, softcap2=softcap2, slope2=slope2,
            SHIFT=SHIFT, HAS_SOFTCAP=HAS_SOFTCAP, HAS_ALIBI=HAS_ALIBI)
    else:
        s = qk * qk_scale
    p = tl.exp2(s - lse2[:, None])
    if MASKED:
        ok = visible(
            b, h, q_idx=offs_m[:, None], kv_idx=cols[None, :], N_Q=N_Q, N_KV=N_KV, UPPER=UPPER, LOWER=LOWER,
            doc_ids=doc_ids, HAS_UPPER=HAS_UPPER, HAS_LOWER=HAS_LOWER, HAS_DOCS=HAS_DOCS, MASK_MOD=MASK_MOD)
        p = tl.where(ok, p, 0.0)
    dp = tl.dot(do, tl.trans(v), input_precision=DOT_PRECISION)  # (BLOCK_M, BLOCK_N)
    if DROPOUT:  # dP of the kept weights, scaled as the forward scaled them
        dp = dp * kept_weight_factor(seed, bh, q_idx=offs_m[:, None], kv_idx=cols[None, :], N_Q=N_Q, N_KV=N_KV,
                                     dropout_p=dropout_p)
    ds = p * (dp - delta[:, None])
    if HAS_SOFTCAP:
        ds = ds * (1.0 - tanh_s * tanh_s)
    return dq + tl.dot(ds.to(k.dtype), k, input_precision=DOT_PRECISION)


@triton.jit
def _bwd_dq_b3_kernel(
    Q, K, V, DO, DQ, LSE, DELTA, scale, qk_scale,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_dob, stride_doh, stride_don, stride_dod,
    stride_dqb, stride_dqh, stride_dqn, stride_dqd,
    H, GROUP, N_Q, N_KV,
    UPPER, LOWER, SHIFT, DOC_IDS, stride_doc_b, softcap2, ALIBI_SLOPES,
    FULL_COUNTS, FULL_TILES, PARTIAL_COUNTS, PARTIAL_TILES, B_MASK, H_MASK, TILES_PER_ROW, SEED, dropout_p,
    HAS_UPPER: tl.constexpr, HAS_LOWER: tl.constexpr, HAS_DOCS: tl.constexpr, MASK_MOD: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr, SCORE_MOD: tl.constexpr, BLOCK_SPARSE: tl.constexpr,
    DROPOUT: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = (pid_bh // H).to(tl.int64)
    h = (pid_bh % H).to(tl.int64)
    h_kv = h // GROUP
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    q = load_tile(Q + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qn + offs_d[None, :] * stride_qd,
                  offs_m, N_Q, offs_d, HEAD_DIM, BLOCK_D, CHECK_ROWS=True)  # (BLOCK_M, BLOCK_D)
    do = load_tile(DO + b * stride_dob + h * stride_doh + offs_m[:, None] * stride_don
                   + offs_d[None, :] * stride_dod, offs_m, N_Q, offs_d, HEAD_DIM, BLOCK_D, CHECK_ROWS=True)
    row_ok = offs_m < N_Q
    lse2 = tl.load(LSE + pid_bh.to(tl.int64) * N_Q + offs_m, mask=row_ok, other=0.0) * LOG2E_IN_KERNEL
    delta = tl.load(DELTA + pid_bh.to(tl.int64) * N_Q + offs_m, mask=row_ok, other=0.0)
    k_base = K + b * stride_kb + h_kv * stride_kh
    v_base = V + b * stride_vb + h_kv * stride_vh
    doc_ids = DOC_IDS + b * stride_doc_b
    slope2 = 0.0
    if HAS_ALIBI:
        slope2 = tl.load(ALIBI_SLOPES + h) * LOG2E_IN_KERNEL
    seed = 0
    bh = b * H + h  # the dropout stream's row of heads (int64), as the forward numbers it
    if DROPOUT:
        seed = tl.load(SEED)
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    if BLOCK_SPARSE:
        row = ((b % B_MASK) * H_MASK + h % H_MASK) * tl.num_programs(0) + pid_m
        for i in range(0, tl.load(FULL_COUNTS + row)):
            start_n = tl.load(FULL_TILES + row * TILES_PER_ROW + i) * BLOCK_N
            dq = _dq_tile_b3(
                dq, q, do, lse2, seed=seed, bh=bh, dropout_p=dropout_p, DROPOUT=DROPOUT,
                delta=delta, k_base=k_base, v_base=v_base, stride_kn=stride_kn, stride_kd=stride_kd,
                stride_vn=stride_vn, stride_vd=stride_vd, start_n=start_n, b=b, h=h, offs_m=offs_m, N_Q=N_Q, N_KV=N_KV,
                qk_scale=qk_scale, UPPER=UPPER, LOWER=LOWER, SHIFT=SHIFT, doc_ids=doc_ids, softcap2=softcap2,
                slope2=slope2, MASKED=False, HAS_UPPER=HAS_UPPER, HAS_LOWER=HAS_LOWER, HAS_DOCS=HAS_DOCS,
                MASK_MOD=MASK_MOD, HAS_SOFTCAP=HAS_SOFTCAP, HAS_ALIBI=HAS_ALIBI, SCORE_MOD=SCORE_MOD, HEAD_DIM=HEAD_DIM,
                BLOCK_D=BLOCK_D, BLOCK_N=BLOCK_N, DOT_PRECISION=DOT_PRECISION)
        for i in range(0, tl.load(PARTIAL_COUNTS + row)):
            start_n = tl.load(PARTIAL_TILES + row * TILES_PER_ROW + i) * BLOCK_N
            dq = _dq_tile_b3(
                dq, q, do, lse2, seed=seed, bh=bh, dropout_p=dropout_p, DROPOUT=DROPOUT,
                delta=delta, k_base=k_base, v_base=v_base, stride_kn=stride_kn, stride_kd=stride_kd,
                stride_vn=stride_vn, stride_vd=stride_vd, start_n=start_n, b=b, h=h, offs_m=offs_m, N_Q=N_Q, N_KV=N_KV,
                qk_scale=qk_scale, UPPER=UPPER, LOWER=LOWER, SHIFT=SHIFT, doc_ids=doc_ids, softcap2=softcap2,
                slope2=slope2, MASKED=True, HAS_UPPER=HAS_UPPER, HAS_LOWER=HAS_LOWER, HAS_DOCS=HAS_DOCS,
                MASK_MOD=MASK_MOD, HAS_SOFTCAP=HAS_SOFTCAP, HAS_ALIBI=HAS_ALIBI, SCORE_MOD=SCORE_MOD, HEAD_DIM=HEAD_DIM,
                BLOCK_D=BLOCK_D, BLOCK_N=BLOCK_N, DOT_PRECISION=DOT_PRECISION)
    else:  # key tiles from the bounds, as the v7 forward
        first_row = pid_m * BLOCK_M
        lo, hi, full_lo, full_hi = key_tile_range(
            first_row, last_row=tl.minimum(first_row + BLOCK_M, N_Q) - 1, N_KV=N_KV, UPPER=UPPER, LOWER=LOWER,
            HAS_UPPER=HAS_UPPER, HAS_LOWER=HAS_LOWER, BLOCK_N=BLOCK_N)
        if HAS_LOWER:
            for start_n in range(lo, full_lo, BLOCK_N):
                dq = _dq_tile_b3(
                    dq, q, do, lse2, seed=seed, bh=bh, dropout_p=dropout_p, DROPOUT=DROPOUT,
                    delta=delta, k_base=k_base, v_base=v_base, stride_kn=stride_kn,
                    stride_kd=stride_kd, stride_vn=stride_vn, stride_vd=stride_vd, start_n=start_n, b=b, h=h,
                    offs_m=offs_m, N_Q=N_Q, N_KV=N_KV, qk_scale=qk_scale, UPPER=UPPER, LOWER=LOWER, SHIFT=SHIFT,
                    doc_ids=doc_ids, softcap2=softcap2, slope2=slope2, MASKED=True, HAS_UPPER=HAS_UPPER,
                    HAS_LOWER=HAS_LOWER, HAS_DOCS=HAS_DOCS, MASK_MOD=MASK_MOD, HAS_SOFTCAP=HAS_SOFTCAP,
                    HAS_ALIBI=HAS_ALIBI, SCORE_MOD=SCORE_MOD, HEAD_DIM=HEAD_DIM, BLOCK_D=BLOCK_D, BLOCK_N=BLOCK_N,
                    DOT_PRECISION=DOT_PRECISION)
        for start_n in range(full_lo, full_hi, BLOCK_N):
            dq = _dq_tile_b3(
                dq, q, do, lse2, seed=seed, bh=bh, dropout_p=dropout_p, DROPOUT=DROPOUT,
                delta=delta, k_base=k_base, v_base=v_base, stride_kn=stride_kn, stride_kd=stride_kd,
                stride_vn=stride_vn, stride_vd=stride_vd, start_n=start_n, b=b, h=h, offs_m=offs_m, N_Q=N_Q, N_KV=N_KV,
                qk_scale=qk_scale, UPPER=UPPER, LOWER=LOWER, SHIFT=SHIFT, doc_ids=doc_ids, softcap2=softcap2,
                slope2=slope2, MASKED=False, HAS_UPPER=HAS_UPPER, HAS_LOWER=HAS_LOWER, HAS_DOCS=HAS_DOCS,
                MASK_MOD=MASK_MOD, HAS_SOFTCAP=HAS_SOFTCAP, HAS_ALIBI=HAS_ALIBI, SCORE_MOD=SCORE_MOD, HEAD_DIM=HEAD_DIM,
                BLOCK_D=BLOCK_D, BLOCK_N=BLOCK_N, DOT_PRECISION=DOT_PRECISION)
        for start_n in range(full_hi, hi, BLOCK_N):
            dq = _dq_tile_b3(
                dq, q, do, lse2, seed=seed, bh=bh, dropout_p=dropout_p, DROPOUT=DROPOUT,
                delta=delta, k_base=k_base, v_base=v_base, stride_kn=stride_kn, stride_kd=stride_kd,
                stride_vn=stride_vn, stride_vd=stride_vd, start_n=start_n, b=b, h=h, offs_m=offs_m, N_Q=N_Q, N_KV=N_KV,
                qk_scale=qk_scale, UPPER=UPPER, LOWER=LOWER, SHIFT=SHIFT, doc_ids=doc_ids, softcap2=softcap2,
                slope2=slope2, MASKED=True, HAS_UPPER=HAS_UPPER, HAS_LOWER=HAS_LOWER, HAS_DOCS=HAS_DOCS,
                MASK_MOD=MASK_MOD, HAS_SOFTCAP=HAS_SOFTCAP, HAS_ALIBI=HAS_ALIBI, SCORE_MOD=SCORE_MOD, HEAD_DIM=HEAD_DIM,
                BLOCK_D=BLOCK_D, BLOCK_N=BLOCK_N, DOT_PRECISION=DOT_PRECISION)
    dq_ptrs = DQ + b * stride_dqb + h * stride_dqh + offs_m[:, None] * stride_dqn + offs_d[None, :] * stride_dqd
    tl.store(dq_ptrs, (dq * scale).to(DQ.dtype.element_ty), mask=row_ok[:, None] & (offs_d[None, :] < HEAD_DIM))


BACKWARD_VERSIONS: dict[str, BackwardVersion] = {
    v.name: v
    for v in sorted([
        BackwardVersion("b1", "separate dQ kernel", "Q-stationary dQ kernel after the K/V-stationary dK/dV one",
                        "7 matmuls instead of 5 (+40% FLOPs), but no atomics: about SDPA flash's speed"),
        BackwardVersion("b3", "rules", "b1's two kernels with v7's rules as compile-time switches; GQA dK/dV "
                        "summed over the group inside one program (no atomics, no expanded K/V)",
                        "dense: same as b1; window and documents: time proportional to the visible tiles; "
                        "GQA: dK/dV programs read each K/V tile once per group",
                        takes_rules=True),
        *teaching.VERSIONS,
    ], key=lambda v: v.name)
}
DEFAULT_BACKWARD = "b3"  # supports every option
DENSE_BACKWARD = "b1"  # what the default runs when the call needs none of b3's rules (faster, measured)


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


def launch_candidates(props: configs.DeviceProps, block_d: int, elem_bytes: int, rules: Rules, *,
                      grouped: bool = False
                      ) -> tuple[tuple[configs.KernelConfig, ...], tuple[configs.KernelConfig, ...]]:
    """(dK/dV, dQ) launches for these rules, best first; ``grouped``: fewer K/V heads than query heads."""
    masked = rules.causal is not None or rules.window is not None or rules.needs_block_mask
    return configs.backward_candidates(props, block_d, elem_bytes, causal=masked, grouped=grouped)


# The tensors that change from one call of a plan to the next, in the order a prepared launch takes them.
PER_CALL_TENSORS = ("Q", "K", "V", "O", "DO", "LSE", "DELTA", "DK", "DV", "DQ")


def run_backward(version: BackwardVersion, q, k, v, o, lse, do, *, causal=False, scale: float | None,
                 configs_override: tuple[configs.KernelConfig, configs.KernelConfig] | None = None,
                 rules: Rules | None = None, block_mask: blockmask.BlockMask | None = None,
                 record: list | None = None, dropout: Dropout | None = None,
                 dlse: torch.Tensor | None = None):
    """dq, dk, dv from the forward's saved (o, lse), tensors like q, k, v. ``rules`` (from
    ``rules.parse_rules``), when given, replaces ``causal``; they must be the forward's. ``block_mask``
    (checked against the call) gives b3 its tile lists instead of building them. ``record``: a list that gets
    the three launches (preprocess, dK/dV, dQ) prepared to repeat on other tensors of this layout
    (``launch.prepare_launch``, on ``PER_CALL_TENSORS``), where the compiled kernels allow it; for b1 and b3 with
    rules that hold no tensor (a plan keeps them: ``plan.py``). ``dropout``: the forward's probability and seed
    (``dropout.py``), b3 only: its kernels regenerate the forward's mask. ``dlse``: the gradient of a loss that
    used the lse, (B, H_q, N_q), or None: d lse_i / d s_ij = P_ij adds P_ij * dlse_i to dS_ij, which is the
    preprocess's delta less dlse (FlexAttention's differentiable LSE)."""
    batch, heads, n_q, head_dim = q.shape
    n_kv = k.shape[2]
    rules = causal_rules(causal) if rules is None else rules
    if dropout is not None and not version.takes_rules:
        refuse_missing("backward", version.name, DEFAULT_BACKWARD, "dropout (dropout_p)")
    if not version.takes_rules:
        refuse_missing("backward", version.name, DEFAULT_BACKWARD,
                       rules.missing_in_numbered_version(k.shape[1] != heads, n_q, n_kv))
    scale = default_scale(head_dim, scale)
    block_d = padded_head_dim(head_dim)
    props = configs.device_props(q.device)
    if configs_override is not None:
        dkdv_candidates, dq_candidates = ((configs_override[0],), (configs_override[1],))
    else:
        dkdv_candidates, dq_candidates = launch_candidates(props, block_d, q.element_size(), rules,
                                                           grouped=k.shape[1] != heads)
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
    if (version.atomic_dq or rules.alibi_slopes is not None or rules.needs_block_mask or dropout is not None
            or dlse is not None):
        record = None  # their dQ is post-processed, or a tensor of the rule would be pinned

    def launch(kernel, grid, kwargs: dict) -> None:
        compiled = kernel[grid](**kwargs)
        if record is not None:
            prepared = prepare_launch(kernel, compiled, grid, kwargs, PER_CALL_TENSORS)
            if prepared is not None:
                record.append(prepared)

    pre_block = 64
    launch(_bwd_preprocess, (triton.cdiv(n_q, pre_block), batch * heads), dict(
        O=o, DO=do, DELTA=delta, **strides(o, "o"), **strides(do, "do"), H=heads, N_Q=n_q,
        HEAD_DIM=head_dim, BLOCK_D=block_d, BLOCK_M=pre_block,
    ))
    if dlse is not None:
        delta -= dlse.to(torch.float32)
    key = (props, block_d, q.dtype, dkdv_candidates, dq_candidates)
    what = f"backward {version.name} at head dim {head_dim}"
    if version.takes_rules:
        shared = _b3_shared_args(q, k, v, do, lse, delta, rules, scale, block_d, dropout)
        launch_fitting(("dkdv b3", *key), dkdv_candidates,
                       lambda cfg: launch(*_b3_dkdv_launch(cfg, q, k, dk, dv, rules, block_mask, shared)),
                       f"{what}, dK/dV kernel")
        launch_fitting(("dq b3", *key), dq_candidates,
                       lambda cfg: launch(*_b3_dq_launch(cfg, q, k, dq_acc, rules, block_mask, shared)),
                       f"{what}, dQ kernel")
        return dq_acc, dk, dv
    dq_mode = version.dq_mode
    if dq_mode == DQ_TMA.value:  # needs Hopper's TMA; the interpreter (Triton 3.9) has no reduce-add either
        if configs.supports_tensor_descriptors(props):
            triton.set_allocator(tma_scratch(q.device))  # the scratch where the kernel builds its descriptor
        else:
            dq_mode = DQ_RELAXED.value

    def launch_dkdv(cfg: configs.KernelConfig) -> None:
        check_backward_launch(cfg, dq_candidates[0], causal=rules.causal is not None)  # b1/b2 split at tile edges
        launch(_bwd_dkdv_kernel, (triton.cdiv(n_kv, cfg.block_n), batch * heads), dict(
            Q=q, K=k, V=v, DO=do, DK=dk, DV=dv, DQ=dq_acc, LSE=lse, DELTA=delta, scale=scale,
            qk_scale=scale * LOG2E, **strides(q, "q"), **strides(k, "k"), **strides(v, "v"), **strides(do, "do"),
            **strides(dk, "dk"), **strides(dv, "dv"), **strides(dq_acc, "dq"),
            H=heads, N_Q=n_q, N_KV=n_kv,
            CAUSAL=rules.causal is not None, DQ_MODE=dq_mode, HEAD_DIM=head_dim, BLOCK_D=block_d,
            BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, DOT_PRECISION=precision,
            num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        ))

    def launch_dq(cfg: configs.KernelConfig) -> None:
        check_backward_launch(dkdv_candidates[0], cfg, causal=rules.causal is not None)
        launch(_bwd_dq_kernel, (triton.cdiv(n_q, cfg.block_m), batch * heads), dict(
            Q=q, K=k, V=v, DO=do, DQ=dq_acc, LSE=lse, DELTA=delta, scale=scale, qk_scale=scale * LOG2E,
            **strides(q, "q"), **strides(k, "k"), **strides(v, "v"), **strides(do, "do"), **strides(dq_acc, "dq"),
            H=heads, N_Q=n_q, N_KV=n_kv,
            CAUSAL=rules.causal is not None, HEAD_DIM=head_dim, BLOCK_D=block_d,
            BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, DOT_PRECISION=precision,
            num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        ))

    launch_fitting((f"dkdv {version.name}", *key), dkdv_candidates, launch_dkdv, f"{what}, dK/dV kernel")
    if version.atomic_dq:
        return (dq_acc * scale).to(q.dtype), dk, dv
    launch_fitting((f"dq {version.name}", *key), dq_candidates, launch_dq, f"{what}, dQ kernel")
    return dq_acc, dk, dv


def _b3_shared_args(q, k, v, do, lse, delta, rules: Rules, scale: float, block_d: int,
                    dropout: Dropout | None) -> dict:
    """The arguments both b3 kernels take: inputs, softmax statistics, the rule, dropout, the head dim."""
    return dict(Q=q, K=k, V=v, DO=do, LSE=lse, DELTA=delta, scale=scale, qk_scale=scale * LOG2E,
                **strides(q, "q"), **strides(k, "k"), **strides(v, "v"), **strides(do, "do"),
                GROUP=q.shape[1] // k.shape[1], N_Q=q.shape[2], N_KV=k.shape[2], **blockmask.rule_args(rules, q, k),
                **dropout_args(dropout, q),
                HEAD_DIM=q.shape[3], BLOCK_D=block_d, DOT_PRECISION=dot_precision(q.dtype))


def _b3_dkdv_launch(cfg: configs.KernelConfig, q, k, dk, dv, rules: Rules, block_mask, shared: dict) -> tuple:
    """b3's dK/dV as (kernel, grid, arguments): one program per (key tile, K/V head), over the group's query heads
    (no atomics)."""
    batch, h_kv, n_kv = k.shape[0], k.shape[1], k.shape[2]
    return _bwd_dkdv_b3_kernel, (triton.cdiv(n_kv, cfg.block_n), batch * h_kv), dict(
        DK=dk, DV=dv, **strides(dk, "dk"), **strides(dv, "dv"), H_KV=h_kv, **shared,
        **blockmask.call_lists(rules, block_mask, q, k, cfg.block_m, cfg.block_n, by_key=True),
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )


def _b3_dq_launch(cfg: configs.KernelConfig, q, k, dq, rules: Rules, block_mask, shared: dict) -> tuple:
    """b3's dQ as (kernel, grid, arguments): one program per (query tile, query head)."""
    batch, heads, n_q = q.shape[0], q.shape[1], q.shape[2]
    return _bwd_dq_b3_kernel, (triton.cdiv(n_q, cfg.block_m), batch * heads), dict(
        DQ=dq, **strides(dq, "dq"), H=heads, **shared,
        **blockmask.call_lists(rules, block_mask, q, k, cfg.block_m, cfg.block_n, by_key=False),
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
