"""More of the public API at its edges, found by probing every option on the CPU after ``test_edges.py``'s fixes:
each case gives the float64 answer or a clear error naming the argument, and each test failed on the code before
its fix (116eaf4), in the way the probe found it, except the guard at scale's lower bound, which holds what the new
bound must keep."""

from __future__ import annotations

import pytest
import torch

from flashcourse import device

device.setup()

import triton  # noqa: E402
import triton.language as tl  # noqa: E402, F401  (in scope of the mask_mods below, as the interpreter runs them)
from test_edges import DEVICE, float64_attention, paged_cache, randn  # noqa: E402

from flashcourse import kernels  # noqa: E402
from flashcourse.tolerance import assert_close  # noqa: E402


def decode_float64(q, k, v, lengths):
    """One new token per sequence over the first ``lengths[b]`` rows of a contiguous (B, H_kv, N, D) cache."""
    group = q.shape[1] // k.shape[1]
    o = torch.zeros(q.shape, dtype=torch.float64, device=q.device)
    for b, n in enumerate(lengths):
        keys, values = (t[b, :, :n].double().repeat_interleave(group, 0) for t in (k, v))
        weights = torch.softmax(torch.einsum("hd,hnd->hn", q[b].double(), keys) * q.shape[-1] ** -0.5, -1)
        o[b] = torch.einsum("hn,hnd->hd", weights, values)
    return o


def contiguous_from_pages(k, table):
    """A paged cache (pages, H_kv, page, D) read through ``table`` (B, pages per row) as (B, H_kv, N, D)."""
    rows = k[table.long()]  # (B, pages per row, H_kv, page, D)
    return rows.permute(0, 2, 1, 3, 4).reshape(table.shape[0], k.shape[1], -1, k.shape[3])


# ---------------------------------------------------------------------------------------- decode's lengths
@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("layout", ["strided", "expanded"])
def test_lengths_are_read_by_value_whatever_their_strides(rng, paged, layout):
    """The kernel read ``cache_seqlens + b`` without its stride: every other entry of a longer tensor gave row 1
    the wrong length (error 1.72), an expanded one read past its storage (error 1.35)."""
    q = randn(rng, 2, 4, 16)
    if paged:
        k, v, table = paged_cache(rng)
        options = {"block_table": table}
        k_rows, v_rows = contiguous_from_pages(k, table), contiguous_from_pages(v, table)
    else:
        k, v = randn(rng, 2, 2, 40, 16), randn(rng, 2, 2, 40, 16)
        options, k_rows, v_rows = {}, k, v
    if layout == "strided":
        lengths = torch.tensor([40, 99, 5, 99], dtype=torch.int32, device=DEVICE)[::2]
    else:
        lengths = torch.tensor([7], dtype=torch.int32, device=DEVICE).expand(2)
    o = kernels.flash_decode(q, k, v, cache_seqlens=lengths, **options)
    assert_close(o, decode_float64(q, k_rows, v_rows, lengths.tolist()), what=f"{layout} cache_seqlens")


def test_a_cache_of_no_pages_is_named(rng):
    """A table over a cache of no pages said "expected a page from 0 to -1"."""
    q, k = randn(rng, 1, 2, 16), randn(rng, 0, 2, 16, 16)
    with pytest.raises(ValueError, match=r"block_table\[0, 0\] = 0: expected a page, but the cache holds none"):
        kernels.flash_decode(q, k, k, block_table=torch.zeros(1, 1, dtype=torch.int32, device=DEVICE),
                             cache_seqlens=[5])


# ------------------------------------------------------------------------------------------ quantize_kv_cache
def test_quantize_kv_cache_checks_its_arguments_as_flash_decode(rng):
    """Lengths as an int or a list raised AttributeError; a page outside the cache a bare IndexError; int64 and
    out-of-range lengths and a negative padding were taken without a word."""
    k, v = randn(rng, 2, 2, 40, 16), randn(rng, 2, 2, 40, 16)
    as_tensor = kernels.quantize_kv_cache(k, v, cache_seqlens=torch.tensor([17, 17], dtype=torch.int32,
                                                                           device=DEVICE))
    for given in (17, [17, 17]):
        assert torch.equal(kernels.quantize_kv_cache(k, v, cache_seqlens=given).k_scale, as_tensor.k_scale)
    for lengths, words in ((torch.tensor([17, 17], device=DEVICE), "dtype torch.int64"),
                           ([50, 3], r"cache_seqlens\[0\] = 50"), ([3, -1], r"cache_seqlens\[1\] = -1")):
        with pytest.raises(ValueError, match=words):
            kernels.quantize_kv_cache(k, v, cache_seqlens=lengths)
    with pytest.raises(ValueError, match=r"cache_leftpad\[0\] = -1"):
        kernels.quantize_kv_cache(k, v, cache_leftpad=torch.tensor([-1, 0], dtype=torch.int32, device=DEVICE))
    kp, vp, table = paged_cache(rng)
    for page in (99, -1):
        table[1, 1] = page
        with pytest.raises(ValueError, match=rf"block_table\[1, 1\] = {page}: expected a page from 0 to 5"):
            kernels.quantize_kv_cache(kp, vp, block_table=table)
    table[1, 1] = -1  # past sequence 1's length: never read, so never checked
    kernels.quantize_kv_cache(kp, vp, block_table=table, cache_seqlens=[48, 16])


@pytest.mark.parametrize("bad", [float("inf"), float("nan")])
def test_quantize_kv_cache_refuses_a_non_finite_row_in_use(rng, bad):
    """An inf made its head's scale inf (the head quantised to 0 and NaN), a NaN made it 1.0: both silently."""
    k, v = randn(rng, 2, 2, 40, 16), randn(rng, 2, 2, 40, 16)
    k[1, 0, 5, 3] = bad
    with pytest.raises(ValueError, match=r"k_cache holds an inf or NaN in a row sequence 1 uses \(KV head 0\)"):
        kernels.quantize_kv_cache(k, v)
    fine = kernels.quantize_kv_cache(k, v, cache_seqlens=[40, 5])  # the row past sequence 1's length sets nothing
    assert torch.isfinite(fine.k_scale).all()


# ----------------------------------------------------------------------------------------------- block masks
@triton.jit
def first_row_sees_all(b, h, q_idx, kv_idx):
    """Batch row 0 sees every key, the others are causal: a mask that differs between batch rows."""
    return (b == 0) | (kv_idx <= q_idx)


@triton.jit
def first_head_sees_all(b, h, q_idx, kv_idx):
    return (h == 0) | (kv_idx <= q_idx)


@pytest.mark.parametrize(("mask_mod", "name"), [(first_row_sees_all, "B"), (first_head_sees_all, "H")])
def test_a_mask_for_every_row_refuses_a_rule_that_reads_b_or_h(rng, mask_mod, name):
    """Classified at b = 0 (h = 0) but run with the real b (h) in partial tiles: row 1 matched neither reading
    (error 2.21 against the rule). The rule's reads are known from its source: a ValueError, and with B (H) given
    the float64 answer."""
    q, k, v = (randn(rng, 2, 2, 32, 16) for _ in range(3))
    shape = {"B": None, "H": 2} if name == "B" else {"B": 2, "H": None}
    with pytest.raises(ValueError, match=f"{name} is None .* reads its parameter {name.lower()}"):
        kernels.create_block_mask(mask_mod, shape["B"], shape["H"], 32, 32, BLOCK_SIZE=16, device=DEVICE)
    bm = kernels.create_block_mask(mask_mod, 2, 2, 32, 32, BLOCK_SIZE=16, device=DEVICE)
    causal = torch.ones(32, 32, dtype=torch.bool, device=DEVICE).tril()
    sees_all = torch.zeros(2, 2, 1, 1, dtype=torch.bool, device=DEVICE)
    sees_all[(0 if name == "B" else slice(None)), (0 if name == "H" else slice(None))] = True
    want, _ = float64_attention(q, k, v, mask=causal | sees_all)
    assert_close(kernels.flash_attention(q, k, v, block_mask=bm), want, what=f"a rule reading {name.lower()}")


WIDTH = 8  # read by band below; the test changes it


@triton.jit
def band(b, h, q_idx, kv_idx):
    return (q_idx - kv_idx < WIDTH) & (kv_idx <= q_idx)


def test_a_block_mask_refuses_a_rule_whose_module_values_changed(rng):
    """A notebook that sets WIDTH = 40 after building the mask ran a mix of both rules (error 0.45 against width
    40): the mask remembers the values its map was made from."""
    global WIDTH
    q, k, v = (randn(rng, 1, 1, 64, 16) for _ in range(3))
    bm = kernels.create_block_mask(band, 1, 1, 64, 64, BLOCK_SIZE=16, device=DEVICE)
    try:
        WIDTH = 40
        with pytest.raises(ValueError, match=r"band reads module values that changed .*\(WIDTH\)"):
            kernels.flash_attention(q, k, v, block_mask=bm)
    finally:
        WIDTH = 8
    rows, cols = torch.arange(64, device=DEVICE)[:, None], torch.arange(64, device=DEVICE)[None, :]
    want, _ = float64_attention(q, k, v, mask=(rows - cols < 8) & (cols <= rows))
    assert_close(kernels.flash_attention(q, k, v, block_mask=bm), want, what="the rule the mask was built from")


@pytest.mark.parametrize("entry", ["flash_attention", "flash_attention_forward"])
def test_is_causal_false_against_a_causal_block_mask_is_refused(rng, entry):
    """is_causal=False ran causal attention under a causal mask (error 1.76 against the attention asked for);
    SDPA's flag defaults to None, so False is a choice, refused as a window that differs is."""
    q, k, v = (randn(rng, 1, 1, 32, 16) for _ in range(3))
    ids = torch.zeros(1, 32, dtype=torch.int32, device=DEVICE)
    bm = kernels.create_block_mask(None, None, None, 32, 32, document_ids=ids, causal=True, BLOCK_SIZE=16)
    call = getattr(kernels, entry)
    with pytest.raises(ValueError, match="built with causal='top_left', but this call passes causal=False"):
        call(q, k, v, block_mask=bm, is_causal=False)
    call(q, k, v, block_mask=bm, is_causal=True)
    plain = kernels.create_block_mask(None, None, None, 32, 32, document_ids=ids, BLOCK_SIZE=16)
    call(q, k, v, block_mask=plain, is_causal=False)


@pytest.mark.parametrize("where", ["meta", "cuda"])
def test_a_block_mask_on_a_device_that_cannot_classify_it(where):
    """device="meta" died in torch's storage code; "cuda" on a machine without one in an AssertionError."""
    if where == "cuda" and torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU")
    with pytest.raises(ValueError, match=f"device is '{where}'"):
        kernels.create_block_mask(band, 1, 1, 64, 64, device=where)


# ------------------------------------------------------------------------------------------- numbers' range
@pytest.mark.parametrize("scale", [1e-300, 1e38, pytest.param(10**400, id="10**400")])
def test_a_scale_outside_float32s_range_is_refused(rng, scale):
    """1e-300 is 0 in float32 (a masked score, -inf, times 0: NaN in v2-v6), 1e38 overflows ordinary scores (NaN
    everywhere), 10**400 raised OverflowError from inside the check."""
    q = randn(rng, 1, 1, 16, 16)
    for run in (lambda: kernels.flash_attention(q, q, q, causal=True, scale=scale),
                lambda: kernels.explain(q, q, q, scale=scale),
                lambda: kernels.flash_decode(q[:, :, 0], q, q, scale=scale)):
        with pytest.raises(ValueError, match="scale is .*: expected a number from 1e-30 to 1e"):
            run()


def test_the_smallest_scale_is_uniform_weights_in_a_teaching_version(rng):
    """At the bound the weights are uniform over the visible keys, in a version that multiplies -inf by the scale."""
    q, k, v = (randn(rng, 1, 1, 16, 16) for _ in range(3))
    o, _ = kernels.flash_attention_forward(q, k, v, causal=True, scale=1e-30, version="v3")
    want, _ = float64_attention(q, k, v, scale=1e-30, mask=torch.ones(16, 16, dtype=torch.bool, device=DEVICE).tril())
    assert_close(o, want, what="scale 1e-30, v3")


@pytest.mark.parametrize("option", ["softcap", "dropout_p"])
def test_a_huge_python_int_is_a_value_error(rng, option):
    """math.isfinite(10**400) raised OverflowError, naming no argument."""
    q = randn(rng, 1, 1, 16, 16)
    with pytest.raises(ValueError, match=rf"{option} is 1000\.\.\. \(an int of 401 digits\)"):
        kernels.flash_attention(q, q, q, **{option: 10**400})


def test_the_fp8_forward_asks_for_enable_gqa_as_every_entry_point():
    """FP8 inputs with fewer K/V heads ran as grouped-query attention without enable_gqa=True."""
    q8 = torch.zeros(1, 4, 16, 64, dtype=torch.float8_e4m3fn, device=DEVICE)
    k8 = torch.zeros(1, 2, 16, 64, dtype=torch.float8_e4m3fn, device=DEVICE)
    with pytest.raises(ValueError, match="pass enable_gqa=True"):
        kernels.flash_attention_forward(q8, k8, k8)
    if not torch.cuda.is_available():  # with it, the CPU's refusal is the device's, as for every FP8 call here
        with pytest.raises(RuntimeError, match="FP8 attention needs an NVIDIA GPU"):
            kernels.flash_attention_forward(q8, k8, k8, enable_gqa=True)
