"""benchmarks/sweep_forward_rules.py on the CPU at a tiny size: every launch it times computes the default's output
(the row's max_rel_diff_vs_default), under a mask rule, packed documents and a window."""

import importlib.util
import sys
from pathlib import Path

import pytest

from flashcourse.bench import variants as bench_variants
from flashcourse.kernels.configs import KernelConfig

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def sweep():
    spec = importlib.util.spec_from_file_location("sweep_forward_rules", ROOT / "benchmarks" / "sweep_forward_rules.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _one_call_timing(fn, **_):
    from flashcourse.bench import Timing

    fn()
    return Timing(1.0, 1.0, 1.0, 3)


@pytest.mark.parametrize("variant", [
    bench_variants.Variant("chunked", 1, 2, 2, 40, 16, mask_rule="chunked local", mask_size=8),
    bench_variants.Variant("documents", 2, 2, 2, 40, 16, causal=True, documents=3),
    bench_variants.Variant("window", 1, 2, 2, 40, 16, window_left=8)])
def test_tiny_variant_matches_default(sweep, monkeypatch, variant):
    monkeypatch.setattr(bench_variants, "DEVICE", "cpu")
    monkeypatch.setattr("flashcourse.bench.time_repeats", _one_call_timing)
    launches = (KernelConfig(32, 16, 4, 1), KernelConfig(16, 16, 4, 1))
    rows = sweep.sweep_variant(variant, "float32", launches, lambda *_: None, with_flex=False)
    assert [row["config"] for row in rows] == [None, *(cfg.__dict__ for cfg in launches)]
    for row in rows:
        assert "error" not in row, row
        assert row["max_rel_diff_vs_default"] < 1e-5  # float32: another tiling, the same sums up to rounding
        assert row["ratio_vs_flex"] is None and row["tflops"] > 0


def test_every_default_variant_is_known_and_unknown_ones_are_refused(sweep, capsys):
    assert set(sweep.VARIANTS) <= {v.name for v in bench_variants.VARIANTS}
    with pytest.raises(SystemExit):
        sweep.parse_args(["--variants", "causl"])
    assert "unknown variants ['causl']" in capsys.readouterr().err
