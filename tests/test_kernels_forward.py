"""Forward kernels against the float64 NumPy reference: every numbered version, small sizes.

Without a GPU these run through the Triton interpreter on CPU tensors (seconds each); with one, on the GPU.
The tests marked ``gpu`` repeat the checks at real sizes, bfloat16 included.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from flashcourse import device  # noqa: E402

if not device.triton_available():
    pytest.skip("Triton is not installed here", allow_module_level=True)
# Imported before anything else loads triton: kernels sets the interpreter up first.
from flashcourse import kernels, reference  # noqa: E402
from flashcourse.tolerance import assert_close  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
VERSIONS = list(kernels.FORWARD_VERSIONS)


def make_qkv(rng, shape_q, shape_kv=None, dtype=torch.float32, device=DEVICE):
    shape_kv = shape_kv or shape_q
    arrays = [rng.standard_normal(s) for s in (shape_q, shape_kv, shape_kv)]
    return [torch.tensor(a, dtype=dtype, device=device) for a in arrays]


def check_forward(q, k, v, *, causal, version=None, scale=None):
    o, lse = kernels.flash_attention_forward(q, k, v, causal=causal, version=version, scale=scale)
    args = [t.detach().cpu().double().numpy() for t in (q, k, v)]
    o_ref, lse_ref = reference.attention_lse(*args, causal=causal, scale=scale)
    assert o.shape == q.shape and o.dtype == q.dtype
    assert lse.shape == q.shape[:3] and lse.dtype == torch.float32
    assert_close(o, o_ref, what=f"o ({version}, causal={causal})")
    assert_close(lse, lse_ref, dtype="float32" if q.dtype == torch.float32 else q.dtype,
                 what=f"lse ({version}, causal={causal})")


# Every version: a few cases that cover the tail tile, padded head dims, fp16 and causal.
VERSION_CASES = [(1, 16, torch.float32, True), (17, 80, torch.float16, True), (130, 64, torch.float32, False)]


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("n,d,dtype,causal", VERSION_CASES)
def test_every_version_matches_reference(rng, version, n, d, dtype, causal):
    q, k, v = make_qkv(rng, (2, 2, n, d), dtype=dtype)
    check_forward(q, k, v, causal=causal, version=version)


# The default version on the whole grid of the issue.
@pytest.mark.slow
@pytest.mark.parametrize("n", [1, 17, 64, 130])
@pytest.mark.parametrize("d", [16, 64, 80])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_default_version_grid(rng, n, d, causal, dtype):
    q, k, v = make_qkv(rng, (1, 2, n, d), dtype=dtype)
    check_forward(q, k, v, causal=causal)


@pytest.mark.parametrize("version", ["v1", "v6"])
def test_non_contiguous_inputs(rng, version):
    """A (B, N, H, D) tensor passed as .transpose(1, 2): strided, no copy."""
    q, k, v = (t.transpose(1, 2) for t in make_qkv(rng, (2, 33, 3, 32), dtype=torch.float16))
    assert not q.is_contiguous()
    check_forward(q, k, v, causal=True, version=version)


def test_more_keys_than_queries_and_custom_scale(rng):
    q, k, v = make_qkv(rng, (1, 2, 20, 32), (1, 2, 45, 32))
    check_forward(q, k, v, causal=True, scale=0.3)
    check_forward(q, k, v, causal=False, scale=0.3)


def test_no_keys_gives_zero_and_minus_inf(rng):
    q, k, v = make_qkv(rng, (1, 1, 5, 16), (1, 1, 0, 16))
    o, lse = kernels.flash_attention_forward(q, k, v)
    assert torch.all(o == 0) and torch.all(torch.isneginf(lse))


@pytest.mark.parametrize(
    "change,error,words",
    [
        (lambda q, k, v: (q, k.half(), v), TypeError, "one dtype"),
        (lambda q, k, v: (q, k[:1], v[:1]), ValueError, "must match"),
        (lambda q, k, v: (q[:, :1].expand(-1, 3, -1, -1), k, v), ValueError, "multiple of H_kv"),
        (lambda q, k, v: (q[..., :4], k[..., :4], v[..., :4]), ValueError, "head dim 4 .*8 to 256"),
        (lambda q, k, v: (q[0], k[0], v[0]), ValueError, "4 dims"),
        (lambda q, k, v: (q, k, v[:, :, :3]), ValueError, "must match"),
        (lambda q, k, v: (q.int(), k.int(), v.int()), TypeError, "float16"),
    ],
)
def test_bad_inputs_raise_clear_errors(rng, change, error, words):
    q, k, v = make_qkv(rng, (2, 2, 8, 16))
    with pytest.raises(error, match=words):
        kernels.flash_attention_forward(*change(q, k, v))


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter's bf16 dot is what this guards")
def test_bf16_on_cpu_is_refused(rng):
    q, k, v = make_qkv(rng, (1, 1, 8, 16), dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="bfloat16"):
        kernels.flash_attention_forward(q, k, v)


@pytest.mark.parametrize("version", ["v0", "fast"])
def test_unknown_version(rng, version):
    q, k, v = make_qkv(rng, (1, 1, 8, 16))
    with pytest.raises(ValueError, match="unknown forward version"):
        kernels.flash_attention_forward(q, k, v, version=version)


# ------------------------------------------------------------------------------------------------ GPU
@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_every_version(rng, version, dtype, causal):
    q, k, v = make_qkv(rng, (2, 4, 1000, 128), dtype=dtype)
    check_forward(q, k, v, causal=causal, version=version)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("d", [64, 80, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_default_version_real_sizes(rng, dtype, d, causal):
    q, k, v = make_qkv(rng, (2, 4, 2048, d), dtype=dtype)
    check_forward(q, k, v, causal=causal)
    qt, kt, vt = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v))  # (B, N, H, D) storage
    check_forward(qt, kt, vt, causal=causal)


@pytest.mark.gpu
@needs_cuda
def test_gpu_cpu_tensor_is_refused(rng):
    q, k, v = make_qkv(rng, (1, 1, 8, 16), device="cpu")
    with pytest.raises(ValueError, match="cuda"):
        kernels.flash_attention_forward(q, k, v)


def test_lse_matches_numpy_logsumexp(rng):
    """lse is the natural-log row logsumexp of the scaled scores, whatever base the kernel works in."""
    q, k, v = make_qkv(rng, (1, 1, 9, 16))
    _, lse = kernels.flash_attention_forward(q, k, v)
    s = q[0, 0].double().cpu().numpy() @ k[0, 0].double().cpu().numpy().T / 4.0
    np.testing.assert_allclose(lse[0, 0].cpu().numpy(), np.log(np.exp(s).sum(-1)), rtol=1e-5)


@pytest.mark.parametrize("version", ["v3", "v4", "v5", "v6"])
def test_a_launch_that_breaks_the_causal_split_rule_is_refused(rng, version):
    """The split kernels start the masked loop at a query-tile edge: BLOCK_M must be a multiple of BLOCK_N."""
    from flashcourse.kernels import configs
    from flashcourse.kernels.forward import run_forward

    q, k, v = make_qkv(rng, (1, 1, 40, 16))
    bad = configs.KernelConfig(16, 32, 4, 1)
    with pytest.raises(ValueError, match="BLOCK_M .16. must be a multiple of BLOCK_N .32."):
        run_forward(kernels.FORWARD_VERSIONS[version], q, k, v, causal=True, scale=None, config=bad)
    o, _ = run_forward(kernels.FORWARD_VERSIONS[version], q, k, v, causal=False, scale=None, config=bad)
    o_ref = reference.attention(*(t.double().cpu().numpy() for t in (q, k, v)))
    assert_close(o, o_ref, what="non-causal: no split, so any tile shape is right")


def test_v1_and_v2_take_any_tile_shape_when_causal(rng):
    from flashcourse.kernels import configs
    from flashcourse.kernels.forward import run_forward

    q, k, v = make_qkv(rng, (1, 1, 40, 16))
    o_ref = reference.attention(*(t.double().cpu().numpy() for t in (q, k, v)), causal=True)
    for version in ("v1", "v2"):
        o, _ = run_forward(kernels.FORWARD_VERSIONS[version], q, k, v, causal=True, scale=None,
                           config=configs.KernelConfig(16, 32, 4, 1))
        assert_close(o, o_ref, what=f"{version} causal with 16x32 tiles")


@pytest.mark.parametrize("bad", [(24, 16, 4, 1), (16, 8, 4, 1), (16, 16, 3, 1), (16, 16, 4, 0)])
def test_kernel_config_rejects_impossible_launches(bad):
    from flashcourse.kernels import configs

    with pytest.raises(ValueError, match="expected"):
        configs.KernelConfig(*bad)
