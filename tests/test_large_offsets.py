"""Offsets past 2**31 elements: no call the API accepts computes an address that wraps.

The Gluon backward (b6's dK/dV store, which b7 and b8 share, and b6's dQ atomics) once formed ``row * HEAD_DIM`` in
32 bits: from 16.8 million key rows at D = 128 (B = 16, H = 32, N = 32768) the last heads' gradients landed
elsewhere, without a word. On a GPU (``gpu``, ``huge_gpu_memory``: 44 GB at once) each default route runs at
B * H = 16,385 heads of N = 1024, D = 128 in float16 (2**31 + 2**17 elements of K), and only the last (batch,
head) slice, whose rows start at element 2**31, is compared with float64: on the old code that head's row offsets
wrapped to -2**31, so b7c stored its dK and dV 4 GiB before their buffers (another tensor's memory, or a fault).
Reading the compiled TTGIR for 64-bit offsets was tried and dropped: Triton splits an address into a 64-bit row
part and a 32-bit column part, and names repeat across the warp-specialized partitions, so a text rule was either
wrong or fragile.

The Triton kernels step to a (batch, head) in 64 bits and inside it in 32; a tensor whose (batch, head) slice spans
2**31 elements or more (a (B, N, H, D) view, as flash-attn's packed varlen layout, past N * H * D = 2**31) is
refused with the fix named. On the CPU: meta tensors (shapes and strides, no memory) show the refusal; on the old
code they reached the device check instead.
"""

from __future__ import annotations

import math

import pytest
import torch

from flashcourse import device

device.setup()

from flashcourse import kernels  # noqa: E402
from flashcourse.kernels import ops  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
LIMIT = 2**31  # the first offset a 32-bit signed integer cannot hold


def span(t) -> int:
    """The elements one (batch, head) slice of t (..., N, D) spans, counted here independently of the checks."""
    return (t.shape[-2] - 1) * abs(t.stride(-2)) + (t.shape[-1] - 1) * abs(t.stride(-1)) + 1


# ------------------------------------------------------------------------------------- the host's refusal (CPU)
def _meta(*shape):
    """A float16 tensor without storage: the checks read only shapes and strides, so 2**31 elements cost nothing."""
    return torch.empty(shape, dtype=torch.float16, device="meta")


def test_a_head_spanning_2_31_elements_is_refused_with_the_fix():
    """(1, H, N, D) seen from a packed (N, H, D) tensor, as flash-attn's varlen layout gives: at H = 32, D = 128 a
    head's rows are 4096 elements apart, and its last row starts at element 2**31 from N = 524,289 tokens."""
    packed = _meta(524_289, 32, 128)  # (total tokens, H, D)
    q = packed.transpose(0, 1).unsqueeze(0)  # (1, H, N, D): stride_n = H * D
    assert span(q) == LIMIT + 128
    with pytest.raises(ValueError, match=r"q has shape .* spans 2,147,483,776 elements.*pass q\.contiguous\(\)"):
        kernels.flash_attention(q, q, q)
    assert span(_meta(524_288, 32, 128).transpose(0, 1).unsqueeze(0)) < LIMIT  # one token fewer


def test_one_element_short_of_2_31_reaches_the_next_check():
    """The rule's edge: a head spanning 2**31 - 1 elements is within the 32-bit offsets, so the call goes on to
    the device check (meta tensors run nowhere)."""
    q = _meta(1, 1, 2**31 - 1, 1).expand(1, 1, 2**31 - 1, 8)  # stride_d = 0: the span is the rows alone
    assert span(q) == LIMIT - 1
    with pytest.raises(ValueError, match="meta") as caught:
        kernels.flash_attention(q, q, q)
    assert "spans" not in str(caught.value)


def test_a_contiguous_head_past_2_31_is_told_to_split():
    q = _meta(1, 1, 2**24 + 1, 128)  # one head of N * D = 2**31 + 128 elements
    with pytest.raises(ValueError, match="even contiguous: split the sequence"):
        kernels.flash_attention(q, q, q)


def test_the_backward_checks_o_and_do_laid_out_otherwise():
    q = _meta(1, 2, 64, 16)
    wide = _meta(1, 64, 2**26, 16)[:, :, :2].transpose(1, 2)  # (1, 2, 64, 16), rows 2**30 elements apart
    assert wide.shape == q.shape and span(wide) >= LIMIT
    lse = torch.empty(1, 2, 64, dtype=torch.float32, device="meta")
    with pytest.raises(ValueError, match="do has shape"):
        kernels.flash_attention_backward(q, q, q, q, lse, wide)


def test_the_fp8_forward_refuses_a_head_spanning_2_31():
    q = torch.empty(524_289, 32, 128, dtype=torch.float8_e4m3fn, device="meta").transpose(0, 1).unsqueeze(0)
    with pytest.raises(ValueError, match="q has shape .* spans"):
        kernels.flash_attention_forward(q, q, q)


@pytest.mark.parametrize("paged", [False, True])
def test_decode_refuses_a_cache_whose_head_spans_2_31(paged):
    """A (B, N_max, H_kv, D) cache seen as (B, H_kv, N_max, D): 2**21 + 1 rows of H_kv * D = 1024 elements; paged,
    one page of 512 rows 2**23 elements apart."""
    q = _meta(1, 8, 128)
    if paged:
        cache = _meta(1, 512, 2**16, 128)[:, :, :8].transpose(1, 2)
    else:
        cache = _meta(1, 2**21 + 1, 8, 128).transpose(1, 2)
    assert span(cache) >= LIMIT
    table = torch.zeros(1, 1, dtype=torch.int32, device="meta") if paged else None
    with pytest.raises(ValueError, match="k_cache has shape .* spans"):
        kernels.flash_decode(q, cache, cache, block_table=table)


def test_the_autograd_backward_copies_a_gradient_laid_out_too_wide(monkeypatch, rng):
    """autograd hands the backward whatever layout the loss gives o's gradient: one wider than the kernels index
    inside a head is copied to o's layout first (here with the limit lowered to 1, so that a small strided
    gradient counts as wide; the gradients then match a backward that got it contiguous)."""
    from flashcourse.kernels import plan as plan_module

    seen = []
    backward = plan_module.Plan.backward

    def spy(self, q, k, v, o, lse, do, *args, **kwargs):
        seen.append(do.is_contiguous())
        return backward(self, q, k, v, o, lse, do, *args, **kwargs)

    monkeypatch.setattr(plan_module.Plan, "backward", spy)
    monkeypatch.setattr(ops, "HEAD_SPAN_LIMIT", 1)
    q, k, v = (torch.tensor(rng.standard_normal((1, 2, 24, 16)), dtype=torch.float32, device=DEVICE).requires_grad_()
               for _ in range(3))
    o = kernels.flash_attention(q, k, v)
    weights = torch.tensor(rng.standard_normal((1, 24, 2, 16)), dtype=torch.float32, device=DEVICE).transpose(1, 2)
    (o * weights).sum().backward()  # o's gradient is ``weights``, a (B, N, H, D) layout
    assert seen == [True]
    expected = torch.autograd.grad((kernels.flash_attention(q, k, v) * weights.contiguous()).sum(), (q, k, v))
    for got, want in zip((q.grad, k.grad, v.grad), expected, strict=True):
        assert torch.allclose(got, want, atol=1e-5)


# ------------------------------------------------------------------------------------------ the GPU at 2**31
HEADS = (5, 3277)  # B * H = 16,385: the last head's rows start at row 2**24, element 2**31 at D = 128
N, D = 1024, 128
NEEDS_BYTES = 46e9  # q, k, v, do, o, dq, dk, dv (4.3 GB each) and the float32 dQ buffer of the Gluon backward (8.6 GB)


def huge(test):
    """A GPU test on tensors past 2**31 elements: make test-gpu runs it last, alone (scripts/gpu_tests.py)."""
    test = pytest.mark.huge_gpu_memory(pytest.mark.gpu(test))
    return pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")(test)


@pytest.fixture(scope="module")
def big_inputs():
    """q, k, v, do of (5, 3277, 1024, 128) float16, made once for the file."""
    free = torch.cuda.mem_get_info()[0]
    if free < NEEDS_BYTES:
        pytest.skip(f"needs {NEEDS_BYTES / 1e9:.0f} GB of free GPU memory, {free / 1e9:.0f} GB free")
    torch.manual_seed(0)
    yield tuple(torch.randn(*HEADS, N, D, device="cuda", dtype=torch.float16) for _ in range(4))
    torch.cuda.empty_cache()


def _last_slice_reference(q, k, v, do, causal):
    """(o, dq, dk, dv) of the last (batch, head) slice alone, in float64 (heads are independent)."""
    q64, k64, v64 = (t[-1, -1].double().requires_grad_() for t in (q, k, v))
    s = q64 @ k64.T / math.sqrt(D)
    if causal:
        s = s.masked_fill(torch.ones_like(s, dtype=torch.bool).triu(1), -math.inf)
    o = torch.softmax(s, -1) @ v64
    return (o.detach(), *torch.autograd.grad((o * do[-1, -1].double()).sum(), (q64, k64, v64)))


def _assert_last_slice(got: dict, want, what: str):
    for (name, g), w in zip(got.items(), want, strict=True):
        error = (g[-1, -1].double() - w).abs().max().item()
        assert error <= 2e-2 * max(w.abs().max().item(), 1.0), f"{what}: {name} of the last head off by {error}"


@huge
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_default_routes_past_2_31_elements(big_inputs, causal):
    """flash_attention forward and backward as it dispatches them here (on Hopper: a Gluon forward under the
    Triton it was tested with, v7 otherwise; b7c under Triton >= 3.9, b1 otherwise). Old code: b7c's dK and dV
    of the last head were stored 2**31 elements before their buffers."""
    q, k, v, do = big_inputs
    route = kernels.explain(q, k, v, causal=causal)
    qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
    o = kernels.flash_attention(qg, kg, vg, causal=causal)
    o.backward(do)
    got = {"o": o.detach(), "dq": qg.grad, "dk": kg.grad, "dv": vg.grad}
    _assert_last_slice(got, _last_slice_reference(q, k, v, do, causal), f"{route.forward} / {route.backward}")


@huge
def test_gpu_gluon_backward_stages_past_2_31_elements(big_inputs):
    """b7c (Triton >= 3.9) and b6's stages (the Tritons of its TESTED_TRITON) called directly: b6a with 64-row
    query tiles and b6c with 32 (the two ways its dQ atomics address the buffer). Old code: b6's dQ atomics and every
    stage's dK / dV store wrapped for the last head."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the Gluon backward is written for Hopper")
    import triton

    from flashcourse.kernels.hopper import fa3_backward, fa3_backward_tma

    q, k, v, do = big_inputs
    o, lse = kernels.flash_attention_forward(q, k, v)
    want = _last_slice_reference(q, k, v, do, False)
    _assert_last_slice({"o": o}, want[:1], "the forward")
    runs = []
    if ".".join(triton.__version__.split(".")[:2]) in fa3_backward.TESTED_TRITON:  # b6 ran on a GPU under these
        runs += [("b6a", lambda: fa3_backward.fa3_backward(q, k, v, o, lse, do, stage="b6a", block_m=64)),
                 ("b6c", lambda: fa3_backward.fa3_backward(q, k, v, o, lse, do, stage="b6c"))]
    if fa3_backward_tma.HAS_TMA_REDUCE:
        runs.append(("b7c", lambda: fa3_backward_tma.b7_backward(q, k, v, o, lse, do, stage="b7c")))
    for name, run in runs:
        dq, dk, dv = run()
        _assert_last_slice({"dq": dq, "dk": dk, "dv": dv}, want[1:], name)
        del dq, dk, dv


@huge
@pytest.mark.parametrize("paged", [False, True])
def test_gpu_decode_past_2_31_elements(big_inputs, paged):
    """flash_decode over a cache of 2**31 + 2**17 elements: contiguous (B, H_kv, N_max, D), or the same memory as
    5 pages of 1024 rows in reverse order. Decode already stepped to a head in 64 bits: a guard."""
    _, k, v, _ = big_inputs
    q = torch.randn(HEADS[0], HEADS[1], D, device="cuda", dtype=torch.float16)
    table = torch.arange(HEADS[0] - 1, -1, -1, device="cuda", dtype=torch.int32)[:, None] if paged else None
    o = kernels.flash_decode(q, k, v, block_table=table)
    page = 0 if paged else -1  # the last sequence's keys: the first page in reverse order
    s = q[-1, -1].double() @ k[page, -1].double().T / math.sqrt(D)
    want = torch.softmax(s, -1) @ v[page, -1].double()
    error = (o[-1, -1].double() - want).abs().max().item()
    assert error <= 2e-2 * max(want.abs().max().item(), 1.0), f"decode (paged: {paged}) off by {error}"
