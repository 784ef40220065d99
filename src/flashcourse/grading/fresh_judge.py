"""Hidden tests judged by a fresh Python, out of the reach of the notebook they grade.

nbgrader runs a notebook's hidden tests in the student's own kernel, after the student's cells: a check called
there can have been replaced (``grading.check_*``, ``numpy.testing``, ``flashcourse.tolerance``, a part's
``judge``) and then passes anything. So a hidden-test cell calls :func:`hidden_test`, which

1. starts ``python -I -m flashcourse.grading.fresh_judge GRADE_ID FOLDER``: a new interpreter that imports the
   grading code from disk (``-I``: not from the notebook's folder, nor from PYTHONPATH unless the course is not
   installed, and then after its own path: :func:`_judge_command`); it draws the hidden cases
   and writes them to FOLDER, keeping its own copy;
2. calls the learner's functions on those cases here, in the kernel (they only exist here), and writes what they
   return to FOLDER;
3. lets the judge compare those outputs with the reference, against its own copy of the cases, and raises
   AssertionError with its diagnosis unless the judge answered that every case passed.

The batch grader does not need this: its whole grader is such a process (docs/GRADING.md).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from ._core import Part, call_learner, describe_case, lay_out, make_rng, pack_cases, unpack_cases

READY, GO = "cases written", "outputs written"
MAX_SECONDS = 600  # the judge waits this long for the kernel to run the learner's functions


def _part(grade_id: str) -> Part:
    from . import parts

    return next(part for part in parts(grade_id.split("_")[0]) if part.grade_id == grade_id)


def _save(path: Path, entries: list[dict]) -> None:
    """Save a list of cases (or outputs): arrays to ``path`` (.npz), everything else beside it as JSON."""
    spec, arrays = pack_cases({"entries": entries})
    np.savez(path, **arrays)
    path.with_suffix(".json").write_text(json.dumps(spec))


def _load(path: Path) -> list[dict]:
    with np.load(path, allow_pickle=False) as stored:
        arrays = {key: stored[key] for key in stored.files}
    return unpack_cases(json.loads(path.with_suffix(".json").read_text()), arrays)["entries"]


# ------------------------------------------------------------------------------------------ in the notebook
def hidden_test(grade_id: str, **functions) -> None:
    """Run the hidden tests of one part (``"ex01_c"``) on the learner's ``functions``, judged by a fresh Python.

    Raises AssertionError (the cell then scores 0 under nbgrader) unless that judge says every case passed.
    ``grading.keep_going()`` does not apply here: a hidden test always raises when it fails.
    """
    __tracebackhide__ = True
    part = _part(grade_id)
    folder = Path(tempfile.mkdtemp(prefix="flashcourse-hidden-"))
    judge = subprocess.Popen(_judge_command(grade_id, folder),
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        if judge.stdout.readline().strip() != READY:
            raise AssertionError(f"{part.label}: the hidden tests' judge did not start: {_ended(judge)}")
        cases = _load(folder / "cases.npz")
        outputs = [{name: np.asarray(value) for name, value in call_learner(part, functions, case).items()}
                   for case in cases]  # call_learner raises the learner's errors, which fail the test here
        _save(folder / "outputs.npz", outputs)
        judge.stdin.write(GO + "\n")
        judge.stdin.flush()
        answer = judge.stdout.readline()
        try:
            verdict = json.loads(answer)
        except ValueError:
            raise AssertionError(f"{part.label}: the hidden tests' judge gave no verdict: {_ended(judge)}") from None
    finally:
        judge.kill()
        judge.communicate()
        shutil.rmtree(folder, ignore_errors=True)
    if verdict.get("passed") is not True:
        raise AssertionError(str(verdict.get("message")))
    print(f"{part.label} {part.title}: passed all {len(cases)} hidden tests, judged by a fresh Python "
          f"({part.points} points)")


def _judge_command(grade_id: str, folder: Path) -> list[str]:
    """``python -I`` running :func:`main`; PYTHONPATH's folders only if the course is not installed, and last.

    ``-I`` leaves out PYTHONPATH with the notebook's folder, so a course run from a checkout (``PYTHONPATH=src``,
    packages installed with ``pip --target``) has no judge. Only then (``flashcourse`` not importable from the
    judge's own path) are PYTHONPATH's folders, made absolute, put *after* its standard library and site-packages:
    they add what it lacks and replace nothing it has. The notebook's folder is never among them.
    """
    extra = [os.path.abspath(entry) for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep) if entry]
    extra = [entry for entry in dict.fromkeys(extra) if entry != os.getcwd()]
    boot = ("import importlib.util, os, runpy, sys; extra = sys.argv.pop(); "
            "importlib.util.find_spec('flashcourse') or sys.path.extend(filter(None, extra.split(os.pathsep))); "
            "runpy.run_module('flashcourse.grading.fresh_judge', run_name='__main__')")
    return [sys.executable, "-I", "-c", boot, grade_id, str(folder), os.pathsep.join(extra)]


def _ended(judge: subprocess.Popen) -> str:
    judge.kill()
    _, errors = judge.communicate()
    return f"it ended with code {judge.returncode}; its last words: {errors[-800:] or '(none)'}"


# ------------------------------------------------------------------------------------------ in the fresh Python
def judge_outputs(part: Part, cases: list[dict], outputs: list[dict]) -> str:
    """"" if every case's outputs match the reference, else the message of the first one that does not."""
    if len(outputs) != len(cases):
        return f"{part.label}: {len(outputs)} results came back for {len(cases)} hidden tests"
    for number, (case, got) in enumerate(zip(cases, outputs, strict=True), start=1):
        try:
            part.judge(case, got)
        except KeyError as missing:
            return f"{part.label}, hidden test {number} of {len(cases)}: the output {missing} is missing"
        except AssertionError as error:
            return lay_out(part.label, str(error), f"hidden test {number} of {len(cases)}: {describe_case(case)}")
    return ""


def main(grade_id: str, folder: str) -> int:
    part = _part(grade_id)
    cases = part.cases(make_rng(None), True)  # FLASHCOURSE_SEED, if the grading environment sets it
    _save(Path(folder) / "cases.npz", cases)
    print(READY, flush=True)
    if sys.stdin.readline().strip() != GO:
        return 1
    try:
        message = judge_outputs(part, cases, _load(Path(folder) / "outputs.npz"))
    except Exception as error:  # noqa: BLE001 - whatever came back, a verdict must be printed
        message = f"{part.label}: the results could not be judged ({type(error).__name__}: {error})"
    print(json.dumps({"passed": not message, "message": message}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
