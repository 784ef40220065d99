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
the inputs' dtype (see ``reference``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from . import reference

__all__ = ["Tile", "TileState", "flash_backward", "flash_forward", "forward_steps", "tile_schedule"]


# --------------------------------------------------------------------------------------------- the schedule
@dataclass(frozen=True)
class Tile:
    """One (query block i, key block j) tile of the N_q x N_k score matrix.

    ``kind`` is "full" (computed, no mask), "diagonal" (computed, causal mask applied inside) or
    "skipped" (every entry above the causal diagonal: never loaded, never computed).
    """

    i: int
    j: int
    q_start: int
    q_stop: int
    k_start: int
    k_stop: int
    kind: str


def tile_schedule(n_q: int, n_k: int, block_q: int, block_k: int, *, causal: bool = False) -> list[Tile]:
    """Every tile in row-major order (query block, then key block), with its kind.

    A tile is skipped when its first key comes after its last query (k_start > q_stop - 1), and is diagonal
    when some but not all of its entries are masked.
    """
    block_q = reference.validate_block("block_q", block_q)
    block_k = reference.validate_block("block_k", block_k)
    tiles = []
    for i, q_start in enumerate(range(0, n_q, block_q)):
        q_stop = min(q_start + block_q, n_q)
        for j, k_start in enumerate(range(0, n_k, block_k)):
            k_stop = min(k_start + block_k, n_k)
            kind = "full"
            if causal and k_start > q_stop - 1:
                kind = "skipped"
            elif causal and k_stop - 1 > q_start:
                kind = "diagonal"
            tiles.append(Tile(i, j, q_start, q_stop, k_start, k_stop, kind))
    return tiles


def _prepare(q, k, v, scale, block_q, block_k):
    q, k, v = reference.validate_qkv(q, k, v)
    reference.validate_block("block_q", block_q)
    reference.validate_block("block_k", block_k)
    return q, k, v, q.dtype.type(reference.resolve_scale(scale, q.shape[-1]))


def _scores(q_blk, k_blk, scale, tile: Tile):
    """Scaled scores of one tile, with the causal mask applied on a diagonal tile."""
    s = (q_blk @ np.swapaxes(k_blk, -1, -2)) * scale  # (..., Bq, Bk)
    if tile.kind == "diagonal":
        keep = reference.causal_mask(tile.q_stop - tile.q_start, tile.k_stop - tile.k_start,
                                     tile.q_start, tile.k_start)
        s = np.where(keep, s, -np.inf)
    return s


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


def _fa2_query_block(q_blk, k, v, scale, row_tiles: list[Tile]) -> Iterator[tuple[Tile, np.ndarray, np.ndarray,
                                                                                   np.ndarray, np.ndarray]]:
    """Run one query block over its key blocks; yield (tile, m, l, rescale, acc) after each computed tile."""
    lead = q_blk.shape[:-1]  # (..., Bq)
    m = np.full(lead, -np.inf, dtype=q_blk.dtype)
    l = np.zeros(lead, dtype=q_blk.dtype)
    acc = np.zeros((*lead, v.shape[-1]), dtype=q_blk.dtype)
    for tile in row_tiles:
        if tile.kind == "skipped":
            continue
        k_blk = k[..., tile.k_start:tile.k_stop, :]
        v_blk = v[..., tile.k_start:tile.k_stop, :]
        s = _scores(q_blk, k_blk, scale, tile)
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


def _flash_forward_fa2(q, k, v, scale, tiles, block_k):
    o = np.zeros((*q.shape[:-1], v.shape[-1]), dtype=q.dtype)
    lse = np.empty(q.shape[:-1], dtype=q.dtype)
    n_k_blocks = -(-k.shape[-2] // block_k)  # tiles come row by row, n_k_blocks per query block
    for start in range(0, len(tiles), n_k_blocks):
        row_tiles = tiles[start:start + n_k_blocks]
        q_start, q_stop = row_tiles[0].q_start, row_tiles[0].q_stop
        q_blk = q[..., q_start:q_stop, :]
        # Only the last state matters here; key block 0 is never skipped, so there is always one.
        (_, m, l, _, acc), = deque(_fa2_query_block(q_blk, k, v, scale, row_tiles), maxlen=1)
        o[..., q_start:q_stop, :], lse[..., q_start:q_stop] = _finish(m, l, acc)
    return o, lse


def _flash_forward_fa1(q, k, v, scale, tiles):
    """FA1 order: outer loop over key blocks; O (kept normalised), l and m live in HBM between steps."""
    o = np.zeros((*q.shape[:-1], v.shape[-1]), dtype=q.dtype)
    l = np.zeros(q.shape[:-1], dtype=q.dtype)
    m = np.full(q.shape[:-1], -np.inf, dtype=q.dtype)
    for tile in sorted(tiles, key=lambda t: (t.j, t.i)):
        if tile.kind == "skipped":
            continue
        rows = slice(tile.q_start, tile.q_stop)
        s = _scores(q[..., rows, :], k[..., tile.k_start:tile.k_stop, :], scale, tile)
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


def flash_forward(q, k, v, *, causal: bool = False, scale=None, block_q: int = 64, block_k: int = 64,
                  order: str = "fa2") -> tuple[np.ndarray, np.ndarray]:
    """Exact attention computed tile by tile, never holding more than one (block_q x block_k) score tile.

    q: (..., N_q, D), k: (..., N_k, D), v: (..., N_k, D_v) -> o: (..., N_q, D_v), lse: (..., N_q), the row
    logsumexp of the scaled, masked scores (what the backward pass needs). ``order``: "fa2" (outer loop over
    query blocks, delayed normalisation) or "fa1" (outer loop over key/value blocks, O re-read and re-written).
    Causal tiles entirely above the diagonal are skipped.
    """
    q, k, v, scale = _prepare(q, k, v, scale, block_q, block_k)
    tiles = tile_schedule(q.shape[-2], k.shape[-2], block_q, block_k, causal=causal)
    if order == "fa2":
        if k.shape[-2] == 0 or q.shape[-2] == 0:
            return _finish(np.full(q.shape[:-1], -np.inf, q.dtype), np.zeros(q.shape[:-1], q.dtype),
                           np.zeros((*q.shape[:-1], v.shape[-1]), q.dtype))
        return _flash_forward_fa2(q, k, v, scale, tiles, block_k)
    if order == "fa1":
        return _flash_forward_fa1(q, k, v, scale, tiles)
    raise ValueError(f'order must be "fa2" or "fa1", got {order!r}')


def forward_steps(q, k, v, *, causal: bool = False, scale=None, block_q: int = 64,
                  block_k: int = 64) -> Iterator[TileState]:
    """The FA2 forward, one :class:`TileState` per computed tile (skipped causal tiles yield nothing).

    The states are copies, so they can be collected in a list and replayed: this is what the tile explorer
    draws. The last state of each query block holds that block's final o.
    """
    q, k, v, scale = _prepare(q, k, v, scale, block_q, block_k)
    tiles = tile_schedule(q.shape[-2], k.shape[-2], block_q, block_k, causal=causal)
    for q_start in range(0, q.shape[-2], block_q):
        row_tiles = [t for t in tiles if t.q_start == q_start]
        q_blk = q[..., q_start:row_tiles[0].q_stop, :]
        for tile, m, l, rescale, acc in _fa2_query_block(q_blk, k, v, scale, row_tiles):
            o, _ = _finish(m, l, acc)
            yield TileState(tile, m.copy(), l.copy(), rescale.copy(), acc.copy(), o)


# --------------------------------------------------------------------------------------------- backward
def flash_backward(q, k, v, o, lse, do, *, causal: bool = False, scale=None, block_q: int = 64,
                   block_k: int = 64) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Gradients of attention from the forward's (o, lse), recomputing P one tile at a time.

    q: (..., N_q, D), k: (..., N_k, D), v: (..., N_k, D_v), o and do: (..., N_q, D_v), lse: (..., N_q)
    -> dq, dk, dv with the shapes of q, k, v. Per tile: P = exp(S - lse), dV += P^T dO, dP = dO V^T,
    dS = P * (dP - D) with D = rowsum(dO * O), dQ += dS K * scale, dK += dS^T Q * scale.
    Outer loop over key blocks (dK, dV stay in SRAM), inner over query blocks (dQ accumulated in HBM).
    """
    q, k, v, scale = _prepare(q, k, v, scale, block_q, block_k)
    o, do = np.asarray(o, dtype=q.dtype), np.asarray(do, dtype=q.dtype)
    lse = np.asarray(lse, dtype=q.dtype)
    expected_o = (*q.shape[:-1], v.shape[-1])
    for name, arr, shape in (("o", o, expected_o), ("do", do, expected_o), ("lse", lse, q.shape[:-1])):
        if arr.shape != shape:
            raise ValueError(f"{name} has shape {arr.shape}, expected {shape} (from q {q.shape} and v {v.shape})")
    delta = np.sum(do * o, axis=-1)  # D = rowsum(dO * O), (..., N_q): equals rowsum(P * dP)
    lse_safe = np.where(np.isneginf(lse), np.inf, lse)  # masked rows: exp(s - inf) = 0
    dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    tiles = tile_schedule(q.shape[-2], k.shape[-2], block_q, block_k, causal=causal)
    for tile in sorted(tiles, key=lambda t: (t.j, t.i)):
        if tile.kind == "skipped":
            continue
        rows, cols = slice(tile.q_start, tile.q_stop), slice(tile.k_start, tile.k_stop)
        q_blk, k_blk, v_blk, do_blk = q[..., rows, :], k[..., cols, :], v[..., cols, :], do[..., rows, :]
        s = _scores(q_blk, k_blk, scale, tile)
        p = np.exp(s - lse_safe[..., rows, None])  # (..., Bq, Bk), recomputed, already normalised
        dv[..., cols, :] += np.swapaxes(p, -1, -2) @ do_blk
        dp = do_blk @ np.swapaxes(v_blk, -1, -2)
        ds = p * (dp - delta[..., rows, None])
        dq[..., rows, :] += (ds @ k_blk) * scale
        dk[..., cols, :] += (np.swapaxes(ds, -1, -2) @ q_blk) * scale
    return dq, dk, dv
