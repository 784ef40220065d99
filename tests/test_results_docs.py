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


# ------------------------------------------------------------------ KERNELS.md, part 1: the version table
# The story's table has one row per kernel version of the registries, and cites for each the newest committed run
# on its GPU that timed it: the lowest and highest ratio to cuDNN's time in that run (fp16 and bf16, every shape,
# or one head dim where the row says "D = ..."). Where a run swept launches, a shape counts at the version's
# fastest launch.
STORY_HEADER = "| version | what it changed | verdict | x cuDNN, newest run | run |"
RUN_FILE = re.compile(r"`(\d{4}-\d\d-\d\d-[\w.-]+\.json)`(?:, D = (\d+))?(?:, N >= (\d+))?$")
RESULTS = ROOT / "benchmarks" / "results"


def _registry_names() -> set[str]:
    from flashcourse import kernels
    from flashcourse.kernels.hopper import fa3, fa3_backward, fa3_fp8

    return {*kernels.FORWARD_VERSIONS, *kernels.BACKWARD_VERSIONS, *fa3.STAGES, *fa3_fp8.STAGES,
            *fa3_backward.STAGES}


def _story_rows(doc: str) -> dict[str, list[str]]:
    """{version: its cells} from the story's version table."""
    lines = doc[doc.index(STORY_HEADER):].splitlines()[2:]
    rows = {}
    for line in lines:
        if not line.startswith("|"):
            break
        cells = [cell.strip() for cell in line.strip("|").split(" | ")]
        assert len(cells) == 5, f"the story's version table: a row without 5 cells: {line}"
        rows[cells[0]] = cells
    return rows


def _ratios_to_cudnn(path: Path, version: str, head_dim: int | None, min_n: int = 0) -> list[float]:
    """Every ratio to cuDNN of ``version``'s timed rows in one results file (empty: the file did not time it), at
    one head dim if given and from length ``min_n`` on."""
    rows = [r for r in json.loads(path.read_text())["rows"] if r.get("n", 0) >= min_n]
    if head_dim is not None:
        rows = [r for r in rows if r.get("head_dim") == head_dim]
    shape = ("dtype", "batch", "heads", "head_dim", "n", "causal")
    if path.name.endswith("-versions.json"):  # rates in TFLOP/s; cuDNN's rows of the same shape and pass
        cudnn = {(*(r[k] for k in shape), r["mode"]): r["tflops"] for r in rows if r["provider"] == "sdpa_cudnn"}
        return [r["tflops"] / cudnn[(*(r[k] for k in shape), r["mode"])] for r in rows
                if r["provider"] == "flashcourse" and version in (r.get("forward_version"), r.get("backward_version"))]
    if path.name.endswith("-sweep.json"):  # launches swept: the version's fastest launch at each shape
        best: dict[tuple, float] = {}
        for r in rows:
            if r["version"] == version:
                key = (*(r[k] for k in shape), r["kernel"])
                best[key] = max(best.get(key, 0.0), r["tflops"])
        cudnn = {(*(r[k] for k in shape), r["kernel"]): r["tflops"] for r in rows if r["version"] == "sdpa_cudnn"}
        return [tflops / cudnn[key] for key, tflops in best.items()]
    key = "ratio_vs_cudnn_fp16" if "-fa3-fp8" in path.name else "ratio_vs_sdpa_cudnn"
    return [r[key] for r in rows if r.get("kind") == "time" and r.get("status") == "ok"
            and r.get("provider") in (version, f"fa3-{version}") and r.get("v_layout", "as_given") == "as_given"
            and key in r]


def _device(path: Path) -> str:
    return json.loads(path.read_text())["meta"]["device"]


def _timing_files() -> list[Path]:
    kinds = ("-versions.json", "-sweep.json")
    return sorted(p for p in RESULTS.glob("*.json")
                  if p.name.endswith(kinds) or "-fa3-stages" in p.name or "-fa3-backward-stages" in p.name
                  or "-fa3-fp8" in p.name)


def test_kernels_story_table_lists_every_registered_version_once():
    rows = _story_rows(_kernels_doc())
    names = _registry_names()
    assert set(rows) == names, (f"docs/KERNELS.md's story table and the registries (FORWARD_VERSIONS, "
                                f"BACKWARD_VERSIONS, the Gluon STAGES) differ: only in the table "
                                f"{sorted(set(rows) - names)}, only in the registries {sorted(names - set(rows))}")


@pytest.mark.parametrize("version", sorted(_registry_names()))
def test_kernels_story_table_cites_the_newest_run_and_its_figure(version):
    rows = _story_rows(_kernels_doc())
    assert version in rows, f"{version} is registered but has no row in docs/KERNELS.md's story table"
    cells = rows[version]
    found = RUN_FILE.search(cells[4])
    assert found, f"{version}: the run cell names no results file as `DATE-....json`[, D = d][, N >= n]: {cells[4]}"
    cited, head_dim, min_n = RESULTS / found[1], int(found[2]) if found[2] else None, int(found[3] or 0)
    ratios = _ratios_to_cudnn(cited, version, head_dim, min_n)
    assert ratios, f"{version}: {cited.name} holds no timed rows of it"
    assert cells[3] == f"{min(ratios):.2f}-{max(ratios):.2f}x", (
        f"{version}: the table says {cells[3]}, {cited.name} gives {min(ratios):.2f}-{max(ratios):.2f}x")
    device = _device(cited)  # the story reads one GPU's runs: a newer run on another GPU is another claim
    newer = [p.name for p in _timing_files() if p.name[:10] > cited.name[:10] and _device(p) == device
             and _ratios_to_cudnn(p, version, None)]
    assert not newer, f"{version}: newer runs on the {device} timed it ({newer}); cite the newest"


def test_a_test_runs_record_whose_name_matches_a_benchmark_is_not_read_as_one(tmp_path):
    """scripts/gpu_tests.py's records (meta, summary, files: no rows) sit beside the benchmarks; one named
    ``...-decode.json`` once broke the decoding table (KeyError 'rows')."""
    import shutil

    from flashcourse.bench import load_results

    newest = load_results("*-decode.json")[-1]
    shutil.copy(newest["path"], tmp_path)
    want = summary.decode_kernels_table(tmp_path)
    record = {"meta": {"date": "2099-01-01", "device": "NVIDIA H100 80GB HBM3"}, "summary": {"passed": 1},
              "files": []}
    (tmp_path / "2099-01-01-nvidia-h100-80gb-hbm3-gpu-tests-abc1234-decode.json").write_text(json.dumps(record))
    assert summary.decode_kernels_table(tmp_path) == want
    assert [Path(r["path"]).name for r in load_results("*-decode.json", directory=tmp_path)] == [
        Path(newest["path"]).name]
