"""Exercise 03, the tiled forward: one online-softmax tile update, then FlashAttention-2's forward run inside
the SRAM budget of ``flashcourse.iomodel`` (so holding an N x N block raises), then its causal version with the
tiles above the diagonal skipped."""

from __future__ import annotations

import numpy as np

from .. import iomodel, reference
from . import _mistakes as mistakes
from ._core import Part, compare, copies, qkv_case, run_check, to_numpy

# ------------------------------------------------------------------------------------------ (a) one tile


def _update_cases(rng, hidden):
    cases = []
    sizes = [(1, 1, 1, 2, 1), (4, 3, 5, 3, 1), (6, 4, 4, 2, 300), (8, 8, 8, 8, 1), (5, 2, 7, 4, 1)]
    if hidden:
        sizes += [(16, 32, 16, 16, 1), (3, 9, 1, 6, 1), (7, 5, 5, 3, 500)]
    for n_rows, k_prev, k_new, d, magnitude in sizes:  # magnitude 300: exp(s) overflows unless shifted by the max
        prev = rng.standard_normal((n_rows, k_prev)) * 2 * magnitude
        new = (rng.standard_normal((n_rows, k_new)) * 2 + 3 * rng.standard_normal((n_rows, 1))) * magnitude
        cases.append({"prev": prev, "v_prev": rng.standard_normal((k_prev, d)), "s": new,
                      "v_blk": rng.standard_normal((k_new, d))})
    first = {"prev": np.full((3, 0), 0.0), "v_prev": np.zeros((0, 4)), "s": rng.standard_normal((3, 5)),
             "v_blk": rng.standard_normal((5, 4))}  # the first tile: nothing seen yet
    masked = {"prev": np.full((3, 2), -np.inf), "v_prev": rng.standard_normal((2, 4)),
              "s": rng.standard_normal((3, 6)), "v_blk": rng.standard_normal((6, 4))}
    masked["s"][0] = -np.inf  # a row masked in both tiles so far
    masked["s"][1, 3:] = -np.inf
    return cases + [first, masked]


def _state(prev, v_prev):
    """(m, l, acc) after the tile `prev`, computed directly from its scores."""
    m = np.max(prev, axis=-1, initial=-np.inf)
    safe = np.where(np.isneginf(m), 0.0, m)
    p = np.exp(prev - safe[:, None])
    return m, p.sum(axis=-1), p @ v_prev


def _update_run(fns, case):
    m, l, acc = _state(case["prev"], case["v_prev"])
    s, v_blk = copies(case, "s", "v_blk")
    result = fns["tile_update"](m, l, acc, s, v_blk)
    if not isinstance(result, tuple) or len(result) != 3:
        raise AssertionError(f"tile_update must return a tuple (m, l, acc), got {type(result).__name__}")
    return {name: to_numpy(value, name) for name, value in zip(("m", "l", "acc"), result, strict=True)}


def _update_judge(case, out):
    prev, s, v_prev, v_blk = case["prev"], case["s"], case["v_prev"], case["v_blk"]
    m_expected, l_expected, acc_expected = _state(np.concatenate([prev, s], axis=1),
                                                  np.concatenate([v_prev, v_blk], axis=0))
    m_old, l_old, acc_old = _state(prev, v_prev)
    safe_new = np.where(np.isneginf(m_expected), 0.0, m_expected)
    p = np.exp(s - safe_new[:, None])
    hint = ("a row where everything so far is masked (m = -inf) must stay (m, l, acc) = (-inf, 0, 0), not NaN: "
            "use exp(s - 0) when the new max is -inf, and a factor of 0 for an empty old state")
    if np.abs(s[np.isfinite(s)]).max(initial=0) > 80:
        hint = mistakes.NO_MAX
    compare("m", out["m"], m_expected, dtype="float64", nan_hint=hint)
    compare("l", out["l"], l_expected, dtype="float64", nan_hint=hint,
            variants=[(mistakes.SUM_NOT_RESCALED, lambda: l_old + p.sum(-1)),
                      (mistakes.NO_MAX, lambda: l_expected * np.exp(m_expected))])
    compare("acc", out["acc"], acc_expected, dtype="float64", nan_hint=hint,
            variants=[(mistakes.OUTPUT_NOT_RESCALED, lambda: acc_old + p @ v_blk),
                      ("acc is divided by l already: keep it unnormalised, divide once at the end",
                       lambda: acc_expected / l_expected[:, None]),
                      (mistakes.NO_MAX, lambda: acc_expected * np.exp(m_expected)[:, None])])


UPDATE = Part("ex03_a", 3, "tile_update", ("tile_update",), _update_cases, _update_run, _update_judge)


def check_tile_update(tile_update, *, hidden=False, seed=None):
    """Check ``tile_update(m, l, acc, s, v_blk) -> (m, l, acc)``, one step of the online softmax of a tile."""
    __tracebackhide__ = True
    run_check(UPDATE, {"tile_update": tile_update}, hidden=hidden, seed=seed)


# ------------------------------------------------------------------------------------------ (b, c) in SRAM
MEMORY_METHODS = frozenset({"shape", "hbm_alloc", "load", "alloc", "hold", "store", "free", "free_all", "used",
                            "_take", "_array", "_index", "_fmt", "causal_mask"})


def _tile_need(d: int, block_q: int, block_k: int) -> int:
    """SRAM one FA2 step needs: Q_i, K_j, V_j, S_ij, m, l, acc and the O_i block written at the end."""
    return block_q * d + 2 * block_k * d + block_q * block_k + 2 * block_q + 2 * block_q * d


def _sram_cases(rng, hidden, causal):
    sizes = [(1, 1, 4, 4, 4), (10, 10, 3, 4, 4), (64, 64, 8, 8, 8), (37, 37, 5, 16, 8), (24, 40, 8, 8, 16)]
    if hidden:
        sizes += [(100, 100, 16, 16, 16), (65, 65, 4, 32, 8)]
    cases = []
    for n_q, n_k, d, block_q, block_k in sizes:
        if causal and n_q != n_k:
            continue
        case = qkv_case(rng, (), n_q, n_k, d, causal=causal, scale=None if n_q % 2 else 0.4)
        case.update(block_q=block_q, block_k=block_k, sram=_tile_need(d, block_q, block_k) + 8)
        cases.append(case)
    return cases


def _sram_run(fns, case):
    q, k, v = copies(case, "q", "k", "v")
    o, stats = iomodel.simulate(fns["flash_attention_sram"], q, k, v, sram=case["sram"], causal=case["causal"],
                                block_q=case["block_q"], block_k=case["block_k"], scale=case["scale"])
    return {"o": to_numpy(o, "the output o"), "reads": np.array(stats.reads), "peak": np.array(stats.peak_sram)}


def _visible_reads(case) -> int:
    """Elements FA2 reads: Q once, and K_j, V_j for each query block, only the tiles it computes."""
    n_q, d = case["q"].shape
    n_k = case["k"].shape[0]
    total = n_q * d
    for q_start in range(0, n_q, case["block_q"]):
        q_stop = min(q_start + case["block_q"], n_q)
        for k_start in range(0, n_k, case["block_k"]):
            if case["causal"] and k_start > q_stop - 1:
                continue
            total += 2 * (min(k_start + case["block_k"], n_k) - k_start) * d
    return total


def _sram_judge(case, out):
    q, k, v = case["q"], case["k"], case["v"]
    n_q, n_k = q.shape[0], k.shape[0]
    reads, least = int(out["reads"]), n_q * q.shape[1] + 2 * n_k * k.shape[1]
    if reads < least:
        raise AssertionError(
            f"only {reads} elements were loaded, but q, k and v hold {least}: read every block through "
            "mem.load (reading HBM arrays any other way is not counted, and not allowed)")
    args = dict(causal=case["causal"], scale=case["scale"])
    compare("the output o", out["o"], reference.attention(q, k, v, **args), dtype="float64",
            nan_hint=mistakes.attention_nan_hint(q, k, **args),
            variants=mistakes.flash_mistakes(q, k, v, **args, block_q=case["block_q"], block_k=case["block_k"]))
    if case["causal"] and reads > _visible_reads(case):
        raise AssertionError(
            f"the output is right, but {reads} elements were loaded where {_visible_reads(case)} suffice: "
            "with causal=True, skip every key block that starts after the query block's last row "
            "(k_start > q_stop - 1): it is fully masked, so loading it is wasted traffic")


def _sram_part(grade_id, points, causal):
    return Part(grade_id, points, "flash_attention_sram" + (" (causal)" if causal else ""),
                ("flash_attention_sram",), lambda rng, hidden: _sram_cases(rng, hidden, causal), _sram_run,
                _sram_judge, allowed=MEMORY_METHODS)


SRAM = _sram_part("ex03_b", 5, causal=False)
CAUSAL = _sram_part("ex03_c", 2, causal=True)


def check_flash_attention_sram(flash_attention_sram, *, hidden=False, seed=None):
    """Check the algorithm ``flash_attention_sram(mem, *, causal, scale, block_q, block_k)`` inside
    ``iomodel.simulate`` with an SRAM that holds one step's blocks but not N x N."""
    __tracebackhide__ = True
    run_check(SRAM, {"flash_attention_sram": flash_attention_sram}, hidden=hidden, seed=seed)


def check_flash_attention_sram_causal(flash_attention_sram, *, hidden=False, seed=None):
    """Check the causal run of ``flash_attention_sram``: right output, and no tile above the diagonal loaded."""
    __tracebackhide__ = True
    run_check(CAUSAL, {"flash_attention_sram": flash_attention_sram}, hidden=hidden, seed=seed)


PARTS = [UPDATE, SRAM, CAUSAL]
