"""The lessons' interactive apps: thin ipywidgets shells over :mod:`flashcourse.plots`.

Each app collects the states an algorithm yields (``reference.softmax_online_steps``, ``tiled.forward_steps``,
``iomodel.simulate``) and only draws them: nothing here recomputes a softmax, a tile or a traffic count.

Every app is a ``VBox`` (display it by leaving it as a cell's last line) that also exposes its controls
(``.next_button``, ``.n_slider``, ...) so a test can drive it without a browser, and shows its numbers in an
``HTML`` widget (``.readout``) whose elements carry stable CSS classes (``fc-step``, ``fc-m``, ...) with the
exact value in a ``data-value`` attribute, for a browser test to read. The picture is a PNG in ``.image``, shown
at the size it was drawn. Steps are numbered from 0 everywhere (readout, slider, figure titles), as the blocks and
tiles they show are.
"""

from __future__ import annotations

import html
import io
import json
from collections.abc import Sequence

from ._extras import missing

try:
    import ipywidgets as w
except ImportError as error:  # not in the core install
    raise missing("course", "ipywidgets", __name__) from error
import numpy as np

from . import iomodel, plots, reference, tiled

__all__ = ["IOExplorer", "OnlineSoftmaxStepper", "TileExplorer", "io_explorer", "online_softmax_stepper", "png_size",
           "tile_explorer"]


# A figure is shown at CSS_DPI pixels per inch of its size, and drawn at OVERSAMPLE times that, so that its text
# stays sharp on high-density screens. The image gets that width explicitly: left to itself, a flex column
# (VBox) stretches it to the full width of the notebook, soft and too tall to see beside its controls.
CSS_DPI, OVERSAMPLE = 90, 2


def _png(fig) -> bytes:
    buffer = io.BytesIO()
    # bbox_inches="tight" keeps legends placed outside the axes
    fig.savefig(buffer, format="png", dpi=CSS_DPI * OVERSAMPLE, bbox_inches="tight")
    return buffer.getvalue()


def png_size(png: bytes) -> tuple[int, int]:
    """(width, height) in pixels of a PNG, read from its header."""
    if png[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG image")
    return int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")


def _show(image: w.Image, fig) -> None:
    """Put ``fig`` in ``image`` at its drawn size (CSS pixels), never stretched to the cell's width."""
    png = _png(fig)
    width, _ = png_size(png)
    image.value = png
    image.layout.width = f"{width // OVERSAMPLE}px"
    image.layout.height = "auto"
    image.layout.max_width = "100%"  # on a narrow window, shrink (keeping the aspect ratio) rather than clip


def _step_label(index: int, count: int) -> str:
    """Steps count from 0, like the blocks, tiles and slider they correspond to: "3 (steps 0 to 9)"."""
    return f"{index} (steps 0 to {count - 1})"


def _field(css_class: str, label: str, value, shown: str | None = None) -> str:
    """One labelled number: the exact value in data-value, a rounded one as the visible text."""
    if shown is None:
        shown = f"{value:.6g}" if isinstance(value, float) else str(value)
    exact = value if isinstance(value, str) else json.dumps(value)  # floats round-trip exactly
    return (f'<div>{html.escape(label)}: <span class="{css_class}" '
            f'data-value="{html.escape(exact)}">{html.escape(shown)}</span></div>')


def _readout(fields: Sequence[str]) -> str:
    return '<div class="fc-readout" style="font-family: monospace">' + "".join(fields) + "</div>"


# --------------------------------------------------------------------------------------------- lesson 02
class OnlineSoftmaxStepper(w.VBox):
    """Step through ``reference.softmax_online_steps(x, block, values)`` with Prev / Next.

    Shows the block read, m, l, the rescale factor exp(m_prev - m) and (with values) the running output.
    """

    def __init__(self, x, block: int, values=None):
        self.x = np.asarray(x)
        self.steps = list(reference.softmax_online_steps(self.x, block, values))
        if not self.steps:
            raise ValueError(f"x has shape {self.x.shape}: the stepper needs at least one score to step through")
        self.index = 0
        self.prev_button = w.Button(description="Prev", icon="arrow-left")
        self.next_button = w.Button(description="Next", icon="arrow-right")
        self.readout = w.HTML()
        self.image = w.Image(format="png")
        self.prev_button.on_click(lambda _: self.show(self.index - 1))
        self.next_button.on_click(lambda _: self.show(self.index + 1))
        super().__init__([w.HBox([self.prev_button, self.next_button]), self.readout, self.image])
        self.show(0)

    @property
    def step(self) -> reference.OnlineSoftmaxStep:
        """The state shown now."""
        return self.steps[self.index]

    def show(self, index: int) -> None:
        """Show state ``index`` (clamped to the available steps) and enable/disable the buttons."""
        self.index = int(np.clip(index, 0, len(self.steps) - 1))
        step = self.step
        fields = [
            _field("fc-step", "step", step.index, _step_label(step.index, len(self.steps))),
            _field("fc-block", "block read", f"{step.start}:{step.stop}", f"x[{step.start}:{step.stop}]"),
            _field("fc-block-max", "max of this block", step.block_max),
            _field("fc-m-prev", "m before", step.m_prev),
            _field("fc-m", "m (running max)", step.m),
            _field("fc-rescale", "rescale exp(m_prev - m)", step.rescale),
            _field("fc-l-prev", "l before", step.l_prev),
            _field("fc-l", "l = rescale * l_prev + sum(exp(block - m))", step.l),
        ]
        if step.output is not None:
            output = np.atleast_1d(step.output).tolist()
            fields.append(_field("fc-output", "running output acc / l", output,
                                 "[" + ", ".join(f"{v:.4g}" for v in output) + "]"))
        self.readout.value = _readout(fields)
        _show(self.image, plots.online_softmax_state(self.x, self.steps, self.index))
        self.prev_button.disabled = self.index == 0
        self.next_button.disabled = self.index == len(self.steps) - 1


def online_softmax_stepper(x, block: int = 4, values=None) -> OnlineSoftmaxStepper:
    """The lesson 02 stepper over one row x (N,), read ``block`` entries at a time; values: (N,) or (N, D_v)
    to also show the fused running output."""
    return OnlineSoftmaxStepper(x, block, values)


# --------------------------------------------------------------------------------------------- lesson 03
class TileExplorer(w.VBox):
    """Choose N, block sizes and causal; step through the tiles ``tiled.forward_steps`` computes.

    Steps count from 0, as the slider does: step 0 is the first tile computed.
    The figure marks the tile whose Q block and K/V blocks are in SRAM at the chosen step, the tiles already
    done, and the tiles a causal mask skips; the readout gives the tile, its kind and the query block's m, l.
    """

    RANGES = {"n": (16, 256, 16), "block_q": (4, 64, 4), "block_k": (4, 64, 4)}  # each slider's min, max, step

    def __init__(self, n: int = 64, d: int = 16, block_q: int = 16, block_k: int = 16, causal: bool = False,
                 seed: int = 0):
        reference.validate_block("d", d)
        self.d, self.seed = d, seed
        self.n_slider, self.block_q_slider, self.block_k_slider = (
            self._slider(name, value, *self.RANGES[name]) for name, value in
            (("n", n), ("block_q", block_q), ("block_k", block_k)))
        self.causal_checkbox = w.Checkbox(value=causal, description="causal")
        self.step_slider = w.IntSlider(value=0, min=0, max=0, description="step")
        self.readout = w.HTML()
        self.image = w.Image(format="png")
        for control in (self.n_slider, self.block_q_slider, self.block_k_slider, self.causal_checkbox):
            control.observe(lambda _: self._run(), names="value")
        self.step_slider.observe(lambda _: self._draw(), names="value")
        # Controls and readout in a column beside the figure, so the step slider and the tile it moves are both
        # on screen (a 1400 x 900 window holds the two side by side).
        column = w.VBox([self.n_slider, self.block_q_slider, self.block_k_slider, self.causal_checkbox,
                         self.step_slider, self.readout])
        super().__init__([w.HBox([column, self.image])])
        self._run()

    @staticmethod
    def _slider(name: str, value, low: int, high: int, step: int) -> w.IntSlider:
        if not (isinstance(value, int) and low <= value <= high and value % step == 0):  # a slider would move it
            raise ValueError(f"{name}={value!r}: the slider offers multiples of {step} from {low} to {high}")
        return w.IntSlider(value=value, min=low, max=high, step=step, description="N" if name == "n" else name)

    def _run(self) -> None:
        """New inputs or sizes: collect the forward's states once; drawing then only replays them."""
        n = self.n_slider.value
        rng = np.random.default_rng(self.seed)
        q, k, v = (rng.standard_normal((n, self.d)) for _ in range(3))
        kwargs = dict(causal=self.causal_checkbox.value, block_q=self.block_q_slider.value,
                      block_k=self.block_k_slider.value)
        self.tiles = tiled.tile_schedule(n, n, kwargs["block_q"], kwargs["block_k"], causal=kwargs["causal"])
        self.states = list(tiled.forward_steps(q, k, v, **kwargs))
        with self.step_slider.hold_trait_notifications():
            self.step_slider.value = 0
            self.step_slider.max = len(self.states) - 1
        self._draw()

    @property
    def state(self) -> tiled.TileState:
        """The state shown now."""
        return self.states[self.step_slider.value]

    def _draw(self) -> None:
        index = self.step_slider.value
        state = self.states[index]
        tile = state.tile
        skipped = sum(t.kind == "skipped" for t in self.tiles)
        fields = [
            _field("fc-step", "step", index, _step_label(index, len(self.states))),
            _field("fc-tile", "tile (i, j)", f"({tile.i}, {tile.j})"),
            _field("fc-kind", "kind", tile.kind),
            _field("fc-q-rows", "Q, O rows in SRAM", f"{tile.q_start}:{tile.q_stop}"),
            _field("fc-k-rows", "K, V rows in SRAM", f"{tile.k_start}:{tile.k_stop}"),
            _field("fc-computed", "tiles computed", len(self.states)),
            _field("fc-skipped", "tiles skipped", skipped),
            _field("fc-m", "running max m of the query block (first row)", float(state.m[0])),
            _field("fc-l", "running sum l of the query block (first row)", float(state.l[0])),
        ]
        self.readout.value = _readout(fields)
        done = [s.tile for s in self.states[:index]]
        note = (f"SRAM holds Q[{tile.q_start}:{tile.q_stop}], K, V[{tile.k_start}:{tile.k_stop}] "
                "and the S tile")
        self.figure_title = f"step {_step_label(index, len(self.states))}: tile ({tile.i}, {tile.j})"
        _show(self.image, plots.tile_map(self.tiles, current=tile, done=done, sram_note=note,
                                         title=self.figure_title))


def tile_explorer(n: int = 64, d: int = 16, block_q: int = 16, block_k: int = 16, causal: bool = False,
                  seed: int = 0) -> TileExplorer:
    """The lesson 03 explorer over random q, k, v (n, d) drawn from ``seed``: sliders for N, block sizes,
    causal and the step."""
    return TileExplorer(n, d, block_q, block_k, causal, seed)


# --------------------------------------------------------------------------------------------- lesson 04
class IOExplorer(w.VBox):
    """N, d and M sliders; runs ``iomodel.simulate`` for "standard" and "flash" and shows their traffic."""

    def __init__(self, n_values: Sequence[int] = (256, 512, 1024, 2048),
                 d_values: Sequence[int] = (16, 32, 64, 128),
                 sram_values: Sequence[int] = (4096, 16384, 65536, 262144), *, n: int = 512, d: int = 64,
                 sram: int = 65536, seed: int = 0):
        for name, value, values in (("n", n, n_values), ("d", d, d_values), ("sram", sram, sram_values)):
            if value not in values:
                raise ValueError(f"{name}={value!r} is not among the {name} values offered, {list(values)}")
        self.seed = seed
        self.n_slider = w.SelectionSlider(options=list(n_values), value=n, description="N")
        self.d_slider = w.SelectionSlider(options=list(d_values), value=d, description="d")
        self.sram_slider = w.SelectionSlider(options=[(f"{m:,}", m) for m in sram_values], value=sram,
                                             description="M (elements)")
        self.readout = w.HTML()
        self.image = w.Image(format="png")
        for control in (self.n_slider, self.d_slider, self.sram_slider):
            control.observe(lambda _: self._run(), names="value")
        super().__init__([self.n_slider, self.d_slider, self.sram_slider, self.readout, self.image])
        self._run()

    def _run(self) -> None:
        n, d, sram = self.n_slider.value, self.d_slider.value, self.sram_slider.value
        rng = np.random.default_rng(self.seed)
        q, k, v = (rng.standard_normal((n, d)) for _ in range(3))
        self.stats: dict[str, iomodel.IOStats] = {}
        self.error = None
        try:
            for algorithm in ("standard", "flash"):
                self.stats[algorithm] = iomodel.simulate(algorithm, q, k, v, sram=sram)[1]
        except (iomodel.SramOverflowError, ValueError) as error:
            self.error = str(error)
        self._draw(n, d, sram)

    def _draw(self, n: int, d: int, sram: int) -> None:
        fields = [_field("fc-n", "N", n), _field("fc-d", "d", d), _field("fc-sram", "M (elements)", sram)]
        if self.error is not None:
            fields.append(_field("fc-error", "cannot run", self.error))
            self.readout.value = _readout(fields)
            self.image.value = b""  # no stale picture of the previous settings under the error
            return
        standard, flash = self.stats["standard"], self.stats["flash"]
        block_r, block_c = iomodel.flash_block_sizes(sram, d, n)
        fields += [
            _field("fc-standard", "standard: reads + writes (elements)", standard.total,
                   f"{standard.total:,}"),
            _field("fc-flash", "flash: reads + writes (elements)", flash.total, f"{flash.total:,}"),
            _field("fc-ratio", "standard / flash", standard.total / flash.total),
            _field("fc-blocks", "flash blocks (B_r, B_c)", f"({block_r}, {block_c})"),
            _field("fc-peak", "flash peak SRAM use (elements)", flash.peak_sram, f"{flash.peak_sram:,}"),
        ]
        self.readout.value = _readout(fields)
        title = f"HBM traffic at N={n}, d={d}, M={sram:,}"
        _show(self.image, plots.traffic_bars(self.stats, title=title))


def io_explorer(n_values: Sequence[int] = (256, 512, 1024, 2048), d_values: Sequence[int] = (16, 32, 64, 128),
                sram_values: Sequence[int] = (4096, 16384, 65536, 262144), *, n: int = 512, d: int = 64,
                sram: int = 65536, seed: int = 0) -> IOExplorer:
    """The lesson 04 explorer: choose N, d, M from the given values; counts come from ``iomodel.simulate``."""
    return IOExplorer(n_values, d_values, sram_values, n=n, d=d, sram=sram, seed=seed)
