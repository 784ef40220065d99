"""Compile the FP8 Gluon forward's stages (``flashcourse.kernels.hopper.fa3_fp8``) for sm_90, no GPU needed.

``scripts/fa3_compile.py`` for the FP8 stages: each (stage, head dim, causal) is compiled to a cubin with the
installed Triton's ptxas and read back: registers a thread at launch, spill bytes, shared memory, the
``setmaxnreg`` budgets and the e4m3 ``wgmma`` instructions in the PTX, the ``stmatrix`` and proxy fences of the V
transpose. And one thing a resource count cannot show: where ptxas put the consumers' exponentials. For every
stretch of SASS between a ``WARPGROUP.DEPBAR.LE gsb0, 0x1`` (QK^T(j) landed, P(j-1) V(j-1) still running) and the
next ``...0x0`` (that product landed), ``overlapped_ex2`` counts the ``MUFU.EX2`` in it: the exponentials that
run under the tensor cores' work. v8e_fp8 should show all of a tile's (64 of p, 2 of alpha) in every loop.

    PYTHONPATH=src python scripts/fa3_fp8_compile.py                          # every stage, D 64 and 128, causal
    PYTHONPATH=src python scripts/fa3_fp8_compile.py --all --json out.json    # causal and not
    PYTHONPATH=src python scripts/fa3_fp8_compile.py --stage v8e_fp8 --head-dim 128

Exit status 1 when a variant fails to compile or its shared memory exceeds sm_90's 227 KB a block.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field

OUT_DTYPE = "bfloat16"


def _fa3_compile():
    """scripts/fa3_compile.py, imported when first needed: importing it turns the Triton interpreter off for this
    process (it compiles real kernels), which a test that only reads ``overlapped_ex2`` must not do."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import fa3_compile

    return fa3_compile


@dataclass
class Compiled:
    stage: str
    head_dim: int
    causal: bool
    ok: bool
    registers: int | None = None  # a thread, at launch (setmaxnreg moves them between partitions at run time)
    spill_bytes: int | None = None
    shared: int | None = None
    setmaxnreg: list = field(default_factory=list)
    wgmma_fp8: int | None = None  # e4m3 x e4m3 wgmma instructions in the PTX
    stmatrix: int | None = None
    fence_proxy_async: int | None = None
    overlapped_ex2: list = field(default_factory=list)  # MUFU.EX2 between the two waits, per stretch
    opcodes: dict = field(default_factory=dict)  # SASS instructions of the kinds in OPCODES (opcode_counts)
    seconds: float | None = None
    error: str = ""


def sass(cubin: bytes) -> list[str]:
    """The cubin's SASS instructions (opcode and operands), in address order."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as file:
        file.write(cubin)
        file.flush()
        out = subprocess.run([os.path.join(_fa3_compile()._tools_dir(), "cuobjdump"), "-sass", file.name],
                             capture_output=True, text=True, check=True).stdout
    return [m.group(1).strip() for m in re.finditer(r"/\*[0-9a-f]{4,}\*/\s+([^;]*);", out)]


# The instructions that separate an FP8 kernel's work from fp16's besides the products: shuffles and byte permutes
# (P's layout for the 8-bit wgmma, V's transpose), shared-memory loads and stores (the transpose through a staging
# buffer), conversions, exponentials, and the wgmma themselves (HGMMA fp16, QGMMA FP8).
OPCODES = ("SHFL", "PRMT", "LDS", "STS", "F2FP", "MUFU", "HGMMA", "QGMMA")


def opcode_counts(instructions: list[str]) -> dict[str, int]:
    """How many of the compiled kernel's SASS instructions (static: each once, wherever it sits) have each opcode
    of OPCODES, a predicate (``@P0``) and suffixes (``.EX2``) aside."""
    counts = dict.fromkeys(OPCODES, 0)
    for op in instructions:
        words = op.split()
        if words and words[0].startswith("@"):
            words = words[1:]
        name = words[0].split(".")[0] if words else ""
        if name in counts:
            counts[name] += 1
    return counts


def overlapped_ex2(instructions: list[str]) -> list[int]:
    """For each stretch from a ``WARPGROUP.DEPBAR.LE gsb0, 0x1`` to the next ``WARPGROUP.DEPBAR.LE gsb0, 0x0``:
    how many ``MUFU.EX2`` it holds (one stretch per overlapped loop of each consumer partition)."""
    counts, inside = [], False
    for op in instructions:
        if "WARPGROUP.DEPBAR.LE gsb0, 0x1" in op:
            counts.append(0)
            inside = True
        elif "WARPGROUP.DEPBAR.LE gsb0, 0x0" in op:
            inside = False
        elif inside and op.startswith("MUFU.EX2"):
            counts[-1] += 1
    return counts


def compile_stage(stage: str, head_dim: int, causal: bool) -> Compiled:
    """Compile one FP8 stage for sm_90 and read its resources; a failure is recorded, not raised."""
    fa3_compile = _fa3_compile()
    import torch
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    from flashcourse.kernels.hopper import fa3_fp8

    record = Compiled(stage, head_dim, causal, ok=False)
    signature, constexprs = fa3_fp8.kernel_signature(head_dim, getattr(torch, OUT_DTYPE), causal, stage)
    start = time.perf_counter()
    try:
        compiled = triton.compile(GluonASTSource(fa3_fp8._fa3_fp8_kernel, signature, constexprs=constexprs),
                                  target=GPUTarget("cuda", fa3_compile.SM90, 32), options=fa3_fp8.options())
        usage = fa3_compile.resource_usage(compiled.asm["cubin"])
        instructions = sass(compiled.asm["cubin"])
    except Exception as error:  # noqa: BLE001 - every variant is tried; the error is the result
        text = str(error).strip()
        record.error = f"{type(error).__name__}: {text.splitlines()[-1] if text else ''}"
        record.seconds = round(time.perf_counter() - start, 2)
        return record
    ptx = compiled.asm["ptx"].splitlines()
    record.ok = True
    record.registers, record.spill_bytes = usage["registers"], usage["local"]
    record.shared = compiled.metadata.shared
    record.setmaxnreg = sorted({line.strip().rstrip(";") for line in ptx if "setmaxnreg" in line})
    record.wgmma_fp8 = sum("wgmma.mma_async" in line and "e4m3.e4m3" in line for line in ptx)
    record.stmatrix = sum("stmatrix" in line for line in ptx)
    record.fence_proxy_async = sum("fence.proxy.async" in line for line in ptx)
    record.overlapped_ex2 = overlapped_ex2(instructions)
    record.opcodes = opcode_counts(instructions)
    record.seconds = round(time.perf_counter() - start, 2)
    return record


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stage", action="append", help="a stage (repeat); default every stage")
    parser.add_argument("--head-dim", type=int, action="append", help="64 or 128 (repeat); default both")
    parser.add_argument("--all", action="store_true", help="causal and not (default: causal only)")
    parser.add_argument("--json", help="write the records here")
    args = parser.parse_args(argv)
    fa3_compile = _fa3_compile()
    ok, why = fa3_compile.supported()
    if not ok:
        print(f"skipped: {why}")
        return 0
    import triton

    try:
        from flashcourse.kernels.hopper import fa3_fp8
    except (ImportError, AttributeError) as error:
        print(f"skipped: fa3_fp8.py does not import under Triton {triton.__version__}: {error}")
        return 0
    stages = args.stage or list(fa3_fp8.STAGES)
    head_dims = args.head_dim or list(fa3_fp8.HEAD_DIMS)
    causals = (False, True) if args.all else (True,)
    print(f"Triton {triton.__version__}, sm_{fa3_compile.SM90}, {OUT_DTYPE} output")
    print(f"{'stage':8} {'D':>4} {'causal':6} {'regs':>5} {'spill B':>7} {'shared B':>9} {'wgmma':>5} "
          f"{'EX2 under PV':>13}  setmaxnreg / error")
    records = []
    for stage in stages:
        for head_dim in head_dims:
            for causal in causals:
                r = compile_stage(stage, head_dim, causal)
                records.append(r)
                if r.ok:
                    over = "" if r.shared <= fa3_compile.SHARED_LIMIT else "  (over sm_90's 227 KB!)"
                    budgets = ", ".join(x.split()[0].split(".")[1] + " " + x.split()[-1] for x in r.setmaxnreg)
                    print(f"{stage:8} {head_dim:>4} {causal!s:6} {r.registers:>5} {r.spill_bytes:>7} {r.shared:>9} "
                          f"{r.wgmma_fp8:>5} {'/'.join(map(str, r.overlapped_ex2)) or '-':>13}  {budgets}{over}  "
                          f"[{r.seconds} s]")
                else:
                    print(f"{stage:8} {head_dim:>4} {causal!s:6} FAILED  {r.error}")
                sys.stdout.flush()
    if args.json:
        with open(args.json, "w") as file:
            json.dump({"triton": triton.__version__, "target": f"sm_{fa3_compile.SM90}", "out_dtype": OUT_DTYPE,
                       "records": [asdict(r) for r in records]}, file, indent=1)
    return 0 if all(r.ok and r.shared <= fa3_compile.SHARED_LIMIT for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
