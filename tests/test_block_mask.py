"""A block mask built once (``kernels.create_block_mask``) and passed as ``block_mask=``: the same outputs and
gradients as a call that builds its own tile lists, checked against the float64 spec (variant_spec.py) over two
training steps; no tile classified again while it is passed; clear errors when it does not fit the call; a repr
whose tile counts agree with the rule written out. Interpreter sizes: tiles 32 x 16 forward and dQ, 16 x 32 dK/dV.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from flashcourse import device  # noqa: E402

if not device.triton_available():
    pytest.skip("Triton is not installed here", allow_module_level=True)
import triton  # noqa: E402
import triton.language as tl  # noqa: E402, F401  (Triton wants it in scope of every jit function, mask_mods too)
from variant_spec import dense_keep, torch_attention  # noqa: E402

from flashcourse import kernels  # noqa: E402
from flashcourse.kernels import blockmask, configs, forward, rules  # noqa: E402
from flashcourse.tolerance import assert_close  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@triton.jit
def prefix_lm(b, h, q_idx, kv_idx):
    """The first 20 positions are seen by every query (a prompt), the rest causally: the same on every row."""
    return (kv_idx <= q_idx) | (kv_idx < 20)


@triton.jit
def head_stripes(b, h, q_idx, kv_idx):
    """Key blocks of 16 visible on alternate heads: whole empty and whole full tiles, different per head."""
    return (kv_idx // 16 + h) % 2 == 0


@triton.jit
def per_row(b, h, q_idx, kv_idx):
    """Depends on the batch row: row b hides the keys j with (j + b) % 3 == 0."""
    return (kv_idx + b) % 3 != 0


TWINS = {  # each mask_mod's NumPy twin, for the spec
    prefix_lm: lambda b, h, i, j: (j <= i) | (j < 20),
    head_stripes: lambda b, h, i, j: (j // 16 + h) % 2 == 0,
    per_row: lambda b, h, i, j: (j + b) % 3 != 0,
}


def docs(batch, lengths) -> torch.Tensor:
    ids = np.repeat(np.arange(len(lengths)), lengths)
    return torch.tensor(np.tile(ids, (batch, 1)), dtype=torch.int64, device=DEVICE)


# (B, H_q, H_kv, N_q, N_kv, D), the call's mask options, create_block_mask's B and H (None: broadcast)
CASES = {
    "documents + causal, GQA, N not a multiple of the tiles": (
        (2, 4, 2, 70, 70, 16), {"document_ids": "docs", "causal": True}, (2, None)),
    "mask_mod per head + causal": ((1, 4, 4, 50, 50, 16), {"mask_mod": head_stripes, "causal": True}, (1, 4)),
    "mask_mod per batch row, GQA, N_q != N_kv": ((2, 4, 1, 37, 45, 16), {"mask_mod": per_row}, (2, 4)),
    "mask_mod broadcast over B and H, bottom-right, N_q < N_kv": (
        (2, 2, 2, 30, 75, 16), {"mask_mod": prefix_lm, "causal": "bottom_right"}, (None, None)),
    "documents + mask_mod + window": (
        (1, 2, 2, 64, 64, 16), {"document_ids": "docs", "mask_mod": prefix_lm, "window": (24, 3)}, (None, 2)),
}


def make(rng, batch, heads, heads_kv, n_q, n_kv, head_dim):
    shapes = [(batch, heads, n_q, head_dim), (batch, heads_kv, n_kv, head_dim), (batch, heads_kv, n_kv, head_dim),
              (batch, heads, n_q, head_dim)]
    return [torch.tensor(rng.standard_normal(s), dtype=torch.float32, device=DEVICE) for s in shapes]


def options_of(shape, options) -> dict:
    batch, n = shape[0], shape[3]
    return {k: docs(batch, [n // 3, 1, n - n // 3 - 1]) if v == "docs" else v for k, v in options.items()}


def spec(q, k, v, do, options):
    """o, lse and (dq, dk, dv) in float64 from the rule written out, a mask_mod through its NumPy twin."""
    batch, heads, n_q, _ = q.shape
    n_kv = k.shape[2]
    extra = None
    if options.get("mask_mod") is not None:
        b, h = np.arange(batch)[:, None, None, None], np.arange(heads)[None, :, None, None]
        extra = TWINS[options["mask_mod"]](b, h, np.arange(n_q)[:, None], np.arange(n_kv)[None, :])
    ids = options.get("document_ids")
    return torch_attention(*(t.cpu().numpy() for t in (q, k, v)), causal=options.get("causal", False),
                           window=options.get("window"), document_ids=None if ids is None else ids.cpu().numpy(),
                           extra=extra, do=do.cpu().numpy())


def step(q, k, v, do, **call):
    """One training step's attention: o and the gradients of (o * do).sum() in q, k, v."""
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    o = kernels.flash_attention(*leaves, **call, enable_gqa=True)
    o.backward(do)
    return o.detach(), [t.grad for t in leaves]


def build(shape, options, batch_heads, **extra):
    _, _, _, n_q, n_kv, head_dim = shape
    mask_options = {k: v for k, v in options.items() if k != "mask_mod"}
    return kernels.create_block_mask(options.get("mask_mod"), *batch_heads, n_q, n_kv, head_dim=head_dim,
                                     dtype=torch.float32, device=DEVICE, **mask_options, **extra)


@pytest.mark.parametrize("name", list(CASES))
def test_prebuilt_mask_gives_the_per_call_results_over_two_steps(rng, name):
    shape, options, batch_heads = CASES[name]
    options = options_of(shape, options)
    bm = build(shape, options, batch_heads)
    for _ in range(2):  # two training steps, new inputs, one block mask
        q, k, v, do = make(rng, *shape)
        o_ref, lse_ref, grads_ref = spec(q, k, v, do, options)
        o, grads = step(q, k, v, do, block_mask=bm)
        o_call, grads_call = step(q, k, v, do, **options)
        assert torch.equal(o, o_call), "the same lists, the same kernels: the same bits"
        assert_close(o, o_ref, what=f"o with block_mask, {name}")
        for what, g, g_call, g_ref in zip(("dq", "dk", "dv"), grads, grads_call, grads_ref, strict=True):
            assert torch.equal(g, g_call), what
            norm = max(1.0, float(np.abs(g_ref).max()))
            assert_close(g.double().cpu() / norm, g_ref / norm, dtype="float32", what=f"{what}, {name}")
        _, lse = kernels.flash_attention_forward(q, k, v, block_mask=bm, enable_gqa=True)
        assert_close(lse, lse_ref, dtype="float32", what=f"lse with block_mask, {name}")


def test_forward_and_backward_functions_take_the_block_mask(rng):
    shape, options, batch_heads = CASES["mask_mod per head + causal"]
    bm = build(shape, options, batch_heads)
    q, k, v, do = make(rng, *shape)
    o, lse = kernels.flash_attention_forward(q, k, v, block_mask=bm, enable_gqa=True)
    o_call, lse_call = kernels.flash_attention_forward(q, k, v, **options, enable_gqa=True)
    assert torch.equal(o, o_call) and torch.equal(lse, lse_call)
    grads = kernels.flash_attention_backward(q, k, v, o, lse, do, block_mask=bm, enable_gqa=True)
    grads_call = kernels.flash_attention_backward(q, k, v, o, lse, do, **options, enable_gqa=True)
    assert all(torch.equal(a, b) for a, b in zip(grads, grads_call, strict=True))


def test_the_lists_are_built_once(rng, monkeypatch):
    """Building classifies each tile shape once: 32 x 16 (the forward's and dQ's) and 16 x 32 (dK/dV's, read
    transposed). With block_mask no step classifies a tile again; without, every step does three times."""
    calls = []
    real = blockmask.tile_kinds
    monkeypatch.setattr(blockmask, "tile_kinds", lambda *a, **kw: calls.append(a[5:7]) or real(*a, **kw))
    shape, options, batch_heads = CASES["documents + causal, GQA, N not a multiple of the tiles"]
    options = options_of(shape, options)
    bm = build(shape, options, batch_heads)
    assert sorted(calls) == [(16, 32), (32, 16)]
    calls.clear()
    q, k, v, do = make(rng, *shape)
    for _ in range(2):
        step(q, k, v, do, block_mask=bm)
        kernels.flash_attention(q, k, v, block_mask=bm, enable_gqa=True)  # inference
    assert calls == []
    step(q, k, v, do, **options)
    assert sorted(calls) == [(16, 32), (32, 16), (32, 16)]


def test_the_call_may_repeat_the_options(rng):
    """The same options given again (document ids as another tensor of the same ids) are accepted."""
    shape, options, batch_heads = CASES["documents + causal, GQA, N not a multiple of the tiles"]
    options = options_of(shape, options)
    bm = build(shape, options, batch_heads)
    q, k, v, _ = make(rng, *shape)
    same = {"document_ids": options["document_ids"].clone(), "causal": "top_left"}
    assert torch.equal(kernels.flash_attention(q, k, v, block_mask=bm, **same, enable_gqa=True),
                       kernels.flash_attention(q, k, v, **options, enable_gqa=True))


def test_a_launch_at_other_tiles_builds_its_lists_once(rng):
    """A step-down (or an explicit launch) to tiles the mask was not built for builds them on first use."""
    shape, options, batch_heads = CASES["mask_mod per head + causal"]
    bm = build(shape, options, batch_heads)
    q, k, v, _ = make(rng, *shape)
    call_rules = rules.parse_rules(q, k, **options)
    smaller = configs.KernelConfig(16, 16, 4, 1)
    o, _ = forward.run_forward(forward.FORWARD_VERSIONS["v7"], q, k, v, scale=None, rules=call_rules,
                               config=smaller, block_mask=bm)
    assert (16, 16, False) in bm.lists and "16x16 tiles per query tile (a step-down)" in repr(bm)
    assert torch.allclose(o, kernels.flash_attention(q, k, v, **options, enable_gqa=True), atol=1e-6)


# ------------------------------------------------------------------------------------------ errors
@pytest.fixture
def documents_mask():
    shape, options, batch_heads = CASES["documents + causal, GQA, N not a multiple of the tiles"]
    options = options_of(shape, options)
    return shape, options, build(shape, options, batch_heads)


@pytest.mark.parametrize("change,words", [
    ({"n": 60}, r"N_q = 60 where the block mask has 70, N_kv = 60 where the block mask has 70.*"
                r"create_block_mask\(\.\.\., B=2, H=4, N_q=60, N_kv=60\)"),
    ({"batch": 3}, r"B = 3 where the block mask has 2"),
])
def test_wrong_shapes_raise(rng, documents_mask, change, words):
    shape, _, bm = documents_mask
    batch, heads, heads_kv, n, _, head_dim = shape
    batch, n = change.get("batch", batch), change.get("n", n)
    q, k, v, _ = make(rng, batch, heads, heads_kv, n, n, head_dim)
    with pytest.raises(ValueError, match=words):
        kernels.flash_attention(q, k, v, block_mask=bm, enable_gqa=True)


def test_the_heads_of_a_per_head_mask_must_match(rng):
    shape, options, batch_heads = CASES["mask_mod per head + causal"]
    bm = build(shape, options, batch_heads)
    q, k, v, _ = make(rng, 1, 2, 2, 50, 50, 16)
    with pytest.raises(ValueError, match="H = 2 where the block mask has 4"):
        kernels.flash_attention_forward(q, k, v, block_mask=bm, enable_gqa=True)


@pytest.mark.parametrize("given,words", [
    ({"causal": "bottom_right"}, "built with causal='top_left', but this call passes causal='bottom_right'"),
    ({"mask_mod": prefix_lm}, "built with mask_mod=None, but this call passes mask_mod=prefix_lm"),
    ({"window": (4, 0)}, r"built with window=None, but this call passes window=\(4, 0\)"),
    ({"document_ids": "other"}, "built from other document_ids than this call passes"),
])
def test_other_rules_raise(rng, documents_mask, given, words):
    shape, options, bm = documents_mask
    q, k, v, do = make(rng, *shape)
    if given.get("document_ids") == "other":
        given = {"document_ids": torch.zeros_like(options["document_ids"])}
    with pytest.raises(ValueError, match=words):
        kernels.flash_attention(q, k, v, block_mask=bm, **given, enable_gqa=True)
    o, lse = kernels.flash_attention_forward(q, k, v, block_mask=bm, enable_gqa=True)
    with pytest.raises(ValueError, match=words):
        kernels.flash_attention_backward(q, k, v, o, lse, do, block_mask=bm, **given, enable_gqa=True)


def test_a_mask_from_another_device_raises(rng, documents_mask):
    shape, _, bm = documents_mask
    elsewhere = copy.copy(bm)
    object.__setattr__(elsewhere, "device", torch.device("meta"))  # as if built for another device
    q, k, v, _ = make(rng, *shape)
    with pytest.raises(ValueError, match=f"block_mask lives on meta, but q is on {DEVICE}.*device='{DEVICE}'"):
        kernels.flash_attention(q, k, v, block_mask=elsewhere, enable_gqa=True)


def test_tiles_the_mask_does_not_hold_raise(rng, documents_mask, monkeypatch):
    """A call whose head dim and dtype launch other tiles (here: the forward's candidates changed under it)."""
    shape, _, bm = documents_mask
    q, k, v, _ = make(rng, *shape)
    monkeypatch.setattr(configs, "forward_candidates", lambda *a, **kw: (configs.KernelConfig(16, 16, 4, 1),))
    with pytest.raises(ValueError, match=r"built for head dim 16 in torch.float32, whose launches use other tiles "
                                         r"than this call's \(head dim 16 in torch.float32: forward 16x16\)"):
        kernels.flash_attention(q, k, v, block_mask=bm, enable_gqa=True)


def test_bad_arguments_raise(documents_mask):
    _, _, bm = documents_mask
    q = torch.zeros(2, 4, 70, 16, device=DEVICE)
    with pytest.raises(TypeError, match="expected a flashcourse.kernels.BlockMask from kernels.create_block_mask"):
        kernels.flash_attention(q, q, q, block_mask={"kv_indices": None}, enable_gqa=True)
    with pytest.raises(ValueError, match="a block mask is for document_ids and mask_mod"):
        kernels.create_block_mask(None, 1, 1, 64, 64, causal=True, head_dim=16, device=DEVICE)
    with pytest.raises(ValueError, match="N_q is 0: expected an int >= 1"):
        kernels.create_block_mask(prefix_lm, 1, 1, 0, 64, head_dim=16, device=DEVICE)
    with pytest.raises(ValueError, match=r"B is 1.5: expected an int >= 1 or None"):
        kernels.create_block_mask(prefix_lm, 1.5, 1, 64, 64, head_dim=16, device=DEVICE)
    with pytest.raises(ValueError, match=r"document_ids has shape \(2, 70\).*expected \(3, 70\)"):
        kernels.create_block_mask(None, 3, None, 70, 70, document_ids=bm.rules.document_ids, head_dim=16)
    with pytest.raises(ValueError, match="head dim 24 is not supported"):
        kernels.create_block_mask(prefix_lm, None, None, 64, 64, head_dim=24, device=DEVICE)


# ------------------------------------------------------------------------------------------ what a learner sees
def spec_counts(keep: np.ndarray, block_m: int, block_n: int) -> dict[str, int]:
    """Full / partial / empty tiles of a (B, H, N_q, N_kv) boolean mask, tile by tile."""
    counts = {"full": 0, "partial": 0, "empty": 0}
    n_q, n_kv = keep.shape[2:]
    for r in range(0, n_q, block_m):
        for c in range(0, n_kv, block_n):
            tile = keep[:, :, r:r + block_m, c:c + block_n].reshape(keep.shape[0] * keep.shape[1], -1)
            for seen in tile.sum(1):
                counts["empty" if seen == 0 else "full" if seen == block_m * block_n else "partial"] += 1
    return counts


def test_repr_shows_shape_rules_tiles_and_counts_that_match_the_rule():
    bm = kernels.create_block_mask(head_stripes, None, 2, 64, 50, causal=True, head_dim=16, dtype=torch.float32,
                                   device=DEVICE)
    text = repr(bm)
    assert text.startswith("BlockMask(B=None (every batch row alike), H=2, N_q=64, N_kv=50, rules: "
                           "causal='top_left', mask_mod=head_stripes")
    h = np.arange(2)[None, :, None, None]
    keep = dense_keep(1, 2, 64, 50, causal=True, extra=TWINS[head_stripes](0, h, np.arange(64)[:, None],
                                                                           np.arange(50)[None, :]))
    for (block_m, block_n, by_key), users in (((32, 16, False), "forward, dQ"), ((16, 32, True), "dK/dV")):
        c = bm.lists[block_m, block_n, by_key].kind_counts()
        assert c == spec_counts(keep, block_m, block_n)
        total = sum(c.values())
        assert (f"{block_m}x{block_n} tiles per {'key' if by_key else 'query'} tile ({users}): {c['full']} full, "
                f"{c['partial']} partial, {c['empty']} empty of {total}, sparsity {c['empty'] / total:.0%}") in text


# ------------------------------------------------------------------------------------------ torch.compile
def test_a_compiled_call_with_a_block_mask_breaks_the_graph_and_gives_the_eager_result(rng):
    shape, options, batch_heads = CASES["mask_mod broadcast over B and H, bottom-right, N_q < N_kv"]
    bm = build(shape, options, batch_heads)
    q, k, v, _ = make(rng, *shape)
    torch._dynamo.reset()
    compiled = torch.compile(lambda q, k, v: kernels.flash_attention(q, k, v, block_mask=bm, enable_gqa=True) * 2.0,
                             backend="aot_eager")
    assert torch.equal(compiled(q, k, v), kernels.flash_attention(q, k, v, **options, enable_gqa=True) * 2.0)
    strict = torch.compile(lambda q, k, v: kernels.flash_attention(q, k, v, block_mask=bm, enable_gqa=True),
                           backend="aot_eager", fullgraph=True)
    with pytest.raises(Exception, match="disable"):
        strict(q, k, v)
