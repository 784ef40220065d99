"""Backward b8: FlashAttention-3's backward at head dim 256 in Gluon, the two consumer warpgroups splitting the head
dim of dK and dV (Triton >= 3.9).

Why a kernel of its own. b7 (``fa3_backward_tma.py``) splits a program's 128 keys between its two consumer
warpgroups and each keeps its 64 x D slices of dK and dV in float32 registers for the whole walk: at D = 256 that is
2 x 64 x 256 / 128 = 256 registers a thread for the accumulators alone, more than the 240 that ``setmaxnreg`` can give
two consumer warpgroups beside a loader warpgroup. FlashAttention-3 at head dim 256 (Dao-AILab/flash-attention,
``hopper/flash_bwd_launch_template.h``, ``run_mha_bwd_hdim256``, sm_90 branch, read at commit 0251105 of
2026-08-15) launches its backward with kBlockM = 64 queries, kBlockN = 80 keys, two MMA warpgroups, ``SdP_swapAB``
off and ``dKV_swapAB``, ``dQ_swapAB`` on, one dO stage and one dS stage; in
``hopper/mainloop_bwd_sm90_tma_gmma_ws.hpp`` (``CollectiveMainloopBwdSm90``) that makes each warpgroup compute S
and dP for half of the keys, P and dS go through shared memory to both, and dK, dV (computed transposed, so that the
head dim is the wgmma's M) and dQ are split between the warpgroups **by head-dim columns**: 80 keys x 128 columns of
each of dK and dV a warpgroup, 160 registers. b8 takes that split, and departs from FA3 in two places:

- kBlockN = 80 is not a power of two, and a Gluon tensor's dims must be: b8 takes 64 keys a program (32 for each
  warpgroup's S and dP). With 64 keys wgmma's M = 64 fits dK and dV untransposed (keys as rows, a warpgroup's
  128 columns as N = 128), so b8 needs no swapAB: dV_w = P^T dO[:, cols_w], dK_w = dS^T Q[:, cols_w], each
  64 x 128 float32, 64 + 64 = 128 registers a thread.
- At D = 256 FA3 does **not** add dQ by TMA: ``dQacc_use_TMA = kHeadDim < 256``; it slices the dQ product in two
  halves (``Slice_dQKV_Mma``) and adds each half to global float32 with vector ``atomicAdd`` from the math warps,
  because the float32 dQ tile would not fit shared memory beside its K, V, Q, dO, P and dS. b8 keeps b7's TMA
  reduce-add from a writer warp (``tma.async_atomic_add``, what lifted b7 past b6) and makes it fit by taking FA3's
  other shared-memory savings (one dO buffer beside two Q buffers) and handing dQ to the writer in 64 x 64 float32
  chunks, one buffer a warpgroup.

The design (one Gluon program per 64 keys of one (batch, head); a step is one tile of 64 query rows):

- a **loader warp** brings K and V once (as two 32-key halves: b7's copies), then each query tile's Q with its lse
  (log2 units) and Delta into a two-slot ring, and its dO into a one-slot buffer of its own (FA3's ``Stages_dO = 1``
  at D = 256), freed by the consumers as soon as their dV product has read it;
- **consumer warpgroup w** (w = 0, 1; 240 registers a thread after ``setmaxnreg``) computes S_w = Q K_w^T and
  dP_w = dO V_w^T for its 32 keys (64 x 32, N = 32), P_w = exp2(S_w log2(e) scale - lse2) and dS_w = P_w (dP_w -
  Delta), and writes both, in 16 bits, into its 32 columns of the step's P and dS tiles (64 queries x 64 keys) in
  shared memory, each followed by an mbarrier of two arrivals (``p_ready``, ``ds_ready``); then, reading **both**
  halves: dV_w += P^T dO[:, cols_w], dK_w += dS^T Q[:, cols_w] and dQ[:, cols_w] = dS K[:, cols_w] with cols_w =
  [128 w, 128 w + 128). P and dS are double-buffered, so the arrival of the other warpgroup at step i+1 proves it is
  done reading step i's (the argument of b7's dS buffers);
- dQ[:, cols_w] is computed in two 64-column chunks (32 registers each; b8b: four of 32 columns, two buffers), each
  stored to the warpgroup's float32 chunk buffer and handed to a **writer warp** that adds it to the float32 dQ
  buffer with one TMA reduce-add (as b7's writer, per chunk); a small kernel scales it into dQ's dtype (b6's
  convert). lse and Delta are b7b's: padded per head by ``_b7_stats_kernel``, brought by 1-D TMA copies.

Reused by import: b7's host side (``BackwardPlan``: the preprocess, TMA descriptors, dQ convert, launches), b7's
``_Stats`` bundle, b6's query-tile ranges (``_query_tiles``) and dK/dV store (``_store_dkdv``, which
now takes a tile narrower than a row), the input checks (b7's with ``head_dims``).

What a step costs (one 64-key program, one 64-row query tile, both warpgroups; H100 SXM: 989 TFLOP/s dense 16-bit
over 132 SMs, 7.5 TFLOP/s an SM):

- **Products**: 5 x 2 x 64 x 64 x 256 = 10.5 MFLOP, 1.40 us at the tensor rate. Two of the five (S, dP: 40% of the
  FLOPs) run at N = 32; b7's docstring counts such a wgmma at half rate, which would make the ceiling
  1 / (0.6 + 2 x 0.4) = 71% of the tensor rate, about 700 TFLOP/s. dV and dK run at N = 128, dQ at N = 64.
- **Bytes**: Q and dO in, 2 x 64 x 256 x 2 = 64 KB (L2 hits after a head's first program), lse and Delta 512 B;
  dQ out, 64 x 256 x 4 = 64 KB of reduce-adds into L2. 10.5 MFLOP over 128 KB: 80 FLOP a byte, half b7's 160
  (b7's 128-key programs share each Q, dO tile between twice the keys, and its 32-row dQ tiles are half as wide).
  Against the L2's estimated 5.5 TB/s that allows about 440 TFLOP/s: **the L2 is the likelier ceiling**, not the
  tensor cores. FA3's 80-key tile is at 100 FLOP a byte for the same reason.
- **Shared memory**: K and V 64 KB, Q ring 2 x 32 KB, dO 32 KB, P and dS 2 x 2 x 8 KB, dQ chunks 2 x 16 KB, lse and
  Delta 2 x 2 x 256 B: 230,400 B; the compiler allocates 230,976 B with the barriers and alignment, under sm_90's
  232,448 (``tests/test_b8_compile.py``). A third Q slot, a second dO slot or a second dQ chunk buffer would not
  fit.
- **Registers**: dK_w and dV_w 128 a thread, S_w and dP_w 16 + 16, P_w and dS_w in 16 bits 8 + 8, lse and Delta 2 + 2
  (S's rows are the queries: a thread holds 2 of them), a dQ chunk 32 after P and dS are dead. Compiled for sm_90
  under Triton 3.9 without spills (the test).
- **Handoffs a step**: two meetings of the warpgroups (P, dS), two dQ chunks a warpgroup through one buffer each
  (the second waits until the writer's TMA unit has read the first), dO freed mid-step.

Prediction (written before any GPU run; Triton 3.9, an H100 80GB, N >= 4096). The course has timed no backward at
D = 256 on an H100. On the H200 (Triton 3.6, 2026-12-02/03) the default backward there, b1 with its D = 256 launch,
ran at 196-208 TFLOP/s, 0.54-0.56x cuDNN's 358-383 (``benchmarks/results/2026-12-03-nvidia-h200-variants.json``,
rows ``head_dim: 256`` and ``head_dim: 256, causal``, mode ``bwd``: providers ``flashcourse`` and ``sdpa_cudnn``,
key ``ratio_vs_sdpa_cudnn``; B = 4, H = 16, N = 8192). So cuDNN's own D = 256 backward is measured by the course,
but only on the H200; the prediction is stated against b1 and cuDNN timed in the same run (``gpu_b7.py``). b8 does
five products where b1 does seven and keeps dK, dV in registers where b1's dK/dV kernel spills at D = 256
(docs/KERNELS.md, "Backward at D = 256"); b7c, the same mechanism at D = 128, ran at 1.13-1.16x b1 and 0.86-0.91x
cuDNN. Expected: **0.75-0.95x cuDNN and 1.35-1.75x b1** (b1 taken at its H200 ratio to cuDNN) at N >= 4096, fp16
and bf16 alike, causal about 5% lower (the diagonal tiles are masked). What would hold it back, most likely first:
the L2 traffic above (80 FLOP a byte; if the rate stops near 400 TFLOP/s whatever else changes, that is the limit,
and a larger key tile is out of reach: FA3's 80 is no power of two, and 128 keys would need 256 registers a thread
for dK and dV again); the single dQ chunk buffer (a consumer waits for the writer's TMA read twice a step); the
N = 32 S and dP products; the single dO buffer (the next dO can load only after both dV products).

Variant b8b (prediction written with b8's, before any GPU run): the same kernel with dQ in 64 x 32 float32 chunks,
two buffers a warpgroup (``STAGES``' ``dq_chunk``, ``dq_buffers``; the same 32 KB, 231,008 B in all, no spills), so
that a consumer writes its next chunk while the writer's TMA unit still reads the last. Expected: b8 within 5%: a
chunk's wait for the writer is a TMA read of 16 KB from shared memory, short beside a 1.4 us step, and b8b pays four
handoffs a step for two; if b8b gains more, the single chunk buffer was a limit.

Variant b8c (prediction written before any GPU run, 2026-12-07): b8 with its dQ chunks in a 32-byte swizzle, b7f's
fix. Each warpgroup stores its 64 x 64 float32 chunk from wgmma's accumulator with 8-byte stores, into the 128-byte
swizzle that b7d's dQ tile had: 2 wavefronts where 1 would do in every instruction (``tests/bank_model.py``; b7d's
per-instruction profile charged exactly that store). Counted for the causal profile of 2026-12-07 (4, 16, 8192):
32 extra wavefronts a warp a chunk x 2 chunks x 8 warps x 64.5 steps on average x 8,192 programs = 271 million of
the 400 million conflicts Nsight Compute counted in b8 (cuDNN's kernel: 50 million). A step's extra wavefronts,
512 an SM, are about 8% of a step's cycles at b8's 375 TFLOP/s (10.5 million FLOP a step: about 6,500 cycles at
1.755 GHz), partly hidden behind the tensor cores. Under the 32-byte swizzle TMA copies columns 32 bytes wide, so
the writer issues 8 reduce-adds a chunk instead of 2 (b7f, the same change at D = 128, ran at 0.97-0.98x b7e, which
removed the conflict without it). Expected: **b8c 1.03-1.08x b8** at N >= 4096, causal and not, fp16 and bf16; the
same registers and shared memory.

Variant b8d (prediction written before any GPU run, 2026-12-07): b8 with b7g's fix. b8 keeps P in 16 bits and widens
it for dS, so its bfloat16 SASS has one F2F.BF16.F32 beside each MUFU.EX2 (64 each), at the exponentials' rate (16 a
clock an SM) and by b7g's reading on their unit, where float16's roundings are paired on the ALUs. A step's 4,096
exponentials (two warpgroups of 64 queries x 32 keys) take 256 cycles of that pipe and the roundings 256 more, about
4% of a step's 6,500 cycles, and the quick run of 2026-12-07 timed b8 at 375 / 358 TFLOP/s in bf16 (non-causal /
causal) against 380 / 359 in fp16: little to win. Expected: **b8d 1.00-1.03x b8** in bf16, fp16 b8 within 2%.

Layout contract (b7's): q, k, v, o, do (B, H, N, 256) contiguous, one dtype (float16 / bfloat16), no GQA; lse
(B, H, N_q) float32 natural log; ``causal=True`` top-left. ``benchmarks/gpu_b7.py --variants b8,b8b`` checks and
times them.

Measured (an H100 80GB, Triton 3.9.0, 2026-12-07; docs/KERNELS.md, "Backward b8 at head dim 256"): b8 ran at
1.45-1.99x b1 and 0.85-1.05x cuDNN from N = 1024 to 16384, fp16 and bf16, causal and not, above its prediction, and
its gradients passed every check (N = 1 to 4096); b8b was 6% slower to 3% faster than b8, as predicted; b8d
1.00-1.04x b8 in bf16 (fp16 the same code), 0.93-1.05x cuDNN by length. So ``plan.gluon_backward`` routes D = 256
here, to b8d, from N = 1024 (and 65,536 query rows, ``plan.B7_MIN_ROWS``) under a Triton in ``TESTED_TRITON``.
"""

# No ``from __future__ import annotations``: Gluon's ``aggregate`` checks each field against its annotation.
from dataclasses import dataclass

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from .fa3 import _mma_layout, _tma_load, aggregate, tensor_descriptor_signature
from .fa3_backward import _query_tiles, _store_dkdv
from .fa3_backward_tma import HAS_TMA_REDUCE as HAS_TMA_REDUCE  # dQ's reduce-add is b7's: the dispatch asks here
from .fa3_backward_tma import PREPARED_TRITON as PREPARED_TRITON  # its launches are b7's BackwardPlan's
from .fa3_backward_tma import BackwardPlan, _bf16_pairs, _Stats, _stats_layout
from .fa3_backward_tma import check_inputs as _check_b7_inputs

# The Triton releases (major.minor) under which b8's gradients were checked on a GPU (gpu_b7.py), where the dispatch
# (plan.gluon_backward) may route D = 256 here.
TESTED_TRITON = ("3.9",)
HEAD_DIMS = (256,)
CONSUMERS = 2  # consumer warpgroups, each owning HEAD_DIM / 2 columns of dK, dV and dQ
KEYS = 64  # keys a program (FA3's kBlockN is 80, not a power of two)
HALF_KEYS = KEYS // CONSUMERS  # keys of one warpgroup's S and dP (and of each K, V copy)
BLOCK_M = 64  # query rows a step (FA3's kBlockM at D = 256)
_CONSUMERS_C = gl.constexpr(CONSUMERS)
_PDS_BUFFERS_C = gl.constexpr(2)  # P and dS: step i+1 writes while the other warpgroup may still read step i's


@aggregate
class _Bounds:
    """What a step's masks and exponentials read: N_Q and N_KV, ``qk_scale`` (the softmax scale times log2(e));
    ``paired_p``: a bfloat16 P is rounded two values an instruction (b8d, b7g's ``_bf16_pairs``)."""

    N_Q: gl.tensor
    N_KV: gl.tensor
    qk_scale: gl.tensor
    paired_p: gl.constexpr

    @gluon.constexpr_function  # runs while the kernel is traced: it only names the values
    def __init__(self, N_Q, N_KV, qk_scale, paired_p):
        self.N_Q = N_Q
        self.N_KV = N_KV
        self.qk_scale = qk_scale
        self.paired_p = gl.constexpr(paired_p)


@aggregate
class _QdOBuffers:
    """Q (with lse and Delta, ``_Stats``) in a ring of STAGES slots and dO in one buffer. The loader arrives on
    ``q_ready.index(s)`` / ``do_ready`` by TMA byte count; each consumer warpgroup on ``q_empty.index(s)`` once its
    step no longer reads slot s, on ``do_empty`` once its dP and dV products have read dO."""

    q_smem: gl.shared_memory_descriptor
    q_ready: gl.shared_memory_descriptor
    q_empty: gl.shared_memory_descriptor
    do_smem: gl.shared_memory_descriptor
    do_ready: gl.shared_memory_descriptor
    do_empty: gl.shared_memory_descriptor

    @gluon.constexpr_function  # runs while the kernel is traced: it only names the values
    def __init__(self, q_smem, q_ready, q_empty, do_smem, do_ready, do_empty):
        self.q_smem = q_smem
        self.q_ready = q_ready
        self.q_empty = q_empty
        self.do_smem = do_smem
        self.do_ready = do_ready
        self.do_empty = do_empty


@aggregate
class _Exchange:
    """What the warpgroups hand each other and the writer. Step i uses buffer b = i % 2 of P and dS
    (``p_smem.index(b)``, ``ds_smem.index(b)``: 64 queries x 64 keys, warpgroup w writes keys [32 w, 32 w + 32)),
    ``p_ready.index(b)`` / ``ds_ready.index(b)`` complete when both halves are in. Warpgroup w's t-th dQ chunk
    (64 rows x the chunk's columns, float32) goes through buffer d = t % DQ_BUFFERS: ``dq_smem.index(2 d + w)``,
    ``dq_full.index(2 d + w)`` / ``dq_empty.index(2 d + w)`` hand it to the writer and back."""

    p_smem: gl.shared_memory_descriptor
    ds_smem: gl.shared_memory_descriptor
    p_ready: gl.shared_memory_descriptor
    ds_ready: gl.shared_memory_descriptor
    dq_smem: gl.shared_memory_descriptor
    dq_full: gl.shared_memory_descriptor
    dq_empty: gl.shared_memory_descriptor

    @gluon.constexpr_function  # runs while the kernel is traced: it only names the values
    def __init__(self, p_smem, ds_smem, p_ready, ds_ready, dq_smem, dq_full, dq_empty):
        self.p_smem = p_smem
        self.ds_smem = ds_smem
        self.p_ready = p_ready
        self.ds_ready = ds_ready
        self.dq_smem = dq_smem
        self.dq_full = dq_full
        self.dq_empty = dq_empty


@gluon.jit
def _b8_step(wg: gl.constexpr, i, dk, dv, k_smem, v_smem, q_tile, do_tile, stats, slot, exchange, rows, m0, keys,
             MASKED: gl.constexpr, CAUSAL: gl.constexpr, S_LAYOUT: gl.constexpr):
    """Step i of warpgroup ``wg`` (query rows [m0, m0 + 64) in ring slot ``slot``; the caller waited for Q and dO):
    S, dP and P, dS for this warpgroup's 32 keys, handed over; dV, dK and dQ for its 128 columns from both halves.
    ``k_smem``, ``v_smem`` are this warpgroup's 32-key halves and ``do_tile`` dO, each taken in the loop at an index
    the compiler cannot prove constant (``_b8_steps``)."""
    BLOCK: gl.constexpr = q_tile.shape[0]
    HEAD_DIM: gl.constexpr = q_tile.shape[1]
    HALF: gl.constexpr = k_smem.shape[0]  # keys of this warpgroup's S
    COLS: gl.constexpr = HEAD_DIM // _CONSUMERS_C  # dK, dV, dQ columns of this warpgroup
    buf = i % _PDS_BUFFERS_C
    phase = (i // _PDS_BUFFERS_C) & 1
    p_tile = exchange.p_smem.index(buf)  # (queries, keys)
    ds_tile = exchange.ds_smem.index(buf)
    zero = gl.zeros([BLOCK, HALF], gl.float32, S_LAYOUT)
    s = warpgroup_mma(q_tile, k_smem.permute((1, 0)), zero, use_acc=False, is_async=True)
    dp = warpgroup_mma(do_tile, v_smem.permute((1, 0)), zero, use_acc=False, is_async=True)
    s = warpgroup_mma_wait(num_outstanding=1, deps=(s,))
    lse2 = stats.lse_smem.index(slot).load(gl.SliceLayout(1, S_LAYOUT))  # zeros past N_Q (padded per head)
    p = gl.exp2(s * rows.qk_scale - lse2[:, None])
    if MASKED:  # rows past N_Q (the next head's), keys past N_KV and, causal, keys after the query: P = 0
        queries = m0 + gl.arange(0, BLOCK, layout=gl.SliceLayout(1, S_LAYOUT))
        ok = (queries[:, None] < rows.N_Q) & (keys[None, :] < rows.N_KV)
        if CAUSAL:
            ok = ok & (keys[None, :] <= queries[:, None])
        p = gl.where(ok, p, 0.0)
    if rows.paired_p and q_tile.dtype == gl.bfloat16:
        p_half = _bf16_pairs(p)
    else:
        p_half = p.to(q_tile.dtype)
    p_tile.slice(wg * HALF, HALF, dim=1).store(p_half)
    fence_async_shared()  # P written by the threads, read by the tensor cores (the async proxy)
    mbarrier.arrive(exchange.p_ready.index(buf))
    dp = warpgroup_mma_wait(num_outstanding=0, deps=(dp,))
    delta = stats.delta_smem.index(slot).load(gl.SliceLayout(1, S_LAYOUT))
    # dS from P in 16 bits, as dV's product takes it (b7d's choice: P is not live in both widths; dS is rounded to
    # 16 bits before any product reads it anyway)
    ds_tile.slice(wg * HALF, HALF, dim=1).store((p_half.to(gl.float32) * (dp - delta[:, None])).to(q_tile.dtype))
    fence_async_shared()
    mbarrier.arrive(exchange.ds_ready.index(buf))

    col0: gl.constexpr = wg * COLS
    mbarrier.wait(exchange.p_ready.index(buf), phase)  # the other warpgroup's keys of P too
    dv = warpgroup_mma(p_tile.permute((1, 0)), do_tile.slice(col0, COLS, dim=1), dv, is_async=True)
    mbarrier.wait(exchange.ds_ready.index(buf), phase)
    dk = warpgroup_mma(ds_tile.permute((1, 0)), q_tile.slice(col0, COLS, dim=1), dk, is_async=True)
    return dk, dv, buf


@gluon.jit
def _b8_dq(wg: gl.constexpr, i, k_smem, ds_tile, exchange):
    """dQ[:, cols] of step i's tile for this warpgroup's columns, chunk by chunk: dS (both 32-key halves) times the
    matching rows of K, each chunk handed to the writer through the warpgroup's one float32 buffer. (K's slices are
    taken at fixed indices here: their 8 descriptors hoisted cost less than forming them in each step, which spilled
    32 B a thread.)"""
    BLOCK: gl.constexpr = ds_tile.shape[0]
    HALF: gl.constexpr = k_smem.shape[1]
    COLS: gl.constexpr = k_smem.shape[2] // _CONSUMERS_C
    CHUNK: gl.constexpr = exchange.dq_smem.shape[2]
    CHUNKS: gl.constexpr = COLS // CHUNK
    DQ_BUFFERS: gl.constexpr = exchange.dq_smem.shape[0] // _CONSUMERS_C
    DQ_LAYOUT: gl.constexpr = _mma_layout(CHUNK)
    for c in gl.static_range(CHUNKS):
        dq = gl.zeros([BLOCK, CHUNK], gl.float32, DQ_LAYOUT)
        for j in gl.static_range(_CONSUMERS_C):
            dq = warpgroup_mma(ds_tile.slice(j * HALF, HALF, dim=1),
                               k_smem.index(j).slice(wg * COLS + c * CHUNK, CHUNK, dim=1), dq, use_acc=j > 0,
                               is_async=True)
        dq = warpgroup_mma_wait(num_outstanding=0, deps=(dq,))
        handoff = i * CHUNKS + c
        slot = (handoff % DQ_BUFFERS) * _CONSUMERS_C + wg
        # the writer has read what this buffer held last
        mbarrier.wait(exchange.dq_empty.index(slot), ((handoff // DQ_BUFFERS) & 1) ^ 1)
        exchange.dq_smem.index(slot).store(dq)
        fence_async_shared()  # the float32 chunk written by the threads, read by the TMA unit
        mbarrier.arrive(exchange.dq_full.index(slot))


@gluon.jit
def _b8_steps(wg: gl.constexpr, dk, dv, k_smem, v_smem, buffers, stats, exchange, rows, keys, i_lo, i_hi, m_lo,
              MASKED: gl.constexpr, CAUSAL: gl.constexpr, STAGES: gl.constexpr, S_LAYOUT: gl.constexpr):
    """Steps [i_lo, i_hi) of warpgroup ``wg``: wait for Q and dO, compute, free dO once dV has read it, then Q."""
    BLOCK: gl.constexpr = buffers.q_smem.shape[1]
    for i in range(i_lo, i_hi):
        slot = i % STAGES
        # 0 (i, N_Q >= 0), but not to the compiler, and different in each step as far as it knows: K, V and dO sit
        # at fixed addresses, and the wgmma descriptors of the S and dP operands (16 k-steps each of K, V and dO at
        # D = 256) would otherwise be hoisted out of the loop into registers (160 B a thread spilled, Triton 3.9);
        # taken at this index they are formed in each step, as those of the Q ring are.
        here = gl.minimum(i + rows.N_Q, 0)
        mbarrier.wait(buffers.q_ready.index(slot), (i // STAGES) & 1)
        mbarrier.wait(buffers.do_ready, i & 1)
        dk, dv, buf = _b8_step(wg, i, dk, dv, k_smem.index(wg + here), v_smem.index(wg + here),
                               buffers.q_smem.index(slot), buffers.do_smem.index(here), stats, slot, exchange, rows,
                               (m_lo + i) * BLOCK, keys, MASKED=MASKED, CAUSAL=CAUSAL, S_LAYOUT=S_LAYOUT)
        dv = warpgroup_mma_wait(num_outstanding=1, deps=(dv,))  # dV has read dO (dK may still run)
        mbarrier.arrive(buffers.do_empty)
        _b8_dq(wg, i, k_smem, exchange.ds_smem.index(buf), exchange)
        dk = warpgroup_mma_wait(num_outstanding=0, deps=(dk,))
        mbarrier.arrive(buffers.q_empty.index(slot))  # every product of the step has landed: Q no longer read
    return dk, dv


@gluon.jit
def _b8_consumer(wg: gl.constexpr, k_smem, v_smem, kv_bar, buffers, stats, exchange, rows, DK, DV, scale, kv_row, n0,
                 m_lo, full_lo, full_hi, n_m, CAUSAL: gl.constexpr, STAGES: gl.constexpr):
    """Consumer warpgroup ``wg``: S and dP of keys [n0 + 32 wg, n0 + 32 wg + 32), dK, dV of all 64 keys in columns
    [128 wg, 128 wg + 128), every query tile of the program."""
    HALF: gl.constexpr = k_smem.shape[1]
    HEAD_DIM: gl.constexpr = k_smem.shape[2]
    COLS: gl.constexpr = HEAD_DIM // _CONSUMERS_C
    S_LAYOUT: gl.constexpr = _mma_layout(HALF)
    KV_LAYOUT: gl.constexpr = _mma_layout(COLS)
    keys = n0 + wg * HALF + gl.arange(0, HALF, layout=gl.SliceLayout(0, S_LAYOUT))
    dk = gl.zeros([HALF * _CONSUMERS_C, COLS], gl.float32, KV_LAYOUT)
    dv = gl.zeros([HALF * _CONSUMERS_C, COLS], gl.float32, KV_LAYOUT)
    mbarrier.wait(kv_bar, 0)
    dk, dv = _b8_steps(wg, dk, dv, k_smem, v_smem, buffers, stats, exchange, rows, keys, 0, full_lo - m_lo, m_lo,
                       MASKED=True, CAUSAL=CAUSAL, STAGES=STAGES, S_LAYOUT=S_LAYOUT)
    dk, dv = _b8_steps(wg, dk, dv, k_smem, v_smem, buffers, stats, exchange, rows, keys, full_lo - m_lo,
                       full_hi - m_lo, m_lo, MASKED=False, CAUSAL=CAUSAL, STAGES=STAGES, S_LAYOUT=S_LAYOUT)
    dk, dv = _b8_steps(wg, dk, dv, k_smem, v_smem, buffers, stats, exchange, rows, keys, full_hi - m_lo, n_m - m_lo,
                       m_lo, MASKED=True, CAUSAL=CAUSAL, STAGES=STAGES, S_LAYOUT=S_LAYOUT)
    # The head's first row in 64 bits: (B*H*N_KV) x 256 elements pass 2^31 from 8.4 million rows, where a 32-bit
    # element offset (b7's at D = 128: from 16.8 million) would wrap.
    head = kv_row.to(gl.int64) * HEAD_DIM + wg * COLS
    _store_dkdv(dk, dv, DK + head, DV + head, 0, n0, rows.N_KV, scale, HEAD_DIM=HEAD_DIM, KEYS=HALF * _CONSUMERS_C,
                KV_LAYOUT=KV_LAYOUT)


@gluon.jit
def _b8_consumer0(k_smem, v_smem, kv_bar, buffers, stats, exchange, rows, DK, DV, scale, kv_row, n0, m_lo, full_lo,
                  full_hi, n_m, CAUSAL: gl.constexpr, STAGES: gl.constexpr):
    """The default partition: consumer warpgroup 0 (head-dim columns 0-127)."""
    _b8_consumer(0, k_smem, v_smem, kv_bar, buffers, stats, exchange, rows, DK, DV, scale, kv_row, n0, m_lo, full_lo,
                 full_hi, n_m, CAUSAL=CAUSAL, STAGES=STAGES)


@gluon.jit
def _b8_consumer1(k_smem, v_smem, kv_bar, buffers, stats, exchange, rows, DK, DV, scale, kv_row, n0, m_lo, full_lo,
                  full_hi, n_m, CAUSAL: gl.constexpr, STAGES: gl.constexpr):
    """A worker partition of 4 warps: consumer warpgroup 1 (head-dim columns 128-255)."""
    _b8_consumer(1, k_smem, v_smem, kv_bar, buffers, stats, exchange, rows, DK, DV, scale, kv_row, n0, m_lo, full_lo,
                 full_hi, n_m, CAUSAL=CAUSAL, STAGES=STAGES)


@gluon.jit
def _b8_loader(q_desc, k_desc, v_desc, do_desc, lse_desc, delta_desc, k_smem, v_smem, kv_bar, buffers, stats, q_row,
               stat_row, kv_row, n0, m_lo, n_tiles, STAGES: gl.constexpr):
    """The loader warp: K and V once (two 32-key copies each), then per query tile Q with its lse and Delta (one
    transaction on the slot's ``q_ready``) into the ring and dO into its one buffer."""
    HALF: gl.constexpr = k_desc.block_type.shape[0]
    BLOCK: gl.constexpr = q_desc.block_type.shape[0]
    q_bytes: gl.constexpr = q_desc.block_type.nbytes + lse_desc.block_type.nbytes + delta_desc.block_type.nbytes
    mbarrier.expect(kv_bar, _CONSUMERS_C * (k_desc.block_type.nbytes + v_desc.block_type.nbytes))
    for w in gl.static_range(_CONSUMERS_C):
        _tma_load(k_desc, [kv_row + n0 + w * HALF, 0], kv_bar, k_smem.index(w))
        _tma_load(v_desc, [kv_row + n0 + w * HALF, 0], kv_bar, v_smem.index(w))
    for i in range(n_tiles):
        slot = i % STAGES
        row = q_row + (m_lo + i) * BLOCK
        first = stat_row + (m_lo + i) * BLOCK  # 256-byte aligned: whole 64-row tiles per head (padded_stats)
        mbarrier.wait(buffers.q_empty.index(slot), ((i // STAGES) & 1) ^ 1)  # a fresh barrier's phase 1 is done
        mbarrier.expect(buffers.q_ready.index(slot), q_bytes)
        _tma_load(lse_desc, [first], buffers.q_ready.index(slot), stats.lse_smem.index(slot))
        _tma_load(delta_desc, [first], buffers.q_ready.index(slot), stats.delta_smem.index(slot))
        _tma_load(q_desc, [row, 0], buffers.q_ready.index(slot), buffers.q_smem.index(slot))
        mbarrier.wait(buffers.do_empty, (i & 1) ^ 1)
        mbarrier.expect(buffers.do_ready, do_desc.block_type.nbytes)
        _tma_load(do_desc, [row, 0], buffers.do_ready, buffers.do_smem.index(0))


@gluon.jit
def _b8_dq_writer(dq_desc, exchange, dq_row, m_lo, n_tiles, COLS: gl.constexpr):
    """The writer warp: each step's dQ chunks of both warpgroups added to the float32 buffer by TMA reduce-adds
    (the additions run in L2; the warp waits only until the TMA unit has read each chunk, then gives it back)."""
    BLOCK: gl.constexpr = dq_desc.block_type.shape[0]
    CHUNK: gl.constexpr = dq_desc.block_type.shape[1]
    CHUNKS: gl.constexpr = COLS // CHUNK
    DQ_BUFFERS: gl.constexpr = exchange.dq_smem.shape[0] // _CONSUMERS_C
    for i in range(n_tiles):
        row = dq_row + (m_lo + i) * BLOCK
        for c in gl.static_range(CHUNKS):
            handoff = i * CHUNKS + c
            for w in gl.static_range(_CONSUMERS_C):
                slot = (handoff % DQ_BUFFERS) * _CONSUMERS_C + w
                mbarrier.wait(exchange.dq_full.index(slot), (handoff // DQ_BUFFERS) & 1)
                tma.async_atomic_add(dq_desc, [row, w * COLS + c * CHUNK], exchange.dq_smem.index(slot))
                tma.store_wait(0)  # the chunk read from shared memory (the add may still be in flight)
                mbarrier.arrive(exchange.dq_empty.index(slot))
    tma.store_wait(0)


@gluon.jit(do_not_specialize=["N_Q", "N_KV", "N_QPAD"])
def _b8_kernel(q_desc, k_desc, v_desc, do_desc, dq_desc, lse_desc, delta_desc, DK, DV, qk_scale, scale, N_Q, N_KV,
               N_QPAD, CAUSAL: gl.constexpr, STAGES: gl.constexpr, DQ_BUFFERS: gl.constexpr, PAIRED_P: gl.constexpr,
               PRODUCER_REGS: gl.constexpr, CONSUMER_REGS: gl.constexpr):
    """b8: two consumer warpgroups (launch with num_warps=4: the default partition is consumer 0), a loader warp, a
    dQ-writer warp; one program per 64 keys of one (batch, head)."""
    BLOCK: gl.constexpr = q_desc.block_type.shape[0]
    HEAD_DIM: gl.constexpr = q_desc.block_type.shape[1]
    HALF: gl.constexpr = k_desc.block_type.shape[0]
    PDS_LAYOUT: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK, HALF * _CONSUMERS_C], q_desc.dtype)

    pid_n = gl.program_id(0)
    bh = gl.program_id(1)
    n0 = pid_n * (HALF * _CONSUMERS_C)
    kv_row = bh * N_KV
    q_row = bh * N_Q
    dq_row = bh * N_QPAD  # also the first of the head's padded lse and Delta
    m_lo, full_lo, full_hi, n_m = _query_tiles(n0, N_Q, N_KV, CAUSAL=CAUSAL, KEYS=HALF * _CONSUMERS_C, BLOCK_M=BLOCK)

    k_smem = gl.allocate_shared_memory(k_desc.dtype, [_CONSUMERS_C, HALF, HEAD_DIM], k_desc.layout)
    v_smem = gl.allocate_shared_memory(v_desc.dtype, [_CONSUMERS_C, HALF, HEAD_DIM], v_desc.layout)
    q_smem = gl.allocate_shared_memory(q_desc.dtype, [STAGES, BLOCK, HEAD_DIM], q_desc.layout)
    do_smem = gl.allocate_shared_memory(do_desc.dtype, [1, BLOCK, HEAD_DIM], do_desc.layout)  # one buffer
    p_smem = gl.allocate_shared_memory(q_desc.dtype, [_PDS_BUFFERS_C, BLOCK, HALF * _CONSUMERS_C], PDS_LAYOUT)
    ds_smem = gl.allocate_shared_memory(q_desc.dtype, [_PDS_BUFFERS_C, BLOCK, HALF * _CONSUMERS_C], PDS_LAYOUT)
    dq_smem = gl.allocate_shared_memory(gl.float32, [DQ_BUFFERS * _CONSUMERS_C, BLOCK, dq_desc.block_type.shape[1]],
                                        dq_desc.layout)
    stats = _Stats(gl.allocate_shared_memory(gl.float32, [STAGES, BLOCK], lse_desc.layout),
                   gl.allocate_shared_memory(gl.float32, [STAGES, BLOCK], delta_desc.layout))
    kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    q_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    do_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    do_empty = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    p_ready = gl.allocate_shared_memory(gl.int64, [_PDS_BUFFERS_C, 1], mbarrier.MBarrierLayout())
    ds_ready = gl.allocate_shared_memory(gl.int64, [_PDS_BUFFERS_C, 1], mbarrier.MBarrierLayout())
    dq_full = gl.allocate_shared_memory(gl.int64, [DQ_BUFFERS * _CONSUMERS_C, 1], mbarrier.MBarrierLayout())
    dq_empty = gl.allocate_shared_memory(gl.int64, [DQ_BUFFERS * _CONSUMERS_C, 1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_bar, count=1)
    mbarrier.init(do_ready, count=1)
    mbarrier.init(do_empty, count=_CONSUMERS_C)  # both warpgroups' dP and dV have read dO
    for s in gl.static_range(STAGES):
        mbarrier.init(q_ready.index(s), count=1)
        mbarrier.init(q_empty.index(s), count=_CONSUMERS_C)
    for b in gl.static_range(_PDS_BUFFERS_C):
        mbarrier.init(p_ready.index(b), count=_CONSUMERS_C)  # both 32-key halves written
        mbarrier.init(ds_ready.index(b), count=_CONSUMERS_C)
    for d in gl.static_range(DQ_BUFFERS * _CONSUMERS_C):
        mbarrier.init(dq_full.index(d), count=1)
        mbarrier.init(dq_empty.index(d), count=1)

    buffers = _QdOBuffers(q_smem, q_ready, q_empty, do_smem, do_ready, do_empty)
    exchange = _Exchange(p_smem, ds_smem, p_ready, ds_ready, dq_smem, dq_full, dq_empty)
    rows = _Bounds(N_Q, N_KV, qk_scale, PAIRED_P)
    # The argument tuples are written out in each call (a tuple held in a variable loses its constexprs).
    gl.warp_specialize([
        (_b8_consumer0, (k_smem, v_smem, kv_bar, buffers, stats, exchange, rows, DK, DV, scale, kv_row, n0, m_lo,
                         full_lo, full_hi, n_m, CAUSAL, STAGES)),
        (_b8_consumer1, (k_smem, v_smem, kv_bar, buffers, stats, exchange, rows, DK, DV, scale, kv_row, n0, m_lo,
                         full_lo, full_hi, n_m, CAUSAL, STAGES)),
        (_b8_loader, (q_desc, k_desc, v_desc, do_desc, lse_desc, delta_desc, k_smem, v_smem, kv_bar, buffers, stats,
                      q_row, dq_row, kv_row, n0, m_lo, n_m - m_lo, STAGES)),
        (_b8_dq_writer, (dq_desc, exchange, dq_row, m_lo, n_m - m_lo, HEAD_DIM // _CONSUMERS_C)),
    ], [4, 1, 1], [CONSUMER_REGS, PRODUCER_REGS, PRODUCER_REGS])


# ------------------------------------------------------------------------------------------ stage and host
@dataclass(frozen=True)
class Stage:
    """b8's launch: its kernel, Q ring depth and register budgets (the shape ``scripts/fa3_compile.py`` reads)."""

    name: str
    adds: str
    expected: str
    kernel: object
    stages: int = 2  # Q (with lse, Delta) ring depth; dO has one buffer
    dq_chunk: int = 64  # dQ columns a handoff to the writer (64 x 64 float32: 16 KB)
    dq_buffers: int = 1  # chunk buffers a warpgroup
    dq_swizzle: int = 0  # bytes of the dQ chunks' swizzle; 0: the default for the chunk (128), 32 for b8c
    paired_p: bool = False  # a bfloat16 P rounded two values an instruction (b8d, as b7g)
    producer_regs: int = 24  # the loader's and the writer's warps
    consumer_regs: int = 240
    head_dims: tuple[int, ...] = HEAD_DIMS
    stats_by_tma: bool = True  # lse and Delta come by TMA with Q (b7b's switch, always on here)
    lean_regs: bool = True  # dS formed from P in 16 bits (b7d's switch, always on here)

    def keys(self) -> int:
        return KEYS

    def rows(self, head_dim: int) -> int:
        """Query rows a step takes (64 at the one head dim b8 takes)."""
        return BLOCK_M

    def options(self) -> dict:
        return {"num_warps": 4}

    def constexprs(self, causal: bool) -> dict:
        return {"CAUSAL": causal, "STAGES": self.stages, "DQ_BUFFERS": self.dq_buffers, "PAIRED_P": self.paired_p,
                "PRODUCER_REGS": self.producer_regs, "CONSUMER_REGS": self.consumer_regs}


STAGES = {
    "b8": Stage("b8", "FA3's backward at D = 256: 64 keys x 64 queries a step, the two consumer warpgroups split S "
                "and dP by keys and dK, dV, dQ by head-dim columns (128 each), P and dS exchanged through shared "
                "memory; Q in a two-slot ring, dO in one buffer; dQ in 64 x 64 float32 chunks added by TMA "
                "reduce-adds from a writer warp",
                "0.75-0.95x cuDNN, 1.35-1.75x b1 at N >= 4096 (D = 256)", _b8_kernel),
    "b8b": Stage("b8b", "b8 with dQ in 64 x 32 float32 chunks, two buffers a warpgroup (the same 32 KB): a consumer "
                 "writes a chunk while the writer's TMA unit reads the one before",
                 "b8 within 5% (its chunk waits are short beside a 1.4 us step)", _b8_kernel, dq_chunk=32,
                 dq_buffers=2),
    "b8c": Stage("b8c", "b8 with the dQ chunks in a 32-byte swizzle (b7f's fix: the 8-byte stores of the float32 "
                 "chunk conflict-free, 2-way under the 128-byte swizzle); the writer's reduce-add split into 32-byte "
                 "wide copies", "1.03-1.08x b8 at N >= 4096 (D = 256), causal and not", _b8_kernel, dq_swizzle=32),
    "b8d": Stage("b8d", "b8 with a bfloat16 P rounded two values an instruction (b7g's fix: b8's SASS rounds it by "
                 "one F2F per exponential, at the exponentials' rate); float16 code unchanged",
                 "bf16: 1.00-1.03x b8 at N >= 4096 (D = 256); fp16: b8 within 2%", _b8_kernel, paired_p=True),
}
VARIANTS = tuple(STAGES)


def _dq_chunk_layout(chunk: int, swizzle: int = 0):
    """A dQ chunk in shared memory as the writer's TMA reduce-add reads it: the default swizzle for the chunk (128
    bytes) or ``swizzle`` bytes (b8c: 32; TMA then copies 32-byte wide columns)."""
    if not swizzle:
        return gl.NVMMASharedLayout.get_default_for([BLOCK_M, chunk], gl.float32)
    return gl.NVMMASharedLayout(swizzle_byte_width=swizzle, element_bitwidth=32, rank=2)


def kernel_signature(stage: Stage, head_dim: int, dtype: torch.dtype, causal: bool) -> tuple[dict, dict]:
    """(signature, constexprs) of b8's kernel, as ``triton.compile`` takes them."""
    name = {torch.float16: "fp16", torch.bfloat16: "bf16"}[dtype]
    signature = {"q_desc": tensor_descriptor_signature(BLOCK_M, head_dim, dtype),
                 "k_desc": tensor_descriptor_signature(HALF_KEYS, head_dim, dtype),
                 "v_desc": tensor_descriptor_signature(HALF_KEYS, head_dim, dtype),
                 "do_desc": tensor_descriptor_signature(BLOCK_M, head_dim, dtype),
                 "dq_desc": (f"tensordesc<fp32[{BLOCK_M},{stage.dq_chunk}],"
                             f"{_dq_chunk_layout(stage.dq_chunk, stage.dq_swizzle)!r}>"),
                 "lse_desc": f"tensordesc<fp32[{BLOCK_M}],{_stats_layout(BLOCK_M)!r}>",
                 "delta_desc": f"tensordesc<fp32[{BLOCK_M}],{_stats_layout(BLOCK_M)!r}>",
                 "DK": f"*{name}", "DV": f"*{name}", "qk_scale": "fp32", "scale": "fp32", "N_Q": "i32", "N_KV": "i32",
                 "N_QPAD": "i32"}
    constexprs = stage.constexprs(causal)
    signature.update({key: "constexpr" for key in constexprs})
    return signature, constexprs


def check_inputs(q, k, v, o, lse, do) -> None:
    """What b8 takes, or a ValueError saying what to use instead: b7's rules (a Triton with the TMA reduce-add, b6's
    layout) at head dim 256 only."""
    if q.dim() == 4 and q.shape[3] not in HEAD_DIMS:
        raise ValueError(f"b8 takes head dim 256 only (got {q.shape[3]}): b7 (hopper.fa3_backward_tma) takes 64 and "
                         "128, and flashcourse.kernels.flash_attention_backward any head dim")
    _check_b7_inputs(q, k, v, o, lse, do, head_dims=HEAD_DIMS)


def b8_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
                do: torch.Tensor, *, causal: bool = False, scale: float | None = None,
                stage: str = "b8") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) of attention at head dim 256 by b8 (see the module docstring) from the forward's o and
    natural-log lse. ``causal=True`` is top-left aligned. Hopper and Triton >= 3.9 only; ``check_inputs`` says what
    it takes. Each call prepares its launches anew; ``flash_attention`` keeps a plan per layout
    (``backward_plan``)."""
    if stage not in STAGES:
        raise ValueError(f"stage must be one of {', '.join(STAGES)} (got {stage!r})")
    check_inputs(q, k, v, o, lse, do)
    return backward_plan(q, k, causal=causal, scale=scale, stage=stage, prepare=False)(q, k, v, o, lse, do)


def backward_plan(q: torch.Tensor, k: torch.Tensor, *, causal: bool = False, scale: float | None = None,
                  stage: str = "b8", prepare: bool = True) -> BackwardPlan:
    """b8's (or a variant's) launches for calls of q's and k's layout (b7's ``BackwardPlan`` with b8's tiles: 64
    query rows, K and V copied 64 keys at a time as two 32-key halves, dQ added in chunks), inputs already
    checked."""
    spec = STAGES[stage]
    return BackwardPlan(spec, q, k, causal=causal, scale=scale, block_m=BLOCK_M, kv_rows=HALF_KEYS, pad_rows=BLOCK_M,
                        dq_box=(BLOCK_M, spec.dq_chunk), dq_layout=_dq_chunk_layout(spec.dq_chunk, spec.dq_swizzle),
                        stats_pointers=False, prepare=prepare)
