"""What the non-matmul work of the forward costs, measured rather than guessed (lesson 09).

The v6 kernel is timed as it ships (v7, the default since, compiles to v6's loops when no variant is asked for),
then an ablated copy of it with the rescaling by exp(m_old - m_new) removed, then with the exponentials removed
too. Both ablated variants compute the WRONG answer on purpose: they
exist only to be timed, so they live here, beside the benchmark, and never in ``kernels``. The time they save is
what the online softmax's rescaling, and the whole softmax, cost inside the kernel.
"""

from __future__ import annotations

from functools import partial

import torch
import triton
import triton.language as tl

from flashcourse import kernels  # sets up the device (or the interpreter) before the kernel below is defined
from flashcourse.bench import tflops
from flashcourse.bench.attention import Shape, bench_ms, make_inputs
from flashcourse.kernels import configs
from flashcourse.kernels._checks import check_qkv, dot_precision, padded_head_dim
from flashcourse.kernels.common import (
    LOG2E,
    MASKED_FILL,
    default_scale,
    normalise_rows,
    store_output,
    strides,
    tma_scratch,
)
from flashcourse.kernels.forward import descriptors_usable

VARIANTS = {0: "v6 (exact)", 1: "no rescaling (wrong on purpose)", 2: "no softmax at all (wrong on purpose)"}
SHAPES = [Shape("float16", 4, 32, 64, 8192, False), Shape("float16", 4, 16, 128, 8192, False),
          Shape("float16", 4, 16, 128, 8192, True)]


@triton.jit
def _ablated_tiles(acc, l_i, m_i, q, k_desc, v_desc, offs_m, lo, hi, N_KV, qk_scale,
                   MASKED: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_N: tl.constexpr,
                   DOT_PRECISION: tl.constexpr, ABLATE: tl.constexpr):
    """v6's key loop with part of the softmax left out. ABLATE 1: no rescale by alpha; 2: no exponentials."""
    offs_n = tl.arange(0, BLOCK_N)
    for start_n in range(lo, hi, BLOCK_N):
        k = k_desc.load([start_n, 0])
        v = v_desc.load([start_n, 0])
        qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
        if MASKED:
            cols = start_n + offs_n
            valid = cols[None, :] < N_KV
            if CAUSAL:
                valid = valid & (cols[None, :] <= offs_m[:, None])
            qk = tl.where(valid, qk, float("-inf"))
        if ABLATE == 1:
            m_i = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
            p = tl.exp2(qk * qk_scale - m_i[:, None])
        else:
            p = qk * qk_scale
        l_i = l_i + tl.sum(p, 1)
        acc = acc + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
    return acc, l_i, m_i


@triton.jit
def _ablated_forward_kernel(
    Q, K, V, O, LSE, qk_scale,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_on, stride_od,
    H, N_Q, N_KV,
    CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr, ABLATE: tl.constexpr,
):
    # The v6 kernel (kernels/teaching/forward.py) line for line, except that the loop is _ablated_tiles.
    pid_m = tl.program_id(0)
    if CAUSAL:
        pid_m = tl.num_programs(0) - 1 - pid_m
    pid_bh = tl.program_id(1)
    b = (pid_bh // H).to(tl.int64)
    h = (pid_bh % H).to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
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
    acc, l_i, m_i = _ablated_tiles(
        acc, l_i, m_i, q, k_desc=k_desc, v_desc=v_desc, offs_m=offs_m, lo=0, hi=full_end, N_KV=N_KV, qk_scale=qk_scale,
        MASKED=False, CAUSAL=CAUSAL, BLOCK_N=BLOCK_N, DOT_PRECISION=DOT_PRECISION, ABLATE=ABLATE)
    acc, l_i, m_i = _ablated_tiles(
        acc, l_i, m_i, q, k_desc=k_desc, v_desc=v_desc, offs_m=offs_m, lo=full_end, hi=masked_end, N_KV=N_KV,
        qk_scale=qk_scale, MASKED=True, CAUSAL=CAUSAL, BLOCK_N=BLOCK_N, DOT_PRECISION=DOT_PRECISION, ABLATE=ABLATE)
    o, lse = normalise_rows(acc, l_i, m_i)
    store_output(
        O, LSE, o, lse, pid_bh=pid_bh, offs_m=offs_m, offs_d=offs_d, o_base=b * stride_ob + h * stride_oh,
        stride_on=stride_on, stride_od=stride_od, N_Q=N_Q, HEAD_DIM=HEAD_DIM)


def ablated_forward(q, k, v, *, causal: bool, ablate: int):
    """The forward with part of its softmax removed (``ablate`` 1 or 2; see the module docstring): WRONG output,
    for timing only. Launched exactly as v6 is (same tuned configuration, tensor descriptors)."""
    if ablate not in (1, 2):
        raise ValueError(f"ablate must be 1 (no rescaling) or 2 (no softmax), got {ablate!r}")
    check_qkv(q, k, v)  # the input checks of the real call
    props = configs.device_props(q.device)
    if not descriptors_usable(props, q, k, v):
        raise ValueError("the ablated kernels use tensor descriptors: they need a Hopper GPU or the interpreter")
    triton.set_allocator(tma_scratch(q.device))
    batch, heads, n_q, head_dim = q.shape
    block_d = padded_head_dim(head_dim)
    config = configs.forward_config(props, block_d, q.element_size(), causal=causal)
    o = torch.empty_like(q)
    lse = torch.empty((batch, heads, n_q), device=q.device, dtype=torch.float32)
    _ablated_forward_kernel[(triton.cdiv(n_q, config.block_m), batch * heads)](
        Q=q, K=k, V=v, O=o, LSE=lse, qk_scale=default_scale(head_dim, None) * LOG2E,
        **strides(q, "q"), **strides(k, "k"), **strides(v, "v"), **strides(o, "o"),
        H=heads, N_Q=n_q, N_KV=k.shape[2],
        CAUSAL=causal, HEAD_DIM=head_dim, BLOCK_D=block_d, BLOCK_M=config.block_m, BLOCK_N=config.block_n,
        DOT_PRECISION=dot_precision(q.dtype), ABLATE=ablate,
        num_warps=config.num_warps, num_stages=config.num_stages,
    )
    return o


def run(shapes=SHAPES, log=print) -> list[dict]:
    """One row per (shape, variant): ms, TFLOP/s (counting only the two matmuls) and the time saved."""
    rows = []
    for shape in shapes:
        q, k, v, _ = make_inputs(shape, requires_grad=False)
        exact_ms = None
        for ablate, label in VARIANTS.items():
            if ablate == 0:
                call = partial(kernels.flash_attention_forward, q, k, v, causal=shape.causal, version="v6")
            else:
                call = partial(ablated_forward, q, k, v, causal=shape.causal, ablate=ablate)
            ms = bench_ms(call)
            exact_ms = ms if ablate == 0 else exact_ms
            row = {**shape.__dict__, "variant": label, "ablate": ablate, "ms": ms,
                   "tflops": tflops(shape.flops("fwd"), ms * 1e-3), "saved_fraction": 1.0 - ms / exact_ms}
            rows.append(row)
            log(f"{shape}  {label:38s} {ms:7.3f} ms  {row['tflops']:6.1f} TFLOP/s  saved {row['saved_fraction']:+.1%}")
        torch.cuda.empty_cache()
    return rows
