"""Document ids classified per tile from each tile's range of ids (``blockmask.document_tile_kinds``), the way a
call with ``document_ids=`` and no block mask gets its tile lists. Checked: for packed ids (never decreasing) the
map is the exact one, counted score by score from the rule written out (variant_spec.py) and the one
``tile_kinds`` evaluates, at random document lengths, tiles that do not divide N, causal or not, with windows; for
ids in any order it never calls a tile empty or full that is not; forward and backward through
``flash_attention(..., document_ids=)`` match the float64 spec at sizes no tile divides, with and without GQA.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from flashcourse import device  # noqa: E402

if not device.triton_available():
    pytest.skip("Triton is not installed here", allow_module_level=True)
from variant_spec import dense_keep, torch_attention  # noqa: E402

from flashcourse import kernels  # noqa: E402
from flashcourse.kernels import blockmask, rules  # noqa: E402
from flashcourse.tolerance import assert_close  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
EMPTY, PARTIAL, FULL = blockmask.EMPTY, blockmask.PARTIAL, blockmask.FULL

TILE_SIZES = [(16, 32), (64, 64), (128, 64), (48, 80)]
BOUNDS = {  # the call's causal and window options
    "no bounds": {},
    "causal": {"causal": True},
    "window (130, 70)": {"window": (130, 70)},
    "causal + window (200, -1)": {"causal": True, "window": (200, -1)},
    "window (-1, 0)": {"window": (-1, 0)},  # causal spelled as a window
    "window (6, 2), narrower than a tile": {"window": (6, 2)},
}


def packed_ids(rng, batch: int, n: int) -> np.ndarray:
    """(batch, n) ids as packing gives them: never decreasing, one run per document. Each row has its own number
    of documents (1 to n / 3, single positions among them; row 0 one or two, so long documents fill whole tiles),
    and ids that skip values or start below 0."""
    rows = []
    for row in range(batch):
        count = min(n, int(rng.choice([1, 2] if row == 0 else [2, 5, 9, max(2, n // 3)])))
        cuts = np.sort(rng.choice(np.arange(1, n), size=count - 1, replace=False))
        lengths = np.diff(np.r_[0, cuts, n])
        ids = np.cumsum(rng.integers(1, 4, size=count)) - 3
        rows.append(np.repeat(ids, lengths))
    return np.stack(rows)


def exact_kinds(keep: torch.Tensor, block_m: int, block_n: int) -> np.ndarray:
    """Tile kinds of a (B, 1, N, N) boolean mask, counted score by score (positions past N are not seen)."""
    batch, heads, n_q, n_kv = keep.shape
    rows, cols = -(-n_q // block_m), -(-n_kv // block_n)
    padded = np.zeros((batch, heads, rows * block_m, cols * block_n), dtype=np.int64)
    padded[:, :, :n_q, :n_kv] = keep.numpy()
    seen = padded.reshape(batch, heads, rows, block_m, cols, block_n).sum(axis=(3, 5))
    return np.where(seen == 0, EMPTY, np.where(seen == block_m * block_n, FULL, PARTIAL))


def both_maps(ids: np.ndarray, bounds: dict, block_m: int, block_n: int) -> tuple[np.ndarray, np.ndarray]:
    """(the range classification, the exact kinds) of ids (B, N) under the bounds."""
    batch, n = ids.shape
    call = rules.parse_rules(torch.zeros(batch, 1, n, 16, device=DEVICE), torch.zeros(batch, 1, n, 16, device=DEVICE),
                             document_ids=torch.tensor(ids, device=DEVICE), **bounds)
    ranges = blockmask.document_tile_kinds(call, batch, n, block_m, block_n, DEVICE).cpu().numpy()
    keep = dense_keep(batch, 1, n, n, causal=bounds.get("causal", False), window=bounds.get("window"),
                      document_ids=ids)
    return ranges, exact_kinds(keep, block_m, block_n)


@pytest.mark.parametrize("bounds", list(BOUNDS))
@pytest.mark.parametrize("tiles", TILE_SIZES, ids=lambda t: f"{t[0]}x{t[1]}")
def test_packed_ids_get_the_exact_map(rng, tiles, bounds):
    block_m, block_n = tiles
    seen_kinds = set()
    # No tile divides all of them; at N = 1 every tile runs past N; N = 400 holds whole causal tiles of every size
    # (up to 129 only the smallest are), and costs the interpreter a second at the smallest.
    for n in (1, 100, 129) + ((400,) if tiles != (16, 32) else ()):
        ids = packed_ids(rng, 2, n)
        ranges, exact = both_maps(ids, BOUNDS[bounds], block_m, block_n)
        assert ranges.shape == exact.shape == (2, 1, -(-n // block_m), -(-n // block_n))
        np.testing.assert_array_equal(ranges, exact, err_msg=f"N = {n}, {tiles}, {bounds}, ids {ids.tolist()}")
        seen_kinds |= set(np.unique(exact).tolist())
    # Every kind was met, so each was compared (a window narrower than a tile leaves none whole).
    assert seen_kinds == ({EMPTY, PARTIAL} if "narrower" in bounds else {EMPTY, PARTIAL, FULL})


def test_packed_ids_get_the_map_of_every_score(rng):
    """The same at the attention kernels' own tiles (powers of two) against ``tile_kinds``, the classifier that
    evaluates every score (and still serves mask_mod and create_block_mask)."""
    ids = packed_ids(rng, 2, 70)
    q = torch.zeros(2, 1, 70, 16, device=DEVICE)
    for name in ("causal", "window (130, 70)", "window (6, 2), narrower than a tile"):
        call = rules.parse_rules(q, q, document_ids=torch.tensor(ids, device=DEVICE), **BOUNDS[name])
        for block_m, block_n in ((16, 32), (32, 16)):
            every_score = blockmask.tile_kinds(call, 2, 1, 70, 70, block_m, block_n, DEVICE)
            ranges = blockmask.document_tile_kinds(call, 2, 70, block_m, block_n, DEVICE)
            assert torch.equal(ranges, every_score), (name, block_m, block_n)


def unsorted_ids(rng, batch: int, n: int) -> np.ndarray:
    """Ids in no order: a few values at random, or packed documents placed in a shuffled order."""
    rows = []
    for row in range(batch):
        if row % 2 == 0:
            rows.append(rng.integers(0, 3, size=n))
        else:
            lengths = np.diff(np.r_[0, np.sort(rng.choice(np.arange(1, n), size=5, replace=False)), n])
            rows.append(np.repeat(rng.permutation(6), lengths))
    return np.stack(rows)


@pytest.mark.parametrize("bounds", ["no bounds", "causal", "window (130, 70)"])
def test_unsorted_ids_are_never_given_a_wrong_kind(rng, bounds):
    """A tile called empty must be empty (else scores are lost), one called full must be full (else masked scores
    are counted); where ranges cannot tell, partial: the kernel then masks score by score."""
    cautious = 0
    for block_m, block_n in TILE_SIZES:
        ids = unsorted_ids(rng, 4, 170)
        ranges, exact = both_maps(ids, BOUNDS[bounds], block_m, block_n)
        at = f"{block_m}x{block_n}, {bounds}"
        assert not ((ranges == EMPTY) & (exact != EMPTY)).any(), f"a tile with visible scores called empty: {at}"
        assert not ((ranges == FULL) & (exact != FULL)).any(), f"a tile with masked scores called full: {at}"
        assert not ((exact == PARTIAL) & (ranges != PARTIAL)).any(), f"a partial tile not called partial: {at}"
        cautious += int((ranges != exact).sum())
    assert cautious > 0, "some tile was empty or full without its ranges showing it (those ranges overlap)"


# ------------------------------------------------------------------------------------------ through the kernels
CALLS = {  # (B, H_q, H_kv, N, D), ids (random packed, random unsorted, or document lengths), options
    "N = 100, packed, causal, GQA 2/1": ((2, 2, 1, 100, 80), "packed", {"causal": True}),
    "N = 77, shuffled, window (20, 3)": ((2, 2, 2, 77, 80), "shuffled", {"window": (20, 3)}),
    # Documents of 10, 40 and 27: tiles on the diagonal hold the first boundary and no other, so the query and key
    # ranges of such a tile are the same two ids (only the bounds make such a tile partial where they cut it).
    "N = 77, documents 10/40/27, no bounds": ((2, 2, 2, 77, 80), [10, 40, 27], {}),
}


@pytest.mark.parametrize("name", list(CALLS))
def test_forward_and_backward_match_the_spec(rng, name, monkeypatch):
    """Without a block mask each launch classifies its tiles from id ranges (the forward's, dK/dV's by key tile and
    dQ's), never score by score; o, lse and the gradients match float64."""
    (batch, heads, heads_kv, n, head_dim), order, options = CALLS[name]
    if isinstance(order, list):
        ids = np.tile(np.repeat(np.arange(len(order)), order), (batch, 1))
    else:
        ids = packed_ids(rng, batch, n) if order == "packed" else unsorted_ids(rng, batch, n)
    ranges_runs = []
    real = blockmask.document_tile_kinds
    monkeypatch.setattr(blockmask, "document_tile_kinds", lambda *a: ranges_runs.append(a[3:5]) or real(*a))
    monkeypatch.setattr(blockmask, "tile_kinds", lambda *a: pytest.fail("documents classified score by score"))
    shapes = [(batch, heads, n, head_dim), (batch, heads_kv, n, head_dim), (batch, heads_kv, n, head_dim),
              (batch, heads, n, head_dim)]
    q, k, v, do = (torch.tensor(rng.standard_normal(s), dtype=torch.float32, device=DEVICE) for s in shapes)
    document_ids = torch.tensor(ids, device=DEVICE)
    o_ref, lse_ref, grads_ref = torch_attention(
        *(t.double().cpu().numpy() for t in (q, k, v)), causal=options.get("causal", False),
        window=options.get("window"), document_ids=ids, do=do.double().cpu().numpy())

    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    o, lse = kernels.flash_attention(*leaves, document_ids=document_ids, enable_gqa=True, return_lse=True,
                                     **options)
    grads = torch.autograd.grad(o, leaves, do)
    assert len(ranges_runs) == 3, "forward, dK/dV and dQ each classified their tiles from the ranges"
    assert_close(o.detach(), o_ref, dtype="float32", what=f"o, {name}")
    assert_close(lse.detach(), lse_ref, dtype="float32", what=f"lse, {name}")
    for grad_name, g, g_ref in zip(("dq", "dk", "dv"), grads, grads_ref, strict=True):
        norm = max(1.0, float(np.abs(g_ref).max()))
        assert_close(g.double().cpu() / norm, g_ref / norm, dtype="float32", what=f"{grad_name}, {name}")
