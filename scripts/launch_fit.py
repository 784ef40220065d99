"""Does every launch the kernels choose fit each supported GPU? Compiled ahead of time, no GPU needed.

For each target GPU this runs the public API (``flash_attention`` forward and backward, every numbered
version, ``flash_decode`` contiguous and paged on a 16-bit and on an FP8 cache, the FP8 forward where the GPU
has it) on small CPU tensors
while Triton believes it drives that GPU: every launch the kernels choose is compiled for the target's
architecture (``GPUTarget("cuda", capability, 32)``) as far as the step that allocates shared memory, and the
compiled kernel's shared memory is compared with what the GPU lets one thread block use. What the compiler
allocates is what counts; no formula stands in for it. A GPU that cannot run a call (the FP8 cache before
compute capability 8.9) must refuse it with an error naming what is needed; one that does not is a misfit too.

    PYTHONPATH=src python scripts/launch_fit.py                    # every target, the CI's case set
    PYTHONPATH=src python scripts/launch_fit.py --target T4 --cases all --json out.json

``--cases ci`` (default) takes each kernel with its options off, with every bound and score option on at once, and
with a block mask (documents and ``mask_mod``): both launch choices (with and without partly masked tiles, the
forward's fixed to each in turn) and the most code the options add; the classifier of documents passed per call at
the default tiles, with its tile lists; the numbered versions in float16; float32 from D = 64. ``--cases all`` takes
every option on its own and bfloat16 too (minutes per target). Exit status 1 when a launch does not fit. Run with the
Triton whose allocation you want to check: CI's on a CPU, the GPU machine's in ``make test-gpu``.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import itertools
import json
import os
import sys
import time
from dataclasses import asdict, dataclass

os.environ.pop("TRITON_INTERPRET", None)  # real @triton.jit kernels: we compile them, never run them
# No compile here reaches a binary, so the IR text Triton writes to its cache after each stage is never read
# (printing and writing it took 3-4% of a run); the binaries of a full compile are still kept.
os.environ.setdefault("TRITON_STORE_BINARY_ONLY", "1")
import flashcourse.device  # noqa: E402

flashcourse.device.setup = lambda: "cuda"  # the kernels are decorated for a GPU...

import torch  # noqa: E402
import triton  # noqa: E402
from triton._C.libtriton import ir, nvidia  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.backends.nvidia.compiler import CUDABackend  # noqa: E402
from triton.runtime import driver  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402

from flashcourse import kernels  # noqa: E402
from flashcourse.kernels import blockmask, configs, fp8, rules  # noqa: E402
from flashcourse.kernels._checks import FP8_CACHE_CAPABILITY  # noqa: E402

flashcourse.device.setup = lambda: "cpu"  # ...and then take CPU tensors, which the input checks want here

HEAD_DIMS = (16, 32, 64, 80, 96, 128, 256)
N = 300  # not a multiple of any tile: the tail code is compiled too


@dataclass
class Launch:
    target: str
    case: str
    kernel: str
    launch: str  # tiles, warps and stages as chosen
    shared: int  # bytes the compiled kernel allocates
    limit: int  # bytes one thread block may use on the target

    @property
    def fits(self) -> bool:
        return self.shared <= self.limit


class _Allocated(Exception):
    """Raised by the compile pipeline once shared memory is allocated: the rest (LLVM, PTX, cubin) is not needed."""


class _PassesBuilt(Exception):
    """Raised where make_llir would add the conversion to LLVM: the passes so far end with the allocation."""


def _stop_before_llvm(*args):
    raise _PassesBuilt


# Passes that make_llir adds between the allocation and the lowering which only insert synchronisation into the
# allocated IR (barriers where shared memory is reused, fences between the generic and async proxies); they never
# change what was allocated. Left out, they save about 40% of a compile for sm_90 (membar analysis alone a
# quarter). A name this Triton version lacks is skipped, so those passes would only run: slower, never wrong.
_SYNC_ONLY = ((nvidia.passes.ttgpuir, "add_membar"), (nvidia.passes.ttnvgpuir, "add_proxy_fence_insertion"))


def _skip(*args):
    """Stands in for a pass of _SYNC_ONLY: adds nothing to the pass manager."""


def _stop_after_allocation(add_stages):
    """The backend's stages with ``llir`` cut short: its passes up to shared-memory allocation run, the costly
    lowering to LLVM (most of a compile for sm_75-sm_89) does not, nor the synchronisation passes of _SYNC_ONLY.
    The pass manager is caught as make_llir builds it, at its call that adds the lowering, so the passes before it
    are whatever this Triton version has."""

    def add(self, stages, options, language):
        add_stages(self, stages, options, language)
        make_llir = stages["llir"]

        def allocate_then_stop(src, metadata):
            built = {}
            real_pass_manager = ir.pass_manager

            def recording_pass_manager(context):
                built["pm"] = real_pass_manager(context)
                return built["pm"]

            sync_only = [(module, name, getattr(module, name)) for module, name in _SYNC_ONLY if hasattr(module, name)]
            ir.pass_manager, nvidia.passes.ttgpuir.add_to_llvmir = recording_pass_manager, _stop_before_llvm
            for module, name, _ in sync_only:
                setattr(module, name, _skip)
            try:
                make_llir(src, metadata)
            except _PassesBuilt:
                built["pm"].run(src, "make_llir")
            finally:
                ir.pass_manager, nvidia.passes.ttgpuir.add_to_llvmir = real_pass_manager, _ADD_TO_LLVMIR
                for module, name, real in sync_only:
                    setattr(module, name, real)
            raise _Allocated(src.get_int_attr("ttg.shared"))

        stages["llir"] = allocate_then_stop

    return add


class _TargetDriver:
    """What JITFunction.run asks the active driver, answered for a GPU that is not here."""

    def __init__(self, capability: int):
        self.capability = capability

    def get_current_target(self):
        return GPUTarget("cuda", self.capability, 32)

    def get_current_device(self):
        return self.capability  # one binder cache per architecture

    def get_current_stream(self, device=None):
        return 0


class Recorder:
    """Replaces the launch of every kernel by a compile for the current target, remembering its allocation."""

    def __init__(self):
        self.case = ""
        self.launches: list[tuple[str, str, str, int]] = []
        self.refused: list[str] = []  # cases this target cannot run, refused with an error naming what is needed
        self.not_refused: list[str] = []  # cases it cannot run that went ahead: misfits
        self._seen: dict[tuple, int] = {}

    def __call__(self, jit, *args, grid, warmup, **kwargs):
        constexprs = {p.name: kwargs.get(p.name, p.default) for p in jit.params if p.is_constexpr}
        tiles = "x".join(str(constexprs[n]) for n in ("BLOCK_M", "BLOCK_N") if n in constexprs)
        launch = f"{tiles} w{kwargs.get('num_warps', 4)} s{kwargs.get('num_stages', 3)}"
        # What Triton compiles one kernel for: the constexprs, the launch options (num_warps, num_stages) as they
        # are, and of every other argument what it specialises on (a tensor's dtype and 16-byte alignment, whether
        # an integer is 1 or a multiple of 16). Launches with the same key share one compile.
        params = {p.name for p in jit.params}
        key = (jit.fn.__name__, driver.active.get_current_device(), repr(sorted(constexprs.items())),
               repr(sorted((n, v) for n, v in kwargs.items() if n not in params)),
               tuple((n, (v.dtype, v.data_ptr() % 16 == 0) if isinstance(v, torch.Tensor) else
                      (v == 1, v % 16 == 0) if isinstance(v, int) and not isinstance(v, bool) else type(v).__name__)
                     for n, v in sorted(kwargs.items()) if n in params and n not in constexprs))
        if key not in self._seen:
            try:  # a kernel in Triton's cache comes back whole, without compiling
                self._seen[key] = _ORIGINAL_RUN(jit, *args, grid=grid, warmup=True, **kwargs).metadata.shared
            except _Allocated as allocated:
                self._seen[key] = allocated.args[0]
        self.launches.append((self.case, jit.fn.__name__, launch, self._seen[key]))
        return None  # nothing ran: the caller's outputs stay uninitialised, which is all a compile check needs


_ORIGINAL_RUN = JITFunction.run
_ADD_TO_LLVMIR = nvidia.passes.ttgpuir.add_to_llvmir
RECORDER = Recorder()


def _install() -> None:
    CUDABackend.add_stages = _stop_after_allocation(CUDABackend.add_stages)
    JITFunction.run = lambda jit, *args, grid, warmup, **kwargs: RECORDER(jit, *args, grid=grid, warmup=warmup,
                                                                         **kwargs)


@triton.jit
def _prefix_lm(b, h, q_idx, kv_idx):
    return (kv_idx <= q_idx) | (kv_idx < 64)


@contextlib.contextmanager
def _forward_tiles(small_tiles: bool | None):
    """The forward's choice under a block mask fixed to ``small_tiles`` (None: left as it is)."""
    chooser = blockmask.many_partial_tiles
    if small_tiles is not None:
        blockmask.many_partial_tiles = lambda *_: small_tiles
    try:
        yield
    finally:
        blockmask.many_partial_tiles = chooser


def _inputs(dtype, head_dim, heads_q=2, heads_kv=2, grad=False):
    def make(heads):
        return torch.randn(1, heads, N, head_dim, dtype=torch.float32).to(dtype).requires_grad_(grad)
    return make(heads_q), make(heads_kv), make(heads_kv)


def _option_sets(cases: str, heads_q: int) -> dict[str, dict]:
    slopes = torch.full((heads_q,), 0.25)
    docs = torch.zeros(1, N, dtype=torch.int32)
    docs[:, N // 2:] = 1
    # with dropout: its Philox rounds sit in the inner loop of the forward and of both backward kernels
    every_bound = dict(causal="bottom_right", window=(64, 0), softcap=30.0, alibi_slopes=slopes, dropout_p=0.1)
    block_mask = dict(causal=True, softcap=30.0, alibi_slopes=slopes, document_ids=docs, mask_mod=_prefix_lm)
    if cases == "ci":
        return {"dense": {}, "every bound and score option": every_bound, "block mask": block_mask}
    return {"dense": {}, "causal": dict(causal=True), "bottom-right causal": dict(causal="bottom_right"),
            "window": dict(window=(64, 0)), "softcap": dict(softcap=30.0), "alibi": dict(alibi_slopes=slopes),
            "documents": dict(document_ids=docs), "mask_mod": dict(mask_mod=_prefix_lm),
            "dropout": dict(causal=True, dropout_p=0.1),
            "every bound and score option": every_bound, "block mask": block_mask}


# The CI's set: everything at head dims whose padded size differs (80 and 96 compile like 128 with masked
# columns: there the default path only), the teaching versions in float16 only.
PADDED_HEAD_DIMS = (16, 32, 64, 128, 256)


def run_cases(props: configs.DeviceProps, dtype: torch.dtype, head_dim: int, cases: str) -> None:
    """Every public call for one dtype and head dim; the recorder compiles what each launches."""
    name = f"{str(dtype).removeprefix('torch.')} D={head_dim}"
    full = cases == "all" or head_dim in PADDED_HEAD_DIMS
    for heads_q in (2, 4):  # 4 query heads on 2 K/V heads: grouped-query attention
        for label, options in _option_sets(cases, heads_q).items():
            if (heads_q == 4 and label == "dense") or (not full and label != "dense"):
                continue
            q, k, v = _inputs(dtype, head_dim, heads_q, grad=True)
            # Under a block mask the forward takes its small tiles where many are partial, which it reads from
            # tile lists no kernel fills here (nothing runs): each choice is compiled in turn.
            tile_choices = (False, True) if "document_ids" in options or "mask_mod" in options else (None,)
            for small_tiles in tile_choices:
                RECORDER.case = f"{name} attention {label}" + (" GQA" if heads_q == 4 else "") + \
                    {None: "", False: ", dense tiles", True: ", small tiles"}[small_tiles]
                with _forward_tiles(small_tiles):
                    kernels.flash_attention(q, k, v, **options, enable_gqa=True).sum().backward()
    slopes = torch.full((4,), 0.25)
    q1 = torch.randn(2, 4, head_dim).to(dtype)
    for paged in (False, True):  # several new tokens: rows (token, head) in tiles, each row masked on its own
        RECORDER.case = f"{name} decode {'paged' if paged else 'contiguous'} 5 new tokens"
        cache = torch.randn(8, 2, 64, head_dim).to(dtype) if paged else torch.randn(2, 2, 1000, head_dim).to(dtype)
        table = dict(block_table=torch.arange(8, dtype=torch.int32).reshape(2, 4)) if paged else {}
        kernels.flash_decode(torch.randn(2, 4, 5, head_dim).to(dtype), cache, cache, **table)
    for paged, kv in itertools.product((False, True), ("16-bit", "fp8")):
        for label, options in {"dense": {}, "window, softcap, alibi": dict(window=(64, 0), softcap=30.0,
                                                                            alibi_slopes=slopes)}.items():
            RECORDER.case = f"{name} decode {'paged' if paged else 'contiguous'} {label}"
            if paged:
                cache = torch.randn(8, 2, 64, head_dim).to(dtype)
                options = dict(options, block_table=torch.arange(8, dtype=torch.int32).reshape(2, 4))
            else:
                cache = torch.randn(2, 2, 1000, head_dim).to(dtype)
            if kv == "16-bit":
                kernels.flash_decode(q1, cache, cache, **options)
                continue
            RECORDER.case += " fp8 cache"
            k8, v8, k_scale, v_scale = kernels.quantize_kv_cache(cache, cache, block_table=options.get("block_table"))
            if props.capability >= FP8_CACHE_CAPABILITY:
                kernels.flash_decode(q1, k8, v8, k_scale=k_scale, v_scale=v_scale, **options)
                continue
            try:
                kernels.flash_decode(q1, k8, v8, k_scale=k_scale, v_scale=v_scale, **options)
            except RuntimeError as refused:
                if "compute capability 8.9" in str(refused):
                    RECORDER.refused.append(RECORDER.case)
                    continue
                raise
            RECORDER.not_refused.append(RECORDER.case)
    if props.capability >= fp8.MIN_CAPABILITY and dtype == torch.float16 and head_dim in fp8.FP8_HEAD_DIMS:
        q8, k8, v8 = (t.to(fp8.FP8) for t in _inputs(torch.float32, head_dim))
        for causal in (False, True):
            RECORDER.case = f"fp8 D={head_dim} forward{' causal' if causal else ''}"
            kernels.flash_attention_forward(q8, k8, v8, causal=causal)
    if cases == "ci" and not (dtype == torch.float16 and head_dim in PADDED_HEAD_DIMS):
        return
    # the numbered teaching versions (version=...): their causal kernels hold the dense loop too
    q, k, v = _inputs(dtype, head_dim)
    causals = (False, True) if cases == "all" else (True,)
    for version, causal in itertools.product(kernels.FORWARD_VERSIONS, causals):
        if version != kernels.DEFAULT_FORWARD:
            RECORDER.case = f"{name} forward {version}{' causal' if causal else ''}"
            kernels.flash_attention_forward(q, k, v, causal=causal, version=version)
    o, lse = torch.zeros_like(q), torch.zeros(q.shape[:3])
    for version, causal in itertools.product(kernels.BACKWARD_VERSIONS, causals):
        RECORDER.case = f"{name} backward {version}{' causal' if causal else ''}"
        kernels.flash_attention_backward(q, k, v, o, lse, torch.ones_like(q), causal=causal, version=version)


def classify_documents(props: configs.DeviceProps) -> None:
    """Document ids passed per call are classified by two small kernels of their own
    (``blockmask.document_tile_kinds``), which the option sets reach only beside a ``mask_mod`` (classified score
    by score there): compile them at the tiles of this GPU's default launches at D = 128, with the kernel that
    turns the map into tile lists (``blockmask.tile_lists``), reading it as laid out and transposed."""
    q = torch.zeros(1, 2, N, 128, dtype=torch.float16)
    docs = torch.zeros(1, N, dtype=torch.int32)
    docs[:, N // 2:] = 1
    call = rules.parse_rules(q, q, causal=True, document_ids=docs)
    launches = (configs.forward_config(props, 128, 2, causal=True),
                *configs.backward_config(props, 128, 2, causal=True))
    for block_m, block_n in dict.fromkeys((c.block_m, c.block_n) for c in launches):
        RECORDER.case = f"D=128 documents per call, {block_m} x {block_n} tiles"
        kinds = blockmask.document_tile_kinds(call, 1, N, block_m, block_n, q.device)
        blockmask.tile_lists(kinds)  # per query tile: the forward, dQ
        blockmask.tile_lists(kinds.transpose(-1, -2))  # per key tile: dK/dV (other strides, another compile)


def dtypes_for(props: configs.DeviceProps, cases: str) -> list[torch.dtype]:
    """float16 and float32 always; bfloat16 (its launches are float16's) only in the full set, where it runs."""
    extra = [torch.bfloat16] if cases == "all" and configs.supports_bf16(props) else []
    return [torch.float16, torch.float32, *extra]


def check_target(target: str, cases: str = "ci", head_dims=HEAD_DIMS, limit: int | None = None) -> list[Launch]:
    """Every launch of the cases for one GPU of configs.KNOWN_DEVICES; ``limit`` (bytes) replaces its shared
    memory per block in the comparison only (the launches are still chosen for the real GPU)."""
    props = configs.KNOWN_DEVICES[target]
    capability = props.capability[0] * 10 + props.capability[1]
    driver.set_active(_TargetDriver(capability))
    configs.device_props = lambda device: props  # what the launch choice sees: the target, not this machine
    RECORDER.launches.clear()
    RECORDER.refused.clear()
    RECORDER.not_refused.clear()
    for dtype, head_dim in itertools.product(dtypes_for(props, cases), head_dims):
        if cases == "ci" and dtype == torch.float32 and head_dim < 64:
            continue  # rows of 64 and 128 bytes: float16's D = 32 and 64 take the same tiles
        run_cases(props, dtype, head_dim, cases)
    classify_documents(props)
    limit = props.shared_memory_per_block if limit is None else limit
    return [Launch(target, *row, limit) for row in RECORDER.launches]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", action="append", choices=sorted(configs.KNOWN_DEVICES),
                        help="a GPU of configs.KNOWN_DEVICES (repeatable; default: all)")
    parser.add_argument("--cases", choices=("ci", "all"), default="ci")
    parser.add_argument("--head-dim", type=int, action="append", choices=HEAD_DIMS)
    parser.add_argument("--json", help="write every launch with its shared memory here")
    parser.add_argument("--limit-kb", type=int, help="compare with this many KB per block instead of the GPU's "
                        "(to see the check fail)")
    args = parser.parse_args(argv)
    _install()
    gc.freeze()  # torch's and Triton's modules live to the end: the compiles' collections need not walk them
    rows: list[Launch] = []
    refusals: list[dict] = []
    misfits = 0
    for target in args.target or sorted(configs.KNOWN_DEVICES):
        t0 = time.time()
        limit = args.limit_kb * 1024 if args.limit_kb else None
        found = check_target(target, args.cases, tuple(args.head_dim or HEAD_DIMS), limit)
        rows += found
        bad = [r for r in found if not r.fits]
        refused, not_refused = len(RECORDER.refused), list(RECORDER.not_refused)
        print(f"{target}: {len(found)} launches, {len(bad)} do not fit, {refused} refused as unsupported, "
              f"{len(not_refused)} not refused ({time.time() - t0:.0f} s)", flush=True)
        for r in bad:
            print(f"  DOES NOT FIT {r.case}: {r.kernel} {r.launch} needs {r.shared} B of {r.limit}", flush=True)
        for case in not_refused:
            print(f"  NOT REFUSED {case}: the GPU cannot run it, and the call raised nothing", flush=True)
        misfits += len(bad) + len(not_refused)
        refusals += [{"target": target, "case": case} for case in RECORDER.refused]
    if args.json:
        meta = {"triton": triton.__version__, "torch": torch.__version__, "cases": args.cases}
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "rows": [asdict(r) | {"fits": r.fits} for r in rows], "refused": refusals},
                      f, indent=1)
    return 1 if misfits else 0


if __name__ == "__main__":
    sys.exit(main())
