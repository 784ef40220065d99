"""Exercise 17 (hand-written CUDA C++) on a CPU: the solutions pass on the thread-model simulator, and each usual
mistake is named, in English and Chinese: a missing __syncthreads() (a race: the two schedule orders disagree), a
shuffle mask that leaves lanes out or names lanes that do not call it, a missing bounds guard (NaN from the guard
zones, or a write past the end), a bank-conflicting tile (with the bank arithmetic), an online softmax whose sum
is not rescaled, a partial K tile dropped, a top-k softmax over the whole vocabulary."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from flashcourse.grading import ex17

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="exercise 17 runs CUDA C++ through g++")

ROOT = Path(__file__).resolve().parents[1]
CHECKS = {"block_sum": ex17.check_block_sum, "softmax_rows": ex17.check_softmax_rows_cuda,
          "transpose": ex17.check_transpose_cuda, "rmsnorm": ex17.check_rmsnorm, "sgemm": ex17.check_sgemm,
          "topk_sample": ex17.check_topk_sample}


def solution(kernel: str) -> str:
    """The solution notebook's source of one kernel (the string its ``<kernel>_cuda()`` returns)."""
    cells = json.loads((ROOT / "solutions" / "ex17_cuda_kernels.ipynb").read_text(encoding="utf-8"))["cells"]
    for cell in cells:
        text = "".join(cell["source"])
        if cell["cell_type"] == "code" and f"def {kernel}_cuda()" in text:
            return text.split("### BEGIN SOLUTION", 1)[1].split('r"""', 1)[1].split('"""', 1)[0]
    raise KeyError(kernel)


def fails_with(kernel: str, source: str, *phrases: str) -> str:
    with pytest.raises(AssertionError) as error:
        CHECKS[kernel](lambda: source)
    message = str(error.value)
    for phrase in phrases:
        assert phrase in message, f"{phrase!r} not in:\n{message}"
    assert "中文：" in message  # every diagnosis in both languages
    return message


@pytest.mark.parametrize("kernel", CHECKS)
def test_the_solution_passes_on_the_cpu_simulator(kernel, capsys):
    CHECKS[kernel](lambda: solution(kernel))
    assert "passed all" in capsys.readouterr().out


def test_a_missing_barrier_is_a_race():
    source = solution("block_sum").replace("__syncthreads();", "", 1)
    fails_with("block_sum", source, "a race on shared memory", "__syncthreads()", "数据竞争")
    source = solution("sgemm")
    second = source.rindex("__syncthreads();")  # the barrier before the next tile overwrites this one
    fails_with("sgemm", source[:second] + source[second + len("__syncthreads();"):], "a race on shared memory")
    fails_with("transpose", solution("transpose").replace("__syncthreads();", "", 1), "a race on shared memory")


def test_a_wrong_shuffle_mask_is_named():
    source = solution("block_sum").replace("__shfl_down_sync(0xffffffff", "__shfl_down_sync(0x0000ffff", 1)
    fails_with("block_sum", source, "shuffle mask 0x0000ffff", "leaves out lane 16", "mask 漏掉了")


def test_a_shuffle_inside_the_bounds_guard_is_named():
    source = solution("block_sum").replace(
        "float v = i < n ? x[i] : 0.0f;", "float v = 0.0f;\n    if (i < n) { v = x[i];").replace(
        "        v += __shfl_down_sync(0xffffffff, v, offset);\n    int lane",
        "        v += __shfl_down_sync(0xffffffff, v, offset);\n    }\n    int lane", 1)
    fails_with("block_sum", source, "waits for lanes that went on to __syncthreads()", "mask 0xffffffff (line ",
               "越界的 lane 也要参加 shuffle")


def test_a_missing_bounds_guard_is_named():
    source = solution("block_sum").replace("float v = i < n ? x[i] : 0.0f;", "float v = x[i];")
    fails_with("block_sum", source, "a read past the end", "if (i < n)", "读越界")
    source = solution("sgemm").replace("if (row < M && col < N) C[", "C[")
    fails_with("sgemm", source, "a write past the end", "写越界")


def test_a_wrong_shuffle_offset_is_named():
    source = solution("block_sum").replace("for (int offset = 16; offset > 0; offset /= 2)\n        v +=",
                                           "for (int offset = 16; offset > 16; offset /= 2)\n        v +=", 1)
    fails_with("block_sum", source, "the sum of lane 0 of each warp only", "offset = 16, 8, 4, 2, 1")


def test_a_bank_conflicting_tile_is_named_with_the_bank_arithmetic():
    source = solution("transpose").replace("[TILE][TILE + 1]", "[TILE][TILE]")
    fails_with("transpose", source, "(i * 32) mod 32 = 0", "32-way bank conflict", "(i * 33) mod 32 = i",
               "bank conflict")
    assert ex17.bank_conflict(solution("transpose")) is None


def test_an_unrescaled_online_softmax_is_named():
    source = solution("softmax_rows").replace("l = l * expf(m - m_new) + expf(in[c] - m_new);",
                                              "l = l + expf(in[c] - m_new);")
    fails_with("softmax_rows", source, "was not rescaled", "rescale 指数和")


def test_a_dropped_partial_k_tile_is_named():
    source = solution("sgemm").replace("t < (K + TILE - 1) / TILE", "t < K / TILE")
    fails_with("sgemm", source, "partial tile of K", "最后一个不满的 tile")


def test_a_top_k_softmax_over_the_whole_vocabulary_is_named():
    whole_vocab = ("    float l_all = 0.0f;\n"
                   "    for (int c = lane; c < vocab; c += 32) l_all += expf(row[c] - m);\n"
                   "    for (int offset = 16; offset > 0; offset /= 2) l_all += __shfl_xor_sync(0xffffffff, l_all, "
                   "offset);\n    l = l_all;\n    if (lane == 0) {")
    source = solution("topk_sample").replace("    if (lane == 0) {", whole_vocab, 1)
    fails_with("topk_sample", source, "over the whole vocabulary", "整个词表")


def test_a_compile_error_points_at_the_kernel():
    fails_with("rmsnorm", solution("rmsnorm").replace("float inv", "flot inv"), "does not compile", "your_kernel.cu")


def test_the_interview_rounds_diagnoses_have_chinese():
    """Exercises 12, 14 and 15 name their mistakes in Chinese too: every known diagnosis has a translation, and a
    failing check's message ends with it (the English unchanged, the exception's type kept)."""
    import numpy as np

    from flashcourse.grading import _mistakes, _zh, ex12

    sentences = [value for name, value in vars(_mistakes).items() if name.isupper() and isinstance(value, str)]
    assert sentences and set(sentences) <= set(_zh.DIAGNOSES)

    def unrescaled(x, block):  # the usual mistake: the running sum never rescaled
        m = np.full(x.shape[:-1], -np.inf)
        total = np.zeros(x.shape[:-1])
        for start in range(0, x.shape[-1], block):
            m = np.maximum(m, x[..., start:start + block].max(axis=-1))
            total = total + np.exp(x[..., start:start + block] - m[..., None]).sum(axis=-1)
        return np.exp(x - m[..., None]) / total[..., None]

    with pytest.raises(AssertionError) as error:
        ex12.check_softmax_online_from_memory(unrescaled)
    message = str(error.value)
    assert _mistakes.SUM_NOT_RESCALED in message and "中文：指数和没有 rescale" in message
