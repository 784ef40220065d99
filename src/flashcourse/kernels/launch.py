"""Cheap repeat launches: a call whose shapes, strides, dtypes, alignment and options were seen before reuses
that call's compiled kernel and argument list, and skips both Triton's argument binding and our own setup.

Why it pays: ``kernel[grid](**kwargs)`` binds every argument, works out the specialisation key (which integer
arguments are 1 or multiples of 16, which pointers are 16-byte aligned) and looks the compiled kernel up in a
dictionary. With the ~50 arguments of our kernels that, plus building the arguments, is most of the host time
of a small call (``python -m flashcourse.bench overhead``; docs/KERNELS.md, "Launch cost"). Every input of that
specialisation key is a function of what the caller puts in our key, so the kernel found is the one Triton
would have found; only the tensors change from call to call, and they are swapped into the saved list.

Only compiled (CUDA) launches are cached: the interpreter has no compiled kernel to keep.

The one convention of Triton's this relies on (tested with Triton 3.6 on the GPU): the ``CompiledKernel`` that
``kernel[grid](...)`` returns is launched by ``compiled[grid](*args)`` with every kernel parameter in signature
order, constexprs included, which is what its ``src.signature`` (keyed by every parameter's name) and its
``packed_metadata`` show. :func:`cached_launch_supported` checks those attributes on each compiled kernel before
it is remembered; where they are missing (another Triton) nothing is remembered and every call takes the plain
``kernel[grid](...)`` launch: slower on the host, the same results. ``FLASHCOURSE_LAUNCH_CACHE=0`` in the
environment (read when ``flashcourse.kernels`` is imported) turns the cache off the same way.

A prepared launch also skips the Python that ``compiled[grid](*args)`` runs before the driver call, where that is
safe: the function ``compiled[grid]`` returns is made once, not per call, and on the Triton releases whose
``CompiledKernel.__getitem__`` we read (:data:`DIRECT_LAUNCH_TRITON`) a call with no launch hook installed calls
the launcher ``compiled.run`` itself with the arguments that function would pass. What that skips: looking up the
device and the stream through Triton's driver object, a ``LazyDict`` of launch metadata built on every launch,
and two calls of the (empty) hook chains from the C launcher: about 2 us per launch of a CPU's time, measured
against a stand-in of Triton 3.6's runner (the launch itself, Triton's C code, is the same either way). A
profiler that adds a launch hook (Triton's ``knobs.runtime.launch_enter_hook``) gets the full path, so it sees
every launch.
"""

from __future__ import annotations

import inspect
import operator
import os
from collections.abc import Hashable, Sequence

import torch

# Triton releases whose CompiledKernel.__getitem__ was read: its runner calls
#   compiled.run(gx, gy, gz, stream, compiled.function, compiled.packed_metadata, launch_metadata,
#                knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook, *args)
# with the current device's current stream, and the C launcher reads launch_metadata only to pass it to the hooks.
DIRECT_LAUNCH_TRITON = ("3.6", "3.9")


class _Launch:
    """A launch prepared once (:func:`prepare_launch`), repeated on each call's tensors: ``launch(tensors)``,
    ``tensors`` a tuple in the order of the per-call names it was prepared with."""

    __slots__ = ("compiled", "grid", "args", "slots", "_pick", "_tail", "_launch")

    def __init__(self, compiled, grid: tuple[int, ...], args: tuple, slots: tuple[tuple[int, int], ...]):
        self.compiled = compiled  # triton.compiler.CompiledKernel
        self.grid = grid
        self.args = args  # every kernel parameter in signature order, constexprs included, as Triton's launcher wants
        self.slots = slots  # (position in args, index in the call's tensors): swapped per call
        # Where the per-call tensors are the kernel's first parameters (most of ours), the argument list is one
        # C-level pick of them plus the constant rest: half the time of swapping them in one by one.
        order = [index for _, index in sorted(slots)]
        prefix = len(order) > 1 and sorted(position for position, _ in slots) == list(range(len(order)))
        self._pick = operator.itemgetter(*order) if prefix else None
        self._tail = args[len(order):] if prefix else ()
        runner = compiled[grid]  # depends on the grid only, so made once rather than on every call
        self._launch = _direct_launcher(compiled, grid, runner) or (lambda args: runner(*args))

    def __call__(self, tensors) -> None:
        if self._pick is not None:
            self._launch(self._pick(tensors) + self._tail)
            return
        args = list(self.args)
        for position, index in self.slots:
            args[position] = tensors[index]
        self._launch(args)


def _direct_launcher(compiled, grid: tuple[int, ...], runner):
    """A function of the argument list that launches ``compiled`` on ``grid`` as ``runner(*args)`` does, but calls
    its launcher directly when no launch hook is installed (with one, it calls ``runner``); None where this
    Triton's runner was not read (:data:`DIRECT_LAUNCH_TRITON`) or ``compiled`` lacks what the call needs."""
    import triton

    if ".".join(triton.__version__.split(".")[:2]) not in DIRECT_LAUNCH_TRITON:
        return None
    from triton import knobs
    from triton.runtime import driver

    run, function, metadata = (getattr(compiled, name, None) for name in ("run", "function", "packed_metadata"))
    runtime = knobs.runtime
    if not callable(run) or function is None or metadata is None or not all(
            isinstance(getattr(getattr(runtime, hook, None), "calls", None), list)
            for hook in ("launch_enter_hook", "launch_exit_hook")):
        return None
    try:  # the functions the runner asks through the driver proxy on every launch, asked for once
        current_device, current_stream = driver.active.get_current_device, driver.active.get_current_stream
    except (AttributeError, RuntimeError):  # no active driver
        return None
    grid_x, grid_y, grid_z = grid

    def launch(args) -> None:
        try:  # read on every launch: a profiler may add a hook (or replace a chain) at any time
            hooked = runtime.launch_enter_hook.calls or runtime.launch_exit_hook.calls
        except AttributeError:  # not a hook chain any more
            hooked = True
        if hooked:
            runner(*args)
        else:  # what runner(*args) passes, with None for the launch metadata and the hooks, which only they read
            run(grid_x, grid_y, grid_z, current_stream(current_device()), function, metadata, None, None, None,
                *args)

    return launch


class LaunchCache:
    """Launches remembered by key; the oldest is dropped past ``capacity`` (a key holds one shape)."""

    def __init__(self, capacity: int = 256, *, enabled: bool | None = None):
        self.capacity = capacity
        # None: on unless FLASHCOURSE_LAUNCH_CACHE=0; off, every call takes the plain kernel[grid](...) launch
        self.enabled = os.environ.get("FLASHCOURSE_LAUNCH_CACHE", "1") != "0" if enabled is None else enabled
        self._launches: dict[Hashable, _Launch] = {}

    def __len__(self) -> int:
        return len(self._launches)

    def clear(self) -> None:
        self._launches.clear()

    def run(self, key: Hashable | None, tensors: Sequence[torch.Tensor]) -> bool:
        """Launch the remembered call for ``key`` on this call's ``tensors``; False when there is none."""
        launch = self._launches.get(key) if key is not None else None
        if launch is None:
            return False
        launch(tensors)
        return True

    def get(self, key: Hashable | None) -> _Launch | None:
        """The remembered launch for ``key`` (a plan keeps it and launches it without a key), or None."""
        return self._launches.get(key) if key is not None else None

    def remember(self, key: Hashable | None, kernel, compiled, grid, kwargs: dict, names: Sequence[str]) -> None:
        """Keep the launch ``kernel[grid](**kwargs)`` that returned ``compiled`` (see :meth:`prepare`)."""
        if key is None or not self.enabled:
            return
        launch = prepare_launch(kernel, compiled, grid, kwargs, names)
        if launch is None:
            return
        if len(self._launches) >= self.capacity:
            del self._launches[next(iter(self._launches))]
        self._launches[key] = launch


def prepare_launch(kernel, compiled, grid, kwargs: dict, names: Sequence[str]) -> _Launch | None:
    """The launch ``kernel[grid](**kwargs)`` that returned ``compiled``, to repeat on other tensors: ``names`` are
    the arguments that change from call to call, in the order the launch gets their tensors. Any other tensor
    argument must be one of those same tensors standing in for an absent one (a pointer the kernel never reads);
    a tensor of its own would pin a stale pointer, and is refused. None where the compiled kernel does not show
    the launcher convention this relies on (the interpreter's None, another Triton)."""
    params = inspect.signature(kernel.fn).parameters
    if not cached_launch_supported(compiled, params):
        return None
    args, slots = [], []
    for position, (name, param) in enumerate(params.items()):
        value = kwargs[name] if name in kwargs else param.default
        if name in names:
            slots.append((position, names.index(name)))
        elif isinstance(value, torch.Tensor):
            index = next((i for i, n in enumerate(names) if kwargs.get(n) is value), None)
            if index is None:
                raise ValueError(f"argument {name} is a tensor that is not among the per-call tensors: "
                                 "a cached launch would reuse a stale pointer")
            slots.append((position, index))
        args.append(None if slots and slots[-1][0] == position else value)  # keep no tensor alive
    grid = tuple(grid) + (1,) * (3 - len(grid))  # a compiled kernel's launcher takes all three grid dims
    return _Launch(compiled, grid, tuple(args), tuple(slots))


def cached_launch_supported(compiled, params) -> bool:
    """Whether ``compiled`` (what ``kernel[grid](...)`` returned) takes the launch :class:`_Launch` makes:
    ``compiled[grid](*args)``, args being every parameter of ``params`` in order, constexprs included. Judged by
    the attributes that convention uses, not by Triton's version: a ``packed_metadata`` (a compiled kernel, not
    the interpreter's None), indexing by grid, and a ``src.signature`` naming exactly those parameters in that
    order (a launcher that takes only the non-constexpr arguments would come with a shorter signature)."""
    if compiled is None or not hasattr(compiled, "packed_metadata"):
        return False
    if not callable(getattr(type(compiled), "__getitem__", None)):
        return False
    signature = getattr(getattr(compiled, "src", None), "signature", None)
    return isinstance(signature, dict) and list(signature) == list(params)


def layout_key(*tensors: torch.Tensor) -> tuple:
    """What Triton specialises a kernel on, per tensor: shape, strides, dtype, device and 16-byte alignment."""
    return tuple((t.shape, t.stride(), t.dtype, t.device, t.data_ptr() % 16 == 0) for t in tensors)
