"""The tiled NumPy FlashAttention against the reference (forward) and torch autograd in float64 (backward)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_reference import VARIANT_NAMES, variant_case
from variant_spec import dense_keep, torch_attention

from flashcourse import reference, tiled
from flashcourse.measure import peak_memory
from flashcourse.tolerance import assert_close

CASES = [(1, 1), (7, 3), (64, 64), (257, 80)]


def _qkv(rng, lead, n, d, scale_inputs=1.0, dtype=np.float64):
    return tuple((rng.standard_normal((*lead, n, d)) * s).astype(dtype) for s in (scale_inputs, scale_inputs, 1.0))


@pytest.mark.parametrize("lead", [(), (2, 3)])
@pytest.mark.parametrize("n,d", CASES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("order", ["fa2", "fa1"])
def test_forward_matches_reference(rng, lead, n, d, causal, order):
    q, k, v = _qkv(rng, lead, n, d)
    o, lse = tiled.flash_forward(q, k, v, causal=causal, block_q=16, block_k=24, order=order)
    o_ref, lse_ref = reference.attention_lse(q, k, v, causal=causal)
    assert_close(o, o_ref, what=f"{order} o")
    assert_close(lse, lse_ref, what=f"{order} lse")


@pytest.mark.parametrize("block_q,block_k", [(1, 1), (5, 64), (64, 5), (300, 300)])
def test_any_block_sizes(rng, block_q, block_k):
    q, k, v = _qkv(rng, (2,), 37, 8)
    o, _ = tiled.flash_forward(q, k, v, causal=True, block_q=block_q, block_k=block_k)
    assert_close(o, reference.attention(q, k, v, causal=True))


def test_large_logits_and_float32(rng):
    q, k, v = _qkv(rng, (2,), 65, 16, scale_inputs=100.0)
    o, lse = tiled.flash_forward(q, k, v, causal=True, block_q=16, block_k=16)
    assert np.isfinite(o).all() and np.isfinite(lse).all()
    assert_close(o, reference.attention(q, k, v, causal=True))
    q32, k32, v32 = (x.astype(np.float32) for x in _qkv(rng, (), 100, 32))
    o32, _ = tiled.flash_forward(q32, k32, v32, block_q=32, block_k=32)
    assert o32.dtype == np.float32
    assert_close(o32, reference.attention(*(x.astype(np.float64) for x in (q32, k32, v32))))


def test_rectangular_and_empty_keys(rng):
    q = rng.standard_normal((5, 4))
    k, v = rng.standard_normal((12, 4)), rng.standard_normal((12, 6))
    o, lse = tiled.flash_forward(q, k, v, block_q=2, block_k=5)
    o_ref, lse_ref = reference.attention_lse(q, k, v)
    assert_close(o, o_ref)
    assert_close(lse, lse_ref)
    o, lse = tiled.flash_forward(q, k[:0], v[:0])
    assert np.all(o == 0) and np.all(lse == -np.inf)


def test_tile_schedule_skips_exactly_the_tiles_above_the_diagonal():
    tiles = tiled.tile_schedule(10, 10, 4, 3, causal=True)
    for t in tiles:
        keep = reference.causal_mask(t.q_stop - t.q_start, t.k_stop - t.k_start, t.q_start, t.k_start)
        expected = "skipped" if not keep.any() else "full" if keep.all() else "diagonal"
        assert t.kind == expected, t
    assert {t.kind for t in tiled.tile_schedule(10, 10, 4, 3)} == {"full"}


def test_forward_steps_end_in_the_forward_result(rng):
    q, k, v = _qkv(rng, (), 50, 8)
    steps = list(tiled.forward_steps(q, k, v, causal=True, block_q=16, block_k=16))
    computed = [t for t in tiled.tile_schedule(50, 50, 16, 16, causal=True) if t.kind != "skipped"]
    assert [s.tile for s in steps] == computed
    o_ref = reference.attention(q, k, v, causal=True)
    for step in steps:
        last_in_row = step.tile.k_stop >= min(step.tile.q_stop, 50)
        if last_in_row:
            assert_close(step.o, o_ref[step.tile.q_start:step.tile.q_stop])
    steps[0].m[...] = 123.0  # copies: mutating one state leaves the next untouched
    assert steps[1].m[0] != 123.0


@pytest.mark.parametrize("lead", [(), (2, 3)])
@pytest.mark.parametrize("n,d", CASES)
@pytest.mark.parametrize("causal", [False, True])
def test_backward_matches_torch_autograd(rng, lead, n, d, causal):
    q, k, v = _qkv(rng, lead, n, d)
    do = rng.standard_normal(q.shape)
    o, lse = tiled.flash_forward(q, k, v, causal=causal, block_q=16, block_k=24)
    dq, dk, dv = tiled.flash_backward(q, k, v, o, lse, do, causal=causal, block_q=24, block_k=16)
    tq, tk, tv = (torch.tensor(x, requires_grad=True) for x in (q, k, v))
    torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=causal).backward(torch.tensor(do))
    for name, got, t in (("dq", dq, tq), ("dk", dk, tk), ("dv", dv, tv)):
        assert_close(got, t.grad.numpy(), what=name)


def test_backward_with_explicit_scale(rng):
    q, k, v = _qkv(rng, (2,), 20, 5)
    do = rng.standard_normal(q.shape)
    o, lse = tiled.flash_forward(q, k, v, scale=0.7)
    grads = tiled.flash_backward(q, k, v, o, lse, do, scale=0.7, block_q=7, block_k=6)
    tq, tk, tv = (torch.tensor(x, requires_grad=True) for x in (q, k, v))
    torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, scale=0.7).backward(torch.tensor(do))
    for got, t in zip(grads, (tq, tk, tv), strict=True):
        assert_close(got, t.grad.numpy())


def test_no_quadratic_memory(rng):
    """Peak extra memory of the tiled forward and backward stays far below one N x N array."""
    n, d = 2048, 32
    q, k, v = (x.astype(np.float32) for x in _qkv(rng, (), n, d))
    nn_bytes = n * n * 4
    assert peak_memory(lambda: tiled.flash_forward(q, k, v, block_q=64, block_k=64)) < 0.1 * nn_bytes
    o, lse = tiled.flash_forward(q, k, v, block_q=64, block_k=64)
    assert peak_memory(lambda: tiled.flash_backward(q, k, v, o, lse, o, block_q=64, block_k=64)) < 0.1 * nn_bytes
    assert peak_memory(lambda: reference.attention(q, k, v)) > nn_bytes  # the probe does see an N x N array


def test_bad_input_is_explained(rng):
    q, k, v = _qkv(rng, (), 8, 4)
    with pytest.raises(ValueError, match="positive"):
        tiled.flash_forward(q, k, v, block_q=0)
    with pytest.raises(ValueError, match="order"):
        tiled.flash_forward(q, k, v, order="fa3")
    with pytest.raises(ValueError, match="lse has shape"):
        tiled.flash_backward(q, k, v, q, np.zeros(3), q)


# --------------------------------------------------------------------------------------------- variants
@pytest.mark.parametrize("name", VARIANT_NAMES)
@pytest.mark.parametrize("order", ["fa2", "fa1"])
def test_variant_forward_and_backward_match_the_torch_spec(rng, name, order):
    q, k, v, options, spec = variant_case(rng, name)
    do = rng.standard_normal((*q.shape[:-1], v.shape[-1]))
    o_spec, lse_spec, grads_spec = torch_attention(q, k, v, **spec, do=do)
    o, lse = tiled.flash_forward(q, k, v, block_q=4, block_k=5, order=order, **options)
    assert_close(o, o_spec, what=f"{name} o")
    assert np.array_equal(np.isneginf(lse), np.isneginf(lse_spec)), f"{name}: rows with no visible key differ"
    assert_close(lse[np.isfinite(lse)], lse_spec[np.isfinite(lse_spec)], what=f"{name} lse")
    grads = tiled.flash_backward(q, k, v, o, lse, do, block_q=5, block_k=3, **options)
    for what, got, expected in zip(("dq", "dk", "dv"), grads, grads_spec, strict=True):
        assert got.shape == expected.shape, what
        assert_close(got, expected, what=f"{name} {what}")


def test_tile_kinds_follow_the_rule_entry_by_entry(rng):
    """Every tile's kind is what the dense mask says of its entries, over every batch entry and head."""
    ids = np.sort(rng.integers(0, 3, size=(2, 23)), axis=1)
    cases = [({"causal": True}, "diagonal"), ({"causal": "bottom_right"}, "diagonal"),
             ({"window": (5, 2)}, "masked"), ({"causal": True, "window": (6, 0)}, "masked"),
             ({"document_ids": ids}, "masked"), ({"mask_mod": lambda b, h, i, j: (h == 1) | (j < 4)}, "masked")]
    for options, partial in cases:
        n_k = 17 if set(options) == {"causal"} else 23
        extra = None
        if "mask_mod" in options:
            extra = options["mask_mod"](0, np.arange(2)[None, :, None, None], np.arange(23)[:, None],
                                        np.arange(n_k)[None, :])
        keep = dense_keep(2, 2, 23, n_k, causal=options.get("causal", False), window=options.get("window"),
                          document_ids=options.get("document_ids"), extra=extra).numpy()
        tiles = tiled.tile_schedule(23, n_k, 4, 6, batch=2, heads=2, **options)
        assert len(tiles) == 6 * -(-n_k // 6)
        for t in tiles:
            entries = keep[..., t.q_start:t.q_stop, t.k_start:t.k_stop]
            expected = "skipped" if not entries.any() else "full" if entries.all() else partial
            assert t.kind == expected, (options, t)


def test_a_row_of_skipped_tiles_gives_zero_and_minus_inf_in_both_orders(rng):
    q, k, v = _qkv(rng, (1, 1), 20, 4)
    for order in ("fa2", "fa1"):
        o, lse = tiled.flash_forward(q[..., :3, :], k, v, causal="bottom_right", window=(0, 0), block_q=2,
                                     block_k=4, order=order)
        assert_close(o, reference.attention(q[..., :3, :], k, v, causal="bottom_right", window=(0, 0)))
    o, lse = tiled.flash_forward(q, k[..., :8, :], v[..., :8, :], causal="bottom_right", block_q=4, block_k=4)
    assert np.all(o[..., :12, :] == 0) and np.all(np.isneginf(lse[..., :12]))
    states = list(tiled.forward_steps(q, k, v, window=(2, 0), block_q=4, block_k=4))
    assert all(s.tile.kind != "skipped" and s.m.shape == (1, 1, 4) for s in states)


def test_a_sliding_window_skips_all_but_a_band_of_tiles():
    tiles = tiled.tile_schedule(1024, 1024, 64, 64, causal=True, window=(127, 0))
    computed = [t for t in tiles if t.kind != "skipped"]
    # Query block i (first query 64 i) reaches back to key 64 i - 127, in key block i - 2: blocks i-2..i.
    assert len(computed) == 1 + 2 + 14 * 3
    assert max(t.i - t.j for t in computed) == 2 and min(t.i - t.j for t in computed) == 0


def test_variant_tiles_never_hold_an_n_by_n_array(rng):
    n, d = 2048, 32
    q, k, v = (x.astype(np.float32)[None, None] for x in _qkv(rng, (), n, d))
    options = {"window": (256, 0), "alibi_slopes": np.array([0.1]), "softcap": 20.0}
    assert peak_memory(lambda: tiled.flash_forward(q, k, v, **options)) < 0.1 * n * n * 4
