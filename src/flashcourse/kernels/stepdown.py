"""A launch that does not fit this GPU steps down to a smaller one, with a one-line warning, never a crash.

The launches ``configs`` chooses for the GPUs the course supports are compiled ahead of time for each of them
(``scripts/launch_fit.py``, run by the tests) and fit. A GPU outside that list can offer less shared memory per
block than its architecture's table assumes; Triton then raises ``OutOfResources`` when it loads the compiled
kernel, before anything runs. :func:`launch_fitting` catches that, takes the next, smaller candidate, says so
once, and remembers the step so later calls start there.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Hashable, Sequence
from typing import TypeVar

from triton.runtime.errors import OutOfResources

from .configs import KernelConfig

T = TypeVar("T")

# (kernel, device, head dim, dtype, ...) -> index of the first candidate that fitted
_FIRST_FITTING: dict[Hashable, int] = {}


def launch_fitting(key: Hashable, candidates: Sequence[KernelConfig], launch: Callable[[KernelConfig], T],
                   what: str) -> T:
    """``launch(config)`` with the first of ``candidates`` (largest first) whose kernel fits the GPU."""
    key = (key, len(candidates))  # an explicit launch (one candidate) never inherits the default list's step
    first = _FIRST_FITTING.get(key, 0)
    for index in range(first, len(candidates)):
        try:
            result = launch(candidates[index])
        except OutOfResources as error:
            if index + 1 == len(candidates):
                raise
            warnings.warn(f"{what}: launch {describe(candidates[index])} does not fit this GPU ({error}); "
                          f"stepping down to {describe(candidates[index + 1])} (slower, same results)",
                          RuntimeWarning, stacklevel=3)
            continue
        _FIRST_FITTING[key] = index
        return result
    raise ValueError(f"{what}: no launch candidates")  # an empty list is a bug of the caller


def describe(cfg: KernelConfig) -> str:
    return f"{cfg.block_m}x{cfg.block_n} tiles, {cfg.num_warps} warps, {cfg.num_stages} stages"
