"""The Gluon FlashAttention-3 forward (``flashcourse.kernels.hopper.fa3``, v8a-v8e) compiles for sm_90 on this CPU.

Gluon has no interpreter, so on a CPU the kernels are compiled ahead of time (``scripts/fa3_compile.py``: to a
cubin with the ptxas of the installed Triton's wheel) and their resources checked: no spills, shared memory
within sm_90's 227 KB a block, the register budgets (``setmaxnreg``) in the warp-specialized stages. Skipped,
with the reason, where the installed Triton's Gluon lacks what fa3.py uses. Compiled and checked under Triton
3.6 (the GPU machine's) and 3.9 (CI's). The ring's mbarrier protocol (ready / empty phases, two consumers,
ping-pong turns) is run on a thread model at the end. Whether the stages compute the right thing is the GPU's
job: ``scripts/gpu_fa3.py``.
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


# `make test` compiles v8e, the last stage, which holds every mechanism the others add one by one (warp
# specialization, the consumers' register budget, the overlap, ping-pong); the four before it are marked `full`
# (`make test-gpu` compiles them, and `pytest -m full` here).
@pytest.mark.slow  # 35-55 s on two shared cores (Triton 3.6 / 3.9) for all ten compiles to cubin, a fifth for v8e
@pytest.mark.parametrize("stages", [pytest.param(STAGES[-1:], id="v8e"),
                                    pytest.param(STAGES[:-1], id="v8a-v8d", marks=pytest.mark.full)])
def test_every_stage_compiles_for_sm90(stages, tmp_path):
    out = tmp_path / "fa3.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), *(a for s in stages for a in ("--stage", s)), "--json",
                           str(out)], capture_output=True, text=True, env=_env(tmp_path), timeout=900)
    if proc.stdout.startswith("skipped:"):
        pytest.skip(proc.stdout.strip())
    assert out.exists(), proc.stdout + proc.stderr[-3000:]
    records = json.loads(out.read_text())["records"]
    assert {(r["stage"], r["head_dim"]) for r in records} == {(s, d) for s in stages for d in (64, 128)}
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
    code = "import sys, flashcourse.kernels; print('flashcourse.kernels.hopper.fa3' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=str(ROOT / "src")), timeout=300)
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


def _run_protocol(n_tiles: int, stages: int, consumers: int, overlap: bool, pingpong: bool, seed: int):
    world = _World()
    rng = random.Random(seed)
    k_slot, v_slot = [None] * stages, [None] * stages
    k_ready = [_MBarrier(1, world) for _ in range(stages)]
    v_ready = [_MBarrier(1, world) for _ in range(stages)]
    k_empty = [_MBarrier(consumers, world) for _ in range(stages)]
    v_empty = [_MBarrier(consumers, world) for _ in range(stages)]
    turns = [_MBarrier(1, world) for _ in range(2)]
    issued, errors = [], []

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
            _jitter(rng)
            read(v_slot, prev, ("V", j - 1))
            v_empty[prev].arrive()
        last = (n_tiles - 1) % stages
        v_ready[last].wait(((n_tiles - 1) // stages) & 1)
        read(v_slot, last, ("V", n_tiles - 1))
        v_empty[last].arrive()

    def guarded(fn, *args):
        try:
            fn(*args)
        except BaseException as error:  # noqa: BLE001 - reported by the test
            errors.append(error)

    world.start(guarded, producer)
    for wg in range(consumers):
        world.start(guarded, consumer, wg)
    world.join()
    assert not errors, errors[0]
    if pingpong and consumers == 2:
        assert issued == [(wg, t) for t in range(n_tiles - 1) for wg in (0, 1)], issued


@pytest.mark.parametrize("stage", STAGES[1:])
@pytest.mark.parametrize("n_tiles", [1, 2, 3, 8])
def test_ring_protocol_of_each_stage(stage, n_tiles):
    """The kernel's own switches per stage (fa3.STAGES), ring depths 2 and 3, a few random interleavings."""
    spec = {"v8b": (1, False, False), "v8c": (2, False, False), "v8d": (2, True, False), "v8e": (2, True, True)}
    consumers, overlap, pingpong = spec[stage]
    for stages in (2, 3):
        for seed in range(3):
            _run_protocol(n_tiles, stages, consumers, overlap, pingpong, seed)


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
