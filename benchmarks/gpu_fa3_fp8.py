"""The FP8 Gluon forward's stages (``flashcourse.kernels.hopper.fa3_fp8``: v8c_fp8, v8e_fp8; V transposed inside
the kernel) checked and timed on an H100 / H200 in one command, beside our Triton FP8 forward and cuDNN's fp16.

    PYTHONPATH=src python benchmarks/gpu_fa3_fp8.py --out benchmarks/results         # every stage, about 2-4 minutes
    PYTHONPATH=src python benchmarks/gpu_fa3_fp8.py --stages v8e_fp8 --out /tmp/fp8  # one stage (and the references)
    PYTHONPATH=src python benchmarks/gpu_fa3_fp8.py --quick --out /tmp/fp8             # fewer shapes

1. Each stage, in a child process of its own (a kernel that deadlocks on an mbarrier hangs only its child,
   killed after ``--stage-timeout`` seconds and recorded; rows are written as they come, so a killed child keeps
   what it finished, and the next stage still runs):
   - correctness: causal and not, N in {1, 17, 128, 1000, 4096} and (N_q, N_kv) in {(200, 1000), (1000, 200)},
     D 64 and 128, B = 2, H = 2 (N = 4096: B = 1), bfloat16 output; q, k, v ~ N(0, 1) with 4 outlier channels in
     q and k (as ``bench fp8``), quantised by ``fp8.quantize_fp8``; o within ``fp8.error_bound`` of
     ``fp8.reference_forward`` (float64 of the dequantised inputs, P rounded as the kernel rounds it), lse within
     2e-2 + 1e-3 |lse| (the FP8 products are exact, but Hopper's FP8 wgmma accumulates with fewer bits than
     float32);
   - the compiled variants' registers, spills and shared memory, from the driver;
   - timing of ``fa3_fp8_forward(..., stage=...)`` on V as given (``v_layout: "as_given"``).
2. The references, in this process, on the same shapes: our Triton FP8 forward (``fp8.flash_attention_forward_fp8``)
   with V as given (a per-call copy into keys-adjacent storage, ``v_layout: "as_given"``) and with V kept
   keys-adjacent (``fp8.v_keys_contiguous`` once, outside the timing, ``v_layout: "keys_adjacent"``), and SDPA's
   cuDNN backend on the float16 inputs (``sdpa_cudnn_fp16``).

Timing shapes: B = 4, H = 16, N 4096 / 8192 / 16384, D 128 and 64, causal and not (``bench fp8``'s grid). Every
timing is ``flashcourse.bench.time_repeats`` (median of 3 ``do_bench`` runs with their range); each FP8 row
carries ``ratio_vs_cudnn_fp16`` (its TFLOP/s over cuDNN's fp16 forward of the same shape, same run; with
``_min`` / ``_max`` from the ranges) and ``ratio_vs_<other provider>`` (``bench.providers.add_ratios``: a stage's
rows against the references and the other stages). A stage's rows have ``provider`` = the stage's name. The
target: a stage with V as given >= 1.5x cuDNN's fp16 at D = 128, N >= 4096. JSON:
``<out>/<date>-<device>-fa3-fp8.json``, ``meta.kind = "fa3-fp8"``, ``meta.stages`` what each stage adds and was
expected to do; rows ``kind`` "check", "compiled" or "time", ``status`` "ok" or the error. The whole run keeps
within ``--budget`` seconds (280 by default).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
os.environ.pop("TRITON_INTERPRET", None)

from gpu_fa3 import _error_text  # noqa: E402 - a CUDA error's row names the fault, as gpu_fa3.py's and gpu_b7.py's

CHECK_NS = ((1, 1), (17, 17), (128, 128), (1000, 1000), (4096, 4096), (200, 1000), (1000, 200))  # (N_q, N_kv)
QUICK_CHECK_NS = ((17, 17), (1000, 1000), (4096, 4096), (200, 1000))
BATCH, HEADS = 4, 16
TIME_NS = (4096, 8192, 16384)
QUICK_TIME_NS = (4096, 16384)
HEAD_DIMS = (128, 64)
OUT_DTYPE = "bfloat16"
REFERENCES = ("triton_fp8_as_given", "triton_fp8_keys_adjacent", "sdpa_cudnn_fp16")
OUTLIER_CHANNELS, OUTLIER_FACTOR = 4, 4.0


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def make_inputs(batch, heads, n, head_dim, seed=0, n_kv=None):
    """float16 q (N rows), k and v (``n_kv`` rows, default N) ~ N(0, 1) on the GPU, with outlier channels in q and
    k (``bench fp8``'s inputs)."""
    import torch

    gen = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = (torch.randn((batch, heads, rows, head_dim), generator=gen, device="cuda")
               for rows in (n, n if n_kv is None else n_kv, n if n_kv is None else n_kv))
    channels = torch.randperm(head_dim, generator=torch.Generator().manual_seed(seed))[:OUTLIER_CHANNELS]
    q[..., channels] *= OUTLIER_FACTOR
    k[..., channels] *= OUTLIER_FACTOR
    return tuple(t.to(torch.float16) for t in (q, k, v))


def _row(kind, provider, n, head_dim, causal, batch, heads, v_layout=None):
    row = {"kind": kind, "provider": provider, "n": n, "head_dim": head_dim, "causal": causal, "batch": batch,
           "heads": heads, "out_dtype": OUT_DTYPE}
    if v_layout:
        row["v_layout"] = v_layout
    return row


_TRACEBACK_SHOWN = []


def check_case(stage, n, n_kv, head_dim, causal) -> dict:
    import torch

    from flashcourse.kernels import fp8
    from flashcourse.kernels.hopper import fa3_fp8

    batch, heads = (1, 2) if max(n, n_kv) >= 4096 else (2, 2)
    row = _row("check", stage, n, head_dim, causal, batch, heads, "as_given")
    row["n_kv"] = n_kv
    try:
        x = fp8.quantize_fp8(*make_inputs(batch, heads, n, head_dim, seed=n + 3 * n_kv + head_dim, n_kv=n_kv))
        o, lse = fa3_fp8.fa3_fp8_forward(x.q, x.k, x.v, x.q_descale, x.k_descale, x.v_descale, causal=causal,
                                         out_dtype=torch.bfloat16, stage=stage)
        torch.cuda.synchronize()
        qd, kd, vd = x.dequantized()
        p_shift = fa3_fp8._stage(stage).p_shift  # fp8.P_SHIFT but in v9a_fp8 (fa3_fp8.py says why)
        o_ref, lse_ref, p_abs_v = fp8.reference_forward(qd, kd, vd, causal=causal, p_shift=p_shift)
        bound = fp8.error_bound(o_ref, p_abs_v, float(vd.abs().max()), n_kv, out_dtype=torch.bfloat16,
                                p_shift=p_shift)
        err_o = (o.double() - o_ref).abs()
        err_lse = (lse.double() - lse_ref).abs()
        bad_o = int((err_o > bound).sum())
        bad_lse = int((err_lse > 2e-2 + 1e-3 * lse_ref.abs()).sum())
        finite = bool(torch.isfinite(o).all() and torch.isfinite(lse).all())
        row.update(max_err_o=float(err_o.max()), rms_err_o=float(err_o.pow(2).mean().sqrt()),
                   max_err_lse=float(err_lse.max()), max_err_over_bound=float((err_o / bound).max()),
                   bad_o=bad_o, bad_lse=bad_lse, finite=finite)
        row["status"] = "ok" if finite and bad_o == 0 and bad_lse == 0 else "wrong"
    except Exception as error:  # noqa: BLE001 - recorded, and the next case runs
        row["status"] = _error_text(error)
        if not _TRACEBACK_SHOWN:
            _TRACEBACK_SHOWN.append(True)
            traceback.print_exc()
    return row


def time_case(provider, prepare, n, head_dim, causal, v_layout=None) -> dict:
    """``prepare(q, k, v, causal)`` (float16 inputs) returns the call to time; its setup is not timed."""
    import torch

    from flashcourse.bench import attention_flops, time_repeats

    row = _row("time", provider, n, head_dim, causal, BATCH, HEADS, v_layout)
    try:
        call = prepare(*make_inputs(BATCH, HEADS, n, head_dim), causal)
        call()
        torch.cuda.synchronize()
        timing = time_repeats(call)
        row.update(timing.fields(attention_flops(BATCH, HEADS, n, head_dim, causal=causal)), status="ok")
    except Exception as error:  # noqa: BLE001
        row["status"] = _error_text(error)
    torch.cuda.empty_cache()
    return row


def _fa3_fp8_call(stage: str):
    def prepare(q, k, v, causal):
        import torch

        from flashcourse.kernels import fp8
        from flashcourse.kernels.hopper import fa3_fp8

        x = fp8.quantize_fp8(q, k, v)
        return lambda: fa3_fp8.fa3_fp8_forward(x.q, x.k, x.v, x.q_descale, x.k_descale, x.v_descale,
                                               causal=causal, out_dtype=torch.bfloat16, stage=stage)
    return prepare


def _triton_fp8_call(keep_v: bool):
    def prepare(q, k, v, causal):
        import torch

        from flashcourse.kernels import fp8

        x = fp8.quantize_fp8(q, k, v)
        v8 = fp8.v_keys_contiguous(x.v) if keep_v else x.v  # kept: the copy happens once, here
        return lambda: fp8.flash_attention_forward_fp8(x.q, x.k, v8, **x.descales(), causal=causal,
                                                       out_dtype=torch.bfloat16)
    return prepare


def _cudnn_fp16_call(q, k, v, causal):
    from flashcourse.bench.providers import sdpa

    run = sdpa("sdpa_cudnn")
    return lambda: run(q, k, v, causal)


def time_grid(quick: bool):
    ns = QUICK_TIME_NS if quick else TIME_NS
    return [(n, d, c) for d in HEAD_DIMS for n in ns for c in (False, True)]


def compiled_rows(stage: str) -> list[dict]:
    """Registers, spills and shared memory of each variant this process compiled, from the driver (best effort)."""
    from flashcourse.kernels.hopper import fa3_fp8

    rows = []
    try:
        for caches in fa3_fp8._fa3_fp8_kernel.device_caches.values():
            for compiled in caches[0].values():
                compiled._init_handles()
                constants = getattr(compiled.src, "constants", {}) or {}
                rows.append({"kind": "compiled", "provider": stage,
                             "constants": {str(k): str(v) for k, v in constants.items()},
                             "n_regs": compiled.n_regs, "n_spills": compiled.n_spills,
                             "shared": compiled.metadata.shared, "status": "ok"})
    except Exception as error:  # noqa: BLE001
        rows.append({"kind": "compiled", "provider": stage, "status": _error_text(error)})
    return rows


def run_child(stage: str, out: Path, quick: bool) -> None:
    """One stage: every check, then every timing; one JSON line a row, written as it comes."""
    failed = set()
    with out.open("a") as file:
        def emit(row):
            file.write(json.dumps(row) + "\n")
            file.flush()

        for head_dim in HEAD_DIMS:
            for causal in (False, True):
                for n, n_kv in QUICK_CHECK_NS if quick else CHECK_NS:
                    row = check_case(stage, n, n_kv, head_dim, causal)
                    emit(row)
                    if row["status"] != "ok":
                        failed.add(head_dim)
                    log(f"{stage} check D={head_dim} causal={causal} N_q={n} N_kv={n_kv}: {row['status']}"
                        + (f" (max |err| o {row['max_err_o']:.2e} = {row['max_err_over_bound']:.2f} x bound, "
                           f"lse {row['max_err_lse']:.2e})" if "max_err_o" in row else ""))
        for row in compiled_rows(stage):
            emit(row)
            log(f"{stage} compiled {row.get('constants', '')}: {row.get('n_regs')} registers, {row.get('n_spills')} "
                f"spills, {row.get('shared')} B shared ({row['status']})")
        for n, head_dim, causal in time_grid(quick):
            row = time_case(stage, _fa3_fp8_call(stage), n, head_dim, causal, "as_given")
            row["checks_passed"] = head_dim not in failed  # timed even where a check failed: the row says so
            emit(row)
            log(f"{stage} D={head_dim} N={n} causal={causal}: "
                + (f"{row['tflops']:.0f} TFLOP/s ({row['tflops_min']:.0f}-{row['tflops_max']:.0f})"
                   if row["status"] == "ok" else row["status"]))


def reference_rows(quick: bool, deadline: float) -> list[dict]:
    calls = {"triton_fp8_as_given": (_triton_fp8_call(False), "as_given"),
             "triton_fp8_keys_adjacent": (_triton_fp8_call(True), "keys_adjacent"),
             "sdpa_cudnn_fp16": (_cudnn_fp16_call, None)}
    rows = []
    for n, head_dim, causal in time_grid(quick):
        for provider in REFERENCES:
            prepare, v_layout = calls[provider]
            if time.time() > deadline:
                row = _row("time", provider, n, head_dim, causal, BATCH, HEADS, v_layout)
                row["status"] = "not run: the run's budget is spent"
            else:
                row = time_case(provider, prepare, n, head_dim, causal, v_layout)
            rows.append(row)
            log(f"{provider} D={head_dim} N={n} causal={causal}: "
                + (f"{row['tflops']:.0f} TFLOP/s" if row["status"] == "ok" else row["status"]))
    return rows


def add_cudnn_ratios(rows: list[dict]) -> None:
    """``ratio_vs_cudnn_fp16`` (with its range) on every FP8 time row, against cuDNN's fp16 of the same shape;
    the other ratios through ``bench.providers.add_ratios``."""
    from flashcourse.bench.providers import add_ratios

    def key(r):
        return r["n"], r["head_dim"], r["causal"], r["batch"], r["heads"]

    cudnn = {key(r): r for r in rows if r["provider"] == "sdpa_cudnn_fp16" and r.get("status") == "ok"}
    for r in rows:
        ref = cudnn.get(key(r))
        if r["provider"] != "sdpa_cudnn_fp16" and r.get("status") == "ok" and ref:
            r["ratio_vs_cudnn_fp16"] = r["tflops"] / ref["tflops"]
            r["ratio_vs_cudnn_fp16_min"] = r["tflops_min"] / ref["tflops_max"]
            r["ratio_vs_cudnn_fp16_max"] = r["tflops_max"] / ref["tflops_min"]
    fp8_rows = [r for r in rows if r["provider"] != "sdpa_cudnn_fp16"]
    for stage in sorted({r["provider"] for r in fp8_rows} - set(REFERENCES)):  # each stage against the rest
        add_ratios(fp8_rows, key=key, rate="tflops", ours=[stage])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="results folder (default: the checkout's benchmarks/results)")
    parser.add_argument("--quick", action="store_true", help="fewer check lengths and timing shapes")
    parser.add_argument("--stages", nargs="+", default=None,
                        help="stages of fa3_fp8.STAGES to check and time (default: every stage)")
    parser.add_argument("--stage-timeout", type=float, default=120.0, help="seconds for each stage's child")
    parser.add_argument("--budget", type=float, default=280.0, help="seconds for the whole run")
    parser.add_argument("--child", help=argparse.SUPPRESS)  # the stage a child runs
    parser.add_argument("--rows", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.child:
        run_child(args.child, Path(args.rows), args.quick)
        return 0

    import torch
    import triton

    from flashcourse.bench import environment_info, save_results

    start = time.time()
    if not torch.cuda.is_available():
        print("gpu_fa3_fp8.py needs a CUDA GPU (Hopper)")
        return 2
    meta = environment_info()
    meta.update(capability=list(torch.cuda.get_device_capability()), quick=args.quick, out_dtype=OUT_DTYPE,
                inputs=f"q, k, v ~ N(0, 1) float16, {OUTLIER_CHANNELS} outlier channels x{OUTLIER_FACTOR:g} in q "
                       "and k, quantised by fp8.quantize_fp8 (not incoherent); cuDNN runs on the float16 inputs",
                target="a stage (V as given) >= 1.5x sdpa_cudnn_fp16 at D = 128, N >= 4096")
    stages = []
    try:
        from flashcourse.kernels.hopper import fa3_fp8

        stages = args.stages or list(fa3_fp8.STAGES)
        unknown = [name for name in stages if name not in fa3_fp8.STAGES]
        if unknown:
            parser.error(f"--stages {' '.join(unknown)}: expected names of {list(fa3_fp8.STAGES)}")
        meta.update(tested_triton=list(fa3_fp8.TESTED_TRITON), block_n=fa3_fp8.BLOCK_N, ring=fa3_fp8.RING,
                    producer_regs=fa3_fp8.PRODUCER_REGS, consumer_regs=fa3_fp8.CONSUMER_REGS,
                    stages={name: {"adds": fa3_fp8.STAGES[name].adds, "expected": fa3_fp8.STAGES[name].expected}
                            for name in stages})
        import_error = None
    except Exception as error:  # noqa: BLE001 - the references are still timed
        import_error = _error_text(error)
        log(f"flashcourse.kernels.hopper.fa3_fp8 does not import: {import_error}")
    log(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}")

    rows: list[dict] = []
    out = Path(args.out) if args.out else None

    def save(done=False):
        meta.update(seconds=round(time.time() - start, 1), complete=done)
        return save_results("fa3-fp8", rows, directory=out, kind="fa3-fp8", meta=meta)

    reference_reserve = 60.0  # seconds kept for the references (about 20 s on the H200, 2026-12-01)
    meta["stage_status"] = {}
    for stage in stages:
        left = start + args.budget - reference_reserve - time.time()
        if import_error or left < 10:
            meta["stage_status"][stage] = f"not run: {import_error or 'the run budget is spent'}"
            log(f"{stage}: {meta['stage_status'][stage]}")
            continue
        timeout = min(args.stage_timeout, left)
        with tempfile.NamedTemporaryFile(suffix=".jsonl", delete=False) as file:
            path = Path(file.name)
        command = [sys.executable, str(Path(__file__).resolve()), "--child", stage, "--rows", str(path)]
        if args.quick:
            command.append("--quick")
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT / "src"),
                                                                       os.environ.get("PYTHONPATH")) if p))
        log(f"{stage}: child started ({timeout:.0f} s at most)")
        try:
            proc = subprocess.run(command, env=env, timeout=timeout)
            status = "ok" if proc.returncode == 0 else f"child exited {proc.returncode}"
        except subprocess.TimeoutExpired:
            status = f"killed after {timeout:.0f} s (a hang: mbarrier deadlock?)"
        meta["stage_status"][stage] = status
        found = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        path.unlink()
        rows.extend(found)
        checks = [r for r in found if r["kind"] == "check"]
        log(f"{stage}: {status}, {sum(r['status'] == 'ok' for r in checks)}/{len(checks)} checks")
        save()

    log("references: Triton FP8 (V as given, V keys-adjacent), SDPA cuDNN fp16")
    try:
        rows.extend(reference_rows(args.quick, deadline=start + args.budget - 15))
    except Exception as error:  # noqa: BLE001
        log(f"references failed: {_error_text(error)}")
        meta["references_status"] = _error_text(error)
    add_cudnn_ratios([r for r in rows if r["kind"] == "time"])
    path = save(done=True)
    log(f"wrote {path} ({meta['seconds']} s)")

    print("\nTFLOP/s, median (range); x cuDNN fp16")
    for r in rows:
        if r["kind"] == "time" and r["provider"] != "sdpa_cudnn_fp16":
            ratio = r.get("ratio_vs_cudnn_fp16")
            text = (f"{r['tflops']:.0f} ({r['tflops_min']:.0f}-{r['tflops_max']:.0f})"
                    + (f"  {ratio:.2f}x" if ratio else "")) if r["status"] == "ok" else r["status"]
            versus = "".join(f"  {r[f'ratio_vs_{name}']:.2f}x {name}" for name in stages
                             if name != r["provider"] and f"ratio_vs_{name}" in r)
            print(f"{r['provider']:25} {r.get('v_layout', ''):13} D={r['head_dim']:<3} N={r['n']:<5} "
                  f"causal={r['causal']!s:5} {text}{versus}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
