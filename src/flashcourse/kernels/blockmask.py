"""Block masks: which (query tile, key tile) pairs a rule leaves empty, partial or full (FlexAttention's idea,
Dong et al. 2024, "Flex Attention: A Programming Model for Generating Optimized Attention Kernels").

Causal and window bounds are classified analytically inside the attention kernels. Documents and ``mask_mod``
cannot be, so :func:`_tile_kinds_kernel` evaluates the whole rule on every tile pair and writes its kind
(0 empty, 1 partial, 2 full) to a (B_mask, H_mask, row tiles, column tiles) int8 map; H_mask is 1 unless a
``mask_mod`` (which sees the head) is given, and B_mask is 1 where the mask is the same for every batch row. The
host turns each row of the map into two lists, its full tiles and its partial tiles, so an attention kernel loops
over those alone: empty tiles are never loaded, full tiles run without mask code.

A call builds these lists itself, at each kernel's tile size (the backward twice: dK/dV by key tile, dQ by query
tile). :class:`BlockMask` (``kernels.create_block_mask``) builds them once for given shapes, so that the forward,
the backward and every later training step read the same lists, as FlexAttention's ``BlockMask`` does.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import triton
import triton.language as tl

from .common import LOG2E, visible
from .rules import Rules, causal_alignment, check_window

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

    ``batch`` and ``heads`` are the mask's own: 1 where it is the same for every batch row (``mask_mod`` then
    sees b = 0) or every head (h = 0); documents need the documents' batch."""
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


def _list_of(kinds: torch.Tensor, kind: int) -> tuple[torch.Tensor, torch.Tensor]:
    hit = kinds == kind
    counts = hit.sum(-1, dtype=torch.int32)
    # A stable sort of "not this kind" puts this kind's column indices first, in ascending order.
    order = torch.sort((~hit).to(torch.int8), dim=-1, stable=True).indices
    return counts.contiguous(), order.to(torch.int32).contiguous()


def tile_lists(kinds: torch.Tensor) -> TileLists:
    """The full and partial tiles of every row of a kinds map (B, H_mask, rows, columns)."""
    return TileLists(*_list_of(kinds, FULL), *_list_of(kinds, PARTIAL))


def no_tile_lists(stand_in: torch.Tensor) -> dict:
    """Kernel arguments when no block mask is used: the pointers are never read, ``stand_in`` fills them."""
    return {"FULL_COUNTS": stand_in, "FULL_TILES": stand_in, "PARTIAL_COUNTS": stand_in,
            "PARTIAL_TILES": stand_in, "B_MASK": 1, "H_MASK": 1, "TILES_PER_ROW": 0}


def build_lists(rules: Rules, batch: int, heads: int, n_q: int, n_kv: int, block_m: int, block_n: int, device, *,
                by_key: bool) -> TileLists:
    """The tile lists of one kernel: per query tile (forward, dQ) or, ``by_key``, per key tile (dK/dV)."""
    kinds = tile_kinds(rules, batch, heads, n_q, n_kv, block_m, block_n, device)
    return tile_lists(kinds.transpose(-1, -2) if by_key else kinds)


def call_lists(rules: Rules, block_mask: BlockMask | None, q: torch.Tensor, k: torch.Tensor, block_m: int,
               block_n: int, *, by_key: bool) -> dict:
    """A kernel's block-mask arguments: none for rules the bounds classify, the prebuilt ``block_mask``'s lists,
    or lists built for this call alone."""
    if not rules.needs_block_mask:
        return no_tile_lists(q)
    if block_mask is not None:
        return block_mask.tile_lists(block_m, block_n, by_key=by_key).kernel_args()
    heads = q.shape[1] if rules.mask_mod is not None else 1
    return build_lists(rules, q.shape[0], heads, q.shape[2], k.shape[2], block_m, block_n, q.device,
                       by_key=by_key).kernel_args()


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


# One kernel's tiles: (block_m, block_n, by_key), by_key for lists per key tile (dK/dV) instead of per query tile.
TileSize = tuple[int, int, bool]


@dataclass(frozen=True, eq=False)  # eq=False: tensors inside have no truth value for ==
class BlockMask:
    """The tile lists of one mask rule at given shapes, built once and read by every call that passes it.

    Made by ``kernels.create_block_mask``; ``flash_attention(..., block_mask=bm)`` and its forward and backward
    read its lists instead of classifying the tiles again. It holds the lists at the tile sizes of the launches
    this device chooses for its head dim and dtype (``planned``: forward, dK/dV, dQ; the forward and dQ share a
    size where their tiles agree); a launch that steps down to smaller tiles (``stepdown.py``, a GPU outside
    ``configs.KNOWN_DEVICES``) builds its size on first use and keeps it here.
    """

    rules: Rules  # the mask rules only: causal, window, document_ids, mask_mod
    batch: int | None  # None: the same mask for every batch row (mask_mod sees b = 0)
    heads: int | None  # None: the same mask for every head (mask_mod sees h = 0)
    n_q: int
    n_kv: int
    device: torch.device
    head_dim: int
    dtype: torch.dtype
    planned: dict[str, TileSize]  # kernel ("forward", "dK/dV", "dQ") -> its tiles
    lists: dict[TileSize, TileLists] = field(default_factory=dict)

    def __post_init__(self):
        kinds: dict[tuple[int, int], torch.Tensor] = {}  # one map per tile shape, read both ways
        for size in self.planned.values():
            block_m, block_n, by_key = size
            if (block_m, block_n) not in kinds:
                kinds[block_m, block_n] = tile_kinds(self.rules, *self._mask_batch_heads, self.n_q, self.n_kv,
                                                     block_m, block_n, self.device)
            found = kinds[block_m, block_n]
            self.lists[size] = tile_lists(found.transpose(-1, -2) if by_key else found)

    @property
    def shape(self) -> tuple[int | None, int | None, int, int]:
        return self.batch, self.heads, self.n_q, self.n_kv

    @property
    def _mask_batch_heads(self) -> tuple[int, int]:
        """(B_mask, H_mask) of the lists: a head axis only for a mask_mod (the one rule that sees h)."""
        heads = self.heads if self.rules.mask_mod is not None and self.heads is not None else 1
        return self.batch or 1, heads

    def tile_lists(self, block_m: int, block_n: int, *, by_key: bool) -> TileLists:
        """The lists at one kernel's tiles; a size not built yet (a launch stepped down) is built and kept."""
        size = (block_m, block_n, by_key)
        if size not in self.lists:
            self.lists[size] = build_lists(self.rules, *self._mask_batch_heads, self.n_q, self.n_kv, block_m,
                                           block_n, self.device, by_key=by_key)
        return self.lists[size]

    def call_options(self, *, causal, window, document_ids, mask_mod) -> dict:
        """A call's mask options under this block mask: the block mask's, or the same given again; other values
        raise a ValueError saying which option differs."""
        mine = self.rules
        given = {"causal": (causal is not False and causal is not None, causal_alignment(causal), mine.causal),
                 "window": (window is not None, check_window(window), mine.window),
                 "mask_mod": (mask_mod is not None, mask_mod, mine.mask_mod)}
        for name, (passed, value, built) in given.items():
            if passed and value != built:
                raise ValueError(
                    f"block_mask was built with {name}={_show(built)}, but this call passes {name}={_show(value)}: "
                    f"leave {name} out (the block mask carries it) or rebuild the mask with "
                    f"create_block_mask(..., {name}={_show(value)})")
        if document_ids is not None and not _same_ids(document_ids, mine.document_ids):
            raise ValueError(
                "block_mask was built from other document_ids than this call passes: leave document_ids out (the "
                "block mask carries them) or rebuild the mask with create_block_mask(..., document_ids=...)")
        return {"causal": mine.causal or False, "window": mine.window, "document_ids": mine.document_ids,
                "mask_mod": mine.mask_mod}

    def check_call(self, q: torch.Tensor, k: torch.Tensor, planned: dict[str, TileSize]) -> None:
        """A ValueError when q (B, H_q, N_q, D), k (B, H_kv, N_kv, D) or the call's launches (``planned``) do not
        match what this block mask was built for."""
        batch, heads, n_q, head_dim = q.shape
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
        missing = {name: size for name, size in planned.items() if size not in self.lists}
        if missing:
            raise ValueError(
                f"block_mask was built for head dim {self.head_dim} in {self.dtype}, whose launches use other tiles "
                f"than this call's (head dim {head_dim} in {q.dtype}: {_show_sizes(missing)}): rebuild it with "
                f"create_block_mask(..., head_dim={head_dim}, dtype={q.dtype})")

    def __repr__(self) -> str:
        batch, heads = (f"None (every {what} alike)" if x is None else x
                        for x, what in ((self.batch, "batch row"), (self.heads, "head")))
        lines = [f"BlockMask(B={batch}, H={heads}, N_q={self.n_q}, N_kv={self.n_kv}, "
                 f"{_describe(self.rules)}, on {self.device}, for head dim {self.head_dim} in {self.dtype}:"]
        for size, lists in self.lists.items():
            users = [name for name, planned in self.planned.items() if planned == size] or ["a step-down"]
            counts = lists.kind_counts()
            total = sum(counts.values())
            lines.append(f"  {size[0]}x{size[1]} tiles per {'key' if size[2] else 'query'} tile "
                         f"({', '.join(users)}): {counts['full']} full, {counts['partial']} partial, "
                         f"{counts['empty']} empty of {total}, sparsity {counts['empty'] / max(total, 1):.0%}")
        return "\n".join(lines) + ")"


def _show(value) -> str:
    fn = getattr(value, "fn", value)  # a @triton.jit function: its Python function's name
    return getattr(fn, "__name__", None) or repr(value)


def _same_ids(given: torch.Tensor, built: torch.Tensor | None) -> bool:
    """The same tensor, or (a copy, another integer dtype) equal ids; only the second compares values."""
    if built is None or not isinstance(given, torch.Tensor):
        return False
    return given is built or (given.shape == built.shape and given.device == built.device
                              and bool(torch.equal(given.to(built.dtype), built)))


def _show_sizes(sizes: dict[str, TileSize]) -> str:
    return ", ".join(f"{name} {m}x{n}" for name, (m, n, _) in sizes.items())


def _describe(rules: Rules) -> str:
    parts = [f"causal={rules.causal!r}"] if rules.causal else []
    if rules.window is not None:
        parts.append(f"window={rules.window}")
    if rules.document_ids is not None:
        parts.append(f"document_ids of shape {tuple(rules.document_ids.shape)}")
    if rules.mask_mod is not None:
        parts.append(f"mask_mod={_show(rules.mask_mod)}")
    return "rules: " + ", ".join(parts)
