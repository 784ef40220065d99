"""Importing the kernels prints nothing: without a GPU the interpreter is chosen and said once, as a warning."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
from flashcourse import device  # noqa: E402

if not device.triton_available():
    pytest.skip("Triton is not installed here", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[1]

IMPORT = """
import os, warnings
from flashcourse import device
warnings.simplefilter("always")
with warnings.catch_warnings(record=True) as caught:
    import flashcourse.kernels
    device.setup()
notices = [str(w.message) for w in caught if issubclass(w.category, device.InterpreterNotice)]
import sys
print(repr((os.environ.get("TRITON_INTERPRET"), notices)), file=sys.stderr)
"""


def test_importing_the_kernels_prints_nothing_and_says_the_interpreter_once_as_a_warning():
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    env.pop("TRITON_INTERPRET", None)
    done = subprocess.run([sys.executable, "-c", IMPORT], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout == "", f"importing flashcourse.kernels printed {done.stdout!r}"
    interpret, notices = eval(done.stderr.strip().splitlines()[-1])  # noqa: S307 - our own repr
    if device.has_gpu():
        assert (interpret, notices) == (None, [])
    else:  # the interpreter is on for the process, and the learner is told once, where warnings go
        assert interpret == "1"
        assert len(notices) == 1 and "CPU interpreter" in notices[0], notices
