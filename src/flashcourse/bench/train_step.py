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

Each shape is timed in three ``mode`` s, one row each (:data:`MODES`), every ratio against SDPA in the same mode:

- ``eager``: the step as written, each call paying its Python and launch time on the host;
- ``cuda_graph``: the same step recorded once in a ``torch.cuda.CUDAGraph`` on static inputs (first calls on a
  side stream, then the capture) and replayed: one host call launches every kernel of the step;
- ``reduce_overhead``: the attention call through ``torch.compile(mode="reduce-overhead")`` (the compiler's own
  CUDA graphs, forward and backward), ours and plain SDPA only (a pinned backend is a context manager around the
  call, not part of it). ``<provider>_cudagraph_skips`` counts the graphs the compiler declined to record: above 0,
  that provider's time is compiled code without a graph. Its graphs copy q, k, v and dO into their own buffers
  on every call, as they would for any tensor made outside the compiled function.

A replayed step is checked against the eager step on the same inputs before it is timed (``replay_error``, the
largest relative error over o, dq, dk and dv). A capture or a compile that fails leaves status ``failed``, its
error and the last lines of its traceback (``traceback``) for that provider and mode; the run goes on.

Each recorded measurement (one provider, one shape, one mode other than eager) runs in a fresh Python process of
its own (:func:`in_child`): a capture that fails can leave its process unable to go on (CUDA's random number
generator still believes a capture is under way, so the next ``torch.randn`` on the GPU raises), and that must
cost that one row, not the rows after it. A child that dies or hangs is a failed row too. Eager rows run in this
process, as do the checks of our kernel (``validate_ours``); a check that raises leaves one failed row per mode
for its shape, and the run goes on to the next shape.
"""

from __future__ import annotations

import multiprocessing
import traceback
from collections.abc import Callable, Iterable

import torch

from flashcourse.bench import attention_flops, tflops, time_repeats
from flashcourse.bench.attention import Shape, _guarded, kernels_run, make_inputs, validate_ours, warm_up_gpu
from flashcourse.bench.providers import sdpa

# (batch, heads, n, head_dim): nanoGPT's B=8, H=12, N=1024, D=64, twice the batch, and two models at N=2048.
SHAPES = ((8, 12, 1024, 64), (16, 12, 1024, 64), (8, 16, 2048, 64), (4, 32, 2048, 128))
DTYPES = ("bfloat16", "float16")
PROVIDERS = ("flashcourse", "sdpa_plain", "sdpa_flash", "sdpa_cudnn")  # the first is ours, the rest SDPA's
MODES = ("eager", "cuda_graph", "reduce_overhead")
MODE_PROVIDERS = {"eager": PROVIDERS, "cuda_graph": PROVIDERS, "reduce_overhead": PROVIDERS[:2]}
REPLAY_TOLERANCE = 2e-2  # relative error of a replayed step against the eager one (validate_ours' bound)
CHILD_TIMEOUT_S = 300  # one recorded measurement in its own process: start, compile (cached on disk), capture, time
TRACEBACK_LINES = 20  # the traceback's last lines kept in a failed row


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


def step(attend: Callable, q, k, v, do) -> tuple:
    """One training step's attention: ``o = attend(q, k, v)``, then (dq, dk, dv) through autograd; (o, dq, dk, dv)."""
    o = attend(q, k, v)
    return (o, *torch.autograd.grad(o, (q, k, v), do))


def eager_step(attend: Callable, q, k, v, do) -> Callable[[], tuple]:
    """The step as a user writes it: every call runs its Python and launches its kernels one by one."""
    return lambda: step(attend, q, k, v, do)


def graph_step(attend: Callable, q, k, v, do, *, warmup: int = 3,
               capture_error_mode: str = "global") -> Callable[[], tuple]:
    """The step recorded in a CUDA graph on these tensors, returned as ``replay() -> (o, dq, dk, dv)``.

    The inputs are static: a replay reads q, k, v and dO at the addresses they have now (copy new values into
    them) and writes its outputs where the capture allocated them. The first calls run on a side stream before the
    capture, as PyTorch's CUDA graph notes ask: they do the one-time work (our plans, Triton's compiling and loading
    of our kernels, cuDNN's setup for SDPA) that must neither be recorded nor interrupt a capture.
    ``capture_error_mode`` is ``torch.cuda.graph``'s: "global" (its default) refuses, during the capture, the
    CUDA calls that are unsafe to capture from any thread of the process, "thread_local" only from this one."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            step(attend, q, k, v, do)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, capture_error_mode=capture_error_mode):
        outputs = step(attend, q, k, v, do)

    def replay() -> tuple:
        graph.replay()
        return outputs

    return replay


def compiled_step(attend: Callable, q, k, v, do, *, warmup: int = 3) -> Callable[[], tuple]:
    """The step with ``attend`` through ``torch.compile(mode="reduce-overhead")``: Inductor records the compiled
    forward and backward in CUDA graphs of its own (CUDA graph trees) and replays them. The first calls compile,
    warm up and record; the compile caches are cleared first, so that every shape compiles for itself."""
    import torch._dynamo

    torch._dynamo.reset()
    compiled = torch.compile(attend, mode="reduce-overhead", dynamic=False)

    def run() -> tuple:
        torch.compiler.cudagraph_mark_step_begin()  # a new step: the graphs may overwrite the last step's outputs
        return step(compiled, q, k, v, do)

    for _ in range(warmup):
        run()
    return run


STEP_BUILDERS = {"eager": eager_step, "cuda_graph": graph_step, "reduce_overhead": compiled_step}


def relative_error(got: tuple, want: tuple) -> float:
    """The largest ``|got - want| / |want|`` (Frobenius norms) over the tensors of two steps."""
    with torch.no_grad():
        return max(float((g.float() - w.float()).norm() / w.float().norm().clamp_min(1e-30))
                   for g, w in zip(got, want, strict=True))


def _cudagraph_skips() -> int:
    """How many graphs Inductor has declined to record so far in this process (a CPU tensor, an op it deems
    unsafe to capture...)."""
    from torch._dynamo.utils import counters

    return int(counters["inductor"]["cudagraph_skips"])


def failure(err: BaseException) -> dict:
    """The exception being handled, ``err``, as row fields: ``status`` failed, ``error`` (its type and first line)
    and ``traceback`` (the last :data:`TRACEBACK_LINES` lines of it)."""
    first_line = (str(err).strip().splitlines() or [""])[0][:300]
    error = f"{type(err).__name__}: {first_line}" if first_line else type(err).__name__
    lines = traceback.format_exc().rstrip().splitlines()
    return {"status": "failed", "error": error, "traceback": "\n".join(lines[-TRACEBACK_LINES:])}


def _guarded_graph(measure: Callable[[], dict]) -> dict:
    """Run one measurement of a recorded mode: out of memory is ``oom`` as in eager rows, and any other failure
    (the capture refused, the compiler failed, the replay differs from eager) is status ``failed`` with its
    error and traceback, never a crash: a step that cannot be captured is what the row reports."""
    try:
        return {"status": "ok", **measure()}
    except torch.cuda.OutOfMemoryError:
        return {"status": "oom"}
    except Exception as err:  # noqa: BLE001 - any failure of a capture or a compile is this row's finding
        return failure(err)
    finally:
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def time_step(shape: Shape, provider: str, *, mode: str = "eager", device: str = "cuda", timer=None) -> dict:
    """``{"us", "us_min", "us_max", "status"}`` of one provider's step on one shape in one mode (eager,
    cuda_graph, reduce_overhead), or its status and error."""
    attend = attend_fn(provider)
    build = STEP_BUILDERS[mode]

    def measure() -> dict:
        q, k, v, do = make_inputs(shape, device=device)
        result = {}
        if mode == "eager":
            run = build(attend, q, k, v, do)
        else:
            skips = _cudagraph_skips() if mode == "reduce_overhead" else 0
            # Detached: a clone of o would keep this step's autograd graph alive, and with it the AccumulateGrad
            # nodes of q, k and v, made here on the default stream. The captured step's gradients would then flow
            # into nodes of another stream, which PyTorch warns may break the capture.
            reference = tuple(t.detach().clone() for t in step(attend, q, k, v, do))
            run = build(attend, q, k, v, do)
            error = relative_error(run(), reference)
            if not error <= REPLAY_TOLERANCE:
                raise AssertionError(f"the {mode} step differs from the eager step on the same inputs: relative "
                                     f"error {error:.2e} > {REPLAY_TOLERANCE}")
            result["replay_error"] = error
            if mode == "reduce_overhead":
                result["cudagraph_skips"] = _cudagraph_skips() - skips
        timing = time_repeats(run, timer=timer)
        return {"us": timing.ms * 1e3, "us_min": timing.ms_min * 1e3, "us_max": timing.ms_max * 1e3, **result,
                **kernels_run(provider, q, k, v, shape, {})}

    if mode == "eager":
        return _guarded(measure)
    try:
        return _guarded_graph(measure)
    finally:
        if mode == "reduce_overhead":
            import torch._dynamo

            torch._dynamo.reset()  # frees the graphs' memory pools before the next provider


def _child_main(send, target: Callable[..., dict], args: tuple, kwargs: dict) -> None:
    """What a child process of :func:`in_child` runs: ``target``'s result, or its failure, sent to the parent."""
    try:
        result = target(*args, **kwargs)
    except BaseException as err:  # noqa: BLE001 - whatever happens is the row's finding, sent back to the parent
        result = failure(err)
    send.send(result)
    send.close()


def in_child(target: Callable[..., dict], *args, timeout: float = CHILD_TIMEOUT_S, **kwargs) -> dict:
    """``target(*args, **kwargs)``, a dict, computed in a fresh Python process (multiprocessing's "spawn": nothing
    of this process's CUDA state is inherited), so that whatever a failed capture leaves behind dies with it.
    ``target`` and its arguments must be picklable (module-level functions, plain data). A child that raises, dies
    without an answer (a crash, a killed process) or takes longer than ``timeout`` seconds gives status
    ``failed`` with what is known: the error and its traceback, the exit code, or the time-out."""
    context = multiprocessing.get_context("spawn")
    receive, send = context.Pipe(duplex=False)
    # Not a daemon: a daemon may not start processes of its own, as torch.compile's compile workers are.
    child = context.Process(target=_child_main, args=(send, target, args, kwargs))
    child.start()
    send.close()  # the parent's copy: once the child's is closed too, a read ends instead of waiting forever
    try:
        if receive.poll(timeout):
            return receive.recv()
        error = f"TimeoutError: no answer from the child process within {timeout:g} s"
    except EOFError:  # the child ended without sending: it crashed or was killed
        child.join(10)
        error = f"ChildProcessError: the child process ended without an answer (exit code {child.exitcode})"
    finally:
        receive.close()
        child.join(10)
        if child.is_alive():
            child.kill()
            child.join()
    return {"status": "failed", "error": error, "traceback": ""}


def measure_shape(shape: Shape, *, mode: str = "eager", device: str = "cuda", timer=None,
                  isolate: bool | None = None) -> dict:
    """One row: our step's time on ``shape`` in ``mode`` and each SDPA provider's in the same mode, with our
    ratio against each. In a recorded mode with ``isolate`` (default: on a GPU) each provider's measurement runs
    in a child process of its own (:func:`in_child`; it times with ``do_bench``, so ``timer`` is for this process
    only); eager measurements always run here."""
    if mode not in MODE_PROVIDERS:
        raise ValueError(f"mode {mode!r}: expected one of {', '.join(MODES)}")
    isolate = (device == "cuda" if isolate is None else isolate) and mode != "eager"
    row = _shape_fields(shape, mode)
    flops = attention_flops(shape.batch, shape.heads, shape.n, shape.head_dim, causal=True, mode="fwd_bwd")
    providers = MODE_PROVIDERS[mode]
    for provider in providers:
        if isolate:
            result = in_child(time_step, shape, provider, mode=mode, device=device)
        else:
            result = time_step(shape, provider, mode=mode, device=device, timer=timer)
        prefix = "" if provider == "flashcourse" else f"{provider}_"  # ours unprefixed: us, us_min, status...
        row.update({f"{prefix}{name}": value for name, value in result.items()})
        if "us" in result:
            row[f"{prefix}tflops"] = tflops(flops, result["us"] * 1e-6)
    for provider in providers[1:]:
        if row["status"] == "ok" and row[f"{provider}_status"] == "ok":
            row[f"ratio_vs_{provider}"] = row["us"] / row[f"{provider}_us"]
            row[f"ratio_vs_{provider}_min"] = row["us_min"] / row[f"{provider}_us_max"]
            row[f"ratio_vs_{provider}_max"] = row["us_max"] / row[f"{provider}_us_min"]
    return row


def _shape_fields(shape: Shape, mode: str) -> dict:
    """The fields that name a row: its shape and mode."""
    return {"dtype": shape.dtype, "batch": shape.batch, "heads": shape.heads, "n": shape.n,
            "head_dim": shape.head_dim, "causal": shape.causal, "mode": mode}


def run(shapes: Iterable[Shape], *, modes: Iterable[str] = MODES, log=print, on_row=None, device: str = "cuda",
        timer=None, isolate: bool | None = None) -> list[dict]:
    """Validate our kernel on each shape, then time every provider on it in each mode (one row per mode);
    ``on_row(rows)`` after each row (to keep the rows of a run cut short). The recorded modes run each measurement
    in a child process on a GPU, or wherever ``isolate`` is true (:func:`measure_shape`). A check that raises
    leaves, for that shape, one row per mode with status ``failed``, its error and traceback, and nothing timed; a
    kernel the check finds wrong stops the run."""
    modes = tuple(modes)
    unknown = [m for m in modes if m not in MODE_PROVIDERS]
    if unknown:
        raise ValueError(f"unknown mode {', '.join(unknown)}: expected some of {', '.join(MODES)}")
    if device == "cuda":
        warm_up_gpu()
    rows = []
    for shape in shapes:
        try:
            check = validate_ours(shape)
        except Exception as err:  # noqa: BLE001 - a check that cannot run is this shape's finding, not a crash
            failed = failure(err)
            log(f"validate {shape}: {failed['error']}\n{failed['traceback']}")
            failed["error"] = f"validate_ours: {failed['error']}"
            for mode in modes:
                rows.append({**_shape_fields(shape, mode), **failed})
                log(format_table(rows[-1:], header=False))
                if on_row:
                    on_row(rows)
            continue
        log(f"validate {shape}: {check}")
        if not check["ok"]:
            raise AssertionError(f"flashcourse kernel is wrong on {shape}: relative errors {check}")
        for mode in modes:
            rows.append(measure_shape(shape, mode=mode, device=device, timer=timer, isolate=isolate))
            log(format_table(rows[-1:], header=False))
            if on_row:
                on_row(rows)
    return rows


def format_table(rows: list[dict], header: bool = True) -> str:
    """One line per row: its mode, each provider's microseconds per step and our ratio against each SDPA
    provider ("-" where a provider was not timed in that mode)."""
    others = PROVIDERS[1:]
    lines = [f"{'dtype':9}{'B':>4}{'H':>4}{'N':>6}{'D':>5}  {'mode':16}{'ours':>10}"
             + "".join(f"{p:>12}" for p in others) + "   ours / " + " ".join(others)] if header else []
    for r in rows:
        cells = "".join(f"{r[f'{p}_us']:12.0f}" if f"{p}_us" in r else f"{r.get(f'{p}_status', '-'):>12}"
                        for p in others)
        ours = f"{r['us']:10.0f}" if "us" in r else f"{r['status']:>10}"
        ratios = " ".join(f"{r[f'ratio_vs_{p}']:.2f}" if f"ratio_vs_{p}" in r else "-" for p in others)
        lines.append(f"{r['dtype']:9}{r['batch']:>4}{r['heads']:>4}{r['n']:>6}{r['head_dim']:>5}  "
                     f"{r.get('mode', 'eager'):16}{ours}{cells}   {ratios}")
    return "\n".join(lines)
