"""The GPU benchmarks' common ground: FLOP and byte formulas, rates, results saved as JSON.

Imports no Jupyter or widget package, so benchmarks run as plain scripts on a GPU machine.
The GPU benchmark itself is ``python -m flashcourse.bench attention`` (see ``bench/__main__.py``).
"""

from __future__ import annotations

import datetime as _dt
import json
import platform
from dataclasses import asdict
from pathlib import Path

from flashcourse import resources

__all__ = [
    "attention_flops",
    "results_dir",
    "save_results",
    "load_results",
    "tflops",
]

BACKWARD_OVER_FORWARD = 2.5  # backward = 2 matmuls recomputed/reused + 3 new ones, vs 2 in the forward


def attention_flops(batch: int, heads: int, n: int, head_dim: int, *, causal: bool = False,
                    mode: str = "fwd") -> float:
    """Matmul FLOPs of attention: forward 4*B*H*N^2*D (QK^T and PV, 2 FLOPs per multiply-add), halved
    for causal; backward 2.5x forward; ``mode`` is ``"fwd"``, ``"bwd"`` or ``"fwd_bwd"``."""
    forward = 4.0 * batch * heads * n * n * head_dim * (0.5 if causal else 1.0)
    factors = {"fwd": 1.0, "bwd": BACKWARD_OVER_FORWARD, "fwd_bwd": 1.0 + BACKWARD_OVER_FORWARD}
    if mode not in factors:
        raise ValueError(f"mode must be one of {sorted(factors)}, got {mode!r}")
    return forward * factors[mode]


def tflops(flops: float, seconds: float) -> float:
    """Rate in TFLOP/s."""
    return flops / seconds / 1e12


def results_dir() -> Path:
    """Where recorded results are read: ``benchmarks/results`` of the checkout, or the copy a wheel ships
    (:func:`flashcourse.resources.recorded_results_dir`)."""
    return resources.recorded_results_dir()


def environment_info() -> dict:
    """Device name, library versions and date: the metadata every saved result carries."""
    info = {"date": _dt.date.today().isoformat(), "python": platform.python_version(),
            "machine": platform.machine()}
    try:
        import torch

        info["torch"] = torch.__version__
        info["device"] = torch.cuda.get_device_name() if torch.cuda.is_available() else platform.processor() or "cpu"
    except ImportError:
        info["device"] = "cpu"
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        pass
    return info


def save_results(name: str, rows: list[dict], *, directory: Path | None = None, extra: dict | None = None) -> Path:
    """Write ``rows`` with :func:`environment_info` to ``<directory>/<date>-<device>-<name>.json``; the default
    directory is :func:`flashcourse.resources.new_results_dir` (the checkout's ``benchmarks/results``, or that
    folder under the current one when installed from a wheel)."""
    meta = environment_info()
    if extra:
        meta.update(extra)
    directory = Path(directory) if directory is not None else resources.new_results_dir()
    directory.mkdir(parents=True, exist_ok=True)
    device = "".join(c if c.isalnum() else "-" for c in meta["device"]).strip("-").lower()
    path = directory / f"{meta['date']}-{device}-{name}.json"
    rows = [asdict(r) if hasattr(r, "__dataclass_fields__") else r for r in rows]
    path.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    return path


def load_results(pattern: str = "*.json", *, directory: Path | None = None) -> list[dict]:
    """Every saved result file matching ``pattern``, newest name last, each as {"meta", "rows", "path"}."""
    directory = Path(directory) if directory is not None else results_dir()
    found = []
    for path in sorted(directory.glob(pattern)):
        data = json.loads(path.read_text())
        data["path"] = str(path)
        found.append(data)
    return found
