"""Exercise 08, the Triton backward of FlashAttention-2: the dK/dV kernel (one program per key block, a loop over
query blocks that recomputes P from the saved lse), the dQ kernel (one program per query block, a loop over key
blocks), and a ``torch.autograd.Function`` around the forward and both kernels.

Checks ``flash_backward_dkdv(q, k, v, o, lse, do, causal, scale) -> (dk, dv)`` and
``flash_backward_dq(...) -> dq`` against ``tiled.flash_backward`` in float64, and the gradients that
``torch.autograd.grad`` takes through ``flash_attention(q, k, v, causal, scale)`` against the same reference.
"""

from __future__ import annotations

import ast

import numpy as np

from .. import reference, tiled
from . import _mistakes as mistakes
from ._core import _PACKAGE_DIR, Part, compare, qkv_case, randn, resolve_scale, run_check, to_numpy, to_tensor

SIZES = [(1, 1, 1), (1, 2, 16), (1, 1, 40), (2, 1, 23)]  # (batch, heads, N): one row, one block, 2.5, 1.4 blocks
HIDDEN_SIZES = [(1, 2, 57), (2, 1, 48)]
PADDED_ROWS = "padded query rows must give P = 0: load their lse as +inf (or mask P), not 0"


def _cases(rng, hidden, causal, *, saved=True):
    """Cases of (batch, heads, N, N, 16) float32 inputs; ``causal`` is a bool, or "both" for every size twice.

    ``saved``: add the forward's o and lse (from the float64 reference, rounded to float32), as a backward
    kernel takes them."""
    sizes = SIZES + (HIDDEN_SIZES if hidden else [])
    flags = [False, True] if causal == "both" else [causal]
    cases = []
    for index, ((batch, heads, n), is_causal) in enumerate((size, flag) for size in sizes for flag in flags):
        case = qkv_case(rng, (batch, heads), n, n, 16, causal=is_causal,
                        scale=None if index // len(flags) % 2 else 0.3, dtype=np.float32)
        case["do"] = randn(rng, batch, heads, n, 16, dtype=np.float32)
        if saved:
            o, lse = reference.attention_lse(*(case[x].astype(np.float64) for x in "qkv"), causal=is_causal,
                                             scale=case["scale"])
            case["o"], case["lse"] = o.astype(np.float32), lse.astype(np.float32)
        cases.append(case)
    return cases


def _expected(case):
    """The float64 reference: (q, k, v, do), the keyword arguments, o and (dq, dk, dv)."""
    q, k, v, do = (case[name].astype(np.float64) for name in ("q", "k", "v", "do"))
    args = dict(causal=case["causal"], scale=case["scale"])
    o, lse = reference.attention_lse(q, k, v, **args)
    return (q, k, v, do), args, o, tiled.flash_backward(q, k, v, o, lse, do, **args, block_q=16, block_k=16)


# ------------------------------------------------------------------------------------------ (a, b, c) dK, dV
def _run_dkdv(fns, case):
    tensors = [to_tensor(case[name]) for name in ("q", "k", "v", "o", "lse", "do")]
    result = fns["flash_backward_dkdv"](*tensors, causal=case["causal"], scale=case["scale"])
    if not isinstance(result, tuple) or len(result) != 2:
        raise AssertionError(f"flash_backward_dkdv must return (dk, dv), got {type(result).__name__}")
    return {"dk": to_numpy(result[0], "dk"), "dv": to_numpy(result[1], "dv")}


def _judge_one(which):
    def judge(case, out):
        (q, k, v, do), args, _, expected = _expected(case)
        for name in which:
            index = {"dk": 1, "dv": 2}[name]
            compare(name, out[name], expected[index], dtype="float32",
                    variants=mistakes.grad_mistakes(q, k, v, do, **args, output=index), nan_hint=PADDED_ROWS)
    return judge


# ------------------------------------------------------------------------------------------ (d) dQ
def _run_dq(fns, case):
    tensors = [to_tensor(case[name]) for name in ("q", "k", "v", "o", "lse", "do")]
    result = fns["flash_backward_dq"](*tensors, causal=case["causal"], scale=case["scale"])
    if isinstance(result, tuple):
        raise AssertionError(f"ex08 (d): flash_backward_dq must return dq alone (one tensor), got a tuple of "
                             f"{len(result)}")
    return {"dq": to_numpy(result, "dq")}


def _judge_dq(case, out):
    (q, k, v, do), args, _, expected = _expected(case)
    compare("dq", out["dq"], expected[0], dtype="float32",
            variants=mistakes.grad_mistakes(q, k, v, do, **args, output=0), nan_hint=PADDED_ROWS)


# ------------------------------------------------------------------------------------------ (e) autograd.Function
FUNCTION_INPUTS = "forward(ctx, q, k, v, causal, scale)"
NO_GRAD_FN = ("the o that flash_attention returned has no grad_fn, so autograd cannot reach your backward: "
              "return FlashAttention.apply(q, k, v, causal, scale), not the forward kernel's output itself (a "
              "Triton kernel writes into a tensor autograd knows nothing about)")
WRONG_ORDER = ("the gradients come back in the wrong order: your {name} is the gradient of {other}. backward "
               f"returns one gradient per input of {FUNCTION_INPUTS}, in that order: dq, dk, dv, None, None")
DEFAULT_SCALE = ("the backward used the default scale 1/sqrt(D), not the forward's: save scale on ctx in "
                 "forward (ctx.scale = scale) and pass it to both backward kernels")
UNNORMALISED_O = ("the backward was given the unnormalised output (the accumulator before dividing by l), so "
                  "D = rowsum(dO * O) is l times too large: save the o that forward returns, the normalised one")


def _wrong_saved_state(q, k, v, do, *, causal, scale, backward_scale=None, unnormalised=False):
    """dq, dk, dv in float64 of a right backward given wrong saved state: P recomputed with ``backward_scale``
    from the forward's lse, or D taken from the output before it was divided by l."""
    forward_scale = resolve_scale(scale, q.shape[-1])
    used = forward_scale if backward_scale is None else backward_scale
    o, lse = reference.attention_lse(q, k, v, causal=causal, scale=scale)
    qk = q @ np.swapaxes(k, -1, -2)  # (..., N_q, N_k)
    keep = mistakes.causal_keep(*qk.shape[-2:]) if causal else np.ones(qk.shape[-2:], dtype=bool)
    p = np.where(keep, np.exp(qk * used - lse[..., None]), 0.0)
    if unnormalised:  # the accumulator is O * l, with l = sum of exp(s - m) over the row and m its max
        row_max = np.where(keep, qk * forward_scale, -np.inf).max(axis=-1)
        o = o * np.exp(lse - row_max)[..., None]
    dp = do @ np.swapaxes(v, -1, -2)
    ds = p * (dp - np.sum(do * o, axis=-1, keepdims=True))
    return (ds @ k) * used, (np.swapaxes(ds, -1, -2) @ q) * used, np.swapaxes(p, -1, -2) @ do


def _function_error(error: RuntimeError) -> str | None:
    """What a RuntimeError raised by torch.autograd.grad says about the learner's Function, if it is a usual
    mistake; None for anything else."""
    text = str(error)
    if "incorrect number of gradients" in text:
        return (f"FlashAttention.backward returned the wrong number of gradients ({text.split('(')[-1].rstrip(')')}"
                f"): return one per input of {FUNCTION_INPUTS}, None for causal and scale, which are not "
                "tensors: `return dq, dk, dv, None, None`")
    if "different than None" in text:
        return (f"FlashAttention.backward returned a gradient for causal or scale ({text}): they are not tensors, "
                "so return None in their places: `return dq, dk, dv, None, None`")
    if "invalid gradient" in text:
        return (f"FlashAttention.backward returned a gradient of the wrong shape ({text}): return them in the "
                f"order of {FUNCTION_INPUTS}: dq like q, dk like k, dv like v")
    return None


def _run_function(fns, case):
    import torch

    q, k, v = (to_tensor(case[name]).requires_grad_() for name in ("q", "k", "v"))
    o = fns["flash_attention"](q, k, v, causal=case["causal"], scale=case["scale"])
    if isinstance(o, tuple):
        raise AssertionError(
            f"ex08 (e): flash_attention returned a tuple of {len(o)}, expected o alone: FlashAttention.forward "
            "returns only o and keeps lse with ctx.save_for_backward (each output of forward would need its own "
            "gradient)")
    if not isinstance(o, torch.Tensor):
        raise AssertionError(f"ex08 (e): flash_attention returned a {type(o).__name__}, expected the tensor o")
    if o.grad_fn is None:
        raise AssertionError(f"ex08 (e): {NO_GRAD_FN}")
    try:  # on a GPU autograd runs backward on a thread of its own, out of the call guard's sight: not here
        with torch.autograd.set_multithreading_enabled(False):
            dq, dk, dv = torch.autograd.grad(o, (q, k, v), grad_outputs=to_tensor(case["do"]))
    except RuntimeError as error:
        diagnosis = _function_error(error)
        if diagnosis is None:
            raise
        raise AssertionError(f"ex08 (e): {diagnosis}") from None
    return {"o": to_numpy(o, "o"), "dq": to_numpy(dq, "dq"), "dk": to_numpy(dk, "dk"), "dv": to_numpy(dv, "dv")}


def _judge_function(case, out):
    (q, k, v, do), args, o, expected = _expected(case)
    compare("o (the forward's output)", out["o"], o, dtype="float32",
            variants=mistakes.attention_mistakes(q, k, v, **args))
    names = ("dq", "dk", "dv")
    for index, name in enumerate(names):
        variants = [(WRONG_ORDER.format(name=name, other="qkv"[j]), lambda j=j: expected[j])
                    for j in range(3) if j != index]
        variants += [(DEFAULT_SCALE, lambda i=index: _wrong_saved_state(q, k, v, do, **args,
                                                                        backward_scale=q.shape[-1] ** -0.5)[i]),
                     (UNNORMALISED_O, lambda i=index: _wrong_saved_state(q, k, v, do, **args, unnormalised=True)[i]),
                     *mistakes.grad_mistakes(q, k, v, do, **args, output=index)]
        compare(f"{name} (the gradient of {name[1]})", out[name], expected[index], dtype="float32",
                variants=variants, nan_hint=PADDED_ROWS)


def _course_forward_names() -> frozenset[str]:
    """The functions the course's forward (``kernels.flash_attention_forward``, which part (e) may use instead
    of exercise 07's) runs: the guard meets its kernels and their helpers too, called by Triton's interpreter
    on a CPU rather than by the course's own code. The backward's are not among them."""
    names = {"flash_attention_forward"}
    for module in ("forward", "common", "configs", "_checks"):
        tree = ast.parse((_PACKAGE_DIR / "kernels" / f"{module}.py").read_text())
        names |= {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}
    return frozenset(names)


DV = Part("ex08_a", 3, "flash_backward_dkdv: dv", ("flash_backward_dkdv",),
          lambda rng, hidden: _cases(rng, hidden, False), _run_dkdv, _judge_one(("dv",)))
DK = Part("ex08_b", 3, "flash_backward_dkdv: dk", ("flash_backward_dkdv",),
          lambda rng, hidden: _cases(rng, hidden, False), _run_dkdv, _judge_one(("dk",)))
CAUSAL = Part("ex08_c", 2, "flash_backward_dkdv (causal)", ("flash_backward_dkdv",),
              lambda rng, hidden: _cases(rng, hidden, True), _run_dkdv, _judge_one(("dk", "dv")))
DQ = Part("ex08_d", 3, "flash_backward_dq (causal and not)", ("flash_backward_dq",),
          lambda rng, hidden: _cases(rng, hidden, "both"), _run_dq, _judge_dq)
FUNCTION = Part("ex08_e", 2, "flash_attention through torch.autograd", ("flash_attention",),
                lambda rng, hidden: _cases(rng, hidden, "both", saved=False), _run_function, _judge_function,
                allowed=_course_forward_names())


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


def check_dq_triton(flash_backward_dq, *, hidden=False, seed=None):
    """Check ``flash_backward_dq(q, k, v, o, lse, do, causal=False, scale=None) -> dq``, causal and not."""
    __tracebackhide__ = True
    run_check(DQ, {"flash_backward_dq": flash_backward_dq}, hidden=hidden, seed=seed)


def check_attention_function(flash_attention, *, hidden=False, seed=None):
    """Check the gradients ``torch.autograd.grad`` takes through ``flash_attention(q, k, v, causal, scale)``
    (and its output) against the float64 reference, causal and not."""
    __tracebackhide__ = True
    run_check(FUNCTION, {"flash_attention": flash_attention}, hidden=hidden, seed=seed)


PARTS = [DV, DK, CAUSAL, DQ, FUNCTION]
