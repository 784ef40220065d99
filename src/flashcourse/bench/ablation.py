"""What the non-matmul work of the forward costs, measured rather than guessed (lesson 09).

The v6 kernel is timed as it is, then with the rescaling by exp(m_old - m_new) removed, then with the
exponentials removed too. Both variants compute the WRONG answer on purpose: they exist only to be timed.
The time they save is what the online softmax's rescaling, and the whole softmax, cost inside the kernel.
"""

from __future__ import annotations

from functools import partial

import torch

from flashcourse.bench import tflops
from flashcourse.bench.attention import Shape, bench_ms, make_inputs

VARIANTS = {0: "v6 (exact)", 1: "no rescaling (wrong on purpose)", 2: "no softmax at all (wrong on purpose)"}
SHAPES = [Shape("float16", 4, 32, 64, 8192, False), Shape("float16", 4, 16, 128, 8192, False),
          Shape("float16", 4, 16, 128, 8192, True)]


def run(shapes=SHAPES, log=print) -> list[dict]:
    """One row per (shape, variant): ms, TFLOP/s (counting only the two matmuls) and the time saved."""
    from flashcourse.kernels import FORWARD_VERSIONS
    from flashcourse.kernels.forward import run_forward

    rows = []
    for shape in shapes:
        q, k, v, _ = make_inputs(shape, requires_grad=False)
        exact_ms = None
        for ablate, label in VARIANTS.items():
            ms = bench_ms(partial(run_forward, FORWARD_VERSIONS["v6"], q, k, v, causal=shape.causal, scale=None,
                                  ablate=ablate))
            exact_ms = ms if ablate == 0 else exact_ms
            row = {**shape.__dict__, "variant": label, "ablate": ablate, "ms": ms,
                   "tflops": tflops(shape.flops("fwd"), ms * 1e-3), "saved_fraction": 1.0 - ms / exact_ms}
            rows.append(row)
            log(f"{shape}  {label:38s} {ms:7.3f} ms  {row['tflops']:6.1f} TFLOP/s  saved {row['saved_fraction']:+.1%}")
        torch.cuda.empty_cache()
    return rows
