"""Every launch the kernels choose fits every supported GPU: compiled ahead of time for each, on this CPU.

``scripts/launch_fit.py`` runs the public API with Triton pointed at each target GPU and compiles every launch
for it as far as shared-memory allocation; what the compiler allocates must fit what the GPU lets one block
use. One test per architecture (the GPUs of one architecture share the compiled kernels). The GPU tier runs
the same script under the GPU machine's Triton (``scripts/gpu_tests.py``): allocation can change between
Triton versions.

``make test`` checks the two extreme architectures, sm_75 (T4: the least shared memory, no ``cp.async``, no
bfloat16) and sm_90 (H100 / H200: the most, and the FP8 forward); the three between them (sm_80, sm_86, sm_89) are
marked ``full``, which ``make test`` leaves out and ``make test-gpu`` runs (every architecture, in parallel, under
the GPU machine's Triton). Run them here with ``pytest -m full tests/test_launch_fit.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest
from child_env import child_pythonpath

pytest.importorskip("torch")
from flashcourse import device  # noqa: E402

if not device.triton_available():
    pytest.skip("Triton is not installed here", allow_module_level=True)
from flashcourse.kernels import configs  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "launch_fit.py"
BY_ARCHITECTURE: dict[tuple[int, int], list[str]] = defaultdict(list)
for _name, _props in sorted(configs.KNOWN_DEVICES.items()):
    BY_ARCHITECTURE[_props.capability].append(_name)


def run_fit(*args: str, tmp_path: Path) -> tuple[int, str, dict]:
    out = tmp_path / "fit.json"
    env = dict(os.environ, PYTHONPATH=child_pythonpath(), TRITON_CACHE_DIR=str(tmp_path / "triton-cache"))
    env.pop("TRITON_INTERPRET", None)
    proc = subprocess.run([sys.executable, str(SCRIPT), *args, "--json", str(out)], capture_output=True,
                          text=True, env=env, timeout=1500)
    assert out.exists(), proc.stdout + proc.stderr[-3000:]
    return proc.returncode, proc.stdout, json.loads(out.read_text())


EXTREMES = (min(BY_ARCHITECTURE), max(BY_ARCHITECTURE))


@pytest.mark.slow  # minutes per architecture: make test runs the extremes, make test-fast none
@pytest.mark.parametrize("capability", [
    pytest.param(c, id=f"sm_{c[0]}{c[1]}", marks=() if c in EXTREMES else pytest.mark.full)
    for c in sorted(BY_ARCHITECTURE)])
def test_every_chosen_launch_fits(capability, tmp_path):
    targets = BY_ARCHITECTURE[capability]
    code, stdout, result = run_fit(*(a for t in targets for a in ("--target", t)), tmp_path=tmp_path)
    rows = result["rows"]
    assert {r["target"] for r in rows} == set(targets)
    kernels_seen = {r["kernel"] for r in rows}
    # every kernel family the public API launches was compiled: forward, backward, decode (and FP8 on Hopper)
    expected = {"_fwd_v7_kernel", "_bwd_dkdv_kernel", "_bwd_dq_kernel", "_bwd_dkdv_b3_kernel", "_bwd_dq_b3_kernel",
                "_decode_split_kernel", "_decode_combine_kernel", "_tile_kinds_kernel", "_key_id_ranges_kernel",
                "_document_tile_kinds_kernel", "_tile_lists_kernel"}
    if capability >= (9, 0):
        expected.add("_fwd_fp8_kernel")
    assert expected <= kernels_seen, expected - kernels_seen
    head_dims = {int(r["case"].split("D=")[1].split()[0]) for r in rows}
    assert head_dims == {16, 32, 64, 80, 96, 128, 256}
    # the FP8 cache: compiled from sm_89 on (Triton's float8_e4m3fn), refused by name before it
    fp8_cache = {r["case"] for r in rows if r["case"].endswith("fp8 cache")}
    refused = {r["case"] for r in result["refused"]}
    if capability >= (8, 9):
        assert fp8_cache and not refused
    else:
        assert not fp8_cache and {c.split("D=")[1].split()[0] for c in refused} == {str(d) for d in head_dims}
    too_big = [r for r in rows if r["shared"] > r["limit"]]
    assert not too_big, "\n".join(f"{r['target']} {r['case']}: {r['kernel']} {r['launch']} needs {r['shared']} B "
                                  f"of {r['limit']}" for r in too_big[:20])
    assert code == 0, stdout


def test_a_launch_that_does_not_fit_is_reported(tmp_path):
    """The check can fail: a T4 that offered only 16 KB per block would not hold the chosen launches."""
    code, stdout, result = run_fit("--target", "T4", "--head-dim", "16", "--limit-kb", "16", tmp_path=tmp_path)
    assert code == 1 and "DOES NOT FIT" in stdout
    assert any(not r["fits"] for r in result["rows"])
