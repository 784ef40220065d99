"""The NumPy specification against independent float64 computations (and torch in float64)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from flashcourse import reference
from flashcourse.tolerance import assert_close

SIZES = [(1, 1), (7, 3), (64, 64), (257, 80)]
LEADING = [(), (2, 3)]


def _qkv(rng, lead, n, d, n_k=None, dtype=np.float64, scale_inputs=1.0):
    n_k = n if n_k is None else n_k
    q = rng.standard_normal((*lead, n, d)) * scale_inputs
    k = rng.standard_normal((*lead, n_k, d)) * scale_inputs
    v = rng.standard_normal((*lead, n_k, d))
    return q.astype(dtype), k.astype(dtype), v.astype(dtype)


def _sdpa(q, k, v, causal, scale=None):
    t = [torch.from_numpy(np.ascontiguousarray(x)) for x in (q, k, v)]
    return torch.nn.functional.scaled_dot_product_attention(*t, is_causal=causal, scale=scale).numpy()


@pytest.mark.parametrize("lead", LEADING)
@pytest.mark.parametrize("n,d", SIZES)
@pytest.mark.parametrize("causal", [False, True])
def test_attention_matches_torch_float64(rng, lead, n, d, causal):
    q, k, v = _qkv(rng, lead, n, d)
    assert_close(reference.attention(q, k, v, causal=causal), _sdpa(q, k, v, causal), what="attention")


def test_attention_scale_and_rectangular(rng):
    q, k, v = _qkv(rng, (2,), 5, 8, n_k=11)
    assert_close(reference.attention(q, k, v, scale=0.3), _sdpa(q, k, v, False, scale=0.3))


def test_attention_lse_is_logsumexp_of_scores(rng):
    q, k, v = _qkv(rng, (3,), 9, 4)
    _, lse = reference.attention_lse(q, k, v, causal=True)
    s = q @ np.swapaxes(k, -1, -2) / 2.0
    s[..., np.triu_indices(9, 1)[0], np.triu_indices(9, 1)[1]] = -np.inf
    assert_close(lse, np.log(np.sum(np.exp(s), axis=-1)), what="lse")


def test_large_logits_stay_finite(rng):
    q, k, v = _qkv(rng, (2,), 64, 16, scale_inputs=100.0)
    for causal in (False, True):
        o, lse = reference.attention_lse(q, k, v, causal=causal)
        assert np.isfinite(o).all() and np.isfinite(lse).all()
        assert_close(o, _sdpa(q, k, v, causal))


def test_fully_masked_row_gives_zero_and_minus_inf(rng):
    q, k, v = _qkv(rng, (), 4, 3)
    mask = np.ones((4, 4), dtype=bool)
    mask[2] = False
    o, lse = reference.attention_lse(q, k, v, mask=mask)
    assert np.all(o[2] == 0) and lse[2] == -np.inf
    assert np.isfinite(o).all()
    expected = reference.attention(q[[0, 1, 3]], k, v)
    assert_close(o[[0, 1, 3]], expected)


def test_softmax_naive_overflows_and_safe_does_not():
    x = np.array([[10.0, 20.0, 30.0]])
    with np.errstate(all="ignore"):
        assert np.isnan(reference.softmax_naive(x.astype(np.float16))).any()
        assert np.isnan(reference.softmax_naive((x * 10).astype(np.float32))).any()
    for dtype in (np.float16, np.float32):
        safe = reference.softmax_safe((x * 10).astype(dtype))
        assert np.isfinite(safe).all()
        assert_close(safe, reference.softmax_safe(x * 10), dtype=dtype)


@pytest.mark.parametrize("block", [1, 3, 64, 1000])
@pytest.mark.parametrize("axis", [-1, 0])
def test_softmax_online_equals_safe(rng, block, axis):
    x = rng.standard_normal((37, 129)) * 30
    expected = np.exp(x - x.max(axis=axis, keepdims=True))
    expected /= expected.sum(axis=axis, keepdims=True)
    assert_close(reference.softmax_online(x, block=block, axis=axis), expected)
    assert_close(reference.softmax_safe(x, axis=axis), expected)


def test_softmax_of_all_minus_inf_row_is_zero():
    x = np.array([[-np.inf, -np.inf], [0.0, -np.inf]])
    for fn in (reference.softmax_safe, lambda a: reference.softmax_online(a, block=1)):
        out = fn(x)
        assert np.array_equal(out, [[0.0, 0.0], [1.0, 0.0]])


def test_online_steps_track_running_statistics(rng):
    x = rng.standard_normal(23) * 5
    values = rng.standard_normal((23, 4))
    steps = list(reference.softmax_online_steps(x, 5, values))
    assert [s.start for s in steps] == [0, 5, 10, 15, 20] and steps[-1].stop == 23
    for s in steps:
        seen = x[:s.stop]
        assert s.m == pytest.approx(seen.max())
        assert s.l == pytest.approx(np.exp(seen - seen.max()).sum())
        assert s.rescale == pytest.approx(np.exp(s.m_prev - s.m) if s.index else 0.0)
        weights = np.exp(seen - seen.max()) / np.exp(seen - seen.max()).sum()
        assert_close(s.output, weights @ values[:s.stop])


def test_merge_of_empty_parts():
    m, l = reference.merge(-np.inf, 0.0, -np.inf, 0.0)
    assert m == -np.inf and l == 0.0
    m, l = reference.merge(-np.inf, 0.0, 2.0, 3.0)
    assert (m, l) == (2.0, 3.0)


def test_merge_is_associative_and_commutative(rng):
    x = rng.standard_normal((3, 50)) * 20

    def stats(part):
        return part.max(axis=-1), np.exp(part - part.max(axis=-1, keepdims=True)).sum(axis=-1)

    a, b, c = stats(x[:, :10]), stats(x[:, 10:31]), stats(x[:, 31:])
    left = reference.merge(*reference.merge(*a, *b), *c)
    right = reference.merge(*a, *reference.merge(*b, *c))
    swapped = reference.merge(*c, *reference.merge(*b, *a))
    whole = stats(x)
    for got in (left, right, swapped):
        assert_close(got[0], whole[0], what="m")
        assert_close(got[1], whole[1], what="l")


def test_merge_partials_equals_attention_over_all_keys(rng):
    q, k, v = _qkv(rng, (2,), 6, 8, n_k=30)
    o1, lse1 = reference.attention_lse(q, k[..., :13, :], v[..., :13, :], scale=0.5)
    o2, lse2 = reference.attention_lse(q, k[..., 13:, :], v[..., 13:, :], scale=0.5)
    o, lse = reference.merge_partials(o1, lse1, o2, lse2)
    o_all, lse_all = reference.attention_lse(q, k, v, scale=0.5)
    assert_close(o, o_all)
    assert_close(lse, lse_all)


def test_merge_partials_with_empty_parts():
    o = np.ones((2, 3))
    empty = np.full(2, -np.inf)
    got, lse = reference.merge_partials(o, np.array([0.5, 1.0]), np.zeros((2, 3)), empty)
    assert_close(got, o)
    got, lse = reference.merge_partials(np.zeros((2, 3)), empty, np.zeros((2, 3)), empty)
    assert np.array_equal(got, np.zeros((2, 3))) and np.all(lse == -np.inf)


@pytest.mark.parametrize(
    "q_shape,k_shape,v_shape,error,match",
    [
        ((4, 8), (4, 6), (4, 6), ValueError, "head dim"),
        ((2, 4, 8), (3, 4, 8), (3, 4, 8), ValueError, "leading"),
        ((8,), (4, 8), (4, 8), ValueError, "at least 2 dims"),
        ((4, 8), (5, 8), (4, 8), ValueError, "same length"),
    ],
)
def test_bad_shapes_are_explained(q_shape, k_shape, v_shape, error, match):
    with pytest.raises(error, match=match):
        reference.attention(np.zeros(q_shape), np.zeros(k_shape), np.zeros(v_shape))


def test_bad_dtype_and_block_are_explained():
    with pytest.raises(TypeError, match="floating dtype"):
        reference.attention(np.zeros((2, 2), dtype=int), np.zeros((2, 2)), np.zeros((2, 2)))
    with pytest.raises(ValueError, match="positive"):
        reference.softmax_online(np.zeros(4), block=0)
    with pytest.raises(TypeError, match="positive int"):
        reference.softmax_online(np.zeros(4), block=2.5)


def test_a_block_of_all_minus_inf_changes_nothing(rng):
    x = rng.standard_normal(12)
    x[4:8] = -np.inf
    steps = list(reference.softmax_online_steps(x, 4))
    assert (steps[1].m, steps[1].l) == (steps[0].m, steps[0].l)
    assert_close(reference.softmax_online(x, block=4), reference.softmax_safe(x))
    m, l = reference.merge(1.5, 2.0, -np.inf, 0.0)
    assert (m, l) == (1.5, 2.0)


def test_scale_and_rescale_helpers():
    assert reference.resolve_scale(None, 64) == 0.125 and reference.resolve_scale(0.3, 64) == 0.3
    with pytest.raises(ValueError, match="finite"):
        reference.attention(np.zeros((2, 2)), np.zeros((2, 2)), np.zeros((2, 2)), scale=np.nan)
    factors = reference.rescale_factor(np.array([-np.inf, 1.0, -np.inf]), np.array([-np.inf, 3.0, 2.0]))
    assert_close(factors, np.array([0.0, np.exp(-2.0), 0.0]))
    assert np.array_equal(reference.safe_max(np.array([-np.inf, 2.0])), [0.0, 2.0])
