"""Host time per call with and without the direct launch, on a GPU: what calling Triton's launcher directly saves.

Run from a checkout on a machine with a CUDA GPU: ``PYTHONPATH=src python scripts/direct_launch_ab.py [--rounds 2]``.
A prepared launch (``kernels/launch.py``) calls ``compiled.run`` itself where its Triton's runner was read
(``launch.DIRECT_LAUNCH_TRITON``) and no launch hook is installed; with that tuple empty it calls the runner that
``compiled[grid]`` returns, as before. This script times ``python -m flashcourse.bench overhead``'s calls (ours and
plain SDPA's, at its tiny shapes) both ways, in alternating rounds so that drift of the machine falls on both, with
every plan and launch cache cleared between them (a launch is prepared, and chooses its path, on a call's first
use). It prints microseconds per call (median of the repeats, and their range) and, per call of ours, the ratio to
plain SDPA and what the direct launch saved; ``--json PATH`` also writes the rows.
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

from flashcourse.bench import overhead
from flashcourse.kernels import decode, forward, launch, plan

READ = launch.DIRECT_LAUNCH_TRITON


def clear_prepared() -> None:
    """Forget every prepared launch, so the next call prepares its launches anew (and picks their path then)."""
    plan.PLANS.clear()
    decode._PLANS.clear()
    decode._LAUNCHES.clear()
    forward._LAUNCHES.clear()


def one_round(direct: bool, calls: int, repeats: int) -> dict[str, list[float]]:
    """{provider: microseconds per call in each repeat} with the direct launch on or off."""
    launch.DIRECT_LAUNCH_TRITON = READ if direct else ()
    clear_prepared()
    times = {}
    for name, fn in overhead.providers("cuda").items():
        with torch.set_grad_enabled(name in overhead.TRAINING):
            times[name] = overhead.us_per_call(fn, calls, repeats)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2, help="rounds of each way, alternating")
    parser.add_argument("--calls", type=int, default=overhead.CALLS)
    parser.add_argument("--repeats", type=int, default=overhead.REPEATS)
    parser.add_argument("--json", metavar="PATH", help="also write the rows here")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU: the direct launch exists only for compiled kernels")
    import triton

    print(f"torch {torch.__version__}, Triton {triton.__version__}, {torch.cuda.get_device_name()}; "
          f"direct launch read for Triton {', '.join(READ)}")
    pooled: dict[tuple[str, str], list[float]] = {}
    for _ in range(args.rounds):
        for direct in (True, False):
            for name, times in one_round(direct, args.calls, args.repeats).items():
                pooled.setdefault((name, "direct" if direct else "runner"), []).extend(times)
    launch.DIRECT_LAUNCH_TRITON = READ
    clear_prepared()
    rows = []
    for (name, way), times in sorted(pooled.items()):
        rows.append({"provider": name, "launch": way, "us_per_call": statistics.median(times), "us_min": min(times),
                     "us_max": max(times), "calls": args.calls, "repeats": len(times)})
        print(f"{name:24} {way:7} {rows[-1]['us_per_call']:7.1f} us per call ({min(times):.1f}-{max(times):.1f})")
    median = {(r["provider"], r["launch"]): r["us_per_call"] for r in rows}
    for ours, sdpa in overhead.PAIRS:
        theirs = statistics.median(pooled[sdpa, "direct"] + pooled[sdpa, "runner"])
        print(f"{ours:24} direct {median[ours, 'direct'] / theirs:.2f}x plain SDPA, runner "
              f"{median[ours, 'runner'] / theirs:.2f}x; the direct launch saves "
              f"{median[ours, 'runner'] - median[ours, 'direct']:.1f} us per call")
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"meta": {"torch": torch.__version__, "triton": triton.__version__,
                                "device": torch.cuda.get_device_name(), "sdpa_call": "plain"}, "rows": rows},
                      out, indent=1)


if __name__ == "__main__":
    main()
