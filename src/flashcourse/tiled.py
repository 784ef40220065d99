"""FlashAttention in NumPy, block by block, as the papers write it.

- :func:`flash_forward` with ``order="fa2"`` is Algorithm 1 of FlashAttention-2 (Dao, 2023, section 3.1): the
  outer loop runs over query blocks, each keeps its running max m, sum l and unnormalised output in "SRAM"
  and divides by l once at the end (delayed normalisation).
- ``order="fa1"`` is Algorithm 1 of FlashAttention (Dao et al., 2022, section 3.1): the outer loop runs over
  key/value blocks, and every query block's O, l, m are read from and written back to "HBM" at each step,
  with O kept normalised.
- :func:`flash_backward` is the backward pass of FlashAttention-2 (section 3.1.2): it recomputes each block of
  P from q, k and the saved logsumexp, with D = rowsum(dO * O), and never allocates an N x N array.
- :func:`forward_steps` yields the state after every tile, for the lessons to animate.

Arrays are (..., N, D) with any leading dims; each tile works on all leading dims at once. Computation is in
the inputs' dtype (see ``reference``). The attention variants (sliding window, soft-capping, ALiBi, documents,
``mask_mod``, grouped-query attention with k, v of fewer heads) are the options of ``reference.attention``: the
same :class:`reference.AttentionRule` decides each tile's kind (skipped, masked or full, as FlexAttention's block
mask) and masks the scores inside the partial tiles.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import groupby

import numpy as np

from . import reference

__all__ = ["TILE_KINDS", "Tile", "TileState", "flash_backward", "flash_forward", "forward_steps",
           "tile_schedule"]


# --------------------------------------------------------------------------------------------- the schedule
TILE_KINDS = ("skipped", "masked", "diagonal", "full")


@dataclass(frozen=True)
class Tile:
    """One (query block i, key block j) tile of the N_q x N_k score matrix.

    ``kind``: "full" (computed, no mask), "skipped" (no visible entry: never loaded, never computed), or a partial
    tile, computed with the mask applied inside: "diagonal" when the causal mask is the only one, else "masked".
    """

    i: int
    j: int
    q_start: int
    q_stop: int
    k_start: int
    k_stop: int
    kind: str


def _schedule(rule: reference.AttentionRule, b, h, block_q: int, block_k: int) -> list[Tile]:
    tiles = []
    for i, q_start in enumerate(range(0, rule.n_q, block_q)):
        q_stop = min(q_start + block_q, rule.n_q)
        for j, kind in enumerate(rule.tile_kinds(b, h, q_start, q_stop, block_k)):
            k_start = j * block_k
            tiles.append(Tile(i, j, q_start, q_stop, k_start, min(k_start + block_k, rule.n_k), kind))
    return tiles


def tile_schedule(n_q: int, n_k: int, block_q: int, block_k: int, *, causal=False, window=None, document_ids=None,
                  mask_mod=None, batch: int | None = None, heads: int = 1) -> list[Tile]:
    """Every tile in row-major order (query block, then key block), with its kind under the mask options.

    The options are ``reference.attention``'s that hide keys; a tile is classified over every batch entry and
    head (``batch``: from document_ids, else 1; ``heads``: 1), as the tiled algorithms run them all at once.
    """
    block_q = reference.validate_block("block_q", block_q)
    block_k = reference.validate_block("block_k", block_k)
    if batch is None:
        batch = 1 if document_ids is None else np.shape(document_ids)[0]
    rule = reference.attention_rule(n_q, n_k, batch=batch, heads=heads, causal=causal, window=window,
                                    document_ids=document_ids, mask_mod=mask_mod)
    return _schedule(rule, np.arange(batch)[:, None, None, None], np.arange(heads)[None, :, None, None],
                     block_q, block_k)


@dataclass(frozen=True)
class _Problem:
    """Validated inputs in the grouped-heads layout, with their rule, scale and tiles."""

    g: reference.GroupedHeads
    rule: reference.AttentionRule
    scale: np.floating
    tiles: list[Tile]

    def scores(self, tile: Tile, q_blk, k_blk) -> tuple[np.ndarray, np.ndarray]:
        """(scores as the softmax sees them, scaled raw scores) of one tile; the mask only on partial tiles."""
        raw = (q_blk @ np.swapaxes(k_blk, -1, -2)) * self.scale  # (..., G, Bq, Bk)
        s = self.rule.scores(raw, self.g.b, self.g.h, np.arange(tile.q_start, tile.q_stop)[:, None],
                             np.arange(tile.k_start, tile.k_stop)[None, :], mask=tile.kind != "full")
        return s, raw


def _prepare(q, k, v, scale, block_q, block_k, options) -> _Problem:
    q, k, v = reference.validate_qkv(q, k, v, gqa=True)
    block_q = reference.validate_block("block_q", block_q)
    block_k = reference.validate_block("block_k", block_k)
    rule = reference.rule_of(q, k, **options)
    g = reference.group_heads(q, k, v)
    scale = q.dtype.type(reference.resolve_scale(scale, q.shape[-1]))
    return _Problem(g, rule, scale, _schedule(rule, g.b, g.h, block_q, block_k))


def _exp_shifted(s, m):
    """exp(s - m) row-wise; rows whose max m is -inf (all masked so far) give 0, not NaN."""
    return np.exp(s - reference.safe_max(m)[..., None])


# --------------------------------------------------------------------------------------------- forward
@dataclass(frozen=True)
class TileState:
    """The running state of one query block right after tile ``tile`` was folded in (FA2 order).

    ``m``, ``l``: (..., Bq) running max and sum; ``rescale``: (..., Bq) exp(m_prev - m) applied to the old
    l and acc; ``acc``: (..., Bq, D_v) unnormalised output; ``o``: acc / l, the output so far.
    """

    tile: Tile
    m: np.ndarray
    l: np.ndarray
    rescale: np.ndarray
    acc: np.ndarray
    o: np.ndarray


def _fa2_query_block(pr: _Problem, q_blk, row_tiles: list[Tile]) -> Iterator[tuple[Tile, np.ndarray, np.ndarray,
                                                                                     np.ndarray, np.ndarray]]:
    """Run one query block over its key blocks; yield (tile, m, l, rescale, acc) after each computed tile."""
    lead = q_blk.shape[:-1]  # (..., G, Bq)
    m = np.full(lead, -np.inf, dtype=q_blk.dtype)
    l = np.zeros(lead, dtype=q_blk.dtype)
    acc = np.zeros((*lead, pr.g.v.shape[-1]), dtype=q_blk.dtype)
    for tile in row_tiles:
        if tile.kind == "skipped":
            continue
        k_blk = pr.g.k[..., tile.k_start:tile.k_stop, :]
        v_blk = pr.g.v[..., tile.k_start:tile.k_stop, :]
        s, _ = pr.scores(tile, q_blk, k_blk)
        m_new = np.maximum(m, np.max(s, axis=-1))
        p = _exp_shifted(s, m_new)  # (..., Bq, Bk), unnormalised
        rescale = reference.rescale_factor(m, m_new)
        l = rescale * l + np.sum(p, axis=-1)
        acc = rescale[..., None] * acc + p @ v_blk
        m = m_new
        yield tile, m, l, rescale, acc


def _lse(m, l):
    """The row logsumexp m + log l from the running statistics; -inf where nothing was seen (l = 0)."""
    return np.where(l > 0, reference.safe_max(m) + np.log(np.where(l > 0, l, 1.0)), -np.inf).astype(l.dtype)


def _finish(m, l, acc):
    """Delayed normalisation: o = acc / l and lse = m + log l; rows with l = 0 give o = 0, lse = -inf."""
    o = np.divide(acc, l[..., None], out=np.zeros_like(acc), where=l[..., None] > 0)
    return o, _lse(m, l)


def _flash_forward_fa2(pr: _Problem):
    q = pr.g.q
    o = np.zeros((*q.shape[:-1], pr.g.v.shape[-1]), dtype=q.dtype)
    lse = np.full(q.shape[:-1], -np.inf, dtype=q.dtype)  # rows whose every tile is skipped keep (0, -inf)
    for _, row in groupby(pr.tiles, key=lambda t: t.i):
        row_tiles = list(row)
        rows = slice(row_tiles[0].q_start, row_tiles[0].q_stop)
        last = deque(_fa2_query_block(pr, q[..., rows, :], row_tiles), maxlen=1)  # only the last state matters
        if last:
            (_, m, l, _, acc), = last
            o[..., rows, :], lse[..., rows] = _finish(m, l, acc)
    return o, lse


def _flash_forward_fa1(pr: _Problem):
    """FA1 order: outer loop over key blocks; O (kept normalised), l and m live in HBM between steps."""
    q, v = pr.g.q, pr.g.v
    o = np.zeros((*q.shape[:-1], v.shape[-1]), dtype=q.dtype)
    l = np.zeros(q.shape[:-1], dtype=q.dtype)
    m = np.full(q.shape[:-1], -np.inf, dtype=q.dtype)
    for tile in sorted(pr.tiles, key=lambda t: (t.j, t.i)):
        if tile.kind == "skipped":
            continue
        rows = slice(tile.q_start, tile.q_stop)
        s, _ = pr.scores(tile, q[..., rows, :], pr.g.k[..., tile.k_start:tile.k_stop, :])
        m_tile = np.max(s, axis=-1)
        p = _exp_shifted(s, m_tile)
        l_tile = np.sum(p, axis=-1)
        m_old, l_old = m[..., rows], l[..., rows]  # read from HBM
        m_new, l_new = reference.merge(m_old, l_old, m_tile, l_tile)
        w_old = reference.rescale_factor(m_old, m_new) * l_old
        w_tile = reference.rescale_factor(m_tile, m_new)
        pv = p @ v[..., tile.k_start:tile.k_stop, :]
        unnormalised = w_old[..., None] * o[..., rows, :] + w_tile[..., None] * pv
        o[..., rows, :] = np.divide(unnormalised, l_new[..., None], out=np.zeros_like(unnormalised),
                                    where=l_new[..., None] > 0)  # written back to HBM, normalised
        m[..., rows], l[..., rows] = m_new, l_new
    return o, _lse(m, l)


def flash_forward(q, k, v, *, causal=False, scale=None, block_q: int = 64, block_k: int = 64, order: str = "fa2",
                  window=None, softcap=None, alibi_slopes=None, document_ids=None,
                  mask_mod=None) -> tuple[np.ndarray, np.ndarray]:
    """Exact attention computed tile by tile, never holding more than one (block_q x block_k) score tile.

    q: (..., N_q, D), k: (..., N_k, D), v: (..., N_k, D_v) -> o: (..., N_q, D_v), lse: (..., N_q), the row
    logsumexp of the scaled, masked scores (what the backward pass needs). ``order``: "fa2" (outer loop over
    query blocks, delayed normalisation) or "fa1" (outer loop over key/value blocks, O re-read and re-written).
    The other options are ``reference.attention``'s; tiles the rule hides entirely are skipped.
    """
    if order not in ("fa2", "fa1"):
        raise ValueError(f'order must be "fa2" or "fa1", got {order!r}')
    pr = _prepare(q, k, v, scale, block_q, block_k, dict(
        causal=causal, window=window, softcap=softcap, alibi_slopes=alibi_slopes, document_ids=document_ids,
        mask_mod=mask_mod))
    o, lse = _flash_forward_fa2(pr) if order == "fa2" else _flash_forward_fa1(pr)
    return pr.g.ungroup(o, 2), pr.g.ungroup(lse, 1)


def forward_steps(q, k, v, *, causal=False, scale=None, block_q: int = 64, block_k: int = 64,
                  **options) -> Iterator[TileState]:
    """The FA2 forward, one :class:`TileState` per computed tile (skipped tiles yield nothing).

    The states are copies, so they can be collected in a list and replayed: this is what the tile explorer
    draws. The last state of each query block holds that block's final o. ``options``: the variant options of
    :func:`flash_forward`.
    """
    pr = _prepare(q, k, v, scale, block_q, block_k, dict(causal=causal, **options))
    for _, row in groupby(pr.tiles, key=lambda t: t.i):
        row_tiles = list(row)
        q_blk = pr.g.q[..., row_tiles[0].q_start:row_tiles[0].q_stop, :]
        for tile, m, l, rescale, acc in _fa2_query_block(pr, q_blk, row_tiles):
            o, _ = _finish(m, l, acc)
            yield TileState(tile, *(pr.g.ungroup(x.copy(), 1) for x in (m, l, rescale)),
                            pr.g.ungroup(acc.copy(), 2), pr.g.ungroup(o, 2))


# --------------------------------------------------------------------------------------------- backward
def flash_backward(q, k, v, o, lse, do, *, causal=False, scale=None, block_q: int = 64, block_k: int = 64,
                   window=None, softcap=None, alibi_slopes=None, document_ids=None,
                   mask_mod=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Gradients of attention from the forward's (o, lse), recomputing P one tile at a time.

    q: (..., N_q, D), k: (..., N_k, D), v: (..., N_k, D_v), o and do: (..., N_q, D_v), lse: (..., N_q)
    -> dq, dk, dv with the shapes of q, k, v. Per tile: P = exp(S - lse), dV += P^T dO, dP = dO V^T,
    dS = P * (dP - D) with D = rowsum(dO * O), dQ += dS K * scale, dK += dS^T Q * scale.
    Outer loop over key blocks (dK, dV stay in SRAM), inner over query blocks (dQ accumulated in HBM).
    Soft-capping multiplies dS by 1 - tanh^2 (its derivative); with grouped-query attention dK and dV sum
    the contributions of every query head of the group.
    """
    pr = _prepare(q, k, v, scale, block_q, block_k, dict(
        causal=causal, window=window, softcap=softcap, alibi_slopes=alibi_slopes, document_ids=document_ids,
        mask_mod=mask_mod))
    gq, gk, gv, dtype = pr.g.q, pr.g.k, pr.g.v, pr.g.q.dtype
    o, do, lse = (np.asarray(x, dtype=dtype) for x in (o, do, lse))
    q_shape = (*pr.g.lead, gq.shape[-2])
    expected_o = (*q_shape, gv.shape[-1])
    for name, arr, shape in (("o", o, expected_o), ("do", do, expected_o), ("lse", lse, q_shape)):
        if arr.shape != shape:
            raise ValueError(f"{name} has shape {arr.shape}, expected {shape} (from q {(*q_shape, gq.shape[-1])} "
                             f"and v {(*gv.shape[:-3], *gv.shape[-2:])})")
    o, do = o.reshape(*gq.shape[:-1], -1), do.reshape(*gq.shape[:-1], -1)
    lse = lse.reshape(gq.shape[:-1])
    delta = np.sum(do * o, axis=-1)  # D = rowsum(dO * O), (..., N_q): equals rowsum(P * dP)
    lse_safe = np.where(np.isneginf(lse), np.inf, lse)  # masked rows: exp(s - inf) = 0
    dq, dk, dv = np.zeros_like(gq), np.zeros_like(gk), np.zeros_like(gv)
    for tile in sorted(pr.tiles, key=lambda t: (t.j, t.i)):
        if tile.kind == "skipped":
            continue
        rows, cols = slice(tile.q_start, tile.q_stop), slice(tile.k_start, tile.k_stop)
        q_blk, k_blk, v_blk, do_blk = gq[..., rows, :], gk[..., cols, :], gv[..., cols, :], do[..., rows, :]
        s, raw = pr.scores(tile, q_blk, k_blk)
        p = np.exp(s - lse_safe[..., rows, None])  # (..., G, Bq, Bk), recomputed, already normalised
        # A K/V head serves the G query heads of its group: its gradients sum theirs (axis -3).
        dv[..., cols, :] += np.sum(np.swapaxes(p, -1, -2) @ do_blk, axis=-3, keepdims=True)
        dp = do_blk @ np.swapaxes(v_blk, -1, -2)
        ds = p * (dp - delta[..., rows, None]) * pr.rule.softcap_grad(raw)
        dq[..., rows, :] += (ds @ k_blk) * pr.scale
        dk[..., cols, :] += np.sum(np.swapaxes(ds, -1, -2) @ q_blk, axis=-3, keepdims=True) * pr.scale
    return pr.g.ungroup(dq, 2), dk[..., 0, :, :], dv[..., 0, :, :]
