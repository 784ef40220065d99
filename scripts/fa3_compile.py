"""Compile every stage of the Gluon FlashAttention-3 forward (``flashcourse.kernels.hopper.fa3``) for sm_90, no GPU
needed.

Each stage is compiled to a cubin with the installed Triton (ptxas ships inside its wheel) for
``GPUTarget("cuda", 90, 32)``, and the cubin's resource usage is read back with the wheel's ``cuobjdump``:
registers a thread, spill (local memory) bytes, shared memory (the compiler's allocation). The PTX is searched for
``setmaxnreg`` (the register budgets) and ``wgmma`` (the tensor-core instructions). ``ex2_under_pv``: for each
stretch of SASS between the two waits of an overlapped loop (QK^T(j) landed, PV(j-1) still running), the
exponentials in it (scripts/fa3_fp8_compile.py's count); v8g should have a tile's all there, v8d-v8f none.

    PYTHONPATH=src python scripts/fa3_compile.py                     # every stage, D 64 and 128, fp16, causal
    PYTHONPATH=src python scripts/fa3_compile.py --all --json out.json   # both dtypes, causal and not
    PYTHONPATH=src python scripts/fa3_compile.py --head-dims 256 --all   # D = 256: the stages that take it (v8c-v8f)
    PYTHONPATH=src python scripts/fa3_compile.py --backward          # the backward's stages (b6*, fa3_backward.py)
    PYTHONPATH=src python scripts/fa3_compile.py --stage b7 --all    # b7 (fa3_backward_tma.py; Triton >= 3.9)
    PYTHONPATH=src python scripts/fa3_compile.py --stage b8 --all --head-dims 256   # b8 (fa3_backward_d256.py)

Exit status 1 when a stage fails to compile. ``supported()`` says whether the installed Triton's Gluon offers
what fa3.py uses (tests/test_fa3_compile.py skips otherwise).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass

os.environ.pop("TRITON_INTERPRET", None)  # real kernels: we compile them, never run them
import flashcourse.device  # noqa: E402

flashcourse.device.setup = lambda: "cuda"  # no interpreter: Gluon has none

import torch  # noqa: E402
import triton  # noqa: E402

SM90 = 90
# One thread block may use 227 KB of shared memory on sm_90 (228 KB per SM).
SHARED_LIMIT = 232448


def supported() -> tuple[bool, str]:
    """(True, "") when the installed Triton's Gluon has what fa3.py uses, else (False, the reason)."""
    try:
        from triton.experimental import gluon  # noqa: F401
        from triton.experimental.gluon import language as gl
        from triton.experimental.gluon._runtime import GluonASTSource  # noqa: F401
        from triton.experimental.gluon.language.nvidia.hopper import (  # noqa: F401
            mbarrier,
            tma,
            warpgroup_mma,
            warpgroup_mma_wait,
        )
        from triton.experimental.gluon.nvidia.hopper import TensorDescriptor  # noqa: F401
    except ImportError as error:
        return False, f"Triton {triton.__version__} has no Gluon Hopper API fa3.py uses ({error})"
    for name in ("warp_specialize", "NVMMADistributedLayout", "NVMMASharedLayout", "DotOperandLayout"):
        if not hasattr(gl, name):
            return False, f"Triton {triton.__version__}'s Gluon has no gl.{name}"
    return True, ""


@dataclass
class Compiled:
    stage: str
    head_dim: int
    dtype: str
    causal: bool
    ok: bool
    registers: int | None = None  # a thread, at launch (setmaxnreg moves them between partitions at run time)
    spill_bytes: int | None = None  # local memory a thread (spills and stack)
    shared: int | None = None  # bytes the compiler allocates
    setmaxnreg: list | None = None  # the budgets in the PTX
    wgmma: int | None = None  # wgmma.mma_async instructions in the PTX
    ex2_under_pv: list | None = None  # MUFU.EX2 between the two wgmma waits, per overlapped stretch of SASS
    opcodes: dict | None = None  # SASS instructions of the kinds in fa3_fp8_compile.OPCODES
    ex2_ptx: int | None = None  # ex2.approx instructions in the PTX (v9b moves some to the FMA units)
    predicated_branches: int | None = None  # SASS branches taken on a predicate (v9a adds one around each rescale)
    seconds: float | None = None
    error: str = ""


def _tools_dir() -> str:
    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")


def resource_usage(cubin: bytes) -> dict:
    """Registers, local (spill) bytes and static shared memory of a cubin, from ``cuobjdump -res-usage``."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as file:
        file.write(cubin)
        file.flush()
        out = subprocess.run([os.path.join(_tools_dir(), "cuobjdump"), "-res-usage", file.name],
                             capture_output=True, text=True, check=True).stdout
    fields = dict(re.findall(r"(\w+):(\d+)", out.split("Function", 1)[1]))
    return {"registers": int(fields["REG"]), "local": int(fields["LOCAL"]) + int(fields["STACK"])}


def _module(name: str):
    """The module of a stage: the forward's (v8*, fa3.py) or the backward's (b6*, fa3_backward.py; b7,
    fa3_backward_tma.py; b8, fa3_backward_d256.py)."""
    if name.startswith("b8"):
        from flashcourse.kernels.hopper import fa3_backward_d256

        return fa3_backward_d256
    if name.startswith("b7"):
        from flashcourse.kernels.hopper import fa3_backward_tma

        return fa3_backward_tma
    if name.startswith("b6"):
        from flashcourse.kernels.hopper import fa3_backward

        return fa3_backward
    from flashcourse.kernels.hopper import fa3

    return fa3


def compile_stage(name: str, head_dim: int, dtype: torch.dtype = torch.float16, causal: bool = True) -> Compiled:
    """Compile one stage (forward v8* or backward b6*) for sm_90 and read its resources; a failure is recorded,
    not raised."""
    import fa3_fp8_compile  # beside this script: its SASS reader
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    module = _module(name)
    record = Compiled(name, head_dim, str(dtype).removeprefix("torch."), causal, ok=False)
    stage = {**module.STAGES, **getattr(module, "FA4_STAGES", {})}[name]  # v9 (fa3.py's FA4_STAGES) too
    signature, constexprs = module.kernel_signature(stage, head_dim, dtype, causal)
    launch = stage.at(head_dim) if hasattr(stage, "at") else stage  # a forward stage's launch by head dim (v8f)
    start = time.perf_counter()
    try:
        compiled = triton.compile(GluonASTSource(launch.kernel, signature, constexprs=constexprs),
                                  target=GPUTarget("cuda", SM90, 32), options=launch.options())
        usage = resource_usage(compiled.asm["cubin"])
        instructions = fa3_fp8_compile.sass(compiled.asm["cubin"])
    except Exception as error:  # noqa: BLE001 - every stage is tried; the error is the result
        record.error = f"{type(error).__name__}: {str(error).strip().splitlines()[-1] if str(error).strip() else ''}"
        record.seconds = round(time.perf_counter() - start, 2)
        return record
    ptx = compiled.asm["ptx"]
    record.ok = True
    record.registers = usage["registers"]
    record.spill_bytes = usage["local"]
    record.shared = compiled.metadata.shared
    record.setmaxnreg = sorted({line.strip().rstrip(";") for line in ptx.splitlines() if "setmaxnreg" in line})
    record.wgmma = sum("wgmma.mma_async" in line for line in ptx.splitlines())
    record.ex2_under_pv = fa3_fp8_compile.overlapped_ex2(instructions)
    record.opcodes = fa3_fp8_compile.opcode_counts(instructions)
    record.ex2_ptx = sum("ex2.approx" in line for line in ptx.splitlines())
    record.predicated_branches = sum(op.split()[0].startswith("@") and op.split()[1:2] == ["BRA"]
                                     for op in instructions if op.split())
    record.seconds = round(time.perf_counter() - start, 2)
    return record


def compile_all(stages=None, head_dims=(64, 128), dtypes=(torch.float16,), causals=(True,), backward=False):
    """Every combination of a stage with a head dim it takes, one record at a time (a generator: the caller
    prints as they come); ``backward``: the backward's stages (b6*) by default instead of the forward's."""
    names = list(_module("b6" if backward else "v8").STAGES) if stages is None else stages
    for name, d, dt, c in itertools.product(names, head_dims, dtypes, causals):
        module = _module(name)
        stage = {**module.STAGES, **getattr(module, "FA4_STAGES", {})}[name]
        if d in getattr(stage, "head_dims", (d,)):  # D = 256: v8c-v8f only
            yield compile_stage(name, d, dt, c)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stage", action="append", help="a stage (repeat); default every stage")
    parser.add_argument("--all", action="store_true", help="fp16 and bf16, causal and not")
    parser.add_argument("--head-dims", default="64,128",
                        help="head dims, comma-separated (default 64,128); a stage compiles at those it takes")
    parser.add_argument("--backward", action="store_true",
                        help="the backward's stages (b6*, fa3_backward.py) instead of the forward's")
    parser.add_argument("--json", help="write the records here")
    args = parser.parse_args(argv)
    ok, why = supported()
    if not ok:
        print(f"skipped: {why}")
        return 0
    dtypes = (torch.float16, torch.bfloat16) if args.all else (torch.float16,)
    causals = (False, True) if args.all else (True,)
    print(f"Triton {triton.__version__}, sm_{SM90}")
    print(f"{'stage':6} {'D':>4} {'dtype':9} {'causal':6} {'regs':>5} {'spill B':>7} {'shared B':>9} "
          f"{'wgmma':>5} {'EX2 under PV':>13}  setmaxnreg / error")
    records = []
    head_dims = tuple(int(d) for d in args.head_dims.split(",") if d.strip())
    for record in compile_all(args.stage, head_dims=head_dims, dtypes=dtypes, causals=causals,
                              backward=args.backward):
        records.append(record)
        if record.ok:
            fits = "" if record.shared <= SHARED_LIMIT else "  (over sm_90's 227 KB!)"
            print(f"{record.stage:6} {record.head_dim:>4} {record.dtype:9} {record.causal!s:6} {record.registers:>5} "
                  f"{record.spill_bytes:>7} {record.shared:>9} {record.wgmma:>5} "
                  f"{'/'.join(map(str, record.ex2_under_pv)) or '-':>13}  "
                  f"{', '.join(record.setmaxnreg) or '-'}{fits}  [{record.seconds} s]")
        else:
            print(f"{record.stage:6} {record.head_dim:>4} {record.dtype:9} {record.causal!s:6} FAILED  {record.error}")
        sys.stdout.flush()
    if args.json:
        with open(args.json, "w") as file:
            json.dump({"triton": triton.__version__, "target": f"sm_{SM90}",
                       "records": [asdict(r) for r in records]}, file, indent=1)
    return 0 if all(r.ok and r.shared <= SHARED_LIMIT for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
