"""A kinds map turned into tile lists by one launch (``blockmask.tile_lists``, ``_tile_lists_kernel``). Checked:
every output equals, exactly, what a stable sort in PyTorch gives (the way the lists were made before the kernel:
a row's full or partial columns ascending, then its other columns ascending), on random maps and maps of one kind,
at awkward shapes (1 and 3 rows or columns, 65, rows longer than one chunk of the kernel, several batch rows and
heads), laid out as made and transposed (how dK/dV read the map); empty maps; a row worked out by hand; and that a
map with one tile changed gives other lists, so the comparison can fail.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from flashcourse import device  # noqa: E402

if not device.triton_available():
    pytest.skip("Triton is not installed here", allow_module_level=True)
from flashcourse.kernels import blockmask  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
EMPTY, PARTIAL, FULL = blockmask.EMPTY, blockmask.PARTIAL, blockmask.FULL
CHUNK = blockmask.TILE_LIST_CHUNK


def sorted_lists(kinds: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The lists as PyTorch made them before the kernel: per kind, its count per row, and a stable sort of "not
    this kind", which puts that kind's columns first, ascending, then the others, ascending."""
    out = []
    for kind in (FULL, PARTIAL):
        hit = kinds == kind
        counts = hit.sum(-1, dtype=torch.int32)
        order = torch.sort((~hit).to(torch.int8), dim=-1, stable=True).indices
        out += [counts.contiguous(), order.to(torch.int32).contiguous()]
    return tuple(out)


def kernel_lists(kinds: torch.Tensor) -> tuple[torch.Tensor, ...]:
    lists = blockmask.tile_lists(kinds)
    return lists.full_counts, lists.full_tiles, lists.partial_counts, lists.partial_tiles


def assert_same_lists(kinds: torch.Tensor) -> None:
    names = ("full_counts", "full_tiles", "partial_counts", "partial_tiles")
    for name, got, want in zip(names, kernel_lists(kinds), sorted_lists(kinds), strict=True):
        assert got.dtype == torch.int32 and got.is_contiguous(), name
        assert got.shape == want.shape, (name, got.shape, want.shape)
        assert torch.equal(got, want), f"{name} differs:\n{got}\nwant\n{want}"


def random_map(shape, seed: int, weights=(1.0, 1.0, 1.0)) -> torch.Tensor:
    """An int8 map of EMPTY, PARTIAL and FULL drawn with these weights."""
    generator = torch.Generator().manual_seed(seed)
    kinds = torch.multinomial(torch.tensor(weights), int(torch.tensor(shape).prod()), replacement=True,
                              generator=generator)
    return kinds.to(torch.int8).reshape(shape).to(DEVICE)


SHAPES = {  # (B, H, rows, columns)
    "1 x 1": (1, 1, 1, 1),
    "3 x 3": (1, 1, 3, 3),
    "B 2, H 3, 3 x 65": (2, 3, 3, 65),
    "B 2, H 2, 65 x 3": (2, 2, 65, 3),
    "rows longer than a chunk": (1, 1, 2, CHUNK + 3),
}
FILLS = {  # weights of EMPTY, PARTIAL, FULL
    "mostly empty": (8.0, 1.0, 1.0),
    "no partial": (1.0, 0.0, 1.0),
    "all full": (0.0, 0.0, 1.0),
    "all empty": (1.0, 0.0, 0.0),
}


@pytest.mark.parametrize("transposed", [False, True], ids=["as made", "transposed"])
@pytest.mark.parametrize("shape", list(SHAPES.values()), ids=list(SHAPES))
def test_lists_equal_a_stable_sort(shape, transposed):
    kinds = random_map(shape, seed=sum(shape))
    assert_same_lists(kinds.transpose(-1, -2) if transposed else kinds)


@pytest.mark.parametrize("transposed", [False, True], ids=["as made", "transposed"])
@pytest.mark.parametrize("weights", list(FILLS.values()), ids=list(FILLS))
def test_maps_of_few_kinds(weights, transposed):
    kinds = random_map((2, 3, 4, 9), seed=1, weights=weights)
    assert_same_lists(kinds.transpose(-1, -2) if transposed else kinds)


@pytest.mark.parametrize("transposed", [False, True], ids=["as made", "transposed"])
def test_many_chunks_per_row(monkeypatch, transposed):
    """A small chunk makes rows of a few dozen columns several chunks long: the hits and misses before a chunk
    carry over."""
    monkeypatch.setattr(blockmask, "TILE_LIST_CHUNK", 16)
    kinds = random_map((2, 2, 3, 65), seed=7)
    assert_same_lists(kinds.transpose(-1, -2) if transposed else kinds)


@pytest.mark.parametrize("shape", [(0, 1, 2, 3), (1, 2, 0, 4), (1, 2, 3, 0)], ids=["no batch", "no rows",
                                                                                   "no columns"])
def test_empty_maps(shape):
    """Nothing to launch, or (rows without columns) counts of zero and lists of length zero."""
    assert_same_lists(torch.zeros(shape, dtype=torch.int8, device=DEVICE))


def test_a_row_worked_out_by_hand():
    kinds = torch.tensor([FULL, EMPTY, PARTIAL, FULL, PARTIAL, EMPTY], dtype=torch.int8, device=DEVICE)
    full_counts, full_tiles, partial_counts, partial_tiles = kernel_lists(kinds.reshape(1, 1, 1, 6))
    assert full_counts.tolist() == [[[2]]] and full_tiles.tolist() == [[[[0, 3, 1, 2, 4, 5]]]]
    assert partial_counts.tolist() == [[[2]]] and partial_tiles.tolist() == [[[[2, 4, 0, 1, 3, 5]]]]


def test_a_changed_tile_gives_other_lists():
    """The comparison can fail: one partial tile made full changes both lists of its row, and only that row's."""
    kinds = random_map((2, 2, 5, 40), seed=3)
    kinds[1, 0, 2, 17] = PARTIAL
    want = sorted_lists(kinds)
    wrong = kinds.clone()
    wrong[1, 0, 2, 17] = FULL
    for got, right in zip(kernel_lists(wrong), want, strict=True):
        rows_differ = (got != right).reshape(2, 2, 5, -1).any(-1)
        assert rows_differ.nonzero().tolist() == [[1, 0, 2]]
