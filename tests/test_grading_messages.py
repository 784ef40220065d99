"""What a failing check says: a stub points at the function that holds its `# TODO`, and a wrong answer's
message is short lines with the diagnosis first."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import nbformat
import numpy as np
import pytest

from flashcourse import grading

ROOT = Path(__file__).resolve().parents[1]
# The stub `release` writes: raise NotImplementedError("<function>: fill in the TODO above (about N lines)")
STUB = re.compile(r'raise NotImplementedError\("(\w+): fill in the TODO above')


def _stub_functions(exercise: str) -> list[str]:
    """The functions of an exercise notebook, as handed out, that hold a stub."""
    nb = nbformat.read(ROOT / "exercises" / f"{exercise}.ipynb", as_version=4)
    return [name for cell in nb.cells if cell.cell_type == "code" for name in STUB.findall(cell.source)]


def _calls_a_stub(stub: str):
    """A learner's function as handed out: it runs until a helper of it, ``stub``, raises its stub's error."""
    message = f"{stub}: fill in the TODO above (about 3 lines)"

    def helper(*args, **kwargs):
        raise NotImplementedError(message)

    def learner_function(*args, **kwargs):
        return helper(*args, **kwargs)

    return learner_function


def _triton_calls_a_stub(stub: str, folder: Path):
    """The same as a Triton function (a mask_mod), which Triton reads from a source file."""
    path = folder / "learner_mask.py"
    path.write_text("import triton\n"
                    "import triton.language as tl  # noqa: F401 - the interpreter looks it up\n\n\n"
                    "@triton.jit\ndef learner_function(b, h, q_idx, kv_idx):\n"
                    f'    raise NotImplementedError("{stub}: fill in the TODO above (about 1 line)")\n')
    spec = importlib.util.spec_from_file_location("learner_mask", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.learner_function


TRITON_FUNCTION_PARTS = {"ex10_d"}  # the check refuses a plain Python function
PARTS = [(exercise, part) for exercise in grading.EXERCISES for part in grading.parts(exercise)]


@pytest.mark.parametrize(("exercise", "part"), PARTS, ids=[f"{e}-{p.grade_id}" for e, p in PARTS])
def test_every_stub_names_the_function_that_holds_its_todo(exercise, part, tmp_path):
    stubs = _stub_functions(exercise)
    assert stubs, f"{exercise} as handed out has no stub"
    # The part's own function is what the check calls; the TODO may sit in a helper it calls (ex07's inner loop
    # under the launcher): the message must name the stub's function, whichever it is.
    stub = next((name for name in stubs if name not in part.functions), stubs[0])
    make = _calls_a_stub if part.grade_id not in TRITON_FUNCTION_PARTS else \
        (lambda name: _triton_calls_a_stub(name, tmp_path))
    functions = {name: make(stub) for name in part.functions}
    with pytest.raises(grading.NotImplementedYet) as raised:
        grading.run_check(part, functions, seed=0)
    message = str(raised.value)
    assert f"`{stub}`" in message, f"{part.label}: the message does not name {stub}: {message}"
    others = set(part.functions) - {stub}
    assert not any(f"`{name}`" in message for name in others), message


def test_a_stub_without_the_release_message_still_says_what_to_fill_in():
    def attention_scores(q, k, scale=None):
        raise NotImplementedError("fill me in")

    with pytest.raises(grading.NotImplementedYet, match="not implemented yet") as raised:
        grading.check_attention_scores(attention_scores)
    assert "attention_scores" in str(raised.value) and "# TODO" in str(raised.value)


def test_a_wrong_answer_puts_the_diagnosis_first_in_short_lines():
    def unscaled(q, k, scale=None):  # the usual mistake: the scale is forgotten
        return q @ np.swapaxes(k, -1, -2)

    with pytest.raises(AssertionError) as raised:
        grading.check_attention_scores(unscaled, seed=0)
    lines = str(raised.value).splitlines()
    assert lines[0].startswith("ex01 (a) failed. Diagnosis: the scale is forgotten"), lines
    assert any("differs at index" in line for line in lines[1:]), lines
    assert lines[-1].strip().startswith("case 1 of"), lines
    assert all(len(line) <= 120 for line in lines), [len(line) for line in lines]


def test_a_wrong_answer_without_a_diagnosis_leads_with_what_differs():
    def off_by_one(q, k, scale=None):
        scale = 1 / np.sqrt(q.shape[-1]) if scale is None else scale
        return q @ np.swapaxes(k, -1, -2) * scale + 1.0

    with pytest.raises(AssertionError) as raised:
        grading.check_attention_scores(off_by_one, seed=0)
    lines = str(raised.value).splitlines()
    assert re.match(r"ex01 \(a\) failed: the scores differs at index \[[\d, ]+\]: yours", lines[0]), lines
    assert "entries off" in lines[1] and lines[-1].strip().startswith("case 1 of"), lines
