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
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class _Launch:
    compiled: object  # triton.compiler.CompiledKernel
    grid: tuple[int, ...]
    args: tuple  # every kernel parameter in signature order, constexprs included, as Triton's launcher wants
    slots: tuple[tuple[int, int], ...]  # (position in args, index in the call's tensors): swapped per call

    def __call__(self, tensors: Sequence[torch.Tensor]) -> None:
        args = list(self.args)
        for position, index in self.slots:
            args[position] = tensors[index]
        self.compiled[self.grid](*args)  # CompiledKernel[grid] runs Triton's launch hooks (the profiler's) too


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
