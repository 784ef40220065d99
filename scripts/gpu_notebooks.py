"""Execute every lesson (notebooks/) and every solved exercise (solutions/) top to bottom, one at a time.

Made for the GPU machine, which has no Jupyter: its wheels come from scripts/gpu_wheels.sh, and the run is

    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \\
        .whl/*.whl && export PYTHONPATH=/tmp/site:src && PYTHONUNBUFFERED=1 python3 scripts/gpu_notebooks.py \\
        --json $OUT/notebooks.json

Each notebook runs in a fresh ``python3`` kernel of this very interpreter (a kernel spec written for the run, so
no other Python's spec can be picked), under one time limit for the whole notebook, from a temporary copy of its
folder set beside links to the rest of the repository: relative paths resolve as in the folder, and what it writes
beside itself stays out of the tree (``--in-place`` runs in the folder itself). PYTHONPATH is made absolute first,
since the kernels start in the notebooks' folders. A failure never stops the run: a line per notebook as it ends,
a table at the end, ``--json`` (rewritten after each notebook, so a run cut short keeps its rows), and the exit
code 1 if any failed. To stay inside a 10-minute command, split the run with ``--only 'notebooks/*'`` and
``--only 'solutions/*'``. The parts' JSON files become one with ``--merge PART.json ... --json ALL.json``
(no notebook runs): a notebook's row from a later part replaces an earlier one, rows keep the order of the repository,
and ``meta.parts`` says what each part ran on and when.
"""

from __future__ import annotations

import argparse
import datetime
import fnmatch
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("notebooks", "solutions")  # the lessons, then the solved exercises
KERNEL = "python3"


def find_notebooks(root: Path = ROOT, only: list[str] | None = None) -> list[Path]:
    """Every lesson, then every solution, sorted; with ``only``, those whose path from ``root`` matches a glob."""
    found = [path for folder in FOLDERS for path in sorted((root / folder).glob("*.ipynb"))]
    if only:
        found = [path for path in found
                 if any(fnmatch.fnmatch(path.relative_to(root).as_posix(), pattern) for pattern in only)]
    return found


def absolute_pythonpath(cwd: Path) -> str:
    """PYTHONPATH with every folder made absolute: a kernel starts in its notebook's folder, where ``src`` is not."""
    entries = [entry for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep) if entry]
    return os.pathsep.join(str((cwd / entry).resolve()) for entry in entries)


def kernel_spec_dir(where: Path) -> Path:
    """A jupyter data folder whose ``python3`` kernel is this interpreter (put first on JUPYTER_PATH)."""
    spec = where / "kernels" / KERNEL
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": f"Python {platform.python_version()} (gpu_notebooks)", "language": "python",
        "metadata": {"debugger": False}}))
    return where


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def device_name() -> str:
    """The GPU's name (nvidia-smi, else torch), or "cpu" with the Triton interpreter's flag."""
    try:
        names = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                               text=True, timeout=30).stdout.split("\n")
        if names and names[0].strip():
            count = len([n for n in names if n.strip()])
            return names[0].strip() + (f" x {count}" if count > 1 else "")
    except (OSError, subprocess.SubprocessError):
        pass
    return "cpu" + (" (TRITON_INTERPRET=1)" if os.environ.get("TRITON_INTERPRET") == "1" else "")


def meta() -> dict:
    return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "device": device_name(), "torch": _version("torch"), "triton": _version("triton"),
            "python": platform.python_version(), "executable": sys.executable}


def preflight() -> list[str]:
    """What is wrong before any notebook runs: a missing package, or a kernel that is another Python."""
    problems = []
    for name in ("nbclient", "nbformat", "ipykernel", "ipywidgets", "jupyter_client"):
        if _version(name) is None:
            problems.append(f"{name} is not installed (scripts/gpu_wheels.sh, then pip install --target)")
    if problems:
        return problems
    try:
        from jupyter_client.kernelspec import KernelSpecManager

        argv = KernelSpecManager().get_kernel_spec(KERNEL).argv
    except Exception as error:  # noqa: BLE001 - said in one line, before any notebook runs
        return [f"jupyter_client fails: {type(error).__name__}: {error}"]
    if Path(argv[0]).resolve() != Path(sys.executable).resolve():
        problems.append(f"the {KERNEL} kernel would run {argv[0]}, not {sys.executable}")
    return problems


def unmet_requirements() -> list[str]:
    """What the packages carried on PYTHONPATH (--target) ask of the ones already there and do not get.

    pip installed them with --no-deps, so nobody checked that the image's psutil, pygments, attrs, ... are recent
    enough: a warning each, since a failure it causes shows up later as an ImportError in some cell.
    """
    try:
        from packaging.requirements import Requirement
    except ImportError:
        return []
    carried = [Path(entry).resolve() for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep) if entry]
    found = []
    for dist in metadata.distributions():
        where = Path(str(dist.locate_file(""))).resolve()
        if where not in carried or dist.metadata["Name"] == "flashcourse":  # src/ may hold a stale egg-info
            continue
        for line in dist.requires or []:
            requirement = Requirement(line)
            if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
                continue
            have = _version(requirement.name)
            if have is None:
                found.append(f"{dist.metadata['Name']} needs {requirement}, which is not installed")
            elif requirement.specifier and not requirement.specifier.contains(have, prereleases=True):
                found.append(f"{dist.metadata['Name']} needs {requirement}, and {requirement.name} is {have}")
    return sorted(set(found))


def _first_line(source: str) -> str:
    return next((line.strip() for line in source.splitlines() if line.strip()), "")


def describe_error(error: BaseException, nb, cell_index: int | None, seconds_left: float) -> str:
    """The exception's last line, then the failing cell's number and first line."""
    from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

    if isinstance(error, CellExecutionError):
        lines = [line for line in str(error.evalue).splitlines() if line.strip()]
        what = f"{error.ename}: {lines[-1].strip() if lines else ''}".rstrip(": ")
    elif isinstance(error, CellTimeoutError) or (isinstance(error, TimeoutError) and seconds_left <= 0):
        what = "timeout: the notebook ran past its time limit"
    elif isinstance(error, DeadKernelError):
        what = f"DeadKernelError: the kernel died ({_first_line(str(error))})"
    else:
        lines = [line for line in traceback.format_exception_only(type(error), error) if line.strip()]
        what = lines[-1].strip() if lines else type(error).__name__
    if cell_index is not None and cell_index < len(nb.cells):
        what += f" [cell {cell_index}: {_first_line(nb.cells[cell_index].source)[:100]}]"
    return what


def run_one(path: Path, timeout: float, in_place: bool, executed: Path | None) -> dict:
    import nbformat
    from nbclient import NotebookClient

    name = path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path)
    nb = nbformat.read(path, as_version=4)
    current: dict = {"cell": None}
    start = time.monotonic()
    deadline = start + timeout
    workdir = tempfile.mkdtemp(prefix="gpu-notebooks-") if not in_place else None
    try:
        if workdir is None:
            cwd = path.parent
        else:  # a copy of the notebook's folder beside links to the rest of the repository: `../x` still resolves
            cwd = Path(workdir) / path.parent.name
            shutil.copytree(path.parent, cwd)
            for entry in ROOT.iterdir():
                if entry.name != path.parent.name and not entry.name.startswith("."):
                    (Path(workdir) / entry.name).symlink_to(entry)
        client = NotebookClient(
            nb, kernel_name=KERNEL, timeout=timeout, startup_timeout=120,
            timeout_func=lambda cell: max(1, int(deadline - time.monotonic())),
            resources={"metadata": {"path": str(cwd)}},
            on_cell_execute=lambda cell, cell_index: current.update(cell=cell_index))
        error = None
        try:
            client.execute()
        except BaseException as caught:  # noqa: BLE001 - one notebook's failure never stops the run
            if isinstance(caught, KeyboardInterrupt):
                raise
            error = caught
        seconds = time.monotonic() - start
        row = {"notebook": name, "ok": error is None, "seconds": round(seconds, 1), "error": None}
        if error is not None:
            row["error"] = describe_error(error, nb, current["cell"], deadline - time.monotonic())
        if executed is not None:
            target = executed / path.parent.name / path.name
            target.parent.mkdir(parents=True, exist_ok=True)
            nbformat.write(nb, target)
        return row
    finally:
        if workdir is not None:
            shutil.rmtree(workdir, ignore_errors=True)


def table(rows: list[dict]) -> str:
    width = max([len("notebook")] + [len(row["notebook"]) for row in rows])
    lines = [f"{'notebook':{width}}  result  seconds  error", f"{'-' * width}  ------  -------  -----"]
    for row in rows:
        lines.append(f"{row['notebook']:{width}}  {'ok' if row['ok'] else 'FAILED':6}  {row['seconds']:7.1f}  "
                     f"{row['error'] or ''}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="Run from anywhere; notebooks are found under " + str(ROOT))
    parser.add_argument("--only", action="append", metavar="GLOB",
                        help="run only the notebooks whose path from the repository matches, e.g. 'notebooks/01_*' "
                             "or 'solutions/ex0[1-3]_*' (repeatable)")
    parser.add_argument("--timeout", type=float, default=300, help="seconds for each whole notebook (default 300)")
    parser.add_argument("--json", type=Path, metavar="PATH", help="write meta, rows and summary there as JSON")
    parser.add_argument("--executed", type=Path, metavar="DIR",
                        help="also write each executed notebook (with its outputs) to DIR/<folder>/<name>")
    parser.add_argument("--in-place", action="store_true",
                        help="run in the notebook's own folder instead of a temporary copy of it")
    parser.add_argument("--list", action="store_true", help="print the notebooks that would run, and stop")
    parser.add_argument("--merge", nargs="+", type=Path, metavar="PART",
                        help="merge these parts' JSON files into --json, and stop (no notebook runs)")
    args = parser.parse_args(argv)
    if args.merge:
        if not args.json:
            parser.error("--merge needs --json for the merged file")
        merged = merge_parts([json.loads(part.read_text()) for part in args.merge], [p.name for p in args.merge])
        args.json.write_text(json.dumps(merged, indent=2) + "\n")
        print(table(merged["rows"]))
        print(f"\n{merged['summary']['passed']} passed, {merged['summary']['failed']} failed: {args.json}")
        return 1 if merged["summary"]["failed"] else 0

    notebooks = find_notebooks(ROOT, args.only)
    if args.list:
        print("\n".join(path.relative_to(ROOT).as_posix() for path in notebooks))
        return 0 if notebooks else 2
    if not notebooks:
        print(f"no notebook matches {args.only}", file=sys.stderr)
        return 2

    # The kernels (and what they start: the hidden tests' judge, the launchers) inherit this environment.
    if os.environ.get("PYTHONPATH"):
        os.environ["PYTHONPATH"] = absolute_pythonpath(Path.cwd())
    os.environ["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"
    os.environ.setdefault("JUPYTER_PLATFORM_DIRS", "1")
    spec_root = kernel_spec_dir(Path(tempfile.mkdtemp(prefix="gpu-notebooks-kernel-")))
    os.environ["JUPYTER_PATH"] = os.pathsep.join(filter(None, [str(spec_root), os.environ.get("JUPYTER_PATH")]))

    info = meta()
    print(f"[gpu_notebooks] {len(notebooks)} notebooks on {info['device']}: Python {info['python']} "
          f"({sys.executable}), torch {info['torch']}, triton {info['triton']}; {args.timeout:g} s each at most",
          flush=True)
    for warning in unmet_requirements():
        print(f"[gpu_notebooks] warning: {warning}", flush=True)
    problems = preflight()
    if problems:
        for problem in problems:
            print(f"[gpu_notebooks] cannot run: {problem}", file=sys.stderr, flush=True)
        return 2

    rows = []
    started = time.monotonic()
    for number, path in enumerate(notebooks, start=1):
        row = run_one(path, args.timeout, args.in_place, args.executed)
        rows.append(row)
        verdict = "ok    " if row["ok"] else "FAILED"
        print(f"[{number:2d}/{len(notebooks)}] {verdict} {row['seconds']:7.1f} s  {row['notebook']}"
              + ("" if row["ok"] else f"  {row['error']}"), flush=True)
        if args.json:  # rewritten after each notebook, so a run cut short still leaves its rows
            _write_json(args.json, info, rows, time.monotonic() - started)
    shutil.rmtree(spec_root, ignore_errors=True)

    summary = _summary(rows, time.monotonic() - started)
    print()
    print(table(rows))
    print(f"\n{summary['passed']} passed, {summary['failed']} failed in {summary['seconds']:.0f} s", flush=True)
    if args.json:
        _write_json(args.json, info, rows, summary["seconds"])
    return 1 if summary["failed"] else 0


def merge_parts(parts: list[dict], names: list[str]) -> dict:
    """One results file from several runs' files: per notebook the row of the last part that ran it, in the
    repository's order (lessons, then solutions), each row naming its part; ``meta`` is the first part's with
    ``parts`` listing every part's file, date and device."""
    latest: dict[str, dict] = {}
    for name, part in zip(names, parts, strict=True):
        for row in part["rows"]:
            latest[row["notebook"]] = {**row, "part": name}
    known = [path.relative_to(ROOT).as_posix() for path in find_notebooks(ROOT)]
    order = {notebook: index for index, notebook in enumerate(known)}
    rows = sorted(latest.values(), key=lambda row: (order.get(row["notebook"], len(order)), row["notebook"]))
    listed = [{"file": name, "date": part["meta"]["date"], "device": part["meta"]["device"],
               "notebooks": len(part["rows"])} for name, part in zip(names, parts, strict=True)]
    info = {**parts[0]["meta"], "parts": listed}
    info["missing"] = [notebook for notebook in known if notebook not in latest]
    summary = _summary(rows, sum(row["seconds"] for row in rows))
    return {"meta": info, "rows": rows, "summary": summary}


def _summary(rows: list[dict], seconds: float) -> dict:
    passed = sum(row["ok"] for row in rows)
    return {"passed": passed, "failed": len(rows) - passed, "seconds": round(seconds, 1)}


def _write_json(path: Path, info: dict, rows: list[dict], seconds: float) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"meta": info, "rows": rows, "summary": _summary(rows, seconds)}, indent=2) + "\n")


if __name__ == "__main__":
    sys.exit(main())
