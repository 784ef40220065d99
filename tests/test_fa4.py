"""FlashAttention-4's portable ideas in NumPy (lesson 14): the emulated exp2 against float64, conditional rescaling
against the exact attention, and the saturation check."""

from __future__ import annotations

import numpy as np
import pytest

from flashcourse import fa4, reference


def test_polynomial_meets_both_ends_and_its_error_bound():
    c = fa4.EXP2_POLY3.astype(np.float64)
    assert np.polyval(c[::-1], 0.0) == 1.0 and np.polyval(c[::-1], 1.0) == pytest.approx(2.0, abs=1e-6)
    bound = fa4.exp2_relative_error()
    assert 1e-5 < bound < 2e-4  # a degree-3 fit; below fp16's half-step 2^-11 / 2
    x = np.random.default_rng(1).uniform(-120, 120, 20000).astype(np.float32)
    assert np.max(np.abs(fa4.exp2_emulated(x) / np.exp2(x.astype(np.float64)) - 1)) <= bound * 1.001
    assert fa4.exp2_relative_error(fa4.fit_exp2_polynomial(4).astype(np.float32)) < bound / 5  # degree buys digits


def test_emulated_exp2_edges_by_hand():
    x = np.array([-np.inf, -127.0, -126.0, -1.0, 0.0, 1.0, 5.0, 127.5, 128.0], dtype=np.float32)
    y = fa4.exp2_emulated(x)
    assert y[0] == 0 and y[1] == 0  # masked scores and the flushed range
    assert y[2] == np.float32(2.0 ** -126) and list(y[3:7]) == [0.5, 1.0, 2.0, 32.0]  # integers: exact
    assert y[7] == pytest.approx(2.0 ** 127.5, rel=2e-4) and np.isinf(y[8])
    assert y.dtype == np.float32


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("threshold", [0.0, 8.0])
def test_conditional_rescaling_gives_the_exact_attention(causal, threshold):
    rng = np.random.default_rng(7)
    q, k, v = (rng.standard_normal((37, 19)) for _ in range(3))  # N not a multiple of the block, odd D
    k[20:] *= 4  # later keys with larger scores: the max grows along the row
    o, lse, rescales, visited = fa4.forward_conditional(q, k, v, threshold=threshold, block_k=8, causal=causal)
    np.testing.assert_allclose(o, reference.attention(q, k, v, causal=causal), rtol=1e-12, atol=1e-12)
    s = q @ k.T / np.sqrt(19)
    if causal:
        s = np.where(np.triu(np.ones_like(s, dtype=bool), 1), -np.inf, s)
    np.testing.assert_allclose(lse, np.log(np.exp(s).sum(axis=1)), rtol=1e-12)
    assert 0 <= rescales <= visited


def test_a_threshold_saves_rescales_and_keeps_the_max_within_it():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((16, 2048)) * 2 + np.linspace(0, 40, 2048)
    m0, l0, every = fa4.row_stats_conditional(x, block=64, threshold=0.0)
    m8, l8, few = fa4.row_stats_conditional(x, block=64, threshold=8.0)
    assert few.sum() * 3 < every.sum()
    np.testing.assert_allclose(m8 + np.log2(l8), m0 + np.log2(l0), rtol=1e-12)
    assert np.all(x.max(axis=1) - m8 <= 8.0) and np.all(m0 == x.max(axis=1))
    one = fa4.row_stats_conditional(np.array([[0.0, 8.0, 8.5]]), block=1, threshold=8.0)
    assert one[2][0] == 1 and one[0][0] == 8.5  # a growth of exactly 8 keeps the max; 8.5 passes
    with pytest.raises(ValueError, match="block"):
        fa4.row_stats_conditional(x, block=0, threshold=8.0)
    with pytest.raises(ValueError, match="threshold"):
        fa4.row_stats_conditional(x, block=4, threshold=-1.0)


def test_saturation_check_refuses_fp8_with_a_threshold():
    fa4.check_rescale_threshold(fa4.RESCALE_THRESHOLD_16BIT, "float16")
    fa4.check_rescale_threshold(fa4.RESCALE_THRESHOLD_16BIT, "bfloat16")
    fa4.check_rescale_threshold(0.0, "float8_e4m3fn", p_offset_log2=fa4.FP8_P_OFFSET_LOG2)  # FA4's FP8 setting
    with pytest.raises(ValueError, match="saturate"):
        fa4.check_rescale_threshold(8.0, "float8_e4m3fn", p_offset_log2=fa4.FP8_P_OFFSET_LOG2)
    with pytest.raises(ValueError, match="saturate"):
        fa4.check_rescale_threshold(16.0, "float16")
    with pytest.raises(ValueError, match="dtype"):
        fa4.check_rescale_threshold(8.0, "int8")


def _timing(stage, base, ratio, *, n=1024, dtype="float16", causal=False, status="ok"):
    row = {"kind": "time", "provider": stage, "stage": stage, "builds_on": base, "dtype": dtype, "head_dim": 64,
           "causal": causal, "n": n, "status": status, "ratio_vs_sdpa_cudnn": ratio * 0.9}
    if base:
        row[f"ratio_vs_{base}"] = ratio
    return row


def test_stage_ratios_read_the_base_stage_and_skip_the_rest():
    rows = [
        _timing("v9a", "v8f", 0.95, n=4096),
        _timing("v9a", "v8f", 0.90, n=1024, causal=True),
        _timing("v9b_1of4", "v8f", 1.02, dtype="bfloat16"),
        _timing("v8f", "", 1.0),  # the base stage itself: no ratio to anything
        _timing("v9a", "v8f", 0.5, status="error"),  # a failed run is no measurement
        {"kind": "check", "stage": "v9a", "builds_on": "v8f", "status": "ok"},
    ]
    ratios = fa4.stage_ratios(rows)
    assert [(r["stage"], r["n"], r["ratio"]) for r in ratios] == [("v9a", 4096, 0.95), ("v9a", 1024, 0.90),
                                                                   ("v9b_1of4", 1024, 1.02)]
    assert all(r["base"] == "v8f" for r in ratios) and ratios[0]["ratio_vs_sdpa_cudnn"] == pytest.approx(0.855)
    assert fa4.ratio_ranges(ratios) == {("v9a", 64): (0.90, 0.95), ("v9b_1of4", 64): (1.02, 1.02)}
    broken = _timing("v9a", "v8f", 0.95)
    del broken["ratio_vs_v8f"]
    with pytest.raises(ValueError, match="ratio_vs_v8f"):
        fa4.stage_ratios([broken])


def test_fa4_stage_figure_has_a_panel_per_head_dim_and_causality():
    from flashcourse import plots

    ratios = fa4.stage_ratios([_timing("v9a", "v8f", 0.95, n=1024), _timing("v9a", "v8f", 0.97, n=4096),
                               _timing("v9a", "v8f", 0.9, causal=True)])
    fig = plots.fa4_stage_ratios(ratios, title="t")
    assert [ax.get_title() for ax in fig.axes] == ["D = 64, non-causal (base: v8f)", "D = 64, causal (base: v8f)"]
    line = fig.axes[0].get_lines()[0]
    assert list(line.get_xdata()) == [1024, 4096] and list(line.get_ydata()) == [0.95, 0.97]
    assert [tuple(ln.get_ydata()) for ln in fig.axes[0].get_lines()][-1] == (1.0, 1.0)  # the no-change line
