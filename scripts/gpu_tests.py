"""The GPU tier in one go (``make test-gpu``): every kernel's GPU tests, and the launch-fit check under this
machine's Triton, then a results JSON.

Runs on a CUDA machine whose Python already has torch and triton (nothing is installed; from a checkout with
``PYTHONPATH=src``):

- ``pytest -m "(gpu and not sweep) or full"`` on several workers (compiling dominates), as many as the card's free
  memory holds: first every test but those marked ``big_gpu_memory`` on up to ``--workers`` workers of
  ``WORKER_GIB`` each, then the ``big_gpu_memory`` tests (float64 references at N = 8320) on workers of
  ``BIG_WORKER_GIB`` each, and last the ``huge_gpu_memory`` tests (tensors past 2**31 elements, 44 GB at once) on
  one worker alone. On an 80 GB H100, eight workers running everything at once ran out of memory (2026-12-06:
  the N = 8320 references beside the other workers' cached blocks). The exhaustive launch sweeps are ``-m sweep``;
  the two-GPU tests skip themselves, with the reason, on one GPU.
  ``full`` marks the CPU compile checks that ``make test`` runs only in part (the Gluon stages but one): here
  they run whole, under this machine's Triton;
- ``scripts/launch_fit.py`` for every architecture the course supports, in parallel processes: the compiler of
  this Triton must place every chosen launch within each GPU's shared memory too (``make test`` checks sm_75 and
  sm_90 only; tests/test_launch_fit.py's ``full`` cases are these runs, so pytest leaves that file to them);
- writes ``benchmarks/results/<date>-<device>-gpu-tests.json``: ``{"meta": {date, device, torch, triton},
  "summary": {passed, failed, skipped, seconds, failed_tests, failures (each failed test's report, its end),
  skip_reasons (reason: count)}, "launch_fit": {...}}``.

The lessons and solved exercises run on the GPU with ``scripts/gpu_notebooks.py`` (a separate step: Jupyter's
packages must be carried to that machine).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _env() -> dict:
    env = dict(os.environ)
    src = str(ROOT / "src")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    env.pop("TRITON_INTERPRET", None)
    return env


MARKERS = "(gpu and not sweep) or full"
BIG = "big_gpu_memory"
HUGE = "huge_gpu_memory"
WORKER_GIB = 8  # a worker of ordinary GPU tests: CUDA context, compiled kernels, its largest test's tensors
BIG_WORKER_GIB = 24  # a worker of big_gpu_memory tests: a float64 reference at N = 8320 peaks near 10 GiB
# huge_gpu_memory tests (tests/test_large_offsets.py: 2**31 elements a tensor, 44 GB at once) run on one worker with
# the card to themselves: on an 80 GB H100 a second one, or a big worker beside them, would not fit.


def workers_for(free_gib: float, per_worker_gib: float, most: int) -> int:
    """How many pytest workers the card's free memory holds, at most ``most``, at least one."""
    return max(1, min(most, int(free_gib // per_worker_gib)))
LAUNCH_FIT_TESTS = "tests/test_launch_fit.py"  # its every architecture is start_launch_fit's runs below


def gpu_test_files() -> list[str]:
    """The test files that hold GPU tests or ``full`` compile checks: the others import notebook packages this
    machine need not have."""
    return sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").glob("test_*.py")
                  if any(f"pytest.mark.{mark}" in p.read_text() for mark in ("gpu", "full"))
                  and str(p.relative_to(ROOT)) != LAUNCH_FIT_TESTS)


def start_launch_fit(folder: Path) -> list[tuple[str, subprocess.Popen, Path]]:
    """One launch_fit process per architecture (its GPUs together), started now, waited for later."""
    sys.path.insert(0, str(ROOT / "src"))
    from flashcourse.kernels.configs import KNOWN_DEVICES  # noqa: PLC0415  (a CUDA machine: no interpreter here)

    by_arch: dict[tuple[int, int], list[str]] = {}
    for name, props in KNOWN_DEVICES.items():
        by_arch.setdefault(props.capability, []).append(name)
    runs = []
    for capability, names in sorted(by_arch.items()):
        out = folder / f"fit-sm{capability[0]}{capability[1]}.json"
        args = [a for n in names for a in ("--target", n)]
        proc = subprocess.Popen([sys.executable, str(ROOT / "scripts" / "launch_fit.py"), *args, "--json", str(out)],
                                env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        runs.append((f"sm_{capability[0]}{capability[1]}", proc, out))
    return runs


def finish_launch_fit(runs) -> dict:
    summary = {"launches": 0, "do_not_fit": 0, "failed_runs": []}
    for arch, proc, out in runs:
        stdout, _ = proc.communicate()
        print(f"launch fit {arch}:", "\n".join(line for line in stdout.splitlines() if "Warning" not in line
                                                and "warn_once" not in line), flush=True)
        if not out.exists():
            summary["failed_runs"].append(arch)
            continue
        rows = json.loads(out.read_text())["rows"]
        summary["launches"] += len(rows)
        summary["do_not_fit"] += sum(not r["fits"] for r in rows)
    return summary


FAILURE_CHARS = 1500  # the end of each failure's report: the assertion and the lines that led to it


def _test_id(case: ET.Element) -> str:
    return f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name')}"


def failed_tests(suite: ET.Element) -> dict[str, str]:
    """Each failed or erroring test of a JUnit suite, by id (file::name[params]), with the end of its report: the
    machine is gone once the call ends, so the JSON must say why, not only which."""
    failed = {}
    for case in suite.iter("testcase"):
        report = next((found for found in (case.find("failure"), case.find("error")) if found is not None), None)
        if report is not None:
            text = f"{report.get('message', '')}\n{report.text or ''}".strip()
            failed[_test_id(case)] = text[-FAILURE_CHARS:]
    return failed


def skip_reasons(suite: ET.Element) -> dict[str, int]:
    """How many tests skipped for each reason: a GPU test that skips on the card it was meant for checks nothing."""
    reasons: dict[str, int] = {}
    for case in suite.iter("testcase"):
        skipped = case.find("skipped")
        if skipped is not None:
            reason = skipped.get("message", "")
            reasons[reason] = reasons.get(reason, 0) + 1
    return reasons


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=8,
                        help="most pytest-xdist workers (default 8; fewer where the card's free memory holds fewer)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results", help="folder for the JSON")
    parser.add_argument("--no-launch-fit", action="store_true", help="skip the ahead-of-time fit check")
    parser.add_argument("--files", nargs="+", metavar="TEST_FILE",
                        help="only these of the GPU test files (a tier in two calls, each under a command's limit)")
    parser.add_argument("--exclude", nargs="+", default=[], metavar="TEST_FILE", help="leave these test files out")
    parser.add_argument("pytest_args", nargs="*", help="extra pytest arguments (e.g. -k decode)")
    args = parser.parse_args(argv)

    files = [f for f in gpu_test_files() if (args.files is None or f in args.files) and f not in args.exclude]
    unknown = (set(args.files or ()) | set(args.exclude)) - set(gpu_test_files())
    if unknown:
        sys.exit(f"not GPU test files: {sorted(unknown)}; they are {gpu_test_files()}")

    import torch
    import triton

    if not torch.cuda.is_available():
        sys.exit("make test-gpu needs a CUDA GPU; on a CPU machine run `make test`")
    start = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        fits = [] if args.no_launch_fit else start_launch_fit(tmp)
        free_gib = torch.cuda.mem_get_info()[0] / 2**30
        phases = [(f"({MARKERS}) and not {BIG} and not {HUGE}", workers_for(free_gib, WORKER_GIB, args.workers)),
                  (f"gpu and {BIG} and not {HUGE} and not sweep", workers_for(free_gib, BIG_WORKER_GIB, args.workers)),
                  (f"gpu and {HUGE} and not sweep", 1)]
        code, counts, failed, skips = 0, [0, 0, 0, 0], {}, {}  # tests, failures, errors, skipped
        for i, (markers, n_workers) in enumerate(phases):
            print(f"pytest -m '{markers}' on {n_workers} worker(s) ({free_gib:.0f} GiB free)", flush=True)
            junit = tmp / f"junit-{i}.xml"
            workers = ["-n", str(n_workers)] if n_workers > 1 else []
            code |= subprocess.call([sys.executable, "-m", "pytest", "-m", markers, "-q", "-p",
                                     "no:cacheprovider", *workers, "--junitxml", str(junit), "--durations=15",
                                     *files, *args.pytest_args], cwd=ROOT, env=_env()) not in (0, 5)
            suite = ET.parse(junit).getroot()
            suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
            counts = [n + int(suite.get(k, 0)) for n, k in zip(counts, ("tests", "failures", "errors", "skipped"),
                                                                 strict=True)]
            failed |= failed_tests(suite)
            for reason, n in skip_reasons(suite).items():
                skips[reason] = skips.get(reason, 0) + n
        total, failures, errors, skipped = counts
        fit = finish_launch_fit(fits) if fits else None
    seconds = round(time.time() - start, 1)
    device = torch.cuda.get_device_name()
    summary = {"passed": total - failures - errors - skipped, "failed": failures + errors, "skipped": skipped,
               "seconds": seconds, "workers": [n for _, n in phases], "failed_tests": sorted(failed),
               "failures": failed, "skip_reasons": skips}
    meta = {"date": datetime.date.today().isoformat(), "device": device, "torch": torch.__version__,
            "triton": triton.__version__, "gpus": torch.cuda.device_count()}
    result = {"meta": meta, "summary": summary}
    if args.files or args.exclude:
        result["files"] = files
    if fit is not None:
        result["launch_fit"] = fit
    args.out.mkdir(parents=True, exist_ok=True)
    slug = "".join(c if c.isalnum() else "-" for c in device).strip("-").lower()  # as bench names its files
    path = args.out / f"{meta['date']}-{slug}-gpu-tests.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    for test, report in failed.items():
        print(f"FAILED {test}\n{report}\n", flush=True)
    print({k: v for k, v in summary.items() if k != "failures"}, f"launch fit: {fit}\nwrote {path}")
    fit_ok = fit is None or (fit["do_not_fit"] == 0 and not fit["failed_runs"])
    return 0 if not code and fit_ok else 1


if __name__ == "__main__":
    sys.exit(main())
