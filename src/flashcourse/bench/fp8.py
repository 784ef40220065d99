"""GPU benchmark of the FP8 forward (``python -m flashcourse.bench fp8``): speed against our fp16 forward, and the
error of fp16, FP8 and FP8 with incoherent processing against float64, on the same inputs.

Steps: (1) for each head dim and causal, a few launches of the FP8 kernel (tile shapes, TMA descriptors or
pointers, V transposed or not) are validated against float64 and timed at N = 8192; a launch that fails to
compile or to validate is recorded with its error, never silently dropped; the fastest valid one runs the grid.
(2) For each shape, our fp16 forward (v7) and the FP8 forward are timed alternately, ``REPEATS`` times each
(each a CUDA-event median of ``triton.testing.do_bench``); the row keeps the median and the min-max spread.
The FP8 time includes the per-call copy of V into its keys-adjacent layout; ``tflops_v_kept`` is the same call
with V already stored that way. (3) Errors are measured on batch 0, heads 0-1 of the timed inputs.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

import torch

from flashcourse.bench import REPEATS, attention_flops, do_bench_ms, tflops

SEQ_LENS = (4096, 8192, 16384)
HEAD_DIMS = (128, 64)
BATCH, HEADS = 4, 16
SWEEP_N = 8192
ERROR_HEADS = 2  # errors on batch 0, heads 0..ERROR_HEADS-1: the float64 reference of 64 heads at 16K is slow
OUTLIER_CHANNELS = 4
OUTLIER_FACTOR = 4.0
INPUTS = (f"q, k, v ~ N(0, 1) in float16, seeded per shape; in q and k, {OUTLIER_CHANNELS} channels (the same "
          f"random ones for q and k) multiplied by {OUTLIER_FACTOR:g}, as outlier channels in LLM activations; "
          "errors against float64 attention of these fp16 values, on batch 0, heads 0-1, every query")


def launches(*, fallbacks: bool) -> list[dict]:
    """The FP8 launches the sweep tries: the default first, then other tile shapes; with ``fallbacks``, the
    default tiles with pointer loads instead of TMA descriptors, and with V read as given (not transposed)."""
    from flashcourse.kernels.configs import KernelConfig

    tiles = [KernelConfig(64, 64, 4, 3), KernelConfig(128, 128, 8, 3), KernelConfig(128, 64, 8, 3),
             KernelConfig(128, 128, 8, 4), KernelConfig(64, 128, 4, 3), KernelConfig(64, 64, 4, 4),
             KernelConfig(64, 64, 8, 3), KernelConfig(128, 64, 4, 3)]
    found = [{"config": c} for c in tiles]
    if fallbacks:
        found += [{"config": tiles[0], "use_descriptors": False}, {"config": tiles[0], "transpose_v": False}]
    return found


def describe(launch: dict) -> str:
    c = launch["config"]
    text = f"{c.block_m}x{c.block_n}/w{c.num_warps}/s{c.num_stages}"
    if launch.get("use_descriptors") is False:
        text += " pointers"
    if launch.get("transpose_v") is False:
        text += " V as given"
    return text


def make_inputs(n: int, head_dim: int, seed: int, device="cuda"):
    gen = torch.Generator(device=device).manual_seed(seed)
    q, k, v = (torch.randn((BATCH, HEADS, n, head_dim), generator=gen, device=device) for _ in range(3))
    channels = torch.randperm(head_dim, generator=torch.Generator().manual_seed(seed))[:OUTLIER_CHANNELS]
    q[..., channels] *= OUTLIER_FACTOR
    k[..., channels] *= OUTLIER_FACTOR
    return tuple(t.to(torch.float16) for t in (q, k, v))


def bench_ms(fn: Callable[[], object]) -> float:
    return do_bench_ms(fn, warmup=25, rep=100)


def errors(o: torch.Tensor, exact: torch.Tensor) -> tuple[float, float]:
    """(max abs, RMS) of o's first heads against the float64 output."""
    diff = o[:1, :ERROR_HEADS].double() - exact
    return diff.abs().max().item(), diff.pow(2).mean().sqrt().item()


def validate(o, x, causal) -> str | None:
    """None when o's first heads are within fp8.error_bound of float64 attention of the dequantised inputs."""
    from flashcourse.kernels import fp8

    q, k, v = (t[:1, :ERROR_HEADS] for t in x.dequantized())
    o_ref, _, p_abs_v = fp8.reference_forward(q, k, v, causal=causal)
    bound = fp8.error_bound(o_ref, p_abs_v, v.abs().max().item(), k.shape[2])
    excess = ((o[:1, :ERROR_HEADS].double() - o_ref).abs() - bound).max().item()
    return None if excess <= 0 else f"wrong: error exceeds the bound by {excess:.3g}"


def sweep(head_dim: int, causal: bool) -> tuple[list[dict], dict | None]:
    """Validate and time the launches at SWEEP_N: (rows, the fastest valid launch or None). The fallbacks are
    timed at D=128 non-causal (to record what they cost) and wherever no tile shape compiled and validated."""
    from flashcourse.kernels import fp8

    x = fp8.quantize_fp8(*make_inputs(SWEEP_N, head_dim, seed=1))
    flops = attention_flops(BATCH, HEADS, SWEEP_N, head_dim, causal=causal)
    rows, best = [], None
    tiles = launches(fallbacks=False)
    for launch in tiles + [f for f in launches(fallbacks=True) if f not in tiles]:
        if launch not in tiles and best is not None and (head_dim, causal) != (128, False):
            continue
        row = {"kind": "sweep", "n": SWEEP_N, "head_dim": head_dim, "causal": causal, "launch": describe(launch)}
        try:
            def run(launch=launch):
                return fp8.flash_attention_forward_fp8(x.q, x.k, x.v, **x.descales(), causal=causal, **launch)

            o, _ = run()
            torch.cuda.synchronize()
            problem = validate(o, x, causal)
            if problem:
                row.update(status="wrong", error=problem)
            else:
                row.update(status="ok", tflops=tflops(flops, bench_ms(run) * 1e-3))
        except Exception as err:  # a launch that does not compile (or runs out of resources) is a result
            first_line = str(err).splitlines()[0][:300] if str(err) else ""
            row.update(status="error", error=f"{type(err).__name__}: {first_line}")
        print(f"sweep D={head_dim} causal={causal} {row['launch']}: {row.get('tflops', row.get('error'))}")
        rows.append(row)
        if row["status"] == "ok" and (best is None or row["tflops"] > best[1]):
            best = (launch, row["tflops"])
    return rows, (best[0] if best else None)


def measure_shape(n: int, head_dim: int, causal: bool, launch: dict, seed: int) -> dict:
    from flashcourse import kernels
    from flashcourse.kernels import fp8

    q, k, v = make_inputs(n, head_dim, seed)
    plain = fp8.quantize_fp8(q, k, v)
    incoherent = fp8.quantize_fp8(q, k, v, incoherent=True, seed=seed)
    v_kept = fp8.v_keys_contiguous(plain.v)
    flops = attention_flops(BATCH, HEADS, n, head_dim, causal=causal)

    def fp16():
        return kernels.flash_attention_forward(q, k, v, causal=causal)

    def fp8_call(x=plain, v_in=None):
        return fp8.flash_attention_forward_fp8(x.q, x.k, x.v if v_in is None else v_in, **x.descales(),
                                               causal=causal, **launch)

    times = {"fp16": [], "fp8": [], "fp8_v_kept": []}
    with torch.no_grad():
        for _ in range(REPEATS):  # alternate, so that a slow spell of the GPU hits both
            times["fp16"].append(bench_ms(fp16))
            times["fp8"].append(bench_ms(fp8_call))
            times["fp8_v_kept"].append(bench_ms(lambda: fp8_call(v_in=v_kept)))
        rate = {name: [tflops(flops, ms * 1e-3) for ms in values] for name, values in times.items()}
        exact, _, _ = fp8.reference_forward(q[:1, :ERROR_HEADS], k[:1, :ERROR_HEADS], v[:1, :ERROR_HEADS],
                                            causal=causal)
        outputs = {"fp16": fp16()[0], "fp8": fp8_call()[0], "fp8_incoherent": fp8_call(incoherent)[0]}
    row = {"kind": "grid", "n": n, "batch": BATCH, "heads": HEADS, "head_dim": head_dim, "causal": causal,
           "launch": describe(launch), "status": "ok",
           "tflops": statistics.median(rate["fp8"]), "tflops_min": min(rate["fp8"]), "tflops_max": max(rate["fp8"]),
           "ms": statistics.median(times["fp8"]),
           "tflops_fp16": statistics.median(rate["fp16"]), "tflops_fp16_min": min(rate["fp16"]),
           "tflops_fp16_max": max(rate["fp16"]),
           "tflops_v_kept": statistics.median(rate["fp8_v_kept"]),
           "tflops_v_kept_min": min(rate["fp8_v_kept"]), "tflops_v_kept_max": max(rate["fp8_v_kept"])}
    row["ratio_vs_flashcourse_fp16"] = row["tflops"] / row["tflops_fp16"]
    for name, o in outputs.items():
        row[f"max_abs_err_{name}"], row[f"rms_err_{name}"] = errors(o, exact)
    row["rms_exact"] = exact.pow(2).mean().sqrt().item()
    return row


def run(seq_lens=SEQ_LENS, head_dims=HEAD_DIMS, causals=(False, True), on_row=None) -> list[dict]:
    """Sweep, then the grid; ``on_row(rows)`` after each row (so that a run cut short keeps what it measured)."""
    rows = []
    for head_dim in head_dims:
        for causal in causals:
            sweep_rows, launch = sweep(head_dim, causal)
            rows += sweep_rows
            for n in seq_lens:
                if launch is None:
                    rows.append({"kind": "grid", "n": n, "head_dim": head_dim, "causal": causal,
                                 "status": "error", "error": "no FP8 launch compiled and validated"})
                    continue
                try:
                    rows.append(measure_shape(n, head_dim, causal, launch, seed=n + head_dim))
                except torch.cuda.OutOfMemoryError:
                    rows.append({"kind": "grid", "n": n, "head_dim": head_dim, "causal": causal, "status": "oom"})
                finally:
                    torch.cuda.empty_cache()
                if on_row:
                    on_row(rows)
    return rows


def format_table(rows: list[dict]) -> str:
    lines = [f"{'D':>4} {'causal':>6} {'N':>6} {'launch':>18} {'fp8 TFLOP/s':>16} {'fp16':>6} {'x fp16':>7} "
             f"{'V kept':>7} {'rms fp16':>9} {'rms fp8':>9} {'rms incoh':>9}"]
    for r in rows:
        if r.get("kind") != "grid":
            continue
        if r["status"] != "ok":
            lines.append(f"{r['head_dim']:>4} {r['causal']!s:>6} {r['n']:>6} {r['status']}: {r.get('error', '')}")
            continue
        spread = f"{r['tflops']:.0f} [{r['tflops_min']:.0f}-{r['tflops_max']:.0f}]"
        lines.append(f"{r['head_dim']:>4} {r['causal']!s:>6} {r['n']:>6} {r['launch']:>18} {spread:>16} "
                     f"{r['tflops_fp16']:>6.0f} {r['ratio_vs_flashcourse_fp16']:>7.2f} {r['tflops_v_kept']:>7.0f} "
                     f"{r['rms_err_fp16']:>9.2e} {r['rms_err_fp8']:>9.2e} {r['rms_err_fp8_incoherent']:>9.2e}")
    return "\n".join(lines)


def meta() -> dict:
    """What the JSON says about the inputs and the method, beside the device and versions."""
    return {"inputs": INPUTS, "repeats": REPEATS, "batch": BATCH, "heads": HEADS, "sweep_n": SWEEP_N,
            "timing": "median of REPEATS do_bench medians (warmup 25 ms, rep 100 ms), fp16 and fp8 alternating; "
                      "fp8 includes the per-call copy of V into its keys-adjacent layout, tflops_v_kept does not",
            "fp16_provider": "kernels.flash_attention_forward (v7) on the same fp16 inputs"}
