"""Notebooks open unmodified under the kernel `make lab` installs. When a kernel starts, JupyterLab writes its
kernelspec and its ``language_info`` into the notebook and marks the notebook changed unless both equal what the
notebook holds ("Save your work?" on closing an untouched lesson). The course's kernel
(``flashcourse.lab_kernel``) reports the same ``language_info`` on every machine, and every notebook carries it."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import nbformat
import pytest
from child_env import child_pythonpath

from flashcourse import lab_kernel
from flashcourse.lab_kernel import KERNELSPEC, LANGUAGE_INFO

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted(p for folder in ("notebooks", "exercises", "solutions") for p in (ROOT / folder).glob("*.ipynb"))
INSTALL = "python -m flashcourse.lab_kernel install"


def test_there_are_notebooks_to_check():
    assert len(NOTEBOOKS) >= 40, f"found only {len(NOTEBOOKS)} notebooks"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_the_notebook_carries_what_the_kernel_reports(path):
    metadata = nbformat.read(path, as_version=4).metadata
    where = path.relative_to(ROOT)
    assert metadata.get("kernelspec") == KERNELSPEC, (
        f"{where} names the kernel {metadata.get('kernelspec')}, `make lab` installs {KERNELSPEC}: JupyterLab would "
        "rewrite it on opening the notebook and ask to save an untouched notebook")
    assert metadata.get("language_info") == LANGUAGE_INFO, (
        f"{where} has the language_info {metadata.get('language_info')}, the course's kernel reports {LANGUAGE_INFO}: "
        "JupyterLab would rewrite it when the kernel starts and ask to save an untouched notebook")


def test_the_kernel_reports_no_python_version():
    # A version differs from machine to machine, so no committed notebook could match it.
    assert "version" not in LANGUAGE_INFO
    assert lab_kernel.CourseKernel.language_info == LANGUAGE_INFO


@pytest.mark.slow  # starts a kernel process: left to `make test`, as every test that starts processes
def test_the_installed_kernel_runs_this_module_and_answers_with_the_fixed_language_info(tmp_path):
    """Installed as `make lab` does (into a prefix here), started as Jupyter starts it: its kernel_info reply."""
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import KernelManager

    folder = lab_kernel.install(prefix=str(tmp_path))
    spec = json.loads((Path(folder) / "kernel.json").read_text())
    assert Path(folder).name == KERNELSPEC["name"] and spec["display_name"] == KERNELSPEC["display_name"]
    assert spec["argv"][-4:] == ["-m", "flashcourse.lab_kernel", "-f", "{connection_file}"]
    specs = KernelSpecManager(kernel_dirs=[str(Path(folder).parent)], ensure_native_kernel=False)
    kernel = KernelManager(kernel_name=KERNELSPEC["name"], kernel_spec_manager=specs)
    kernel.start_kernel()
    client = kernel.client()
    try:
        client.start_channels()
        client.wait_for_ready(timeout=60)
        reply = client.kernel_info(reply=True, timeout=60)
    finally:
        client.stop_channels()
        kernel.shutdown_kernel(now=True)
    assert reply["content"]["language_info"] == LANGUAGE_INFO


def test_without_ipykernel_the_module_names_the_extra():
    blocked = textwrap.dedent("""
        import importlib.abc, sys
        class NotInstalled(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] == "ipykernel":
                    raise ImportError(f"No module named {name!r}", name=name)
        sys.meta_path.insert(0, NotInstalled())
        import flashcourse.lab_kernel
    """)
    env = {**os.environ, "PYTHONPATH": child_pythonpath()}
    done = subprocess.run([sys.executable, "-c", blocked], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and 'pip install "flashcourse[course]"' in done.stderr, done.stderr[-2000:]


def _commands(text: str, program: str) -> list[list[str]]:
    """Every command of ``text`` (split at `&&`, backquotes and line ends) that starts with ``program``."""
    pieces = (piece.strip().lstrip("#").strip() for piece in re.split(r"&&|`|\n", text))
    return [shlex.split(piece) for piece in pieces if piece.startswith(program)]


def test_the_makefile_installs_the_course_kernel():
    recipe = (ROOT / "Makefile").read_text().split("define install", 1)[1].split("endef", 1)[0]
    text = re.sub(r"\$\(PY\)", "python", recipe).replace(">/dev/null", " ").replace("\\\n", "\n")
    assert _commands(text, INSTALL) == [INSTALL.split() + ["--sys-prefix"]], (
        f"the Makefile's set-up must install the course's kernel into the venv: {INSTALL} --sys-prefix")
    assert "ipykernel install" not in recipe, "IPython's plain kernel reports the Python version: install ours"


def _makefile_lab_options() -> set[str]:
    recipe = (ROOT / "Makefile").read_text().split("\nlab:", 1)[1]
    options = {word for word in recipe.split() if word.startswith(("--LabApp.default_url=",
                                                                    "--ServerApp.default_url="))}
    # `jupyter lab` ignores the ServerApp's default_url (it opened on the repository root): the LabApp's is the one
    assert options == {"--LabApp.default_url=/lab/tree/notebooks"}, f"make lab's start page: {options}"
    return options


@pytest.mark.parametrize("document", ["README.md", "environment.yml"])
def test_conda_instructions_start_jupyterlab_as_make_lab_does(document):
    text = (ROOT / document).read_text()
    labs = _commands(text, "jupyter lab")
    assert labs, f"{document} gives no `jupyter lab` command"
    for words in labs:
        folders = [word for word in words[2:] if not word.startswith("-")]
        assert not folders, (f"{document}: `{' '.join(words)}` serves {folders[0]} as the root, where the lessons' "
                             "links to ../exercises/ lead nowhere: start it at the repository root")
        assert _makefile_lab_options() <= set(words), f"{document}: `{' '.join(words)}` does not open on notebooks/"
    assert _commands(text, INSTALL), f"{document}: the course's kernel is not installed ({INSTALL} --sys-prefix)"
    assert "ipykernel install" not in text, f"{document}: IPython's plain kernel reports the Python version"


def test_binder_installs_the_course_kernel():
    assert _commands((ROOT / ".binder" / "postBuild").read_text(), INSTALL), f"postBuild must run {INSTALL}"


def test_the_install_writes_the_courses_jupyterlab_settings_beside_the_kernel(tmp_path):
    lab_kernel.install(prefix=str(tmp_path))
    written = json.loads((tmp_path / lab_kernel.SETTINGS_FILE).read_text())
    assert written["@jupyterlab/apputils-extension:notification"]["fetchNews"] == "false"  # no news pop-up
    assert lab_kernel.SETTINGS_FILE.parts[-2:] == ("overrides.d", "flashcourse.json")  # the user's overrides.json kept


def _course(tmp_path: Path) -> Path:
    for folder in ("notebooks", "exercises"):
        (tmp_path / "course" / folder).mkdir(parents=True)
    return tmp_path / "course"


def test_a_server_started_inside_notebooks_is_named_as_why_exercise_links_do_nothing(tmp_path):
    course = _course(tmp_path)
    notice = lab_kernel.links_notice(course / "notebooks", course / "notebooks")
    assert "started inside notebooks/" in notice and "make lab" in notice and str(course) in notice
    assert lab_kernel.links_notice(course / "notebooks", course) == ""  # started at the root: links work
    assert lab_kernel.links_notice(course / "notebooks", None) == ""  # no server found: nothing to say
    (tmp_path / "elsewhere" / "notebooks").mkdir(parents=True)  # a folder of that name outside a course
    assert lab_kernel.links_notice(tmp_path / "elsewhere" / "notebooks", tmp_path / "elsewhere" / "notebooks") == ""


def test_the_servers_folder_comes_from_its_runtime_file(tmp_path):
    (tmp_path / "jpserver-4242.json").write_text(json.dumps({"root_dir": "/srv/course/notebooks", "port": 8888}))
    assert lab_kernel.server_root(4242, tmp_path) == Path("/srv/course/notebooks")
    assert lab_kernel.server_root(4243, tmp_path) is None
