"""The evidence behind the interview answers: numbers computed from the course, and resolvers for references.

An answer in the question bank that quotes a number must carry the evidence that holds it. Evidence is one of:

- ``{compute: NAME, args: {...}}``: a function below (registered in :data:`COMPUTE`), run on the spot. These
  are short and deterministic (IO counts from :mod:`flashcourse.iomodel`, FLOP formulas from
  :mod:`flashcourse.bench`, arithmetic on published hardware figures), so a test can run every one in seconds.
- ``{notebook: "notebooks/NN_x.ipynb", cell_tag: TAG}``: a code cell carrying TAG in ``metadata.tags``; the
  learner sees the number there. When it also has ``compute``, the tagged cell must call that same function
  (the test reads the cell's source), so the notebook and the bank cannot show different numbers without
  executing the notebook in the test.
- ``{notebook: "notebooks/NN_x.ipynb", heading: TEXT}``: a pointer to a lesson's section, the markdown cell
  whose heading line contains TEXT (for lessons whose cells carry no tags); it holds no number.
- ``{results: "benchmarks/results/<file>.json", key: PATH}``: a value in a committed GPU result; PATH is dotted,
  with ``name[3]`` for a list index or ``name[k=v,k2=v2]`` for the one list element whose fields match. With
  ``divide_by: PATH2`` the item holds the ratio of the two values of that file (a speed against another one
  measured in the same run); with ``multiply: X`` it is scaled (100 for a percentage, -100 for a cost that the
  file records as a negative saving).
- ``{paper: TITLE, section: WHERE, value: X}``: a figure reported in a paper or blog post (cited, not
  recomputed: we cannot rerun the authors' H100 measurements).

Paths (``notebooks/...``, ``benchmarks/results/...``) are relative to :func:`flashcourse.resources.course_root`:
the checkout, or the copy of those folders that a wheel ships.

Every kind may carry ``quote``: the number exactly as the answer writes it (``"740"``, ``"2.30"``, ``"16"``).
:func:`quote_matches` accepts it when the evidence's value rounds to it at the precision the quote is written
with.
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np

from .. import bench, iomodel, reference, resources, tiled, tolerance

__all__ = [
    "COMPUTE",
    "attention_gflop",
    "backward_matmuls_over_forward",
    "causal_tile_fraction",
    "compute_time_us",
    "bank_conflict_ways",
    "decode_benchmark_page_size",
    "decode_compute_bound_batch",
    "occupancy_percent",
    "pipeline_bubble_percent",
    "tile_intensity",
    "training_memory_gb",
    "warp_sectors",
    "weight_read_ms",
    "weights_gb",
    "decode_intensity",
    "cascade_read_ratio",
    "mla_absorbed_over_naive",
    "mla_decode_intensity",
    "mla_decode_over_ridge",
    "spec_expected_tokens",
    "warpgroup_registers",
    "io_algorithm_ratio",
    "io_traffic_mb",
    "kv_cache_gb",
    "latent_cache_gb",
    "paper_block_size",
    "percent_more",
    "ridge_point",
    "standard_traffic_mb",
    "transfer_time_us",
    "EvidenceError",
    "attention_matrix_bytes",
    "backward_over_forward",
    "compute",
    "decode_grid_fill",
    "exp_overflow_at",
    "exp_time_over_matmul_time",
    "flash_block_size",
    "flash_traffic_growth",
    "flops_growth",
    "io_traffic",
    "io_traffic_ratio",
    "lse_bytes",
    "matmul_flops_per_score",
    "memory_saved_ratio",
    "notebook_cell",
    "notebook_heading",
    "quote_matches",
    "rescale_time_share",
    "resolve_key",
    "results_value",
    "sram_sum_mb",
    "throughput_ratio",
    "tiled_is_exact",
]


class EvidenceError(LookupError):
    """An evidence reference that does not resolve: a missing file, cell tag, key or compute function."""


# ------------------------------------------------------------------------------------------- computed numbers
def _random_qkv(n: int, d: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal((n, d)) for _ in range(3))


@functools.lru_cache(maxsize=64)
def io_traffic(n: int, d: int, sram: int, algorithm: str = "flash", block_q: int | None = None,
               block_k: int | None = None) -> int:
    """HBM traffic (elements read + written) of one head of attention, (N, d) inputs, in an SRAM of M elements,
    counted by :func:`flashcourse.iomodel.simulate` (the counts do not depend on the data; cached, since the
    bank quotes some of them more than once). Block sizes default to the algorithm's rule for M."""
    _, stats = iomodel.simulate(algorithm, *_random_qkv(n, d), sram=sram, block_q=block_q, block_k=block_k)
    return stats.total


def io_traffic_mb(n: int, d: int, sram: int, algorithm: str = "flash", block_q: int | None = None,
                  block_k: int | None = None, bytes_per_element: int = 2) -> float:
    """:func:`io_traffic` in MB (10^6 bytes) at ``bytes_per_element`` (2: fp16 or bf16)."""
    return io_traffic(n, d, sram, algorithm, block_q, block_k) * bytes_per_element / 1e6


def standard_traffic_mb(batch: int, heads: int, n: int, d: int, bytes_per_element: int = 2) -> float:
    """Bytes the standard three-step attention moves through HBM (:func:`flashcourse.iomodel.naive_attention_hbm_bytes`,
    lesson 01's line-by-line count), in MB."""
    return iomodel.naive_attention_hbm_bytes(batch, heads, n, d, bytes_per_element=bytes_per_element)["total"] / 1e6


def io_algorithm_ratio(n: int, d: int, sram: int, algorithm: str, baseline: str) -> float:
    """Traffic of one simulated algorithm over another's, same N, d and M (e.g. "flash2" over "flash")."""
    return io_traffic(n, d, sram, algorithm) / io_traffic(n, d, sram, baseline)


def io_traffic_ratio(n: int, d: int, sram: int) -> float:
    """Traffic of the standard three-step attention over FlashAttention's, same N, d and M."""
    return io_traffic(n, d, sram, "standard") / io_traffic(n, d, sram, "flash")


def flash_traffic_growth(n: int, d: int, sram: int) -> float:
    """How much FlashAttention's HBM traffic grows when N doubles: about 4 (quadratic), not 2 (linear)."""
    return io_traffic(2 * n, d, sram, "flash") / io_traffic(n, d, sram, "flash")


def flash_block_size(sram: int, d: int, which: str = "block_k") -> int:
    """B_c (``"block_k"``) or B_r (``"block_q"``) that Algorithm 1 of FlashAttention picks for M elements and head
    dim d, as :func:`flashcourse.iomodel.flash_block_sizes` shrinks it to fit one step in SRAM."""
    block_q, block_k = iomodel.flash_block_sizes(sram, d)
    if which not in ("block_q", "block_k"):
        raise ValueError(f'which must be "block_q" or "block_k", got {which!r}')
    return block_q if which == "block_q" else block_k


def paper_block_size(sram: int, d: int) -> int:
    """B_c as Algorithm 1 of the FlashAttention paper writes it, ``ceil(M / 4d)``, before any shrinking to fit
    (compare :func:`flash_block_size`, the simulator's size after it checks that one step fits)."""
    return -(-sram // (4 * d))


def matmul_flops_per_score(d: int) -> float:
    """Matmul FLOPs per entry of the N x N score matrix in the forward: 4 d (QK^T and PV), from
    :func:`flashcourse.bench.attention_flops`. Each entry also needs one exponential."""
    n = 64
    return bench.attention_flops(1, 1, n, d) / (n * n)


def exp_time_over_matmul_time(d: int, matmul_tflops: float, exp_tflops: float) -> float:
    """Time of the exponentials as a percentage of the time of the matmuls in the forward, if each ran alone at
    its peak rate: one exp per score against 4 d matmul FLOPs per score."""
    return 100.0 * (1.0 / exp_tflops) / (matmul_flops_per_score(d) / matmul_tflops)


def rescale_time_share(d: int, block_k: int, nonmatmul_cost: float = 1.0) -> float:
    """Percent that the online softmax's rescaling adds to the forward's matmul work: per K/V block each row
    multiplies its accumulator (d numbers) and its sum by alpha = exp(m_old - m_new) and computes alpha, i.e.
    (d + 2) / B_c operations per score, against 4 d matmul FLOPs per score. ``nonmatmul_cost``: how many times
    dearer a non-matmul operation is than a matmul FLOP (1 counts FLOPs; 16 is the A100's throughput ratio).
    A throughput estimate, not a bound on time: the rescale sits between a tile's two matrix products, so it can
    also delay them (lesson 09)."""
    return 100.0 * nonmatmul_cost * (d + 2) / block_k / matmul_flops_per_score(d)


def flops_growth(n: int, d: int) -> float:
    """How much attention's FLOPs grow when N doubles (:func:`flashcourse.bench.attention_flops`): 4."""
    return bench.attention_flops(1, 1, 2 * n, d) / bench.attention_flops(1, 1, n, d)


def tiled_is_exact(n: int, d: int, block_q: int, block_k: int, causal: bool = False) -> float:
    """1.0 when :func:`flashcourse.tiled.flash_forward` equals :func:`flashcourse.reference.attention` in float64
    (within the float64 tolerance) on random inputs, else 0.0: FlashAttention is exact, not an approximation."""
    q, k, v = _random_qkv(n, d, seed=1)
    expected = reference.attention(q, k, v, causal=causal)
    got, _ = tiled.flash_forward(q, k, v, causal=causal, block_q=block_q, block_k=block_k)
    rtol, atol = tolerance.tolerance_for("float64")
    return float(np.allclose(got, expected, rtol=rtol, atol=atol))


def exp_overflow_at(dtype: str) -> float:
    """The x above which exp(x) overflows to inf in ``dtype``: log of its largest finite number."""
    return float(np.log(np.finfo(np.dtype(dtype)).max.astype(np.float64)))


def throughput_ratio(fast: float, slow: float) -> float:
    """fast / slow: e.g. how many times dearer a non-matmul FLOP is than a matmul FLOP."""
    return fast / slow


def sram_sum_mb(num_sms: int, kb_per_sm: float) -> float:
    """On-chip SRAM summed over all SMs, in MB (10^6 bytes), from KB (1024 bytes) per SM."""
    return num_sms * kb_per_sm * 1024 / 1e6


def backward_over_forward() -> float:
    """Backward matmul FLOPs over forward ones (:data:`flashcourse.bench.BACKWARD_OVER_FORWARD`)."""
    return bench.BACKWARD_OVER_FORWARD


def backward_matmuls_over_forward(recompute: bool = True) -> float:
    """Matmul FLOPs of the backward over the forward's two: four products (dV, dP, dQ, dK) with P stored, five
    when S = QK^T is recomputed; with recomputation this is :data:`flashcourse.bench.BACKWARD_OVER_FORWARD`."""
    ratio = (4 + (1 if recompute else 0)) / 2
    if recompute and ratio != bench.BACKWARD_OVER_FORWARD:
        raise EvidenceError(f"bench.BACKWARD_OVER_FORWARD is {bench.BACKWARD_OVER_FORWARD}, the count gives {ratio}")
    return ratio


def percent_more(value: float, base: float) -> float:
    """How many percent ``value`` is above ``base``: 100 (value / base - 1)."""
    return 100.0 * (value / base - 1.0)


def attention_gflop(batch: int, heads: int, n: int, d: int, causal: bool = False, mode: str = "fwd") -> float:
    """Matmul GFLOPs (10^9) of attention, :func:`flashcourse.bench.attention_flops` (causal halves them)."""
    return bench.attention_flops(batch, heads, n, d, causal=causal, mode=mode) / 1e9


def compute_time_us(gflop: float, tflops: float) -> float:
    """Microseconds to do ``gflop`` GFLOPs at ``tflops`` TFLOP/s."""
    return gflop * 1e9 / (tflops * 1e12) * 1e6


def transfer_time_us(mb: float, tbs: float) -> float:
    """Microseconds to move ``mb`` MB at ``tbs`` TB/s."""
    return mb * 1e6 / (tbs * 1e12) * 1e6


def ridge_point(tflops: float, tbs: float) -> float:
    """The Roofline model's ridge point: FLOPs per byte at which a kernel stops being memory-bound."""
    return tflops / tbs


def kv_cache_gb(layers: int, kv_heads: int, head_dim: int, tokens: int, batch: int = 1,
                bytes_per_element: int = 2) -> float:
    """KV cache in GB (10^9 bytes): 2 (K and V) x layers x KV heads x head dim x tokens x batch x bytes."""
    return 2 * layers * kv_heads * head_dim * tokens * batch * bytes_per_element / 1e9


def latent_cache_gb(layers: int, latent_dim: int, rope_dim: int, tokens: int, batch: int = 1,
                    bytes_per_element: int = 2) -> float:
    """MLA's cache in GB: one compressed latent (``latent_dim``) plus one shared RoPE key (``rope_dim``) per token
    per layer, no separate K and V, no per-head copies."""
    return layers * (latent_dim + rope_dim) * tokens * batch * bytes_per_element / 1e9


def decode_intensity(q_heads: int, kv_heads: int, bytes_per_element: int = 2) -> float:
    """FLOPs per byte of a decode step (one query token): each K and V row of d elements is read once and used
    by the q_heads / kv_heads query heads of its group, 4 d FLOPs each, against 2 d elements read."""
    return (4 * q_heads / kv_heads) / (2 * bytes_per_element)


def mla_decode_intensity(q_heads: int, latent_dim: int, rope_dim: int, query_tokens: int = 1,
                         bytes_per_element: int = 2) -> float:
    """FLOPs per byte of an MLA decode step with the projections absorbed: per cached token the kernel reads one
    latent row of ``latent_dim + rope_dim`` elements, which serves as the key (all of it) and as the value (the
    latent part) for every query head and query token: ``2 (latent + rope) + 2 latent`` FLOPs each."""
    flops = q_heads * query_tokens * 2 * ((latent_dim + rope_dim) + latent_dim)
    return flops / ((latent_dim + rope_dim) * bytes_per_element)


def mla_decode_over_ridge(q_heads: int, latent_dim: int, rope_dim: int, tflops: float, tbs: float,
                          query_tokens: int = 1) -> float:
    """:func:`mla_decode_intensity` over the ridge point (above 1: compute-bound on that GPU)."""
    return mla_decode_intensity(q_heads, latent_dim, rope_dim, query_tokens) / ridge_point(tflops, tbs)


def mla_absorbed_over_naive(latent_dim: int, rope_dim: int, nope_dim: int, v_dim: int) -> float:
    """FLOPs per query-key pair and head of MLA attention with the up-projections absorbed (QK over the latent plus
    the RoPE part, PV over the latent) over those of attention on decompressed K and V (QK over ``nope_dim +
    rope_dim``, PV over ``v_dim``): why prefill, which is compute-bound, decompresses instead."""
    return (2 * (latent_dim + rope_dim) + 2 * latent_dim) / (2 * (nope_dim + rope_dim) + 2 * v_dim)


def warpgroup_registers(producer: int, consumer: int, consumer_groups: int = 2) -> int:
    """32-bit registers a thread block of one producer warpgroup and ``consumer_groups`` consumer warpgroups (128
    threads each) holds after ``setmaxnreg`` sets ``producer`` and ``consumer`` registers per thread."""
    return 128 * (producer + consumer * consumer_groups)


def spec_expected_tokens(acceptance: float, draft_len: int) -> float:
    """Tokens one verification step yields in speculative decoding with ``draft_len`` drafted tokens, each accepted
    independently with probability ``acceptance`` (Leviathan et al. 2023, Equation 1): (1 - a^(k+1)) / (1 - a)."""
    if not 0 <= acceptance < 1:
        raise ValueError(f"acceptance must be in [0, 1), got {acceptance}")
    return (1 - acceptance ** (draft_len + 1)) / (1 - acceptance)


def cascade_read_ratio(batch: int, prefix: int, suffix: int) -> float:
    """K/V rows a decode step reads when each of ``batch`` requests reads its own copy of a shared ``prefix`` plus
    its ``suffix``, over the rows a cascade (shared-prefix) kernel reads: the prefix once plus every suffix."""
    return batch * (prefix + suffix) / (prefix + batch * suffix)


def causal_tile_fraction(n: int, block: int, kind: str = "computed", of: str = "all") -> float:
    """Under a causal mask, the fraction of the tiles that are computed (full or diagonal), or of one ``kind``
    ("full", "diagonal", "skipped"), from :func:`flashcourse.tiled.tile_schedule`; ``of="all"`` counts against all
    (N / block)^2 tiles, ``of="computed"`` against the computed ones only (diagonal: 1 / T of all tiles, but
    2 / (T + 1) of the computed ones, T = N / block)."""
    tiles = tiled.tile_schedule(n, n, block, block, causal=True)
    kinds = ("full", "diagonal") if kind == "computed" else (kind,)
    if of not in ("all", "computed"):
        raise ValueError(f'of must be "all" or "computed", got {of!r}')
    pool = tiles if of == "all" else [t for t in tiles if t.kind in ("full", "diagonal")]
    return sum(t.kind in kinds for t in pool) / len(pool)


def weights_gb(params_b: float, bits: int = 16) -> float:
    """Bytes of a model's weights in GB (10^9): ``params_b`` billion parameters at ``bits`` bits each (16: bf16,
    8: INT8 or FP8, 4: INT4), scales and zero points not counted."""
    return params_b * bits / 8


def weight_read_ms(params_b: float, tbs: float, bits: int = 16) -> float:
    """Milliseconds to read every weight once at ``tbs`` TB/s: the floor of one decode step of a dense model at
    batch 1, where every weight is read for one token."""
    return weights_gb(params_b, bits) / (tbs * 1e3) * 1e3


def decode_compute_bound_batch(tflops: float, tbs: float, bits: int = 16) -> float:
    """Tokens per decode step at which a dense model's weight GEMMs stop being memory-bound: each weight (``bits``
    / 8 bytes, read once per step) does 2 FLOPs per token, so the step's intensity is ``2 B / bytes`` FLOPs per
    byte; it reaches the ridge point at ``B = ridge x bytes / 2``. The KV cache's reads are left out (they grow
    with the batch too, and keep attention memory-bound)."""
    return ridge_point(tflops, tbs) * (bits / 8) / 2


def training_memory_gb(params_b: float, gpus: int = 1, zero_stage: int = 0) -> float:
    """Model states per GPU in GB for mixed-precision Adam (ZeRO, Rajbhandari et al. 2020, Section 3.1): 2 bytes
    of fp16/bf16 weights, 2 of gradients and 12 of fp32 optimizer states (master weights, momentum, variance) per
    parameter, 16 in all; ZeRO stage 1 shards the optimizer states over ``gpus``, stage 2 the gradients too,
    stage 3 the weights too. Activations, buffers and fragmentation not counted."""
    weights, grads, optimizer = 2.0, 2.0, 12.0
    if zero_stage >= 1:
        optimizer /= gpus
    if zero_stage >= 2:
        grads /= gpus
    if zero_stage >= 3:
        weights /= gpus
    return params_b * (weights + grads + optimizer)


def pipeline_bubble_percent(stages: int, microbatches: int) -> float:
    """Share of a GPipe / 1F1B schedule's time that pipeline stages idle: (p - 1) / (m + p - 1), in percent."""
    return 100.0 * (stages - 1) / (microbatches + stages - 1)


def occupancy_percent(registers_per_thread: int, registers_per_sm: int = 65536, max_warps_per_sm: int = 64) -> float:
    """Warps an SM can hold when registers are the limit, as a percent of its maximum (64 warps on Hopper and
    Ampere's A100): ``registers_per_sm / (32 x registers_per_thread)`` warps (allocation granularity ignored)."""
    warps = registers_per_sm // (32 * registers_per_thread)
    return 100.0 * min(warps, max_warps_per_sm) / max_warps_per_sm


def bank_conflict_ways(stride_words: int, banks: int = 32) -> int:
    """How many threads of a warp hit the same shared-memory bank when thread i reads 4-byte word ``i x stride``
    (a column of a row-major tile whose rows are ``stride`` words): gcd(stride, 32). Stride 32 (a 32-float row)
    gives 32 (fully serialised); padding the row to 33 gives 1."""
    return math.gcd(stride_words, banks)


def warp_sectors(stride_elements: int, bytes_per_element: int = 4, threads: int = 32) -> int:
    """32-byte memory sectors one warp's load touches when thread i reads element ``i x stride``: 4 for 32
    consecutive floats (coalesced), 32 once the stride reaches 8 floats (one sector per thread)."""
    return len({(i * stride_elements * bytes_per_element) // 32 for i in range(threads)})


def tile_intensity(block_m: int, block_n: int, bytes_per_element: int = 2) -> float:
    """FLOPs per byte loaded of a GEMM tile of ``block_m x block_n`` outputs: each step of the K loop loads
    ``(block_m + block_n) x block_k`` elements for ``2 x block_m x block_n x block_k`` FLOPs."""
    return 2 * block_m * block_n / ((block_m + block_n) * bytes_per_element)


def decode_benchmark_page_size() -> int:
    """The page size (rows) the decode benchmark's paged cache uses: ``PAGE_SIZE`` in
    :mod:`flashcourse.bench.decode`, read from its source so that torch is not imported."""
    import ast
    from importlib import resources as importlib_resources

    source = importlib_resources.files("flashcourse.bench").joinpath("decode.py").read_text(encoding="utf-8")
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "PAGE_SIZE" for t in node.targets):
            return int(ast.literal_eval(node.value))
    raise EvidenceError("flashcourse/bench/decode.py defines no PAGE_SIZE")


def attention_matrix_bytes(batch: int, heads: int, n: int, bytes_per_element: int = 2, unit: float = 1e9) -> float:
    """Bytes of one N x N matrix (P, kept for the backward without recomputation) per layer, in ``unit``s."""
    return batch * heads * n * n * bytes_per_element / unit


def lse_bytes(batch: int, heads: int, n: int, unit: float = 1e6) -> float:
    """Bytes of the float32 logsumexp FlashAttention keeps for the backward instead, in ``unit``s."""
    return batch * heads * n * 4 / unit


def memory_saved_ratio(batch: int, heads: int, n: int, bytes_per_element: int = 2) -> float:
    """Memory of the N x N matrix over the logsumexp kept instead: N * bytes / 4, linear in N."""
    return attention_matrix_bytes(batch, heads, n, bytes_per_element, 1.0) / lse_bytes(batch, heads, n, 1.0)


def decode_grid_fill(batch: int, kv_heads: int, num_sms: int, num_splits: int = 1) -> float:
    """Programs a decode launch has per SM: B * H_kv * splits / SMs (below 1 leaves SMs idle)."""
    return batch * kv_heads * num_splits / num_sms


COMPUTE: dict[str, Callable[..., float]] = {
    fn.__name__: fn
    for fn in (io_traffic, io_traffic_ratio, flash_traffic_growth, flash_block_size, matmul_flops_per_score,
               exp_time_over_matmul_time, rescale_time_share, flops_growth, tiled_is_exact, exp_overflow_at,
               throughput_ratio, sram_sum_mb, backward_over_forward, attention_matrix_bytes, lse_bytes,
               memory_saved_ratio, decode_grid_fill, io_traffic_mb, standard_traffic_mb, paper_block_size,
               backward_matmuls_over_forward, percent_more, attention_gflop, compute_time_us, transfer_time_us,
               ridge_point, kv_cache_gb, latent_cache_gb, decode_intensity, causal_tile_fraction,
               decode_benchmark_page_size, io_algorithm_ratio, mla_decode_intensity, mla_decode_over_ridge,
               warpgroup_registers, spec_expected_tokens, mla_absorbed_over_naive, cascade_read_ratio, weights_gb,
               weight_read_ms, decode_compute_bound_batch, training_memory_gb, pipeline_bubble_percent,
               occupancy_percent, bank_conflict_ways, warp_sectors, tile_intensity)
}


@functools.lru_cache(maxsize=256)
def _run(fn: Callable[..., float], args: tuple) -> float:
    return float(fn(**dict(args)))


def compute(name: str, args: dict | None = None) -> float:
    """Run the registered compute function ``name`` with keyword ``args`` (results are cached: every function
    here is deterministic)."""
    if name not in COMPUTE:
        raise EvidenceError(f"no compute function {name!r}: expected one of {sorted(COMPUTE)}")
    return _run(COMPUTE[name], tuple(sorted((args or {}).items())))


# ------------------------------------------------------------------------------------------- references
def notebook_heading(notebook: str, heading: str, *, root: Path | None = None) -> str:
    """The heading line of ``notebook`` (a path from the course root) that contains ``heading``.

    Raises EvidenceError when the notebook is missing or no markdown heading, or more than one, contains it.
    """
    path = (root or resources.course_root()) / notebook
    if not path.is_file():
        raise EvidenceError(f"notebook {notebook} does not exist (looked at {path})")
    lines = [line.lstrip("# ").strip() for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]
             if cell["cell_type"] == "markdown"
             for line in "".join(cell["source"]).splitlines() if line.startswith("#") and heading in line]
    if len(lines) != 1:
        raise EvidenceError(f"{notebook} has {len(lines)} headings containing {heading!r}; expected exactly one")
    return lines[0]


def notebook_cell(notebook: str, cell_tag: str, *, root: Path | None = None) -> dict:
    """The code cell of ``notebook`` (a path from the course root) whose ``metadata.tags`` holds ``cell_tag``.

    Raises EvidenceError when the notebook or the tag is missing, or when two cells carry the tag.
    """
    path = (root or resources.course_root()) / notebook
    if not path.is_file():
        raise EvidenceError(f"notebook {notebook} does not exist (looked at {path})")
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    tagged = [c for c in cells if c["cell_type"] == "code" and cell_tag in c.get("metadata", {}).get("tags", [])]
    if len(tagged) != 1:
        raise EvidenceError(f"{notebook} has {len(tagged)} code cells tagged {cell_tag!r}; expected exactly one")
    return tagged[0]


_SEGMENT = re.compile(r"^(?P<name>[^\[\]]*)(?:\[(?P<select>[^\]]+)\])?$")


def _select(items: list, select: str, where: str):
    if re.fullmatch(r"-?\d+", select):
        index = int(select)
        if not -len(items) <= index < len(items):
            raise EvidenceError(f"{where}: index {index} out of range for a list of {len(items)}")
        return items[index]
    conditions = dict(part.split("=", 1) for part in select.split(","))
    found = [item for item in items if isinstance(item, dict)
             and all(str(item.get(k.strip())) == v.strip() for k, v in conditions.items())]
    if len(found) != 1:
        raise EvidenceError(f"{where}: [{select}] matches {len(found)} elements; expected exactly one")
    return found[0]


def resolve_key(data, key: str):
    """The value at dotted ``key`` in nested dicts and lists: ``rows[n_kv=131072,impl=ours].tb_per_s``,
    ``meta.device``, ``rows[0].ms``."""
    value = data
    for segment in key.split("."):
        match = _SEGMENT.match(segment)
        if match is None:
            raise EvidenceError(f"key {key!r}: cannot parse the segment {segment!r}")
        name, select = match["name"], match["select"]
        if name:
            if not isinstance(value, dict) or name not in value:
                have = sorted(value) if isinstance(value, dict) else type(value).__name__
                raise EvidenceError(f"key {key!r}: no field {name!r} (have {have})")
            value = value[name]
        if select is not None:
            if not isinstance(value, list):
                raise EvidenceError(f"key {key!r}: {name or 'value'} is not a list, cannot select [{select}]")
            value = _select(value, select, f"key {key!r}")
    return value


def results_value(results: str, key: str, *, root: Path | None = None):
    """The value at ``key`` in the committed result file ``results`` (a path from the course root)."""
    path = (root or resources.course_root()) / results
    if not path.is_file():
        raise EvidenceError(f"results file {results} does not exist (looked at {path})")
    return resolve_key(json.loads(path.read_text(encoding="utf-8")), key)


# ------------------------------------------------------------------------------------------- quotes
def quote_matches(quote: str, value: float) -> bool:
    """True when ``value`` rounds to ``quote`` at the quote's precision: "2.30" accepts [2.295, 2.305),
    "20" accepts [19.5, 20.5). A quote is a plain decimal number as the answer writes it."""
    if not re.fullmatch(r"\d+(\.\d+)?", quote):
        raise ValueError(f"quote {quote!r} is not a plain decimal number such as '740' or '2.30'")
    decimals = len(quote.split(".")[1]) if "." in quote else 0
    half_unit = 0.5 * 10.0 ** (-decimals)
    value = float(value)
    return math.isfinite(value) and float(quote) - half_unit <= value < float(quote) + half_unit + 1e-12
