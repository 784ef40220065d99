"""An untouched notebook stays untouched: JupyterLab, with the kernel `make lab` installs, opens a lesson and an
exercise without rewriting their kernelspec, and closing one asks nothing ("Save your work?" means that opening
it changed it)."""

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
DIRTY_JS = f"() => !!document.querySelector('{CURRENT_TAB}.jp-mod-dirty')"
# After a close: either JupyterLab asks something, or the notebook is gone.
CLOSED_OR_ASKED_JS = """() => !!document.querySelector('.jp-Dialog') || !document.querySelector('.jp-NotebookPanel')"""


def _name(relative_path: str) -> str:
    return relative_path.split("/")[-1].removesuffix(".ipynb")


@pytest.mark.parametrize("relative_path", NOTEBOOKS, ids=_name)
def test_opening_a_notebook_keeps_its_kernelspec(page, lab_server, relative_path):
    """The kernel's name and display name are the notebook's own: saving right after opening writes them back
    unchanged (with "Python 3 (flashcourse)" installed, every notebook's kernelspec was rewritten)."""
    require(relative_path)
    # A copy: saving the server's own copy would hide from the next test what opening it changes.
    copy = str(Path(relative_path).with_name(f"saved-{Path(relative_path).name}"))
    path = lab_server.root / copy
    shutil.copy(lab_server.root / relative_path, path)
    before = json.loads(path.read_text())["metadata"]["kernelspec"]
    open_notebook(page, lab_server, copy)  # waits until its kernel is connected and idle
    page.keyboard.press("Control+s")
    page.wait_for_function(f"() => !document.querySelector('{CURRENT_TAB}.jp-mod-dirty')", timeout=UI_TIMEOUT_MS)
    after = json.loads(path.read_text())["metadata"]["kernelspec"]
    assert after == before, f"opening {relative_path} rewrote its kernelspec {before} as {after}"


@pytest.mark.xfail(strict=True, reason=(
    "JupyterLab writes the running kernel's language_info into a notebook when it connects, and ipykernel's "
    "includes the Python version (3.11.7 here), which no committed notebook can match on every machine; it "
    "takes a kernel that reports no version, or the notebooks opened with it, to fix"))
@pytest.mark.parametrize("relative_path", NOTEBOOKS, ids=_name)
def test_an_untouched_notebook_closes_without_asking_to_save(page, lab_server, relative_path):
    require(relative_path)
    panel = open_notebook(page, lab_server, relative_path)  # waits until its kernel is connected and idle
    kernel = panel.locator(".jp-Toolbar-kernelName").inner_text().strip()
    page.locator(f"{CURRENT_TAB} .lm-TabBar-tabCloseIcon").click()
    page.wait_for_function(CLOSED_OR_ASKED_JS, timeout=UI_TIMEOUT_MS)
    dialog = page.locator(".jp-Dialog")
    if dialog.count():
        page.screenshot(path=str(SCREENSHOTS / f"lab-close-dialog-{_name(relative_path)}.png"))
        question = dialog.first.inner_text()[:300]
        page.keyboard.press("Escape")  # leave the next test a JupyterLab without a dialog
        pytest.fail(f"closing the untouched {relative_path} (kernel '{kernel}') asked: {question}")
