"""FP8 forward: FlashAttention on ``float8_e4m3fn`` q, k, v (Hopper and newer), with per-(batch, KV head) descales.

Why: Hopper's tensor cores multiply FP8 at twice the 16-bit rate (H100/H200 SXM data sheet: 1979 against 989 dense
TFLOP/s). The interface is the FlashAttention library's: q, k, v arrive quantised, and the true tensors are
``fp8_value * descale`` with one float32 descale per (batch, KV head), shape (B, H_kv); q's descale of KV head g
applies to the query heads of g's group. What changes against the 16-bit forward (v7):

- **descales**: q's and k's are folded into the exponent's scale once per program, ``qk_scale * q_descale *
  k_descale``, so the loop is unchanged; v's multiplies the output once, at the end.
- **P is quantised** to e4m3 before ``P @ V`` (both operands of an FP8 product must be FP8). p is in [0, 1], and
  e4m3 keeps 3 mantissa bits for normal numbers from 2^-6 up to 448 but flushes what is below 2^-9 to zero. So
  the kernel computes ``p * 2^P_SHIFT`` (P_SHIFT = 8, so the row's largest p, 1, becomes 256, exactly
  representable and below 448) by subtracting P_SHIFT from the running max in the exponent: free, and exact
  because it is a power of two. Every p down to 2^-14 then keeps its 3 bits (relative error <= 2^-4) and only
  p < 2^-18 vanishes, where unscaled e4m3 would lose precision below 2^-6 and flush everything below 2^-10: with
  thousands of keys per row most weights are that small. The running sum ``l`` is taken from the same scaled
  p in float32, so the factor cancels in ``acc / l``; the lse takes P_SHIFT back off.
- **V's layout**: Hopper's FP8 ``wgmma`` reads its B operand only K-major, and in ``P @ V`` the reduction (K) dim
  is the keys, so V must be stored with consecutive keys adjacent: (B, H, D, N) storage. The wrapper copies V
  into that layout once per call (its cost is part of every measured time); a caller that keeps V that way
  (:func:`v_keys_contiguous`) skips the copy. ``transpose_v=False`` reads V as given (the compiler must then
  rearrange it; a fallback in case the first layout does not compile).

Numerics, in float64 (:func:`reference_forward`): scores from FP8 values are exact products summed in the
tensor core's accumulator; the error comes from P's rounding (<= 2^-4 of each weight) and the output dtype.
:func:`quantize_fp8` makes the inputs, optionally with incoherent processing (FlashAttention-3, Shah et al. 2024,
section 3.3): q and k multiplied by one random orthogonal matrix (a Hadamard matrix with random signs), which
leaves q k^T unchanged but spreads outlier channels over every channel, so their products round better.

Without an FP8-capable GPU (compute capability 9.0 or newer) the call raises; the Triton interpreter on a CPU is
not one. The launch itself (:func:`run_fp8_forward`) is dtype-agnostic, so the tests run its index, mask and
descale logic in the interpreter with 16-bit values.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from . import configs
from ._checks import check_device, check_head_span, check_scale, padded_head_dim
from .common import (
    LEAST_SCORE_FACTOR,
    LOG2E,
    NO_KEY_YET,
    default_scale,
    key_tile_range,
    load_tile,
    normalise_rows,
    store_output,
    strides,
    tma_scratch,
)
from .forward import descriptors_usable
from .rules import Rules, parse_rules

FP8 = torch.float8_e4m3fn
E4M3_MAX = 448.0  # the largest finite e4m3fn value
P_SHIFT = 8  # P is quantised as p * 2^P_SHIFT: the row max 1 -> 256 (< 448), p >= 2^-14 stays a normal number
FP8_HEAD_DIMS = (64, 128)
OUT_DTYPES = (torch.bfloat16, torch.float16)
MIN_CAPABILITY = (9, 0)

__all__ = [
    "E4M3_MAX",
    "FP8",
    "Fp8QKV",
    "dequantize",
    "error_bound",
    "flash_attention_forward_fp8",
    "fp8_forward_config",
    "quantize_fp8",
    "quantize_tensor",
    "random_rotation",
    "reference_forward",
    "run_fp8_forward",
    "v_keys_contiguous",
]


# ------------------------------------------------------------------------------------------ kernel
@triton.jit
def _fp8_attend_tile(acc, l_i, m_i, q, k_src, v_src, start_n, offs_m, stride_kn, stride_kd, stride_vn, stride_vd,
                     N_KV, qk_scale, UPPER,
                     MASKED: tl.constexpr, HAS_UPPER: tl.constexpr, USE_DESC: tl.constexpr,
                     V_TRANSPOSED: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                     BLOCK_N: tl.constexpr, P_SHIFT: tl.constexpr):
    """Key tile [start_n, start_n + BLOCK_N) of the online softmax, in base 2, with p scaled by 2^P_SHIFT before
    it is cast to V's dtype. MASKED=False: every key of the tile is in range and visible (no mask code)."""
    cols = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    if USE_DESC:  # tensor descriptors: rows past the end come back as 0
        k = k_src.load([start_n, 0])  # (BLOCK_N, BLOCK_D)
        if V_TRANSPOSED:
            v = tl.trans(v_src.load([0, start_n]))  # stored (D, N): keys adjacent, K-major for P @ V
        else:
            v = v_src.load([start_n, 0])
    else:
        k = load_tile(k_src + cols[:, None] * stride_kn + offs_d[None, :] * stride_kd,
                      cols, N_KV, offs_d, HEAD_DIM, BLOCK_D, MASKED)
        if V_TRANSPOSED:
            vt_ptrs = v_src + offs_d[:, None] * stride_vd + cols[None, :] * stride_vn  # (BLOCK_D, BLOCK_N)
            if MASKED:
                vt = tl.load(vt_ptrs, mask=(offs_d[:, None] < HEAD_DIM) & (cols[None, :] < N_KV), other=0.0)
            elif HEAD_DIM == BLOCK_D:
                vt = tl.load(vt_ptrs)
            else:
                vt = tl.load(vt_ptrs, mask=offs_d[:, None] < HEAD_DIM, other=0.0)
            v = tl.trans(vt)
        else:
            v = load_tile(v_src + cols[:, None] * stride_vn + offs_d[None, :] * stride_vd,
                          cols, N_KV, offs_d, HEAD_DIM, BLOCK_D, MASKED)
    qk = tl.dot(q, tl.trans(k))  # (BLOCK_M, BLOCK_N) float32, unscaled
    if MASKED:
        ok = cols[None, :] < N_KV
        if HAS_UPPER:
            ok = ok & (cols[None, :] <= offs_m[:, None] + UPPER)
        qk = tl.where(ok, qk, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)  # qk_scale > 0: the kernel moved a descale's sign to q
    # A row with no visible key yet keeps m = -inf; it subtracts 0, so exp2(-inf - 0) = 0 and not NaN.
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp2(qk * qk_scale - (m_use - P_SHIFT)[:, None])  # p * 2^P_SHIFT: the row max lands on 2^P_SHIFT
    alpha = tl.exp2(m_i - m_use)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return acc, l_i, m_new


@triton.jit
def _fwd_fp8_kernel(
    Q, K, V, O, LSE, Q_DESCALE, K_DESCALE, V_DESCALE, qk_scale,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_on, stride_od,
    H, H_KV, GROUP, N_Q, N_KV, UPPER,
    HAS_UPPER: tl.constexpr, USE_DESC: tl.constexpr, V_TRANSPOSED: tl.constexpr,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    P_SHIFT: tl.constexpr,
):
    pid_m = tl.program_id(0)
    if HAS_UPPER:  # causal: the bottom query tiles see the most keys, start them first (v5)
        pid_m = tl.num_programs(0) - 1 - pid_m
    pid_bh = tl.program_id(1)
    b = (pid_bh // H).to(tl.int64)
    h = (pid_bh % H).to(tl.int64)
    h_kv = h // GROUP  # grouped-query attention: GROUP consecutive query heads share a K/V head and descales
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    # Descales of this (batch, KV head): q's and k's scale every score, so they join the exponent's scale. The
    # running max takes max(qk) * qk_scale for the largest scaled score, true only for qk_scale > 0: a negative
    # product's sign goes to q below (a sign flip is exact in float8) and a zero one is floored (LEAST_SCORE_FACTOR;
    # NaN stays NaN, as in float64).
    descale_at = b * H_KV + h_kv
    score_descale = tl.load(Q_DESCALE + descale_at) * tl.load(K_DESCALE + descale_at)
    q_sign = tl.where(score_descale < 0, -1.0, 1.0)
    qk_scale = tl.maximum(qk_scale * tl.abs(score_descale), LEAST_SCORE_FACTOR, propagate_nan=tl.PropagateNan.ALL)
    v_descale = tl.load(V_DESCALE + descale_at)
    if USE_DESC:  # Hopper: TMA copies through one 2-D descriptor per (batch, head), as v6
        q_desc = tl.make_tensor_descriptor(Q + b * stride_qb + h * stride_qh, shape=[N_Q, HEAD_DIM],
                                           strides=[stride_qn, 1], block_shape=[BLOCK_M, BLOCK_D])
        k_src = tl.make_tensor_descriptor(K + b * stride_kb + h_kv * stride_kh, shape=[N_KV, HEAD_DIM],
                                          strides=[stride_kn, 1], block_shape=[BLOCK_N, BLOCK_D])
        if V_TRANSPOSED:  # V stored (D, N) per head: stride_vn == 1
            v_src = tl.make_tensor_descriptor(V + b * stride_vb + h_kv * stride_vh, shape=[HEAD_DIM, N_KV],
                                              strides=[stride_vd, 1], block_shape=[BLOCK_D, BLOCK_N])
        else:
            v_src = tl.make_tensor_descriptor(V + b * stride_vb + h_kv * stride_vh, shape=[N_KV, HEAD_DIM],
                                              strides=[stride_vn, 1], block_shape=[BLOCK_N, BLOCK_D])
        q = q_desc.load([pid_m * BLOCK_M, 0])
    else:  # pointer tiles
        q = load_tile(Q + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qn + offs_d[None, :] * stride_qd,
                      offs_m, N_Q, offs_d, HEAD_DIM, BLOCK_D, CHECK_ROWS=True)
        k_src = K + b * stride_kb + h_kv * stride_kh
        v_src = V + b * stride_vb + h_kv * stride_vh
    q = (q * q_sign).to(Q.dtype.element_ty)

    m_i = tl.full([BLOCK_M], NO_KEY_YET, dtype=tl.float32)  # -inf: no finite score is taken for "no key"
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    # Key tiles from the causal bound alone (v7's rule without a window): [0, full_hi) whole and visible to every
    # row of the tile (no mask), [full_hi, hi) the diagonal and the tail.
    first_row = pid_m * BLOCK_M
    lo, hi, full_lo, full_hi = key_tile_range(
        first_row, last_row=tl.minimum(first_row + BLOCK_M, N_Q) - 1, N_KV=N_KV, UPPER=UPPER, LOWER=0,
        HAS_UPPER=HAS_UPPER, HAS_LOWER=False, BLOCK_N=BLOCK_N)
    for start_n in range(lo, full_hi, BLOCK_N):
        acc, l_i, m_i = _fp8_attend_tile(
            acc, l_i, m_i, q, k_src=k_src, v_src=v_src, start_n=start_n, offs_m=offs_m, stride_kn=stride_kn,
            stride_kd=stride_kd, stride_vn=stride_vn, stride_vd=stride_vd, N_KV=N_KV, qk_scale=qk_scale, UPPER=UPPER,
            MASKED=False, HAS_UPPER=HAS_UPPER, USE_DESC=USE_DESC, V_TRANSPOSED=V_TRANSPOSED, HEAD_DIM=HEAD_DIM,
            BLOCK_D=BLOCK_D, BLOCK_N=BLOCK_N, P_SHIFT=P_SHIFT)
    for start_n in range(full_hi, hi, BLOCK_N):
        acc, l_i, m_i = _fp8_attend_tile(
            acc, l_i, m_i, q, k_src=k_src, v_src=v_src, start_n=start_n, offs_m=offs_m, stride_kn=stride_kn,
            stride_kd=stride_kd, stride_vn=stride_vn, stride_vd=stride_vd, N_KV=N_KV, qk_scale=qk_scale, UPPER=UPPER,
            MASKED=True, HAS_UPPER=HAS_UPPER, USE_DESC=USE_DESC, V_TRANSPOSED=V_TRANSPOSED, HEAD_DIM=HEAD_DIM,
            BLOCK_D=BLOCK_D, BLOCK_N=BLOCK_N, P_SHIFT=P_SHIFT)

    # l carries the factor 2^P_SHIFT as acc does, so o = acc / l is right; the lse takes it back off.
    o, lse = normalise_rows(acc, l_i, m_i - P_SHIFT)
    store_output(
        O, LSE, o * v_descale, lse, pid_bh=pid_bh, offs_m=offs_m, offs_d=offs_d, o_base=b * stride_ob + h * stride_oh,
        stride_on=stride_on, stride_od=stride_od, N_Q=N_Q, HEAD_DIM=HEAD_DIM)


# ------------------------------------------------------------------------------------------ launching
def fp8_forward_config(props: configs.DeviceProps, block_d: int, *, causal: bool = False) -> configs.KernelConfig:
    """The FP8 forward's launch: the fastest of the first sweep on the H200 (``bench fp8`` at N=8192; one byte
    per element halves fp16's shared memory, so every candidate fits). The timings, and a later sweep that
    questions this choice, are in docs/KERNELS.md (FP8 forward)."""
    if props.interpreter:
        return configs.KernelConfig(32, 16, 4, 1)
    if block_d <= 64 and not causal:
        return configs.KernelConfig(128, 128, 8, 3)
    return configs.KernelConfig(64, 64, 4, 3)


def v_keys_contiguous(v: torch.Tensor) -> torch.Tensor:
    """V (B, H, N, D) as the FP8 kernel reads it fastest: the same values, viewed as (B, H, N, D), over storage
    (B, H, D, N_pad) in which consecutive keys are adjacent; N_pad rounds N up to 16 so that each row of the
    storage starts 16-byte aligned (the TMA's rule). Keep V this way to skip the per-call copy."""
    batch, heads, n, head_dim = v.shape
    storage = torch.empty((batch, heads, head_dim, max(16, -(-n // 16) * 16)), dtype=v.dtype, device=v.device)
    storage[..., :n].copy_(v.transpose(2, 3))
    return storage[..., :n].transpose(2, 3)


def _descale(d: torch.Tensor | None, name: str, batch: int, heads_kv: int, device) -> torch.Tensor:
    if d is None:
        return torch.ones((batch, heads_kv), dtype=torch.float32, device=device)
    if not isinstance(d, torch.Tensor) or tuple(d.shape) != (batch, heads_kv) or d.dtype != torch.float32:
        got = f"{tuple(d.shape)} {d.dtype}" if isinstance(d, torch.Tensor) else type(d).__name__
        raise ValueError(f"{name} is {got}: expected ({batch}, {heads_kv}) float32, one factor per (batch, KV "
                         "head), as quantize_fp8 returns it")
    if d.device != device:
        raise ValueError(f"{name} is on {d.device} but q is on {device}: put the descales on q's device")
    return d.contiguous()


def run_fp8_forward(q, k, v, q_descale=None, k_descale=None, v_descale=None, *, rules: Rules, scale=None,
                    out_dtype=torch.bfloat16, config: configs.KernelConfig | None = None,
                    use_descriptors: bool | None = None, transpose_v: bool = True):
    """Launch the FP8 kernel on checked inputs; returns (o in ``out_dtype``, lse float32). Works for any input
    dtype the device can multiply (the CPU tests use 16-bit values; P is cast to V's dtype). ``config``,
    ``use_descriptors`` (None: wherever usable) and ``transpose_v`` override the launch (the benchmark's
    fallbacks)."""
    batch, heads, n_q, head_dim = q.shape
    heads_kv, n_kv = k.shape[1], k.shape[2]
    block_d = padded_head_dim(head_dim)
    props = configs.device_props(q.device)
    upper, _ = rules.key_bounds(n_q, n_kv)
    config = config or fp8_forward_config(props, block_d, causal=upper is not None)
    descales = [_descale(d, name, batch, heads_kv, q.device)
                for d, name in ((q_descale, "q_descale"), (k_descale, "k_descale"), (v_descale, "v_descale"))]
    o = torch.empty((batch, heads, n_q, head_dim), dtype=out_dtype, device=q.device)
    lse = torch.empty((batch, heads, n_q), dtype=torch.float32, device=q.device)
    if batch * heads * n_q == 0:
        return o, lse
    if transpose_v and v.stride(2) != 1:
        v = v_keys_contiguous(v)  # one copy of V per call, counted in every timing
    read_layout = v.transpose(2, 3) if transpose_v else v  # the view whose last dim has unit stride
    usable = descriptors_usable(props, q, k, read_layout)
    if use_descriptors is None:
        use_descriptors = usable
    elif use_descriptors and not usable:
        raise ValueError("use_descriptors=True, but these inputs cannot use TMA descriptors (they need sm_90 and "
                         "16-byte aligned rows with a unit stride in the last dim): pass use_descriptors=None")
    if use_descriptors:
        triton.set_allocator(tma_scratch(q.device))
    grid = (triton.cdiv(n_q, config.block_m), batch * heads)
    _fwd_fp8_kernel[grid](
        Q=q, K=k, V=v, O=o, LSE=lse, Q_DESCALE=descales[0], K_DESCALE=descales[1], V_DESCALE=descales[2],
        qk_scale=default_scale(head_dim, scale) * LOG2E,
        **strides(q, "q"), **strides(k, "k"), **strides(v, "v"), **strides(o, "o"),
        H=heads, H_KV=heads_kv, GROUP=heads // heads_kv, N_Q=n_q, N_KV=n_kv, UPPER=0 if upper is None else upper,
        HAS_UPPER=upper is not None, USE_DESC=use_descriptors, V_TRANSPOSED=transpose_v,
        HEAD_DIM=head_dim, BLOCK_D=block_d, BLOCK_M=config.block_m, BLOCK_N=config.block_n, P_SHIFT=P_SHIFT,
        num_warps=config.num_warps, num_stages=config.num_stages,
    )
    return o, lse


# ------------------------------------------------------------------------------------------ checks and entry
def check_fp8_qkv(q, k, v) -> None:
    """q (B, H_q, N_q, D), k and v (B, H_kv, N_kv, D), all float8_e4m3fn, H_q a multiple of H_kv, D 64 or 128."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"{name} is {got}: expected a 4-dim tensor (B, H, N, D)")
        if t.dtype != FP8:
            raise TypeError(f"{name} has dtype {t.dtype}: an FP8 call needs q, k and v all float8_e4m3fn "
                            "(quantize_fp8 makes them)")
    if k.shape != v.shape:
        raise ValueError(f"k has shape {tuple(k.shape)} but v has shape {tuple(v.shape)}: they must match")
    if q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3]:
        raise ValueError(f"q has shape {tuple(q.shape)} but k has shape {tuple(k.shape)}: batch and head dim "
                         "(dims 0 and 3) must match")
    if k.shape[1] == 0 or q.shape[1] % k.shape[1]:
        raise ValueError(f"q has {q.shape[1]} heads and k has {k.shape[1]}: H_q must be a multiple of H_kv")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v are on {q.device}, {k.device}, {v.device}: they must be on one device")
    if q.shape[3] not in FP8_HEAD_DIMS:
        raise ValueError(f"head dim {q.shape[3]} is not supported in FP8: expected one of {FP8_HEAD_DIMS}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_head_span(t, name)


def require_fp8_device(t: torch.Tensor) -> None:
    """FP8 products need FP8 tensor cores: an NVIDIA GPU of compute capability 9.0 (Hopper) or newer."""
    props = configs.device_props(t.device)
    if props.interpreter or props.capability < MIN_CAPABILITY:
        where = ("the Triton interpreter on a CPU" if props.interpreter else
                 f"{props.name} (compute capability {props.capability[0]}.{props.capability[1]})")
        raise RuntimeError(
            f"FP8 attention needs an NVIDIA GPU with FP8 tensor cores, compute capability "
            f"{MIN_CAPABILITY[0]}.{MIN_CAPABILITY[1]} (Hopper: H100, H200) or newer, and this is {where}: run it on "
            "such a GPU, or pass float16/bfloat16 q, k, v"
        )


_UNSUPPORTED = ("window", "softcap", "alibi_slopes", "document_ids", "mask_mod", "version")


def flash_attention_forward_fp8(q, k, v, *, q_descale=None, k_descale=None, v_descale=None,
                                out_dtype=torch.bfloat16, causal=False, scale: float | None = None,
                                config: configs.KernelConfig | None = None, use_descriptors: bool | None = None,
                                transpose_v: bool = True, **options):
    """FP8 FlashAttention forward: o (B, H_q, N_q, D) in ``out_dtype`` and lse (B, H_q, N_q) float32.

    q, k, v float8_e4m3fn; descales (B, H_kv) float32, positive, None = 1; ``causal`` False, True / "top_left" or
    "bottom_right". The other options of ``kernels.flash_attention_forward`` (window, softcap, ALiBi, documents,
    mask_mod, version) are not implemented in FP8 and raise a ValueError naming them when given.
    """
    given = [name for name in _UNSUPPORTED if options.get(name) is not None]
    unknown = set(options) - set(_UNSUPPORTED)
    if unknown:
        raise TypeError(f"unexpected keyword arguments {sorted(unknown)}")
    if given:
        raise ValueError(f"the FP8 forward supports dense and causal attention only, not {', '.join(given)}: "
                         "pass float16/bfloat16 q, k, v for those options")
    if out_dtype not in OUT_DTYPES:
        raise ValueError(f"out_dtype is {out_dtype}: an FP8 call returns torch.bfloat16 or torch.float16")
    check_fp8_qkv(q, k, v)
    scale = check_scale(scale)  # the rule of every entry point: its kernel's running max needs a scale > 0
    rules = parse_rules(q, k, causal=causal)
    descales = [_descale(d, name, q.shape[0], k.shape[1], q.device)
                for d, name in ((q_descale, "q_descale"), (k_descale, "k_descale"), (v_descale, "v_descale"))]
    check_device(q, "q")
    require_fp8_device(q)
    return run_fp8_forward(q, k, v, *descales, rules=rules, scale=scale, out_dtype=out_dtype,
                           config=config, use_descriptors=use_descriptors, transpose_v=transpose_v)


# ------------------------------------------------------------------------------------------ quantising
class Fp8QKV(NamedTuple):
    """Quantised inputs: fp8 tensors and their (B, H_kv) float32 descales; ``rotation`` (D, D) when q and k were
    rotated (incoherent processing), else None."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    q_descale: torch.Tensor
    k_descale: torch.Tensor
    v_descale: torch.Tensor
    rotation: torch.Tensor | None = None

    def descales(self) -> dict[str, torch.Tensor]:
        """The keyword arguments of an FP8 call: ``flash_attention_forward(x.q, x.k, x.v, **x.descales())``."""
        return {"q_descale": self.q_descale, "k_descale": self.k_descale, "v_descale": self.v_descale}

    def dequantized(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """float32 (q, k, v) as the kernel sees them (q and k in the rotated basis when incoherent)."""
        return (dequantize(self.q, self.q_descale), dequantize(self.k, self.k_descale),
                dequantize(self.v, self.v_descale))


def _per_head(descale: torch.Tensor, heads: int) -> torch.Tensor:
    """(B, H_kv) factors broadcast over (B, heads, N, D): KV head g covers heads g*G .. g*G + G - 1."""
    return descale.repeat_interleave(heads // descale.shape[1], dim=1)[:, :, None, None]


def quantize_tensor(x: torch.Tensor, heads_kv: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x (B, H, N, D) -> (x_fp8, descale (B, heads_kv) float32) with x ~ x_fp8 * descale: each group of
    H / heads_kv heads scaled so that its largest magnitude lands on e4m3's largest value, 448."""
    batch, heads = x.shape[:2]
    if heads % heads_kv:
        raise ValueError(f"x has {heads} heads, not a multiple of heads_kv = {heads_kv}")
    xf = x.float()
    if xf.numel() == 0:
        amax = torch.zeros((batch, heads_kv), device=x.device)
    else:
        amax = xf.abs().reshape(batch, heads_kv, -1).amax(dim=-1)
    descale = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))  # all-zero heads: any scale works
    x8 = (xf / _per_head(descale, heads)).clamp(-E4M3_MAX, E4M3_MAX).to(FP8)
    return x8, descale


def dequantize(x8: torch.Tensor, descale: torch.Tensor) -> torch.Tensor:
    """float32 ``x8 * descale``, the descale of KV head g applied to every head of its group."""
    return x8.float() * _per_head(descale, x8.shape[1])


def hadamard(d: int) -> torch.Tensor:
    """The d x d Sylvester Hadamard matrix (entries +-1, H H^T = d I), d a power of two, float64."""
    if d < 1 or d & (d - 1):
        raise ValueError(f"a Hadamard matrix needs a power-of-two size, got {d}")
    h = torch.ones((1, 1), dtype=torch.float64)
    while h.shape[0] < d:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h


def random_rotation(d: int, *, seed: int = 0, device=None) -> torch.Tensor:
    """diag(random signs) @ H / sqrt(d): a random orthogonal (d, d) float32 matrix (R R^T = I), seeded."""
    gen = torch.Generator().manual_seed(seed)
    signs = torch.randint(0, 2, (d,), generator=gen).to(torch.float64) * 2 - 1
    return (signs[:, None] * hadamard(d) / math.sqrt(d)).to(torch.float32).to(device)


def quantize_fp8(q, k, v, *, incoherent: bool = False, seed: int = 0) -> Fp8QKV:
    """Quantise q, k, v to float8_e4m3fn for the FP8 forward, with one descale per (batch, KV head).

    Args:
        q: (B, H_q, N_q, D), float16, bfloat16 or float32.
        k, v: (B, H_kv, N_k, D), H_q a multiple of H_kv.
        incoherent: False (default); True multiplies q and k first by one random orthogonal matrix R (a Hadamard
            matrix with random signs): (q R)(k R)^T = q k^T, so attention is unchanged, but an outlier channel's
            energy is spread over all D channels and the rounding errors of its products shrink. v is not rotated.
        seed: the random signs of R (default 0).

    Returns:
        :class:`Fp8QKV`: ``q``, ``k``, ``v`` in float8_e4m3fn, ``q_descale``, ``k_descale``, ``v_descale``
        (B, H_kv) float32 (the true tensor is ``fp8 * descale``), and ``rotation`` (D, D) or None.

    Example::

        x = quantize_fp8(q, k, v, incoherent=True)
        o, lse = kernels.flash_attention_forward(x.q, x.k, x.v, **x.descales(), causal=True)  # sm_90+
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise ValueError(f"{name} must be a 4-dim tensor (B, H, N, D)")
    heads_kv = k.shape[1]
    if heads_kv == 0 or q.shape[1] % heads_kv:
        raise ValueError(f"q has {q.shape[1]} heads and k has {heads_kv}: H_q must be a multiple of H_kv")
    rotation = None
    if incoherent:
        rotation = random_rotation(q.shape[-1], seed=seed, device=q.device)
        q, k = q.float() @ rotation, k.float() @ rotation
    (q8, qd), (k8, kd), (v8, vd) = (quantize_tensor(t, heads_kv) for t in (q, k, v))
    return Fp8QKV(q8, k8, v8, qd, kd, vd, rotation)


# ------------------------------------------------------------------------------------------ float64 reference
def reference_forward(q, k, v, *, causal=False, scale: float | None = None, p_shift: int | None = None,
                      chunk: int = 1024):
    """Attention in float64 (torch, any device), query rows in chunks: returns (o, lse, p_abs_v).

    q (B, H_q, N_q, D), k and v (B, H_kv, N_kv, D) of any float dtype (dequantise FP8 first). ``p_shift=None``:
    exact. ``p_shift=s``: P rounded as the kernel rounds it, ``(p * 2^s)`` cast to e4m3 and scaled back, the
    sum l exact (the kernel's roundings, with the row's final max where the kernel has a running one).
    ``p_abs_v = P @ |V|`` (P normalised), the scale of P's rounding error in o (:func:`error_bound`).
    """
    q, k, v = (t.to(torch.float64) for t in (q, k, v))
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    n_q, n_kv = q.shape[2], k.shape[2]
    scale = default_scale(q.shape[-1], scale)
    upper, _ = parse_rules(q, k, causal=causal).key_bounds(n_q, n_kv)
    no_rows = q.new_zeros(q.shape[:2] + (0, v.shape[-1]))  # so that a call with no query returns empty tensors
    outs, lses, bounds = [no_rows], [no_rows[..., 0]], [no_rows]
    for start in range(0, n_q, chunk):
        rows = torch.arange(start, min(start + chunk, n_q), device=q.device)
        s = (q[:, :, rows] @ k.transpose(-1, -2)) * scale  # (B, H, rows, N_kv)
        if upper is not None:
            hidden = torch.arange(n_kv, device=q.device)[None, :] > rows[:, None] + upper
            s = s.masked_fill(hidden, float("-inf"))
        m = s.amax(dim=-1, keepdim=True) if n_kv else torch.zeros(s.shape[:-1] + (1,), dtype=s.dtype,
                                                                    device=s.device)
        m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
        p = torch.exp(s - m)
        l_sum = p.sum(dim=-1, keepdim=True)
        l_safe = torch.where(l_sum == 0, torch.ones_like(l_sum), l_sum)
        p_used = p if p_shift is None else (p * 2.0**p_shift).to(FP8).to(torch.float64) / 2.0**p_shift
        outs.append(p_used @ v / l_safe)
        bounds.append(p @ v.abs() / l_safe)
        lses.append(torch.where(l_sum == 0, float("-inf"), m + torch.log(l_safe)).squeeze(-1))
    return torch.cat(outs, 2), torch.cat(lses, 2), torch.cat(bounds, 2)


def error_bound(o_ref: torch.Tensor, p_abs_v: torch.Tensor, v_abs_max: float, n_kv: int,
                out_dtype=torch.bfloat16, p_shift: int = P_SHIFT) -> torch.Tensor:
    """Per element, how far the FP8 kernel's o may be from the float64 attention of its dequantised inputs, with P
    exact or rounded as the kernel rounds it (:func:`reference_forward`'s ``p_shift``):

    - P's rounding: each weight p_j keeps 3 mantissa bits, |error| <= 2^-4 p_j. A reference that rounds P too
      rounds it once more, not as the kernel did: the kernel rounds a key tile's weights on the running max (and
      rescales them by alpha, not a power of two, when the max grows later), the reference on the row's final max,
      and a score a few ulps off (below) sends a weight near a midpoint of e4m3's grid to the other neighbour, a
      whole ulp (<= 2^-3 p_j) away. Each is within 2^-4 p_j of p_j, so o moves by at most 2 * 2^-4 (P @ |V|).
      Over many keys the differences cancel; in a row whose weight sits on a few keys one of them can take most
      of the budget: with one rounding, the H200's checks at N_kv = 200 reached 1.08x of the bound
      (benchmarks/results/2026-12-02-nvidia-h200-fa3-fp8.json), tests/test_fp8.py's emulation of the kernels
      1.4x at N_kv = 16 to 200 (0.4-0.7x from 1000 keys). Plus 2^-7 (P @ |V|) of margin for the scores'
      accumulation in the tensor core, which on Hopper keeps fewer than fp32's bits (DeepSeek-V3 technical
      report, section 3.3.2);
    - weights below e4m3's normal range (p < 2^-(P_SHIFT+6)) round with an absolute error <= 2^-(P_SHIFT+10),
      twice as above: n_kv of them at most, times max|v|, and l >= 1. ``p_shift``: the kernel's shift where it
      is not P_SHIFT (the Gluon v9a_fp8 quantises p * 2^6, its kept max lagging by up to 2: the smallest shift
      a weight sees is the kernel's);
    - the output's own rounding: half an ulp of ``out_dtype`` (2^-8 for bf16, 2^-11 for fp16), taken as a whole
      ulp, plus 1e-3 for float32's sums and the hardware exp2.
    """
    ulp = 2.0**-7 if out_dtype == torch.bfloat16 else 2.0**-10
    roundings = 2  # the kernel's P and the reference's (or the exact P: then one would do)
    return ((roundings * 2.0**-4 + 2.0**-7) * p_abs_v + roundings * n_kv * 2.0 ** -(p_shift + 10) * v_abs_max
            + ulp * o_ref.abs() + 1e-3)
