"""``flash_decode`` with several new tokens, q (B, H_q, n_new, D), against a float64 NumPy reference.

The convention is flash-attn's ``flash_attn_with_kvcache``: the new tokens' keys are already in the cache and
``cache_seqlens`` counts them, so new token t (0-based) of a sequence of length L sits at key position
L - n_new + t and, causal (bottom-right aligned), sees keys 0 .. L - n_new + t. The reference below writes that
mask out per sequence. Sizes are awkward for the interpreter's 16-key tiles: lengths and caches not multiples of a
tile or a page, a length equal to n_new, splits forced to 1 and to more, GQA; the ``gpu`` tests repeat it at real
sizes in float16 and bfloat16 (speculative verification's few tokens, a chunked prefill's many).

``cache_leftpad`` (flash-attn's first real key P of each sequence, for left-padded prompts) is tested here too: the
reference leaves keys before P out, the tests fill them (and the rows past each length) with NaN, so a kernel that
read one, or weighed one by 0, shows NaN.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from flashcourse import device  # noqa: E402

if not device.triton_available():
    pytest.skip("Triton is not installed here", allow_module_level=True)
from flashcourse import kernels  # noqa: E402
from flashcourse.tolerance import assert_close  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def expected(q, k, v, lengths, *, causal=True, window_left=None, alibi_slopes=None, leftpads=None):
    """(B, H_q, n_new, D) float64: each new token over its sequence's first lengths[b] keys, those before
    leftpads[b] (flash-attn's cache_leftpad) left out, with the mask (and the ALiBi bias -slope * (position - j))
    written out; a row that sees no key gives 0."""
    q, k, v = (t.detach().cpu().double().numpy() for t in (q, k, v))
    batch, h_q, n_new, head_dim = q.shape
    group = h_q // k.shape[1]
    out = np.zeros(q.shape)
    for b, length in enumerate(lengths):
        if length == 0:  # no key at all
            continue
        keys = np.repeat(k[b, :, :length], group, axis=0)  # (H_q, L, D)
        values = np.repeat(v[b, :, :length], group, axis=0)
        pad = 0 if leftpads is None else leftpads[b]
        keys[:, :pad] = values[:, :pad] = 0.0  # the padding (NaN in the tests) weighs nothing: 0 * NaN would be NaN
        scores = q[b] @ keys.swapaxes(-1, -2) / math.sqrt(head_dim)  # (H_q, n_new, L)
        position = (length - n_new + np.arange(n_new))[:, None]
        j = np.arange(length)[None, :]
        seen = np.broadcast_to(j >= pad, (n_new, length)).copy()
        if causal:
            seen &= j <= position
        if window_left is not None:
            seen &= j >= position - window_left
        if alibi_slopes is not None:
            scores = scores - np.asarray(alibi_slopes, dtype=np.float64)[:, None, None] * (position - j)
        scores = np.where(seen, scores, -np.inf)
        top = scores.max(axis=-1, keepdims=True)
        top = np.where(np.isfinite(top), top, 0.0)
        weights = np.exp(scores - top)
        total = weights.sum(axis=-1, keepdims=True)
        out[b] = np.where(total > 0, (weights / np.where(total > 0, total, 1)) @ values, 0.0)
    return out


def make(rng, batch, h_q, h_kv, n_new, n_max, head_dim, dtype=torch.float32):
    shapes = ((batch, h_q, n_new, head_dim), (batch, h_kv, n_max, head_dim), (batch, h_kv, n_max, head_dim))
    return [torch.tensor(rng.standard_normal(s), dtype=dtype, device=DEVICE) for s in shapes]


def paged(k, v, page_size, rng):
    """The cache cut into pages stored in shuffled order, and the block table that finds them."""
    batch, h_kv, n, head_dim = k.shape
    pages = -(-n // page_size)
    order = torch.tensor(rng.permutation(batch * pages), dtype=torch.int32)

    def store(x):
        padded = torch.zeros(batch, h_kv, pages * page_size, head_dim, dtype=x.dtype, device=x.device)
        padded[:, :, :n] = x
        blocks = padded.reshape(batch, h_kv, pages, page_size, head_dim).transpose(1, 2)
        out = torch.empty((batch * pages, h_kv, page_size, head_dim), dtype=x.dtype, device=x.device)
        out[order.long().to(x.device)] = blocks.reshape(-1, h_kv, page_size, head_dim)
        return out

    return store(k), store(v), order.reshape(batch, pages).to(k.device)

def cache_in_layout(rng, k, v, page_size):
    """(k_cache, v_cache, flash_decode's extra options) of the cache k, v: itself for ``page_size`` None, else
    paged, with its block table."""
    if page_size is None:
        return k, v, {}
    k_cache, v_cache, block_table = paged(k, v, page_size, rng)
    return k_cache, v_cache, {"block_table": block_table}



def lengths_tensor(lengths):
    return torch.tensor(lengths, dtype=torch.int32, device=DEVICE)


@pytest.mark.parametrize("n_new", [1, 2, 5, 17])
@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("page_size", [None, 16, 32])
def test_new_tokens_see_the_cache_up_to_their_own_position(rng, n_new, num_splits, page_size):
    """GQA (4 query heads per K/V head), lengths 73 (no multiple of a tile or page), n_new (the new tokens alone)
    and the whole cache of 90; contiguous and paged."""
    q, k, v = make(rng, 3, 8, 2, n_new, 90, 32)
    lengths = [73, n_new, 90]
    k_cache, v_cache, options = cache_in_layout(rng, k, v, page_size)
    o = kernels.flash_decode(q, k_cache, v_cache, cache_seqlens=lengths_tensor(lengths), num_splits=num_splits,
                             **options)
    assert o.shape == q.shape
    assert_close(o, expected(q, k, v, lengths), what=f"{n_new} new tokens, {num_splits} splits, pages {page_size}")


def test_one_new_token_is_the_same_call_in_three_or_four_dims(rng):
    q, k, v = make(rng, 2, 4, 4, 1, 50, 16)
    lengths = lengths_tensor([50, 7])
    four = kernels.flash_decode(q, k, v, cache_seqlens=lengths)
    three = kernels.flash_decode(q[:, :, 0], k, v, cache_seqlens=lengths)
    assert four.shape == (2, 4, 1, 16) and three.shape == (2, 4, 16)
    assert torch.equal(four[:, :, 0], three)


def test_causal_false_lets_every_new_token_see_the_whole_sequence(rng):
    q, k, v = make(rng, 2, 4, 2, 6, 40, 16)
    lengths = [40, 21]
    o = kernels.flash_decode(q, k, v, cache_seqlens=lengths_tensor(lengths), causal=False, num_splits=2)
    assert_close(o, expected(q, k, v, lengths, causal=False), what="non-causal new tokens")
    causal = kernels.flash_decode(q, k, v, cache_seqlens=lengths_tensor(lengths), num_splits=2)
    assert not torch.allclose(o, causal)  # the last token alone sees the same keys either way
    assert torch.allclose(o[:, :, -1], causal[:, :, -1], atol=1e-6)


@pytest.mark.parametrize("page_size", [None, 16])
def test_a_window_and_alibi_measure_from_each_tokens_own_position(rng, page_size):
    q, k, v = make(rng, 2, 4, 2, 5, 64, 16)
    lengths = [64, 30]
    slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625], device=DEVICE)
    k_cache, v_cache, options = cache_in_layout(rng, k, v, page_size)
    o = kernels.flash_decode(q, k_cache, v_cache, cache_seqlens=lengths_tensor(lengths), window=(9, 0),
                             alibi_slopes=slopes, num_splits=2, **options)
    assert_close(o, expected(q, k, v, lengths, window_left=9, alibi_slopes=slopes.cpu().numpy()),
                 what=f"window and ALiBi with new tokens, pages {page_size}")


def test_an_empty_sequence_gives_zeros(rng):
    q, k, v = make(rng, 2, 2, 2, 3, 20, 16)
    o = kernels.flash_decode(q, k, v, cache_seqlens=[0, 20])
    assert torch.all(o[0] == 0)
    assert_close(o, expected(q, k, v, [0, 20]), what="an empty sequence beside a full one")


@pytest.mark.parametrize("lengths", [[4, 20], torch.tensor([20, 4], dtype=torch.int32)], ids=["list", "tensor"])
def test_a_length_shorter_than_the_new_tokens_is_refused(rng, lengths):
    q, k, v = make(rng, 2, 2, 2, 5, 20, 16)
    if isinstance(lengths, torch.Tensor):
        lengths = lengths.to(DEVICE)
    with pytest.raises(ValueError, match=r"cache_seqlens\[\d\] = 4 but q has n_new = 5 new tokens: a length counts"):
        kernels.flash_decode(q, k, v, cache_seqlens=lengths)


def test_more_new_tokens_than_the_cache_holds_is_refused(rng):
    q, k, v = make(rng, 1, 2, 2, 30, 20, 16)
    with pytest.raises(ValueError, match="cache_seqlens\\[0\\] = 20 but q has n_new = 30"):
        kernels.flash_decode(q, k, v)


def test_causal_must_be_a_bool(rng):
    q, k, v = make(rng, 1, 2, 2, 3, 20, 16)
    with pytest.raises(TypeError, match="causal is 'bottom_right': expected True"):
        kernels.flash_decode(q, k, v, causal="bottom_right")


# ------------------------------------------------------------------------------------------ cache_leftpad
def left_padded(k, v, lengths, leftpads):
    """k and v with each sequence's padding rows (before leftpads[b]) and unused rows (from lengths[b] on) set to
    NaN: a kernel that read any of them, or weighed one by 0, would show NaN."""
    k, v = k.clone(), v.clone()
    for b, (length, pad) in enumerate(zip(lengths, leftpads, strict=True)):
        for x in (k, v):
            x[b, :, :pad] = float("nan")
            x[b, :, length:] = float("nan")
    return k, v


def leftpad_tensor(leftpads):
    return torch.tensor(leftpads, dtype=torch.int32, device=DEVICE)


@pytest.mark.parametrize("n_new", [1, 3])
@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("page_size", [None, 16])
def test_left_padding_is_never_attended(rng, n_new, num_splits, page_size):
    """cache_leftpad (flash-attn's): sequence b attends keys leftpads[b] .. lengths[b] - 1, bottom-right causal
    against its length. Mixed paddings: none, inside the first tile, past one (37, no multiple of a tile or page),
    and every key but the new tokens' own; GQA 4:1, head dim 40; the padding rows hold NaN."""
    q, k, v = make(rng, 4, 8, 2, n_new, 90, 40)
    lengths = [73, 40, 90, 21]
    leftpads = [0, 5, 37, 21 - n_new]
    k, v = left_padded(k, v, lengths, leftpads)
    k_cache, v_cache, options = cache_in_layout(rng, k, v, page_size)
    o = kernels.flash_decode(q, k_cache, v_cache, cache_seqlens=lengths_tensor(lengths),
                             cache_leftpad=leftpad_tensor(leftpads), num_splits=num_splits, **options)
    assert not torch.isnan(o).any(), "a padding row leaked into the output"
    assert_close(o, expected(q, k, v, lengths, leftpads=leftpads),
                 what=f"cache_leftpad {leftpads}, {n_new} new tokens, {num_splits} splits, pages {page_size}")


@pytest.mark.parametrize("page_size", [16, 32])
def test_pages_wholly_inside_the_padding_need_no_page(rng, page_size):
    """A serving engine need not give a left-padded prompt pages for its padding: block-table entries of pages
    wholly before the first real key may hold -1, never read (the first tile's rows before it are masked)."""
    q, k, v = make(rng, 2, 4, 2, 2, 96, 16)
    lengths, leftpads = [90, 96], [70, 33]
    k, v = left_padded(k, v, lengths, leftpads)
    k_cache, v_cache, table = paged(k, v, page_size, rng)
    for b, pad in enumerate(leftpads):
        table[b, :pad // page_size] = -1
    o = kernels.flash_decode(q, k_cache, v_cache, cache_seqlens=lengths_tensor(lengths), block_table=table,
                             cache_leftpad=leftpad_tensor(leftpads), num_splits=2)
    assert_close(o, expected(q, k, v, lengths, leftpads=leftpads), what=f"padding pages -1, pages of {page_size}")
    with pytest.raises(ValueError, match=r"block_table\[1, 2\] = -1"):  # a page the padding only begins in
        table[1, 2] = -1
        kernels.flash_decode(q, k_cache, v_cache, cache_seqlens=lengths_tensor(lengths), block_table=table,
                             cache_leftpad=leftpad_tensor(leftpads))


@pytest.mark.parametrize("page_size", [None, 16])
def test_fp8_cache_with_left_padding(rng, page_size):
    """quantize_kv_cache takes cache_leftpad too: the NaN padding sets no scale (one rule for both layouts, the same
    scales), and decoding the FP8 cache is float64 on its dequantised values without the padding."""
    q, k, v = make(rng, 3, 4, 2, 2, 70, 16, torch.float16)
    lengths, leftpads = [70, 41, 33], [20, 0, 31]
    k, v = left_padded(k, v, lengths, leftpads)
    lengths_t, leftpads_t = lengths_tensor(lengths), leftpad_tensor(leftpads)
    k8, v8, k_scale, v_scale = kernels.quantize_kv_cache(k, v, cache_seqlens=lengths_t, cache_leftpad=leftpads_t)
    assert torch.isfinite(k_scale).all() and torch.isfinite(v_scale).all(), "the padding set a scale"
    cache = {"k_cache": k8, "v_cache": v8}
    if page_size is not None:
        kp, vp, table = paged(k, v, page_size, rng)
        table[0, 0] = -1  # sequence 0's first page is all padding: never looked up
        k8p, v8p, k_scale_p, v_scale_p = kernels.quantize_kv_cache(kp, vp, block_table=table, cache_seqlens=lengths_t,
                                                                   cache_leftpad=leftpads_t)
        assert torch.equal(k_scale_p, k_scale) and torch.equal(v_scale_p, v_scale)
        cache = {"k_cache": k8p, "v_cache": v8p, "block_table": table}
    o = kernels.flash_decode(q, **cache, k_scale=k_scale, v_scale=v_scale, cache_seqlens=lengths_t,
                             cache_leftpad=leftpads_t, num_splits=3)
    k_true, v_true = (x8.float() * scale[:, :, None, None] for x8, scale in ((k8, k_scale), (v8, v_scale)))
    assert_close(o, expected(q, k_true, v_true, lengths, leftpads=leftpads),
                 what=f"FP8 cache with cache_leftpad, pages {page_size}")


@pytest.mark.parametrize("page_size", [None, 16])
def test_quantize_refuses_a_left_padding_of_another_batch(rng, page_size):
    _, k, v = make(rng, 2, 2, 2, 1, 32, 16)
    options = {"cache_leftpad": leftpad_tensor([3])}
    if page_size is not None:
        k, v, options["block_table"] = paged(k, v, page_size, rng)
    with pytest.raises(ValueError, match=r"cache_leftpad has shape \(1,\): expected \(2,\), one"):
        kernels.quantize_kv_cache(k, v, **options)


@pytest.mark.parametrize("page_size", [None, 16])
def test_left_padding_with_whole_tiles_unmasked(rng, page_size):
    """mask_tail_only (the keys-adjacent V's switch): a contiguous split's whole tiles start at the padding's end
    and need no mask; a paged one's first tile may start inside the padding, so there every tile keeps its masks."""
    from flashcourse.kernels.decode import DecodeSwitches

    q, k, v = make(rng, 3, 4, 2, 1, 90, 16)
    lengths, leftpads = [90, 61, 40], [7, 33, 0]
    k, v = left_padded(k, v, lengths, leftpads)
    k_cache, v_cache, options = cache_in_layout(rng, k, v, page_size)
    o = kernels.flash_decode(q, k_cache, v_cache, cache_seqlens=lengths_tensor(lengths),
                             cache_leftpad=leftpad_tensor(leftpads), num_splits=2,
                             switches=DecodeSwitches(mask_tail_only=True), **options)
    assert_close(o, expected(q, k, v, lengths, leftpads=leftpads), what=f"whole tiles unmasked, pages {page_size}")


def test_a_zero_left_padding_is_the_call_without_one(rng):
    q, k, v = make(rng, 2, 4, 2, 3, 50, 40)
    lengths = lengths_tensor([50, 33])
    without = kernels.flash_decode(q, k, v, cache_seqlens=lengths, num_splits=2)
    with_zero = kernels.flash_decode(q, k, v, cache_seqlens=lengths, cache_leftpad=leftpad_tensor([0, 0]),
                                     num_splits=2)
    assert torch.equal(with_zero, without)


@pytest.mark.parametrize("page_size", [None, 16])
def test_left_padding_with_a_window_and_alibi(rng, page_size):
    """Positions stay those of the cache (flash-attn shifts both the keys and the diagonal by the padding, which
    cancels): the window and ALiBi measure from each token's own position, and the padding cuts the window."""
    q, k, v = make(rng, 3, 4, 2, 4, 64, 16)
    lengths, leftpads = [64, 30, 45], [50, 3, 0]
    k, v = left_padded(k, v, lengths, leftpads)
    slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625], device=DEVICE)
    k_cache, v_cache, options = cache_in_layout(rng, k, v, page_size)
    o = kernels.flash_decode(q, k_cache, v_cache, cache_seqlens=lengths_tensor(lengths), window=(20, 0),
                             alibi_slopes=slopes, cache_leftpad=leftpad_tensor(leftpads), num_splits=2, **options)
    assert_close(o, expected(q, k, v, lengths, window_left=20, alibi_slopes=slopes.cpu().numpy(), leftpads=leftpads),
                 what=f"cache_leftpad with a window and ALiBi, pages {page_size}")


def test_left_padding_without_lengths_and_with_one_token(rng):
    """No cache_seqlens: every sequence is N_max long; one new token, q (B, H_q, D)."""
    q, k, v = make(rng, 2, 4, 4, 1, 48, 16)
    leftpads = [47, 16]
    k, v = left_padded(k, v, [48, 48], leftpads)
    o = kernels.flash_decode(q[:, :, 0], k, v, cache_leftpad=leftpad_tensor(leftpads), num_splits=2)
    assert_close(o, expected(q, k, v, [48, 48], leftpads=leftpads)[:, :, 0], what="cache_leftpad, one token")


def test_a_padding_as_long_as_the_sequence_gives_zeros(rng):
    q, k, v = make(rng, 2, 2, 2, 3, 20, 16)
    o = kernels.flash_decode(q, k, v, cache_seqlens=[12, 20], cache_leftpad=leftpad_tensor([12, 4]))
    assert torch.all(o[0] == 0)
    assert_close(o, expected(q, k, v, [12, 20], leftpads=[12, 4]), what="a sequence that is all padding")


def test_the_kernel_clamps_a_padding_changed_after_its_check(rng, monkeypatch):
    """A plan reads the paddings' values once; later calls launch without reading them (as a kept plan on a GPU
    does, here with the check switched off): a padding below 0 is 0, one past the length leaves no key."""
    from flashcourse.kernels import _checks

    monkeypatch.setattr(_checks, "check_leftpad", lambda *args: None)
    q, k, v = make(rng, 3, 4, 2, 2, 40, 16)
    lengths = [40, 25, 30]
    o = kernels.flash_decode(q, k, v, cache_seqlens=lengths_tensor(lengths), cache_leftpad=leftpad_tensor([-5, 10, 99]),
                             num_splits=2)
    assert torch.all(o[2] == 0)
    assert_close(o, expected(q, k, v, lengths, leftpads=[0, 10, 30]), what="paddings clamped to 0 .. length")


@pytest.mark.parametrize(("leftpad", "error", "message"), [
    ([1, 2], TypeError, r"cache_leftpad is a list: expected a \(2,\) int32 tensor"),
    (torch.tensor([1, 2]), ValueError, r"cache_leftpad has shape \(2,\) and dtype torch.int64: expected \(2,\) int32"),
    (torch.tensor([1, 2, 3], dtype=torch.int32), ValueError, r"cache_leftpad has shape \(3,\)"),
    (torch.tensor([1, 2], dtype=torch.int32, device="meta"), ValueError, "cache_leftpad is on meta, q on"),
    (torch.tensor([-1, 2], dtype=torch.int32), ValueError,
     r"cache_leftpad\[0\] = -1 but cache_seqlens\[0\] = 20: the first real key must lie from 0 to the length"),
    (torch.tensor([0, 13], dtype=torch.int32), ValueError, r"cache_leftpad\[1\] = 13 but cache_seqlens\[1\] = 12"),
    (torch.tensor([0, 10], dtype=torch.int32), ValueError,
     r"cache_leftpad\[1\] = 10 leaves 2 keys of cache_seqlens\[1\] = 12, but q has n_new = 3 new tokens"),
], ids=["list", "int64", "shape", "device", "negative", "past-the-length", "over-the-new-tokens"])
def test_a_bad_left_padding_is_refused(rng, leftpad, error, message):
    q, k, v = make(rng, 2, 2, 2, 3, 20, 16)
    if isinstance(leftpad, torch.Tensor) and leftpad.device.type != "meta":
        leftpad = leftpad.to(DEVICE)
    with pytest.raises(error, match=message):
        kernels.flash_decode(q, k, v, cache_seqlens=[20, 12], cache_leftpad=leftpad)


def test_a_padding_past_the_cache_is_refused_without_lengths(rng):
    q, k, v = make(rng, 1, 2, 2, 1, 20, 16)
    with pytest.raises(ValueError, match=r"cache_leftpad\[0\] = 21 but cache_seqlens\[0\] = 20"):
        kernels.flash_decode(q, k, v, cache_leftpad=leftpad_tensor([21]))


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("n_new", [1, 5])
@pytest.mark.parametrize("page_size", [None, 16, 256])
def test_gpu_left_padding_real_sizes(rng, n_new, page_size, dtype):
    """Up to 5,000 keys, GQA 8:1, head dim 128, the default splits; paddings none, mid-page, most of the cache and
    all but the new tokens' keys, NaN in the padding."""
    q, k, v = make(rng, 4, 32, 4, n_new, 5000, 128, dtype)
    lengths = [5000, 1234, 4999, 300]
    leftpads = [0, 517, 4000, 300 - n_new]
    k, v = left_padded(k, v, lengths, leftpads)
    k_cache, v_cache, options = cache_in_layout(rng, k, v, page_size)
    for num_splits in (None, 1):
        o = kernels.flash_decode(q, k_cache, v_cache, cache_seqlens=lengths_tensor(lengths),
                                 cache_leftpad=leftpad_tensor(leftpads), num_splits=num_splits, **options)
        assert not torch.isnan(o).any(), "a padding row leaked into the output"
        assert_close(o, expected(q, k, v, lengths, leftpads=leftpads),
                     what=f"cache_leftpad on the GPU, {n_new} new tokens, pages {page_size}, splits {num_splits}")
    # The plan is kept on a GPU and checks no value again: the kernel reads each call's paddings itself.
    pads = leftpad_tensor(leftpads)
    kernels.flash_decode(q, k_cache, v_cache, cache_seqlens=lengths_tensor(lengths), cache_leftpad=pads, **options)
    later = [4000, 1000, 4500, 300 - n_new]  # each still past the NaN rows
    pads.copy_(leftpad_tensor(later))
    o = kernels.flash_decode(q, k_cache, v_cache, cache_seqlens=lengths_tensor(lengths), cache_leftpad=pads, **options)
    assert_close(o, expected(q, k, v, lengths, leftpads=later), what="paddings changed in place, the plan kept")


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("n_new", [1, 4, 17, 128])
@pytest.mark.parametrize("page_size", [None, 16, 256])
def test_gpu_new_tokens_real_sizes(rng, n_new, page_size, dtype):
    """Up to 5,000 keys, GQA 8:1 (a program's rows: 8 heads x n_new tokens, in tiles), the default splits."""
    q, k, v = make(rng, 3, 32, 4, n_new, 5000, 128, dtype)
    lengths = [5000, 1234, n_new]
    k_cache, v_cache, options = cache_in_layout(rng, k, v, page_size)
    o = kernels.flash_decode(q, k_cache, v_cache, cache_seqlens=lengths_tensor(lengths), **options)
    assert_close(o, expected(q, k, v, lengths), what=f"{n_new} new tokens on the GPU, pages {page_size}")


@pytest.mark.slow  # torch.compile's tracing: tens of seconds on a loaded CPU
@pytest.mark.parametrize("causal", [True, False])
def test_compiled_fullgraph_matches_eager(rng, causal):
    """Under torch.compile(fullgraph=True) the call is the flashcourse::decode op, with q's new-token axis and
    ``causal`` carried through."""
    import torch._dynamo

    torch._dynamo.reset()
    q, k, v = make(rng, 2, 4, 2, 5, 40, 16)
    lengths = lengths_tensor([40, 23])

    def decode(q, k, v, lengths):
        return kernels.flash_decode(q, k, v, cache_seqlens=lengths, causal=causal, num_splits=2)

    compiled = torch.compile(decode, backend="aot_eager", fullgraph=True)
    assert_close(compiled(q, k, v, lengths).cpu(), decode(q, k, v, lengths).cpu().numpy(),
                 what=f"compiled decode of 5 new tokens, causal={causal}")
