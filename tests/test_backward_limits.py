"""bench.summary's readers of lesson 08's profile: what limits each backward (benchmarks/ncu_limits.py's JSON),
b1's launch sweep, and FlashAttention-3's backward design (b7, b7b, b7c) timed and profiled beside b1 and cuDNN, on
small result files written here, with numbers worked out by hand, and on the committed H100 runs the lesson reads."""

from __future__ import annotations

import json
import shutil

import pytest

from flashcourse.bench import results_dir, summary

H100_DESIGNS = "2026-12-06-nvidia-h100-80gb-hbm3-b7-designs.json"
H100_DESIGNS_PROFILE = "2026-12-06-nvidia-h100-80gb-hbm3-ncu-b7-designs.json"

# One product: 2 * B * H * N^2 * D = 2 * 1 * 1 * 1000^2 * 100 = 2e8 FLOP.
SHAPE = {"batch": 1, "heads": 1, "n": 1000, "head_dim": 100, "dtype": "float16", "causal": False}


def kernel_row(case, kernel, us, *, pipe=50.0, registers=128.0, local=0.0, red=0.0):
    """One (case, kernel) row as benchmarks/ncu_limits.py writes it (only the fields the reader uses)."""
    return {"case": case, "kernel": kernel, "duration_us": us, "tensor_pipe_pct": pipe,
            "registers_per_thread": registers, "local_load_bytes": local, "global_red_inst": red,
            "top_stalls": [["barrier", 2.0], ["wait", 1.0]]}


def profile_rows():
    # cuDNN: 100 us for 5 products (10 TFLOP/s) + 10 us of other kernels; b1: 5 us preprocess, 80 us for 4
    # products, 60 us for 3 (10 TFLOP/s each); b6a / b6c: 250 us for 5 (4 TFLOP/s) + 8 us of other kernels.
    return [kernel_row("bwd-cudnn", "void cudnn::compute_dot_do_o", 4.0),
            kernel_row("bwd-cudnn", "cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16", 100.0, pipe=67.0),
            kernel_row("bwd-cudnn", "void cudnn::convert_dq_to_16bits<0>", 6.0),
            kernel_row("bwd-b1", "_bwd_preprocess", 5.0),
            kernel_row("bwd-b1", "_bwd_dkdv_kernel", 80.0, registers=255.0, local=8e6),
            kernel_row("bwd-b1", "_bwd_dq_kernel", 60.0, registers=255.0, local=587e6),
            *(kernel_row(case, name, us, red=red)
              for case, main in (("bwd-b6a", "_b6a_kernel"), ("bwd-b6c", "_b6_ws_kernel"))
              for name, us, red in (("_bwd_preprocess", 5.0, 0.0), ("FillFunctor", 1.0, 0.0), (main, 250.0, 2**28),
                                    ("_dq_convert_kernel", 2.0, 0.0)))]


def write_profile(directory, date, rows, *, statuses=None):
    cases = {case: {"shape": dict(SHAPE), "status": (statuses or {}).get(case, "ok")}
             for case in summary.BACKWARD_LIMIT_CASES}
    cases["decode-fp16"] = {"shape": {}, "status": "ok"}
    meta = {"date": date, "device": "NVIDIA H200", "kind": "ncu-limits", "cases": cases}
    (directory / f"{date}-nvidia-h200-ncu-limits.json").write_text(json.dumps({"meta": meta, "rows": rows}))


def test_rates_and_ceilings_from_a_written_profile(tmp_path):
    assert summary.backward_limits(tmp_path) is None  # nothing measured yet
    write_profile(tmp_path, "2026-12-02", profile_rows())
    limits = summary.backward_limits(tmp_path)
    assert limits["flop_per_product"] == 2e8 and limits["file"] == "2026-12-02-nvidia-h200-ncu-limits.json"
    kernels, backwards = limits["kernels"], limits["backwards"]
    assert list(kernels) == ["cuDNN", "b1 dK/dV", "b1 dQ", "b6a", "b6c"]
    assert [kernels[k]["products"] for k in kernels] == [5, 4, 3, 5, 5]
    assert [kernels[k]["tflops"] for k in kernels] == pytest.approx([10.0, 10.0, 10.0, 4.0, 4.0])
    assert kernels["b1 dQ"]["local_load_bytes"] == 587e6 and kernels["b6c"]["global_red_inst"] == 2**28
    assert kernels["cuDNN"]["tensor_pipe_pct"] == 67.0 and kernels["b1 dK/dV"]["registers"] == 255.0
    assert kernels["b6a"]["top_stalls"] == ["barrier", "wait"]
    assert {name: (b["products"], b["us"], b["other_us"]) for name, b in backwards.items()} == {
        "cuDNN": (5, 110.0, 10.0), "b1": (7, 145.0, 5.0), "b6a": (5, 258.0, 8.0), "b6c": (5, 258.0, 8.0)}
    # b1 measured: 110 / 145. At cuDNN's 20 us a product: 7 * 20 + 5 = 145 us, the same here (equal rates).
    assert backwards["b1"]["over_cudnn"] == pytest.approx(110 / 145)
    assert backwards["b1"]["at_cudnn_rate"] == pytest.approx(110 / 145)
    # b6: 5 * 20 + 8 = 108 us at cuDNN's rate, faster than cuDNN's 110 (fewer other microseconds)
    assert backwards["b6a"]["at_cudnn_rate"] == pytest.approx(110 / 108)
    assert backwards["b6a"]["over_cudnn"] == pytest.approx(110 / 258)
    # 0.9x cuDNN is 122.2 us; b1's products then have 117.2 us for 1.4e9 FLOP: 11.94 TFLOP/s
    assert backwards["b1"]["needed_tflops"] == pytest.approx(11.943, abs=1e-3)
    for b in backwards.values():  # at the needed rate, each backward takes cuDNN's time over the target
        seconds = b["products"] * 2e8 / (b["needed_tflops"] * 1e12) + b["other_us"] * 1e-6
        assert backwards["cuDNN"]["us"] * 1e-6 / seconds == pytest.approx(summary.BACKWARD_TARGET)
    table = summary.backward_limits_markdown(limits)
    assert "N = 1000, D = 100, non-causal; one product 0.00 TFLOP" in table
    assert "| b1 dQ | 3 | 60 | 10 | 50% | 255 | 587 | 0 |" in table
    assert "| b6c | 5 | 250 | 4 | 50% | 128 | 0 | 268 |" in table


def test_the_newest_profile_with_every_backward_case_is_read(tmp_path):
    write_profile(tmp_path, "2026-12-02", profile_rows())
    newer = [r for r in profile_rows() if r["case"] != "bwd-b6c"]
    write_profile(tmp_path, "2026-12-05", newer, statuses={"bwd-b6c": "not run: the run's budget is spent"})
    assert summary.backward_limits(tmp_path)["date"] == "2026-12-02"
    causal = profile_rows()
    write_profile(tmp_path, "2026-12-06", causal)
    data = json.loads((tmp_path / "2026-12-06-nvidia-h200-ncu-limits.json").read_text())
    for case in data["meta"]["cases"].values():
        case["shape"]["causal"] = True
    (tmp_path / "2026-12-06-nvidia-h200-ncu-limits.json").write_text(json.dumps(data))
    limits = summary.backward_limits(tmp_path)
    assert limits["date"] == "2026-12-06" and limits["flop_per_product"] == 1e8  # causal: half of each product
    assert limits["kernels"]["cuDNN"]["tflops"] == pytest.approx(5.0)


def test_a_profile_that_cannot_be_compared_is_refused(tmp_path):
    write_profile(tmp_path, "2026-12-02", [r for r in profile_rows() if r["kernel"] != "_bwd_dq_kernel"])
    with pytest.raises(ValueError, match="_bwd_dq_kernel.*bwd-b1"):
        summary.backward_limits(tmp_path)
    write_profile(tmp_path, "2026-12-02", profile_rows())
    data = json.loads((tmp_path / "2026-12-02-nvidia-h200-ncu-limits.json").read_text())
    data["meta"]["cases"]["bwd-b6a"]["shape"]["n"] = 2000
    (tmp_path / "2026-12-02-nvidia-h200-ncu-limits.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match="different shapes"):
        summary.backward_limits(tmp_path)


def test_b1_launch_sweep_gives_the_default_and_the_best_launch(tmp_path):
    assert summary.b1_launch_sweep(tmp_path) is None
    launch = {"block_m": 128, "block_n": 64, "num_warps": 8, "num_stages": 3}
    base = {"dtype": "float16", "batch": 4, "heads": 16, "head_dim": 128, "n": 8192, "rule": None}
    rows = [{**base, "causal": True, "scheme": "sdpa_cudnn", "varied": None, "ms": 5.6},
            {**base, "causal": True, "scheme": "b1", "varied": "default", "dq_config": {}, "dkdv_config": {},
             "ratio_vs_sdpa_cudnn": 0.71},
            {**base, "causal": True, "scheme": "b1", "varied": "dq", "dq_config": launch, "dkdv_config": {},
             "ratio_vs_sdpa_cudnn": 0.76},
            {**base, "causal": True, "scheme": "b1", "varied": "dkdv", "dq_config": {}, "dkdv_config": {},
             "ratio_vs_sdpa_cudnn": 0.66},
            {**base, "causal": False, "scheme": "b3", "rule": "prefix-LM", "varied": "default",
             "ratio_vs_sdpa_cudnn": None}]
    meta = {"date": "2026-12-02", "device": "NVIDIA H200"}
    (tmp_path / "2026-12-02-nvidia-h200-backward-launches.json").write_text(json.dumps({"meta": meta, "rows": rows}))
    assert summary.b1_launch_sweep(tmp_path) == [{"head_dim": 128, "n": 8192, "causal": True, "default": 0.71,
                                                  "best": 0.76, "varied": "dq", "launch": "128x64/w8/s3"}]


# --------------------------------------------------------------- FlashAttention-3's backward design (b7, b7b, b7c)
def time_row(provider, dtype, head_dim, causal, ratio=None, *, status="ok", n=8192):
    row = {"kind": "time", "provider": provider, "dtype": dtype, "head_dim": head_dim, "causal": causal,
           "batch": 4, "heads": 16, "n": n, "mode": "bwd", "tflops": 400.0, "status": status}
    if ratio is not None:  # cuDNN's own row has no ratio to itself
        row.update(ratio_vs_sdpa_cudnn=ratio, ratio_vs_sdpa_cudnn_min=ratio - 0.02,
                   ratio_vs_sdpa_cudnn_max=ratio + 0.01)
    return row


def write_designs(directory, rows, *, kind="b7", name="2026-12-06-nvidia-h100-80gb-hbm3-b7-designs.json"):
    meta = {"date": "2026-12-06", "device": "NVIDIA H100 80GB HBM3", "triton": "3.9.0", "kind": kind,
            "block_m": {"64": 64, "128": 32},
            **{v: {"expected": f"{v}: 0.9x"} for v in ("b7", "b7b", "b7c")}}
    (directory / name).write_text(json.dumps({"meta": meta, "rows": rows}))


def test_backward_designs_reads_each_case_and_the_checks(tmp_path):
    assert summary.backward_designs(tmp_path) is None
    rows = [time_row("b7c", "float16", 64, True, 1.01), time_row("sdpa_cudnn", "float16", 64, True),
            time_row("b1", "float16", 64, True, 0.70), time_row("b7", "float16", 64, True, status="timed out"),
            time_row("b7", "bfloat16", 128, False, 0.75), time_row("fa4", "bfloat16", 128, False, 1.2),
            {"kind": "check", "provider": "b7", "status": "ok"}, {"kind": "check", "provider": "b7", "status": "bad"},
            {"kind": "check", "provider": "b7c", "status": "ok"}]
    write_designs(tmp_path, rows)
    # the profile's file matches the same pattern; the reader must take the timing run, not it
    write_designs(tmp_path, [], kind="ncu-limits", name="2026-12-06-nvidia-h100-80gb-hbm3-ncu-b7-designs.json")
    designs = summary.backward_designs(tmp_path)
    assert designs["file"] == "2026-12-06-nvidia-h100-80gb-hbm3-b7-designs.json"
    assert designs["shape"] == {"batch": 4, "heads": 16, "n": 8192} and designs["triton"] == "3.9.0"
    first, second = designs["rows"]
    assert (first["dtype"], first["head_dim"], first["causal"], first["cudnn_tflops"]) == ("float16", 64, True, 400.0)
    assert first["ratios"] == {"b1": 0.70, "b7c": 1.01}  # in the figure's order; b7 timed out, FA4 is no design
    assert list(first["ranges"]) == ["b1", "b7c"] and first["ranges"]["b7c"] == pytest.approx((0.99, 1.02))
    assert second["ratios"] == {"b7": 0.75} and second["cudnn_tflops"] is None
    assert designs["checks"] == {"b7": {"passed": 1, "of": 2}, "b7b": {"passed": 0, "of": 0},
                                 "b7c": {"passed": 1, "of": 1}}
    assert designs["expected"]["b7b"] == "b7b: 0.9x" and designs["query_rows"] == {64: 64, 128: 32}
    write_designs(tmp_path, [*rows, time_row("b7b", "float16", 64, True, 1.0, n=4096)])
    with pytest.raises(ValueError, match="2 shapes"):
        summary.backward_designs(tmp_path)


def test_backward_designs_of_the_committed_h100_run(tmp_path):
    # the file alone (with its profile, which the reader must pass over), so that a newer run does not hide it
    for name in (H100_DESIGNS, H100_DESIGNS_PROFILE):
        shutil.copy(results_dir() / name, tmp_path)
    designs = summary.backward_designs(tmp_path)
    assert designs["file"] == H100_DESIGNS and designs["device"] == "NVIDIA H100 80GB HBM3"
    by_case = {(r["dtype"], r["head_dim"], r["causal"]): r for r in designs["rows"]}
    assert len(by_case) == 8 and all(list(r["ratios"]) == list(summary.BACKWARD_DESIGNS) for r in by_case.values())
    assert by_case[("float16", 64, True)]["ratios"]["b7b"] == pytest.approx(1.03, abs=0.01)
    assert by_case[("bfloat16", 128, False)]["ratios"]["b1"] == pytest.approx(0.774, abs=0.001)
    assert by_case[("float16", 128, False)]["cudnn_tflops"] == pytest.approx(530.8, abs=0.1)
    assert designs["checks"] == {v: {"passed": 40, "of": 40} for v in ("b7", "b7b", "b7c")}
    assert designs["query_rows"] == {64: 64, 128: 32}


def ncu_design_row(case, kernel, us, pipe):
    return {"case": case, "kernel": kernel, "duration_us": us, "tensor_pipe_pct": pipe, "issue_active_pct": 20.0,
            "registers_per_thread": 168.0, "dynamic_shared_bytes": 1000.0, "top_stalls": [["barrier", 3.0]]}


def test_backward_designs_profile_takes_the_kernel_that_computes_the_products(tmp_path):
    assert summary.backward_designs_profile(tmp_path) is None
    shape = {"batch": 1, "heads": 1, "n": 1000, "head_dim": 128, "dtype": "float16", "causal": False}
    cases = {"bwd-cudnn": {"provider": "sdpa_cudnn", "status": "ok", "shape": dict(shape)},
             "bwd-b7b-d128": {"provider": "b7b", "status": "ok", "shape": dict(shape)},
             "bwd-b7c-d128": {"provider": "b7c", "status": "not run", "shape": {}}}
    rows = [ncu_design_row("bwd-cudnn", "void cudnn::compute_dot_do_o", 5.0, 0.5),
            ncu_design_row("bwd-cudnn", "cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma", 90.0, 67.0),
            ncu_design_row("bwd-b7b-d128", "_bwd_preprocess", 4.0, 0.1),
            ncu_design_row("bwd-b7b-d128", "_b7_kernel", 110.0, 52.0),
            ncu_design_row("bwd-b7b-d128", "_dq_convert_kernel", 2.0, 0.0)]
    path = tmp_path / "2026-12-06-nvidia-h100-80gb-hbm3-ncu-b7-designs.json"
    path.write_text(json.dumps({"meta": {"date": "2026-12-06", "device": "H100", "cases": cases}, "rows": rows}))
    profile = summary.backward_designs_profile(tmp_path)
    assert list(profile["kernels"]) == ["sdpa_cudnn", "b7b"] and profile["shape"] == shape
    assert profile["kernels"]["b7b"]["us"] == 110.0 and profile["kernels"]["b7b"]["total_us"] == 116.0
    assert profile["kernels"]["sdpa_cudnn"]["tensor_pipe_pct"] == 67.0
    assert profile["kernels"]["sdpa_cudnn"]["top_stalls"] == ["barrier"]
    path.write_text(json.dumps({"meta": {"date": "2026-12-06", "device": "H100", "cases": cases}, "rows": rows[:3]}))
    with pytest.raises(ValueError, match="_b7_kernel.*bwd-b7b-d128"):
        summary.backward_designs_profile(tmp_path)


def test_backward_designs_profile_of_the_committed_h100_run(tmp_path):
    shutil.copy(results_dir() / H100_DESIGNS_PROFILE, tmp_path)
    kernels = summary.backward_designs_profile(tmp_path)["kernels"]
    assert [round(kernels[p]["us"] / 1000, 1) for p in ("b7", "b7b", "b7c", "sdpa_cudnn")] == [13.2, 11.0, 10.3, 9.2]
    assert [round(kernels[p]["tensor_pipe_pct"]) for p in ("b7", "b7b", "b7c", "sdpa_cudnn")] == [44, 52, 56, 67]


def sites_row(case, kernel, *, grid, block, sites, barrier, cycles=10.0, wavefronts=1e9, us=100.0):
    """A kernel's row as ``ncu_limits.py --by-instruction`` writes it, with Source Counters where ``sites`` has any
    (only the fields the reader uses)."""
    row = {"case": case, "kernel": kernel, "grid": grid, "block": block, "duration_us": us,
           "warp_cycles_per_issued": cycles, "inst_executed": 1e6, "issue_active_pct": 30.0,
           "stalls": {"barrier": barrier}, "tensor_pipe_pct": 50.0, "shared_lsu_wavefronts": wavefronts,
           "shared_bank_conflicts": 1e6, "waves_per_sm": 1.0, "dram_bytes": 2e6}
    if sites:
        row["stall_sites"] = [{"sass": sass, "share": share, "executed": executed, "reasons": reasons}
                              for sass, share, executed, reasons in sites]
    return row


def test_backward_stall_sites_sets_apart_what_a_warp_waits_at_once(tmp_path):
    """A site run no more often than once per launched warp (here 4 programs x 12 warps = 48) is not a per-step
    cost: its barrier cycles per instruction are its share of the samples x its barrier share x the cycles."""
    assert summary.backward_stall_sites(tmp_path) is None
    shape = {"batch": 1, "heads": 1, "n": 1000, "head_dim": 128, "dtype": "float16", "causal": False}
    cases = {"bwd-b7c-d128": {"provider": "b7c", "status": "ok", "shape": dict(shape)},
             "bwd-cudnn": {"provider": "sdpa_cudnn", "status": "ok", "shape": dict(shape)}}
    rows = [sites_row("bwd-b7c-d128", "_b7_stats_kernel", grid="(2, 2, 1)", block="(128, 1, 1)", sites=[],
                      barrier=0.0),
            sites_row("bwd-b7c-d128", "_b7_kernel", grid="(2, 2, 1)", block="(384, 1, 1)", barrier=3.0,
                      sites=[("NOP", 0.2, 8.0, [["barrier", 1.0]]),  # 8 <= 48: once a warp
                             ("BRA", 0.1, 49.0, [["long_sb", 0.5], ["barrier", 0.5]])]),  # 49 > 48: in the loop
            sites_row("bwd-cudnn", "cudnn_generated_fort_native_sdpa_sm90_flash_bprop", grid="(132, 1, 1)",
                      block="(384, 1, 1)", barrier=1.5, sites=[("BRA", 0.1, 5e6, [["barrier", 1.0]])], cycles=7.0)]
    path = tmp_path / "2026-12-06-nvidia-h100-80gb-hbm3-ncu-b7c-by-instruction.json"
    path.write_text(json.dumps({"meta": {"date": "2026-12-06", "device": "H100", "cases": cases}, "rows": rows}))
    found = summary.backward_stall_sites(tmp_path)
    b7c, cudnn = found["kernels"]["b7c"], found["kernels"]["sdpa_cudnn"]
    assert b7c["launched_warps"] == 48 and cudnn["launched_warps"] == 132 * 12
    assert b7c["once_per_warp"] == pytest.approx(0.2 * 1.0 * 10.0) and cudnn["once_per_warp"] == 0
    assert [site["reason"] for site in b7c["top_sites"]] == ["barrier", "long_sb"]
    assert found["shape"] == shape and b7c["barrier"] == 3.0
    # the kernels that compute no product come with the product kernel's entry, by name, in launch order
    assert b7c["others"] == [("stats (lse, Delta)", 100.0, 2e6)] and cudnn["others"] == []
    assert summary.backward_stall_sites(tmp_path, run="b7d") is None  # another run's file: not this one
    cases["bwd-cudnn"]["shape"] = dict(shape, n=2000)
    path.write_text(json.dumps({"meta": {"date": "2026-12-06", "device": "H100", "cases": cases}, "rows": rows}))
    with pytest.raises(ValueError, match="2 shapes"):
        summary.backward_stall_sites(tmp_path)


def test_backward_lengths_orders_each_case_by_length(tmp_path):
    assert summary.backward_lengths(tmp_path) is None
    rows = [{"kind": "time", "status": "ok", "provider": provider, "dtype": "float16", "head_dim": 64,
             "causal": False, "n": n, "ratio_vs_sdpa_cudnn": ratio, "ratio_vs_b1": ratio / 0.8, "tflops": 500 * ratio}
            for provider, n, ratio in (("b7c", 2048, 0.95), ("b1", 1024, 0.8), ("b7c", 1024, 0.9),
                                       ("sdpa_cudnn", 1024, 1.0))]
    rows.append({"kind": "time", "status": "hang at n=4096", "provider": "b7c", "dtype": "float16", "head_dim": 64,
                 "causal": False, "n": 4096})
    (tmp_path / "2026-12-06-h100-b7c-lengths.json").write_text(json.dumps(
        {"meta": {"date": "2026-12-06", "device": "H100", "triton": "3.9.0"}, "rows": rows}))
    found = summary.backward_lengths(tmp_path)
    assert found["rows"] == {("float16", 64, False): {"b7c": [(1024, 0.9), (2048, 0.95)], "b1": [(1024, 0.8)]}}
    assert found["rates"][("float16", 64, False)]["b7c"] == [(1024, 450.0), (2048, 475.0)]
    assert found["vs_b1"] == pytest.approx((0.9 / 0.8, 0.95 / 0.8))


def test_default_backward_grid_reads_both_head_dims_beside_cudnn(tmp_path):
    """Lesson 08's grid as a user calls it: our backward rows by kernel and length, each beside cuDNN's time at the
    same shape; the forward, other providers and failed rows left out; the newest file of each head dim."""
    assert summary.default_backward_grid(tmp_path) is None

    def row(provider, head_dim, n, ms, mode="bwd", status="ok", kernel="b7c"):
        found = {"provider": provider, "dtype": "float16", "head_dim": head_dim, "causal": False, "n": n, "mode": mode,
                 "status": status, "ms": ms}
        if provider == "flashcourse":
            found.update(backward_kernel=kernel, ratio_vs_sdpa_cudnn=0.5 / ms)
        return found

    meta = {"date": "2026-12-07", "device": "H100", "triton": "3.9.0"}
    files = {"2026-12-06-h100-grid-t39-d64.json": [row("flashcourse", 64, 1024, 9.0)],  # older: not read
             "2026-12-07-h100-grid-t39-d64.json": [
                 row("flashcourse", 64, 2048, 1.0), row("flashcourse", 64, 1024, 0.8), row("sdpa_cudnn", 64, 1024, 0.3),
                 row("sdpa_cudnn", 64, 2048, 0.9), row("flashcourse", 64, 1024, 0.1, mode="fwd"),
                 row("flashcourse", 64, 4096, 3.0, status="oom"), row("sdpa_flash", 64, 1024, 0.4)],
             "2026-12-07-h100-grid-t39-d128.json": [row("flashcourse", 128, 1024, 0.5, kernel="b7e"),
                                                         row("sdpa_cudnn", 128, 1024, 0.25)]}
    for name, rows in files.items():
        (tmp_path / name).write_text(json.dumps({"meta": meta, "rows": rows}))
    grid = summary.default_backward_grid(tmp_path)
    assert grid["files"] == ["2026-12-07-h100-grid-t39-d64.json", "2026-12-07-h100-grid-t39-d128.json"]
    assert grid["rows"] == {("float16", 64, False): {"b7c": [(1024, 0.5 / 0.8), (2048, 0.5)]},
                            ("float16", 128, False): {"b7e": [(1024, 1.0)]}}
    assert grid["ms"][("float16", 64, False)] == [(1024, 0.8, 0.3), (2048, 1.0, 0.9)]
    assert (grid["device"], grid["triton"]) == ("H100", "3.9.0")
    assert summary.default_backward_grid(tmp_path, tag="t36") is None


def test_prepared_launches_pairs_the_two_runs_beside_cudnn(tmp_path):
    """Lesson 08's fix, measured: each backward row of the run launched through Triton beside the same shape's row of
    the prepared run and cuDNN's, up to max_n; a head dim with only one of the two runs, the forward, failed rows and
    other providers left out."""
    assert summary.prepared_launches(tmp_path) is None

    def row(provider, n, ms, *, causal=False, mode="bwd", status="ok"):
        return {"provider": provider, "dtype": "bfloat16", "head_dim": 64, "causal": causal, "n": n, "mode": mode,
                "status": status, "ms": ms, "backward_kernel": "b7c" if provider == "flashcourse" else None}

    meta = {"date": "2026-12-07", "device": "H100", "triton": "3.9.0"}
    runs = {"through-triton": [row("flashcourse", 1024, 0.9), row("flashcourse", 1024, 0.8, causal=True),
                               row("flashcourse", 4096, 3.0), row("sdpa_cudnn", 1024, 9.9)],
            "prepared": [row("flashcourse", 1024, 0.3), row("flashcourse", 1024, 0.2, causal=True, status="oom"),
                         row("flashcourse", 4096, 3.1), row("sdpa_cudnn", 1024, 0.25), row("sdpa_cudnn", 4096, 3.2),
                         row("flashcourse", 1024, 0.1, mode="fwd"), row("sdpa_flash", 1024, 0.4)]}
    for path, rows in runs.items():
        (tmp_path / f"2026-12-07-h100-grid-t39-d64-{path}.json").write_text(json.dumps({"meta": meta, "rows": rows}))
    (tmp_path / "2026-12-07-h100-grid-t39-d128-prepared.json").write_text(json.dumps(
        {"meta": meta, "rows": [row("flashcourse", 1024, 0.3) | {"head_dim": 128}]}))
    found = summary.prepared_launches(tmp_path)
    assert found["ms"] == {"bf16, D = 64, no mask, N = 1024": {"through Triton": 0.9, "prepared": 0.3, "cuDNN": 0.25}}
    assert found["kernels"] == ["b7c"] and found["files"] == [
        "2026-12-07-h100-grid-t39-d64-through-triton.json", "2026-12-07-h100-grid-t39-d64-prepared.json"]
    assert list(summary.prepared_launches(tmp_path, max_n=4096)["ms"]) == [
        "bf16, D = 64, no mask, N = 1024", "bf16, D = 64, no mask, N = 4096"]


def test_backward_lengths_and_stall_sites_of_the_committed_h100_runs(tmp_path):
    """The numbers lesson 08 reads: b7c over b1 at every length, and the two spare warps' wait set apart."""
    for name in ("2026-12-06-nvidia-h100-80gb-hbm3-b7c-lengths.json",
                 "2026-12-06-nvidia-h100-80gb-hbm3-ncu-b7c-by-instruction.json"):
        shutil.copy(results_dir() / name, tmp_path)
    lengths = summary.backward_lengths(tmp_path)
    assert len(lengths["rows"]) == 8 and all(len(series["b7c"]) == 5 for series in lengths["rows"].values())
    assert [round(x, 2) for x in lengths["vs_b1"]] == [1.05, 1.44]
    kernels = summary.backward_stall_sites(tmp_path)["kernels"]
    assert round(kernels["b7c"]["barrier"] - kernels["b7c"]["once_per_warp"], 2) == 1.16
    assert round(kernels["sdpa_cudnn"]["barrier"], 2) == 1.54 and kernels["sdpa_cudnn"]["once_per_warp"] == 0


def test_backward_tile_step_pairs_b7d_with_b7c_at_the_same_shape(tmp_path):
    assert summary.backward_tile_step(tmp_path) is None
    rows = [{"kind": "time", "status": "ok", "provider": provider, "dtype": "float16", "head_dim": 128,
             "causal": causal, "n": n, "tflops": tflops, "ratio_vs_sdpa_cudnn": tflops / 500}
            for provider, causal, n, tflops in (("b7c", False, 1024, 400), ("b7d", False, 1024, 420),
                                                ("b7c", True, 1024, 300), ("b7d", True, 1024, 330),
                                                ("b7d", True, 2048, 999))]  # no b7c at 2048: left out
    rows.append({"kind": "time", "status": "hang", "provider": "b7d", "dtype": "float16", "head_dim": 128,
                 "causal": False, "n": 4096})
    (tmp_path / "2026-12-06-h100-b7d-lengths.json").write_text(json.dumps(
        {"meta": {"date": "2026-12-06", "device": "H100"}, "rows": rows}))
    case = summary.backward_tile_step(tmp_path)["cases"][("float16", 128)]
    assert case["over_b7c"] == pytest.approx((1.05, 1.1)) and case["over_cudnn"] == pytest.approx((0.66, 0.84))


def test_backward_tile_step_of_the_committed_h100_run(tmp_path):
    """What lesson 08 says of b7d: at D = 128, 4-7% over b7c in fp16, none in bf16, short of cuDNN."""
    shutil.copy(results_dir() / "2026-12-06-nvidia-h100-80gb-hbm3-b7d-lengths.json", tmp_path)
    cases = summary.backward_tile_step(tmp_path)["cases"]
    assert [round(x, 2) for x in cases[("float16", 128)]["over_b7c"]] == [1.04, 1.07]
    assert [round(x, 2) for x in cases[("bfloat16", 128)]["over_b7c"]] == [0.98, 1.04]
    assert all(case["over_cudnn"][1] < 1 for case in cases.values())


def test_stall_sites_of_the_committed_b7d_profile(tmp_path):
    """What lesson 08 reads of b7d at D = 128: the same tensor work as b7c, a third fewer instructions than cuDNN,
    fewer shared-memory requests than b7c but more bank conflicts, and small kernels that take cuDNN's time."""
    name = "2026-12-07-nvidia-h100-80gb-hbm3-ncu-b7d-by-instruction.json"
    shutil.copy(results_dir() / name, tmp_path)
    found = summary.backward_stall_sites(tmp_path, run="b7d")
    assert found["file"] == name and list(found["kernels"]) == ["b7c", "b7d", "sdpa_cudnn"]
    b7c, b7d, cudnn = (found["kernels"][p] for p in ("b7c", "b7d", "sdpa_cudnn"))
    assert [round(k["us"] / 1000, 2) for k in (b7c, b7d, cudnn)] == [10.28, 9.67, 9.19]
    tensor_ms = [k["us"] / 1000 * k["tensor_pipe_pct"] / 100 for k in (b7c, b7d, cudnn)]
    assert [round(t, 2) for t in tensor_ms] == [5.77, 5.76, 6.13]
    assert round(b7d["barrier"] - b7d["once_per_warp"], 2) == 1.30 and b7d["launched_warps"] == 64 * 64 * 12
    assert b7d["bank_conflicts"] > 9 * cudnn["bank_conflicts"] and b7d["waves"] == 31.03 and cudnn["waves"] == 1.0
    assert [label for label, _, _ in b7d["others"]] == ["stats (lse, Delta)", "zero-fill of dQ's buffer",
                                                       "dQ convert"]
    assert [label for label, _, _ in cudnn["others"]] == ["dot_do_o (Delta)", "dQ convert"]
    assert round(sum(us for _, us, _ in b7d["others"])) == 312 and round(sum(us for _, us, _ in cudnn["others"])) == 318


def test_backward_lengths_reads_another_variant_and_its_prediction(tmp_path):
    rows = [{"kind": "time", "status": "ok", "provider": provider, "dtype": "bfloat16", "head_dim": 256,
             "causal": True, "n": n, "ratio_vs_sdpa_cudnn": ratio, "ratio_vs_b1": ratio / 0.5, "tflops": 1.0}
            for provider, n, ratio in (("b8", 2048, 0.9), ("b1", 2048, 0.5), ("b7c", 2048, 0.8))]
    meta = {"date": "2026-12-07", "device": "H100", "triton": "3.9.0", "b8": {"expected": "0.8x cuDNN"}}
    (tmp_path / "2026-12-07-h100-b8-lengths.json").write_text(json.dumps({"meta": meta, "rows": rows}))
    assert summary.backward_lengths(tmp_path) is None  # no b7c run committed there
    found = summary.backward_lengths(tmp_path, variant="b8")
    assert found["rows"] == {("bfloat16", 256, True): {"b8": [(2048, 0.9)], "b1": [(2048, 0.5)]}}
    assert found["vs_b1"] == pytest.approx((1.8, 1.8)) and found["expected"] == "0.8x cuDNN"


def test_backward_variant_checks_counts_each_variant_and_pairs_the_timings(tmp_path):
    assert summary.backward_variant_checks(tmp_path) is None
    meta = {"date": "2026-12-07", "device": "H100", "triton": "3.9.0", "variants": ["b8", "b8b"],
            "b8": {"expected": "0.8x"}, "b8b": {"expected": "b8 within 5%"}}
    rows = [{"kind": "check", "provider": "b8", "n": 17, "status": "ok"},
            {"kind": "check", "provider": "b8b", "n": 1, "status": "ok"},
            {"kind": "check", "provider": "b8b", "n": 17, "status": "max error 0.3"},
            *(time_row(provider, "float16", 256, False, ratio) for provider, ratio in (("b8", 1.0), ("b8b", 0.9))),
            time_row("b1", "float16", 256, False, status="timed out")]
    path = tmp_path / "2026-12-07-h100-b8-checks.json"
    path.write_text(json.dumps({"meta": meta, "rows": rows}))
    found = summary.backward_variant_checks(tmp_path)
    assert found["checks"] == {"b8": {"passed": 1, "of": 1}, "b8b": {"passed": 1, "of": 2}}
    assert found["checked_n"] == [1, 17] and found["shape"] == {"batch": 4, "heads": 16, "n": 8192}
    assert found["tflops"] == {("float16", 256, False): {"b8": 400.0, "b8b": 400.0}}  # b1's row did not run
    assert found["expected"]["b8b"] == "b8 within 5%"
    path.write_text(json.dumps({"meta": meta, "rows": [*rows, time_row("b8", "float16", 256, True, 1.0, n=4096)]}))
    with pytest.raises(ValueError, match="2 shapes"):
        summary.backward_variant_checks(tmp_path)


def test_b8_runs_as_committed(tmp_path):
    """What lesson 08 says of b8 at D = 256: 1.45-1.99x b1 and 0.85-1.05x cuDNN by length, b8b -6% to +3% of b8."""
    for name in ("2026-12-07-nvidia-h100-80gb-hbm3-b8-lengths.json", "2026-12-07-nvidia-h100-80gb-hbm3-b8-checks.json"):
        shutil.copy(results_dir() / name, tmp_path)
    lengths = summary.backward_lengths(tmp_path, variant="b8")
    assert len(lengths["rows"]) == 4 and all(len(series["b8"]) == 5 for series in lengths["rows"].values())
    assert [round(x, 2) for x in lengths["vs_b1"]] == [1.45, 1.99]
    ratios = [r for series in lengths["rows"].values() for _, r in series["b8"]]
    assert (round(min(ratios), 2), round(max(ratios), 2)) == (0.85, 1.05)
    checks = summary.backward_variant_checks(tmp_path)
    assert checks["checks"] == {"b8": {"passed": 20, "of": 20}, "b8b": {"passed": 20, "of": 20}}
    change = [t["b8b"] / t["b8"] - 1 for t in checks["tflops"].values()]
    assert (round(min(change), 2), round(max(change), 2)) == (-0.06, 0.03)


def test_b7e_runs_as_committed(tmp_path):
    """What lesson 08 says of b7e at D = 128: 1.03-1.12x b7c by length (b7c timed beside it, read with it), 120 of 120
    checks for b7d, b7e and b7f, and a profile with 51 million fewer bank conflicts than b7d's."""
    for run in ("b7e-lengths", "b7e-checks", "ncu-b7e-by-instruction"):
        name = f"2026-12-07-nvidia-h100-80gb-hbm3-{run}.json"
        shutil.copy(results_dir() / name, tmp_path)
    lengths = summary.backward_lengths(tmp_path, variant="b7e")
    assert all(set(series) == {"b7e", "b7c", "b1"} and len(series["b7c"]) == 5 for series in lengths["rates"].values())
    over_b7c = [dict(series["b7e"])[n] / rate for (_, d, _), series in lengths["rates"].items() if d == 128
                for n, rate in series["b7c"]]
    assert (round(min(over_b7c), 2), round(max(over_b7c), 2)) == (1.03, 1.12)
    checks = summary.backward_variant_checks(tmp_path, run="b7e")
    assert checks["checks"] == {v: {"passed": 40, "of": 40} for v in ("b7d", "b7e", "b7f")}
    assert {head_dim for _, head_dim, _ in checks["tflops"]} == {64, 128} and len(checks["tflops"]) == 8
    kernels = summary.backward_stall_sites(tmp_path, run="b7e")["kernels"]
    assert round((kernels["b7d"]["bank_conflicts"] - kernels["b7e"]["bank_conflicts"]) / 1e6) == 51
