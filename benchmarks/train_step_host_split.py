"""Where a training step's host time goes on a GPU: our step split into its pieces, beside plain SDPA's.

    PYTHONPATH=src python benchmarks/train_step_host_split.py [--out DIR]       # about 15 s on an H200

On the tiny inputs of ``python -m flashcourse.bench overhead`` (1, 16, 128, 64, fp16, causal), where the GPU waits for
the host, it times (three rounds of 1,000 calls, each round synchronised once; microseconds per call):

- the whole steps of ``bench overhead`` (``torch.autograd.grad`` through our ``flash_attention`` and through SDPA);
- our forward and SDPA's with inputs that require grad (the autograd graph is built, nothing runs backward);
- our backward alone, ``kernels.flash_attention_backward`` (no autograd engine);
- ``bare_function_step``: a step through a Python ``autograd.Function`` that launches nothing and only allocates its
  outputs: the floor that the autograd engine and a Python Function set for any step of ours;
- four ``torch.empty_like`` (a step's allocations).

Then ``torch.profiler`` (CPU activities) over 200 steps of each, whose table shows the autograd nodes' host time.
With ``--out``, the timings are also saved as ``<date>-<device>-train-step-host-split.json`` (one row per piece and
round: ``piece``, ``round``, ``us_per_call``).
The first run (H200, 2026-12-02, at 1a7bc36; its printed lines in ``2026-12-02-nvidia-h200-session3-log.txt``, as
numbers in ``2026-12-02-nvidia-h200-train-step-host-split.json``, which lesson 08 reads) found the bare Python
Function step alone at 106-164 us against SDPA's whole step at 150-212 us.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from flashcourse import kernels
from flashcourse.bench import overhead, save_results

ROUNDS = 3
CALLS = 1000
WARMUP = 100
PROFILED_STEPS = 200


class BareFunction(torch.autograd.Function):
    """A step's autograd bookkeeping with no kernel: saves its inputs, returns fresh tensors."""

    @staticmethod
    def forward(ctx, q, k, v):
        ctx.save_for_backward(q, k, v)
        return torch.empty_like(q)

    @staticmethod
    def backward(ctx, do):
        q, k, v = ctx.saved_tensors
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def pieces() -> dict:
    """Name -> a no-argument call."""
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(1, 16, 128, 64, device="cuda", dtype=torch.float16, generator=g, requires_grad=True)
               for _ in range(3))
    do = torch.randn(1, 16, 128, 64, device="cuda", dtype=torch.float16, generator=g)
    o, lse = kernels.flash_attention_forward(q.detach(), k.detach(), v.detach(), causal=True)
    calls = dict(overhead.providers())
    calls["ours_forward_grad"] = lambda: kernels.flash_attention(q, k, v, causal=True)
    calls["sdpa_forward_grad"] = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)
    calls["ours_backward_functional"] = lambda: kernels.flash_attention_backward(
        q.detach(), k.detach(), v.detach(), o, lse, do, causal=True)
    calls["bare_function_step"] = lambda: torch.autograd.grad(BareFunction.apply(q, k, v), (q, k, v), do)
    calls["empty_like_x4"] = lambda: [torch.empty_like(q) for _ in range(4)]
    print(kernels.explain(q, k, v, causal=True))
    return calls


def us_per_call(call) -> float:
    for _ in range(WARMUP):
        call()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(CALLS):
        call()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / CALLS * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="folder for the JSON (default: print only)")
    args = parser.parse_args()
    calls = pieces()
    rows = []
    for round_ in range(ROUNDS):
        for name, call in calls.items():
            rows.append({"piece": name, "round": round_, "us_per_call": us_per_call(call)})
            print(f"round {round_} {name:28s} {rows[-1]['us_per_call']:7.1f} us/call", flush=True)
    if args.out is not None:
        print("wrote", save_results("train-step-host-split", rows, directory=args.out, kind="train-step-host-split",
                                    extra={"calls": CALLS, "rounds": ROUNDS, "shape": [1, 16, 128, 64]}))
    for name in ("flashcourse_train_step", "sdpa_train_step"):
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(PROFILED_STEPS):
                calls[name]()
            torch.cuda.synchronize()
        print(f"=== {name}: torch.profiler, {PROFILED_STEPS} steps (CPU times)")
        print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=25, max_name_column_width=60))


if __name__ == "__main__":
    main()
