"""`python -m flashcourse.grading release --check` (which `make test` runs) tells content from what a save
rewrites: opening an exercise in JupyterLab and saving it (nbgrader's Validate saves too) is not "out of date"."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from flashcourse.grading.__main__ import main as grading_main

ROOT = Path(__file__).resolve().parents[1]
EXERCISE = "ex01_naive_attention.ipynb"
# What JupyterLab writes back on save: the running kernel's spec and its language details.
SAVED_BY_A_KERNEL = {
    "kernelspec": {"display_name": "Python 3 (another kernel)", "language": "python", "name": "python3"},
    "language_info": {"codemirror_mode": {"name": "ipython", "version": 3}, "file_extension": ".py",
                      "mimetype": "text/x-python", "name": "python", "nbconvert_exporter": "python",
                      "pygments_lexer": "ipython3", "version": "3.12.3"},
}


@pytest.fixture
def course(tmp_path) -> Path:
    """A copy of solutions/ and a fresh exercises/ written from it."""
    shutil.copytree(ROOT / "solutions", tmp_path / "solutions")
    assert grading_main(["release", "--solutions", str(tmp_path / "solutions"),
                         "--exercises", str(tmp_path / "exercises")]) == 0
    return tmp_path


def _check(course: Path) -> int:
    return grading_main(["release", "--check", "--solutions", str(course / "solutions"),
                         "--exercises", str(course / "exercises")])


def _save_as_jupyterlab_does(path: Path, edit=None) -> None:
    notebook = json.loads(path.read_text())
    notebook["metadata"].update(json.loads(json.dumps(SAVED_BY_A_KERNEL)))
    if edit:
        edit(notebook)
    path.write_text(json.dumps(notebook, indent=1, ensure_ascii=False) + "\n")


def test_a_save_that_rewrites_the_kernel_metadata_is_not_out_of_date(course, capsys):
    _save_as_jupyterlab_does(course / "exercises" / EXERCISE)
    assert _check(course) == 0, capsys.readouterr().err


def test_an_edited_cell_is_still_out_of_date(course, capsys):
    def edit(notebook):
        notebook["cells"][0]["source"] = "# edited by hand\n"

    _save_as_jupyterlab_does(course / "exercises" / EXERCISE, edit)
    assert _check(course) == 1
    assert EXERCISE in capsys.readouterr().err


def test_other_metadata_still_counts(course, capsys):
    def edit(notebook):
        notebook["metadata"]["flashcourse"]["exercise"] = "something else"

    _save_as_jupyterlab_does(course / "exercises" / EXERCISE, edit)
    assert _check(course) == 1
    assert EXERCISE in capsys.readouterr().err
