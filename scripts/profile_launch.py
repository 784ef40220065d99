"""Where the host time of a tiny call goes: cProfile over 2000 forward calls and 2000 decode calls on a GPU.

Run on a CUDA machine from a checkout: ``PYTHONPATH=src python scripts/profile_launch.py``. The inputs are the
launch-cost benchmark's (``python -m flashcourse.bench overhead``); the GPU is idle, so the calls are pure host
time. Prints the functions that take the most time of their own.
"""

from __future__ import annotations

import cProfile
import pstats

import torch

from flashcourse import kernels

CALLS = 2000


def profile(call, lines: int) -> None:
    for _ in range(50):  # compile and fill the caches first
        call()
    torch.cuda.synchronize()
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(CALLS):
        call()
    torch.cuda.synchronize()
    profiler.disable()
    pstats.Stats(profiler).sort_stats("tottime").print_stats(lines)


def main() -> None:
    x = torch.randn(1, 16, 128, 64, device="cuda", dtype=torch.float16)
    q = torch.randn(1, 32, 128, device="cuda", dtype=torch.float16)
    cache = torch.randn(1, 8, 128, 128, device="cuda", dtype=torch.float16)
    with torch.no_grad():
        profile(lambda: kernels.flash_attention(x, x, x), lines=18)
        profile(lambda: kernels.flash_decode(q, cache, cache), lines=12)


if __name__ == "__main__":
    main()
