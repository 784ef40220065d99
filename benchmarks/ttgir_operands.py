"""Where the forward kernel's matrix-product operands live on Hopper, without a Hopper GPU.

Compiles v6 (the dense loop of the default forward; D = 128, 128 x 128 tiles, 8 warps, 3 stages, fp16) ahead of
time for sm_90 and keeps the TTGIR lines of its two ``warp_group_dot``s: an operand typed ``!ttg.memdesc`` is
read by the tensor cores from shared memory, a tensor with a ``#ttg.dot_op`` layout from registers. Writes
``benchmarks/results/<date>-sm90-aot-ttgir.json`` (lesson 07 reads it). Run from a checkout:
``PYTHONPATH=src python benchmarks/ttgir_operands.py`` (any machine with Triton; no GPU needed).
"""

from __future__ import annotations

import datetime
import json
import re
from pathlib import Path

import flashcourse.device

flashcourse.device.setup = lambda: "cuda"  # real @triton.jit kernels even without a GPU: we only compile them

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from flashcourse.kernels.teaching import forward as teaching  # noqa: E402  (v6, the step before v7)

CONSTANTS = {"CAUSAL": False, "HEAD_DIM": 128, "BLOCK_D": 128, "BLOCK_M": 128, "BLOCK_N": 128, "DOT_PRECISION": "tf32"}


def signature() -> dict[str, str]:
    types = {name: "*fp16" for name in ("Q", "K", "V", "O")} | {"LSE": "*fp32", "qk_scale": "fp32"}
    types |= {f"stride_{t}{axis}": "i32" for t in "qkvo" for axis in "bhnd"}
    types |= {name: "i32" for name in ("H", "N_Q", "N_KV")}
    return types | dict.fromkeys(CONSTANTS, "constexpr")


def main() -> None:
    kernel = teaching._fwd_v6_kernel
    constexprs = {(kernel.arg_names.index(name),): value for name, value in CONSTANTS.items()}
    compiled = triton.compile(ASTSource(fn=kernel, signature=signature(), constexprs=constexprs),
                              target=GPUTarget("cuda", 90, 32), options={"num_warps": 8, "num_stages": 3})
    dots = [line.strip() for line in compiled.asm["ttgir"].splitlines()
            if re.search(r"= ttng\.warp_group_dot ", line)]
    out = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
    path = out / f"{datetime.date.today().isoformat()}-sm90-aot-ttgir.json"
    meta = {"date": datetime.date.today().isoformat(), "triton": triton.__version__, "target": "sm_90 (ahead of time)",
            "kernel": "_fwd_v6_kernel", "launch": "D=128, 128x128 tiles, 8 warps, 3 stages, fp16"}
    path.write_text(json.dumps({"meta": meta, "rows": [{"ttgir_dot": line} for line in dots[:2]]}, indent=1) + "\n")
    for line in dots[:2]:
        print(line[:220])
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
