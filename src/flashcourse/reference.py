"""The specification, in plain NumPy: attention (and its variants, as rules), three softmaxes and the (m, l) merge.

Everything else in the course is checked against these functions.

Compute precision: every function computes in the floating dtype of its inputs (NumPy's result type; float16,
float32 and float64 are accepted) and returns that dtype. Pass float64 to get the specification itself; pass
float16 to watch the naive softmax overflow. Integer or complex inputs are rejected.

Edge semantics (shared by every implementation in the course): a row whose entries are all masked, i.e. all
``-inf``, has softmax 0 everywhere, attention output 0 and logsumexp ``-inf``; never NaN.

Attention variants (sliding window, soft-capping, ALiBi, packed documents, a custom ``mask_mod``, grouped-query
attention) are options of :func:`attention`; :func:`attention_rule` turns them into an :class:`AttentionRule`,
the one place where options become a boolean mask and a bias for a block of (query, key) indices. The tiled
algorithms and the IO simulator use the same rule.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

# The window rule, written once for the reference and the kernels (validation.py imports nothing of ours).
from .validation import check_window as validate_window

__all__ = [
    "AttentionRule",
    "GroupedHeads",
    "attention",
    "attention_lse",
    "attention_rule",
    "CAUSAL_VALUES",
    "causal_mask",
    "group_heads",
    "merge",
    "merge_partials",
    "OnlineSoftmaxStep",
    "rescale_factor",
    "resolve_scale",
    "rule_of",
    "safe_max",
    "softmax_naive",
    "softmax_online",
    "softmax_online_steps",
    "softmax_safe",
    "validate_block",
    "validate_qkv",
    "validate_window",
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


def validate_qkv(q, k, v, *, gqa: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Check attention inputs and return them as arrays of one common float dtype.

    q: (..., N_q, D), k: (..., N_k, D), v: (..., N_k, D_v); the leading dims of all three must be equal, except
    that with ``gqa=True`` and the (B, H, N, D) layout k and v may have fewer heads H_kv, with H_q % H_kv == 0.
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
    if gqa and q.ndim == k.ndim == v.ndim == 4 and k.shape[:2] == v.shape[:2] and k.shape[0] == q.shape[0]:
        if k.shape[1] == 0 or q.shape[1] % k.shape[1]:
            raise ValueError(
                f"q has {q.shape[1]} heads and k, v have {k.shape[1]}: grouped-query attention needs H_q to be a "
                "multiple of H_kv (query head h uses KV head h // (H_q // H_kv))")
    elif not (q.shape[:-2] == k.shape[:-2] == v.shape[:-2]):
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


# --------------------------------------------------------------------------------------------- variants as rules
CAUSAL_VALUES = (False, True, "top_left", "bottom_right")


@dataclass(frozen=True, eq=False)
class AttentionRule:
    """The attention options as one rule: which keys each query sees, and what happens to its score.

    Built and checked by :func:`attention_rule`. One diagonal per call: query i sits at key position
    i + shift, with shift = 0 under "top_left" causal (the first query lines up with the first key, SDPA's
    ``is_causal``) and shift = N_k - N_q otherwise ("bottom_right" causal, or no causal mask: the last query
    lines up with the last key, as in the FlashAttention library). The causal mask (key j <= i + shift), the
    window and ALiBi's distance all measure from that diagonal. ``causal`` is None, "top_left" or "bottom_right".
    """

    n_q: int
    n_k: int
    causal: str | None = None
    window: tuple[int, int] | None = None  # (left, right) keys around the query, -1: unbounded; never (-1, -1)
    softcap: float | None = None  # scores become softcap * tanh(score / softcap)
    alibi_slopes: np.ndarray | None = None  # (H_q,): bias -slope_h * |position - j|
    document_ids: np.ndarray | None = None  # (B, N): a query sees the keys of its own document only
    mask_mod: Callable | None = None  # (b, h, q_idx, kv_idx) -> bool array, ANDed with the rest

    @property
    def shift(self) -> int:
        """The call's diagonal: query i sits at key position i + shift (0 for top-left causal, else N_k - N_q)."""
        return 0 if self.causal == "top_left" else self.n_k - self.n_q

    @property
    def masks(self) -> bool:
        """True when the rule can hide a key from a query (anything but soft-capping and ALiBi)."""
        return any(x is not None for x in (self.causal, self.window, self.document_ids, self.mask_mod))

    @property
    def only_causal(self) -> bool:
        """True when the causal mask is the only one: its partial tiles are the "diagonal" ones of lesson 03."""
        return self.causal is not None and all(x is None for x in (self.window, self.document_ids, self.mask_mod))

    def block(self, b, h, q_idx, kv_idx, *, with_bias: bool = True) -> tuple[np.ndarray, np.ndarray | float]:
        """The mask (True = query ``q_idx`` sees key ``kv_idx``) and the additive bias of a block of pairs.

        b, h, q_idx, kv_idx: integer arrays that broadcast together (batch, query head, query and key index),
        e.g. q_idx (B_q, 1) and kv_idx (1, B_k) for one tile. Every option is ANDed into one mask; the bias is
        ALiBi's (0.0 without it, or with ``with_bias=False``). The Triton kernels evaluate the same rule.
        """
        position = q_idx + self.shift  # the query's position among the keys: the call's one diagonal
        keep = np.ones((), dtype=bool)
        if self.causal is not None:
            keep = keep & (kv_idx <= position)
        if self.window is not None:
            left, right = self.window
            if left >= 0:
                keep = keep & (kv_idx >= position - left)
            if right >= 0:
                keep = keep & (kv_idx <= position + right)
        if self.document_ids is not None:
            keep = keep & (self.document_ids[b, q_idx] == self.document_ids[b, kv_idx])
        if self.mask_mod is not None:
            keep = keep & _call_mask_mod(self.mask_mod, b, h, q_idx, kv_idx)
        bias = 0.0
        if self.alibi_slopes is not None and with_bias:
            bias = -self.alibi_slopes[h] * np.abs(position - kv_idx)
        return keep, bias

    def scores(self, s: np.ndarray, b, h, q_idx, kv_idx, *, mask: bool = True) -> np.ndarray:
        """The scaled scores s = scale * q.k of a block as the softmax sees them: soft-capped, then biased, then
        -inf where the rule hides the key. ``mask=False`` for a tile known to be full (FlexAttention's full
        blocks: the score modification still applies, the mask is not evaluated). Stays in s's dtype."""
        if self.softcap is not None:
            s = s.dtype.type(self.softcap) * np.tanh(s / s.dtype.type(self.softcap))
        if not (mask and self.masks) and self.alibi_slopes is None:
            return s
        keep, bias = self.block(b, h, q_idx, kv_idx)
        s = s + np.asarray(bias, dtype=s.dtype)
        return np.where(keep, s, s.dtype.type(-np.inf)) if mask and self.masks else s

    def softcap_grad(self, s: np.ndarray) -> np.ndarray | float:
        """d(capped score)/d(score) = 1 - tanh(s / softcap)^2 at the scaled scores s (1.0 without soft-capping):
        the backward multiplies dS by it."""
        if self.softcap is None:
            return 1.0
        return 1 - np.tanh(s / s.dtype.type(self.softcap)) ** 2

    def tile_kinds(self, b, h, q_start: int, q_stop: int, block_k: int) -> list[str]:
        """The kind of every tile in one row of tiles, queries [q_start, q_stop) against key blocks of block_k,
        as FlexAttention's block mask classifies them: the rule is evaluated for every (b, h, query, key) pair.

        "skipped": no pair visible (never loaded, never computed); "full": every pair visible (no mask needed);
        a partial tile is "diagonal" when the causal mask is the only one (lesson 03's name), else "masked".
        """
        if self.n_k == 0:
            return []
        if not self.masks:
            return ["full"] * -(-self.n_k // block_k)
        keep, _ = self.block(b, h, np.arange(q_start, q_stop)[:, None], np.arange(self.n_k)[None, :],
                             with_bias=False)
        rows = np.broadcast_to(keep, np.broadcast_shapes(np.shape(b), np.shape(h), keep.shape,
                                                         (q_stop - q_start, self.n_k))).reshape(-1, self.n_k)
        starts = np.arange(0, self.n_k, block_k)
        seen = np.logical_or.reduceat(rows.any(axis=0), starts)
        full = np.logical_and.reduceat(rows.all(axis=0), starts)
        partial = "diagonal" if self.only_causal else "masked"
        return ["full" if f else partial if a else "skipped" for a, f in zip(seen, full, strict=True)]


def _call_mask_mod(mask_mod: Callable, b, h, q_idx, kv_idx) -> np.ndarray:
    """mask_mod's answer for a block, checked: a boolean array that broadcasts with the indices."""
    try:
        keep = mask_mod(b, h, q_idx, kv_idx)
    except ValueError as error:
        if "truth value of an array" in str(error):
            raise ValueError(
                "mask_mod used `and`, `or` or `not` on index arrays, which Python cannot do elementwise: use "
                "&, | and ~ with parentheses, e.g. (q_idx >= kv_idx) & (q_idx - kv_idx < 128)") from error
        raise
    keep = np.asarray(keep)
    if keep.dtype != bool:
        raise TypeError(f"mask_mod returned dtype {keep.dtype}, but a boolean array (True = the query sees the key) "
                        "is expected: return a comparison, e.g. q_idx >= kv_idx")
    indices = np.broadcast_shapes(*(np.shape(x) for x in (b, h, q_idx, kv_idx)))
    try:
        np.broadcast_shapes(keep.shape, indices)
    except ValueError:
        raise ValueError(f"mask_mod returned shape {keep.shape}, which does not broadcast with the index arrays' "
                         f"shape {indices}: compute it elementwise from b, h, q_idx and kv_idx") from None
    return keep


def _needs_layout(name: str, value, dims_known: bool) -> None:
    if value is not None and not dims_known:
        raise ValueError(f"{name} needs q, k, v in the (B, H, N, D) layout, because it depends on the batch and the "
                         "head: pass 4-dim arrays (batch, heads, positions, head dim)")


def attention_rule(n_q: int, n_k: int, *, batch: int | None = None, heads: int | None = None, causal=False,
                   window=None, softcap=None, alibi_slopes=None, document_ids=None,
                   mask_mod=None) -> AttentionRule:
    """Check the attention options and return them as an :class:`AttentionRule`.

    n_q, n_k: the numbers of queries and keys; batch, heads: B and H_q of the (B, H, N, D) layout, or None for
    another layout (then alibi_slopes, document_ids and mask_mod, which name a batch or head, are refused).
    causal: False, True (= "top_left"), "top_left" or "bottom_right"; window: (left, right) ints >= -1, -1 =
    unbounded; softcap: a number > 0; alibi_slopes: (H_q,) floats; document_ids: (B, N) ints, N_q = N_k;
    mask_mod: a vectorised function (b, h, q_idx, kv_idx) -> bool array. Raises TypeError for a wrong type
    and ValueError for a wrong value, naming the argument and what was expected.
    """
    if isinstance(causal, (bool, np.bool_)):
        causal = "top_left" if causal else None
    elif not (isinstance(causal, str) and causal in CAUSAL_VALUES):
        raise ValueError(f"causal must be False, True, 'top_left' or 'bottom_right', got {causal!r}")
    window = validate_window(window)
    if softcap is not None:
        if isinstance(softcap, (bool, np.bool_)) or not isinstance(softcap, (int, float, np.integer, np.floating)):
            raise TypeError(f"softcap must be a number > 0, got {softcap!r} of type {type(softcap).__name__}")
        if not (np.isfinite(softcap) and softcap > 0):
            raise ValueError(f"softcap must be a finite number > 0 (e.g. 50.0, Gemma 2's), got {softcap!r}; "
                             "pass softcap=None for no soft-capping")
        softcap = float(softcap)
    _needs_layout("alibi_slopes", alibi_slopes, heads is not None)
    _needs_layout("document_ids", document_ids, batch is not None)
    _needs_layout("mask_mod", mask_mod, batch is not None and heads is not None)
    if alibi_slopes is not None:
        alibi_slopes = np.asarray(alibi_slopes)
        if alibi_slopes.dtype.kind != "f":
            raise TypeError(f"alibi_slopes has dtype {alibi_slopes.dtype}, but floats are expected (one slope per "
                            "query head)")
        if alibi_slopes.shape != (heads,):
            raise ValueError(f"alibi_slopes has shape {alibi_slopes.shape}, expected ({heads},): one slope per "
                             "query head")
    if document_ids is not None:
        document_ids = np.asarray(document_ids)
        if n_q != n_k:
            raise ValueError(f"document_ids needs as many queries as keys (packed documents, self-attention), got "
                             f"N_q = {n_q} and N_k = {n_k}")
        if document_ids.dtype.kind not in "iu":
            raise ValueError(f"document_ids has dtype {document_ids.dtype}, but integers are expected (the document "
                             "of each position, e.g. np.repeat(np.arange(3), lengths))")
        if document_ids.shape != (batch, n_k):
            raise ValueError(f"document_ids has shape {document_ids.shape}, expected ({batch}, {n_k}): the document "
                             "of every position of every batch entry")
    if mask_mod is not None and not callable(mask_mod):
        raise TypeError(f"mask_mod must be a function (b, h, q_idx, kv_idx) -> bool array, got "
                        f"{type(mask_mod).__name__}")
    return AttentionRule(n_q, n_k, causal, window, softcap, alibi_slopes, document_ids, mask_mod)


def rule_of(q: np.ndarray, k: np.ndarray, **options) -> AttentionRule:
    """The rule of validated inputs q (..., N_q, D), k (..., N_k, D) and attention options; the (B, H, N, D)
    layout gives the batch and heads that ALiBi, documents and mask_mod need."""
    four_dims = q.ndim == 4
    return attention_rule(q.shape[-2], k.shape[-2], batch=q.shape[0] if four_dims else None,
                          heads=q.shape[1] if four_dims else None, **options)


@dataclass(frozen=True)
class GroupedHeads:
    """q, k, v arranged so that the query heads sharing one K/V head sit side by side (grouped-query attention):
    q (..., G, N_q, D), k (..., 1, N_k, D), v (..., 1, N_k, D_v) with G = H_q // H_kv (G = 1 without GQA and
    for layouts other than (B, H, N, D)), so q @ k^T broadcasts each K/V head over its group without copying it.
    ``b``, ``h``: the batch and query-head index of each row, broadcastable against (..., G, N_q, N_k)."""

    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    b: np.ndarray
    h: np.ndarray
    lead: tuple[int, ...]  # q's leading dims, to put results back in q's layout

    def ungroup(self, x: np.ndarray, trailing: int) -> np.ndarray:
        """(..., G, N_q, ...) with ``trailing`` dims from N_q on -> q's layout (..., H_q, N_q, ...)."""
        return x.reshape(*self.lead, *x.shape[x.ndim - trailing:])


def group_heads(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> GroupedHeads:
    """Validated q, k, v (see :func:`validate_qkv` with ``gqa=True``) as :class:`GroupedHeads`."""
    if q.ndim == 4:
        batch, heads, kv_heads = q.shape[0], q.shape[1], k.shape[1]
        group = heads // kv_heads
        grouped_q = q.reshape(batch, kv_heads, group, *q.shape[2:])
        b = np.arange(batch).reshape(batch, 1, 1, 1, 1)
        h = np.arange(heads).reshape(1, kv_heads, group, 1, 1)  # query head kv_head * group + g
    else:
        grouped_q, b, h = q[..., None, :, :], np.array(0), np.array(0)
    return GroupedHeads(grouped_q, k[..., None, :, :], v[..., None, :, :], b, h, q.shape[:-2])


def attention_lse(q, k, v, *, causal=False, scale=None, mask=None, window=None, softcap=None, alibi_slopes=None,
                  document_ids=None, mask_mod=None) -> tuple[np.ndarray, np.ndarray]:
    """Naive attention that also returns each row's logsumexp: the (o, lse) a FlashAttention forward returns.

    Args:
        q: (..., N_q, D) queries: a float16, float32 or float64 array (or what NumPy turns into one).
        k, v: (..., N_k, D) keys and (..., N_k, D_v) values, q's leading dims. Grouped-query attention: q
            (B, H_q, N_q, D) with k, v (B, H_kv, N_k, D), H_q a multiple of H_kv.
        causal: False (default): no causal mask. True or "top_left": query i sees keys j <= i (SDPA's
            ``is_causal``). "bottom_right": query i sees keys j <= i + N_k - N_q (the last query lined up with
            the last key). With N_q = N_k the two are the same mask.
        scale: the factor on q.k; None (default) means 1/sqrt(D).
        mask: None (default) or a boolean array broadcastable to (..., N_q, N_k), True = keep.
        window: None (default) or (left, right), ints >= -1, -1 = unbounded: query i sees keys
            c - left <= j <= c + right, c being query i's key on the call's diagonal (below).
        softcap: None (default) or a number > 0: scores s become softcap * tanh(s / softcap).
        alibi_slopes: None (default) or (H_q,) floats, (B, H, N, D) inputs only: head h adds
            -alibi_slopes[h] * |c - j| to each score, after the softcap.
        document_ids: None (default) or (B, N) ints, N = N_q = N_k: query i sees key j only in its own
            document.
        mask_mod: None (default) or a vectorised function (b, h, q_idx, kv_idx) -> bool array, True = keep.

    The call's diagonal: causal, window and ALiBi measure from one diagonal, query i lined up with key
    c = i + shift: shift = 0 with top-left causal, shift = N_k - N_q with bottom-right causal and with
    causal=False (as the FlashAttention library does); with N_q = N_k both give c = i. Every mask combines by
    AND; a row that sees no key gets o = 0 and lse = -inf, never NaN. Computes in the inputs' dtype (pass
    float64 for the specification); :func:`attention_rule` checks the options, with errors that name them.

    Returns:
        o: (..., N_q, D_v) and lse: (..., N_q), the natural-log logsumexp of each row's final scores.

    Example::

        q, k, v = np.random.default_rng(0).standard_normal((3, 2, 4, 128, 64))
        o, lse = attention_lse(q, k, v, causal="bottom_right", window=(31, 0))  # (2, 4, 128, 64), (2, 4, 128)
    """
    q, k, v = validate_qkv(q, k, v, gqa=True)
    rule = rule_of(q, k, causal=causal, window=window, softcap=softcap, alibi_slopes=alibi_slopes,
                   document_ids=document_ids, mask_mod=mask_mod)
    scale = resolve_scale(scale, q.shape[-1])
    g = group_heads(q, k, v)
    s = (g.q @ np.swapaxes(g.k, -1, -2)) * q.dtype.type(scale)  # (..., G, N_q, N_k)
    s = rule.scores(s, g.b, g.h, np.arange(q.shape[-2])[:, None], np.arange(k.shape[-2])[None, :])
    if mask is not None:
        s = np.where(_broadcast_mask(mask, g.ungroup(s, 2).shape).reshape(s.shape), s, s.dtype.type(-np.inf))
    p = softmax_safe(s, axis=-1)
    return g.ungroup(p @ g.v, 2), g.ungroup(_logsumexp_rows(s), 1)


def _broadcast_mask(mask, shape: tuple[int, ...]) -> np.ndarray:
    mask = np.asarray(mask)
    if mask.dtype != bool:
        raise TypeError(f"mask has dtype {mask.dtype}, but a boolean mask (True = keep) is expected")
    try:
        return np.broadcast_to(mask, shape)
    except ValueError:
        raise ValueError(
            f"mask has shape {mask.shape}, which does not broadcast to the scores' shape {shape}") from None


def attention(q, k, v, *, causal=False, scale=None, mask=None, window=None, softcap=None, alibi_slopes=None,
              document_ids=None, mask_mod=None) -> np.ndarray:
    """softmax(scale * q @ k^T + masks) @ v, materialising the full N_q x N_k score matrix: the specification.

    The options are the kernels' (``flashcourse.kernels.flash_attention``), with the same meanings.

    Args:
        q: (..., N_q, D) queries: a float16, float32 or float64 array (or what NumPy turns into one).
        k, v: (..., N_k, D) keys and (..., N_k, D_v) values, q's leading dims. Grouped-query attention: q
            (B, H_q, N_q, D) with k, v (B, H_kv, N_k, D), H_q a multiple of H_kv.
        causal: False (default): no causal mask. True or "top_left": query i sees keys j <= i (SDPA's
            ``is_causal``). "bottom_right": query i sees keys j <= i + N_k - N_q (the last query lined up with
            the last key). With N_q = N_k the two are the same mask.
        scale: the factor on q.k; None (default) means 1/sqrt(D).
        mask: None (default) or a boolean array broadcastable to (..., N_q, N_k), True = keep.
        window: None (default) or (left, right), ints >= -1, -1 = unbounded: query i sees keys
            c - left <= j <= c + right, c being query i's key on the call's diagonal (below).
        softcap: None (default) or a number > 0: scores s become softcap * tanh(s / softcap).
        alibi_slopes: None (default) or (H_q,) floats, (B, H, N, D) inputs only: head h adds
            -alibi_slopes[h] * |c - j| to each score, after the softcap.
        document_ids: None (default) or (B, N) ints, N = N_q = N_k: query i sees key j only in its own
            document.
        mask_mod: None (default) or a vectorised function (b, h, q_idx, kv_idx) -> bool array, True = keep.

    The call's diagonal: causal, window and ALiBi measure from one diagonal, query i lined up with key
    c = i + shift: shift = 0 with top-left causal, shift = N_k - N_q with bottom-right causal and with
    causal=False (as the FlashAttention library does); with N_q = N_k both give c = i. Every mask combines by
    AND; a row that sees no key gets o = 0 and lse = -inf, never NaN. Computes in the inputs' dtype (pass
    float64 for the specification); :func:`attention_rule` checks the options, with errors that name them.

    Returns:
        o: (..., N_q, D_v), in the inputs' dtype.

    Example::

        q, k, v = np.random.default_rng(0).standard_normal((3, 1, 2, 16, 8))  # (B, H, N, D) each
        o = attention(q, k, v, causal=True)  # (1, 2, 16, 8) float64
    """
    return attention_lse(q, k, v, causal=causal, scale=scale, mask=mask, window=window, softcap=softcap,
                         alibi_slopes=alibi_slopes, document_ids=document_ids, mask_mod=mask_mod)[0]


def _logsumexp_rows(s: np.ndarray) -> np.ndarray:
    """log(sum(exp(s), axis=-1)) without overflow; rows of all -inf give -inf."""
    m = np.max(s, axis=-1, initial=-np.inf)
    m_safe = safe_max(m)
    with np.errstate(divide="ignore"):
        return m_safe + np.log(np.sum(np.exp(s - m_safe[..., None]), axis=-1))


# --------------------------------------------------------------------------------------------- softmax
def softmax_naive(x, axis: int = -1) -> np.ndarray:
    """exp(x) / sum(exp(x)), exactly as the formula reads: overflows once x exceeds ~11 (float16) or ~88
    (float32), giving inf / inf = NaN. Shown to fail, not to be used.

    Args:
        x: a float16 / float32 / float64 array of any shape.
        axis: the axis to normalise (default -1, the last).

    Returns:
        An array like x (its shape and dtype); NaN where exp overflowed.

    Example::

        softmax_naive(np.array([1.0, 2.0, 1000.0], dtype=np.float32))  # [0, 0, nan]: exp(1000) is inf
    """
    x = _float_array(x, "x")
    with np.errstate(over="ignore", invalid="ignore"):
        e = np.exp(x)
        return e / np.sum(e, axis=axis, keepdims=True)


def softmax_safe(x, axis: int = -1) -> np.ndarray:
    """Softmax with the row max subtracted first (three passes over the row: max, sum, normalise).

    exp(x - max) <= 1 never overflows. A row of all -inf gives 0 everywhere, not NaN.

    Args:
        x: a float16 / float32 / float64 array of any shape.
        axis: the axis to normalise (default -1, the last).

    Returns:
        An array like x (its shape and dtype), each slice along ``axis`` summing to 1 (or all 0).

    Example::

        softmax_safe(np.array([1.0, 2.0, 1000.0], dtype=np.float32))  # [0, 0, 1]
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

    Matches :func:`softmax_safe` up to rounding, for any block size.

    Args:
        x: a float16 / float32 / float64 array of any shape.
        block: entries of the row read at a time in pass 1, an int >= 1 (default 64).
        axis: the axis to normalise (default the last).

    Returns:
        An array like x (its shape and dtype); a row of all -inf gives 0 everywhere.

    Example::

        x = np.random.default_rng(0).standard_normal((4, 1000))
        np.allclose(softmax_online(x, block=128), softmax_safe(x))  # True
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
    and in parallel. An empty part is (-inf, 0): merge(-inf, 0, -inf, 0) = (-inf, 0).

    Args:
        m1, l1, m2, l2: numbers or float arrays that broadcast together (one entry per row).

    Returns:
        (m, l): the whole row's max and sum of exp(x - m), broadcast shape.

    Example::

        x = np.array([1.0, 5.0, 2.0, 3.0])
        merge(1.0, np.exp(0.0), 5.0, np.exp(-3.0) + 1 + np.exp(-2.0))  # (5.0, sum(exp(x - 5)))
    """
    m = np.maximum(m1, m2)
    l = np.asarray(l1) * rescale_factor(m1, m) + np.asarray(l2) * rescale_factor(m2, m)
    return m, l


def merge_partials(o1, lse1, o2, lse2):
    """Combine two attention outputs computed over disjoint sets of keys, each already normalised.

    lse = log(exp(lse1) + exp(lse2)) and o = exp(lse1 - lse) o1 + exp(lse2 - lse) o2. This is how split-KV
    decoding and ring attention combine partial results. Empty parts (lse = -inf) contribute nothing; two
    empty parts give o = 0, lse = -inf.

    Args:
        o1, o2: (..., D_v), each normalised over its own keys (one shape).
        lse1, lse2: (...), the logsumexp of each part's scores (o's shape without its last dim).

    Returns:
        (o, lse): (..., D_v) and (...), as if attention had seen both sets of keys at once.

    Example::

        o1, lse1 = attention_lse(q, k[..., :64, :], v[..., :64, :])
        o2, lse2 = attention_lse(q, k[..., 64:, :], v[..., 64:, :])
        o, lse = merge_partials(o1, lse1, o2, lse2)  # == attention_lse(q, k, v)
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
