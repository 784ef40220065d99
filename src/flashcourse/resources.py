"""Where the course's own files are: in the checkout, or in the copy that a wheel carries.

Lessons read two kinds of course files at run time: recorded GPU results (``benchmarks/results/*.json``) and,
for the interview bank's evidence, the lesson notebooks (``notebooks/*.ipynb``). Git holds one copy of each, at
the repository's root. Imported from a checkout (``pip install -e .``, or ``PYTHONPATH=src``), the package reads
them there, so a new benchmark run is seen at once. Installed from a wheel, the package cannot see any repository:
the build copies those files into the package (``flashcourse/_data/``, laid out as in the repository; setup.py
does it) and they are read through :mod:`importlib.resources`.

This module alone decides which case holds; every reader of course files asks it.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

__all__ = ["PACKAGED_DIR", "RESULTS", "checkout_root", "course_root", "new_results_dir", "recorded_results_dir"]

PACKAGED_DIR = "_data"  # the folder inside the package that setup.py fills when it builds a wheel
RESULTS = Path("benchmarks", "results")  # recorded GPU runs, relative to the course root


def checkout_root() -> Path | None:
    """The repository this package is imported from (``<root>/src/flashcourse``), or None when it is installed
    from a wheel or an sdist, where no repository surrounds it."""
    package = Path(__file__).resolve().parent
    root = package.parent.parent
    if package.parent.name == "src" and (root / "pyproject.toml").is_file():
        return root
    return None


def course_root() -> Path:
    """The folder holding ``notebooks/`` and ``benchmarks/results/`` as the repository lays them out: the checkout,
    or the installed package's copy. Paths in the question bank (``notebooks/09_beyond_fa2.ipynb``) are relative
    to it."""
    root = checkout_root()
    if root is not None:
        return root
    packaged = resources.files("flashcourse").joinpath(PACKAGED_DIR)
    # A wheel installed as files gives a real folder; a zipped install or a build that skipped setup.py does not.
    if not isinstance(packaged, Path) or not packaged.is_dir():
        raise FileNotFoundError(
            f"flashcourse is installed without its course files: expected the folder {packaged} (notebooks and "
            "recorded results, copied in by setup.py when the wheel is built). Reinstall from the repository "
            "(`pip install git+<its URL>`, or `pip install .` in a clone), which builds the wheel with them.")
    return packaged


def recorded_results_dir() -> Path:
    """Where recorded GPU results are read: ``benchmarks/results`` of the checkout, or the wheel's copy of it."""
    return course_root() / RESULTS


def new_results_dir() -> Path:
    """Where a new benchmark run is written unless told otherwise: ``benchmarks/results`` of the checkout (commit it
    there), or, installed from a wheel, ``benchmarks/results`` under the current folder: the installed package is
    no place to write, and lessons keep showing the recorded runs it ships."""
    root = checkout_root()
    return (root if root is not None else Path.cwd()) / RESULTS
