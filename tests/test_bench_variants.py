"""The variants benchmark's CPU side: visible-entry counts (the TFLOP/s denominator), document packing,
providers per variant, ratios, merging two runs of one day, the table; and its validate-then-time path on a
tiny variant in the Triton interpreter (timing stubbed: CUDA events need a GPU)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from flashcourse import device  # noqa: E402

if not device.triton_available():
    pytest.skip("Triton is not installed here", allow_module_level=True)
from flashcourse import kernels  # noqa: E402, F401  (sets the interpreter up before triton loads elsewhere)
from flashcourse.bench import variants  # noqa: E402
from flashcourse.bench.variants import Variant  # noqa: E402


def brute_force_visible(variant: Variant, ids) -> int:
    """The same count from an explicit (N, N) mask per batch row."""
    i = np.arange(variant.n)[:, None]
    j = np.arange(variant.n)[None, :]
    total = 0
    for b in range(variant.batch):
        keep = np.ones((variant.n, variant.n), dtype=bool)
        if variant.causal or variant.window_left is not None:
            keep &= j <= i
        if variant.window_left is not None:
            keep &= j >= i - variant.window_left
        if ids is not None:
            keep &= ids[b][:, None] == ids[b][None, :]
        total += int(keep.sum())
    return total * variant.heads


@pytest.mark.parametrize("variant", [
    Variant("dense", 2, 3, 3, 50, 16),
    Variant("causal", 2, 3, 1, 50, 16, causal=True),
    Variant("window", 1, 2, 2, 70, 16, window_left=9),
    Variant("documents", 3, 2, 2, 64, 16, causal=True, documents=5),
    Variant("documents + window", 2, 1, 1, 64, 16, window_left=7, documents=3),
])
def test_visible_entries_match_an_explicit_mask(variant):
    ids = variants.document_ids(variant, seed=3)
    assert variants.visible_entries(variant, ids) == brute_force_visible(variant, ids)


def test_visible_entries_of_the_issue_shapes():
    n = 16384
    causal = variants.VARIANTS[0]
    assert variants.visible_entries(causal) == 4 * 16 * n * (n + 1) // 2  # the causal triangle, diagonal included
    window = next(v for v in variants.VARIANTS if v.window_left == 1024)
    per_head = sum(min(i, 1024) + 1 for i in range(n))
    assert variants.visible_entries(window) == 4 * 16 * per_head
    assert variants.variant_flops(causal, 10, "fwd") == 4 * 128 * 10
    assert variants.variant_flops(causal, 10, "bwd") == 2.5 * 4 * 128 * 10


def test_documents_are_random_lengths_that_fill_the_row():
    rng = np.random.default_rng(0)
    lengths = variants.document_lengths(16384, 8, rng)
    assert len(lengths) == 8 and lengths.sum() == 16384 and lengths.min() >= 1
    assert len(set(lengths.tolist())) > 1, "random lengths, not equal ones"
    ids = variants.document_ids(variants.VARIANTS[3])
    assert ids.shape == (4, 16384) and ids.dtype == np.int32
    assert not np.array_equal(ids[0], ids[1]), "each batch row packs its own documents"
    assert np.all(np.diff(ids, axis=1) >= 0), "contiguous runs, as visible_entries assumes"


def test_providers_per_variant():
    by_name = {v.name: v for v in variants.VARIANTS}
    assert variants.providers_for(by_name["causal"]) == ["flashcourse", "flex", "sdpa_flash", "sdpa_cudnn"]
    assert variants.providers_for(by_name["window 1024"]) == ["flashcourse", "flex"]
    assert variants.providers_for(by_name["softcap 30, causal"]) == ["flashcourse", "flex"]
    assert "flashcourse_expanded_kv" in variants.providers_for(by_name["GQA 32/8, causal"])
    assert "sdpa_flash" in variants.providers_for(by_name["GQA 32/8, causal"])
    assert variants.providers_for(by_name["8 documents, causal"]) == ["flashcourse", "flashcourse_block_mask", "flex"]


def row(variant, provider, mode, tflops, dtype="float16", window_left=None, n=16384, status="ok"):
    return {"variant": variant, "provider": provider, "mode": mode, "tflops": tflops, "dtype": dtype,
            "window_left": window_left, "n": n, "status": status, "density": 0.5}


def test_ratios_and_window_against_our_causal():
    rows = [row("causal", "flashcourse", "fwd", 400.0), row("causal", "flex", "fwd", 320.0),
            row("window 1024", "flashcourse", "fwd", 340.0, window_left=1024),
            row("window 1024", "flex", "fwd", 0.0, window_left=1024, status="error")]
    variants.add_ratios(rows)
    assert rows[0]["ratio_vs_flex"] == pytest.approx(1.25)
    assert rows[2]["vs_our_causal"] == pytest.approx(0.85)
    assert "ratio_vs_flex" not in rows[2], "a failed provider gives no ratio"
    table = variants.format_table(rows)
    assert "error" in table and "1.25" in table and "0.85" in table


def test_per_call_and_prebuilt_block_mask_rows_get_ratios_to_flex_and_to_each_other():
    rows = [row("docs", "flashcourse", "bwd", 240.0), row("docs", "flashcourse_block_mask", "bwd", 300.0),
            row("docs", "flex", "bwd", 320.0)]
    variants.add_ratios(rows)
    per_call, prebuilt, _ = rows
    assert per_call["ratio_vs_flex"] == pytest.approx(0.75)
    assert prebuilt["ratio_vs_flex"] == pytest.approx(0.9375)
    assert prebuilt["ratio_vs_flashcourse"] == pytest.approx(1.25), "prebuilt over per-call"
    assert per_call["ratio_vs_flashcourse_block_mask"] == pytest.approx(0.8)


def test_merge_keeps_the_other_dtype_and_replaces_repeats():
    old = [row("causal", "flashcourse", "fwd", 1.0, dtype="float16"),
           row("causal", "flashcourse", "fwd", 2.0, dtype="bfloat16")]
    new = [row("causal", "flashcourse", "fwd", 3.0, dtype="bfloat16")]
    merged = variants.merge_rows(old, new)
    assert sorted((r["dtype"], r["tflops"]) for r in merged) == [("bfloat16", 3.0), ("float16", 1.0)]


def test_earlier_rows_today_reads_only_todays_file_for_this_device(tmp_path):
    from flashcourse.bench import save_results

    assert variants.earlier_rows_today(tmp_path) == []
    save_results("variants", [row("causal", "flex", "bwd", 5.0)], directory=tmp_path)
    assert [r["tflops"] for r in variants.earlier_rows_today(tmp_path)] == [5.0]


def fake_time_modes(fn, inputs):
    """Timings as ``bench.time_repeats`` returns them: 1 ms forward and 2 ms backward, each +-10%."""
    from flashcourse.bench import Timing

    return {"fwd": Timing(1.0, 0.9, 1.1, 3), "bwd": Timing(2.0, 1.8, 2.2, 3)}


def test_validate_then_time_path_on_a_tiny_variant(monkeypatch):
    """run_variant on CPU: ours and SDPA's math backend validated against the reference slice, a wrong provider
    recorded as wrong, a raising one as an error, and the run goes on."""
    monkeypatch.setattr(variants, "DEVICE", "cpu")
    monkeypatch.setattr(variants, "time_modes", fake_time_modes)
    real = variants.provider_fn

    def provider_fn(provider, variant, inputs):
        if provider == "broken":
            raise RuntimeError("no such kernel")
        if provider == "wrong":
            return lambda q, k, v: real("flashcourse", variant, inputs)(q, k, v) * 1.5
        return real(provider, variant, inputs)

    monkeypatch.setattr(variants, "provider_fn", provider_fn)
    tiny = Variant("tiny documents", 2, 4, 2, 40, 16, causal=True, documents=3, softcap=5.0)
    rows = variants.run_variant(tiny, "float32", providers=("flashcourse", "broken", "wrong"), log=lambda *a: None)
    status = {(r["provider"], r["mode"]): r["status"] for r in rows}
    assert status == {("flashcourse", "fwd"): "ok", ("flashcourse", "bwd"): "ok", ("broken", "fwd"): "error",
                      ("broken", "bwd"): "error", ("wrong", "fwd"): "wrong", ("wrong", "bwd"): "wrong"}
    ours = next(r for r in rows if r["provider"] == "flashcourse")
    assert max(ours["rel_err"].values()) < 1e-4
    assert "no such kernel" in next(r for r in rows if r["provider"] == "broken")["error"]
    expected_flops = variants.variant_flops(tiny, ours["visible_entries"], "fwd")
    assert ours["tflops"] == pytest.approx(expected_flops / 1e-3 / 1e12)
    assert ours["tflops_min"] == pytest.approx(expected_flops / 1.1e-3 / 1e12), "the slowest repeat: the lowest rate"
    assert (ours["ms"], ours["ms_min"], ours["ms_max"], ours["repeats"]) == (1.0, 0.9, 1.1, 3)


def test_a_prebuilt_block_mask_is_validated_timed_and_its_build_recorded_apart(monkeypatch):
    """The block-mask provider runs our kernels with a mask built once outside the timed region; its row records
    the build (warm, median of the repeats with its range), the per-call row records none."""
    monkeypatch.setattr(variants, "DEVICE", "cpu")
    monkeypatch.setattr(variants, "time_modes", fake_time_modes)
    tiny = Variant("tiny documents", 2, 4, 2, 40, 16, causal=True, documents=3)
    rows = variants.run_variant(tiny, "float32", providers=("flashcourse", "flashcourse_block_mask"),
                                log=lambda *a: None)
    assert {r["status"] for r in rows} == {"ok"}, rows
    prebuilt = next(r for r in rows if r["provider"] == "flashcourse_block_mask")
    assert max(prebuilt["rel_err"].values()) < 1e-4
    assert 0 < prebuilt["block_mask_build_ms_min"] <= prebuilt["block_mask_build_ms"] \
        <= prebuilt["block_mask_build_ms_max"]
    assert not any("block_mask_build_ms" in r for r in rows if r["provider"] == "flashcourse")


def test_validation_of_sdpa_and_expanded_kv_on_gqa(monkeypatch):
    monkeypatch.setattr(variants, "DEVICE", "cpu")
    monkeypatch.setattr(variants, "time_modes", fake_time_modes)
    gqa = Variant("tiny gqa", 1, 4, 1, 33, 16, causal=True)
    rows = variants.run_variant(gqa, "float32", providers=("flashcourse_expanded_kv", "sdpa_math"),
                                log=lambda *a: None)
    assert {r["status"] for r in rows} == {"ok"}, rows
    expanded = next(r for r in rows if r["provider"] == "flashcourse_expanded_kv")
    math_row = next(r for r in rows if r["provider"] == "sdpa_math")
    assert expanded["kv_bytes"] == 4 * math_row["kv_bytes"], "expanding K/V to 4 query heads: 4x the bytes"
