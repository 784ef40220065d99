"""Each backward kernel's launch alone: b1's dQ and dK/dV kernels (dense, causal or not) and b3's (a prefix-LM
``mask_mod`` through a block mask built once; a causal 1024-key window; GQA 32/8, causal), every candidate launch of
one kernel timed with the other kernel at its default, against cuDNN's backward in the same run (dense cases).

    PYTHONPATH=src python benchmarks/sweep_backward_launches.py --out DIR             (a CUDA GPU; about 6 minutes)
    PYTHONPATH=src python benchmarks/sweep_backward_launches.py --head-dims 256 --out DIR  (D = 256's cases only)
    PYTHONPATH=src python benchmarks/sweep_backward_launches.py --rules "window 1024,GQA 32/8" --out DIR  (those only)
    PYTHONPATH=src python benchmarks/sweep_backward_launches.py --list                (the timings it would make)

Why: Nsight Compute on the H200 (2026-12-02, ``*-ncu-limits.json``, D = 128, N = 8192) showed both dQ kernels
spilling registers at their default launch, 128 query rows over 4 warps: b1's dQ read 587 MB of local memory in
5.1 ms, b3's 16 GB in 4.9 ms (its tensor pipe 38% busy against b1's 73%). The older sweep (``sweep_kernels.py
--kernels bwd``) moved both kernels together, the dQ launch mirrored from the dK/dV one; here each moves alone,
so a gain is the kernel's own. The backward's time is the sum of its kernels', so the best dK/dV launch and the
best dQ launch found apart make the best pair. The window and GQA cases are the two variants whose backward still
trailed FlexAttention in the variants run of 07d21a8 (0.91-0.93x and 0.96-0.97x, ``*-variants.json``); Nsight
Compute found the window's dK/dV kernel the least busy of its three (``*-ncu-variant-gaps.json``).

Writes DIR/<date>-<device>-backward-launches.json: one row per (shape, scheme, varied kernel, launch) with the
median time of three repeats and its spread (``bench.time_repeats``), TFLOP/s, the ratio to cuDNN's backward on
dense shapes, and the largest relative difference of the gradients from the default launch's (a launch that
computes something else shows there). ``--budget`` stops before a shape that would start past it.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from pathlib import Path

import triton
import triton.language as tl  # noqa: F401 - the jit rule below is compiled with Triton's language in scope

from flashcourse.kernels.configs import KernelConfig

PREFIX_KEYS = 1024


@triton.jit
def prefix_lm(b, h, q_idx, kv_idx):
    """A prompt of 1024 keys seen by every query, the rest causal (PREFIX_KEYS)."""
    return (kv_idx <= q_idx) | (kv_idx < 1024)


@dataclass(frozen=True)
class Case:
    """One shape and the backward scheme timed on it: b1 (dense, ``causal``) or b3 under a named rule (with
    ``window`` keys to the left, or ``heads_kv`` K/V heads under ``heads`` query heads)."""

    scheme: str
    head_dim: int
    heads: int
    causal: bool
    rule: str | None = None
    batch: int = 4
    n: int = 8192
    dtype: str = "float16"
    window: int | None = None
    heads_kv: int | None = None


CASES = (
    Case("b1", 128, 16, False),
    Case("b1", 128, 16, True),
    Case("b3", 128, 16, False, rule="prefix-LM"),
    Case("b1", 64, 32, False),
    Case("b1", 64, 32, True),
    # D = 256: the backward ran at 0.41x cuDNN's on 2026-12-02 (2026-12-02-nvidia-h200-variants-07d21a8.json)
    Case("b1", 256, 16, False),
    Case("b1", 256, 16, True),
    Case("b3", 128, 16, True, rule="window 1024", window=1024),
    Case("b3", 128, 32, True, rule="GQA 32/8", heads_kv=8),
)
# (BLOCK_M, BLOCK_N, warps, stages). The dQ kernel keeps BLOCK_M query rows and streams keys, the dK/dV kernel
# the mirror; causal needs dQ's BLOCK_M a multiple of its BLOCK_N and dK/dV's BLOCK_N a multiple of its BLOCK_M.
DQ_LAUNCHES = {
    128: (KernelConfig(128, 32, 4, 3), KernelConfig(128, 32, 8, 3), KernelConfig(128, 64, 8, 2),
          KernelConfig(64, 64, 4, 2), KernelConfig(64, 32, 4, 3), KernelConfig(128, 128, 8, 2)),
    64: (KernelConfig(128, 32, 4, 3), KernelConfig(64, 64, 4, 3), KernelConfig(128, 64, 4, 3),
         KernelConfig(64, 32, 4, 3), KernelConfig(128, 128, 8, 2)),
    256: (KernelConfig(64, 32, 8, 1), KernelConfig(32, 32, 4, 2), KernelConfig(64, 16, 4, 2),
          KernelConfig(128, 32, 8, 1), KernelConfig(64, 64, 8, 1), KernelConfig(32, 16, 4, 3)),
}
DKDV_LAUNCHES = {  # at D = 128, 64 x 64 over 8 warps: half the default's accumulator registers a thread, whose
    # dK/dV kernel spilled under a window (Nsight Compute, 2026-12-02-nvidia-h200-ncu-variant-gaps.json); it took
    # 3.60 ms there against the default's 2.38 (2026-12-03-nvidia-h200-backward-launches-window.json)
    128: (KernelConfig(64, 128, 8, 2), KernelConfig(64, 128, 8, 3), KernelConfig(32, 64, 4, 3),
          KernelConfig(64, 64, 4, 3), KernelConfig(64, 64, 8, 2)),
    64: (KernelConfig(32, 128, 4, 2), KernelConfig(32, 64, 4, 3), KernelConfig(64, 128, 8, 2),
         KernelConfig(64, 64, 4, 3), KernelConfig(64, 128, 4, 2)),
    256: (KernelConfig(32, 64, 8, 1), KernelConfig(32, 32, 4, 2), KernelConfig(16, 64, 4, 2),
          KernelConfig(32, 128, 8, 1), KernelConfig(64, 64, 8, 1), KernelConfig(16, 32, 4, 3)),
}
DEVICE = "cuda"  # the CPU test runs a tiny case through Triton's interpreter
BLOCK_SIZE = 32  # the b3 case's block mask: sparse blocks that divide every tile above, so its lists are exact


def plan(cases=CASES, head_dims: tuple[int, ...] | None = None, rules: tuple[str, ...] | None = None
         ) -> list[tuple[Case, str, KernelConfig | None]]:
    """Every timing, in order: (case, varied kernel, launch); launch None is the default pair. ``head_dims``,
    ``rules``: only the cases of these head dims, of these rules (None: all)."""
    jobs = []
    for case in cases:
        if head_dims is not None and case.head_dim not in head_dims:
            continue
        if rules is not None and case.rule not in rules:
            continue
        jobs.append((case, "default", None))
        jobs += [(case, "dq", cfg) for cfg in DQ_LAUNCHES[case.head_dim]]
        jobs += [(case, "dkdv", cfg) for cfg in DKDV_LAUNCHES[case.head_dim]]
    return jobs


def visible_in_window(n: int, window: int) -> int:
    """(query, key) pairs a causal window shows over n queries, when query i sees keys i - window .. i: the first
    window rows see fewer."""
    return window * (window + 1) // 2 + (n - window) * (window + 1)


def sweep_case(case: Case, jobs: list, log) -> list[dict]:
    import torch

    from flashcourse import kernels
    from flashcourse.bench import time_repeats
    from flashcourse.bench.attention import Shape
    from flashcourse.bench.providers import sdpa
    from flashcourse.kernels import configs
    from flashcourse.kernels.backward import launch_candidates, run_backward
    from flashcourse.kernels.forward import run_forward
    from flashcourse.kernels.rules import causal_rules, parse_rules

    shape = Shape(case.dtype, case.batch, case.heads, case.head_dim, case.n, case.causal)
    torch.manual_seed(0)
    heads_kv = case.heads_kv or case.heads
    q, k, v, do = (torch.randn(case.batch, heads, case.n, case.head_dim, device=DEVICE,
                               dtype=getattr(torch, case.dtype))
                   for heads in (case.heads, heads_kv, heads_kv, case.heads))
    base = {**shape.__dict__, "scheme": case.scheme, "rule": case.rule, "heads_kv": heads_kv}
    if case.rule is None or case.heads_kv:  # GQA: the causal rule; k and v's fewer heads say the rest
        rules, block_mask, flops = causal_rules(case.causal), None, shape.flops("bwd")
    elif case.window:
        rules, block_mask = parse_rules(q, k, causal=case.causal, window=(case.window, 0)), None
        visible = visible_in_window(case.n, case.window)
        dense = Shape(case.dtype, case.batch, case.heads, case.head_dim, case.n, False)
        flops = dense.flops("bwd") * visible / case.n ** 2
    else:
        rules = parse_rules(q, k, mask_mod=prefix_lm)
        block_mask = kernels.create_block_mask(prefix_lm, None, None, case.n, case.n, BLOCK_SIZE=BLOCK_SIZE,
                                               device=q.device)
        # prefix-LM sees the causal triangle plus, in the prompt's rows, the prompt's keys past the diagonal
        visible = case.n * (case.n + 1) // 2 + PREFIX_KEYS * (PREFIX_KEYS - 1) // 2
        dense = Shape(case.dtype, case.batch, case.heads, case.head_dim, case.n, False)
        flops = dense.flops("bwd") * visible / case.n ** 2
    version = kernels.BACKWARD_VERSIONS[case.scheme]
    forward = kernels.FORWARD_VERSIONS["v7"]
    o, lse = run_forward(forward, q, k, v, scale=None, rules=rules, block_mask=block_mask)
    props = configs.device_props(q.device)
    default_dkdv, default_dq = (c[0] for c in launch_candidates(props, q.shape[-1], q.element_size(), rules,
                                                                grouped=k.shape[1] != q.shape[1]))

    def backward(pair):
        return lambda: run_backward(version, q, k, v, o, lse, do, scale=None, rules=rules, block_mask=block_mask,
                                    configs_override=pair)

    rows = []
    reference_ms = None
    if case.rule is None and q.is_cuda:  # cuDNN is the yardstick on dense shapes on a GPU (not on the CPU test)
        cudnn = sdpa("sdpa_cudnn")
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        out = cudnn(*leaves, case.causal)
        timing = time_repeats(lambda: torch.autograd.grad(out, leaves, do, retain_graph=True))
        reference_ms = timing.ms
        rows.append({**base, "scheme": "sdpa_cudnn", "varied": None, **timing.fields(flops)})
        log(f"{shape}: cuDNN backward {rows[-1]['tflops']:.0f} TFLOP/s")
    reference = backward(None)()

    for _, varied, cfg in jobs:
        pair = None if cfg is None else (cfg, default_dq) if varied == "dkdv" else (default_dkdv, cfg)
        used = pair or (default_dkdv, default_dq)
        launch = {"varied": varied, "dkdv_config": used[0].__dict__, "dq_config": used[1].__dict__}
        try:  # the first call compiles and gives the gradients to compare
            got = backward(pair)()
            diff = max(float((g.float() - r.float()).abs().max() / r.float().abs().max().clamp_min(1e-6))
                       for g, r in zip(got, reference, strict=True))
            timing = time_repeats(backward(pair))
        except Exception as err:  # noqa: BLE001 - a launch that does not compile or fit is a result too
            rows.append({**base, **launch, "error": str(err)[:200]})
            log(f"  {case.scheme} {varied} {cfg}: {str(err)[:120]}")
            continue
        row = {**base, **launch, **timing.fields(flops), "max_rel_diff_vs_default": diff,
               "ratio_vs_sdpa_cudnn": reference_ms / timing.ms if reference_ms else None}
        rows.append(row)
        log(f"  {case.scheme} {varied} {cfg}: {timing.ms:.3f} ms ({timing.ms_min:.3f}-{timing.ms_max:.3f}), "
            f"{row['tflops']:.0f} TFLOP/s" + (f", {row['ratio_vs_sdpa_cudnn']:.2f}x cuDNN" if reference_ms else "")
            + f", diff {diff:.1e}")
    return rows


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="folder for the JSON (default benchmarks/results)")
    parser.add_argument("--budget", type=float, default=None,
                        help="seconds: start no case after this many (the JSON says which ran)")
    parser.add_argument("--list", action="store_true", help="print every timing the run would make, run none")
    parser.add_argument("--head-dims", type=lambda text: tuple(int(d) for d in text.split(",")), default=None,
                        help="comma-separated head dims whose cases run (default: all)")
    parser.add_argument("--rules", type=lambda text: tuple(r.strip() for r in text.split(",")), default=None,
                        help="comma-separated rules whose cases run, e.g. 'window 1024,GQA 32/8' (default: all)")
    args = parser.parse_args(argv)
    if args.budget is not None and args.budget <= 0:
        parser.error(f"--budget {args.budget}: a positive number of seconds is expected")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    jobs = plan(head_dims=args.head_dims, rules=args.rules)
    if not jobs:
        raise SystemExit(f"no case has head dims {args.head_dims} and rules {args.rules}: the rules are "
                         f"{sorted({c.rule for c in CASES if c.rule})}")
    if args.list:
        for case, varied, cfg in jobs:
            print(f"{case.scheme} D={case.head_dim} causal={case.causal} rule={case.rule} {varied} {cfg}")
        return
    from flashcourse.bench import environment_info, save_results

    started, rows, done = time.monotonic(), [], []
    cases = list(dict.fromkeys(job[0] for job in jobs))
    for case in cases:
        if args.budget is not None and time.monotonic() - started > args.budget:
            print(f"budget of {args.budget:.0f} s spent: {case} and the rest not run")
            break
        rows += sweep_case(case, [job for job in jobs if job[0] == case], print)
        done.append(case.__dict__)
    meta = {**environment_info(), "cases_run": done, "complete": len(done) == len(cases),
            "block_size": BLOCK_SIZE, "seconds": round(time.monotonic() - started, 1)}
    print(f"wrote {save_results('backward-launches', rows, directory=args.out, meta=meta)}")


if __name__ == "__main__":
    main()
