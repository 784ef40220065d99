"""distributed.cost under grouped-query attention: the ring's K/V bytes shrink by G, Ulysses' q and o do not; a
backward ring step sends 3x the forward's bytes at bf16; the hide threshold n > e R / (G W)."""

from __future__ import annotations

import pytest

from flashcourse.distributed import cost

B, H, N, D = 1, 32, 1 << 17, 128


@pytest.mark.parametrize("world", [2, 4, 8])
def test_gqa_divides_the_rings_kv_bytes_by_the_group(world):
    for group in (1, 4, 8):
        assert cost.ring_bytes(B, H, N, D, world, kv_heads=H // group) * group == cost.ring_bytes(B, H, N, D, world)
        assert cost.allgather_kv_bytes(B, H, N, D, world, kv_heads=H // group) == cost.ring_bytes(
            B, H, N, D, world, kv_heads=H // group)


def test_gqa_leaves_ulysses_q_and_o():
    world, group = 4, 8
    per_tensor = cost.ulysses_bytes(B, H, N, D, world) // 4  # q, k, v, o alike without GQA
    assert cost.ulysses_bytes(B, H, N, D, world, kv_heads=H // group) == 2 * per_tensor + 2 * per_tensor // group


def test_ring_over_ulysses_is_p_over_two_without_gqa():
    for world in (2, 4, 8, 16):
        ratio = cost.ring_bytes(B, H, N, D, world) / cost.ulysses_bytes(B, H, N, D, world)
        assert ratio == pytest.approx(world / 2)


def test_backward_ring_step_sends_k_v_and_fp32_gradients():
    forward = cost.ring_step_bytes(B, H, N, D, 4)
    assert cost.ring_backward_step_bytes(B, H, N, D, 4) == 3 * forward  # bf16 K, V + fp32 dK, dV
    assert cost.ring_backward_step_bytes(B, H, N, D, 4, kv_heads=4) * 8 == 3 * forward


def test_hide_threshold_is_e_r_over_g_w():
    rate, link = 400.0, 450e9
    assert cost.hide_positions(rate, link) == pytest.approx(2 * rate * 1e12 / link)
    assert cost.hide_positions(rate, link, group=4) == pytest.approx(cost.hide_positions(rate, link) / 4)
    assert cost.hide_positions(rate, link, causal=False) == pytest.approx(cost.hide_positions(rate, link) / 2)
    # at the threshold a causal step's compute time equals its transfer time
    n_local = cost.hide_positions(rate, link, group=4)
    world = 4
    n = round(n_local) * world  # whole positions on every rank
    compute_s = cost.ring_step_flops(B, H, n, D, world) / (rate * 1e12)
    send_s = cost.ring_step_bytes(B, H, n, D, world, kv_heads=H // 4) / link
    assert compute_s == pytest.approx(send_s, rel=1e-3)


@pytest.mark.parametrize("shape, match", [
    ((B, H, 1000, D, 3), "n=1000 over world=3 ranks"), ((B, H, N, D, 0), "world=0"), ((0, H, N, D, 4), "batch=0"),
    ((B, H, N, -64, 4), "head_dim=-64"), ((B, H, float(N), D, 4), "n=.*positive integer"),
])
def test_shapes_a_rank_cannot_hold_are_refused(shape, match):
    """N not a multiple of P was floored (a rank of 333.3 positions counted as 333), P = 0 divided by zero."""
    for count in (cost.ring_bytes, cost.ulysses_bytes, cost.ring_step_flops, cost.ring_backward_step_bytes):
        with pytest.raises(ValueError, match=match):
            count(*shape)


def test_bad_rates_are_refused():
    for tflops, link in ((0.0, 450e9), (400.0, -1.0), (float("nan"), 450e9), (400.0, float("inf"))):
        with pytest.raises(ValueError, match="positive, finite rates"):
            cost.hide_positions(tflops, link)


def test_bad_group_sizes_are_refused():
    with pytest.raises(ValueError, match="multiple of the K/V"):
        cost.ring_bytes(B, H, N, D, 4, kv_heads=5)
    with pytest.raises(ValueError, match="at least 1"):
        cost.hide_positions(400, 450e9, group=0)
