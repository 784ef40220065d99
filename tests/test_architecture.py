"""The import rules docs/ARCHITECTURE.md states, checked on the source: layers point down, GPU code stays
importable where Jupyter is not installed (and, in a fresh interpreter, with the core install alone), a module
that needs an extra names it, and nothing but the command line reaches into the grader."""

from __future__ import annotations

import ast
import functools
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from child_env import child_pythonpath

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "flashcourse"
NOTEBOOK_ONLY = {"ipywidgets", "IPython", "nbformat", "nbclient", "ipykernel"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """Every module a file imports, at the top or inside a function, relative imports made absolute."""
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names if base.startswith("flashcourse"))
    return found


MODULES = {module_name(p): imports_of(p) for p in sorted(PACKAGE.rglob("*.py"))}


def ours(imports: set[str]) -> set[str]:
    """Our modules named by an import set, as their top-level part under flashcourse (``kernels``, ``bench``...)."""
    return {name.split(".")[1] for name in imports if name.startswith("flashcourse.") and name.count(".") >= 1}


def in_package(prefix: str) -> dict[str, set[str]]:
    return {name: deps for name, deps in MODULES.items() if name == prefix or name.startswith(prefix + ".")}


def test_the_scan_sees_the_imports_it_judges():
    assert "flashcourse.kernels.common" in MODULES["flashcourse.kernels.forward"]
    assert "kernels" in ours(MODULES["flashcourse.bench.decode"])


def test_validation_imports_nothing_of_ours():
    """The one module that the reference and the kernels both import (the input rules they share)."""
    assert ours(MODULES["flashcourse.validation"]) == set()
    assert {d.split(".")[0] for d in MODULES["flashcourse.validation"]} <= set(sys.stdlib_module_names)


def test_reference_imports_nothing_of_ours_but_validation():
    assert ours(MODULES["flashcourse.reference"]) == {"validation"}


@pytest.mark.parametrize("name", ["flashcourse.tiled", "flashcourse.iomodel", "flashcourse.precision"])
def test_numpy_algorithms_build_only_on_reference(name):
    assert ours(MODULES[name]) <= {"reference"}, f"{name} imports {ours(MODULES[name])}"


def test_kernels_know_numpy_code_only_through_tests():
    allowed = {"kernels", "device", "validation"}
    for name, deps in in_package("flashcourse.kernels").items():
        assert ours(deps) <= allowed, f"{name} imports {ours(deps) - allowed}"


def test_the_kernel_library_imports_no_hopper_module():
    """Gluon's API moves between Triton releases: the library must import under a Triton without it. Only the
    plan imports ``hopper.fa3``, inside the function that runs on Hopper with a tested Triton."""
    for name, deps in MODULES.items():
        if name.startswith("flashcourse.kernels") and not name.startswith("flashcourse.kernels.hopper"):
            hopper = {d for d in deps if d.startswith("flashcourse.kernels.hopper")}
            if name == "flashcourse.kernels.plan":
                top = imports_of_top_level(PACKAGE / "kernels" / "plan.py")
                assert not {d for d in top if d.startswith("flashcourse.kernels.hopper")}, top
                continue
            assert not hopper, f"{name} imports {hopper}"


def imports_of_top_level(path: Path) -> set[str]:
    """The modules a file imports at its top level (not inside a function)."""
    package = module_name(path).rsplit(".", 1)[0]
    found = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package + (f".{node.module}" if node.module else "") if node.level == 1 else node.module or ""
            found.update({base} | {f"{base}.{alias.name}" for alias in node.names})
    return found


def test_teaching_kernels_take_only_the_shared_pieces_of_the_library():
    """forward.py and backward.py import the teaching versions for their registries, so a teaching module that
    imported them (or anything that does) would make a cycle."""
    for name, deps in in_package("flashcourse.kernels.teaching").items():
        library = {d for d in deps if d.startswith("flashcourse.kernels.") and not d.startswith(name)}
        allowed = {"flashcourse.kernels.common", "flashcourse.kernels.versions"}
        assert {d for d in library if not any(d == a or d.startswith(a + ".") for a in allowed)} == set(), name


@pytest.mark.parametrize("package", ["flashcourse.kernels", "flashcourse.bench", "flashcourse.distributed"])
def test_gpu_code_imports_no_notebook_package(package):
    """The GPU machine has no Jupyter: what runs there must import without it."""
    for name, deps in in_package(package).items():
        top = {d.split(".")[0] for d in deps}
        assert not top & NOTEBOOK_ONLY, f"{name} imports {top & NOTEBOOK_ONLY}"
        assert not ours(deps) & {"widgets", "grading", "interview"}, f"{name} imports {ours(deps)}"


def test_nothing_but_the_command_line_uses_the_grader():
    users = {name for name, deps in MODULES.items() if "grading" in ours(deps)}
    assert {u for u in users if not u.startswith("flashcourse.grading")} <= {"flashcourse.cli", "flashcourse.__main__"}


def test_widgets_are_used_by_notebooks_only():
    users = {name for name, deps in MODULES.items() if "widgets" in ours(deps) and name != "flashcourse.widgets"}
    assert users == set(), f"{users} import flashcourse.widgets"


# A fresh interpreter in which every package of the extras fails to import, as after `pip install flashcourse`.
EXTRAS_ONLY = ("matplotlib", "ipywidgets", "jupyterlab", "jupyter_server", "IPython", "ipykernel", "nbclient",
               "nbformat", "rich", "yaml", "genanki")
_CORE_ONLY = textwrap.dedent("""
    import importlib, importlib.abc, json, sys
    BLOCKED = set(sys.argv[1].split(","))
    class NotInstalled(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ImportError(f"No module named {name!r} (blocked: not in the core install)", name=name)
    sys.meta_path.insert(0, NotInstalled())
    outcome = {}
    for module in sys.argv[2:]:
        try:
            importlib.import_module(module)
            outcome[module] = None
        except ImportError as error:
            outcome[module] = str(error)
    print(json.dumps(outcome))
""")


@functools.cache
def _import_with_core_only(*modules: str) -> dict[str, str | None]:
    """module -> None where it imported, else its ImportError's message (one interpreter for all of them)."""
    env = {**os.environ, "PYTHONPATH": child_pythonpath()}
    done = subprocess.run([sys.executable, "-c", _CORE_ONLY, ",".join(EXTRAS_ONLY), *modules], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


CORE_MODULES = ["flashcourse.kernels", "flashcourse.bench", "flashcourse.bench.__main__", "flashcourse.distributed",
                "flashcourse.distributed.ring", "flashcourse.distributed.ulysses", "flashcourse.reference",
                "flashcourse.tiled", "flashcourse.iomodel", "flashcourse.tolerance", "flashcourse.cli"]
NEEDS_EXTRA = {"flashcourse.plots": "course", "flashcourse.widgets": "course", "flashcourse.figures_gpu": "course",
               "flashcourse.interview.quiz": "interview", "flashcourse.interview.terminal": "interview",
               "flashcourse.grading.release": "grading", "flashcourse.grading.batch": "grading"}


def test_the_core_install_imports_the_kernels_the_benchmarks_and_distributed():
    outcome = _import_with_core_only(*CORE_MODULES, *NEEDS_EXTRA)
    failed = {m: outcome[m] for m in CORE_MODULES if outcome[m] is not None}
    assert failed == {}, f"these need a package outside the core install (torch, triton, numpy): {failed}"


def test_a_module_that_needs_an_extra_names_it():
    outcome = _import_with_core_only(*CORE_MODULES, *NEEDS_EXTRA)
    for module, extra in NEEDS_EXTRA.items():
        assert outcome[module] is not None, f"{module} imported without its extra's packages: is it still needed?"
        assert f'pip install "flashcourse[{extra}]"' in outcome[module], f"{module}: {outcome[module]}"
