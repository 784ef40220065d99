"""FlashAttention-4's two portable ideas as Hopper stages (v9a, v9b; ``flashcourse.kernels.hopper.fa3``) checked and
timed beside the v8 stage each builds on and SDPA's cuDNN, on an H100 / H200, in under 4 minutes. Written before
any GPU ran it (the stages compile for sm_90 on a CPU: tests/test_v9_compile.py).

    PYTHONPATH=src python3 benchmarks/gpu_fa4_stages.py --out $OUT                  # expected 2-4 minutes
    PYTHONPATH=src python3 benchmarks/gpu_fa4_stages.py --lengths 4096 --out /tmp/fa4    # one length, faster
    PYTHONPATH=src python3 benchmarks/gpu_fa4_stages.py --fp8 --out $OUT            # the FP8 stages, 2-3 minutes

The stages (lesson 14): v9a, conditional rescaling (keep a row's max while a tile raises it by at most 8 in log2
units; rescale the output only when some row moved it); v9b_1of16 and v9b_1of4, exp2 computed on the FMA units
for the first 8 or 32 of each 128-key tile's columns. Each builds on the fastest forward of its head dim
(``Stage.builds_on``): v8f at D = 64, v8d at D = 128 (``kernels/plan.py``'s FORWARD_BANDS, non-causal).

1. Checks and compiles, one child process a stage, all at once (compiles dominate; the GPU work is small; a stage
   that hangs or crashes costs only its child, killed after ``--stage-timeout`` seconds): each v9 stage against a
   float64 reference (``gpu_fa3.check_case``) at D 64 and 128, float16 and bfloat16, causal (top-left) and not,
   N_q = N_kv in {1, 17, 1000, 4096}; the base stages (v8f at D = 64, v8d at D = 128) are compiled by one small
   call each, so that step 2 finds every kernel in Triton's cache.
2. Timing, in this process, shape by shape with the providers interleaved (base, v9a, v9b_1of16, v9b_1of4,
   sdpa_cudnn): N 1024, 4096, 16384 (``--lengths``) with B = 4 and H = 32, 32, 8 (B*H*N constant from 4096 on, as
   ``gpu_fa3.py``), D 64 and 128, float16 and bfloat16, causal and not. Each stage runs through a
   ``ForwardPlan`` made once a shape (as the library's dispatch does); ``bench.time_repeats`` (median of 3
   ``do_bench`` runs and their range). Rows carry ``ratio_vs_sdpa_cudnn`` and ``ratio_vs_<base>``
   (``ratio_vs_v8f`` / ``ratio_vs_v8d``) with their ranges, ``builds_on``, ``checks_passed`` (every check of the
   stage's dtype and head dim) and ``bad_vs_sdpa`` (outputs differing from SDPA's by more than twice the dtype's
   tolerance at the timed shape).

``--fp8``: the same two steps for the FP8 stages instead (``fa3_fp8.FA4_STAGES``: v9a_fp8, conditional rescaling
with threshold 2 and P scaled by 2^6, the most e4m3 leaves room for; v9b_1of16_fp8 and v9b_1of4_fp8), each built
on v8c_fp8 at D 64 and 128. Inputs as ``gpu_fa3_fp8.py`` makes them (float16 N(0, 1) with 4 outlier channels in
q and k, quantised by ``fp8.quantize_fp8``); checks ``gpu_fa3_fp8.check_case`` (float64 of the dequantised
inputs, o within ``fp8.error_bound`` at the stage's P shift, lse within 2e-2 + 1e-3 |lse|; N_q, N_kv as
``gpu_fa3_fp8.CHECK_NS``, causal and not); timings at the same shapes as the 16-bit run beside v8c_fp8 and cuDNN's
fp16 forward on the float16 inputs (``sdpa_cudnn_fp16``). Rows carry ``dtype`` "float8_e4m3fn",
``ratio_vs_cudnn_fp16`` and ``ratio_vs_v8c_fp8`` with their ranges (``gpu_fa3_fp8.add_cudnn_ratios``),
``builds_on`` and ``checks_passed``.

Written as ``<out>/<date>-<device>-fa4-stages.json`` (``meta.kind = "fa4-stages"``; with ``--fp8``,
``...-fa4-stages-fp8.json``, kind "fa4-stages-fp8"), rewritten as it goes, so a run cut short keeps what it
measured; timing stops (rows say "not run") once ``--budget`` seconds have passed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.pop("TRITON_INTERPRET", None)

import gpu_fa3  # noqa: E402  (beside this script: its checks, inputs and log)
import gpu_fa3_fp8  # noqa: E402  (the FP8 inputs, checks, timing calls and cuDNN ratios)

V9_STAGES = ("v9a", "v9b_1of16", "v9b_1of4")
FP8_STAGES = ("v9a_fp8", "v9b_1of16_fp8", "v9b_1of4_fp8")
HEAD_DIMS = (64, 128)
DTYPES = ("float16", "bfloat16")
FP8 = "float8_e4m3fn"
FP8_REFERENCE = "sdpa_cudnn_fp16"  # cuDNN's forward on the float16 inputs the FP8 ones were quantised from
CHECK_SHAPES = ((1, 1, 2, 2), (17, 17, 2, 2), (1000, 1000, 2, 2), (4096, 4096, 1, 2))  # (N_q, N_kv, B, H)
LENGTHS = (1024, 4096, 16384)


def base_stages() -> dict[int, str]:
    """Head dim -> the v8 stage the v9 stages build on there (one for all of them: checked)."""
    from flashcourse.kernels.hopper import fa3

    bases = {d: {fa3.FA4_STAGES[s].at(d).builds_on for s in V9_STAGES} for d in HEAD_DIMS}
    assert all(len(b) == 1 for b in bases.values()), f"the v9 stages build on different stages: {bases}"
    return {d: b.pop() for d, b in bases.items()}


def fp8_base_stages() -> dict[int, str]:
    """Head dim -> the FP8 stage the FP8 v9 stages build on (one for all of them: checked)."""
    from flashcourse.kernels.hopper import fa3_fp8

    bases = {fa3_fp8.FA4_STAGES[s].builds_on for s in FP8_STAGES}
    assert len(bases) == 1, f"the FP8 v9 stages build on different stages: {bases}"
    base = bases.pop()
    return {d: base for d in HEAD_DIMS}


def plan(fp8: bool) -> dict:
    """What one run measures: the v9 stages, their base per head dim, the dtypes, the reference provider, the
    step-1 children ("<base>:<head dim>" compiles a base stage) and the results' name."""
    stages, bases = (FP8_STAGES, fp8_base_stages()) if fp8 else (V9_STAGES, base_stages())
    return {"fp8": fp8, "stages": stages, "bases": bases, "dtypes": (FP8,) if fp8 else DTYPES,
            "reference": FP8_REFERENCE if fp8 else "sdpa_cudnn",
            "jobs": list(stages) + [f"{stage}:{d}" for d, stage in bases.items()],
            "name": "fa4-stages-fp8" if fp8 else "fa4-stages"}


def time_shapes(lengths, dtypes=DTYPES) -> list[tuple]:
    """(B, H, N, D, dtype, causal) of every timing: B = 4, H = 32 up to N = 4096, then B*H*N constant."""
    shapes = [(4, 32 if n <= 4096 else 32 * 4096 // n, n) for n in lengths]
    return [(b, h, n, d, dt, c) for dt in dtypes for d in HEAD_DIMS for (b, h, n) in shapes for c in (False, True)]


def run_fp8_child(stage: str, out: Path) -> None:
    """Step 1 for one FP8 stage: a v9 stage's checks and its compiled variants, or a base stage's compiles at one
    head dim (``v8c_fp8:128``): one small call a causality."""
    import torch

    from flashcourse.kernels import fp8
    from flashcourse.kernels.hopper import fa3_fp8

    with out.open("a") as file:
        def emit(row):
            file.write(json.dumps(row) + "\n")
            file.flush()

        if ":" in stage:
            stage, head_dim = stage.split(":")
            for causal in (False, True):
                try:
                    x = fp8.quantize_fp8(*gpu_fa3_fp8.make_inputs(1, 1, 128, int(head_dim)))
                    fa3_fp8.fa3_fp8_forward(x.q, x.k, x.v, x.q_descale, x.k_descale, x.v_descale, causal=causal,
                                            stage=stage)
                    torch.cuda.synchronize()
                    status = "ok"
                except Exception as error:  # noqa: BLE001 - recorded; the timing says "not run" too
                    status = gpu_fa3._error_text(error)
                emit({"kind": "compiled", "stage": stage, "head_dim": int(head_dim), "dtype": FP8, "causal": causal,
                      "status": status})
            return
        builds_on = fa3_fp8.FA4_STAGES[stage].builds_on
        for head_dim in HEAD_DIMS:
            for causal in (False, True):
                for n, n_kv in gpu_fa3_fp8.CHECK_NS:
                    row = gpu_fa3_fp8.check_case(stage, n, n_kv, head_dim, causal)
                    row.update(stage=stage, dtype=FP8, builds_on=builds_on)
                    emit(row)
                    gpu_fa3.log(f"{stage} check D={head_dim} causal={causal} N_q={n} N_kv={n_kv}: {row['status']}"
                                + (f" (max |err| o {row['max_err_over_bound']:.2f} x bound, lse "
                                   f"{row['max_err_lse']:.2e})" if "max_err_o" in row else ""))
        for row in gpu_fa3_fp8.compiled_rows(stage):
            row.update(stage=stage, dtype=FP8)
            emit(row)
            gpu_fa3.log(f"{stage} compiled {row.get('constants', '')}: {row.get('n_regs')} registers, "
                        f"{row.get('n_spills')} spills, {row.get('shared')} B shared ({row['status']})")


def run_child(stage: str, out: Path) -> None:
    """Step 1 for one stage: a v9 stage's checks; a base stage's compiles at its head dims (``--child
    v8f:64``). Rows go to ``out``, one JSON line each, as they come. FP8 stages: ``run_fp8_child``."""
    import torch

    from flashcourse.kernels.hopper import fa3

    if stage.split(":")[0].endswith("_fp8"):
        run_fp8_child(stage, out)
        return
    with out.open("a") as file:
        if ":" in stage:  # a base stage at one head dim: compile each variant with one small call
            stage, head_dim = stage.split(":")
            for dtype in DTYPES:
                for causal in (False, True):
                    q, k, v = gpu_fa3._inputs(1, 1, 128, int(head_dim), dtype)
                    try:
                        fa3.fa3_forward(q, k, v, causal=causal, stage=stage)
                        torch.cuda.synchronize()
                        status = "ok"
                    except Exception as error:  # noqa: BLE001 - recorded; the timing says "not run" too
                        status = gpu_fa3._error_text(error)
                    file.write(json.dumps({"kind": "compiled", "stage": stage, "head_dim": int(head_dim),
                                           "dtype": dtype, "causal": causal, "status": status}) + "\n")
                    file.flush()
            return
        for dtype in DTYPES:
            for head_dim in HEAD_DIMS:
                for causal in (False, True):
                    for shape in CHECK_SHAPES:
                        row = gpu_fa3.check_case(stage, shape, head_dim, dtype, causal)
                        row["builds_on"] = fa3.FA4_STAGES[stage].at(head_dim).builds_on
                        file.write(json.dumps(row) + "\n")
                        file.flush()
                        gpu_fa3.log(f"{stage} check {dtype} D={head_dim} causal={causal} N={shape[0]}: "
                                    f"{row['status']}" + (f" (max |err| o {row['max_err_o']:.2e}, lse "
                                                          f"{row['max_err_lse']:.2e})" if "max_err_o" in row else ""))
        # Registers, spills and shared memory of every variant this child compiled (v9b_1of4 at D = 64 spills 32
        # bytes a thread under Triton 3.9, non-causal: tests/test_v9_compile.py's SPILLS).
        for kernel in {fa3.FA4_STAGES[stage].at(d).kernel for d in HEAD_DIMS}:
            for row in gpu_fa3.compiled_rows(kernel, stage):
                file.write(json.dumps(row) + "\n")
                file.flush()
                gpu_fa3.log(f"{stage} compiled {row.get('constants', '')}: {row.get('n_regs')} registers, "
                            f"{row.get('n_spills')} spills, {row.get('shared')} B shared ({row['status']})")


def run_children(jobs: list[str], timeout: float) -> tuple[list[dict], dict]:
    """Step 1: every child at once; returns their rows and each child's status."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH"))
                                                      if p))
    running = []
    for job in jobs:
        with tempfile.NamedTemporaryFile(suffix=".jsonl", delete=False) as file:
            path = Path(file.name)
        proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--child", job, "--rows", str(path)],
                                env=env)
        running.append((job, proc, path))
    began, rows, status = time.time(), [], {}
    for job, proc, path in running:
        try:
            code = proc.wait(timeout=max(1.0, timeout - (time.time() - began)))
            status[job] = "ok" if code == 0 else f"child exited {code}"
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            status[job] = f"killed after {timeout:.0f} s (a hang: mbarrier deadlock? or slow compiles)"
        job_rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        path.unlink()
        rows.extend(job_rows)
        checks = [r for r in job_rows if r["kind"] == "check"]
        gpu_fa3.log(f"{job}: {status[job]}, {sum(r['status'] == 'ok' for r in checks)}/{len(checks)} checks passed")
    return rows, status


def time_one(provider: str, stage: str | None, shape: tuple, builds_on: str = "") -> dict:
    """One timing row of ``provider`` (a stage's name, run through a ForwardPlan, or "sdpa_cudnn")."""
    import torch

    from flashcourse.bench import attention_flops, time_repeats
    from flashcourse.bench.providers import sdpa
    from flashcourse.kernels.hopper import fa3
    from flashcourse.tolerance import TOLERANCES

    batch, heads, n, head_dim, dtype, causal = shape
    row = {"kind": "time", "provider": provider, "dtype": dtype, "head_dim": head_dim, "n": n, "causal": causal,
           "batch": batch, "heads": heads, "mode": "fwd"}
    if stage:
        row.update(stage=stage, builds_on=builds_on)
    try:
        q, k, v = gpu_fa3._inputs(batch, heads, n, head_dim, dtype)
        if stage:
            plan = fa3.ForwardPlan(stage, q, k, causal=causal, scale=None)

            def fn():
                return plan(q, k, v)

            rtol, atol = TOLERANCES[dtype]
            expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal).float()
            row["bad_vs_sdpa"] = int(((fn()[0].float() - expected).abs() > 2 * (atol + rtol * expected.abs())).sum())
            del expected
        else:
            cudnn = sdpa("sdpa_cudnn")

            def fn():
                return cudnn(q, k, v, causal)
        torch.cuda.synchronize()
        timing = time_repeats(fn)
        row.update(timing.fields(attention_flops(batch, heads, n, head_dim, causal=causal)), status="ok")
    except Exception as error:  # noqa: BLE001 - recorded, and the next row runs
        row["status"] = gpu_fa3._error_text(error)
    torch.cuda.empty_cache()
    return row


def time_one_fp8(provider: str, shape: tuple, builds_on: str = "") -> dict:
    """One FP8 timing row: ``provider`` an FP8 stage (``fa3_fp8_forward`` on ``gpu_fa3_fp8.make_inputs``
    quantised, V as given) or "sdpa_cudnn_fp16" (cuDNN on the float16 inputs)."""
    import torch

    from flashcourse.bench import attention_flops, time_repeats

    batch, heads, n, head_dim, dtype, causal = shape
    row = {"kind": "time", "provider": provider, "dtype": dtype, "head_dim": head_dim, "n": n, "causal": causal,
           "batch": batch, "heads": heads, "mode": "fwd", "out_dtype": gpu_fa3_fp8.OUT_DTYPE}
    if provider != FP8_REFERENCE:
        row.update(stage=provider, builds_on=builds_on)
    try:
        prepare = gpu_fa3_fp8._cudnn_fp16_call if provider == FP8_REFERENCE else gpu_fa3_fp8._fa3_fp8_call(provider)
        fn = prepare(*gpu_fa3_fp8.make_inputs(batch, heads, n, head_dim), causal)
        fn()
        torch.cuda.synchronize()
        timing = time_repeats(fn)
        row.update(timing.fields(attention_flops(batch, heads, n, head_dim, causal=causal)), status="ok")
    except Exception as error:  # noqa: BLE001 - recorded, and the next row runs
        row["status"] = gpu_fa3._error_text(error)
    torch.cuda.empty_cache()
    return row


def rate_rows(timed: list[dict], checks: list[dict], run: dict) -> None:
    """Each v9 stage's timing rows get ``checks_passed`` (every check of its dtype and head dim passed, and there
    was one) and the ratios: ``ratio_vs_<base>`` and ``ratio_vs_sdpa_cudnn`` (16 bits), or
    ``ratio_vs_cudnn_fp16`` and ``ratio_vs_<base>`` (FP8), each with its range."""
    from flashcourse.bench.providers import add_ratios

    failed = {(r["stage"], r["dtype"], r["head_dim"]) for r in checks if r["status"] != "ok"}
    for row in timed:
        if row["provider"] in run["stages"]:
            row["checks_passed"] = (row["provider"], row["dtype"], row["head_dim"]) not in failed and any(
                r["stage"] == row["provider"] and r["dtype"] == row["dtype"] and r["head_dim"] == row["head_dim"]
                for r in checks)
    if run["fp8"]:
        gpu_fa3_fp8.add_cudnn_ratios(timed)  # ratio_vs_cudnn_fp16 on every FP8 row, each stage against the rest
        return
    add_ratios(timed, key=gpu_fa3._shape, rate="tflops", ours=run["stages"])  # ratio_vs_<base>, ratio_vs_sdpa_cudnn
    add_ratios([r for r in timed if r["provider"] not in run["stages"]], key=gpu_fa3._shape, rate="tflops",
               ours=set(run["bases"].values()))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="results folder (default: the checkout's benchmarks/results)")
    parser.add_argument("--lengths", type=gpu_fa3.parse_lengths, default=LENGTHS,
                        help="sequence lengths to time, comma-separated (default 1024,4096,16384)")
    parser.add_argument("--stage-timeout", type=float, default=150.0, help="seconds for step 1's children")
    parser.add_argument("--budget", type=float, default=225.0, help="seconds after which no more timings start")
    parser.add_argument("--fp8", action="store_true",
                        help="the FP8 stages (fa3_fp8.FA4_STAGES on v8c_fp8) instead of the 16-bit ones")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--rows", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        run_child(args.child, Path(args.rows))
        return 0

    import torch
    import triton

    from flashcourse.bench import environment_info, save_results

    start = time.time()
    if not torch.cuda.is_available():
        print("gpu_fa4_stages.py needs a CUDA GPU (Hopper)")
        return 2
    from flashcourse.kernels.hopper import fa3

    run = plan(args.fp8)
    bases = run["bases"]
    meta = environment_info()
    meta.update(capability=list(torch.cuda.get_device_capability()), lengths=list(args.lengths),
                builds_on={str(d): s for d, s in bases.items()}, reference=run["reference"])
    if args.fp8:
        from flashcourse.kernels.hopper import fa3_fp8

        meta.update(tested_triton=list(fa3_fp8.TESTED_TRITON), out_dtype=gpu_fa3_fp8.OUT_DTYPE,
                    inputs=f"q, k, v ~ N(0, 1) float16, {gpu_fa3_fp8.OUTLIER_CHANNELS} outlier channels "
                           f"x{gpu_fa3_fp8.OUTLIER_FACTOR:g} in q and k, quantised by fp8.quantize_fp8 "
                           "(gpu_fa3_fp8.make_inputs); cuDNN runs on the float16 inputs",
                    stages={name: {"adds": s.adds, "expected": s.expected, "p_shift": s.p_shift,
                                   "rescale_threshold": s.rescale_threshold, "emulated_columns": s.emulated_columns,
                                   "block_n": fa3_fp8.BLOCK_N}
                            for name, s in ((n, fa3_fp8.FA4_STAGES[n]) for n in run["stages"])})
    else:
        meta.update(tested_triton=list(fa3.TESTED_TRITON),
                    stages={name: {"adds": fa3.FA4_STAGES[name].adds, "expected": fa3.FA4_STAGES[name].expected,
                                   "rescale_threshold": fa3.FA4_STAGES[name].rescale_threshold,
                                   "emulated_columns": fa3.FA4_STAGES[name].emulated_columns,
                                   "block_n": fa3.FA4_STAGES[name].block_n} for name in run["stages"]})
    gpu_fa3.log(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}; "
                f"stages {run['stages']} on {bases}")

    def save(rows, done=False):
        meta.update(seconds=round(time.time() - start, 1), complete=done)
        return save_results(run["name"], rows, directory=Path(args.out) if args.out else None, kind=run["name"],
                            meta=meta)

    rows, meta["child_status"] = run_children(run["jobs"], args.stage_timeout)
    save(rows)

    timed = []
    for shape in time_shapes(args.lengths, run["dtypes"]):
        batch, heads, n, head_dim, dtype, causal = shape
        providers = ([(bases[head_dim], "")] + [(s, bases[head_dim]) for s in run["stages"]]
                     + [(run["reference"], "")])
        for provider, builds_on in providers:
            if time.time() - start > args.budget:
                row = {"kind": "time", "provider": provider, "dtype": dtype, "head_dim": head_dim, "n": n,
                       "causal": causal, "batch": batch, "heads": heads, "mode": "fwd",
                       "status": f"not run: the run's {args.budget:.0f} s budget is spent"}
            elif args.fp8:
                row = time_one_fp8(provider, shape, builds_on)
            else:
                row = time_one(provider, None if provider == "sdpa_cudnn" else provider, shape, builds_on)
            timed.append(row)
            gpu_fa3.log(f"{provider} {dtype} D={head_dim} N={n} causal={causal}: "
                        + (f"{row['tflops']:.0f} TFLOP/s" if row["status"] == "ok" else row["status"]))
    rate_rows(timed, [r for r in rows if r["kind"] == "check"], run)
    rows.extend(timed)
    path = save(rows, done=True)
    gpu_fa3.log(f"wrote {path} ({meta['seconds']} s)")

    versus_cudnn = "ratio_vs_cudnn_fp16" if args.fp8 else "ratio_vs_sdpa_cudnn"
    print(f"\nTFLOP/s median; x the base stage; x cuDNN{' fp16' if args.fp8 else ''}")
    for r in timed:
        if r["provider"] in run["stages"] and r["status"] == "ok":
            base = bases[r["head_dim"]]
            print(f"{r['provider']:13} {r['dtype']:13} D={r['head_dim']:<3} N={r['n']:<5} causal={r['causal']!s:5} "
                  f"{r['tflops']:.0f}  {r.get(f'ratio_vs_{base}', float('nan')):.3f}x {base}  "
                  f"{r.get(versus_cudnn, float('nan')):.2f}x cuDNN  checks {r['checks_passed']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
