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


def test_a_group_rescales_when_any_of_its_rows_moved():
    x = np.zeros((4, 6))
    x[1, 3] = 5.0  # block 1 (columns 2-3): row 1 grows by 5
    assert fa4.group_rescale_share(x, block=2, threshold=8.0, group=2) == 0.0
    assert fa4.group_rescale_share(x, block=2, threshold=2.0, group=2) == pytest.approx(1 / 4)  # 1 of 2 x 2 pairs
    assert fa4.group_rescale_share(x, block=2, threshold=2.0, group=4) == pytest.approx(1 / 2)
    rng = np.random.default_rng(0)
    scores = rng.standard_normal((128, 1024)) * 2
    shares = [fa4.group_rescale_share(scores, block=128, threshold=t) for t in (0.0, 2.0, 8.0)]
    assert shares[0] >= shares[1] >= shares[2]
    with pytest.raises(ValueError, match="multiple of group=64"):
        fa4.group_rescale_share(scores[:100], block=128, threshold=2.0)


def test_round_e4m3_is_torchs_float8_e4m3fn_and_saturates():
    torch = pytest.importorskip("torch")
    x = np.concatenate([np.linspace(0.0, 448.0, 20001), np.exp2(np.linspace(-12.0, 8.8, 4001)),
                        [2.0**-10, 3 * 2.0**-11]])
    expected = torch.from_numpy(x).to(torch.float8_e4m3fn).to(torch.float64).numpy()
    np.testing.assert_array_equal(fa4.round_e4m3(x), expected)
    assert list(fa4.round_e4m3([463.0, 465.0, 65536.0])) == [448.0, 448.0, 448.0]  # saturation, not NaN
    with pytest.raises(ValueError, match="non-negative"):
        fa4.round_e4m3([-1.0])


def lagging_scores(threshold: float, *, blocks: int = 8, block: int = 64, seed: int = 0):
    """One head, D = 1, scale ln 2 (so the scores in log2 units are k itself): block 0 sets the row max at 0, and
    every later block holds one key just under ``threshold`` above it, so the kept max never moves and those keys'
    P is 2^(threshold - 0.01): the largest P a threshold allows. Returns (q, k, v, scale)."""
    rng = np.random.default_rng(seed)
    k = rng.uniform(-6.0, -1.0, size=(blocks * block, 1))
    k[0] = 0.0
    k[block::block] = threshold - 0.01
    q = np.ones((3, 1))
    v = rng.standard_normal((blocks * block, 5))
    v[block::block] = 1.0  # the keys that carry the weight: a saturated P shows as a shrunken output
    return q, k, v, float(np.log(2.0))


def fp8_error(q, k, v, scale, *, threshold, p_shift, block=64):
    """(error, bound): the e4m3 replay of the online softmax (``fa4.forward_conditional`` with ``p_shift``) against
    float64 attention, and what rounding P to e4m3 once may cost: 2^-4 of P |V| for P's 3 bits, plus 2^-(p_shift
    + 10) max|v| a key for weights below e4m3's normal range (l >= 1, so no more after the division)."""
    o, _, _, _ = fa4.forward_conditional(q, k, v, threshold=threshold, block_k=block, scale=scale, p_shift=p_shift)
    s = q @ k.T * scale
    weights = np.exp(s - s.max(axis=1, keepdims=True))
    weights /= weights.sum(axis=1, keepdims=True)
    bound = 2.0**-4 * (weights @ np.abs(v)) + k.shape[0] * 2.0 ** -(p_shift + 10) * np.abs(v).max() + 1e-12
    return np.abs(o - weights @ v), bound


def test_fp8_p_saturates_when_threshold_plus_shift_passes_448():
    """Trap 2 in numbers: FA4's 16-bit threshold (8) with the FP8 kernels' P scaling (2^8) lets P reach 2^16; e4m3
    saturates it at 448 while l counts it whole, and the output leaves the FP8 error bound by far. A threshold of
    2 with P scaled by 2^6 keeps P within 2^8 and the output within the bound, on the same kind of scores."""
    for threshold, p_shift in ((0.0, 8), (2.0, 6), (1.0, 7)):
        fa4.check_rescale_threshold(threshold, "float8_e4m3fn", p_offset_log2=p_shift)
        error, bound = fp8_error(*lagging_scores(threshold), threshold=threshold, p_shift=p_shift)
        assert np.all(error <= bound), (threshold, p_shift, float((error / bound).max()))
    with pytest.raises(ValueError, match="saturate"):
        fa4.check_rescale_threshold(8.0, "float8_e4m3fn", p_offset_log2=8)
    q, k, v, scale = lagging_scores(8.0)
    error, bound = fp8_error(q, k, v, scale, threshold=8.0, p_shift=8)
    assert (error / bound).min() > 10, float((error / bound).min())
    o, _, _, _ = fa4.forward_conditional(q, k, v, threshold=8.0, block_k=64, scale=scale, p_shift=8)
    assert np.all(o < 0.1)  # about 1 in float64: the weights clipped from 2^16 to 448, l counting them whole
    # Not the threshold alone: the same scores rescaled every time (threshold 0) stay within the bound.
    error, bound = fp8_error(*lagging_scores(8.0), threshold=0.0, p_shift=8)
    assert np.all(error <= bound)


def test_the_fp8_kernels_threshold_keeps_p_within_e4m3():
    """The Gluon FP8 stages' own settings (``fa3_fp8.FA4_STAGES``), through the same replay: set v9a_fp8 to FA4's
    16-bit threshold (8) on the kernels' P scaling (2^8) and this fails."""
    pytest.importorskip("torch")
    fa3_fp8 = pytest.importorskip("flashcourse.kernels.hopper.fa3_fp8", reason="this Triton has no Gluon Hopper API")
    thresholds = {name: s.rescale_threshold for name, s in fa3_fp8.FA4_STAGES.items()}
    assert thresholds["v9a_fp8"] > 0  # the FP8 stage that keeps a max
    for name, stage in fa3_fp8.FA4_STAGES.items():
        fa4.check_rescale_threshold(stage.rescale_threshold, "float8_e4m3fn", p_offset_log2=stage.p_shift)
        error, bound = fp8_error(*lagging_scores(max(stage.rescale_threshold, 0.01)),
                                 threshold=stage.rescale_threshold, p_shift=stage.p_shift)
        assert np.all(error <= bound), (name, float((error / bound).max()))


def test_stage_ratios_keep_the_fp8_rows_ratio_to_cudnn_fp16():
    row = _timing("v9a_fp8", "v8c_fp8", 1.01, dtype="float8_e4m3fn")
    row["ratio_vs_cudnn_fp16"] = row.pop("ratio_vs_sdpa_cudnn")
    (ratio,) = fa4.stage_ratios([row])
    assert ratio["ratio"] == 1.01 and ratio["ratio_vs_cudnn_fp16"] == pytest.approx(0.909)
    assert ratio["ratio_vs_sdpa_cudnn"] is None and ratio["dtype"] == "float8_e4m3fn"


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
