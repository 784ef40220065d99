"""The learner's own machine, measured in about a second: NumPy's matmul rate, its memory-copy bandwidth and its
read bandwidth.

Lesson 00 puts these numbers on a roofline beside published GPU figures. Both use the best of a few
repeats (``bench.time_cpu``), because the best run is the one least disturbed by other work on the machine.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .bench import time_cpu

__all__ = ["MachineRates", "copy_bandwidth_gbs", "machine_rates", "matmul_gflops", "read_bandwidth_gbs"]


def matmul_gflops(n: int = 512, *, dtype=np.float32, repeats: int = 20) -> float:
    """Rate of an (n x n) @ (n x n) NumPy matmul in GFLOP/s (2 n^3 FLOPs: a multiply and an add per term)."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n)).astype(dtype)
    b = rng.standard_normal((n, n)).astype(dtype)
    timing = time_cpu(lambda: a @ b, repeats=repeats)
    return 2.0 * n**3 / timing.best / 1e9


def copy_bandwidth_gbs(megabytes: int = 64, *, repeats: int = 10) -> float:
    """Memory bandwidth of a large array copy in GB/s, counting the bytes read plus the bytes written.

    The array (``megabytes`` MB) is much larger than the CPU caches, so the copy streams through main memory.
    """
    source = np.ones(megabytes * 1_000_000 // 8, dtype=np.float64)
    target = np.empty_like(source)
    timing = time_cpu(lambda: np.copyto(target, source), repeats=repeats)
    return 2.0 * source.nbytes / timing.best / 1e9


def read_bandwidth_gbs(megabytes: int = 64, *, repeats: int = 10) -> float:
    """Read-only memory bandwidth in GB/s: the bytes of a large array summed, divided by the time.

    A sum does one addition per 8 bytes read, far below what the processor can compute, so the time is the time
    to stream the array in from main memory. Nothing is written, unlike :func:`copy_bandwidth_gbs`.
    """
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
