"""Split-KV decoding (Flash-Decoding): one new query token per sequence against a long KV cache.

A decode step has one query row per head, so a FlashAttention launch would have B * H programs: far too few
to fill a GPU at batch 1. Flash-Decoding also splits the KV length: program (split s, batch b, KV head h)
attends the query heads of h's group to keys [s * split_len, (s + 1) * split_len) and writes a partial output,
normalised over its own keys, with its logsumexp. A second kernel combines the splits of each row with the
merge rule of lesson 02 (``reference.merge_partials``), applied to all splits at once:
    lse = log(sum_s exp(lse_s)),    o = sum_s exp(lse_s - lse) * o_s;   empty splits have lse_s = -inf.
With one split there is nothing to merge: the split kernel writes o itself, and the call is one launch.

This module holds the kernels and their launches. The host path is the attention path's: ``flash_decode`` is
checked and described by the front door (``call.py``), its plan (``plan.DecodePlan``: launch, splits, the kernels'
arguments) is made once and kept in the one plan cache, and a repeat call on a GPU only allocates its output and
launches, as FlashInfer's ``plan`` / ``run`` split. Under ``torch.compile`` the call is one custom op,
``flashcourse::decode`` (``ops.py``).

Grouped-query attention: the H_q / H_kv query heads that share a KV head are one program's rows, so each K/V
tile is read from memory once for the whole group (the bytes that bound decoding). A sliding window reads
only its keys: the splits cover [seqlen - 1 - left, seqlen), not the whole cache; so does a left-padded
sequence (flash-attn's ``cache_leftpad``): they cover [first real key, seqlen). Paged cache: K/V live in
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

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from . import configs
from .common import (
    LEAST_SCORE_FACTOR,
    LOG2E_IN_KERNEL,
    NO_KEY_YET,
    modified_scores,
    normalise_rows,
    online_softmax_update,
)
from .launch import LaunchCache

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


def resolve_switches(switches: DecodeSwitches | None, default: DecodeSwitches) -> DecodeSwitches:
    """``switches`` (None, or a checked DecodeSwitches whose None fields are left to us), completed from
    ``default``."""
    if switches is None:
        return default
    return DecodeSwitches(*(chosen if mine is None else mine for mine, chosen in zip(switches, default, strict=True)))


def is_keys_adjacent(v_cache: torch.Tensor) -> bool:
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
    Q, K, V, BLOCK_TABLE, SEQLENS, K_SCALE, V_SCALE, O_PART, LSE_PART, OUT, ALIBI_SLOPES, LEFTPAD, qk_scale,
    stride_qb, stride_qh, stride_qn, stride_qd, stride_ob, stride_oh, stride_on, stride_od,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_bt_b, stride_bt_p,
    H_KV, N_MAX, NUM_PAGES, N_NEW, SPLIT_LEN, NUM_SPLITS, WINDOW_LEFT, softcap2,
    GROUP: tl.constexpr, BLOCK_G: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr, PAGED: tl.constexpr, PAGE_SIZE: tl.constexpr, HAS_SEQLENS: tl.constexpr,
    HAS_WINDOW: tl.constexpr, HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr, DOT_PRECISION: tl.constexpr,
    KV_FP8: tl.constexpr, DIRECT: tl.constexpr, MASK_TAIL_ONLY: tl.constexpr, ROW_MASKS: tl.constexpr,
    CAUSAL: tl.constexpr, HAS_LEFTPAD: tl.constexpr,
):
    pid_split = tl.program_id(0)
    pid_bh = tl.program_id(1)  # over B * H_kv
    pid_rows = tl.program_id(2)  # over tiles of BLOCK_G of the GROUP * N_NEW query rows of this KV head
    b = (pid_bh // H_KV).to(tl.int64)
    h_kv = (pid_bh % H_KV).to(tl.int64)
    if KV_FP8:  # true K = k8 * k_scale: one factor on every score of this (batch, KV head), folded in once.
        # The running max takes max(qk) * qk_scale for the largest scaled score, true only for qk_scale > 0, so
        # the scale's magnitude goes here (a zero one floored: LEAST_SCORE_FACTOR; NaN stays NaN) and a negative
        # scale's sign to q below (a sign flip is exact)
        k_scale = tl.load(K_SCALE + pid_bh)
        qk_scale = tl.maximum(qk_scale * tl.abs(k_scale), LEAST_SCORE_FACTOR, propagate_nan=tl.PropagateNan.ALL)
        q_sign = tl.where(k_scale < 0, -1.0, 1.0)
    seqlen = N_MAX
    if HAS_SEQLENS:  # clamped to the cache: a length past it never reads another sequence's rows or pages
        seqlen = tl.minimum(tl.maximum(tl.load(SEQLENS + b), 0), N_MAX)
    # The new tokens sit at positions seqlen - N_NEW .. seqlen - 1 (the cache holds their keys too); a window
    # reaches back WINDOW_LEFT keys from each, so the first one's window starts the keys any row reads. Keys before
    # the sequence's left padding (flash-attn's cache_leftpad: its first real key) are never read either; clamped
    # to 0 .. seqlen, so a value changed in place after the plan checked it never reads outside the sequence.
    leftpad = 0
    if HAS_LEFTPAD:
        leftpad = tl.minimum(tl.maximum(tl.load(LEFTPAD + b), 0), seqlen)
    first = leftpad
    if HAS_WINDOW:
        first = tl.maximum(seqlen - N_NEW - WINDOW_LEFT, first)
    start = first + pid_split * SPLIT_LEN  # the splits share out keys first .. seqlen - 1: none is all padding
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
    # stored keys-adjacent to one element, and costs selects on every tile. A paged window's (or left padding's)
    # first tile may start before the window (the padding's end), so there every tile keeps its masks; so do
    # several new tokens, each row with its own bounds (ROW_MASKS).
    STARTS_INSIDE_A_TILE: tl.constexpr = PAGED and (HAS_WINDOW or HAS_LEFTPAD)
    TAIL_APART: tl.constexpr = MASK_TAIL_ONLY and not STARTS_INSIDE_A_TILE and not ROW_MASKS
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
                if STARTS_INSIDE_A_TILE:  # the first tile may begin before the window or inside the padding
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


# Decode's plans live in the one plan cache, plan.PLANS (plan.DecodePlan); their launches are cached apart
# (launch.py says why). NAMES are the per-call tensors' argument names, in the order DecodePlan.run passes them:
# the split kernel's first parameters, so that a prepared launch picks them in one step (launch._Launch).
_LAUNCHES = LaunchCache()
NAMES = ("Q", "K", "V", "BLOCK_TABLE", "SEQLENS", "ALIBI_SLOPES", "K_SCALE", "V_SCALE", "O_PART", "LSE_PART", "OUT",
         "LEFTPAD")
_COMBINE_NAMES = ("O_PART", "LSE_PART", "OUT")


def launch(split: tuple, combine: tuple | None, tensors: tuple, key) -> tuple:
    """A decode call's full launches (Triton binds every argument) on ``tensors`` (in NAMES' order): the split
    kernel, then the combine kernel unless ``combine`` is None (one split writes o itself); ``split`` and
    ``combine`` are each (grid, the arguments that are not tensors). Each launch is remembered under ``key`` (the
    combine kernel's under (key, "combine")) when ``key`` is set. Returns the prepared launches, None in place of
    one not remembered (the interpreter, a Triton without the convention, the cache off)."""
    _launch(_decode_split_kernel, *split, NAMES, tensors, key)
    if combine is None:
        return (_LAUNCHES.get(key),)
    _launch(_decode_combine_kernel, *combine, _COMBINE_NAMES, tensors, (key, "combine"))
    return _LAUNCHES.get(key), _LAUNCHES.get((key, "combine"))


def _launch(kernel, grid, args: dict, names: tuple, tensors: tuple, key) -> None:
    kwargs = dict(args, **{name: tensors[NAMES.index(name)] for name in names})
    compiled = kernel[grid](**kwargs)
    _LAUNCHES.remember(key, kernel, compiled, grid, kwargs, NAMES)


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


def _sequence_amax(x: torch.Tensor, block_table: torch.Tensor, cache_seqlens,
                   cache_leftpad) -> tuple[torch.Tensor, torch.Tensor]:
    """Largest |x| per (sequence, KV head) over the rows in use on the pages its block-table row lists (B, H_kv),
    and per page (num_pages, H_kv), made equal wherever a page is shared: a page has one scale, so every sequence
    that reads it (a shared prompt prefix) must use the same one. Rows past a sequence's length or before its
    left padding's end count for no one, on its pages as on a contiguous cache (pages wholly inside the padding
    are not looked up: their entries may be -1); a page no sequence lists keeps the amax of all its rows."""
    page_size = x.shape[2]
    row_amax = x.float().abs().amax(dim=3)  # (num_pages, H_kv, page_size)
    batch, max_blocks = block_table.shape
    lengths = torch.full((batch,), max_blocks * page_size, device=x.device)
    if cache_seqlens is not None:
        lengths = cache_seqlens.to(x.device).long().clamp(0, max_blocks * page_size)
    pads = torch.zeros_like(lengths) if cache_leftpad is None else cache_leftpad.to(x.device).long()
    used = (lengths + page_size - 1) // page_size
    slots = torch.arange(max_blocks, device=x.device)[None, :]
    rows, cols = ((slots < used[:, None]) & (slots >= (pads // page_size)[:, None])).nonzero(as_tuple=True)
    pages = block_table[rows, cols].long()
    position = cols[:, None] * page_size + torch.arange(page_size, device=x.device)[None, :]  # (listed pages, rows)
    in_use = ((position < lengths[rows, None]) & (position >= pads[rows, None]))[:, None, :]
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


def quantize_cache(k_cache, v_cache, block_table, cache_seqlens, cache_leftpad) -> Fp8KVCache:
    """``kernels.quantize_kv_cache`` on checked arguments (``_checks.check_quantize_inputs``; the lengths a tensor):
    one scale per (sequence, KV head), amax / 448 over the rows that sequence uses. A non-finite value among them
    would make that scale inf or NaN (the whole head then quantises to 0 or NaN): a ValueError names it."""
    if block_table is None:
        in_use = torch.ones(k_cache.shape[0], 1, k_cache.shape[2], 1, dtype=torch.bool, device=k_cache.device)
        rows = torch.arange(k_cache.shape[2], device=k_cache.device)
        if cache_seqlens is not None:  # stale rows past a sequence's length must not set its scale
            in_use = (rows[None, :] < cache_seqlens.to(k_cache.device)[:, None])[:, None, :, None]
        if cache_leftpad is not None:  # nor may the padding before its first real key
            in_use = in_use & (rows[None, :] >= cache_leftpad.to(k_cache.device)[:, None])[:, None, :, None]
        amaxes = [(x, torch.where(in_use, x.float().abs(), 0.0).amax(dim=(2, 3))) for x in (k_cache, v_cache)]
        quantised = [(_to_e4m3(x, _amax_scale(amax)), amax) for x, amax in amaxes]
    else:
        quantised = []
        for x in (k_cache, v_cache):
            seq, page = _sequence_amax(x, block_table, cache_seqlens, cache_leftpad)
            quantised.append((_to_e4m3(x, _amax_scale(page)), seq))
    for name, (_, amax) in zip(("k_cache", "v_cache"), quantised, strict=True):
        bad = (~torch.isfinite(amax)).nonzero()
        if len(bad):
            b, h = bad[0].tolist()
            raise ValueError(f"{name} holds an inf or NaN in a row sequence {b} uses (KV head {h}): its scale, amax / "
                             "448, would not be finite and the whole head would quantise to 0 or NaN; fix the "
                             "cache, or leave the row out with cache_seqlens or cache_leftpad")
    (k8, k_amax), (v8, v_amax) = quantised
    return Fp8KVCache(k8, v8, _amax_scale(k_amax), _amax_scale(v_amax))
