"""Each widget driven through its controls, as a learner would click, and what it shows checked against the
states the algorithm itself yields (computed afresh here, on fresh random inputs)."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from flashcourse import iomodel, plots, reference, tiled, widgets


def _shown(readout_html: str, css_class: str):
    """The exact value behind the element with ``css_class`` in a readout (its data-value attribute)."""
    match = re.search(rf'class="{css_class}" data-value="([^"]*)"', readout_html)
    assert match, f"no element with class {css_class} in the readout"
    raw = match.group(1).replace("&quot;", '"').replace("&#x27;", "'").replace("&amp;", "&")
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw


def test_online_softmax_stepper_walks_the_algorithm_states(rng):
    x = rng.standard_normal(20) * 4  # spread out, so the running max grows several times
    values = rng.standard_normal((20, 3))
    stepper = widgets.online_softmax_stepper(x, block=6, values=values)
    expected = list(reference.softmax_online_steps(x, 6, values))
    assert len(stepper.steps) == len(expected) == 4
    assert stepper.prev_button.disabled and not stepper.next_button.disabled
    for index, state in enumerate(expected):
        html = stepper.readout.value
        assert _shown(html, "fc-step") == index
        assert _shown(html, "fc-m") == state.m
        assert _shown(html, "fc-l") == state.l
        assert _shown(html, "fc-rescale") == state.rescale
        assert _shown(html, "fc-block") == f"{state.start}:{state.stop}"
        np.testing.assert_array_equal(_shown(html, "fc-output"), state.output)
        assert stepper.image.value[:4] == b"\x89PNG"
        stepper.next_button.click()
    assert stepper.index == len(expected) - 1 and stepper.next_button.disabled
    final = expected[-1]
    assert final.m == np.max(x)
    np.testing.assert_allclose(final.output, reference.softmax_safe(x) @ values, rtol=1e-12)
    stepper.prev_button.click()
    assert _shown(stepper.readout.value, "fc-m") == expected[-2].m and not stepper.next_button.disabled


def test_online_softmax_stepper_without_values_shows_no_output(rng):
    stepper = widgets.online_softmax_stepper(rng.standard_normal(8), block=4)
    assert 'class="fc-output"' not in stepper.readout.value


def test_tile_explorer_shows_the_forward_states_and_follows_its_controls():
    explorer = widgets.tile_explorer(n=48, d=8, block_q=16, block_k=16, causal=False, seed=3)
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((48, 8)) for _ in range(3))
    expected = list(tiled.forward_steps(q, k, v, block_q=16, block_k=16))
    assert explorer.step_slider.max == len(expected) - 1 == 8
    explorer.step_slider.value = 4
    html, state = explorer.readout.value, expected[4]
    assert _shown(html, "fc-tile") == f"({state.tile.i}, {state.tile.j})"
    assert _shown(html, "fc-q-rows") == f"{state.tile.q_start}:{state.tile.q_stop}"
    assert _shown(html, "fc-k-rows") == f"{state.tile.k_start}:{state.tile.k_stop}"
    assert _shown(html, "fc-m") == float(state.m[0]) and _shown(html, "fc-l") == float(state.l[0])

    explorer.causal_checkbox.value = True
    causal_tiles = tiled.tile_schedule(48, 48, 16, 16, causal=True)
    causal_states = list(tiled.forward_steps(q, k, v, causal=True, block_q=16, block_k=16))
    assert explorer.step_slider.value == 0 and explorer.step_slider.max == len(causal_states) - 1 == 5
    assert _shown(explorer.readout.value, "fc-skipped") == sum(t.kind == "skipped" for t in causal_tiles) == 3
    explorer.step_slider.value = 2
    assert _shown(explorer.readout.value, "fc-kind") == causal_states[2].tile.kind == "diagonal"

    explorer.block_k_slider.value = 8
    assert explorer.step_slider.max == len(list(tiled.forward_steps(q, k, v, causal=True, block_q=16,
                                                                     block_k=8))) - 1
    explorer.n_slider.value = 64
    assert explorer.states[-1].tile.q_stop == 64


def test_io_explorer_reports_the_simulator_counts():
    explorer = widgets.io_explorer(n_values=(64, 128), d_values=(8, 16), sram_values=(1024, 4096), n=64, d=8,
                                   sram=1024, seed=5)
    for n, d, sram in ((64, 8, 1024), (128, 8, 1024), (128, 16, 1024), (128, 16, 4096)):
        explorer.n_slider.value, explorer.d_slider.value, explorer.sram_slider.value = n, d, sram
        rng = np.random.default_rng(5)
        q, k, v = (rng.standard_normal((n, d)) for _ in range(3))
        standard = iomodel.simulate("standard", q, k, v, sram=sram)[1]
        flash = iomodel.simulate("flash", q, k, v, sram=sram)[1]
        html = explorer.readout.value
        assert (_shown(html, "fc-n"), _shown(html, "fc-d"), _shown(html, "fc-sram")) == (n, d, sram)
        assert _shown(html, "fc-standard") == standard.total
        assert _shown(html, "fc-flash") == flash.total
        assert _shown(html, "fc-ratio") == pytest.approx(standard.total / flash.total)
    assert explorer.image.value[:4] == b"\x89PNG"


def test_io_explorer_says_when_the_sram_is_too_small():
    explorer = widgets.io_explorer(n_values=(64,), d_values=(128,), sram_values=(256,), n=64, d=128, sram=256)
    assert "SRAM" in _shown(explorer.readout.value, "fc-error")


def _shown_text(readout_html: str, css_class: str) -> str:
    """The visible text of the element with ``css_class`` (what a learner reads)."""
    match = re.search(rf'class="{css_class}" data-value="[^"]*">([^<]*)</span>', readout_html)
    assert match, f"no element with class {css_class} in the readout"
    return match.group(1)


def _css_size(widget) -> tuple[int, int]:
    """The size in CSS pixels at which a widget's picture is shown: its layout width, its PNG's aspect ratio."""
    png_width, png_height = widgets.png_size(widget.image.value)
    assert widget.image.layout.width, "the picture has no explicit width: a VBox would stretch it to the cell"
    width = int(widget.image.layout.width.removesuffix("px"))
    assert width == png_width // widgets.OVERSAMPLE, (
        f"picture drawn {png_width} px wide but shown {width} px: expected {png_width // widgets.OVERSAMPLE} "
        f"(drawn at {widgets.OVERSAMPLE}x the shown size)")
    return width, round(png_height * width / png_width)


def test_pictures_are_shown_at_their_drawn_size_and_fit_a_laptop_screen(rng):
    stepper = widgets.online_softmax_stepper(rng.standard_normal(16), block=4)
    explorer = widgets.tile_explorer(n=64, d=16, block_q=16, block_k=16, causal=True)
    io = widgets.io_explorer(n_values=(64,), d_values=(8,), sram_values=(1024,), n=64, d=8, sram=1024)
    for widget in (stepper, explorer, io):
        width, height = _css_size(widget)
        assert width <= 900 and height <= 600, f"{type(widget).__name__} picture {width}x{height} px"
    # The explorer puts its controls beside the picture: the step slider and the tile it moves are on screen
    # together in a 1400 x 900 window.
    (row,) = explorer.children
    column, image = row.children
    assert isinstance(row, widgets.w.HBox) and image is explorer.image
    assert explorer.step_slider in column.children and explorer.readout in column.children


def test_one_step_numbering_in_slider_readout_and_figure(rng):
    explorer = widgets.tile_explorer(n=48, d=8, block_q=16, block_k=16)
    for step in (0, 4, explorer.step_slider.max):
        explorer.step_slider.value = step
        html = explorer.readout.value
        assert _shown(html, "fc-step") == step
        assert _shown_text(html, "fc-step").startswith(f"{step} "), _shown_text(html, "fc-step")
        assert explorer.figure_title.startswith(f"step {step} "), explorer.figure_title
    x = rng.standard_normal(12)
    stepper = widgets.online_softmax_stepper(x, block=4)
    for index in range(len(stepper.steps)):
        html = stepper.readout.value
        assert _shown(html, "fc-step") == index and _shown_text(html, "fc-step").startswith(f"{index} ")
        title = plots.online_softmax_state(x, stepper.steps, index).axes[0].get_title()
        assert title.startswith(f"step {index}:"), title
        stepper.next_button.click()


@pytest.mark.parametrize("make, match", [
    (lambda: widgets.online_softmax_stepper(np.zeros(0)), "at least one score"),
    (lambda: widgets.tile_explorer(n=1000), "n=1000: the slider offers multiples of 16 from 16 to 256"),
    (lambda: widgets.tile_explorer(block_q=0), "block_q=0"),
    (lambda: widgets.tile_explorer(block_k=6), "block_k=6"),
    (lambda: widgets.tile_explorer(d=0), "d must be a positive int"),
    (lambda: widgets.io_explorer(n=100), "n=100 is not among the n values offered"),
    (lambda: widgets.io_explorer(sram=5), "sram=5"),
    (lambda: plots.ring_schedule(0), "world=0"),
    (lambda: plots.step_time([4096], world=2, heads=8, head_dim=64, tflops=0.0, link_gbs=450.0), "rates"),
    (lambda: plots.roofline({"a laptop": (100.0, 0.0)}), "a laptop: peak 100.0 GFLOP/s and bandwidth 0.0"),
], ids=["empty row", "n past the slider", "block 0", "block off the step", "d 0", "n not offered",
        "sram not offered", "no ranks", "zero rate", "zero bandwidth"])
def test_a_value_the_controls_cannot_show_is_refused_by_name(make, match):
    """The sliders would quietly move such a value into their range (n = 1000 shown as 256), an empty row raised
    IndexError, a zero bandwidth ZeroDivisionError."""
    with pytest.raises(ValueError, match=match):
        make()
