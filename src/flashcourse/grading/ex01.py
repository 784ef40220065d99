"""Exercise 01, naive attention: the scores with their scale, the causal mask, and attention itself."""

from __future__ import annotations

import numpy as np

from .. import reference
from . import _mistakes as mistakes
from ._core import Part, compare, copies, qkv_case, resolve_scale, run_check, to_numpy

# ------------------------------------------------------------------------------------------ (a) the scores


def _scores_cases(rng, hidden):
    shapes = [((), 1, 1, 4, None), ((), 5, 7, 3, None), ((2,), 16, 16, 8, 0.5), ((2, 3), 9, 4, 16, None)]
    if hidden:
        shapes += [((3,), 33, 65, 32, None), ((), 100, 1, 7, 2.0)]
    return [qkv_case(rng, lead, n_q, n_k, d, scale=scale) for lead, n_q, n_k, d, scale in shapes]


def _scores_run(fns, case):
    q, k = copies(case, "q", "k")
    return {"s": to_numpy(fns["attention_scores"](q, k, scale=case["scale"]), "the scores")}


def _scores_judge(case, out):
    q, k = case["q"], case["k"]
    raw = q @ np.swapaxes(k, -1, -2)
    scale = resolve_scale(case["scale"], q.shape[-1])
    compare("the scores", out["s"], raw * scale, dtype=q.dtype.name,
            variants=[(mistakes.SCALE_FORGOTTEN, lambda: raw), (mistakes.SCALE_TWICE, lambda: raw * scale**2),
                      ("the scale is 1/D instead of 1/sqrt(D)", lambda: raw / q.shape[-1])])


SCORES = Part("ex01_a", 2, "attention_scores", ("attention_scores",), _scores_cases, _scores_run, _scores_judge)


def check_attention_scores(attention_scores, *, hidden=False, seed=None):
    """Check ``attention_scores(q, k, scale=None) -> (..., N_q, N_k)`` on fresh random inputs."""
    __tracebackhide__ = True
    run_check(SCORES, {"attention_scores": attention_scores}, hidden=hidden, seed=seed)


# ------------------------------------------------------------------------------------------ (b) the mask


def _mask_cases(rng, hidden):
    shapes = [((), 1, 1), ((), 4, 4), ((2,), 6, 9), ((), 7, 3)]
    if hidden:
        shapes += [((2, 2), 33, 33), ((), 64, 17)]
    return [{"s": rng.standard_normal((*lead, n_q, n_k))} for lead, n_q, n_k in shapes]


def _mask_run(fns, case):
    (s,) = copies(case, "s")
    return {"masked": to_numpy(fns["apply_causal_mask"](s), "the masked scores")}


def _mask_judge(case, out):
    s = case["s"]
    n_q, n_k = s.shape[-2:]

    def masked(keep):
        return lambda: np.where(keep, s, -np.inf)

    compare("the masked scores", out["masked"], masked(reference.causal_mask(n_q, n_k))(), dtype=s.dtype.name,
            variants=[(mistakes.MASK_DIAGONAL, masked(mistakes.causal_keep(n_q, n_k, -1))),
                      (mistakes.MASK_ONE_LATE, masked(mistakes.causal_keep(n_q, n_k, 1))),
                      (mistakes.MASK_REVERSED, masked(mistakes.causal_keep(n_q, n_k, reversed_=True))),
                      ("masked entries must be -inf (so exp gives exactly 0), not 0",
                       lambda: np.where(reference.causal_mask(n_q, n_k), s, 0.0))])


MASK = Part("ex01_b", 2, "apply_causal_mask", ("apply_causal_mask",), _mask_cases, _mask_run, _mask_judge)


def check_apply_causal_mask(apply_causal_mask, *, hidden=False, seed=None):
    """Check ``apply_causal_mask(s) -> s`` with -inf where key j > query i."""
    __tracebackhide__ = True
    run_check(MASK, {"apply_causal_mask": apply_causal_mask}, hidden=hidden, seed=seed)


# ------------------------------------------------------------------------------------------ (c) attention


def _attention_cases(rng, hidden):
    shapes = [((), 1, 1, 4, False, None, 1), ((), 5, 7, 3, False, None, 1), ((2,), 16, 16, 8, True, None, 1),
              ((2, 3), 9, 4, 16, True, 0.3, 1), ((), 12, 12, 16, True, None, 60)]
    if hidden:
        shapes += [((3,), 33, 65, 32, True, None, 1), ((2,), 64, 64, 8, False, 1.5, 1),
                   ((), 40, 40, 16, False, None, 80)]
    return [qkv_case(rng, lead, n_q, n_k, d, causal=causal, scale=scale, magnitude=mag)
            for lead, n_q, n_k, d, causal, scale, mag in shapes]


def _attention_run(fns, case):
    q, k, v = copies(case, "q", "k", "v")
    o = fns["naive_attention"](q, k, v, causal=case["causal"], scale=case["scale"])
    return {"o": to_numpy(o, "the output")}


def _attention_judge(case, out):
    q, k, v = case["q"], case["k"], case["v"]
    args = dict(causal=case["causal"], scale=case["scale"])
    compare("the output", out["o"], reference.attention(q, k, v, **args), dtype=q.dtype.name,
            variants=mistakes.attention_mistakes(q, k, v, **args),
            nan_hint=mistakes.attention_nan_hint(q, k, **args))


ATTENTION = Part("ex01_c", 4, "naive_attention", ("naive_attention",), _attention_cases, _attention_run,
                 _attention_judge)


def check_naive_attention(naive_attention, *, hidden=False, seed=None):
    """Check ``naive_attention(q, k, v, causal=False, scale=None) -> o`` against reference.attention."""
    __tracebackhide__ = True
    run_check(ATTENTION, {"naive_attention": naive_attention}, hidden=hidden, seed=seed)


PARTS = [SCORES, MASK, ATTENTION]
