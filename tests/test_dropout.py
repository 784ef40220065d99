"""Dropout on the attention weights (kernels/dropout.py): the mask's statistics, the forward's and the backward's
masks being one mask, determinism under ``torch.manual_seed``, and the checks of ``dropout_p``.

The float64 NumPy reference below is fed the mask ``dropout_mask(seed, shape, p)`` returns, the N x N array the
kernels never store: if the v7 forward or either of b3's kernels drew another mask, the output or a gradient would
differ from it by far more than the tolerance. Sizes are small and awkward for the interpreter (N not a multiple of
the tiles, N = 1, N_q != N_k, GQA); the tests marked ``gpu`` repeat them at real sizes in float16 and bfloat16.
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
from flashcourse.kernels import dropout  # noqa: E402
from flashcourse.tolerance import assert_close  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def reference(q, k, v, do, keep, p, *, causal=None, dlse=None):
    """o, lse, dq, dk, dv in float64 NumPy for attention whose weights are multiplied by ``keep / (1 - p)``.

    q (B, H_q, N_q, D), k and v (B, H_kv, N_k, D) (query head h reads K/V head h // (H_q / H_kv)), do like q,
    keep (B, H_q, N_q, N_k) bool. The gradients are written out: with Pd = P * keep / (1 - p) and O = Pd V,
    dV = Pd^T dO, dPd = dO V^T, dP = dPd * keep / (1 - p), dS = P * (dP - rowsum(P * dP)); ``dlse`` (B, H_q, N_q),
    the gradient of a loss through the lse, adds P * dlse to dS (d lse_i / d s_ij = P_ij, undropped)."""
    q, k, v, do = (np.asarray(t, dtype=np.float64) for t in (q, k, v, do))
    group = q.shape[1] // k.shape[1]
    k_full, v_full = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    n_q, n_kv, head_dim = q.shape[2], k.shape[2], q.shape[3]
    scale = 1 / math.sqrt(head_dim)
    s = scale * q @ k_full.swapaxes(-1, -2)
    if causal is not None:
        shift = 0 if causal == "top_left" else n_kv - n_q
        s = np.where(np.arange(n_kv)[None, :] <= np.arange(n_q)[:, None] + shift, s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    lse = (m + np.log(np.exp(s - m).sum(axis=-1, keepdims=True)))[..., 0]
    weights = np.exp(s - lse[..., None])  # P, undropped
    factor = np.asarray(keep, dtype=np.float64) / (1 - p)
    dropped = weights * factor
    o = dropped @ v_full
    dv_full = dropped.swapaxes(-1, -2) @ do
    dp = (do @ v_full.swapaxes(-1, -2)) * factor
    ds = weights * (dp - (weights * dp).sum(axis=-1, keepdims=True))
    if dlse is not None:
        ds = ds + weights * np.asarray(dlse, dtype=np.float64)[..., None]
    dq = scale * ds @ k_full
    dk_full = scale * ds.swapaxes(-1, -2) @ q

    def per_kv_head(x):  # the sum over the query heads that share a K/V head
        return x.reshape(x.shape[0], -1, group, *x.shape[2:]).sum(axis=2)

    return o, lse, dq, per_kv_head(dk_full), per_kv_head(dv_full)


def make(rng, batch, h_q, h_kv, n_q, n_kv, head_dim, dtype=torch.float32):
    def tensor(*shape):
        return torch.tensor(rng.standard_normal(shape), dtype=dtype, device=DEVICE)

    return (tensor(batch, h_q, n_q, head_dim), tensor(batch, h_kv, n_kv, head_dim), tensor(batch, h_kv, n_kv, head_dim),
            tensor(batch, h_q, n_q, head_dim))


def check_against_reference(rng, shape, *, p, causal=None, dtype=torch.float32, seed=1234):
    """flash_attention_forward and _backward with an explicit seed against the reference fed that seed's mask."""
    batch, h_q, h_kv, n_q, n_kv, head_dim = shape
    q, k, v, do = make(rng, batch, h_q, h_kv, n_q, n_kv, head_dim, dtype)
    options = dict(causal=causal or False, enable_gqa=h_q != h_kv, dropout_p=p, dropout_seed=seed)
    o, lse = kernels.flash_attention_forward(q, k, v, **options)
    dq, dk, dv = kernels.flash_attention_backward(q, k, v, o, lse, do, **options)
    keep = kernels.dropout_mask(seed, (batch, h_q, n_q, n_kv), p, device=DEVICE).cpu().numpy()
    expected = reference(*(t.cpu().float().numpy() for t in (q, k, v, do)), keep, p, causal=causal)
    for what, got, want in zip(("o", "lse", "dq", "dk", "dv"), (o, lse, dq, dk, dv), expected, strict=True):
        assert_close(got.float().cpu(), want, dtype=dtype, what=what)
    return keep


def test_the_mask_keeps_each_weight_with_probability_one_minus_p():
    """Binomial bounds: the kept fraction within 5 standard deviations of 1 - p, over the whole mask and over each
    (batch, head) and each query row's neighbourhood (a stream that repeated along one axis would fail the
    comparisons of slices below)."""
    shape = (2, 3, 64, 96)
    for p in (0.1, 0.5, 0.9):
        keep = kernels.dropout_mask(7, shape, p).numpy()
        n = keep.size
        assert abs(keep.mean() - (1 - p)) <= 5 * math.sqrt(p * (1 - p) / n), (p, keep.mean())
        per_head = keep.reshape(6, -1).mean(axis=1)
        assert np.all(np.abs(per_head - (1 - p)) <= 5 * math.sqrt(p * (1 - p) / keep[0, 0].size)), per_head
        # Different heads, rows and columns draw different numbers (their Philox counters differ).
        flat = keep.reshape(6, 64, 96)
        assert not np.array_equal(flat[0], flat[1])
        assert not np.array_equal(flat[0, 0], flat[0, 1])
        assert not np.array_equal(flat[0, :, 0], flat[0, :, 1])


def test_the_mask_is_a_function_of_the_seed_and_the_position():
    """The same seed gives the same mask; another seed another one; a larger shape starts with the same rows only
    where N_k is the same (the counter is ((b * H + h) * N_q + i) * N_k + j)."""
    a = kernels.dropout_mask(11, (1, 2, 20, 30), 0.3)
    assert torch.equal(a, kernels.dropout_mask(11, (1, 2, 20, 30), 0.3))
    assert torch.equal(a, kernels.dropout_mask(torch.tensor([11]), (1, 2, 20, 30), 0.3))
    assert not torch.equal(a, kernels.dropout_mask(12, (1, 2, 20, 30), 0.3))
    assert torch.equal(a[:, 0], kernels.dropout_mask(11, (1, 1, 20, 30), 0.3)[:, 0])
    assert kernels.dropout_mask(11, (1, 2, 20, 30), 0.0).all()


@pytest.mark.parametrize("causal", [None, "top_left", "bottom_right"])
@pytest.mark.parametrize("shape", [(1, 2, 2, 37, 45, 16), (2, 4, 2, 33, 33, 59), (1, 1, 1, 1, 1, 16)],
                         ids=["nq37-nk45", "gqa-n33-d59", "n1"])
def test_forward_and_backward_use_one_mask(rng, shape, causal):
    """Output, lse and the three gradients equal the float64 reference fed dropout_mask's mask: the forward and
    both backward kernels (dK/dV over key tiles, dQ over query tiles: transposed tiles) draw the same bits."""
    if causal == "top_left" and shape[3] != shape[4]:
        causal = "bottom_right"
    check_against_reference(rng, shape, p=0.3, causal=causal)


def test_lse_is_the_undropped_softmax(rng):
    q, k, v, _ = make(rng, 1, 2, 2, 40, 40, 16)
    _, lse_dropped = kernels.flash_attention_forward(q, k, v, dropout_p=0.6, dropout_seed=3)
    _, lse = kernels.flash_attention_forward(q, k, v)
    assert_close(lse_dropped, lse.numpy(), what="lse")


def test_flash_attention_is_repeatable_under_manual_seed_and_draws_a_new_mask_per_call(rng):
    """flash_attention draws its seed from torch's generator: after torch.manual_seed(s) it is the seed
    draw_seed gives after the same manual_seed, so the reference with that seed's mask gives o and the gradients;
    the next call (the generator moved on) drops other weights."""
    q, k, v, do = make(rng, 1, 2, 2, 30, 30, 16)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    torch.manual_seed(2024)
    o = kernels.flash_attention(*leaves, dropout_p=0.25, causal=True)
    o.backward(do)
    torch.manual_seed(2024)
    seed = dropout.draw_seed(DEVICE)
    keep = kernels.dropout_mask(seed, (1, 2, 30, 30), 0.25).cpu().numpy()
    expected = reference(*(t.cpu().numpy() for t in (q, k, v, do)), keep, 0.25, causal="top_left")
    for what, got, want in zip(("o", "dq", "dk", "dv"), (o, *(t.grad for t in leaves)),
                               (expected[0], *expected[2:]), strict=True):
        assert_close(got.detach().cpu(), want, what=what)
    torch.manual_seed(2024)
    with torch.no_grad():
        again = kernels.flash_attention(q, k, v, dropout_p=0.25, causal=True)
        other = kernels.flash_attention(q, k, v, dropout_p=0.25, causal=True)
    assert torch.equal(again, o.detach())
    assert not torch.equal(other, again)


def test_a_loss_through_the_lse_gets_its_term_with_dropout(rng):
    """return_lse=True: the lse is the undropped softmax's, so its gradient adds P * dlse (undropped P) to dS,
    beside dropout's terms."""
    q, k, v, do = make(rng, 1, 2, 2, 25, 31, 16)
    dlse = torch.tensor(rng.standard_normal((1, 2, 25)), dtype=torch.float32, device=DEVICE)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    torch.manual_seed(8)
    o, lse = kernels.flash_attention(*leaves, dropout_p=0.4, return_lse=True)
    ((o * do).sum() + (lse * dlse).sum()).backward()
    torch.manual_seed(8)
    keep = kernels.dropout_mask(dropout.draw_seed(DEVICE), (1, 2, 25, 31), 0.4).cpu().numpy()
    want = reference(*(t.cpu().numpy() for t in (q, k, v, do)), keep, 0.4, dlse=dlse.cpu().numpy())
    for what, got, expected in zip(("dq", "dk", "dv"), (t.grad for t in leaves), want[2:], strict=True):
        assert_close(got.cpu(), expected, what=what)


def test_a_fixed_seed_gives_one_output_and_different_seeds_different_ones(rng):
    q, k, v, _ = make(rng, 1, 2, 2, 20, 20, 16)
    first, _ = kernels.flash_attention_forward(q, k, v, dropout_p=0.5, dropout_seed=99)
    second, _ = kernels.flash_attention_forward(q, k, v, dropout_p=0.5, dropout_seed=99)
    other, _ = kernels.flash_attention_forward(q, k, v, dropout_p=0.5, dropout_seed=100)
    assert torch.equal(first, second)
    assert not torch.equal(first, other)


def test_dropout_p_zero_is_no_dropout(rng):
    q, k, v, _ = make(rng, 1, 2, 2, 20, 20, 16)
    assert torch.equal(kernels.flash_attention(q, k, v, dropout_p=0.0), kernels.flash_attention(q, k, v))
    assert kernels.explain(q, k, v, dropout_p=0.0).backward == "b1"


def test_calls_with_dropout_run_v7_and_b3_and_say_so():
    q = torch.zeros(1, 2, 16, 16, device=DEVICE)
    route = kernels.explain(q, q, q, causal=True, dropout_p=0.1)
    assert (route.forward, route.backward) == ("v7", "b3")
    assert "dropout" in route.backward_why


@pytest.mark.parametrize("bad, error, words", [
    (float("nan"), ValueError, "dropout_p is nan"),
    (1.0, ValueError, "every attention weight would be dropped"),
    (-0.1, ValueError, "expected a float in [0, 1)"),
    (1.5, ValueError, "expected a float in [0, 1)"),
    ("0.1", TypeError, "expected a float in [0, 1)"),
    (True, TypeError, "expected a float in [0, 1)"),
])
def test_bad_dropout_p_is_refused_by_name(bad, error, words):
    q = torch.zeros(1, 1, 4, 16, device=DEVICE)
    for entry in (kernels.flash_attention, kernels.flash_attention_forward, kernels.explain):
        with pytest.raises(error, match="dropout_p") as caught:
            entry(q, q, q, dropout_p=bad)
        assert words in str(caught.value)


def test_the_backward_needs_the_forwards_seed_and_the_numbered_versions_refuse_dropout():
    q = torch.zeros(1, 1, 4, 16, device=DEVICE)
    o, lse = kernels.flash_attention_forward(q, q, q, dropout_p=0.2, dropout_seed=1)
    with pytest.raises(ValueError, match="dropout_seed is None"):
        kernels.flash_attention_backward(q, q, q, o, lse, o, dropout_p=0.2)
    with pytest.raises(ValueError, match="has no dropout"):
        kernels.flash_attention_forward(q, q, q, dropout_p=0.2, version="v3")
    with pytest.raises(ValueError, match="has no dropout"):
        kernels.flash_attention_backward(q, q, q, o, lse, o, dropout_p=0.2, dropout_seed=1, version="b1")
    with pytest.raises(ValueError, match="dropout_seed has shape"):
        kernels.flash_attention_forward(q, q, q, dropout_p=0.2, dropout_seed=torch.tensor([1, 2]))


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("causal", [None, "top_left"])
@pytest.mark.parametrize("shape", [(2, 4, 4, 1000, 1000, 64), (1, 8, 2, 777, 1500, 128)], ids=["d64", "gqa-d128"])
def test_gpu_forward_and_backward_use_one_mask(rng, shape, causal, dtype):
    if causal == "top_left" and shape[3] != shape[4]:
        causal = "bottom_right"
    keep = check_against_reference(rng, shape, p=0.1, causal=causal, dtype=dtype)
    assert abs(keep.mean() - 0.9) < 0.01


@pytest.mark.gpu
@needs_cuda
def test_gpu_flash_attention_is_repeatable_under_manual_seed(rng):
    q, k, v, _ = make(rng, 2, 8, 8, 512, 512, 64, torch.bfloat16)
    torch.manual_seed(5)
    first = kernels.flash_attention(q, k, v, dropout_p=0.2, causal=True)
    torch.manual_seed(5)
    assert torch.equal(first, kernels.flash_attention(q, k, v, dropout_p=0.2, causal=True))


@pytest.mark.slow  # torch.compile's tracing: tens of seconds on a loaded CPU
def test_compiled_fullgraph_draws_the_seed_in_the_graph_and_matches_eager(rng):
    """Under torch.compile(fullgraph=True) the seed is drawn outside the op, by torch's generator as eagerly:
    after the same manual_seed, the compiled call drops the same weights, and its backward op gets the seed."""
    import torch._dynamo

    torch._dynamo.reset()
    q, k, v, do = make(rng, 1, 2, 2, 20, 20, 16)

    def attention(q, k, v):
        return kernels.flash_attention(q, k, v, causal=True, dropout_p=0.3)

    compiled = torch.compile(attention, backend="aot_eager", fullgraph=True)
    results = []
    for run in (compiled, attention):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        torch.manual_seed(77)
        out = run(*leaves)
        out.backward(do)
        results.append((out.detach(), *(t.grad for t in leaves)))
    for what, got, want in zip(("o", "dq", "dk", "dv"), *results, strict=True):
        assert_close(got.cpu(), want.cpu().numpy(), what=f"compiled {what}")
