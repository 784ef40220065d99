"""Backward b7 (``flashcourse.kernels.hopper.fa3_backward_tma``: FA3's design, dQ by a TMA reduce-add from a writer
warp) compiles for sm_90 on this CPU, and what compiling cannot show is modelled in Python.

As tests/test_fa3_backward_compile.py does for b6: the kernel is compiled ahead of time to a cubin (no GPU) and its
resources checked; the handoffs between its four partitions (loader, two consumer warpgroups, dQ writer) are run
on the forward test's mbarrier model (no deadlock, no buffer overwritten while read, the writer adds each step's
tiles); b7's arithmetic (its dQ columns split between the warpgroups, each summing both halves of dS) is written
out in float64 NumPy and compared with the gradients. Triton has no interpreter for Gluon, so whether the kernel
computes those gradients is the GPU's job: ``benchmarks/gpu_b7.py``. Skipped where the running Triton's Gluon has
no ``tma.async_atomic_add`` (before 3.9).
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


def _has_tma_reduce() -> bool:
    try:
        from triton.experimental.gluon.language.nvidia.hopper import tma
    except ImportError:
        return False
    return hasattr(tma, "async_atomic_add")


needs_tma_reduce = pytest.mark.skipif(not _has_tma_reduce(),
                                      reason="this Triton's Gluon has no tma.async_atomic_add (Triton >= 3.9 has)")


def _sibling(name: str):
    """Another test file as a module: its models are reused, not copied."""
    spec = importlib.util.spec_from_file_location(f"_b7_{name}", Path(__file__).with_name(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# What the subprocess below prints: each variant (b7 to b7g) compiled for sm_90 at D 64 and 128 (fp16 not causal,
# bf16 causal), the cubin's resources (scripts/fa3_compile.py's reader), what the PTX holds and, from the SASS, the
# scalar conversions (F2F) and exponentials (MUFU.EX2).
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
from flashcourse.kernels.hopper import fa3_backward_tma as b7
records = []
cases = ((name, head_dim, dtype, causal) for name in b7.STAGES for head_dim in b7.HEAD_DIMS
         for dtype, causal in ((torch.float16, False), (torch.bfloat16, True)))
for name, head_dim, dtype, causal in cases:
    stage = b7.STAGES[name]
    signature, constexprs = b7.kernel_signature(stage, head_dim, dtype, causal)
    compiled = triton.compile(GluonASTSource(stage.kernel, signature, constexprs=constexprs),
                              target=GPUTarget("cuda", 90, 32), options=stage.options())
    usage = fa3_compile.resource_usage(compiled.asm["cubin"])
    ptx = compiled.asm["ptx"]
    lines = sass(compiled.asm["cubin"])
    ops = [line.split()[1 if line.startswith("@") else 0] for line in lines]
    records.append({"sass": hashlib.sha256("\n".join(lines).encode()).hexdigest(),
                    "f2f": sum(op.startswith("F2F.") for op in ops), "ex2": ops.count("MUFU.EX2"),
                    "variant": name, "head_dim": head_dim, "dtype": str(dtype), "causal": causal, **usage,
                    "shared": compiled.metadata.shared,
                    "reduce_add": ptx.count("cp.reduce.async.bulk.tensor.2d.global.shared::cta.add"),
                    "atom": ptx.count("atom.global") + ptx.count("red.global"),
                    "ld_global": ptx.count("ld.global"), "tma_1d": ptx.count("cp.async.bulk.tensor.1d"),
                    "wgmma": ptx.count("wgmma.mma_async"),
                    "st_shared_v2": ptx.count("st.shared.v2.b32"), "st_shared_b32": ptx.count("st.shared.b32"),
                    "setmaxnreg": sorted({l.strip().rstrip(";") for l in ptx.splitlines() if "setmaxnreg" in l})})
stats = []  # the preprocess that pads lse (log2 units) and Delta per head for the 1-D TMA copies
for head_dim in b7.HEAD_DIMS:
    signature = {"O": "*fp16", "DO": "*fp16", "LSE": "*fp32", "LSE2": "*fp32", "DELTA": "*fp32", "DQ_ACC": "*fp32",
                 "N_Q": "i32", "N_QPAD": "i32", "HEAD_DIM": "constexpr", "BLOCK": "constexpr"}
    compiled = triton.compile(GluonASTSource(b7._b7_stats_kernel, signature,
                                             constexprs={"HEAD_DIM": head_dim, "BLOCK": b7.STATS_ROWS}),
                              target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
    stats.append({"head_dim": head_dim, **fa3_compile.resource_usage(compiled.asm["cubin"]),
                  "st_global": compiled.asm["ptx"].count("st.global")})
print(json.dumps({"stages": records, "stats": stats}))
"""


@needs_tma_reduce
@pytest.mark.slow  # two to five minutes on two shared cores: 28 compiles to cubin
def test_b7_compiles_for_sm90(tmp_path):
    env = dict(os.environ, PYTHONPATH=child_pythonpath(), TRITON_CACHE_DIR=str(tmp_path / "triton-cache"))
    env.pop("TRITON_INTERPRET", None)
    proc = subprocess.run([sys.executable, "-c", _COMPILE, str(ROOT / "scripts")], capture_output=True, text=True,
                          env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    printed = json.loads(proc.stdout.strip().splitlines()[-1])
    records = printed["stages"]
    assert len(records) == 7 * 4  # b7, b7b, b7c, b7d, b7e, b7f, b7g
    for r in printed["stats"]:
        # lse2 and Delta stored, and dQ's buffer zeroed (16 rows of D float32, at least 2 stores of 4 a thread)
        assert r["local"] == 0 and r["st_global"] >= 4, r
    for r in records:
        where = f"{r['variant']} D={r['head_dim']} {r['dtype']} causal={r['causal']}"
        assert r["shared"] <= 232448, f"{where} allocates {r['shared']} bytes of shared memory (sm_90: 227 KB)"
        assert r["local"] == 0, f"{where} spills {r['local']} bytes a thread"
        assert r["wgmma"] > 0, f"{where} has no wgmma"
        # dQ leaves only by the TMA reduce-add (one per warpgroup tile; Triton splits a tile wider than the
        # 128-byte swizzle into two copies), never by per-element atomics from the math warps.
        assert r["reduce_add"] >= 2, f"{where}: {r['reduce_add']} TMA reduce-adds in the PTX"
        assert r["atom"] == 0, f"{where}: {r['atom']} global atomics in the PTX"
        budgets = " ".join(r["setmaxnreg"])
        assert "setmaxnreg.dec.sync.aligned.u32 \t24" in budgets, f"{where}: {budgets}"  # loader and writer
        assert "setmaxnreg.inc.sync.aligned.u32 \t240" in budgets, f"{where}: {budgets}"  # the consumers
        if r["variant"] == "b7":  # the consumers load lse and Delta from global memory
            assert r["ld_global"] > 0 and r["tma_1d"] == 0, f"{where}: {r['ld_global']} global loads"
        else:  # b7b, b7c: the loader brings them by two 1-D TMA copies a tile; no thread loads global memory
            assert r["ld_global"] == 0, f"{where}: {r['ld_global']} global loads in the PTX"
            assert r["tma_1d"] == 2, f"{where}: {r['tma_1d']} 1-D TMA copies in the PTX"
    shared = {(r["variant"], r["head_dim"]): r["shared"] for r in records}
    assert shared["b7", 128] == 147936  # b7 as measured on 2026-12-06 (meta of its compile rows)
    for d in (64, 128):  # lse and Delta slots: 2 x STAGES x BLOCK_M x 4 bytes beside b7's; b7c's third slot
        block_m = 32 if d > 64 else 64
        assert shared["b7b", d] - shared["b7", d] >= 2 * 2 * block_m * 4, shared
        assert shared["b7c", d] - shared["b7b", d] >= 2 * block_m * d * 2, shared
    # b7d takes 64 query rows at D = 128 too: two ring slots of 64-row Q and dO tiles, more than b7c's three of 32
    assert shared["b7d", 128] - shared["b7b", 128] >= 2 * 2 * 32 * 128 * 2, shared
    # b7e and b7f change how the dQ tiles are written, not what is allocated
    assert shared["b7e", 128] == shared["b7f", 128] == shared["b7d", 128], shared
    by = {(r["variant"], r["head_dim"], r["causal"]): r for r in records}
    for causal in (False, True):
        b7d, b7e, b7f = (by[v, 128, causal] for v in ("b7d", "b7e", "b7f"))
        # b7e at D = 128: each warpgroup's 64 x 64 float32 dQ tile leaves the registers by 32 one-word stores a
        # thread instead of 16 two-word ones (in each of the kernel's copies of the step), as bank_model counts them
        copies = (b7d["st_shared_v2"] - b7e["st_shared_v2"]) // 16
        assert copies > 0 and b7e["st_shared_b32"] - b7d["st_shared_b32"] == 32 * copies, (b7d, b7e)
        # b7f: b7d's stores, the writer's reduce-add split into 32-byte wide copies (256 / 32 = 8 a tile, not 2)
        assert b7f["st_shared_v2"] == b7d["st_shared_v2"] and b7f["reduce_add"] == 4 * b7d["reduce_add"], (b7d, b7f)
    for causal in (False, True):  # at D = 64 b7e is b7d (wgmma's M of 64 rules out a 32-column transposed dQ)
        assert {k: v for k, v in by["b7e", 64, causal].items() if k != "variant"} == \
            {k: v for k, v in by["b7d", 64, causal].items() if k != "variant"}
    for d in (64, 128):
        # float16: b7g is b7e, instruction for instruction counted; no scalar conversions in either
        assert {k: v for k, v in by["b7g", d, False].items() if k != "variant"} == \
            {k: v for k, v in by["b7e", d, False].items() if k != "variant"}
        assert by["b7e", d, False]["f2f"] == 0
        # bfloat16, where P is kept in 16 bits and widened for dS: ptxas rounds b7e's P one value at a time (F2F,
        # on the exponentials' pipe), one per exponential; b7g's paired rounding leaves none, b7c never had any
        b7c, b7e, b7g = (by[v, d, True] for v in ("b7c", "b7e", "b7g"))
        assert b7e["f2f"] == b7e["ex2"] > 0 and b7g["f2f"] == 0 and b7c["f2f"] == 0, (b7c, b7e, b7g)
        assert b7g["ex2"] == b7e["ex2"] and b7g["shared"] == b7e["shared"], (b7e, b7g)


def test_kernels_package_does_not_import_b7():
    """CI's Triton may lack the TMA reduce-add: ``import flashcourse.kernels`` must not load b7's module."""
    code = "import sys, flashcourse.kernels; print('flashcourse.kernels.hopper.fa3_backward_tma' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=child_pythonpath()), timeout=300)
    assert proc.stdout.strip().splitlines()[-1] == "False", proc.stdout + proc.stderr[-2000:]


def test_unsupported_inputs_say_what_to_use(monkeypatch):
    pytest.importorskip("triton.experimental.gluon.language.nvidia.hopper")
    import torch

    try:
        from flashcourse.kernels.hopper import fa3_backward_tma
    except (ImportError, AttributeError) as error:
        pytest.skip(f"fa3_backward_tma.py does not import under this Triton: {error}")
    q = torch.zeros(1, 2, 8, 64, dtype=torch.float16)
    lse = torch.zeros(1, 2, 8)
    monkeypatch.setattr(fa3_backward_tma, "HAS_TMA_REDUCE", False)
    with pytest.raises(ValueError, match=r"tma.async_atomic_add.*Triton >= 3.9.*flash_attention_backward"):
        fa3_backward_tma.b7_backward(q, q, q, q, lse, q)
    monkeypatch.setattr(fa3_backward_tma, "HAS_TMA_REDUCE", True)
    with pytest.raises(ValueError, match="Hopper.*flash_attention_backward"):  # b6's rules hold too
        fa3_backward_tma.b7_backward(q, q, q, q, lse, q)
    with pytest.raises(ValueError, match=r"head dims \(64, 128\)"):
        fa3_backward_tma.b7_backward(q[..., :40], q[..., :40], q[..., :40], q[..., :40], lse, q[..., :40])
    with pytest.raises(ValueError, match=r"stage must be one of b7, b7b, b7c, b7d, b7e, b7f, b7g \(got 'b8'\)"):
        fa3_backward_tma.b7_backward(q, q, q, q, lse, q, stage="b8")
    # dispatched only under releases whose Gluon has the TMA reduce-add (3.9 on): an older one would fail at compile
    assert all(tuple(map(int, v.split("."))) >= (3, 9) for v in fa3_backward_tma.TESTED_TRITON)
    # prepared launches only where the route itself ran on a GPU
    assert set(fa3_backward_tma.PREPARED_TRITON) <= set(fa3_backward_tma.TESTED_TRITON)


def test_one_compile_serves_every_shape():
    """benchmarks/gpu_b7.py compiles b7 once per (D, dtype, causal) and times other shapes with it: the kernel's
    integers are not specialized and its tensor descriptors are keyed by dtype, block and layout, never by the
    tensor's shape (a new key would mean a compile inside a timed shape, as in the first GPU run's checks)."""
    pytest.importorskip("triton.experimental.gluon.language.nvidia.hopper")
    import torch
    from triton.backends.compiler import BaseBackend
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    try:
        from flashcourse.kernels.hopper import fa3_backward_tma
        from flashcourse.kernels.hopper.fa3 import _smem_layout
    except (ImportError, AttributeError) as error:
        pytest.skip(f"fa3_backward_tma.py does not import under this Triton: {error}")
    # How the JIT keys an argument (Triton's own function, not a public API: skipped where it moved).
    native_specialize_impl = getattr(pytest.importorskip("triton._C.libtriton"), "native_specialize_impl", None)
    if native_specialize_impl is None:
        pytest.skip("this Triton keys arguments elsewhere (no triton._C.libtriton.native_specialize_impl)")
    kernel = fa3_backward_tma.STAGES["b7"].kernel
    ints = [p.name for p in kernel.params if p.name.startswith("N_")]
    assert ints and all(p.do_not_specialize for p in kernel.params if p.name in ints), ints
    keys, stat_keys = set(), set()
    for batch, heads, n in [(1, 2, 4096), (4, 32, 4096), (4, 16, 8192), (2, 2, 17)]:
        rows = torch.zeros(batch * heads * n, 128, dtype=torch.bfloat16)
        desc = TensorDescriptor(rows, list(rows.shape), list(rows.stride()), [32, 128],
                                _smem_layout(32, 128, torch.bfloat16))
        keys.add(native_specialize_impl(BaseBackend, desc, False, True, True))
        stats = torch.zeros(batch * heads * n)  # b7b's lse and Delta, 1-D over every head
        stats_desc = TensorDescriptor(stats, [stats.numel()], [1], [32], fa3_backward_tma._stats_layout(32))
        stat_keys.add(native_specialize_impl(BaseBackend, stats_desc, False, True, True))
    assert len(keys) == 1, keys
    assert len(stat_keys) == 1, stat_keys


# ------------------------------------------------------------------------------------------ the handoffs
def _run_b7_protocol(n_tiles: int, stages: int, buffers: int, seed: int):
    """b7's four partitions on threads. The loader fills the (Q, dO) ring (as b6). Each consumer warpgroup w,
    step i, buffer b = i % buffers: waits for the slot, writes its dS^T into ds[b][w], arrives on ds_ready[b]
    (two arrivals), waits for it, reads ds[b][0] and ds[b][1] (its dQ columns need both), waits dq_empty[b][w],
    writes its dQ tile, arrives dq_full[b][w], frees the slot. The writer, each step, waits dq_full[b][0] and
    [b][1], reads both tiles (the TMA unit reading shared memory), and arrives on both dq_empty."""
    fwd = _sibling("test_fa3_compile")
    world = fwd._World()
    rng = random.Random(seed)
    ready = [fwd._MBarrier(1, world) for _ in range(stages)]
    empty = [fwd._MBarrier(2, world) for _ in range(stages)]
    ds_ready = [fwd._MBarrier(2, world) for _ in range(buffers)]
    dq_full = [[fwd._MBarrier(1, world) for _ in range(2)] for _ in range(buffers)]
    dq_empty = [[fwd._MBarrier(1, world) for _ in range(2)] for _ in range(buffers)]
    slots = [None] * stages
    ds = [[None, None] for _ in range(buffers)]
    dq = [[None, None] for _ in range(buffers)]
    added = []

    def loader():
        for i in range(n_tiles):
            slot = i % stages
            empty[slot].wait(((i // stages) & 1) ^ 1)

            def land(slot=slot, i=i):
                fwd._jitter(random.Random(i * 7 + slot))
                slots[slot] = ("QdO", i)
                ready[slot].arrive()
            world.start(land)

    def consumer(w):
        for i in range(n_tiles):
            slot, b, phase = i % stages, i % buffers, (i // buffers) & 1
            ready[slot].wait((i // stages) & 1)
            assert slots[slot] == ("QdO", i), f"wg {w} step {i}: slot holds {slots[slot]}"
            ds[b][w] = ("dS", i, w)
            ds_ready[b].arrive()
            ds_ready[b].wait(phase)
            fwd._jitter(rng)
            for j in range(2):  # the dQ product reads both halves, the other warpgroup's too
                assert ds[b][j] == ("dS", i, j), f"wg {w} step {i}: ds[{b}][{j}] holds {ds[b][j]}"
            dq_empty[b][w].wait(phase ^ 1)
            dq[b][w] = ("dQ", i, w)
            dq_full[b][w].arrive()
            assert slots[slot] == ("QdO", i), f"wg {w} step {i}: slot refilled while read"
            empty[slot].arrive()

    def writer():
        for i in range(n_tiles):
            b, phase = i % buffers, (i // buffers) & 1
            for w in range(2):
                dq_full[b][w].wait(phase)
                fwd._jitter(rng)
                assert dq[b][w] == ("dQ", i, w), f"writer step {i}: dq[{b}][{w}] holds {dq[b][w]}"
                added.append((i, w))
            for w in range(2):
                dq_empty[b][w].arrive()

    world.run_partitions((loader,), (consumer, 0), (consumer, 1), (writer,))
    assert sorted(added) == [(i, w) for i in range(n_tiles) for w in range(2)]


@pytest.mark.parametrize("n_tiles", [0, 1, 2, 3, 7])
def test_the_four_partitions_hand_over_without_deadlock_or_overwrite(n_tiles):
    for seed in range(3):
        _run_b7_protocol(n_tiles, stages=2, buffers=2, seed=seed)


def test_the_model_catches_a_single_ds_buffer():
    """With one dS buffer a warpgroup that runs ahead overwrites the dS the other is still reading: the model
    must see it (else the test above could not fail)."""
    failures = []
    for seed in range(12):
        try:
            _run_b7_protocol(6, stages=2, buffers=1, seed=seed)
        except AssertionError as error:
            failures.append(str(error))
    assert failures, "twelve runs with one dS buffer and no overwrite seen"
    assert all("ds[0]" in failure for failure in failures), failures


# ------------------------------------------------------------------------------------------ the arithmetic
def _emulate_b7(q, k, v, o, lse, do, causal, stats_by_tma=False, block_m=None):
    """b7's arithmetic in float64 NumPy: 128-key programs of two 64-key warpgroups, query tiles of BLOCK_M rows
    read as TMA reads them (a tile past a head's end takes the next head's rows, past the last zeros), the masked
    and unmasked loops of ``_query_tiles``; warpgroup w's dQ columns [w D/2, (w+1) D/2) from both halves of dS,
    added to a padded float32 buffer. ``stats_by_tma`` (b7b, b7c): lse and Delta read as the loader's 1-D TMA
    reads them, past N_q the next head's values (zeros past the last), where b7 loads zeros. ``block_m``: the query
    rows of a step (b7d: 64 at both head dims), else fa3_backward.BLOCK_M's rule."""
    import numpy as np

    b6_test = _sibling("test_fa3_backward_compile")
    batch, heads, n_q, d = q.shape
    n_kv = k.shape[2]
    block_m = block_m or (32 if d > 64 else 64)  # fa3_backward.BLOCK_M's rule: 64 rows at D = 64, 32 at D = 128
    half = d // 2
    scale = 1.0 / np.sqrt(d)
    flat = {name: t.reshape(-1, d) for name, t in (("q", q), ("k", k), ("v", v), ("do", do))}
    lse_flat, delta_flat = lse.reshape(-1), (o * do).sum(-1).reshape(-1)

    def tma(name, row, rows):
        out = np.zeros((rows, d))
        got = flat[name][row:row + rows]
        out[:len(got)] = got
        return out

    dq_acc = np.zeros((batch * heads, -(-n_q // 64) * 64, d))
    dk, dv = np.zeros_like(k).reshape(-1, d), np.zeros_like(v).reshape(-1, d)
    for bh in range(batch * heads):
        for n0 in range(0, n_kv, 128):
            m_lo, full_lo, full_hi, n_m = b6_test._query_tiles(n0, n_q, n_kv, causal, 128, block_m)
            kt = [tma("k", bh * n_kv + n0 + 64 * w, 64) for w in range(2)]
            vt = [tma("v", bh * n_kv + n0 + 64 * w, 64) for w in range(2)]
            key_ids = [n0 + 64 * w + np.arange(64) for w in range(2)]
            dk_acc, dv_acc = [np.zeros((64, d)) for _ in range(2)], [np.zeros((64, d)) for _ in range(2)]
            for m in range(m_lo, n_m):
                masked = not full_lo <= m < full_hi
                qt, dot = tma("q", bh * n_q + m * block_m, block_m), tma("do", bh * n_q + m * block_m, block_m)
                cols = m * block_m + np.arange(block_m)
                ok_rows = cols < n_q
                if stats_by_tma:
                    at = bh * n_q + cols
                    inside = at < lse_flat.size
                    lse_m = np.where(inside, lse_flat[np.minimum(at, lse_flat.size - 1)], 0.0)
                    delta = np.where(inside, delta_flat[np.minimum(at, delta_flat.size - 1)], 0.0)
                else:
                    lse_m = np.where(ok_rows, lse_flat[bh * n_q + np.minimum(cols, n_q - 1)], 0.0)
                    delta = np.where(ok_rows, delta_flat[bh * n_q + np.minimum(cols, n_q - 1)], 0.0)
                ds_t = []
                for w in range(2):
                    with np.errstate(over="ignore"):
                        p = np.exp(kt[w] @ qt.T * scale - lse_m[None, :])
                    if masked:
                        ok = ok_rows[None, :] & (key_ids[w][:, None] < n_kv)
                        if causal:
                            ok &= key_ids[w][:, None] <= cols[None, :]
                        p = np.where(ok, p, 0.0)
                    dv_acc[w] += p @ dot
                    ds_t.append(p * (vt[w] @ dot.T - delta[None, :]))
                    dk_acc[w] += ds_t[w] @ qt
                for w in range(2):  # the split: each warpgroup's columns from both halves of dS
                    c = slice(w * half, (w + 1) * half)
                    dq_acc[bh, m * block_m:(m + 1) * block_m, c] += ds_t[0].T @ kt[0][:, c] + ds_t[1].T @ kt[1][:, c]
            for w in range(2):
                keep = key_ids[w] < n_kv
                dk[bh * n_kv + key_ids[w][keep]] = dk_acc[w][keep] * scale
                dv[bh * n_kv + key_ids[w][keep]] = dv_acc[w][keep]
    return (dq_acc[:, :n_q] * scale).reshape(q.shape), dk.reshape(k.shape), dv.reshape(v.shape)


@pytest.mark.parametrize(("d", "block_m"), [(64, None), (128, None), (128, 64)])  # (128, 64): b7d's tiles
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("stats_by_tma", [False, True])
def test_the_kernels_arithmetic_gives_the_gradients(d, block_m, causal, stats_by_tma):
    """The emulation equals float64 gradients (to rounding) at lengths that end mid-tile, with fewer and more
    keys than queries, one row, and two heads (a tile past the first head's end reads the second's rows)."""
    import numpy as np

    rng = np.random.default_rng(1)
    for n_q, n_kv in [(1, 1), (17, 17), (100, 100), (130, 130), (40, 150), (150, 40), (200, 257)]:
        inputs, expected = _sibling("test_fa3_backward_compile").float64_case(rng, n_q, n_kv, d, causal)
        got = _emulate_b7(*inputs, causal, stats_by_tma, block_m)
        for name, g, e in zip(("dq", "dk", "dv"), got, expected, strict=True):
            np.testing.assert_allclose(g, e, rtol=1e-9, atol=1e-9, err_msg=f"{name} n_q={n_q} n_kv={n_kv} D={d}")


# ------------------------------------------------------------------------------------------ the GPU script
def test_gpu_script_plans_the_issue_s_cases_and_answers_without_a_gpu():
    """benchmarks/gpu_b7.py (run on a GPU) covers D 64 and 128, both dtypes, causal and not, checks
    one row and lengths that end mid-tile for every tile it uses, and says what it needs on a CPU."""
    # Read in a child process: the script turns the interpreter off for its own process (it compiles real kernels),
    # and kernels defined in this one after that would no longer run on the CPU.
    read = ("import importlib.util, json, sys\n"
            "spec = importlib.util.spec_from_file_location('gpu_b7', sys.argv[1])\n"
            "script = importlib.util.module_from_spec(spec); spec.loader.exec_module(script)\n"
            "print(json.dumps({'cases': script.time_shapes('lengths'), 'check_ns': list(script.CHECK_NS),\n"
            "                  'references': list(script.REFERENCES)}))")
    env = dict(os.environ, PYTHONPATH=child_pythonpath(), CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run([sys.executable, "-c", read, str(ROOT / "benchmarks" / "gpu_b7.py")], capture_output=True,
                          text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    plan = json.loads(proc.stdout.strip().splitlines()[-1])
    cases, check_ns = plan["cases"], plan["check_ns"]
    assert {(d, dt, c) for _, _, _, d, dt, c in cases} == {
        (d, dt, c) for d in (64, 128) for dt in ("float16", "bfloat16") for c in (False, True)}
    assert {n for _, _, n, *_ in cases} >= {4096, 8192}
    assert 1 in check_ns and any(n % 32 for n in check_ns) and any(n % 128 for n in check_ns)
    assert {"sdpa_cudnn", "b1", "fa4"} <= set(plan["references"])
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_b7.py")], capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.returncode == 2 and "needs a CUDA GPU" in proc.stdout, proc.stdout + proc.stderr[-2000:]


# ------------------------------------------------------------------------------------------ shared-memory banks
def _bank_layouts():
    """bank_model and b7's layouts, or a skip where this Triton's Gluon cannot give linear layouts."""
    pytest.importorskip("triton.experimental.gluon.language.nvidia.hopper")
    try:
        from triton._C.libtriton.gluon_ir import GluonOpBuilder  # noqa: F401
        from triton.experimental.gluon import language as gl

        from flashcourse.kernels.hopper import fa3_backward_tma
    except (ImportError, AttributeError) as error:
        pytest.skip(f"no linear layouts from this Triton's Gluon: {error}")
    return _sibling("bank_model"), fa3_backward_tma, gl


def _tile(model, register_layout, shared_layout, shape, element_bytes, vector, transposed=False):
    """(wavefronts, ideal) of one warp storing its share of a tile; ``transposed``: the registers hold the
    buffer's transpose (b7c's and b7e's ``dq_tile.permute((1, 0)).store``)."""
    regs, lanes, offsets = model.layouts(register_layout, shared_layout, shape[::-1] if transposed else shape)
    if transposed:
        offsets = {coord[::-1]: offset for coord, offset in offsets.items()}
    return model.tile_wavefronts(regs, lanes, offsets, element_bytes, vector)


def test_the_bank_model_counts_known_cases():
    """A row-major float32 tile written by a layout whose lanes walk rows puts all 32 lanes in one bank: 32
    wavefronts an instruction; the same tile written by lanes walking columns takes one. Broadcast: 32 lanes
    reading one word take one wavefront. Eight-byte accesses are served a half-warp at a time."""
    model, _, gl = _bank_layouts()
    plain = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
    lanes_down = gl.BlockedLayout([1, 32], [32, 1], [4, 1], [1, 0])
    lanes_across = gl.BlockedLayout([1, 1], [1, 32], [4, 1], [1, 0])
    assert _tile(model, lanes_down, plain, [128, 32], 4, 1) == (32 * 32, 32)
    assert _tile(model, lanes_across, plain, [128, 32], 4, 1) == (32, 32)
    assert model.wavefronts([], [[0, 0]] * 5, {(0, 0): 0}, 4, 1) == (1, 1)
    pairs = gl.BlockedLayout([1, 2], [1, 32], [4, 1], [1, 0])  # a warp: one 256-byte row, two half-warps
    assert _tile(model, pairs, plain, [4, 64], 4, 2) == (2, 2)
    # 8 bytes a lane, a half-warp over two 64-byte halves of rows 128 bytes apart: the same 16 banks twice
    row_major = model.shared_offsets([[0, 1], [0, 2], [0, 4], [0, 8], [0, 16], [1, 0], [2, 0]], [4, 32])
    lanes = [[0, 2], [0, 4], [0, 8], [1, 0], [2, 0]]
    assert model.wavefronts([[0, 1]], lanes, row_major, 4, 2) == (2 * 2, 2)
    # one word a lane (the even columns of four rows): the whole warp at once, 32 words on 8 banks, 4-way
    assert model.wavefronts([[0, 1]], lanes, row_major, 4, 1) == (4, 1)


@pytest.mark.parametrize("head_dim", [64, 128])
def test_b7d_s_dq_store_is_the_2_way_bank_conflict(head_dim):
    """b7d (and b7b, b7c at D = 64) stores each warpgroup's 64 x D/2 float32 dQ tile from wgmma's accumulator
    layout with 8-byte stores (``st.shared.v2.b32`` in the PTX) into the 128-byte swizzle the TMA reduce-add
    reads. A thread's two columns and four lanes span 32 bytes of a row, eight lanes go down eight rows; the swizzle
    moves a row's 16-byte chunks by the row's low three bits, so a half-warp (four rows) lands on four chunks
    twice: 2 wavefronts where 1 would do, in every instruction. The profile (H100, 2026-12-07) saw 153 million
    conflicts in b7d against b7c's 12 million at D = 128; 32 extra wavefronts a warp a step x 4 warps x 2
    warpgroups x 4,096 programs x 128 steps is 134 million."""
    model, b7, _ = _bank_layouts()
    half = head_dim // 2
    per_warp = 16 * half * 4 // 128  # wavefronts a warp's 16 rows of float32 need at 128 bytes each
    assert _tile(model, b7._mma_layout(half), b7._dq_layout(64, head_dim), [64, half], 4, 2) == (2 * per_warp,
                                                                                                per_warp)


def test_b7e_and_b7f_store_dq_without_bank_conflicts():
    """The two fixes, each at the ideal count: b7e computes dQ^T (wgmma's M = D/2 = 64 at D = 128) and stores it
    one float32 a lane through the transposed view, as b7c does with its 32-row tiles (lanes then spread over
    eight rows and four columns, 32 banks); b7f keeps b7d's 8-byte stores and gives the dQ tiles a 32-byte swizzle
    (a row's two 16-byte chunks exchanged by one row bit, the next rows one 128-byte line further: a half-warp
    covers 128 distinct bytes)."""
    model, b7, _ = _bank_layouts()
    per_warp = 16 * 64 * 4 // 128  # wavefronts of a warp's 16 x 64 float32 share at 128 bytes each
    assert _tile(model, b7._mma_layout(64), b7._dq_layout(64, 128), [64, 64], 4, 1, transposed=True) == (
        per_warp, per_warp)
    assert _tile(model, b7._mma_layout(32), b7._dq_layout(32, 128), [32, 64], 4, 1, transposed=True) == (
        per_warp // 2, per_warp // 2)  # b7c at D = 128: the store b7e extends
    for head_dim in (64, 128):
        half = head_dim // 2
        per_warp = 16 * half * 4 // 128
        assert _tile(model, b7._mma_layout(half), b7._dq_layout(64, head_dim, 32), [64, half], 4, 2) == (
            per_warp, per_warp), head_dim


@pytest.mark.parametrize("block_m", [32, 64])
def test_ds_and_the_stats_reads_do_not_conflict(block_m):
    """The other accesses of the math warps: dS^T (64 keys x BLOCK_M, 16-bit) as 4-byte pairs (the compiler
    emits ``stmatrix`` there, whose 8 x 16-byte rows the swizzle keeps on distinct chunks too), and lse or Delta
    read in S^T's column layout (``ld.shared.v2.b32``; lanes sharing a column share the word)."""
    model, b7, gl = _bank_layouts()
    ds_layout = gl.NVMMASharedLayout.get_default_for([64, block_m], gl.float16)
    got, ideal = _tile(model, b7._mma_layout(block_m), ds_layout, [64, block_m], 2, 2)
    assert got == ideal == 16 * block_m * 2 // 128  # a warp's 16 keys
    regs, lanes, offsets = model.layouts(gl.SliceLayout(0, b7._mma_layout(block_m)), b7._stats_layout(block_m),
                                         [block_m])
    for start in model.instruction_starts(regs, 2):
        assert model.wavefronts(regs, lanes, offsets, 4, 2, first_register=start) == (2, 2)
