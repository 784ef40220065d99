"""The call path: which kernels a call runs (``plan.choose_route``, ``kernels.explain``), the table of Gluon stages
held to the committed H200 results, plans made once per layout, and the routes checked on a GPU against float64."""

from __future__ import annotations

import functools
import inspect
import json
import math
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import triton
from triton.runtime.interpreter import InterpretedFunction

from flashcourse import kernels, reference
from flashcourse.kernels import configs, plan
from flashcourse.kernels.rules import parse_rules

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
H200 = configs.KNOWN_DEVICES["H200"]
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}


def stage_results(name: str) -> dict:
    return json.loads((RESULTS / name).read_text())


def _timed(name: str) -> list[dict]:
    return [r for r in stage_results(name)["rows"] if r["kind"] == "time" and r["status"] == "ok"]


def test_each_band_from_n_2048_runs_the_fastest_forward_of_the_stage_table_by_length():
    """At every timed length from N = 2048 (shorter calls of that script are host-bound), in both dtypes, the
    forward FORWARD_BANDS names runs within 2% of the fastest of the Gluon stages and v7 timed beside it; and the
    file is the newest H200 stage table timed by length."""
    name = Path(plan.FA3_RESULTS[64]).name
    assert plan.FA3_RESULTS[128] == plan.FA3_RESULTS[64]
    assert name == sorted(RESULTS.glob("*-nvidia-h200-fa3-stages-*-n1024-*.json"))[-1].name
    rates = defaultdict(dict)
    for row in _timed(name):
        rates[row["head_dim"], row["causal"], row["n"], row["dtype"]][row["provider"].removeprefix("fa3-")] = \
            row["tflops"]
    checked = 0
    for (head_dim, causal, n, dtype), by_kernel in rates.items():
        if n < 2048:
            continue
        chosen, _ = plan.band_forward(head_dim, causal, n)
        best = max(v for k, v in by_kernel.items() if k != "sdpa_cudnn")
        assert by_kernel[chosen] >= 0.98 * best, (head_dim, causal, n, dtype, chosen, by_kernel)
        checked += 1
    assert checked == 2 * 2 * 4 * 2  # head dims, causal or not, N 2048-16384, dtypes


def test_h100_short_causal_band_runs_the_kernel_nsight_compute_timed_fastest():
    """At causal D = 64, N_q <= 1024 the stage script's own calls are host-bound, so the H100's band there is held
    to the kernels' times under Nsight Compute: the band's kernel (v8a) faster than v7, the default it replaced."""
    profile = stage_results(Path(plan.H100_SHORT_CAUSAL_PROFILE).name)
    rows = {row["case"]: row for row in profile["rows"]}
    v7, v8a = rows["fwd-d64-n1024-causal-ours"], rows["fwd-d64-n1024-causal-v8a"]
    assert v7["kernel"].startswith("_fwd_v7") and v8a["kernel"].startswith("_fa3_v8a")
    shape = profile["meta"]["cases"]["fwd-d64-n1024-causal-v8a"]["shape"]
    assert (shape["n"], shape["head_dim"], shape["causal"]) == (1024, 64, True)
    assert plan.band_forward(64, True, 1024, plan.H100_FORWARD_BANDS)[0] == "v8a"
    assert v8a["duration_us"] < 0.8 * v7["duration_us"]


def test_the_d256_forward_is_the_fastest_stage_of_its_run():
    """D = 256 (not in the table by length): the stage with the highest geometric-mean TFLOP/s over the newest
    ``*-d256.json`` run, and faster than v7 there."""
    name = Path(plan.FA3_RESULTS[256]).name
    assert name == sorted(RESULTS.glob("*-fa3-stages-*-d256.json"))[-1].name
    rates = defaultdict(list)
    for row in _timed(name):
        rates[row["dtype"], row["provider"].removeprefix("fa3-")].append(row["tflops"])
    for dtype in DTYPES:
        means = {k: math.exp(sum(map(math.log, v)) / len(v)) for (t, k), v in rates.items() if t == dtype}
        assert max((k for k in means if k.startswith("v8")), key=means.get) == "v8d", (dtype, means)
        assert means["v8d"] > means["v7"], (dtype, means)
    assert {entry for causal in (False, True) for entry in plan.FORWARD_BANDS[256, causal]} == {(None, "v8d")}


def t(*shape, dtype=torch.float16):
    return torch.randn(shape, dtype=dtype)


def route(q, k, v, *, triton_version="3.6.0", props=H200, block_mask=None, **options):
    rules = parse_rules(q, k, **options)
    lacks = rules.missing_in_numbered_version(k.shape[1] != q.shape[1], q.shape[2], k.shape[2])
    return plan.choose_route(q, k, v, rules, props=props, lacks=lacks, block_mask=block_mask,
                             triton_version=triton_version)


@pytest.mark.parametrize(("head_dim", "stages"), [(128, ("v8d", "v8f")), (64, ("v8f", "v8a")), (256, ("v8d", "v8d"))])
@pytest.mark.parametrize("causal", [False, True, "top_left", "bottom_right"])
def test_on_an_h200_the_default_forward_at_n_4096_is_the_fastest_one_measured(head_dim, stages, causal):
    q = t(1, 2, 4096, head_dim)
    chosen = route(q, q, q, causal=causal)
    assert chosen.forward == stages[bool(causal)] and chosen.gluon
    assert "the fastest forward measured" in chosen.forward_why and chosen.backward == "b1"


def test_the_bands_are_the_gpus_own_or_the_h200s_said_as_the_fallback():
    """explain() names the GPU whose measurement chose the forward: the H200's own bands on an H200; a Hopper GPU
    with no measurement of its own gets the H200's, and the reason says so."""
    q = t(1, 2, 4096, 128)
    on_h200 = route(q, q, q, causal=True)
    assert "measured on the H200" in on_h200.forward_why and "fallback" not in on_h200.forward_why
    unmeasured = configs.DeviceProps("NVIDIA H800", (9, 0), 227 * 1024, 132)
    elsewhere = route(q, q, q, causal=True, props=unmeasured)
    assert elsewhere.forward == on_h200.forward
    assert "no measurement on the NVIDIA H800 at D = 128, so the H200's, the fallback" in elsewhere.forward_why
    h100 = configs.KNOWN_DEVICES["H100"]
    at_8192 = route(*(t(1, 1, 8192, 128),) * 3, causal=True, props=h100)
    assert at_8192.forward == "v8d" and "measured on the H100" in at_8192.forward_why
    assert route(*(t(1, 1, 8192, 128),) * 3, causal=True).forward == "v8f"  # the H200's band there
    at_256 = route(*(t(1, 1, 4096, 256),) * 3, props=h100)
    assert at_256.forward == "v8d" and "no measurement on the NVIDIA H100 80GB HBM3 at D = 256" in at_256.forward_why
    for name, (gpu, bands) in plan.BANDS_BY_GPU.items():
        assert name in {p.name for p in configs.KNOWN_DEVICES.values()}, name
        assert set(bands) <= set(plan.FORWARD_BANDS), gpu  # head dims and causality the stages take


def test_each_h100_band_from_n_2048_runs_the_fastest_forward_of_its_stage_table():
    """The H100's bands held to its own stage table by length as the H200's are to theirs: at every length from
    N = 2048, in both dtypes, the band's forward within 2% of the fastest. Below, the script is host-bound (see
    the next test)."""
    name = Path(plan.H100_FA3_RESULTS).name
    assert name == sorted(RESULTS.glob("*-nvidia-h100-80gb-hbm3-fa3-stages-*-n1024-*.json"))[-1].name
    rates = defaultdict(dict)
    for row in _timed(name):
        rates[row["head_dim"], row["causal"], row["n"], row["dtype"]][row["provider"].removeprefix("fa3-")] = \
            row["tflops"]
    checked = 0
    for (head_dim, causal, n, dtype), by_kernel in rates.items():
        best = max(v for k, v in by_kernel.items() if k != "sdpa_cudnn")
        if n < 2048:
            continue
        chosen, _ = plan.band_forward(head_dim, causal, n, plan.H100_FORWARD_BANDS)
        assert by_kernel[chosen] >= 0.98 * best, (head_dim, causal, n, dtype, chosen, by_kernel)
        checked += 1
    assert checked == 2 * 2 * 4 * 2  # head dims, causal or not, N 2048-16384, dtypes


@pytest.mark.parametrize(("why", "make"), [
    ("compute capability", lambda: route(t(1, 2, 128, 64), t(1, 2, 128, 64), t(1, 2, 128, 64),
                                         props=configs.KNOWN_DEVICES["A100"])),
    ("CPU interpreter", lambda: route(t(1, 2, 128, 64), t(1, 2, 128, 64), t(1, 2, 128, 64),
                                      props=configs.INTERPRETER)),
    ("tested with Triton", lambda: route(t(1, 2, 128, 64), t(1, 2, 128, 64), t(1, 2, 128, 64),
                                         triton_version="3.8.0")),
    ("D = 96", lambda: route(t(1, 2, 128, 96), t(1, 2, 128, 96), t(1, 2, 128, 96))),
    ("float32", lambda: route(*(t(1, 2, 128, 64, dtype=torch.float32),) * 3)),
    ("grouped-query", lambda: route(t(1, 4, 128, 64), t(1, 2, 128, 64), t(1, 2, 128, 64))),
    ("top-left", lambda: route(t(1, 2, 64, 64), t(1, 2, 128, 64), t(1, 2, 128, 64), causal="bottom_right")),
    ("sliding window", lambda: route(*(t(1, 2, 128, 64),) * 3, causal=True, window=(63, 0))),
    ("softcap", lambda: route(*(t(1, 2, 128, 64),) * 3, softcap=20.0)),
    ("contiguous", lambda: route(*(t(1, 128, 2, 64).transpose(1, 2),) * 3)),
    ("multiple of", lambda: route(*(t(1, 2, 200, 64),) * 3)),
])
def test_every_call_outside_the_gluon_contract_runs_v7_and_says_why(why, make):
    chosen = make()
    assert chosen.forward == "v7" and not chosen.gluon
    assert why in chosen.forward_why


@pytest.mark.parametrize(("head_dim", "causal", "expected"), [
    (64, True, {128: "v7", 1024: "v7", 1152: "v8a", 8192: "v8a", 8320: "v8f", 32768: "v8f"}),
    (64, False, {128: "v8f", 1024: "v8f", 8320: "v8f"}),
    (128, True, {128: "v8d", 1024: "v8d", 1152: "v8f", 8192: "v8f", 8320: "v8d"}),
    (128, False, {128: "v8d", 8320: "v8d"}),
])
def test_the_forward_follows_the_bands_of_n_q(head_dim, causal, expected):
    """Each band's edges: a call of N_q at a band's limit runs that band's kernel, one key tile longer the next."""
    for n, forward in expected.items():
        chosen = route(*(t(1, 1, n, head_dim),) * 3, causal=causal)
        assert chosen.forward == forward, (n, str(chosen))
        assert "BANDS_BY_GPU" in chosen.forward_why


def test_the_short_causal_band_follows_the_attention_grids():
    """At N = 1024, causal, D = 64 (below the stage table's reliable lengths) v7 ran closer to cuDNN in the grid of
    cbadf8b than v8f in the grid of 1a7bc36 (same day, same shapes, key ratio_vs_sdpa_cudnn), fp16 and bf16."""
    for dtype in ("fp16", "bf16"):
        ratios = {}
        for commit in ("cbadf8b", "1a7bc36"):
            rows = stage_results(f"2026-12-02-nvidia-h200-attention-{dtype}-{commit}.json")["rows"]
            ratios[commit] = {r["n"]: r["ratio_vs_sdpa_cudnn"] for r in rows if r["provider"] == "flashcourse"
                              and r["head_dim"] == 64 and r["causal"] and r["mode"] == "fwd"}
        assert plan.band_forward(64, True, 1024)[0] == "v7"
        assert ratios["cbadf8b"][1024] > ratios["1a7bc36"][1024] + 0.1, (dtype, ratios)


def test_awkward_query_lengths_still_take_gluon_when_the_keys_fill_whole_tiles():
    """Only the key tiles can read another head's rows (the query rows past N_q are never stored)."""
    for n_q in (1, 17, 200):
        assert route(t(1, 2, n_q, 128), t(1, 2, 256, 128), t(1, 2, 256, 128)).forward == "v8d"


def test_the_backward_is_b3_where_the_call_needs_its_options():
    q, k = t(1, 4, 128, 64), t(1, 2, 128, 64)
    chosen = route(q, k, k)
    assert chosen.backward == "b3" and "grouped-query" in chosen.backward_why


@pytest.fixture
def b7_tested(monkeypatch):
    """hopper/fa3_backward_tma.py (b7c, b7e) and fa3_backward_d256.py (b8) as if their routes had run under 3.9."""
    b7 = pytest.importorskip("flashcourse.kernels.hopper.fa3_backward_tma")
    if not b7.HAS_TMA_REDUCE:
        pytest.skip("this Triton's Gluon has no tma.async_atomic_add (Triton >= 3.9 has)")
    b8 = pytest.importorskip("flashcourse.kernels.hopper.fa3_backward_d256")
    for module in (b7, b8):
        monkeypatch.setattr(module, "TESTED_TRITON", ("3.9",))
    return b7


H100 = configs.KNOWN_DEVICES["H100"]


GLUON_STAGE_BY_HEAD_DIM = {64: "b7c", 128: "b7g", 256: "b8d"}


@pytest.mark.parametrize("causal", [False, True, "bottom_right"])
@pytest.mark.parametrize(("head_dim", "dtype"), [(64, torch.float16), (128, torch.bfloat16), (256, torch.float16)])
def test_on_hopper_long_plain_and_causal_calls_take_the_gluon_backward(b7_tested, causal, head_dim, dtype):
    q = t(1, plan.B7_MIN_ROWS // plan.B7_MIN_N, plan.B7_MIN_N, head_dim, dtype=dtype)  # the least work it serves
    gluon = plan.GLUON_BACKWARDS[head_dim]
    for props in (H100, H200):
        chosen = route(q, q, q, causal=causal, props=props, triton_version="3.9.1")
        assert chosen.backward == gluon.stage == GLUON_STAGE_BY_HEAD_DIM[head_dim], str(chosen)
        assert "measured faster than b1" in chosen.backward_why and Path(gluon.lengths).name in chosen.backward_why
    made = plan.Plan(chosen, q, q, q, parse_rules(q, q, causal=causal), scale=None, cacheable=False, in_graph=False)
    assert made._backward_version is None  # a Gluon backward plans its own launches


@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_calls_of_little_work_keep_b1(b7_tested, head_dim):
    """Below B7_MIN_ROWS query rows (B * H * N_q) b1 serves even a length the Gluon backward takes, and says why."""
    for shape in ((1, 16, plan.B7_MIN_N), (1, 1, 4 * plan.B7_MIN_N), (2, 8, 2 * plan.B7_MIN_N - 128)):
        q = t(*shape, head_dim)
        chosen = route(q, q, q, causal=True, props=H100, triton_version="3.9.1")
        assert chosen.backward == "b1" and f"from {plan.B7_MIN_ROWS:,} query rows" in chosen.backward_why, str(chosen)
        assert Path(plan.B7_SHORT).name in chosen.backward_why


# The stage B7_SHORT timed for each dispatched one: b7g launches as b7e does (the same plan, grid and arguments; one
# constexpr apart in the kernel), so b7e's time per call at little work is b7g's
SHORT_RUN_STAGE = {"b7c": "b7c", "b7g": "b7e"}


def test_the_floor_of_little_work_is_held_to_its_run():
    """B7_MIN_ROWS is the least work of B7_SHORT at which the dispatched stage (b7c at D = 64; at 128 b7e, whose
    launches b7g's are) beat b1 in every case, both dtypes, causal and not; at the next smaller work timed b1 won at
    least one case (so the floor is not set lower than the run supports, nor higher than it needs)."""
    run = json.loads((RESULTS.parent.parent / plan.B7_SHORT).read_text())
    rows = [r for r in run["rows"] if r["kind"] == "time" and r["status"] == "ok"]
    b1 = {(r["batch"], r["heads"], r["n"], r["dtype"], r["head_dim"], r["causal"]): r["tflops"]
          for r in rows if r["provider"] == "b1"}
    wins: dict[int, list[bool]] = {}
    for r in rows:
        if r["provider"] == SHORT_RUN_STAGE[plan.GLUON_BACKWARDS[r["head_dim"]].stage]:
            key = (r["batch"], r["heads"], r["n"], r["dtype"], r["head_dim"], r["causal"])
            wins.setdefault(r["batch"] * r["heads"] * r["n"], []).append(r["tflops"] > b1[key])
    assert all(len(cases) >= 8 for cases in wins.values()), {work: len(cases) for work, cases in wins.items()}
    serving = sorted(work for work, cases in wins.items() if all(cases))
    below = [work for work in wins if work < plan.B7_MIN_ROWS]
    assert serving[0] == plan.B7_MIN_ROWS and all(work in serving for work in wins if work >= plan.B7_MIN_ROWS)
    assert below and not any(all(wins[work]) for work in below)


@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_the_gluon_backward_is_held_to_its_runs(head_dim):
    """Each Gluon backward serves N >= B7_MIN_N because it beat b1 at every length timed from there, in every
    (dtype, head dim, causal) case of the run the dispatch cites (key ratio_vs_b1); B7_MIN_N is that run's shortest
    length (no band reaches below what was measured); it beat every other stage timed in that run; and every
    gradient check of it in its checks run passed, at N = 1 and 4096 at least, causal and not, in both dtypes."""
    gluon = plan.GLUON_BACKWARDS[head_dim]
    run = json.loads((RESULTS.parent.parent / gluon.lengths).read_text())
    rows = [r for r in run["rows"] if r["kind"] == "time" and r["head_dim"] == head_dim]
    timed = [r for r in rows if r["provider"] == gluon.stage]
    # a stage timed beside it in the same run (b7c beside b7e) must have been slower at every length
    mine = {(r["dtype"], r["causal"], r["n"]): r["tflops"] for r in timed}
    rivals = [r for r in rows if r["provider"] in run["meta"]["variants"] and r["provider"] != gluon.stage]
    assert all(r["tflops"] < mine[r["dtype"], r["causal"], r["n"]] for r in rivals if r["status"] == "ok"), [
        (r["provider"], r["dtype"], r["causal"], r["n"]) for r in rivals
        if r["status"] == "ok" and r["tflops"] >= mine[r["dtype"], r["causal"], r["n"]]]
    lengths = sorted({r["n"] for r in timed})
    assert lengths[0] == plan.B7_MIN_N and len(lengths) >= 4, lengths
    cases = {(dtype, head_dim, causal) for dtype in ("float16", "bfloat16") for causal in (False, True)}
    for n in lengths:
        at_n = [r for r in timed if r["n"] == n]
        assert {(r["dtype"], r["head_dim"], r["causal"]) for r in at_n} == cases, n
        assert all(r["status"] == "ok" and r["ratio_vs_b1"] > 1.0 for r in at_n), [
            (n, r["head_dim"], r["causal"], r.get("ratio_vs_b1")) for r in at_n]
    checks = [r for r in json.loads((RESULTS.parent.parent / gluon.checks).read_text())["rows"]
              if r["provider"] == gluon.stage and r["kind"] == "check"]
    checked = {(r["dtype"], r["head_dim"], r["causal"], r["n"]) for r in checks}
    assert {(dtype, d, causal, n) for dtype, d, causal in cases for n in (1, 4096)} <= checked, checked
    assert all(r["status"] == "ok" for r in checks)


@pytest.mark.parametrize(("why", "make"), [
    ("N_q = 896", lambda: route(*(t(1, 1, 896, 64),) * 3, props=H100, triton_version="3.9.0")),
    ("N_kv = 8256", lambda: route(*(t(1, 1, 8256, 64),) * 3, props=H100, triton_version="3.9.0")),
    ("N_q = 8192, N_kv = 8320", lambda: route(t(1, 1, 8192, 64), t(1, 1, 8320, 64), t(1, 1, 8320, 64),
                                               props=H100, triton_version="3.9.0")),
    ("D = 96", lambda: route(*(t(1, 1, 8192, 96),) * 3, props=H100, triton_version="3.9.0")),
    ("N_q = 960", lambda: route(*(t(1, 1, 960, 256),) * 3, props=H100, triton_version="3.9.0")),
    ("N_kv = 8224", lambda: route(*(t(1, 1, 8224, 256),) * 3, props=H100, triton_version="3.9.0")),
    ("float32", lambda: route(*(t(1, 1, 8192, 64, dtype=torch.float32),) * 3, props=H100, triton_version="3.9.0")),
    ("contiguous", lambda: route(*(t(1, 8192, 2, 64).transpose(1, 2),) * 3, props=H100, triton_version="3.9.0")),
    ("this is Triton 3.6.0", lambda: route(*(t(1, 1, 8192, 64),) * 3, props=H100, triton_version="3.6.0")),
])
def test_the_gluon_backward_leaves_to_b1_what_it_was_not_measured_on(b7_tested, why, make):
    chosen = make()
    assert chosen.backward == "b1" and why in chosen.backward_why, str(chosen)
    assert chosen.backward_why.startswith("the call needs none of b3's options, and b1 is faster; ")


def test_the_gluon_backward_waits_for_a_tested_triton_and_hopper(b7_tested, monkeypatch):
    q = t(1, 1, 8192, 64)
    assert route(q, q, q, props=configs.KNOWN_DEVICES["A100"], triton_version="3.9.0").backward_why == (
        "the call needs none of b3's options, and b1 is faster")  # nothing else could serve it: nothing said
    assert route(q, q, q, props=configs.INTERPRETER, triton_version="3.9.0").backward == "b1"
    assert route(t(1, 2, 8192, 64), q, q, props=H100, triton_version="3.9.0").backward == "b3"  # grouped-query
    monkeypatch.setattr(b7_tested, "TESTED_TRITON", ())  # as before any Triton had run the route on a GPU
    chosen = route(q, q, q, props=H100, triton_version="3.9.0")
    assert chosen.backward == "b1" and "tested with Triton none yet" in chosen.backward_why


def test_explain_is_what_the_call_runs_here(rng):
    q = torch.randn(1, 2, 40, 16, dtype=torch.float16)
    chosen = kernels.explain(q, q, q, is_causal=True)
    assert (chosen.forward, chosen.backward) == ("v7", "b1")
    assert str(chosen).splitlines()[0].startswith("forward  v7: the default;")
    assert kernels.explain(q, q, q, forward_version="v3").forward_why == "asked for (forward_version='v3')"
    with pytest.raises(ValueError, match="enable_gqa=True"):
        kernels.explain(torch.randn(1, 4, 40, 16, dtype=torch.float16), q, q)


def test_a_repeat_call_reuses_its_plan_and_other_options_get_another():
    plan.PLANS.clear()
    q = torch.randn(1, 2, 24, 16, dtype=torch.float16)
    kernels.flash_attention(q, q, q, causal=True)
    first = len(plan.PLANS)
    kernels.flash_attention(q.clone(), q.clone(), q.clone(), causal=True)
    assert len(plan.PLANS) == first == 1
    kernels.flash_attention(q, q, q)
    kernels.flash_attention(q, q, q, causal=True, scale=0.5)
    assert len(plan.PLANS) == 3
    kernels.flash_attention(q, q, q, alibi_slopes=torch.ones(2))  # a rule with a tensor: a plan of its own
    assert len(plan.PLANS) == 3


@pytest.mark.parametrize("scale", [math.inf, -math.inf, math.nan, 0.0, -0.5, 1e-31, 2e30])
def test_a_scale_outside_1e_30_to_1e30_is_refused(scale):
    q = torch.randn(1, 1, 8, 16, dtype=torch.float16)
    with pytest.raises(ValueError, match="expected a number from 1e-30 to 1e"):
        kernels.flash_attention(q, q, q, scale=scale)
    with pytest.raises(ValueError, match="expected a number from 1e-30 to 1e"):
        kernels.flash_attention_forward(q, q, q, scale=scale)


def test_sdpa_spellings_is_causal_and_enable_gqa():
    q = torch.randn(1, 4, 24, 16, dtype=torch.float16)
    kv = torch.randn(1, 2, 24, 16, dtype=torch.float16)
    expect = kernels.flash_attention(q, kv, kv, causal=True, enable_gqa=True)
    assert torch.equal(kernels.flash_attention(q, kv, kv, is_causal=True, enable_gqa=True), expect)
    assert torch.equal(kernels.flash_attention(q, kv, kv, causal="top_left", is_causal=True, enable_gqa=True),
                       expect)
    with pytest.raises(ValueError, match="disagree"):
        kernels.flash_attention(q, kv, kv, causal="bottom_right", is_causal=True, enable_gqa=True)
    with pytest.raises(ValueError, match="disagree"):
        kernels.flash_attention(q, kv, kv, causal=True, is_causal=False, enable_gqa=True)
    with pytest.raises(TypeError, match="is_causal"):
        kernels.flash_attention(q, kv, kv, is_causal="yes", enable_gqa=True)
    with pytest.raises(ValueError, match="pass enable_gqa=True"):
        kernels.flash_attention(q, kv, kv)
    with pytest.raises(ValueError, match="pass enable_gqa=True"):
        kernels.flash_attention_forward(q, kv, kv)


def test_return_lse_gives_the_forwards_lse_with_a_gradient():
    """The lse is differentiable (its gradients against float64: tests/test_edges.py); a loss on o alone still
    gives o's gradients."""
    q = torch.randn(1, 2, 24, 16, dtype=torch.float16, requires_grad=True)
    o, lse = kernels.flash_attention(q, q.detach(), q.detach(), return_lse=True)
    o_fwd, lse_fwd = kernels.flash_attention_forward(q.detach(), q.detach(), q.detach())
    assert torch.equal(o.detach(), o_fwd) and torch.equal(lse.detach(), lse_fwd)
    assert lse.dtype == torch.float32 and lse.requires_grad
    o.float().sum().backward()
    assert q.grad is not None and torch.isfinite(q.grad).all()


def test_alibi_slopes_and_document_ids_are_saved_for_backward_not_kept_on_ctx():
    q = torch.randn(1, 2, 24, 16, dtype=torch.float16, requires_grad=True)
    slopes = torch.tensor([0.5, 0.25])
    docs = torch.tensor([[0] * 10 + [1] * 14])
    o = kernels.flash_attention(q, q, q, alibi_slopes=slopes, document_ids=docs)
    node = o.grad_fn
    assert node.described.rules.alibi_slopes is None and node.described.rules.document_ids is None
    saved = node.saved_tensors
    assert any(s is not None and torch.equal(s, slopes) for s in saved)
    assert any(s is not None and torch.equal(s, docs.to(torch.int32)) for s in saved)


class Replayed:
    """Stands in for the compiled kernel that ``kernel[grid](...)`` returns on a GPU: launching it runs the
    interpreted kernel on the arguments it is given, so a prepared launch replays through the interpreter."""

    packed_metadata = ()

    def __init__(self, kernel, launches: list):
        self.kernel, self.launches = kernel, launches
        self.params = list(inspect.signature(kernel.fn).parameters)
        self.src = SimpleNamespace(signature=dict.fromkeys(self.params))

    def __getitem__(self, grid):
        def run(*args):
            self.launches.append(self.kernel.fn.__name__)
            ORIGINAL_GETITEM(self.kernel, grid)(**dict(zip(self.params, args, strict=True)))

        return run


ORIGINAL_GETITEM = InterpretedFunction.__getitem__


def test_a_plan_replays_its_prepared_launches_on_the_next_calls_tensors(monkeypatch):
    """The path a repeat call takes on a GPU, through the interpreter: the first call prepares the forward's launch
    and the backward's three, the second only swaps its own tensors in (a slot mixed up would show here)."""
    replayed: list = []

    def full_launch(kernel, grid):
        def run(**kwargs):
            ORIGINAL_GETITEM(kernel, grid)(**kwargs)
            return Replayed(kernel, replayed)

        return run

    monkeypatch.setattr(InterpretedFunction, "__getitem__", full_launch)
    monkeypatch.setattr(plan, "repeatable", lambda q: True)
    plan.PLANS.clear()
    rng = np.random.default_rng(5)
    for step in range(2):
        q, k, v, do = (torch.tensor(rng.standard_normal((1, 2, 40, 16)), dtype=torch.float32) for _ in range(4))
        k = k[:, :1]  # grouped-query attention, strided views: every stride of the layout is kept
        v = v[:, :1]
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        o = kernels.flash_attention(*leaves, causal=True, enable_gqa=True)
        o.backward(do)
        expect = _reference(q, k.expand(-1, 2, -1, -1), v.expand(-1, 2, -1, -1), True, do)
        got = (o, leaves[0].grad, leaves[1].grad, leaves[2].grad)
        want = (expect[0], expect[1], expect[2].sum(1, keepdim=True), expect[3].sum(1, keepdim=True))
        for g, w, what in zip(got, want, ("o", "dq", "dk", "dv"), strict=True):
            assert (g.double() - w).abs().max() < 1e-4, f"step {step}: {what}"
        if step == 0:
            assert replayed == [], "the first call launches through Triton and prepares"
    assert len(replayed) == 4, f"the second call replays forward, preprocess, dK/dV and dQ: {replayed}"
    plan.PLANS.clear()


def test_gluon_descriptor_templates_keep_no_tensor_and_take_each_calls():
    try:
        from flashcourse.kernels.hopper import fa3
    except (ImportError, AttributeError) as error:
        pytest.skip(f"fa3.py does not import under this Triton: {error}")
    x = torch.zeros(2, 3, 128, 64, dtype=torch.float16)
    template = fa3._descriptor(x, 2 * 3 * 128, 64)
    assert template.base is None  # a plan kept for later calls pins no tensor of its first call
    y = torch.ones_like(x)
    descriptor = fa3._on(template, y)
    assert descriptor.base is y and template.base is None
    assert (descriptor.shape, descriptor.strides, descriptor.block_shape) == ([768, 64], [64, 1], [64, 64])


def _tensors_kept(obj, seen=None) -> list:
    """Every tensor reachable from ``obj`` through attributes (``__dict__`` and ``__slots__``), lists, tuples,
    dicts and the arguments bound by ``functools.partial``."""
    seen = set() if seen is None else seen
    if id(obj) in seen or isinstance(obj, (str, int, float, type)) or obj is None:
        return []
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        return [obj]
    children = list(obj.values()) if isinstance(obj, dict) else list(obj) if isinstance(obj, (list, tuple)) else []
    children += list(getattr(obj, "__dict__", {}).values())
    if isinstance(obj, functools.partial):
        children += [obj.args, obj.keywords]
    for cls in type(obj).__mro__:
        children += [getattr(obj, slot) for slot in getattr(cls, "__slots__", ()) if hasattr(obj, slot)]
    return [t for child in children for t in _tensors_kept(child, seen)]


def test_a_plan_made_inside_a_compiled_graph_keeps_no_tensor(monkeypatch):
    """Under torch.compile(mode="reduce-overhead") the op's first calls run in the CUDA graphs' memory pool, and
    the graphs refuse to record while a tensor of that pool lives that no output owns: the plan an op's body makes
    (kept for the next calls) must hold none. The eager plan keeps its lse template (half the host time of an
    allocation), which this walk must find, or it could not see the other one."""
    from flashcourse.kernels import ops

    monkeypatch.setattr(plan, "repeatable", lambda q: True)  # keep the launches too, as on a GPU
    plan.PLANS.clear()
    q, k, v = (torch.randn(1, 2, 24, 16) for _ in range(3))
    rules = parse_rules(q, k, causal=True)
    described = ops._op_call(q, k, v, *ops.flat_rules(rules), None, False, None, None, 0.0, None)
    in_graph, o, _ = ops.attention_forward_impl(q, k, v, described)
    assert in_graph.in_graph and _tensors_kept(in_graph) == []
    eager = kernels.flash_attention(q, k, v, causal=True)
    torch.testing.assert_close(eager, o)
    (kept,) = [p for p in plan.PLANS.plans.values() if p is not in_graph]
    assert not kept.in_graph and [t.shape for t in _tensors_kept(kept)] == [(1, 2, 24)]
    plan.PLANS.clear()


# ------------------------------------------------------------------------------------------ on a GPU
def _reference(q, k, v, causal, do):
    """float64 o and gradients (autograd through the reference attention in PyTorch)."""
    q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
    scores = q64 @ k64.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        n_q, n_kv = q.shape[2], k.shape[2]
        scores = scores.masked_fill(torch.ones(n_q, n_kv, dtype=torch.bool, device=q.device).triu(1), -math.inf)
    o = torch.softmax(scores, -1) @ v64
    o.backward(do.double())
    return o, q64.grad, k64.grad, v64.grad


GPU_CASES = [  # (name, expected forward (not causal, causal), n_q, n_kv, head_dim, dtype, heads_kv, layout)
    ("v8d", ("v8d", "v8d"), 200, 256, 128, torch.bfloat16, 2, "contiguous"),
    ("v8d short queries", ("v8d", "v8d"), 17, 128, 128, torch.float16, 2, "contiguous"),
    ("v8f", ("v8f", "v7"), 1, 256, 64, torch.float16, 2, "contiguous"),
    ("v8f", ("v8f", "v7"), 256, 256, 64, torch.bfloat16, 2, "contiguous"),
    ("v8f: query tiles in turn", ("v8f", "v7"), 1000, 1024, 64, torch.float16, 2, "contiguous"),
    ("v8a: causal, D = 64, 1024 < N_q <= 8192", ("v8f", "v8a"), 2176, 2176, 64, torch.bfloat16, 2, "contiguous"),
    ("v8f: causal, D = 64, N_q > 8192", ("v8f", "v8f"), 8320, 8320, 64, torch.float16, 2, "contiguous"),
    ("v8f: causal, D = 128, 1024 < N_q <= 8192", ("v8d", "v8f"), 1152, 1152, 128, torch.float16, 2, "contiguous"),
    ("v8d: causal, D = 128, N_q > 8192", ("v8d", "v8d"), 8320, 8320, 128, torch.bfloat16, 2, "contiguous"),
    ("v8d: D = 256", ("v8d", "v8d"), 200, 256, 256, torch.bfloat16, 2, "contiguous"),
    ("v8d: D = 256, short", ("v8d", "v8d"), 17, 64, 256, torch.float16, 2, "contiguous"),
    ("v7: awkward keys", ("v7", "v7"), 17, 200, 128, torch.float16, 2, "contiguous"),
    ("v7: GQA", ("v7", "v7"), 200, 200, 64, torch.float16, 1, "contiguous"),
    ("v7: D = 96", ("v7", "v7"), 128, 128, 96, torch.float16, 2, "contiguous"),
    ("v7: float32", ("v7", "v7"), 128, 128, 64, torch.float32, 2, "contiguous"),
    ("v7: (B, N, H, D) view", ("v7", "v7"), 256, 256, 128, torch.bfloat16, 2, "transposed"),
]

# Where the H100's own bands (plan.H100_FORWARD_BANDS) differ for a case above: causal D = 64 up to N_q = 4096 runs
# v8a there (Nsight Compute timed v7 slower at N = 1024 on the H100), where the H200 runs v7 up to 1024.
H100_CAUSAL_ROUTES = {"v8f": "v8a", "v8f: query tiles in turn": "v8a"}


@pytest.mark.gpu
@pytest.mark.big_gpu_memory  # its float64 reference at N = 8320 allocates 2 GiB at a time
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(("name", "forward", "n_q", "n_kv", "head_dim", "dtype", "heads_kv", "layout"), GPU_CASES)
def test_gpu_every_route_agrees_with_float64(name, forward, n_q, n_kv, head_dim, dtype, heads_kv, layout, causal):
    if causal and n_q != n_kv:
        n_q = n_kv  # top-left causal over unequal lengths is v7's alone: keep the case on its route
    torch.manual_seed(0)

    def make(n, heads):
        if layout == "transposed":
            return torch.randn(2, n, heads, head_dim, device="cuda", dtype=dtype).transpose(1, 2)
        return torch.randn(2, heads, n, head_dim, device="cuda", dtype=dtype)

    q, k, v = make(n_q, 2), make(n_kv, heads_kv), make(n_kv, heads_kv)
    options = dict(causal=causal, enable_gqa=heads_kv != 2)
    chosen = kernels.explain(q, k, v, **options)
    expect_forward = forward[causal]
    if causal and torch.cuda.get_device_name() == "NVIDIA H100 80GB HBM3":
        expect_forward = H100_CAUSAL_ROUTES.get(name, expect_forward)
    if torch.cuda.get_device_capability() != plan.HOPPER or "tested with Triton" in chosen.forward_why:
        expect_forward = "v7"
    assert chosen.forward == expect_forward, str(chosen)
    do = torch.randn_like(q)
    k_ref = k.repeat_interleave(q.shape[1] // heads_kv, 1)
    v_ref = v.repeat_interleave(q.shape[1] // heads_kv, 1)
    o_ref, dq_ref, dk_ref, dv_ref = _reference(q, k_ref, v_ref, causal, do)
    dk_ref = dk_ref.unflatten(1, (heads_kv, -1)).sum(2)
    dv_ref = dv_ref.unflatten(1, (heads_kv, -1)).sum(2)
    tol = {torch.float16: 2e-2, torch.bfloat16: 6e-2, torch.float32: 2e-3}[dtype]
    for _ in range(2):  # the first call makes the plan, the second repeats its launches
        qg, kg, vg = (x.detach().clone().requires_grad_() for x in (q, k, v))
        o = kernels.flash_attention(qg, kg, vg, **options)
        o.backward(do)
        for got, want, what in ((o, o_ref, "o"), (qg.grad, dq_ref, "dq"), (kg.grad, dk_ref, "dk"),
                                (vg.grad, dv_ref, "dv")):
            error = (got.double() - want).abs().max().item()
            scale = want.abs().max().item() + 1e-6
            assert error <= tol * max(scale, 1.0), f"{name} causal={causal}: {what} off by {error}"
    o_fwd, lse = kernels.flash_attention_forward(q, k, v, **options)
    lse_ref = torch.logsumexp(
        (q.double() @ k_ref.double().transpose(-1, -2) / math.sqrt(head_dim)).masked_fill(
            torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device="cuda").triu(1) if causal else
            torch.zeros(q.shape[2], k.shape[2], dtype=torch.bool, device="cuda"), -math.inf), -1)
    assert (lse.double() - lse_ref).abs().max().item() < 2e-2
    assert np.isfinite(o_fwd.float().cpu().numpy()).all()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(("head_dim", "dtype"), [(64, torch.float16), (128, torch.bfloat16), (256, torch.float16)])
# the band's shortest length and a long one (its float64 scores and their softmax, 2 x 8192 x 8192, 1 GiB each)
@pytest.mark.parametrize("n", [plan.B7_MIN_N, pytest.param(8192, marks=pytest.mark.big_gpu_memory)])
def test_gpu_the_gluon_backward_route_agrees_with_float64(monkeypatch, causal, head_dim, dtype, n):
    """flash_attention's gradients through the Gluon backward's route (b7c at D = 64, b7g at 128, b8d at 256; its
    TESTED_TRITON and PREPARED_TRITON set to the running Triton, as a release it was tested with would be), against
    float64 autograd, for a loss of o and for one that also uses the lse (the Gluon backwards have no lse term: that
    backward runs b1)."""
    if torch.cuda.get_device_capability() != plan.HOPPER:
        pytest.skip("the Gluon backwards are written for Hopper")
    b7 = pytest.importorskip("flashcourse.kernels.hopper.fa3_backward_tma")
    if not b7.HAS_TMA_REDUCE:
        pytest.skip("this Triton's Gluon has no tma.async_atomic_add (Triton >= 3.9 has)")
    b8 = pytest.importorskip("flashcourse.kernels.hopper.fa3_backward_d256")
    for module in (b7, b8):  # and the prepared launches, which the plan's repeat below runs
        for name in ("TESTED_TRITON", "PREPARED_TRITON"):
            monkeypatch.setattr(module, name, (plan._triton_minor(triton.__version__),))
    monkeypatch.setattr(plan, "B7_MIN_ROWS", 0)  # two heads: the route's numbers, not its floor of little work
    plan.PLANS.clear()  # no plan routed before the patch
    torch.manual_seed(0)
    q, k, v, do = (torch.randn(1, 2, n, head_dim, device="cuda", dtype=dtype) for _ in range(4))
    assert kernels.explain(q, k, v, causal=causal).backward == GLUON_STAGE_BY_HEAD_DIM[head_dim]
    q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
    scores = q64 @ k64.transpose(-1, -2) / math.sqrt(head_dim)
    if causal:
        scores = scores.masked_fill(torch.ones(scores.shape[-2:], dtype=torch.bool, device="cuda").triu(1), -math.inf)
    lse_ref = torch.logsumexp(scores, -1)
    o_ref = torch.exp(scores - lse_ref[..., None]) @ v64
    tol = {torch.float16: 2e-2, torch.bfloat16: 6e-2}[dtype]
    for uses_lse in (False, False, True):  # the plan made, its repeat, then a loss of o and lse
        want = torch.autograd.grad((o_ref * do.double()).sum() + (lse_ref.sum() if uses_lse else 0),
                                   (q64, k64, v64), retain_graph=True)
        qg, kg, vg = (x.detach().clone().requires_grad_() for x in (q, k, v))
        o, lse = kernels.flash_attention(qg, kg, vg, causal=causal, return_lse=True)
        got = torch.autograd.grad((o.float() * do.float()).sum() + (lse.sum() if uses_lse else 0), (qg, kg, vg))
        for g, w, what in zip(got, want, ("dq", "dk", "dv"), strict=True):
            error = (g.double() - w).abs().max().item()
            assert error <= tol * max(w.abs().max().item(), 1.0), f"{what} off by {error} (lse used: {uses_lse})"
    plan.PLANS.clear()  # the patched route's plans stay out of the later tests


def test_reference_import_is_used():  # the float64 reference of the package agrees with this file's
    q = np.random.default_rng(0).standard_normal((1, 1, 5, 16))
    ref = reference.attention(q, q, q, causal=True)
    mine = _reference(*(torch.from_numpy(q),) * 3, True, torch.zeros(1, 1, 5, 16, dtype=torch.float64))[0]
    assert np.allclose(ref, mine.detach().numpy())
