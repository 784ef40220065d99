"""``bench decode``'s FP8 cache rows on CPU: the kernels in the interpreter at a tiny size, fake timers."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from flashcourse import device  # noqa: E402

if not device.triton_available():
    pytest.skip("Triton is not installed here", allow_module_level=True)
from flashcourse.bench import decode as decode_bench  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SHAPE = (1, 4, 2, 16, 64)  # (B, H_q, H_kv, D, KV length)


def test_fp8_cache_rows_follow_the_float16_rows(monkeypatch):
    """One float8_e4m3fn row per provider of ours after every float16 row (older readers find float16 first),
    each with ``speedup_vs_fp16_cache`` = the float16 row's time over its own and that ratio's range; every call
    reads the next of ``caches_rotated`` caches and its time is the graph's over their number; our rows carry
    ``max_abs_err`` against float64, larger for the FP8 cache."""
    made = []
    make_cache = decode_bench.make_cache

    def counting_make_cache(*shape):
        made.append(shape)
        return make_cache(*shape, dtype=torch.float16, device=DEVICE)

    kv_fp8_bytes = 2 * SHAPE[2] * SHAPE[3] * SHAPE[4]
    # rounds of (ours float16, SDPA math, ours FP8), 2 caches rotated: each graph time covers two calls
    times = iter([4.0, 8.0, 2.0, 4.4, 8.0, 2.2, 3.8, 8.0, 1.9])
    monkeypatch.setattr(decode_bench, "graph_ms", lambda fn, rep=0: next(times))
    monkeypatch.setattr(decode_bench, "make_cache", counting_make_cache)
    monkeypatch.setattr(decode_bench, "copy_bandwidth", lambda: 3e12)
    monkeypatch.setattr(decode_bench, "read_bandwidth", lambda: 2.9e12)
    rows = decode_bench.run(shapes=(SHAPE,), providers=("flashcourse", "sdpa_math"), page_sizes=(16,),
                            rotate_bytes=kv_fp8_bytes, log=lambda line: None)
    ours = [r for r in rows if r["provider"] == "flashcourse"]
    assert [r["kv_dtype"] for r in ours] == ["float16", "float8_e4m3fn"]
    assert [r["provider"] for r in rows if "kv_len" in r][-1] == "flashcourse", "FP8 rows come last"
    assert not any(r["kv_dtype"] == "float8_e4m3fn" for r in rows if r["provider"] == "sdpa_math")
    fp16, fp8 = ours
    assert len(made) == 2 and fp8["caches_rotated"] == fp16["caches_rotated"] == 2
    assert fp16["ms"] == pytest.approx(2.0) and fp8["ms"] == pytest.approx(1.0)
    assert fp8["speedup_vs_fp16_cache"] == pytest.approx(2.0)
    assert fp8["speedup_vs_fp16_cache_min"] == pytest.approx(1.9 / 1.1)  # float16's fastest over FP8's slowest
    assert fp8["speedup_vs_fp16_cache_max"] == pytest.approx(2.2 / 0.95)
    assert fp8["bandwidth_tbs"] == pytest.approx(kv_fp8_bytes / 1e-3 / 1e12), "the FP8 cache's bytes, not fp16's"
    assert "ratio_vs_sdpa_math" in fp16 and "ratio_vs_sdpa_math" not in fp8, "bandwidths of unequal bytes"
    assert fp16["rel_err"] < 1e-2 and fp8["rel_err"] < 1e-2, "each against the cache it reads"
    assert 0 < fp16["max_abs_err"] < fp8["max_abs_err"] < 0.1
    fp8_line = next(line for line in decode_bench.format_table(rows).splitlines() if " fp8 " in line)
    assert fp8_line.rstrip().endswith("2.00"), fp8_line


def test_rotation_keeps_the_l2_from_holding_a_cache():
    """Enough copies that L2_ROTATE_BYTES of others are read between two reads of one."""
    assert decode_bench.rotation_copies(64 << 20) == 5  # a 32K FP8 cache: 64 MiB, under 2x the L2
    assert decode_bench.rotation_copies(512 << 20) == 2  # 128K in float16
    assert decode_bench.rotation_copies(1000, rotate_bytes=0) == 1


def test_provider_fn_refuses_an_fp8_cache_for_sdpa():
    q, k, v = decode_bench.make_cache(*SHAPE, dtype=torch.float16, device=DEVICE)
    with pytest.raises(ValueError, match="float8_e4m3fn for flashcourse and flashcourse_paged only"):
        decode_bench.provider_fn("sdpa_flash", q, k, v, kv_dtype="float8_e4m3fn")


def test_kv_dtype_errors_puts_fp8_beside_fp16():
    """What lesson 09 prints: the FP8 cache's largest error against float64, beside the float16 cache's."""
    torch.manual_seed(0)
    q, k, v = decode_bench.make_cache(1, 4, 2, 32, 100, dtype=torch.float16, device=DEVICE)
    errors = decode_bench.kv_dtype_errors(q, k, v)
    assert set(errors) == {"float16", "float8_e4m3fn"}
    assert errors["float16"] < 2e-3 < errors["float8_e4m3fn"] < 0.1


def test_candidates_check_then_time_against_the_float16_cache(monkeypatch):
    """``candidates`` at a tiny size (interpreter, fake timers): one row per candidate, layout and length; each
    checked against float64 before it is timed, a wrong one recorded and left untimed; every FP8 row's
    ``speedup_vs_fp16_cache`` is fp16_shipped's time over its own, with its range."""
    make_cache = decode_bench.make_cache
    monkeypatch.setattr(decode_bench, "make_cache", lambda *shape: make_cache(*shape, dtype=torch.float16,
                                                                              device=DEVICE))
    speeds = {"fp16_shipped": 4.0, "shipped": 3.5, "t128_kadj_2x": 2.0}
    calls = {}

    def timer(fn, rep=0):  # a time per candidate (read off the function's closure), drifting a little each round
        calls[fn] = calls.get(fn, 0) + 1
        return speeds[fn.__closure__[0].cell_contents[0].candidate_name] * (1 + 0.1 * (calls[fn] - 2))

    real_fn = decode_bench._candidate_fn

    def tagged_fn(candidate, cache):
        fn = real_fn(candidate, cache)
        if candidate.name == "broken":  # a kernel that gets the answer wrong
            return lambda: fn() * 2
        fn.candidate_name = candidate.name
        return fn

    monkeypatch.setattr(decode_bench, "graph_ms", timer)
    monkeypatch.setattr(decode_bench, "_candidate_fn", tagged_fn)
    chosen = [c._replace(block_n=c.block_n and 16) for c in decode_bench.CANDIDATES if c.name in speeds]
    chosen.append(decode_bench.Candidate("broken", "float8_e4m3fn"))
    rows = decode_bench.candidates(lengths=(40,), page_sizes=(16,), chosen=tuple(chosen), shape=(1, 8, 2, 64),
                                   rotate_bytes=0, log=lambda line: None)
    assert len(rows) == 2 * len(chosen)
    assert {r.get("page_size") for r in rows} == {None, 16}
    broken = [r for r in rows if r["candidate"] == "broken"]
    assert all(r["status"] == "wrong" and r["rel_err"] > 0.1 and "ms" not in r for r in broken)
    ok = [r for r in rows if r["candidate"] != "broken"]
    assert all(r["status"] == "ok" and r["rel_err"] < 1e-2 and r["repeats"] == 3 for r in ok)
    adjacent = next(r for r in ok if r["candidate"] == "t128_kadj_2x" and "page_size" not in r)
    assert adjacent["ms"] == pytest.approx(2.0) and adjacent["speedup_vs_fp16_cache"] == pytest.approx(2.0)
    assert adjacent["speedup_vs_fp16_cache_min"] == pytest.approx(3.6 / 2.2)  # fp16's fastest over its slowest
    assert adjacent["switches"] == {"programs_per_sm": 2, "mask_tail_only": True}
    assert adjacent["v_layout"] == "keys_adjacent"
    assert "speedup_vs_fp16_cache" not in next(r for r in ok if r["candidate"] == "fp16_shipped")
    table = decode_bench.format_candidates(rows)
    assert "t128_kadj_2x" in table and "wrong" in table and "2.00" in table
    assert decode_bench.candidate_speedups(rows, "shipped") == {(40, None): pytest.approx(4 / 3.5),
                                                                (40, 16): pytest.approx(4 / 3.5)}


def test_newest_launch_reads_what_the_plan_launched(monkeypatch):
    """A candidates row records the launch ``flash_decode`` chose (plans are kept on a GPU only, so one is faked):
    keys a tile, warps, stages, whole tiles unmasked, and the splits."""
    from types import SimpleNamespace

    from flashcourse.kernels import plan

    older = SimpleNamespace(num_splits=1, launches=None, split_args={})
    newest = SimpleNamespace(num_splits=33, launches=None,
                             split_args={"BLOCK_N": 128, "num_warps": 4, "num_stages": 3, "MASK_TAIL_ONLY": False})
    monkeypatch.setattr(plan, "DecodePlan", SimpleNamespace)  # the one plan cache holds attention plans too
    monkeypatch.setattr(plan.PLANS, "plans", {"older": older, "attention": object(), "newest": newest})
    assert decode_bench._newest_launch() == {
        "num_splits": 33, "launch": {"block_n": 128, "num_warps": 4, "num_stages": 3, "mask_tail_only": False}}


# The run that chose the FP8 cache's launch, as the docs and lesson 09 quote it.
def choosing_rows():
    from flashcourse.bench import load_results

    found = load_results(decode_bench.CHOOSING_RUN)
    if not found:
        pytest.skip(f"{decode_bench.CHOOSING_RUN} is not here (a wheel without the results)")
    return found[0]["rows"]


def test_the_choosing_run_made_t128_2x_the_default_and_keys_adjacent_v_the_fastest():
    rows = choosing_rows()
    fp8 = sorted({r["candidate"] for r in rows if r["kv_dtype"] == "float8_e4m3fn"})
    same_layout = [name for name in fp8 if "kadj" not in name]
    layouts = decode_bench.candidate_speedups(rows, "t128_2x")
    assert len(layouts) == 6
    for layout, best in layouts.items():  # t128_2x is the fastest with V as given in every layout
        assert all(decode_bench.candidate_speedups(rows, name)[layout] <= best for name in same_layout), layout
    assert [round(x, 2) for x in decode_bench.speedup_span(rows, "t128_2x")] == [1.26, 1.49]
    assert [round(x, 2) for x in decode_bench.speedup_span(rows, "shipped")] == [1.07, 1.28]
    assert [round(x, 2) for x in decode_bench.speedup_span(rows, "t128")] == [1.07, 1.16]
    assert round(decode_bench.speedup_span(rows, "t128_kadj_2x")[1], 2) == 1.79
    assert [round(x, 2) for x in decode_bench.speedup_span(rows, "t128_kadj_2x", page_sizes=(16,))] == [1.25, 1.33]
    with pytest.raises(ValueError, match="no timed rows of candidate 'nothing'"):
        decode_bench.speedup_span(rows, "nothing")
    fused_lost = [("shipped", "shipped_fused"), ("t128_kadj_2x", "t128_kadj_2x_fused")]
    for layout in layouts:  # what was removed: the fused combine, beside the launches docs/KERNELS.md names
        assert all(decode_bench.candidate_speedups(rows, fused)[layout] < decode_bench.candidate_speedups(
            rows, plain)[layout] for plain, fused in fused_lost), layout
    ms = {(r["candidate"], r["kv_len"], r.get("page_size")): r["ms"] for r in rows}
    assert all(ms[("fp16_fused", *layout)] > ms[("fp16_shipped", *layout)] for layout in layouts)
    table = decode_bench.speedup_table(rows, ("t128_2x", "t128_kadj_2x"))
    assert table.splitlines()[0] == ("| candidate | 128K, pages of 16 | 128K, pages of 256 | 128K, contiguous | "
                                     "32K, pages of 16 | 32K, pages of 256 | 32K, contiguous |")
    assert "| `t128_kadj_2x` | 1.33x | 1.79x | 1.79x | 1.25x | 1.53x | 1.54x |" in table


def test_kernels_doc_quotes_the_choosing_run():
    """docs/KERNELS.md's decoding section says what the choosing run measured, with its file and key."""
    from pathlib import Path

    rows = choosing_rows()
    doc = (Path(__file__).resolve().parents[1] / "docs" / "KERNELS.md").read_text()
    section = doc[doc.index("## Decoding: `flash_decode`"):]
    lo, hi = decode_bench.speedup_span(rows, "t128_2x")
    assert decode_bench.CHOOSING_RUN in section and "`speedup_vs_fp16_cache`" in section
    assert f"{lo:.2f}-{hi:.2f}x" in section
    assert f"{decode_bench.speedup_span(rows, 't128_kadj_2x')[1]:.2f}x" in section
    fp8 = list(dict.fromkeys(r["candidate"] for r in rows if r["kv_dtype"] == "float8_e4m3fn"))
    assert decode_bench.speedup_table(rows, fp8) in section, "the table differs from the run's speedup_table"


def test_the_profile_of_the_launch_before():
    """What lesson 09 and docs/KERNELS.md read from Nsight Compute: both split kernels one program per SM (128 of
    them on 132 SMs), the FP8 one issuing more than twice the instructions with DRAM far less busy."""
    from flashcourse.bench import load_results

    found = load_results(decode_bench.PROFILE_RUN)
    if not found:
        pytest.skip(f"{decode_bench.PROFILE_RUN} is not here")
    profile = decode_bench.split_kernel_profile(found[0]["rows"])
    fp16, fp8 = profile["float16"], profile["float8_e4m3fn"]
    assert fp16["programs"] == fp8["programs"] == 128 and (fp16["warps"], fp8["warps"]) == (4, 8)
    assert round(fp8["inst_executed"] / fp16["inst_executed"], 1) == 2.1
    assert round(fp8["dram_throughput_pct"]) == 47 and round(fp16["dram_throughput_pct"]) == 79
    assert decode_bench.split_kernel_profile([]) == {}
