"""Exercise 02, softmax: the safe softmax, the (m, l) merge, the one-pass statistics and the online softmax."""

from __future__ import annotations

import numpy as np

from .. import reference
from . import _mistakes as mistakes
from ._core import Part, compare, copies, run_check, to_numpy


def _rows(rng, hidden):
    """Rows to softmax: small, awkward, huge values (overflow), values far apart, a fully masked row, -infs."""
    big = rng.standard_normal((3, 8)) * 5 + 1000  # exp(1000) overflows float64
    far_apart = rng.standard_normal((3, 8)) * 400  # shifted by the row's min instead of its max, exp overflows
    masked = rng.standard_normal((4, 6))
    masked[1] = -np.inf  # fully masked row
    masked[2, ::2] = -np.inf
    cases = [{"x": rng.standard_normal((1, 1))}, {"x": rng.standard_normal((5, 7))}, {"x": big},
             {"x": rng.standard_normal((2, 3, 10))}, {"x": masked}, {"x": far_apart}]
    if hidden:
        cases += [{"x": rng.standard_normal((2, 64, 129)) * 30}, {"x": rng.standard_normal((7, 3)) * 800}]
    return cases


def _softmax_variants(x):
    return [(mistakes.WRONG_AXIS, lambda: reference.softmax_safe(x, axis=-2) if x.ndim > 1 else x),
            ("each row must be divided by its own sum (keepdims=True), not by the sum of the whole array",
             lambda: np.exp(x - x.max()) / np.exp(x - x.max()).sum())]


def _nan_hint(x):
    """What a NaN means on this input: a fully masked row, else an overflow (only large inputs overflow)."""
    if np.abs(x[np.isfinite(x)]).max(initial=0) > 80:
        return mistakes.NO_MAX
    if np.isneginf(x).all(axis=-1).any():
        return mistakes.MASKED_ROW_NAN
    return None


# ------------------------------------------------------------------------------------------ (a) safe softmax


def _safe_run(fns, case):
    (x,) = copies(case, "x")
    return {"p": to_numpy(fns["softmax_safe"](x), "the softmax")}


def _safe_judge(case, out):
    x = case["x"]
    compare("the softmax", out["p"], reference.softmax_safe(x), dtype=x.dtype.name,
            variants=_softmax_variants(x), nan_hint=_nan_hint(x))


SAFE = Part("ex02_a", 2, "softmax_safe", ("softmax_safe",), _rows, _safe_run, _safe_judge)


def check_softmax_safe(softmax_safe, *, hidden=False, seed=None):
    """Check ``softmax_safe(x) -> p``, softmax over the last axis, on fresh random rows (some huge, some -inf)."""
    __tracebackhide__ = True
    run_check(SAFE, {"softmax_safe": softmax_safe}, hidden=hidden, seed=seed)


# ------------------------------------------------------------------------------------------ (b) the merge


def _merge_cases(rng, hidden):
    cases = []
    for shape in [(1,), (6,), (3, 4)] + ([(50,), (2, 3, 5)] if hidden else []):
        x1, x2 = rng.standard_normal((*shape, 5)) * 3, rng.standard_normal((*shape, 7)) * 3
        m1, m2 = x1.max(-1), x2.max(-1)
        l1, l2 = np.exp(x1 - m1[..., None]).sum(-1), np.exp(x2 - m2[..., None]).sum(-1)
        cases.append({"m1": m1, "l1": l1, "m2": m2, "l2": l2})
    empty = {"m1": np.array([-np.inf, 0.5, -np.inf]), "l1": np.array([0.0, 2.0, 0.0]),
             "m2": np.array([1.0, -np.inf, -np.inf]), "l2": np.array([3.0, 0.0, 0.0])}
    return cases + [empty]


def _merge_run(fns, case):
    result = fns["merge"](*copies(case, "m1", "l1", "m2", "l2"))
    if not isinstance(result, tuple) or len(result) != 2:
        raise AssertionError(f"merge must return a tuple (m, l), got {type(result).__name__}")
    return {"m": to_numpy(result[0], "m"), "l": to_numpy(result[1], "l")}


def _merge_judge(case, out):
    m1, l1, m2, l2 = (case[n] for n in ("m1", "l1", "m2", "l2"))
    m, l = reference.merge(m1, l1, m2, l2)
    compare("m", out["m"], np.asarray(m), dtype="float64",
            variants=[("m must be the larger of the two maxima, max(m1, m2)", lambda: np.minimum(m1, m2))])
    empty_hint = ("a part with m = -inf and l = 0 is empty: it must contribute nothing, and merging two empty "
                  "parts gives (m, l) = (-inf, 0); guard exp(m_i - m) where m_i is -inf")
    with np.errstate(invalid="ignore", over="ignore"):
        compare("l", out["l"], np.asarray(l), dtype="float64", nan_hint=empty_hint,
                variants=[("the sums are added without rescaling: l = l1 * exp(m1 - m) + l2 * exp(m2 - m)",
                           lambda: l1 + l2),
                          ("the rescaling factors are inverted: use exp(m_i - m), which is <= 1",
                           lambda: l1 * np.exp(m - m1) + l2 * np.exp(m - m2))])


MERGE = Part("ex02_b", 2, "merge", ("merge",), _merge_cases, _merge_run, _merge_judge)


def check_merge(merge, *, hidden=False, seed=None):
    """Check ``merge(m1, l1, m2, l2) -> (m, l)`` on random statistics, including empty parts (-inf, 0)."""
    __tracebackhide__ = True
    run_check(MERGE, {"merge": merge}, hidden=hidden, seed=seed)


# ------------------------------------------------------------------------------------------ (c) one pass


def _stats_cases(rng, hidden):
    cases = []
    for x, block in [(rng.standard_normal((1, 1)), 4), (rng.standard_normal((3, 10)), 4),
                     (np.sort(rng.standard_normal((2, 12)) * 5, axis=-1), 3),  # the max grows every block
                     (rng.standard_normal((4, 9)) * 300, 2)]:
        cases.append({"x": x, "block": block})
    if hidden:
        cases += [{"x": np.sort(rng.standard_normal((5, 100)), axis=-1) * 40, "block": 7},
                  {"x": rng.standard_normal((2, 3, 33)), "block": 32}]
    return cases


def _stats_run(fns, case):
    (x,) = copies(case, "x")
    result = fns["online_stats"](x, case["block"])
    if not isinstance(result, tuple) or len(result) != 2:
        raise AssertionError(f"online_stats must return a tuple (m, l), got {type(result).__name__}")
    return {"m": to_numpy(result[0], "m"), "l": to_numpy(result[1], "l")}


def _stats_judge(case, out):
    x, block = case["x"], case["block"]
    m = x.max(axis=-1)
    l = np.exp(x - m[..., None]).sum(axis=-1)
    compare("m", out["m"], m, dtype=x.dtype.name, nan_hint=mistakes.NO_MAX)
    compare("l", out["l"], l, dtype=x.dtype.name, nan_hint=mistakes.NO_MAX,
            variants=[(mistakes.SUM_NOT_RESCALED, lambda: mistakes.online_stats(x, block, rescale=False)[1]),
                      ("l is the sum of exp(x - m) with the running max, all of the sum: do not take the max "
                       "of the block sums", lambda: np.exp(x - m[..., None])[..., -block:].sum(-1))])


STATS = Part("ex02_c", 3, "online_stats", ("online_stats",), _stats_cases, _stats_run, _stats_judge)


def check_online_stats(online_stats, *, hidden=False, seed=None):
    """Check ``online_stats(x, block) -> (m, l)``, one pass over the blocks of each row."""
    __tracebackhide__ = True
    run_check(STATS, {"online_stats": online_stats}, hidden=hidden, seed=seed)


# ------------------------------------------------------------------------------------------ (d) online


def _online_cases(rng, hidden):
    return [dict(case, block=block) for case, block in zip(_rows(rng, hidden), [1, 3, 4, 3, 4, 3, 16, 2], strict=False)]


def _online_run(fns, case):
    (x,) = copies(case, "x")
    return {"p": to_numpy(fns["softmax_online"](x, case["block"]), "the softmax")}


def _online_judge(case, out):
    x, block = case["x"], case["block"]

    def not_rescaled():
        m, l = mistakes.online_stats(x, block, rescale=False)
        return np.exp(x - m[..., None]) / l[..., None]

    compare("the softmax", out["p"], reference.softmax_safe(x), dtype=x.dtype.name, nan_hint=_nan_hint(x),
            variants=[(mistakes.SUM_NOT_RESCALED, not_rescaled), *_softmax_variants(x)])


ONLINE = Part("ex02_d", 2, "softmax_online", ("softmax_online",), _online_cases, _online_run, _online_judge)


def check_softmax_online(softmax_online, *, hidden=False, seed=None):
    """Check ``softmax_online(x, block) -> p``: pass 1 builds (m, l) block by block, pass 2 normalises."""
    __tracebackhide__ = True
    run_check(ONLINE, {"softmax_online": softmax_online}, hidden=hidden, seed=seed)


PARTS = [SAFE, MERGE, STATS, ONLINE]
