"""Where the host time of a tiny call goes: cProfile over 2000 calls each of our forward, training step and decode.

Run on a CUDA machine from a checkout: ``PYTHONPATH=src python benchmarks/profile_launch.py``. The calls are the
launch-cost benchmark's (``python -m flashcourse.bench overhead``); the GPU is idle, so the calls are pure host
time. Prints the functions that take the most time of their own. Without a GPU, ``benchmarks/host_profile.py`` measures
the Python part of the same calls with the launches stubbed.
"""

from __future__ import annotations

import cProfile
import pstats

import torch

from flashcourse.bench import overhead

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
    calls = overhead.providers()
    for name, lines in (("flashcourse_forward", 18), ("flashcourse_train_step", 25), ("flashcourse_decode", 12)):
        print(f"=== {name}")
        with torch.set_grad_enabled(name in overhead.TRAINING):
            profile(calls[name], lines=lines)


if __name__ == "__main__":
    main()
