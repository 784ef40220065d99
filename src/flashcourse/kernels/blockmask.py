"""Block masks: which (query tile, key tile) pairs a rule leaves empty, partial or full (FlexAttention's idea,
Dong et al. 2024, "Flex Attention: A Programming Model for Generating Optimized Attention Kernels").

Causal and window bounds are classified analytically inside the attention kernels. Documents and ``mask_mod``
cannot be, so :func:`_tile_kinds_kernel` evaluates the whole rule on every tile pair and writes its kind
(0 empty, 1 partial, 2 full) to a (B, H_mask, row tiles, column tiles) int8 map; H_mask is 1 unless a
``mask_mod`` (which sees the head) is given. The host turns each row of the map into two lists, its full tiles
and its partial tiles, so an attention kernel loops over those alone: empty tiles are never loaded, full tiles
run without mask code.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .common import LOG2E, visible
from .rules import Rules

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


def tile_kinds(rules: Rules, q: torch.Tensor, k: torch.Tensor, block_m: int, block_n: int) -> torch.Tensor:
    """The (B, H_mask, cdiv(N_q, block_m), cdiv(N_k, block_n)) int8 map of tile kinds under ``rules``."""
    batch, heads, n_q, _ = q.shape
    n_kv = k.shape[2]
    h_mask = heads if rules.mask_mod is not None else 1
    upper, lower = rules.key_bounds(n_q, n_kv)
    docs = rules.document_ids if rules.document_ids is not None else q  # q stands in for an absent pointer
    kinds = torch.empty((batch, h_mask, triton.cdiv(n_q, block_m), triton.cdiv(n_kv, block_n)),
                        dtype=torch.int8, device=q.device)
    if kinds.numel() == 0:
        return kinds
    _tile_kinds_kernel[(kinds.shape[2], kinds.shape[3], batch * h_mask)](
        KINDS=kinds, DOC_IDS=docs, stride_doc_b=docs.stride(0), N_Q=n_q, N_KV=n_kv,
        UPPER=upper or 0, LOWER=lower or 0, H_MASK=h_mask,
        HAS_UPPER=upper is not None, HAS_LOWER=lower is not None, HAS_DOCS=rules.document_ids is not None,
        MASK_MOD=rules.mask_mod, BLOCK_M=block_m, BLOCK_N=block_n,
    )
    return kinds


@dataclass(frozen=True)
class TileLists:
    """For every row of tiles (B, H_mask, rows): how many full and partial tiles it has, and which, ascending
    (the ``*_tiles`` rows are padded with the other tiles' indices past their count)."""

    full_counts: torch.Tensor  # (B, H_mask, rows) int32
    full_tiles: torch.Tensor  # (B, H_mask, rows, columns) int32
    partial_counts: torch.Tensor
    partial_tiles: torch.Tensor

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
                "H_MASK": self.heads, "TILES_PER_ROW": self.tiles_per_row}


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
            "PARTIAL_TILES": stand_in, "H_MASK": 1, "TILES_PER_ROW": 0}


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
