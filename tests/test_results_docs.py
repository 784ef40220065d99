"""The README's GPU results and every generated block of docs/KERNELS.md match the committed results, and a hand
edit inside a block is caught."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from flashcourse.bench import summary

ROOT = Path(__file__).resolve().parents[1]
FIX = "regenerate with `python -m flashcourse.bench table --write`"
MARKER = re.compile(r"<!-- ([\w-]+):start -->")


def _between(text: str, start: str, end: str) -> str:
    return text[text.index(start) + len(start):text.index(end)]


def _kernels_doc() -> str:
    return (ROOT / "docs" / "KERNELS.md").read_text()


def _stale_blocks(doc: str) -> list[str]:
    """The names of the generated blocks of ``doc`` that differ from a fresh generation."""
    return [name for name, body in summary.kernels_doc_blocks().items()
            if _between(doc, f"<!-- {name}:start -->", f"<!-- {name}:end -->") != body]


def test_readme_results_match_the_json():
    readme = (ROOT / "README.md").read_text()
    committed = _between(readme, summary.README_START, summary.README_END)
    assert committed == summary.readme_section(), f"README's GPU results differ from benchmarks/results: {FIX}"
    assert "TFLOP/s" in committed and "SDPA" in committed


def test_every_marked_block_of_kernels_doc_has_a_generator_and_every_generator_its_block():
    doc = _kernels_doc()
    marked = MARKER.findall(doc)
    assert len(marked) == len(set(marked)), f"a block is marked twice in docs/KERNELS.md: {marked}"
    assert sorted(marked) == sorted(summary.kernels_doc_blocks()), (
        "docs/KERNELS.md's markers and flashcourse.bench.summary.kernels_doc_blocks disagree")
    for name in marked:
        assert doc.count(f"<!-- {name}:end -->") == 1, f"block {name} has no single end marker"


@pytest.mark.parametrize("name", list(summary.kernels_doc_blocks()))
def test_kernels_doc_block_matches_the_results(name):
    committed = _between(_kernels_doc(), f"<!-- {name}:start -->", f"<!-- {name}:end -->")
    assert committed == summary.kernels_doc_blocks()[name], f"docs/KERNELS.md's block {name} is stale: {FIX}"


def test_a_hand_edit_inside_a_block_is_caught_and_regeneration_repairs_it():
    doc = _kernels_doc()
    start = doc.index("<!-- decode-table:start -->")
    number = re.compile(r"\d+\.\d\d").search(doc, start)
    edited = doc[:number.start()] + "9.99" + doc[number.end():]
    assert _stale_blocks(edited) == ["decode-table"]
    assert not _stale_blocks(summary.write_kernels_doc(edited))


def test_generated_blocks_read_the_keys_they_cite():
    blocks = summary.kernels_doc_blocks()
    assert "`ratio_vs_flex`" in blocks["variants-findings"] and "bfp16" not in blocks["variants-table"]
    assert "`bandwidth_tbs`" in blocks["decode-table"] and "L2 flushed" in blocks["decode-table"]
    assert "b4 / b1" in blocks["sweep-backward"] and "same dK/dV launches" in blocks["sweep-backward"]
    counters = summary.ncu_counters()
    if counters is not None:  # the CSV is in a checkout, not in a wheel
        assert counters["b1 dK/dV"]["Registers Per Thread"] == counters["b5 dK/dV (with the dQ tile)"][
            "Registers Per Thread"] == 255


def test_backward_schemes_compare_at_equal_launches_and_a_backward_only_sweep_keeps_the_older_forward(tmp_path):
    def row(kernel, version, tflops, config=None, **shape):
        shape = {"head_dim": 128, "n": 4096, "causal": False, **shape}
        return {"kernel": kernel, "version": version, "tflops": tflops, "config": config, **shape}

    wide = {"block_m": 64, "block_n": 128, "num_warps": 8, "num_stages": 2}
    small = {"block_m": 64, "block_n": 64, "num_warps": 4, "num_stages": 2}
    meta = {"device": "GPU", "date": "d"}
    older = [row("fwd", "v7", 400.0, small), row("fwd", "sdpa_cudnn", 600.0)]
    newer = [row("fwd", "sdpa_cudnn", 600.0), row("bwd", "sdpa_cudnn", 500.0), row("bwd", "b1", 300.0),
             row("bwd", "b1", 330.0, wide), row("bwd", "b2", 165.0, wide), row("bwd", "b5", 363.0, wide),
             row("bwd", "b1", 360.0, small), row("bwd", "b2", 90.0, small)]
    for name, rows in (("2026-01-01-gpu-sweep.json", older), ("2026-01-02-gpu-sweep.json", newer)):
        (tmp_path / name).write_text(json.dumps({"meta": meta, "rows": rows}))
    (found,) = summary.backward_launch_comparison(tmp_path)
    assert found["over_b1"]["b2"] == [0.5, 0.25] and found["over_b1"]["b5"] == [1.1] and found["over_b1"]["b4"] == []
    assert (found["b1_default"], found["b1_best"], found["b1_best_launch"]) == (300.0, 360.0, "64x64/w4/s2")
    table = summary.sweep_backward_findings(tmp_path)
    assert "| 0.25-0.50x | - | 1.10x | 1.20x (64x64/w4/s2) | 0.72x |" in table
    assert "2026-01-01-gpu-sweep.json" in summary.sweep_forward_findings(tmp_path)  # the newer one has no v7 rows
