"""Exercise 12's checks (the drill from memory): right answers pass, each usual mistake is rejected with its
diagnosis, an N x N score matrix exceeds the memory allowed, and the clock reports the time."""

from __future__ import annotations

import numpy as np
import pytest

from flashcourse import grading


def softmax_online(x, block, *, rescale=True):
    m = np.full(x.shape[:-1], -np.inf)
    l = np.zeros(x.shape[:-1])
    for start in range(0, x.shape[-1], block):
        part = x[..., start:start + block]
        m_new = np.maximum(m, part.max(-1))
        safe = np.where(np.isneginf(m_new), 0.0, m_new)  # a row masked so far: no NaN from -inf - -inf
        alpha = np.exp(np.where(np.isneginf(m), -np.inf, m - safe))
        l = (l * alpha if rescale else l) + np.exp(part - safe[..., None]).sum(-1)
        m = m_new
    safe = np.where(np.isneginf(m), 0.0, m)
    return np.exp(x - safe[..., None]) / np.where(l == 0, 1.0, l)[..., None]


def flash_forward(q, k, v, *, block_q, block_k, causal, scale, rescale_acc=True, scale_power=1, late_mask=False,
                  dense=False):
    scale = 1 / np.sqrt(q.shape[-1]) if scale is None else scale
    if dense:  # the whole N x N matrix at once: right numbers, too much memory
        s = q @ k.T * scale
        if causal:
            s = np.where(np.arange(k.shape[0])[None, :] <= np.arange(q.shape[0])[:, None], s, -np.inf)
        lse = np.log(np.exp(s - s.max(-1, keepdims=True)).sum(-1)) + s.max(-1)
        return np.exp(s - lse[:, None]) @ v, lse
    o, lse = np.zeros((q.shape[0], v.shape[1])), np.zeros(q.shape[0])
    for qs in range(0, q.shape[0], block_q):
        rows = np.arange(qs, min(qs + block_q, q.shape[0]))
        m, l, acc = np.full(len(rows), -np.inf), np.zeros(len(rows)), np.zeros((len(rows), v.shape[1]))
        for ks in range(0, k.shape[0], block_k):
            cols = np.arange(ks, min(ks + block_k, k.shape[0]))
            s = q[rows] @ k[cols].T * scale ** scale_power
            if causal:
                s = np.where(cols[None, :] <= rows[:, None] + (1 if late_mask else 0), s, -np.inf)
            m_new = np.maximum(m, s.max(-1))
            safe = np.where(np.isneginf(m_new), 0.0, m_new)
            alpha = np.exp(np.where(np.isneginf(m), -np.inf, m - safe))
            p = np.exp(s - safe[:, None])
            l = l * alpha + p.sum(-1)
            acc = (acc * alpha[:, None] if rescale_acc else acc) + p @ v[cols]
            m = m_new
        o[rows], lse[rows] = acc / l[:, None], m + np.log(l)
    return o, lse


def test_right_answers_pass_the_hidden_tests():
    grading.check_softmax_online_from_memory(softmax_online, hidden=True)
    grading.check_flash_forward_from_memory(flash_forward, hidden=True)


def test_a_sum_that_is_not_rescaled_is_named():
    with pytest.raises(AssertionError, match="running sum is not rescaled"):
        grading.check_softmax_online_from_memory(lambda x, block: softmax_online(x, block, rescale=False))


@pytest.mark.parametrize(("mistake", "diagnosis"), [
    ({"rescale_acc": False}, "running output is not rescaled"),
    ({"scale_power": 0}, "scale"),
    ({"scale_power": 2}, "scale"),
    ({"late_mask": True}, "mask"),
])
def test_forward_mistakes_are_named(mistake, diagnosis):
    with pytest.raises(AssertionError, match=diagnosis):
        grading.check_flash_forward_from_memory(lambda q, k, v, **kw: flash_forward(q, k, v, **kw, **mistake))


def test_an_n_by_n_score_matrix_exceeds_the_memory_allowed():
    with pytest.raises(AssertionError, match="materialises the full N x N matrix"):
        grading.check_flash_forward_from_memory(lambda q, k, v, **kw: flash_forward(q, k, v, **kw, dense=True))


def test_the_clock_reports_the_time(capsys):
    grading.start_clock()
    grading.check_softmax_online_from_memory(softmax_online)
    assert "since start_clock()" in capsys.readouterr().out


def test_the_hint_free_drill_has_the_same_checks_and_no_algorithm_in_its_text():
    """ex12_from_memory_no_hints is ex12 for a timed drill: the same graded cells (ex12_a, ex12_b), statements and
    TODO lines that do not spell the algorithm out, and each notebook says which one to use for the drill."""
    from pathlib import Path

    import nbformat

    root = Path(__file__).resolve().parents[1]
    with_hints = nbformat.read(root / "exercises" / "ex12_from_memory.ipynb", as_version=4)
    drill = nbformat.read(root / "exercises" / "ex12_from_memory_no_hints.ipynb", as_version=4)

    def graded(nb):
        return [(c.metadata["nbgrader"]["grade_id"], c.metadata["nbgrader"]["points"], c.source) for c in nb.cells
                if c.metadata.get("nbgrader", {}).get("grade")]

    assert graded(drill) == graded(with_hints)
    text = "\n".join(c.source for c in drill.cells).lower()
    for hint in ("m_new", "alpha", "rescale", "running max", "running sum", "exp(m", "safe max"):
        assert hint not in text, f"the hint-free drill says {hint!r}"
    assert "ex12_from_memory.ipynb" in text and "timed drill" in text
    assert "ex12_from_memory_no_hints.ipynb" in "\n".join(c.source for c in with_hints.cells)
