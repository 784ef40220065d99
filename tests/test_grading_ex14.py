"""Exercise 14's checks (the hand-written code round): right answers pass the hidden tests, stubs fail with the
not-implemented message, and each usual mistake is rejected with its diagnosis."""

from __future__ import annotations

import numpy as np
import pytest

from flashcourse import grading


# ------------------------------------------------------------------------------------------ right answers, with knobs
def _softmax(s, axis=-1):
    e = np.exp(s - s.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def _attend(q, k, v, causal, scale, *, axis=-1, mask_shift=0):
    s = q @ np.swapaxes(k, -1, -2) * scale
    if causal:
        n_q, n_k = s.shape[-2:]
        s = np.where(np.arange(n_k)[None, :] <= np.arange(n_q)[:, None] + mask_shift, s, -np.inf)
    return _softmax(s, axis=axis) @ v


def gqa_forward(x, w_q, w_k, w_v, w_o, n_heads, n_kv_heads, *, causal=False, tile=False, scale_dim="head",
                split_wrong=False, merge_wrong=False, axis=-1, mask_shift=0, no_check=False, project=True):
    if not no_check and n_heads % n_kv_heads:
        raise ValueError(f"n_heads={n_heads} is not a multiple of n_kv_heads={n_kv_heads}")
    b, n, d_model = x.shape
    d_head = w_q.shape[1] // n_heads

    def heads(y, count):
        if split_wrong:
            return y.reshape(b, count, n, d_head)
        return y.reshape(b, n, count, d_head).transpose(0, 2, 1, 3)

    q, k, v = heads(x @ w_q, n_heads), heads(x @ w_k, n_kv_heads), heads(x @ w_v, n_kv_heads)
    group = n_heads // n_kv_heads
    if tile:
        k, v = np.tile(k, (1, group, 1, 1)), np.tile(v, (1, group, 1, 1))
    else:
        k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    scale = 1 / np.sqrt(d_head if scale_dim == "head" else d_model)
    if scale_dim == "none":
        scale = 1.0
    o = _attend(q, k, v, causal, scale, axis=axis, mask_shift=mask_shift)
    merged = o.reshape(b, n, -1) if merge_wrong else o.transpose(0, 2, 1, 3).reshape(b, n, -1)
    return merged @ w_o if project else merged


def mha_forward(x, w_q, w_k, w_v, w_o, n_heads, *, causal=False, **mistake):
    return gqa_forward(x, w_q, w_k, w_v, w_o, n_heads, n_heads, causal=causal, **mistake)


def rope(x, positions, *, base=10000.0, interleaved=False, swap=False, sign=1.0, exponent=2.0, ignore_positions=False):
    interleaved = interleaved != swap
    d = x.shape[-1]
    positions = np.arange(x.shape[-2]) if ignore_positions else positions
    angle = np.asarray(positions)[:, None] * base ** (-exponent * np.arange(d // 2) / d)
    cos, sin = np.cos(angle), sign * np.sin(angle)
    if interleaved:
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return np.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1).reshape(x.shape)
    x1, x2 = x[..., :d // 2], x[..., d // 2:]
    return np.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)


def mla_decode(q_c, q_r, c_kv, k_r, w_uk, w_uv, w_o, *, scale=None, swap=False, no_rope=False, content_scale=False,
               decompress=False, head_axis=False, merge_wrong=False):
    if swap:
        w_uk, w_uv = w_uv, w_uk
    d_h, d_r = q_c.shape[-1], q_r.shape[-1]
    if scale is None:
        scale = 1 / np.sqrt(d_h if content_scale else d_h + d_r)
    if decompress:  # the long way: keys and values per head, (H, T, d_h) each
        k_c = np.einsum("hdc,tc->htd", w_uk, c_kv)
        s = np.einsum("hd,htd->ht", q_c, k_c)
    else:
        q_latent = np.einsum("hd,hdc->hc", q_c, w_uk)  # (H, d_c): the query absorbs W_UK
        s = q_latent @ c_kv.T  # (H, T)
    if not no_rope:
        s = s + q_r @ k_r.T
    p = _softmax(s * scale, axis=0 if head_axis else -1)
    if decompress:
        v_c = np.einsum("hdc,tc->htd", w_uv, c_kv)
        o = np.einsum("ht,htd->hd", p, v_c)
    else:
        o = np.einsum("hdc,hc->hd", w_uv, p @ c_kv)  # the output absorbs W_UV
    return w_o @ (o.T.reshape(-1) if merge_wrong else o.reshape(-1))


def kv_cache_bytes(layers, kv_heads, head_dim, tokens, batch, dtype_bytes, *, two=2, with_layers=True):
    return two * (layers if with_layers else 1) * kv_heads * head_dim * tokens * batch * dtype_bytes


def mla_cache_bytes(layers, latent_dim, rope_dim, tokens, batch, dtype_bytes, *, two=1, with_rope=True):
    return layers * (two * latent_dim + (rope_dim if with_rope else 0)) * tokens * batch * dtype_bytes


def test_right_answers_pass_the_hidden_tests():
    grading.check_mha_forward(mha_forward, hidden=True)
    grading.check_gqa_forward(gqa_forward, hidden=True)
    grading.check_rope(rope, hidden=True)
    grading.check_mla_decode(mla_decode, hidden=True)
    grading.check_kv_cache_bytes(kv_cache_bytes, mla_cache_bytes, hidden=True)


def test_torch_answers_pass_too():
    torch = pytest.importorskip("torch")

    def rope_torch(x, positions, *, base=10000.0, interleaved=False):
        return torch.from_numpy(rope(np.asarray(x), positions, base=base, interleaved=interleaved))

    grading.check_rope(rope_torch)


def test_stubs_say_not_implemented():
    def stub(*args, **kwargs):
        raise NotImplementedError("mha_forward: fill in the TODO above")

    for check, functions in [(grading.check_mha_forward, [stub]), (grading.check_gqa_forward, [stub]),
                             (grading.check_rope, [stub]), (grading.check_mla_decode, [stub]),
                             (grading.check_kv_cache_bytes, [stub, stub])]:
        with pytest.raises(grading.NotImplementedYet, match="not implemented yet"):
            check(*functions)


def _with(function, **mistake):
    return lambda *args, **kwargs: function(*args, **kwargs, **mistake)


@pytest.mark.parametrize(("mistake", "diagnosis"), [
    ({"scale_dim": "none"}, "scale is forgotten"),
    ({"scale_dim": "model"}, "the scale uses d_model"),
    ({"axis": -2}, "softmax over the wrong axis"),
    ({"split_wrong": True}, "heads are split wrongly"),
    ({"merge_wrong": True}, "heads are merged wrongly"),
    ({"project": False}, "output projection is missing"),
    ({"mask_shift": 1}, "causal mask is off by one"),
])
def test_mha_mistakes_are_named(mistake, diagnosis):
    with pytest.raises(AssertionError, match=diagnosis):
        grading.check_mha_forward(_with(mha_forward, **mistake))


def test_mha_without_the_max_subtracted_is_told_it_overflows():
    def no_max(x, w_q, w_k, w_v, w_o, n_heads, *, causal=False):
        b, n, d = x.shape
        dh = d // n_heads
        q, k, v = ((x @ w).reshape(b, n, n_heads, dh).transpose(0, 2, 1, 3) for w in (w_q, w_k, w_v))
        s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(dh)
        if causal:
            s = np.where(np.arange(n)[None, :] <= np.arange(n)[:, None], s, -np.inf)
        with np.errstate(over="ignore", invalid="ignore"):
            p = np.exp(s) / np.exp(s).sum(-1, keepdims=True)
        return (p @ v).transpose(0, 2, 1, 3).reshape(b, n, d) @ w_o

    with pytest.raises(AssertionError, match="max is not subtracted"):
        grading.check_mha_forward(no_max)


def test_gqa_repeat_in_the_wrong_order_is_named():
    with pytest.raises(AssertionError, match="repeated in the wrong order"):
        grading.check_gqa_forward(_with(gqa_forward, tile=True))


def test_gqa_must_refuse_heads_that_do_not_divide():
    with pytest.raises(AssertionError, match="was accepted"):
        grading.check_gqa_forward(_accepting_gqa)


def _accepting_gqa(x, w_q, w_k, w_v, w_o, n_heads, n_kv_heads, *, causal=False):
    if n_heads % n_kv_heads:
        return np.zeros((x.shape[0], x.shape[1], w_o.shape[1]))
    return gqa_forward(x, w_q, w_k, w_v, w_o, n_heads, n_kv_heads, causal=causal)


@pytest.mark.parametrize(("mistake", "diagnosis"), [
    ({"swap": True}, "pairing is wrong"),
    ({"sign": -1.0}, "rotation goes the wrong way"),
    ({"exponent": 1.0}, "frequencies are wrong"),
    ({"ignore_positions": True}, "positions are ignored"),
])
def test_rope_mistakes_are_named(mistake, diagnosis):
    with pytest.raises(AssertionError, match=diagnosis):
        grading.check_rope(_with(rope, **mistake))


@pytest.mark.parametrize("convention", [False, True])
def test_rope_accepts_each_convention_only_under_its_own_flag(convention):
    """A rope that always uses one convention passes the cases of that flag and fails the others, named."""
    def one_convention(x, positions, *, base=10000.0, interleaved=False):
        return rope(x, positions, base=base, interleaved=convention)

    expected = "interleaved=False is the half-split" if convention else "interleaved=True pairs neighbours"
    with pytest.raises(AssertionError, match=expected):
        grading.check_rope(one_convention)


@pytest.mark.parametrize(("mistake", "diagnosis"), [
    ({"swap": True}, "W_UK and W_UV are swapped"),
    ({"no_rope": True}, "RoPE part of the score is missing"),
    ({"content_scale": True}, r"1/sqrt\(d_h \+ d_r\)"),
    ({"head_axis": True}, "softmax over the wrong axis"),
    ({"merge_wrong": True}, "concatenated in the wrong order"),
    ({"decompress": True}, "decompresses the latent cache"),
])
def test_mla_mistakes_are_named(mistake, diagnosis):
    with pytest.raises(AssertionError, match=diagnosis):
        grading.check_mla_decode(_with(mla_decode, **mistake))


@pytest.mark.parametrize(("kv", "mla", "diagnosis"), [
    ({"two": 1}, {}, "factor 2 is missing"),
    ({"with_layers": False}, {}, "layers are missing"),
    ({}, {"two": 2}, "latent is counted twice"),
    ({}, {"with_rope": False}, "RoPE key is missing"),
    ({"two": 2 / 1e9}, {}, "in GB"),
])
def test_kv_cache_mistakes_are_named(kv, mla, diagnosis):
    with pytest.raises(AssertionError, match=diagnosis):
        grading.check_kv_cache_bytes(_with(kv_cache_bytes, **kv), _with(mla_cache_bytes, **mla))


def test_the_library_reference_earns_nothing():
    from flashcourse import reference

    def borrowed(x, w_q, w_k, w_v, w_o, n_heads, *, causal=False):
        b, n, d = x.shape
        dh = d // n_heads
        q, k, v = ((x @ w).reshape(b, n, n_heads, dh).transpose(0, 2, 1, 3) for w in (w_q, w_k, w_v))
        return reference.attention(q, k, v, causal=causal).transpose(0, 2, 1, 3).reshape(b, n, d) @ w_o

    with pytest.raises(grading.ForbiddenCallError):
        grading.check_mha_forward(borrowed)


def test_the_clock_reports_the_time(capsys):
    grading.start_code_clock()
    grading.check_kv_cache_bytes(kv_cache_bytes, mla_cache_bytes)
    assert "since start_code_clock()" in capsys.readouterr().out
