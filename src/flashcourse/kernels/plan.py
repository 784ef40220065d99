"""How a call runs: its route (which forward and backward kernels, and why) and its plan (the launches, prepared
once for a layout and then only repeated).

The route is decided in one place, :func:`choose_route`, which ``flash_attention``, ``flash_attention_forward``,
``flash_attention_backward``, the ``torch.library`` ops and ``kernels.explain`` all ask:

- forward: on a Hopper GPU (compute capability 9.0) with a Triton the Gluon kernels were tested with, the
  kernel that the committed H200 results show fastest for the call's head dim, causality and length
  (:data:`FORWARD_BANDS`: a Gluon stage of ``hopper/fa3.py``, or v7 for short causal calls at D = 64), wherever the
  call fits that stage's contract; v7 everywhere else;
- backward: b3 (every option), or b1 where the call needs none of b3's options (measured faster, dense); on Hopper,
  for plain or causal calls of N >= 1024 keys under a Triton it was tested with (3.9), a Gluon backward with
  FlashAttention-3's design (:func:`gluon_backward`): b7c of ``hopper/fa3_backward_tma.py`` at head dim 64, b7g of
  the same module at 128, b8d of ``hopper/fa3_backward_d256.py`` at 256.

A plan (:class:`Plan`) is what a call's shapes already decide: the route, the resolved scale, the launches with
their grids and argument lists. It is looked up by everything that determines it (shapes, strides, dtype,
device, 16-byte alignment, options), so a repeat call checks nothing twice and only allocates its outputs and
launches: FlashInfer's plan / run split and FlexAttention's block mask built once, for our calls. The autograd
Function keeps the forward's plan for the backward, whose three launches it also prepares on first use.
Calls whose rules bring tensors of their own (ALiBi slopes, document ids, a block mask) or a ``mask_mod`` get a
plan for that call alone: their tensors change from call to call (a ``mask_mod``'s tile lists are kept apart, by
``blockmask.CALL_LISTS``).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import NamedTuple

import torch
import triton

from . import configs, decode, launch
from .backward import BACKWARD_VERSIONS, DEFAULT_BACKWARD, DENSE_BACKWARD, run_backward
from .blockmask import BlockMask
from .common import LOG2E, default_scale, row_stats_allocator, strides, tma_scratch
from .dropout import Dropout
from .forward import DEFAULT_FORWARD, FORWARD_VERSIONS, descriptors_usable, run_forward
from .rules import Rules
from .stepdown import launch_fitting

# The forward that serves a call on Hopper, per (head dim, causal), in bands of N_q: the first band whose limit the
# call's N_q does not pass names it, v7 or a Gluon stage (the same in float16 and bfloat16). From N_q = 2048 on, each
# band's kernel is the fastest of v8a, v8d, v8f, v8h and v7 timed side by side in FA3_RESULTS, or within 2% of it
# (v8d and v8h trade places by up to 2% between the two dtypes at N = 8192 and 16384); tests/test_plan.py holds the
# bands to that file. There (B = 4; H = 32, 16 and 8 at N <= 4096, 8192 and 16384), against cuDNN (key
# ratio_vs_sdpa_cudnn, fp16 / bf16):
# - D = 64, causal: v8a 0.97 / 0.99x at N = 2048 and 0.99 / 1.00x at 4096 (v8f 0.72x and 0.96 / 0.98x: its 192-row
#   tiles compute too much of the causal square); v8f 1.09x at 16384 (v8a 1.01x). At 8192 the two tie (1.01 / 1.02x
#   against 1.01x here; in the grids, a run apart, v8a 0.98 / 0.98x at 551ad60 and v8f 0.99 / 1.01x at cbadf8b).
# - D = 128, causal: v8f 1.00 / 0.99x at N = 2048 and 1.03 / 1.02x at 4096 (v8d 0.92 / 0.91x and 0.99x);
#   v8d 1.05 / 1.07x at 16384 (v8f 1.04x).
# - Not causal: v8f at D = 64 (1.02-1.12x from N = 2048), v8d at D = 128 (0.94-1.02x, none of the others ahead by 2%).
# At N_q <= 1024 that script's own calls are host-bound (v8a's repeats spread 105-262 TFLOP/s at D = 64), so the
# short bands come from the attention grids, where flash_attention runs with its plans: at N = 1024, causal, D = 64
# v7 0.73x against v8f's 0.57-0.60x (2026-12-02-nvidia-h200-attention-*-cbadf8b.json and -1a7bc36.json), D = 128 v8d
# 0.82-0.87x.
# D = 256: v8d, the fastest stage of its own run (FA3_RESULTS[256]).
_BY_LENGTH = "benchmarks/results/2026-12-02-nvidia-h200-fa3-stages-v8a-v8d-v8f-v8h-n1024-2048-4096-8192-16384.json"
FA3_RESULTS = {64: _BY_LENGTH, 128: _BY_LENGTH,
               256: "benchmarks/results/2026-12-02-nvidia-h200-fa3-stages-v8c-v8d-v8e-v8f-v8g-d256.json"}
FORWARD_BANDS = {
    (64, False): ((None, "v8f"),),
    (64, True): ((1024, "v7"), (8192, "v8a"), (None, "v8f")),
    (128, False): ((None, "v8d"),),
    (128, True): ((1024, "v8d"), (8192, "v8f"), (None, "v8d")),
    (256, False): ((None, "v8d"),),
    (256, True): ((None, "v8d"),),
}
FA3_HEAD_DIMS = frozenset(head_dim for head_dim, _ in FORWARD_BANDS)
FA3_DTYPES = (torch.float16, torch.bfloat16)

# The H100 80GB HBM3's bands, derived as the H200's from its own stage table by length (H100_FA3_RESULTS, fp16 and
# bf16, D 64 and 128; tests/test_plan.py holds them to it): from N = 2048 on, each band's kernel within 2% of the
# fastest there. Where they differ from the H200's (key ratio_vs_sdpa_cudnn, fp16 / bf16):
# - D = 64, causal: v8a to N = 4096 only (0.99 / 0.98x there, v8f 0.98 / 0.97x); at 8192 v8f 1.01 / 1.02x against
#   v8a's 1.00 / 1.00x, v8a 2.5% behind in bf16.
# - D = 128, causal: v8f to N = 4096 only (1.01 / 0.99x, v8d 1.01 / 0.97x); at 8192 v8d 1.07 / 1.08x, v8f 1.04 /
#   1.07x, 2.6% behind in fp16.
# At N_q <= 1024 the script is host-bound, as on the H200 (its v8a calls spread 82-163 TFLOP/s at causal D = 64), so
# the kernels' own times decide there: Nsight Compute at causal D = 64, N = 1024 (H100_SHORT_CAUSAL_PROFILE) timed
# v7 at 83 us, v8a at 63 us and cuDNN at 59 us, so v8a serves that band too (v7 had given 0.73x cuDNN in the H100's
# attention grid, 2026-12-06-nvidia-h100-80gb-hbm3-attention-fp16-d64.json); not causal, v8f (0.88x in that grid);
# D = 128 keeps the H200's short bands (no H100 grid at D = 128).
# No H100 run at D = 256: the H200's bands serve it, said as the fallback.
H100_FA3_RESULTS = ("benchmarks/results/2026-12-06-nvidia-h100-80gb-hbm3-fa3-stages-v8a-v8d-v8f-n1024-2048-4096-8192-"
                    "16384.json")
H100_SHORT_CAUSAL_PROFILE = "benchmarks/results/2026-12-06-nvidia-h100-80gb-hbm3-ncu-h100-gaps.json"
H100_FORWARD_BANDS = {
    (64, False): ((None, "v8f"),),
    (64, True): ((4096, "v8a"), (None, "v8f")),
    (128, False): ((None, "v8d"),),
    (128, True): ((1024, "v8d"), (4096, "v8f"), (None, "v8d")),
}

# The bands of each GPU they were measured on, by the name torch gives the device (configs.DeviceProps.name), with
# the short name explain() says. A Hopper GPU with no measurement of its own, or none at a head dim and causality,
# takes the H200's there (the fallback, as the H200's was the only dispatch before), and explain() says so.
FALLBACK_GPU = "NVIDIA H200"
BANDS_BY_GPU = {"NVIDIA H200": ("H200", FORWARD_BANDS), "NVIDIA H100 80GB HBM3": ("H100", H100_FORWARD_BANDS)}


def bands_for(gpu_name: str, head_dim: int, causal: bool) -> tuple[str, dict, bool]:
    """(the short name of the GPU whose measurement serves ``gpu_name`` at (head_dim, causal), its bands, whether
    they are the fallback's)."""
    measured = BANDS_BY_GPU.get(gpu_name)
    if measured is not None and (head_dim, causal) in measured[1]:
        return (*measured, False)
    return (*BANDS_BY_GPU[FALLBACK_GPU], True)


def band_forward(head_dim: int, causal: bool, n_q: int, bands: dict = FORWARD_BANDS) -> tuple[str, int | None]:
    """(forward, the band's longest N_q or None) that ``bands`` (FORWARD_BANDS, the H200's, by default) give a call;
    (head_dim, causal) must be a key."""
    for limit, forward in bands[head_dim, causal]:
        if limit is None or n_q <= limit:
            return forward, limit
    raise AssertionError("every FORWARD_BANDS entry ends with an open band")


HOPPER = (9, 0)

# The backward on Hopper: FlashAttention-3's design in Gluon, dQ added by a TMA reduce-add (Triton >= 3.9), measured
# on an H100 80GB at N = 1024-16384 (B*H*N = 524,288, fp16 and bf16, causal and not; keys ratio_vs_b1,
# ratio_vs_sdpa_cudnn):
# - b7c of hopper/fa3_backward_tma.py at D = 64 (B7_LENGTHS): 1.05-1.44x b1 and 0.83-1.04x cuDNN at D 64 and 128;
#   its gradients passed every check of B7_CHECKS (N = 1 to 4096 against float64);
# - b7g of the same module at D = 128 (B7G_LENGTHS): 1.10-1.30x b1 and 0.92-0.99x cuDNN; every check of B7G_CHECKS
#   passed (N = 1 to 4096). b7g is b7e (dQ computed transposed, 1.03-1.12x b7c by length) with a bfloat16 P rounded
#   two values an instruction: its float16 SASS is b7e's, and by length its bfloat16 ran 1.02-1.08x the TFLOP/s of
#   b7e's run in an earlier lease (float16, the same code, 1.00-1.03x: the leases' drift; docs/KERNELS.md);
# - b8d of hopper/fa3_backward_d256.py at D = 256 (B8D_LENGTHS): 1.50-2.05x b1 and 0.93-1.05x cuDNN in all 20
#   cases; every check of B8D_CHECKS passed (N = 1 to 4096). b8d is b8 with b7g's paired rounding (b8 ran 1.45-1.99x
#   b1 by length; b8d 1.00-1.04x b8 at N = 8192 in two runs).
# Shorter lengths are not measured, so each serves N >= B7_MIN_N, the shortest length timed; and only under a Triton in
# its module's TESTED_TRITON.
B7_LENGTHS = "benchmarks/results/2026-12-06-nvidia-h100-80gb-hbm3-b7c-lengths.json"
B7_CHECKS = "benchmarks/results/2026-12-06-nvidia-h100-80gb-hbm3-b7-designs.json"
B7G_LENGTHS = "benchmarks/results/2026-12-07-nvidia-h100-80gb-hbm3-b7g-lengths.json"
B7G_CHECKS = "benchmarks/results/2026-12-07-nvidia-h100-80gb-hbm3-b7g-checks.json"
B8D_LENGTHS = B7G_LENGTHS  # one run timed b7g and b8d by length
B8D_CHECKS = B7G_CHECKS
B7_MIN_N = 1024
# Calls of little work (gpu_b7.py --short, B * H = 16-128 at N 1024 and 2048, the stages from a kept plan with
# prepared launches, as the dispatch runs them): from 65,536 query rows (B * H * N_q) b7c and b7e beat b1 in every
# case (b7c 1.17-1.42x, b7e 1.05-1.25x); at 16,384 b1 was faster in 6 of 8 cases (b7c 0.60-0.83x b1): there a call
# is fixed costs, not work, and b1's are lower. So a Gluon backward serves calls of at least B7_MIN_ROWS rows (b7g
# launches as b7e does, one constexpr apart; b8d, not timed at so little work, is held to the same floor). At GPT
# shapes (bench train-step, 98,304 to 262,144 rows, H100, Triton 3.9) a step of attention took 0.98-1.09x plain SDPA's
# time with b7c and 1.19-1.29x with b1; at the floor itself (bench overhead, (1, 64, 1024, 64)) b7c's step, with dQ's
# buffer zeroed in its stats kernel, took 1.46-1.51x and b1's 1.37-1.39x in an earlier lease (docs/KERNELS.md): close
# enough there to keep the floor.
B7_SHORT = "benchmarks/results/2026-12-07-nvidia-h100-80gb-hbm3-b7-short.json"
B7_MIN_ROWS = 65_536


class GluonBackward(NamedTuple):
    """A Gluon backward the dispatch routes to, and the runs that earned it the route."""

    stage: str  # a key of its module's STAGES, and the name explain() gives
    module: str  # under kernels/hopper/, imported when a call is routed there; a plan keeps its backward_plan
    lengths: str  # the timing run by length: faster than b1 at every length from B7_MIN_N
    checks: str  # the run whose gradient checks it passed


GLUON_BACKWARDS = {
    64: GluonBackward("b7c", "fa3_backward_tma", B7_LENGTHS, B7_CHECKS),
    128: GluonBackward("b7g", "fa3_backward_tma", B7G_LENGTHS, B7G_CHECKS),
    256: GluonBackward("b8d", "fa3_backward_d256", B8D_LENGTHS, B8D_CHECKS),
}


def gluon_backward_module(gluon: GluonBackward):
    """The module of a Gluon backward, imported on first use: on Hopper, under a Triton whose Gluon has it."""
    return importlib.import_module(f"{__package__}.hopper.{gluon.module}")


@dataclass(frozen=True)
class Route:
    """Which forward and backward kernels a call runs, and why (what :func:`flashcourse.kernels.explain`
    returns). ``forward`` is a version name of ``FORWARD_VERSIONS`` ("v7") or a Gluon stage ("v8a" ... "v8g");
    ``backward`` a name of ``BACKWARD_VERSIONS`` or a Gluon backward's stage (``GLUON_BACKWARDS``)."""

    forward: str
    backward: str
    forward_why: str
    backward_why: str

    @property
    def gluon(self) -> bool:
        """Whether the forward is a Gluon stage of ``hopper/fa3.py``."""
        return self.forward.startswith("v8")

    def __str__(self) -> str:
        return f"forward  {self.forward}: {self.forward_why}\nbackward {self.backward}: {self.backward_why}"


def _triton_minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


def gluon_stage(q, k, v, rules: Rules, *, block_mask: BlockMask | None, props: configs.DeviceProps,
                triton_version: str) -> tuple[str | None, str]:
    """(stage, why) for the default forward: the Gluon stage that serves this call, or None and the reason v7
    does. Checked inputs only (``check_qkv`` passed)."""
    if props.interpreter or props.capability != HOPPER:
        where = "the CPU interpreter" if props.interpreter else f"compute capability {props.capability}"
        return None, f"the Gluon forward (v8) is for Hopper (compute capability 9.0); this is {where}"
    batch, heads, n_q, head_dim = q.shape
    n_kv = k.shape[2]
    if head_dim not in FA3_HEAD_DIMS or q.dtype not in FA3_DTYPES:
        return None, (f"v8 takes head dims 64, 128 and 256 in float16 or bfloat16; this call is D = {head_dim}, "
                      f"{str(q.dtype).replace('torch.', '')}")
    if k.shape[1] != heads:
        return None, f"v8 has no grouped-query attention (H_q = {heads}, H_kv = {k.shape[1]})"
    if rules.causal == "bottom_right" and n_q != n_kv:
        return None, "v8 knows only top-left causal attention (bottom-right with N_q != N_kv is another mask)"
    for present, what in ((block_mask is not None, "block mask"), (rules.window is not None, "sliding window"),
                          (rules.softcap is not None, "softcap"), (rules.alibi_slopes is not None, "ALiBi"),
                          (rules.document_ids is not None, "document masking"),
                          (rules.mask_mod is not None, "mask_mod"),
                          (rules.dropout_p is not None, "dropout (v7 and b3 regenerate its mask)")):
        if present:
            return None, f"v8 has no {what}"
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not t.is_contiguous() or t.data_ptr() % 16:
            # A .contiguous() copy reads and writes q, k and v once more: about as much time as v8 saves over
            # v7 at N = 4096, so v7, which takes any strides, serves such calls.
            return None, (f"v8 reads contiguous, 16-byte aligned (B, H, N, D) tensors through TMA and {name} is "
                          "not one (a transposed (B, N, H, D) view, say); v7 takes any strides")
    if n_q == 0 or n_kv == 0 or batch * heads == 0:
        return None, "an empty call"
    causal = bool(rules.causal)
    gpu, bands, fallback = bands_for(props.name, head_dim, causal)
    stage, limit = band_forward(head_dim, causal, n_q, bands)
    band = (f"{'causal' if causal else 'non-causal'}, D = {head_dim}, N_q = {n_q}"
            + (f" <= {limit}" if limit is not None else ""))
    source = (f"plan.BANDS_BY_GPU; no measurement on the {props.name} at D = {head_dim}, so the {gpu}'s, the "
              "fallback" if fallback else "plan.BANDS_BY_GPU")
    if stage == "v7":
        return None, f"v7 measured faster on the {gpu} than every Gluon stage at {band} ({source})"
    try:  # imported only here, on Hopper: Gluon's API moves between Triton releases
        from .hopper import fa3
    except Exception as error:  # noqa: BLE001 - any failure to import means: not this Triton
        return None, f"the Gluon kernels do not import under Triton {triton_version} ({type(error).__name__})"
    if _triton_minor(triton_version) not in fa3.TESTED_TRITON:
        return None, (f"the Gluon stages were tested with Triton {', '.join(fa3.TESTED_TRITON)}; this is Triton "
                      f"{triton_version}")
    block_n = fa3.STAGES[stage].block_n[head_dim]
    if n_kv % block_n:
        # hopper/fa3.py sees K and V as one (B*H*N, D) array: a key tile past a head's last row would read the
        # next head's rows, whose P is 0 but whose V times 0 is NaN where V holds an inf.
        return None, (f"N_kv = {n_kv} is not a multiple of {stage}'s key tile ({block_n} rows): its last tile "
                      "would read the next head's keys")
    return stage, f"the fastest forward measured on the {gpu} at {band} ({source})"


def gluon_backward(q, k, v, rules: Rules, *, props: configs.DeviceProps, triton_version: str) -> tuple[str | None, str]:
    """(stage, why) for the default backward of a call that needs none of b3's options: the Gluon backward of its
    head dim (``GLUON_BACKWARDS``) where it was measured faster than b1, or None and why b1 serves it ("" off
    Hopper, where nothing else could)."""
    if props.interpreter or props.capability != HOPPER:
        return None, ""
    n_q, head_dim, n_kv = q.shape[2], q.shape[3], k.shape[2]
    gluon = GLUON_BACKWARDS.get(head_dim)
    if gluon is None or q.dtype not in FA3_DTYPES:
        taken = ", ".join(f"{d} ({g.stage})" for d, g in GLUON_BACKWARDS.items())
        return None, (f"the Gluon backwards take head dims {taken} in float16 or bfloat16; this call is "
                      f"D = {head_dim}, {str(q.dtype).replace('torch.', '')}")
    try:  # imported only here, on Hopper: Gluon's API moves between Triton releases
        module = gluon_backward_module(gluon)
    except Exception as error:  # noqa: BLE001 - any failure to import means: not this Triton
        return None, f"{gluon.stage} does not import under Triton {triton_version} ({type(error).__name__})"
    if not module.HAS_TMA_REDUCE or _triton_minor(triton_version) not in module.TESTED_TRITON:
        tested = ", ".join(module.TESTED_TRITON) or "none yet"
        return None, f"{gluon.stage} is tested with Triton {tested}; this is Triton {triton_version}"
    if any(not t.is_contiguous() or t.data_ptr() % 16 for t in (q, k, v)):
        return None, f"{gluon.stage} reads contiguous, 16-byte aligned (B, H, N, D) tensors through TMA"
    keys = module.STAGES[gluon.stage].keys()
    if n_q != n_kv or n_kv % keys or n_q < B7_MIN_N:
        # A key tile past a head's last row would read the next head's keys (their dP enters dS times P = 0,
        # which is NaN where that V holds an inf); and below B7_MIN_N nothing is measured.
        return None, (f"{gluon.stage} was measured faster than b1 at N_q = N_kv >= {B7_MIN_N} in whole tiles of "
                      f"{keys} keys (an H100, {Path(gluon.lengths).name}); this call is N_q = {n_q}, N_kv = {n_kv}")
    rows = q.shape[0] * q.shape[1] * n_q
    if rows < B7_MIN_ROWS:
        return None, (f"{gluon.stage} was measured faster than b1 from {B7_MIN_ROWS:,} query rows (B * H * N_q) on "
                      f"an H100 ({Path(B7_SHORT).name}); this call has {rows:,}, where b1's fixed costs are lower")
    return gluon.stage, (f"measured faster than b1 at N >= {B7_MIN_N} and from {B7_MIN_ROWS:,} query rows on an "
                         f"H100 ({Path(gluon.lengths).name}, {Path(B7_SHORT).name}, key ratio_vs_b1)")


def choose_route(q, k, v, rules: Rules, *, props: configs.DeviceProps, lacks: str | None,
                 block_mask: BlockMask | None = None, forward_version: str | None = None,
                 backward_version: str | None = None, triton_version: str | None = None) -> Route:
    """The kernels a checked call runs on the device of ``props``, and why: the one decision every entry point
    asks. ``lacks``: what of the call the numbered versions cannot do (``Rules.missing_in_numbered_version``, asked
    by the front door), None for nothing; ``triton_version`` defaults to the installed Triton (a test passes
    another)."""
    if forward_version is not None and forward_version not in FORWARD_VERSIONS:
        raise ValueError(f"unknown forward version {forward_version!r}: expected one of {sorted(FORWARD_VERSIONS)}")
    if backward_version is not None and backward_version not in BACKWARD_VERSIONS:
        raise ValueError(f"unknown backward version {backward_version!r}: expected one of "
                         f"{sorted(BACKWARD_VERSIONS)}")
    triton_version = triton.__version__ if triton_version is None else triton_version
    if forward_version is not None:
        forward, forward_why = forward_version, f"asked for (forward_version={forward_version!r})"
    else:
        stage, why = gluon_stage(q, k, v, rules, block_mask=block_mask, props=props, triton_version=triton_version)
        forward, forward_why = (stage, why) if stage is not None else (DEFAULT_FORWARD, f"the default; {why}")
    if backward_version is not None:
        backward, backward_why = backward_version, f"asked for (backward_version={backward_version!r})"
    else:
        if lacks is None and block_mask is None:
            stage, why = gluon_backward(q, k, v, rules, props=props, triton_version=triton_version)
            backward, backward_why = (stage, why) if stage is not None else (
                DENSE_BACKWARD, "the call needs none of b3's options, and b1 is faster" + (f"; {why}" if why else ""))
        else:
            backward, backward_why = DEFAULT_BACKWARD, f"b3 runs every option ({lacks or 'block mask'})"
    return Route(forward, backward, forward_why, backward_why)


def repeatable(q) -> bool:
    """Whether launches on q's device can be prepared once and repeated: on a GPU, where Triton compiled them (the
    interpreter compiles nothing). ``benchmarks/host_profile.py`` answers True on the CPU to time a GPU's path."""
    return q.is_cuda


class Plan:
    """Everything a call's layout and options decide, prepared once: its route, the resolved scale and, after the
    first call of each, the launches of the forward and of the backward, repeated on the next calls' tensors.

    ``forward`` and ``backward`` take the call's rules (which may hold tensors, never kept here) and block mask;
    ``rules`` are the plan's own, without tensors: a call whose rules hold none may pass these.
    """

    def __init__(self, route: Route, q, k, v, rules: Rules, *, scale: float | None, cacheable: bool,
                 in_graph: bool):
        self.route = route
        self.rules = without_tensors(rules)
        self.scale = scale  # as given: run_forward and fa3 resolve None to 1/sqrt(D) the same way
        self._forward_version = None if route.gluon else FORWARD_VERSIONS[route.forward]
        # None for a Gluon backward (GLUON_BACKWARDS), which plans its own launches
        gluon = route.backward in {gluon.stage for gluon in GLUON_BACKWARDS.values()}
        self._backward_version = None if gluon else BACKWARD_VERSIONS[route.backward]
        self.in_graph = in_graph  # made by an op's body under torch.compile: keeps no tensor (row_stats_allocator)
        self._new_row_stats = None  # new() -> lse or delta: set by plan_for (common.row_stats_allocator)
        # Launches are repeated only on a GPU, where Triton compiled them, and for rules without tensors.
        # Dropout's seed changes every call, so its launches are never prepared.
        self._repeat = (cacheable and repeatable(q) and launch.LaunchCache().enabled and rules.dropout_p is None)
        self._allocator = None  # set by plan_for where v7 builds TMA descriptors (needs_descriptors)
        self._forward_launch = None
        self._gluon = None  # hopper/fa3.py's ForwardPlan
        self._gluon_backward = None  # hopper/fa3_backward_tma.py's BackwardPlan (b7's variants and b8)
        self._backward_launches: dict = {}  # (do's strides, do aligned) -> (preprocess, dK/dV, dQ) launches
        self.repeat_description = None  # the front door's description of a repeat call (call.describe)

    @property
    def needs_descriptors(self) -> bool:
        """Whether the forward is v7 (or another version) that may build TMA descriptors."""
        return not self.route.gluon and self._forward_version.needs_descriptors

    def forward(self, q, k, v, rules: Rules, block_mask: BlockMask | None, dropout: Dropout | None = None):
        """(o, lse) of this call; ``dropout`` (its probability and seed) where the rules have a dropout_p."""
        if self._allocator is not None:
            triton.set_allocator(self._allocator)
        if self._forward_launch is not None:
            o = torch.empty_like(q)
            lse = self._new_row_stats()
            self._forward_launch((q, k, v, o, lse))
            return o, lse
        if self.route.gluon:
            if self._gluon is None:
                from .hopper import fa3  # only on Hopper, with a tested Triton (choose_route said so)

                self._gluon = fa3.ForwardPlan(self.route.forward, q, k, causal=rules.causal is not None,
                                              scale=self.scale, in_graph=self.in_graph)
            return self._gluon(q, k, v)
        record = [] if self._repeat else None
        o, lse = run_forward(self._forward_version, q, k, v, rules=rules, scale=self.scale, block_mask=block_mask,
                             record=record, dropout=dropout)
        if record:
            self._forward_launch = record[0]
        return o, lse

    def backward(self, q, k, v, o, lse, do, rules: Rules, block_mask: BlockMask | None,
                 dropout: Dropout | None = None, *, dlse=None):
        """(dq, dk, dv) from the forward's (o, lse) (and its ``dropout``, the same seed); ``dlse``, the lse's
        gradient where a loss used it, or None."""
        if self._backward_version is None:
            if dlse is None:  # only on Hopper, with a tested Triton (choose_route said so)
                o, lse, do = o.contiguous(), lse.contiguous(), do.contiguous()
                if self._gluon_backward is None:
                    gluon = GLUON_BACKWARDS[q.shape[3]]
                    module = gluon_backward_module(gluon)
                    module.check_inputs(q, k, v, o, lse, do)  # once: a plan holds one layout
                    prepared = _triton_minor(triton.__version__) in module.PREPARED_TRITON
                    self._gluon_backward = module.backward_plan(q, k, causal=rules.causal is not None,
                                                                scale=self.scale, stage=gluon.stage,
                                                                prepare=self._repeat and prepared)
                return self._gluon_backward(q, k, v, o, lse, do)
            # The Gluon backwards have no lse gradient term: b1, which the route would have run without them, has
            return run_backward(BACKWARD_VERSIONS[DENSE_BACKWARD], q, k, v, o, lse, do, rules=rules,
                                scale=self.scale, dlse=dlse)
        if dlse is not None:  # its term sits between the prepared launches: launched in full
            return run_backward(self._backward_version, q, k, v, o, lse, do, rules=rules, scale=self.scale,
                                block_mask=block_mask, dlse=dlse, dropout=dropout)
        if self._repeat:
            launches = self._backward_launches.get((do.stride(), do.data_ptr() % 16 == 0))
            if launches is not None:
                dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
                delta = self._new_row_stats()
                tensors = (q, k, v, o, do, lse, delta, dk, dv, dq)
                for prepared in launches:
                    prepared(tensors)
                return dq, dk, dv
        record = [] if self._repeat else None
        grads = run_backward(self._backward_version, q, k, v, o, lse, do, rules=rules, scale=self.scale,
                             block_mask=block_mask, record=record, dropout=dropout)
        if record and len(record) == 3:
            self._backward_launches[do.stride(), do.data_ptr() % 16 == 0] = tuple(record)
        return grads


class PlanCache:
    """Plans by key; the oldest is dropped past ``capacity`` (a key holds one layout)."""

    def __init__(self, capacity: int = 256):
        self.capacity = capacity
        self.plans: dict = {}  # read directly on the hot path: a method call would cost more than the lookup

    def __len__(self) -> int:
        return len(self.plans)

    def clear(self) -> None:
        self.plans.clear()

    def put(self, key, plan: Plan) -> None:
        if len(self.plans) >= self.capacity:
            del self.plans[next(iter(self.plans))]
        self.plans[key] = plan


PLANS = PlanCache()


def plan_for(described, q, k, v, props: configs.DeviceProps, lacks: str | None, *, in_graph: bool = False) -> Plan:
    """The plan of a checked, described call (``call.Described``, from the front door): the one its description
    found in :data:`PLANS`, or, the first time, its route (:func:`choose_route`) and launches, kept under its
    description when it has one (its rules hold no tensor). ``props`` and ``lacks``: the device's properties and
    what of the call the numbered versions lack, which the front door asked (under ``torch.compile``, the op's
    body, which says ``in_graph``)."""
    if described.plan is not None:
        return described.plan
    call = described.call
    if call is not None:
        plan = PLANS.plans.get(call)
        if plan is not None:
            return plan
    route = choose_route(q, k, v, described.rules, props=props, lacks=lacks,
                         block_mask=described.block_mask, forward_version=described.forward_version,
                         backward_version=described.backward_version)
    scale = None if described.scale is None else float(described.scale)  # checked by the front door
    plan = Plan(route, q, k, v, described.rules, scale=scale, cacheable=call is not None, in_graph=in_graph)
    if call is not None:
        PLANS.put(call, plan)
    # Last, what other modules are asked: v7 builds TMA descriptors in a global scratch on Hopper, and Triton's
    # allocator (per thread) must then be set before each launch; and how lse and delta are allocated.
    if plan.needs_descriptors and descriptors_usable(props, q, k, v):
        plan._allocator = tma_scratch(q.device)
    plan._new_row_stats = row_stats_allocator(q.shape[:3], q.device, in_graph=in_graph)
    return plan


def without_tensors(rules: Rules) -> Rules:
    """The rules with their tensors taken out (the autograd Function saves those with ``save_for_backward``)."""
    if rules.alibi_slopes is None and rules.document_ids is None:
        return rules
    return replace(rules, alibi_slopes=None, document_ids=None)


def _one_token_view(tensors: tuple) -> tuple:
    """A decode call of one new token, q (B, H_q, D), as the call with q (B, H_q, 1, D), a view: one plan serves
    both (the kernels index row 0 of the new-token axis only)."""
    return (tensors[0].unsqueeze(2), *tensors[1:])


def decode_plan_for(keys: tuple, tensors: tuple, options: tuple, checked) -> torch.Tensor:
    """The first call of a checked decode call (``checked``: ``_checks.DecodeChecked``): its launch (the first
    candidate that fits, ``stepdown.launch_fitting``), splits and switches chosen, launched once, and its plan kept
    under each of ``keys`` (none on the interpreter; a one-token call's plan also under its 4-D view's key, so that
    either finds it). Returns o."""
    one_token = tensors[0].dim() == 3
    planned = _one_token_view(tensors) if one_token else tensors
    q, k_cache, v_cache = planned[:3]
    scale, num_splits, _, _, block_n, num_warps, num_stages, switches, causal = options
    head_dim, block_d, props = q.shape[3], checked.block_d, checked.props
    scale = default_scale(head_dim, checked.scale)
    fp8_cache = k_cache.dtype == decode.FP8
    switches = decode.resolve_switches(switches, decode.default_switches(
        props, block_d, q.element_size(), fp8_cache=fp8_cache, v_keys_adjacent=decode.is_keys_adjacent(v_cache)))
    candidates = configs.decode_candidates(props, block_d, q.element_size(), fp8_cache=fp8_cache)
    if block_n or num_warps or num_stages:  # an explicit launch (tuning): no other candidate
        first = candidates[0]
        candidates = (configs.KernelConfig(first.block_m, block_n or first.block_n, num_warps or first.num_warps,
                                           num_stages or first.num_stages),)
    key = keys[-1] if keys else None

    def make_and_run(cfg):  # kept once it ran: a launch that does not fit raises before
        plan = DecodePlan(cfg, planned, checked.n_max, scale, num_splits, checked.window_left, checked.softcap, props,
                          key, causal, switches, block_d, checked.dot_precision)
        o = plan.run(planned)
        for kept in keys:
            PLANS.put(kept, plan)
        return plan, o

    _, o = launch_fitting(("decode", props, block_d, q.dtype, k_cache.dtype, switches), candidates, make_and_run,
                          f"flash_decode at head dim {head_dim}")
    return o.squeeze(2) if one_token else o


class DecodePlan:
    """What a decode call's layouts and options decide, worked out once: the launch, the splits, the grids and
    every kernel argument that is not one of the call's tensors. ``run`` then allocates the outputs and
    launches: the split kernel alone when there is one split (it writes o), else the split kernel and the
    combine kernel."""

    __slots__ = ("key", "n_max", "paged", "empty", "num_splits", "part_shape", "split_grid", "split_args",
                 "combine_grid", "combine_args", "launches")

    def __init__(self, cfg: configs.KernelConfig, tensors: tuple, n_max: int, scale: float, num_splits,
                 window_left, softcap, props: configs.DeviceProps, key, causal: bool, switches: decode.DecodeSwitches,
                 block_d: int, dot_precision: str):
        q, k_cache, v_cache, cache_seqlens, block_table, k_scale, _, alibi_slopes, cache_leftpad = tensors
        batch, h_q, n_new, head_dim = q.shape
        h_kv = k_cache.shape[1]
        block_n = cfg.block_n
        self.key, self.n_max, self.paged = key, n_max, block_table is not None
        self.empty = batch * h_q * n_new == 0
        span = n_max  # keys the splits cover at most
        if window_left is not None:  # the windows' keys; paged tiles start on a BLOCK_N boundary, up to
            span = min(n_max, window_left + n_new - 1 + (block_n if self.paged else 1))  # block_n - 1 keys before
        if num_splits is None:  # about programs_per_sm programs an SM (decode_num_splits aims at one)
            num_splits = configs.decode_num_splits(replace(props, num_sms=props.num_sms * switches.programs_per_sm),
                                                   batch * h_kv, span, block_n)
        num_splits = max(1, min(int(num_splits), max(1, triton.cdiv(span, block_n))))
        split_len = triton.cdiv(triton.cdiv(max(span, 1), num_splits), block_n) * block_n
        self.num_splits = num_splits
        self.part_shape = (batch, h_q, n_new, num_splits, block_d)  # O_PART; LSE_PART is its first four dims
        o = torch.empty_like(q)  # as run() allocates it: its strides are q's layout's
        rows = h_q // h_kv * n_new  # a program's query rows: the group's heads times the new tokens, in tiles of
        block_rows = max(16, min(triton.next_power_of_2(rows), max(64, triton.next_power_of_2(h_q // h_kv))))
        self.split_grid = (num_splits, batch * h_kv, triton.cdiv(rows, block_rows))  # at most 64 (or one group)
        self.split_args = dict(
            qk_scale=scale * LOG2E,
            **strides(q, "q"), **strides(o, "o"), **strides(k_cache, "k"),
            **strides(v_cache, "v"),
            stride_bt_b=block_table.stride(0) if self.paged else 0,
            stride_bt_p=block_table.stride(1) if self.paged else 0,
            H_KV=h_kv, N_MAX=n_max, NUM_PAGES=k_cache.shape[0] if self.paged else 1, N_NEW=n_new,
            SPLIT_LEN=split_len, NUM_SPLITS=num_splits,
            WINDOW_LEFT=window_left or 0, softcap2=(softcap or 1.0) * LOG2E,
            GROUP=h_q // h_kv, BLOCK_G=block_rows, HEAD_DIM=head_dim,
            BLOCK_D=block_d, BLOCK_N=block_n, PAGED=self.paged, PAGE_SIZE=k_cache.shape[2] if self.paged else 1,
            HAS_SEQLENS=cache_seqlens is not None, HAS_WINDOW=window_left is not None,
            HAS_SOFTCAP=softcap is not None, HAS_ALIBI=alibi_slopes is not None,
            DOT_PRECISION=dot_precision, KV_FP8=k_scale is not None, DIRECT=num_splits == 1,
            MASK_TAIL_ONLY=switches.mask_tail_only, ROW_MASKS=n_new > 1, CAUSAL=causal and n_new > 1,
            HAS_LEFTPAD=cache_leftpad is not None, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        )
        self.combine_grid = (batch * h_q * n_new,)
        self.combine_args = dict(**strides(o, "o"), H_Q=h_q, N_NEW=n_new, NUM_SPLITS=num_splits,
                                 HEAD_DIM=head_dim, BLOCK_D=block_d,
                                 BLOCK_S=max(2, triton.next_power_of_2(num_splits)))
        self.launches = None  # after the first run on a GPU: the prepared split (and combine) launches

    def run(self, tensors: tuple) -> torch.Tensor:
        q, k_cache, v_cache, cache_seqlens, block_table, k_scale, v_scale, alibi_slopes, cache_leftpad = tensors
        o = torch.empty_like(q)
        if self.empty:
            return o
        direct = self.num_splits == 1
        o_part = lse_part = o  # one split writes o itself: the partials' pointers are never read
        if not direct:
            o_part = q.new_empty(self.part_shape, dtype=torch.float32)
            lse_part = q.new_empty(self.part_shape[:4], dtype=torch.float32)
        if k_scale is not None:  # indexed b * H_kv + h in the kernel
            k_scale, v_scale = k_scale.contiguous(), v_scale.contiguous()
        # In decode.NAMES' order; q stands in for an absent tensor (a pointer the kernel never reads).
        launch = (q, k_cache, v_cache, q if block_table is None else block_table,
                  q if cache_seqlens is None else cache_seqlens.contiguous(),  # the kernel reads SEQLENS + b
                  q if alibi_slopes is None else alibi_slopes.contiguous(),
                  q if k_scale is None else k_scale, q if v_scale is None else v_scale, o_part, lse_part, o,
                  q if cache_leftpad is None else cache_leftpad.contiguous())
        if self.launches is not None:  # a repeat call: no key to hash again, no argument to bind
            for prepared in self.launches:
                prepared(launch)
            return o
        combine = None if direct else (self.combine_grid, self.combine_args)
        prepared = decode.launch((self.split_grid, self.split_args), combine, launch, self.key)
        if None not in prepared:  # remembered (a GPU whose Triton shows the convention, the cache on)
            self.launches = prepared
        return o
