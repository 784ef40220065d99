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
