"""A warp-schedule simulator for FlashAttention-3's ideas (Shah et al. 2024, sections 3.1-3.2), on the CPU.

One CTA (thread block) on one SM. Its consumer warpgroups each loop over the K/V tiles doing three operations per
tile j: GEMM0 (S = Q K_j^T, on the tensor cores), the softmax of S (exponentials on the special-function units,
MUFU, plus the running max and sum) and GEMM1 (O += P V_j, tensor cores again). Two units do the work:

- **the tensor cores**, one per SM sub-partition but used as one by a warpgroup's ``wgmma``: one GEMM at a time;
- **the exp units** (MUFU): a warpgroup is four warps, one on each of the SM's four sub-partitions, so one
  warpgroup's softmax already keeps every sub-partition's MUFU busy; two softmaxes at once would each run at half
  speed. We model the exp units as one shared unit that runs one softmax at a time.

A *schedule* is one list of operations ``(warpgroup, kind, tile)`` in the order they get their unit: the order in
which the tensor cores take GEMMs, and the exp units softmaxes, and each warpgroup's program order (in a real
kernel, barriers between the warpgroups enforce it). :func:`simulate` runs it:

- a GEMM is asynchronous (``wgmma``): the warpgroup issues it and moves on; it runs when the tensor cores are free;
- a softmax runs on the warpgroup's own threads: the warpgroup is busy until it ends, and it waits for its GEMM0;
- GEMM1 of tile j waits for the softmax of tile j (it multiplies its P) and for GEMM1 of tile j-1 (between the two,
  the online softmax rescales O by exp(m_{j-1} - m_j): the updates of O go tile by tile);
- with a producer (``Latencies.load``), GEMM0 of tile j also waits for the TMA load of K/V tile j into a ring of
  ``stages`` shared-memory buffers, and load j waits until every warpgroup's GEMM1 of tile j - stages freed its
  buffer.

:func:`validate` refuses an order that breaks a dependency, naming it. Latencies default to an H100 SXM5's
published rates (989 TFLOP/s dense FP16 matmul, 3.9 TFLOP/s of special functions, 132 SMs; FA3 section 3); an H200
has the same SMs and clocks. NumPy and the standard library only; :func:`draw_timeline` and :func:`draw_ring`
import matplotlib when called.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from ._extras import missing

KINDS = ("gemm0", "softmax", "gemm1")
GEMMS = ("gemm0", "gemm1")
TENSOR, EXP, TMA = "tensor cores", "exp units", "TMA (producer)"
H100_MATMUL_TFLOPS = 989.0  # dense FP16 / BF16 with FP32 accumulation, H100 SXM5 (FA3 section 3)
H100_EXP_TFLOPS = 3.9  # special functions (exp), H100 SXM5 (FA3 section 3)
H100_SMS = 132


class Op(NamedTuple):
    """One operation of a schedule: ``Op(0, "gemm0", 3)`` is warpgroup 0's S = Q K_3^T. A plain tuple works too."""

    warpgroup: int
    kind: str
    tile: int


class ScheduleError(ValueError):
    """An order the simulator refuses. ``rule`` names what it breaks (for the exercise's diagnoses): "format",
    "duplicate", "missing", "softmax_before_gemm0", "gemm1_before_softmax", "softmax_order", "gemm1_order", "registers",
    "deadlock"."""

    def __init__(self, message: str, rule: str, position: int | None = None):
        super().__init__(message)
        self.rule, self.position = rule, position


@dataclass(frozen=True)
class Latencies:
    """How long each operation takes, in nanoseconds (any unit works if all agree). ``load``: one K/V tile's TMA
    load; None means no producer (the tiles are already in shared memory)."""

    gemm0: float
    softmax: float
    gemm1: float
    load: float | None = None

    def __post_init__(self):
        for name in ("gemm0", "softmax", "gemm1", "load"):
            value = getattr(self, name)
            if value is None and name == "load":
                continue
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
                raise ValueError(f"latency {name}={value!r}: a positive number of nanoseconds is expected")

    @classmethod
    def hopper(cls, block_q: int = 128, block_k: int = 128, head_dim: int = 128, *,
               matmul_tflops: float = H100_MATMUL_TFLOPS, exp_tflops: float = H100_EXP_TFLOPS,
               sms: int = H100_SMS, load: float | None = None) -> Latencies:
        """Per-SM times of one tile's operations from the chip's published rates (:func:`tile_times`)."""
        times = tile_times(block_q, block_k, head_dim, matmul_tflops=matmul_tflops, exp_tflops=exp_tflops,
                           sms=sms)
        return cls(times["gemm_ns"], times["softmax_ns"], times["gemm_ns"], load)


def tile_times(block_q: int = 128, block_k: int = 128, head_dim: int = 128, *,
               matmul_tflops: float = H100_MATMUL_TFLOPS, exp_tflops: float = H100_EXP_TFLOPS,
               sms: int = H100_SMS) -> dict[str, float]:
    """FLOPs and per-SM times of one (block_q x block_k) tile at head dim D.

    Each GEMM is 2 block_q block_k D FLOPs; the softmax needs block_q block_k exponentials. An SM gets 1/sms of the
    chip's rates. Only the exponentials are counted for the softmax (its max, sum and scaling run on the FMA units).
    """
    for name, value in (("block_q", block_q), ("block_k", block_k), ("head_dim", head_dim), ("sms", sms)):
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"{name}={value!r}: a positive integer is expected")
    if not (matmul_tflops > 0 and exp_tflops > 0):
        raise ValueError(f"rates must be positive, got matmul_tflops={matmul_tflops}, exp_tflops={exp_tflops}")
    gemm_flops = 2.0 * block_q * block_k * head_dim
    exps = float(block_q * block_k)
    gemm_ns = gemm_flops / (matmul_tflops * 1e12 / sms) * 1e9
    softmax_ns = exps / (exp_tflops * 1e12 / sms) * 1e9
    return {"gemm_flops": gemm_flops, "exps": exps, "gemm_ns": gemm_ns, "softmax_ns": softmax_ns,
            "flop_ratio": 2 * gemm_flops / exps, "rate_ratio": matmul_tflops / exp_tflops,
            "softmax_over_gemms": softmax_ns / (2 * gemm_ns)}


# --------------------------------------------------------------------------------------------- checking an order
def _describe(op: Op) -> str:
    return f"(warpgroup {op.warpgroup}, {op.kind}, tile {op.tile})"


def validate(order, *, live_scores: int = 1) -> list[Op]:
    """The order as a list of :class:`Op`, or ScheduleError naming the first problem: a malformed entry, an
    operation twice or missing, a dependency broken (an operation before one it needs), or more than
    ``live_scores`` GEMM0 results waiting for their softmax in one warpgroup (they live in registers: a 128 x 128
    fp32 S tile is 128 registers per thread of a warpgroup, O another 128 at D = 128, of at most 255)."""
    if not isinstance(live_scores, int) or isinstance(live_scores, bool) or live_scores < 1:
        raise ValueError(f"live_scores={live_scores!r}: at least one S tile must fit in the registers")
    ops = []
    try:
        entries = list(order)
    except TypeError:
        raise ScheduleError(f"a schedule is a list of (warpgroup, kind, tile) tuples, got {type(order).__name__}",
                            "format") from None
    if not entries:
        raise ScheduleError("the schedule is empty: list every (warpgroup, kind, tile) operation", "format")
    for position, entry in enumerate(entries):
        if not isinstance(entry, (tuple, list)) or len(entry) != 3:
            raise ScheduleError(f"entry {position} is {entry!r}: expected a (warpgroup, kind, tile) tuple such as "
                                "(0, 'gemm0', 0)", "format", position)
        warpgroup, kind, tile = entry
        if kind not in KINDS:
            raise ScheduleError(f"entry {position} has kind {kind!r}: expected one of {KINDS}", "format", position)
        for name, value in (("warpgroup", warpgroup), ("tile", tile)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ScheduleError(f"entry {position} has {name} {value!r}: a non-negative int is expected",
                                    "format", position)
        ops.append(Op(int(warpgroup), str(kind), int(tile)))
    seen: dict[Op, int] = {}
    for position, op in enumerate(ops):
        if op in seen:
            raise ScheduleError(f"{_describe(op)} appears twice, at entries {seen[op]} and {position}",
                                "duplicate", position)
        seen[op] = position
    warpgroups = max(op.warpgroup for op in ops) + 1
    tiles = max(op.tile for op in ops) + 1
    for w in range(warpgroups):
        for j in range(tiles):
            for kind in KINDS:
                if Op(w, kind, j) not in seen:
                    raise ScheduleError(
                        f"{_describe(Op(w, kind, j))} is missing: every warpgroup runs gemm0, softmax and gemm1 on "
                        f"every tile 0..{tiles - 1} (warpgroups 0..{warpgroups - 1})", "missing")
    needs = {  # kind -> what must come before it, with the reason
        "softmax": [("gemm0", 0, "softmax_before_gemm0", "the softmax reads S, which GEMM0 of the same tile makes"),
                    ("softmax", -1, "softmax_order", "the online softmax goes tile by tile: the softmax of tile j "
                     "starts from the running max m and sum l after tile j-1")],
        "gemm1": [("softmax", 0, "gemm1_before_softmax", "GEMM1 multiplies P, which the softmax of the same tile "
                   "makes"),
                  ("gemm1", -1, "gemm1_order", "the rescale order: O is rescaled by exp(m_{j-1} - m_j) after GEMM1 "
                   "of tile j-1 added P_{j-1} V_{j-1}, and only then does GEMM1 of tile j add P_j V_j")],
    }
    for position, op in enumerate(ops):
        for kind, shift, rule, why in needs.get(op.kind, ()):
            before = Op(op.warpgroup, kind, op.tile + shift)
            if before.tile >= 0 and seen[before] > position:
                raise ScheduleError(f"entry {position} {_describe(op)} comes before entry {seen[before]} "
                                    f"{_describe(before)}: {why}", rule, position)
    waiting = [0] * warpgroups  # S tiles made by a GEMM0 whose softmax is not yet listed, per warpgroup
    for position, op in enumerate(ops):
        if op.kind == "gemm0":
            waiting[op.warpgroup] += 1
            if waiting[op.warpgroup] > live_scores:
                raise ScheduleError(
                    f"entry {position} {_describe(op)}: warpgroup {op.warpgroup} would hold {waiting[op.warpgroup]} "
                    f"S tiles waiting for their softmax, and the registers hold {live_scores} (an S tile is "
                    "block_q x block_k fp32 accumulators): run the softmax of the earlier tile first", "registers",
                    position)
        elif op.kind == "softmax":
            waiting[op.warpgroup] -= 1
    return ops


# --------------------------------------------------------------------------------------------- simulating
@dataclass(frozen=True)
class Span:
    """One operation on the timeline: who, what, on which unit, from when to when (ns)."""

    warpgroup: int  # -1 for the producer's loads
    kind: str  # "gemm0", "softmax", "gemm1" or "load"
    tile: int
    unit: str  # TENSOR, EXP or TMA
    start: float
    end: float


@dataclass(frozen=True)
class Timeline:
    """What :func:`simulate` returns: every span in the order of the schedule (loads first), and the totals."""

    spans: tuple[Span, ...]
    warpgroups: int
    tiles: int
    latencies: Latencies
    stages: int

    @property
    def makespan(self) -> float:
        return max(span.end for span in self.spans)

    def busy(self, unit: str) -> float:
        """Time the unit works (ns); no unit runs two operations at once, so its spans never overlap."""
        return sum(span.end - span.start for span in self.spans if span.unit == unit)

    @property
    def utilisation(self) -> float:
        """The tensor cores' busy fraction of the whole run: what the schedule is for."""
        return self.busy(TENSOR) / self.makespan

    def span(self, warpgroup: int, kind: str, tile: int) -> Span:
        for span in self.spans:
            if (span.warpgroup, span.kind, span.tile) == (warpgroup, kind, tile):
                return span
        raise KeyError(f"no span ({warpgroup}, {kind!r}, {tile})")

    def table(self) -> str:
        """The timeline as text, one line per operation in start order."""
        lines = [f"{'start':>8} {'end':>8}  {'unit':<15}who"]
        for s in sorted(self.spans, key=lambda s: (s.start, s.unit)):
            who = "producer" if s.warpgroup < 0 else f"warpgroup {s.warpgroup}"
            lines.append(f"{s.start:8.1f} {s.end:8.1f}  {s.unit:<15}{who}: {s.kind} of tile {s.tile}")
        return "\n".join(lines)


def simulate(order, latencies: Latencies | None = None, *, stages: int = 2, live_scores: int = 1) -> Timeline:
    """Run a schedule (see the module's docstring) and return its :class:`Timeline`.

    ``latencies``: a :class:`Latencies` (default ``Latencies.hopper()``: 128 x 128 tiles, D = 128, H100/H200);
    ``stages``: the producer's ring of K/V buffers (used only when ``latencies.load`` is set); ``live_scores``: how
    many S tiles a warpgroup's registers hold at once (:func:`validate`).
    """
    ops = validate(order, live_scores=live_scores)
    latencies = Latencies.hopper() if latencies is None else latencies
    if not isinstance(latencies, Latencies):
        raise TypeError(f"latencies must be a flashcourse.schedule.Latencies, got {type(latencies).__name__}")
    if not isinstance(stages, int) or isinstance(stages, bool) or stages < 1:
        raise ValueError(f"stages={stages!r}: the ring needs at least one buffer")
    warpgroups = max(op.warpgroup for op in ops) + 1
    tiles = max(op.tile for op in ops) + 1
    position = {op: i for i, op in enumerate(ops)}
    end: dict[tuple[int, str, int], float] = {}
    spans: dict[tuple[int, str, int], Span] = {}
    clock = [0.0] * warpgroups  # when each warpgroup's threads reach their next operation
    free = {TENSOR: 0.0, EXP: 0.0, TMA: 0.0}

    def load(j: int) -> float:
        """End of K/V tile j's load: in tile order, one at a time, into a buffer the consumers have freed."""
        if (-1, "load", j) not in end:
            previous = load(j - 1) if j > 0 else 0.0
            start = max(previous, free[TMA])
            if j >= stages:  # the buffer of tile j - stages: every warpgroup's GEMM1 of that tile must be done
                start = max(start, *(end[(w, "gemm1", j - stages)] for w in range(warpgroups)))
            spans[(-1, "load", j)] = Span(-1, "load", j, TMA, start, start + latencies.load)
            end[(-1, "load", j)] = free[TMA] = start + latencies.load
        return end[(-1, "load", j)]

    def waits_of(op: Op) -> list[tuple[int, str, int]] | None:
        """What op waits on, or None while something it needs has not run yet (its warpgroup's earlier ops,
        or, with a producer, the GEMM1s that free its tile's ring buffer)."""
        if any(other.warpgroup == op.warpgroup for other in pending[:pending.index(op)]):
            return None
        keys = {"gemm0": [], "softmax": [(op.warpgroup, "gemm0", op.tile)],
                "gemm1": [(op.warpgroup, "softmax", op.tile)] + ([(op.warpgroup, "gemm1", op.tile - 1)]
                                                                  if op.tile > 0 else [])}[op.kind]
        if op.kind == "gemm0" and latencies.load is not None and op.tile >= stages:
            keys += [(w, "gemm1", op.tile - stages) for w in range(warpgroups)]
        return keys if all(key in end for key in keys) else None

    pending = list(ops)
    while pending:
        # The first op in the list whose waits are known runs next. Without a producer that is always the first
        # op (validate put everything it needs before it); with one, GEMM0 of tile j waits for load j, whose
        # buffer GEMM1s later in the list may have to free first (the ring is full), and the ops after it go on.
        op = next((op for op in pending if waits_of(op) is not None), None)
        if op is None:
            stuck = pending[0]
            raise ScheduleError(
                f"deadlock: {_describe(stuck)} cannot run: K/V tile {stuck.tile}'s ring buffer (of {stages}) is "
                f"freed only by GEMM1 of tile {stuck.tile - stages}, which waits behind it: use more stages or "
                "move that GEMM1 earlier", "deadlock", position[stuck])
        waits = [end[key] for key in waits_of(op)]
        if op.kind == "gemm0" and latencies.load is not None:
            waits.append(load(op.tile))
        pending.remove(op)
        ready = max([clock[op.warpgroup], *waits])
        unit = EXP if op.kind == "softmax" else TENSOR
        duration = getattr(latencies, op.kind)
        start = max(ready, free[unit])
        free[unit] = end[op] = start + duration
        spans[op] = Span(op.warpgroup, op.kind, op.tile, unit, start, start + duration)
        # a GEMM is issued and runs on its own (wgmma is asynchronous); a softmax keeps the threads busy
        clock[op.warpgroup] = ready if unit == TENSOR else start + duration
    loads = [spans[(-1, "load", j)] for j in range(tiles) if (-1, "load", j) in spans]
    return Timeline(tuple(loads + [spans[op] for op in ops]), warpgroups, tiles, latencies, stages)


# --------------------------------------------------------------------------------------------- three schedules
def _check_tiles(tiles) -> None:
    if not isinstance(tiles, int) or isinstance(tiles, bool) or tiles < 1:
        raise ValueError(f"tiles={tiles!r}: a positive number of K/V tiles is expected")


def sequential(tiles: int) -> list[Op]:
    """One warpgroup, FlashAttention-2's order: GEMM0, softmax, GEMM1 of each tile, one after the other."""
    _check_tiles(tiles)
    return [Op(0, kind, j) for j in range(tiles) for kind in KINDS]


def pingpong(tiles: int) -> list[Op]:
    """Two warpgroups taking turns on the tensor cores (FA3 section 3.1): while one runs its softmax, the other's
    GEMM1 of the previous tile and GEMM0 of the next run."""
    _check_tiles(tiles)
    order = [Op(0, "gemm0", 0), Op(1, "gemm0", 0)]
    for j in range(tiles):
        for w in (0, 1):
            order.append(Op(w, "softmax", j))
        for w in (0, 1):
            order.append(Op(w, "gemm1", j))
            if j + 1 < tiles:
                order.append(Op(w, "gemm0", j + 1))
    return order


def overlapped(tiles: int) -> list[Op]:
    """One warpgroup overlapping with itself (FA3 section 3.2, Algorithm 2): GEMM0 of tile j and GEMM1 of tile j-1
    are issued, then the softmax of tile j runs while GEMM1 of tile j-1 is on the tensor cores."""
    _check_tiles(tiles)
    order = [Op(0, "gemm0", 0), Op(0, "softmax", 0)]
    for j in range(1, tiles):
        order += [Op(0, "gemm0", j), Op(0, "gemm1", j - 1), Op(0, "softmax", j)]
    return order + [Op(0, "gemm1", tiles - 1)]


# --------------------------------------------------------------------------------------------- pictures
_COLOURS = {"gemm0": "#4c72b0", "gemm1": "#55a868", "softmax": "#dd8452", "load": "#8172b2"}
_LABELS = {"gemm0": "QK", "gemm1": "PV", "softmax": "exp", "load": "K/V"}


def _matplotlib():
    try:
        from matplotlib.figure import Figure
        from matplotlib.patches import Patch
    except ImportError as error:  # not in the core install
        raise missing("course", "matplotlib", __name__) from error
    return Figure, Patch


def draw_timeline(timeline: Timeline, *, title: str | None = None):
    """A Gantt chart of a :class:`Timeline`: one row per warpgroup (its softmaxes solid, the GEMMs it has on the
    tensor cores as thin pale bars below), one for the tensor cores (the utilisation in the title), one for the
    producer if any."""
    Figure, Patch = _matplotlib()
    rows = [f"warpgroup {w}" for w in range(timeline.warpgroups)] + [TENSOR]
    if any(s.unit == TMA for s in timeline.spans):
        rows.append(TMA)
    fig = Figure(figsize=(9.0, 0.7 * len(rows) + 1.4), layout="constrained")
    ax = fig.add_subplot()
    scale = max(timeline.makespan, 1e-12)
    for span in timeline.spans:
        width = span.end - span.start
        colour = _COLOURS[span.kind]
        if span.unit == TMA:
            places = [(rows.index(TMA), 1.0)]
        elif span.unit == TENSOR:  # on the tensor cores, and as a thin pale bar under its warpgroup's row
            places = [(rows.index(TENSOR), 1.0), (span.warpgroup, 0.4)]
        else:
            places = [(span.warpgroup, 1.0)]
        for row, alpha in places:
            thin = alpha < 1.0
            own_row = span.unit == EXP  # a warpgroup's row: softmax above, its GEMMs in flight below
            middle = row + 0.27 if thin else row - 0.1 if own_row else row
            ax.barh(middle, width, left=span.start, height=0.16 if thin else 0.5 if own_row else 0.7,
                    color=colour, alpha=alpha, edgecolor="white")
            if not thin and width / scale > 0.035:
                who = "" if span.unit != TENSOR or timeline.warpgroups == 1 else f"w{span.warpgroup} "
                ax.text(span.start + width / 2, middle, f"{who}{_LABELS[span.kind]} {span.tile}", ha="center",
                        va="center", fontsize=7, color="white")
    ax.set_yticks(range(len(rows)), rows)
    ax.invert_yaxis()
    ax.set_xlabel("time (ns)")
    ax.set_xlim(0, timeline.makespan * 1.01)
    heading = title or "schedule"
    ax.set_title(f"{heading}: tensor cores busy {timeline.utilisation:.0%} of {timeline.makespan:.0f} ns")
    kinds = [k for k in ("gemm0", "softmax", "gemm1", "load") if any(s.kind == k for s in timeline.spans)]
    names = {"gemm0": "GEMM0: S = QK^T", "softmax": "softmax (exp)", "gemm1": "GEMM1: O += PV",
             "load": "TMA load of K/V"}
    ax.legend(handles=[Patch(color=_COLOURS[k], label=names[k]) for k in kinds], loc="upper center",
              bbox_to_anchor=(0.5, -0.28), ncol=len(kinds), fontsize=8, frameon=False)
    return fig


def ring_phases(stages: int, tiles: int) -> list[dict]:
    """The producer's ring, tile by tile: K/V tile j goes to buffer j mod stages on its pass j // stages, and the
    phase bit that a consumer waits on for it (the mbarrier's phase: it flips each time the buffer fills)."""
    if not isinstance(stages, int) or stages < 1:
        raise ValueError(f"stages={stages!r}: the ring needs at least one buffer")
    _check_tiles(tiles)
    return [{"tile": j, "stage": j % stages, "pass": j // stages, "phase": (j // stages) % 2}
            for j in range(tiles)]


def draw_ring(stages: int = 3, tiles: int = 9):
    """The TMA ring as a grid: rows are the buffers, columns the tiles in load order; each cell shows the tile a
    buffer holds and the phase bit the consumers wait for, which flips at every pass around the ring."""
    Figure, Patch = _matplotlib()
    cells = ring_phases(stages, tiles)
    fig = Figure(figsize=(max(5.0, 0.75 * tiles + 1.5), 0.6 * stages + 1.6), layout="constrained")
    ax = fig.add_subplot()
    colours = ("#c6dbef", "#fdd0a2")
    for cell in cells:
        ax.add_patch(_rectangle(cell["tile"], cell["stage"], colours[cell["phase"]]))
        ax.text(cell["tile"] + 0.5, cell["stage"] + 0.5, f"K/V {cell['tile']}\nphase {cell['phase']}",
                ha="center", va="center", fontsize=7)
    ax.set_xlim(0, tiles)
    ax.set_ylim(stages, 0)
    ax.set_xticks([j + 0.5 for j in range(tiles)], [str(j) for j in range(tiles)])
    ax.set_yticks([s + 0.5 for s in range(stages)], [f"buffer {s}" for s in range(stages)])
    ax.set_xlabel("tile loaded by the producer (time runs right)")
    ax.set_title(f"a ring of {stages} buffers: tile j goes to buffer j mod {stages}; the phase bit flips each pass")
    ax.legend(handles=[Patch(color=colours[p], label=f"phase {p}") for p in (0, 1)], loc="upper center",
              bbox_to_anchor=(0.5, -0.3), ncol=2, fontsize=8, frameon=False)
    return fig


def _rectangle(x: float, y: float, colour: str):
    from matplotlib.patches import Rectangle

    return Rectangle((x + 0.04, y + 0.06), 0.92, 0.88, color=colour)


# --------------------------------------------------------------------------------------------- recorded runs
def recorded_stages(directory: Path | None = None) -> dict | None:
    """The newest ``benchmarks/results/*-fa3-stages.json`` (the Gluon kernel's stages measured on a GPU) as
    {"meta", "rows", "path"}, or None when no such run is recorded."""
    from . import resources

    folder = Path(directory) if directory is not None else resources.recorded_results_dir()
    found = sorted(folder.glob("*-fa3-stages.json"))
    if not found:
        return None
    data = json.loads(found[-1].read_text())
    data["path"] = str(found[-1])
    return data
