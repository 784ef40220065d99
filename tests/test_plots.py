"""Every figure function: called once on real algorithm output, it returns a Figure with a title and labelled
axes, and what it draws matches the numbers it was given."""

from __future__ import annotations

import numpy as np
import pytest
from matplotlib.figure import Figure

from flashcourse import bench, iomodel, plots, reference, tiled


def _check_labelled(fig: Figure) -> None:
    assert isinstance(fig, Figure)
    assert fig.axes, "the figure has no axes"
    titled = bool(fig.get_suptitle()) or all(ax.get_title() for ax in fig.axes if ax.get_label() != "<colorbar>")
    assert titled, "a panel has no title"
    for ax in fig.axes:
        if ax.get_label() == "<colorbar>":
            continue
        assert ax.get_xlabel() and ax.get_ylabel(), f"panel {ax.get_title()!r} lacks an axis label"


def test_roofline_draws_each_machine_with_its_ridge_point():
    machines = {"laptop": (100.0, 20.0), "GPU": (300_000.0, 2_000.0)}
    fig = plots.roofline(machines, {"attention softmax": 1.0})
    _check_labelled(fig)
    ax = fig.axes[0]
    assert "GFLOP/s" in ax.get_ylabel() and "FLOP/byte" in ax.get_xlabel()
    ridges = [line for line in ax.lines if len(line.get_xdata()) == 1]
    assert sorted((float(r.get_xdata()[0]), float(r.get_ydata()[0])) for r in ridges) == [(5.0, 100.0),
                                                                                            (150.0, 300_000.0)]


def test_memory_hierarchy():
    _check_labelled(plots.memory_hierarchy({"HBM": (80e9, 2000.0), "SRAM": (20e6, 19_000.0)}))


def test_memory_capacities_draws_one_bar_per_level_and_gpu_at_its_size():
    capacities = {"registers, one SM": {"A100": 262_144, "H100": 262_144},
                  "L2 cache": {"A100": 40e6, "H100": 50e6}, "HBM": {"A100": 80e9, "H100": 80e9}}
    fig = plots.memory_capacities(capacities)
    _check_labelled(fig)
    ax = fig.axes[0]
    assert ax.get_xscale() == "log"
    widths = sorted(bar.get_width() for bar in ax.patches)
    assert widths == sorted(v for per_gpu in capacities.values() for v in per_gpu.values())
    labels = {text.get_text().strip() for text in ax.texts}
    assert {"256 KB", "40.0 MB", "50.0 MB", "80 GB"} <= labels, labels


def test_causal_alignment_draws_each_mask_and_outlines_rows_with_no_key():
    top_left = reference.causal_mask(3, 8)
    bottom_right = reference.causal_mask(8, 3, q_start=3 - 8)  # N_q > N_k: the first 5 queries see no key
    fig = plots.causal_alignment({"top-left": top_left, "bottom-right": bottom_right})
    _check_labelled(fig)
    for ax, mask in zip(fig.axes, (top_left, bottom_right), strict=True):
        grey = ax.images[0].get_array()[..., 0] > 0.9  # masked cells are light grey, allowed ones blue
        np.testing.assert_array_equal(~grey, mask)
    empty_rows = [p for p in fig.axes[1].patches if p.get_edgecolor()[0] > 0.8 and not p.get_fill()]
    assert len(empty_rows) == 5 and not [p for p in fig.axes[0].patches if not p.get_fill()]


def test_matrix_heatmaps_blank_out_masked_scores(rng):
    q, k = rng.standard_normal((2, 8, 4))
    scores = np.where(reference.causal_mask(8, 8), q @ k.T, -np.inf)
    fig = plots.matrix_heatmaps({"S": scores, "P": reference.softmax_safe(scores)}, title="scores")
    _check_labelled(fig)
    shown = fig.axes[0].images[0].get_array()
    assert np.ma.getmaskarray(shown)[0, 1] or np.isnan(shown[0, 1]), "a masked score should be drawn blank"


def test_memory_vs_n_plots_megabytes():
    fig = plots.memory_vs_n([256, 512], {"naive": [1e6, 4e6]}, {"N^2": [1.1e6, 4.4e6]})
    _check_labelled(fig)
    assert "MB" in fig.axes[0].get_ylabel()
    np.testing.assert_allclose(fig.axes[0].lines[0].get_ydata(), [1.0, 4.0])


def test_traffic_by_step_leaves_out_the_total():
    steps = iomodel.naive_attention_hbm_bytes(1, 1, 256, 64)
    fig = plots.traffic_by_step(steps)
    _check_labelled(fig)
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert "total" not in labels and len(labels) == len(steps) - 1


def test_online_softmax_state_shows_the_running_max(rng):
    x = rng.standard_normal(12)
    steps = list(reference.softmax_online_steps(x, 4))
    fig = plots.online_softmax_state(x, steps, 1)
    _check_labelled(fig)
    running_max_line = fig.axes[0].lines[0]
    assert running_max_line.get_ydata()[0] == pytest.approx(steps[1].m)
    assert list(fig.axes[1].lines[0].get_ydata()) == [s.m for s in steps[:2]]


def test_tile_map_and_tile_order_draw_every_tile():
    tiles = tiled.tile_schedule(32, 32, 8, 8, causal=True)
    fig = plots.tile_map(tiles, current=tiles[4], done=tiles[:4], sram_note="Q[8:16]")
    _check_labelled(fig)
    assert len(fig.axes[0].patches) >= len(tiles) + 5
    fa1 = sorted(tiles, key=lambda t: (t.j, t.i))
    fig = plots.tile_order({"FA2": tiles, "FA1": fa1})
    _check_labelled(fig)
    computed = sum(t.kind != "skipped" for t in tiles)
    assert [len(ax.texts) for ax in fig.axes] == [computed, computed]


def test_traffic_vs_and_traffic_bars_on_simulated_counts(rng):
    ns, totals = [64, 128], {"standard": [], "flash": []}
    stats = {}
    for n in ns:
        q, k, v = rng.standard_normal((3, n, 16))
        for algorithm in totals:
            stats[algorithm] = iomodel.simulate(algorithm, q, k, v, sram=4096)[1]
            totals[algorithm].append(stats[algorithm].total)
    fig = plots.traffic_vs(ns, totals, {"N^2": [n * n for n in ns]}, xlabel="N (tokens)", title="traffic")
    _check_labelled(fig)
    assert list(fig.axes[0].lines[1].get_ydata()) == totals["flash"]
    fig = plots.traffic_bars(stats)
    _check_labelled(fig)
    heights = [p.get_height() for p in fig.axes[0].patches]
    assert heights == [stats["standard"].reads, stats["flash"].reads,
                       stats["standard"].writes, stats["flash"].writes]


def test_bar_chart():
    flops = {"forward": bench.attention_flops(1, 1, 128, 64), "backward": bench.attention_flops(1, 1, 128, 64,
                                                                                                 mode="bwd")}
    fig = plots.bar_chart(flops, xlabel="pass", ylabel="FLOPs", title="FLOPs")
    _check_labelled(fig)
    assert [p.get_height() for p in fig.axes[0].patches] == list(flops.values())


def test_rule_tile_maps_colour_tiles_by_kind_and_count_the_computed_ones():
    window = tiled.tile_schedule(32, 32, 8, 8, causal=True, window=(7, 0))
    causal = tiled.tile_schedule(32, 32, 8, 8, causal=True)
    keep, _ = reference.attention_rule(32, 32, causal=True, window=(7, 0)).block(
        0, 0, np.arange(32)[:, None], np.arange(32)[None, :])
    fig = plots.rule_tile_maps({"causal": (causal, reference.causal_mask(32, 32)), "window 8": (window, keep)})
    _check_labelled(fig)
    assert [len(ax.patches) for ax in fig.axes] == [16, 16]
    (image,) = fig.axes[1].images  # the kept entries, drawn over the tiles and exactly where the mask keeps
    assert image.get_zorder() > max(p.get_zorder() for p in fig.axes[1].patches)
    assert np.array_equal(image.get_array()[..., 3] > 0, keep)
    assert fig.axes[0].get_title().endswith("10 of 16 tiles computed")
    assert fig.axes[1].get_title().endswith("7 of 16 tiles computed")
    colours = {tuple(np.round(p.get_facecolor()[:3], 3)) for p in fig.axes[1].patches}
    assert len(colours) == 2  # window tiles are "masked" or "skipped", none entirely "full" at blocks of 8
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend == ["skipped tile", "full tile", "diagonal tile", "masked tile", "entry kept"]


def test_grouped_bars_leave_a_gap_for_a_missing_value():
    fig = plots.grouped_bars({"causal": {"ours": 300.0, "flex": 250.0}, "window": {"ours": 280.0}},
                             ylabel="TFLOP/s", title="speed")
    _check_labelled(fig)
    assert len(fig.axes[0].patches) == 3
    assert sorted(t.get_text() for t in fig.axes[0].texts) == ["250", "280", "300"]
