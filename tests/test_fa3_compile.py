"""The Gluon FlashAttention-3 forward (``flashcourse.kernels.hopper.fa3``, v8a-v8e) compiles for sm_90 on this CPU.

Gluon has no interpreter, so on a CPU the kernels are compiled ahead of time (``scripts/fa3_compile.py``: to a
cubin with the ptxas of the installed Triton's wheel) and their resources checked: no spills, shared memory
within sm_90's 227 KB a block, the register budgets (``setmaxnreg``) in the warp-specialized stages. Skipped,
with the reason, where the installed Triton's Gluon lacks what fa3.py uses. Compiled and checked under Triton
3.6 (the GPU machine's) and 3.9 (CI's). The ring's mbarrier protocol (ready / empty phases, two consumers,
ping-pong turns) is run on a thread model at the end. Whether the stages compute the right thing is the GPU's
job: ``benchmarks/gpu_fa3.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from child_env import child_pythonpath

pytest.importorskip("torch")
from flashcourse import device  # noqa: E402

if not device.triton_available():
    pytest.skip("Triton is not installed here", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "fa3_compile.py"
STAGES = ("v8a", "v8b", "v8c", "v8d", "v8e", "v8f", "v8g", "v8h")


def _env(tmp_path: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=child_pythonpath(), TRITON_CACHE_DIR=str(tmp_path / "triton-cache"))
    env.pop("TRITON_INTERPRET", None)
    return env


# `make test` compiles v8f, which holds every mechanism that v8b-v8e add one by one to the warp-specialized kernel
# (warp specialization, the consumers' register budget, the overlap, ping-pong) and runs them persistently, with
# three consumer warpgroups at D = 64; the stages before it are marked `full` (`make test-gpu` compiles them, and
# `pytest -m full` here).
@pytest.mark.slow  # 35-55 s on two shared cores (Triton 3.6 / 3.9) for v8a-v8e's ten compiles to cubin; v8f's two:
# about 10 s
@pytest.mark.parametrize("stages", [pytest.param(("v8f",), id="v8f"),
                                    pytest.param(tuple(s for s in STAGES if s not in ("v8f", "v8g")), id="v8a-v8e,v8h",
                                                 marks=pytest.mark.full)])
def test_every_stage_compiles_for_sm90(stages, tmp_path):
    _compile_and_check(stages, (), tmp_path)


@pytest.mark.slow
@pytest.mark.full  # eight compiles, about 40 s: `make test` compiles v8f in float16, causal (above)
def test_v8f_compiles_in_both_dtypes_causal_and_not(tmp_path):
    """v8f's consumers at D = 64 have 160 registers a thread and use nearly all of them: every variant is
    checked for spills, not only the float16 causal one."""
    _compile_and_check(("v8f",), ("--all",), tmp_path, variants=4)


@pytest.mark.slow
@pytest.mark.full  # sixteen compiles, about 100 s on two shared cores
def test_head_dim_256_compiles_without_spills(tmp_path):
    """At D = 256 a consumer warpgroup holds a 64 x 256 fp32 output (128 registers a thread of its 240) beside
    its scores and P, and Q with two K/V stages of 64 keys take 192 KB of shared memory: v8c-v8f compile in
    both dtypes, causal and not, within sm_90's 227 KB and without spills under the GPU's Triton (3.6); v8a and
    v8b do not take D = 256. Under Triton 3.9 (CI's) v8f's causal kernel keeps a few values derived from the
    thread index (its mask's and its store's) in 48 bytes of local memory, reloaded once a key tile: the
    persistent loop's state beside the output leaves ptxas no register for them there."""
    records = _compile_and_check(("v8a", "v8b", "v8c", "v8d", "v8e", "v8f"), ("--all", "--head-dims", "256"),
                                 tmp_path, variants=4, head_dims=(256,), takes=("v8c", "v8d", "v8e", "v8f"),
                                 spills={("v8f", True): 48})
    assert all(196608 <= r["shared"] <= 232448 for r in records)  # Q 64 KB + 2 x (K + V) 64 KB, and barriers


@pytest.mark.slow
@pytest.mark.full  # eight compiles, about 40 s
def test_v8g_keeps_the_exponentials_under_pv(tmp_path):
    """v8g's wait for K(j+1) holds the wait for PV(j-1) below the softmax: in the SASS every exponential of a tile
    (64 of P's and alpha's: a 64 x 128 score tile over 128 threads) lies between the two GEMM waits of each
    overlapped loop (unmasked and masked, in each consumer warpgroup), at D 64 and 128, both dtypes, causal and
    not, without spills. v8d, compiled beside it, has none there: ptxas moves its PV wait above them."""
    records = _compile_and_check(("v8d", "v8g"), ("--all",), tmp_path, variants=4)
    for r in records:
        where = f"{r['stage']} D={r['head_dim']} {r['dtype']} causal={r['causal']}"
        assert len(r["ex2_under_pv"]) >= 2, f"{where}: {r['ex2_under_pv']}"
        if r["stage"] == "v8g":
            assert min(r["ex2_under_pv"]) >= 64, f"{where}: {r['ex2_under_pv']}"
        else:
            assert max(r["ex2_under_pv"]) < 64, f"{where}: {r['ex2_under_pv']}"


def _compile_and_check(stages, flags, tmp_path, variants=1, head_dims=(64, 128), takes=None, spills=None):
    """Compile ``stages`` with scripts/fa3_compile.py and check each record: compiled, no spill, shared memory
    within sm_90's 227 KB, wgmma present, the register budgets of each stage. ``takes``: the stages of
    ``stages`` that take ``head_dims`` (the others compile nothing). ``spills``: (stage, causal) -> the bytes
    a thread that Triton releases other than the GPU's (3.6) may spill there. Returns the records."""
    out = tmp_path / "fa3.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), *(a for s in stages for a in ("--stage", s)), *flags,
                           "--json", str(out)], capture_output=True, text=True, env=_env(tmp_path), timeout=900)
    if proc.stdout.startswith("skipped:"):
        pytest.skip(proc.stdout.strip())
    assert out.exists(), proc.stdout + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    records = result["records"]
    allowed = {} if result["triton"].startswith("3.6.") or spills is None else spills
    takes = stages if takes is None else takes
    assert len(records) == len(takes) * len(head_dims) * variants
    assert {(r["stage"], r["head_dim"]) for r in records} == {(s, d) for s in takes for d in head_dims}
    for r in records:
        where = f"{r['stage']} D={r['head_dim']} {r['dtype']} causal={r['causal']}"
        assert r["ok"], f"{where}: {r['error']}"
        limit = allowed.get((r["stage"], r["causal"]), 0)
        assert r["spill_bytes"] <= limit, f"{where} spills {r['spill_bytes']} bytes a thread"
        assert r["shared"] <= 232448, f"{where} allocates {r['shared']} bytes of shared memory"
        assert r["wgmma"] > 0, f"{where} has no wgmma"
        budgets = " ".join(r["setmaxnreg"])
        if r["stage"] == "v8a":
            assert not budgets, f"v8a is not warp-specialized, yet: {budgets}"
        elif r["stage"] != "v8f" or r["head_dim"] == 128:  # the producer's warpgroup gives its registers away
            assert "setmaxnreg.dec.sync.aligned.u32 \t24" in budgets, f"{where}: {budgets}"
        if r["stage"] in ("v8c", "v8d", "v8e", "v8g") or (r["stage"] == "v8f" and r["head_dim"] != 64):
            assert "setmaxnreg.inc.sync.aligned.u32 \t240" in budgets, f"{where}: {budgets}"  # two consumers
        if r["stage"] == "v8f" and r["head_dim"] == 64:  # three consumer warpgroups of 160, FA3's at D = 64
            assert "setmaxnreg.inc.sync.aligned.u32 \t160" in budgets, f"{where}: {budgets}"
            assert "setmaxnreg.dec.sync.aligned.u32 \t32" in budgets, f"{where}: {budgets}"
    assert proc.returncode == 0, proc.stdout
    return records


def test_kernels_package_does_not_import_fa3():
    """CI's Triton may lack what fa3.py uses: ``import flashcourse.kernels`` must not load it."""
    code = "import sys, flashcourse.kernels; print('flashcourse.kernels.hopper.fa3' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=child_pythonpath()), timeout=300)
    assert proc.stdout.strip().splitlines()[-1] == "False", proc.stdout + proc.stderr[-2000:]


def test_unsupported_inputs_say_what_to_use():
    pytest.importorskip("triton.experimental.gluon.language.nvidia.hopper")
    import torch

    try:
        from flashcourse.kernels.hopper import fa3
    except (ImportError, AttributeError) as error:
        pytest.skip(f"fa3.py does not import under this Triton: {error}")

    def q(n=8, d=64, dtype=torch.float16):
        return torch.zeros(1, 2, n, d, dtype=dtype)

    with pytest.raises(ValueError, match="float16 or bfloat16.*flash_attention"):
        fa3.fa3_forward(q(dtype=torch.float32), q(dtype=torch.float32), q(dtype=torch.float32))
    with pytest.raises(ValueError, match=r"stage v8c takes head dims \(64, 128, 256\).*flash_attention"):
        fa3.fa3_forward(q(d=80), q(d=80), q(d=80))
    with pytest.raises(ValueError, match=r"stage v8a takes head dims \(64, 128\) \(got 256\)"):
        fa3.fa3_forward(q(d=256), q(d=256), q(d=256), stage="v8a")
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
    assert fa3.TESTED_TRITON == ("3.6", "3.9")
    assert list(fa3.STAGES) == list(STAGES)


def test_v8f_launch_by_head_dim():
    """v8f launches three consumer warpgroups (192 query rows, 160 registers each, the producer 32) at D = 64 and
    two (128 rows, 240 / 24) at D = 128, one program per SM at most; the other stages launch as before."""
    pytest.importorskip("triton.experimental.gluon.language.nvidia.hopper")
    import torch

    try:
        from flashcourse.kernels.hopper import fa3
    except (ImportError, AttributeError) as error:
        pytest.skip(f"fa3.py does not import under this Triton: {error}")

    v8f = fa3.STAGES["v8f"]
    at64, at128 = v8f.at(64), v8f.at(128)
    assert (at64.consumers, at64.block_m(), at64.consumer_regs, at64.producer_regs) == (3, 192, 160, 32)
    assert (at128.consumers, at128.block_m(), at128.consumer_regs, at128.producer_regs) == (2, 128, 240, 24)
    # Warpgroups of 128 threads: the budgets fill, and do not overrun, the 64K registers of an SM.
    assert 3 * 160 + 32 <= 512 and 2 * 240 + 24 <= 504
    for name in ("v8a", "v8b", "v8c", "v8d", "v8e"):
        assert fa3.STAGES[name].at(64) is fa3.STAGES[name] and not fa3.STAGES[name].persistent
    # Non-causal, N = 4096, B*H = 128 on 132 SMs: 22 query tiles of 192 rows a head, more units than SMs.
    assert at64.grid(4096, 128, False, 132) == (132,)
    assert at128.grid(1000, 2, True, 132) == (8,)  # 8 query tiles a head in 4 heavy-light pairs, two heads
    assert at128.grid(1000, 2, False, 132) == (16,)
    assert fa3.STAGES["v8d"].grid(1000, 2, True, 132) == (8, 2)
    signature, constexprs = fa3.kernel_signature(v8f, 64, torch.bfloat16, True)
    assert signature["BH"] == "i32" and constexprs["CONSUMERS"] == 3 and "OVERLAP" not in constexprs
    assert "[64,64]" in signature["q_desc"] and "[128,64]" in signature["k_desc"]
    assert "BH" not in fa3.kernel_signature(fa3.STAGES["v8e"], 64, torch.bfloat16, True)[0]
    # v8g is v8d with the held PV wait (which needs a ring of two stages: test_held_pv_wait_needs_two_ring_stages);
    # no other stage holds it, so their kernels compile as before.
    assert fa3.STAGES["v8g"] == replace(fa3.STAGES["v8d"], name="v8g", adds=fa3.STAGES["v8g"].adds,
                                        expected=fa3.STAGES["v8g"].expected, by_head_dim={}, hold_pv_wait=True)
    assert [n for n, s in fa3.STAGES.items() if s.constexprs(True).get("HOLD_PV_WAIT")] == ["v8g"]
    # v8h is v8d with a third ring stage, at D 64 and 128 only (at D = 256 Q and three stages need 256 KB).
    assert fa3.STAGES["v8h"] == replace(fa3.STAGES["v8d"], name="v8h", adds=fa3.STAGES["v8h"].adds,
                                        expected=fa3.STAGES["v8h"].expected, by_head_dim={}, stages=3,
                                        block_n={64: 128, 128: 128})


def test_head_dim_256_launch():
    """D = 256 is v8c-v8f's, with FA3's sizes there: 128-row query tiles over two consumer warpgroups (240
    registers, a 64 x 256 fp32 output being 128 of them), 64-key tiles in a ring of two stages (the largest
    power of two whose ring fits beside Q), v8f without ping-pong; D 64 and 128 launch as before."""
    pytest.importorskip("triton.experimental.gluon.language.nvidia.hopper")
    import torch

    try:
        from flashcourse.kernels.hopper import fa3
    except (ImportError, AttributeError) as error:
        pytest.skip(f"fa3.py does not import under this Triton: {error}")

    assert [name for name, s in fa3.STAGES.items() if 256 in s.head_dims] == ["v8c", "v8d", "v8e", "v8f", "v8g"]
    shared_limit, element = 232448, 2

    def shared(stage, block_n):  # Q, then K and V in each ring stage
        return stage.block_m() * 256 * element + stage.stages * 2 * block_n * 256 * element

    for name in ("v8c", "v8d", "v8e", "v8f"):
        stage = fa3.STAGES[name].at(256)
        assert (stage.consumers, stage.block_m(), stage.block_n[256], stage.stages) == (2, 128, 64, 2), name
        assert (stage.consumer_regs, stage.producer_regs) == (240, 24), name
        assert shared(stage, 64) <= shared_limit < shared(stage, 128), name
        assert "D = 256" in stage.expected, name  # what the stage table expects there, and why
        signature, constexprs = fa3.kernel_signature(fa3.STAGES[name], 256, torch.float16, False)
        assert "[64,256]" in signature["q_desc"] and "[64,256]" in signature["k_desc"], name
        assert constexprs["PINGPONG"] == (name == "v8e"), name
    # D 64 and 128: (consumers, key tile, ping-pong, consumer registers) as before D = 256 came.
    before = {"v8a": ((1, 128, False, 0), (1, 64, False, 0)), "v8b": ((1, 128, False, 0), (1, 64, False, 0)),
              "v8c": ((2, 128, False, 240), (2, 128, False, 240)), "v8d": ((2, 128, False, 240), (2, 128, False, 240)),
              "v8e": ((2, 128, True, 240), (2, 128, True, 240)), "v8f": ((3, 128, True, 160), (2, 128, True, 240))}
    for name, launches in before.items():
        for head_dim, launch in zip((64, 128), launches, strict=True):
            stage = fa3.STAGES[name].at(head_dim)
            assert (stage.consumers, stage.block_n[head_dim], stage.pingpong, stage.consumer_regs) == launch, name


def test_gpu_script_checks_what_v8f_adds_and_names_a_partial_run_apart(tmp_path):
    """benchmarks/gpu_fa3.py's check shapes reach what v8f adds: N_kv a multiple of 128 with N_q awkward, an odd
    number of query tiles at 128 and 192 rows (a causal head's middle tile, which has no partner), N_q > N_kv,
    and more work units than an H100 / H200 has SMs (132), so that programs take several query tiles in turn.
    A run of some stages is saved apart from the stage table. (Read in a child process: the script drops
    TRITON_INTERPRET, which this process's kernels need.)"""
    code = ("import json, sys; sys.path.insert(0, 'benchmarks'); import gpu_fa3 as g; print(json.dumps(["
            "g.CHECK_SHAPES, g.QUICK_CHECK_SHAPES, g.results_name(['v8a', 'v8d', 'v8f'], False), "
            "g.results_name(['v8a'], True)]))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                          env=_env(tmp_path), timeout=300)
    shapes, quick, part, whole = json.loads(proc.stdout.splitlines()[-1])
    assert any(n_q != n_kv and n_kv % 128 == 0 and n_q % 64 for n_q, n_kv, _, _ in shapes)
    for block_m in (128, 192):
        assert any(-(-n_q // block_m) % 2 == 1 and -(-n_q // block_m) > 1 for n_q, _, _, _ in shapes), block_m
    assert any(n_q > n_kv for n_q, n_kv, _, _ in shapes)
    units = max(b * h * -(-n_q // 128) // 2 for n_q, _, b, h in shapes)  # causal pairs at D = 128
    assert units > 132, units
    assert all(shape in shapes for shape in quick)
    assert (part, whole) == ("fa3-stages-v8a-v8d-v8f", "fa3-stages")
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_fa3.py"), "--references", "sdpa_bogus"],
                          capture_output=True, text=True, env=_env(tmp_path), timeout=300)
    assert proc.returncode == 2 and "unknown references" in proc.stderr, proc.stderr[-2000:]


def test_gpu_script_times_shorter_lengths_apart(tmp_path):
    """``--lengths 1024,2048`` times the stages at a GPT-2-size sequence (B = 4, H = 32, as the attention grid),
    saved under a name of its own, never the stage table; a length that is no multiple of 128 is refused."""
    code = ("import json, sys; sys.path.insert(0, 'benchmarks'); import gpu_fa3 as g; print(json.dumps(["
            "g.time_shapes(False, (64,), g.parse_lengths('2048,1024')), g.time_shapes(False, (64,)), "
            "g.results_name(['v8a', 'v8f'], False, (64, 128), (1024, 2048)), "
            "g.results_name(['v8a', 'v8b'], True, (64, 128), (1024,))]))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                          env=_env(tmp_path), timeout=300)
    short, default, part, every = json.loads(proc.stdout.splitlines()[-1])
    assert {(b, h, n) for b, h, n, _, _, _ in short} == {(4, 32, 1024), (4, 32, 2048)}
    assert {(b, h, n) for b, h, n, _, _, _ in default} == {(4, 32, 4096), (4, 16, 8192), (4, 8, 16384)}
    assert len(short) == 2 * 2 * 2  # two lengths, two dtypes, causal and not
    assert (part, every) == ("fa3-stages-v8a-v8f-n1024-2048", "fa3-stages-v8a-v8b-n1024")
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_fa3.py"), "--lengths", "1000"],
                          capture_output=True, text=True, env=_env(tmp_path), timeout=300)
    assert proc.returncode == 2 and "multiples of 128" in proc.stderr, proc.stderr[-2000:]


def test_gpu_script_runs_head_dim_256_apart_and_checks_the_ring_across_query_tiles(tmp_path):
    """``--head-dims 256`` runs the stages that take it, saved under a name of its own (never the stage table,
    whatever the stages); a head dim no stage has is refused before anything runs. Its check shapes include,
    causal and not, a v8f program that takes several query tiles of 128 rows whose count of 64-key tiles is
    odd, so that the ring's phases carry over from one query tile to the next flipped."""
    code = ("import json, sys; sys.path.insert(0, 'benchmarks'); import gpu_fa3 as g; print(json.dumps(["
            "g.CHECK_SHAPES, g.results_name(['v8d', 'v8e', 'v8f'], False, (256,)), "
            "g.results_name(['v8a', 'v8b', 'v8c', 'v8d', 'v8e', 'v8f'], True, (256,)), "
            "g.results_name(['v8a'], True, (64, 128)), g.parse_head_dims('256,64')]))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                          env=_env(tmp_path), timeout=300)
    shapes, part, every_256, table, dims = json.loads(proc.stdout.splitlines()[-1])
    assert (part, table, dims) == ("fa3-stages-v8d-v8e-v8f-d256", "fa3-stages", [64, 256])
    assert every_256.startswith("fa3-stages-") and every_256.endswith("-d256")
    for causal in (False, True):
        carried = False
        for n_q, n_kv, batch, heads in shapes:
            n_m = -(-n_q // 128)
            programs = min(batch * heads * ((n_m + 1) // 2 if causal else n_m), 132)
            for program in range(programs):
                tiles = [_v8f_key_tiles(m, 128, 64, n_kv, causal)
                         for _, m in _v8f_items(program, programs, n_m, batch * heads, causal)]
                carried |= any(count % 2 for count in tiles[:-1])
        assert carried, causal
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_fa3.py"), "--head-dims", "80"],
                          capture_output=True, text=True, env=_env(tmp_path), timeout=300)
    assert proc.returncode == 2 and "expected some of 64, 128, 256" in proc.stderr, proc.stderr[-2000:]


# ------------------------------------------------------------------------------------------ the ring protocol
# What compiling cannot show is whether the mbarrier protocol is right: a wrong phase bit hangs the GPU, a slot
# refilled too early gives wrong numbers. Here the protocol of fa3.py's warp-specialized kernel (its index and
# phase arithmetic, written out again) runs on Python threads over a model of an mbarrier (a count of arrivals;
# a wait for parity P returns once the phase of parity P has completed, i.e. while the current phase's parity
# differs from P), with TMA copies that land after a random delay. Every read of a ring slot must find the tile
# it expects, still there when the warpgroup frees the slot; nothing may deadlock; under ping-pong the two
# warpgroups must issue their GEMMs in turns. A deadlock is found without a clock: when every thread of the run
# waits on a barrier and no wait is satisfied, nothing can ever arrive. The random delays only vary the
# interleaving; no outcome depends on how long anything takes.
import random  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402


class Deadlock(Exception):
    """Every thread of a protocol run waits on a barrier, and none of the waits can return."""


class _World(threading.Condition):
    """The threads of one protocol run and the one lock and condition their barriers share.

    ``running`` counts the threads that are not waiting on a barrier: those started here (one sleeping in a random
    delay runs) and the thread that created the run until it calls :meth:`join` (until then it may still start a
    partition that arrives). A waiter that finds none running and no wait satisfied has found a deadlock: it says
    so, and wakes the others, which say so too, so every thread ends and :meth:`join` returns.
    """

    def __init__(self):
        super().__init__()
        self.creator = threading.get_ident()
        self.creator_running = True
        self.running = 1  # the creator
        self.waits: list = []  # the conditions the waiting threads wait for
        self.deadlocked = False
        self.threads: list[threading.Thread] = []

    def start(self, fn, *args) -> threading.Thread:
        """Run ``fn(*args)`` on a thread of this run (counted as running from now)."""

        def body():
            try:
                fn(*args)
            finally:
                with self:
                    self.running -= 1
                    self.notify_all()  # the waiters look again: this may have been the last thread running

        with self:
            self.running += 1
            if threading.get_ident() == self.creator and not self.creator_running:  # starting again after a join
                self.creator_running = True
                self.running += 1
        thread = threading.Thread(target=body, daemon=True)
        self.threads.append(thread)
        thread.start()
        return thread

    def wait_until(self, done, what: str) -> None:
        """Block (the lock held) until ``done()``; raise Deadlock when no thread of the run can make it true."""
        if done():
            return
        self.waits.append(done)
        self.running -= 1
        try:
            while not done():
                if self.deadlocked or (self.running == 0 and not any(wait() for wait in self.waits)):
                    self.deadlocked = True
                    self.notify_all()
                    raise Deadlock(f"deadlock: every thread waits, one of them for {what}")
                self.wait()
        finally:
            self.waits.remove(done)
            self.running += 1

    def join(self) -> None:
        """Wait for every thread of the run, those started meanwhile too (the creator starts none from now)."""
        with self:
            if self.creator_running:
                self.creator_running = False
                self.running -= 1
                self.notify_all()
        index = 0
        while index < len(self.threads):
            self.threads[index].join()
            index += 1


    def run_partitions(self, *partitions) -> None:
        """Run each partition ``(fn, *args)`` on a thread of this run and wait for them all (a deadlock ends every
        thread with :class:`Deadlock`, found without a clock); fail with the first error a partition raised."""
        errors = []

        def guarded(fn, *args):
            try:
                fn(*args)
            except BaseException as error:  # noqa: BLE001 - reported below
                errors.append(error)

        for fn, *args in partitions:
            self.start(guarded, fn, *args)
        self.join()
        assert not errors, errors[0]


class _MBarrier:
    def __init__(self, count: int, world: _World):
        self.count, self.pending, self.phase, self.world = count, count, 0, world

    def arrive(self):
        with self.world:
            self.pending -= 1
            if self.pending == 0:
                self.phase ^= 1
                self.pending = self.count
                self.world.notify_all()

    def wait(self, parity: int, pred: bool = True):
        if not pred:
            return
        with self.world:
            self.world.wait_until(lambda: self.phase != parity, f"parity {parity}")


def _jitter(rng: random.Random):
    time.sleep(rng.random() * 2e-4)


def _run_protocol(n_tiles: int, stages: int, consumers: int, overlap: bool, pingpong: bool, seed: int,
                  hold: bool = False):
    world = _World()
    rng = random.Random(seed)
    k_slot, v_slot = [None] * stages, [None] * stages
    k_ready = [_MBarrier(1, world) for _ in range(stages)]
    v_ready = [_MBarrier(1, world) for _ in range(stages)]
    k_empty = [_MBarrier(consumers, world) for _ in range(stages)]
    v_empty = [_MBarrier(consumers, world) for _ in range(stages)]
    turns = [_MBarrier(1, world) for _ in range(2)]
    issued = []

    def tma(slots, slot, value, barrier):
        def land():
            _jitter(random.Random(value[1] * 7 + slot))
            slots[slot] = value
            barrier.arrive()
        world.start(land)

    def producer():
        for j in range(n_tiles):
            slot, phase = j % stages, (j // stages) & 1
            k_empty[slot].wait(phase ^ 1)
            tma(k_slot, slot, ("K", j), k_ready[slot])
            v_empty[slot].wait(phase ^ 1)
            tma(v_slot, slot, ("V", j), v_ready[slot])

    def read(slots, slot, expected):
        assert slots[slot] == expected, f"slot {slot} holds {slots[slot]}, expected {expected}"

    def consumer(wg: int):
        if not overlap:
            for j in range(n_tiles):
                slot, phase = j % stages, (j // stages) & 1
                k_ready[slot].wait(phase)
                read(k_slot, slot, ("K", j))
                _jitter(rng)
                read(k_slot, slot, ("K", j))
                k_empty[slot].arrive()
                v_ready[slot].wait(phase)
                read(v_slot, slot, ("V", j))
                _jitter(rng)
                read(v_slot, slot, ("V", j))
                v_empty[slot].arrive()
            return
        k_ready[0].wait(0)
        read(k_slot, 0, ("K", 0))
        k_empty[0].arrive()
        for j in range(1, n_tiles):
            slot, phase = j % stages, (j // stages) & 1
            prev, prev_phase = (j - 1) % stages, ((j - 1) // stages) & 1
            turn = j - 1
            k_ready[slot].wait(phase)
            v_ready[prev].wait(prev_phase)
            if pingpong:
                if wg == 0:
                    turns[0].wait((turn - 1) & 1, pred=turn > 0)
                else:
                    turns[1].wait(turn & 1)
            with world:
                issued.append((wg, turn))
            read(k_slot, slot, ("K", j))
            read(v_slot, prev, ("V", j - 1))
            if pingpong:
                turns[1 - wg].arrive()
            _jitter(rng)
            read(k_slot, slot, ("K", j))
            k_empty[slot].arrive()
            if hold:  # v8g: K(j+1) waited between the softmax and PV(j-1)'s wait, V(j-1) still held
                k_ready[(j + 1) % stages].wait(((j + 1) // stages) & 1, pred=j + 1 < n_tiles)
            _jitter(rng)
            read(v_slot, prev, ("V", j - 1))
            v_empty[prev].arrive()
        last = (n_tiles - 1) % stages
        v_ready[last].wait(((n_tiles - 1) // stages) & 1)
        read(v_slot, last, ("V", n_tiles - 1))
        v_empty[last].arrive()

    world.run_partitions((producer,), *[(consumer, wg) for wg in range(consumers)])
    if pingpong and consumers == 2:
        assert issued == [(wg, t) for t in range(n_tiles - 1) for wg in (0, 1)], issued


@pytest.mark.parametrize("stage", ["v8b", "v8c", "v8d", "v8e", "v8g"])  # v8f: test_v8f_protocol
@pytest.mark.parametrize("n_tiles", [1, 2, 3, 8])
def test_ring_protocol_of_each_stage(stage, n_tiles):
    """The kernel's own switches per stage (fa3.STAGES), ring depths 2 and 3, a few random interleavings."""
    spec = {"v8b": (1, False, False, False), "v8c": (2, False, False, False), "v8d": (2, True, False, False),
            "v8e": (2, True, True, False), "v8g": (2, True, False, True)}
    consumers, overlap, pingpong, hold = spec[stage]
    for stages in (2, 3):
        for seed in range(3):
            _run_protocol(n_tiles, stages, consumers, overlap, pingpong, seed, hold=hold)


def test_held_pv_wait_needs_two_ring_stages():
    """v8g's wait for K(j+1) comes before this warpgroup frees V(j-1); with a ring of one stage the producer must
    free that slot (V(j-1)) before it loads K(j+1), so both wait forever: the model finds it (and the stage table
    gives v8g two stages)."""
    with pytest.raises(AssertionError, match="Deadlock|waits"):
        _run_protocol(3, 1, 2, True, False, 0, hold=True)
    _run_protocol(3, 1, 2, True, False, 0, hold=False)


def _v8f_items(program: int, programs: int, n_m: int, heads: int, causal: bool):
    """The query tiles (bh, pid_m) program ``program`` of v8f takes, in order: ``_v8f_unit`` and
    ``_v8f_query_tile``'s arithmetic, written out again."""
    per_head = (n_m + 1) // 2 if causal else n_m
    for unit in range(program, heads * per_head, programs):
        bh, tile = divmod(unit, per_head)
        items = 1 + (n_m - 1 - tile != tile) if causal else 1
        for half in range(items):
            yield bh, (n_m - 1 - tile - half * (n_m - 1 - 2 * tile)) if causal else tile


def _v8f_key_tiles(pid_m: int, block_m: int, block_n: int, n_kv: int, causal: bool) -> int:
    hi = min(n_kv, (pid_m + 1) * block_m) if causal else n_kv
    return -(-hi // block_n)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n_m", [1, 2, 5, 32])
def test_v8f_programs_take_every_query_tile_once(n_m, causal):
    heads, programs = 7, 5
    taken = [item for p in range(programs) for item in _v8f_items(p, programs, n_m, heads, causal)]
    assert sorted(taken) == [(bh, m) for bh in range(heads) for m in range(n_m)]


def test_v8f_causal_pairs_share_the_work_evenly():
    """Causal, N = 4096 at D = 128 (32 query tiles a head, B*H = 128) on 132 programs: heavy-light pairs give each
    program 15 or 16 pairs of 33 key tiles (at most 1/15 more than another); query tiles dealt out one at a time,
    heaviest first, give some programs 28% more than others."""
    n_m, heads, programs = 32, 128, 132

    def work(items):
        return [sum(_v8f_key_tiles(m, 128, 128, n_m * 128, True) for _, m in items(p)) for p in range(programs)]

    pairs = work(lambda p: _v8f_items(p, programs, n_m, heads, True))
    assert max(pairs) / min(pairs) <= 16 / 15, (max(pairs), min(pairs))
    one_by_one = work(lambda p: [(bh, n_m - 1 - i) for k, (bh, i) in
                                 enumerate((bh, i) for bh in range(heads) for i in range(n_m)) if k % programs == p])
    assert max(one_by_one) / min(one_by_one) > 1.25


def _run_v8f_protocol(tiles_per_item: list[int], stages: int, consumers: int, seed: int, q_empty_flip: int = 1,
                      pingpong: bool = True):
    """v8f's protocol: the ring and the turns run on across the query tiles a program takes; each query tile's
    Q is loaded into the consumers' buffers once every consumer arrived on ``q_empty`` after its last QK^T.
    Without ``pingpong`` (v8f at D = 256) the warpgroups take no turns."""
    world = _World()
    rng = random.Random(seed)
    k_slot, v_slot, q_slot = [None] * stages, [None] * stages, [None] * consumers
    k_ready = [_MBarrier(1, world) for _ in range(stages)]
    v_ready = [_MBarrier(1, world) for _ in range(stages)]
    k_empty = [_MBarrier(consumers, world) for _ in range(stages)]
    v_empty = [_MBarrier(consumers, world) for _ in range(stages)]
    q_ready = [_MBarrier(1, world) for _ in range(consumers)]
    q_empty = _MBarrier(consumers, world)
    turns = [_MBarrier(1, world) for _ in range(consumers)]
    issued = []

    def tma(slots, slot, value, barrier):
        def land():
            _jitter(random.Random(f"{value} {slot}"))
            slots[slot] = value
            barrier.arrive()
        world.start(land)

    def read(slots, slot, expected):
        assert slots[slot] == expected, f"slot {slot} holds {slots[slot]}, expected {expected}"

    def producer():
        r0 = 0
        for item, n_tiles in enumerate(tiles_per_item):
            q_empty.wait((item & 1) ^ q_empty_flip)
            for w in range(consumers):
                tma(q_slot, w, ("Q", item, w), q_ready[w])
            for j in range(n_tiles):
                r = r0 + j
                slot, phase = r % stages, (r // stages) & 1
                k_empty[slot].wait(phase ^ 1)
                tma(k_slot, slot, ("K", item, j), k_ready[slot])
                v_empty[slot].wait(phase ^ 1)
                tma(v_slot, slot, ("V", item, j), v_ready[slot])
            r0 += n_tiles

    def consumer(wg: int):
        r0 = 0
        for item, n_tiles in enumerate(tiles_per_item):
            q_ready[wg].wait(item & 1)
            read(q_slot, wg, ("Q", item, wg))
            slot = r0 % stages
            k_ready[slot].wait((r0 // stages) & 1)
            read(k_slot, slot, ("K", item, 0))
            k_empty[slot].arrive()
            turn0 = r0 - item
            for j in range(1, n_tiles):
                r = r0 + j
                slot, prev, turn = r % stages, (r - 1) % stages, turn0 + j - 1
                k_ready[slot].wait((r // stages) & 1)
                v_ready[prev].wait(((r - 1) // stages) & 1)
                if pingpong:
                    if wg == 0:
                        turns[0].wait((turn - 1) & 1, pred=turn > 0)
                    else:
                        turns[wg].wait(turn & 1)
                with world:
                    issued.append((wg, turn))
                read(q_slot, wg, ("Q", item, wg))
                read(k_slot, slot, ("K", item, j))
                read(v_slot, prev, ("V", item, j - 1))
                if pingpong:
                    turns[(wg + 1) % consumers].arrive()
                _jitter(rng)
                read(k_slot, slot, ("K", item, j))
                k_empty[slot].arrive()
                _jitter(rng)
                read(v_slot, prev, ("V", item, j - 1))
                v_empty[prev].arrive()
            read(q_slot, wg, ("Q", item, wg))
            q_empty.arrive()
            last = r0 + n_tiles - 1
            v_ready[last % stages].wait((last // stages) & 1)
            read(v_slot, last % stages, ("V", item, n_tiles - 1))
            v_empty[last % stages].arrive()
            r0 += n_tiles

    world.run_partitions((producer,), *[(consumer, wg) for wg in range(consumers)])
    turns_taken = sum(n - 1 for n in tiles_per_item)
    if pingpong:
        assert issued == [(wg, t) for t in range(turns_taken) for wg in range(consumers)], issued
    else:
        assert sorted(issued) == sorted((wg, t) for t in range(turns_taken) for wg in range(consumers)), issued


@pytest.mark.parametrize("consumers", [2, 3])
@pytest.mark.parametrize("tiles_per_item", [[1], [3], [2, 1, 4], [1, 1, 5, 2]], ids=str)
def test_v8f_protocol(tiles_per_item, consumers):
    """v8f (persistent, 2 or 3 consumer warpgroups in turns), ring depths 2 and 3, a few interleavings."""
    for stages in (2, 3):
        for seed in range(2):
            _run_v8f_protocol(tiles_per_item, stages, consumers, seed)


@pytest.mark.parametrize("tiles_per_item", [[1], [15, 15, 3], [2, 7, 1]], ids=str)
def test_v8f_protocol_without_turns(tiles_per_item):
    """v8f at D = 256: two consumer warpgroups take no turns; the ring (two stages), Q and the phases still hold
    across query tiles with odd counts of key tiles (64-key tiles: 15 at N_kv = 960)."""
    for seed in range(2):
        _run_v8f_protocol(tiles_per_item, 2, 2, seed, pingpong=False)


def test_v8f_protocol_model_catches_a_wrong_q_phase():
    """The v8f model is not vacuous: a producer that waits on q_empty for the wrong parity (item & 1, not its
    flip) waits on a fresh barrier's running phase before the first Q, which no consumer can complete."""
    with pytest.raises(AssertionError, match="deadlock"):
        _run_v8f_protocol([2, 2], 2, 2, seed=0, q_empty_flip=0)


def test_the_protocol_model_catches_a_wrong_phase():
    """The model is not vacuous: a producer that waits on the wrong parity of a fresh empty barrier is a deadlock,
    found at once; the right parity returns."""
    world = _World()
    barrier = _MBarrier(1, world)
    errors = []

    def producer(parity):
        try:
            barrier.wait(parity)
        except Deadlock as error:
            errors.append(error)

    world.start(producer, 1)  # a fresh barrier: phase 0 running, so "parity 1 completed" holds at once
    world.join()
    assert errors == []
    world.start(producer, 0)  # nobody arrives: phase 0 never completes
    world.join()
    assert len(errors) == 1 and "parity 0" in str(errors[0])


def test_a_deadlock_of_two_waiting_threads_is_found_and_ends_both():
    """Two partitions each waiting for the other's arrival (a swapped pair of waits): both are told, none hangs."""
    world = _World()
    a_done, b_done = _MBarrier(1, world), _MBarrier(1, world)
    errors = []

    def partition(wait_for, then_arrive):
        try:
            wait_for.wait(0)
            then_arrive.arrive()
        except Deadlock as error:
            errors.append(error)

    world.start(partition, b_done, a_done)
    world.start(partition, a_done, b_done)
    world.join()
    assert len(errors) == 2, errors
