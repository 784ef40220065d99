"""Exercise 11, the bookkeeping of ring attention (Liu, Zaharia, Abbeel 2023) with a causal mask: which positions
each rank holds in the zigzag layout, which blocks each rank computes at each ring step, where each dK/dV partial
travels in the backward, and how many positions a rank needs before a step's compute hides its K/V transfer under
grouped-query attention. The answers are ``flashcourse.distributed.schedule``'s and ``distributed.cost``'s."""

from __future__ import annotations

import numpy as np

from ..distributed import cost, schedule
from ._core import Part, compare, run_check, to_numpy

KINDS = ("skip", "lower", "full")  # codes 0, 1, 2 of a chunk pair; -1: a pair this rank does not hold then
NOT_HELD = -1


def _refuse_library(fns: dict) -> None:
    """Handing in the course's own function (``zigzag_indices = distributed.zigzag_indices``) earns nothing."""
    for name, fn in fns.items():
        if (getattr(fn, "__module__", None) or "").startswith("flashcourse.distributed"):
            raise AssertionError(
                f"{name} is flashcourse.distributed's own {fn.__name__}: write it yourself; the library's version "
                "earns no points")


# ------------------------------------------------------------------------------------------ (a) zigzag indices


def _zigzag_cases(rng, hidden):
    sizes = [(8, 2, 0), (8, 2, 1), (6, 3, 2), (24, 3, 1), (32, 4, 3)]  # (n, world, rank)
    if hidden:
        sizes += [(120, 6, int(rng.integers(6))), (80, 5, 0), (16, 8, 7)]
    return [{"n": n, "world": world, "rank": rank} for n, world, rank in sizes]


def _zigzag_run(fns, case):
    _refuse_library(fns)
    return {"indices": to_numpy(fns["zigzag_indices"](case["n"], case["world"], case["rank"]), "indices")}


def _zigzag_judge(case, out):
    n, world, rank = case["n"], case["world"], case["rank"]
    expected = schedule.zigzag_indices(n, world, rank)
    size = n // (2 * world)
    got = np.asarray(out["indices"])
    if got.dtype.kind not in "iu":
        raise AssertionError(f"the indices have dtype {got.dtype}: positions are integers (e.g. np.arange(...))")

    def chunks(ids, chunk):
        return np.concatenate([np.arange(c * chunk, (c + 1) * chunk) for c in ids])

    if got.shape == (2 * expected.size,):
        raise AssertionError(f"you return {got.size} positions, expected {expected.size} (N/P): the two chunks "
                             "are N/(2P) positions each, not N/P")
    compare("indices", got, expected, dtype="float64", check_dtype=False, variants=[
        ("that is the contiguous layout (chunk r of P); zigzag cuts the sequence into 2P chunks and gives rank r "
         "chunks r and 2P-1-r", lambda: schedule.sequence_indices(n, world, rank, "contiguous")),
        ("the second chunk is off by one: of 2P chunks numbered 0..2P-1, rank r's partner chunk is 2P-1-r "
         "(rank 0 gets the last one)", lambda: chunks([rank, (2 * world - rank) % (2 * world)], size)),
    ])


ZIGZAG = Part("ex11_a", 2, "zigzag_indices", ("zigzag_indices",), _zigzag_cases, _zigzag_run, _zigzag_judge)


def check_zigzag_indices(zigzag_indices, *, hidden=False, seed=None):
    """Check ``zigzag_indices(n, world, rank) -> positions (int array, ascending)``."""
    __tracebackhide__ = True
    run_check(ZIGZAG, {"zigzag_indices": zigzag_indices}, hidden=hidden, seed=seed)


# ------------------------------------------------------------------------------------------ (b) block schedule


def _schedule_cases(rng, hidden):
    cases = [(2, 0, 0, "contiguous"), (2, 1, 1, "contiguous"), (3, 0, 1, "contiguous"),
             (2, 0, 0, "zigzag"), (2, 0, 1, "zigzag"), (2, 1, 1, "zigzag"), (3, 1, 2, "zigzag")]
    if hidden:
        for world in (4, 5, 7):
            cases += [(world, int(rng.integers(world)), int(rng.integers(1, world)), layout)
                      for layout in schedule.LAYOUTS]
    return [{"world": w, "rank": r, "step": s, "layout": layout} for w, r, s, layout in cases]


def _as_grid(pairs: dict, chunks: int) -> np.ndarray:
    """{(q_chunk, k_chunk): kind} -> (chunks, chunks) int grid of kind codes, -1 where no pair was given."""
    grid = np.full((chunks, chunks), NOT_HELD)
    for key, kind in pairs.items():
        if not (isinstance(key, tuple) and len(key) == 2 and all(isinstance(c, (int, np.integer)) for c in key)):
            raise AssertionError(f"the keys must be (q_chunk, k_chunk) pairs of ints, got {key!r}")
        if not all(0 <= c < chunks for c in key):
            raise AssertionError(f"chunk pair {key} is outside the {chunks} chunks of this layout")
        if kind not in KINDS:
            raise AssertionError(f"pair {key} has kind {kind!r}: expected one of {KINDS}")
        grid[key] = KINDS.index(kind)
    return grid


def _schedule_run(fns, case):
    _refuse_library(fns)
    pairs = fns["block_schedule"](case["world"], case["rank"], case["step"], case["layout"])
    if not isinstance(pairs, dict):
        raise AssertionError(f"block_schedule must return a dict {{(q_chunk, k_chunk): kind}}, got "
                             f"{type(pairs).__name__}")
    return {"grid": _as_grid(pairs, case["world"] * schedule.chunks_per_rank(case["layout"]))}


def _schedule_grid(world, rank, step, layout, *, source=None, kind=schedule.block_kind) -> np.ndarray:
    """The expected grid, or a usual mistake's: another K/V source, another rule for a pair's kind."""
    source = schedule.kv_source(world, rank, step) if source is None else source
    chunks = world * schedule.chunks_per_rank(layout)
    pairs = {(qc, kc): kind(qc, kc) for qc in schedule.rank_chunks(world, rank, layout)
             for kc in schedule.rank_chunks(world, source, layout)}
    return _as_grid(pairs, chunks)


def _describe(code: int) -> str:
    return "nothing (pair not held)" if code == NOT_HELD else repr(KINDS[code])


def _schedule_judge(case, out):
    world, rank, step, layout = case["world"], case["rank"], case["step"], case["layout"]
    got, expected = np.asarray(out["grid"]), _schedule_grid(world, rank, step, layout)
    if np.array_equal(got, expected):
        return
    q, k = (int(i) for i in np.argwhere(got != expected)[0])
    message = (f"chunk pair (q chunk {q}, k chunk {k}): yours {_describe(got[q, k])}, expected "
               f"{_describe(expected[q, k])}; at step {step} rank {rank} holds the K/V of rank "
               f"{schedule.kv_source(world, rank, step)}")
    mistakes = [
        ("K/V move forward: at step s rank r holds the shard of rank (r - s) mod P, not (r + s) mod P",
         _schedule_grid(world, rank, step, layout, source=(rank + step) % world)),
        ("a diagonal block (q chunk = k chunk) is 'lower': the causal mask keeps its lower triangle only",
         _schedule_grid(world, rank, step, layout, kind=lambda qc, kc: "full" if kc <= qc else "skip")),
        ("the mask is reversed: keys *before* the queries are visible (k chunk < q chunk: 'full')",
         _schedule_grid(world, rank, step, layout,
                        kind=lambda qc, kc: "full" if kc > qc else "lower" if kc == qc else "skip")),
    ]
    for diagnosis, wrong in mistakes:
        if np.array_equal(got, wrong):
            raise AssertionError(f"{message}. Diagnosis: {diagnosis}")
    raise AssertionError(message)


SCHEDULE = Part("ex11_b", 4, "block_schedule", ("block_schedule",), _schedule_cases, _schedule_run,
                _schedule_judge)


def check_block_schedule(block_schedule, *, hidden=False, seed=None):
    """Check ``block_schedule(world, rank, step, layout) -> {(q_chunk, k_chunk): "full" | "lower" | "skip"}``."""
    __tracebackhide__ = True
    run_check(SCHEDULE, {"block_schedule": block_schedule}, hidden=hidden, seed=seed)


# ------------------------------------------------------------------------------------------ (c) dK/dV route


def _route_cases(rng, hidden):
    cases = [(2, 0, 0), (2, 0, 1), (2, 1, 1), (3, 0, 1), (3, 2, 2), (4, 1, 3)]
    if hidden:
        cases += [(5, int(rng.integers(5)), int(rng.integers(5))), (8, 6, 1), (8, 3, 7)]
    return [{"world": w, "rank": r, "step": s} for w, r, s in cases]


def _route_run(fns, case):
    _refuse_library(fns)
    route = fns["dkv_route"](case["world"], case["rank"], case["step"])
    if not isinstance(route, (list, tuple, np.ndarray)):
        raise AssertionError(f"dkv_route must return a list of ranks, got {type(route).__name__}")
    return {"route": np.asarray(list(route), dtype=np.int64)}


def _route_judge(case, out):
    world, rank, step = case["world"], case["rank"], case["step"]
    got, expected = [int(r) for r in out["route"]], schedule.dkv_route(world, rank, step)
    if got == expected:
        return
    owner = schedule.kv_source(world, rank, step)
    message = (f"yours {got}, expected {expected}: at step {step} rank {rank} computes dK/dV of the keys of rank "
               f"{owner}, and the partial is forwarded to rank + 1 until it reaches rank {owner}")
    mistakes = [
        ("the route lists the ranks it passes through after leaving this rank, not this rank itself",
         [rank, *expected]),
        ("partials travel forward (to rank + 1), the way the K/V went, not backward",
         [(rank - hop) % world for hop in range(1, len(expected) + 1)]),
        ("at step 0 the keys are this rank's own: the partial stays home (an empty route)",
         [(rank + hop) % world for hop in range(1, world + 1)] if step == 0 else None),
    ]
    for diagnosis, wrong in mistakes:
        if got == wrong:
            raise AssertionError(f"{message}. Diagnosis: {diagnosis}")
    raise AssertionError(message)


ROUTE = Part("ex11_c", 2, "dkv_route", ("dkv_route",), _route_cases, _route_run, _route_judge)


def check_dkv_route(dkv_route, *, hidden=False, seed=None):
    """Check ``dkv_route(world, rank, step) -> [rank, ...]`` (the ranks the partial passes, ending at its owner)."""
    __tracebackhide__ = True
    run_check(ROUTE, {"dkv_route": dkv_route}, hidden=hidden, seed=seed)


# ------------------------------------------------------------------------------ (d) the hide threshold with GQA


def _hide_cases(rng, hidden):
    # (TFLOP/s, link GB/s, bytes per element, query heads, K/V heads)
    cases = [(400.0, 450.0, 2, 32, 8), (400.0, 450.0, 2, 32, 32), (250.0, 50.0, 2, 16, 2), (600.0, 900.0, 1, 64, 8)]
    if hidden:
        for _ in range(4):
            kv_heads = int(rng.choice([1, 2, 4, 8]))
            cases.append((float(rng.uniform(100, 900)), float(rng.uniform(25, 900)), int(rng.choice([1, 2, 4])),
                          kv_heads * int(rng.choice([1, 2, 4, 8])), kv_heads))
    return [{"tflops": t, "link_gbs": w, "element_bytes": e, "heads": h, "kv_heads": g}
            for t, w, e, h, g in cases]


def _hide_run(fns, case):
    _refuse_library(fns)
    got = fns["ring_hide_positions"](case["tflops"], case["link_gbs"], case["element_bytes"], case["heads"],
                                      case["kv_heads"])
    try:
        return {"positions": np.asarray(float(got), dtype=np.float64)}
    except (TypeError, ValueError):
        raise AssertionError(f"ring_hide_positions must return one number (positions per rank), got "
                             f"{type(got).__name__}") from None


def _hide_expected(case, *, group=None, element_bytes=None, causal=True):
    group = case["heads"] // case["kv_heads"] if group is None else group
    element_bytes = case["element_bytes"] if element_bytes is None else element_bytes
    return cost.hide_positions(case["tflops"], case["link_gbs"] * 1e9, element_bytes=element_bytes, group=group,
                               causal=causal)


def _hide_judge(case, out):
    got, expected = float(out["positions"]), _hide_expected(case)
    if expected and got and not np.isclose(got, expected, rtol=1e-6):
        for power in (3, 9, 12, -3, -9, -12):
            if np.isclose(got / expected, 10.0 ** power, rtol=1e-6):
                raise AssertionError(
                    f"yours {got:.6g} positions, expected {expected:.6g}: off by 10^{power}. Diagnosis: units: "
                    "TFLOP/s is 1e12 FLOP/s and GB/s 1e9 bytes/s; convert both before dividing")
    group = case["heads"] // case["kv_heads"]
    mistakes = [
        ("you forgot the group size G = heads / kv_heads: with grouped-query attention the ring sends the K/V of "
         "kv_heads heads, G times fewer bytes, while every query head still computes; the threshold is "
         "e R / (G W)", lambda: _hide_expected(case, group=1)),
        ("G divides the threshold, it does not multiply it: fewer K/V heads mean fewer bytes to hide, so fewer "
         "positions suffice", lambda: _hide_expected(case, group=1) * group),
        ("half the threshold: under the causal mask with the zigzag layout a step computes half of an n x n block "
         "(2 H n^2 D FLOPs, not 4 H n^2 D), and the ring sends both K and V (2 n (H/G) D elements)",
         lambda: _hide_expected(case, causal=False)),
        ("the bytes per element are missing: the transfer is 2 n (H/G) D elements of e bytes each",
         lambda: _hide_expected(case, element_bytes=1)),
    ]
    if not np.isclose(got, expected, rtol=1e-6):
        # two mistakes can give the same number (2 bytes per element left out = half the threshold): name each
        matching = [d for d, make in mistakes if not np.isclose(make(), expected, rtol=1e-6)
                    and np.isclose(got, make(), rtol=1e-6)]
        if matching:
            raise AssertionError(f"yours {got:.6g} positions per rank, expected {expected:.6g}. Diagnosis: "
                                 + " Or: ".join(matching))
    compare("positions per rank", np.asarray(got), np.asarray(expected), dtype="float64", check_dtype=False)


HIDE = Part("ex11_d", 2, "ring_hide_positions (GQA)", ("ring_hide_positions",), _hide_cases, _hide_run,
            _hide_judge)


def check_ring_hide_positions(ring_hide_positions, *, hidden=False, seed=None):
    """Check ``ring_hide_positions(tflops, link_gbs, element_bytes, heads, kv_heads) -> positions per rank``."""
    __tracebackhide__ = True
    run_check(HIDE, {"ring_hide_positions": ring_hide_positions}, hidden=hidden, seed=seed)


PARTS = [ZIGZAG, SCHEDULE, ROUTE, HIDE]
