"""The batch grader: ``flashcourse grade SUBMISSION.ipynb... --out DIR [--seed S] [--timeout SECONDS]``.

For each submission, in its own process on a copy in a temporary folder, with a time limit: run the notebook's
code cells (its check cells replaced by the solution's, so the hidden tests are back), then call the learner's
functions on graded inputs drawn from the instructor's seed and save the arrays they return. This process then
judges those arrays against the float64 reference itself: nothing the submission prints or writes is read as a
score. One bad submission (invalid JSON, a crash, an endless loop, megabytes of output) costs only itself.

Writes DIR/grades.csv and DIR/grades.json (one row per submission: status, points per part, and ``flags``: what
the grader saw the notebook do, such as an edited check cell or a replaced grading function), DIR/gradebook.csv
(one row per student: points per part, per exercise and in total, for a learning platform's import) and
DIR/feedback/<student>__<exercise>.md.
"""

from __future__ import annotations

import csv
import datetime
import hashlib
import io
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from . import EXERCISES, _processes, parts
from ._core import Case, lay_out, pack_cases
from .release import ReleaseError, strip_solutions

MAX_OUTPUT_BYTES = 256 * 1024 * 1024  # the most the child's outputs file may hold
MAX_LOG_BYTES = 64 * 1024 * 1024  # the child cannot write files larger than this (prints included)
MAX_FEEDBACK = 1500  # characters of one message in a feedback file
SHORT_NAMES = {short: name for name, short in EXERCISES.items()}
OUTLIVED = "process(es) it started outlived it and were killed"

# Workers running now, and the grader's own children from before grading: the processes end_strays must spare.
_PROCESSES_LOCK = threading.Lock()
_live_workers: set[int] = set()
_grader_children: set[int] = set()


# --------------------------------------------------------------------------------------------- cases on disk
def graded_cases(exercise: str, seed: int) -> dict[str, list[Case]]:
    """The graded inputs of every part: the hidden-test cases drawn from the instructor's seed."""
    return {part.grade_id: part.cases(np.random.default_rng([seed, index]), True)
            for index, part in enumerate(parts(exercise))}


# --------------------------------------------------------------------------------------------- results
@dataclass
class PartResult:
    points: float
    max_points: float
    passed: bool
    feedback: str


@dataclass
class SubmissionResult:
    student: str
    exercise: str | None
    file: str
    status: str
    points: float = 0
    max_points: float = 0
    seconds: float = 0.0
    parts: dict[str, PartResult] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    flags: list[str] = field(default_factory=list)  # what the notebook did that an instructor should look at


# --------------------------------------------------------------------------------------------- identifying
def exercise_of(path: Path, notebook: dict | None, forced: str | None) -> str | None:
    """Which exercise a submission answers: --exercise, else its file or folder name, else its metadata."""
    if forced:
        return SHORT_NAMES.get(forced, forced) if SHORT_NAMES.get(forced, forced) in EXERCISES else None
    for text in (path.stem, path.parent.name):
        match = re.search(r"ex\d\d", text)
        if match and match.group(0) in SHORT_NAMES:
            return SHORT_NAMES[match.group(0)]
    claimed = ((notebook or {}).get("metadata") or {}).get("flashcourse", {}) if isinstance(notebook, dict) else {}
    name = claimed.get("exercise") if isinstance(claimed, dict) else None
    return name if name in EXERCISES else None


def _owner_folder(path: Path) -> str | None:
    """The nearest folder above the file that is not named after an exercise or an assignment (ps1, ex01_...)."""
    folders = [p for p in path.resolve().parents if not re.fullmatch(r"ex\d\d(_\w+)?|ps\d+", p.name)]
    return folders[0].name if folders and folders[0].name else None


def student_of(path: Path, *, alone: bool = False) -> str:
    """The student's id.

    - a file named after the exercise and nothing else (``ex01_naive_attention.ipynb``): its folder's name
      (nbgrader's submitted/<student>/<assignment>/ layout, or <student>/ex01_...ipynb);
    - a file named after the exercise and something else: that something (``alice_ex01.ipynb`` -> alice);
    - any other name (``homework.ipynb``): its folder's name when it is the only submission in that folder
      (``alone``: gina/homework.ipynb -> gina), else the file name.
    """
    stem = path.stem
    if re.fullmatch(r"ex\d\d(_\w+)?", stem):
        return _owner_folder(path) or stem
    if re.search(r"ex\d\d", stem):
        cleaned = re.sub(r"[_\-. ]*ex\d\d(_[a-z_]+)?[_\-. ]*", "_", stem).strip("_")
        return cleaned or stem
    return (_owner_folder(path) if alone else None) or stem


class NothingGradedError(ValueError):
    """A batch refused before any submission was graded: a bad option or submission list."""


class DuplicateSubmissionError(NothingGradedError):
    """Two files resolve to the same student and exercise; grading both would let one overwrite the other."""


def identify(paths: list[Path], forced: str | None = None) -> list[str]:
    """The student id of every submission; raises DuplicateSubmissionError naming both files when two of them
    resolve to one student and one exercise (their rows and feedback files would be one)."""
    per_folder: dict[Path, int] = {}
    for path in paths:
        per_folder[path.resolve().parent] = per_folder.get(path.resolve().parent, 0) + 1
    students = [student_of(path, alone=per_folder[path.resolve().parent] == 1) for path in paths]
    seen: dict[tuple[str, str], Path] = {}
    for path, student in zip(paths, students, strict=True):
        exercise = exercise_of(path, _read_notebook(path)[0], forced) or "unknown"
        key = (_safe_name(student), exercise)
        if key in seen:
            raise DuplicateSubmissionError(
                f"{seen[key]} and {path} are both student {student!r}, exercise {exercise}: grading both would "
                "overwrite one's grades with the other's. Pass one file per student and exercise (rename one, "
                "or put each in a folder named after its student)")
        seen[key] = path
    return students


def _safe_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text)[:80] or "student"


# --------------------------------------------------------------------------------------------- one submission
@dataclass
class Prepared:
    """A submission ready to run: its cells with the check cells restored, and what restoring them found."""
    notebook: dict
    check_cells: list[int]  # the restored check cells, numbered from 1 as JupyterLab shows them
    note: str = ""  # why the check cells could not be restored ("" when they were)
    flags: list[str] = field(default_factory=list)


def _source(cell: dict) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else str(source)


def _prepare_notebook(notebook: dict, exercise: str, solutions: Path | None) -> Prepared:
    """The submission with its check cells replaced by the solution's, matched by nbgrader grade_id.

    Code and markdown cells the learner wrote stay as they are. The hidden tests are left out of the restored
    check cells: the grader draws the graded inputs and judges them itself, in its own process. A check cell the
    learner edited, deleted or gave another grade id is restored and flagged; one deleted or renamed comes back
    at the end of the notebook.
    """
    source_path = (solutions / f"{exercise}.ipynb") if solutions else None
    if source_path is None or not source_path.exists():
        return Prepared(notebook, [], f"no solution notebook {source_path}: the submission's own check cells ran "
                                      "(the scores do not depend on them)" if source_path else "")
    source = json.loads(source_path.read_text())
    checks = {c["metadata"]["nbgrader"]["grade_id"]: _without_hidden_tests(c) for c in source["cells"]
              if c.get("metadata", {}).get("nbgrader", {}).get("grade")}
    cells, restored, flags = [], [], []
    for cell in notebook.get("cells", []):
        meta = cell.get("metadata", {}).get("nbgrader", {}) if isinstance(cell.get("metadata"), dict) else {}
        grade_id = meta.get("grade_id") if isinstance(meta, dict) else None
        if grade_id in checks:
            check = checks.pop(grade_id)
            if _released_source(cell).strip() != _source(check).strip():
                flags.append(f"check cell {grade_id} edited (the original ran)")
            cells.append(check)
            restored.append(len(cells))
        else:
            if isinstance(meta, dict) and meta.get("grade") and isinstance(grade_id, str):
                flags.append(f"grade id {grade_id[:40]!r} is not one of the exercise's")
            cells.append(cell)
    for grade_id, check in checks.items():  # check cells the learner deleted (or renamed) come back at the end
        flags.append(f"check cell {grade_id} missing: deleted or its grade id changed (restored at the end)")
        cells.append(check)
        restored.append(len(cells))
    return Prepared({**notebook, "cells": cells}, restored, "", flags)


def _released_source(cell: dict) -> str:
    """A submitted check cell's code as the exercise released it: hidden tests (which nbgrader's own release
    removes, and a solved notebook keeps) left out."""
    try:
        return strip_solutions(_source(cell), code=True, where="a submitted check cell")
    except ReleaseError:  # markers the learner broke: not the released cell
        return _source(cell)


def _without_hidden_tests(cell: dict) -> dict:
    where = f"check cell {cell['metadata']['nbgrader']}"
    return {**cell, "source": strip_solutions(_source(cell), code=True, where=where)}


def _tail(path: Path, limit: int = 1500) -> str:
    try:
        with open(path, "rb") as handle:
            handle.seek(max(0, path.stat().st_size - limit))
            return re.sub(r"\x1b\[[0-9;]*m", "", handle.read().decode("utf-8", "replace"))
    except OSError:
        return ""


def _run_child(prepared: Prepared, exercise: str, cases: dict[str, list[Case]], timeout: float,
               job_dir: Path, work_dir: Path) -> tuple[str, dict, dict]:
    """Run the worker; return (status, outputs, report). Never raises for anything the child does."""
    spec, arrays = pack_cases(cases)
    # The child counts its time limit from the moment it is started here (CLOCK_MONOTONIC is system-wide), not
    # from the end of its own imports: those take seconds when several workers share a core, and the grader stops
    # waiting 5 s after the limit, so a child counting from later was killed before it saved what it had.
    job = {"exercise": exercise, "exercise_module": EXERCISES[exercise], "cases": spec,
           "check_cells": prepared.check_cells, "cell_seconds": 0.6 * timeout, "deadline_seconds": timeout,
           "started_monotonic": time.monotonic(), "max_file_bytes": MAX_LOG_BYTES}
    (job_dir / "job.json").write_text(json.dumps(job))
    np.savez(job_dir / "cases.npz", **arrays)
    (work_dir / "submission.ipynb").write_text(json.dumps(prepared.notebook))
    env = {**os.environ, "MPLBACKEND": "agg", "PYTHONUNBUFFERED": "1"}
    env.pop("FLASHCOURSE_SEED", None)
    log = job_dir / "log.txt"
    with open(log, "wb") as out:
        process = subprocess.Popen([sys.executable, "-m", "flashcourse.grading._worker", str(job_dir)],
                                   cwd=work_dir, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                   env=env, start_new_session=True)
        with _PROCESSES_LOCK:
            _live_workers.add(process.pid)
        try:
            process.wait(timeout=timeout + 5)
            status = "graded" if process.returncode == 0 else f"the notebook's process ended with code " \
                                                               f"{process.returncode}"
        except subprocess.TimeoutExpired:
            status = f"timed out after {timeout:g} s"
        finally:
            _kill_group(process)
            with _PROCESSES_LOCK:
                _live_workers.discard(process.pid)
                keep = _live_workers | _grader_children
            ended = _processes.end_strays(keep)
            if ended:
                status += f"; {ended} {OUTLIVED}"
    outputs: dict = {}
    report: dict = {}
    out_path = job_dir / "outputs.npz"
    try:
        if out_path.exists() and out_path.stat().st_size <= MAX_OUTPUT_BYTES:
            with np.load(out_path, allow_pickle=False) as stored:
                outputs = {key: stored[key] for key in stored.files}
    except Exception as error:  # noqa: BLE001 - a corrupt file is the submission's problem, not ours
        status = f"unreadable outputs ({type(error).__name__})"
    try:
        loaded = json.loads((job_dir / "report.json").read_text())
        report = loaded if isinstance(loaded, dict) else {}
    except (OSError, ValueError):
        report = {}
    if not outputs and not report and status == "graded":
        status = "no outputs"
    if status != "graded":
        report.setdefault("log_tail", _tail(log))
    return status, outputs, report


def _kill_group(process: subprocess.Popen) -> None:
    """End the child and anything it started (its own session), then reap it."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def _judge(exercise: str, cases: dict[str, list[Case]], outputs: dict, report: dict) -> dict[str, PartResult]:
    """Score every part here, from the arrays alone: full points if every graded case matches the reference."""
    results = {}
    part_errors = report.get("part_errors") if isinstance(report.get("part_errors"), dict) else {}
    for part in parts(exercise):
        message = ""
        error = part_errors.get(part.grade_id)
        if error:
            message = str(error)
        else:
            try:
                for number, case in enumerate(cases[part.grade_id]):
                    prefix = f"{part.grade_id}/{number}/"
                    got = {key[len(prefix):]: value for key, value in outputs.items() if key.startswith(prefix)}
                    if not got:
                        raise AssertionError("no output was returned for this part")
                    try:
                        part.judge(case, got)
                    except KeyError as missing:
                        raise AssertionError(f"the output {missing} is missing") from None
                    except AssertionError as failure:
                        raise AssertionError(lay_out(part.label, str(failure), f"graded case {number + 1} of "
                                                     f"{len(cases[part.grade_id])}")) from None
            except AssertionError as failure:
                message = str(failure)
            except Exception as failure:  # noqa: BLE001 - malformed outputs must not stop the grader
                message = f"the returned values could not be judged ({type(failure).__name__}: {failure})"
        passed = not message
        results[part.grade_id] = PartResult(part.points if passed else 0, part.points, passed,
                                            "passed" if passed else message[:MAX_FEEDBACK])
    return results


def _read_notebook(path: Path) -> tuple[dict | None, str]:
    """(the notebook, "") or (None, what is wrong with the file)."""
    try:
        notebook = json.loads(path.read_bytes().decode("utf-8"))
        if not isinstance(notebook, dict) or not isinstance(notebook.get("cells"), list):
            raise ValueError("no list of cells")
    except (OSError, UnicodeDecodeError, ValueError) as error:
        return None, f"not a valid notebook ({type(error).__name__}: {str(error)[:200]})"
    return notebook, ""


def grade_submission(path: Path, *, seed: int, timeout: float, exercise: str | None = None,
                     solutions: Path | None = None, student: str | None = None) -> SubmissionResult:
    """Grade one notebook; every failure of the submission becomes a status and zero points, never an error."""
    start = time.monotonic()
    result = SubmissionResult(student=student or student_of(path), exercise=None, file=str(path), status="")
    notebook, problem = _read_notebook(path)
    result.status = problem
    result.exercise = exercise_of(path, notebook, exercise)
    if result.exercise is None:
        result.status = result.status or "unknown exercise (name the file exNN_... or pass --exercise)"
    else:
        exercise_parts = parts(result.exercise)
        result.max_points = sum(p.points for p in exercise_parts)
        result.parts = {p.grade_id: PartResult(0, p.points, False, result.status or "not graded")
                        for p in exercise_parts}
    if notebook is None or result.exercise is None:
        result.seconds = time.monotonic() - start
        return result
    cases = graded_cases(result.exercise, seed)
    job_dir = Path(tempfile.mkdtemp(prefix="flashcourse-grade-job-"))
    work_dir = Path(tempfile.mkdtemp(prefix="flashcourse-grade-run-"))
    try:
        prepared = _prepare_notebook(notebook, result.exercise, solutions)
        if prepared.note:
            result.notes.append(prepared.note)
        status, outputs, report = _run_child(prepared, result.exercise, cases, timeout, job_dir, work_dir)
        result.status = status
        result.parts = _judge(result.exercise, cases, outputs, report)
        result.flags = prepared.flags + flags_from(report, status)
        cell_errors = report.get("cell_errors") if isinstance(report.get("cell_errors"), list) else []
        for entry in cell_errors[:20]:
            if isinstance(entry, dict):
                result.notes.append(f"cell {entry.get('cell')}: {str(entry.get('error'))[:MAX_FEEDBACK]}")
        if report.get("log_tail"):
            result.notes.append("last output of the notebook's process:\n" + str(report["log_tail"]))
    except Exception as error:  # noqa: BLE001 - the grader must go on to the next submission
        result.status = f"grader error ({type(error).__name__}: {error})"
    finally:
        shutil.rmtree(job_dir, ignore_errors=True)
        shutil.rmtree(work_dir, ignore_errors=True)
    result.points = sum(p.points for p in result.parts.values())
    result.seconds = time.monotonic() - start
    return result


def flags_from(report: dict, status: str) -> list[str]:
    """What the worker saw the notebook do, in words an instructor can act on. The report comes from the
    submission's own process, so each entry is type-checked and cut short; a notebook that forges a clean report
    only hides its own flags (scores never depend on the report)."""
    flags = []
    replaced = [str(name)[:100] for name in report.get("replaced", []) if isinstance(name, str)] \
        if isinstance(report.get("replaced"), list) else []
    if replaced:
        count = report.get("replaced_count") if isinstance(report.get("replaced_count"), int) else len(replaced)
        more = f" and {count - len(replaced)} more" if count > len(replaced) else ""
        flags.append(f"grading functions replaced: {', '.join(replaced)}{more}")
    forbidden = report.get("forbidden") if isinstance(report.get("forbidden"), dict) else {}
    for grade_id, message in list(forbidden.items())[:20]:
        first_line = str(message).splitlines()[0] if str(message) else ""
        flags.append(f"forbidden call in {str(grade_id)[:40]}: {first_line[:300]}")
    writes = report.get("outside_writes") if isinstance(report.get("outside_writes"), list) else []
    if writes:
        flags.append("files written outside the working copy: " + ", ".join(str(p)[:200] for p in writes[:10]))
    if OUTLIVED in status:
        flags.append("started processes that outlived the notebook (killed)")
    return flags


# --------------------------------------------------------------------------------------------- writing
def _cell(text) -> str:
    """A CSV cell that a spreadsheet will not run as a formula."""
    text = str(text)
    return "'" + text if text[:1] in ("=", "+", "-", "@") else text


def write_atomically(path: Path, text: str) -> str:
    """Write ``text`` to ``path`` through a temporary file and os.replace, so a reader sees the old file or the
    new one, never half of one; return the SHA-256 of what was written."""
    data = text.encode("utf-8")
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    temporary.write_bytes(data)
    os.replace(temporary, path)
    return hashlib.sha256(data).hexdigest()


def write_feedback(result: SubmissionResult, folder: Path) -> tuple[Path, str]:
    """A Markdown feedback file for one submission: (its path, its SHA-256)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / feedback_name(result.student, result.exercise)
    lines = [f"# Feedback: {result.student}, {result.exercise or 'unknown exercise'}", "",
             f"Score: **{result.points:g} / {result.max_points:g}**. Status: {result.status}.", ""]
    for grade_id, part in result.parts.items():
        mark = "passed" if part.passed else "not passed"
        lines += [f"## {grade_id}: {part.points:g} / {part.max_points:g} ({mark})", ""]
        if not part.passed:
            lines += ["```", part.feedback, "```", ""]
    if result.flags:
        lines += ["## What the grader noticed", "",
                  *(f"- {flag}" for flag in result.flags), "",
                  "These do not change the score (it comes from your functions' outputs alone); your instructor "
                  "sees them too.", ""]
    if result.notes:
        lines += ["## Errors while running your notebook", ""]
        lines += ["```", *result.notes, "```", ""]
    lines += ["Scores come from what your functions returned on inputs you have not seen, compared with the "
              "reference; what the notebook prints is not read.", ""]
    return path, write_atomically(path, "\n".join(lines))


def feedback_name(student: str, exercise: str | None) -> str:
    return f"{_safe_name(student)}__{exercise or 'unknown'}.md"


def write_tables(results: list[SubmissionResult], out: Path, meta: dict) -> dict[str, str]:
    """DIR/grades.json and DIR/grades.csv, written from scratch (a file a submission put there is replaced);
    returns {file name: SHA-256}."""
    out.mkdir(parents=True, exist_ok=True)
    exercises = {}
    for name in sorted({r.exercise for r in results if r.exercise}):
        exercise_parts = parts(name)
        exercises[name] = {"max_points": sum(p.points for p in exercise_parts),
                           "parts": {p.grade_id: {"title": p.title, "points": p.points} for p in exercise_parts}}
    payload = {**meta, "exercises": exercises,
               "submissions": [{**asdict(r), "parts": {k: asdict(v) for k, v in r.parts.items()}}
                               for r in results]}
    part_ids = sorted({grade_id for r in results for grade_id in r.parts})
    table = io.StringIO(newline="")
    writer = csv.writer(table)
    writer.writerow(["student", "exercise", "file", "status", "points", "max_points", *part_ids, "flags"])
    for r in results:
        writer.writerow([_cell(r.student), r.exercise or "", _cell(r.file), _cell(r.status), f"{r.points:g}",
                         f"{r.max_points:g}", *[f"{r.parts[g].points:g}" if g in r.parts else "" for g in part_ids],
                         _cell("; ".join(r.flags))])
    return {"grades.json": write_atomically(out / "grades.json", json.dumps(payload, indent=2) + "\n"),
            "grades.csv": write_atomically(out / "grades.csv", table.getvalue()),
            "gradebook.csv": write_atomically(out / "gradebook.csv", gradebook(results))}


def gradebook(results: list[SubmissionResult]) -> str:
    """The wide table a learning platform imports: one row per student; a column per exercise part (ex01_a), per
    exercise (ex01_naive_attention: its total) and the student's total. A blank cell: no submission for that
    exercise. Every row is a student (the maximum of each column is in grades.json, under "exercises")."""
    graded = sorted({r.exercise for r in results if r.exercise})
    columns = [(name, [p.grade_id for p in parts(name)]) for name in graded]
    header = ["student", *(column for name, grade_ids in columns for column in (*grade_ids, name)), "total"]
    by_student: dict[str, dict[str, SubmissionResult]] = {}
    for r in results:
        if r.exercise:
            by_student.setdefault(r.student, {})[r.exercise] = r
        else:
            by_student.setdefault(r.student, {})
    table = io.StringIO(newline="")
    writer = csv.writer(table)
    writer.writerow(header)
    for student in sorted(by_student):
        row = [_cell(student)]
        for name, grade_ids in columns:
            submitted = by_student[student].get(name)
            if submitted is None:
                row += [""] * (len(grade_ids) + 1)
            else:
                row += [*(f"{submitted.parts[g].points:g}" if g in submitted.parts else "0" for g in grade_ids),
                        f"{submitted.points:g}"]
        row.append(f"{sum(r.points for r in by_student[student].values()):g}")
        writer.writerow(row)
    return table.getvalue()


def write_summary(out: Path, meta: dict, digests: dict[str, str]) -> str:
    """DIR/summary.json: the SHA-256 of every table and feedback file the grader wrote; returns its own SHA-256,
    which the grader prints, so that a later change to any of these files (summary included) shows."""
    payload = {"seed": meta["seed"], "started": meta["started"], "sha256": dict(sorted(digests.items()))}
    return write_atomically(out / "summary.json", json.dumps(payload, indent=2) + "\n")


def grade_all(submissions: list[Path], out: Path, *, seed: int | None = None, timeout: float = 300,
              exercise: str | None = None, solutions: Path | None = None, jobs: int = 1,
              progress=sys.stderr) -> list[SubmissionResult]:
    """Grade every submission, writing the tables after each one (so a stopped run keeps what it did).

    Raises, before grading anything, DuplicateSubmissionError when two files are one student's one exercise, and
    NothingGradedError for a time limit that is not a positive number of seconds, fewer than one job, or a
    submission path that is not a file (a mistyped name or a pattern the shell left unexpanded would otherwise
    grade as zero).
    """
    if not 0 < timeout < float("inf"):  # NaN fails too
        raise NothingGradedError(f"timeout={timeout!r}: a time limit of a positive, finite number of seconds is "
                                 "expected (every notebook would run out of time)")
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise NothingGradedError(f"jobs={jobs!r}: the number of submissions graded at once, 1 or more, is expected")
    paths = [Path(p) for p in submissions]
    students = identify(paths, exercise)
    absent = [str(p) for p in paths if not p.is_file()]
    if absent:
        raise NothingGradedError(f"not a file: {', '.join(absent)} (check the names, or the pattern that should "
                                 "have matched them)")
    seed = secrets.randbits(32) if seed is None else int(seed)
    if solutions is None and Path("solutions").is_dir():
        solutions = Path("solutions")
    meta = {"seed": seed, "timeout_s": timeout, "started": datetime.datetime.now(datetime.timezone.utc)
            .isoformat(timespec="seconds"), "solutions": str(solutions) if solutions else None}
    results: list[SubmissionResult | None] = [None] * len(paths)
    digests: dict[str, str] = {}
    writing = threading.Lock()
    print(f"grading {len(paths)} submission(s), seed {seed}, time limit {timeout:g} s each", file=progress)
    if solutions is None:
        print("no solutions/ folder here and no --solutions DIR: check cells a student edited or deleted are not "
              "restored (scores do not depend on them); run from the course folder or pass --solutions",
              file=progress)
    elif not solutions.is_dir():
        print(f"--solutions {solutions} is not a folder: check cells are not restored (scores do not depend on "
              "them)", file=progress)
    if not _processes.supported():
        print("this system cannot adopt a submission's detached processes (Linux only): grade in a container",
              file=progress)

    def one(index: int) -> None:
        result = grade_submission(paths[index], seed=seed, timeout=timeout, exercise=exercise,
                                  solutions=solutions, student=students[index])
        with writing:
            results[index] = result
            path, digest = write_feedback(result, out / "feedback")
            digests[f"feedback/{path.name}"] = digest
            done = sum(r is not None for r in results)
            print(f"[{done}/{len(paths)}] {result.student} ({result.exercise or '?'}): "
                  f"{result.points:g}/{result.max_points:g} points, {result.status}, {result.seconds:.1f} s",
                  file=progress, flush=True)
            digests.update(write_tables([r for r in results if r is not None], out, meta))
            write_summary(out, meta, digests)

    with _PROCESSES_LOCK:
        _grader_children.clear()
        _grader_children.update(_processes.descendants() if _processes.supported() else ())
    was_adopting = _processes.adopt_orphans(True)
    try:
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            list(pool.map(one, range(len(paths))))
        _processes.end_strays(_grader_children)
    finally:
        _processes.adopt_orphans(was_adopting)
    finished = [r for r in results if r is not None]
    digests.update(write_tables(finished, out, meta))
    summary = write_summary(out, meta, digests)
    print(f"summary.json (SHA-256 of every file written) has SHA-256 {summary}: keep this line to check later that "
          "no file changed", file=progress)
    return finished
