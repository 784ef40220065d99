"""Exercise 04, IO: the block sizes that fit an SRAM of M elements, and the HBM traffic of both algorithms,
checked against what ``flashcourse.iomodel`` counts."""

from __future__ import annotations

import numpy as np

from .. import iomodel
from ._core import Part, run_check


def _as_int_pair(result, what):
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        raise AssertionError(f"{what} must return a pair of integers, got {result!r}")
    try:
        pair = [int(x) for x in result]
    except (TypeError, ValueError):
        raise AssertionError(f"{what} must return a pair of integers, got {result!r}") from None
    if any(p != x for p, x in zip(pair, result, strict=True)):
        raise AssertionError(f"{what} must return whole numbers, got {result!r}")
    return np.array(pair, dtype=np.int64)


def _need(block_q: int, block_k: int, d: int) -> int:
    """Elements one step of Algorithm 1 holds: K_j, V_j, Q_i, O_i, S_ij and four row statistics."""
    return 2 * block_k * d + 2 * block_q * d + block_q * block_k + 4 * block_q


# ------------------------------------------------------------------------------------------ (a) block sizes


def _block_cases(rng, hidden):
    pairs = [(1024, 8), (4096, 16), (24_576, 64), (100_000, 64), (300, 5)]
    if hidden:
        pairs += [(int(rng.integers(2_000, 200_000)), int(d)) for d in rng.choice([16, 32, 64, 128], 4)]
    return [{"sram": sram, "d": d} for sram, d in pairs]


def _block_run(fns, case):
    return {"blocks": _as_int_pair(fns["block_sizes"](case["sram"], case["d"]), "block_sizes")}


def _block_judge(case, out):
    sram, d = case["sram"], case["d"]
    block_q, block_k = (int(x) for x in out["blocks"])
    expected = iomodel.flash_block_sizes(sram, d)
    if min(block_q, block_k) < 1:
        raise AssertionError(f"block sizes must be at least 1, got (B_r, B_c) = ({block_q}, {block_k})")
    need = _need(block_q, block_k, d)
    if need > sram:
        raise AssertionError(
            f"SRAM budget exceeded: (B_r, B_c) = ({block_q}, {block_k}) with d = {d} needs {need} elements "
            f"(2 B_c d + 2 B_r d + B_r B_c + 4 B_r) but M = {sram}; shrink B_c until one step fits")
    if (block_q, block_k) == tuple(expected):
        return
    start = -(-sram // (4 * d))
    message = f"(B_r, B_c) = ({block_q}, {block_k}), expected {tuple(expected)} for M = {sram}, d = {d}"
    if block_k == sram // (4 * d) and start != block_k:
        message += ". Diagnosis: B_c starts at ceil(M / 4d), not floor: use -(-M // (4 * d))"
    elif block_q != min(block_k, d):
        message += ". Diagnosis: B_r = min(B_c, d)"
    elif block_k < expected[1]:
        message += ". Diagnosis: B_c is smaller than needed: shrink it one at a time only while a step does not fit"
    raise AssertionError(message)


BLOCKS = Part("ex04_a", 2, "block_sizes", ("block_sizes",), _block_cases, _block_run, _block_judge)


def check_block_sizes(block_sizes, *, hidden=False, seed=None):
    """Check ``block_sizes(sram, d) -> (block_q, block_k)`` against Algorithm 1's rule and the SRAM budget."""
    __tracebackhide__ = True
    run_check(BLOCKS, {"block_sizes": block_sizes}, hidden=hidden, seed=seed)


# ------------------------------------------------------------------------------------------ (b) flash traffic


def _flash_cases(rng, hidden):
    triples = [(16, 4, 256), (64, 8, 1024), (100, 16, 4096), (37, 8, 700)]
    if hidden:
        triples += [(int(rng.integers(50, 300)), 16, int(rng.integers(1500, 9000))), (256, 32, 20_000)]
    return [{"n": n, "d": d, "sram": sram} for n, d, sram in triples]


def _simulated(name, n, d, sram):
    zeros = np.zeros((n, d))
    return iomodel.simulate(name, zeros, zeros, zeros, sram=sram)[1]


def _flash_run(fns, case):
    return {"traffic": _as_int_pair(fns["flash_traffic"](case["n"], case["d"], case["sram"]), "flash_traffic")}


def _flash_judge(case, out):
    n, d, sram = case["n"], case["d"], case["sram"]
    stats = _simulated("flash", n, d, sram)
    reads, writes = (int(x) for x in out["traffic"])
    if (reads, writes) == (stats.reads, stats.writes):
        return
    block_k = iomodel.flash_block_sizes(sram, d, n)[1]
    t_c = -(-n // block_k)
    message = (f"(reads, writes) = ({reads}, {writes}), expected ({stats.reads}, {stats.writes}) elements "
               f"for N = {n}, d = {d}, M = {sram} (B_c = {block_k}, T_c = {t_c})")
    if (reads, writes) == (stats.reads - 2 * n * t_c, stats.writes - 2 * n * t_c):
        message += (". Diagnosis: the row statistics l and m are read and written too, once per key block "
                    "(2N elements each way per outer step)")
    elif reads == stats.reads - n * d * t_c:
        message += ". Diagnosis: O_i is read back from HBM at every step too (it is rescaled and rewritten)"
    elif reads < stats.reads and writes == stats.writes:
        message += ". Diagnosis: every outer step reads all of Q, O, l and m again; K and V are read once"
    raise AssertionError(message)


FLASH = Part("ex04_b", 3, "flash_traffic", ("flash_traffic",), _flash_cases, _flash_run, _flash_judge)


def check_flash_traffic(flash_traffic, *, hidden=False, seed=None):
    """Check ``flash_traffic(n, d, sram) -> (reads, writes)`` against iomodel.simulate("flash", ...)."""
    __tracebackhide__ = True
    run_check(FLASH, {"flash_traffic": flash_traffic}, hidden=hidden, seed=seed)


# ------------------------------------------------------------------------------------------ (c) standard traffic


def _standard_cases(rng, hidden):
    pairs = [(1, 1), (16, 4), (64, 8), (100, 16)]
    if hidden:
        pairs += [(int(rng.integers(20, 200)), int(rng.integers(2, 64))) for _ in range(2)]
    return [{"n": n, "d": d} for n, d in pairs]


def _standard_run(fns, case):
    return {"traffic": _as_int_pair(fns["standard_traffic"](case["n"], case["d"]), "standard_traffic")}


def _standard_judge(case, out):
    n, d = case["n"], case["d"]
    stats = _simulated("standard", n, d, sram=4 * (n + d) ** 2)  # room for whole matrices: Algorithm 0 as written
    reads, writes = (int(x) for x in out["traffic"])
    if (reads, writes) == (stats.reads, stats.writes):
        return
    message = f"(reads, writes) = ({reads}, {writes}), expected ({stats.reads}, {stats.writes}) for N = {n}, d = {d}"
    if reads + writes == stats.reads + stats.writes - 2 * n * n:
        message += (". Diagnosis: P is written to HBM by the softmax and read back for P V: count both "
                    "(N^2 each)")
    elif reads + writes == stats.reads + stats.writes - 4 * n * n:
        message += ". Diagnosis: S and P are each written once and read once: 4 N^2 in all"
    raise AssertionError(message)


STANDARD = Part("ex04_c", 2, "standard_traffic", ("standard_traffic",), _standard_cases, _standard_run,
                _standard_judge)


def check_standard_traffic(standard_traffic, *, hidden=False, seed=None):
    """Check ``standard_traffic(n, d) -> (reads, writes)`` of Algorithm 0 (S and P through HBM)."""
    __tracebackhide__ = True
    run_check(STANDARD, {"standard_traffic": standard_traffic}, hidden=hidden, seed=seed)


PARTS = [BLOCKS, FLASH, STANDARD]
