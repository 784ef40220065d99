"""Exercises are generated from solutions: in sync, without a solution line, solutions pass every check, stubs
fail every check with the not-implemented message (not a crash)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import nbformat
import pytest
from grading_attacks import BLANKET_PATCH

from flashcourse.grading import release

ROOT = Path(__file__).resolve().parents[1]
SOLUTIONS = sorted((ROOT / "solutions").glob("ex*.ipynb"))
NAMES = [p.name for p in SOLUTIONS]
LESSON_LINK_NAMES = ["ex01_naive_attention", "ex02_softmax", "ex03_tiled_forward", "ex04_io", "ex05_backward",
                     "ex06_triton_softmax", "ex07_triton_forward", "ex08_triton_backward", "ex09_decode_combine"]
LATER_LESSON_LINKS = {10: "ex12_from_memory", 11: "ex10_mask_rules",
                      12: "ex11_ring_schedule", 13: "ex13_warp_schedule",
                      14: "ex16_fa4_softmax"}  # lesson -> exercise, past the run above
DRILL_VARIANTS = ["ex12_from_memory_no_hints"]  # the same checks as an exercise above, linked from that exercise
MORE_LESSON_LINKS = [(10, "ex14_interview_code"), (10, "ex15_handwritten_kernels")]  # (lesson, another exercise)


def _grade_cells(nb):
    return [c for c in nb.cells if c.cell_type == "code" and c.metadata.get("nbgrader", {}).get("grade")]


def _execute(path: Path, *, allow_errors: bool):
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    env = dict(os.environ)
    os.environ["MPLBACKEND"] = "agg"
    try:
        NotebookClient(nb, timeout=600, kernel_name="python3", allow_errors=allow_errors,
                       resources={"metadata": {"path": str(path.parent)}}).execute()
    finally:
        os.environ.clear()
        os.environ.update(env)
    return nb


def test_every_exercise_has_its_solution_source():
    assert NAMES == sorted(f"{name}.ipynb" for name in [*LESSON_LINK_NAMES, *LATER_LESSON_LINKS.values(),
                                                         *(name for _, name in MORE_LESSON_LINKS), *DRILL_VARIANTS])
    assert sorted(p.name for p in (ROOT / "exercises").glob("ex*.ipynb")) == NAMES


def test_committed_exercises_equal_a_fresh_release():
    stale = release.release(ROOT / "solutions", ROOT / "exercises", check=True)
    assert not stale, f"run `python -m flashcourse.grading release`: out of date: {stale}"


@pytest.mark.parametrize("name", NAMES)
def test_no_solution_line_and_no_hidden_test_in_the_exercise(name):
    solution = nbformat.read(ROOT / "solutions" / name, as_version=4)
    exercise_text = (ROOT / "exercises" / name).read_text()
    exercise = nbformat.read(ROOT / "exercises" / name, as_version=4)
    public, secret = set(), set()
    for cell in solution.cells:
        region = None
        for line in cell.source.split("\n"):
            if "### BEGIN SOLUTION" in line or "### BEGIN HIDDEN TESTS" in line:
                region = line
            elif "### END SOLUTION" in line or "### END HIDDEN TESTS" in line:
                region = None
            elif line.strip():
                (secret if region else public).add(line.strip())
    exercise_lines = {line.strip() for cell in exercise.cells for line in cell.source.split("\n")}
    leaked = (secret - public) & exercise_lines
    assert not leaked, f"{name}: solution lines in the exercise: {sorted(leaked)[:5]}"
    for marker in ("BEGIN SOLUTION", "END SOLUTION", "HIDDEN TESTS", "hidden=True"):
        assert marker not in exercise_text
    assert len(_grade_cells(exercise)) == len(_grade_cells(solution)) >= 2
    for cell in exercise.cells:
        assert cell.cell_type != "code" or (not cell.outputs and cell.execution_count is None)


def test_release_replaces_regions_with_a_stub_and_rejects_unpaired_markers():
    source = ("def f(x):\n    # TODO (about 2 lines): double it\n    ### BEGIN SOLUTION\n    y = 2 * x\n"
              "    return y\n    ### END SOLUTION\ncheck(f)\n### BEGIN HIDDEN TESTS\ncheck(f, hidden=True)\n"
              "### END HIDDEN TESTS")
    stripped = release.strip_solutions(source, code=True, where="test")
    assert stripped == ("def f(x):\n    # TODO (about 2 lines): double it\n"
                        '    raise NotImplementedError("f: fill in the TODO above (about 2 lines)")\ncheck(f)')
    with pytest.raises(release.ReleaseError, match="never closed"):
        release.strip_solutions("### BEGIN SOLUTION\nx = 1", code=True, where="test")
    with pytest.raises(release.ReleaseError, match="without its BEGIN"):
        release.strip_solutions("x = 1\n### END SOLUTION", code=True, where="test")


@pytest.mark.notebooks
@pytest.mark.parametrize("name", NAMES)
def test_solution_passes_all_its_checks(name):
    nb = _execute(ROOT / "solutions" / name, allow_errors=False)
    for cell in _grade_cells(nb):
        text = "".join(out.get("text", "") for out in cell.outputs if out.output_type == "stream")
        assert "passed all" in text and "hidden tests" in text, f"{cell.metadata['nbgrader']['grade_id']}: {text}"


@pytest.mark.notebooks
@pytest.mark.parametrize("name", NAMES)
def test_fresh_exercise_runs_and_every_check_says_not_implemented(name, tmp_path):
    solution = nbformat.read(ROOT / "solutions" / name, as_version=4)
    fresh = tmp_path / name
    fresh.write_text(release.render(release.release_notebook(solution, name)))
    nb = _execute(fresh, allow_errors=True)
    stubs = {fn for cell in nb.cells for fn in re.findall(r'NotImplementedError\("(\w+): fill in', cell.source)}
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        errors = [out for out in cell.outputs if out.output_type == "error"]
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        if cell in _grade_cells(nb):
            assert len(errors) == 1, f"{grade_id}: expected the check to fail"
            assert errors[0].ename == "NotImplementedYet" and "not implemented yet" in errors[0].evalue, (
                f"{grade_id}: expected the not-implemented message, got {errors[0].ename}: {errors[0].evalue}")
            named = re.findall(r"`(\w+)`", errors[0].evalue)
            assert named and set(named) <= stubs, (
                f"{grade_id}: the message should name a function that holds a stub ({sorted(stubs)}): "
                f"{errors[0].evalue}")
        else:
            assert not errors, f"{name} cell {grade_id} crashed: {errors[0].ename}: {errors[0].evalue}"


def test_each_lesson_links_its_exercise_and_every_exercise_link_resolves():
    lessons = sorted((ROOT / "notebooks").glob("*.ipynb"))
    for number, name in [*enumerate(LESSON_LINK_NAMES, start=1), *LATER_LESSON_LINKS.items(),
                         *MORE_LESSON_LINKS]:
        lesson = [p for p in lessons if p.name.startswith(f"{number:02d}_")]
        assert lesson, f"no lesson {number:02d} in notebooks/"
        assert f"../exercises/{name}.ipynb" in lesson[0].read_text(), f"{lesson[0].name} does not link {name}"
    for path in lessons:
        for link in re.findall(r"\.\./exercises/([\w.-]+\.ipynb)", path.read_text()):
            assert (ROOT / "exercises" / link).exists(), f"{path.name} links a missing exercise: {link}"


# A hidden-test cell as the solutions write it.
HIDDEN_CELL = ("import runpy\n"
               "hidden_test = runpy.run_module('flashcourse.grading.fresh_copy')['fresh_hidden_test']()\n"
               "hidden_test('{grade_id}', {function}={function})")


def test_hidden_tests_reach_an_untouched_judge_when_every_grading_function_is_replaced(tmp_path):
    """The blanket patch (grading_attacks.py) makes the old entry (importing fresh_judge.hidden_test) pass a stub;
    the hidden cell's fresh copy of the grading package still fails it, and still passes a right answer."""
    stub = ("import numpy as np\n"  # unscaled: wrong
            "def attention_scores(q, k, scale=None):\n    return q @ np.swapaxes(k, -1, -2)")
    right = ("def attention_scores(q, k, scale=None):\n"
             "    return q @ np.swapaxes(k, -1, -2) * (1 / np.sqrt(q.shape[-1]) if scale is None else scale)")
    old_entry = ("from flashcourse.grading.fresh_judge import hidden_test\n"
                 "hidden_test('ex01_a', attention_scores=attention_scores)")
    cells = [BLANKET_PATCH, stub, old_entry, HIDDEN_CELL.format(grade_id="ex01_a", function="attention_scores"),
             right, HIDDEN_CELL.format(grade_id="ex01_a", function="attention_scores")]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source) for source in cells])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    path = tmp_path / "blanket.ipynb"
    nbformat.write(nb, path)
    executed = _execute(path, allow_errors=True).cells
    failed = [any(out.output_type == "error" for out in cell.outputs) for cell in executed]
    assert failed == [False, False, False, True, False, False], failed  # the old entry was fooled; the new one not
    assert "passed all hidden tests" in "".join(out.get("text", "") for out in executed[2].outputs)
    assert "passed all" in "".join(out.get("text", "") for out in executed[5].outputs)


def test_a_failing_check_shows_its_cell_not_the_grader_and_keep_going_spares_only_the_visible_checks(tmp_path):
    stub = "def attention_scores(q, k, scale=None):\n    raise NotImplementedError('fill me in')"
    check = "grading.check_attention_scores(attention_scores)"
    hidden = HIDDEN_CELL.format(grade_id="ex01_a", function="attention_scores")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source) for source in (
        "from flashcourse import grading", stub, check, "grading.keep_going()", check, hidden)])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    path = tmp_path / "keep_going.ipynb"
    nbformat.write(nb, path)
    cells = _execute(path, allow_errors=True).cells
    errors = [[out for out in cell.outputs if out.output_type == "error"] for cell in cells]
    assert [bool(e) for e in errors] == [False, False, True, False, False, True]
    shown = "\n".join(errors[2][0].traceback)
    assert "not implemented yet" in shown and check in shown
    assert "_core.py" not in shown and "run_check" not in shown
    printed = "".join(out.get("text", "") for out in cells[4].outputs)
    assert "FAILED (NotImplementedYet)" in printed and "not implemented yet" in printed
    assert errors[5][0].ename == "NotImplementedYet"  # the hidden test ignores keep_going
