"""The start as `make lab` gives it: JupyterLab started with the Makefile's own options opens on notebooks/, and
the course's settings (installed beside its kernel) keep the news pop-up away; after Run All stops at a failing
check, the cells it skipped point to it.

`jupyter lab --ServerApp.default_url=...` is ignored (the page opened on the repository root); the LabApp's
default_url is the one that counts. This test reads the options from the Makefile's `lab` recipe, so it fails if
the recipe goes back to an option that JupyterLab ignores.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import urllib.request

import pytest

from flashcourse import lab_kernel

from .conftest import ROOT, SCREENSHOTS, LabServer, _free_port, _stop, _wait_until_up
from .test_jupyterlab import UI_TIMEOUT_MS, input_prompts, open_notebook, run_all_cells

pytestmark = pytest.mark.browser

BREADCRUMBS = ".jp-FileBrowser .jp-BreadCrumbs"
LISTED_NAMES = ".jp-FileBrowser .jp-DirListing-itemText"


def make_lab_options() -> list[str]:
    """The JupyterLab options of the Makefile's `lab` recipe (LAB_ARGS and the root-only flag left out)."""
    recipe = (ROOT / "Makefile").read_text().split("\nlab:", 1)[1].split("\n\n", 1)[0]
    return re.findall(r"--(?:ServerApp|LabApp)\.[\w.]+=\S+", recipe)


def _lab(tmp_path, options: list[str], serve: str):
    """JupyterLab with ``options`` in a copy of the course, started in its folder ``serve`` ("." for the root),
    with the kernel and settings the course's install step writes (into a prefix here, read through
    app_settings_dir as JupyterLab reads the venv's); yields the LabServer, stopped afterwards."""
    course = tmp_path / "course"
    for folder in ("notebooks", "exercises"):
        shutil.copytree(ROOT / folder, course / folder)
    prefix = tmp_path / "prefix"
    lab_kernel.install(prefix=str(prefix))
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(tmp_path / "config"), JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"),
               JUPYTER_PATH=str(prefix / "share" / "jupyter"), JUPYTER_DATA_DIR=str(tmp_path / "data"),
               JUPYTERLAB_SETTINGS_DIR=str(tmp_path / "user-settings"),  # empty: no user setting hides the pop-up
               JUPYTERLAB_WORKSPACES_DIR=str(tmp_path / "workspaces"),
               MPLBACKEND="module://matplotlib_inline.backend_inline")
    port, token = _free_port(), secrets.token_hex(16)
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    log = SCREENSHOTS / "jupyterlab-start.log"
    root = (course / serve).resolve()
    server = LabServer(url=f"http://127.0.0.1:{port}", token=token, root=root, log=log)
    settings_dir = prefix / lab_kernel.SETTINGS_FILE.parent.parent
    with log.open("w") as log_file:
        process = subprocess.Popen(
            [sys.executable, "-m", "jupyterlab", *options, "--no-browser", "--allow-root",
             "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
             f"--IdentityProvider.token={token}", f"--LabApp.app_settings_dir={settings_dir}",
             "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate", "--LabApp.expose_app_in_browser=True"],
            cwd=root, env=env, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True)
        try:
            _wait_until_up(server, process)
            yield server
        finally:
            _stop(server, process)


@pytest.fixture
def make_lab_server(browser_context, tmp_path):
    """JupyterLab started as `make lab` starts it: at the repository root, with the Makefile's options."""
    yield from _lab(tmp_path, make_lab_options(), ".")


@pytest.fixture
def lab_in_notebooks(browser_context, tmp_path):
    """JupyterLab started the wrong way: `jupyter lab` inside notebooks/."""
    yield from _lab(tmp_path, [], "notebooks")


def test_make_lab_opens_on_the_notebooks_folder_without_the_news_pop_up(page, make_lab_server):
    assert any(option.startswith("--LabApp.default_url=") for option in make_lab_options()), make_lab_options()
    page.goto(f"{make_lab_server.url}/?token={make_lab_server.token}")  # what the browser `make lab` opens loads
    page.locator(LISTED_NAMES, has_text="00_memory_hierarchy.ipynb").wait_for(timeout=UI_TIMEOUT_MS)
    folder = page.locator(BREADCRUMBS).inner_text().strip()
    page.screenshot(path=str(SCREENSHOTS / "lab-make-lab-start.png"))
    assert folder.rstrip("/").endswith("notebooks"), f"the file browser shows {folder!r}, not notebooks/"
    assert "exercises" not in page.locator(LISTED_NAMES).all_inner_texts()  # the root's folders are not listed

    # The settings JupyterLab serves to the page: an override becomes the schema's default, and the course's
    # answers the news question ("none", JupyterLab's own default, asks it in a pop-up) with "false".
    request = urllib.request.Request(
        f"{make_lab_server.url}/lab/api/settings/@jupyterlab/apputils-extension:notification",
        headers={"Authorization": f"token {make_lab_server.token}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        served = json.loads(response.read())
    fetch_news = served["schema"]["properties"]["fetchNews"]["default"]
    assert fetch_news == "false", f"JupyterLab would ask about news: fetchNews is {fetch_news!r}"
    assert not page.locator(".Toastify__toast", has_text=re.compile("news", re.I)).count()


def test_after_run_all_stops_at_a_check_the_skipped_cells_point_to_it(page, lab_server):
    """Run All on a stub stops at the first check, and JupyterLab scrolls to the last cell: every code cell it
    skipped says which cell failed (the course's kernel), so the one in view points back to the error."""
    exercise = "exercises/ex03_tiled_forward.ipynb"
    panel = open_notebook(page, lab_server, exercise)
    run_all_cells(page, panel)
    code_cells = panel.locator(".jp-CodeCell")
    prompts = input_prompts(panel)
    failed = next(i for i, cell in enumerate(code_cells.all()) if cell.locator(".jp-RenderedText[data-mime-type="
                                                                                 "'application/vnd.jupyter.stderr']")
                  .count())
    number = re.search(r"\[(\d+)\]", prompts[failed]).group(1)
    last = code_cells.last.locator(".jp-OutputArea-output")
    last.first.wait_for(timeout=UI_TIMEOUT_MS)
    said = last.first.inner_text()
    page.screenshot(path=str(SCREENSHOTS / "lab-run-all-stopped.png"))
    assert f"Run All stopped at the error in cell [{number}]" in said, said
    skipped = [cell.locator(".jp-OutputArea-output").first.inner_text() for cell in code_cells.all()[failed + 1:]]
    assert skipped and all("Not run" in text for text in skipped), skipped


def test_a_lab_started_inside_notebooks_says_why_exercise_links_do_nothing(page, lab_in_notebooks):
    panel = open_notebook(page, lab_in_notebooks, "03_flash_forward_numpy.ipynb")
    first_code = panel.locator(".jp-CodeCell").first
    first_code.locator(".jp-InputPrompt").click()
    page.keyboard.press("Control+Enter")
    said = first_code.locator(".jp-OutputArea-output", has_text="started inside notebooks/")
    said.wait_for(timeout=UI_TIMEOUT_MS)
    page.screenshot(path=str(SCREENSHOTS / "lab-started-inside-notebooks.png"))
    assert "make lab" in said.inner_text()
