"""The README's GPU results and every measured block of docs/KERNELS.md, written from the committed results,
never by hand.

``python -m flashcourse.bench table --write`` rewrites them (the README between its gpu-results markers, and in
docs/KERNELS.md each block between ``<!-- name:start -->`` and ``<!-- name:end -->`` for every name of
:func:`kernels_doc_blocks`), and tests/test_results_docs.py checks that the committed files match a fresh
generation. A figure recorded with repeats shows their range, ``544 (538-551)``; older files, without it, show the
median alone.
"""

from __future__ import annotations

import csv
import io
import statistics
from pathlib import Path

from flashcourse.bench import format_spread, load_results, results_dir

README_START, README_END = "<!-- gpu-results:start -->", "<!-- gpu-results:end -->"
SUMMARY_NS = (4096, 16384)
DTYPE_NAMES = {"float16": "fp16", "bfloat16": "bf16"}


def _find(rows, **match):
    for row in rows:
        if all(row.get(k) == v for k, v in match.items()) and row.get("status") == "ok":
            return row
    return None


def _fp16_cache_rows(rows):
    """The decoding rows of a float16 cache (rows before the FP8 cache carry no kv_dtype): the tables compare those."""
    return [r for r in rows if r.get("kv_dtype", "float16") == "float16"]


def _repeats_note(rows) -> str:
    """A sentence on the repeats when the rows have them (nothing for results recorded before them)."""
    repeats = max((r.get("repeats", 0) for r in rows if r.get("tflops_min") is not None), default=0)
    return (f" Each figure is the median of {repeats} repeats, the slowest and fastest in brackets (a ratio's "
            "range: our slowest over their fastest, and the reverse)." if repeats else "")


def _newest(pattern: str, directory: Path | None):
    """(meta, rows, file name) of the newest result file matching ``pattern``, or None when there is none."""
    found = load_results(pattern, directory=directory)
    if not found:
        return None
    return found[-1]["meta"], found[-1]["rows"], Path(found[-1]["path"]).name


def attention_summary(directory: Path | None = None) -> str:
    """fp16 forward and backward at N = 4096 and 16384: our TFLOP/s and the ratios to SDPA's backends."""
    newest = _newest("*-attention-fp16.json", directory)
    if newest is None:
        return "No attention results committed yet: run `python -m flashcourse.bench attention` on a GPU.\n"
    meta, rows, name = newest
    # A backend the run did not time (a run may leave out the slow efficient kernel) gets no column.
    backends = [(p, label) for p, label in (("sdpa_flash", "SDPA flash"), ("sdpa_cudnn", "cuDNN"),
                                            ("sdpa_efficient", "efficient"))
                if any(f"ratio_vs_{p}" in r for r in rows)]
    lines = [
        f"Forward and backward, fp16, B = 4, measured on {meta['device']} on {meta['date']} (torch {meta['torch']}, "
        f"triton {meta['triton']}; `{name}`). TFLOP/s of our default kernels and the ratio to "
        f"each PyTorch SDPA backend timed in the same run:{_repeats_note(rows)}",
        "",
        "| H x D | N | causal | pass | ours TFLOP/s | " + " | ".join(f"vs {label}" for _, label in backends) + " |",
        "|---|---|---|---|---|" + "---|" * len(backends),
    ]
    shapes = sorted({(r["heads"], r["head_dim"]) for r in rows}, key=lambda s: s[1])
    for heads, head_dim in shapes:
        for n in SUMMARY_NS:
            for causal in (False, True):
                for mode in ("fwd", "bwd"):
                    ours = _find(rows, provider="flashcourse", heads=heads, head_dim=head_dim, n=n,
                                 causal=causal, mode=mode)
                    if ours is None:
                        continue
                    ratios = " | ".join(format_spread(ours, f"ratio_vs_{p}", ".2f", "x") if f"ratio_vs_{p}" in ours
                                        else "-" for p, _ in backends)
                    lines.append(f"| {heads} x {head_dim} | {n} | {'yes' if causal else 'no'} | {mode} | "
                                 f"{format_spread(ours)} | {ratios} |")
    return "\n".join(lines) + "\n"


def decode_summary(directory: Path | None = None) -> str:
    """Flash-Decoding: effective bandwidth of our split-KV kernel against SDPA at each cache length."""
    newest = _newest("*-decode.json", directory)
    if newest is None:
        return ""
    meta, rows, name = newest
    rows = _fp16_cache_rows(rows)
    lines = [
        f"Decoding one token, fp16, B = 1, 32 query heads sharing 8 KV heads, D = 128, on {meta['device']} on "
        f"{meta['date']} (`{name}`); effective bandwidth = bytes of K and V / time:",
        "",
        "| KV length | ours TB/s | ours, paged TB/s | SDPA flash TB/s | SDPA cuDNN TB/s | ours vs flash "
        "| ours vs cuDNN |",
        "|---|---|---|---|---|---|---|",
    ]
    for kv_len in sorted({r["kv_len"] for r in rows if "kv_len" in r}):
        get = {p: _find(rows, provider=p, kv_len=kv_len) for p in
               ("flashcourse", "flashcourse_paged", "sdpa_flash", "sdpa_cudnn")}
        if get["flashcourse"] is None:
            continue
        tbs = " | ".join("-" if get[p] is None else f"{get[p]['bandwidth_tbs']:.2f}" for p in get)
        ours = get["flashcourse"]
        lines.append(f"| {kv_len} | {tbs} | {ours['ratio_vs_sdpa_flash']:.2f}x | {ours['ratio_vs_sdpa_cudnn']:.2f}x |")
    return "\n".join(lines) + "\n"


def variants_summary(directory: Path | None = None) -> str:
    """Attention variants: our TFLOP/s over the visible score entries beside compiled FlexAttention and SDPA."""
    newest = _newest("*-variants.json", directory)
    if newest is None:
        return ""
    meta, rows, name = newest

    def rate(row):
        return "-" if row is None else format_spread(row)

    # the variants of another head dim (older runs have none) say their D and N
    other_head_dims = dict.fromkeys((r["head_dim"], r["n"]) for r in rows if r.get("head_dim", 128) != 128)
    head_dims = "".join(f" (the head_dim rows: D = {d}, N = {n})" for d, n in other_head_dims)
    lines = [
        f"Attention variants, B = 4 (GQA: 2), H = 16 (GQA: 32 query heads on 8 KV heads), D = 128, N = 16384 "
        f"(GQA: 8192){head_dims}, on {meta['device']} on {meta['date']} (`{name}`); TFLOP/s over the visible score "
        f"entries only, FlexAttention compiled with its block mask built outside the timed region:"
        f"{_repeats_note(rows)}",
        "",
        "| variant | dtype | pass | visible | ours | FlexAttention | ours vs Flex | SDPA flash | SDPA cuDNN | note |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    keys = dict.fromkeys((r["variant"], r["dtype"], r["mode"]) for r in rows)
    for variant, dtype, mode in keys:
        get = {p: _find(rows, provider=p, variant=variant, dtype=dtype, mode=mode)
               for p in ("flashcourse", "flex", "sdpa_flash", "sdpa_cudnn")}
        ours = get["flashcourse"]
        if ours is None:
            continue
        ratio = format_spread(ours, "ratio_vs_flex", ".2f", "x") if "ratio_vs_flex" in ours else "-"
        note = ""
        if "vs_our_causal" in ours:
            note = f"{format_spread(ours, 'vs_our_causal', '.2f', 'x')} our causal"
        elif "ratio_vs_flashcourse_expanded_kv" in ours:
            note = f"{format_spread(ours, 'ratio_vs_flashcourse_expanded_kv', '.2f', 'x')} ours on expanded K/V"
        cells = [variant, DTYPE_NAMES.get(dtype, dtype), mode, f"{ours['density']:.0%}", rate(ours), rate(get["flex"]),
                 ratio, rate(get["sdpa_flash"]), rate(get["sdpa_cudnn"]), note]
        lines.append(f"| {' | '.join(cells)} |")
    return "\n".join(lines) + "\n"


def readme_section(directory: Path | None = None) -> str:
    """The text between the README's gpu-results markers."""
    parts = [attention_summary(directory), decode_summary(directory), variants_summary(directory)]
    return "\n" + "\n".join(part for part in parts if part)


def replace_between(text: str, start: str, end: str, body: str) -> str:
    """``text`` with everything between the ``start`` and ``end`` markers replaced by ``body``."""
    head, tail = text.index(start) + len(start), text.index(end)
    return text[:head] + body + text[tail:]


# ----------------------------------------------------------------------------------- docs/KERNELS.md's blocks
# Each function returns the markdown between one pair of markers in docs/KERNELS.md; every number in it is read
# from the file it names, so the prose around the blocks carries no measured number of its own.


def _span(values, fmt: str = ".2f", suffix: str = "x") -> str:
    """``1.13-1.68x`` (or ``1.13x`` when every value rounds the same)."""
    low, high = f"{min(values):{fmt}}", f"{max(values):{fmt}}"
    return f"{low}{suffix}" if low == high else f"{low}-{high}{suffix}"


def _source(meta: dict, name: str) -> str:
    return f"{meta['device']}, {meta['date']}, `{name}`"


# The variants' targets: every row of ours at or above compiled FlexAttention, forward and backward, and the
# forward at head dim 256 within 0.9x of cuDNN.
FLEX_TARGET, CUDNN_TARGET_D256 = 1.0, 0.9


def _ratio(value: float) -> str:
    """``0.92x``; a ratio under 1 that two decimals would show as 1.00 keeps a third, so that a miss never reads as
    a hit."""
    text = f"{value:.2f}"
    return f"{value:.3f}x" if value < 1.0 and text == "1.00" else f"{text}x"


def _maybe_ratio(value: float | None) -> str:
    return "-" if value is None else _ratio(value)


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def variants_comparison(directory: Path | None = None) -> dict | None:
    """The newest variants run, one record per (variant, dtype, pass) that our kernels ran, or None without a run.

    Each record: ``variant``, ``dtype``, ``mode``, ``head_dim``, ``n``, ``density``; TFLOP/s over the visible
    entries of ``ours`` (the rule passed to every call), ``block_mask`` (the mask built once with
    ``create_block_mask``, None where the variant needs none), ``flex`` and ``sdpa_cudnn`` (None where absent or
    failed); ``vs_flex``, ``block_mask_vs_flex``, ``block_mask_vs_ours`` (built once over per call) and
    ``vs_cudnn`` (the rows' ``ratio_vs_*`` keys, None where absent); ``ours_build_ms`` and ``flex_build_ms``, the
    mask builds timed apart. A run may hold one dtype or both: ``dtypes`` lists those it has."""
    newest = _newest("*-variants.json", directory)
    if newest is None:
        return None
    meta, rows, name = newest

    def tflops(row):
        return None if row is None else row["tflops"]

    records = []
    for variant, dtype, mode in dict.fromkeys((r["variant"], r["dtype"], r["mode"]) for r in rows):
        get = {p: _find(rows, provider=p, variant=variant, dtype=dtype, mode=mode)
               for p in ("flashcourse", "flashcourse_block_mask", "flex", "sdpa_cudnn")}
        ours, prebuilt, flex = get["flashcourse"], get["flashcourse_block_mask"], get["flex"]
        if ours is None:
            continue
        records.append({
            "variant": variant, "dtype": dtype, "mode": mode, "head_dim": ours.get("head_dim", 128),
            "n": ours["n"], "density": ours["density"], "ours": ours["tflops"], "block_mask": tflops(prebuilt),
            "flex": tflops(flex), "sdpa_cudnn": tflops(get["sdpa_cudnn"]), "vs_flex": ours.get("ratio_vs_flex"),
            "block_mask_vs_flex": None if prebuilt is None else prebuilt.get("ratio_vs_flex"),
            "block_mask_vs_ours": None if prebuilt is None else prebuilt.get("ratio_vs_flashcourse"),
            "vs_cudnn": ours.get("ratio_vs_sdpa_cudnn"),
            "ours_build_ms": None if prebuilt is None else prebuilt.get("block_mask_build_ms"),
            "flex_build_ms": None if flex is None else flex.get("block_mask_build_ms")})
    return {"meta": meta, "file": name, "dtypes": list(dict.fromkeys(r["dtype"] for r in records)),
            "rows": records}


def variants_targets(comparison: dict) -> dict[str, dict[str, list[dict]]]:
    """Which records of :func:`variants_comparison` meet the targets and which miss them:
    ``{"flex": ..., "block_mask_flex": ..., "cudnn_d256": ...}``, each ``{"met": [...], "missed": [...]}``.
    ``flex`` judges our rows called with the rule (``vs_flex`` >= 1.0), ``block_mask_flex`` the same kernels with
    the mask built once, ``cudnn_d256`` the forward at head dim 256 (``vs_cudnn`` >= 0.9). A record without the
    ratio (its reference failed or is absent) is in neither list."""
    def judge(key, target, keep=lambda r: True):
        picked = [r for r in comparison["rows"] if r[key] is not None and keep(r)]
        return {"met": [r for r in picked if r[key] >= target], "missed": [r for r in picked if r[key] < target]}

    return {"flex": judge("vs_flex", FLEX_TARGET),
            "block_mask_flex": judge("block_mask_vs_flex", FLEX_TARGET),
            "cudnn_d256": judge("vs_cudnn", CUDNN_TARGET_D256, lambda r: r["head_dim"] == 256 and r["mode"] == "fwd")}


def variants_markdown(comparison: dict) -> str:
    """Lesson 11's table of a :func:`variants_comparison`: every variant, ours called with the rule and with the
    mask built once, beside FlexAttention (and cuDNN where it runs the variant)."""
    meta = comparison["meta"]

    lines = [f"{meta['device']}, {meta['date']} (`{comparison['file']}`), TFLOP/s over the visible entries:", "",
             "| variant | D | N | dtype | pass | visible | ours | ours, mask built once | FlexAttention "
             "| ours / Flex | built once / Flex | ours / cuDNN |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in comparison["rows"]:
        cells = [r["variant"], str(r["head_dim"]), str(r["n"]), DTYPE_NAMES.get(r["dtype"], r["dtype"]), r["mode"],
                 f"{r['density']:.0%}", _rate(r["ours"]), _rate(r["block_mask"]), _rate(r["flex"]),
                 _maybe_ratio(r["vs_flex"]), _maybe_ratio(r["block_mask_vs_flex"]), _maybe_ratio(r["vs_cudnn"])]
        lines.append(f"| {' | '.join(cells)} |")
    return "\n".join(lines) + "\n"


def _listed(records, key: str) -> str:
    """``causal (1.46x), window 1024 (1.13x)``, or ``none``."""
    return ", ".join(f"{r['variant']} ({_ratio(r[key])})" for r in records) or "none"


def variants_verdict(comparison: dict) -> str:
    """The targets, met and missed, per dtype and pass, as markdown bullets (lesson 11 and docs/KERNELS.md)."""
    targets = variants_targets(comparison)
    lines = []
    for dtype in comparison["dtypes"]:
        name = DTYPE_NAMES.get(dtype, dtype)
        for mode, what in (("fwd", "Forward"), ("bwd", "Backward")):
            def mine(records, dtype=dtype, mode=mode):
                return [r for r in records if r["dtype"] == dtype and r["mode"] == mode]

            met, missed = mine(targets["flex"]["met"]), mine(targets["flex"]["missed"])
            verdict = (f"met on {len(met)} of {len(met) + len(missed)} variants; **missed** on "
                       f"{_listed(missed, 'vs_flex')}" if missed else f"met on {len(met)} of {len(met)} variants")
            lines.append(f"- {what}, {name}, ours against FlexAttention (`ratio_vs_flex`, target "
                         f"{FLEX_TARGET:.1f}x): {verdict}.")
            built_missed = mine(targets["block_mask_flex"]["missed"])
            if built_missed:
                lines.append(f"  With the mask built once (`flashcourse_block_mask` rows): missed on "
                             f"{_listed(built_missed, 'block_mask_vs_flex')}.")
        cudnn = [r for r in targets["cudnn_d256"]["met"] + targets["cudnn_d256"]["missed"] if r["dtype"] == dtype]
        if cudnn:
            verdict = "met" if all(r["vs_cudnn"] >= CUDNN_TARGET_D256 for r in cudnn) else "**missed**"
            backward = [r for r in comparison["rows"]
                        if r["dtype"] == dtype and r["head_dim"] == 256 and r["mode"] == "bwd" and r["vs_cudnn"]]
            lines.append(f"- Head dim 256, {name}, forward against cuDNN (`ratio_vs_sdpa_cudnn`, target "
                         f"{CUDNN_TARGET_D256:.1f}x): {verdict}, {_listed(cudnn, 'vs_cudnn')}"
                         + (f"; the backward: {_listed(backward, 'vs_cudnn')}." if backward else "."))
    return "\n".join(lines) + "\n"


def _previous_variants(directory: Path | None):
    """(meta, rows, file name) of the variants run before the newest, or None."""
    found = load_results("*-variants.json", directory=directory)
    if len(found) < 2:
        return None
    return found[-2]["meta"], found[-2]["rows"], Path(found[-2]["path"]).name


def variants_findings(directory: Path | None = None) -> str:
    """The variants run read across: the targets against FlexAttention and cuDNN, our kernels with the mask built
    once against the rule passed per call, windows against our causal, GQA against our kernel on expanded K/V,
    and each ratio to Flex beside the previous run's (keys ``ratio_vs_flex``, ``ratio_vs_sdpa_cudnn``,
    ``vs_our_causal``, ``ratio_vs_flashcourse_expanded_kv``, ``block_mask_build_ms``)."""
    comparison = variants_comparison(directory)
    if comparison is None:
        return "No variants run committed yet.\n"
    meta, records = comparison["meta"], comparison["rows"]
    lines = [f"From {_source(meta, comparison['file'])} (the table above; keys of the rows in brackets):", "",
             variants_verdict(comparison).rstrip("\n")]
    _, rows, _ = _newest("*-variants.json", directory)
    ours = [r for r in rows if r["provider"] == "flashcourse" and r.get("status") == "ok"]

    def one(variant, mode, key):
        return ", ".join(f"{_ratio(r[key])} ({DTYPE_NAMES.get(r['dtype'], r['dtype'])})" for r in ours
                         if r["variant"] == variant and r["mode"] == mode and key in r) or "-"

    for window in dict.fromkeys(r["variant"] for r in ours if r["variant"].startswith("window")):
        lines.append(f"- {window}, over our dense causal TFLOP/s (`vs_our_causal`): forward "
                     f"{one(window, 'fwd', 'vs_our_causal')}, backward {one(window, 'bwd', 'vs_our_causal')}.")
    gqa = next((r["variant"] for r in ours if r["variant"].startswith("GQA")), None)
    if gqa:
        key = "ratio_vs_flashcourse_expanded_kv"
        lines.append(f"- {gqa}, over our kernel on K/V expanded to every query head (`{key}`): forward "
                     f"{one(gqa, 'fwd', key)}, backward {one(gqa, 'bwd', key)}.")
    built = [r for r in records if r["block_mask"] is not None]
    if built:
        lines += ["", "Our kernels given the rule on every call (`flashcourse`) and with the mask built once "
                  "outside the timed region (`flashcourse_block_mask`), TFLOP/s (`tflops`; their ratio: "
                  "`ratio_vs_flashcourse` of the built-once rows), and each mask's build, timed apart "
                  "(`block_mask_build_ms`):", "",
                  "| variant | dtype | pass | per call | built once | FlexAttention | built once / per call "
                  "| our build (ms) | Flex's build (ms) |", "|---|---|---|---|---|---|---|---|---|"]
        for r in built:
            builds = ["-" if v is None else f"{v:.2f}" for v in (r["ours_build_ms"], r["flex_build_ms"])]
            cells = [r["variant"], DTYPE_NAMES.get(r["dtype"], r["dtype"]), r["mode"], _rate(r["ours"]),
                     _rate(r["block_mask"]), _rate(r["flex"]), _maybe_ratio(r["block_mask_vs_ours"]), *builds]
            lines.append(f"| {' | '.join(cells)} |")
    previous = _previous_variants(directory)
    if previous is not None:
        old_meta, old_rows, old_name = previous
        pairs = []
        for r in records:
            old = _find(old_rows, provider="flashcourse", variant=r["variant"], dtype=r["dtype"], mode=r["mode"])
            if old is not None and "ratio_vs_flex" in old and r["vs_flex"] is not None:
                pairs.append((r, old["ratio_vs_flex"]))
        if pairs:
            lines += ["", f"Ours against FlexAttention (`ratio_vs_flex`) in the previous run "
                      f"({_source(old_meta, old_name)}) and in this one, the variants both ran:", "",
                      f"| variant | dtype | pass | {old_meta['date']} | {meta['date']} |", "|---|---|---|---|---|"]
            lines += [f"| {r['variant']} | {DTYPE_NAMES.get(r['dtype'], r['dtype'])} | {r['mode']} | {_ratio(old)} | "
                      f"{_ratio(r['vs_flex'])} |" for r, old in pairs]
    return "\n".join(lines) + "\n"


def decode_kernels_table(directory: Path | None = None) -> str:
    """docs/KERNELS.md's decoding table: effective bandwidth of every provider, the paged cache at each page size
    against the contiguous one, and the two reference bandwidths timed in the same run."""
    newest = _newest("*-decode.json", directory)
    if newest is None:
        return "No decoding run committed yet.\n"
    meta, rows, name = newest
    rows = _fp16_cache_rows(rows)
    reference = {r["provider"]: r["bandwidth_tbs"] for r in rows if "kv_len" not in r}
    pages = sorted({r["page_size"] for r in rows if r["provider"] == "flashcourse_paged" and "page_size" in r})
    lines = [
        f"{_source(meta, name)}: fp16, B = 1, 32 query heads on 8 KV heads, D = 128, CUDA-graph replays; TB/s of "
        "K and V bytes read (`bandwidth_tbs`). Reference bandwidths of the same run, timed with CUDA events on "
        "2 GiB with the L2 flushed: " + ", ".join(f"{p} {tbs:.2f} TB/s" for p, tbs in reference.items()) + ".",
        "",
        "| KV length | ours | " + " | ".join(f"ours, paged ({p}-row pages)" for p in pages)
        + " | SDPA flash (GQA) | SDPA cuDNN | SDPA flash, cache expanded to 32 heads |",
        "|---|---|" + "---|" * len(pages) + "---|---|---|",
    ]
    for kv_len in sorted({r["kv_len"] for r in rows if "kv_len" in r}):
        ours = _find(rows, provider="flashcourse", kv_len=kv_len)
        if ours is None:
            continue
        cells = [f"{format_spread(ours, 'bandwidth_tbs', '.2f')}; {ours['ratio_vs_sdpa_flash']:.2f}x flash, "
                 f"{ours['ratio_vs_sdpa_cudnn']:.2f}x cuDNN"]
        for page in pages:
            paged = _find(rows, provider="flashcourse_paged", kv_len=kv_len, page_size=page)
            cells.append("-" if paged is None else f"{paged['bandwidth_tbs']:.2f}; "
                         f"{format_spread(paged, 'ratio_vs_contiguous', '.2f', 'x')} of ours")
        for provider in ("sdpa_flash", "sdpa_cudnn", "sdpa_flash_expanded"):
            row = _find(rows, provider=provider, kv_len=kv_len)
            cells.append("-" if row is None else f"{row['bandwidth_tbs']:.2f}")
        lines.append(f"| {kv_len // 1024}K | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _sweep(directory: Path | None, kernel: str):
    """The newest sweep that timed our ``kernel`` ("fwd" or "bwd"): a run may sweep only one of them
    (``--kernels bwd``), and then the other's findings stay those of the run before it."""
    for data in reversed(load_results("*-sweep.json", directory=directory)):
        if any(r["kernel"] == kernel and not r["version"].startswith("sdpa") for r in data["rows"]):
            return data["meta"], data["rows"], Path(data["path"]).name
    return None


def _launch(config) -> str:
    if not config:
        return "default launch"
    return f"{config['block_m']}x{config['block_n']}/w{config['num_warps']}/s{config['num_stages']}"


def sweep_forward_findings(directory: Path | None = None) -> str:
    """v7's forward launches at D = 128 from the sweep (`kernel` fwd): each launch's TFLOP/s per shape, cuDNN's
    beside them."""
    newest = _sweep(directory, "fwd")
    if newest is None:
        return "No sweep committed yet.\n"
    meta, rows, name = newest
    fwd = [r for r in rows if r["kernel"] == "fwd" and r["head_dim"] == 128]
    shapes = list(dict.fromkeys((r["n"], r["causal"]) for r in fwd))
    launches = list(dict.fromkeys(_launch(r.get("config")) for r in fwd if r["version"] != "sdpa_cudnn"))
    lines = [f"{_source(meta, name)}, rows `kernel` = fwd, fp16, B = 4, H = 16, D = 128; TFLOP/s of v7 at each "
             "launch (tiles / warps / stages) and of cuDNN:", "",
             "| N | causal | " + " | ".join(launches) + " | cuDNN |", "|---|---|" + "---|" * (len(launches) + 1)]
    for n, causal in shapes:
        cells = []
        for launch in launches:
            row = next((r for r in fwd if (r["n"], r["causal"]) == (n, causal) and r["version"] == "v7"
                        and _launch(r.get("config")) == launch), None)
            cells.append("-" if row is None else f"{row['tflops']:.0f}")
        cudnn = next(r for r in fwd if (r["n"], r["causal"]) == (n, causal) and r["version"] == "sdpa_cudnn")
        lines.append(f"| {n} | {'yes' if causal else 'no'} | " + " | ".join(cells) + f" | {cudnn['tflops']:.0f} |")
    return "\n".join(lines) + "\n"


BACKWARD_SCHEMES = ("b1", "b2", "b4", "b5")


def backward_launch_comparison(directory: Path | None = None) -> list[dict]:
    """Per backward shape of the newest backward sweep: every scheme's TFLOP/s at each dK/dV launch it was timed
    at, and each scheme over b1 *at the same launch* (b1's dQ kernel at the mirrored tile, same warps and
    stages). Rows: {shape: (D, N, causal), launches: {launch: {scheme: TFLOP/s}}, over_b1: {scheme: [ratio per
    launch]}, b1_default, b1_best, b1_best_launch, cudnn}. Schemes or launches a run lacks are left out; a run
    from before the schemes shared launches gives over_b1 lists that are empty."""
    newest = _sweep(directory, "bwd")
    if newest is None:
        return []
    rows = [r for r in newest[1] if r["kernel"] == "bwd"]
    found = []
    for shape in dict.fromkeys((r["head_dim"], r["n"], r["causal"]) for r in rows):
        here = [r for r in rows if (r["head_dim"], r["n"], r["causal"]) == shape]
        launches: dict[str, dict[str, float]] = {}
        for r in here:
            if r["version"] in BACKWARD_SCHEMES and r.get("config"):
                launches.setdefault(_launch(r["config"]), {})[r["version"]] = r["tflops"]
        shared = {launch: by for launch, by in launches.items() if "b1" in by}
        over_b1 = {scheme: [by[scheme] / by["b1"] for by in shared.values() if scheme in by]
                   for scheme in BACKWARD_SCHEMES[1:]}
        default = next((r["tflops"] for r in here if r["version"] == "b1" and not r.get("config")), None)
        b1_at = {launch: by["b1"] for launch, by in shared.items()}
        best_launch = max(b1_at, key=b1_at.get) if b1_at else None
        found.append({"shape": shape, "launches": launches, "over_b1": over_b1, "b1_default": default,
                      "b1_best": b1_at.get(best_launch), "b1_best_launch": best_launch,
                      "cudnn": next(r["tflops"] for r in here if r["version"] == "sdpa_cudnn")})
    return found


def sweep_backward_findings(directory: Path | None = None) -> str:
    """The backward schemes of the sweep, each over b1 at the same dK/dV launches."""
    newest = _sweep(directory, "bwd")
    found = backward_launch_comparison(directory)
    if not found:
        return "No sweep committed yet.\n"
    meta, _, name = newest
    lines = [f"{_source(meta, name)}, rows `kernel` = bwd (fp16, B = 4; D = 128 with H = 16, D = 64 with H = 32). "
             "Every scheme at the same dK/dV launches (b1's dQ kernel at the mirrored tile); each cell is the "
             "scheme over b1 at the same launch, lowest to highest across the launches:", "",
             "| D | N | causal | b2 / b1 | b4 / b1 | b5 / b1 | b1's best launch / its default | b1 best / cuDNN |",
             "|---|---|---|---|---|---|---|---|"]
    for f in found:
        d, n, causal = f["shape"]
        cells = [_span(f["over_b1"][s]) if f["over_b1"][s] else "-" for s in BACKWARD_SCHEMES[1:]]
        best = "-" if f["b1_best"] is None or f["b1_default"] is None else \
            f"{f['b1_best'] / f['b1_default']:.2f}x ({f['b1_best_launch']})"
        top = max(v for v in (f["b1_best"], f["b1_default"]) if v is not None)
        lines.append(f"| {d} | {n} | {'yes' if causal else 'no'} | " + " | ".join(cells)
                     + f" | {best} | {top / f['cudnn']:.2f}x |")
    return "\n".join(lines) + "\n"


NCU_FILE = "2026-11-30-nvidia-h200-ncu.csv"
# benchmarks/ncu_kernels.py launches, in this order: v7's forward, b1's dK/dV and dQ kernels, b5's dK/dV kernel
NCU_LAUNCHES = (("_fwd_v7_kernel", "v7 forward"), ("_bwd_dkdv_kernel", "b1 dK/dV"), ("_bwd_dq_kernel", "b1 dQ"),
                ("_bwd_dkdv_kernel", "b5 dK/dV (with the dQ tile)"))
NCU_METRICS = (("Registers Per Thread", "registers / thread"),
               ("Dynamic Shared Memory Per Block", "dynamic shared memory / program (B)"),
               ("Block Limit Registers", "programs / SM allowed by registers"),
               ("Block Limit Shared Mem", "programs / SM allowed by shared memory"),
               ("Achieved Occupancy", "achieved occupancy (%)"),
               ("Compute (SM) Throughput", "SM throughput (% of peak)"),
               ("Warp Cycles Per Issued Instruction", "cycles per issued instruction"),
               ("Duration", "duration (us)"))


def ncu_counters(directory: Path | None = None) -> dict[str, dict[str, float]] | None:
    """Nsight Compute's counters of benchmarks/ncu_kernels.py's four launches (fp16, B = 4, H = 16, N = 8192,
    D = 128): {launch label: {metric name: value}}, from ``benchmarks/results/<NCU_FILE>``; None when the file
    is not there (a wheel ships the JSON results only)."""
    path = Path(directory or results_dir()) / NCU_FILE
    if not path.exists():
        return None
    lines = path.read_text().splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith('"ID"'))
    by_id: dict[str, dict] = {}
    for row in csv.DictReader(io.StringIO("\n".join(lines[header:]))):
        entry = by_id.setdefault(row["ID"], {"kernel": row["Kernel Name"], "metrics": {}})
        if row["Metric Name"] and row["Metric Value"]:
            try:
                entry["metrics"][row["Metric Name"]] = float(row["Metric Value"].replace(",", ""))
            except ValueError:
                entry["metrics"][row["Metric Name"]] = row["Metric Value"]
    launches = [by_id[i] for i in sorted(by_id, key=int)]
    if [e["kernel"] for e in launches] != [kernel for kernel, _ in NCU_LAUNCHES]:
        raise ValueError(f"{NCU_FILE}: expected the launches {[k for k, _ in NCU_LAUNCHES]} of "
                         f"benchmarks/ncu_kernels.py, found {[e['kernel'] for e in launches]}")
    return {label: entry["metrics"] for (_, label), entry in zip(NCU_LAUNCHES, launches, strict=True)}


def ncu_table(directory: Path | None = None) -> str:
    """docs/KERNELS.md's Nsight Compute table (metric names as Nsight Compute prints them)."""
    counters = ncu_counters(directory)
    if counters is None:
        return f"`{NCU_FILE}` is not here.\n"
    labels = list(counters)
    lines = [f"NVIDIA H200, 2026-11-30, `{NCU_FILE}` (benchmarks/ncu_kernels.py: fp16, B = 4, H = 16, N = 8192, "
             "D = 128, one launch each; sections SpeedOfLight, Occupancy, LaunchStats, WarpStateStats; no spill "
             "counters were collected):", "", "| Nsight Compute metric | " + " | ".join(labels) + " |",
             "|---|" + "---|" * len(labels)]
    for metric, title in NCU_METRICS:
        cells = []
        for label in labels:
            value = counters[label].get(metric)
            if metric == "Duration" and value is not None:
                value = value / 1000
            cells.append("-" if value is None else f"{value:,.0f}" if value >= 100 else f"{value:g}")
        lines.append(f"| {title} (`{metric}`) | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def fp8_findings(directory: Path | None = None) -> str:
    """The FP8 forward's grid: speed over our fp16 forward with V copied and V kept, the share of the time the
    copy of V takes, and how much incoherent processing lowers the RMS error, per head dim and mask."""
    newest = _newest("*-attention-fp8.json", directory)
    if newest is None:
        return "No FP8 run committed yet.\n"
    meta, rows, name = newest
    grid = [r for r in rows if r.get("kind") == "grid" and r.get("status") == "ok"]
    lines = [f"{_source(meta, name)}, the `grid` rows (fp16, B = 4, H = 16, N = "
             + ", ".join(str(n) for n in sorted({r["n"] for r in grid})) + "; ranges over N):", "",
             "| D | causal | FP8 / our fp16, V copied per call (`ratio_vs_flashcourse_fp16`) | FP8 / our fp16, V kept "
             "keys-adjacent (`tflops_v_kept` / `tflops_fp16`) | share of the FP8 call's time spent copying V "
             "(1 - `tflops` / `tflops_v_kept`) | RMS error FP8 / FP8 incoherent | RMS error fp16 |",
             "|---|---|---|---|---|---|---|"]
    for d in sorted({r["head_dim"] for r in grid}, reverse=True):
        for causal in (False, True):
            sel = [r for r in grid if r["head_dim"] == d and r["causal"] == causal]
            if not sel:
                continue
            lines.append(
                f"| {d} | {'yes' if causal else 'no'} | {_span([r['ratio_vs_flashcourse_fp16'] for r in sel])} | "
                f"{_span([r['tflops_v_kept'] / r['tflops_fp16'] for r in sel])} | "
                f"{_span([100 * (1 - r['tflops'] / r['tflops_v_kept']) for r in sel], '.0f', '%')} | "
                f"{_span([r['rms_err_fp8'] / r['rms_err_fp8_incoherent'] for r in sel])} | "
                f"{_span([r['rms_err_fp16'] for r in sel], '.0e', '')} |")
    return "\n".join(lines) + "\n"


def grid_cudnn_ratios(directory: Path | None = None, min_n: int = 4096) -> str:
    """Our default kernels over cuDNN in the newest fp16 and bf16 attention grids (key ``ratio_vs_sdpa_cudnn`` of
    the flashcourse rows), ranges over N >= ``min_n``, causal and not, both dtypes."""
    runs = [r for r in (_newest(f"*-attention-{dtype}.json", directory) for dtype in ("fp16", "bf16")) if r]
    if not runs:
        return "No attention grid committed yet.\n"
    rows = [row for _, found, _ in runs for row in found
            if row.get("provider") == "flashcourse" and "ratio_vs_sdpa_cudnn" in row and row["n"] >= min_n]
    names = ", ".join(f"`{name}`" for _, _, name in runs)
    lines = [f"{runs[0][0]['device']}, {runs[0][0]['date']}, {names}: ours over cuDNN (`ratio_vs_sdpa_cudnn`), "
             f"N >= {min_n}, causal and not, fp16 and bf16:", "", "| pass | D | ours / cuDNN |", "|---|---|---|"]
    for mode in ("fwd", "bwd"):
        for d in sorted({r["head_dim"] for r in rows}):
            values = [r["ratio_vs_sdpa_cudnn"] for r in rows if r["mode"] == mode and r["head_dim"] == d]
            if values:
                lines.append(f"| {mode} | {d} | {_span(values)} |")
    return "\n".join(lines) + "\n"


def kernels_doc_blocks(directory: Path | None = None) -> dict[str, str]:
    """Every generated block of docs/KERNELS.md: {marker name: the text between its start and end markers}."""
    from flashcourse.bench import versions

    return {"versions-table": "\n" + versions.kernels_table(directory),
            "variants-table": "\n" + variants_summary(directory),
            "variants-findings": "\n" + variants_findings(directory),
            "sweep-forward": "\n" + sweep_forward_findings(directory),
            "grid-ratios": "\n" + grid_cudnn_ratios(directory),
            "sweep-backward": "\n" + sweep_backward_findings(directory),
            "ncu-counters": "\n" + ncu_table(directory),
            "fp8-findings": "\n" + fp8_findings(directory),
            "decode-table": "\n" + decode_kernels_table(directory)}


def write_kernels_doc(text: str, directory: Path | None = None) -> str:
    """``text`` (docs/KERNELS.md) with every generated block replaced by a fresh generation."""
    for name, body in kernels_doc_blocks(directory).items():
        text = replace_between(text, f"<!-- {name}:start -->", f"<!-- {name}:end -->", body)
    return text


# ----------------------------------------------------------------------------------- lesson 08: a step's host time
MODE_NAMES = {"eager": "eager", "cuda_graph": "CUDA graph", "reduce_overhead": "reduce-overhead"}


def train_step_modes(directory: Path | None = None) -> dict | None:
    """The newest ``*-train-step.json`` whose rows include a recorded mode (``mode`` cuda_graph or
    reduce_overhead, ``python -m flashcourse.bench train-step``), as {"meta", "rows", "path"}; None when no
    committed run has one (rows without ``mode`` are eager: runs before the modes)."""
    for data in reversed(load_results("*-train-step.json", directory=directory)):
        if any(row.get("mode", "eager") != "eager" for row in data["rows"]):
            return data
    return None


def _step_cell(row: dict | None, prefix: str) -> str:
    """One provider's microseconds in a train-step row, or why there is none."""
    if row is None:
        return "-"
    if row.get(f"{prefix}status") != "ok":
        return row.get(f"{prefix}status", "-")
    skipped = " (no graph)" if row.get(f"{prefix}cudagraph_skips") else ""
    return f"{row[f'{prefix}us']:.0f}{skipped}"


def train_step_modes_markdown(data: dict) -> str:
    """Lesson 08's table of a train-step run with recorded modes: per shape, our step and plain SDPA's in
    microseconds in each mode, and ours over theirs in the same mode; then what the graph took off each eager step,
    and every failed capture or compile with its error."""
    modes = [m for m in MODE_NAMES if any(r.get("mode", "eager") == m for r in data["rows"])]
    by_shape: dict = {}
    for row in sorted(data["rows"], key=lambda r: (r["dtype"], r["n"], r["head_dim"], r["batch"])):
        shape = (DTYPE_NAMES.get(row["dtype"], row["dtype"]), row["batch"], row["heads"], row["n"], row["head_dim"])
        by_shape.setdefault(shape, {})[row.get("mode", "eager")] = row
    names = " / ".join(MODE_NAMES[m] for m in modes)
    meta = data["meta"]
    lines = [f"Recorded on **{meta['device']}**, {meta['date']} (torch {meta.get('torch')}, triton "
             f"{meta.get('triton')}; `{Path(data['path']).name}`). Microseconds per step (forward + backward, causal), "
             f"each mode in the order {names}:", "",
             "| shape | ours (us) | plain SDPA (us) | ours / SDPA |", "|---|---|---|---|"]
    for (dtype, b, h, n, d), rows in by_shape.items():
        found = [rows.get(m) for m in modes]
        ratios = [f"{r['ratio_vs_sdpa_plain']:.2f}x" if r and "ratio_vs_sdpa_plain" in r else "-" for r in found]
        lines.append(f"| {dtype} B{b} H{h} N{n} D{d} | {' / '.join(_step_cell(r, '') for r in found)} | "
                     f"{' / '.join(_step_cell(r, 'sdpa_plain_') for r in found)} | {' / '.join(ratios)} |")
    saved = []
    for (dtype, b, h, n, d), rows in by_shape.items():
        eager, graph = rows.get("eager"), rows.get("cuda_graph")
        if eager and graph and all(r.get(f"{p}status") == "ok" for r in (eager, graph) for p in ("", "sdpa_plain_")):
            saved.append(f"{dtype} B{b} H{h} N{n} D{d}: ours {eager['us'] - graph['us']:.0f} us of "
                         f"{eager['us']:.0f}, plain SDPA {eager['sdpa_plain_us'] - graph['sdpa_plain_us']:.0f} us of "
                         f"{eager['sdpa_plain_us']:.0f}")
    if saved:
        lines += ["", "What replaying the CUDA graph took off each eager step (the host time the GPU had waited for):",
                  *(f"- {line}" for line in saved)]
        lines += ["", graph_verdict(by_shape)]
    slower = []
    for (dtype, b, h, n, d), rows in by_shape.items():
        eager, compiled = rows.get("eager", {}), rows.get("reduce_overhead", {})
        both_ok = all(r.get(f"{p}status") == "ok" for r in (eager, compiled) for p in ("", "sdpa_plain_"))
        if both_ok and all(compiled[f"{p}us"] > eager[f"{p}us"] for p in ("", "sdpa_plain_")):
            slower.append(f"{dtype} B{b} H{h} N{n} D{d} (ours {compiled['us']:.0f} against {eager['us']:.0f} us, "
                          f"plain SDPA {compiled['sdpa_plain_us']:.0f} against {eager['sdpa_plain_us']:.0f})")
    if slower:
        lines += ["", "reduce-overhead made both steps slower than eager at " + "; ".join(slower) + ": the "
                  "compiled step does more work than the eager one, and this run does not say what (a profile of "
                  "the compiled step would)."]
    failures = [f"- {MODE_NAMES.get(r.get('mode'), r.get('mode'))}, {who}, {DTYPE_NAMES.get(r['dtype'], r['dtype'])} "
                f"B{r['batch']} H{r['heads']} N{r['n']} D{r['head_dim']}: {r.get(f'{p}error', r.get(f'{p}status'))}"
                for r in data["rows"] for p, who in (("", "ours"), ("sdpa_plain_", "plain SDPA"))
                if r.get(f"{p}status") not in (None, "ok")]
    if failures:
        lines += ["", "Not timed (the step could not be recorded, or differed from eager):", *failures]
    if any(r.get(f"{p}cudagraph_skips") for r in data["rows"] for p in ("", "sdpa_plain_")):
        lines += ["", "(no graph): torch.compile declined to record a CUDA graph there; that time is compiled code "
                  "launched from the host."]
    return "\n".join(lines)


def graph_verdict(by_shape: dict) -> str:
    """Whether the gap to plain SDPA was host time or GPU time, from the shapes timed both eager and replayed from
    a CUDA graph: a graph removes the host's share, so a ratio that stays where it was is the kernels' own."""
    pairs = [(rows["eager"]["ratio_vs_sdpa_plain"], rows["cuda_graph"]["ratio_vs_sdpa_plain"])
             for rows in by_shape.values() if all("ratio_vs_sdpa_plain" in rows.get(m, {}) for m in
                                                   ("eager", "cuda_graph"))]
    if not pairs:
        return ""
    eager, graph = [p[0] for p in pairs], [p[1] for p in pairs]

    def span(xs):
        return f"{min(xs):.2f}x" if min(xs) == max(xs) else f"{min(xs):.2f}-{max(xs):.2f}x"

    kept = sum(g - 1 for g in graph) / sum(e - 1 for e in eager) if sum(e - 1 for e in eager) > 0 else 1.0
    where = ("so almost all of our extra time is GPU time, the kernels themselves, which a graph cannot remove"
             if kept >= 0.8 else "so much of our extra time was host time, which the graph removed")
    return (f"Ours / plain SDPA: eager {span(eager)}, replayed from a CUDA graph {span(graph)}: the graph keeps "
            f"{kept:.0%} of the gap, {where}.")


def host_time_note(directory: Path | None = None) -> str | None:
    """Lesson 08's host-time figures: a training step's time per call on a tiny input (``*-overhead.json``, where
    the GPU work is negligible, so it is host time), ours and plain SDPA's, beside the eager step at the smallest
    GPT shape of the newest ``*-train-step.json``; None when either file is missing."""
    overhead, steps = _newest("*-overhead.json", directory), _newest("*-train-step.json", directory)
    if overhead is None or steps is None:
        return None
    host = {row["provider"]: row for row in overhead[1]}
    if "flashcourse_train_step" not in host or "sdpa_train_step" not in host:
        return None
    eager = [r for r in steps[1] if r.get("mode", "eager") == "eager" and r.get("status") == "ok"
             and r.get("sdpa_plain_status") == "ok"]
    if not eager:
        return None
    small = min(eager, key=lambda r: (r["batch"] * r["heads"] * r["n"] ** 2 * r["head_dim"], r["dtype"]))
    ours, theirs = host["flashcourse_train_step"]["us_per_call"], host["sdpa_train_step"]["us_per_call"]
    return (f"Host time of one training step (a tiny input, where the GPU has almost nothing to do; "
            f"{_source(overhead[0], overhead[2])}): ours **{ours:.0f} us**, plain SDPA **{theirs:.0f} us**.\n\n"
            f"The whole step at the smallest GPT shape, {DTYPE_NAMES.get(small['dtype'], small['dtype'])} "
            f"B{small['batch']} H{small['heads']} N{small['n']} D{small['head_dim']} "
            f"({_source(steps[0], steps[2])}): ours **{small['us']:.0f} us**, plain SDPA "
            f"**{small['sdpa_plain_us']:.0f} us**.")


HOST_SPLIT_PIECES = (  # benchmarks/train_step_host_split.py's pieces, in the order lesson 08 shows them
    ("sdpa_train_step", "plain SDPA: the whole step"),
    ("flashcourse_train_step", "ours: the whole step"),
    ("bare_function_step", "a Python autograd.Function that launches nothing"),
    ("sdpa_forward_grad", "plain SDPA: the forward, inputs requiring grad"),
    ("ours_forward_grad", "ours: the forward, inputs requiring grad"),
    ("ours_backward_functional", "ours: the backward alone (no autograd)"),
)


def host_split_table(directory: Path | None = None) -> str | None:
    """Lesson 08's split of a training step's host time (the newest ``*-train-step-host-split.json``,
    ``benchmarks/train_step_host_split.py``): per piece, the median of its rounds and their range, in microseconds per
    call; None when no such run is recorded."""
    newest = _newest("*-train-step-host-split.json", directory)
    if newest is None:
        return None
    meta, rows, name = newest
    lines = [f"Host time per call on tiny inputs ({_source(meta, name)}; median of "
             f"{meta.get('rounds', 'the')} rounds of {meta.get('calls', 'many')} calls, range in brackets):", "",
             "| piece | us per call |", "|---|---|"]
    medians = {}
    for piece, label in HOST_SPLIT_PIECES:
        times = sorted(r["us_per_call"] for r in rows if r["piece"] == piece)
        if times:
            medians[piece] = statistics.median(times)
            lines.append(f"| {label} | {medians[piece]:.0f} ({times[0]:.0f}-{times[-1]:.0f}) |")
    if "bare_function_step" in medians and "sdpa_train_step" in medians:
        share = medians["bare_function_step"] / medians["sdpa_train_step"]
        lines += ["", f"The Python Function that launches nothing costs **{share:.0%}** of plain SDPA's whole step "
                      "(medians)."]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------- lesson 08: what limits the backward
# benchmarks/ncu_limits.py's backward cases: name -> (label, the kernels that compute its matrix products as (text in
# the kernel's name, label, products)). A product is one N x N x D matrix product per head. cuDNN and b6 compute
# the backward's five (S, dP, dV, dK, dQ) in one kernel; b1's dK/dV kernel computes S, dP, dV and dK, its dQ kernel
# S and dP again, then dQ. Every other kernel of a case (the Delta preprocess, zeroing, dQ's conversion) computes none.
BACKWARD_LIMIT_CASES = {
    "bwd-cudnn": ("cuDNN", (("flash_bprop", "cuDNN", 5),)),
    "bwd-b1": ("b1", (("_bwd_dkdv_kernel", "b1 dK/dV", 4), ("_bwd_dq_kernel", "b1 dQ", 3))),
    "bwd-b6a": ("b6a", (("_b6a_kernel", "b6a", 5),)),
    "bwd-b6c": ("b6c", (("_b6_ws_kernel", "b6c", 5),)),
}
BACKWARD_TARGET = 0.9  # of cuDNN's speed: the goal for our default backward


def _ncu_backward_run(directory: Path | None):
    """The newest ``*-ncu-limits.json`` in which every case of BACKWARD_LIMIT_CASES ran, or None."""
    for data in reversed(load_results("*-ncu-limits.json", directory=directory)):
        cases = data["meta"].get("cases", {})
        if all(cases.get(case, {}).get("status") == "ok" for case in BACKWARD_LIMIT_CASES):
            return data
    return None


def backward_limits(directory: Path | None = None) -> dict | None:
    """What limits each backward, from the newest ``*-ncu-limits.json`` (benchmarks/ncu_limits.py, Nsight Compute) with
    every backward case; None when no committed run has them.

    ``kernels``: {label: {products, us, tflops (the products' FLOP over the kernel's time), tensor_pipe_pct,
    registers, local_load_bytes (spilled registers read back), global_red_inst (reduction instructions: atomic adds
    whose result no thread waits for), top_stalls, case, kernel}}, one per kernel that computes products.
    ``backwards``: {label: {products, us (all its kernels), other_us (those that compute no product), over_cudnn
    (cuDNN's time over its time), at_cudnn_rate (the same if its products took cuDNN's time per product, its other
    kernels as measured), needed_tflops (the rate its products need for BACKWARD_TARGET of cuDNN's speed)}}.
    Also ``flop_per_product`` (2 B H N^2 D, halved for causal), ``shape``, ``device``, ``date`` and ``file``."""
    data = _ncu_backward_run(directory)
    if data is None:
        return None
    meta, name = data["meta"], Path(data["path"]).name
    shapes = {case: meta["cases"][case]["shape"] for case in BACKWARD_LIMIT_CASES}
    shape = shapes["bwd-cudnn"]
    if any(s != shape for s in shapes.values()):
        raise ValueError(f"{name}: the backward cases ran different shapes, {shapes}: their rates do not compare")
    flop = (2.0 * shape["batch"] * shape["heads"] * shape["n"] ** 2 * shape["head_dim"]
            * (0.5 if shape["causal"] else 1.0))
    kernels, backwards = {}, {}
    for case, (backward, computing) in BACKWARD_LIMIT_CASES.items():
        rows = [r for r in data["rows"] if r["case"] == case]
        for text, label, products in computing:
            found = [r for r in rows if text in r["kernel"]]
            if len(found) != 1:
                raise ValueError(f"{name}: expected one kernel named like {text!r} in case {case}, found "
                                 f"{[r['kernel'][:60] for r in found] or 'none'}")
            row = found[0]
            kernels[label] = {"case": case, "kernel": row["kernel"], "products": products, "us": row["duration_us"],
                              "tflops": products * flop / (row["duration_us"] * 1e-6) / 1e12,
                              "tensor_pipe_pct": row["tensor_pipe_pct"], "registers": row["registers_per_thread"],
                              "local_load_bytes": row["local_load_bytes"], "global_red_inst": row["global_red_inst"],
                              "top_stalls": [stall for stall, _ in row["top_stalls"]]}
        mine = [kernels[label] for _, label, _ in computing]
        us = sum(r["duration_us"] for r in rows)
        backwards[backward] = {"products": sum(k["products"] for k in mine), "us": us,
                               "other_us": us - sum(k["us"] for k in mine)}
    cudnn = backwards["cuDNN"]
    us_per_product = kernels["cuDNN"]["us"] / kernels["cuDNN"]["products"]
    for backward in backwards.values():
        backward["over_cudnn"] = cudnn["us"] / backward["us"]
        backward["at_cudnn_rate"] = cudnn["us"] / (backward["products"] * us_per_product + backward["other_us"])
        seconds_left = (cudnn["us"] / BACKWARD_TARGET - backward["other_us"]) * 1e-6
        backward["needed_tflops"] = backward["products"] * flop / seconds_left / 1e12
    return {"device": meta["device"], "date": meta["date"], "file": name, "shape": shape, "flop_per_product": flop,
            "kernels": kernels, "backwards": backwards}


def backward_limits_markdown(limits: dict) -> str:
    """Lesson 08's table of :func:`backward_limits`: per kernel its products, time, rate and what Nsight Compute saw."""
    s = limits["shape"]
    lines = [f"{limits['device']}, {limits['date']} (`{limits['file']}`; {DTYPE_NAMES.get(s['dtype'], s['dtype'])}, "
             f"B = {s['batch']}, H = {s['heads']}, N = {s['n']}, D = {s['head_dim']}, "
             f"{'causal' if s['causal'] else 'non-causal'}; "
             f"one product {limits['flop_per_product'] / 1e12:.2f} TFLOP):",
             "", "| kernel | products | time (us) | TFLOP/s | tensor pipe busy | registers / thread "
             "| local memory read (MB) | global reductions (M) |", "|---|---|---|---|---|---|---|---|"]
    for label, k in limits["kernels"].items():
        lines.append(f"| {label} | {k['products']} | {k['us']:,.0f} | {k['tflops']:.0f} | {k['tensor_pipe_pct']:.0f}% "
                     f"| {k['registers']:.0f} | {k['local_load_bytes'] / 1e6:,.0f} "
                     f"| {k['global_red_inst'] / 1e6:,.0f} |")
    return "\n".join(lines) + "\n"


def b1_launch_sweep(directory: Path | None = None) -> list[dict] | None:
    """b1 over cuDNN's backward at its default launch and at the best launch of the newest
    ``*-backward-launches.json`` (benchmarks/sweep_backward_launches.py: one kernel's launch changed at a time, key
    ``ratio_vs_sdpa_cudnn``), per (head_dim, n, causal): {head_dim, n, causal, default, best, varied, launch};
    None without a sweep."""
    newest = _newest("*-backward-launches.json", directory)
    if newest is None:
        return None
    found = []
    rows = [r for r in newest[1] if r.get("scheme") == "b1" and r.get("ratio_vs_sdpa_cudnn") is not None]
    for key in dict.fromkeys((r["head_dim"], r["n"], r["causal"]) for r in rows):
        mine = [r for r in rows if (r["head_dim"], r["n"], r["causal"]) == key]
        default = next((r for r in mine if r["varied"] == "default"), None)
        if default is None:
            continue
        best = max(mine, key=lambda r: r["ratio_vs_sdpa_cudnn"])
        config = best[f"{best['varied']}_config"] if best["varied"] in ("dq", "dkdv") else None
        found.append({"head_dim": key[0], "n": key[1], "causal": key[2], "default": default["ratio_vs_sdpa_cudnn"],
                      "best": best["ratio_vs_sdpa_cudnn"], "varied": best["varied"],
                      "launch": _launch(config) if config else "default"})
    return found


# ------------------------------------------------------- lesson 08: FlashAttention-3's backward design, measured
# The backwards lesson 08 sets side by side, as ``provider`` names them in a ``*-b7-designs.json`` run: b1 (seven
# products, dQ from a kernel of its own) and b7, b7b, b7c (five products, FlashAttention-3's design in Gluon).
BACKWARD_DESIGNS = ("b1", "b7", "b7b", "b7c")
# The Nsight Compute run of those kernels beside cuDNN's: provider -> text in the name of the kernel that computes
# the five products (the others of a case, Delta's preprocess, zeroing dQ's buffer, dQ's conversion, compute none).
DESIGN_PROFILE_KERNELS = {"sdpa_cudnn": "flash_bprop", "b7": "_b7_kernel", "b7b": "_b7_kernel", "b7c": "_b7_kernel",
                          "b7d": "_b7_kernel", "b7e": "_b7_kernel", "b7f": "_b7_kernel", "b7g": "_b7_kernel",
                          "b8": "_b8_kernel", "b8c": "_b8_kernel", "b8d": "_b8_kernel"}


def backward_designs(directory: Path | None = None) -> dict | None:
    """b1, b7, b7b and b7c over cuDNN's backward in the newest ``*-b7-designs.json`` (rows of ``kind`` "time",
    key ``ratio_vs_sdpa_cudnn``, with its range ``_min`` / ``_max`` over the repeats); None when none is committed.

    ``rows``: one per (dtype, head_dim, causal) in the file's order, {dtype, head_dim, causal, cudnn_tflops,
    ratios: {design: ratio}, ranges: {design: (min, max)}}; a design whose row did not run is left out of both.
    ``checks``: {variant: {passed, of}} over the rows of ``kind`` "check" (gradients against float64), and
    ``expected``: {variant: the prediction written before the run (``meta.<variant>.expected``)}, and
    ``query_rows``: {head_dim: the query rows of one step of b7 (``meta.block_m``)}.
    Also ``shape`` (batch, heads, n), ``device``, ``date``, ``triton`` and ``file``."""
    # the profile of the same kernels, ``*-ncu-b7-designs.json``, matches the pattern too: its kind differs
    runs = [data for data in load_results("*-b7-designs.json", directory=directory)
            if data["meta"].get("kind") == "b7"]
    if not runs:
        return None
    meta, rows, name = runs[-1]["meta"], runs[-1]["rows"], Path(runs[-1]["path"]).name
    timed = [r for r in rows if r.get("kind") == "time" and r.get("status") == "ok"]
    shapes = {(r["batch"], r["heads"], r["n"]) for r in timed}
    if len(shapes) != 1:
        raise ValueError(f"{name}: the timed rows hold {len(shapes)} shapes (batch, heads, n), {sorted(shapes)}; "
                         "one figure compares one shape: keep one shape per file")
    table = {}
    for row in timed:
        case = (row["dtype"], row["head_dim"], row["causal"])
        entry = table.setdefault(case, {"dtype": case[0], "head_dim": case[1], "causal": case[2],
                                        "cudnn_tflops": None, "ratios": {}, "ranges": {}})
        if row["provider"] == "sdpa_cudnn":
            entry["cudnn_tflops"] = row["tflops"]
        elif row["provider"] in BACKWARD_DESIGNS:
            entry["ratios"][row["provider"]] = row["ratio_vs_sdpa_cudnn"]
            entry["ranges"][row["provider"]] = (row.get("ratio_vs_sdpa_cudnn_min", row["ratio_vs_sdpa_cudnn"]),
                                                row.get("ratio_vs_sdpa_cudnn_max", row["ratio_vs_sdpa_cudnn"]))
    for entry in table.values():  # each case's designs in BACKWARD_DESIGNS' order, as the figure draws them
        for key in ("ratios", "ranges"):
            entry[key] = {design: entry[key][design] for design in BACKWARD_DESIGNS if design in entry[key]}
    variants = [v for v in BACKWARD_DESIGNS if isinstance(meta.get(v), dict)]
    checked = [r for r in rows if r.get("kind") == "check"]
    checks = {v: {"passed": sum(r["provider"] == v and r.get("status") == "ok" for r in checked),
                  "of": sum(r["provider"] == v for r in checked)} for v in variants}
    ((batch, heads, n),) = shapes
    return {"device": meta["device"], "date": meta["date"], "triton": meta.get("triton"), "file": name,
            "shape": {"batch": batch, "heads": heads, "n": n}, "rows": list(table.values()), "checks": checks,
            "expected": {v: meta[v].get("expected") for v in variants},
            "query_rows": {int(head_dim): rows for head_dim, rows in meta.get("block_m", {}).items()}}


def backward_designs_profile(directory: Path | None = None) -> dict | None:
    """The kernel that computes the five products of each backward in the newest ``*-ncu-b7-designs.json`` (Nsight
    Compute: b7, b7b, b7c and cuDNN at one shape); None when none is committed.

    ``kernels``: {provider: {kernel, us (its time), total_us (every kernel of the backward), tensor_pipe_pct (share
    of the SM's active cycles the tensor pipe was busy), issue_active_pct, registers, shared_bytes, top_stalls}} in
    the run's order; also ``shape`` (the cases' one shape), ``device``, ``date`` and ``file``."""
    newest = _newest("*-ncu-b7-designs.json", directory)
    if newest is None:
        return None
    meta, rows, name = newest
    cases = {case: info for case, info in meta["cases"].items() if info.get("status") == "ok"}
    shapes = {tuple(sorted(info["shape"].items())) for info in cases.values()}
    if len(shapes) != 1:
        raise ValueError(f"{name}: the profiled cases ran {len(shapes)} shapes: their times do not compare")
    kernels = {}
    for case, info in cases.items():
        provider, mine = info["provider"], [r for r in rows if r["case"] == case]
        found = [r for r in mine if DESIGN_PROFILE_KERNELS.get(provider, "\0") in r["kernel"]]
        if len(found) != 1:
            raise ValueError(f"{name}: expected one kernel named like {DESIGN_PROFILE_KERNELS.get(provider)!r} in "
                             f"case {case}, found {[r['kernel'][:60] for r in found] or 'none'}")
        row = found[0]
        kernels[provider] = {"kernel": row["kernel"], "us": row["duration_us"],
                             "total_us": sum(r["duration_us"] for r in mine),
                             "tensor_pipe_pct": row["tensor_pipe_pct"], "issue_active_pct": row["issue_active_pct"],
                             "registers": row["registers_per_thread"], "shared_bytes": row["dynamic_shared_bytes"],
                             "top_stalls": [stall for stall, _ in row["top_stalls"]]}
    (shape,) = shapes
    return {"device": meta["device"], "date": meta["date"], "file": name, "shape": dict(shape), "kernels": kernels}


def _launched_warps(row: dict) -> int:
    """Warps a kernel launched: the programs of its grid times the warps of a block (Nsight Compute's strings)."""
    grid = [int(x) for x in row["grid"].strip("()").split(",")]
    block = [int(x) for x in row["block"].strip("()").split(",")]
    return grid[0] * grid[1] * grid[2] * (block[0] * block[1] * block[2] // 32)


# The small kernels around a backward's product kernel, as lesson 08 names them: text in the kernel's name -> label.
SMALL_BACKWARD_KERNELS = (("_b7_stats_kernel", "stats (lse, Delta)"), ("FillFunctor", "zero-fill of dQ's buffer"),
                          ("_dq_convert_kernel", "dQ convert"), ("compute_dot_do_o", "dot_do_o (Delta)"),
                          ("convert_dq_to_16bits", "dQ convert"))


def _small_kernel_label(kernel: str) -> str:
    return next((label for text, label in SMALL_BACKWARD_KERNELS if text in kernel), kernel[:40])


def backward_stall_sites(directory: Path | None = None, *, run: str = "b7c") -> dict | None:
    """Where the warps of each backward's product kernel waited, by instruction, in the newest
    ``*-ncu-<run>-by-instruction.json`` (``ncu_limits.py --by-instruction``: Nsight Compute's Source Counters; run
    "b7c" profiled b7c and cuDNN, run "b7d" b7c, b7d and cuDNN, run "b7e" b7d and b7e); None when none is
    committed.

    Per provider: ``kernel``, ``us`` (its time), ``instructions`` (warp instructions executed),
    ``issue_active_pct`` (share of cycles a scheduler issued one), ``cycles_per_instruction`` (the warps' cycles
    between two issued instructions), ``stalls`` ({reason: those cycles spent waiting for it}), ``barrier`` (the
    same for barriers), ``tensor_pipe_pct``, ``shared_wavefronts``, ``bank_conflicts`` (shared-memory wavefronts
    replayed for a bank conflict), ``waves`` (the grid's programs over what the GPU runs at once), ``top_sites``
    (the recorded sites, most samples first: {sass, share of the samples, executed, reason}), ``others`` (the case's
    kernels that compute no product, as [(label, us, DRAM bytes)] in launch order) and ``once_per_warp``: the
    barrier cycles, per instruction, at the recorded sites that ran no more often than once per launched warp. A
    warp that reaches such a site once and waits there for the whole kernel does no work while it waits (a warp
    launched to round the program up to whole warpgroups), so ``barrier - once_per_warp`` is what the working
    warps waited. Also ``shape``, ``device``, ``date`` and ``file``."""
    newest = _newest(f"*-ncu-{run}-by-instruction.json", directory)
    if newest is None:
        return None
    meta, rows, name = newest
    found = {}
    for case, info in meta["cases"].items():
        kernel = DESIGN_PROFILE_KERNELS.get(info["provider"])
        mine = [r for r in rows if r["case"] == case and kernel and kernel in r["kernel"] and r.get("stall_sites")]
        if info.get("status") != "ok" or len(mine) != 1:
            continue
        row = mine[0]
        per_sample = row["warp_cycles_per_issued"]  # a site's share of the samples is its share of these cycles
        warps = _launched_warps(row)
        sites = [{"sass": site["sass"], "share": site["share"], "executed": site["executed"],
                  "reason": site["reasons"][0][0], "barrier": dict(site["reasons"]).get("barrier", 0.0)}
                 for site in row["stall_sites"]]
        found[info["provider"]] = {
            "kernel": row["kernel"], "us": row["duration_us"], "cycles_per_instruction": per_sample,
            "instructions": row["inst_executed"], "issue_active_pct": row["issue_active_pct"],
            "stalls": row["stalls"], "barrier": row["stalls"]["barrier"],
            "once_per_warp": sum(s["share"] * s["barrier"] * per_sample for s in sites if s["executed"] <= warps),
            "tensor_pipe_pct": row["tensor_pipe_pct"], "shared_wavefronts": row["shared_lsu_wavefronts"],
            "bank_conflicts": row["shared_bank_conflicts"], "waves": row["waves_per_sm"],
            "launched_warps": warps, "top_sites": sites, "shape": info["shape"],
            "others": [(_small_kernel_label(r["kernel"]), r["duration_us"], r["dram_bytes"])
                       for r in rows if r["case"] == case and r is not row]}
    if not found:
        return None
    shapes = {tuple(sorted(entry.pop("shape").items())) for entry in found.values()}
    if len(shapes) != 1:
        raise ValueError(f"{name}: the profiled cases ran {len(shapes)} shapes: their counters do not compare")
    return {"device": meta["device"], "date": meta["date"], "file": name, "shape": dict(shapes.pop()),
            "kernels": found}


def backward_lengths(directory: Path | None = None, *, variant: str = "b7c") -> dict | None:
    """A Gluon backward (b7c, b7e, b7g; b8 or b8d at D = 256) and b1 over cuDNN's backward by length, from the
    newest ``*-<variant>-lengths.json`` (``gpu_b7.py --variants <variant>``: N = 1024-16384 at B*H*N constant); None
    when none is committed.

    ``rows``: {(dtype, head_dim, causal): {provider: [(n, ratio_vs_sdpa_cudnn), ...] in N's order}} for the variant,
    the other Gluon stages the run timed beside it (``meta.variants``: b7c beside b7e) and b1; ``rates``: the same
    with TFLOP/s for the ratio; ``vs_b1``: the variant's ``ratio_vs_b1`` over every timed row, as (least, most);
    ``expected``: its prediction written before the run (``meta.<variant>.expected``, None if the run has none);
    also ``device``, ``date``, ``triton``, ``file``."""
    newest = _newest(f"*-{variant}-lengths.json", directory)
    if newest is None:
        return None
    meta, rows, name = newest
    providers = tuple(dict.fromkeys((variant, *meta.get("variants", ()), "b1")))
    timed = sorted((r for r in rows if r.get("kind") == "time" and r.get("status") == "ok"
                    and r["provider"] in providers), key=lambda r: r["n"])
    table: dict[tuple, dict] = {}
    rates: dict[tuple, dict] = {}
    for row in timed:
        key = (row["dtype"], row["head_dim"], row["causal"])
        table.setdefault(key, {p: [] for p in providers})[row["provider"]].append((row["n"],
                                                                                   row["ratio_vs_sdpa_cudnn"]))
        rates.setdefault(key, {p: [] for p in providers})[row["provider"]].append((row["n"], row["tflops"]))
    over_b1 = [r["ratio_vs_b1"] for r in timed if r["provider"] == variant]
    if not over_b1:
        return None
    described = meta.get(variant)
    return {"device": meta["device"], "date": meta["date"], "triton": meta.get("triton"), "file": name,
            "rows": table, "rates": rates, "vs_b1": (min(over_b1), max(over_b1)),
            "expected": described.get("expected") if isinstance(described, dict) else None}


def default_backward_grid(directory: Path | None = None, *, tag: str = "t39") -> dict | None:
    """The backward ``flash_attention`` ran (b7c, b7e or b7g, or b1 where no Gluon backward serves) over cuDNN's by
    length, as a user calls it: B = 4 and 2048 / D heads at every N, so a short call is little work. From the newest
    ``*-grid-<tag>-d64.json`` and ``*-grid-<tag>-d128.json`` (``python -m flashcourse.bench attention --head-dim 64
    --tag=-<tag>-d64``, and 128, each file renamed from ``attention-<tag>-...``: the forward's lessons read every
    ``*-attention*.json`` as one grid of the Triton 3.6 dispatch; "t39": under Triton 3.9); None when neither is
    committed.

    ``rows``: {(dtype, head_dim, causal): {backward kernel: [(n, ratio_vs_sdpa_cudnn), ...] in N's order}} (the form
    ``figures_gpu.backward_lengths`` draws); ``ms``: {(dtype, head_dim, causal): [(n, our ms, cuDNN's ms), ...]};
    also ``device``, ``date``, ``triton`` (the first file's) and ``files``."""
    found = [f for f in (_newest(f"*-grid-{tag}-d{d}.json", directory) for d in (64, 128)) if f]
    if not found:
        return None
    ours = [r for _, rows, _ in found for r in rows if r.get("provider") == "flashcourse" and r.get("mode") == "bwd"
            and r.get("status") == "ok" and "ratio_vs_sdpa_cudnn" in r]
    cudnn = {(r["dtype"], r["head_dim"], r["causal"], r["n"]): r["ms"] for _, rows, _ in found for r in rows
             if r.get("provider") == "sdpa_cudnn" and r.get("mode") == "bwd" and r.get("status") == "ok"}
    table: dict[tuple, dict] = {}
    ms: dict[tuple, list] = {}
    for row in sorted(ours, key=lambda r: r["n"]):
        key = (row["dtype"], row["head_dim"], row["causal"])
        table.setdefault(key, {}).setdefault(row["backward_kernel"], []).append((row["n"], row["ratio_vs_sdpa_cudnn"]))
        ms.setdefault(key, []).append((row["n"], row["ms"], cudnn[(*key, row["n"])]))
    meta = found[0][0]
    return {"device": meta["device"], "date": meta["date"], "triton": meta.get("triton"),
            "files": [name for _, _, name in found], "rows": table, "ms": ms}


def prepared_launches(directory: Path | None = None, *, tag: str = "t39", max_n: int = 2048) -> dict | None:
    """The default backward's time per call with its launches made through Triton on every call, and from the
    launches its plan prepared once (``fa3_backward_tma.PREPARED_TRITON``), beside cuDNN's: the newest
    ``*-grid-<tag>-d<D>-through-triton.json`` and ``*-grid-<tag>-d<D>-prepared.json`` of D 64 and 128, two runs of
    ``python -m flashcourse.bench attention`` in one lease, at N <= ``max_n``; None unless both runs of a head dim
    are committed.

    ``ms``: {case label ("fp16, D = 64, causal, N = 1024"): {"through Triton": ms, "prepared": ms, "cuDNN": ms}} in
    the order (head dim, N, dtype, mask), cuDNN's from the prepared run; ``kernels``: the backward kernels that ran;
    also ``device``, ``date``, ``triton`` and ``files``."""
    pairs = []
    for head_dim in (64, 128):
        runs = [_newest(f"*-grid-{tag}-d{head_dim}-{path}.json", directory) for path in ("through-triton", "prepared")]
        if all(runs):
            pairs.append(runs)
    if not pairs:
        return None

    def times(rows, provider):
        return {(r["head_dim"], r["n"], r["dtype"], r["causal"]): r for r in rows if r.get("provider") == provider
                and r.get("mode") == "bwd" and r.get("status") == "ok" and r["n"] <= max_n}

    ms: dict[str, dict[str, float]] = {}
    kernels: set[str] = set()
    for (_, through_rows, _), (_, prepared_rows, _) in pairs:
        through, prepared = times(through_rows, "flashcourse"), times(prepared_rows, "flashcourse")
        cudnn = times(prepared_rows, "sdpa_cudnn")
        for key in sorted(set(through) & set(prepared) & set(cudnn)):
            head_dim, n, dtype, causal = key
            mask = "causal" if causal else "no mask"
            label = f"{'fp16' if dtype == 'float16' else 'bf16'}, D = {head_dim}, {mask}, N = {n}"
            ms[label] = {"through Triton": through[key]["ms"], "prepared": prepared[key]["ms"],
                         "cuDNN": cudnn[key]["ms"]}
            kernels |= {through[key]["backward_kernel"], prepared[key]["backward_kernel"]}
    meta = pairs[0][1][0]
    return {"device": meta["device"], "date": meta["date"], "triton": meta.get("triton"), "ms": ms,
            "kernels": sorted(kernels), "files": [run[2] for pair in pairs for run in pair]}


def backward_variant_checks(directory: Path | None = None, *, run: str = "b8") -> dict | None:
    """The gradient checks and the one-shape timing of a Gluon backward and its variant, from the newest
    ``*-<run>-checks.json`` (``gpu_b7.py --quick --variants b8,b8b``, or ``b7d,b7e,b7f``: checks against float64 at
    N = 1 to 4096, then one (B, H, N) beside cuDNN and b1); None when none is committed.

    ``checks``: {variant: {passed, of}} for each variant the run describes (``meta.<variant>``); ``checked_n``: the
    lengths checked; ``tflops``: {(dtype, head_dim, causal): {provider: TFLOP/s}} of the timed rows; ``expected``:
    {variant: the prediction written before the run}; also ``shape`` (batch, heads, n), ``device``, ``date``,
    ``triton``, ``file``."""
    newest = _newest(f"*-{run}-checks.json", directory)
    if newest is None:
        return None
    meta, rows, name = newest
    variants = [v for v in meta.get("variants", ()) if isinstance(meta.get(v), dict)]
    checked = [r for r in rows if r.get("kind") == "check"]
    timed = [r for r in rows if r.get("kind") == "time" and r.get("status") == "ok"]
    shapes = {(r["batch"], r["heads"], r["n"]) for r in timed}
    if len(shapes) != 1:
        raise ValueError(f"{name}: the timed rows hold {len(shapes)} shapes (batch, heads, n), {sorted(shapes)}; "
                         "a one-shape comparison needs one")
    tflops: dict[tuple, dict] = {}
    for row in timed:
        tflops.setdefault((row["dtype"], row["head_dim"], row["causal"]), {})[row["provider"]] = row["tflops"]
    ((batch, heads, n),) = shapes
    return {"device": meta["device"], "date": meta["date"], "triton": meta.get("triton"), "file": name,
            "shape": {"batch": batch, "heads": heads, "n": n}, "tflops": tflops,
            "checks": {v: {"passed": sum(r["provider"] == v and r.get("status") == "ok" for r in checked),
                           "of": sum(r["provider"] == v for r in checked)} for v in variants},
            "checked_n": sorted({r["n"] for r in checked}),
            "expected": {v: meta[v].get("expected") for v in variants}}


def backward_tile_step(directory: Path | None = None) -> dict | None:
    """b7d (64-row query tiles at D = 128) against b7c, from the newest ``*-b7d-lengths.json`` (``gpu_b7.py
    --variants b7c,b7d``, both timed at every length in one run); None when none is committed.

    ``cases``: {(dtype, head_dim): {"over_b7c": (least, most), "over_cudnn": (least, most)}}, over both masks and
    every length (b7d's TFLOP/s over b7c's at the same shape; b7d's ``ratio_vs_sdpa_cudnn``); also ``device``,
    ``date``, ``file``."""
    newest = _newest("*-b7d-lengths.json", directory)
    if newest is None:
        return None
    meta, rows, name = newest
    timed = {(r["provider"], r["dtype"], r["head_dim"], r["causal"], r["n"]): r for r in rows
             if r.get("kind") == "time" and r.get("status") == "ok" and r["provider"] in ("b7c", "b7d")}
    pairs: dict[tuple, list] = {}
    for (provider, *shape), row in timed.items():
        base = timed.get(("b7c", *shape))
        if provider == "b7d" and base is not None:
            pairs.setdefault((shape[0], shape[1]), []).append((row["tflops"] / base["tflops"],
                                                                row["ratio_vs_sdpa_cudnn"]))
    if not pairs:
        return None
    cases = {case: {"over_b7c": (min(a for a, _ in found), max(a for a, _ in found)),
                    "over_cudnn": (min(c for _, c in found), max(c for _, c in found))}
             for case, found in sorted(pairs.items())}
    return {"device": meta["device"], "date": meta["date"], "file": name, "cases": cases}

# ----------------------------------------------------------------- lesson 13: where the forward still trails cuDNN
# benchmarks/ncu_limits.py's forward-gap cases (``gpu_run.sh gaps``): (label, our case, cuDNN's case).
FORWARD_GAP_PAIRS = (
    ("D = 128, N = 4096", "fwd-d128-n4096-ours", "fwd-d128-n4096-cudnn"),
    ("D = 128, N = 4096, causal", "fwd-d128-n4096-causal-ours", "fwd-d128-n4096-causal-cudnn"),
    ("D = 64, N = 4096, causal", "fwd-d64-n4096-causal-ours", "fwd-d64-n4096-causal-cudnn"),
)


def forward_gaps(directory: Path | None = None) -> dict | None:
    """The forward-gap pairs of the newest ``*-ncu-gaps.json`` (Nsight Compute, one kernel each): per label,
    ours and cuDNN's row with the counters lesson 13 reads; None when no such profile is recorded."""
    newest = _newest("*-ncu-gaps.json", directory)
    if newest is None:
        return None
    meta, rows, name = newest
    by_case = {row["case"]: row for row in rows}
    pairs = {label: (by_case[ours], by_case[theirs]) for label, ours, theirs in FORWARD_GAP_PAIRS
             if ours in by_case and theirs in by_case}
    return {"source": _source(meta, name), "pairs": pairs} if pairs else None


def forward_gaps_table(gaps: dict) -> str:
    """Ours against cuDNN per forward-gap pair: time, tensor pipe busy, share of cycles issuing an instruction,
    warps waiting at a barrier per issuing cycle, and shared memory a program."""
    lines = [f"Nsight Compute ({gaps['source']}), ours / cuDNN:", "",
             f"{'':28}{'time (us)':>18}{'tensor pipe':>16}{'issuing':>16}{'barrier waits':>16}{'shared KB':>14}"]
    for label, (ours, theirs) in gaps["pairs"].items():
        cells = [f"{ours['duration_us']:.0f} / {theirs['duration_us']:.0f}",
                 f"{ours['tensor_pipe_pct']:.0f}% / {theirs['tensor_pipe_pct']:.0f}%",
                 f"{ours['issue_active_pct']:.0f}% / {theirs['issue_active_pct']:.0f}%",
                 f"{ours['stalls']['barrier']:.1f} / {theirs['stalls']['barrier']:.1f}",
                 f"{ours['dynamic_shared_bytes'] / 1024:.0f} / {theirs['dynamic_shared_bytes'] / 1024:.0f}"]
        lines.append(f"{label:28}" + "".join(f"{c:>{w}}" for c, w in zip(cells, (18, 16, 16, 16, 14), strict=True)))
    return "\n".join(lines)
