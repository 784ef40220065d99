"""The variants benchmark's CPU side: visible-entry counts (the TFLOP/s denominator), document packing,
providers per variant, ratios, merging two runs of one day, the table; the mask rules (each one function: its
picture, and Triton's reading of it against torch's); and its validate-then-time path on tiny variants in the
Triton interpreter (timing stubbed: CUDA events need a GPU)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from flashcourse import device  # noqa: E402

if not device.triton_available():
    pytest.skip("Triton is not installed here", allow_module_level=True)
import dataclasses  # noqa: E402

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from flashcourse import kernels  # noqa: E402, F401  (sets the interpreter up before triton loads elsewhere)
from flashcourse.bench import mask_rules, variants  # noqa: E402
from flashcourse.bench.variants import Variant  # noqa: E402

MASK_VARIANTS = [v for v in variants.VARIANTS if v.mask_rule is not None]
HEAD_DIM_256 = [v for v in variants.VARIANTS if v.head_dim == 256]


def brute_force_visible(variant: Variant, ids) -> int:
    """The same count from an explicit (N, N) mask per batch row."""
    i = np.arange(variant.n)[:, None]
    j = np.arange(variant.n)[None, :]
    total = 0
    for b in range(variant.batch):
        keep = np.ones((variant.n, variant.n), dtype=bool)
        if variant.causal or variant.window_left is not None:
            keep &= j <= i
        if variant.window_left is not None:
            keep &= j >= i - variant.window_left
        if ids is not None:
            keep &= ids[b][:, None] == ids[b][None, :]
        total += int(keep.sum())
    return total * variant.heads


@pytest.mark.parametrize("variant", [
    Variant("dense", 2, 3, 3, 50, 16),
    Variant("causal", 2, 3, 1, 50, 16, causal=True),
    Variant("window", 1, 2, 2, 70, 16, window_left=9),
    Variant("documents", 3, 2, 2, 64, 16, causal=True, documents=5),
    Variant("documents + window", 2, 1, 1, 64, 16, window_left=7, documents=3),
])
def test_visible_entries_match_an_explicit_mask(variant):
    ids = variants.document_ids(variant, seed=3)
    assert variants.visible_entries(variant, ids) == brute_force_visible(variant, ids)


def test_visible_entries_of_the_issue_shapes():
    n = 16384
    causal = variants.VARIANTS[0]
    assert variants.visible_entries(causal) == 4 * 16 * n * (n + 1) // 2  # the causal triangle, diagonal included
    window = next(v for v in variants.VARIANTS if v.window_left == 1024)
    per_head = sum(min(i, 1024) + 1 for i in range(n))
    assert variants.visible_entries(window) == 4 * 16 * per_head
    assert variants.variant_flops(causal, 10, "fwd") == 4 * 128 * 10
    assert variants.variant_flops(causal, 10, "bwd") == 2.5 * 4 * 128 * 10


def test_documents_are_random_lengths_that_fill_the_row():
    rng = np.random.default_rng(0)
    lengths = variants.document_lengths(16384, 8, rng)
    assert len(lengths) == 8 and lengths.sum() == 16384 and lengths.min() >= 1
    assert len(set(lengths.tolist())) > 1, "random lengths, not equal ones"
    ids = variants.document_ids(variants.VARIANTS[3])
    assert ids.shape == (4, 16384) and ids.dtype == np.int32
    assert not np.array_equal(ids[0], ids[1]), "each batch row packs its own documents"
    assert np.all(np.diff(ids, axis=1) >= 0), "contiguous runs, as visible_entries assumes"


def test_providers_per_variant():
    by_name = {v.name: v for v in variants.VARIANTS}
    assert variants.providers_for(by_name["causal"]) == ["flashcourse", "flex", "sdpa_flash", "sdpa_cudnn"]
    assert variants.providers_for(by_name["window 1024"]) == ["flashcourse", "flex"]
    assert variants.providers_for(by_name["softcap 30, causal"]) == ["flashcourse", "flex"]
    assert "flashcourse_expanded_kv" in variants.providers_for(by_name["GQA 32/8, causal"])
    assert "sdpa_flash" in variants.providers_for(by_name["GQA 32/8, causal"])
    assert variants.providers_for(by_name["8 documents, causal"]) == ["flashcourse", "flashcourse_block_mask", "flex"]
    assert [v.name for v in MASK_VARIANTS] == ["mask_mod: prefix-LM", "mask_mod: chunked local", "mask_mod: stripes"]
    for variant in MASK_VARIANTS:
        assert variants.providers_for(variant) == ["flashcourse", "flashcourse_block_mask", "flex"]
    assert [v.causal for v in HEAD_DIM_256] == [False, True]
    for variant in HEAD_DIM_256:
        assert variant.n >= 4096
        assert variants.providers_for(variant) == ["flashcourse", "flex", "sdpa_flash", "sdpa_cudnn"]


# ------------------------------------------------------------------------------------------ the mask rules
# Each rule drawn by hand from its description, at a small size: query rows, key columns, # a visible key.
PICTURES = {
    ("prefix-LM", 2): """
        ##...
        ##...
        ###..
        ####.
        #####""",
    ("chunked local", 2): """
        #....
        ##...
        ..#..
        ..##.
        ....#""",
    ("stripes", 4): """
        #.......
        ##......
        ###.....
        ####....
        #####...
        #.####..
        #..####.
        #...####""",  # a band of 4 keys, and key 0 and key 4 (the first quarter of each 4) for every later query
}


@pytest.mark.parametrize("rule, size", list(PICTURES))
def test_each_mask_rule_draws_its_picture(rule, size):
    rows = [line.strip() for line in PICTURES[rule, size].strip().splitlines()]
    expected = torch.tensor([[c == "#" for c in line] for line in rows])
    i = torch.arange(len(rows))
    assert torch.equal(mask_rules.MASK_RULES[rule](i[:, None], i[None, :], size), expected)


@triton.jit
def _evaluate_mask_mod(q_ptr, kv_ptr, out_ptr, MASK_MOD: tl.constexpr, COUNT: tl.constexpr):
    """out[i] = MASK_MOD(0, 0, q[i], kv[i]): the rule as our kernels evaluate it."""
    offsets = tl.arange(0, COUNT)
    keep = MASK_MOD(0, 0, tl.load(q_ptr + offsets), tl.load(kv_ptr + offsets))
    tl.store(out_ptr + offsets, keep.to(tl.int8))


@pytest.mark.parametrize("rule, size", sorted({(v.mask_rule, v.mask_size) for v in MASK_VARIANTS} | set(PICTURES)))
def test_triton_flex_and_the_reference_read_each_rule_alike(rule, size):
    """The jit mask_mod our kernels get, Flex's mask_mod and the reference's mask agree on random positions up to
    N = 16384: Triton's // and % round toward zero where torch's round down, so a rule that divided a negative
    number would differ here."""
    gen = torch.Generator().manual_seed(size)
    q_idx, kv_idx = (torch.randint(0, 16384, (4096,), generator=gen, dtype=torch.int32) for _ in range(2))
    q_idx[:2048] = kv_idx[:2048] + torch.randint(-600, 600, (2048,), generator=gen, dtype=torch.int32)
    q_idx.clamp_(0, 16383)  # half the pairs near the diagonal, where the rules change
    out = torch.empty(4096, dtype=torch.int8)
    _evaluate_mask_mod[(1,)](q_idx, kv_idx, out, MASK_MOD=mask_rules.triton_mask_mod(rule, size), COUNT=4096)
    expected = mask_rules.MASK_RULES[rule](q_idx.long(), kv_idx.long(), size)
    assert 0 < int(expected.sum()) < 4096, "both answers among the pairs"
    assert torch.equal(out.bool(), expected)
    variant = Variant("rule", 1, 1, 1, 16384, 16, mask_rule=rule, mask_size=size)
    flex_mask_mod = variants.flex_mask_mod(variant, None)
    assert torch.equal(flex_mask_mod(0, 0, q_idx.long(), kv_idx.long()), expected)


def test_the_jit_mask_mod_is_one_object_per_rule_and_size():
    """The kernels compile, and the per-call path keeps its tile lists, per mask_mod object."""
    assert mask_rules.triton_mask_mod("stripes", 256) is mask_rules.triton_mask_mod("stripes", 256)
    assert mask_rules.triton_mask_mod("stripes", 256) is not mask_rules.triton_mask_mod("stripes", 16)


def test_visible_entries_of_a_mask_rule_count_it_in_slices(monkeypatch):
    monkeypatch.setattr(variants, "DEVICE", "cpu")
    for rule, size in (("prefix-LM", 700), ("chunked local", 512), ("stripes", 256)):
        variant = Variant("rule", 3, 2, 2, 2500, 16, mask_rule=rule, mask_size=size)  # 3 slices of 1024 rows
        i = np.arange(variant.n)
        keep = mask_rules.MASK_RULES[rule](i[:, None], i[None, :], size)  # the rule on NumPy arrays
        assert variants.visible_entries(variant) == int(keep.sum()) * 3 * 2


def row(variant, provider, mode, tflops, dtype="float16", window_left=None, n=16384, status="ok"):
    return {"variant": variant, "provider": provider, "mode": mode, "tflops": tflops, "dtype": dtype,
            "window_left": window_left, "n": n, "status": status, "density": 0.5}


def test_ratios_and_window_against_our_causal():
    rows = [row("causal", "flashcourse", "fwd", 400.0), row("causal", "flex", "fwd", 320.0),
            row("window 1024", "flashcourse", "fwd", 340.0, window_left=1024),
            row("window 1024", "flex", "fwd", 0.0, window_left=1024, status="error")]
    variants.add_ratios(rows)
    assert rows[0]["ratio_vs_flex"] == pytest.approx(1.25)
    assert rows[2]["vs_our_causal"] == pytest.approx(0.85)
    assert "ratio_vs_flex" not in rows[2], "a failed provider gives no ratio"
    table = variants.format_table(rows)
    assert "error" in table and "1.25" in table and "0.85" in table


def test_per_call_and_prebuilt_block_mask_rows_get_ratios_to_flex_and_to_each_other():
    rows = [row("docs", "flashcourse", "bwd", 240.0), row("docs", "flashcourse_block_mask", "bwd", 300.0),
            row("docs", "flex", "bwd", 320.0)]
    variants.add_ratios(rows)
    per_call, prebuilt, _ = rows
    assert per_call["ratio_vs_flex"] == pytest.approx(0.75)
    assert prebuilt["ratio_vs_flex"] == pytest.approx(0.9375)
    assert prebuilt["ratio_vs_flashcourse"] == pytest.approx(1.25), "prebuilt over per-call"
    assert per_call["ratio_vs_flashcourse_block_mask"] == pytest.approx(0.8)


def test_a_misspelt_variant_name_is_refused_before_the_gpu_is_touched():
    with pytest.raises(ValueError, match="mask_mod: prefix-LM"):
        variants.run(names=["mask_mod: prefix LM"])


def test_the_two_gpu_stages_name_every_variant_once():
    """scripts/gpu_run.sh's variants_masks and variants_base split the variants between two device calls."""
    import re
    import shlex
    from pathlib import Path

    script = (Path(__file__).parents[1] / "scripts" / "gpu_run.sh").read_text()
    stage = script[script.index("variants_masks | variants_base)"):]
    stage = stage[:stage.index(";;")]
    named = [name for group in re.findall(r"names=\((.*?)\)", stage, re.DOTALL) for name in shlex.split(group)]
    assert sorted(named) == sorted(v.name for v in variants.VARIANTS)


def test_merge_keeps_the_other_dtype_and_replaces_repeats():
    old = [row("causal", "flashcourse", "fwd", 1.0, dtype="float16"),
           row("causal", "flashcourse", "fwd", 2.0, dtype="bfloat16")]
    new = [row("causal", "flashcourse", "fwd", 3.0, dtype="bfloat16")]
    merged = variants.merge_rows(old, new)
    assert sorted((r["dtype"], r["tflops"]) for r in merged) == [("bfloat16", 3.0), ("float16", 1.0)]


def test_earlier_rows_today_reads_only_todays_file_for_this_device(tmp_path):
    from flashcourse.bench import save_results

    assert variants.earlier_rows_today(tmp_path) == []
    save_results("variants", [row("causal", "flex", "bwd", 5.0)], directory=tmp_path)
    assert [r["tflops"] for r in variants.earlier_rows_today(tmp_path)] == [5.0]


def test_the_summary_table_says_the_head_dim_rows_shape(tmp_path):
    """bench.summary's variants table (README, KERNELS.md) states D = 128 for the run; D = 256 rows add their
    own D and N to its header, and get their lines."""
    from flashcourse.bench import save_results, summary

    variant = HEAD_DIM_256[0]
    rows = [{**row(variant.name, provider, "fwd", tflops), "head_dim": 256, "n": variant.n}
            for provider, tflops in (("flashcourse", 300.0), ("flex", 250.0), ("sdpa_cudnn", 400.0))]
    variants.add_ratios(rows)
    save_results("variants", rows, directory=tmp_path)
    table = summary.variants_summary(tmp_path)
    assert f"(the head_dim rows: D = 256, N = {variant.n})" in table.splitlines()[0]
    line = next(x for x in table.splitlines() if x.startswith("| head_dim: 256 |"))
    assert "| 1.20x |" in line and "| 400 |" in line


def fake_time_modes(fn, inputs, modes=variants.MODES):
    """Timings as ``bench.time_repeats`` returns them: 1 ms forward and 2 ms backward, each +-10%."""
    from flashcourse.bench import Timing

    return {"fwd": Timing(1.0, 0.9, 1.1, 3), "bwd": Timing(2.0, 1.8, 2.2, 3)}


def test_validate_then_time_path_on_a_tiny_variant(monkeypatch):
    """run_variant on CPU: ours and SDPA's math backend validated against the reference slice, a wrong provider
    recorded as wrong, a raising one as an error, and the run goes on."""
    monkeypatch.setattr(variants, "DEVICE", "cpu")
    monkeypatch.setattr(variants, "time_modes", fake_time_modes)
    real = variants.provider_fn

    def provider_fn(provider, variant, inputs):
        if provider == "broken":
            raise RuntimeError("no such kernel")
        if provider == "wrong":
            return lambda q, k, v: real("flashcourse", variant, inputs)(q, k, v) * 1.5
        return real(provider, variant, inputs)

    monkeypatch.setattr(variants, "provider_fn", provider_fn)
    tiny = Variant("tiny documents", 2, 4, 2, 40, 16, causal=True, documents=3, softcap=5.0)
    rows = variants.run_variant(tiny, "float32", providers=("flashcourse", "broken", "wrong"), log=lambda *a: None)
    status = {(r["provider"], r["mode"]): r["status"] for r in rows}
    assert status == {("flashcourse", "fwd"): "ok", ("flashcourse", "bwd"): "ok", ("broken", "fwd"): "error",
                      ("broken", "bwd"): "error", ("wrong", "fwd"): "wrong", ("wrong", "bwd"): "wrong"}
    ours = next(r for r in rows if r["provider"] == "flashcourse")
    assert max(ours["rel_err"].values()) < 1e-4
    assert "no such kernel" in next(r for r in rows if r["provider"] == "broken")["error"]
    expected_flops = variants.variant_flops(tiny, ours["visible_entries"], "fwd")
    assert ours["tflops"] == pytest.approx(expected_flops / 1e-3 / 1e12)
    assert ours["tflops_min"] == pytest.approx(expected_flops / 1.1e-3 / 1e12), "the slowest repeat: the lowest rate"
    assert (ours["ms"], ours["ms_min"], ours["ms_max"], ours["repeats"]) == (1.0, 0.9, 1.1, 3)


def test_a_prebuilt_block_mask_is_validated_timed_and_its_build_recorded_apart(monkeypatch):
    """The block-mask provider runs our kernels with a mask built once outside the timed region; its row records
    the build (warm, median of the repeats with its range), the per-call row records none."""
    monkeypatch.setattr(variants, "DEVICE", "cpu")
    monkeypatch.setattr(variants, "time_modes", fake_time_modes)
    tiny = Variant("tiny documents", 2, 4, 2, 40, 16, causal=True, documents=3)
    rows = variants.run_variant(tiny, "float32", providers=("flashcourse", "flashcourse_block_mask"),
                                log=lambda *a: None)
    assert {r["status"] for r in rows} == {"ok"}, rows
    prebuilt = next(r for r in rows if r["provider"] == "flashcourse_block_mask")
    assert max(prebuilt["rel_err"].values()) < 1e-4
    assert 0 < prebuilt["block_mask_build_ms_min"] <= prebuilt["block_mask_build_ms"] \
        <= prebuilt["block_mask_build_ms_max"]
    assert not any("block_mask_build_ms" in r for r in rows if r["provider"] == "flashcourse")


def test_validation_of_sdpa_and_expanded_kv_on_gqa(monkeypatch):
    monkeypatch.setattr(variants, "DEVICE", "cpu")
    monkeypatch.setattr(variants, "time_modes", fake_time_modes)
    gqa = Variant("tiny gqa", 1, 4, 1, 33, 16, causal=True)
    rows = variants.run_variant(gqa, "float32", providers=("flashcourse_expanded_kv", "sdpa_math"),
                                log=lambda *a: None)
    assert {r["status"] for r in rows} == {"ok"}, rows
    expanded = next(r for r in rows if r["provider"] == "flashcourse_expanded_kv")
    math_row = next(r for r in rows if r["provider"] == "sdpa_math")
    assert expanded["kv_bytes"] == 4 * math_row["kv_bytes"], "expanding K/V to 4 query heads: 4x the bytes"


def provider_fn_with_a_wrong_one(monkeypatch, wrong_rule):
    """The real providers, plus "wrong": ours with ``wrong_rule`` (kernel options) instead of the variant's."""
    real = variants.provider_fn

    def provider_fn(provider, variant, inputs):
        if provider == "wrong":
            return lambda q, k, v: kernels.flash_attention(q, k, v, **wrong_rule)
        return real(provider, variant, inputs)

    monkeypatch.setattr(variants, "provider_fn", provider_fn)


@pytest.mark.parametrize("variant", MASK_VARIANTS, ids=lambda v: v.mask_rule)
def test_mask_rule_variants_validate_on_the_cpu(monkeypatch, variant):
    """Each mask_mod variant, shrunk (its rule at size 16 on N = 48): ours per call and with a block mask built
    once pass the reference, and ours with plain causal attention instead of the rule does not (the reference
    knows the rule)."""
    monkeypatch.setattr(variants, "DEVICE", "cpu")
    monkeypatch.setattr(variants, "time_modes", fake_time_modes)
    provider_fn_with_a_wrong_one(monkeypatch, {"causal": True})
    tiny = dataclasses.replace(variant, batch=1, heads=2, heads_kv=2, n=48, head_dim=16, mask_size=16)
    rows = variants.run_variant(tiny, "float32", providers=("flashcourse", "flashcourse_block_mask", "wrong"),
                                log=lambda *a: None)
    status = {(r["provider"], r["mode"]): r["status"] for r in rows}
    assert status == {("flashcourse", "fwd"): "ok", ("flashcourse", "bwd"): "ok",
                      ("flashcourse_block_mask", "fwd"): "ok", ("flashcourse_block_mask", "bwd"): "ok",
                      ("wrong", "fwd"): "wrong", ("wrong", "bwd"): "wrong"}, rows
    for r in rows:
        assert (r["mask_rule"], r["mask_size"]) == (variant.mask_rule, 16)
        if r["provider"] != "wrong":
            assert max(r["rel_err"].values()) < 1e-4
    prebuilt = next(r for r in rows if r["provider"] == "flashcourse_block_mask")
    assert prebuilt["block_mask_build_ms"] > 0
    i = np.arange(48)
    visible = int(mask_rules.MASK_RULES[variant.mask_rule](i[:, None], i[None, :], 16).sum())
    assert rows[0]["visible_entries"] == visible * 2 and 0 < rows[0]["density"] < 1


def test_head_dim_256_rows_carry_the_head_dim_and_the_ratio_to_cudnn(monkeypatch):
    """The causal D = 256 variant, shrunk in N and heads only: our rows validate at D = 256, and after add_ratios
    carry ratio_vs_sdpa_cudnn (SDPA's math backend stands in for cuDNN on the CPU, timed twice as slow)."""
    monkeypatch.setattr(variants, "DEVICE", "cpu")
    real = variants.provider_fn

    def provider_fn(provider, variant, inputs):
        if provider == "sdpa_cudnn":
            math_backend = real("sdpa_math", variant, inputs)

            def stand_in(q, k, v):
                return math_backend(q, k, v)

            stand_in.slow = True
            return stand_in
        return real(provider, variant, inputs)

    def time_modes(fn, inputs, modes=variants.MODES):
        times = fake_time_modes(fn, inputs, modes)
        if getattr(fn, "slow", False):
            times = {m: dataclasses.replace(t, ms=2 * t.ms, ms_min=2 * t.ms_min, ms_max=2 * t.ms_max)
                     for m, t in times.items()}
        return times

    monkeypatch.setattr(variants, "provider_fn", provider_fn)
    monkeypatch.setattr(variants, "time_modes", time_modes)
    variant = next(v for v in HEAD_DIM_256 if v.causal)
    tiny = dataclasses.replace(variant, batch=1, heads=2, heads_kv=2, n=24)
    rows = variants.run_variant(tiny, "float32", providers=("flashcourse", "sdpa_cudnn"), log=lambda *a: None)
    variants.add_ratios(rows)
    assert {r["status"] for r in rows} == {"ok"}, rows
    ours = [r for r in rows if r["provider"] == "flashcourse"]
    assert [r["mode"] for r in ours] == ["fwd", "bwd"]
    for r in ours:
        assert r["head_dim"] == 256 and r["variant"] == "head_dim: 256, causal"
        assert r["ratio_vs_sdpa_cudnn"] == pytest.approx(2.0)
        assert max(r["rel_err"].values()) < 1e-4


class ForwardOnly(torch.autograd.Function):
    """Passes o through; its backward raises, as a kernel out of shared memory would."""

    @staticmethod
    def forward(ctx, o):
        return o.clone()

    @staticmethod
    def backward(ctx, grad):
        raise RuntimeError("out of resource: shared memory")


def test_a_backward_that_raises_leaves_the_forward_timed(monkeypatch):
    monkeypatch.setattr(variants, "DEVICE", "cpu")
    timed = []

    def time_modes(fn, inputs, modes=variants.MODES):
        timed.append(tuple(modes))
        return fake_time_modes(fn, inputs, modes)

    monkeypatch.setattr(variants, "time_modes", time_modes)
    real = variants.provider_fn
    monkeypatch.setattr(variants, "provider_fn", lambda provider, variant, inputs: (
        lambda q, k, v: ForwardOnly.apply(real("flashcourse", variant, inputs)(q, k, v))))
    tiny = Variant("tiny", 1, 2, 2, 24, 16, causal=True)
    rows = variants.run_variant(tiny, "float32", providers=("flashcourse",), log=lambda *a: None)
    by_mode = {r["mode"]: r for r in rows}
    assert by_mode["fwd"]["status"] == "ok" and by_mode["fwd"]["tflops"] > 0
    assert by_mode["bwd"]["status"] == "error" and "shared memory" in by_mode["bwd"]["error"]
    assert set(by_mode["fwd"]["rel_err"]) == {"o"} and timed == [("fwd",)]
