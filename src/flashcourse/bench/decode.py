"""GPU benchmark of decoding: one query token against a long KV cache, grouped-query attention.

Decoding reads every K and V byte once and does little arithmetic per byte, so the measure is effective
bandwidth: bytes of K and V / time, compared with the device's copy bandwidth (bytes read + written by a
large device-to-device copy) and with SDPA (``enable_gqa=True``) in the same run. Kernels this short (tens of
microseconds) are timed as CUDA-graph replays so that Python launch overhead stays out of every provider.
"""

from __future__ import annotations

import math

import torch

DECODE_SHAPES = ((1, 32, 8, 128, 32768), (1, 32, 8, 128, 131072))  # (B, H_q, H_kv, D, KV length)
PROVIDERS = ("flashcourse", "flashcourse_paged", "sdpa_flash", "sdpa_cudnn", "sdpa_efficient",
             "sdpa_flash_expanded")
PAGE_SIZE = 256


def graph_ms(fn) -> float:
    """Median milliseconds of fn replayed from a CUDA graph (no launch overhead in the number)."""
    import triton.testing

    return float(triton.testing.do_bench_cudagraph(fn, rep=100, return_mode="median"))


def copy_bandwidth(nbytes: int = 1 << 30) -> float:
    """Bytes read plus written per second by a device-to-device copy of ``nbytes``: the practical ceiling.

    The GPU is kept busy for a while first: from idle clocks the first copies run far below the ceiling."""
    src = torch.empty(nbytes // 2, dtype=torch.float16, device="cuda").normal_()
    dst = torch.empty_like(src)
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)
    for _ in range(100):  # about half a second of matrix products: clocks up
        a @ a
    ms = graph_ms(lambda: dst.copy_(src))
    return 2 * nbytes / (ms * 1e-3)


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
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from flashcourse import kernels

    if provider == "flashcourse":
        return lambda: kernels.flash_decode(q, k, v, **decode_kwargs)
    if provider == "flashcourse_paged":
        kp, vp, table = to_paged(k, v, PAGE_SIZE)
        lens = torch.full((q.shape[0],), k.shape[2], dtype=torch.int32, device=q.device)
        return lambda: kernels.flash_decode(q, kp, vp, block_table=table, cache_seqlens=lens, **decode_kwargs)
    backend = {"sdpa_flash": SDPBackend.FLASH_ATTENTION, "sdpa_cudnn": SDPBackend.CUDNN_ATTENTION,
               "sdpa_efficient": SDPBackend.EFFICIENT_ATTENTION, "sdpa_flash_expanded": SDPBackend.FLASH_ATTENTION,
               "sdpa_math": SDPBackend.MATH}[provider]
    q4 = q[:, :, None, :]  # (B, H_q, 1, D)
    if provider == "sdpa_flash_expanded":  # the cache copied out to H_q heads: 4x the bytes
        group = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)

    def run():
        with sdpa_kernel([backend]):
            return F.scaled_dot_product_attention(q4, k, v, enable_gqa=True)[:, :, 0]

    return run


def run(shapes=DECODE_SHAPES, providers=PROVIDERS, log=print) -> list[dict]:
    """Validate our decode (contiguous and paged) then time every provider; rows with TB/s and ratios."""
    copy = copy_bandwidth()  # measured again at the end; the better of the two is the ceiling
    log(f"copy bandwidth {copy / 1e12:.2f} TB/s")
    rows = [{"provider": "copy", "bandwidth_tbs": copy / 1e12}]
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
                row["fraction_of_copy"] = row["bandwidth_tbs"] * 1e12 / copy
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
    copy = max(copy, copy_bandwidth())
    log(f"copy bandwidth {copy / 1e12:.2f} TB/s (best of two)")
    rows[0]["bandwidth_tbs"] = copy / 1e12
    for r in rows[1:]:
        if "bandwidth_tbs" in r:
            r["fraction_of_copy"] = r["bandwidth_tbs"] * 1e12 / copy
    add_ratios(rows)
    return rows


def add_ratios(rows: list[dict]) -> None:
    for r in rows:
        if r["provider"].startswith("flashcourse") and r.get("status") == "ok":
            for other in rows:
                if (other.get("kv_len") == r["kv_len"] and other["provider"].startswith("sdpa")
                        and other.get("status") == "ok"):
                    r[f"ratio_vs_{other['provider']}"] = r["bandwidth_tbs"] / other["bandwidth_tbs"]


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
    lines = [f"{'provider':22}{'KV len':>8}{'us':>9}{'TB/s':>7}{'% copy':>8}   ours/flash  ours/cudnn"]
    for r in rows:
        if r.get("status") != "ok":
            if "kv_len" in r:
                lines.append(f"{r['provider']:22}{r['kv_len']:>8}   {r.get('status')}")
            continue
        ratios = "".join(f"{r[key]:11.2f}" if key in r else "          -"
                         for key in ("ratio_vs_sdpa_flash", "ratio_vs_sdpa_cudnn"))
        lines.append(f"{r['provider']:22}{r['kv_len']:>8}{r['ms'] * 1e3:9.1f}{r['bandwidth_tbs']:7.2f}"
                     f"{100 * r['fraction_of_copy']:7.0f}%{ratios}")
    return "\n".join(lines)
