"""The benchmark method on CPU: every figure the median of at least three repeats with their range, a gain only
beyond the range, partial runs merged into one file (never across devices), and tables that show the range when
a row has it and still render the older files that do not."""

from __future__ import annotations

import json

import pytest

from flashcourse import bench
from flashcourse.bench import summary, versions
from flashcourse.bench.__main__ import _with_head_dims, main
from flashcourse.bench.providers import add_ratios


def fake_timer(times):
    """A timer(fn, grad_to_none) that returns the given milliseconds one call after another, calling fn once."""
    left = list(times)

    def timer(fn, grad_to_none=None):
        fn()
        return left.pop(0)

    return timer


def test_time_repeats_returns_median_and_range_of_three_repeats_by_default():
    calls = []
    timing = bench.time_repeats(lambda: calls.append(1), timer=fake_timer([2.0, 1.0, 5.0, 9.0]))
    assert (timing.ms, timing.ms_min, timing.ms_max, timing.repeats) == (2.0, 1.0, 5.0, 3)
    assert len(calls) == 3 == bench.REPEATS


def test_time_repeats_takes_more_repeats_and_refuses_fewer_than_three():
    timing = bench.time_repeats(lambda: None, repeats=5, timer=fake_timer([4.0, 3.0, 8.0, 1.0, 2.0]))
    assert (timing.ms, timing.ms_min, timing.ms_max) == (3.0, 1.0, 8.0)
    with pytest.raises(ValueError, match="at least 3"):
        bench.time_repeats(lambda: None, repeats=2, timer=fake_timer([1.0, 1.0]))


def test_timing_fields_put_the_slowest_repeat_at_the_lowest_rate():
    fields = bench.Timing(ms=2.0, ms_min=1.0, ms_max=4.0, repeats=3).fields(flops=4e12)
    assert fields["ms"] == 2.0 and fields["ms_min"] == 1.0 and fields["ms_max"] == 4.0 and fields["repeats"] == 3
    assert fields["tflops"] == pytest.approx(2000.0)
    assert fields["tflops_min"] == pytest.approx(1000.0) and fields["tflops_max"] == pytest.approx(4000.0)


def rated(tflops, low=None, high=None, **extra):
    row = {"tflops": tflops, "status": "ok", **extra}
    if low is not None:
        row.update(tflops_min=low, tflops_max=high)
    return row


def test_a_gain_counts_only_beyond_both_ranges():
    assert bench.verdict(rated(110, 108, 112), rated(100, 98, 103)) == "gain"
    assert bench.verdict(rated(100, 98, 103), rated(110, 108, 112)) == "loss"
    assert bench.verdict(rated(105, 100, 109), rated(100, 98, 103)) == "within spread", "medians 5% apart, overlap"
    assert bench.verdict(rated(110), rated(100)) is None, "a run without repeats has no verdict"
    fast, slow = {"ms": 1.0, "ms_min": 0.9, "ms_max": 1.1}, {"ms": 2.0, "ms_min": 1.9, "ms_max": 2.1}
    assert bench.verdict(fast, slow, "ms", higher_is_better=False) == "gain"
    assert bench.verdict(slow, fast, "ms", higher_is_better=False) == "loss"


def test_ratios_carry_their_range_when_both_rows_have_one():
    rows = [rated(200, 190, 210, provider="ours", key=1), rated(100, 95, 100, provider="theirs", key=1),
            rated(200, provider="ours", key=2), rated(100, 90, 110, provider="theirs", key=2)]
    add_ratios(rows, key=lambda r: r["key"], rate="tflops", ours=("ours",))
    assert rows[0]["ratio_vs_theirs"] == pytest.approx(2.0)
    assert rows[0]["ratio_vs_theirs_min"] == pytest.approx(1.9) and rows[0]["ratio_vs_theirs_max"] == pytest.approx(
        210 / 95)
    assert "ratio_vs_theirs_min" not in rows[2], "no range without one on both sides"


def test_format_spread_with_and_without_a_range():
    assert bench.format_spread(rated(544.2, 538.0, 551.4)) == "544 (538-551)"
    assert bench.format_spread(rated(544.2)) == "544"
    assert bench.format_spread({"ratio_vs_x": 0.951, "ratio_vs_x_min": 0.93, "ratio_vs_x_max": 0.97},
                               "ratio_vs_x", ".2f", "x") == "0.95x (0.93-0.97)"


# ------------------------------------------------------------------------------------------ merge
def attention_row(provider, head_dim, mode="fwd", tflops=100.0, spread=True, **extra):
    row = {"provider": provider, "dtype": "float16", "batch": 4, "heads": 16 if head_dim == 128 else 32,
           "head_dim": head_dim, "n": 4096, "causal": False, "mode": mode, **rated(tflops), **extra}
    if spread:
        row.update(tflops_min=tflops - 3, tflops_max=tflops + 4, repeats=3, ms=1.0, ms_min=0.97, ms_max=1.03)
    return row


def write(path, rows, device="NVIDIA H200", kind="attention", date="2026-12-01"):
    meta = {"date": date, "device": device, "torch": "2.11", "triton": "3.6", "kind": kind}
    path.write_text(json.dumps({"meta": meta, "rows": rows}))
    return path


def test_merge_joins_partial_runs_and_records_them(tmp_path):
    a = write(tmp_path / "a.json", [attention_row("flashcourse", 64), attention_row("sdpa_flash", 64)])
    b = write(tmp_path / "b.json", [attention_row("flashcourse", 128), attention_row("sdpa_flash", 64, tflops=7.0)],
              date="2026-12-02")
    path = bench.merge_results("attention-fp16", [a, b], directory=tmp_path / "out")
    assert path.name == "2026-12-01-nvidia-h200-attention-fp16.json", "named after the first file's date and device"
    data = json.loads(path.read_text())
    assert data["meta"]["kind"] == "attention"
    assert [m["file"] for m in data["meta"]["merged_from"]] == ["a.json", "b.json"]
    assert [m["date"] for m in data["meta"]["merged_from"]] == ["2026-12-01", "2026-12-02"]
    got = sorted((r["provider"], r["head_dim"], r["tflops"]) for r in data["rows"])
    assert got == [("flashcourse", 64, 100.0), ("flashcourse", 128, 100.0), ("sdpa_flash", 64, 7.0)], \
        "a later file's row replaces the same row of an earlier one"


def test_merge_refuses_mixed_devices_and_kinds(tmp_path):
    a = write(tmp_path / "a.json", [attention_row("flashcourse", 64)])
    other_gpu = write(tmp_path / "b.json", [attention_row("flashcourse", 128)], device="NVIDIA A100-SXM4-80GB")
    with pytest.raises(ValueError, match="device 'NVIDIA A100-SXM4-80GB' differs from 'NVIDIA H200'"):
        bench.merge_results("attention-fp16", [a, other_gpu], directory=tmp_path)
    decode = write(tmp_path / "c.json", [{"provider": "flashcourse", "kv_len": 4096}], kind="decode")
    with pytest.raises(ValueError, match="benchmark 'decode' differs from 'attention'"):
        bench.merge_results("attention-fp16", [a, decode], directory=tmp_path)
    assert not list(tmp_path.glob("2026-*")), "nothing written when the merge is refused"


def test_merge_command_says_why_it_refuses(tmp_path, capsys):
    a = write(tmp_path / "a.json", [attention_row("flashcourse", 64)])
    b = write(tmp_path / "b.json", [attention_row("flashcourse", 128)], device="NVIDIA B200")
    with pytest.raises(SystemExit, match="merge: cannot merge b.json into a.json: device"):
        main(["merge", "attention-fp16", str(a), str(b), "--out", str(tmp_path)])


def test_kind_of_older_files_comes_from_their_name(tmp_path):
    meta = {"date": "2026-11-29", "device": "NVIDIA H200"}
    for name, kind in (("attention-fp16", "attention"), ("named-kernels-versions", "versions"),
                       ("variants", "variants"), ("decode-tune", "decode-tune")):
        assert bench.result_kind({"meta": meta, "path": f"x/2026-11-29-nvidia-h200-{name}.json"}) == kind


def test_head_dim_filter_splits_the_grid():
    assert _with_head_dims(((32, 64), (16, 128)), [128]) == ((16, 128),)
    assert _with_head_dims(((32, 64), (16, 128)), None) == ((32, 64), (16, 128))
    with pytest.raises(SystemExit, match="--head-dim 96 matches none"):
        _with_head_dims(((32, 64), (16, 128)), [96])


def test_the_attention_grid_reverses_the_providers_order_along_each_series_and_between_masks(monkeypatch):
    """Whichever is timed first gains a little (H100, 2026-12-07): the grid alternates the order along each length
    series and between a length's masked and unmasked shape, and each row says where its provider ran."""
    from flashcourse.bench import attention

    timed = []
    monkeypatch.setattr(attention, "warm_up_gpu", lambda: None)
    monkeypatch.setattr(attention, "validate_ours", lambda shape: {"ok": True})
    monkeypatch.setattr(attention, "measure_shape", lambda shape, provider, **kw: timed.append(
        (shape.n, shape.causal, provider)) or [{"provider": provider, **shape.__dict__, "mode": "fwd", "tflops": 1.0,
                                                "status": "ok"}])
    providers = ("flashcourse", "sdpa_cudnn")
    shapes = attention.shape_grid(("float16",), (1024, 2048, 4096), ((16, 128),), (False, True))
    rows = attention.run(shapes, providers=providers, log=lambda text: None)
    first = {(n, causal): provider for n, causal, provider in timed[::2]}
    ours_first = {key for key, provider in first.items() if provider == "flashcourse"}
    assert ours_first == {(1024, False), (2048, True), (4096, False)}
    assert [(r["provider"], r["position"]) for r in rows if (r["n"], r["causal"]) == (2048, False)] == [
        ("sdpa_cudnn", 0), ("flashcourse", 1)]


# ------------------------------------------------------------------------------------------ tables
@pytest.mark.parametrize("spread", [True, False])
def test_readme_table_shows_the_range_when_the_rows_have_it(tmp_path, spread):
    ours = attention_row("flashcourse", 128, tflops=544.2, spread=spread)
    cudnn = attention_row("sdpa_cudnn", 128, tflops=572.0, spread=spread)
    rows = [ours, cudnn]
    from flashcourse.bench import attention

    attention.add_ratios(rows)
    write(tmp_path / "2026-12-01-nvidia-h200-attention-fp16.json", rows)
    text = summary.attention_summary(tmp_path)
    line = next(x for x in text.splitlines() if x.startswith("| 16 x 128 | 4096 |"))
    if spread:
        assert "| 544 (541-548) |" in line and "0.95x (0.94-0.96)" in line and "median of 3 repeats" in text
    else:
        assert "| 544 | 0.95x |" in line and "repeats" not in text
    # only cuDNN was timed: no column for a backend the run left out
    assert "| vs cuDNN |" in text and "vs SDPA flash" not in text and "vs efficient" not in text


def version_rows(spread):
    rows = []
    for name, rate in (("v1", 300.0), ("v2", 303.0), ("v3", 400.0), ("v4", 390.0), ("v5", 200.0), ("v6", 201.0),
                       ("v7", 202.0)):
        rows.append(attention_row("flashcourse", 128, tflops=rate, spread=spread, forward_version=name))
    for name in ("b1", "b2", "b3"):
        rows.append(attention_row("flashcourse", 128, mode="bwd", tflops=300.0, spread=spread, backward_version=name))
    for provider in ("sdpa_flash", "sdpa_cudnn"):
        rows += [attention_row(provider, 128, mode=m, tflops=350.0, spread=spread) for m in ("fwd", "bwd")]
    return rows


def test_version_verdicts_count_a_gain_only_beyond_the_range():
    found = {v["version"]: v["verdict"] for v in versions.version_verdicts(version_rows(True), "fwd")}
    assert found["v2"] == "within spread", "303 against 300 with +-3/4 ranges is noise"
    assert found["v3"] == "gain" and found["v5"] == "loss"
    assert {v["verdict"] for v in versions.version_verdicts(version_rows(False), "fwd")} == {None}


@pytest.mark.parametrize("spread", [True, False])
def test_kernels_table_with_and_without_a_range(tmp_path, spread):
    write(tmp_path / "2026-12-01-nvidia-h200-versions.json", version_rows(spread), kind="versions")
    table = versions.kernels_table(tmp_path)
    v3 = next(x for x in table.splitlines() if x.startswith("| fwd v3"))
    v2 = next(x for x in table.splitlines() if x.startswith("| fwd v2"))
    if spread:
        assert v3.endswith("| 400 (397-404) ▲ |") and v2.endswith("| 303 (300-307) |") and "▼" in table
        assert "median of 3 repeats" in table
    else:
        assert v3.endswith("| 400 |") and "▲" not in table and "repeats" not in table


def test_variants_table_with_a_range(tmp_path):
    base = {"variant": "causal", "dtype": "float16", "mode": "fwd", "density": 0.5, "n": 16384, "window_left": None}
    rows = [{**base, **rated(400, 396, 405), "provider": "flashcourse", "repeats": 3},
            {**base, **rated(320, 318, 322), "provider": "flex", "repeats": 3}]
    from flashcourse.bench import variants

    variants.add_ratios(rows)
    write(tmp_path / "2026-12-01-nvidia-h200-variants.json", rows, kind="variants")
    line = next(x for x in summary.variants_summary(tmp_path).splitlines() if x.startswith("| causal"))
    assert "| 400 (396-405) | 320 (318-322) | 1.25x (1.23-1.27) |" in line
