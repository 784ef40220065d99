"""The batch grader: scores come from the arrays the submission's functions return, judged in the grader's
process; hostile or broken submissions cost only themselves (one test per attack)."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import subprocess
import sys
from pathlib import Path

import nbformat
import numpy as np
import pytest

from flashcourse.grading import batch
from flashcourse.grading.batch import PartResult, SubmissionResult

ROOT = Path(__file__).resolve().parents[1]
EXERCISE = "ex01_naive_attention"
FULL = 8  # points of exercise 01


def _notebook(kind: str, *, first: str | None = None, extra: str | None = None) -> nbformat.NotebookNode:
    """The solution ("solved") or the released stub ("stub"), with an optional cell put first or appended."""
    folder = "solutions" if kind == "solved" else "exercises"
    nb = nbformat.read(ROOT / folder / f"{EXERCISE}.ipynb", as_version=4)
    if first:
        nb.cells.insert(0, nbformat.v4.new_code_cell(first))
    if extra:
        nb.cells.append(nbformat.v4.new_code_cell(extra))
    return nb


def _submit(tmp_path: Path, student: str, nb) -> Path:
    path = tmp_path / "submitted" / student / f"{EXERCISE}.ipynb"
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(nb, str):
        path.write_text(nb)
    else:
        nbformat.write(nb, path)
    return path


def _grade(tmp_path: Path, *paths: Path, timeout: float = 60, seed: int = 3, jobs: int = 1) -> dict:
    out = tmp_path / "out"
    log = tmp_path / "progress.txt"
    with open(log, "w") as progress:
        batch.grade_all(list(paths), out, seed=seed, timeout=timeout, solutions=ROOT / "solutions",
                        progress=progress, jobs=jobs)
    grades = json.loads((out / "grades.json").read_text())
    return {s["student"]: s for s in grades["submissions"]} | {"_out": out, "_progress": log.read_text()}


def test_solved_gets_full_marks_and_a_stub_none_with_tables_feedback_and_progress(tmp_path):
    graded = _grade(tmp_path, _submit(tmp_path, "alice", _notebook("solved")),
                    _submit(tmp_path, "bob", _notebook("stub")))
    assert graded["alice"]["points"] == FULL and graded["alice"]["status"] == "graded"
    assert {k: v["points"] for k, v in graded["alice"]["parts"].items()} == {"ex01_a": 2, "ex01_b": 2, "ex01_c": 4}
    assert graded["bob"]["points"] == 0
    assert all("not implemented yet" in p["feedback"] for p in graded["bob"]["parts"].values())
    out = graded["_out"]
    rows = (out / "grades.csv").read_text().splitlines()
    assert rows[0] == "student,exercise,file,status,points,max_points,ex01_a,ex01_b,ex01_c,flags"
    assert rows[1].startswith("alice,ex01_naive_attention,") and rows[1].endswith(",8,8,2,2,4,")
    assert rows[2].startswith("bob,") and rows[2].endswith(",0,8,0,0,0,")
    assert "not implemented yet" in (out / "feedback" / "bob__ex01_naive_attention.md").read_text()
    assert "[2/2]" in graded["_progress"]
    assert graded["alice"]["flags"] == [] and graded["bob"]["flags"] == []  # honest work raises no flag
    book = list(csv.DictReader(io.StringIO((out / "gradebook.csv").read_text())))
    assert [(row["student"], row["ex01_c"], row["ex01_naive_attention"], row["total"]) for row in book] == \
        [("alice", "4", "8", "8"), ("bob", "0", "0", "0")]


def test_graded_inputs_come_from_the_seed():
    first, again, other = (batch.graded_cases(EXERCISE, seed) for seed in (5, 5, 6))
    q = [cases["ex01_c"][0]["q"] for cases in (first, again, other)]
    assert np.array_equal(q[0], q[1]) and not np.array_equal(q[0], q[2])


def test_raising_at_the_first_cell_does_not_stop_the_grader_or_the_notebook(tmp_path):
    graded = _grade(tmp_path, _submit(tmp_path, "carol", _notebook("stub", first="raise RuntimeError('boom')")),
                    _submit(tmp_path, "dave", _notebook("solved", first="raise RuntimeError('boom')")))
    assert graded["carol"]["points"] == 0
    assert any("RuntimeError: boom" in note for note in graded["carol"]["notes"])
    assert graded["dave"]["points"] == FULL  # the later cells still ran, as under nbgrader


# A spinning submission lowers its own priority (nice 19): on two cores its loop would otherwise take the CPU that
# the well-behaved submission graded beside it needs to import torch within the same time limit.
def test_an_endless_loop_is_stopped_and_costs_only_its_own_parts(tmp_path):
    endless_cell = _notebook("solved", first="import os\nos.nice(19)\nwhile True:\n    pass")
    endless_function = _notebook("solved", extra="import os\nos.nice(19)\n\n\n"
                                                 "def naive_attention(q, k, v, causal=False, scale=None):\n"
                                                 "    while True:\n        pass")
    stubborn = _notebook("solved", first="import time\nwhile True:\n    try:\n        time.sleep(0.05)\n"
                                         "    except BaseException:\n        pass")
    graded = _grade(tmp_path, _submit(tmp_path, "erin", endless_cell), _submit(tmp_path, "frank", endless_function),
                    _submit(tmp_path, "grace", stubborn), _submit(tmp_path, "heidi", _notebook("solved")),
                    timeout=20, jobs=4)  # 20 s: the import of torch and the course under 4 jobs on 2 cores
    assert graded["erin"]["points"] == 0
    assert any("cell 1 timed out after" in n and "the cells after it did not run" in n for n in graded["erin"]["notes"])
    assert "timed out after" in graded["erin"]["parts"]["ex01_a"]["feedback"]
    assert graded["frank"]["parts"]["ex01_c"]["points"] == 0 and graded["frank"]["points"] == 4
    assert "time limit" in graded["frank"]["parts"]["ex01_c"]["feedback"]
    assert graded["grace"]["points"] == 0 and graded["grace"]["status"].startswith("timed out")
    assert graded["heidi"]["points"] == FULL


def test_printing_megabytes_neither_crashes_nor_floods_the_grader(tmp_path):
    loud = _notebook("solved", first="for _ in range(40):\n    print('x' * 1_000_000)")
    graded = _grade(tmp_path, _submit(tmp_path, "ivan", loud))
    assert graded["ivan"]["points"] == FULL
    assert len((graded["_out"] / "grades.json").read_text()) < 20_000


def test_a_file_that_is_not_json_gets_zero_and_the_next_one_is_graded(tmp_path):
    graded = _grade(tmp_path, _submit(tmp_path, "judy", '{"cells": [ this is not json'),
                    _submit(tmp_path, "ken", _notebook("solved")))
    assert graded["judy"]["points"] == 0 and graded["judy"]["status"].startswith("not a valid notebook")
    assert graded["ken"]["points"] == FULL


MONKEYPATCH = """
import numpy as np
import numpy.testing
import flashcourse.grading as grading
import flashcourse.reference as reference
from flashcourse.grading import _core, ex01

def naive_attention(q, k, v, causal=False, scale=None):
    return np.zeros(q.shape[:-1] + v.shape[-1:])

def quiet(*args, **kwargs):
    print("passed all hidden tests")

for name in ("check_attention_scores", "check_apply_causal_mask", "check_naive_attention", "run_check"):
    setattr(grading, name, quiet)
    setattr(ex01, name, quiet)
_core.run_check = _core.compare = quiet
numpy.testing.assert_allclose = numpy.testing.assert_array_equal = quiet
reference.attention = naive_attention
for part in ex01.PARTS:
    object.__setattr__(part, "judge", lambda case, out: None)
"""


def test_monkeypatching_checks_numpy_testing_or_the_reference_gains_nothing(tmp_path):
    graded = _grade(tmp_path, _submit(tmp_path, "leo", _notebook("stub", extra=MONKEYPATCH)))
    assert graded["leo"]["points"] == 0
    assert "differs" in graded["leo"]["parts"]["ex01_c"]["feedback"]


def test_a_tampering_submission_is_flagged_in_the_table_and_the_feedback(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    nb = _notebook("stub", extra=MONKEYPATCH + (
        "import pathlib\n"
        f"pathlib.Path({str(elsewhere)!r}).mkdir()\n"
        f"(pathlib.Path({str(elsewhere)!r}) / 'grades.csv').write_text('student,points\\nzoe,8\\n')\n"))
    checks = [cell for cell in nb.cells if cell.metadata.get("nbgrader", {}).get("grade")]
    checks[0].source = "print('ex01 (a) scores: passed all 5 checks (2 points)')"  # an edited check cell
    checks[1].metadata["nbgrader"]["grade_id"] = "ex01_b_mine"  # a renamed grade id
    graded = _grade(tmp_path, _submit(tmp_path, "zoe", nb))
    zoe = graded["zoe"]
    assert zoe["points"] == 0
    flags = "\n".join(zoe["flags"])
    assert "check cell ex01_a edited" in flags
    assert "check cell ex01_b missing" in flags and "'ex01_b_mine' is not one of the exercise's" in flags
    assert "grading functions replaced:" in flags and "grading.ex01.check_attention_scores" in flags
    assert f"files written outside the working copy: {elsewhere}" in flags
    row = next(csv.DictReader(io.StringIO((graded["_out"] / "grades.csv").read_text())))
    assert "check cell ex01_a edited" in row["flags"]
    assert "## What the grader noticed" in (graded["_out"] / "feedback" / "zoe__ex01_naive_attention.md").read_text()


def test_restored_check_cells_run_the_courses_checks_not_the_replacements(tmp_path):
    # The stub replaces every check by one that prints a pass; the restored check cells must still fail it.
    graded = _grade(tmp_path, _submit(tmp_path, "quinn", _notebook("stub", first=MONKEYPATCH)))
    check_cells = [n for n in graded["quinn"]["notes"] if n.startswith(("cell 6:", "cell 9:", "cell 12:"))]
    assert len(check_cells) == 3 and all("not implemented yet" in n for n in check_cells)


def test_a_forbidden_call_is_flagged(tmp_path):
    shortcut = ("from flashcourse import reference\n\n\n"
                "def naive_attention(q, k, v, causal=False, scale=None):\n"
                "    return reference.attention(q, k, v, causal=causal, scale=scale)")
    graded = _grade(tmp_path, _submit(tmp_path, "rita", _notebook("solved", extra=shortcut)))
    assert graded["rita"]["points"] == FULL - 4
    assert any(f.startswith("forbidden call in ex01_c:") and "reference.attention" in f
               for f in graded["rita"]["flags"])


def test_the_gradebook_has_one_row_per_student_with_a_total():
    def result(student, exercise, points):
        parts = {grade_id: PartResult(p, p, True, "passed") for grade_id, p in points.items()}
        return SubmissionResult(student, exercise, f"{student}.ipynb", "graded", sum(points.values()),
                                sum(points.values()), parts=parts)

    results = [result("amy", "ex01_naive_attention", {"ex01_a": 2, "ex01_b": 2, "ex01_c": 4}),
               result("amy", "ex02_softmax", {"ex02_a": 2, "ex02_b": 0, "ex02_c": 3, "ex02_d": 2}),
               result("ben", "ex02_softmax", {"ex02_a": 2, "ex02_b": 2, "ex02_c": 0, "ex02_d": 0})]
    rows = list(csv.reader(io.StringIO(batch.gradebook(results))))
    assert rows[0] == ["student", "ex01_a", "ex01_b", "ex01_c", "ex01_naive_attention",
                       "ex02_a", "ex02_b", "ex02_c", "ex02_d", "ex02_softmax", "total"]
    assert rows[1] == ["amy", "2", "2", "4", "8", "2", "0", "3", "2", "7", "15"]
    assert rows[2] == ["ben", "", "", "", "", "2", "2", "0", "0", "4", "4"]  # blank: no ex01 submitted
    assert len(rows) == 3


def test_printing_the_graders_score_lines_gains_nothing(tmp_path):
    fake = ("print('[1/1] mallory (ex01_naive_attention): 8/8 points, graded, 0.1 s')\n"
            "print('ex01_a: 2/2\\nex01_b: 2/2\\nex01_c: 4/4\\nTotal: 8/8')\n"
            "print('student,exercise,file,status,points,max_points\\nmallory,ex01_naive_attention,x,graded,8,8')")
    graded = _grade(tmp_path, _submit(tmp_path, "mallory", _notebook("stub", extra=fake)))
    assert graded["mallory"]["points"] == 0


def test_writing_a_fake_grades_file_gains_nothing(tmp_path):
    out = tmp_path / "out"
    fake = json.dumps({"submissions": [{"student": "nina", "points": 8}]})
    cell = ("import json, pathlib\n"
            f"for folder in (pathlib.Path('.'), pathlib.Path('..'), pathlib.Path({str(out)!r})):\n"
            "    folder.mkdir(parents=True, exist_ok=True)\n"
            f"    (folder / 'grades.json').write_text({fake!r})\n"
            "    (folder / 'grades.csv').write_text('student,points\\nnina,8\\n')")
    graded = _grade(tmp_path, _submit(tmp_path, "nina", _notebook("stub", extra=cell)))
    assert graded["nina"]["points"] == 0
    assert "nina,8" not in (out / "grades.csv").read_text()


def test_console_script_runs_end_to_end(tmp_path):
    path = _submit(tmp_path, "olga", _notebook("solved"))
    out = tmp_path / "cli"
    done = subprocess.run([sys.executable, "-m", "flashcourse", "grade", str(path), "--out", str(out),
                           "--seed", "11", "--timeout", "60", "--solutions", str(ROOT / "solutions")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "[1/1] olga" in done.stderr
    assert json.loads((out / "grades.json").read_text())["seed"] == 11


@pytest.mark.parametrize(("path", "alone", "student", "exercise"), [
    ("submitted/alice/ps1/ex01_naive_attention.ipynb", False, "alice", "ex01_naive_attention"),
    ("inbox/bob_ex03.ipynb", True, "bob", "ex03_tiled_forward"),
    ("inbox/ex05_backward-carol.ipynb", False, "carol", "ex05_backward"),
    ("collide/gina/homework_ps1.ipynb", True, "gina", None),
    ("inbox/dave.ipynb", False, "dave", None),
])
def test_student_and_exercise_from_the_file_name(path, alone, student, exercise):
    assert batch.student_of(Path(path), alone=alone) == student
    assert batch.exercise_of(Path(path), None, None) == exercise


# A cell that detaches a process (a new session), which finds the grader's --out folder in /proc, waits for the
# grader to exit and then rewrites the grades and its feedback.
OUTLIVE_THE_GRADER = r'''
import os, subprocess, sys
from pathlib import Path

def grader_and_out():
    pid = os.getppid()
    while pid > 1:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        if b"--out" in args:
            out = Path(os.readlink(f"/proc/{pid}/cwd")) / args[args.index(b"--out") + 1].decode()
            return pid, out
        pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    raise RuntimeError("no grader found")

grader, out = grader_and_out()
tamper = f"""
import os, time
from pathlib import Path
while Path("/proc/{grader}").exists():
    time.sleep(0.05)
out = Path({str(out)!r})
(out / "grades.csv").write_text("student,points\\nmallory,8\\n")
for feedback in (out / "feedback").glob("*.md"):
    feedback.write_text("Score: 8 / 8")
"""
detached = subprocess.Popen([sys.executable, "-c", tamper], start_new_session=True, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
(out.parent / "detached.pid").write_text(str(detached.pid))
'''


def test_a_process_the_submission_detaches_is_killed_before_its_grade_is_written(tmp_path):
    path = _submit(tmp_path, "mallory", _notebook("stub", extra=OUTLIVE_THE_GRADER))
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-m", "flashcourse.cli", "grade", str(path), "--out", str(out),
                           "--seed", "1", "--timeout", "60", "--solutions", str(ROOT / "solutions")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "outlived it and were killed" in done.stderr
    written = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    # The detached process waits for the grader to exit; the grader has, so it is gone for good (its pid, if in
    # use again, runs something else) and nothing can change the files it would have rewritten.
    detached = Path(f"/proc/{(tmp_path / 'detached.pid').read_text()}/cmdline")
    assert not detached.exists() or b"grades.csv" not in detached.read_bytes(), "the detached process is alive"
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == written
    assert "mallory,ex01_naive_attention," in (out / "grades.csv").read_text()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["sha256"] == {str(p.relative_to(out)): hashlib.sha256(data).hexdigest()
                                 for p, data in written.items() if p.name != "summary.json"}
    assert hashlib.sha256(written[out / "summary.json"]).hexdigest() in done.stderr


def test_students_with_the_same_file_name_get_their_own_rows_and_feedback(tmp_path):
    gina = tmp_path / "collide" / "gina" / "homework.ipynb"
    hank = tmp_path / "collide" / "hank" / "homework.ipynb"
    for path, kind in ((gina, "solved"), (hank, "stub")):
        path.parent.mkdir(parents=True)
        nbformat.write(_notebook(kind), path)
    out = tmp_path / "out"
    with open(tmp_path / "progress.txt", "w") as progress:
        batch.grade_all([gina, hank], out, seed=2, timeout=60, exercise="ex01", solutions=ROOT / "solutions",
                        progress=progress)
    rows = (out / "grades.csv").read_text().splitlines()
    assert [row.split(",")[0] for row in rows[1:]] == ["gina", "hank"]
    assert rows[1].endswith(",8,8,2,2,4,") and rows[2].endswith(",0,8,0,0,0,")
    feedback = sorted(p.name for p in (out / "feedback").iterdir())
    assert feedback == ["gina__ex01_naive_attention.md", "hank__ex01_naive_attention.md"]


def test_two_files_of_one_student_and_exercise_are_an_error_naming_both(tmp_path):
    first, second = tmp_path / "monday" / "alice_ex01.ipynb", tmp_path / "tuesday" / "alice_ex01.ipynb"
    with pytest.raises(batch.DuplicateSubmissionError, match="monday.*tuesday.*alice"):
        batch.grade_all([first, second], tmp_path / "out", seed=1, progress=io.StringIO())
    assert not (tmp_path / "out").exists()


def test_a_missing_solutions_folder_is_said(tmp_path, monkeypatch):
    path = _submit(tmp_path, "pat", _notebook("solved"))
    monkeypatch.chdir(tmp_path)
    progress = io.StringIO()
    results = batch.grade_all([path], tmp_path / "out", seed=1, timeout=60, progress=progress)
    assert "no solutions/ folder here" in progress.getvalue()
    assert results[0].points == FULL


@pytest.mark.parametrize("options, match", [
    (dict(timeout=-5), "timeout=-5"), (dict(timeout=0), "timeout=0"), (dict(timeout=float("nan")), "timeout=nan"),
    (dict(timeout=float("inf")), "timeout=inf"), (dict(jobs=0), "jobs=0"), (dict(jobs=2.5), "jobs=2.5"),
    (dict(missing=True), "not a file: .*nobody.ipynb"),
])
def test_a_batch_that_would_give_everyone_zero_is_refused_before_grading(tmp_path, options, match):
    """A negative time limit timed every notebook out (0 points each, "timed out after -5 s"); a mistyped path was
    graded as a student with 0 points. Both are the instructor's mistake: refused, nothing written."""
    good = _submit(tmp_path, "lena", _notebook("solved"))
    paths = [good, tmp_path / "nobody.ipynb"] if options.pop("missing", False) else [good]
    out = tmp_path / "out"
    with pytest.raises(batch.NothingGradedError, match=match):
        batch.grade_all(paths, out, seed=1, progress=io.StringIO(), **{"timeout": 60, **options})
    assert not out.exists()


def test_the_command_line_says_nothing_was_graded(tmp_path):
    good = _submit(tmp_path, "mona", _notebook("solved"))
    proc = subprocess.run([sys.executable, "-m", "flashcourse", "grade", str(good), "--out", str(tmp_path / "out"),
                           "--timeout", "-5"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "nothing graded: timeout=-5.0" in proc.stderr, proc.stderr
