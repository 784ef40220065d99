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
