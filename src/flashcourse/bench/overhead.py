"""Launch cost: the host time of one call on an input so small that the GPU is idle, so the call is pure overhead.

Ours and SDPA's call are timed in alternating rounds, not one after the other: in each of ``ROUNDS`` rounds a block
of ``CALLS`` calls of one, synchronised once at its end, then a block of the other, and the order swaps every round
so that neither always goes first. A host's speed drifts (clocks, other processes, the allocator's state): plain
SDPA's own time moved by up to 1.5x between five back-to-back runs on an H200, and when each provider was timed in
its own stretch of the run, that drift landed in the ratio. Two blocks of one round run a fraction of a second
apart, so each round's ratio (ours over SDPA's) sees one state of the host, and the reported ratio is the median
of the rounds' ratios. Both are first called ``WARMUP`` times (compile, fill the launch caches).

SDPA is the call a user writes, plain ``F.scaled_dot_product_attention`` with no ``sdpa_kernel`` context around it:
that context alone costs tens of microseconds a call, which made an earlier comparison look even (meta
``"sdpa_call": "plain"``). Inputs (fp16):

- ``*_forward``: attention on q = k = v of shape (1, 16, 128, 64), under ``torch.no_grad()``;
- ``*_decode``: one token, q (1, 32, 128), against a (1, 8, 128, 128) cache (SDPA with ``enable_gqa=True``),
  under ``torch.no_grad()``;
- ``*_train_step``: causal attention on (1, 16, 128, 64) inputs that require grad, forward and backward through
  autograd (``torch.autograd.grad``, so no gradient accumulates from call to call);
- ``*_train_step_1024``: the same at N = 1024 with ``HEADS_1024`` heads, (1, 64, 1024, 64): the least work the Gluon
  backwards take on Hopper under Triton 3.9 (``plan.B7_MIN_N`` and ``plan.B7_MIN_ROWS``), whose launches are the
  host's longest (docs/KERNELS.md, "Host time"); elsewhere b1, as at 128.

Expected time on an H200: at the 2026-12-02 medians (ours + SDPA's per call: forward 67 us, decode 49 us, training
step 476 us) the rounds take 30 x 500 x 592 us, about 9 s, plus imports and the first calls' compiles; the step at
N = 1024 adds about 30 x 500 x 0.6 ms, 9 s (an H100 under Triton 3.9, 2026-12-07, b7c's backward: ours 0.22-0.43 ms
a step, SDPA's 0.15-0.21 ms; ``benchmarks/results/2026-12-07-nvidia-h100-80gb-hbm3-overhead-t39-gluon-forwards-*``,
``-t39-step-b7c-*`` and ``-51281df-t39-*``).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

ROUNDS = 30
CALLS = 500  # calls in one block: a round of the training-step pair lasts about a quarter of a second
WARMUP = 50  # calls of each before the rounds: compile, fill the launch caches
REPEATS = 5  # us_per_call's default repeats (a provider timed alone, not in the alternating rounds)
PAIRS = (("flashcourse_forward", "sdpa_forward"), ("flashcourse_decode", "sdpa_decode"),
         ("flashcourse_train_step", "sdpa_train_step"), ("flashcourse_train_step_1024", "sdpa_train_step_1024"))
HEADS_1024 = 64  # x 1024 rows = plan.B7_MIN_ROWS, the least work a Gluon backward serves
# timed with autograd on; the others under no_grad
TRAINING = ("flashcourse_train_step", "sdpa_train_step", "flashcourse_train_step_1024", "sdpa_train_step_1024")


def meta() -> dict:
    """What the results file's meta records beside the environment: how SDPA was called and how it was timed."""
    return {"sdpa_call": "plain", "rounds": ROUNDS, "calls": CALLS, "warmup": WARMUP,
            "method": "alternating rounds: in each round a block of `calls` calls of ours and one of SDPA's, each "
                      "synchronised once, the order swapped every round; ratio_vs_sdpa is the median of the "
                      "rounds' ratios, ratio_vs_sdpa_min / _q1 / _q3 / _max their spread"}


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
    steps = {n: ((*(randn(1, heads, n, 64, grad=True) for _ in range(3)),), randn(1, heads, n, 64))
             for n, heads in ((128, 16), (1024, HEADS_1024))}

    def train_step(attend, n=128):
        (tq, tk, tv), do = steps[n]
        return lambda: torch.autograd.grad(attend(tq, tk, tv), (tq, tk, tv), do)

    def ours(q, k, v):
        return kernels.flash_attention(q, k, v, causal=True)

    def sdpa(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    return {
        "flashcourse_forward": lambda: kernels.flash_attention(x, x, x),
        "sdpa_forward": lambda: F.scaled_dot_product_attention(x, x, x),
        "flashcourse_decode": lambda: kernels.flash_decode(q, cache, cache),
        "sdpa_decode": lambda: F.scaled_dot_product_attention(q_rows, cache, cache, enable_gqa=True),
        "flashcourse_train_step": train_step(ours),
        "sdpa_train_step": train_step(sdpa),
        "flashcourse_train_step_1024": train_step(ours, 1024),
        "sdpa_train_step_1024": train_step(sdpa, 1024),
    }


def kernels_run(device: str = "cuda") -> dict[str, str]:
    """Which kernels our forward and training-step calls run here (``kernels.explain`` on the same shapes): on
    Hopper the forward is a Gluon stage, whose launch builds TMA descriptors, so a row says which it timed."""
    from flashcourse import kernels

    x, x1024 = (torch.zeros(1, heads, n, 64, device=device, dtype=torch.float16)
                for n, heads in ((128, 16), (1024, HEADS_1024)))
    forward, step = kernels.explain(x, x, x), kernels.explain(x, x, x, causal=True)
    step1024 = kernels.explain(x1024, x1024, x1024, causal=True)
    return {"flashcourse_forward": forward.forward, "flashcourse_train_step": f"{step.forward} + {step.backward}",
            "flashcourse_train_step_1024": f"{step1024.forward} + {step1024.backward}"}


def block_us(fn: Callable[[], object], calls: int, sync: Callable[[], None],
             clock: Callable[[], float] = time.perf_counter) -> float:
    """Microseconds per call of ``calls`` calls back to back, synchronised once at the end."""
    start = clock()
    for _ in range(calls):
        fn()
    sync()
    return (clock() - start) / calls * 1e6


def us_per_call(fn: Callable[[], object], calls: int = CALLS, repeats: int = REPEATS, *, warmup: int = WARMUP,
                sync: Callable[[], None] = torch.cuda.synchronize) -> list[float]:
    """Microseconds per call in each of ``repeats`` blocks of one provider alone (no partner to alternate with)."""
    for _ in range(warmup):
        fn()
    sync()
    return [block_us(fn, calls, sync) for _ in range(repeats)]


def alternate(ours: Callable[[], object], theirs: Callable[[], object], *, rounds: int = ROUNDS,
              calls: int = CALLS, warmup: int = WARMUP, sync: Callable[[], None] = torch.cuda.synchronize,
              clock: Callable[[], float] = time.perf_counter) -> tuple[list[float], list[float]]:
    """Microseconds per call of ours and of theirs in each round: ours first in even rounds, theirs first in odd
    ones, so that a round's two blocks are neighbours in time and neither provider always runs first."""
    for _ in range(warmup):
        ours()
        theirs()
    sync()
    ours_us, theirs_us = [], []
    for round_ in range(rounds):
        if round_ % 2 == 0:
            ours_us.append(block_us(ours, calls, sync, clock))
            theirs_us.append(block_us(theirs, calls, sync, clock))
        else:
            theirs_us.append(block_us(theirs, calls, sync, clock))
            ours_us.append(block_us(ours, calls, sync, clock))
    return ours_us, theirs_us


def ratio_summary(ours_us: list[float], theirs_us: list[float]) -> dict:
    """The ratio of matched rounds (ours over SDPA's in the same round): its median, quartiles and range."""
    ratios = [mine / other for mine, other in zip(ours_us, theirs_us, strict=True)]
    q1, _, q3 = statistics.quantiles(ratios, n=4, method="inclusive")
    return {"ratio_vs_sdpa": statistics.median(ratios), "ratio_vs_sdpa_min": min(ratios),
            "ratio_vs_sdpa_q1": q1, "ratio_vs_sdpa_q3": q3, "ratio_vs_sdpa_max": max(ratios),
            "ratio_rounds": ratios}


def run(log=print, *, device: str = "cuda", rounds: int = ROUNDS, calls: int = CALLS, warmup: int = WARMUP,
        clock: Callable[[], float] = time.perf_counter) -> list[dict]:
    """One row per provider, each pair (ours, then SDPA's) timed in alternating rounds (:func:`alternate`).

    Every row: ``us_per_call`` (the median over rounds of microseconds per call), ``us_min`` / ``us_max`` (the
    fastest and slowest round), ``us_rounds`` (every round, in order), ``rounds`` and ``calls`` (per block).
    Each of ours also: ``ratio_vs_sdpa``, ours over SDPA's, as the median of the per-round ratios (not a ratio of
    the two medians), ``ratio_vs_sdpa_min`` / ``_max`` the smallest and largest round's ratio (before alternating
    rounds they were our fastest repeat over SDPA's slowest and the other way round), ``ratio_vs_sdpa_q1`` / ``_q3``
    their quartiles, ``ratio_rounds`` every round's ratio; ``kernels``, what it ran, where known.
    ``device="cpu"`` only for tests: nothing to synchronise there. Needs at least two rounds (for quartiles)."""
    if rounds < 2:
        raise ValueError(f"rounds={rounds}: the ratio's quartiles need at least two rounds")
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    ran = kernels_run(device)
    calls_by_name = providers(device)
    rows = []
    for ours, theirs in PAIRS:
        with torch.set_grad_enabled(ours in TRAINING):
            timed = alternate(calls_by_name[ours], calls_by_name[theirs], rounds=rounds, calls=calls,
                              warmup=warmup, sync=sync, clock=clock)
        for name, times in zip((ours, theirs), timed, strict=True):
            rows.append({"provider": name, "us_per_call": statistics.median(times), "us_min": min(times),
                         "us_max": max(times), "us_rounds": times, "rounds": rounds, "calls": calls,
                         **({"kernels": ran[name]} if name in ran else {})})
            log(f"{name:24} {rows[-1]['us_per_call']:7.1f} us per call (rounds {min(times):.1f}-{max(times):.1f})")
        mine = rows[-2]
        mine.update(ratio_summary(*timed))
        log(f"{ours:24} {mine['ratio_vs_sdpa']:.2f}x plain SDPA (rounds {mine['ratio_vs_sdpa_min']:.2f}-"
            f"{mine['ratio_vs_sdpa_max']:.2f}, quartiles {mine['ratio_vs_sdpa_q1']:.2f}-"
            f"{mine['ratio_vs_sdpa_q3']:.2f})")
    return rows
