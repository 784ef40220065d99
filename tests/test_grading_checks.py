"""The instant checks reject every usual mistake with the right diagnosis (one test per buggy answer), and
report library shortcuts; the correct answers pass (tests/test_exercises.py runs them in their notebooks)."""

from __future__ import annotations

import functools
import subprocess
import sys
from pathlib import Path

import nbformat
import numpy as np
import pytest

from flashcourse import grading, reference, tiled
from flashcourse.grading import _mistakes as mistakes

SOLUTIONS = Path(__file__).resolve().parents[1] / "solutions"


@functools.cache
def solution_namespace(name: str) -> dict:
    """The globals after running every code cell of solutions/<name>.ipynb except its check (grade) cells."""
    namespace: dict = {"__name__": f"solution_{name}"}
    for cell in nbformat.read(SOLUTIONS / f"{name}.ipynb", as_version=4).cells:
        if cell.cell_type == "code" and not cell.metadata.get("nbgrader", {}).get("grade", False):
            exec(compile(cell.source, f"<{name}>", "exec"), namespace)
    return namespace


def _causal(s, shift=0):
    n_q, n_k = s.shape[-2:]
    return np.where(np.arange(n_k)[None, :] > np.arange(n_q)[:, None] + shift, -np.inf, s)


def _softmax(s, axis=-1, subtract_max=True):
    e = np.exp(s - s.max(axis=axis, keepdims=True)) if subtract_max else np.exp(s)
    return e / e.sum(axis=axis, keepdims=True)


def _attention(q, k, v, causal=False, scale=None, *, power=1, shift=0, axis=-1, subtract_max=True, mask=True):
    scale = 1 / np.sqrt(q.shape[-1]) if scale is None else scale
    s = q @ np.swapaxes(k, -1, -2) * scale**power
    if causal and mask:
        s = _causal(s, shift)
    with np.errstate(all="ignore"):
        return _softmax(s, axis, subtract_max) @ v


def _rejects(check, answer, *needles):
    with pytest.raises(AssertionError) as info:
        check(answer, seed=0)
    message = str(info.value)
    for needle in needles:
        assert needle in message, f"expected {needle!r} in the message:\n{message}"


# ------------------------------------------------------------------------------------------ ex01
EX01 = {
    "scores: scale forgotten": (grading.check_attention_scores,
                                lambda q, k, scale=None: q @ np.swapaxes(k, -1, -2), mistakes.SCALE_FORGOTTEN),
    "scores: scale twice": (grading.check_attention_scores,
                            lambda q, k, scale=None: q @ np.swapaxes(k, -1, -2) / q.shape[-1]
                            if scale is None else q @ np.swapaxes(k, -1, -2) * scale**2, "twice"),
    "scores: wrong dtype": (grading.check_attention_scores,
                            lambda q, k, scale=None: (q @ np.swapaxes(k, -1, -2)).astype(np.float32),
                            "dtype float32, expected float64"),
    "scores: no return": (grading.check_attention_scores, lambda q, k, scale=None: None, "forget to `return`"),
    "mask: diagonal hidden": (grading.check_apply_causal_mask, lambda s: _causal(s, -1), mistakes.MASK_DIAGONAL),
    "mask: one late": (grading.check_apply_causal_mask, lambda s: _causal(s, 1), mistakes.MASK_ONE_LATE),
    "mask: zero instead of -inf": (grading.check_apply_causal_mask,
                                   lambda s: np.where(np.isinf(_causal(s)), 0.0, s), "must be -inf"),
    "attention: max not subtracted": (grading.check_naive_attention,
                                      lambda q, k, v, causal=False, scale=None: _attention(
                                          q, k, v, causal, scale, subtract_max=False), "NaN", mistakes.NO_MAX),
    "attention: softmax over the wrong axis": (grading.check_naive_attention,
                                               lambda q, k, v, causal=False, scale=None: _attention(
                                                   q, k, v, causal, scale, axis=-2), mistakes.WRONG_AXIS),
    "attention: scale forgotten": (grading.check_naive_attention,
                                   lambda q, k, v, causal=False, scale=None: _attention(q, k, v, causal, scale,
                                                                                        power=0),
                                   mistakes.SCALE_FORGOTTEN),
    "attention: scale twice": (grading.check_naive_attention,
                               lambda q, k, v, causal=False, scale=None: _attention(q, k, v, causal, scale,
                                                                                    power=2),
                               mistakes.SCALE_TWICE),
    "attention: mask off by one": (grading.check_naive_attention,
                                   lambda q, k, v, causal=False, scale=None: _attention(q, k, v, causal, scale,
                                                                                        shift=1),
                                   mistakes.MASK_ONE_LATE),
    "attention: mask ignored": (grading.check_naive_attention,
                                lambda q, k, v, causal=False, scale=None: _attention(q, k, v, causal, scale,
                                                                                     mask=False),
                                mistakes.MASK_MISSING),
    "attention: wrong shape": (grading.check_naive_attention,
                               lambda q, k, v, causal=False, scale=None: _softmax(q @ np.swapaxes(k, -1, -2)),
                               "has shape"),
    "attention: calls reference.attention": (grading.check_naive_attention,
                                             lambda q, k, v, causal=False, scale=None: reference.attention(
                                                 q, k, v, causal=causal, scale=scale),
                                             "flashcourse.reference.attention", "earns no points"),
    "attention: calls torch SDPA": (grading.check_naive_attention, "sdpa", "torch scaled_dot_product_attention"),
}


def _sdpa_attention(q, k, v, causal=False, scale=None):
    import torch

    out = torch.nn.functional.scaled_dot_product_attention(
        torch.from_numpy(q), torch.from_numpy(k), torch.from_numpy(v), is_causal=causal, scale=scale)
    return out.numpy()


@pytest.mark.parametrize("bug", EX01, ids=list(EX01))
def test_ex01_rejects(bug):
    check, answer, *needles = EX01[bug]
    _rejects(check, _sdpa_attention if answer == "sdpa" else answer, *needles)


# ------------------------------------------------------------------------------------------ ex02
def _softmax_no_guard(x):
    return _softmax(x)


def _merge_not_rescaled(m1, l1, m2, l2):
    return np.maximum(m1, m2), l1 + l2


def _merge_nan_on_empty(m1, l1, m2, l2):
    m = np.maximum(m1, m2)
    with np.errstate(invalid="ignore"):
        return m, l1 * np.exp(m1 - m) + l2 * np.exp(m2 - m)


def _stats_not_rescaled(x, block):
    return mistakes.online_stats(x, block, rescale=False)


def _online_not_rescaled(x, block):
    m, l = mistakes.online_stats(x, block, rescale=False)
    with np.errstate(all="ignore"):
        return np.exp(x - m[..., None]) / l[..., None]


EX02 = {
    "softmax: max not subtracted": (grading.check_softmax_safe,
                                    lambda x: _softmax(x, subtract_max=False), "NaN", mistakes.NO_MAX),
    "softmax: wrong axis": (grading.check_softmax_safe, lambda x: _softmax(x, axis=0),
                            mistakes.WRONG_AXIS),
    "softmax: NaN on a fully masked row": (grading.check_softmax_safe, _softmax_no_guard, mistakes.MASKED_ROW_NAN),
    "softmax: calls the reference": (grading.check_softmax_safe, reference.softmax_safe,
                                     "flashcourse.reference.softmax_safe"),
    "safe softmax: shifted by the row's min": (grading.check_softmax_safe,
                                               lambda x: _softmax(x - x.min(-1, keepdims=True), subtract_max=False),
                                               "NaN"),
    "merge: not rescaled": (grading.check_merge, _merge_not_rescaled, "without rescaling"),
    "merge: NaN for empty parts": (grading.check_merge, _merge_nan_on_empty, "NaN", "empty"),
    "merge: calls the reference": (grading.check_merge, reference.merge, "flashcourse.reference.merge"),
    "online stats: running sum not rescaled": (grading.check_online_stats, _stats_not_rescaled,
                                               mistakes.SUM_NOT_RESCALED),
    "online softmax: running sum not rescaled": (grading.check_softmax_online, _online_not_rescaled,
                                                 mistakes.SUM_NOT_RESCALED),
    "online softmax: calls the reference": (grading.check_softmax_online,
                                            lambda x, block: reference.softmax_online(x, block),
                                            "flashcourse.reference.softmax_online"),
}


@pytest.mark.parametrize("bug", EX02, ids=list(EX02))
def test_ex02_rejects(bug):
    check, answer, *needles = EX02[bug]
    with np.errstate(all="ignore"):
        _rejects(check, answer, *needles)


# ------------------------------------------------------------------------------------------ ex03
def _update(rescale_l=True, rescale_acc=True, subtract_max=True):
    def tile_update(m, l, acc, s, v_blk):
        m_new = np.maximum(m, s.max(axis=-1))
        safe = np.where(np.isneginf(m_new), 0.0, m_new) if subtract_max else 0.0
        p = np.exp(s - (safe[:, None] if subtract_max else 0.0))
        shrink = np.exp(m - safe)
        return (m_new, (shrink if rescale_l else 1.0) * l + p.sum(-1),
                (shrink[:, None] if rescale_acc else 1.0) * acc + p @ v_blk)
    return tile_update


def _sram_algorithm(tile_update=None, *, whole_k=False, normalise=True, power=1, shift=0, skip=True,
                    bypass=False):
    """FA2 in the simulator with one chosen mistake."""
    tile_update = tile_update or _update()

    def algorithm(mem, *, causal=False, scale=None, block_q=16, block_k=16):
        n_q, d = mem.shape("q")
        n_k = mem.shape("k")[0]
        mem.hbm_alloc("o", (n_q, d))
        for q_start in range(0, n_q, block_q):
            q_stop = min(q_start + block_q, n_q)
            q_blk = mem._hbm["q"][q_start:q_stop] if bypass else mem.load("q", slice(q_start, q_stop))
            if bypass:
                mem.hold(q_blk, "Q_i")
            m = mem.alloc((q_stop - q_start,), -np.inf)
            l = mem.alloc((q_stop - q_start,))
            acc = mem.alloc((q_stop - q_start, d))
            step = n_k if whole_k else block_k
            for k_start in range(0, n_k, step):
                if causal and skip and k_start > q_stop - 1:
                    break
                k_stop = min(k_start + step, n_k)
                k_blk = mem.load("k", slice(k_start, k_stop))
                v_blk = mem.load("v", slice(k_start, k_stop))
                s = mem.hold((q_blk @ k_blk.T) * scale**power, "S")
                if causal:
                    s[np.arange(k_start, k_stop)[None, :] > np.arange(q_start, q_stop)[:, None] + shift] = -np.inf
                m[...], l[...], acc[...] = tile_update(m, l, acc, s, v_blk)
                mem.free(k_blk, v_blk, s)
            o_blk = mem.hold(acc / l[:, None] if normalise else acc.copy(), "O")
            mem.store("o", o_blk, slice(q_start, q_stop))
            mem.free(q_blk, m, l, acc, o_blk)
    return algorithm


def _library_flash(mem, *, causal=False, scale=None, block_q=16, block_k=16):
    from flashcourse import iomodel

    iomodel._flash(mem, causal=causal, scale=scale, block_q=block_q, block_k=block_k)


EX03 = {
    "tile: running sum not rescaled": (grading.check_tile_update, _update(rescale_l=False),
                                       mistakes.SUM_NOT_RESCALED),
    "tile: output not rescaled": (grading.check_tile_update, _update(rescale_acc=False),
                                  mistakes.OUTPUT_NOT_RESCALED),
    "tile: max not subtracted": (grading.check_tile_update, _update(subtract_max=False), "overflow"),
    "sram: budget exceeded (all of K at once)": (grading.check_flash_attention_sram, _sram_algorithm(whole_k=True),
                                                 "SRAM budget exceeded"),
    "sram: output not rescaled": (grading.check_flash_attention_sram,
                                  _sram_algorithm(_update(rescale_acc=False)), mistakes.OUTPUT_NOT_RESCALED),
    "sram: running sum not rescaled": (grading.check_flash_attention_sram,
                                       _sram_algorithm(_update(rescale_l=False)), mistakes.SUM_NOT_RESCALED),
    "sram: not normalised": (grading.check_flash_attention_sram, _sram_algorithm(normalise=False),
                             mistakes.NOT_NORMALISED),
    "sram: scale forgotten": (grading.check_flash_attention_sram, _sram_algorithm(power=0),
                              mistakes.SCALE_FORGOTTEN),
    "sram: reads HBM behind the simulator's back": (grading.check_flash_attention_sram,
                                                     _sram_algorithm(bypass=True), "through mem.load"),
    "sram: calls the library's algorithm": (grading.check_flash_attention_sram, _library_flash,
                                            "flashcourse.iomodel._flash"),
    "causal: mask off by one": (grading.check_flash_attention_sram_causal, _sram_algorithm(shift=-1),
                                "hides the diagonal"),
    "causal: tiles above the diagonal loaded": (grading.check_flash_attention_sram_causal,
                                                _sram_algorithm(skip=False), "skip every key block"),
}


@pytest.mark.parametrize("bug", EX03, ids=list(EX03))
def test_ex03_rejects(bug):
    check, answer, *needles = EX03[bug]
    with np.errstate(all="ignore"):
        _rejects(check, answer, *needles)


# ------------------------------------------------------------------------------------------ ex04
def _blocks_floor(sram, d):
    block_k = sram // (4 * d)
    while block_k > 1 and 2 * block_k * d + 2 * min(block_k, d) * d + min(block_k, d) * (block_k + 4) > sram:
        block_k -= 1
    return min(block_k, d), block_k


def _flash_traffic_without_stats(n, d, sram):
    block_sizes = solution_namespace("ex04_io")["block_sizes"]
    steps = -(-n // min(block_sizes(sram, d)[1], n))
    return 2 * n * d + steps * 2 * n * d, steps * n * d


EX04 = {
    "blocks: floor instead of ceil": (grading.check_block_sizes, _blocks_floor, "ceil"),
    "blocks: SRAM budget exceeded": (grading.check_block_sizes, lambda sram, d: (d, -(-sram // (4 * d))),
                                     "SRAM budget exceeded"),
    "blocks: calls the library": (grading.check_block_sizes, lambda sram, d: __import__(
        "flashcourse.iomodel").iomodel.flash_block_sizes(sram, d), "flashcourse.iomodel.flash_block_sizes"),
    "blocks: not integers": (grading.check_block_sizes, lambda sram, d: (d / 3, sram / (4 * d)), "whole numbers"),
    "flash traffic: l and m forgotten": (grading.check_flash_traffic, _flash_traffic_without_stats,
                                         "row statistics l and m"),
    "standard traffic: P round trip forgotten": (grading.check_standard_traffic,
                                                 lambda n, d: (2 * n * d + n * n + n * d, n * n + n * d),
                                                 "P is written to HBM"),
}


@pytest.mark.parametrize("bug", EX04, ids=list(EX04))
def test_ex04_rejects(bug):
    check, answer, *needles = EX04[bug]
    _rejects(check, answer, *needles)


# ------------------------------------------------------------------------------------------ ex05
def _grads(power_dq=1, power_dk=1, shift=0, jacobian=True):
    def attention_backward(q, k, v, do, causal=False, scale=None):
        scale = 1 / np.sqrt(q.shape[-1]) if scale is None else scale
        s = q @ np.swapaxes(k, -1, -2) * scale
        if causal:
            s = _causal(s, shift)
        p = _softmax(s)
        dp = do @ np.swapaxes(v, -1, -2)
        ds = p * (dp - np.sum(p * dp, -1, keepdims=True)) if jacobian else p * dp
        return (ds @ k * scale**power_dq, np.swapaxes(ds, -1, -2) @ q * scale**power_dk,
                np.swapaxes(p, -1, -2) @ do)
    return attention_backward


def _tiles_via_naive(q, k, v, o, lse, do, *, causal=False, scale=None, block_q=16, block_k=16):
    return _grads()(q, k, v, do, causal, scale)


def _tiles_via_library(q, k, v, o, lse, do, *, causal=False, scale=None, block_q=16, block_k=16):
    return tiled.flash_backward(q, k, v, o, lse, do, causal=causal, scale=scale, block_q=block_q,
                                block_k=block_k)


EX05 = {
    "softmax backward: rowsum term missing": (grading.check_softmax_backward, lambda p, dp: p * dp,
                                              "term is missing"),
    "softmax backward: wrong axis": (grading.check_softmax_backward,
                                     lambda p, dp: p * (dp - np.sum(p * dp, axis=-2, keepdims=True)), "wrong axis"),
    "grads: scale forgotten in dq": (grading.check_attention_backward, _grads(power_dq=0), "dq misses the scale"),
    "grads: scale twice in dk": (grading.check_attention_backward, _grads(power_dk=2), "dk has the scale applied"),
    "grads: causal mask off by one": (grading.check_attention_backward, _grads(shift=1), mistakes.MASK_ONE_LATE),
    "grads: softmax jacobian term missing": (grading.check_attention_backward, _grads(jacobian=False),
                                             "misses the - rowsum"),
    "tiles: materialises N x N": (grading.check_flash_backward_tiles, _tiles_via_naive, "materialises the full"),
    "tiles: calls the library": (grading.check_flash_backward_tiles, _tiles_via_library,
                                 "flashcourse.tiled.flash_backward"),
}


@pytest.mark.parametrize("bug", EX05, ids=list(EX05))
def test_ex05_rejects(bug):
    check, answer, *needles = EX05[bug]
    _rejects(check, answer, *needles)


# ------------------------------------------------------------------------------------------ shared behaviour
def test_not_implemented_is_reported_as_such():
    def stub(q, k, scale=None):
        raise NotImplementedError("attention_scores: fill in the TODO above")

    with pytest.raises(grading.NotImplementedYet, match="not implemented yet"):
        grading.check_attention_scores(stub)


def test_a_crash_in_the_learners_code_names_the_error():
    with pytest.raises(AssertionError, match="raised ZeroDivisionError"):
        grading.check_attention_scores(lambda q, k, scale=None: 1 / 0)


def test_checks_use_fresh_inputs_and_a_seed_reproduces_them():
    seen = []

    def spy(q, k, scale=None):
        seen.append(q.copy())
        return solution_namespace("ex01_naive_attention")["attention_scores"](q, k, scale)

    grading.check_attention_scores(spy, seed=1)
    grading.check_attention_scores(spy, seed=1)
    grading.check_attention_scores(spy)
    n = len(seen) // 3
    assert all(np.array_equal(a, b) for a, b in zip(seen[:n], seen[n:2 * n], strict=True))
    assert not all(np.array_equal(a, b) for a, b in zip(seen[:n], seen[2 * n:], strict=True))


def test_the_solutions_pass_every_check_with_hidden_tests():
    for exercise in ("ex01_naive_attention", "ex02_softmax", "ex03_tiled_forward", "ex04_io", "ex05_backward"):
        namespace = solution_namespace(exercise)
        for part in grading.parts(exercise):
            grading.run_check(part, {name: namespace[name] for name in part.functions}, hidden=True)


def test_the_judge_and_the_grading_worker_import_no_notebook_packages(tmp_path):
    # Each hidden-test cell starts a judge and each graded submission a worker: nbformat (via the batch grader)
    # cost them 1.5 s a process.
    code = ("import sys, pathlib, numpy as np; import flashcourse.grading._worker; "
            "from flashcourse.grading import fresh_judge as judge; path = pathlib.Path(sys.argv[1]); "
            "judge._save(path, [{'q': np.ones(2), 'causal': True}]); assert judge._load(path)[0]['causal']; "
            "print(sorted(m for m in ('nbformat', 'jsonschema', 'nbclient', 'flashcourse.grading.batch') "
            "if m in sys.modules))")
    found = subprocess.run([sys.executable, "-c", code, str(tmp_path / "cases.npz")], capture_output=True, text=True,
                           check=True).stdout.strip()
    assert found == "[]", f"imported by the judge or the worker: {found}"
