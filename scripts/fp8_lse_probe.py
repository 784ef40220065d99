"""The FP8 forward's lse error as a ratio of scale * sum |q_i k_i|, across magnitudes and head dims (Hopper).

Why: the tensor core truncates FP8 sums to about 14 bits (DeepSeek-V3, section 3.3.2); a ratio that stays put as
the inputs grow says the error is that rounding, not the kernel's descales. Writes ``$OUT/fp8_lse_probe.json``
(or ``./``); ``benchmarks/results/2026-12-01-nvidia-h200-fp8-lse-accumulation.json`` is its H200 run. From a
checkout on a GPU of compute capability 9.0: ``PYTHONPATH=src python scripts/fp8_lse_probe.py``.
"""

from __future__ import annotations

import json
import math
import os

import torch

from flashcourse.kernels import fp8


def probe(head_dim: int, size: float) -> dict:
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(2, 4, 500, head_dim, device="cuda", generator=g) * size
    k = torch.randn(2, 2, 500, head_dim, device="cuda", generator=g) * size
    v = torch.randn(2, 2, 500, head_dim, device="cuda", generator=g) / size
    x = fp8.quantize_fp8(q, k, v)
    _, lse = fp8.flash_attention_forward_fp8(x.q, x.k, x.v, **x.descales(), causal=True)
    qd, kd, vd = x.dequantized()
    _, lse_ref, _ = fp8.reference_forward(qd, kd, vd, causal=True)
    k_rep = kd.double().repeat_interleave(2, 1)
    s_abs = (qd.double().abs() @ k_rep.abs().transpose(-1, -2)).amax(-1) / head_dim**0.5
    seen = torch.isfinite(lse_ref)
    err = (lse.double() - lse_ref)[seen]
    ratio = (err.abs() / s_abs[seen]).max().item()
    return {"d": head_dim, "size": size, "lse_err_max": err.abs().max().item(), "s_abs_max": s_abs.max().item(),
            "ratio_max": ratio, "log2_ratio": math.log2(ratio), "mean_signed_err": err.mean().item()}


def main() -> None:
    rows = []
    for head_dim in fp8.FP8_HEAD_DIMS:
        for size in (0.5, 2.0, 5.0, 10.0, 20.0):
            rows.append(probe(head_dim, size))
            print(rows[-1], flush=True)
    with open(os.path.join(os.environ.get("OUT", "."), "fp8_lse_probe.json"), "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
