"""Measuring on the learner's own machine: a wall-clock timer, a peak-memory probe, and, in about a second,
NumPy's matmul rate, its memory-copy bandwidth and its read bandwidth.

Lesson 00 puts the rates on a roofline beside published GPU figures; lessons 01, 04, 05 and 06 time and weigh
their algorithms with the timer and the probe. Rates use the best of a few repeats (:func:`time_cpu`), because
the best run is the one least disturbed by other work on the machine.
"""

from __future__ import annotations

import statistics
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

__all__ = ["MachineRates", "Timing", "copy_bandwidth_gbs", "machine_rates", "matmul_gflops", "peak_memory",
           "read_bandwidth_gbs", "time_cpu"]


@dataclass(frozen=True)
class Timing:
    """Wall-clock times of repeated calls, in seconds."""

    best: float
    median: float
    repeats: int


def time_cpu(fn: Callable[[], object], *, repeats: int = 5, warmup: int = 1) -> Timing:
    """Call ``fn`` ``warmup`` times untimed, then ``repeats`` times; return best and median wall time."""
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return Timing(best=min(times), median=statistics.median(times), repeats=repeats)


def peak_memory(fn: Callable[[], object], *, device: str = "cpu") -> int:
    """Peak bytes allocated while ``fn`` runs, above what was allocated before.

    CPU: tracemalloc (NumPy reports its buffers to it). GPU: ``torch.cuda.max_memory_allocated``.
    """
    if device == "cpu":
        tracemalloc.start()
        try:
            tracemalloc.reset_peak()
            before = tracemalloc.get_traced_memory()[0]
            fn()
            return tracemalloc.get_traced_memory()[1] - before
        finally:
            tracemalloc.stop()
    import torch

    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - before


def _check_size(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name}={value!r}: a positive integer is expected (a size of zero would time nothing)")


def matmul_gflops(n: int = 512, *, dtype=np.float32, repeats: int = 20) -> float:
    """Rate of an (n x n) @ (n x n) NumPy matmul in GFLOP/s (2 n^3 FLOPs: a multiply and an add per term)."""
    _check_size("n", n)
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n)).astype(dtype)
    b = rng.standard_normal((n, n)).astype(dtype)
    timing = time_cpu(lambda: a @ b, repeats=repeats)
    return 2.0 * n**3 / timing.best / 1e9


def copy_bandwidth_gbs(megabytes: int = 64, *, repeats: int = 10) -> float:
    """Memory bandwidth of a large array copy in GB/s, counting the bytes read plus the bytes written.

    The array (``megabytes`` MB) is much larger than the CPU caches, so the copy streams through main memory.
    """
    _check_size("megabytes", megabytes)
    source = np.ones(megabytes * 1_000_000 // 8, dtype=np.float64)
    target = np.empty_like(source)
    timing = time_cpu(lambda: np.copyto(target, source), repeats=repeats)
    return 2.0 * source.nbytes / timing.best / 1e9


def read_bandwidth_gbs(megabytes: int = 64, *, repeats: int = 10) -> float:
    """Read-only memory bandwidth in GB/s: the bytes of a large array summed, divided by the time.

    A sum does one addition per 8 bytes read, far below what the processor can compute, so the time is the time
    to stream the array in from main memory. Nothing is written, unlike :func:`copy_bandwidth_gbs`.
    """
    _check_size("megabytes", megabytes)
    source = np.ones(megabytes * 1_000_000 // 8, dtype=np.float64)
    timing = time_cpu(lambda: source.sum(), repeats=repeats)
    return source.nbytes / timing.best / 1e9


@dataclass(frozen=True)
class MachineRates:
    """What :func:`machine_rates` measured: peak matmul rate (GFLOP/s), copy bandwidth (bytes read + written,
    GB/s) and read bandwidth (GB/s)."""

    matmul_gflops: float
    copy_gbs: float
    read_gbs: float

    @property
    def ridge_intensity(self) -> float:
        """FLOP/byte at which this machine stops being memory-bound: rate / bandwidth."""
        return self.matmul_gflops / self.copy_gbs


def machine_rates(*, matmul_n: int = 512, copy_megabytes: int = 64) -> MachineRates:
    """Measure the three rates (about a second on a laptop)."""
    return MachineRates(matmul_gflops(matmul_n), copy_bandwidth_gbs(copy_megabytes),
                        read_bandwidth_gbs(copy_megabytes))
