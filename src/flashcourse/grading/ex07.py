"""Exercise 07, the inner loop of the Triton forward kernel: online softmax over key tiles, then causal.
The kernel lives in the notebook; this checks ``flash_forward_triton(q, k, v, causal, scale) -> (o, lse)``
against the float64 reference, in fp32 (on a CPU through Triton's interpreter)."""

from __future__ import annotations

import numpy as np

from .. import reference
from . import _mistakes as mistakes
from ._core import Part, compare, qkv_case, run_check, to_numpy, to_tensor

BLOCK = 16  # the notebook's BLOCK_M = BLOCK_N, for the diagnoses of the tiled loop


def _cases(rng, hidden, causal):
    sizes = [(1, 1, 1), (1, 2, 16), (1, 1, 40), (2, 1, 23), (1, 1, 32)]
    if hidden:
        sizes += [(1, 2, 57), (2, 2, 48)]
    cases = []
    for index, (batch, heads, n) in enumerate(sizes):
        magnitude = 8 if index == 4 else 1  # scores past 88, where float32 exp overflows without the max
        cases.append(qkv_case(rng, (batch, heads), n, n, 16, causal=causal, scale=None if index % 2 else 0.3,
                              magnitude=magnitude, dtype=np.float32))
    return cases


def _run(fns, case):
    result = fns["flash_forward_triton"](to_tensor(case["q"]), to_tensor(case["k"]), to_tensor(case["v"]),
                                         causal=case["causal"], scale=case["scale"])
    if not isinstance(result, tuple) or len(result) != 2:
        raise AssertionError(f"flash_forward_triton must return (o, lse), got {type(result).__name__}")
    return {"o": to_numpy(result[0], "o"), "lse": to_numpy(result[1], "lse")}


def _judge(case, out):
    q, k, v = (case[name].astype(np.float64) for name in ("q", "k", "v"))
    args = dict(causal=case["causal"], scale=case["scale"])
    o, lse = reference.attention_lse(q, k, v, **args)
    hint = mistakes.attention_nan_hint(q, k, **args)
    compare("o", out["o"], o, dtype="float32", nan_hint=hint,
            variants=mistakes.flash_mistakes(q, k, v, **args, block_q=BLOCK, block_k=BLOCK))
    compare("lse", out["lse"], lse, dtype="float32", nan_hint=hint,
            variants=[("lse must be the natural log: m + log(l), not m + log2(l) or log2-domain values",
                       lambda: lse / np.log(2)),
                      *mistakes.flash_mistakes(q, k, v, **args, block_q=BLOCK, block_k=BLOCK, output=1)])


FORWARD = Part("ex07_a", 5, "flash_forward_triton", ("flash_forward_triton",),
               lambda rng, hidden: _cases(rng, hidden, False), _run, _judge)
CAUSAL = Part("ex07_b", 3, "flash_forward_triton (causal)", ("flash_forward_triton",),
              lambda rng, hidden: _cases(rng, hidden, True), _run, _judge)


def check_flash_forward_triton(flash_forward_triton, *, hidden=False, seed=None):
    """Check ``flash_forward_triton(q, k, v, causal=False, scale=None) -> (o, lse)`` on (B, H, N, 16) fp32."""
    __tracebackhide__ = True
    run_check(FORWARD, {"flash_forward_triton": flash_forward_triton}, hidden=hidden, seed=seed)


def check_flash_forward_triton_causal(flash_forward_triton, *, hidden=False, seed=None):
    """Check the causal run of ``flash_forward_triton``."""
    __tracebackhide__ = True
    run_check(CAUSAL, {"flash_forward_triton": flash_forward_triton}, hidden=hidden, seed=seed)


PARTS = [FORWARD, CAUSAL]
