"""device, bench and tolerance: the small modules everything else leans on."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from flashcourse import bench, device, iomodel, measure
from flashcourse.tolerance import TOLERANCES, assert_close, tolerance_for


def test_flop_formulas():
    assert bench.attention_flops(1, 1, 2, 3) == 4 * 2 * 2 * 3
    assert bench.attention_flops(4, 16, 1024, 128, causal=True) == 0.5 * bench.attention_flops(4, 16, 1024, 128)
    assert bench.attention_flops(2, 2, 8, 8, mode="bwd") == 2.5 * bench.attention_flops(2, 2, 8, 8)
    assert bench.attention_flops(2, 2, 8, 8, mode="fwd_bwd") == 3.5 * bench.attention_flops(2, 2, 8, 8)
    with pytest.raises(ValueError, match="mode"):
        bench.attention_flops(1, 1, 1, 1, mode="both")


def test_naive_traffic_counts_each_line():
    steps = iomodel.naive_attention_hbm_bytes(1, 1, 1000, 64, bytes_per_element=2)
    nn, nd = 1000 * 1000 * 2, 1000 * 64 * 2
    assert steps["total"] == 4 * nn + 4 * nd
    assert sum(v for key, v in steps.items() if key != "total") == steps["total"]


def test_timer_and_memory_probe():
    timing = measure.time_cpu(lambda: sum(range(1000)), repeats=3)
    assert 0 < timing.best <= timing.median and timing.repeats == 3
    assert measure.peak_memory(lambda: np.ones(1_000_000)) >= 8_000_000
    assert measure.peak_memory(lambda: None) < 100_000


def test_results_round_trip(tmp_path):
    path = bench.save_results("unit", [{"n": 1, "ms": 2.0}], directory=tmp_path, extra={"note": "x"})
    data = json.loads(path.read_text())
    assert data["rows"] == [{"n": 1, "ms": 2.0}] and data["meta"]["note"] == "x" and "date" in data["meta"]
    assert bench.load_results(directory=tmp_path)[0]["rows"] == data["rows"]


def test_tolerances_per_dtype_and_messages():
    assert set(TOLERANCES) == {"float64", "float32", "float16", "bfloat16"}
    assert tolerance_for(np.float32) == tolerance_for("float32") == tolerance_for(np.zeros(1, np.float32))
    import torch

    assert tolerance_for(torch.bfloat16) == TOLERANCES["bfloat16"]
    assert_close(np.ones(3), np.ones(3) + 1e-12)
    with pytest.raises(AssertionError, match=r"index \(1,\).*float64"):
        assert_close(np.array([1.0, 2.0]), np.array([1.0, 2.1]))
    with pytest.raises(AssertionError, match="NaN at index"):
        assert_close(np.array([np.nan]), np.array([1.0]))
    with pytest.raises(AssertionError, match="shape"):
        assert_close(np.ones(2), np.ones(3))
    assert_close(np.array([-np.inf]), np.array([-np.inf]))


def test_device_falls_back_to_the_interpreter_and_says_so_once():
    code = ("import flashcourse.device as d; print(d.setup()); print(d.setup()); "
            "import os; print(os.environ.get('TRITON_INTERPRET'))")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["CUDA_VISIBLE_DEVICES"] = ""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert done.stdout.strip().splitlines() == ["cpu", "cpu", "1"]  # said as a warning (stderr), not printed
    assert done.stderr.count("InterpreterNotice") == 1 and "CPU interpreter" in done.stderr, done.stderr


def test_require_triton_explains_what_to_do(monkeypatch):
    monkeypatch.setattr(device, "triton_available", lambda: False)
    with pytest.raises(device.TritonUnavailableError, match="WSL"):
        device.require_triton()


def test_device_warns_when_triton_was_imported_first():
    code = "import triton, flashcourse.device as d; d.setup()"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["CUDA_VISIBLE_DEVICES"] = ""
    err = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stderr
    assert "imported triton" in err
