"""``python -m flashcourse.bench COMMAND``: the GPU benchmarks and the kernel history table.

    attention [--out DIR] [--dtype float16 bfloat16] [--n 1024 ...] [--head-config 32x64 ...]
              [--head-dim 64 128] [--causal both|yes|no] [--providers ...] [--quick] [--tag -fp16]
    decode    [--out DIR] [--tune]         one query token, GQA, KV 32K and 128K, vs SDPA and copy bandwidth
    versions  [--out DIR] [--n ...] [--head-dim ...] [--tag ...]   every numbered kernel version, validated then timed
    tune      [--out DIR] [--n ...]        sweep launch configs of the forward and backward kernels
    softmax-cost [--out DIR]               v6 timed exact, without rescaling, without softmax (lesson 09)
    overhead  [--out DIR]                  host time per call on a tiny input (launch cost), ours vs plain SDPA
    train-step [--out DIR] [--dtype ...] [--modes eager cuda_graph reduce_overhead]
                                           forward + backward through autograd, causal, GPT shapes, ours vs plain
                                           SDPA, SDPA flash and cuDNN, eager, replayed from a CUDA graph and
                                           through torch.compile(mode="reduce-overhead") (bench/train_step.py)
    variants  [--out DIR] [--dtype ...] [--variants NAME ...] [--providers ...]
                                           causal, windows, documents, GQA, softcap vs FlexAttention and SDPA
    profile   [--out DIR]                  proton: each kernel's share of a forward + backward step
    ring      [--quick] [--n ...] [--out DIR]   under torchrun, 2+ GPUs: ring attention and Ulysses vs
                                           PyTorch's context parallel (bench/ring.py)
    fp8       [--out DIR] [--n ...] [--head-dim 128 64] [--causal both|yes|no]
                                           the FP8 forward vs our fp16 forward, errors vs float64 (bench/fp8.py)
    table     [--write]                    docs/KERNELS.md's generated blocks and the README's results, from the JSON
    merge     NAME FILE.json FILE.json ... [--out DIR]   one results file from partial runs of one benchmark (a grid
                                           split by dtype or head dim across commands); refuses mixed devices

Each GPU command validates before timing, prints a table and writes
``<out>/<date>-<device>-<what>.json`` and, for attention and decode, a plot. attention, versions and variants
time every figure ``bench.REPEATS`` times and store the median with the range (``ms``, ``ms_min``, ``ms_max``,
``tflops``, ``tflops_min``, ``tflops_max``). A grid too long for one command is split, e.g.
``attention --dtype float16 --head-dim 64 --tag -fp16-d64`` and ``... --head-dim 128 --tag -fp16-d128``, then
``merge attention-fp16 <the two files>``. The default ``--out`` is
``benchmarks/results`` of the checkout; installed from a wheel, ``benchmarks/results`` under the current folder.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from flashcourse import resources
from flashcourse.bench import load_results, results_dir, save_results


def _need_gpu() -> None:
    import torch

    if not torch.cuda.is_available():
        sys.exit(f"this benchmark needs a CUDA GPU; the recorded results are in {results_dir()}")


def _attention(args) -> None:
    from flashcourse.bench import attention

    dtypes = args.dtype or default_dtypes()
    seq_lens = args.n or (attention.SEQ_LENS if not args.quick else (1024, 4096))
    heads = [tuple(int(x) for x in hc.split("x")) for hc in args.head_config] if args.head_config else \
        attention.HEAD_CONFIGS
    heads = _with_head_dims(heads, args.head_dim)
    causals = {"both": (False, True), "yes": (True,), "no": (False,)}[args.causal]
    shapes = attention.shape_grid(dtypes, seq_lens, heads, causals)
    rows = attention.run(shapes, providers=args.providers,
                         on_shape=lambda rows: save_results(f"attention{args.tag}", rows, directory=args.out,
                                                            kind="attention"))
    print(attention.format_table(rows))
    path = save_results(f"attention{args.tag}", rows, directory=args.out, kind="attention")
    from flashcourse import figures_gpu  # matplotlib only here: the benchmark itself runs without it

    figure = figures_gpu.attention_grid(rows, attention.PROVIDERS, title=f"attention, B=4, {path.stem}")
    figure.savefig(path.with_suffix(".png"), dpi=110)
    print(f"wrote {path} and {path.with_suffix('.png').name}")


def _with_head_dims(head_configs, head_dims):
    """The (heads, head_dim) pairs whose head dim is asked for (all of them without --head-dim)."""
    if not head_dims:
        return tuple(head_configs)
    kept = tuple(hc for hc in head_configs if hc[1] in head_dims)
    if not kept:
        sys.exit(f"--head-dim {' '.join(map(str, head_dims))} matches none of the head configs "
                 f"{' '.join(f'{h}x{d}' for h, d in head_configs)}: pass --head-config HxD for another head dim")
    return kept


def _decode(args) -> None:
    from flashcourse.bench import decode

    if args.tune:
        rows = decode.tune()
        path = save_results("decode-tune", rows, directory=args.out)
    else:
        rows = decode.run()
        print(decode.format_table(rows))
        path = save_results("decode", rows, directory=args.out)
    print(f"wrote {path}")


def _versions(args) -> None:
    from flashcourse.bench import attention, versions

    heads = _with_head_dims(attention.HEAD_CONFIGS, args.head_dim)
    shapes = attention.shape_grid(("float16",), args.n or (4096, 16384), heads)
    rows = versions.run_versions(shapes)
    path = save_results(f"versions{args.tag}", rows, directory=args.out, kind="versions")
    print(versions.kernels_table(path.parent))
    print(f"wrote {path}")


def _tune(args) -> None:
    from flashcourse.bench import attention, versions

    shapes = attention.shape_grid(("float16",), args.n or (8192,))
    rows = versions.tune(shapes)
    print(f"wrote {save_results('tune', rows, directory=args.out)}")


def _softmax_cost(args) -> None:
    from flashcourse.bench import ablation

    rows = ablation.run()
    print(f"wrote {save_results('softmax-cost', rows, directory=args.out)}")


def _overhead(args) -> None:
    from flashcourse.bench import overhead

    rows = overhead.run()
    print(f"wrote {save_results('overhead', rows, directory=args.out, kind='overhead', extra=overhead.meta())}")


def _train_step(args) -> None:
    from flashcourse.bench import train_step

    def save(rows):
        return save_results("train-step", rows, directory=args.out, kind="train-step")

    dtypes = args.dtype or [d for d in train_step.DTYPES if d in default_dtypes()]  # bf16 where the GPU has it
    rows = train_step.run(train_step.shape_grid(dtypes), modes=args.modes, on_row=save)
    path = save(rows)
    print(train_step.format_table(rows))
    print(f"wrote {path}")


def _variants(args) -> None:
    from flashcourse.bench import variants

    earlier = variants.earlier_rows_today(args.out)  # a run of the other dtype today: its rows stay in the file

    def save(rows):
        return save_results("variants", variants.merge_rows(earlier, rows), directory=args.out, kind="variants")

    rows = variants.run(args.dtype or default_dtypes(), args.variants, args.providers or variants.PROVIDERS,
                        on_variant=save)
    path = save(rows)
    print(variants.format_table(rows))
    print(f"wrote {path}")


def _ring(args) -> None:
    from flashcourse.bench import ring

    ring.main(args)


def _profile(args) -> None:
    from flashcourse.bench import profile

    rows = profile.run()
    print(f"wrote {save_results('profile', rows, directory=args.out)}")


def _merge(args) -> None:
    from flashcourse.bench import merge_results

    try:
        path = merge_results(args.name, args.files, directory=args.out)
    except (ValueError, FileNotFoundError) as err:
        sys.exit(f"merge: {err}")
    merged = load_results(path.name, directory=path.parent)[0]
    if merged["meta"].get("kind") == "attention":  # the whole grid's figure, as one attention run draws it
        from flashcourse import figures_gpu
        from flashcourse.bench import attention

        figure = figures_gpu.attention_grid(merged["rows"], attention.PROVIDERS, title=f"attention, B=4, {path.stem}")
        figure.savefig(path.with_suffix(".png"), dpi=110)
        print(f"wrote {path.with_suffix('.png')}")
    print(f"wrote {path}")


def _fp8(args) -> None:
    from flashcourse.bench import fp8

    causals = {"both": (False, True), "yes": (True,), "no": (False,)}[args.causal]

    def save(rows):
        return save_results("attention-fp8", rows, directory=args.out, kind="attention-fp8", extra=fp8.meta())

    rows = fp8.run(args.n or fp8.SEQ_LENS, args.head_dim, causals, on_row=save)
    path = save(rows)
    print(fp8.format_table(rows))
    print(f"wrote {path}")


def _table(args) -> None:
    from flashcourse.bench import summary, versions

    text = versions.kernels_table(args.results)
    if not args.write:
        print(text)
        print(summary.readme_section(args.results))
        return
    root = resources.checkout_root()
    if root is None:
        sys.exit("table --write rewrites README.md and docs/KERNELS.md of a checkout, and this flashcourse is "
                 "installed from a wheel: run it in a clone of the repository after `pip install -e .`")
    doc = root / "docs" / "KERNELS.md"
    doc.write_text(summary.write_kernels_doc(doc.read_text(), args.results))
    readme = root / "README.md"
    readme.write_text(summary.replace_between(readme.read_text(), summary.README_START, summary.README_END,
                                              summary.readme_section(args.results)))
    print(f"updated {doc} and {readme}")


def default_dtypes() -> list[str]:
    """float16 everywhere; bfloat16 too where the GPU has bfloat16 tensor cores (not on a T4: sm_75)."""
    from flashcourse.kernels import configs

    props = configs.device_props("cuda")
    if configs.supports_bf16(props):
        return ["float16", "bfloat16"]
    print(f"{props.name} has no bfloat16 tensor cores (compute capability < 8.0): measuring float16 only")
    return ["float16"]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m flashcourse.bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("attention", "decode", "versions", "tune", "softmax-cost", "overhead", "profile"):
        p = sub.add_parser(name)
        p.add_argument("--out", type=Path, default=resources.new_results_dir(),
                       help="folder for the JSON and the plot (default: %(default)s)")
        p.add_argument("--n", type=int, nargs="+", help="sequence lengths")
    att = sub.choices["attention"]
    att.add_argument("--dtype", nargs="+", choices=["float16", "bfloat16"],
                     help="default: float16 and, where the GPU has bfloat16 tensor cores (sm_80+), bfloat16")
    att.add_argument("--head-config", nargs="+", help="HxD pairs, e.g. 32x64 16x128")
    att.add_argument("--causal", default="both", choices=["both", "yes", "no"])
    att.add_argument("--providers", nargs="+", default=["flashcourse", "sdpa_flash", "sdpa_cudnn",
                                                        "sdpa_efficient", "naive"])
    att.add_argument("--quick", action="store_true", help="N in {1024, 4096} only")
    for name in ("attention", "versions"):
        sub.choices[name].add_argument("--head-dim", type=int, nargs="+",
                                       help="only the head configs with these head dims (split a long grid)")
    sub.choices["versions"].add_argument("--tag", default="", help="suffix of the result name, e.g. -d64 for "
                                         "a part to merge (the table reads *-versions.json)")
    att.add_argument("--tag", default="", help="suffix of the result name, e.g. -fp16")
    sub.choices["decode"].add_argument("--tune", action="store_true", help="sweep splits/blocks/warps/stages")
    merge = sub.add_parser("merge", help="merge result files of partial runs of one benchmark")
    merge.add_argument("name", help="result name of the merged file, e.g. attention-fp16")
    merge.add_argument("files", type=Path, nargs="+", help="the partial runs' JSON files, in order (later wins)")
    merge.add_argument("--out", type=Path, default=resources.new_results_dir(),
                       help="folder for the merged JSON (default: %(default)s)")
    table = sub.add_parser("table")
    table.add_argument("--results", type=Path, default=None, help="results folder (default benchmarks/results)")
    table.add_argument("--write", action="store_true", help="rewrite the table inside docs/KERNELS.md")
    var = sub.add_parser("variants", help="attention variants vs FlexAttention and SDPA")
    var.add_argument("--out", type=Path, default=resources.new_results_dir(),
                     help="folder for the JSON (default: %(default)s)")
    var.add_argument("--dtype", nargs="+", choices=["float16", "bfloat16"],
                     help="default: float16 and, where the GPU has bfloat16 tensor cores (sm_80+), bfloat16")
    var.add_argument("--variants", nargs="+", help="variant names, e.g. 'window 1024' (default: all)")
    var.add_argument("--providers", nargs="+", help="default: every provider of bench.variants.PROVIDERS")
    ring = sub.add_parser("ring", help="run with torchrun --nproc-per-node 2 -m flashcourse.bench ring")
    ring.add_argument("--out", type=Path, default=None, help="folder for the JSON (default benchmarks/results)")
    ring.add_argument("--n", type=int, nargs="+", help="sequence lengths (default 65536 131072)")
    ring.add_argument("--quick", action="store_true", help="N in {4096, 8192}, 3 repetitions: a smoke test")
    ring.add_argument("--reps", type=int, default=10, help="timed repetitions per provider")
    f8 = sub.add_parser("fp8", help="the FP8 forward vs our fp16 forward (Hopper)")
    f8.add_argument("--out", type=Path, default=resources.new_results_dir(),
                    help="folder for the JSON (default: %(default)s)")
    f8.add_argument("--n", type=int, nargs="+", help="sequence lengths (default 4096 8192 16384)")
    f8.add_argument("--head-dim", type=int, nargs="+", default=[128, 64], choices=[64, 128])
    f8.add_argument("--causal", default="both", choices=["both", "yes", "no"])
    step = sub.add_parser("train-step", help="a training step's attention at GPT shapes vs plain SDPA")
    step.add_argument("--out", type=Path, default=resources.new_results_dir(),
                      help="folder for the JSON (default: %(default)s)")
    step.add_argument("--dtype", nargs="+", choices=["bfloat16", "float16"],
                      help="default: bfloat16 (where the GPU has bfloat16 tensor cores, sm_80+) and float16")
    step.add_argument("--modes", nargs="+", choices=["eager", "cuda_graph", "reduce_overhead"],
                      default=["eager", "cuda_graph", "reduce_overhead"], help="default: %(default)s")
    args = parser.parse_args(argv)
    if args.command not in ("table", "merge"):
        _need_gpu()
    commands = {"attention": _attention, "decode": _decode, "versions": _versions, "tune": _tune,
                "softmax-cost": _softmax_cost, "overhead": _overhead, "profile": _profile, "ring": _ring,
                "variants": _variants, "table": _table, "merge": _merge,
                "fp8": _fp8, "train-step": _train_step}
    commands[args.command](args)


if __name__ == "__main__":
    main()
