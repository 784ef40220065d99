"""GPU benchmark of attention: our kernels against PyTorch SDPA's backends and naive PyTorch, in one run.

Every provider runs the same shapes in the same process; a provider that runs out of memory or does not
support a shape is recorded as such (``status``), never skipped silently. Our kernel is validated against
SDPA before it is timed. The providers' order is reversed at every other shape, along each length series and
between masks (``provider_order``). Every time is the median of ``bench.REPEATS`` CUDA-event timings
(``triton.testing.do_bench``, each with its warm-up), stored with the repeats' range (``ms_min``, ``ms_max``,
``tflops_min``, ``tflops_max``; :func:`flashcourse.bench.time_repeats`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from flashcourse.bench import Timing, attention_flops, do_bench_ms, time_repeats
from flashcourse.bench.providers import add_ratios as shared_add_ratios
from flashcourse.bench.providers import sdpa
from flashcourse.measure import peak_memory

PROVIDERS = ("flashcourse", "sdpa_flash", "sdpa_cudnn", "sdpa_efficient", "naive")
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}
HEAD_CONFIGS = ((32, 64), (16, 128))  # (heads, head_dim): the same FLOPs per token
SEQ_LENS = (1024, 2048, 4096, 8192, 16384)
MEMORY_SEQ_LENS = (4096, 16384)  # extra memory of fwd+bwd is measured here: linear in N or not


@dataclass(frozen=True)
class Shape:
    dtype: str
    batch: int
    heads: int
    head_dim: int
    n: int
    causal: bool

    def flops(self, mode: str) -> float:
        return attention_flops(self.batch, self.heads, self.n, self.head_dim, causal=self.causal, mode=mode)


def shape_grid(dtypes: Iterable[str] = tuple(DTYPES), seq_lens: Iterable[int] = SEQ_LENS,
               head_configs: Iterable[tuple[int, int]] = HEAD_CONFIGS, causals: Iterable[bool] = (False, True),
               batch: int = 4) -> list[Shape]:
    """The benchmark's grid of shapes (or a subset of it)."""
    return [Shape(dt, batch, h, d, n, c) for dt in dtypes for h, d in head_configs for n in seq_lens
            for c in causals]


def naive_attention(q, k, v, causal: bool):
    """softmax(q k^T / sqrt(D)) v with the full N x N matrix in memory, as lesson 01 writes it."""
    s = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
    if causal:
        n_q, n_k = s.shape[-2:]
        s = s.masked_fill(torch.ones(n_q, n_k, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return torch.softmax(s.float(), dim=-1).to(q.dtype) @ v


def provider_fn(provider: str, **kernel_kwargs) -> Callable:
    """fn(q, k, v, causal) -> o for a provider name: ours, naive PyTorch, or one SDPA backend."""
    if provider == "flashcourse":
        from flashcourse import kernels

        return lambda q, k, v, causal: kernels.flash_attention(q, k, v, causal=causal, **kernel_kwargs)
    if provider == "naive":
        return naive_attention
    return sdpa(provider)


def make_inputs(shape: Shape, device="cuda", requires_grad: bool = True):
    dtype = DTYPES[shape.dtype]
    size = (shape.batch, shape.heads, shape.n, shape.head_dim)
    q, k, v, do = (torch.randn(size, device=device, dtype=dtype) for _ in range(4))
    for t in (q, k, v):
        t.requires_grad_(requires_grad)
    return q, k, v, do


def bench_ms(fn: Callable[[], object], grad_to_none=None) -> float:
    """Median milliseconds of fn over one CUDA-event timing, after warm-up (sweeps that only rank configs)."""
    return do_bench_ms(fn, grad_to_none)


def bench_timing(fn: Callable[[], object], grad_to_none=None) -> Timing:
    """fn timed ``bench.REPEATS`` times: the median milliseconds and the repeats' range."""
    return time_repeats(fn, grad_to_none=grad_to_none)


def _guarded(measure: Callable[[], dict]) -> dict:
    """Run one measurement; out-of-memory and unsupported shapes become results instead of crashes."""
    try:
        return {"status": "ok", **measure()}
    except torch.cuda.OutOfMemoryError:
        return {"status": "oom"}
    except RuntimeError as err:  # e.g. an SDPA backend that refuses this dtype or head dim
        text = str(err).splitlines()[0][:200] if str(err) else type(err).__name__
        return {"status": "oom" if "out of memory" in text.lower() else "unsupported", "error": text}
    finally:
        torch.cuda.empty_cache()


def measure_shape(shape: Shape, provider: str, modes=("fwd", "bwd"), memory: bool = False,
                  **kernel_kwargs) -> list[dict]:
    """Time one provider on one shape: rows with ms and TFLOP/s per mode (median and range of the repeats),
    plus peak memory if asked."""
    fn = provider_fn(provider, **kernel_kwargs)
    base = {"provider": provider, **shape.__dict__, **kernel_kwargs}
    rows = []
    for mode in modes:
        def measure(mode=mode):
            q, k, v, do = make_inputs(shape, requires_grad=(mode == "bwd"))
            if mode == "fwd":
                with torch.no_grad():
                    timing = bench_timing(lambda: fn(q, k, v, shape.causal))
            else:
                o = fn(q, k, v, shape.causal)
                timing = bench_timing(lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True))
            return {**timing.fields(shape.flops(mode)), **kernels_run(provider, q, k, v, shape, kernel_kwargs)}

        rows.append({**base, "mode": mode, **_guarded(measure)})
    if memory:
        def measure_memory():
            q, k, v, do = make_inputs(shape)
            inputs = 4 * q.numel() * q.element_size()

            def step():
                fn(q, k, v, shape.causal).backward(do)

            return {"peak_bytes": peak_memory(step, device="cuda"), "input_bytes": inputs}

        rows.append({**base, "mode": "fwd_bwd_memory", **_guarded(measure_memory)})
    return rows


def kernels_run(provider: str, q, k, v, shape: Shape, kernel_kwargs: dict) -> dict:
    """For our rows, which forward and backward kernels the call ran (``kernels.explain``: on Hopper, a Gluon
    stage where it is the default), so that a row says what "flashcourse" measured."""
    if provider != "flashcourse":
        return {}
    from flashcourse import kernels

    route = kernels.explain(q, k, v, causal=shape.causal, **kernel_kwargs)
    return {"forward_kernel": route.forward, "backward_kernel": route.backward}


def validate_ours(shape: Shape, **kernel_kwargs) -> dict:
    """Forward and gradients of our kernel against SDPA (math backend in float32) on this shape."""
    small = Shape(shape.dtype, 1, min(shape.heads, 4), shape.head_dim, min(shape.n, 4096), shape.causal)
    q, k, v, do = make_inputs(small)
    ours = provider_fn("flashcourse", **kernel_kwargs)
    o = ours(q, k, v, small.causal)
    grads = torch.autograd.grad(o, (q, k, v), do)
    q32, k32, v32 = (t.detach().float().requires_grad_() for t in (q, k, v))
    o_ref = provider_fn("sdpa_math")(q32, k32, v32, small.causal)
    grads_ref = torch.autograd.grad(o_ref, (q32, k32, v32), do.float())

    def rel(a, b):
        return float((a.float() - b).norm() / b.norm())

    errs = {"o": rel(o, o_ref), **{f"d{n}": rel(g, r) for n, g, r in zip("qkv", grads, grads_ref, strict=True)}}
    errs["ok"] = all(math.isfinite(e) and e < 2e-2 for e in errs.values())
    return errs


def warm_up_gpu(seconds: float = 1.0) -> None:
    """Matrix products for about ``seconds``: an idle GPU starts at low clocks, which the first shape would pay."""
    import time

    a = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(10):
            a @ a
        torch.cuda.synchronize()


def provider_order(providers, shape: Shape, lengths: list[int]) -> list[str]:
    """The order the providers are timed in at ``shape``: as given or reversed, in a checkerboard over the grid's
    ``lengths`` and the mask, so that along each length series and between the masked and unmasked shape of a
    length the order changes (a plain alternation over the grid would time every causal shape in one order).
    Timed first, our kernel read 0-3% faster against cuDNN than timed after it (the median over the shapes of an
    H100 grid at N >= 4096, run both ways in one lease, 2026-12-07: the forward at D = 128 3%, the backward at
    D = 128 0%); alternating lets that cancel over a grid."""
    reverse = (lengths.index(shape.n) + int(shape.causal)) % 2
    return list(reversed(providers)) if reverse else list(providers)


def run(shapes: list[Shape], providers=PROVIDERS, modes=("fwd", "bwd"), log=print, on_shape=None) -> list[dict]:
    """Validate our kernel on every shape, then time every provider (in the order ``provider_order`` gives:
    ``position`` in each row); returns result rows.

    ``on_shape(rows)`` is called after each shape (to save partial results of a run cut short)."""
    warm_up_gpu()
    rows = []
    lengths = sorted({shape.n for shape in shapes})
    for shape in shapes:
        check = validate_ours(shape)
        log(f"validate {shape}: {check}")
        if not check["ok"]:
            raise AssertionError(f"flashcourse kernel is wrong on {shape}: relative errors {check}")
        for position, provider in enumerate(provider_order(providers, shape, lengths)):
            memory = shape.n in MEMORY_SEQ_LENS
            rows += [{**row, "position": position}
                     for row in measure_shape(shape, provider, modes=modes, memory=memory)]
        log(format_table([r for r in rows if r["n"] == shape.n and r["causal"] == shape.causal
                          and r["dtype"] == shape.dtype and r["head_dim"] == shape.head_dim], header=False))
        add_ratios(rows)
        if on_shape:
            on_shape(rows)
    return rows


def add_ratios(rows: list[dict]) -> None:
    """Give each flashcourse row its speed ratio against every other provider on the same shape and mode."""
    shared_add_ratios(rows, rate="tflops", ours=("flashcourse",),
                      key=lambda r: (r["dtype"], r["batch"], r["heads"], r["head_dim"], r["n"], r["causal"], r["mode"]))


def format_table(rows: list[dict], header: bool = True) -> str:
    """One line per (shape, mode): TFLOP/s of every provider and our ratio against each SDPA backend."""
    providers = [p for p in PROVIDERS if any(r["provider"] == p for r in rows)]
    lines = []
    if header:
        cols = "".join(f"{p:>15}" for p in providers)
        lines.append(f"{'dtype':9}{'H':>4}{'D':>5}{'N':>7}{'causal':>7}{'mode':>5}{cols}   ours/flash cudnn  eff")
    groups: dict = {}
    for r in rows:
        if r["mode"] in ("fwd", "bwd"):
            k = (r["dtype"], r["heads"], r["head_dim"], r["n"], r["causal"], r["mode"])
            groups.setdefault(k, {})[r["provider"]] = r
    for (dt, h, d, n, c, mode), group in groups.items():
        cells = ""
        for p in providers:
            r = group.get(p)
            cells += f"{r['tflops']:15.1f}" if r and r["status"] == "ok" else f"{(r or {}).get('status', '-'):>15}"
        ours = group.get("flashcourse", {})
        ratios = "".join(f"{ours[f'ratio_vs_{p}']:6.2f}" if f"ratio_vs_{p}" in ours else "     -"
                         for p in ("sdpa_flash", "sdpa_cudnn", "sdpa_efficient"))
        lines.append(f"{dt:9}{h:>4}{d:>5}{n:>7}{c!s:>7}{mode:>5}{cells}   {ratios}")
    return "\n".join(lines)
