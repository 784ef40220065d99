"""The batch grader's child process: runs one submission's code cells, then calls its functions on the graded
inputs and saves what they return. It decides nothing: the grader judges the saved arrays in its own process.

Usage (by the grader only): ``python -m flashcourse.grading._worker JOB_DIR`` with the working directory set to
a temporary copy holding ``submission.ipynb``. JOB_DIR holds ``job.json`` (exercise, time budget) and
``cases.npz`` (the graded inputs); the worker writes ``outputs.npz`` and ``report.json`` there.
"""

from __future__ import annotations

import json
import resource
import signal
import sys
import time
import traceback
from pathlib import Path

import numpy as np

# Taken before any submitted code runs, so that a cell rebinding these names changes nothing here.
from flashcourse.grading import parts as _parts
from flashcourse.grading._core import call_learner as _call_learner
from flashcourse.grading._core import unpack_cases as _unpack_cases

MAX_MESSAGE = 2000


class CellTimeout(Exception):
    """Raised by the alarm when a cell or a part runs past its share of the time limit."""


def _on_alarm(signum, frame):
    raise CellTimeout("ran past the time limit")


def _short(text: str) -> str:
    return text if len(text) <= MAX_MESSAGE else text[:MAX_MESSAGE] + " [...]"


def _run_cells(notebook: dict, deadline: float) -> tuple[list[dict], str, dict]:
    """Execute the code cells in order in one IPython shell, going on after errors.

    Returns (errors, timeout, namespace): errors as {"cell": number, "error": text}, cells numbered as JupyterLab
    shows them (from 1, every cell counted); timeout says which cell ran out of time ("" if none did).
    """
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    errors = []
    for number, cell in enumerate(notebook.get("cells", []), start=1):
        if cell.get("cell_type") != "code":
            continue
        source = cell.get("source", "")
        source = "".join(source) if isinstance(source, list) else str(source)
        started = time.monotonic()
        signal.setitimer(signal.ITIMER_REAL, max(deadline - started, 1e-3))
        try:
            result = shell.run_cell(source, store_history=False)
            error = None if result.success else (result.error_in_exec or result.error_before_exec)
        except CellTimeout as raised:  # the alarm can also fire outside the cell's own code
            error = raised
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        if isinstance(error, CellTimeout):
            seconds = time.monotonic() - started
            timeout = f"cell {number} timed out after {seconds:.0f} s; the cells after it did not run"
            errors.append({"cell": number, "error": timeout})
            return errors, timeout, shell.user_ns
        if error is not None:
            errors.append({"cell": number, "error": _short(f"{type(error).__name__}: {error}")})
    return errors, "", shell.user_ns


def main(job_dir: str) -> int:
    job_path = Path(job_dir)
    job = json.loads((job_path / "job.json").read_text())
    # No file (the printed output included) beyond this size, and no core dumps.
    resource.setrlimit(resource.RLIMIT_FSIZE, (job["max_file_bytes"], job["max_file_bytes"]))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    signal.signal(signal.SIGALRM, _on_alarm)
    start = job["started_monotonic"]
    cells_deadline = start + job["cell_seconds"]
    notebook = json.loads(Path("submission.ipynb").read_text())
    cell_errors, timeout, namespace = _run_cells(notebook, cells_deadline)
    sys.stdout.flush()
    exercise_parts = {part.grade_id: part for part in _parts(job["exercise"])}
    with np.load(job_path / "cases.npz", allow_pickle=False) as stored:
        arrays = {key: stored[key] for key in stored.files}
    cases = _unpack_cases(job["cases"], arrays)
    outputs, part_errors = {}, {}
    for grade_id, part_cases in cases.items():
        part = exercise_parts[grade_id]
        missing = [name for name in part.functions if not callable(namespace.get(name))]
        if missing:
            why = timeout or "did the cell that defines it raise an error? (see the errors below)"
            part_errors[grade_id] = (f"{', '.join(missing)} is not defined as a function after running the "
                                     f"notebook: {why}")
            continue
        functions = {name: namespace[name] for name in part.functions}
        remaining = job["deadline_seconds"] - (time.monotonic() - start)
        if remaining <= 0:
            part_errors[grade_id] = "not evaluated: the notebook used up its time limit"
            continue
        signal.setitimer(signal.ITIMER_REAL, remaining)
        try:
            for number, case in enumerate(part_cases):
                for key, value in _call_learner(part, functions, case).items():
                    outputs[f"{grade_id}/{number}/{key}"] = np.asarray(value)
        except CellTimeout:
            part_errors[grade_id] = "your function ran past the time limit on the graded inputs"
        except AssertionError as error:
            part_errors[grade_id] = _short(str(error))
        except BaseException as error:  # noqa: BLE001 - the learner's code can raise anything
            part_errors[grade_id] = _short(f"{type(error).__name__}: {error}")
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    np.savez(job_path / "outputs.npz", **outputs)
    (job_path / "report.json").write_text(json.dumps({"cell_errors": cell_errors, "part_errors": part_errors}))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1]))
    except Exception:
        traceback.print_exc()
        sys.exit(3)
