"""nbgrader runs on the solution notebooks as they are: generate_assignment strips them, autograde gives full
marks to a solved submission and none to the stub (ex01, NumPy, and ex09, with a Triton kernel)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("nbgrader")
ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ["ex01_naive_attention", "ex09_decode_combine"]
POINTS = {"ex01_naive_attention": 8, "ex09_decode_combine": 8}


def _nbgrader(course: Path, *args: str) -> None:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    done = subprocess.run([sys.executable, "-m", "nbgrader", *args, "--force"], cwd=course, env=env,
                          capture_output=True, text=True, timeout=600)  # nbgrader runs `alembic` from PATH
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


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
        released = (course / "release" / "ps1" / f"{name}.ipynb").read_text()
        assert "BEGIN SOLUTION" not in released and "hidden=True" not in released
        for student, folder in (("solved", source), ("stub", course / "release" / "ps1")):
            target = course / "submitted" / student / "ps1"
            target.mkdir(parents=True, exist_ok=True)
            shutil.copy(folder / f"{name}.ipynb", target)
    _nbgrader(course, "autograde", "ps1")
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gradebook:
        for name in NOTEBOOKS:
            solved = gradebook.find_submission_notebook(name, "ps1", "solved")
            stub = gradebook.find_submission_notebook(name, "ps1", "stub")
            assert (solved.score, solved.max_score) == (POINTS[name], POINTS[name])
            assert stub.score == 0
