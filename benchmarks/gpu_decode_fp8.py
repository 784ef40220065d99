"""The FP8 KV cache's decode candidates (``flashcourse.bench.decode.CANDIDATES``) checked and timed against the
float16 cache's on one H100 / H200, in one command of under five minutes.

    PYTHONPATH=src python benchmarks/gpu_decode_fp8.py --out "$OUT"              # 32K and 128K keys, every candidate
    PYTHONPATH=src python benchmarks/gpu_decode_fp8.py --out /tmp/c --only shipped --lengths 32768

For each KV length (B = 1, 32 query heads, 8 KV heads, D = 128), the contiguous cache and the same cache in shuffled
pages of 16 and of 256 rows: every candidate is first checked against attention in float64 on the values its cache
holds (the FP8 cache dequantised), then all are timed in rounds as CUDA-graph replays over enough rotated caches
that the L2 holds none (``bench decode``'s method). Rows: ``bench.decode.candidates``; each FP8 row carries
``speedup_vs_fp16_cache`` (against the float16 cache's shipped launch at the same layout and length), the launch
that ran and what Triton compiled on this GPU (registers, spills, shared memory, programs an SM holds, splits). JSON:
``<out>/<date>-<device>-decode-fp8-candidates.json``, ``meta.kind = "decode-fp8-candidates"``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
os.environ.pop("TRITON_INTERPRET", None)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "."), help="folder for the JSON (default $OUT)")
    parser.add_argument("--lengths", type=int, nargs="+", default=[32768, 131072], help="KV lengths")
    parser.add_argument("--only", nargs="+", help="candidate names (the float16 references are always timed)")
    parser.add_argument("--rounds", type=int, default=3, help="timings of each candidate (median and range)")
    parser.add_argument("--budget", type=float, default=240, help="seconds after which no further round starts")
    args = parser.parse_args(argv)

    import torch

    from flashcourse.bench import decode as bench
    from flashcourse.bench import save_results

    if not torch.cuda.is_available():
        print("needs a CUDA GPU")
        return 1
    chosen = [c for c in bench.CANDIDATES if not args.only or c.name in args.only or c.kv_dtype == "float16"]
    start = time.monotonic()
    rows = bench.candidates(lengths=tuple(args.lengths), chosen=tuple(chosen), rounds=args.rounds,
                            budget_s=args.budget, log=lambda line: print(line, flush=True))
    print(bench.format_candidates(rows))
    path = save_results("decode-fp8-candidates", rows, directory=Path(args.out), kind="decode-fp8-candidates",
                        extra={"seconds": round(time.monotonic() - start, 1), "method": __doc__.split("\n\n")[2]})
    print(f"wrote {path} in {time.monotonic() - start:.0f} s")
    failed = [r for r in rows if r.get("status") != "ok"]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
