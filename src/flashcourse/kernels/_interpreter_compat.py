"""Triton 3.6's interpreter with NumPy 2.4 or newer: a loop whose bound is a tensor fails.

The interpreter turns a scalar tensor into a Python int with ``int(array)``; its scalars are one-element 1-d
arrays, which NumPy 2.4 no longer converts ("only 0-dimensional arrays can be converted to Python scalars").
Triton 3.9 squeezes the array first. :func:`apply` does the same on an interpreter that does not, so the kernels'
``for start_n in range(lo, hi, BLOCK_N)`` loops run on CPU under the GPU machine's Triton too (lesson 12's ranks).
"""

from __future__ import annotations

import inspect


def apply() -> None:
    """Give the interpreter's tensors an ``__index__`` that squeezes, where the installed Triton's does not."""
    from triton.runtime import interpreter

    original = interpreter._patch_lang_tensor
    if getattr(original, "squeezes_scalars", False) or "squeeze" in inspect.getsource(original):
        return

    def patch_lang_tensor(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.squeeze()))  # restored with the rest

    patch_lang_tensor.squeezes_scalars = True
    interpreter._patch_lang_tensor = patch_lang_tensor
