"""Exercise 13, FlashAttention-3's schedules on ``flashcourse.schedule``'s simulator (Shah et al. 2024, sections
3.1-3.2): how long one tile's GEMMs and softmax take on an SM from the chip's rates, the ping-pong order of two
consumer warpgroups, one warpgroup overlapping its own softmax with its GEMMs, and both together (FA3's schedule).

The learner's orders are lists of ``(warpgroup, kind, tile)``; ``run`` turns them into an integer array (one row
per operation: warpgroup, kind's index in ``schedule.KINDS``, tile) and the judge, which trusts nothing else,
validates and simulates that array itself and compares the tensor cores' utilisation with the course's schedule.
"""

from __future__ import annotations

import sys
import types

import numpy as np

from .. import schedule
from ._core import Part, compare, run_check

# The library functions that compute the answers (and build the orders they are made of): a learner's function
# that calls them earns nothing. This module's own functions are added at its end: its mistakes and helpers are
# orders too (warpgroup 0 of ``_lock_step_overlapped`` is (c)'s answer).
_ANSWERS = {schedule.tile_times.__code__: "schedule.tile_times", schedule.pingpong.__code__: "schedule.pingpong",
            schedule.overlapped.__code__: "schedule.overlapped",
            schedule.Latencies.hopper.__func__.__code__: "schedule.Latencies.hopper",
            schedule.pingpong_overlapped.__code__: "schedule.pingpong_overlapped",
            schedule.lock_step.__code__: "schedule.lock_step", schedule.thread_ns.__code__: "schedule.thread_ns",
            schedule.predict_stage.__code__: "schedule.predict_stage"}


def _fingerprint(code: types.CodeType) -> tuple:
    """What a copy of a function keeps however it was made (``exec`` of its source gives a new code object, with
    another file name and first line, but the same instructions, names and constants)."""
    return (code.co_code, code.co_names, tuple(c for c in code.co_consts if not isinstance(c, types.CodeType)))


def _call_watched(fn, *args):
    """fn(*args), refusing a call into the functions of ``_ANSWERS`` or a copy of a library one (``_COPIES``; any
    profiler already set keeps running)."""
    previous = sys.getprofile()
    called = []

    def watch(frame, event, arg):
        if event == "call":
            name = _ANSWERS.get(frame.f_code) or _COPIES.get(_fingerprint(frame.f_code))
            if name is not None:
                called.append(name)
        if previous is not None:
            previous(frame, event, arg)

    sys.setprofile(watch)
    try:
        result = fn(*args)
    finally:
        sys.setprofile(previous)
    if called:
        raise AssertionError(f"your function called flashcourse.{called[0]} (or a copy of it), which computes what "
                             "this part asks you to write: write it yourself (simulate and validate may be called to "
                             "try it)")
    return result


# ------------------------------------------------------------------------------------------ (a) tile latencies


def _times_cases(rng, hidden):
    # (block_q, block_k, head_dim, matmul TFLOP/s, exp TFLOP/s, SMs): H100/H200 fp16 at D = 128 and 64, FP8 GEMMs
    # (twice the rate), and a smaller made-up chip with other tile sizes
    cases = [(128, 128, 128, 989.0, 3.9, 132), (128, 128, 64, 989.0, 3.9, 132), (128, 128, 128, 1979.0, 3.9, 132),
             (64, 128, 256, 312.0, 1.2, 108)]
    if hidden:
        for _ in range(4):
            cases.append((int(rng.choice([64, 128, 192])), int(rng.choice([64, 128, 176])),
                          int(rng.choice([64, 96, 128, 256])), float(rng.uniform(100, 2500)),
                          float(rng.uniform(0.5, 8)), int(rng.integers(40, 160))))
    return [{"block_q": bq, "block_k": bk, "head_dim": d, "matmul_tflops": m, "exp_tflops": e, "sms": s}
            for bq, bk, d, m, e, s in cases]


def _times_run(fns, case):
    got = _call_watched(fns["tile_latencies"], case["block_q"], case["block_k"], case["head_dim"],
                        case["matmul_tflops"], case["exp_tflops"], case["sms"])
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        raise AssertionError(f"tile_latencies must return two numbers (gemm_ns, softmax_ns), got {got!r}")
    try:
        return {"times": np.asarray([float(got[0]), float(got[1])], dtype=np.float64)}
    except (TypeError, ValueError):
        raise AssertionError(f"tile_latencies must return two numbers (gemm_ns, softmax_ns), got {got!r}") from None


def _times_expected(case, *, gemm_flops=None, exps=None, sms=None, to_ns=1e9):
    bq, bk, d = case["block_q"], case["block_k"], case["head_dim"]
    gemm_flops = 2.0 * bq * bk * d if gemm_flops is None else gemm_flops
    exps = float(bq * bk) if exps is None else exps
    sms = case["sms"] if sms is None else sms
    return np.asarray([gemm_flops / (case["matmul_tflops"] * 1e12 / sms) * to_ns,
                       exps / (case["exp_tflops"] * 1e12 / sms) * to_ns])


def _times_judge(case, out):
    got = np.asarray(out["times"], dtype=np.float64)
    bq, bk, d = case["block_q"], case["block_k"], case["head_dim"]
    times = schedule.tile_times(bq, bk, d, matmul_tflops=case["matmul_tflops"], exp_tflops=case["exp_tflops"],
                                sms=case["sms"])
    expected = np.asarray([times["gemm_ns"], times["softmax_ns"]])
    compare("(gemm_ns, softmax_ns)", got, expected, dtype="float64", check_dtype=False, variants=[
        ("one GEMM of a block_q x block_k tile at head dim D is 2 block_q block_k D FLOPs (a multiply and an add "
         "per term), not block_q block_k D", lambda: _times_expected(case, gemm_flops=float(bq * bk * d))),
        ("gemm_ns is the time of one GEMM (S = Q K^T, or O += P V), not of both together",
         lambda: _times_expected(case, gemm_flops=4.0 * bq * bk * d)),
        ("the chip's rates are for all its SMs together: one SM gets 1/sms of them, so a tile takes sms times "
         "longer than at the chip's rate", lambda: _times_expected(case, sms=1)),
        ("the softmax needs one exponential per score, block_q x block_k of them, not one per FLOP of the GEMM",
         lambda: _times_expected(case, exps=float(bq * bk * d))),
        ("units: the answer is in nanoseconds (1e9 per second); TFLOP/s is 1e12 FLOP/s",
         lambda: _times_expected(case, to_ns=1.0)),
        ("units: the answer is in nanoseconds (1e9 per second), not microseconds",
         lambda: _times_expected(case, to_ns=1e6)),
    ])


TIMES = Part("ex13_a", 2, "tile_latencies", ("tile_latencies",), _times_cases, _times_run, _times_judge)


def check_tile_latencies(tile_latencies, *, hidden=False, seed=None):
    """Check ``tile_latencies(block_q, block_k, head_dim, matmul_tflops, exp_tflops, sms) -> (gemm_ns, softmax_ns)``
    (one GEMM's time and one softmax's exponentials' time on one SM)."""
    __tracebackhide__ = True
    run_check(TIMES, {"tile_latencies": tile_latencies}, hidden=hidden, seed=seed)


# ------------------------------------------------------------------------------------------ the orders


def _order_cases(rng, hidden):
    # (tiles, GEMM ns, softmax ns): H100/H200 fp16 at D = 128 (softmax about one GEMM), D = 64 or FP8 (about two).
    # One tile comes last: there lock step and a ping-pong that starts both warpgroups at once are the same order.
    cases = [(2, 559.8, 554.5), (5, 559.8, 554.5), (4, 279.9, 554.5), (6, 300.0, 450.0), (1, 559.8, 554.5)]
    if hidden:
        for _ in range(4):
            gemm = float(rng.uniform(200, 700))
            cases.append((int(rng.integers(3, 13)), gemm, gemm * float(rng.uniform(0.6, 2.2))))
    return [{"tiles": n, "gemm_ns": g, "softmax_ns": s} for n, g, s in cases]


def _order_to_array(order, name: str) -> np.ndarray:
    """The learner's order as rows (warpgroup, kind index, tile), or AssertionError saying what is malformed."""
    try:
        entries = list(order)
    except TypeError:
        raise AssertionError(f"{name} must return a list of (warpgroup, kind, tile) tuples, got "
                             f"{type(order).__name__}") from None
    rows = []
    for position, entry in enumerate(entries):
        if not isinstance(entry, (tuple, list)) or len(entry) != 3:
            raise AssertionError(f"entry {position} of your order is {entry!r}: expected (warpgroup, kind, tile), "
                                 "for example (0, 'gemm0', 0)")
        warpgroup, kind, tile = entry
        if kind not in schedule.KINDS:
            raise AssertionError(f"entry {position} has kind {kind!r}: expected one of {schedule.KINDS}")
        if not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in (warpgroup, tile)):
            raise AssertionError(f"entry {position} is {entry!r}: the warpgroup and the tile are ints")
        rows.append((int(warpgroup), schedule.KINDS.index(kind), int(tile)))
    return np.asarray(rows, dtype=np.int64).reshape(len(rows), 3)


def _orders_run(name):
    def run(fns, case):
        return {"order": _order_to_array(_call_watched(fns[name], case["tiles"]), name)}
    return run


_DIAGNOSES = {
    "gemm1_before_softmax": "GEMM1 before its softmax: O += P V multiplies this tile's P, which only the softmax "
                            "makes; list the softmax of tile j before GEMM1 of tile j",
    "softmax_before_gemm0": "a softmax before its GEMM0: the softmax reads S = Q K_j^T, which GEMM0 of that tile "
                            "makes",
    "softmax_order": "the online softmax goes tile by tile: its running max m and sum l after tile j-1 are where "
                     "tile j starts",
    "gemm1_order": "the rescale order: between GEMM1 of tile j-1 and GEMM1 of tile j, O is rescaled by "
                   "exp(m_{j-1} - m_j); GEMM1s of one warpgroup go in tile order",
    "registers": "too many S tiles in flight: each GEMM0 result (a block_q x block_k fp32 tile) waits in registers "
                 "for its softmax, and a warpgroup has room for one; issue GEMM0 of tile j+1 after the softmax of "
                 "tile j",
}


def _judge_order(case, out, *, warpgroups: int, reference, name: str, mistakes, shape=None) -> None:
    rows = np.asarray(out["order"], dtype=np.int64).reshape(-1, 3)
    if rows.size and (rows[:, 1].min() < 0 or rows[:, 1].max() >= len(schedule.KINDS)):
        raise AssertionError("an entry's kind is not one of gemm0, softmax, gemm1")
    order = [schedule.Op(int(w), schedule.KINDS[int(k)], int(t)) for w, k, t in rows]
    tiles = case["tiles"]
    try:
        schedule.validate(order)
    except schedule.ScheduleError as error:
        diagnosis = _DIAGNOSES.get(error.rule)
        raise AssertionError(f"{error}" + (f". Diagnosis: {diagnosis}" if diagnosis else "")) from None
    used_warpgroups = max(op.warpgroup for op in order) + 1
    used_tiles = max(op.tile for op in order) + 1
    if used_warpgroups != warpgroups:
        raise AssertionError(f"your order uses {used_warpgroups} warpgroup(s), this part has {warpgroups}")
    if used_tiles != tiles:
        raise AssertionError(f"your order covers {used_tiles} tiles, expected {tiles} (tiles 0..{tiles - 1})")
    if shape is not None:  # what the part asks for besides the utilisation
        shape(order)
    latencies = schedule.Latencies(case["gemm_ns"], case["softmax_ns"], case["gemm_ns"],
                                   thread=case.get("thread_ns", 0.0))
    got = schedule.simulate(order, latencies)
    expected = schedule.simulate(reference(tiles), latencies)
    if got.utilisation >= expected.utilisation * (1 - 1e-9):
        return
    message = (f"the tensor cores are busy {got.utilisation:.1%} of your schedule's {got.makespan:.0f} ns, the "
               f"course's {name} reaches {expected.utilisation:.1%}")
    known = mistakes(tiles)
    for diagnosis, wrong in known:  # the very order of a usual mistake, else one as busy as it
        if order == [schedule.Op(*op) for op in wrong]:
            raise AssertionError(f"{message}. Diagnosis: {diagnosis}")
    for diagnosis, wrong in known:
        if np.isclose(got.utilisation, schedule.simulate(wrong, latencies).utilisation, rtol=1e-9):
            raise AssertionError(f"{message}; {_first_idle(got)}. Your order keeps them exactly as busy as a usual "
                                 f"mistake, which may be why: {diagnosis}")
    raise AssertionError(f"{message}; {_first_idle(got)}")


def _first_idle(timeline) -> str:
    """Where the tensor cores first wait, and what the warpgroups do meanwhile."""
    gemms = sorted((s for s in timeline.spans if s.unit == schedule.TENSOR), key=lambda s: s.start)
    at = 0.0
    for span in gemms:
        if span.start > at + 1e-9:
            during = [f"warpgroup {s.warpgroup} runs its softmax of tile {s.tile}" for s in timeline.spans
                      if s.unit == schedule.EXP and s.start < span.start and s.end > at]
            return (f"they first wait from {at:.0f} to {span.start:.0f} ns, before warpgroup {span.warpgroup}'s "
                    f"{span.kind} of tile {span.tile}" + (f", while {' and '.join(during)}" if during else ""))
        at = span.end
    return "they never wait"


# ------------------------------------------------------------------------------------------ (b) ping-pong


def _one_after_the_other(tiles):
    return [schedule.Op(w, kind, j) for w in (0, 1) for j in range(tiles) for kind in schedule.KINDS]


def _lock_step(tiles):
    return [schedule.Op(w, kind, j) for j in range(tiles) for kind in schedule.KINDS for w in (0, 1)]


def _together_from_the_start(tiles):
    """Ping-pong's loop, but both warpgroups issue GEMM0 of tile 0 at once: they never come apart."""
    order = [schedule.Op(0, "gemm0", 0), schedule.Op(1, "gemm0", 0)]
    for j in range(tiles):
        order += [schedule.Op(0, "softmax", j), schedule.Op(1, "softmax", j)]
        for w in (0, 1):
            order.append(schedule.Op(w, "gemm1", j))
            if j + 1 < tiles:
                order.append(schedule.Op(w, "gemm0", j + 1))
    return order


_LOCK_STEP = ("lock step: both warpgroups run the same operation at the same moment, so they share the tensor "
              "cores (each GEMM at half speed), then share the exp units, and each unit idles while the other "
              "works: no better than one warpgroup. Stagger them: one warpgroup's GEMMs must be issued while the "
              "other computes its softmax")


def _pingpong_mistakes(tiles):
    return [
        ("no overlap: one warpgroup runs all its tiles, then the other; the tensor cores wait during every softmax, "
         "as with one warpgroup. Interleave the two so one's softmax runs under the other's GEMMs",
         _one_after_the_other(tiles)),
        (_LOCK_STEP, _lock_step(tiles)),
        ("both warpgroups issue GEMM0 of tile 0 at the same moment: they share the tensor cores, finish together, "
         "start their softmaxes together and stay in lock step for good. Let one warpgroup start alone, and the "
         "other issue its first GEMM0 once the first one's softmax has begun", _together_from_the_start(tiles)),
    ]


def _pingpong_judge(case, out):
    _judge_order(case, out, warpgroups=2, reference=schedule.pingpong, name="ping-pong",
                 mistakes=_pingpong_mistakes)


PINGPONG = Part("ex13_b", 4, "pingpong_order", ("pingpong_order",), _order_cases, _orders_run("pingpong_order"),
                _pingpong_judge)


def check_pingpong_order(pingpong_order, *, hidden=False, seed=None):
    """Check ``pingpong_order(tiles) -> [(warpgroup, kind, tile), ...]``: two warpgroups taking turns on the tensor
    cores, simulated at several GEMM and softmax latencies; lock step is named when it is what came."""
    __tracebackhide__ = True
    run_check(PINGPONG, {"pingpong_order": pingpong_order}, hidden=hidden, seed=seed)


# ------------------------------------------------------------------------------------------ (c) one warpgroup


def _softmax_before_gemm1(tiles):
    """GEMM0 of tile j issued early, but GEMM1 of tile j-1 listed after the softmax of tile j: nothing overlaps."""
    order = [schedule.Op(0, "gemm0", 0), schedule.Op(0, "softmax", 0)]
    for j in range(1, tiles):
        order += [schedule.Op(0, "gemm0", j), schedule.Op(0, "softmax", j), schedule.Op(0, "gemm1", j - 1)]
    return order + [schedule.Op(0, "gemm1", tiles - 1)]


def _overlap_mistakes(tiles):
    return [
        ("no overlap: that is FlashAttention-2's order (GEMM0, softmax, GEMM1 of each tile in turn), the tensor "
         "cores wait during every softmax. Issue GEMM0 of tile j and GEMM1 of tile j-1 before the softmax of "
         "tile j, so the softmax runs while GEMM1 of tile j-1 is on the tensor cores", schedule.sequential(tiles)),
        ("GEMM1 of tile j-1 comes after the softmax of tile j: the warpgroup's threads are busy with the softmax "
         "and issue GEMM1 only when it ends, so nothing runs under it. List GEMM1 of tile j-1 before the softmax "
         "of tile j (it is asynchronous: issued, it runs while the threads compute the softmax)",
         _softmax_before_gemm1(tiles)),
    ]


def _overlap_judge(case, out):
    _judge_order(case, out, warpgroups=1, reference=schedule.overlapped, name="intra-warpgroup overlap",
                 mistakes=_overlap_mistakes)


OVERLAP = Part("ex13_c", 3, "overlap_order", ("overlap_order",), _order_cases, _orders_run("overlap_order"),
               _overlap_judge)


def check_overlap_order(overlap_order, *, hidden=False, seed=None):
    """Check ``overlap_order(tiles) -> [(0, kind, tile), ...]``: one warpgroup whose softmax of tile j runs under
    its own GEMM1 of tile j-1, simulated at several latencies."""
    __tracebackhide__ = True
    run_check(OVERLAP, {"overlap_order": overlap_order}, hidden=hidden, seed=seed)


# ------------------------------------------------------------------------------------------ (d) FA3's schedule


def _fa3_cases(rng, hidden):
    # per warpgroup (64 query rows, 128 keys) on an H100/H200, the softmax's thread work counted (lesson 13,
    # section 5): D = 64 in FP16 and D = 128 with FP8 GEMMs, where the whole softmax outlasts two GEMMs and FA3's
    # order beats plain ping-pong by a third; D = 128 in FP16, where both fill the tensor cores
    settings = [schedule.Latencies.hopper(head_dim=64, thread_work=True),
                schedule.Latencies.hopper(matmul_tflops=1979.0, thread_work=True),
                schedule.Latencies.hopper(thread_work=True)]
    cases = [(tiles, lat.gemm0, lat.softmax, lat.thread) for lat in settings for tiles in (3, 6, 1)]
    if hidden:
        for _ in range(3):
            gemm = float(rng.uniform(100, 400))
            cases.append((int(rng.integers(2, 11)), gemm, gemm * float(rng.uniform(1.0, 2.2)),
                          gemm * float(rng.uniform(0.3, 1.2))))
    return [{"tiles": n, "gemm_ns": g, "softmax_ns": s, "thread_ns": t} for n, g, s, t in cases]


def _each_overlaps_itself(order) -> None:
    """Each warpgroup issues GEMM0 of tile j, then GEMM1 of tile j-1, then its softmax of tile j (section 3.2), so
    that the softmax, which waits only for GEMM0, runs under GEMM1; or AssertionError saying which is out of place."""
    at = {op: i for i, op in enumerate(order)}
    for op in order:
        if op.kind == "softmax" and op.tile > 0:
            w, j = op.warpgroup, op.tile
            gemm0, gemm1 = at[schedule.Op(w, "gemm0", j)], at[schedule.Op(w, "gemm1", j - 1)]
            if not gemm0 < gemm1 < at[op]:
                raise AssertionError(
                    f"warpgroup {w} does not overlap itself at tile {j}: its softmax of tile {j} must run under its "
                    f"own GEMM1 of tile {j - 1}, so it issues GEMM0 of tile {j}, then GEMM1 of tile {j - 1}, then "
                    "the softmax (the tensor cores take one warpgroup's GEMMs in the order issued). Two warpgroups "
                    "taking turns without that is ping-pong without the overlap")


def _lock_step_overlapped(tiles):
    """Both warpgroups overlapping themselves, each operation issued by both at the same moment."""
    order = [schedule.Op(w, "gemm0", 0) for w in (0, 1)] + [schedule.Op(w, "softmax", 0) for w in (0, 1)]
    for j in range(1, tiles):
        for kind, tile in (("gemm0", j), ("gemm1", j - 1), ("softmax", j)):
            order += [schedule.Op(w, kind, tile) for w in (0, 1)]
    return order + [schedule.Op(w, "gemm1", tiles - 1) for w in (0, 1)]


def _fa3_mistakes(tiles):
    return [(_LOCK_STEP + " (each overlapping itself does not change that)", _lock_step_overlapped(tiles))]


def _fa3_judge(case, out):
    _judge_order(case, out, warpgroups=2, reference=schedule.pingpong_overlapped, name="FA3 schedule",
                 mistakes=_fa3_mistakes, shape=_each_overlaps_itself)


FA3 = Part("ex13_d", 3, "fa3_order", ("fa3_order",), _fa3_cases, _orders_run("fa3_order"), _fa3_judge)


def check_fa3_order(fa3_order, *, hidden=False, seed=None):
    """Check ``fa3_order(tiles) -> [(warpgroup, kind, tile), ...]``: two warpgroups in ping-pong, each overlapping
    its softmax with its own GEMM1 of the tile before, simulated with the softmax's thread work at D = 64 and with
    FP8 GEMMs (where it beats plain ping-pong) and at D = 128."""
    __tracebackhide__ = True
    run_check(FA3, {"fa3_order": fa3_order}, hidden=hidden, seed=seed)


PARTS = [TIMES, PINGPONG, OVERLAP, FA3]


# Copies are recognised of the library's functions only: a learner may well write one of this module's usual
# mistakes instruction for instruction, and must then hear its diagnosis.
_COPIES = {_fingerprint(code): name for code, name in _ANSWERS.items()}
_ANSWERS.update({value.__code__: f"grading.ex13.{name}" for name, value in list(globals().items())
                 if isinstance(value, types.FunctionType) and value.__module__ == __name__})
