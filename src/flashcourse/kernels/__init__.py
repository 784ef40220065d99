"""The course's Triton kernels: FlashAttention forward and backward, and split-KV decoding.

Public API (torch tensors; q (B, H_q, N_q, D), k and v (B, H_kv, N_kv, D) with H_q a multiple of H_kv, any
strides; D in 16, 32, 64, 80, 96, 128, 256)::

    flash_attention(q, k, v, *, causal=False, scale=None, window=None, softcap=None, alibi_slopes=None,
                    document_ids=None, mask_mod=None) -> o                            # differentiable
    flash_attention_forward(q, k, v, *, <same options>) -> (o, lse)                # lse (B, H_q, N_q) float32
    flash_attention_forward(q8, k8, v8, *, q_descale=None, k_descale=None, v_descale=None,
                            out_dtype=torch.bfloat16, causal=False, scale=None) -> (o, lse)  # FP8, sm_90+
    flash_attention_backward(q, k, v, o, lse, do, *, <same options>) -> (dq, dk, dv)
    flash_decode(q, k_cache, v_cache, *, cache_seqlens=None, block_table=None, scale=None,
                 num_splits=None, window=None, softcap=None, alibi_slopes=None) -> o  # q (B, H_q, D)

The options (``rules.py`` says exactly what each means): ``causal`` False | True (= "top_left") | "top_left" |
"bottom_right"; ``window=(left, right)``, -1 unbounded; ``softcap``; ``alibi_slopes`` (H_q,) float32;
``document_ids`` (B, N) integer; ``mask_mod`` a ``@triton.jit`` (b, h, q_idx, kv_idx) -> bool. All combine by
AND. Every numbered version stays runnable (``FORWARD_VERSIONS``, ``BACKWARD_VERSIONS``); the teaching
versions v1-v6 and b1, b2, b4, b5 know only plain and top-left causal attention and refuse the rest by name. The
version history with measurements is ``docs/KERNELS.md``. Without a GPU the kernels run in Triton's
interpreter on CPU tensors.
"""

from flashcourse import device as _device

_device.require_triton()  # a clear ImportError on macOS/Windows, before `import triton` fails obscurely
_device.setup()  # must run before any @triton.jit below: the interpreter is chosen at decoration time

import torch  # noqa: E402

from . import configs, fp8  # noqa: E402
from ._checks import check_qkv, check_saved  # noqa: E402
from .backward import BACKWARD_VERSIONS, DEFAULT_BACKWARD, DENSE_BACKWARD, run_backward  # noqa: E402
from .decode import flash_decode  # noqa: E402
from .forward import DEFAULT_FORWARD, FORWARD_VERSIONS, run_forward  # noqa: E402
from .rules import Rules, parse_rules  # noqa: E402

__all__ = [
    "BACKWARD_VERSIONS",
    "DEFAULT_BACKWARD",
    "DEFAULT_FORWARD",
    "FORWARD_VERSIONS",
    "configs",
    "flash_attention",
    "flash_attention_backward",
    "flash_attention_forward",
    "flash_decode",
    "fp8",
]


def _forward_version(version: str | None):
    name = DEFAULT_FORWARD if version is None else version
    if name not in FORWARD_VERSIONS:
        raise ValueError(f"unknown forward version {name!r}: expected one of {sorted(FORWARD_VERSIONS)}")
    return FORWARD_VERSIONS[name]


def _backward_version(version: str | None, q=None, k=None, rules: Rules | None = None):
    """The named backward version; by default b3, or b1 where b1 can run the call: on the H200, dense, b3 measured
    3-9% slower than b1 (docs/KERNELS.md), so a call that needs none of b3's rules keeps b1's speed."""
    name = DEFAULT_BACKWARD if version is None else version
    if name not in BACKWARD_VERSIONS:
        raise ValueError(f"unknown backward version {name!r}: expected one of {sorted(BACKWARD_VERSIONS)}")
    if version is None and rules is not None and rules.missing_in_numbered_version(
            k.shape[1] != q.shape[1], q.shape[2], k.shape[2]) is None:
        return BACKWARD_VERSIONS[DENSE_BACKWARD]
    return BACKWARD_VERSIONS[name]


def flash_attention_forward(q, k, v, *, causal=False, scale: float | None = None, window=None, softcap=None,
                            alibi_slopes=None, document_ids=None, mask_mod=None, version: str | None = None,
                            q_descale=None, k_descale=None, v_descale=None, out_dtype=torch.bfloat16):
    """FlashAttention forward: o (B, H_q, N_q, D) like q and lse (B, H_q, N_q) float32 (natural log).

    q: (B, H_q, N_q, D); k, v: (B, H_kv, N_kv, D); the options are the module's; ``scale`` defaults to
    1/sqrt(D); ``version`` picks a numbered kernel ("v1".."v7", default the one that supports every option).
    Not differentiable: use :func:`flash_attention` for that. Rows with no visible key give 0 and -inf.

    FP8 (``fp8.py``): q, k, v all ``torch.float8_e4m3fn`` on a GPU of compute capability 9.0 or newer (else a
    RuntimeError saying so), the true tensors being ``fp8 * descale`` with ``q_descale``, ``k_descale``,
    ``v_descale`` (B, H_kv) float32 (None = 1; ``fp8.quantize_fp8`` makes all six); o comes in ``out_dtype``
    (bfloat16 or float16). Dense and causal only: the other options raise a ValueError naming them. The
    descales and ``out_dtype`` belong to FP8 calls: given with 16/32-bit inputs, they raise a ValueError.
    """
    if getattr(q, "dtype", None) is fp8.FP8:
        return fp8.flash_attention_forward_fp8(
            q, k, v, q_descale=q_descale, k_descale=k_descale, v_descale=v_descale, out_dtype=out_dtype,
            causal=causal, scale=scale, window=window, softcap=softcap, alibi_slopes=alibi_slopes,
            document_ids=document_ids, mask_mod=mask_mod, version=version)
    if q_descale is not None or k_descale is not None or v_descale is not None or out_dtype is not torch.bfloat16:
        raise ValueError("q_descale, k_descale, v_descale and out_dtype are for float8_e4m3fn inputs; q is "
                         f"{getattr(q, 'dtype', type(q).__name__)}, whose output comes in q's dtype: drop them")
    check_qkv(q, k, v)
    rules = parse_rules(q, k, causal=causal, window=window, softcap=softcap, alibi_slopes=alibi_slopes,
                        document_ids=document_ids, mask_mod=mask_mod)
    return run_forward(_forward_version(version), q, k, v, rules=rules, scale=scale)


def flash_attention_backward(q, k, v, o, lse, do, *, causal=False, scale: float | None = None, window=None,
                             softcap=None, alibi_slopes=None, document_ids=None, mask_mod=None,
                             version: str | None = None):
    """FlashAttention backward from the forward's saved (o, lse): returns (dq, dk, dv) like q, k, v.

    o and do: like q; lse: (B, H_q, N_q) float32, as :func:`flash_attention_forward` returns it; the options
    must be the forward's. P is recomputed from (q, k, lse), so a caller that merged partial results (ring
    attention) passes the merged o and lse.
    """
    check_qkv(q, k, v)
    check_saved(q, o, lse, do)
    rules = parse_rules(q, k, causal=causal, window=window, softcap=softcap, alibi_slopes=alibi_slopes,
                        document_ids=document_ids, mask_mod=mask_mod)
    return run_backward(_backward_version(version, q, k, rules), q, k, v, o, lse, do, rules=rules, scale=scale)


class FlashAttentionFunction(torch.autograd.Function):
    """Saves (q, k, v, o, lse) in the forward; the backward recomputes P from them (no N x N matrix)."""

    @staticmethod
    def forward(ctx, q, k, v, rules: Rules, scale, forward_version, backward_version):
        o, lse = run_forward(_forward_version(forward_version), q, k, v, rules=rules, scale=scale)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.rules, ctx.scale, ctx.backward_version = rules, scale, backward_version
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = run_backward(_backward_version(ctx.backward_version, q, k, ctx.rules), q, k, v, o, lse, do,
                                  rules=ctx.rules, scale=ctx.scale)
        return dq, dk, dv, None, None, None, None


def flash_attention(q, k, v, *, causal=False, scale: float | None = None, window=None, softcap=None,
                    alibi_slopes=None, document_ids=None, mask_mod=None, forward_version: str | None = None,
                    backward_version: str | None = None):
    """Differentiable FlashAttention, a drop-in for ``F.scaled_dot_product_attention(q, k, v, is_causal=...)``.

    q: (B, H_q, N_q, D); k, v: (B, H_kv, N_kv, D) -> o (B, H_q, N_q, D); the options are the module's.
    Gradients flow to q, k and v (dk, dv summed over each K/V head's group of query heads).
    """
    check_qkv(q, k, v)
    rules = parse_rules(q, k, causal=causal, window=window, softcap=softcap, alibi_slopes=alibi_slopes,
                        document_ids=document_ids, mask_mod=mask_mod)
    forward = _forward_version(forward_version)
    _backward_version(backward_version)
    if not (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)):
        return run_forward(forward, q, k, v, rules=rules, scale=scale)[0]  # inference: skip autograd's cost
    return FlashAttentionFunction.apply(q, k, v, rules, scale, forward_version, backward_version)
