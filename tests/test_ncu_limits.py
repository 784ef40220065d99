"""benchmarks/ncu_limits.py without a GPU: its command line, which cases it runs and for how long, the ncu command it
builds, how it reads ncu's CSV pages (a small recorded sample written here), and that one failed or hung case
leaves the others' rows in the JSON."""

from __future__ import annotations

import importlib.util
import inspect
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from child_env import child_pythonpath
from gpu_run_stub import stub_gpu_tools

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "ncu_limits.py"


@pytest.fixture(scope="module")
def limits():
    spec = importlib.util.spec_from_file_location("ncu_limits", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up by name
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


IDENTITY = ["ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Context", "Stream", "Block Size",
            "Grid Size", "Device", "CC"]


def launch(launch_id: int, kernel: str, grid: str) -> list[str]:
    return [str(launch_id), "834", "python3.12", "127.0.0.1", kernel, "1", "7", "(256, 1, 1)", grid, "0", "9.0"]


def csv_lines(rows: list[list[str]], trailing: str = "") -> str:
    return "".join(",".join(f'"{value}"' for value in row) + trailing + "\n" for row in rows)


DKDV, DQ = launch(0, "_bwd_dkdv_kernel", "(64, 64, 1)"), launch(1, "_bwd_dq_kernel", "(128, 64, 1)")
# Two launches as `ncu --import R --csv --page details` prints them (the layout of a real H200 export, shortened):
# a banner line, thousands separators, rows ending in a comma (no rule), a rule's advice row with no metric name.
DETAILS = "==PROF== Connected to process 834 (/usr/bin/python3.12)\n" + csv_lines([
    IDENTITY + ["Section Name", "Metric Name", "Metric Unit", "Metric Value", "Rule Name", "Rule Type",
                "Rule Description", "Estimated Speedup Type", "Estimated Speedup"]]) + csv_lines([
    DKDV + ["GPU Speed Of Light Throughput", "Duration", "ns", "8,231,296"],
    DKDV + ["GPU Speed Of Light Throughput", "Compute (SM) Throughput", "%", "55.11"],
    DKDV + ["GPU Speed Of Light Throughput", "DRAM Throughput", "%", "3.20"],
    DKDV + ["Launch Statistics", "Registers Per Thread", "register/thread", "255"],
    DKDV + ["Launch Statistics", "Dynamic Shared Memory Per Block", "Kbyte/block", "131.58"],
    DKDV + ["Occupancy", "Achieved Occupancy", "%", "12.49"]], trailing=",") + csv_lines([
    DKDV + ["Occupancy", "", "", "", "TheoreticalOccupancy", "OPT", "2 warps per scheduler, below 16.", "local",
            "87.5"]]) + csv_lines([
    DKDV + ["Scheduler Statistics", "No Eligible", "%", "61.30"],
    DQ + ["GPU Speed Of Light Throughput", "Duration", "ms", "5.09"],
    DQ + ["Compute Workload Analysis", "Issue Slots Busy", "%", "40.25"],
    DQ + ["Warp State Statistics", "Warp Cycles Per Issued Instruction", "cycle", "5.32"]], trailing=",")

STALL = "smsp__average_warps_issue_stalled_{}_per_issue_active.ratio"
TENSOR = "sm__pipe_tensor_op_{}_cycles_active.avg.pct_of_peak_sustained_active"
RAW_METRICS = [  # (name, unit, the dK/dV launch's value)
    ("gpu__time_duration.sum", "usecond", "8,231.30"), ("launch__registers_per_thread", "register/thread", "255"),
    ("dram__bytes_read.sum", "Mbyte", "402.5"), ("dram__bytes_write.sum", "byte", "1,048,576"),
    ("l1tex__t_sectors_pipe_lsu_mem_local_op_ld.sum", "sector", "10"),
    ("l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum", "byte", "64"),
    ("smsp__sass_inst_executed_op_global_red.sum", "inst", "0"), ("smsp__inst_executed.sum", "inst", "1,000,000"),
    (TENSOR.format("hmma"), "%", "1.5"), (TENSOR.format("gmma"), "%", "47.25"),
    (STALL.format("long_scoreboard"), "inst", "0.40"), (STALL.format("barrier"), "inst", "2.10"),
    (STALL.format("selected"), "inst", "1.00"), (STALL.format("math_pipe_throttle"), "inst", "3.30"),
    (STALL.format("wait"), "inst", "0.90"), (STALL.format("mio_throttle"), "inst", "0.20"),
    (STALL.format("short_scoreboard"), "inst", "1.70")]
# `--page raw` of the same report: a column per metric, a units row, then one row per launch; the dQ launch has
# no raw row here, so its counters come from the details page alone.
RAW = csv_lines([IDENTITY + [name for name, _, _ in RAW_METRICS], [""] * len(IDENTITY) + [u for _, u, _ in RAW_METRICS],
                 DKDV + [value for _, _, value in RAW_METRICS]])


GAP_NAMES = ("fwd-d128-n4096-ours", "fwd-d128-n4096-cudnn", "fwd-d128-n4096-causal-ours", "fwd-d128-n4096-causal-cudnn",
             "fwd-d64-n4096-causal-ours", "fwd-d64-n4096-causal-cudnn", "fp8-fwd-v8c", "fp8-fwd-triton-keys-adjacent",
             "fp8-fwd-cudnn-fp16", "bwd-d256-causal-ours", "bwd-d256-causal-cudnn")
H100_NAMES = ("fwd-d64-n1024-causal-ours", "fwd-d64-n1024-causal-cudnn", "fwd-d64-n1024-causal-v8a",
              "fa4-d64-n4096-v8f", "fa4-d64-n4096-v9a", "fa4-d64-n4096-v9b_1of16", "fa4-d64-n4096-v9b_1of4")
B7_NAMES = ("bwd-b7-d128", "bwd-b7b-d128", "bwd-b7c-d128", "bwd-b7d-d128", "bwd-b7e-d128", "bwd-b7f-d128")
B8_NAMES = ("bwd-b8-d256", "bwd-b8c-d256")


def test_list_prints_every_case_in_order(limits, capsys):
    assert limits.main(["--list"]) == 0
    shown = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    assert shown == [case.name for case in limits.CASES]
    assert {"bwd-b1", "bwd-b6a", "bwd-b6c", "bwd-cudnn", "decode-fp16", "decode-fp8", "prefix-lm-fwd-ours",
            "prefix-lm-bwd-ours", "prefix-lm-fwd-flex", "prefix-lm-bwd-flex", "mask-mod-chunked-local-fwd-ours",
            "mask-mod-chunked-local-fwd-flex", "window-1024-bwd-ours", "window-1024-bwd-flex",
            "8-documents-causal-bwd-ours", "8-documents-causal-bwd-flex", "head-dim-256-fwd-ours",
            "head-dim-256-fwd-sdpa-cudnn", "gqa-32-8-causal-bwd-ours", "gqa-32-8-causal-bwd-flex",
            *GAP_NAMES, *H100_NAMES, *B7_NAMES, *B8_NAMES} == set(shown)


def test_arguments_are_checked_before_anything_runs(limits, capsys):
    with pytest.raises(SystemExit):
        limits.parse_args(["--run-ncu"])  # no --out
    assert "--out" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="unknown case 'bwd-b7'.*bwd-b1"):
        limits.parse_args(["--case", "bwd-b7"])
    with pytest.raises(SystemExit, match="unknown case 'nope'"):
        limits.parse_args(["--dry", "--only", "bwd-b1", "--only", "nope"])
    with pytest.raises(SystemExit):
        limits.parse_args(["--list", "--dry"])  # one mode at a time
    args = limits.parse_args(["--run-ncu", "--out", "/tmp/x", "--only", "decode-fp8", "--budget", "100"])
    assert args.run_ncu and args.out == Path("/tmp/x") and args.budget == 100.0
    assert args.ncu == "/usr/local/cuda/bin/ncu"


def test_selection_keeps_the_given_order_once_each(limits):
    assert [c.name for c in limits.select_cases(None)] == [c.name for c in limits.CASES]
    picked = limits.select_cases(["decode-fp8", "bwd-b1", "decode-fp8"])
    assert [c.name for c in picked] == ["decode-fp8", "bwd-b1"]


def test_case_time_limit_stops_starting_cases_when_the_budget_is_spent(limits):
    assert limits.case_time_limit(400.0, 150.0) == 150.0
    assert limits.case_time_limit(100.0, 150.0) == 100.0 - limits.RESERVE_S
    assert limits.case_time_limit(limits.MIN_CASE_S + limits.RESERVE_S, 150.0) == limits.MIN_CASE_S
    assert limits.case_time_limit(limits.MIN_CASE_S + limits.RESERVE_S - 1, 150.0) is None
    assert limits.case_time_limit(-5.0, 150.0) is None


QUERY = """Device NVIDIA H200 (GH100)
------------------------------------------------ ------------------------------
Metric Name                                      Metric Description
dram__bytes_read                                 # of bytes read from DRAM
smsp__inst_executed                              # of warp instructions executed
sm__pipe_tensor_op_gmma_cycles_active            # of cycles where the GMMA pipe was active
sm__pipe_tensor_op_hmma_cycles_active            # of cycles where the HMMA pipe was active
sm__pipe_alu_cycles_active                       # of cycles where the ALU pipe was active
smsp__average_warps_issue_stalled_barrier_per_issue_active  average # of warps resident per issue cycle
"""


def test_extra_metrics_are_only_those_this_ncu_lists(limits):
    available = limits.available_metrics(QUERY)
    assert {"dram__bytes_read", "sm__pipe_tensor_op_gmma_cycles_active", "sm__pipe_alu_cycles_active"} <= available
    assert "Metric" not in available and "Device" not in available
    chosen = limits.extra_metrics(available)
    assert chosen == ["dram__bytes_read.sum", "smsp__inst_executed.sum",
                      "sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active",
                      "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
                      "smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio"]
    assert limits.extra_metrics(None) == [] and limits.extra_metrics(set()) == []


def test_ncu_command_profiles_only_the_marked_call_of_one_case(limits):
    command = limits.ncu_command("/usr/local/cuda/bin/ncu", "bwd-b1", Path("/out/bwd-b1"), ["a.sum", "b.ratio"])
    joined = " ".join(command)
    assert command[0] == "/usr/local/cuda/bin/ncu"
    for flag in ("--clock-control none", "--profile-from-start off", "--export /out/bwd-b1", "--metrics a.sum,b.ratio"):
        assert flag in joined
    assert [command[i + 1] for i, word in enumerate(command) if word == "--section"] == list(limits.SECTIONS)
    assert command[-3:] == [str(limits.SCRIPT), "--case", "bwd-b1"]
    assert "--metrics" not in limits.ncu_command("ncu", "bwd-b1", Path("r"), [])
    assert limits.export_command("ncu", Path("r.ncu-rep"), "raw") == [
        "ncu", "--import", "r.ncu-rep", "--csv", "--page", "raw"]


def test_units_and_numbers_as_ncu_prints_them(limits):
    assert limits.to_number("8,231,296") == 8231296.0
    assert limits.to_number("n/a") is None and limits.to_number(None) is None
    assert limits.in_json_units(8231296.0, "ns") == pytest.approx(8231.296)
    assert limits.in_json_units(5.09, "msecond") == pytest.approx(5090.0)
    assert limits.in_json_units(131.58, "Kbyte/block") == pytest.approx(131580.0)
    assert limits.in_json_units(55.11, "%") == 55.11
    assert limits.in_json_units(None, "ns") is None


def test_rows_from_the_details_and_raw_pages(limits):
    case = limits.CASES_BY_NAME["bwd-b1"]
    dkdv, dq = limits.case_rows(case, DETAILS, RAW)
    assert (dkdv["case"], dkdv["launch"], dkdv["kernel"], dkdv["grid"]) == ("bwd-b1", 0, "_bwd_dkdv_kernel",
                                                                           "(64, 64, 1)")
    assert dkdv["duration_us"] == pytest.approx(8231.3)  # the raw page first (usecond)
    assert dkdv["sm_throughput_pct"] == 55.11 and dkdv["dram_throughput_pct"] == 3.2  # details only
    assert dkdv["registers_per_thread"] == 255 and dkdv["achieved_occupancy_pct"] == 12.49
    assert dkdv["dynamic_shared_bytes"] == pytest.approx(131580.0)
    assert dkdv["dram_bytes"] == pytest.approx(402.5e6 + 1048576)  # read + write, each in bytes
    assert dkdv["local_load_bytes"] == 320 and dkdv["local_store_bytes"] == 64  # sectors of 32 bytes; bytes
    assert dkdv["global_red_inst"] == 0 and dkdv["atomic_inst_share"] == 0.0
    assert dkdv["tensor_pipes_pct"] == {"sm__pipe_tensor_op_hmma_cycles_active": 1.5,
                                        "sm__pipe_tensor_op_gmma_cycles_active": 47.25}
    assert dkdv["tensor_pipe_pct"] == 47.25
    assert dkdv["no_eligible_pct"] == 61.3
    assert dkdv["stalls"]["selected"] == 1.0
    assert dkdv["top_stalls"] == [["math_pipe_throttle", 3.3], ["barrier", 2.1], ["short_scoreboard", 1.7],
                                  ["wait", 0.9], ["long_scoreboard", 0.4]]  # largest first; "selected" is no stall
    assert dq["kernel"] == "_bwd_dq_kernel" and dq["launch"] == 1
    assert dq["duration_us"] == pytest.approx(5090.0)  # details in ms
    assert dq["issue_slots_busy_pct"] == 40.25 and dq["warp_cycles_per_issued"] == 5.32
    assert dq["registers_per_thread"] is None and dq["tensor_pipe_pct"] is None and dq["top_stalls"] == []


def test_rows_read_a_details_page_alone(limits):
    rows = limits.case_rows(limits.CASES_BY_NAME["bwd-b1"], DETAILS, "")
    assert [r["kernel"] for r in rows] == ["_bwd_dkdv_kernel", "_bwd_dq_kernel"]
    assert rows[0]["duration_us"] == pytest.approx(8231.296)
    assert limits.case_rows(limits.CASES_BY_NAME["bwd-b1"], "==ERROR== nothing\n", "") == []


def test_a_failed_or_hung_case_keeps_the_others(limits, tmp_path):
    """bwd-b1 profiles, bwd-cudnn outlives its limit, bwd-b6a's ncu does not start, decode-fp16 exits with an
    error and no report; the clock then has no budget left for decode-fp8."""
    now = [0.0]
    calls = []

    def runner(command, timeout, log_path):
        case = command[-1]
        calls.append((case, timeout))
        now[0] += 40.0
        if case == "bwd-b1":
            Path(command[command.index("--export") + 1] + ".ncu-rep").write_text("report")
            log_path.write_text("==PROF== Disconnected\n")
            return 0
        if case == "bwd-cudnn":
            return None
        if case == "bwd-b6a":
            raise OSError("no such file")
        log_path.write_text("Traceback ...\nRuntimeError: mbarrier wait failed\n")
        now[0] += 200.0
        return 1

    def exporter(ncu, report, page):
        return DETAILS if page == "details" else RAW

    cases = limits.select_cases(["bwd-b1", "bwd-cudnn", "bwd-b6a", "decode-fp16", "decode-fp8"])
    meta = {"date": "2026-12-02", "device": "NVIDIA H200", "torch": "2.11.0", "triton": "3.6.0"}
    path = limits.run_ncu(cases, tmp_path, ncu="ncu", meta=meta, metrics=["a.sum"], budget=250.0,
                          case_timeout=150.0, runner=runner, exporter=exporter, clock=lambda: now[0])
    assert path == tmp_path / "2026-12-02-nvidia-h200-ncu-limits.json"
    data = json.loads(path.read_text())
    assert [c for c, _ in calls] == ["bwd-b1", "bwd-cudnn", "bwd-b6a", "decode-fp16"]
    assert [t for _, t in calls] == [150.0, 150.0, 150.0, 250.0 - 120.0 - limits.RESERVE_S]
    assert [(r["case"], r["kernel"]) for r in data["rows"]] == [("bwd-b1", "_bwd_dkdv_kernel"),
                                                                ("bwd-b1", "_bwd_dq_kernel")]
    cases_meta = data["meta"]["cases"]
    assert cases_meta["bwd-b1"]["status"] == "ok" and cases_meta["bwd-b1"]["kernels"] == 2
    assert cases_meta["bwd-b1"]["kernel_us_total"] == pytest.approx(8231.3 + 5090.0)
    assert cases_meta["bwd-cudnn"]["status"] == "timed out after 150 s"
    assert cases_meta["bwd-b6a"]["status"].startswith("exit -1") and "did not start" in cases_meta["bwd-b6a"]["status"]
    assert cases_meta["decode-fp16"]["status"] == "exit 1: RuntimeError: mbarrier wait failed"
    assert cases_meta["decode-fp8"]["status"].startswith("not run")
    assert cases_meta["bwd-b1"]["shape"]["n"] == 8192
    assert cases_meta["decode-fp8"]["shape"]["kv_dtype"] == "float8_e4m3fn"
    assert data["meta"]["kind"] == "ncu-limits" and data["meta"]["complete"] is True
    assert data["meta"]["sections"] == list(limits.SECTIONS) and data["meta"]["metrics"] == ["a.sum"]
    kept = tmp_path / "ncu-limits"
    assert (kept / "bwd-b1-details.csv").read_text() == DETAILS and (kept / "bwd-b1-raw.csv").read_text() == RAW
    assert not (kept / "bwd-b1.ncu-rep").exists()  # exported, then removed (--keep-reports keeps it)
    assert "bwd-b1" in limits.summary(data["rows"]) and "math_pipe_throttle 3.3" in limits.summary(data["rows"])


def test_the_cases_measure_the_shapes_the_benchmarks_use(limits):
    from flashcourse.bench.decode import DECODE_SHAPES

    d = limits.DECODE
    assert (d["batch"], d["heads"], d["heads_kv"], d["head_dim"], d["n"]) == DECODE_SHAPES[0]
    assert f"kv_idx < {limits.PREFIX_KEYS})" in inspect.getsource(limits.prefix_lm.fn)  # ours and Flex's rule agree
    b = limits.BWD
    assert (b["batch"], b["heads"], b["n"], b["head_dim"], b["dtype"], b["causal"]) == (4, 16, 8192, 128, "float16",
                                                                                       False)


def test_a_real_details_export_reads_as_the_docs_table_shows_it(limits):
    """The H200 export that docs/KERNELS.md's counter table comes from (ncu's own output, banner included)."""
    text = (ROOT / "benchmarks" / "results" / "2026-11-30-nvidia-h200-ncu.csv").read_text()
    rows = limits.case_rows(limits.CASES_BY_NAME["bwd-b1"], text, "")
    assert [r["kernel"] for r in rows] == ["_fwd_v7_kernel", "_bwd_dkdv_kernel", "_bwd_dq_kernel", "_bwd_dkdv_kernel"]
    assert [r["registers_per_thread"] for r in rows] == [194, 255, 255, 255]
    assert rows[0]["duration_us"] == pytest.approx(3708.256)
    assert rows[1]["achieved_occupancy_pct"] == 12.49 and rows[1]["sm_throughput_pct"] == 55.11
    assert rows[2]["warp_cycles_per_issued"] == 5.32
    assert rows[1]["dynamic_shared_bytes"] == 131584 and rows[1]["block_limit_registers"] == 1


FAKE_NCU = '''#!{python}
"""A stand-in for ncu: answers --version and --query-metrics, writes a report where a profile run would, and
prints the recorded pages on --import."""
import sys
from pathlib import Path

here = Path(__file__).parent
args = sys.argv[1:]
if args == ["--version"]:
    print("NVIDIA (R) Nsight Compute Command Line Profiler\\nVersion 2099.1.0.0 (build 1) (public-release)")
elif args == ["--query-metrics"]:
    print((here / "query.txt").read_text())
elif "--import" in args:
    print((here / (args[args.index("--page") + 1] + ".csv")).read_text(), end="")
else:
    (here / "calls.txt").open("a").write(" ".join(args) + "\\n")
    Path(args[args.index("--export") + 1] + ".ncu-rep").write_text("report")
'''


def test_run_ncu_drives_an_ncu_binary_end_to_end(limits, tmp_path, monkeypatch, capsys):
    """main --run-ncu through real processes, with a stand-in ncu: the metrics it lists are asked for, each page
    is exported and read, the JSON and the CSVs land in --out."""
    tool = tmp_path / "tool"
    tool.mkdir()
    (tool / "query.txt").write_text(QUERY)
    (tool / "details.csv").write_text(DETAILS)
    (tool / "raw.csv").write_text(RAW)
    ncu = tool / "ncu"
    ncu.write_text(FAKE_NCU.replace("{python}", sys.executable))
    ncu.chmod(0o755)
    monkeypatch.setattr(limits.signal, "signal", lambda *args: None)  # main's SIGTERM handler stays out of pytest
    out = tmp_path / "out"
    assert limits.main(["--run-ncu", "--out", str(out), "--ncu", str(ncu), "--only", "decode-fp8"]) == 0
    (path,) = out.glob("*-ncu-limits.json")
    data = json.loads(path.read_text())
    assert data["meta"]["ncu"] == "Version 2099.1.0.0 (build 1) (public-release)" and data["meta"]["metrics_listed"]
    assert data["meta"]["cases"]["decode-fp8"]["status"] == "ok"
    assert [r["case"] for r in data["rows"]] == ["decode-fp8", "decode-fp8"]
    (call,) = (tool / "calls.txt").read_text().splitlines()
    assert "--metrics dram__bytes_read.sum,smsp__inst_executed.sum," in call and call.endswith("--case decode-fp8")
    assert (out / "ncu-limits" / "decode-fp8-raw.csv").read_text() == RAW
    assert "decode-fp8" in capsys.readouterr().out


def test_a_refused_metric_is_dropped_and_the_case_run_again(limits, tmp_path):
    """ncu that lists a metric but will not collect it stops every case: the run drops the extra metrics once and
    goes on with the sections alone."""
    commands = []

    def runner(command, timeout, log_path):
        commands.append(command)
        if "--metrics" in command:
            log_path.write_text("==ERROR== Failed to find metric sm__pipe_tensor_op_gmma_cycles_active\n")
            return 1
        Path(command[command.index("--export") + 1] + ".ncu-rep").write_text("report")
        return 0

    path = limits.run_ncu(limits.select_cases(["bwd-b1", "decode-fp16"]), tmp_path, ncu="ncu",
                          meta={"date": "2026-12-02", "device": "NVIDIA H200"}, metrics=["a.sum"],
                          runner=runner, exporter=lambda ncu, report, page: DETAILS if page == "details" else RAW)
    data = json.loads(path.read_text())
    assert [c[-1] for c in commands] == ["bwd-b1", "bwd-b1", "decode-fp16"]
    assert ["--metrics" in c for c in commands] == [True, False, False]
    assert data["meta"]["metrics"] == [] and "Failed to find metric" in data["meta"]["metrics_dropped"]
    assert {name: c["status"] for name, c in data["meta"]["cases"].items()} == {"bwd-b1": "ok", "decode-fp16": "ok"}
    assert len(data["rows"]) == 4


def test_variant_gap_cases_take_their_shape_from_bench_variants(limits):
    from flashcourse.bench.variants import VARIANTS

    by_name = {v.name: v for v in VARIANTS}
    gaps = [case for case in limits.CASES if case.group == "variant gap"]
    assert len(gaps) == 2 * len(limits.VARIANT_GAPS)
    for case in gaps:
        variant = by_name[case.shape["variant"]]
        assert (case.shape["n"], case.shape["head_dim"], case.shape["heads"]) == (variant.n, variant.head_dim,
                                                                                 variant.heads)


def test_gap_cases_are_listed_last_by_group(limits, capsys):
    assert limits.main(["--list"]) == 0
    # the H100, b7 and b8 cases follow
    lines = capsys.readouterr().out.splitlines()[:-len(H100_NAMES) - len(B7_NAMES) - len(B8_NAMES)]
    assert [line.split()[0] for line in lines[-len(GAP_NAMES):]] == list(GAP_NAMES)
    assert [c.name for c in limits.GAP_CASES] == list(GAP_NAMES)
    assert [c.name for c in limits.CASES if c.group in limits.GAP_GROUPS] == list(GAP_NAMES)
    assert [c.group for c in limits.GAP_CASES] == ["forward gap"] * 6 + ["fp8 gap"] * 3 + ["backward gap"] * 2
    for case in limits.GAP_CASES:  # each of ours beside its reference, in one group
        assert case.group in lines[list(GAP_NAMES).index(case.name) - len(GAP_NAMES)]
        twin = case.name.replace("-ours", "-cudnn")
        if twin != case.name:
            assert limits.CASES_BY_NAME[twin].group == case.group


def test_gap_cases_are_selected_by_only(limits):
    picked = ["fp8-fwd-v8c", "fwd-d64-n4096-causal-ours", "bwd-d256-causal-cudnn"]
    args = limits.parse_args(["--run-ncu", "--out", "/tmp/x", *(a for n in picked for a in ("--only", n))])
    assert [c.name for c in limits.select_cases(args.only)] == picked
    with pytest.raises(SystemExit, match="unknown case 'fwd-d256-n4096-ours'"):
        limits.parse_args(["--dry", "--only", "fwd-d256-n4096-ours"])
    assert limits.parse_args(["--case", "fp8-fwd-triton-keys-adjacent"]).case == "fp8-fwd-triton-keys-adjacent"


def _timed_rows(name: str) -> list[dict]:
    return json.loads((ROOT / "benchmarks" / "results" / name).read_text())["rows"]


def test_gap_cases_profile_rows_the_benchmarks_timed(limits):
    """Each gap case is a shape and provider with an ok time row in the committed H200 results it comes from."""
    from flashcourse.bench import fp8 as bench_fp8
    from flashcourse.bench.attention import HEAD_CONFIGS
    from flashcourse.bench.variants import VARIANTS

    heads = {d: h for h, d in HEAD_CONFIGS}
    attention = _timed_rows("2026-12-02-nvidia-h200-attention-fp16-1a7bc36.json")
    for case in (c for c in limits.GAP_CASES if c.group == "forward gap"):
        s = case.shape
        assert (s["batch"], s["n"], s["dtype"], s["mode"]) == (4, 4096, "float16", "fwd")
        assert s["heads"] == heads[s["head_dim"]]  # the grid's heads at this head dim, the same FLOPs per token
        assert case.provider in ("flashcourse", "sdpa_cudnn")
        (row,) = [r for r in attention if r["provider"] == case.provider and r["mode"] == "fwd"
                  and (r["batch"], r["heads"], r["n"], r["head_dim"], r["causal"]) == (
                      s["batch"], s["heads"], s["n"], s["head_dim"], s["causal"])]
        assert row["status"] == "ok"
    fp8_rows = _timed_rows("2026-12-02-nvidia-h200-fa3-fp8.json")
    for case in (c for c in limits.GAP_CASES if c.group == "fp8 gap"):
        s = case.shape
        assert (s["batch"], s["heads"]) == (bench_fp8.BATCH, bench_fp8.HEADS)  # the inputs bench fp8 makes
        (row,) = [r for r in fp8_rows if r["kind"] == "time" and r["provider"] == case.provider
                  and (r["batch"], r["heads"], r["n"], r["head_dim"], r["causal"]) == (
                      s["batch"], s["heads"], s["n"], s["head_dim"], s["causal"])]
        assert row["status"] == "ok" and row.get("v_layout") == s.get("v_layout")
        assert row["out_dtype"] == s["out_dtype"]
    assert limits.CASES_BY_NAME["fp8-fwd-v8c"].provider == limits.FP8_STAGE
    variant = next(v for v in VARIANTS if v.name == limits.BWD_GAP_VARIANT)
    variants = _timed_rows("2026-12-03-nvidia-h200-variants.json")
    for case in (c for c in limits.GAP_CASES if c.group == "backward gap"):
        s = case.shape
        assert (s["batch"], s["heads"], s["n"], s["head_dim"], s["causal"], s["mode"]) == (
            variant.batch, variant.heads, variant.n, variant.head_dim, variant.causal, "bwd") == (
            4, 16, 8192, 256, True, "bwd")
        (row,) = [r for r in variants if r["variant"] == variant.name and r["provider"] == case.provider
                  and r["mode"] == "bwd" and r["dtype"] == s["dtype"]]
        assert row["status"] == "ok"


def test_gap_builders_call_what_the_route_and_the_stages_name(limits):
    """What the builders import exists here: the forward's Gluon stage at each gap's head dim (on Hopper), b1 for
    the D = 256 backward, the FP8 stage and the Triton FP8 calls."""
    import torch

    from flashcourse import kernels
    from flashcourse.kernels import fp8, plan

    for head_dim, causal in limits.FORWARD_GAPS:
        assert plan.band_forward(head_dim, causal, limits.FWD_GAP["n"])[0].startswith("v8")
    s = limits.CASES_BY_NAME["bwd-d256-causal-ours"].shape
    q = torch.zeros(1, 1, 16, s["head_dim"], dtype=torch.float16)
    assert kernels.explain(q, q, q, causal=s["causal"]).backward == "b1"
    assert callable(fp8.quantize_fp8) and callable(fp8.v_keys_contiguous) and callable(fp8.flash_attention_forward_fp8)
    pytest.importorskip("triton.experimental.gluon.language.nvidia.hopper")
    try:
        from flashcourse.kernels.hopper import fa3_fp8
    except (ImportError, AttributeError) as error:
        pytest.skip(f"fa3_fp8.py does not import under this Triton: {error}")
    assert limits.FP8_STAGE in fa3_fp8.STAGES and callable(fa3_fp8.fa3_fp8_forward)


def test_the_script_imports_no_gluon_module(tmp_path):
    """Gluon modules are imported inside the case builders only: the script loads under any Triton."""
    code = ("import importlib.util, sys\n"
            f"spec = importlib.util.spec_from_file_location('ncu_limits', {str(SCRIPT)!r})\n"
            "module = importlib.util.module_from_spec(spec)\n"
            "sys.modules['ncu_limits'] = module\n"
            "spec.loader.exec_module(module)\n"
            "print(sorted(m for m in sys.modules if 'hopper' in m.split('.') and m.startswith('flashcourse')\n"
            "             or m.startswith('triton.experimental.gluon')), len(module.CASES))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONPATH=child_pythonpath()), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    cases = 31 + len(H100_NAMES) + len(B7_NAMES) + len(B8_NAMES)
    assert proc.stdout.strip().splitlines()[-1] == f"[] {cases}", proc.stdout


STUB_PYTHON = '''#!{python}
"""python3 for scripts/gpu_run.sh: records its arguments; a --run-ncu makes the raw folder ncu_limits.py would."""
import json, os, sys
from pathlib import Path

with open(os.environ["STUB_CALLS"], "a") as calls:
    calls.write(json.dumps(sys.argv[1:]) + "\\n")
if "--run-ncu" in sys.argv:
    out = Path(sys.argv[sys.argv.index("--out") + 1])
    (out / "ncu-limits").mkdir(parents=True, exist_ok=True)
    (out / "ncu-limits" / "case.log").write_text("log")
    (out / "2099-01-01-stub-ncu-limits.json").write_text("{}")
'''


def _run_gpu_stage(tmp_path: Path, stage: str) -> tuple[Path, subprocess.CompletedProcess, list[list[str]]]:
    """Run ``scripts/gpu_run.sh STAGE`` with python3 and nvidia-smi stubbed: ($OUT, the process, the argument lists
    python3 was called with)."""
    tools = stub_gpu_tools(tmp_path, STUB_PYTHON)
    out, calls = tmp_path / "out", tmp_path / "calls.jsonl"
    env = dict(os.environ, PATH=f"{tools}{os.pathsep}{os.environ['PATH']}", OUT=str(out), STUB_CALLS=str(calls))
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_run.sh"), stage], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out, proc, [json.loads(line) for line in calls.read_text().splitlines()]


def test_gpu_run_gaps_stage_runs_the_gap_cases_in_one_call(limits, tmp_path):
    """scripts/gpu_run.sh gaps (python3 and nvidia-smi stubbed): one ncu_limits.py --run-ncu over GAP_CASES in
    their order, a budget inside the stage's limit, the raw folder archived; under 8 files come back."""
    out, proc, runs = _run_gpu_stage(tmp_path, "gaps")
    (command,) = [c for c in runs if c and c[0] == "benchmarks/ncu_limits.py"]
    args = limits.parse_args(command[1:])
    assert args.run_ncu and args.out == out
    assert [c.name for c in limits.select_cases(args.only)] == [c.name for c in limits.GAP_CASES]
    stage_limit = int(re.search(r"stage gaps (\d+) ", (ROOT / "scripts" / "gpu_run.sh").read_text()).group(1))
    assert args.budget + 60 <= stage_limit <= 570  # the case processes are killed inside the stage's limit
    assert "=== gaps took" in proc.stdout
    left = sorted(p.name for p in out.iterdir())
    assert "ncu-limits-raw.tgz" in left and "ncu-limits" not in left and len(left) <= 7


def test_h100_cases_profile_the_gaps_each_beside_its_reference(limits):
    cases = {c.name: c for c in limits.H100_CASES}
    assert tuple(cases) == H100_NAMES
    assert {c.group for c in cases.values()} == set(limits.H100_GROUPS)
    short = [c for c in cases.values() if c.group == "short causal gap"]
    assert {c.shape["n"] for c in short} == {1024}
    assert all(c.shape["causal"] and c.shape["head_dim"] == 64 for c in short)
    assert {c.provider for c in short} == {"flashcourse", "sdpa_cudnn", "fa3-v8a"}
    fa4 = [c for c in cases.values() if c.group == "fa4 gap"]
    assert [c.provider for c in fa4] == ["fa3-v8f", "fa3-v9a", "fa3-v9b_1of16", "fa3-v9b_1of4"]
    assert all(c.shape == fa4[0].shape for c in fa4)


def test_b7_cases_profile_each_variant_at_cudnn_s_shape():
    """The b7 cases, read in a child process (the script is never executed in this one for them): one a variant
    of fa3_backward_tma.STAGES, each at the shape of ``bwd-cudnn`` (D = 128), and each builds b7_backward with
    its own stage name (the one its builder closes over), so ncu profiles the variant the case names."""
    code = textwrap.dedent("""
        import importlib.util, json, sys
        spec = importlib.util.spec_from_file_location("ncu_limits", sys.argv[1])
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        cudnn = module.CASES_BY_NAME["bwd-cudnn"]
        print(json.dumps({"cases": [[c.name, c.provider, c.group, c.shape == cudnn.shape,
                                     dict(zip(c.build.__code__.co_freevars,
                                              (cell.cell_contents for cell in c.build.__closure__)))["stage"]]
                                    for c in module.B7_CASES],
                          "shape": cudnn.shape,
                          "listed": [c.name for c in module.CASES if c.group == module.B7_GROUP],
                          "b8": [[c.name, c.provider, c.shape,
                                  dict(zip(c.build.__code__.co_freevars,
                                           (cell.cell_contents for cell in c.build.__closure__)))["stage"]]
                                 for c in module.B8_CASES]}))
    """)
    proc = subprocess.run([sys.executable, "-c", code, str(SCRIPT)], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=child_pythonpath()))
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert [c[0] for c in out["cases"]] == list(B7_NAMES) == out["listed"]
    for name, provider, group, same_shape, stage in out["cases"]:
        assert name == f"bwd-{provider}-d128" and stage == provider, (name, provider, stage)
        assert same_shape and group == "b7 at D = 128"
    assert out["shape"]["head_dim"] == 128 and not out["shape"]["causal"]
    # b8 and b8c at D = 256, causal, each building its own stage (the backward gap's shape)
    assert [(name, provider, stage) for name, provider, _, stage in out["b8"]] == [
        ("bwd-b8-d256", "b8", "b8"), ("bwd-b8c-d256", "b8c", "b8c")]
    assert all(shape == {**out["shape"], "head_dim": 256, "causal": True} for _, _, shape, _ in out["b8"])


# `ncu --import R --csv --page source --print-source sass` of a report with the Source Counters section, two kernels
# (the dK/dV launch of DETAILS, then the dQ one), written by hand in the shape that the Nsight Compute CLI user
# manual's "--page source" / "--print-source" options and the UI manual's "Source Page" (the columns "Address",
# "Source", "Warp Stall Sampling (All Samples)", "Warp Stall Sampling (Not-issued Samples)", "Instructions
# Executed", one "stall_<reason>" column per reason) describe: a banner, then per kernel a "Kernel Name" line, a
# header and one row per SASS instruction, counts with thousands separators. Not yet checked against a 2025.3 export.
SOURCE_HEADER = ["Address", "Source", "Warp Stall Sampling (All Samples)", "Warp Stall Sampling (Not-issued Samples)",
                 "Instructions Executed", "Thread Instructions Executed", "stall_barrier", "stall_long_sb",
                 "stall_short_sb", "stall_wait", "stall_selected"]
DKDV_SASS = [  # (offset, SASS, all samples, not issued, executed, barrier, long_sb, short_sb, wait, selected)
    (0x00, "MOV R1, c[0x0][0x28]", "0", "0", "1,024", "0", "0", "0", "0", "0"),
    (0x10, "SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR8+0x1c000], R5", "300", "290", "8,192", "0", "250", "0", "40", "10"),
    (0x20, "@!P0 BRA 0x7f3a2c001a10", "50", "30", "8,192", "0", "0", "0", "30", "20"),
    (0x30, "BAR.SYNC.DEFER_BLOCKING 0x0", "1,200", "1,150", "4,096", "1,150", "0", "0", "0", "50"),
    (0x40, "STS.128 [R3], R8", "150", "120", "4,096", "0", "0", "120", "0", "30"),
    (0x50, "HGMMA.64x128x16.F32 R24, gdesc[UR4], R24, gsb0", "100", "60", "4,096", "0", "0", "0", "60", "40"),
    (0x60, "WARPGROUP.DEPBAR.LE gsb0, 0x0", "400", "380", "4,096", "0", "0", "0", "380", "20"),
    (0x70, "@P1 BAR.SYNC.DEFER_BLOCKING 0x1, 0x100", "600", "590", "4,096", "590", "0", "0", "0", "10"),
    (0x80, "LDSM.16.M88.4 R40, [R2]", "200", "150", "4,096", "0", "0", "150", "0", "50"),
    (0x90, "EXIT", "0", "0", "1,024", "0", "0", "0", "0", "0")]
DQ_SASS = [(0x00, "BAR.SYNC.DEFER_BLOCKING 0x0", "999", "990", "512", "990", "0", "0", "0", "9")]


def source_page(names=("_bwd_dkdv_kernel", "_bwd_dq_kernel")) -> str:
    text = "==PROF== Connected to process 834 (/usr/bin/python3.12)\n"
    for name, sass, base in zip(names, (DKDV_SASS, DQ_SASS), (0x7F3A2C001A00, 0x7F3A2C100000), strict=False):
        text += csv_lines([["Kernel Name", name], SOURCE_HEADER] +
                          [[hex(base + offset), code, samples, not_issued, executed,
                            f"{32 * int(executed.replace(',', '')):,}", *reasons]  # 32 threads of each warp
                           for offset, code, samples, not_issued, executed, *reasons in sass])
    return text


def test_source_page_gives_the_main_kernel_its_stall_sites(limits):
    rows = limits.case_rows(limits.CASES_BY_NAME["bwd-cudnn"], DETAILS, RAW)
    assert limits.add_stall_sites(rows, source_page()) == ""
    dkdv, dq = rows  # dK/dV is the longer launch (8231 us against 5090): the main kernel
    assert "stall_sites" not in dq and dkdv["stall_samples"] == 3000
    sites = dkdv["stall_sites"]
    assert [s["offset"] for s in sites] == ["0x30", "0x70", "0x60", "0x10", "0x80", "0x40", "0x50", "0x20"]
    first = sites[0]
    assert first["sass"] == "BAR.SYNC.DEFER_BLOCKING 0x0" and first["opcode"] == "BAR.SYNC.DEFER_BLOCKING"
    assert first["family"] == "BAR" and first["share"] == 0.4 and first["samples"] == 1200
    assert first["reasons"] == [["barrier", pytest.approx(1150 / 1200, abs=1e-4)]]  # "selected" is no stall
    assert first["not_issued_share"] == pytest.approx(1150 / 1200, abs=1e-4) and first["executed"] == 4096
    assert sites[1]["opcode"] == "BAR.SYNC.DEFER_BLOCKING" and sites[1]["family"] == "BAR"  # predicate dropped
    syncs = sites[3]
    assert syncs["family"] == "SYNCS" and syncs["reasons"] == [["long_sb", 0.8333], ["wait", 0.1333]]
    assert [s["family"] for s in sites[4:]] == ["LDS/STS", "LDS/STS", "WARPGROUP/HGMMA", "other"]
    assert dkdv["stall_families"] == {
        "BAR": {"share": 0.6, "reasons": [["barrier", pytest.approx(1740 / 1800, abs=1e-4)]]},
        "SYNCS": {"share": 0.1, "reasons": [["long_sb", 0.8333], ["wait", 0.1333]]},
        "WARPGROUP/HGMMA": {"share": 0.1667, "reasons": [["wait", 0.88]]},
        "LDS/STS": {"share": 0.1167, "reasons": [["short_sb", 0.7714]]},
        "other": {"share": 0.0167, "reasons": [["wait", 0.6]]}}
    assert "BAR 60% (barrier)" in limits.stall_summary(rows) and "0x30" in limits.stall_summary(rows)


def test_source_tables_are_matched_by_name_else_by_position(limits):
    rows = limits.case_rows(limits.CASES_BY_NAME["bwd-cudnn"], DETAILS, RAW)
    tables = limits.parse_source(source_page(names=("_bwd_dq_kernel", "_bwd_dkdv_kernel")))
    assert limits.source_table_for(tables, rows, rows[0])["kernel"] == "_bwd_dkdv_kernel"  # the name, not the place
    assert len(limits.source_table_for(tables, rows, rows[0])["instructions"]) == 1  # (DQ_SASS under dK/dV's name)
    mangled = limits.parse_source(source_page(names=("_Z5dkdvv", "_Z3dqv")))
    assert limits.source_table_for(mangled, rows, rows[0])["kernel"] == "_Z5dkdvv"  # one table per launch: in order
    assert limits.source_table_for(mangled[:1], rows, rows[0]) is None
    assert "no table for _bwd_dkdv_kernel among 1" in limits.add_stall_sites(rows, source_page(names=("_Z3dqv",)))
    assert limits.parse_source("==PROF== Disconnected\n") == []
    assert limits.REASON_COLUMN.match("stall_long_sb") and not limits.REASON_COLUMN.match("stall_barrier_not_issued")


def test_by_instruction_samples_only_the_backward_cases_and_keeps_their_reports(limits, tmp_path):
    commands, pages = [], []

    def runner(command, timeout, log_path):
        commands.append(command)
        Path(command[command.index("--export") + 1] + ".ncu-rep").write_text("report")
        return 0

    def exporter(ncu, report, page):
        pages.append((report.stem, page))
        return {"details": DETAILS, "raw": RAW, "source": source_page()}[page]

    cases = limits.select_cases(["bwd-b1", "bwd-b7c-d128", "bwd-cudnn"])
    path = limits.run_ncu(cases, tmp_path, ncu="ncu", meta={"date": "2026-12-06", "device": "NVIDIA H100"},
                          metrics=[], by_instruction=True, runner=runner, exporter=exporter)
    sections = [[c[i + 1] for i, word in enumerate(c) if word == "--section"] for c in commands]
    assert [s[-1] == "SourceCounters" for s in sections] == [False, True, True]
    assert sections[0] == list(limits.SECTIONS) and sections[1] == [*limits.SECTIONS, "SourceCounters"]
    assert [page for case, page in pages if case == "bwd-b1"] == ["details", "raw"]
    assert [page for case, page in pages if case == "bwd-cudnn"] == ["details", "raw", "source"]
    kept = tmp_path / "ncu-limits"
    assert not (kept / "bwd-b1.ncu-rep").exists() and (kept / "bwd-cudnn.ncu-rep").exists()
    assert (kept / "bwd-b7c-d128-source.csv").read_text() == source_page()
    data = json.loads(path.read_text())
    assert data["meta"]["by_instruction"]["cases"] == ["bwd-b7c-d128", "bwd-cudnn"]
    assert [(r["case"], "stall_sites" in r) for r in data["rows"]] == [
        ("bwd-b1", False), ("bwd-b1", False), ("bwd-b7c-d128", True), ("bwd-b7c-d128", False), ("bwd-cudnn", True),
        ("bwd-cudnn", False)]
    assert {c["status"] for c in data["meta"]["cases"].values()} == {"ok"}
    assert limits.export_command("ncu", Path("r.ncu-rep"), "source")[-4:] == [
        "--page", "source", "--print-source", "sass"]


def test_by_instruction_is_checked_against_the_mode_and_the_cases(limits, capsys):
    for argv, words in ((["--dry", "--by-instruction"], "needs --run-ncu"),
                        (["--run-ncu", "--out", "o", "--by-instruction", "--only", "bwd-b1"], "bwd-b7")):
        with pytest.raises(SystemExit):
            limits.parse_args(argv)
        assert words in capsys.readouterr().err
    assert limits.parse_args(["--run-ncu", "--out", "o", "--by-instruction", "--only", "bwd-cudnn"]).by_instruction


def test_by_instruction_end_to_end_through_an_ncu_binary(limits, tmp_path, monkeypatch, capsys):
    """main --run-ncu --by-instruction with the stand-in ncu: the case's command asks for the Source Counters, the
    source page is exported as SASS and read, the stall sites reach the JSON and the printed summary."""
    tool = tmp_path / "tool"
    tool.mkdir()
    for name, text in (("query.txt", QUERY), ("details.csv", DETAILS), ("raw.csv", RAW), ("source.csv", source_page())):
        (tool / name).write_text(text)
    ncu = tool / "ncu"
    ncu.write_text(FAKE_NCU.replace("{python}", sys.executable))
    ncu.chmod(0o755)
    monkeypatch.setattr(limits.signal, "signal", lambda *args: None)
    out = tmp_path / "out"
    assert limits.main(["--run-ncu", "--by-instruction", "--out", str(out), "--ncu", str(ncu),
                        "--only", "bwd-cudnn"]) == 0
    (call,) = (tool / "calls.txt").read_text().splitlines()
    assert "--section SourceCounters" in call
    (path,) = out.glob("*-ncu-limits.json")
    main_row = json.loads(path.read_text())["rows"][0]
    assert main_row["stall_sites"][0]["sass"] == "BAR.SYNC.DEFER_BLOCKING 0x0"
    assert main_row["stall_families"]["BAR"]["share"] == 0.6
    assert "BAR 60% (barrier)" in capsys.readouterr().out


def test_conflict_sites_name_the_instructions_that_replayed_shared_memory(limits):
    """The shape of b7d's export (H100, 2026-12-07): its 32 STS.64 of the dQ tile each took twice their ideal
    wavefronts, the HGMMA operand reads and the STSM none beyond it; an export without the columns gives none."""
    header = ["Address", "Source", "Instructions Executed", "L1 Wavefronts Shared", "L1 Wavefronts Shared Ideal"]
    sass = [(0x00, "HGMMA.64x64x16.F32 R152, gdesc[UR16], RZ, !UPT", "2,097,152", "16,777,216", "16,777,216"),
            (0x10, "STSM.16.M88.4 [R156+0x30000], R152", "2,097,152", "8,388,608", "8,388,608"),
            (0x20, "STS.64 [R8+UR9], R152", "2,097,152", "8,388,608", "4,194,304"),
            (0x30, "STS.64 [R8+UR9+0x400], R154", "2,097,152", "12,582,912", "4,194,304"),
            (0x40, "EXIT", "4,096", "", "")]
    page = csv_lines([["Kernel Name", "_b7_kernel"], header] +
                     [[hex(0x7F0000000000 + offset), *rest] for offset, *rest in sass])
    (table,) = limits.parse_source(page)
    found = limits.conflict_sites(table)
    assert found["shared_excess"] == 4_194_304 + 8_388_608
    assert [(site["offset"], site["excess"]) for site in found["conflict_sites"]] == [("0x30", 8_388_608),
                                                                                     ("0x20", 4_194_304)]
    assert found["conflict_sites"][1]["sass"] == "STS.64 [R8+UR9], R152"
    assert limits.conflict_sites(limits.parse_source(source_page())[0]) == {"shared_excess": 0, "conflict_sites": []}
