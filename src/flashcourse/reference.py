"""The specification, in plain NumPy: attention, three softmaxes and the (m, l) merge.

Everything else in the course is checked against these functions.

Compute precision: every function computes in the floating dtype of its inputs (NumPy's result type; float16,
float32 and float64 are accepted) and returns that dtype. Pass float64 to get the specification itself; pass
float16 to watch the naive softmax overflow. Integer or complex inputs are rejected.

Edge semantics (shared by every implementation in the course): a row whose entries are all masked, i.e. all
``-inf``, has softmax 0 everywhere, attention output 0 and logsumexp ``-inf``; never NaN.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

__all__ = [
    "attention",
    "attention_lse",
    "causal_mask",
    "merge",
    "merge_partials",
    "OnlineSoftmaxStep",
    "rescale_factor",
    "resolve_scale",
    "safe_max",
    "softmax_naive",
    "softmax_online",
    "softmax_online_steps",
    "softmax_safe",
    "validate_block",
    "validate_qkv",
]

_FLOAT_DTYPES = (np.float16, np.float32, np.float64)


# --------------------------------------------------------------------------------------------- validation
def _float_array(x, name: str) -> np.ndarray:
    """`x` as a NumPy array of a float dtype, or a TypeError naming what came."""
    arr = np.asarray(x)
    if arr.dtype.type not in _FLOAT_DTYPES:
        raise TypeError(
            f"{name} has dtype {arr.dtype}, but a floating dtype (float16, float32 or float64) is expected: "
            f"convert it with {name}.astype(np.float32)"
        )
    return arr


def validate_qkv(q, k, v) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Check attention inputs and return them as arrays of one common float dtype.

    q: (..., N_q, D), k: (..., N_k, D), v: (..., N_k, D_v); the leading dims of all three must be equal.
    Raises TypeError for non-float dtypes and ValueError for shapes that do not fit together.
    """
    q, k, v = _float_array(q, "q"), _float_array(k, "k"), _float_array(v, "v")
    for name, arr in (("q", q), ("k", k), ("v", v)):
        if arr.ndim < 2:
            raise ValueError(
                f"{name} has shape {arr.shape}, but at least 2 dims (..., N, D) are expected: "
                f"add a sequence axis, e.g. {name}[None, :]"
            )
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"q has shape {q.shape} but k has shape {k.shape}: the last dims (head dim) must match"
        )
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(
            f"k has shape {k.shape} but v has shape {v.shape}: keys and values must have the same length "
            "(dim -2)"
        )
    if not (q.shape[:-2] == k.shape[:-2] == v.shape[:-2]):
        raise ValueError(
            f"q, k, v have leading (batch/head) dims {q.shape[:-2]}, {k.shape[:-2]}, {v.shape[:-2]}: "
            "they must be equal"
        )
    if q.shape[-1] == 0:
        raise ValueError(f"q has shape {q.shape}: the head dim must be at least 1")
    dtype = np.result_type(q, k, v)
    return q.astype(dtype, copy=False), k.astype(dtype, copy=False), v.astype(dtype, copy=False)


def validate_block(name: str, value) -> int:
    """Check that a block size is a positive integer and return it."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be a positive int, got {value!r} of type {type(value).__name__}")
    if value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value}")
    return int(value)


def resolve_scale(scale, head_dim: int) -> float:
    """``scale``, or 1/sqrt(head_dim) when it is None; a ValueError for inf or NaN."""
    if scale is None:
        return 1.0 / np.sqrt(head_dim)
    scale = float(scale)
    if not np.isfinite(scale):
        raise ValueError(f"scale must be a finite number, got {scale}")
    return scale


# --------------------------------------------------------------------------------------------- attention
def causal_mask(n_q: int, n_k: int, q_start: int = 0, k_start: int = 0) -> np.ndarray:
    """Boolean (n_q, n_k) array, True where query q_start+i may attend to key k_start+j, i.e. j <= i.

    Top-left aligned, as ``torch.nn.functional.scaled_dot_product_attention(is_causal=True)``.
    The offsets let a tiled algorithm build the mask of one tile.
    """
    rows = np.arange(q_start, q_start + n_q)[:, None]
    cols = np.arange(k_start, k_start + n_k)[None, :]
    return cols <= rows


def attention_lse(q, k, v, *, causal: bool = False, scale=None, mask=None) -> tuple[np.ndarray, np.ndarray]:
    """Naive attention that also returns the row logsumexp of the scaled, masked scores.

    q: (..., N_q, D), k: (..., N_k, D), v: (..., N_k, D_v) -> o: (..., N_q, D_v), lse: (..., N_q).
    ``mask``: optional boolean array broadcastable to (..., N_q, N_k), True = keep.
    A row with every key masked gets o = 0 and lse = -inf.
    """
    q, k, v = validate_qkv(q, k, v)
    scale = resolve_scale(scale, q.shape[-1])
    s = (q @ np.swapaxes(k, -1, -2)) * q.dtype.type(scale)  # (..., N_q, N_k)
    keep = np.ones(s.shape[-2:], dtype=bool)
    if causal:
        keep = causal_mask(q.shape[-2], k.shape[-2])
    if mask is not None:
        mask = np.asarray(mask)
        if mask.dtype != bool:
            raise TypeError(f"mask has dtype {mask.dtype}, but a boolean mask (True = keep) is expected")
        try:
            keep = keep & np.broadcast_to(mask, s.shape)
        except ValueError:
            raise ValueError(
                f"mask has shape {mask.shape}, which does not broadcast to the scores' shape {s.shape}"
            ) from None
    s = np.where(keep, s, -np.inf)
    p = softmax_safe(s, axis=-1)
    lse = _logsumexp_rows(s)
    return p @ v, lse


def attention(q, k, v, *, causal: bool = False, scale=None, mask=None) -> np.ndarray:
    """softmax(q k^T * scale + mask) v, materialising the full N_q x N_k score matrix.

    q: (..., N_q, D), k: (..., N_k, D), v: (..., N_k, D_v) -> (..., N_q, D_v).
    ``scale=None`` means 1/sqrt(D); ``causal=True`` masks key j > query i (top-left aligned).
    """
    return attention_lse(q, k, v, causal=causal, scale=scale, mask=mask)[0]


def _logsumexp_rows(s: np.ndarray) -> np.ndarray:
    """log(sum(exp(s), axis=-1)) without overflow; rows of all -inf give -inf."""
    m = np.max(s, axis=-1, initial=-np.inf)
    m_safe = safe_max(m)
    with np.errstate(divide="ignore"):
        return m_safe + np.log(np.sum(np.exp(s - m_safe[..., None]), axis=-1))


# --------------------------------------------------------------------------------------------- softmax
def softmax_naive(x, axis: int = -1) -> np.ndarray:
    """exp(x) / sum(exp(x)), exactly as the formula reads: overflows once x exceeds ~11 (float16) or ~88
    (float32), giving inf / inf = NaN. Shown to fail, not to be used."""
    x = _float_array(x, "x")
    with np.errstate(over="ignore", invalid="ignore"):
        e = np.exp(x)
        return e / np.sum(e, axis=axis, keepdims=True)


def softmax_safe(x, axis: int = -1) -> np.ndarray:
    """Softmax with the row max subtracted first (three passes: max, sum, normalise).

    exp(x - max) <= 1 never overflows. A row of all -inf gives 0 everywhere, not NaN.
    """
    x = _float_array(x, "x")
    m = np.max(x, axis=axis, keepdims=True, initial=-np.inf)
    e = np.exp(x - safe_max(m))
    total = np.sum(e, axis=axis, keepdims=True)
    return np.divide(e, total, out=np.zeros_like(e), where=total > 0)


@dataclass(frozen=True)
class OnlineSoftmaxStep:
    """The state of the online softmax after one block of a row has been read.

    ``m``, ``l``: running max and running sum of exp(x - m) over the blocks seen so far.
    ``rescale``: exp(m_prev - m), the factor that the previous sum (and output) were multiplied by.
    ``output``: when values were given, the running normalised output acc / l; else None.
    """

    index: int  # which block, from 0
    start: int  # the block covers x[start:stop]
    stop: int
    block: np.ndarray  # the block's entries
    block_max: float
    m_prev: float
    l_prev: float
    m: float
    l: float
    rescale: float
    output: np.ndarray | None


def softmax_online_steps(x, block: int, values=None) -> Iterator[OnlineSoftmaxStep]:
    """Walk one row x (N,) block by block, yielding the running (m, l) after each block.

    With ``values`` (N,) or (N, D_v), it also carries the fused weighted sum: acc <- rescale * acc + p @ v,
    and yields the running output acc / l (the one-pass online softmax of attention).
    This is what the lessons animate; the widgets draw these states and recompute nothing.
    """
    x = _float_array(x, "x")
    if x.ndim != 1:
        raise ValueError(f"x has shape {x.shape}, but one row (N,) is expected: pass x[i] for row i")
    block = validate_block("block", block)
    acc = None
    if values is not None:
        values = _float_array(values, "values")
        if values.shape[0] != x.shape[0]:
            raise ValueError(f"values has {values.shape[0]} rows but x has {x.shape[0]} entries: they must match")
        acc = np.zeros(values.shape[1:], dtype=np.result_type(x, values))
    m, l = x.dtype.type(-np.inf), x.dtype.type(0.0)
    for index, start in enumerate(range(0, x.shape[0], block)):
        stop = min(start + block, x.shape[0])
        chunk = x[start:stop]
        block_max = np.max(chunk)
        m_new = max(m, block_max)
        if np.isneginf(m_new):  # everything so far masked: nothing to add
            rescale, p = x.dtype.type(1.0), np.zeros_like(chunk)
        else:
            rescale, p = np.exp(m - m_new), np.exp(chunk - m_new)
        l_new = rescale * l + np.sum(p)
        output = None
        if acc is not None:
            acc = rescale * acc + p @ values[start:stop]
            output = acc / l_new if l_new > 0 else np.zeros_like(acc)
        yield OnlineSoftmaxStep(index, start, stop, chunk.copy(), float(block_max), float(m), float(l),
                                float(m_new), float(l_new), float(rescale), output)
        m, l = m_new, l_new


def softmax_online(x, block: int = 64, axis: int = -1) -> np.ndarray:
    """Two-pass online softmax: pass 1 reads the row block by block and keeps only the running max m and the
    running sum l (rescaling l whenever m grows); pass 2 writes exp(x - m) / l.

    Matches ``softmax_safe`` up to rounding, for any block size. Works on any shape along ``axis``.
    """
    x = _float_array(x, "x")
    block = validate_block("block", block)
    x_last = np.moveaxis(x, axis, -1)
    m = np.full(x_last.shape[:-1], -np.inf, dtype=x.dtype)
    l = np.zeros(x_last.shape[:-1], dtype=x.dtype)
    for start in range(0, x_last.shape[-1], block):
        chunk = x_last[..., start:start + block]
        chunk_max = np.max(chunk, axis=-1)
        chunk_sum = np.sum(np.exp(chunk - safe_max(chunk_max)[..., None]), axis=-1)
        m, l = merge(m, l, chunk_max, chunk_sum)
    e = np.exp(x_last - safe_max(m)[..., None])
    out = np.divide(e, l[..., None], out=np.zeros_like(e), where=l[..., None] > 0)
    return np.moveaxis(out, -1, axis)


# --------------------------------------------------------------------------------------------- merges
def safe_max(m):
    """The running max with -inf replaced by 0, to subtract before exp: a row with nothing seen yet (m = -inf)
    then gives exp(-inf - 0) = 0 instead of exp(-inf - (-inf)) = NaN."""
    m = np.asarray(m)
    return np.where(np.isneginf(m), 0.0, m).astype(m.dtype)


def rescale_factor(m_part, m):
    """exp(m_part - m): how much statistics kept relative to max m_part shrink when the max becomes m >= m_part.

    0 where m_part is -inf (an empty part contributes nothing, even when m is -inf too), never NaN.
    """
    m_part, m = np.asarray(m_part), np.asarray(m)
    empty = np.isneginf(m_part)
    with np.errstate(invalid="ignore"):
        return np.where(empty, 0.0, np.exp(np.where(empty, 0.0, m_part - m))).astype(np.result_type(m_part, m))


def merge(m1, l1, m2, l2):
    """Merge the softmax statistics of two disjoint parts of a row.

    Part i has max m_i and sum l_i = sum(exp(x - m_i)). The whole has m = max(m1, m2) and
    l = l1 * exp(m1 - m) + l2 * exp(m2 - m). Associative and commutative, so blocks can be merged in any order
    and in parallel. Arrays broadcast elementwise. An empty part is (-inf, 0): merge(-inf, 0, -inf, 0) = (-inf, 0).
    """
    m = np.maximum(m1, m2)
    l = np.asarray(l1) * rescale_factor(m1, m) + np.asarray(l2) * rescale_factor(m2, m)
    return m, l


def merge_partials(o1, lse1, o2, lse2):
    """Combine two attention outputs computed over disjoint sets of keys, each already normalised.

    o_i: (..., D_v) normalised over its own keys, lse_i: (...) the logsumexp of its scores.
    lse = log(exp(lse1) + exp(lse2)) and o = exp(lse1 - lse) o1 + exp(lse2 - lse) o2.
    This is how split-KV decoding and ring attention combine partial results. Empty parts (lse = -inf)
    contribute nothing; two empty parts give o = 0, lse = -inf.
    """
    o1, o2 = np.asarray(o1), np.asarray(o2)
    lse1, lse2 = np.asarray(lse1), np.asarray(lse2)
    if o1.shape != o2.shape or lse1.shape != lse2.shape or o1.shape[:-1] != lse1.shape:
        raise ValueError(
            f"o1 {o1.shape}, lse1 {lse1.shape}, o2 {o2.shape}, lse2 {lse2.shape}: expected o1 and o2 of one "
            "shape (..., D) and lse1, lse2 of shape (...) (o without its last dim)"
        )
    lse = np.logaddexp(lse1, lse2)
    w1, w2 = rescale_factor(lse1, lse), rescale_factor(lse2, lse)
    return w1[..., None] * o1 + w2[..., None] * o2, lse
