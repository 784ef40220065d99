"""nbgrader runs on the solution notebooks as they are: generate_assignment strips them, autograde gives full
marks to a solved submission and none to the stub (ex01, NumPy, and ex09, with a Triton kernel), nor to a stub
whose first cell replaces the checks, numpy.testing, the tolerances and the parts' judges, nor to one that replaces
every function of every flashcourse.grading module (the hidden tests load a fresh copy of the grading package and
are judged by a fresh Python)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from grading_attacks import BLANKET_PATCH

pytest.importorskip("nbgrader")
ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ["ex01_naive_attention", "ex09_decode_combine"]
POINTS = {"ex01_naive_attention": 8, "ex09_decode_combine": 8}

# Everything a check in the student's kernel relies on, replaced by something that passes anything.
PATCH_THE_CHECKS = """
import importlib, numpy.testing
import flashcourse.grading as grading, flashcourse.tolerance as tolerance
from flashcourse.grading import _core

def quiet(*args, **kwargs):
    print("passed all hidden tests")

module = importlib.import_module(f"flashcourse.grading.{grading.EXERCISES[EXERCISE]}")
for name in dir(module):
    if name.startswith("check_"):
        setattr(grading, name, quiet)
        setattr(module, name, quiet)
for part in module.PARTS:
    object.__setattr__(part, "judge", lambda case, outputs: None)
_core.run_check = _core.compare = quiet
numpy.testing.assert_allclose = numpy.testing.assert_array_equal = tolerance.assert_close = quiet
tolerance.tolerance_for = lambda dtype: (1e300, 1e300)
"""


def _patched(released: Path, name: str, patch: str = PATCH_THE_CHECKS) -> str:
    """The released notebook with a first code cell that replaces the checks (before anything imports them)."""
    import nbformat

    nb = nbformat.read(released, as_version=4)
    nb.cells.insert(0, nbformat.v4.new_code_cell(f"EXERCISE = {name!r}\n" + patch))
    return nbformat.writes(nb)


def _nbgrader(course: Path, *args: str) -> str:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    done = subprocess.run([sys.executable, "-m", "nbgrader", *args, "--force"], cwd=course, env=env,
                          capture_output=True, text=True, timeout=600)  # nbgrader runs `alembic` from PATH
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout + done.stderr


@pytest.mark.slow
def test_generate_assignment_and_autograde(tmp_path):
    from nbgrader.api import Gradebook

    course = tmp_path / "course"
    source = course / "source" / "ps1"
    source.mkdir(parents=True)
    (course / "nbgrader_config.py").write_text('c = get_config()\nc.CourseDirectory.course_id = "flashcourse"\n')
    for name in NOTEBOOKS:
        shutil.copy(ROOT / "solutions" / f"{name}.ipynb", source)
    _nbgrader(course, "generate_assignment", "ps1")
    for name in NOTEBOOKS:
        for student, patch in (("patcher", PATCH_THE_CHECKS), ("blanket", BLANKET_PATCH)):
            target = course / "submitted" / student / "ps1"
            target.mkdir(parents=True, exist_ok=True)
            (target / f"{name}.ipynb").write_text(_patched(course / "release" / "ps1" / f"{name}.ipynb", name, patch))
        released = (course / "release" / "ps1" / f"{name}.ipynb").read_text()
        assert "BEGIN SOLUTION" not in released and "hidden=True" not in released
        for student, folder in (("solved", source), ("stub", course / "release" / "ps1")):
            target = course / "submitted" / student / "ps1"
            target.mkdir(parents=True, exist_ok=True)
            shutil.copy(folder / f"{name}.ipynb", target)
    log = _nbgrader(course, "autograde", "ps1")
    # nbgrader puts the hidden tests back into each check cell, and says so as a changed checksum.
    changed = set(re.findall(r"Attribute 'checksum' for cell (\w+) has changed", log))
    assert changed and changed <= {f"{name[:4]}_{letter}" for name in NOTEBOOKS for letter in "abcd"}, log[-2000:]
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gradebook:
        for name in NOTEBOOKS:
            solved = gradebook.find_submission_notebook(name, "ps1", "solved")
            stub = gradebook.find_submission_notebook(name, "ps1", "stub")
            assert (solved.score, solved.max_score) == (POINTS[name], POINTS[name])
            assert stub.score == 0
            for student in ("patcher", "blanket"):
                patched = gradebook.find_submission_notebook(name, "ps1", student)
                assert patched.score == 0, f"{name}: {student}'s patched grading scored {patched.score}"
