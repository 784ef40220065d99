"""Where the host time of a small call goes, measured without a GPU: our Python work with every launch a no-op.

Run from a checkout: ``PYTHONPATH=src python benchmarks/host_profile.py [--calls 2000]`` (on a machine with a GPU,
with ``TRITON_INTERPRET=1`` in front). It takes our calls of ``python -m flashcourse.bench overhead`` (the forward,
the training step and ``flash_decode`` at its tiny shapes), on CPU tensors, and makes them take the path a repeat
call takes on an H200:

- ``configs.device_props`` answers with the H200's properties, not the interpreter's (launch choices, splits);
- every ``kernel[grid](**kwargs)`` counts one *full* launch, runs Triton's own argument binding for a CUDA target
  (``JITFunction.run`` up to the driver call: bind, specialise, build the cache key) and returns a stand-in for
  the compiled kernel that ``kernels/launch.py`` accepts; launching that stand-in counts one *cached* launch;
- the plan and launch caches' keys are computed as on a GPU (forward's ``_launch_key`` and the front door's
  ``_decode_key`` without the test for a CUDA device).

What it cannot see: the driver launch itself (Triton's C launcher packing the arguments, ``cuLaunchKernel``), the
CUDA caching allocator (a CUDA ``torch.empty`` costs more than a CPU one) and the GPU. So the totals are a floor of
the GPU's host time; the shares show what our code and Triton's binding cost. Times are this thread's CPU time
(``time.thread_time``), so other work on a shared machine disturbs them less than wall time. Prints, per call: the
microseconds (the fastest repeat and the median), with and without Triton's binding, the launches by kernel, the
cost of each piece timed alone, and cProfile's views.
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import inspect
import pstats
import statistics
import textwrap
import time
import timeit
from types import SimpleNamespace

import torch

from flashcourse import device

device.setup()  # without a GPU: Triton's interpreter, which must be chosen before Triton is first imported
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import make_backend  # noqa: E402
from triton.runtime.interpreter import InterpretedFunction  # noqa: E402
from triton.runtime.jit import JITFunction, compute_cache_key, create_function_from_signature  # noqa: E402

from flashcourse.bench import overhead  # noqa: E402
from flashcourse.kernels import _checks, call, common, configs, decode, forward, launch, rules  # noqa: E402

try:  # absent in checkouts before the plans (run there to time the path they replaced)
    from flashcourse.kernels import plan  # noqa: E402
except ImportError:
    plan = None

H200 = configs.KNOWN_DEVICES["H200"]
LAUNCHES: collections.Counter = collections.Counter()  # ("full" | "cached", kernel name) -> launches
LAST_ARGS: dict[str, dict] = {}  # kernel name -> the keyword arguments of its last full launch
BINDING = {"on": True}  # off: a full launch skips Triton's binding, to time what the binding adds
BACKEND = make_backend(GPUTarget("cuda", 90, 32))


class StandIn:
    """What ``kernel[grid](...)`` returns on a GPU, as far as ``launch.cached_launch_supported`` looks at it;
    launching it only counts."""

    packed_metadata = ()

    def __init__(self, kernel):
        self.name = kernel.fn.__name__
        self.src = SimpleNamespace(signature=dict.fromkeys(inspect.signature(kernel.fn).parameters))

    def __getitem__(self, grid):
        return self.launch

    def launch(self, *args):
        LAUNCHES["cached", self.name] += 1


class Binding:
    """Triton's work in ``kernel[grid](**kwargs)`` before the driver call, for a CUDA target: bind and specialise
    every argument (alignment, multiples of 16) and build the key of its compiled-kernel cache."""

    def __init__(self, kernel):
        jit = JITFunction(kernel.fn)
        self.binder = create_function_from_signature(jit.signature, jit.params, BACKEND)
        self.key_cache: dict = {}

    def __call__(self, kwargs: dict) -> None:
        _, specialization, options = self.binder(**kwargs)
        compute_cache_key(self.key_cache, specialization, options)


_STAND_INS: dict[int, StandIn] = {}
_BINDINGS: dict[int, Binding] = {}


def full_launch(kernel, grid):
    """The stand-in of ``kernel[grid]``: Triton's binding, then the stand-in compiled kernel."""

    def run(**kwargs):
        name = kernel.fn.__name__
        LAUNCHES["full", name] += 1
        LAST_ARGS[name] = kwargs
        if id(kernel) not in _STAND_INS:  # made once per kernel, as Triton makes its binder once
            _STAND_INS[id(kernel)], _BINDINGS[id(kernel)] = StandIn(kernel), Binding(kernel)
        if BINDING["on"]:
            _BINDINGS[id(kernel)](kwargs)
        return _STAND_INS[id(kernel)]

    return run


def gpu_launch_keys() -> None:
    """Recompile forward's ``_launch_key`` and the front door's ``_decode_key`` without their CUDA-only test, so that
    CPU tensors take the cached path a GPU's repeat call takes. Refuses when the test is gone (the source changed:
    update this)."""
    test = 'q.device.type != "cuda"'
    for module, name in ((forward, "_launch_key"), (call, "_decode_key")):
        source = textwrap.dedent(inspect.getsource(getattr(module, name)))
        if test not in source:
            raise SystemExit(f"{module.__name__}.{name} no longer contains {test!r}: update gpu_launch_keys")
        # compile() inherits this file's `from __future__ import annotations`: annotations stay unevaluated
        code = compile(source.replace(test, "False"), module.__file__, "exec")
        namespace: dict = {}
        exec(code, module.__dict__, namespace)  # the module's globals: layout_key, Rules...
        setattr(module, name, namespace[name])


def as_on_an_h200() -> None:
    """Stub the launches, answer with the H200's properties, key the launch caches and let plans repeat their
    launches as on a GPU. The plans' routes are the H200's too: where a Gluon stage would serve a call, the
    stand-in v7 launch takes its place (Gluon compiles nothing in the interpreter), at the same host path."""
    InterpretedFunction.__getitem__ = full_launch
    configs.device_props = lambda device: H200
    if plan is not None:
        plan.repeatable = lambda q: True
        plan.gluon_stage = lambda *args, **kwargs: (None, "stubbed: the host profile times v7's launch")
    gpu_launch_keys()


def cases() -> dict[str, tuple]:
    """Our three calls of the overhead benchmark, each with whether it runs with autograd on."""
    calls = overhead.providers("cpu")
    return {name: (calls[name], name in overhead.TRAINING)
            for name in ("flashcourse_forward", "flashcourse_train_step", "flashcourse_decode")}


def launches_per_call(fn) -> dict:
    """{("full" | "cached", kernel name): launches} of one call of fn."""
    LAUNCHES.clear()
    fn()
    return dict(LAUNCHES)


def cpu_us(fn, calls: int, repeats: int) -> list[float]:
    """This thread's CPU microseconds per call of fn, per repeat of ``calls`` calls: on a machine shared with other
    work, wall time would count the moments another process had the core."""
    return [t / calls * 1e6 for t in timeit.repeat(fn, number=calls, repeat=repeats, timer=time.thread_time)]


def us_alone(fn, calls: int = 5000) -> float:
    """CPU microseconds of one call of fn: the fastest of 5 repeats."""
    return min(cpu_us(fn, calls, 5))


def pieces() -> dict[str, float]:
    """The pieces of a call timed alone, on the forward's inputs (and the backward's launch arguments)."""
    from flashcourse.kernels import backward

    x = torch.randn(1, 16, 128, 64, dtype=torch.float16)
    grad = [t.requires_grad_() for t in (x.clone(), x.clone(), x.clone())]
    version = forward.FORWARD_VERSIONS[forward.DEFAULT_FORWARD]

    class Identity(torch.autograd.Function):  # autograd's own cost of a Python Function with three inputs
        @staticmethod
        def forward(ctx, q, k, v):
            ctx.save_for_backward(q, k, v)
            return q.view_as(q)

        @staticmethod
        def backward(ctx, do):
            return do, do, do

    found = {
        "torch.compiler.is_compiling()": torch.compiler.is_compiling,
        "check_qkv": lambda: _checks.check_qkv(x, x, x),
        "parse_rules (dense)": lambda: rules.parse_rules(x, x),
        "forward _launch_key (GPU key)": lambda: forward._launch_key(version, rules.DENSE, None, None, x, x, x),
        "the front door, a repeat call (parse options, describe, look up)": lambda: call.describe(
            x, x, x, causal=True, scale=None, window=None, softcap=None, alibi_slopes=None, document_ids=None,
            mask_mod=None, block_mask=None, enable_gqa=False, is_causal=None, forward_version=None,
            backward_version=None, varlen=(None, None, None, None), dropout_p=0.0, seed=("draw", None)),
        "layout_key of 3 tensors": lambda: launch.layout_key(x, x, x),
        "check_device": lambda: _checks.check_device(x, "q"),
        "x.device (a new torch.device each time)": lambda: x.device,
        "torch.empty_like (CPU)": lambda: torch.empty_like(x),
        "torch.empty((1, 16, 128), device=x.device, dtype=float32)": lambda: torch.empty(
            (1, 16, 128), device=x.device, dtype=torch.float32),
        "x.new_empty((1, 16, 128), dtype=float32)": lambda: x.new_empty((1, 16, 128), dtype=torch.float32),
        "triton.cdiv on the host": lambda: triton.cdiv(1000, 64),
        "triton.next_power_of_2 on the host": lambda: triton.next_power_of_2(24),
        "-(-a // b) (integer ceil division)": lambda: -(-1000 // 64),
        "strides(q, 'q')": lambda: common.strides(x, "q"),
        "triton.set_allocator(tma_scratch(...))": lambda: triton.set_allocator(common.tma_scratch(x.device)),
        "configs.backward_candidates": lambda: configs.backward_candidates(H200, 64, 2, causal=True),
        "torch.is_grad_enabled + requires_grad x3": lambda: torch.is_grad_enabled() and any(
            t.requires_grad for t in grad),
        "autograd.grad through an identity Function": lambda: torch.autograd.grad(Identity.apply(*grad), grad, x),
        "autograd.grad through a view (a native node, no arithmetic)": lambda: torch.autograd.grad(
            grad[0].view(-1), grad[0], x.view(-1)),
    }
    for name in ("_bwd_preprocess", "_bwd_dkdv_kernel", "_bwd_dq_kernel", "_decode_split_kernel",
                 "_decode_combine_kernel", "_fwd_v7_kernel"):
        kernel = next((getattr(m, name) for m in (backward, decode, forward) if hasattr(m, name)), None)
        if name in LAST_ARGS and kernel is not None:
            binding, kwargs = Binding(kernel), LAST_ARGS[name]
            found[f"Triton binding, {name} ({len(kwargs)} arguments)"] = lambda b=binding, a=kwargs: b(a)
    return {name: us_alone(fn) for name, fn in found.items()}


def save(label: str, rows: list[dict]) -> str:
    """Today's host-profile results file with ``rows`` in place of any earlier rows labelled ``label``."""
    import json

    from flashcourse import resources
    from flashcourse.bench import environment_info, save_results

    meta = environment_info()
    meta["device"] = "cpu-launches-stubbed"  # the file's name: <date>-cpu-launches-stubbed-host-profile.json
    path = resources.new_results_dir() / f"{meta['date']}-cpu-launches-stubbed-host-profile.json"
    if path.exists():
        rows = [r for r in json.loads(path.read_text())["rows"] if r["label"] != label] + rows
    return str(save_results("host-profile", rows, kind="host-profile", meta=meta, extra={
        "method": "benchmarks/host_profile.py: CPU tensors, every launch a stand-in, device properties of the H200; "
                  "this thread's CPU time per call (time.thread_time), fastest and median of the repeats"}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000, help="calls per timing and per profile")
    parser.add_argument("--repeats", type=int, default=7, help="timings per call (the fastest is the least "
                        "disturbed by other work on the machine)")
    parser.add_argument("--lines", type=int, default=25, help="functions shown per cProfile view")
    parser.add_argument("--json", metavar="LABEL", help="also save the per-call times as rows labelled LABEL (say, "
                        "the commit) in benchmarks/results/<date>-cpu-launches-stubbed-host-profile.json (rows of "
                        "another label already there are kept: run it before and after a change)")
    args = parser.parse_args()
    as_on_an_h200()
    print(f"torch {torch.__version__}, Triton {triton.__version__}, CPU tensors, launches stubbed, device "
          f"properties of the {H200.name}")
    rows = []
    for name, (fn, grad) in cases().items():
        with torch.set_grad_enabled(grad):
            for _ in range(50):  # compile nothing, but fill the launch caches
                fn()
            times = cpu_us(fn, args.calls, args.repeats)
            BINDING["on"] = False
            unbound = cpu_us(fn, args.calls, args.repeats)
            BINDING["on"] = True
            counts = launches_per_call(fn)
            profiler = cProfile.Profile()
            profiler.enable()
            for _ in range(args.calls):
                fn()
            profiler.disable()
        rows.append({"label": args.json, "call": name, "us_min": min(times), "us_median": statistics.median(times),
                     "us_max": max(times), "calls": args.calls, "repeats": args.repeats,
                     "launches": {f"{how} {kernel}": n for (how, kernel), n in counts.items()}})
        print(f"\n=== {name}: {min(times):.1f} us per call at best, median {statistics.median(times):.1f} (repeats "
              f"up to {max(times):.1f}); launches per call {counts}; without Triton's binding of the full launches "
              f"{min(unbound):.1f} at best")
        stats = pstats.Stats(profiler)
        stats.sort_stats("tottime").print_stats(args.lines)
        stats.sort_stats("cumulative").print_stats("flashcourse|host_profile|torch", args.lines)
    if args.json:
        print(f"saved {save(args.json, rows)}")
    print("\n=== pieces timed alone (CPU us per call, fastest of 5)")
    for piece, us in pieces().items():
        print(f"{us:8.2f}  {piece}")


if __name__ == "__main__":
    main()
