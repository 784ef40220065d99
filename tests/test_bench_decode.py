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
    ``speedup_vs_fp16_cache`` is fp16_shipped's time over its own, ``speedup_vs_fp16_best`` the fastest float16
    candidate's, with their ranges."""
    make_cache = decode_bench.make_cache
    monkeypatch.setattr(decode_bench, "make_cache", lambda *shape: make_cache(*shape, dtype=torch.float16,
                                                                              device=DEVICE))
    speeds = {"fp16_shipped": 4.0, "fp16_fused": 3.0, "shipped": 3.5, "t128_ci_2x_fused": 2.0}
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
    fused = next(r for r in ok if r["candidate"] == "t128_ci_2x_fused" and "page_size" not in r)
    assert fused["ms"] == pytest.approx(2.0) and fused["speedup_vs_fp16_cache"] == pytest.approx(2.0)
    assert fused["speedup_vs_fp16_best"] == pytest.approx(1.5) and fused["fp16_best"] == "fp16_fused"
    assert fused["speedup_vs_fp16_cache_min"] == pytest.approx(3.6 / 2.2)  # fp16's fastest over its slowest
    assert fused["switches"] == {"col_interleave": 4, "mask_tail_only": True, "programs_per_sm": 2,
                                 "fused_combine": True}
    assert "speedup_vs_fp16_cache" not in next(r for r in ok if r["candidate"] == "fp16_fused")
    table = decode_bench.format_candidates(rows)
    assert "t128_ci_2x_fused" in table and "wrong" in table and "2.00" in table
