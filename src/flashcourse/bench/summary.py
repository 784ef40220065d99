"""The README's GPU results: a summary table written from the committed benchmark JSON, never by hand.

``python -m flashcourse.bench table --write`` rewrites it (with docs/KERNELS.md's version table), and
tests/test_results_docs.py checks that the committed README matches a fresh generation. A figure recorded with
repeats shows their range, ``544 (538-551)``; older files, without it, show the median alone.
"""

from __future__ import annotations

from pathlib import Path

from flashcourse.bench import format_spread, load_results

README_START, README_END = "<!-- gpu-results:start -->", "<!-- gpu-results:end -->"
SUMMARY_NS = (4096, 16384)


def _find(rows, **match):
    for row in rows:
        if all(row.get(k) == v for k, v in match.items()) and row.get("status") == "ok":
            return row
    return None


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
    lines = [
        f"Forward and backward, fp16, B = 4, measured on {meta['device']} on {meta['date']} (torch {meta['torch']}, "
        f"triton {meta['triton']}; `{name}`). TFLOP/s of our default kernels and the ratio to "
        f"each PyTorch SDPA backend timed in the same run:{_repeats_note(rows)}",
        "",
        "| H x D | N | causal | pass | ours TFLOP/s | vs SDPA flash | vs cuDNN | vs efficient |",
        "|---|---|---|---|---|---|---|---|",
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
                                        else "-" for p in ("sdpa_flash", "sdpa_cudnn", "sdpa_efficient"))
                    lines.append(f"| {heads} x {head_dim} | {n} | {'yes' if causal else 'no'} | {mode} | "
                                 f"{format_spread(ours)} | {ratios} |")
    return "\n".join(lines) + "\n"


def decode_summary(directory: Path | None = None) -> str:
    """Flash-Decoding: effective bandwidth of our split-KV kernel against SDPA at each cache length."""
    newest = _newest("*-decode.json", directory)
    if newest is None:
        return ""
    meta, rows, name = newest
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

    lines = [
        f"Attention variants, B = 4 (GQA: 2), H = 16 (GQA: 32 query heads on 8 KV heads), D = 128, N = 16384 "
        f"(GQA: 8192), on {meta['device']} on {meta['date']} (`{name}`); TFLOP/s over the visible score entries "
        f"only, FlexAttention compiled with its block mask built outside the timed region:{_repeats_note(rows)}",
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
        cells = [variant, dtype.replace("float", "fp"), mode, f"{ours['density']:.0%}", rate(ours), rate(get["flex"]),
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
