"""Block sizes, warps and pipeline stages for the kernels, chosen from what the device offers.

Every choice here is a pure function of a small :class:`DeviceProps`, so a test can check what a T4, an A100,
an RTX 4090 or an H100/H200 would get without owning one. The numbers for sm_90 were measured on an H200
(see ``docs/KERNELS.md``); for the other chips they follow the same rules, limited by shared memory:

- a tile of Q stays in shared memory for the whole loop, and each pipeline stage holds one tile of K and one
  of V, so the forward needs about ``elem * D * (BLOCK_M + 2 * stages * BLOCK_N)`` bytes;
- sm_75 (Turing) has no asynchronous copies, so extra stages buy nothing there, and no bfloat16 tensor cores;
- the interpreter (CPU) runs a block as one NumPy operation, so it gets small blocks that still exercise
  every branch of the kernels (BLOCK_M > BLOCK_N, a diagonal block, a tail block).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

__all__ = [
    "DeviceProps",
    "KNOWN_DEVICES",
    "KernelConfig",
    "backward_config",
    "baseline_forward_config",
    "decode_config",
    "decode_num_splits",
    "device_props",
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
    """Tensor descriptors lower to the TMA copy engine, which Hopper (sm_90) introduced."""
    return props.capability >= (9, 0)


def forward_smem_bytes(cfg: KernelConfig, block_d: int, elem_bytes: int) -> int:
    """Shared memory of the forward: the Q tile plus one K and one V tile per pipeline stage."""
    return elem_bytes * block_d * (cfg.block_m + 2 * cfg.num_stages * cfg.block_n)


def _first_fitting(candidates, props: DeviceProps, block_d: int, elem_bytes: int) -> KernelConfig:
    for cfg in candidates:
        if forward_smem_bytes(cfg, block_d, elem_bytes) <= props.shared_memory_per_block:
            return cfg
    return KernelConfig(16, 16, 4, 1)  # tiny tiles always fit; slow, but it runs


@functools.cache  # asked on every launch; a pure function of hashable arguments
def baseline_forward_config(props: DeviceProps, block_d: int, elem_bytes: int) -> KernelConfig:
    """The textbook launch that versions v1-v3 use: 64x64 tiles, 4 warps, 2 stages, whatever the device."""
    if props.interpreter:
        return KernelConfig(32, 16, 4, 1)
    return _first_fitting([KernelConfig(64, 64, 4, 2), KernelConfig(64, 32, 4, 2), KernelConfig(32, 32, 4, 1)],
                          props, block_d, elem_bytes)


@functools.cache  # asked on every launch; a pure function of hashable arguments
def forward_config(props: DeviceProps, block_d: int, elem_bytes: int, *, causal: bool = False) -> KernelConfig:
    """The tuned forward launch for a device, padded head dim ``block_d`` and element size in bytes.
    ``causal``: the launch for rows with many partly masked tiles (the caller decides which rules those are).

    BLOCK_M is always a multiple of BLOCK_N: the causal kernel splits its keys at a BLOCK_M boundary.
    """
    if props.interpreter:
        return KernelConfig(32, 16, 4, 1)
    big_d = block_d > 64
    if block_d > 128:  # D=256 (Gemma): a 64-row fp32 accumulator already takes 128 registers a thread
        return _first_fitting(_head_dim_256_forward(props, causal), props, block_d, elem_bytes)
    if props.capability >= (9, 0):
        # Swept on the H200 at N=8192 (benchmarks/results/*-tune.json): 8 warps over 128-row tiles win, except
        # causal D=128, where 64x64 tiles waste less work on the diagonal (495 vs 464 TFLOP/s).
        if big_d and causal:
            candidates = [KernelConfig(64, 64, 4, 3)]
        elif big_d:
            candidates = [KernelConfig(128, 128, 8, 3), KernelConfig(128, 64, 8, 3)]
        else:
            candidates = [KernelConfig(128, 64, 8, 3)]
    elif props.capability >= (8, 0):
        stages = 3 if props.shared_memory_per_block >= 128 * KB else 2
        candidates = [KernelConfig(128, 64, 8 if big_d else 4, stages), KernelConfig(128, 32, 4, 2),
                      KernelConfig(64, 32, 4, 2)]
    else:
        # Turing: no cp.async, so one stage; 64 KB holds a 64x64 tile set only up to D=64.
        candidates = [KernelConfig(64, 64, 4, 1), KernelConfig(64, 32, 4, 1), KernelConfig(32, 32, 4, 1)]
    return _first_fitting(candidates, props, block_d, elem_bytes)


def _head_dim_256_forward(props: DeviceProps, causal: bool) -> list[KernelConfig]:
    """Forward candidates at D=256, not measured yet (no GPU sweep): the Q tile alone is 32-64 KB, so two
    stages of 64-key K/V tiles are the most a Hopper (227 KB) or an A100 (163 KB) holds."""
    small = [KernelConfig(64, 64, 4, 2), KernelConfig(64, 32, 4, 2), KernelConfig(32, 32, 4, 1)]
    if props.capability >= (9, 0) and not causal:
        return [KernelConfig(128, 64, 8, 2), *small]  # 8 warps over 128 rows: 128 accumulator registers each
    return small


@functools.cache  # asked on every launch; a pure function of hashable arguments
def backward_config(props: DeviceProps, block_d: int, elem_bytes: int, *, causal: bool = False
                    ) -> tuple[KernelConfig, KernelConfig]:
    """Launches of the two backward kernels: (dK/dV kernel, dQ kernel).

    dK/dV keeps a K and V tile of BLOCK_N rows resident and streams Q and dO in BLOCK_M-row tiles, so its
    BLOCK_N is the large one; dQ is the mirror image. Both need BLOCK_N % BLOCK_M == 0 resp. the reverse.
    """
    if props.interpreter:
        return KernelConfig(16, 32, 4, 1), KernelConfig(32, 16, 4, 1)
    # Resident tiles (2 of block_n rows) plus streamed q/dO tiles per stage, as for the forward.
    def fits(cfg: KernelConfig, resident: int, streamed: int) -> bool:
        return elem_bytes * block_d * (2 * resident + 2 * cfg.num_stages * streamed) <= props.shared_memory_per_block

    if block_d > 128:  # D=256, not measured yet: dK and dV (or dQ) accumulators over 8 warps, two stages
        dkdv = [KernelConfig(32, 64, 8, 2), KernelConfig(16, 64, 8, 1), KernelConfig(16, 32, 4, 1)]
        dq = [KernelConfig(64, 32, 8, 2), KernelConfig(32, 32, 4, 1), KernelConfig(32, 16, 4, 1)]
    elif props.capability >= (9, 0):  # swept on the H200 at N=8192 (benchmarks/results/*-tune.json)
        if block_d > 64:
            dkdv, dq = [KernelConfig(64, 128, 8, 2)], [KernelConfig(128, 32, 4, 3)]
        else:
            dkdv = [KernelConfig(32, 64, 4, 3) if causal else KernelConfig(32, 128, 4, 2)]
            dq = [KernelConfig(128, 64, 8, 2)]
    elif props.capability >= (8, 0):
        dkdv = [KernelConfig(32, 128, 4, 2), KernelConfig(32, 64, 4, 2), KernelConfig(16, 64, 4, 2)]
        dq = [KernelConfig(128, 32, 4, 2), KernelConfig(64, 32, 4, 2), KernelConfig(64, 16, 4, 2)]
    else:
        dkdv = [KernelConfig(32, 64, 4, 1), KernelConfig(16, 32, 4, 1)]
        dq = [KernelConfig(64, 32, 4, 1), KernelConfig(32, 16, 4, 1)]
    chosen_dkdv = next((c for c in dkdv if fits(c, c.block_n, c.block_m)), KernelConfig(16, 16, 4, 1))
    chosen_dq = next((c for c in dq if fits(c, c.block_m, c.block_n)), KernelConfig(16, 16, 4, 1))
    return chosen_dkdv, chosen_dq


@functools.cache  # asked on every launch; a pure function of hashable arguments
def decode_config(props: DeviceProps, block_d: int, elem_bytes: int) -> KernelConfig:
    """Decode launch: block_m is the padded number of query heads per KV head (set by the caller),
    block_n the keys per loop step. Decode streams K and V once, so deep pipelines pay."""
    if props.interpreter:
        return KernelConfig(16, 16, 4, 1)
    if props.capability >= (9, 0):  # swept on the H200: 128-key tiles, 3 stages in flight (192 KB)
        return KernelConfig(16, 128, 4, 3)
    stages = 1 if props.capability < (8, 0) else (4 if props.shared_memory_per_block >= 128 * KB else 2)
    block_n = 64 if elem_bytes * block_d * 2 * 64 * stages <= props.shared_memory_per_block else 32
    return KernelConfig(16, block_n, 4, stages)


def decode_num_splits(props: DeviceProps, batch_kv_heads: int, max_len: int, block_n: int) -> int:
    """How many splits of the KV length: about one program per SM (measured on the H200: 16 splits of 8 KV
    heads beat 33 and more), but each split at least a few key blocks long, so its fixed cost (loading q,
    writing a partial) stays small."""
    if max_len <= 0:
        return 1
    wanted = max(1, props.num_sms // max(batch_kv_heads, 1))
    most = max(1, -(-max_len // (4 * block_n)))
    return int(min(wanted, most))
