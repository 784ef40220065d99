"""Attention over a sequence split across processes (GPUs): shard / unshard, ring attention, Ulysses.

Public API (torch tensors (B, H, N, D); the caller starts the process group)::

    shard(x, *, dim=2, layout="zigzag", group=None) -> this rank's part of the sequence
    unshard(x_local, *, dim=2, layout="zigzag", group=None) -> the whole sequence, on every rank
    ring_attention(q, k, v, *, causal=False, scale=None, layout="zigzag", group=None) -> o   # differentiable
    ulysses_attention(q, k, v, *, causal=False, scale=None, group=None) -> o                 # H % P == 0
    zigzag_indices(n, world, rank) -> the positions rank ``rank`` holds

Everything is built on ``torch.distributed``: gloo on CPU tensors (the kernels then run in Triton's interpreter),
NCCL on CUDA tensors. Start the processes with ``torchrun`` and call
``torch.distributed.init_process_group("nccl")`` (after ``torch.cuda.set_device(local_rank)``) in each, or, on a
laptop, with ``python -m flashcourse.distributed.launch``. Across machines, the same code runs under
``torchrun --nnodes M --nproc-per-node G --rdzv-backend c10d --rdzv-endpoint HOST:PORT`` on every machine; the
ring then crosses the network between machines, so place consecutive ranks on one machine (torchrun does).
"""

from __future__ import annotations

import importlib

# name -> submodule; loaded on first use, so that the schedule (NumPy only) imports without Triton and the
# launcher's child processes import the kernels only once they are set up
_EXPORTS = {
    "block_schedule": "schedule", "dkv_route": "schedule", "kv_source": "schedule", "rank_chunks": "schedule",
    "sequence_indices": "schedule", "zigzag_indices": "schedule",
    "shard": "sharding", "unshard": "sharding",
    "ring_attention": "ring",
    "ulysses_attention": "ulysses",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(__all__)
