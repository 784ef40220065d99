"""Every colour a lesson figure fills a shape with is in its legend, and colours that mean different things look
different (lesson 03's "full" and "done" tiles were two close blues)."""

from __future__ import annotations

import numpy as np
from matplotlib.colors import to_rgb
from matplotlib.patches import Patch, Rectangle

from flashcourse import plots, reference, tiled


def _luminance(colour) -> float:
    """WCAG relative luminance of an sRGB colour."""
    channels = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in to_rgb(colour)]
    return 0.2126 * channels[0] + 0.7152 * channels[1] + 0.0722 * channels[2]


def _contrast(a, b) -> float:
    """WCAG contrast ratio: 1 for the same lightness, 21 for black on white."""
    light, dark = sorted((_luminance(a), _luminance(b)), reverse=True)
    return (light + 0.05) / (dark + 0.05)


def _legend_colours(fig) -> dict[str, tuple]:
    legends = [ax.get_legend() for ax in fig.axes if ax.get_legend()] + list(fig.legends)
    return {text.get_text(): tuple(np.round(to_rgb(handle.get_facecolor()), 3))
            for legend in legends for text, handle in zip(legend.get_texts(), legend.legend_handles, strict=True)
            if isinstance(handle, (Patch, Rectangle))}


def _filled_colours(fig) -> set[tuple]:
    return {tuple(np.round(to_rgb(patch.get_facecolor()), 3)) for ax in fig.axes for patch in ax.patches
            if patch.get_fill() and patch.get_facecolor()[3] > 0}


def _tile_map():
    tiles = tiled.tile_schedule(64, 64, 16, 16, causal=True)
    computed = [t for t in tiles if t.kind != "skipped"]
    return plots.tile_map(tiles, current=computed[4], done=computed[:4], sram_note="Q[16:32]")


def test_done_tiles_stand_apart_from_every_tile_kind():
    colours = _legend_colours(_tile_map())
    for kind in ("full", "diagonal", "skipped", "masked"):
        assert _contrast(colours["done"], colours[kind]) >= 3, (
            f"'done' and '{kind}' tiles differ by a contrast of only {_contrast(colours['done'], colours[kind]):.2f}")


def test_the_tile_map_legend_names_every_colour_it_fills():
    fig = _tile_map()
    assert _filled_colours(fig) <= set(_legend_colours(fig).values())


def test_the_online_softmax_legend_names_every_bar_colour():
    x = np.random.default_rng(0).standard_normal(16)
    steps = list(reference.softmax_online_steps(x, block=4))
    fig = plots.online_softmax_state(x, steps, 2)
    legend = _legend_colours(fig)
    assert _filled_colours(fig) <= set(legend.values()), (_filled_colours(fig), legend)
    assert _contrast(legend["read before"], legend["not read yet"]) >= 3
