"""What a numbered kernel version is: the records of the forward and backward registries.

``forward.FORWARD_VERSIONS`` and ``backward.BACKWARD_VERSIONS`` hold every version by name, the ones that serve
calls (``forward.py``, ``backward.py``) and the ones that only teach (``teaching/``). Both sides build their
entries from the classes here, so the library's modules can import the teaching entries without a cycle.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import triton.language as tl


@dataclass(frozen=True)
class ForwardVersion:
    """One numbered forward version: what it changed, what we predicted, which kernel it launches and how."""

    name: str
    title: str
    changes: str
    prediction: str
    kernel: Callable  # the @triton.jit kernel it launches
    tuned_launch: bool  # tiles, warps and stages from configs.forward_config, not the textbook launch
    base2: bool  # the kernel takes qk_scale = scale * log2(e) (exp2) rather than scale
    splits_causal_keys: bool  # splits a causal row's keys at a query-tile edge: needs BLOCK_M % BLOCK_N == 0
    needs_descriptors: bool = False  # Hopper's TMA; without it the version launches v5's kernel
    takes_rules: bool = False  # GQA, both causal alignments, window, softcap, ALiBi, documents, mask_mod

    @property
    def kernel_name(self) -> str:
        return self.kernel.fn.__name__


# How the dK/dV kernel adds its share of dQ: a compile-time switch of backward._bwd_dkdv_kernel, set by
# BackwardVersion.dq_mode.
DQ_KERNEL = tl.constexpr(0)  # not at all: a separate dQ kernel (b1)
DQ_ATOMIC = tl.constexpr(1)  # fp32 atomic adds, acquire-release order (b2: Triton's default)
DQ_RELAXED = tl.constexpr(2)  # fp32 atomic adds, relaxed order (b4)
DQ_TMA = tl.constexpr(3)  # a TMA reduce-add of the tile through a tensor descriptor (b5)


@dataclass(frozen=True)
class BackwardVersion:
    """One dQ scheme of the backward: what it changes and what we predicted."""

    name: str
    title: str
    changes: str
    prediction: str
    dq_mode: int = DQ_KERNEL.value  # how dQ is summed: a dQ kernel, or added by the dK/dV kernel (DQ_* above)
    takes_rules: bool = False  # GQA, both causal alignments, window, softcap, ALiBi, documents, mask_mod

    @property
    def atomic_dq(self) -> bool:
        """Whether the dK/dV kernel adds dQ into an fp32 accumulator (5 matmuls) instead of a dQ kernel (7)."""
        return self.dq_mode != DQ_KERNEL.value
