"""An untouched notebook stays untouched: JupyterLab, with the kernel `make lab` installs, opens a lesson and an
exercise without rewriting their kernel metadata, and closing one asks nothing ("Save your work?" means that
opening it changed it).

When a kernel connects, JupyterLab writes its kernelspec and its ``language_info`` into the notebook and marks the
notebook changed unless both equal what the notebook holds. IPython's kernel reports the Python version (3.11.7
here), which no committed notebook can match on every machine; the course's kernel (flashcourse.lab_kernel)
reports none. With IPython's kernel installed instead, both tests below fail.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from .conftest import SCREENSHOTS
from .test_jupyterlab import UI_TIMEOUT_MS, open_notebook, require

pytestmark = pytest.mark.browser

NOTEBOOKS = ["notebooks/03_flash_forward_numpy.ipynb", "exercises/ex03_tiled_forward.ipynb"]
CURRENT_TAB = ".lm-DockPanel-tabBar .lm-TabBar-tab.lm-mod-current"
KERNEL_METADATA = ("kernelspec", "language_info")
# JupyterLab writes the kernel's language_info and kernelspec when the kernel's info and spec arrive, in callbacks
# on these two promises that it attached when the kernel connected: awaiting them runs after those writes. (The
# kernel shows idle a moment before its info arrives, so waiting for idle alone let a close slip in before.)
KERNEL_METADATA_WRITTEN_JS = """async (timeoutMs) => {
    const panel = window.jupyterapp.shell.currentWidget;
    const deadline = Date.now() + timeoutMs;
    // On a loaded machine the session can still be null just after the kernel shows idle: wait for it too.
    while (!(panel.sessionContext.session && panel.sessionContext.session.kernel)) {
        if (Date.now() > deadline) throw new Error(`no kernel session within ${timeoutMs} ms`);
        await new Promise((resolve) => setTimeout(resolve, 50));
    }
    const kernel = panel.sessionContext.session.kernel;
    const written = (async () => { await kernel.info; await kernel.spec; })();
    const late = new Promise((_, reject) => setTimeout(
        () => reject(new Error(`no kernel info within ${timeoutMs} ms`)), timeoutMs));
    await Promise.race([written, late]);
    return {path: panel.context.path, dirty: panel.context.model.dirty};
}"""
# After a close: either JupyterLab asks something, or the notebook is gone.
CLOSED_OR_ASKED_JS = """() => !!document.querySelector('.jp-Dialog') || !document.querySelector('.jp-NotebookPanel')"""


def _name(relative_path: str) -> str:
    return relative_path.split("/")[-1].removesuffix(".ipynb")


def open_until_kernel_metadata_written(page, lab_server, relative_path: str):
    """Open the notebook and wait until JupyterLab has written the kernel's metadata into it; the panel."""
    panel = open_notebook(page, lab_server, relative_path)  # waits until its kernel is connected and idle
    state = page.evaluate(KERNEL_METADATA_WRITTEN_JS, UI_TIMEOUT_MS)
    assert state["path"] == relative_path, f"JupyterLab's current tab is {state['path']}, not {relative_path}"
    return panel


def saved_notebook(page, path: Path) -> dict:
    """The notebook the server wrote. The tab's dirty mark clears when the save request is answered, which can be
    a moment before the file on disk holds the whole notebook (a read then found it empty): read until it parses."""
    for _ in range(UI_TIMEOUT_MS // 100):
        try:
            return json.loads(path.read_text())
        except json.JSONDecodeError:
            page.wait_for_timeout(100)
    return json.loads(path.read_text())  # still not whole: the error says what was read


@pytest.mark.parametrize("relative_path", NOTEBOOKS, ids=_name)
def test_opening_a_notebook_keeps_its_kernel_metadata(page, lab_server, relative_path):
    """Saving right after opening writes the kernelspec and language_info back unchanged (with "Python 3
    (flashcourse)" installed, every kernelspec was rewritten; with IPython's kernel, every language_info)."""
    require(relative_path)
    # A copy: saving the server's own copy would hide from the next test what opening it changes.
    copy = str(Path(relative_path).with_name(f"saved-{Path(relative_path).name}"))
    path = lab_server.root / copy
    shutil.copy(lab_server.root / relative_path, path)
    before = {key: json.loads(path.read_text())["metadata"][key] for key in KERNEL_METADATA}
    open_until_kernel_metadata_written(page, lab_server, copy)
    page.keyboard.press("Control+s")
    page.wait_for_function(f"() => !document.querySelector('{CURRENT_TAB}.jp-mod-dirty')", timeout=UI_TIMEOUT_MS)
    after = {key: saved_notebook(page, path)["metadata"][key] for key in KERNEL_METADATA}
    assert after == before, f"opening {relative_path} rewrote its kernel metadata {before} as {after}"


@pytest.mark.parametrize("relative_path", NOTEBOOKS, ids=_name)
def test_an_untouched_notebook_closes_without_asking_to_save(page, lab_server, relative_path):
    require(relative_path)
    panel = open_until_kernel_metadata_written(page, lab_server, relative_path)
    kernel = panel.locator(".jp-Toolbar-kernelName").inner_text().strip()
    page.locator(f"{CURRENT_TAB} .lm-TabBar-tabCloseIcon").click()
    page.wait_for_function(CLOSED_OR_ASKED_JS, timeout=UI_TIMEOUT_MS)
    dialog = page.locator(".jp-Dialog")
    if dialog.count():
        page.screenshot(path=str(SCREENSHOTS / f"lab-close-dialog-{_name(relative_path)}.png"))
        question = dialog.first.inner_text()[:300]
        page.keyboard.press("Escape")  # leave the next test a JupyterLab without a dialog
        pytest.fail(f"closing the untouched {relative_path} (kernel '{kernel}') asked: {question}")
