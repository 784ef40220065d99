"""The forward versions that only teach: v1-v6, the steps lesson 07 takes from lesson 03's loop to v7.

No call of the public API runs them (it runs v7, ``forward.py``); they stay runnable by name through
``forward.FORWARD_VERSIONS`` and ``forward.run_forward`` so that the lesson and the benchmarks can measure each
step. Each version is a kernel of its own name, whose docstring says what it changes in the one before; v4 is
only a launch configuration:
- v1  ``_fwd_v1_kernel``: the plain loop of lesson 03. One program per (query tile, batch*head); online softmax
      with ``exp``; the scale multiplied into every score; every key tile masked (bounds and causal); tiles wholly
      right of the diagonal skipped by the loop bound.
- v2  ``_fwd_v2_kernel``: ``exp2`` with the scale and log2(e) folded into one multiply,
      ``exp(x*s) = exp2(x * s*log2(e))``, so a score costs one FMA and one MUFU.EX2. The update becomes the
      shared helper ``common.online_softmax_update``.
- v3  ``_fwd_v3_kernel``: causal split. The key tiles left of the diagonal (every key visible) run a loop with
      no mask at all; only the diagonal and tail tiles pay for the masks. Both loops are one helper,
      ``_attend_tiles``, with ``MASKED`` a compile-time constant (as Triton's tutorial 06 runs its two loop stages
      through ``_attn_fwd_inner(..., STAGE)``); ``_causal_split`` says where one ends and the other starts. What a
      program does for its query tile is ``_fwd_v3_program``; the kernel only says which tile that is.
- v4  v3's kernel under a launch configuration chosen for the device (``configs.forward_config``) instead of the
      textbook 64x64 / 4 warps / 2 stages.
- v5  ``_fwd_v5_kernel``: v3 with the causal query tiles launched heaviest first (bottom rows see the most keys),
      so the last wave is made of short programs instead of long ones. Two lines that reverse the tile index,
      then v3's program.
- v6  ``_fwd_v6_kernel``: v5 with Q, K, V moved through tensor descriptors (Hopper's Tensor Memory Accelerator,
      TMA) instead of pointer tiles; GPUs without TMA run v5 (Triton's interpreter emulates descriptors, so on a
      CPU v6 runs).

Shapes: q (B, H, N_q, D), k and v (B, H, N_kv, D), any strides; o like q; lse (B, H, N_q) float32, natural log.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..common import MASKED_FILL, NO_KEY_YET, load_tile, normalise_rows, online_softmax_update, store_output
from ..versions import ForwardVersion


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
    """v1: lesson 03's loop as a kernel. Program (i, bh) computes query tile i of (batch, head) bh."""
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = (pid_bh // H).to(tl.int64)  # int64: b * stride can pass 2**31 on large batches
    h = (pid_bh % H).to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)

    q_ptrs = Q + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qn + offs_d[None, :] * stride_qd
    q = load_tile(q_ptrs, offs_m, N_Q, offs_d, HEAD_DIM, BLOCK_D, CHECK_ROWS=True)  # (BLOCK_M, BLOCK_D)
    k_base = K + b * stride_kb + h * stride_kh
    v_base = V + b * stride_vb + h * stride_vh

    # Running row max of the scores, from -1e30 and not -inf: exp(m_old - m_new) is then never -inf - (-inf) = NaN.
    # The price: a row whose scores all lie below -1e30 is taken for a row with no key (lesson 07 shows it).
    m_i = tl.full([BLOCK_M], MASKED_FILL, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)  # running row sum of exp(score - m_i)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)  # running unnormalised output

    hi = N_KV
    if CAUSAL:  # key tiles that start right of the tile's last query are all masked: skip them
        hi = tl.minimum(N_KV, (pid_m + 1) * BLOCK_M)
    for start_n in range(0, hi, BLOCK_N):
        cols = start_n + offs_n
        k = load_tile(k_base + cols[:, None] * stride_kn + offs_d[None, :] * stride_kd,
                      cols, N_KV, offs_d, HEAD_DIM, BLOCK_D, CHECK_ROWS=True)  # (BLOCK_N, BLOCK_D)
        v = load_tile(v_base + cols[:, None] * stride_vn + offs_d[None, :] * stride_vd,
                      cols, N_KV, offs_d, HEAD_DIM, BLOCK_D, CHECK_ROWS=True)
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

    # Normalise once, at the end; a row that saw no key (l = 0) gets o = 0 and lse = -inf, never NaN.
    empty = l_i == 0.0
    l_safe = tl.where(empty, 1.0, l_i)
    lse = tl.where(empty, float("-inf"), m_i + tl.log(l_safe))
    store_output(
        O, LSE, o=acc / l_safe[:, None], lse=lse, pid_bh=pid_bh, offs_m=offs_m, offs_d=offs_d,
        o_base=b * stride_ob + h * stride_oh, stride_on=stride_on, stride_od=stride_od, N_Q=N_Q, HEAD_DIM=HEAD_DIM)


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
    """v2 = v1 + exp2: the scale and log2(e) folded into qk_scale, the update in ``online_softmax_update``."""
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = (pid_bh // H).to(tl.int64)  # int64: b * stride can pass 2**31 on large batches
    h = (pid_bh % H).to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)

    q_ptrs = Q + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qn + offs_d[None, :] * stride_qd
    q = load_tile(q_ptrs, offs_m, N_Q, offs_d, HEAD_DIM, BLOCK_D, CHECK_ROWS=True)  # (BLOCK_M, BLOCK_D)
    k_base = K + b * stride_kb + h * stride_kh
    v_base = V + b * stride_vb + h * stride_vh

    # Running row max, in base 2, from -inf: the shared update subtracts 0 while a row has seen no key, so no finite
    # score is taken for "no key" (v1's -1e30 is: lesson 07 shows where)
    m_i = tl.full([BLOCK_M], NO_KEY_YET, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    hi = N_KV
    if CAUSAL:  # key tiles that start right of the tile's last query are all masked: skip them
        hi = tl.minimum(N_KV, (pid_m + 1) * BLOCK_M)
    for start_n in range(0, hi, BLOCK_N):
        cols = start_n + offs_n
        k = load_tile(k_base + cols[:, None] * stride_kn + offs_d[None, :] * stride_kd,
                      cols, N_KV, offs_d, HEAD_DIM, BLOCK_D, CHECK_ROWS=True)  # (BLOCK_N, BLOCK_D)
        v = load_tile(v_base + cols[:, None] * stride_vn + offs_d[None, :] * stride_vd,
                      cols, N_KV, offs_d, HEAD_DIM, BLOCK_D, CHECK_ROWS=True)
        qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)  # (BLOCK_M, BLOCK_N), unscaled
        valid = cols[None, :] < N_KV
        if CAUSAL:
            valid = valid & (cols[None, :] <= offs_m[:, None])
        qk = tl.where(valid, qk, float("-inf"))
        acc, l_i, m_i = online_softmax_update(acc, l_i, m_i, qk, v, qk_scale, DOT_PRECISION)

    o, lse = normalise_rows(acc, l_i, m_i)
    store_output(
        O, LSE, o, lse, pid_bh=pid_bh, offs_m=offs_m, offs_d=offs_d, o_base=b * stride_ob + h * stride_oh,
        stride_on=stride_on, stride_od=stride_od, N_Q=N_Q, HEAD_DIM=HEAD_DIM)


# ------------------------------------------------------------------------------------------ v3 (and v4)
@triton.jit
def _attend_tiles(acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd,
                  offs_m, lo, hi, N_KV, qk_scale,
                  MASKED: tl.constexpr, CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                  BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Online softmax over key tiles [lo, hi). MASKED=False: every key is in range and visible (no mask code)."""
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + offs_n
        k = load_tile(k_base + cols[:, None] * stride_kn + offs_d[None, :] * stride_kd,
                      cols, N_KV, offs_d, HEAD_DIM, BLOCK_D, MASKED)  # (BLOCK_N, BLOCK_D)
        v = load_tile(v_base + cols[:, None] * stride_vn + offs_d[None, :] * stride_vd,
                      cols, N_KV, offs_d, HEAD_DIM, BLOCK_D, MASKED)
        qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)  # (BLOCK_M, BLOCK_N)
        if MASKED:
            valid = cols[None, :] < N_KV
            if CAUSAL:
                valid = valid & (cols[None, :] <= offs_m[:, None])
            qk = tl.where(valid, qk, float("-inf"))
        acc, l_i, m_i = online_softmax_update(acc, l_i, m_i, qk, v, qk_scale, DOT_PRECISION)
    return acc, l_i, m_i


@triton.jit
def _causal_split(pid_m, N_KV, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Where v3-v6 cut query tile pid_m's keys: [0, full_end) are whole tiles every row of the tile sees (no mask),
    [full_end, masked_end) the diagonal tiles (causal) and the tail tile past the last whole one (masked)."""
    full_end = (N_KV // BLOCK_N) * BLOCK_N
    masked_end = N_KV
    if CAUSAL:
        full_end = tl.minimum(full_end, pid_m * BLOCK_M)  # a multiple of BLOCK_N: BLOCK_M % BLOCK_N == 0
        masked_end = tl.minimum(N_KV, (pid_m + 1) * BLOCK_M)
    return full_end, masked_end


@triton.jit
def _fwd_v3_program(
    pid_m,
    Q, K, V, O, LSE, qk_scale,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_on, stride_od,
    H, N_Q, N_KV,
    CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    """What one program of v3 (and of v5) does: query tile pid_m of the (batch, head) program_id(1), its keys in
    two loops through ``_attend_tiles``, unmasked then masked. The kernels choose pid_m."""
    pid_bh = tl.program_id(1)
    b = (pid_bh // H).to(tl.int64)  # int64: b * stride can pass 2**31 on large batches
    h = (pid_bh % H).to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)

    q_ptrs = Q + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qn + offs_d[None, :] * stride_qd
    q = load_tile(q_ptrs, offs_m, N_Q, offs_d, HEAD_DIM, BLOCK_D, CHECK_ROWS=True)  # (BLOCK_M, BLOCK_D)
    k_base = K + b * stride_kb + h * stride_kh
    v_base = V + b * stride_vb + h * stride_vh

    m_i = tl.full([BLOCK_M], NO_KEY_YET, dtype=tl.float32)  # running row max, in base 2, from -inf as v2
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    full_end, masked_end = _causal_split(pid_m, N_KV, CAUSAL=CAUSAL, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N)
    acc, l_i, m_i = _attend_tiles(
        acc, l_i, m_i, q, k_base=k_base, v_base=v_base, stride_kn=stride_kn, stride_kd=stride_kd, stride_vn=stride_vn,
        stride_vd=stride_vd, offs_m=offs_m, lo=0, hi=full_end, N_KV=N_KV, qk_scale=qk_scale, MASKED=False,
        CAUSAL=CAUSAL, HEAD_DIM=HEAD_DIM, BLOCK_D=BLOCK_D, BLOCK_N=BLOCK_N, DOT_PRECISION=DOT_PRECISION)
    acc, l_i, m_i = _attend_tiles(
        acc, l_i, m_i, q, k_base=k_base, v_base=v_base, stride_kn=stride_kn, stride_kd=stride_kd, stride_vn=stride_vn,
        stride_vd=stride_vd, offs_m=offs_m, lo=full_end, hi=masked_end, N_KV=N_KV, qk_scale=qk_scale, MASKED=True,
        CAUSAL=CAUSAL, HEAD_DIM=HEAD_DIM, BLOCK_D=BLOCK_D, BLOCK_N=BLOCK_N, DOT_PRECISION=DOT_PRECISION)

    o, lse = normalise_rows(acc, l_i, m_i)
    store_output(
        O, LSE, o, lse, pid_bh=pid_bh, offs_m=offs_m, offs_d=offs_d, o_base=b * stride_ob + h * stride_oh,
        stride_on=stride_on, stride_od=stride_od, N_Q=N_Q, HEAD_DIM=HEAD_DIM)


@triton.jit
def _fwd_v3_kernel(
    Q, K, V, O, LSE, qk_scale,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_on, stride_od,
    H, N_Q, N_KV,
    CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    """v3 = v2 + the causal split: the key tiles every row sees run a loop with no mask code; only the
    diagonal and tail tiles are masked. Program i takes query tile i (``_fwd_v3_program``)."""
    pid_m = tl.program_id(0)
    _fwd_v3_program(
        pid_m, Q=Q, K=K, V=V, O=O, LSE=LSE, qk_scale=qk_scale,
        stride_qb=stride_qb, stride_qh=stride_qh, stride_qn=stride_qn, stride_qd=stride_qd,
        stride_kb=stride_kb, stride_kh=stride_kh, stride_kn=stride_kn, stride_kd=stride_kd,
        stride_vb=stride_vb, stride_vh=stride_vh, stride_vn=stride_vn, stride_vd=stride_vd,
        stride_ob=stride_ob, stride_oh=stride_oh, stride_on=stride_on, stride_od=stride_od,
        H=H, N_Q=N_Q, N_KV=N_KV, CAUSAL=CAUSAL, HEAD_DIM=HEAD_DIM, BLOCK_D=BLOCK_D, BLOCK_M=BLOCK_M,
        BLOCK_N=BLOCK_N, DOT_PRECISION=DOT_PRECISION)


# ------------------------------------------------------------------------------------------ v5
@triton.jit
def _fwd_v5_kernel(
    Q, K, V, O, LSE, qk_scale,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_on, stride_od,
    H, N_Q, N_KV,
    CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    """v5 = v3 + heavy tiles first: under causal, program i takes query tile (tiles - 1 - i), so the bottom
    tiles, which see the most keys, start first. The program itself is v3's."""
    pid_m = tl.program_id(0)
    if CAUSAL:  # the bottom query tiles see the most keys: start them first
        pid_m = tl.num_programs(0) - 1 - pid_m
    _fwd_v3_program(
        pid_m, Q=Q, K=K, V=V, O=O, LSE=LSE, qk_scale=qk_scale,
        stride_qb=stride_qb, stride_qh=stride_qh, stride_qn=stride_qn, stride_qd=stride_qd,
        stride_kb=stride_kb, stride_kh=stride_kh, stride_kn=stride_kn, stride_kd=stride_kd,
        stride_vb=stride_vb, stride_vh=stride_vh, stride_vn=stride_vn, stride_vd=stride_vd,
        stride_ob=stride_ob, stride_oh=stride_oh, stride_on=stride_on, stride_od=stride_od,
        H=H, N_Q=N_Q, N_KV=N_KV, CAUSAL=CAUSAL, HEAD_DIM=HEAD_DIM, BLOCK_D=BLOCK_D, BLOCK_M=BLOCK_M,
        BLOCK_N=BLOCK_N, DOT_PRECISION=DOT_PRECISION)


# ------------------------------------------------------------------------------------------ v6 (Hopper)
@triton.jit
def _attend_tiles_desc(acc, l_i, m_i, q, k_desc, v_desc, offs_m, lo, hi, N_KV, qk_scale,
                       MASKED: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_N: tl.constexpr,
                       DOT_PRECISION: tl.constexpr):
    """As _attend_tiles, with K and V read through tensor descriptors (rows past N_KV come back as 0)."""
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
        acc, l_i, m_i = online_softmax_update(acc, l_i, m_i, qk, v, qk_scale, DOT_PRECISION)
    return acc, l_i, m_i


@triton.jit
def _fwd_v6_kernel(
    Q, K, V, O, LSE, qk_scale,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_on, stride_od,
    H, N_Q, N_KV,
    CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    """v6 = v5 + tensor descriptors: Q, K and V tiles come in by TMA (``_attend_tiles_desc`` for the keys), the
    descriptors' bounds doing the row masks of the loads."""
    pid_m = tl.program_id(0)
    if CAUSAL:  # heaviest query tiles first, as v5
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

    m_i = tl.full([BLOCK_M], NO_KEY_YET, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    full_end, masked_end = _causal_split(pid_m, N_KV, CAUSAL=CAUSAL, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N)
    acc, l_i, m_i = _attend_tiles_desc(
        acc, l_i, m_i, q, k_desc=k_desc, v_desc=v_desc, offs_m=offs_m, lo=0, hi=full_end, N_KV=N_KV, qk_scale=qk_scale,
        MASKED=False, CAUSAL=CAUSAL, BLOCK_N=BLOCK_N, DOT_PRECISION=DOT_PRECISION)
    acc, l_i, m_i = _attend_tiles_desc(
        acc, l_i, m_i, q, k_desc=k_desc, v_desc=v_desc, offs_m=offs_m, lo=full_end, hi=masked_end, N_KV=N_KV,
        qk_scale=qk_scale, MASKED=True, CAUSAL=CAUSAL, BLOCK_N=BLOCK_N, DOT_PRECISION=DOT_PRECISION)

    o, lse = normalise_rows(acc, l_i, m_i)
    store_output(
        O, LSE, o, lse, pid_bh=pid_bh, offs_m=offs_m, offs_d=offs_d, o_base=b * stride_ob + h * stride_oh,
        stride_on=stride_on, stride_od=stride_od, N_Q=N_Q, HEAD_DIM=HEAD_DIM)


# The registry entries of v1-v6, in order; ``forward.FORWARD_VERSIONS`` adds v7.
VERSIONS: tuple[ForwardVersion, ...] = (
    ForwardVersion("v1", "plain loop", "lesson 03's loop: exp, scale on every score, every tile masked",
                   "about the textbook kernel (381 TFLOP/s at D=128, N=16K on the H200)",
                   _fwd_v1_kernel, tuned_launch=False, base2=False, splits_causal_keys=False),
    ForwardVersion("v2", "exp2, scale folded", "exp2(qk * scale*log2e - m): one FMA + one EX2 per score",
                   "+5-10%: the softmax issue slots shrink, the two matmuls are unchanged",
                   _fwd_v2_kernel, tuned_launch=False, base2=True, splits_causal_keys=False),
    ForwardVersion("v3", "causal split", "off-diagonal tiles loop with no masks; only diagonal/tail masked",
                   "non-causal +0-5% (no bounds mask), causal +10-15% (mask only on 1 of N/64 tiles)",
                   _fwd_v3_kernel, tuned_launch=False, base2=True, splits_causal_keys=True),
    ForwardVersion("v4", "tuned launch (a launch configuration of v3's kernel)",
                   "tiles/warps/stages from configs.forward_config (128-row tiles; causal D=128 on sm_90: 64x64)",
                   "+30-50% on sm_90: 128x128 tiles halve K/V re-reads and fill the warpgroup MMA",
                   _fwd_v3_kernel, tuned_launch=True, base2=True, splits_causal_keys=True),
    ForwardVersion("v5", "heavy tiles first", "causal: launch bottom query tiles (most keys) first",
                   "causal +3-8% (shorter tail wave), non-causal unchanged",
                   _fwd_v5_kernel, tuned_launch=True, base2=True, splits_causal_keys=True),
    ForwardVersion("v6", "tensor descriptors", "Hopper: TMA loads of Q/K/V tiles via tensor descriptors",
                   "+5-15% on sm_90: copies leave the warps' issue slots; falls back to v5 elsewhere",
                   _fwd_v6_kernel, tuned_launch=True, base2=True, splits_causal_keys=True,
                   needs_descriptors=True),
)
