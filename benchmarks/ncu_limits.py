"""What limits each kernel, in Nsight Compute's counters: the backward at D = 128 (b1, the Gluon b6a and b6c, cuDNN's),
decoding from an FP8 KV cache against an fp16 one, a prefix-LM ``mask_mod`` forward and backward against
compiled FlexAttention, the rows of ``bench variants`` that missed their target on 2026-12-02 beside what they
were compared with (:data:`VARIANT_GAPS`), and the other gaps of the 2026-12-02 H200 runs (:data:`GAP_CASES`,
groups :data:`GAP_GROUPS`): the default forward at N = 4096, the FP8 forward at D = 128 and the backward at
D = 256, each beside its reference; then the two gaps of the 2026-12-06 H100 runs (:data:`H100_CASES`: the short
causal forward at D = 64, and FlashAttention-4's conditional rescaling against the stage it builds on); last the
Gluon backward b7 and its variants at D = 128 (:data:`B7_CASES`, beside ``bwd-cudnn`` at the same shape). A GPU
call (under 9 minutes) runs the cases in order until ``--budget`` is spent; the first ten cases took 3 minutes, the
nine of a variant-gap run 3 more, so every case no longer fits in one call and a call names its cases with
``--only`` (scripts/gpu_run.sh's stage ``gaps`` runs :data:`GAP_CASES`):

    PYTHONPATH=src python benchmarks/ncu_limits.py --run-ncu --out /tmp/ncu       # the cases in order, until the budget
    PYTHONPATH=src python benchmarks/ncu_limits.py --run-ncu --only fp8-fwd-v8c --only fp8-fwd-cudnn-fp16 --out /tmp/ncu
    PYTHONPATH=src python benchmarks/ncu_limits.py --list                          # the cases
    PYTHONPATH=src python benchmarks/ncu_limits.py --dry                           # each case once, no ncu: kernels
    PYTHONPATH=src python benchmarks/ncu_limits.py --case bwd-b1                   # one case, as ncu runs it

:data:`B7_CASES` need Triton >= 3.9 first on the path (``scripts/wheel_parts.py`` brings it to /tmp/t39; every case
process inherits the path); with cuDNN's backward beside them, about 2 minutes:

    PYTHONPATH=/tmp/t39:src python3 benchmarks/ncu_limits.py --run-ncu --budget 200 --out $OUT --only bwd-b7-d128
        --only bwd-b7b-d128 --only bwd-b7c-d128 --only bwd-cudnn                   # (one command line)

``--by-instruction`` asks where those cases' warps wait, by SASS instruction (b7c's, 2026-12-06: most of its
``barrier`` samples were two spare warps waiting once, and its shared-memory wavefronts 1.4x cuDNN's); b7d (64-row
tiles at D = 128) beside b7c and cuDNN, about 3 minutes:

    PYTHONPATH=/tmp/t39:src python3 benchmarks/ncu_limits.py --run-ncu --by-instruction --budget 240 --out $OUT
        --only bwd-b7c-d128 --only bwd-b7d-d128 --only bwd-cudnn                   # (one command line)

b7e and b7f (b7d without its dQ store's bank conflicts, two ways) beside b7d, about 3 minutes:

    PYTHONPATH=/tmp/t39:src python3 benchmarks/ncu_limits.py --run-ncu --by-instruction --budget 240 --out $OUT
        --only bwd-b7d-d128 --only bwd-b7e-d128 --only bwd-b7f-d128                # (one command line)

b8 and b8c at D = 256 (:data:`B8_CASES`; b8c: b8's dQ chunk store without its bank conflicts), by instruction:

    PYTHONPATH=/tmp/t39:src python3 benchmarks/ncu_limits.py --run-ncu --by-instruction --budget 240 --out $OUT
        --only bwd-b8-d256 --only bwd-b8c-d256                                     # (one command line)

A case builds its inputs, calls what it measures twice (compilation and autotuning stay out of the profile), then
calls it once more between ``cudaProfilerStart`` and ``cudaProfilerStop`` (``torch.cuda.profiler``), inside an NVTX
range named after the case. ``--run-ncu`` runs ``ncu --profile-from-start off`` over each case in a process of
its own, so ncu replays only that last call, every kernel of it once (``--clock-control none``: the clocks the
benchmarks run at; ncu flushes the caches before each replay pass, so the decode cache is read from HBM). A case
that fails or outlives its time limit is recorded and the next one runs; the whole run stops starting cases when
``--budget`` seconds are spent, and the JSON is rewritten after every case.

Collected: the sections SpeedOfLight, Occupancy, LaunchStats, WarpStateStats, MemoryWorkloadAnalysis,
ComputeWorkloadAnalysis and SchedulerStats, plus the metrics of :data:`EXTRA_METRICS` and
:data:`EXTRA_METRIC_FAMILIES` that this GPU's ncu lists (``ncu --query-metrics``; a metric it does not know would
stop the run): DRAM bytes, local-memory traffic (spills), global atomics, shared-memory wavefronts, each tensor
pipe's utilisation, every stall reason. Each report is exported twice, ``--page details`` (the sections as
printed) and ``--page raw`` (every metric by name), both kept as CSV under ``<out>/ncu-limits/``; the counters
that answer "what limits this kernel" (:data:`COUNTERS`) go to ``<out>/<date>-<device>-ncu-limits.json``, one row
per (case, kernel launch), with ``meta.cases``: each case's shape, status, seconds and kernel count.

With ``--by-instruction`` the ``bwd-b7*``, ``bwd-b8*`` and ``bwd-cudnn`` cases (:func:`wants_source_counters`) also
collect the section SourceCounters in the same ncu run (a few more replay passes: the warps' program counters
sampled with the reason each is not issuing, and per-instruction counts). Their report is kept (``<case>.ncu-rep``,
for the GUI's source view) and exported a third time, ``--page source --print-source sass`` (``<case>-source.csv``);
the row of the case's main kernel (its longest launch) gets ``stall_sites``: the :data:`TOP_STALL_SITES`
instructions with the most samples, each with its SASS text, share of the kernel's samples and dominant stall
reasons; ``stall_families``: every sample grouped by :data:`OPCODE_FAMILIES` (BAR, SYNCS, WARPGROUP/HGMMA, LDS/STS,
other); and ``shared_excess`` with ``conflict_sites``: the shared-memory wavefronts its instructions took beyond the
ideal, and the instructions that took them (so the JSON names the conflicting instructions even when the source CSV
does not come back from the GPU machine).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import triton
import triton.language as tl  # noqa: F401 - Triton's interpreter looks for it among prefix_lm's globals

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = Path(__file__).resolve()
sys.path.insert(0, str(ROOT / "src"))

NCU = "/usr/local/cuda/bin/ncu"
WARMUP_CALLS = 2  # the first compiles (and tunes); the second runs what a training step runs
BUDGET_S = 480.0  # the whole --run-ncu, JSON included: under 8.5 minutes with the start and the exports
CASE_TIMEOUT_S = 150.0  # one case under ncu: start, compile, two warm-up calls, the profiled call's replays
MIN_CASE_S = 30.0  # a case is not started with less time than this left
RESERVE_S = 10.0  # kept at the end of the budget for the last exports and the JSON
EXPORT_TIMEOUT_S = 45.0

SECTIONS = ("SpeedOfLight", "Occupancy", "LaunchStats", "WarpStateStats", "MemoryWorkloadAnalysis",
            "ComputeWorkloadAnalysis", "SchedulerStats")
# Metrics beyond the sections, each asked for only where ``ncu --query-metrics`` lists its base name.
EXTRA_METRICS = (
    "dram__bytes_read.sum", "dram__bytes_write.sum",
    "l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum", "l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum",
    "l1tex__t_sectors_pipe_lsu_mem_local_op_ld.sum", "l1tex__t_sectors_pipe_lsu_mem_local_op_st.sum",
    "smsp__sass_inst_executed_op_local_ld.sum", "smsp__sass_inst_executed_op_local_st.sum",
    "smsp__sass_inst_executed_op_global_red.sum", "smsp__sass_inst_executed_op_global_atom.sum",
    "smsp__inst_executed.sum",
    "l1tex__data_pipe_lsu_wavefronts_mem_shared.sum", "l1tex__data_pipe_lsu_wavefronts_mem_shared.sum"
    ".pct_of_peak_sustained_elapsed", "l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum",
)
# Families whose members differ between GPUs (Hopper's wgmma pipe, new stall reasons): (base-name pattern, suffix).
EXTRA_METRIC_FAMILIES = (
    (r"sm__pipe_tensor\w*_cycles_active", ".avg.pct_of_peak_sustained_active"),
    (r"smsp__average_warps_issue_stalled_\w+_per_issue_active", ".ratio"),
)
TENSOR_PIPE = re.compile(r"^(sm__pipe_tensor\w*_cycles_active)\.avg\.pct_of_peak_sustained_active$")
METRIC_ERROR = re.compile(r"==ERROR==.*metric", re.IGNORECASE)  # how ncu refuses a metric it cannot collect
STALL = re.compile(r"^smsp__average_warps_issue_stalled_(\w+)_per_issue_active\.ratio$")
TOP_STALLS = 5

# --by-instruction: Nsight Compute's Source Counters section samples each warp's program counter and why it is not
# issuing (Kernel Profiling Guide, "Sampling" and the section table; the CLI user manual, "Source Page"), so the
# stalls the sections count per kernel can be charged to SASS instructions. Only for the backward cases whose
# barrier stalls the b7 design step must place (:func:`wants_source_counters`).
SOURCE_SECTION = "SourceCounters"
TOP_STALL_SITES = 12
TOP_SITE_REASONS = 3
# Columns of ``ncu --import R --csv --page source --print-source sass`` (one table per kernel after a
# "Kernel Name" line): the spellings of 2023-2025 first, then the older "Sampling Data" ones.
SAMPLES_COLUMNS = ("Warp Stall Sampling (All Samples)", "Sampling Data (All)")
NOT_ISSUED_COLUMNS = ("Warp Stall Sampling (Not-issued Samples)", "Sampling Data (Not Issued)")
EXECUTED_COLUMN = "Instructions Executed"
# Per instruction, the shared-memory wavefronts it took and the fewest its bytes need (an HGMMA's operand reads
# count too); the difference is the replays its bank conflicts cost (the UI manual's "L1 Wavefronts Shared
# Excessive"). The kernel-wide counter ``l1tex__data_bank_conflicts_pipe_lsu_mem_shared`` can exceed their sum:
# b7d's 154 million against 134 million on its instructions (H100, 2026-12-07).
SHARED_WAVEFRONTS_COLUMN = "L1 Wavefronts Shared"
SHARED_IDEAL_COLUMN = "L1 Wavefronts Shared Ideal"
TOP_CONFLICT_SITES = 12
# One column of samples per stall reason (stall_barrier, stall_long_sb, ...); a not-issued twin of a reason, should
# an ncu print one, is left out so that a site's reasons stay shares of its samples.
REASON_COLUMN = re.compile(r"^stall_((?![a-z_]*not_issued$)[a-z_]+)$")
# The waits b7 can have, by SASS opcode (its first word, before the first dot): CTA barriers (bar.sync, which Triton
# also inserts around shared-memory stores and layout conversions), mbarrier try-wait (the ring, ds_ready,
# dq_empty), the wgmma fences and waits, shared-memory loads and stores; everything else is "other".
OPCODE_FAMILIES = (("BAR", ("BAR",)), ("SYNCS", ("SYNCS",)), ("WARPGROUP/HGMMA", ("WARPGROUP", "HGMMA")),
                   ("LDS/STS", ("LDS", "LDSM", "STS", "STSM")))
OTHER_FAMILY = "other"

SOL, LAUNCH, OCC = "GPU Speed Of Light Throughput", "Launch Statistics", "Occupancy"
WSS, MWA, CWA, SCHED = ("Warp State Statistics", "Memory Workload Analysis", "Compute Workload Analysis",
                        "Scheduler Statistics")
# Each JSON counter and where it is read, first found wins: ("raw", metric name) from the raw page, or
# (section, metric) as the details page prints them.
COUNTERS: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = (
    ("duration_us", (("raw", "gpu__time_duration.sum"), (SOL, "Duration"))),
    ("sm_throughput_pct", (("raw", "sm__throughput.avg.pct_of_peak_sustained_elapsed"),
                           (SOL, "Compute (SM) Throughput"))),
    ("memory_throughput_pct", (("raw", "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed"),
                               (SOL, "Memory Throughput"))),
    ("dram_throughput_pct", (("raw", "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed"),
                             ("raw", "dram__throughput.avg.pct_of_peak_sustained_elapsed"), (SOL, "DRAM Throughput"))),
    ("dram_read_bytes", (("raw", "dram__bytes_read.sum"),)),
    ("dram_write_bytes", (("raw", "dram__bytes_write.sum"),)),
    ("dram_bytes", (("raw", "dram__bytes.sum"),)),
    ("l2_throughput_pct", (("raw", "lts__throughput.avg.pct_of_peak_sustained_elapsed"),
                           (SOL, "L2 Cache Throughput"))),
    ("l2_hit_rate_pct", (("raw", "lts__t_sector_hit_rate.pct"), (MWA, "L2 Hit Rate"))),
    ("l1_shared_throughput_pct", (("raw", "l1tex__throughput.avg.pct_of_peak_sustained_active"),
                                  (SOL, "L1/TEX Cache Throughput"))),
    ("shared_lsu_wavefronts_pct", (("raw", "l1tex__data_pipe_lsu_wavefronts_mem_shared.sum"
                                           ".pct_of_peak_sustained_elapsed"),)),
    ("shared_lsu_wavefronts", (("raw", "l1tex__data_pipe_lsu_wavefronts_mem_shared.sum"),)),
    ("shared_bank_conflicts", (("raw", "l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum"),)),
    ("mem_busy_pct", ((MWA, "Mem Busy"),)),
    ("mem_pipes_busy_pct", ((MWA, "Mem Pipes Busy"),)),
    ("achieved_occupancy_pct", (("raw", "sm__warps_active.avg.pct_of_peak_sustained_active"),
                                (OCC, "Achieved Occupancy"))),
    ("theoretical_occupancy_pct", ((OCC, "Theoretical Occupancy"), ("raw", "sm__maximum_warps_per_active_cycle_pct"))),
    ("block_limit_registers", ((OCC, "Block Limit Registers"),)),
    ("block_limit_shared_mem", ((OCC, "Block Limit Shared Mem"),)),
    ("registers_per_thread", (("raw", "launch__registers_per_thread"), (LAUNCH, "Registers Per Thread"))),
    ("dynamic_shared_bytes", (("raw", "launch__shared_mem_per_block_dynamic"),
                              (LAUNCH, "Dynamic Shared Memory Per Block"))),
    ("static_shared_bytes", (("raw", "launch__shared_mem_per_block_static"),
                             (LAUNCH, "Static Shared Memory Per Block"))),
    ("waves_per_sm", (("raw", "launch__waves_per_multiprocessor"), (LAUNCH, "Waves Per SM"))),
    ("local_load_bytes", (("raw", "l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum"),)),
    ("local_store_bytes", (("raw", "l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum"),)),
    ("local_load_inst", (("raw", "smsp__sass_inst_executed_op_local_ld.sum"),)),
    ("local_store_inst", (("raw", "smsp__sass_inst_executed_op_local_st.sum"),)),
    ("global_red_inst", (("raw", "smsp__sass_inst_executed_op_global_red.sum"),)),
    ("global_atom_inst", (("raw", "smsp__sass_inst_executed_op_global_atom.sum"),)),
    ("inst_executed", (("raw", "smsp__inst_executed.sum"),)),
    ("issue_slots_busy_pct", (("raw", "sm__inst_issued.avg.pct_of_peak_sustained_active"), (CWA, "Issue Slots Busy"))),
    ("sm_busy_pct", ((CWA, "SM Busy"),)),
    ("executed_ipc_active", ((CWA, "Executed Ipc Active"),)),
    ("issue_active_pct", (("raw", "smsp__issue_active.avg.pct_of_peak_sustained_active"),
                          (SCHED, "One or More Eligible"))),
    ("no_eligible_pct", ((SCHED, "No Eligible"),)),
    ("active_warps_per_scheduler", ((SCHED, "Active Warps Per Scheduler"),)),
    ("eligible_warps_per_scheduler", ((SCHED, "Eligible Warps Per Scheduler"),)),
    ("warp_cycles_per_issued", (("raw", "smsp__average_warp_latency_per_inst_issued.ratio"),
                                (WSS, "Warp Cycles Per Issued Instruction"))),
)
# Units ncu prints, to the JSON's: time in microseconds, sizes in bytes, frequencies in hertz.
UNIT_SCALE = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3, "second": 1e6,
              "s": 1e6, "byte": 1.0, "kbyte": 1e3, "mbyte": 1e6, "gbyte": 1e9, "tbyte": 1e12, "hz": 1.0,
              "khz": 1e3, "mhz": 1e6, "ghz": 1e9}


# --- the cases -----------------------------------------------------------------------------------------------

BWD = {"batch": 4, "heads": 16, "n": 8192, "head_dim": 128, "dtype": "float16", "causal": False}
DECODE = {"batch": 1, "heads": 32, "heads_kv": 8, "head_dim": 128, "n": 32768, "layout": "contiguous"}
MASK = {"batch": 4, "heads": 16, "n": 8192, "head_dim": 128, "dtype": "float16", "rule": "prefix-LM",
        "prefix_keys": 1024}
PREFIX_KEYS = MASK["prefix_keys"]


@triton.jit
def prefix_lm(b, h, q_idx, kv_idx):
    """The first 1024 keys (a prompt) are seen by every query, the rest causally (PREFIX_KEYS)."""
    return (kv_idx <= q_idx) | (kv_idx < 1024)


def flex_prefix_lm(b, h, q_idx, kv_idx):
    """The same rule as FlexAttention's ``mask_mod``."""
    return (kv_idx <= q_idx) | (kv_idx < PREFIX_KEYS)


@dataclass(frozen=True)
class Case:
    """One measured call: ``build()`` makes its inputs and returns the call that ncu profiles."""

    name: str
    group: str
    provider: str
    what: str
    shape: dict
    build: Callable[[], Callable[[], object]] = field(repr=False, compare=False)


def _inputs(shape: dict, count: int, seed: int = 0):
    import torch

    generator = torch.Generator(device="cuda").manual_seed(seed)
    size = (shape["batch"], shape["heads"], shape["n"], shape["head_dim"])
    return [torch.randn(size, device="cuda", dtype=getattr(torch, shape["dtype"]), generator=generator)
            for _ in range(count)]


def _backward_b1():
    from flashcourse import kernels

    q, k, v, do = _inputs(BWD, 4)
    o, lse = kernels.flash_attention_forward(q, k, v, causal=False, version="v7")
    return lambda: kernels.flash_attention_backward(q, k, v, o, lse, do, causal=False, version="b1")


def _gluon_backward(module: str, entry: str, stage: str, shape: dict = BWD):
    """A Gluon backward stage, ``hopper.<module>.<entry>``, from v7's (o, lse) at ``shape`` (BWD's by default); the
    module is imported on the GPU machine only (b6 needs Gluon's Hopper API, b7 and b8 Triton >= 3.9)."""
    def build():
        import importlib

        from flashcourse import kernels

        backward = getattr(importlib.import_module(f"flashcourse.kernels.hopper.{module}"), entry)
        q, k, v, do = _inputs(shape, 4)
        o, lse = kernels.flash_attention_forward(q, k, v, causal=shape["causal"], version="v7")
        return lambda: backward(q, k, v, o, lse, do, causal=shape["causal"], stage=stage)
    return build


def _backward_b6(stage: str):
    return _gluon_backward("fa3_backward", "fa3_backward", stage)


def _autograd_backward(forward, q, k, v, do):
    """The backward alone: ``autograd.grad`` of one kept output (retain_graph, so every call redoes it)."""
    import torch

    q, k, v = (t.detach().requires_grad_(True) for t in (q, k, v))
    o = forward(q, k, v)
    return lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True)


def _backward_cudnn():
    from flashcourse.bench.providers import sdpa

    q, k, v, do = _inputs(BWD, 4)
    attend = sdpa("sdpa_cudnn")  # F.scaled_dot_product_attention inside sdpa_kernel(SDPBackend.CUDNN_ATTENTION)
    return _autograd_backward(lambda q, k, v: attend(q, k, v, False), q, k, v, do)


def _decode(kv_dtype: str):
    def build():
        import torch

        from flashcourse import kernels
        from flashcourse.bench.decode import make_cache

        torch.manual_seed(0)
        q, k, v = make_cache(DECODE["batch"], DECODE["heads"], DECODE["heads_kv"], DECODE["head_dim"], DECODE["n"])
        if kv_dtype == "float16":
            return lambda: kernels.flash_decode(q, k, v)
        k8, v8, k_scale, v_scale = kernels.quantize_kv_cache(k, v)
        return lambda: kernels.flash_decode(q, k8, v8, k_scale=k_scale, v_scale=v_scale)
    return build


def _ours_prefix_lm(q, k, v):
    from flashcourse import kernels

    return kernels.flash_attention(q, k, v, mask_mod=prefix_lm)  # the per-call path: tile lists built each call


def _flex_prefix_lm():
    """Compiled flex_attention with its block mask built once, as ``bench variants`` times it."""
    import torch
    import torch._functorch.config
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    torch._functorch.config.donated_buffer = False  # the backward replays one kept graph (retain_graph=True)
    block_mask = create_block_mask(flex_prefix_lm, None, None, MASK["n"], MASK["n"], device="cuda")
    compiled = torch.compile(flex_attention, dynamic=False)
    return lambda q, k, v: compiled(q, k, v, block_mask=block_mask)


def _mask_case(provider: str, mode: str):
    def build():
        import torch

        attend = _ours_prefix_lm if provider == "flashcourse" else _flex_prefix_lm()
        q, k, v, do = _inputs(MASK, 4)
        if mode == "bwd":
            return _autograd_backward(attend, q, k, v, do)

        def forward():
            with torch.no_grad():
                return attend(q, k, v)
        return forward
    return build


def _variant_case(name: str, provider: str, mode: str):
    """A row of ``bench variants`` (its shape, rule and provider, fp16) as one profiled call: the forward under
    no_grad, or the backward alone (``autograd.grad``)."""
    def build():
        import torch

        from flashcourse.bench import variants

        variant = next(v for v in variants.VARIANTS if v.name == name)  # _variant_shape checked the name
        inputs = variants.make_inputs(variant, "float16")
        attend = variants.provider_fn(provider, variant, inputs)
        if mode == "bwd":
            return _autograd_backward(attend, inputs.q, inputs.k, inputs.v, inputs.do)

        def forward():
            with torch.no_grad():
                return attend(inputs.q, inputs.k, inputs.v)
        return forward
    return build


# The variants that missed 1.0x FlexAttention (or 0.9x cuDNN at D = 256) in the 2026-12-02 variants run, each
# beside what it was compared with: (variant of bench variants, pass, our provider, theirs).
VARIANT_GAPS = (
    ("mask_mod: chunked local", "fwd", "flashcourse", "flex"),
    ("window 1024", "bwd", "flashcourse", "flex"),
    ("8 documents, causal", "bwd", "flashcourse", "flex"),
    ("head_dim: 256", "fwd", "flashcourse", "sdpa_cudnn"),
    ("GQA 32/8, causal", "bwd", "flashcourse", "flex"),  # 0.96-0.97x, added after the first profile of these
)


def _variant_shape(name: str, mode: str) -> dict:
    from flashcourse.bench.variants import VARIANTS

    variant = next(v for v in VARIANTS if v.name == name)
    return {"variant": name, "batch": variant.batch, "heads": variant.heads, "heads_kv": variant.heads_kv,
            "n": variant.n, "head_dim": variant.head_dim, "dtype": "float16", "causal": variant.causal, "mode": mode}


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


# The gaps that the 2026-12-02 H200 runs left, none profiled before, each case beside its reference:
# 1. The default forward (on Hopper a Gluon stage, plan.FORWARD_BANDS) trailed cuDNN only at N = 4096: D = 128
#    non-causal and causal, D = 64 causal (``ratio_vs_sdpa_cudnn`` of the fwd rows in
#    2026-12-02-nvidia-h200-attention-fp16-1a7bc36.json and -bf16-1a7bc36.json). The grid's shapes: B = 4,
#    N = 4096, H = 16 at D = 128 and H = 32 at D = 64 (bench attention's HEAD_CONFIGS), float16.
FWD_GAP = {"batch": 4, "n": 4096, "dtype": "float16", "mode": "fwd"}
FWD_GAP_HEADS = {64: 32, 128: 16}
FORWARD_GAPS = ((128, False), (128, True), (64, True))  # (head dim, causal)
# 2. The FP8 forward's stage v8c_fp8 with V as given against our Triton FP8 kernel with V kept keys-adjacent and
#    cuDNN's fp16 forward (``tflops`` and ``ratio_vs_cudnn_fp16`` of the D = 128 time rows in
#    2026-12-02-nvidia-h200-fa3-fp8.json): bench fp8's inputs (B = 4, H = 16, outlier channels in q and k),
#    N = 8192, non-causal, a bfloat16 output, called as benchmarks/gpu_fa3_fp8.py calls them.
FP8_GAP = {"batch": 4, "heads": 16, "n": 8192, "head_dim": 128, "causal": False, "out_dtype": "bfloat16",
           "mode": "fwd"}
FP8_STAGE = "v8c_fp8"
# 3. The backward at D = 256 (b1, through autograd) against cuDNN's (``ratio_vs_sdpa_cudnn`` of the bwd rows of
#    'head_dim: 256' and 'head_dim: 256, causal' in 2026-12-02-nvidia-h200-variants-07d21a8.json): bench variants'
#    causal row, its shape (B = 4, H = 16, N = 8192), inputs and providers.
BWD_GAP_VARIANT = "head_dim: 256, causal"
GAP_GROUPS = ("forward gap", "fp8 gap", "backward gap")


def _forward_gap_shape(head_dim: int, causal: bool) -> dict:
    return {**FWD_GAP, "heads": FWD_GAP_HEADS[head_dim], "head_dim": head_dim, "causal": causal}


def _forward_case(shape: dict, provider: str):
    """The forward under no_grad as ``bench attention`` times it (ours prints its route into the case's log)."""
    def build():
        import torch

        from flashcourse.bench.attention import provider_fn

        q, k, v = _inputs(shape, 3)
        attend = provider_fn(provider)
        if provider == "flashcourse":
            from flashcourse import kernels

            print(f"route: {kernels.explain(q, k, v, causal=shape['causal'])}", flush=True)

        def forward():
            with torch.no_grad():
                return attend(q, k, v, shape["causal"])
        return forward
    return build


def _forward_gap_case(head_dim: int, causal: bool, provider: str):
    """The forward under no_grad as ``bench attention`` times it, at the gap's shape (:func:`_forward_case`)."""
    return _forward_case(_forward_gap_shape(head_dim, causal), provider)


def _fp8_gap_case(provider: str):
    """One FP8 forward (inputs quantised outside the profiled call) or cuDNN's fp16 forward of the same inputs."""
    def build():
        import torch

        from flashcourse.bench import fp8 as bench_fp8
        from flashcourse.bench.providers import sdpa
        from flashcourse.kernels import fp8

        q, k, v = bench_fp8.make_inputs(FP8_GAP["n"], FP8_GAP["head_dim"], seed=0)
        causal, out_dtype = FP8_GAP["causal"], getattr(torch, FP8_GAP["out_dtype"])
        if provider == "sdpa_cudnn_fp16":
            attend = sdpa("sdpa_cudnn")
            return lambda: attend(q, k, v, causal)
        x = fp8.quantize_fp8(q, k, v)
        if provider == "triton_fp8_keys_adjacent":
            v8 = fp8.v_keys_contiguous(x.v)  # copied once, here: the profiled call reads V keys-adjacent
            return lambda: fp8.flash_attention_forward_fp8(x.q, x.k, v8, **x.descales(), causal=causal,
                                                           out_dtype=out_dtype)
        from flashcourse.kernels.hopper import fa3_fp8  # Gluon: imported on the GPU machine only

        return lambda: fa3_fp8.fa3_fp8_forward(x.q, x.k, x.v, x.q_descale, x.k_descale, x.v_descale, causal=causal,
                                               out_dtype=out_dtype, stage=FP8_STAGE)
    return build


def _ours_or(provider: str, theirs: str) -> str:
    return "ours" if provider == "flashcourse" else theirs


GAP_CASES = tuple(
    Case(f"fwd-d{d}-n{FWD_GAP['n']}{'-causal' if causal else ''}-{_ours_or(provider, 'cudnn')}", "forward gap",
         provider, ("the default forward, flash_attention under no_grad (a Gluon stage on Hopper)"
                    if provider == "flashcourse" else "cuDNN's forward through SDPA, no_grad"),
         _forward_gap_shape(d, causal), _forward_gap_case(d, causal, provider))
    for d, causal in FORWARD_GAPS for provider in ("flashcourse", "sdpa_cudnn")) + (
    Case("fp8-fwd-v8c", "fp8 gap", FP8_STAGE, f"Gluon FP8 forward {FP8_STAGE}, V as given (transposed in the kernel)",
         {**FP8_GAP, "dtype": "float8_e4m3fn", "v_layout": "as_given"}, _fp8_gap_case(FP8_STAGE)),
    Case("fp8-fwd-triton-keys-adjacent", "fp8 gap", "triton_fp8_keys_adjacent",
         "Triton FP8 forward, V stored keys-adjacent (copied before the profiled call)",
         {**FP8_GAP, "dtype": "float8_e4m3fn", "v_layout": "keys_adjacent"}, _fp8_gap_case("triton_fp8_keys_adjacent")),
    Case("fp8-fwd-cudnn-fp16", "fp8 gap", "sdpa_cudnn_fp16", "cuDNN's fp16 forward through SDPA, the same inputs",
         {**FP8_GAP, "dtype": "float16"}, _fp8_gap_case("sdpa_cudnn_fp16")),
) + tuple(
    Case(f"bwd-d256-causal-{_ours_or(provider, 'cudnn')}", "backward gap", provider,
         f"bench variants' {BWD_GAP_VARIANT!r} bwd, {provider} (autograd.grad"
         + ("; b1 by the route)" if provider == "flashcourse" else ")"),
         _variant_shape(BWD_GAP_VARIANT, "bwd"), _variant_case(BWD_GAP_VARIANT, provider, "bwd"))
    for provider in ("flashcourse", "sdpa_cudnn"))


# The two gaps of the 2026-12-06 H100 runs, each beside what it is compared with:
# 1. The short causal forward at D = 64: on the H100 our default (v7 by H100_FORWARD_BANDS at N_q <= 1024) ran at
#    0.73x cuDNN at N = 1024 (2026-12-06-nvidia-h100-80gb-hbm3-attention-fp16-d64.json), where the H200 measured
#    1.01x; bench attention's shape at D = 64 (B = 4, H = 32), float16. The Gluon stage v8a is profiled beside them.
# 2. FlashAttention-4's conditional rescaling (stage v9a) lost 5-7% to the stage it builds on, v8f, at D = 64 on the
#    H100 at every length (ratio_vs_v8f of 2026-12-06-nvidia-h100-80gb-hbm3-fa4-stages.json), where lesson 14's model
#    predicted a gain: both at gpu_fa4_stages.py's N = 4096 shape (B = 4, H = 32), float16, not causal.
SHORT_CAUSAL = {"batch": 4, "heads": 32, "n": 1024, "head_dim": 64, "dtype": "float16", "causal": True, "mode": "fwd"}
FA4_GAP = {"batch": 4, "heads": 32, "n": 4096, "head_dim": 64, "dtype": "float16", "causal": False, "mode": "fwd"}
H100_GROUPS = ("short causal gap", "fa4 gap")


def _stage_case(shape: dict, stage: str):
    """One Gluon stage (v8 or v9) through the ForwardPlan the dispatch makes once a shape."""
    def build():
        from flashcourse.kernels.hopper import fa3  # Gluon: imported on the GPU machine only

        q, k, v = _inputs(shape, 3)
        plan = fa3.ForwardPlan(stage, q, k, causal=shape["causal"], scale=None)
        return lambda: plan(q, k, v)
    return build


H100_CASES = (
    Case("fwd-d64-n1024-causal-ours", "short causal gap", "flashcourse",
         "the default forward at N = 1024, causal, D = 64 (v7 by the H100's bands)", SHORT_CAUSAL,
         _forward_case(SHORT_CAUSAL, "flashcourse")),
    Case("fwd-d64-n1024-causal-cudnn", "short causal gap", "sdpa_cudnn", "cuDNN's forward through SDPA, no_grad",
         SHORT_CAUSAL, _forward_case(SHORT_CAUSAL, "sdpa_cudnn")),
    Case("fwd-d64-n1024-causal-v8a", "short causal gap", "fa3-v8a", "Gluon stage v8a at the same shape",
         SHORT_CAUSAL, _stage_case(SHORT_CAUSAL, "v8a")),
    Case("fa4-d64-n4096-v8f", "fa4 gap", "fa3-v8f", "Gluon stage v8f, the stage v9a builds on", FA4_GAP,
         _stage_case(FA4_GAP, "v8f")),
    Case("fa4-d64-n4096-v9a", "fa4 gap", "fa3-v9a", "Gluon stage v9a: v8f with conditional rescaling", FA4_GAP,
         _stage_case(FA4_GAP, "v9a")),
    # 3. FlashAttention-4's exp2 on the FMA units: v9b_1of16 about even with v8f, v9b_1of4 3-21% slower (same file).
    Case("fa4-d64-n4096-v9b_1of16", "fa4 gap", "fa3-v9b_1of16",
         "Gluon stage v9b_1of16: v8f with 2^x of 8 columns a tile by a polynomial on the FMA units", FA4_GAP,
         _stage_case(FA4_GAP, "v9b_1of16")),
    Case("fa4-d64-n4096-v9b_1of4", "fa4 gap", "fa3-v9b_1of4", "Gluon stage v9b_1of4: the same for 32 columns a tile",
         FA4_GAP, _stage_case(FA4_GAP, "v9b_1of4")),
)


# The Gluon backward b7 (hopper/fa3_backward_tma.py) and its variants at BWD's shape (D = 128, where b7 ran at
# 0.72-0.84x cuDNN on the H100 of 2026-12-06: ratio_vs_sdpa_cudnn of the D = 128 rows of
# 2026-12-06-nvidia-h100-80gb-hbm3-b7-quick.json); cuDNN's backward at the same shape is the case ``bwd-cudnn``.
# Triton >= 3.9 must come first on the path (its Gluon has the TMA reduce-add); under an older one the case fails
# with b7's message saying so.
B7_GROUP = "b7 at D = 128"


def _backward_b7(stage: str):
    return _gluon_backward("fa3_backward_tma", "b7_backward", stage)


B7_CASES = (
    Case("bwd-b7-d128", B7_GROUP, "b7", "Gluon b7: FA3's design, lse and Delta loaded by the math warps", BWD,
         _backward_b7("b7")),
    Case("bwd-b7b-d128", B7_GROUP, "b7b", "Gluon b7b: lse and Delta brought by the loader's TMA with Q and dO", BWD,
         _backward_b7("b7b")),
    Case("bwd-b7c-d128", B7_GROUP, "b7c", "Gluon b7c: b7b with a three-slot (Q, dO) ring", BWD,
         _backward_b7("b7c")),
    Case("bwd-b7d-d128", B7_GROUP, "b7d", "Gluon b7d: b7b with 64-row query tiles at D = 128", BWD,
         _backward_b7("b7d")),
    Case("bwd-b7e-d128", B7_GROUP, "b7e", "Gluon b7e: b7d with dQ computed transposed (no bank conflicts storing it)",
         BWD, _backward_b7("b7e")),
    Case("bwd-b7f-d128", B7_GROUP, "b7f", "Gluon b7f: b7d with the dQ tiles in a 32-byte swizzle", BWD,
         _backward_b7("b7f")),
)


# b8 (hopper/fa3_backward_d256.py) and b8c at D = 256, causal, the shape of the backward gap's cases
# (``bwd-d256-causal-ours``, where the route takes b8 under 3.9, and ``bwd-d256-causal-cudnn``): b8's dQ chunk store
# is b7d's 2-way bank conflict by the bank model, b8c its 32-byte swizzle fix. Triton >= 3.9 first on the path.
B8_GROUP = "b8 at D = 256"
B8_SHAPE = {**BWD, "head_dim": 256, "causal": True}
B8_CASES = (
    Case("bwd-b8-d256", B8_GROUP, "b8", "Gluon b8: FA3's D = 256 backward, the head dim split between the warpgroups",
         B8_SHAPE, _gluon_backward("fa3_backward_d256", "b8_backward", "b8", B8_SHAPE)),
    Case("bwd-b8c-d256", B8_GROUP, "b8c", "Gluon b8c: b8 with the dQ chunks in a 32-byte swizzle", B8_SHAPE,
         _gluon_backward("fa3_backward_d256", "b8_backward", "b8c", B8_SHAPE)),
)


CASES = (
    Case("bwd-b1", "backward", "b1", "b1's dK/dV and dQ kernels (Triton) and their preprocess", BWD, _backward_b1),
    Case("bwd-cudnn", "backward", "sdpa_cudnn", "cuDNN's backward through SDPA (autograd.grad)", BWD,
         _backward_cudnn),
    Case("bwd-b6a", "backward", "fa3-b6a", "Gluon b6a: one warpgroup, TMA and wgmma, dQ by atomics", BWD,
         _backward_b6("b6a")),
    Case("bwd-b6c", "backward", "fa3-b6c", "Gluon b6c: producer warp and two consumer warpgroups", BWD,
         _backward_b6("b6c")),
    Case("decode-fp16", "decode", "flashcourse", "flash_decode, float16 cache",
         {**DECODE, "kv_dtype": "float16"}, _decode("float16")),
    Case("decode-fp8", "decode", "flashcourse", "flash_decode, float8_e4m3fn cache with k_scale / v_scale",
         {**DECODE, "kv_dtype": "float8_e4m3fn"}, _decode("float8_e4m3fn")),
    Case("prefix-lm-fwd-ours", "mask rule", "flashcourse", "forward, mask_mod per call (tile lists built in the call)",
         {**MASK, "mode": "fwd"}, _mask_case("flashcourse", "fwd")),
    Case("prefix-lm-bwd-ours", "mask rule", "flashcourse", "backward, mask_mod per call (autograd.grad)",
         {**MASK, "mode": "bwd"}, _mask_case("flashcourse", "bwd")),
    Case("prefix-lm-fwd-flex", "mask rule", "flex", "compiled flex_attention forward, block mask built once",
         {**MASK, "mode": "fwd"}, _mask_case("flex", "fwd")),
    Case("prefix-lm-bwd-flex", "mask rule", "flex", "compiled flex_attention backward (autograd.grad)",
         {**MASK, "mode": "bwd"}, _mask_case("flex", "bwd")),
) + tuple(
    Case(f"{_slug(name)}-{mode}-{'ours' if provider == 'flashcourse' else _slug(provider)}", "variant gap", provider,
         f"bench variants' {name!r} {mode}, {provider}", _variant_shape(name, mode),
         _variant_case(name, provider, mode))
    for name, mode, ours, theirs in VARIANT_GAPS for provider in (ours, theirs)) + GAP_CASES + H100_CASES + B7_CASES \
    + B8_CASES
CASES_BY_NAME = {case.name: case for case in CASES}


def select_cases(names: list[str] | None) -> list[Case]:
    """The named cases in the order given (each once), or every case in :data:`CASES`'s order."""
    if not names:
        return list(CASES)
    unknown = [n for n in names if n not in CASES_BY_NAME]
    if unknown:
        raise SystemExit(f"unknown case {', '.join(map(repr, unknown))}: expected one of {', '.join(CASES_BY_NAME)} "
                         "(--list shows them)")
    return [CASES_BY_NAME[n] for n in dict.fromkeys(names)]


def run_case(case: Case, *, list_kernels: bool = False) -> None:
    """Build, warm up, then one call between cudaProfilerStart and Stop (what ncu profiles). ``list_kernels``:
    the call runs under torch.profiler instead, and its kernels are printed in launch order (no ncu then: two
    profilers cannot share the GPU's counters)."""
    import torch

    call = case.build()
    for _ in range(WARMUP_CALLS):
        call()
    torch.cuda.synchronize()
    if list_kernels:
        from torch.autograd import DeviceType
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            call()
            torch.cuda.synchronize()
        launched = sorted((e for e in prof.events() if e.device_type == DeviceType.CUDA),
                          key=lambda e: e.time_range.start)
        print(f"{case.name}: {len(launched)} kernels, "
              f"{sum(e.time_range.elapsed_us() for e in launched) / 1e3:.2f} ms on the GPU")
        for e in launched:
            print(f"  {e.time_range.elapsed_us():10.1f} us  {e.name}")
        return
    torch.cuda.profiler.start()
    with torch.cuda.nvtx.range(case.name):
        call()
        torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    print(f"{case.name}: profiled call done")


# --- ncu: command lines, metrics, CSV parsing ---------------------------------------------------------------

def available_metrics(query_output: str) -> set[str]:
    """Base metric names in the output of ``ncu --query-metrics`` (one a line, first column)."""
    found = set()
    for line in query_output.splitlines():
        match = re.match(r"^([a-z0-9]+__[a-z0-9_]+)\s", line + " ")
        if match:
            found.add(match.group(1))
    return found


def extra_metrics(available: set[str] | None) -> list[str]:
    """The metrics to ask for beyond the sections: those of EXTRA_METRICS and EXTRA_METRIC_FAMILIES whose base
    name this ncu lists (none when the list could not be read: the sections alone, rather than an unknown
    metric that stops every case)."""
    if not available:
        return []
    chosen = [m for m in EXTRA_METRICS if m.split(".")[0] in available]
    for pattern, suffix in EXTRA_METRIC_FAMILIES:
        chosen += [name + suffix for name in sorted(available) if re.fullmatch(pattern, name)]
    return list(dict.fromkeys(chosen))


def wants_source_counters(case: Case) -> bool:
    """The cases --by-instruction adds the source counters to: b7, b8 and their variants, and cuDNN's backward
    beside them (the other cases would pay the extra replay pass for a question nobody asked of them)."""
    return case.name.startswith(("bwd-b7", "bwd-b8")) or case.name == "bwd-cudnn"


def ncu_command(ncu: str, case: str, report: Path, metrics: list[str], *, by_instruction: bool = False) -> list[str]:
    """ncu over one case's process: only the call between cudaProfilerStart and Stop is profiled; with
    ``by_instruction`` the Source Counters section too (its PC sampling and SASS counters cost extra replay passes
    of the same run, not another run of the case)."""
    command = [ncu, "--clock-control", "none", "--profile-from-start", "off", "--target-processes",
               "application-only", "--force-overwrite", "--export", str(report)]
    for section in SECTIONS + ((SOURCE_SECTION,) if by_instruction else ()):
        command += ["--section", section]
    if metrics:
        command += ["--metrics", ",".join(metrics)]
    return command + [sys.executable, str(SCRIPT), "--case", case]


def export_command(ncu: str, report: Path, page: str) -> list[str]:
    """A page of a report as CSV; the source page as SASS alone (no CUDA source: Triton's would not help)."""
    command = [ncu, "--import", str(report), "--csv", "--page", page]
    return command + ["--print-source", "sass"] if page == "source" else command


def _csv_rows(text: str) -> list[dict]:
    """The CSV that ncu prints, without the ==PROF== / ==WARNING== lines before its header."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        return []
    return list(csv.DictReader(io.StringIO("\n".join(lines[start:]))))


def to_number(text: str | None) -> float | None:
    """A value as ncu prints it ("3,708,256", "12.50", "n/a") as a float, or None."""
    if text is None:
        return None
    try:
        return float(text.replace(",", "").strip())
    except ValueError:
        return None


def in_json_units(value: float | None, unit: str | None) -> float | None:
    """Times to microseconds, sizes to bytes, frequencies to hertz; other units as they are."""
    if value is None:
        return None
    base = (unit or "").strip().lower().split("/")[0]  # "byte/block" is bytes a block
    return value * UNIT_SCALE.get(base, 1.0)


def _launch(entries: dict, row: dict) -> dict:
    return entries.setdefault(row["ID"], {"kernel": row.get("Kernel Name", ""), "block": row.get("Block Size", ""),
                                          "grid": row.get("Grid Size", ""), "metrics": {}})


def parse_details(text: str) -> dict[str, dict]:
    """``--page details`` CSV: {launch ID: {kernel, block, grid, metrics: {(section, name): value}}}, values in
    the JSON's units; the rules' advice rows (no metric name) are skipped."""
    launches: dict[str, dict] = {}
    for row in _csv_rows(text):
        entry = _launch(launches, row)
        if row.get("Metric Name"):
            value = in_json_units(to_number(row.get("Metric Value")), row.get("Metric Unit"))
            entry["metrics"][(row.get("Section Name", ""), row["Metric Name"])] = value
    return launches


RAW_NAME_COLUMNS = ("ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Context", "Stream", "Block Size",
                    "Grid Size", "Device", "CC")


def parse_raw(text: str) -> dict[str, dict]:
    """``--page raw`` CSV (a column per metric, a row of units under the header): {launch ID: {kernel, block,
    grid, metrics: {metric name: value}}}, values in the JSON's units."""
    rows = _csv_rows(text)
    units = {}
    if rows and not rows[0].get("ID"):  # the units row
        units, rows = rows[0], rows[1:]
    launches: dict[str, dict] = {}
    for row in rows:
        entry = _launch(launches, row)
        for name, value in row.items():
            if name and name not in RAW_NAME_COLUMNS:
                entry["metrics"][name] = in_json_units(to_number(value), units.get(name))
    return launches


def _details_value(metrics: dict, section: str, name: str) -> float | None:
    """(section, name), or the name alone where only one section prints it (a section's title may differ
    between ncu versions)."""
    if (section, name) in metrics:
        return metrics[(section, name)]
    found = [value for (_, metric), value in metrics.items() if metric == name]
    return found[0] if len(found) == 1 else None


def kernel_counters(details: dict | None, raw: dict | None) -> dict:
    """The JSON counters of one launch from its details and raw entries (either may be missing)."""
    raw_metrics = raw["metrics"] if raw else {}
    details_metrics = details["metrics"] if details else {}
    out: dict = {}
    for key, sources in COUNTERS:
        value = None
        for where, name in sources:
            value = raw_metrics.get(name) if where == "raw" else _details_value(details_metrics, where, name)
            if value is not None:
                break
        out[key] = value
    if out["dram_bytes"] is None and out["dram_read_bytes"] is not None and out["dram_write_bytes"] is not None:
        out["dram_bytes"] = out["dram_read_bytes"] + out["dram_write_bytes"]
    for end, op in (("load", "ld"), ("store", "st")):  # spills: bytes, else 32-byte sectors
        sectors = raw_metrics.get(f"l1tex__t_sectors_pipe_lsu_mem_local_op_{op}.sum")
        if out[f"local_{end}_bytes"] is None and sectors is not None:
            out[f"local_{end}_bytes"] = 32 * sectors
    atomics = [out[k] for k in ("global_red_inst", "global_atom_inst") if out[k] is not None]
    out["atomic_inst_share"] = (sum(atomics) / out["inst_executed"]
                                if atomics and out["inst_executed"] else None)
    pipes = {m.group(1): v for name, v in raw_metrics.items() if (m := TENSOR_PIPE.match(name)) and v is not None}
    out["tensor_pipes_pct"] = pipes
    out["tensor_pipe_pct"] = max(pipes.values()) if pipes else None
    stalls = {m.group(1): v for name, v in raw_metrics.items() if (m := STALL.match(name)) and v is not None}
    out["stalls"] = stalls  # warp cycles stalled for this reason per issued instruction
    out["top_stalls"] = sorted(([r, v] for r, v in stalls.items() if r != "selected"), key=lambda rv: -rv[1])[
        :TOP_STALLS]  # "selected" is the issue itself, not a stall
    return out


def case_rows(case: Case, details_text: str, raw_text: str) -> list[dict]:
    """One JSON row per kernel launch of a case's report, in launch order."""
    details, raw = parse_details(details_text), parse_raw(raw_text)
    rows = []
    for order, launch in enumerate(sorted(set(details) | set(raw), key=lambda i: int(i))):
        entry = details.get(launch) or raw.get(launch)
        rows.append({"case": case.name, "group": case.group, "provider": case.provider, "launch": order,
                     "kernel": entry["kernel"], "grid": entry["grid"], "block": entry["block"],
                     **kernel_counters(details.get(launch), raw.get(launch))})
    return rows


# --- the source page: stalls by SASS instruction ---------------------------------------------------------------

def _first_column(header: dict[str, int], names: tuple[str, ...]) -> int | None:
    return next((header[name] for name in names if name in header), None)


def _count(row: list[str], index: int | None) -> float:
    """A count of a source-page row; 0 where the column is missing or empty (an instruction never sampled)."""
    return (to_number(row[index]) or 0.0) if index is not None and index < len(row) else 0.0


def parse_source(text: str) -> list[dict]:
    """``--page source --print-source sass`` CSV: one entry per kernel table, in the report's order:
    {kernel, instructions: [{address, sass, samples, not_issued, executed, shared_wavefronts, shared_ideal, reasons:
    {reason: samples}}]} (a count whose column the export lacks is 0). A table
    is a ``"Kernel Name","<name>"`` line, a header row with "Address" and "Source", then one row per instruction;
    banner lines (==PROF==, ==WARNING==) and anything before the first header are skipped."""
    tables: list[dict] = []
    header: dict[str, int] | None = None
    name: str | None = None
    for row in csv.reader(io.StringIO(text)):
        if not row or row[0].startswith("=="):
            continue
        if row[0] == "Kernel Name":
            name, header = (row[1] if len(row) > 1 else ""), None
            continue
        if "Address" in row and "Source" in row:
            header = {column: i for i, column in enumerate(row)}
            tables.append({"kernel": name or "", "instructions": []})
            name = None  # a second header with no name line between is a second kernel whose name was not printed
            continue
        if header is None or not row[header["Address"]].strip().lower().startswith("0x"):
            continue
        tables[-1]["instructions"].append({
            "address": row[header["Address"]].strip(), "sass": row[header["Source"]].strip(),
            "samples": _count(row, _first_column(header, SAMPLES_COLUMNS)),
            "not_issued": _count(row, _first_column(header, NOT_ISSUED_COLUMNS)),
            "executed": _count(row, header.get(EXECUTED_COLUMN)),
            "shared_wavefronts": _count(row, header.get(SHARED_WAVEFRONTS_COLUMN)),
            "shared_ideal": _count(row, header.get(SHARED_IDEAL_COLUMN)),
            "reasons": {m.group(1): _count(row, i) for column, i in header.items()
                        if (m := REASON_COLUMN.match(column))}})
    return tables


def opcode(sass: str) -> str:
    """The opcode of a SASS line, its predicate (``@P0``, ``@!PT``) dropped: ``SYNCS.PHASECHK.TRANS64.TRYWAIT``."""
    words = sass.split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return words[0].rstrip(";") if words else ""


def opcode_family(code: str) -> str:
    root = code.split(".")[0]
    return next((family for family, roots in OPCODE_FAMILIES if root in roots), OTHER_FAMILY)


def _top_reasons(reasons: dict[str, float], samples: float) -> list[list]:
    """The reasons that dominate ``samples``, as [reason, share of them]; "selected" (the warp issuing) is no
    stall and is left out."""
    ranked = sorted(((r, v) for r, v in reasons.items() if v > 0 and r != "selected"), key=lambda rv: -rv[1])
    return [[reason, round(value / samples, 4)] for reason, value in ranked[:TOP_SITE_REASONS]]


def stall_sites(table: dict, top: int = TOP_STALL_SITES) -> dict:
    """Where one kernel's warps were sampled, by instruction: ``stall_sites``, the ``top`` instructions by
    samples (SASS text, opcode family, share of the kernel's samples, dominant reasons as shares of that
    instruction's samples), and ``stall_families``, every sample grouped by :data:`OPCODE_FAMILIES`."""
    instructions = table["instructions"]
    total = sum(i["samples"] for i in instructions)
    if not total:
        return {"stall_samples": 0, "stall_sites": [], "stall_families": {}}
    start = min(int(i["address"], 16) for i in instructions)
    sites = []
    for i in sorted((i for i in instructions if i["samples"] > 0), key=lambda i: -i["samples"])[:top]:
        code = opcode(i["sass"])
        sites.append({"offset": hex(int(i["address"], 16) - start), "sass": i["sass"], "opcode": code,
                      "family": opcode_family(code), "samples": i["samples"],
                      "share": round(i["samples"] / total, 4),
                      "not_issued_share": round(i["not_issued"] / i["samples"], 4),
                      "executed": i["executed"], "reasons": _top_reasons(i["reasons"], i["samples"])})
    families: dict[str, dict] = {}
    for i in instructions:
        family = families.setdefault(opcode_family(opcode(i["sass"])), {"samples": 0.0, "reasons": {}})
        family["samples"] += i["samples"]
        for reason, value in i["reasons"].items():
            family["reasons"][reason] = family["reasons"].get(reason, 0.0) + value
    order = [name for name, _ in OPCODE_FAMILIES] + [OTHER_FAMILY]
    return {"stall_samples": total, "stall_sites": sites,
            "stall_families": {name: {"share": round(families[name]["samples"] / total, 4),
                                      "reasons": _top_reasons(families[name]["reasons"], families[name]["samples"])}
                               for name in order if name in families and families[name]["samples"] > 0}}


def conflict_sites(table: dict, top: int = TOP_CONFLICT_SITES) -> dict:
    """Which instructions of one kernel paid for shared-memory bank conflicts: ``shared_excess``, the wavefronts
    beyond the ideal over all its instructions, and ``conflict_sites``, the ``top`` instructions by that excess
    (SASS text, times executed, wavefronts, ideal, excess), most first; none where the export has no such columns."""
    instructions = table["instructions"]
    start = min((int(i["address"], 16) for i in instructions), default=0)
    paying = sorted((i for i in instructions if i["shared_wavefronts"] > i["shared_ideal"]),
                    key=lambda i: i["shared_ideal"] - i["shared_wavefronts"])
    return {"shared_excess": sum(i["shared_wavefronts"] - i["shared_ideal"] for i in paying),
            "conflict_sites": [{"offset": hex(int(i["address"], 16) - start), "sass": i["sass"],
                                "executed": i["executed"], "wavefronts": i["shared_wavefronts"],
                                "ideal": i["shared_ideal"], "excess": i["shared_wavefronts"] - i["shared_ideal"]}
                               for i in paying[:top]]}


def _base_name(kernel: str) -> str:
    return kernel.split("(")[0].strip()


def source_table_for(tables: list[dict], rows: list[dict], row: dict) -> dict | None:
    """The source table of one launch: the same kernel name (the n-th table of a name for the n-th launch of
    it), else, where the names do not match but there is one table per launch, the table at its position."""
    same = [r for r in rows if _base_name(r["kernel"]) == _base_name(row["kernel"])]
    named = [t for t in tables if _base_name(t["kernel"]) == _base_name(row["kernel"])]
    if named:
        position = same.index(row)
        return named[position] if position < len(named) else None
    return tables[rows.index(row)] if len(tables) == len(rows) else None


def add_stall_sites(rows: list[dict], source_text: str) -> str:
    """Puts the stall and conflict sites of a case's main kernel (its longest launch) on that kernel's row; returns
    a note for the case's status when the source page does not have them."""
    timed = [r for r in rows if r["duration_us"] is not None]
    if not timed:
        return "; source page: no kernel has a duration to pick the main one by"
    main = max(timed, key=lambda r: r["duration_us"])
    tables = parse_source(source_text)
    table = source_table_for(tables, rows, main)
    if table is None:
        return f"; source page: no table for {main['kernel'][:60]} among {len(tables)}"
    main.update(stall_sites(table))
    main.update(conflict_sites(table))
    return "" if main["stall_samples"] else f"; source page: no warp samples for {main['kernel'][:60]}"


def stall_summary(rows: list[dict], sites: int = 5) -> str:
    """For each row with stall sites: the share of samples by opcode family, then the first few sites."""
    lines = []
    for r in rows:
        if not r.get("stall_sites"):
            continue
        families = ", ".join(f"{name} {f['share']:.0%}" + (f" ({f['reasons'][0][0]})" if f["reasons"] else "")
                             for name, f in r["stall_families"].items())
        lines.append(f"{r['case']} {r['kernel'][:50]}: {families}")
        for site in r["stall_sites"][:sites]:
            reasons = ", ".join(f"{reason} {share:.0%}" for reason, share in site["reasons"])
            lines.append(f"  {site['share']:6.1%} {site['offset']:>8} {site['sass'][:60]:60} {reasons}")
    return "\n".join(lines)


# --- ncu: running the cases -------------------------------------------------------------------------------------

def case_time_limit(remaining: float, case_timeout: float) -> float | None:
    """Seconds for the next case: its own limit, or what the budget has left after the reserve; None when
    that is too little to start one."""
    limit = min(case_timeout, remaining - RESERVE_S)
    return limit if limit >= MIN_CASE_S else None


def run_process(command: list[str], timeout: float, log_path: Path) -> int | None:
    """Exit code, or None when it outlived ``timeout`` (then its whole process group, ncu and the case, is
    killed: a hung kernel must not hold the GPU for the next case)."""
    with log_path.open("w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            return process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None
        finally:  # also when this script is stopped (SIGTERM from `timeout`, Ctrl-C): no ncu left behind
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


def export_page(ncu: str, report: Path, page: str) -> str:
    done = subprocess.run(export_command(ncu, report, page), capture_output=True, text=True,
                          timeout=EXPORT_TIMEOUT_S)
    if done.returncode != 0:
        raise RuntimeError(f"ncu --import --page {page} exited {done.returncode}: {_last_line(done.stderr)}")
    return done.stdout


def _last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if "ERROR" in line or "Error" in line]
    return (errors or lines or [""])[-1].strip()[:300]


def case_status(code: int | None, timeout: float, kernels: int, log_text: str) -> str:
    if code is None:
        return f"timed out after {timeout:.0f} s"
    if code != 0:
        return f"exit {code}" + (f" after {kernels} kernels" if kernels else "") + f": {_last_line(log_text)}"
    return "ok" if kernels else f"no kernel profiled: {_last_line(log_text)}"


def ncu_version(ncu: str) -> str:
    try:
        done = subprocess.run([ncu, "--version"], capture_output=True, text=True, timeout=30)
        return _last_line(done.stdout) or f"exit {done.returncode}"
    except (OSError, subprocess.SubprocessError) as error:
        return f"unknown ({type(error).__name__})"


def query_metrics(ncu: str) -> set[str] | None:
    try:
        done = subprocess.run([ncu, "--query-metrics"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    return available_metrics(done.stdout) if done.returncode == 0 else None


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def run_ncu(cases: list[Case], out: Path, *, ncu: str, meta: dict, metrics: list[str], budget: float = BUDGET_S,
            case_timeout: float = CASE_TIMEOUT_S, keep_reports: bool = False, by_instruction: bool = False,
            runner=run_process, exporter=export_page, clock=time.monotonic) -> Path:
    """Every case under ncu, one after another, within ``budget`` seconds; the JSON after each case. With
    ``by_instruction``, the cases :func:`wants_source_counters` names also collect the source counters: their
    source page is kept as CSV, their report is kept, and their main kernel's row gets the stall sites."""
    from flashcourse.bench import save_results

    raw_dir = out / "ncu-limits"
    raw_dir.mkdir(parents=True, exist_ok=True)
    start = clock()
    rows: list[dict] = []
    statuses = {c.name: {"status": "not run: the run's budget is spent", "seconds": 0.0, "kernels": 0}
                for c in cases}
    by_instruction_cases = [c.name for c in cases if by_instruction and wants_source_counters(c)]
    meta = {**meta, "kind": "ncu-limits", "sections": list(SECTIONS), "metrics": metrics, "budget_s": budget,
            "by_instruction": {"cases": by_instruction_cases, "section": SOURCE_SECTION, "top_sites": TOP_STALL_SITES,
                               "families": {name: list(roots) for name, roots in OPCODE_FAMILIES}},
            "cases": {c.name: {"group": c.group, "provider": c.provider, "what": c.what, "shape": c.shape,
                               **statuses[c.name]} for c in cases}}

    def save(complete: bool) -> Path:
        meta.update(seconds=round(clock() - start, 1), complete=complete)
        for name, status in statuses.items():
            meta["cases"][name].update(status)
        return save_results("ncu-limits", rows, directory=out, meta=meta)

    def profile(case: Case, limit: float) -> tuple[int | None, list[dict], str, str]:
        """(exit code or None, rows, a note on the export, the log) of one ncu run over ``case``."""
        report = raw_dir / f"{case.name}.ncu-rep"
        report.unlink(missing_ok=True)
        log_path = raw_dir / f"{case.name}.log"
        sampled = case.name in by_instruction_cases
        try:
            code = runner(ncu_command(ncu, case.name, report.with_suffix(""), metrics, by_instruction=sampled),
                          limit, log_path)
        except OSError as error:  # ncu did not start: recorded, like any failure
            code = -1
            log_path.write_text(f"ERROR: {ncu} did not start: {error}\n")
        found: list[dict] = []
        note = ""
        if report.exists():
            try:
                pages = {page: exporter(ncu, report, page) for page in ("details", "raw")}
                for page, text in pages.items():
                    (raw_dir / f"{case.name}-{page}.csv").write_text(text)
                found = case_rows(case, pages["details"], pages["raw"])
            except (OSError, RuntimeError, subprocess.SubprocessError) as error:
                note = f"; export failed: {error}"
            if sampled and found:  # its own try: the counters above stand when the source page fails
                try:
                    source = exporter(ncu, report, "source")
                    (raw_dir / f"{case.name}-source.csv").write_text(source)
                    note += add_stall_sites(found, source)
                except (OSError, RuntimeError, subprocess.SubprocessError) as error:
                    note += f"; source export failed: {error}"
            if not (keep_reports or sampled):  # a sampled report is kept: the GUI's source view reads it
                report.unlink()
        log_text = log_path.read_text(errors="replace") if log_path.exists() else ""
        return code, found, note, log_text

    for case in cases:
        limit = case_time_limit(budget - (clock() - start), case_timeout)
        if limit is None:
            log(f"{case.name}: not started, {budget - (clock() - start):.0f} s of the budget left")
            continue
        t0 = clock()
        code, found, note, log_text = profile(case, limit)
        if not found and metrics and METRIC_ERROR.search(log_text):
            # A metric this ncu lists but will not collect would fail every case: the sections alone from here on.
            meta.update(metrics=[], metrics_dropped=_last_line(log_text))
            metrics = []
            log(f"{case.name}: ncu refused the extra metrics ({meta['metrics_dropped']}); again with the sections")
            limit = case_time_limit(budget - (clock() - start), case_timeout)
            if limit is not None:
                code, found, note, log_text = profile(case, limit)
        statuses[case.name] = {"status": case_status(code, limit or 0.0, len(found), log_text) + note,
                               "seconds": round(clock() - t0, 1), "kernels": len(found), "time_limit_s": limit,
                               "kernel_us_total": round(sum(r["duration_us"] or 0 for r in found), 1)}
        rows.extend(found)
        save(complete=False)
        log(f"{case.name}: {statuses[case.name]['status']}, {len(found)} kernels, "
            f"{statuses[case.name]['seconds']:.0f} s (run {clock() - start:.0f} s of {budget:.0f})")
    path = save(complete=True)
    log(f"wrote {path}")
    return path


def _fmt(value, spec: str = ".0f") -> str:
    return "-" if value is None else format(value, spec)


def summary(rows: list[dict]) -> str:
    """One line per kernel: what a reader checks first."""
    lines = [f"{'case':20} {'kernel':44} {'us':>9} {'SM%':>5} {'TC%':>5} {'DRAM%':>5} {'L2%':>5} {'occ%':>5} "
             f"{'regs':>4} {'issue%':>6}  top stalls"]
    for r in rows:
        stalls = ", ".join(f"{reason} {value:.1f}" for reason, value in r["top_stalls"][:3])
        lines.append(f"{r['case']:20} {r['kernel'][:44]:44} {_fmt(r['duration_us'], '9.1f')} "
                     f"{_fmt(r['sm_throughput_pct'], '5.0f')} {_fmt(r['tensor_pipe_pct'], '5.0f')} "
                     f"{_fmt(r['dram_throughput_pct'], '5.0f')} {_fmt(r['l2_throughput_pct'], '5.0f')} "
                     f"{_fmt(r['achieved_occupancy_pct'], '5.1f')} {_fmt(r['registers_per_thread'], '4.0f')} "
                     f"{_fmt(r['issue_slots_busy_pct'], '6.1f')}  {stalls}")
    return "\n".join(lines)


def dry_run(cases: list[Case], case_timeout: float, budget: float) -> int:
    """Each case in a process of its own, no ncu: the kernels its profiled call launches, and the seconds; no
    case starts after ``budget`` seconds."""
    failed = 0
    start = time.monotonic()
    for case in cases:
        t0 = time.monotonic()
        if t0 - start > budget:
            log(f"{case.name}: not started, the budget is spent")
            failed += 1
            continue
        try:
            done = subprocess.run([sys.executable, str(SCRIPT), "--case", case.name, "--kernels"],
                                  capture_output=True, text=True, timeout=case_timeout)
            code, text = done.returncode, done.stdout + (done.stderr[-3000:] if done.returncode else "")
        except subprocess.TimeoutExpired:
            code, text = None, ""
        failed += code != 0
        status = "ok" if code == 0 else ("timed out" if code is None else f"exit {code}")
        log(f"{case.name}: {status} in {time.monotonic() - t0:.0f} s")
        print(text, flush=True)
    return 1 if failed else 0


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--list", action="store_true", help="print the cases and exit")
    mode.add_argument("--run-ncu", action="store_true", help="run ncu over each case; needs --out")
    mode.add_argument("--dry", action="store_true", help="run each case once without ncu and print its kernels")
    mode.add_argument("--case", help="run one case as ncu profiles it (its process, under ncu)")
    parser.add_argument("--only", action="append", metavar="CASE",
                        help="with --run-ncu or --dry: this case only (repeat); default every case")
    parser.add_argument("--kernels", action="store_true", help="with --case: print the kernels (torch.profiler)")
    parser.add_argument("--out", type=Path, help="folder for the JSON and <out>/ncu-limits/ (CSV, logs)")
    parser.add_argument("--ncu", default=NCU, help=f"the ncu binary (default {NCU}, else ncu on PATH)")
    parser.add_argument("--budget", type=float, default=BUDGET_S, help="seconds for the whole --run-ncu or --dry")
    parser.add_argument("--case-timeout", type=float, default=CASE_TIMEOUT_S, help="seconds for one case")
    parser.add_argument("--keep-reports", action="store_true", help="keep the .ncu-rep files beside the CSVs")
    parser.add_argument("--by-instruction", action="store_true",
                        help="with --run-ncu: the bwd-b7*, bwd-b8* and bwd-cudnn cases also collect the source "
                             "counters, and their main kernel's row gets the top stall sites by SASS instruction")
    args = parser.parse_args(argv)
    if args.run_ncu and args.out is None:
        parser.error("--run-ncu needs --out DIR")
    if args.case is not None:
        select_cases([args.case])
    selected = select_cases(args.only)
    if args.by_instruction and not args.run_ncu:
        parser.error("--by-instruction needs --run-ncu (it changes what ncu collects)")
    if args.by_instruction and not any(wants_source_counters(c) for c in selected):
        parser.error("--by-instruction applies to the bwd-b7*, bwd-b8* cases and bwd-cudnn only: add --only "
                     "bwd-b7c-d128 (or another of them)")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.list:
        name_width, group_width = (max(len(getattr(c, key)) for c in CASES) for key in ("name", "group"))
        for case in CASES:
            print(f"{case.name:{name_width}} {case.group:{group_width}} {case.what}")
        return 0
    if args.case:
        run_case(CASES_BY_NAME[args.case], list_kernels=args.kernels)
        return 0
    cases = select_cases(args.only)
    if args.dry:
        return dry_run(cases, args.case_timeout, args.budget)
    ncu = args.ncu if Path(args.ncu).exists() else shutil.which("ncu")
    if ncu is None:
        print(f"no ncu at {args.ncu} nor on PATH")
        return 2
    from flashcourse.bench import environment_info

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwinds through run_process, which kills its case
    start = time.monotonic()
    available = query_metrics(ncu)
    metrics = extra_metrics(available)
    meta = environment_info()
    meta.update(ncu=ncu_version(ncu), ncu_path=ncu, metrics_listed=available is not None,
                command=" ".join(sys.argv))
    log(f"{meta.get('device')}, torch {meta.get('torch')}, triton {meta.get('triton')}, {meta['ncu']}; "
        f"{len(metrics)} metrics beyond the sections; cases {[c.name for c in cases]}")
    path = run_ncu(cases, args.out, ncu=ncu, meta=meta, metrics=metrics,
                   budget=args.budget - (time.monotonic() - start), case_timeout=args.case_timeout,
                   keep_reports=args.keep_reports, by_instruction=args.by_instruction)
    data = json.loads(path.read_text())
    print(summary(data["rows"]))
    if args.by_instruction:
        print(stall_summary(data["rows"]))
    for name, case in data["meta"]["cases"].items():
        print(f"{name:20} {case['status'][:100]:100} {case['seconds']:6.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
