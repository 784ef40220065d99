"""Every stage of the Gluon FlashAttention-3 forward (``flashcourse.kernels.hopper.fa3``, v8a-v8h) checked and timed on
an H100 / H200, in one command. Nothing here had run on a GPU before this script's first run.

    PYTHONPATH=src python benchmarks/gpu_fa3.py --out benchmarks/results          # about 4-6 minutes
    PYTHONPATH=src python benchmarks/gpu_fa3.py --quick --out /tmp/fa3             # fewer shapes, about 2 minutes
    PYTHONPATH=src python benchmarks/gpu_fa3.py --stages v8a,v8d,v8f --references sdpa_cudnn,v7 --out /tmp/fa3
    PYTHONPATH=src python benchmarks/gpu_fa3.py --stages v8c,v8d,v8g --references sdpa_cudnn --out /tmp/fa3 # v8g's hold
    PYTHONPATH=src python benchmarks/gpu_fa3.py --head-dims 256 --budget 250 --out /tmp/fa3  # v8c-v8f, about 3 min

``--stages`` (or ``--stage``, repeated) runs only the stages named; such a run is saved as
``<date>-<device>-fa3-stages-<stages>.json``, so that it never becomes the newest ``*-fa3-stages.json`` (the
complete table that ``kernels/plan.py``'s dispatch and lesson 13 read). ``--references`` times only the
references named. ``--head-dims`` (64 and 128 by default) checks and times those head dims only, each with the
stages that take it (``Stage.head_dims``: 256 is v8c-v8g's); a run at other head dims than the default is saved
apart too, its name ending in them (``fa3-stages-v8c-v8d-v8e-v8f-d256``).

For each stage, in a child process of its own (a kernel that deadlocks on an mbarrier hangs only its child, which
is killed after ``--stage-timeout`` seconds and recorded as such; rows are written as they come, so a killed
child keeps what it finished; the whole run stays within ``--budget`` seconds, 540 by default, so that it fits a
10-minute command with the JSON written):

1. correctness against a float64 PyTorch reference: causal (top-left) and not, each head dim, float16 and
   bfloat16, at ``CHECK_SHAPES``: N_q = N_kv in {1, 17, 128, 1000, 4096}; N_q != N_kv with N_kv a multiple of
   128 (the key tiles the library's routing asks for), N_q awkward, an odd number of query tiles (v8f's
   middle query tile of a head has no causal partner), N_q > N_kv; and B*H = 64 at N_q = 1000, N_kv = 1024,
   more query tiles than SMs (v8f's programs take several, its ring and turns running on between them), and at
   N_kv = 960, 15 key tiles of 64 rows (D = 256) after one another in a program's ring, an odd count that
   flips the ring's phases from one query tile to the next. o within ``flashcourse.tolerance``'s (rtol, atol)
   of the inputs' dtype, lse (natural log) within the same atol + rtol * |lse|;
2. timing: N 4096 / 8192 / 16384 with B = 4 and H = 32 / 16 / 8 (B*H*N constant), or the ``--lengths`` given
   (shorter ones at B = 4, H = 32), causal and not, each head dim, float16 and bfloat16; each row's
   ``checks_passed`` says whether every check of its dtype and head dim passed (a kernel timed but wrong is no
   result), and ``bad_vs_sdpa`` how many outputs at the timed shape
   differ from SDPA's by more than twice the dtype's tolerance (a persistent stage's programs take tens of
   query tiles there).

The parent times the references on the same shapes: SDPA's cuDNN and flash backends and our v7. Every timing is
``flashcourse.bench.time_repeats`` (median of 3 ``do_bench`` runs with their range); ratios to each reference
(``ratio_vs_sdpa_cudnn`` ...) come from ``bench.providers.add_ratios``. The JSON is
``<out>/<date>-<device>-fa3-stages.json``, ``meta.kind = "fa3-stages"``; rows have ``kind`` "check" (one per
correctness case), "compiled" (registers, spills, shared memory of each compiled variant, from the driver) or
"time" (one per provider and shape), ``status`` "ok" or the error. The script never stops at
a failure: a stage that fails to compile, errs or hangs is recorded and the next one runs.
"""

from __future__ import annotations

import argparse
import json
import math
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

# (N_q, N_kv, B, H) of the correctness checks (see the docstring)
CHECK_SHAPES = ((1, 1, 2, 2), (17, 17, 2, 2), (128, 128, 2, 2), (1000, 1000, 2, 2), (4096, 4096, 1, 2),
                (1, 128, 2, 2), (200, 384, 2, 3), (576, 640, 2, 3), (700, 256, 2, 2), (1000, 1024, 4, 16),
                (1000, 960, 4, 16))
QUICK_CHECK_SHAPES = ((1, 1, 2, 2), (17, 17, 2, 2), (1000, 1000, 2, 2), (4096, 4096, 1, 2), (576, 640, 2, 3),
                      (1000, 1024, 4, 16))
TIME_SHAPES = ((4, 32, 4096), (4, 16, 8192), (4, 8, 16384))  # (B, H, N): B*H*N constant
QUICK_TIME_SHAPES = ((4, 32, 4096), (4, 8, 16384))
LENGTHS = tuple(n for _, _, n in TIME_SHAPES)  # the default; --lengths 1024,2048 for shorter sequences
HEAD_DIMS = (64, 128)  # the default; --head-dims 256 for the stages that take it
DTYPES = ("float16", "bfloat16")
REFERENCES = ("sdpa_cudnn", "sdpa_flash", "v7")
REFERENCE_RESERVE = 90.0  # seconds kept for timing the references at the end


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def _error_text(error: BaseException) -> str:
    lines = str(error).strip().splitlines() or [""]
    # A CUDA error's message ends with advice (compile with TORCH_USE_CUDA_DSA...): its first line names the fault.
    line = lines[0] if lines[0].startswith("CUDA error") else lines[-1]
    return f"{type(error).__name__}: {line}"[:500]


def _inputs(batch, heads, n, head_dim, dtype, seed=0):
    import torch

    generator = torch.Generator(device="cuda").manual_seed(seed)
    return [torch.randn((batch, heads, n, head_dim), device="cuda", dtype=getattr(torch, dtype), generator=generator)
            for _ in range(3)]


def reference(q, k, v, causal):
    """o and natural lse in float64 (top-left causal, as the kernels: key j visible to query i when j <= i)."""
    import torch

    q, k, v = (t.double() for t in (q, k, v))
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if causal:
        n_q, n_kv = scores.shape[-2:]
        keep = torch.ones(n_q, n_kv, dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~keep, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    return torch.softmax(scores, dim=-1) @ v, lse


_TRACEBACKS_SHOWN = []


def check_case(stage, shape, head_dim, dtype, causal) -> dict:
    """One correctness check at ``shape`` = (N_q, N_kv, B, H); the row's ``n`` is N_q, ``n_kv`` N_kv."""
    import torch

    from flashcourse.kernels.hopper import fa3
    from flashcourse.tolerance import TOLERANCES

    n, n_kv, batch, heads = shape
    row = {"kind": "check", "provider": f"fa3-{stage}", "stage": stage, "dtype": dtype, "head_dim": head_dim,
           "n": n, "n_kv": n_kv, "causal": causal, "batch": batch, "heads": heads}
    try:
        q = _inputs(batch, heads, n, head_dim, dtype, seed=n + head_dim)[0]
        k, v = _inputs(batch, heads, n_kv, head_dim, dtype, seed=n_kv + head_dim + 1)[1:]
        o, lse = fa3.fa3_forward(q, k, v, causal=causal, stage=stage)
        torch.cuda.synchronize()
        o_ref, lse_ref = reference(q, k, v, causal)
        rtol, atol = TOLERANCES[dtype]
        err_o = (o.double() - o_ref).abs()
        err_lse = (lse.double() - lse_ref).abs()
        bad_o = int((err_o > atol + rtol * o_ref.abs()).sum())
        bad_lse = int((err_lse > atol + rtol * lse_ref.abs()).sum())
        finite = bool(torch.isfinite(o).all() and torch.isfinite(lse).all())
        row.update(max_err_o=float(err_o.max()), max_err_lse=float(err_lse.max()), bad_o=bad_o, bad_lse=bad_lse,
                   rtol=rtol, atol=atol, finite=finite)
        row["status"] = "ok" if finite and bad_o == 0 and bad_lse == 0 else "wrong"
    except Exception as error:  # noqa: BLE001 - recorded, and the next case runs
        row.update(status=_error_text(error))
        if not _TRACEBACKS_SHOWN:  # the first error of the stage in full; the rest in one line each
            _TRACEBACKS_SHOWN.append(True)
            traceback.print_exc()
    return row


def time_case(provider, fn, batch, heads, n, head_dim, dtype, causal, agree=False) -> dict:
    """One timing row; with ``agree``, also ``bad_vs_sdpa``: the outputs that differ from SDPA's at this shape
    by more than twice the dtype's (atol + rtol * |o|), ``fn`` returning (o, lse)."""
    import torch

    from flashcourse.bench import attention_flops, time_repeats

    row = {"kind": "time", "provider": provider, "dtype": dtype, "head_dim": head_dim, "n": n, "causal": causal,
           "batch": batch, "heads": heads, "mode": "fwd"}
    try:
        q, k, v = _inputs(batch, heads, n, head_dim, dtype)
        out = fn(q, k, v, causal)
        if agree:
            from flashcourse.tolerance import TOLERANCES

            rtol, atol = TOLERANCES[dtype]
            expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
            expected = expected.float()
            row["bad_vs_sdpa"] = int(((out[0].float() - expected).abs() > 2 * (atol + rtol * expected.abs())).sum())
            del out, expected
        torch.cuda.synchronize()
        timing = time_repeats(lambda: fn(q, k, v, causal))
        row.update(timing.fields(attention_flops(batch, heads, n, head_dim, causal=causal)), status="ok")
    except Exception as error:  # noqa: BLE001
        row.update(status=_error_text(error))
    torch.cuda.empty_cache()
    return row


def time_shapes(quick: bool, head_dims=HEAD_DIMS, lengths=LENGTHS):
    """(B, H, N, D, dtype, causal) of every timing. The default lengths keep B*H*N constant; a shorter N keeps
    B = 4, H = 32, as ``bench attention``'s grid does (a GPT-2-size step is N = 1024)."""
    if tuple(lengths) == LENGTHS:
        shapes = QUICK_TIME_SHAPES if quick else TIME_SHAPES
    else:
        shapes = tuple((4, 32 if n <= 4096 else 32 * 4096 // n, n) for n in lengths)
    return [(b, h, n, d, dt, c) for dt in DTYPES for d in head_dims for (b, h, n) in shapes for c in (False, True)]


def run_child(stage: str, out: Path, quick: bool, head_dims=HEAD_DIMS, lengths=LENGTHS) -> None:
    """One stage at those of ``head_dims`` it takes: every check, then every timing (``checks_passed`` per row).
    Rows go to ``out`` one JSON line each, as soon as they exist."""
    from flashcourse.kernels.hopper import fa3

    head_dims = [d for d in head_dims if d in fa3.STAGES[stage].head_dims]
    failed = set()
    with out.open("a") as file:
        def emit(row):
            file.write(json.dumps(row) + "\n")
            file.flush()

        shapes = CHECK_SHAPES if not quick else QUICK_CHECK_SHAPES
        for dtype in DTYPES:
            for head_dim in head_dims:
                for causal in (False, True):
                    for shape in shapes:
                        row = check_case(stage, shape, head_dim, dtype, causal)
                        emit(row)
                        if row["status"] != "ok":
                            failed.add((dtype, head_dim))
                        log(f"{stage} check {dtype} D={head_dim} causal={causal} N_q={shape[0]} N_kv={shape[1]} "
                            f"B={shape[2]} H={shape[3]}: {row['status']}"
                            + (f" (max |err| o {row['max_err_o']:.2e}, lse {row['max_err_lse']:.2e})"
                               if "max_err_o" in row else ""))
        for row in compiled_rows(fa3.STAGES[stage].kernel, stage):
            emit(row)
            log(f"{stage} compiled {row.get('constants', '')}: {row.get('n_regs')} registers, "
                f"{row.get('n_spills')} spills, {row.get('shared')} B shared ({row['status']})")
        for batch, heads, n, head_dim, dtype, causal in time_shapes(quick, head_dims, lengths):
            row = time_case(f"fa3-{stage}", lambda q, k, v, c: fa3.fa3_forward(q, k, v, causal=c, stage=stage),
                            batch, heads, n, head_dim, dtype, causal, agree=True)
            # Timed even where a check failed (an edge case such as N = 1 may fail alone): the row says so.
            row.update(stage=stage, checks_passed=(dtype, head_dim) not in failed)
            emit(row)
            log(f"{stage} time {dtype} D={head_dim} N={n} causal={causal}: "
                + (f"{row['tflops']:.0f} TFLOP/s ({row['tflops_min']:.0f}-{row['tflops_max']:.0f})"
                   if row["status"] == "ok" else row["status"]))


def compiled_rows(kernel, stage: str) -> list[dict]:
    """What the GPU's driver says of each compiled variant of the stage's kernel: registers a thread (at launch),
    spills, shared memory. Best effort: Triton's JIT cache is not a public API."""
    rows = []
    try:
        for caches in kernel.device_caches.values():
            for compiled in caches[0].values():
                compiled._init_handles()
                constants = getattr(compiled.src, "constants", {}) or {}
                rows.append({"kind": "compiled", "provider": f"fa3-{stage}", "stage": stage,
                             "constants": {str(k): str(v) for k, v in constants.items()},
                             "signature": {str(k): str(v) for k, v in getattr(compiled.src, "signature", {}).items()
                                           if str(v).startswith("tensordesc")},
                             "n_regs": compiled.n_regs, "n_spills": compiled.n_spills,
                             "shared": compiled.metadata.shared, "status": "ok"})
    except Exception as error:  # noqa: BLE001
        rows.append({"kind": "compiled", "provider": f"fa3-{stage}", "stage": stage, "status": _error_text(error)})
    return rows


def _shape(r):
    return r["dtype"], r["head_dim"], r["n"], r["causal"], r["batch"], r["heads"]


def reference_rows(quick: bool, deadline: float = math.inf, references=REFERENCES,
                   head_dims=HEAD_DIMS, lengths=LENGTHS) -> list[dict]:
    from flashcourse import kernels
    from flashcourse.bench.providers import sdpa

    fns = {"sdpa_cudnn": sdpa("sdpa_cudnn"), "sdpa_flash": sdpa("sdpa_flash"),
           "v7": lambda q, k, v, c: kernels.flash_attention_forward(q, k, v, causal=c, version="v7")}
    rows = []
    for batch, heads, n, head_dim, dtype, causal in time_shapes(quick, head_dims, lengths):
        for provider in references:
            if time.time() > deadline:
                rows.append({"kind": "time", "provider": provider, "dtype": dtype, "head_dim": head_dim, "n": n,
                             "causal": causal, "batch": batch, "heads": heads, "mode": "fwd",
                             "status": "not run: the run's budget is spent"})
                continue
            row = time_case(provider, fns[provider], batch, heads, n, head_dim, dtype, causal)
            rows.append(row)
            log(f"{provider} {dtype} D={head_dim} N={n} causal={causal}: "
                + (f"{row['tflops']:.0f} TFLOP/s" if row["status"] == "ok" else row["status"]))
    return rows


def results_name(stages, every_stage: bool, head_dims=HEAD_DIMS, lengths=LENGTHS) -> str:
    """The results file's name: "fa3-stages" for a run of every stage at the default head dims and lengths, the
    stage table that ``kernels/plan.py`` and lesson 13 read from the newest ``*-fa3-stages.json``; any other run is
    named by its stages ("fa3-stages-v8a-v8d-v8f"), its head dims and its lengths where they are not the default
    ("fa3-stages-v8d-v8f-d256", "fa3-stages-v8a-v8f-n1024-2048"), so that it never stands in for the table."""
    default_dims, default_lengths = tuple(head_dims) == HEAD_DIMS, tuple(lengths) == LENGTHS
    if every_stage and default_dims and default_lengths:
        return "fa3-stages"
    return ("fa3-stages-" + "-".join(stages) + ("" if default_dims else "-d" + "-".join(map(str, head_dims)))
            + ("" if default_lengths else "-n" + "-".join(map(str, lengths))))


def parse_lengths(text: str) -> tuple[int, ...]:
    """``--lengths``' value ("1024,2048") as a sorted tuple of sequence lengths, or an error that says why."""
    try:
        lengths = tuple(sorted({int(part) for part in text.split(",") if part.strip()}))
    except ValueError:
        lengths = ()
    if not lengths or min(lengths) < 128 or any(n % 128 for n in lengths):
        raise argparse.ArgumentTypeError(f"{text!r}: expected sequence lengths, multiples of 128, comma-separated")
    return lengths


def parse_head_dims(text: str) -> tuple[int, ...]:
    """``--head-dims``' value ("256", "64,128") as a sorted tuple, or an error that says what is allowed."""
    allowed = (64, 128, 256)
    try:
        head_dims = tuple(sorted({int(part) for part in text.split(",") if part.strip()}))
    except ValueError:
        head_dims = ()
    if not head_dims or not set(head_dims) <= set(allowed):
        raise argparse.ArgumentTypeError(f"{text!r}: expected some of {', '.join(map(str, allowed))}, "
                                         "comma-separated")
    return head_dims


def run_stages(script: Path, stages, args, *, start: float, reserve: float, import_error: str | None,
               stage_status: dict, save) -> list[dict]:
    """Each stage in a child process of ``script`` (``--child STAGE --rows FILE``), so that a hang or a crash costs
    that stage only; returns the rows the children wrote, fills ``stage_status`` and calls ``save(rows)`` after
    every stage. ``args`` carries ``quick``, ``budget`` and ``stage_timeout`` (and here ``head_dims``); ``reserve``
    seconds of the budget are kept for the references timed after the stages."""
    rows: list[dict] = []
    for stage in stages:
        if import_error:
            stage_status[stage] = f"not run: {import_error}"
            continue
        with tempfile.NamedTemporaryFile(suffix=".jsonl", delete=False) as file:
            path = Path(file.name)
        command = [sys.executable, str(script.resolve()), "--child", stage, "--rows", str(path)]
        if getattr(args, "head_dims", None):  # the forward's options (gpu_fa3_backward.py shares this function)
            command += ["--head-dims", ",".join(map(str, args.head_dims))]
        if getattr(args, "lengths", None):
            command += ["--lengths", ",".join(map(str, args.lengths))]
        if args.quick:
            command.append("--quick")
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT / "src"),
                                                                       os.environ.get("PYTHONPATH")) if p))
        left = args.budget - reserve - (time.time() - start)
        if left < 30:
            stage_status[stage] = f"not run: the run's {args.budget:.0f} s budget is spent"
            log(f"stage {stage}: {stage_status[stage]}")
            path.unlink()
            continue
        timeout = min(args.stage_timeout, left)
        log(f"stage {stage}: child started ({timeout:.0f} s at most)")
        began = time.time()
        try:
            proc = subprocess.run(command, env=env, timeout=timeout)
            stage_status[stage] = "ok" if proc.returncode == 0 else f"child exited {proc.returncode}"
        except subprocess.TimeoutExpired:
            stage_status[stage] = f"killed after {timeout:.0f} s (a hang: mbarrier deadlock? or slow compiles)"
        stage_rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        path.unlink()
        rows.extend(stage_rows)
        passed = sum(r["kind"] == "check" and r["status"] == "ok" for r in stage_rows)
        checks = sum(r["kind"] == "check" for r in stage_rows)
        log(f"stage {stage}: {stage_status[stage]}, {passed}/{checks} checks passed, {time.time() - began:.0f} s")
        save(rows)
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="results folder (default: the checkout's benchmarks/results)")
    parser.add_argument("--stage", action="append", help="a stage (repeat); default every stage")
    parser.add_argument("--stages", help="stages, comma-separated (v8a,v8d,v8f): the same as --stage for each")
    parser.add_argument("--references", default=",".join(REFERENCES),
                        help=f"references to time, comma-separated (default {','.join(REFERENCES)})")
    parser.add_argument("--head-dims", type=parse_head_dims, default=HEAD_DIMS,
                        help="head dims, comma-separated (default 64,128; 256 runs the stages that take it)")
    parser.add_argument("--lengths", type=parse_lengths, default=LENGTHS,
                        help="sequence lengths to time, comma-separated (default 4096,8192,16384 with B*H*N "
                             "constant; others at B = 4, H = 32 up to 4096)")
    parser.add_argument("--quick", action="store_true", help="fewer check lengths and timing shapes")
    parser.add_argument("--stage-timeout", type=float, default=100.0, help="seconds for one stage's child")
    parser.add_argument("--budget", type=float, default=540.0,
                        help="seconds for the whole run (the JSON is written within it; 90 s kept for references)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--rows", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.child:
        run_child(args.child, Path(args.rows), args.quick, args.head_dims, args.lengths)
        return 0
    chosen = (args.stage or []) + [s.strip() for s in (args.stages or "").split(",") if s.strip()]
    references = [r.strip() for r in args.references.split(",") if r.strip()]
    unknown = sorted(set(references) - set(REFERENCES))
    if unknown:
        parser.error(f"unknown references {unknown}: expected some of {', '.join(REFERENCES)}")

    import torch
    import triton

    from flashcourse.bench import environment_info, save_results
    from flashcourse.bench.providers import add_ratios

    start = time.time()
    if not torch.cuda.is_available():
        print("gpu_fa3.py needs a CUDA GPU (Hopper)")
        return 2
    meta = environment_info()
    meta.update(capability=list(torch.cuda.get_device_capability()), quick=args.quick,
                head_dims=list(args.head_dims), lengths=list(args.lengths))
    stage_status = {}
    try:
        from flashcourse.kernels.hopper import fa3

        unknown = sorted(set(chosen) - set(fa3.STAGES))
        if unknown:
            parser.error(f"unknown stages {unknown}: expected some of {', '.join(fa3.STAGES)}")
        stages = list(chosen or fa3.STAGES)
        every_stage = set(stages) == set(fa3.STAGES)
        for stage in [s for s in stages if not set(fa3.STAGES[s].head_dims) & set(args.head_dims)]:
            stages.remove(stage)
            stage_status[stage] = (f"not run: it takes head dims {fa3.STAGES[stage].head_dims}, none of "
                                   f"{args.head_dims}")
            log(f"stage {stage}: {stage_status[stage]}")
        if not stages:
            parser.error(f"none of the stages {chosen or list(fa3.STAGES)} takes head dims {args.head_dims}")
        meta.update(tested_triton=list(fa3.TESTED_TRITON),
                    stages={name: {"adds": s.adds, "expected": s.expected, "consumers": s.consumers,
                                   "block_n": s.block_n, "ring_stages": s.stages, "overlap": s.overlap,
                                   "pingpong": s.pingpong, "hold_pv_wait": s.hold_pv_wait,
                                   "producer_regs": s.producer_regs,
                                   "consumer_regs": s.consumer_regs, "maxnreg": s.maxnreg,
                                   "persistent": s.persistent, "by_head_dim": s.by_head_dim}
                            for name, s in fa3.STAGES.items()})
        import_error = None
    except Exception as error:  # noqa: BLE001 - the references are still timed
        stages, import_error = chosen or ["v8a", "v8b", "v8c", "v8d", "v8e", "v8f", "v8g", "v8h"], _error_text(error)
        every_stage = not chosen
        log(f"flashcourse.kernels.hopper.fa3 does not import: {import_error}")
    log(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}; stages {stages}")

    rows: list[dict] = []
    out = Path(args.out) if args.out else None
    name = results_name(stages, every_stage, args.head_dims, args.lengths)
    meta.update(references=references)

    def save(rows, done=False):
        """The JSON so far (rewritten after every stage: a run cut short keeps what it measured)."""
        meta.update(stage_status=stage_status, seconds=round(time.time() - start, 1), complete=done)
        return save_results(name, rows, directory=out, kind="fa3-stages", meta=meta)
    rows.extend(run_stages(Path(__file__), stages, args, start=start, reserve=REFERENCE_RESERVE,
                           import_error=import_error, stage_status=stage_status, save=save))

    log(f"references: {', '.join(references)}")
    try:
        rows.extend(reference_rows(args.quick, deadline=start + args.budget + 40, references=references,
                                   head_dims=args.head_dims, lengths=args.lengths))
    except Exception as error:  # noqa: BLE001
        log(f"references failed: {_error_text(error)}")
        stage_status["references"] = _error_text(error)

    timed = [r for r in rows if r["kind"] == "time"]
    add_ratios(timed, key=_shape, rate="tflops", ours=[f"fa3-{s}" for s in stages])
    add_ratios([r for r in timed if r["provider"] in REFERENCES], key=_shape, rate="tflops", ours=["v7"])
    path = save(rows, done=True)
    log(f"wrote {path} ({meta['seconds']} s)")

    print("\nTFLOP/s, median (range); x cuDNN")
    for r in timed:
        if r["provider"].startswith("fa3-") or r["provider"] == "v7":
            ratio = r.get("ratio_vs_sdpa_cudnn")
            text = (f"{r['tflops']:.0f} ({r['tflops_min']:.0f}-{r['tflops_max']:.0f})"
                    + (f"  {ratio:.2f}x" if ratio else "")) if r["status"] == "ok" else r["status"]
            print(f"{r['provider']:8} {r['dtype']:8} D={r['head_dim']:<3} N={r['n']:<5} causal={r['causal']!s:5} "
                  f"{text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
