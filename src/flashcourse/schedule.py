"""A warp-schedule simulator for FlashAttention-3's ideas (Shah et al. 2024, sections 3.1-3.2), on the CPU.

One CTA (thread block) on one SM. Its consumer warpgroups (FA3: two, 64 query rows each of a 128-row tile) each
loop over the K/V tiles doing three operations per tile j: GEMM0 (S = Q K_j^T, on the tensor cores), the softmax
of S (exponentials on the special-function units, MUFU, plus the running max and sum) and GEMM1 (O += P V_j, tensor
cores again). Two units do the work, and warpgroups that use one at the same time share it:

- **the tensor cores**: a warpgroup is four warps, one on each of the SM's four sub-partitions, and its ``wgmma``
  uses all four sub-partitions' tensor cores. They take GEMMs in the order they were issued, one at a time; but
  GEMMs that two warpgroups issue at the same moment interleave their instructions and share them, each at half
  speed, so both end as late as the later one would alone;
- **the exp units** (MUFU): likewise, one warpgroup's softmax already keeps every sub-partition's MUFU busy, and two
  softmaxes at the same time each run at half speed.

A *schedule* is one list of operations ``(warpgroup, kind, tile)`` in the order they are *issued*: each warpgroup's
program order, and across warpgroups the order that barriers enforce in a real kernel (an operation is issued no
earlier than the one listed before it). :func:`simulate` runs it:

- a GEMM is asynchronous (``wgmma``): the warpgroup issues it and moves on; it runs when the GEMMs issued before
  it are done;
- a softmax runs on the warpgroup's own threads: the warpgroup issues nothing else until it ends, and it starts
  when its GEMM0 is done;
- GEMM1 of tile j is issued after the softmax of tile j (it multiplies its P) and after GEMM1 of tile j-1 ended
  (between the two, the online softmax rescales O by exp(m_{j-1} - m_j): the updates of O go tile by tile);
- with a producer (``Latencies.load``), GEMM0 of tile j also waits for the TMA load of K/V tile j into a ring of
  ``stages`` shared-memory buffers, and load j waits until every warpgroup's GEMM1 of tile j - stages freed its
  buffer.

Sharing is why the order matters: two warpgroups in lock step (the same operation at the same time) share each
unit and leave the other idle, exactly as one warpgroup would; staggered (ping-pong), one's softmax runs while the
other's GEMMs have the tensor cores to themselves.

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
    def hopper(cls, block_q: int = 64, block_k: int = 128, head_dim: int = 128, *,
               matmul_tflops: float = H100_MATMUL_TFLOPS, exp_tflops: float = H100_EXP_TFLOPS,
               sms: int = H100_SMS, load: float | None = None) -> Latencies:
        """Per-SM times of one warpgroup's operations on one K/V tile from the chip's published rates
        (:func:`tile_times`); ``block_q=64``: one consumer warpgroup's rows, as FA3 splits a 128-row tile."""
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
    ``live_scores`` GEMM0 results waiting for their softmax in one warpgroup.

    Why one: the accumulators live in registers, spread over the warpgroup's 128 threads. FA3 at D = 128 gives a
    consumer warpgroup 64 query rows and 176 keys (``hopper/tile_size.h``, kBlockM 128 over two warpgroups, kBlockN
    176) and 240 registers a thread (``MmaRegisterRequirement``, ``hopper/flash_fwd_kernel_sm90.h``). A 64 x 176
    fp32 S tile is 64 * 176 / 128 = 88 registers a thread, O (64 x 128 fp32) 64, P of the tile before (fp16, still
    read by its GEMM1 under the overlap) 44: 196 of 240, before indices, the running max and sum. A second S tile
    (88 more) does not fit."""
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
    work: float | None = None  # its time with the unit to itself; less than end - start when it shared the unit

    @property
    def shared(self) -> bool:
        """Whether it shared its unit with another warpgroup's operation for part of its run (so it took longer)."""
        return self.work is not None and self.end - self.start > self.work * (1 + 1e-9)


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
        """Time the unit works (ns): the length of the union of its spans (two warpgroups' operations that share
        the unit overlap, and the unit is busy once, not twice)."""
        total, reached = 0.0, float("-inf")
        for start, stop in sorted((s.start, s.end) for s in self.spans if s.unit == unit):
            if stop > reached:
                total += stop - max(start, reached)
                reached = stop
        return total

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

    ``latencies``: a :class:`Latencies` (default ``Latencies.hopper()``: one consumer warpgroup's 64 query rows, 128
    keys, D = 128, H100/H200); ``stages``: the producer's ring of K/V buffers (used only when ``latencies.load`` is
    set); ``live_scores``: how many S tiles a warpgroup's registers hold at once (:func:`validate`).

    The order is the order of *issue*: an operation is issued once the one listed before it has been (barriers
    between the warpgroups), its warpgroup's threads are free (not in a softmax) and what it needs is done. The
    tensor cores then run GEMMs in issue order, sharing them between GEMMs issued at the same moment; softmaxes
    running at the same time share the exp units.
    """
    ops = validate(order, live_scores=live_scores)
    latencies = Latencies.hopper() if latencies is None else latencies
    if not isinstance(latencies, Latencies):
        raise TypeError(f"latencies must be a flashcourse.schedule.Latencies, got {type(latencies).__name__}")
    if not isinstance(stages, int) or isinstance(stages, bool) or stages < 1:
        raise ValueError(f"stages={stages!r}: the ring needs at least one buffer")
    warpgroups = max(op.warpgroup for op in ops) + 1
    tiles = max(op.tile for op in ops) + 1
    end: dict[tuple[int, str, int], float] = {}
    begin: dict[tuple[int, str, int], float] = {}
    gemms: list[list[list]] = [[] for _ in range(warpgroups)]  # per warpgroup, GEMMs issued and not done, in order
    softmax: dict[int, list] = {}  # warpgroup -> [op, work left] while its softmax runs
    loading: list | None = None  # [tile, end] while the producer's TMA load runs
    next_load, issued, now = 0, 0, 0.0

    def can_issue(op: Op) -> bool:
        w, j = op.warpgroup, op.tile
        if w in softmax:  # the warpgroup's threads compute a softmax
            return False
        if op.kind == "softmax":  # it reads S: GEMM0 must be done
            return (w, "gemm0", j) in end
        if op.kind == "gemm1":  # O is rescaled after GEMM1 of tile j-1 lands, then GEMM1 of tile j is issued
            return j == 0 or (w, "gemm1", j - 1) in end
        return latencies.load is None or (-1, "load", j) in end  # GEMM0 waits for its K/V tile

    while True:
        changed = True
        while changed:  # everything that can start now starts: the producer's next load, then issues in order
            changed = False
            if (latencies.load is not None and loading is None and next_load < tiles
                    and all((w, "gemm1", next_load - stages) in end for w in range(warpgroups)
                            if next_load >= stages)):
                loading = [next_load, now + latencies.load]
                begin[(-1, "load", next_load)] = now
                next_load += 1
                changed = True
            if issued < len(ops) and can_issue(ops[issued]):
                op = ops[issued]
                if op.kind == "softmax":
                    softmax[op.warpgroup] = [op, latencies.softmax]
                    begin[op] = now
                else:
                    gemms[op.warpgroup].append([op, getattr(latencies, op.kind), now])
                issued += 1
                changed = True
        # The tensor cores take GEMMs in the order issued; the first GEMMs of two warpgroups issued at the same
        # moment interleave and share them. The exp units split evenly between the softmaxes running.
        heads = [queue[0] for queue in gemms if queue]
        first = min((head[2] for head in heads), default=now)
        on_tensor = [head for head in heads if head[2] == first]
        for head in on_tensor:
            begin.setdefault(head[0], now)
        on_exp = list(softmax.values())
        events = [now + item[1] * len(running) for running in (on_tensor, on_exp) for item in running]
        if loading is not None:
            events.append(loading[1])
        if not events:
            if issued == len(ops):
                break
            stuck = ops[issued]
            raise ScheduleError(
                f"deadlock: {_describe(stuck)} cannot run: K/V tile {stuck.tile}'s ring buffer (of {stages}) is "
                f"freed only by GEMM1 of tile {stuck.tile - stages}, which waits behind it: use more stages or "
                "move that GEMM1 earlier", "deadlock", issued)
        later = min(events)
        for running in (on_tensor, on_exp):
            for item in running:
                item[1] -= (later - now) / len(running)
        now = later
        for queue in gemms:
            if queue and queue[0][1] <= 1e-9 * latencies.gemm0:
                end[queue.pop(0)[0]] = now
        for w, (op, left) in list(softmax.items()):
            if left <= 1e-9 * latencies.softmax:
                end[op] = now
                del softmax[w]
        if loading is not None and loading[1] <= now:
            end[(-1, "load", loading[0])] = now
            loading = None
    spans = [Span(-1, "load", j, TMA, begin[(-1, "load", j)], end[(-1, "load", j)])
             for j in range(tiles) if (-1, "load", j) in end]
    for op in ops:
        unit = EXP if op.kind == "softmax" else TENSOR
        spans.append(Span(op.warpgroup, op.kind, op.tile, unit, begin[op], end[op], getattr(latencies, op.kind)))
    return Timeline(tuple(spans), warpgroups, tiles, latencies, stages)


# --------------------------------------------------------------------------------------------- three schedules
def _check_tiles(tiles) -> None:
    if not isinstance(tiles, int) or isinstance(tiles, bool) or tiles < 1:
        raise ValueError(f"tiles={tiles!r}: a positive number of K/V tiles is expected")


def sequential(tiles: int) -> list[Op]:
    """One warpgroup, FlashAttention-2's order: GEMM0, softmax, GEMM1 of each tile, one after the other."""
    _check_tiles(tiles)
    return [Op(0, kind, j) for j in range(tiles) for kind in KINDS]


def pingpong(tiles: int) -> list[Op]:
    """Two warpgroups taking turns on the tensor cores (FA3 section 3.1): warpgroup 1 issues its first GEMM0 when
    warpgroup 0 starts its first softmax, and from then on each issues its GEMM1 of tile j and GEMM0 of tile j+1
    while the other runs a softmax (in a kernel, named barriers hand the turn over)."""
    _check_tiles(tiles)
    order = [Op(0, "gemm0", 0), Op(0, "softmax", 0), Op(1, "gemm0", 0)]
    for j in range(tiles):
        for w in (0, 1):
            order.append(Op(w, "gemm1", j))
            if j + 1 < tiles:
                order.append(Op(w, "gemm0", j + 1))
            # the other warpgroup's next softmax runs under these GEMMs
            other, tile = (1, j) if w == 0 else (0, j + 1)
            if tile < tiles:
                order.append(Op(other, "softmax", tile))
    return order


def lock_step(tiles: int, *, overlap: bool = False) -> list[Op]:
    """Two warpgroups running the same loop side by side with nothing to stagger them (the v8c stage; v8d with
    ``overlap=True``, each warpgroup running :func:`overlapped`'s loop): every operation issued by both at the same
    moment, so they share each unit and wait together."""
    one = overlapped(tiles) if overlap else sequential(tiles)
    return [Op(w, op.kind, op.tile) for op in one for w in (0, 1)]


def overlapped(tiles: int) -> list[Op]:
    """One warpgroup overlapping with itself (FA3 section 3.2, Algorithm 2): GEMM0 of tile j and GEMM1 of tile j-1
    are issued, then the softmax of tile j runs while GEMM1 of tile j-1 is on the tensor cores."""
    _check_tiles(tiles)
    order = [Op(0, "gemm0", 0), Op(0, "softmax", 0)]
    for j in range(1, tiles):
        order += [Op(0, "gemm0", j), Op(0, "gemm1", j - 1), Op(0, "softmax", j)]
    return order + [Op(0, "gemm1", tiles - 1)]


def pingpong_overlapped(tiles: int) -> list[Op]:
    """FA3's schedule (sections 3.1 and 3.2 together): each warpgroup overlaps itself (GEMM0 of tile j and GEMM1
    of tile j-1 issued before the softmax of tile j), and the two take turns: a warpgroup issues its pair of GEMMs
    when the other starts its softmax."""
    _check_tiles(tiles)
    order = []
    for j in range(tiles):
        for w in (0, 1):
            order.append(Op(w, "gemm0", j))
            if j > 0:
                order.append(Op(w, "gemm1", j - 1))
            order.append(Op(w, "softmax", j))
    return order + [Op(0, "gemm1", tiles - 1), Op(1, "gemm1", tiles - 1)]


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
    producer if any. A hatched bar shared its unit with another warpgroup's operation, at part speed. The legend
    names every colour and mark."""
    Figure, Patch = _matplotlib()
    rows = [f"warpgroup {w}" for w in range(timeline.warpgroups)] + [TENSOR]
    if any(s.unit == TMA for s in timeline.spans):
        rows.append(TMA)
    fig = Figure(figsize=(9.0, 0.7 * len(rows) + 1.7), layout="constrained")
    ax = fig.add_subplot()
    scale = max(timeline.makespan, 1e-12)
    lanes = timeline.warpgroups  # the tensor-core row has a lane per warpgroup, so shared GEMMs show side by side
    for span in timeline.spans:
        width = span.end - span.start
        colour = _COLOURS[span.kind]
        hatch = "////" if span.shared else None
        if span.unit == TMA:
            places = [(rows.index(TMA), 0.0, 0.7, 1.0)]
        elif span.unit == TENSOR:  # on the tensor cores, and as a thin pale bar under its warpgroup's row
            lane = 0.7 / lanes
            places = [(rows.index(TENSOR), -0.35 + lane * (span.warpgroup + 0.5), lane, 1.0),
                      (span.warpgroup, 0.27, 0.16, 0.4)]
        else:  # a warpgroup's row: softmax above, its GEMMs in flight below
            places = [(span.warpgroup, -0.1, 0.5, 1.0)]
        for row, shift, height, alpha in places:
            middle = row + shift
            ax.barh(middle, width, left=span.start, height=height, color=colour, alpha=alpha, edgecolor="white",
                    hatch=hatch)
            if alpha == 1.0 and width / scale > 0.035:
                who = "" if span.unit != TENSOR or lanes == 1 else f"w{span.warpgroup} "
                ax.text(span.start + width / 2, middle, f"{who}{_LABELS[span.kind]} {span.tile}", ha="center",
                        va="center", fontsize=7 if lanes == 1 or span.unit != TENSOR else 6, color="white")
    ax.set_yticks(range(len(rows)), rows)
    ax.invert_yaxis()
    ax.set_xlabel("time (ns)")
    ax.set_xlim(0, timeline.makespan * 1.01)
    heading = title or "schedule"
    ax.set_title(f"{heading}: tensor cores busy {timeline.utilisation:.0%} of {timeline.makespan:.0f} ns")
    kinds = [k for k in ("gemm0", "softmax", "gemm1", "load") if any(s.kind == k for s in timeline.spans)]
    names = {"gemm0": "GEMM0: S = QK^T", "softmax": "softmax (exp)", "gemm1": "GEMM1: O += PV",
             "load": "TMA load of K/V"}
    handles = [Patch(color=_COLOURS[k], label=names[k]) for k in kinds]
    handles.append(Patch(facecolor="0.55", alpha=0.4, label="pale, thin: the warpgroup's GEMM in flight"))
    if any(s.shared for s in timeline.spans):
        handles.append(Patch(facecolor="white", edgecolor="0.3", hatch="////",
                             label="hatched: unit shared, half speed"))
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=3, fontsize=8,
              frameon=False)
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
STAGE_ORDERS = {"v8a": sequential, "v8b": sequential, "v8c": lock_step,
                "v8d": lambda tiles: lock_step(tiles, overlap=True), "v8e": pingpong_overlapped,
                "v8f": pingpong_overlapped, "v8g": lambda tiles: lock_step(tiles, overlap=True)}
"""The order each Gluon stage runs, as this simulator sees it (v8b adds only the producer; v8c's two warpgroups run
one loop with nothing to stagger them; v8f is v8e's order in a persistent grid, which the model of one query tile
cannot see; v8g is v8d's order with the PV wait where the model already puts it, below the softmax)."""


def stage_rates(run: dict, *, n: int, causal: bool = False) -> dict[tuple[str, str, int], float]:
    """{(provider, dtype, head_dim): TFLOP/s} of a recorded stages run's timings at sequence length ``n``."""
    return {(row["provider"], row["dtype"], row["head_dim"]): row["tflops"] for row in run["rows"]
            if row.get("kind") == "time" and row.get("status") == "ok" and row.get("n") == n
            and row.get("causal") == causal and row.get("tflops")}


def recorded_stages(directory: Path | None = None, *, pattern: str = "*-fa3-stages.json") -> dict | None:
    """The newest ``benchmarks/results/*-fa3-stages.json`` (the Gluon kernel's stages measured on a GPU), or the
    newest file matching ``pattern`` (the run by length: ``"*-fa3-stages-*-n1024-*.json"``), as
    {"meta", "rows", "path"}, or None when no such run is recorded."""
    from . import resources

    folder = Path(directory) if directory is not None else resources.recorded_results_dir()
    found = sorted(folder.glob(pattern))
    if not found:
        return None
    data = json.loads(found[-1].read_text())
    data["path"] = str(found[-1])
    return data
