"""The batch grader's child process: runs one submission's code cells, then calls its functions on the graded
inputs and saves what they return. It decides nothing: the grader judges the saved arrays in its own process.

Usage (by the grader only): ``python -m flashcourse.grading._worker JOB_DIR`` with the working directory set to
a temporary copy holding ``submission.ipynb``. JOB_DIR holds ``job.json`` (exercise, time budget, which cells are
the restored check cells) and ``cases.npz`` (the graded inputs); the worker writes ``outputs.npz`` and
``report.json`` there.

Besides the outputs it reports what it saw, for the grader's ``flags``: grading (or reference, tolerance,
numpy.testing) functions the notebook replaced in memory, files it wrote outside its working copy (Python's audit
hooks see every ``open`` for writing, ``mkdir``, ``rename`` and ``remove`` made from Python), and library calls the
call guard refused. This catches what a notebook does through Python; it is not a sandbox (docs/GRADING.md).
The restored check cells run against a copy of the grading package loaded before any submitted code, so a check
the notebook replaced is never the one they call.
"""

from __future__ import annotations

import ast
import importlib
import json
import os
import resource
import signal
import sys
import time
import traceback
from pathlib import Path

import numpy as np

# Taken before any submitted code runs, so that a cell rebinding these names changes nothing here.
from flashcourse.grading import parts as _parts
from flashcourse.grading._core import ForbiddenCallError as _ForbiddenCallError
from flashcourse.grading._core import call_learner as _call_learner
from flashcourse.grading._core import unpack_cases as _unpack_cases
from flashcourse.grading.fresh_copy import fresh_grading_package as _fresh_grading_package

MAX_MESSAGE = 2000
MAX_SEEN = 10  # the most replaced names or outside paths one report lists

# Modules whose functions decide whether a check passes; a notebook replacing one of them is flagged.
_WATCHED_MODULES = ("flashcourse.grading", "flashcourse.reference", "flashcourse.tolerance", "numpy.testing")
# Audit events that change the file system, and which of their arguments are paths.
_WRITE_EVENTS = {"os.mkdir": (0,), "os.rename": (0, 1), "os.remove": (0,), "os.rmdir": (0,), "os.symlink": (1,),
                 "os.link": (1,), "os.truncate": (0,), "shutil.rmtree": (0,), "shutil.copyfile": (1,)}
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC


class CellTimeout(Exception):
    """Raised by the alarm when a cell or a part runs past its share of the time limit."""


def _on_alarm(signum, frame):
    raise CellTimeout("ran past the time limit")


def _short(text: str) -> str:
    return text if len(text) <= MAX_MESSAGE else text[:MAX_MESSAGE] + " [...]"


def _watched_functions(exercise_parts) -> dict[str, object]:
    """Every function the checks rely on, by qualified name: those of the watched modules loaded now, and each
    part's own run, judge and cases (a frozen dataclass, but ``object.__setattr__`` changes it)."""
    found = {}
    for module_name, module in list(sys.modules.items()):
        if module is None or not any(module_name == w or module_name.startswith(w + ".") for w in _WATCHED_MODULES):
            continue
        for name, value in list(vars(module).items()):
            if callable(value) and not name.startswith("__"):
                found[f"{module_name}.{name}"] = value
    for part in exercise_parts:
        for field_name in ("run", "judge", "cases"):
            found[f"{part.grade_id}.{field_name}"] = getattr(part, field_name)
    return found


def _replaced(before: dict[str, object], after: dict[str, object]) -> list[str]:
    """Names bound to another object after the notebook ran, and functions added to a module that was loaded
    before (``grading.check_x = ...`` binds a name the package otherwise serves lazily). Modules loaded later are
    not compared."""
    modules_before = {name.rsplit(".", 1)[0] for name in before}
    return [name for name, value in after.items()
            if (name in before and before[name] is not value)
            or (name not in before and name.rsplit(".", 1)[0] in modules_before)]


class _WriteWatch:
    """An audit hook that, while ``on``, records files written outside the working copy.

    Python's own byte-code caches (``__pycache__``) and the caches of the tools a notebook imports (under the
    home folder's .cache, .triton, .ipython, .config, .matplotlib) are not the notebook's doing and are left out.
    """

    def __init__(self, working_copy: str):
        home = os.path.expanduser("~")
        self.allowed = [os.path.join(working_copy, ""), "/dev/",
                        *(os.path.join(home, folder, "") for folder in
                          (".cache", ".triton", ".ipython", ".config", ".matplotlib", ".nv"))]
        self.on = False
        self.paths: list[str] = []

    def __call__(self, event: str, args: tuple) -> None:
        if not self.on:
            return
        if event == "open":
            path, _, flags = args
            if not isinstance(flags, int) or not flags & _WRITE_FLAGS:
                return
            paths = [path]
        elif event in _WRITE_EVENTS:
            paths = [args[i] for i in _WRITE_EVENTS[event] if i < len(args)]
        else:
            return
        for path in paths:
            if isinstance(path, bytes):
                path = os.fsdecode(path)
            if not isinstance(path, str):  # a file descriptor: opened earlier, where the open was seen
                continue
            path = os.path.abspath(path)
            if (f"{os.sep}__pycache__{os.sep}" in path or any(path.startswith(a) for a in self.allowed)
                    or path in self.paths or len(self.paths) >= MAX_SEEN):
                continue
            self.paths.append(path)


def _names_in(source: str) -> set[str]:
    """The names a check cell's code reads (``grading.check_x(f)`` -> {"grading", "f"})."""
    try:
        return {node.id for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Name)}
    except SyntaxError:
        return set()


def _run_check_cell(source: str, namespace: dict, grading) -> BaseException | None:
    """Run a restored check cell with ``grading`` bound to the worker's own copy of the package and every other
    name it reads taken from the notebook: the check it calls is the course's, whatever the notebook replaced."""
    scope = {name: namespace[name] for name in _names_in(source) if name in namespace}
    scope["grading"] = grading
    try:
        exec(compile(source, "<check cell>", "exec"), scope)
    except Exception as error:  # noqa: BLE001 - a failing check is the submission's, reported like any cell
        return error
    return None


def _run_cells(notebook: dict, deadline: float, check_cells: frozenset[int] = frozenset(), grading=None,
               watch: _WriteWatch | None = None) -> tuple[list[dict], str, dict]:
    """Execute the code cells in order in one IPython shell, going on after errors.

    ``check_cells``: the numbers of the restored check cells, run by :func:`_run_check_cell` against ``grading``.
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
        if watch is not None:
            watch.on = True
        try:
            if number in check_cells:
                error = _run_check_cell(source, shell.user_ns, grading)
            else:
                result = shell.run_cell(source, store_history=False)
                error = None if result.success else (result.error_in_exec or result.error_before_exec)
        except CellTimeout as raised:  # the alarm can also fire outside the cell's own code
            error = raised
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            if watch is not None:
                watch.on = False
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
    exercise_parts = {part.grade_id: part for part in _parts(job["exercise"])}
    # Loaded before any submitted code runs: the restored check cells call this copy's checks.
    grading = _fresh_grading_package()
    importlib.import_module(f"{grading.__name__}.{job['exercise_module']}")
    watched = _watched_functions(exercise_parts.values())
    watch = _WriteWatch(os.getcwd())
    sys.addaudithook(watch)  # an audit hook cannot be removed: the notebook cannot turn it off
    cell_errors, timeout, namespace = _run_cells(notebook, cells_deadline, frozenset(job["check_cells"]), grading,
                                                 watch)
    sys.stdout.flush()
    replaced = _replaced(watched, _watched_functions(exercise_parts.values()))
    with np.load(job_path / "cases.npz", allow_pickle=False) as stored:
        arrays = {key: stored[key] for key in stored.files}
    cases = _unpack_cases(job["cases"], arrays)
    outputs, part_errors, forbidden = {}, {}, {}
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
        watch.on = True
        try:
            for number, case in enumerate(part_cases):
                for key, value in _call_learner(part, functions, case).items():
                    outputs[f"{grade_id}/{number}/{key}"] = np.asarray(value)
        except CellTimeout:
            part_errors[grade_id] = "your function ran past the time limit on the graded inputs"
        except _ForbiddenCallError as error:
            part_errors[grade_id] = forbidden[grade_id] = _short(str(error))
        except AssertionError as error:
            part_errors[grade_id] = _short(str(error))
        except BaseException as error:  # noqa: BLE001 - the learner's code can raise anything
            part_errors[grade_id] = _short(f"{type(error).__name__}: {error}")
        finally:
            watch.on = False
            signal.setitimer(signal.ITIMER_REAL, 0)
    np.savez(job_path / "outputs.npz", **outputs)
    (job_path / "report.json").write_text(json.dumps({
        "cell_errors": cell_errors, "part_errors": part_errors, "forbidden": forbidden,
        "replaced": replaced[:MAX_SEEN], "replaced_count": len(replaced), "outside_writes": watch.paths}))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1]))
    except Exception:
        traceback.print_exc()
        sys.exit(3)
