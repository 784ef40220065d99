"""Exercise 05, the backward pass: the softmax backward, attention's gradients written naively, then the
FlashAttention-2 backward that recomputes P tile by tile from the saved logsumexp and never holds N x N."""

from __future__ import annotations

import numpy as np

from .. import reference, tiled
from . import _mistakes as mistakes
from ._core import Part, compare, copies, qkv_case, randn, run_check, to_numpy

# ------------------------------------------------------------------------------------------ (a) softmax backward


def _softmax_cases(rng, hidden):
    shapes = [(1, 1), (4, 6), (2, 3, 9)] + ([(8, 64), (3, 2, 33)] if hidden else [])
    return [{"p": reference.softmax_safe(rng.standard_normal(shape) * 2), "dp": rng.standard_normal(shape)}
            for shape in shapes]


def _softmax_run(fns, case):
    p, dp = copies(case, "p", "dp")
    return {"ds": to_numpy(fns["softmax_backward"](p, dp), "dS")}


def _softmax_judge(case, out):
    p, dp = case["p"], case["dp"]
    compare("dS", out["ds"], p * (dp - np.sum(p * dp, axis=-1, keepdims=True)), dtype="float64",
            variants=[("the - rowsum(P * dP) term is missing: dS = P * (dP - rowsum(P * dP))", lambda: p * dp),
                      ("the rowsum is over the wrong axis: sum over each row (axis=-1, keepdims=True)",
                       lambda: p * (dp - np.sum(p * dp, axis=-2, keepdims=True))),
                      ("the rowsum must keep its axis (keepdims=True) to broadcast per row, not per column",
                       lambda: p * (dp - np.sum(p * dp, axis=-1)[..., None, :]) if p.shape[-1] == p.shape[-2]
                       else np.full(p.shape, np.nan))])


SOFTMAX = Part("ex05_a", 2, "softmax_backward", ("softmax_backward",), _softmax_cases, _softmax_run,
               _softmax_judge)


def check_softmax_backward(softmax_backward, *, hidden=False, seed=None):
    """Check ``softmax_backward(p, dp) -> ds``, the gradient of the row softmax."""
    __tracebackhide__ = True
    run_check(SOFTMAX, {"softmax_backward": softmax_backward}, hidden=hidden, seed=seed)


# ------------------------------------------------------------------------------------------ (b, c) attention


def _grad_cases(rng, hidden, tiled_part):
    sizes = [((), 1, 1, 4, False, 16, 16), ((), 7, 7, 3, True, 4, 4), ((2,), 12, 20, 8, False, 8, 4),
             ((), 24, 24, 8, True, 8, 16)]
    if tiled_part:
        sizes += [((), 256, 256, 16, True, 32, 32)]  # large enough that N x N dwarfs the legitimate arrays
    if hidden:
        sizes += [((2, 2), 33, 33, 16, True, 16, 8), ((), 200, 200, 8, False, 32, 32)]
    cases = []
    for lead, n_q, n_k, d, causal, block_q, block_k in sizes:
        case = qkv_case(rng, lead, n_q, n_k, d, causal=causal, scale=None if n_q % 2 else 0.3)
        case["do"] = randn(rng, *lead, n_q, d)
        if tiled_part:
            case["o"], case["lse"] = reference.attention_lse(case["q"], case["k"], case["v"], causal=causal,
                                                             scale=case["scale"])
            case.update(block_q=block_q, block_k=block_k)
        cases.append(case)
    return cases


def _unpack_grads(result, name):
    if not isinstance(result, tuple) or len(result) != 3:
        raise AssertionError(f"{name} must return a tuple (dq, dk, dv), got {type(result).__name__}")
    return {g: to_numpy(value, g) for g, value in zip(("dq", "dk", "dv"), result, strict=True)}


def _naive_run(fns, case):
    q, k, v, do = copies(case, "q", "k", "v", "do")
    return _unpack_grads(fns["attention_backward"](q, k, v, do, causal=case["causal"], scale=case["scale"]),
                         "attention_backward")


def _tiled_run(fns, case):
    q, k, v, o, lse, do = copies(case, "q", "k", "v", "o", "lse", "do")
    result = fns["flash_backward_tiles"](q, k, v, o, lse, do, causal=case["causal"], scale=case["scale"],
                                         block_q=case["block_q"], block_k=case["block_k"])
    return _unpack_grads(result, "flash_backward_tiles")


def _grad_judge(case, out):
    q, k, v, do = case["q"], case["k"], case["v"], case["do"]
    args = dict(causal=case["causal"], scale=case["scale"])
    o, lse = reference.attention_lse(q, k, v, **args)
    expected = tiled.flash_backward(q, k, v, o, lse, do, **args, block_q=16, block_k=16)
    for index, name in enumerate(("dq", "dk", "dv")):
        compare(name, out[name], expected[index], dtype="float64",
                variants=mistakes.grad_mistakes(q, k, v, do, **args, output=index),
                nan_hint="a masked score must give P = exp(-inf - lse) = 0; do not subtract -inf from -inf")


def _max_bytes(case):
    """Allow half the N x N float64 matrix (beyond the input copies), on the cases big enough for that to be
    telling: the gradients and one tile's temporaries fit well within it."""
    n_q, n_k = case["q"].shape[-2], case["k"].shape[-2]
    return n_q * n_k * 8 // 2 if n_q >= 200 else None


NAIVE = Part("ex05_b", 3, "attention_backward", ("attention_backward",),
             lambda rng, hidden: _grad_cases(rng, hidden, False), _naive_run, _grad_judge)
TILED = Part("ex05_c", 5, "flash_backward_tiles", ("flash_backward_tiles",),
             lambda rng, hidden: _grad_cases(rng, hidden, True), _tiled_run, _grad_judge, max_bytes=_max_bytes)


def check_attention_backward(attention_backward, *, hidden=False, seed=None):
    """Check ``attention_backward(q, k, v, do, causal=False, scale=None) -> (dq, dk, dv)``."""
    __tracebackhide__ = True
    run_check(NAIVE, {"attention_backward": attention_backward}, hidden=hidden, seed=seed)


def check_flash_backward_tiles(flash_backward_tiles, *, hidden=False, seed=None):
    """Check ``flash_backward_tiles(q, k, v, o, lse, do, *, causal, scale, block_q, block_k)``: the gradients,
    and that no array near N x N is allocated."""
    __tracebackhide__ = True
    run_check(TILED, {"flash_backward_tiles": flash_backward_tiles}, hidden=hidden, seed=seed)


PARTS = [SOFTMAX, NAIVE, TILED]
