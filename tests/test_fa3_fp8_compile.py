"""The FP8 Gluon forward (``flashcourse.kernels.hopper.fa3_fp8``, v8c_fp8, V transposed inside the kernel) on a CPU.

Gluon has no interpreter, so the kernel is compiled ahead of time for sm_90 (to a cubin, with the ptxas of the
installed Triton's wheel, through ``scripts/fa3_compile.py``'s helpers) and its resources checked: no spills,
shared memory within 227 KB, the register budgets, FP8 wgmma, and the transpose lowered to shared-memory loads,
byte permutes and stmatrix. Then what a compile cannot show: the producer's protocol (K ring, V staging, V^T
ring) on Python threads over tests/test_fa3_compile.py's mbarrier model, and the kernel's index and transposition
arithmetic written out in NumPy (flat TMA rows across heads, tiles past the end, the (D, BLOCK_N) buffer written
through its permuted view and read through it again, P rounded to e4m3 as p * 2^8, the descales) giving
attention within ``fp8.error_bound`` of the float64 reference. Whether the GPU agrees: ``benchmarks/gpu_fa3_fp8.py``.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
from child_env import child_pythonpath

np = pytest.importorskip("numpy")
torch = pytest.importorskip("torch")
from flashcourse import device  # noqa: E402

if not device.triton_available():
    pytest.skip("Triton is not installed here", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = ROOT / "scripts" / "fa3_fp8_compile.py"


def _env(tmp_path: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=child_pythonpath(), TRITON_CACHE_DIR=str(tmp_path / "triton-cache"))
    env.pop("TRITON_INTERPRET", None)
    return env


# `make test` compiles v8e_fp8 at D = 128, causal: the stage with every mechanism (the V transpose, the overlap,
# the turns, the masks); the other variants are marked `full` (`make test-gpu` compiles them, `pytest -m full`
# here). Under Triton 3.6 and 3.9, no variant spills (scripts/fa3_fp8_compile.py --all).
@pytest.mark.slow  # one compile to cubin: about 10 s on two shared cores; the full set: 8 compiles, about 35 s
@pytest.mark.parametrize("stages,head_dims,flags", [
    pytest.param(("v8e_fp8",), (128,), (), id="v8e_fp8-D128-causal"),
    pytest.param(("v8c_fp8", "v8e_fp8"), (64, 128), ("--all",), id="every-variant", marks=pytest.mark.full)])
def test_fp8_stages_compile_for_sm90(stages, head_dims, flags, tmp_path):
    out = tmp_path / "fa3_fp8.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), *(a for s in stages for a in ("--stage", s)),
                           *(a for d in head_dims for a in ("--head-dim", str(d))), *flags, "--json", str(out)],
                          capture_output=True, text=True, env=_env(tmp_path), timeout=900)
    if proc.stdout.startswith("skipped:"):
        pytest.skip(proc.stdout.strip())
    assert out.exists(), proc.stdout + proc.stderr[-3000:]
    records = json.loads(out.read_text())["records"]
    causals = (False, True) if flags else (True,)
    assert {(r["stage"], r["head_dim"], r["causal"]) for r in records} == {
        (s, d, c) for s in stages for d in head_dims for c in causals}
    for r in records:
        where = f"{r['stage']} D={r['head_dim']} causal={r['causal']}"
        assert r["ok"], f"{where}: {r['error']}"
        assert r["spill_bytes"] == 0, f"{where} spills {r['spill_bytes']} bytes a thread"
        assert r["shared"] <= 232448, f"{where} allocates {r['shared']} bytes of shared memory"
        assert r["wgmma_fp8"] > 0, f"{where} has no e4m3 wgmma"
        assert r["stmatrix"] > 0, f"{where}: the V transpose is not lowered to stmatrix"
        assert r["fence_proxy_async"] > 0, f"{where}: no proxy fence between the transpose and the wgmma"
        budgets = " ".join(r["setmaxnreg"])
        assert "setmaxnreg.dec.sync.aligned.u32 \t56" in budgets, f"{where}: {budgets}"  # the producer
        assert "setmaxnreg.inc.sync.aligned.u32 \t224" in budgets, f"{where}: {budgets}"  # the consumers
        if r["stage"] == "v8c_fp8":
            assert r["overlapped_ex2"] == [], f"{where} waits for one product while another runs"
        else:
            # Two consumer partitions, each with an unmasked and a masked loop; in each, the tile's 64
            # exponentials of p (and 2 of alpha) a thread run between QK^T(j)'s wait and P(j-1) V(j-1)'s.
            assert len(r["overlapped_ex2"]) == 4, f"{where}: {r['overlapped_ex2']}"
            assert min(r["overlapped_ex2"]) >= 64, (
                f"{where}: only {r['overlapped_ex2']} exponentials between the waits: ptxas moved the wait for "
                "P V up, and the softmax no longer runs under it")
    assert proc.returncode == 0, proc.stdout


def test_overlapped_ex2_counts_what_sits_between_the_waits(monkeypatch):
    spec = importlib.util.spec_from_file_location("_fa3_fp8_compile", SCRIPT)
    fa3_fp8_compile = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, fa3_fp8_compile)  # where its dataclass looks itself up
    spec.loader.exec_module(fa3_fp8_compile)
    ops = ["WARPGROUP.DEPBAR.LE gsb0, 0x0", "MUFU.EX2 R1, R1",  # no stretch open
           "WARPGROUP.DEPBAR.LE gsb0, 0x1", "MUFU.EX2 R2, R2", "FFMA R3, R3, R4, R5", "MUFU.EX2 R3, R3",
           "WARPGROUP.DEPBAR.LE gsb0, 0x0", "MUFU.EX2 R6, R6",
           "WARPGROUP.DEPBAR.LE gsb0, 0x1", "WARPGROUP.DEPBAR.LE gsb0, 0x0", "MUFU.EX2 R7, R7"]
    assert fa3_fp8_compile.overlapped_ex2(ops) == [2, 0]
    counted = fa3_fp8_compile.opcode_counts(ops + ["@!P0 SHFL.IDX PT, R1, R2, R3, R4", "SHFL.BFLY PT, R5, R6, R7",
                                                   "PRMT R1, R2, 0x5410, R3", "QGMMA.64x128x32.F32.E4M3.E4M3 R0, gdesc",
                                                   "LDSM.16.M88.4 R0, [R1]", "HFMA2 R0, R1, R2, R3"])
    assert counted == {"SHFL": 2, "PRMT": 1, "LDS": 0, "STS": 0, "F2FP": 0, "MUFU": 5, "HGMMA": 0, "QGMMA": 1}


def test_kernels_package_does_not_import_fa3_fp8():
    code = "import sys, flashcourse.kernels; print('flashcourse.kernels.hopper.fa3_fp8' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=child_pythonpath()), timeout=300)
    assert proc.stdout.strip().splitlines()[-1] == "False", proc.stdout + proc.stderr[-2000:]


def _fa3_fp8():
    pytest.importorskip("triton.experimental.gluon.language.nvidia.hopper")
    try:
        from flashcourse.kernels.hopper import fa3_fp8
    except (ImportError, AttributeError) as error:
        pytest.skip(f"fa3_fp8.py does not import under this Triton: {error}")
    return fa3_fp8


def test_unsupported_inputs_say_what_to_use():
    fa3_fp8 = _fa3_fp8()
    fp8 = torch.float8_e4m3fn

    def t(n=8, d=64, dtype=fp8, heads=2):
        return torch.zeros(1, heads, n, d, dtype=dtype)

    with pytest.raises(ValueError, match="float8_e4m3fn.*quantize_fp8.*fa3_forward"):
        fa3_fp8.fa3_fp8_forward(t(dtype=torch.float16), t(dtype=torch.float16), t(dtype=torch.float16))
    with pytest.raises(ValueError, match=r"head dims \(64, 128\).*flash_attention"):
        fa3_fp8.fa3_fp8_forward(t(d=96), t(d=96), t(d=96))
    with pytest.raises(ValueError, match="grouped-query.*flash_attention_forward_fp8"):
        fa3_fp8.fa3_fp8_forward(t(), t(heads=1), t(heads=1))
    with pytest.raises(ValueError, match="contiguous.*v_keys_contiguous.*flash_attention_forward_fp8"):
        v = t().transpose(2, 3).contiguous().transpose(2, 3)  # keys adjacent: not what this kernel reads
        fa3_fp8.fa3_fp8_forward(t(), t(), v)
    with pytest.raises(ValueError, match="out_dtype"):
        fa3_fp8.fa3_fp8_forward(t(), t(), t(), out_dtype=torch.float32)
    with pytest.raises(ValueError, match="Hopper.*flash_attention_forward_fp8"):
        fa3_fp8.fa3_fp8_forward(t(), t(), t())
    with pytest.raises(ValueError, match=r"q_descale.*\(1, 2\) float32.*quantize_fp8"):
        fa3_fp8.fa3_fp8_forward(t(), t(), t(), torch.ones(2))
    with pytest.raises(ValueError, match=r"stage 'v9_fp8'.*v8c_fp8.*v8e_fp8"):
        fa3_fp8.fa3_fp8_forward(t(), t(), t(), stage="v9_fp8")


def test_the_stage_table():
    """Each stage is a set of switches of the one kernel, with what it adds and what it was expected to do; the
    signature a stage compiles with carries them, and the default stays the measured v8c_fp8."""
    fa3_fp8 = _fa3_fp8()
    assert list(fa3_fp8.STAGES) == ["v8c_fp8", "v8e_fp8"] and fa3_fp8.DEFAULT_STAGE == "v8c_fp8"
    switches = {name: (s.overlap, s.pingpong) for name, s in fa3_fp8.STAGES.items()}
    assert switches == {"v8c_fp8": (False, False), "v8e_fp8": (True, True)}
    for name, stage in fa3_fp8.STAGES.items():
        assert stage.adds and "cuDNN" in stage.expected, name
        signature, constexprs = fa3_fp8.kernel_signature(128, torch.bfloat16, True, name)
        assert (constexprs["OVERLAP"], constexprs["PINGPONG"], constexprs["CAUSAL"]) == (*switches[name], True)
        assert all(signature[key] == "constexpr" for key in constexprs)
    assert fa3_fp8.kernel_signature(64, torch.float16, False) == fa3_fp8.kernel_signature(64, torch.float16, False,
                                                                                         "v8c_fp8")


def test_the_gpu_script_rates_every_stage():
    """benchmarks/gpu_fa3_fp8.py (run in a child: importing it turns the interpreter off) gives each FP8 row its
    ratio to cuDNN's fp16 and each stage's rows their ratio to the other stages and the references; its checks
    reach N_q != N_kv both ways and programs with an unmasked run of key tiles after tile 0."""
    code = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import gpu_fa3_fp8 as g
def t(provider, tflops):
    return dict(kind="time", provider=provider, n=4096, head_dim=128, causal=False, batch=4, heads=16,
                status="ok", tflops=tflops, tflops_min=tflops - 10, tflops_max=tflops + 10)
rows = [t("v8c_fp8", 700), t("v8e_fp8", 910), t("triton_fp8_as_given", 600), t("sdpa_cudnn_fp16", 600)]
g.add_cudnn_ratios(rows)
print(json.dumps({"rows": {r["provider"]: r for r in rows}, "checks": g.CHECK_NS, "quick": g.QUICK_CHECK_NS}))
"""
    proc = subprocess.run([sys.executable, "-c", code, str(ROOT / "benchmarks")], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=child_pythonpath()), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    rows = result["rows"]
    assert rows["v8e_fp8"]["ratio_vs_cudnn_fp16"] == pytest.approx(910 / 600)
    assert rows["v8e_fp8"]["ratio_vs_cudnn_fp16_min"] == pytest.approx(900 / 610)
    assert rows["v8e_fp8"]["ratio_vs_v8c_fp8"] == pytest.approx(1.3)
    assert rows["v8c_fp8"]["ratio_vs_v8e_fp8"] == pytest.approx(1 / 1.3)
    assert rows["v8e_fp8"]["ratio_vs_triton_fp8_as_given"] == pytest.approx(910 / 600)
    assert rows["triton_fp8_as_given"]["ratio_vs_cudnn_fp16"] == pytest.approx(1.0)
    assert not any(key.startswith("ratio") for key in rows["sdpa_cudnn_fp16"])
    for shapes in (result["checks"], result["quick"]):
        assert any(n_q < n_kv for n_q, n_kv in shapes) and all(n_q > 0 and n_kv > 0 for n_q, n_kv in shapes)
        # 128-key tiles: some non-causal check has at least two whole tiles after tile 0 (v8e_fp8's unmasked loop)
        assert any(n_kv // 128 >= 3 for _, n_kv in shapes)
    assert any(n_q > n_kv for n_q, n_kv in result["checks"])


# ------------------------------------------------------------------------------------------ the producer's protocol
def _forward_test():
    """tests/test_fa3_compile.py as a module: its mbarrier model is reused, not copied."""
    spec = importlib.util.spec_from_file_location("_fa3_forward_test", ROOT / "tests" / "test_fa3_compile.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run_fp8_protocol(n_tiles: int, ring: int, seed: int, stage: str = "v8c_fp8") -> None:
    """fa3_fp8's barriers, phases and order on threads: the producer issues K(j) and V(j) (TMA lands later),
    then transposes V(j-1) once it landed and its V^T slot is free; two consumers read K and V^T tiles in their
    stage's order, and must find the right tile in each slot for as long as they read it.

    v8c_fp8's consumers take tile j whole: K(j), then V^T(j). v8e_fp8's (``_fp8_consumer`` with OVERLAP and
    PINGPONG): QK^T of tile 0 alone; then for j >= 1 the pair QK^T(j), P(j-1) V(j-1) is issued in the warpgroup's
    turn (reading K(j) until QK^T's wait, V^T(j-1) until the product's), with K(j+1) waited for in between; the
    last tile's product alone."""
    model = _forward_test()
    fa3_fp8 = _fa3_fp8()
    spec = fa3_fp8.STAGES[stage]
    world = model._World()
    rng = random.Random(seed)
    bar = model._MBarrier
    k_ready, v_landed, vt_ready = ([bar(1, world) for _ in range(ring)] for _ in range(3))
    k_empty, vt_empty = ([bar(2, world) for _ in range(ring)] for _ in range(2))
    turns = [bar(1, world) for _ in range(2)]
    k_slots, staging, vt_slots = [None] * ring, [None] * ring, [None] * ring
    errors = []

    def tma(slots, slot, tile, barrier):
        def land():
            model._jitter(rng)
            slots[slot] = tile
            barrier.arrive()
        world.start(land)

    def transpose(j):
        slot, phase = j % ring, (j // ring) & 1
        v_landed[slot].wait(phase)
        tile = staging[slot]
        assert tile == ("v", j), f"staging slot {slot} holds {tile}, transposing tile {j}"
        vt_empty[slot].wait(phase ^ 1)
        model._jitter(rng)
        vt_slots[slot] = ("vt", j)
        vt_ready[slot].arrive()

    def producer():
        for j in range(n_tiles):
            slot, phase = j % ring, (j // ring) & 1
            k_empty[slot].wait(phase ^ 1)
            tma(k_slots, slot, ("k", j), k_ready[slot])
            tma(staging, slot, ("v", j), v_landed[slot])
            if j > 0:
                transpose(j - 1)
        if n_tiles > 0:
            transpose(n_tiles - 1)

    def holds(slots, slot, tile, wg):
        assert slots[slot] == tile, f"wg {wg} reads {slots[slot]} for {tile}"

    def consumer(wg):
        for j in range(n_tiles):
            slot, phase = j % ring, (j // ring) & 1
            k_ready[slot].wait(phase)
            holds(k_slots, slot, ("k", j), wg)
            model._jitter(rng)
            holds(k_slots, slot, ("k", j), wg)  # not refilled while read
            k_empty[slot].arrive()
            vt_ready[slot].wait(phase)
            holds(vt_slots, slot, ("vt", j), wg)
            model._jitter(rng)
            holds(vt_slots, slot, ("vt", j), wg)
            vt_empty[slot].arrive()

    def overlapped_consumer(wg):
        k_ready[0].wait(0)
        holds(k_slots, 0, ("k", 0), wg)
        model._jitter(rng)
        k_empty[0].arrive()
        for j in range(1, n_tiles):
            slot, prev, turn = j % ring, (j - 1) % ring, j - 1
            k_ready[slot].wait((j // ring) & 1)
            vt_ready[prev].wait(((j - 1) // ring) & 1)
            if spec.pingpong:
                if wg == 0:
                    turns[0].wait((turn - 1) & 1, pred=turn > 0)
                else:
                    turns[1].wait(turn & 1)
            holds(k_slots, slot, ("k", j), wg)  # both products issued
            holds(vt_slots, prev, ("vt", j - 1), wg)
            if spec.pingpong:
                turns[1 - wg].arrive()
            model._jitter(rng)
            holds(k_slots, slot, ("k", j), wg)  # QK^T(j) landed
            k_empty[slot].arrive()
            model._jitter(rng)  # the softmax
            nxt = j + 1
            k_ready[nxt % ring].wait((nxt // ring) & 1, pred=nxt < n_tiles)
            holds(vt_slots, prev, ("vt", j - 1), wg)  # P(j-1) V(j-1) landed
            vt_empty[prev].arrive()
        last = n_tiles - 1
        vt_ready[last % ring].wait((last // ring) & 1)
        holds(vt_slots, last % ring, ("vt", last), wg)
        model._jitter(rng)
        holds(vt_slots, last % ring, ("vt", last), wg)
        vt_empty[last % ring].arrive()

    def guarded(fn, *args):
        try:
            fn(*args)
        except BaseException as error:  # noqa: BLE001 - reported by the test
            errors.append(error)

    world.start(guarded, producer)
    for wg in (0, 1):
        world.start(guarded, overlapped_consumer if spec.overlap else consumer, wg)
    world.join()  # a deadlock ends every thread with model.Deadlock, found without a clock
    assert not errors, errors[0]


@pytest.mark.parametrize("stage", ["v8c_fp8", "v8e_fp8"])
@pytest.mark.parametrize("n_tiles", [1, 2, 3, 7])
def test_producer_transpose_protocol(n_tiles, stage):
    for seed in range(3):
        _run_fp8_protocol(n_tiles, ring=2, seed=seed, stage=stage)


# ------------------------------------------------------------------------------------------ index arithmetic
def _e4m3(x):
    return torch.from_numpy(np.ascontiguousarray(x)).to(torch.float8_e4m3fn).to(torch.float64).numpy()


def _key_tiles(first_row, n_kv, causal, rows, block_n):
    """fa3._key_tiles, written out again."""
    full, hi = n_kv // block_n, n_kv
    if causal:
        hi = min(n_kv, first_row + rows)
        full = min(full, first_row // block_n)
    return full, (hi + block_n - 1) // block_n


def _v8f_mask(n_kv, start_n, block_n, rows, causal):
    """fa3._v8f_mask's test, written out: key start_n + c is kept where (c & ~6) <= last - (c & 6), with last the
    row's last visible key relative to start_n."""
    c = np.arange(block_n)
    last = np.full(len(rows), n_kv - 1 - start_n)
    if causal:
        last = np.minimum(last, rows - start_n)
    return (c & ~6)[None, :] <= last[:, None] - (c & 6)[None, :]


def _emulate(q8, k8, v8, qd, kd, vd, causal, head_dim, stage="v8c_fp8"):
    """The kernel's arithmetic in float64 NumPy: returns (o, lse) as it would store them (before out_dtype).
    ``stage``'s consumer order: v8c_fp8 tile by tile; v8e_fp8 (overlap) tile 0 always masked, tiles
    [1, max(full, 1)) not, then P(j-1) V(j-1) added before the rescale by alpha(j), the last product alone."""
    from flashcourse.kernels.hopper import fa3_fp8

    overlap = fa3_fp8.STAGES[stage].overlap

    batch, heads, n_q, d = q8.shape
    n_kv = k8.shape[2]
    rows_wg, block_n, ring = fa3_fp8.ROWS, fa3_fp8.BLOCK_N[head_dim], fa3_fp8.RING
    block_m = rows_wg * fa3_fp8.CONSUMERS
    qf, kf, vf = (t.reshape(-1, d) for t in (q8, k8, v8))  # the 2-D (B*H*N, D) views the descriptors see

    def tma(flat, row, rows):  # a box of `rows` rows from `row`; TMA fills zeros past the tensor's end
        box = np.zeros((rows, d))
        part = flat[row:row + rows]
        box[:len(part)] = part
        return box

    o = np.zeros((batch * heads, n_q, d))
    lse = np.zeros((batch * heads, n_q))
    grid_m = -(-n_q // block_m)
    for bh in range(batch * heads):
        qk_scale = (1.0 / math.sqrt(d)) * 1.4426950408889634 * qd.flat[bh] * kd.flat[bh]
        for pid in range(grid_m):
            pid_m = grid_m - 1 - pid if causal else pid
            m0 = pid_m * block_m
            full, n_tiles = _key_tiles(m0, n_kv, causal, block_m, block_n)
            kv_row = bh * n_kv
            stage = np.zeros((ring, block_n, d))
            vt = np.zeros((ring, d, block_n))  # (D, BLOCK_N): keys contiguous
            k_ring = np.zeros((ring, block_n, d))
            tiles = []
            for j in range(n_tiles):  # the producer
                slot = j % ring
                k_ring[slot] = tma(kf, kv_row + j * block_n, block_n)
                stage[slot] = tma(vf, kv_row + j * block_n, block_n)
                # the transpose: the register tile (block_n, d) stored through vt[slot].permute((1, 0))
                view = vt[slot].transpose(1, 0)
                view[:, :] = stage[slot]
                tiles.append((k_ring[slot].copy(), vt[slot].copy()))
            for wg in range(fa3_fp8.CONSUMERS):
                r0 = m0 + wg * rows_wg
                q_tile = tma(qf, bh * n_q + r0, rows_wg)
                rows = r0 + np.arange(rows_wg)
                m_i = np.full(rows_wg, -1.0e30)
                l_i = np.zeros(rows_wg)
                acc = np.zeros((rows_wg, d))
                p_prev = None
                for j in range(n_tiles):
                    k_tile, vt_tile = tiles[j]
                    s = q_tile @ k_tile.T  # B operand: the K tile's permuted view
                    if overlap and (j == 0 or j >= max(full, 1)):
                        s = np.where(_v8f_mask(n_kv, j * block_n, block_n, rows, causal), s, -np.inf)
                    elif not overlap and j >= full:
                        cols = j * block_n + np.arange(block_n)
                        ok = cols[None, :] < n_kv
                        if causal:
                            ok = ok & (cols[None, :] <= rows[:, None])
                        s = np.where(ok, s, -np.inf)
                    m_new = np.maximum(m_i, s.max(axis=1) * qk_scale)
                    p = np.exp2(s * qk_scale - (m_new - 8.0)[:, None])
                    alpha = np.exp2(m_i - m_new)
                    l_i = l_i * alpha + p.sum(axis=1)
                    if not overlap:
                        acc = acc * alpha[:, None] + _e4m3(p) @ vt_tile.transpose(1, 0)  # B: vt's permuted view
                    elif j > 0:  # tile j-1's product, issued beside QK^T(j), then tile j's rescale
                        acc = (acc + _e4m3(p_prev) @ tiles[j - 1][1].transpose(1, 0)) * alpha[:, None]
                    p_prev = p
                    m_i = m_new
                if overlap:
                    acc = acc + _e4m3(p_prev) @ tiles[n_tiles - 1][1].transpose(1, 0)
                keep = rows < n_q
                empty = l_i == 0
                l_safe = np.where(empty, 1.0, l_i)
                o[bh, rows[keep]] = (acc * (vd.flat[bh] / l_safe)[:, None])[keep]
                lse[bh, rows[keep]] = np.where(empty, -np.inf, (m_i - 8.0 + np.log2(l_safe)) * math.log(2))[keep]
    return o.reshape(batch, heads, n_q, d), lse.reshape(batch, heads, n_q)


@pytest.mark.parametrize("stage", ["v8c_fp8", "v8e_fp8"])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n_q,n_kv", [(1, 1), (17, 17), (200, 200), (130, 300), (300, 129)])
def test_the_kernels_index_arithmetic_gives_attention(head_dim, causal, n_q, n_kv, stage):
    _fa3_fp8()
    from flashcourse.kernels import fp8

    gen = torch.Generator().manual_seed(n_q * 7 + n_kv + head_dim + causal)
    q, k, v = (torch.randn(1, 2, n, head_dim, generator=gen) * s
               for n, s in ((n_q, 1.5), (n_kv, 1.5), (n_kv, 1.0)))
    x = fp8.quantize_fp8(q, k, v)
    q8, k8, v8 = (t.to(torch.float64).numpy() for t in (x.q, x.k, x.v))
    o, lse = _emulate(q8, k8, v8, x.q_descale.numpy().astype(np.float64), x.k_descale.numpy().astype(np.float64),
                      x.v_descale.numpy().astype(np.float64), causal, head_dim, stage)
    qd, kd, vd = x.dequantized()
    o_ref, lse_ref, p_abs_v = fp8.reference_forward(qd, kd, vd, causal=causal, p_shift=fp8.P_SHIFT)
    bound = fp8.error_bound(o_ref, p_abs_v, float(vd.abs().max()), n_kv, out_dtype=torch.float16)
    err = (torch.from_numpy(o) - o_ref).abs()
    worst = int(err.argmax())
    assert bool((err <= bound).all()), (f"max error {float(err.flatten()[worst]):.3g}, "
                                        f"bound there {float(bound.flatten()[worst]):.3g}")
    assert np.allclose(lse, lse_ref.numpy(), atol=1e-6, rtol=1e-9)


def test_the_transpose_layout_covers_each_element_once():
    """The producer's register tile: BlockedLayout([4, 4], [4, 8], [4, 1], order [0, 1]) over (BLOCK_N, D),
    4 warps: every element is held by exactly one thread, each thread 4 consecutive keys x 4 consecutive
    channels a block (a 4-byte read along D, a 4-byte write along the keys)."""
    for head_dim in (64, 128):
        block_n = 128
        owner = np.full((block_n, head_dim), -1)
        tile_rows, tile_cols = 4 * 4 * 4, 4 * 8
        for warp in range(4):
            for lane in range(32):
                t_row, t_col = lane % 4, lane // 4  # order [0, 1]: dim 0 fastest across lanes
                for rep_r in range(block_n // tile_rows):
                    for rep_c in range(head_dim // tile_cols):
                        r = rep_r * tile_rows + warp * 16 + t_row * 4
                        c = rep_c * tile_cols + t_col * 4
                        block = owner[r:r + 4, c:c + 4]
                        assert (block == -1).all()
                        block[:] = warp * 32 + lane
        assert (owner >= 0).all()
        assert (np.bincount(owner.ravel()) == block_n * head_dim // 128).all()
