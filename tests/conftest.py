"""Shared fixtures: a fresh random generator per test (seeded from the test's name, so a failure reproduces)."""

from __future__ import annotations

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


@pytest.fixture
def rng(request) -> np.random.Generator:
    """A generator seeded from the test id: fresh inputs per test, the same ones on a re-run."""
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


def pytest_collection_modifyitems(config, items):
    """The long tests first (marked slow or executing a notebook): on two workers a minute-long test that starts
    last leaves one core idle while it ends. The order within each group stays the collection order."""
    items.sort(key=lambda item: not (item.get_closest_marker("slow") or item.get_closest_marker("notebooks")))
