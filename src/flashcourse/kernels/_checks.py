"""Input checks shared by the kernels: errors say what was expected, what came and what to do."""

from __future__ import annotations

import operator
from typing import NamedTuple

import torch

from ..validation import check_window, foreign_number_hint, shown_number
from . import configs
from .decode import DecodeSwitches
from .rules import check_alibi_slopes, check_softcap

# Any head dim in 8 .. 256 (flash-attn's range). The kernels tile the head dim at the next power of two >= 16
# (padded_head_dim: 40 and 59 -> 64, 72, 80, 96 and 111 -> 128, 160 to 256 -> 256) and mask the columns past it
# on every load and store (load_tile's HEAD_DIM): no copy, no new launch shape (the tiles, and with them shared
# memory and registers, are those of the power of two), and the scale comes from the true D. What it costs: the
# padded columns' share of the tile's FLOPs (59 -> 64: 8%; 160 -> 256: 60%).
MIN_HEAD_DIM, MAX_HEAD_DIM = 8, 256
SUPPORTED_HEAD_DIMS = (16, 32, 64, 80, 96, 128, 256)  # the head dims measured and compiled for every GPU
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


def check_dtype(t: torch.Tensor, name: str) -> configs.DeviceProps:
    """float16, bfloat16 where the device has bfloat16 tensor cores, or float32; returns the device's properties."""
    if t.dtype not in _DTYPES:
        raise TypeError(f"{name} has dtype {t.dtype}, expected float16, bfloat16 or float32")
    props = configs.device_props(t.device)
    if t.dtype == torch.bfloat16:
        if props.interpreter:
            raise TypeError(f"{name} is bfloat16, which the CPU interpreter cannot run (its bf16 dot is wrong): "
                            "use float16 instead")
        if not configs.supports_bf16(props):
            major, minor = props.capability
            raise TypeError(f"{name} is bfloat16, but the {props.name} (compute capability {major}.{minor}) has no "
                            "bfloat16 tensor cores (they start at 8.0, Ampere): use float16 instead, e.g. "
                            f"{name}.half()")
    return props


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
    """Any head dim from 8 to 256, flash-attn's range (a ValueError outside it, where flash-attn raises a
    RuntimeError: the course keeps ValueError for every bound on an argument)."""
    if not MIN_HEAD_DIM <= head_dim <= MAX_HEAD_DIM:
        raise ValueError(
            f"head dim {head_dim} is not supported: expected {MIN_HEAD_DIM} to {MAX_HEAD_DIM}, as flash-attn "
            "(the kernels pad it to the next power of two >= 16 inside)"
        )


def check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> configs.DeviceProps:
    """q (B, H_q, N_q, D), k and v (B, H_kv, N_kv, D) with H_q a multiple of H_kv, one dtype, one device that runs
    it. Returns the device's properties, which the dtype's check reads."""
    check_shapes(q, k, v)
    return check_device_and_dtype(q)


def check_device_and_dtype(q: torch.Tensor) -> configs.DeviceProps:
    """q (and with it k and v, :func:`check_shapes`) on a device the kernels run on, in a dtype it runs; returns
    the device's properties."""
    check_device(q, "q")
    return check_dtype(q, "q")


def check_shapes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """q (B, H_q, N_q, D), k and v (B, H_kv, N_kv, D) with H_q a multiple of H_kv, a head dim in range, one dtype,
    one device."""
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
            f"q has {q.shape[1]} heads and k has H_kv = {k.shape[1]} heads (k.shape[1]): H_q must be a multiple "
            "of H_kv >= 1 (grouped-query attention: query head h uses KV head h // (H_q // H_kv))"
        )
    check_head_dim(q.shape[3])
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_head_span(t, name)


# The Triton kernels step to a (batch, head)'s first element in 64 bits and inside it in 32: row * stride_n +
# col * stride_d must stay below 2**31 or the address wraps to another row, without a word. A contiguous head
# reaches that only at N * D = 2**31 elements (16.8 million rows at D = 128); a (B, N, H, D) tensor seen as
# (B, H, N, D), as flash-attn's packed varlen layout is, past N * H * D = 2**31 (from 524,289 tokens at H = 32,
# D = 128).
# Such a call is refused (the Gluon kernels, contiguous only, index in 64 bits).
HEAD_SPAN_LIMIT = 2**31


def head_span(t: torch.Tensor) -> int:
    """The elements one (batch, head) slice of ``t`` (..., N, D) spans: its last element's offset from its first,
    plus one (0 for an empty slice)."""
    rows, cols = t.shape[-2], t.shape[-1]
    if rows == 0 or cols == 0:
        return 0
    return (rows - 1) * abs(t.stride(-2)) + (cols - 1) * abs(t.stride(-1)) + 1


def check_head_span(t: torch.Tensor, name: str) -> None:
    """The elements one (batch, head) slice of ``t`` (..., N, D) spans fit the kernels' 32-bit offsets inside a
    head (``HEAD_SPAN_LIMIT``), or a ValueError that says what to pass instead."""
    span = head_span(t)
    if span < HEAD_SPAN_LIMIT:
        return
    rows, cols = t.shape[-2], t.shape[-1]
    fix = (f"pass {name}.contiguous(), whose heads span N * D = {rows * cols:,} elements"
           if rows * cols < HEAD_SPAN_LIMIT else
           f"N * D = {rows * cols:,} is past it even contiguous: split the sequence (ring attention, "
           "flashcourse.distributed.ring_attention, takes it in shards)")
    raise ValueError(f"{name} has shape {tuple(t.shape)} and strides {tuple(t.stride())}: one (batch, head) slice "
                     f"spans {span:,} elements, and the kernels' 32-bit offsets inside a head reach 2**31 - 1 "
                     f"= {HEAD_SPAN_LIMIT - 1:,}; {fix}")


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
    strides = q.stride()  # o and do laid out as q span what q's own check held: compared, not counted again
    if o.stride() != strides:
        check_head_span(o, "o")
    if do.stride() != strides:
        check_head_span(do, "do")


def check_call(q, k, v, *, enable_gqa, scale, block_mask, saved=None, described=False, tracing=False):
    """Every check of an attention call's tensors, in the order a mistake is best named: q, k and v (shapes,
    dtypes, device), grouped-query heads asked for, the scale, a block mask built for these shapes, and a
    backward's ``saved`` (o, lse, do). Returns the device's properties, read once here and carried to the plan
    (None while ``torch.compile`` traces, ``tracing``: the device cannot be asked then, and the op's fake
    implementation checks q, k and v instead). ``described``: the call's description found its plan, so only
    ``saved`` (which the description does not hold) is checked."""
    if described:
        check_saved(q, *saved)
        return None
    check_shapes(q, k, v)
    check_gqa(q, k, enable_gqa)
    check_scale(scale)
    if block_mask is not None:
        block_mask.check_call(q, k)  # before the rules are parsed, so that other shapes are named as the cause
    if saved is not None:
        check_saved(q, *saved)
    return None if tracing else check_device_and_dtype(q)


def check_gqa(q, k, enable_gqa) -> None:
    """Fewer K/V heads than query heads only when asked for, as SDPA and FlexAttention require."""
    if not isinstance(enable_gqa, bool):
        raise TypeError(f"enable_gqa is {enable_gqa!r}: expected True or False")
    if not enable_gqa and q.shape[1] != k.shape[1]:
        group = q.shape[1] // k.shape[1] if k.shape[1] and q.shape[1] % k.shape[1] == 0 else 0
        raise ValueError(f"q has {q.shape[1]} heads and k has {k.shape[1]}: grouped-query attention must be asked "
                         "for, as in F.scaled_dot_product_attention: pass enable_gqa=True"
                         + (f" (query head h then reads K/V head h // {group})" if group else
                            ", with H_q a multiple of H_kv"))


MIN_SCALE, MAX_SCALE = 1e-30, 1e30  # the kernels hold scale * log2(e) in float32, as they hold the softcap


def check_scale(scale) -> float | None:
    """``scale`` as given (None: 1/sqrt(D)), or an error: a number from 1e-30 to 1e30. One rule for every entry
    point, attention and decode alike (decode once had its own, which let 0 and negatives through). The bounds are
    float32's, where the kernels hold it: 1e-300 is 0 there (a masked score, -inf, times 0 gave NaN), and past
    1e30 ordinary scores overflow to inf (inf - inf: NaN)."""
    if scale is None:
        return None
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise TypeError(f"scale is {scale!r} ({type(scale).__name__}): expected a number, e.g. 0.125, or None "
                        f"for 1/sqrt(D){foreign_number_hint('scale', scale)}")
    if not (MIN_SCALE <= scale <= MAX_SCALE):  # False for nan; a Python int of any size compares exactly
        raise ValueError(f"scale is {shown_number(scale)}: expected a number from {MIN_SCALE:g} to {MAX_SCALE:g} "
                         "(the factor on q.k before the softmax, held in float32 by the kernels); pass None for "
                         "1/sqrt(D)")
    return float(scale)


FP8 = torch.float8_e4m3fn


def check_decode_inputs(q, k_cache, v_cache, cache_seqlens, block_table, k_scale, v_scale,
                        cache_leftpad=None) -> None:
    """A decode call's tensors: q (B, H_q, D); the cache (B, H_kv, N_max, D), or paged (num_blocks, H_kv,
    page_size, D) with a (B, max_blocks) int32 ``block_table``; lengths and left paddings (B,) int32; one device
    and dtype (or an FP8 cache with its scales). Values (lengths, paddings, pages) are :func:`check_lengths`,
    :func:`check_leftpad` and :func:`check_pages`."""
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} is a {type(t).__name__}, expected a torch.Tensor")
    if q.dim() not in (3, 4):
        raise ValueError(f"q has shape {tuple(q.shape)}, expected (B, H_q, D), one new token per sequence, or "
                         "(B, H_q, n_new, D), n_new new tokens (their keys already in the cache)")
    if k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise ValueError(
            f"k_cache {tuple(k_cache.shape)} and v_cache {tuple(v_cache.shape)}: expected one shape, "
            "(B, H_kv, N_max, D) or, with block_table, (num_blocks, H_kv, page_size, D)"
        )
    kv_fp8 = FP8 in (k_cache.dtype, v_cache.dtype)
    if kv_fp8 and k_cache.dtype != v_cache.dtype:
        raise TypeError(f"k_cache is {k_cache.dtype} but v_cache is {v_cache.dtype}: an FP8 cache holds both K and V "
                        "in float8_e4m3fn (quantize_kv_cache makes them)")
    if not kv_fp8 and not (q.dtype == k_cache.dtype == v_cache.dtype):
        raise TypeError(f"q, k_cache, v_cache have dtypes {q.dtype}, {k_cache.dtype}, {v_cache.dtype}: must be one "
                        "(or a float8_e4m3fn cache with k_scale and v_scale)")
    batch, h_q, head_dim = q.shape[0], q.shape[1], q.shape[-1]
    h_kv = k_cache.shape[1]
    if k_cache.shape[3] != head_dim:
        raise ValueError(f"q has head dim {head_dim} but the cache has {k_cache.shape[3]}: they must match")
    if h_kv == 0 or h_q % h_kv:
        raise ValueError(f"q has H_q = {h_q} heads and the cache H_kv = {h_kv} (k_cache.shape[1]): H_q must be a "
                         "multiple of H_kv >= 1 (grouped-query attention: query head h reads K/V head "
                         "h // (H_q // H_kv))")
    if block_table is None and k_cache.shape[0] != batch:
        raise ValueError(f"q has batch {batch} but k_cache has {k_cache.shape[0]}: without block_table they match")
    if block_table is not None:
        if not isinstance(block_table, torch.Tensor):
            raise TypeError(f"block_table is a {type(block_table).__name__}: expected a ({batch}, max_blocks) int32 "
                            "tensor")
        if block_table.dim() != 2 or block_table.shape[0] != batch or block_table.dtype != torch.int32:
            raise ValueError(f"block_table has shape {tuple(block_table.shape)} and dtype {block_table.dtype}: "
                             f"expected ({batch}, max_blocks) int32")
        if block_table.device != q.device:
            raise ValueError(f"block_table is on {block_table.device}, q on {q.device}: move it with .to(q.device)")
        page_size = k_cache.shape[2]
        if page_size < 16 or page_size & (page_size - 1):
            raise ValueError(f"the paged cache has page_size = {page_size} (k_cache.shape[2]): expected a power of "
                             "two >= 16 (16, 32, ..., 256, ...), so that a tile of keys lies inside one page or "
                             "covers whole pages")
    if cache_seqlens is not None:
        if not isinstance(cache_seqlens, torch.Tensor):
            raise TypeError(f"cache_seqlens is a {type(cache_seqlens).__name__}: expected an int, a list of ints or "
                            f"a ({batch},) int32 tensor")
        if cache_seqlens.shape != (batch,) or cache_seqlens.dtype != torch.int32:
            raise ValueError(f"cache_seqlens has shape {tuple(cache_seqlens.shape)} and dtype "
                             f"{cache_seqlens.dtype}: expected ({batch},) int32")
        if cache_seqlens.device != q.device:
            raise ValueError(f"cache_seqlens is on {cache_seqlens.device}, q on {q.device}: move it to q's device")
    if cache_leftpad is not None:  # flash-attn takes only a tensor here, and so do we
        if not isinstance(cache_leftpad, torch.Tensor):
            raise TypeError(f"cache_leftpad is a {type(cache_leftpad).__name__}: expected a ({batch},) int32 tensor, "
                            "each sequence's first real key (torch.tensor(paddings, dtype=torch.int32, "
                            "device=q.device))")
        if cache_leftpad.shape != (batch,) or cache_leftpad.dtype != torch.int32:
            raise ValueError(f"cache_leftpad has shape {tuple(cache_leftpad.shape)} and dtype {cache_leftpad.dtype}: "
                             f"expected ({batch},) int32, one first real key per sequence")
        if cache_leftpad.device != q.device:
            raise ValueError(f"cache_leftpad is on {cache_leftpad.device}, q on {q.device}: move it with "
                             "cache_leftpad.to(q.device)")
    check_head_dim(head_dim)
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        check_head_span(t, name)
    check_device(q, "q")
    if k_cache.device != q.device or v_cache.device != q.device:
        raise ValueError(f"q is on {q.device} but the cache on {k_cache.device}: they must be on one device")
    _check_cache_scales(q, k_cache, k_scale, v_scale)


def check_decode_dtypes(q, k_cache) -> configs.DeviceProps:
    """What a decode call's device can run (after :func:`check_decode_inputs`): q's dtype, and an FP8 cache's
    conversion; returns the device's properties, which these checks read."""
    props = check_dtype(q, "q")
    if k_cache.dtype == FP8:
        check_fp8_cache_device(k_cache, "k_cache")
    return props


def _check_cache_scales(q, k_cache, k_scale, v_scale) -> None:
    """An FP8 cache needs both scales, (B, H_kv) float32 on q's device; a 16-bit cache takes none."""
    batch, h_kv = q.shape[0], k_cache.shape[1]
    if k_cache.dtype != FP8:
        given = [name for name, s in (("k_scale", k_scale), ("v_scale", v_scale)) if s is not None]
        if given:
            raise ValueError(f"{' and '.join(given)} given, but the cache is {k_cache.dtype}: scales belong to a "
                             "float8_e4m3fn cache (quantize_kv_cache returns the cache and its scales)")
        return
    for name, s in (("k_scale", k_scale), ("v_scale", v_scale)):
        if s is None:
            raise ValueError(f"the cache is float8_e4m3fn but {name} is None: pass the ({batch}, {h_kv}) float32 "
                             f"scales that quantize_kv_cache returned (true {name[0].upper()} = cache * {name})")
        if not isinstance(s, torch.Tensor) or tuple(s.shape) != (batch, h_kv) or s.dtype != torch.float32:
            got = f"{tuple(s.shape)} {s.dtype}" if isinstance(s, torch.Tensor) else type(s).__name__
            raise ValueError(f"{name} is {got}: expected ({batch}, {h_kv}) float32, one scale per (sequence, KV "
                             "head), as quantize_kv_cache returns it")
        if s.device != q.device:
            raise ValueError(f"{name} is on {s.device}, q on {q.device}: move it with {name}.to(q.device)")


def host_lengths(lengths, batch: int) -> list[int]:
    """``cache_seqlens`` given on the host (an int for every sequence, or a list or tuple of B ints) as B ints;
    floats and other types are refused (int32 would truncate them), and so are bools (True is 1 to
    ``operator.index``: a mask passed as lengths would run as one key)."""
    try:
        values = ([operator.index(lengths)] * batch if not isinstance(lengths, (list, tuple))
                  else [operator.index(n) for n in lengths])
        if isinstance(lengths, bool) or (isinstance(lengths, (list, tuple))
                                         and any(isinstance(n, bool) for n in lengths)):
            raise TypeError
    except TypeError:
        raise TypeError(f"cache_seqlens is {lengths!r}: expected an int, a list of ints (one length per sequence) "
                        "or a (B,) int32 tensor") from None
    for b, n in enumerate(values):  # before they become an int32 tensor, whose overflow error names no argument
        if not -(2**31) <= n < 2**31:  # the range, 0 .. N_max, is check_lengths's
            raise ValueError(f"cache_seqlens[{b}] = {n}: expected a length from 0 to the keys the cache holds")
    return values


def check_lengths(lengths: list[int], n_max: int, paged: bool) -> None:
    """Every length in 0 .. n_max, the rows a sequence can reach."""
    for b, n in enumerate(lengths):
        if not 0 <= n <= n_max:
            where = ("max_blocks * page_size = block_table.shape[1] * k_cache.shape[2]" if paged
                     else "N_max = k_cache.shape[2]")
            raise ValueError(f"cache_seqlens[{b}] = {n}: expected a length from 0 to {n_max} ({where}), the keys "
                             "this sequence's cache holds")


def check_leftpad(paddings: list[int], lengths: list[int], n_new: int) -> None:
    """Each sequence's left padding P (its first real key, flash-attn's ``cache_leftpad``) lies in 0 .. L, its
    length, and leaves either no key (P = L: o = 0) or at least the new tokens' own keys, L - P >= n_new: the new
    tokens' keys are real, never padding. flash-attn does not check the values (a padding past the length reads
    an empty or negative range); the course refuses them with a ValueError."""
    for b, (pad, n) in enumerate(zip(paddings, lengths, strict=True)):
        if not 0 <= pad <= n:
            raise ValueError(f"cache_leftpad[{b}] = {pad} but cache_seqlens[{b}] = {n}: the first real key must lie "
                             f"from 0 to the length (keys cache_leftpad .. cache_seqlens - 1 are attended); pass a "
                             f"padding from 0 to {n}, or a longer length")
        if 0 < n - pad < n_new:
            raise ValueError(f"cache_leftpad[{b}] = {pad} leaves {n - pad} keys of cache_seqlens[{b}] = {n}, but q "
                             f"has n_new = {n_new} new tokens, whose keys are the last {n_new} and are never padding: "
                             f"pass a padding of at most {n - n_new} (or {n}: no key at all)")


def check_pages(block_table: torch.Tensor, lengths: list[int] | None, page_size: int, num_pages: int,
                leftpads: list[int] | None = None) -> None:
    """Every page a sequence reads (those its length reaches; all of its row without lengths) names a page of the
    cache, 0 .. num_pages - 1: a page past the cache or a negative one would read outside it. Entries past a
    sequence's length are never read and may hold anything (a padding -1, say); so may those of pages wholly
    inside its left padding (``leftpads``, flash-attn's cache_leftpad), whose keys are never read either."""
    table = block_table.tolist()
    for b, row in enumerate(table):
        used = len(row) if lengths is None else -(-lengths[b] // page_size)
        first = 0 if leftpads is None else leftpads[b] // page_size  # checked: 0 <= leftpad <= length
        for slot, page in enumerate(row[first:used], start=first):
            if not 0 <= page < num_pages:
                pages = f"a page from 0 to {num_pages - 1}" if num_pages else "a page, but the cache holds none"
                raise ValueError(f"block_table[{b}, {slot}] = {page}: expected {pages} "
                                 f"(k_cache.shape[0] = {num_pages} pages); sequence {b} reads this slot (its "
                                 "length reaches it), and a page outside the cache would read memory that is not "
                                 "the cache")


def check_quantize_inputs(k_cache, v_cache, block_table, cache_seqlens, cache_leftpad) -> torch.Tensor | None:
    """``quantize_kv_cache``'s arguments, checked as :func:`check_decode_inputs` and :func:`check_decode_call` check
    a decode call's: a 4-dim 16- or 32-bit cache, one shape (pages with a (B, max_blocks) int32 ``block_table``);
    lengths as an int, a list or a (B,) int32 tensor, each 0 .. the rows a sequence reaches; left paddings 0 ..
    the length; every page a sequence uses inside the cache. Returns the lengths as a tensor (None: none given)."""
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4 or not t.is_floating_point() or t.dtype == FP8:
            got = f"{tuple(t.shape)} {t.dtype}" if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"{name} is {got}: expected a 4-dim float16, bfloat16 or float32 cache")
    if k_cache.shape != v_cache.shape or k_cache.device != v_cache.device:
        raise ValueError(f"k_cache {tuple(k_cache.shape)} on {k_cache.device} and v_cache {tuple(v_cache.shape)} on "
                         f"{v_cache.device}: expected one shape on one device")
    paged = block_table is not None
    if paged and (not isinstance(block_table, torch.Tensor) or block_table.dim() != 2
                  or block_table.dtype != torch.int32 or block_table.device != k_cache.device):
        got = (f"{tuple(block_table.shape)} {block_table.dtype} on {block_table.device}"
               if isinstance(block_table, torch.Tensor) else type(block_table).__name__)
        raise ValueError(f"block_table is {got}: expected (B, max_blocks) int32 on the cache's device")
    batch = block_table.shape[0] if paged else k_cache.shape[0]
    n_max = block_table.shape[1] * k_cache.shape[2] if paged else k_cache.shape[2]
    if cache_seqlens is not None and not isinstance(cache_seqlens, torch.Tensor):
        cache_seqlens = torch.tensor(host_lengths(cache_seqlens, batch), dtype=torch.int32, device=k_cache.device)
    values = {}
    for name, t, each in (("cache_seqlens", cache_seqlens, "length"),
                          ("cache_leftpad", cache_leftpad, "first real key")):
        if t is None:
            continue
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} is a {type(t).__name__}: expected a ({batch},) int32 tensor")
        if tuple(t.shape) != (batch,):
            raise ValueError(f"{name} has shape {tuple(t.shape)}: expected ({batch},), one {each} per "
                             + ("block-table row" if paged else "sequence"))
        if t.dtype != torch.int32:
            raise ValueError(f"{name} has dtype {t.dtype}: expected int32, as flash_decode takes it")
        values[name] = t.tolist()  # read once: quantising is a one-off step, not a per-token call
    lengths = values.get("cache_seqlens")
    if lengths is not None:
        check_lengths(lengths, n_max, paged)
    if "cache_leftpad" in values:
        check_leftpad(values["cache_leftpad"], lengths if lengths is not None else [n_max] * batch, 1)
    if paged:
        check_pages(block_table, lengths, k_cache.shape[2], k_cache.shape[0], values.get("cache_leftpad"))
    return cache_seqlens


def check_new_tokens(lengths: list[int], n_new: int) -> None:
    """Each length counts the new tokens, whose keys are already in the cache (flash-attn's ``cache_seqlens``):
    a sequence with keys holds at least ``n_new`` of them. A length of 0 (no keys at all) gives o = 0."""
    for b, n in enumerate(lengths):
        if 0 < n < n_new:
            raise ValueError(f"cache_seqlens[{b}] = {n} but q has n_new = {n_new} new tokens: a length counts the new "
                             "tokens too (their keys are written into the cache before the call, as in flash-attn's "
                             f"flash_attn_with_kvcache), so it must be at least {n_new} (or 0 for an empty sequence)")


def check_decode_options(num_splits, block_n, num_warps, num_stages, switches, causal) -> None:
    """The launch options a decode call may force, whole numbers in range, its switches and ``causal``."""
    for name, value, least in (("num_splits", num_splits, 1), ("block_n", block_n, 16), ("num_warps", num_warps, 1),
                               ("num_stages", num_stages, 1)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < least):
            raise ValueError(f"{name} is {value!r}: expected an int >= {least} or None (chosen per call)")
    if block_n is not None and block_n & (block_n - 1):
        raise ValueError(f"block_n = {block_n}: expected a power of two >= 16 (tl.arange and tl.dot need it)")
    if num_warps is not None and num_warps & (num_warps - 1):
        raise ValueError(f"num_warps is {num_warps}: expected a power of two (1, 2, 4, 8, ...) or None (chosen per "
                         "call)")
    if switches is not None:
        if not isinstance(switches, DecodeSwitches):
            raise TypeError(f"switches is a {type(switches).__name__}: expected a DecodeSwitches (or None)")
        programs = switches.programs_per_sm
        if programs is not None and (not isinstance(programs, int) or isinstance(programs, bool) or programs < 1):
            raise ValueError(f"programs_per_sm = {programs!r}: expected an int, at least 1 (or None: chosen per "
                             "call)")
    if not isinstance(causal, bool):
        raise TypeError(f"causal is {causal!r}: expected True (each new token sees the cache up to its own "
                        "position, bottom-right aligned) or False (every new token sees the whole cache)")


class DecodeChecked(NamedTuple):
    """What the checks of a decode call leave for its plan: the scale as given (checked; None is 1/sqrt(D)), the
    window's left reach (None: unbounded), the softcap, the keys a sequence can reach (``n_max``), whether the
    cache is paged, the lengths' values where known (given on the host, or read once here), the padded head dim
    the products' precision (:func:`dot_precision`) and the device's properties."""

    scale: float | None
    window_left: int | None
    softcap: float | None
    n_max: int
    paged: bool
    lengths: list[int] | None
    block_d: int
    dot_precision: str
    props: configs.DeviceProps


def check_decode_call(tensors: tuple, options: tuple, lengths: list[int] | None, kept=None,
                      capturing: bool = False) -> DecodeChecked | None:
    """Every check of a decode call (``tensors`` and ``options`` in ``flash_decode``'s order; ``lengths``: the
    lengths given on the host). A call whose description found its plan (``kept``, a ``plan.DecodePlan``) checks
    only the host lengths, which the description does not hold. Otherwise everything, and the lengths', left
    paddings' and pages' values once (reading a GPU tensor waits for the GPU, so once per plan; not at all while a
    CUDA graph is captured, ``capturing``): the kernel clamps each length (and padding) on every call, so a value
    changed in place past the cache reads the whole cache, never another sequence's rows."""
    q = tensors[0]
    if kept is not None:
        check_lengths(lengths, kept.n_max, kept.paged)
        check_new_tokens(lengths, 1 if q.dim() == 3 else q.shape[2])
        return None
    q, k_cache, v_cache, cache_seqlens, block_table, k_scale, v_scale, alibi_slopes, cache_leftpad = tensors
    scale, num_splits, window, softcap, block_n, num_warps, num_stages, switches, causal = options
    check_decode_inputs(q, k_cache, v_cache, cache_seqlens, block_table, k_scale, v_scale, cache_leftpad)
    window = check_window(window)
    check_decode_options(num_splits, block_n, num_warps, num_stages, switches, causal)
    n_new = 1 if q.dim() == 3 else q.shape[2]
    if window is not None and not causal and 0 <= window[1] < n_new - 1:
        # The kernel bounds a new token's keys on the right only causally (its own position); a right side that
        # stops short of the last token's position would hide keys from the earlier tokens, and was dropped.
        raise ValueError(f"window = {window} with causal=False over n_new = {n_new} new tokens: decode bounds a "
                         "token's keys on the right only at its own position, with causal=True (the same mask as "
                         "right = 0); pass causal=True for right = 0, or a right side of -1 or at least n_new - 1 "
                         f"= {n_new - 1} (which hides no key), or use flash_attention for other right sides")
    paged = block_table is not None
    n_max = block_table.shape[1] * k_cache.shape[2] if paged else k_cache.shape[2]
    if lengths is None and cache_seqlens is not None and not capturing:
        lengths = cache_seqlens.tolist()  # read once here; the kernel clamps on every call
    if lengths is not None:
        check_lengths(lengths, n_max, paged)
    check_new_tokens(lengths if lengths is not None else [n_max] * q.shape[0], n_new)
    leftpads = None
    if cache_leftpad is not None and not capturing:  # read once per plan, as the lengths; the kernel clamps it
        leftpads = cache_leftpad.tolist()
        check_leftpad(leftpads, lengths if lengths is not None else [n_max] * q.shape[0], n_new)
    if paged and not capturing:  # read once per plan, as the lengths
        check_pages(block_table, lengths, k_cache.shape[2], k_cache.shape[0], leftpads)
    # A window reaching back past the cache holds every key: no window (the kernel subtracts it in 32 bits)
    window_left = window[0] if window is not None and 0 <= window[0] < n_max else None
    scale, softcap = check_scale(scale), check_softcap(softcap)
    block_d, precision = padded_head_dim(q.shape[-1]), dot_precision(q.dtype)
    props = check_decode_dtypes(q, k_cache)  # the checks that ask the device, last
    check_alibi_slopes(alibi_slopes, q)
    return DecodeChecked(scale, window_left, softcap, n_max, paged, lengths, block_d, precision, props)
