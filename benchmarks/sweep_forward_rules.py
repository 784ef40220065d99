"""Launch sweep of the forward (v7) under the rules of ``bench variants``, beside compiled FlexAttention's forward
in the same run: the data behind which rules take the small-tile forward launch.

    PYTHONPATH=src python benchmarks/sweep_forward_rules.py --out DIR                     (a CUDA GPU, ~3 minutes)
    PYTHONPATH=src python benchmarks/sweep_forward_rules.py --variants "mask_mod: chunked local" --out DIR

Why: in the variants run (2026-12-02-nvidia-h200-variants.json, D = 128, N = 16384) our forward trailed
FlexAttention on two rules only, 8 causal documents (0.96x) and chunked local attention (0.86x). Both show each
query a short run of keys (a 2,048-key document on average, a 1,024-key chunk) and both run at the dense launch
(128 x 128 tiles over 8 warps, one program an SM), while a 1,024-key window, at the launch for rules with many
partly masked tiles (64 x 64 over 4 warps), ran 1.15x FlexAttention. Nsight Compute found the chunked forward
waiting at barriers and for global memory more than Flex's (2026-12-02-nvidia-h200-ncu-variant-gaps.json): a
short loop gives a lone program little work to hide its loads behind.

Writes DIR/<date>-<device>-forward-launches.json: one row per (variant, launch), the launch None being the
default's, with the median time of three repeats and its range (``bench.time_repeats``), TFLOP/s over the
variant's visible entries, the ratio to FlexAttention's forward timed here, and the largest relative difference of
o from the default launch's (a launch that computes something else shows there). ``--budget`` stops before a
variant that would start past it.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from flashcourse.kernels.configs import KernelConfig

VARIANTS = ("mask_mod: chunked local", "8 documents, causal", "mask_mod: prefix-LM", "mask_mod: stripes",
            "window 1024", "causal")
# (BLOCK_M, BLOCK_N, warps, stages) at D = 128, 16-bit: the dense launch, the window's, and the steps between
LAUNCHES = (KernelConfig(128, 128, 8, 3), KernelConfig(128, 64, 8, 3), KernelConfig(128, 64, 4, 3),
            KernelConfig(64, 64, 4, 3), KernelConfig(64, 64, 4, 2), KernelConfig(64, 32, 4, 3))


def rules_of(variant, inputs):
    """The variant's options as the forward's Rules, exactly what ``flash_attention`` passes per call."""
    from flashcourse.bench import mask_rules
    from flashcourse.kernels.rules import parse_rules

    mask_mod = None if variant.mask_rule is None else mask_rules.triton_mask_mod(variant.mask_rule,
                                                                                 variant.mask_size)
    return parse_rules(inputs.q, inputs.k, causal=variant.causal, softcap=variant.softcap, mask_mod=mask_mod,
                       window=None if variant.window_left is None else (variant.window_left, 0),
                       document_ids=inputs.ids)


def sweep_variant(variant, dtype: str, launches, log, *, with_flex: bool = True) -> list[dict]:
    from flashcourse import bench, kernels
    from flashcourse.bench import variants as bench_variants
    from flashcourse.kernels.forward import run_forward

    inputs = bench_variants.make_inputs(variant, dtype)
    rules = rules_of(variant, inputs)
    flops = bench_variants.variant_flops(
        variant, bench_variants.visible_entries(variant, bench_variants.document_ids(variant)), "fwd")
    base = {"variant": variant.name, "dtype": dtype, "batch": variant.batch, "heads": variant.heads,
            "n": variant.n, "head_dim": variant.head_dim}
    rows, flex_ms = [], None
    if with_flex:
        bench_variants.allow_flex_recompiles()
        timing = bench_variants.time_modes(bench_variants.flex(variant, inputs), inputs, modes=("fwd",))["fwd"]
        flex_ms = timing.ms
        rows.append({**base, "provider": "flex", "config": None, **timing.fields(flops)})
        log(f"{variant.name} {dtype}: flex {rows[-1]['tflops']:.0f} TFLOP/s")
    version = kernels.FORWARD_VERSIONS["v7"]

    def forward(config):
        return lambda: run_forward(version, inputs.q, inputs.k, inputs.v, scale=None, config=config, rules=rules)

    reference = forward(None)()[0].float()
    for config in (None, *launches):
        launch = {"provider": "flashcourse", "config": None if config is None else config.__dict__}
        try:  # the first call compiles and gives the output to compare
            o = forward(config)()[0].float()
            diff = float((o - reference).abs().max() / reference.abs().max().clamp_min(1e-6))
            timing = bench.time_repeats(forward(config))
        except Exception as err:  # noqa: BLE001 - a launch that does not compile or fit is a result too
            rows.append({**base, **launch, "error": str(err)[:200]})
            log(f"  {config}: {str(err)[:120]}")
            continue
        row = {**base, **launch, **timing.fields(flops), "max_rel_diff_vs_default": diff,
               "ratio_vs_flex": flex_ms / timing.ms if flex_ms else None}
        rows.append(row)
        log(f"  {config or 'default'}: {timing.ms:.3f} ms ({timing.ms_min:.3f}-{timing.ms_max:.3f}), "
            f"{row['tflops']:.0f} TFLOP/s" + (f", {row['ratio_vs_flex']:.2f}x flex" if flex_ms else "")
            + f", diff {diff:.1e}")
    return rows


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="folder for the JSON (default benchmarks/results)")
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), metavar="NAME",
                        help=f"variants of bench variants to sweep (default: {', '.join(VARIANTS)})")
    parser.add_argument("--dtype", default="float16", choices=("float16", "bfloat16"))
    parser.add_argument("--budget", type=float, default=None,
                        help="seconds: start no variant after this many (the JSON says which ran)")
    args = parser.parse_args(argv)
    from flashcourse.bench.variants import VARIANTS as KNOWN

    unknown = sorted(set(args.variants) - {v.name for v in KNOWN})
    if unknown:
        parser.error(f"unknown variants {unknown}: the variants are {[v.name for v in KNOWN]}")
    if args.budget is not None and args.budget <= 0:
        parser.error(f"--budget {args.budget}: a positive number of seconds is expected")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    from flashcourse.bench import environment_info, save_results
    from flashcourse.bench.variants import VARIANTS as KNOWN

    chosen = [v for v in KNOWN if v.name in args.variants]
    started, rows, done = time.monotonic(), [], []
    for variant in chosen:
        if args.budget is not None and time.monotonic() - started > args.budget:
            print(f"budget of {args.budget:.0f} s spent: {variant.name} and the rest not run")
            break
        rows += sweep_variant(variant, args.dtype, LAUNCHES, print)
        done.append(variant.name)
    meta = {**environment_info(), "variants_run": done, "complete": len(done) == len(chosen),
            "seconds": round(time.monotonic() - started, 1)}
    print(f"wrote {save_results('forward-launches', rows, directory=args.out, meta=meta)}")


if __name__ == "__main__":
    main()
