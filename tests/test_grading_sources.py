"""Each grading fact has one source, or a test that its copies agree. A part's points live in its `Part`
(grading/exNN.py) and in nbgrader's metadata of its check cell (solutions/exNN_*.ipynb, which nbgrader reads);
which check function lives in which module is indexed by hand in grading/__init__.py. Exercises are discovered
from the files, so a new exercise is checked without being listed here."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from flashcourse import grading

ROOT = Path(__file__).resolve().parents[1]
GRADING = ROOT / "src" / "flashcourse" / "grading"
SOLUTIONS = sorted((ROOT / "solutions").glob("ex[0-9]*.ipynb"))
MODULES = sorted(p.stem for p in GRADING.glob("ex[0-9]*.py"))
CHECK_CALL = re.compile(r"^\s*grading\.(\w+)\(", re.MULTILINE)


def _graded_cells(notebook: Path) -> list[tuple[dict, str]]:
    """(nbgrader metadata, source) of every graded cell."""
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    found = []
    for cell in cells:
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if meta.get("grade"):
            source = cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])
            found.append((meta, source))
    return found


def _top_level_functions(module: str) -> set[str]:
    tree = ast.parse((GRADING / f"{module}.py").read_text(encoding="utf-8"))
    return {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}


def test_every_solution_notebook_and_every_exercise_module_is_registered():
    assert SOLUTIONS and MODULES
    assert {p.stem for p in SOLUTIONS} == set(grading.EXERCISES), (
        "solutions/ and grading.EXERCISES must name the same exercises")
    assert set(MODULES) == set(grading.EXERCISES.values()), (
        "every grading/exNN.py must be an exercise of grading.EXERCISES, and every exercise must have one")
    for stem, module in grading.EXERCISES.items():
        assert stem.split("_")[0] == module, f"{stem} is graded by {module}: the numbers must match"


@pytest.mark.parametrize("notebook", SOLUTIONS, ids=lambda p: p.stem)
def test_the_notebooks_points_are_the_parts_points(notebook):
    in_notebook = {meta["grade_id"]: meta.get("points") for meta, _ in _graded_cells(notebook)}
    in_parts = {part.grade_id: part.points for part in grading.parts(notebook.stem)}
    assert in_notebook == in_parts, (
        f"{notebook.name}'s graded cells (grade_id: points, nbgrader's metadata) differ from the Parts of "
        f"grading/{grading.EXERCISES[notebook.stem]}.py: change both")


@pytest.mark.parametrize("notebook", SOLUTIONS, ids=lambda p: p.stem)
def test_each_graded_cell_calls_a_check_of_its_own_exercise(notebook):
    module = grading.EXERCISES[notebook.stem]
    for meta, source in _graded_cells(notebook):
        calls = CHECK_CALL.findall(source.split("### BEGIN HIDDEN TESTS")[0])
        assert calls, f"{notebook.name} {meta['grade_id']}: no grading.<check>(...) call in the visible cell"
        for name in calls:
            assert grading._CHECKS.get(name) == module, (
                f"{notebook.name} {meta['grade_id']} calls grading.{name}, which grading/__init__.py's _CHECKS "
                f"indexes under {grading._CHECKS.get(name)!r}, not {module!r}")


def test_the_check_index_names_every_check_where_it_is_defined():
    defined = {name: module for module in MODULES for name in _top_level_functions(module)
               if name.startswith("check_")}
    indexed = {name: module for name, module in grading._CHECKS.items() if name.startswith("check_")}
    assert indexed == defined, (
        "grading/__init__.py's _CHECKS must list every check_* function of grading/exNN.py under its module: "
        f"missing {sorted(set(defined) - set(indexed))}, stale {sorted(set(indexed) - set(defined))}, moved "
        f"{sorted(n for n in set(defined) & set(indexed) if defined[n] != indexed[n])}")
    for name, module in grading._CHECKS.items():
        assert name in _top_level_functions(module), f"_CHECKS names {name} in {module}, which does not define it"


def _table_rows() -> dict[str, tuple[list[int], int]]:
    """docs/GRADING.md's exercise table: stem -> (the parts' points in letter order, the total)."""
    rows = {}
    for line in (ROOT / "docs" / "GRADING.md").read_text(encoding="utf-8").splitlines():
        match = re.match(r"\|\s*`(ex\d+_\w+)`\s*\|([^|]*)\|\s*(\d+)\s*\|", line)
        if match:
            parts = re.split(r"\([a-z]\)", match[2])[1:]
            rows[match[1]] = ([int(re.findall(r"\d+", part)[-1]) for part in parts], int(match[3]))
    return rows


@pytest.mark.parametrize("notebook", SOLUTIONS, ids=lambda p: p.stem)
def test_the_grading_docs_table_states_the_parts_points(notebook):
    rows = _table_rows()
    assert notebook.stem in rows, f"docs/GRADING.md's table has no row for {notebook.stem}"
    points = [part.points for part in sorted(grading.parts(notebook.stem), key=lambda p: p.grade_id)]
    assert rows[notebook.stem] == (points, sum(points)), (
        f"docs/GRADING.md says {rows[notebook.stem]} for {notebook.stem}, the Parts give {points}, {sum(points)}")
