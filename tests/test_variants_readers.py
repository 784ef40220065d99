"""bench.summary's readers of the variants run (lesson 11, docs/KERNELS.md): one dtype or two, the rule per call
beside the mask built once, the targets met and missed, and the run before compared with the newest."""

from __future__ import annotations

import pytest

from flashcourse.bench import save_results, summary, variants


def row(variant, provider, mode, tflops, dtype="float16", **extra):
    return {"variant": variant, "provider": provider, "mode": mode, "tflops": tflops, "dtype": dtype,
            "window_left": None, "n": 16384, "head_dim": 128, "status": "ok", "density": 0.5, **extra}


def save(directory, rows, date):
    variants.add_ratios(rows)
    meta = {"device": "GPU", "date": date}
    return save_results("variants", rows, directory=directory, meta=meta, kind="variants")


def fp16_run():
    """Causal ahead of Flex; documents behind per call and level built once; D = 256 a hair under Flex in the
    backward and under 0.9x cuDNN in the forward."""
    d256 = {"head_dim": 256, "n": 8192}
    return [row("causal", "flashcourse", "fwd", 500.0), row("causal", "flex", "fwd", 400.0),
            row("causal", "flashcourse", "bwd", 380.0), row("causal", "flex", "bwd", 400.0),
            row("docs", "flashcourse", "fwd", 280.0), row("docs", "flex", "fwd", 340.0, block_mask_build_ms=16.0),
            row("docs", "flashcourse_block_mask", "fwd", 340.0, block_mask_build_ms=0.5),
            row("head_dim: 256", "flashcourse", "fwd", 500.0, **d256),
            row("head_dim: 256", "flex", "fwd", 360.0, **d256),
            row("head_dim: 256", "sdpa_cudnn", "fwd", 630.0, **d256),
            row("head_dim: 256", "flashcourse", "bwd", 144.5, **d256),
            row("head_dim: 256", "flex", "bwd", 145.0, **d256)]


def test_a_run_of_one_dtype_is_read_and_judged(tmp_path):
    save(tmp_path, fp16_run(), "2026-01-02")
    comparison = summary.variants_comparison(tmp_path)
    assert comparison["dtypes"] == ["float16"] and comparison["file"] == "2026-01-02-gpu-variants.json"
    docs = next(r for r in comparison["rows"] if r["variant"] == "docs")
    assert (docs["ours"], docs["block_mask"], docs["flex"]) == (280.0, 340.0, 340.0)
    assert docs["block_mask_vs_flex"] == pytest.approx(1.0) and docs["block_mask_vs_ours"] == pytest.approx(340 / 280)
    assert (docs["ours_build_ms"], docs["flex_build_ms"]) == (0.5, 16.0)
    targets = summary.variants_targets(comparison)
    missed = {(r["variant"], r["mode"]) for r in targets["flex"]["missed"]}
    assert missed == {("causal", "bwd"), ("docs", "fwd"), ("head_dim: 256", "bwd")}
    assert [r["variant"] for r in targets["cudnn_d256"]["missed"]] == ["head_dim: 256"]
    assert [r["variant"] for r in targets["block_mask_flex"]["met"]] == ["docs"]
    verdict = summary.variants_verdict(comparison)
    assert "bf16" not in verdict and "met on 2 of 3 variants" in verdict  # the forward
    assert "head_dim: 256 (0.997x)" in verdict, "a miss that rounds to 1.00 keeps a third decimal"
    assert "head_dim: 256 (0.79x)" in verdict and "**missed**, head_dim: 256" in verdict
    table = summary.variants_markdown(comparison)
    assert "| docs | 128 | 16384 | fp16 | fwd | 50% | 280 | 340 | 340 | 0.82x | 1.00x | - |" in table
    assert "| head_dim: 256 | 256 | 8192 | fp16 | fwd |" in table


def test_both_dtypes_each_get_their_verdict(tmp_path):
    rows = fp16_run() + [row("causal", "flashcourse", "fwd", 520.0, dtype="bfloat16"),
                         row("causal", "flex", "fwd", 400.0, dtype="bfloat16")]
    save(tmp_path, rows, "2026-01-02")
    comparison = summary.variants_comparison(tmp_path)
    assert comparison["dtypes"] == ["float16", "bfloat16"]
    verdict = summary.variants_verdict(comparison)
    assert "- Forward, bf16, ours against FlexAttention (`ratio_vs_flex`, target 1.0x): met on 1 of 1 variants." \
        in verdict


def test_findings_compare_with_the_run_before_and_say_nothing_without_a_run(tmp_path):
    assert summary.variants_comparison(tmp_path) is None
    assert summary.variants_findings(tmp_path) == "No variants run committed yet.\n"
    save(tmp_path, [row("causal", "flashcourse", "bwd", 300.0), row("causal", "flex", "bwd", 400.0)], "2026-01-01")
    save(tmp_path, fp16_run(), "2026-01-02")
    findings = summary.variants_findings(tmp_path)
    assert "| causal | fp16 | bwd | 0.75x | 0.95x |" in findings
    assert "| docs | fp16 | fwd | 280 | 340 | 340 | 1.21x | 0.50 | 16.00 |" in findings
