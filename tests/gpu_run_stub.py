"""Stand-ins for the GPU machine's tools, so that a test can run a ``scripts/gpu_run.sh`` stage on a CPU and read
what it would have run: a ``python3`` (the caller's script, typically recording its arguments) and an
``nvidia-smi`` that names an H200."""

from __future__ import annotations

import sys
from pathlib import Path


def stub_gpu_tools(directory: Path, python_source: str) -> Path:
    """A ``bin`` folder in ``directory`` holding ``python3`` (``python_source``, its ``{python}`` replaced by this
    interpreter) and ``nvidia-smi``, both executable; put it first on PATH."""
    tools = directory / "bin"
    tools.mkdir()
    (tools / "python3").write_text(python_source.replace("{python}", sys.executable))
    (tools / "nvidia-smi").write_text("#!/bin/sh\necho 'NVIDIA H200, 1980 MHz, 3201 MHz, 30'\n")
    for tool in tools.iterdir():
        tool.chmod(0o755)
    return tools
