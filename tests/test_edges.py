"""The public options at their edges (no silent wrong answers): each case gives the float64 answer or a
clear error naming the argument. Every test of a case failed on the code before its fix (8e7e024), each in the way
the issue reproduced it (page 1000 killed the process), except the guards said to be such (softcap's gradients,
padding past a sequence's pages, the reference's mean of v), which hold what the fixes must keep. Decode's scale
rule is ``test_decode.py::test_scale_follows_the_attention_rule``, and its split test that could not fail is
``test_decode.py::test_split_outputs_combine_with_merge_partials``."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from flashcourse import device

device.setup()

from flashcourse import kernels, reference  # noqa: E402
from flashcourse.tolerance import assert_close  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def randn(rng, *shape, dtype=torch.float32):
    return torch.tensor(rng.standard_normal(shape), dtype=dtype, device=DEVICE)


def float64_attention(q, k, v, *, scale=None, softcap=None, mask=None):
    """(o, lse) in float64 with torch, differentiable: the spec the gradients are checked against."""
    q, k, v = (t.double() for t in (q, k, v))
    s = q @ k.transpose(-1, -2) * (q.shape[-1] ** -0.5 if scale is None else scale)
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(s, -1)
    return torch.softmax(s, -1) @ v, lse


def document_mask(ids):
    """(B, 1, N, N) visible where query and key carry the same id, compared exactly (int64)."""
    ids = ids.to(torch.int64)
    return (ids[:, :, None] == ids[:, None, :])[:, None]


# ------------------------------------------------------------------------------------------------- case 2
def test_block_mask_keeps_its_own_document_ids(rng):
    """A data loader that reuses its id buffer: the block mask answers with the ids it was built from, and a call
    that passes the changed buffer beside it is refused (it once ran with the old ids, error 1.67)."""
    q, k, v = (randn(rng, 1, 2, 64, 16) for _ in range(3))
    ids = torch.zeros(1, 64, dtype=torch.int32, device=DEVICE)
    ids[0, 30:] = 1
    built = ids.clone()
    bm = kernels.create_block_mask(None, None, None, 64, 64, document_ids=ids, BLOCK_SIZE=16)
    ids[0, 40:] = 2  # the loader writes the next batch into the same buffer
    o = kernels.flash_attention(q, k, v, block_mask=bm)
    expected, _ = float64_attention(q, k, v, mask=document_mask(built))
    assert_close(o, expected, what="a block mask's call after its caller changed the id buffer")
    with pytest.raises(ValueError, match="other document_ids"):
        kernels.flash_attention(q, k, v, block_mask=bm, document_ids=ids)


# ------------------------------------------------------------------------------------------------- case 3
@pytest.mark.parametrize("softcap", [1e6, 1e7, 1e9, 1e30])
def test_a_huge_softcap_is_no_cap(rng, softcap):
    """softcap * tanh(s / softcap) -> s as the cap grows: tanh must not cancel for small arguments (it gave
    errors 0.05 / 0.56 / 1.0 at 1e6 / 1e7 / 1e9)."""
    q, k, v = (randn(rng, 1, 2, 64, 16) for _ in range(3))
    q = q * 3.0  # scores of a few units: s / softcap from 1e-5 down to 1e-29
    o, lse = kernels.flash_attention_forward(q, k, v, softcap=softcap)
    expected, expected_lse = float64_attention(q, k, v, softcap=softcap)
    assert_close(o, expected, what=f"softcap={softcap:g} forward")
    assert_close(lse, expected_lse, what=f"softcap={softcap:g} lse")


def test_softcap_gradients_at_small_and_large_arguments(rng):
    """The backward's 1 - tanh^2 from the same tanh: a cap of 2 puts scores both near 0 and deep in the tails."""
    q, k, v = (randn(rng, 1, 2, 20, 16).mul(3.0).requires_grad_() for _ in range(3))
    o = kernels.flash_attention(q, k, v, softcap=2.0)
    do = randn(rng, *o.shape)
    grads = torch.autograd.grad(o, (q, k, v), do)
    expected, _ = float64_attention(q, k, v, softcap=2.0)
    want = torch.autograd.grad(expected, (q, k, v), do.double())
    for name, got, spec in zip("qkv", grads, want, strict=True):
        assert_close(got, spec, what=f"d{name} with softcap=2")


# ------------------------------------------------------------------------------------------------- case 4
@pytest.mark.parametrize("through_block_mask", [False, True])
def test_int64_document_ids_past_int32_are_compared_exactly(rng, through_block_mask):
    """Hash-like int64 ids: 7 and 7 + 2**32 are two documents (truncated to int32 they merged, error 0.97)."""
    q, k, v = (randn(rng, 1, 2, 48, 16) for _ in range(3))
    ids = torch.full((1, 48), 7, dtype=torch.int64, device=DEVICE)
    ids[0, 20:] = 7 + 2**32
    ids[0, 35:] = -(2**40)
    expected, _ = float64_attention(q, k, v, mask=document_mask(ids))
    if through_block_mask:
        bm = kernels.create_block_mask(None, None, None, 48, 48, document_ids=ids, BLOCK_SIZE=16)
        o = kernels.flash_attention(q, k, v, block_mask=bm, document_ids=ids)
    else:
        o = kernels.flash_attention(q, k, v, document_ids=ids)
    assert_close(o, expected, what="int64 document ids past int32")


# ------------------------------------------------------------------------------------------------- case 5
@pytest.mark.parametrize("causal", [False, True])
def test_the_returned_lse_is_differentiable(rng, causal):
    """A loss that uses the LSE backpropagates its term (FlexAttention's LSE is differentiable; the course's once
    dropped it, dq error 0.70): delta = rowsum(dO * O) - dLSE in the backward's preprocess."""
    q, k, v = (randn(rng, 1, 2, 19, 16).requires_grad_() for _ in range(3))
    o, lse = kernels.flash_attention(q, k, v, causal=causal, return_lse=True)
    do, dlse = randn(rng, *o.shape), randn(rng, *lse.shape)
    grads = torch.autograd.grad((o, lse), (q, k, v), (do, dlse))
    mask = torch.ones(19, 19, dtype=torch.bool, device=DEVICE).tril() if causal else None
    expected, expected_lse = float64_attention(q, k, v, mask=mask)
    want = torch.autograd.grad((expected, expected_lse), (q, k, v), (do.double(), dlse.double()),
                               retain_graph=True)
    for name, got, spec in zip("qkv", grads, want, strict=True):
        assert_close(got, spec, what=f"d{name} of a loss on o and lse")
    # Only the lse in the loss: o's gradient is None, and the lse's term alone flows.
    o, lse = kernels.flash_attention(q, k, v, causal=causal, return_lse=True)
    (dq,) = torch.autograd.grad(lse, (q,), dlse)
    (want_dq,) = torch.autograd.grad(expected_lse, (q,), dlse.double())
    assert_close(dq, want_dq, what="dq of a loss on lse alone")


# ------------------------------------------------------------------------------------------------- case 6
def test_double_backward_raises(rng):
    """A backward with create_graph=True is refused at once: its gradients have no gradients of their own (they
    once came out wrong, dq error 1.54, and without grad they would silently count as constants)."""
    q, k, v = (randn(rng, 1, 2, 8, 16).requires_grad_() for _ in range(3))
    o = kernels.flash_attention(q, k, v)
    with pytest.raises(RuntimeError, match="no double backward.*create_graph=True"):
        torch.autograd.grad(o.sum(), (q,), create_graph=True)


# ------------------------------------------------------------------------------------------------- case 7
@pytest.mark.parametrize("decode", [False, True])
def test_finite_scores_far_below_minus_1e30_are_keys(rng, decode):
    """Every score about -4e30, finite: the softmax is uniform and o is the mean of v (a -1e30 starting max once
    took such rows for rows with no key: o = 0, lse = -inf)."""
    d = 16
    q = torch.full((1, 2, 1 if decode else 5, d), 1e15, device=DEVICE)
    k = torch.full((1, 2, 12, d), -1e15, device=DEVICE)
    v = randn(rng, 1, 2, 12, d)
    if decode:
        o = kernels.flash_decode(q[:, :, 0], k, v, scale=0.25)[:, :, None]
    else:
        o, lse = kernels.flash_attention_forward(q, k, v, scale=0.25)
        assert torch.isfinite(lse).all(), "a row with keys has a finite lse"
    assert_close(o, v.double().mean(2, keepdim=True).expand(o.shape), what="scores near -4e30")


# ------------------------------------------------------------------------------------------------- case 8
def paged_cache(rng, batch=2, h_kv=2, pages_per_row=3, page=16, d=16):
    pages = batch * pages_per_row
    k, v = (randn(rng, pages, h_kv, page, d) for _ in range(2))
    table = torch.arange(pages, dtype=torch.int32, device=DEVICE).reshape(batch, pages_per_row)
    return k, v, table


@pytest.mark.parametrize("page", [6, -1, 1000])
def test_block_table_pages_outside_the_cache_are_refused(rng, page):
    """A page past the cache gave NaN, -1 garbage up to 4e31, 1000 killed the process."""
    k, v, table = paged_cache(rng)
    q = randn(rng, 2, 4, 16)
    table[1, 1] = page
    with pytest.raises(ValueError, match=rf"block_table\[1, 1\] = {page}: expected a page from 0 to 5"):
        kernels.flash_decode(q, k, v, block_table=table)


def test_block_table_entries_past_a_sequence_are_not_read(rng):
    """Only the pages a sequence's length reaches are checked: padding past it (-1, as some servers write) is
    never read, and the answer is the float64 one."""
    k, v, table = paged_cache(rng)
    q = randn(rng, 2, 4, 16)
    table[0, 2] = -1
    o = kernels.flash_decode(q, k, v, block_table=table, cache_seqlens=[20, 48])
    full = kernels.flash_decode(q, k, v, block_table=table.abs(), cache_seqlens=[20, 48])
    assert_close(o, full.double(), what="decode with padding past a sequence's pages")


def test_cache_seqlens_as_an_int(rng):
    """One length for every sequence, as flash-attn takes it (it raised AttributeError)."""
    q, k, v = randn(rng, 2, 4, 16), randn(rng, 2, 2, 40, 16), randn(rng, 2, 2, 40, 16)
    o = kernels.flash_decode(q, k, v, cache_seqlens=17)
    assert_close(o, kernels.flash_decode(q, k, v, cache_seqlens=[17, 17]).double(), what="cache_seqlens=17")
    with pytest.raises(ValueError, match=r"cache_seqlens\[0\] = 41"):
        kernels.flash_decode(q, k, v, cache_seqlens=41)
    with pytest.raises(ValueError, match=r"cache_seqlens\[1\] = 1099511627776"):  # past int32: no overflow error
        kernels.flash_decode(q, k, v, cache_seqlens=[3, 2**40])


def test_no_kv_heads_is_a_clear_error(rng):
    """H_kv = 0 (it raised ZeroDivisionError)."""
    q, k = randn(rng, 2, 4, 16), randn(rng, 2, 0, 40, 16)
    with pytest.raises(ValueError, match=r"H_kv = 0 \(k_cache.shape\[1\]\)"):
        kernels.flash_decode(q, k, k)


@pytest.mark.parametrize("num_splits", [0, -2, 1.5, True])
def test_num_splits_must_be_a_positive_int(rng, num_splits):
    q, k, v = randn(rng, 1, 2, 16), randn(rng, 1, 2, 40, 16), randn(rng, 1, 2, 40, 16)
    with pytest.raises(ValueError, match="num_splits is"):
        kernels.flash_decode(q, k, v, num_splits=num_splits)


# ------------------------------------------------------------------------------------------------- case 9
def test_a_plan_cache_hit_never_skips_a_check(rng):
    """A meta-tensor call after a CPU call of the same layout: the same clear error a first call gets (the key
    once took both devices for one, and the meta call died inside the launch)."""
    if DEVICE != "cpu":
        pytest.skip("the CPU and meta devices share get_device() == -1; on a GPU machine CPU tensors are refused")
    q = randn(rng, 1, 2, 8, 16)
    kernels.flash_attention(q, q, q)
    meta = q.to("meta")
    with pytest.raises(ValueError, match="q is on meta"):
        kernels.flash_attention(meta, meta, meta)


@pytest.mark.parametrize("bad", [{"scale": True}, {"enable_gqa": 1}])
def test_a_value_equal_to_a_kept_one_is_still_checked(rng, bad):
    """True == 1 == 1.0 as dictionary keys: a bool scale (or an int enable_gqa) after a valid call with 1.0 (or
    True) must be refused as on a first call."""
    q = randn(rng, 1, 2, 8, 16)
    kernels.flash_attention(q, q, q, scale=1.0, enable_gqa=True)
    with pytest.raises(TypeError, match="scale is True|enable_gqa is 1"):
        kernels.flash_attention(q, q, q, **{"scale": 1.0, "enable_gqa": True, **bad})


@pytest.mark.parametrize(("options", "keyable"), [
    ((0.25, 2, (8, 0), 30.0), True), ((None, None, None, None), True), ((True, None, None, None), False),
    ((None, True, None, None), False), ((None, None, None, True), False), ((None, None, (8.0, 0), None), False),
    ((None, None, (8, False), None), False),
])
def test_decode_keeps_no_plan_for_options_equal_to_valid_ones(options, keyable):
    """Decode's key holds its options as given (plans are kept on a GPU): True == 1 == 1.0, so a bool or a float
    window must not find the plan of a valid call (they are refused in full instead)."""
    from flashcourse.kernels.call import _describable_decode

    assert _describable_decode(options + (None, None, None, None)) is keyable


def test_reference_agrees_on_the_mean_of_v():
    """The float64 spec itself gives the mean of v for equal scores (what case 7's test compares with)."""
    q = np.full((1, 4), 1e15)
    k = np.full((6, 4), -1e15)
    v = np.arange(24.0).reshape(6, 4)
    assert np.allclose(reference.attention(q, k, v, scale=0.25), v.mean(0))


# ------------------------------------------------------------------------------------------------- any head dim
AWKWARD_HEAD_DIMS = (8, 40, 59, 72, 111, 160, 192, 224)


@pytest.mark.parametrize("head_dim", AWKWARD_HEAD_DIMS)
def test_any_head_dim_from_8_to_256(rng, head_dim):
    """flash-attn's range: forward, gradients (causal and not) and decode against float64 at
    head dims no power of two, tiled at the next power of two and masked; the scale is the true D's."""
    for causal in (False, True):
        q, k, v = (randn(rng, 1, 2, 19, head_dim).requires_grad_() for _ in range(3))
        o = kernels.flash_attention(q, k, v, causal=causal)
        do = randn(rng, *o.shape)
        grads = torch.autograd.grad(o, (q, k, v), do)
        mask = torch.ones(19, 19, dtype=torch.bool, device=DEVICE).tril() if causal else None
        expected, _ = float64_attention(q, k, v, mask=mask)
        want = torch.autograd.grad(expected, (q, k, v), do.double())
        assert_close(o, expected, what=f"D = {head_dim}, causal={causal} forward")
        for name, got, spec in zip("qkv", grads, want, strict=True):
            assert_close(got, spec, what=f"D = {head_dim}, causal={causal} d{name}")
    q, k, v = randn(rng, 2, 4, head_dim), randn(rng, 2, 2, 40, head_dim), randn(rng, 2, 2, 40, head_dim)
    o = kernels.flash_decode(q, k, v, cache_seqlens=[40, 13], num_splits=2)
    for b, n in enumerate((40, 13)):
        expected, _ = float64_attention(q[b, :, None], k[b].repeat_interleave(2, 0)[:, :n],
                                        v[b].repeat_interleave(2, 0)[:, :n])
        assert_close(o[b], expected[:, 0], what=f"D = {head_dim} decode, sequence {b}")


@pytest.mark.parametrize("head_dim", [4, 7, 257, 320])
def test_head_dims_outside_8_to_256_are_refused(rng, head_dim):
    """A ValueError naming the range (flash-attn raises a RuntimeError there; the course keeps ValueError for
    every bound on an argument, as its other checks)."""
    q = randn(rng, 1, 2, 4, head_dim)
    with pytest.raises(ValueError, match=f"head dim {head_dim} is not supported: expected 8 to 256"):
        kernels.flash_attention(q, q, q)
    with pytest.raises(ValueError, match=f"head dim {head_dim} is not supported: expected 8 to 256"):
        kernels.flash_decode(q[:, :, 0], q, q)


def test_any_head_dim_needs_no_new_launch_shape():
    """The launch fit (scripts/launch_fit.py) compiles the head dims of SUPPORTED_HEAD_DIMS for every GPU. The
    launches of any other head dim are theirs: every launch choice reads the head dim only as its tile, the next
    power of two >= 16, and every D in 8 .. 256 tiles as one of the supported dims does."""
    from flashcourse.kernels._checks import SUPPORTED_HEAD_DIMS, padded_head_dim

    fitted = {padded_head_dim(d) for d in SUPPORTED_HEAD_DIMS}
    assert {padded_head_dim(d) for d in range(8, 257)} == fitted == {16, 32, 64, 128, 256}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("head_dim", AWKWARD_HEAD_DIMS)
def test_gpu_any_head_dim(rng, head_dim, dtype):
    """The same on the GPU in 16-bit, N = 200 and 1 (the TMA path where rows are 16-byte aligned, pointers
    elsewhere), causal and not, forward, gradients and decode."""
    for n in (200, 1):
        for causal in (False, True):
            q, k, v = (randn(rng, 2, 4, n, head_dim, dtype=dtype).requires_grad_() for _ in range(3))
            o = kernels.flash_attention(q, k, v, causal=causal)
            do = randn(rng, *o.shape, dtype=dtype)
            grads = torch.autograd.grad(o, (q, k, v), do)
            mask = torch.ones(n, n, dtype=torch.bool, device=DEVICE).tril() if causal else None
            expected, _ = float64_attention(q, k, v, mask=mask)
            want = torch.autograd.grad(expected, (q, k, v), do.double())
            assert_close(o, expected, what=f"D = {head_dim}, N = {n}, causal={causal}, {dtype} forward")
            for name, got, spec in zip("qkv", grads, want, strict=True):
                assert_close(got, spec, what=f"D = {head_dim}, N = {n}, causal={causal}, {dtype} d{name}")
    q, k, v = (randn(rng, 2, 8, head_dim, dtype=dtype), randn(rng, 2, 2, 700, head_dim, dtype=dtype),
               randn(rng, 2, 2, 700, head_dim, dtype=dtype))
    o = kernels.flash_decode(q, k, v, cache_seqlens=[700, 333])
    for b, n in enumerate((700, 333)):
        expected, _ = float64_attention(q[b, :, None], k[b].repeat_interleave(4, 0)[:, :n],
                                        v[b].repeat_interleave(4, 0)[:, :n])
        assert_close(o[b], expected[:, 0], what=f"D = {head_dim}, {dtype} decode, sequence {b}")


# ------------------------------------------------------------------------------------------------- cu_seqlens
@pytest.mark.parametrize("causal", [False, True])
def test_cu_seqlens_is_flash_attns_spelling_of_packed_sequences(rng, causal):
    """flash-attn's varlen convention: three sequences of 5, 0 and 14 tokens packed in one row of 19, each seeing
    only itself (causal inside itself), forward and gradients against float64."""
    q, k, v = (randn(rng, 1, 2, 19, 16).requires_grad_() for _ in range(3))
    cu = torch.tensor([0, 5, 5, 19], dtype=torch.int32, device=DEVICE)
    o = kernels.flash_attention(q, k, v, causal=causal, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=14,
                                max_seqlen_k=14)
    ids = torch.tensor([[0] * 5 + [2] * 14], device=DEVICE)
    mask = document_mask(ids)
    if causal:
        mask = mask & torch.ones(19, 19, dtype=torch.bool, device=DEVICE).tril()
    expected, _ = float64_attention(q, k, v, mask=mask)
    assert_close(o, expected, what=f"cu_seqlens, causal={causal}")
    do = randn(rng, *o.shape)
    grads = torch.autograd.grad(o, (q, k, v), do)
    want = torch.autograd.grad(expected, (q, k, v), do.double())
    for name, got, spec in zip("qkv", grads, want, strict=True):
        assert_close(got, spec, what=f"d{name} with cu_seqlens, causal={causal}")


def test_cu_seqlens_refuses_what_it_cannot_express(rng):
    q = randn(rng, 1, 2, 19, 16)
    cu = torch.tensor([0, 5, 19], dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match="cross-attention lengths"):
        kernels.flash_attention(q, q, q, cu_seqlens_q=cu, cu_seqlens_k=torch.tensor([0, 9, 19], dtype=torch.int32,
                                                                                     device=DEVICE))
    with pytest.raises(ValueError, match="two spellings"):
        kernels.flash_attention(q, q, q, cu_seqlens_q=cu, document_ids=torch.zeros(1, 19, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"expected a \(number of sequences \+ 1,\) int32"):
        kernels.flash_attention(q, q, q, cu_seqlens_q=cu.long())
    with pytest.raises(ValueError, match="max_seqlen_q is 20"):
        kernels.flash_attention(q, q, q, cu_seqlens_q=cu, max_seqlen_q=20)
    with pytest.raises(ValueError, match=r"packed along one row"):
        kernels.flash_attention(q.expand(2, -1, -1, -1), q.expand(2, -1, -1, -1), q.expand(2, -1, -1, -1),
                                cu_seqlens_q=cu)


# ------------------------------------------------------------------------------------------------- third search
# Each case below was found by the third search at the API's edges and failed on the code before its fix (the
# commit that adds it says how).
def window_mask(n_q, n_kv, left, right, shift):
    """(N_q, N_kv) visible where c - left <= j <= c + right, c = i + shift; -1 leaves a side unbounded. In Python
    ints, which hold any side exactly."""
    return torch.tensor([[(left < 0 or j >= i + shift - left) and (right < 0 or j <= i + shift + right)
                          for j in range(n_kv)] for i in range(n_q)], device=DEVICE)


@pytest.mark.parametrize(("window", "n_q", "n_kv", "causal"), [
    ((2**31 - 1, 0), 19, 23, False), ((2**31, 0), 19, 23, False), ((2**31, 0), 19, 19, True),
    ((0, 2**31), 23, 19, False), ((2**70, 2**70), 19, 23, False),
])
def test_a_window_side_past_int32_is_unbounded(rng, window, n_q, n_kv, causal):
    """A side larger than the sequence reaches every key: the answer of no bound on that side. The kernels add
    the bounds to row and key indices in 32 bits, and a side near 2**31 wrapped (dK error 0.71, dV 1.1 at
    (2**31 - 1, 0); the forward 3.1 at (0, 2**31) with N_q > N_k); 2**70 raised an OverflowError."""
    q = randn(rng, 1, 2, n_q, 16).requires_grad_()
    k, v = (randn(rng, 1, 2, n_kv, 16).requires_grad_() for _ in range(2))
    o = kernels.flash_attention(q, k, v, window=window, causal=causal)
    do = randn(rng, *o.shape)
    grads = torch.autograd.grad(o, (q, k, v), do)
    left, right = window
    mask = window_mask(n_q, n_kv, left, 0 if causal else right, 0 if causal else n_kv - n_q)
    expected, _ = float64_attention(q, k, v, mask=mask)
    want = torch.autograd.grad(expected, (q, k, v), do.double())
    assert_close(o, expected, what=f"window={window} forward")
    for name, got, spec in zip("qkv", grads, want, strict=True):
        assert_close(got, spec, what=f"d{name} with window={window}")


@pytest.mark.parametrize("window", [(2**70, 0), (40, 0)])
def test_a_decode_window_past_the_cache_is_the_whole_cache(rng, window):
    """Decode's window reaches back from each new token: a side past the cache holds every key (2**70 raised an
    OverflowError inside the launch; 40, the cache's length, is a guard on the edge of the rule)."""
    q, k, v = randn(rng, 2, 4, 16), randn(rng, 2, 2, 40, 16), randn(rng, 2, 2, 40, 16)
    o = kernels.flash_decode(q, k, v, window=window, cache_seqlens=[40, 13], num_splits=2)
    assert_close(o, kernels.flash_decode(q, k, v, cache_seqlens=[40, 13]).double(), what=f"decode window={window}")


@pytest.mark.parametrize("decode", [False, True])
def test_a_softcap_outside_float32s_range_is_refused(rng, decode):
    """The kernels hold the cap as softcap * log2(e) in float32: past 2.35e38 it is inf, and every score became
    NaN (softcap=2.4e38 and 1e300); 1e-300 is 0 there, and a score of 0 became 0 / 0 = NaN. Caps outside 1e-30 ..
    1e30 are refused with the fix; 1e30 still runs and is no cap (test_a_huge_softcap_is_no_cap), and 1e-30
    gives uniform weights, the float64 answer, for a query of zeros as for any other."""
    q, k, v = randn(rng, 1, 2, 8, 16), randn(rng, 1, 2, 8, 16), randn(rng, 1, 2, 8, 16)
    q[:, :, 0] = 0.0  # scores of exactly 0
    run = ((lambda c: kernels.flash_decode(q[:, :, 0], k, v, softcap=c)[:, :, None]) if decode
           else (lambda c: kernels.flash_attention(q, k, v, softcap=c)))
    for cap in (2.4e38, 1e300, 1.01e30):
        with pytest.raises(ValueError, match=r"softcap is .*: expected at most 1e\+30.*pass None"):
            run(cap)
    for cap in (1e-300, 0.99e-30):
        with pytest.raises(ValueError, match=r"softcap is .*: expected at least 1e-30.*uniform weights"):
            run(cap)
    assert torch.isfinite(run(1e30)).all()
    o = run(1e-30)
    assert_close(o, v.double().mean(2, keepdim=True).expand(o.shape), what="softcap=1e-30: uniform weights")


@pytest.mark.parametrize("through_block_mask", [False, True])
def test_int64_document_ids_of_any_layout(rng, through_block_mask):
    """int64 ids taken from a (N, B) buffer, a transposed view: their ranks came out laid out as the view, which
    the kernels read as rows of unit stride (error 1.67); int32 ids were made contiguous already."""
    q, k, v = (randn(rng, 3, 2, 40, 16) for _ in range(3))
    ids = torch.zeros(40, 3, dtype=torch.int64, device=DEVICE)
    ids[17:] = 2**40
    ids[30:, 1] = 5
    ids = ids.T  # (3, 40), strides (1, 3)
    if through_block_mask:
        bm = kernels.create_block_mask(None, None, None, 40, 40, document_ids=ids, BLOCK_SIZE=16)
        o = kernels.flash_attention(q, k, v, block_mask=bm)
    else:
        o = kernels.flash_attention(q, k, v, document_ids=ids)
    expected, _ = float64_attention(q, k, v, mask=document_mask(ids))
    assert_close(o, expected, what="transposed int64 document ids")


@pytest.mark.parametrize("scale", [0.0, -0.125, float("nan"), "0.1"])
def test_the_fp8_forward_checks_the_scale_as_every_entry_point(scale):
    """The FP8 forward passed any scale to its kernel (0 and negatives gave NaN there): the same rule as attention
    and decode, checked before the device is asked, so it shows on a CPU too."""
    q8 = torch.zeros(1, 2, 16, 64, dtype=torch.float8_e4m3fn, device=DEVICE)
    with pytest.raises((ValueError, TypeError), match="scale is"):
        kernels.flash_attention_forward(q8, q8, q8, scale=scale)


@pytest.mark.parametrize("lengths", [[True, 13], True, [np.True_, 13]])
def test_cache_seqlens_refuses_bools(rng, lengths):
    """True is a length of 1 to operator.index: a mask passed as lengths ran as one key (error 2.56)."""
    q, k = randn(rng, 2, 4, 16), randn(rng, 2, 2, 40, 16)
    with pytest.raises(TypeError, match="cache_seqlens is"):
        kernels.flash_decode(q, k, k, cache_seqlens=lengths)


@pytest.mark.parametrize(("option", "value"), [("num_warps", 0), ("num_warps", 1.5), ("num_stages", 0),
                                               ("num_stages", 1.5), ("num_stages", True)])
def test_decode_launch_overrides_are_checked(rng, option, value):
    """num_warps=0 and num_stages=0 silently meant "chosen per call", num_stages=1.5 reached Triton, and
    num_warps=1.5 raised a TypeError about '&': each is now a ValueError naming the option, as num_splits is."""
    q, k = randn(rng, 1, 2, 16), randn(rng, 1, 2, 40, 16)
    with pytest.raises(ValueError, match=f"{option} is"):
        kernels.flash_decode(q, k, k, **{option: value})


@pytest.mark.parametrize("needs_grad", ["q", "k_cache"])
def test_decode_refuses_inputs_that_need_gradients(rng, needs_grad):
    """flash_decode has no backward: with q (or the cache) requiring grad, its output came back detached, so a
    loss that used it silently lost that term's gradient. Refused, naming torch.no_grad(); under no_grad it runs."""
    tensors = {"q": randn(rng, 2, 4, 16), "k_cache": randn(rng, 2, 2, 40, 16), "v_cache": randn(rng, 2, 2, 40, 16)}
    tensors[needs_grad].requires_grad_()
    with pytest.raises(RuntimeError, match=f"{needs_grad} requires grad.*torch.no_grad"):
        kernels.flash_decode(tensors["q"], tensors["k_cache"], tensors["v_cache"])
    with torch.no_grad():
        o = kernels.flash_decode(tensors["q"], tensors["k_cache"], tensors["v_cache"])
    assert_close(o, kernels.flash_decode(*(t.detach() for t in tensors.values())).double(), what="decode, no_grad")


@pytest.mark.parametrize("decode", [False, True])
def test_alibi_slopes_that_need_gradients_are_refused(rng, decode):
    """The kernels take the slopes as constants (flash-attn too): learnable slopes got no gradient, without a
    word (loss.backward() left slopes.grad None). Refused, naming .detach()."""
    slopes = torch.tensor([0.5, 0.25], device=DEVICE, requires_grad=True)
    q = randn(rng, 1, 2, 8, 16).requires_grad_()
    with pytest.raises(ValueError, match=r"alibi_slopes requires grad.*alibi_slopes\.detach\(\)"):
        if decode:  # decode has no gradients at all: only the slopes need one here
            kernels.flash_decode(q[:, :, 0].detach(), q.detach(), q.detach(), alibi_slopes=slopes)
        else:
            kernels.flash_attention(q, q, q, alibi_slopes=slopes)


@pytest.mark.parametrize(("option", "value"), [
    ("scale", np.float32(0.2)), ("scale", np.int64(2)), ("scale", torch.tensor(0.2)), ("softcap", np.float32(5.0)),
    ("dropout_p", np.float32(0.1)), ("max_seqlen_q", np.int64(19)),
])
def test_a_number_of_another_library_is_told_how_to_pass(rng, option, value):
    """np.float32(0.2) is a number, and "expected a number" (what the error said) did not say what was wrong:
    the error now names the type and the fix, float(...) or int(...)."""
    q = randn(rng, 1, 2, 19, 16)
    varlen = {"cu_seqlens_q": torch.tensor([0, 19], dtype=torch.int32, device=DEVICE)} if "seqlen" in option else {}
    fix = rf"not a Python number: pass (float|int)\({option}\)"
    with pytest.raises((TypeError, ValueError), match=rf"{option} is .*{fix}"):
        kernels.flash_attention(q, q, q, **{option: value}, **varlen)


def test_no_kv_heads_in_attention_is_a_clear_error(rng):
    """k with 0 heads: the error said "H_q must be a multiple of H_kv", which 0 heads of q are; it now names
    H_kv = 0, as decode's does."""
    q, k = randn(rng, 1, 0, 8, 16), randn(rng, 1, 0, 8, 16)
    with pytest.raises(ValueError, match=r"k has H_kv = 0 heads"):
        kernels.flash_attention(q, k, k)


@pytest.mark.parametrize("return_lse", ["no", 1, None])
def test_return_lse_is_a_bool(rng, return_lse):
    """return_lse="no" returned (o, lse) (its truth), 1 too: a bool, as SDPA's flags, or a TypeError."""
    q = randn(rng, 1, 2, 8, 16)
    with pytest.raises(TypeError, match="return_lse is"):
        kernels.flash_attention(q, q, q, return_lse=return_lse)


def test_max_seqlen_without_cu_seqlens_is_refused(rng):
    """max_seqlen_q sizes flash-attn's varlen grid and means nothing without cu_seqlens_q: it was ignored without
    a word, whatever its value."""
    q = randn(rng, 1, 2, 8, 16)
    for name in ("max_seqlen_q", "max_seqlen_k"):
        with pytest.raises(ValueError, match=f"{name} is given without cu_seqlens"):
            kernels.flash_attention(q, q, q, **{name: -5})


@pytest.mark.parametrize("causal", ["yes", 1, "bottom_left"])
def test_ring_attention_checks_causal_as_the_kernels_do(rng, causal):
    """ring_attention took any truthy causal for True ("yes", 1), where ulysses_attention and the kernels refuse
    them; checked before the process group is asked, so no group is needed here."""
    from flashcourse import distributed

    q = randn(rng, 1, 2, 8, 16)
    with pytest.raises((TypeError, ValueError), match="causal is"):
        distributed.ring_attention(q, q, q, causal=causal)


def test_dropout_mask_names_the_shape_it_takes():
    """A (H, N_q, N_k) shape raised "not enough values to unpack (expected 4, got 3)"."""
    with pytest.raises(ValueError, match=r"shape is \(1, 4, 4\): expected \(B, H_q, N_q, N_k\)"):
        kernels.dropout_mask(5, (1, 4, 4), 0.3)


def test_a_window_side_past_int64_is_unbounded_in_the_reference_too():
    """The reference (and the ops' int64 schema under torch.compile) held a side in int64: (2**70, 0) raised
    "Python int too large to convert to C long". A side that large reaches past any sequence: unbounded, -1."""
    q, k = np.ones((5, 8)), np.arange(56.0).reshape(7, 8) / 50
    assert np.array_equal(reference.attention(q, k, k, window=(2**70, 2**64)), reference.attention(q, k, k))
    assert np.array_equal(reference.attention(q, k, k, window=(2**70, 0), causal=True),
                          reference.attention(q, k, k, causal=True))


@pytest.mark.parametrize("right", [0, 1])
def test_decode_refuses_a_right_window_side_it_would_drop(rng, right):
    """Several new tokens with causal=False: the kernel bounds a token's keys on the right only causally, so a
    window's right side was dropped (error 1.31 at (5, 0), 0.60 at (5, 1)). Refused where it would hide a key
    (right < n_new - 1; right = 0 is causal=True, which the error names); from n_new - 1 on it hides none and runs."""
    q, k, v = randn(rng, 2, 4, 3, 16), randn(rng, 2, 2, 40, 16), randn(rng, 2, 2, 40, 16)
    with pytest.raises(ValueError, match=rf"window = \(5, {right}\) with causal=False.*causal=True"):
        kernels.flash_decode(q, k, v, window=(5, right), causal=False, cache_seqlens=[40, 13])
    o = kernels.flash_decode(q, k, v, window=(5, 2), causal=False, cache_seqlens=[40, 13], num_splits=2)
    want = kernels.flash_decode(q, k, v, window=(5, -1), causal=False, cache_seqlens=[40, 13])
    assert_close(o, want.double(), what="window (5, 2) over 3 new tokens: the right side hides no key")
