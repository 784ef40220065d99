"""Lesson 13's profile of where the fastest forward stage trails cuDNN (``summary.forward_gaps``): read from the
newest ``*-ncu-gaps.json``, ours beside cuDNN's kernel for each forward-gap pair of ``benchmarks/ncu_limits.py``."""

from __future__ import annotations

import json

from flashcourse.bench import summary


def kernel_row(case, duration, barrier, shared):
    return {"case": case, "duration_us": duration, "tensor_pipe_pct": 70.0, "issue_active_pct": 40.0,
            "stalls": {"barrier": barrier, "wait": 1.0}, "dynamic_shared_bytes": shared}


def write_gaps(directory, date, rows):
    meta = {"date": date, "device": "NVIDIA H200", "kind": "ncu-limits"}
    (directory / f"{date}-nvidia-h200-ncu-gaps.json").write_text(json.dumps({"meta": meta, "rows": rows}))


def test_no_profile_no_table(tmp_path):
    assert summary.forward_gaps(tmp_path) is None
    write_gaps(tmp_path, "2026-12-02", [kernel_row("bwd-d256-causal-ours", 100.0, 1.0, 0)])
    assert summary.forward_gaps(tmp_path) is None  # a profile without a forward pair


def test_pairs_ours_with_cudnn_from_the_newest_profile(tmp_path):
    write_gaps(tmp_path, "2026-12-01", [kernel_row("fwd-d128-n4096-ours", 999.0, 9.0, 1024),
                                        kernel_row("fwd-d128-n4096-cudnn", 1.0, 1.0, 1024)])
    write_gaps(tmp_path, "2026-12-02", [kernel_row("fwd-d128-n4096-ours", 862.9, 3.0, 164152),
                                        kernel_row("fwd-d128-n4096-cudnn", 839.8, 1.37, 232448),
                                        kernel_row("fwd-d64-n4096-causal-ours", 657.3, 1.69, 90504)])
    gaps = summary.forward_gaps(tmp_path)
    assert list(gaps["pairs"]) == ["D = 128, N = 4096"]  # D = 64 has no cuDNN row: no pair
    ours, cudnn = gaps["pairs"]["D = 128, N = 4096"]
    assert (ours["duration_us"], cudnn["duration_us"]) == (862.9, 839.8)
    table = summary.forward_gaps_table(gaps)
    assert "2026-12-02-nvidia-h200-ncu-gaps.json" in table
    row = next(line for line in table.splitlines() if line.startswith("D = 128, N = 4096"))
    assert row.split()[6:] == ["863", "/", "840", "70%", "/", "70%", "40%", "/", "40%", "3.0", "/", "1.4", "160",
                              "/", "227"]
