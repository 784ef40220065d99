"""Backward kernels and the autograd Function against float64 gradients written out in NumPy.

The reference gradient is the textbook one, with the full N x N matrices:
S = scale Q K^T (masked), P = softmax(S), dV = P^T dO, dP = dO V^T, dS = P * (dP - rowsum(dP * P)),
dQ = scale dS K, dK = scale dS^T Q.
"""

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


def reference_grads(q, k, v, do, *, causal, scale=None):
    """(dq, dk, dv) in float64 NumPy for arrays (..., N, D)."""
    q, k, v, do = (np.asarray(x, dtype=np.float64) for x in (q, k, v, do))
    scale = 1.0 / np.sqrt(q.shape[-1]) if scale is None else scale
    s = scale * q @ np.swapaxes(k, -1, -2)
    if causal:
        s = np.where(reference.causal_mask(q.shape[-2], k.shape[-2]), s, -np.inf)
    p = reference.softmax_safe(s)
    dv = np.swapaxes(p, -1, -2) @ do
    dp = do @ np.swapaxes(v, -1, -2)
    ds = p * (dp - np.sum(dp * p, axis=-1, keepdims=True))
    return scale * ds @ k, scale * np.swapaxes(ds, -1, -2) @ q, dv


def check_grads(rng, shape_q, shape_kv=None, *, dtype, causal, transpose=False, **versions):
    shape_kv = shape_kv or shape_q
    arrays = [rng.standard_normal(s) for s in (shape_q, shape_kv, shape_kv, shape_q)]
    q, k, v, do = (torch.tensor(a, dtype=dtype, device=DEVICE) for a in arrays)
    if transpose:  # (B, N, H, D) storage seen as (B, H, N, D)
        q, k, v, do = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v, do))
    for t in (q, k, v):
        t.requires_grad_(True)
    o = kernels.flash_attention(q, k, v, causal=causal, **versions)
    o.backward(do)
    expected = reference_grads(*(t.detach().cpu().double().numpy() for t in (q, k, v, do)), causal=causal)
    for name, t, ref in zip(("dq", "dk", "dv"), (q, k, v), expected, strict=True):
        assert t.grad.shape == t.shape and t.grad.dtype == t.dtype
        # Gradients sum N products: relative to their own scale, fp16 rounding shows as in the forward.
        scale = max(1.0, float(np.abs(ref).max()))
        assert_close(t.grad.double().cpu() / scale, ref / scale, dtype=dtype, what=f"{name} ({versions})")


@pytest.mark.parametrize("backward_version", list(kernels.BACKWARD_VERSIONS))
@pytest.mark.parametrize("n,d,dtype,causal", [(1, 16, torch.float32, True), (17, 80, torch.float16, True),
                                              (130, 64, torch.float32, False), (64, 16, torch.float16, False)])
def test_every_backward_version(rng, backward_version, n, d, dtype, causal):
    check_grads(rng, (1, 2, n, d), dtype=dtype, causal=causal, backward_version=backward_version)


@pytest.mark.slow
@pytest.mark.parametrize("n", [17, 64, 130])
@pytest.mark.parametrize("d", [16, 64, 80])
@pytest.mark.parametrize("causal", [False, True])
def test_default_backward_grid(rng, n, d, causal):
    check_grads(rng, (1, 2, n, d), dtype=torch.float32, causal=causal)


@pytest.mark.parametrize("forward_version", ["v1", "v3"])
def test_backward_after_other_forward_versions(rng, forward_version):
    check_grads(rng, (1, 1, 40, 32), dtype=torch.float16, causal=True, forward_version=forward_version)


def test_non_contiguous_inputs_and_grad(rng):
    check_grads(rng, (2, 3, 33, 32), dtype=torch.float16, causal=True, transpose=True)


def test_more_keys_than_queries(rng):
    check_grads(rng, (1, 2, 20, 16), (1, 2, 45, 16), dtype=torch.float32, causal=True)
    check_grads(rng, (1, 2, 45, 16), (1, 2, 20, 16), dtype=torch.float32, causal=False)


def test_drop_in_for_sdpa_in_a_tiny_model(rng):
    """Same loss and gradients as SDPA through a projection: the Function composes with autograd."""
    x = torch.tensor(rng.standard_normal((2, 24, 32)), dtype=torch.float32, device=DEVICE)
    w = torch.tensor(rng.standard_normal((32, 96)) * 0.2, dtype=torch.float32, device=DEVICE, requires_grad=True)
    grads = []
    for attend in (kernels.flash_attention, torch.nn.functional.scaled_dot_product_attention):
        qkv = (x @ w).reshape(2, 24, 3, 2, 16).permute(2, 0, 3, 1, 4)  # 3 x (B, H, N, D), strided views
        causal_kw = {"causal": True} if attend is kernels.flash_attention else {"is_causal": True}
        loss = attend(qkv[0], qkv[1], qkv[2], **causal_kw).square().mean()
        grads.append((loss.detach(), torch.autograd.grad(loss, w)[0]))
    assert_close(grads[0][0], grads[1][0].cpu().numpy(), what="loss")
    assert_close(grads[0][1], grads[1][1].cpu().numpy(), what="dL/dw")


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("backward_version", list(kernels.BACKWARD_VERSIONS))
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("d", [64, 80, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_real_sizes(rng, backward_version, dtype, d, causal):
    check_grads(rng, (1, 2, 1000, d), dtype=dtype, causal=causal, backward_version=backward_version)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("backward_version", list(kernels.BACKWARD_VERSIONS))
def test_gpu_every_version_as_lesson_08_checks_it(rng, backward_version):
    """Lesson 08's gradient check on a GPU: float32, lengths 1, 17 and 64, head dims 16 and 32, (B, N, H, D)
    storage, causal and not (on the H200 on 2026-12-01 that lesson's cell failed once and ran past 200 s once)."""
    for n, d, causal in [(n, d, c) for n in (1, 17, 64) for d in (16, 32) for c in (False, True)]:
        check_grads(rng, (1, 2, n, d), dtype=torch.float32, causal=causal, transpose=True,
                    backward_version=backward_version)


@pytest.mark.gpu
@needs_cuda
def test_gpu_float32_and_transposed(rng):
    check_grads(rng, (2, 2, 777, 64), dtype=torch.float32, causal=True, transpose=True)


def test_public_backward_from_saved_output_matches_autograd(rng):
    """flash_attention_backward(q, k, v, o, lse, do) gives the gradients autograd gets through flash_attention."""
    q, k, v, do = (torch.tensor(rng.standard_normal((1, 2, 19, 16)), dtype=torch.float32, device=DEVICE)
                   for _ in range(4))
    for causal in (False, True):
        o, lse = kernels.flash_attention_forward(q, k, v, causal=causal)
        grads = kernels.flash_attention_backward(q, k, v, o, lse, do, causal=causal)
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        kernels.flash_attention(*leaves, causal=causal).backward(do)
        for name, got, leaf in zip("qkv", grads, leaves, strict=True):
            assert_close(got, leaf.grad.double().cpu().numpy(), what=f"d{name} (causal={causal})")
    with pytest.raises(ValueError, match="lse is"):
        kernels.flash_attention_backward(q, k, v, o, lse[..., :3], do)
    with pytest.raises(ValueError, match="do is"):
        kernels.flash_attention_backward(q, k, v, o, lse, do[:, :, :5])
    strided_lse = torch.empty(*lse.shape[:2], 2 * lse.shape[2], device=DEVICE)[..., ::2]  # every other entry
    strided_lse.copy_(lse)
    with pytest.raises(ValueError, match="lse is not contiguous"):
        kernels.flash_attention_backward(q, k, v, o, strided_lse, do)


def test_a_backward_launch_that_breaks_its_rule_is_refused(rng):
    from flashcourse.kernels import configs
    from flashcourse.kernels.backward import run_backward

    q, k, v, do = (torch.tensor(rng.standard_normal((1, 1, 40, 16)), dtype=torch.float32, device=DEVICE)
                   for _ in range(4))
    o, lse = kernels.flash_attention_forward(q, k, v, causal=True)
    b1 = kernels.BACKWARD_VERSIONS["b1"]
    good_dq = configs.KernelConfig(32, 16, 4, 1)
    with pytest.raises(ValueError, match="dK/dV kernel"):
        run_backward(b1, q, k, v, o, lse, do, causal=True, scale=None,
                     configs_override=(configs.KernelConfig(32, 16, 4, 1), good_dq))
    with pytest.raises(ValueError, match="dQ kernel"):
        run_backward(b1, q, k, v, o, lse, do, causal=True, scale=None,
                     configs_override=(configs.KernelConfig(16, 32, 4, 1), configs.KernelConfig(16, 32, 4, 1)))
