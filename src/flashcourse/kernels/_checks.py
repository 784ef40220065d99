"""Input checks shared by the kernels: errors say what was expected, what came and what to do."""

from __future__ import annotations

import torch

from . import configs

SUPPORTED_HEAD_DIMS = (16, 32, 64, 80, 96, 128, 256)
_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def padded_head_dim(head_dim: int) -> int:
    """The power of two a head dim is padded to inside the kernels (tl.arange needs one): 80 and 96 -> 128."""
    return max(16, 1 << (head_dim - 1).bit_length())


def dot_precision(dtype: torch.dtype) -> str:
    """float32 inputs get IEEE products (tf32 would miss float32 tolerances); 16-bit types ignore this."""
    return "ieee" if dtype == torch.float32 else "tf32"


def check_device(t: torch.Tensor, name: str) -> None:
    """On a machine with a GPU the kernels need CUDA tensors; without one, CPU tensors (the interpreter)."""
    from flashcourse.device import setup

    where = setup()
    if where == "cuda" and t.device.type != "cuda":
        raise ValueError(
            f"{name} is on {t.device}, but the kernels run on the GPU here: move the inputs with "
            f"{name}.cuda() (or set TRITON_INTERPRET=1 before importing flashcourse to use the CPU interpreter)"
        )
    if where == "cpu" and t.device.type != "cpu":
        raise ValueError(f"{name} is on {t.device}, but the Triton interpreter runs on CPU tensors: use {name}.cpu()")


def check_dtype(t: torch.Tensor, name: str) -> None:
    if t.dtype not in _DTYPES:
        raise TypeError(f"{name} has dtype {t.dtype}, expected float16, bfloat16 or float32")
    if t.dtype == torch.bfloat16:
        props = configs.device_props(t.device)
        if props.interpreter:
            raise TypeError(f"{name} is bfloat16, which the CPU interpreter cannot run (its bf16 dot is wrong): "
                            "use float16 instead")
        if not configs.supports_bf16(props):
            major, minor = props.capability
            raise TypeError(f"{name} is bfloat16, but the {props.name} (compute capability {major}.{minor}) has no "
                            "bfloat16 tensor cores (they start at 8.0, Ampere): use float16 instead, e.g. "
                            f"{name}.half()")


FP8_CACHE_CAPABILITY = (8, 9)  # Triton's float8_e4m3fn ("fp8e4nv") type: cvt.rn.f16x2.e4m3x2 starts at sm_89


def check_fp8_cache_device(t: torch.Tensor, name: str) -> None:
    """A float8_e4m3fn KV cache is widened in registers by a conversion Triton compiles only for compute
    capability 8.9 (Ada) or newer; the CPU interpreter converts it too. Older GPUs get an error naming that."""
    props = configs.device_props(t.device)
    if props.interpreter or props.capability >= FP8_CACHE_CAPABILITY:
        return
    major, minor = props.capability
    need = f"{FP8_CACHE_CAPABILITY[0]}.{FP8_CACHE_CAPABILITY[1]}"
    raise RuntimeError(f"{name} is float8_e4m3fn, but the {props.name} (compute capability {major}.{minor}) cannot "
                       f"convert it: Triton compiles float8_e4m3fn only for compute capability {need} or newer (Ada: "
                       "L4, RTX 4090; Hopper: H100, H200). Keep the cache in float16 here (or dequantise it first: "
                       "k_cache.float() * k_scale[:, :, None, None], then .half())")


def check_head_dim(head_dim: int) -> None:
    if head_dim not in SUPPORTED_HEAD_DIMS:
        raise ValueError(
            f"head dim {head_dim} is not supported: expected one of {SUPPORTED_HEAD_DIMS} "
            "(80 and 96 are padded to 128 inside; 256 is Gemma's)"
        )


def check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """q (B, H_q, N_q, D), k and v (B, H_kv, N_kv, D) with H_q a multiple of H_kv, one dtype, one device."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} is a {type(t).__name__}, expected a torch.Tensor of shape (B, H, N, D)")
        if t.dim() != 4:
            raise ValueError(f"{name} has shape {tuple(t.shape)}, expected 4 dims (B, H, N, D)")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v have dtypes {q.dtype}, {k.dtype}, {v.dtype}: they must be one dtype")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v are on {q.device}, {k.device}, {v.device}: they must be on one device")
    if k.shape != v.shape:
        raise ValueError(f"k has shape {tuple(k.shape)} but v has shape {tuple(v.shape)}: they must match")
    if q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3]:
        raise ValueError(
            f"q has shape {tuple(q.shape)} but k has shape {tuple(k.shape)}: batch and head dim "
            "(dims 0 and 3) must match"
        )
    if k.shape[1] == 0 or q.shape[1] % k.shape[1]:
        raise ValueError(
            f"q has {q.shape[1]} heads and k has {k.shape[1]}: H_q must be a multiple of H_kv (grouped-query "
            "attention: query head h uses KV head h // (H_q // H_kv))"
        )
    check_head_dim(q.shape[3])
    check_device(q, "q")
    check_dtype(q, "q")


def check_saved(q: torch.Tensor, o: torch.Tensor, lse: torch.Tensor, do: torch.Tensor) -> None:
    """What the backward takes besides q, k, v: o and do shaped like q, lse (B, H, N_q) float32."""
    for name, t in (("o", o), ("do", do)):
        if not isinstance(t, torch.Tensor) or t.shape != q.shape or t.dtype != q.dtype or t.device != q.device:
            got = f"{tuple(t.shape)} {t.dtype} on {t.device}" if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"{name} is {got}: expected q's shape {tuple(q.shape)}, dtype {q.dtype}, "
                             f"device {q.device}")
    want = tuple(q.shape[:3])
    if not isinstance(lse, torch.Tensor) or tuple(lse.shape) != want or lse.dtype != torch.float32:
        got = f"{tuple(lse.shape)} {lse.dtype}" if isinstance(lse, torch.Tensor) else type(lse).__name__
        raise ValueError(f"lse is {got}: expected {want} float32, as flash_attention_forward returns it")
    if not lse.is_contiguous():  # the kernels index lse as a dense (B * H, N_q) array
        raise ValueError("lse is not contiguous: pass lse.contiguous() (the kernels read it as one dense array)")
