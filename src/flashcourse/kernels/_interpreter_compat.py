"""Triton 3.6's interpreter with NumPy 2.4 or newer: a loop whose bound is a tensor fails.

The interpreter turns a scalar tensor into a Python int with ``int(array)``; its scalars are one-element 1-d
arrays, which NumPy 2.4 no longer converts ("only 0-dimensional arrays can be converted to Python scalars").
Triton 3.9 squeezes the array first. :func:`apply` does the same on an interpreter that does not, so the kernels'
``for start_n in range(lo, hi, BLOCK_N)`` loops run on CPU under the GPU machine's Triton too (lesson 12's ranks).

Triton offers no public hook for this: the interpreter gives its tensors their Python methods (``__index__``
among them) in the private ``triton.runtime.interpreter._patch_lang_tensor``, so that function is wrapped. The
wrap is scoped as narrowly as the fault: only in the interpreter (``flashcourse.kernels`` calls :func:`apply` only
when :func:`flashcourse.device.setup` chose the CPU), only with NumPy 2.4 or newer, and only where the installed
Triton's function does not squeeze already; it adds one method and leaves the rest of Triton's to it.
"""

from __future__ import annotations

import inspect


def needed() -> bool:
    """True when this NumPy refuses ``int()`` of a 1-d array and this Triton's interpreter does not squeeze first."""
    import numpy as np
    from triton.runtime import interpreter

    if np.lib.NumpyVersion(np.__version__) < "2.4.0":
        return False
    original = interpreter._patch_lang_tensor
    return not (getattr(original, "squeezes_scalars", False) or "squeeze" in inspect.getsource(original))


def apply() -> None:
    """Give the interpreter's tensors an ``__index__`` that squeezes, where :func:`needed` says so."""
    if not needed():
        return
    from triton.runtime import interpreter

    original = interpreter._patch_lang_tensor

    def patch_lang_tensor(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.squeeze()))  # restored with the rest

    patch_lang_tensor.squeezes_scalars = True
    interpreter._patch_lang_tensor = patch_lang_tensor
