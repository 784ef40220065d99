"""The NumPy specification against independent float64 computations (and torch in float64)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from variant_spec import torch_attention

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


# --------------------------------------------------------------------------------------------- variants as rules
def _docs(rng, b, n):
    """Document ids of b packed sequences of n positions: ascending ids, random lengths."""
    return np.sort(rng.integers(0, 4, size=(b, n)), axis=1)


# name -> (options for the course's functions, the same for the torch spec, (B, H_q, H_kv, N_q, N_k)).
VARIANTS = {
    "bottom_right N_q < N_k": ({"causal": "bottom_right"}, {}, (1, 2, 2, 5, 12)),
    "bottom_right N_q > N_k": ({"causal": "bottom_right"}, {}, (1, 2, 2, 12, 5)),
    "top_left rectangular": ({"causal": "top_left"}, {}, (2, 1, 1, 5, 9)),
    "window (3, 0)": ({"window": (3, 0)}, {}, (1, 2, 2, 13, 13)),
    "window (2, 1) rectangular": ({"window": (2, 1)}, {}, (1, 1, 1, 6, 11)),
    "window (-1, 2)": ({"window": (-1, 2)}, {}, (1, 1, 1, 10, 10)),
    "window (4, 0) and causal": ({"window": (4, 0), "causal": True}, {}, (2, 2, 2, 17, 17)),
    "softcap": ({"softcap": 2.5}, {}, (1, 2, 2, 9, 9)),
    "alibi": ({"alibi_slopes": np.array([0.5, 0.125, 0.03125], dtype=np.float32)}, {}, (1, 3, 3, 7, 11)),
    "gqa 4 -> 2": ({"causal": True}, {}, (2, 4, 2, 9, 9)),
    "mqa 3 -> 1": ({}, {}, (1, 3, 1, 6, 8)),
    # one diagonal per call: window and ALiBi follow the causal alignment, N_q != N_k both ways
    "window + top_left, N_q < N_k": ({"window": (2, 0), "causal": "top_left"}, {}, (1, 1, 1, 6, 11)),
    "window + bottom_right, N_q < N_k": ({"window": (2, 1), "causal": "bottom_right"}, {}, (1, 1, 1, 6, 11)),
    "window + top_left, N_q > N_k": ({"window": (3, 2), "causal": "top_left"}, {}, (1, 1, 1, 11, 6)),
    "alibi + top_left, N_q < N_k": ({"alibi_slopes": np.array([0.5, 0.25], dtype=np.float32), "causal": True},
                                    {}, (1, 2, 2, 5, 9)),
    "alibi + bottom_right, N_q > N_k": ({"alibi_slopes": np.array([0.5], dtype=np.float32),
                                         "causal": "bottom_right"}, {}, (1, 1, 1, 9, 5)),
    "everything": ({"causal": True, "window": (5, 0), "softcap": 3.0,
                    "alibi_slopes": np.array([0.25, 0.5, 0.0625, 1.0])}, {}, (2, 4, 2, 15, 15)),
}


def variant_case(rng, name):
    """q, k, v, the options and the torch spec's options of the named variant (documents and mask_mod added)."""
    if name == "documents":
        ids = _docs(rng, 2, 14)
        options, spec, shape = {"document_ids": ids, "causal": True}, {"document_ids": ids}, (2, 2, 1, 14, 14)
    elif name == "mask_mod":
        options = {"mask_mod": lambda b, h, q_idx, kv_idx: (kv_idx % 3 != 1) | (h == b)}
        spec, shape = {"extra": None}, (2, 2, 2, 8, 10)
    else:
        options, spec, shape = VARIANTS[name]
        options, spec = dict(options), dict(spec)
    b, h_q, h_kv, n_q, n_k = shape
    if name == "mask_mod":
        bi, hi = np.arange(b)[:, None, None, None], np.arange(h_q)[None, :, None, None]
        spec["extra"] = options["mask_mod"](bi, hi, np.arange(n_q)[:, None], np.arange(n_k)[None, :])
    spec.update({key: value for key, value in options.items() if key not in ("mask_mod", "document_ids")})
    spec["causal"] = options.get("causal", False)
    q = rng.standard_normal((b, h_q, n_q, 8)) * (2.0 if "softcap" in options else 1.0)
    k = rng.standard_normal((b, h_kv, n_k, 8)) * (2.0 if "softcap" in options else 1.0)
    v = rng.standard_normal((b, h_kv, n_k, 8))
    return q, k, v, options, spec


VARIANT_NAMES = [*VARIANTS, "documents", "mask_mod"]


@pytest.mark.parametrize("name", VARIANT_NAMES)
def test_variants_match_the_torch_spec(rng, name):
    q, k, v, options, spec = variant_case(rng, name)
    o, lse = reference.attention_lse(q, k, v, **options)
    o_spec, lse_spec = torch_attention(q, k, v, **spec)
    assert_close(o, o_spec, what=f"{name} o")
    assert np.array_equal(np.isneginf(lse), np.isneginf(lse_spec)), f"{name}: rows with no visible key differ"
    seen = np.isfinite(lse_spec)
    assert_close(lse[seen], lse_spec[seen], what=f"{name} lse")


def test_bottom_right_is_torch_causal_lower_right_and_empty_rows_are_zero(rng):
    from torch.nn.attention.bias import causal_lower_right

    q, k, v = _qkv(rng, (1, 1), 12, 4, n_k=5)
    o, lse = reference.attention_lse(q, k, v, causal="bottom_right")
    assert np.all(o[..., :7, :] == 0) and np.all(np.isneginf(lse[..., :7]))  # queries before the first key
    q, k, v = _qkv(rng, (1, 2), 5, 4, n_k=12)
    t = [torch.from_numpy(x) for x in (q, k, v)]
    lower_right = torch.nn.functional.scaled_dot_product_attention(*t, attn_mask=causal_lower_right(5, 12))
    assert_close(reference.attention(q, k, v, causal="bottom_right"), lower_right.numpy())
    assert_close(reference.attention(q, k, v, causal=True), _sdpa(q, k, v, True))  # True stays top-left


def test_options_and_their_mask_mod_give_one_answer(rng):
    """A window, a causal mask or documents written as a NumPy mask_mod give the same output as the option."""
    q, k, v = _qkv(rng, (2, 2), 16, 4)
    ids = _docs(rng, 2, 16)
    pairs = [({"window": (3, 1)}, lambda b, h, i, j: (j >= i - 3) & (j <= i + 1)),
             ({"causal": True}, lambda b, h, i, j: j <= i),
             ({"document_ids": ids}, lambda b, h, i, j: ids[b, i] == ids[b, j])]
    for options, mask_mod in pairs:
        assert_close(reference.attention(q, k, v, mask_mod=mask_mod), reference.attention(q, k, v, **options),
                     what=str(list(options)))


def test_rule_block_gives_the_mask_and_the_alibi_bias():
    rule = reference.attention_rule(3, 5, batch=1, heads=2, causal="bottom_right", window=(1, 0),
                                    alibi_slopes=np.array([1.0, 0.5]))
    keep, bias = rule.block(np.array(0), np.array([[[1]]]), np.arange(3)[:, None], np.arange(5)[None, :])
    assert np.array_equal(np.broadcast_to(keep, (3, 5)), [[0, 1, 1, 0, 0], [0, 0, 1, 1, 0], [0, 0, 0, 1, 1]])
    assert_close(bias[0], -0.5 * np.array([[2, 1, 0, 1, 2], [3, 2, 1, 0, 1], [4, 3, 2, 1, 0]], dtype=float))


def test_variants_keep_the_input_dtype(rng):
    q, k, v = (x.astype(np.float32) for x in _qkv(rng, (1, 2), 9, 4))
    o, lse = reference.attention_lse(q, k, v, softcap=5.0, alibi_slopes=np.array([0.5, 0.25]), window=(2, 2))
    assert o.dtype == lse.dtype == np.float32


BAD_OPTIONS = [
    ({"window": 4}, TypeError, "window is 4 \\(int\\): expected a \\(left, right\\) pair of ints"),
    ({"window": (2.0, 0)}, TypeError, "expected a \\(left, right\\) pair of ints"),
    ({"window": (3, -2)}, ValueError, "each side must be >= -1"),
    ({"window": (1, 2, 3)}, TypeError, "pair of ints"),
    ({"softcap": 0.0}, ValueError, "softcap must be a finite number > 0"),
    ({"softcap": -1}, ValueError, "softcap must be a finite number > 0"),
    ({"softcap": "50"}, TypeError, "softcap must be a number"),
    ({"alibi_slopes": np.ones(3)}, ValueError, "alibi_slopes has shape \\(3,\\), expected \\(2,\\)"),
    ({"alibi_slopes": np.ones(2, dtype=int)}, TypeError, "alibi_slopes has dtype int"),
    ({"document_ids": np.zeros((1, 8), dtype=int)}, ValueError,
     "document_ids has shape \\(1, 8\\), expected \\(2, 8\\)"),
    ({"document_ids": np.zeros((2, 8))}, ValueError, "document_ids has dtype float64, but integers"),
    ({"causal": "lower_right"}, ValueError, "causal must be False, True, 'top_left' or 'bottom_right'"),
    ({"causal": 1}, ValueError, "causal must be"),
    ({"mask_mod": "causal"}, TypeError, "mask_mod must be a function"),
    ({"mask_mod": lambda b, h, i, j: j - i}, TypeError, "mask_mod returned dtype int64, but a boolean"),
    ({"mask_mod": lambda b, h, i, j: (j <= i) and (i < 4)}, ValueError, "use &, \\| and ~"),
    ({"mask_mod": lambda b, h, i, j: np.ones((3, 3), dtype=bool)}, ValueError, "does not broadcast"),
]


@pytest.mark.parametrize("options,error,match", BAD_OPTIONS, ids=[m for *_, m in BAD_OPTIONS])
def test_bad_variant_options_are_explained(options, error, match):
    q = np.zeros((2, 2, 8, 4))
    with pytest.raises(error, match=match):
        reference.attention(q, q, q, **options)


def test_options_that_name_a_batch_or_head_need_four_dims_and_gqa_needs_a_multiple():
    q = np.zeros((2, 8, 4))
    for options in ({"alibi_slopes": np.ones(2)}, {"document_ids": np.zeros((2, 8), dtype=int)},
                    {"mask_mod": lambda b, h, i, j: j <= i}):
        with pytest.raises(ValueError, match="needs q, k, v in the \\(B, H, N, D\\) layout"):
            reference.attention(q, q, q, **options)
    with pytest.raises(ValueError, match="needs as many queries as keys"):
        reference.attention(np.zeros((1, 1, 4, 2)), np.zeros((1, 1, 6, 2)), np.zeros((1, 1, 6, 2)),
                            document_ids=np.zeros((1, 6), dtype=int))
    with pytest.raises(ValueError, match="H_q to be a multiple of H_kv"):
        reference.attention(np.zeros((1, 3, 4, 2)), np.zeros((1, 2, 4, 2)), np.zeros((1, 2, 4, 2)))
    assert reference.attention(q, q, q, window=(1, 1), softcap=2.0).shape == (2, 8, 4)  # any leading dims
