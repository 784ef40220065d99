"""scripts/graph_capture_probe.py without a GPU: its cases cover every difference it is meant to bisect, its command
line answers, and one case run in a subprocess comes back as a result (here a failure: there is no CUDA)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def probe():
    spec = importlib.util.spec_from_file_location("graph_capture_probe", ROOT / "scripts" / "graph_capture_probe.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up while the class is made
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


def test_the_cases_cover_each_difference_between_the_working_capture_and_the_benchmark(probe):
    from flashcourse.bench import train_step

    cases = list(probe.CASES.values())
    assert len(cases) == len({c.name for c in cases}) and len(cases) <= 20  # one process each: minutes, not more
    assert sorted(probe.BENCH.values()) == sorted(train_step.SHAPES)
    assert {c.shape for c in cases} == {probe.SMALL, *train_step.SHAPES}
    assert {c.dtype for c in cases} == {"float16", "bfloat16"}
    assert {c.build for c in cases} == {"minimal", "kept", "detached", "time_step"}
    assert {c.error_mode for c in cases} == {"global", "thread_local"}
    assert {c.provider for c in cases} == {"flashcourse", "sdpa_plain"} and any(c.eager_first for c in cases)
    baseline = probe.CASES["ours_minimal_fp16_small"]  # the capture that worked, the bisection's start
    assert (baseline.dtype, baseline.shape, baseline.build, baseline.eager_first) == ("float16", (2, 4, 1024, 64),
                                                                                      "minimal", False)


def test_list_prints_every_case_and_the_arguments_parse(probe, capsys):
    probe.main(["--list"])
    printed = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in printed] == list(probe.CASES)
    args = probe.parse_args(["--out", "somewhere", "--only", "ours_kept_bf16", "sdpa_plain_minimal_bf16",
                             "--timeout", "60"])
    assert (args.out, args.only, args.timeout, args.list, args.child) == (
        Path("somewhere"), ["ours_kept_bf16", "sdpa_plain_minimal_bf16"], 60.0, False, None)
    assert probe.parse_args([]).out is None  # save_results' default folder
    with pytest.raises(SystemExit):
        probe.parse_args(["--only", "no_such_case"])


def test_a_case_in_its_subprocess_comes_back_as_one_result(probe):
    result = probe.run_in_subprocess("sdpa_plain_minimal_bf16", timeout=120)
    assert result["case"] == "sdpa_plain_minimal_bf16" and result["status"] == "failed"  # no CUDA on this machine
    assert result["traceback"] and result["rng_after"] != "ok" and isinstance(result["warnings"], list)
    line = probe.format_line(probe.CASES["sdpa_plain_minimal_bf16"], result)
    assert line.startswith("sdpa_plain_minimal_bf16: FAILED ") and "torch.randn afterwards" in line
