"""Backward b6: FlashAttention-3's backward on Hopper (sm_90), written in Gluon, in stages.

With S = scale * Q K^T, P = exp(S - lse), Delta = rowsum(dO * O) (the preprocess, as b1):
    dV = P^T dO      dP = dO V^T      dS = P * (dP - Delta)      dK = scale * dS^T Q      dQ = scale * dS K
A program owns a tile of keys and keeps its dK and dV in the registers of its consumer warpgroup(s) (as b1's
dK/dV kernel), and walks every query tile that sees those keys. Each step runs five wgmma products, all in the
transposed orientation (keys are the rows, as b1): S^T = K Q^T, dP^T = V dO^T, dV += P^T dO, dK += dS^T Q and the
program's share of dQ, dS K. dS^T goes to shared memory once; dK's product reads it from there, and so does
the dQ share, in 64-column pieces: dS K[:, c:c+64] with 64-row query tiles, dQ^T = K[:, c:c+64]^T dS^T with 32.
The dQ shares are summed in a float32 buffer (B*H, N_q rounded up to 64, D) by relaxed atomic adds (b4's way:
Triton 3.6's Gluon has no TMA reduce-add; 3.9's ``tma.async_atomic_add`` would be b5's), and a small kernel
scales it into dQ's dtype. FA3 (Shah et al. 2024; ``hopper/mainloop_bwd_sm90_tma_gmma_ws.hpp``) is the design.
What a step reads and writes in global memory for its (batch, head) travels as one ``_Head``, and b6b / b6c's
(Q, dO) ring as one ``_Ring``: Gluon ``aggregate`` classes, named bundles that the compiler flattens back into
the values they hold, so that no call passes two dozen arguments in an order that must be right.

- b6a ``_b6a_kernel``: one consumer warpgroup (4 warps) owns 64 keys; no specialization. Q and dO tiles (64
      query rows at D = 64, 32 at D = 128: ``BLOCK_M``) come in by TMA into two buffers (tile i+1 is loaded
      while tile i is computed); lse and Delta by plain loads. Expected: 0.8-1.0x b1 (b1's dK/dV kernel has 8
      warps and twice the keys a program and hides latency better; b6a saves b1's second pass, the dQ kernel's
      recomputation of Q K^T and dO V^T, at the price of an atomic add of a BLOCK_M x D tile per step).
- b6b ``_b6_ws_kernel`` (CONSUMERS=1): a producer warp loads K and V once and then every (Q, dO) tile into a
      ring of STAGES shared slots guarded by ready / empty mbarriers; the consumer warpgroup only computes
      (``gl.warp_specialize``): the producer's warpgroup drops to 24 registers a thread, the consumer rises to
      232, and the launch is capped at 128 (maxnreg, as v8b) so that two programs share an SM as in b6a (without
      the cap, 255 a thread for 8 padded warps: one program an SM). Expected: +0-10% over b6a.
- b6c ``_b6_ws_kernel`` (CONSUMERS=2): two consumer warpgroups own 64 keys each of a 128-key tile and share the
      ring (each (Q, dO) tile read from L2 serves 128 keys, as FA3's 2 x 64-row split of kBlockN = 128), with
      setmaxnreg budgets 240 / 24 (FA3's 3 warpgroups, one program per SM). Each warpgroup adds its own
      BLOCK_M x D share of dQ (in FA3 the two compute different columns of one share from both halves of dS in
      shared memory: half the atomic traffic, at the price of a barrier between them; a next step). Expected:
      +10-25% over b6b; the target is >= 0.9x cuDNN.

Layout contract (as ``fa3.py``): q, k, v, o, do (B, H, N, D) contiguous, one dtype (float16 / bfloat16), D 64
or 128, no GQA; lse (B, H, N_q) float32 natural log as v7 / v8 write it; ``causal=True`` top-left. Tensors are
seen as 2-D (B*H*N, D) for TMA: rows past a head's end belong to the next head and are masked (P = 0, so they
add nothing to dK, dV, and a zero to dQ's padded rows).

Not dispatched by default: nothing here has run on a GPU (``TESTED_TRITON`` lists the Tritons it was compiled
with for sm_90, ``scripts/fa3_compile.py --backward``; ``benchmarks/gpu_fa3_backward.py`` is the first GPU run).
``flashcourse.kernels`` does not import this module.
"""

# No ``from __future__ import annotations``: Triton 3.6's ``aggregate`` checks each field against its annotation
# as written, and a string annotation is no type.
import math
from dataclasses import dataclass

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from .fa3 import _LOG2E, _mma_layout, _smem_layout, _tma_load, aggregate, tensor_descriptor_signature, triton_cdiv

TESTED_TRITON = ("3.6",)  # compiled for sm_90 (scripts/fa3_compile.py --backward); run on a GPU: none yet

ROWS = 64  # keys a consumer warpgroup owns (one wgmma M = 64 a warpgroup)
# Query rows of a (Q, dO) tile per head dim. At D = 128 a warpgroup's dK and dV take 128 registers a thread;
# with 64-row query tiles S^T, dP^T and their row statistics beside them spill (Triton 3.6: 184-576 B a
# thread), with 32-row tiles they fit (Triton 3.6: b6a none, b6b 0-16 B under its 232 budget, b6c 8 B under
# 240; none under 3.9). The dQ share of a 32-row tile is computed transposed (dQ^T = K^T dS^T: wgmma's M is 64
# at least).
BLOCK_M = {64: 64, 128: 32}
_LOG2E_C = gl.constexpr(_LOG2E)


# ------------------------------------------------------------------------------------------ shared pieces
@aggregate
class _Head:
    """What a step reads and writes in global memory for one (batch, head), and the sizes it checks against:
    lse and Delta from row ``stat_row`` of their (B*H, N_q) arrays, the float32 dQ buffer from row ``dq_row``,
    N_Q and N_KV, and ``qk_scale`` (the softmax scale times log2(e))."""

    LSE: gl.tensor
    DELTA: gl.tensor
    DQ_ACC: gl.tensor
    stat_row: gl.tensor
    dq_row: gl.tensor
    N_Q: gl.tensor
    N_KV: gl.tensor
    qk_scale: gl.tensor

    @gluon.constexpr_function  # runs while the kernel is traced: it only names the values
    def __init__(self, LSE, DELTA, DQ_ACC, stat_row, dq_row, N_Q, N_KV, qk_scale):
        self.LSE = LSE
        self.DELTA = DELTA
        self.DQ_ACC = DQ_ACC
        self.stat_row = stat_row
        self.dq_row = dq_row
        self.N_Q = N_Q
        self.N_KV = N_KV
        self.qk_scale = qk_scale


@aggregate
class _Ring:
    """b6b / b6c's ring of (Q, dO) tiles: slot i holds ``q_smem.index(i)`` and ``do_smem.index(i)``; the producer
    arrives on ``ready.index(i)`` (by TMA byte count) once both landed, every consumer warpgroup on
    ``empty.index(i)`` once it no longer reads them."""

    q_smem: gl.shared_memory_descriptor
    do_smem: gl.shared_memory_descriptor
    ready: gl.shared_memory_descriptor
    empty: gl.shared_memory_descriptor

    @gluon.constexpr_function  # runs while the kernel is traced: it only names the values
    def __init__(self, q_smem, do_smem, ready, empty):
        self.q_smem = q_smem
        self.do_smem = do_smem
        self.ready = ready
        self.empty = empty


@gluon.jit
def _query_tiles(n0, N_Q, N_KV, CAUSAL: gl.constexpr, KEYS: gl.constexpr, BLOCK_M: gl.constexpr):
    """Query tiles of the keys [n0, n0 + KEYS): [m_lo, full_lo) and [full_hi, n_m) need masks (the causal
    diagonal; the tail past N_Q, or every tile when the key tile runs past N_KV); [full_lo, full_hi) do not."""
    n_m = (N_Q + BLOCK_M - 1) // BLOCK_M
    # 0 in fact (N_Q >= 0), but not to the compiler: the first masked loop stays in the non-causal program,
    # whose register allocation then matches the causal one's (Triton 3.6: 24-80 B of spills without this).
    m_lo = gl.minimum(N_Q, 0)
    full_lo = m_lo
    if CAUSAL:
        m_lo = gl.minimum(n0 // BLOCK_M, n_m)  # rows before n0 see none of these keys
        full_lo = gl.minimum((n0 + KEYS - 1 + BLOCK_M - 1) // BLOCK_M, n_m)  # rows >= n0 + KEYS - 1 see all
    full_hi = N_Q // BLOCK_M
    if n0 + KEYS > N_KV:
        full_hi = full_lo
    full_hi = gl.maximum(full_hi, full_lo)
    return m_lo, full_lo, full_hi, n_m


@gluon.jit
def _bwd_step(dk, dv, k_tile, v_tile, q_tile, do_tile, ds_smem, head, m0, keys, MASKED: gl.constexpr,
              CAUSAL: gl.constexpr, S_LAYOUT: gl.constexpr, KV_LAYOUT: gl.constexpr):
    """One (key tile, query tile) step of one warpgroup: the five products; dK, dV accumulate in registers,
    the dQ share goes out by relaxed atomic adds into ``head``'s buffer (a ``_Head``). ``keys`` are the
    warpgroup's key indices (S^T's rows), m0 the tile's first query row; the caller has waited for q_tile and
    do_tile."""
    BLOCK_M: gl.constexpr = q_tile.shape[0]
    HEAD_DIM: gl.constexpr = q_tile.shape[1]
    KEYS: gl.constexpr = k_tile.shape[0]
    op_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=KV_LAYOUT, k_width=2)
    cols = m0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, S_LAYOUT))  # query indices (S^T's columns)
    zero = gl.zeros([KEYS, BLOCK_M], gl.float32, S_LAYOUT)
    # lse and Delta first: their 16 addresses a thread are dead before S^T and dP^T take 64 registers.
    if MASKED:
        lse2 = gl.load(head.LSE + head.stat_row + cols, mask=cols < head.N_Q, other=0.0) * _LOG2E_C
        delta = gl.load(head.DELTA + head.stat_row + cols, mask=cols < head.N_Q, other=0.0)
    else:
        lse2 = gl.load(head.LSE + head.stat_row + cols) * _LOG2E_C
        delta = gl.load(head.DELTA + head.stat_row + cols)
    s = warpgroup_mma(k_tile, q_tile.permute((1, 0)), zero, use_acc=False, is_async=True)
    dp = warpgroup_mma(v_tile, do_tile.permute((1, 0)), zero, use_acc=False, is_async=True)
    s = warpgroup_mma_wait(num_outstanding=1, deps=(s,))
    p = gl.exp2(s * head.qk_scale - lse2[None, :])
    if MASKED:  # after exp2: rows past N_Q (the next head's) and keys past N_KV give P = 0, hence dS = 0
        ok = (cols[None, :] < head.N_Q) & (keys[:, None] < head.N_KV)
        if CAUSAL:
            ok = ok & (keys[:, None] <= cols[None, :])
        p = gl.where(ok, p, 0.0)
    p16 = p.to(q_tile.dtype)
    dv = warpgroup_mma(gl.convert_layout(p16, op_layout), do_tile, dv, is_async=True)
    dp = warpgroup_mma_wait(num_outstanding=1, deps=(dp,))  # in order: dP^T has landed, dV may still run
    ds_smem.store((p * (dp - delta[None, :])).to(q_tile.dtype))
    dv = warpgroup_mma_wait(num_outstanding=0, deps=(dv,))
    fence_async_shared()  # dS^T written by the threads, read by the tensor cores (the async proxy)
    # Both of dS's products read it from shared memory: no operand held in registers while dK, dV and a dQ
    # share are live. The dQ share goes in 64-column pieces, as FA3 splits dQ's columns between its
    # warpgroups: at D = 128 a whole 64 x 128 float32 share beside dK and dV spills.
    dk = warpgroup_mma(ds_smem, q_tile, dk, is_async=True)
    DQ_COLS: gl.constexpr = 64
    if BLOCK_M == 64:  # dQ[:, c:c+64] = dS K[:, c:c+64]
        DQ_LAYOUT: gl.constexpr = _mma_layout(DQ_COLS)
        zero_q = gl.zeros([BLOCK_M, DQ_COLS], gl.float32, DQ_LAYOUT)
        rows = head.dq_row + m0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, DQ_LAYOUT))  # padded: no mask
        dcols = gl.arange(0, DQ_COLS, layout=gl.SliceLayout(0, DQ_LAYOUT))
        for c in gl.static_range(HEAD_DIM // DQ_COLS):
            dq = warpgroup_mma(ds_smem.permute((1, 0)), k_tile.slice(c * DQ_COLS, DQ_COLS, dim=1), zero_q,
                               use_acc=False, is_async=True)
            dq = warpgroup_mma_wait(num_outstanding=0, deps=(dq,))
            gl.atomic_add(head.DQ_ACC + rows[:, None] * HEAD_DIM + (c * DQ_COLS + dcols)[None, :], dq, sem="relaxed")
    else:  # query tiles narrower than wgmma's 64 rows: dQ^T[c:c+64, :] = K[:, c:c+64]^T dS^T
        DQT_LAYOUT: gl.constexpr = _mma_layout(BLOCK_M)
        zero_q = gl.zeros([DQ_COLS, BLOCK_M], gl.float32, DQT_LAYOUT)
        rows = head.dq_row + m0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, DQT_LAYOUT))
        dcols = gl.arange(0, DQ_COLS, layout=gl.SliceLayout(1, DQT_LAYOUT))
        for c in gl.static_range(HEAD_DIM // DQ_COLS):
            dq = warpgroup_mma(k_tile.slice(c * DQ_COLS, DQ_COLS, dim=1).permute((1, 0)), ds_smem, zero_q,
                               use_acc=False, is_async=True)
            dq = warpgroup_mma_wait(num_outstanding=0, deps=(dq,))
            gl.atomic_add(head.DQ_ACC + rows[None, :] * HEAD_DIM + (c * DQ_COLS + dcols)[:, None], dq, sem="relaxed")
    dk = warpgroup_mma_wait(num_outstanding=0, deps=(dk,))
    return dk, dv


@gluon.jit
def _store_dkdv(dk, dv, DK, DV, kv_row, n0, N_KV, scale, HEAD_DIM: gl.constexpr, KEYS: gl.constexpr,
                KV_LAYOUT: gl.constexpr):
    """dK = scale * dS^T Q and dV of keys [n0, n0 + KEYS) of the head whose first row is kv_row; keys past N_KV
    are not written. HEAD_DIM is a row's length in memory; dk and dv may hold fewer columns (b8's warpgroups own
    half the head dim each and pass DK, DV already offset to their first column)."""
    keys = n0 + gl.arange(0, KEYS, layout=gl.SliceLayout(1, KV_LAYOUT))
    cols = gl.arange(0, dk.shape[1], layout=gl.SliceLayout(0, KV_LAYOUT))
    # A row index fits 32 bits (2**31 rows of D >= 64 16-bit values would be 256 GiB), but a row times HEAD_DIM
    # passes 2**31 elements from 16.8 million key rows at D = 128 (B = 16, H = 32, N = 32768): in 64 bits.
    offs = (kv_row + keys).to(gl.int64)[:, None] * HEAD_DIM + cols[None, :]
    mask = (keys < N_KV)[:, None] & (cols < HEAD_DIM)[None, :]
    gl.store(DK + offs, (dk * scale).to(DK.dtype.element_ty), mask=mask)
    gl.store(DV + offs, dv.to(DV.dtype.element_ty), mask=mask)


# ------------------------------------------------------------------------------------------ b6a
@gluon.jit
def _b6a_steps(dk, dv, k_smem, v_smem, q_smem, do_smem, ds_smem, bars, q_desc, do_desc, head, q_row, keys, i_lo,
               i_hi, n_tiles, m_lo, MASKED: gl.constexpr, CAUSAL: gl.constexpr, S_LAYOUT: gl.constexpr,
               KV_LAYOUT: gl.constexpr):
    """Steps [i_lo, i_hi) of b6a (step i is query tile m_lo + i): load step i+1's Q, dO into the other buffer,
    then compute step i."""
    BLOCK_M: gl.constexpr = q_desc.block_type.shape[0]
    for i in range(i_lo, i_hi):
        slot = i % 2
        nxt = i + 1
        more = nxt < n_tiles
        # The other buffer held step i-1, whose products all finished last iteration: refill it now.
        mbarrier.expect(bars.index(nxt % 2), q_desc.block_type.nbytes + do_desc.block_type.nbytes, pred=more)
        _tma_load(q_desc, [q_row + (m_lo + nxt) * BLOCK_M, 0], bars.index(nxt % 2), q_smem.index(nxt % 2),
                  pred=more)
        _tma_load(do_desc, [q_row + (m_lo + nxt) * BLOCK_M, 0], bars.index(nxt % 2), do_smem.index(nxt % 2),
                  pred=more)
        mbarrier.wait(bars.index(slot), (i // 2) & 1)
        dk, dv = _bwd_step(dk, dv, k_smem, v_smem, q_smem.index(slot), do_smem.index(slot), ds_smem, head,
                           (m_lo + i) * BLOCK_M, keys, MASKED=MASKED, CAUSAL=CAUSAL, S_LAYOUT=S_LAYOUT,
                           KV_LAYOUT=KV_LAYOUT)
    return dk, dv


@gluon.jit(do_not_specialize=["N_Q", "N_KV", "N_QPAD"])
def _b6a_kernel(q_desc, k_desc, v_desc, do_desc, DQ_ACC, DK, DV, LSE, DELTA, qk_scale, scale, N_Q, N_KV, N_QPAD,
                CAUSAL: gl.constexpr):
    """b6a: one warpgroup, 64 keys a program, TMA double buffer for (Q, dO), wgmma for the five products."""
    BLOCK_M: gl.constexpr = q_desc.block_type.shape[0]
    HEAD_DIM: gl.constexpr = q_desc.block_type.shape[1]
    KEYS: gl.constexpr = k_desc.block_type.shape[0]
    S_LAYOUT: gl.constexpr = _mma_layout(BLOCK_M)
    KV_LAYOUT: gl.constexpr = _mma_layout(HEAD_DIM)
    DS_LAYOUT: gl.constexpr = gl.NVMMASharedLayout.get_default_for([KEYS, BLOCK_M], q_desc.dtype)

    pid_n = gl.program_id(0)
    bh = gl.program_id(1)
    n0 = pid_n * KEYS
    kv_row = bh * N_KV
    q_row = bh * N_Q
    stat_row = bh.to(gl.int64) * N_Q
    dq_row = bh.to(gl.int64) * N_QPAD  # its rows times HEAD_DIM pass 2**31 elements as _store_dkdv's do
    m_lo, full_lo, full_hi, n_m = _query_tiles(n0, N_Q, N_KV, CAUSAL=CAUSAL, KEYS=KEYS, BLOCK_M=BLOCK_M)
    n_tiles = n_m - m_lo

    k_smem = gl.allocate_shared_memory(k_desc.dtype, [KEYS, HEAD_DIM], k_desc.layout)
    v_smem = gl.allocate_shared_memory(v_desc.dtype, [KEYS, HEAD_DIM], v_desc.layout)
    q_smem = gl.allocate_shared_memory(q_desc.dtype, [2, BLOCK_M, HEAD_DIM], q_desc.layout)
    do_smem = gl.allocate_shared_memory(do_desc.dtype, [2, BLOCK_M, HEAD_DIM], do_desc.layout)
    ds_smem = gl.allocate_shared_memory(q_desc.dtype, [KEYS, BLOCK_M], DS_LAYOUT)
    kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    bars = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_bar, count=1)
    for i in gl.static_range(2):
        mbarrier.init(bars.index(i), count=1)

    mbarrier.expect(kv_bar, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
    _tma_load(k_desc, [kv_row + n0, 0], kv_bar, k_smem)
    _tma_load(v_desc, [kv_row + n0, 0], kv_bar, v_smem)
    first = n_tiles > 0
    mbarrier.expect(bars.index(0), q_desc.block_type.nbytes + do_desc.block_type.nbytes, pred=first)
    _tma_load(q_desc, [q_row + m_lo * BLOCK_M, 0], bars.index(0), q_smem.index(0), pred=first)
    _tma_load(do_desc, [q_row + m_lo * BLOCK_M, 0], bars.index(0), do_smem.index(0), pred=first)

    head = _Head(LSE, DELTA, DQ_ACC, stat_row, dq_row, N_Q, N_KV, qk_scale)
    keys = n0 + gl.arange(0, KEYS, layout=gl.SliceLayout(1, S_LAYOUT))
    dk = gl.zeros([KEYS, HEAD_DIM], gl.float32, KV_LAYOUT)
    dv = gl.zeros([KEYS, HEAD_DIM], gl.float32, KV_LAYOUT)
    mbarrier.wait(kv_bar, 0)
    dk, dv = _b6a_steps(dk, dv, k_smem, v_smem, q_smem, do_smem, ds_smem, bars, q_desc, do_desc, head, q_row, keys,
                        0, full_lo - m_lo, n_tiles, m_lo, MASKED=True, CAUSAL=CAUSAL, S_LAYOUT=S_LAYOUT,
                        KV_LAYOUT=KV_LAYOUT)
    dk, dv = _b6a_steps(dk, dv, k_smem, v_smem, q_smem, do_smem, ds_smem, bars, q_desc, do_desc, head, q_row, keys,
                        full_lo - m_lo, full_hi - m_lo, n_tiles, m_lo, MASKED=False, CAUSAL=CAUSAL,
                        S_LAYOUT=S_LAYOUT, KV_LAYOUT=KV_LAYOUT)
    dk, dv = _b6a_steps(dk, dv, k_smem, v_smem, q_smem, do_smem, ds_smem, bars, q_desc, do_desc, head, q_row, keys,
                        full_hi - m_lo, n_tiles, n_tiles, m_lo, MASKED=True, CAUSAL=CAUSAL, S_LAYOUT=S_LAYOUT,
                        KV_LAYOUT=KV_LAYOUT)
    mbarrier.invalidate(kv_bar)
    for i in gl.static_range(2):
        mbarrier.invalidate(bars.index(i))
    _store_dkdv(dk, dv, DK, DV, kv_row, n0, N_KV, scale, HEAD_DIM=HEAD_DIM, KEYS=KEYS, KV_LAYOUT=KV_LAYOUT)


# ------------------------------------------------------------------------------------------ b6b, b6c
@gluon.jit
def _b6_producer(q_desc, k_desc, v_desc, do_desc, k_smem, v_smem, kv_bar, ring, q_row, kv_row, n0, m_lo, n_tiles,
                 CONSUMERS: gl.constexpr, STAGES: gl.constexpr):
    """The producer warp: every consumer's K and V tile once, then (Q, dO) tile by tile into the ring (a
    ``_Ring``). A slot is refilled once every consumer arrived on its ``empty`` barrier (on the first pass the
    wait is for phase 1 of a fresh barrier, which counts as complete)."""
    KEYS: gl.constexpr = k_desc.block_type.shape[0]
    BLOCK_M: gl.constexpr = q_desc.block_type.shape[0]
    mbarrier.expect(kv_bar, CONSUMERS * (k_desc.block_type.nbytes + v_desc.block_type.nbytes))
    for w in gl.static_range(CONSUMERS):
        _tma_load(k_desc, [kv_row + n0 + w * KEYS, 0], kv_bar, k_smem.index(w))
        _tma_load(v_desc, [kv_row + n0 + w * KEYS, 0], kv_bar, v_smem.index(w))
    for i in range(n_tiles):
        slot = i % STAGES
        mbarrier.wait(ring.empty.index(slot), ((i // STAGES) & 1) ^ 1)
        mbarrier.expect(ring.ready.index(slot), q_desc.block_type.nbytes + do_desc.block_type.nbytes)
        _tma_load(q_desc, [q_row + (m_lo + i) * BLOCK_M, 0], ring.ready.index(slot), ring.q_smem.index(slot))
        _tma_load(do_desc, [q_row + (m_lo + i) * BLOCK_M, 0], ring.ready.index(slot), ring.do_smem.index(slot))


@gluon.jit
def _b6_ws_steps(dk, dv, k_tile, v_tile, ds_tile, ring, head, keys, i_lo, i_hi, m_lo, MASKED: gl.constexpr,
                 CAUSAL: gl.constexpr, STAGES: gl.constexpr, S_LAYOUT: gl.constexpr, KV_LAYOUT: gl.constexpr):
    """Steps [i_lo, i_hi) of one consumer warpgroup: wait for the slot, compute, free the slot."""
    BLOCK_M: gl.constexpr = ring.q_smem.shape[1]
    for i in range(i_lo, i_hi):
        slot = i % STAGES
        mbarrier.wait(ring.ready.index(slot), (i // STAGES) & 1)
        dk, dv = _bwd_step(dk, dv, k_tile, v_tile, ring.q_smem.index(slot), ring.do_smem.index(slot), ds_tile, head,
                           (m_lo + i) * BLOCK_M, keys, MASKED=MASKED, CAUSAL=CAUSAL, S_LAYOUT=S_LAYOUT,
                           KV_LAYOUT=KV_LAYOUT)
        mbarrier.arrive(ring.empty.index(slot))  # every product of the step has landed: Q, dO no longer read
    return dk, dv


@gluon.jit
def _b6_consumer(wg: gl.constexpr, k_smem, v_smem, ds_smem, kv_bar, ring, head, DK, DV, scale, kv_row, n0, m_lo,
                 full_lo, full_hi, n_m, CAUSAL: gl.constexpr, STAGES: gl.constexpr):
    """Consumer warpgroup ``wg``: keys [n0 + 64 wg, n0 + 64 wg + 64), every query tile of the program (query
    tiles [m_lo, n_m), those in [full_lo, full_hi) unmasked, as ``_query_tiles`` counts them)."""
    KEYS: gl.constexpr = k_smem.shape[1]
    HEAD_DIM: gl.constexpr = k_smem.shape[2]
    BLOCK_M: gl.constexpr = ring.q_smem.shape[1]
    S_LAYOUT: gl.constexpr = _mma_layout(BLOCK_M)
    KV_LAYOUT: gl.constexpr = _mma_layout(HEAD_DIM)
    k_tile = k_smem.index(wg)
    v_tile = v_smem.index(wg)
    ds_tile = ds_smem.index(wg)
    first = n0 + wg * KEYS
    keys = first + gl.arange(0, KEYS, layout=gl.SliceLayout(1, S_LAYOUT))
    dk = gl.zeros([KEYS, HEAD_DIM], gl.float32, KV_LAYOUT)
    dv = gl.zeros([KEYS, HEAD_DIM], gl.float32, KV_LAYOUT)
    mbarrier.wait(kv_bar, 0)
    dk, dv = _b6_ws_steps(dk, dv, k_tile, v_tile, ds_tile, ring, head, keys, 0, full_lo - m_lo, m_lo, MASKED=True,
                          CAUSAL=CAUSAL, STAGES=STAGES, S_LAYOUT=S_LAYOUT, KV_LAYOUT=KV_LAYOUT)
    dk, dv = _b6_ws_steps(dk, dv, k_tile, v_tile, ds_tile, ring, head, keys, full_lo - m_lo, full_hi - m_lo, m_lo,
                          MASKED=False, CAUSAL=CAUSAL, STAGES=STAGES, S_LAYOUT=S_LAYOUT, KV_LAYOUT=KV_LAYOUT)
    dk, dv = _b6_ws_steps(dk, dv, k_tile, v_tile, ds_tile, ring, head, keys, full_hi - m_lo, n_m - m_lo, m_lo,
                          MASKED=True, CAUSAL=CAUSAL, STAGES=STAGES, S_LAYOUT=S_LAYOUT, KV_LAYOUT=KV_LAYOUT)
    _store_dkdv(dk, dv, DK, DV, kv_row, first, head.N_KV, scale, HEAD_DIM=HEAD_DIM, KEYS=KEYS, KV_LAYOUT=KV_LAYOUT)


@gluon.jit
def _b6_consumer0(k_smem, v_smem, ds_smem, kv_bar, ring, head, DK, DV, scale, kv_row, n0, m_lo, full_lo, full_hi,
                  n_m, CAUSAL: gl.constexpr, STAGES: gl.constexpr):
    """The default partition: consumer warpgroup 0."""
    _b6_consumer(0, k_smem, v_smem, ds_smem, kv_bar, ring, head, DK, DV, scale, kv_row, n0, m_lo, full_lo, full_hi,
                 n_m, CAUSAL=CAUSAL, STAGES=STAGES)


@gluon.jit
def _b6_consumer1(k_smem, v_smem, ds_smem, kv_bar, ring, head, DK, DV, scale, kv_row, n0, m_lo, full_lo, full_hi,
                  n_m, CAUSAL: gl.constexpr, STAGES: gl.constexpr):
    """A worker partition of 4 warps: consumer warpgroup 1, the program's next 64 keys."""
    _b6_consumer(1, k_smem, v_smem, ds_smem, kv_bar, ring, head, DK, DV, scale, kv_row, n0, m_lo, full_lo, full_hi,
                 n_m, CAUSAL=CAUSAL, STAGES=STAGES)


@gluon.jit(do_not_specialize=["N_Q", "N_KV", "N_QPAD"])
def _b6_ws_kernel(q_desc, k_desc, v_desc, do_desc, DQ_ACC, DK, DV, LSE, DELTA, qk_scale, scale, N_Q, N_KV, N_QPAD,
                  CAUSAL: gl.constexpr, CONSUMERS: gl.constexpr, STAGES: gl.constexpr, PRODUCER_REGS: gl.constexpr,
                  CONSUMER_REGS: gl.constexpr):
    """b6b, b6c: a producer warp and CONSUMERS warpgroups of 4 warps (launch with num_warps=4: the default
    partition is consumer 0), 64 keys each; they walk the same query tiles (those of all the program's keys:
    under causal, warpgroup 1's extra diagonal tile is masked away), so the ring is shared tile for tile."""
    BLOCK_M: gl.constexpr = q_desc.block_type.shape[0]
    HEAD_DIM: gl.constexpr = q_desc.block_type.shape[1]
    KEYS: gl.constexpr = k_desc.block_type.shape[0]
    DS_LAYOUT: gl.constexpr = gl.NVMMASharedLayout.get_default_for([KEYS, BLOCK_M], q_desc.dtype)

    pid_n = gl.program_id(0)
    bh = gl.program_id(1)
    n0 = pid_n * (KEYS * CONSUMERS)
    kv_row = bh * N_KV
    q_row = bh * N_Q
    stat_row = bh.to(gl.int64) * N_Q
    dq_row = bh.to(gl.int64) * N_QPAD  # its rows times HEAD_DIM pass 2**31 elements as _store_dkdv's do
    m_lo, full_lo, full_hi, n_m = _query_tiles(n0, N_Q, N_KV, CAUSAL=CAUSAL, KEYS=KEYS * CONSUMERS,
                                               BLOCK_M=BLOCK_M)

    k_smem = gl.allocate_shared_memory(k_desc.dtype, [CONSUMERS, KEYS, HEAD_DIM], k_desc.layout)
    v_smem = gl.allocate_shared_memory(v_desc.dtype, [CONSUMERS, KEYS, HEAD_DIM], v_desc.layout)
    q_smem = gl.allocate_shared_memory(q_desc.dtype, [STAGES, BLOCK_M, HEAD_DIM], q_desc.layout)
    do_smem = gl.allocate_shared_memory(do_desc.dtype, [STAGES, BLOCK_M, HEAD_DIM], do_desc.layout)
    ds_smem = gl.allocate_shared_memory(q_desc.dtype, [CONSUMERS, KEYS, BLOCK_M], DS_LAYOUT)
    kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=CONSUMERS)  # every consumer warpgroup frees the slot

    ring = _Ring(q_smem, do_smem, ready, empty)
    head = _Head(LSE, DELTA, DQ_ACC, stat_row, dq_row, N_Q, N_KV, qk_scale)
    # The argument tuples are written out in each call (a tuple held in a variable loses its constexprs).
    if CONSUMERS == 2:
        gl.warp_specialize([
            (_b6_consumer0, (k_smem, v_smem, ds_smem, kv_bar, ring, head, DK, DV, scale, kv_row, n0, m_lo, full_lo,
                             full_hi, n_m, CAUSAL, STAGES)),
            (_b6_consumer1, (k_smem, v_smem, ds_smem, kv_bar, ring, head, DK, DV, scale, kv_row, n0, m_lo, full_lo,
                             full_hi, n_m, CAUSAL, STAGES)),
            (_b6_producer, (q_desc, k_desc, v_desc, do_desc, k_smem, v_smem, kv_bar, ring, q_row, kv_row, n0, m_lo,
                            n_m - m_lo, CONSUMERS, STAGES)),
        ], [4, 1], [CONSUMER_REGS, PRODUCER_REGS])
    else:
        gl.warp_specialize([
            (_b6_consumer0, (k_smem, v_smem, ds_smem, kv_bar, ring, head, DK, DV, scale, kv_row, n0, m_lo, full_lo,
                             full_hi, n_m, CAUSAL, STAGES)),
            (_b6_producer, (q_desc, k_desc, v_desc, do_desc, k_smem, v_smem, kv_bar, ring, q_row, kv_row, n0, m_lo,
                            n_m - m_lo, CONSUMERS, STAGES)),
        ], [1], [PRODUCER_REGS])


# ------------------------------------------------------------------------------------------ dQ: float32 -> dtype
@gluon.constexpr_function
def _row_tile_layout(head_dim):
    """A 4-warp layout over rows of ``head_dim`` values: 4 a thread up to D = 128 (a warp spans 128 / D rows), 8 at
    D = 256 (a warp spans one row; with 4 a warp would need 64 threads)."""
    per_thread = max(4, head_dim // 32)
    return gl.BlockedLayout([1, per_thread], [32 * per_thread // head_dim, head_dim // per_thread], [4, 1], [1, 0])


@gluon.jit(do_not_specialize=["N_Q", "N_QPAD"])
def _dq_convert_kernel(DQ_ACC, DQ, scale, N_Q, N_QPAD, HEAD_DIM: gl.constexpr, BLOCK: gl.constexpr):
    """dQ = scale * dQ_acc in dQ's dtype, rows [pid * BLOCK, ...) of head program_id(1) (launch with 4 warps)."""
    layout: gl.constexpr = _row_tile_layout(HEAD_DIM)
    bh = gl.program_id(1)
    rows = gl.program_id(0) * BLOCK + gl.arange(0, BLOCK, layout=gl.SliceLayout(1, layout))
    cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, layout))
    mask = (rows < N_Q)[:, None] & (cols < HEAD_DIM)[None, :]
    acc = gl.load(DQ_ACC + (bh.to(gl.int64) * N_QPAD + rows)[:, None] * HEAD_DIM + cols[None, :], mask=mask)
    gl.store(DQ + (bh.to(gl.int64) * N_Q + rows)[:, None] * HEAD_DIM + cols[None, :],
             (acc * scale).to(DQ.dtype.element_ty), mask=mask)


# ------------------------------------------------------------------------------------------ stages and host
@dataclass(frozen=True)
class Stage:
    """One measured stage of b6: which kernel, its switches and its launch."""

    name: str
    adds: str
    expected: str
    kernel: object
    consumers: int = 1  # consumer warpgroups a program (64 keys each)
    stages: int = 2  # (Q, dO) ring depth
    producer_regs: int = 0
    consumer_regs: int = 0
    maxnreg: int | None = None

    @property
    def warp_specialized(self) -> bool:
        return self.kernel is not _b6a_kernel

    def keys(self) -> int:
        return ROWS * self.consumers

    def options(self) -> dict:
        return {"num_warps": 4} if self.maxnreg is None else {"num_warps": 4, "maxnreg": self.maxnreg}

    def constexprs(self, causal: bool) -> dict:
        if not self.warp_specialized:
            return {"CAUSAL": causal}
        return {"CAUSAL": causal, "CONSUMERS": self.consumers, "STAGES": self.stages,
                "PRODUCER_REGS": self.producer_regs, "CONSUMER_REGS": self.consumer_regs}


STAGES = {
    s.name: s
    for s in (
        Stage("b6a", "one warpgroup, 64 keys a program, TMA double buffer for Q / dO, wgmma for the 5 products, "
              "dQ by relaxed atomics into float32", "0.8-1.0x b1", _b6a_kernel),
        Stage("b6b", "producer warp + (Q, dO) ring with ready/empty mbarriers (gl.warp_specialize); setmaxnreg: "
              "producer 24, consumer 232, launch capped at 128 a thread (two programs an SM, as b6a)",
              "+0-10% over b6a", _b6_ws_kernel, consumers=1, stages=2, producer_regs=24, maxnreg=128),
        Stage("b6c", "two consumer warpgroups (64 keys each of a 128-key tile) share the ring; setmaxnreg: "
              "producer 24, consumers 240", "+10-25% over b6b: >= 0.9x cuDNN is the target", _b6_ws_kernel,
              consumers=2, stages=2, producer_regs=24, consumer_regs=240),
    )
}
HEAD_DIMS = (64, 128)


def kernel_signature(stage: Stage, head_dim: int, dtype: torch.dtype, causal: bool,
                     block_m: int | None = None) -> tuple[dict, dict]:
    """(signature, constexprs) of a stage's kernel, as ``triton.compile`` takes them; ``block_m``: query rows of
    a tile (default ``BLOCK_M[head_dim]``)."""
    name = {torch.float16: "fp16", torch.bfloat16: "bf16"}[dtype]
    block_m = BLOCK_M[head_dim] if block_m is None else block_m
    signature = {"q_desc": tensor_descriptor_signature(block_m, head_dim, dtype),
                 "k_desc": tensor_descriptor_signature(ROWS, head_dim, dtype),
                 "v_desc": tensor_descriptor_signature(ROWS, head_dim, dtype),
                 "do_desc": tensor_descriptor_signature(block_m, head_dim, dtype),
                 "DQ_ACC": "*fp32", "DK": f"*{name}", "DV": f"*{name}", "LSE": "*fp32", "DELTA": "*fp32",
                 "qk_scale": "fp32", "scale": "fp32", "N_Q": "i32", "N_KV": "i32", "N_QPAD": "i32"}
    constexprs = stage.constexprs(causal)
    signature.update({key: "constexpr" for key in constexprs})
    return signature, constexprs


def check_inputs(q, k, v, o, lse, do, head_dims: tuple[int, ...] = HEAD_DIMS) -> None:
    """What b6 takes, or a ValueError saying what to use instead; ``head_dims``: those the caller's kernel takes
    (b8 of fa3_backward_d256.py checks the same rules at D = 256)."""
    use = "use flashcourse.kernels.flash_attention_backward"
    if any(t.dim() != 4 for t in (q, k, v, o, do)):
        raise ValueError("fa3_backward takes q, k, v, o, do of shape (B, H, N, D)")
    if k.shape != v.shape or q.shape[:2] != k.shape[:2] or q.shape[3] != k.shape[3]:
        raise ValueError(f"fa3_backward needs q (B, H, N_q, D), k and v (B, H, N_kv, D) with the same B, H, D "
                         f"(got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}); for grouped-query "
                         f"attention {use} (b3 sums a group's dK, dV in registers)")
    if o.shape != q.shape or do.shape != q.shape or tuple(lse.shape) != tuple(q.shape[:3]):
        raise ValueError(f"fa3_backward needs o and do shaped like q {tuple(q.shape)} and lse (B, H, N_q) "
                         f"(got {tuple(o.shape)}, {tuple(do.shape)}, {tuple(lse.shape)})")
    if q.dtype not in (torch.float16, torch.bfloat16) or any(t.dtype != q.dtype for t in (k, v, o, do)):
        raise ValueError(f"fa3_backward takes float16 or bfloat16 q, k, v, o, do of one dtype (got {q.dtype}, "
                         f"{k.dtype}, {v.dtype}, {o.dtype}, {do.dtype}); {use} for float32")
    if lse.dtype != torch.float32:
        raise ValueError(f"fa3_backward takes the forward's float32 lse (got {lse.dtype})")
    if q.shape[3] not in head_dims:
        raise ValueError(f"fa3_backward takes head dims {head_dims} (got {q.shape[3]}); {use} for the others")
    if not all(t.is_contiguous() for t in (q, k, v, o, lse, do)):
        raise ValueError("fa3_backward reads contiguous (B, H, N, D) tensors through TMA: pass .contiguous() "
                         f"tensors (a transposed (B, N, H, D) view is not contiguous), or {use}, which takes any "
                         "strides")
    if not q.is_cuda or torch.cuda.get_device_capability(q.device) != (9, 0):
        where = f"compute capability {torch.cuda.get_device_capability(q.device)}" if q.is_cuda else "the CPU"
        raise ValueError(f"fa3_backward is written for Hopper (sm_90: H100, H200), not {where}: {use} (b1), "
                         "which runs everywhere")


def fa3_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
                 do: torch.Tensor, *, causal: bool = False, scale: float | None = None,
                 stage: str = "b6c", block_m: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) of attention with stage ``stage`` of b6 (see the module docstring) from the forward's o and
    natural-log lse. ``causal=True`` is top-left aligned. Hopper only; ``check_inputs`` says what it takes.
    ``block_m`` (32 or 64; default ``BLOCK_M[D]``) overrides the query rows of a tile, for measuring."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from ..backward import _bwd_preprocess
    from ..common import strides

    if stage not in STAGES:
        raise ValueError(f"stage {stage!r}: expected one of {sorted(STAGES)}")
    check_inputs(q, k, v, o, lse, do)
    spec = STAGES[stage]
    batch, heads, n_q, head_dim = q.shape
    block_m = BLOCK_M[head_dim] if block_m is None else int(block_m)
    if block_m not in (32, 64):
        raise ValueError(f"block_m={block_m}: 32 or 64 query rows a tile")
    n_kv = k.shape[2]
    if batch * heads * n_q == 0 or n_kv == 0:
        return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    scale = 1.0 / math.sqrt(head_dim) if scale is None else float(scale)
    delta = torch.empty((batch, heads, n_q), device=q.device, dtype=torch.float32)
    _bwd_preprocess[(triton_cdiv(n_q, 64), batch * heads)](
        O=o, DO=do, DELTA=delta, **strides(o, "o"), **strides(do, "do"), H=heads, N_Q=n_q,
        HEAD_DIM=head_dim, BLOCK_D=head_dim, BLOCK_M=64)
    n_qpad = triton_cdiv(n_q, ROWS) * ROWS
    dq_acc = torch.zeros((batch * heads, n_qpad, head_dim), device=q.device, dtype=torch.float32)
    dk = torch.empty_like(k)
    dv = torch.empty_like(v)

    def describe(t: torch.Tensor, n: int, block_rows: int):
        flat = t.view(batch * heads * n, head_dim)
        return TensorDescriptor(flat, list(flat.shape), list(flat.stride()), [block_rows, head_dim],
                                _smem_layout(block_rows, head_dim, q.dtype))

    grid = (triton_cdiv(n_kv, spec.keys()), batch * heads)
    spec.kernel[grid](describe(q, n_q, block_m), describe(k, n_kv, ROWS), describe(v, n_kv, ROWS),
                      describe(do, n_q, block_m), dq_acc, dk, dv, lse, delta, scale * _LOG2E, scale, n_q, n_kv, n_qpad,
                      **spec.constexprs(bool(causal)), **spec.options())
    dq = torch.empty_like(q)
    _dq_convert_kernel[(triton_cdiv(n_q, 64), batch * heads)](dq_acc, dq, scale, n_q, n_qpad, HEAD_DIM=head_dim,
                                                              BLOCK=64, num_warps=4)
    return dq, dk, dv
