"""The Gluon backwards' host side (``hopper/fa3_backward_tma.BackwardPlan``: b7's variants and b8) on the CPU, its
three kernels and Triton's launch preparation stubbed.

The first call launches through Triton, with TMA descriptors of the tiles each kernel copies, and keeps them as
templates that hold no tensor; a later call repeats the prepared launches on its own tensors and new buffers, in
the order the kernels take them; a call on a tensor at another 16-byte alignment, or a plan made with
``prepare=False``, launches through Triton again. On a Hopper GPU under Triton >= 3.9, the last test holds a
repeat call's prepared launches to the same call launched through Triton (``PREPARED_TRITON`` lists the releases it
passed under; until then ``flash_attention`` does not prepare them).
"""

from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton.experimental.gluon.language.nvidia.hopper")
try:
    from flashcourse.kernels.hopper import fa3_backward_d256, fa3_backward_tma
except (ImportError, AttributeError) as error:  # a Triton whose Gluon lacks what b7 uses
    pytest.skip(f"the Gluon backwards do not import under this Triton: {error}", allow_module_level=True)

MAIN_NAMES = ("q_desc", "k_desc", "v_desc", "do_desc", "dq_desc", "lse_desc", "delta_desc", "DK", "DV")


class _Kernel:
    """A kernel whose ``[grid](**kwargs)`` records the launch and returns a stand-in for the compiled kernel."""

    def __init__(self, name: str, log: list):
        self.name, self.log = name, log

    def __getitem__(self, grid):
        def launch(**kwargs):
            self.log.append({"kernel": self.name, "how": "triton", "grid": grid, "args": kwargs})
            return f"compiled {self.name}"
        return launch


def _stub(monkeypatch, module, stage: str) -> list:
    """Stub the three kernels and ``prepare_launch``; returns the log every launch is written to."""
    log = []

    def prepare(kernel, compiled, grid, kwargs, names):
        assert compiled == f"compiled {kernel.name}" and set(names) <= set(kwargs)

        def run(tensors):
            log.append({"kernel": kernel.name, "how": "prepared", "grid": grid,
                        "args": dict(zip(names, tensors, strict=True))})
        return run

    monkeypatch.setattr(fa3_backward_tma, "_b7_stats_kernel", _Kernel("stats", log))
    monkeypatch.setattr(fa3_backward_tma, "_dq_convert_kernel", _Kernel("convert", log))
    monkeypatch.setattr(fa3_backward_tma, "prepare_launch", prepare)
    monkeypatch.setitem(module.STAGES, stage, dataclasses.replace(module.STAGES[stage], kernel=_Kernel("main", log)))
    return log


def _inputs(batch, heads, n, head_dim, *, offset: int = 0):
    """q, k, v, o, lse, dO in float16; ``offset`` elements into a larger buffer for o (2 bytes: misaligned)."""
    q, k, v, do = (torch.randn(batch, heads, n, head_dim, dtype=torch.float16) for _ in range(4))
    o = torch.randn(batch * heads * n * head_dim + offset, dtype=torch.float16)[offset:].view(q.shape)
    return q, k, v, o, torch.randn(batch, heads, n), do


@pytest.mark.parametrize("stage, head_dim", [("b7c", 64), ("b7e", 128)])
def test_b7_plan_launches_through_triton_once_then_repeats_on_each_call_s_tensors(monkeypatch, stage, head_dim):
    log = _stub(monkeypatch, fa3_backward_tma, stage)
    batch, heads, n = 2, 3, 130  # N past two 64-row tiles: lse, Delta and dQ padded to 192 rows a head
    q, k, v, o, lse, do = _inputs(batch, heads, n, head_dim)
    plan = fa3_backward_tma.backward_plan(q, k, causal=True, scale=0.3, stage=stage)
    block_m = fa3_backward_tma.STAGES[stage].rows(head_dim)

    dq, dk, dv = plan(q, k, v, o, lse, do)
    assert [(e["kernel"], e["how"]) for e in log] == [("stats", "triton"), ("main", "triton"), ("convert", "triton")]
    stats, main, convert = (e["args"] for e in log)
    assert stats["O"] is o and stats["DO"] is do and stats["LSE"] is lse and stats["N_QPAD"] == 192
    assert stats["DQ_ACC"] is convert["DQ_ACC"] and main["dq_desc"].base is None  # a template after the call
    assert stats["LSE2"].shape == (batch * heads * 192,) and log[0]["grid"] == (192 // 16, batch * heads)
    boxes = [main[name].block_shape for name in MAIN_NAMES[:7]]
    assert boxes == [[block_m, head_dim], [64, head_dim], [64, head_dim], [block_m, head_dim],
                     [block_m, head_dim // 2], [block_m], [block_m]]
    assert main["DK"] is dk and main["DV"] is dv and main["LSE"] is stats["LSE2"] and main["DELTA"] is stats["DELTA"]
    assert main["N_Q"] == n and main["CAUSAL"] is True and main["qk_scale"] == pytest.approx(0.3 * 1.4426950408889634)
    assert log[1]["grid"] == (2, batch * heads)  # 130 keys in 128-key programs
    assert convert["DQ"] is dq and convert["DQ_ACC"].shape == (batch * heads * 192, head_dim)
    assert convert["scale"] == 0.3 and log[2]["grid"] == (3, batch * heads)
    assert all(template.base is None for template in plan._templates)  # no call's tensor kept alive

    log.clear()
    q2, k2, v2, o2, lse2, do2 = _inputs(batch, heads, n, head_dim)
    dq2, dk2, dv2 = plan(q2, k2, v2, o2, lse2, do2)
    assert [(e["kernel"], e["how"]) for e in log] == [("stats", "prepared"), ("main", "prepared"),
                                                       ("convert", "prepared")]
    stats, main, convert = (e["args"] for e in log)
    assert stats["O"] is o2 and stats["DO"] is do2 and stats["LSE"] is lse2
    # the launcher reads only a descriptor's base address: the call's own tensors, not views of them
    assert all(main[name].base is t for name, t in zip(("q_desc", "k_desc", "v_desc", "do_desc"), (q2, k2, v2, do2),
                                                        strict=True))
    assert main["dq_desc"].base is convert["DQ_ACC"] and main["lse_desc"].base is stats["LSE2"]
    assert main["delta_desc"].base is stats["DELTA"] and main["LSE"] is stats["LSE2"]
    assert main["DK"] is dk2 and main["DV"] is dv2 and convert["DQ"] is dq2
    assert main["q_desc"].block_shape == [block_m, head_dim]  # the template's tile, this call's tensor
    assert all(template.base is None for template in plan._templates)
    assert stats["DQ_ACC"] is convert["DQ_ACC"]  # the stats kernel zeroes the buffer the reduce-adds start from


def test_b8_plan_takes_b8_s_tiles_and_no_stats_pointers(monkeypatch):
    log = _stub(monkeypatch, fa3_backward_d256, "b8")
    q, k, v, o, lse, do = _inputs(1, 2, 100, 256)
    plan = fa3_backward_d256.backward_plan(q, k, stage="b8")
    plan(q, k, v, o, lse, do)
    main = log[1]["args"]
    assert "LSE" not in main and "DELTA" not in main  # b8's kernel reads lse and Delta by TMA only
    assert [main[name].block_shape for name in MAIN_NAMES[:5]] == [[64, 256], [32, 256], [32, 256], [64, 256],
                                                                   [64, fa3_backward_d256.STAGES["b8"].dq_chunk]]
    log.clear()
    plan(q, k, v, o, lse, do)
    assert [e["how"] for e in log] == ["prepared"] * 3
    assert tuple(log[1]["args"]) == MAIN_NAMES


@pytest.mark.parametrize(("module", "stage", "paired", "head_dim"),
                         [(fa3_backward_tma, "b7e", "b7g", 128), (fa3_backward_d256, "b8", "b8d", 256)])
def test_the_paired_rounding_stages_launch_as_their_bases_do(monkeypatch, module, stage, paired, head_dim):
    """b7g and b8d are b7e and b8 with one constexpr set (PAIRED_P): the same kernels, grids, tiles and arguments
    otherwise, so a run that timed the base's launches at little work (the dispatch's floor) holds for them."""
    launches = {}
    for name in (stage, paired):
        log = _stub(monkeypatch, module, name)
        torch.manual_seed(0)
        q, k, v, o, lse, do = _inputs(2, 3, 130, head_dim)
        module.backward_plan(q, k, causal=True, scale=0.3, stage=name)(q, k, v, o, lse, do)
        launches[name] = [(e["kernel"], e["grid"], {key: getattr(value, "block_shape", None) if hasattr(value, "base")
                                                    else tuple(value.shape) if torch.is_tensor(value) else value
                                                    for key, value in e["args"].items()}) for e in log]
    base, other = launches[stage], launches[paired]
    assert [(kernel, grid) for kernel, grid, _ in base] == [(kernel, grid) for kernel, grid, _ in other]
    (_, _, base_main), (_, _, paired_main) = base[1], other[1]
    assert base_main.pop("PAIRED_P") is False and paired_main.pop("PAIRED_P") is True
    assert base_main == paired_main and base[0] == other[0] and base[2] == other[2]


def test_a_misaligned_tensor_or_a_plan_used_once_launches_through_triton(monkeypatch):
    log = _stub(monkeypatch, fa3_backward_tma, "b7c")
    q, k, v, o, lse, do = _inputs(1, 2, 64, 64)
    plan = fa3_backward_tma.backward_plan(q, k, stage="b7c")
    plan(q, k, v, o, lse, do)
    log.clear()
    *_, o_odd, _, _ = _inputs(1, 2, 64, 64, offset=1)
    assert o_odd.data_ptr() % 16
    plan(q, k, v, o_odd, lse, do)  # the kernels were specialised on 16-byte aligned pointers
    assert [e["how"] for e in log] == ["triton"] * 3
    log.clear()
    once = fa3_backward_tma.backward_plan(q, k, stage="b7c", prepare=False)
    once(q, k, v, o, lse, do)
    once(q, k, v, o, lse, do)
    assert [e["how"] for e in log] == ["triton"] * 6 and once._launches is None


def test_an_empty_call_launches_nothing(monkeypatch):
    log = _stub(monkeypatch, fa3_backward_tma, "b7c")
    q, k, v, o, lse, do = _inputs(1, 2, 0, 64)
    dq, dk, dv = fa3_backward_tma.backward_plan(q, k, stage="b7c")(q, k, v, o, lse, do)
    assert log == [] and dq.shape == q.shape and dk.shape == k.shape


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize(("stage", "head_dim", "causal"), [("b7c", 64, True), ("b7e", 128, False), ("b8", 256, True)])
def test_gpu_prepared_launches_give_the_plain_launches_gradients(stage, head_dim, causal):
    """A plan's repeat call (prepared launches, new tensors of the same layout) against the same call launched
    through Triton, which the route test and benchmarks/gpu_b7.py hold to float64: dK and dV bit for bit (each
    program writes its own), dQ to float32 rounding (its reduce-adds land in any order). N = 1000 ends mid-tile."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the Gluon backwards are written for Hopper")
    if not fa3_backward_tma.HAS_TMA_REDUCE:
        pytest.skip("this Triton's Gluon has no tma.async_atomic_add (Triton >= 3.9 has)")
    from flashcourse import kernels

    module = fa3_backward_d256 if stage == "b8" else fa3_backward_tma
    torch.manual_seed(0)

    def inputs():
        q, k, v, do = (torch.randn(2, 3, 1000, head_dim, device="cuda", dtype=torch.float16) for _ in range(4))
        return (q, k, v, *kernels.flash_attention_forward(q, k, v, causal=causal, version="v7"), do)

    first = inputs()
    plan = module.backward_plan(first[0], first[1], causal=causal, stage=stage)
    plan(*first)  # through Triton; the launches prepared
    assert plan._launches is not None, "this Triton's compiled kernels do not take a prepared launch"
    for _ in range(2):
        args = inputs()
        got = plan(*args)
        want = module.backward_plan(args[0], args[1], causal=causal, stage=stage, prepare=False)(*args)
        assert torch.equal(got[1], want[1]) and torch.equal(got[2], want[2])
        assert torch.allclose(got[0].float(), want[0].float(), rtol=1e-3, atol=1e-3)
