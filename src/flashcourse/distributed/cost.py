"""Bytes each rank sends, per attention layer, for the three ways to attend across P ranks (lesson 12), and when
a ring step's compute hides its transfer.

Shapes: B x H x N x D, ``element_bytes`` per element (2 for bf16); ``kv_heads`` is the number of K/V heads under
grouped-query attention (None: as many as query heads), so the group size is G = heads / kv_heads. Counts are
what one rank sends; in a ring or an all-to-all every rank sends that much at the same time.

Forward: the ring sends its K/V shard P - 1 times (K/V of ``kv_heads`` heads: G times fewer bytes under GQA);
Ulysses sends (P - 1)/P of its q, k, v and o shards (q and o keep all ``heads`` heads, so GQA shrinks only k and
v). Backward: a ring step sends the K/V shard again plus that shard's dK and dV accumulators, in float32 as
``distributed.ring`` sends them (:func:`ring_backward_step_bytes`: 3x the forward's bytes at bf16); Ulysses
all-to-alls dO and then dQ, dK, dV.
"""

from __future__ import annotations

from numbers import Integral

__all__ = ["allgather_kv_bytes", "hide_positions", "ring_backward_step_bytes", "ring_bytes", "ring_step_bytes",
           "ring_step_flops", "ulysses_bytes"]


def _positions_per_rank(batch, heads, n, head_dim, world) -> int:
    """N / P, the positions each rank holds, once the shape is checked."""
    for name, value in (("batch", batch), ("heads", heads), ("n", n), ("head_dim", head_dim), ("world", world)):
        if isinstance(value, bool) or not isinstance(value, Integral) or value < 1:
            raise ValueError(f"{name}={value!r}: a positive integer is expected")
    if n % world:
        raise ValueError(f"n={n} over world={world} ranks: every rank holds N/P positions, so N must be a multiple "
                         "of P")
    return n // world


def _shard_elements(batch: int, heads: int, n: int, head_dim: int, world: int) -> int:
    """Elements of one tensor's shard: B x H x N/P x D."""
    return batch * heads * _positions_per_rank(batch, heads, n, head_dim, world) * head_dim


def _kv_heads(heads: int, kv_heads: int | None) -> int:
    if kv_heads is None:
        return heads
    if kv_heads < 1 or heads % kv_heads:
        raise ValueError(f"kv_heads={kv_heads} with heads={heads}: the query heads must be a multiple of the K/V "
                         "heads (grouped-query attention)")
    return kv_heads


def ring_step_bytes(batch, heads, n, head_dim, world, element_bytes=2, *, kv_heads=None) -> int:
    """One ring step: this rank's K and V shards (``kv_heads`` heads each) to the next rank."""
    return 2 * _shard_elements(batch, _kv_heads(heads, kv_heads), n, head_dim, world) * element_bytes


def ring_backward_step_bytes(batch, heads, n, head_dim, world, element_bytes=2, grad_bytes=4, *,
                             kv_heads=None) -> int:
    """One backward ring step: the K and V shards again, and the dK and dV accumulators of a shard, which travel
    in float32 (``grad_bytes`` = 4) behind their keys (``distributed.ring._ring_backward``)."""
    kv = _shard_elements(batch, _kv_heads(heads, kv_heads), n, head_dim, world)
    return 2 * kv * element_bytes + 2 * kv * grad_bytes


def ring_step_flops(batch, heads, n, head_dim, world, *, causal=True) -> float:
    """Forward matmul FLOPs of one ring step on one rank: an (N/P) x (N/P) block, 4 B H (N/P)^2 D; under a causal
    mask with the zigzag layout every step computes half of it (lesson 12's schedule). GQA changes nothing here:
    every query head still meets every key."""
    block = 4.0 * batch * heads * _positions_per_rank(batch, heads, n, head_dim, world) ** 2 * head_dim
    return block / 2 if causal else block


def ring_bytes(batch, heads, n, head_dim, world, element_bytes=2, *, kv_heads=None) -> int:
    """Ring attention: P - 1 steps, each sending the K/V shard it holds."""
    return (world - 1) * ring_step_bytes(batch, heads, n, head_dim, world, element_bytes, kv_heads=kv_heads)


def allgather_kv_bytes(batch, heads, n, head_dim, world, element_bytes=2, *, kv_heads=None) -> int:
    """All-gather of K and V: this rank's shards go to the P - 1 others (the same bytes as the ring; the
    difference is memory: every rank then holds all N keys and values at once)."""
    return (world - 1) * ring_step_bytes(batch, heads, n, head_dim, world, element_bytes, kv_heads=kv_heads)


def ulysses_bytes(batch, heads, n, head_dim, world, element_bytes=2, *, kv_heads=None) -> int:
    """Ulysses: all-to-alls of q, k, v (sequence -> heads) and of o (heads -> sequence); each keeps 1/P of its
    shard and sends the other (P - 1)/P. q and o have ``heads`` heads, k and v ``kv_heads``."""
    per_head = _shard_elements(batch, 1, n, head_dim, world)
    elements = per_head * (2 * heads + 2 * _kv_heads(heads, kv_heads))
    return elements * (world - 1) // world * element_bytes


def hide_positions(tflops: float, link_bytes_per_s: float, *, element_bytes: int = 2, group: int = 1,
                   causal: bool = True) -> float:
    """Positions per rank n above which one forward ring step computes longer than it sends: a causal zigzag step
    computes 2 H n^2 D FLOPs (4 H n^2 D without the mask) at ``tflops`` and sends 2 n (H / G) D elements of
    ``element_bytes`` at ``link_bytes_per_s``, so n > e R / (G W) (half that without the mask). H and D cancel;
    the group size G of grouped-query attention divides the threshold."""
    if group < 1:
        raise ValueError(f"group={group}: the group size G = H_q / H_kv is at least 1")
    if not (0 < tflops < float("inf") and 0 < link_bytes_per_s < float("inf")):
        raise ValueError(f"tflops={tflops!r}, link_bytes_per_s={link_bytes_per_s!r}: positive, finite rates are "
                         "expected")
    threshold = element_bytes * tflops * 1e12 / (group * link_bytes_per_s)
    return threshold if causal else threshold / 2
