"""Every stage of the Gluon FlashAttention-3 backward (``flashcourse.kernels.hopper.fa3_backward``, b6a-b6c) checked and
timed on an H100 / H200, in one command. Nothing here had run on a GPU before this script's
first run.

    PYTHONPATH=src python benchmarks/gpu_fa3_backward.py --out benchmarks/results      # about 5-7 minutes
    PYTHONPATH=src python benchmarks/gpu_fa3_backward.py --quick --out /tmp/fa3b        # fewer shapes, about 3

For each stage, in a child process of its own (a kernel that deadlocks on an mbarrier hangs only its child, which
is killed after ``--stage-timeout`` seconds and recorded as such; rows are written as they come; the whole run
stays within ``--budget`` seconds, 450 by default, inside an 8-minute command):

1. gradients against float64 autograd: causal and not, N in {1, 17, 128, 1000, 4096}, D 64 and 128, float16 and
   bfloat16, B = 2, H = 2 (N = 4096: B = 1). o and lse come from our v7 forward in the inputs' dtype (what a
   training step hands the backward); dq, dk, dv are divided by max(1, max |reference|) and must lie within
   ``flashcourse.tolerance``'s (rtol, atol) of the dtype, as tests/test_kernels_backward.py checks b1-b5;
2. timing of the backward alone: N 4096 / 8192 / 16384 with B = 4 and H = 32 / 16 / 8, causal and not, D 64 and
   128, float16 and bfloat16 (``checks_passed`` per row). Stage b6c is also checked (N 17, 1000) and timed
   with the query-tile height its head dim does not take by default (provider ``fa3-b6c-m64`` at D = 128,
   ``fa3-b6c-m32`` at D = 64; ``fa3_backward.BLOCK_M``).

The parent times the references on the same shapes: SDPA's cuDNN and flash backward (``torch.autograd.grad`` of
an output made inside ``sdpa_kernel``, graph retained) and our b1 (``flash_attention_backward(version="b1")``).
Every timing is ``flashcourse.bench.time_repeats`` (median of 3 with the range), FLOPs
``attention_flops(..., mode="bwd")``; ratios (``ratio_vs_sdpa_cudnn``, ``ratio_vs_b1`` ...) from
``bench.providers.add_ratios``. The JSON is ``<out>/<date>-<device>-fa3-backward-stages.json``,
``meta.kind = "fa3-backward-stages"``; rows have ``kind`` "check", "compiled" or "time", ``status`` "ok" or
the error; a stage that fails to compile, errs or hangs is recorded and the next one runs.
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
os.environ.pop("TRITON_INTERPRET", None)

CHECK_NS = (1, 17, 128, 1000, 4096)
TIME_SHAPES = ((4, 32, 4096), (4, 16, 8192), (4, 8, 16384))  # (B, H, N): B*H*N constant
QUICK_TIME_SHAPES = ((4, 32, 4096), (4, 8, 16384))
HEAD_DIMS = (64, 128)
DTYPES = ("float16", "bfloat16")
REFERENCES = ("sdpa_cudnn", "sdpa_flash", "b1")
REFERENCE_RESERVE = 120.0  # seconds kept for timing the references at the end


def reference_grads(q, k, v, do, causal):
    """(dq, dk, dv) by float64 autograd (top-left causal, as the kernels)."""
    import torch

    q, k, v = (t.detach().double().requires_grad_(True) for t in (q, k, v))
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if causal:
        n_q, n_kv = scores.shape[-2:]
        keep = torch.ones(n_q, n_kv, dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~keep, float("-inf"))
    o = torch.softmax(scores, dim=-1) @ v
    return torch.autograd.grad(o, (q, k, v), do.double())


def _forward(q, k, v, causal):
    from flashcourse import kernels

    return kernels.flash_attention_forward(q, k, v, causal=causal, version="v7")


_TRACEBACKS_SHOWN = []


def check_case(stage, n, head_dim, dtype, causal, block_m=None) -> dict:
    import torch

    from flashcourse.kernels.hopper import fa3_backward
    from flashcourse.tolerance import TOLERANCES

    batch, heads = (1, 2) if n >= 4096 else (2, 2)
    row = {"kind": "check", "provider": _provider(stage, block_m), "stage": stage, "dtype": dtype,
           "head_dim": head_dim, "n": n, "causal": causal, "batch": batch, "heads": heads, "block_m": block_m}
    try:
        q, k, v = _inputs(batch, heads, n, head_dim, dtype, seed=n + head_dim)
        (do,) = _inputs(batch, heads, n, head_dim, dtype, seed=n + head_dim + 1)[:1]
        o, lse = _forward(q, k, v, causal)
        grads = fa3_backward.fa3_backward(q, k, v, o, lse, do, causal=causal, stage=stage, block_m=block_m)
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


def time_case(provider, make, batch, heads, n, head_dim, dtype, causal) -> dict:
    """``make(q, k, v, do, causal)`` builds what it needs once (the forward) and returns the backward call."""
    import torch

    from flashcourse.bench import attention_flops, time_repeats

    row = {"kind": "time", "provider": provider, "dtype": dtype, "head_dim": head_dim, "n": n, "causal": causal,
           "batch": batch, "heads": heads, "mode": "bwd"}
    try:
        q, k, v = _inputs(batch, heads, n, head_dim, dtype)
        do = torch.randn_like(q)
        fn = make(q, k, v, do, causal)
        fn()
        torch.cuda.synchronize()
        timing = time_repeats(fn)
        row.update(timing.fields(attention_flops(batch, heads, n, head_dim, causal=causal, mode="bwd")),
                   status="ok")
    except Exception as error:  # noqa: BLE001
        row.update(status=_error_text(error))
    torch.cuda.empty_cache()
    return row


def _provider(stage, block_m=None):
    return f"fa3-{stage}" if block_m is None else f"fa3-{stage}-m{block_m}"


def ours(stage, block_m=None):
    def make(q, k, v, do, causal):
        from flashcourse.kernels.hopper import fa3_backward

        o, lse = _forward(q, k, v, causal)
        return lambda: fa3_backward.fa3_backward(q, k, v, o, lse, do, causal=causal, stage=stage,
                                                 block_m=block_m)
    return make


# The query rows of a tile the default (fa3_backward.BLOCK_M: 64 at D = 64, 32 at D = 128) does not take, run
# for this stage too (checked at a few lengths, timed): 64 rows spill at D = 128 under Triton 3.6, 32 rows
# make narrower wgmmas; which costs less is the GPU's to say.
ALTERNATIVE_STAGE = "b6c"
ALTERNATIVE_CHECK_NS = (17, 1000)


def b1(q, k, v, do, causal):
    from flashcourse import kernels

    o, lse = _forward(q, k, v, causal)
    return lambda: kernels.flash_attention_backward(q, k, v, o, lse, do, causal=causal, version="b1")


def sdpa_backward(provider):
    def make(q, k, v, do, causal):
        import torch

        from flashcourse.bench.providers import sdpa

        q, k, v = (t.detach().requires_grad_(True) for t in (q, k, v))
        o = sdpa(provider)(q, k, v, causal)
        return lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True)
    return make


def time_shapes(quick: bool):
    shapes = QUICK_TIME_SHAPES if quick else TIME_SHAPES
    return [(b, h, n, d, dt, c) for dt in DTYPES for d in HEAD_DIMS for (b, h, n) in shapes for c in (False, True)]


def run_child(stage: str, out: Path, quick: bool) -> None:
    """One stage: every check, then every timing. Rows go to ``out`` one JSON line each, as they come."""
    from flashcourse.kernels.hopper import fa3_backward

    failed = set()
    with out.open("a") as file:
        def emit(row):
            file.write(json.dumps(row) + "\n")
            file.flush()

        ns = CHECK_NS if not quick else (1, 17, 1000, 4096)
        for dtype in DTYPES:
            for head_dim in HEAD_DIMS:
                for causal in (False, True):
                    for n in ns:
                        row = check_case(stage, n, head_dim, dtype, causal)
                        emit(row)
                        if row["status"] != "ok":
                            failed.add((dtype, head_dim))
                        log(f"{stage} check {dtype} D={head_dim} causal={causal} N={n}: {row['status']}"
                            + (f" (max err dq {row['max_err_dq']:.1e} dk {row['max_err_dk']:.1e} "
                               f"dv {row['max_err_dv']:.1e})" if "max_err_dq" in row else ""))
        alternative = {d: 96 - fa3_backward.BLOCK_M[d] for d in HEAD_DIMS} if stage == ALTERNATIVE_STAGE else {}
        for dtype in DTYPES if alternative else ():
            for head_dim in HEAD_DIMS:
                for causal in (False, True):
                    for n in ALTERNATIVE_CHECK_NS:
                        row = check_case(stage, n, head_dim, dtype, causal, block_m=alternative[head_dim])
                        emit(row)
                        if row["status"] != "ok":
                            failed.add((dtype, head_dim, alternative[head_dim]))
                        log(f"{row['provider']} check {dtype} D={head_dim} causal={causal} N={n}: {row['status']}")
        for row in compiled_rows(fa3_backward.STAGES[stage].kernel, stage):
            emit(row)
            log(f"{stage} compiled {row.get('constants', '')}: {row.get('n_regs')} registers, "
                f"{row.get('n_spills')} spills, {row.get('shared')} B shared ({row['status']})")
        for batch, heads, n, head_dim, dtype, causal in time_shapes(quick):
            row = time_case(f"fa3-{stage}", ours(stage), batch, heads, n, head_dim, dtype, causal)
            row.update(stage=stage, checks_passed=(dtype, head_dim) not in failed)
            emit(row)
            log(f"{stage} time {dtype} D={head_dim} N={n} causal={causal}: "
                + (f"{row['tflops']:.0f} TFLOP/s ({row['tflops_min']:.0f}-{row['tflops_max']:.0f})"
                   if row["status"] == "ok" else row["status"]))
            if alternative:
                bm = alternative[head_dim]
                row = time_case(_provider(stage, bm), ours(stage, bm), batch, heads, n, head_dim, dtype, causal)
                row.update(stage=stage, block_m=bm, checks_passed=(dtype, head_dim, bm) not in failed
                           and (dtype, head_dim) not in failed)
                emit(row)
                log(f"{row['provider']} time {dtype} D={head_dim} N={n} causal={causal}: "
                    + (f"{row['tflops']:.0f} TFLOP/s" if row["status"] == "ok" else row["status"]))


def reference_rows(quick: bool, deadline: float = math.inf) -> list[dict]:
    makers = {"sdpa_cudnn": sdpa_backward("sdpa_cudnn"), "sdpa_flash": sdpa_backward("sdpa_flash"), "b1": b1}
    rows = []
    for batch, heads, n, head_dim, dtype, causal in time_shapes(quick):
        for provider in REFERENCES:
            if time.time() > deadline:
                rows.append({"kind": "time", "provider": provider, "dtype": dtype, "head_dim": head_dim, "n": n,
                             "causal": causal, "batch": batch, "heads": heads, "mode": "bwd",
                             "status": "not run: the run's budget is spent"})
                continue
            row = time_case(provider, makers[provider], batch, heads, n, head_dim, dtype, causal)
            rows.append(row)
            log(f"{provider} {dtype} D={head_dim} N={n} causal={causal}: "
                + (f"{row['tflops']:.0f} TFLOP/s" if row["status"] == "ok" else row["status"]))
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="results folder (default: the checkout's benchmarks/results)")
    parser.add_argument("--stage", action="append", help="a stage (repeat); default every stage")
    parser.add_argument("--quick", action="store_true", help="fewer check lengths and timing shapes")
    parser.add_argument("--stage-timeout", type=float, default=120.0, help="seconds for one stage's child")
    parser.add_argument("--budget", type=float, default=450.0,
                        help="seconds for the whole run (the JSON is written within it; 120 s kept for references)")
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
        print("gpu_fa3_backward.py needs a CUDA GPU (Hopper)")
        return 2
    meta = environment_info()
    meta.update(capability=list(torch.cuda.get_device_capability()), quick=args.quick)
    try:
        from flashcourse.kernels.hopper import fa3_backward

        stages = args.stage or list(fa3_backward.STAGES)
        meta.update(tested_triton=list(fa3_backward.TESTED_TRITON),
                    stages={name: {"adds": s.adds, "expected": s.expected, "consumers": s.consumers,
                                   "keys": s.keys(), "ring_stages": s.stages, "producer_regs": s.producer_regs,
                                   "consumer_regs": s.consumer_regs, "maxnreg": s.maxnreg}
                            for name, s in fa3_backward.STAGES.items()},
                    block_m={str(d): m for d, m in fa3_backward.BLOCK_M.items()})
        import_error = None
    except Exception as error:  # noqa: BLE001 - the references are still timed
        stages, import_error = args.stage or ["b6a", "b6b", "b6c"], _error_text(error)
        log(f"flashcourse.kernels.hopper.fa3_backward does not import: {import_error}")
    log(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}; stages {stages}")

    rows: list[dict] = []
    stage_status = {}
    out = Path(args.out) if args.out else None

    def save(rows, done=False):
        """The JSON so far (rewritten after every stage: a run cut short keeps what it measured)."""
        meta.update(stage_status=stage_status, seconds=round(time.time() - start, 1), complete=done)
        return save_results("fa3-backward-stages", rows, directory=out, kind="fa3-backward-stages", meta=meta)

    rows.extend(run_stages(Path(__file__), stages, args, start=start, reserve=REFERENCE_RESERVE,
                           import_error=import_error, stage_status=stage_status, save=save))

    log("references: SDPA cuDNN, SDPA flash, b1")
    try:
        rows.extend(reference_rows(args.quick, deadline=start + args.budget + 20))
    except Exception as error:  # noqa: BLE001
        log(f"references failed: {_error_text(error)}")
        stage_status["references"] = _error_text(error)

    timed = [r for r in rows if r["kind"] == "time"]
    add_ratios(timed, key=_shape, rate="tflops",
               ours=sorted({r["provider"] for r in timed if r["provider"].startswith("fa3-")}))
    add_ratios([r for r in timed if r["provider"] in REFERENCES], key=_shape, rate="tflops", ours=["b1"])
    path = save(rows, done=True)
    log(f"wrote {path} ({meta['seconds']} s)")

    print("\nbackward TFLOP/s, median (range); x cuDNN; x b1")
    for r in timed:
        if r["provider"].startswith("fa3-") or r["provider"] == "b1":
            cudnn, ours_b1 = r.get("ratio_vs_sdpa_cudnn"), r.get("ratio_vs_b1")
            text = (f"{r['tflops']:.0f} ({r['tflops_min']:.0f}-{r['tflops_max']:.0f})"
                    + (f"  {cudnn:.2f}x cuDNN" if cudnn else "") + (f"  {ours_b1:.2f}x b1" if ours_b1 else "")
                    ) if r["status"] == "ok" else r["status"]
            print(f"{r['provider']:12} {r['dtype']:8} D={r['head_dim']:<3} N={r['n']:<5} causal={r['causal']!s:5} "
                  f"{text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
