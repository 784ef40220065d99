"""Notebooks open unmodified under the kernel `make lab` installs: JupyterLab rewrites a notebook's kernelspec
when it differs from the running kernel's, which marks an untouched lesson as changed ("Save changes?")."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted(p for folder in ("notebooks", "exercises", "solutions") for p in (ROOT / folder).glob("*.ipynb"))


def installed_kernel() -> dict[str, str]:
    """The name and display name of the kernel the Makefile's `ipykernel install` line installs."""
    line = next(line for line in (ROOT / "Makefile").read_text().splitlines() if "ipykernel install" in line)
    words = shlex.split(re.sub(r"\$\(\w+\)|>/dev/null|&&|\\$", " ", line))
    return {"name": words[words.index("--name") + 1], "display_name": words[words.index("--display-name") + 1]}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_the_notebook_names_the_kernel_make_lab_installs(path):
    kernel = installed_kernel()
    spec = nbformat.read(path, as_version=4).metadata.get("kernelspec", {})
    assert {key: spec.get(key) for key in kernel} == kernel, (
        f"{path.relative_to(ROOT)} names the kernel {spec}, `make lab` installs {kernel}: JupyterLab would rewrite "
        "the notebook's metadata on opening it and ask to save an untouched notebook")


def _commands(text: str, program: str) -> list[list[str]]:
    """Every command of ``text`` (split at `&&`, backquotes and line ends) that starts with ``program``."""
    pieces = (piece.strip().lstrip("#").strip() for piece in re.split(r"&&|`|\n", text))
    return [shlex.split(piece) for piece in pieces if piece.startswith(program)]


def _makefile_lab_options() -> set[str]:
    recipe = (ROOT / "Makefile").read_text().split("\nlab:", 1)[1]
    return {word for word in recipe.split() if word.startswith("--ServerApp.default_url=")}


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
    kernel = installed_kernel()
    installs = _commands(text, "python -m ipykernel install")
    assert installs, f"{document}: the kernel is not installed under the name the notebooks carry ({kernel})"
    for words in installs:
        assert words[words.index("--name") + 1] == kernel["name"]
        assert words[words.index("--display-name") + 1] == kernel["display_name"]
