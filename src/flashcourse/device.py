"""Where the course's kernels run: a CUDA GPU if there is one, else the Triton interpreter on the CPU.

Call :func:`setup` before any Triton kernel is defined (``flashcourse.kernels`` does so on import). Without a GPU it
sets ``TRITON_INTERPRET=1`` in ``os.environ``, for the whole process and the processes it starts: that variable is
the only switch Triton offers, and Triton reads it when a kernel is decorated and when ``triton.language`` is first
imported, so it cannot be scoped to one call or switched on later. Set ``TRITON_INTERPRET`` yourself before importing
the course to choose otherwise.

Nothing goes to stdout: the choice is said once as one plain line on stderr (``InterpreterNotice: flashcourse: no
CUDA GPU found, ...``), and :func:`setup` returns it (``"cuda"`` or ``"cpu"``) for a lesson to show. The line goes
through the warnings filters as an :class:`InterpreterNotice`, so
``warnings.simplefilter("ignore", flashcourse.device.InterpreterNotice)`` silences it; it is not shown the way
``warnings`` shows a warning, which in a notebook names the cell's temporary file and echoes a line of source.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import sys
import warnings

__all__ = ["has_gpu", "InterpreterNotice", "require_triton", "setup", "triton_available", "TritonUnavailableError"]


class TritonUnavailableError(ImportError):
    """Triton is not installed here (it ships Linux wheels only)."""


class InterpreterNotice(UserWarning):
    """The kernels run in Triton's CPU interpreter: exact but slow, so keep sizes small."""


def triton_available() -> bool:
    """True when the `triton` package can be imported."""
    return importlib.util.find_spec("triton") is not None


def require_triton() -> None:
    """Raise a TritonUnavailableError that says what to do when Triton cannot be imported."""
    if triton_available():
        return
    raise TritonUnavailableError(
        f"The Triton lessons need the `triton` package, which ships for Linux only (this is {sys.platform}). "
        "Lessons 00-05 work here as they are. For 06 onwards use a Linux machine, WSL 2 on Windows, or a hosted "
        "notebook (Colab, Binder); there `pip install triton` and, without a GPU, the interpreter runs the "
        "kernels on the CPU."
    )


@functools.cache
def has_gpu() -> bool:
    """True when PyTorch sees a CUDA device."""
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


@functools.cache
def setup() -> str:
    """Choose where kernels run and return ``"cuda"`` or ``"cpu"``; on the CPU, say so once (a warning).

    Without a GPU it sets ``TRITON_INTERPRET=1`` for the process (unless you set it yourself), so Triton kernels run
    in its interpreter on CPU tensors: slow but exact, good for learning and testing at small sizes.
    """
    if has_gpu() and os.environ.get("TRITON_INTERPRET", "0") != "1":
        return "cuda"
    if not has_gpu():
        if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
            # Triton fixes interpreter mode for its language helpers when it is first imported; too late now.
            warnings.warn(
                "flashcourse.device.setup() ran after something imported triton (torch optimizers and "
                "torch.compile do): kernels may fail in the interpreter with 'Cannot call @triton.jit'd outside "
                "of the scope of a kernel'. Restart the kernel and import flashcourse.kernels (or call "
                "flashcourse.device.setup()) first.",
                RuntimeWarning,
                stacklevel=2,
            )
        os.environ.setdefault("TRITON_INTERPRET", "1")
        why = "no CUDA GPU found, so Triton kernels run in its CPU interpreter (slow: keep sizes small)"
    else:
        why = "TRITON_INTERPRET=1 is set, so Triton kernels run in the CPU interpreter on CPU tensors"
    _notice(f"flashcourse: {why}.")
    return "cpu"


def _notice(message: str) -> None:
    """Say ``message`` as one line on stderr, unless the warnings filters ignore InterpreterNotice (or turn it into
    an error, which then raises here)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.warn(message, InterpreterNotice, stacklevel=3)
    for notice in caught:
        print(f"{notice.category.__name__}: {notice.message}", file=sys.stderr, flush=True)
