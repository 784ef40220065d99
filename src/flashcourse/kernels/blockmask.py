"""Block masks: which (query tile, key tile) pairs a rule leaves empty, partial or full (FlexAttention's idea,
Dong et al. 2024, "Flex Attention: A Programming Model for Generating Optimized Attention Kernels", arXiv
2412.05496).

Causal and window bounds are classified analytically inside the attention kernels. Documents and ``mask_mod``
cannot be, so each tile's kind (0 empty, 1 partial, 2 full) is written to a (B_mask, H_mask, row tiles, column
tiles) int8 map: :func:`_tile_kinds_kernel` evaluates the whole rule on every score of the tile (documents alone
take a cheaper way, below). B_mask and H_mask are 1 where the mask is the same on every batch row or every head:
documents differ per row, and a ``mask_mod`` only per row or head where its source reads b or h
(``rules.mask_mod_reads``; a prefix-LM reads neither, so its map is one (b, h) deep, not B * H, and the kernels
read row 0 for every batch row and head). :func:`tile_lists` turns each row of the map into two lists, its full
tiles and its partial tiles (one launch of :func:`_tile_lists_kernel`), so an attention kernel loops over those
alone: empty tiles are never loaded, full tiles run without mask code.

Documents alone (no ``mask_mod``) do not need every score looked at. :func:`document_tile_kinds` takes the
smallest and largest id of each query tile's rows and of each key tile's keys (one pass over the ids, O(N)), then
classifies every tile with a few comparisons: O(B (N / BLOCK)^2) work instead of the O(B N^2) of evaluating every
score. Under the documents a tile is empty where the two id ranges do not overlap (no id in both), full where all
its rows and keys carry one id, and partial otherwise; that is combined with the causal and window bounds, which
a tile's span of j - i decides exactly, and a tile that runs past N is never full. For packed documents (ids never
decreasing along the sequence, as packing lays them out) this is exactly :func:`tile_kinds`' map: overlapping
ranges then share an id, whose positions are contiguous, and the bounds keep the diagonal i = j (documents force
N_q = N_kv, window sides are >= 0), so a tile the bounds leave seen holds a visible pair of that id (on the
diagonal, or at the tile's corner nearest to it). For ids in any other order a tile may be called partial where it
is empty or full (ranges 0..2 and 1..1 overlap but share no id), never the opposite kind: the attention stays
exact and only masks scores it could have skipped.

A call without a block mask gets these lists at each kernel's tile size (the backward twice: dK/dV by key tile, dQ
by query tile), exact ones but for document ids in no order. For a ``mask_mod`` (a pure function: see ``rules.py``)
they depend only on the function, the module-level values it reads (``rules.mask_mod_constants``), the causal and
window bounds, N_q, N_kv, B_mask, H_mask and the tiles, so :data:`CALL_LISTS` keeps the last 32 such lists under
that key: a training loop passing the same ``mask_mod`` classifies on its first step only, forward and backward.
Document ids are a tensor the caller may change in place between calls: their lists are classified on every call,
from the ranges (score by score where a ``mask_mod`` comes with them). :class:`BlockMask`
(``kernels.create_block_mask``) evaluates every score once, for every later call, and not at any kernel's tiles: at
one fixed sparse block, 128 x 128 unless asked otherwise, as FlexAttention's ``BlockMask`` does (128 is the default
``BLOCK_SIZE`` of PyTorch's ``create_block_mask``). So the same mask serves every head dim, dtype and GPU, whatever
tiles their launches take. A kernel derives its lists from that one map: its tile is full where every sparse block
it overlaps is full, empty where every one is empty, and partial otherwise. A partial tile runs the mask code on
every score, so derived lists are always correct; they are only less sparse than exact ones where a kernel tile lies
in a partial sparse block but is itself full or empty (FlexAttention's kernels, stepping through the sub-blocks of a
128-wide block, skip no more). Counting the full and empty sparse blocks under every kernel tile is one 2-D prefix
sum over the map, so any tile size works: smaller than the sparse block, larger, or not dividing it.
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import triton
import triton.language as tl

from .common import LOG2E, visible
from .rules import Rules, causal_alignment, check_window, document_ranks, mask_mod_constants, mask_mod_reads

EMPTY, PARTIAL, FULL = 0, 1, 2


@triton.jit
def _tile_kinds_kernel(KINDS, DOC_IDS, stride_doc_b, N_Q, N_KV, UPPER, LOWER, H_MASK,
                       HAS_UPPER: tl.constexpr, HAS_LOWER: tl.constexpr, HAS_DOCS: tl.constexpr,
                       MASK_MOD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_bh = tl.program_id(2)
    b = pid_bh // H_MASK
    h = pid_bh % H_MASK
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ok = visible(
        b, h, q_idx=rows[:, None], kv_idx=cols[None, :], N_Q=N_Q, N_KV=N_KV, UPPER=UPPER, LOWER=LOWER,
        doc_ids=DOC_IDS + b * stride_doc_b, HAS_UPPER=HAS_UPPER, HAS_LOWER=HAS_LOWER, HAS_DOCS=HAS_DOCS,
        MASK_MOD=MASK_MOD)  # (BLOCK_M, BLOCK_N)
    count = tl.sum(tl.sum(ok.to(tl.int32), 1), 0)
    kind = tl.where(count == 0, 0, tl.where(count == BLOCK_M * BLOCK_N, 2, 1))
    tile = (pid_bh.to(tl.int64) * tl.num_programs(0) + pid_m) * tl.num_programs(1) + pid_n
    tl.store(KINDS + tile, kind.to(tl.int8))


def tile_kinds(rules: Rules, batch: int, heads: int, n_q: int, n_kv: int, block_m: int, block_n: int,
               device) -> torch.Tensor:
    """The (batch, heads, cdiv(n_q, block_m), cdiv(n_kv, block_n)) int8 map of tile kinds under ``rules``.

    ``batch`` and ``heads`` are the mask's own (``Rules.mask_extent``): 1 where it is the same for every batch
    row (``mask_mod`` then sees b = 0) or every head (h = 0); documents need the documents' batch."""
    upper, lower = rules.key_bounds(n_q, n_kv)
    kinds = torch.empty((batch, heads, triton.cdiv(n_q, block_m), triton.cdiv(n_kv, block_n)),
                        dtype=torch.int8, device=device)
    if kinds.numel() == 0:
        return kinds
    docs = rules.document_ids if rules.document_ids is not None else kinds  # kinds stands in for an absent pointer
    _tile_kinds_kernel[(kinds.shape[2], kinds.shape[3], batch * heads)](
        KINDS=kinds, DOC_IDS=docs, stride_doc_b=docs.stride(0), N_Q=n_q, N_KV=n_kv,
        UPPER=upper or 0, LOWER=lower or 0, H_MASK=heads,
        HAS_UPPER=upper is not None, HAS_LOWER=lower is not None, HAS_DOCS=rules.document_ids is not None,
        MASK_MOD=rules.mask_mod, BLOCK_M=block_m, BLOCK_N=block_n,
    )
    return kinds


@triton.jit
def _id_range(doc_ids, start, N, BLOCK: tl.constexpr, SPAN: tl.constexpr):
    """The smallest and largest document id of positions start .. start + BLOCK - 1 below N (start < N); SPAN is
    BLOCK rounded up to a power of two (Triton's ranges are), so any tile size works."""
    positions = start + tl.arange(0, SPAN)
    inside = (positions < N) & (positions < start + BLOCK)
    ids = tl.load(doc_ids + positions, mask=inside, other=0)
    ids = tl.where(inside, ids, tl.load(doc_ids + start))  # past N: the first id again, which moves neither end
    return tl.min(ids, 0), tl.max(ids, 0)


@triton.jit
def _key_id_ranges_kernel(KEY_MIN, KEY_MAX, DOC_IDS, stride_doc_b, N, BLOCK_N: tl.constexpr,
                          SPAN_N: tl.constexpr):
    pid_n = tl.program_id(0)
    b = tl.program_id(1)
    low, high = _id_range(DOC_IDS + b * stride_doc_b, pid_n * BLOCK_N, N, BLOCK_N, SPAN_N)
    tile = b * tl.num_programs(0) + pid_n
    tl.store(KEY_MIN + tile, low)
    tl.store(KEY_MAX + tile, high)


@triton.jit
def _document_tile_kinds_kernel(KINDS, DOC_IDS, KEY_MIN, KEY_MAX, stride_doc_b, N, UPPER, LOWER,
                                HAS_UPPER: tl.constexpr, HAS_LOWER: tl.constexpr, BLOCK_M: tl.constexpr,
                                BLOCK_N: tl.constexpr, SPAN_M: tl.constexpr, COLUMNS: tl.constexpr):
    """One query tile's row of the kinds map, COLUMNS key tiles at a time, from id ranges and the bounds."""
    pid_m = tl.program_id(0)
    b = tl.program_id(1)
    tiles_n = tl.cdiv(N, BLOCK_N)
    first_row = pid_m * BLOCK_M
    last_row = tl.minimum(first_row + BLOCK_M, N) - 1  # the last row that exists
    q_min, q_max = _id_range(DOC_IDS + b * stride_doc_b, first_row, N, BLOCK_M, SPAN_M)
    row_of_map = KINDS + (b * tl.num_programs(0) + pid_m).to(tl.int64) * tiles_n
    for start in range(0, tiles_n, COLUMNS):
        n = start + tl.arange(0, COLUMNS)
        in_map = n < tiles_n
        k_min = tl.load(KEY_MIN + b * tiles_n + n, mask=in_map, other=0)
        k_max = tl.load(KEY_MAX + b * tiles_n + n, mask=in_map, other=0)
        first_col = n * BLOCK_N
        last_col = tl.minimum(first_col + BLOCK_N, N) - 1
        # Documents: where the two ranges do not overlap, no row shares an id with a key; where every row and key
        # carry one id, every pair does.
        seen = (q_min <= k_max) & (k_min <= q_max)
        whole = (q_min == q_max) & (k_min == k_max) & (q_min == k_min)
        # A tile past N is never whole: its missing rows or keys see nothing.
        whole = whole & (first_row + BLOCK_M <= N) & (first_col + BLOCK_N <= N)
        # Bounds (visible()'s, for a whole tile): j - i takes every value from first_col - last_row to
        # last_col - first_row here, so some pair is seen where that span meets [LOWER, UPPER], every pair where
        # it lies inside.
        if HAS_UPPER:
            seen = seen & (first_col - last_row <= UPPER)
            whole = whole & (last_col - first_row <= UPPER)
        if HAS_LOWER:
            seen = seen & (last_col - first_row >= LOWER)
            whole = whole & (first_col - last_row >= LOWER)
        kind = tl.where(seen, tl.where(whole, 2, 1), 0)  # FULL, PARTIAL, EMPTY
        tl.store(row_of_map + n, kind.to(tl.int8), mask=in_map)


# Key tiles one program of _document_tile_kinds_kernel classifies at once.
DOCUMENT_COLUMNS = 64


def document_tile_kinds(rules: Rules, batch: int, n: int, block_m: int, block_n: int, device) -> torch.Tensor:
    """The (batch, 1, cdiv(n, block_m), cdiv(n, block_n)) int8 map of tile kinds under documents and the causal /
    window bounds of ``rules`` (no ``mask_mod``), from each tile's range of ids (the module docstring says why that
    is :func:`tile_kinds`' map for packed ids, and never a wrong kind for any ids). Two launches: the key tiles'
    ranges, then the map, each query tile taking its own range."""
    ids = rules.document_ids  # (batch, n) int32, contiguous (rules.parse_rules makes it so)
    upper, lower = rules.key_bounds(n, n)
    tiles_m, tiles_n = triton.cdiv(n, block_m), triton.cdiv(n, block_n)
    kinds = torch.empty((batch, 1, tiles_m, tiles_n), dtype=torch.int8, device=device)
    if kinds.numel() == 0:
        return kinds
    key_min, key_max = torch.empty((2, batch, tiles_n), dtype=ids.dtype, device=device)
    _key_id_ranges_kernel[(tiles_n, batch)](KEY_MIN=key_min, KEY_MAX=key_max, DOC_IDS=ids,
                                           stride_doc_b=ids.stride(0), N=n, BLOCK_N=block_n,
                                           SPAN_N=triton.next_power_of_2(block_n))
    _document_tile_kinds_kernel[(tiles_m, batch)](
        KINDS=kinds, DOC_IDS=ids, KEY_MIN=key_min, KEY_MAX=key_max, stride_doc_b=ids.stride(0), N=n,
        UPPER=upper or 0, LOWER=lower or 0, HAS_UPPER=upper is not None, HAS_LOWER=lower is not None,
        BLOCK_M=block_m, BLOCK_N=block_n, SPAN_M=triton.next_power_of_2(block_m), COLUMNS=DOCUMENT_COLUMNS)
    return kinds


@dataclass(frozen=True)
class TileLists:
    """For every row of tiles (B_mask, H_mask, rows): how many full and partial tiles it has, and which, ascending
    (the ``*_tiles`` rows are padded with the other tiles' indices past their count). A row is a query tile
    (the forward, dQ) or a key tile (dK/dV, from the transposed map)."""

    full_counts: torch.Tensor  # (B_mask, H_mask, rows) int32
    full_tiles: torch.Tensor  # (B_mask, H_mask, rows, columns) int32
    partial_counts: torch.Tensor
    partial_tiles: torch.Tensor

    @property
    def batch(self) -> int:
        return self.full_counts.shape[0]

    @property
    def heads(self) -> int:
        return self.full_counts.shape[1]

    @property
    def tiles_per_row(self) -> int:
        return self.full_tiles.shape[3]

    def kernel_args(self) -> dict:
        """The attention kernels' keyword arguments for these lists."""
        return {"FULL_COUNTS": self.full_counts, "FULL_TILES": self.full_tiles,
                "PARTIAL_COUNTS": self.partial_counts, "PARTIAL_TILES": self.partial_tiles,
                "B_MASK": self.batch, "H_MASK": self.heads, "TILES_PER_ROW": self.tiles_per_row}

    def kind_counts(self) -> dict[str, int]:
        """How many tiles of the map are full, partial and empty (a sum over every batch row, head and row)."""
        full, partial = int(self.full_counts.sum()), int(self.partial_counts.sum())
        total = self.full_tiles.numel()
        return {"full": full, "partial": partial, "empty": total - full - partial}

    @functools.cached_property  # read once (a device-to-host copy); the lists never change
    def partial_share(self) -> float:
        """The share of the visited (full or partial) tiles that are partial; 0 where none is visited."""
        counts = self.kind_counts()
        visited = counts["full"] + counts["partial"]
        return counts["partial"] / visited if visited else 0.0


# Its sizes and strides are not specialised on (divisible by 16, equal to 1): one compiled kernel serves every map,
# where a call with document ids at a new length would otherwise compile another before it could start.
@triton.jit(do_not_specialize=["HEADS", "ROWS", "COLUMNS", "TOTAL_ROWS", "stride_b", "stride_h", "stride_r",
                               "stride_c"])
def _tile_lists_kernel(KINDS, FULL_COUNTS, FULL_TILES, PARTIAL_COUNTS, PARTIAL_TILES, HEADS, ROWS, COLUMNS,
                       TOTAL_ROWS, stride_b, stride_h, stride_r, stride_c, ROWS_PER_PROGRAM: tl.constexpr,
                       CHUNK: tl.constexpr):
    """``ROWS_PER_PROGRAM`` rows of the kinds map (rows of every (b, h) numbered one after another, on the grid's
    x axis, which has no 65,535 limit) into their full and partial lists, as (2, ROWS_PER_PROGRAM, CHUNK) blocks:
    list, row, column. The map is read through its strides, so a transposed view needs no copy."""
    flat = tl.program_id(0) * ROWS_PER_PROGRAM + tl.arange(0, ROWS_PER_PROGRAM)  # (R,) rows of the flat numbering
    live = flat < TOTAL_ROWS
    row = flat % ROWS
    b = flat // ROWS // HEADS
    h = flat // ROWS % HEADS
    kinds_rows = KINDS + b.to(tl.int64) * stride_b + h.to(tl.int64) * stride_h + row.to(tl.int64) * stride_r
    kind_of_list = 2 - tl.arange(0, 2)  # FULL, PARTIAL
    is_full = kind_of_list == 2
    kind_of_list = kind_of_list[:, None, None]
    # First pass: each list's count, which the second needs (a list's misses start where its hits end).
    counts = tl.zeros((2, ROWS_PER_PROGRAM), tl.int32)
    for start in range(0, COLUMNS, CHUNK):
        cols = start + tl.arange(0, CHUNK)
        in_row = live[:, None] & (cols < COLUMNS)[None, :]
        kind = tl.load(kinds_rows[:, None] + cols.to(tl.int64)[None, :] * stride_c, mask=in_row, other=0)  # (R, C)
        counts += tl.sum((kind[None, :, :] == kind_of_list).to(tl.int32), 2)
    count_ptrs = tl.where(is_full[:, None], FULL_COUNTS, PARTIAL_COUNTS) + flat[None, :]
    tl.store(count_ptrs, counts, mask=live[None, :])
    # Second pass, a stable partition chunk by chunk: a hit goes to the hits before its chunk + its rank among the
    # chunk's hits, a miss to the list's count + the misses before its chunk + its rank among the chunk's misses.
    # So a list holds its hits ascending, then its misses ascending: what a stable sort of "not a hit" gives.
    lists = (tl.where(is_full[:, None, None], FULL_TILES, PARTIAL_TILES)
             + flat.to(tl.int64)[None, :, None] * COLUMNS)  # each row's list is contiguous
    hits_before = tl.zeros((2, ROWS_PER_PROGRAM), tl.int32)
    for start in range(0, COLUMNS, CHUNK):
        cols = start + tl.arange(0, CHUNK)
        in_row = live[:, None] & (cols < COLUMNS)[None, :]
        kind = tl.load(kinds_rows[:, None] + cols.to(tl.int64)[None, :] * stride_c, mask=in_row, other=0)
        hit = (kind[None, :, :] == kind_of_list).to(tl.int32)  # (2, R, C); a column past the row reads EMPTY
        miss = in_row[None, :, :].to(tl.int32) - hit
        hit_rank = tl.cumsum(hit, 2) - hit  # exclusive: the hits left of each column in this chunk
        miss_rank = tl.cumsum(miss, 2) - miss
        misses_before = start - hits_before  # every column before the chunk is a hit or a miss
        place = tl.where(hit != 0, hits_before[:, :, None] + hit_rank,
                         (counts + misses_before)[:, :, None] + miss_rank)
        tl.store(lists + place, cols[None, None, :], mask=in_row[None, :, :])
        hits_before += tl.sum(hit, 2)


# Columns one program of _tile_lists_kernel takes at a time: a row of up to 256 tiles (N = 16,384 at 64-wide
# tiles) is one chunk; longer rows loop. Rows per program: enough that a map of a few thousand rows is a few
# hundred programs (Triton's CPU interpreter pays per program), few enough that a program's block stays small.
TILE_LIST_CHUNK = 256
TILE_LIST_ROWS = 8


def tile_lists(kinds: torch.Tensor) -> TileLists:
    """The full and partial tiles of every row of a kinds map (B, H_mask, rows, columns), any strides (dK/dV pass
    the map transposed). One launch, because a call with document ids makes its lists on every call: a compare, a
    sum and a stable sort in PyTorch are several small kernels per list, each a launch the host pays for."""
    batch, heads, rows, columns = kinds.shape
    full_counts, partial_counts = (torch.empty((batch, heads, rows), dtype=torch.int32, device=kinds.device)
                                   for _ in range(2))
    full_tiles, partial_tiles = (torch.empty((batch, heads, rows, columns), dtype=torch.int32, device=kinds.device)
                                 for _ in range(2))
    total_rows = full_counts.numel()
    if total_rows:  # rows without columns still get their counts (zero)
        _tile_lists_kernel[(triton.cdiv(total_rows, TILE_LIST_ROWS),)](
            KINDS=kinds, FULL_COUNTS=full_counts, FULL_TILES=full_tiles, PARTIAL_COUNTS=partial_counts,
            PARTIAL_TILES=partial_tiles, HEADS=heads, ROWS=rows, COLUMNS=columns, TOTAL_ROWS=total_rows,
            stride_b=kinds.stride(0), stride_h=kinds.stride(1), stride_r=kinds.stride(2), stride_c=kinds.stride(3),
            ROWS_PER_PROGRAM=TILE_LIST_ROWS, CHUNK=TILE_LIST_CHUNK)
    return TileLists(full_counts, full_tiles, partial_counts, partial_tiles)


def no_tile_lists(stand_in: torch.Tensor) -> dict:
    """Kernel arguments when no block mask is used: the pointers are never read, ``stand_in`` fills them."""
    return {"FULL_COUNTS": stand_in, "FULL_TILES": stand_in, "PARTIAL_COUNTS": stand_in,
            "PARTIAL_TILES": stand_in, "B_MASK": 1, "H_MASK": 1, "TILES_PER_ROW": 0}


def build_lists(rules: Rules, batch: int, heads: int, n_q: int, n_kv: int, block_m: int, block_n: int, device, *,
                by_key: bool) -> TileLists:
    """The tile lists of one kernel: per query tile (forward, dQ) or, ``by_key``, per key tile (dK/dV); documents
    without a ``mask_mod`` from id ranges, anything else from every score."""
    if rules.document_ids is not None and rules.mask_mod is None:
        kinds = document_tile_kinds(rules, batch, n_q, block_m, block_n, device)
    else:
        kinds = tile_kinds(rules, batch, heads, n_q, n_kv, block_m, block_n, device)
    return tile_lists(kinds.transpose(-1, -2) if by_key else kinds)


class ListCache:
    """Tile lists of ``mask_mod`` rules by everything that decides them; past ``capacity`` the least recently
    used are dropped (each holds a few small tensors on the device)."""

    def __init__(self, capacity: int = 32):
        self.capacity = capacity
        self._lists: OrderedDict = OrderedDict()

    def __len__(self) -> int:
        return len(self._lists)

    def clear(self) -> None:
        self._lists.clear()

    def get(self, key, build: Callable[[], TileLists]) -> TileLists:
        """The lists under ``key``, made by ``build()`` the first time."""
        lists = self._lists.get(key)
        if lists is not None:
            self._lists.move_to_end(key)
            return lists
        lists = self._lists[key] = build()
        if len(self._lists) > self.capacity:
            self._lists.popitem(last=False)
        return lists


# The per-call path's lists of mask_mod rules (the module docstring says why they may be kept across calls).
CALL_LISTS = ListCache()


def call_lists(rules: Rules, block_mask: BlockMask | None, q: torch.Tensor, k: torch.Tensor, block_m: int,
               block_n: int, *, by_key: bool) -> dict:
    """A kernel's block-mask arguments: none for rules the bounds classify, the lists a prebuilt ``block_mask``
    derives for this kernel's tiles, or lists classified exactly at those tiles: for a ``mask_mod`` rule kept in
    :data:`CALL_LISTS` for later calls, for documents made for this call alone."""
    if not rules.needs_block_mask:
        return no_tile_lists(q)
    return _lists_for_call(rules, block_mask, q, k, block_m, block_n, by_key=by_key).kernel_args()


# At least one visited tile in ten partial: there the forward's small tiles beat its dense ones. On the H200 (D = 128,
# N = 16384, fp16, 2026-12-03-nvidia-h200-forward-launches.json) 64 x 64 tiles over 4 warps ran 8 documents, chunked
# local and stripes (23%, 22% and 97% of their visited 128 x 128 tiles partial) 1.02x, 1.02x and 2.1x faster than
# 128 x 128 over 8 warps, and a prefix-LM (1.4% partial) 1.14x slower.
PARTIAL_SHARE_FOR_SMALL_TILES = 0.1


def many_partial_tiles(rules: Rules, block_mask: BlockMask | None, q: torch.Tensor, k: torch.Tensor, block_m: int,
                       block_n: int) -> bool:
    """Whether a forward at (block_m, block_n) tiles would find at least PARTIAL_SHARE_FOR_SMALL_TILES of the tiles it
    visits partial, so that smaller tiles mask less. Packed documents: always (a query sees its own document, a
    short run of keys whose edges cut tiles; their ids are never read on the host). A ``mask_mod`` or a block
    mask: from the lists at those tiles, which are kept (:data:`CALL_LISTS`, the block mask's), so their share is
    read once; while a CUDA graph is captured nothing may be read: no."""
    if not rules.needs_block_mask:
        return False
    if rules.document_ids is not None:
        return True
    if q.is_cuda and torch.cuda.is_current_stream_capturing():
        return False
    return _lists_for_call(rules, block_mask, q, k, block_m, block_n, by_key=False).partial_share \
        >= PARTIAL_SHARE_FOR_SMALL_TILES


def _lists_for_call(rules: Rules, block_mask: BlockMask | None, q: torch.Tensor, k: torch.Tensor, block_m: int,
                    block_n: int, *, by_key: bool) -> TileLists:
    """The tile lists :func:`call_lists` hands a kernel at these tiles (a block-mask rule only)."""
    if block_mask is not None:
        return block_mask.tile_lists(block_m, block_n, by_key=by_key)
    n_q, n_kv = q.shape[2], k.shape[2]
    batch, heads = rules.mask_extent(q.shape[0], q.shape[1])

    def build() -> TileLists:
        return build_lists(rules, batch, heads, n_q, n_kv, block_m, block_n, q.device, by_key=by_key)

    # Never kept: document ids, a tensor whose contents may change between calls with the same shapes; and lists
    # made while a CUDA graph is captured, which are only recorded there (no kernel runs until a replay), and
    # which the graph must own: it would read freed memory once the cache dropped them.
    if rules.document_ids is not None or (q.is_cuda and torch.cuda.is_current_stream_capturing()):
        return build()
    # A mask_mod is a function of its arguments and of the module-level values it reads, so its lists depend only
    # on these: the function itself (a strong reference, so no other function can ever take its place), those
    # values (a notebook may change one between calls), the bounds causal and window give, the sizes, the tiles.
    key = (rules.mask_mod, mask_mod_constants(rules.mask_mod), *rules.key_bounds(n_q, n_kv), n_q, n_kv, batch,
           heads, block_m, block_n, by_key, q.device)
    return CALL_LISTS.get(key, build)


def rule_args(rules: Rules, q: torch.Tensor, k: torch.Tensor) -> dict:
    """The rule arguments every rules kernel takes (bounds, documents, cap, slopes) and their switches."""
    n_q, n_kv = q.shape[2], k.shape[2]
    upper, lower = rules.key_bounds(n_q, n_kv)
    docs = rules.document_ids if rules.document_ids is not None else q
    slopes = rules.alibi_slopes if rules.alibi_slopes is not None else q
    return {
        "UPPER": upper or 0, "LOWER": lower or 0, "SHIFT": rules.shift(n_q, n_kv),
        "DOC_IDS": docs, "stride_doc_b": docs.stride(0),
        "softcap2": (rules.softcap or 1.0) * LOG2E, "ALIBI_SLOPES": slopes,
        "HAS_UPPER": upper is not None, "HAS_LOWER": lower is not None,
        "HAS_DOCS": rules.document_ids is not None, "MASK_MOD": rules.mask_mod,
        "HAS_SOFTCAP": rules.softcap is not None, "HAS_ALIBI": rules.alibi_slopes is not None,
        "SCORE_MOD": rules.has_score_mod, "BLOCK_SPARSE": rules.needs_block_mask,
    }


def derived_kinds(kinds: torch.Tensor, block_size: tuple[int, int], n_q: int, n_kv: int, block_m: int,
                  block_n: int) -> torch.Tensor:
    """The kinds of (block_m, block_n) tiles from the kinds of (rows, columns) = ``block_size`` sparse blocks
    (B, H, cdiv(n_q, rows), cdiv(n_kv, columns)): full where every sparse block a tile overlaps is full and the
    tile lies inside (n_q, n_kv), empty where every one is empty, partial otherwise. Returns
    (B, H, cdiv(n_q, block_m), cdiv(n_kv, block_n)) int8."""
    rows, cols = block_size

    def spans(n: int, tile: int, block: int, blocks: int):
        """Per tile of ``tile`` positions: the first sparse block it overlaps, one past the last (clipped to the
        map: past n there are no keys to see), and whether the tile ends inside n."""
        first_position = torch.arange(triton.cdiv(n, tile), device=kinds.device) * tile
        end = first_position + tile
        return first_position // block, torch.clamp((end + block - 1) // block, max=blocks), end <= n

    r0, r1, rows_inside = spans(n_q, block_m, rows, kinds.shape[2])
    c0, c1, cols_inside = spans(n_kv, block_n, cols, kinds.shape[3])

    def counts(hit: torch.Tensor) -> torch.Tensor:
        """How many sparse blocks of ``hit`` lie under each tile, from prefix sums padded with a zero row and
        column: sum over [r0, r1) x [c0, c1) = P[r1, c1] - P[r0, c1] - P[r1, c0] + P[r0, c0]."""
        prefix = torch.nn.functional.pad(hit.to(torch.int32).cumsum(2).cumsum(3), (1, 0, 1, 0))
        return (prefix[:, :, r1[:, None], c1[None, :]] - prefix[:, :, r0[:, None], c1[None, :]]
                - prefix[:, :, r1[:, None], c0[None, :]] + prefix[:, :, r0[:, None], c0[None, :]])

    under = (r1 - r0)[:, None] * (c1 - c0)[None, :]  # sparse blocks under each tile
    inside = rows_inside[:, None] & cols_inside[None, :]
    full = (counts(kinds == FULL) == under) & inside
    empty = counts(kinds == EMPTY) == under
    return torch.where(full, FULL, torch.where(empty, EMPTY, PARTIAL)).to(torch.int8)


# One kernel's tiles: (block_m, block_n, by_key), by_key for lists per key tile (dK/dV) instead of per query tile.
TileSize = tuple[int, int, bool]


@dataclass(frozen=True, eq=False)  # eq=False: tensors inside have no truth value for ==
class BlockMask:
    """One mask rule at given shapes, classified once at a fixed sparse block and read by every call passing it.

    Made by ``kernels.create_block_mask``; ``flash_attention(..., block_mask=bm)`` and its forward and backward
    take their tile lists from it instead of classifying tiles again. It holds one map, ``kinds``: the kind
    (EMPTY, PARTIAL, FULL) of every ``block_size`` (rows, columns) sparse block. Whatever tiles a launch takes
    (they depend on the head dim, the dtype and the GPU), its lists are derived from that map on first use
    (:func:`derived_kinds`) and kept in a cache, which is not part of what the mask is.
    """

    rules: Rules  # the mask rules only: causal, window, document_ids, mask_mod
    batch: int | None  # None: the same mask for every batch row (mask_mod sees b = 0)
    heads: int | None  # None: the same mask for every head (mask_mod sees h = 0)
    n_q: int
    n_kv: int
    device: torch.device
    block_size: tuple[int, int]  # the sparse block: (query rows, key columns)
    kinds: torch.Tensor  # (B_mask, H_mask, cdiv(n_q, rows), cdiv(n_kv, columns)) int8, Rules.mask_extent
    constants: tuple = ()  # the module values mask_mod read when the map was made (rules.mask_mod_constants)
    _lists: dict[TileSize, TileLists] = field(default_factory=dict, init=False, repr=False)

    @classmethod
    def build(cls, rules: Rules, batch: int | None, heads: int | None, n_q: int, n_kv: int, device,
              block_size: tuple[int, int]) -> BlockMask:
        """Classify every sparse block of ``rules`` (one run of :func:`_tile_kinds_kernel`), over the batch rows
        and heads the rule tells apart (``Rules.mask_extent``): one of each where it reads neither b nor h."""
        reads = mask_mod_reads(rules.mask_mod) if rules.mask_mod is not None else None
        for name, given, read, what, param in (("B", batch, reads and reads.batch, "batch row", "b"),
                                               ("H", heads, reads and reads.head, "head", "h")):
            if given is None and read:  # a map made at 0 would meet the real index in the kernels' partial tiles
                raise ValueError(f"{name} is None (one mask for every {what}), but mask_mod {_show(rules.mask_mod)} "
                                 f"reads its parameter {param} (or its source could not be read to show it does not): "
                                 f"its mask may differ from {what} to {what}; pass {name}, the number of {what}s")
        mask_batch, mask_heads = rules.mask_extent(batch or 1, heads or 1)
        kinds = tile_kinds(rules, mask_batch, mask_heads, n_q, n_kv, *block_size, device)
        constants = mask_mod_constants(rules.mask_mod) if rules.mask_mod is not None else ()
        return cls(rules=rules, batch=batch, heads=heads, n_q=n_q, n_kv=n_kv, device=device, block_size=block_size,
                   kinds=kinds, constants=constants)

    @property
    def shape(self) -> tuple[int | None, int | None, int, int]:
        return self.batch, self.heads, self.n_q, self.n_kv

    def tile_lists(self, block_m: int, block_n: int, *, by_key: bool) -> TileLists:
        """The lists at one kernel's tiles, derived from the sparse blocks on first use and then kept."""
        size = (block_m, block_n, by_key)
        if size not in self._lists:
            kinds = derived_kinds(self.kinds, self.block_size, self.n_q, self.n_kv, block_m, block_n)
            self._lists[size] = tile_lists(kinds.transpose(-1, -2) if by_key else kinds)
        return self._lists[size]

    def call_options(self, *, causal, window, document_ids, mask_mod, causal_given: bool = False) -> dict:
        """A call's mask options under this block mask: the block mask's, or the same given again; other values
        raise a ValueError saying which option differs. ``causal`` False counts as given only with
        ``causal_given`` (else it is the default, and the mask's causality stands)."""
        mine = self.rules
        given = {"causal": (causal_given or (causal is not False and causal is not None), causal_alignment(causal),
                            mine.causal),
                 "window": (window is not None, check_window(window), mine.window),
                 "mask_mod": (mask_mod is not None, mask_mod, mine.mask_mod)}
        for name, (passed, value, built) in given.items():
            if passed and value != built:
                if name == "causal":  # no alignment is causal=False, as the caller spells it
                    value, built = value or False, built or False
                raise ValueError(
                    f"block_mask was built with {name}={_show(built)}, but this call passes {name}={_show(value)}: "
                    f"leave {name} out (the block mask carries it) or rebuild the mask with "
                    f"create_block_mask(..., {name}={_show(value)})")
        if mine.mask_mod is not None and (now := mask_mod_constants(mine.mask_mod)) != self.constants:
            changed = sorted({name for name, _ in set(now) ^ set(self.constants)})
            raise ValueError(
                f"block_mask's mask_mod {_show(mine.mask_mod)} reads module values that changed since the mask was "
                f"built ({', '.join(changed)}): its map classifies the old rule, its partial tiles would run the new "
                "one (neither mask); rebuild it with create_block_mask(...)")
        if document_ids is not None and not _same_ids(document_ids, mine.document_ids):
            raise ValueError(
                "block_mask was built from other document_ids than this call passes: leave document_ids out (the "
                "block mask carries them) or rebuild the mask with create_block_mask(..., document_ids=...)")
        return {"causal": mine.causal or False, "window": mine.window, "document_ids": mine.document_ids,
                "mask_mod": mine.mask_mod}

    def check_call(self, q: torch.Tensor, k: torch.Tensor) -> None:
        """A ValueError when q (B, H_q, N_q, D) or k (B, H_kv, N_kv, D) do not match the shapes and device this
        block mask was built for. The head dim and dtype may be anything: the lists follow the launch's tiles."""
        batch, heads, n_q, _ = q.shape
        call = (batch, heads, n_q, k.shape[2])
        wrong = [f"{name} = {got} where the block mask has {want}"
                 for name, got, want in zip(("B", "H", "N_q", "N_kv"), call, self.shape, strict=True)
                 if want is not None and got != want]
        if wrong:
            raise ValueError(f"block_mask does not fit this call: {', '.join(wrong)}; build one for these shapes "
                             f"with create_block_mask(..., B={batch}, H={heads}, N_q={n_q}, N_kv={k.shape[2]}) "
                             "(or B=None / H=None for a mask that is the same on every batch row / head)")
        if q.device != self.device:
            raise ValueError(f"block_mask lives on {self.device}, but q is on {q.device}: build it with "
                             f"create_block_mask(..., device={str(q.device)!r})")

    def kind_counts(self) -> dict[str, int]:
        """How many sparse blocks are full, partial and empty (a sum over the map's batch rows and heads: one of
        each where the rule reads neither b nor h)."""
        return {name: int((self.kinds == kind).sum()) for name, kind in
                (("full", FULL), ("partial", PARTIAL), ("empty", EMPTY))}

    def __repr__(self) -> str:
        batch, heads = (f"None (every {what} alike)" if x is None else x
                        for x, what in ((self.batch, "batch row"), (self.heads, "head")))
        rows, cols = self.block_size
        lines = [f"BlockMask(B={batch}, H={heads}, N_q={self.n_q}, N_kv={self.n_kv}, "
                 f"{_describe(self.rules)}, on {self.device}:",
                 f"  {rows}x{cols} sparse blocks: {_show_counts(self.kind_counts())}"]
        for (block_m, block_n, by_key), lists in self._lists.items():
            lines.append(f"  derived {block_m}x{block_n} tiles per {'key' if by_key else 'query'} tile: "
                         f"{_show_counts(lists.kind_counts())}")
        return "\n".join(lines) + ")"


def _show_counts(counts: dict[str, int]) -> str:
    total = sum(counts.values())
    return (f"{counts['full']} full, {counts['partial']} partial, {counts['empty']} empty of {total}, "
            f"sparsity {counts['empty'] / max(total, 1):.0%}")


def _show(value) -> str:
    fn = getattr(value, "fn", value)  # a @triton.jit function: its Python function's name
    return getattr(fn, "__name__", None) or repr(value)


def _same_ids(given: torch.Tensor, built: torch.Tensor | None) -> bool:
    """The same tensor (the mask's own), or ids that split every row into the same documents (compared as ranks:
    the mask keeps int64 ids as ranks, and a copy in another dtype is the same mask). The mask holds a copy made
    at build, so a caller's buffer changed since compares unequal."""
    if built is None or not isinstance(given, torch.Tensor):
        return False
    if given is built:
        return True
    if given.shape != built.shape or given.device != built.device or given.dtype.is_floating_point:
        return False
    return bool(torch.equal(document_ranks(given), document_ranks(built)))


def _describe(rules: Rules) -> str:
    parts = [f"causal={rules.causal!r}"] if rules.causal else []
    if rules.window is not None:
        parts.append(f"window={rules.window}")
    if rules.document_ids is not None:
        parts.append(f"document_ids of shape {tuple(rules.document_ids.shape)}")
    if rules.mask_mod is not None:
        parts.append(f"mask_mod={_show(rules.mask_mod)}")
    return "rules: " + ", ".join(parts)
