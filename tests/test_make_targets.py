"""The Makefile's test tiers select what they say: `make test-fast` runs its smoke subset of the kernel tests.

pytest drops a node id silently when the same command line also names its folder or ignores its file, so a tier
can claim tests it never runs. Here the tier's own arguments (``make print-FAST_PYTEST_ARGS``) are collected and
every ``FAST_SMOKE`` id must be among the tests selected.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def make_variable(name: str) -> str:
    """A variable of the Makefile, as make expands it."""
    done = subprocess.run(["make", "-s", "--no-print-directory", f"print-{name}"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
@pytest.mark.slow  # collects most of the suite (imports torch and Triton): about 20 s on two busy cores
def test_fast_tier_collects_every_smoke_id():
    smoke = make_variable("FAST_SMOKE").split()
    assert len(smoke) >= 10, smoke
    args = shlex.split(make_variable("FAST_PYTEST_ARGS"))
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    collected = [line for line in done.stdout.splitlines() if "::" in line]
    missing = [node for node in smoke
               if not any(c == f"tests/{node}" or c.startswith(f"tests/{node}[") for c in collected)]
    assert not missing, f"`make test-fast` names these tests but pytest does not select them: {missing}"
    # the rest of those files stays out: only the smoke ids of an ignored file are run
    ignored = {f"tests/{name}" for name in make_variable("FAST_IGNORE").split()}
    extra = [c for c in collected if c.split("::")[0] in ignored
             and not any(c == f"tests/{node}" or c.startswith(f"tests/{node}[") for node in smoke)]
    assert not extra, f"`make test-fast` runs tests of files it leaves to `make test`: {extra[:10]}"
