"""The GPU benchmarks' common ground: FLOP and byte formulas, rates, repeated timing, results saved as JSON.

Imports no Jupyter or widget package, so benchmarks run as plain scripts on a GPU machine.
The GPU benchmark itself is ``python -m flashcourse.bench attention`` (see ``bench/__main__.py``).

The method: every timed figure is the median of :data:`REPEATS` (at least three) CUDA-event timings, stored
with the slowest and fastest repeat (``ms``, ``ms_min``, ``ms_max``; ``tflops``, ``tflops_min``,
``tflops_max``), and one kernel beats another only when the spreads do not overlap (:func:`verdict`).
"""

from __future__ import annotations

import datetime as _dt
import json
import platform
import statistics
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

from flashcourse import resources

__all__ = [
    "REPEATS",
    "Timing",
    "attention_flops",
    "format_spread",
    "load_results",
    "merge_results",
    "results_dir",
    "save_results",
    "tflops",
    "time_repeats",
    "verdict",
]

REPEATS = 3  # timings per figure: the median is reported, the slowest and fastest bound its spread

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


@dataclass(frozen=True)
class Timing:
    """Milliseconds of one call: the median of ``repeats`` timings, and the fastest and slowest of them."""

    ms: float
    ms_min: float
    ms_max: float
    repeats: int

    def fields(self, flops: float | None = None) -> dict:
        """The JSON fields: ``ms``, ``ms_min``, ``ms_max``, ``repeats`` and, given the call's FLOPs, ``tflops``
        (from the median) with ``tflops_min`` (from the slowest repeat) and ``tflops_max`` (the fastest)."""
        row = {"ms": self.ms, "ms_min": self.ms_min, "ms_max": self.ms_max, "repeats": self.repeats}
        if flops is not None:
            row.update(tflops=tflops(flops, self.ms * 1e-3), tflops_min=tflops(flops, self.ms_max * 1e-3),
                       tflops_max=tflops(flops, self.ms_min * 1e-3))
        return row


def do_bench_ms(fn: Callable[[], object], grad_to_none=None, *, warmup: int = 10, rep: int = 50) -> float:
    """One CUDA-event timing: ``triton.testing.do_bench``'s median ms of fn over about ``rep`` ms of calls,
    after about ``warmup`` ms of warm-up calls (the L2 cache flushed before each call)."""
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=warmup, rep=rep, grad_to_none=grad_to_none,
                                         return_mode="median"))


def time_repeats(fn: Callable[[], object], *, repeats: int = REPEATS, grad_to_none=None,
                 timer: Callable[..., float] | None = None) -> Timing:
    """Time fn ``repeats`` times (each a whole :func:`do_bench_ms`, warm-up included, or ``timer(fn,
    grad_to_none)``) and return the median with the spread of the repeats."""
    if repeats < 3:
        raise ValueError(f"repeats={repeats}: a spread needs at least 3 repeats (the course's method)")
    timer = timer or do_bench_ms
    times = [float(timer(fn, grad_to_none)) for _ in range(repeats)]
    return Timing(statistics.median(times), min(times), max(times), repeats)


def verdict(new: Mapping, old: Mapping, key: str = "tflops", *, higher_is_better: bool = True) -> str | None:
    """How row ``new`` compares with row ``old`` on ``key`` (a rate, or a time with ``higher_is_better=False``):
    ``"gain"`` when even new's worst repeat beats old's best, ``"loss"`` the other way round, ``"within spread"``
    when the ranges overlap; None when either row has no median or no spread (a run older than the repeats)."""
    try:
        a, a_lo, a_hi = (float(new[f]) for f in (key, f"{key}_min", f"{key}_max"))
        b, b_lo, b_hi = (float(old[f]) for f in (key, f"{key}_min", f"{key}_max"))
    except (KeyError, TypeError):
        return None
    if not higher_is_better:  # a time: flip signs so that higher is better
        a, a_lo, a_hi, b, b_lo, b_hi = -a, -a_hi, -a_lo, -b, -b_hi, -b_lo
    if a_lo > b_hi:
        return "gain"
    if a_hi < b_lo:
        return "loss"
    return "within spread"


def format_spread(row: Mapping, key: str = "tflops", fmt: str = ".0f", suffix: str = "") -> str:
    """``544 (538-551)``: the median with the repeats' range when the row has one, else the median alone
    (results recorded before the repeats)."""
    value = f"{row[key]:{fmt}}{suffix}"
    if row.get(f"{key}_min") is None or row.get(f"{key}_max") is None:
        return value
    return f"{value} ({row[f'{key}_min']:{fmt}}-{row[f'{key}_max']:{fmt}})"


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


def _device_slug(device: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in device).strip("-").lower()


def save_results(name: str, rows: list[dict], *, directory: Path | None = None, extra: dict | None = None,
                 kind: str | None = None, meta: dict | None = None) -> Path:
    """Write ``rows`` with :func:`environment_info` (or the given ``meta``) to
    ``<directory>/<date>-<device>-<name>.json``; ``kind`` (the benchmark: attention, versions...) goes into the
    meta, so that :func:`merge_results` knows what it merges. The default directory is
    :func:`flashcourse.resources.new_results_dir` (the checkout's ``benchmarks/results``, or that folder under the
    current one when installed from a wheel)."""
    meta = dict(meta) if meta is not None else environment_info()
    if kind:
        meta["kind"] = kind
    if extra:
        meta.update(extra)
    directory = Path(directory) if directory is not None else resources.new_results_dir()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{meta['date']}-{_device_slug(meta['device'])}-{name}.json"
    rows = [asdict(r) if hasattr(r, "__dataclass_fields__") else r for r in rows]
    path.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    return path


def load_results(pattern: str = "*.json", *, directory: Path | None = None) -> list[dict]:
    """Every saved benchmark result file matching ``pattern``, newest name last, each as {"meta", "rows", "path"}.
    A file without rows is a test run's record (``scripts/gpu_tests.py``: meta, summary, files), skipped: its name
    may match a benchmark's pattern (``...-gpu-tests-<commit>-decode.json`` matches ``*-decode.json``)."""
    directory = Path(directory) if directory is not None else results_dir()
    found = []
    for path in sorted(directory.glob(pattern)):
        data = json.loads(path.read_text())
        if "rows" not in data:
            continue
        data["path"] = str(path)
        found.append(data)
    return found


# What identifies a row of each benchmark kind: a later file's row with the same identity replaces an earlier one.
ROW_IDENTITY = {
    "attention": ("provider", "dtype", "batch", "heads", "head_dim", "n", "causal", "mode", "forward_version",
                  "backward_version"),
    "versions": ("provider", "dtype", "batch", "heads", "head_dim", "n", "causal", "mode", "forward_version",
                 "backward_version"),
    "variants": ("variant", "dtype", "provider", "mode"),
    "train-step": ("dtype", "batch", "heads", "n", "head_dim", "causal", "mode"),
}


def result_kind(data: Mapping) -> str:
    """The benchmark a result file holds: its meta's ``kind``, or for files older than that field the name
    after ``<date>-<device>-`` (``attention-fp16`` -> attention, ``named-kernels-versions`` -> versions)."""
    if data["meta"].get("kind"):
        return data["meta"]["kind"]
    stem = Path(data["path"]).stem
    prefix = f"{data['meta'].get('date', '')}-{_device_slug(data['meta'].get('device', ''))}-"
    name = stem[len(prefix):] if stem.startswith(prefix) else stem
    for kind in ROW_IDENTITY:
        if name == kind or name.startswith(kind + "-") or name.endswith("-" + kind):
            return kind
    return name


def merge_results(name: str, paths: Iterable[Path | str], *, directory: Path | None = None) -> Path:
    """Merge result files of partial runs of one benchmark (a grid split by dtype or head dim across commands)
    into ``<directory>/<date>-<device>-<name>.json``: the first file's meta, plus ``merged_from`` (each file
    with its date and versions); rows in file order, a later file's row replacing an earlier one with the same
    identity (:data:`ROW_IDENTITY`). Files from different devices, benchmarks or library versions are refused."""
    parts = []
    for path in paths:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"no result file {path}: pass the JSON files written by the partial runs")
        parts.append({**json.loads(path.read_text()), "path": str(path)})
    if len(parts) < 2:
        raise ValueError(f"merge needs at least two result files, got {len(parts)}")
    first = parts[0]
    kind = result_kind(first)
    for part in parts[1:]:
        for what, get in (("device", lambda d: d["meta"].get("device")), ("benchmark", result_kind),
                          ("torch version", lambda d: d["meta"].get("torch")),
                          ("triton version", lambda d: d["meta"].get("triton"))):
            if get(part) != get(first):
                raise ValueError(f"cannot merge {Path(part['path']).name} into {Path(first['path']).name}: "
                                 f"{what} {get(part)!r} differs from {get(first)!r}; a merged file must hold one "
                                 f"benchmark on one device and software stack, so rerun the part that differs")
    identity = ROW_IDENTITY.get(kind)
    merged: dict = {}
    for index, part in enumerate(parts):
        for position, row in enumerate(part["rows"]):
            key = tuple(row.get(k) for k in identity) if identity else (index, position)
            merged.pop(key, None)  # a replaced row moves to where its new file puts it
            merged[key] = row
    meta = {k: v for k, v in first["meta"].items() if k != "merged_from"}
    meta["kind"] = kind
    meta["merged_from"] = [{"file": Path(p["path"]).name, "date": p["meta"].get("date"), "rows": len(p["rows"])}
                           for p in parts]
    return save_results(name, list(merged.values()), directory=directory, meta=meta)
