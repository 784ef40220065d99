"""The Gluon FlashAttention-3 forward (``flashcourse.kernels.fa3``, v8a-v8e) compiles for sm_90 on this CPU.

Gluon has no interpreter, so on a CPU the kernels are compiled ahead of time (``scripts/fa3_compile.py``: to a
cubin with the ptxas of the installed Triton's wheel) and their resources checked: no spills, shared memory
within sm_90's 227 KB a block, the register budgets (``setmaxnreg``) in the warp-specialized stages. Skipped,
with the reason, where the installed Triton's Gluon lacks what fa3.py uses. Compiled and checked under Triton
3.6 (the GPU machine's) and 3.9 (CI's). Whether the stages compute the right thing is the GPU's job:
``scripts/gpu_fa3.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
from flashcourse import device  # noqa: E402

if not device.triton_available():
    pytest.skip("Triton is not installed here", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "fa3_compile.py"
STAGES = ("v8a", "v8b", "v8c", "v8d", "v8e")


def _env(tmp_path: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), TRITON_CACHE_DIR=str(tmp_path / "triton-cache"))
    env.pop("TRITON_INTERPRET", None)
    return env


@pytest.mark.slow  # 35-55 s on two shared cores (Triton 3.6 / 3.9): ten compiles to cubin
def test_every_stage_compiles_for_sm90(tmp_path):
    out = tmp_path / "fa3.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--json", str(out)], capture_output=True, text=True,
                          env=_env(tmp_path), timeout=900)
    if proc.stdout.startswith("skipped:"):
        pytest.skip(proc.stdout.strip())
    assert out.exists(), proc.stdout + proc.stderr[-3000:]
    records = json.loads(out.read_text())["records"]
    assert {(r["stage"], r["head_dim"]) for r in records} == {(s, d) for s in STAGES for d in (64, 128)}
    for r in records:
        where = f"{r['stage']} D={r['head_dim']}"
        assert r["ok"], f"{where}: {r['error']}"
        assert r["spill_bytes"] == 0, f"{where} spills {r['spill_bytes']} bytes a thread"
        assert r["shared"] <= 232448, f"{where} allocates {r['shared']} bytes of shared memory"
        assert r["wgmma"] > 0, f"{where} has no wgmma"
        budgets = " ".join(r["setmaxnreg"])
        if r["stage"] == "v8a":
            assert not budgets, f"v8a is not warp-specialized, yet: {budgets}"
        else:  # the producer's warpgroup gives its registers away
            assert "setmaxnreg.dec.sync.aligned.u32 \t24" in budgets, f"{where}: {budgets}"
        if r["stage"] in ("v8c", "v8d", "v8e"):  # the consumers take 240
            assert "setmaxnreg.inc.sync.aligned.u32 \t240" in budgets, f"{where}: {budgets}"
    assert proc.returncode == 0, proc.stdout


def test_kernels_package_does_not_import_fa3():
    """CI's Triton may lack what fa3.py uses: ``import flashcourse.kernels`` must not load it."""
    code = "import sys, flashcourse.kernels; print('flashcourse.kernels.fa3' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=str(ROOT / "src")), timeout=300)
    assert proc.stdout.strip().splitlines()[-1] == "False", proc.stdout + proc.stderr[-2000:]


def test_unsupported_inputs_say_what_to_use():
    pytest.importorskip("triton.experimental.gluon.language.nvidia.hopper")
    import torch

    try:
        from flashcourse.kernels import fa3
    except (ImportError, AttributeError) as error:
        pytest.skip(f"fa3.py does not import under this Triton: {error}")

    def q(n=8, d=64, dtype=torch.float16):
        return torch.zeros(1, 2, n, d, dtype=dtype)

    with pytest.raises(ValueError, match="float16 or bfloat16.*flash_attention"):
        fa3.fa3_forward(q(dtype=torch.float32), q(dtype=torch.float32), q(dtype=torch.float32))
    with pytest.raises(ValueError, match=r"head dims \(64, 128\).*flash_attention"):
        fa3.fa3_forward(q(d=80), q(d=80), q(d=80))
    with pytest.raises(ValueError, match="contiguous"):
        t = q().transpose(1, 2)
        fa3.fa3_forward(t, t, t)
    with pytest.raises(ValueError, match="grouped-query"):
        fa3.fa3_forward(q(), torch.zeros(1, 1, 8, 64, dtype=torch.float16),
                        torch.zeros(1, 1, 8, 64, dtype=torch.float16))
    with pytest.raises(ValueError, match="Hopper.*flash_attention"):
        fa3.fa3_forward(q(), q(), q())
    with pytest.raises(ValueError, match="stage"):
        fa3.fa3_forward(q(), q(), q(), stage="v9")
    assert fa3.TESTED_TRITON == ("3.6",)
    assert list(fa3.STAGES) == list(STAGES)
