"""The kernel version history: time every numbered version, sweep launch configs, and write docs/KERNELS.md.

``python -m flashcourse.bench versions`` validates then times each forward version (v1..v7) and backward
scheme (b1..b3) beside SDPA's flash and cuDNN backends, every time the median of ``bench.REPEATS`` repeats with
their range; ``tune`` sweeps block sizes / warps / stages on the current GPU (the source of the sm_90 numbers in
``kernels/configs.py``); ``table`` turns the committed JSON into the markdown table of ``docs/KERNELS.md``, where a
version is marked faster or slower than the one before only beyond both spreads (:func:`version_verdicts`).
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from flashcourse.bench import format_spread, load_results, tflops, verdict
from flashcourse.bench.attention import Shape, bench_ms, make_inputs, measure_shape, provider_fn, shape_grid

VERSION_SHAPES = shape_grid(dtypes=("float16",), seq_lens=(4096, 16384))


def _rel(a, b) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def _reference(q, k, v, do, causal):
    q32, k32, v32 = (t.detach().float().requires_grad_() for t in (q, k, v))
    o = provider_fn("sdpa_math")(q32, k32, v32, causal)
    return o, torch.autograd.grad(o, (q32, k32, v32), do.float())


def validate_versions(shape: Shape) -> dict:
    """Relative error of every forward version and backward scheme against SDPA math in float32."""
    from flashcourse import kernels

    small = Shape(shape.dtype, 1, 2, shape.head_dim, min(shape.n, 2048), shape.causal)
    q, k, v, do = make_inputs(small)
    o_ref, grads_ref = _reference(q, k, v, do, small.causal)
    errors = {}
    for name in kernels.FORWARD_VERSIONS:
        o, _ = kernels.flash_attention_forward(q, k, v, causal=small.causal, version=name)
        errors[name] = _rel(o, o_ref)
    for name in kernels.BACKWARD_VERSIONS:
        o = kernels.flash_attention(q, k, v, causal=small.causal, backward_version=name)
        grads = torch.autograd.grad(o, (q, k, v), do)
        errors[name] = max(_rel(g, r) for g, r in zip(grads, grads_ref, strict=True))
    return errors


def run_versions(shapes=VERSION_SHAPES, log=print) -> list[dict]:
    """Validate every version on every shape (any error over 2e-2 stops the run), then time them all."""
    from flashcourse import kernels

    rows = []
    for shape in shapes:
        errors = validate_versions(shape)
        log(f"validate {shape}: " + " ".join(f"{k}={e:.1e}" for k, e in errors.items()))
        bad = {k: e for k, e in errors.items() if not (math.isfinite(e) and e < 2e-2)}
        if bad:
            raise AssertionError(f"versions wrong on {shape}: {bad}")
        for name in kernels.FORWARD_VERSIONS:
            rows += measure_shape(shape, "flashcourse", modes=("fwd",), forward_version=name)
        for name in kernels.BACKWARD_VERSIONS:
            rows += measure_shape(shape, "flashcourse", modes=("bwd",), backward_version=name)
        for provider in ("sdpa_flash", "sdpa_cudnn"):
            rows += measure_shape(shape, provider)
        for r in rows[-(len(kernels.FORWARD_VERSIONS) + len(kernels.BACKWARD_VERSIONS) + 4):]:
            label = r.get("forward_version") or r.get("backward_version") or r["provider"]
            log(f"  {label:12} {r['mode']:4} {r.get('tflops', float('nan')):7.1f} TFLOP/s  {r['status']}")
    return rows


def _forward_candidates(block_d: int):
    from flashcourse.kernels.configs import KernelConfig

    picks = ((128, 64, 4, 2), (128, 64, 4, 3), (128, 64, 8, 2), (128, 64, 8, 3), (128, 128, 8, 2),
             (128, 128, 8, 3), (128, 128, 4, 2), (64, 64, 4, 3), (128, 32, 4, 3), (128, 64, 4, 4))
    return [KernelConfig(*p) for p in picks
            if 2 * block_d * (p[0] + 2 * p[3] * p[1]) <= 227 * 1024]


def _backward_candidates():
    from flashcourse.kernels.configs import KernelConfig

    dkdv = [KernelConfig(m, n, w, s) for m, n, w, s in
            ((32, 128, 4, 2), (32, 128, 4, 3), (64, 128, 8, 2), (64, 128, 4, 2), (32, 64, 4, 3))]
    dq = [KernelConfig(m, n, w, s) for m, n, w, s in
          ((128, 32, 4, 2), (128, 32, 4, 3), (128, 64, 8, 2), (128, 64, 4, 2), (64, 32, 4, 3))]
    return dkdv, dq


def tune(shapes, log=print) -> list[dict]:
    """Time the v5 forward and the b1 backward kernels under every candidate launch config."""
    rows = []
    for shape in shapes:
        rows += _tune_shape(shape, log)
    return rows


def _tune_shape(shape: Shape, log) -> list[dict]:
    from flashcourse.kernels import BACKWARD_VERSIONS, FORWARD_VERSIONS
    from flashcourse.kernels._checks import padded_head_dim
    from flashcourse.kernels.backward import run_backward
    from flashcourse.kernels.configs import KernelConfig
    from flashcourse.kernels.forward import run_forward

    fwd, bwd = FORWARD_VERSIONS["v5"], BACKWARD_VERSIONS["b1"]
    q, k, v, do = make_inputs(shape, requires_grad=False)
    rows = []

    def record(kernel, cfg, call, flops):
        try:
            rate = tflops(flops, bench_ms(call) * 1e-3)
        except Exception as err:  # noqa: BLE001 - a config that fails to compile is a result too
            rows.append({**shape.__dict__, "kernel": kernel, "config": cfg.__dict__, "error": str(err)[:120]})
            return 0.0
        rows.append({**shape.__dict__, "kernel": kernel, "config": cfg.__dict__, "tflops": rate})
        return rate

    fwd_rates = {cfg: record("fwd", cfg, lambda cfg=cfg: run_forward(fwd, q, k, v, causal=shape.causal, scale=None,
                                                                      config=cfg), shape.flops("fwd"))
                 for cfg in _forward_candidates(padded_head_dim(shape.head_dim))}
    best_fwd = max(fwd_rates, key=fwd_rates.get)
    log(f"tune fwd {shape}: best {best_fwd} {fwd_rates[best_fwd]:.1f} TFLOP/s")
    o, lse = run_forward(fwd, q, k, v, causal=shape.causal, scale=None)
    dkdv_candidates, dq_candidates = _backward_candidates()

    def backward_call(pair):
        return lambda: run_backward(bwd, q, k, v, o, lse, do, causal=shape.causal, scale=None,
                                    configs_override=pair)

    # dK/dV configs with a fixed dQ config, then dQ configs with the best dK/dV one.
    dkdv_rates = {c: record("bwd_dkdv", c, backward_call((c, dq_candidates[0])), shape.flops("bwd"))
                  for c in dkdv_candidates}
    best_dkdv = max(dkdv_rates, key=dkdv_rates.get, default=KernelConfig(32, 128, 4, 2))
    dq_rates = {c: record("bwd_dq", c, backward_call((best_dkdv, c)), shape.flops("bwd")) for c in dq_candidates}
    best_dq = max(dq_rates, key=dq_rates.get)
    log(f"tune bwd {shape}: dkdv {best_dkdv} dq {best_dq} {dq_rates[best_dq]:.1f} TFLOP/s")
    return rows


def registry_markdown() -> str:
    """Markdown: every numbered version, the kernel it launches, what it changed and what we predicted.
    The same first columns as :func:`kernels_table`, from one place (:func:`_version_cells`)."""
    from flashcourse.kernels import BACKWARD_VERSIONS, FORWARD_VERSIONS

    lines = ["| version | kernel | what changed | prediction |", "|---|---|---|---|"]
    lines += [f"| {' | '.join(_version_cells('fwd', name, ver))} |" for name, ver in FORWARD_VERSIONS.items()]
    lines += [f"| {' | '.join(_version_cells('bwd', name, ver))} |" for name, ver in BACKWARD_VERSIONS.items()]
    return "\n".join(lines) + "\n"


def _version_cells(mode: str, name: str, ver) -> list[str]:
    kernel = f"`{ver.kernel_name}`" if hasattr(ver, "kernel_name") else "`_bwd_dkdv_kernel` + " + (
        "atomics" if ver.atomic_dq else "`_bwd_dq_kernel`")
    return [f"{mode} {name} {ver.title}", kernel, ver.changes, ver.prediction]


VERDICT_MARKS = {"gain": " ▲", "loss": " ▼", "within spread": "", None: ""}


def _shape_of(row) -> tuple:
    return row["heads"], row["head_dim"], row["n"], row["causal"]


def _find_version(rows, provider: str, mode: str, shape: tuple, **match) -> dict | None:
    for r in rows:
        if (r["provider"] == provider and r["mode"] == mode and _shape_of(r) == shape
                and all(r.get(k) == v for k, v in match.items()) and r["status"] == "ok"):
            return r
    return None


def version_verdicts(rows: list[dict], mode: str = "fwd") -> list[dict]:
    """Each numbered version against the one before it on every shape of one versions run: ``verdict`` is
    ``"gain"`` or ``"loss"`` only when the repeats' ranges do not overlap (:func:`flashcourse.bench.verdict`),
    ``"within spread"`` when they do, None for a run recorded without repeats. Rows: {version, previous, shape
    (heads, head_dim, n, causal), tflops, previous_tflops, verdict}."""
    from flashcourse.kernels import BACKWARD_VERSIONS, FORWARD_VERSIONS

    names, key = (list(FORWARD_VERSIONS), "forward_version") if mode == "fwd" else \
        (list(BACKWARD_VERSIONS), "backward_version")
    shapes = sorted({_shape_of(r) for r in rows if r["mode"] == mode})
    found = []
    for previous, name in zip(names[:-1], names[1:], strict=True):
        for shape in shapes:
            new = _find_version(rows, "flashcourse", mode, shape, **{key: name})
            old = _find_version(rows, "flashcourse", mode, shape, **{key: previous})
            if new is not None and old is not None:
                found.append({"version": name, "previous": previous, "shape": shape, "tflops": new["tflops"],
                              "previous_tflops": old["tflops"], "verdict": verdict(new, old)})
    return found


def kernels_table(directory: Path | None = None) -> str:
    """Markdown: each version, what it changed, what we predicted and what the newest versions JSON measured
    (with the repeats' range, and the verdict against the version before, when the run has them)."""
    from flashcourse.kernels import BACKWARD_VERSIONS, FORWARD_VERSIONS

    found = load_results("*-versions.json", directory=directory)
    if not found:
        return "No versions results yet: run `python -m flashcourse.bench versions` on a GPU.\n"
    data = found[-1]
    meta, rows = data["meta"], data["rows"]
    shapes = sorted({_shape_of(r) for r in rows if r["mode"] == "fwd"})
    verdicts = {(v["version"], v["shape"]): v["verdict"] for mode in ("fwd", "bwd")
                for v in version_verdicts(rows, mode)}

    def cell(row, name=None, shape=None):
        if row is None:
            return "-"
        return format_spread(row) + VERDICT_MARKS[verdicts.get((name, shape))]

    head = " | ".join(f"H{h} D{d} N{n}{' c' if c else ''}" for h, d, n, c in shapes)
    spread = any("tflops_min" in r for r in rows)
    legend = (f" Each cell: the median of {max(r.get('repeats', 0) for r in rows)} repeats (slowest-fastest); "
              "▲ / ▼: faster / slower than the version above beyond both ranges, no mark: within them." if spread
              else "")
    lines = [
        f"Measured on {meta['device']}, {meta['date']}, torch {meta.get('torch')}, triton {meta.get('triton')}; "
        f"fp16, B=4, TFLOP/s (file `{Path(data['path']).name}`; `c` = causal).{legend}",
        "",
        f"| version | kernel | what changed | prediction | {head} |",
        "|---|---|---|---|" + "---|" * len(shapes),
    ]
    for mode, registry, key in (("fwd", FORWARD_VERSIONS, "forward_version"),
                                ("bwd", BACKWARD_VERSIONS, "backward_version")):
        for name, ver in registry.items():
            cells = " | ".join(cell(_find_version(rows, "flashcourse", mode, s, **{key: name}), name, s)
                               for s in shapes)
            lines.append(f"| {' | '.join(_version_cells(mode, name, ver))} | {cells} |")
        for provider in ("sdpa_flash", "sdpa_cudnn"):
            cells = " | ".join(cell(_find_version(rows, provider, mode, s)) for s in shapes)
            lines.append(f"| {mode} {provider} | | reference, same run | | {cells} |")
    return "\n".join(lines) + "\n"
