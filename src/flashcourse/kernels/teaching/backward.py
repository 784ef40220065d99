"""The backward versions that only teach: b2, b4 and b5, three other ways to sum dQ than b1's.

b1 (``backward.py``) runs a K/V-stationary dK/dV kernel and then a separate Q-stationary dQ kernel; b3, the
default, is b1 under the variant rules. b2, b4 and b5 drop the dQ kernel and let b1's dK/dV kernel add each
tile's share of dQ itself, by fp32 atomics (b2, FlashAttention-2's scheme), relaxed atomics (b4) or a TMA
reduce-add (b5, FlashAttention-3's scheme). On the H200 neither b4 nor b5 beat b1 by more than a few percent
(docs/KERNELS.md), so calls keep b1's scheme.

What moves here is only what these three alone own: their registry entries, each with what it changes and what
we predicted. Their code is a compile-time switch (``DQ_MODE``, ``versions.DQ_*``) inside b1's dK/dV kernel,
``backward._bwd_dkdv_kernel`` and its loop ``backward._dkdv_tiles``, which also serve every dense call (b1 is
``DENSE_BACKWARD``); a copy of that kernel here would be two kernels to keep in step, so it stays with b1, and
``backward.run_backward`` launches all five versions, as ``backward.BACKWARD_VERSIONS`` names them.
"""

from __future__ import annotations

from ..versions import DQ_ATOMIC, DQ_RELAXED, DQ_TMA, BackwardVersion

# The registry entries of b2, b4 and b5; ``backward.BACKWARD_VERSIONS`` adds b1 and b3.
VERSIONS: tuple[BackwardVersion, ...] = (
    BackwardVersion("b2", "atomic dQ", "dQ added by the dK/dV kernel with fp32 atomics (FA2's scheme)",
                    "5 matmuls, but N/BLOCK_N atomic passes over dQ through L2: slower at large N",
                    dq_mode=DQ_ATOMIC.value),
    BackwardVersion("b4", "relaxed atomic dQ", "b2 with relaxed atomics: no acquire-release fence per add",
                    "b2 + 10-30% (the fences serialise each program's adds); still below b1 if the L2 "
                    "traffic of the adds, not their order, is what costs",
                    dq_mode=DQ_RELAXED.value),
    BackwardVersion("b5", "TMA reduce-add dQ", "b2 with each dQ tile added by the SM's Tensor Memory "
                    "Accelerator (a TMA reduce-add through a tensor descriptor), as FlashAttention-3 does",
                    "5 matmuls with the adds off the warps: 1.1-1.25x b1 at N >= 4096 on sm_90 if the "
                    "reduce overlaps the next tile's matmuls; Hopper only (b4 runs elsewhere, the interpreter too)",
                    dq_mode=DQ_TMA.value),
)
