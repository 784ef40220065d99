"""The IO simulator: exact outputs, the SRAM budget enforced, and the scaling laws of the paper's analysis."""

from __future__ import annotations

import numpy as np
import pytest

from flashcourse import iomodel, reference
from flashcourse.tolerance import assert_close


@pytest.mark.parametrize("algorithm", ["standard", "flash", "flash2"])
@pytest.mark.parametrize("n,d", [(1, 1), (7, 3), (130, 16)])
@pytest.mark.parametrize("causal", [False, True])
def test_output_is_exact(rng, algorithm, n, d, causal):
    q, k, v = (rng.standard_normal((n, d)) for _ in range(3))
    o, stats = iomodel.simulate(algorithm, q, k, v, sram=4096, causal=causal)
    assert_close(o, reference.attention(q, k, v, causal=causal))
    assert stats.peak_sram <= 4096


def test_flash_traffic_matches_the_formula(rng):
    """FA1 order: K, V read once; Q, O, l, m read and O, l, m written once per key block (T_c times)."""
    n, d, bc, br = 96, 8, 32, 8
    q, k, v = (rng.standard_normal((n, d)) for _ in range(3))
    _, stats = iomodel.simulate("flash", q, k, v, sram=10_000, block_q=br, block_k=bc)
    t_c = n // bc
    assert stats.reads == 2 * n * d + t_c * (2 * n * d + 2 * n)
    assert stats.writes == t_c * (n * d + 2 * n)


def test_flash2_traffic_matches_the_formula(rng):
    """FA2 order: Q read once, O and lse written once; K, V read once per query block (T_r times)."""
    n, d, br, bc = 96, 8, 32, 8
    q, k, v = (rng.standard_normal((n, d)) for _ in range(3))
    o, stats = iomodel.simulate("flash2", q, k, v, sram=10_000, block_q=br, block_k=bc)
    t_r = n // br
    assert stats.reads == n * d + t_r * 2 * n * d
    assert stats.writes == n * d + n
    assert_close(o, reference.attention(q, k, v))


def test_flash2_moves_less_than_flash_at_the_default_blocks(rng):
    """Per pass FA1 moves Q, O in and O out (3Nd), FA2 only K, V in (2Nd): about 2/3 of the traffic."""
    q, k, v = (rng.standard_normal((1024, 64)) for _ in range(3))
    fa1 = iomodel.simulate("flash", q, k, v, sram=65_536)[1].total
    fa2 = iomodel.simulate("flash2", q, k, v, sram=65_536)[1].total
    assert 0.6 < fa2 / fa1 < 0.75, f"FA2 / FA1 traffic = {fa2 / fa1:.2f}, expected about 2/3"


def test_flash2_block_sizes_swap_the_roles():
    for sram, d in [(65536, 64), (262144, 64), (20000, 128), (4096, 16)]:
        br, bc = iomodel.flash_block_sizes(sram, d, order="fa2")
        assert bc == min(br, d) and br <= -(-sram // (4 * d))
        assert 2 * bc * d + 2 * br * d + br * bc + 4 * br <= sram
    with pytest.raises(ValueError, match="order"):
        iomodel.flash_block_sizes(65536, 64, order="fa3")


def test_causal_flash_skips_tiles(rng):
    q, k, v = (rng.standard_normal((128, 8)) for _ in range(3))
    _, full = iomodel.simulate("flash", q, k, v, sram=1024)
    _, causal = iomodel.simulate("flash", q, k, v, sram=1024, causal=True)
    assert causal.total < 0.75 * full.total


def test_block_sizes_fit_and_shrink_with_memory():
    for sram, d in [(65536, 64), (262144, 64), (20000, 128), (4096, 16)]:
        br, bc = iomodel.flash_block_sizes(sram, d)
        assert br == min(bc, d)
        assert 2 * bc * d + 2 * br * d + br * bc + 4 * br <= sram
        assert bc <= -(-sram // (4 * d))
    with pytest.raises(ValueError, match="too small"):
        iomodel.flash_block_sizes(100, 64)


def test_sram_overflow_names_the_blocks(rng):
    q, k, v = (rng.standard_normal((64, 8)) for _ in range(3))

    def greedy(mem, **_):
        mem.load("q", label="all of Q")
        mem.load("k", label="all of K")

    with pytest.raises(iomodel.SramOverflowError, match="all of Q"):
        iomodel.simulate(greedy, q, k, v, sram=600)


def test_callable_algorithm_counts_its_traffic(rng):
    q, k, v = (rng.standard_normal((10, 4)) for _ in range(3))

    def whole(mem, *, scale, **_):
        qs, ks, vs = mem.load("q"), mem.load("k"), mem.load("v")
        o = mem.hold(reference.attention(qs, ks, vs, scale=scale), "O")
        mem.hbm_alloc("o", o.shape)
        mem.store("o", o)

    o, stats = iomodel.simulate(whole, q, k, v, sram=1000)
    assert_close(o, reference.attention(q, k, v))
    assert (stats.reads, stats.writes, stats.peak_sram) == (120, 40, 160)


def test_store_of_an_uncounted_array_is_refused(rng):
    q, k, v = (rng.standard_normal((4, 2)) for _ in range(3))

    def sneaky(mem, **_):
        mem.hbm_alloc("o", (4, 2))
        mem.store("o", np.zeros((4, 2)))

    with pytest.raises(ValueError, match="not in SRAM"):
        iomodel.simulate(sneaky, q, k, v, sram=100)


def test_bad_input_is_explained(rng):
    q = rng.standard_normal((4, 2))
    with pytest.raises(ValueError, match="positive"):
        iomodel.simulate("flash", q, q, q, sram=0)
    with pytest.raises(ValueError, match="algorithm"):
        iomodel.simulate("fastest", q, q, q, sram=100)
    with pytest.raises(ValueError, match="one head"):
        iomodel.simulate("flash", q[None], q[None], q[None], sram=100)


@pytest.mark.slow
def test_scaling_laws_at_n4096(rng):
    """The issue's acceptance numbers: flash traffic ~ N^2 d^2 / M, standard ~ N d + N^2."""
    d = 64
    totals = {}
    for n in (2048, 4096):
        q, k, v = (rng.standard_normal((n, d)) for _ in range(3))
        for algorithm, sram in (("standard", 65536), ("flash", 65536), ("flash", 262144)):
            if n == 2048 and sram == 262144:
                continue
            totals[n, algorithm, sram] = iomodel.simulate(algorithm, q, k, v, sram=sram)[1].total
    assert 3.0 <= totals[4096, "flash", 65536] / totals[4096, "flash", 262144] <= 5.5
    assert 3.5 <= totals[4096, "standard", 65536] / totals[2048, "standard", 65536] <= 4.5
    assert 3.5 <= totals[4096, "flash", 65536] / totals[2048, "flash", 65536] <= 4.5


# ------------------------------------------------------------------------------------------------ variants
@pytest.mark.parametrize("algorithm", ["standard", "flash", "flash2"])
def test_variant_outputs_are_exact(rng, algorithm):
    q, k, v = (rng.standard_normal((40, 8)) for _ in range(3))
    ids = np.sort(rng.integers(0, 3, size=(1, 40)), axis=1)
    for options in ({"causal": "bottom_right", "window": (6, 2)}, {"softcap": 1.5, "alibi_slopes": np.array([0.3])},
                    {"document_ids": ids, "mask_mod": lambda b, h, i, j: (i + j) % 5 != 0}):
        o, _ = iomodel.simulate(algorithm, q, k, v, sram=2048, block_q=8, block_k=8, **options)
        assert_close(o, reference.attention(q[None, None], k[None, None], v[None, None], **options)[0, 0],
                     what=f"{algorithm} {list(options)}")


def test_a_sliding_windows_traffic_grows_with_the_window_not_with_n(rng):
    """FA2 order, fixed blocks: full causal traffic grows as N^2, a window's as N * window."""
    def traffic(n, **options):
        q, k, v = (rng.standard_normal((n, 16)) for _ in range(3))
        return iomodel.simulate("flash2", q, k, v, sram=8192, block_q=64, block_k=16, causal=True,
                                **options)[1].total

    small, large = traffic(512, window=(63, 0)), traffic(1024, window=(63, 0))
    assert 1.9 < large / small < 2.1, f"window: doubling N multiplied the traffic by {large / small:.2f}, expected 2"
    causal_small, causal_large = traffic(512), traffic(1024)
    assert causal_large / causal_small > 3.2
    once = 1024 * 16 + 1024 * 16 + 1024  # Q read, O and lse written, whatever the mask
    kv_ratio = (traffic(1024, window=(255, 0)) - once) / (large - once)
    assert 2.0 < kv_ratio <= 4.0, f"four times the window multiplied the K/V reads by {kv_ratio:.2f}"


def test_the_standard_algorithm_pays_for_the_whole_matrix_whatever_the_mask(rng):
    q, k, v = (rng.standard_normal((128, 8)) for _ in range(3))
    dense = iomodel.simulate("standard", q, k, v, sram=2048)[1]
    windowed = iomodel.simulate("standard", q, k, v, sram=2048, causal=True, window=(7, 0))[1]
    assert windowed == dense
    assert iomodel.simulate("flash2", q, k, v, sram=2048, causal=True, window=(7, 0))[1].total < dense.total / 4


def test_a_callable_algorithm_refuses_variant_options(rng):
    q = rng.standard_normal((8, 4))
    with pytest.raises(ValueError, match="callable algorithm takes causal=True / False only"):
        iomodel.simulate(lambda mem, **kw: None, q, q, q, sram=512, window=(2, 0))
