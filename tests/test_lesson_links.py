"""A link to an exercise, from a lesson or from another exercise, has plain words as its text, never inline code.

JupyterLab draws inline code black even inside a link, so a link written as [`ex01.ipynb`](...) does not look
like a link at all: the learner never finds the exercise.
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
LESSONS = sorted((ROOT / "notebooks").glob("*.ipynb"))
# The exercises link each other too (exercise 12 and its drill without hints); solutions/ is where they are written.
EXERCISES = sorted(p for folder in ("solutions", "exercises") for p in (ROOT / folder).glob("ex*.ipynb"))

# An inline Markdown link: [text](target) or [text](target "title"). Link text here never nests brackets.
LINK = re.compile(r"\[([^\[\]]*)\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
EXERCISE_TARGET = re.compile(r"(^|/)ex\d+\w*\.ipynb(#.*)?$")


def exercise_links_written_as_code(markdown: str) -> list[str]:
    """The links in `markdown` that lead to an exercise notebook and have inline code in their text."""
    return [link.group(0) for link in LINK.finditer(markdown)
            if EXERCISE_TARGET.search(link.group(2)) and "`" in link.group(1)]


def test_the_check_finds_code_in_exercise_links_and_only_there():
    found = exercise_links_written_as_code(
        "Write it: [`../exercises/ex01_naive_attention.ipynb`](../exercises/ex01_naive_attention.ipynb).\n"
        "Also [the drill, `ex12`](../exercises/ex12_from_memory.ipynb#timer \"timed\") and\n"
        "[exercise 03, the tiled forward](../exercises/ex03_tiled_forward.ipynb), "
        "[`softmax`](https://example.org/softmax.html), `ex02_softmax.ipynb` unlinked.")
    assert found == ["[`../exercises/ex01_naive_attention.ipynb`](../exercises/ex01_naive_attention.ipynb)",
                     "[the drill, `ex12`](../exercises/ex12_from_memory.ipynb#timer \"timed\")"]


def test_there_are_lessons_and_exercises_to_check():
    assert len(LESSONS) >= 10, f"found only {len(LESSONS)} lessons under notebooks/"
    assert len(EXERCISES) >= 20, f"found only {len(EXERCISES)} notebooks under solutions/ and exercises/"


@pytest.mark.parametrize("path", LESSONS + EXERCISES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_exercise_links_are_plain_words(path: Path):
    nb = nbformat.read(path, as_version=4)
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "markdown":
            continue
        bad = exercise_links_written_as_code(cell.source)
        assert not bad, (
            f"{path.relative_to(ROOT)} cell {index}: JupyterLab draws inline code black, so this exercise link does "
            f"not look like a link; write its text as plain words, e.g. [exercise 03, the tiled forward](...): {bad}")
