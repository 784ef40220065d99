"""Attention variants (lesson 11) in the kernels: forward v7 and backward b3 against a float64 reference.

The reference below is written here from the rules (rules.py's docstring), with every mask built explicitly as
an (N_q, N_k) boolean array, and differentiated by torch's autograd in float64. Sizes are small and awkward for
the interpreter: N not a multiple of the tiles (32 x 16 forward), N = 1, N_q != N_k both ways for both causal
alignments, rows that see no key. The tests marked ``gpu`` repeat them at real sizes in fp16 and bf16.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from flashcourse import device  # noqa: E402

if not device.triton_available():
    pytest.skip("Triton is not installed here", allow_module_level=True)
import triton  # noqa: E402
import triton.language as tl  # noqa: E402, F401  (Triton wants it in scope of every jit function, mask_mods too)
from variant_spec import dense_keep, diagonal  # noqa: E402

from flashcourse import kernels  # noqa: E402
from flashcourse.kernels import blockmask, rules  # noqa: E402
from flashcourse.tolerance import assert_close  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


# ------------------------------------------------------------------------------------------ mask_mods
# Each Triton mask_mod has a NumPy twin for the reference (same formula, arrays of b, h, i, j).
@triton.jit
def stripes(b, h, q_idx, kv_idx):
    """Key blocks of 16 alternate between visible and hidden, shifted by one block on odd heads: whole empty and
    whole full tiles (tests that the block mask skips and unmasks them), different per head."""
    return (kv_idx // 16 + h) % 2 == 0


@triton.jit
def every_third(b, h, q_idx, kv_idx):
    """A fine-grained rule (every tile partial) that depends on the batch index."""
    return (q_idx + kv_idx + b) % 3 != 0


@triton.jit
def late_keys_only(b, h, q_idx, kv_idx):
    return kv_idx >= 64


MASK_MOD_TWINS = {
    stripes: lambda b, h, i, j: (j // 16 + h) % 2 == 0,
    every_third: lambda b, h, i, j: (i + j + b) % 3 != 0,
    late_keys_only: lambda b, h, i, j: j >= 64,
}


# ------------------------------------------------------------------------------------------ reference
def visible_mask(batch, heads, n_q, n_kv, *, causal=False, window=None, document_ids=None, mask_mod=None):
    """(B, H, N_q, N_k) bool: the rules written out (variant_spec, shared with the NumPy-side tests), and a
    mask_mod through its NumPy twin."""
    extra = None
    if mask_mod is not None:
        b = np.arange(batch)[:, None, None, None]
        h = np.arange(heads)[None, :, None, None]
        extra = MASK_MOD_TWINS[mask_mod](b, h, np.arange(n_q)[:, None], np.arange(n_kv)[None, :])
    ids = None if document_ids is None else document_ids.cpu().numpy()
    return dense_keep(batch, heads, n_q, n_kv, causal=causal, window=window, document_ids=ids, extra=extra)


def reference(q, k, v, *, scale=None, causal=False, window=None, softcap=None, alibi_slopes=None,
              document_ids=None, mask_mod=None):
    """(o, lse) in float64 from the rules; differentiable (torch autograd) in q, k, v. No visible key: 0, -inf."""
    batch, heads, n_q, head_dim = q.shape
    n_kv = k.shape[2]
    group = heads // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)  # (B, H_q, N_k, D)
    scale = head_dim ** -0.5 if scale is None else scale
    s = scale * q @ k.transpose(-1, -2)
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    if alibi_slopes is not None:
        distance = (torch.arange(n_q)[:, None] + diagonal(n_q, n_kv, causal) - torch.arange(n_kv)[None, :]).abs()
        distance = distance.to(s.device)
        s = s - alibi_slopes.to(s)[None, :, None, None] * distance
    keep = visible_mask(batch, heads, n_q, n_kv, causal=causal, window=window, document_ids=document_ids,
                        mask_mod=mask_mod).to(s.device)
    seen = keep.any(-1, keepdim=True)
    s = torch.where(keep, s, float("-inf"))
    s = torch.where(seen, s, 0.0)  # rows with no visible key: a finite dummy row, zeroed below
    p = torch.softmax(s, dim=-1) * seen
    lse = torch.where(seen[..., 0], torch.logsumexp(s, dim=-1), float("-inf"))
    return p @ v, lse


# ------------------------------------------------------------------------------------------ checks
def make(rng, batch, heads, heads_kv, n_q, n_kv, head_dim, dtype=torch.float32):
    shapes = [(batch, heads, n_q, head_dim), (batch, heads_kv, n_kv, head_dim), (batch, heads_kv, n_kv, head_dim),
              (batch, heads, n_q, head_dim)]
    return [torch.tensor(rng.standard_normal(s), dtype=dtype, device=DEVICE) for s in shapes]


def check_variant(rng, shape, options, *, dtype=torch.float32, grads=True):
    """Forward (o, lse) and gradients (dq, dk, dv) of the default kernels against the float64 reference."""
    q, k, v, do = make(rng, *shape, dtype=dtype)
    gqa = {"enable_gqa": q.shape[1] != k.shape[1]}  # asked for, as SDPA requires
    o, lse = kernels.flash_attention_forward(q, k, v, **options, **gqa)
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]  # float64 where q is (GPU: fast)
    o_ref, lse_ref = reference(*leaves, **options)
    what = f"{options} {shape}"
    assert_close(o, o_ref.detach().cpu().numpy(), what=f"o {what}")
    assert_close(lse, lse_ref.detach().cpu().numpy(), dtype="float32" if dtype == torch.float32 else dtype,
                 what=f"lse {what}")
    if not grads:
        return
    for t in (q, k, v):
        t.requires_grad_(True)
    kernels.flash_attention(q, k, v, **options, **gqa).backward(do)
    o_ref.backward(do.detach().double())
    for name, t, leaf in zip(("dq", "dk", "dv"), (q, k, v), leaves, strict=True):
        assert t.grad.shape == t.shape and t.grad.dtype == t.dtype
        ref = leaf.grad.cpu().numpy()
        norm = max(1.0, float(np.abs(ref).max()))  # gradients sum many products: compare at their own scale
        assert_close(t.grad.double().cpu() / norm, ref / norm, dtype=dtype, what=f"{name} {what}")


def slopes(heads):
    """ALiBi's geometric slopes 2^(-8 h / H) (Press et al. 2022, section 3), here for any head count."""
    return torch.tensor([2.0 ** (-8.0 * (h + 1) / heads) for h in range(heads)], dtype=torch.float32, device=DEVICE)


def docs(batch, n, lengths):
    """(B, N) int32 document ids: consecutive documents of the given lengths, the same packing per batch row."""
    ids = np.repeat(np.arange(len(lengths)), lengths)[:n]
    return torch.tensor(np.tile(ids, (batch, 1)), dtype=torch.int32, device=DEVICE)


# (B, H_q, H_kv, N_q, N_k, D), options. Forward tiles are 32 x 16 in the interpreter.
CASES = {
    "gqa dense": ((1, 4, 2, 37, 37, 16), {}),
    "mqa causal": ((2, 3, 1, 21, 21, 32), {"causal": True}),
    "top-left, fewer queries": ((1, 2, 2, 20, 45, 16), {"causal": "top_left"}),
    "top-left, more queries": ((1, 2, 2, 45, 20, 16), {"causal": True}),
    "bottom-right, fewer queries": ((1, 2, 2, 20, 45, 16), {"causal": "bottom_right"}),
    "bottom-right, more queries (empty rows)": ((1, 2, 1, 45, 20, 16), {"causal": "bottom_right"}),
    "window both sides": ((1, 2, 2, 50, 50, 16), {"window": (5, 3)}),
    "window left only, odd head dim": ((1, 2, 2, 70, 70, 80), {"window": (20, -1)}),
    "window right only, N_q < N_k": ((1, 2, 2, 33, 50, 16), {"window": (-1, 4)}),
    "window + gqa + causal": ((1, 4, 2, 70, 70, 32), {"window": (17, 6), "causal": True}),
    # One diagonal per call: the window and ALiBi measure from the causal alignment's diagonal (bottom-right
    # without causal), for N_q < N_k (a chunk after a cache) and N_q > N_k, each alignment.
    "window + top-left causal, N_q < N_k": ((1, 2, 2, 20, 60, 16), {"window": (9, 0), "causal": True}),
    "window + bottom-right causal, N_q < N_k": ((1, 2, 2, 20, 60, 16), {"window": (9, 0), "causal": "bottom_right"}),
    "window + top-left causal, N_q > N_k": ((1, 2, 2, 45, 20, 16), {"window": (6, 2), "causal": "top_left"}),
    "window, no causal, N_q > N_k (empty rows)": ((1, 2, 2, 45, 20, 16), {"window": (6, 2)}),
    "alibi + top-left causal, N_q < N_k": ((1, 2, 2, 19, 41, 16), {"alibi_slopes": slopes(2), "causal": True}),
    "alibi + bottom-right causal, N_q > N_k": ((1, 2, 1, 41, 19, 16),
                                               {"alibi_slopes": slopes(2), "causal": "bottom_right"}),
    "one query": ((1, 2, 1, 1, 30, 16), {"window": (10, 0), "causal": "bottom_right"}),
    "softcap": ((1, 2, 2, 40, 40, 16), {"softcap": 0.5, "scale": 1.0}),
    "alibi + causal": ((1, 4, 2, 40, 40, 16), {"alibi_slopes": slopes(4), "causal": True}),
    "alibi, N_q < N_k": ((1, 2, 2, 19, 41, 16), {"alibi_slopes": slopes(2)}),
    "documents + causal + softcap": ((2, 2, 2, 70, 70, 16),
                                     {"document_ids": docs(2, 70, [30, 1, 25, 14]), "causal": True, "softcap": 1.0}),
    "mask_mod stripes + causal": ((1, 2, 2, 64, 64, 16), {"mask_mod": stripes, "causal": True}),
    "mask_mod every third + gqa": ((2, 4, 2, 37, 37, 16), {"mask_mod": every_third}),
    "head dim 256 + window": ((1, 2, 1, 40, 40, 256), {"window": (7, 0)}),
}


@pytest.mark.parametrize("name", list(CASES))
def test_variant_matches_reference(rng, name):
    shape, options = CASES[name]
    check_variant(rng, shape, options)


@pytest.mark.slow
@pytest.mark.parametrize("options", [{"window": (0, 0)}, {"causal": "bottom_right", "window": (3, 3)},
                                     {"softcap": 2.0, "alibi_slopes": slopes(2), "window": (12, 2)},
                                     {"document_ids": docs(1, 53, [10, 40, 3]), "mask_mod": every_third}])
def test_more_combinations(rng, options):
    check_variant(rng, (1, 2, 2, 53, 53, 16), options)


def test_rows_that_see_nothing_give_zero_and_minus_inf(rng):
    q, k, v, _ = make(rng, 1, 2, 2, 30, 10, 16)
    o, lse = kernels.flash_attention_forward(q, k, v, causal="bottom_right")
    assert torch.all(o[:, :, :20] == 0) and torch.all(torch.isneginf(lse[:, :, :20]))
    assert torch.isfinite(lse[:, :, 20:]).all()


# ------------------------------------------------------------------------------------------ skipping
def poison(t, rows):
    """t with NaN in the given key rows: any kernel that loads them and uses them turns its output to NaN."""
    t = t.clone()
    t[:, :, rows] = float("nan")
    return t


def test_window_never_loads_tiles_left_of_it(rng):
    """32 queries at key positions 96..127 with window (16, 0) see keys 80..127: keys 0..63 (whole tiles) must
    never be loaded, in the forward and in both backward kernels (their dK and dV are exactly 0)."""
    q, k, v, do = make(rng, 1, 2, 1, 32, 128, 16)
    k, v = poison(k, slice(0, 64)), poison(v, slice(0, 64))
    for t in (q, k, v):
        t.requires_grad_(True)
    o = kernels.flash_attention(q, k, v, window=(16, 0), enable_gqa=True)
    o.backward(do)
    clean = [t.detach().clone() for t in (q, k, v)]
    clean[1][:, :, :64] = 0.0
    clean[2][:, :, :64] = 0.0
    o_ref, _ = reference(*(t.cpu().double() for t in clean), window=(16, 0))
    assert_close(o, o_ref.numpy(), what="o with poisoned, invisible key tiles")
    assert torch.isfinite(q.grad).all()
    assert torch.all(k.grad[:, :, :64] == 0) and torch.all(v.grad[:, :, :64] == 0)


def test_block_mask_never_loads_empty_tiles(rng):
    """mask_mod hides keys 0..63 from every query: those tiles are empty in the block mask and never loaded."""
    q, k, v, do = make(rng, 1, 2, 2, 40, 96, 16)
    k, v = poison(k, slice(0, 64)), poison(v, slice(0, 64))
    for t in (q, k, v):
        t.requires_grad_(True)
    o = kernels.flash_attention(q, k, v, mask_mod=late_keys_only)
    o.backward(do)
    assert torch.isfinite(o).all() and torch.isfinite(q.grad).all()
    assert torch.all(k.grad[:, :, :64] == 0) and torch.all(v.grad[:, :, :64] == 0)


def test_block_mask_kinds():
    """The tile classifier: stripes give whole empty and whole full tiles, the causal diagonal partial ones."""
    kinds = blockmask.tile_kinds(rules.Rules(causal="top_left", mask_mod=stripes), 1, 2, 64, 64, 16, 16, DEVICE)
    assert kinds.shape == (1, 2, 4, 4)
    head0 = kinds[0, 0].cpu().numpy()
    # key tiles 0 and 2 are visible on head 0; below the diagonal full, on it partial, above it empty
    expected = np.array([[1, 0, 0, 0], [2, 0, 0, 0], [2, 0, 1, 0], [2, 0, 2, 0]])
    np.testing.assert_array_equal(head0, expected)
    lists = blockmask.tile_lists(kinds)
    assert lists.full_counts[0, 0].tolist() == [0, 1, 1, 2]
    assert lists.full_tiles[0, 0, 3, :2].tolist() == [0, 2]
    assert lists.partial_counts[0, 0].tolist() == [1, 0, 1, 0]


def test_documents_classify_cross_document_tiles_empty():
    ids = docs(1, 64, [16, 32, 16])
    kinds = blockmask.tile_kinds(rules.Rules(document_ids=ids), 1, 1, 64, 64, 16, 16, DEVICE)[0, 0].cpu().numpy()
    expected = np.array([[2, 0, 0, 0], [0, 2, 2, 0], [0, 2, 2, 0], [0, 0, 0, 2]])
    np.testing.assert_array_equal(kinds, expected)


def test_plain_call_parses_to_a_shared_constant():
    """Every option None: the checks return a constant after a few `is None` tests, nothing allocated."""
    q = torch.zeros(1, 1, 4, 16)
    assert rules.parse_rules(q, q) is rules.DENSE
    assert rules.parse_rules(q, q, causal=True) is rules.TOP_LEFT_CAUSAL
    assert rules.parse_rules(q, q, window=(-1, -1)).window is None


def test_defaults_support_every_option():
    assert kernels.DEFAULT_FORWARD == "v7" and kernels.FORWARD_VERSIONS["v7"].takes_rules
    assert kernels.DEFAULT_BACKWARD == "b3" and kernels.BACKWARD_VERSIONS["b3"].takes_rules


def test_dense_v7_and_b3_agree_with_v6_and_b1(rng):
    q, k, v, do = make(rng, 1, 2, 2, 45, 45, 32)
    for causal in (False, True):
        o6, lse6 = kernels.flash_attention_forward(q, k, v, causal=causal, version="v6")
        o7, lse7 = kernels.flash_attention_forward(q, k, v, causal=causal, version="v7")
        assert_close(o7, o6.double().numpy(), what=f"v7 vs v6, causal={causal}")
        g1 = kernels.flash_attention_backward(q, k, v, o6, lse6, do, causal=causal, version="b1")
        g3 = kernels.flash_attention_backward(q, k, v, o7, lse7, do, causal=causal, version="b3")
        for name, a, b in zip(("dq", "dk", "dv"), g3, g1, strict=True):
            assert_close(a, b.double().numpy(), what=f"b3 vs b1 {name}, causal={causal}")


# ------------------------------------------------------------------------------------------ bad input
@pytest.mark.parametrize(
    "options,error,words",
    [
        ({"window": 5}, TypeError, r"window is 5 \(int\): expected a \(left, right\) pair of ints"),
        ({"window": (1.5, 0)}, TypeError, "pair of ints"),
        ({"window": (4, 0, 1)}, TypeError, "pair of ints"),
        ({"window": (-2, 0)}, ValueError, ">= -1"),
        ({"softcap": 0.0}, ValueError, "softcap is 0.0: expected a finite number > 0"),
        ({"softcap": -3}, ValueError, "> 0"),
        ({"softcap": "30"}, TypeError, "positive number"),
        ({"alibi_slopes": torch.ones(3)}, ValueError, r"alibi_slopes has shape \(3,\).*expected \(4,\) float32"),
        ({"alibi_slopes": torch.ones(4, dtype=torch.float64)}, ValueError, "float32"),
        ({"alibi_slopes": [0.5] * 4}, TypeError, "torch.Tensor"),
        ({"document_ids": torch.zeros(2, 7, dtype=torch.int32)}, ValueError, r"expected \(2, 8\) int32"),
        ({"document_ids": torch.zeros(2, 8)}, ValueError, "document_ids has shape .* torch.float32"),
        ({"causal": "upper"}, ValueError, "causal is 'upper': expected one of"),
        ({"causal": 1}, ValueError, "causal is 1"),
        ({"mask_mod": lambda b, h, i, j: True}, TypeError, "@triton.jit"),
    ],
)
def test_bad_options_raise_clear_errors(rng, options, error, words):
    q, k, v, _ = make(rng, 2, 4, 2, 8, 8, 16)
    options = {name: value.to(DEVICE) if isinstance(value, torch.Tensor) else value
               for name, value in options.items()}
    with pytest.raises(error, match=words):
        kernels.flash_attention_forward(q, k, v, **options, enable_gqa=True)
    with pytest.raises(error, match=words):
        kernels.flash_attention(q, k, v, **options, enable_gqa=True)


def test_documents_need_as_many_queries_as_keys(rng):
    q, k, v, _ = make(rng, 1, 2, 2, 8, 12, 16)
    with pytest.raises(ValueError, match="N_q = 8 and N_k = 12"):
        kernels.flash_attention_forward(q, k, v, document_ids=torch.zeros(1, 8, dtype=torch.int32, device=DEVICE))


def test_heads_must_divide(rng):
    q, k, v, _ = make(rng, 1, 3, 2, 8, 8, 16)
    with pytest.raises(ValueError, match="H_q must be a multiple of H_kv"):
        kernels.flash_attention_forward(q, k, v)


@pytest.mark.parametrize(
    "options,missing",
    [({"window": (4, 0)}, "sliding window"), ({"softcap": 5.0}, "softcap"), ({"causal": "bottom_right"},
     "bottom-right causal"), ({"mask_mod": stripes}, "mask_mod"), ({"alibi_slopes": "slopes"}, "ALiBi")],
)
def test_numbered_versions_refuse_what_they_lack(rng, options, missing):
    q, k, v, do = make(rng, 1, 2, 2, 8, 12, 16)
    options = {n: slopes(2) if o == "slopes" else o for n, o in options.items()}
    with pytest.raises(ValueError, match=f"forward version v3 has no {missing}.*the default, v7, runs every"):
        kernels.flash_attention_forward(q, k, v, version="v3", **options)
    o, lse = kernels.flash_attention_forward(q, k, v, **options)
    with pytest.raises(ValueError, match=f"backward version b1 has no {missing}.*the default, b3, runs every"):
        kernels.flash_attention_backward(q, k, v, o, lse, do, version="b1", **options)
    # explain names no route the call would refuse, and flash_attention refuses a backward it lacks at the call,
    # before its forward runs, not first inside .backward()
    for versions in ({"forward_version": "v3"}, {"backward_version": "b1"}):
        with pytest.raises(ValueError, match=f"has no {missing}"):
            kernels.explain(q, k, v, **versions, **options)
        with pytest.raises(ValueError, match=f"has no {missing}"):
            kernels.flash_attention(q.requires_grad_(), k, v, **versions, **options)


def test_numbered_versions_refuse_grouped_query_attention(rng):
    q, k, v, _ = make(rng, 1, 4, 2, 8, 8, 16)
    with pytest.raises(ValueError, match="v6 has no grouped-query attention"):
        kernels.flash_attention_forward(q, k, v, version="v6", enable_gqa=True)


# ------------------------------------------------------------------------------------------ GPU
GPU_CASES = {
    "causal N=2000": ((2, 8, 8, 2000, 2000, 128), {"causal": True}),
    "gqa 8/2 causal, bottom-right N_q < N_k": ((2, 8, 2, 700, 2000, 128), {"causal": "bottom_right"}),
    "window (256, 0) + gqa": ((1, 8, 2, 3000, 3000, 128), {"window": (256, 0), "causal": True}),
    "window (300, 100)": ((1, 4, 4, 2500, 2500, 64), {"window": (300, 100)}),
    "softcap 30 causal": ((2, 4, 4, 2000, 2000, 128), {"softcap": 30.0, "causal": True}),
    "alibi + causal": ((1, 8, 8, 1500, 1500, 64), {"alibi_slopes": "slopes", "causal": True}),
    "documents + causal + softcap": ((2, 4, 4, 3000, 3000, 128),
                                     {"document_ids": "docs", "causal": True, "softcap": 20.0}),
    "mask_mod stripes": ((1, 4, 2, 1000, 1000, 64), {"mask_mod": stripes}),
    "head dim 256, causal": ((1, 4, 4, 1500, 1500, 256), {"causal": True}),
    "head dim 256, window": ((1, 4, 2, 1500, 1500, 256), {"window": (200, 0)}),
}


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", list(GPU_CASES))
def test_gpu_variants_real_sizes(rng, name, dtype):
    shape, options = GPU_CASES[name]
    batch, heads, _, n, _, _ = shape
    fill = {"slopes": lambda: slopes(heads), "docs": lambda: docs(batch, n, rng.multinomial(n, [1 / 5] * 5))}
    options = {k: fill[o]() if isinstance(o, str) and o in fill else o for k, o in options.items()}
    check_variant(rng, shape, options, dtype=dtype)


def test_cross_check_with_the_numpy_reference_when_it_has_the_options(rng):
    """When flashcourse.reference.attention accepts the options (lesson 11's side), the two references agree."""
    import inspect

    from flashcourse import reference as numpy_reference

    if "window" not in inspect.signature(numpy_reference.attention_lse).parameters:
        pytest.skip("reference.attention_lse does not take the variant options yet")
    ids = np.repeat([0, 1, 2], [10, 15, 5])[None]
    for n_kv, numpy_options, torch_options in [
        (40, {"causal": "bottom_right", "window": (6, 2), "softcap": 3.0}, {}),
        (30, {"causal": True, "alibi_slopes": np.array([0.5, 0.25]), "document_ids": ids},
         {"alibi_slopes": torch.tensor([0.5, 0.25]), "document_ids": torch.tensor(ids)}),
    ]:
        q, k, v, _ = make(rng, 1, 2, 2, 30, n_kv, 16)
        o, lse = numpy_reference.attention_lse(*(t.cpu().double().numpy() for t in (q, k, v)), **numpy_options)
        o_ref, lse_ref = reference(*(t.cpu().double() for t in (q, k, v)), **{**numpy_options, **torch_options})
        np.testing.assert_allclose(o, o_ref.numpy(), rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(lse, lse_ref.numpy(), rtol=1e-9, atol=1e-12)


def test_the_default_backward_runs_b1_where_b1_can():
    """b3 measured slower than b1 on dense calls: the default keeps b1 unless the call needs b3's rules."""
    q = torch.zeros(1, 4, 8, 16, device=DEVICE)
    grouped = torch.zeros(1, 2, 8, 16, device=DEVICE)
    assert kernels.explain(q, q, q, causal=True).backward == "b1"
    assert kernels.explain(q, grouped, grouped, enable_gqa=True).backward == "b3"
    assert kernels.explain(q, q, q, window=(4, 0)).backward == "b3"
    assert kernels.explain(q, q, q, backward_version="b3").backward == "b3"
