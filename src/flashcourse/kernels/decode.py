"""Split-KV decoding (Flash-Decoding): one new query token per sequence against a long KV cache.

A decode step has one query row per head, so a FlashAttention launch would have B * H programs: far too few
to fill a GPU at batch 1. Flash-Decoding also splits the KV length: program (split s, batch b, KV head h)
attends the query heads of h's group to keys [s * split_len, (s + 1) * split_len) and writes a partial output,
normalised over its own keys, with its logsumexp. A second kernel combines the splits of each row with the
merge rule of lesson 02 (``reference.merge_partials``), applied to all splits at once:
    lse = log(sum_s exp(lse_s)),    o = sum_s exp(lse_s - lse) * o_s;   empty splits have lse_s = -inf.
With one split there is nothing to merge: the split kernel writes o itself, and the call is one launch.

The host path works out once what a call's layouts and options decide (a ``_Plan``: checks, launch, splits,
the kernels' arguments) and keeps it by those layouts and options; a repeat call on a GPU only allocates its
output and launches, as FlashInfer's ``plan`` / ``run`` split. Under ``torch.compile`` the call is one custom op,
``flashcourse::decode``.

Grouped-query attention: the H_q / H_kv query heads that share a KV head are one program's rows, so each K/V
tile is read from memory once for the whole group (the bytes that bound decoding). A sliding window reads
only its keys: the splits cover [seqlen - 1 - left, seqlen), not the whole cache. Paged cache: K/V live in
pages of ``page_size`` rows, ``k_cache[block_table[b, pos // page_size], h, pos % page_size]``, as vLLM's
PagedAttention stores them.

Paged tiles read the block table once per page, not once per key row. Tiles start on BLOCK_N boundaries and
page sizes are powers of two, so a tile either lies inside one page (page_size >= BLOCK_N: one table read, then
BLOCK_N contiguous rows, as in the contiguous cache) or covers BLOCK_N // page_size whole pages (one read each).
The table is read one tile ahead: Triton's software pipeliner counts a load that feeds the K/V addresses in the
same loop step as a level of indirection and then prefetches K/V one tile ahead instead of two (compiled for
sm_90, the earlier per-row lookup held one K/V buffer in shared memory instead of two; what it cost on the H200 is
in docs/KERNELS.md, paged decoding).

The split kernel has two switches beyond its tiles (:class:`DecodeSwitches`), both chosen per call unless it
passes them: how many programs an SM should hold (two for the FP8 cache on sm_90, where one program could not keep
its loads in flight), and whether a split's whole key tiles run without masks (on for a V cache stored with its
keys adjacent, :func:`v_keys_adjacent`, whose copies a mask along the keys would narrow). What they were chosen
from: the FP8 cache's candidates, timed on the H200 by ``benchmarks/gpu_decode_fp8.py`` (docs/KERNELS.md, decoding).
"""

from __future__ import annotations

from dataclasses import replace
from typing import NamedTuple, Optional

import torch
import triton
import triton.language as tl

from . import configs
from ._checks import (
    check_decode_inputs,
    check_lengths,
    check_pages,
    check_scale,
    dot_precision,
    host_lengths,
    padded_head_dim,
)
from .common import (
    LOG2E,
    LOG2E_IN_KERNEL,
    NO_KEY_YET,
    default_scale,
    modified_scores,
    normalise_rows,
    online_softmax_update,
    strides,
)
from .launch import LaunchCache
from .plan import PLANS
from .rules import check_alibi_slopes, check_softcap, check_window
from .stepdown import launch_fitting

FP8 = torch.float8_e4m3fn
E4M3_MAX = 448.0  # the largest finite float8_e4m3fn value


class DecodeSwitches(NamedTuple):
    """The split kernel's options beyond its tiles; a field left None is chosen per call (:func:`default_switches`).

    - ``programs_per_sm``: the default number of splits aims at this many programs per SM, so that one program's
      waits overlap another's (it helps only where that many fit an SM; with ``num_splits`` given it does nothing);
    - ``mask_tail_only``: a split's whole key tiles run without masks on the keys, its last tile apart with
      them. For a V cache stored keys-adjacent (:func:`v_keys_adjacent`) this is what keeps its copies 16 bytes
      wide: a mask that varies along the keys narrows them to one element."""

    programs_per_sm: int | None = None
    mask_tail_only: bool | None = None


def default_switches(props: configs.DeviceProps, block_d: int, elem_bytes: int, *, fp8_cache: bool,
                     v_keys_adjacent: bool) -> DecodeSwitches:
    """The switches of a call that leaves them to us: ``configs.decode_programs_per_sm`` programs per SM (two for
    the FP8 cache on sm_90), and whole tiles without masks exactly when V is stored keys-adjacent (the layout
    whose copies a mask along the keys narrows; as V is usually stored, D adjacent, the kernel keeps its masks)."""
    return DecodeSwitches(programs_per_sm=configs.decode_programs_per_sm(props, block_d, elem_bytes,
                                                                         fp8_cache=fp8_cache),
                          mask_tail_only=v_keys_adjacent)


def _check_switches(switches) -> DecodeSwitches | None:
    if switches is None:
        return None
    if not isinstance(switches, DecodeSwitches):
        raise TypeError(f"switches is a {type(switches).__name__}: expected a DecodeSwitches (or None)")
    programs = switches.programs_per_sm
    if programs is not None and (not isinstance(programs, int) or isinstance(programs, bool) or programs < 1):
        raise ValueError(f"programs_per_sm = {programs!r}: expected an int, at least 1 (or None: chosen per call)")
    return switches


def _resolve_switches(switches, default: DecodeSwitches) -> DecodeSwitches:
    """``switches`` (None, or a DecodeSwitches whose None fields are left to us), completed from ``default``."""
    switches = _check_switches(switches)
    if switches is None:
        return default
    return DecodeSwitches(*(chosen if mine is None else mine for mine, chosen in zip(switches, default, strict=True)))


def _is_keys_adjacent(v_cache: torch.Tensor) -> bool:
    """Whether V is stored with each head's keys adjacent (stride 1 along the keys, not along D)."""
    return v_cache.stride(2) == 1 and v_cache.stride(3) != 1


def v_keys_adjacent(v_cache: torch.Tensor) -> torch.Tensor:
    """The same V cache, shape and values, stored with each head's keys adjacent (``stride(2) == 1``): the
    layout in which P V's operand has its reduction dimension (the keys) contiguous, as the FP8 forward reads V:
    no byte-wide shared-memory reads, and (``flash_decode`` then runs whole key tiles without masks) 16-byte
    copies. On the H200 it made the FP8 cache 1.25-1.79x as fast as the float16 cache, against 1.26-1.49x with V as
    given (docs/KERNELS.md, decoding). A serving engine would write each new token into it a column at a time."""
    return v_cache.transpose(2, 3).contiguous().transpose(2, 3)


@triton.jit
def _tile_pages(TABLE_ROW, stride_bt_p, start_n, end, NUM_PAGES, PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr):
    """The pages (int64) holding keys start_n .. start_n + BLOCK_N - 1, a tile that starts on a BLOCK_N boundary:
    one scalar for a tile inside one page (PAGE_SIZE >= BLOCK_N), else the page of each row of a tile that covers
    BLOCK_N // PAGE_SIZE whole pages. ``TABLE_ROW`` points at the sequence's block-table row, read once per page;
    pages from ``end`` on are not read (they may lie past the table's last column) and come back as 0.
    A page outside 0 .. NUM_PAGES - 1 (a table the host did not check: a serving loop rewrites it every step) comes
    back as page 0, so that its address stays inside the cache, with bit i of the second result (an int32) set for
    the tile's i-th page: the kernel masks those keys. Each page read is checked once, on the scalar (one unsigned
    compare: a negative page is a huge uint32), never per key."""
    if PAGE_SIZE >= BLOCK_N:
        page = tl.load(TABLE_ROW + (start_n // PAGE_SIZE) * stride_bt_p, mask=start_n < end, other=0)
        in_cache = page.to(tl.uint32, bitcast=True) < NUM_PAGES
        page = tl.where(in_cache, page, 0).to(tl.int64)
        bad_pages = tl.where(in_cache, 0, 1)
    else:
        slot = tl.arange(0, BLOCK_N) // PAGE_SIZE  # which of the tile's pages a row is in
        page = tl.zeros([BLOCK_N], dtype=tl.int64)
        bad_pages = 0
        for i in tl.static_range(BLOCK_N // PAGE_SIZE):
            page_i = tl.load(TABLE_ROW + (start_n // PAGE_SIZE + i) * stride_bt_p,
                             mask=start_n + i * PAGE_SIZE < end, other=0)
            in_cache = page_i.to(tl.uint32, bitcast=True) < NUM_PAGES
            page = tl.where(slot == i, tl.where(in_cache, page_i, 0).to(tl.int64), page)
            bad_pages = bad_pages | tl.where(in_cache, 0, 1 << i)
    return page, bad_pages


@triton.jit
def _decode_split_kernel(
    Q, K, V, BLOCK_TABLE, SEQLENS, K_SCALE, V_SCALE, O_PART, LSE_PART, OUT, ALIBI_SLOPES, qk_scale,
    stride_qb, stride_qh, stride_qn, stride_qd, stride_ob, stride_oh, stride_on, stride_od,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_bt_b, stride_bt_p,
    H_KV, N_MAX, NUM_PAGES, N_NEW, SPLIT_LEN, NUM_SPLITS, WINDOW_LEFT, softcap2,
    GROUP: tl.constexpr, BLOCK_G: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr, PAGED: tl.constexpr, PAGE_SIZE: tl.constexpr, HAS_SEQLENS: tl.constexpr,
    HAS_WINDOW: tl.constexpr, HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr, DOT_PRECISION: tl.constexpr,
    KV_FP8: tl.constexpr, DIRECT: tl.constexpr, MASK_TAIL_ONLY: tl.constexpr, ROW_MASKS: tl.constexpr,
    CAUSAL: tl.constexpr,
):
    pid_split = tl.program_id(0)
    pid_bh = tl.program_id(1)  # over B * H_kv
    pid_rows = tl.program_id(2)  # over tiles of BLOCK_G of the GROUP * N_NEW query rows of this KV head
    b = (pid_bh // H_KV).to(tl.int64)
    h_kv = (pid_bh % H_KV).to(tl.int64)
    if KV_FP8:  # true K = k8 * k_scale: one factor on every score of this (batch, KV head), folded in once.
        # The running max takes max(qk) * qk_scale for the largest scaled score, true only for qk_scale > 0, so
        # the scale's magnitude goes here and a negative scale's sign to q below (a sign flip is exact)
        k_scale = tl.load(K_SCALE + pid_bh)
        qk_scale = qk_scale * tl.abs(k_scale)
        q_sign = tl.where(k_scale < 0, -1.0, 1.0)
    seqlen = N_MAX
    if HAS_SEQLENS:  # clamped to the cache: a length past it never reads another sequence's rows or pages
        seqlen = tl.minimum(tl.maximum(tl.load(SEQLENS + b), 0), N_MAX)
    # The new tokens sit at positions seqlen - N_NEW .. seqlen - 1 (the cache holds their keys too); a window
    # reaches back WINDOW_LEFT keys from each, so the first one's window starts the keys any row reads.
    first = 0
    if HAS_WINDOW:
        first = tl.maximum(seqlen - N_NEW - WINDOW_LEFT, 0)
    start = first + pid_split * SPLIT_LEN  # the splits share out the window only: keys before it are never read
    if PAGED:  # tiles start on BLOCK_N boundaries, so none straddles a page edge; keys before `first` are masked
        start = first // BLOCK_N * BLOCK_N + pid_split * SPLIT_LEN
    end = tl.minimum(start + SPLIT_LEN, seqlen)

    # Rows: (new token t, query head g of this KV head's group) as r = t * GROUP + g, padded to a dot-able 16;
    # with one new token, the group's heads. Every row reads the same K/V tiles: the group's and the tokens' rows
    # share each load.
    offs_r = pid_rows * BLOCK_G + tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, BLOCK_D)
    row_ok = offs_r < GROUP * N_NEW
    token = offs_r // GROUP
    heads = h_kv * GROUP + offs_r % GROUP
    q_mask = row_ok[:, None] & (offs_d[None, :] < HEAD_DIM)
    q = tl.load(Q + b * stride_qb + heads[:, None] * stride_qh + token[:, None] * stride_qn
                + offs_d[None, :] * stride_qd, mask=q_mask, other=0.0)  # (BLOCK_G, BLOCK_D)
    if KV_FP8:
        q = (q * q_sign).to(Q.dtype.element_ty)
    position = seqlen - N_NEW + token  # each row's own key position (bottom-right: the last token is seqlen - 1)
    row_end = tl.zeros_like(token) + seqlen  # keys a row sees end here: its own position + 1 when causal
    if CAUSAL:
        row_end = position + 1
    row_first = tl.zeros_like(token) + first
    if HAS_WINDOW:
        row_first = tl.maximum(position - WINDOW_LEFT, 0)

    slope2 = tl.zeros([BLOCK_G, 1], dtype=tl.float32)
    if HAS_ALIBI:  # one slope per query head of the group, in base 2
        slope2 = tl.load(ALIBI_SLOPES + heads, mask=row_ok, other=0.0)[:, None] * LOG2E_IN_KERNEL
    m_i = tl.full([BLOCK_G], NO_KEY_YET, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_G], dtype=tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], dtype=tl.float32)
    # Every key tile of a split but its last is whole. With MASK_TAIL_ONLY the whole tiles run without masks on the
    # keys and the last one runs apart with them: a mask that varies along the keys narrows the copies of a V
    # stored keys-adjacent to one element, and costs selects on every tile. A paged window's first tile may start
    # before the window, so there every tile keeps its masks; so do several new tokens, each row with its own
    # bounds (ROW_MASKS).
    TAIL_APART: tl.constexpr = MASK_TAIL_ONLY and not (PAGED and HAS_WINDOW) and not ROW_MASKS
    full_end = end
    if TAIL_APART:
        full_end = start + tl.maximum(end - start, 0) // BLOCK_N * BLOCK_N
    if PAGED:  # the first tile's pages; each step then reads the next tile's (see _tile_pages)
        table_row = BLOCK_TABLE + b * stride_bt_b
        page, bad_pages = _tile_pages(table_row, stride_bt_p, start, end, NUM_PAGES, PAGE_SIZE, BLOCK_N)
    for phase in tl.static_range(2 if TAIL_APART else 1):  # the whole tiles, then (TAIL_APART) the last one
        lo = start if phase == 0 else full_end
        hi = full_end if phase == 0 and TAIL_APART else end
        for start_n in range(lo, hi, BLOCK_N):
            cols = start_n + tl.arange(0, BLOCK_N)  # logical key positions
            col_ok = cols < end
            if PAGED:  # logical position -> (page from the block table, row inside the page)
                if PAGE_SIZE >= BLOCK_N:
                    in_page = start_n % PAGE_SIZE
                    if MASK_TAIL_ONLY:  # tiles start on multiples of BLOCK_N; told so, the compiler keeps the
                        in_page = tl.multiple_of(in_page, BLOCK_N)  # copies of a keys-adjacent V 16 bytes wide
                    in_page = in_page + tl.arange(0, BLOCK_N)
                else:
                    in_page = tl.arange(0, BLOCK_N) % PAGE_SIZE
                k_off = page * stride_kb + in_page * stride_kn
                v_off = page * stride_vb + in_page * stride_vn
                tile_bad_pages = bad_pages  # this tile's, before the line below reads the next tile's
                if HAS_WINDOW:  # the first tile may begin before the window
                    col_ok = col_ok & (cols >= first)
                # Read the next tile's pages now, one step ahead: the K/V addresses then come from the previous
                # step, not from a load in this one, which the software pipeliner would count as a level of
                # indirection (and prefetch K/V one stage less far ahead).
                page, bad_pages = _tile_pages(table_row, stride_bt_p, start_n + BLOCK_N, end, NUM_PAGES, PAGE_SIZE,
                                              BLOCK_N)
            else:
                k_off = b * stride_kb + cols * stride_kn
                v_off = b * stride_vb + cols * stride_vn
            kv_mask = offs_d[None, :] < HEAD_DIM
            if phase == 1 or not TAIL_APART:  # the one tile that may run past `end`
                kv_mask = col_ok[:, None] & kv_mask
            k = tl.load(K + h_kv * stride_kh + k_off[:, None] + offs_d[None, :] * stride_kd, mask=kv_mask, other=0.0)
            v = tl.load(V + h_kv * stride_vh + v_off[:, None] + offs_d[None, :] * stride_vd, mask=kv_mask, other=0.0)
            if KV_FP8:  # one byte per element read, then widened in registers: every e4m3 value is exact in 16 bits
                k = k.to(q.dtype)
                v = v.to(q.dtype)
            qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)  # (BLOCK_G, BLOCK_N)
            step_scale = qk_scale
            if HAS_SOFTCAP or HAS_ALIBI:  # capped and biased scores come out scaled, in base 2
                qk, _ = modified_scores(
                    qk, q_idx=position[:, None], kv_idx=cols[None, :], qk_scale=qk_scale, softcap2=softcap2,
                    slope2=slope2, SHIFT=0, HAS_SOFTCAP=HAS_SOFTCAP, HAS_ALIBI=HAS_ALIBI)
                step_scale = 1.0
            if ROW_MASKS:  # several new tokens: each row sees keys [row_first, row_end) of this split
                seen = (col_ok[None, :] & (cols[None, :] < row_end[:, None])) & (cols[None, :] >= row_first[:, None])
                qk = tl.where(seen, qk, float("-inf"))
            elif phase == 1 or not TAIL_APART:
                qk = tl.where(col_ok[None, :], qk, float("-inf"))
            if PAGED:
                if tile_bad_pages != 0:  # a page outside the cache, read as page 0: its keys weigh nothing. A branch
                    # that only a bad table takes, the same for the whole program: a valid table pays one compare.
                    # (Its V rows still reach P V times 0: a NaN stored in page 0 would come through.)
                    bad_key = (tile_bad_pages >> (tl.arange(0, BLOCK_N) // PAGE_SIZE)) & 1
                    qk = tl.where(bad_key[None, :] == 0, qk, float("-inf"))
            acc, l_i, m_i = online_softmax_update(acc, l_i, m_i, qk, v, step_scale, DOT_PRECISION)

    # Partial output normalised over this split's keys; an empty split gives o = 0, lse = -inf.
    o, lse = normalise_rows(acc, l_i, m_i)
    if KV_FP8:  # true V = v8 * v_scale: o is a weighted mean of V's rows, so the factor applies once, here
        o = o * tl.load(V_SCALE + pid_bh)
    if DIRECT:  # one split: its output is the answer, written in q's dtype; no partials, no combine launch
        tl.store(OUT + b * stride_ob + heads[:, None] * stride_oh + token[:, None] * stride_on
                 + offs_d[None, :] * stride_od, o.to(OUT.dtype.element_ty), mask=q_mask)
    else:  # O_PART (B, H_q, N_NEW, S, D), LSE_PART (B, H_q, N_NEW, S)
        row = ((b * H_KV * GROUP + heads) * N_NEW + token) * NUM_SPLITS + pid_split
        tl.store(O_PART + row[:, None] * BLOCK_D + offs_d[None, :], o, mask=row_ok[:, None])
        tl.store(LSE_PART + row, lse, mask=row_ok)


@triton.jit
def _decode_combine_kernel(O_PART, LSE_PART, OUT, stride_ob, stride_oh, stride_on, stride_od, H_Q, N_NEW,
                           NUM_SPLITS, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr):
    pid = tl.program_id(0)  # one (batch, query head, new token) row
    b = pid // (H_Q * N_NEW)
    h = pid // N_NEW % H_Q
    token = pid % N_NEW
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    s_ok = offs_s < NUM_SPLITS
    lse_s = tl.load(LSE_PART + pid * NUM_SPLITS + offs_s, mask=s_ok, other=float("-inf"))  # (BLOCK_S,)
    o_s = tl.load(O_PART + (pid * NUM_SPLITS + offs_s)[:, None] * BLOCK_D + offs_d[None, :],
                  mask=s_ok[:, None], other=0.0)  # (BLOCK_S, BLOCK_D)
    lse_max = tl.max(lse_s, 0)
    lse_max = tl.where(lse_max == float("-inf"), 0.0, lse_max)  # all splits empty: weights all 0 below
    w = tl.exp(lse_s - lse_max)  # exp(-inf) = 0: empty splits add nothing
    total = tl.sum(w, 0)
    o = tl.sum(w[:, None] * o_s, 0) / tl.where(total == 0.0, 1.0, total)
    tl.store(OUT + b.to(tl.int64) * stride_ob + h * stride_oh + token * stride_on + offs_d * stride_od,
             o.to(OUT.dtype.element_ty), mask=offs_d < HEAD_DIM)


def flash_decode(q, k_cache, v_cache, *, cache_seqlens=None, block_table=None, scale=None, num_splits=None,
                 k_scale=None, v_scale=None, window=None, softcap=None, alibi_slopes=None,
                 block_n: int | None = None, num_warps: int | None = None, num_stages: int | None = None,
                 switches: DecodeSwitches | None = None, causal: bool = True):
    """Attention of the new query tokens of each sequence (one, or a few) over its KV cache, split along the cache
    length.

    Each program reads one piece ("split") of the cache and keeps a partial output and its log-sum-exp; a
    second small kernel merges the partials (the (m, l) merge of ``reference.merge_partials``). So a single
    token still spreads over every SM, where a FlashAttention forward would give it one program per
    (batch, head). A call that needs one split (a short cache, or many sequences and heads) writes its output
    directly: one launch. Several new tokens (speculative decoding's drafts to verify, a chunk of a long prompt)
    are extra rows of the same programs: every K/V tile is read once for all of a sequence's new tokens and the
    query heads that share its K/V head.

    Args:
        q: (B, H_q, D), one new token per sequence, or (B, H_q, n_new, D), n_new new tokens per sequence whose
            keys and values are already written at the end of the cache (positions seqlen - n_new .. seqlen - 1,
            as flash-attn's ``flash_attn_with_kvcache`` has them after appending); float16, bfloat16 (compute
            capability 8.0+) or float32;
            D any head dim from 8 to 256 (tiled at the next power of two >= 16, the rest masked: no copy of
            the cache; outside the range a ValueError, where flash-attn raises a RuntimeError).
        k_cache, v_cache: q's dtype, or both float8_e4m3fn (with ``k_scale`` and ``v_scale``; compute
            capability 8.9+ or the CPU interpreter), on q's device. Contiguous cache: (B, H_kv, N_max, D). Paged cache:
            (num_blocks, H_kv, page_size, D), pages shared by all sequences, with ``block_table``. H_q must
            be a multiple of H_kv (grouped-query attention: query head h reads K/V head h // (H_q // H_kv)).
        cache_seqlens: None (default: every sequence uses all N_max keys, or max_blocks * page_size), or the
            keys in use per sequence, the new tokens' own keys included (flash-attn's convention): a (B,) int32
            tensor on q's device, an int for every sequence, or a list or tuple of B ints (copied to q's device
            on each call). A sequence of length 0 gives o = 0. Each length must lie in 0 .. N_max
            (max_blocks * page_size for a paged cache) and, with n_new new tokens, be 0 or at least n_new, else a
            ValueError. Lengths given as a list
            are checked on every call; a tensor's values are read once, when a call first meets its shapes and
            options (reading a GPU tensor waits for the GPU, so not on every call), and on every call the
            kernel clamps each length to 0 .. N_max: a length changed in place past the cache reads the whole
            cache, never another sequence's rows.
        block_table: None (default: contiguous cache) or (B, max_blocks) int32, each sequence's pages in
            order. ``page_size`` must be a power of two >= 16 (vLLM's default page is 16 rows); the table is
            read once per page, by tiles that never straddle a page edge.
        scale: the factor on q.k; None (default) means 1/sqrt(D); inf and NaN are refused.
        num_splits: pieces of the cache length; None (default) gives about one program per SM.
        k_scale, v_scale: None (default, a 16-bit cache) or, for a float8_e4m3fn cache, (B, H_kv) float32: the
            true K of sequence b, KV head h is ``k_cache * k_scale[b, h]`` (for a paged cache, on every page of
            b's block-table row), V likewise; :func:`quantize_kv_cache` makes the cache and its scales. The
            kernel reads one byte per element and widens it to q's dtype in registers (exact); k_scale joins
            the score scale, v_scale multiplies the output.
        window: None (default) or (left, right), -1 = unbounded: a new token at position p (``seqlen - 1`` for
            the last) sees only keys p - left .. p (with ``causal``; ``right`` reaches no key after the last
            token); only the windows' keys are read, the splits share out the windows, not the cache.
        softcap: None (default) or a float > 0: scores s become softcap * tanh(s / softcap).
        alibi_slopes: None (default) or (H_q,) float32: head h adds -alibi_slopes[h] * (p - j) for the token at
            position p.
        block_n, num_warps, num_stages: override the launch, for tuning (``block_n`` a power of two >= 16);
            None (default) takes ``configs.decode_config``'s.
        switches: None (default: :func:`default_switches`, chosen by the GPU, the cache's dtype and V's layout) or
            a :class:`DecodeSwitches`, the split kernel's options beyond its tiles, for tuning; its None fields
            are chosen as by default.
        causal: True (default): bottom-right causal among the new tokens, new token t (0-based) of a sequence
            of length L sees keys 0 .. L - n_new + t, the last one the whole sequence (flash-attn's
            ``causal=True``, aligned to the bottom right); False: every new token sees all L keys (flash-attn's
            default). With one new token the two are the same.

    ``cache_leftpad`` (flash-attn's first real key of each sequence) is not taken: every sequence's keys start at
    row 0 of its cache row or first page. Under ``torch.compile`` the call is one custom op, ``flashcourse::decode``.

    Returns:
        o: q's shape, (B, H_q, D) or (B, H_q, n_new, D), and q's dtype.

    Example::

        k_cache, v_cache = (torch.randn(4, 2, 8192, 128, device="cuda", dtype=torch.float16) for _ in range(2))
        q = torch.randn(4, 16, 128, device="cuda", dtype=torch.float16)  # 8 query heads per K/V head
        lengths = torch.tensor([8192, 100, 5000, 1], device="cuda", dtype=torch.int32)
        o = flash_decode(q, k_cache, v_cache, cache_seqlens=lengths)  # (4, 16, 128)
        k8, v8, k_scale, v_scale = quantize_kv_cache(k_cache, v_cache)  # half the bytes to read (sm_89+)
        o8 = flash_decode(q, k8, v8, cache_seqlens=lengths, k_scale=k_scale, v_scale=v_scale)
        drafts = torch.randn(4, 16, 5, 128, device="cuda", dtype=torch.float16)  # 5 tokens, keys already cached
        o5 = flash_decode(drafts, k_cache, v_cache, cache_seqlens=[8192, 105, 5005, 5])  # (4, 16, 5, 128)
    """
    lengths = None
    if cache_seqlens is not None and not isinstance(cache_seqlens, torch.Tensor):
        # Known on the host (an int for all, or a list): checked on every call, at no GPU cost.
        lengths = host_lengths(cache_seqlens, q.shape[0] if isinstance(q, torch.Tensor) and q.dim() else 0)
        cache_seqlens = torch.tensor(lengths, dtype=torch.int32, device=getattr(q, "device", None))
    tensors = (q, k_cache, v_cache, cache_seqlens, block_table, k_scale, v_scale, alibi_slopes)
    options = (scale, num_splits, window, softcap, block_n, num_warps, num_stages, switches, causal)
    if torch.compiler.is_compiling():  # one op in the graph: tracing our Python (and the interpreter's) fails
        window_left, window_right = _window_pair(window)
        return torch.ops.flashcourse.decode(*tensors, scale, num_splits, window_left, window_right, softcap,
                                            block_n, num_warps, num_stages, causal, *_switch_fields(switches))
    return _decode(tensors, options, lengths)


def _capturing(q: torch.Tensor) -> bool:
    """Whether a CUDA graph is being captured on q's device: its calls run later, so no value can be read now."""
    return q.device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def _window_pair(window) -> tuple[int, int]:
    """A checked window as the op's two ints, (-1, -1) for none."""
    window = check_window(window)
    return window if window is not None else (-1, -1)


def _decode(tensors: tuple, options: tuple, lengths: list[int] | None = None) -> torch.Tensor:
    """The eager call: look up the plan for this call's description (its key: kept on a GPU, in the one plan
    cache ``plan.PLANS``), else check everything and make one; then launch it. The key holds everything the
    checks read but the values of the lengths and the pages: lengths given on the host are checked on every call
    (no GPU wait), a table's pages whenever the table is read (:func:`_first_call`)."""
    q = tensors[0]
    key = _launch_key(*tensors, options)
    try:
        plan = PLANS.plans.get(key) if key is not None else None
    except TypeError:  # an unhashable option (a window given as a list): no plan kept for this call
        key, plan = None, None
    one_token = isinstance(q, torch.Tensor) and q.dim() == 3
    if plan is None:
        if not one_token:
            return _first_call(key, tensors, options, lengths)
        # One new token: planned as the call with q (B, H_q, 1, D), a view. Its plan is also kept under the 3-D
        # call's key, so a repeat call launches it on q and an o of q's shape, with no view made either way (each
        # costs microseconds of host time a call): the kernels index row 0 of the new-token axis only.
        view = (q.unsqueeze(2), *tensors[1:])
        o = _decode(view, options, lengths).squeeze(2)
        planned = PLANS.plans.get(_launch_key(*view, options)) if key is not None else None
        if planned is not None:
            PLANS.put(key, planned)
        return o
    if lengths is not None:
        check_lengths(lengths, plan.n_max, plan.paged)
        check_new_tokens(lengths, 1 if one_token else q.shape[2])
    return plan.run(tensors)


def check_new_tokens(lengths: list[int], n_new: int) -> None:
    """Each length counts the new tokens, whose keys are already in the cache (flash-attn's ``cache_seqlens``):
    a sequence with keys holds at least ``n_new`` of them. A length of 0 (no keys at all) gives o = 0."""
    for b, n in enumerate(lengths):
        if 0 < n < n_new:
            raise ValueError(f"cache_seqlens[{b}] = {n} but q has n_new = {n_new} new tokens: a length counts the new "
                             "tokens too (their keys are written into the cache before the call, as in flash-attn's "
                             f"flash_attn_with_kvcache), so it must be at least {n_new} (or 0 for an empty sequence)")


def _check_options(num_splits, block_n) -> None:
    """The launch options a caller may force: whole numbers, in range."""
    for name, value, least in (("num_splits", num_splits, 1), ("block_n", block_n, 16)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < least):
            raise ValueError(f"{name} is {value!r}: expected an int >= {least} or None (chosen per call)")
    if block_n is not None and block_n & (block_n - 1):
        raise ValueError(f"block_n = {block_n}: expected a power of two >= 16 (tl.arange and tl.dot need it)")


def _first_call(key, tensors: tuple, options: tuple, lengths: list[int] | None) -> torch.Tensor:
    """Check a call's inputs, choose its launch and splits, launch it, and keep the plan under ``key``."""
    q, k_cache, v_cache, cache_seqlens, block_table, k_scale, v_scale, alibi_slopes = tensors
    scale, num_splits, window, softcap, block_n, num_warps, num_stages, switches, causal = options
    check_decode_inputs(q, k_cache, v_cache, cache_seqlens, block_table, k_scale, v_scale)
    window = check_window(window)
    softcap = check_softcap(softcap)
    check_alibi_slopes(alibi_slopes, q)
    _check_options(num_splits, block_n)
    if not isinstance(causal, bool):
        raise TypeError(f"causal is {causal!r}: expected True (each new token sees the cache up to its own "
                        "position, bottom-right aligned) or False (every new token sees the whole cache)")
    n_new, head_dim = q.shape[2], q.shape[3]
    scale = default_scale(head_dim, check_scale(scale))
    paged = block_table is not None
    n_max = block_table.shape[1] * k_cache.shape[2] if paged else k_cache.shape[2]
    if lengths is None and cache_seqlens is not None and not _capturing(q):
        lengths = cache_seqlens.tolist()  # read once here; the kernel clamps on every call
    if lengths is not None:
        check_lengths(lengths, n_max, paged)
    check_new_tokens(lengths if lengths is not None else [n_max] * q.shape[0], n_new)
    if paged and not _capturing(q):  # read once per plan, as the lengths
        check_pages(block_table, lengths, k_cache.shape[2], k_cache.shape[0])
    block_d = padded_head_dim(head_dim)
    props = configs.device_props(q.device)
    fp8_cache = k_cache.dtype == FP8
    switches = _resolve_switches(switches, default_switches(props, block_d, q.element_size(), fp8_cache=fp8_cache,
                                                            v_keys_adjacent=_is_keys_adjacent(v_cache)))
    candidates = configs.decode_candidates(props, block_d, q.element_size(), fp8_cache=fp8_cache)
    if block_n or num_warps or num_stages:  # an explicit launch (tuning): no other candidate
        first = candidates[0]
        candidates = (configs.KernelConfig(first.block_m, block_n or first.block_n, num_warps or first.num_warps,
                                           num_stages or first.num_stages),)
    window_left = window[0] if window is not None and window[0] >= 0 else None

    def make_and_run(cfg):
        plan = _Plan(cfg, tensors, n_max, scale, num_splits, window_left, softcap, props, key, causal, switches)
        return plan, plan.run(tensors)

    plan, o = launch_fitting(("decode", props, block_d, q.dtype, k_cache.dtype, switches), candidates, make_and_run,
                             f"flash_decode at head dim {head_dim}")
    if key is not None:
        PLANS.put(key, plan)
    return o


class _Plan:
    """What a decode call's layouts and options decide, worked out once: the launch, the splits, the grids and
    every kernel argument that is not one of the call's tensors. ``run`` then allocates the outputs and
    launches: the split kernel alone when there is one split (it writes o), else the split kernel and the
    combine kernel."""

    __slots__ = ("key", "n_max", "paged", "empty", "num_splits", "part_shape", "split_grid", "split_args",
                 "combine_grid", "combine_args", "launches")

    def __init__(self, cfg: configs.KernelConfig, tensors: tuple, n_max: int, scale: float, num_splits,
                 window_left, softcap, props: configs.DeviceProps, key, causal: bool, switches: DecodeSwitches):
        q, k_cache, v_cache, cache_seqlens, block_table, k_scale, _, alibi_slopes = tensors
        batch, h_q, n_new, head_dim = q.shape
        h_kv = k_cache.shape[1]
        block_d = padded_head_dim(head_dim)
        block_n = cfg.block_n
        self.key, self.n_max, self.paged = key, n_max, block_table is not None
        self.empty = batch * h_q * n_new == 0
        span = n_max  # keys the splits cover at most
        if window_left is not None:  # the windows' keys; paged tiles start on a BLOCK_N boundary, up to
            span = min(n_max, window_left + n_new - 1 + (block_n if self.paged else 1))  # block_n - 1 keys before
        if num_splits is None:  # about programs_per_sm programs an SM (decode_num_splits aims at one)
            num_splits = configs.decode_num_splits(replace(props, num_sms=props.num_sms * switches.programs_per_sm),
                                                   batch * h_kv, span, block_n)
        num_splits = max(1, min(int(num_splits), max(1, triton.cdiv(span, block_n))))
        split_len = triton.cdiv(triton.cdiv(max(span, 1), num_splits), block_n) * block_n
        self.num_splits = num_splits
        self.part_shape = (batch, h_q, n_new, num_splits, block_d)  # O_PART; LSE_PART is its first four dims
        o = torch.empty_like(q)  # as run() allocates it: its strides are q's layout's
        rows = h_q // h_kv * n_new  # a program's query rows: the group's heads times the new tokens, in tiles of
        block_rows = max(16, min(triton.next_power_of_2(rows), max(64, triton.next_power_of_2(h_q // h_kv))))
        self.split_grid = (num_splits, batch * h_kv, triton.cdiv(rows, block_rows))  # at most 64 (or one group)
        self.split_args = dict(
            qk_scale=scale * LOG2E,
            **strides(q, "q"), **strides(o, "o"), **strides(k_cache, "k"),
            **strides(v_cache, "v"),
            stride_bt_b=block_table.stride(0) if self.paged else 0,
            stride_bt_p=block_table.stride(1) if self.paged else 0,
            H_KV=h_kv, N_MAX=n_max, NUM_PAGES=k_cache.shape[0] if self.paged else 1, N_NEW=n_new,
            SPLIT_LEN=split_len, NUM_SPLITS=num_splits,
            WINDOW_LEFT=window_left or 0, softcap2=(softcap or 1.0) * LOG2E,
            GROUP=h_q // h_kv, BLOCK_G=block_rows, HEAD_DIM=head_dim,
            BLOCK_D=block_d, BLOCK_N=block_n, PAGED=self.paged, PAGE_SIZE=k_cache.shape[2] if self.paged else 1,
            HAS_SEQLENS=cache_seqlens is not None, HAS_WINDOW=window_left is not None,
            HAS_SOFTCAP=softcap is not None, HAS_ALIBI=alibi_slopes is not None,
            DOT_PRECISION=dot_precision(q.dtype), KV_FP8=k_scale is not None, DIRECT=num_splits == 1,
            MASK_TAIL_ONLY=switches.mask_tail_only, ROW_MASKS=n_new > 1, CAUSAL=causal and n_new > 1,
            num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        )
        self.combine_grid = (batch * h_q * n_new,)
        self.combine_args = dict(**strides(o, "o"), H_Q=h_q, N_NEW=n_new, NUM_SPLITS=num_splits,
                                 HEAD_DIM=head_dim, BLOCK_D=block_d,
                                 BLOCK_S=max(2, triton.next_power_of_2(num_splits)))
        self.launches = None  # after the first run on a GPU: the prepared split (and combine) launches

    def run(self, tensors: tuple) -> torch.Tensor:
        q, k_cache, v_cache, cache_seqlens, block_table, k_scale, v_scale, alibi_slopes = tensors
        o = torch.empty_like(q)
        if self.empty:
            return o
        direct = self.num_splits == 1
        o_part = lse_part = o  # one split writes o itself: the partials' pointers are never read
        if not direct:
            o_part = q.new_empty(self.part_shape, dtype=torch.float32)
            lse_part = q.new_empty(self.part_shape[:4], dtype=torch.float32)
        if k_scale is not None:  # indexed b * H_kv + h in the kernel
            k_scale, v_scale = k_scale.contiguous(), v_scale.contiguous()
        # In _NAMES' order; q stands in for an absent tensor (a pointer the kernel never reads).
        launch = (q, k_cache, v_cache, q if block_table is None else block_table,
                  q if cache_seqlens is None else cache_seqlens,
                  q if alibi_slopes is None else alibi_slopes.contiguous(),
                  q if k_scale is None else k_scale, q if v_scale is None else v_scale, o_part, lse_part, o)
        if self.launches is not None:  # a repeat call: no key to hash again, no argument to bind
            for prepared in self.launches:
                prepared(launch)
            return o
        self._launch(_decode_split_kernel, self.split_grid, self.split_args, _NAMES, launch, self.key)
        if not direct:
            self._launch(_decode_combine_kernel, self.combine_grid, self.combine_args, _COMBINE_NAMES, launch,
                         (self.key, "combine"))
        prepared = (_LAUNCHES.get(self.key),) + (() if direct else (_LAUNCHES.get((self.key, "combine")),))
        if None not in prepared:  # remembered (a GPU whose Triton shows the convention, the cache on)
            self.launches = prepared
        return o

    @staticmethod
    def _launch(kernel, grid, args: dict, names: tuple, launch: tuple, key) -> None:
        """A full launch (Triton binds every argument), remembered for the next call when ``key`` is set."""
        kwargs = dict(args, **{name: launch[_NAMES.index(name)] for name in names})
        compiled = kernel[grid](**kwargs)
        _LAUNCHES.remember(key, kernel, compiled, grid, kwargs, _NAMES)


# Plans live in the one plan cache, plan.PLANS, under keys that start with "decode"; their launches are cached
# apart (launch.py says why). _NAMES are the per-call tensors' argument names, in the order _Plan.run passes them:
# the split kernel's first parameters, so that a prepared launch picks them in one step (launch._Launch).
_LAUNCHES = LaunchCache()
_NAMES = ("Q", "K", "V", "BLOCK_TABLE", "SEQLENS", "ALIBI_SLOPES", "K_SCALE", "V_SCALE", "O_PART", "LSE_PART",
          "OUT")
_COMBINE_NAMES = ("O_PART", "LSE_PART", "OUT")


def keyable_options(options: tuple) -> bool:
    """Whether a call's options can stand in its plan's key: True == 1 == 1.0 as keys, so a bool where a number goes
    (refused by the checks) or a window of floats would find the plan of a valid call and skip the check that
    refuses it. Such calls keep no plan and are checked in full."""
    scale, num_splits, window, softcap = options[:4]
    if scale.__class__ is bool or num_splits.__class__ is bool or softcap.__class__ is bool:
        return False
    return window is None or (window.__class__ is tuple and len(window) == 2 and window[0].__class__ is int
                              and window[1].__class__ is int)


def _launch_key(q, k_cache, v_cache, cache_seqlens, block_table, k_scale, v_scale, alibi_slopes, options):
    """The plan's key (None on the interpreter, whose calls are not kept): every tensor's layout (shape, strides,
    dtype, device, 16-byte alignment: what Triton specialises on), None for an absent one, and every option. An
    argument that is not a tensor gives None too: the checks then say what was expected. Written out flat, as
    ``plan.layout_key``: it is built on every call (the device as ``get_device()``, an int: only CUDA calls are
    kept, so no other device can share one)."""
    if not isinstance(q, torch.Tensor) or q.device.type != "cuda" or not keyable_options(options):
        return None
    try:
        key = ("decode", q.shape, q.stride(), k_cache.shape, k_cache.stride(), v_cache.shape, v_cache.stride(), q.dtype,
               k_cache.dtype, v_cache.dtype, q.get_device(), k_cache.get_device(), v_cache.get_device(),
               q.data_ptr() % 16 == 0, k_cache.data_ptr() % 16 == 0, v_cache.data_ptr() % 16 == 0, options)
        if (cache_seqlens is None and block_table is None and k_scale is None and v_scale is None
                and alibi_slopes is None):
            return key
        return key + tuple(t if t is None else (t.shape, t.stride(), t.dtype, t.get_device(), t.data_ptr() % 16 == 0)
                           for t in (cache_seqlens, block_table, k_scale, v_scale, alibi_slopes))
    except AttributeError:
        return None


# ------------------------------------------------------------------------------------------ torch.compile
# ruff: noqa: UP045 (the op's schema is read from its annotations; typing.Optional is the spelling every torch
# version's schema inference knows)
@torch.library.custom_op("flashcourse::decode", mutates_args=())
def _decode_op(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, cache_seqlens: Optional[torch.Tensor],
               block_table: Optional[torch.Tensor], k_scale: Optional[torch.Tensor], v_scale: Optional[torch.Tensor],
               alibi_slopes: Optional[torch.Tensor], scale: Optional[float], num_splits: Optional[int],
               window_left: int, window_right: int, softcap: Optional[float], block_n: Optional[int],
               num_warps: Optional[int], num_stages: Optional[int], causal: bool = True,
               programs_per_sm: Optional[int] = None, mask_tail_only: Optional[bool] = None) -> torch.Tensor:
    """``flash_decode`` as one op of a compiled graph; the window as two ints, (-1, -1) for none; the switches as
    their two fields (None: chosen per call)."""
    window = None if (window_left, window_right) == (-1, -1) else (window_left, window_right)
    tensors = (q, k_cache, v_cache, cache_seqlens, block_table, k_scale, v_scale, alibi_slopes)
    switches = (None if (programs_per_sm, mask_tail_only) == (None, None)
                else DecodeSwitches(programs_per_sm, mask_tail_only))
    return _decode(tensors, (scale, num_splits, window, softcap, block_n, num_warps, num_stages, switches, causal))


def _switch_fields(switches) -> tuple:
    """The op's two switch arguments for ``switches``: (None, None) for None."""
    switches = _check_switches(switches)
    return tuple(switches) if switches is not None else (None, None)


@_decode_op.register_fake
def _decode_op_fake(q, k_cache, v_cache, cache_seqlens, block_table, k_scale, v_scale, alibi_slopes, scale,
                    num_splits, window_left, window_right, softcap, block_n, num_warps, num_stages,
                    causal=True, programs_per_sm=None, mask_tail_only=None):
    # While tracing: the compiled call refuses what the eager one does, but for the lengths' values (no values
    # exist here; the kernel clamps them).
    check_decode_inputs(q, k_cache, v_cache, cache_seqlens, block_table, k_scale, v_scale)
    check_softcap(softcap)
    check_alibi_slopes(alibi_slopes, q)
    check_scale(scale)
    _check_options(num_splits, block_n)
    return torch.empty_like(q)


# ------------------------------------------------------------------------------------------ FP8 cache
class Fp8KVCache(NamedTuple):
    """A float8_e4m3fn KV cache and its (B, H_kv) float32 scales: ``k, v, k_scale, v_scale = quantize_kv_cache(...)``
    unpacks it, ``flash_decode(q, x.k, x.v, k_scale=x.k_scale, v_scale=x.v_scale)`` reads it."""

    k: torch.Tensor
    v: torch.Tensor
    k_scale: torch.Tensor
    v_scale: torch.Tensor


def _amax_scale(amax: torch.Tensor) -> torch.Tensor:
    """amax / 448: the largest magnitude lands on e4m3's largest value; an all-zero slice takes 1 (any works)."""
    return torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))


def _to_e4m3(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x (P, H, N, D) / scale (P, H), rounded to the nearest float8_e4m3fn (clamped: no value overflows to NaN)."""
    return (x.float() / scale[:, :, None, None]).clamp(-E4M3_MAX, E4M3_MAX).to(FP8)


def _sequence_amax(x: torch.Tensor, block_table: torch.Tensor, cache_seqlens) -> tuple[torch.Tensor, torch.Tensor]:
    """Largest |x| per (sequence, KV head) over the rows in use on the pages its block-table row lists (B, H_kv),
    and per page (num_pages, H_kv), made equal wherever a page is shared: a page has one scale, so every sequence
    that reads it (a shared prompt prefix) must use the same one. Rows past a sequence's length count for no
    one, on its last page as on a contiguous cache; a page no sequence lists keeps the amax of all its rows."""
    page_size = x.shape[2]
    row_amax = x.float().abs().amax(dim=3)  # (num_pages, H_kv, page_size)
    batch, max_blocks = block_table.shape
    lengths = torch.full((batch,), max_blocks * page_size, device=x.device)
    if cache_seqlens is not None:
        lengths = cache_seqlens.to(x.device).long().clamp(0, max_blocks * page_size)
    used = (lengths + page_size - 1) // page_size
    rows, cols = (torch.arange(max_blocks, device=x.device)[None, :] < used[:, None]).nonzero(as_tuple=True)
    pages = block_table[rows, cols].long()
    rows_in_use = (lengths[rows] - cols * page_size).clamp(max=page_size)  # < page_size on a last page only
    in_use = torch.arange(page_size, device=x.device)[None, None, :] < rows_in_use[:, None, None]
    pair_amax = torch.where(in_use, row_amax[pages], 0.0).amax(dim=2)  # (listed pages, H_kv)

    def amax_into(dest, index, src):  # dest[index[i]] = max(dest[index[i]], src[i]) over every (i, KV head)
        return dest.scatter_reduce(0, index[:, None].expand_as(src), src, "amax")

    listed = torch.zeros(x.shape[0], dtype=torch.bool, device=x.device)
    listed[pages] = True
    own = torch.where(listed[:, None], amax_into(torch.zeros_like(row_amax[:, :, 0]), pages, pair_amax),
                      row_amax.amax(dim=2))  # a listed page: its rows in use; any other: all its rows
    seq = amax_into(own.new_zeros(batch, own.shape[1]), rows, pair_amax)
    page = own
    for _ in range(batch):  # spread maxima across shared pages, one hop a step, until every sharing group agrees
        page = amax_into(own, pages, seq[rows])
        spread = amax_into(seq, rows, page[pages])
        if torch.equal(spread, seq):
            break
        seq = spread
    return seq, page


def quantize_kv_cache(k_cache, v_cache, *, block_table=None, cache_seqlens=None) -> Fp8KVCache:
    """Quantise a KV cache to float8_e4m3fn with one scale per (sequence, KV head), for :func:`flash_decode`.

    Each scale is amax / 448 over everything that sequence's head stores, so the largest value lands on e4m3's
    largest and the rest keep 3 mantissa bits (a relative rounding error of at most 2^-4) down to 2^-6 of the
    scale. Why this granularity: a decode kernel program reads one (sequence, KV head), so its two scales are two
    scalar loads per program, folded into the score scale (K) and the output (V): nothing per key. e4m3 is
    floating point, so values within 448 / 2^-6 of their head's largest keep all 3 mantissa bits whatever the
    outliers; finer scales (per page or per token) only help ranges wider than that, at the cost of a scale read
    per page or per row inside the loop (and a scale column beside the block table). Coarser ones (per head or
    per tensor, what vLLM uses with a scale calibrated offline) let a serving engine write new tokens without
    ever rescaling old ones: an amax taken after the fact, as here, suits a cache quantised once after prefill; a
    growing cache whose new token exceeds the amax must clamp it or requantise.

    Args:
        k_cache, v_cache: float16, bfloat16 or float32, one shape: (B, H_kv, N_max, D) contiguous, or
            (num_blocks, H_kv, page_size, D) pages with ``block_table``.
        block_table: None (contiguous) or (B, max_blocks) int32: sequence b's scale comes from the pages of its
            row (the first ceil(cache_seqlens[b] / page_size) of them); a page listed by several sequences gives
            them all one scale, the largest their rows in use need. Pages no sequence lists keep a scale of
            their own.
        cache_seqlens: None (every row, or every listed page, in use) or (B,) int32, as :func:`flash_decode`
            takes it. One rule for both layouts: rows past a sequence's length (stale or never written) do not
            count towards its scale, whether they lie in a contiguous cache or on a paged sequence's last
            page; they are quantised with the others, clamped to e4m3's range (never NaN), and the kernel
            never reads them.

    Returns:
        :class:`Fp8KVCache` ``(k, v, k_scale, v_scale)``: the cache in float8_e4m3fn, its shape and layout, and
        (B, H_kv) float32 scales (true K = ``k * k_scale[b, h]``).

    Example::

        k8, v8, k_scale, v_scale = quantize_kv_cache(k_cache, v_cache)
        o = flash_decode(q, k8, v8, k_scale=k_scale, v_scale=v_scale)  # half the bytes of a float16 cache
    """
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4 or not t.is_floating_point() or t.dtype == FP8:
            got = f"{tuple(t.shape)} {t.dtype}" if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"{name} is {got}: expected a 4-dim float16, bfloat16 or float32 cache")
    if k_cache.shape != v_cache.shape:
        raise ValueError(f"k_cache {tuple(k_cache.shape)} and v_cache {tuple(v_cache.shape)}: expected one shape")
    if block_table is None:
        in_use = torch.ones(k_cache.shape[0], 1, k_cache.shape[2], 1, dtype=torch.bool, device=k_cache.device)
        if cache_seqlens is not None:  # stale rows past a sequence's length must not set its scale
            if tuple(cache_seqlens.shape) != (k_cache.shape[0],):
                raise ValueError(f"cache_seqlens has shape {tuple(cache_seqlens.shape)}: expected "
                                 f"({k_cache.shape[0]},), one length per sequence")
            rows = torch.arange(k_cache.shape[2], device=k_cache.device)
            in_use = (rows[None, :] < cache_seqlens.to(k_cache.device)[:, None])[:, None, :, None]
        quantised = [(_to_e4m3(x, s), s) for x in (k_cache, v_cache)
                     for s in [_amax_scale(torch.where(in_use, x.float().abs(), 0.0).amax(dim=(2, 3)))]]
    else:
        if block_table.dim() != 2 or block_table.dtype != torch.int32:
            raise ValueError(f"block_table has shape {tuple(block_table.shape)} and dtype {block_table.dtype}: "
                             "expected (B, max_blocks) int32")
        if cache_seqlens is not None and tuple(cache_seqlens.shape) != (block_table.shape[0],):
            raise ValueError(f"cache_seqlens has shape {tuple(cache_seqlens.shape)}: expected "
                             f"({block_table.shape[0]},), one length per block-table row")
        quantised = []
        for x in (k_cache, v_cache):
            seq, page = _sequence_amax(x, block_table, cache_seqlens)
            quantised.append((_to_e4m3(x, _amax_scale(page)), _amax_scale(seq)))
    (k8, k_scale), (v8, v_scale) = quantised
    return Fp8KVCache(k8, v8, k_scale, v_scale)
