"""GPU benchmark of decoding: one query token against a long KV cache, grouped-query attention.

Decoding reads every K and V byte once and does little arithmetic per byte, so the measure is effective
bandwidth: bytes of K and V / time, compared with two ceilings measured in the same run (a large copy, bytes
read + written, and a large sum, bytes read), with the data sheet's 4.8 TB/s for the H200, and with SDPA
(``enable_gqa=True``) in the same run. Kernels this short (tens of
microseconds) are timed as CUDA-graph replays so that Python launch overhead stays out of every provider.

Our kernel runs on the contiguous cache (provider ``flashcourse``, one row per KV length) and on the same cache
cut into shuffled pages (``flashcourse_paged``, one row per ``page_size``: vLLM's default 16 and a large 256),
with ``ratio_vs_contiguous``. Every figure is the median of :data:`REPEATS` timings taken in rounds over all the
providers of a shape (so a drift of the clocks touches them all), stored with the slowest and fastest
(``ms_min``, ``ms_max``, ``bandwidth_tbs_min``, ``bandwidth_tbs_max``).
"""

from __future__ import annotations

import math
import statistics

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


def provider_fn(provider: str, q, k, v, *, page_size: int = PAGE_SIZE, **decode_kwargs):
    """A no-argument callable computing o (B, H_q, D) for one provider (``page_size``: the paged provider's)."""
    from flashcourse import kernels

    if provider == "flashcourse":
        return lambda: kernels.flash_decode(q, k, v, **decode_kwargs)
    if provider == "flashcourse_paged":
        kp, vp, table = to_paged(k, v, page_size)
        lens = torch.full((q.shape[0],), k.shape[2], dtype=torch.int32, device=q.device)
        return lambda: kernels.flash_decode(q, kp, vp, block_table=table, cache_seqlens=lens, **decode_kwargs)
    q4 = q[:, :, None, :]  # (B, H_q, 1, D)
    if provider == "sdpa_flash_expanded":  # the cache copied out to H_q heads: 4x the bytes
        group = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        provider = "sdpa_flash"
    attend = sdpa(provider, enable_gqa=True)
    return lambda: attend(q4, k, v)[:, :, 0]


def timing_fields(times_ms: list[float], kv_bytes: int) -> dict:
    """The median and range of repeated timings, in ms and in TB/s (the slowest repeat gives the lowest rate)."""
    def tbs(ms):
        return kv_bytes / (ms * 1e-3) / 1e12

    ms, lo, hi = statistics.median(times_ms), min(times_ms), max(times_ms)
    return {"ms": ms, "ms_min": lo, "ms_max": hi, "repeats": len(times_ms),
            "bandwidth_tbs": tbs(ms), "bandwidth_tbs_min": tbs(hi), "bandwidth_tbs_max": tbs(lo)}


def run(shapes=DECODE_SHAPES, providers=PROVIDERS, page_sizes=PAGE_SIZES, repeats: int = REPEATS,
        log=print) -> list[dict]:
    """Measure the bandwidth ceilings, validate every provider, then time them in ``repeats`` rounds.

    Rows: one per ceiling (``copy`` counts bytes read + written, ``read`` bytes read), then one per provider and
    KV length (``flashcourse_paged``: one per page size, with ``page_size``) with TB/s, ratios and
    ``fraction_of_ceiling``: the share of the best bandwidth seen in this run (a ceiling or, should a kernel beat
    both, that kernel), so it never exceeds 1."""
    if repeats < 3:
        raise ValueError(f"repeats={repeats}: a spread needs at least 3 repeats")
    ceilings = {"copy": copy_bandwidth(), "read": read_bandwidth()}
    log(" ".join(f"{name} {bw / 1e12:.2f} TB/s" for name, bw in ceilings.items()))
    rows = [{"provider": name, "bandwidth_tbs": bw / 1e12} for name, bw in ceilings.items()]
    for batch, h_q, h_kv, d, n in shapes:
        q, k, v = make_cache(batch, h_q, h_kv, d, n)
        kv_bytes = 2 * k.numel() * k.element_size()
        ref = provider_fn("sdpa_math", q.float(), k.float(), v.float())()
        shape = {"batch": batch, "h_q": h_q, "h_kv": h_kv, "head_dim": d, "kv_len": n, "dtype": "float16"}
        shape_rows, timed = [], []  # timed: (row, fn, times), validated and timed once already
        for provider in providers:
            for page_size in page_sizes if provider == "flashcourse_paged" else (None,):
                row = {"provider": provider, **shape}
                if page_size is not None:
                    row["page_size"] = page_size
                try:
                    fn = provider_fn(provider, q, k, v, page_size=page_size or PAGE_SIZE)
                    err = float((fn().float() - ref).norm() / ref.norm())
                    row.update(status="ok", rel_err=err)
                    if provider.startswith("flashcourse") and not err < 1e-2:
                        raise AssertionError(f"{provider} decode is wrong: relative error {err:.2e}")
                    timed.append((row, fn, [graph_ms(fn)]))
                except torch.cuda.OutOfMemoryError:
                    row["status"] = "oom"
                except RuntimeError as e:
                    row.update(status="unsupported", error=str(e).splitlines()[0][:200])
                shape_rows.append(row)
        for _ in range(repeats - 1):  # the remaining rounds, every provider once per round
            for _row, fn, times in timed:
                times.append(graph_ms(fn))
        for row, _fn, times in timed:
            row.update(timing_fields(times, kv_bytes))
        for row in shape_rows:
            page = f" page {row['page_size']}" if "page_size" in row else ""
            log(f"{row['provider'] + page:28} N={n:7} {row.get('bandwidth_tbs', float('nan')):5.2f} TB/s "
                f"{row.get('ms', float('nan')) * 1e3:8.1f} us  {row['status']}")
        rows.extend(shape_rows)
        del timed
        torch.cuda.empty_cache()
    best = max(r["bandwidth_tbs"] for r in rows if "bandwidth_tbs" in r)
    if best > max(ceilings.values()) / 1e12:
        log(f"a kernel ({best:.2f} TB/s) beat both measured ceilings: fractions are of that kernel's bandwidth")
    for r in rows:
        if "kv_len" in r and "bandwidth_tbs" in r:
            r["fraction_of_ceiling"] = r["bandwidth_tbs"] / best
    add_ratios(rows)
    return rows


def add_ratios(rows: list[dict]) -> None:
    """Each of our rows gets its bandwidth ratio against every SDPA provider at the same KV length; each paged
    row also ``ratio_vs_contiguous``, against ``flashcourse`` at its KV length (with the range of the repeats
    where both rows have one: our slowest over its fastest, and the reverse)."""
    sdpa_rows = [r for r in rows if r["provider"].startswith(("flashcourse", "sdpa"))]
    shared_add_ratios(sdpa_rows, rate="bandwidth_tbs", ours=("flashcourse", "flashcourse_paged"),
                      key=lambda r: r["kv_len"])
    contiguous = {r["kv_len"]: r for r in rows
                  if r["provider"] == "flashcourse" and r.get("status") == "ok" and r.get("bandwidth_tbs")}
    for r in rows:
        base = contiguous.get(r.get("kv_len"))
        if r["provider"] != "flashcourse_paged" or r.get("status") != "ok" or base is None:
            continue
        r["ratio_vs_contiguous"] = r["bandwidth_tbs"] / base["bandwidth_tbs"]
        if all(x.get(f"bandwidth_tbs_{end}") for x in (r, base) for end in ("min", "max")):
            r["ratio_vs_contiguous_min"] = r["bandwidth_tbs_min"] / base["bandwidth_tbs_max"]
            r["ratio_vs_contiguous_max"] = r["bandwidth_tbs_max"] / base["bandwidth_tbs_min"]


TUNE_SPLITS = (16, 33, 66)
TUNE_BLOCKS = (32, 64, 128)
TUNE_WARPS_STAGES = ((4, 2), (4, 3), (4, 4), (8, 3))


def tune(shapes=DECODE_SHAPES, page_sizes=PAGE_SIZES, log=print) -> list[dict]:
    """Sweep num_splits, block_n, warps and stages of our decode kernel on the contiguous cache and on the paged
    one at each page size; rows with ``provider``, ``page_size`` (paged), the launch and TB/s (one timing each:
    a sweep, not a result; confirm its winner with :func:`run`)."""
    rows = []
    for batch, h_q, h_kv, d, n in shapes:
        q, k, v = make_cache(batch, h_q, h_kv, d, n)
        kv_bytes = 2 * k.numel() * k.element_size()
        for provider, page_size in [("flashcourse", None)] + [("flashcourse_paged", p) for p in page_sizes]:
            layout = {"provider": provider, "kv_len": n} | ({"page_size": page_size} if page_size else {})
            best = None
            for splits in TUNE_SPLITS:
                for block_n in TUNE_BLOCKS:
                    for warps, stages in TUNE_WARPS_STAGES:
                        kw = {"num_splits": splits, "block_n": block_n, "num_warps": warps, "num_stages": stages}
                        try:
                            ms = graph_ms(provider_fn(provider, q, k, v, page_size=page_size or PAGE_SIZE, **kw),
                                          rep=20)
                        except Exception as err:  # noqa: BLE001 - a config that does not compile is a result
                            rows.append({**layout, **kw, "error": str(err)[:120]})
                            continue
                        tbs = kv_bytes / (ms * 1e-3) / 1e12
                        rows.append({**layout, **kw, "bandwidth_tbs": tbs})
                        best = max(best or (0, None), (tbs, kw), key=lambda t: t[0])
            log(f"tune decode {provider} page {page_size} N={n}: best {best}")
            torch.cuda.empty_cache()
    return rows


def format_table(rows: list[dict]) -> str:
    """Our decode beside SDPA: time, TB/s (with the repeats' range when recorded), share of the best bandwidth
    of the run (ceilings included, so never above 100%), the paged rows' ratio to the contiguous cache, and our
    ratios to SDPA flash and cuDNN. Reads older results too (no ``page_size``, no ranges)."""
    rows = [r for r in rows if "provider" in r]  # a tune file's rows have none
    best = max((r["bandwidth_tbs"] for r in rows if "bandwidth_tbs" in r), default=float("nan"))
    lines = [f"{'provider':20}{'page':>5}{'KV len':>8}{'us':>8}  {'TB/s (min-max)':18}{'% best':>7}"
             f"{'vs contig':>11}{'vs flash':>10}{'vs cudnn':>10}"]
    for r in rows:
        if "kv_len" not in r:
            continue
        head = f"{r['provider']:20}{r.get('page_size', ''):>5}{r['kv_len']:>8}"
        if r.get("status") != "ok":
            lines.append(f"{head}   {r.get('status')}")
            continue
        ratios = "".join(f"{r[key]:{width}.2f}" if key in r else f"{'-':>{width}}"
                         for key, width in (("ratio_vs_contiguous", 11), ("ratio_vs_sdpa_flash", 10),
                                            ("ratio_vs_sdpa_cudnn", 10)))
        lines.append(f"{head}{r['ms'] * 1e3:8.1f}  {format_spread(r, 'bandwidth_tbs', '.2f'):18}"
                     f"{100 * r['bandwidth_tbs'] / best:6.0f}%{ratios}")
    return "\n".join(lines)
