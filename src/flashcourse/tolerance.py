"""Tolerances for comparing an implementation with the float64 reference: one place, per dtype.

Every check in the course (tests, exercises, notebooks) calls :func:`assert_close`, and its messages say which
tolerance was used.
"""

from __future__ import annotations

import numpy as np

__all__ = ["TOLERANCES", "assert_close", "tolerance_for"]

# (rtol, atol) per input dtype, for outputs of magnitude about 1 (attention outputs, softmax, gradients of
# unit-scale inputs). Low precision accumulates rounding over the N terms of a row, hence the loose fp16/bf16.
TOLERANCES: dict[str, tuple[float, float]] = {
    "float64": (1e-9, 1e-10),
    "float32": (2e-4, 2e-5),
    "float16": (2e-2, 2e-3),
    "bfloat16": (5e-2, 1e-2),
}


def _dtype_name(x) -> str:
    """The dtype name of a dtype name, a NumPy or torch dtype, or an array or tensor: e.g. "float16"."""
    if isinstance(x, str):
        return x
    if isinstance(x, type):  # np.float16 and friends
        return np.dtype(x).name
    if hasattr(x, "dtype"):  # an array or tensor
        x = x.dtype
    if type(x).__module__.startswith("torch"):
        return str(x).replace("torch.", "")
    return np.dtype(x).name


def tolerance_for(dtype) -> tuple[float, float]:
    """(rtol, atol) for a dtype, given as a name (``"float16"``), a NumPy or torch dtype, or an array."""
    name = _dtype_name(dtype)
    if name not in TOLERANCES:
        raise ValueError(f"no tolerance for dtype {name}: expected one of {sorted(TOLERANCES)}")
    return TOLERANCES[name]


def _to_numpy(x) -> np.ndarray:
    if hasattr(x, "detach"):  # a torch tensor, possibly on a GPU or in bf16
        x = x.detach().cpu().float() if str(x.dtype) == "torch.bfloat16" else x.detach().cpu()
        return x.numpy()
    return np.asarray(x)


def assert_close(actual, expected, *, dtype=None, what: str = "output") -> None:
    """Assert ``actual`` matches ``expected`` within the tolerance of ``dtype`` (default: actual's dtype).

    Works on NumPy arrays and torch tensors. Infinities must match exactly (lse = -inf of a masked row).
    The error names the first mismatching index, both values and the tolerance used.
    """
    tol_name = _dtype_name(actual if dtype is None else dtype)
    rtol, atol = tolerance_for(tol_name)
    a = _to_numpy(actual).astype(np.float64)
    e = _to_numpy(expected).astype(np.float64)
    if a.shape != e.shape:
        raise AssertionError(f"{what} has shape {a.shape}, expected {e.shape}")
    if np.isnan(a).any():
        idx = tuple(int(i) for i in np.argwhere(np.isnan(a))[0])
        raise AssertionError(f"{what} has NaN at index {idx} (expected {e[idx]:.6g})")
    bad = ~np.isclose(a, e, rtol=rtol, atol=atol, equal_nan=False)
    if bad.any():
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        finite = np.isfinite(a) & np.isfinite(e)
        worst = np.max(np.abs(a - e)[finite]) if finite.any() else float("nan")
        raise AssertionError(
            f"{what} differs at index {idx}: got {a[idx]:.6g}, expected {e[idx]:.6g} "
            f"({int(bad.sum())} of {a.size} entries off; largest error {worst:.3g}; "
            f"tolerance for {tol_name}: rtol={rtol:g}, atol={atol:g})"
        )
