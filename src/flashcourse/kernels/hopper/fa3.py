"""Forward v8: FlashAttention-3 on Hopper (sm_90), written in Gluon, in measured stages (lesson 13).

Gluon (``triton.experimental.gluon``) is Triton one level down: the program says which warps do what, where each
tensor lives (registers in a stated layout, or shared memory), when TMA copies start and which mbarrier says they
landed. These are the pieces FlashAttention-3 (Shah et al. 2024, sections 3.1-3.2) is built from. Each stage is a
runnable kernel (or a switch of the warp-specialized kernel) that adds one idea:

- v8a ``_fa3_v8a_kernel``: one consumer warpgroup (4 warps, 64 query rows) and no specialization. K and V come in
      by TMA into two shared buffers (tile j+1 is loaded while tile j is computed), QK^T and PV run on
      ``warpgroup_mma`` (wgmma; P stays in registers as the A operand), the online softmax in registers with
      exp2. Expected: about v7 (the same algorithm; wgmma and TMA are what Triton already emits for v7 on
      sm_90), maybe a little less, since v7's 8-warp programs hide more latency than one warpgroup.
- v8b ``_fa3_ws_kernel`` (CONSUMERS=1): a producer warp issues every TMA load into a ring of STAGES shared
      buffers guarded by mbarriers (ready: the bytes landed; empty: the consumer is done with the slot; phase
      bits; the six travel between functions as one ``_Ring``, a Gluon ``aggregate``), and the consumer
      warpgroup only computes (``gl.warp_specialize``). Triton 3.6's warp_specialize always asks for register
      budgets: the producer's warpgroup drops to 24 registers, the consumer rises to 232, and the launch is
      capped at 128 a thread (maxnreg) so that two programs still share an SM as in v8a. Expected: +0-5% over
      v8a (the consumer no longer issues copies and waits less on them), little else: the softmax still waits
      on the GEMMs.
- v8c ``_fa3_ws_kernel`` (CONSUMERS=2, register budgets): two consumer warpgroups (64 rows each of a 128-row
      query tile) share one K/V ring, so each K/V tile read from L2 serves 128 rows, and ``setmaxnreg`` gives the
      producer 24 registers a thread and the consumers 240 (FA3's program: 3 warpgroups, 168 registers a thread
      at launch, one program per SM, 128x128 key tiles at D = 128). Expected: +5-10% over v8b: one 12-warp program per
      SM with room for 64x128 score and output tiles per warpgroup without spills; the two warpgroups overlap
      each other's softmax only by chance (the warp schedulers interleave them freely).
- v8d (OVERLAP): intra-warpgroup overlap: tile j's QK^T and tile j-1's PV are issued together, and tile j's
      softmax runs while PV(j-1) is on the tensor cores (P of the previous tile kept in registers, the output
      rescaled after the PV lands). Expected: +5-10% over v8c (FA3's ablation, Shah et al. 2024 section 4.2,
      non-causal FP16, D = 128, sequence length 8448 on the H100: 661 TFLOP/s, 582 without this two-stage
      pipelining, 570 without warp specialization).
- v8e (PINGPONG): ping-pong of the two consumer warpgroups: mbarriers hand the tensor cores from one
      warpgroup to the other, so warpgroup 0 issues its GEMMs while warpgroup 1 does its softmax and the other
      way round. Expected: +3-8% over v8d, FA3's full schedule; the target is >= 1.0x cuDNN.
- v8f ``_fa3_v8f_kernel`` (persistent): FA3's schedule as its code ships it (``hopper/`` of
      Dao-AILab/flash-attention): v8e's consumer warpgroups, each overlapping its softmax with its next QK^T and
      taking turns at the tensor cores, in a persistent kernel: at most one program per SM, each taking query
      tiles in turn (FA3's tile scheduler; causal tiles in heavy-light pairs of one head, so that the programs'
      work is equal). The producer loads a tile's Q once every warpgroup has finished the last tile's QK^Ts, and
      its K and V while they finish the last tile; the ring's phases and the turns run on from tile to tile. At
      D = 64 three consumer warpgroups (192 query rows a program, 160 registers each, the producer 32: FA3's
      tile at head dim 64; the turns go round the three). Its masks compare each column's offset within the
      thread, a constant, with a per-row limit, so that no register holds a column index (``_v8f_mask``).
      The key tile stays 128 at D = 64, as v8a's: FA3's 176 or 192 keys are no power of two (Gluon's register
      tensors must be), and 256 keys spill (two warpgroups: 120-240 bytes a thread at 240 registers; three at
      160 cannot hold a 64 x 256 score tile). Expected, D = 128: v8d's rate grows with N on the H200 (float16,
      non-causal: 572 TFLOP/s at N = 4096, 619 at 16384; benchmarks/results/2026-12-01-nvidia-h200-fa3-stages.json)
      as a fixed cost per program would: a program fills
      its SM, so nothing hides its start (launch, Q and the first K/V from memory, a first QK^T and softmax with
      nothing to overlap) or its end (the last PV alone, the store). Persistence hides most of both: +3-5% over
      v8d at N = 4096 (about 1.0x cuDNN), +0-2% at 16384; causal at N = 4096 less, since 2048 pairs on 132
      SMs leave the last round half full (about -3%). D = 64: three warpgroups give an SM 12 math warps, as v8a's
      three programs do (v8c-v8e's 8 lose to v8a there), with v8e's schedule and one K/V tile read for 192 rows:
      +2-5% over v8a, >= 1.0x cuDNN; at N = 4096 less, 192-row tiles computing 4224 rows for 4096.

- v8g (HOLD_PV_WAIT): v8d as it was meant to run. Compiled, v8d/v8e/v8f wait for PV(j-1) before their
      exponentials: ptxas moves that wait up to just after the row max (0 of a tile's exponentials between the two
      GEMM waits, Triton 3.6), so the softmax never ran under PV(j-1), which may be why v8d beat v8c by only 3-10%.
      v8g makes the wait for K(j+1) between the softmax and the PV wait: a loop in the PTX, which ptxas moves no
      instruction across. Expected: +3-8% over v8d at D = 128.

- v9a, v9b (``_fa4_stage``): FlashAttention-4's two softmax ideas that need no Blackwell hardware (Zadouri, Shah,
      Dao et al., arXiv 2603.05451, 2026; lesson 14), as switches of the fastest forward of each head dim
      (``Stage.builds_on``: v8f at D = 64, v8d at D = 128), off (0) in every v8 stage, whose compiled code they
      leave as it was. v9a, RESCALE_THRESHOLD = 8: a row keeps its running max while a tile raises it by at most
      8 in log2 units (P then reaches at most 2^8, which 16-bit P and the fp32 sums hold; the final division by
      l undoes whichever max was kept), and the output rows are rescaled only when some row of the warpgroup
      moved its max. Never for FP8 (P near 2^8 times FP8's scale headroom would saturate; fa3.py takes 16-bit
      inputs only). v9b_1of16 / v9b_1of4, EMULATED_COLUMNS = 8 / 32: the first columns of each 128-key tile
      take 2^x from ``_exp2_on_fma`` (FMA and integer units), the rest from MUFU.EX2, which at 16 results a clock
      an SM is the softmax's narrowest unit. Expected (lesson 14's model): v9a +2.3% over v8f at D = 64, +3.4%
      over v8d at D = 128; v9b -1.2% / +1.7% with 1/16, +1.6% / +7.4% with 1/4. Measured on an H100 80GB
      (2026-12-06-nvidia-h100-80gb-hbm3-fa4-stages.json): v9a 0.92-0.97x / 0.96-1.00x its base, v9b 0.90-1.06x
      with 1/16, 0.79-0.98x with 1/4; not dispatched (docs/KERNELS.md, "v9").

(FA3's paper presents ping-pong before the intra-warpgroup overlap; here the overlap comes first because the
ping-pong hand-over is cleanest around the pair of GEMMs that the overlap issues together.)

Head dim 256 (v8c-v8f; ``Stage.head_dims``), sized as FlashAttention-3's ``hopper/`` code sizes it: 128-row query
tiles over two consumer warpgroups of 240 registers (the producer 24), a K/V ring of two stages, P kept in
registers. Shared memory sets the key tile: Q is 128 x 256 x 2 B = 64 KB and each ring stage (K and V) 2 x BLOCK_N x
256 x 2 B, so 64 keys (two stages of 64 KB: 192 KB of the 227 KB a block may have) where FA3 takes 80 (224 KB;
Gluon's register tensors must be powers of two) and 128 would not fit. Registers: a warpgroup's 64 x 256 fp32 output
is 128 registers a thread, the 64 x 64 scores 32 more, P 16. Two changes follow FA3 above D = 128: the overlapped
stages rescale the output rows before the PV product rather than after it (``_rescale_first``), and v8f takes no
ping-pong turns there (FA3's scheduler barrier is for D <= 128). At D 64 and 128 every stage compiles to what it did
before. At D = 256 every stage compiles without spills under Triton 3.6 (the GPU's); under 3.9 v8f's causal kernel
keeps a few values in 48 bytes of local memory a thread. Expected (the stage table's ``by_head_dim``), against v7's
0.79x / 0.84x cuDNN at N = 8192, float16 (2026-12-02): v8d 0.9-1.0x cuDNN, v8e and v8f within a few percent of it.

Layout contract: q (B, H, N_q, D), k and v (B, H, N_kv, D), contiguous, one dtype (float16 or bfloat16), D 64 or 128
(every stage) or 256 (v8c-v8f), no GQA; o like q, lse (B, H, N_q) float32 natural log (as v7, so the backward b1 /
b3 takes it as it is). ``causal=True`` is the top-left alignment (key j visible to query i when j <= i), as
``flash_attention``. The tensors are seen as 2-D (B*H*N, D) for TMA: a tile that runs past its head's last row reads
the next head's rows. For queries that is harmless (those rows are computed and never stored); for keys the masks
give those scores -inf and P exactly 0, but the PV product still multiplies that 0 by the next head's V, and 0 * inf
is NaN: an inf anywhere in another head's V would turn this head's rows to NaN. Past the last head TMA fills zeros.
So the library's default forward (``kernels/plan.py``) sends a call here only when N_kv is a multiple of the stage's
key tile, where no key tile runs past its head; any other length takes v7.

Dispatch: on Hopper with a Triton of ``TESTED_TRITON``, ``flash_attention`` runs v8f at D = 64 and v8d at D = 128
and 256, but for causal calls v8a at D = 64 up to N_q = 8192 (v7 up to 1024) and v8f at D = 128 from 1152 to 8192
(the fastest by length in the H200's 2026-12-02 runs, ``benchmarks/results/*-fa3-stages-*-n1024-*.json`` and
``*-fa3-stages-*-d256.json``; ``kernels/plan.py``'s ``FORWARD_BANDS``) wherever a call fits the contract above
(``kernels.explain`` says which kernel a call runs and why). ``flashcourse.kernels`` imports this module only then,
inside the plan: Gluon's API moves between Triton releases. :class:`ForwardPlan` is the host side the library keeps
per layout; :func:`fa3_forward` runs any stage once (the GPU scripts use it).
"""

# No ``from __future__ import annotations``: Triton 3.6's ``aggregate`` checks each field against its annotation
# as written, and a string annotation is no type.
import copy
import math
from dataclasses import dataclass, field, replace

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from ..common import row_stats_allocator  # how lse is allocated (no tensor kept by a plan made in a graph)
from ..launch import prepare_launch  # the library's repeatable launch: one argument list, tensors swapped per call

try:
    from triton.experimental.gluon import aggregate
except ImportError:  # Triton 3.6: the same decorator, under the name its own Gluon tutorials import
    from triton.language.core import _aggregate as aggregate

# TMA's global -> shared copy: ``async_copy_global_to_shared`` in Triton 3.6, renamed ``async_load`` later (3.9
# keeps the old name only to raise an error).
_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared

# 3.6: run on the H200 (benchmarks/gpu_fa3.py, 2026-12-01), 200 checks against float64. 3.9: on an H100 (2026-12-07),
# v8a-v8f passed gpu_fa3.py's 288 checks, then make test-gpu ran green with the dispatch sending calls here.
TESTED_TRITON = ("3.6", "3.9")

_LOG2E = 1.4426950408889634
_LN2 = gl.constexpr(0.6931471805599453)
# Initial running max: the most negative finite float32. No finite score lies below it, so none is taken for "no
# key" (a start of -1e30 took rows whose scores all lay below it for rows with no key: o = 0), and, finite, it never
# makes exp2(m_old - m_new) compute -inf - (-inf) = NaN on a row whose tiles so far were all masked. (v7's -inf
# with a guarded subtraction is the same rule; here the guard's select would cost v9b a spill.)
_NO_KEY_YET = gl.constexpr(-3.4028234663852886e38)
# The finite start the FP8 stages (fa3_fp8.py) still take.
_MASKED_FILL = gl.constexpr(-1.0e30)
# p(g) ~ 2^g on [0, 1], lowest coefficient first: ``fa4.EXP2_POLY3`` (fitted there, lesson 14), written out because
# the kernels import no NumPy teaching module (tests/test_architecture.py); tests/test_v9_compile.py holds them equal.
EXP2_POLY3 = (1.0, 0.6954245567321777, 0.22630758583545685, 0.07826786488294601)


def centred_exp2_polynomial(poly=EXP2_POLY3) -> tuple[float, ...]:
    """v9b's polynomial, lowest coefficient first. ``EXP2_POLY3`` is p(g) ~ 2^g on [0, 1]; the kernel's
    fraction f = x - round(x) lies in [-0.5, 0.5] (round to nearest is the only rounding a plain float add
    gives), so it evaluates q(f) = p(f + 0.5) / sqrt(2) ~ 2^f, whose relative error is p's (q(f) / 2^f =
    p(g) / 2^g). The coefficients of q: p's, shifted by 0.5 (binomial expansion) and scaled, in float64."""
    coefficients = [0.0] * len(poly)
    for k, c in enumerate(float(c) for c in poly):
        for i in range(k + 1):  # c (f + 0.5)^k = c sum_i C(k, i) f^i 0.5^(k - i)
            coefficients[i] += c * math.comb(k, i) * 0.5 ** (k - i)
    return tuple(c / math.sqrt(2.0) for c in coefficients)


_EXP2_C0, _EXP2_C1, _EXP2_C2, _EXP2_C3 = (gl.constexpr(c) for c in centred_exp2_polynomial())


# ------------------------------------------------------------------------------------------ shared pieces
@gluon.constexpr_function
def _mma_layout(n):
    """wgmma accumulator layout of one warpgroup: 4 warps down the rows (16 rows each per instruction), the
    instruction n-wide (the whole tile width: one wgmma per 16 columns of K)."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, n, 16])


@gluon.constexpr_function
def _rescale_first(head_dim):
    """Whether the overlapped stages rescale the output rows before the PV product that adds to them rather than
    after it (FlashAttention-3's order above head dim 128, ``RescaleOBeforeGemm`` in its ``hopper/`` mainloop).
    At D = 256 the rescale is 128 multiplications a thread: for an SM's two warpgroups 256 cycles of its 128 FP32
    lanes, a quarter of the 1,024 cycles their PV products take at 4,096 FLOP a cycle. After PV it waits on
    that GEMM and delays the next; before PV it runs while QK^T is on the tensor cores."""
    return head_dim > 128


@gluon.jit
def _key_tiles(first_row, N_KV, CAUSAL: gl.constexpr, ROWS: gl.constexpr, BLOCK_N: gl.constexpr):
    """Key tiles of the query rows [first_row, first_row + ROWS): tiles [0, full) need no mask (in range, and
    under causal wholly left of every row); tiles [full, n) are masked."""
    full = N_KV // BLOCK_N
    hi = N_KV
    if CAUSAL:
        hi = gl.minimum(N_KV, first_row + ROWS)
        full = gl.minimum(full, first_row // BLOCK_N)
    n = (hi + BLOCK_N - 1) // BLOCK_N
    return full, n


@gluon.jit
def _softmax_tile(s, m_i, l_i, rows, start_n, N_KV, qk_scale, MASKED: gl.constexpr, CAUSAL: gl.constexpr,
                  BLOCK_N: gl.constexpr, S_LAYOUT: gl.constexpr, RESCALE_THRESHOLD: gl.constexpr = 0.0,
                  EMULATED_COLUMNS: gl.constexpr = 0, P_SHIFT: gl.constexpr = 0.0):
    """The online softmax of one score tile ``s`` (unscaled, fp32, in registers), base 2: returns P (fp32), the
    factor alpha that rescales the old output rows, and the new running max and sum.
    RESCALE_THRESHOLD > 0 (v9a): a row keeps its max while the tile raises it by at most that much (log2 units),
    and P is computed with the max kept (alpha is then exactly 1). EMULATED_COLUMNS > 0 (v9b): the tile's first
    EMULATED_COLUMNS columns take their exponentials from ``_exp2_on_fma``, the others from MUFU.EX2.
    P_SHIFT > 0 (the FP8 stages of fa3_fp8.py, which call this function): P is returned as p * 2^P_SHIFT, the
    kept row max landing on 2^P_SHIFT, and the sum l carries the same factor (the shift is taken off the max in
    the exponent: exact). The 16-bit stages pass 0, and the branch below leaves their code as it was."""
    if MASKED:
        cols = start_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, S_LAYOUT))
        ok = cols[None, :] < N_KV
        if CAUSAL:
            ok = ok & (cols[None, :] <= rows[:, None])
        s = gl.where(ok, s, float("-inf"))
    if RESCALE_THRESHOLD > 0:
        grown = gl.maximum(m_i, gl.max(s, axis=1) * qk_scale)
        # FA4's test (flash_attn/cute/softmax.py, rescale_threshold): move the max only when it grew by more than
        # the threshold. A row's first visible key moves it off the start, the lowest float32 (a score within the
        # threshold of that start may keep it, which is as right). P below uses this m_new, the max kept: computing
        # P with ``grown`` after keeping m_i would mix two scales in one row (trap 1).
        m_new = gl.where(grown - m_i > RESCALE_THRESHOLD, grown, m_i)
    else:
        m_new = gl.maximum(m_i, gl.max(s, axis=1) * qk_scale)  # max commutes with the positive scale
    if P_SHIFT > 0:
        m_exp = m_new - P_SHIFT  # the max P's exponent is taken from
    else:
        m_exp = m_new
    if EMULATED_COLUMNS > 0:
        x = s * qk_scale - m_exp[:, None]
        # In a wgmma accumulator a thread holds the columns 8k + 2 (lane % 4) + b (see _v8f_mask): ``cols & ~6``
        # = 8k + b is the same number in every thread, so this choice is a constant per register and the
        # compiler keeps only one of the two exponentials for each (EMULATED_COLUMNS a multiple of 8).
        cols = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, S_LAYOUT))
        on_fma = (cols & ~6) < EMULATED_COLUMNS
        p = gl.where(on_fma[None, :], _exp2_on_fma(x), gl.exp2(x))
    else:
        p = gl.exp2(s * qk_scale - m_exp[:, None])  # one FMA + one EX2 per score
    alpha = gl.exp2(m_i - m_new)
    l_i = l_i * alpha + gl.sum(p, axis=1)
    return p, alpha, m_new, l_i


@gluon.jit
def _exp2_on_fma(x):
    """2^x in float32 on the FMA and integer units, no MUFU.EX2 (FlashAttention-4's software exp2,
    ``ex2_emulation`` in flash_attn/cute/utils.py; lesson 14): x = n + f with n = round(x) and f in [-0.5, 0.5],
    2^f by a degree-3 polynomial (Horner: three FMAs), and n added into the float's exponent field.
    Adding 1.5 * 2^23 rounds x to an integer n (the float's last place there is 1) and leaves n in the low
    mantissa bits: shifted left by 23 they are n's exponent increment (the sum's other bits shift out).
    x is first clamped to -126: a masked score (-inf) then gives 2^-126 or less, never a negative or NaN
    bit pattern; beside the row's max term (1) it is nothing, as fa4.exp2_emulated's flush to 0 is. The 16-bit
    stages pass x <= 0; the FP8 stages (fa3_fp8.py) x <= P_SHIFT + RESCALE_THRESHOLD = 8: a positive n lands in
    the exponent field as a negative one does (the low 9 bits of 1.5 * 2^23 are 0, so only n survives the
    shift)."""
    x = gl.maximum(x, -126.0)
    rounded = x + 12582912.0  # 1.5 * 2^23
    frac = x - (rounded - 12582912.0)
    power = ((_EXP2_C3 * frac + _EXP2_C2) * frac + _EXP2_C1) * frac + _EXP2_C0
    bits = power.to(gl.int32, bitcast=True) + (rounded.to(gl.int32, bitcast=True) << 23)
    return bits.to(gl.float32, bitcast=True)


@gluon.jit
def _rescale_when_moved(acc, alpha, O_LAYOUT: gl.constexpr):
    """v9a: acc * alpha (one row factor each) only if some row of the warpgroup moved its max; when none did,
    every alpha is 2^0 = 1 and the 64 x D multiplications are skipped. A row that moved its max moved it by more
    than the threshold (8 in 16 bits, 2 in FP8, at least 1), so its alpha is below 2^-1: testing against 0.5
    separates the two whatever the last bits of MUFU.EX2's 2^0. The test is one value for the whole warpgroup (a
    reduction over its 64 rows, through shared memory), so the branch is uniform: FA4 decides per warp."""
    if gl.min(alpha, axis=0) < 0.5:
        acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, O_LAYOUT))[:, None]
    return acc


@gluon.jit
def _store_rows(acc, m_i, l_i, O, LSE, bh, m0, N_Q, HEAD_DIM: gl.constexpr, ROWS: gl.constexpr,
                S_LAYOUT: gl.constexpr, O_LAYOUT: gl.constexpr):
    """o = acc / l (in O's dtype) and the natural lse of rows [m0, m0 + ROWS) of head ``bh``; rows past N_Q are
    not written; a row that saw no key gets o = 0 and lse = -inf."""
    empty = l_i == 0.0
    l_safe = gl.where(empty, 1.0, l_i)
    lse = gl.where(empty, float("-inf"), (m_i + gl.log2(l_safe)) * _LN2)
    o = acc / gl.convert_layout(l_safe, gl.SliceLayout(1, O_LAYOUT))[:, None]
    base = bh.to(gl.int64) * N_Q
    rows = m0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, O_LAYOUT))
    cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, O_LAYOUT))
    ptrs = O + (base + rows)[:, None] * HEAD_DIM + cols[None, :]
    mask = (rows < N_Q)[:, None] & (cols < HEAD_DIM)[None, :]
    gl.store(ptrs, o.to(O.dtype.element_ty), mask=mask)
    lse_rows = m0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, S_LAYOUT))
    gl.store(LSE + base + lse_rows, lse, mask=lse_rows < N_Q)


# ------------------------------------------------------------------------------------------ v8a
@gluon.jit
def _v8a_tiles(acc, m_i, l_i, q_smem, k_smem, v_smem, k_bars, v_bars, k_desc, v_desc, rows, kv_row, j_lo, j_hi,
               n_tiles, N_KV, qk_scale, MASKED: gl.constexpr, CAUSAL: gl.constexpr, BLOCK_N: gl.constexpr,
               S_LAYOUT: gl.constexpr, O_LAYOUT: gl.constexpr):
    """Key tiles [j_lo, j_hi) of v8a: load tile j+1 into the other buffer, then QK^T, softmax, PV of tile j."""
    zero = gl.zeros([rows.shape[0], BLOCK_N], gl.float32, S_LAYOUT)
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=O_LAYOUT, k_width=2)
    for j in range(j_lo, j_hi):
        slot = j % 2
        phase = (j // 2) & 1
        nxt = j + 1
        more = nxt < n_tiles
        # The other buffer held tile j-1, whose GEMMs finished last iteration: refill it now.
        mbarrier.expect(k_bars.index(nxt % 2), k_desc.block_type.nbytes, pred=more)
        _tma_load(k_desc, [kv_row + nxt * BLOCK_N, 0], k_bars.index(nxt % 2), k_smem.index(nxt % 2), pred=more)
        mbarrier.expect(v_bars.index(nxt % 2), v_desc.block_type.nbytes, pred=more)
        _tma_load(v_desc, [kv_row + nxt * BLOCK_N, 0], v_bars.index(nxt % 2), v_smem.index(nxt % 2), pred=more)

        mbarrier.wait(k_bars.index(slot), phase)
        s = warpgroup_mma(q_smem, k_smem.index(slot).permute((1, 0)), zero, use_acc=False, is_async=True)
        s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
        p, alpha, m_i, l_i = _softmax_tile(s, m_i, l_i, rows, j * BLOCK_N, N_KV, qk_scale, MASKED=MASKED,
                                           CAUSAL=CAUSAL, BLOCK_N=BLOCK_N, S_LAYOUT=S_LAYOUT)
        acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, O_LAYOUT))[:, None]
        p = gl.convert_layout(p.to(v_desc.dtype), p_layout)
        mbarrier.wait(v_bars.index(slot), phase)
        acc = warpgroup_mma(p, v_smem.index(slot), acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    return acc, m_i, l_i


@gluon.jit(do_not_specialize=["N_Q", "N_KV"])  # one compile serves every length
def _fa3_v8a_kernel(q_desc, k_desc, v_desc, O, LSE, qk_scale, N_Q, N_KV, CAUSAL: gl.constexpr):
    """v8a: one warpgroup, TMA double buffer, wgmma for both GEMMs, no specialization (launch with 4 warps)."""
    BLOCK_M: gl.constexpr = q_desc.block_type.shape[0]
    HEAD_DIM: gl.constexpr = q_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[0]
    S_LAYOUT: gl.constexpr = _mma_layout(BLOCK_N)
    O_LAYOUT: gl.constexpr = _mma_layout(HEAD_DIM)

    pid_m = gl.program_id(0)
    if CAUSAL:  # heaviest query tiles first: the last wave is made of short programs
        pid_m = gl.num_programs(0) - 1 - pid_m
    bh = gl.program_id(1)
    m0 = pid_m * BLOCK_M
    kv_row = bh * N_KV
    full, n_tiles = _key_tiles(m0, N_KV, CAUSAL=CAUSAL, ROWS=BLOCK_M, BLOCK_N=BLOCK_N)

    q_smem = gl.allocate_shared_memory(q_desc.dtype, [BLOCK_M, HEAD_DIM], q_desc.layout)
    k_smem = gl.allocate_shared_memory(k_desc.dtype, [2, BLOCK_N, HEAD_DIM], k_desc.layout)
    v_smem = gl.allocate_shared_memory(v_desc.dtype, [2, BLOCK_N, HEAD_DIM], v_desc.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_bars = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    v_bars = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(2):
        mbarrier.init(k_bars.index(i), count=1)
        mbarrier.init(v_bars.index(i), count=1)

    mbarrier.expect(q_bar, q_desc.block_type.nbytes)
    _tma_load(q_desc, [bh * N_Q + m0, 0], q_bar, q_smem)
    first = n_tiles > 0
    mbarrier.expect(k_bars.index(0), k_desc.block_type.nbytes, pred=first)
    _tma_load(k_desc, [kv_row, 0], k_bars.index(0), k_smem.index(0), pred=first)
    mbarrier.expect(v_bars.index(0), v_desc.block_type.nbytes, pred=first)
    _tma_load(v_desc, [kv_row, 0], v_bars.index(0), v_smem.index(0), pred=first)

    rows = m0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, S_LAYOUT))
    m_i = gl.full([BLOCK_M], _NO_KEY_YET, gl.float32, layout=gl.SliceLayout(1, S_LAYOUT))
    l_i = gl.zeros([BLOCK_M], gl.float32, layout=gl.SliceLayout(1, S_LAYOUT))
    acc = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, layout=O_LAYOUT)
    mbarrier.wait(q_bar, 0)
    acc, m_i, l_i = _v8a_tiles(acc, m_i, l_i, q_smem, k_smem, v_smem, k_bars, v_bars, k_desc, v_desc, rows,
                               kv_row, 0, full, n_tiles, N_KV, qk_scale, MASKED=False, CAUSAL=CAUSAL,
                               BLOCK_N=BLOCK_N, S_LAYOUT=S_LAYOUT, O_LAYOUT=O_LAYOUT)
    acc, m_i, l_i = _v8a_tiles(acc, m_i, l_i, q_smem, k_smem, v_smem, k_bars, v_bars, k_desc, v_desc, rows,
                               kv_row, full, n_tiles, n_tiles, N_KV, qk_scale, MASKED=True, CAUSAL=CAUSAL,
                               BLOCK_N=BLOCK_N, S_LAYOUT=S_LAYOUT, O_LAYOUT=O_LAYOUT)
    mbarrier.invalidate(q_bar)
    for i in gl.static_range(2):
        mbarrier.invalidate(k_bars.index(i))
        mbarrier.invalidate(v_bars.index(i))
    _store_rows(acc, m_i, l_i, O, LSE, bh, m0, N_Q, HEAD_DIM=HEAD_DIM, ROWS=BLOCK_M, S_LAYOUT=S_LAYOUT,
                O_LAYOUT=O_LAYOUT)


# ------------------------------------------------------------------------------------------ v8b-v8e
@aggregate
class _Ring:
    """The K/V ring of v8b-v8e: slot i holds ``k_smem.index(i)`` and ``v_smem.index(i)``; the producer's TMA
    arrives on ``k_ready.index(i)`` / ``v_ready.index(i)`` (by byte count) once a tile landed, every consumer
    warpgroup on ``k_empty.index(i)`` / ``v_empty.index(i)`` once it no longer reads it. One named bundle (the
    compiler flattens it back into the six values) instead of six arguments that must come in the right order."""

    k_smem: gl.shared_memory_descriptor
    v_smem: gl.shared_memory_descriptor
    k_ready: gl.shared_memory_descriptor
    k_empty: gl.shared_memory_descriptor
    v_ready: gl.shared_memory_descriptor
    v_empty: gl.shared_memory_descriptor

    @gluon.constexpr_function  # runs while the kernel is traced: it only names the values
    def __init__(self, k_smem, v_smem, k_ready, k_empty, v_ready, v_empty):
        self.k_smem = k_smem
        self.v_smem = v_smem
        self.k_ready = k_ready
        self.k_empty = k_empty
        self.v_ready = v_ready
        self.v_empty = v_empty


@gluon.jit
def _ws_producer(q_desc, k_desc, v_desc, q_smem, q_bars, ring, q_row, kv_row, n_tiles, CONSUMERS: gl.constexpr,
                 STAGES: gl.constexpr):
    """The producer warp: Q once (one tile per consumer warpgroup), then K and V tile by tile into the ring (a
    ``_Ring``). A slot is refilled only after every consumer arrived on its ``empty`` barrier; on the first pass
    round the ring the wait is for phase 1 of a fresh barrier, which counts as already complete."""
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[0]
    for w in gl.static_range(CONSUMERS):
        mbarrier.expect(q_bars.index(w), q_desc.block_type.nbytes)
        _tma_load(q_desc, [q_row + w * q_desc.block_type.shape[0], 0], q_bars.index(w), q_smem.index(w))
    for j in range(n_tiles):
        slot = j % STAGES
        phase = (j // STAGES) & 1
        mbarrier.wait(ring.k_empty.index(slot), phase ^ 1)
        mbarrier.expect(ring.k_ready.index(slot), k_desc.block_type.nbytes)
        _tma_load(k_desc, [kv_row + j * BLOCK_N, 0], ring.k_ready.index(slot), ring.k_smem.index(slot))
        mbarrier.wait(ring.v_empty.index(slot), phase ^ 1)
        mbarrier.expect(ring.v_ready.index(slot), v_desc.block_type.nbytes)
        _tma_load(v_desc, [kv_row + j * BLOCK_N, 0], ring.v_ready.index(slot), ring.v_smem.index(slot))


@gluon.jit
def _ws_tiles(acc, m_i, l_i, q_smem, ring, rows, j_lo, j_hi, N_KV, qk_scale, MASKED: gl.constexpr,
              CAUSAL: gl.constexpr, STAGES: gl.constexpr, BLOCK_N: gl.constexpr, S_LAYOUT: gl.constexpr,
              O_LAYOUT: gl.constexpr):
    """Key tiles [j_lo, j_hi) of a consumer warpgroup without overlap (v8b, v8c): wait for K, QK^T, free K,
    softmax, wait for V, PV, free V."""
    zero = gl.zeros([rows.shape[0], BLOCK_N], gl.float32, S_LAYOUT)
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=O_LAYOUT, k_width=2)
    for j in range(j_lo, j_hi):
        slot = j % STAGES
        phase = (j // STAGES) & 1
        mbarrier.wait(ring.k_ready.index(slot), phase)
        s = warpgroup_mma(q_smem, ring.k_smem.index(slot).permute((1, 0)), zero, use_acc=False, is_async=True)
        s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
        mbarrier.arrive(ring.k_empty.index(slot))
        p, alpha, m_i, l_i = _softmax_tile(s, m_i, l_i, rows, j * BLOCK_N, N_KV, qk_scale, MASKED=MASKED,
                                           CAUSAL=CAUSAL, BLOCK_N=BLOCK_N, S_LAYOUT=S_LAYOUT)
        acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, O_LAYOUT))[:, None]
        p = gl.convert_layout(p.to(ring.v_smem.dtype), p_layout)
        mbarrier.wait(ring.v_ready.index(slot), phase)
        acc = warpgroup_mma(p, ring.v_smem.index(slot), acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        mbarrier.arrive(ring.v_empty.index(slot))
    return acc, m_i, l_i


@gluon.jit
def _ws_tiles_overlapped(acc, p_prev, alpha_prev, m_i, l_i, q_smem, ring, turns, wg: gl.constexpr, rows, j_lo,
                         j_hi, n_tiles, N_KV, qk_scale, MASKED: gl.constexpr, CAUSAL: gl.constexpr,
                         PINGPONG: gl.constexpr, HOLD_PV_WAIT: gl.constexpr, STAGES: gl.constexpr,
                         BLOCK_N: gl.constexpr, S_LAYOUT: gl.constexpr, O_LAYOUT: gl.constexpr,
                         RESCALE_THRESHOLD: gl.constexpr, EMULATED_COLUMNS: gl.constexpr):
    """Key tiles [j_lo, j_hi), j_lo >= 1, with intra-warpgroup overlap (v8d): QK^T of tile j and PV of tile j-1
    (P of tile j-1 waiting in registers) are issued together; tile j's softmax runs while PV(j-1) is still on
    the tensor cores; the output rows are rescaled by tile j's alpha once that PV has landed.
    At D = 256 (``_rescale_first``) the output rows are rescaled earlier instead, by tile j-1's alpha
    (``alpha_prev``), between issuing QK^T(j) and PV(j-1), while QK^T is on the tensor cores: the 128
    multiplications a thread of a 64 x 256 output tile then wait on no GEMM.
    PINGPONG (v8e): warpgroup ``wg`` issues that pair of GEMMs only in its turn. Turn t (tile t+1) of warpgroup
    0 waits for warpgroup 1's turn t-1, turn t of warpgroup 1 for warpgroup 0's turn t; each arrives on the
    other's barrier once its GEMMs are issued, so one's softmax runs under the other's GEMMs.
    HOLD_PV_WAIT (v8g): the wait for K(j+1), which the next iteration makes first, is made here too, between
    the softmax and the wait for PV(j-1). Without it ptxas (Triton 3.6 and 3.9) moves the wait for PV(j-1)
    (``WARPGROUP.DEPBAR.LE gsb0, 0x0``) up to just after the row max, above every exponential of the tile, and
    the softmax never runs under PV(j-1). An mbarrier wait is a loop in the PTX, a block boundary ptxas moves
    no instruction across, so the exponentials stay between the two GEMM waits (as fa3_fp8's v8e_fp8 does).
    It cannot deadlock: when it is made, this warpgroup has released K up to tile j and V up to tile j-2, and
    the producer, which loads K(0), V(0), K(1), V(1), ... in order, needs no more to load K(j+1): before it the
    slots of K(j+1-STAGES) and V(j-STAGES), released for STAGES >= 2 (with one stage V(j-1) would be needed,
    which is freed only after this wait). ``n_tiles``: the program's key tiles (no K(j+1) past the last); the
    masked loop's first wait then finds the phase it waits for already complete."""
    RESCALE_FIRST: gl.constexpr = _rescale_first(acc.shape[1])
    zero = gl.zeros([rows.shape[0], BLOCK_N], gl.float32, S_LAYOUT)
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=O_LAYOUT, k_width=2)
    for j in range(j_lo, j_hi):
        slot = j % STAGES
        phase = (j // STAGES) & 1
        prev = (j - 1) % STAGES
        prev_phase = ((j - 1) // STAGES) & 1
        turn = j - 1
        mbarrier.wait(ring.k_ready.index(slot), phase)
        mbarrier.wait(ring.v_ready.index(prev), prev_phase)
        if PINGPONG:
            if wg == 0:
                mbarrier.wait(turns.index(0), (turn - 1) & 1, pred=turn > 0)
            else:
                mbarrier.wait(turns.index(1), turn & 1)
        s = warpgroup_mma(q_smem, ring.k_smem.index(slot).permute((1, 0)), zero, use_acc=False, is_async=True)
        if RESCALE_FIRST:
            acc = acc * alpha_prev[:, None]
        acc = warpgroup_mma(p_prev, ring.v_smem.index(prev), acc, is_async=True)
        if PINGPONG:
            mbarrier.arrive(turns.index(1 - wg))
        s = warpgroup_mma_wait(num_outstanding=1, deps=(s,))
        mbarrier.arrive(ring.k_empty.index(slot))
        p, alpha, m_i, l_i = _softmax_tile(s, m_i, l_i, rows, j * BLOCK_N, N_KV, qk_scale, MASKED=MASKED,
                                           CAUSAL=CAUSAL, BLOCK_N=BLOCK_N, S_LAYOUT=S_LAYOUT,
                                           RESCALE_THRESHOLD=RESCALE_THRESHOLD, EMULATED_COLUMNS=EMULATED_COLUMNS)
        if HOLD_PV_WAIT:
            nxt = j + 1
            mbarrier.wait(ring.k_ready.index(nxt % STAGES), (nxt // STAGES) & 1, pred=nxt < n_tiles)
        acc, p_prev = warpgroup_mma_wait(num_outstanding=0, deps=(acc, p_prev))
        mbarrier.arrive(ring.v_empty.index(prev))
        if RESCALE_FIRST:
            alpha_prev = gl.convert_layout(alpha, gl.SliceLayout(1, O_LAYOUT))
        elif RESCALE_THRESHOLD > 0:
            acc = _rescale_when_moved(acc, alpha, O_LAYOUT=O_LAYOUT)
        else:
            acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, O_LAYOUT))[:, None]
        p_prev = gl.convert_layout(p.to(ring.v_smem.dtype), p_layout)
    return acc, p_prev, alpha_prev, m_i, l_i


@gluon.jit
def _ws_consumer(wg: gl.constexpr, O, LSE, qk_scale, q_smem, q_bars, ring, turns, bh, m0, full, n_tiles, N_Q, N_KV,
                 CAUSAL: gl.constexpr, OVERLAP: gl.constexpr, PINGPONG: gl.constexpr, HOLD_PV_WAIT: gl.constexpr,
                 STAGES: gl.constexpr, RESCALE_THRESHOLD: gl.constexpr, EMULATED_COLUMNS: gl.constexpr):
    """One consumer warpgroup: 64 query rows from m0, every key tile of the program, then the store."""
    ROWS: gl.constexpr = q_smem.shape[1]
    HEAD_DIM: gl.constexpr = q_smem.shape[2]
    BLOCK_N: gl.constexpr = ring.k_smem.shape[1]
    S_LAYOUT: gl.constexpr = _mma_layout(BLOCK_N)
    O_LAYOUT: gl.constexpr = _mma_layout(HEAD_DIM)
    q_tile = q_smem.index(wg)
    rows = m0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, S_LAYOUT))
    m_i = gl.full([ROWS], _NO_KEY_YET, gl.float32, layout=gl.SliceLayout(1, S_LAYOUT))
    l_i = gl.zeros([ROWS], gl.float32, layout=gl.SliceLayout(1, S_LAYOUT))
    acc = gl.zeros([ROWS, HEAD_DIM], gl.float32, layout=O_LAYOUT)
    mbarrier.wait(q_bars.index(wg), 0)
    if OVERLAP:
        p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=O_LAYOUT, k_width=2)
        if n_tiles > 0:  # always (the host never launches N_KV = 0); keeps tile 0 in a block of its own
            # Tile 0 alone: QK^T and softmax; its PV goes out with tile 1's QK^T.
            mbarrier.wait(ring.k_ready.index(0), 0)
            zero = gl.zeros([ROWS, BLOCK_N], gl.float32, S_LAYOUT)
            s = warpgroup_mma(q_tile, ring.k_smem.index(0).permute((1, 0)), zero, use_acc=False, is_async=True)
            s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
            mbarrier.arrive(ring.k_empty.index(0))
            if full > 0:
                p, alpha, m_i, l_i = _softmax_tile(s, m_i, l_i, rows, 0, N_KV, qk_scale, MASKED=False,
                                                   CAUSAL=CAUSAL, BLOCK_N=BLOCK_N, S_LAYOUT=S_LAYOUT,
                                                   RESCALE_THRESHOLD=RESCALE_THRESHOLD,
                                                   EMULATED_COLUMNS=EMULATED_COLUMNS)
            else:
                p, alpha, m_i, l_i = _softmax_tile(s, m_i, l_i, rows, 0, N_KV, qk_scale, MASKED=True,
                                                   CAUSAL=CAUSAL, BLOCK_N=BLOCK_N, S_LAYOUT=S_LAYOUT,
                                                   RESCALE_THRESHOLD=RESCALE_THRESHOLD,
                                                   EMULATED_COLUMNS=EMULATED_COLUMNS)
            p_prev = gl.convert_layout(p.to(ring.v_smem.dtype), p_layout)
            # Tile 0's alpha: the D = 256 order multiplies the (zero) output rows by it before tile 0's PV.
            alpha_prev = gl.convert_layout(alpha, gl.SliceLayout(1, O_LAYOUT))
            acc, p_prev, alpha_prev, m_i, l_i = _ws_tiles_overlapped(
                acc, p_prev, alpha_prev, m_i, l_i, q_tile, ring, turns, wg, rows, 1, gl.maximum(full, 1), n_tiles,
                N_KV, qk_scale, MASKED=False, CAUSAL=CAUSAL, PINGPONG=PINGPONG, HOLD_PV_WAIT=HOLD_PV_WAIT,
                STAGES=STAGES, BLOCK_N=BLOCK_N, S_LAYOUT=S_LAYOUT, O_LAYOUT=O_LAYOUT,
                RESCALE_THRESHOLD=RESCALE_THRESHOLD, EMULATED_COLUMNS=EMULATED_COLUMNS)
            acc, p_prev, alpha_prev, m_i, l_i = _ws_tiles_overlapped(
                acc, p_prev, alpha_prev, m_i, l_i, q_tile, ring, turns, wg, rows, gl.maximum(full, 1), n_tiles,
                n_tiles, N_KV, qk_scale, MASKED=True, CAUSAL=CAUSAL, PINGPONG=PINGPONG, HOLD_PV_WAIT=HOLD_PV_WAIT,
                STAGES=STAGES, BLOCK_N=BLOCK_N, S_LAYOUT=S_LAYOUT, O_LAYOUT=O_LAYOUT,
                RESCALE_THRESHOLD=RESCALE_THRESHOLD, EMULATED_COLUMNS=EMULATED_COLUMNS)
            # The last tile's PV.
            last = (n_tiles - 1) % STAGES
            mbarrier.wait(ring.v_ready.index(last), ((n_tiles - 1) // STAGES) & 1)
            if _rescale_first(HEAD_DIM):
                acc = acc * alpha_prev[:, None]
            acc = warpgroup_mma(p_prev, ring.v_smem.index(last), acc, is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
            mbarrier.arrive(ring.v_empty.index(last))
    else:
        acc, m_i, l_i = _ws_tiles(acc, m_i, l_i, q_tile, ring, rows, 0, full, N_KV, qk_scale, MASKED=False,
                                  CAUSAL=CAUSAL, STAGES=STAGES, BLOCK_N=BLOCK_N, S_LAYOUT=S_LAYOUT,
                                  O_LAYOUT=O_LAYOUT)
        acc, m_i, l_i = _ws_tiles(acc, m_i, l_i, q_tile, ring, rows, full, n_tiles, N_KV, qk_scale, MASKED=True,
                                  CAUSAL=CAUSAL, STAGES=STAGES, BLOCK_N=BLOCK_N, S_LAYOUT=S_LAYOUT,
                                  O_LAYOUT=O_LAYOUT)
    _store_rows(acc, m_i, l_i, O, LSE, bh, m0, N_Q, HEAD_DIM=HEAD_DIM, ROWS=ROWS, S_LAYOUT=S_LAYOUT,
                O_LAYOUT=O_LAYOUT)


@gluon.jit
def _ws_consumer0(O, LSE, qk_scale, q_smem, q_bars, ring, turns, bh, m0, full, n_tiles, N_Q, N_KV,
                  CAUSAL: gl.constexpr, OVERLAP: gl.constexpr, PINGPONG: gl.constexpr, HOLD_PV_WAIT: gl.constexpr,
                  STAGES: gl.constexpr, RESCALE_THRESHOLD: gl.constexpr, EMULATED_COLUMNS: gl.constexpr):
    """The default partition: consumer warpgroup 0."""
    _ws_consumer(0, O, LSE, qk_scale, q_smem, q_bars, ring, turns, bh, m0, full, n_tiles, N_Q, N_KV, CAUSAL=CAUSAL,
                 OVERLAP=OVERLAP, PINGPONG=PINGPONG, HOLD_PV_WAIT=HOLD_PV_WAIT, STAGES=STAGES,
                 RESCALE_THRESHOLD=RESCALE_THRESHOLD, EMULATED_COLUMNS=EMULATED_COLUMNS)


@gluon.jit
def _ws_consumer1(O, LSE, qk_scale, q_smem, q_bars, ring, turns, bh, m0, full, n_tiles, N_Q, N_KV,
                  CAUSAL: gl.constexpr, OVERLAP: gl.constexpr, PINGPONG: gl.constexpr, HOLD_PV_WAIT: gl.constexpr,
                  STAGES: gl.constexpr, RESCALE_THRESHOLD: gl.constexpr, EMULATED_COLUMNS: gl.constexpr):
    """A worker partition of 4 warps: consumer warpgroup 1, the next 64 rows of the program's query tile."""
    ROWS: gl.constexpr = q_smem.shape[1]
    _ws_consumer(1, O, LSE, qk_scale, q_smem, q_bars, ring, turns, bh, m0 + ROWS, full, n_tiles, N_Q, N_KV,
                 CAUSAL=CAUSAL, OVERLAP=OVERLAP, PINGPONG=PINGPONG, HOLD_PV_WAIT=HOLD_PV_WAIT, STAGES=STAGES,
                 RESCALE_THRESHOLD=RESCALE_THRESHOLD, EMULATED_COLUMNS=EMULATED_COLUMNS)


@gluon.jit(do_not_specialize=["N_Q", "N_KV"])
def _fa3_ws_kernel(q_desc, k_desc, v_desc, O, LSE, qk_scale, N_Q, N_KV, CAUSAL: gl.constexpr,
                   CONSUMERS: gl.constexpr, STAGES: gl.constexpr, OVERLAP: gl.constexpr, PINGPONG: gl.constexpr,
                   HOLD_PV_WAIT: gl.constexpr, PRODUCER_REGS: gl.constexpr, CONSUMER_REGS: gl.constexpr,
                   RESCALE_THRESHOLD: gl.constexpr, EMULATED_COLUMNS: gl.constexpr):
    """v8b-v8e: a producer warp and CONSUMERS warpgroups of 4 warps (launch with num_warps=4: the default
    partition is consumer 0). A program takes CONSUMERS * 64 query rows (q_desc's block is one warpgroup's)."""
    ROWS: gl.constexpr = q_desc.block_type.shape[0]
    HEAD_DIM: gl.constexpr = q_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[0]
    BLOCK_M: gl.constexpr = ROWS * CONSUMERS

    pid_m = gl.program_id(0)
    if CAUSAL:
        pid_m = gl.num_programs(0) - 1 - pid_m
    bh = gl.program_id(1)
    m0 = pid_m * BLOCK_M
    # Every warpgroup of the program walks the same key tiles (those of all BLOCK_M rows), so the ring is shared
    # tile for tile; warpgroup 0's extra diagonal tile under causal is masked away.
    full, n_tiles = _key_tiles(m0, N_KV, CAUSAL=CAUSAL, ROWS=BLOCK_M, BLOCK_N=BLOCK_N)

    q_smem = gl.allocate_shared_memory(q_desc.dtype, [CONSUMERS, ROWS, HEAD_DIM], q_desc.layout)
    k_smem = gl.allocate_shared_memory(k_desc.dtype, [STAGES, BLOCK_N, HEAD_DIM], k_desc.layout)
    v_smem = gl.allocate_shared_memory(v_desc.dtype, [STAGES, BLOCK_N, HEAD_DIM], v_desc.layout)
    q_bars = gl.allocate_shared_memory(gl.int64, [CONSUMERS, 1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    turns = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for w in gl.static_range(CONSUMERS):
        mbarrier.init(q_bars.index(w), count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(k_empty.index(i), count=CONSUMERS)  # every consumer warpgroup frees the slot
        mbarrier.init(v_empty.index(i), count=CONSUMERS)
    for i in gl.static_range(2):
        mbarrier.init(turns.index(i), count=1)
    ring = _Ring(k_smem, v_smem, k_ready, k_empty, v_ready, v_empty)

    # The argument tuples are written out in each call: a tuple held in a variable turns its constexprs into
    # run-time values (Triton 3.6), and the partitions need CAUSAL, OVERLAP, ... at compile time.
    q_row = bh * N_Q + m0
    kv_row = bh * N_KV
    if CONSUMERS == 2:
        gl.warp_specialize([
            (_ws_consumer0, (O, LSE, qk_scale, q_smem, q_bars, ring, turns, bh, m0, full, n_tiles, N_Q, N_KV,
                             CAUSAL, OVERLAP, PINGPONG, HOLD_PV_WAIT, STAGES, RESCALE_THRESHOLD,
                             EMULATED_COLUMNS)),
            (_ws_consumer1, (O, LSE, qk_scale, q_smem, q_bars, ring, turns, bh, m0, full, n_tiles, N_Q, N_KV,
                             CAUSAL, OVERLAP, PINGPONG, HOLD_PV_WAIT, STAGES, RESCALE_THRESHOLD,
                             EMULATED_COLUMNS)),
            (_ws_producer, (q_desc, k_desc, v_desc, q_smem, q_bars, ring, q_row, kv_row, n_tiles, CONSUMERS,
                            STAGES)),
        ], [4, 1], [CONSUMER_REGS, PRODUCER_REGS])
    else:
        gl.warp_specialize([
            (_ws_consumer0, (O, LSE, qk_scale, q_smem, q_bars, ring, turns, bh, m0, full, n_tiles, N_Q, N_KV,
                             CAUSAL, OVERLAP, PINGPONG, HOLD_PV_WAIT, STAGES, RESCALE_THRESHOLD,
                             EMULATED_COLUMNS)),
            (_ws_producer, (q_desc, k_desc, v_desc, q_smem, q_bars, ring, q_row, kv_row, n_tiles, CONSUMERS,
                            STAGES)),
        ], [1], [PRODUCER_REGS])

# ------------------------------------------------------------------------------------------ v8f
@gluon.jit
def _v8f_unit(unit, n_m, CAUSAL: gl.constexpr):
    """Work unit ``unit`` of v8f's persistent loop as (bh, tile, items). Without causal a unit is one query tile
    (``tile``) of head ``bh``. Under causal it is a pair of query tiles of head ``bh``, the heavy n_m - 1 - tile
    and the light ``tile`` (one tile where the two coincide): their key tiles add up to about n_m + 1 whatever the
    pair, so programs that take units in turn get equal work. Consecutive units share a head, so the programs
    running at one time read the same keys and values through L2, as v8a-v8e's programs do."""
    if CAUSAL:
        per_head = (n_m + 1) // 2
        bh = unit // per_head
        tile = unit % per_head
        items = 1 + (n_m - 1 - tile != tile).to(gl.int32)
    else:
        bh = unit // n_m
        tile = unit % n_m
        items = 1
    return bh, tile, items


@gluon.jit
def _v8f_query_tile(tile, half, n_m, CAUSAL: gl.constexpr):
    """The query tile of item ``half`` (0 or 1) of a unit (see ``_v8f_unit``): under causal the heavy one first."""
    pid_m = tile
    if CAUSAL:
        pid_m = n_m - 1 - tile - half * (n_m - 1 - 2 * tile)
    return pid_m


@gluon.jit
def _v8f_mask(s, rows, start_n, N_KV, CAUSAL: gl.constexpr, S_LAYOUT: gl.constexpr):
    """``s`` with -inf where key start_n + c is past N_KV or (causal) past the row: ``_softmax_tile``'s mask,
    written so that it costs no register per column. In a wgmma accumulator a thread holds the columns
    8k + 2 (lane % 4) + b (k = 0, 1, ...; b = 0, 1): ``cols & ~6`` = 8k + b is the same in every thread, a
    constant the compiler folds into each comparison, and ``cols & 6`` is the thread's lane offset, one value.
    So key c is visible when 8k + b <= last - lane offset, with ``last`` the row's last visible key (relative
    to start_n): two subtractions a row, then comparisons with constants (CUTLASS's FlashAttention-3 masks
    subtract the thread's column offset the same way). ``_softmax_tile``'s form, cols <= row, keeps all the
    column indices live across the loops: the 160-register warpgroups of D = 64 spilled."""
    BLOCK_N: gl.constexpr = s.shape[1]
    cols = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, S_LAYOUT))
    fixed = cols & ~6
    lane = cols & 6
    last = gl.full([s.shape[0]], N_KV - 1 - start_n, gl.int32, layout=gl.SliceLayout(1, S_LAYOUT))
    if CAUSAL:
        last = gl.minimum(last, rows - start_n)
    ok = fixed[None, :] <= last[:, None] - lane[None, :]
    return gl.where(ok, s, float("-inf"))


@gluon.jit
def _v8f_producer(q_desc, k_desc, v_desc, q_smem, q_bars, q_empty, ring, first, step, n_units, n_m, N_Q, N_KV,
                  CAUSAL: gl.constexpr, CONSUMERS: gl.constexpr, STAGES: gl.constexpr):
    """v8f's producer warp: for each query tile the program takes, its Q (once every warpgroup has finished the
    last tile's QK^T, ``q_empty``), then its key tiles into the ring. The ring's position runs on from one query
    tile to the next, so the next tile's first K and V load while the warpgroups finish the last one."""
    ROWS: gl.constexpr = q_desc.block_type.shape[0]
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[0]
    BLOCK_M: gl.constexpr = ROWS * CONSUMERS
    r0 = 0  # ring position of the query tile's first key tile: key tiles loaded so far
    item = 0  # query tiles taken so far
    for unit in range(first, n_units, step):
        bh, tile, items = _v8f_unit(unit, n_m, CAUSAL=CAUSAL)
        for half in range(items):
            m0 = _v8f_query_tile(tile, half, n_m, CAUSAL=CAUSAL) * BLOCK_M
            full, n_tiles = _key_tiles(m0, N_KV, CAUSAL=CAUSAL, ROWS=BLOCK_M, BLOCK_N=BLOCK_N)
            mbarrier.wait(q_empty, (item & 1) ^ 1)  # a fresh barrier: the first wait returns at once
            for w in gl.static_range(CONSUMERS):
                mbarrier.expect(q_bars.index(w), q_desc.block_type.nbytes)
                _tma_load(q_desc, [bh * N_Q + m0 + w * ROWS, 0], q_bars.index(w), q_smem.index(w))
            kv_row = bh * N_KV
            for j in range(n_tiles):
                r = r0 + j
                slot = r % STAGES
                phase = (r // STAGES) & 1
                mbarrier.wait(ring.k_empty.index(slot), phase ^ 1)
                mbarrier.expect(ring.k_ready.index(slot), k_desc.block_type.nbytes)
                _tma_load(k_desc, [kv_row + j * BLOCK_N, 0], ring.k_ready.index(slot), ring.k_smem.index(slot))
                mbarrier.wait(ring.v_empty.index(slot), phase ^ 1)
                mbarrier.expect(ring.v_ready.index(slot), v_desc.block_type.nbytes)
                _tma_load(v_desc, [kv_row + j * BLOCK_N, 0], ring.v_ready.index(slot), ring.v_smem.index(slot))
            r0 += n_tiles
            item += 1


@gluon.jit
def _v8f_tiles(acc, p_prev, alpha_prev, m_i, l_i, q_tile, ring, turns, wg: gl.constexpr, rows, r0, turn0, j_lo,
               j_hi, N_KV, qk_scale, MASKED: gl.constexpr, CAUSAL: gl.constexpr, CONSUMERS: gl.constexpr,
               STAGES: gl.constexpr, PINGPONG: gl.constexpr, S_LAYOUT: gl.constexpr, O_LAYOUT: gl.constexpr,
               RESCALE_THRESHOLD: gl.constexpr, EMULATED_COLUMNS: gl.constexpr):
    """Key tiles [j_lo, j_hi), j_lo >= 1, of one query tile, as v8e's: QK^T(j) and PV(j-1) issued together in
    this warpgroup's turn, the softmax of tile j written to run under PV(j-1) (as compiled, ptxas moves the wait for
    PV(j-1) above the exponentials, as in v8d: lesson 13, section 8). The ring position of key tile j is r0 + j
    and the turn number turn0 + j - 1 (both run on across query tiles). The turns go round CONSUMERS warpgroups:
    turn t of warpgroup w > 0 follows warpgroup w-1's turn t, turn t of warpgroup 0 the last warpgroup's turn t-1; each
    arrives on the next warpgroup's barrier once its pair of GEMMs is issued. Without PINGPONG (D = 256, as
    FlashAttention-3 there) no turns; at D = 256 the output rows are rescaled before PV(j-1), as in
    ``_ws_tiles_overlapped``."""
    BLOCK_N: gl.constexpr = ring.k_smem.shape[1]
    RESCALE_FIRST: gl.constexpr = _rescale_first(acc.shape[1])
    zero = gl.zeros([rows.shape[0], BLOCK_N], gl.float32, S_LAYOUT)
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=O_LAYOUT, k_width=2)
    for j in range(j_lo, j_hi):
        r = r0 + j
        slot = r % STAGES
        prev = (r - 1) % STAGES
        turn = turn0 + j - 1
        mbarrier.wait(ring.k_ready.index(slot), (r // STAGES) & 1)
        mbarrier.wait(ring.v_ready.index(prev), ((r - 1) // STAGES) & 1)
        if PINGPONG:
            if wg == 0:
                mbarrier.wait(turns.index(0), (turn - 1) & 1, pred=turn > 0)
            else:
                mbarrier.wait(turns.index(wg), turn & 1)
        s = warpgroup_mma(q_tile, ring.k_smem.index(slot).permute((1, 0)), zero, use_acc=False, is_async=True)
        if RESCALE_FIRST:
            acc = acc * alpha_prev[:, None]
        acc = warpgroup_mma(p_prev, ring.v_smem.index(prev), acc, is_async=True)
        if PINGPONG:
            mbarrier.arrive(turns.index((wg + 1) % CONSUMERS))
        s = warpgroup_mma_wait(num_outstanding=1, deps=(s,))
        mbarrier.arrive(ring.k_empty.index(slot))
        if MASKED:
            s = _v8f_mask(s, rows, j * BLOCK_N, N_KV, CAUSAL=CAUSAL, S_LAYOUT=S_LAYOUT)
        p, alpha, m_i, l_i = _softmax_tile(s, m_i, l_i, rows, j * BLOCK_N, N_KV, qk_scale, MASKED=False,
                                           CAUSAL=CAUSAL, BLOCK_N=BLOCK_N, S_LAYOUT=S_LAYOUT,
                                           RESCALE_THRESHOLD=RESCALE_THRESHOLD, EMULATED_COLUMNS=EMULATED_COLUMNS)
        acc, p_prev = warpgroup_mma_wait(num_outstanding=0, deps=(acc, p_prev))
        mbarrier.arrive(ring.v_empty.index(prev))
        if RESCALE_FIRST:
            alpha_prev = gl.convert_layout(alpha, gl.SliceLayout(1, O_LAYOUT))
        elif RESCALE_THRESHOLD > 0:
            acc = _rescale_when_moved(acc, alpha, O_LAYOUT=O_LAYOUT)
        else:
            acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, O_LAYOUT))[:, None]
        p_prev = gl.convert_layout(p.to(ring.v_smem.dtype), p_layout)
    return acc, p_prev, alpha_prev, m_i, l_i


@gluon.jit
def _v8f_consumer(wg: gl.constexpr, O, LSE, qk_scale, q_smem, q_bars, q_empty, ring, turns, first, step, n_units,
                  n_m, N_Q, N_KV, CAUSAL: gl.constexpr, CONSUMERS: gl.constexpr, STAGES: gl.constexpr,
                  PINGPONG: gl.constexpr, RESCALE_THRESHOLD: gl.constexpr, EMULATED_COLUMNS: gl.constexpr):
    """Consumer warpgroup ``wg`` of v8f: rows [m0 + 64 wg, m0 + 64 wg + 64) of every query tile the program takes
    (the producer's order), each as v8e's consumer: tile 0 alone, then the overlapped tiles in turns, the last PV,
    the store."""
    ROWS: gl.constexpr = q_smem.shape[1]
    HEAD_DIM: gl.constexpr = q_smem.shape[2]
    BLOCK_N: gl.constexpr = ring.k_smem.shape[1]
    BLOCK_M: gl.constexpr = ROWS * CONSUMERS
    S_LAYOUT: gl.constexpr = _mma_layout(BLOCK_N)
    O_LAYOUT: gl.constexpr = _mma_layout(HEAD_DIM)
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=O_LAYOUT, k_width=2)
    q_tile = q_smem.index(wg)
    r0 = 0  # ring position of the query tile's first key tile: key tiles consumed so far
    item = 0  # query tiles taken so far
    for unit in range(first, n_units, step):
        bh, tile, items = _v8f_unit(unit, n_m, CAUSAL=CAUSAL)
        for half in range(items):
            m0 = _v8f_query_tile(tile, half, n_m, CAUSAL=CAUSAL) * BLOCK_M
            full, n_tiles = _key_tiles(m0, N_KV, CAUSAL=CAUSAL, ROWS=BLOCK_M, BLOCK_N=BLOCK_N)
            rows = m0 + wg * ROWS + gl.arange(0, ROWS, layout=gl.SliceLayout(1, S_LAYOUT))
            m_i = gl.full([ROWS], _NO_KEY_YET, gl.float32, layout=gl.SliceLayout(1, S_LAYOUT))
            l_i = gl.zeros([ROWS], gl.float32, layout=gl.SliceLayout(1, S_LAYOUT))
            mbarrier.wait(q_bars.index(wg), item & 1)
            # Key tile 0 alone: QK^T and softmax; its PV goes out with tile 1's QK^T (n_tiles >= 1: N_KV > 0).
            slot = r0 % STAGES
            mbarrier.wait(ring.k_ready.index(slot), (r0 // STAGES) & 1)
            zero = gl.zeros([ROWS, BLOCK_N], gl.float32, S_LAYOUT)
            s = warpgroup_mma(q_tile, ring.k_smem.index(slot).permute((1, 0)), zero, use_acc=False, is_async=True)
            s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
            mbarrier.arrive(ring.k_empty.index(slot))
            # Masked whether or not it needs to be (once a query tile): one code path.
            s = _v8f_mask(s, rows, 0, N_KV, CAUSAL=CAUSAL, S_LAYOUT=S_LAYOUT)
            p, alpha, m_i, l_i = _softmax_tile(s, m_i, l_i, rows, 0, N_KV, qk_scale, MASKED=False, CAUSAL=CAUSAL,
                                               BLOCK_N=BLOCK_N, S_LAYOUT=S_LAYOUT,
                                               RESCALE_THRESHOLD=RESCALE_THRESHOLD,
                                               EMULATED_COLUMNS=EMULATED_COLUMNS)
            p_prev = gl.convert_layout(p.to(ring.v_smem.dtype), p_layout)
            alpha_prev = gl.convert_layout(alpha, gl.SliceLayout(1, O_LAYOUT))  # see _ws_consumer
            acc = gl.zeros([ROWS, HEAD_DIM], gl.float32, layout=O_LAYOUT)
            acc, p_prev, alpha_prev, m_i, l_i = _v8f_tiles(
                acc, p_prev, alpha_prev, m_i, l_i, q_tile, ring, turns, wg, rows, r0, r0 - item, 1,
                gl.maximum(full, 1), N_KV, qk_scale, MASKED=False, CAUSAL=CAUSAL, CONSUMERS=CONSUMERS,
                STAGES=STAGES, PINGPONG=PINGPONG, S_LAYOUT=S_LAYOUT, O_LAYOUT=O_LAYOUT,
                RESCALE_THRESHOLD=RESCALE_THRESHOLD, EMULATED_COLUMNS=EMULATED_COLUMNS)
            acc, p_prev, alpha_prev, m_i, l_i = _v8f_tiles(
                acc, p_prev, alpha_prev, m_i, l_i, q_tile, ring, turns, wg, rows, r0, r0 - item,
                gl.maximum(full, 1), n_tiles, N_KV, qk_scale, MASKED=True, CAUSAL=CAUSAL, CONSUMERS=CONSUMERS,
                STAGES=STAGES, PINGPONG=PINGPONG, S_LAYOUT=S_LAYOUT, O_LAYOUT=O_LAYOUT,
                RESCALE_THRESHOLD=RESCALE_THRESHOLD, EMULATED_COLUMNS=EMULATED_COLUMNS)
            mbarrier.arrive(q_empty)  # every QK^T of this query tile has landed: its Q may be overwritten
            last = r0 + n_tiles - 1
            mbarrier.wait(ring.v_ready.index(last % STAGES), (last // STAGES) & 1)
            if _rescale_first(HEAD_DIM):
                acc = acc * alpha_prev[:, None]
            acc = warpgroup_mma(p_prev, ring.v_smem.index(last % STAGES), acc, is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
            mbarrier.arrive(ring.v_empty.index(last % STAGES))
            _store_rows(acc, m_i, l_i, O, LSE, bh, m0 + wg * ROWS, N_Q, HEAD_DIM=HEAD_DIM, ROWS=ROWS,
                        S_LAYOUT=S_LAYOUT, O_LAYOUT=O_LAYOUT)
            r0 += n_tiles
            item += 1


@gluon.jit
def _v8f_consumer0(O, LSE, qk_scale, q_smem, q_bars, q_empty, ring, turns, first, step, n_units, n_m, N_Q, N_KV,
                   CAUSAL: gl.constexpr, CONSUMERS: gl.constexpr, STAGES: gl.constexpr, PINGPONG: gl.constexpr,
                   RESCALE_THRESHOLD: gl.constexpr, EMULATED_COLUMNS: gl.constexpr):
    """The default partition: consumer warpgroup 0."""
    _v8f_consumer(0, O, LSE, qk_scale, q_smem, q_bars, q_empty, ring, turns, first, step, n_units, n_m, N_Q, N_KV,
                  CAUSAL=CAUSAL, CONSUMERS=CONSUMERS, STAGES=STAGES, PINGPONG=PINGPONG,
                  RESCALE_THRESHOLD=RESCALE_THRESHOLD, EMULATED_COLUMNS=EMULATED_COLUMNS)


@gluon.jit
def _v8f_consumer1(O, LSE, qk_scale, q_smem, q_bars, q_empty, ring, turns, first, step, n_units, n_m, N_Q, N_KV,
                   CAUSAL: gl.constexpr, CONSUMERS: gl.constexpr, STAGES: gl.constexpr, PINGPONG: gl.constexpr,
                   RESCALE_THRESHOLD: gl.constexpr, EMULATED_COLUMNS: gl.constexpr):
    """A worker partition of 4 warps: consumer warpgroup 1."""
    _v8f_consumer(1, O, LSE, qk_scale, q_smem, q_bars, q_empty, ring, turns, first, step, n_units, n_m, N_Q, N_KV,
                  CAUSAL=CAUSAL, CONSUMERS=CONSUMERS, STAGES=STAGES, PINGPONG=PINGPONG,
                  RESCALE_THRESHOLD=RESCALE_THRESHOLD, EMULATED_COLUMNS=EMULATED_COLUMNS)


@gluon.jit
def _v8f_consumer2(O, LSE, qk_scale, q_smem, q_bars, q_empty, ring, turns, first, step, n_units, n_m, N_Q, N_KV,
                   CAUSAL: gl.constexpr, CONSUMERS: gl.constexpr, STAGES: gl.constexpr, PINGPONG: gl.constexpr,
                   RESCALE_THRESHOLD: gl.constexpr, EMULATED_COLUMNS: gl.constexpr):
    """A worker partition of 4 warps: consumer warpgroup 2 (three consumers, D = 64)."""
    _v8f_consumer(2, O, LSE, qk_scale, q_smem, q_bars, q_empty, ring, turns, first, step, n_units, n_m, N_Q, N_KV,
                  CAUSAL=CAUSAL, CONSUMERS=CONSUMERS, STAGES=STAGES, PINGPONG=PINGPONG,
                  RESCALE_THRESHOLD=RESCALE_THRESHOLD, EMULATED_COLUMNS=EMULATED_COLUMNS)


@gluon.jit(do_not_specialize=["N_Q", "N_KV", "BH"])
def _fa3_v8f_kernel(q_desc, k_desc, v_desc, O, LSE, qk_scale, N_Q, N_KV, BH, CAUSAL: gl.constexpr,
                    CONSUMERS: gl.constexpr, STAGES: gl.constexpr, PINGPONG: gl.constexpr,
                    PRODUCER_REGS: gl.constexpr, CONSUMER_REGS: gl.constexpr, RESCALE_THRESHOLD: gl.constexpr,
                    EMULATED_COLUMNS: gl.constexpr):
    """v8f: persistent. A grid of at most one program per SM; program i takes work units i, i + grid, ... (see
    ``_v8f_unit``), each query tile of CONSUMERS * 64 rows with v8e's schedule; BH = batch * heads. Launch with
    num_warps=4 (the default partition is consumer 0)."""
    ROWS: gl.constexpr = q_desc.block_type.shape[0]
    HEAD_DIM: gl.constexpr = q_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[0]
    BLOCK_M: gl.constexpr = ROWS * CONSUMERS
    n_m = (N_Q + BLOCK_M - 1) // BLOCK_M
    if CAUSAL:
        n_units = BH * ((n_m + 1) // 2)
    else:
        n_units = BH * n_m
    first = gl.program_id(0)
    step = gl.num_programs(0)

    q_smem = gl.allocate_shared_memory(q_desc.dtype, [CONSUMERS, ROWS, HEAD_DIM], q_desc.layout)
    k_smem = gl.allocate_shared_memory(k_desc.dtype, [STAGES, BLOCK_N, HEAD_DIM], k_desc.layout)
    v_smem = gl.allocate_shared_memory(v_desc.dtype, [STAGES, BLOCK_N, HEAD_DIM], v_desc.layout)
    q_bars = gl.allocate_shared_memory(gl.int64, [CONSUMERS, 1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    turns = gl.allocate_shared_memory(gl.int64, [CONSUMERS, 1], mbarrier.MBarrierLayout())
    for w in gl.static_range(CONSUMERS):
        mbarrier.init(q_bars.index(w), count=1)
        mbarrier.init(turns.index(w), count=1)
    mbarrier.init(q_empty, count=CONSUMERS)  # every consumer warpgroup is done with its Q
    for i in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(k_empty.index(i), count=CONSUMERS)
        mbarrier.init(v_empty.index(i), count=CONSUMERS)
    ring = _Ring(k_smem, v_smem, k_ready, k_empty, v_ready, v_empty)

    # The argument tuples are written out in each call, as in _fa3_ws_kernel (constexprs must stay constexprs).
    if CONSUMERS == 3:
        gl.warp_specialize([
            (_v8f_consumer0, (O, LSE, qk_scale, q_smem, q_bars, q_empty, ring, turns, first, step, n_units, n_m,
                              N_Q, N_KV, CAUSAL, CONSUMERS, STAGES, PINGPONG, RESCALE_THRESHOLD, EMULATED_COLUMNS)),
            (_v8f_consumer1, (O, LSE, qk_scale, q_smem, q_bars, q_empty, ring, turns, first, step, n_units, n_m,
                              N_Q, N_KV, CAUSAL, CONSUMERS, STAGES, PINGPONG, RESCALE_THRESHOLD, EMULATED_COLUMNS)),
            (_v8f_consumer2, (O, LSE, qk_scale, q_smem, q_bars, q_empty, ring, turns, first, step, n_units, n_m,
                              N_Q, N_KV, CAUSAL, CONSUMERS, STAGES, PINGPONG, RESCALE_THRESHOLD, EMULATED_COLUMNS)),
            (_v8f_producer, (q_desc, k_desc, v_desc, q_smem, q_bars, q_empty, ring, first, step, n_units, n_m, N_Q,
                             N_KV, CAUSAL, CONSUMERS, STAGES)),
        ], [4, 4, 1], [CONSUMER_REGS, CONSUMER_REGS, PRODUCER_REGS])
    else:
        gl.warp_specialize([
            (_v8f_consumer0, (O, LSE, qk_scale, q_smem, q_bars, q_empty, ring, turns, first, step, n_units, n_m,
                              N_Q, N_KV, CAUSAL, CONSUMERS, STAGES, PINGPONG, RESCALE_THRESHOLD, EMULATED_COLUMNS)),
            (_v8f_consumer1, (O, LSE, qk_scale, q_smem, q_bars, q_empty, ring, turns, first, step, n_units, n_m,
                              N_Q, N_KV, CAUSAL, CONSUMERS, STAGES, PINGPONG, RESCALE_THRESHOLD, EMULATED_COLUMNS)),
            (_v8f_producer, (q_desc, k_desc, v_desc, q_smem, q_bars, q_empty, ring, first, step, n_units, n_m, N_Q,
                             N_KV, CAUSAL, CONSUMERS, STAGES)),
        ], [4, 1], [CONSUMER_REGS, PRODUCER_REGS])


# ------------------------------------------------------------------------------------------ stages and host
@dataclass(frozen=True)
class Stage:
    """One measured stage: which kernel, its switches and its launch, per head dim."""

    name: str
    adds: str
    expected: str
    kernel: object
    consumers: int  # consumer warpgroups per program (64 query rows each)
    block_n: dict  # head dim -> key tile rows; its keys are the head dims the stage takes
    stages: int = 2  # K/V ring depth
    overlap: bool = False
    pingpong: bool = False
    hold_pv_wait: bool = False  # the wait for the next K tile holds the PV wait below the softmax (v8g)
    producer_regs: int = 0  # setmaxnreg budgets (Triton 3.6's warp_specialize requires the workers')
    consumer_regs: int = 0
    maxnreg: int | None = None  # registers a thread at launch (None: what the compiler needs)
    persistent: bool = False  # one program per SM, taking query tiles in turn (v8f)
    # FlashAttention-4's softmax on Hopper (v9a, v9b): both 0 in v8a-v8h, whose compiled code they leave as it was
    rescale_threshold: float = 0.0  # keep a row's max while a tile raises it by at most this (log2 units)
    emulated_columns: int = 0  # columns of each key tile whose exponentials are computed on the FMA units
    builds_on: str = ""  # the v8 stage this one changes (per head dim through ``by_head_dim``): its timing baseline
    by_head_dim: dict = field(default_factory=dict)  # head dim -> the fields that differ there (see ``at``)

    def __post_init__(self):
        if self.emulated_columns % 8 or self.emulated_columns > min(self.block_n.values()):
            raise ValueError(f"stage {self.name}: emulated_columns={self.emulated_columns} must be a multiple of 8 "
                             f"(a thread's columns of a wgmma tile come in groups of 8) and at most the key tile, "
                             f"{min(self.block_n.values())}")
        if self.rescale_threshold and self.rescale_threshold < 1:
            raise ValueError(f"stage {self.name}: rescale_threshold={self.rescale_threshold} must be 0 (off) or at "
                             "least 1 (log2 units): _rescale_when_moved tells a moved row by its alpha < 0.5")
        if self.rescale_threshold and not self.overlap:
            raise ValueError(f"stage {self.name}: rescale_threshold needs the overlapped loop (overlap=True), the one "
                             "that tests it")

    def at(self, head_dim: int) -> "Stage":
        """The stage as it launches at ``head_dim``: ``by_head_dim``'s fields for that head dim in place of the
        defaults (v8f takes three consumer warpgroups at D = 64); the stage itself where nothing differs."""
        changes = self.by_head_dim.get(head_dim)
        return replace(self, **changes, by_head_dim={}) if changes else self

    @property
    def head_dims(self) -> tuple[int, ...]:
        return tuple(self.block_n)

    @property
    def warp_specialized(self) -> bool:
        return self.kernel is not _fa3_v8a_kernel

    def block_m(self) -> int:
        """Query rows a program takes at once (of the stage as ``at`` gives it for a head dim)."""
        return 64 * self.consumers

    def options(self) -> dict:
        """Launch options: 4 warps (the default partition is one warpgroup) and the register cap."""
        return {"num_warps": 4} if self.maxnreg is None else {"num_warps": 4, "maxnreg": self.maxnreg}

    def constexprs(self, causal: bool) -> dict:
        """The kernel's compile-time arguments (of the stage as ``at`` gives it for a head dim)."""
        if not self.warp_specialized:
            return {"CAUSAL": causal}
        fa4 = {"RESCALE_THRESHOLD": float(self.rescale_threshold), "EMULATED_COLUMNS": self.emulated_columns}
        if self.persistent:  # v8f's kernel always overlaps
            return {"CAUSAL": causal, "CONSUMERS": self.consumers, "STAGES": self.stages, "PINGPONG": self.pingpong,
                    "PRODUCER_REGS": self.producer_regs, "CONSUMER_REGS": self.consumer_regs, **fa4}
        return {"CAUSAL": causal, "CONSUMERS": self.consumers, "STAGES": self.stages, "OVERLAP": self.overlap,
                "PINGPONG": self.pingpong, "HOLD_PV_WAIT": self.hold_pv_wait, "PRODUCER_REGS": self.producer_regs,
                "CONSUMER_REGS": self.consumer_regs, **fa4}

    def grid(self, n_q: int, batch_heads: int, causal: bool, sm_count: int) -> tuple[int, ...]:
        """Programs to launch: a query tile each ((tiles, B*H)), or for a persistent stage one program per work
        unit (``_v8f_unit``) up to one per SM."""
        n_m = triton_cdiv(n_q, self.block_m())
        if not self.persistent:
            return (n_m, batch_heads)
        units = batch_heads * ((n_m + 1) // 2 if causal else n_m)
        return (max(1, min(units, sm_count)),)


def _fa4_stage(name: str, adds: str, expected: str, **fa4) -> Stage:
    """A v9 stage: v8d's kernel at D = 128 and v8f's at D = 64 (the fastest forward of each, non-causal, in
    ``kernels/plan.py``'s FORWARD_BANDS) with FlashAttention-4's switches ``fa4`` on."""
    return Stage(name, adds, expected, _fa3_ws_kernel, consumers=2, block_n={64: 128, 128: 128}, stages=2,
                 overlap=True, producer_regs=24, consumer_regs=240, builds_on="v8d",
                 by_head_dim={64: {"kernel": _fa3_v8f_kernel, "persistent": True, "pingpong": True, "consumers": 3,
                                   "producer_regs": 32, "consumer_regs": 160, "builds_on": "v8f"}}, **fa4)


STAGES = {
    s.name: s
    for s in (
        Stage("v8a", "one warpgroup, TMA double buffer, wgmma, no specialization",
              "about v7 (same algorithm), maybe a little less", _fa3_v8a_kernel, consumers=1,
              block_n={64: 128, 128: 64}),
        Stage("v8b", "producer warp + TMA ring with ready/empty mbarriers (gl.warp_specialize)",
              "+0-5% over v8a", _fa3_ws_kernel, consumers=1, block_n={64: 128, 128: 64}, stages=2,
              producer_regs=24, maxnreg=128),
        Stage("v8c", "two consumer warpgroups share the ring; setmaxnreg: producer 24, consumers 240",
              "+5-10% over v8b", _fa3_ws_kernel, consumers=2, block_n={64: 128, 128: 128, 256: 64}, stages=2,
              producer_regs=24, consumer_regs=240,
              by_head_dim={256: {"expected": "D = 256: about v7 (2026-12-02, float16, N = 8192: 505 / 498 TFLOP/s, "
                                             "0.79x / 0.84x cuDNN), up to +5%: the softmax and the rescale of 128 "
                                             "output registers a thread still wait between the GEMMs"}}),
        Stage("v8d", "intra-warpgroup overlap: QK^T(j) issued with PV(j-1); softmax(j) written under PV(j-1) but, "
                     "as compiled, after the wait for it (v8g pins the wait below the softmax)",
              "+5-10% over v8c", _fa3_ws_kernel, consumers=2, block_n={64: 128, 128: 128, 256: 64}, stages=2,
              overlap=True, producer_regs=24, consumer_regs=240,
              by_head_dim={256: {"expected": "D = 256: +8-15% over v8c, 0.9-1.0x cuDNN (570-640 TFLOP/s at "
                                             "N = 8192, float16, not causal): a 64-key tile is as many FLOPs as a "
                                             "128-key tile at D = 128 with half its scores, so PV(j-1) hides the "
                                             "softmax better than there (+4-7% over v8c), and the output is "
                                             "rescaled under QK^T (FlashAttention-3's order above D = 128)"}}),
        Stage("v8e", "ping-pong: the two warpgroups take turns at the tensor cores (mbarriers)",
              "+3-8% over v8d: >= 1.0x cuDNN is the target", _fa3_ws_kernel, consumers=2,
              block_n={64: 128, 128: 128, 256: 64}, stages=2, overlap=True, pingpong=True, producer_regs=24,
              consumer_regs=240,
              by_head_dim={256: {"expected": "D = 256: -3% to +1% against v8d: FlashAttention-3 takes no turns "
                                             "above D = 128, where a warpgroup's softmax already hides under its "
                                             "own PV and a turn only adds a wait per tile"}}),
        Stage("v8f", "persistent (one program per SM, query tiles in turn, causal ones in heavy-light pairs); "
              "D = 64: three consumer warpgroups (192-row tiles, 160 registers); D = 256: no ping-pong",
              "D = 128: +3-5% over v8d at N = 4096, +0-2% at 16384; D = 64: +2-5% over v8a; >= 1.0x cuDNN",
              _fa3_v8f_kernel, consumers=2, block_n={64: 128, 128: 128, 256: 64}, stages=2, overlap=True,
              pingpong=True, producer_regs=24, consumer_regs=240, persistent=True,
              by_head_dim={64: {"consumers": 3, "producer_regs": 32, "consumer_regs": 160},
                           256: {"pingpong": False,
                                 "expected": "D = 256: -2% to +4% against v8d (at D = 128 v8f ran at -3% "
                                             "to +1% of v8d on 2026-12-02; one program already fills an SM "
                                             "there as here, and the start and end it hides are a smaller "
                                             "share of a longer tile)"}}),
        Stage("v8g", "v8d with the PV wait held below the softmax: the wait for K(j+1) between them, a block "
              "boundary ptxas moves no exponential across",
              "+3-8% over v8d at D = 128: v8d's compiled loop waits for PV(j-1) before its exponentials, so its "
              "softmax never ran under PV(j-1); here it does (about v8d's promised +5-10% over v8c, which it "
              "missed)", _fa3_ws_kernel, consumers=2, block_n={64: 128, 128: 128, 256: 64}, stages=2,
              overlap=True, hold_pv_wait=True, producer_regs=24, consumer_regs=240),
        Stage("v8h", "v8d with a 3-deep K/V ring: at D = 128, 32 KB of Q and 3 x 64 KB of K and V, the 224 KB "
              "cuDNN's forward also fills (not D = 256: 64 KB of Q and 3 x 64 KB pass the 227 KB an SM gives)",
              "+1-3% over v8d at N = 4096 (2026-12-02, Nsight Compute: v8d's warps wait at barriers 2.2x as much "
              "as cuDNN's, which keeps a third K/V tile in flight), about v8d at N = 16384",
              _fa3_ws_kernel, consumers=2, block_n={64: 128, 128: 128}, stages=3, overlap=True, producer_regs=24,
              consumer_regs=240),
    )
}


# FlashAttention-4's stages (v9), kept apart from STAGES (measured on an H100 only, and slower than their base stages
# there): STAGES is the FA3 stage table that gpu_fa3.py's default run, lesson 13 and docs/KERNELS.md's story table
# (one row per registered stage, with its run) read. fa3_forward and ForwardPlan take either (``_stage``);
# benchmarks/gpu_fa4_stages.py measures these.
FA4_STAGES = {
    s.name: s
    for s in (
        _fa4_stage("v9a", "FlashAttention-4's conditional rescaling: a row keeps its max while a tile raises it by "
                   "at most 8 (log2 units, 16-bit inputs), P computed with the max kept; the output rescaled only "
                   "when some row of the warpgroup moved its max", "+2.3% over v8f at D = 64, +3.4% over v8d at "
                   "D = 128 (lesson 14's model, 5% of tiles rescaled)", rescale_threshold=8.0),
        _fa4_stage("v9b_1of16", "FlashAttention-4's software exp2 on 1/16 of the scores: the first 8 columns of each "
                   "128-key tile through a degree-3 polynomial on the FMA units and an integer add into the "
                   "exponent, the rest on MUFU.EX2", "-1.2% against v8f at D = 64, +1.7% over v8d at D = 128 "
                   "(lesson 14's model)", emulated_columns=8),
        _fa4_stage("v9b_1of4", "v9b_1of16 on 1/4 of the scores (the first 32 columns of each key tile)",
                   "+1.6% over v8f at D = 64, +7.4% over v8d at D = 128 (lesson 14's model)", emulated_columns=32),
    )
}


def _gl_dtype(dtype: torch.dtype):
    return {torch.float16: gl.float16, torch.bfloat16: gl.bfloat16}[dtype]


def _smem_layout(rows: int, head_dim: int, dtype: torch.dtype):
    return gl.NVMMASharedLayout.get_default_for([rows, head_dim], _gl_dtype(dtype))


def tensor_descriptor_signature(rows: int, head_dim: int, dtype: torch.dtype) -> str:
    """The signature type Triton gives a Gluon TensorDescriptor argument of this block (for compiling ahead of
    time without a GPU tensor)."""
    name = {torch.float16: "fp16", torch.bfloat16: "bf16"}[dtype]
    return f"tensordesc<{name}[{rows},{head_dim}],{_smem_layout(rows, head_dim, dtype)!r}>"


def kernel_signature(stage: Stage, head_dim: int, dtype: torch.dtype, causal: bool) -> tuple[dict, dict]:
    """(signature, constexprs) of a stage's kernel at ``head_dim``, as ``triton.compile`` takes them."""
    stage = stage.at(head_dim)
    rows, block_n = 64, stage.block_n[head_dim]
    name = {torch.float16: "fp16", torch.bfloat16: "bf16"}[dtype]
    signature = {"q_desc": tensor_descriptor_signature(rows, head_dim, dtype),
                 "k_desc": tensor_descriptor_signature(block_n, head_dim, dtype),
                 "v_desc": tensor_descriptor_signature(block_n, head_dim, dtype),
                 "O": f"*{name}", "LSE": "*fp32", "qk_scale": "fp32", "N_Q": "i32", "N_KV": "i32"}
    if stage.persistent:
        signature["BH"] = "i32"
    constexprs = stage.constexprs(causal)
    signature.update({key: "constexpr" for key in constexprs})
    return signature, constexprs


def check_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, stage: Stage) -> None:
    """What ``stage`` of v8 takes, or a ValueError saying what to use instead."""
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError("fa3_forward takes q, k, v of shape (B, H, N, D)")
    if k.shape != v.shape or q.shape[:2] != k.shape[:2] or q.shape[3] != k.shape[3]:
        raise ValueError(f"fa3_forward needs q (B, H, N_q, D), k and v (B, H, N_kv, D) with the same B, H, D "
                         f"(got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}); for grouped-query "
                         "attention use flashcourse.kernels.flash_attention")
    if q.dtype not in (torch.float16, torch.bfloat16) or k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"fa3_forward takes float16 or bfloat16 q, k, v of one dtype (got {q.dtype}, {k.dtype}, "
                         f"{v.dtype}); use flashcourse.kernels.flash_attention for float32 or float8")
    if q.shape[3] not in stage.head_dims:
        raise ValueError(f"fa3_forward's stage {stage.name} takes head dims {stage.head_dims} (got {q.shape[3]}); "
                         "use flashcourse.kernels.flash_attention for the others")
    if not (q.is_contiguous() and k.is_contiguous() and v.is_contiguous()):
        raise ValueError("fa3_forward reads q, k, v as contiguous (B, H, N, D) tensors through TMA: pass "
                         "q.contiguous() (a transposed (B, N, H, D) view is not contiguous), or use "
                         "flashcourse.kernels.flash_attention, which takes any strides")
    if not q.is_cuda or torch.cuda.get_device_capability(q.device) != (9, 0):
        where = f"compute capability {torch.cuda.get_device_capability(q.device)}" if q.is_cuda else "the CPU"
        raise ValueError(f"fa3_forward is written for Hopper (sm_90: H100, H200), not {where}: use "
                         "flashcourse.kernels.flash_attention (v7), which runs everywhere")


class ForwardPlan:
    """The host work of a stage's launch done once for a layout (what ``flash_attention``'s plan keeps on
    Hopper): the stage, grid, scale, shared-memory layouts and one TensorDescriptor per input, validated once;
    after the first call, the compiled kernel and its argument list. A call then makes three descriptors that
    differ from the templates only in their base tensor and launches (``launch.prepare_launch``).

    The tensors are seen as 2-D (B*H*N, D) arrays: a tile is addressed by its first row, bh * N + offset."""

    def __init__(self, stage: str, q: torch.Tensor, k: torch.Tensor, *, causal: bool, scale: float | None,
                 in_graph: bool = False):
        check_inputs(q, k, k, _stage(stage))
        batch, heads, n_q, head_dim = q.shape
        self.spec = _stage(stage).at(head_dim)
        n_kv = k.shape[2]
        self.n_q, self.n_kv = n_q, n_kv
        self._new_lse = row_stats_allocator((batch, heads, n_q), q.device, in_graph=in_graph)
        self.empty = n_q == 0 or batch * heads == 0 or n_kv == 0
        scale = 1.0 / math.sqrt(head_dim) if scale is None else float(scale)
        self.arguments = dict(qk_scale=scale * _LOG2E, N_Q=n_q, N_KV=n_kv, **self.spec.constexprs(bool(causal)))
        sm_count = 0
        if self.spec.persistent:
            self.arguments["BH"] = batch * heads
            sm_count = torch.cuda.get_device_properties(q.device).multi_processor_count
        self.grid = self.spec.grid(n_q, batch * heads, bool(causal), sm_count)
        block_n = self.spec.block_n[head_dim]
        self.templates = None if self.empty else (
            _descriptor(q, batch * heads * n_q, 64), _descriptor(k, batch * heads * n_kv, block_n),
            _descriptor(k, batch * heads * n_kv, block_n))
        self._launch = None

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        o = torch.empty_like(q)
        lse = self._new_lse()
        if self.empty:
            if self.n_kv == 0:  # no key: every row sees nothing
                o.zero_()
                lse.fill_(float("-inf"))
            return o, lse
        q_desc, k_desc, v_desc = (_on(template, t) for template, t in zip(self.templates, (q, k, v), strict=True))
        if self._launch is not None:
            self._launch((q_desc, k_desc, v_desc, o, lse))
            return o, lse
        kwargs = dict(q_desc=q_desc, k_desc=k_desc, v_desc=v_desc, O=o, LSE=lse, **self.arguments)
        compiled = self.spec.kernel[self.grid](**kwargs, **self.spec.options())
        self._launch = prepare_launch(self.spec.kernel, compiled, self.grid, kwargs,
                                      ("q_desc", "k_desc", "v_desc", "O", "LSE"))
        return o, lse


def _descriptor(t: torch.Tensor, rows: int, block_rows: int):
    """A TMA descriptor of ``t`` seen as (rows, D), in tiles of ``block_rows`` rows, validated by Triton, then
    with no base tensor: a template (:func:`_on` gives it each call's), which keeps no call's tensor alive."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    head_dim = t.shape[-1]
    flat = t.view(rows, head_dim)
    template = TensorDescriptor(flat, [rows, head_dim], [head_dim, 1], [block_rows, head_dim],
                                _smem_layout(block_rows, head_dim, t.dtype))
    template.base = None
    return template


def _on(template, t: torch.Tensor):
    """``template`` with base tensor ``t``, of the same shape, dtype and alignment: the launcher reads only the
    base's address from it (shape and strides are the descriptor's), so Triton's checks need not run again."""
    if not hasattr(template, "__dict__"):  # a descriptor class with __slots__ (another Triton): the slow copy
        descriptor = copy.copy(template)
    else:  # five times faster than copy.copy, which goes through __reduce_ex__ (3 descriptors a call)
        descriptor = object.__new__(type(template))
        descriptor.__dict__.update(template.__dict__)
    descriptor.base = t
    return descriptor


def fa3_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
                scale: float | None = None, stage: str = "v8c") -> tuple[torch.Tensor, torch.Tensor]:
    """Forward attention with stage ``stage`` of v8 (see the module docstring); returns (o, lse), lse natural
    log, float32. ``causal=True`` is top-left aligned. Hopper only; see ``check_inputs`` for what it takes.
    Each call prepares its launch anew; ``flash_attention`` keeps a :class:`ForwardPlan` per layout instead."""
    check_inputs(q, k, v, _stage(stage))
    return ForwardPlan(stage, q, k, causal=bool(causal), scale=scale)(q, k, v)


def _stage(name: str) -> Stage:
    """A stage of v8 (STAGES) or v9 (FA4_STAGES) by name."""
    stage = STAGES.get(name) or FA4_STAGES.get(name)
    if stage is None:
        raise ValueError(f"stage {name!r}: expected one of {sorted(STAGES) + sorted(FA4_STAGES)}")
    return stage


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)
