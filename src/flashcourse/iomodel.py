"""A memory-hierarchy simulator: count every element that moves between HBM and an SRAM of M elements.

An algorithm runs against a :class:`Memory`. It cannot touch HBM arrays directly: it ``load``s a block into
SRAM (counted as reads), ``alloc``s scratch space in SRAM, ``hold``s intermediates it computes there (such as a
score tile S_ij), ``store``s results to HBM (counted as writes) and ``free``s SRAM blocks. Holding more than M
elements at once raises :class:`SramOverflowError`, naming the blocks held. The output is really computed from
the loaded blocks, so a wrong algorithm gives a wrong answer, not only wrong counts.

Three algorithms are built in, following the IO analysis of FlashAttention (Dao et al., 2022, section 3.2 and
Theorem 2): "standard" (S = QK^T written to HBM, softmax read and written, then PV), whose traffic is
Theta(N d + N^2); "flash" (Algorithm 1, FA1's loop order: key blocks outside), whose traffic is
Theta(N^2 d^2 / M); and "flash2" (FlashAttention-2, Dao 2023, Algorithm 1: query blocks outside, Q read and O
written once, K and V re-read for every query block), also Theta(N^2 d^2 / M) with a smaller constant.

The attention variants (``reference.attention``'s options) run through the same :class:`reference.AttentionRule`
as the tiled code: the flash algorithms skip the tiles it hides entirely, so a sliding window's traffic grows with
the window, not with N; the standard algorithm writes the whole masked S, whatever the mask.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import reference

__all__ = ["IOStats", "Memory", "SramOverflowError", "flash_block_sizes", "naive_attention_hbm_bytes", "simulate"]


class SramOverflowError(MemoryError):
    """An algorithm tried to hold more than M elements in SRAM at once."""


@dataclass(frozen=True)
class IOStats:
    """Elements moved: ``reads`` HBM -> SRAM, ``writes`` SRAM -> HBM; ``peak_sram`` most elements held at once."""

    reads: int
    writes: int
    peak_sram: int
    sram: int

    @property
    def total(self) -> int:
        """reads + writes, the HBM traffic in elements."""
        return self.reads + self.writes


class Memory:
    """HBM holding named arrays, and an SRAM of ``sram`` elements that algorithms fill block by block."""

    def __init__(self, sram: int, **hbm: np.ndarray):
        if isinstance(sram, bool) or not isinstance(sram, (int, np.integer)) or sram <= 0:
            raise ValueError(f"sram must be a positive number of elements, got {sram!r}")
        self.sram = int(sram)
        self._hbm = {name: np.array(arr) for name, arr in hbm.items()}
        self._held: dict[int, tuple[str, int, np.ndarray]] = {}  # id -> (label, elements, array kept alive)
        self.reads = self.writes = self.peak_sram = 0

    # ----------------------------------------------------------------------------------- HBM side
    def shape(self, name: str) -> tuple[int, ...]:
        """Shape of the HBM array ``name`` (free: shapes are metadata, not data)."""
        return self._array(name).shape

    def hbm_alloc(self, name: str, shape: tuple[int, ...], fill: float = 0.0, dtype=np.float64) -> None:
        """Create an output array in HBM (for example O, l, m); costs no traffic."""
        self._hbm[name] = np.full(shape, fill, dtype=dtype)

    def result(self, name: str) -> np.ndarray:
        """Read an HBM array from outside the algorithm (for the caller, after the run; not counted)."""
        return self._array(name).copy()

    def _array(self, name: str) -> np.ndarray:
        if name not in self._hbm:
            raise KeyError(f"no array {name!r} in HBM; it holds {sorted(self._hbm)}")
        return self._hbm[name]

    # ----------------------------------------------------------------------------------- SRAM side
    @property
    def used(self) -> int:
        """Elements held in SRAM now."""
        return sum(size for _, size, _ in self._held.values())

    def _take(self, array: np.ndarray, label: str) -> np.ndarray:
        if self.used + array.size > self.sram:
            held = ", ".join(f"{lbl} ({size})" for lbl, size, _ in self._held.values()) or "nothing"
            raise SramOverflowError(
                f"SRAM budget exceeded: holding {label} ({array.size} elements) on top of {self.used} already held "
                f"would need {self.used + array.size} > M = {self.sram} elements. Held now: {held}. "
                "Use smaller blocks, or free blocks you no longer need."
            )
        self._held[id(array)] = (label, array.size, array)
        self.peak_sram = max(self.peak_sram, self.used)
        return array

    def load(self, name: str, rows: slice | None = None, cols: slice | None = None, *,
             label: str | None = None) -> np.ndarray:
        """Copy HBM block ``name[rows, cols]`` into SRAM and return it; counts its elements as reads."""
        block = np.array(self._array(name)[_index(self._array(name), rows, cols)])
        self._take(block, label or f"{name}[{_fmt(rows)}]")
        self.reads += block.size
        return block

    def alloc(self, shape: tuple[int, ...], fill: float = 0.0, *, label: str = "scratch",
              dtype=np.float64) -> np.ndarray:
        """New SRAM scratch array (running statistics, accumulators); no traffic."""
        return self._take(np.full(shape, fill, dtype=dtype), label)

    def hold(self, array: np.ndarray, label: str) -> np.ndarray:
        """Account for an array computed in SRAM (a score tile S_ij, say) and return it."""
        array = np.asarray(array)
        if id(array) in self._held:
            return array
        return self._take(array, label)

    def store(self, name: str, block: np.ndarray, rows: slice | None = None, cols: slice | None = None) -> None:
        """Write an SRAM block to HBM at ``name[rows, cols]``; counts its elements as writes."""
        block = np.asarray(block)
        if id(block) not in self._held:
            raise ValueError(
                "store() got an array that is not in SRAM: load, alloc or hold it first, so it is counted"
            )
        self._array(name)[_index(self._array(name), rows, cols)] = block
        self.writes += block.size

    def free(self, *arrays: np.ndarray) -> None:
        """Release SRAM blocks."""
        for array in arrays:
            if self._held.pop(id(array), None) is None:
                raise ValueError("free() got an array that is not held in SRAM")

    def free_all(self) -> None:
        """Release every SRAM block (the end of one kernel launch)."""
        self._held.clear()

    def stats(self) -> IOStats:
        """The counts so far."""
        return IOStats(self.reads, self.writes, self.peak_sram, self.sram)


def _index(array: np.ndarray, rows: slice | None, cols: slice | None) -> tuple:
    """The index of block [rows, cols] of a 2-D array, or [rows] of a 1-D one (row statistics)."""
    if array.ndim == 1:
        if cols is not None:
            raise ValueError("a 1-D HBM array (row statistics) has no columns to slice")
        return (rows or slice(None),)
    return rows or slice(None), cols or slice(None)


def _fmt(s: slice | None) -> str:
    return ":" if s is None else f"{s.start or 0}:{s.stop}"


# ------------------------------------------------------------------------------------------------ block sizes
def naive_attention_hbm_bytes(batch: int, heads: int, n: int, head_dim: int, *, bytes_per_element: int = 2
                              ) -> dict[str, int]:
    """Bytes the three-step implementation moves through HBM, line by line.

    S = Q K^T (read Q, K; write S), P = softmax(S) (read S; write P), O = P V (read P, V; write O).
    Returns each step's bytes and the total.
    """
    for name, value in (("batch", batch), ("heads", heads), ("n", n), ("head_dim", head_dim)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
            raise ValueError(f"{name}={value!r}: a count of zero or more is expected")
    reference.validate_block("bytes_per_element", bytes_per_element)
    nd = batch * heads * n * head_dim * bytes_per_element
    nn = batch * heads * n * n * bytes_per_element
    steps = {
        "S = QK^T: read Q, K": 2 * nd,
        "S = QK^T: write S": nn,
        "P = softmax(S): read S": nn,
        "P = softmax(S): write P": nn,
        "O = PV: read P": nn,
        "O = PV: read V": nd,
        "O = PV: write O": nd,
    }
    steps["total"] = sum(steps.values())
    return steps


def flash_block_sizes(sram: int, d: int, n: int | None = None, *, order: str = "fa1") -> tuple[int, int]:
    """Block sizes (B_r, B_c) for the flash algorithms in an SRAM of ``sram`` elements.

    FA1 (``order="fa1"``), Algorithm 1 of the paper: B_c = ceil(M / 4d), B_r = min(B_c, d); then shrink B_c
    until one step fits: K_j, V_j (2 B_c d), Q_i, O_i (2 B_r d), the tile S_ij (B_r B_c) and four row
    statistics (4 B_r). ``order="fa2"`` swaps the roles: the block that stays (now Q_i) is the large one,
    B_r = ceil(M / 4d) shrunk until the step fits, B_c = min(B_r, d), because FA2 re-reads K and V once per
    query block. ``n`` caps the large block at the sequence length. Raises ValueError if even 1 does not fit.
    """
    if order not in ("fa1", "fa2"):
        raise ValueError(f'order must be "fa1" or "fa2", got {order!r}')
    reference.validate_block("sram", sram)
    reference.validate_block("d", d)
    big = max(1, -(-sram // (4 * d)))
    if n is not None:
        big = min(big, max(1, n))  # a block of one row when there are no rows: its loops then run zero times

    def need(b: int) -> int:
        small = min(b, d)
        br, bc = (small, b) if order == "fa1" else (b, small)
        return 2 * bc * d + 2 * br * d + br * bc + 4 * br

    while big > 1 and need(big) > sram:
        big -= 1
    if need(big) > sram:
        raise ValueError(
            f"SRAM of {sram} elements is too small for even one row of blocks with d = {d}: "
            f"it needs at least {need(1)} elements"
        )
    return (min(big, d), big) if order == "fa1" else (big, min(big, d))


# ------------------------------------------------------------------------------------------------ algorithms
_B = _H = np.array(0)  # the simulator runs one head: batch 0, head 0 for the rule


def _causal_rule(mem: Memory, causal) -> reference.AttentionRule:
    """The rule of a plain (causal or not) run, for a built-in algorithm called like a learner's callable."""
    return reference.attention_rule(mem.shape("q")[0], mem.shape("k")[0], causal=causal)


def _tile_scores(rule: reference.AttentionRule, q_blk, k_blk, scale: float, r: int, c: int,
                 kind: str = "masked") -> np.ndarray:
    """The scores of the tile whose first query is r and first key c, through the rule (masked unless full)."""
    q_idx, kv_idx = np.arange(r, r + q_blk.shape[0])[:, None], np.arange(c, c + k_blk.shape[0])[None, :]
    return rule.scores((q_blk @ k_blk.T) * scale, _B, _H, q_idx, kv_idx, mask=kind != "full")


def _standard(mem: Memory, *, causal=False, scale: float, block_q: int | None, block_k: int | None,
              rule: reference.AttentionRule | None = None) -> None:
    """The three-step implementation: S = QK^T to HBM, P = softmax(S) to HBM, O = PV; each step blocked."""
    rule = rule or _causal_rule(mem, causal)
    n, d = mem.shape("q")
    n_k = mem.shape("k")[0]
    # Square tiles of S: Q and K row blocks plus the S tile must fit (2 b d + b^2 <= M).
    b = block_q or max(1, int(np.sqrt(d * d + mem.sram) - d))
    bk = block_k or b
    mem.hbm_alloc("s", (n, n_k))
    for r in range(0, n, b):
        q_blk = mem.load("q", slice(r, r + b))
        for c in range(0, n_k, bk):
            k_blk = mem.load("k", slice(c, c + bk))
            s = mem.hold(_tile_scores(rule, q_blk, k_blk, scale, r, c), "S tile")  # every tile, masked or not
            mem.store("s", s, slice(r, r + b), slice(c, c + bk))
            mem.free(k_blk, s)
        mem.free(q_blk)
    # Softmax row by row (a row of S must fit; rows longer than M would need the online trick).
    mem.hbm_alloc("p", (n, n_k))
    rows = max(1, mem.sram // max(1, 2 * n_k))
    for r in range(0, n, rows):
        s_rows = mem.load("s", slice(r, r + rows))
        p_rows = mem.hold(reference.softmax_safe(s_rows), "P rows")
        mem.store("p", p_rows, slice(r, r + rows))
        mem.free(s_rows, p_rows)
    # O = P V, tiled like the first step.
    d_v = mem.shape("v")[1]
    mem.hbm_alloc("o", (n, d_v))
    for r in range(0, n, b):
        acc = mem.alloc((min(b, n - r), d_v), label="O block")
        for c in range(0, n_k, bk):
            p_blk = mem.load("p", slice(r, r + b), slice(c, c + bk))
            v_blk = mem.load("v", slice(c, c + bk))
            acc += p_blk @ v_blk
            mem.free(p_blk, v_blk)
        mem.store("o", acc, slice(r, r + b))
        mem.free(acc)


def _flash(mem: Memory, *, causal=False, scale: float, block_q: int | None, block_k: int | None,
           rule: reference.AttentionRule | None = None) -> None:
    """Algorithm 1 of FlashAttention: outer loop over K/V blocks, inner over Q blocks; O, l, m in HBM."""
    rule = rule or _causal_rule(mem, causal)
    n, d = mem.shape("q")
    n_k = mem.shape("k")[0]
    d_v = mem.shape("v")[1]
    auto_r, auto_c = flash_block_sizes(mem.sram, max(d, d_v), n_k)
    br, bc = block_q or auto_r, block_k or auto_c
    mem.hbm_alloc("o", (n, d_v))
    mem.hbm_alloc("l", (n,))
    mem.hbm_alloc("m", (n,), fill=-np.inf)
    kinds = {r: rule.tile_kinds(_B, _H, r, min(r + br, n), bc) for r in range(0, n, br)}
    for c in range(0, n_k, bc):
        k_blk = mem.load("k", slice(c, c + bc), label="K_j")
        v_blk = mem.load("v", slice(c, c + bc), label="V_j")
        for r in range(0, n, br):
            if kinds[r][c // bc] == "skipped":
                continue  # the rule hides the whole tile: nothing loaded, nothing computed
            q_blk = mem.load("q", slice(r, r + br), label="Q_i")
            o_blk = mem.load("o", slice(r, r + br), label="O_i")
            l_blk = mem.load("l", slice(r, r + br), label="l_i")
            m_blk = mem.load("m", slice(r, r + br), label="m_i")
            s = mem.hold(_tile_scores(rule, q_blk, k_blk, scale, r, c, kinds[r][c // bc]), "S_ij")
            m_tile = mem.hold(np.max(s, axis=1), "m~_ij")
            s[...] = np.exp(s - reference.safe_max(m_tile)[:, None])  # P~_ij overwrites S_ij
            l_tile = mem.hold(np.sum(s, axis=1), "l~_ij")
            m_new, l_new = reference.merge(m_blk, l_blk, m_tile, l_tile)
            w_old = reference.rescale_factor(m_blk, m_new)
            w_tile = reference.rescale_factor(m_tile, m_new)
            o_blk[...] = (w_old * l_blk)[:, None] * o_blk + w_tile[:, None] * (s @ v_blk)
            np.divide(o_blk, l_new[:, None], out=o_blk, where=l_new[:, None] > 0)
            l_blk[...], m_blk[...] = l_new, m_new
            mem.store("o", o_blk, slice(r, r + br))
            mem.store("l", l_blk, slice(r, r + br))
            mem.store("m", m_blk, slice(r, r + br))
            mem.free(q_blk, o_blk, l_blk, m_blk, s, m_tile, l_tile)
        mem.free(k_blk, v_blk)


def _flash2(mem: Memory, *, causal=False, scale: float, block_q: int | None, block_k: int | None,
            rule: reference.AttentionRule | None = None) -> None:
    """FlashAttention-2's order: outer loop over Q blocks, inner over K/V blocks; O, m, l stay in SRAM.

    Q_i is read once and O_i, lse_i written once; every query block reads all the K_j, V_j it needs.
    """
    rule = rule or _causal_rule(mem, causal)
    n, d = mem.shape("q")
    n_k = mem.shape("k")[0]
    d_v = mem.shape("v")[1]
    auto_r, auto_c = flash_block_sizes(mem.sram, max(d, d_v), n, order="fa2")
    br, bc = block_q or auto_r, block_k or auto_c
    mem.hbm_alloc("o", (n, d_v))
    mem.hbm_alloc("lse", (n,))
    for r in range(0, n, br):
        rows = min(br, n - r)
        q_blk = mem.load("q", slice(r, r + br), label="Q_i")
        acc = mem.alloc((rows, d_v), label="O_i (accumulator)")
        m_blk = mem.alloc((rows,), -np.inf, label="m_i")
        l_blk = mem.alloc((rows,), label="l_i")
        for c, kind in zip(range(0, n_k, bc), rule.tile_kinds(_B, _H, r, r + rows, bc), strict=True):
            if kind == "skipped":
                continue  # the rule hides the whole tile: K_j, V_j are not even loaded
            k_blk = mem.load("k", slice(c, c + bc), label="K_j")
            v_blk = mem.load("v", slice(c, c + bc), label="V_j")
            s = mem.hold(_tile_scores(rule, q_blk, k_blk, scale, r, c, kind), "S_ij")
            m_tile = mem.hold(np.max(s, axis=1), "m~_ij")
            m_new = np.maximum(m_blk, m_tile)
            w_old = reference.rescale_factor(m_blk, m_new)
            s[...] = np.exp(s - reference.safe_max(m_new)[:, None])  # P~_ij overwrites S_ij
            l_tile = mem.hold(np.sum(s, axis=1), "l~_ij")
            l_blk[...] = w_old * l_blk + l_tile
            acc[...] = w_old[:, None] * acc + s @ v_blk  # unnormalised: divided once, after the loop
            m_blk[...] = m_new
            mem.free(k_blk, v_blk, s, m_tile, l_tile)
        np.divide(acc, l_blk[:, None], out=acc, where=l_blk[:, None] > 0)
        m_blk[...] = np.where(l_blk > 0, reference.safe_max(m_blk) + np.log(np.where(l_blk > 0, l_blk, 1.0)),
                              -np.inf)  # lse_i = m_i + log l_i, computed in place of m_i
        mem.store("o", acc, slice(r, r + br))
        mem.store("lse", m_blk, slice(r, r + br))
        mem.free(q_blk, acc, m_blk, l_blk)


_ALGORITHMS = {"standard": _standard, "flash": _flash, "flash2": _flash2}


def simulate(algorithm, q, k, v, *, sram: int, causal=False, block_q: int | None = None,
             block_k: int | None = None, scale=None, window=None, softcap=None, alibi_slopes=None,
             document_ids=None, mask_mod=None) -> tuple[np.ndarray, IOStats]:
    """Run an attention algorithm against a simulated HBM + SRAM and count its traffic.

    q: (N, D), k: (N_k, D), v: (N_k, D_v); ``sram``: M, in elements. ``algorithm``: "standard", "flash" (FA1's
    loop order), "flash2" (FA2's), or a callable ``f(mem, *, causal, scale, block_q, block_k)`` that reads
    "q", "k", "v" from ``mem`` (a :class:`Memory`) and stores its output as HBM array "o". Returns (o, stats)
    with stats.reads, .writes, .peak_sram in elements. Computation is in float64.
    ``causal`` and the variant options (window, softcap, alibi_slopes, document_ids, mask_mod) are
    ``reference.attention``'s options for one head, B = H = 1: alibi_slopes (1,), document_ids (1, N); the
    built-in algorithms take them all, a callable takes causal True / False only.
    """
    q, k, v = reference.validate_qkv(q, k, v)
    if q.ndim != 2:
        raise ValueError(f"q has shape {q.shape}: the simulator takes one head, (N, D); pass q[b, h] for a head")
    for name, value in (("block_q", block_q), ("block_k", block_k)):
        if value is not None:
            reference.validate_block(name, value)
    variants = dict(window=window, softcap=softcap, alibi_slopes=alibi_slopes, document_ids=document_ids,
                    mask_mod=mask_mod)
    rule = reference.attention_rule(q.shape[0], k.shape[0], batch=1, heads=1, causal=causal, **variants)
    scale = reference.resolve_scale(scale, q.shape[-1])
    mem = Memory(sram, q=q.astype(np.float64), k=k.astype(np.float64), v=v.astype(np.float64))
    if isinstance(algorithm, str):
        if algorithm not in _ALGORITHMS:
            raise ValueError(f'algorithm must be "standard", "flash", "flash2" or a callable, got {algorithm!r}')
        _ALGORITHMS[algorithm](mem, causal=causal, scale=scale, block_q=block_q, block_k=block_k, rule=rule)
    elif callable(algorithm):
        given = [name for name, value in variants.items() if value is not None]
        if given or not isinstance(causal, (bool, np.bool_)):
            raise ValueError(f"a callable algorithm takes causal=True / False only, got causal={causal!r} and "
                             f"{given or 'no other option'}: the variant options work with the built-in algorithms")
        algorithm(mem, causal=bool(causal), scale=scale, block_q=block_q, block_k=block_k)
    else:
        raise TypeError(f"algorithm must be a name or a callable, got {type(algorithm).__name__}")
    try:
        o = mem.result("o")
    except KeyError:
        raise ValueError('the algorithm finished without storing its output as the HBM array "o"') from None
    return o, mem.stats()
