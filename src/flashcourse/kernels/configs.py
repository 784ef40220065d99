"""Block sizes, warps and pipeline stages for the kernels, chosen from what the device offers.

Every choice here is a pure function of a small :class:`DeviceProps`, so a test can check what a T4, an A100,
an RTX 4090 or an H100/H200 would get without owning one. The numbers for sm_90 were measured on an H200
(see ``docs/KERNELS.md``); for the other chips they follow the same rules, limited by shared memory:

- a tile of Q stays in shared memory for the whole loop, and each pipeline stage holds one tile of K and one
  of V (about ``elem * D * (BLOCK_M + 2 * stages * BLOCK_N)`` bytes), but the compiler adds scratch of its
  own, so each choice is checked by compiling it for every GPU of ``KNOWN_DEVICES``
  (``scripts/launch_fit.py``, run by the tests); a GPU outside that list that offers less steps down to the
  next launch of the list (``stepdown.py``);
- sm_75 (Turing) has no asynchronous copies, so extra stages buy nothing there, and no bfloat16 tensor cores;
- the interpreter (CPU) runs a block as one NumPy operation, so it gets small blocks that still exercise
  every branch of the kernels (BLOCK_M > BLOCK_N, a diagonal block, a tail block).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

__all__ = [
    "DeviceProps",
    "KNOWN_DEVICES",
    "KernelConfig",
    "backward_candidates",
    "backward_config",
    "baseline_forward_candidates",
    "baseline_forward_config",
    "decode_candidates",
    "decode_config",
    "decode_num_splits",
    "decode_programs_per_sm",
    "device_props",
    "forward_candidates",
    "forward_config",
    "forward_smem_bytes",
    "supports_bf16",
    "supports_tensor_descriptors",
]


@dataclass(frozen=True)
class DeviceProps:
    """What the configuration depends on: compute capability, shared memory a block may use, SM count."""

    name: str
    capability: tuple[int, int]
    shared_memory_per_block: int  # bytes, the opt-in maximum of one thread block
    num_sms: int
    interpreter: bool = False


@dataclass(frozen=True)
class KernelConfig:
    """Launch parameters of one kernel: tile sizes, warps per program, software-pipelining depth."""

    block_m: int  # query rows per tile
    block_n: int  # key/value rows per tile
    num_warps: int
    num_stages: int

    def __post_init__(self):
        # tl.arange needs powers of two and tl.dot tiles of at least 16; warps come in powers of two.
        for name in ("block_m", "block_n"):
            size = getattr(self, name)
            if size < 16 or size & (size - 1):
                raise ValueError(f"{name} = {size}: expected a power of two >= 16 (tl.arange and tl.dot need it)")
        if self.num_warps < 1 or self.num_warps & (self.num_warps - 1):
            raise ValueError(f"num_warps = {self.num_warps}: expected a power of two (1, 2, 4, 8, ...)")
        if self.num_stages < 1:
            raise ValueError(f"num_stages = {self.num_stages}: expected at least 1")


KB = 1024
# Shared memory one thread block may opt in to (CUDA C++ Programming Guide, "Compute Capabilities" table).
KNOWN_DEVICES: dict[str, DeviceProps] = {
    "T4": DeviceProps("Tesla T4", (7, 5), 64 * KB, 40),
    "A100": DeviceProps("NVIDIA A100-SXM4-80GB", (8, 0), 163 * KB, 108),
    "A10": DeviceProps("NVIDIA A10", (8, 6), 99 * KB, 72),
    "RTX 3090": DeviceProps("NVIDIA GeForce RTX 3090", (8, 6), 99 * KB, 82),
    "L4": DeviceProps("NVIDIA L4", (8, 9), 99 * KB, 58),
    "RTX 4090": DeviceProps("NVIDIA GeForce RTX 4090", (8, 9), 99 * KB, 128),
    "H100": DeviceProps("NVIDIA H100 80GB HBM3", (9, 0), 227 * KB, 132),
    "H200": DeviceProps("NVIDIA H200", (9, 0), 227 * KB, 132),
}
INTERPRETER = DeviceProps("Triton interpreter (CPU)", (0, 0), 1 << 30, 1, interpreter=True)


def device_props(device) -> DeviceProps:
    """The :class:`DeviceProps` of a torch device (the interpreter's when it is not a CUDA device)."""
    import torch

    device = torch.device(device)
    if device.type != "cuda":
        return INTERPRETER
    return _cuda_props(device.index if device.index is not None else torch.cuda.current_device())


@functools.cache
def _cuda_props(index: int) -> DeviceProps:  # cached: it is asked on every launch
    import torch

    p = torch.cuda.get_device_properties(index)
    # Older torch has no opt-in field; the architecture's documented maximum then stands in.
    smem = getattr(p, "shared_memory_per_block_optin", 0) or _smem_by_capability(p.major, p.minor)
    return DeviceProps(p.name, (p.major, p.minor), int(smem), int(p.multi_processor_count))


def _smem_by_capability(major: int, minor: int) -> int:
    table = {(7, 0): 96, (7, 5): 64, (8, 0): 163, (8, 6): 99, (8, 7): 163, (8, 9): 99, (9, 0): 227}
    return table.get((major, minor), 48) * KB


def supports_bf16(props: DeviceProps) -> bool:
    """bfloat16 tensor-core products exist from sm_80 (Ampere) on; the interpreter's bf16 dot is wrong."""
    return props.capability >= (8, 0)


def supports_tensor_descriptors(props: DeviceProps) -> bool:
    """Tensor descriptors lower to the Tensor Memory Accelerator (TMA), which Hopper (sm_90) introduced."""
    return props.capability >= (9, 0)


def forward_smem_bytes(cfg: KernelConfig, block_d: int, elem_bytes: int) -> int:
    """The bytes of the forward's tiles alone: the Q tile plus one K and one V tile per pipeline stage. A lesson's
    estimate: the compiler also places layout conversions and the softmax's scratch in shared memory, so the
    launches are chosen from what it allocates (``scripts/launch_fit.py``), never from this."""
    return elem_bytes * block_d * (cfg.block_m + 2 * cfg.num_stages * cfg.block_n)


def _then_smaller(*preferred: KernelConfig) -> tuple[KernelConfig, ...]:
    """The preferred launches, then smaller ones to step down to on a GPU that offers less (stepdown.py)."""
    fallbacks = (KernelConfig(64, 32, 4, 1), KernelConfig(32, 32, 4, 1), KernelConfig(32, 16, 4, 1),
                 KernelConfig(16, 16, 4, 1))
    last = preferred[-1]
    smaller = [c for c in fallbacks if _tile_area(c) < _tile_area(last)]
    return tuple(dict.fromkeys(preferred + (*smaller, fallbacks[-1])))


def _tile_area(cfg: KernelConfig) -> int:
    return cfg.block_m * cfg.block_n * cfg.num_stages


def _row_bytes(block_d: int, elem_bytes: int) -> int:
    """Bytes of one row of a Q, K or V tile: what sets every tile's size (D = 128 in fp16 = D = 64 in fp32)."""
    return block_d * elem_bytes


# The first launch of each list below is the one chosen; scripts/launch_fit.py compiles every chosen launch for
# each GPU of KNOWN_DEVICES (the tests run it) and checks that what the compiler allocates fits.
@functools.cache  # asked on every launch; a pure function of hashable arguments
def baseline_forward_candidates(props: DeviceProps, block_d: int, elem_bytes: int) -> tuple[KernelConfig, ...]:
    """The textbook launch that versions v1-v3 use: 64x64 tiles, 4 warps, 2 stages where they fit."""
    if props.interpreter:
        return (KernelConfig(32, 16, 4, 1),)
    row = _row_bytes(block_d, elem_bytes)
    if props.capability < (8, 0):  # Turing: no cp.async, so a second stage only costs shared memory
        return _then_smaller(KernelConfig(64, 64, 4, 1) if row <= 256 else KernelConfig(32, 32, 4, 1))
    if row <= 256 or (row <= 512 and props.shared_memory_per_block >= 160 * KB):
        return _then_smaller(KernelConfig(64, 64, 4, 2))
    return _then_smaller(KernelConfig(64, 32, 4, 2) if row <= 512 else KernelConfig(32, 32, 4, 1))


def baseline_forward_config(props: DeviceProps, block_d: int, elem_bytes: int) -> KernelConfig:
    return baseline_forward_candidates(props, block_d, elem_bytes)[0]


@functools.cache  # asked on every launch; a pure function of hashable arguments
def forward_candidates(props: DeviceProps, block_d: int, elem_bytes: int, *, causal: bool = False
                       ) -> tuple[KernelConfig, ...]:
    """The tuned forward launches for a device, padded head dim ``block_d`` and element size, best first.
    ``causal``: the launch for rows with many partly masked tiles (the caller decides which rules those are).

    BLOCK_M is always a multiple of BLOCK_N: the causal kernel splits its keys at a BLOCK_M boundary.
    """
    if props.interpreter:
        return (KernelConfig(32, 16, 4, 1),)
    row = _row_bytes(block_d, elem_bytes)
    if props.capability >= (9, 0):
        # Swept on the H200 at N=8192 (benchmarks/results/*-tune.json): 8 warps over 128-row tiles win, except
        # causal D=128, where 64x64 tiles waste less work on the diagonal.
        if row <= 128:
            return _then_smaller(KernelConfig(128, 64, 8, 3))
        if row <= 256:
            return _then_smaller(KernelConfig(64, 64, 4, 3) if causal else KernelConfig(128, 128, 8, 3),
                                 KernelConfig(128, 64, 8, 3), KernelConfig(64, 64, 4, 3))
        if row <= 512:  # D=256 in 16 bits: the Q tile alone is 32-64 KB; a 128-row fp32 accumulator needs 8 warps
            return _then_smaller(KernelConfig(64, 64, 4, 2) if causal else KernelConfig(128, 64, 8, 2),
                                 KernelConfig(64, 64, 4, 2))
        return _then_smaller(KernelConfig(64, 32, 4, 2))
    if props.capability >= (8, 0):
        big_smem = props.shared_memory_per_block >= 128 * KB  # A100 (163 KB) against sm_86/sm_89 (99 KB)
        if row <= 128:
            return _then_smaller(KernelConfig(128, 64, 4, 3 if big_smem else 2))
        if row <= 256:
            return _then_smaller(KernelConfig(128, 64, 8, 3 if big_smem else 2), KernelConfig(128, 32, 4, 2))
        if row <= 512:
            return _then_smaller(KernelConfig(64, 64, 4, 2) if big_smem else KernelConfig(64, 32, 4, 2))
        return _then_smaller(KernelConfig(32, 32, 4, 1))
    # Turing: one stage (no cp.async), and 64 KB for the tiles and the compiler's scratch together
    if row <= 256:
        return _then_smaller(KernelConfig(64, 64, 4, 1))
    if row <= 512:
        return _then_smaller(KernelConfig(32, 32, 4, 1))
    return _then_smaller(KernelConfig(16, 16, 4, 1))


def forward_config(props: DeviceProps, block_d: int, elem_bytes: int, *, causal: bool = False) -> KernelConfig:
    """The chosen tuned forward launch: the first of :func:`forward_candidates`."""
    return forward_candidates(props, block_d, elem_bytes, causal=causal)[0]


@functools.cache  # asked on every launch; a pure function of hashable arguments
def backward_candidates(props: DeviceProps, block_d: int, elem_bytes: int, *, causal: bool = False,
                        grouped: bool = False) -> tuple[tuple[KernelConfig, ...], tuple[KernelConfig, ...]]:
    """Launches of the two backward kernels, best first: (dK/dV candidates, dQ candidates).

    dK/dV keeps a K and V tile of BLOCK_N rows resident and streams Q and dO in BLOCK_M-row tiles, so its
    BLOCK_N is the large one; dQ is the mirror image. Both need BLOCK_N % BLOCK_M == 0 resp. the reverse.
    ``grouped``: grouped-query attention, where b3's dK/dV program sums over every query head of its group.
    """
    if props.interpreter:
        return (KernelConfig(16, 32, 4, 1),), (KernelConfig(32, 16, 4, 1),)
    row = _row_bytes(block_d, elem_bytes)
    small_dkdv = (KernelConfig(16, 32, 4, 1), KernelConfig(16, 16, 4, 1))
    small_dq = (KernelConfig(32, 16, 4, 1), KernelConfig(16, 16, 4, 1))
    if props.capability >= (9, 0):  # swept on the H200 at N=8192 (benchmarks/results/*-tune.json)
        if row <= 128:
            dkdv = KernelConfig(32, 64, 4, 3) if causal else KernelConfig(32, 128, 4, 2)
            dq = KernelConfig(128, 64, 8, 2)
        elif row <= 256:  # each kernel's launch swept alone at N = 8192 (*-backward-launches.json, 2026-12-02):
            # dQ at 128 x 32 over 4 warps spilled (Nsight Compute: 587 MB of local loads in b1's, 16 GB in b3's)
            dkdv, dq = KernelConfig(64, 64, 4, 2), KernelConfig(128, 64, 8, 3)
            if grouped:  # a program streams Q and dO of four query heads past its keys (GQA 32/8): at 128 keys over
                # 8 warps, b3 took 14.6 ms against 15.7 (causal, N = 8192; *-backward-launches-rules.json)
                dkdv = KernelConfig(64, 128, 8, 2)
        elif row <= 512 and block_d >= 256:  # fp16/bf16: each launch swept alone at N = 8192, causal and not
            # (*-backward-launches-d256.json, 2026-12-02): with dQ at 128 x 32 over 8 warps, one stage, b1 took
            # 60.5 / 27.6 ms against 76.2 / 36.8 with 64 x 32 / 8 / 2; with dK/dV at 32 x 32 / 4 / 2, 71.9 / 35.7
            dkdv, dq = KernelConfig(32, 32, 4, 2), KernelConfig(128, 32, 8, 1)
        elif row <= 512:  # float32 at D=128: dK and dV (or dQ) accumulators over 8 warps, two stages
            dkdv, dq = KernelConfig(32, 64, 8, 2), KernelConfig(64, 32, 8, 2)
        else:
            dkdv, dq = KernelConfig(16, 64, 8, 1), KernelConfig(32, 32, 4, 1)
    elif props.capability >= (8, 0):
        big_smem = props.shared_memory_per_block >= 128 * KB
        if row <= 128:
            dkdv, dq = KernelConfig(32, 128, 4, 2), KernelConfig(128, 32, 4, 2)
        elif row <= 256:  # sm_86 (99 KB) too: 84,224 and 81,920 B compiled at D=128 in fp16, 98,560 in fp32 D=64
            dkdv, dq = KernelConfig(32, 128, 4, 2), KernelConfig(128, 32, 4, 2)
        elif row <= 512:
            dkdv = KernelConfig(32, 64, 8, 2) if big_smem else KernelConfig(16, 64, 8, 1)
            dq = KernelConfig(64, 32, 8, 2) if big_smem else KernelConfig(32, 32, 4, 1)
        else:  # float32 at D=256: 16x64 over 8 warps compiles to 167,936 B, 1 KB past the A100's 163 KB
            dkdv, dq = small_dkdv[0], KernelConfig(32, 16, 4, 1)
    else:  # Turing, 64 KB: resident tiles, streamed tiles and the compiler's scratch share it (at D=256 the
        # scratch alone passes 64 KB with 16x32 tiles: 81,920 B compiled)
        if row <= 128:
            dkdv, dq = KernelConfig(32, 64, 4, 1), KernelConfig(64, 32, 4, 1)
        elif row <= 256:
            dkdv, dq = small_dkdv[0], small_dq[0]
        elif row <= 512:
            dkdv = dq = KernelConfig(16, 16, 4, 1)
        else:  # float32 at D=256: 66,560 B over 4 warps, one block's worth of scratch too many
            dkdv, dq = KernelConfig(16, 16, 2, 1), KernelConfig(16, 16, 4, 1)
    return tuple(dict.fromkeys((dkdv, *small_dkdv))), tuple(dict.fromkeys((dq, *small_dq)))


def backward_config(props: DeviceProps, block_d: int, elem_bytes: int, *, causal: bool = False
                    ) -> tuple[KernelConfig, KernelConfig]:
    """The chosen backward launches: (dK/dV kernel, dQ kernel), the first of :func:`backward_candidates`."""
    dkdv, dq = backward_candidates(props, block_d, elem_bytes, causal=causal)
    return dkdv[0], dq[0]


@functools.cache  # asked on every launch; a pure function of hashable arguments
def decode_candidates(props: DeviceProps, block_d: int, elem_bytes: int, *, fp8_cache: bool = False
                      ) -> tuple[KernelConfig, ...]:
    """Decode launches, best first: block_m is the padded number of query heads per KV head (set by the
    caller), block_n the keys per loop step. Decode streams K and V once, so deep pipelines pay.

    ``elem_bytes`` is q's: the K/V tiles are widened to it in registers. ``fp8_cache``: the tiles are staged in
    shared memory at one byte per element. On sm_90 up to 256-byte rows (D = 128 in 16 bits) the FP8 cache takes
    the float16 cache's launch (73,728 B of shared memory, two fit an SM), with two programs per SM
    (:func:`decode_programs_per_sm`): chosen on the H200 from the FP8 cache's candidates
    (``2026-12-02-nvidia-h200-decode-fp8-candidates.json``, key ``speedup_vs_fp16_cache``: 1.26-1.49x the float16
    cache at 32K and 128K keys, contiguous and in pages of 16 and 256, against 1.07-1.28x for the 256-key, 8-warp
    launch that one SM held alone, and 1.07-1.16x for this launch one to an SM). Elsewhere the FP8 cache keeps the
    float16 launch's bytes in flight with ``2 * stages - 1`` stages (unmeasured); not for widened rows past 512
    bytes (float32 q at D = 256), whose conversion scratch the compiler also puts in shared memory: 114,688 B at
    3 stages on sm_89, past the L4's 99 KB."""
    if props.interpreter:
        return (KernelConfig(16, 16, 4, 1),)
    row = _row_bytes(block_d, elem_bytes)
    smaller = (KernelConfig(16, 64, 4, 1), KernelConfig(16, 32, 4, 1), KernelConfig(16, 16, 4, 1))
    if props.capability >= (9, 0):  # swept on the H200: 128-key tiles, 3 stages in flight
        first = KernelConfig(16, 128 if row <= 256 else 64 if row <= 512 else 32, 4, 3)
    elif props.capability >= (8, 0):  # float32 at D=256 over 4 stages: 215,104 B compiled
        stages = 4 if props.shared_memory_per_block >= 128 * KB and row <= 512 else 2
        first = KernelConfig(16, 64 if row <= 256 else 32, 4, stages)
    else:
        first = KernelConfig(16, 64 if row <= 256 else 32 if row <= 512 else 16, 4, 1)
    if fp8_cache and row <= 512 and not _fp8_cache_shares_sms(props, row):
        first = replace(first, num_stages=2 * first.num_stages - 1)
    return tuple(dict.fromkeys((first, *smaller)))


def _fp8_cache_shares_sms(props: DeviceProps, row: int) -> bool:
    """Where the FP8 cache's decode runs the float16 launch, two programs to an SM (measured on the H200)."""
    return props.capability >= (9, 0) and row <= 256


def decode_programs_per_sm(props: DeviceProps, block_d: int, elem_bytes: int, *, fp8_cache: bool = False) -> int:
    """How many programs per SM the default number of decode splits aims at. Two for the FP8 cache on sm_90 up to
    256-byte rows. Nsight Compute on the H200 (``2026-12-02-nvidia-h200-ncu-limits.json``, case ``decode-fp8``, the
    launch then shipped) found one FP8 program per SM issuing 2.1 times the float16 program's instructions (its
    one-byte reads of V and the widening) with DRAM 47% busy, against the float16 cache's 79%: alone on its SM,
    the program could not keep enough loads in flight. A second program's loads fill the gaps:
    1.26-1.49x the float16 cache, against 1.07-1.16x for the same launch one to an SM (:func:`decode_candidates`).
    One elsewhere: the float16 cache's program streams near the read bandwidth alone, and on other GPUs the FP8
    cache is unmeasured."""
    return 2 if fp8_cache and _fp8_cache_shares_sms(props, _row_bytes(block_d, elem_bytes)) else 1


def decode_config(props: DeviceProps, block_d: int, elem_bytes: int, *, fp8_cache: bool = False) -> KernelConfig:
    return decode_candidates(props, block_d, elem_bytes, fp8_cache=fp8_cache)[0]


def decode_num_splits(props: DeviceProps, batch_kv_heads: int, max_len: int, block_n: int) -> int:
    """How many splits of the KV length: about one program per SM (measured on the H200: 16 splits of 8 KV
    heads beat 33 and more), but each split at least a few key blocks long, so its fixed cost (loading q,
    writing a partial) stays small."""
    if max_len <= 0:
        return 1
    wanted = max(1, props.num_sms // max(batch_kv_heads, 1))
    most = max(1, -(-max_len // (4 * block_n)))
    return int(min(wanted, most))
