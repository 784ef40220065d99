"""Bytes each rank sends, per attention layer, for the three ways to attend across P ranks (lesson 12).

Shapes: B x H x N x D, ``element_bytes`` per element (2 for bf16). Forward pass only; the backward of each sends
as much again, plus the gradients (ring: dK and dV around the ring; Ulysses: the all-to-alls of dO and dQ, dK,
dV). Counts are what one rank sends; in a ring or an all-to-all every rank sends that much at the same time.
"""

from __future__ import annotations

__all__ = ["allgather_kv_bytes", "ring_bytes", "ring_step_bytes", "ring_step_flops", "ulysses_bytes"]


def _shard_elements(batch: int, heads: int, n: int, head_dim: int, world: int) -> int:
    """Elements of one tensor's shard: B x H x N/P x D."""
    return batch * heads * (n // world) * head_dim


def ring_step_bytes(batch, heads, n, head_dim, world, element_bytes=2) -> int:
    """One ring step: this rank's K and V shards to the next rank."""
    return 2 * _shard_elements(batch, heads, n, head_dim, world) * element_bytes


def ring_step_flops(batch, heads, n, head_dim, world, *, causal=True) -> float:
    """Forward matmul FLOPs of one ring step on one rank: an (N/P) x (N/P) block, 4 B H (N/P)^2 D; under a causal
    mask with the zigzag layout every step computes half of it (lesson 12's schedule)."""
    block = 4.0 * batch * heads * (n // world) ** 2 * head_dim
    return block / 2 if causal else block


def ring_bytes(batch, heads, n, head_dim, world, element_bytes=2) -> int:
    """Ring attention: P - 1 steps, each sending the K/V shard it holds."""
    return (world - 1) * ring_step_bytes(batch, heads, n, head_dim, world, element_bytes)


def allgather_kv_bytes(batch, heads, n, head_dim, world, element_bytes=2) -> int:
    """All-gather of K and V: this rank's shards go to the P - 1 others (the same bytes as the ring; the
    difference is memory: every rank then holds all N keys and values at once)."""
    return (world - 1) * ring_step_bytes(batch, heads, n, head_dim, world, element_bytes)


def ulysses_bytes(batch, heads, n, head_dim, world, element_bytes=2) -> int:
    """Ulysses: all-to-alls of q, k, v (sequence -> heads) and of o (heads -> sequence); each keeps 1/P of its
    shard and sends the other (P - 1)/P."""
    shard = _shard_elements(batch, heads, n, head_dim, world)
    return 4 * shard * (world - 1) // world * element_bytes
