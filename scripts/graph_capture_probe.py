"""On a GPU: which difference between a capture that works and the train-step benchmark's makes the capture fail.

On 2026-12-02 (H200, torch 2.11, Triton 3.6) ``python -m flashcourse.bench train-step --modes eager cuda_graph``
could not record our step in a CUDA graph ("operation failed due to a previous error during capture"), and every
capture after it in the same process failed too, while a minimal capture of the same step (float16, B=2, H=4,
N=1024, D=64, causal, nothing run before it) recorded and replayed. The cases below go from that minimal capture to
the benchmark's, changing one thing at a time:

- the dtype (float16, bfloat16) and the shape (a small one and the benchmark's four, ``train_step.SHAPES``);
- how the step is built: ``minimal`` (leaf inputs, three calls on a side stream, a synchronize, the capture),
  ``kept`` (as the benchmark did at the failed run: ``make_inputs``, one eager step whose outputs are cloned and
  kept, so a clone of o keeps that step's autograd graph alive, then ``train_step.graph_step``), ``detached`` (the
  same with the clones detached, as the benchmark does now) and ``time_step`` (the benchmark's own
  ``train_step.time_step(..., mode="cuda_graph")``, timing included);
- ``torch.cuda.graph``'s ``capture_error_mode``, "global" (the default) or "thread_local";
- an eager timing of the step (on other tensors, as the benchmark's eager row) before the capture;
- the provider: ours (``attend_fn("flashcourse")``) or plain SDPA, whose backward is captured here alone in a
  process of its own (do inputs that require grad let SDPA's backward be captured at all?).

Each case runs in a Python process of its own: a failed capture can leave its process unable to go on (CUDA's
random number generator still believes a capture is under way). A case replays the recorded step once and compares
o, dq, dk and dv with an eager step on the same inputs (``replay_error``). After a failure it also tries one
``torch.randn`` on the GPU (``rng_after``), to see whether the failure poisoned the process. Warnings raised by the
case (autograd's "AccumulateGrad node's stream does not match ..." among them) are kept in ``warnings``.

Prints one line per case, OK or the error with the last lines of its traceback, and writes every result to
``<out>/<date>-<device>-graph-capture-probe.json``. Expected runtime on an H200: under 3 minutes (an estimate, not
yet measured: about twenty processes of a few seconds each, the first of each dtype and head dim compiling the
kernels, which the later ones load from Triton's cache).

    PYTHONPATH=src python scripts/graph_capture_probe.py [--out DIR] [--only NAME ...] [--timeout SECONDS]
    PYTHONPATH=src python scripts/graph_capture_probe.py --list      # the cases, without a GPU
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

RESULT_MARK = "GRAPH_CAPTURE_PROBE_RESULT "  # the child's one line of JSON starts with this
SMALL = (2, 4, 1024, 64)  # (batch, heads, n, head_dim): the minimal capture that worked
BENCH = {  # the benchmark's four shapes (train_step.SHAPES), by a short name
    "b8h12n1024d64": (8, 12, 1024, 64),
    "b16h12n1024d64": (16, 12, 1024, 64),
    "b8h16n2048d64": (8, 16, 2048, 64),
    "b4h32n2048d128": (4, 32, 2048, 128),
}
FIRST = BENCH["b8h12n1024d64"]  # the shape whose capture failed first
TRACEBACK_LINES = 20


@dataclass(frozen=True)
class Case:
    name: str
    what: str  # what this case changes, in words
    provider: str = "flashcourse"  # or sdpa_plain (train_step.attend_fn)
    dtype: str = "bfloat16"
    shape: tuple[int, int, int, int] = FIRST  # (batch, heads, n, head_dim)
    build: str = "minimal"  # minimal | kept | detached | time_step
    error_mode: str = "global"  # torch.cuda.graph's capture_error_mode
    eager_first: bool = False  # time the eager step (other tensors) before the capture


def _cases() -> list[Case]:
    cases = [
        Case("ours_minimal_fp16_small", "the capture that worked: fp16, B2 H4 N1024 D64", dtype="float16",
             shape=SMALL),
        Case("ours_minimal_bf16_small", "the dtype alone: bf16", shape=SMALL),
        Case("ours_minimal_fp16_b8h12n1024d64", "the shape alone: the benchmark's first, fp16", dtype="float16"),
    ]
    cases += [Case(f"ours_minimal_bf16_{name}", f"bf16 at the benchmark's shape {name}", shape=shape)
              for name, shape in BENCH.items()]
    cases += [
        Case("ours_minimal_bf16_thread_local", "capture_error_mode thread_local", error_mode="thread_local"),
        Case("ours_minimal_bf16_eager_first", "an eager timing of the step before the capture", eager_first=True),
        Case("ours_kept_fp16_small", "the reference's clones kept, at the shape and dtype that worked",
             dtype="float16", shape=SMALL, build="kept"),
        Case("ours_kept_bf16", "the benchmark's build at the failed run (reference clones kept)", build="kept"),
        Case("ours_kept_bf16_thread_local", "the failed run's build, capture_error_mode thread_local", build="kept",
             error_mode="thread_local"),
        Case("ours_detached_bf16", "the benchmark's build with the reference detached", build="detached"),
        Case("ours_detached_bf16_eager_first", "the same after an eager timing, as the benchmark's rows run",
             build="detached", eager_first=True),
        Case("ours_time_step_bf16_b8h12n1024d64", "train_step.time_step as the benchmark runs it now",
             build="time_step"),
        Case("ours_time_step_bf16_b4h32n2048d128", "train_step.time_step at D = 128 (another forward kernel)",
             shape=BENCH["b4h32n2048d128"], build="time_step"),
        Case("sdpa_plain_minimal_bf16", "plain SDPA alone in a fresh process, inputs that require grad",
             provider="sdpa_plain"),
        Case("sdpa_plain_kept_bf16", "plain SDPA with the failed run's build (reference clones kept)",
             provider="sdpa_plain", build="kept"),
        Case("sdpa_plain_time_step_bf16", "plain SDPA through train_step.time_step", provider="sdpa_plain",
             build="time_step"),
    ]
    return cases


CASES = {case.name: case for case in _cases()}


def _minimal_graph(attend, q, k, v, do, error_mode: str):
    """The step captured the minimal way: three calls on a side stream, a synchronize, the capture."""
    import torch

    from flashcourse.bench import train_step

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            train_step.step(attend, q, k, v, do)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, capture_error_mode=error_mode):
        outputs = train_step.step(attend, q, k, v, do)

    def replay():
        graph.replay()
        return outputs

    return replay


def run_case(case: Case) -> dict:
    """One case in this process: status ok with the replay's error against eager, or failed with the error."""
    import torch

    from flashcourse.bench import time_repeats, train_step
    from flashcourse.bench.attention import Shape, kernels_run, make_inputs

    batch, heads, n, head_dim = case.shape
    shape = Shape(case.dtype, batch, heads, head_dim, n, True)
    attend = train_step.attend_fn(case.provider)
    if case.eager_first:
        q, k, v, do = make_inputs(shape)
        time_repeats(train_step.eager_step(attend, q, k, v, do))
        del q, k, v, do
    if case.build == "time_step":
        return train_step.time_step(shape, case.provider, mode="cuda_graph")
    if case.build == "minimal":
        torch.manual_seed(0)
        size, dtype = (batch, heads, n, head_dim), getattr(torch, case.dtype)
        q, k, v, do = (torch.randn(size, device="cuda", dtype=dtype, requires_grad=i < 3) for i in range(4))
        replay = _minimal_graph(attend, q, k, v, do, case.error_mode)
        reference = tuple(t.detach().clone() for t in train_step.step(attend, q, k, v, do))
    elif case.build in ("kept", "detached"):
        q, k, v, do = make_inputs(shape)
        outputs = train_step.step(attend, q, k, v, do)
        if case.build == "kept":  # a clone of o has a grad_fn: the eager step's autograd graph stays alive
            reference = tuple(t.clone() for t in outputs)
        else:
            reference = tuple(t.detach().clone() for t in outputs)
        del outputs
        replay = train_step.graph_step(attend, q, k, v, do, capture_error_mode=case.error_mode)
    else:
        raise ValueError(f"build {case.build!r}: expected minimal, kept, detached or time_step")
    got = replay()
    torch.cuda.synchronize()
    return {"status": "ok", "replay_error": train_step.relative_error(got, reference),
            **kernels_run(case.provider, q, k, v, shape, {})}


def child(name: str) -> None:
    """Run one case and print its result as one line of JSON (after :data:`RESULT_MARK`)."""
    import traceback
    import warnings

    case = CASES[name]
    start = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            result = run_case(case)
        except BaseException as err:  # noqa: BLE001 - the failure is the finding
            lines = traceback.format_exc().rstrip().splitlines()
            first = (str(err).strip().splitlines() or [""])[0][:300]
            result = {"status": "failed", "error": f"{type(err).__name__}: {first}",
                      "traceback": "\n".join(lines[-TRACEBACK_LINES:])}
        if result.get("status") != "ok":
            result["rng_after"] = _rng_after()
    messages = []
    for warning in caught:
        first = str(warning.message).strip().splitlines()[0][:300] if str(warning.message).strip() else ""
        if first and first not in messages:
            messages.append(first)
    result.update(case=name, seconds=round(time.perf_counter() - start, 2), warnings=messages)
    print(RESULT_MARK + json.dumps(result), flush=True)


def _rng_after() -> str:
    """Whether a random tensor can still be made on the GPU in this process after the failure."""
    import torch

    try:
        torch.randn(4, device="cuda")
        torch.cuda.synchronize()
        return "ok"
    except Exception as err:  # noqa: BLE001 - what it says is the finding
        return f"{type(err).__name__}: {str(err).strip()[:200]}"


def run_in_subprocess(name: str, timeout: float) -> dict:
    """One case in a fresh Python process; its result, or why there is none."""
    command = [sys.executable, str(Path(__file__).resolve()), "--child", name]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=dict(os.environ))
    except subprocess.TimeoutExpired:
        return {"case": name, "status": "failed", "error": f"TimeoutError: no result within {timeout:g} s"}
    for line in done.stdout.splitlines():
        if line.startswith(RESULT_MARK):
            return json.loads(line[len(RESULT_MARK):])
    tail = "\n".join(done.stderr.rstrip().splitlines()[-TRACEBACK_LINES:])
    return {"case": name, "status": "failed", "error": f"the case's process exited with code {done.returncode} "
            "without a result", "traceback": tail}


def format_line(case: Case, result: dict) -> str:
    """One line per case (the traceback's tail under a failure, indented)."""
    if result.get("status") == "ok":
        extra = f"replay_error {result['replay_error']:.1e}" if "replay_error" in result else ""
        if "us" in result:
            extra += f", {result['us']:.0f} us per replay"
        kernels = f" [{result['forward_kernel']} + {result['backward_kernel']}]" if "forward_kernel" in result else ""
        return f"{case.name}: OK {extra}{kernels} ({case.what})"
    line = f"{case.name}: FAILED {result.get('error')} ({case.what})"
    if result.get("rng_after"):
        line += f"\n    torch.randn afterwards: {result['rng_after']}"
    for warning in result.get("warnings", []):
        if "stream" in warning or "capture" in warning.lower():
            line += f"\n    warning: {warning}"
    if result.get("traceback"):
        line += "\n    " + "\n    ".join(result["traceback"].splitlines())
    return line


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="folder for the JSON (default: the checkout's benchmarks/results)")
    parser.add_argument("--only", nargs="+", choices=list(CASES), metavar="NAME", help="these cases only")
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds per case (default: %(default)s)")
    parser.add_argument("--list", action="store_true", help="print the cases and exit (no GPU needed)")
    parser.add_argument("--child", choices=list(CASES), help=argparse.SUPPRESS)  # one case, in this process
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.list:
        for case in CASES.values():
            print(f"{case.name}: {case.what}")
        return
    if args.child:
        child(args.child)
        return
    import torch

    from flashcourse.bench import save_results

    if not torch.cuda.is_available():
        sys.exit("graph_capture_probe.py needs a CUDA GPU (--list shows the cases without one)")
    results = []
    for name in args.only or list(CASES):
        result = run_in_subprocess(name, args.timeout)
        results.append({**asdict(CASES[name]), **result})
        print(format_line(CASES[name], result), flush=True)
    path = save_results("graph-capture-probe", results, directory=args.out, kind="graph-capture-probe")
    failed = [r["name"] for r in results if r.get("status") != "ok"]
    print(f"{len(results) - len(failed)} of {len(results)} cases captured and replayed"
          + (f"; failed: {', '.join(failed)}" if failed else "") + f"\nwrote {path}")


if __name__ == "__main__":
    main()
