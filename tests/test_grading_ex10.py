"""Exercise 10's checks: right answers pass the hidden tests, each usual mistake in a mask rule, in the block
classification, in the Triton mask_mod and in a draft tree's mask is rejected with its diagnosis, and the
library's own answer earns nothing."""

from __future__ import annotations

import numpy as np
import pytest
import triton
import triton.language as tl  # noqa: F401 (the interpreter wants it beside a jit function)

from flashcourse import grading, reference, tiled
from flashcourse.grading import ex10


def _prefix(b, h, q, kv, lengths):
    return (kv <= q) | (kv < lengths[b])


def _chunked(b, h, q, kv, chunk):
    return (q // chunk == kv // chunk) & (kv <= q)


def _kinds(mask_mod, n_q, n_k, block_q, block_k, batch, heads, *, pad=False, only_first=False, partial="masked",
           transpose=False):
    """A block classification, right by default; the keywords make the usual mistakes."""
    grid = []
    bs = np.arange(1 if only_first else batch)[:, None, None, None]
    hs = np.arange(1 if only_first else heads)[None, :, None, None]
    for q_start in range(0, n_q, block_q):
        row = []
        for k_start in range(0, n_k, block_k):
            q_stop = q_start + block_q if pad else min(q_start + block_q, n_q)
            k_stop = k_start + block_k if pad else min(k_start + block_k, n_k)
            q = np.arange(q_start, q_stop)[:, None]
            kv = np.arange(k_start, k_stop)[None, :]
            keep = np.broadcast_to(mask_mod(bs, hs, np.minimum(q, n_q - 1), np.minimum(kv, n_k - 1)),
                                   (bs.shape[0], hs.shape[1], q.size, kv.size)) & (q < n_q) & (kv < n_k)
            row.append("full" if keep.all() else partial if keep.any() else "skipped")
        grid.append(row)
    return np.array(grid).T if transpose else grid


def test_correct_answers_pass_the_hidden_tests():
    grading.check_prefix_lm_mask(_prefix, hidden=True)
    grading.check_chunked_causal_mask(_chunked, hidden=True)
    grading.check_block_kinds(_kinds, hidden=True)


def test_the_block_kinds_of_the_tests_are_the_librarys():
    """The reference answer of part (c) is tiled.tile_schedule; the test's own loop agrees with it."""
    ids = np.sort(np.random.default_rng(0).integers(0, 3, size=(2, 30)), axis=1)
    mask_mod = lambda b, h, q, kv: (ids[b, q] == ids[b, kv]) & ((h == 0) | (kv <= q))  # noqa: E731
    tiles = tiled.tile_schedule(30, 30, 8, 4, mask_mod=mask_mod, batch=2, heads=2)
    assert [t.kind for t in tiles] == [k for row in _kinds(mask_mod, 30, 30, 8, 4, 2, 2) for k in row]


PREFIX_MISTAKES = {
    "kv_idx < prefix_lengths\\[b\\], not <=": lambda b, h, q, kv, p: (kv <= q) | (kv <= p[b]),
    "a query sees itself": lambda b, h, q, kv, p: (kv < q) | (kv < p[b]),
    "OR the prefix test with kv_idx <= q_idx": lambda b, h, q, kv, p: kv < p[b],
    "with \\|, not &": lambda b, h, q, kv, p: (kv <= q) & (kv < p[b]),
    "index prefix_lengths with b": lambda b, h, q, kv, p: (kv <= q) | (kv < p[0]),
    "not q_idx": lambda b, h, q, kv, p: (kv <= q) | (q < p[b]),
    "has dtype int64, but a boolean": lambda b, h, q, kv, p: ((kv <= q) | (kv < p[b])).astype(np.int64),
    "does not broadcast": lambda b, h, q, kv, p: np.ones((3, 5), dtype=bool),
    "your function raised ValueError": lambda b, h, q, kv, p: (kv <= q) or (kv < p[b]),
}


@pytest.mark.parametrize("diagnosis", PREFIX_MISTAKES)
def test_prefix_mistakes_are_rejected_with_their_diagnosis(diagnosis):
    with pytest.raises(AssertionError, match=diagnosis):
        grading.check_prefix_lm_mask(PREFIX_MISTAKES[diagnosis])


CHUNK_MISTAKES = {
    "that is a sliding window": lambda b, h, q, kv, c: (q - kv < c) & (kv <= q),
    "still sees only the keys up to itself": lambda b, h, q, kv, c: q // c == kv // c,
    "a query sees itself": lambda b, h, q, kv, c: (q // c == kv // c) & (kv < q),
    "not by the remainder": lambda b, h, q, kv, c: (q % c == kv % c) & (kv <= q),
}


@pytest.mark.parametrize("diagnosis", CHUNK_MISTAKES)
def test_chunk_mistakes_are_rejected_with_their_diagnosis(diagnosis):
    with pytest.raises(AssertionError, match=diagnosis):
        grading.check_chunked_causal_mask(CHUNK_MISTAKES[diagnosis])


KINDS_MISTAKES = {
    "'full' means every entry is visible": lambda *a: _kinds(*a, partial="full"),
    "'skipped' means no entry is visible": lambda *a: _kinds(*a, partial="skipped"),
    "evaluate the rule for every b and h": lambda *a: _kinds(*a, only_first=True),
    "positions >= N do not exist": lambda *a: _kinds(*a, pad=True),
    "grid is transposed: rows are query blocks": lambda *a: _kinds(*a, transpose=True),
    "returned kinds \\['partial'\\]": lambda *a: [["partial" if k == "masked" else k for k in row]
                                                  for row in _kinds(*a)],
}


@pytest.mark.parametrize("diagnosis", KINDS_MISTAKES)
def test_block_kind_mistakes_are_rejected_with_their_diagnosis(diagnosis):
    with pytest.raises(AssertionError, match=diagnosis):
        grading.check_block_kinds(KINDS_MISTAKES[diagnosis])


def test_the_librarys_rule_earns_nothing():
    def via_library(b, h, q, kv, lengths):
        rule = reference.attention_rule(100, 100, batch=len(lengths), heads=4, causal=True)
        return rule.block(b, h, q, kv)[0] | (kv < lengths[b])

    with pytest.raises(AssertionError, match="earns no points"):
        grading.check_prefix_lm_mask(via_library)

    def via_schedule(mask_mod, n_q, n_k, block_q, block_k, batch, heads):
        tiles = tiled.tile_schedule(n_q, n_k, block_q, block_k, mask_mod=mask_mod, batch=batch, heads=heads)
        return np.array([t.kind for t in tiles]).reshape(-(-n_q // block_q), -1)

    with pytest.raises(AssertionError, match="earns no points"):
        grading.check_block_kinds(via_schedule)


@triton.jit
def _chunked_16(b, h, q_idx, kv_idx):
    return (q_idx // 16 == kv_idx // 16) & (kv_idx <= q_idx)


@triton.jit
def _sliding_16(b, h, q_idx, kv_idx):
    return (q_idx - kv_idx < 16) & (kv_idx <= q_idx)


@triton.jit
def _chunk_without_causal(b, h, q_idx, kv_idx):
    return q_idx // 16 == kv_idx // 16


def test_the_triton_mask_mod_is_evaluated_tile_by_tile_and_judged():
    grading.check_chunked_causal_triton(_chunked_16, hidden=True)
    with pytest.raises(AssertionError, match="that is a sliding window"):
        grading.check_chunked_causal_triton(_sliding_16)
    with pytest.raises(AssertionError, match="still sees only the keys up to itself"):
        grading.check_chunked_causal_triton(_chunk_without_causal)
    with pytest.raises(AssertionError, match="decorate it with @triton.jit"):
        grading.check_chunked_causal_triton(lambda b, h, q, kv: _chunked(b, h, q, kv, 16))


def _tree(parents, n_cache, *, causal=False, self_=True, cache=True, descendants=False, parent_only=False):
    """A draft tree's mask from a walk up the parents, right by default; the keywords make the usual mistakes."""
    k = len(parents)
    drafts = np.zeros((k, k), dtype=bool)
    for i in range(k):
        node, steps = i, 0
        while node != -1 and not (parent_only and steps == 2):  # itself, then its parent, ...
            drafts[i, node] = True
            node, steps = parents[node], steps + 1
    if causal:
        drafts = np.tril(np.ones((k, k), dtype=bool))
    if not self_:
        drafts &= ~np.eye(k, dtype=bool)
    if descendants:
        drafts = drafts.T
    return np.concatenate([np.full((k, n_cache), cache), drafts], axis=1)


def test_a_right_tree_mask_passes_the_hidden_tests_as_an_array_or_a_list():
    ex10.check_tree_mask(_tree, hidden=True)
    ex10.check_tree_mask(lambda parents, n_cache: _tree(parents, n_cache).tolist())


TREE_MISTAKES = {
    "plain causal over the flattened list": lambda p, n: _tree(p, n, causal=True),
    "a draft sees itself too": lambda p, n: _tree(p, n, self_=False),
    "every draft sees the whole cache": lambda p, n: _tree(p, n, cache=False),
    "the other direction \\(descendants\\)": lambda p, n: _tree(p, n, descendants=True),
    "not only its parent": lambda p, n: _tree(p, n, parent_only=True),
    "has dtype int64, but a boolean": lambda p, n: _tree(p, n).astype(np.int64),
    "the cache's columns are missing": lambda p, n: _tree(p, n)[:, n:],
    "transposed\\? rows are drafts": lambda p, n: _tree(p, n).T,
}


@pytest.mark.parametrize("diagnosis", TREE_MISTAKES)
def test_tree_mask_mistakes_are_rejected_with_their_diagnosis(diagnosis):
    with pytest.raises(AssertionError, match=diagnosis):
        ex10.check_tree_mask(TREE_MISTAKES[diagnosis])


def test_the_exercise_is_registered_with_its_parts():
    assert [part.grade_id for part in grading.parts("ex10_mask_rules")] == ["ex10_a", "ex10_b", "ex10_c", "ex10_d",
                                                                           "ex10_e"]
    assert sum(part.points for part in grading.parts("ex10")) == 13

