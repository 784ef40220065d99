"""Start P processes on this machine, each a rank of one gloo process group, and show what each rank printed.

    python -m flashcourse.distributed.launch --nproc 3 ring --n 48 --causal --layout zigzag
    python -m flashcourse.distributed.launch --nproc 2 ulysses --n 32 --heads 4

A laptop stand-in for ``torchrun``: CPU tensors, gloo, the kernels in Triton's interpreter. Each rank's output is
collected in its own file and printed after the run, rank by rank, each line prefixed ``[rank r]``, so the
ranks' lines never interleave. In Python: ``launch.run(fn, nproc, *args)`` calls ``fn(*args)`` in every rank
(``fn`` must be importable by name: a module-level function) and returns the ranks' outputs.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import pickle
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from .. import device

__all__ = ["main", "run", "show"]

TIMEOUT = datetime.timedelta(minutes=5)  # a rank stuck waiting for a dead peer fails instead of hanging forever


def _rank_main(rank: int, world: int, folder: str, backend: str, call: bytes) -> None:
    """The body of each spawned process: set up like the parent, join the group, run fn, leave the group."""
    with open(Path(folder) / f"rank{rank}.txt", "w") as log, contextlib.redirect_stdout(log):
        with contextlib.redirect_stdout(io.StringIO()):  # the parent already said where the kernels run
            device.setup()  # before anything imports Triton: the interpreter is chosen at import time
            fn, args = pickle.loads(call)
        torch.set_num_threads(1)  # P processes share the machine's cores
        if backend == "nccl":
            torch.cuda.set_device(rank)  # rank r drives GPU r, as under torchrun
        dist.init_process_group(backend, init_method=f"file://{folder}/rendezvous", rank=rank, world_size=world,
                                timeout=TIMEOUT)
        try:
            fn(*args)
            dist.barrier()  # no rank leaves while a peer still talks to it: gloo aborts a process whose peer left
        except BaseException:
            # When one rank fails, its peers fail next (a closed connection): the earliest failure is the cause.
            (Path(folder) / f"rank{rank}.error").write_text(f"{time.time()!r}\n{traceback.format_exc()}")
            raise
        finally:
            dist.destroy_process_group()


def run(fn, nproc: int, *args, backend: str = "gloo") -> list[str]:
    """Call ``fn(*args)`` in ``nproc`` new processes forming a group; return each rank's printed output.

    ``backend``: "gloo" (CPU tensors) or "nccl" (rank r on GPU r; needs ``nproc`` GPUs).
    An exception in any rank stops all of them; what the ranks printed is shown, then a RuntimeError is raised
    here with the traceback of the rank that failed first (the others' errors follow from it).
    """
    if isinstance(nproc, bool) or not isinstance(nproc, int) or nproc < 1:
        raise ValueError(f"nproc must be a positive int (the number of ranks), got {nproc!r}")
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"backend must be 'gloo' (CPU) or 'nccl' (GPUs), got {backend!r}")
    # fn and args travel pickled and are unpickled in the child only after device.setup(): unpickling imports
    # their modules, which may import Triton
    call = pickle.dumps((fn, args))
    with tempfile.TemporaryDirectory(prefix="flashcourse-launch-") as folder:
        logs = [Path(folder) / f"rank{r}.txt" for r in range(nproc)]
        try:
            mp.start_processes(_rank_main, args=(nproc, folder, backend, call), nprocs=nproc, start_method="spawn")
        except Exception as err:
            show([log.read_text() if log.exists() else "" for log in logs], out=sys.stderr)
            first = _first_failure(Path(folder), nproc)
            if first is None:
                raise
            rank, text = first
            raise RuntimeError(f"rank {rank} failed first (the other ranks' errors follow from it):\n{text}") from err
        return [log.read_text() for log in logs]


def _first_failure(folder: Path, nproc: int) -> tuple[int, str] | None:
    """(rank, traceback) of the rank whose function raised first, from the ``rank{r}.error`` files."""
    failures = []
    for rank in range(nproc):
        path = folder / f"rank{rank}.error"
        if path.exists():
            stamp, text = path.read_text().split("\n", 1)
            failures.append((float(stamp), rank, text))
    if not failures:
        return None
    _, rank, text = min(failures)
    return rank, text


def show(outputs: list[str], out=None) -> None:
    """Print each rank's output, rank by rank, every line prefixed with its rank."""
    out = out or sys.stdout
    for rank, text in enumerate(outputs):
        for line in text.splitlines():
            print(f"[rank {rank}] {line}", file=out)


def main(argv=None) -> None:
    from . import demo

    parser = argparse.ArgumentParser(prog="python -m flashcourse.distributed.launch", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nproc", type=int, default=2, help="number of ranks (processes), e.g. 2 to 4")
    parser.add_argument("method", choices=("ring", "ulysses"), help="which attention to run across the ranks")
    parser.add_argument("--n", type=int, default=48, help="sequence length (a multiple of 2 x nproc for zigzag)")
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--head-dim", type=int, default=16)
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--layout", default="zigzag", choices=("contiguous", "zigzag"),
                        help="ring attention's layout (Ulysses always uses contiguous)")
    args = parser.parse_args(argv)
    options = demo.DemoOptions(args.method, args.n, args.heads, args.head_dim, args.causal,
                               "contiguous" if args.method == "ulysses" else args.layout)
    show(run(demo.compare_with_one_process, args.nproc, options))


if __name__ == "__main__":
    main()
