"""Figures and tables of the Triton lessons (07, 08): kernel speeds by version, the backward designs over cuDNN's,
and the toy model's loss curves.

Inputs are what the library already returns: benchmark rows in the format of ``flashcourse.bench.attention``
(dicts with provider, mode, shape fields, status, tflops and, for our kernel, forward_version or
backward_version), as saved in ``benchmarks/results/*.json`` or measured live; and loss lists from
``flashcourse.toy``. Each figure is a :class:`matplotlib.figure.Figure` built without pyplot's global state.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from ._extras import missing

try:
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator
except ImportError as error:  # not in the core install
    raise missing("course", "matplotlib", __name__) from error

__all__ = ["attention_grid", "backward_design_ratios", "grouped_bars", "headline_series", "loss_curves",
           "newest_per_shape", "shape_label", "shape_styles", "speed_panels", "version_gains", "version_ladder",
           "version_rates", "version_speeds", "versions_markdown"]

REFERENCES = {"sdpa_flash": "SDPA flash", "sdpa_cudnn": "SDPA cuDNN"}  # the baselines lesson 07 compares with
# Our kernel in a benchmark that times the default kernel (``bench attention``), whose rows name no version.
DEFAULT_LABEL = "ours (default kernel)"


def shape_label(row: Mapping) -> str:
    """A short name for a benchmark row's shape: ``fp16 B4 H16 D128 N4096 causal``."""
    dtype = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}.get(row["dtype"], row["dtype"])
    causal = " causal" if row["causal"] else ""
    return f"{dtype} B{row['batch']} H{row['heads']} D{row['head_dim']} N{row['n']}{causal}"


def _shape_key(row: Mapping) -> tuple:
    return tuple(row[k] for k in ("dtype", "batch", "heads", "head_dim", "n", "causal"))


def newest_per_shape(results: Sequence[Mapping]) -> list[dict]:
    """Rows of several attention-grid result files (``bench.load_results``, oldest first), each shape taken whole
    from the newest file that measured it: a rerun replaces the earlier numbers, and every ratio stays within one
    run. Files of other benchmarks that a glob such as ``*-attention*.json`` also finds (the FP8 run's
    ``attention-fp8``) are left out.

    Each returned row is a copy with ``source_file``, the name of the file it came from.
    """
    from flashcourse.bench import result_kind

    results = [r for r in results if result_kind(r) == "attention"]
    source_of: dict[tuple, int] = {}
    for index, result in enumerate(results):
        for row in result["rows"]:
            source_of[_shape_key(row)] = index  # later files win
    return [{**row, "source_file": str(result["path"]).rsplit("/", 1)[-1]}
            for index, result in enumerate(results) for row in result["rows"]
            if source_of[_shape_key(row)] == index]


def version_rates(rows: Sequence[Mapping], mode: str = "fwd", *,
                  default_label: str = DEFAULT_LABEL) -> dict[str, dict[str, float]]:
    """TFLOP/s by shape, then by kernel: our versions (``v1``.., ``b1``..) and the SDPA baselines of the same run.

    Rows of our kernel that name no version (the attention benchmark times the default kernel) are labelled
    ``default_label``. Rows that did not run (status other than "ok") are left out. The order of versions is the
    rows' order.
    """
    version_key = "forward_version" if mode == "fwd" else "backward_version"
    rates: dict[str, dict[str, float]] = {}
    for row in rows:
        if row.get("mode") != mode or row.get("status") != "ok":
            continue
        if row["provider"] == "flashcourse":
            label = row.get(version_key) or default_label
        elif row["provider"] in REFERENCES:
            label = REFERENCES[row["provider"]]
        else:
            continue
        rates.setdefault(shape_label(row), {})[label] = float(row["tflops"])
    return rates


def _geometric_mean(ratios: Sequence[float]) -> float:
    return float(np.exp(np.mean(np.log(ratios))))


def version_gains(runs: Sequence[Mapping[str, Mapping[str, float]]], versions: Sequence[str]) -> list[dict]:
    """What each version bought over the one before it, run by run, beside what the same kernel measured twice.

    runs: :func:`version_rates` of several runs. For each version after the first: ``gains[causal]``, one
    geometric-mean gain over the previous version per run (shapes split into causal and not), and
    ``rerun[causal]``, the geometric-mean ratio of the version to itself between the first two runs: how much
    the same kernel moved from one run to the next, the noise a gain must beat; ``rerun_range[causal]``, the
    smallest and largest of those per-shape ratios.
    """
    rows = []
    for previous, name in zip(versions[:-1], versions[1:], strict=True):
        row = {"version": name, "previous": previous, "gains": {False: [], True: []}, "rerun": {}, "rerun_range": {}}
        for rates in runs:
            for causal in (False, True):
                ratios = [by[name] / by[previous] for shape, by in rates.items()
                          if shape.endswith("causal") == causal and name in by and previous in by]
                row["gains"][causal].append(_geometric_mean(ratios) - 1 if ratios else None)
        if len(runs) >= 2:
            for causal in (False, True):
                ratios = [runs[1][shape][name] / by[name] for shape, by in runs[0].items()
                          if shape.endswith("causal") == causal and name in by and name in runs[1].get(shape, {})]
                row["rerun"][causal] = _geometric_mean(ratios) - 1 if ratios else None
                row["rerun_range"][causal] = (min(ratios) - 1, max(ratios) - 1) if ratios else None
        rows.append(row)
    return rows


def versions_markdown(rates: Mapping[str, Mapping[str, float]], *, source: str) -> str:
    """A Markdown table: one row per kernel, one column per shape; a cell is the kernel's TFLOP/s and, in
    brackets, its ratio to SDPA flash and to SDPA cuDNN on that shape.

    rates: from :func:`version_rates`; source: where the numbers come from (device, date, file).
    """
    shapes = list(rates)
    kernels = list(dict.fromkeys(k for by_kernel in rates.values() for k in by_kernel))
    header = "| kernel | " + " | ".join(shapes) + " |"
    legend = "Each cell: TFLOP/s (x SDPA flash, x SDPA cuDNN), measured in the same run."
    lines = [source, "", legend, "", header, "|---|" + "---|" * len(shapes)]
    for kernel in kernels:
        cells = []
        for shape in shapes:
            by_kernel = rates[shape]
            if kernel not in by_kernel:
                cells.append("-")
                continue
            ratios = [f"{by_kernel[kernel] / by_kernel[ref]:.2f}" if ref in by_kernel else "-"
                      for ref in REFERENCES.values()]
            cells.append(f"{by_kernel[kernel]:.0f} ({', '.join(ratios)})")
        lines.append(f"| {kernel} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def shape_styles(shapes: Sequence[str]) -> dict[str, dict]:
    """A bar style per shape label that no other shape shares: a shape and its causal twin get the same colour,
    the causal one hatched; colours come from a qualitative map of 10 or 20 colours (then hatches tell
    further groups of 20 apart), so a legend of 20 shapes reads without a repeated entry."""
    from matplotlib import colormaps

    bases = list(dict.fromkeys(shape.removesuffix(" causal") for shape in shapes))
    palette = colormaps["tab10" if len(bases) <= 10 else "tab20"]
    extra_hatches = ["", "..", "xx", "oo", "**"]  # beyond 20 shapes without their causal twin
    styles = {}
    for shape in shapes:
        index = bases.index(shape.removesuffix(" causal"))
        hatch = extra_hatches[(index // palette.N) % len(extra_hatches)] + ("///" if shape.endswith(" causal") else "")
        styles[shape] = {"color": palette(index % palette.N), "hatch": hatch or None, "edgecolor": "white"}
    return styles


def version_speeds(rates: Mapping[str, Mapping[str, float]], *, title: str) -> Figure:
    """Grouped bars: one group per kernel (our versions, then SDPA's), one bar per shape, in TFLOP/s; each shape
    its own colour and hatch (:func:`shape_styles`)."""
    shapes = list(rates)
    kernels = list(dict.fromkeys(k for by_kernel in rates.values() for k in by_kernel))
    fig = Figure(figsize=(max(6.4, 0.9 * len(kernels) + 4), 4.2 + 0.12 * max(0, len(shapes) - 12)),
                 layout="constrained")
    ax = fig.add_subplot()
    width = 0.8 / max(len(shapes), 1)
    x = np.arange(len(kernels))
    styles = shape_styles(shapes)
    for i, shape in enumerate(shapes):
        heights = [rates[shape].get(k, np.nan) for k in kernels]
        ax.bar(x + (i - (len(shapes) - 1) / 2) * width, heights, width, label=shape, **styles[shape])
    ax.set_xticks(x, kernels)
    for tick, kernel in zip(ax.get_xticklabels(), kernels, strict=True):
        if kernel in REFERENCES.values():
            tick.set_fontstyle("italic")  # the baselines, not ours
    ax.set_xlabel("kernel (ours by version, then PyTorch's)")
    ax.set_ylabel("TFLOP/s")
    ax.set_title(title)
    ax.legend(fontsize=8, title="shape", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(axis="y", alpha=0.3)
    return fig


def loss_curves(losses: Mapping[str, Sequence[float]], *, chance: float | None = None,
                title: str = "Training loss, same weights and batches") -> Figure:
    """Left: the loss of every step, one line per run. Right: how far each run is from the first, per step.

    losses: run name -> loss per step; chance: the loss of uniform guessing, drawn as a dashed line.
    """
    fig = Figure(figsize=(10, 3.8), layout="constrained")
    ax_loss, ax_diff = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    names = list(losses)
    styles = ["-", "--", ":", "-."]
    for i, name in enumerate(names):
        values = np.asarray(losses[name], dtype=float)
        ax_loss.plot(np.arange(1, len(values) + 1), values, styles[i % len(styles)], label=name)
    if chance is not None:
        ax_loss.axhline(chance, color="grey", linestyle=":", linewidth=1, label=f"chance ({chance:.2f})")
    ax_loss.set_xlabel("training step")
    ax_loss.set_ylabel("cross-entropy loss (nats)")
    ax_loss.set_title(title)
    ax_loss.legend(fontsize=8)
    first = np.asarray(losses[names[0]], dtype=float)
    steps = np.arange(1, len(first) + 1)
    # one float32 rounding step of the loss: gaps at this level are rounding, not a difference in the maths
    resolution = np.finfo(np.float32).eps * np.abs(first)
    ax_diff.semilogy(steps, resolution, color="grey", linestyle=":", label="float32 resolution of the loss")
    for name in names[1:]:
        gap = np.abs(np.asarray(losses[name], dtype=float) - first)
        # a gap of exactly 0 has no place on a log axis: draw it at half the resolution, below the grey line
        ax_diff.semilogy(steps, np.where(gap > 0, gap, resolution / 2), marker=".", label=name)
    for ax in (ax_loss, ax_diff):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers
    ax_diff.set_xlabel("training step")
    ax_diff.set_ylabel(f"|loss - loss of {names[0]}|")
    ax_diff.set_title("Difference per step")
    ax_diff.legend(fontsize=8)
    return fig


# b1 in grey-blue (the separate dQ kernel, the old default), the three steps of FlashAttention-3's design in ever
# darker oranges: the eye reads b7 -> b7b -> b7c as one family
DESIGN_COLOURS = {"b1": "#6b8bb0", "b7": "#fdae6b", "b7b": "#f16913", "b7c": "#a63603", "b7e": "#238b45",
                  "b8": "#54278f"}


def backward_design_ratios(rows: Sequence[Mapping], *, title: str) -> Figure:
    """Lesson 08: each backward's speed over cuDNN's, one group of bars per (dtype, head dim, causal), one bar per
    design with its range over the repeats as a whisker, the value on top, a line at 1.0 (as fast as cuDNN).

    rows: :func:`flashcourse.bench.summary.backward_designs`' ``rows`` ({dtype, head_dim, causal, ratios: {design:
    ratio}, ranges: {design: (min, max)}}); a design missing from a row leaves a gap."""
    designs = list(dict.fromkeys(design for row in rows for design in row["ratios"]))
    labels = [f"{'fp16' if row['dtype'] == 'float16' else 'bf16'}\nD = {row['head_dim']}\n"
              f"{'causal' if row['causal'] else 'non-causal'}" for row in rows]
    fig = Figure(figsize=(10.5, 4.2), layout="constrained")
    ax = fig.add_subplot()
    width = 0.8 / max(len(designs), 1)
    x = np.arange(len(rows))
    for index, design in enumerate(designs):
        heights = np.array([row["ratios"].get(design, np.nan) for row in rows])
        low, high = (np.array([row["ranges"].get(design, (np.nan, np.nan))[end] for row in rows]) for end in (0, 1))
        centres = x + (index - (len(designs) - 1) / 2) * width
        ax.bar(centres, heights, width, label=design,
               color=DESIGN_COLOURS.get(design, _FALLBACK_COLOURS[index % len(_FALLBACK_COLOURS)]),
               yerr=[heights - low, high - heights], error_kw={"elinewidth": 0.8, "capsize": 1.5})
        for centre, height, top in zip(centres, heights, high, strict=True):
            if not np.isnan(height):  # above the whisker, where no bar or range hides it
                ax.text(centre, top + 0.015, f"{height:.2f}", ha="center", va="bottom", fontsize=6, rotation=90)
    ax.axhline(1.0, color="black", linestyle="--", linewidth=1, label="cuDNN (= 1)")
    ax.set_xticks(x, labels, fontsize=8)
    ax.set_xlabel("case (dtype, head dim, mask)")
    ax.set_ylabel("backward speed / cuDNN's (x)")
    ax.set_title(title, fontsize=11)
    tops = [high for row in rows for _, high in row["ranges"].values()]
    ax.set_ylim(0, max([1.3, *(top + 0.2 for top in tops)]))  # room above the bars for the values written on them
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8, ncols=len(designs) + 1, loc="upper left")
    return fig


def backward_lengths(rows: Mapping[tuple, Mapping], *, title: str) -> Figure:
    """Lesson 08: a Gluon backward's (b7c, b7e, b7g, or b8 at D = 256) and b1's speed over cuDNN's against N, one panel
    per (head dim, mask), fp16 solid and bf16 dashed, a line at 1.0 (as fast as cuDNN).

    rows: :func:`flashcourse.bench.summary.backward_lengths`' ``rows`` ({(dtype, head_dim, causal): {provider:
    [(n, ratio), ...]}})."""
    panels = sorted({(head_dim, causal) for _, head_dim, causal in rows})
    fig = Figure(figsize=(3.2 * len(panels), 3.4), layout="constrained")
    axes = fig.subplots(1, len(panels), sharey=True, squeeze=False)[0]
    for ax, (head_dim, causal) in zip(axes, panels, strict=True):
        for (dtype, d, c), series in rows.items():
            if (d, c) != (head_dim, causal):
                continue
            for provider, points in series.items():
                n, ratio = zip(*points, strict=True) if points else ((), ())
                ax.plot(n, ratio, marker="o", markersize=3, linestyle="-" if dtype == "float16" else "--",
                        color=DESIGN_COLOURS.get(provider, "grey"),
                        label=f"{provider}, {'fp16' if dtype == 'float16' else 'bf16'}")
        ax.axhline(1.0, color="black", linestyle=":", linewidth=1, label="cuDNN (= 1)" if ax is axes[0] else None)
        ax.set_xscale("log", base=2)
        lengths = sorted({n for series in rows.values() for points in series.values() for n, _ in points})
        ax.set_xticks(lengths, [f"{n // 1024}K" for n in lengths])
        ax.set_title(f"D = {head_dim}, {'causal' if causal else 'non-causal'}", fontsize=9)
        ax.set_xlabel("N (keys = queries)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("backward speed / cuDNN's (x)")
    handles, labels = axes[0].get_legend_handles_labels()  # below the panels: no line hidden behind it
    fig.legend(handles, labels, loc="outside lower center", ncols=len(labels), fontsize=8)
    fig.suptitle(title, fontsize=10)
    return fig

def attention_grid(rows: Sequence[Mapping], providers: Sequence[str], *, title: str) -> Figure:
    """The attention benchmark's figure: TFLOP/s against N, one panel per (heads, head dim, pass, causal), one
    line per provider; rows as ``flashcourse.bench.attention`` records them."""
    panels = sorted({(r["heads"], r["head_dim"], r["mode"], r["causal"]) for r in rows if r["mode"] in ("fwd", "bwd")})
    cols = 4
    nrows = max(1, -(-len(panels) // cols))
    fig = Figure(figsize=(4 * cols, 3.2 * nrows))
    axes = fig.subplots(nrows, cols, squeeze=False)
    markers = "os^vDP*Xph"  # with the colour cycle's 10 colours: each provider its own colour and marker
    for ax, (heads, head_dim, mode, causal) in zip(axes.flat, panels, strict=False):
        for index, provider in enumerate(providers):
            points = sorted((r["n"], r["tflops"]) for r in rows if r["provider"] == provider and r["heads"] == heads
                            and r["head_dim"] == head_dim and r["mode"] == mode and r["causal"] == causal
                            and r["status"] == "ok")
            if points:
                ax.plot(*zip(*points, strict=True), marker=markers[index % len(markers)], color=f"C{index % 10}",
                        label=provider)
        ax.set_xscale("log", base=2)
        ax.set_title(f"H={heads} D={head_dim} {mode}{' causal' if causal else ''}")
        ax.set_xlabel("sequence length N")
        ax.set_ylabel("TFLOP/s")
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    if panels:
        axes.flat[0].legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


# --------------------------------------------------------------------------------------------- the website's figures
# One colour per provider on every figure of the website's benchmarks page, ours always the same red and drawn
# thicker, so a reader matches lines across figures at a glance.
PROVIDER_STYLES = {
    "ours": {"color": "#d62728", "linewidth": 2.6, "marker": "o", "zorder": 3},
    "SDPA flash": {"color": "#1f77b4", "linewidth": 1.5, "marker": "s"},
    "SDPA cuDNN": {"color": "#2ca02c", "linewidth": 1.5, "marker": "^"},
    "FlexAttention": {"color": "#9467bd", "linewidth": 1.5, "marker": "D"},
}
_FALLBACK_COLOURS = ["#ff7f0e", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"]


def _style(label: str, index: int) -> dict:
    """A provider's line style: the one of PROVIDER_STYLES whose name the label is or starts with ("ours, paged"
    is drawn as ours is, "SDPA cuDNN (fp16)" as SDPA cuDNN), else a colour of the fallback list by position."""
    for name, style in PROVIDER_STYLES.items():
        if label == name or label.startswith((f"{name} ", f"{name},")):
            return style
    return {"color": _FALLBACK_COLOURS[index % len(_FALLBACK_COLOURS)], "linewidth": 1.5, "marker": "v"}


def speed_panels(series: Mapping[str, Mapping[str, Sequence[tuple[float, float]]]], *, title: str,
                 xlabel: str = "sequence length N", ylabel: str = "TFLOP/s", columns: int = 4) -> Figure:
    """Small panels of lines: one panel per case (``"fwd, H16 D128"``), in it one line per provider through its
    (x, y) points; x on a log2 axis. ``series``: case -> provider label -> points. One legend, above the panels."""
    cases = list(series)
    columns = max(1, min(columns, len(cases)))
    rows = max(1, -(-len(cases) // columns))
    fig = Figure(figsize=(3.6 * columns, 2.9 * rows + 0.7), layout="constrained")
    axes = fig.subplots(rows, columns, squeeze=False, sharey=True)
    labels = list(dict.fromkeys(label for by in series.values() for label in by))
    for ax, case in zip(axes.flat, cases, strict=False):
        for index, label in enumerate(labels):
            points = sorted(series[case].get(label, []))
            if points:
                ax.plot(*zip(*points, strict=True), label=label, **_style(label, index))
        ax.set_xscale("log", base=2)
        xs = sorted({x for points in series[case].values() for x, _ in points})
        ax.set_xticks(xs, [f"{x:g}" for x in xs], fontsize=8)  # the measured lengths, as numbers
        ax.minorticks_off()
        ax.set_title(case, fontsize=10)
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
    for ax in axes[:, 0]:
        ax.set_ylabel(ylabel)
    for ax in list(axes.flat)[len(cases):]:
        ax.axis("off")
    handles = {label: handle for ax in axes.flat for handle, label in zip(*ax.get_legend_handles_labels(),
                                                                          strict=True)}
    fig.legend(list(handles.values()), list(handles), loc="outside lower center", ncols=min(len(handles), 5),
               fontsize=9)
    fig.suptitle(title, fontsize=11)
    return fig


def headline_series(rows: Sequence[Mapping]) -> dict[str, dict[str, list[tuple[float, float]]]]:
    """The attention benchmark's rows as :func:`speed_panels` series: a panel per pass, head shape and mask;
    ours (the default kernels), SDPA flash and SDPA cuDNN, TFLOP/s against N."""
    labels = {"flashcourse": "ours", **REFERENCES}
    series: dict[str, dict[str, list]] = {}
    for row in rows:
        if row.get("status") != "ok" or row.get("mode") not in ("fwd", "bwd") or row["provider"] not in labels:
            continue
        what = "forward" if row["mode"] == "fwd" else "backward"
        case = f"{what}, H{row['heads']} x D{row['head_dim']}{', causal' if row['causal'] else ''}"
        series.setdefault(case, {}).setdefault(labels[row["provider"]], []).append((row["n"], float(row["tflops"])))
    # a row of panels per head shape: forward, forward causal, backward, backward causal
    order = sorted(series, key=lambda case: (case.split(", ")[1], "backward" in case, "causal" in case))
    return {case: series[case] for case in order}


def version_ladder(rates: Mapping[str, Mapping[str, float]], versions: Sequence[str], *, title: str) -> Figure:
    """The version ladder: our versions left to right, one line per shape climbing through them, and at the right
    end, in the same colour, where SDPA flash (square) and SDPA cuDNN (triangle) stand on that shape."""
    shapes = list(rates)
    fig = Figure(figsize=(max(6.0, 0.75 * len(versions) + 4.5), 4.2), layout="constrained")
    ax = fig.add_subplot()
    x = np.arange(len(versions))
    references = list(REFERENCES.values())
    for index, shape in enumerate(shapes):
        colour = f"C{index % 10}"
        ours = [rates[shape].get(v, np.nan) for v in versions]
        ax.plot(x, ours, marker="o", color=colour, linewidth=2, label=shape,
                linestyle="--" if shape.endswith("causal") else "-")
        for offset, (reference, marker) in enumerate(zip(references, "s^", strict=True)):
            if reference in rates[shape]:
                ax.plot(len(versions) + offset, rates[shape][reference], marker=marker, color=colour, markersize=8,
                        linestyle="none")
    ax.set_xticks(np.arange(len(versions) + len(references)), [*versions, *(r.replace(" ", "\n") for r in references)])
    for tick in ax.get_xticklabels()[len(versions):]:
        tick.set_fontstyle("italic")  # PyTorch's, not ours
    ax.axvline(len(versions) - 0.5, color="grey", linewidth=0.8)
    ax.set_xlabel("our kernel, version by version  |  PyTorch's on the same shapes")
    ax.set_ylabel("TFLOP/s")
    ax.set_title(title, fontsize=11)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8, title="shape (dashed: causal)", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return fig


def grouped_bars(values: Mapping[str, Mapping[str, float]], *, title: str, ylabel: str,
                 xlabel: str = "") -> Figure:
    """Bars in groups: one group per case (``values``' keys), in it one bar per provider, each provider named in
    PROVIDER_STYLES in the colour it has on every figure of the page; the value written above each bar."""
    cases = list(values)
    labels = list(dict.fromkeys(label for by in values.values() for label in by))
    fig = Figure(figsize=(max(6.0, 1.0 + 0.42 * len(cases) * len(labels)), 4.0), layout="constrained")
    ax = fig.add_subplot()
    width = 0.8 / max(len(labels), 1)
    x = np.arange(len(cases))
    for index, label in enumerate(labels):
        heights = [values[case].get(label, np.nan) for case in cases]
        colour = PROVIDER_STYLES[label]["color"] if label in PROVIDER_STYLES else \
            _FALLBACK_COLOURS[index % len(_FALLBACK_COLOURS)]  # "ours, paged" must not take ours' colour
        bars = ax.bar(x + (index - (len(labels) - 1) / 2) * width, heights, width, label=label, color=colour)
        ax.bar_label(bars, fmt="%.3g", fontsize=7, padding=1)
    ax.set_xticks(x, cases, fontsize=8, rotation=20 if max(map(len, cases), default=0) > 12 else 0, ha="right"
                  if max(map(len, cases), default=0) > 12 else "center")
    ax.set_ylabel(ylabel)
    if xlabel:
        ax.set_xlabel(xlabel)
    ax.set_title(title, fontsize=11)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8, ncols=min(len(labels), 4), loc="upper left")
    ax.margins(y=0.15)  # room for the values above the bars
    return fig
