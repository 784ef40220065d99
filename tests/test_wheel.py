"""Installed from a wheel, away from any checkout, the lessons still find the course files they read.

The wheel is built the way `pip install git+...` and `python -m build` build it: an sdist from the working tree,
then the wheel from that sdist. pip installs it (not editable, with the course extra) into a fresh virtual
environment, offline; lessons 07 (recorded GPU results) and 10 (the interview bank's evidence) are copied to a
folder outside the repository and executed there by that environment's kernel.

The fresh environment gets its dependencies without a second download and copy of PyTorch (gigabytes, most of
this test's time): it sees a folder of links to exactly the distributions that the wheel's own metadata asks for
with the course extra (and nbclient and ipykernel, which run the lessons), followed transitively, as this test's
environment has them installed. Nothing else of this environment is there, the checkout's editable flashcourse
least of all, so a lesson that imports something outside the course extra fails here as it would for a learner.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from email.parser import Parser
from pathlib import Path

import nbformat
import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from flashcourse.interview import bank

ROOT = Path(__file__).resolve().parents[1]
LESSONS = ("07_triton_flash_forward.ipynb", "10_interview_walkthrough.ipynb")
KERNEL = "flashcourse-wheel"  # a kernel name of our own, so no python3 kernelspec elsewhere can stand in

# Appended to each copied lesson: where the kernel found the package and the course files.
PROBE = "import json, flashcourse, flashcourse.resources as r; " \
        "print(json.dumps({'package': flashcourse.__file__, 'course_root': str(r.course_root())}))"

# Run by the fresh environment's Python: registers its kernel, then executes each lesson in its own folder.
DRIVER = """
import sys
from pathlib import Path

import nbformat
from ipykernel.kernelspec import install
from nbclient import NotebookClient

install(prefix=sys.prefix, kernel_name=sys.argv[1])
for path in map(Path, sys.argv[2:]):
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=900, kernel_name=sys.argv[1], resources={"metadata": {"path": str(path.parent)}}
                   ).execute()
    nbformat.write(nb, path)
"""


def _cannot_run(reason: str) -> None:
    """Skip where this test truly cannot run; CI (CI=true) must run it, so there it fails instead."""
    if os.environ.get("CI"):
        pytest.fail(f"{reason}; CI must run the wheel test, so its machine needs that")
    pytest.skip(reason)


def _run(command: list, **kwargs) -> subprocess.CompletedProcess:
    done = subprocess.run(command, capture_output=True, text=True, **kwargs)
    if done.returncode != 0:
        pytest.fail(f"`{' '.join(map(str, command))}` exited {done.returncode}:\n{done.stdout[-4000:]}\n"
                    f"{done.stderr[-4000:]}")
    return done


def _needed_distributions(requirements: list[str], extras: set[str]) -> list[importlib.metadata.Distribution]:
    """The installed distributions these requirements pull in, transitively, as pip's resolver follows them: of
    each distribution's metadata, the requirements whose environment marker holds here for an extra asked of it."""
    needed: dict[str, importlib.metadata.Distribution] = {}
    followed: dict[str, set[str]] = {}  # name -> the extras ("" for none) whose requirements are already queued
    todo = [(Requirement(text), extras) for text in requirements]
    while todo:
        requirement, in_scope = todo.pop()
        if requirement.marker and not any(requirement.marker.evaluate({"extra": e}) for e in in_scope | {""}):
            continue
        name = canonicalize_name(requirement.name)
        new = {"", *requirement.extras} - followed.setdefault(name, set())
        if name not in needed:
            try:
                needed[name] = importlib.metadata.distribution(name)
            except importlib.metadata.PackageNotFoundError:
                pytest.fail(f"{requirement} is needed but not installed here: reinstall the dev extra")
        assert requirement.specifier.contains(needed[name].version, prereleases=True), (
            f"{requirement} is needed, this environment has {needed[name].version}")
        if new:
            followed[name] |= new
            todo += [(Requirement(text), new) for text in needed[name].requires or []]
    return list(needed.values())


def _link_folder(distributions: list[importlib.metadata.Distribution], folder: Path) -> None:
    """Links to every top-level file and folder (packages, modules, .dist-info, .pth) that these distributions
    installed into site-packages, per their RECORD; what they put elsewhere (scripts, share/) is left out."""
    folder.mkdir()
    for dist in distributions:
        site = Path(dist.locate_file(""))
        for top in {f.parts[0] for f in dist.files or [] if f.parts[0] != ".."}:
            if (site / top).exists() and not (folder / top).exists():
                (folder / top).symlink_to(site / top)


def _working_tree(destination: Path) -> None:
    """Copy what git would commit (tracked and new, not ignored files): no .venv, no build/, no egg-info."""
    listed = _run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=ROOT).stdout
    for name in filter(None, listed.split("\0")):
        if (ROOT / name).is_file():  # a tracked file deleted in the working tree is not part of it
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, destination / name)


def _output_text(cell) -> str:
    parts = []
    for output in cell.get("outputs", []):
        parts.append(output.get("text", ""))
        parts.extend(output.get("data", {}).get(kind, "") for kind in ("text/markdown", "text/plain"))
    return "\n".join(parts)


@pytest.mark.slow
@pytest.mark.notebooks
def test_lessons_run_from_an_installed_wheel_outside_the_repository(tmp_path: Path):
    if sys.platform != "linux":
        _cannot_run(f"lesson 07 needs Triton, which ships for Linux only (this is {sys.platform})")
    if shutil.which("git") is None:
        _cannot_run("git is not installed: the test builds from the files git would commit")
    try:
        import build  # noqa: F401  (the sdist-then-wheel builder of the dev extra)
    except ImportError:
        _cannot_run("the `build` package is missing: reinstall the dev extra, `pip install -e '.[dev]'`")
    timings = {}

    start = time.perf_counter()
    source, dist = tmp_path / "source", tmp_path / "dist"
    _working_tree(source)
    # --no-isolation: the setuptools of this environment builds, so no second download of it.
    _run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(dist), str(source)])
    wheel = next(dist.glob("*.whl"))
    with zipfile.ZipFile(wheel) as archive:
        shipped = set(archive.namelist())
        metadata = Parser().parsestr(archive.read(next(n for n in shipped if n.endswith(".dist-info/METADATA")))
                                     .decode())
    expected = {f"flashcourse/_data/{p.relative_to(ROOT).as_posix()}"
                for pattern in ("notebooks/*.ipynb", "benchmarks/results/*.json") for p in ROOT.glob(pattern)}
    assert expected <= shipped, f"the wheel lacks course files: {sorted(expected - shipped)}"
    timings["build"] = time.perf_counter() - start

    start = time.perf_counter()
    # Nothing of this environment may leak in: a PYTHONPATH holding the checkout would make pip think flashcourse
    # is installed already, and the kernel import it from there.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    venv = tmp_path / "venv"
    env.update(PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}",
               MPLBACKEND="module://matplotlib_inline.backend_inline")
    # Without pip (and, before Python 3.12, an old setuptools that would hide the one torch asks for): this
    # environment's pip installs into it with --python.
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], env=env)
    python = venv / "bin" / "python"
    # The course extra as the wheel declares it (a learner's `pip install "flashcourse[course]"`: the core install
    # alone has no matplotlib, ipywidgets or PyYAML, which the lessons use), reached through a .pth file that adds
    # the folder of links as a site folder (its own .pth files run), after the fresh environment's site-packages.
    needed = _needed_distributions([*metadata.get_all("Requires-Dist", []), "nbclient", "ipykernel"], {"course"})
    assert "flashcourse" not in {canonicalize_name(d.metadata["Name"]) for d in needed}
    _link_folder(needed, tmp_path / "dependencies")
    site_packages = next(venv.glob("lib/python*/site-packages")).resolve()
    (site_packages / "course_dependencies.pth").write_text(
        f"import site; site.addsitedir({str(tmp_path / 'dependencies')!r})\n")
    # --no-index: pip finds every requirement of the wheel among the linked distributions, or fails; nothing is
    # downloaded.
    _run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-index",
          f"flashcourse[course] @ {wheel.as_uri()}", "nbclient", "ipykernel"], env=env)
    timings["install"] = time.perf_counter() - start

    start = time.perf_counter()
    lessons = tmp_path / "elsewhere"
    lessons.mkdir()
    assert ROOT not in lessons.parents
    for name in LESSONS:
        nb = nbformat.read(ROOT / "notebooks" / name, as_version=4)
        nb.cells.append(nbformat.v4.new_code_cell(PROBE))
        nbformat.write(nb, lessons / name)
    _run([python, "-c", DRIVER, KERNEL, *(str(lessons / name) for name in LESSONS)], cwd=lessons, env=env)
    timings["lessons"] = time.perf_counter() - start
    print("wheel test, seconds per stage:", {k: round(v) for k, v in timings.items()})

    executed = {name: nbformat.read(lessons / name, as_version=4) for name in LESSONS}
    for name, nb in executed.items():
        probe = json.loads(_output_text(nb.cells[-1]))
        for what, path in probe.items():
            assert Path(path).resolve().is_relative_to(site_packages), (
                f"{name}: the kernel found the {what} at {path}, not in the fresh environment {site_packages}")

    lesson_07 = "\n".join(_output_text(cell) for cell in executed[LESSONS[0]].cells)
    assert "No recorded" not in lesson_07, "lesson 07 found no recorded GPU results in the installed package"
    for pattern in ("*-versions.json", "*-attention-fp16.json"):  # lesson 07's tables: versions, fp16 D=128 grid
        newest = sorted(ROOT.glob(f"benchmarks/results/{pattern}"))[-1].name
        assert newest in lesson_07, f"lesson 07 does not show the recorded {newest}"

    # The checkout renders the table from its own files; the wheel's copy must give the same Markdown.
    table = bank.render_evidence_table(bank.load(), "en")
    lesson_10 = [_output_text(cell) for cell in executed[LESSONS[1]].cells]
    assert any(table in text for text in lesson_10), "lesson 10 did not render the evidence table from the wheel"
