"""Launch-config sweep of the forward (v7) and of every backward dQ scheme (b1, b2, b4, b5), against cuDNN in
the same run: the data behind the configs in kernels/configs.py and the backward versions' verdicts.

    PYTHONPATH=src python scripts/sweep_kernels.py --out DIR        (a CUDA GPU; about 5 minutes on an H200)

Writes DIR/<date>-<device>-sweep.json: one row per (shape, kernel, version, config) with the median time of
three repeats (`bench.time_repeats`), its min-max, TFLOP/s and the ratio to cuDNN's median on the same shape;
backward rows also carry the largest difference of their gradients from b1's at its default launch (a wrong
kernel shows there).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from flashcourse import kernels
from flashcourse.bench import save_results, tflops, time_repeats
from flashcourse.bench.attention import Shape, make_inputs
from flashcourse.bench.providers import sdpa
from flashcourse.kernels.backward import run_backward
from flashcourse.kernels.configs import KernelConfig
from flashcourse.kernels.forward import run_forward

SHAPES = [Shape("float16", 4, 16, 128, n, c) for n in (4096, 16384) for c in (False, True)] + \
         [Shape("float16", 4, 32, 64, 8192, c) for c in (False, True)]
FORWARD_CONFIGS = {128: [KernelConfig(128, 128, 8, 3), KernelConfig(128, 64, 8, 3), KernelConfig(128, 128, 8, 2),
                         KernelConfig(64, 64, 4, 3), KernelConfig(128, 64, 4, 3)],
                   64: [KernelConfig(128, 64, 8, 3), KernelConfig(128, 128, 8, 3), KernelConfig(128, 64, 4, 3)]}
# dK/dV launches for the schemes that add dQ inside that kernel (b2, b4, b5): it now holds a dQ tile too.
DKDV_CONFIGS = {128: [KernelConfig(64, 128, 8, 2), KernelConfig(32, 128, 8, 2), KernelConfig(32, 64, 4, 3),
                      KernelConfig(64, 64, 4, 2)],
                64: [KernelConfig(32, 128, 4, 2), KernelConfig(64, 128, 8, 2), KernelConfig(32, 64, 4, 3),
                     KernelConfig(64, 64, 4, 3)]}
def sweep_shape(shape: Shape, log) -> list[dict]:
    q, k, v, do = make_inputs(shape, requires_grad=False)
    base = {**shape.__dict__}
    rows = []

    def record(kernel, version, cfg, fn, mode, reference_ms, **extra):
        try:
            timing = time_repeats(fn)
        except Exception as err:  # noqa: BLE001 - a launch that fails to compile is a result too
            rows.append({**base, "kernel": kernel, "version": version, "config": cfg and cfg.__dict__,
                         "error": str(err)[:200]})
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
    for cfg in FORWARD_CONFIGS[shape.head_dim]:
        record("fwd", "v7", cfg, lambda cfg=cfg: run_forward(v7, q, k, v, causal=shape.causal, scale=None,
                                                              config=cfg), "fwd", cudnn_fwd)
    o, lse = run_forward(v7, q, k, v, causal=shape.causal, scale=None)
    b1 = kernels.BACKWARD_VERSIONS["b1"]
    reference = run_backward(b1, q, k, v, o, lse, do, causal=shape.causal, scale=None)

    def backward(version, pair):
        return lambda: run_backward(version, q, k, v, o, lse, do, causal=shape.causal, scale=None,
                                    configs_override=pair)

    def difference(version, pair):
        got = backward(version, pair)()
        return max(float((g.float() - r.float()).abs().max() / r.float().abs().max().clamp_min(1e-6))
                   for g, r in zip(got, reference, strict=True))

    record("bwd", "b1", None, backward(b1, None), "bwd", cudnn_bwd)
    for name in ("b2", "b4", "b5"):
        version = kernels.BACKWARD_VERSIONS[name]
        candidates = DKDV_CONFIGS[shape.head_dim][:1] if name == "b2" else DKDV_CONFIGS[shape.head_dim]
        for cfg in candidates:
            pair = (cfg, KernelConfig(cfg.block_n, cfg.block_m, 4, 1))  # the dQ launch is unused by these
            try:
                diff = difference(version, pair)
            except Exception as err:  # noqa: BLE001 - recorded as the row's error below
                rows.append({**base, "kernel": "bwd", "version": name, "config": cfg.__dict__,
                             "error": str(err)[:200]})
                log(f"  bwd {name} {cfg}: {str(err)[:120]}")
                continue
            record("bwd", name, cfg, backward(version, pair), "bwd", cudnn_bwd, max_rel_diff_vs_b1=diff)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    rows = []
    for shape in SHAPES:
        rows += sweep_shape(shape, print)
    print(f"wrote {save_results('sweep', rows, directory=args.out)}")


if __name__ == "__main__":
    main()
