"""The kernels at their edges, whatever the host checked: paged decoding never reads outside the cache, and finite
scores far below -1e30 are keys in every kernel that starts its running max at -inf.

test_edges.py holds the same cases through the public entry points, where the host refuses a bad block table; here
that check is bypassed (a serving loop rewrites its table every step, after the plan was made), so the kernel alone
stands between a bad page and memory that is not the cache. Each CPU test failed on the kernels before these fixes
(the commit that adds a test says how), but those that call themselves guards; the tests marked ``gpu`` run the
Hopper kernels and the compiled versions, which cannot run here."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from flashcourse import device

device.setup()

import triton  # noqa: E402
import triton.language as tl  # noqa: E402  (in scope of every jit function, the mask_mods below too)

from flashcourse import kernels, reference  # noqa: E402
from flashcourse.kernels import _checks, decode, forward  # noqa: E402
from flashcourse.tolerance import assert_close  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
NUM_PAGES, PAGE_SIZE, PAGES_PER_ROW = 6, 16, 3


def randn(rng, *shape, dtype=torch.float32):
    return torch.tensor(rng.standard_normal(shape), dtype=dtype, device=DEVICE)


# ------------------------------------------------------------------------------------------ paged decode
def paged_cache(rng, *, d=16):
    """Two sequences of three pages of 16 keys each, in a cache of six pages; q (2, 4, d): two query heads a KV
    head."""
    k, v = (randn(rng, NUM_PAGES, 2, PAGE_SIZE, d) for _ in range(2))
    table = torch.arange(NUM_PAGES, dtype=torch.int32, device=DEVICE).reshape(2, PAGES_PER_ROW)
    return randn(rng, 2, 4, d), k, v, table


def decode_over_cache_pages(q, k_cache, v_cache, table, lengths) -> np.ndarray:
    """float64 attention of each sequence's query heads over the keys of its first ``lengths[b]`` positions that lie
    on pages of the cache: a page outside it contributes nothing."""
    q, k_cache, v_cache = (t.double().cpu().numpy() for t in (q, k_cache, v_cache))
    batch, h_q, _ = q.shape
    group = h_q // k_cache.shape[1]
    out = np.zeros(q.shape)
    for b in range(batch):
        positions = [p for p in range(lengths[b]) if 0 <= int(table[b, p // PAGE_SIZE]) < k_cache.shape[0]]
        pages = [int(table[b, p // PAGE_SIZE]) for p in positions]
        rows = [p % PAGE_SIZE for p in positions]
        for h in range(h_q):
            keys = k_cache[pages, h // group, rows]  # (keys, d)
            values = v_cache[pages, h // group, rows]
            out[b, h] = reference.attention(q[b, h][None], keys, values)[0]
    return out


@pytest.fixture
def unchecked_tables(monkeypatch):
    """flash_decode without its host check of the block table: what a plan made for an earlier, valid table runs."""
    monkeypatch.setattr(_checks, "check_pages", lambda *args, **kwargs: None)


@pytest.mark.parametrize("bad_page", [-1, NUM_PAGES, 10**6, -(2**31)])
@pytest.mark.parametrize(("block_n", "num_splits", "mask_tail_only"), [
    (16, 1, False),  # a tile inside one page, one split (the kernel writes o itself)
    (32, 2, False),  # a tile over two pages, two splits and the combine kernel
    (16, 2, True),  # whole tiles without load masks (as for a keys-adjacent V), the tail apart
    (32, 1, True),
])
def test_pages_outside_the_cache_contribute_nothing(rng, unchecked_tables, bad_page, block_n, num_splits,
                                                    mask_tail_only):
    """A table entry outside 0 .. num_blocks - 1 is never dereferenced: its address is page 0's and its keys are
    masked, so the answer is the float64 one over the sequence's other pages (the kernel once read outside the
    cache there: -1 gave garbage, a page past the cache NaN, 10**6 killed the process)."""
    q, k, v, table = paged_cache(rng)
    table[1, 1] = bad_page
    lengths = [48, 40]  # sequence 1 reaches into its third page: keys on both sides of the bad one
    o = kernels.flash_decode(q, k, v, block_table=table, cache_seqlens=torch.tensor(lengths, dtype=torch.int32),
                             block_n=block_n, num_splits=num_splits,
                             switches=decode.DecodeSwitches(mask_tail_only=mask_tail_only))
    assert_close(o, decode_over_cache_pages(q, k, v, table, lengths),
                 what=f"decode with block_table[1, 1] = {bad_page}")


def test_a_sequence_of_only_bad_pages_gives_zero(rng, unchecked_tables):
    """Every page of a sequence outside the cache: no key, so o = 0 (the rule for a row with no key), never NaN."""
    q, k, v, table = paged_cache(rng)
    table[0] = torch.tensor([-5, NUM_PAGES, 10**9], dtype=torch.int32)
    o = kernels.flash_decode(q, k, v, block_table=table, num_splits=2)
    assert torch.equal(o[0], torch.zeros_like(o[0])), "a sequence with no page of the cache attends to nothing"
    assert_close(o[1], decode_over_cache_pages(q, k, v, table, [48, 48])[1], what="the other sequence")


def test_a_length_past_the_table_reads_no_slot_past_it(rng, monkeypatch):
    """A length past max_blocks * page_size is clamped in the kernel: a table that is a slice of a wider one (its
    next column a valid page of another sequence) is never read past its last column. A guard: the kernel already
    clamped lengths; this holds it."""
    monkeypatch.setattr(_checks, "check_lengths", lambda *args, **kwargs: None)
    q, k, v, _ = paged_cache(rng)
    wide = torch.tensor([[0, 1, 2, 5], [3, 4, 5, 0]], dtype=torch.int32, device=DEVICE)
    table = wide[:, :PAGES_PER_ROW]  # strides (4, 1): slot 3 lies right after each row's last slot
    o = kernels.flash_decode(q, k, v, block_table=table, cache_seqlens=torch.tensor([64, 1000], dtype=torch.int32),
                             num_splits=2)
    assert_close(o, decode_over_cache_pages(q, k, v, table, [48, 48]), what="decode with lengths past the table")


@pytest.mark.parametrize("num_splits", [1, 2])
def test_a_negative_fp8_k_scale_is_a_scale(rng, num_splits):
    """True K = k8 * k_scale for any finite scale: a negative one flips every score of its (sequence, KV head). The
    running max took max(qk) * qk_scale for the largest score, the smallest under a negative scale (the answer was
    NaN); the sign now goes to q."""
    q, k, v = randn(rng, 2, 4, 16) * 3, randn(rng, 2, 2, 40, 16), randn(rng, 2, 2, 40, 16)
    k8, v8, k_scale, v_scale = kernels.quantize_kv_cache(k, v)
    k_scale = k_scale * torch.tensor([[1.0, -1.0], [-1.0, 1.0]], device=DEVICE)
    o = kernels.flash_decode(q, k8, v8, k_scale=k_scale, v_scale=v_scale, num_splits=num_splits)
    true_k = (k8.double() * k_scale.double()[:, :, None, None]).repeat_interleave(2, dim=1)
    true_v = (v8.double() * v_scale.double()[:, :, None, None]).repeat_interleave(2, dim=1)
    want = torch.softmax((true_k @ q.double()[..., None]).squeeze(-1) / 4.0, -1)[:, :, None, :] @ true_v
    assert_close(o, want.squeeze(2), what="decode with negative k_scale")


@pytest.mark.parametrize("num_splits", [1, 2])
@pytest.mark.parametrize("zero", [0.0, -0.0, 1e-45])
def test_a_zero_fp8_k_scale_gives_uniform_weights(rng, num_splits, zero):
    """k_scale 0 makes every score 0 (true K = k8 * 0): the weights are uniform over the sequence's keys. The
    kernel multiplied the masked scores' -inf by 0 (NaN, for every row of that KV head); a scale that rounds to 0
    in the exponent's factor (1e-45, a float32 subnormal) did the same."""
    q, k, v = randn(rng, 2, 4, 16) * 3, randn(rng, 2, 2, 40, 16), randn(rng, 2, 2, 40, 16)
    k8, v8, k_scale, v_scale = kernels.quantize_kv_cache(k, v)
    k_scale[0, 1] = zero
    lengths = [40, 13]  # the second sequence's tail is masked: -inf scores beside the zero ones
    o = kernels.flash_decode(q, k8, v8, k_scale=k_scale, v_scale=v_scale, cache_seqlens=lengths,
                             num_splits=num_splits)
    true_k = (k8.double() * k_scale.double()[:, :, None, None]).repeat_interleave(2, dim=1)
    true_v = (v8.double() * v_scale.double()[:, :, None, None]).repeat_interleave(2, dim=1)
    for b, n in enumerate(lengths):
        weights = torch.softmax(true_k[b, :, :n] @ q[b].double()[:, :, None] / 4.0, dim=1)  # (H_q, n, 1)
        assert_close(o[b], (weights * true_v[b, :, :n]).sum(1), what=f"decode with k_scale {zero}, sequence {b}")


def fp8_kernel_inputs(rng, causal):
    """16-bit q, k, v for the FP8 forward's kernel (the interpreter runs it so, as test_fp8.py does) and the
    float64 answer for descales (B = 1, H_kv = 2): true X = x * x_descale."""
    from flashcourse.kernels import fp8
    from flashcourse.kernels.rules import parse_rules

    q, k, v = (randn(rng, 1, 2, 20, 64).to(torch.float16) for _ in range(3))

    def run(q_descale, k_descale, v_descale):
        o, lse = fp8.run_fp8_forward(q, k, v, q_descale, k_descale, v_descale, out_dtype=torch.float16,
                                     rules=parse_rules(q, k, causal=causal))
        true = [x.double() * d.double()[:, :, None, None] for x, d in ((q, q_descale), (k, k_descale),
                                                                         (v, v_descale))]
        s = true[0] @ true[1].transpose(-1, -2) / 8.0
        if causal:
            s = s.masked_fill(torch.ones(20, 20, dtype=torch.bool, device=DEVICE).triu(1), float("-inf"))
        return o, lse, torch.softmax(s, -1) @ true[2], torch.logsumexp(s, -1)

    return run


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("descales", ["k negative", "q negative", "mixed signs", "k zero", "q -0.0"])
def test_fp8_forward_descales_of_any_sign(rng, causal, descales):
    """True q.k = q8.k8 * q_descale * k_descale for any finite descales: a negative product flips every score of
    its (batch, KV head), a zero one makes them all 0 (uniform weights). The kernel's running max took
    max(qk) * qk_scale, the smallest scaled score under a negative factor, and 0 * -inf for masked keys under a
    zero one: NaN for every row of that head."""
    run = fp8_kernel_inputs(rng, causal)
    one = torch.ones(1, 2, device=DEVICE)
    factors = {"k negative": (one, -one), "q negative": (-2 * one, one),
               "mixed signs": (one, torch.tensor([[1.0, -0.5]], device=DEVICE)),
               "k zero": (one, torch.tensor([[0.0, 1.0]], device=DEVICE)),
               "q -0.0": (torch.tensor([[1.0, -0.0]], device=DEVICE), one)}[descales]
    o, lse, want_o, want_lse = run(*factors, one)
    assert_close(o, want_o, dtype="float16", what=f"FP8 forward with descales {descales}, causal={causal}")
    assert_close(lse, want_lse, dtype="float16", what=f"FP8 forward lse with descales {descales}")


@pytest.mark.gpu
@pytest.mark.skipif(not (torch.cuda.is_available() and torch.cuda.get_device_capability() >= (9, 0)),
                    reason="needs a GPU of compute capability 9.0 or newer (FP8 tensor cores)")
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("use_descriptors", [None, False])  # TMA where usable, and pointer tiles
def test_gpu_fp8_forward_descales_of_any_sign(rng, causal, use_descriptors):
    """The same in float8_e4m3fn on a Hopper GPU, where q's sign flip is a conversion to e4m3: a negative k descale
    gives exactly what the positive one gives with k's values negated (the same products), and a zero one
    uniform weights over the visible keys."""
    from flashcourse.kernels import fp8

    x = fp8.quantize_fp8(randn(rng, 2, 4, 300, 128), randn(rng, 2, 2, 300, 128), randn(rng, 2, 2, 300, 128))
    sign = torch.tensor([[1.0, -1.0], [-1.0, 0.0]], device="cuda")  # per (batch, KV head)
    o, _ = fp8.flash_attention_forward_fp8(x.q, x.k, x.v, q_descale=x.q_descale, k_descale=x.k_descale * sign,
                                           v_descale=x.v_descale, causal=causal, use_descriptors=use_descriptors)
    flipped_k = (x.k.float() * torch.where(sign < 0, -1.0, 1.0)[:, :, None, None]).to(x.k.dtype)  # exact in e4m3
    want, _ = fp8.flash_attention_forward_fp8(x.q, flipped_k, x.v, q_descale=x.q_descale, k_descale=x.k_descale,
                                              v_descale=x.v_descale, causal=causal, use_descriptors=use_descriptors)
    assert torch.equal(o[0], want[0]) and torch.equal(o[1, :2], want[1, :2]), "negative descales: k negated"
    true_v = x.v[1, 1].double() * x.v_descale[1, 1].double()  # (N, D): the zero head's values
    counts = torch.arange(1, 301, device="cuda", dtype=torch.float64)[:, None]
    uniform = true_v.cumsum(0) / counts if causal else true_v.mean(0, keepdim=True).expand(300, -1)
    torch.testing.assert_close(o[1, 2:].double(), uniform.expand(2, -1, -1), atol=0.05, rtol=0.05)


# ------------------------------------------------------------------------------------------ the starting max
def far_below_minus_1e30(rng, n_q=5, n_kv=37, d=16):
    """q . k * scale about -4e30 for every pair, finite: the softmax is uniform, o is the mean of v, and the lse is
    the score plus log(n_kv)."""
    q = torch.full((1, 2, n_q, d), 1e15, device=DEVICE)
    k = torch.full((1, 2, n_kv, d), -1e15, device=DEVICE)
    return q, k, randn(rng, 1, 2, n_kv, d)


@pytest.mark.parametrize("version", ["v2", "v3", "v5", "v6"])
@pytest.mark.parametrize("causal", [False, True])
def test_teaching_versions_take_far_negative_scores_for_keys(rng, version, causal):
    """v2-v6 start their running max at -inf, as v7 (from -1e30 they gave o = 0 and lse = -inf for these rows)."""
    q, k, v = far_below_minus_1e30(rng, n_q=37)
    o, lse = forward.run_forward(forward.FORWARD_VERSIONS[version], q, k, v, causal=causal, scale=0.25)
    n_keys = torch.arange(1.0, 38.0, dtype=torch.float64, device=DEVICE)  # keys row i sees: i + 1, or all 37
    n_keys = n_keys if causal else torch.full_like(n_keys, 37.0)
    mean_v = v.double().cumsum(2) / n_keys[:, None] if causal else v.double().mean(2, keepdim=True).expand(o.shape)
    assert_close(o, mean_v, what=f"{version} (causal={causal}) with scores near -4e30")
    score = 0.25 * 16 * -1e30  # q . k = 16 * 1e15 * -1e15
    assert_close(lse, (score + n_keys.log()).expand(lse.shape), dtype="float32", what=f"{version} lse")


def test_v1_keeps_its_documented_limit(rng):
    """v1 starts at -1e30 on purpose (lesson 07 says why, and where it breaks): rows whose scores all lie below it
    are taken for rows with no key. A guard on what the lesson shows: if v1 changes, the lesson must too."""
    q, k, v = far_below_minus_1e30(rng)
    o, lse = forward.run_forward(forward.FORWARD_VERSIONS["v1"], q, k, v, causal=False, scale=0.25)
    assert torch.equal(o, torch.zeros_like(o)) and torch.isneginf(lse).all()


def test_fp8_forward_takes_far_negative_scores_for_keys(rng):
    """The FP8 forward's kernel (run with 16-bit values, as test_fp8.py does in the interpreter), where descales
    of 1e17 carry the scores below -1e30: its running max starts at -inf too."""
    from flashcourse.kernels import fp8
    from flashcourse.kernels.rules import parse_rules

    q = torch.ones(1, 2, 20, 64, dtype=torch.float16, device=DEVICE)
    k = -torch.ones(1, 2, 20, 64, dtype=torch.float16, device=DEVICE)
    v = randn(rng, 1, 2, 20, 64).to(torch.float16)
    huge = torch.full((1, 2), 1e17, device=DEVICE)
    ones = torch.ones(1, 2, device=DEVICE)
    o, lse = fp8.run_fp8_forward(q, k, v, huge, huge, ones, rules=parse_rules(q, k, causal=False),
                                 out_dtype=torch.float16)
    assert_close(o, v.double().mean(2, keepdim=True).expand(o.shape), what="FP8 forward, scores near -8e35")
    assert torch.isfinite(lse).all(), "a row with keys has a finite lse"


def test_every_teaching_version_gives_zero_and_minus_inf_without_keys(rng):
    """N_kv = 0 (a row that sees no key) in every forward version: o = 0 and lse = -inf, never NaN. A guard: it
    held before the starting max changed, and must hold after."""
    q, k = randn(rng, 1, 2, 5, 16), randn(rng, 1, 2, 0, 16)
    for name, version in forward.FORWARD_VERSIONS.items():
        o, lse = forward.run_forward(version, q, k, k, causal=False, scale=None)
        assert torch.equal(o, torch.zeros_like(o)) and torch.isneginf(lse).all(), name


# ------------------------------------------------------------------------------------------ Hopper (GPU only)
def on_hopper() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


needs_hopper = pytest.mark.skipif(not on_hopper(), reason="needs a Hopper GPU (sm_90: H100, H200)")


def bf16_far_below_minus_1e30(rng, n_q, n_kv, d):
    """bf16 q of entries 1e15 against k of -1e15: every score about -d * 1e30 / sqrt(d), finite and equal."""
    q = torch.full((1, 2, n_q, d), 1e15, dtype=torch.bfloat16, device="cuda")
    k = torch.full((1, 2, n_kv, d), -1e15, dtype=torch.bfloat16, device="cuda")
    v = torch.tensor(rng.standard_normal((1, 2, n_kv, d)), dtype=torch.bfloat16, device="cuda")
    return q, k, v


def float64_forward(q, k, v, causal):
    """(o, lse) in float64 with torch, differentiable; causal top-left."""
    q, k, v = (t.double() for t in (q, k, v))
    s = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).triu(1), float("-inf"))
    return torch.softmax(s, -1) @ v, torch.logsumexp(s, -1)


# Why compiled kernels fail where the interpreter passes (it rounds s * c before subtracting): the residual is the
# same for every key of a row, so it cancels in o = acc / l until 2^r overflows, at |s * c| near 2^31.
FMA_RESIDUAL = ("Each takes exp2(s * c - m) as one FMA, whose result for the row's own max is the rounding error of "
                "s * c, up to half an ulp of 1e31 (about 5e23), not 0: 2^(+-5e23) is inf or 0 whatever the starting "
                "max. Scores this large need the scaled score rounded before the subtraction (no FMA), at a cost not "
                "yet measured")


def hopper_stages() -> list[tuple[str, int]]:
    """(stage, head dim) for every v8 / v9 stage and head dim it takes (the module compiles nothing on import)."""
    from flashcourse.kernels.hopper import fa3

    return [(name, d) for name, stage in {**fa3.STAGES, **fa3.FA4_STAGES}.items() for d in stage.head_dims]


@pytest.mark.gpu
@needs_hopper
@pytest.mark.xfail(strict=True, reason="measured on an H100 (2026-12-06): every v8/v9 stage gave o = 0 or NaN here. "
                   + FMA_RESIDUAL)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(("stage", "d"), hopper_stages())
def test_gpu_hopper_stages_take_far_negative_scores_for_keys(rng, stage, d, causal):
    """Every v8 / v9 stage at each head dim it takes: scores near -1e31 (bf16 q of 1e15 against k of -1e15) give
    the float64 answer, the mean of v (from a -1e30 starting max they gave o = 0 and lse = -inf)."""
    from flashcourse.kernels.hopper import fa3

    q, k, v = bf16_far_below_minus_1e30(rng, 200, 256, d)
    o, lse = fa3.fa3_forward(q, k, v, causal=causal, stage=stage)
    want_o, want_lse = float64_forward(q, k, v, causal)
    assert_close(o, want_o, what=f"{stage} at D = {d} (causal={causal}), scores near -1e31")
    assert_close(lse, want_lse, dtype="float32", what=f"{stage} lse at D = {d}")


@pytest.mark.gpu
@needs_hopper
@pytest.mark.xfail(strict=True, reason="its (o, lse) come from v8's forward, which fails at these scores (the test "
                   "above: the exponent's FMA residual)")
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [64, 128])
def test_gpu_b6_backward_after_far_negative_scores(rng, causal, d):
    """b6's gradients from v8's (o, lse) at scores near -1e31: dV = P^T dO is the float64 one, and dQ, dK are
    finite (an lse of -inf from the forward made every P infinite). dQ and dK are not compared: with every key
    equal, dQ is a sum of terms near 1e14 that cancel to 0, below what bf16 resolves."""
    from flashcourse.kernels.hopper import fa3, fa3_backward

    q, k, v = bf16_far_below_minus_1e30(rng, 200, 256, d)
    o, lse = fa3.fa3_forward(q, k, v, causal=causal)
    do = torch.tensor(rng.standard_normal(o.shape), dtype=torch.bfloat16, device="cuda")
    leaves = [t.double().requires_grad_() for t in (q, k, v)]
    want, _ = float64_forward(*leaves, causal)
    want_dv = torch.autograd.grad(want, leaves[2], do.double())[0]
    for stage in fa3_backward.STAGES:
        dq, dk, dv = fa3_backward.fa3_backward(q, k, v, o, lse, do, causal=causal, stage=stage)
        assert torch.isfinite(dq).all() and torch.isfinite(dk).all(), f"{stage}: dq, dk finite"
        assert_close(dv, want_dv, what=f"{stage} dv at D = {d} (causal={causal}), scores near -1e31")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("version", ["v1", *(pytest.param(name, marks=pytest.mark.xfail(
    strict=True, reason="measured on an H100 (2026-12-06): o = 0 or NaN, as the v8/v9 stages. " + FMA_RESIDUAL))
    for name in ("v2", "v3", "v5", "v6", "v7"))])
def test_gpu_forward_versions_at_far_negative_scores(rng, version):
    """The compiled Triton versions (bf16 tl.dot is wrong in the interpreter): v2-v7 should give the mean of v
    (they do in the interpreter, the test above), v1 its documented o = 0 (lesson 07)."""
    q, k, v = bf16_far_below_minus_1e30(rng, 100, 130, 64)
    o, lse = forward.run_forward(forward.FORWARD_VERSIONS[version], q, k, v, causal=False, scale=None)
    if version == "v1":
        assert torch.equal(o, torch.zeros_like(o)) and torch.isneginf(lse).all()
    else:
        want_o, want_lse = float64_forward(q, k, v, False)
        assert_close(o, want_o, what=f"{version}, scores near -1e31")
        assert_close(lse, want_lse, dtype="float32", what=f"{version} lse")


# ------------------------------------------------------------------------------------------ found, not fixed
@pytest.mark.xfail(strict=True, reason="the backward rebuilds P = exp(s - lse) from a float32 lse, which cannot hold "
                   "log(l) beside a row max near 4e8 (its spacing there is 32): each P comes out 1, not 1/20")
def test_gradients_at_scores_near_4e8(rng):
    """Scores near 4e8, all equal (a huge scale, or large q and k): the forward is right (it keeps m and l apart),
    but lse = m + log(l) rounds to m in float32, so the backward's P is 1 for every key and dV is 20 times too large.
    FlashAttention-2's backward (Algorithm 2 of the paper: P = exp(S - L)) rebuilds P the same way. Fixing it means
    saving m and log(l) apart for every backward (b1-b6, the ring's merge); then this test passes and its xfail
    goes."""
    q = torch.full((1, 2, 20, 16), 1e4, device=DEVICE, requires_grad=True)
    k = torch.full((1, 2, 20, 16), 1e4, device=DEVICE, requires_grad=True)
    v = randn(rng, 1, 2, 20, 16).requires_grad_()
    o = kernels.flash_attention(q, k, v, scale=0.25)
    do = randn(rng, *o.shape)
    dv = torch.autograd.grad(o, v, do)[0]
    assert_close(dv, do.double().sum(2, keepdim=True).expand(dv.shape) / 20, what="dV = P^T dO with P = 1/20")


# ------------------------------------------------------------------------------------------ mask_mod's answer
# Causal written three ways: as a comparison (bool), as an int tile of 0 and 2, and as a float tile.
@triton.jit
def causal_as_bool(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


@triton.jit
def causal_as_int(b, h, q_idx, kv_idx):
    return (q_idx >= kv_idx).to(tl.int32) * 2


@triton.jit
def causal_as_float(b, h, q_idx, kv_idx):
    return (q_idx >= kv_idx).to(tl.float32)


def test_a_mask_mod_must_answer_in_booleans(rng):
    """The kernels AND a mask_mod's answer into the mask bitwise: an int tile of 0 and 2 hid every key (error
    2.8, where its truth is causal), a float one failed with "invalid operands of type float32". Both are now one
    error at compile time that says what to return (an InterpreterError here, a CompilationError on a GPU); the
    reference refuses them too."""
    q, k, v = (randn(rng, 1, 2, 20, 16) for _ in range(3))
    o = kernels.flash_attention(q, k, v, mask_mod=causal_as_bool)
    causal = torch.ones(20, 20, dtype=torch.bool, device=DEVICE).tril()
    s = (q.double() @ k.double().transpose(-1, -2) / 4).masked_fill(~causal, float("-inf"))
    assert_close(o, torch.softmax(s, -1) @ v.double(), what="mask_mod as a comparison")
    for mask_mod in (causal_as_int, causal_as_float):
        with pytest.raises(Exception, match="mask_mod returned a tile that is not boolean"):
            kernels.flash_attention(q, k, v, mask_mod=mask_mod)
