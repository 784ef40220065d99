"""A training step's attention: forward and backward through autograd, causal, at the shapes of small GPT models.

What a learner feels is a step, not a kernel: this times ``torch.autograd.grad(attend(q, k, v), (q, k, v), do)``,
the kernels and the host time between them, for our ``flash_attention`` against the call a user writes (plain
``F.scaled_dot_product_attention``, no ``sdpa_kernel`` context) and against SDPA pinned to its flash and cuDNN
backends, all in one run. Our kernel is validated against SDPA's float32 math backend first
(``attention.validate_ours``). Every time is the median of ``bench.REPEATS`` CUDA-event timings with the range of
the repeats. One row per (dtype, shape): ``us`` (ours), ``sdpa_plain_us``, ``sdpa_flash_us``, ``sdpa_cudnn_us``,
each with ``_min`` / ``_max``, and ``ratio_vs_<provider>`` = our time over theirs (below 1: ours is faster), its
range from our fastest repeat over their slowest and the other way round. A provider that fails on a shape
(out of memory, a backend that refuses it) leaves ``<provider>_status`` and its error instead of a time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

from flashcourse.bench import attention_flops, tflops, time_repeats
from flashcourse.bench.attention import Shape, _guarded, kernels_run, make_inputs, validate_ours, warm_up_gpu
from flashcourse.bench.providers import sdpa

# (batch, heads, n, head_dim): nanoGPT's B=8, H=12, N=1024, D=64, twice the batch, and two models at N=2048.
SHAPES = ((8, 12, 1024, 64), (16, 12, 1024, 64), (8, 16, 2048, 64), (4, 32, 2048, 128))
DTYPES = ("bfloat16", "float16")
PROVIDERS = ("flashcourse", "sdpa_plain", "sdpa_flash", "sdpa_cudnn")  # the first is ours, the rest SDPA's


def shape_grid(dtypes: Iterable[str] = DTYPES, shapes: Iterable[tuple[int, int, int, int]] = SHAPES) -> list[Shape]:
    """Every (dtype, shape) of the benchmark, causal."""
    return [Shape(dtype, b, h, d, n, True) for dtype in dtypes for b, h, n, d in shapes]


def attend_fn(provider: str) -> Callable:
    """fn(q, k, v) -> o, causal, for a provider name."""
    if provider == "flashcourse":
        from flashcourse import kernels

        return lambda q, k, v: kernels.flash_attention(q, k, v, causal=True)
    if provider == "sdpa_plain":
        import torch.nn.functional as F

        return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)
    pinned = sdpa(provider)
    return lambda q, k, v: pinned(q, k, v, True)


def time_step(shape: Shape, provider: str, *, device: str = "cuda", timer=None) -> dict:
    """``{"us", "us_min", "us_max", "status"}`` of one provider's step on one shape, or its status and error."""
    attend = attend_fn(provider)

    def measure() -> dict:
        q, k, v, do = make_inputs(shape, device=device)
        timing = time_repeats(lambda: torch.autograd.grad(attend(q, k, v), (q, k, v), do), timer=timer)
        return {"us": timing.ms * 1e3, "us_min": timing.ms_min * 1e3, "us_max": timing.ms_max * 1e3,
                **kernels_run(provider, q, k, v, shape, {})}

    return _guarded(measure)


def measure_shape(shape: Shape, *, device: str = "cuda", timer=None) -> dict:
    """One row: our step's time on ``shape`` and each SDPA provider's, with our ratio against each."""
    row = {"dtype": shape.dtype, "batch": shape.batch, "heads": shape.heads, "n": shape.n,
           "head_dim": shape.head_dim, "causal": shape.causal}
    flops = attention_flops(shape.batch, shape.heads, shape.n, shape.head_dim, causal=True, mode="fwd_bwd")
    for provider in PROVIDERS:
        result = time_step(shape, provider, device=device, timer=timer)
        prefix = "" if provider == "flashcourse" else f"{provider}_"  # ours unprefixed: us, us_min, status...
        row.update({f"{prefix}{name}": value for name, value in result.items()})
        if "us" in result:
            row[f"{prefix}tflops"] = tflops(flops, result["us"] * 1e-6)
    for provider in PROVIDERS[1:]:
        if row["status"] == "ok" and row[f"{provider}_status"] == "ok":
            row[f"ratio_vs_{provider}"] = row["us"] / row[f"{provider}_us"]
            row[f"ratio_vs_{provider}_min"] = row["us_min"] / row[f"{provider}_us_max"]
            row[f"ratio_vs_{provider}_max"] = row["us_max"] / row[f"{provider}_us_min"]
    return row


def run(shapes: Iterable[Shape], *, log=print, on_row=None, device: str = "cuda", timer=None) -> list[dict]:
    """Validate our kernel on each shape, then time every provider on it; ``on_row(rows)`` after each shape (to
    keep the rows of a run cut short)."""
    if device == "cuda":
        warm_up_gpu()
    rows = []
    for shape in shapes:
        check = validate_ours(shape)
        log(f"validate {shape}: {check}")
        if not check["ok"]:
            raise AssertionError(f"flashcourse kernel is wrong on {shape}: relative errors {check}")
        rows.append(measure_shape(shape, device=device, timer=timer))
        log(format_table(rows[-1:], header=False))
        if on_row:
            on_row(rows)
    return rows


def format_table(rows: list[dict], header: bool = True) -> str:
    """One line per row: each provider's microseconds per step and our ratio against each SDPA provider."""
    others = PROVIDERS[1:]
    lines = [f"{'dtype':9}{'B':>4}{'H':>4}{'N':>6}{'D':>5}{'ours':>10}"
             + "".join(f"{p:>12}" for p in others) + "   ours / " + " ".join(others)] if header else []
    for r in rows:
        cells = "".join(f"{r[f'{p}_us']:12.0f}" if f"{p}_us" in r else f"{r.get(f'{p}_status', '-'):>12}"
                        for p in others)
        ours = f"{r['us']:10.0f}" if "us" in r else f"{r['status']:>10}"
        ratios = " ".join(f"{r[f'ratio_vs_{p}']:.2f}" if f"ratio_vs_{p}" in r else "-" for p in others)
        lines.append(f"{r['dtype']:9}{r['batch']:>4}{r['heads']:>4}{r['n']:>6}{r['head_dim']:>5}{ours}{cells}"
                     f"   {ratios}")
    return "\n".join(lines)
