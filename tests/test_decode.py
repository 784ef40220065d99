"""Split-KV decoding against the float64 reference: contiguous and paged caches, GQA, uneven lengths."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from flashcourse import device  # noqa: E402

if not device.triton_available():
    pytest.skip("Triton is not installed here", allow_module_level=True)
from flashcourse import kernels, reference  # noqa: E402
from flashcourse.tolerance import assert_close  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def expected(q, k, v, lens):
    """Per sequence, per query head: reference attention over the first lens[b] keys of its KV head."""
    q, k, v = (t.detach().cpu().double().numpy() for t in (q, k, v))
    batch, h_q, d = q.shape
    group = h_q // k.shape[1]
    out = np.zeros((batch, h_q, d))
    for b in range(batch):
        kb = np.repeat(k[b, :, : lens[b]], group, axis=0)  # (H_q, L, D)
        vb = np.repeat(v[b, :, : lens[b]], group, axis=0)
        if lens[b] > 0:
            out[b] = reference.attention(q[b][:, None], kb, vb)[:, 0]
    return out


def paged(k, v, page_size, rng):
    """The cache cut into pages stored in shuffled order, and the block table that finds them."""
    batch, h_kv, n, d = k.shape
    pages = -(-n // page_size)
    perm = torch.tensor(rng.permutation(batch * pages), dtype=torch.int32)
    table = perm.reshape(batch, pages).to(k.device)

    def store(x):
        padded = torch.zeros(batch, h_kv, pages * page_size, d, dtype=x.dtype, device=x.device)
        padded[:, :, :n] = x
        blocks = padded.reshape(batch, h_kv, pages, page_size, d).permute(0, 2, 1, 3, 4).reshape(-1, h_kv, page_size, d)
        out = torch.empty_like(blocks)
        out[perm.long().to(x.device)] = blocks
        return out

    return store(k), store(v), table


def make(rng, batch, h_q, h_kv, n, d, dtype):
    arrays = [rng.standard_normal(s) for s in ((batch, h_q, d), (batch, h_kv, n, d), (batch, h_kv, n, d))]
    return [torch.tensor(a, dtype=dtype, device=DEVICE) for a in arrays]


@pytest.mark.parametrize("h_q,h_kv", [(4, 2), (4, 4), (8, 1)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_contiguous_cache_uneven_lengths(rng, h_q, h_kv, dtype):
    q, k, v = make(rng, 3, h_q, h_kv, 70, 64, dtype)
    lens = [1, 70, 33]
    o = kernels.flash_decode(q, k, v, cache_seqlens=torch.tensor(lens, dtype=torch.int32, device=DEVICE),
                             num_splits=3)
    assert o.shape == q.shape and o.dtype == dtype
    assert_close(o, expected(q, k, v, lens), what="decode output")


@pytest.mark.parametrize("page_size", [16, 32])
def test_paged_cache_shuffled_table(rng, page_size):
    q, k, v = make(rng, 3, 8, 2, 75, 80, torch.float16)
    lens = [75, 1, 40]
    kp, vp, table = paged(k, v, page_size, rng)
    o = kernels.flash_decode(q, kp, vp, block_table=table,
                             cache_seqlens=torch.tensor(lens, dtype=torch.int32, device=DEVICE))
    assert_close(o, expected(q, k, v, lens), what=f"paged decode output (page size {page_size})")


@pytest.mark.parametrize("num_splits", [1, 2, 5, 100])
def test_any_number_of_splits_gives_the_same_answer(rng, num_splits):
    """The combine step is the merge of lesson 02: how the keys are split must not matter."""
    q, k, v = make(rng, 1, 4, 2, 90, 32, torch.float32)
    o = kernels.flash_decode(q, k, v, num_splits=num_splits)
    assert_close(o, expected(q, k, v, [90]), what=f"decode with {num_splits} splits")


def test_split_outputs_combine_with_merge_partials(rng):
    """What the combine kernel computes, written with reference.merge_partials over two halves."""
    q, k, v = make(rng, 1, 2, 2, 50, 16, torch.float64)
    qn, kn, vn = q.numpy()[0][:, None], k.numpy()[0], v.numpy()[0]
    o1, lse1 = reference.attention_lse(qn, kn[:, :20], vn[:, :20])
    o2, lse2 = reference.attention_lse(qn, kn[:, 20:], vn[:, 20:])
    merged, _ = reference.merge_partials(o1, lse1, o2, lse2)
    o = kernels.flash_decode(q.float(), k.float(), v.float(), num_splits=2)
    assert_close(o, merged[:, 0][None], what="decode vs merge_partials of two splits")


def test_empty_sequence_gives_zero(rng):
    q, k, v = make(rng, 2, 2, 1, 16, 16, torch.float32)
    o = kernels.flash_decode(q, k, v, cache_seqlens=torch.tensor([0, 16], dtype=torch.int32, device=DEVICE))
    assert torch.all(o[0] == 0)


@pytest.mark.parametrize(
    "kwargs,error,words",
    [
        ({"q": (2, 3, 16)}, ValueError, "multiple of H_kv"),
        ({"q": (2, 4, 8), "kv": (2, 2, 10, 8)}, ValueError, "head dim 8"),
        ({"q": (3, 4, 16)}, ValueError, "batch"),
        ({"q": (2, 4, 1, 16)}, ValueError, r"\(B, H_q, D\)"),
    ],
)
def test_bad_inputs(rng, kwargs, error, words):
    q = torch.zeros(kwargs["q"], device=DEVICE)
    k = torch.zeros(kwargs.get("kv", (2, 2, 10, 16)), device=DEVICE)
    with pytest.raises(error, match=words):
        kernels.flash_decode(q, k, k.clone())


def test_bad_block_table_and_lengths(rng):
    q, k, v = make(rng, 2, 4, 2, 32, 16, torch.float32)
    with pytest.raises(ValueError, match="int32"):
        kernels.flash_decode(q, k, v, cache_seqlens=torch.tensor([1, 2], device=DEVICE))
    with pytest.raises(ValueError, match="int32"):
        kernels.flash_decode(q, k, v, block_table=torch.zeros(2, 3, dtype=torch.int64, device=DEVICE))


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("page_size", [None, 256])
def test_gpu_long_cache(rng, dtype, page_size):
    q, k, v = make(rng, 2, 32, 8, 20000, 128, dtype)
    lens = [20000, 12345]
    lens_t = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    if page_size is None:
        o = kernels.flash_decode(q, k, v, cache_seqlens=lens_t)
    else:
        kp, vp, table = paged(k, v, page_size, rng)
        o = kernels.flash_decode(q, kp, vp, block_table=table, cache_seqlens=lens_t)
    assert_close(o, expected(q, k, v, lens), what="decode at 20K keys")


# ------------------------------------------------------------------------------------------ variants (lesson 11)
def expected_variant(q, k, v, lens, *, window_left=None, softcap=None, slopes=None):
    """Float64 decode written from the rules: the new token at position L-1 sees keys max(0, L-1-left)..L-1,
    scores capped as softcap * tanh(s / softcap), then biased by -slope_h * (L - 1 - j)."""
    q, k, v = (t.detach().cpu().double().numpy() for t in (q, k, v))
    batch, h_q, d = q.shape
    group = h_q // k.shape[1]
    out = np.zeros((batch, h_q, d))
    for b in range(batch):
        n = lens[b]
        first = 0 if window_left is None else max(0, n - 1 - window_left)
        for h in range(h_q):
            keys, values = k[b, h // group, first:n], v[b, h // group, first:n]
            s = keys @ q[b, h] / np.sqrt(d)
            if softcap is not None:
                s = softcap * np.tanh(s / softcap)
            if slopes is not None:
                s = s - float(slopes[h]) * (n - 1 - np.arange(first, n))
            if n > first:
                p = np.exp(s - s.max())
                out[b, h] = p @ values / p.sum()
    return out


@pytest.mark.parametrize("paged_size", [None, 16])
def test_window_reads_only_the_window(rng, paged_size):
    """Keys before the window are NaN: a kernel that read them would return NaN (0 * NaN in P V)."""
    q, k, v = make(rng, 3, 4, 2, 90, 32, torch.float32)
    lens = [90, 7, 50]
    left = 20
    for b, n in enumerate(lens):
        k[b, :, : max(0, n - 1 - left)] = float("nan")
        v[b, :, : max(0, n - 1 - left)] = float("nan")
    lens_t = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    if paged_size is None:
        o = kernels.flash_decode(q, k, v, cache_seqlens=lens_t, window=(left, 0), num_splits=2)
    else:
        kp, vp, table = paged(k, v, paged_size, rng)
        o = kernels.flash_decode(q, kp, vp, block_table=table, cache_seqlens=lens_t, window=(left, 0))
    assert_close(o, expected_variant(q, k, v, lens, window_left=left), what=f"windowed decode (pages {paged_size})")


@pytest.mark.parametrize("num_splits", [1, 3])
def test_softcap_and_alibi(rng, num_splits):
    q, k, v = make(rng, 2, 4, 2, 70, 16, torch.float32)
    slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625], device=DEVICE)
    lens = [70, 33]
    o = kernels.flash_decode(q * 4, k, v, cache_seqlens=torch.tensor(lens, dtype=torch.int32, device=DEVICE),
                             softcap=2.0, alibi_slopes=slopes, window=(40, -1), num_splits=num_splits)
    want = expected_variant(q * 4, k, v, lens, window_left=40, softcap=2.0, slopes=slopes.cpu().numpy())
    assert_close(o, want, what=f"decode with softcap, ALiBi and a window ({num_splits} splits)")


@pytest.mark.parametrize(
    "options,error,words",
    [({"window": 8}, TypeError, "pair of ints"), ({"softcap": 0}, ValueError, "softcap is 0"),
     ({"alibi_slopes": torch.ones(2)}, ValueError, r"expected \(4,\) float32")],
)
def test_bad_variant_options(rng, options, error, words):
    q, k, v = make(rng, 1, 4, 2, 16, 16, torch.float32)
    options = {n: o.to(DEVICE) if isinstance(o, torch.Tensor) else o for n, o in options.items()}
    with pytest.raises(error, match=words):
        kernels.flash_decode(q, k, v, **options)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gpu_window_softcap_alibi(rng, dtype):
    q, k, v = make(rng, 2, 32, 8, 20000, 128, dtype)
    slopes = torch.tensor([2.0 ** (-8 * (h + 1) / 32) for h in range(32)], device=DEVICE)
    lens = [20000, 12345]
    o = kernels.flash_decode(q, k, v, cache_seqlens=torch.tensor(lens, dtype=torch.int32, device=DEVICE),
                             window=(4096, 0), softcap=30.0, alibi_slopes=slopes)
    want = expected_variant(q, k, v, lens, window_left=4096, softcap=30.0, slopes=slopes.cpu().numpy())
    assert_close(o, want, what="decode at 20K keys, window 4096, softcap 30, ALiBi")
