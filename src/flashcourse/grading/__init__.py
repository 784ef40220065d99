"""Exercise checks, the solutions-to-exercises release and the batch grader.

In a notebook: ``from flashcourse import grading`` then ``grading.check_naive_attention(naive_attention)``: it
runs your function on fresh random inputs of several awkward sizes, compares with the float64 reference within
``flashcourse.tolerance`` and either prints that it passed or raises AssertionError saying what is wrong (the
first mismatching index, yours vs expected, and the usual mistake it looks like).

Instructors: ``python -m flashcourse.grading release`` writes ``exercises/`` from ``solutions/``;
``flashcourse grade SUBMISSION.ipynb... --out DIR`` grades submissions in batch (docs/GRADING.md).
"""

from __future__ import annotations

import importlib

from . import _display
from ._core import ForbiddenCallError, NotImplementedYet, Part, keep_going, run_check

EXERCISES = {
    "ex01_naive_attention": "ex01",
    "ex02_softmax": "ex02",
    "ex03_tiled_forward": "ex03",
    "ex04_io": "ex04",
    "ex05_backward": "ex05",
    "ex06_triton_softmax": "ex06",
    "ex07_triton_forward": "ex07",
    "ex08_triton_backward": "ex08",
    "ex09_decode_combine": "ex09",
    "ex10_mask_rules": "ex10",
    "ex11_ring_schedule": "ex11",
    "ex12_from_memory_no_hints": "ex12",  # the same checks without hints; before ex12_from_memory, which names "ex12"
    "ex12_from_memory": "ex12",
    "ex13_warp_schedule": "ex13",
    "ex14_interview_code": "ex14",
    "ex15_handwritten_kernels": "ex15",
    "ex16_fa4_softmax": "ex16",
}

# check function name -> module that defines it; modules load on first use (the Triton ones import torch).
_CHECKS = {
    "check_attention_scores": "ex01", "check_apply_causal_mask": "ex01", "check_naive_attention": "ex01",
    "check_softmax_safe": "ex02", "check_merge": "ex02", "check_online_stats": "ex02",
    "check_softmax_online": "ex02",
    "check_tile_update": "ex03", "check_flash_attention_sram": "ex03", "check_flash_attention_sram_causal": "ex03",
    "check_block_sizes": "ex04", "check_flash_traffic": "ex04", "check_standard_traffic": "ex04",
    "check_softmax_backward": "ex05", "check_attention_backward": "ex05", "check_flash_backward_tiles": "ex05",
    "check_triton_softmax": "ex06", "check_triton_softmax_long_rows": "ex06",
    "check_flash_forward_triton": "ex07", "check_flash_forward_triton_causal": "ex07",
    "check_dkdv_triton_dv": "ex08", "check_dkdv_triton_dk": "ex08", "check_dkdv_triton_causal": "ex08",
    "check_dq_triton": "ex08", "check_attention_function": "ex08",
    "check_combine_partials": "ex09", "check_split_kv_attention": "ex09", "check_combine_triton": "ex09",
    "check_prefix_lm_mask": "ex10", "check_chunked_causal_mask": "ex10", "check_block_kinds": "ex10",
    "check_chunked_causal_triton": "ex10", "check_tree_mask": "ex10",
    "check_zigzag_indices": "ex11", "check_block_schedule": "ex11", "check_dkv_route": "ex11",
    "check_ring_hide_positions": "ex11",
    "check_softmax_online_from_memory": "ex12", "check_flash_forward_from_memory": "ex12", "start_clock": "ex12",
    "check_tile_latencies": "ex13", "check_pingpong_order": "ex13", "check_overlap_order": "ex13",
    "check_fa3_order": "ex13",
    "check_mha_forward": "ex14", "check_gqa_forward": "ex14", "check_rope": "ex14", "check_mla_decode": "ex14",
    "check_kv_cache_bytes": "ex14", "start_code_clock": "ex14",
    "check_softmax_rows": "ex15", "check_matmul": "ex15", "check_sum_all": "ex15", "check_transpose": "ex15",
    "check_emulated_exp2": "ex16", "check_row_stats": "ex16",
}

__all__ = ["EXERCISES", "ForbiddenCallError", "NotImplementedYet", "Part", "keep_going", "parts", "run_check",
           *_CHECKS]

_display.hide_grader_frames()


def parts(exercise: str) -> list[Part]:
    """The graded parts of an exercise, by notebook name ("ex01_naive_attention") or short name ("ex01")."""
    short = EXERCISES.get(exercise, exercise)
    if short not in EXERCISES.values():
        raise KeyError(f"unknown exercise {exercise!r}: expected one of {sorted(EXERCISES)}")
    return importlib.import_module(f"{__name__}.{short}").PARTS


def __getattr__(name: str):
    if name in _CHECKS:
        return getattr(importlib.import_module(f"{__name__}.{_CHECKS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(__all__)
