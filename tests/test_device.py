"""Importing the kernels prints nothing to stdout: without a GPU the interpreter is chosen and said once, in one
plain line on stderr, which the warnings filters can silence."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from child_env import child_pythonpath

pytest.importorskip("torch")
from flashcourse import device  # noqa: E402

if not device.triton_available():
    pytest.skip("Triton is not installed here", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[1]

# As a notebook runs it: a cell in IPython's shell, whose code lives in a temporary file that warnings would name.
IMPORT = """
import os, sys
from IPython.core.interactiveshell import InteractiveShell
shell = InteractiveShell.instance()
shell.run_cell("import flashcourse.kernels")
print("TRITON_INTERPRET=" + str(os.environ.get("TRITON_INTERPRET")), file=sys.stderr)
"""


def _run(code: str, **env_changes) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=child_pythonpath(), **env_changes)
    env.pop("TRITON_INTERPRET", None)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)


def test_importing_the_kernels_prints_nothing_and_says_the_interpreter_once_in_one_plain_line():
    done = _run(IMPORT)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout == "", f"importing flashcourse.kernels printed {done.stdout!r}"
    *said, interpret = done.stderr.strip().splitlines()
    if device.has_gpu():
        assert (said, interpret) == ([], "TRITON_INTERPRET=None")
    else:  # the interpreter is on for the process, and the learner is told once, with no file or source line
        assert interpret == "TRITON_INTERPRET=1"
        assert len(said) == 1 and said[0].startswith("InterpreterNotice: flashcourse: no CUDA GPU found"), said
        assert "/" not in said[0] and ".py" not in said[0], said


def test_the_notice_is_silenced_by_the_warnings_filter():
    done = _run("import warnings\nfrom flashcourse import device\n"
                "warnings.simplefilter('ignore', device.InterpreterNotice)\nprint(device.setup())")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "InterpreterNotice" not in done.stderr
