"""Exercise 08, the Triton dK/dV kernel of the FlashAttention-2 backward: one program per key block, a loop over
query blocks that recomputes P from the saved lse. Checks ``flash_backward_dkdv(q, k, v, o, lse, do, causal,
scale) -> (dk, dv)`` against ``tiled.flash_backward`` in float64."""

from __future__ import annotations

import numpy as np

from .. import reference, tiled
from . import _mistakes as mistakes
from ._core import Part, compare, qkv_case, randn, run_check, to_numpy, to_tensor


def _cases(rng, hidden, causal):
    sizes = [(1, 1, 1), (1, 2, 16), (1, 1, 40), (2, 1, 23)]
    if hidden:
        sizes += [(1, 2, 57), (2, 1, 48)]
    cases = []
    for index, (batch, heads, n) in enumerate(sizes):
        case = qkv_case(rng, (batch, heads), n, n, 16, causal=causal, scale=None if index % 2 else 0.3,
                        dtype=np.float32)
        case["do"] = randn(rng, batch, heads, n, 16, dtype=np.float32)
        o, lse = reference.attention_lse(*(case[x].astype(np.float64) for x in "qkv"), causal=causal,
                                         scale=case["scale"])
        case["o"], case["lse"] = o.astype(np.float32), lse.astype(np.float32)
        cases.append(case)
    return cases


def _run(fns, case):
    tensors = [to_tensor(case[name]) for name in ("q", "k", "v", "o", "lse", "do")]
    result = fns["flash_backward_dkdv"](*tensors, causal=case["causal"], scale=case["scale"])
    if not isinstance(result, tuple) or len(result) != 2:
        raise AssertionError(f"flash_backward_dkdv must return (dk, dv), got {type(result).__name__}")
    return {"dk": to_numpy(result[0], "dk"), "dv": to_numpy(result[1], "dv")}


def _judge_one(which):
    def judge(case, out):
        q, k, v, do = (case[name].astype(np.float64) for name in ("q", "k", "v", "do"))
        args = dict(causal=case["causal"], scale=case["scale"])
        o, lse = reference.attention_lse(q, k, v, **args)
        expected = tiled.flash_backward(q, k, v, o, lse, do, **args, block_q=16, block_k=16)
        for name in which:
            index = {"dk": 1, "dv": 2}[name]
            compare(name, out[name], expected[index], dtype="float32",
                    variants=mistakes.grad_mistakes(q, k, v, do, **args, output=index),
                    nan_hint="padded query rows must give P = 0: load their lse as +inf (or mask P), not 0")
    return judge


DV = Part("ex08_a", 3, "flash_backward_dkdv: dv", ("flash_backward_dkdv",),
          lambda rng, hidden: _cases(rng, hidden, False), _run, _judge_one(("dv",)))
DK = Part("ex08_b", 3, "flash_backward_dkdv: dk", ("flash_backward_dkdv",),
          lambda rng, hidden: _cases(rng, hidden, False), _run, _judge_one(("dk",)))
CAUSAL = Part("ex08_c", 2, "flash_backward_dkdv (causal)", ("flash_backward_dkdv",),
              lambda rng, hidden: _cases(rng, hidden, True), _run, _judge_one(("dk", "dv")))


def check_dkdv_triton_dv(flash_backward_dkdv, *, hidden=False, seed=None):
    """Check the dv that ``flash_backward_dkdv`` returns (non-causal)."""
    __tracebackhide__ = True
    run_check(DV, {"flash_backward_dkdv": flash_backward_dkdv}, hidden=hidden, seed=seed)


def check_dkdv_triton_dk(flash_backward_dkdv, *, hidden=False, seed=None):
    """Check the dk that ``flash_backward_dkdv`` returns (non-causal)."""
    __tracebackhide__ = True
    run_check(DK, {"flash_backward_dkdv": flash_backward_dkdv}, hidden=hidden, seed=seed)


def check_dkdv_triton_causal(flash_backward_dkdv, *, hidden=False, seed=None):
    """Check dk and dv of ``flash_backward_dkdv`` with causal=True."""
    __tracebackhide__ = True
    run_check(CAUSAL, {"flash_backward_dkdv": flash_backward_dkdv}, hidden=hidden, seed=seed)


PARTS = [DV, DK, CAUSAL]
