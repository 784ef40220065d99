"""Draft trees for speculative decoding: which draft token may see which key, as a boolean mask. NumPy only.

Speculative decoding (Leviathan et al. 2023, section 2; Chen et al. 2023) lets a cheap drafter guess several
next tokens and has the large model check all of them in one forward pass. Medusa (Cai et al. 2024, section
2.1.2) and EAGLE (Li et al. 2024) check a *tree* of guesses: several candidates for the next token, several
continuations of each, all in one pass. Each draft token must attend to the whole KV cache, to its ancestors in
the tree and to itself, and to nothing else: a sibling or a cousin is another guess, not part of its text.

A tree of ``k`` drafts is a parent list: ``parents[i]`` is the draft that draft ``i`` continues, or ``-1`` when
it continues the last accepted token (which sits in the cache). Parents come first (``parents[i] < i``), so the
flattened order is a topological one, as Medusa and EAGLE lay their trees out. The cache holds ``n_cache``
tokens, the last accepted one included, so a draft of depth 0 sits at position ``n_cache``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from . import reference, tolerance

# A sparse tree in the spirit of Medusa's: three candidates for the next token, more continuations under the
# likelier ones (lower index = likelier), one chain followed five tokens deep: 12 drafts on five levels.
EXAMPLE_PARENTS = (-1, -1, -1, 0, 0, 1, 2, 3, 3, 5, 7, 10)


def validate_parents(parents) -> np.ndarray:
    """The parent list as a 1-D int64 array, or an error that says which draft is wrong and why.

    Rules: every parent is -1 (a child of the last accepted token) or an earlier draft (``parents[i] < i``),
    which also rules out cycles (a cycle would need some draft whose parent comes after it)."""
    arr = np.asarray(parents)
    if arr.ndim != 1:
        raise ValueError(f"parents has shape {arr.shape}: expected a 1-D list, parents[i] = the parent of draft i")
    if arr.size == 0:
        raise ValueError("parents is empty: a draft tree needs at least one draft token")
    if not np.issubdtype(arr.dtype, np.integer):
        if np.issubdtype(arr.dtype, np.floating) and np.all(arr == np.round(arr)):
            arr = arr.astype(np.int64)
        else:
            raise TypeError(f"parents has dtype {arr.dtype}: expected integers (-1 or the index of a draft)")
    arr = arr.astype(np.int64)
    index = np.arange(arr.size)
    low = np.flatnonzero(arr < -1)
    if low.size:
        i = int(low[0])
        raise ValueError(f"parents[{i}] = {arr[i]} is out of range: a parent is -1 (the last accepted token) or "
                         f"the index of a draft 0..{arr.size - 1}")
    high = np.flatnonzero(arr >= arr.size)
    if high.size:
        i = int(high[0])
        raise ValueError(f"parents[{i}] = {arr[i]} is out of range: there are only {arr.size} drafts "
                         f"(0..{arr.size - 1}); a parent is -1 or one of them")
    self_loop = np.flatnonzero(arr == index)
    if self_loop.size:
        i = int(self_loop[0])
        raise ValueError(f"parents[{i}] = {i}: draft {i} is its own parent, a cycle; a parent comes before its "
                         "children (parents[i] < i)")
    forward = np.flatnonzero(arr > index)
    if forward.size:
        i = int(forward[0])
        kind = "a cycle" if _reaches(arr, int(arr[i]), i) else "a forward parent"
        raise ValueError(f"parents[{i}] = {arr[i]}: {kind}. Parents must come before their children "
                         f"(parents[i] < i), the order in which a tree is flattened for verification; renumber "
                         "the drafts in breadth-first or depth-first order")
    return arr


def _reaches(parents: np.ndarray, start: int, target: int) -> bool:
    """True when following parents from ``start`` arrives at ``target`` (at most len(parents) steps)."""
    node = start
    for _ in range(parents.size):
        if node == target:
            return True
        if node < 0:
            return False
        node = int(parents[node])
    return node == target


def depths(parents) -> np.ndarray:
    """(k,) int64: the depth of each draft, 0 for a child of the last accepted token."""
    parents = validate_parents(parents)
    depth = np.zeros(parents.size, dtype=np.int64)
    for i, p in enumerate(parents):  # parents come first, so depth[p] is known
        depth[i] = 0 if p < 0 else depth[p] + 1
    return depth


def position_ids(parents, n_cache: int) -> np.ndarray:
    """(k,) int64: each draft's position in the text, ``n_cache + depth``. Siblings share a position: they are
    guesses for the same slot. This is the position RoPE rotates q and k by (and the one ALiBi would measure
    from), not the draft's index in the flattened tree."""
    return _check_cache(n_cache) + depths(parents)


def ancestor_mask(parents) -> np.ndarray:
    """(k, k) bool: ``[i, j]`` is True when draft j is draft i or one of its ancestors."""
    parents = validate_parents(parents)
    k = parents.size
    mask = np.eye(k, dtype=bool)
    for i, p in enumerate(parents):  # a draft sees what its parent sees, and itself
        if p >= 0:
            mask[i] |= mask[p]
    return mask


def tree_attention_mask(parents, n_cache: int) -> np.ndarray:
    """(k, n_cache + k) bool: row i is what draft i sees among the cache (every key) and the drafts (its
    ancestors and itself). The keys are laid out as the cache followed by the k drafts in order."""
    anc = ancestor_mask(parents)
    n_cache = _check_cache(n_cache)
    return np.concatenate([np.ones((anc.shape[0], n_cache), dtype=bool), anc], axis=1)


def tree_mask_mod(parents, n_cache: int) -> Callable:
    """The tree as a NumPy mask_mod (b, h, q_idx, kv_idx) -> bool array for ``reference.attention`` and
    ``tiled.tile_schedule``: q_idx indexes the drafts, kv_idx the cache followed by the drafts. It reads the
    mask it closes over, as FlexAttention's closures can; the course's Triton mask_mod cannot."""
    mask = tree_attention_mask(parents, n_cache)

    def tree_rule(b, h, q_idx, kv_idx):
        return mask[q_idx, kv_idx]

    return tree_rule


def flattened_causal_mask(k: int, n_cache: int) -> np.ndarray:
    """(k, n_cache + k) bool: the wrong mask, plain (bottom-right) causal attention over the flattened tree:
    draft i sees every draft before it in the list, siblings and cousins included."""
    return reference.causal_mask(k, _check_cache(n_cache) + k, q_start=_check_cache(n_cache))


def paths(parents) -> list[list[int]]:
    """Every root-to-leaf path of the tree, as lists of draft indices from depth 0 down to the leaf."""
    parents = validate_parents(parents)
    has_child = np.zeros(parents.size, dtype=bool)
    has_child[parents[parents >= 0]] = True
    found = []
    for leaf in np.flatnonzero(~has_child):
        path, node = [], int(leaf)
        while node >= 0:
            path.append(node)
            node = int(parents[node])
        found.append(path[::-1])
    return found


def complete_tree(branching: int, depth: int) -> np.ndarray:
    """The parents of a complete tree in breadth-first order: ``branching`` candidates for the next token, each
    with ``branching`` continuations, ``depth`` levels. Its parent is arithmetic: parent(i) = i // branching - 1
    (-1 on the first level), which is what lets a Triton mask_mod without captured tensors walk it."""
    if branching < 1 or depth < 1:
        raise ValueError(f"branching = {branching}, depth = {depth}: both must be >= 1")
    k = sum(branching ** level for level in range(1, depth + 1))
    return np.arange(k, dtype=np.int64) // branching - 1


def sibling_ranks(parents) -> np.ndarray:
    """(k,) int64: each draft's rank among its siblings, 0 for the first (the drafter's likeliest candidate)."""
    parents = validate_parents(parents)
    seen: dict[int, int] = {}
    ranks = np.zeros(parents.size, dtype=np.int64)
    for i, p in enumerate(parents):
        ranks[i] = seen.get(int(p), 0)
        seen[int(p)] = ranks[i] + 1
    return ranks


def expected_accepted(parents, hit) -> float:
    """Expected number of drafts accepted per verification pass, in a toy model: at every step the target's
    token is the drafter's candidate of rank r with probability ``hit[r]`` (0 beyond ``len(hit)``), steps
    independent. A draft is accepted when its whole path is right; drafts of one depth exclude each other, so
    the expectation is the sum over drafts of the probability that their path is right."""
    parents = validate_parents(parents)
    hit = np.asarray(hit, dtype=np.float64)
    if hit.ndim != 1 or (hit < 0).any() or hit.sum() > 1 + 1e-12:
        raise ValueError(f"hit = {hit}: expected probabilities per rank, >= 0, summing to at most 1")
    ranks = sibling_ranks(parents)
    right = np.zeros(parents.size)
    for i, p in enumerate(parents):
        step = hit[ranks[i]] if ranks[i] < hit.size else 0.0
        right[i] = step * (1.0 if p < 0 else right[p])
    return float(right.sum())


def tree_attention(q, k, v, parents, *, scale=None) -> np.ndarray:
    """Attention of k draft queries over the cache and the drafts under the tree mask (``reference.attention``).

    q: (..., k, D) the drafts' queries; k, v: (..., n_cache + k, D), the cache's keys then the drafts'."""
    n_drafts = validate_parents(parents).size
    q, k, v = reference.validate_qkv(q, k, v)
    if q.shape[-2] != n_drafts:
        raise ValueError(f"q has {q.shape[-2]} rows but the tree has {n_drafts} drafts: one query per draft")
    n_cache = k.shape[-2] - n_drafts
    if n_cache < 0:
        raise ValueError(f"k has {k.shape[-2]} rows, fewer than the {n_drafts} drafts: k and v are the cache's "
                         "keys followed by one key per draft")
    return reference.attention(q, k, v, scale=scale, mask=tree_attention_mask(parents, n_cache))


def path_attention(q, k, v, parents, path: Sequence[int], *, scale=None) -> np.ndarray:
    """Plain causal attention of one root-to-leaf path as if it were the only text after the cache:
    (..., len(path), D). Queries ``q[path]``, keys the cache then ``k[n_cache + path]``, bottom-right causal.
    ``path`` starts at a root and each draft is the child of the one before (as :func:`paths` lists them)."""
    parents = validate_parents(parents)
    n_cache = k.shape[-2] - parents.size
    rows = np.asarray(path, dtype=np.int64)
    if rows.ndim != 1 or rows.size == 0 or (rows < 0).any() or (rows >= parents.size).any():
        raise ValueError(f"path {list(path)}: expected draft indices from 0 to {parents.size - 1}, root first")
    expected_parents = np.concatenate([[-1], rows[:-1]])
    if not np.array_equal(parents[rows], expected_parents):
        raise ValueError(f"path {rows.tolist()} is not a chain from a root: draft i's parent must be the draft "
                         f"before it (their parents are {parents[rows].tolist()}); trees.paths lists the chains")
    keys = np.concatenate([np.arange(n_cache), n_cache + rows])
    return reference.attention(q[..., rows, :], k[..., keys, :], v[..., keys, :], scale=scale,
                               causal="bottom_right")


def check_path_property(q, k, v, parents, *, scale=None) -> int:
    """Assert that tree attention equals, row by row, causal attention of every root-to-leaf path (each draft
    sees exactly its own path, which is why one tree pass verifies every candidate). Float64 inputs; raises
    AssertionError naming the path and the draft, returns the number of (path, draft) rows compared."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    tree = tree_attention(q, k, v, parents, scale=scale)
    compared = 0
    for path in paths(parents):
        along = path_attention(q, k, v, parents, path, scale=scale)
        for t, draft in enumerate(path):
            tolerance.assert_close(tree[..., draft, :], along[..., t, :],
                                   what=f"draft {draft} (depth {t} of path {path})")
            compared += 1
    return compared


def _check_cache(n_cache) -> int:
    if isinstance(n_cache, bool) or not isinstance(n_cache, (int, np.integer)) or n_cache < 0:
        raise ValueError(f"n_cache is {n_cache!r}: expected the number of cached tokens, an integer >= 0")
    return int(n_cache)
