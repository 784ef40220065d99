"""scripts/gpu_tests.py sizes its pytest workers to the card's free memory (no GPU needed to check the arithmetic)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
from pathlib import Path

import pytest
from gpu_run_stub import stub_gpu_tools

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def gpu_tests():
    spec = importlib.util.spec_from_file_location("gpu_tests", ROOT / "scripts" / "gpu_tests.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_workers_fit_the_card(gpu_tests):
    h100, h200 = 78.5, 139.0  # GiB free on an idle card (torch.cuda.mem_get_info, 2026-12-06)
    assert gpu_tests.workers_for(h200, gpu_tests.WORKER_GIB, 8) == 8
    assert gpu_tests.workers_for(h100, gpu_tests.WORKER_GIB, 8) * gpu_tests.WORKER_GIB <= h100
    assert gpu_tests.workers_for(h100, gpu_tests.BIG_WORKER_GIB, 8) == 3
    assert gpu_tests.workers_for(h200, gpu_tests.BIG_WORKER_GIB, 8) == 5
    assert gpu_tests.workers_for(5.0, gpu_tests.BIG_WORKER_GIB, 8) == 1, "at least one worker, however full the card"
    assert gpu_tests.workers_for(h200, gpu_tests.WORKER_GIB, 2) == 2, "--workers caps the count"


def test_the_big_marker_is_registered_and_used(gpu_tests):
    assert gpu_tests.BIG in (ROOT / "pyproject.toml").read_text()
    assert f"pytest.mark.{gpu_tests.BIG}" in (ROOT / "tests" / "test_plan.py").read_text()
    assert gpu_tests.HUGE in (ROOT / "pyproject.toml").read_text()
    assert f"pytest.mark.{gpu_tests.HUGE}" in (ROOT / "tests" / "test_large_offsets.py").read_text()


def test_a_file_that_holds_no_gpu_test_is_refused_before_anything_runs(gpu_tests):
    with pytest.raises(SystemExit, match="not GPU test files: \\['tests/test_reference.py'\\]"):
        gpu_tests.main(["--files", "tests/test_kernels_forward.py", "tests/test_reference.py"])
    with pytest.raises(SystemExit, match="not GPU test files"):
        gpu_tests.main(["--exclude", "tests/no_such_file.py"])


def test_the_json_keeps_why_each_test_failed_or_skipped(gpu_tests):
    """A count alone names nothing to rerun, and the machine is gone after the call: the JSON keeps each failed or
    erroring test's id with the end of its report (passes not), and how many tests skipped for each reason."""
    import xml.etree.ElementTree as ET

    suite = ET.fromstring(
        '<testsuite tests="4" failures="1" errors="1" skipped="2">'
        '<testcase classname="tests.test_a" name="test_ok"/>'
        '<testcase classname="tests.test_a" name="test_bad[x]"><failure message="AssertionError: v9a spills 40">'
        + "line\n" * 600 + "E   assert 40 &lt;= 0</failure></testcase>"
        '<testcase classname="tests.test_b" name="test_err"><error message="CUDA out of memory"/></testcase>'
        '<testcase classname="tests.test_b" name="test_s1"><skipped message="needs two GPUs"/></testcase>'
        '<testcase classname="tests.test_b" name="test_s2"><skipped message="needs two GPUs"/></testcase>'
        "</testsuite>")
    failed = gpu_tests.failed_tests(suite)
    assert sorted(failed) == ["tests/test_a.py::test_bad[x]", "tests/test_b.py::test_err"]
    assert failed["tests/test_a.py::test_bad[x]"].endswith("assert 40 <= 0")
    assert len(failed["tests/test_a.py::test_bad[x]"]) == gpu_tests.FAILURE_CHARS  # the end of a long report
    assert failed["tests/test_b.py::test_err"] == "CUDA out of memory"
    assert gpu_tests.skip_reasons(suite) == {"needs two GPUs": 2}


STUB_PYTHON = '''#!{python}
"""python3 for scripts/gpu_run.sh: records its arguments and the PYTHONPATH it was given."""
import json, os, sys
with open(os.environ["STUB_CALLS"], "a") as calls:
    calls.write(json.dumps([os.environ.get("PYTHONPATH", "")] + sys.argv[1:]) + "\\n")
'''


@pytest.mark.parametrize("extra_path", ["", "/tmp/t39"])
def test_the_two_tier_stages_run_every_gpu_test_file_once(gpu_tests, tmp_path, extra_path):
    """scripts/gpu_run.sh tests1 and tests2 (python3 and nvidia-smi stubbed) hand gpu_tests.py the GPU test files
    between them, none twice and none left out, the launch fit in one of them, a Triton folder kept first."""
    tools = stub_gpu_tools(tmp_path, STUB_PYTHON)
    calls = tmp_path / "calls.jsonl"
    env = dict(os.environ, PATH=f"{tools}{os.pathsep}{os.environ['PATH']}", OUT=str(tmp_path / "out"),
               STUB_CALLS=str(calls), PYTHONPATH=extra_path)
    parsed = {}
    for stage in ("tests1", "tests2"):
        proc = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_run.sh"), stage], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        runs = [json.loads(line) for line in calls.read_text().splitlines()]
        (run,) = [r for r in runs if r[1:2] == ["scripts/gpu_tests.py"]]
        assert run[0] == (f"{extra_path}:src" if extra_path else "src")
        parsed[stage] = run[2:]
        calls.unlink()
    every = gpu_tests.gpu_test_files()
    excluded = parsed["tests1"][parsed["tests1"].index("--exclude") + 1:]
    chosen = parsed["tests2"][parsed["tests2"].index("--files") + 1:parsed["tests2"].index("--no-launch-fit")]
    assert set(excluded) == set(chosen) and set(chosen) <= set(every) and len(set(chosen)) < len(every)
    assert "--no-launch-fit" not in parsed["tests1"]
