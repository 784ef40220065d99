"""benchmarks/gpu_b7.py's plan of rows and its runner of child processes, on the CPU with the GPU work stubbed.

The script runs on a GPU; what can be checked without one is checked here: which items each phase plans, that a
child's hang costs one row ("hang at <item> after X s") and the job goes on in a new child, that a crash and the
run's budget are recorded as such, and that a killed child is gone. The script is loaded only in child processes
(it turns Triton's interpreter off for its own process), never executed in this one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from child_env import child_pythonpath

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_b7.py"

_LOAD = textwrap.dedent("""
    import importlib.util, json, os, sys, time
    from pathlib import Path
    spec = importlib.util.spec_from_file_location("gpu_b7", sys.argv[1])
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
""")

# A stub child: the script's own loop over items, with work that is quick, hangs or crashes as the item says.
_STUB_CHILD = _LOAD + textwrap.dedent("""
    items, rows, pids = json.loads(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4])
    with pids.open("a") as file:
        file.write(f"{os.getpid()}\\n")

    def work(item):
        if item["does"] == "hang":
            time.sleep(600)
        if item["does"] == "crash":
            os._exit(3)
        if item["does"] == "fault":  # as a check's row reads after an illegal instruction on the GPU
            return {"kind": "check", "provider": "b7", **item,
                    "status": "AcceleratorError: CUDA error: an illegal instruction was encountered"}
        time.sleep(0.05)
        return {"kind": "time", "provider": "b7", **item, "status": "ok"}

    script.child_loop(items, rows, work)
""")

# The parent side: the script's runner over jobs read from argv, the rows printed as JSON.
_RUN = _LOAD + textwrap.dedent("""
    jobs, parallel, item_timeout, budget, stub, pids = json.loads(sys.argv[2]), *map(float, sys.argv[3:6]), \\
        sys.argv[6], sys.argv[7]
    command = lambda items, path: [sys.executable, "-c", stub, sys.argv[1], json.dumps(items), str(path), pids]
    rows = script.run_jobs("time", jobs, command, parallel=int(parallel), item_timeout=item_timeout,
                           deadline=time.time() + budget, poll=0.05)
    print(json.dumps(rows))
""")


def _item(does: str, n: int) -> dict:
    return {"dtype": "float16", "head_dim": 64, "n": n, "causal": False, "batch": 1, "heads": 1, "does": does}


def _run(jobs, tmp_path, *, parallel=2, item_timeout=60.0, budget=120.0):
    pids = tmp_path / "pids"
    proc = subprocess.run([sys.executable, "-c", _RUN, str(SCRIPT), json.dumps(jobs), str(parallel),
                           str(item_timeout), str(budget), _STUB_CHILD, str(pids)],
                          capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONPATH=child_pythonpath()))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    rows = json.loads(proc.stdout.strip().splitlines()[-1])
    return rows, [int(line) for line in pids.read_text().split()], proc.stdout


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_a_hang_costs_one_row_and_a_crash_is_recorded(tmp_path):
    jobs = [[_item("ok", 1), _item("hang", 2), _item("ok", 3)], [_item("ok", 4), _item("crash", 5), _item("ok", 6)],
            [_item("ok", 7)]]
    rows, pids, log = _run(jobs, tmp_path, item_timeout=3.0)
    assert [r["n"] for r in rows] == [1, 2, 3, 4, 5, 6, 7]  # job by job, each item's row in its place
    status = {r["n"]: r["status"] for r in rows}
    assert all(status[n] == "ok" for n in (1, 3, 4, 6, 7)), status
    assert status[2].startswith("hang at float16 D=64 N=2 causal=False B=1 H=1 after "), status[2]
    assert status[2].endswith("(limit 3 s)"), status[2]
    assert status[5].startswith("child exited 3 during float16 D=64 N=5"), status[5]
    assert len(pids) == 5  # three jobs' children and one more for each job's remaining item
    assert all(_gone(pid) for pid in pids)  # the hung child was killed
    assert "hang at float16 D=64 N=2" in log  # and said so as it happened


def test_after_a_gpu_fault_a_new_child_takes_the_rest_of_the_job(tmp_path):
    # A fault breaks the CUDA context for the rest of the process: each item after it must run in a new child.
    jobs = [[_item("fault", 1), _item("ok", 2), _item("fault", 3), _item("ok", 4)]]
    rows, pids, _ = _run(jobs, tmp_path, parallel=1)
    status = {r["n"]: r["status"] for r in rows}
    assert status[1] == status[3] == "AcceleratorError: CUDA error: an illegal instruction was encountered", status
    assert status[2] == status[4] == "ok", status
    assert len(pids) == 3


def test_the_budget_cuts_the_running_item_and_skips_the_rest(tmp_path):
    jobs = [[_item("ok", 1), _item("hang", 2), _item("ok", 3)], [_item("ok", 4)]]
    rows, pids, _ = _run(jobs, tmp_path, parallel=1, item_timeout=120.0, budget=4.0)
    status = {r["n"]: r["status"] for r in rows}
    assert status[1] == "ok"
    assert status[2].startswith("cut at float16 D=64 N=2") and status[2].endswith("the run's budget ended"), status
    assert status[3] == status[4] == "not run: the run's budget is spent", status
    assert all(_gone(pid) for pid in pids)


def test_the_plan_compiles_every_timed_variant_first_and_quick_is_one_shape_a_head_dim_and_dtype(tmp_path):
    code = _LOAD + textwrap.dedent("""
        plans = {f"{shape_set} {checks} {','.join(variants)}": script.plan(shape_set, checks, variants)
                 for shape_set in ("quick", "lengths", "short") for checks in (True, False)
                 for variants in (("b7",), ("b7", "b7b"))}
        rows = [{"kind": "check", "provider": "b7", "dtype": "float16", "head_dim": 64, "status": "ok"},
                {"kind": "check", "provider": "b7", "dtype": "float16", "head_dim": 128, "status": "wrong"},
                {"kind": "check", "provider": "b7b", "dtype": "float16", "head_dim": 128, "status": "ok"},
                *({"kind": "time", "provider": p, "dtype": "float16", "head_dim": d} for p in ("b7", "b1", "b7b")
                  for d in (64, 128)),
                {"kind": "time", "provider": "b7", "dtype": "bfloat16", "head_dim": 64}]
        script.mark_checks(rows, ("b7", "b7b"))
        print(json.dumps({"plans": plans, "marked": [r.get("checks_passed", "absent") for r in rows[3:]]}))
    """)
    proc = subprocess.run([sys.executable, "-c", code, str(SCRIPT)], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=child_pythonpath()))
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    for key, plan in out["plans"].items():
        shape_set, checks, names = key.split()
        checks, names = checks == "True", names.split(",")
        timed = plan["time"][0]
        variants = {(i["dtype"], i["head_dim"], i["causal"]) for i in timed}
        assert variants == {(dt, d, c) for dt in ("float16", "bfloat16") for d in (64, 128) for c in (False, True)}
        assert {i["provider"] for i in timed} == set(names)
        # One compile job a (dtype, D, causal), holding exactly its timed shapes of every named variant, once
        # (the first sweep's): the timings then compile nothing.
        assert len(plan["compile"]) == len(variants)
        assert sorted(json.dumps(i, sort_keys=True) for job in plan["compile"] for i in job) == sorted(
            json.dumps(i, sort_keys=True) for i in timed if i["sweep"] == 0)
        assert all(len({(i["dtype"], i["head_dim"], i["causal"]) for i in job}) == 1 for job in plan["compile"])
        shapes = {(i["batch"], i["heads"], i["n"]) for i in timed}
        assert shapes == {"quick": {(4, 16, 8192)},
                          "lengths": {(16, 32, 1024), (8, 32, 2048), (4, 32, 4096), (4, 16, 8192), (2, 16, 16384)},
                          # short: little work a call, B*H 16-128 at N 1024 and 2048
                          "short": {(1, 16, 1024), (4, 16, 1024), (4, 32, 1024), (4, 16, 2048), (4, 32, 2048)},
                          }[shape_set], key
        sweeps = 2 if len(names) > 1 else 1
        assert len(timed) == len(variants) * len(shapes) * len(names) * sweeps
        # Several variants: each shape's in the order named, then reversed, one after the other.
        first = [(i["provider"], i["sweep"]) for i in timed[:len(names) * sweeps]]
        assert first == [(n, 0) for n in names] + [(n, 1) for n in reversed(names)][:len(names) * (sweeps - 1)]
        checked = [i for job in plan["check"] for i in job]
        if checks:
            assert len(checked) == 40 * len(names) and {i["n"] for i in checked} == {1, 17, 130, 1000, 4096}
            assert {i["provider"] for i in checked} == set(names)
        else:
            assert checked == []
    # b7's rows: D 64 checked and passed, D 128 checked and failed; b1's rows untouched; b7b's D 64 not checked,
    # its D 128 passed (b7's failure at D 128 is not b7b's); b7's bfloat16 not checked.
    assert out["marked"] == [True, False, "absent", "absent", None, True, None]


def test_a_budget_that_leaves_the_compiles_no_time_is_refused_before_any_work():
    """The timings' reserve grows with the rows: two variants by length, each timed in two sweeps, keep 202 s. A
    run given --budget 330 when the reserve was 2 s a row (330 s) compiled nothing and timed nothing, each variant's
    row "budget spent", on the H100 (2026-12-06); now a budget short of the reserve plus MIN_COMPILE_S stops at
    once and names one that does."""
    def run(budget):
        return subprocess.run([sys.executable, str(SCRIPT), "--variants", "b7c,b7d", "--budget", str(budget)],
                              capture_output=True, text=True, timeout=300,
                              env=dict(os.environ, PYTHONPATH=child_pythonpath(), CUDA_VISIBLE_DEVICES=""))
    short = run(150)  # two variants are timed in two sweeps: 160 rows of theirs and 80 of the references
    assert short.returncode == 2 and "--budget 150 s is too short: the timings keep 202 s" in short.stdout, (
        short.stdout + short.stderr[-2000:])
    assert "give --budget 322 or more" in short.stdout
    enough = run(330)  # past the budget's check: on this CPU it then stops for want of a GPU
    assert enough.returncode == 2 and "needs a CUDA GPU" in enough.stdout, enough.stdout + enough.stderr[-2000:]


def test_sweeps_merge_into_one_row_a_variant_whose_time_is_their_mean():
    """Two variants at a shape: b7 then b7b, then b7b then b7: each row's time the mean of its two sweeps'
    medians, its range the widest, its rate recomputed from them; a failed sweep is left out and said; one variant
    alone is timed once and its row passes unchanged."""
    code = _LOAD + textwrap.dedent("""
        shape = {"dtype": "float16", "head_dim": 64, "n": 8192, "causal": False, "batch": 4, "heads": 16}
        def timed(provider, sweep, ms, status="ok"):
            row = {"kind": "time", "provider": provider, **shape, "sweep": sweep, "status": status}
            if status == "ok":  # 1e12 FLOPs: ms milliseconds are 1000 / ms TFLOP/s
                row.update(ms=ms, ms_min=ms - 0.1, ms_max=ms + 0.1, repeats=3, tflops=1e3 / ms,
                           tflops_min=1e3 / (ms + 0.1), tflops_max=1e3 / (ms - 0.1))
            return row
        rows = [timed("b7", 0, 2.0), timed("b7b", 0, 1.0), timed("b7b", 1, 1.5), timed("b7", 1, 1.0),
                timed("b7c", 0, 4.0), timed("b7c", 1, 0, status="hang at b7c after 45 s")]
        print(json.dumps({"order": script.sweeps(["b7", "b7b", "b7c"]), "one": script.sweeps(["b7"]),
                          "merged": script.merge_sweeps(rows)}))
    """)
    proc = subprocess.run([sys.executable, "-c", code, str(SCRIPT)], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=child_pythonpath()))
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["order"] == [[0, "b7"], [0, "b7b"], [0, "b7c"], [1, "b7c"], [1, "b7b"], [1, "b7"]]
    assert out["one"] == [[0, "b7"]]
    b7, b7b, b7c = out["merged"]
    assert [r["provider"] for r in out["merged"]] == ["b7", "b7b", "b7c"]
    assert not any("sweep" in r for r in out["merged"])
    assert (b7["ms"], b7["ms_min"], b7["ms_max"], b7["repeats"], b7["ms_by_sweep"]) == (1.5, 0.9, 2.1, 6, [2.0, 1.0])
    assert abs(b7["tflops"] - 1e3 / 1.5) < 1e-9 and abs(b7["tflops_min"] - 1e3 / 2.1) < 1e-9
    assert abs(b7["tflops_max"] - 1e3 / 0.9) < 1e-9
    assert b7b["ms"] == 1.25 and b7b["ms_by_sweep"] == [1.0, 1.5]
    assert b7c["ms"] == 4.0 and "ms_by_sweep" not in b7c and b7c["sweep_status"] == ["ok", "hang at b7c after 45 s"]
