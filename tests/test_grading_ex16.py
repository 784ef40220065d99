"""Exercise 16's checks: right kernels (written here, in Triton, run by the interpreter on a CPU) pass the hidden
tests, and each usual mistake in the emulated exp2 and in the conditional-rescale test is named."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
from flashcourse import device, fa4, grading  # noqa: E402

if not device.triton_available():
    pytest.skip("Triton is not installed here", allow_module_level=True)

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from flashcourse.grading import NotImplementedYet, ex16  # noqa: E402

C0, C1, C2, C3 = (tl.constexpr(float(c)) for c in fa4.EXP2_POLY3)
FLOOR, TRUNCATE, HARDWARE, NO_FLUSH = 0, 1, 2, 3  # how _exp2_kernel splits x (the right way and three mistakes)


@triton.jit
def _exp2_kernel(X, Y, n, HOW: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(X + offs, mask=offs < n, other=0.0)
    safe = tl.minimum(tl.maximum(x, -126.0), 127.99998)
    if HOW == 1:
        whole = safe.to(tl.int32).to(tl.float32)  # rounds toward zero
    else:
        whole = tl.floor(safe)
    frac = safe - whole
    power = C0 + frac * (C1 + frac * (C2 + frac * C3))
    y = (power.to(tl.int32, bitcast=True) + (whole.to(tl.int32) << 23)).to(tl.float32, bitcast=True)
    if HOW == 2:
        y = tl.exp2(x)
    if HOW != 3:
        y = tl.where(x < -126.0, 0.0, y)
    tl.store(Y + offs, y, mask=offs < n)


def _exp2(how):
    def emulated_exp2(x):
        y = torch.empty_like(x)
        _exp2_kernel[(triton.cdiv(x.numel(), 128),)](x, y, x.numel(), HOW=how, BLOCK=128)
        return y
    return emulated_exp2


RIGHT, EVERY_TIME, AT_LEAST, NEVER, P_NEW_MAX = 0, 1, 2, 3, 4  # the rescale test, right and four mistakes


@triton.jit
def _stats_kernel(X, M, L, R, n_cols, stride, threshold, HOW: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    m = tl.full([], -float("inf"), tl.float32)
    l = tl.full([], 0.0, tl.float32)
    rescales = tl.full([], 0, tl.int32)
    for start in range(0, n_cols, BLOCK):
        x = tl.load(X + row * stride + start + cols, mask=start + cols < n_cols, other=-float("inf"))
        grown = tl.maximum(m, tl.max(x, axis=0))
        if HOW == 1:
            move = grown > m
        elif HOW == 2:
            move = grown - m >= threshold
        elif HOW == 3:
            move = m == -float("inf")
        else:
            move = grown - m > threshold
        l = tl.where(move, l * tl.exp2(m - grown), l)
        rescales += (move & (m > -float("inf"))).to(tl.int32)
        m = tl.where(move, grown, m)
        if HOW == 4:
            l += tl.sum(tl.exp2(x - grown), axis=0)
        else:
            l += tl.sum(tl.exp2(x - m), axis=0)
    tl.store(M + row, m)
    tl.store(L + row, l)
    tl.store(R + row, rescales)


def _stats(how):
    def row_stats(x, block, threshold):
        rows = x.shape[0]
        m = torch.empty(rows, dtype=torch.float32)
        l = torch.empty_like(m)
        rescales = torch.empty(rows, dtype=torch.int32)
        _stats_kernel[(rows,)](x, m, l, rescales, x.shape[1], x.stride(0), threshold, HOW=how, BLOCK=block)
        return m, l, rescales
    return row_stats


def test_right_kernels_pass_the_hidden_tests():
    grading.check_emulated_exp2(_exp2(FLOOR), hidden=True)
    grading.check_row_stats(_stats(RIGHT), hidden=True)


@pytest.mark.parametrize(("how", "diagnosis"), [
    (TRUNCATE, "rounded toward zero"), (HARDWARE, "exponential unit's answer"), (NO_FLUSH, "below 2\\^-126")])
def test_each_exp2_mistake_is_named(how, diagnosis):
    with pytest.raises(AssertionError, match=diagnosis):
        grading.check_emulated_exp2(_exp2(how))


@pytest.mark.parametrize(("how", "diagnosis"), [
    (EVERY_TIME, "whenever the max grew"), (AT_LEAST, "exactly the threshold"), (NEVER, "never rescaled"),
    (P_NEW_MAX, "P was computed with the new max")])
def test_each_rescale_mistake_is_named(how, diagnosis):
    with pytest.raises(AssertionError, match=diagnosis):
        grading.check_row_stats(_stats(how))


def test_a_stub_says_not_implemented():
    def stub(*args):
        raise NotImplementedError("fill in the TODO")

    for check in (grading.check_emulated_exp2, grading.check_row_stats):
        with pytest.raises(NotImplementedYet, match="not implemented yet"):
            check(stub)


def test_the_parts_and_their_points():
    assert [part.grade_id for part in grading.parts("ex16_fa4_softmax")] == ["ex16_a", "ex16_b"]
    assert sum(part.points for part in ex16.PARTS) == 8
