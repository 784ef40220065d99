"""The PYTHONPATH a test hands to the child processes it starts.

This checkout's ``src`` comes first, then the caller's own path, so a child imports the packages the test runs
under. On the GPU machines a run puts Triton 3.9 first on the path (``PYTHONPATH=/tmp/t39:src``); a child given
``src`` alone fell back to the machine's Triton 3.6 and compiled under it while the test judged by 3.9's rules.
"""

from __future__ import annotations

import os
from pathlib import Path

SRC = str(Path(__file__).resolve().parents[1] / "src")


def child_pythonpath() -> str:
    """``src`` of this checkout, then whatever PYTHONPATH this process was given."""
    return os.pathsep.join(p for p in (SRC, os.environ.get("PYTHONPATH", "")) if p)
