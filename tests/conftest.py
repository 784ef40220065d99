"""Shared fixtures: a fresh random generator per test (seeded from the test's name, so a failure reproduces)."""

from __future__ import annotations

import sys
import warnings
import zlib

import numpy as np
import pytest

from flashcourse import device

# Before any test module imports triton (directly, or through torch): the interpreter is chosen at import. Its
# notice (a warning a learner should see) would be repeated in every worker's summary; tests/test_device.py checks it.
with warnings.catch_warnings():
    warnings.simplefilter("ignore", device.InterpreterNotice)
    device.setup()


@pytest.fixture(autouse=True)
def _return_cached_gpu_memory():
    """After each test, give the blocks PyTorch's allocator cached back to the GPU: make test-gpu runs several
    workers on one card, and a worker holding its last test's peak starves the others (on an 80 GB H100 that ran
    out of memory)."""
    yield
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


@pytest.fixture
def rng(request) -> np.random.Generator:
    """A generator seeded from the test id: fresh inputs per test, the same ones on a re-run."""
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


# The longest (half a minute to two minutes each on two cores): compiling every launch for a GPU architecture,
# nbgrader end to end, the wheel built, installed and running two lessons.
LONGEST = ("tests/test_launch_fit.py::", "tests/test_wheel.py::", "tests/test_grading_nbgrader.py::")


def pytest_collection_modifyitems(config, items):
    """The longest tests first, then the rest marked slow or executing a notebook, then the others (in collection
    order within each group). The Makefile hands tests to its two workers one at a time (``--maxschedchunk 1``),
    so this is longest-first scheduling: a minute-long test that starts last leaves the other core idle meanwhile.
    """

    def group(item) -> int:
        if item.nodeid.startswith(LONGEST):
            return 0
        return 1 if item.get_closest_marker("slow") or item.get_closest_marker("notebooks") else 2

    items.sort(key=group)
