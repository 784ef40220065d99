"""GPU benchmark of decoding: one query token against a long KV cache, grouped-query attention.

Decoding reads every K and V byte once and does little arithmetic per byte, so the measure is effective
bandwidth: bytes of K and V / time, compared with two ceilings measured in the same run (a large copy, bytes
read + written, and a large sum, bytes read), with the data sheet's 4.8 TB/s for the H200, and with SDPA
(``enable_gqa=True``) in the same run. Kernels this short (tens of
microseconds) are timed as CUDA-graph replays so that Python launch overhead stays out of every provider.

Our kernel runs on the contiguous cache (provider ``flashcourse``, one row per KV length) and on the same cache
cut into shuffled pages (``flashcourse_paged``, one row per ``page_size``: vLLM's default 16 and a large 256),
with ``ratio_vs_contiguous``; each of them also on the cache quantised to float8_e4m3fn (``kv_dtype``
"float8_e4m3fn", with ``speedup_vs_fp16_cache``: the float16 row's time over this one's, half the bytes read).
Our rows carry ``max_abs_err``, against attention in float64 on the float16 cache, so the FP8 cache's error
sits beside the float16 cache's.

Every provider cycles through enough distinct caches (``caches_rotated``) that at least
:data:`L2_ROTATE_BYTES` of other caches are read between two reads of one: the H100/H200's 50 MB L2 cannot
hold a cache from one call to its next, so every call reads HBM (a single 32K cache in FP8 is 64 MiB, close
enough to the L2 for replays of one cache to hit it). Every figure is the median of :data:`REPEATS` timings
taken in rounds over all the providers of a shape (so a drift of the clocks touches them all), stored with the
slowest and fastest (``ms_min``, ``ms_max``, ``bandwidth_tbs_min``, ``bandwidth_tbs_max``).
"""

from __future__ import annotations

import itertools
import math
import statistics
from typing import NamedTuple

import torch

from flashcourse.bench import REPEATS, format_spread
from flashcourse.bench.providers import add_ratios as shared_add_ratios
from flashcourse.bench.providers import sdpa

DECODE_SHAPES = ((1, 32, 8, 128, 32768), (1, 32, 8, 128, 131072))  # (B, H_q, H_kv, D, KV length)
PROVIDERS = ("flashcourse", "flashcourse_paged", "sdpa_flash", "sdpa_cudnn", "sdpa_efficient",
             "sdpa_flash_expanded")
PAGE_SIZE = 256  # the paged rows' page size before page_size became a column (runs up to 2026-11-30)
PAGE_SIZES = (16, PAGE_SIZE)  # vLLM's default page, and a large one
GRAPH_REP_MS = 60  # milliseconds of replays per timing (each timing: 10 replays of a graph this long)
KV_DTYPES = ("float16", "float8_e4m3fn")
OURS = ("flashcourse", "flashcourse_paged")  # the providers that also run on the FP8 cache
L2_ROTATE_BYTES = 256 << 20  # bytes of other caches read between two reads of one: 5x the H100/H200's L2


def graph_ms(fn, rep: int = GRAPH_REP_MS) -> float:
    """Median milliseconds of fn replayed from a CUDA graph (no launch overhead in the number)."""
    import triton.testing

    return float(triton.testing.do_bench_cudagraph(fn, rep=rep, return_mode="median"))


def _clocks_up() -> None:
    """About half a second of matrix products: from idle clocks the first transfers run far below the ceiling."""
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)
    for _ in range(100):
        a @ a


def _event_ms(fn) -> float:
    """Median milliseconds of fn, each call timed by CUDA events with L2 flushed in between (one long kernel, so
    launch overhead is negligible)."""
    import triton.testing

    return float(triton.testing.do_bench(fn, rep=200, return_mode="median"))


def copy_bandwidth(nbytes: int = 1 << 31) -> float:
    """Bytes read plus written per second by a device-to-device copy of ``nbytes`` (2 GiB: far beyond L2)."""
    src = torch.empty(nbytes // 2, dtype=torch.float16, device="cuda").normal_()
    dst = torch.empty_like(src)
    _clocks_up()
    return 2 * nbytes / (_event_ms(lambda: dst.copy_(src)) * 1e-3)


def read_bandwidth(nbytes: int = 1 << 31) -> float:
    """Bytes read per second by a sum over ``nbytes`` of fp16: the ceiling of a kernel that only reads, as a
    decode step mostly does (its writes are a few kilobytes)."""
    src = torch.empty(nbytes // 2, dtype=torch.float16, device="cuda").normal_()
    _clocks_up()
    return nbytes / (_event_ms(lambda: src.sum(dtype=torch.float32)) * 1e-3)


def make_cache(batch, h_q, h_kv, head_dim, n, dtype=torch.float16, device="cuda"):
    q = torch.randn(batch, h_q, head_dim, device=device, dtype=dtype)
    k = torch.randn(batch, h_kv, n, head_dim, device=device, dtype=dtype)
    v = torch.randn(batch, h_kv, n, head_dim, device=device, dtype=dtype)
    return q, k, v


def to_paged(k, v, page_size: int, generator=None):
    """The same cache stored as shuffled pages: (num_pages, H_kv, page_size, D) and a (B, pages) block table."""
    batch, h_kv, n, d = k.shape
    pages = math.ceil(n / page_size)
    perm = torch.randperm(batch * pages, generator=generator).to(torch.int32)
    block_table = perm.reshape(batch, pages).to(k.device)

    def paginate(x):
        padded = torch.zeros(batch, h_kv, pages * page_size, d, dtype=x.dtype, device=x.device)
        padded[:, :, :n] = x
        paged = padded.reshape(batch, h_kv, pages, page_size, d).permute(0, 2, 1, 3, 4).reshape(-1, h_kv, page_size, d)
        out = torch.empty_like(paged)
        out[perm.long().to(x.device)] = paged  # page i of the logical order lives at slot perm[i]
        return out

    return paginate(k), paginate(v), block_table


def rotation_copies(kv_bytes: int, rotate_bytes: int = L2_ROTATE_BYTES) -> int:
    """How many distinct caches of ``kv_bytes`` to cycle through so that ``rotate_bytes`` of the others are read
    between two reads of one (1 when ``rotate_bytes`` is 0: the same cache every call)."""
    return 1 + math.ceil(rotate_bytes / max(kv_bytes, 1))


def rotated(fns):
    """One callable running each of ``fns`` once, in turn: time it and divide by ``len(fns)``."""
    def run_all():
        for fn in fns:
            out = fn()
        return out

    return run_all


def provider_fn(provider: str, q, k, v, *, page_size: int = PAGE_SIZE, kv_dtype: str = "float16", **decode_kwargs):
    """A no-argument callable computing o (B, H_q, D) for one provider (``page_size``: the paged provider's;
    ``kv_dtype`` "float8_e4m3fn": our kernel on the cache quantised by ``quantize_kv_cache``, done here, outside
    the timed call)."""
    from flashcourse import kernels
    from flashcourse.kernels import quantize_kv_cache

    if kv_dtype not in KV_DTYPES or (kv_dtype != "float16" and provider not in OURS):
        raise ValueError(f"kv_dtype {kv_dtype!r} for {provider}: float16 for every provider, float8_e4m3fn for "
                         f"{' and '.join(OURS)} only")
    fp8 = kv_dtype == "float8_e4m3fn"
    if provider == "flashcourse":
        if fp8:
            k8, v8, k_scale, v_scale = quantize_kv_cache(k, v)
            return lambda: kernels.flash_decode(q, k8, v8, k_scale=k_scale, v_scale=v_scale, **decode_kwargs)
        return lambda: kernels.flash_decode(q, k, v, **decode_kwargs)
    if provider == "flashcourse_paged":
        kp, vp, table = to_paged(k, v, page_size)
        lens = torch.full((q.shape[0],), k.shape[2], dtype=torch.int32, device=q.device)
        scales = {}
        if fp8:
            kp, vp, k_scale, v_scale = quantize_kv_cache(kp, vp, block_table=table, cache_seqlens=lens)
            scales = {"k_scale": k_scale, "v_scale": v_scale}
        if q.is_cuda:  # the timer launches on a stream of its own, which must find lens written
            torch.cuda.synchronize()
        return lambda: kernels.flash_decode(q, kp, vp, block_table=table, cache_seqlens=lens, **scales,
                                            **decode_kwargs)
    q4 = q[:, :, None, :]  # (B, H_q, 1, D)
    if provider == "sdpa_flash_expanded":  # the cache copied out to H_q heads: 4x the bytes
        group = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        provider = "sdpa_flash"
    attend = sdpa(provider, enable_gqa=True)
    return lambda: attend(q4, k, v)[:, :, 0]


def reference_decode(q, k, v) -> torch.Tensor:
    """Attention of one token in float64 (torch, any device): q (B, H_q, D), k and v (B, H_kv, N, D), GQA without
    copying the cache; returns (B, H_q, D) float64."""
    batch, h_q, d = q.shape
    h_kv = k.shape[1]
    qg = q.double().reshape(batch, h_kv, h_q // h_kv, d)  # (B, H_kv, G, D): a KV head's query heads together
    s = qg @ k.double().transpose(-1, -2) / math.sqrt(d)  # (B, H_kv, G, N)
    return (torch.softmax(s, dim=-1) @ v.double()).reshape(batch, h_q, d)


def kv_dtype_errors(q, k, v, **decode_kwargs) -> dict[str, float]:
    """Largest |o - o_float64| of our decode on the float16 cache and on the same cache quantised to
    float8_e4m3fn (``quantize_kv_cache``), both against attention in float64 on the float16 cache: what the
    FP8 cache costs in accuracy, beside what float16 already costs. q, k, v float16."""
    ref = reference_decode(q, k, v)
    return {kv_dtype: float((provider_fn("flashcourse", q, k, v, kv_dtype=kv_dtype, **decode_kwargs)().double()
                             - ref).abs().max())
            for kv_dtype in KV_DTYPES}


def timing_fields(times_ms: list[float], kv_bytes: int) -> dict:
    """The median and range of repeated timings, in ms and in TB/s (the slowest repeat gives the lowest rate)."""
    def tbs(ms):
        return kv_bytes / (ms * 1e-3) / 1e12

    ms, lo, hi = statistics.median(times_ms), min(times_ms), max(times_ms)
    return {"ms": ms, "ms_min": lo, "ms_max": hi, "repeats": len(times_ms),
            "bandwidth_tbs": tbs(ms), "bandwidth_tbs_min": tbs(hi), "bandwidth_tbs_max": tbs(lo)}


def run(shapes=DECODE_SHAPES, providers=PROVIDERS, page_sizes=PAGE_SIZES, kv_dtypes=KV_DTYPES,
        repeats: int = REPEATS, rotate_bytes: int = L2_ROTATE_BYTES, log=print) -> list[dict]:
    """Measure the bandwidth ceilings, validate every provider, then time them in ``repeats`` rounds.

    Rows: one per ceiling (``copy`` counts bytes read + written, ``read`` bytes read), then one per provider, KV
    length and ``kv_dtype`` (``flashcourse_paged``: one per page size, with ``page_size``; float8_e4m3fn for our
    two providers only, after every float16 row) with TB/s of the bytes read, ratios and ``fraction_of_ceiling``:
    the share of the best bandwidth seen in this run (a ceiling or, should a kernel beat both, that kernel), so it
    never exceeds 1. Each timed call reads the next of ``caches_rotated`` distinct caches (``rotate_bytes`` of
    others between two reads of one; 0: one cache, which the L2 may partly hold between calls)."""
    from flashcourse.kernels import quantize_kv_cache

    if repeats < 3:
        raise ValueError(f"repeats={repeats}: a spread needs at least 3 repeats")
    ceilings = {"copy": copy_bandwidth(), "read": read_bandwidth()}
    log(" ".join(f"{name} {bw / 1e12:.2f} TB/s" for name, bw in ceilings.items()))
    rows = [{"provider": name, "bandwidth_tbs": bw / 1e12} for name, bw in ceilings.items()]
    for batch, h_q, h_kv, d, n in shapes:
        caches = [make_cache(batch, h_q, h_kv, d, n)]
        q, k, v = caches[0]
        smallest = 2 * k.numel() * (1 if "float8_e4m3fn" in kv_dtypes else k.element_size())  # K and V bytes
        copies = rotation_copies(smallest, rotate_bytes)
        caches += [make_cache(batch, h_q, h_kv, d, n) for _ in range(copies - 1)]
        exact = reference_decode(q, k, v)  # float64 on the float16 cache: every row's max_abs_err
        read_back = {"float16": (k, v)}  # the cache each kv_dtype's kernel reads, for validation in float32
        if "float8_e4m3fn" in kv_dtypes:
            k8, v8, k_scale, v_scale = quantize_kv_cache(k, v)
            read_back["float8_e4m3fn"] = (k8.float() * k_scale[:, :, None, None],
                                          v8.float() * v_scale[:, :, None, None])
        shape = {"batch": batch, "h_q": h_q, "h_kv": h_kv, "head_dim": d, "kv_len": n, "dtype": "float16"}
        shape_rows, timed = [], []  # timed: (row, fn, times), validated and timed once already
        for kv_dtype in kv_dtypes:
            kv_bytes = 2 * k.numel() * (1 if kv_dtype == "float8_e4m3fn" else k.element_size())
            ref = provider_fn("sdpa_math", q.float(), *(t.float() for t in read_back[kv_dtype]))()
            for provider in providers if kv_dtype == "float16" else [p for p in providers if p in OURS]:
                for page_size in page_sizes if provider == "flashcourse_paged" else (None,):
                    row = {"provider": provider, **shape, "kv_dtype": kv_dtype, "caches_rotated": copies}
                    if page_size is not None:
                        row["page_size"] = page_size
                    try:
                        fns = [provider_fn(provider, *cache, page_size=page_size or PAGE_SIZE, kv_dtype=kv_dtype)
                               for cache in caches]
                        o = fns[0]()
                        err = float((o.float() - ref).norm() / ref.norm())
                        row.update(status="ok", rel_err=err)
                        if provider in OURS:
                            row["max_abs_err"] = float((o.double() - exact).abs().max())
                            if not err < 1e-2:
                                raise AssertionError(f"{provider} decode on the {kv_dtype} cache is wrong: relative "
                                                     f"error {err:.2e} against the cache it reads")
                        fn = rotated(fns)
                        timed.append((row, fn, [graph_ms(fn) / copies], kv_bytes))
                    except torch.cuda.OutOfMemoryError:
                        row["status"] = "oom"
                    except RuntimeError as e:
                        row.update(status="unsupported", error=str(e).splitlines()[0][:200])
                    shape_rows.append(row)
        for _ in range(repeats - 1):  # the remaining rounds, every provider once per round
            for _row, fn, times, _bytes in timed:
                times.append(graph_ms(fn) / copies)
        for row, _fn, times, kv_bytes in timed:
            row.update(timing_fields(times, kv_bytes))
        for row in shape_rows:
            page = f" page {row['page_size']}" if "page_size" in row else ""
            fp8 = " fp8" if row["kv_dtype"] == "float8_e4m3fn" else ""
            log(f"{row['provider'] + page + fp8:32} N={n:7} {row.get('bandwidth_tbs', float('nan')):5.2f} TB/s "
                f"{row.get('ms', float('nan')) * 1e3:8.1f} us  {row['status']}")
        rows.extend(shape_rows)
        del timed, caches
        torch.cuda.empty_cache()
    best = max(r["bandwidth_tbs"] for r in rows if "bandwidth_tbs" in r)
    if best > max(ceilings.values()) / 1e12:
        log(f"a kernel ({best:.2f} TB/s) beat both measured ceilings: fractions are of that kernel's bandwidth")
    for r in rows:
        if "kv_len" in r and "bandwidth_tbs" in r:
            r["fraction_of_ceiling"] = r["bandwidth_tbs"] / best
    add_ratios(rows)
    return rows


def _ratio(mine: dict, base: dict, name: str, key: str) -> dict:
    """``name``: how many times faster ``mine`` is than ``base``, from a rate (``bandwidth_tbs``: mine over base)
    or a time (``ms``: base over mine), with the range of the repeats where both rows have one."""
    a, b = (base, mine) if key == "ms" else (mine, base)
    out = {name: a[key] / b[key]}
    if all(x.get(f"{key}_{end}") for x in (a, b) for end in ("min", "max")):
        out[f"{name}_min"] = a[f"{key}_min"] / b[f"{key}_max"]
        out[f"{name}_max"] = a[f"{key}_max"] / b[f"{key}_min"]
    return out


def add_ratios(rows: list[dict]) -> None:
    """Our float16 rows get their bandwidth ratio against every SDPA provider at the same KV length; each paged
    row ``ratio_vs_contiguous``, against ``flashcourse`` at its KV length and ``kv_dtype``; each float8_e4m3fn
    row ``speedup_vs_fp16_cache``, the matching float16 row's time over its own (with the range of the repeats
    where both rows have one: our slowest over its fastest, and the reverse). Rows without ``kv_dtype`` (runs
    before the FP8 cache) are float16."""
    def ok(r):
        return r.get("status") == "ok" and bool(r.get("bandwidth_tbs"))

    def kv_dtype(r):
        return r.get("kv_dtype", "float16")

    sdpa_rows = [r for r in rows if r["provider"].startswith(("flashcourse", "sdpa")) and kv_dtype(r) == "float16"]
    shared_add_ratios(sdpa_rows, rate="bandwidth_tbs", ours=OURS, key=lambda r: r["kv_len"])
    ours = {(r["provider"], r["kv_len"], r.get("page_size"), kv_dtype(r)): r for r in rows
            if r["provider"] in OURS and ok(r)}
    for (provider, kv_len, page_size, dtype), r in ours.items():
        contiguous = ours.get(("flashcourse", kv_len, None, dtype))
        if provider == "flashcourse_paged" and contiguous is not None:
            r.update(_ratio(r, contiguous, "ratio_vs_contiguous", "bandwidth_tbs"))
        fp16 = ours.get((provider, kv_len, page_size, "float16"))
        if dtype != "float16" and fp16 is not None:
            r.update(_ratio(r, fp16, "speedup_vs_fp16_cache", "ms"))


TUNE_SPLITS = (16, 33, 66)
TUNE_BLOCKS = (32, 64, 128, 256)  # 256 over 8 warps: the FP8 cache's launch on sm_90 until 2026-12-02
TUNE_WARPS_STAGES = ((4, 2), (4, 3), (4, 4), (4, 5), (8, 3), (8, 5))  # (4, 5): the FP8 cache's earlier launch


def tune(shapes=DECODE_SHAPES, page_sizes=PAGE_SIZES, kv_dtypes=KV_DTYPES, log=print) -> list[dict]:
    """Sweep num_splits, block_n, warps and stages of our decode kernel on the contiguous cache and on the paged
    one at each page size, float16 and FP8; rows with ``provider``, ``page_size`` (paged), ``kv_dtype``, the
    launch and TB/s (one timing each, one cache, no rotation: a sweep, not a result; confirm its winner with
    :func:`run`)."""
    rows = []
    for batch, h_q, h_kv, d, n in shapes:
        q, k, v = make_cache(batch, h_q, h_kv, d, n)
        layouts = [("flashcourse", None)] + [("flashcourse_paged", p) for p in page_sizes]
        for (provider, page_size), kv_dtype in itertools.product(layouts, kv_dtypes):
            kv_bytes = 2 * k.numel() * (1 if kv_dtype == "float8_e4m3fn" else k.element_size())
            layout = {"provider": provider, "kv_len": n, "kv_dtype": kv_dtype} | (
                {"page_size": page_size} if page_size else {})
            best = None
            for splits in TUNE_SPLITS:
                for block_n in TUNE_BLOCKS:
                    for warps, stages in TUNE_WARPS_STAGES:
                        kw = {"num_splits": splits, "block_n": block_n, "num_warps": warps, "num_stages": stages}
                        try:
                            ms = graph_ms(provider_fn(provider, q, k, v, page_size=page_size or PAGE_SIZE,
                                                      kv_dtype=kv_dtype, **kw), rep=20)
                        except Exception as err:  # noqa: BLE001 - a config that does not compile is a result
                            rows.append({**layout, **kw, "error": str(err)[:120]})
                            continue
                        tbs = kv_bytes / (ms * 1e-3) / 1e12
                        rows.append({**layout, **kw, "bandwidth_tbs": tbs})
                        best = max(best or (0, None), (tbs, kw), key=lambda t: t[0])
            log(f"tune decode {provider} page {page_size} {kv_dtype} N={n}: best {best}")
            torch.cuda.empty_cache()
    return rows


def format_table(rows: list[dict]) -> str:
    """Our decode beside SDPA: time, TB/s (with the repeats' range when recorded), share of the best bandwidth
    of the run (ceilings included, so never above 100%), the paged rows' ratio to the contiguous cache, our
    ratios to SDPA flash and cuDNN, and for the FP8 cache (``kv`` fp8) its speed-up over the float16 cache's.
    Reads older results too (no ``page_size``, no ranges, no ``kv_dtype``)."""
    rows = [r for r in rows if "provider" in r]  # a tune file's rows have none
    best = max((r["bandwidth_tbs"] for r in rows if "bandwidth_tbs" in r), default=float("nan"))
    lines = [f"{'provider':20}{'page':>5}{'kv':>5}{'KV len':>8}{'us':>8}  {'TB/s (min-max)':18}{'% best':>7}"
             f"{'vs contig':>11}{'vs flash':>10}{'vs cudnn':>10}{'vs fp16 kv':>12}"]
    for r in rows:
        if "kv_len" not in r:
            continue
        kv = "fp8" if r.get("kv_dtype") == "float8_e4m3fn" else "fp16"
        head = f"{r['provider']:20}{r.get('page_size', ''):>5}{kv:>5}{r['kv_len']:>8}"
        if r.get("status") != "ok":
            lines.append(f"{head}   {r.get('status')}")
            continue
        ratios = "".join(f"{r[key]:{width}.2f}" if key in r else f"{'-':>{width}}"
                         for key, width in (("ratio_vs_contiguous", 11), ("ratio_vs_sdpa_flash", 10),
                                            ("ratio_vs_sdpa_cudnn", 10), ("speedup_vs_fp16_cache", 12)))
        lines.append(f"{head}{r['ms'] * 1e3:8.1f}  {format_spread(r, 'bandwidth_tbs', '.2f'):18}"
                     f"{100 * r['bandwidth_tbs'] / best:6.0f}%{ratios}")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------ FP8 cache candidates
class Candidate(NamedTuple):
    """A launch of our decode kernel that :func:`candidates` checks and times: its tiles (None: the launch that
    ``flash_decode`` chooses), its switches (``kernels.decode.DecodeSwitches`` fields; None: the defaults) and the
    layout of V in the cache ("keys_adjacent": ``kernels.decode.v_keys_adjacent``). ``expect`` is what the
    compiled kernel and the profile predict, written before the GPU run."""

    name: str
    kv_dtype: str  # "float16" or "float8_e4m3fn"
    block_n: int | None = None
    num_warps: int | None = None
    num_stages: int | None = None
    switches: dict | None = None
    v_layout: str = "as_given"
    expect: str = ""


# The FP8 cache's launches on sm_90 at D = 128, after the run that chose its default (CHOOSING_RUN, twelve
# candidates: the 256-key, 8-warp launch then shipped, P V computed column-interleaved, the combine merged into the
# split kernel and 64-key tiles three to an SM all lost to t128_2x in every layout, and are gone). fp16_shipped, the
# float16 cache's launch, is the reference; "shipped" is what flash_decode chooses for the FP8 cache (on sm_90,
# t128_2x's launch); t128 is that launch one program to an SM, what two programs per SM are measured against;
# t128_kadj_2x reads V stored keys-adjacent.
CANDIDATES = (
    Candidate("fp16_shipped", "float16",
              expect="the reference: 128 keys, 4 warps, 3 stages, one program an SM; 3.4-4.4 TB/s on 2026-12-02"),
    Candidate("shipped", "float8_e4m3fn",
              expect="flash_decode's FP8 launch: on sm_90 t128_2x's, so t128_2x's speed-up"),
    Candidate("t128", "float8_e4m3fn", 128, 4, 3, {"programs_per_sm": 1},
              expect="the float16 launch on the FP8 cache, one program an SM: 1.07-1.16x on 2026-12-02"),
    Candidate("t128_2x", "float8_e4m3fn", 128, 4, 3, {"programs_per_sm": 2},
              expect="t128 with 2 programs an SM (205-210 regs, 72 KB: 2 fit): 1.26-1.49x on 2026-12-02"),
    Candidate("t128_kadj_2x", "float8_e4m3fn", 128, 4, 3, {"programs_per_sm": 2, "mask_tail_only": True},
              v_layout="keys_adjacent",
              expect="V stored keys-adjacent, whole tiles unmasked: 16-byte copies, ldmatrix: 1.79x contiguous and "
                     "in pages of 256 at 128K keys, 1.53-1.54x at 32K, 1.25-1.33x in pages of 16 on 2026-12-02"),
)
CHOOSING_RUN = "2026-12-02-nvidia-h200-decode-fp8-candidates.json"  # the H200 run that chose the FP8 cache's launch
PROFILE_RUN = "2026-12-02-nvidia-h200-ncu-limits.json"  # Nsight Compute on the launch shipped before that run


def _candidate_fn(candidate: Candidate, cache: dict):
    """A no-argument call of ``flash_decode`` for ``candidate`` on one prepared ``cache`` (see :func:`_caches`)."""
    from flashcourse import kernels
    from flashcourse.kernels.decode import DecodeSwitches

    launch = {name: value for name in ("block_n", "num_warps", "num_stages")
              if (value := getattr(candidate, name)) is not None}
    if candidate.switches is not None:
        launch["switches"] = DecodeSwitches(**candidate.switches)
    k, v = cache["k"], cache["v_" + candidate.v_layout]
    return lambda: kernels.flash_decode(cache["q"], k, v, **cache["options"], **launch)


def _caches(q, k, v, kv_dtype: str, page_size: int | None, v_layouts) -> dict:
    """One cache as the candidates read it: K, V in each layout of ``v_layouts``, and ``flash_decode``'s options
    (block table, lengths, scales); float8_e4m3fn quantised by ``quantize_kv_cache``, through the block table
    when paged."""
    from flashcourse.kernels import quantize_kv_cache
    from flashcourse.kernels.decode import v_keys_adjacent

    options = {}
    if page_size is not None:
        lengths = torch.full((q.shape[0],), k.shape[2], dtype=torch.int32, device=q.device)
        k, v, table = to_paged(k, v, page_size)
        options = {"block_table": table, "cache_seqlens": lengths}
    if kv_dtype == "float8_e4m3fn":
        k, v, k_scale, v_scale = quantize_kv_cache(k, v, block_table=options.get("block_table"),
                                                   cache_seqlens=options.get("cache_seqlens"))
        options |= {"k_scale": k_scale, "v_scale": v_scale}
    cache = {"q": q, "k": k, "options": options}
    for layout in v_layouts:
        cache["v_" + layout] = v if layout == "as_given" else v_keys_adjacent(v)
    return cache


def _newest_launch() -> dict:
    """Splits, launch and compiled resources of the plan ``flash_decode`` made last (its split kernel as Triton
    compiled it on this GPU): ``launch`` (keys a tile, warps, stages, whole tiles unmasked), registers a thread,
    spilled bytes, shared memory, and how many programs an SM holds."""
    from flashcourse.kernels import plan

    kept = [kept for kept in plan.PLANS.plans.values() if isinstance(kept, plan.DecodePlan)]
    if not kept:  # plans are kept on a GPU only
        return {}
    plan = kept[-1]
    args = plan.split_args
    row = {"num_splits": plan.num_splits,
           "launch": {"block_n": args["BLOCK_N"], "num_warps": args["num_warps"], "num_stages": args["num_stages"],
                      "mask_tail_only": args["MASK_TAIL_ONLY"]}}
    prepared = plan.launches[0] if plan.launches else None
    compiled = getattr(prepared, "compiled", None)
    if compiled is None:
        return row
    regs, shared = int(compiled.n_regs), int(compiled.metadata.shared)
    warps = args["num_warps"]
    props = torch.cuda.get_device_properties(torch.cuda.current_device())  # an H100/H200 SM where torch lacks one
    by_regs = getattr(props, "regs_per_multiprocessor", 65536) // (-(-regs // 8) * 8 * 32 * warps)
    by_shared = getattr(props, "shared_memory_per_multiprocessor", 233472) // (shared + 1024)  # 1 KB: the system's
    by_threads = getattr(props, "max_threads_per_multi_processor", 2048) // (32 * warps)
    return row | {"registers": regs, "spill_bytes": int(compiled.n_spills), "shared_bytes": shared,
                  "programs_per_sm_fit": min(by_regs, by_shared, by_threads)}


def candidates(lengths=(32768, 131072), page_sizes=PAGE_SIZES, chosen=CANDIDATES, shape=(1, 32, 8, 128),
               rounds: int = REPEATS, rep_ms: int = 20, rotate_bytes: int = L2_ROTATE_BYTES,
               budget_s: float | None = None, log=print) -> list[dict]:
    """Check, then time, every candidate of ``chosen`` on the contiguous cache and on the paged one at each page
    size, at each KV length: one row each (``provider`` "flashcourse" or "flashcourse_paged", ``page_size``,
    ``kv_len``, ``kv_dtype``, ``candidate``, its launch, switches and ``v_layout``; what :func:`_newest_launch`
    reads; ``rel_err`` and ``max_abs_err`` against attention in float64 on the values its cache holds (over
    1e-2 relative: status "wrong", not timed); times and TB/s as :func:`run`'s rows). Every call reads the next of
    ``caches_rotated`` caches (at least ``rotate_bytes`` of others between two reads of one). Each float8_e4m3fn
    row gets ``speedup_vs_fp16_cache`` (fp16_shipped's time at its layout and length over its own, with the
    repeats' range). ``budget_s``: after the first
    round, stop adding rounds once this many seconds have passed since the start."""
    import time

    start_time = time.monotonic()
    rows = []
    batch, h_q, h_kv, d = shape
    for n in lengths:
        copies = rotation_copies(2 * batch * h_kv * n * d, rotate_bytes)  # FP8's bytes: the fewest of any cache
        fp16_caches = [make_cache(batch, h_q, h_kv, d, n) for _ in range(copies)]
        q, k, v = fp16_caches[0]
        timed = []
        for page_size in (None, *page_sizes):
            layout = {"provider": "flashcourse" if page_size is None else "flashcourse_paged", "kv_len": n}
            if page_size is not None:
                layout["page_size"] = page_size
            for kv_dtype in KV_DTYPES:
                mine = [c for c in chosen if c.kv_dtype == kv_dtype]
                if not mine:
                    continue
                v_layouts = sorted({c.v_layout for c in mine})
                caches = [_caches(*qkv, kv_dtype, page_size, v_layouts) for qkv in fp16_caches]
                exact = _exact(caches[0], q, k, v, kv_dtype)
                for c in mine:
                    row = {**layout, "batch": batch, "h_q": h_q, "h_kv": h_kv, "head_dim": d, "dtype": "float16",
                           "kv_dtype": kv_dtype, "candidate": c.name, "block_n": c.block_n, "num_warps": c.num_warps,
                           "num_stages": c.num_stages, "switches": c.switches or {}, "v_layout": c.v_layout,
                           "caches_rotated": copies, "expect": c.expect}
                    try:
                        fns = [_candidate_fn(c, cache) for cache in caches]
                        o = fns[0]().double()
                        row.update(_newest_launch(), rel_err=float((o - exact).norm() / exact.norm()),
                                   max_abs_err=float((o - exact).abs().max()))
                        row["status"] = "ok" if row["rel_err"] < 1e-2 else "wrong"
                        if row["status"] == "ok":
                            kv_bytes = 2 * k.numel() * (1 if kv_dtype == "float8_e4m3fn" else k.element_size())
                            timed.append((row, rotated(fns), [], kv_bytes))
                    except Exception as err:  # noqa: BLE001 - a candidate that fails to build or run is a result
                        row.update(status="failed", error=f"{type(err).__name__}: {str(err).splitlines()[0][:200]}")
                    log(f"checked {c.name:20} {kv_dtype:14} page {page_size} N={n}: {row['status']} "
                        f"{row.get('error', '')}")
                    rows.append(row)
                del caches
        for round_ in range(rounds):
            if round_ and budget_s is not None and time.monotonic() - start_time > budget_s:
                log(f"budget of {budget_s} s spent: {round_} round(s) at N={n}")
                break
            for _row, fn, times, _bytes in timed:
                times.append(graph_ms(fn, rep=rep_ms) / copies)
        for row, _fn, times, kv_bytes in timed:
            row.update(timing_fields(times, kv_bytes))
        del timed, fp16_caches
        torch.cuda.empty_cache()
    _candidate_ratios(rows)
    return rows


def _exact(cache: dict, q, k, v, kv_dtype: str) -> torch.Tensor:
    """Attention in float64 on the values ``cache`` holds (the float16 cache, or the FP8 one dequantised), computed
    on the contiguous cache (a paged cache holds the same values)."""
    if kv_dtype == "float16":
        return reference_decode(q, k, v)
    from flashcourse.kernels import quantize_kv_cache

    k8, v8, k_scale, v_scale = quantize_kv_cache(k, v)  # the paged quantisation gives these values too
    return reference_decode(q, k8.double() * k_scale.double()[:, :, None, None],
                            v8.double() * v_scale.double()[:, :, None, None])


def _candidate_ratios(rows: list[dict]) -> None:
    """Each timed float8_e4m3fn row's ``speedup_vs_fp16_cache``: fp16_shipped's time at its layout and length over
    its own, with the range of the repeats where both have one."""
    timed = [r for r in rows if r.get("status") == "ok" and "ms" in r]
    shipped = {(r["kv_len"], r.get("page_size")): r for r in timed if r["candidate"] == "fp16_shipped"}
    for r in timed:
        base = shipped.get((r["kv_len"], r.get("page_size")))
        if r["kv_dtype"] == "float8_e4m3fn" and base is not None:
            r.update(_ratio(r, base, "speedup_vs_fp16_cache", "ms"))


def format_candidates(rows: list[dict]) -> str:
    """The candidates' rows as a table: layout, length, time, TB/s, speed-up over the float16 cache, and what
    the compiled kernel holds."""
    lines = [f"{'candidate':20}{'kv':>5}{'page':>5}{'KV len':>8}{'us':>8}{'TB/s':>7}{'vs fp16':>9}"
             f"{'regs':>6}{'shared':>8}{'fit':>5}{'splits':>7}  status"]
    for r in rows:
        kv = "fp8" if r["kv_dtype"] == "float8_e4m3fn" else "fp16"
        head = f"{r['candidate']:20}{kv:>5}{r.get('page_size') or '':>5}{r['kv_len']:>8}"
        if "ms" not in r:
            lines.append(f"{head}  {r.get('status')} {r.get('error', '')}")
            continue
        cells = [f"{r['ms'] * 1e3:8.1f}", f"{r['bandwidth_tbs']:7.2f}"]
        cells.append(f"{r['speedup_vs_fp16_cache']:9.2f}" if "speedup_vs_fp16_cache" in r else f"{'-':>9}")
        cells += [f"{r[key]:{width}}" if key in r else f"{'-':>{width}}"
                  for key, width in (("registers", 6), ("shared_bytes", 8), ("programs_per_sm_fit", 5),
                                     ("num_splits", 7))]
        lines.append(head + "".join(cells) + f"  {r['status']}")
    return "\n".join(lines)


def candidate_speedups(rows: list[dict], name: str) -> dict[tuple[int, int | None], float]:
    """{(KV length, page size or None for the contiguous cache): ``speedup_vs_fp16_cache``} of candidate ``name``'s
    timed rows in a candidates run (:func:`candidates`); empty when the run has no such candidate."""
    return {(r["kv_len"], r.get("page_size")): r["speedup_vs_fp16_cache"] for r in rows
            if r.get("candidate") == name and r.get("status") == "ok" and "speedup_vs_fp16_cache" in r}


def speedup_span(rows: list[dict], name: str, *, page_sizes=None, kv_lens=None) -> tuple[float, float]:
    """(slowest, fastest) ``speedup_vs_fp16_cache`` of candidate ``name`` over the layouts of a candidates run, or
    only those with a page size in ``page_sizes`` (None: the contiguous cache) and a length in ``kv_lens``."""
    values = [v for (kv_len, page), v in candidate_speedups(rows, name).items()
              if (page_sizes is None or page in page_sizes) and (kv_lens is None or kv_len in kv_lens)]
    if not values:
        raise ValueError(f"no timed rows of candidate {name!r} in these layouts")
    return min(values), max(values)


def speedup_table(rows: list[dict], names) -> str:
    """A markdown table of ``speedup_vs_fp16_cache``: one row per candidate of ``names``, one column per KV length
    and layout (the float16 cache's shipped launch at the same layout and length is 1)."""
    layouts = sorted({(r["kv_len"], r.get("page_size") or 0) for r in rows if "kv_len" in r},
                     key=lambda layout: (-layout[0], layout[1] or math.inf))
    heads = [f"{n // 1024}K, {f'pages of {p}' if p else 'contiguous'}" for n, p in layouts]
    lines = ["| candidate | " + " | ".join(heads) + " |", "|---|" + "---|" * len(layouts)]
    for name in names:
        speedups = candidate_speedups(rows, name)
        cells = [f"{speedups[(n, p or None)]:.2f}x" if (n, p or None) in speedups else "-" for n, p in layouts]
        lines.append(f"| `{name}` | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def split_kernel_profile(rows: list[dict]) -> dict[str, dict]:
    """What Nsight Compute measured of the split kernel in an ncu-limits run (``benchmarks/ncu_limits.py``; cases
    ``decode-fp16`` and ``decode-fp8``, 32K keys, contiguous), by cache dtype ("float16", "float8_e4m3fn"):
    ``programs`` (the grid's size), ``warps`` a program, ``duration_us``, ``dram_throughput_pct`` (DRAM busy, %
    of peak), ``inst_executed`` (warp instructions), ``issue_slots_busy_pct`` and ``eligible_warps_per_scheduler``
    (warps ready to issue, on average, per scheduler and cycle)."""
    profile = {}
    for kv_dtype, case in (("float16", "decode-fp16"), ("float8_e4m3fn", "decode-fp8")):
        row = next((r for r in rows if r.get("case") == case and r.get("kernel") == "_decode_split_kernel"), None)
        if row is None:
            continue
        grid = [int(x) for x in row["grid"].strip("()").split(",")]
        profile[kv_dtype] = {"programs": math.prod(grid), "warps": int(row["block"].strip("()").split(",")[0]) // 32,
                             **{key: row[key] for key in ("duration_us", "dram_throughput_pct", "inst_executed",
                                                          "issue_slots_busy_pct", "eligible_warps_per_scheduler")}}
    return profile
