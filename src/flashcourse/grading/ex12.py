"""Exercise 12, from memory, against the clock: the online softmax and the FlashAttention forward in NumPy, the two
pieces of code an interview for an LLM-systems role most often asks to write by hand (lesson 10).

``start_clock()`` starts a timer; each check then says how long it has been since, so a learner can drill the two
functions until they come out right, quickly. The hidden tests (a fresh Python, ``fresh_judge``) are the same
checks on more cases and ignore the clock.
"""

from __future__ import annotations

import numpy as np

from .. import reference
from . import _mistakes as mistakes
from ._core import Clock, Part, compare, copies, qkv_case, to_numpy
from ._zh import bilingual
from .ex02 import _nan_hint, _rows

__all__ = ["check_flash_forward_from_memory", "check_softmax_online_from_memory", "elapsed", "start_clock"]

_CLOCK = Clock("start_clock", "clock started: write softmax_online, then flash_forward, without looking anything up")
_timed = _CLOCK.run


def start_clock() -> None:
    """Start (or restart) the drill's clock; the checks report the time since."""
    _CLOCK.start()


def elapsed() -> str:
    """The time since :func:`start_clock`, as "4 min 07 s" (or a note that the clock was not started)."""
    return _CLOCK.elapsed()


# ------------------------------------------------------------------------------------------ (a) online softmax


def _softmax_cases(rng, hidden):
    cases = [{**case, "block": block} for case, block in zip(_rows(rng, hidden), [1, 3, 4, 4, 2, 3, 32, 2],
                                                             strict=False)]
    # the max grows at every block: a missing rescale shows at once
    cases.append({"x": np.sort(rng.standard_normal((3, 12)) * 6, axis=-1), "block": 4})
    return cases


def _softmax_run(fns, case):
    (x,) = copies(case, "x")
    return {"p": to_numpy(fns["softmax_online"](x, case["block"]), "the softmax")}


def _softmax_judge(case, out):
    x, block = case["x"], case["block"]

    def unrescaled():
        m, l_wrong = mistakes.online_stats(x, block, rescale=False)
        safe = np.where(np.isneginf(m), 0.0, m)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.exp(x - safe[..., None]) / l_wrong[..., None]

    compare("the softmax", out["p"], reference.softmax_safe(x), dtype=x.dtype.name, nan_hint=_nan_hint(x),
            variants=[(mistakes.SUM_NOT_RESCALED, unrescaled)])


SOFTMAX = Part("ex12_a", 3, "softmax_online (from memory)", ("softmax_online",), _softmax_cases, _softmax_run,
               _softmax_judge)


@bilingual
def check_softmax_online_from_memory(softmax_online, *, hidden=False, seed=None):
    """Check ``softmax_online(x, block) -> p``: one pass over blocks of ``block`` columns for (m, l), then p."""
    __tracebackhide__ = True
    _timed(SOFTMAX, {"softmax_online": softmax_online}, hidden, seed)


# ------------------------------------------------------------------------------------------ (b) the forward


def _forward_cases(rng, hidden):
    sizes = [(1, 1, 4, 4, 4, False), (10, 10, 3, 4, 4, False), (37, 37, 8, 16, 8, True), (24, 40, 8, 8, 16, False),
             (160, 160, 8, 16, 16, True)]
    if hidden:
        sizes += [(200, 200, 16, 32, 16, False), (65, 65, 4, 8, 32, True), (33, 70, 8, 16, 8, False)]
    cases = []
    for n_q, n_k, d, block_q, block_k, causal in sizes:
        case = qkv_case(rng, (), n_q, n_k, d, causal=causal, scale=None if n_q % 2 else 0.4,
                        magnitude=4.0 if n_q == 37 else 1.0)
        case.update(block_q=block_q, block_k=block_k)
        cases.append(case)
    return cases


def _forward_run(fns, case):
    q, k, v = copies(case, "q", "k", "v")
    result = fns["flash_forward"](q, k, v, block_q=case["block_q"], block_k=case["block_k"], causal=case["causal"],
                                  scale=case["scale"])
    if not isinstance(result, tuple) or len(result) != 2:
        raise AssertionError(f"flash_forward must return a tuple (o, lse), got {type(result).__name__}")
    return {"o": to_numpy(result[0], "the output o"), "lse": to_numpy(result[1], "the logsumexp lse")}


def _forward_judge(case, out):
    q, k, v = case["q"], case["k"], case["v"]
    args = dict(causal=case["causal"], scale=case["scale"])
    blocks = dict(block_q=case["block_q"], block_k=case["block_k"])
    o, lse = reference.attention_lse(q, k, v, **args)
    compare("the output o", out["o"], o, dtype="float64", nan_hint=mistakes.attention_nan_hint(q, k, **args),
            variants=mistakes.flash_mistakes(q, k, v, **args, **blocks))
    compare("the logsumexp lse", out["lse"], lse, dtype="float64",
            variants=mistakes.flash_mistakes(q, k, v, **args, **blocks, output=1))


def _forward_bytes(case) -> int:
    """Tiles, not N x N: a few blocks of q, k, v, a score tile and the row state, in float64, with room to spare."""
    d = case["q"].shape[1]
    tile = case["block_q"] * case["block_k"] + (case["block_q"] + 2 * case["block_k"]) * d + 4 * case["block_q"]
    out = case["q"].shape[0] * (d + 1)  # o and lse themselves
    return 8 * (8 * tile + 2 * out) + 64_000


FORWARD = Part("ex12_b", 5, "flash_forward (from memory)", ("flash_forward",), _forward_cases, _forward_run,
               _forward_judge, max_bytes=_forward_bytes)


@bilingual
def check_flash_forward_from_memory(flash_forward, *, hidden=False, seed=None):
    """Check ``flash_forward(q, k, v, *, block_q, block_k, causal, scale) -> (o, lse)`` on (N, d) inputs against
    the float64 reference, one tile at a time (an N x N array exceeds the memory allowed)."""
    __tracebackhide__ = True
    _timed(FORWARD, {"flash_forward": flash_forward}, hidden, seed)


PARTS = [SOFTMAX, FORWARD]
