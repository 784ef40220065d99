"""Launch cost: the host time of one call on an input so small that the GPU is idle, so the call is pure overhead.

Each provider is called many times with one synchronisation at the end, and the wall time per call is reported
as the median of several repeats with its spread. SDPA is the call a user writes, plain
``F.scaled_dot_product_attention`` with no ``sdpa_kernel`` context around it: that context alone costs tens of
microseconds a call, which made an earlier comparison look even (meta ``"sdpa_call": "plain"``). Inputs (fp16):

- ``*_forward``: attention on q = k = v of shape (1, 16, 128, 64), under ``torch.no_grad()``;
- ``*_decode``: one token, q (1, 32, 128), against a (1, 8, 128, 128) cache (SDPA with ``enable_gqa=True``),
  under ``torch.no_grad()``;
- ``*_train_step``: causal attention on (1, 16, 128, 64) inputs that require grad, forward and backward through
  autograd (``torch.autograd.grad``, so no gradient accumulates from call to call).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

CALLS = 2000
REPEATS = 5
WARMUP = 50  # calls before timing: compile, fill the launch caches
PAIRS = (("flashcourse_forward", "sdpa_forward"), ("flashcourse_decode", "sdpa_decode"),
         ("flashcourse_train_step", "sdpa_train_step"))
TRAINING = ("flashcourse_train_step", "sdpa_train_step")  # timed with autograd on; the others under no_grad


def meta() -> dict:
    """What the results file's meta records beside the environment: how SDPA was called and how often."""
    return {"sdpa_call": "plain", "calls": CALLS, "repeats": REPEATS}


def providers(device: str = "cuda") -> dict[str, Callable[[], object]]:
    """Name -> a no-argument call on the fixed tiny inputs of the module docstring."""
    import torch.nn.functional as F

    from flashcourse import kernels

    g = torch.Generator(device=device).manual_seed(0)

    def randn(*shape, grad=False):
        return torch.randn(shape, device=device, dtype=torch.float16, generator=g, requires_grad=grad)

    x = randn(1, 16, 128, 64)
    q = randn(1, 32, 128)
    q_rows = q[:, :, None]  # (1, 32, 1, 128): SDPA wants a query axis; made once, outside the timed call
    cache = randn(1, 8, 128, 128)
    tq, tk, tv = (randn(1, 16, 128, 64, grad=True) for _ in range(3))
    do = randn(1, 16, 128, 64)

    def train_step(attend):
        return lambda: torch.autograd.grad(attend(tq, tk, tv), (tq, tk, tv), do)

    return {
        "flashcourse_forward": lambda: kernels.flash_attention(x, x, x),
        "sdpa_forward": lambda: F.scaled_dot_product_attention(x, x, x),
        "flashcourse_decode": lambda: kernels.flash_decode(q, cache, cache),
        "sdpa_decode": lambda: F.scaled_dot_product_attention(q_rows, cache, cache, enable_gqa=True),
        "flashcourse_train_step": train_step(lambda q, k, v: kernels.flash_attention(q, k, v, causal=True)),
        "sdpa_train_step": train_step(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)),
    }


def kernels_run(device: str = "cuda") -> dict[str, str]:
    """Which kernels our forward and training-step calls run here (``kernels.explain`` on the same shapes): on
    Hopper the forward is a Gluon stage, whose launch builds TMA descriptors, so a row says which it timed."""
    from flashcourse import kernels

    x = torch.zeros(1, 16, 128, 64, device=device, dtype=torch.float16)
    forward, step = kernels.explain(x, x, x), kernels.explain(x, x, x, causal=True)
    return {"flashcourse_forward": forward.forward, "flashcourse_train_step": f"{step.forward} + {step.backward}"}


def us_per_call(fn: Callable[[], object], calls: int = CALLS, repeats: int = REPEATS, *, warmup: int = WARMUP,
                sync: Callable[[], None] = torch.cuda.synchronize) -> list[float]:
    """Microseconds per call in each repeat: ``calls`` calls back to back, synchronised once at the end."""
    for _ in range(warmup):
        fn()
    sync()
    per_call = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        per_call.append((time.perf_counter() - start) / calls * 1e6)
    return per_call


def run(log=print, *, device: str = "cuda", calls: int = CALLS, repeats: int = REPEATS,
        warmup: int = WARMUP) -> list[dict]:
    """One row per provider: median microseconds per call and the spread of the repeats; each of ours also
    ``ratio_vs_sdpa`` (ours over SDPA's) with ``ratio_vs_sdpa_min`` / ``_max`` (our fastest repeat over SDPA's
    slowest, and the other way round). ``device="cpu"`` only for tests: nothing to synchronise there."""
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    rows = []
    ran = kernels_run(device)
    for name, fn in providers(device).items():
        with torch.set_grad_enabled(name in TRAINING):
            times = us_per_call(fn, calls, repeats, warmup=warmup, sync=sync)
        rows.append({"provider": name, "us_per_call": statistics.median(times), "us_min": min(times),
                     "us_max": max(times), "calls": calls, "repeats": repeats,
                     **({"kernels": ran[name]} if name in ran else {})})
        log(f"{name:24} {rows[-1]['us_per_call']:7.1f} us per call (repeats {min(times):.1f}-{max(times):.1f})")
    by_name = {r["provider"]: r for r in rows}
    for ours, theirs in PAIRS:
        mine, other = by_name[ours], by_name[theirs]
        mine["ratio_vs_sdpa"] = mine["us_per_call"] / other["us_per_call"]
        mine["ratio_vs_sdpa_min"] = mine["us_min"] / other["us_max"]
        mine["ratio_vs_sdpa_max"] = mine["us_max"] / other["us_min"]
        log(f"{ours:24} {mine['ratio_vs_sdpa']:.2f}x plain SDPA")
    return rows
