"""Launch cost: the host time of one call on an input so small that the GPU is idle, so the call is pure overhead.

Each provider is called many times under ``torch.no_grad()`` with one synchronisation at the end, and the wall
time per call is reported as the median of several repeats with its spread. Inputs (fp16): attention on
q = k = v of shape (1, 16, 128, 64); decoding one token, q (1, 32, 128), against a (1, 8, 128, 128) cache.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

from flashcourse.bench.providers import sdpa

CALLS = 2000
REPEATS = 5


def providers() -> dict[str, Callable[[], object]]:
    """Name -> a no-argument call on the fixed tiny inputs of the module docstring."""
    from flashcourse import kernels

    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(1, 16, 128, 64, device="cuda", dtype=torch.float16, generator=g)
    q = torch.randn(1, 32, 128, device="cuda", dtype=torch.float16, generator=g)
    cache = torch.randn(1, 8, 128, 128, device="cuda", dtype=torch.float16, generator=g)
    attend, attend_gqa = sdpa("sdpa_flash"), sdpa("sdpa_flash", enable_gqa=True)
    return {
        "flashcourse_forward": lambda: kernels.flash_attention(x, x, x),
        "sdpa_forward": lambda: attend(x, x, x),
        "flashcourse_decode": lambda: kernels.flash_decode(q, cache, cache),
        "sdpa_decode": lambda: attend_gqa(q[:, :, None], cache, cache),
    }


def us_per_call(fn: Callable[[], object], calls: int = CALLS, repeats: int = REPEATS) -> list[float]:
    """Microseconds per call in each repeat: ``calls`` calls back to back, synchronised once at the end."""
    for _ in range(50):  # compile, fill caches
        fn()
    torch.cuda.synchronize()
    per_call = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        per_call.append((time.perf_counter() - start) / calls * 1e6)
    return per_call


def run(log=print) -> list[dict]:
    """One row per provider: median microseconds per call, the spread of the repeats, and the ratio to SDPA."""
    rows = []
    with torch.no_grad():
        for name, fn in providers().items():
            times = us_per_call(fn)
            rows.append({"provider": name, "us_per_call": statistics.median(times), "us_min": min(times),
                         "us_max": max(times), "calls": CALLS, "repeats": REPEATS})
            log(f"{name:22} {rows[-1]['us_per_call']:7.1f} us per call (repeats {min(times):.1f}-{max(times):.1f})")
    by_name = {r["provider"]: r for r in rows}
    for ours, theirs in (("flashcourse_forward", "sdpa_forward"), ("flashcourse_decode", "sdpa_decode")):
        by_name[ours]["ratio_vs_sdpa"] = by_name[ours]["us_per_call"] / by_name[theirs]["us_per_call"]
    return rows
