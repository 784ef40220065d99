"""Exercise 14, the hand-written code round (手撕代码): the five pieces of attention code an interview for an
LLM-systems role asks to write on the spot, in NumPy, against the clock (lesson 10).

(a) multi-head attention forward, (b) grouped-query attention forward, (c) RoPE in both pairing conventions,
(d) one decode step of DeepSeek-V2's multi-head latent attention (MLA) with the up-projections absorbed, (e) the
KV-cache size, for standard attention and for MLA.

Every part is compared with a float64 reference written here, and a wrong answer is matched against the usual
mistakes (computed in the same way as :mod:`flashcourse.grading._mistakes`) to name the one it looks like.
``start_code_clock()`` starts a timer; each check then says how long it has been since. The hidden tests (a fresh
Python, ``fresh_judge``) are the same checks on more and larger cases, and ignore the clock.
"""

from __future__ import annotations

import tracemalloc

import numpy as np

from .. import reference
from . import _mistakes as mistakes
from ._core import Clock, Part, compare, copies, to_numpy
from ._zh import bilingual

__all__ = ["check_gqa_forward", "check_kv_cache_bytes", "check_mha_forward", "check_mla_decode", "check_rope",
           "elapsed", "start_code_clock"]

_CLOCK = Clock("start_code_clock", "clock started: write each function without looking anything up, then run its check")
_timed = _CLOCK.run


def start_code_clock() -> None:
    """Start (or restart) the code round's clock; the checks report the time since."""
    _CLOCK.start()


def elapsed() -> str:
    """The time since :func:`start_code_clock`, as "4 min 07 s" (or a note that the clock was not started)."""
    return _CLOCK.elapsed()


# The diagnoses of this exercise, one sentence each (the shared ones live in _mistakes).
SCALE_D_MODEL = ("the scale uses d_model: each head's scores are dot products of d_head = d_model / n_heads "
                 "numbers, so multiply them by 1/sqrt(d_head)")
HEADS_SPLIT = ("the heads are split wrongly: reshape the projection to (B, N, n_heads, d_head), then transpose to "
               "(B, n_heads, N, d_head); reshaping straight to (B, n_heads, N, d_head) mixes positions and heads")
HEADS_MERGED = ("the heads are merged wrongly: transpose the output back to (B, N, n_heads, d_head) before "
                "reshaping it to (B, N, d_model)")
NO_OUTPUT_PROJECTION = "the output projection is missing: multiply the merged heads by w_o"
GQA_TILED = ("the K/V heads are repeated in the wrong order: query head h uses K/V head h // (n_heads / n_kv_heads), "
             "so each K/V head is repeated in place (np.repeat(k, group, axis=1), torch's repeat_interleave), not "
             "the whole set tiled (np.tile, torch's repeat), which gives query head h the K/V head h % n_kv_heads")
ROPE_PAIRING = {
    False: ("the pairing is wrong: interleaved=False is the half-split convention, dimension i rotates with "
            "i + d/2 (rotate_half, as in Hugging Face's Llama and GPT-NeoX); you paired neighbours (2i, 2i + 1)"),
    True: ("the pairing is wrong: interleaved=True pairs neighbours (2i, 2i + 1) (RoFormer, GPT-J, Meta's "
           "original Llama code); you paired dimension i with i + d/2 (the half-split convention)"),
}
ROPE_DIRECTION = ("the rotation goes the wrong way: for a pair (x1, x2) at angle t, x1' = x1 cos t - x2 sin t and "
                  "x2' = x1 sin t + x2 cos t")
ROPE_FREQUENCIES = ("the frequencies are wrong: pair i (i = 0 .. d/2 - 1) turns at theta_i = base^(-2i/d), so the "
                    "angle of position p is p * theta_i")
ROPE_POSITIONS = ("the positions are ignored: token n turns by positions[n] (in decoding the new token is at its "
                  "place in the sequence, not at 0), not by its row index")
MLA_SCALE = ("the scale covers only the content part: the score is a dot product of d_h + d_r numbers (content "
             "and RoPE parts together), so multiply it by 1/sqrt(d_h + d_r)")
MLA_NO_ROPE = ("the RoPE part of the score is missing: add q_r . k_r (the decoupled RoPE query of each head against "
               "the RoPE key shared by all heads) to the content score")
MLA_SWAPPED = ("W_UK and W_UV are swapped: the query absorbs W_UK (q_c @ W_UK[h] gives a query in the latent space) "
               "and the output absorbs W_UV (W_UV[h] @ the attention-weighted latent)")
MLA_HEAD_AXIS = ("softmax over the wrong axis: normalise each head's scores over the cached tokens (axis -1 of "
                 "(n_heads, T)), not over the heads")
MLA_MERGE = ("the heads are concatenated in the wrong order: o has shape (n_heads, d_h) and w_o expects its rows "
             "head after head, o.reshape(-1), not o.T.reshape(-1)")


# ------------------------------------------------------------------------------------------ (a), (b) MHA and GQA


def multi_head(x, w_q, w_k, w_v, w_o, n_heads: int, n_kv_heads: int, *, causal: bool, scale_power: float = 1.0,
               scale_dim: str = "head", axis: int = -1, split: str = "right", merge: str = "right",
               group: str = "repeat", mask: str = "right", project: bool = True) -> np.ndarray:
    """Multi-head (or grouped-query) attention of x (B, N, d_model) in float64, with a chosen mistake: the
    reference when every option is left as it is."""
    x, w_q, w_k, w_v, w_o = (np.asarray(a, dtype=np.float64) for a in (x, w_q, w_k, w_v, w_o))
    b, n, _ = x.shape
    d_head = w_q.shape[1] // n_heads

    def heads(y, count):  # (B, N, count * d_head) -> (B, count, N, d_head)
        if split == "wrong":
            return y.reshape(b, count, n, d_head)
        return y.reshape(b, n, count, d_head).transpose(0, 2, 1, 3)

    q, k, v = heads(x @ w_q, n_heads), heads(x @ w_k, n_kv_heads), heads(x @ w_v, n_kv_heads)
    group_size = n_heads // n_kv_heads
    if group == "repeat":  # query head h reads K/V head h // group_size
        k, v = np.repeat(k, group_size, axis=1), np.repeat(v, group_size, axis=1)
    else:  # the mistake: query head h reads K/V head h % n_kv_heads
        k, v = np.tile(k, (1, group_size, 1, 1)), np.tile(v, (1, group_size, 1, 1))
    scale = 1.0 / np.sqrt(d_head if scale_dim == "head" else x.shape[-1])
    if scale_power == 1.0 and axis == -1 and mask == "right":
        o = reference.attention(q, k, v, causal=causal, scale=scale)
    else:
        o = mistakes.attention(q, k, v, causal=causal, scale=scale, scale_power=scale_power, mask=mask, axis=axis)
    merged = o.reshape(b, n, n_heads * d_head) if merge == "wrong" else o.transpose(0, 2, 1, 3).reshape(b, n, -1)
    return merged @ w_o if project else merged


def _heads_mistakes(case: dict) -> list[tuple[str, object]]:
    args = [case[name] for name in ("x", "w_q", "w_k", "w_v", "w_o")]
    n_heads, n_kv, causal = case["n_heads"], case.get("n_kv_heads", case["n_heads"]), case["causal"]

    def make(**mistake):
        return lambda: multi_head(*args, n_heads, n_kv, causal=causal, **mistake)

    found = [(mistakes.SCALE_FORGOTTEN, make(scale_power=0)), (mistakes.SCALE_TWICE, make(scale_power=2)),
             (SCALE_D_MODEL, make(scale_dim="model")), (mistakes.WRONG_AXIS, make(axis=-2)),
             (HEADS_SPLIT, make(split="wrong")), (HEADS_MERGED, make(merge="wrong")),
             (NO_OUTPUT_PROJECTION, make(project=False))]
    if n_kv not in (1, n_heads):
        found.insert(0, (GQA_TILED, make(group="tile")))
    if causal:
        found += [(mistakes.MASK_DIAGONAL, make(mask="diagonal")), (mistakes.MASK_ONE_LATE, make(mask="late")),
                  (mistakes.MASK_MISSING, make(mask="none")), (mistakes.MASK_REVERSED, make(mask="reversed"))]
    return found


def _weights_case(rng, b, n, d_model, n_heads, n_kv_heads, causal, magnitude=1.0) -> dict:
    d_head = d_model // n_heads
    spread = 1.0 / np.sqrt(d_model)
    return {"x": rng.standard_normal((b, n, d_model)) * magnitude,
            "w_q": rng.standard_normal((d_model, n_heads * d_head)) * spread,
            "w_k": rng.standard_normal((d_model, n_kv_heads * d_head)) * spread,
            "w_v": rng.standard_normal((d_model, n_kv_heads * d_head)) * spread,
            "w_o": rng.standard_normal((n_heads * d_head, d_model)) * spread,
            "n_heads": n_heads, "causal": causal}


def _mha_cases(rng, hidden):
    sizes = [(1, 1, 8, 2, False), (2, 5, 12, 3, True), (1, 17, 32, 4, True), (3, 9, 16, 1, False),
             (1, 12, 24, 4, False, 30.0)]  # scores in the thousands: exp overflows unless the max is subtracted
    if hidden:
        sizes += [(2, 40, 64, 8, True), (1, 33, 24, 6, False), (2, 64, 48, 4, True)]
    return [_weights_case(rng, b, n, d, h, h, causal, *rest) for b, n, d, h, causal, *rest in sizes]


def _mha_run(fns, case):
    x, w_q, w_k, w_v, w_o = copies(case, "x", "w_q", "w_k", "w_v", "w_o")
    out = fns["mha_forward"](x, w_q, w_k, w_v, w_o, case["n_heads"], causal=case["causal"])
    return {"o": to_numpy(out, "the output")}


def _projected(case):
    """q and k per query head (B, H, N, d_head) of a case, for the NaN hint."""
    x = case["x"]
    b, n, _ = x.shape
    d_head = case["w_q"].shape[1] // case["n_heads"]
    q = (x @ case["w_q"]).reshape(b, n, -1, d_head).transpose(0, 2, 1, 3)
    k = (x @ case["w_k"]).reshape(b, n, -1, d_head).transpose(0, 2, 1, 3)
    return q, np.repeat(k, q.shape[1] // k.shape[1], axis=1)


def _heads_judge(case, out):
    n_kv = case.get("n_kv_heads", case["n_heads"])
    expected = multi_head(case["x"], case["w_q"], case["w_k"], case["w_v"], case["w_o"], case["n_heads"], n_kv,
                          causal=case["causal"])
    q, k = _projected(case)
    compare("the output", out["o"], expected, dtype="float64", variants=_heads_mistakes(case),
            nan_hint=mistakes.attention_nan_hint(q, k, causal=case["causal"], scale=None))


MHA = Part("ex14_a", 3, "multi-head attention forward", ("mha_forward",), _mha_cases, _mha_run, _heads_judge)


@bilingual
def check_mha_forward(mha_forward, *, hidden=False, seed=None):
    """Check ``mha_forward(x, w_q, w_k, w_v, w_o, n_heads, *, causal=False) -> o``: x (B, N, d_model), the
    weights (d_model, d_model), o (B, N, d_model)."""
    __tracebackhide__ = True
    _timed(MHA, {"mha_forward": mha_forward}, hidden, seed)


def _gqa_cases(rng, hidden):
    sizes = [(1, 6, 16, 4, 2, False), (2, 9, 24, 6, 3, True), (1, 5, 16, 4, 4, False), (2, 7, 16, 4, 1, True),
             (1, 20, 64, 8, 2, True)]
    if hidden:
        sizes += [(2, 48, 96, 12, 4, True), (1, 31, 64, 16, 8, False)]
    cases = []
    for b, n, d, h, h_kv, causal in sizes:
        case = _weights_case(rng, b, n, d, h, h_kv, causal)
        case["n_kv_heads"] = h_kv
        cases.append(case)
    bad = _weights_case(rng, 1, 4, 24, 6, 6, False)  # 6 query heads cannot share 4 K/V heads
    bad["n_kv_heads"] = 4
    bad["w_k"], bad["w_v"] = bad["w_k"][:, :16], bad["w_v"][:, :16]
    bad["_expect_error"] = True
    cases.append(bad)
    return cases


def _gqa_run(fns, case):
    x, w_q, w_k, w_v, w_o = copies(case, "x", "w_q", "w_k", "w_v", "w_o")
    if case.get("_expect_error"):
        try:
            fns["gqa_forward"](x, w_q, w_k, w_v, w_o, case["n_heads"], case["n_kv_heads"], causal=case["causal"])
        except ValueError as error:
            named = str(case["n_heads"]) in str(error) and str(case["n_kv_heads"]) in str(error)
            return {"refused": np.array(2.0 if named else 1.0)}
        return {"refused": np.array(0.0)}
    out = fns["gqa_forward"](x, w_q, w_k, w_v, w_o, case["n_heads"], case["n_kv_heads"], causal=case["causal"])
    return {"o": to_numpy(out, "the output")}


def _gqa_judge(case, out):
    if case.get("_expect_error"):
        refused = float(np.asarray(out["refused"]))
        if refused == 0.0:
            raise AssertionError(
                f"n_heads={case['n_heads']} with n_kv_heads={case['n_kv_heads']} was accepted: the query heads "
                "cannot be split into equal groups, so raise ValueError saying that n_heads must be a multiple of "
                "n_kv_heads (with both numbers)")
        if refused == 1.0:
            raise AssertionError(
                f"n_heads={case['n_heads']} with n_kv_heads={case['n_kv_heads']} raised a ValueError that does not "
                "name both numbers (NumPy's own reshape error?): check n_heads % n_kv_heads first and raise "
                "ValueError with both numbers")
        return
    _heads_judge(case, out)


GQA = Part("ex14_b", 3, "grouped-query attention forward", ("gqa_forward",), _gqa_cases, _gqa_run, _gqa_judge)


@bilingual
def check_gqa_forward(gqa_forward, *, hidden=False, seed=None):
    """Check ``gqa_forward(x, w_q, w_k, w_v, w_o, n_heads, n_kv_heads, *, causal=False) -> o``: w_k and w_v are
    (d_model, n_kv_heads * d_head); ValueError when n_heads is not a multiple of n_kv_heads."""
    __tracebackhide__ = True
    _timed(GQA, {"gqa_forward": gqa_forward}, hidden, seed)


# ------------------------------------------------------------------------------------------ (c) RoPE


def rope(x, positions, *, base: float = 10000.0, interleaved: bool = False, direction: float = 1.0,
         exponent: float = 2.0) -> np.ndarray:
    """Rotary position embedding of x (..., N, d) at ``positions`` (N,) in float64, with a chosen mistake.

    Pair i (i = 0 .. d/2 - 1) turns by positions[n] * base^(-exponent * i / d); interleaved pairs are
    (2i, 2i + 1), half-split pairs (i, i + d/2)."""
    x = np.asarray(x, dtype=np.float64)
    d = x.shape[-1]
    theta = base ** (-exponent * np.arange(d // 2) / d)  # (d/2,)
    angle = np.asarray(positions, dtype=np.float64)[:, None] * theta[None, :]  # (N, d/2)
    cos, sin = np.cos(angle), direction * np.sin(angle)
    x1, x2 = (x[..., 0::2], x[..., 1::2]) if interleaved else (x[..., :d // 2], x[..., d // 2:])
    r1, r2 = x1 * cos - x2 * sin, x1 * sin + x2 * cos
    out = np.empty_like(x)
    if interleaved:
        out[..., 0::2], out[..., 1::2] = r1, r2
    else:
        out[..., :d // 2], out[..., d // 2:] = r1, r2
    return out


def _rope_cases(rng, hidden):
    shapes = [((1, 2), False), ((5, 8), False), ((5, 8), True), ((2, 3, 7, 16), True), ((2, 3, 7, 16), False),
              ((1, 64), False)]
    if hidden:
        shapes += [((4, 33, 64), True), ((4, 33, 64), False), ((2, 2, 9, 128), False)]
    cases = []
    for number, (shape, interleaved) in enumerate(shapes):
        n = shape[-2]
        start = 0 if number == 0 else int(rng.integers(0, 4000))
        positions = start + np.arange(n) if number % 2 else np.sort(rng.choice(5000, size=n, replace=False))
        cases.append({"x": rng.standard_normal(shape), "positions": positions.astype(np.int64),
                      "base": 10000.0 if number % 3 else 500000.0, "interleaved": interleaved})
    return cases


def _rope_run(fns, case):
    x, positions = copies(case, "x", "positions")
    out = fns["rope"](x, positions, base=case["base"], interleaved=case["interleaved"])
    return {"x": to_numpy(out, "the rotated x")}


def _rope_judge(case, out):
    x, positions = case["x"], case["positions"]
    args = dict(base=case["base"], interleaved=case["interleaved"])
    n = x.shape[-2]
    variants = [(ROPE_PAIRING[case["interleaved"]], lambda: rope(x, positions, base=case["base"],
                                                                 interleaved=not case["interleaved"])),
                (ROPE_DIRECTION, lambda: rope(x, positions, **args, direction=-1.0)),
                (ROPE_FREQUENCIES, lambda: rope(x, positions, **args, exponent=1.0)),
                (ROPE_POSITIONS, lambda: rope(x, np.arange(n), **args))]
    compare("the rotated x", out["x"], rope(x, positions, **args), dtype="float64", variants=variants)


ROPE = Part("ex14_c", 3, "RoPE, half-split and interleaved", ("rope",), _rope_cases, _rope_run, _rope_judge)


@bilingual
def check_rope(rope_fn, *, hidden=False, seed=None):
    """Check ``rope(x, positions, *, base=10000.0, interleaved=False) -> x rotated``: x (..., N, d), positions
    (N,); both pairing conventions are checked, each against its own flag."""
    __tracebackhide__ = True
    _timed(ROPE, {"rope": rope_fn}, hidden, seed)


# ------------------------------------------------------------------------------------------ (d) MLA decode


def mla_reference(q_c, q_r, c_kv, k_r, w_uk, w_uv, w_o, *, scale=None, scale_dims: str = "both",
                  rope_part: bool = True, swap: bool = False, axis: int = -1, merge: str = "right") -> np.ndarray:
    """One MLA decode step the long way (keys and values decompressed per head), in float64, with a chosen
    mistake: the output u (d_model,) of DeepSeek-V2's equations (section 2.1) for one query token."""
    q_c, q_r, c_kv, k_r, w_uk, w_uv, w_o = (np.asarray(a, dtype=np.float64)
                                             for a in (q_c, q_r, c_kv, k_r, w_uk, w_uv, w_o))
    if swap:
        w_uk, w_uv = w_uv, w_uk
    d_h, d_r = q_c.shape[-1], q_r.shape[-1]
    if scale is None:
        scale = 1.0 / np.sqrt(d_h + d_r if scale_dims == "both" else d_h)
    k_c = np.einsum("hdc,tc->htd", w_uk, c_kv)  # (H, T, d_h): what the cache avoids storing
    v_c = np.einsum("hdc,tc->htd", w_uv, c_kv)
    s = np.einsum("hd,htd->ht", q_c, k_c)
    if rope_part:
        s = s + q_r @ k_r.T  # the RoPE key is shared by every head
    p = reference.softmax_safe(s * scale, axis=axis)
    o = np.einsum("ht,htd->hd", p, v_c)  # (H, d_h)
    return w_o @ (o.T.reshape(-1) if merge == "wrong" else o.reshape(-1))


def _mla_cases(rng, hidden):
    #        T, H, d_h, d_c, d_r, d_model, scale
    sizes = [(1, 1, 4, 6, 2, 8, None), (7, 3, 8, 12, 4, 16, None), (33, 4, 16, 24, 8, 32, 0.2),
             (2048, 4, 128, 64, 16, 64, None)]  # long enough that decompressing the cache per head is too big
    if hidden:
        sizes += [(100, 8, 32, 48, 16, 64, None), (2048, 2, 128, 96, 32, 32, None)]
    cases = []
    for t, h, d_h, d_c, d_r, d_model, scale in sizes:
        cases.append({"q_c": rng.standard_normal((h, d_h)), "q_r": rng.standard_normal((h, d_r)),
                      "c_kv": rng.standard_normal((t, d_c)), "k_r": rng.standard_normal((t, d_r)),
                      "w_uk": rng.standard_normal((h, d_h, d_c)) / np.sqrt(d_c),
                      "w_uv": rng.standard_normal((h, d_h, d_c)) / np.sqrt(d_c),
                      "w_o": rng.standard_normal((d_model, h * d_h)) / np.sqrt(h * d_h), "scale": scale})
    return cases


def _mla_limit(case) -> int:
    """Bytes an absorbed decode step needs at once, with room: the scores (H, T) a few times over, the absorbed
    query and the weighted latent (H, d_c), and the output. Decompressing the cache for one head, T x d_h, is more
    on the long cases."""
    h, d_h, d_c = case["w_uk"].shape
    t, d_r = case["k_r"].shape
    return 8 * (8 * h * t + 8 * h * (d_c + d_h + d_r) + 2 * case["w_o"].shape[0]) + 96_000


_NAMES = ("q_c", "q_r", "c_kv", "k_r", "w_uk", "w_uv", "w_o")


def _mla_run(fns, case):
    arrays = copies(case, *_NAMES)
    limit = _mla_limit(case)
    started = not tracemalloc.is_tracing()
    if started:
        tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        out = fns["mla_decode"](*arrays, scale=case["scale"])
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        if started:
            tracemalloc.stop()
    if peak > limit:
        h, d_h, _ = case["w_uk"].shape
        t = case["c_kv"].shape[0]
        raise AssertionError(
            f"ex14 (d): your code allocated {peak / 1e6:.2f} MB at once for T={t} cached tokens, more than the "
            f"{limit / 1e6:.2f} MB an absorbed step needs: it decompresses the latent cache into keys or values "
            f"({t} x {d_h} per head, {h} heads). Absorb instead: the query goes into the latent space "
            "(q_c @ W_UK[h], d_c numbers per head), its scores are taken against c_KV directly, and W_UV is applied "
            "once, to the attention-weighted latent")
    return {"u": to_numpy(out, "the output u")}


def _mla_judge(case, out):
    arrays = [case[name] for name in _NAMES]

    def make(**mistake):
        return lambda: mla_reference(*arrays, scale=case["scale"], **mistake)

    variants = [(MLA_SWAPPED, make(swap=True)), (MLA_NO_ROPE, make(rope_part=False)),
                (MLA_HEAD_AXIS, make(axis=0)), (MLA_MERGE, make(merge="wrong"))]
    scale = case["scale"]
    if scale is None:
        scale = 1.0 / np.sqrt(case["q_c"].shape[-1] + case["q_r"].shape[-1])
        variants.append((MLA_SCALE, make(scale_dims="content")))
    variants += [(mistakes.SCALE_FORGOTTEN, make(scale=1.0)), (mistakes.SCALE_TWICE, make(scale=scale ** 2))]
    compare("the output u", out["u"], mla_reference(*arrays, scale=case["scale"]), dtype="float64",
            variants=variants)


MLA = Part("ex14_d", 4, "MLA decode with absorbed projections", ("mla_decode",), _mla_cases, _mla_run, _mla_judge)


@bilingual
def check_mla_decode(mla_decode, *, hidden=False, seed=None):
    """Check ``mla_decode(q_c, q_r, c_kv, k_r, w_uk, w_uv, w_o, *, scale=None) -> u``: one query token against a
    cache of T tokens holding only the latent c_kv (T, d_c) and the shared RoPE key k_r (T, d_r)."""
    __tracebackhide__ = True
    _timed(MLA, {"mla_decode": mla_decode}, hidden, seed)


# ------------------------------------------------------------------------------------------ (e) KV-cache size


def _cache_cases(rng, hidden):
    known = [dict(layers=32, kv_heads=32, head_dim=128, tokens=4096, batch=1, dtype_bytes=2),  # a 7B MHA model
             dict(layers=80, kv_heads=8, head_dim=128, tokens=32768, batch=4, dtype_bytes=2)]  # a 70B GQA model
    cases = []
    for number in range(6 if hidden else 3):
        config = known[number] if number < len(known) else dict(
            layers=int(rng.integers(3, 97)), kv_heads=int(rng.integers(3, 65)),
            head_dim=int(rng.choice([64, 96, 128])), tokens=int(rng.integers(1000, 200_000)),
            batch=int(rng.integers(3, 33)), dtype_bytes=int(rng.choice([1, 2, 4])))
        mla = dict(layers=config["layers"], latent_dim=int(rng.choice([256, 512])),
                   rope_dim=int(rng.choice([32, 64])), tokens=config["tokens"], batch=config["batch"],
                   dtype_bytes=config["dtype_bytes"])
        if number == 0:  # DeepSeek-V2's shape: 60 layers, a 512-number latent and a 64-number RoPE key
            mla.update(layers=60, latent_dim=512, rope_dim=64)
        cases.append({"kv": config, "mla": mla})
    return cases


def _cache_run(fns, case):
    kv = fns["kv_cache_bytes"](**case["kv"])
    mla = fns["mla_cache_bytes"](**case["mla"])
    return {"kv": to_numpy(kv, "kv_cache_bytes"), "mla": to_numpy(mla, "mla_cache_bytes")}


def kv_bytes(layers, kv_heads, head_dim, tokens, batch, dtype_bytes) -> int:
    """2 (K and V) x layers x KV heads x head dim x tokens x batch x bytes per number."""
    return 2 * layers * kv_heads * head_dim * tokens * batch * dtype_bytes


def mla_bytes(layers, latent_dim, rope_dim, tokens, batch, dtype_bytes) -> int:
    """layers x (latent + RoPE key) x tokens x batch x bytes: one latent per token serves both K and V, and the
    RoPE key is shared by all heads."""
    return layers * (latent_dim + rope_dim) * tokens * batch * dtype_bytes


def _exact(what: str, got, expected: int, candidates: list[tuple[str, int]], inputs: dict) -> None:
    __tracebackhide__ = True
    got = np.asarray(got)
    if got.shape != ():
        raise AssertionError(f"{what} returned an array of shape {got.shape}, expected one number (bytes)")
    value = float(got)
    if value == expected:
        return
    if value != int(value) and np.isclose(value, expected, rtol=1e-12):
        raise AssertionError(f"{what} returned {value!r}, a fraction: the bytes are a whole number (integer "
                             "arithmetic, no division)")
    message = f"{what}({', '.join(f'{k}={v}' for k, v in inputs.items())}) is {value:.10g}, expected {expected}"
    for diagnosis, wrong in candidates:
        if wrong != expected and np.isclose(value, wrong, rtol=1e-12, atol=0):
            raise AssertionError(f"{message}. Diagnosis: {diagnosis}")
    raise AssertionError(message)


def _cache_judge(case, out):
    kv, mla = case["kv"], case["mla"]
    expected = kv_bytes(**kv)
    _exact("kv_cache_bytes", out["kv"], expected, [
        ("the factor 2 is missing: the cache holds K and V, two tensors of the same size", expected // 2),
        ("the layers are missing: every layer keeps its own K and V", expected // kv["layers"]),
        ("the batch is missing: every sequence of the batch keeps its own cache", expected // kv["batch"]),
        ("the bytes per number are missing: multiply by dtype_bytes (2 for fp16 / bf16)",
         expected // kv["dtype_bytes"]),
        ("the factor 2 and the layers are missing", expected // (2 * kv["layers"])),
        ("the result is in bits, not bytes", expected * 8),
        ("the result is in GB (10^9 bytes) or GiB (2^30): return bytes", expected / 1e9),
        ("the result is in GB (10^9 bytes) or GiB (2^30): return bytes", expected / 2**30)], kv)
    expected = mla_bytes(**mla)
    twice = "MLA's latent is counted twice: one latent c_KV per token gives both K and V (no factor 2)"
    _exact("mla_cache_bytes", out["mla"], expected, [
        (twice, 2 * expected), (twice, expected + mla_bytes(**{**mla, "rope_dim": 0})),
        ("the RoPE key is missing: MLA caches the latent and the decoupled RoPE key k_R",
         mla["layers"] * mla["latent_dim"] * mla["tokens"] * mla["batch"] * mla["dtype_bytes"]),
        ("the RoPE key is counted twice (as if there were K and V parts of it): it is one key per token",
         expected + mla["layers"] * mla["rope_dim"] * mla["tokens"] * mla["batch"] * mla["dtype_bytes"]),
        ("the layers are missing: every layer keeps its own latent cache", expected // mla["layers"]),
        ("the batch is missing: every sequence of the batch keeps its own cache", expected // mla["batch"])], mla)


CACHE = Part("ex14_e", 2, "KV-cache size, standard and MLA", ("kv_cache_bytes", "mla_cache_bytes"), _cache_cases,
             _cache_run, _cache_judge)


@bilingual
def check_kv_cache_bytes(kv_cache_bytes, mla_cache_bytes, *, hidden=False, seed=None):
    """Check ``kv_cache_bytes(layers, kv_heads, head_dim, tokens, batch, dtype_bytes)`` and
    ``mla_cache_bytes(layers, latent_dim, rope_dim, tokens, batch, dtype_bytes)``, both in bytes."""
    __tracebackhide__ = True
    _timed(CACHE, {"kv_cache_bytes": kv_cache_bytes, "mla_cache_bytes": mla_cache_bytes}, hidden, seed)


PARTS = [MHA, GQA, ROPE, MLA, CACHE]
