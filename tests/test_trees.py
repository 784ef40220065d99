"""Draft trees for speculative decoding (trees.py): the parent list checked, the ancestor and tree masks against
masks written out by hand, the path property (tree attention = causal attention of each root-to-leaf path) on
chains, stars, complete, random and one-draft trees, and a complete tree's Triton mask_mod in the kernel."""

from __future__ import annotations

import numpy as np
import pytest

from flashcourse import reference, tiled, trees
from flashcourse.tolerance import assert_close


def _random_parents(rng, k: int) -> np.ndarray:
    return np.array([rng.integers(-1, i) for i in range(k)], dtype=np.int64)  # parent in -1 .. i-1


SHAPES = {
    "one draft": [-1],
    "chain": [-1, 0, 1, 2, 3],
    "star": [-1] * 6,
    "example": list(trees.EXAMPLE_PARENTS),
    "complete 3 x 2": list(trees.complete_tree(3, 2)),
    "deep and wide": [-1, -1, -1, -1, 0, 0, 0, 4, 4, 7, 9, 10, 3, 12],
}


@pytest.mark.parametrize(("parents", "message"), [
    ([], "is empty"),
    ([[-1, 0]], "expected a 1-D list"),
    ([-1, 0.5], "expected integers"),
    ([-1, -3], r"parents\[1\] = -3 is out of range"),
    ([-1, 7], r"parents\[1\] = 7 is out of range: there are only 2 drafts"),
    ([-1, 1], "its own parent, a cycle"),
    ([-1, 2, 1], r"parents\[1\] = 2: a cycle"),
    ([-1, 2, -1], r"parents\[1\] = 2: a forward parent"),
])
def test_bad_parent_lists_are_refused_with_the_draft_that_is_wrong(parents, message):
    with pytest.raises((ValueError, TypeError), match=message):
        trees.validate_parents(parents)


def test_bad_cache_lengths_are_refused():
    for n_cache in (-1, 2.0, True):
        with pytest.raises(ValueError, match="n_cache"):
            trees.tree_attention_mask([-1], n_cache)


def test_the_example_trees_masks_written_out_by_hand():
    parents = [-1, -1, 0, 0, 2]  # two candidates; two continuations of the first; one more under draft 2
    expected = np.array([[1, 0, 0, 0, 0],
                         [0, 1, 0, 0, 0],
                         [1, 0, 1, 0, 0],
                         [1, 0, 0, 1, 0],
                         [1, 0, 1, 0, 1]], dtype=bool)
    np.testing.assert_array_equal(trees.ancestor_mask(parents), expected)
    full = trees.tree_attention_mask(parents, 3)
    assert full.shape == (5, 8) and full[:, :3].all()
    np.testing.assert_array_equal(full[:, 3:], expected)
    np.testing.assert_array_equal(trees.depths(parents), [0, 0, 1, 1, 2])
    np.testing.assert_array_equal(trees.position_ids(parents, 3), [3, 3, 4, 4, 5])
    assert trees.paths(parents) == [[1], [0, 3], [0, 2, 4]]


@pytest.mark.parametrize("name", SHAPES)
def test_the_ancestor_mask_is_the_parent_walk(name):
    parents = np.array(SHAPES[name])
    mask = trees.ancestor_mask(parents)
    for i in range(parents.size):
        walk, node = set(), i
        while node >= 0:
            walk.add(node)
            node = parents[node]
        assert set(np.flatnonzero(mask[i])) == walk, f"draft {i}"


def test_a_chain_is_plain_causal_attention():
    """With one candidate per step the tree is a chain and its mask is bottom-right causal after the cache."""
    np.testing.assert_array_equal(trees.tree_attention_mask([-1, 0, 1, 2], 5),
                                  reference.causal_mask(4, 9, q_start=5))


def test_the_flattened_causal_mask_shows_siblings_and_cousins():
    parents = trees.EXAMPLE_PARENTS
    tree, flat = trees.tree_attention_mask(parents, 4), trees.flattened_causal_mask(len(parents), 4)
    assert not (tree & ~flat).any(), "the tree mask keeps only entries that causal also keeps"
    wrong = np.argwhere(flat & ~tree)
    assert [1, 4] in wrong.tolist(), "draft 1 sees draft 0, its sibling, under plain causal"
    for i, j in wrong:
        assert j >= 4 and not trees.ancestor_mask(parents)[i, j - 4]


def test_complete_trees_have_arithmetic_parents():
    parents = trees.complete_tree(2, 3)
    assert parents.size == 2 + 4 + 8
    np.testing.assert_array_equal(parents, [-1, -1, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5])
    assert np.bincount(trees.depths(parents)).tolist() == [2, 4, 8]
    with pytest.raises(ValueError, match=">= 1"):
        trees.complete_tree(0, 2)


def test_expected_acceptance_of_a_chain_and_a_tree():
    hit = (0.6, 0.2)  # the target's token is the drafter's first guess 60% of the time, its second 20%
    assert trees.expected_accepted([-1, 0, 1], hit) == pytest.approx(0.6 + 0.6**2 + 0.6**3)
    assert trees.expected_accepted(trees.complete_tree(2, 2), hit) == pytest.approx(0.8 + 0.8**2)
    np.testing.assert_array_equal(trees.sibling_ranks([-1, -1, 0, 1, 0, -1]), [0, 1, 0, 0, 1, 2])
    assert trees.expected_accepted([-1, -1, -1], hit) == pytest.approx(0.8), "a third guess past hit adds 0"
    with pytest.raises(ValueError, match="summing to at most 1"):
        trees.expected_accepted([-1], (0.7, 0.5))


@pytest.mark.parametrize("name", [*SHAPES, "random 20", "random 40"])
def test_tree_attention_is_causal_attention_of_every_path(name, rng):
    parents = _random_parents(rng, int(name.split()[-1])) if name.startswith("random") else SHAPES[name]
    k, n_cache = len(parents), int(rng.integers(0, 12))
    q = rng.standard_normal((2, k, 8))
    keys, values = rng.standard_normal((2, 2, n_cache + k, 8))
    compared = trees.check_path_property(q, keys, values, parents)
    assert compared == sum(len(p) for p in trees.paths(parents))
    assert {d for p in trees.paths(parents) for d in p} == set(range(k)), "every draft lies on a path"


def test_the_path_property_catches_a_wrong_mask(rng, monkeypatch):
    parents = trees.EXAMPLE_PARENTS
    q, keys, values = rng.standard_normal((len(parents), 8)), *rng.standard_normal((2, 4 + len(parents), 8))
    monkeypatch.setattr(trees, "tree_attention_mask", lambda p, n: trees.flattened_causal_mask(len(p), n))
    with pytest.raises(AssertionError, match=r"draft 4 \(depth 1 of path \[0, 4\]\)"):
        trees.check_path_property(q, keys, values, parents)


def test_the_numpy_mask_mod_gives_the_mask_and_the_tile_map():
    parents, n_cache = trees.complete_tree(2, 3), 40
    mask = trees.tree_attention_mask(parents, n_cache)
    rule = trees.tree_mask_mod(parents, n_cache)
    np.testing.assert_array_equal(rule(0, 0, np.arange(14)[:, None], np.arange(54)[None, :]), mask)
    kinds = [t.kind for t in tiled.tile_schedule(14, 54, 16, 16, mask_mod=rule)]
    assert kinds == ["full", "full", "masked", "masked"]  # keys 32..47 hold cache and drafts, 48..53 drafts


def test_tree_attention_refuses_mismatched_inputs(rng):
    with pytest.raises(ValueError, match="one query per draft"):
        trees.tree_attention(rng.standard_normal((3, 4)), *rng.standard_normal((2, 6, 4)), [-1, 0])
    with pytest.raises(ValueError, match="fewer than the 3 drafts"):
        trees.tree_attention(rng.standard_normal((3, 4)), *rng.standard_normal((2, 2, 4)), [-1, 0, 0])


# ------------------------------------------------------------------------------------------ the kernel
torch = pytest.importorskip("torch")
from flashcourse import device  # noqa: E402

if not device.triton_available():
    pytest.skip("Triton is not installed here", allow_module_level=True)
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from flashcourse import kernels  # noqa: E402

CACHE = tl.constexpr(24)
BRANCHING = tl.constexpr(3)
DEPTH = tl.constexpr(2)


@triton.jit
def _complete_tree_3x2(b, h, q_idx, kv_idx):
    """The cache (24 keys) and the ancestors of a complete tree of 3 x 3 drafts, walked arithmetically."""
    draft = kv_idx - CACHE
    seen = kv_idx < CACHE
    node = q_idx
    for _ in tl.static_range(DEPTH):
        seen = seen | (node == draft)
        node = node // BRANCHING - 1
    return seen


def test_a_complete_trees_mask_mod_in_the_kernel_matches_the_reference(rng):
    parents = trees.complete_tree(3, 2)
    k = parents.size
    q = rng.standard_normal((1, 2, k, 16))
    keys, values = rng.standard_normal((2, 1, 2, 24 + k, 16))
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    as_tensor = lambda x: torch.tensor(x, dtype=torch.float32, device=dev)  # noqa: E731
    expected = trees.tree_attention(q, keys, values, parents).astype(np.float32)
    o = kernels.flash_attention(as_tensor(q), as_tensor(keys), as_tensor(values), mask_mod=_complete_tree_3x2)
    assert_close(o, expected, what="tree kernel")
    # bottom-right causal adds nothing (ancestors come first); top-left would hide the cache from the first drafts
    o = kernels.flash_attention(as_tensor(q), as_tensor(keys), as_tensor(values), mask_mod=_complete_tree_3x2,
                                causal="bottom_right")
    assert_close(o, expected, what="tree kernel, bottom-right causal")
