"""Exercise 16, FlashAttention-4's two portable softmax ideas (Zadouri, Shah, Dao et al. 2026; lesson 14) as Triton
kernels: (a) 2^x on the FMA units (floor and fraction, a degree-3 polynomial, the floor added into the exponent
bits), (b) the online softmax's statistics with FA4's conditional rescaling (keep the old max while the new one
exceeds it by at most a threshold). float32 inputs in log2 units; on a CPU the kernels run in Triton's interpreter.
The judge compares with ``flashcourse.fa4``'s float64 and float32 references."""

from __future__ import annotations

import numpy as np

from .. import fa4
from ._core import Part, run_check, to_numpy, to_tensor

# The emulation is deterministic: the same three FMAs on the same float32 values. Allow a few ulps for another
# grouping of the polynomial (Horner's, or c0 + f (c1 + ...)), far below the polynomial's own error (about 1e-4),
# so that the hardware exp2, exact to about 1e-7, is told apart.
_SAME_AS_EMULATION = 2e-6


# ------------------------------------------------------------------------------------------ (a) emulated exp2


def _exp2_cases(rng, hidden):
    base = np.array([0.0, -0.25, -1.0, -1.5, -2.75, 0.5, 3.75, 1.0, -126.0, -125.5, -127.0, -150.0, -np.inf],
                    dtype=np.float32)
    sizes = [1, 13, 100]
    cases = [{"x": base}]
    for n in sizes + ([257, 1000] if hidden else []):
        cases.append({"x": (rng.uniform(-40.0, 8.0, n)).astype(np.float32)})
    return cases


def _exp2_run(fns, case):
    return {"y": to_numpy(fns["emulated_exp2"](to_tensor(case["x"])), "emulated_exp2's output")}


def _first_bad(bad: np.ndarray) -> int:
    return int(np.flatnonzero(bad)[0])


def _exp2_judge(case, out):
    x = case["x"]
    got = np.asarray(out["y"])
    if got.shape != x.shape:
        raise AssertionError(f"emulated_exp2 returned shape {got.shape} for x of shape {x.shape}: one value per x")
    if got.dtype != np.float32:
        raise AssertionError(f"emulated_exp2 returned {got.dtype}: float32 is expected, as x")
    expected = fa4.exp2_emulated(x)
    exact = np.exp2(x.astype(np.float64))
    with np.errstate(divide="ignore", invalid="ignore"):
        off = np.abs(got.astype(np.float64) - expected) / np.maximum(np.abs(expected), np.finfo(np.float32).tiny)
    bad = ~(off <= _SAME_AS_EMULATION)
    if not bad.any():
        return
    i = _first_bad(bad)
    where = f"x[{i}] = {x[i]!r}: yours {got[i]!r}, the emulation's {expected[i]!r} (exact 2^x = {exact[i]:.9g})"
    if x[i] < fa4.SMALLEST_EXPONENT:
        raise AssertionError(f"{where}. Diagnosis: below 2^-126 the exponent field cannot hold the result (and "
                             "-inf, a masked score, must give 0): return 0 where x < -126")
    hardware = np.exp2(x.astype(np.float32)).astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        like_hardware = np.abs(got - hardware) <= 1e-6 * np.maximum(np.abs(hardware), np.finfo(np.float32).tiny)
    if like_hardware[i]:
        raise AssertionError(f"{where}. Diagnosis: that is the exponential unit's answer (tl.exp2); this part asks "
                             "for 2^x without it: floor, fraction, the polynomial fa4.EXP2_POLY3, the exponent bits")
    truncated = x[i] < 0 and x[i] != np.floor(x[i])
    if truncated:
        whole = np.trunc(np.float64(x[i]))
        guess = np.polyval(fa4.EXP2_POLY3[::-1].astype(np.float64), x[i] - whole) * np.exp2(whole)
        if abs(got[i] - guess) <= 1e-5 * abs(guess):
            raise AssertionError(f"{where}. Diagnosis: the integer part was rounded toward zero (a cast, or "
                                 "tl.trunc), so the fraction of a negative x is negative, outside the polynomial's "
                                 "[0, 1): take tl.floor(x)")
    raise AssertionError(f"{where}. Compute frac = x - floor(x) in [0, 1), p = c0 + frac (c1 + frac (c2 + frac c3)) "
                         "with c = fa4.EXP2_POLY3, then add floor(x) << 23 to p's bits (p.to(tl.int32, "
                         "bitcast=True)) and read them back as a float")


EXP2 = Part("ex16_a", 4, "emulated_exp2", ("emulated_exp2",), _exp2_cases, _exp2_run, _exp2_judge)


def check_emulated_exp2(emulated_exp2, *, hidden=False, seed=None):
    """Check ``emulated_exp2(x) -> y`` for a 1-D float32 tensor x: 2^x on the FMA units, as ``fa4.exp2_emulated``
    (within a few ulps of it), so within ``fa4.exp2_relative_error()`` of the exact 2^x."""
    __tracebackhide__ = True
    run_check(EXP2, {"emulated_exp2": emulated_exp2}, hidden=hidden, seed=seed)


# ------------------------------------------------------------------------------------------ (b) the rescale test


def _rows(rng, rows, cols, *, climb):
    """Scores in log2 units whose max climbs along the row (so it grows block after block), with noise."""
    return (rng.standard_normal((rows, cols)) * 2.0 + np.linspace(0.0, climb, cols)).astype(np.float32)


def _stats_cases(rng, hidden):
    exact_eight = np.array([[0.0, 1.0, 9.0, 2.0, 17.5, 3.0, 20.0, 0.0]], dtype=np.float32)  # grows by exactly 8
    masked = _rows(rng, 3, 40, climb=30.0)
    masked[:, 5::7] = -np.inf  # masked scores inside a block (each block keeps a finite one)
    cases = [{"x": exact_eight, "block": 2, "threshold": 8.0},
             {"x": _rows(rng, 4, 70, climb=40.0), "block": 16, "threshold": 8.0},
             {"x": _rows(rng, 4, 70, climb=40.0), "block": 16, "threshold": 0.0},
             {"x": _rows(rng, 1, 1, climb=0.0), "block": 16, "threshold": 8.0},
             {"x": masked, "block": 8, "threshold": 8.0}]
    if hidden:
        cases += [{"x": _rows(rng, 5, 300, climb=float(rng.uniform(10, 90))), "block": int(block),
                   "threshold": float(threshold)}
                  for block, threshold in ((32, 8.0), (16, 4.0), (64, 0.0))]
    return cases


def _stats_run(fns, case):
    got = fns["row_stats"](to_tensor(case["x"]), case["block"], case["threshold"])
    if not isinstance(got, (tuple, list)) or len(got) != 3:
        raise AssertionError(f"row_stats must return three tensors (m, l, rescales), got {type(got).__name__}")
    return {"m": to_numpy(got[0], "m"), "l": to_numpy(got[1], "l"), "rescales": to_numpy(got[2], "rescales")}


def _stats_variant_p_with_new_max(x, block, threshold):
    """The trap: the max is kept (no rescale) but P is computed with the new, larger max."""
    x = np.asarray(x, dtype=np.float64)
    m, _, _ = fa4.row_stats_conditional(x, block=block, threshold=threshold)
    l = np.zeros(x.shape[0])
    kept = np.full(x.shape[0], -np.inf)
    for start in range(0, x.shape[1], block):
        tile = x[:, start:start + block]
        grown = np.maximum(kept, tile.max(axis=1))
        move = np.isneginf(kept) | (grown - kept > threshold)
        l = np.where(move & ~np.isneginf(kept), l * np.exp2(kept - grown), l)
        kept = np.where(move, grown, kept)
        l = l + np.exp2(tile - grown[:, None]).sum(axis=1)
    return l


def _stats_judge(case, out):
    x, block, threshold = case["x"], case["block"], case["threshold"]
    m, l, rescales = fa4.row_stats_conditional(x, block=block, threshold=threshold)
    rows = x.shape[0]
    for name, value in (("m", out["m"]), ("l", out["l"]), ("rescales", out["rescales"])):
        if np.asarray(value).shape != (rows,):
            raise AssertionError(f"{name} has shape {np.asarray(value).shape}: one value per row, ({rows},)")
    got_r = np.asarray(out["rescales"])
    if got_r.dtype.kind not in "iu":
        raise AssertionError(f"rescales has dtype {got_r.dtype}: a count, int32, is expected")
    got_m, got_l = np.asarray(out["m"], dtype=np.float64), np.asarray(out["l"], dtype=np.float64)
    every_time = fa4.row_stats_conditional(x, block=block, threshold=0.0)[2]
    at_least = fa4.row_stats_conditional(x, block=block, threshold=np.nextafter(threshold, -1.0))[2] \
        if threshold > 0 else rescales
    if not np.array_equal(got_r, rescales):
        i = _first_bad(got_r != rescales)
        where = f"row {i} (block {block}, threshold {threshold}): you rescaled {got_r[i]} times, expected {rescales[i]}"
        if threshold > 0 and np.array_equal(got_r, every_time):
            raise AssertionError(f"{where}. Diagnosis: you rescaled whenever the max grew; keep the old max while "
                                 "the new one exceeds it by at most the threshold (m_new - m_old <= threshold)")
        if threshold > 0 and np.array_equal(got_r, at_least):
            raise AssertionError(f"{where}. Diagnosis: a growth of exactly the threshold rescaled: the test is "
                                 "m_new - m_old > threshold (FA4 keeps the max while the growth is at most it)")
        if np.all(got_r == 0) and rescales.any():
            raise AssertionError(f"{where}. Diagnosis: you never rescaled: when the growth passes the threshold, "
                                 "l is multiplied by 2^(m_old - m_new) and m becomes m_new")
        raise AssertionError(f"{where}. Count a rescale when a block's max passes the kept max by more than the "
                             "threshold (not on a row's first block)")
    if not np.array_equal(got_m, m.astype(np.float32).astype(np.float64)):
        i = _first_bad(got_m != m.astype(np.float32))
        raise AssertionError(f"row {i}: your m is {got_m[i]!r}, expected {np.float32(m[i])!r}: m is the max the "
                             "row keeps, changed only when it rescales")
    tolerance = 2e-5 * x.shape[1] ** 0.5
    off = np.abs(got_l - l) / np.abs(l)
    if not (off <= tolerance).all():
        i = _first_bad(~(off <= tolerance))
        where = f"row {i}: your l is {got_l[i]:.7g}, expected {l[i]:.7g} (relative tolerance {tolerance:.1e})"
        trap = _stats_variant_p_with_new_max(x, block, threshold)
        if abs(got_l[i] - trap[i]) <= tolerance * abs(trap[i]):
            raise AssertionError(f"{where}. Diagnosis: P was computed with the new max while the old one was kept "
                                 "(the trap FA4's test must avoid): with the max kept, P = 2^(x - m_old), up to "
                                 "2^threshold")
        raise AssertionError(f"{where}: l = sum over the row of 2^(x - m) with the m the row keeps; on a rescale "
                             "multiply the old l by 2^(m_old - m_new) first")


STATS = Part("ex16_b", 4, "row_stats (conditional rescaling)", ("row_stats",), _stats_cases, _stats_run,
             _stats_judge)


def check_row_stats(row_stats, *, hidden=False, seed=None):
    """Check ``row_stats(x, block, threshold) -> (m, l, rescales)`` for x (R, C) float32 scores in log2 units:
    the online softmax's max and sum per row, block by block, rescaling only when the max grows by more than the
    threshold, and the number of rescales (int32)."""
    __tracebackhide__ = True
    run_check(STATS, {"row_stats": row_stats}, hidden=hidden, seed=seed)


PARTS = [EXP2, STATS]
