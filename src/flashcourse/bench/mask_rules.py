"""The rules of the variants benchmark's ``mask_mod:`` rows, each written once for every side that reads it.

A rule is a plain Python function ``rule(q_idx, kv_idx, size) -> bool`` in operations that mean the same in
Triton and in torch on non-negative indices (comparisons, ``&``, ``|``, ``//`` and ``%``). Our kernels get it
wrapped in ``@triton.jit`` as a ``mask_mod(b, h, q_idx, kv_idx)`` (:func:`triton_mask_mod`); FlexAttention's
``mask_mod`` and the float32 reference of ``bench.variants`` call the same function on torch tensors. The size is
an argument so that the CPU tests can run the very rule the GPU times at a size a few tiles wide. No rule reads the
batch row or the head: one map of tiles serves them all.
"""

from __future__ import annotations

import functools
import types

from flashcourse import device

device.setup()  # before Triton loads: without a GPU it chooses the interpreter, which Triton fixes on import

import triton  # noqa: E402
import triton.language as tl  # noqa: E402 - the interpreter looks for triton.language among a jit function's globals


def prefix_lm(q_idx, kv_idx, size):
    """A prefix-LM: the first ``size`` keys (the prompt) are seen by every query, the rest causally."""
    return (kv_idx <= q_idx) | (kv_idx < size)


def chunked_local(q_idx, kv_idx, size):
    """Chunked local attention: causal within chunks of ``size`` positions, nothing across a chunk boundary."""
    return (q_idx // size == kv_idx // size) & (kv_idx <= q_idx)


def stripes(q_idx, kv_idx, size):
    """Causal; a band of the last ``size`` keys, plus the first quarter of every ``size`` keys before it: local
    attention with regularly spaced summary columns, a strided sparse pattern. Far from the diagonal, in 128 x 128
    blocks at size 256, the key blocks alternate partial (a quarter of the keys visible) and empty: sparse, and
    every block visited runs the mask code."""
    return (kv_idx <= q_idx) & ((q_idx - kv_idx < size) | (kv_idx % size < size // 4))


MASK_RULES = {"prefix-LM": prefix_lm, "chunked local": chunked_local, "stripes": stripes}


def rule_mask_mod(b, h, q_idx, kv_idx):
    """The body every rule's mask_mod shares: RULE and SIZE are globals of each copy (:func:`triton_mask_mod`)."""
    return RULE(q_idx, kv_idx, SIZE)  # noqa: F821 - defined in each copy's own globals


@functools.cache
def triton_mask_mod(rule: str, size: int):
    """``MASK_RULES[rule]`` at ``size`` as our kernels' ``mask_mod(b, h, q_idx, kv_idx)``, a ``@triton.jit``
    function. Cached, so every call gets the same object: the kernels compile once per rule and size, and the
    per-call path keeps its tile lists across calls (both are keyed by the function).

    The rule and its size reach the kernel as globals of a copy of :func:`rule_mask_mod`, not through a closure:
    Triton's interpreter runs a jit function by executing its source again among its globals, where a closure's
    cells are lost, and a compiled kernel reads an outside value only as a constexpr."""
    scope = {**globals(), "RULE": triton.jit(MASK_RULES[rule]), "SIZE": tl.constexpr(size)}
    # The copy keeps the template's name: the interpreter finds its re-executed source by that name.
    return triton.jit(types.FunctionType(rule_mask_mod.__code__, scope))
