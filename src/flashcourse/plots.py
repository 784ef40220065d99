"""Every figure the lessons show: each function takes numbers the algorithms already returned and draws them.

Each returns a :class:`matplotlib.figure.Figure` with a title, labelled axes and units, built without pyplot's
global state, so it works headless (tests, CI) and in a notebook alike (a Figure displays itself in Jupyter).
Nothing here computes attention, a softmax or a traffic count: the callers pass states and results in (lesson
12's ring figures ask ``distributed.schedule`` and ``distributed.cost`` for the schedule and the step costs).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from ._extras import missing

try:
    from matplotlib import colormaps
    from matplotlib.colors import ListedColormap
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch, Rectangle
    from matplotlib.ticker import MaxNLocator
except ImportError as error:  # not in the core install
    raise missing("course", "matplotlib", __name__) from error

from .distributed import cost, schedule  # NumPy-only parts of distributed: no torch.distributed needed

__all__ = [
    "bar_chart",
    "causal_alignment",
    "exp_share_sweep",
    "fa4_stage_ratios",
    "grouped_bars",
    "matrix_heatmaps",
    "memory_capacities",
    "memory_hierarchy",
    "memory_vs_n",
    "online_softmax_state",
    "ring_schedule",
    "roofline",
    "rule_tile_maps",
    "stage_model_vs_measured",
    "step_time",
    "tile_map",
    "tile_order",
    "traffic_bars",
    "traffic_by_step",
    "traffic_vs",
]

# One colour per tile kind, used by every tile figure so the lessons read alike.
TILE_COLOURS = {"skipped": "#eeeeee", "full": "#9ecae1", "diagonal": "#fdd49e", "masked": "#fdae6b"}
# What an algorithm has done (dark purple: far in hue and lightness from every pale tile kind above) and what it
# works on now (red); a row's values not read yet are light grey.
_CURRENT, _DONE, _NOT_YET = "#d62728", "#54278f", "#dddddd"


def _figure(width: float = 6.4, height: float = 4.0, ncols: int = 1) -> tuple[Figure, list]:
    fig = Figure(figsize=(width, height), layout="constrained")
    axes = [fig.add_subplot(1, ncols, c + 1) for c in range(ncols)]
    return fig, axes


# --------------------------------------------------------------------------------------------- lesson 00
def roofline(machines: Mapping[str, tuple[float, float]], intensities: Mapping[str, float] | None = None, *,
             title: str = "Roofline: attainable compute rate vs arithmetic intensity") -> Figure:
    """Log-log roofline: min(peak, bandwidth x intensity) for each machine.

    machines: name -> (peak compute in GFLOP/s, memory bandwidth in GB/s).
    intensities: operation name -> arithmetic intensity in FLOP/byte, drawn as vertical lines.
    """
    for name, (peak, bandwidth) in machines.items():
        if not (0 < peak < float("inf") and 0 < bandwidth < float("inf")):
            raise ValueError(f"{name}: peak {peak!r} GFLOP/s and bandwidth {bandwidth!r} GB/s must be positive "
                             "and finite (a log-log plot)")
    fig, (ax,) = _figure(7.5, 4.8)
    all_ridges = [peak / bw for peak, bw in machines.values()]
    spots = list((intensities or {}).values())
    low = min([*all_ridges, *spots, 1.0]) / 8
    high = max([*all_ridges, *spots, 1.0]) * 8
    x = np.geomspace(low, high, 200)
    for name, (peak, bandwidth) in machines.items():
        line = ax.plot(x, np.minimum(peak, bandwidth * x), label=f"{name}: {peak:,.0f} GFLOP/s, "
                       f"{bandwidth:,.0f} GB/s")[0]
        ax.plot([peak / bandwidth], [peak], "o", color=line.get_color())
    for name, intensity in (intensities or {}).items():
        ax.axvline(intensity, color="grey", linestyle=":", linewidth=1)
        # x in data units, y in axes fraction: the label sits at the top of its line whatever the y range.
        # A white box keeps the label readable where a roofline crosses it.
        ax.text(intensity, 0.98, name, rotation=90, va="top", ha="right", fontsize=8, color="dimgrey",
                transform=ax.get_xaxis_transform(),
                bbox=dict(facecolor="white", edgecolor="none", alpha=0.85, pad=1.5))
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel("attainable rate (GFLOP/s)")
    ax.set_title(title)
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(True, which="both", alpha=0.3)
    return fig


def memory_hierarchy(levels: Mapping[str, tuple[float, float]], *,
                     title: str = "Memory hierarchy: capacity vs bandwidth") -> Figure:
    """Each memory level as a point: capacity (bytes) against bandwidth (GB/s), both on log axes.

    levels: name -> (capacity in bytes, bandwidth in GB/s).
    """
    fig, (ax,) = _figure(6.4, 4.2)
    for name, (capacity, bandwidth) in levels.items():
        ax.plot([capacity], [bandwidth], "o", markersize=8)
        ax.annotate(name, (capacity, bandwidth), textcoords="offset points", xytext=(6, 4), fontsize=8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("capacity (bytes)")
    ax.set_ylabel("bandwidth (GB/s)")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.margins(0.3)
    return fig


def memory_capacities(capacities: Mapping[str, Mapping[str, float]], *,
                      title: str = "GPU memory levels: capacity") -> Figure:
    """Grouped horizontal bars on a log axis: the capacity in bytes of each memory level, one bar per GPU.

    capacities: level name -> {GPU name -> bytes}; levels are drawn top to bottom in the order given.
    """
    levels = list(capacities)
    gpus = list(dict.fromkeys(gpu for per_gpu in capacities.values() for gpu in per_gpu))
    fig, (ax,) = _figure(7.5, 0.5 * len(levels) * max(1, len(gpus)) / 1.5 + 1.6)
    height = 0.8 / len(gpus)
    for g, gpu in enumerate(gpus):
        # the first GPU on top within each level's group, as the legend lists them
        ys = [len(levels) - 1 - row + ((len(gpus) - 1) / 2 - g) * height for row in range(len(levels))]
        values = [capacities[level].get(gpu, np.nan) for level in levels]
        bars = ax.barh(ys, values, height=height * 0.9, label=gpu)
        for y, value in zip(ys, values, strict=True):
            if np.isfinite(value):
                ax.text(value, y, f" {_bytes(value)}", va="center", fontsize=7, color=bars.patches[0].get_facecolor())
    ax.set_yticks(range(len(levels)), levels[::-1], fontsize=8)
    ax.set_xscale("log")
    ax.set_xlabel("capacity (bytes, log scale)")
    ax.set_ylabel("memory level")
    ax.set_title(title)
    ax.legend(fontsize=8, loc="upper right")  # the short bars of the per-SM levels leave that corner empty
    ax.grid(True, axis="x", which="major", alpha=0.3)
    ax.margins(x=0.25)
    return fig


def _bytes(value: float) -> str:
    """A byte count in KB, MB or GB (powers of 1024 for KB, powers of 1000 above, as data sheets write them)."""
    if value < 1e6:
        return f"{value / 1024:,.0f} KB"
    if value < 1e9:
        return f"{value / 1e6:,.1f} MB"
    return f"{value / 1e9:,.0f} GB"


# --------------------------------------------------------------------------------------------- lesson 01
def matrix_heatmaps(matrices: Mapping[str, np.ndarray], *, title: str, xlabel: str = "key index j",
                    ylabel: str = "query index i", colorbar_label: str = "value") -> Figure:
    """Several 2-D arrays side by side as heatmaps (scores, probabilities); -inf entries show blank."""
    fig, axes = _figure(4.0 * len(matrices), 3.8, ncols=len(matrices))
    for ax, (name, matrix) in zip(axes, matrices.items(), strict=True):
        shown = np.where(np.isfinite(matrix), matrix, np.nan)
        image = ax.imshow(shown, cmap="viridis", interpolation="nearest")
        ax.set_title(name)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        fig.colorbar(image, ax=ax, shrink=0.8, label=colorbar_label)
    fig.suptitle(title)
    return fig


def causal_alignment(masks: Mapping[str, np.ndarray], *,
                     title: str = "Causal masks when N_q != N_k: which keys each query sees") -> Figure:
    """One panel per boolean (N_q, N_k) mask: allowed entries coloured, masked ones grey, one cell per entry.

    masks: name -> boolean array, True where query i may attend to key j. A row with no allowed key is
    outlined in red (its output is defined as 0).
    """
    fig, axes = _figure(3.2 * len(masks) + 0.6, 3.4, ncols=len(masks))
    for ax, (name, mask) in zip(axes, masks.items(), strict=True):
        mask = np.asarray(mask, dtype=bool)
        n_q, n_k = mask.shape
        colours = np.where(mask[..., None], np.array([0.42, 0.68, 0.84]), np.array([0.93, 0.93, 0.93]))
        ax.imshow(colours, interpolation="nearest", extent=(-0.5, n_k - 0.5, n_q - 0.5, -0.5))
        ax.set_xticks(np.arange(-0.5, n_k, 1), minor=True)
        ax.set_yticks(np.arange(-0.5, n_q, 1), minor=True)
        ax.grid(which="minor", color="white", linewidth=1)
        ax.tick_params(which="minor", length=0)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        for row in np.flatnonzero(~mask.any(axis=1)):
            ax.add_patch(Rectangle((-0.5, row - 0.5), n_k, 1, fill=False, edgecolor=_CURRENT, linewidth=1.5))
        ax.set_title(name, fontsize=9)
        ax.set_xlabel(f"key index j (N_k = {n_k})")
        ax.set_ylabel(f"query index i (N_q = {n_q})")
    handles = [Patch(facecolor=(0.42, 0.68, 0.84), label="attends"), Patch(facecolor=(0.93, 0.93, 0.93),
               label="masked"), Patch(facecolor="none", edgecolor=_CURRENT, label="row sees no key")]
    fig.legend(handles=handles, loc="outside lower center", ncols=3, fontsize=8)
    fig.suptitle(title)
    return fig


def memory_vs_n(ns: Sequence[int], measured_bytes: Mapping[str, Sequence[float]],
                predicted_bytes: Mapping[str, Sequence[float]] | None = None, *,
                title: str = "Peak memory vs sequence length") -> Figure:
    """Measured peak memory (MB) against N on log-log axes, one line per implementation, with optional
    predicted curves (dashed). measured_bytes, predicted_bytes: name -> bytes at each N."""
    fig, (ax,) = _figure()
    for name, values in measured_bytes.items():
        ax.plot(ns, np.asarray(values) / 1e6, "o-", label=f"{name} (measured)")
    for name, values in (predicted_bytes or {}).items():
        ax.plot(ns, np.asarray(values) / 1e6, "--", label=name)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("sequence length N (tokens)")
    ax.set_ylabel("peak memory (MB)")
    ax.set_title(title)
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    return fig


def traffic_by_step(steps: Mapping[str, float], *, unit: str = "MB", scale: float = 1e6,
                    title: str = "HBM traffic of the three-step implementation") -> Figure:
    """Horizontal bars, one per line of the algorithm (bytes / ``scale``); a "total" entry is left out."""
    items = [(name, value) for name, value in steps.items() if name != "total"]
    fig, (ax,) = _figure(7.0, 0.45 * len(items) + 1.5)
    names = [name for name, _ in items][::-1]
    values = [value / scale for _, value in items][::-1]
    ax.barh(names, values, color="#6baed6")
    for y, value in enumerate(values):
        ax.text(value, y, f" {value:,.1f}", va="center", fontsize=8)
    ax.set_xlabel(f"bytes moved ({unit})")
    ax.set_ylabel("step")
    ax.set_title(title)
    ax.margins(x=0.2)
    return fig


# --------------------------------------------------------------------------------------------- lesson 02
def online_softmax_state(x: np.ndarray, steps: Sequence, index: int, *,
                         title: str = "Online softmax, block by block") -> Figure:
    """The row x with the blocks read so far, and the running max m and sum l after each step up to ``index``.

    steps: the states from ``reference.softmax_online_steps`` (each with start, stop, m, l, rescale).
    """
    fig, (ax_row, ax_stats) = _figure(9.0, 3.6, ncols=2)
    step = steps[index]
    positions = np.arange(len(x))
    colours = np.where(positions < step.start, _DONE, _NOT_YET).astype(object)
    colours[step.start:step.stop] = _CURRENT
    ax_row.bar(positions, x, color=list(colours), width=0.9)
    line = ax_row.axhline(step.m, color="black", linestyle="--", linewidth=1, label=f"running max m = {step.m:.3g}")
    ax_row.set_xlabel("position in the row")
    ax_row.set_ylabel("score x (logit)")
    ax_row.set_title(f"step {step.index}: block x[{step.start}:{step.stop}] read")
    # Below the axes, so the legend never hides a bar whatever the row holds.
    bars = [Patch(facecolor=_DONE, label="read before"), Patch(facecolor=_CURRENT, label="read now"),
            Patch(facecolor=_NOT_YET, label="not read yet")]
    ax_row.legend(handles=[*bars, line], fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.22),
                  frameon=False, ncols=2)
    seen = steps[:index + 1]
    blocks = [s.index for s in seen]
    ax_stats.plot(blocks, [s.m for s in seen], "o-", label="m (running max)")
    ax_stats.plot(blocks, [s.l for s in seen], "s-", label="l (running sum of exp(x - m))")
    ax_stats.plot(blocks, [s.rescale for s in seen], "^:", label="rescale exp(m_prev - m)")
    ax_stats.set_xlim(-0.5, len(steps) - 0.5)
    ax_stats.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax_stats.set_xlabel("step (block index, from 0)")
    ax_stats.set_ylabel("value (dimensionless)")
    ax_stats.set_title("running statistics")
    ax_stats.legend(fontsize=8)
    ax_stats.grid(True, alpha=0.3)
    fig.suptitle(title)
    return fig


# --------------------------------------------------------------------------------------------- lesson 03
def _tile_grid(ax, tiles: Sequence, n_q: int, n_k: int) -> None:
    for tile in tiles:
        ax.add_patch(Rectangle((tile.k_start, tile.q_start), tile.k_stop - tile.k_start,
                               tile.q_stop - tile.q_start, facecolor=TILE_COLOURS[tile.kind],
                               edgecolor="white", linewidth=1.5))
    ax.set_xlim(0, n_k)
    ax.set_ylim(n_q, 0)  # query 0 at the top, as a matrix is written
    ax.set_aspect("equal")
    ax.set_xlabel("key index j (token)")
    ax.set_ylabel("query index i (token)")


def tile_map(tiles: Sequence, *, current=None, done: Sequence = (), sram_note: str | None = None,
             title: str = "Tiles of the score matrix") -> Figure:
    """The N_q x N_k score matrix cut into tiles coloured by kind (full, diagonal, skipped).

    tiles: from ``tiled.tile_schedule``; ``current``: the tile in SRAM now (outlined red, with its Q rows and
    K/V columns marked on the margins); ``done``: tiles already folded into the running output.
    """
    n_q = max(t.q_stop for t in tiles)
    n_k = max(t.k_stop for t in tiles)
    fig, (ax,) = _figure(5.6, 5.0)
    _tile_grid(ax, tiles, n_q, n_k)
    for tile in done:
        ax.add_patch(Rectangle((tile.k_start, tile.q_start), tile.k_stop - tile.k_start,
                               tile.q_stop - tile.q_start, facecolor=_DONE, edgecolor="white", linewidth=1.5))
    if current is not None:
        width, height = current.k_stop - current.k_start, current.q_stop - current.q_start
        ax.add_patch(Rectangle((current.k_start, current.q_start), width, height, facecolor=_CURRENT,
                               alpha=0.6, edgecolor=_CURRENT, linewidth=2.5))
        ax.axhspan(current.q_start, current.q_stop, color=_CURRENT, alpha=0.08)
        ax.axvspan(current.k_start, current.k_stop, color=_CURRENT, alpha=0.08)
    handles = [Patch(facecolor=colour, label=kind) for kind, colour in TILE_COLOURS.items()]
    handles += [Patch(facecolor=_DONE, label="done")]
    if current is not None:
        handles += [Patch(facecolor=_CURRENT, alpha=0.6, edgecolor=_CURRENT, label="in SRAM now"),
                    Patch(facecolor=_CURRENT, alpha=0.08, label="its Q rows and K, V columns")]
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_title(title if sram_note is None else f"{title}\n{sram_note}", fontsize=10)
    return fig


def tile_order(orders: Mapping[str, Sequence], *, title: str = "Order in which tiles are visited") -> Figure:
    """One panel per loop order; each computed tile carries its visit number (skipped tiles stay blank).

    orders: name -> the tiles in the order the algorithm visits them (skipped ones included or not).
    """
    fig, axes = _figure(5.0 * len(orders), 4.6, ncols=len(orders))
    for ax, (name, tiles) in zip(axes, orders.items(), strict=True):
        n_q = max(t.q_stop for t in tiles)
        n_k = max(t.k_stop for t in tiles)
        _tile_grid(ax, tiles, n_q, n_k)
        visited = [t for t in tiles if t.kind != "skipped"]
        for number, tile in enumerate(visited):
            ax.text((tile.k_start + tile.k_stop) / 2, (tile.q_start + tile.q_stop) / 2, str(number),
                    ha="center", va="center", fontsize=8)
        ax.set_title(name)
    kinds = {t.kind for tiles in orders.values() for t in tiles}
    if len(kinds) > 1:  # with a causal mask, say what the colours mean (unnumbered tiles are skipped)
        fig.legend(handles=[Patch(facecolor=colour, label=kind) for kind, colour in TILE_COLOURS.items()
                            if kind in kinds], loc="outside lower center", ncols=len(kinds), fontsize=8)
    fig.suptitle(title)
    return fig


def rule_tile_maps(panels: Mapping[str, tuple[Sequence, np.ndarray]], *,
                   title: str = "Which tiles each rule computes") -> Figure:
    """One panel per attention rule: its tiles coloured by kind (skipped, partial, full) and, over them, the
    entries the rule keeps (dark). panels: name -> (tiles from ``tiled.tile_schedule``, boolean (N_q, N_k) mask).
    """
    fig, axes = _figure(3.3 * len(panels) + 0.4, 3.9, ncols=len(panels))
    for ax, (name, (tiles, mask)) in zip(axes, panels.items(), strict=True):
        mask = np.asarray(mask, dtype=bool)
        n_q, n_k = mask.shape
        _tile_grid(ax, tiles, n_q, n_k)
        overlay = np.zeros((n_q, n_k, 4))
        overlay[mask] = (0.03, 0.19, 0.42, 0.4)  # kept entries dark blue, masked ones transparent
        ax.imshow(overlay, interpolation="nearest", extent=(0, n_k, n_q, 0), zorder=2)  # over the tiles
        computed = sum(t.kind != "skipped" for t in tiles)
        ax.set_title(f"{name}\n{computed} of {len(tiles)} tiles computed", fontsize=9)
    kinds = [kind for kind in TILE_COLOURS if any(t.kind == kind for _, (tiles, _) in panels.items() for t in tiles)]
    handles = [Patch(facecolor=TILE_COLOURS[kind], label=f"{kind} tile") for kind in kinds]
    handles.append(Patch(facecolor=(0.03, 0.19, 0.42, 0.4), label="entry kept"))
    fig.legend(handles=handles, loc="outside lower center", ncols=len(handles), fontsize=8)
    fig.suptitle(title)
    return fig


# --------------------------------------------------------------------------------------------- lesson 04
def traffic_vs(x_values: Sequence[float], measured: Mapping[str, Sequence[float]],
               formulas: Mapping[str, Sequence[float]] | None = None, *, xlabel: str, title: str,
               ylabel: str = "HBM traffic (elements)", log_x: bool = True) -> Figure:
    """Counted traffic (markers) and formula curves (dashed) against one varying quantity, log-log."""
    fig, (ax,) = _figure(6.8, 4.4)
    for name, values in measured.items():
        ax.plot(x_values, values, "o-", label=f"{name} (counted)")
    for name, values in (formulas or {}).items():
        ax.plot(x_values, values, "--", label=name)
    if log_x:
        ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    return fig


def traffic_bars(stats: Mapping[str, object], *, title: str = "HBM traffic: reads and writes",
                 unit: str = "elements") -> Figure:
    """Stacked reads + writes per algorithm; stats: name -> an object with ``.reads`` and ``.writes``."""
    fig, (ax,) = _figure(5.6, 3.8)
    names = list(stats)
    reads = np.array([stats[n].reads for n in names], dtype=float)
    writes = np.array([stats[n].writes for n in names], dtype=float)
    ax.bar(names, reads, label="reads (HBM -> SRAM)", color="#6baed6")
    ax.bar(names, writes, bottom=reads, label="writes (SRAM -> HBM)", color="#fd8d3c")
    for position, total in enumerate(reads + writes):
        ax.text(position, total, f"{total:,.0f}", ha="center", va="bottom", fontsize=8)
    ax.set_ylabel(f"HBM traffic ({unit})")
    ax.set_xlabel("algorithm")
    ax.set_title(title)
    ax.legend(fontsize=8)
    ax.margins(y=0.15)
    return fig


# --------------------------------------------------------------------------------------------- lesson 05
def bar_chart(values: Mapping[str, float], *, xlabel: str, ylabel: str, title: str,
              log: bool = False) -> Figure:
    """One bar per entry with its value written on top (FLOP counts, peak memory in MB, ...)."""
    fig, (ax,) = _figure(6.0, 3.8)
    names = list(values)
    heights = [values[n] for n in names]
    ax.bar(names, heights, color="#6baed6")
    for position, height in enumerate(heights):
        ax.text(position, height, f"{height:,.3g}", ha="center", va="bottom", fontsize=8)
    if log:
        ax.set_yscale("log")
    ax.set_ylabel(ylabel)
    ax.set_xlabel(xlabel)
    ax.set_title(title)
    ax.margins(y=0.15)
    return fig


def grouped_bars(values: Mapping[str, Mapping[str, float]], *, ylabel: str, title: str,
                 xlabel: str = "variant") -> Figure:
    """Bars grouped by the outer key (a variant, say), one bar per inner key (a provider), values written on top;
    a missing inner key leaves a gap. values: group -> {series: value}."""
    groups = list(values)
    series = list(dict.fromkeys(name for group in values.values() for name in group))
    fig, (ax,) = _figure(max(6.0, 1.1 * len(groups) * max(1, len(series)) ** 0.5 + 2), 4.0)
    width = 0.8 / max(1, len(series))
    for index, name in enumerate(series):
        xs = [g + (index - (len(series) - 1) / 2) * width for g, group in enumerate(groups) if name in values[group]]
        heights = [values[group][name] for group in groups if name in values[group]]
        ax.bar(xs, heights, width, label=name)
        for x, height in zip(xs, heights, strict=True):
            ax.text(x, height, f"{height:,.3g}", ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(groups)), groups, rotation=20, ha="right", fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_xlabel(xlabel)
    ax.set_title(title)
    ax.legend(fontsize=8)
    ax.margins(y=0.15)
    return fig


# ------------------------------------------------------------------------------------------ lesson 12
def ring_schedule(world: int, layouts=("contiguous", "zigzag")):
    """Per layout, the causal chunk-by-chunk attention matrix, each block coloured by the rank computing it and
    labelled with the ring step (and "/2" for a diagonal block, of which only the lower triangle is computed);
    blank blocks are skipped."""
    if isinstance(world, bool) or not isinstance(world, (int, np.integer)) or not 1 <= world <= 10:
        raise ValueError(f"world={world!r}: from 1 to 10 ranks (one colour each) are drawn")
    fig = Figure(figsize=(5 * len(layouts), 4.6))
    axes = fig.subplots(1, len(layouts), squeeze=False)
    colours = ListedColormap(colormaps["tab10"].colors[:world])
    for ax, layout in zip(axes[0], layouts, strict=True):
        chunks = world * schedule.chunks_per_rank(layout)
        owner = np.full((chunks, chunks), np.nan)
        for rank in range(world):
            for step in range(world):
                for (qc, kc), kind in schedule.block_schedule(world, rank, step, layout).items():
                    if kind == "skip":
                        continue
                    owner[qc, kc] = rank
                    ax.text(kc, qc, f"s{step}" + ("/2" if kind == "lower" else ""), ha="center", va="center",
                            fontsize=9 if chunks <= 8 else 7)
        ax.imshow(owner, cmap=colours, vmin=-0.5, vmax=world - 0.5, alpha=0.6)
        work = [sum({"full": 1.0, "lower": 0.5, "skip": 0.0}[k] for s in range(world)
                    for k in schedule.block_schedule(world, r, s, layout).values()) for r in range(world)]
        ax.set_title(f"{layout}\nshare of the work per rank: " + ", ".join(f"{w / sum(work):.0%}" for w in work))
        ax.set_xlabel("key chunk")
        ax.set_ylabel("query chunk")
        ax.set_xticks(range(chunks))
        ax.set_yticks(range(chunks))
    handles = [Rectangle((0, 0), 1, 1, color=colours(r), alpha=0.6) for r in range(world)]
    fig.legend(handles, [f"rank {r}" for r in range(world)], loc="lower center", ncol=world)
    fig.suptitle(f"Causal ring attention over {world} ranks: who computes each block, at which step (s)")
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    return fig


def step_time(seq_lens, *, world: int, heads: int, head_dim: int, tflops: float, link_gbs: float,
              element_bytes: int = 2):
    """Per ring step, forward: milliseconds to compute a block at ``tflops`` and to send a K/V shard at
    ``link_gbs`` GB/s, against the sequence length (causal, zigzag, B = 1). Compute grows as N^2, the transfer
    as N, so above the crossing the transfer hides behind the compute."""
    seq_lens = np.asarray(seq_lens)
    if not (0 < tflops < float("inf") and 0 < link_gbs < float("inf")):
        raise ValueError(f"tflops={tflops!r}, link_gbs={link_gbs!r}: positive, finite rates are expected")
    compute = [cost.ring_step_flops(1, heads, n, head_dim, world) / (tflops * 1e12) * 1e3 for n in seq_lens]
    transfer = [cost.ring_step_bytes(1, heads, n, head_dim, world, element_bytes) / (link_gbs * 1e9) * 1e3
                for n in seq_lens]
    fig = Figure(figsize=(6.5, 4))
    ax = fig.subplots()
    ax.loglog(seq_lens, compute, "o-", label=f"compute a block at {tflops:.0f} TFLOP/s")
    ax.loglog(seq_lens, transfer, "s-", label=f"send a K/V shard at {link_gbs:.0f} GB/s")
    ax.set_xlabel("sequence length N (tokens, whole sequence)")
    ax.set_ylabel("time per ring step (ms)")
    ax.set_title(f"One ring step on {world} GPUs: H={heads}, D={head_dim}, bf16, causal")
    ax.legend()
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    return fig


def stage_model_vs_measured(rows: Sequence[Mapping], *, title: str) -> Figure:
    """Lesson 13, section 8: for each Gluon stage, the simulator's tensor-core utilisation beside the measured
    TFLOP/s as a fraction of the dense peak, one panel per head dim. ``rows``: ``schedule.stage_comparison``."""
    head_dims = sorted({row["head_dim"] for row in rows})
    fig, axes = _figure(4.6 * len(head_dims), 3.8, ncols=len(head_dims))
    for ax, head_dim in zip(axes, head_dims, strict=True):
        mine = [row for row in rows if row["head_dim"] == head_dim]
        x = np.arange(len(mine))
        ax.bar(x - 0.2, [100 * row["model"] for row in mine], 0.4, color="#9ecae1", label="model (simulator)")
        ax.bar(x + 0.2, [100 * row["measured"] for row in mine], 0.4, color="#e6550d", label="measured (H200)")
        ax.set_xticks(x, [row["stage"] for row in mine])
        ax.set_ylim(0, 105)
        ax.set_ylabel("% of the dense FP16 peak (989 TFLOP/s)")
        ax.set_title(f"D = {head_dim}")
        ax.legend(fontsize=8, loc="lower right")
    fig.suptitle(title)
    return fig


def exp_share_sweep(shares: Sequence[float], curves: Mapping[str, Sequence[float]], *, title: str) -> Figure:
    """Lesson 14: the tensor cores' busy share (simulated) against the share of exponentials computed on the FMA
    units, one line per chip and head dim. ``curves``: label -> utilisation at each share (0 to 1)."""
    fig, (ax,) = _figure(6.4, 3.8)
    for label, values in curves.items():
        ax.plot([100 * s for s in shares], [100 * v for v in values], marker="o", markersize=3, label=label)
    ax.set_xlabel("exponentials computed on the FMA units (%)")
    ax.set_ylabel("tensor cores busy (%, simulated)")
    ax.set_ylim(0, 105)
    ax.set_title(title)
    ax.legend(fontsize=8)
    return fig


def fa4_stage_ratios(ratios: Sequence[Mapping], *, title: str) -> Figure:
    """Lesson 14, section 6: each FA4 stage's speed against the stage it builds on, against the length N, one
    panel per head dim and causality, one line per stage and dtype (solid fp16, dashed bf16), a grey line at 1
    (no change). ``ratios``: :func:`flashcourse.fa4.stage_ratios`."""
    head_dims = sorted({row["head_dim"] for row in ratios})
    fig = Figure(figsize=(9.6, 3.2 * len(head_dims)), layout="constrained")
    stages = sorted({row["stage"] for row in ratios})
    colours = dict(zip(stages, ("#1f77b4", "#d62728", "#2ca02c", "#9467bd"), strict=False))
    for i, head_dim in enumerate(head_dims):
        for j, causal in enumerate((False, True)):
            ax = fig.add_subplot(len(head_dims), 2, 2 * i + j + 1)
            mine = [row for row in ratios if row["head_dim"] == head_dim and row["causal"] == causal]
            for stage in stages:
                for dtype, style in (("float16", "-"), ("bfloat16", "--")):
                    line = sorted((row["n"], row["ratio"]) for row in mine
                                  if row["stage"] == stage and row["dtype"] == dtype)
                    if line:
                        ax.plot(*zip(*line, strict=True), style, marker="o", markersize=3, color=colours[stage],
                                label=f"{stage} {'fp16' if dtype == 'float16' else 'bf16'}")
            ax.axhline(1.0, color="grey", linewidth=1)
            ax.set_xscale("log", base=2)
            base = mine[0]["base"] if mine else "base"
            ax.set_title(f"D = {head_dim}, {'causal' if causal else 'non-causal'} (base: {base})")
            ax.set_xlabel("sequence length N")
            ax.set_ylabel(f"speed vs {base} (x)")
            ax.legend(fontsize=7, ncols=3)
    fig.suptitle(title)
    return fig
