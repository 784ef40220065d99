"""Fixtures for the real-browser tests: Debian's headless Chromium through Playwright, a JupyterLab server.

Nothing here downloads a browser: Playwright drives /usr/bin/chromium (`apt-get install chromium`). Without
Chromium or Playwright the tests are skipped with the reason; under CI=true that is a failure instead.
Screenshots go to build/screenshots/, also one named FAILED-<test>.png of the page a failing test left.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCREENSHOTS = ROOT / "build" / "screenshots"
CHROMIUM = Path("/usr/bin/chromium")
# The network is closed here and in CI: Chromium must not try to reach Google's services on its own.
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
SERVER_START_TIMEOUT_S = 60
# JupyterLab settings for a reproducible test: every cell stays in the DOM (no windowing), no news or update
# checks (they would reach the internet), brackets are not auto-closed while the test types code.
LAB_SETTINGS = {
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {"fetchNews": "false",
                                                                        "checkForUpdates": False},
    "@jupyterlab/codemirror-extension/plugin.jupyterlab-settings": {"defaultConfig": {"autoClosingBrackets": False}},
}


def pytest_configure(config):
    config.addinivalue_line("markers", "browser: drives headless Chromium (Debian's /usr/bin/chromium)")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Keep each phase's report on the test item, so a fixture can tell that its test failed."""
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"report_{report.when}", report)


def missing_browser_reason() -> str | None:
    """Why the browser tests cannot run here, or None when they can."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "Playwright for Python is not installed (pip install playwright; no browser download needed)"
    if not CHROMIUM.exists():
        return f"Chromium is not at {CHROMIUM} (Debian/Ubuntu: apt-get install chromium)"
    return None


@pytest.fixture(scope="session")
def browser_context(tmp_path_factory):
    """A fresh Chromium profile (its own user-data-dir), headless, closed at the end of the session."""
    reason = missing_browser_reason()
    if reason:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true but the browser tests cannot run: {reason}", pytrace=False)
        pytest.skip(reason)
    from playwright.sync_api import sync_playwright

    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-profile")), executable_path=str(CHROMIUM),
            args=CHROMIUM_ARGS, viewport={"width": 1400, "height": 1000})
        try:
            yield context
        finally:
            context.close()


@pytest.fixture
def page(browser_context, request):
    """A new tab; if the test fails, a screenshot of where it stopped goes to build/screenshots/."""
    tab = browser_context.new_page()
    console_errors: list[str] = []
    tab.on("console", lambda message: message.type == "error" and console_errors.append(message.text))
    tab.console_errors = console_errors
    yield tab
    report = getattr(request.node, "report_call", None)
    if report is not None and report.failed:
        tab.screenshot(path=str(SCREENSHOTS / f"FAILED-{request.node.name}.png"))
    tab.close()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@dataclass
class LabServer:
    """A running JupyterLab: its base URL, token and root directory."""

    url: str
    token: str
    root: Path
    log: Path

    def notebook_url(self, relative_path: str) -> str:
        """The notebook alone in a fresh workspace (``?reset``): no tab restored from an earlier test can hold the
        focus that JupyterLab's Run menu acts on."""
        workspace = "".join(c if c.isalnum() else "-" for c in relative_path)
        return f"{self.url}/lab/workspaces/{workspace}/tree/{relative_path}?reset&token={self.token}"

    def api(self, path: str, method: str = "GET") -> int:
        request = urllib.request.Request(f"{self.url}{path}", method=method,
                                         headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status


def _wait_until_up(server: LabServer, process: subprocess.Popen) -> None:
    deadline = time.monotonic() + SERVER_START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"jupyter lab exited with code {process.returncode}:\n{server.log.read_text()[-3000:]}")
        try:
            if server.api("/api/status") == 200:
                return
        except (urllib.error.URLError, ConnectionError):
            pass
        time.sleep(0.3)
    raise RuntimeError(f"jupyter lab did not answer within {SERVER_START_TIMEOUT_S} s:\n"
                       f"{server.log.read_text()[-3000:]}")


def _stop(server: LabServer, process: subprocess.Popen) -> None:
    """Ask the server to shut down (it stops its kernels); kill its process group if it does not."""
    try:
        server.api("/api/shutdown", method="POST")
        process.wait(timeout=15)
    except Exception:  # noqa: BLE001 - whatever went wrong, the kill below still has to run
        pass
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def install_make_lab_kernel(data_dir: Path) -> None:
    """Install the course's kernel as the Makefile does (`python -m flashcourse.lab_kernel install`) into
    ``data_dir``, which the server searches first (JUPYTER_PATH): it then offers exactly the kernel `make lab` gives
    a learner, whatever an older set-up left in the venv (tests/test_lab_kernel.py checks the Makefile's line)."""
    subprocess.run([sys.executable, "-m", "flashcourse.lab_kernel", "install", "--user"], check=True,
                   capture_output=True, env=dict(os.environ, JUPYTER_DATA_DIR=str(data_dir)))


@pytest.fixture(scope="session")
def lab_server(browser_context, tmp_path_factory):
    """`jupyter lab` on 127.0.0.1 (free port, random token) serving a copy of notebooks/ and exercises/, so
    that running cells never writes outputs into the committed notebooks, with the kernel `make lab` installs.
    Shut down at the end of the session, whatever happened."""
    work = tmp_path_factory.mktemp("jupyterlab")
    install_make_lab_kernel(work / "data")
    root = work / "course"
    for folder in ("notebooks", "exercises"):
        shutil.copytree(ROOT / folder, root / folder)
    settings = work / "user-settings"
    for name, values in LAB_SETTINGS.items():
        (settings / name).parent.mkdir(parents=True, exist_ok=True)
        (settings / name).write_text(json.dumps(values))
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(work / "config"), JUPYTER_RUNTIME_DIR=str(work / "runtime"),
               JUPYTER_PATH=str(work / "data"),  # searched first: the kernel installed above
               JUPYTERLAB_SETTINGS_DIR=str(settings), JUPYTERLAB_WORKSPACES_DIR=str(work / "workspaces"),
               MPLBACKEND="module://matplotlib_inline.backend_inline")
    port, token = _free_port(), secrets.token_hex(16)
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    log = SCREENSHOTS / "jupyterlab.log"
    server = LabServer(url=f"http://127.0.0.1:{port}", token=token, root=root, log=log)
    with log.open("w") as log_file:
        process = subprocess.Popen(
            [sys.executable, "-m", "jupyterlab", "--no-browser", "--allow-root", "--ServerApp.ip=127.0.0.1",
             f"--ServerApp.port={port}", "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}",
             f"--ServerApp.root_dir={root}", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
             # window.jupyterapp: a test can wait on JupyterLab's own promises rather than on what the page shows
             "--LabApp.expose_app_in_browser=True"],
            cwd=root, env=env, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True)  # its own process group: the kernels it starts are stopped with it
        try:
            _wait_until_up(server, process)
            yield server
        finally:
            _stop(server, process)
