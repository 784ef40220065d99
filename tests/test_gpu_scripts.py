"""The GPU machine's notebook run (scripts/gpu_notebooks.py, scripts/gpu_wheels.sh), checked without running one.

The notebooks themselves run in test_notebooks.py / test_exercises.py here, and on the GPU machine through the
script; this file only checks that the script finds all of them, that its command line answers, and that the
hidden tests' judge finds the course from a checkout (PYTHONPATH) without reading the notebook's folder.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from child_env import child_pythonpath

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_notebooks.py"


@pytest.fixture(scope="module")
def gpu_notebooks():
    spec = importlib.util.spec_from_file_location("gpu_notebooks", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_lesson_and_every_solution_is_found(gpu_notebooks):
    found = gpu_notebooks.find_notebooks()
    lessons, solutions = sorted((ROOT / "notebooks").glob("*.ipynb")), sorted((ROOT / "solutions").glob("*.ipynb"))
    assert lessons and solutions
    assert found == lessons + solutions
    assert not any(path.parent.name == "exercises" for path in found)  # stubs fail by design


def test_only_selects_by_glob_from_the_repository(gpu_notebooks):
    picked = gpu_notebooks.find_notebooks(only=["notebooks/01_*", "solutions/ex01_*"])
    assert [p.relative_to(ROOT).as_posix() for p in picked] == [
        *(p.relative_to(ROOT).as_posix() for p in sorted((ROOT / "notebooks").glob("01_*.ipynb"))),
        *(p.relative_to(ROOT).as_posix() for p in sorted((ROOT / "solutions").glob("ex01_*.ipynb")))]
    assert gpu_notebooks.find_notebooks(only=["nothing/*"]) == []


def test_help_and_list_answer_without_running_a_notebook():
    shown = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0 and "--only" in shown.stdout and "--json" in shown.stdout
    listed = subprocess.run([sys.executable, str(SCRIPT), "--list"], capture_output=True, text=True, timeout=60)
    assert listed.returncode == 0
    assert len(listed.stdout.split()) == len(list((ROOT / "notebooks").glob("*.ipynb"))) + len(
        list((ROOT / "solutions").glob("*.ipynb")))
    none = subprocess.run([sys.executable, str(SCRIPT), "--only", "nothing/*"], capture_output=True, text=True,
                          timeout=60)
    assert none.returncode == 2


def test_pythonpath_is_made_absolute_for_kernels_that_start_elsewhere(gpu_notebooks, monkeypatch, tmp_path):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(["/tmp/site", "src", ""]))
    assert gpu_notebooks.absolute_pythonpath(tmp_path).split(os.pathsep) == ["/tmp/site", str(tmp_path / "src")]


def test_the_judge_gets_pythonpath_last_and_never_the_notebooks_folder(monkeypatch, tmp_path):
    from flashcourse.grading import fresh_judge

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(["/tmp/site", ".", "src"]))
    command = fresh_judge._judge_command("ex01_a", tmp_path / "cases")
    assert command[:3] == [sys.executable, "-I", "-c"]
    assert command[-1].split(os.pathsep) == ["/tmp/site", str(tmp_path / "src")]  # "." is the notebook's folder
    assert "sys.path.extend" in command[3] and "sys.path.insert" not in command[3]  # after its own path


def test_the_judge_ignores_modules_in_the_notebooks_folder(tmp_path):
    # A notebook folder holding its own numpy and flashcourse: the kernel may use them, the judge must not.
    for name in ("numpy.py", "flashcourse/__init__.py"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text("raise ImportError('the notebook folder was imported')\n")
    code = ("import sys; sys.path[:] = [p for p in sys.path if p not in ('', '.')]\n"
            "import numpy as np\n"
            "from flashcourse.grading.fresh_judge import hidden_test\n"
            "hidden_test('ex01_a', attention_scores=lambda q, k, scale=None: "
            "(q @ np.swapaxes(k, -1, -2)) * (1 / np.sqrt(q.shape[-1]) if scale is None else scale))\n")
    env = {**os.environ, "PYTHONPATH": child_pythonpath()}
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "passed all" in done.stdout, json.dumps(done.stdout)


SWEEP = ROOT / "benchmarks" / "sweep_kernels.py"


@pytest.fixture(scope="module")
def sweep_kernels():
    spec = importlib.util.spec_from_file_location("sweep_kernels", SWEEP)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_sweep_times_every_backward_scheme_at_the_same_launches(sweep_kernels):
    jobs = sweep_kernels.plan(("bwd",), sweep_kernels.SCHEMES, quick=False)
    for shape in (s for s in sweep_kernels.SHAPES if s.head_dim in sweep_kernels.DKDV_CONFIGS):
        launches = {scheme: [pair[0] for s, kernel, v, pair in jobs if s == shape and v == scheme and pair]
                    for scheme in sweep_kernels.SCHEMES}
        assert all(found == sweep_kernels.DKDV_CONFIGS[shape.head_dim] for found in launches.values()), launches
        assert sum(1 for s, _, v, pair in jobs if s == shape and v == "b1" and pair is None) == 1  # b1's default
    for dkdv, dq in (pair for *_, pair in jobs if pair):  # b1's dQ launch mirrors the tile, keeps warps and stages
        assert (dq.block_m, dq.block_n, dq.num_warps, dq.num_stages) == (dkdv.block_n, dkdv.block_m, dkdv.num_warps,
                                                                          dkdv.num_stages)
        assert dkdv.block_n % dkdv.block_m == 0 and dq.block_m % dq.block_n == 0  # what a causal launch needs


def test_the_sweep_selects_kernels_schemes_and_shapes(sweep_kernels):
    quick = sweep_kernels.plan(("fwd",), ("b1",), quick=True)
    assert {s.head_dim for s, *_ in quick} == {64, 128, 256} and len({s for s, *_ in quick}) == 3
    only_256 = sweep_kernels.plan(("fwd", "bwd"), sweep_kernels.SCHEMES, quick=False, head_dims=(256,))
    assert only_256 and {(s.head_dim, kernel) for s, kernel, *_ in only_256} == {(256, "fwd")}  # no backward launches
    assert {kernel for _, kernel, _, _ in quick} == {"fwd"}
    args = sweep_kernels.parse_args(["--kernels", "bwd", "--schemes", "b1,b2", "--budget", "300"])
    assert args.kernels == ("bwd",) and args.schemes == ("b1", "b2") and args.budget == 300
    for wrong in (["--kernels", "bwd,xyz"], ["--schemes", "b3"], ["--schemes", ""], ["--budget", "0"]):
        with pytest.raises(SystemExit):
            sweep_kernels.parse_args(wrong)


def test_merged_parts_keep_each_notebooks_last_row_in_repository_order(gpu_notebooks):
    def part(date, rows):
        return {"meta": {"date": date, "device": "NVIDIA H200"}, "rows": rows, "summary": {}}

    first = part("d1", [{"notebook": "solutions/ex01_naive_attention.ipynb", "ok": True, "seconds": 3.0, "error": None},
                        {"notebook": "notebooks/11_attention_variants.ipynb", "ok": False, "seconds": 51.0,
                         "error": "KeyboardInterrupt [cell 44]"}])
    second = part("d2", [{"notebook": "notebooks/11_attention_variants.ipynb", "ok": True, "seconds": 90.0,
                          "error": None}])
    merged = gpu_notebooks.merge_parts([first, second], ["a.json", "b.json"])
    assert [row["notebook"] for row in merged["rows"]] == ["notebooks/11_attention_variants.ipynb",
                                                           "solutions/ex01_naive_attention.ipynb"]
    assert merged["rows"][0]["ok"] and merged["rows"][0]["part"] == "b.json"
    assert merged["summary"] == {"passed": 2, "failed": 0, "seconds": 93.0}
    assert [p["file"] for p in merged["meta"]["parts"]] == ["a.json", "b.json"]
    assert "notebooks/00_memory_hierarchy.ipynb" in merged["meta"]["missing"]
