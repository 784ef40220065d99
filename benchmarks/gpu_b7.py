"""Backward b7 (``flashcourse.kernels.hopper.fa3_backward_tma``: FA3's design, dQ by a TMA reduce-add)
checked against float64 and timed beside b1, cuDNN and, where importable, FlashAttention-4, on an H100 / H200 under
Triton >= 3.9. Its first GPU run.

The GPU machines carry Triton 3.6; 3.9 travels in parts (``scripts/wheel_parts.py``, which prints the calls)
and is first on the path:

    PYTHONPATH=/tmp/t39:src python3 benchmarks/gpu_b7.py --out $OUT            # about 3 minutes
    PYTHONPATH=/tmp/t39:src python3 benchmarks/gpu_b7.py --quick --out $OUT    # N = 8192 only, about 2

b7 runs in a child process (``gpu_fa3.run_stages``: a kernel that deadlocks on an mbarrier hangs only the child,
killed after ``--stage-timeout`` s and recorded as such):

1. gradients against float64 autograd, as ``gpu_fa3_backward.py`` checks b6: causal and not, N in {1, 17, 130,
   1000, 4096} (a tile cut short, one row, a length that is no multiple of the 32- or 64-row query tile nor of
   the 128-key tile), D 64 and 128, float16 and bfloat16; o and lse from the v7 forward; each gradient divided
   by max(1, max |reference|) must lie within ``flashcourse.tolerance``'s (rtol, atol);
2. timing of the backward alone at (B, H, N) = (4, 32, 4096) and (4, 16, 8192), causal and not, D 64 and 128,
   float16 and bfloat16 (``checks_passed`` per row).

The parent then times on the same shapes SDPA's cuDNN backward, our b1 and FlashAttention-4's backward (the
``flash_attn.cute`` interface of ``flash-attn-4``, if it imports; else one row saying why). Every timing is
``flashcourse.bench.time_repeats`` (median of 3, with the range), FLOPs ``attention_flops(..., mode="bwd")``,
ratios (``ratio_vs_sdpa_cudnn``, ``ratio_vs_b1``, ``ratio_vs_fa4``) from ``bench.providers.add_ratios``. The JSON
is ``<out>/<date>-<device>-b7.json`` (``meta.kind = "b7"``), rewritten after the child so a run cut short keeps
what it measured.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_fa3 import _error_text, _inputs, _shape, compiled_rows, log, run_stages  # noqa: E402
from gpu_fa3_backward import _forward, b1, reference_grads, sdpa_backward, time_case  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
os.environ.pop("TRITON_INTERPRET", None)

PROVIDER = "b7"
CHECK_NS = (1, 17, 130, 1000, 4096)
TIME_SHAPES = ((4, 32, 4096), (4, 16, 8192))  # (B, H, N): B*H*N constant
QUICK_TIME_SHAPES = ((4, 16, 8192),)
HEAD_DIMS = (64, 128)
DTYPES = ("float16", "bfloat16")
REFERENCES = ("sdpa_cudnn", "b1", "fa4")
REFERENCE_RESERVE = 90.0  # seconds kept for timing the references after the child


def time_shapes(quick: bool):
    shapes = QUICK_TIME_SHAPES if quick else TIME_SHAPES
    return [(b, h, n, d, dt, c) for dt in DTYPES for d in HEAD_DIMS for (b, h, n) in shapes for c in (False, True)]


_TRACEBACKS_SHOWN = []


def check_case(n, head_dim, dtype, causal) -> dict:
    """b7's gradients against float64 autograd at one shape (B = 2, H = 2; N = 4096: B = 1)."""
    import torch

    from flashcourse.kernels.hopper import fa3_backward_tma
    from flashcourse.tolerance import TOLERANCES

    batch, heads = (1, 2) if n >= 4096 else (2, 2)
    row = {"kind": "check", "provider": PROVIDER, "dtype": dtype, "head_dim": head_dim, "n": n, "causal": causal,
           "batch": batch, "heads": heads}
    try:
        q, k, v = _inputs(batch, heads, n, head_dim, dtype, seed=n + head_dim)
        (do,) = _inputs(batch, heads, n, head_dim, dtype, seed=n + head_dim + 1)[:1]
        o, lse = _forward(q, k, v, causal)
        grads = fa3_backward_tma.b7_backward(q, k, v, o, lse, do, causal=causal)
        torch.cuda.synchronize()
        expected = reference_grads(q, k, v, do, causal)
        rtol, atol = TOLERANCES[dtype]
        finite = True
        for name, got, ref in zip(("dq", "dk", "dv"), grads, expected, strict=True):
            norm = max(1.0, float(ref.abs().max()))
            err = (got.double() - ref).abs() / norm
            row[f"max_err_{name}"] = float(err.max())
            row[f"bad_{name}"] = int((err > atol + rtol * ref.abs() / norm).sum())
            finite = finite and bool(torch.isfinite(got).all())
        row.update(rtol=rtol, atol=atol, finite=finite)
        bad = row["bad_dq"] + row["bad_dk"] + row["bad_dv"]
        row["status"] = "ok" if finite and bad == 0 else "wrong"
    except Exception as error:  # noqa: BLE001 - recorded, and the next case runs
        row.update(status=_error_text(error))
        if not _TRACEBACKS_SHOWN:
            _TRACEBACKS_SHOWN.append(True)
            traceback.print_exc()
    return row


def b7(q, k, v, do, causal):
    from flashcourse.kernels.hopper import fa3_backward_tma

    o, lse = _forward(q, k, v, causal)
    return lambda: fa3_backward_tma.b7_backward(q, k, v, o, lse, do, causal=causal)


def _fa4_interface():
    """FlashAttention-4's ``flash_attn_func`` (package ``flash-attn-4``, module ``flash_attn.cute``), or the reason
    it is not there."""
    try:
        from flash_attn.cute import flash_attn_func
    except Exception as error:  # noqa: BLE001 - any failure to import is a reason to skip it
        return None, f"not importable: {_error_text(error)}"
    return flash_attn_func, ""


def fa4(q, k, v, do, causal):
    """FA4's backward through autograd, on its (B, N, H, D) layout (the transposes are made once, outside the
    timed call)."""
    import torch

    flash_attn_func, why = _fa4_interface()
    if flash_attn_func is None:
        raise RuntimeError(why)
    q, k, v = (t.transpose(1, 2).contiguous().requires_grad_(True) for t in (q, k, v))
    out = flash_attn_func(q, k, v, causal=causal)
    out = out[0] if isinstance(out, tuple) else out
    do = do.transpose(1, 2).contiguous()
    return lambda: torch.autograd.grad(out, (q, k, v), do, retain_graph=True)


def run_child(stage: str, out: Path, quick: bool) -> None:
    """Every check, then every timing of b7. Rows go to ``out`` one JSON line each, as they come."""
    from flashcourse.kernels.hopper import fa3_backward_tma

    failed = set()
    with out.open("a") as file:
        def emit(row):
            file.write(json.dumps(row) + "\n")
            file.flush()

        for dtype in DTYPES:
            for head_dim in HEAD_DIMS:
                for causal in (False, True):
                    for n in CHECK_NS:
                        row = check_case(n, head_dim, dtype, causal)
                        emit(row)
                        if row["status"] != "ok":
                            failed.add((dtype, head_dim))
                        log(f"b7 check {dtype} D={head_dim} causal={causal} N={n}: {row['status']}"
                            + (f" (max err dq {row['max_err_dq']:.1e} dk {row['max_err_dk']:.1e} "
                               f"dv {row['max_err_dv']:.1e})" if "max_err_dq" in row else ""))
        for row in compiled_rows(fa3_backward_tma.STAGES[stage].kernel, stage):
            emit(row)
            log(f"b7 compiled {row.get('constants', '')}: {row.get('n_regs')} registers, "
                f"{row.get('n_spills')} spills, {row.get('shared')} B shared ({row['status']})")
        for batch, heads, n, head_dim, dtype, causal in time_shapes(quick):
            row = time_case(PROVIDER, b7, batch, heads, n, head_dim, dtype, causal)
            row.update(checks_passed=(dtype, head_dim) not in failed)
            emit(row)
            log(f"b7 time {dtype} D={head_dim} N={n} causal={causal}: "
                + (f"{row['tflops']:.0f} TFLOP/s ({row['tflops_min']:.0f}-{row['tflops_max']:.0f})"
                   if row["status"] == "ok" else row["status"]))


def reference_rows(quick: bool, deadline: float = math.inf) -> list[dict]:
    makers = {"sdpa_cudnn": sdpa_backward("sdpa_cudnn"), "b1": b1, "fa4": fa4}
    _, fa4_missing = _fa4_interface()
    rows = []
    for batch, heads, n, head_dim, dtype, causal in time_shapes(quick):
        for provider in REFERENCES:
            base = {"kind": "time", "provider": provider, "dtype": dtype, "head_dim": head_dim, "n": n,
                    "causal": causal, "batch": batch, "heads": heads, "mode": "bwd"}
            if provider == "fa4" and fa4_missing:
                rows.append({**base, "status": fa4_missing})
                continue
            if time.time() > deadline:
                rows.append({**base, "status": "not run: the run's budget is spent"})
                continue
            row = time_case(provider, makers[provider], batch, heads, n, head_dim, dtype, causal)
            rows.append(row)
            log(f"{provider} {dtype} D={head_dim} N={n} causal={causal}: "
                + (f"{row['tflops']:.0f} TFLOP/s" if row["status"] == "ok" else row["status"]))
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="results folder (default: the checkout's benchmarks/results)")
    parser.add_argument("--quick", action="store_true", help="N = 8192 only")
    parser.add_argument("--stage-timeout", type=float, default=150.0, help="seconds for b7's child")
    parser.add_argument("--budget", type=float, default=200.0,
                        help="seconds for the whole run (90 s of it kept for the references)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--rows", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.child:
        run_child(args.child, Path(args.rows), args.quick)
        return 0

    import torch
    import triton

    from flashcourse.bench import environment_info, save_results
    from flashcourse.bench.providers import add_ratios

    start = time.time()
    if not torch.cuda.is_available():
        print("gpu_b7.py needs a CUDA GPU (Hopper)")
        return 2
    meta = environment_info()
    meta.update(capability=list(torch.cuda.get_device_capability()), quick=args.quick, triton_path=triton.__file__)
    try:
        from flashcourse.kernels.hopper import fa3_backward_tma

        spec = fa3_backward_tma.STAGES[PROVIDER]
        meta.update(tested_triton=list(fa3_backward_tma.TESTED_TRITON), has_tma_reduce=fa3_backward_tma.HAS_TMA_REDUCE,
                    b7={"adds": spec.adds, "expected": spec.expected, "keys": spec.keys(), "ring_stages": spec.stages,
                        "producer_regs": spec.producer_regs, "consumer_regs": spec.consumer_regs,
                        "block_m": {str(d): m for d, m in fa3_backward_tma.BLOCK_M.items()}})
        import_error = None if fa3_backward_tma.HAS_TMA_REDUCE else (
            f"Triton {triton.__version__} has no tma.async_atomic_add: run with PYTHONPATH=/tmp/t39:src "
            "(scripts/wheel_parts.py)")
    except Exception as error:  # noqa: BLE001 - the references are still timed
        import_error = _error_text(error)
    if import_error:
        log(f"b7 cannot run: {import_error}")
    log(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__} ({triton.__file__})")

    stage_status: dict = {}
    out = Path(args.out) if args.out else None

    def save(rows, done=False):
        meta.update(stage_status=stage_status, seconds=round(time.time() - start, 1), complete=done)
        return save_results("b7", rows, directory=out, kind="b7", meta=meta)

    rows = run_stages(Path(__file__), [PROVIDER], args, start=start, reserve=REFERENCE_RESERVE,
                      import_error=import_error, stage_status=stage_status, save=save)
    log("references: SDPA cuDNN, b1, FA4")
    try:
        rows.extend(reference_rows(args.quick, deadline=start + args.budget))
    except Exception as error:  # noqa: BLE001
        log(f"references failed: {_error_text(error)}")
        stage_status["references"] = _error_text(error)

    timed = [r for r in rows if r["kind"] == "time"]
    add_ratios(timed, key=_shape, rate="tflops", ours=[PROVIDER, "b1"])
    path = save(rows, done=True)
    log(f"wrote {path} ({meta['seconds']} s)")

    print("\nbackward TFLOP/s, median (range); x cuDNN; x b1; x FA4")
    for r in timed:
        if r["provider"] in (PROVIDER, "b1"):
            ratios = "".join(f"  {r[f'ratio_vs_{p}']:.2f}x {p}" for p in ("sdpa_cudnn", "b1", "fa4")
                             if r.get(f"ratio_vs_{p}"))
            text = (f"{r['tflops']:.0f} ({r['tflops_min']:.0f}-{r['tflops_max']:.0f}){ratios}"
                    if r["status"] == "ok" else r["status"])
            print(f"{r['provider']:4} {r['dtype']:8} D={r['head_dim']:<3} N={r['n']:<5} causal={r['causal']!s:5} "
                  f"{text}")
    checks = [r for r in rows if r["kind"] == "check"]
    print(f"\nb7 checks: {sum(r['status'] == 'ok' for r in checks)}/{len(checks)} passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
