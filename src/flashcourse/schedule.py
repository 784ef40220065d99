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
FMA = "FMA units"  # the threads' FP32 units: the softmax's max, scaling, sum, conversion, rescale
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
    thread: float = 0.0
    exp_on_fma: float = 0.0

    def __post_init__(self):
        for name in ("gemm0", "softmax", "gemm1", "load", "thread"):
            value = getattr(self, name)
            if value is None and name == "load":
                continue
            may_be_zero = name in ("softmax", "thread")  # exponentials all on the FMA units; no thread work
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not (
                    value > 0 or (may_be_zero and value == 0)):
                kind = "a non-negative" if may_be_zero else "a positive"
                raise ValueError(f"latency {name}={value!r}: {kind} number of nanoseconds is expected")
        if self.softmax + self.thread <= 0:
            raise ValueError("latency softmax=0 and thread=0: a softmax takes some time on the exp units or on "
                             "the threads' FMA units")
        if isinstance(self.exp_on_fma, bool) or not 0.0 <= self.exp_on_fma <= 1.0:
            raise ValueError(f"exp_on_fma={self.exp_on_fma!r}: a fraction of the exponentials, from 0 to 1, is "
                             "expected")

    def softmax_phases(self) -> list[list[list]]:
        """The softmax as phases, each a list of [unit, work] parts that run at the same time: half the thread
        work (max, scale); the exponentials, a share ``exp_on_fma`` of them as polynomials on the FMA units
        (``EMULATED_EXP2_OPS`` FP32 instructions each) beside the rest on the exp units; the other half (sum,
        convert, rescale). Parts of no work are left out."""
        emulated = self.softmax * self.exp_on_fma * EMULATED_EXP2_OPS / FMA_PER_EXP
        phases = [[[FMA, self.thread / 2]], [[EXP, self.softmax * (1.0 - self.exp_on_fma)], [FMA, emulated]],
                  [[FMA, self.thread / 2]]]
        return [[part for part in phase if part[1] > 0] for phase in phases if any(part[1] > 0 for part in phase)]

    @classmethod
    def hopper(cls, block_q: int = 64, block_k: int = 128, head_dim: int = 128, *,
               matmul_tflops: float = H100_MATMUL_TFLOPS, exp_tflops: float = H100_EXP_TFLOPS,
               sms: int = H100_SMS, load: float | None = None, thread_work: bool = False,
               exp_on_fma: float = 0.0, rescale_share: float = 1.0) -> Latencies:
        """Per-SM times of one warpgroup's operations on one K/V tile from the chip's published rates
        (:func:`tile_times`); ``block_q=64``: one consumer warpgroup's rows, as FA3 splits a 128-row tile.
        ``thread_work=True`` adds the softmax's work besides the exponentials (:func:`thread_ns`);
        ``exp_on_fma``: the share of exponentials computed by a polynomial on the FMA units, ``rescale_share``: of
        the tiles that rescale O (FA4's two ideas, lesson 14)."""
        times = tile_times(block_q, block_k, head_dim, matmul_tflops=matmul_tflops, exp_tflops=exp_tflops,
                           sms=sms)
        thread = thread_ns(block_q, block_k, head_dim, exp_tflops=exp_tflops, sms=sms,
                           rescale_share=rescale_share) if thread_work else 0.0
        return cls(times["gemm_ns"], times["softmax_ns"], times["gemm_ns"], load, thread, exp_on_fma)


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


# The softmax's work besides the exponentials, counted in FP32 instructions a score (``thread_ns``): the row max
# (one max), the scaled score minus the max (one FMA), the row sum (one add), the conversion of P to 16 bits (one
# instruction packs two); and the rescale of O by exp(m_old - m_new): one multiply an output element, which is
# head_dim / block_k a score. An SM issues 128 FP32 lanes a clock and 16 special functions (CUDA C++ Programming
# Guide, "Arithmetic Instructions", compute capability 9.0): eight FP32 instructions take the time of one exp.
THREAD_OPS_PER_SCORE = 3.5
FMA_PER_EXP = 8.0
# An exp2 emulated on the FMA units (FlashAttention-4, lesson 14): split, a degree-3 polynomial by Horner (three
# FMAs), the exponent added into the bits: about six FP32 instructions instead of one MUFU.EX2.
EMULATED_EXP2_OPS = 6.0
H200_HBM_TBPS = 4.8  # NVIDIA H200 data sheet: 4.8 TB/s of HBM3e (NVIDIA publishes no L2 bandwidth: see
# ``kv_tbps_implied``, which bounds it from below with a measured run)


def thread_ns(block_q: int = 64, block_k: int = 128, head_dim: int = 128, *, exp_tflops: float = H100_EXP_TFLOPS,
              sms: int = H100_SMS, ops_per_score: float = THREAD_OPS_PER_SCORE,
              fma_per_exp: float = FMA_PER_EXP, rescale_share: float = 1.0) -> float:
    """Per-SM time (ns) of one tile's softmax work besides the MUFU exponentials, on the threads' FP32 units:
    ``ops_per_score + head_dim / block_k`` instructions a score (the counts above ``THREAD_OPS_PER_SCORE``; the
    second term is the rescale of O, done on a share ``rescale_share`` of the tiles: 1 in FA2 and FA3, fewer
    with FA4's conditional rescaling), at ``fma_per_exp`` times the exp units' rate."""
    if not 0.0 <= rescale_share <= 1.0:
        raise ValueError(f"rescale_share={rescale_share!r}: a share of the tiles, from 0 to 1, is expected")
    ops = ops_per_score + rescale_share * head_dim / block_k
    return block_q * block_k * ops / (exp_tflops * 1e12 * fma_per_exp / sms) * 1e9


def load_ns(block_k: int = 128, head_dim: int = 128, *, bytes_per_value: int = 2, tbps: float = H200_HBM_TBPS,
            sms: int = H100_SMS) -> float:
    """Per-SM time (ns) of one K/V tile pair (2 x block_k x head_dim values) at one SM's share of a bandwidth:
    ``tbps`` TB/s over ``sms`` SMs (HBM, ``H200_HBM_TBPS``, or what L2 delivers, ``kv_tbps_implied``)."""
    if not tbps > 0:
        raise ValueError(f"tbps={tbps!r}: a positive bandwidth in TB/s is expected")
    return 2 * block_k * head_dim * bytes_per_value / (tbps * 1e12 / sms) * 1e9


def kv_tbps_implied(tflops: float, block_q: int, *, bytes_per_value: int = 2) -> float:
    """TB/s of K and V that a forward must read to run at ``tflops`` when each program of ``block_q`` query rows
    reads every K/V tile once: a K/V pair of block_k x D is 2 block_k D bytes_per_value bytes for the two GEMMs'
    4 block_q block_k D FLOPs, so bytes / FLOPs = bytes_per_value / (2 block_q), whatever the head dim and key
    tile. Beyond what HBM gives, it must come from L2: a lower bound on what L2 delivers."""
    if not 0 <= tflops < float("inf"):
        raise ValueError(f"tflops={tflops!r}: a measured rate, zero or more TFLOP/s, is expected")
    for name, value in (("block_q", block_q), ("bytes_per_value", bytes_per_value)):
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"{name}={value!r}: a positive integer is expected")
    return tflops * bytes_per_value / (2 * block_q)


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


def simulate(order, latencies: Latencies | None = None, *, stages: int = 2, live_scores: int = 1,
             softmax_waits_for_pv: bool = False, split_kv: bool = False) -> Timeline:
    """Run a schedule (see the module's docstring) and return its :class:`Timeline`.

    ``latencies``: a :class:`Latencies` (default ``Latencies.hopper()``: one consumer warpgroup's 64 query rows, 128
    keys, D = 128, H100/H200); ``stages``: the producer's ring of K/V buffers (used only when ``latencies.load`` is
    set); ``live_scores``: how many S tiles a warpgroup's registers hold at once (:func:`validate`).
    ``softmax_waits_for_pv``: the softmax of tile j also waits for the warpgroup's GEMM1 of tile j-1 when that was
    issued before it, as the compiled v8d, v8e and v8f do (ptxas moves the wait up, above the exponentials: lesson
    13, section 8). ``split_kv``: K and V travel as two loads of half the time each, in two rings, as in FA3: a K
    buffer is free again once every warpgroup's GEMM0 of its tile is done, a V buffer once their GEMM1s are, and
    GEMM1 waits for its V; otherwise one ring of K/V pairs, freed by GEMM1.

    The order is the order of *issue*: an operation is issued once the one listed before it has been (barriers
    between the warpgroups), its warpgroup's threads are free (not in a softmax) and what it needs is done. The
    tensor cores then run GEMMs in issue order, sharing them between GEMMs issued at the same moment. A softmax runs
    in three phases (:meth:`Latencies.softmax_phases`): half its thread work (the max, the scaling), its
    exponentials (on the exp units, and a share on the FMA units at the same time when ``exp_on_fma`` is set),
    the other half (the sum, the conversion, the rescale); parts of two warpgroups' phases on the same unit
    share it.
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
    begin: dict[tuple[int, str, int], float] = {}
    gemms: list[list[list]] = [[] for _ in range(warpgroups)]  # per warpgroup, GEMMs issued and not done, in order
    softmax: dict[int, list] = {}  # warpgroup -> [op, phases to go: each a list of [unit, work left]] while it runs
    if latencies.load is None:
        loads, load_time = [], 0.0
    elif split_kv:
        loads, load_time = [(kind, j) for j in range(tiles) for kind in ("load_k", "load_v")], latencies.load / 2
    else:
        loads, load_time = [("load", j) for j in range(tiles)], latencies.load
    k_load = "load_k" if split_kv else "load"
    loading: list | None = None  # [kind, tile, end] while the producer's TMA load runs
    next_load, issued, now = 0, 0, 0.0
    small = 1e-9 * min(latencies.gemm0, latencies.gemm1)

    def buffer_free(kind: str, j: int) -> bool:
        if j < stages:
            return True
        freed_by = "gemm0" if kind == "load_k" else "gemm1"
        return all((w, freed_by, j - stages) in end for w in range(warpgroups))

    def can_issue(op: Op) -> bool:
        w, j = op.warpgroup, op.tile
        if w in softmax:  # the warpgroup's threads compute a softmax
            return False
        if op.kind == "softmax":  # it reads S: GEMM0 must be done
            before = Op(w, "gemm1", j - 1)
            held = softmax_waits_for_pv and j > 0 and position[before] < position[op] and before not in end
            return (w, "gemm0", j) in end and not held
        if op.kind == "gemm1":  # O is rescaled after GEMM1 of tile j-1 lands, then GEMM1 of tile j is issued
            return (j == 0 or (w, "gemm1", j - 1) in end) and (not loads or not split_kv or (-1, "load_v", j) in end)
        return not loads or (-1, k_load, j) in end  # GEMM0 waits for its K tile

    while True:
        changed = True
        while changed:  # everything that can start now starts: the producer's next load, then issues in order
            changed = False
            if loading is None and next_load < len(loads) and buffer_free(*loads[next_load]):
                kind, j = loads[next_load]
                loading = [kind, j, now + load_time]
                begin[(-1, kind, j)] = now
                next_load += 1
                changed = True
            if issued < len(ops) and can_issue(ops[issued]):
                op = ops[issued]
                if op.kind == "softmax":
                    softmax[op.warpgroup] = [op, latencies.softmax_phases()]
                    begin[op] = now
                else:
                    gemms[op.warpgroup].append([op, getattr(latencies, op.kind), now])
                issued += 1
                changed = True
        # The tensor cores take GEMMs in the order issued; the first GEMMs of two warpgroups issued at the same
        # moment interleave and share them. The exp units, and the FMA units, split evenly between the softmax
        # phases running on them.
        heads = [queue[0] for queue in gemms if queue]
        first = min((head[2] for head in heads), default=now)
        on_tensor = [head for head in heads if head[2] == first]
        for head in on_tensor:
            begin.setdefault(head[0], now)
        on_units = [[part for entry in softmax.values() for part in entry[1][0]
                     if part[0] == unit and part[1] > small] for unit in (EXP, FMA)]
        groups = [on_tensor] + on_units
        events = [now + item[1] * len(running) for running in groups for item in running]
        if loading is not None:
            events.append(loading[2])
        if not events:
            if issued == len(ops):
                break
            stuck = ops[issued]
            freed_by = "GEMM0 (its K buffer) or GEMM1 (its V buffer)" if split_kv else "GEMM1"
            raise ScheduleError(
                f"deadlock: {_describe(stuck)} cannot run: K/V tile {stuck.tile}'s ring buffer (of {stages}) is "
                f"freed only by {freed_by} of tile {stuck.tile - stages}, which waits behind it: use more stages or "
                "move that GEMM earlier", "deadlock", issued)
        later = min(events)
        for running in groups:
            for item in running:
                item[1] -= (later - now) / len(running)
        now = later
        for queue in gemms:
            if queue and queue[0][1] <= small:
                end[queue.pop(0)[0]] = now
        for w, (op, phases) in list(softmax.items()):
            while phases and all(part[1] <= small for part in phases[0]):
                phases.pop(0)
            if not phases:
                end[op] = now
                del softmax[w]
        if loading is not None and loading[2] <= now:
            end[(-1, loading[0], loading[1])] = now
            loading = None
    spans = [Span(-1, kind, j, TMA, begin[(-1, kind, j)], end[(-1, kind, j)]) for kind, j in loads]
    for op in ops:
        unit = EXP if op.kind == "softmax" else TENSOR
        work = (sum(max(part[1] for part in phase) for phase in latencies.softmax_phases()) if op.kind == "softmax"
                else getattr(latencies, op.kind))
        spans.append(Span(op.warpgroup, op.kind, op.tile, unit, begin[op], end[op], work))
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
_COLOURS = {"gemm0": "#4c72b0", "gemm1": "#55a868", "softmax": "#dd8452", "load": "#8172b2", "load_k": "#8172b2",
            "load_v": "#b39ddb"}
_LABELS = {"gemm0": "QK", "gemm1": "PV", "softmax": "softmax", "load": "K/V", "load_k": "K", "load_v": "V"}


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
            # hatching in a dark grey, so that it shows on the colour and a label on a white box stays readable
            ax.barh(middle, width, left=span.start, height=height, color=colour, alpha=alpha,
                    edgecolor="0.2" if hatch else "white", linewidth=0.4 if hatch else 1.0, hatch=hatch)
            if alpha == 1.0 and width / scale > 0.035:
                who = "" if span.unit != TENSOR or lanes == 1 else f"w{span.warpgroup} "
                box = dict(boxstyle="round,pad=0.15", facecolor="white", edgecolor="none", alpha=0.85)
                ax.text(span.start + width / 2, middle, f"{who}{_LABELS[span.kind]} {span.tile}", ha="center",
                        va="center", fontsize=7 if lanes == 1 or span.unit != TENSOR else 6,
                        color="black" if hatch else "white", bbox=box if hatch else None)
    ax.set_yticks(range(len(rows)), rows)
    ax.invert_yaxis()
    ax.set_xlabel("time (ns)")
    ax.set_xlim(0, timeline.makespan * 1.01)
    heading = title or "schedule"
    ax.set_title(f"{heading}: tensor cores busy {timeline.utilisation:.0%} of {timeline.makespan:.0f} ns")
    kinds = [k for k in ("gemm0", "softmax", "gemm1", "load", "load_k", "load_v")
             if any(s.kind == k for s in timeline.spans)]
    names = {"gemm0": "GEMM0: S = QK^T", "softmax": "softmax (exp and thread work)", "gemm1": "GEMM1: O += PV",
             "load": "TMA load of K/V", "load_k": "TMA load of K", "load_v": "TMA load of V"}
    handles = [Patch(color=_COLOURS[k], label=names[k]) for k in kinds]
    handles += [Patch(facecolor=_COLOURS[k], alpha=0.4, label=f"pale, thin: the warpgroup's {name} in flight")
                for k, name in (("gemm0", "GEMM0"), ("gemm1", "GEMM1"))]
    if any(s.shared for s in timeline.spans):
        handles.append(Patch(facecolor="0.75", edgecolor="0.2", hatch="////",
                             label="hatched: unit shared, part speed"))
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
@dataclass(frozen=True)
class StageModel:
    """How the simulator sees one Gluon stage of lesson 13 (``kernels/hopper/fa3.py``): the order its compiled code
    runs, whether its softmax waits for the GEMM1 before it, and its query rows a program."""

    order: object  # tiles -> list of Op
    softmax_waits_for_pv: bool
    rows: int
    runs: str  # what the compiled code does, in words


def _lock_step_overlapped(tiles: int) -> list[Op]:
    return lock_step(tiles, overlap=True)


STAGE_MODELS = {
    "v8a": StageModel(sequential, False, 64, "one warpgroup in FA2's order (two or three such programs share an SM, "
                      "which the model of one program cannot see)"),
    "v8b": StageModel(sequential, False, 64, "v8a's order, the loads in a producer warp"),
    "v8c": StageModel(lock_step, False, 128, "two warpgroups running one loop: lock step"),
    "v8d": StageModel(_lock_step_overlapped, True, 128, "lock step, each warpgroup issuing QK^T(j) with PV(j-1); "
                      "compiled, it waits for PV(j-1) before its exponentials, so nothing runs under PV"),
    "v8e": StageModel(pingpong_overlapped, True, 128, "ping-pong of v8d's loop, the same early PV wait"),
    "v8f": StageModel(pingpong_overlapped, True, 128, "v8e's order in a persistent grid (one program per SM; the "
                      "model of one query tile cannot see the persistence); three warpgroups at D = 64"),
    "v8g": StageModel(_lock_step_overlapped, False, 128, "v8d with the PV wait held below the softmax: the softmax "
                      "really runs under PV(j-1) (the SASS test reads it)"),
}
"""The order each stage's *compiled* code runs, as tests/test_fa3_compile.py reads it from the SASS: v8d, v8e and v8f
wait for PV(j-1) before their exponentials (``test_v8g_keeps_the_exponentials_under_pv``), only v8g does not."""


def predict_stage(stage: str, head_dim: int, *, thread_work: bool = True, load_tbps: float | None = None,
                  tiles: int = 16, block_k: int = 128, exp_on_fma: float = 0.0,
                  rescale_share: float = 1.0) -> Timeline:
    """The simulator's timeline for one query tile of a Gluon stage (``STAGE_MODELS``) at ``head_dim``, 16-bit:
    with the softmax's thread work unless ``thread_work=False``, and a producer loading each K/V pair at
    ``load_tbps`` TB/s (one SM's share; None: no loads) into a ring of two buffers, K and V released apart.
    ``exp_on_fma`` and ``rescale_share``: FA4's ideas added to the stage (:meth:`Latencies.hopper`)."""
    if stage not in STAGE_MODELS:
        raise ValueError(f"stage={stage!r}: one of {', '.join(STAGE_MODELS)} is expected")
    model = STAGE_MODELS[stage]
    load = None if load_tbps is None else load_ns(block_k, head_dim, tbps=load_tbps)
    latencies = Latencies.hopper(block_k=block_k, head_dim=head_dim, thread_work=thread_work, load=load,
                                 exp_on_fma=exp_on_fma, rescale_share=rescale_share)
    return simulate(model.order(tiles), latencies, softmax_waits_for_pv=model.softmax_waits_for_pv,
                    split_kv=True)


def stage_comparison(run: dict, *, n: int = 16384, causal: bool = False, load_tbps: float | None = None,
                     peak_tflops: float = H100_MATMUL_TFLOPS) -> list[dict]:
    """Model beside measurement for every stage of a recorded run and head dim 64 and 128: one row each with the
    simulator's tensor-core utilisation (``model``) and the measured TFLOP/s as a fraction of the dense peak
    (``measured``, the mean of float16 and bfloat16), and each one's change from the stage before (``model_gain``,
    ``measured_gain``: 0.05 is +5%)."""
    rates = stage_rates(run, n=n, causal=causal)
    rows = []
    for head_dim in (64, 128):
        previous = None
        for stage in STAGE_MODELS:
            measured = [rates[(f"fa3-{stage}", dtype, head_dim)] for dtype in ("float16", "bfloat16")
                        if (f"fa3-{stage}", dtype, head_dim) in rates]
            if not measured:
                continue
            row = {"stage": stage, "head_dim": head_dim,
                   "model": predict_stage(stage, head_dim, load_tbps=load_tbps).utilisation,
                   "measured": sum(measured) / len(measured) / peak_tflops}
            row["model_gain"] = None if previous is None else row["model"] / previous["model"] - 1
            row["measured_gain"] = None if previous is None else row["measured"] / previous["measured"] - 1
            rows.append(row)
            previous = row
    return rows


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
