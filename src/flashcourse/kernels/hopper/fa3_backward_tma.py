"""Backward b7: FlashAttention-3's backward design in Gluon, dQ by one TMA reduce-add off the math warps
(Triton >= 3.9).

With S = scale * Q K^T, P = exp(S - lse), Delta = rowsum(dO * O) (the preprocess, as b1 and b6):
    dV = P^T dO      dP = dO V^T      dS = P * (dP - Delta)      dK = scale * dS^T Q      dQ = scale * dS K
FA3's backward (Shah et al. 2024, section 3 and appendix B; ``hopper/mainloop_bwd_sm90_tma_gmma_ws.hpp`` and
``hopper/flash_bwd_kernel_sm90.h`` of Dao-AILab/flash-attention) as one Gluon program per tile of 128 keys:

- two consumer warpgroups own 64 keys each and keep that slice of dK and dV in registers for the whole walk
  (``setmaxnreg``: 240 registers a thread each, the other partitions 24);
- a loader warp brings K and V once, then every (Q, dO) tile that sees the keys into a ring (b6's producer);
- each step runs the five products per warpgroup, keys as rows (as b1 and b6): S^T = K Q^T, dP^T = V dO^T,
  dV += P^T dO, dK += dS^T Q, and dQ; dS^T goes to shared memory once and both dK's and dQ's products read it;
- dQ as FA3 splits it: warpgroup w computes the columns [w D/2, (w+1) D/2) of the tile's whole dQ share from
  **both** warpgroups' dS (so each step waits for the other warpgroup's dS: an mbarrier of two arrivals), into
  a float32 tile in shared memory; a **writer warp** (FA3's dQ-writer role, in the producer warpgroup) adds
  those tiles to a float32 dQ buffer in global memory with ``tma.async_atomic_add`` (PTX
  ``cp.reduce.async.bulk.tensor ... add``: the addition happens in L2, no thread waits for it) and frees the
  tile. dS and the dQ tiles are double-buffered, so a warpgroup computes step i+1 while step i's add is in
  flight. A small kernel scales the buffer into dQ's dtype (b6's convert).

What b7 changes against its predecessors (docs/KERNELS.md, "judged"): b2/b4 added dQ with ``tl.atomic_add``
from the math warps (one instruction per element, issued by the threads that should be multiplying); b5 had
the TMA reduce-add but in plain Triton, issued from the math warps, with no warp specialization; b6c split the
work like b7 but each warpgroup added its own whole share by relaxed atomics (twice the traffic, on the math
warps). b7 moves the addition to a warp of its own and halves it.

Prediction (written before any GPU run; Triton 3.9 on an H100 or H200).
A step (one 128-key tile, one query tile of M rows) costs 5 x 2 x 128 x M x D FLOPs (each of the five products is
2 x 128 x M x D over both warpgroups; the scale and masks are free) and moves 2 x M x D x 2 bytes in (Q, dO, from
L2 after the first program of a head), 8 M bytes of lse and Delta, and M x D x 4 bytes of float32 out (the reduce-
add, half b6c's 2 x M x D x 4). At D = 128, M = 32: 5.2 MFLOP against 16 KB in and 16 KB reduced, 160 FLOP a byte;
at D = 64, M = 64: the same. The H100's SXM tensor rate (989 TFLOP/s dense fp16) over its L2 (about 5.5 TB/s)
allows about 180 FLOP a byte, so the step is near balance against L2 and far above HBM's (3.35 TB/s) only because
Q and dO tiles are shared by a head's programs through L2. The math warps now do only the five products, the
softmax recomputation and the dS arithmetic: the reference is b6c's 0.50-0.64x cuDNN (benchmarks/results/
2026-12-01-nvidia-h200-fa3-backward-stages.json, rows ``fa3-b6c``, n 8192, float16), b1's 0.70-0.82x and cuDNN's
405-522 TFLOP/s (same file, ``b1`` and ``sdpa_cudnn``). Taking the dQ atomics off the math warps and halving them
should recover most of the gap between b6c and the products' own rate: expected 0.85-1.0x cuDNN at N >= 4096
(1.1-1.3x b1), D = 128 nearer the top (its products are longer against the fixed per-step costs); causal about
5% less (the diagonal tiles are masked and half empty). What would limit it, in order of likelihood: the per-step
rendezvous of the two warpgroups (FA3 has it too), the 32-row query tiles at D = 128 (wgmma at M = 64 with N = 32
runs at half its rate on the S^T, dP^T products), register pressure (dK, dV: 128 registers a thread at D = 128).
FA4's 1.06-1.34x cuDNN (measured on an H100 80GB, 2026-12-06) is the goal, not the prediction.

Variants b7b and b7c (the next design step at D = 128; prediction written before any GPU run of them).
b7's first timed run (docs/KERNELS.md, "Backward b7") gave 380-425 TFLOP/s at both head dims: the same rate at
D = 64 and 128, where cuDNN gains at D = 128 (525-545 against 454-461), so the gap is at D = 128. What a step of
b7 costs there (one program of 128 keys, one tile of M = 32 query rows, both warpgroups; H100 SXM):

- **Products**: 5 x 2 x 128 x 32 x 128 = 5.24 MFLOP, 0.70 us at the tensor rate (989 TFLOP/s over 132 SMs).
  Three of the five have N = 32 (S^T = K Q^T and dP^T = V dO^T: 64 keys x 32 queries; dQ^T: 64 columns x 32
  queries), two have N = 128 (dV, dK). Counting an N = 32 wgmma at half rate (as above), 1.12 us: a ceiling of
  62% of the tensor rate, about 620 TFLOP/s. Measured: 14.5 ms for 32 waves of 256 steps (fp16, non-causal,
  (B, H, N) = (4, 16, 8192)), 1.77 us a step, so 0.65 us a step is spent off the tensor cores.
- **Bytes in**: Q and dO, 2 x 32 x 128 x 2 = 16 KB by TMA (L2 hits: a head's programs share them); lse and Delta,
  2 x 32 x 4 = 256 B, but loaded by the math warps, 8 + 8 values a thread (the S^T layout's columns) in both
  warpgroups, at the start of each step and needed after S^T: an L2 round trip (a few hundred cycles, more under
  the reduce-add traffic) that only the S^T and dP^T products (about 500-1,000 cycles for the four of the two
  warpgroups at N = 32) can hide. Exposed: 0-250 cycles of a step's 3,100 (1.755 GHz), 0-8%.
- **Bytes out**: dQ's reduce-add, 32 x 128 x 4 = 16 KB a step, B*H*N*D x 4 = 268 MB a key-tile pass, 64 passes:
  17.2 GB in 14.5 ms, 1.2 TB/s into L2, and the same again of Q and dO read: about 2.4 TB/s, under half of L2's
  estimated 5.5 TB/s. The reduce-adds land in L2 (two heads' float32 dQ, 8 MB, are what 132 programs touch at
  once) and reach HBM about once. Not the limit; cuDNN's backward moves the same float32 dQ.
- **Shared memory**: K, V 64 KB, the (Q, dO) ring 2 x 16 KB, dS 4 x 4 KB, the dQ tiles 4 x 8 KB: 147,936 B, one
  program an SM. A third ring slot adds 16 KB (b7c: 165,136 B; a fourth would still fit in 227 KB).
- **Registers**: 168 a thread at launch, 240 for the consumers after ``setmaxnreg`` (24 for the loader and the
  writer: 2 x 128 x 240 + 128 x 24 = 64,512 of 65,536, so 240 is the most two consumer warpgroups can take).
  dK and dV hold 128 of the 240 at D = 128. With 64-row query tiles (N = 64 for S^T, dP^T and dQ: no product
  left at N = 32, so the 62% ceiling above no longer applies) b7b spills 120 B a thread under Triton 3.9 at
  240 (compiled here, 230,896 B of shared memory): not built, by the rule of no spills.
- **dQ handoff**: b7 already adds dQ from a warp of its own with double-buffered tiles, so a consumer waits on
  ``dq_empty`` only when the writer is two steps behind; a third buffer would cost 16 KB more for a wait not
  yet seen. The profile (``benchmarks/ncu_limits.py``, case ``bwd-b7-d128``) will show whether it happens.

Built: **b7b** brings each tile's lse and Delta by the loader's TMA into shared memory with Q and dO (one
transaction, the slot's ``ready`` barrier counting their bytes: FA3's LSE and dPsum copies), so a consumer reads
them from shared memory (16 loads of about 30 cycles) and issues no global load; **b7c** is b7b with a three-slot
ring. Expected: b7b 1.02-1.08x b7 at D = 128 (0.74-0.90x cuDNN), D = 64 as b7 within 3%; b7c b7b within 3% (the
ring waits only when L2 is slow). b7b is the change expected to pay most of those that compile without spills;
neither reaches cuDNN by this count, which points at the N = 32 products and the off-tensor 0.65 us a step (the
two warpgroups meet every step to exchange dS, so their exp2 and dS arithmetic run at the same time and the
tensor cores wait): the profile of b7 and b7b beside cuDNN's decides the next step.

Variant b7d (the next step at D = 128, after the profile by instruction; prediction written before any GPU run).
The profile (docs/KERNELS.md, "Backward b7") cleared the warpgroups' per-step meeting: b7c's working warps wait at
barriers less than cuDNN's, and most of its ``barrier`` samples are two spare warps of the 12 launched waiting once.
What separates it from cuDNN is shared memory, 1.92e9 wavefronts against 1.38e9 for the same products, and the 32-row
query tiles explain it: S^T = K Q^T, dP^T = V dO^T and dQ^T each read a 64 x 128 K or V operand from shared memory
for 32 queries, and with 64 rows for twice as many. b7b at 64 rows spilled 120 B a thread; the peak of a step is
S^T's and dP^T's accumulators (32 + 32 registers), dK and dV (128), P in 16 bits for dV's product (16) and lse and
Delta, held from the step's start (16 + 16). **b7d** reads each of lse and Delta from shared memory just before
its use and forms dS from P in 16 bits, as dV's product takes it (dS is rounded to 16 bits before any product
reads it, so the answer changes by one more rounding of P, within the tolerance the checks use): 0 spills at
D = 64 and 128 under Triton 3.9, 230,896 B of shared memory at D = 128 with two ring slots (a third would not fit).
Expected at D = 128: the shared-memory reads of the three narrow products halve, about 1.92e9 to 1.3e9 wavefronts,
near cuDNN's, and the N = 32 wgmma (the 62% ceiling above) are gone: 1.05-1.15x b7c, 0.90-1.0x cuDNN. At D = 64 the
tiles are b7b's, so b7c within 3% (one ring slot fewer). What could hold it back: two ring slots where b7c has three
(the loader waits when L2 is slow), and twice the dQ tile (64 x 64 float32) per reduce-add.

Variants b7e and b7f (b7d without its bank conflicts; prediction written before any GPU run of them).
b7d's profile (docs/KERNELS.md, "Backward b7", H100, 2026-12-07) counted 153 million shared-memory bank conflicts
against b7c's 12 million, and 5.0 billion warp-cycles of waits on shared memory against 2.2, without naming the
instructions. Counted exactly from Gluon's linear layouts (``tests/bank_model.py``, the tests of
``tests/test_b7_compile.py``: each lane's byte address, 4-byte banks, 8-byte accesses served a half-warp at a time, an
assumption the count below bears out): b7d's dS^T store (``stmatrix``), its lse and Delta reads and b7c's transposed dQ
store have none; b7d's 64 x 64 float32 dQ store has a 2-way conflict in every instruction. wgmma's accumulator layout
gives a thread two adjacent columns (one 8-byte ``st.shared.v2.b32``), four lanes a 32-byte piece of a row and eight
lanes eight rows; the 128-byte swizzle moves a row's 16-byte chunks by the row's three low bits, so a half-warp's four
rows land on four chunks twice: 64 wavefronts a warp a step where 32 would do. 32 extra wavefronts x 4 warps x 2
warpgroups x 128 steps x 4,096 programs = 134 million, the growth the profile saw (141 million). b7c at D = 128 stored
dQ^T (32-row tiles) one float32 a lane, which spreads the lanes over eight rows and four columns: no conflict. The same
store at D = 64, where every variant has 64-row tiles, conflicts the same way (16 extra a warp a step).

**b7e** computes dQ transposed at 64 rows too (dQ^T = K^T dS^T, b7c's product: wgmma's M is D/2 = 64, so only at
D = 128; at D = 64 b7e is b7d) and stores it one float32 a lane: 32 instructions of 1 wavefront where b7d has 16
of 2 (the same registers, 0 spills, the same 230,896 B). **b7f** keeps b7d's code and gives the dQ tiles a 32-byte
swizzle, under which b7d's 8-byte stores reach 32 distinct banks in each half-warp, at D 64 and 128; TMA then
copies columns 32 bytes wide, so the writer's reduce-add becomes D/16 copies a tile (8 at D = 128, not 2).
Expected at D = 128: the shared-memory pipe of an SM does 8 x 32 = 256 fewer wavefronts a step (both warpgroups),
6% of b7d's 4,300 cycles a step (9.67 ms over 31 waves of 128 steps at 1.755 GHz); the stores come just before the
warpgroup hands its tile to the writer, so most of that is exposed: b7e 1.02-1.06x b7d, 0.92-1.0x cuDNN in fp16
and 0.88-0.96x in bf16 (b7d: 0.90-0.95x and 0.86-0.91x). Not cuDNN's pace yet: b7d's waits on shared memory were
2.3x b7c's, and conflicts explain part of them; the grid's last round (31.03 waves) stays. b7f the same within 3%
at D = 128 unless the narrow reduce-adds slow the writer (``dq_empty`` waits would show it in the profile); at
D = 64 b7f 1.0-1.04x b7d, b7e as b7d.

Variant b7g (bfloat16's P rounded in pairs; prediction written before any GPU run, 2026-12-07). b7e in bfloat16 ran
at 0.90-0.92x cuDNN where float16 ran at 0.97-1.00x, and b7c showed no such gap. Their SASS (sm_90, Triton 3.9) says
why: where P is kept in 16 bits and widened again for dS (``LEAN_REGS``), ptxas pairs float16's roundings
(F2FP.F16.F32.PACK_AB, widened by HADD2.F32, ALU instructions) but rounds bfloat16's one value at a time with
F2F.BF16.F32: 128 in the kernel, one beside each MUFU.EX2. F2F runs at 16 results a clock an SM, MUFU.EX2's rate
(CUDA C++ Programming Guide, throughput of arithmetic instructions: "all other type conversions", compute capability
9.0), and by our reading on the same unit (Nsight Compute's XU pipe, which its counters on a GPU can confirm): in
bfloat16 that unit then does twice the work, 8,192 exponentials and 8,192 roundings a step (two warpgroups of 64 keys
x 64 queries), 512 cycles each, against about 2,460 cycles of tensor work. **b7g** rounds P with inline
``cvt.rn.bf16x2.f32`` (``_bf16_pairs``): two values an instruction on the ALUs, the same bits (both round to nearest
even); the SASS then has no F2F and 64 more packed conversions, and float16's code is b7e's. Expected: bfloat16 at D
= 128 1.03-1.07x b7e (0.94-0.99x cuDNN, float16's pace), float16 b7e within 2%. What could hold it back: the extra
byte permutes that widen a packed bfloat16 (PRMT, LOP3) on the ALUs, which the softmax already loads.

Layout contract (as ``fa3_backward``): q, k, v, o, do (B, H, N, D) contiguous, one dtype (float16 / bfloat16),
D 64 or 128, no GQA; lse (B, H, N_q) float32 natural log as the forward writes it; ``causal=True`` top-left.
Tensors are seen as 2-D (B*H*N, D) for TMA: rows past a head's end belong to the next head and are masked
(P = 0, so they add nothing to dK, dV, and zeros to dQ's padded rows). lse (in log2 units) and Delta are copied
into arrays padded to whole 64-row tiles per head (``_b7_stats_kernel``), so no tile of them crosses a head and
each starts on a 256-byte boundary, as b7b's 1-D TMA copies need.

The dispatch (``plan.gluon_backward``; ``plan.py`` is the only module of the package that imports this one) routes
plain and causal calls of N >= 1024 and at least 65,536 query rows (``plan.B7_MIN_ROWS``) on Hopper to b7c at
D = 64 and b7g at D = 128, under a Triton listed in ``TESTED_TRITON``. Measured on an H100 (2026-12-07, Triton 3.9):
b7e 1.05-1.12x b7d at D = 128 and N = 8192 (0.99x cuDNN in fp16, 0.90-0.91x in bf16), b7f 0.97-0.98x b7e; by length
b7e 1.03-1.12x b7c at D = 128 and 0.82-0.97x at D = 64; b7g, by length, bf16 1.00-1.07x b7e net of the leases'
drift (fp16 the same code), 0.92-0.99x cuDNN in both dtypes. Each variant's runs against its prediction, and the
profiles, are in docs/KERNELS.md ("Backward b7");
``benchmarks/gpu_b7.py`` checks and times each variant (``--variants``).
"""

# No ``from __future__ import annotations``: Gluon's ``aggregate`` checks each field against its annotation.
import math
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

from ..launch import prepare_launch
from .fa3 import _LOG2E, _mma_layout, _on, _smem_layout, _tma_load, aggregate, tensor_descriptor_signature, triton_cdiv
from .fa3_backward import BLOCK_M, ROWS, _dq_convert_kernel, _query_tiles, _Ring, _row_tile_layout, _store_dkdv
from .fa3_backward import check_inputs as _check_b6_inputs

# The Triton releases (major.minor) under which the dispatched stages ran on a GPU: the GPU test of the route
# (plan.gluon_backward) passed with b7c at D 64 and 128 under 3.9.0 on an H100 (2026-12-06 and -07), and with b7g at
# D = 128, routed there since, which passed its 40 gradient checks under 3.9.0 (benchmarks/gpu_b7.py), as b7e had.
# Elsewhere the dispatch runs b1.
# Compiled for sm_90 under 3.9 (tests/test_b7_compile.py), checked and timed on an H100 (benchmarks/gpu_b7.py).
TESTED_TRITON = ("3.9",)
# The Triton releases under which BackwardPlan's prepared launches (a repeat call of one layout) were checked on a
# GPU: under 3.9.0 on an H100 (2026-12-07) tests/test_gluon_backward_plan.py's GPU test (a repeat call's gradients
# equal to the same call launched through Triton) and the route test with them on passed. Under any other Triton,
# flash_attention's plan launches through Triton on every call.
PREPARED_TRITON: tuple[str, ...] = ("3.9",)
# Triton 3.6's Gluon has no TMA reduce-add; 3.9's has (``tma.async_atomic_add``).
HAS_TMA_REDUCE = hasattr(tma, "async_atomic_add")
CONSUMERS = 2  # consumer warpgroups, ROWS keys each (FA3's kBlockN = 128 as 2 x 64)
DQ_BUFFERS = 2  # dS and the dQ tiles: step i+1 computes while step i's dQ is added
STATS_ROWS = 16  # query rows a preprocess program reads (64 spill at D = 128: 360 B a thread, Triton 3.9)
_LOG2E_C = gl.constexpr(_LOG2E)
# The same numbers as the kernels see them (a @gluon.jit function reads only constexpr globals).
_CONSUMERS_C = gl.constexpr(CONSUMERS)
_DQ_BUFFERS_C = gl.constexpr(DQ_BUFFERS)
_ROWS_C = gl.constexpr(ROWS)


@aggregate
class _Rows:
    """What a step reads about its query rows: lse (in log2 units) and Delta from row ``stat_row`` of their
    (B*H, N_QPAD) arrays (``_b7_stats_kernel``), N_Q and N_KV for the masks, ``qk_scale`` (the softmax scale
    times log2(e)); ``paired_p``: a bfloat16 P is rounded two values an instruction (b7g, ``_bf16_pairs``), a flag
    carried here so that the partitions' argument lists stay short."""

    LSE: gl.tensor
    DELTA: gl.tensor
    stat_row: gl.tensor
    N_Q: gl.tensor
    N_KV: gl.tensor
    qk_scale: gl.tensor
    paired_p: gl.constexpr

    @gluon.constexpr_function  # runs while the kernel is traced: it only names the values
    def __init__(self, LSE, DELTA, stat_row, N_Q, N_KV, qk_scale, paired_p):
        self.LSE = LSE
        self.DELTA = DELTA
        self.stat_row = stat_row
        self.N_Q = N_Q
        self.N_KV = N_KV
        self.qk_scale = qk_scale
        self.paired_p = gl.constexpr(paired_p)


@aggregate
class _Stats:
    """b7b's lse and Delta slices in shared memory, one per ring slot: ``lse_smem.index(i)`` and
    ``delta_smem.index(i)`` hold the BLOCK_M values of the (Q, dO) tile in slot i, brought by the same TMA
    transaction (the slot's ``ready`` barrier counts their bytes too)."""

    lse_smem: gl.shared_memory_descriptor
    delta_smem: gl.shared_memory_descriptor

    @gluon.constexpr_function  # runs while the kernel is traced: it only names the values
    def __init__(self, lse_smem, delta_smem):
        self.lse_smem = lse_smem
        self.delta_smem = delta_smem


@aggregate
class _DqHandoff:
    """dS and the dQ tiles between the warpgroups and the writer. Step i uses buffer b = i % DQ_BUFFERS:
    ``ds_smem.index(b * 2 + w)`` holds warpgroup w's dS^T (64 keys x M), ``ds_ready.index(b)`` completes once
    both warpgroups wrote theirs; ``dq_smem.index(b * 2 + w)`` holds warpgroup w's dQ columns (M x D/2, float32),
    ``dq_full`` / ``dq_empty`` (same index) hand it to the writer and back. ``transposed``: the warpgroups compute
    dQ^T at 64 rows too (b7e), a flag carried here so that the partitions' argument lists stay short."""

    ds_smem: gl.shared_memory_descriptor
    ds_ready: gl.shared_memory_descriptor
    dq_smem: gl.shared_memory_descriptor
    dq_full: gl.shared_memory_descriptor
    dq_empty: gl.shared_memory_descriptor
    transposed: gl.constexpr

    @gluon.constexpr_function  # runs while the kernel is traced: it only names the values
    def __init__(self, ds_smem, ds_ready, dq_smem, dq_full, dq_empty, transposed):
        self.ds_smem = ds_smem
        self.ds_ready = ds_ready
        self.dq_smem = dq_smem
        self.dq_full = dq_full
        self.dq_empty = dq_empty
        self.transposed = gl.constexpr(transposed)


@gluon.jit
def _bf16_pairs(x):
    """float32 x rounded to bfloat16 by ``cvt.rn.bf16x2.f32``, two values an instruction (F2FP.PACK_AB, an ALU
    instruction). Why: where P is kept in 16 bits and widened again for dS (b7d-b7f), ptxas rounds a bfloat16 P one
    value at a time with F2F, at the exponentials' rate and by our reading on their unit (one F2F per MUFU.EX2 in
    b7e's SASS),
    while a float16 P is paired (F2FP.F16.F32.PACK_AB) and widened by HADD2.F32. The bits are those of
    ``x.to(gl.bfloat16)``: both round to nearest even."""
    return gl.inline_asm_elementwise("cvt.rn.bf16x2.f32 $0, $2, $1;", "=r,r,r", [x], dtype=gl.bfloat16,
                                     is_pure=True, pack=2)


@gluon.jit
def _b7_step(wg: gl.constexpr, i, dk, dv, k_smem, v_smem, q_tile, do_tile, stats, slot, handoff, rows, m0, keys,
             MASKED: gl.constexpr, CAUSAL: gl.constexpr, STATS_BY_TMA: gl.constexpr, LEAN_REGS: gl.constexpr,
             S_LAYOUT: gl.constexpr, KV_LAYOUT: gl.constexpr):
    """Step i of warpgroup ``wg`` (query tile starting at row m0, in ring slot ``slot``; the caller waited for
    q_tile, do_tile): the five products, dS^T handed to the other warpgroup, this warpgroup's dQ columns handed
    to the writer. With ``STATS_BY_TMA`` lse and Delta came with the tiles (``stats``, a ``_Stats``: b7b);
    without, they are loaded here from global memory (b7). With ``LEAN_REGS`` (b7d, lse and Delta by TMA as b7b)
    each of lse and Delta is read from shared memory just before its use rather than held from the step's start,
    and dS is formed from P in 16 bits (it is rounded to 16 bits anyway), so P is not live in both widths: what
    lets 64 query rows fit the registers at D = 128 (16 + 16 values a thread fewer at the peak)."""
    BLOCK_M: gl.constexpr = q_tile.shape[0]
    HEAD_DIM: gl.constexpr = q_tile.shape[1]
    KEYS: gl.constexpr = _ROWS_C
    HALF: gl.constexpr = HEAD_DIM // 2  # dQ columns of one warpgroup
    op_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=KV_LAYOUT, k_width=2)
    k_tile = k_smem.index(wg)
    v_tile = v_smem.index(wg)
    buf = i % _DQ_BUFFERS_C
    phase = (i // _DQ_BUFFERS_C) & 1
    ds_tile = handoff.ds_smem.index(buf * 2 + wg)
    cols = m0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, S_LAYOUT))  # query indices (S^T's columns)
    zero = gl.zeros([KEYS, BLOCK_M], gl.float32, S_LAYOUT)
    # b7d (LEAN_REGS) reads lse and Delta from shared memory where each is used, below
    if STATS_BY_TMA and not LEAN_REGS:  # b7b: from shared memory (zeros past N_Q: the arrays are padded per head)
        lse2 = stats.lse_smem.index(slot).load(gl.SliceLayout(0, S_LAYOUT))
        delta = stats.delta_smem.index(slot).load(gl.SliceLayout(0, S_LAYOUT))
    elif not STATS_BY_TMA:  # b7: every tile lies inside its head's padded row, so no mask
        lse2 = gl.load(rows.LSE + rows.stat_row + cols)
        delta = gl.load(rows.DELTA + rows.stat_row + cols)
    s = warpgroup_mma(k_tile, q_tile.permute((1, 0)), zero, use_acc=False, is_async=True)
    dp = warpgroup_mma(v_tile, do_tile.permute((1, 0)), zero, use_acc=False, is_async=True)
    s = warpgroup_mma_wait(num_outstanding=1, deps=(s,))
    if LEAN_REGS:
        lse2 = stats.lse_smem.index(slot).load(gl.SliceLayout(0, S_LAYOUT))
    p = gl.exp2(s * rows.qk_scale - lse2[None, :])
    if MASKED:  # rows past N_Q (the next head's), keys past N_KV and, causal, keys after the query: P = 0
        ok = (cols[None, :] < rows.N_Q) & (keys[:, None] < rows.N_KV)
        if CAUSAL:
            ok = ok & (keys[:, None] <= cols[None, :])
        p = gl.where(ok, p, 0.0)
    if rows.paired_p and q_tile.dtype == gl.bfloat16:
        p_half = _bf16_pairs(p)
    else:
        p_half = p.to(q_tile.dtype)
    if LEAN_REGS:
        p = p_half.to(gl.float32)
    dv = warpgroup_mma(gl.convert_layout(p_half, op_layout), do_tile, dv, is_async=True)
    dp = warpgroup_mma_wait(num_outstanding=1, deps=(dp,))
    if LEAN_REGS:
        delta = stats.delta_smem.index(slot).load(gl.SliceLayout(0, S_LAYOUT))
    ds_tile.store((p * (dp - delta[None, :])).to(q_tile.dtype))
    dv = warpgroup_mma_wait(num_outstanding=0, deps=(dv,))
    fence_async_shared()  # dS^T written by the threads, read by the tensor cores (the async proxy)
    mbarrier.arrive(handoff.ds_ready.index(buf))  # this warpgroup's dS^T is in place
    dk = warpgroup_mma(ds_tile, q_tile, dk, is_async=True)

    # dQ[:, wg*HALF : (wg+1)*HALF] of the tile = dS_0 K_0[:, cols] + dS_1 K_1[:, cols] (both 64-key halves).
    mbarrier.wait(handoff.ds_ready.index(buf), phase)  # the other warpgroup's dS^T too
    dq_tile = handoff.dq_smem.index(buf * 2 + wg)
    # b7e (handoff.transposed) takes the transposed product at 64 rows too, where its M = HALF is 64 (D = 128): wgmma's
    # M is 64, so at D = 64 it stays b7d's. Why: the bank conflicts of the dQ store (the KERNELS.md entry of b7e).
    if BLOCK_M == 64 and not (handoff.transposed and HALF >= 64):
        DQ_LAYOUT: gl.constexpr = _mma_layout(HALF)
        dq = gl.zeros([BLOCK_M, HALF], gl.float32, DQ_LAYOUT)
        for j in gl.static_range(_CONSUMERS_C):
            dq = warpgroup_mma(handoff.ds_smem.index(buf * 2 + j).permute((1, 0)),
                               k_smem.index(j).slice(wg * HALF, HALF, dim=1), dq, use_acc=j > 0, is_async=True)
        dq = warpgroup_mma_wait(num_outstanding=0, deps=(dq,))
        mbarrier.wait(handoff.dq_empty.index(buf * 2 + wg), phase ^ 1)  # the writer is done with this tile
        dq_tile.store(dq)
    else:  # query tiles narrower than wgmma's 64 rows: dQ^T[cols, :] = K_0[:, cols]^T dS_0^T + K_1[:, cols]^T dS_1^T
        DQT_LAYOUT: gl.constexpr = _mma_layout(BLOCK_M)
        dqt = gl.zeros([HALF, BLOCK_M], gl.float32, DQT_LAYOUT)
        for j in gl.static_range(_CONSUMERS_C):
            dqt = warpgroup_mma(k_smem.index(j).slice(wg * HALF, HALF, dim=1).permute((1, 0)),
                                handoff.ds_smem.index(buf * 2 + j), dqt, use_acc=j > 0, is_async=True)
        dqt = warpgroup_mma_wait(num_outstanding=0, deps=(dqt,))
        mbarrier.wait(handoff.dq_empty.index(buf * 2 + wg), phase ^ 1)
        dq_tile.permute((1, 0)).store(dqt)
    fence_async_shared()  # the float32 tile written by the threads, read by the TMA unit
    mbarrier.arrive(handoff.dq_full.index(buf * 2 + wg))
    dk = warpgroup_mma_wait(num_outstanding=0, deps=(dk,))
    return dk, dv


@gluon.jit
def _b7_steps(wg: gl.constexpr, dk, dv, k_smem, v_smem, ring, stats, handoff, rows, keys, i_lo, i_hi, m_lo,
              MASKED: gl.constexpr, CAUSAL: gl.constexpr, STAGES: gl.constexpr, STATS_BY_TMA: gl.constexpr,
              LEAN_REGS: gl.constexpr, S_LAYOUT: gl.constexpr, KV_LAYOUT: gl.constexpr):
    """Steps [i_lo, i_hi) of warpgroup ``wg``: wait for the (Q, dO) slot, compute, free the slot."""
    BLOCK_M: gl.constexpr = ring.q_smem.shape[1]
    for i in range(i_lo, i_hi):
        slot = i % STAGES
        mbarrier.wait(ring.ready.index(slot), (i // STAGES) & 1)
        dk, dv = _b7_step(wg, i, dk, dv, k_smem, v_smem, ring.q_smem.index(slot), ring.do_smem.index(slot),
                          stats, slot, handoff, rows, (m_lo + i) * BLOCK_M, keys, MASKED=MASKED, CAUSAL=CAUSAL,
                          STATS_BY_TMA=STATS_BY_TMA, LEAN_REGS=LEAN_REGS, S_LAYOUT=S_LAYOUT, KV_LAYOUT=KV_LAYOUT)
        mbarrier.arrive(ring.empty.index(slot))  # every product of the step has landed: Q, dO no longer read
    return dk, dv


@gluon.jit
def _b7_consumer(wg: gl.constexpr, k_smem, v_smem, kv_bar, ring, stats, handoff, rows, DK, DV, scale, kv_row, n0,
                 m_lo, full_lo, full_hi, n_m, CAUSAL: gl.constexpr, STAGES: gl.constexpr,
                 STATS_BY_TMA: gl.constexpr, LEAN_REGS: gl.constexpr):
    """Consumer warpgroup ``wg``: keys [n0 + 64 wg, n0 + 64 wg + 64), every query tile of the program."""
    HEAD_DIM: gl.constexpr = k_smem.shape[2]
    BLOCK_M: gl.constexpr = ring.q_smem.shape[1]
    S_LAYOUT: gl.constexpr = _mma_layout(BLOCK_M)
    KV_LAYOUT: gl.constexpr = _mma_layout(HEAD_DIM)
    first = n0 + wg * _ROWS_C
    keys = first + gl.arange(0, _ROWS_C, layout=gl.SliceLayout(1, S_LAYOUT))
    dk = gl.zeros([_ROWS_C, HEAD_DIM], gl.float32, KV_LAYOUT)
    dv = gl.zeros([_ROWS_C, HEAD_DIM], gl.float32, KV_LAYOUT)
    mbarrier.wait(kv_bar, 0)
    dk, dv = _b7_steps(wg, dk, dv, k_smem, v_smem, ring, stats, handoff, rows, keys, 0, full_lo - m_lo, m_lo,
                       MASKED=True, CAUSAL=CAUSAL, STAGES=STAGES,
                       STATS_BY_TMA=STATS_BY_TMA, LEAN_REGS=LEAN_REGS, S_LAYOUT=S_LAYOUT, KV_LAYOUT=KV_LAYOUT)
    dk, dv = _b7_steps(wg, dk, dv, k_smem, v_smem, ring, stats, handoff, rows, keys, full_lo - m_lo,
                       full_hi - m_lo, m_lo, MASKED=False, CAUSAL=CAUSAL, STAGES=STAGES,
                       STATS_BY_TMA=STATS_BY_TMA, LEAN_REGS=LEAN_REGS, S_LAYOUT=S_LAYOUT, KV_LAYOUT=KV_LAYOUT)
    dk, dv = _b7_steps(wg, dk, dv, k_smem, v_smem, ring, stats, handoff, rows, keys, full_hi - m_lo, n_m - m_lo, m_lo,
                       MASKED=True, CAUSAL=CAUSAL, STAGES=STAGES,
                       STATS_BY_TMA=STATS_BY_TMA, LEAN_REGS=LEAN_REGS, S_LAYOUT=S_LAYOUT, KV_LAYOUT=KV_LAYOUT)
    _store_dkdv(dk, dv, DK, DV, kv_row, first, rows.N_KV, scale, HEAD_DIM=HEAD_DIM, KEYS=_ROWS_C, KV_LAYOUT=KV_LAYOUT)


@gluon.jit
def _b7_consumer0(k_smem, v_smem, kv_bar, ring, stats, handoff, rows, DK, DV, scale, kv_row, n0, m_lo, full_lo,
                  full_hi, n_m, CAUSAL: gl.constexpr, STAGES: gl.constexpr, STATS_BY_TMA: gl.constexpr,
                  LEAN_REGS: gl.constexpr):
    """The default partition: consumer warpgroup 0."""
    _b7_consumer(0, k_smem, v_smem, kv_bar, ring, stats, handoff, rows, DK, DV, scale, kv_row, n0, m_lo, full_lo,
                 full_hi, n_m, CAUSAL=CAUSAL, STAGES=STAGES, STATS_BY_TMA=STATS_BY_TMA, LEAN_REGS=LEAN_REGS)


@gluon.jit
def _b7_consumer1(k_smem, v_smem, kv_bar, ring, stats, handoff, rows, DK, DV, scale, kv_row, n0, m_lo, full_lo,
                  full_hi, n_m, CAUSAL: gl.constexpr, STAGES: gl.constexpr, STATS_BY_TMA: gl.constexpr,
                  LEAN_REGS: gl.constexpr):
    """A worker partition of 4 warps: consumer warpgroup 1, the program's next 64 keys."""
    _b7_consumer(1, k_smem, v_smem, kv_bar, ring, stats, handoff, rows, DK, DV, scale, kv_row, n0, m_lo, full_lo,
                 full_hi, n_m, CAUSAL=CAUSAL, STAGES=STAGES, STATS_BY_TMA=STATS_BY_TMA, LEAN_REGS=LEAN_REGS)


@gluon.jit
def _b7_producer(q_desc, k_desc, v_desc, do_desc, lse_desc, delta_desc, k_smem, v_smem, kv_bar, ring, stats, q_row,
                 stat_row, kv_row, n0, m_lo, n_tiles, STAGES: gl.constexpr, STATS_BY_TMA: gl.constexpr):
    """The loader warp (b6's producer, and for b7b the tile's lse and Delta): every consumer's K and V once, then
    (Q, dO) tile by tile into the ring. With ``STATS_BY_TMA`` (``stats`` a ``_Stats``) the BLOCK_M values of lse and
    Delta join the slot's transaction, so a consumer finds them in shared memory when its wait ends, as FA3's
    producer brings them (``hopper/mainloop_bwd_sm90_tma_gmma_ws.hpp``, its LSE and dPsum copies)."""
    KEYS: gl.constexpr = k_desc.block_type.shape[0]
    BLOCK_M: gl.constexpr = q_desc.block_type.shape[0]
    tile_bytes: gl.constexpr = q_desc.block_type.nbytes + do_desc.block_type.nbytes
    mbarrier.expect(kv_bar, _CONSUMERS_C * (k_desc.block_type.nbytes + v_desc.block_type.nbytes))
    for w in gl.static_range(_CONSUMERS_C):
        _tma_load(k_desc, [kv_row + n0 + w * KEYS, 0], kv_bar, k_smem.index(w))
        _tma_load(v_desc, [kv_row + n0 + w * KEYS, 0], kv_bar, v_smem.index(w))
    for i in range(n_tiles):
        slot = i % STAGES
        row = q_row + (m_lo + i) * BLOCK_M
        mbarrier.wait(ring.empty.index(slot), ((i // STAGES) & 1) ^ 1)  # a fresh barrier's phase 1 counts as done
        if STATS_BY_TMA:
            mbarrier.expect(ring.ready.index(slot),
                            tile_bytes + lse_desc.block_type.nbytes + delta_desc.block_type.nbytes)
            first = stat_row + (m_lo + i) * BLOCK_M  # 256-byte aligned: a 1-D copy faults off a 16-byte one
            _tma_load(lse_desc, [first], ring.ready.index(slot), stats.lse_smem.index(slot))
            _tma_load(delta_desc, [first], ring.ready.index(slot), stats.delta_smem.index(slot))
        else:
            mbarrier.expect(ring.ready.index(slot), tile_bytes)
        _tma_load(q_desc, [row, 0], ring.ready.index(slot), ring.q_smem.index(slot))
        _tma_load(do_desc, [row, 0], ring.ready.index(slot), ring.do_smem.index(slot))


@gluon.jit
def _b7_dq_writer(dq_desc, handoff, dq_row, m_lo, n_tiles):
    """The writer warp: for each step, both warpgroups' float32 dQ columns added to the global buffer by TMA
    reduce-adds (the additions run in L2; the warp only waits until the TMA unit has read shared memory, then
    gives the tiles back)."""
    BLOCK_M: gl.constexpr = dq_desc.block_type.shape[0]
    HALF: gl.constexpr = dq_desc.block_type.shape[1]
    for i in range(n_tiles):
        buf = i % _DQ_BUFFERS_C
        phase = (i // _DQ_BUFFERS_C) & 1
        for w in gl.static_range(_CONSUMERS_C):
            mbarrier.wait(handoff.dq_full.index(buf * 2 + w), phase)
            tma.async_atomic_add(dq_desc, [dq_row + (m_lo + i) * BLOCK_M, w * HALF], handoff.dq_smem.index(buf * 2 + w))
        tma.store_wait(0)  # shared memory read: the tiles may be overwritten (the adds may still be in flight)
        for w in gl.static_range(_CONSUMERS_C):
            mbarrier.arrive(handoff.dq_empty.index(buf * 2 + w))
    tma.store_wait(0)


@gluon.jit(do_not_specialize=["N_Q", "N_KV", "N_QPAD"])
def _b7_kernel(q_desc, k_desc, v_desc, do_desc, dq_desc, lse_desc, delta_desc, DK, DV, LSE, DELTA, qk_scale, scale,
               N_Q, N_KV, N_QPAD, CAUSAL: gl.constexpr, STAGES: gl.constexpr, STATS_BY_TMA: gl.constexpr,
               LEAN_REGS: gl.constexpr, DQ_TRANSPOSED: gl.constexpr, PAIRED_P: gl.constexpr,
               PRODUCER_REGS: gl.constexpr, CONSUMER_REGS: gl.constexpr):
    """b7 and its variants: two consumer warpgroups (launch with num_warps=4: the default partition is consumer
    0), a loader warp, a dQ-writer warp; one program per 128 keys of one (batch, head). With ``STATS_BY_TMA``
    (b7b, b7c) the loader brings each tile's lse and Delta through ``lse_desc`` and ``delta_desc`` (1-D, BLOCK_M
    values); without (b7) the consumers load them from ``LSE`` and ``DELTA`` and the descriptors are unused."""
    BLOCK_M: gl.constexpr = q_desc.block_type.shape[0]
    HEAD_DIM: gl.constexpr = q_desc.block_type.shape[1]
    KEYS: gl.constexpr = k_desc.block_type.shape[0]
    DS_LAYOUT: gl.constexpr = gl.NVMMASharedLayout.get_default_for([KEYS, BLOCK_M], q_desc.dtype)

    pid_n = gl.program_id(0)
    bh = gl.program_id(1)
    n0 = pid_n * (KEYS * _CONSUMERS_C)
    kv_row = bh * N_KV
    q_row = bh * N_Q
    dq_row = bh * N_QPAD  # also the first of the head's padded lse and Delta
    stat_row = bh.to(gl.int64) * N_QPAD
    m_lo, full_lo, full_hi, n_m = _query_tiles(n0, N_Q, N_KV, CAUSAL=CAUSAL, KEYS=KEYS * _CONSUMERS_C,
                                               BLOCK_M=BLOCK_M)

    k_smem = gl.allocate_shared_memory(k_desc.dtype, [_CONSUMERS_C, KEYS, HEAD_DIM], k_desc.layout)
    v_smem = gl.allocate_shared_memory(v_desc.dtype, [_CONSUMERS_C, KEYS, HEAD_DIM], v_desc.layout)
    q_smem = gl.allocate_shared_memory(q_desc.dtype, [STAGES, BLOCK_M, HEAD_DIM], q_desc.layout)
    do_smem = gl.allocate_shared_memory(do_desc.dtype, [STAGES, BLOCK_M, HEAD_DIM], do_desc.layout)
    ds_smem = gl.allocate_shared_memory(q_desc.dtype, [_DQ_BUFFERS_C * _CONSUMERS_C, KEYS, BLOCK_M], DS_LAYOUT)
    dq_smem = gl.allocate_shared_memory(gl.float32, [_DQ_BUFFERS_C * _CONSUMERS_C, BLOCK_M, HEAD_DIM // 2],
                                        dq_desc.layout)
    if STATS_BY_TMA:
        stats = _Stats(gl.allocate_shared_memory(gl.float32, [STAGES, BLOCK_M], lse_desc.layout),
                       gl.allocate_shared_memory(gl.float32, [STAGES, BLOCK_M], delta_desc.layout))
    else:
        stats = STATS_BY_TMA  # nothing to hand on (warp_specialize's argument tuples take no None)
    kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    ds_ready = gl.allocate_shared_memory(gl.int64, [_DQ_BUFFERS_C, 1], mbarrier.MBarrierLayout())
    dq_full = gl.allocate_shared_memory(gl.int64, [_DQ_BUFFERS_C * _CONSUMERS_C, 1], mbarrier.MBarrierLayout())
    dq_empty = gl.allocate_shared_memory(gl.int64, [_DQ_BUFFERS_C * _CONSUMERS_C, 1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=_CONSUMERS_C)  # every consumer warpgroup frees the slot
    for i in gl.static_range(_DQ_BUFFERS_C):
        mbarrier.init(ds_ready.index(i), count=_CONSUMERS_C)  # both halves of dS written
    for i in gl.static_range(_DQ_BUFFERS_C * _CONSUMERS_C):
        mbarrier.init(dq_full.index(i), count=1)
        mbarrier.init(dq_empty.index(i), count=1)

    ring = _Ring(q_smem, do_smem, ready, empty)
    handoff = _DqHandoff(ds_smem, ds_ready, dq_smem, dq_full, dq_empty, DQ_TRANSPOSED)
    rows = _Rows(LSE, DELTA, stat_row, N_Q, N_KV, qk_scale, PAIRED_P)
    # The argument tuples are written out in each call (a tuple held in a variable loses its constexprs).
    gl.warp_specialize([
        (_b7_consumer0, (k_smem, v_smem, kv_bar, ring, stats, handoff, rows, DK, DV, scale, kv_row, n0, m_lo,
                         full_lo, full_hi, n_m, CAUSAL, STAGES, STATS_BY_TMA, LEAN_REGS)),
        (_b7_consumer1, (k_smem, v_smem, kv_bar, ring, stats, handoff, rows, DK, DV, scale, kv_row, n0, m_lo,
                         full_lo, full_hi, n_m, CAUSAL, STAGES, STATS_BY_TMA, LEAN_REGS)),
        (_b7_producer, (q_desc, k_desc, v_desc, do_desc, lse_desc, delta_desc, k_smem, v_smem, kv_bar, ring, stats,
                        q_row, dq_row, kv_row, n0, m_lo, n_m - m_lo, STAGES, STATS_BY_TMA)),
        (_b7_dq_writer, (dq_desc, handoff, dq_row, m_lo, n_m - m_lo)),
    ], [4, 1, 1], [CONSUMER_REGS, PRODUCER_REGS, PRODUCER_REGS])


# ------------------------------------------------------------------------------------------ preprocess
@gluon.jit(do_not_specialize=["N_Q", "N_QPAD"])
def _b7_stats_kernel(O, DO, LSE, LSE2, DELTA, DQ_ACC, N_Q, N_QPAD, HEAD_DIM: gl.constexpr, BLOCK: gl.constexpr):
    """Rows [pid * BLOCK, ...) of head program_id(1): Delta = rowsum(dO * O) and lse2 = lse * log2(e), written
    into (B*H, N_QPAD) arrays with zeros past N_Q, and the same rows of the float32 dQ buffer (B*H*N_QPAD,
    HEAD_DIM) set to 0 for the reduce-adds, which saves a fill launch a call, as cuDNN's preprocess does (launch
    with 4 warps over N_QPAD / BLOCK programs). FA3's preprocess pads its LSE and dPsum to whole tiles too: each
    tile's values then start on a 256-byte boundary, which a 1-D TMA copy needs (b7b's first run faulted, "illegal
    instruction", where a head began at a 4-byte offset), and no tile reaches the next head's rows."""
    layout: gl.constexpr = _row_tile_layout(HEAD_DIM)
    bh = gl.program_id(1).to(gl.int64)
    rows = gl.program_id(0) * BLOCK + gl.arange(0, BLOCK, layout=gl.SliceLayout(1, layout))
    cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, layout))
    inside = rows < N_Q
    tile = (bh * N_Q + rows)[:, None] * HEAD_DIM + cols[None, :]
    mask = inside[:, None] & (cols < HEAD_DIM)[None, :]
    o = gl.load(O + tile, mask=mask, other=0.0).to(gl.float32)
    do = gl.load(DO + tile, mask=mask, other=0.0).to(gl.float32)
    lse = gl.load(LSE + bh * N_Q + rows, mask=inside, other=0.0)
    gl.store(DELTA + bh * N_QPAD + rows, gl.sum(o * do, axis=1))
    gl.store(LSE2 + bh * N_QPAD + rows, lse * _LOG2E_C)
    padded = (bh * N_QPAD + rows)[:, None] * HEAD_DIM + cols[None, :]
    gl.store(DQ_ACC + padded, gl.zeros([BLOCK, HEAD_DIM], gl.float32, layout))


# ------------------------------------------------------------------------------------------ stage and host
@dataclass(frozen=True)
class Stage:
    """b7's launch: its kernel, ring depth and register budgets (the shape ``scripts/fa3_compile.py`` reads)."""

    name: str
    adds: str
    expected: str
    kernel: object
    stages: int = 2  # (Q, dO) ring depth
    producer_regs: int = 24  # the loader's and the writer's warpgroup
    consumer_regs: int = 240
    stats_by_tma: bool = False  # lse and Delta brought by the loader with the tiles (b7b), else loaded by the consumers
    lean_regs: bool = False  # lse and Delta read where used, dS from P in 16 bits (b7d: 64 rows fit at D = 128)
    dq_transposed: bool = False  # dQ^T = K^T dS^T at 64 rows too, stored a float32 a lane (b7e: no bank conflicts)
    dq_swizzle: int = 0  # bytes of the dQ tiles' swizzle; 0: the default for the tile (128), 32 for b7f
    paired_p: bool = False  # a bfloat16 P rounded two values an instruction (b7g: no F2F beside the exponentials)
    block_m: tuple[tuple[int, int], ...] = tuple(BLOCK_M.items())  # (head dim, query rows a step)

    def keys(self) -> int:
        return ROWS * CONSUMERS

    def rows(self, head_dim: int) -> int:
        """Query rows a step takes at ``head_dim``."""
        return dict(self.block_m)[head_dim]

    def options(self) -> dict:
        return {"num_warps": 4}

    def constexprs(self, causal: bool) -> dict:
        return {"CAUSAL": causal, "STAGES": self.stages, "STATS_BY_TMA": self.stats_by_tma, "LEAN_REGS": self.lean_regs,
                "DQ_TRANSPOSED": self.dq_transposed, "PAIRED_P": self.paired_p, "PRODUCER_REGS": self.producer_regs,
                "CONSUMER_REGS": self.consumer_regs}


STAGES = {
    "b7": Stage("b7", "FA3's backward: two consumer warpgroups (dK, dV in registers, 240 each), a loader warp, a dQ "
                "writer warp; dQ columns split between the warpgroups from both halves of dS, added to float32 "
                "by one TMA reduce-add a warpgroup a step (tma.async_atomic_add), off the math warps",
                "0.85-1.0x cuDNN at N >= 4096 (1.1-1.3x b1)", _b7_kernel),
    "b7b": Stage("b7b", "b7 with each tile's lse and Delta brought by the loader's TMA into shared memory with Q and "
                 "dO (FA3's LSE and dPsum copies), no global loads on the math warps",
                 "D = 128: 0.80-0.90x cuDNN (1.05-1.15x b7); D = 64: as b7 within 3%", _b7_kernel, stats_by_tma=True),
    "b7c": Stage("b7c", "b7b with a three-slot (Q, dO, lse, Delta) ring (+16 KB of shared memory at D = 128)",
                 "D = 128: b7b within 3% (the ring is not what waits)", _b7_kernel, stages=3, stats_by_tma=True),
    "b7d": Stage("b7d", "b7b with 64 query rows a step at D = 128 too (half the shared-memory reads a FLOP of 32-row "
                 "tiles), fitted to the registers by reading lse and Delta where they are used and forming dS from "
                 "P in 16 bits",
                 "D = 128: 1.05-1.15x b7c (0.90-1.0x cuDNN); D = 64: b7c within 3%", _b7_kernel,
                 stats_by_tma=True, lean_regs=True, block_m=((64, 64), (128, 64))),
    "b7e": Stage("b7e", "b7d with dQ computed transposed (dQ^T = K^T dS^T, as b7c's 32-row tiles) and stored one "
                 "float32 a lane: the 64-row dQ tile's 8-byte stores into the 128-byte swizzle were 2-way bank "
                 "conflicts in every half-warp, the scalar stores of the transpose have none",
                 "D = 128: 1.02-1.06x b7d (0.92-1.0x cuDNN fp16, 0.88-0.96x bf16); D = 64: b7d within 3%",
                 _b7_kernel, stats_by_tma=True, lean_regs=True, dq_transposed=True,
                 block_m=((64, 64), (128, 64))),
    "b7f": Stage("b7f", "b7d with the dQ tiles in a 32-byte swizzle (b7d's 8-byte stores conflict-free at D 64 and "
                 "128, no change to the math warps' code); the writer's reduce-add split into 32-byte wide copies",
                 "D = 128: as b7e within 3%, unless the narrow reduce-adds cost; D = 64: 1.0-1.04x b7d",
                 _b7_kernel, stats_by_tma=True, lean_regs=True, dq_swizzle=32, block_m=((64, 64), (128, 64))),
    "b7g": Stage("b7g", "b7e with a bfloat16 P rounded two values an instruction (inline cvt.rn.bf16x2.f32): ptxas "
                 "rounded b7e's one value at a time with F2F, one per exponential and at its rate (16 a clock an "
                 "SM), where float16's were paired on the ALUs; float16 code unchanged",
                 "bf16 at D = 128: 1.03-1.07x b7e (0.94-0.99x cuDNN); fp16: b7e within 2%", _b7_kernel,
                 stats_by_tma=True, lean_regs=True, dq_transposed=True, paired_p=True,
                 block_m=((64, 64), (128, 64))),
}
VARIANTS = tuple(STAGES)
HEAD_DIMS = (64, 128)


def _dq_layout(block_m: int, head_dim: int, swizzle: int = 0):
    """A warpgroup's float32 dQ tile in shared memory, as the writer's TMA reduce-add reads it: the default
    swizzle for the tile (128 bytes) or ``swizzle`` bytes (b7f: 32; TMA then copies 32-byte wide columns, the
    compiler splitting each tile's reduce-add into HALF / 8 copies)."""
    if not swizzle:
        return gl.NVMMASharedLayout.get_default_for([block_m, head_dim // 2], gl.float32)
    return gl.NVMMASharedLayout(swizzle_byte_width=swizzle, element_bitwidth=32, rank=2)


def _stats_layout(block_m: int):
    """A tile's BLOCK_M float32 values of lse or Delta in shared memory (1-D: no swizzle)."""
    return gl.NVMMASharedLayout.get_default_for([block_m], gl.float32)


def kernel_signature(stage: Stage, head_dim: int, dtype: torch.dtype, causal: bool) -> tuple[dict, dict]:
    """(signature, constexprs) of b7's kernel, as ``triton.compile`` takes them."""
    name = {torch.float16: "fp16", torch.bfloat16: "bf16"}[dtype]
    block_m = stage.rows(head_dim)
    signature = {"q_desc": tensor_descriptor_signature(block_m, head_dim, dtype),
                 "k_desc": tensor_descriptor_signature(ROWS, head_dim, dtype),
                 "v_desc": tensor_descriptor_signature(ROWS, head_dim, dtype),
                 "do_desc": tensor_descriptor_signature(block_m, head_dim, dtype),
                 "dq_desc": f"tensordesc<fp32[{block_m},{head_dim // 2}],"
                            f"{_dq_layout(block_m, head_dim, stage.dq_swizzle)!r}>",
                 "lse_desc": f"tensordesc<fp32[{block_m}],{_stats_layout(block_m)!r}>",
                 "delta_desc": f"tensordesc<fp32[{block_m}],{_stats_layout(block_m)!r}>",
                 "DK": f"*{name}", "DV": f"*{name}", "LSE": "*fp32", "DELTA": "*fp32",
                 "qk_scale": "fp32", "scale": "fp32", "N_Q": "i32", "N_KV": "i32", "N_QPAD": "i32"}
    constexprs = stage.constexprs(causal)
    signature.update({key: "constexpr" for key in constexprs})
    return signature, constexprs


def check_inputs(q, k, v, o, lse, do, head_dims: tuple[int, ...] = HEAD_DIMS) -> None:
    """What b7 takes, or a ValueError saying what to use instead (b6's rules, plus a Triton with the TMA
    reduce-add); ``head_dims``: those the caller's kernel takes (b8, fa3_backward_d256.py: 256)."""
    if not HAS_TMA_REDUCE:
        import triton

        raise ValueError(f"b7 adds dQ with Gluon's tma.async_atomic_add, which Triton {triton.__version__} lacks "
                         "(it came with 3.9): install Triton >= 3.9, or use "
                         "flashcourse.kernels.flash_attention_backward")
    _check_b6_inputs(q, k, v, o, lse, do, head_dims=head_dims)


class BackwardPlan:
    """The host work of a Gluon backward's three launches (lse and Delta padded per head with dQ's float32 buffer
    zeroed, the products with dQ's reduce-adds, dQ's convert) done once for a layout, what ``flash_attention``'s
    plan keeps on Hopper as ``fa3.ForwardPlan`` does for the forward: grid, scale, constexprs and shared-memory
    layouts; from the first call, one TMA descriptor per tensor validated by Triton (kept as templates without their
    tensor) and each kernel's compiled launch (``launch.prepare_launch``). A later call allocates its buffers, puts
    its tensors into copies of the templates and launches, with no argument binding and no descriptor checks. Why:
    on an H100 under Triton 3.9 a backward at (4, 32, 1024, 64) took 0.76 ms and at N = 2048, four times the work,
    0.92 ms: a fixed cost per call, on the host (docs/KERNELS.md, "Host time"). With the prepared launches the causal
    call at that shape took 0.36 ms, against 0.77 ms launched through Triton in the same session.
    ``flash_attention`` prepares them only under a Triton in ``PREPARED_TRITON``.

    b7's variants and b8 differ in the tiles: ``block_m`` query rows a tile (Q, dO, lse and Delta copies),
    ``kv_rows`` keys a copy of K and V, ``pad_rows`` the rows each head's lse, Delta and dQ are padded to, and
    dQ's reduce-add box ``dq_box`` in ``dq_layout``; ``stats_pointers``: whether the kernel also takes lse and
    Delta as pointers (b7's; b8's reads them by TMA only). ``prepare=False`` (a plan used once) launches every
    call through Triton and prepares nothing."""

    def __init__(self, spec, q: torch.Tensor, k: torch.Tensor, *, causal: bool, scale: float | None, block_m: int,
                 kv_rows: int, pad_rows: int, dq_box: tuple[int, int], dq_layout, stats_pointers: bool,
                 prepare: bool = True):
        batch, heads, n_q, head_dim = q.shape
        n_kv = k.shape[2]
        self.spec = spec
        self.empty = batch * heads * n_q == 0 or n_kv == 0
        self.scale = 1.0 / math.sqrt(head_dim) if scale is None else float(scale)
        self.n_qpad = triton_cdiv(n_q, pad_rows) * pad_rows  # whole tiles: a reduce-add never reaches the next head
        self.rows = batch * heads * self.n_qpad
        self.boxes = (block_m, kv_rows, kv_rows, block_m)  # rows a TMA copy of q, k, v, dO
        self.dq_box, self.dq_layout, self.block_m = list(dq_box), dq_layout, block_m
        self.grid = (triton_cdiv(n_kv, spec.keys()), batch * heads)
        self.stats_grid = (self.n_qpad // STATS_ROWS, batch * heads)
        self.convert_grid = (triton_cdiv(n_q, 64), batch * heads)
        self.arguments = dict(qk_scale=self.scale * _LOG2E, scale=self.scale, N_Q=n_q, N_KV=n_kv, N_QPAD=self.n_qpad,
                              **spec.constexprs(bool(causal)))
        self.stats_arguments = dict(N_Q=n_q, N_QPAD=self.n_qpad, HEAD_DIM=head_dim, BLOCK=STATS_ROWS)
        self.convert_arguments = dict(scale=self.scale, N_Q=n_q, N_QPAD=self.n_qpad, HEAD_DIM=head_dim, BLOCK=64)
        self.stats_pointers, self.prepare = stats_pointers, prepare
        self._templates = None  # q, k, v, dO, dQ buffer, lse, Delta descriptors, after the first call
        self._launches = None  # the three prepared launches, after the first call (None where Triton has none)

    def __call__(self, q, k, v, o, lse, do) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if self.empty:
            return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        lse2, delta = (torch.empty(self.rows, device=q.device, dtype=torch.float32) for _ in range(2))
        dq_acc = torch.empty((self.rows, q.shape[3]), device=q.device, dtype=torch.float32)  # zeroed by stats
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        # Triton specialises a pointer on its 16-byte alignment and TMA needs it: the launches were prepared on
        # aligned tensors, so a call on another alignment (a view at an odd offset) takes the plain launches
        if self._launches is not None and not (q.data_ptr() | k.data_ptr() | v.data_ptr() | do.data_ptr()
                                               | o.data_ptr() | lse.data_ptr()) % 16:
            stats, main, convert = self._launches
            stats((o, do, lse, lse2, delta, dq_acc))
            # the launcher reads only a descriptor's base address from its tensor: q itself serves for its rows
            main(tuple(_on(template, t) for template, t in zip(self._templates, (q, k, v, do, dq_acc, lse2, delta),
                                                                strict=True))
                 + ((dk, dv, lse2, delta) if self.stats_pointers else (dk, dv)))
            convert((dq_acc, dq))
            return dq, dk, dv
        self._first_launches(q, k, v, o, lse, do, lse2, delta, dq_acc, dq, dk, dv)
        return dq, dk, dv

    def _first_launches(self, q, k, v, o, lse, do, lse2, delta, dq_acc, dq, dk, dv) -> None:
        """The three launches through Triton (binding, descriptor checks), then prepared for the next calls."""
        from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

        stats_kwargs = dict(O=o, DO=do, LSE=lse, LSE2=lse2, DELTA=delta, DQ_ACC=dq_acc, **self.stats_arguments)
        stats = _b7_stats_kernel[self.stats_grid](**stats_kwargs, num_warps=4)
        descriptors = [TensorDescriptor(flat, list(flat.shape), list(flat.stride()), [rows, flat.shape[1]],
                                        _smem_layout(rows, flat.shape[1], flat.dtype))
                       for flat, rows in zip((t.view(-1, t.shape[3]) for t in (q, k, v, do)), self.boxes, strict=True)]
        descriptors.append(TensorDescriptor(dq_acc, list(dq_acc.shape), list(dq_acc.stride()), self.dq_box,
                                            self.dq_layout))
        descriptors += [TensorDescriptor(t, [t.numel()], [1], [self.block_m], _stats_layout(self.block_m))
                        for t in (lse2, delta)]
        names = ("q_desc", "k_desc", "v_desc", "do_desc", "dq_desc", "lse_desc", "delta_desc", "DK", "DV")
        names += ("LSE", "DELTA") if self.stats_pointers else ()
        tensors = (*descriptors, dk, dv, *((lse2, delta) if self.stats_pointers else ()))
        kwargs = dict(zip(names, tensors, strict=True), **self.arguments)
        main = self.spec.kernel[self.grid](**kwargs, **self.spec.options())
        convert_kwargs = dict(DQ_ACC=dq_acc, DQ=dq, **self.convert_arguments)
        convert = _dq_convert_kernel[self.convert_grid](**convert_kwargs, num_warps=4)
        if self._templates is not None or not self.prepare:
            return
        launches = (prepare_launch(_b7_stats_kernel, stats, self.stats_grid, stats_kwargs,
                                   ("O", "DO", "LSE", "LSE2", "DELTA", "DQ_ACC")),
                    prepare_launch(self.spec.kernel, main, self.grid, kwargs, names),
                    prepare_launch(_dq_convert_kernel, convert, self.convert_grid, convert_kwargs, ("DQ_ACC", "DQ")))
        for descriptor in descriptors:
            descriptor.base = None  # a template keeps no call's tensor alive
        self._templates = tuple(descriptors)
        self._launches = launches if None not in launches else None


def b7_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
                do: torch.Tensor, *, causal: bool = False, scale: float | None = None,
                stage: str = "b7") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) of attention by b7 or one of its variants (``stage``, a key of ``STAGES``; see the module
    docstring) from the forward's o and natural-log lse. ``causal=True`` is top-left aligned. Hopper and
    Triton >= 3.9 only; ``check_inputs`` says what it takes. Each call prepares its launches anew;
    ``flash_attention`` keeps a :class:`BackwardPlan` per layout instead (``backward_plan``)."""
    if stage not in STAGES:
        raise ValueError(f"stage must be one of {', '.join(STAGES)} (got {stage!r})")
    check_inputs(q, k, v, o, lse, do)
    return backward_plan(q, k, causal=causal, scale=scale, stage=stage, prepare=False)(q, k, v, o, lse, do)


def backward_plan(q: torch.Tensor, k: torch.Tensor, *, causal: bool = False, scale: float | None = None,
                  stage: str = "b7", prepare: bool = True) -> BackwardPlan:
    """b7's (or a variant's) :class:`BackwardPlan` for calls of q's and k's layout, inputs already checked."""
    spec = STAGES[stage]
    head_dim = q.shape[3]
    block_m = spec.rows(head_dim)
    return BackwardPlan(spec, q, k, causal=causal, scale=scale, block_m=block_m, kv_rows=ROWS, pad_rows=ROWS,
                        dq_box=(block_m, head_dim // 2), dq_layout=_dq_layout(block_m, head_dim, spec.dq_swizzle),
                        stats_pointers=True, prepare=prepare)
