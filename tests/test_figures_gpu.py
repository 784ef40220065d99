"""The tables and figures of lessons 07-08 read benchmark rows right: the ratios they print are the rows' ratios."""

from __future__ import annotations

import numpy as np
import pytest
from matplotlib.container import BarContainer
from matplotlib.figure import Figure

from flashcourse import figures_gpu


def _row(provider: str, tflops: float, *, mode: str = "fwd", n: int = 4096, causal: bool = False,
         status: str = "ok", **version) -> dict:
    return {"provider": provider, "dtype": "float16", "batch": 4, "heads": 16, "head_dim": 128, "n": n,
            "causal": causal, "mode": mode, "status": status, "tflops": tflops, **version}


def _rows(rng: np.random.Generator) -> tuple[list[dict], dict[str, float]]:
    rates = dict(zip(("v1", "v2", "SDPA flash", "SDPA cuDNN"), rng.uniform(100, 600, 4), strict=True))
    rows = [
        _row("flashcourse", rates["v1"], forward_version="v1"),
        _row("flashcourse", rates["v2"], forward_version="v2"),
        _row("sdpa_flash", rates["SDPA flash"]),
        _row("sdpa_cudnn", rates["SDPA cuDNN"]),
        _row("flashcourse", 1.0, mode="bwd", backward_version="b1"),  # another mode: not in the fwd table
        _row("naive", 5.0, status="oom"),  # did not run: left out
    ]
    return rows, rates


def test_version_rates_groups_by_shape_and_kernel(rng):
    rows, rates = _rows(rng)
    by_shape = figures_gpu.version_rates(rows, mode="fwd")
    assert list(by_shape) == ["fp16 B4 H16 D128 N4096"]
    assert by_shape["fp16 B4 H16 D128 N4096"] == rates
    assert figures_gpu.version_rates(rows, mode="bwd") == {"fp16 B4 H16 D128 N4096": {"b1": 1.0}}


def test_versions_markdown_prints_ratios_to_both_baselines(rng):
    rows, rates = _rows(rng)
    table = figures_gpu.versions_markdown(figures_gpu.version_rates(rows), source="test run")
    v2_line = next(line for line in table.splitlines() if line.startswith("| v2 "))
    flash, cudnn = rates["v2"] / rates["SDPA flash"], rates["v2"] / rates["SDPA cuDNN"]
    assert f"{rates['v2']:.0f} ({flash:.2f}, {cudnn:.2f})" in v2_line, v2_line
    assert table.startswith("test run")


def test_figures_have_labelled_axes(rng):
    rows, _ = _rows(rng)
    speeds = figures_gpu.version_speeds(figures_gpu.version_rates(rows), title="speeds")
    losses = figures_gpu.loss_curves({"a": [2.0, 1.5, 1.0], "b": [2.0, 1.5, 1.0 + 1e-6]}, chance=2.8)
    for fig in (speeds, losses):
        assert isinstance(fig, Figure)
        for ax in fig.axes:
            assert ax.get_xlabel() and ax.get_ylabel() and ax.get_title()


def test_newest_per_shape_takes_each_shape_whole_from_the_newest_file(rng):
    rows, rates = _rows(rng)
    rerun = [_row("flashcourse", 2.0 * rates["v1"], forward_version="v1"), _row("sdpa_flash", 1.0)]
    other_shape = [_row("sdpa_flash", 7.0, n=1024)]
    attention = {"kind": "attention"}
    fp8_run = {"meta": {"kind": "attention-fp8"}, "rows": [{"n": 4096, "tflops": 9.0}], "path": "a/attention-fp8.json"}
    merged = figures_gpu.newest_per_shape([{"meta": attention, "rows": rows + other_shape, "path": "a/old.json"},
                                           {"meta": attention, "rows": rerun, "path": "a/rerun.json"},
                                           fp8_run])  # another benchmark a glob on "attention" finds: left out
    by_shape = figures_gpu.version_rates(merged)
    # N=4096 comes from the rerun alone: nothing of the old file's N=4096 rows survives
    assert by_shape["fp16 B4 H16 D128 N4096"] == {"v1": 2.0 * rates["v1"], "SDPA flash": 1.0}
    assert by_shape["fp16 B4 H16 D128 N1024"] == {"SDPA flash": 7.0}
    assert {r["source_file"] for r in merged if r["n"] == 4096} == {"rerun.json"}


def test_our_default_kernel_is_drawn_when_the_rows_name_no_version(rng):
    """The attention benchmark times the default kernel, whose rows carry no forward_version or backward_version:
    they are ours, and the figures must show them beside SDPA's."""
    rates = rng.uniform(100, 600, 3)
    rows = [_row("flashcourse", rates[0]), _row("sdpa_flash", rates[1]), _row("sdpa_cudnn", rates[2]),
            _row("flashcourse", rates[0] / 2, mode="bwd")]
    forward = figures_gpu.version_rates(rows, mode="fwd")
    assert forward == {"fp16 B4 H16 D128 N4096": {figures_gpu.DEFAULT_LABEL: rates[0], "SDPA flash": rates[1],
                                                  "SDPA cuDNN": rates[2]}}
    assert figures_gpu.version_rates(rows, mode="bwd") == {"fp16 B4 H16 D128 N4096": {figures_gpu.DEFAULT_LABEL:
                                                                                       rates[0] / 2}}
    speeds = figures_gpu.version_speeds(forward, title="attention")
    assert [tick.get_text() for tick in speeds.axes[0].get_xticklabels()] == list(forward["fp16 B4 H16 D128 N4096"])


def _grid_rows(rng, sizes=(1024, 2048, 4096, 8192, 16384), heads_dims=((16, 128), (32, 64))) -> list[dict]:
    """The attention benchmark's grid: 5 lengths x 2 head shapes x causal or not = 20 shapes."""
    rows = []
    for n in sizes:
        for heads, head_dim in heads_dims:
            for causal in (False, True):
                for provider in ("flashcourse", "sdpa_flash", "sdpa_cudnn"):
                    rows.append({**_row(provider, float(rng.uniform(100, 600)), n=n, causal=causal),
                                 "heads": heads, "head_dim": head_dim})
    return rows


def _legend_styles(fig: Figure) -> dict[str, tuple]:
    legend = fig.axes[0].get_legend()
    return {text.get_text(): (tuple(np.round(patch.get_facecolor(), 3)), patch.get_hatch())
            for text, patch in zip(legend.get_texts(), legend.get_patches(), strict=True)}


@pytest.mark.parametrize("lengths", [5, 12], ids=["20 shapes", "48 shapes"])
def test_every_shape_has_a_bar_style_of_its_own(rng, lengths):
    rates = figures_gpu.version_rates(_grid_rows(rng, sizes=[1024 * (i + 1) for i in range(lengths)]))
    assert len(rates) == 4 * lengths
    styles = _legend_styles(figures_gpu.version_speeds(rates, title="grid"))
    assert sorted(styles) == sorted(rates)
    assert len(set(styles.values())) == len(styles), "two shapes share a colour and hatch: the legend is ambiguous"
    for shape, (colour, hatch) in styles.items():  # a causal shape is its non-causal twin, hatched
        if shape.endswith(" causal"):
            twin_colour, twin_hatch = styles[shape.removesuffix(" causal")]
            assert colour == twin_colour and hatch != twin_hatch


def test_the_attention_grid_gives_each_provider_its_own_colour_and_marker(rng):
    rows = [{**row, "provider": provider} for row in _grid_rows(rng)
            for provider in ("flashcourse", "sdpa_flash", "sdpa_cudnn", "sdpa_efficient", "naive")
            if row["provider"] == "flashcourse"]
    providers = ["flashcourse", "sdpa_flash", "sdpa_cudnn", "sdpa_efficient", "naive"]
    fig = figures_gpu.attention_grid(rows, providers, title="grid")
    lines = fig.axes[0].get_lines()
    assert [line.get_label() for line in lines] == providers
    assert len({(line.get_color(), line.get_marker()) for line in lines}) == len(providers)
    assert len({line.get_marker() for line in lines}) == len(providers)


def test_backward_design_ratios_draws_each_design_at_its_ratio():
    rows = [{"dtype": "float16", "head_dim": 64, "causal": True, "ratios": {"b1": 0.7, "b7": 0.85, "b7b": 1.03},
             "ranges": {"b1": (0.66, 0.73), "b7": (0.74, 0.89), "b7b": (0.95, 1.07)}},
            {"dtype": "bfloat16", "head_dim": 128, "causal": False, "ratios": {"b1": 0.77, "b7b": 0.83},
             "ranges": {"b1": (0.76, 0.79), "b7b": (0.82, 0.87)}}]
    fig = figures_gpu.backward_design_ratios(rows, title="ratios")
    (ax,) = fig.axes
    assert ax.get_xlabel() and ax.get_ylabel() and ax.get_title() == "ratios"
    bars = {container.get_label(): [patch.get_height() for patch in container.patches] for container in ax.containers
            if isinstance(container, BarContainer)}
    assert list(bars) == ["b1", "b7", "b7b"]
    assert bars["b1"] == [0.7, 0.77] and bars["b7b"] == [1.03, 0.83]
    assert bars["b7"][0] == 0.85 and np.isnan(bars["b7"][1])  # b7 not timed in the second case: a gap
    assert [tick.get_text() for tick in ax.get_xticklabels()] == ["fp16\nD = 64\ncausal", "bf16\nD = 128\nnon-causal"]
    (cudnn,) = [line for line in ax.get_lines() if line.get_label() == "cuDNN (= 1)"]
    assert list(cudnn.get_ydata()) == [1.0, 1.0]
    written = sorted(text.get_text() for text in ax.texts)
    assert written == sorted(["0.70", "0.77", "0.85", "1.03", "0.83"])
    assert ax.get_ylim()[1] >= 1.07 + 0.2  # the highest whisker and its value fit


def test_backward_lengths_draws_one_panel_per_head_dim_and_mask():
    rows = {("float16", 64, False): {"b7c": [(1024, 0.9), (4096, 0.95)], "b1": [(1024, 0.8), (4096, 0.75)]},
            ("bfloat16", 64, False): {"b7c": [(1024, 0.92)], "b1": [(1024, 0.81)]},
            ("float16", 128, True): {"b7c": [(1024, 0.85)], "b1": [(1024, 0.8)]}}
    fig = figures_gpu.backward_lengths(rows, title="by length")
    assert [ax.get_title() for ax in fig.axes] == ["D = 64, non-causal", "D = 128, causal"]
    first = {line.get_label(): line for line in fig.axes[0].get_lines() if not line.get_label().startswith("_")}
    assert sorted(first) == ["b1, bf16", "b1, fp16", "b7c, bf16", "b7c, fp16", "cuDNN (= 1)"]
    assert list(first["b7c, fp16"].get_xdata()) == [1024, 4096] and list(first["b7c, fp16"].get_ydata()) == [0.9, 0.95]
    assert first["b1, bf16"].get_linestyle() == "--" and first["b1, fp16"].get_linestyle() == "-"
    assert any(list(line.get_ydata()) == [1.0, 1.0] for line in fig.axes[1].get_lines())  # cuDNN's speed
    assert fig.axes[0].get_xscale() == "log" and fig.axes[0].get_ylabel()
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["1K", "4K"]
    (legend,) = fig.legends  # one legend for every panel, outside them
    assert sorted(t.get_text() for t in legend.get_texts()) == sorted(first)
