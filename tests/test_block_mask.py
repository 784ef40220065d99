"""A block mask built once (``kernels.create_block_mask``) and passed as ``block_mask=``. It classifies the rule
in sparse blocks (128 x 128 by default) and every kernel derives its tile lists from them, whatever its tiles:
derived lists never call a tile full or empty that is not (checked against the rule written out, at tiles smaller
than, equal to, larger than and not dividing the sparse block); one mask serves launches of different tiles, and
their outputs and gradients match the float64 spec (variant_spec.py) over two training steps; no tile is
classified again while it is passed; clear errors when its shapes, device or rules do not fit the call; a repr
whose counts agree with the rule; the forward's small-tile launch where many visited tiles are partial, per call and
built once. Interpreter launches: tiles 32 x 16 forward and dQ, 16 x 32 dK/dV.
"""

from __future__ import annotations

import copy
import re

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
from flashcourse.kernels import backward, blockmask, configs, forward, rules  # noqa: E402
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
def wide_stripes(b, h, q_idx, kv_idx):
    """Key blocks of 64 visible on alternate heads: at 32 x 64 sparse blocks, whole empty and whole full ones."""
    return (kv_idx // 64 + h) % 2 == 0


@triton.jit
def per_row(b, h, q_idx, kv_idx):
    """Depends on the batch row: row b hides the keys j with (j + b) % 3 == 0."""
    return (kv_idx + b) % 3 != 0


TWINS = {  # each mask_mod's NumPy twin, for the spec
    prefix_lm: lambda b, h, i, j: (j <= i) | (j < 20),
    head_stripes: lambda b, h, i, j: (j // 16 + h) % 2 == 0,
    wide_stripes: lambda b, h, i, j: (j // 64 + h) % 2 == 0,
    per_row: lambda b, h, i, j: (j + b) % 3 != 0,
}


def docs(batch, lengths) -> torch.Tensor:
    ids = np.repeat(np.arange(len(lengths)), lengths)
    return torch.tensor(np.tile(ids, (batch, 1)), dtype=torch.int64, device=DEVICE)


# (B, H_q, H_kv, N_q, N_kv, D), the call's mask options, create_block_mask's B and H (None: broadcast), BLOCK_SIZE.
# A sparse block of 16 divides every kernel tile (interpreter and GPU launches alike): there the derived lists are
# the exact ones, and the call gives the bits of a call that classifies its own tiles.
CASES = {
    "documents + causal, GQA, N not a multiple of the tiles": (
        (2, 4, 2, 70, 70, 16), {"document_ids": "docs", "causal": True}, (2, None), 128),
    "mask_mod per head + causal": ((1, 4, 4, 50, 50, 16), {"mask_mod": head_stripes, "causal": True}, (1, 4), 16),
    "mask_mod per batch row, GQA, N_q != N_kv": ((2, 4, 1, 37, 45, 16), {"mask_mod": per_row}, (2, 4), (32, 64)),
    "mask_mod broadcast over B and H, bottom-right, N_q < N_kv": (
        (2, 2, 2, 30, 75, 16), {"mask_mod": prefix_lm, "causal": "bottom_right"}, (None, None), 128),
    "documents + mask_mod + window": (
        (1, 2, 2, 64, 64, 16), {"document_ids": "docs", "mask_mod": prefix_lm, "window": (24, 3)}, (None, 2), 32),
    "N = 1, documents + causal": ((1, 2, 2, 1, 1, 16), {"document_ids": "docs", "causal": True}, (None, None), 128),
}


def make(rng, batch, heads, heads_kv, n_q, n_kv, head_dim, dtype=torch.float32):
    shapes = [(batch, heads, n_q, head_dim), (batch, heads_kv, n_kv, head_dim), (batch, heads_kv, n_kv, head_dim),
              (batch, heads, n_q, head_dim)]
    return [torch.tensor(rng.standard_normal(s), dtype=dtype, device=DEVICE) for s in shapes]


def options_of(shape, options) -> dict:
    batch, n = shape[0], shape[3]
    return {k: docs(batch, [n // 3, 1, n - n // 3 - 1]) if v == "docs" else v for k, v in options.items()}


def keep_of(batch, heads, n_q, n_kv, options) -> torch.Tensor:
    """The (B, H, N_q, N_kv) boolean mask of the options, written out (a mask_mod through its NumPy twin)."""
    extra = None
    if options.get("mask_mod") is not None:
        b, h = np.arange(batch)[:, None, None, None], np.arange(heads)[None, :, None, None]
        extra = TWINS[options["mask_mod"]](b, h, np.arange(n_q)[:, None], np.arange(n_kv)[None, :])
    ids = options.get("document_ids")
    return dense_keep(batch, heads, n_q, n_kv, causal=options.get("causal", False), window=options.get("window"),
                      document_ids=None if ids is None else ids.cpu().numpy(), extra=extra)


def spec(q, k, v, do, options):
    """o, lse and (dq, dk, dv) in float64 from the rule written out, a mask_mod through its NumPy twin."""
    batch, heads, n_q, _ = q.shape
    n_kv = k.shape[2]
    extra = None
    if options.get("mask_mod") is not None:
        b, h = np.arange(batch)[:, None, None, None], np.arange(heads)[None, :, None, None]
        extra = TWINS[options["mask_mod"]](b, h, np.arange(n_q)[:, None], np.arange(n_kv)[None, :])
    ids = options.get("document_ids")
    return torch_attention(*(t.double().cpu().numpy() for t in (q, k, v)), causal=options.get("causal", False),
                           window=options.get("window"), document_ids=None if ids is None else ids.cpu().numpy(),
                           extra=extra, do=do.double().cpu().numpy())


def assert_matches_spec(o, lse, grads, reference, what, dtype="float32"):
    o_ref, lse_ref, grads_ref = reference
    assert_close(o, o_ref, dtype=dtype, what=f"o, {what}")
    if lse is not None:
        assert_close(lse, lse_ref, dtype="float32" if dtype == "float32" else dtype, what=f"lse, {what}")
    for name, g, g_ref in zip(("dq", "dk", "dv"), grads, grads_ref, strict=True):
        norm = max(1.0, float(np.abs(g_ref).max()))
        assert_close(g.double().cpu() / norm, g_ref / norm, dtype=dtype, what=f"{name}, {what}")


def step(q, k, v, do, **call):
    """One training step's attention: o and the gradients of (o * do).sum() in q, k, v."""
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    o = kernels.flash_attention(*leaves, **call, enable_gqa=True)
    o.backward(do)
    return o.detach(), [t.grad for t in leaves]


def build(shape, options, batch_heads, block_size=128, **extra):
    _, _, _, n_q, n_kv, _ = shape
    mask_options = {k: v for k, v in options.items() if k != "mask_mod"}
    return kernels.create_block_mask(options.get("mask_mod"), *batch_heads, n_q, n_kv, BLOCK_SIZE=block_size,
                                     device=DEVICE, **mask_options, **extra)


@pytest.mark.parametrize("name", list(CASES))
def test_prebuilt_mask_matches_the_spec_over_two_steps(rng, name):
    shape, options, batch_heads, block_size = CASES[name]
    options = options_of(shape, options)
    bm = build(shape, options, batch_heads, block_size)
    for _ in range(2):  # two training steps, new inputs, one block mask
        q, k, v, do = make(rng, *shape)
        reference = spec(q, k, v, do, options)
        o, grads = step(q, k, v, do, block_mask=bm)
        _, lse = kernels.flash_attention_forward(q, k, v, block_mask=bm, enable_gqa=True)
        assert_matches_spec(o, lse, grads, reference, f"block_mask, {name}")
        if block_size == 16:  # derived lists are the exact ones: the same kernels on the same lists, the same bits
            o_call, grads_call = step(q, k, v, do, **options)
            assert torch.equal(o, o_call)
            assert all(torch.equal(a, b) for a, b in zip(grads, grads_call, strict=True))


def test_forward_and_backward_functions_take_the_block_mask(rng):
    shape, options, batch_heads, block_size = CASES["mask_mod per head + causal"]
    bm = build(shape, options, batch_heads, block_size)
    q, k, v, do = make(rng, *shape)
    o, lse = kernels.flash_attention_forward(q, k, v, block_mask=bm, enable_gqa=True)
    o_call, lse_call = kernels.flash_attention_forward(q, k, v, **options, enable_gqa=True)
    assert torch.equal(o, o_call) and torch.equal(lse, lse_call)
    grads = kernels.flash_attention_backward(q, k, v, o, lse, do, block_mask=bm, enable_gqa=True)
    grads_call = kernels.flash_attention_backward(q, k, v, o, lse, do, **options, enable_gqa=True)
    assert all(torch.equal(a, b) for a, b in zip(grads, grads_call, strict=True))


# ------------------------------------------------------------------------------------------ derived lists
def exact_kinds(keep: torch.Tensor, block_m: int, block_n: int) -> np.ndarray:
    """Tile kinds of a (B, H, N_q, N_kv) boolean mask, counted tile by tile (positions past N are not seen)."""
    batch, heads, n_q, n_kv = keep.shape
    rows, cols = -(-n_q // block_m), -(-n_kv // block_n)
    padded = np.zeros((batch, heads, rows * block_m, cols * block_n), dtype=np.int64)
    padded[:, :, :n_q, :n_kv] = keep.numpy()
    seen = padded.reshape(batch, heads, rows, block_m, cols, block_n).sum(axis=(3, 5))
    return np.where(seen == 0, blockmask.EMPTY, np.where(seen == block_m * block_n, blockmask.FULL,
                                                          blockmask.PARTIAL))


RULES = {  # (B, H, N_q, N_kv, options, create_block_mask's B and H): full, partial and empty blocks at 32 x 64
    "documents": (2, 1, 300, 300, {"document_ids": "docs"}, (2, None)),
    "documents + causal": (1, 1, 300, 300, {"document_ids": "docs", "causal": True}, (None, None)),
    "documents, N = 256: whole blocks at the end, tiles of 48 past it": (
        1, 1, 256, 256, {"document_ids": "docs"}, (None, None)),
    "mask_mod per head, N_q != N_kv": (1, 2, 200, 300, {"mask_mod": wide_stripes}, (None, 2)),
    "prefix mask_mod, bottom-right": (1, 1, 200, 300, {"mask_mod": prefix_lm, "causal": "bottom_right"},
                                      (None, None)),
}
TILE_SIZES = [(16, 32), (64, 64), (128, 128), (32, 256), (48, 48), (48, 80)]


@pytest.mark.parametrize("block_size", [128, (32, 64)], ids=["128", "32x64"])
@pytest.mark.parametrize("name", list(RULES))
def test_derived_lists_never_call_a_tile_full_or_empty_that_is_not(name, block_size):
    batch, heads, n_q, n_kv, options, batch_heads = RULES[name]
    options = {k: docs(batch, [110, 37, n_q - 147]) if v == "docs" else v for k, v in options.items()}
    bm = build((batch, heads, heads, n_q, n_kv, 16), options, batch_heads, block_size)
    keep = keep_of(batch, heads, n_q, n_kv, options)
    if options.get("mask_mod") is not wide_stripes:
        keep = keep[:, :1]  # only a mask_mod sees the head: the map has one head
    rows, cols = bm.block_size
    sparse = exact_kinds(keep, rows, cols)
    np.testing.assert_array_equal(bm.kinds.cpu().numpy(), sparse, err_msg="the sparse blocks are classified exactly")
    if block_size != 128:  # at 32 x 64 every rule has blocks of every kind, so the subsets below say something
        assert all((sparse == kind).any() for kind in (blockmask.EMPTY, blockmask.PARTIAL, blockmask.FULL))
    for block_m, block_n in TILE_SIZES:
        derived = blockmask.derived_kinds(bm.kinds, bm.block_size, n_q, n_kv, block_m, block_n).cpu().numpy()
        exact = exact_kinds(keep, block_m, block_n)
        at = f"{block_m}x{block_n} tiles from {rows}x{cols} blocks"
        assert derived.shape == exact.shape, at
        assert not ((derived == blockmask.FULL) & (exact != blockmask.FULL)).any(), f"derived full, not full: {at}"
        assert not ((derived == blockmask.EMPTY) & (exact != blockmask.EMPTY)).any(), f"a seen tile skipped: {at}"
        if block_m % rows == 0 and block_n % cols == 0:  # whole blocks under each tile: nothing is lost
            np.testing.assert_array_equal(derived, exact, err_msg=at)
        lists = bm.tile_lists(block_m, block_n, by_key=True)  # per key tile: the derived map read transposed
        by_key = derived.swapaxes(-1, -2)
        np.testing.assert_array_equal(lists.full_counts.cpu().numpy(), (by_key == blockmask.FULL).sum(-1), at)
        np.testing.assert_array_equal(lists.partial_counts.cpu().numpy(), (by_key == blockmask.PARTIAL).sum(-1), at)
    np.testing.assert_array_equal(
        blockmask.derived_kinds(bm.kinds, bm.block_size, n_q, n_kv, rows, cols).cpu().numpy(), sparse,
        err_msg="at the sparse block's own size the derived kinds are the blocks'")


CONFIGS = {  # forced launches: (forward, (dK/dV, dQ)): tiles smaller than the mask's 32 x 32 blocks, and larger
    "small tiles": (configs.KernelConfig(32, 16, 4, 1), (configs.KernelConfig(16, 32, 4, 1),
                                                        configs.KernelConfig(32, 16, 4, 1))),
    "large tiles": (configs.KernelConfig(64, 32, 4, 1), (configs.KernelConfig(32, 64, 4, 1),
                                                        configs.KernelConfig(64, 32, 4, 1))),
}
SERVED = {  # (B, H, N_q, N_kv, D), options, create_block_mask's B and H
    "documents + causal, N = 100": ((2, 2, 100, 100, 16), {"document_ids": "docs", "causal": True}, (2, None)),
    "prefix mask_mod, N_q < N_kv": ((1, 2, 70, 90, 16), {"mask_mod": prefix_lm}, (None, None)),
    "N = 1, documents": ((1, 2, 1, 1, 16), {"document_ids": "docs"}, (None, None)),
}


@pytest.mark.parametrize("name", list(SERVED))
def test_one_mask_serves_launches_of_different_tiles(rng, name, monkeypatch):
    (batch, heads, n_q, n_kv, head_dim), options, batch_heads = SERVED[name]
    shape = (batch, heads, heads, n_q, n_kv, head_dim)
    options = options_of(shape, options)
    bm = build(shape, options, batch_heads, 32)
    classified = []
    monkeypatch.setattr(blockmask, "tile_kinds", lambda *a, **kw: classified.append(a) or None)
    q, k, v, do = make(rng, *shape)
    reference = spec(q, k, v, do, options)
    call_rules = rules.parse_rules(q, k, **options)
    for launch, (fwd, bwd) in CONFIGS.items():
        o, lse = forward.run_forward(forward.FORWARD_VERSIONS["v7"], q, k, v, scale=None, rules=call_rules,
                                     config=fwd, block_mask=bm)
        grads = backward.run_backward(backward.BACKWARD_VERSIONS["b3"], q, k, v, o, lse, do, scale=None,
                                      configs_override=bwd, rules=call_rules, block_mask=bm)
        assert_matches_spec(o, lse, grads, reference, f"{launch}, {name}")
        text = repr(bm)
        for size, by in ((fwd, "query"), (bwd[0], "key"), (bwd[1], "query")):
            assert f"derived {size.block_m}x{size.block_n} tiles per {by} tile" in text, (launch, text)
    assert classified == [], "the lists were derived from the blocks, nothing classified again"


def test_the_head_dim_and_dtype_of_a_call_do_not_matter(rng):
    """The mask has no head dim or dtype: calls at D = 16 in float32 and D = 32 in float16 both read it."""
    shape, options, batch_heads, _ = CASES["documents + causal, GQA, N not a multiple of the tiles"]
    options = options_of(shape, options)
    bm = build(shape, options, batch_heads)
    for head_dim, dtype in ((16, torch.float32), (32, torch.float16)):
        q, k, v, do = make(rng, *shape[:5], head_dim, dtype=dtype)
        o, grads = step(q, k, v, do, block_mask=bm)
        assert_matches_spec(o, None, grads, spec(q, k, v, do, options), f"D = {head_dim} in {dtype}",
                            dtype=str(dtype).removeprefix("torch."))


def test_a_launch_at_other_tiles_than_planned_is_served(rng, documents_mask, monkeypatch):
    """Where the old mask refused a call whose launches took tiles it did not hold, this one derives them."""
    shape, options, bm = documents_mask
    q, k, v, do = make(rng, *shape)
    monkeypatch.setattr(configs, "forward_candidates", lambda *a, **kw: (configs.KernelConfig(16, 16, 4, 1),))
    o, lse = kernels.flash_attention_forward(q, k, v, block_mask=bm, enable_gqa=True)
    o_ref, lse_ref, _ = spec(q, k, v, do, options)
    assert_close(o, o_ref, what="o at 16 x 16 tiles")
    assert_close(lse, lse_ref, what="lse at 16 x 16 tiles")
    assert "derived 16x16 tiles per query tile" in repr(bm)


def test_the_lists_are_built_once(rng, monkeypatch):
    """Building classifies the sparse blocks once. With block_mask no step classifies a tile again; without,
    every step does three times (forward 32 x 16, dK/dV 16 x 32, dQ 32 x 16), from the documents' id ranges."""
    calls, by_ranges = [], []
    real, real_ranges = blockmask.tile_kinds, blockmask.document_tile_kinds
    monkeypatch.setattr(blockmask, "tile_kinds", lambda *a, **kw: calls.append(a[5:7]) or real(*a, **kw))
    monkeypatch.setattr(blockmask, "document_tile_kinds",
                        lambda *a, **kw: by_ranges.append(a[3:5]) or real_ranges(*a, **kw))
    shape, options, batch_heads, block_size = CASES["documents + causal, GQA, N not a multiple of the tiles"]
    options = options_of(shape, options)
    bm = build(shape, options, batch_heads, block_size)
    assert calls == [(128, 128)]
    calls.clear()
    q, k, v, do = make(rng, *shape)
    for _ in range(2):
        step(q, k, v, do, block_mask=bm)
        kernels.flash_attention(q, k, v, block_mask=bm, enable_gqa=True)  # inference
    assert calls == by_ranges == []
    step(q, k, v, do, **options)
    assert calls == [] and by_ranges == [(32, 16), (16, 32), (32, 16)]


def test_the_call_may_repeat_the_options(rng):
    """The same options given again (document ids as another tensor of the same ids) are accepted."""
    shape, options, batch_heads, block_size = CASES["documents + causal, GQA, N not a multiple of the tiles"]
    options = options_of(shape, options)
    bm = build(shape, options, batch_heads, block_size)
    q, k, v, _ = make(rng, *shape)
    same = {"document_ids": options["document_ids"].clone(), "causal": "top_left"}
    assert torch.equal(kernels.flash_attention(q, k, v, block_mask=bm, **same, enable_gqa=True),
                       kernels.flash_attention(q, k, v, block_mask=bm, enable_gqa=True))


# ------------------------------------------------------------------------------------------ errors
@pytest.fixture
def documents_mask():
    shape, options, batch_heads, block_size = CASES["documents + causal, GQA, N not a multiple of the tiles"]
    options = options_of(shape, options)
    return shape, options, build(shape, options, batch_heads, block_size)


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
    shape, options, batch_heads, block_size = CASES["mask_mod per head + causal"]
    bm = build(shape, options, batch_heads, block_size)
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


def test_bad_arguments_raise(documents_mask):
    _, _, bm = documents_mask
    q = torch.zeros(2, 4, 70, 16, device=DEVICE)
    with pytest.raises(TypeError, match="expected a flashcourse.kernels.BlockMask from kernels.create_block_mask"):
        kernels.flash_attention(q, q, q, block_mask={"kv_indices": None}, enable_gqa=True)
    with pytest.raises(ValueError, match="a block mask is for document_ids and mask_mod"):
        kernels.create_block_mask(None, 1, 1, 64, 64, causal=True, device=DEVICE)
    with pytest.raises(ValueError, match="N_q is 0: expected an int >= 1"):
        kernels.create_block_mask(prefix_lm, 1, 1, 0, 64, device=DEVICE)
    with pytest.raises(ValueError, match=r"B is 1.5: expected an int >= 1 or None"):
        kernels.create_block_mask(prefix_lm, 1.5, 1, 64, 64, device=DEVICE)
    with pytest.raises(ValueError, match=r"document_ids has shape \(2, 70\).*expected \(3, 70\)"):
        kernels.create_block_mask(None, 3, None, 70, 70, document_ids=bm.rules.document_ids)
    for size in (24, 8, 512, (16,), (16, 48), True, "128"):
        with pytest.raises(ValueError, match=re.escape(f"BLOCK_SIZE is {size!r}: expected a power of two from 16")):
            kernels.create_block_mask(prefix_lm, None, None, 64, 64, BLOCK_SIZE=size, device=DEVICE)


# ------------------------------------------------------------------------------------------ what a learner sees
def count_kinds(kinds: np.ndarray) -> dict[str, int]:
    return {name: int((kinds == kind).sum())
            for name, kind in (("full", blockmask.FULL), ("partial", blockmask.PARTIAL), ("empty", blockmask.EMPTY))}


def test_repr_shows_shape_rules_blocks_and_counts_that_match_the_rule(rng):
    bm = kernels.create_block_mask(head_stripes, None, 2, 64, 50, causal=True, BLOCK_SIZE=16, device=DEVICE)
    text = repr(bm)
    assert text.startswith("BlockMask(B=None (every batch row alike), H=2, N_q=64, N_kv=50, rules: "
                           "causal='top_left', mask_mod=head_stripes")
    keep = keep_of(1, 2, 64, 50, {"causal": True, "mask_mod": head_stripes})
    c = count_kinds(exact_kinds(keep, 16, 16))
    assert min(c.values()) > 0, c  # stripes and the diagonal: blocks of every kind, so each count is checked
    assert f"  16x16 sparse blocks: {c['full']} full, {c['partial']} partial, {c['empty']} empty of 32, " \
           f"sparsity {c['empty'] / 32:.0%}" in text
    assert "derived" not in text  # nothing derived before a call
    q, k, v, _ = make(rng, 1, 2, 2, 64, 50, 16)
    kernels.flash_attention_forward(q, k, v, block_mask=bm)
    c = count_kinds(exact_kinds(keep, 32, 16))  # 16 divides the forward's 32 x 16 tiles: derived = exact
    total = sum(c.values())
    assert (f"  derived 32x16 tiles per query tile: {c['full']} full, {c['partial']} partial, {c['empty']} empty "
            f"of {total}, sparsity {c['empty'] / total:.0%}") in repr(bm)


# ------------------------------------------------------------------------------------------ torch.compile
def test_a_compiled_call_with_a_block_mask_breaks_the_graph_and_gives_the_eager_result(rng):
    shape, options, batch_heads, block_size = CASES["mask_mod broadcast over B and H, bottom-right, N_q < N_kv"]
    bm = build(shape, options, batch_heads, block_size)
    q, k, v, _ = make(rng, *shape)
    torch._dynamo.reset()
    compiled = torch.compile(lambda q, k, v: kernels.flash_attention(q, k, v, block_mask=bm, enable_gqa=True) * 2.0,
                             backend="aot_eager")
    assert torch.equal(compiled(q, k, v), kernels.flash_attention(q, k, v, block_mask=bm, enable_gqa=True) * 2.0)
    strict = torch.compile(lambda q, k, v: kernels.flash_attention(q, k, v, block_mask=bm, enable_gqa=True),
                           backend="aot_eager", fullgraph=True)
    with pytest.raises(Exception, match="disable"):
        strict(q, k, v)


# ------------------------------------------------------------------------------------------ on a GPU
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_one_default_mask_serves_two_head_dims_on_a_gpu(rng):
    """One mask of 128 x 128 blocks, calls at D = 64 and D = 128 in float16 (on an H200 their launches take other
    tiles): both match the float64 spec, forward and backward; N = 1000 is no multiple of 128."""
    batch, heads, n = 2, 4, 1000
    options = {"document_ids": docs(batch, [300, 77, n - 377]), "causal": True}
    bm = kernels.create_block_mask(None, None, None, n, n, **options)
    sizes = []
    for head_dim in (64, 128):
        q, k, v, do = make(rng, batch, heads, heads, n, n, head_dim, dtype=torch.float16)
        o, grads = step(q, k, v, do, block_mask=bm)
        assert_matches_spec(o, None, grads, spec(q, k, v, do, options), f"D = {head_dim}", dtype="float16")
        sizes.append(set(bm._lists))
    if configs.device_props(q.device).capability == (9, 0):
        assert sizes[1] - sizes[0], "on Hopper the two head dims launch different tiles, both derived"


@triton.jit
def chunks_of_128(b, h, q_idx, kv_idx):
    """Causal within chunks of 128 positions: at 128 x 128 tiles, every visited tile is a partial diagonal one."""
    return (q_idx // 128 == kv_idx // 128) & (kv_idx <= q_idx)


@triton.jit
def prompt_of_512(b, h, q_idx, kv_idx):
    """A 512-key prompt seen by every query: over 512 queries and keys, every tile is full."""
    return (kv_idx <= q_idx) | (kv_idx < 512)


@pytest.mark.parametrize("mask_mod, small_tiles", [(chunks_of_128, True), (prompt_of_512, False)])
@pytest.mark.parametrize("prebuilt", [False, True])
def test_the_forward_takes_small_tiles_where_many_visited_tiles_are_partial(mask_mod, small_tiles, prebuilt):
    """An H200's forward launch under a rule, chosen on this machine: the window's small tiles where at least a
    tenth of the dense launch's visited tiles are partial (per call and from a block mask alike), and for packed
    documents always; the dense launch otherwise."""
    h200, n = configs.KNOWN_DEVICES["H200"], 512
    small, dense = (configs.forward_config(h200, 128, 2, causal=masked) for masked in (True, False))
    assert small != dense  # else this test could not tell the two choices apart
    q = k = torch.zeros(1, 1, n, 128, dtype=torch.float16, device=DEVICE)
    block_mask = kernels.create_block_mask(mask_mod, None, None, n, n, device=DEVICE) if prebuilt else None
    chosen = forward.launch_candidates(kernels.FORWARD_VERSIONS["v7"], h200, 128, 2,
                                       rules.parse_rules(q, k, mask_mod=mask_mod), block_mask, q, k)[0]
    assert chosen == (small if small_tiles else dense)
    ids = torch.zeros(1, n, dtype=torch.int32, device=DEVICE)  # one document: still its own short-run launch
    documents = rules.parse_rules(q, k, causal=True, document_ids=ids)
    assert forward.launch_candidates(kernels.FORWARD_VERSIONS["v7"], h200, 128, 2, documents, None, q, k)[0] == small
    assert forward.launch_candidates(kernels.FORWARD_VERSIONS["v7"], h200, 128, 2, rules.parse_rules(q, k, causal=True),
                                     None, q, k)[0] == dense
