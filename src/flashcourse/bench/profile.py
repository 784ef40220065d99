"""Where the time of one training step goes: Triton's profiler (proton) over our forward and backward kernels.

``python -m flashcourse.bench profile`` runs forward + backward of the default kernels under proton's shadow
context, one scope per shape, and writes one row per (shape, kernel): milliseconds per step and the kernel's
share of the step. It also records, from the compiled forward kernel's TTGIR, where the operands of its
matrix products live (shared memory or registers), the question lesson 07 asks about the Q tile.
"""

from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path

import torch

from flashcourse.bench.attention import Shape, make_inputs

SHAPES = [Shape("float16", 4, 32, 64, 8192, False), Shape("float16", 4, 16, 128, 8192, False),
          Shape("float16", 4, 16, 128, 8192, True)]
STEPS = 10


def _label(shape: Shape) -> str:
    return f"H{shape.heads} D{shape.head_dim} N{shape.n}{' causal' if shape.causal else ''}"


def _kernel_times(node: dict, labels: set[str], scope: str | None = None, out: dict | None = None) -> dict:
    """{(scope, kernel name): nanoseconds} from proton's hatchet tree, whose inner nodes include our scopes
    (``labels``) and whose leaves are the kernels launched inside them."""
    out = {} if out is None else out
    name = node.get("frame", {}).get("name", "")
    children = node.get("children", [])
    if scope is not None and not children:
        out[(scope, name)] = out.get((scope, name), 0.0) + float(node.get("metrics", {}).get("time (ns)", 0.0))
    for child in children:
        _kernel_times(child, labels, name if name in labels else scope, out)
    return out


def dot_operands(kernel) -> list[str]:
    """The TTGIR lines of the compiled kernel's matrix products (``warp_group_dot`` on Hopper, ``dot``
    elsewhere): an operand typed ``!ttg.memdesc`` is read from shared memory, a tensor ``#ttg.dot_op`` from
    registers. Empty when this Triton keeps its compiled kernels elsewhere."""
    lines = []
    for cache in getattr(kernel, "device_caches", {}).values():
        for compiled in cache[0].values():
            ttgir = compiled.asm.get("ttgir", "")
            lines += [line.strip() for line in ttgir.splitlines() if re.search(r"\b(warp_group_dot|tt\.dot)\b", line)]
    return lines


def run(shapes=SHAPES, log=print) -> list[dict]:
    """Rows: one per (shape, kernel) with ms per forward + backward step and its share; one with the dots."""
    import triton.profiler as proton

    from flashcourse import kernels

    steps = {}
    for shape in shapes:
        q, k, v, do = make_inputs(shape)

        def step(q=q, k=k, v=v, do=do, causal=shape.causal):
            torch.autograd.grad(kernels.flash_attention(q, k, v, causal=causal), (q, k, v), do)

        step()  # compile outside the profile
        steps[_label(shape)] = step
    torch.cuda.synchronize()
    # The backward must run on this thread: proton's scopes belong to the thread that opened them.
    with torch.autograd.set_multithreading_enabled(False), tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "flashcourse"
        proton.start(str(path), context="shadow")
        for label, step in steps.items():
            with proton.scope(label):
                for _ in range(STEPS):
                    step()
            torch.cuda.synchronize()
        proton.finalize()
        tree = json.loads(path.with_suffix(".hatchet").read_text())
    roots = tree if isinstance(tree, list) else [tree]
    times: dict = {}
    for root in roots:
        _kernel_times(root, set(steps), out=times)
    rows = []
    for label in steps:
        total = sum(ns for (scope, _), ns in times.items() if scope == label)
        for (scope, name), ns in sorted(times.items(), key=lambda item: -item[1]):
            if scope == label and ns > 0:
                rows.append({"shape": label, "kernel": name, "ms_per_step": ns / STEPS / 1e6, "share": ns / total})
                log(f"{label:22} {name:28} {ns / STEPS / 1e6:8.3f} ms  {ns / total:6.1%}")
    default = kernels.FORWARD_VERSIONS[kernels.DEFAULT_FORWARD].kernel  # the forward the steps above compiled
    dots = dot_operands(default)
    rows.append({"kernel": default.fn.__name__, "ttgir_dots": dots[:8]})
    for line in dots[:4]:
        log(line[:200])
    return rows
