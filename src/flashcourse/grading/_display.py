"""A failing check shows the learner their check cell and the message, not the grader's own frames.

IPython hides frames that set ``__tracebackhide__``, except the last one: the frame that raised, which for a
failing check is always the grader's (``_core.py``, ``run_check``). So in an IPython kernel the traceback of an
AssertionError is cut after the last frame outside ``flashcourse.grading`` before IPython shows it. The
exception is the same and the cell still fails (nbgrader and the batch grader see an error as before).
"""

from __future__ import annotations

from pathlib import Path
from types import TracebackType

_GRADING_DIR = str(Path(__file__).resolve().parent)


def _outside_grading(tb: TracebackType) -> bool:
    return not tb.tb_frame.f_code.co_filename.startswith(_GRADING_DIR)


def trim(tb: TracebackType | None) -> TracebackType | None:
    """The traceback, ended at its last frame outside flashcourse.grading (unchanged if every frame is inside)."""
    last_outside, entry = None, tb
    while entry is not None:
        if _outside_grading(entry):
            last_outside = entry
        entry = entry.tb_next
    if last_outside is not None:
        last_outside.tb_next = None
    return tb


def _show_trimmed(shell, etype, value, tb, tb_offset=None):
    shell.showtraceback((etype, value, trim(tb)), tb_offset=tb_offset)


def hide_grader_frames() -> None:
    """In an IPython kernel, show AssertionErrors without the grader's frames (no-op elsewhere, or when the
    learner has installed their own exception handler)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return
    shell = get_ipython()
    if shell is not None and not shell.custom_exceptions:
        shell.set_custom_exc((AssertionError,), _show_trimmed)
