"""Exercise 06, a Triton warm-up: a fused row softmax (one program per row), then rows longer than one block
with the online softmax inside the kernel. fp32 inputs; on a CPU the kernels run in Triton's interpreter."""

from __future__ import annotations

import numpy as np

from .. import reference
from . import _mistakes as mistakes
from ._core import Part, compare, run_check, to_numpy, to_tensor


def _next_power_of_2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _rows(rng, shapes, magnitude_rows=()):
    cases = []
    for index, (n_rows, n_cols) in enumerate(shapes):
        x = rng.standard_normal((n_rows, n_cols)).astype(np.float32)
        if index in magnitude_rows:
            # exp(200) overflows float32 (max about 3.4e38 = e^88.7); values 40 sigma apart also overflow when
            # shifted by the row's min instead of its max
            x = x * np.float32(40) + np.float32(200)
        cases.append({"x": x})
    return cases


def _variants(x, block_cols):
    x64 = x.astype(np.float64)

    def zero_padded():
        padding = block_cols - x64.shape[-1]
        m = np.maximum(x64.max(axis=-1, keepdims=True), 0.0)
        e = np.exp(x64 - m)
        return e / (e.sum(axis=-1, keepdims=True) + padding * np.exp(-m))

    found = [(mistakes.WRONG_AXIS, lambda: reference.softmax_safe(x64, axis=0))]
    if block_cols > x.shape[-1]:
        found.append(("the padding columns (past n_cols) were loaded as 0 and count in the sum: load them with "
                      "other=-float('inf') so that exp gives 0", zero_padded))
    return found


# ------------------------------------------------------------------------------------------ (a) one block


def _fused_cases(rng, hidden):
    shapes = [(1, 1), (3, 5), (4, 16), (2, 33), (5, 7)]
    if hidden:
        shapes += [(7, 100), (16, 64), (3, 250)]
    return _rows(rng, shapes, magnitude_rows=(4,))


def _fused_run(fns, case):
    return {"p": to_numpy(fns["softmax_rows"](to_tensor(case["x"])), "the softmax")}


def _fused_judge(case, out):
    x = case["x"]
    compare("the softmax", out["p"], reference.softmax_safe(x.astype(np.float64)), dtype="float32",
            variants=_variants(x, _next_power_of_2(x.shape[-1])), nan_hint=mistakes.NO_MAX)


FUSED = Part("ex06_a", 4, "softmax_rows (fused, one block per row)", ("softmax_rows",), _fused_cases, _fused_run,
             _fused_judge)


def check_triton_softmax(softmax_rows, *, hidden=False, seed=None):
    """Check ``softmax_rows(x) -> p`` for x (R, C) float32 tensors, softmax over each row."""
    __tracebackhide__ = True
    run_check(FUSED, {"softmax_rows": softmax_rows}, hidden=hidden, seed=seed)


# ------------------------------------------------------------------------------------------ (b) long rows


def _long_cases(rng, hidden):
    shapes = [(1, 3), (2, 16), (3, 50), (2, 70), (4, 40)]
    if hidden:
        shapes += [(3, 129), (5, 300)]
    cases = _rows(rng, shapes, magnitude_rows=(4,))
    for case in cases[2:4]:  # rows whose max grows block after block: the rescaling matters
        case["x"] = np.sort(case["x"], axis=-1) * np.float32(8)
    return cases


def _long_run(fns, case):
    return {"p": to_numpy(fns["softmax_long_rows"](to_tensor(case["x"])), "the softmax")}


def _long_judge(case, out):
    x = case["x"]
    x64 = x.astype(np.float64)

    def not_rescaled():
        m, l = mistakes.online_stats(x64, 16, rescale=False)
        return np.exp(x64 - m[..., None]) / l[..., None]

    compare("the softmax", out["p"], reference.softmax_safe(x64), dtype="float32", nan_hint=mistakes.NO_MAX,
            variants=[(mistakes.SUM_NOT_RESCALED + " (the check assumes BLOCK = 16)", not_rescaled),
                      *_variants(x, 16 * -(-x.shape[-1] // 16))])


LONG = Part("ex06_b", 4, "softmax_long_rows (online, several blocks per row)", ("softmax_long_rows",),
            _long_cases, _long_run, _long_judge)


def check_triton_softmax_long_rows(softmax_long_rows, *, hidden=False, seed=None):
    """Check ``softmax_long_rows(x) -> p``: rows longer than one block, read block by block."""
    __tracebackhide__ = True
    run_check(LONG, {"softmax_long_rows": softmax_long_rows}, hidden=hidden, seed=seed)


PARTS = [FUSED, LONG]
