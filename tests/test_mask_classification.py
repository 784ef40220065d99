"""How a call without a block mask classifies a ``mask_mod``: over the batch rows and heads the rule reads (its
source says which: ``rules.mask_mod_reads``), and once for every later call with the same function, shapes,
bounds and tiles (``blockmask.CALL_LISTS``), forward and backward. Checked: what the analysis says of rules that
read b, h, neither, or pass b on to a helper; per-head and per-row lists against the float64 spec (variant_spec.py)
at sizes no tile divides; how many times the tile kinds are classified over repeated steps; the cache's bound.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from flashcourse import device  # noqa: E402

if not device.triton_available():
    pytest.skip("Triton is not installed here", allow_module_level=True)
import triton  # noqa: E402
import triton.language as tl  # noqa: E402, F401  (Triton wants it in scope of every jit function, mask_mods too)
from variant_spec import torch_attention  # noqa: E402

from flashcourse import kernels  # noqa: E402
from flashcourse.kernels import blockmask, rules  # noqa: E402
from flashcourse.tolerance import assert_close  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@triton.jit
def prefix_lm(b, h, q_idx, kv_idx):
    """The first 20 positions are seen by every query, the rest causally: the same on every batch row and head."""
    return (kv_idx <= q_idx) | (kv_idx < 20)


@triton.jit
def half_on_odd_heads(b, h, q_idx, kv_idx):
    """Even heads see every key, odd heads only keys j >= i / 2: other tile kinds per head, causal or not."""
    return (h % 2 == 0) | (2 * kv_idx >= q_idx)


@triton.jit
def _first_row_or_early(row, kv_idx):
    return (row == 0) | (kv_idx < 40)


@triton.jit
def early_keys_past_row_0(b, h, q_idx, kv_idx):
    """Batch row 0 sees every key, the others keys j < 40 only, through a helper that gets b."""
    return _first_row_or_early(b, kv_idx)


TWINS = {  # each mask_mod's NumPy twin, for the spec
    prefix_lm: lambda b, h, i, j: (j <= i) | (j < 20),
    half_on_odd_heads: lambda b, h, i, j: (h % 2 == 0) | (2 * j >= i),
    early_keys_past_row_0: lambda b, h, i, j: (b == 0) | (j < 40),
}


@pytest.fixture(autouse=True)
def empty_cache():
    """Each test starts with no kept lists, whatever ran before it."""
    blockmask.CALL_LISTS.clear()
    yield
    blockmask.CALL_LISTS.clear()


# ------------------------------------------------------------------------------------------ the analysis
class FromSource:
    """A stand-in for a compiled JITFunction: only its ``src``, what Triton 3.6 and 3.9 keep (or nothing)."""

    def __init__(self, src: str | None = None):
        if src is not None:
            self.src = src



def test_the_analysis_names_what_a_rule_reads():
    reads = rules.mask_mod_reads
    assert reads(prefix_lm) == (False, False), "a prefix-LM is one mask for every (b, h)"
    assert reads(half_on_odd_heads) == (False, True)
    assert reads(early_keys_past_row_0) == (True, False), "b passed on to a helper counts as read"
    assert reads(FromSource("def m(batch, head, i, j):\n    return head.to(tl.int32) > i\n")) == (False, True)
    assert reads(FromSource("def m(b, h, i, j):\n    x = b\n    return x + j > i\n")) == (True, False)
    assert reads(FromSource("def m(_, __, i, j):\n    return j <= i\n")) == (False, False)


@pytest.mark.parametrize("unreadable", [
    FromSource(),  # neither src nor fn
    FromSource("def m(*args):\n    return args[2] > 0\n"),  # b and h inside *args
    FromSource("def m(b, h, i, j) return\n"),  # not Python
])
def test_what_cannot_be_read_counts_as_reading_both(unreadable):
    assert rules.mask_mod_reads(unreadable) == rules.READS_BOTH


def test_the_extent_follows_the_reads():
    ids = torch.zeros(2, 8, dtype=torch.int32)
    assert rules.Rules(mask_mod=prefix_lm).mask_extent(2, 3) == (1, 1)
    assert rules.Rules(mask_mod=half_on_odd_heads).mask_extent(2, 3) == (1, 3)
    assert rules.Rules(mask_mod=early_keys_past_row_0).mask_extent(2, 3) == (2, 1)
    assert rules.Rules(mask_mod=prefix_lm, document_ids=ids).mask_extent(2, 3) == (2, 1), "documents differ per row"
    for mask_mod, extent in ((prefix_lm, (1, 1)), (half_on_odd_heads, (1, 3)), (early_keys_past_row_0, (2, 1))):
        bm = kernels.create_block_mask(mask_mod, 2, 3, 64, 64, BLOCK_SIZE=32, device=DEVICE)
        assert bm.kinds.shape[:2] == extent, mask_mod


# ------------------------------------------------------------------------------------------ against the spec
def make(rng, batch, heads, n_q, n_kv, head_dim):
    shapes = [(batch, heads, n_q, head_dim), (batch, heads, n_kv, head_dim), (batch, heads, n_kv, head_dim),
              (batch, heads, n_q, head_dim)]
    return [torch.tensor(rng.standard_normal(s), dtype=torch.float32, device=DEVICE) for s in shapes]


def check_step(rng, mask_mod, causal, batch=2, heads=2, n_q=100, n_kv=77, head_dim=80):
    """One forward and backward (autograd.grad) with ``mask_mod`` passed per call, against the float64 spec."""
    q, k, v, do = make(rng, batch, heads, n_q, n_kv, head_dim)
    b, h = np.arange(batch)[:, None, None, None], np.arange(heads)[None, :, None, None]
    extra = TWINS[mask_mod](b, h, np.arange(n_q)[:, None], np.arange(n_kv)[None, :])
    o_ref, _, grads_ref = torch_attention(*(t.double().cpu().numpy() for t in (q, k, v)), causal=causal,
                                          extra=extra, do=do.double().cpu().numpy())
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    o = kernels.flash_attention(*leaves, causal=causal, mask_mod=mask_mod)
    grads = torch.autograd.grad(o, leaves, do)
    what = f"{mask_mod.__name__}, causal={causal}"
    assert_close(o.detach(), o_ref, dtype="float32", what=f"o, {what}")
    for name, g, g_ref in zip(("dq", "dk", "dv"), grads, grads_ref, strict=True):
        norm = max(1.0, float(np.abs(g_ref).max()))
        assert_close(g.double().cpu() / norm, g_ref / norm, dtype="float32", what=f"{name}, {what}")


@pytest.mark.parametrize("causal", [False, True], ids=["not causal", "causal"])
@pytest.mark.parametrize("mask_mod", [half_on_odd_heads, early_keys_past_row_0, prefix_lm],
                         ids=lambda f: f.__name__)
def test_lists_per_head_and_row_match_the_spec(rng, mask_mod, causal):
    """N_q = 100, N_kv = 77, D = 80 (padded to 128 inside): no tile divides them. A rule that reads h (or b)
    hides whole tiles on some heads (rows) only: classified at one (b, h) for all, odd heads (later rows) would
    run tiles they must skip."""
    check_step(rng, mask_mod, causal)
    q = torch.zeros(2, 2, 100, 80, device=DEVICE)
    lists = blockmask.call_lists(rules.Rules(mask_mod=mask_mod), None, q, q[:, :, :77], 32, 16, by_key=False)
    expected = {prefix_lm: (1, 1), half_on_odd_heads: (1, 2), early_keys_past_row_0: (2, 1)}[mask_mod]
    assert (lists["B_MASK"], lists["H_MASK"]) == expected


# ------------------------------------------------------------------------------------------ the cache
@pytest.fixture
def classified(monkeypatch):
    """Every run of the tile classifier, as (mask_mod, n_q, n_kv, block_m, block_n)."""
    runs = []
    real = blockmask.tile_kinds

    def counting(rules_, batch, heads, n_q, n_kv, block_m, block_n, device_):
        runs.append((rules_.mask_mod, n_q, n_kv, block_m, block_n))
        return real(rules_, batch, heads, n_q, n_kv, block_m, block_n, device_)

    monkeypatch.setattr(blockmask, "tile_kinds", counting)
    return runs


def train_step(rng, mask_mod, n, *, causal=False, batch=1, heads=2, head_dim=16):
    q, k, v, do = make(rng, batch, heads, n, n, head_dim)
    leaves = [t.requires_grad_() for t in (q, k, v)]
    o = kernels.flash_attention(*leaves, causal=causal, mask_mod=mask_mod)
    torch.autograd.grad(o, leaves, do)


def test_a_repeated_rule_is_classified_on_the_first_step_only(rng, classified):
    train_step(rng, prefix_lm, 40)
    first = len(classified)
    assert first >= 2, "the forward's tiles and dK/dV's (by key tile) are classified on the first step"
    for _ in range(2):
        train_step(rng, prefix_lm, 40)
    assert len(classified) == first, "later steps read the kept lists: forward, dK/dV and dQ"
    train_step(rng, prefix_lm, 48)
    assert len(classified) > first and classified[-1][1:3] == (48, 48), "another N is classified anew"
    count = len(classified)
    train_step(rng, half_on_odd_heads, 48)
    assert len(classified) > count and classified[-1][0] is half_on_odd_heads, "another function is classified"
    count = len(classified)
    train_step(rng, prefix_lm, 48, causal=True)
    assert len(classified) > count, "other causal bounds are classified anew"
    count = len(classified)
    train_step(rng, prefix_lm, 48, batch=3, heads=4)
    assert len(classified) == count, "a rule that reads neither b nor h: the same lists for another B and H"


def test_documents_are_classified_on_every_call(rng, classified):
    """Document ids may change in place between calls of the same shapes: their lists are never kept."""
    q, k, v, _ = make(rng, 1, 2, 40, 40, 16)
    ids = torch.zeros(1, 40, dtype=torch.int64, device=DEVICE)
    first = kernels.flash_attention(q, k, v, document_ids=ids, mask_mod=prefix_lm)
    ids[:, 20:] = 1  # the same tensor, other documents
    second = kernels.flash_attention(q, k, v, document_ids=ids, mask_mod=prefix_lm)
    assert len(classified) == 2 and len(blockmask.CALL_LISTS) == 0
    assert not torch.equal(first, second)


def test_the_cache_keeps_the_most_recently_used():
    cache = blockmask.ListCache(capacity=2)
    built = []

    def build(name):
        return lambda: built.append(name) or name

    assert [cache.get(key, build(key)) for key in ("a", "b", "a", "c")] == ["a", "b", "a", "c"]
    assert built == ["a", "b", "c"] and len(cache) == 2
    cache.get("a", build("a"))  # used last before c came: kept
    cache.get("b", build("b"))  # dropped when c came: built again
    assert built == ["a", "b", "c", "b"]


PREFIX = 20  # read by prefix_of_global below; the test changes it between calls, as a notebook cell might


@triton.jit
def prefix_of_global(b, h, q_idx, kv_idx):
    """A prefix-LM whose prompt length is a module-level value."""
    return (kv_idx <= q_idx) | (kv_idx < PREFIX)


def test_a_changed_module_value_is_classified_anew(rng, classified, monkeypatch):
    """Kept lists are keyed by the values a rule reads from its module: after PREFIX changes, the call must see the
    new mask (the interpreter runs the new value; old lists would leave tiles unmasked)."""
    q, k, v, _ = make(rng, 1, 2, 70, 70, 32)
    kernels.flash_attention(q, k, v, mask_mod=prefix_of_global)
    first = len(classified)
    monkeypatch.setattr(sys.modules[__name__], "PREFIX", 50)
    got = kernels.flash_attention(q, k, v, mask_mod=prefix_of_global)
    assert len(classified) > first, "a new PREFIX must be classified again"
    keep = np.array([[j <= i or j < 50 for j in range(70)] for i in range(70)])
    o_ref, _ = torch_attention(q.cpu(), k.cpu(), v.cpu(), extra=keep)
    assert_close(got, o_ref, dtype="float32", what="o after PREFIX changed")
    assert ("PREFIX", 50) in rules.mask_mod_constants(prefix_of_global)
