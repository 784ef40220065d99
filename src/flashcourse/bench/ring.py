"""GPU benchmark of attention across GPUs (lesson 12): ring attention and Ulysses against PyTorch's context
parallel, forward + backward, on every GPU of one machine. Launch it with torchrun, one process per GPU:

    torchrun --nproc-per-node 2 -m flashcourse.bench ring [--quick] [--n 65536 131072] [--out DIR]

Shapes: causal, bf16, B=1, H=16, D=128, N=64K and 128K (``--quick``: 4K and 8K). Providers, in one run:
- ``one_gpu_*``: the whole sequence on one GPU (ours, SDPA flash, SDPA cuDNN): the baselines of the efficiency;
- ``ring_zigzag``, ``ring_contiguous``, ``ulysses``: ``flashcourse.distributed`` over NCCL;
- ``cp_sdpa_flash``, ``cp_sdpa_cudnn``: ``torch.distributed.tensor.experimental.context_parallel`` over SDPA
  with that backend (its default load balancing and KV rotation, recorded in the JSON).
Every provider is validated against SDPA flash on one GPU (ours on one GPU if that fails) before it is timed;
a provider that fails to import, run or validate is recorded with its error and the run goes on.
Time: median over repetitions of the slowest rank's forward + backward. TFLOP/s: total over all GPUs (causal
fwd+bwd FLOPs / time). Efficiency: one-GPU time of the same kernel / (P x time on P GPUs).
Rank 0 prints the table and writes ``<out>/<date>-<device>-ring.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
from dataclasses import dataclass

SEQ_LENS = (65536, 131072)
QUICK_SEQ_LENS = (4096, 8192)
BATCH, HEADS, HEAD_DIM, DTYPE = 1, 16, 128, "bfloat16"
ONE_GPU = ("one_gpu_sdpa_flash", "one_gpu_ours", "one_gpu_sdpa_cudnn")  # the first is the reference
ACROSS_GPUS = ("ring_zigzag", "ring_contiguous", "ulysses", "cp_sdpa_flash", "cp_sdpa_cudnn")
BASELINE = {"ring_zigzag": "one_gpu_ours", "ring_contiguous": "one_gpu_ours", "ulysses": "one_gpu_ours",
            "cp_sdpa_flash": "one_gpu_sdpa_flash", "cp_sdpa_cudnn": "one_gpu_sdpa_cudnn"}
MAX_REL_ERR = 2e-2  # relative L2 error of o, dq, dk, dv in bf16 against the reference


@dataclass
class Inputs:
    """The whole sequence, identical on every rank: q, k, v, do (B, H, N, D)."""

    q: object
    k: object
    v: object
    do: object


def _make_inputs(n: int):
    import torch
    import torch.distributed as dist

    shape = (BATCH, HEADS, n, HEAD_DIM)
    tensors = [torch.randn(shape, device="cuda", dtype=getattr(torch, DTYPE)) for _ in range(4)]
    for t in tensors:
        dist.broadcast(t, src=0)  # every rank holds rank 0's sequence
    return Inputs(*tensors)


def _with_grads(attention, q, k, v, do):
    """A no-argument step: o and (dq, dk, dv) of one forward + backward (gradients returned, not accumulated)."""
    import torch

    q, k, v = (x.detach().requires_grad_() for x in (q, k, v))

    def step():
        o = attention(q, k, v)
        return (o, *torch.autograd.grad(o, (q, k, v), do))

    return step


def _sdpa(backend_name: str):
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}[backend_name]

    def attention(q, k, v):
        with sdpa_kernel([backend]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    return attention


@contextlib.contextmanager
def _provider(name: str, inputs: Inputs, mesh):
    """Yield (step, gather): step() runs fwd+bwd and returns this rank's (o, dq, dk, dv); gather(outputs) gives
    the whole sequence's, for validation."""
    from flashcourse import distributed, kernels

    x = inputs
    if name.startswith("one_gpu_"):
        kernel = name.removeprefix("one_gpu_")
        attention = (lambda q, k, v: kernels.flash_attention(q, k, v, causal=True)) if kernel == "ours" \
            else _sdpa(kernel.removeprefix("sdpa_"))
        yield _with_grads(attention, x.q, x.k, x.v, x.do), lambda outputs: outputs
    elif name in ("ring_zigzag", "ring_contiguous", "ulysses"):
        layout = "contiguous" if name in ("ring_contiguous", "ulysses") else "zigzag"
        local = [distributed.shard(t, layout=layout) for t in (x.q, x.k, x.v, x.do)]
        if name == "ulysses":
            def attention(q, k, v):
                return distributed.ulysses_attention(q, k, v, causal=True)
        else:
            def attention(q, k, v):
                return distributed.ring_attention(q, k, v, causal=True, layout=layout)
        yield _with_grads(attention, *local), lambda outputs: [distributed.unshard(t, layout=layout) for t in outputs]
    else:  # PyTorch's context parallel: shards its buffers in place and reroutes SDPA while the context is open
        from torch.distributed.tensor.experimental import context_parallel
        from torch.distributed.tensor.experimental._attention import context_parallel_unshard

        buffers = [t.detach().clone() for t in (x.q, x.k, x.v, x.do)]
        with context_parallel(mesh, buffers=buffers, buffer_seq_dims=[2] * 4, no_restore_buffers=set(buffers)):
            step = _with_grads(_sdpa(name.removeprefix("cp_sdpa_")), *buffers)
            yield step, lambda outputs: context_parallel_unshard(mesh, list(outputs), [2] * len(outputs))


def _relative_error(outputs, expected) -> float:
    """The largest relative L2 error of (o, dq, dk, dv), the same on every rank (so all ranks decide alike)."""
    import torch
    import torch.distributed as dist

    err = max(float((a.float() - b.float()).norm() / b.float().norm()) for a, b in zip(outputs, expected,
                                                                                       strict=True))
    worst = torch.tensor([err], device="cuda")
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    return float(worst)


def _time_ms(step, *, warmup: int, reps: int) -> float:
    """Median over ``reps`` of the slowest rank's milliseconds for one step (CUDA events, ranks in lockstep)."""
    import torch
    import torch.distributed as dist

    for _ in range(warmup):
        step()
    times = []
    for _ in range(reps):
        dist.barrier(device_ids=[torch.cuda.current_device()])
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        torch.cuda.synchronize()
        slowest = torch.tensor([start.elapsed_time(end)], device="cuda")
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        times.append(float(slowest))
    return statistics.median(times)


def _error_text(err: BaseException) -> str:
    lines = str(err).strip().splitlines()
    return f"{type(err).__name__}: {lines[0][:300] if lines else ''}"


def run(seq_lens=SEQ_LENS, *, warmup: int = 2, reps: int = 10, log=print) -> list[dict]:
    """Validate then time every provider at every N; rows with ms, total TFLOP/s, efficiency, relative error."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from flashcourse.bench import attention_flops, tflops

    world = dist.get_world_size()
    mesh = init_device_mesh("cuda", (world,), mesh_dim_names=("cp",))
    rows = []
    for n in seq_lens:
        inputs = _make_inputs(n)
        flops = attention_flops(BATCH, HEADS, n, HEAD_DIM, causal=True, mode="fwd_bwd")
        expected, reference = None, None
        for name in (*ONE_GPU, *ACROSS_GPUS):
            row = {"provider": name, "n": n, "batch": BATCH, "heads": HEADS, "head_dim": HEAD_DIM, "dtype": DTYPE,
                   "causal": True, "gpus": 1 if name in ONE_GPU else world}
            try:
                with _provider(name, inputs, mesh) as (step, gather):
                    outputs = gather(step())
                    if expected is None:  # the first provider that runs is the reference of the others
                        expected, reference = [t.detach().clone() for t in outputs], name
                    row.update(reference=reference, rel_err=_relative_error(outputs, expected))
                    del outputs
                    if row["rel_err"] > MAX_REL_ERR:
                        row["status"] = "wrong"
                    else:
                        ms = _time_ms(step, warmup=warmup, reps=reps)
                        row.update(status="ok", ms=ms, tflops_total=tflops(flops, ms * 1e-3))
            except torch.cuda.OutOfMemoryError:
                row["status"] = "oom"
            except Exception as err:  # noqa: BLE001 - a provider that cannot run here is a result, not a crash
                row.update(status="error", error=_error_text(err))
            torch.cuda.empty_cache()
            rows.append(row)
            log(f"N={n:7} {name:20} {row['status']:6} {row.get('ms', float('nan')):9.2f} ms "
                f"{row.get('tflops_total', float('nan')):7.1f} TFLOP/s  rel err {row.get('rel_err', float('nan')):.1e}"
                + (f"  {row['error']}" if "error" in row else ""))
        add_efficiency(rows, world)
    return rows


def add_efficiency(rows: list[dict], world: int) -> None:
    """efficiency = one-GPU time of the same kernel / (world x time on world GPUs), where both ran."""
    one_gpu = {(r["n"], r["provider"]): r["ms"] for r in rows if r["provider"] in ONE_GPU and "ms" in r}
    for r in rows:
        baseline = one_gpu.get((r["n"], BASELINE.get(r["provider"])))
        if baseline is not None and "ms" in r:
            r["efficiency"] = baseline / (world * r["ms"])


def format_table(rows: list[dict]) -> str:
    """One line per provider and N: GPUs, ms, total TFLOP/s, efficiency, relative error, status."""
    lines = [f"{'provider':20}{'N':>8}{'GPUs':>6}{'ms':>10}{'TFLOP/s':>9}{'effic.':>8}{'rel err':>9}  status"]
    for r in rows:
        lines.append(f"{r['provider']:20}{r['n']:>8}{r['gpus']:>6}{_cell(r, 'ms', '.2f'):>10}"
                     f"{_cell(r, 'tflops_total', '.0f'):>9}{_cell(r, 'efficiency', '.2f'):>8}"
                     f"{_cell(r, 'rel_err', '.1e'):>9}  {r['status']}" + (f" ({r['error']})" if "error" in r else ""))
    return "\n".join(lines)


def _cell(row: dict, key: str, fmt: str) -> str:
    return format(row[key], fmt) if key in row else "-"


def _context_parallel_options() -> dict:
    """PyTorch's context-parallel settings this run used (they change its speed), or the import error."""
    try:
        from torch.distributed.tensor.experimental._attention import _cp_options
    except Exception as err:  # noqa: BLE001 - recorded, not fatal
        return {"error": _error_text(err)}
    return {"rotate_method": str(_cp_options.rotate_method), "load_balance": bool(_cp_options.enable_load_balance)}


def main(args: argparse.Namespace) -> None:
    """Entry of ``python -m flashcourse.bench ring`` under torchrun (one process per GPU)."""
    import torch
    import torch.distributed as dist

    from flashcourse.bench import results_dir, save_results

    if "LOCAL_RANK" not in os.environ:
        raise SystemExit("launch this benchmark with torchrun, one process per GPU: "
                         "torchrun --nproc-per-node 2 -m flashcourse.bench ring")
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    seq_lens = args.n or (QUICK_SEQ_LENS if args.quick else SEQ_LENS)
    reps = 3 if args.quick else args.reps
    try:
        rows = run(seq_lens, warmup=1 if args.quick else 2, reps=reps, log=print if rank == 0 else (lambda *_: None))
        if rank == 0:
            print(format_table(rows))
            extra = {"gpus": dist.get_world_size(), "nccl": str(torch.cuda.nccl.version()),
                     "context_parallel": _context_parallel_options(), "reps": reps}
            name = "ring-quick" if args.quick else "ring"
            path = save_results(name, rows, directory=args.out or results_dir(), extra=extra)
            print(f"wrote {path}")
    finally:
        dist.destroy_process_group()
