"""Compile the FP8 KV cache's decode candidates (``flashcourse.bench.decode.CANDIDATES``) for sm_90 on a CPU and
print what each costs: no GPU needed.

    PYTHONPATH=src python benchmarks/decode_compile.py                  # contiguous cache, D = 128, GQA 4
    PYTHONPATH=src python benchmarks/decode_compile.py --page-size 16 --json out.json

For each candidate the split kernel is compiled as its launch would be at 32K keys (B = 1, 32 query heads, 8 KV
heads, D = 128: every pointer 16-byte aligned, the strides, N_MAX and SPLIT_LEN multiples of 16) with the installed
Triton for ``GPUTarget("cuda", 90, 32)``. Read back: registers a thread, spilled bytes and shared memory (the
cubin, ``cuobjdump -res-usage``), how many programs an H100/H200 SM holds (65,536 registers, 228 KB of shared
memory, 1 KB of it reserved per block, 2,048 threads), one-byte shared-memory reads in the PTX (``ld.shared.b8``),
and the SASS of the main loop (the longest backward branch): instructions a thread issues per 128 keys
(``loop/128``) and all its warps together (``SM/128``: the issue slots one program takes per 128 keys; four
schedulers give four a cycle), its one-byte shared reads (``LDS.U8``) and the width of its global-to-shared copies
(``LDGSTS``).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
os.environ["TRITON_INTERPRET"] = "0"  # real kernels: compiled, never run

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

REGISTERS, SHARED, RESERVED, THREADS = 65536, 228 * 1024, 1024, 2048  # an H100/H200 SM


def compile_candidate(candidate, page_size=None, kv="fp8e4nv", group=4, head_dim=128):
    """The split kernel as ``candidate`` (a ``bench.decode.Candidate``) launches it, compiled for sm_90."""
    from flashcourse.kernels.decode import _decode_split_kernel as kernel

    switches = candidate.switches or {}
    # A candidate without tiles runs the sm_90 default launch, for the FP8 cache as for the float16 one.
    block_n, warps, stages = candidate.block_n or 128, candidate.num_warps or 4, candidate.num_stages or 3
    keys_adjacent = candidate.v_layout == "keys_adjacent"
    v_unit = "stride_vn" if keys_adjacent else "stride_vd"  # the stride that is 1
    unit = {"stride_qd", "stride_kd", "stride_od", v_unit}
    pointers = {"Q": "*fp16", "K": f"*{kv}", "V": f"*{kv}", "BLOCK_TABLE": "*i32", "SEQLENS": "*i32",
                "K_SCALE": "*fp32", "V_SCALE": "*fp32", "O_PART": "*fp32", "LSE_PART": "*fp32", "ALIBI_SLOPES": "*fp32",
                "OUT": "*fp16", "LEFTPAD": "*i32"}
    values = dict(GROUP=group, BLOCK_G=max(16, group), HEAD_DIM=head_dim, BLOCK_D=head_dim, BLOCK_N=block_n,
                  PAGED=page_size is not None, PAGE_SIZE=page_size or 1, HAS_SEQLENS=page_size is not None,
                  HAS_WINDOW=False, HAS_SOFTCAP=False, HAS_ALIBI=False, DOT_PRECISION="ieee", KV_FP8=kv != "fp16",
                  DIRECT=False, MASK_TAIL_ONLY=switches.get("mask_tail_only", keys_adjacent), ROW_MASKS=False,
                  CAUSAL=False, HAS_LEFTPAD=False,
                  **dict.fromkeys(unit, 1))
    names = kernel.arg_names
    signature = {n: "constexpr" if n in values else pointers.get(n, "fp32" if n in ("qk_scale", "softcap2") else "i32")
                 for n in names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names)
             if n in pointers or n in ("N_MAX", "SPLIT_LEN") or (n.startswith("stride_") and n not in unit
                                                                 and "_bt_" not in n)}
    constexprs = {(names.index(n),): v for n, v in values.items()}
    compiled = triton.compile(ASTSource(kernel, signature, constexprs=constexprs, attrs=attrs),
                              target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "num_stages": stages})
    return compiled, block_n, warps


def _tool(name: str) -> str:
    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)


def _cuobjdump(cubin: bytes, flag: str) -> str:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as file:
        file.write(cubin)
        file.flush()
        return subprocess.run([_tool("cuobjdump"), flag, file.name], capture_output=True, text=True,
                              check=True).stdout


def main_loop(sass: str) -> list[str]:
    """The opcodes of the main loop: the first loop (a backward branch and its target) that runs tensor-core
    instructions. With ``mask_tail_only`` a second one follows it, for the split's last tile."""
    lines = [(int(m.group(1), 16), m.group(2)) for m in
             (re.match(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?);", line) for line in sass.splitlines()) if m]
    loops = sorted((int(branch.group(1), 16), address) for address, text in lines
                   if (branch := re.search(r"\bBRA\b.*?0x([0-9a-f]+)", text)) and int(branch.group(1), 16) < address)
    for first, last in loops:
        body = [re.sub(r"^@!?U?P\w+\s+", "", text).split()[0] for address, text in lines if first <= address <= last]
        if any(op.startswith("HMMA") for op in body):
            return body
    return []


def measure(candidate, page_size=None) -> dict:
    kv = "fp16" if candidate.kv_dtype == "float16" else "fp8e4nv"
    compiled, block_n, warps = compile_candidate(candidate, page_size, kv)
    usage = dict(re.findall(r"(\w+):(\d+)", _cuobjdump(compiled.asm["cubin"], "-res-usage").split("Function", 1)[1]))
    regs, shared = int(usage["REG"]), compiled.metadata.shared
    loop = collections.Counter(main_loop(_cuobjdump(compiled.asm["cubin"], "-sass")))
    per_128 = 128 / block_n
    fit = min(REGISTERS // (-(-regs // 8) * 8 * 32 * warps), SHARED // (shared + RESERVED), THREADS // (32 * warps))
    return {"candidate": candidate.name, "kv_dtype": candidate.kv_dtype, "page_size": page_size,
            "block_n": block_n, "num_warps": warps, "registers": regs,
            "spill_bytes": int(usage["LOCAL"]) + int(usage["STACK"]), "shared_bytes": shared,
            "programs_per_sm_fit": fit, "ptx_ld_shared_b8": len(re.findall(r"ld\.shared\.[bus]8", compiled.asm["ptx"])),
            "loop_instructions_per_128_keys": round(sum(loop.values()) * per_128),
            "warp_instructions_per_128_keys": round(sum(loop.values()) * per_128 * warps),
            "loop_lds_u8_per_128_keys": round(loop["LDS.U8"] * per_128),
            "loop_copies": {op: n for op, n in sorted(loop.items()) if op.startswith("LDGSTS")}}


def main(argv=None) -> int:
    from flashcourse.bench.decode import CANDIDATES

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--page-size", type=int, help="a paged cache with pages of this many rows")
    parser.add_argument("--json", help="write the records here")
    args = parser.parse_args(argv)
    layout = f"pages of {args.page_size}" if args.page_size else "contiguous"
    print(f"Triton {triton.__version__}, sm_90, D = 128, GQA 4, {layout}")
    print(f"{'candidate':20}{'regs':>5}{'spill':>6}{'shared':>8}{'fit':>4}{'b8 PTX':>7}{'loop/128':>9}{'SM/128':>7}"
          f"{'LDS.U8':>7}  copies")
    records = []
    for candidate in CANDIDATES:
        r = measure(candidate, args.page_size)
        records.append(r)
        print(f"{r['candidate']:20}{r['registers']:>5}{r['spill_bytes']:>6}{r['shared_bytes']:>8}"
              f"{r['programs_per_sm_fit']:>4}{r['ptx_ld_shared_b8']:>7}{r['loop_instructions_per_128_keys']:>9}"
              f"{r['warp_instructions_per_128_keys']:>7}{r['loop_lds_u8_per_128_keys']:>7}  {r['loop_copies']}",
              flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"triton": triton.__version__, "target": "sm_90", "records": records},
                                              indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
