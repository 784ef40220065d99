"""The README's GPU results and docs/KERNELS.md's version table are generated from the committed JSON."""

from __future__ import annotations

from pathlib import Path

from flashcourse.bench import summary

ROOT = Path(__file__).resolve().parents[1]
FIX = "regenerate with `python -m flashcourse.bench table --write`"


def _between(text: str, start: str, end: str) -> str:
    return text[text.index(start) + len(start):text.index(end)]


def test_readme_results_match_the_json():
    readme = (ROOT / "README.md").read_text()
    committed = _between(readme, summary.README_START, summary.README_END)
    assert committed == summary.readme_section(), f"README's GPU results differ from benchmarks/results: {FIX}"
    assert "TFLOP/s" in committed and "SDPA" in committed


def test_kernels_doc_table_matches_the_json():
    from flashcourse.bench import versions

    doc = (ROOT / "docs" / "KERNELS.md").read_text()
    committed = _between(doc, "<!-- versions-table:start -->", "<!-- versions-table:end -->")
    assert committed == "\n" + versions.kernels_table(), f"docs/KERNELS.md's version table is stale: {FIX}"


def test_kernels_doc_variants_table_matches_the_json():
    doc = (ROOT / "docs" / "KERNELS.md").read_text()
    committed = _between(doc, "<!-- variants-table:start -->", "<!-- variants-table:end -->")
    assert committed == "\n" + summary.variants_summary(), f"docs/KERNELS.md's variants table is stale: {FIX}"
