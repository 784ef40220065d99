"""FlashAttention-4's two portable ideas, in NumPy (lesson 14, exercise 16): an exp2 computed on the FMA units
instead of the exponential units, and rescaling the output only when the row max has grown by more than a threshold.

FlashAttention-4 (Zadouri, Shah, Dao et al., arXiv 2603.05451, 2026) targets Blackwell, whose tensor cores doubled
from Hopper while its exponential units (MUFU, 16 a clock an SM) did not. Two of its softmax changes need no
Blackwell hardware:

- **exp2 on the FMA units.** 2^x = 2^floor(x) * 2^frac(x). The fraction's power, on [0, 1), is a degree-3
  polynomial (three fused multiply-adds by Horner's rule); the integer part is added straight into the float's
  exponent bits (an integer add of floor(x) << 23). ``flash_attn/cute/utils.py`` (``ex2_emulation``) computes some
  of the exponentials this way, a tunable share (``ex2_emu_freq`` in ``flash_fwd_sm100.py``), the rest on MUFU.
- **conditional rescaling.** The online softmax rescales O and l by 2^(m_old - m_new) whenever a tile raises the
  row max. FA4 keeps the old max while the new one exceeds it by at most ``rescale_threshold`` (8, in log2 units,
  for 16-bit inputs; 0 for FP8): P = 2^(s - m_old) may then reach 2^8, which fp32 sums and 16-bit P hold, and the
  final division by l is exact whatever max was used. The rescale (a multiply per output element) is skipped.

Scores here are in log2 units (already multiplied by log2(e) and the softmax scale), as the kernels keep them.
NumPy only. The polynomial's coefficients are fitted here (:func:`fit_exp2_polynomial`), not copied.
"""

from __future__ import annotations

import numpy as np

from . import reference

FP8_E4M3_MAX = 448.0  # the largest finite float8_e4m3fn (OCP FP8 formats, 2022)
FP16_MAX = 65504.0
# FA4 scales P by 2^max_offset before converting it to FP8 (P lies in (0, 1], so the format's upper code points are
# otherwise unused): 8 for 8-bit inputs, 0 for 16-bit (``flash_fwd_sm100.py``, Note [Low Precision Scaling]).
FP8_P_OFFSET_LOG2 = 8.0
RESCALE_THRESHOLD_16BIT = 8.0  # FA4's rescale_threshold for fp16 / bf16 inputs, in log2 units
# Below 2^-126 (the smallest normal float32) the exponent field cannot hold the result: flush to zero, as the
# hardware's .ftz does. The softmax's arguments are s - m <= 0, and 2^-126 is nothing beside the row's max term.
SMALLEST_EXPONENT = -126.0


def fit_exp2_polynomial(degree: int = 3, *, points: int = 4097) -> np.ndarray:
    """Coefficients (c0 .. c_degree) of p(f) ~ 2^f on [0, 1], lowest first, with p(0) = 1 and p(1) = 2 exactly
    (so 2^x is continuous where floor(x) steps), by least squares on the *relative* error over ``points``
    evenly spaced f, refined by a few reweighted passes towards the smallest largest error (Lawson's method)."""
    if not isinstance(degree, int) or degree < 2:
        raise ValueError(f"degree={degree!r}: at least 2 (p(0) = 1 and p(1) = 2 fix two coefficients)")
    f = np.linspace(0.0, 1.0, points)
    target = np.exp2(f)
    # p(f) = 1 + f + sum_{k>=2} c_k (f^k - f): p(0) = 1 and p(1) = 2 for any c_k
    basis = np.stack([f ** k - f for k in range(2, degree + 1)], axis=1) / target[:, None]
    rest = (target - 1.0 - f) / target
    weights = np.ones_like(f)
    for _ in range(30):
        root = np.sqrt(weights)
        free, *_ = np.linalg.lstsq(basis * root[:, None], rest * root, rcond=None)
        error = np.abs(basis @ free - rest)
        weights = weights * (error + 1e-300)
        weights /= weights.sum()
    return np.concatenate([[1.0, 1.0 - free.sum()], free])


EXP2_POLY3 = fit_exp2_polynomial(3).astype(np.float32)
"""p(f) ~ 2^f on [0, 1): c0 + c1 f + c2 f^2 + c3 f^3, float32, lowest first (c0 = 1)."""


def exp2_emulated(x, poly=EXP2_POLY3) -> np.ndarray:
    """2^x in float32 without an exponential: split x into floor and fraction, 2^fraction by Horner's rule on
    ``poly``, the floor added into the exponent bits. x >= 128 overflows (as exp2 would); x < -126 gives 0."""
    x = np.asarray(x, dtype=np.float32)
    # -inf and the flushed range stay finite here (they become 0 below), and so does x >= 128 (inf below)
    safe = np.clip(x, np.float32(SMALLEST_EXPONENT), np.nextafter(np.float32(128.0), np.float32(0.0)))
    whole = np.floor(safe)
    frac = safe - whole  # in [0, 1), exact in float32
    coefficients = np.asarray(poly, dtype=np.float32)
    power = coefficients[-1] * np.ones_like(frac)
    for c in coefficients[-2::-1]:
        power = power * frac + c  # one FMA a coefficient on the GPU
    bits = power.view(np.int32) + (whole.astype(np.int32) << 23)  # 2^floor: add floor to the exponent field
    out = bits.view(np.float32)
    return np.where(x < SMALLEST_EXPONENT, np.float32(0.0), np.where(x >= 128.0, np.float32(np.inf), out))


def exp2_relative_error(poly=EXP2_POLY3, *, points: int = 1 << 16) -> float:
    """The largest relative error of :func:`exp2_emulated` against float64 2^x over [-126, 127] (the fraction's
    error repeats every integer; sampled at ``points`` x per integer on one period and at integer ends)."""
    frac = np.linspace(0.0, 1.0, points, endpoint=False)
    x = np.concatenate([frac - 3.0, frac, frac + 5.0, [-126.0, 0.0, 127.0]]).astype(np.float32)
    exact = np.exp2(x.astype(np.float64))
    return float(np.max(np.abs(exp2_emulated(x, poly).astype(np.float64) / exact - 1.0)))


def _check_threshold(threshold) -> None:
    if not threshold >= 0:  # NaN fails too
        raise ValueError(f"threshold={threshold!r}: a non-negative number of log2 units is expected")


def row_stats_conditional(x, *, block: int, threshold: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The online softmax's statistics of each row of x (R, C), scores in log2 units, taken ``block`` columns at a
    time, rescaling only when a block's max exceeds the kept max by more than ``threshold`` (FA4's test: keep the
    old max while m_new - m_old <= threshold). Returns (m, l, rescales): the max each row keeps (within
    ``threshold`` below the true max), l = sum 2^(x - m) with that m, and how many times each row rescaled. In
    float64; threshold 0 is the usual online softmax (rescale whenever the max grows)."""
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2 or x.shape[1] == 0:
        raise ValueError(f"x has shape {x.shape}: expected (rows, columns) with at least one column")
    if not isinstance(block, int) or block < 1:
        raise ValueError(f"block={block!r}: a positive number of columns is expected")
    _check_threshold(threshold)
    rows = x.shape[0]
    m = np.full(rows, -np.inf)
    l = np.zeros(rows)
    rescales = np.zeros(rows, dtype=np.int64)
    for start in range(0, x.shape[1], block):
        tile = x[:, start:start + block]
        grown = np.maximum(m, tile.max(axis=1))
        first = np.isneginf(m)
        move = first | (grown - m > threshold)  # the test FA4 makes (and a row's first finite max is always taken)
        rescales += move & ~first
        new_m = np.where(move, grown, m)
        with np.errstate(invalid="ignore"):  # -inf - -inf on rows with nothing yet: their l is 0 anyway
            l = np.where(move & ~first, l * np.exp2(m - new_m), l)
        m = new_m
        safe_m = np.where(np.isneginf(m), 0.0, m)
        l = l + np.exp2(tile - safe_m[:, None]).sum(axis=1)
    return m, l, rescales


def round_e4m3(x) -> np.ndarray:
    """x (non-negative, as P is) rounded to the nearest float8_e4m3fn, ties to even, saturating at 448 as Hopper's
    conversion does (``cvt.rn.satfinite.e4m3x2.f32``), in float64. e4m3 keeps 3 mantissa bits: a normal number
    (>= 2^-6) is a multiple of 2^(e - 3) for its exponent e; below, the subnormals are multiples of 2^-9."""
    x = np.asarray(x, dtype=np.float64)
    if np.any(x < 0) or np.any(np.isnan(x)):
        raise ValueError("round_e4m3 takes non-negative numbers (P): got a negative or NaN value")
    with np.errstate(divide="ignore"):
        exponent = np.maximum(np.floor(np.log2(np.where(x > 0, x, 1.0))), -6.0)
    step = np.exp2(exponent - 3.0)
    return np.minimum(np.round(x / step) * step, FP8_E4M3_MAX)  # np.round: ties to even


def group_rescale_share(x, *, block: int, threshold: float, group: int = 64) -> float:
    """The share of (row group, block) pairs, after each group's first block, in which some row of the group
    moved its max: how often a kernel that decides for ``group`` rows at once (the Gluon v9a stages decide for a
    warpgroup's 64) still rescales its output. x (R, C): scores in log2 units, R a multiple of ``group``."""
    x = np.asarray(x, dtype=np.float64)
    reference.validate_block("block", block)
    reference.validate_block("group", group)
    _check_threshold(threshold)
    if x.ndim != 2 or x.shape[0] % group or x.shape[1] <= block:
        raise ValueError(f"x has shape {x.shape}: expected (rows, columns), rows a multiple of group={group} and "
                         f"more than one block of {block} columns")
    m = np.full(x.shape[0], -np.inf)
    moved_groups = []
    for start in range(0, x.shape[1], block):
        grown = np.maximum(m, x[:, start:start + block].max(axis=1))
        first = np.isneginf(m)
        move = first | (grown - m > threshold)
        if start:
            moved_groups.append((move & ~first).reshape(-1, group).any(axis=1))
        m = np.where(move, grown, m)
    return float(np.mean(moved_groups))


def forward_conditional(q, k, v, *, threshold: float, block_k: int = 64, causal: bool = False,
                        scale: float | None = None,
                        p_shift: float | None = None) -> tuple[np.ndarray, np.ndarray, int, int]:
    """Attention of one head, q (N_q, D), k and v (N_k, D), by the online softmax over key blocks with FA4's
    conditional rescaling, in float64. Returns (o, lse, rescales, blocks): lse in natural log; rescales counts
    the (row, block) pairs that rescaled O, blocks the (row, block) pairs visited after a row's first. The output
    equals softmax(q k^T) v whatever the threshold: the final division by l undoes the max that was kept.

    ``p_shift`` (an FP8 kernel's P): the P that multiplies V is p * 2^p_shift rounded to float8_e4m3fn
    (:func:`round_e4m3`, saturating at 448), as fa3_fp8.py's kernels quantise it, while l sums the unrounded p.
    With a kept max, p reaches 2^threshold; when threshold + p_shift passes log2(448) the largest weights
    saturate and the output shrinks (trap 2), which float64 attention of the same inputs shows."""
    q, k, v = (a.astype(np.float64) for a in reference.validate_qkv(q, k, v))
    if q.ndim != 2:
        raise ValueError(f"q has shape {q.shape}: one head, (N_q, D), is expected; pass q[b, h] for a head")
    _check_threshold(threshold)
    reference.validate_block("block_k", block_k)
    if p_shift is not None and not np.isfinite(p_shift):
        raise ValueError(f"p_shift={p_shift!r}: a finite power of two is expected")
    n_q, d = q.shape
    scale = reference.resolve_scale(scale, d)
    s = (q @ k.T) * scale * np.log2(np.e)  # log2 units, as the kernels keep them
    if causal:
        s = np.where(np.arange(k.shape[0])[None, :] > np.arange(n_q)[:, None], -np.inf, s)
    m = np.full(n_q, -np.inf)
    l = np.zeros(n_q)
    o = np.zeros((n_q, v.shape[1]))
    rescales = visited = 0
    for start in range(0, k.shape[0], block_k):
        tile = s[:, start:start + block_k]
        grown = np.maximum(m, tile.max(axis=1))
        first = np.isneginf(m)
        move = first | (grown - m > threshold)
        rescale = move & ~first & np.isfinite(grown)
        rescales += int(rescale.sum())
        visited += int((~first).sum())
        new_m = np.where(move, grown, m)
        factor = np.where(rescale, np.exp2(np.where(rescale, m - new_m, 0.0)), 1.0)
        m = new_m
        p = np.exp2(tile - np.where(np.isneginf(m), 0.0, m)[:, None])  # with the max kept, new or old
        l = l * factor + p.sum(axis=1)
        p_used = p if p_shift is None else round_e4m3(p * 2.0**p_shift) / 2.0**p_shift
        o = o * factor[:, None] + p_used @ v[start:start + block_k]
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(l[:, None] > 0, o / np.where(l > 0, l, 1.0)[:, None], 0.0)
        lse = np.where(l > 0, (m + np.log2(np.where(l > 0, l, 1.0))) / np.log2(np.e), -np.inf)
    return out, lse, rescales, visited


def largest_p_log2(threshold: float, *, p_offset_log2: float = 0.0) -> float:
    """log2 of the largest P the softmax can produce: 2^(threshold) when the max lags by up to ``threshold``,
    times FA4's FP8 scaling 2^p_offset_log2."""
    return float(threshold) + float(p_offset_log2)


def check_rescale_threshold(threshold: float, dtype: str, *, p_offset_log2: float = 0.0) -> None:
    """ValueError when P could saturate ``dtype`` (its largest finite value): the threshold plus the FP8 scaling
    must stay below log2 of the format's maximum, else the largest probabilities clip to it while the fp32 sum l
    still counts them whole, and the output shrinks (report #2716 in the flash-attention repository)."""
    limits = {"float8_e4m3fn": FP8_E4M3_MAX, "float16": FP16_MAX, "bfloat16": 3.3895313892515355e38}
    if dtype not in limits:
        raise ValueError(f"dtype={dtype!r}: one of {', '.join(limits)} is expected")
    peak = largest_p_log2(threshold, p_offset_log2=p_offset_log2)
    if peak >= np.log2(limits[dtype]):
        raise ValueError(
            f"rescale threshold {threshold} with P scaled by 2^{p_offset_log2:g} lets P reach 2^{peak:g}, above "
            f"{dtype}'s largest value {limits[dtype]:g} (2^{np.log2(limits[dtype]):.2f}): the top probabilities "
            "would saturate. Lower the threshold (FA4 uses 0 for FP8) or the scaling")


def stage_ratios(rows) -> list[dict]:
    """The FA4 stages' timings of a recorded ``benchmarks/results/*-fa4-stages.json`` (its "rows"), each as its
    speed against the stage it builds on: one dict per stage, dtype, head dim, causality and length with keys
    stage, base, dtype, head_dim, causal, n, ratio (``ratio_vs_<base>``: above 1 the FA4 stage is faster),
    ratio_vs_sdpa_cudnn (16-bit rows) and ratio_vs_cudnn_fp16 (FP8 rows, ``*-fa4-stages-fp8.json``: cuDNN's fp16
    forward on the inputs before quantisation), None where a row has no such ratio. Rows that are not
    successful timings of a stage built on another are left out."""
    ratios = []
    for row in rows:
        base = row.get("builds_on")
        if row.get("kind") != "time" or row.get("status") != "ok" or not base:
            continue
        key = f"ratio_vs_{base}"
        if key not in row:
            raise ValueError(f"row of stage {row.get('stage')!r} builds on {base!r} but has no {key!r}: the run "
                             "must time the base stage beside it (bench fa4-stages does)")
        ratios.append({"stage": row["stage"], "base": base, "dtype": row["dtype"], "head_dim": row["head_dim"],
                       "causal": row["causal"], "n": row["n"], "ratio": row[key],
                       "ratio_vs_sdpa_cudnn": row.get("ratio_vs_sdpa_cudnn"),
                       "ratio_vs_cudnn_fp16": row.get("ratio_vs_cudnn_fp16")})
    return sorted(ratios, key=lambda r: (r["stage"], r["head_dim"], r["dtype"], r["causal"], r["n"]))


def ratio_ranges(ratios) -> dict[tuple[str, int], tuple[float, float]]:
    """(stage, head dim) -> (smallest, largest) ratio to the base stage over dtypes, causality and lengths, from
    :func:`stage_ratios`."""
    ranges: dict[tuple[str, int], tuple[float, float]] = {}
    for row in ratios:
        key = (row["stage"], row["head_dim"])
        low, high = ranges.get(key, (np.inf, -np.inf))
        ranges[key] = (min(low, row["ratio"]), max(high, row["ratio"]))
    return ranges
