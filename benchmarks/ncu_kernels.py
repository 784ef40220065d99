"""One forward (v7) and the backward (b1's two kernels, then b5's dK/dV kernel) at D=128, N=8192, for Nsight
Compute to read their hardware counters:

    ncu --clock-control none -k regex:"_fwd_v7|_bwd_dkdv|_bwd_dq" --section SpeedOfLight --section Occupancy \
        --section LaunchStats --section WarpStateStats --csv --page details python benchmarks/ncu_kernels.py

(``scripts/gpu_run.sh ncu`` runs exactly that.) Each kernel runs once, so ncu replays one launch of each.
"""

from __future__ import annotations

import torch

from flashcourse import kernels
from flashcourse.kernels.backward import run_backward
from flashcourse.kernels.forward import run_forward


def main() -> None:
    q, k, v, do = (torch.randn(4, 16, 8192, 128, device="cuda", dtype=torch.float16) for _ in range(4))
    o, lse = run_forward(kernels.FORWARD_VERSIONS["v7"], q, k, v, scale=None)
    for name in ("b1", "b5"):
        run_backward(kernels.BACKWARD_VERSIONS[name], q, k, v, o, lse, do, scale=None)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
