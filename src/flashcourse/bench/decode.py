"""GPU benchmark of decoding: one query token against a long KV cache, grouped-query attention.

Decoding reads every K and V byte once and does little arithmetic per byte, so the measure is effective
bandwidth: bytes of K and V / time, compared with two ceilings measured in the same run (a large copy, bytes
read + written, and a large sum, bytes read), with the data sheet's 4.8 TB/s for the H200, and with SDPA
(``enable_gqa=True``) in the same run. Kernels this short (tens of
microseconds) are timed as CUDA-graph replays so that Python launch overhead stays out of every provider.
"""

from __future__ import annotations

import math

import torch

from flashcourse.bench.providers import add_ratios as shared_add_ratios
from flashcourse.bench.providers import sdpa

DECODE_SHAPES = ((1, 32, 8, 128, 32768), (1, 32, 8, 128, 131072))  # (B, H_q, H_kv, D, KV length)
PROVIDERS = ("flashcourse", "flashcourse_paged", "sdpa_flash", "sdpa_cudnn", "sdpa_efficient",
             "sdpa_flash_expanded")
PAGE_SIZE = 256


def graph_ms(fn) -> float:
    """Median milliseconds of fn replayed from a CUDA graph (no launch overhead in the number)."""
    import triton.testing

    return float(triton.testing.do_bench_cudagraph(fn, rep=100, return_mode="median"))


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


def provider_fn(provider: str, q, k, v, **decode_kwargs):
    """A no-argument callable computing o (B, H_q, D) for one provider."""
    from flashcourse import kernels

    if provider == "flashcourse":
        return lambda: kernels.flash_decode(q, k, v, **decode_kwargs)
    if provider == "flashcourse_paged":
        kp, vp, table = to_paged(k, v, PAGE_SIZE)
        lens = torch.full((q.shape[0],), k.shape[2], dtype=torch.int32, device=q.device)
        return lambda: kernels.flash_decode(q, kp, vp, block_table=table, cache_seqlens=lens, **decode_kwargs)
    q4 = q[:, :, None, :]  # (B, H_q, 1, D)
    if provider == "sdpa_flash_expanded":  # the cache copied out to H_q heads: 4x the bytes
        group = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        provider = "sdpa_flash"
    attend = sdpa(provider, enable_gqa=True)
    return lambda: attend(q4, k, v)[:, :, 0]


def run(shapes=DECODE_SHAPES, providers=PROVIDERS, log=print) -> list[dict]:
    """Measure the bandwidth ceilings, validate our decode (contiguous and paged), then time every provider.

    Rows: one per ceiling (``copy`` counts bytes read + written, ``read`` bytes read), then one per provider and
    KV length with TB/s, ratios and ``fraction_of_ceiling``: the share of the best bandwidth seen in this run
    (a ceiling or, should a kernel beat both, that kernel), so it never exceeds 1."""
    ceilings = {"copy": copy_bandwidth(), "read": read_bandwidth()}
    log(" ".join(f"{name} {bw / 1e12:.2f} TB/s" for name, bw in ceilings.items()))
    rows = [{"provider": name, "bandwidth_tbs": bw / 1e12} for name, bw in ceilings.items()]
    for batch, h_q, h_kv, d, n in shapes:
        q, k, v = make_cache(batch, h_q, h_kv, d, n)
        kv_bytes = 2 * k.numel() * k.element_size()
        ref = provider_fn("sdpa_math", q.float(), k.float(), v.float())()
        shape = {"batch": batch, "h_q": h_q, "h_kv": h_kv, "head_dim": d, "kv_len": n, "dtype": "float16"}
        for provider in providers:
            row = {"provider": provider, **shape}
            try:
                fn = provider_fn(provider, q, k, v)
                err = float((fn().float() - ref).norm() / ref.norm())
                ms = graph_ms(fn)
                row.update(status="ok", ms=ms, rel_err=err, bandwidth_tbs=kv_bytes / (ms * 1e-3) / 1e12)
                if provider.startswith("flashcourse") and not err < 1e-2:
                    raise AssertionError(f"{provider} decode is wrong: relative error {err:.2e}")
            except torch.cuda.OutOfMemoryError:
                row["status"] = "oom"
            except RuntimeError as e:
                row.update(status="unsupported", error=str(e).splitlines()[0][:200])
            torch.cuda.empty_cache()
            rows.append(row)
            log(f"{provider:20} N={n:7} {row.get('bandwidth_tbs', float('nan')):5.2f} TB/s "
                f"{row.get('ms', float('nan')) * 1e3:8.1f} us  {row['status']}")
    best = max(r["bandwidth_tbs"] for r in rows if "bandwidth_tbs" in r)
    if best > max(ceilings.values()) / 1e12:
        log(f"a kernel ({best:.2f} TB/s) beat both measured ceilings: fractions are of that kernel's bandwidth")
    for r in rows:
        if "kv_len" in r and "bandwidth_tbs" in r:
            r["fraction_of_ceiling"] = r["bandwidth_tbs"] / best
    add_ratios(rows)
    return rows


def add_ratios(rows: list[dict]) -> None:
    """Each of our rows gets its bandwidth ratio against every SDPA provider at the same KV length."""
    sdpa_rows = [r for r in rows if r["provider"].startswith(("flashcourse", "sdpa"))]
    shared_add_ratios(sdpa_rows, rate="bandwidth_tbs", ours=("flashcourse", "flashcourse_paged"),
                      key=lambda r: r["kv_len"])


def tune(shapes=DECODE_SHAPES, log=print) -> list[dict]:
    """Sweep num_splits, block_n, warps and stages of our decode kernel; rows with TB/s."""
    rows = []
    for batch, h_q, h_kv, d, n in shapes:
        q, k, v = make_cache(batch, h_q, h_kv, d, n)
        kv_bytes = 2 * k.numel() * k.element_size()
        best = None
        for splits in (16, 33, 66, 132, 264):
            for block_n in (32, 64, 128):
                for warps, stages in ((4, 2), (4, 3), (4, 4), (8, 3)):
                    kw = {"num_splits": splits, "block_n": block_n, "num_warps": warps, "num_stages": stages}
                    try:
                        ms = graph_ms(provider_fn("flashcourse", q, k, v, **kw))
                    except Exception as err:  # noqa: BLE001 - a config that does not compile is a result
                        rows.append({"kv_len": n, **kw, "error": str(err)[:120]})
                        continue
                    tbs = kv_bytes / (ms * 1e-3) / 1e12
                    rows.append({"kv_len": n, **kw, "bandwidth_tbs": tbs})
                    best = max(best or (0, None), (tbs, kw), key=lambda t: t[0])
        log(f"tune decode N={n}: best {best}")
    return rows


def format_table(rows: list[dict]) -> str:
    """Our decode beside SDPA: time, TB/s, share of the best bandwidth of the run (ceilings included, so never
    above 100%) and our ratios to SDPA flash and cuDNN."""
    best = max(r["bandwidth_tbs"] for r in rows if "bandwidth_tbs" in r)
    lines = [f"{'provider':22}{'KV len':>8}{'us':>9}{'TB/s':>7}{'% best':>8}   ours/flash  ours/cudnn"]
    for r in rows:
        if r.get("status") != "ok":
            if "kv_len" in r:
                lines.append(f"{r['provider']:22}{r['kv_len']:>8}   {r.get('status')}")
            continue
        ratios = "".join(f"{r[key]:11.2f}" if key in r else "          -"
                         for key in ("ratio_vs_sdpa_flash", "ratio_vs_sdpa_cudnn"))
        lines.append(f"{r['provider']:22}{r['kv_len']:>8}{r['ms'] * 1e3:9.1f}{r['bandwidth_tbs']:7.2f}"
                     f"{100 * r['bandwidth_tbs'] / best:7.0f}%{ratios}")
    return "\n".join(lines)
