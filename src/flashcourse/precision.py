"""Low-precision arithmetic of an attention kernel, emulated in NumPy so that its errors can be measured on a CPU.

A FlashAttention kernel reads Q, K, V in float16 or bfloat16, accumulates the products QK^T and PV in float32
(tensor cores do), keeps the running max and sum in float32, and rounds the probabilities P to the input type
just before the PV product, because the tensor cores multiply only 16-bit operands (the course's kernels:
``tl.dot(p.to(v.dtype), v)``). :func:`attention_like_kernel` does the same steps block by block, with each
rounding explicit, so a lesson can switch one rounding off and see what it costs against a float64 reference.

NumPy has no bfloat16; :func:`round_to` rounds float32 values to the nearest bfloat16 (ties to even) by
dropping the low 16 bits of their encoding, which is what a conversion to bfloat16 does.
"""

from __future__ import annotations

import numpy as np

from . import reference

__all__ = ["DTYPES", "attention_like_kernel", "round_to"]

DTYPES = ("float32", "float16", "bfloat16")


def round_to(x, dtype: str) -> np.ndarray:
    """``x`` rounded to ``dtype`` ("float32", "float16" or "bfloat16"), returned as float32 values.

    Values beyond the type's range become +-inf, as a real conversion makes them.
    """
    x = np.asarray(x, dtype=np.float32)
    if dtype == "float32":
        return x.copy()
    if dtype == "float16":
        with np.errstate(over="ignore"):
            return x.astype(np.float16).astype(np.float32)
    if dtype == "bfloat16":
        bits = x.view(np.uint32).astype(np.uint64)
        # round to nearest, ties to even: add 0x7FFF plus the lowest kept bit, then drop the low 16 bits
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16 << 16
        return bits.astype(np.uint32).view(np.float32)
    raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")


def attention_like_kernel(q, k, v, *, dtype: str = "float16", p_dtype: str | None = None, block_k: int = 64,
                          causal: bool = False, scale=None) -> np.ndarray:
    """One head of attention computed as a 16-bit FlashAttention kernel does; returns O as float64 values.

    q: (N_q, D), k, v: (N_k, D). Inputs are rounded to ``dtype``; S = scale * QK^T, the running max m, sum l and
    the accumulator are float32; each block of P = exp(S - m) is rounded to ``p_dtype`` (default: ``dtype``)
    before it multiplies V, while l sums the unrounded P (as the kernels do); O = acc / l is rounded to
    ``dtype`` at the end. ``p_dtype="float32"`` switches off the rounding of P alone.
    """
    p_dtype = dtype if p_dtype is None else p_dtype
    for name, value in (("dtype", dtype), ("p_dtype", p_dtype)):
        if value not in DTYPES:
            raise ValueError(f"{name} must be one of {DTYPES}, got {value!r}")
    reference.validate_block("block_k", block_k)
    q, k, v = (round_to(x, dtype) for x in reference.validate_qkv(q, k, v))
    if q.ndim != 2:
        raise ValueError(f"q has shape {q.shape}: one head, (N_q, D), is expected; pass q[b, h] for a head")
    scale = np.float32(reference.resolve_scale(scale, q.shape[-1]))
    n_q, n_k = q.shape[0], k.shape[0]
    m = np.full(n_q, -np.inf, dtype=np.float32)
    l = np.zeros(n_q, dtype=np.float32)
    acc = np.zeros((n_q, v.shape[1]), dtype=np.float32)
    for start in range(0, n_k, block_k):
        s = (q @ k[start:start + block_k].T) * scale  # float32, (N_q, B_k)
        if causal:
            s[~reference.causal_mask(n_q, s.shape[1], 0, start)] = -np.inf
        m_new = np.maximum(m, s.max(axis=1))
        p = np.exp(s - reference.safe_max(m_new)[:, None]).astype(np.float32)
        alpha = reference.rescale_factor(m, m_new).astype(np.float32)
        l = alpha * l + p.sum(axis=1)
        acc = alpha[:, None] * acc + round_to(p, p_dtype) @ v[start:start + block_k]
        m = m_new
    o = np.divide(acc, l[:, None], out=np.zeros_like(acc), where=l[:, None] > 0)
    return round_to(o, dtype).astype(np.float64)
