"""Every lesson notebook runs top to bottom on a fresh kernel, and is committed clean.

Executed copies go to ``build/executed/`` (with their outputs), where the website build picks them up instead of
running the lessons a second time.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
LESSONS = sorted((ROOT / "notebooks").glob("*.ipynb"))
EXECUTED = ROOT / "build" / "executed"


def _committed_notebooks() -> list[Path]:
    return LESSONS + sorted((ROOT / "solutions").glob("*.ipynb")) + sorted((ROOT / "exercises").glob("*.ipynb"))


@pytest.mark.parametrize("path", _committed_notebooks(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_committed_without_outputs_and_with_kernelspec(path: Path):
    nb = nbformat.read(path, as_version=4)
    assert nb.metadata.get("kernelspec", {}).get("name") == "python3", (
        f"{path.name} lacks kernelspec metadata (python3): JupyterLab would ask which kernel to use")
    for index, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            assert not cell.outputs and cell.execution_count is None, (
                f"{path.name} cell {index} has outputs: clear them before committing")


@pytest.mark.notebooks
@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.name)
def test_lesson_runs_top_to_bottom(path: Path):
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    env_backup = dict(os.environ)
    os.environ["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"
    start = time.perf_counter()
    try:
        NotebookClient(nb, timeout=900, kernel_name="python3",
                       resources={"metadata": {"path": str(path.parent)}}).execute()
    finally:
        os.environ.clear()
        os.environ.update(env_backup)
    seconds = time.perf_counter() - start
    EXECUTED.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, EXECUTED / path.name)
    (EXECUTED / f"{path.stem}.time.json").write_text(json.dumps({"notebook": path.name, "seconds": seconds}))
