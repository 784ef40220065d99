"""Exercise 10, attention variants as mask rules (FlexAttention's ``mask_mod``, Dong et al. 2024): a prefix-LM
rule and chunked causal attention in NumPy, FlexAttention's block classification of tiles, the chunked rule
as a Triton ``mask_mod``, and the mask of a speculative draft tree. The answers are ``reference.AttentionRule``'s,
``tiled.tile_schedule``'s and ``trees.tree_attention_mask``'s."""

from __future__ import annotations

import functools

import numpy as np

from .. import tiled, trees
from ._core import Part, run_check, to_numpy

KINDS = ("skipped", "masked", "full")  # codes 0, 1, 2 of a tile in a block-kind grid
TRITON_CHUNK = 16  # the chunk size of part (d)'s Triton mask_mod, written into its body


# ------------------------------------------------------------------------------------------ index grids
def _indices(case):
    """The index arrays a mask rule gets for one case: b (B,1,1,1), h (1,H,1,1), q_idx (N_q,1), kv_idx (1,N_k),
    positions counted from the case's offsets (a tile in the middle of the matrix)."""
    return (np.arange(case["batch"])[:, None, None, None], np.arange(case["heads"])[None, :, None, None],
            np.arange(case["q_start"], case["q_start"] + case["n_q"])[:, None],
            np.arange(case["k_start"], case["k_start"] + case["n_k"])[None, :])


def _grid(case):
    return (case["batch"], case["heads"], case["n_q"], case["n_k"])


def _as_mask(value, case, what: str) -> np.ndarray:
    """A learner's mask as a bool array of the case's full shape, or an AssertionError saying what came."""
    keep = to_numpy(value, what)
    if keep.dtype != bool:
        raise AssertionError(f"{what} has dtype {keep.dtype}, but a boolean array is expected (True = the query sees "
                             "the key): return comparisons combined with & and |, e.g. (kv_idx <= q_idx) | (...)")
    try:
        return np.broadcast_to(keep, _grid(case)).copy()
    except ValueError:
        raise AssertionError(f"{what} has shape {keep.shape}, which does not broadcast to (B, H, N_q, N_k) = "
                             f"{_grid(case)}: compute it elementwise from b, h, q_idx, kv_idx") from None


def _judge_mask(what: str, got: np.ndarray, case, expected: np.ndarray, mistakes) -> None:
    """Raise at the first (b, h, query, key) where the masks differ, with the mistake it looks like."""
    got = np.asarray(got, dtype=bool)
    expected = np.broadcast_to(expected, got.shape)
    if np.array_equal(got, expected):
        return
    b, h, i, j = (int(x) for x in np.argwhere(got != expected)[0])
    q, kv = case["q_start"] + i, case["k_start"] + j
    message = (f"{what}: b={b}, h={h}, query {q}, key {kv}: yours {bool(got[b, h, i, j])}, expected "
               f"{bool(expected[b, h, i, j])} ({int((got != expected).sum())} of {got.size} entries differ)")
    for diagnosis, wrong in mistakes:
        if np.array_equal(got, np.broadcast_to(wrong, got.shape)):
            raise AssertionError(f"{message}. Diagnosis: {diagnosis}")
    raise AssertionError(message)


def _mask_cases(rng, hidden, extra):
    """Index grids of several shapes and offsets; ``extra(rng, case)`` adds the rule's own parameters."""
    shapes = [(1, 1, 8, 8, 0, 0), (2, 1, 12, 12, 0, 0), (3, 2, 7, 16, 5, 0), (1, 1, 16, 9, 16, 3)]
    if hidden:
        shapes += [(4, 3, 40, 40, 0, 0), (2, 2, 24, 48, int(rng.integers(60)), int(rng.integers(60)))]
    cases = []
    for batch, heads, n_q, n_k, q_start, k_start in shapes:
        case = {"batch": batch, "heads": heads, "n_q": n_q, "n_k": n_k, "q_start": q_start, "k_start": k_start}
        cases.append({**case, **extra(rng, case)})
    return cases


# ------------------------------------------------------------------------------------------ (a) prefix-LM


def prefix_lm(b, h, q_idx, kv_idx, prefix_lengths):
    """The course's prefix-LM rule: a key is visible when it lies in the sequence's prefix or not after the query."""
    return (kv_idx <= q_idx) | (kv_idx < prefix_lengths[b])


def _prefix_extra(rng, case):
    lengths = rng.integers(0, case["k_start"] + case["n_k"] + 3, size=case["batch"])  # empty, inside, beyond
    lengths[0] = case["k_start"] + case["n_k"] // 2  # one prefix ends among the keys: every mistake shows
    return {"prefix_lengths": lengths.astype(np.int64)}


def _prefix_run(fns, case):
    b, h, q_idx, kv_idx = _indices(case)
    keep = fns["prefix_lm_mask"](b, h, q_idx, kv_idx, np.array(case["prefix_lengths"]))
    return {"keep": _as_mask(keep, case, "prefix_lm_mask's result")}


def _prefix_judge(case, out):
    b, h, q_idx, kv_idx = _indices(case)
    prefix = case["prefix_lengths"][b]
    _judge_mask("prefix_lm_mask", out["keep"], case, prefix_lm(b, h, q_idx, kv_idx, case["prefix_lengths"]), [
        ("the prefix is positions 0 .. P-1 of a prefix of length P: kv_idx < prefix_lengths[b], not <=",
         (kv_idx <= q_idx) | (kv_idx <= prefix)),
        ("a query sees itself: the causal part is kv_idx <= q_idx, not <", (kv_idx < q_idx) | (kv_idx < prefix)),
        ("after the prefix the rule is causal: OR the prefix test with kv_idx <= q_idx", kv_idx < prefix),
        ("a key is visible when it is in the prefix OR not after the query: combine the two tests with |, not &",
         (kv_idx <= q_idx) & (kv_idx < prefix)),
        ("each sequence of the batch has its own prefix length: index prefix_lengths with b",
         (kv_idx <= q_idx) | (kv_idx < case["prefix_lengths"][0])),
        ("the prefix is a set of keys: test kv_idx against the prefix length, not q_idx",
         (kv_idx <= q_idx) | (q_idx < prefix)),
    ])


PREFIX = Part("ex10_a", 2, "prefix_lm_mask", ("prefix_lm_mask",),
              lambda rng, hidden: _mask_cases(rng, hidden, _prefix_extra), _prefix_run, _prefix_judge)


def check_prefix_lm_mask(prefix_lm_mask, *, hidden=False, seed=None):
    """Check ``prefix_lm_mask(b, h, q_idx, kv_idx, prefix_lengths) -> bool array`` (broadcast index arrays)."""
    __tracebackhide__ = True
    run_check(PREFIX, {"prefix_lm_mask": prefix_lm_mask}, hidden=hidden, seed=seed)


# ------------------------------------------------------------------------------------------ (b) chunked causal


def chunked_causal(b, h, q_idx, kv_idx, chunk):
    """The course's chunked causal rule: same chunk of ``chunk`` positions, key not after the query."""
    return (q_idx // chunk == kv_idx // chunk) & (kv_idx <= q_idx)


def _chunk_mistakes(q_idx, kv_idx, chunk):
    return [
        ("that is a sliding window of `chunk` keys; chunked attention cuts the positions into fixed chunks, and a "
         "query sees the keys of its own chunk only: q_idx // chunk == kv_idx // chunk",
         (q_idx - kv_idx < chunk) & (kv_idx <= q_idx)),
        ("inside its chunk a query still sees only the keys up to itself: & (kv_idx <= q_idx)",
         q_idx // chunk == kv_idx // chunk),
        ("a query sees itself: kv_idx <= q_idx, not <", (q_idx // chunk == kv_idx // chunk) & (kv_idx < q_idx)),
        ("the chunks are numbered by integer division (q_idx // chunk), not by the remainder (q_idx % chunk)",
         (q_idx % chunk == kv_idx % chunk) & (kv_idx <= q_idx)),
    ]


def _chunk_extra(rng, case):
    return {"chunk": int(rng.choice([3, 4, 5])) if case["n_q"] < 30 else 8}


def _chunk_run(fns, case):
    b, h, q_idx, kv_idx = _indices(case)
    return {"keep": _as_mask(fns["chunked_causal_mask"](b, h, q_idx, kv_idx, case["chunk"]), case,
                             "chunked_causal_mask's result")}


def _chunk_judge(case, out):
    b, h, q_idx, kv_idx = _indices(case)
    _judge_mask("chunked_causal_mask", out["keep"], case, chunked_causal(b, h, q_idx, kv_idx, case["chunk"]),
                _chunk_mistakes(q_idx, kv_idx, case["chunk"]))


CHUNKED = Part("ex10_b", 2, "chunked_causal_mask", ("chunked_causal_mask",),
               lambda rng, hidden: _mask_cases(rng, hidden, _chunk_extra), _chunk_run, _chunk_judge)


def check_chunked_causal_mask(chunked_causal_mask, *, hidden=False, seed=None):
    """Check ``chunked_causal_mask(b, h, q_idx, kv_idx, chunk) -> bool array`` (broadcast index arrays)."""
    __tracebackhide__ = True
    run_check(CHUNKED, {"chunked_causal_mask": chunked_causal_mask}, hidden=hidden, seed=seed)


# ------------------------------------------------------------------------------------------ (c) block kinds


def case_mask_mod(case):
    """The NumPy mask_mod a block-kinds case names (cases hold only arrays and scalars, so the rule is rebuilt)."""
    rule = case["rule"]
    if rule == "causal":
        return lambda b, h, q_idx, kv_idx: kv_idx <= q_idx
    if rule == "window":
        return lambda b, h, q_idx, kv_idx: (kv_idx <= q_idx) & (q_idx - kv_idx <= case["size"])
    if rule == "chunked":
        return functools.partial(chunked_causal, chunk=case["size"])
    if rule == "documents":
        ids = np.asarray(case["document_ids"])
        return lambda b, h, q_idx, kv_idx: ids[b, q_idx] == ids[b, kv_idx]
    if rule == "heads":  # even heads causal, odd heads a window: only every head together gives the kinds
        return lambda b, h, q_idx, kv_idx: (kv_idx <= q_idx) & ((h % 2 == 0) | (q_idx - kv_idx <= case["size"]))
    raise ValueError(f"unknown rule {rule!r}")


def _kinds_cases(rng, hidden):
    cases = [("causal", 1, 1, 32, 32, 8, 8, 0), ("causal", 1, 1, 30, 30, 8, 8, 0),
             ("window", 1, 1, 40, 40, 8, 8, 9), ("chunked", 1, 1, 36, 36, 6, 4, 12),
             ("heads", 1, 2, 24, 24, 4, 4, 5), ("documents", 2, 1, 28, 28, 4, 8, 0)]
    if hidden:
        cases += [("window", 2, 3, 70, 70, 16, 8, int(rng.integers(5, 30))), ("heads", 2, 4, 45, 45, 8, 16, 6),
                  ("documents", 3, 2, 50, 50, 8, 8, 0), ("chunked", 1, 1, 64, 64, 16, 16, 20)]
    out = []
    for rule, batch, heads, n_q, n_k, block_q, block_k, size in cases:
        case = {"rule": rule, "batch": batch, "heads": heads, "n_q": n_q, "n_k": n_k, "block_q": block_q,
                "block_k": block_k, "size": size}
        if rule == "documents":
            case["document_ids"] = np.sort(rng.integers(0, 4, size=(batch, n_q)), axis=1).astype(np.int64)
        out.append(case)
    return out


def _kinds_run(fns, case):
    kinds = fns["block_kinds"](case_mask_mod(case), case["n_q"], case["n_k"], case["block_q"], case["block_k"],
                               case["batch"], case["heads"])
    kinds = np.asarray(kinds, dtype=object)
    if kinds.ndim != 2:
        raise AssertionError(f"block_kinds must return a 2-D grid (query blocks x key blocks) of kinds, got "
                             f"{kinds.ndim} dims")
    unknown = {str(k) for k in kinds.ravel()} - set(KINDS)
    if unknown:
        raise AssertionError(f"block_kinds returned kinds {sorted(unknown)}: expected only {KINDS}")
    return {"codes": np.vectorize(KINDS.index, otypes=[np.int64])(kinds) if kinds.size else kinds.astype(np.int64)}


def _kinds_grid(case, *, batch=None, heads=None, padded=False, partial="masked") -> np.ndarray:
    """Codes of the block kinds: the course's (tiled.tile_schedule) or, with the keywords, a usual mistake's:
    only some batch entries / heads, last blocks padded with masked positions, partial tiles called otherwise."""
    n_q, n_k, block_q, block_k = case["n_q"], case["n_k"], case["block_q"], case["block_k"]
    batch, heads = batch or case["batch"], heads or case["heads"]
    if not padded:
        tiles = tiled.tile_schedule(n_q, n_k, block_q, block_k, mask_mod=case_mask_mod(case), batch=batch,
                                    heads=heads)
        grid = np.array([KINDS.index(t.kind) for t in tiles]).reshape(-(-n_q // block_q), -(-n_k // block_k))
    else:
        rows, cols = -(-n_q // block_q) * block_q, -(-n_k // block_k) * block_k
        q_idx, kv_idx = np.arange(rows)[:, None], np.arange(cols)[None, :]
        keep = case_mask_mod(case)(np.arange(batch)[:, None, None, None], np.arange(heads)[None, :, None, None],
                                   np.minimum(q_idx, n_q - 1), np.minimum(kv_idx, n_k - 1))
        keep = np.broadcast_to(keep & (q_idx < n_q) & (kv_idx < n_k), (batch, heads, rows, cols))
        tiles = keep.reshape(batch * heads, rows // block_q, block_q, cols // block_k, block_k)
        seen, full = tiles.any(axis=(0, 2, 4)), tiles.all(axis=(0, 2, 4))
        grid = np.where(full, 2, np.where(seen, 1, 0))
    if partial != "masked":
        grid = np.where(grid == 1, KINDS.index(partial), grid)
    return grid


def _kinds_judge(case, out):
    got, expected = np.asarray(out["codes"]), _kinds_grid(case)
    if got.shape != expected.shape:
        hint = " (transposed? rows are query blocks, columns key blocks)" if got.shape == expected.shape[::-1] else ""
        raise AssertionError(f"the grid has shape {got.shape}, expected {expected.shape}: ceil(N_q / block_q) query "
                             f"blocks by ceil(N_k / block_k) key blocks{hint}")
    if np.array_equal(got, expected):
        return
    i, j = (int(x) for x in np.argwhere(got != expected)[0])
    message = (f"tile (query block {i}, key block {j}): yours {KINDS[got[i, j]]!r}, expected "
               f"{KINDS[expected[i, j]]!r} (rule {case['rule']!r}, {int((got != expected).sum())} tiles differ)")
    mistakes = [
        ("the grid is transposed: rows are query blocks, columns key blocks",
         expected.T if expected.shape[0] == expected.shape[1] else None),
        ("a tile with some visible and some hidden entries is 'masked' (the kernel must apply the mask there); "
         "'full' means every entry is visible", _kinds_grid(case, partial="full")),
        ("a tile with any visible entry must be computed ('masked'); 'skipped' means no entry is visible",
         _kinds_grid(case, partial="skipped")),
        ("a tile is skipped only when no batch entry and no head sees any of its entries, and full only when "
         "all of them see all: evaluate the rule for every b and h", _kinds_grid(case, batch=1, heads=1)),
        ("the last blocks are shorter when N is not a multiple of the block size: positions >= N do not exist, "
         "so they must not make a tile 'masked'", _kinds_grid(case, padded=True)),
    ]
    for diagnosis, wrong in mistakes:
        if wrong is not None and np.array_equal(got, wrong):
            raise AssertionError(f"{message}. Diagnosis: {diagnosis}")
    raise AssertionError(message)


KINDS_PART = Part("ex10_c", 3, "block_kinds", ("block_kinds",), _kinds_cases, _kinds_run, _kinds_judge)


def check_block_kinds(block_kinds, *, hidden=False, seed=None):
    """Check ``block_kinds(mask_mod, n_q, n_k, block_q, block_k, batch, heads) -> grid of "skipped" | "masked" |
    "full"`` (query blocks x key blocks)."""
    __tracebackhide__ = True
    run_check(KINDS_PART, {"block_kinds": block_kinds}, hidden=hidden, seed=seed)


# ------------------------------------------------------------------------------------------ (d) Triton mask_mod


@functools.cache
def _evaluator():
    """A tiny Triton kernel that calls a mask_mod (a constexpr argument) on a (BLOCK, BLOCK) tile of indices per
    program and stores its booleans: what the attention kernels would see, without the attention around it."""
    from .. import device

    device.setup()  # before Triton is imported: without a GPU the interpreter runs it on the CPU
    import triton
    import triton.language as tl

    @triton.jit
    def evaluate_mask_mod(out_ptr, n_q, n_k, heads, mask_mod: tl.constexpr, BLOCK: tl.constexpr):
        pid_q, pid_k, pid_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        b, h = pid_bh // heads, pid_bh % heads
        q_idx = pid_q * BLOCK + tl.arange(0, BLOCK)[:, None]
        kv_idx = pid_k * BLOCK + tl.arange(0, BLOCK)[None, :]
        keep = tl.broadcast_to(mask_mod(b, h, q_idx, kv_idx), (BLOCK, BLOCK))
        inside = (q_idx < n_q) & (kv_idx < n_k)
        tl.store(out_ptr + (pid_bh * n_q + q_idx) * n_k + kv_idx, keep.to(tl.int8), mask=inside)

    return triton, evaluate_mask_mod


def evaluate_mask_mod(mask_mod, batch: int, heads: int, n_q: int, n_k: int, block: int = 16) -> np.ndarray:
    """The (B, H, N_q, N_k) booleans a Triton mask_mod gives, evaluated by a Triton kernel tile by tile."""
    import torch

    triton, kernel = _evaluator()
    from triton.runtime.interpreter import InterpretedFunction

    if not isinstance(mask_mod, (triton.runtime.JITFunction, InterpretedFunction)):  # on a GPU / the CPU
        raise AssertionError(f"the mask_mod is a {type(mask_mod).__name__}, but a Triton function is expected: "
                             "decorate it with @triton.jit, so a kernel can call it")
    from ._core import to_tensor

    out = to_tensor(np.zeros((batch, heads, n_q, n_k), dtype=np.int8))
    kernel[(triton.cdiv(n_q, block), triton.cdiv(n_k, block), batch * heads)](out, n_q, n_k, heads, mask_mod,
                                                                              BLOCK=block)
    return out.to(torch.bool).cpu().numpy()


def _triton_cases(rng, hidden):
    shapes = [(1, 1, 40, 40), (2, 2, 33, 50), (1, 3, 20, 64)]
    if hidden:
        shapes += [(2, 2, 80, 96), (3, 1, int(rng.integers(17, 70)), int(rng.integers(17, 70)))]
    return [{"batch": b, "heads": h, "n_q": n_q, "n_k": n_k, "q_start": 0, "k_start": 0} for b, h, n_q, n_k in shapes]


def _triton_run(fns, case):
    return {"keep": evaluate_mask_mod(fns["chunked_causal_triton"], case["batch"], case["heads"], case["n_q"],
                                      case["n_k"])}


def _triton_judge(case, out):
    b, h, q_idx, kv_idx = _indices(case)
    _judge_mask("chunked_causal_triton", out["keep"], case, chunked_causal(b, h, q_idx, kv_idx, TRITON_CHUNK),
                _chunk_mistakes(q_idx, kv_idx, TRITON_CHUNK))


TRITON = Part("ex10_d", 3, "chunked_causal_triton", ("chunked_causal_triton",), _triton_cases, _triton_run,
              _triton_judge)


def check_chunked_causal_triton(chunked_causal_triton, *, hidden=False, seed=None):
    """Check the @triton.jit ``chunked_causal_triton(b, h, q_idx, kv_idx)`` (chunks of 16) over tiles of indices."""
    __tracebackhide__ = True
    run_check(TRITON, {"chunked_causal_triton": chunked_causal_triton}, hidden=hidden, seed=seed)


# ------------------------------------------------------------------------------------------ (e) draft tree


def _tree_cases(rng, hidden):
    """Draft trees of every shape the usual mistakes show on: one draft, a chain, a star, Medusa-like, complete,
    deep and wide; hidden: random trees and random caches."""
    shapes = [("one draft", [-1], 3), ("chain", [-1, 0, 1, 2, 3], 4), ("star", [-1] * 5, 2),
              ("example", list(trees.EXAMPLE_PARENTS), 6), ("complete 2 x 3", list(trees.complete_tree(2, 3)), 5),
              ("deep and wide", [-1, -1, -1, 0, 0, 0, 3, 3, 6, 8, 9, 2, 11], 0)]
    if hidden:
        for k in (int(rng.integers(15, 30)), int(rng.integers(40, 65))):
            shapes.append(("random", [int(rng.integers(-1, i)) for i in range(k)], int(rng.integers(0, 50))))
        shapes.append(("random chain", list(range(-1, int(rng.integers(8, 20)))), int(rng.integers(1, 20))))
    return [{"shape": name, "parents": np.array(parents, dtype=np.int64), "n_cache": n_cache}
            for name, parents, n_cache in shapes]


def _tree_run(fns, case):
    got = fns["tree_mask"]([int(p) for p in case["parents"]], case["n_cache"])
    if isinstance(got, (list, tuple)):
        got = np.array(got)
    keep = to_numpy(got, "tree_mask's result")
    if keep.dtype != bool:
        raise AssertionError(f"tree_mask's result has dtype {keep.dtype}, but a boolean array is expected (True = "
                             "the draft sees the key): build it with np.zeros(..., dtype=bool)")
    return {"keep": keep}


def _tree_mistakes(parents: np.ndarray, n_cache: int):
    """The masks of the usual mistakes (each a (k, n_cache + k) bool array) with their diagnoses."""
    k = parents.size
    ancestors = trees.ancestor_mask(parents)
    cache = np.ones((k, n_cache), dtype=bool)
    parent_only = np.eye(k, dtype=bool)
    parent_only[np.flatnonzero(parents >= 0), parents[parents >= 0]] = True
    return [
        ("plain causal over the flattened list lets a draft see every draft before it, its siblings and cousins "
         "included, which are other guesses, not its text: a draft sees only its ancestors (follow parents up to "
         "-1) and itself", trees.flattened_causal_mask(k, n_cache)),
        ("a draft sees itself too: set the entry of key n_cache + i in row i",
         np.concatenate([cache, ancestors & ~np.eye(k, dtype=bool)], axis=1)),
        ("every draft sees the whole cache: the first n_cache columns are all True",
         np.concatenate([~cache, ancestors], axis=1)),
        ("that is the other direction (descendants): draft i sees draft j when j is on i's path up to the root, "
         "reached from i by following parents, not when i is reached from j",
         np.concatenate([cache, ancestors.T], axis=1)),
        ("a draft sees all its ancestors, not only its parent: keep following parents until -1",
         np.concatenate([cache, parent_only], axis=1)),
    ]


def _tree_judge(case, out):
    parents, n_cache = case["parents"], case["n_cache"]
    k = parents.size
    got, expected = out["keep"], trees.tree_attention_mask(parents, n_cache)
    if got.shape != expected.shape:
        hint = ""
        if got.shape == (k, k) and n_cache:
            hint = ": the cache's columns are missing; the keys are the n_cache cached tokens, then the k drafts"
        elif got.shape == expected.shape[::-1]:
            hint = " (transposed? rows are drafts, the queries; columns are keys)"
        raise AssertionError(f"tree_mask's result has shape {got.shape}, expected (k, n_cache + k) = "
                             f"{expected.shape}{hint}")
    if np.array_equal(got, expected):
        return
    i, j = (int(x) for x in np.argwhere(got != expected)[0])
    key = f"cached key {j}" if j < n_cache else f"draft {j - n_cache}"
    message = (f"draft {i} (parent {int(parents[i])}), {key}: yours {bool(got[i, j])}, expected "
               f"{bool(expected[i, j])} ({int((got != expected).sum())} of {got.size} entries differ)")
    for diagnosis, wrong in _tree_mistakes(parents, n_cache):
        if np.array_equal(got, wrong):
            raise AssertionError(f"{message}. Diagnosis: {diagnosis}")
    raise AssertionError(message)


TREE = Part("ex10_e", 3, "tree_mask", ("tree_mask",), _tree_cases, _tree_run, _tree_judge)


def check_tree_mask(tree_mask, *, hidden=False, seed=None):
    """Check ``tree_mask(parents, n_cache) -> (k, n_cache + k) bool``: a draft sees the cache, its ancestors and
    itself."""
    __tracebackhide__ = True
    run_check(TREE, {"tree_mask": tree_mask}, hidden=hidden, seed=seed)


PARTS = [PREFIX, CHUNKED, KINDS_PART, TRITON, TREE]
