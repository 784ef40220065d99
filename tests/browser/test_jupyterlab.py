"""The course as a learner meets it: JupyterLab in a real (headless) browser.

Opens lesson 02, runs all its cells from the Run menu, steps the online-softmax stepper forward and checks each
number it shows against ``reference.softmax_online_steps`` on the same row; then opens exercise 02, runs it
as handed out (the stub not filled in) and reads the feedback of its check.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import nbformat
import numpy as np
import pytest

from flashcourse import reference, tolerance

from .conftest import ROOT, SCREENSHOTS

pytestmark = pytest.mark.browser

LESSON = "notebooks/02_softmax.ipynb"
EXERCISE = "exercises/ex02_softmax.ipynb"
RUN_ALL_TIMEOUT_MS = 150_000
UI_TIMEOUT_MS = 30_000
STEPS_TO_CLICK = 3
# Typed into a new cell at the end of lesson 02: the row each stepper in the kernel walks over, and where it is.
PROBE_CODE = (
    "import gc, json; from flashcourse.widgets import OnlineSoftmaxStepper as _Stepper; "
    "print('FC-PROBE', json.dumps([{'x': s.x.tolist(), 'dtype': str(s.x.dtype), 'index': s.index} "
    "for s in gc.get_objects() if isinstance(s, _Stepper)]))"
)


def require(relative_path: str) -> None:
    if not (ROOT / relative_path).exists():
        pytest.skip(f"{relative_path} does not exist yet")


def open_notebook(page, lab_server, relative_path: str):
    """Open a notebook in JupyterLab and wait until its kernel is idle; returns the notebook panel."""
    page.goto(lab_server.notebook_url(relative_path))
    panel = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden)")
    panel.locator(".jp-Notebook .jp-Cell").first.wait_for(timeout=UI_TIMEOUT_MS)
    wait_for_idle_kernel(page)
    return panel


KERNEL_IDLE_JS = """() => {
    const panel = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden)');
    const kernel = panel?.querySelector('.jp-Toolbar-kernelName')?.textContent.trim();
    const status = panel?.querySelector('.jp-Notebook-ExecutionIndicator')?.dataset.status;
    return kernel && kernel !== 'No Kernel' && status === 'idle';
}"""


def wait_for_idle_kernel(page) -> None:
    """Wait until the notebook has a kernel (the indicator also says idle before one is connected) at rest."""
    page.wait_for_function(KERNEL_IDLE_JS, timeout=UI_TIMEOUT_MS)


def run_menu(page, item: str) -> None:
    """Click Run in the menu bar, then ``item``, as a learner does."""
    page.locator(".lm-MenuBar-item", has_text=re.compile(r"^Run$")).click()
    page.get_by_role("menuitem", name=re.compile(rf"^{re.escape(item)}")).first.click()


def input_prompts(panel) -> list[str]:
    return [text.strip() for text in panel.locator(".jp-CodeCell .jp-InputPrompt").all_inner_texts()]


STARTED_JS = """() => {
    const panel = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden)');
    const prompts = [...panel.querySelectorAll('.jp-CodeCell .jp-InputPrompt')].map(p => p.textContent);
    return prompts.some(p => /\\[(\\*|\\d+)\\]/.test(p));
}"""


def run_all_cells(page, panel) -> None:
    """Run every cell and wait until the kernel has finished them all (or stopped at an error).

    The Run menu acts on the notebook that last had focus, which after a reload can be another (restored) tab, so
    the panel is clicked first; and right after a notebook opens JupyterLab can ignore the command while its
    session settles, so the click is repeated (a few times at most) until a cell has started.
    """
    from playwright.sync_api import TimeoutError as PlaywrightTimeoutError

    for attempt in range(3):
        panel.locator(".jp-Cell").first.locator(".jp-InputPrompt").click()  # focus this notebook, command mode
        run_menu(page, "Run All Cells")
        try:
            page.wait_for_function(STARTED_JS, timeout=10_000)
            break
        except PlaywrightTimeoutError:
            if attempt == 2:
                raise
    page.wait_for_function(
        """() => {
            const panel = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden)');
            const prompts = [...panel.querySelectorAll('.jp-CodeCell .jp-InputPrompt')].map(p => p.textContent);
            return !prompts.some(p => p.includes('*'));
        }""", timeout=RUN_ALL_TIMEOUT_MS)
    wait_for_idle_kernel(page)


def run_new_cell(page, panel, code: str, marker: str) -> str:
    """Add a cell at the end, type ``code`` into it, run it (Ctrl+Enter) and return the text of its output,
    which must contain ``marker``."""
    panel.locator(".jp-Cell").last.locator(".jp-InputPrompt").click()  # select the last cell, command mode
    page.keyboard.press("Escape")
    page.keyboard.press("b")  # insert a cell below
    page.keyboard.press("Enter")  # edit it
    page.keyboard.insert_text(code)
    page.keyboard.press("Control+Enter")
    output = panel.locator(".jp-OutputArea-output", has_text=marker)
    output.wait_for(timeout=UI_TIMEOUT_MS)
    return output.inner_text()


def shown_number(field) -> tuple[float, float]:
    """A readout field's exact value (data-value) and the rounded number a learner reads."""
    return float(json.loads(field.get_attribute("data-value"))), float(field.inner_text())


def test_lesson_02_stepper_shows_the_online_softmax_states(page, lab_server):
    require(LESSON)
    panel = open_notebook(page, lab_server, LESSON)
    run_all_cells(page, panel)
    prompts = input_prompts(panel)
    assert all(re.fullmatch(r"\[\d+\]:", prompt) for prompt in prompts), (
        f"not every cell of {LESSON} ran in JupyterLab (prompts {prompts}): see build/screenshots/")
    errors = panel.locator(".jp-OutputArea-output", has_text="Traceback (most recent call last)")
    assert errors.count() == 0, f"{LESSON} shows a traceback in JupyterLab: {errors.first.inner_text()[:2000]}"
    page.screenshot(path=str(SCREENSHOTS / "lab-02-run-all.png"))

    # The HTML widget that holds the readout: it stays while each step replaces the readout inside it.
    readout = panel.locator(".widget-html", has=page.locator(".fc-readout")).first
    readout.wait_for(timeout=UI_TIMEOUT_MS)
    stepper = readout.locator("xpath=ancestor::div[contains(concat(' ', @class, ' '), ' widget-vbox ')][1]")
    stepper.scroll_into_view_if_needed()
    stepper.screenshot(path=str(SCREENSHOTS / "lab-02-stepper-step0.png"))
    first_block = readout.locator(".fc-block").get_attribute("data-value")
    start, stop = (int(bound) for bound in first_block.split(":"))
    block = stop - start

    shown = [read_stepper(readout)]
    picture = stepper.locator(".widget-image")
    next_button = stepper.get_by_role("button", name="Next")
    for click in range(1, STEPS_TO_CLICK + 1):
        picture_before = picture.get_attribute("src")
        next_button.click()
        # The kernel answers with the new readout, then the new picture: wait for both.
        page.wait_for_function(
            "([readout, picture, step, before]) => readout.querySelector('.fc-step')?.dataset.value === step"
            " && picture.getAttribute('src') !== before",
            arg=[readout.element_handle(), picture.element_handle(), str(click), picture_before],
            timeout=UI_TIMEOUT_MS)
        shown.append(read_stepper(readout))
        stepper.screenshot(path=str(SCREENSHOTS / f"lab-02-stepper-step{click}.png"))

    probe = run_new_cell(page, panel, PROBE_CODE, "FC-PROBE")
    steppers = json.loads(probe.split("FC-PROBE", 1)[1])
    clicked = [s for s in steppers if s["index"] == STEPS_TO_CLICK]
    assert len(clicked) == 1, f"expected one stepper at step {STEPS_TO_CLICK} in the kernel, found {steppers}"
    x = np.asarray(clicked[0]["x"], dtype=clicked[0]["dtype"])
    expected = list(reference.softmax_online_steps(x, block))
    assert len(expected) > STEPS_TO_CLICK, f"the stepper's row has only {len(expected)} blocks of {block}"

    for index, state in enumerate(shown):
        want = expected[index]
        assert state["step"] == index
        assert state["block"] == f"{want.start}:{want.stop}"
        for name in ("m", "l", "rescale", "block_max", "m_prev", "l_prev"):
            exact, rounded = state[name]
            tolerance.assert_close(np.float64(exact), np.float64(getattr(want, name)), dtype=x.dtype,
                                   what=f"{name} at step {index}")
            np.testing.assert_allclose(rounded, getattr(want, name), rtol=1e-5, atol=1e-12,
                                       err_msg=f"{name} as shown at step {index}")
    changed = [(shown[i]["m"], shown[i]["l"]) != (shown[i - 1]["m"], shown[i - 1]["l"]) for i in range(1, len(shown))]
    assert any(changed), f"the stepper showed the same m and l at every step: {shown}"
    page.screenshot(path=str(SCREENSHOTS / "lab-02-after-steps.png"))


def read_stepper(readout) -> dict:
    """Every number the stepper's readout shows now."""
    fields = {"m": ".fc-m", "l": ".fc-l", "rescale": ".fc-rescale", "block_max": ".fc-block-max",
              "m_prev": ".fc-m-prev", "l_prev": ".fc-l-prev"}
    state = {name: shown_number(readout.locator(selector)) for name, selector in fields.items()}
    state["step"] = int(readout.locator(".fc-step").get_attribute("data-value"))
    state["block"] = readout.locator(".fc-block").get_attribute("data-value")
    return state


def replace_and_run(page, panel, definition_index: int, code: str) -> None:
    """Replace the code of cell ``definition_index`` with ``code`` (as a learner types over the stub), run it,
    then run the check cell below it (Shift+Enter twice)."""
    editor = panel.locator(".jp-Cell").nth(definition_index).locator(".cm-content")
    editor.click()
    page.keyboard.press("Control+a")
    page.keyboard.insert_text(code)
    page.keyboard.press("Shift+Enter")
    page.keyboard.press("Shift+Enter")


def check_output(page, panel, check_index: int, expected_text: str) -> str:
    """Wait until the check cell's output contains ``expected_text``; return the whole output."""
    output = panel.locator(".jp-Cell").nth(check_index).locator(".jp-OutputArea")
    output.get_by_text(expected_text).first.wait_for(timeout=UI_TIMEOUT_MS)
    wait_for_idle_kernel(page)
    return output.inner_text()


def test_exercise_02_check_gives_feedback(page, lab_server):
    require(EXERCISE)
    cells = nbformat.read(ROOT / EXERCISE, as_version=4).cells
    check_index = next(i for i, cell in enumerate(cells) if cell.source.startswith("grading.check_"))
    definition_index = check_index - 1
    function = re.match(r"def (\w+)", cells[definition_index].source).group(1)
    solution = next(cell.source for cell in nbformat.read(ROOT / "solutions" / Path(EXERCISE).name,
                                                          as_version=4).cells
                    if cell.source.startswith(f"def {function}("))

    panel = open_notebook(page, lab_server, EXERCISE)
    run_all_cells(page, panel)  # stops at the first check: the stub is not filled in
    feedback = check_output(page, panel, check_index, "not implemented yet")
    assert "fill in" in feedback.lower() and f"`{function}`" in feedback, (
        f"the stub's feedback does not say what to fill in: {feedback}")
    panel.locator(".jp-Cell").nth(check_index).scroll_into_view_if_needed()
    page.screenshot(path=str(SCREENSHOTS / "lab-ex02-stub-feedback.png"))

    # The classic mistake: exp without subtracting the max overflows for large scores.
    replace_and_run(page, panel, definition_index, NAIVE_SOFTMAX.replace("softmax_safe", function))
    feedback = check_output(page, panel, check_index, "Diagnosis")
    assert "NaN" in feedback and "max" in feedback, f"the feedback on the overflow mistake is unclear: {feedback}"
    page.screenshot(path=str(SCREENSHOTS / "lab-ex02-mistake-feedback.png"))

    replace_and_run(page, panel, definition_index, solution)
    check_output(page, panel, check_index, "passed all")
    page.screenshot(path=str(SCREENSHOTS / "lab-ex02-solution-passes.png"))


NAIVE_SOFTMAX = """def softmax_safe(x):
    e = np.exp(x)
    return e / e.sum(axis=-1, keepdims=True)"""


EXERCISE_LINKS_JS = """() => [...document.querySelectorAll(
        '.jp-NotebookPanel:not(.lm-mod-hidden) .jp-MarkdownCell a[href*="exercises/"]')].map(a => {
    const inner = a.querySelector('code') || a;
    return {text: a.textContent, link: getComputedStyle(a).color, shown: getComputedStyle(inner).color};
})"""


def test_lesson_03_links_its_exercise_in_the_link_colour(page, lab_server):
    """JupyterLab draws code black, also inside a link: a link written as code reads as code, not as a link."""
    lesson = "notebooks/03_flash_forward_numpy.ipynb"
    require(lesson)
    open_notebook(page, lab_server, lesson)
    links = page.evaluate(EXERCISE_LINKS_JS)
    assert links, f"{lesson} shows no link to an exercise"
    for link in links:
        assert link["shown"] == link["link"], (
            f"the link '{link['text']}' is drawn in {link['shown']}, not in the link colour {link['link']}")
