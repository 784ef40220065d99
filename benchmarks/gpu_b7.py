"""Backward b7 and its variants (``flashcourse.kernels.hopper.fa3_backward_tma``: FA3's design, dQ by a TMA
reduce-add; ``STAGES`` names them) and b8, the same design at head dim 256 (``hopper.fa3_backward_d256``), timed
beside b1, cuDNN and, where importable, FlashAttention-4, and checked against float64, on an H100 / H200 under
Triton >= 3.9.

The GPU machines carry Triton 3.6; 3.9 travels in parts (``scripts/wheel_parts.py``, which prints the calls)
and is first on the path. The times are estimates from the first run's H100 (the install adds about 20 s), and
every run stops within ``--budget`` (200 s) with its JSON written; a budget too short to leave the compiles a minute
beside the timings' reserve is refused at once, naming one that would do:

    PYTHONPATH=/tmp/t39:src python3 benchmarks/gpu_b7.py --quick --out $OUT               # about 2 minutes
    PYTHONPATH=/tmp/t39:src python3 benchmarks/gpu_b7.py --quick --no-checks --out $OUT   # about 1.5 minutes
    PYTHONPATH=/tmp/t39:src python3 benchmarks/gpu_b7.py --variants b7c --no-checks --budget 480 --out $OUT
                                               # the lengths: 80 s on an H100 (2026-12-06)
    PYTHONPATH=/tmp/t39:src python3 benchmarks/gpu_b7.py --quick --variants b7,b7b,b7c --out $OUT  # 2.5 minutes
    PYTHONPATH=/tmp/t39:src python3 benchmarks/gpu_b7.py --quick --variants b7c,b7d --out $OUT      # b7d, checked
    PYTHONPATH=/tmp/t39:src python3 benchmarks/gpu_b7.py --quick --variants b8,b8b --budget 330 --out $OUT
                                   # b8 and b8b at D = 256, checked: 90 s on an H100 (2026-12-07)
    PYTHONPATH=/tmp/t39:src python3 benchmarks/gpu_b7.py --variants b8 --no-checks --budget 330 --out $OUT
                                   # b8 by length, N = 1024-16384: 57 s on an H100 (2026-12-07)
    PYTHONPATH=/tmp/t39:src python3 benchmarks/gpu_b7.py --quick --variants b8,b8c --budget 330 --out $OUT
                                   # b8c (the dQ chunks without bank conflicts) beside b8, checked
    PYTHONPATH=/tmp/t39:src python3 benchmarks/gpu_b7.py --short --variants b7c,b7e --no-checks --budget 330 --out $OUT
                                   # short calls: where host time makes b1 the faster backward (92 s on an H100)
    PYTHONPATH=/tmp/t39:src python3 benchmarks/gpu_b7.py --quick --variants b7e,b7g,b8,b8d --budget 290 --out $OUT
                                   # bfloat16's P rounded in pairs (b7g, b8d) beside b7e and b8, checked:
                                   # 117 s on an H100 (2026-12-07)
    PYTHONPATH=/tmp/t39:src python3 benchmarks/gpu_b7.py --variants b7g,b8d --no-checks --budget 270 --out $OUT
                                   # both by length: 102 s on an H100 (2026-12-07)

``--variants`` names the variants timed and checked, each beside the same references in the same run (default:
b7 alone, the first run's plan; the times above are for b7 alone, and each further variant adds about 25 s with
its checks, 10 s without; since 2026-12-07 (evening) two or more variants at a shape are each timed twice, once in
each order, which the times above, measured before, do not count). Each variant runs at the head dims it takes
(``variant_head_dims``: b7's family at D 64 and 128, b8's at 256), and the references at every head dim of the
run's variants.

``--quick`` times one shape, (B, H, N) = (4, 16, 8192), for each head dim and dtype, causal and not (8 rows of
each provider); the default times N = 1024 to 16384 at B*H*N = 524,288 (40 rows), the lengths a band of the
dispatch needs; ``--short`` times calls of little work, N 1024 and 2048 at B*H = 16 to 128 (40 rows), where the
host's time per call can outlast the kernels' (``SHAPE_SETS``). ``--no-checks`` skips the gradient checks (a
timing-only rerun). The JSON is rewritten after each phase, so a run cut short keeps what it measured.

Why it is built this way: the first run (H100, 2026-12-06) gave b7's whole child 109 s; its checks compiled b7,
v7's forward and the small kernels anew for each (D, dtype, causal), about 14 s each, and the child was killed
10 s into the eighth (bf16, D = 128, causal), before any timing. So the phases are now, in order:

1. **compile**: one child per (D, dtype, causal), up to half the CPU cores at once, each making the first calls
   of v7's forward, each variant and b1 at that (D, dtype, causal)'s timing shapes; the kernels compile there
   (``kind`` "compile" rows give each first call's seconds, ``kernel_s`` the variant's, and the variant's
   registers, spills and shared memory) and land in Triton's cache on disk, which the later children and the
   parent read instead of compiling;
2. **time**: each variant at every timing shape, one child taking them in turn (nothing else runs on the GPU);
   where a shape has several variants, in two sweeps of opposite order, each variant's row their mean (``sweeps``);
3. **references**, in this process: SDPA's cuDNN backward, our b1 and FlashAttention-4's backward (the
   ``flash_attn.cute`` interface of ``flash-attn-4``, if it imports; else one row saying why) on the same shapes;
4. **checks** (unless ``--no-checks``): each variant's gradients against float64 autograd, as ``gpu_fa3_backward.py``
   checks b6: causal and not, N in {1, 17, 130, 1000, 4096} (a tile cut short, one row, a length that is no
   multiple of the 32- or 64-row query tile nor of the 64- or 128-key tile), the variant's head dims (D 64 and 128,
   or 256 for b8), float16 and bfloat16; o and
   lse from the v7 forward; each gradient divided by max(1, max |reference|) must lie within
   ``flashcourse.tolerance``'s (rtol, atol). One child per (D, dtype, causal), in parallel like the compiles.
   Afterwards each variant's timing row gets ``checks_passed`` for its variant, dtype and head dim (None where
   none ran).

Every child writes a "begin" line before each item (a compile, a shape, a check) and its row after it, and
prints both with the seconds since the run began. An item that runs past its limit (``--compile-timeout``,
``--shape-timeout``, ``--check-timeout``) has its child killed and is recorded as ``hang at <item> after X s``;
a new child takes the job's remaining items, so a deadlock costs one row. An item cut by the run's budget says
so instead, and items never started say "not run". Every timing is ``flashcourse.bench.time_repeats`` (median
of 3, with the range), FLOPs ``attention_flops(..., mode="bwd")``, ratios (``ratio_vs_sdpa_cudnn``,
``ratio_vs_b1``, ``ratio_vs_fa4``, and for the other variants ``ratio_vs_b7``) from ``bench.providers.add_ratios``.
The JSON is ``<out>/<date>-<device>-b7.json`` (``meta.kind = "b7"``; ``meta.variants``, and each variant's
description and expectation under ``meta.<variant>``). A ``--quick`` run of every variant is what lesson 08 reads
(``bench.summary.backward_designs``): commit it as ``<date>-<device>-b7-designs.json`` (one shape a file).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_fa3 import _error_text, _inputs, _shape, compiled_rows  # noqa: E402
from gpu_fa3_backward import _forward, b1, reference_grads, sdpa_backward, time_case  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
os.environ.pop("TRITON_INTERPRET", None)

BASE = "b7"  # the variant the others are compared with (``ratio_vs_b7``)
CHECK_NS = (1, 17, 130, 1000, 4096)
# (B, H, N), B*H*N constant: the lengths a band of the dispatch needs (plan.B7_MIN_N is the one measured so far)
# "short": a call's work small enough that the host's time per call (Python, descriptors, launches) can exceed the
# kernels' (B = 4 and 32 heads at N = 1024, the attention grid's first column, ran at 0.35-0.46x cuDNN on an H100
# under 3.9 while its kernels matched cuDNN's time): where a Gluon backward stops paying against b1.
SHAPE_SETS = {"lengths": ((16, 32, 1024), (8, 32, 2048), (4, 32, 4096), (4, 16, 8192), (2, 16, 16384)),
              "quick": ((4, 16, 8192),),
              "short": ((1, 16, 1024), (4, 16, 1024), (4, 32, 1024), (4, 16, 2048), (4, 32, 2048))}
HEAD_DIMS = (64, 128)
# Variants of another module, each at the head dims it takes: b8, b8b and b8c (hopper/fa3_backward_d256.py),
# D = 256 only. Named here, not imported, so that the plan is read on a machine whose Triton has no Gluon.
OTHER_HEAD_DIMS = {"b8": (256,), "b8b": (256,), "b8c": (256,), "b8d": (256,)}
DTYPES = ("float16", "bfloat16")
REFERENCES = ("sdpa_cudnn", "b1", "fa4")
# What the phases after the compiles need, kept from the budget: a child's start (torch, CUDA; about 5 s on the
# first run's H100, doubled) and a timed shape of one provider (0.35-0.38 s a row once compiled: 80 rows of b7c and
# b7d in 28 s, 80 of cuDNN and b1 in 30 s, H100, 2026-12-06; doubled).
CHILD_START_S = 10.0
SHAPE_S = 0.8
# The least time the compiles may be left: one (D, dtype, causal) child compiling v7's forward, b1 and a variant took
# about 30 s there. A budget that leaves less is refused before any work (an earlier run kept 0 s for them: every
# variant row read "budget spent" while the references and checks ran).
MIN_COMPILE_S = 60.0


def reserved_after_compiles(n_timed: int, n_shapes: int) -> float:
    """Seconds the budget keeps for what follows the compiles: the variants' ``n_timed`` timed rows, then cuDNN's
    and b1's ``n_shapes`` each."""
    return CHILD_START_S + SHAPE_S * (n_timed + 2 * n_shapes)


_RUN_START = time.time()  # a child is told the parent's (--since), so every line counts from the run's start


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')} +{time.time() - _RUN_START:5.1f} s] {message}", flush=True)


# ------------------------------------------------------------------------------------------ the plan
def time_shapes(shape_set: str, head_dims=HEAD_DIMS):
    """(B, H, N, D, dtype, causal) of every timed shape of ``shape_set`` (a key of ``SHAPE_SETS``) at
    ``head_dims``."""
    return [(b, h, n, d, dt, c) for dt in DTYPES for d in head_dims for (b, h, n) in SHAPE_SETS[shape_set]
            for c in (False, True)]


def variant_head_dims(name: str) -> tuple[int, ...]:
    """The head dims at which a variant is timed and checked: b7's family at D 64 and 128, b8 at 256."""
    return OTHER_HEAD_DIMS.get(name, HEAD_DIMS)


def reference_head_dims(variants) -> tuple[int, ...]:
    """The head dims the references are timed at: every head dim of a variant of the run, in order."""
    return tuple(sorted({d for name in variants for d in variant_head_dims(name)}))


def backward_of(name: str):
    """(module, its backward function) of a variant: b8's module for b8, else b7's."""
    if name in OTHER_HEAD_DIMS:
        from flashcourse.kernels.hopper import fa3_backward_d256

        return fa3_backward_d256, fa3_backward_d256.b8_backward
    from flashcourse.kernels.hopper import fa3_backward_tma

    return fa3_backward_tma, fa3_backward_tma.b7_backward


def _item(batch, heads, n, head_dim, dtype, causal) -> dict:
    return {"dtype": dtype, "head_dim": head_dim, "n": n, "causal": causal, "batch": batch, "heads": heads}


def label(item: dict) -> str:
    variant = f"{item['provider']} " if "provider" in item else ""
    return (f"{variant}{item['dtype']} D={item['head_dim']} N={item['n']} causal={item['causal']} "
            f"B={item['batch']} H={item['heads']}")


def compile_key(item: dict) -> tuple:
    """What a variant's compiled kernels depend on besides the variant: N, B and H are run-time arguments
    (``do_not_specialize``, and the tensor descriptors are keyed by dtype, block and layout only), so one
    compile serves every shape. The forward and b1 compiled for one variant serve the others in the child."""
    return item["dtype"], item["head_dim"], item["causal"]


def by_compile_key(items: list[dict]) -> list[list[dict]]:
    jobs: dict = {}
    for item in items:
        jobs.setdefault(compile_key(item), []).append(item)
    return list(jobs.values())


def sweeps(names: list[str]) -> list[tuple[int, str]]:
    """(sweep, variant) in the order one shape's variants are timed: as named, then, where there are several, in
    the reverse order. Two runs of identical code timed one after the other at (4, 16, 8192) differed by up to 15%
    by their place alone, and the side the gap fell on flipped with the order (H100, Triton 3.9, 2026-12-07): each
    variant is therefore timed at both ends and its row is the two sweeps' mean (``merge_sweeps``)."""
    order = [(0, name) for name in names]
    return order + [(1, name) for name in reversed(names)] if len(names) > 1 else order


def plan(shape_set: str, checks: bool, variants=(BASE,)) -> dict:
    """The items of each phase, each item naming its variant (``provider``): ``compile`` and ``check`` as jobs
    (lists of items, one job a child, run side by side), ``time`` as one job (shapes timed one after another,
    nothing else on the GPU; each shape's variants side by side in time, in two sweeps of opposite order where a
    shape has several: ``sweeps``). A compile serves both sweeps."""
    timed = [{"provider": name, **_item(*case), "sweep": sweep}
             for case in time_shapes(shape_set, reference_head_dims(variants))
             for sweep, name in sweeps([v for v in variants if case[3] in variant_head_dims(v)])]
    check_items = [{"provider": name, **_item(*((1, 2) if n >= 4096 else (2, 2)), n, d, dt, c)}
                   for dt in DTYPES for d in reference_head_dims(variants) for c in (False, True) for name in variants
                   if d in variant_head_dims(name) for n in CHECK_NS]
    return {"compile": by_compile_key([item for item in timed if item["sweep"] == 0]), "time": [timed],
            "check": by_compile_key(check_items) if checks else []}


# ------------------------------------------------------------------------------------------ a child's items
CUDA_FAULT = 75  # a child's exit code after a fault on the GPU: its row is written, a new child takes the rest


def child_loop(items: list[dict], out: Path, work) -> None:
    """``work(item) -> row`` for each item in turn; before each, a "begin" line with the time, so that the
    parent knows which item a hang is in and since when. Lines go to ``out`` as they come (flushed). After a
    fault on the GPU (an AcceleratorError: an illegal address or instruction) the child exits with
    ``CUDA_FAULT``: CUDA's context is broken for good, and every later item would report the same error."""
    with out.open("a") as file:
        def emit(row):
            file.write(json.dumps(row) + "\n")
            file.flush()

        for item in items:
            emit({"kind": "begin", "time": time.time()})
            row = work(item)
            emit(row)
            if str(row.get("status", "")).startswith("AcceleratorError"):
                os._exit(CUDA_FAULT)


def _row(kind: str, item: dict, **fields) -> dict:
    return {"kind": kind, "provider": BASE, **item, **fields}  # an item names its variant (provider)


def compile_item(item: dict) -> dict:
    """The first calls of v7's forward, the item's variant and b1 at a timed shape: each compiles, or loads from
    the disk cache what an earlier child compiled. Their seconds, and the variant's registers, spills and shared
    memory."""
    import torch

    from flashcourse import kernels

    row = _row("compile", item)
    batch, heads, n, head_dim, dtype, causal, stage = (item[k] for k in ("batch", "heads", "n", "head_dim", "dtype",
                                                                          "causal", "provider"))
    try:
        module, backward = backward_of(stage)
        q, k, v = _inputs(batch, heads, n, head_dim, dtype)
        do = torch.randn_like(q)
        o, lse = None, None
        for name in ("forward_v7", "kernel", "b1"):
            log(f"compile {stage if name == 'kernel' else name} at {label(item)}")
            began = time.time()
            if name == "forward_v7":
                o, lse = _forward(q, k, v, causal)
            elif name == "kernel":
                backward(q, k, v, o, lse, do, causal=causal, stage=stage)
            else:
                kernels.flash_attention_backward(q, k, v, o, lse, do, causal=causal, version="b1")
            torch.cuda.synchronize()
            row[f"{name}_s"] = round(time.time() - began, 2)
            log(f"compiled {stage if name == 'kernel' else name} at {label(item)}: first call "
                f"{row[f'{name}_s']:.1f} s")
        row["status"] = "ok"
        # The variants share one kernel function: its newest compiled specialization is this variant's.
        for compiled in compiled_rows(module.STAGES[stage].kernel, stage)[-1:]:
            row.update({key: compiled.get(key) for key in ("n_regs", "n_spills", "shared")})
    except Exception as error:  # noqa: BLE001 - recorded; the parent skips this variant's timings
        row["status"] = _error_text(error)
        traceback.print_exc()
    torch.cuda.empty_cache()
    return row


def variant_call(stage: str):
    """The maker ``time_case`` takes: the forward once, then the variant's backward as the timed call, from a plan
    kept for the shape (``backward_plan``: the launches prepared after the first call) as ``flash_attention``
    keeps it, and as b1's timed call keeps its launches. Before 2026-12-07 (late morning) each timed call launched
    through Triton: the same kernels, more host time, hidden behind the kernels at the lengths' B*H*N = 524,288."""
    def make(q, k, v, do, causal):
        module, _ = backward_of(stage)
        o, lse = _forward(q, k, v, causal)
        plan = module.backward_plan(q, k, causal=causal, stage=stage)
        return lambda: plan(q, k, v, o, lse, do)
    return make


def time_item(item: dict) -> dict:
    log(f"time {label(item)}")
    row = {**time_case(item["provider"], variant_call(item["provider"]), item["batch"], item["heads"], item["n"],
                       item["head_dim"], item["dtype"], item["causal"]), "sweep": item["sweep"]}
    log(f"timed {label(item)}: "
        + (f"{row['tflops']:.0f} TFLOP/s ({row['tflops_min']:.0f}-{row['tflops_max']:.0f})"
           if row["status"] == "ok" else row["status"]))
    return row


_TRACEBACKS_SHOWN = []


def check_item(item: dict) -> dict:
    """A variant's gradients against float64 autograd at one shape."""
    import torch

    from flashcourse.tolerance import TOLERANCES

    batch, heads, n, head_dim, dtype, causal = (item[k] for k in ("batch", "heads", "n", "head_dim", "dtype",
                                                                   "causal"))
    row = _row("check", item)
    log(f"check {label(item)}")
    try:
        q, k, v = _inputs(batch, heads, n, head_dim, dtype, seed=n + head_dim)
        (do,) = _inputs(batch, heads, n, head_dim, dtype, seed=n + head_dim + 1)[:1]
        o, lse = _forward(q, k, v, causal)
        _, backward = backward_of(item["provider"])
        grads = backward(q, k, v, o, lse, do, causal=causal, stage=item["provider"])
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
    log(f"checked {label(item)}: {row['status']}"
        + (f" (max err dq {row['max_err_dq']:.1e} dk {row['max_err_dk']:.1e} dv {row['max_err_dv']:.1e})"
           if "max_err_dq" in row else ""))
    return row


WORK = {"compile": compile_item, "time": time_item, "check": check_item}


# ------------------------------------------------------------------------------------------ the parent's runner
class _Child:
    """One child process working through a job's items; ``done`` counts the items it (or an earlier child of
    the job) finished, ``began`` is when the current item began."""

    def __init__(self, command, items: list[dict], done: int, env):
        self.done = done
        fd, name = tempfile.mkstemp(suffix=".jsonl")
        os.close(fd)
        self.path = Path(name)
        self.offset = 0
        self.began = time.time()  # the first item's limit counts the child's start too
        # A session of its own: a kill reaches the child's compilers too, and nothing outside it.
        self.proc = subprocess.Popen(command(items[done:], self.path), env=env, start_new_session=True)

    def new_lines(self) -> list[dict]:
        with self.path.open("rb") as file:
            file.seek(self.offset)
            data = file.read()
        complete = data[:data.rfind(b"\n") + 1]  # a line still being written waits for the next poll
        self.offset += len(complete)
        return [json.loads(line) for line in complete.decode().splitlines() if line.strip()]

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:  # stuck in the driver: left to it, the run goes on
            log(f"child {self.proc.pid} still there 30 s after SIGKILL")

    def close(self) -> None:
        self.path.unlink(missing_ok=True)


def run_jobs(kind: str, jobs: list[list[dict]], command, *, parallel: int, item_timeout: float, deadline: float,
             env=None, poll: float = 0.2) -> list[dict]:
    """Each job's items, in order, in a child process (``command(items, rows_path)`` is its argv), up to
    ``parallel`` children at once. An item that runs past ``item_timeout`` seconds (its child's start counted
    for the first) is recorded as a hang and its child killed; one that ends its child early, with the exit
    code; a new child then takes the job's remaining items. At ``deadline`` (a time.time()) the running items
    are cut and the rest recorded as not run. Returns the rows, job by job, in the items' order."""
    results: list[list[dict | None]] = [[None] * len(job) for job in jobs]
    waiting = [j for j, job in enumerate(jobs) if job]
    first_left = {j: 0 for j in waiting}  # a job's first item not yet done
    running: dict[int, _Child] = {}

    def read(j: int, child: _Child) -> None:
        for line in child.new_lines():
            if line["kind"] == "begin":
                child.began = line["time"]
            else:
                results[j][child.done] = line
                child.done += 1
                child.began = time.time()  # the next item's start, until its begin line comes

    def give_up(j: int, child: _Child, status: str) -> None:
        """The child's current item gets ``status``; the job goes back to the queue for the rest."""
        item = jobs[j][child.done]
        results[j][child.done] = _row(kind, item, status=status.format(item=label(item),
                                                                       seconds=time.time() - child.began))
        log(f"{kind}: {results[j][child.done]['status']}")
        child.done += 1
        child.close()
        del running[j]
        if child.done < len(jobs[j]):
            waiting.insert(0, j)
            first_left[j] = child.done

    while waiting or running:
        now = time.time()
        while waiting and len(running) < parallel and now < deadline:
            j = waiting.pop(0)
            running[j] = _Child(command, jobs[j], first_left[j], env)
        if now >= deadline:
            for j in waiting:
                for index in range(first_left[j], len(jobs[j])):
                    results[j][index] = _row(kind, jobs[j][index], status="not run: the run's budget is spent")
            waiting.clear()
        for j, child in list(running.items()):
            exited = child.proc.poll() is not None
            read(j, child)  # after poll: an exited child has written all it will
            if child.done == len(jobs[j]):
                child.proc.wait()
                child.close()
                del running[j]
            elif exited and child.proc.returncode == CUDA_FAULT:  # the faulted item has its row: on with the rest
                child.close()
                del running[j]
                waiting.insert(0, j)
                first_left[j] = child.done
            elif exited:
                give_up(j, child, f"child exited {child.proc.returncode} during {{item}} after {{seconds:.0f}} s")
            elif now >= deadline:
                child.kill()
                give_up(j, child, "cut at {item} after {seconds:.0f} s: the run's budget ended")
            elif now - child.began > item_timeout:
                child.kill()
                give_up(j, child, f"hang at {{item}} after {{seconds:.0f}} s (limit {item_timeout:.0f} s)")
        if running:
            time.sleep(poll)
    return [row for job_rows in results for row in job_rows if row is not None]


# ------------------------------------------------------------------------------------------ the references
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


def reference_rows(shape_set: str, deadline: float = math.inf, head_dims=HEAD_DIMS) -> list[dict]:
    makers = {"sdpa_cudnn": sdpa_backward("sdpa_cudnn"), "b1": b1, "fa4": fa4}
    _, fa4_missing = _fa4_interface()
    rows = []
    for batch, heads, n, head_dim, dtype, causal in time_shapes(shape_set, head_dims):
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


def merge_sweeps(rows: list[dict]) -> list[dict]:
    """One timing row per variant and shape from its sweeps' rows (``sweeps``): ``ms`` the mean of the sweeps'
    medians, ``ms_min`` / ``ms_max`` the fastest and slowest repeat of any, ``repeats`` their sum, the rates from
    those, and each sweep's median kept (``ms_by_sweep``). A sweep that failed is left out (its status kept in
    ``sweep_status`` when another succeeded); with none ok, the first sweep's row stands. Rows in the first
    sweep's order."""
    groups: dict = {}
    for r in rows:
        groups.setdefault((r["provider"], *_shape(r)), []).append(r)
    merged = []
    for group in groups.values():
        ok = [r for r in group if r["status"] == "ok"]
        row = {key: value for key, value in (ok or group)[0].items() if key != "sweep"}
        if len(ok) > 1:
            ms = sum(r["ms"] for r in ok) / len(ok)
            flops = ok[0]["tflops"] * 1e12 * ok[0]["ms"] * 1e-3
            row.update(ms=ms, ms_min=min(r["ms_min"] for r in ok), ms_max=max(r["ms_max"] for r in ok),
                       repeats=sum(r["repeats"] for r in ok), ms_by_sweep=[r["ms"] for r in ok])
            row.update(tflops=flops / (ms * 1e-3) / 1e12, tflops_min=flops / (row["ms_max"] * 1e-3) / 1e12,
                       tflops_max=flops / (row["ms_min"] * 1e-3) / 1e12)
        if ok and len(ok) < len(group):
            row["sweep_status"] = [r["status"] for r in group]
        merged.append(row)
    return merged


def mark_checks(rows: list[dict], variants=(BASE,)) -> None:
    """Each variant's timing rows' ``checks_passed``: every check of its variant, dtype and head dim ok (None
    where none ran)."""
    checks: dict = {}
    for r in rows:
        if r["kind"] == "check":
            checks.setdefault((r["provider"], r["dtype"], r["head_dim"]), []).append(r["status"] == "ok")
    for r in rows:
        if r["kind"] == "time" and r["provider"] in variants:
            got = checks.get((r["provider"], r["dtype"], r["head_dim"]))
            r["checks_passed"] = all(got) if got else None


# ------------------------------------------------------------------------------------------ main
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="results folder (default: the checkout's benchmarks/results)")
    shapes = parser.add_mutually_exclusive_group()
    shapes.add_argument("--quick", action="store_const", dest="shape_set", const="quick", default="lengths",
                        help="N = 8192 only (one shape per head dim and dtype)")
    shapes.add_argument("--short", action="store_const", dest="shape_set", const="short",
                        help="calls of little work (N 1024 and 2048, B*H 16-128), where host time can decide")
    parser.add_argument("--no-checks", action="store_true", help="skip the gradient checks (a timing-only rerun)")
    parser.add_argument("--variants", default=BASE,
                        help="comma-separated variants of fa3_backward_tma.STAGES (D 64, 128) or of "
                             "fa3_backward_d256.STAGES (b8, b8b, b8c: D = 256) to time and check (default: b7)")
    parser.add_argument("--budget", type=float, default=200.0, help="seconds for the whole run, the JSON written")
    parser.add_argument("--compile-timeout", type=float, default=120.0,
                        help="seconds for one variant's first calls (its child's start included)")
    parser.add_argument("--shape-timeout", type=float, default=45.0,
                        help="seconds for one timed shape of b7 (the first also counts its child's start)")
    parser.add_argument("--check-timeout", type=float, default=60.0, help="seconds for one gradient check")
    parser.add_argument("--child", choices=sorted(WORK), help=argparse.SUPPRESS)
    parser.add_argument("--items", help=argparse.SUPPRESS)
    parser.add_argument("--rows", help=argparse.SUPPRESS)
    parser.add_argument("--since", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.child:
        global _RUN_START
        _RUN_START = args.since or _RUN_START
        child_loop(json.loads(args.items), Path(args.rows), WORK[args.child])
        return 0

    import torch
    import triton

    from flashcourse.bench import environment_info, save_results
    from flashcourse.bench.providers import add_ratios

    start = _RUN_START
    deadline = start + args.budget
    variants = tuple(dict.fromkeys(v.strip() for v in args.variants.split(",") if v.strip()))
    work = plan(args.shape_set, checks=not args.no_checks, variants=variants)
    n_shapes = len(time_shapes(args.shape_set, reference_head_dims(variants)))
    reserved = reserved_after_compiles(len(work["time"][0]), n_shapes)
    if args.budget < reserved + MIN_COMPILE_S:
        print(f"--budget {args.budget:.0f} s is too short: the timings keep {reserved:.0f} s and the compiles need "
              f"{MIN_COMPILE_S:.0f} s; give --budget {math.ceil(reserved + MIN_COMPILE_S + 60)} or more (the checks "
              "take the rest)")
        return 2
    if not torch.cuda.is_available():
        print("gpu_b7.py needs a CUDA GPU (Hopper)")
        return 2
    meta = environment_info()
    meta.update(capability=list(torch.cuda.get_device_capability()), shape_set=args.shape_set,
                quick=args.shape_set == "quick", checks=not args.no_checks,
                triton_path=triton.__file__, budget_s=args.budget, variants=list(variants))
    try:
        from flashcourse.kernels.hopper import fa3_backward_tma

        known = [*fa3_backward_tma.STAGES, *OTHER_HEAD_DIMS]
        unknown = [v for v in variants if v not in known]
        if unknown or not variants:
            print(f"--variants takes names from {', '.join(known)} (got {args.variants!r})")
            return 2
        meta.update(tested_triton=list(fa3_backward_tma.TESTED_TRITON), has_tma_reduce=fa3_backward_tma.HAS_TMA_REDUCE,
                    block_m={str(d): m for d, m in fa3_backward_tma.BLOCK_M.items()})
        for name in variants:
            module, _ = backward_of(name)
            spec = module.STAGES[name]
            meta[name] = {"module": module.__name__, "adds": spec.adds, "expected": spec.expected,
                          "keys": spec.keys(), "ring_stages": spec.stages,
                          "stats_by_tma": spec.stats_by_tma, "lean_regs": spec.lean_regs,
                          "block_m": {str(d): spec.rows(d) for d in variant_head_dims(name)},
                          "producer_regs": spec.producer_regs, "consumer_regs": spec.consumer_regs}
        import_error = None if fa3_backward_tma.HAS_TMA_REDUCE else (
            f"Triton {triton.__version__} has no tma.async_atomic_add: run with PYTHONPATH=/tmp/t39:src "
            "(scripts/wheel_parts.py)")
    except Exception as error:  # noqa: BLE001 - the references are still timed
        import_error = _error_text(error)
    log(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__} ({triton.__file__})")

    phases: dict = {}
    out = Path(args.out) if args.out else None
    rows: list[dict] = []

    def save(done=False):
        meta.update(phases=phases, seconds=round(time.time() - start, 1), complete=done)
        return save_results("b7", rows, directory=out, kind="b7", meta=meta)

    script = str(Path(__file__).resolve())
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH"))
                                                      if p))

    def command(kind):
        return lambda items, path: [sys.executable, script, "--child", kind, "--items", json.dumps(items),
                                    "--rows", str(path), "--since", repr(start)]

    parallel = max(1, (os.cpu_count() or 2) // 2)
    if import_error:
        log(f"b7 cannot run: {import_error}")
        phases["b7"] = f"not run: {import_error}"
    else:
        log(f"compile: {', '.join(variants)} at {len(work['compile'])} (D, dtype, causal) (with v7's forward and b1), "
            f"{parallel} at a time")
        began = time.time()
        compiled = run_jobs("compile", work["compile"], command("compile"), parallel=parallel,
                            item_timeout=args.compile_timeout, deadline=deadline - reserved, env=env)
        rows.extend(compiled)
        phases["compile"] = {"seconds": round(time.time() - began, 1),
                             "ok": sum(r["status"] == "ok" for r in compiled), "of": len(compiled)}
        save()

        def compiled_key(item):
            return item["provider"], *compile_key(item)

        ready = {compiled_key(r) for r in compiled if r["status"] == "ok"}
        failed = {compiled_key(r): r["status"] for r in compiled if r["status"] != "ok"}
        to_time = [item for item in work["time"][0] if compiled_key(item) in ready]
        for item in work["time"][0]:
            if compiled_key(item) not in ready and item["sweep"] == 0:
                why = failed.get(compiled_key(item), "no first call")
                rows.append({**_row("time", item), "mode": "bwd", "status": f"not run: its compile: {why}"})
        log(f"time: {len(to_time)} shapes of {', '.join(variants)}, one after another")
        began = time.time()
        timed = run_jobs("time", [to_time], command("time"), parallel=1, item_timeout=args.shape_timeout,
                         deadline=deadline - reserved_after_compiles(0, n_shapes), env=env)  # the references' time kept
        rows.extend({"mode": "bwd", **r} for r in merge_sweeps(timed))
        phases["time"] = {"seconds": round(time.time() - began, 1),
                          "ok": sum(r["status"] == "ok" for r in timed), "of": len(timed)}
        save()

    log("references: SDPA cuDNN, b1, FA4")
    began = time.time()
    try:
        rows.extend(reference_rows(args.shape_set, deadline=deadline, head_dims=reference_head_dims(variants)))
        phases["references"] = {"seconds": round(time.time() - began, 1)}
    except Exception as error:  # noqa: BLE001
        log(f"references failed: {_error_text(error)}")
        phases["references"] = _error_text(error)
    save()

    if work["check"] and not import_error:
        log(f"checks: {sum(map(len, work['check']))} gradient checks of {', '.join(variants)}, {parallel} children "
            "at a time")
        began = time.time()
        checked = run_jobs("check", work["check"], command("check"), parallel=parallel,
                           item_timeout=args.check_timeout, deadline=deadline, env=env)
        rows.extend(checked)
        phases["checks"] = {"seconds": round(time.time() - began, 1),
                            "ok": sum(r["status"] == "ok" for r in checked), "of": len(checked)}
    mark_checks(rows, variants)

    timed_rows = [r for r in rows if r["kind"] == "time"]
    add_ratios(timed_rows, key=_shape, rate="tflops", ours=[*variants, "b1"])  # each over cuDNN and FA4
    add_ratios([r for r in timed_rows if r["provider"] in (*variants, "b1")], key=_shape, rate="tflops",
               ours=variants)  # each variant over b1
    others = [v for v in variants if v != BASE]
    if others and BASE in variants:  # each later variant over b7, in the same run
        add_ratios([r for r in timed_rows if r["provider"] in variants], key=_shape, rate="tflops", ours=others)
    path = save(done=True)
    log(f"wrote {path} ({meta['seconds']} s)")

    print("\nfirst calls (s): v7 forward, the variant, b1; the variant's registers, spills, shared memory")
    for r in rows:
        if r["kind"] == "compile":
            seconds = " ".join(f"{r.get(f'{name}_s', float('nan')):5.1f}" for name in ("forward_v7", "kernel", "b1"))
            print(f"{label(r)}  {seconds}  {r.get('n_regs')} {r.get('n_spills')} {r.get('shared')}  {r['status']}")
    print("\nbackward TFLOP/s, median (range); x cuDNN; x b1; x FA4; x b7")
    for r in timed_rows:
        if r["provider"] in (*variants, "b1"):
            ratios = "".join(f"  {r[f'ratio_vs_{p}']:.2f}x {p}" for p in ("sdpa_cudnn", "b1", "fa4", BASE)
                             if r.get(f"ratio_vs_{p}"))
            sweep_ms = "/".join(f"{ms:.3f}" for ms in r.get("ms_by_sweep", ()))
            text = (f"{r['tflops']:.0f} ({r['tflops_min']:.0f}-{r['tflops_max']:.0f}){ratios}"
                    + (f"  sweeps {sweep_ms} ms" if sweep_ms else "") if r["status"] == "ok" else r["status"])
            print(f"{r['provider']:4} {r['dtype']:8} D={r['head_dim']:<3} N={r['n']:<5} causal={r['causal']!s:5} "
                  f"{text}")
    for name in variants:
        checks = [r for r in rows if r["kind"] == "check" and r["provider"] == name]
        print(f"{name} checks: {sum(r['status'] == 'ok' for r in checks)}/{len(checks)} passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
