"""Backward b8 (``flashcourse.kernels.hopper.fa3_backward_d256``: FA3's backward at head dim 256, the warpgroups
splitting the head dim) compiles for sm_90 on this CPU, and what compiling cannot show is modelled in Python.

As tests/test_b7_compile.py does for b7: the kernel is compiled ahead of time to a cubin (no GPU) and its resources
checked; the handoffs between its four partitions (loader, two consumer warpgroups, dQ writer) run on the forward
test's mbarrier model (no deadlock, no buffer overwritten while read, the writer adds every chunk); b8's arithmetic
(S and dP split by keys, P and dS exchanged, dK, dV and dQ split by head-dim columns, dQ in chunks) is written out in
float64 NumPy and compared with the gradients. Whether the kernel computes them is the GPU's job:
``benchmarks/gpu_b7.py --variants b8``. Skipped where the running Triton's Gluon has no ``tma.async_atomic_add``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
from child_env import child_pythonpath

pytest.importorskip("torch")
from flashcourse import device  # noqa: E402

if not device.triton_available():
    pytest.skip("Triton is not installed here", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[1]


def _sibling(name: str):
    """Another test file as a module: its models are reused, not copied."""
    spec = importlib.util.spec_from_file_location(f"_b8_{name}", Path(__file__).with_name(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


needs_tma_reduce = _sibling("test_b7_compile").needs_tma_reduce

# What the subprocess prints: b8 to b8d compiled for sm_90 at D = 256 in fp16 and bf16, causal and not, the cubin's
# resources (scripts/fa3_compile.py's reader), what the PTX holds and, from the SASS, the scalar conversions (F2F)
# and exponentials (MUFU.EX2); and the preprocess and dQ convert at D = 256.
_COMPILE = r"""
import hashlib, json, os, sys
os.environ.pop("TRITON_INTERPRET", None)
sys.path.insert(0, sys.argv[1])
import flashcourse.device
flashcourse.device.setup = lambda: "cuda"  # compile only: Gluon has no interpreter
import torch, triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
import fa3_compile
from fa3_fp8_compile import sass
from flashcourse.kernels.hopper import fa3_backward_d256 as b8, fa3_backward as b6, fa3_backward_tma as b7
target = GPUTarget("cuda", 90, 32)
records = []
for name, dtype, causal in ((n, dt, c) for n in b8.STAGES for dt in (torch.float16, torch.bfloat16)
                            for c in (False, True)):
    stage = b8.STAGES[name]
    signature, constexprs = b8.kernel_signature(stage, 256, dtype, causal)
    compiled = triton.compile(GluonASTSource(stage.kernel, signature, constexprs=constexprs), target=target,
                              options=stage.options())
    ptx = compiled.asm["ptx"]
    lines = sass(compiled.asm["cubin"])
    ops = [line.split()[1 if line.startswith("@") else 0] for line in lines]
    records.append({"sass": hashlib.sha256("\n".join(lines).encode()).hexdigest(),
                    "variant": name, "dtype": str(dtype), "causal": causal,
                    "f2f": sum(op.startswith("F2F.") for op in ops), "ex2": ops.count("MUFU.EX2"),
                    **fa3_compile.resource_usage(compiled.asm["cubin"]),
                    "shared": compiled.metadata.shared,
                    "reduce_add": ptx.count("cp.reduce.async.bulk.tensor.2d.global.shared::cta.add"),
                    "atom": ptx.count("atom.global") + ptx.count("red.global"),
                    "ld_global": ptx.count("ld.global"), "tma_1d": ptx.count("cp.async.bulk.tensor.1d"),
                    "wgmma": ptx.count("wgmma.mma_async"), "st_shared_v2": ptx.count("st.shared.v2.b32"),
                    "setmaxnreg": sorted({l.strip().rstrip(";") for l in ptx.splitlines() if "setmaxnreg" in l})})
helpers = []
for kernel, signature, block in (
        (b7._b7_stats_kernel, {"O": "*fp16", "DO": "*fp16", "LSE": "*fp32", "LSE2": "*fp32", "DELTA": "*fp32",
                               "DQ_ACC": "*fp32", "N_Q": "i32", "N_QPAD": "i32", "HEAD_DIM": "constexpr",
                               "BLOCK": "constexpr"},
         b7.STATS_ROWS),
        (b6._dq_convert_kernel, {"DQ_ACC": "*fp32", "DQ": "*bf16", "scale": "fp32", "N_Q": "i32", "N_QPAD": "i32",
                                 "HEAD_DIM": "constexpr", "BLOCK": "constexpr"}, 64)):
    compiled = triton.compile(GluonASTSource(kernel, signature, constexprs={"HEAD_DIM": 256, "BLOCK": block}),
                              target=target, options={"num_warps": 4})
    helpers.append({"kernel": kernel.__name__, **fa3_compile.resource_usage(compiled.asm["cubin"]),
                    "st_global": compiled.asm["ptx"].count("st.global")})
print(json.dumps({"stages": records, "helpers": helpers}))
"""


@needs_tma_reduce
@pytest.mark.slow  # about a minute on two shared cores: sixteen compiles to cubin and two small kernels
def test_b8_compiles_for_sm90_without_spills(tmp_path):
    env = dict(os.environ, PYTHONPATH=child_pythonpath(), TRITON_CACHE_DIR=str(tmp_path / "triton-cache"))
    env.pop("TRITON_INTERPRET", None)
    proc = subprocess.run([sys.executable, "-c", _COMPILE, str(ROOT / "scripts")], capture_output=True, text=True,
                          env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    printed = json.loads(proc.stdout.strip().splitlines()[-1])
    for r in printed["helpers"]:  # the preprocess and the dQ convert, whose row layout now also serves D = 256
        assert r["local"] == 0 and r["st_global"] >= 1, r
    assert len(printed["stages"]) == 16
    for r in printed["stages"]:
        where = f"{r['variant']} {r['dtype']} causal={r['causal']}"
        assert r["shared"] <= 232448, f"{where} allocates {r['shared']} bytes of shared memory (sm_90: 227 KB)"
        # K, V 64 KB, two Q slots 64 KB, one dO buffer 32 KB, P and dS twice 32 KB, dQ chunk buffers 32 KB (two of
        # 64 columns, or four of 32), lse and Delta 1 KB: the docstring's count, so a change of buffers shows here
        assert r["shared"] >= 230400, f"{where}: {r['shared']} bytes, fewer than the buffers the docstring counts"
        assert r["local"] == 0, f"{where} spills {r['local']} bytes a thread"
        assert r["wgmma"] > 0, f"{where} has no wgmma"
        # dQ leaves by the TMA reduce-add only (a 64 x 64 float32 chunk is two copies: Triton splits a box wider
        # than the 128-byte swizzle; b8b's 64 x 32 one), never by atomics from the math warps; lse and Delta come
        # by 1-D TMA copies
        assert r["reduce_add"] >= 2 and r["atom"] == 0, f"{where}: {r['reduce_add']} reduce-adds, {r['atom']} atomics"
        assert r["ld_global"] == 0 and r["tma_1d"] == 2, f"{where}: {r['ld_global']} loads, {r['tma_1d']} 1-D copies"
        budgets = " ".join(r["setmaxnreg"])
        assert "setmaxnreg.dec.sync.aligned.u32 \t24" in budgets, f"{where}: {budgets}"  # loader and writer
        assert "setmaxnreg.inc.sync.aligned.u32 \t240" in budgets, f"{where}: {budgets}"  # the consumers
    by = {(r["variant"], r["dtype"], r["causal"]): r for r in printed["stages"]}
    for (variant, dtype, causal), r in by.items():
        if variant == "b8c":  # b8's code and buffers; only the dQ chunks' swizzle and the writer's copies differ
            b8 = by["b8", dtype, causal]
            assert (r["shared"], r["st_shared_v2"], r["wgmma"]) == (b8["shared"], b8["st_shared_v2"], b8["wgmma"]), (
                r, b8)
            assert r["reduce_add"] == 4 * b8["reduce_add"], (r, b8)  # 32-byte wide copies: 8 a chunk, not 2
        if variant == "b8d":  # b8 with a bfloat16 P rounded in pairs: float16 unchanged, bfloat16 without F2F
            b8 = by["b8", dtype, causal]
            if dtype == "torch.float16":
                assert {k: v for k, v in r.items() if k != "variant"} == \
                    {k: v for k, v in b8.items() if k != "variant"}
                assert b8["f2f"] == 0, b8
            else:  # b8 rounds one value at a time on the exponentials' pipe, one per exponential
                assert b8["f2f"] == b8["ex2"] > 0 and r["f2f"] == 0 and r["ex2"] == b8["ex2"], (r, b8)


def test_unsupported_inputs_say_what_to_use(monkeypatch):
    pytest.importorskip("triton.experimental.gluon.language.nvidia.hopper")
    import torch

    try:
        from flashcourse.kernels.hopper import fa3_backward_d256, fa3_backward_tma
    except (ImportError, AttributeError) as error:
        pytest.skip(f"fa3_backward_d256.py does not import under this Triton: {error}")
    q = torch.zeros(1, 2, 8, 128, dtype=torch.float16)
    lse = torch.zeros(1, 2, 8)
    with pytest.raises(ValueError, match=r"b8 takes head dim 256 only \(got 128\).*fa3_backward_tma.*any head dim"):
        fa3_backward_d256.b8_backward(q, q, q, q, lse, q)
    q = torch.zeros(1, 2, 8, 256, dtype=torch.float16)
    monkeypatch.setattr(fa3_backward_tma, "HAS_TMA_REDUCE", False)
    with pytest.raises(ValueError, match=r"tma.async_atomic_add.*Triton >= 3.9"):
        fa3_backward_d256.b8_backward(q, q, q, q, lse, q)
    monkeypatch.setattr(fa3_backward_tma, "HAS_TMA_REDUCE", True)
    with pytest.raises(ValueError, match="Hopper.*flash_attention_backward"):  # b6's rules hold, D = 256 passes
        fa3_backward_d256.b8_backward(q, q, q, q, lse, q)
    with pytest.raises(ValueError, match=r"stage must be one of b8, b8b, b8c, b8d \(got 'b9'\)"):
        fa3_backward_d256.b8_backward(q, q, q, q, lse, q, stage="b9")
    assert fa3_backward_d256.TESTED_TRITON == fa3_backward_tma.TESTED_TRITON  # both need 3.9's TMA reduce-add


def test_the_package_import_leaves_b8_unloaded():
    """The dispatch routes D = 256 to b8 (tests/test_plan.py), but imports its module only for a call routed there:
    importing the package must not compile or even load Gluon code on a machine that will never run it."""
    pytest.importorskip("triton.experimental.gluon.language.nvidia.hopper")
    try:
        from flashcourse.kernels.hopper import fa3_backward_tma
    except (ImportError, AttributeError) as error:
        pytest.skip(f"fa3_backward_tma.py does not import under this Triton: {error}")
    from flashcourse.kernels import plan

    assert 256 not in fa3_backward_tma.HEAD_DIMS  # b7's split by keys cannot hold dK and dV at 256
    assert plan.GLUON_BACKWARDS[256].module == "fa3_backward_d256"
    code = "import sys, flashcourse.kernels; print('flashcourse.kernels.hopper.fa3_backward_d256' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=child_pythonpath()), timeout=300)
    assert proc.stdout.strip().splitlines()[-1] == "False", proc.stdout + proc.stderr[-2000:]


# ------------------------------------------------------------------------------------------ the handoffs
def _run_b8_protocol(n_tiles: int, q_stages: int, pds_buffers: int, chunks: int, seed: int,
                     slow: int | None = None, dq_buffers: int = 1):
    """b8's four partitions on threads. The loader, per tile i: waits q_empty[i % q_stages], lands Q (with lse,
    Delta) and arrives q_ready; waits do_empty, lands dO into its one buffer and arrives do_ready. Consumer
    warpgroup w, step i, b = i % pds_buffers: waits Q and dO; writes its half of P into p[b][w], arrives p_ready[b]
    (two arrivals); writes its half of dS, arrives ds_ready[b]; waits p_ready[b] and reads both halves of P and dO
    (dV), waits ds_ready[b] and reads both halves of dS and Q (dK); frees dO; for each dQ chunk reads both halves of
    dS, waits dq_empty of its next chunk buffer (``dq_buffers`` a warpgroup, taken in turn), writes its chunk, arrives
    dq_full; frees the Q slot. The writer, per tile and chunk, for each w: waits that buffer's dq_full, reads the
    chunk (the TMA unit), arrives its dq_empty. Warpgroup ``slow`` (if any)
    takes five times as long over each dQ chunk, as a warpgroup may that the other outruns."""
    fwd = _sibling("test_fa3_compile")
    world = fwd._World()
    rng = random.Random(seed)
    q_ready = [fwd._MBarrier(1, world) for _ in range(q_stages)]
    q_empty = [fwd._MBarrier(2, world) for _ in range(q_stages)]
    do_ready, do_empty = fwd._MBarrier(1, world), fwd._MBarrier(2, world)
    p_ready = [fwd._MBarrier(2, world) for _ in range(pds_buffers)]
    ds_ready = [fwd._MBarrier(2, world) for _ in range(pds_buffers)]
    dq_full = [[fwd._MBarrier(1, world) for _ in range(2)] for _ in range(dq_buffers)]
    dq_empty = [[fwd._MBarrier(1, world) for _ in range(2)] for _ in range(dq_buffers)]
    q_slots, do_slot = [None] * q_stages, [None]
    p = [[None, None] for _ in range(pds_buffers)]
    ds = [[None, None] for _ in range(pds_buffers)]
    dq = [[None, None] for _ in range(dq_buffers)]
    added = []

    def land(where, index, value, barrier, delay_seed):
        fwd._jitter(random.Random(delay_seed))
        where[index] = value
        barrier.arrive()

    def loader():
        for i in range(n_tiles):
            slot = i % q_stages
            q_empty[slot].wait(((i // q_stages) & 1) ^ 1)
            world.start(land, q_slots, slot, ("Q", i), q_ready[slot], i * 7 + slot)
            do_empty.wait((i & 1) ^ 1)
            world.start(land, do_slot, 0, ("dO", i), do_ready, i * 11 + 3)

    def still_read(w, i, b, what, where=""):
        """A product reads its operands from its issue until its wait: checked at both ends."""
        for j in range(2):
            if "P" in what:
                assert p[b][j] == ("P", i, j), f"wg {w} step {i}{where}: p[{b}][{j}] holds {p[b][j]}"
            assert ds[b][j] == ("dS", i, j), f"wg {w} step {i}{where}: ds[{b}][{j}] holds {ds[b][j]}"
        if "dO" in what:
            assert do_slot[0] == ("dO", i), f"wg {w} step {i}: dO refilled while read ({do_slot[0]})"

    def consumer(w):
        for i in range(n_tiles):
            slot, b, phase = i % q_stages, i % pds_buffers, (i // pds_buffers) & 1
            q_ready[slot].wait((i // q_stages) & 1)
            do_ready.wait(i & 1)
            assert q_slots[slot] == ("Q", i) and do_slot[0] == ("dO", i), f"wg {w} step {i}: {q_slots}, {do_slot}"
            p[b][w] = ("P", i, w)
            p_ready[b].arrive()
            fwd._jitter(rng)
            ds[b][w] = ("dS", i, w)
            ds_ready[b].arrive()
            p_ready[b].wait(phase)
            ds_ready[b].wait(phase)
            still_read(w, i, b, "P dS dO")  # dV and dK read P, dO, dS and Q
            fwd._jitter(rng)
            still_read(w, i, b, "P dS dO")
            do_empty.arrive()
            for c in range(chunks):  # each chunk's product reads both halves of dS
                still_read(w, i, b, "dS", f" chunk {c}")
                for _ in range(5 if w == slow else 1):
                    fwd._jitter(rng)
                still_read(w, i, b, "dS", f" chunk {c}")
                handoff = i * chunks + c
                d = handoff % dq_buffers
                dq_empty[d][w].wait(((handoff // dq_buffers) & 1) ^ 1)
                dq[d][w] = ("dQ", i, c, w)
                dq_full[d][w].arrive()
            assert q_slots[slot] == ("Q", i), f"wg {w} step {i}: Q slot refilled while read ({q_slots[slot]})"
            q_empty[slot].arrive()

    def writer():
        for i in range(n_tiles):
            for c in range(chunks):
                handoff = i * chunks + c
                d = handoff % dq_buffers
                for w in range(2):
                    dq_full[d][w].wait((handoff // dq_buffers) & 1)
                    fwd._jitter(rng)
                    assert dq[d][w] == ("dQ", i, c, w), f"writer step {i} chunk {c}: dq[{d}][{w}] holds {dq[d][w]}"
                    added.append((i, c, w))
                    dq_empty[d][w].arrive()

    world.run_partitions((loader,), (consumer, 0), (consumer, 1), (writer,))
    assert sorted(added) == [(i, c, w) for i in range(n_tiles) for c in range(chunks) for w in range(2)]


@pytest.mark.parametrize("variant", ["b8", "b8b", "b8c"])
@pytest.mark.parametrize("n_tiles", [0, 1, 2, 3, 7])
def test_the_four_partitions_hand_over_without_deadlock_or_overwrite(n_tiles, variant):
    """As each variant is built: two Q slots, one dO buffer, P and dS twice; b8 (and b8c) two dQ chunks a warpgroup
    a step through one buffer, b8b four through two."""
    from flashcourse.kernels.hopper import fa3_backward_d256 as b8

    stage = b8.STAGES[variant]
    chunks = (256 // 2) // stage.dq_chunk
    for seed, slow in enumerate((None, 0, 1)):
        _run_b8_protocol(n_tiles, q_stages=stage.stages, pds_buffers=2, chunks=chunks, seed=seed, slow=slow,
                         dq_buffers=stage.dq_buffers)


def test_the_model_catches_a_single_p_and_ds_buffer():
    """With one P and dS buffer a warpgroup that runs ahead overwrites what the other still reads: the model must
    see it (else the test above could not fail)."""
    failures = []
    for seed in range(12):
        try:
            _run_b8_protocol(8, q_stages=2, pds_buffers=1, chunks=2, seed=seed, slow=seed % 2)
        except AssertionError as error:
            failures.append(str(error))
    assert failures, "twelve runs with one P and dS buffer and no overwrite seen"
    assert all("p[0]" in failure or "ds[0]" in failure for failure in failures), failures


# ------------------------------------------------------------------------------------------ the arithmetic
def _emulate_b8(q, k, v, o, lse, do, causal, keys=64, block_m=64, chunk=64):
    """b8's arithmetic in float64 NumPy: programs of ``keys`` keys, query tiles of ``block_m`` rows read as TMA
    reads them (a tile past a head's end takes the next head's rows, past the last zeros), the masked and unmasked
    loops of ``_query_tiles``; lse and Delta from arrays padded per head with zeros; warpgroup w's S and dP for keys
    [w keys/2, (w+1) keys/2), P and dS assembled from both halves; its dK, dV columns [w D/2, (w+1) D/2) from all
    keys, its dQ columns in ``chunk``-wide pieces, each the sum over both key halves, added to a padded float32
    buffer."""
    import numpy as np

    b6_test = _sibling("test_fa3_backward_compile")
    batch, heads, n_q, d = q.shape
    n_kv = k.shape[2]
    half_keys, cols = keys // 2, d // 2
    scale = 1.0 / np.sqrt(d)
    flat = {name: t.reshape(-1, d) for name, t in (("q", q), ("k", k), ("v", v), ("do", do))}
    n_qpad = -(-n_q // block_m) * block_m
    lse_pad, delta_pad = np.zeros((batch * heads, n_qpad)), np.zeros((batch * heads, n_qpad))
    lse_pad[:, :n_q] = lse.reshape(-1, n_q)
    delta_pad[:, :n_q] = (o * do).sum(-1).reshape(-1, n_q)

    def tma(name, row, rows):
        out = np.zeros((rows, d))
        got = flat[name][row:row + rows]
        out[:len(got)] = got
        return out

    dq_acc = np.zeros((batch * heads, n_qpad, d))
    dk, dv = np.zeros_like(k).reshape(-1, d), np.zeros_like(v).reshape(-1, d)
    for bh in range(batch * heads):
        for n0 in range(0, n_kv, keys):
            m_lo, full_lo, full_hi, n_m = b6_test._query_tiles(n0, n_q, n_kv, causal, keys, block_m)
            kt = [tma("k", bh * n_kv + n0 + half_keys * w, half_keys) for w in range(2)]
            vt = [tma("v", bh * n_kv + n0 + half_keys * w, half_keys) for w in range(2)]
            key_ids = [n0 + half_keys * w + np.arange(half_keys) for w in range(2)]
            dk_acc, dv_acc = np.zeros((keys, d)), np.zeros((keys, d))
            for m in range(m_lo, n_m):
                masked = not full_lo <= m < full_hi
                qt, dot = tma("q", bh * n_q + m * block_m, block_m), tma("do", bh * n_q + m * block_m, block_m)
                queries = m * block_m + np.arange(block_m)
                lse_m = lse_pad[bh, m * block_m:(m + 1) * block_m]
                delta_m = delta_pad[bh, m * block_m:(m + 1) * block_m]
                p_halves, ds_halves = [], []
                for w in range(2):  # S and dP by keys: (queries, this warpgroup's keys)
                    with np.errstate(over="ignore"):
                        p = np.exp(qt @ kt[w].T * scale - lse_m[:, None])
                    if masked:
                        ok = (queries < n_q)[:, None] & (key_ids[w] < n_kv)[None, :]
                        if causal:
                            ok &= key_ids[w][None, :] <= queries[:, None]
                        p = np.where(ok, p, 0.0)
                    p_halves.append(p)
                    ds_halves.append(p * (dot @ vt[w].T - delta_m[:, None]))
                p_all, ds_all = np.hstack(p_halves), np.hstack(ds_halves)  # the exchange: (queries, all keys)
                for w in range(2):  # dK, dV, dQ by head-dim columns
                    c = slice(w * cols, (w + 1) * cols)
                    dv_acc[:, c] += p_all.T @ dot[:, c]
                    dk_acc[:, c] += ds_all.T @ qt[:, c]
                    for c0 in range(w * cols, (w + 1) * cols, chunk):
                        cc = slice(c0, c0 + chunk)
                        dq_acc[bh, m * block_m:(m + 1) * block_m, cc] += (ds_halves[0] @ kt[0][:, cc]
                                                                           + ds_halves[1] @ kt[1][:, cc])
            ids = np.concatenate(key_ids)
            keep = ids < n_kv
            dk[bh * n_kv + ids[keep]] = dk_acc[keep] * scale
            dv[bh * n_kv + ids[keep]] = dv_acc[keep]
    return (dq_acc[:, :n_q] * scale).reshape(q.shape), dk.reshape(k.shape), dv.reshape(v.shape)


@pytest.mark.parametrize("variant", ["b8", "b8b", "b8c"])
@pytest.mark.parametrize("causal", [False, True])
def test_the_kernels_arithmetic_gives_the_gradients(causal, variant):
    """The emulation at D = 256 equals float64 gradients (to rounding) at lengths that end mid-tile, with fewer and
    more keys than queries, one row, and two heads (a tile past the first head's end reads the second's rows)."""
    import numpy as np

    from flashcourse.kernels.hopper import fa3_backward_d256 as b8

    d = 256
    rng = np.random.default_rng(2)
    for n_q, n_kv in [(1, 1), (17, 17), (100, 100), (130, 130), (40, 150), (150, 40), (65, 129)]:
        inputs, expected = _sibling("test_fa3_backward_compile").float64_case(rng, n_q, n_kv, d, causal)
        got = _emulate_b8(*inputs, causal, keys=b8.KEYS, block_m=b8.BLOCK_M,
                          chunk=b8.STAGES[variant].dq_chunk)
        for name, g, e in zip(("dq", "dk", "dv"), got, expected, strict=True):
            np.testing.assert_allclose(g, e, rtol=1e-9, atol=1e-9, err_msg=f"{name} n_q={n_q} n_kv={n_kv}")


# ------------------------------------------------------------------------------------------ the GPU script
def test_gpu_script_plans_b8_at_d256_beside_the_references():
    """``benchmarks/gpu_b7.py --variants b8`` times and checks b8 at D = 256 only (both dtypes, causal and not, one
    row and lengths that end mid-tile), and its references at D = 256 too; a run of b7 and b8 keeps each at its own
    head dims."""
    read = ("import importlib.util, json, sys\n"
            "spec = importlib.util.spec_from_file_location('gpu_b7', sys.argv[1])\n"
            "script = importlib.util.module_from_spec(spec); spec.loader.exec_module(script)\n"
            "runs = ('b8', 'b7c,b8')\n"
            "plans = {v: script.plan('quick', checks=True, variants=tuple(v.split(','))) for v in runs}\n"
            "print(json.dumps({v: {'time': p['time'][0], 'check': [i for job in p['check'] for i in job],\n"
            "                      'references': script.reference_head_dims(v.split(','))}\n"
            "                  for v, p in plans.items()}))")
    env = dict(os.environ, PYTHONPATH=child_pythonpath(), CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run([sys.executable, "-c", read, str(ROOT / "benchmarks" / "gpu_b7.py")], capture_output=True,
                          text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    plans = json.loads(proc.stdout.strip().splitlines()[-1])
    alone = plans["b8"]
    assert {(i["provider"], i["head_dim"], i["dtype"], i["causal"]) for i in alone["time"]} == {
        ("b8", 256, dt, c) for dt in ("float16", "bfloat16") for c in (False, True)}
    assert {i["head_dim"] for i in alone["check"]} == {256} and {1, 17, 130} <= {i["n"] for i in alone["check"]}
    assert alone["references"] == [256]
    both = plans["b7c,b8"]
    assert {(i["provider"], i["head_dim"]) for i in both["time"]} == {("b7c", 64), ("b7c", 128), ("b8", 256)}
    assert both["references"] == [64, 128, 256]


def test_b8s_dq_chunk_store_conflicts_and_b8cs_does_not():
    """b8 stores each warpgroup's 64 x 64 float32 dQ chunk from wgmma's accumulator with 8-byte stores into the
    128-byte swizzle, b7d's 2-way conflict (a half-warp's four rows land on four 16-byte chunks twice); b8c's 32-byte
    swizzle takes the same stores at the ideal count."""
    b7_test = _sibling("test_b7_compile")
    model, _, _ = b7_test._bank_layouts()
    from flashcourse.kernels.hopper import fa3_backward_d256 as b8

    per_warp = 16 * 64 * 4 // 128  # wavefronts a warp's 16 rows of a 64-column float32 chunk need
    for variant, expected in (("b8", 2 * per_warp), ("b8c", per_warp)):
        stage = b8.STAGES[variant]
        layout = b8._dq_chunk_layout(stage.dq_chunk, stage.dq_swizzle)
        assert b7_test._tile(model, b8._mma_layout(stage.dq_chunk), layout, [b8.BLOCK_M, stage.dq_chunk], 4, 2) == (
            expected, per_warp), variant


def test_gpu_script_names_every_b8_variant():
    """``benchmarks/gpu_b7.py`` names b8's variants without importing their module (a Triton without Gluon reads
    its plan): the names must be the module's. Read from the script's source: importing it would clear
    TRITON_INTERPRET in this process (it is a GPU script), and with it every later interpreted test here."""
    import ast

    pytest.importorskip("triton.experimental.gluon.language.nvidia.hopper")
    try:
        from flashcourse.kernels.hopper import fa3_backward_d256 as b8
    except (ImportError, AttributeError) as error:
        pytest.skip(f"fa3_backward_d256.py does not import under this Triton: {error}")
    tree = ast.parse((ROOT / "benchmarks" / "gpu_b7.py").read_text())
    (named,) = [ast.literal_eval(node.value) for node in tree.body if isinstance(node, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == "OTHER_HEAD_DIMS" for t in node.targets)]
    assert set(named) == set(b8.STAGES) and set(named.values()) == {(256,)}
