"""Exercise 09, the combine step of split-KV decoding (Flash-Decoding, Dao et al. blog 2023): partial outputs
over disjoint key ranges, each normalised, merged with their logsumexps, in NumPy and then as a Triton kernel.
The rule is ``reference.merge_partials``'."""

from __future__ import annotations

import numpy as np

from .. import reference
from . import _mistakes as mistakes
from ._core import Part, compare, copies, run_check, to_numpy, to_tensor


def _expected(o_parts, lse_parts):
    o, lse = o_parts[0].astype(np.float64), lse_parts[0].astype(np.float64)
    for o_part, lse_part in zip(o_parts[1:], lse_parts[1:], strict=True):
        o, lse = reference.merge_partials(o, lse, o_part.astype(np.float64), lse_part.astype(np.float64))
    return o, lse


def _partials(rng, splits, rows, d, *, magnitude=1.0, spread=0.0, empty=0.0, dtype=np.float64):
    """Partial results of ``splits`` splits; ``magnitude`` moves every lse, ``spread`` moves each split's by up to
    +-spread/2 (partials that far apart overflow exp(lse_s - M) unless M is the largest lse_s)."""
    o_parts = rng.standard_normal((splits, rows, d))
    lse_parts = rng.standard_normal((splits, rows)) * 3 + magnitude + rng.uniform(-0.5, 0.5, (splits, rows)) * spread
    gone = rng.random((splits, rows)) < empty  # splits with no key at all: (o, lse) = (0, -inf)
    gone[0, gone.all(axis=0)] = False  # keep at least one non-empty split per row
    o_parts[gone] = 0.0
    lse_parts[gone] = -np.inf
    return {"o_parts": o_parts.astype(dtype), "lse_parts": lse_parts.astype(dtype)}


def _combine_variants(o_parts, lse_parts):
    o_parts, lse_parts = o_parts.astype(np.float64), lse_parts.astype(np.float64)

    def weighted(weights):
        return (weights[..., None] * o_parts).sum(axis=0) / weights.sum(axis=0)[..., None]

    return [("the partial outputs are averaged without their weights: weight split s by exp(lse_s - lse)",
             lambda: o_parts.mean(axis=0)),
            ("the weights ignore empty splits' -inf or are not normalised: w_s = exp(lse_s - lse), lse = "
             "log(sum_s exp(lse_s))", lambda: (np.exp(lse_parts - lse_parts.max(0))[..., None] * o_parts).sum(0)),
            ("each split must count with weight exp(lse_s), not lse_s", lambda: weighted(lse_parts))]


def _combine_judge(case, out, dtype):
    o_parts, lse_parts = case["o_parts"], case["lse_parts"]
    o, lse = _expected(o_parts, lse_parts)
    finite = lse_parts[np.isfinite(lse_parts)]
    if np.ptp(finite) > 80:
        hint = ("subtract the largest lse_s (the max over the splits), not the smallest: exp(lse_s - M) overflows "
                "once the partial lse values differ by more than about 88 in float32 (709 in float64) unless every "
                "lse_s - M <= 0")
    elif np.abs(finite).max() > 80:
        hint = mistakes.NO_MAX
    else:
        hint = ("a split with lse = -inf is empty and must get weight 0: subtract the max lse over the splits, "
                "which is finite, instead of an -inf")
    compare("o", out["o"], o, dtype=dtype, nan_hint=hint, variants=_combine_variants(o_parts, lse_parts))
    compare("lse", out["lse"], lse, dtype=dtype, nan_hint=hint,
            variants=[("lse must be log(sum_s exp(lse_s)), not the largest lse_s",
                       lambda: lse_parts.astype(np.float64).max(axis=0))])


# ------------------------------------------------------------------------------------------ (a) NumPy combine


def _numpy_cases(rng, hidden):
    cases = [_partials(rng, 1, 1, 4), _partials(rng, 2, 3, 8), _partials(rng, 4, 5, 16, empty=0.3),
             _partials(rng, 3, 4, 8, magnitude=1000.0), _partials(rng, 4, 3, 8, spread=3000.0)]
    everything_empty = _partials(rng, 2, 3, 4)
    everything_empty["o_parts"][:, 1] = 0.0
    everything_empty["lse_parts"][:, 1] = -np.inf  # row 1 saw no key in any split: o = 0, lse = -inf
    cases.append(everything_empty)
    if hidden:
        cases += [_partials(rng, 8, 16, 32, empty=0.5), _partials(rng, 5, 2, 64, magnitude=-900.0),
                  _partials(rng, 6, 8, 16, spread=5000.0, empty=0.3)]
    return cases


def _numpy_run(fns, case):
    result = fns["combine_partials"](*copies(case, "o_parts", "lse_parts"))
    if not isinstance(result, tuple) or len(result) != 2:
        raise AssertionError(f"combine_partials must return (o, lse), got {type(result).__name__}")
    return {"o": to_numpy(result[0], "o"), "lse": to_numpy(result[1], "lse")}


COMBINE = Part("ex09_a", 3, "combine_partials", ("combine_partials",), _numpy_cases, _numpy_run,
               lambda case, out: _combine_judge(case, out, "float64"))


def check_combine_partials(combine_partials, *, hidden=False, seed=None):
    """Check ``combine_partials(o_parts (S, ..., D), lse_parts (S, ...)) -> (o (..., D), lse (...))``."""
    __tracebackhide__ = True
    run_check(COMBINE, {"combine_partials": combine_partials}, hidden=hidden, seed=seed)


# ------------------------------------------------------------------------------------------ (b) split-KV decode


def _decode_cases(rng, hidden):
    sizes = [(1, 1, 4, 1), (2, 10, 8, 3), (3, 33, 16, 4), (2, 3, 8, 5)]  # more splits than keys: empty splits
    if hidden:
        sizes += [(4, 100, 32, 7), (1, 64, 16, 64)]
    cases = [{"q": rng.standard_normal((h, d)), "k": rng.standard_normal((h, n, d)),
              "v": rng.standard_normal((h, n, d)), "num_splits": splits} for h, n, d, splits in sizes]
    # Keys of the first split 30 times larger: its lse is about 1000 above the others', so a combine that
    # shifts by the smallest partial lse overflows.
    far_apart = {"q": rng.standard_normal((2, 8)) * 30, "k": rng.standard_normal((2, 12, 8)),
                 "v": rng.standard_normal((2, 12, 8)), "num_splits": 3}
    far_apart["k"][:, :4] *= 30
    return cases + [far_apart]


def _decode_run(fns, case):
    q, k, v = copies(case, "q", "k", "v")
    return {"o": to_numpy(fns["split_kv_attention"](q, k, v, case["num_splits"]), "o")}


def _decode_judge(case, out):
    q, k, v, splits = case["q"], case["k"], case["v"], case["num_splits"]
    expected = reference.attention(q[:, None, :], k, v)[:, 0]

    def averaged():
        chunks = zip(np.array_split(k, splits, axis=1), np.array_split(v, splits, axis=1), strict=True)
        parts = [reference.attention(q[:, None, :], kc, vc)[:, 0] for kc, vc in chunks if kc.shape[1]]
        return np.mean(parts, axis=0)

    scores = np.einsum("hd,hnd->hn", q, k) / np.sqrt(q.shape[-1])
    nan_hint = ("the splits' lse values lie far apart here: within a split subtract its max score, and in the "
                "combine the largest lse_s, not the smallest (exp overflows otherwise)") if np.ptp(scores) > 80 else (
        "an empty split (no keys) must be (o, lse) = (0, -inf), and combine must give it weight 0")
    compare("o", out["o"], expected, dtype="float64", nan_hint=nan_hint,
            variants=[("the splits' outputs are averaged: combine them with their lse (your combine_partials)",
                       averaged)])


DECODE = Part("ex09_b", 2, "split_kv_attention", ("split_kv_attention",), _decode_cases, _decode_run,
              _decode_judge)


def check_split_kv_attention(split_kv_attention, *, hidden=False, seed=None):
    """Check ``split_kv_attention(q (H, D), k (H, N, D), v (H, N, D), num_splits) -> o (H, D)``."""
    __tracebackhide__ = True
    run_check(DECODE, {"split_kv_attention": split_kv_attention}, hidden=hidden, seed=seed)


# ------------------------------------------------------------------------------------------ (c) Triton combine


def _triton_cases(rng, hidden):
    cases = [_partials(rng, 1, 1, 16, dtype=np.float32), _partials(rng, 3, 5, 16, dtype=np.float32),
             _partials(rng, 4, 7, 32, empty=0.3, dtype=np.float32),
             _partials(rng, 2, 3, 16, magnitude=300.0, dtype=np.float32),
             _partials(rng, 3, 4, 16, spread=400.0, dtype=np.float32)]
    if hidden:
        cases += [_partials(rng, 8, 9, 64, empty=0.5, dtype=np.float32)]
    return cases


def _triton_run(fns, case):
    result = fns["combine_triton"](to_tensor(case["o_parts"]), to_tensor(case["lse_parts"]))
    if not isinstance(result, tuple) or len(result) != 2:
        raise AssertionError(f"combine_triton must return (o, lse), got {type(result).__name__}")
    return {"o": to_numpy(result[0], "o"), "lse": to_numpy(result[1], "lse")}


TRITON = Part("ex09_c", 3, "combine_triton", ("combine_triton",), _triton_cases, _triton_run,
              lambda case, out: _combine_judge(case, out, "float32"))


def check_combine_triton(combine_triton, *, hidden=False, seed=None):
    """Check ``combine_triton(o_parts (S, R, D), lse_parts (S, R)) -> (o (R, D), lse (R,))``, fp32 tensors."""
    __tracebackhide__ = True
    run_check(TRITON, {"combine_triton": combine_triton}, hidden=hidden, seed=seed)


PARTS = [COMBINE, DECODE, TRITON]
