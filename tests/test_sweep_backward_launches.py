"""benchmarks/sweep_backward_launches.py on the CPU at a tiny size: every launch it varies computes the default's
gradients (the row's max_rel_diff_vs_default), rows say which kernel moved, and b3's case runs its mask rule."""

import importlib.util
import sys
from pathlib import Path

import pytest

from flashcourse.kernels.configs import KernelConfig

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def sweep():
    spec = importlib.util.spec_from_file_location("sweep_backward_launches",
                                                  ROOT / "benchmarks" / "sweep_backward_launches.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_plan_varies_one_kernel_at_a_time(sweep):
    jobs = sweep.plan()
    assert {varied for _, varied, _ in jobs} == {"default", "dq", "dkdv"}
    for case, varied, cfg in jobs:
        if varied == "dq" and case.causal:
            assert cfg.block_m % cfg.block_n == 0  # the causal dQ kernel's rule
        if varied == "dkdv" and case.causal:
            assert cfg.block_n % cfg.block_m == 0


@pytest.mark.parametrize("scheme, causal, rule, extra", [
    ("b1", True, None, {}), ("b3", False, "prefix-LM", {}),
    ("b3", True, "window 1024", {"window": 8}), ("b3", True, "GQA 32/8", {"heads": 4, "heads_kv": 2})])
def test_tiny_case_matches_default(sweep, monkeypatch, scheme, causal, rule, extra):
    monkeypatch.setitem(sweep.DQ_LAUNCHES, 16, (KernelConfig(32, 16, 4, 1),))
    monkeypatch.setitem(sweep.DKDV_LAUNCHES, 16, (KernelConfig(16, 32, 4, 1),))
    monkeypatch.setattr(sweep, "BLOCK_SIZE", 16)
    monkeypatch.setattr(sweep, "DEVICE", "cpu")
    monkeypatch.setattr("flashcourse.bench.time_repeats", _one_call_timing)
    case = sweep.Case(scheme, 16, extra.pop("heads", 2), causal, rule=rule, batch=1, n=40, dtype="float32", **extra)
    rows = sweep.sweep_case(case, [job for job in sweep.plan((case,))], lambda *_: None)
    assert [r["varied"] for r in rows] == ["default", "dq", "dkdv"]
    for row in rows:
        assert "error" not in row, row
        assert row["max_rel_diff_vs_default"] < 1e-5  # float32: another launch, the same sums up to rounding
    assert rows[1]["dq_config"]["block_m"] == 32 and rows[2]["dkdv_config"]["block_n"] == 32


def _one_call_timing(fn, **_):
    from flashcourse.bench import Timing

    fn()
    return Timing(1.0, 1.0, 1.0, 3)


def test_head_dims_keep_only_their_cases(sweep):
    jobs = sweep.plan(head_dims=(256,))
    assert jobs and {case.head_dim for case, _, _ in jobs} == {256}


def test_rules_keep_only_their_cases(sweep):
    jobs = sweep.plan(rules=("window 1024", "GQA 32/8"))
    assert {case.rule for case, _, _ in jobs} == {"window 1024", "GQA 32/8"}
    assert {case.heads_kv for case, _, _ in jobs} == {None, 8}


def test_window_flops_count_the_visible_entries(sweep):
    """The window case's FLOPs are the dense backward's times the share of (query, key) pairs a causal window of
    ``window`` keys to the left shows: the script's count against one made entry by entry on small squares."""
    import torch

    for n, window in ((40, 8), (17, 16), (64, 1)):
        i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
        assert sweep.visible_in_window(n, window) == int(((j <= i) & (j >= i - window)).sum()), (n, window)
