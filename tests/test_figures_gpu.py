"""The tables and figures of lessons 07-08 read benchmark rows right: the ratios they print are the rows' ratios."""

from __future__ import annotations

import numpy as np
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
