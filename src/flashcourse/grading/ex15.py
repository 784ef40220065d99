"""Exercise 15, hand-written kernels (手撕算子): the four Triton kernels an interview for a kernel or inference role
asks to write on the spot, each checked in Triton's interpreter (on a CPU) against NumPy in float64.

(a) a softmax over rows of any length, read block by block with the online softmax, from a strided view;
(b) a tiled matrix product with a loop over K; (c) a parallel sum in two levels; (d) a transpose through a tile
(Triton stages it in shared memory). The notebook gives each launcher; the learner writes the kernels. The block
sizes are the notebook's, fixed here too (:data:`BLOCKS`), so a wrong answer can be matched against the usual
mistakes: a missing mask, a wrong stride, an accumulator not rescaled or overwritten, a tail block dropped.
Sizes are small and awkward (not multiples of the blocks): the interpreter is slow and the edges are where the bugs
are.
"""

from __future__ import annotations

import numpy as np

from .. import reference
from . import _mistakes as mistakes
from ._core import Part, compare, run_check, to_numpy, to_tensor
from ._zh import bilingual

__all__ = ["BLOCKS", "check_matmul", "check_softmax_rows", "check_sum_all", "check_transpose"]

# The notebook's block sizes, which the diagnoses assume.
BLOCKS = {"softmax": 32, "matmul": 16, "sum": 64, "transpose": 16}

ROW_STRIDE = ("the row stride is wrong: x is a view whose rows are x.stride(0) elements apart, not n_cols; "
              "address row r as X + r * stride_x (and the output with its own stride)")
SOFTMAX_TAIL = ("the last column block is not masked to -inf: columns past n_cols were read as 0 (or as the next "
                "row's values) and count in the max and the sum; load with mask=cols < n_cols, other=-float('inf')")
GEMM_K_TAIL = ("the K tail is dropped: the loop stops at the last full BLOCK_K block; loop over cdiv(K, BLOCK_K) "
               "blocks and mask the last one's loads with other=0")
GEMM_OVERWRITTEN = ("the accumulator is overwritten: each K block must be added, acc += tl.dot(a, b), not "
                    "acc = tl.dot(a, b)")
GEMM_B_STRIDES = ("b's strides are ignored: b is a transposed view (b.stride() is (1, K)); address b[k, n] as "
                  "B + k * stride_bk + n * stride_bn with the strides you are given")
SUM_TAIL = ("the tail is dropped: the grid (or the loop) covers only the full blocks; use cdiv(n, BLOCK) programs "
            "and mask the last block's load with other=0")
SUM_ONE_BLOCK = ("only the first block is summed: every program must sum its own block (offset pid * BLOCK), and "
                 "the partial sums must be added up (the launcher repeats the kernel until one value is left)")
NOT_TRANSPOSED = ("the tile is stored in the order it was loaded: the output holds x's values in x's order; "
                  "store the tile at y[j, i] (tl.trans the tile, or swap the row and column offsets of the store)")
TRANSPOSE_EDGES = ("the edge tiles are missing: the grid covers only full tiles; use cdiv(M, BLOCK) x cdiv(N, BLOCK) "
                   "programs and mask the loads and stores at the edges")


# ------------------------------------------------------------------------------------------ (a) softmax over rows


def _softmax_cases(rng, hidden):
    shapes = [(1, 1), (3, 5), (2, 32), (4, 45), (2, 70)]
    if hidden:
        shapes += [(5, 97), (3, 129)]
    cases = []
    for index, (rows, cols) in enumerate(shapes):
        pad = 3 if index % 2 else 0  # x is a view of the first cols columns of a wider buffer: the row stride matters
        base = rng.standard_normal((rows, cols + pad)).astype(np.float32)
        if index == 3:  # sorted rows: the max grows block after block, so the running sum must be rescaled
            base[:, :cols] = np.sort(base[:, :cols], axis=-1) * np.float32(8)
        if index == 4:  # exp(200) overflows float32: the max must be subtracted
            base = base * np.float32(40) + np.float32(200)
        cases.append({"x": base[:, :cols].copy(), "_base": base})
    return cases


def _softmax_run(fns, case):
    cols = case["x"].shape[1]
    x = to_tensor(case["_base"])[:, :cols]  # a strided view when the buffer is wider
    return {"p": to_numpy(fns["softmax_rows"](x), "the softmax")}


def _softmax_variants(case):
    x = case["x"].astype(np.float64)
    base = case["_base"].astype(np.float64)
    rows, cols = x.shape
    block = BLOCKS["softmax"]

    def rows_at_n_cols():  # row r read at r * n_cols in the buffer
        flat = base.reshape(-1)
        return reference.softmax_safe(np.stack([flat[r * cols:(r + 1) * cols] for r in range(rows)]))

    def not_rescaled():
        m, l = mistakes.online_stats(x, block, rescale=False)
        return np.exp(x - m[..., None]) / l[..., None]

    def zero_padded():
        padded = np.zeros((rows, -(-cols // block) * block))
        padded[:, :cols] = x
        return reference.softmax_safe(padded)[:, :cols]

    found = [(mistakes.SUM_NOT_RESCALED + f" (the check assumes BLOCK = {block})", not_rescaled)]
    if base.shape[1] != cols:
        found.append((ROW_STRIDE, rows_at_n_cols))
    if cols % block:
        found.append((SOFTMAX_TAIL, zero_padded))
    return found


def _softmax_judge(case, out):
    compare("the softmax", out["p"], reference.softmax_safe(case["x"].astype(np.float64)), dtype="float32",
            variants=_softmax_variants(case), nan_hint=mistakes.NO_MAX)


SOFTMAX = Part("ex15_a", 3, "softmax_rows (online, block by block, strided rows)", ("softmax_rows",),
               _softmax_cases, _softmax_run, _softmax_judge)


@bilingual
def check_softmax_rows(softmax_rows, *, hidden=False, seed=None):
    """Check ``softmax_rows(x) -> p`` for x an (R, C) float32 view (rows x.stride(0) apart), softmax per row."""
    __tracebackhide__ = True
    run_check(SOFTMAX, {"softmax_rows": softmax_rows}, hidden=hidden, seed=seed)


# ------------------------------------------------------------------------------------------ (b) tiled GEMM


def _matmul_cases(rng, hidden):
    shapes = [(1, 1, 1), (16, 16, 16), (20, 17, 33), (33, 40, 21)]
    if hidden:
        shapes += [(47, 29, 50), (8, 64, 9)]
    cases = []
    for index, (m, n, k) in enumerate(shapes):
        a = rng.standard_normal((m, k)).astype(np.float32)
        b_t = rng.standard_normal((n, k)).astype(np.float32)  # b = b_t.T: a transposed view on odd cases
        cases.append({"a": a, "b": b_t.T.copy(), "_b_transposed": bool(index % 2)})
    return cases


def _matmul_run(fns, case):
    b = to_tensor(case["b"].T).T if case["_b_transposed"] else to_tensor(case["b"])
    return {"c": to_numpy(fns["matmul"](to_tensor(case["a"]), b), "c")}


def _matmul_judge(case, out):
    a, b = case["a"].astype(np.float64), case["b"].astype(np.float64)
    k = a.shape[1]
    block = BLOCKS["matmul"]
    full = k // block * block
    last = (-(-k // block) - 1) * block
    variants = [(GEMM_OVERWRITTEN, lambda: a[:, last:] @ b[last:])]
    if k % block:
        variants.append((GEMM_K_TAIL, lambda: a[:, :full] @ b[:full]))
    if case["_b_transposed"]:  # b's storage read as if b were row-major
        variants.append((GEMM_B_STRIDES, lambda: a @ np.ascontiguousarray(b.T).reshape(b.shape)))
    compare("c", out["c"], a @ b, dtype="float32", variants=variants)


MATMUL = Part("ex15_b", 3, "matmul (tiled, a loop over K)", ("matmul",), _matmul_cases, _matmul_run, _matmul_judge)


@bilingual
def check_matmul(matmul, *, hidden=False, seed=None):
    """Check ``matmul(a, b) -> c`` for a (M, K) and b (K, N) float32 (b sometimes a transposed view)."""
    __tracebackhide__ = True
    run_check(MATMUL, {"matmul": matmul}, hidden=hidden, seed=seed)


# ------------------------------------------------------------------------------------------ (c) parallel sum


def _sum_cases(rng, hidden):
    sizes = [1, 63, 64, 200, 4099]
    if hidden:
        sizes += [129, 10000]
    return [{"x": (rng.standard_normal(n) + 1.0).astype(np.float32)} for n in sizes]


def _sum_run(fns, case):
    return {"total": to_numpy(fns["sum_all"](to_tensor(case["x"])), "the sum").reshape(-1)}


def _sum_judge(case, out):
    x = case["x"].astype(np.float64)
    block = BLOCKS["sum"]
    full = len(x) // block * block
    variants = [(SUM_ONE_BLOCK, lambda: np.array([x[:block].sum()]))]
    if len(x) % block:
        variants.append((SUM_TAIL, lambda: np.array([x[:full].sum()])))
    compare("the sum", out["total"], np.array([x.sum()]), dtype="float32", variants=variants)


SUM = Part("ex15_c", 2, "sum_all (a parallel reduction in two levels)", ("sum_all",), _sum_cases, _sum_run,
           _sum_judge)


@bilingual
def check_sum_all(sum_all, *, hidden=False, seed=None):
    """Check ``sum_all(x) -> total`` (a one-element float32 tensor) for x a 1-D float32 tensor."""
    __tracebackhide__ = True
    run_check(SUM, {"sum_all": sum_all}, hidden=hidden, seed=seed)


# ------------------------------------------------------------------------------------------ (d) transpose


def _transpose_cases(rng, hidden):
    shapes = [(1, 1), (16, 16), (5, 37), (40, 18)]
    if hidden:
        shapes += [(33, 65), (64, 7)]
    return [{"x": rng.standard_normal(shape).astype(np.float32)} for shape in shapes]


def _transpose_run(fns, case):
    return {"y": to_numpy(fns["transpose"](to_tensor(case["x"])), "y")}


def _transpose_judge(case, out):
    x = case["x"].astype(np.float64)
    m, n = x.shape
    block = BLOCKS["transpose"]

    def edges_missing():
        y = np.zeros((n, m))
        y[:n // block * block, :m // block * block] = x.T[:n // block * block, :m // block * block]
        return y

    variants = [(NOT_TRANSPOSED, lambda: x.reshape(n, m))]
    if m % block or n % block:
        variants.append((TRANSPOSE_EDGES, edges_missing))
    compare("y", out["y"], x.T, dtype="float32", variants=variants)


TRANSPOSE = Part("ex15_d", 2, "transpose (a tile at a time)", ("transpose",), _transpose_cases, _transpose_run,
                 _transpose_judge)


@bilingual
def check_transpose(transpose, *, hidden=False, seed=None):
    """Check ``transpose(x) -> y``, y = x.T as a new contiguous (N, M) tensor, for x (M, N) float32."""
    __tracebackhide__ = True
    run_check(TRANSPOSE, {"transpose": transpose}, hidden=hidden, seed=seed)


PARTS = [SOFTMAX, MATMUL, SUM, TRANSPOSE]
