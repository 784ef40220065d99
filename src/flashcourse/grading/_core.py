"""The machinery behind every exercise check: parts, cases, comparison with a diagnosis, and call guards.

A :class:`Part` is one graded piece of an exercise. It knows how to make test cases from a random generator
(``cases``), how to call the learner's functions on one case (``run``, which may execute untrusted code: in the
batch grader it runs in the submission's own process), and how to judge the outputs against the float64
reference (``judge``, which runs in the grader's process and trusts nothing but the returned arrays).
:func:`run_check` glues the three together for the instant checks in the notebooks.
"""

from __future__ import annotations

import os
import re
import sys
import time
import tracemalloc
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn

import numpy as np

from .. import tolerance
from ..reference import resolve_scale  # noqa: F401 - the checks' one default scale, re-exported to exNN

Case = dict  # str -> np.ndarray | int | float | bool | str | None: the inputs of one test
Outputs = dict  # str -> np.ndarray: what the learner's functions returned on one case

_PACKAGE_DIR = Path(__file__).resolve().parents[1]  # src/flashcourse
_GRADING_DIR = Path(__file__).resolve().parent

# What the stub of an exercise raises in place of the solution (written by ``release``). The name of the function
# that holds the `# TODO` comes first, so a check can name that function even when a helper it calls raised, or a
# Triton kernel raised inside the interpreter (which wraps the error in its own).
STUB_MESSAGE = "{function}: fill in the TODO above"
_STUB_FUNCTION = re.compile(r"(\w+): fill in the TODO above")


class NotImplementedYet(AssertionError):
    """The learner's function still raises NotImplementedError (the stub has not been filled in)."""


class ForbiddenCallError(AssertionError):
    """The learner's function called the implementation it is meant to write (the library's, or PyTorch's)."""


@dataclass(frozen=True)
class Part:
    """One graded part of an exercise.

    grade_id: "ex01_a" (also the nbgrader grade_id of its check cell); points: its weight; title: what it asks;
    functions: the names of the learner's functions it calls (looked up in the notebook's namespace);
    cases(rng, hidden) -> list of Case; run(functions, case) -> Outputs; judge(case, outputs) raises
    AssertionError with a diagnosis; allowed: library functions (by name) the learner may call here;
    max_bytes(case): the most bytes the learner's code may allocate at once (None: no limit).
    """

    grade_id: str
    points: int
    title: str
    functions: tuple[str, ...]
    cases: Callable[[np.random.Generator, bool], list[Case]]
    run: Callable[[dict, Case], Outputs]
    judge: Callable[[Case, Outputs], None]
    allowed: frozenset[str] = field(default_factory=frozenset)
    max_bytes: Callable[[Case], int] | None = None

    @property
    def label(self) -> str:
        """The name the notebook uses for this part, e.g. "ex01 (a)"."""
        exercise, letter = self.grade_id.split("_")
        return f"{exercise} ({letter})"


# --------------------------------------------------------------------------------------------- describing
def describe_case(case: Case) -> str:
    """A short description of a case's inputs: shapes of arrays, values of scalars."""
    parts = []
    for name, value in case.items():
        if name.startswith("_"):
            continue
        if isinstance(value, np.ndarray):
            parts.append(f"{name} {tuple(value.shape)}")
        else:
            parts.append(f"{name}={value!r}")
    return ", ".join(parts)


def _fmt_index(idx: tuple[int, ...]) -> str:
    return "[" + ", ".join(str(i) for i in idx) + "]"


# --------------------------------------------------------------------------------------------- comparing
def to_numpy(value, what: str) -> np.ndarray:
    """An output as a NumPy array (torch tensors are moved to the CPU), or an AssertionError saying what came."""
    __tracebackhide__ = True
    if value is None:
        raise AssertionError(f"{what} is None: did your function forget to `return` it?")
    if hasattr(value, "detach") and hasattr(value, "cpu"):  # a torch tensor
        value = value.detach().cpu()
        if str(value.dtype) == "torch.bfloat16":
            value = value.float()
        return value.numpy()
    if isinstance(value, (np.ndarray, np.generic, int, float)) and not isinstance(value, bool):
        return np.asarray(value)
    raise AssertionError(f"{what} is a {type(value).__name__}, but an array was expected")


def compare(what: str, got: np.ndarray, expected: np.ndarray, *, dtype: str,
            variants: Iterable[tuple[str, Callable[[], np.ndarray]]] = (),
            nan_hint: str | None = None, check_dtype: bool = True) -> None:
    """Assert got == expected within the tolerance of ``dtype``; on failure say where and, if it can, why.

    ``variants``: (diagnosis, make_output) pairs: the outputs of known mistakes, computed lazily in float64.
    When the learner's output matches one of them, its diagnosis is part of the message.
    ``nan_hint``: what a NaN most likely means here.
    """
    __tracebackhide__ = True
    rtol, atol = tolerance.tolerance_for(dtype)
    tol = f"tolerance for {dtype}: rtol={rtol:g}, atol={atol:g}"
    got = np.asarray(got)
    if got.shape != expected.shape:
        hint = ""
        if got.shape == expected.shape[::-1] or sorted(got.shape) == sorted(expected.shape):
            hint = " (the same sizes in another order: is something transposed, or reduced over the wrong axis?)"
        elif got.size == 1 and expected.size > 1:
            hint = " (a single number: did you sum over every axis instead of one?)"
        raise AssertionError(f"{what} has shape {got.shape}, expected {expected.shape}{hint}")
    if got.dtype.kind not in "fiu":
        raise AssertionError(f"{what} has dtype {got.dtype}, expected {dtype}")
    if check_dtype and got.dtype.kind == "f" and got.dtype.name != dtype:
        raise AssertionError(
            f"{what} has dtype {got.dtype}, expected {dtype} (the inputs' dtype): compute in the inputs' "
            "dtype, without converting with astype or np.float32(...)")
    got64, exp64 = got.astype(np.float64), expected.astype(np.float64)
    nan = np.isnan(got64) & ~np.isnan(exp64)
    if nan.any():
        idx = tuple(int(i) for i in np.argwhere(nan)[0])
        message = f"{what} has NaN at index {_fmt_index(idx)} (expected {exp64[idx]:.6g}; {int(nan.sum())} NaN)"
        raise AssertionError(message + (f". Diagnosis: {nan_hint}" if nan_hint else ""))
    bad = ~np.isclose(got64, exp64, rtol=rtol, atol=atol, equal_nan=True)
    if not bad.any():
        return
    idx = tuple(int(i) for i in np.argwhere(bad)[0])
    message = (f"{what} differs at index {_fmt_index(idx)}: yours {got64[idx]:.6g}, expected {exp64[idx]:.6g}\n"
               f"({int(bad.sum())} of {got.size} entries off; {tol})")
    for diagnosis, make in variants:
        with np.errstate(all="ignore"):
            wrong = np.asarray(make(), dtype=np.float64)
        if wrong.shape == got64.shape and np.allclose(got64, wrong, rtol=max(rtol, 1e-6), atol=max(atol, 1e-7),
                                                      equal_nan=True):
            raise AssertionError(f"{message}. Diagnosis: {diagnosis}")
    if np.isinf(got64[idx]) and not np.isinf(exp64[idx]):
        message += (". An infinity usually means exp overflowed (subtract the row max first) or a mask was "
                    "applied where it should not be")
    raise AssertionError(message)


def lay_out(label: str, message: str, where: str = "") -> str:
    """A failing check's message in short lines, the diagnosis first (where the judge found one), then what
    differs, then on which inputs::

        ex03 (a) failed. Diagnosis: you forgot to rescale the running sum l by exp(m_old - m_new)
          o differs at index [0, 1]: yours 0.3, expected 0.5
          (3 of 12 entries off; tolerance for float64: rtol=1e-07, atol=1e-09)
          case 2 of 5: q (2, 3), k (2, 3), v (2, 3), causal=False, scale=None

    ``message``: the judge's, with its diagnosis after ". Diagnosis: " as every judge writes it.
    """
    detail, _, diagnosis = message.partition(". Diagnosis: ")
    details = [line.strip() for line in detail.splitlines() if line.strip()]
    if diagnosis:
        head = f"{label} failed. Diagnosis: {diagnosis}"
    else:
        head, details = f"{label} failed: {details[0] if details else 'no message'}", details[1:]
    return "\n".join([head, *(f"  {line}" for line in details), *([f"  {where}"] if where else [])])


# --------------------------------------------------------------------------------------------- guarding
# Builtins (PyTorch's) that do the exercise's work for the learner; and those that build an N x N matrix.
_FORBIDDEN_TORCH = {"softmax", "_softmax", "log_softmax", "scaled_dot_product_attention",
                    "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention"}
_MATERIALISING_TORCH = {"matmul", "bmm", "mm", "einsum", "__matmul__", "__rmatmul__", "baddbmm", "tensordot"}


def _torch_recorder(guard: CallGuard):
    """A TorchFunctionMode that shows every torch call to the guard and runs it unchanged."""
    from torch.overrides import TorchFunctionMode

    class Recorder(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            guard._torch_call(func)
            return func(*args, **(kwargs or {}))

    return Recorder()


def _library_files() -> dict[str, str]:
    """Source file -> module name, for the library modules whose functions an exercise must not call."""
    files = {}
    for module in ("reference", "tiled", "iomodel", "trees"):
        files[str(_PACKAGE_DIR / f"{module}.py")] = f"flashcourse.{module}"
    for package in ("kernels", "distributed"):  # exercise 11 writes what distributed.schedule computes
        for path in (_PACKAGE_DIR / package).glob("*.py"):
            files[str(path)] = f"flashcourse.{package}.{path.stem}"
    scipy_special = sys.modules.get("scipy.special")
    if scipy_special is not None:  # scipy.special.softmax / logsumexp, if the learner has scipy
        files[str(Path(scipy_special.__file__).parent / "_logsumexp.py")] = "scipy.special"
    return files


class CallGuard:
    """While active, record calls from the learner's code into the library's implementations (reference, tiled,
    iomodel, kernels, distributed, PyTorch's softmax / SDPA) and, when ``forbid_matmul``, PyTorch matrix products.

    ``allowed``: function names the exercise permits (for example the ``Memory`` methods of the simulator).
    Only calls made directly from code outside the library and outside ``flashcourse.grading`` count, so the
    checks' own use of the reference is not reported. This catches honest shortcuts; it is not a sandbox.
    """

    def __init__(self, allowed: Iterable[str] = (), *, forbid_matmul: bool = False):
        self.allowed = set(allowed)
        self.forbid_matmul = forbid_matmul
        self.files = _library_files()
        self.trusted = set(self.files) | {str(p) for p in _GRADING_DIR.glob("*.py")}
        self.calls: list[str] = []
        self._previous = None

    def _profile(self, frame, event, arg):
        if event == "call":
            code = frame.f_code
            module = self.files.get(code.co_filename)
            if module is None or code.co_name in self.allowed or code.co_name.startswith("<"):
                return
            caller = frame.f_back
            if caller is not None and caller.f_code.co_filename not in self.trusted:
                self._record(f"{module}.{code.co_name}")
        elif event == "c_call":
            name = getattr(arg, "__name__", "")
            if name in _FORBIDDEN_TORCH or (self.forbid_matmul and name in _MATERIALISING_TORCH):
                owner = getattr(arg, "__self__", None)
                module = getattr(arg, "__module__", None) or type(owner).__module__
                if "torch" in str(module) and frame.f_code.co_filename not in self.trusted:
                    self._record(f"torch {name}")

    def inspect_functions(self, functions: dict) -> None:
        """Record a learner's function that is itself the library's (``softmax_safe = reference.softmax_safe``)."""
        for fn in functions.values():
            code = getattr(getattr(fn, "__func__", fn), "__code__", None)
            module = self.files.get(code.co_filename) if code is not None else None
            if module is not None and code.co_name not in self.allowed:
                self._record(f"{module}.{code.co_name}")

    def _record(self, name: str) -> None:
        if name not in self.calls:
            self.calls.append(name)

    def _torch_call(self, func) -> None:
        """Called by a TorchFunctionMode for every torch operation, operators such as ``@`` included (which
        the profiler does not see)."""
        name = getattr(func, "__name__", "")
        if name in _FORBIDDEN_TORCH or (self.forbid_matmul and name in _MATERIALISING_TORCH):
            frame = sys._getframe(2)
            while frame is not None and f"{os.sep}torch{os.sep}" in frame.f_code.co_filename:
                frame = frame.f_back  # skip torch's own Python layers
            if frame is not None and frame.f_code.co_filename not in self.trusted:
                self._record(f"torch {name}")

    def __enter__(self):
        self._previous = sys.getprofile()
        self._torch_mode = None
        if "torch" in sys.modules:  # only a learner's code that already imported torch can call it
            self._torch_mode = _torch_recorder(self)
            self._torch_mode.__enter__()
        sys.setprofile(self._profile)
        return self

    def __exit__(self, *exc):
        sys.setprofile(self._previous)
        if self._torch_mode is not None:
            self._torch_mode.__exit__(*exc)
        return False

    def verdict(self, label: str) -> None:
        """Raise ForbiddenCallError if a forbidden call was recorded."""
        if not self.calls:
            return
        matmul = [c for c in self.calls if c.split()[-1] in _MATERIALISING_TORCH]
        if matmul:
            raise ForbiddenCallError(
                f"{label}: your code called {', '.join(matmul)} outside the kernel, which materialises the "
                "N x N score matrix in memory; the point is to compute it tile by tile inside the kernel")
        raise ForbiddenCallError(
            f"{label}: your code called {', '.join(self.calls)}, which computes what this exercise asks you to "
            "write. Write it from NumPy / Triton operations; using the library's version earns no points")


# --------------------------------------------------------------------------------------------- running
def _not_implemented(error: BaseException) -> tuple[bool, str | None]:
    """Whether the error is (or wraps, as Triton's interpreter does) a NotImplementedError, and the function whose
    stub raised it (None when the message is not a stub's)."""
    seen = 0
    while error is not None and seen < 10:
        if isinstance(error, NotImplementedError) or "NotImplementedError" in repr(error):
            stub = _STUB_FUNCTION.search(repr(error))
            return True, stub.group(1) if stub else None
        error, seen = error.__cause__ or error.__context__, seen + 1
    return False, None


def call_learner(part: Part, functions: dict, case: Case) -> Outputs:
    """Run part.run on one case under the call guard (and the memory limit, if the part has one).

    Translates the learner's exceptions into AssertionErrors a learner can act on.
    """
    __tracebackhide__ = True
    limit = part.max_bytes(case) if part.max_bytes else None
    if limit is not None:  # part.run copies the inputs before calling the learner: those copies are allowed
        limit += sum(value.nbytes for value in case.values() if isinstance(value, np.ndarray))
    guard = CallGuard(part.allowed, forbid_matmul=part.grade_id.split("_")[0] in {"ex07", "ex08"})
    guard.inspect_functions(functions)
    started_tracing = False
    if limit is not None and not tracemalloc.is_tracing():
        tracemalloc.start()
        started_tracing = True
    try:
        if limit is not None:
            tracemalloc.reset_peak()
            base = tracemalloc.get_traced_memory()[0]
        with guard:
            outputs = part.run(functions, case)
        if limit is not None:
            peak = tracemalloc.get_traced_memory()[1] - base
    except Exception:
        guard.verdict(part.label)  # a forbidden call that then failed is reported as the forbidden call
        raise_for_learner_error(part)
    finally:
        if started_tracing:
            tracemalloc.stop()
    guard.verdict(part.label)
    if limit is not None and peak > limit:
        raise AssertionError(
            f"{part.label}: your code allocated {peak / 1e6:.2f} MB at once on inputs {describe_case(case)}, "
            f"more than the {limit / 1e6:.2f} MB allowed: it materialises the full N x N matrix (or another "
            "array that large). Work one block_q x block_k tile at a time")
    return outputs


def raise_for_learner_error(part: Part) -> NoReturn:
    """Turn the exception being handled (raised by the learner's code) into an AssertionError to act on."""
    __tracebackhide__ = True
    from .. import iomodel  # light: NumPy only

    error = sys.exc_info()[1]
    if isinstance(error, AssertionError):
        raise error
    if isinstance(error, iomodel.SramOverflowError):
        raise AssertionError(lay_out(
            part.label, f"SRAM budget exceeded: {error}. Diagnosis: keep only one block of Q, K, V and one "
            "block_q x block_k score tile in SRAM at a time, and free blocks when you are done with them; "
            "never build the full N x N matrix")) from None
    not_implemented, stub = _not_implemented(error)
    if not_implemented:
        where = (f"the function `{stub}`" if stub else
                 f"the function that raised NotImplementedError ({', '.join(part.functions)} or one it calls)")
        raise NotImplementedYet(
            f"{part.label} is not implemented yet.\n  Fill in the code under `# TODO` in {where}.\n"
            "  Then run its cell, the cells after it, and this check again.") from None
    raise AssertionError(f"{part.label}: your function raised {type(error).__name__}: {error}") from error


def make_rng(seed) -> np.random.Generator:
    """The random generator of a check: the given seed, else FLASHCOURSE_SEED if set, else fresh entropy."""
    if seed is None and os.environ.get("FLASHCOURSE_SEED"):
        seed = int(os.environ["FLASHCOURSE_SEED"])
    return np.random.default_rng(seed)


_keep_going = False  # set by keep_going(): failing checks print instead of raising (self-study only)


def keep_going(on: bool = True) -> None:
    """Self-study: from now on a failing check prints its diagnosis instead of raising, so "Run All" goes on to
    the later parts. Graders score a check cell by whether it raises: hidden tests and the batch grader ignore
    this and still fail."""
    global _keep_going
    _keep_going = bool(on)
    if on:
        print("keep_going: a failing check now prints what is wrong and the notebook goes on "
              "(hidden tests and graders still fail it)")


def run_check(part: Part, functions: dict, *, hidden: bool = False, seed=None) -> None:
    """The instant check of one part: every case, fresh random inputs, stop at the first failure.

    Raises AssertionError (which nbgrader and the batch grader count as a failure) with a message that names
    the case, the first mismatching index, yours vs expected, and a diagnosis; prints one line on success.
    After :func:`keep_going` it prints that message instead of raising.
    """
    __tracebackhide__ = True  # IPython and pytest then show the learner the message, not these frames
    try:
        _run_cases(part, functions, hidden=hidden, seed=seed)
    except AssertionError as error:
        if not _keep_going:
            raise
        print(f"FAILED ({type(error).__name__}): {error}")


def _run_cases(part: Part, functions: dict, *, hidden: bool, seed) -> None:
    __tracebackhide__ = True
    for name, fn in functions.items():
        if not callable(fn):
            raise AssertionError(f"{part.label}: {name} is a {type(fn).__name__}, not a function")
    cases = part.cases(make_rng(seed), hidden)
    for number, case in enumerate(cases, start=1):
        outputs = call_learner(part, functions, case)
        try:
            part.judge(case, outputs)
        except AssertionError as error:
            raise AssertionError(lay_out(part.label, str(error),
                                         f"case {number} of {len(cases)}: {describe_case(case)}")) from None
    which = "hidden tests" if hidden else "checks"
    print(f"{part.label} {part.title}: passed all {len(cases)} {which} ({part.points} points)")


# --------------------------------------------------------------------------------------------- inputs
def randn(rng: np.random.Generator, *shape: int, dtype=np.float64) -> np.ndarray:
    """Standard normal values of a shape and dtype."""
    return rng.standard_normal(shape).astype(dtype)




def qkv_case(rng: np.random.Generator, lead: tuple[int, ...], n_q: int, n_k: int, d: int, *, causal=False,
             scale=None, magnitude: float = 1.0, dtype=np.float64) -> Case:
    """A case of random q (lead..., n_q, d), k and v (lead..., n_k, d); ``magnitude`` scales q and k (a large
    one makes exp of the scores overflow unless the max is subtracted)."""
    return {"q": randn(rng, *lead, n_q, d, dtype=dtype) * dtype(magnitude),
            "k": randn(rng, *lead, n_k, d, dtype=dtype) * dtype(magnitude),
            "v": randn(rng, *lead, n_k, d, dtype=dtype), "causal": causal, "scale": scale}


def copies(case: Case, *names: str) -> list[np.ndarray]:
    """Fresh copies of the named arrays, so a learner's in-place edits cannot change the case."""
    return [np.array(case[name]) for name in names]


def to_tensor(array: np.ndarray):
    """A NumPy array as a torch tensor where the course's kernels run (the GPU if there is one, else the CPU,
    where Triton's interpreter reads it). Imports torch only when a Triton exercise is checked."""
    import torch

    from .. import device

    return torch.from_numpy(np.ascontiguousarray(array)).to("cuda" if device.setup() == "cuda" else "cpu")


class Clock:
    """A drill's clock (exercises 12 and 14): ``start()`` it, and each visible check run through :meth:`run`
    prints the time since. ``starter`` is the name learners call to start it, quoted in the messages."""

    def __init__(self, starter: str, started_message: str):
        self.starter, self.started_message = starter, started_message
        self.started: float | None = None

    def start(self) -> None:
        self.started = time.monotonic()
        print(self.started_message)

    def elapsed(self) -> str:
        """The time since :meth:`start`, as "4 min 07 s" (or a note that the clock was not started)."""
        if self.started is None:
            return f"clock not started (run the cell with grading.{self.starter}())"
        seconds = int(time.monotonic() - self.started)
        return f"{seconds // 60} min {seconds % 60:02d} s since {self.starter}()"

    def run(self, part: Part, functions: dict, hidden: bool, seed) -> None:
        """:func:`run_check`, then the time (not under hidden tests, which ignore the clock)."""
        __tracebackhide__ = True
        try:
            run_check(part, functions, hidden=hidden, seed=seed)
        finally:
            if not hidden:
                print(f"time: {self.elapsed()}")


def pack_cases(cases: dict[str, list[Case]]) -> tuple[dict, dict[str, np.ndarray]]:
    """Split cases into JSON-able scalars and named arrays (for np.savez): (spec, arrays). Here, not in the batch
    grader, so that a hidden test's judge and a grading worker import no notebook packages (nbformat alone took
    1.5 s a process)."""
    spec: dict = {}
    arrays: dict[str, np.ndarray] = {}
    for grade_id, part_cases in cases.items():
        spec[grade_id] = []
        for number, case in enumerate(part_cases):
            entry = {"arrays": [], "scalars": {}}
            for name, value in case.items():
                if isinstance(value, np.ndarray):
                    arrays[f"{grade_id}/{number}/{name}"] = value
                    entry["arrays"].append(name)
                else:
                    entry["scalars"][name] = value.item() if isinstance(value, np.generic) else value
            spec[grade_id].append(entry)
    return spec, arrays


def unpack_cases(spec: dict, arrays: dict[str, np.ndarray]) -> dict[str, list[Case]]:
    """The inverse of :func:`pack_cases`."""
    return {grade_id: [{**entry["scalars"], **{name: arrays[f"{grade_id}/{number}/{name}"]
                                               for name in entry["arrays"]}}
                       for number, entry in enumerate(entries)]
            for grade_id, entries in spec.items()}
