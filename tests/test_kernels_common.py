"""The tile ranges of kernels/common.py against brute force over the bounds ``i + LOWER <= j <= i + UPPER``.

``key_tile_range`` (the forward and b3's dQ: key tiles of a query tile) and ``query_tile_range`` (b3's dK/dV:
query tiles of a key tile) must cover every visible pair, and the tiles they call whole must need no mask:
every row and key in range, every pair visible. Run through a small kernel, in the interpreter without a GPU.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from flashcourse import device  # noqa: E402

if not device.triton_available():
    pytest.skip("Triton is not installed here", allow_module_level=True)
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from flashcourse.kernels.common import key_tile_range, query_tile_range  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@triton.jit
def _ranges_kernel(PARAMS, OUT, HAS_UPPER: tl.constexpr, HAS_LOWER: tl.constexpr, BY_KEY: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    i = tl.program_id(0)
    start = tl.load(PARAMS + i * 5)
    n_q = tl.load(PARAMS + i * 5 + 1)
    n_kv = tl.load(PARAMS + i * 5 + 2)
    upper = tl.load(PARAMS + i * 5 + 3)
    lower = tl.load(PARAMS + i * 5 + 4)
    if BY_KEY:
        lo, hi, full_lo, full_hi = query_tile_range(
            start, N_Q=n_q, N_KV=n_kv, UPPER=upper, LOWER=lower, HAS_UPPER=HAS_UPPER, HAS_LOWER=HAS_LOWER,
            BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N)
    else:
        lo, hi, full_lo, full_hi = key_tile_range(
            start, last_row=tl.minimum(start + BLOCK_M, n_q) - 1, N_KV=n_kv, UPPER=upper, LOWER=lower,
            HAS_UPPER=HAS_UPPER, HAS_LOWER=HAS_LOWER, BLOCK_N=BLOCK_N)
    tl.store(OUT + i * 4, lo)
    tl.store(OUT + i * 4 + 1, hi)
    tl.store(OUT + i * 4 + 2, full_lo)
    tl.store(OUT + i * 4 + 3, full_hi)


def _visible(i, j, n_q, n_kv, upper, lower, has_upper, has_lower):
    ok = (i < n_q) & (j < n_kv)
    if has_upper:
        ok = ok & (j <= i + upper)
    if has_lower:
        ok = ok & (j >= i + lower)
    return ok


@pytest.mark.parametrize("by_key", [False, True], ids=["key_tile_range", "query_tile_range"])
@pytest.mark.parametrize("has_upper,has_lower", list(itertools.product([False, True], repeat=2)))
@pytest.mark.parametrize("block_m,block_n", [(16, 16), (16, 32), (32, 16)])
def test_tile_ranges_cover_and_whole_tiles_need_no_mask(by_key, has_upper, has_lower, block_m, block_n):
    rng = np.random.default_rng(7)
    cases = []
    for _ in range(40):
        n_q, n_kv = (int(x) for x in rng.integers(1, 100, size=2))
        upper = int(rng.integers(-60, 100))
        lower = int(rng.integers(-100, upper + 1))
        own, block = (n_kv, block_n) if by_key else (n_q, block_m)
        start = int(rng.integers(0, (own + block - 1) // block)) * block
        cases.append((start, n_q, n_kv, upper, lower))
    params = torch.tensor(cases, dtype=torch.int32, device=DEVICE)
    out = torch.empty((len(cases), 4), dtype=torch.int32, device=DEVICE)
    _ranges_kernel[(len(cases),)](params, out, HAS_UPPER=has_upper, HAS_LOWER=has_lower, BY_KEY=by_key,
                                  BLOCK_M=block_m, BLOCK_N=block_n)
    for (start, n_q, n_kv, upper, lower), (lo, hi, full_lo, full_hi) in zip(cases, out.cpu().tolist(), strict=True):
        ctx = dict(start=start, n_q=n_q, n_kv=n_kv, upper=upper, lower=lower, got=(lo, hi, full_lo, full_hi))
        if by_key:  # this key tile's keys; the range is over query rows, in BLOCK_M tiles
            own = np.arange(start, start + block_n)
            other_n, other_block = n_q, block_m
        else:  # this query tile's rows; the range is over keys, in BLOCK_N tiles
            own = np.arange(start, start + block_m)
            other_n, other_block = n_kv, block_n
        other = np.arange(0, max(n_q, n_kv) + 2 * max(block_m, block_n))
        rows, cols = (other[:, None], own[None, :]) if by_key else (own[:, None], other[None, :])
        seen = _visible(rows, cols, n_q, n_kv, upper, lower, has_upper, has_lower)
        seen_any = seen.any(axis=1 if by_key else 0)
        assert 0 <= lo <= full_lo <= full_hi <= hi <= other_n, ctx
        assert lo % other_block == 0 and (full_lo % other_block == 0 or full_lo == hi), ctx  # hi: none whole
        assert not seen_any[:lo].any() and not seen_any[hi:].any(), ctx  # nothing visible is left out
        for t in range(full_lo, full_hi, other_block):  # a whole tile: in range and visible everywhere
            assert t + other_block <= other_n, ctx
            tile = np.arange(t, t + other_block)
            real_own = own[own < (n_kv if by_key else n_q)]
            r, c = (tile[:, None], real_own[None, :]) if by_key else (real_own[:, None], tile[None, :])
            assert _visible(r, c, n_q, n_kv, upper, lower, has_upper, has_lower).all(), ctx
