"""Launch-config sweep of the forward (v7) and of every backward dQ scheme (b1, b2, b4, b5), against cuDNN in
the same run: the data behind the configs in kernels/configs.py and the backward versions' verdicts.

    PYTHONPATH=src python benchmarks/sweep_kernels.py --out DIR                            (a CUDA GPU)
    PYTHONPATH=src python benchmarks/sweep_kernels.py --kernels bwd --budget 300 --out DIR    (the backward only)
    PYTHONPATH=src python benchmarks/sweep_kernels.py --kernels fwd --head-dims 256 --out DIR  (D = 256's forward)

Time on an H200, estimated from the run of 2026-11-30 (about 5 minutes for 11 backward launches a shape, before
b1 and b2 ran at every launch): about 8 minutes in all, 5-6 with ``--kernels bwd``; most of it is compiling, one
kernel per (head dim, causal, launch).

Every backward scheme is timed at the same dK/dV launches (``DKDV_CONFIGS``: tile shape, warps, stages), so two
schemes compare at equal launches, not one tuned against one not: b2, b4 and b5 add dQ inside the dK/dV kernel and
use only that launch; b1 runs its dQ kernel at the mirror of it (the tile transposed, the same warps and stages),
and once more at its default launch (the course's choice, and the reference for the gradients).

Writes DIR/<date>-<device>-sweep.json: one row per (shape, kernel, version, config) with the median time of
three repeats (`bench.time_repeats`), its min-max, TFLOP/s and the ratio to cuDNN's median on the same shape;
backward rows also carry the largest difference of their gradients from b1's at its default launch (a wrong
kernel shows there), and b1's rows their dQ launch. ``--budget`` stops before a shape that would start past it;
the meta then says which shapes ran (``complete`` false).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from flashcourse.bench.attention import Shape
from flashcourse.kernels.configs import KernelConfig

SHAPES = [Shape("float16", 4, 16, 128, n, c) for n in (4096, 16384) for c in (False, True)] + \
         [Shape("float16", 4, 32, 64, 8192, c) for c in (False, True)] + \
         [Shape("float16", 4, 16, 256, 8192, c) for c in (False, True)]  # the forward only (no DKDV_CONFIGS)
FORWARD_CONFIGS = {128: [KernelConfig(128, 128, 8, 3), KernelConfig(128, 64, 8, 3), KernelConfig(128, 128, 8, 2),
                         KernelConfig(64, 64, 4, 3), KernelConfig(128, 64, 4, 3)],
                   64: [KernelConfig(128, 64, 8, 3), KernelConfig(128, 128, 8, 3), KernelConfig(128, 64, 4, 3)],
                   # D = 256 ran at 0.79x (non-causal) and 0.84x (causal) cuDNN's forward on 2026-12-02 (variants)
                   256: [KernelConfig(128, 64, 8, 2), KernelConfig(64, 64, 4, 2), KernelConfig(128, 32, 8, 3),
                         KernelConfig(128, 64, 8, 1), KernelConfig(64, 64, 8, 2), KernelConfig(64, 32, 4, 3),
                         KernelConfig(128, 128, 8, 1)]}
# The dK/dV launches every backward scheme is timed at. b2, b4 and b5 add dQ inside the dK/dV kernel, so it holds a
# dQ tile too. Each BLOCK_N is a multiple of BLOCK_M, as the causal dK/dV kernel needs (and then the mirrored dQ
# launch of b1 has BLOCK_M a multiple of BLOCK_N, as the causal dQ kernel needs).
DKDV_CONFIGS = {128: [KernelConfig(64, 128, 8, 2), KernelConfig(32, 128, 8, 2), KernelConfig(32, 64, 4, 3),
                      KernelConfig(64, 64, 4, 2)],
                64: [KernelConfig(32, 128, 4, 2), KernelConfig(64, 128, 8, 2), KernelConfig(32, 64, 4, 3),
                     KernelConfig(64, 64, 4, 3)]}
SCHEMES = ("b1", "b2", "b4", "b5")
KERNELS = ("fwd", "bwd")


def backward_launches(scheme: str, head_dim: int) -> list[tuple[KernelConfig, KernelConfig] | None]:
    """The (dK/dV, dQ) launches a scheme is timed at: every one of ``DKDV_CONFIGS`` (the dQ launch mirrored for
    b1, unused by the others), and for b1 also None, its default launch."""
    pairs = [(cfg, KernelConfig(cfg.block_n, cfg.block_m, cfg.num_warps, cfg.num_stages))
             for cfg in DKDV_CONFIGS[head_dim]]
    return [None, *pairs] if scheme == "b1" else pairs


def plan(kernels: tuple[str, ...], schemes: tuple[str, ...], quick: bool, head_dims: tuple[int, ...] | None = None
         ) -> list[tuple[Shape, str, str, object]]:
    """Every timing the run makes, in order: (shape, kernel, version, launch), launch a KernelConfig for the
    forward and a ``backward_launches`` entry for the backward. ``quick``: the first shape of each head dim;
    ``head_dims``: only shapes of these head dims (None: all)."""
    shapes = [s for i, s in enumerate(SHAPES) if not quick or s.head_dim not in {t.head_dim for t in SHAPES[:i]}]
    shapes = [s for s in shapes if head_dims is None or s.head_dim in head_dims]
    jobs = []
    for shape in shapes:
        if "fwd" in kernels:
            jobs += [(shape, "fwd", "v7", cfg) for cfg in FORWARD_CONFIGS[shape.head_dim]]
        if "bwd" in kernels and shape.head_dim in DKDV_CONFIGS:
            jobs += [(shape, "bwd", scheme, pair) for scheme in schemes
                     for pair in backward_launches(scheme, shape.head_dim)]
    return jobs


def sweep_shape(shape: Shape, jobs: list, log) -> list[dict]:
    import torch

    from flashcourse import kernels
    from flashcourse.bench import tflops, time_repeats
    from flashcourse.bench.attention import make_inputs
    from flashcourse.bench.providers import sdpa
    from flashcourse.kernels.backward import run_backward
    from flashcourse.kernels.forward import run_forward

    q, k, v, do = make_inputs(shape, requires_grad=False)
    base = {**shape.__dict__}
    rows = []

    def record(kernel, version, cfg, fn, mode, reference_ms, **extra):
        try:
            timing = time_repeats(fn)
        except Exception as err:  # noqa: BLE001 - a launch that fails to compile is a result too
            rows.append({**base, "kernel": kernel, "version": version, "config": cfg and cfg.__dict__,
                         "error": str(err)[:200], **extra})
            log(f"  {kernel} {version} {cfg}: {str(err)[:120]}")
            return
        row = {**base, "kernel": kernel, "version": version, "config": cfg and cfg.__dict__,
               **timing.fields(shape.flops(mode)),
               "ratio_vs_sdpa_cudnn": reference_ms / timing.ms if reference_ms else None, **extra}
        rows.append(row)
        log(f"  {kernel} {version} {cfg}: {row['tflops']:.0f} TFLOP/s ({timing.ms_min:.3f}-{timing.ms_max:.3f} ms)"
            + (f" {reference_ms / timing.ms:.2f}x cuDNN" if reference_ms else ""))

    cudnn = sdpa("sdpa_cudnn")
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out = cudnn(*leaves, shape.causal)
    cudnn_fwd = time_repeats(lambda: cudnn(q, k, v, shape.causal)).ms
    cudnn_bwd = time_repeats(lambda: torch.autograd.grad(out, leaves, do, retain_graph=True)).ms
    rows.append({**base, "kernel": "fwd", "version": "sdpa_cudnn", "ms": cudnn_fwd,
                 "tflops": tflops(shape.flops("fwd"), cudnn_fwd * 1e-3)})
    rows.append({**base, "kernel": "bwd", "version": "sdpa_cudnn", "ms": cudnn_bwd,
                 "tflops": tflops(shape.flops("bwd"), cudnn_bwd * 1e-3)})
    log(f"{shape}: cuDNN fwd {rows[-2]['tflops']:.0f}, bwd {rows[-1]['tflops']:.0f} TFLOP/s")

    v7 = kernels.FORWARD_VERSIONS["v7"]
    for _, kernel, _, cfg in jobs:
        if kernel == "fwd":
            record("fwd", "v7", cfg, lambda cfg=cfg: run_forward(v7, q, k, v, causal=shape.causal, scale=None,
                                                                  config=cfg), "fwd", cudnn_fwd)
    backward_jobs = [(version, pair) for _, kernel, version, pair in jobs if kernel == "bwd"]
    if not backward_jobs:
        return rows
    o, lse = run_forward(v7, q, k, v, causal=shape.causal, scale=None)
    reference = run_backward(kernels.BACKWARD_VERSIONS["b1"], q, k, v, o, lse, do, causal=shape.causal,
                             scale=None)

    def backward(version, pair):
        return lambda: run_backward(version, q, k, v, o, lse, do, causal=shape.causal, scale=None,
                                    configs_override=pair)

    def difference(version, pair):
        got = backward(version, pair)()
        return max(float((g.float() - r.float()).abs().max() / r.float().abs().max().clamp_min(1e-6))
                   for g, r in zip(got, reference, strict=True))

    for name, pair in backward_jobs:
        version = kernels.BACKWARD_VERSIONS[name]
        cfg = pair and pair[0]
        extra = {"dq_config": pair[1].__dict__} if name == "b1" and pair else {}
        try:  # the first call compiles, and checks the gradients against b1's at its default launch
            diff = difference(version, pair)
        except Exception as err:  # noqa: BLE001 - recorded as the row's error
            rows.append({**base, "kernel": "bwd", "version": name, "config": cfg and cfg.__dict__,
                         "error": str(err)[:200], **extra})
            log(f"  bwd {name} {cfg}: {str(err)[:120]}")
            continue
        record("bwd", name, cfg, backward(version, pair), "bwd", cudnn_bwd, max_rel_diff_vs_b1=diff, **extra)
    return rows


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="folder for the JSON (default benchmarks/results)")
    parser.add_argument("--kernels", default=",".join(KERNELS),
                        help="comma-separated: fwd (v7's launches), bwd (the dQ schemes); default both")
    parser.add_argument("--schemes", default=",".join(SCHEMES), help="backward schemes, comma-separated")
    parser.add_argument("--quick", action="store_true", help="one shape per head dim (a check that it runs)")
    parser.add_argument("--head-dims", type=lambda text: tuple(int(d) for d in text.split(",")), default=None,
                        help="comma-separated head dims to sweep (default: every shape's)")
    parser.add_argument("--budget", type=float, default=None,
                        help="seconds: start no shape after this many (the JSON says which ran)")
    parser.add_argument("--list", action="store_true", help="print every timing the run would make, run none")
    args = parser.parse_args(argv)
    args.kernels = tuple(dict.fromkeys(k.strip() for k in args.kernels.split(",") if k.strip()))
    args.schemes = tuple(dict.fromkeys(s.strip() for s in args.schemes.split(",") if s.strip()))
    for name, given, allowed in (("--kernels", args.kernels, KERNELS), ("--schemes", args.schemes, SCHEMES)):
        wrong = [x for x in given if x not in allowed]
        if wrong or not given:
            parser.error(f"{name} {','.join(given) or '(empty)'}: expected a comma-separated subset of "
                         f"{','.join(allowed)}")
    if args.budget is not None and args.budget <= 0:
        parser.error(f"--budget {args.budget}: a positive number of seconds is expected")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    jobs = plan(args.kernels, args.schemes, args.quick, args.head_dims)
    if args.list:
        for shape, kernel, version, launch in jobs:
            print(f"{shape.head_dim} {shape.n} causal={shape.causal} {kernel} {version} {launch}")
        return
    from flashcourse.bench import environment_info, save_results

    started, rows, done = time.monotonic(), [], []
    shapes = list(dict.fromkeys(job[0] for job in jobs))
    for shape in shapes:
        if args.budget is not None and time.monotonic() - started > args.budget:
            print(f"budget of {args.budget:.0f} s spent: {shape} and the rest not run")
            break
        rows += sweep_shape(shape, [job for job in jobs if job[0] == shape], print)
        done.append(shape.__dict__)
    meta = {**environment_info(), "kernels": list(args.kernels), "schemes": list(args.schemes),
            "shapes_run": done, "complete": len(done) == len(shapes),
            "seconds": round(time.monotonic() - started, 1)}
    print(f"wrote {save_results('sweep', rows, directory=args.out, meta=meta)}")


if __name__ == "__main__":
    main()
