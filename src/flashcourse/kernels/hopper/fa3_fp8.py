"""Forward v8 in FP8: the Gluon FlashAttention-3 forward on e4m3 q, k, v, with V transposed inside the kernel, in
two stages (``STAGES``): v8c_fp8 (v8c's design; checked and timed on the H200 on 2026-12-01 by
``benchmarks/gpu_fa3_fp8.py``) and v8e_fp8 (v8e's schedule; compiled for sm_90 on a CPU, not yet run); and
FlashAttention-4's softmax ideas on v8c_fp8 (``FA4_STAGES``, v9, below).

Why a transpose. Hopper's FP8 ``wgmma`` reads both operands K-major: the reduction dim contiguous in shared memory.
In S = Q K^T the reduction runs over D, and q and k as the user passes them, (B, H, N, D) with D contiguous,
already are. In O += P V it runs over the keys, and V as passed is not: its keys are D bytes apart. Our Triton FP8
forward (``fp8.py``) pays a per-call copy of V into a keys-adjacent layout (``v_keys_contiguous``), between 6% and
a quarter of the call's time (docs/KERNELS.md, FP8). FlashAttention-3 (Shah et al. 2024, section 3.3, "layout
transformations"; ``hopper/mainloop_fwd_sm90_tma_gmma_ws.hpp``, the ``Transpose_V`` path) instead transposes each V
tile in shared memory after its TMA copy lands, in the producer warpgroup, with ldmatrix / stmatrix and byte
permutes, while the consumers compute; and it lays P's registers out as the FP8 A operand wants them.

The first stage, ``v8c_fp8``, does the same with Gluon's pieces:

- the **producer** partition is a whole warpgroup (4 warps, not v8c's one warp): its TMA copies are issued by one
  thread as before (Q once; K tile j into a ring slot; V tile j, as passed, (BLOCK_N, D) with D contiguous, into a
  staging slot); then the four warps **transpose** V tile j-1: ``load`` from the staging slot into registers
  (a blocked layout holding 4 x 4 bytes a thread), ``store`` into the ring slot of V^T through a permuted view
  (``vt_smem.index(slot).permute((1, 0))``: the buffer is (D, BLOCK_N), keys contiguous, so the (BLOCK_N, D)
  view writes each value at its transposed place), ``fence_async_shared`` (the tensor cores read shared memory
  through the async proxy), a barrier of the four warps, then one arrive on ``vt_ready``. Tile j-1 is
  transposed after tile j's copies are issued, so the TMA of one tile overlaps the transpose of the previous;
- the two **consumer** warpgroups (64 query rows each) are v8c's, in FP8: S = Q K^T with K^T the permuted view of
  the K tile (K-major, as before); the online softmax computes ``p * 2^P_SHIFT`` (fp8.py's rounding: P_SHIFT
  taken off the running max, exactly), P cast to e4m3 and converted to the A-operand layout of an 8-bit wgmma
  (``DotOperandLayout(k_width=4)``: the register reordering FlashAttention-3 writes by hand is the compiler's
  ``convert_layout``); O += P V^T^T with V^T the permuted view of the (D, BLOCK_N) buffer, which is K-major;
- **descales** as fp8.py: q's and k's folded into the exponent's scale once per program, v's multiplying the
  output at the end; the lse takes P_SHIFT back off.

The second stage, ``v8e_fp8``, keeps that producer and gives the consumers fa3.py's v8e schedule
(``_fp8_tiles_overlapped``): QK^T of tile j is issued together with P(j-1) V(j-1), tile j's softmax runs while
that product is on the tensor cores (FlashAttention-3's intra-warpgroup overlap, Shah et al. 2024, section 3.2),
and the two warpgroups take turns issuing their pair (ping-pong, section 3.1). It matters more in FP8 than in
float16: per 128 x 128 tile at D = 128, the two products take the tensor cores about 1,024 clocks (4.2 M
multiply-adds at 4,096 a clock an SM: the H100 SXM's 1,979 dense FP8 TFLOP/s at 1.83 GHz on 132 SMs), and the
16,384 exponentials take the SM's MUFU units as long (16 a clock at compute capability 9.0: CUDA C++ Programming
Guide, arithmetic instruction throughput); v8c_fp8 runs the one after the other in each warpgroup. Two Gluon
details: the wait for P V cannot list P's 8-bit registers (Triton lowers no such dependency), and ptxas moves that
wait up before the exponentials unless a block boundary holds it back (the wait for the next K tile is placed
there; see ``_fp8_tiles_overlapped``). Its masks are fa3._v8f_mask's, tile 0 masked always. Same tiles, ring
and budgets as v8c_fp8: 168 registers at launch, no spills, 57,736 / 115,080 B of shared memory at D 64 / 128,
every tile's 66 exponentials between the two waits (``scripts/fa3_fp8_compile.py``, Triton 3.6 and 3.9). 256-key
tiles would halve the per-tile overhead: at D = 64
they compile without spills in v8e_fp8 (106,888 B shared), at D = 128 they spill (320 B a thread).

FlashAttention-4's two softmax ideas in FP8 (``FA4_STAGES``, lesson 14; fa3.py's v9a and v9b in 16 bits), each on
v8c_fp8 (``Stage.builds_on``: the FP8 stage measured on a GPU), through fa3.py's own softmax (``_softmax_tile``
with its P_SHIFT: the rescale test, P from the max kept, the emulated columns through ``_exp2_on_fma``) and its
``_rescale_when_moved``:

- v9b_1of16_fp8, v9b_1of4_fp8 (EMULATED_COLUMNS = 8 / 32): the first columns of each 128-key tile take 2^x from
  the polynomial on the FMA units, the rest from MUFU.EX2. Here x = s - m + P_SHIFT reaches 8, not 0 as in 16 bits;
  ``_exp2_on_fma`` takes it (its integer add puts a positive n in the exponent as it puts a negative one).
- v9a_fp8 (RESCALE_THRESHOLD): conditional rescaling meets the trap FlashAttention-4 avoids by taking no threshold
  in FP8 (``rescale_threshold`` 0 for 8-bit inputs, flash_attn/cute; Note [Low Precision Scaling] in
  ``flash_fwd_sm100.py``). The arithmetic: the kernel quantises P = 2^(s - m + P_SHIFT), m the max it kept. A
  kept max lags the row's largest score so far by at most the threshold t, so P <= 2^(t + P_SHIFT). e4m3's
  largest value is 448 = 1.75 x 2^8, about 2^8.81; anything larger saturates to 448 (or becomes NaN without
  saturation) while the float32 sum l counts the weight whole, and the output shrinks. So t + P_SHIFT <= 8.81.
  FA4's 16-bit threshold 8 with this module's P_SHIFT = 8 gives 2^16 = 65,536, 146 times too large: ``Stage``
  refuses it. v9a_fp8 takes t = 2 and P_SHIFT = 6: P <= 2^8 = 256, v8c_fp8's own peak, with the exponential's
  error (MUFU's 2^-22, the polynomial's 1e-4 relative) far from the 464 where 448's rounding ends. The price of the
  smaller shift: e4m3 keeps 3 bits of a weight down to 2^-12 of the kept max rather than 2^-14, and a weight
  below e4m3's normal range rounds with an error of up to 2^-16 rather than 2^-18 (``fp8.error_bound``'s
  ``p_shift``; the GPU checks use it). The test is tests/test_fa4.py's e4m3 replay of the online softmax
  (``fa4.forward_conditional`` with ``p_shift``): at t = 2, P_SHIFT = 6 the output stays within the FP8 bound on
  scores built to lag the max by just under the threshold; at t = 8, P_SHIFT = 8 it does not.

Register budgets: the producer warpgroup now holds a V tile in registers (BLOCK_N * D / 128 bytes a thread, 32
registers at D = 128), so it gets more than v8c's 24: producer 56, consumers 224 (2 * 128 * 224 + 128 * 56 =
64,512 of the SM's 65,536), 12 warps at launch as v8c. Tiles: 128 query rows (two consumer warpgroups) by 128
keys at D 64 and 128 (FlashAttention-3's FP8 tile at D = 128 non-causal is 128 x 224; Triton's tensors need
powers of two, and a 64 x 256 score tile a warpgroup would leave no registers for the output).

Layout contract: q (B, H, N_q, D), k and v (B, H, N_kv, D), float8_e4m3fn, contiguous as passed (no copy of V), D
64 or 128, H_q == H_kv; descales (B, H) float32 (None = 1); o (B, H, N_q, D) in ``out_dtype`` (bfloat16 or
float16), lse (B, H, N_q) float32, natural log. ``causal=True`` is top-left aligned. The tensors are seen as 2-D
(B*H*N, D) for TMA, as fa3.py: a tile past its head's last row reads the next head's rows, which the masks
discard. ``flashcourse.kernels`` does not import this module.
"""

from __future__ import annotations

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

from .fa3 import (
    _LN2,
    _MASKED_FILL,
    _key_tiles,
    _rescale_when_moved,
    _Ring,
    _softmax_tile,
    _tma_load,
    _v8f_mask,
    triton_cdiv,
)

TESTED_TRITON = ("3.6", "3.9")  # compiled for sm_90 (tests/test_fa3_fp8_compile.py); v8c_fp8 ran under 3.6

FP8 = torch.float8_e4m3fn
P_SHIFT = 8  # as fp8.P_SHIFT: P is quantised as p * 2^8, the row max 1 -> 256 < 448 (v9a_fp8 takes 6)
# The consumers' shift is this peak less the stage's rescale threshold, so that P's largest value, 2^(t + shift),
# is always 2^8: the kernel derives it (one argument fewer per partition) and Stage holds p_shift to it.
_PEAK_SHIFT = gl.constexpr(8.0)
FP8_MAX = 448.0  # the largest finite float8_e4m3fn (OCP FP8 formats, 2022)
HEAD_DIMS = (64, 128)
OUT_DTYPES = (torch.bfloat16, torch.float16)
ROWS = 64  # query rows of one consumer warpgroup
CONSUMERS = 2
BLOCK_N = {64: 128, 128: 128}  # key tile rows per head dim
RING = 2  # K and V^T ring depth (and V staging slots)
PRODUCER_REGS = 56
CONSUMER_REGS = 224
NUM_WARPS = 4  # the default partition: consumer warpgroup 0
_LOG2E = 1.4426950408889634
# A barrier of the calling partition's warps: ``gl.thread_barrier`` in Triton 3.6, ``gl.barrier`` later.
_warps_barrier = getattr(gl, "thread_barrier", None) or gl.barrier


# ------------------------------------------------------------------------------------------ producer
@gluon.constexpr_function
def _mma_layout(n):
    """fa3._mma_layout for 8-bit operands: an FP8 wgmma reduces 32 elements an instruction (16 in 16 bits), and
    the lowering refuses an fp8 wgmma whose layout says 16."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, n, 32])


@gluon.jit
def _transpose_v(v_stage, ring, j, RING: gl.constexpr):
    """V tile j: staging slot (BLOCK_N, D), D contiguous -> V^T ring slot (D, BLOCK_N), keys contiguous, through
    the registers of the producer's four warps. The slot is refilled only after both consumers freed it."""
    # 4 keys x 4 channels a thread: read 4 bytes along D, write 4 bytes along the keys.
    regs: gl.constexpr = gl.BlockedLayout(size_per_thread=[4, 4], threads_per_warp=[4, 8], warps_per_cta=[4, 1],
                                          order=[0, 1])
    slot = j % RING
    phase = (j // RING) & 1
    tile = v_stage.index(slot).load(regs)  # the TMA copy landed: waited on by the caller
    mbarrier.wait(ring.v_empty.index(slot), phase ^ 1)
    ring.v_smem.index(slot).permute((1, 0)).store(tile)
    fence_async_shared()  # the generic-proxy stores become visible to wgmma (async proxy)
    _warps_barrier()  # all four warps stored before the one arrive
    mbarrier.arrive(ring.v_ready.index(slot))


@gluon.jit
def _producer(q_desc, k_desc, v_desc, q_smem, q_bars, ring, v_stage, v_landed, q_row, kv_row, n_tiles,
              CONSUMERS: gl.constexpr, RING: gl.constexpr):
    """Q once; then for each key tile j: K(j) into the ring, V(j) into staging, and the transpose of V(j-1) into
    the ring's V^T slot. ``ring`` is fa3's ``_Ring`` with V^T in the place of V: ``v_smem`` the (D, BLOCK_N)
    slots, ``v_ready`` / ``v_empty`` their barriers (the consumers see only K and V^T)."""
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[0]
    for w in gl.static_range(CONSUMERS):
        mbarrier.expect(q_bars.index(w), q_desc.block_type.nbytes)
        _tma_load(q_desc, [q_row + w * q_desc.block_type.shape[0], 0], q_bars.index(w), q_smem.index(w))
    for j in range(n_tiles):
        slot = j % RING
        phase = (j // RING) & 1
        mbarrier.wait(ring.k_empty.index(slot), phase ^ 1)
        mbarrier.expect(ring.k_ready.index(slot), k_desc.block_type.nbytes)
        _tma_load(k_desc, [kv_row + j * BLOCK_N, 0], ring.k_ready.index(slot), ring.k_smem.index(slot))
        # Staging slot j % RING last held tile j - RING, transposed (read into registers) in an earlier iteration
        # of these same warps, and fenced there: free.
        mbarrier.expect(v_landed.index(slot), v_desc.block_type.nbytes)
        _tma_load(v_desc, [kv_row + j * BLOCK_N, 0], v_landed.index(slot), v_stage.index(slot))
        if j > 0:
            prev = j - 1
            mbarrier.wait(v_landed.index(prev % RING), (prev // RING) & 1)
            _transpose_v(v_stage, ring, prev, RING)
    if n_tiles > 0:
        last = n_tiles - 1
        mbarrier.wait(v_landed.index(last % RING), (last // RING) & 1)
        _transpose_v(v_stage, ring, last, RING)


# ------------------------------------------------------------------------------------------ consumers
@gluon.jit
def _fp8_tiles(acc, m_i, l_i, q_tile, ring, rows, j_lo, j_hi, N_KV, qk_scale, MASKED: gl.constexpr,
               CAUSAL: gl.constexpr, RING: gl.constexpr, S_LAYOUT: gl.constexpr, O_LAYOUT: gl.constexpr,
               P_SHIFT: gl.constexpr, RESCALE_THRESHOLD: gl.constexpr, EMULATED_COLUMNS: gl.constexpr):
    """Key tiles [j_lo, j_hi) of one consumer warpgroup without overlap (v8c_fp8 and the v9 stages on it): QK^T,
    softmax, P to e4m3, P V from the transposed ring. RESCALE_THRESHOLD > 0 (v9a_fp8): the output rows are
    rescaled only when some row of the warpgroup moved its max (fa3._rescale_when_moved)."""
    BLOCK_N: gl.constexpr = ring.k_smem.shape[1]
    zero = gl.zeros([rows.shape[0], BLOCK_N], gl.float32, S_LAYOUT)
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=O_LAYOUT, k_width=4)  # 8-bit A operand
    for j in range(j_lo, j_hi):
        slot = j % RING
        phase = (j // RING) & 1
        mbarrier.wait(ring.k_ready.index(slot), phase)
        s = warpgroup_mma(q_tile, ring.k_smem.index(slot).permute((1, 0)), zero, use_acc=False, is_async=True)
        s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
        mbarrier.arrive(ring.k_empty.index(slot))
        p, alpha, m_i, l_i = _softmax_tile(s, m_i, l_i, rows, j * BLOCK_N, N_KV, qk_scale, MASKED=MASKED,
                                           CAUSAL=CAUSAL, BLOCK_N=BLOCK_N, S_LAYOUT=S_LAYOUT, P_SHIFT=P_SHIFT,
                                           RESCALE_THRESHOLD=RESCALE_THRESHOLD,
                                           EMULATED_COLUMNS=EMULATED_COLUMNS)
        if RESCALE_THRESHOLD > 0:
            acc = _rescale_when_moved(acc, alpha, O_LAYOUT=O_LAYOUT)
        else:
            acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, O_LAYOUT))[:, None]
        p8 = gl.convert_layout(p.to(ring.v_smem.dtype), p_layout)
        mbarrier.wait(ring.v_ready.index(slot), phase)
        # The V^T slot: (D, BLOCK_N) with the keys contiguous; its (BLOCK_N, D) view is K-major for P V.
        acc = warpgroup_mma(p8, ring.v_smem.index(slot).permute((1, 0)), acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        mbarrier.arrive(ring.v_empty.index(slot))
    return acc, m_i, l_i


@gluon.jit
def _fp8_tiles_overlapped(acc, p_prev, m_i, l_i, q_tile, ring, turns, wg: gl.constexpr, rows, j_lo, j_hi, n_tiles,
                          N_KV, qk_scale, MASKED: gl.constexpr, CAUSAL: gl.constexpr, PINGPONG: gl.constexpr,
                          RING: gl.constexpr, S_LAYOUT: gl.constexpr, O_LAYOUT: gl.constexpr,
                          P_SHIFT: gl.constexpr):
    """Key tiles [j_lo, j_hi), j_lo >= 1, of v8e_fp8: fa3's intra-warpgroup overlap (v8d) in FP8. QK^T(j) and
    P(j-1) V(j-1) are issued together (P(j-1) waiting in registers as e4m3, in the A-operand layout); softmax(j)
    runs while that product is on the tensor cores; the output is rescaled by alpha(j) once it has landed.
    PINGPONG (v8e): the pair goes out only in this warpgroup's turn (fa3._ws_tiles_overlapped's protocol: turn
    t of warpgroup 0 waits for warpgroup 1's turn t-1, turn t of warpgroup 1 for warpgroup 0's turn t; each
    arrives on the other's barrier once its pair is issued), so one warpgroup's exponentials run under the
    other's products. Masks are fa3._v8f_mask's, which hold no column index in a register.

    The wait for K(j+1), which the next iteration needs first, is made here, between the softmax and the wait
    for P V. Without it ptxas moves that wait (``WARPGROUP.DEPBAR.LE gsb0, 0x0``) up to just after the row max,
    before all 64 exponentials, and nothing overlaps: so it compiles fa3.py's v8d / v8e (float16) under Triton
    3.6 and 3.9. An mbarrier wait is a loop in the PTX, a block boundary ptxas does not move instructions across:
    every exponential stays between the two waits (tests/test_fa3_fp8_compile.py counts them in the SASS).
    ``n_tiles``: the program's key tiles (no K(j+1) past the last)."""
    BLOCK_N: gl.constexpr = ring.k_smem.shape[1]
    zero = gl.zeros([rows.shape[0], BLOCK_N], gl.float32, S_LAYOUT)
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=O_LAYOUT, k_width=4)
    for j in range(j_lo, j_hi):
        slot = j % RING
        prev = (j - 1) % RING
        turn = j - 1
        mbarrier.wait(ring.k_ready.index(slot), (j // RING) & 1)
        mbarrier.wait(ring.v_ready.index(prev), ((j - 1) // RING) & 1)
        if PINGPONG:
            if wg == 0:
                mbarrier.wait(turns.index(0), (turn - 1) & 1, pred=turn > 0)
            else:
                mbarrier.wait(turns.index(1), turn & 1)
        s = warpgroup_mma(q_tile, ring.k_smem.index(slot).permute((1, 0)), zero, use_acc=False, is_async=True)
        acc = warpgroup_mma(p_prev, ring.v_smem.index(prev).permute((1, 0)), acc, is_async=True)
        if PINGPONG:
            mbarrier.arrive(turns.index(1 - wg))
        s = warpgroup_mma_wait(num_outstanding=1, deps=(s,))  # groups complete in order: QK^T(j) has landed
        mbarrier.arrive(ring.k_empty.index(slot))
        if MASKED:
            s = _v8f_mask(s, rows, j * BLOCK_N, N_KV, CAUSAL=CAUSAL, S_LAYOUT=S_LAYOUT)
        p, alpha, m_i, l_i = _softmax_tile(s, m_i, l_i, rows, j * BLOCK_N, N_KV, qk_scale, MASKED=False,
                                           CAUSAL=CAUSAL, BLOCK_N=BLOCK_N, S_LAYOUT=S_LAYOUT, P_SHIFT=P_SHIFT)
        nxt = j + 1  # a block boundary before the wait for P V (see above); the next iteration finds K ready
        mbarrier.wait(ring.k_ready.index(nxt % RING), (nxt // RING) & 1, pred=nxt < n_tiles)
        # P(j-1) is no dependency here: the wait cannot take 8-bit registers (Triton's lowering refuses them);
        # it is overwritten only below, after the wait.
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        mbarrier.arrive(ring.v_empty.index(prev))
        acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, O_LAYOUT))[:, None]
        p_prev = gl.convert_layout(p.to(ring.v_smem.dtype), p_layout)
    return acc, p_prev, m_i, l_i


@gluon.jit
def _fp8_store_rows(acc, m_i, l_i, O, LSE, v_descale, bh, m0, N_Q, S_LAYOUT: gl.constexpr,
                    O_LAYOUT: gl.constexpr, P_SHIFT: gl.constexpr):
    """o = acc * v_descale / l (in O's dtype) and the natural lse of rows [m0, m0 + ROWS): fa3._store_rows with
    v's descale and the shift taken back off the lse."""
    ROWS: gl.constexpr = acc.shape[0]
    HEAD_DIM: gl.constexpr = acc.shape[1]
    # l carries 2^P_SHIFT as acc does (o = acc / l is right); the lse takes it off: m - P_SHIFT + log2(l).
    empty = l_i == 0.0
    l_safe = gl.where(empty, 1.0, l_i)
    lse = gl.where(empty, float("-inf"), (m_i - P_SHIFT + gl.log2(l_safe)) * _LN2)
    o = acc * (v_descale / gl.convert_layout(l_safe, gl.SliceLayout(1, O_LAYOUT)))[:, None]
    base = bh.to(gl.int64) * N_Q
    out_rows = m0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, O_LAYOUT))
    cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, O_LAYOUT))
    ptrs = O + (base + out_rows)[:, None] * HEAD_DIM + cols[None, :]
    gl.store(ptrs, o.to(O.dtype.element_ty), mask=(out_rows < N_Q)[:, None] & (cols < HEAD_DIM)[None, :])
    rows = m0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, S_LAYOUT))
    gl.store(LSE + base + rows, lse, mask=rows < N_Q)


@gluon.jit
def _fp8_consumer(wg: gl.constexpr, O, LSE, qk_scale, v_descale, q_smem, q_bars, ring, turns, bh, m0, full, n_tiles,
                  N_Q, N_KV, CAUSAL: gl.constexpr, OVERLAP: gl.constexpr, PINGPONG: gl.constexpr,
                  RING: gl.constexpr, P_SHIFT: gl.constexpr, RESCALE_THRESHOLD: gl.constexpr,
                  EMULATED_COLUMNS: gl.constexpr):
    """Consumer warpgroup ``wg``: query rows [m0, m0 + 64) against every key tile of the program, then the store
    of o * v_descale and of the lse without the shift."""
    ROWS: gl.constexpr = q_smem.shape[1]
    HEAD_DIM: gl.constexpr = q_smem.shape[2]
    BLOCK_N: gl.constexpr = ring.k_smem.shape[1]
    S_LAYOUT: gl.constexpr = _mma_layout(BLOCK_N)
    O_LAYOUT: gl.constexpr = _mma_layout(HEAD_DIM)
    q_tile = q_smem.index(wg)
    rows = m0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, S_LAYOUT))
    m_i = gl.full([ROWS], _MASKED_FILL, gl.float32, layout=gl.SliceLayout(1, S_LAYOUT))
    l_i = gl.zeros([ROWS], gl.float32, layout=gl.SliceLayout(1, S_LAYOUT))
    mbarrier.wait(q_bars.index(wg), 0)
    if OVERLAP:
        # Key tile 0 alone: QK^T and softmax; its P V goes out with tile 1's QK^T. n_tiles >= 1 (the host
        # launches nothing without keys). Masked whether or not it needs to be, once a program: one code path.
        p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=O_LAYOUT, k_width=4)
        mbarrier.wait(ring.k_ready.index(0), 0)
        zero = gl.zeros([ROWS, BLOCK_N], gl.float32, S_LAYOUT)
        s = warpgroup_mma(q_tile, ring.k_smem.index(0).permute((1, 0)), zero, use_acc=False, is_async=True)
        s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
        mbarrier.arrive(ring.k_empty.index(0))
        s = _v8f_mask(s, rows, 0, N_KV, CAUSAL=CAUSAL, S_LAYOUT=S_LAYOUT)
        p, alpha, m_i, l_i = _softmax_tile(s, m_i, l_i, rows, 0, N_KV, qk_scale, MASKED=False, CAUSAL=CAUSAL,
                                           BLOCK_N=BLOCK_N, S_LAYOUT=S_LAYOUT, P_SHIFT=P_SHIFT)
        p_prev = gl.convert_layout(p.to(ring.v_smem.dtype), p_layout)
        acc = gl.zeros([ROWS, HEAD_DIM], gl.float32, layout=O_LAYOUT)
        acc, p_prev, m_i, l_i = _fp8_tiles_overlapped(
            acc, p_prev, m_i, l_i, q_tile, ring, turns, wg, rows, 1, gl.maximum(full, 1), n_tiles, N_KV, qk_scale,
            MASKED=False, CAUSAL=CAUSAL, PINGPONG=PINGPONG, RING=RING, S_LAYOUT=S_LAYOUT, O_LAYOUT=O_LAYOUT,
            P_SHIFT=P_SHIFT)
        acc, p_prev, m_i, l_i = _fp8_tiles_overlapped(
            acc, p_prev, m_i, l_i, q_tile, ring, turns, wg, rows, gl.maximum(full, 1), n_tiles, n_tiles, N_KV,
            qk_scale, MASKED=True, CAUSAL=CAUSAL, PINGPONG=PINGPONG, RING=RING, S_LAYOUT=S_LAYOUT, O_LAYOUT=O_LAYOUT,
            P_SHIFT=P_SHIFT)
        # The last tile's P V, alone.
        last = n_tiles - 1
        mbarrier.wait(ring.v_ready.index(last % RING), (last // RING) & 1)
        acc = warpgroup_mma(p_prev, ring.v_smem.index(last % RING).permute((1, 0)), acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        mbarrier.arrive(ring.v_empty.index(last % RING))
    else:
        acc = gl.zeros([ROWS, HEAD_DIM], gl.float32, layout=O_LAYOUT)
        acc, m_i, l_i = _fp8_tiles(acc, m_i, l_i, q_tile, ring, rows, 0, full, N_KV, qk_scale, MASKED=False,
                                   CAUSAL=CAUSAL, RING=RING, S_LAYOUT=S_LAYOUT, O_LAYOUT=O_LAYOUT, P_SHIFT=P_SHIFT,
                                   RESCALE_THRESHOLD=RESCALE_THRESHOLD, EMULATED_COLUMNS=EMULATED_COLUMNS)
        acc, m_i, l_i = _fp8_tiles(acc, m_i, l_i, q_tile, ring, rows, full, n_tiles, N_KV, qk_scale, MASKED=True,
                                   CAUSAL=CAUSAL, RING=RING, S_LAYOUT=S_LAYOUT, O_LAYOUT=O_LAYOUT, P_SHIFT=P_SHIFT,
                                   RESCALE_THRESHOLD=RESCALE_THRESHOLD, EMULATED_COLUMNS=EMULATED_COLUMNS)
    _fp8_store_rows(acc, m_i, l_i, O, LSE, v_descale, bh, m0, N_Q, S_LAYOUT=S_LAYOUT, O_LAYOUT=O_LAYOUT,
                    P_SHIFT=P_SHIFT)


@gluon.jit
def _fp8_consumer0(O, LSE, qk_scale, v_descale, q_smem, q_bars, ring, turns, bh, m0, full, n_tiles, N_Q, N_KV,
                   CAUSAL: gl.constexpr, OVERLAP: gl.constexpr, PINGPONG: gl.constexpr, RING: gl.constexpr,
                   RESCALE_THRESHOLD: gl.constexpr, EMULATED_COLUMNS: gl.constexpr):
    """The default partition: consumer warpgroup 0."""
    P_SHIFT: gl.constexpr = _PEAK_SHIFT - RESCALE_THRESHOLD
    _fp8_consumer(0, O, LSE, qk_scale, v_descale, q_smem, q_bars, ring, turns, bh, m0, full, n_tiles, N_Q, N_KV,
                  CAUSAL=CAUSAL, OVERLAP=OVERLAP, PINGPONG=PINGPONG, RING=RING, P_SHIFT=P_SHIFT,
                  RESCALE_THRESHOLD=RESCALE_THRESHOLD, EMULATED_COLUMNS=EMULATED_COLUMNS)


@gluon.jit
def _fp8_consumer1(O, LSE, qk_scale, v_descale, q_smem, q_bars, ring, turns, bh, m0, full, n_tiles, N_Q, N_KV,
                   CAUSAL: gl.constexpr, OVERLAP: gl.constexpr, PINGPONG: gl.constexpr, RING: gl.constexpr,
                   RESCALE_THRESHOLD: gl.constexpr, EMULATED_COLUMNS: gl.constexpr):
    """A worker partition of 4 warps: consumer warpgroup 1, the next 64 query rows."""
    ROWS: gl.constexpr = q_smem.shape[1]
    P_SHIFT: gl.constexpr = _PEAK_SHIFT - RESCALE_THRESHOLD
    _fp8_consumer(1, O, LSE, qk_scale, v_descale, q_smem, q_bars, ring, turns, bh, m0 + ROWS, full, n_tiles, N_Q,
                  N_KV, CAUSAL=CAUSAL, OVERLAP=OVERLAP, PINGPONG=PINGPONG, RING=RING, P_SHIFT=P_SHIFT,
                  RESCALE_THRESHOLD=RESCALE_THRESHOLD, EMULATED_COLUMNS=EMULATED_COLUMNS)


@gluon.jit(do_not_specialize=["N_Q", "N_KV"])
def _fa3_fp8_kernel(q_desc, k_desc, v_desc, O, LSE, Q_DESCALE, K_DESCALE, V_DESCALE, qk_scale, N_Q, N_KV,
                    CAUSAL: gl.constexpr, RING: gl.constexpr, OVERLAP: gl.constexpr, PINGPONG: gl.constexpr,
                    PRODUCER_REGS: gl.constexpr, CONSUMER_REGS: gl.constexpr,
                    RESCALE_THRESHOLD: gl.constexpr, EMULATED_COLUMNS: gl.constexpr):
    """v8c_fp8 (OVERLAP and PINGPONG off) and v8e_fp8 (both on), and the v9 stages on v8c_fp8 (P_SHIFT,
    RESCALE_THRESHOLD, EMULATED_COLUMNS): two consumer warpgroups (the default partition and a worker, 4 warps
    each) and a producer warpgroup that loads and transposes V; launch with num_warps=4.
    A program takes 128 query rows of one (batch, head) ``bh``; descales are read at ``bh`` (q, k, v share the
    head: no grouped-query attention)."""
    ROWS: gl.constexpr = q_desc.block_type.shape[0]
    HEAD_DIM: gl.constexpr = q_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[0]
    BLOCK_M: gl.constexpr = ROWS * 2

    pid_m = gl.program_id(0)
    if CAUSAL:
        pid_m = gl.num_programs(0) - 1 - pid_m
    bh = gl.program_id(1)
    m0 = pid_m * BLOCK_M
    full, n_tiles = _key_tiles(m0, N_KV, CAUSAL=CAUSAL, ROWS=BLOCK_M, BLOCK_N=BLOCK_N)
    qk_scale = qk_scale * gl.load(Q_DESCALE + bh) * gl.load(K_DESCALE + bh)
    v_descale = gl.load(V_DESCALE + bh)

    vt_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([HEAD_DIM, BLOCK_N], gl.float8e4nv)
    q_smem = gl.allocate_shared_memory(q_desc.dtype, [2, ROWS, HEAD_DIM], q_desc.layout)
    k_smem = gl.allocate_shared_memory(k_desc.dtype, [RING, BLOCK_N, HEAD_DIM], k_desc.layout)
    v_stage = gl.allocate_shared_memory(v_desc.dtype, [RING, BLOCK_N, HEAD_DIM], v_desc.layout)
    vt_smem = gl.allocate_shared_memory(v_desc.dtype, [RING, HEAD_DIM, BLOCK_N], vt_layout)
    q_bars = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [RING, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [RING, 1], mbarrier.MBarrierLayout())
    v_landed = gl.allocate_shared_memory(gl.int64, [RING, 1], mbarrier.MBarrierLayout())
    vt_ready = gl.allocate_shared_memory(gl.int64, [RING, 1], mbarrier.MBarrierLayout())
    vt_empty = gl.allocate_shared_memory(gl.int64, [RING, 1], mbarrier.MBarrierLayout())
    turns = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for w in gl.static_range(2):
        mbarrier.init(q_bars.index(w), count=1)
        mbarrier.init(turns.index(w), count=1)
    for i in gl.static_range(RING):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(v_landed.index(i), count=1)
        mbarrier.init(vt_ready.index(i), count=1)
        mbarrier.init(k_empty.index(i), count=2)  # both consumer warpgroups free the slot
        mbarrier.init(vt_empty.index(i), count=2)
    # What the consumers read: K and V^T, as fa3's K/V ring (the V staging slots are the producer's alone).
    ring = _Ring(k_smem, vt_smem, k_ready, k_empty, vt_ready, vt_empty)

    # The argument tuples are written out in each call (fa3._fa3_ws_kernel says why: constexprs stay constexprs).
    q_row = bh * N_Q + m0
    kv_row = bh * N_KV
    gl.warp_specialize([
        (_fp8_consumer0, (O, LSE, qk_scale, v_descale, q_smem, q_bars, ring, turns, bh, m0, full, n_tiles, N_Q,
                          N_KV, CAUSAL, OVERLAP, PINGPONG, RING, RESCALE_THRESHOLD, EMULATED_COLUMNS)),
        (_fp8_consumer1, (O, LSE, qk_scale, v_descale, q_smem, q_bars, ring, turns, bh, m0, full, n_tiles, N_Q,
                          N_KV, CAUSAL, OVERLAP, PINGPONG, RING, RESCALE_THRESHOLD, EMULATED_COLUMNS)),
        (_producer, (q_desc, k_desc, v_desc, q_smem, q_bars, ring, v_stage, v_landed, q_row, kv_row, n_tiles, 2,
                     RING)),
    ], [4, 4], [CONSUMER_REGS, PRODUCER_REGS])


# ------------------------------------------------------------------------------------------ stages and host
@dataclass(frozen=True)
class Stage:
    """One FP8 stage: its switches of ``_fa3_fp8_kernel``, what it adds and what it was expected to do before it
    ran on a GPU (tiles, ring and register budgets are the module's, the same for every stage)."""

    name: str
    adds: str
    expected: str
    overlap: bool = False
    pingpong: bool = False
    # FlashAttention-4's softmax (v9a_fp8, v9b_*_fp8): off in v8c_fp8 and v8e_fp8, whose compiled code they leave
    p_shift: int = P_SHIFT  # P is quantised as p * 2^p_shift (the kept row max lands on 2^p_shift)
    rescale_threshold: float = 0.0  # keep a row's max while a tile raises it by at most this (log2 units)
    emulated_columns: int = 0  # columns of each key tile whose exponentials are computed on the FMA units
    builds_on: str = ""  # the FP8 stage this one changes: its timing baseline

    def __post_init__(self):
        block_n = min(BLOCK_N.values())
        if self.emulated_columns % 8 or not 0 <= self.emulated_columns <= block_n:
            raise ValueError(f"stage {self.name}: emulated_columns={self.emulated_columns} must be a multiple of 8 "
                             f"(a thread's columns of a wgmma tile come in groups of 8) from 0 to the key tile, "
                             f"{block_n}")
        if self.rescale_threshold and self.rescale_threshold < 1:
            raise ValueError(f"stage {self.name}: rescale_threshold={self.rescale_threshold} must be 0 (off) or at "
                             "least 1 (log2 units): fa3._rescale_when_moved tells a moved row by its alpha < 0.5")
        if (self.rescale_threshold or self.emulated_columns) and self.overlap:
            raise ValueError(f"stage {self.name}: FlashAttention-4's switches are wired into v8c_fp8's loop "
                             "(overlap=False), the FP8 stage measured on a GPU; build on it")
        if not (isinstance(self.p_shift, int) and 0 <= self.p_shift <= 8):
            raise ValueError(f"stage {self.name}: p_shift={self.p_shift!r} must be a whole number from 0 to 8: "
                             "P's row max, 2^p_shift, must be exact and below e4m3's largest value, 448")
        peak = self.rescale_threshold + self.p_shift  # log2 of the largest P the kernel can quantise
        if peak >= math.log2(FP8_MAX):
            raise ValueError(f"stage {self.name}: rescale_threshold={self.rescale_threshold:g} with p_shift="
                             f"{self.p_shift} lets P reach 2^{peak:g}, above e4m3's largest value {FP8_MAX:g} "
                             f"(2^{math.log2(FP8_MAX):.2f}): the largest weights would saturate while l counts "
                             "them whole. Keep rescale_threshold + p_shift <= 8 (FlashAttention-4 takes no "
                             "threshold in FP8)")
        if self.p_shift != P_SHIFT - self.rescale_threshold:
            raise ValueError(f"stage {self.name}: p_shift={self.p_shift} must be {P_SHIFT} - rescale_threshold = "
                             f"{P_SHIFT - self.rescale_threshold:g}: the kernel derives its shift that way, so that "
                             "P's largest value stays 2^8")

    def constexprs(self, causal: bool) -> dict:
        """The kernel's compile-time arguments."""
        return {"CAUSAL": bool(causal), "RING": RING, "OVERLAP": self.overlap, "PINGPONG": self.pingpong,
                "PRODUCER_REGS": PRODUCER_REGS, "CONSUMER_REGS": CONSUMER_REGS,
                "RESCALE_THRESHOLD": float(self.rescale_threshold), "EMULATED_COLUMNS": self.emulated_columns}


STAGES = {
    s.name: s
    for s in (
        Stage("v8c_fp8", "v8c's design in FP8: a producer warpgroup loads K and V by TMA and transposes V tiles "
              "through registers; two consumer warpgroups, P as e4m3 p * 2^8",
              "1.0-1.3x cuDNN's fp16 forward at D = 128 (measured on the H200, 2026-12-01: 1.04-1.25x)"),
        Stage("v8e_fp8", "v8e's schedule in FP8: QK^T(j) issued with P(j-1) V(j-1) and softmax(j) under that "
              "product (intra-warpgroup overlap, the exponentials kept between the two waits in the SASS), the "
              "two warpgroups taking turns at the tensor cores (ping-pong)",
              "D = 128: 1.2-1.4x v8c_fp8, about 1.3-1.7x cuDNN's fp16 (>= 1.5x likeliest at N >= 8192, "
              "non-causal); D = 64: 1.1-1.3x v8c_fp8. In FP8 a tile's exponentials take the MUFU units about as "
              "long as its two products take the tensor cores (D = 128), and v8c_fp8 runs them one after the "
              "other",
              overlap=True, pingpong=True),
    )
}
DEFAULT_STAGE = "v8c_fp8"  # fa3_fp8_forward's: the stage measured so far

# FlashAttention-4's stages in FP8 (v9), kept apart from STAGES (gpu_fa3_fp8.py's default run) as fa3.py keeps
# its v9 stages: benchmarks/gpu_fa4_stages.py --fp8-only measures them. Each builds on v8c_fp8 (the module
# docstring gives the threshold's arithmetic).
FA4_STAGES = {
    s.name: s
    for s in (
        Stage("v9a_fp8", "FlashAttention-4's conditional rescaling in FP8: a row keeps its max while a tile raises "
              "it by at most 2 (log2 units), P quantised as p * 2^6 so that it stays within 2^8 = 256 < 448; the "
              "output rescaled only when some row of the warpgroup moved its max",
              "+0-1% over v8c_fp8: at the largest threshold FP8 leaves room for (2, not 16-bit's 8) a warpgroup "
              "still rescales most tiles (lesson 14 counts them), and what it skips is one multiply an output "
              "element a tile",
              p_shift=6, rescale_threshold=2.0, builds_on="v8c_fp8"),
        Stage("v9b_1of16_fp8", "FlashAttention-4's software exp2 in FP8 on 1/16 of the scores: the first 8 columns "
              "of each 128-key tile through fa3's degree-3 polynomial on the FMA units, the rest on MUFU.EX2",
              "+0-3% over v8c_fp8: in FP8 the exponentials take MUFU about as long as a tile's two products take "
              "the tensor cores (D = 128), and v8c_fp8 runs them one after the other; the 16-bit v9b_1of16 ran "
              "0.90-1.06x its base on an H100 (docs/KERNELS.md, v9)",
              emulated_columns=8, builds_on="v8c_fp8"),
        Stage("v9b_1of4_fp8", "v9b_1of16_fp8 on 1/4 of the scores (the first 32 columns of each key tile)",
              "-5% to +5% against v8c_fp8: more exponentials off MUFU, but the FMA units carry the rest of the "
              "softmax; the 16-bit v9b_1of4 ran 0.79-0.98x its base on an H100 (docs/KERNELS.md, v9)",
              emulated_columns=32, builds_on="v8c_fp8"),
    )
}


def _smem_layout(rows: int, head_dim: int):
    return gl.NVMMASharedLayout.get_default_for([rows, head_dim], gl.float8e4nv)


def tensor_descriptor_signature(rows: int, head_dim: int) -> str:
    """The signature type of an e4m3 Gluon TensorDescriptor argument of this block (compiling without a GPU)."""
    return f"tensordesc<fp8e4nv[{rows},{head_dim}],{_smem_layout(rows, head_dim)!r}>"


def constexprs(causal: bool, stage: str = DEFAULT_STAGE) -> dict:
    """The kernel's compile-time arguments for ``stage`` (a name in ``STAGES`` or ``FA4_STAGES``)."""
    return _stage(stage).constexprs(causal)


def options() -> dict:
    return {"num_warps": NUM_WARPS}


def kernel_signature(head_dim: int, out_dtype: torch.dtype = torch.bfloat16, causal: bool = False,
                     stage: str = DEFAULT_STAGE):
    """(signature, constexprs) of ``stage``'s kernel, as ``triton.compile`` takes them."""
    block_n = BLOCK_N[head_dim]
    out = {torch.float16: "fp16", torch.bfloat16: "bf16"}[out_dtype]
    signature = {"q_desc": tensor_descriptor_signature(ROWS, head_dim),
                 "k_desc": tensor_descriptor_signature(block_n, head_dim),
                 "v_desc": tensor_descriptor_signature(block_n, head_dim),
                 "O": f"*{out}", "LSE": "*fp32", "Q_DESCALE": "*fp32", "K_DESCALE": "*fp32", "V_DESCALE": "*fp32",
                 "qk_scale": "fp32", "N_Q": "i32", "N_KV": "i32"}
    consts = constexprs(causal, stage)
    signature.update({key: "constexpr" for key in consts})
    return signature, consts


def _descale(d, name: str, batch: int, heads: int, device) -> torch.Tensor:
    if d is None:
        return torch.ones((batch, heads), dtype=torch.float32, device=device)
    if not isinstance(d, torch.Tensor) or tuple(d.shape) != (batch, heads) or d.dtype != torch.float32:
        got = f"{tuple(d.shape)} {d.dtype}" if isinstance(d, torch.Tensor) else type(d).__name__
        raise ValueError(f"{name} is {got}: fa3_fp8_forward expects ({batch}, {heads}) float32, one factor per "
                         "(batch, head), as flashcourse.kernels.fp8.quantize_fp8 returns it")
    if d.device != device:
        raise ValueError(f"{name} is on {d.device} but q is on {device}: put the descales on q's device")
    return d.contiguous()


def check_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out_dtype=torch.bfloat16) -> None:
    """What fa3_fp8_forward takes, or a ValueError saying what to use instead."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise ValueError(f"fa3_fp8_forward takes q, k, v of shape (B, H, N, D); {name} is not")
    if q.dtype != FP8 or k.dtype != FP8 or v.dtype != FP8:
        raise ValueError(f"fa3_fp8_forward takes float8_e4m3fn q, k, v (got {q.dtype}, {k.dtype}, {v.dtype}): "
                         "quantise them with flashcourse.kernels.fp8.quantize_fp8, or use fa3.fa3_forward for "
                         "float16 / bfloat16")
    if k.shape != v.shape or q.shape[:2] != k.shape[:2] or q.shape[3] != k.shape[3]:
        raise ValueError(f"fa3_fp8_forward needs q (B, H, N_q, D), k and v (B, H, N_kv, D) with the same B, H, D "
                         f"(got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}); for grouped-query "
                         "attention use flashcourse.kernels.fp8.flash_attention_forward_fp8")
    if q.shape[3] not in HEAD_DIMS:
        raise ValueError(f"fa3_fp8_forward takes head dims {HEAD_DIMS} (got {q.shape[3]}); "
                         "use flashcourse.kernels.flash_attention in float16 / bfloat16 for the others")
    if out_dtype not in OUT_DTYPES:
        raise ValueError(f"out_dtype is {out_dtype}: fa3_fp8_forward returns torch.bfloat16 or torch.float16")
    if not (q.is_contiguous() and k.is_contiguous() and v.is_contiguous()):
        raise ValueError("fa3_fp8_forward reads q, k, v as contiguous (B, H, N, D) tensors through TMA and "
                         "transposes V itself: pass v as it comes (v.contiguous(), not a keys-adjacent view such as "
                         "fp8.v_keys_contiguous makes), or use flashcourse.kernels.fp8.flash_attention_forward_fp8, "
                         "which takes any strides")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v are on {q.device}, {k.device}, {v.device}: put them on one device")


def require_hopper(q: torch.Tensor) -> None:
    """sm_90 only (the kernel is written for Hopper's wgmma and setmaxnreg), or a ValueError naming the FP8
    kernel that runs elsewhere."""
    if not q.is_cuda or torch.cuda.get_device_capability(q.device) != (9, 0):
        where = f"compute capability {torch.cuda.get_device_capability(q.device)}" if q.is_cuda else "the CPU"
        raise ValueError(f"fa3_fp8_forward is written for Hopper (sm_90: H100, H200), not {where}: use "
                         "flashcourse.kernels.fp8.flash_attention_forward_fp8 on sm_89 and newer")


def fa3_fp8_forward(q8: torch.Tensor, k8: torch.Tensor, v8: torch.Tensor, q_descale=None, k_descale=None,
                    v_descale=None, *, causal: bool = False, scale: float | None = None,
                    out_dtype: torch.dtype = torch.bfloat16,
                    stage: str = DEFAULT_STAGE) -> tuple[torch.Tensor, torch.Tensor]:
    """FP8 forward on the v8 design: q8, k8, v8 float8_e4m3fn (B, H, N, D) as passed (V is transposed inside the
    kernel, no copy), descales (B, H) float32 (None = 1). Returns (o in ``out_dtype``, lse float32, natural log).
    ``stage``: a name in ``STAGES`` or ``FA4_STAGES``. Hopper only; see ``check_inputs`` and ``require_hopper``."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    _stage(stage)
    check_inputs(q8, k8, v8, out_dtype)
    batch, heads, n_q, head_dim = q8.shape
    n_kv = k8.shape[2]
    descales = [_descale(d, name, batch, heads, q8.device)
                for d, name in ((q_descale, "q_descale"), (k_descale, "k_descale"), (v_descale, "v_descale"))]
    require_hopper(q8)
    o = torch.empty((batch, heads, n_q, head_dim), dtype=out_dtype, device=q8.device)
    lse = torch.empty((batch, heads, n_q), device=q8.device, dtype=torch.float32)
    if n_q == 0 or batch * heads == 0:
        return o, lse
    if n_kv == 0:
        return o.zero_(), lse.fill_(float("-inf"))
    scale = 1.0 / math.sqrt(head_dim) if scale is None else float(scale)
    block_n = BLOCK_N[head_dim]

    def describe(t: torch.Tensor, n: int, block_rows: int):
        flat = t.view(batch * heads * n, head_dim)
        return TensorDescriptor(flat, list(flat.shape), list(flat.stride()), [block_rows, head_dim],
                                _smem_layout(block_rows, head_dim))

    grid = (triton_cdiv(n_q, ROWS * CONSUMERS), batch * heads)
    _fa3_fp8_kernel[grid](describe(q8, n_q, ROWS), describe(k8, n_kv, block_n), describe(v8, n_kv, block_n), o, lse,
                          descales[0], descales[1], descales[2], scale * _LOG2E, n_q, n_kv,
                          **constexprs(bool(causal), stage), **options())
    return o, lse


def _stage(name: str) -> Stage:
    """An FP8 stage of v8 (STAGES) or v9 (FA4_STAGES) by name."""
    stage = STAGES.get(name) or FA4_STAGES.get(name)
    if stage is None:
        raise ValueError(f"stage {name!r}: expected one of {sorted(STAGES) + sorted(FA4_STAGES)}")
    return stage
