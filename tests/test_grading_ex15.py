"""Exercise 15's checks (hand-written kernels, in Triton's interpreter on a CPU): right kernels pass, and each usual
mistake (a missing mask, a wrong stride, a sum not rescaled, an accumulator overwritten, a tail dropped, a tile
not transposed) is rejected with its diagnosis. Small sizes: the interpreter is slow."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from flashcourse import grading
from flashcourse.grading.ex15 import BLOCKS

RIGHT = 0


# ------------------------------------------------------------------------------------------ (a) softmax
ROWS_AT_N_COLS, NOT_RESCALED, ZERO_PADDED = 1, 2, 3


@triton.jit
def _softmax_kernel(X, Y, n_cols, stride_x, stride_y, BLOCK: tl.constexpr, MISTAKE: tl.constexpr):
    row_stride = n_cols if MISTAKE == 1 else stride_x
    x_row = X + tl.program_id(0) * row_stride
    y_row = Y + tl.program_id(0) * stride_y
    cols = tl.arange(0, BLOCK)
    pad = 0.0 if MISTAKE == 3 else -float("inf")
    m = tl.full([], -float("inf"), tl.float32)
    l = tl.full([], 0.0, tl.float32)
    for start in range(0, n_cols, BLOCK):
        x = tl.load(x_row + start + cols, mask=start + cols < n_cols, other=pad)
        m_new = tl.maximum(m, tl.max(x, axis=0))
        if MISTAKE == 2:
            l = l + tl.sum(tl.exp(x - m_new), axis=0)
        else:
            l = l * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new), axis=0)
        m = m_new
    for start in range(0, n_cols, BLOCK):
        in_row = start + cols < n_cols
        x = tl.load(x_row + start + cols, mask=in_row, other=-float("inf"))
        tl.store(y_row + start + cols, tl.exp(x - m) / l, mask=in_row)


def _softmax_rows(mistake):
    def softmax_rows(x):
        y = torch.empty(x.shape, dtype=x.dtype)
        _softmax_kernel[(x.shape[0],)](x, y, x.shape[1], x.stride(0), y.stride(0), BLOCK=BLOCKS["softmax"],
                                       MISTAKE=mistake)
        return y
    return softmax_rows


# ------------------------------------------------------------------------------------------ (b) matmul
OVERWRITTEN, K_TAIL_DROPPED, B_ROW_MAJOR = 1, 2, 3


@triton.jit
def _matmul_kernel(A, B, C, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                   BLOCK: tl.constexpr, MISTAKE: tl.constexpr):
    offs_m = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    offs_n = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    offs_k = tl.arange(0, BLOCK)
    if MISTAKE == 3:  # b taken as row-major whatever its strides
        stride_bk = N
        stride_bn = 1
    stop = K // BLOCK * BLOCK if MISTAKE == 2 else K
    acc = tl.zeros([BLOCK, BLOCK], tl.float32)
    for k in range(0, stop, BLOCK):
        a = tl.load(A + offs_m[:, None] * stride_am + (k + offs_k)[None, :] * stride_ak,
                    mask=(offs_m[:, None] < M) & (k + offs_k[None, :] < K), other=0.0)
        b = tl.load(B + (k + offs_k)[:, None] * stride_bk + offs_n[None, :] * stride_bn,
                    mask=(k + offs_k[:, None] < K) & (offs_n[None, :] < N), other=0.0)
        if MISTAKE == 1:
            acc = tl.dot(a, b, input_precision="ieee")
        else:
            acc += tl.dot(a, b, input_precision="ieee")
    tl.store(C + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn, acc,
             mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


def _matmul(mistake):
    def matmul(a, b):
        (m, k), n = a.shape, b.shape[1]
        c = torch.empty((m, n), dtype=torch.float32)
        block = BLOCKS["matmul"]
        _matmul_kernel[(triton.cdiv(m, block), triton.cdiv(n, block))](
            a, b, c, m, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1),
            BLOCK=block, MISTAKE=mistake)
        return c
    return matmul


# ------------------------------------------------------------------------------------------ (c) sum
TAIL_DROPPED, ONE_BLOCK = 1, 2


@triton.jit
def _partial_sum_kernel(X, P, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(P + tl.program_id(0), tl.sum(tl.load(X + offs, mask=offs < n, other=0.0), axis=0))


def _sum_all(mistake):
    def sum_all(x):
        block = BLOCKS["sum"]
        while True:
            n = x.numel()
            programs = {RIGHT: triton.cdiv(n, block), TAIL_DROPPED: max(n // block, 1), ONE_BLOCK: 1}[mistake]
            partials = torch.empty(programs, dtype=torch.float32)
            _partial_sum_kernel[(programs,)](x, partials, n, BLOCK=block)
            if programs == 1:
                return partials
            x = partials
    return sum_all


# ------------------------------------------------------------------------------------------ (d) transpose
NOT_TRANSPOSED, EDGES_MISSING = 1, 2


@triton.jit
def _transpose_kernel(X, Y, M, N, stride_xm, stride_xn, stride_ym, stride_yn, BLOCK: tl.constexpr,
                      MISTAKE: tl.constexpr):
    offs_m = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    offs_n = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    inside = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    tile = tl.load(X + offs_m[:, None] * stride_xm + offs_n[None, :] * stride_xn, mask=inside)
    if MISTAKE == 1:  # the same linear positions as in x
        tl.store(Y + offs_m[:, None] * N + offs_n[None, :], tile, mask=inside)
    else:
        tl.store(Y + offs_n[:, None] * stride_ym + offs_m[None, :] * stride_yn, tl.trans(tile), mask=tl.trans(inside))


def _transpose(mistake):
    def transpose(x):
        m, n = x.shape
        y = torch.zeros((n, m), dtype=x.dtype)
        block = BLOCKS["transpose"]
        rounding = (lambda size: size // block) if mistake == EDGES_MISSING else (lambda size: triton.cdiv(size, block))
        grid = (rounding(m), rounding(n))
        if 0 not in grid:
            _transpose_kernel[grid](x, y, m, n, x.stride(0), x.stride(1), y.stride(0), y.stride(1), BLOCK=block,
                                    MISTAKE=mistake)
        return y
    return transpose


# ------------------------------------------------------------------------------------------ the tests
def test_right_kernels_pass():
    grading.check_softmax_rows(_softmax_rows(RIGHT))
    grading.check_matmul(_matmul(RIGHT))
    grading.check_sum_all(_sum_all(RIGHT))
    grading.check_transpose(_transpose(RIGHT))


@pytest.mark.parametrize(("check", "make", "mistake", "diagnosis"), [
    ("check_softmax_rows", _softmax_rows, ROWS_AT_N_COLS, "row stride is wrong"),
    ("check_softmax_rows", _softmax_rows, NOT_RESCALED, "running sum is not rescaled"),
    ("check_softmax_rows", _softmax_rows, ZERO_PADDED, "last column block is not masked to -inf"),
    ("check_matmul", _matmul, OVERWRITTEN, "accumulator is overwritten"),
    ("check_matmul", _matmul, K_TAIL_DROPPED, "K tail is dropped"),
    ("check_matmul", _matmul, B_ROW_MAJOR, "b's strides are ignored"),
    ("check_sum_all", _sum_all, TAIL_DROPPED, "tail is dropped"),
    ("check_sum_all", _sum_all, ONE_BLOCK, "only the first block is summed"),
    ("check_transpose", _transpose, NOT_TRANSPOSED, "stored in the order it was loaded"),
    ("check_transpose", _transpose, EDGES_MISSING, "edge tiles are missing"),
])
def test_each_usual_mistake_is_named(check, make, mistake, diagnosis):
    with pytest.raises(AssertionError, match=diagnosis):
        getattr(grading, check)(make(mistake))


def test_an_exercise_stub_says_not_implemented():
    def stub(x):
        raise NotImplementedError("softmax_rows: fill in the TODO above")

    with pytest.raises(grading.NotImplementedYet):
        grading.check_softmax_rows(stub)
