"""The FP8 forward (kernels/fp8.py): quantising, incoherent processing, the kernel's logic, its refusals.

On a CPU: the quantiser and the rotation against float64, the refusal without an FP8 GPU, and the kernel's
index, mask, descale and layout logic run in the Triton interpreter with 16-bit values (the launch is
dtype-agnostic; P is cast to V's dtype). Not the FP8 rounding of P itself: the interpreter's float32 -> e4m3
cast drops the carry when rounding up overflows the mantissa (125 -> 64 instead of 128), so a full FP8 run there
is wrong by up to 2x per weight; :func:`fp8.error_bound` is checked against the kernels' arithmetic written out
in torch instead (``kernel_numerics``), at 1 to 4096 keys. The tests marked ``gpu`` run the real FP8 kernel on
Hopper against the float64 attention of the dequantised inputs, within :func:`fp8.error_bound` (its docstring
derives it).
"""

from __future__ import annotations

import math

import pytest
from child_env import child_pythonpath

torch = pytest.importorskip("torch")
from flashcourse import device  # noqa: E402

if not device.triton_available():
    pytest.skip("Triton is not installed here", allow_module_level=True)
from flashcourse import kernels  # noqa: E402
from flashcourse.kernels import configs, fp8  # noqa: E402
from flashcourse.kernels.rules import parse_rules  # noqa: E402
from flashcourse.tolerance import assert_close  # noqa: E402

HAS_FP8_GPU = torch.cuda.is_available() and torch.cuda.get_device_capability() >= fp8.MIN_CAPABILITY
needs_fp8_gpu = pytest.mark.skipif(not HAS_FP8_GPU, reason="needs a GPU of compute capability 9.0 or newer")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def randn(rng, *shape, device=DEVICE):
    return torch.tensor(rng.standard_normal(shape), dtype=torch.float32, device=device)


def with_outlier_channels(x, channels=(3, 17), factor=8.0):
    x = x.clone()
    x[..., list(channels)] *= factor
    return x


# ------------------------------------------------------------------------------------------ quantising (CPU)
def test_quantize_tensor_round_trip_within_e4m3_rounding(rng):
    x = randn(rng, 2, 4, 33, 64, device="cpu") * 3
    x8, descale = fp8.quantize_tensor(x, heads_kv=2)
    assert x8.dtype == fp8.FP8 and descale.shape == (2, 2) and descale.dtype == torch.float32
    # Each group of 2 heads is scaled so that its largest magnitude lands on 448.
    group_max = x.abs().reshape(2, 2, -1).amax(-1)
    torch.testing.assert_close(descale, group_max / fp8.E4M3_MAX)
    back = fp8.dequantize(x8, descale).double()
    err = (back - x.double()).abs()
    # Normal e4m3 numbers keep 3 mantissa bits (relative error <= 2^-4); subnormals have spacing 2^-9 * descale.
    allowed = 2.0**-4 * x.double().abs() + 2.0**-10 * descale.repeat_interleave(2, 1)[:, :, None, None].double()
    assert (err <= allowed + 1e-12).all(), f"worst excess {(err - allowed).max().item():.3g}"


def test_quantize_zero_heads_and_empty_tensors():
    x8, descale = fp8.quantize_tensor(torch.zeros(1, 2, 5, 64), heads_kv=2)
    assert torch.equal(descale, torch.ones(1, 2)) and torch.equal(x8.float(), torch.zeros(1, 2, 5, 64))
    _, descale = fp8.quantize_tensor(torch.zeros(1, 2, 0, 64), heads_kv=1)
    assert descale.shape == (1, 1)


def test_rotation_is_orthogonal_and_keeps_scores(rng):
    r = fp8.random_rotation(128, seed=3).double()
    torch.testing.assert_close(r @ r.T, torch.eye(128, dtype=torch.float64), atol=1e-6, rtol=0)
    assert not torch.equal(fp8.random_rotation(128, seed=3), fp8.random_rotation(128, seed=4))
    q, k = randn(rng, 1, 2, 16, 128, device="cpu").double(), randn(rng, 1, 2, 16, 128, device="cpu").double()
    r64 = fp8.hadamard(128) / 128**0.5
    torch.testing.assert_close((q @ r64) @ (k @ r64).transpose(-1, -2), q @ k.transpose(-1, -2), atol=1e-10, rtol=0)
    with pytest.raises(ValueError, match="power-of-two"):
        fp8.hadamard(80)


def test_incoherent_processing_lowers_the_error_with_outlier_channels(rng):
    """The kernel's numerics (P rounded as it rounds it) on quantised inputs whose q and k have outlier
    channels: rotating q and k first must lower the error against the unquantised float64 attention."""
    q, k = (with_outlier_channels(randn(rng, 1, 2, 256, 128, device="cpu")) for _ in range(2))
    v = randn(rng, 1, 2, 256, 128, device="cpu")
    exact, _, _ = fp8.reference_forward(q, k, v, causal=True)
    errors = {}
    for incoherent in (False, True):
        x = fp8.quantize_fp8(q, k, v, incoherent=incoherent, seed=0)
        o, _, _ = fp8.reference_forward(*x.dequantized(), causal=True, p_shift=fp8.P_SHIFT)
        errors[incoherent] = (o - exact).pow(2).mean().sqrt().item()
    assert errors[True] < errors[False] / 1.5, errors


def test_quantize_fp8_keeps_q_k_products_when_incoherent(rng):
    q, k, v = (randn(rng, 1, 4, 8, 64, device="cpu") for _ in range(3))
    x = fp8.quantize_fp8(q, k[:, :2], v[:, :2], incoherent=True, seed=1)
    assert x.rotation is not None and x.q_descale.shape == (1, 2)
    qr, kr, _ = x.dequantized()
    scores = qr.double() @ kr.double().repeat_interleave(2, 1).transpose(-1, -2)
    exact = q.double() @ k[:, :2].double().repeat_interleave(2, 1).transpose(-1, -2)
    assert (scores - exact).abs().max() < 0.25 * exact.abs().max()  # FP8's rounding, not the rotation


def test_v_keys_contiguous_keeps_values_and_pads_rows():
    v = torch.randn(2, 3, 37, 64)
    vt = fp8.v_keys_contiguous(v)
    assert torch.equal(vt, v) and vt.stride(2) == 1 and vt.stride(3) == 48  # 37 keys padded to 48


# ------------------------------------------------------------------------------------------ kernel logic (interpreter)
def run_emulated(rng, shape_q, shape_kv, causal, **launch):
    """The FP8 kernel's launch with 16-bit values that are exactly the FP8 values (P then rounds to fp16), and
    descales that differ per (batch, KV head): against float64 attention of the dequantised inputs."""
    q, k, v = randn(rng, *shape_q), randn(rng, *shape_kv), randn(rng, *shape_kv)
    x = fp8.quantize_fp8(q, k, v)
    q_descale = x.q_descale * torch.tensor(rng.uniform(0.5, 2.0, x.q_descale.shape), dtype=torch.float32,
                                           device=q.device)
    q16, k16, v16 = (t.to(torch.float16) for t in (x.q, x.k, x.v))
    o, lse = fp8.run_fp8_forward(q16, k16, v16, q_descale, x.k_descale, x.v_descale,
                                 rules=parse_rules(q16, k16, causal=causal), out_dtype=torch.float16, **launch)
    o_ref, lse_ref, _ = fp8.reference_forward(fp8.dequantize(x.q, q_descale), fp8.dequantize(x.k, x.k_descale),
                                              fp8.dequantize(x.v, x.v_descale), causal=causal)
    assert o.shape == q.shape and o.dtype == torch.float16 and lse.shape == q.shape[:3]
    assert_close(o, o_ref, what=f"o (causal={causal}, {launch})")
    assert_close(lse, lse_ref, dtype="float32", what=f"lse (causal={causal}, {launch})")


@pytest.mark.parametrize("shape_q,shape_kv,causal", [
    ((1, 2, 37, 64), (1, 2, 37, 64), False),      # tail tile
    ((1, 4, 37, 64), (1, 2, 37, 64), True),       # GQA, causal
    ((2, 2, 1, 64), (2, 1, 1, 64), True),         # one token
    ((1, 2, 20, 64), (1, 2, 45, 64), "bottom_right"),
    ((1, 2, 45, 64), (1, 2, 20, 64), "bottom_right"),  # first rows see no key: 0 and -inf
    ((1, 2, 33, 128), (1, 1, 50, 128), False),
])
def test_kernel_logic_in_the_interpreter(rng, shape_q, shape_kv, causal):
    run_emulated(rng, shape_q, shape_kv, causal)


@pytest.mark.parametrize("launch", [dict(use_descriptors=False), dict(transpose_v=False),
                                    dict(transpose_v=False, use_descriptors=False),
                                    dict(config=configs.KernelConfig(16, 32, 4, 1))])
def test_fallback_launches_in_the_interpreter(rng, launch):
    run_emulated(rng, (1, 2, 70, 64), (1, 1, 70, 64), True, **launch)


def test_fp8_scores_in_the_interpreter(rng):
    """Real FP8 q and k (loads, descriptors, the QK^T product), V in fp16 so that P is not cast to e4m3."""
    q, k, v = randn(rng, 1, 4, 40, 64), randn(rng, 1, 2, 40, 64), randn(rng, 1, 2, 40, 64)
    x = fp8.quantize_fp8(q, k, v)
    o, lse = fp8.run_fp8_forward(x.q, x.k, x.v.to(torch.float16), **x.descales(),
                                 rules=parse_rules(q, k, causal=True), out_dtype=torch.float16)
    o_ref, lse_ref, _ = fp8.reference_forward(*x.dequantized(), causal=True)
    assert_close(o, o_ref, what="o")
    assert_close(lse, lse_ref, dtype="float32", what="lse")


# ------------------------------------------------------------------------------------------ error_bound (CPU)
def kernel_numerics(x: fp8.Fp8QKV, *, acc_bits=13, block_n=128):
    """The FP8 kernels' arithmetic in torch (fp8.py's kernel and fa3_fp8's stages make the same roundings), one KV
    head per query head: scores of the FP8 values summed 32 products a step, the running sum cut to ``acc_bits``
    mantissa bits after each step (Hopper's FP8 wgmma truncates, DeepSeek-V3 section 3.3.2; None: exact), key
    tiles of ``block_n`` with a running max, p * 2^P_SHIFT cast to e4m3 (torch's CPU cast rounds to nearest, unlike
    the interpreter's), float32 sums, bfloat16 output. Returns (o, the weights P V used over the row's final max)."""
    q, k, v = (t.double() for t in (x.q, x.k, x.v))
    s = None
    for c in range(0, q.shape[-1], 32):
        s = q[..., c:c + 32] @ k[..., c:c + 32].transpose(-1, -2) + (0 if s is None else s)  # exact in float64
        if acc_bits is not None:
            mantissa, exponent = torch.frexp(s)
            s = torch.ldexp(torch.trunc(mantissa * 2**acc_bits) / 2**acc_bits, exponent)
    t = s.float() * ((x.q_descale * x.k_descale)[:, :, None, None] / q.shape[-1] ** 0.5 / math.log(2))
    m = torch.full(t.shape[:-1], -torch.inf)
    l, acc, tiles = torch.zeros(t.shape[:-1]), torch.zeros(t.shape[:-1] + v.shape[-1:]), []
    for j in range(0, t.shape[-1], block_n):
        m_new = torch.maximum(m, t[..., j:j + block_n].amax(-1))
        alpha = torch.exp2(m - m_new)
        p = torch.exp2(t[..., j:j + block_n] - (m_new - fp8.P_SHIFT)[..., None])
        p8 = p.to(fp8.FP8).float()
        l = l * alpha + p.sum(-1)
        acc = acc * alpha[..., None] + p8 @ v[..., j:j + block_n, :].float()
        tiles.append((p8, m_new))
        m = m_new
    o = (acc * (x.v_descale[:, :, None, None] / l[..., None])).to(torch.bfloat16)
    weights = torch.cat([p8 * torch.exp2(m_t - m)[..., None] for p8, m_t in tiles], -1) / 2**fp8.P_SHIFT
    return o, weights


def script_inputs(rng, n_q, n_kv, d):
    """benchmarks/gpu_fa3_fp8.py's: N(0, 1) with 4 outlier channels x4 in q and k, quantised (not incoherent)."""
    q, k, v = (randn(rng, 1, 2, n, d, device="cpu") for n in (n_q, n_kv, n_kv))
    channels = (3, 17, 30, 41)
    return fp8.quantize_fp8(with_outlier_channels(q, channels, 4.0), with_outlier_channels(k, channels, 4.0), v)


@pytest.mark.parametrize("n_kv", [1, 16, 64, 200, 1000, 4096])
@pytest.mark.parametrize("d", [64, 128])
def test_error_bound_holds_for_the_kernels_numerics_at_every_n_kv(rng, n_kv, d):
    """Few keys put a row's weight on a few of them, where P's rounding errors do not average out: the bound must
    hold with margin there too, against the reference with P exact and with P rounded (the GPU script's)."""
    x = script_inputs(rng, 512, n_kv, d)
    o, _ = kernel_numerics(x)
    qd, kd, vd = x.dequantized()
    for p_shift in (fp8.P_SHIFT, None):
        o_ref, _, p_abs_v = fp8.reference_forward(qd, kd, vd, p_shift=p_shift)
        bound = fp8.error_bound(o_ref, p_abs_v, float(vd.abs().max()), n_kv)
        ratio = float(((o.double() - o_ref).abs() / bound).max())
        assert ratio < 0.9, f"p_shift={p_shift}: error {ratio:.2f}x the bound"


@pytest.mark.parametrize("n_kv,acc_bits", [(200, None), (16, 13)])
def test_kernel_and_reference_round_p_apart_by_up_to_two_roundings(rng, n_kv, acc_bits):
    """Why error_bound counts P's rounding twice against reference_forward(p_shift=P_SHIFT). Exact scores over two
    key tiles: the first tile's weights were rounded on the running max. One tile, scores cut as the tensor core
    cuts them: weights near a midpoint of e4m3's grid go the other way. Either way some weight lands more than one
    rounding (2^-4) from the reference's, never more than two (2^-3, plus the 2^-7 margin for the scores)."""
    x = script_inputs(rng, 512, n_kv, 64)
    _, weights = kernel_numerics(x, acc_bits=acc_bits)
    qd, kd, _ = x.dequantized()
    s = qd.double() @ kd.double().transpose(-1, -2) / 8
    p = torch.exp(s - s.amax(-1, keepdim=True))
    rounded = (p * 2**fp8.P_SHIFT).to(fp8.FP8).double() / 2**fp8.P_SHIFT
    normal = p >= 2.0 ** -(fp8.P_SHIFT + 6)
    apart = ((weights.double() - rounded).abs() / p)[normal].max()
    assert 2**-4 < apart <= 2**-3 + 2**-7, float(apart)


@pytest.mark.parametrize("n_kv", [200, 4096])
def test_error_bound_catches_wrong_outputs(rng, n_kv):
    """Wrong kernels: one key left out (the heaviest of some row), and the softmax scale applied twice."""
    x = script_inputs(rng, 512, n_kv, 64)
    qd, kd, vd = x.dequantized()
    o_ref, _, p_abs_v = fp8.reference_forward(qd, kd, vd, p_shift=fp8.P_SHIFT)
    bound = fp8.error_bound(o_ref, p_abs_v, float(vd.abs().max()), n_kv)
    s = qd[0, 0].double() @ kd[0, 0].double().T
    heaviest = int(torch.softmax(s / 8, -1).max(-1).values.argmax())  # the row whose top key weighs the most
    keep = [j for j in range(n_kv) if j != int(s[heaviest].argmax())]
    wrong = {"a key left out": fp8.reference_forward(qd, kd[:, :, keep], vd[:, :, keep])[0],
             "scale twice": fp8.reference_forward(qd, kd, vd, scale=1 / 64)[0]}
    for name, o in wrong.items():
        assert ((o - o_ref).abs() > bound).any(), name


# ------------------------------------------------------------------------------------------ refusals (CPU)
@pytest.mark.skipif(HAS_FP8_GPU, reason="this machine has an FP8 GPU")
def test_without_an_fp8_gpu_the_call_says_what_is_needed(rng):
    x = fp8.quantize_fp8(*(randn(rng, 1, 2, 8, 64) for _ in range(3)))
    with pytest.raises(RuntimeError, match=r"compute capability 9\.0 \(Hopper"):
        kernels.flash_attention_forward(x.q, x.k, x.v, **x.descales())


@pytest.mark.parametrize("option,value", [("window", (8, 0)), ("softcap", 30.0), ("alibi_slopes", "slopes"),
                                          ("document_ids", "ids"), ("mask_mod", "fn"), ("version", "v7")])
def test_variant_options_with_fp8_are_refused_by_name(rng, option, value):
    x = fp8.quantize_fp8(*(randn(rng, 1, 2, 8, 64) for _ in range(3)))
    with pytest.raises(ValueError, match=f"not {option}"):
        kernels.flash_attention_forward(x.q, x.k, x.v, **{option: value})


@pytest.mark.parametrize("bad,error,words", [
    (dict(out_dtype=torch.float32), ValueError, "bfloat16 or torch.float16"),
    (dict(k_descale=torch.ones(2, 2)), ValueError, r"expected \(1, 2\) float32"),
    (dict(v_fp16=True), TypeError, "float8_e4m3fn"),
    (dict(head_dim=32), ValueError, "head dim 32"),
])
def test_bad_fp8_inputs_raise_clear_errors(rng, bad, error, words):
    d = bad.pop("head_dim", 64)
    x = fp8.quantize_fp8(*(randn(rng, 1, 2, 8, d) for _ in range(3)))
    v = x.v.float() if bad.pop("v_fp16", False) else x.v
    with pytest.raises(error, match=words):
        kernels.flash_attention_forward(x.q, x.k, v, **bad)


@pytest.mark.parametrize("extra", [dict(q_descale=torch.ones(1, 2)), dict(out_dtype=torch.float16)])
def test_fp8_keywords_with_16_bit_inputs_are_refused(rng, extra):
    q = randn(rng, 1, 2, 8, 64)
    with pytest.raises(ValueError, match="float8_e4m3fn inputs"):
        kernels.flash_attention_forward(q, q, q, **extra)


# ------------------------------------------------------------------------------------------ GPU (Hopper)
def check_fp8_forward(x: fp8.Fp8QKV, *, causal, out_dtype=torch.bfloat16, v=None, **launch):
    """The FP8 kernel against float64 attention of its dequantised inputs, every element within error_bound."""
    o, lse = fp8.flash_attention_forward_fp8(x.q, x.k, x.v if v is None else v, **x.descales(), causal=causal,
                                             out_dtype=out_dtype, **launch)
    q, k, v_deq = x.dequantized()
    o_ref, lse_ref, p_abs_v = fp8.reference_forward(q, k, v_deq, causal=causal)
    assert o.dtype == out_dtype and o.shape == x.q.shape and lse.shape == x.q.shape[:3]
    # The tensor core sums FP8 products keeping about 14 bits of the running sum (DeepSeek-V3, section 3.3.2) and
    # truncates: each of the D / 32 steps of an FP8 wgmma (32 products a step) can cut 2^-13 of scale * sum
    # |q_i k_i| off a score, so lse moves by as much, and each p_j by twice that, relatively. Measured on the H200
    # (benchmarks/results/2026-12-01-nvidia-h200-fp8-lse-accumulation.json): lse
    # errors up to 2^-12.8 (D=64) and 2^-12.0 (D=128) of it, the same at every magnitude, biased low.
    k_rep = k.double().repeat_interleave(q.shape[1] // k.shape[1], 1)
    s_abs = (q.double().abs() @ k_rep.abs().transpose(-1, -2)).amax(-1) / q.shape[-1] ** 0.5  # (B, H, N_q)
    score_error = q.shape[-1] / 32 * 2.0**-13 * s_abs
    bound = fp8.error_bound(o_ref, p_abs_v, v_deq.abs().max().item(), k.shape[2], out_dtype)
    bound = bound + 2 * score_error[..., None] * p_abs_v
    excess = (o.double() - o_ref).abs() - bound
    worst = tuple(int(i) for i in torch.unravel_index(excess.argmax(), excess.shape))
    assert excess.max() <= 0, (f"o at {worst}: {o[worst].item():.5f} vs {o_ref[worst].item():.5f}, bound "
                               f"{bound[worst].item():.4f} (causal={causal}, {launch})")
    finite = torch.isfinite(lse_ref)
    assert torch.equal(torch.isfinite(lse), finite), "rows with no visible key must give lse = -inf"
    assert ((lse.double() - lse_ref).abs() - score_error)[finite].max() < 5e-3
    return o


@pytest.mark.gpu
@needs_fp8_gpu
@pytest.mark.parametrize("n_q,n_kv", [(1, 1), (17, 17), (1000, 1000), (2048, 2048), (300, 1000), (1000, 300)])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [False, True, "bottom_right"])
def test_gpu_fp8_awkward_sizes(rng, n_q, n_kv, d, causal):
    q = randn(rng, 2, 4, n_q, d)
    k, v = randn(rng, 2, 2, n_kv, d), randn(rng, 2, 2, n_kv, d)  # GQA: 2 query heads per KV head
    check_fp8_forward(fp8.quantize_fp8(q, k, v), causal=causal)


@pytest.mark.gpu
@needs_fp8_gpu
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16])
def test_gpu_fp8_descales_per_batch_and_kv_head(rng, out_dtype):
    """Heads and batches of very different magnitudes, each with its own descale; None means 1. (Magnitudes up to
    20 in q and k give scores in the thousands, where the tensor core's truncated ~14-bit sums move lse by up to
    0.85: the bound in check_fp8_forward grows with sum |q_i k_i| for that reason.)"""
    size = torch.tensor(rng.uniform(0.05, 20.0, (2, 2, 1, 1)), dtype=torch.float32, device=DEVICE)
    q = randn(rng, 2, 4, 500, 128) * size.repeat_interleave(2, 1)
    k, v = randn(rng, 2, 2, 500, 128) * size, randn(rng, 2, 2, 500, 128) / size
    x = fp8.quantize_fp8(q, k, v)
    assert len(set(x.v_descale.flatten().tolist())) == 4
    check_fp8_forward(x, causal=True, out_dtype=out_dtype)
    ones = torch.ones_like(x.q_descale)
    plain = x._replace(q_descale=ones, k_descale=ones, v_descale=ones)
    o, _ = fp8.flash_attention_forward_fp8(plain.q, plain.k, plain.v, causal=True)
    torch.testing.assert_close(o, check_fp8_forward(plain, causal=True), atol=0, rtol=0)


@pytest.mark.gpu
@needs_fp8_gpu
def test_gpu_fp8_v_layouts_and_fallback_launches(rng):
    x = fp8.quantize_fp8(randn(rng, 1, 4, 1000, 128), randn(rng, 1, 4, 1000, 128), randn(rng, 1, 4, 1000, 128))
    o = check_fp8_forward(x, causal=True)
    o_kept = check_fp8_forward(x, causal=True, v=fp8.v_keys_contiguous(x.v))  # no copy inside
    assert torch.equal(o, o_kept)
    for launch in (dict(use_descriptors=False), dict(transpose_v=False)):
        check_fp8_forward(x, causal=True, **launch)


@pytest.mark.gpu
@needs_fp8_gpu
def test_gpu_fp8_public_entry_and_incoherent_inputs(rng):
    q, k, v = randn(rng, 2, 4, 1024, 128), randn(rng, 2, 4, 1024, 128), randn(rng, 2, 4, 1024, 128)
    x = fp8.quantize_fp8(q, k, v, incoherent=True)
    o, lse = kernels.flash_attention_forward(x.q, x.k, x.v, **x.descales(), causal=True)
    exact, lse_exact, _ = fp8.reference_forward(q, k, v, causal=True)
    assert o.dtype == torch.bfloat16 and lse.dtype == torch.float32
    assert (o.double() - exact).pow(2).mean().sqrt() < 0.02  # quantised inputs: FP8's rounding of q, k, v and P


# ------------------------------------------------------------------------------------------ compiled for sm_90 (CPU)
SM90_COMPILE = r"""
import json, re, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from flashcourse.kernels.fp8 import _fwd_fp8_kernel as kernel

names = kernel.arg_names
pointers = {"Q": "*fp8e4nv", "K": "*fp8e4nv", "V": "*fp8e4nv", "O": "*bf16", "LSE": "*fp32",
            "Q_DESCALE": "*fp32", "K_DESCALE": "*fp32", "V_DESCALE": "*fp32"}
unit = ("stride_qd", "stride_kd", "stride_od", "stride_vn")  # V stored keys-adjacent: unit stride along N
found = {}
for use_desc in (True, False):
    values = dict(HAS_UPPER=True, USE_DESC=use_desc, V_TRANSPOSED=True, HEAD_DIM=128, BLOCK_D=128, BLOCK_M=128,
                  BLOCK_N=128, P_SHIFT=8, **dict.fromkeys(unit, 1))
    signature = {n: "constexpr" if n in values else pointers.get(n, "fp32" if n == "qk_scale" else "i32")
                 for n in names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names)
             if n in pointers or (n.startswith("stride_") and n not in unit)}
    compiled = triton.compile(ASTSource(kernel, signature, constexprs={(names.index(n),): v for n, v in values.items()},
                                        attrs=attrs),
                              target=GPUTarget("cuda", 90, 32), options={"num_warps": 8, "num_stages": 3})
    ptx = compiled.asm["ptx"]
    found[str(use_desc)] = {"wgmma": sorted(set(re.findall(r"wgmma\.mma_async\S*", ptx))),
                            "cvt_e4m3": "cvt.rn.satfinite.e4m3x2.f32" in ptx, "shared": compiled.metadata.shared}
json.dump(found, sys.stdout)
"""


def test_kernel_compiles_for_sm90_with_fp8_tensor_core_products():
    """Compiled for an H100/H200 without one (this machine's Triton, which may be newer than the GPU machine's):
    both products are FP8 warpgroup MMAs and P is converted with round-to-nearest, with and without TMA."""
    import json
    import os
    import subprocess
    import sys

    pytest.importorskip("triton.backends.nvidia")
    env = {**os.environ, "TRITON_INTERPRET": "0", "PYTHONPATH": child_pythonpath()}
    done = subprocess.run([sys.executable, "-c", SM90_COMPILE], capture_output=True, text=True, env=env, timeout=600)
    no_ptxas = "ptxas" in done.stderr and ("not found" in done.stderr or "No such file" in done.stderr)
    if done.returncode != 0 and no_ptxas:
        pytest.skip("Triton's ptxas is missing here: cannot compile for sm_90")
    assert done.returncode == 0, f"the FP8 kernel does not compile for sm_90:\n{done.stderr[-3000:]}"
    found = json.loads(done.stdout.strip().splitlines()[-1])
    for use_desc, what in found.items():
        assert what["wgmma"] and all("e4m3.e4m3" in w for w in what["wgmma"]), (use_desc, what)
        assert what["cvt_e4m3"] and what["shared"] <= 227 * 1024, (use_desc, what)
