"""GPU benchmark of the attention variants (lesson 11): our default kernels against FlexAttention and SDPA.

For every variant shape and dtype: each provider is first validated (forward and gradients) against a float32
reference built from the rule, on batch 0 and a few heads at the full length; a provider that fails or raises is
recorded with its error and the run goes on (one whose backward alone fails, in its backward row: its forward is
still timed); then every valid provider is timed, forward and backward.
Providers: ``flashcourse`` (our default kernels, each call building its own tile lists where the rule needs a block
mask), ``flashcourse_block_mask`` (the same kernels with a block mask from ``kernels.create_block_mask`` built once,
outside the timed region, in 128 x 128 sparse blocks as Flex's; each kernel's lists derived from it on the
first, untimed call; only for variants that need one), ``flex`` (``torch.nn.attention.flex_attention``
compiled with ``torch.compile``, its block mask from ``create_block_mask`` built outside the timed region; the
first call, which compiles, is timed apart as ``compile_s``), SDPA's flash and cuDNN backends where SDPA can express the
variant (causal; GQA with ``enable_gqa=True``), and ``flashcourse_expanded_kv`` for GQA: ours on K/V copied out
to every query head, the baseline that GQA support must beat while holding H_q / H_kv times fewer K/V bytes.

The ``mask_mod:`` variants are rules of positions, as FlexAttention writes them: each is one plain Python function
of ``bench.mask_rules``, read by every side (our kernels get it wrapped in ``@triton.jit``, Flex's ``mask_mod`` and
the float32 reference call it on torch tensors), so that none of them can drift from the others.

TFLOP/s count only the visible score entries (:func:`visible_entries`): forward 4 * D FLOPs per visible entry
(Q K^T and P V), backward 2.5x that, as ``bench.attention_flops`` does for the dense and causal cases. Every time
is the median of ``bench.REPEATS`` timings with their range (``ms_min``, ``ms_max``, ``tflops_min``, ``tflops_max``).
A block mask built ahead (ours and Flex's) has its build timed apart, warm, wall clock to the last kernel's end:
``block_mask_build_ms`` (median of ``bench.REPEATS`` builds) with ``_min`` and ``_max``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np

from flashcourse.bench import BACKWARD_OVER_FORWARD, Timing, environment_info, load_results, time_repeats
from flashcourse.bench.providers import add_ratios as shared_add_ratios

DTYPES = ("float16", "bfloat16")
PROVIDERS = ("flashcourse", "flashcourse_block_mask", "flex", "sdpa_flash", "sdpa_cudnn", "flashcourse_expanded_kv")
OURS = ("flashcourse", "flashcourse_block_mask")  # each gets ratio_vs_<provider> against every other provider
VALID_REL_ERR = 2e-2  # relative error (norm) of o and of every gradient against the float32 reference
DEVICE = "cuda"  # the tests run the validation path on "cpu" (tiny shapes, the Triton interpreter)
MODES = ("fwd", "bwd")


@dataclass(frozen=True)
class Variant:
    """One benchmark shape and its rule: causal, a (left, 0) window, a softcap, packed documents, GQA, a rule
    of ``bench.mask_rules`` (a ``mask_mod``)."""

    name: str
    batch: int
    heads: int
    heads_kv: int
    n: int
    head_dim: int
    causal: bool = False
    window_left: int | None = None  # window (left, 0): the last left + 1 keys up to the query's own position
    softcap: float | None = None
    documents: int = 0  # documents of random lengths packed into each row (0: none)
    mask_rule: str | None = None  # a key of mask_rules.MASK_RULES: the rule, passed as a mask_mod
    mask_size: int = 0  # the rule's size argument

    @property
    def group(self) -> int:
        return self.heads // self.heads_kv

    @property
    def needs_block_mask(self) -> bool:
        """Documents and mask rules are classified tile by tile (a block mask); causal and windows from their
        bounds."""
        return self.documents > 0 or self.mask_rule is not None

    @property
    def sdpa_can(self) -> bool:
        """SDPA has is_causal and enable_gqa, but no window, document, mask-rule or softcap argument."""
        return self.window_left is None and self.softcap is None and not self.needs_block_mask


VARIANTS = (
    Variant("causal", 4, 16, 16, 16384, 128, causal=True),
    Variant("window 1024", 4, 16, 16, 16384, 128, window_left=1024),
    Variant("window 4096", 4, 16, 16, 16384, 128, window_left=4096),
    Variant("8 documents, causal", 4, 16, 16, 16384, 128, causal=True, documents=8),
    Variant("GQA 32/8, causal", 2, 32, 8, 8192, 128, causal=True),
    Variant("softcap 30, causal", 4, 16, 16, 16384, 128, causal=True, softcap=30.0),
    Variant("mask_mod: prefix-LM", 4, 16, 16, 16384, 128, mask_rule="prefix-LM", mask_size=1024),
    Variant("mask_mod: chunked local", 4, 16, 16, 16384, 128, mask_rule="chunked local", mask_size=1024),
    Variant("mask_mod: stripes", 4, 16, 16, 16384, 128, mask_rule="stripes", mask_size=256),
    # D = 256 at N = 8192: half the FLOPs of N = 16384 at D = 128 (a quarter of the entries, twice the work
    # each), which keeps the run short; the same bytes of Q, K and V
    Variant("head_dim: 256", 4, 16, 16, 8192, 256),
    Variant("head_dim: 256, causal", 4, 16, 16, 8192, 256, causal=True),
)


def document_lengths(n: int, documents: int, rng: np.random.Generator) -> np.ndarray:
    """``documents`` random lengths, each at least 1, summing to n (cuts drawn uniformly without repeats)."""
    cuts = np.sort(rng.choice(np.arange(1, n), size=documents - 1, replace=False))
    return np.diff(np.concatenate(([0], cuts, [n])))


def document_ids(variant: Variant, seed: int = 0) -> np.ndarray | None:
    """(B, N) int32 ids, an independent random packing per batch row; None without documents."""
    if not variant.documents:
        return None
    rng = np.random.default_rng(seed)
    rows = [np.repeat(np.arange(variant.documents), document_lengths(variant.n, variant.documents, rng))
            for _ in range(variant.batch)]
    return np.stack(rows).astype(np.int32)


def visible_entries(variant: Variant, ids: np.ndarray | None = None) -> int:
    """Score entries some query sees, over the whole batch and every head, counted row by row as the keys
    [lo, hi] each query sees. ``ids`` (B, N): sorted document ids (contiguous runs, as :func:`document_ids`).
    A mask rule has no such bounds: its entries are counted from the rule itself, on ``DEVICE``, in slices of
    query rows (the same for every batch row and head)."""
    if variant.mask_rule is not None:
        import torch

        step = 1024  # (1024, N) at a time: the rule's int64 intermediates stay at 128 MiB for N = 16K
        seen = sum(int(visible_rows(variant, torch.arange(start, min(start + step, variant.n), device=DEVICE))
                       .sum()) for start in range(0, variant.n, step))
        return seen * variant.batch * variant.heads
    i = np.arange(variant.n, dtype=np.int64)
    lo = np.zeros_like(i)
    hi = np.full_like(i, variant.n - 1)
    if variant.causal or variant.window_left is not None:  # the windows here are (left, 0): causal too
        hi = i
    if variant.window_left is not None:
        lo = np.maximum(0, i - variant.window_left)
    if ids is None:
        return int((hi - lo + 1).sum()) * variant.batch * variant.heads
    total = 0
    for row in ids:  # a query sees only its own document's run of positions
        starts = np.searchsorted(row, row, side="left")
        ends = np.searchsorted(row, row, side="right") - 1
        total += int(np.clip(np.minimum(hi, ends) - np.maximum(lo, starts) + 1, 0, None).sum())
    return total * variant.heads


def variant_flops(variant: Variant, visible: int, mode: str) -> float:
    """Matmul FLOPs over the visible entries: 2 * D per entry for Q K^T and as many for P V."""
    forward = 4.0 * variant.head_dim * visible
    return forward * (BACKWARD_OVER_FORWARD if mode == "bwd" else 1.0)


# ------------------------------------------------------------------------------------------ providers (GPU)
@dataclass
class Inputs:
    q: object
    k: object
    v: object
    do: object
    ids: object = None  # (B, N) int32 on the GPU, or None


def make_inputs(variant: Variant, dtype: str, seed: int = 0) -> Inputs:
    import torch

    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    torch_dtype = getattr(torch, dtype)

    def randn(heads):
        return torch.randn(variant.batch, heads, variant.n, variant.head_dim, device=DEVICE, dtype=torch_dtype,
                           generator=gen)

    ids = document_ids(variant, seed)
    return Inputs(randn(variant.heads), randn(variant.heads_kv), randn(variant.heads_kv), randn(variant.heads),
                  None if ids is None else torch.tensor(ids, device=DEVICE))


def _wall_ms(fn: Callable[[], object], _grad_to_none=None) -> float:
    """Milliseconds of one call, host and device: from a synchronised start to its last kernel's end."""
    import torch

    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    sync()
    start = time.perf_counter()
    fn()
    sync()
    return (time.perf_counter() - start) * 1e3


def build_timing(build: Callable[[], object]) -> Timing:
    """A block mask's build time: one build to warm up (it compiles), then ``bench.REPEATS`` timed builds."""
    build()
    return time_repeats(build, timer=_wall_ms)


def timed_build(build: Callable[[], object]) -> tuple[object, Timing]:
    """(the block mask, the timing of its build): what a provider builds outside the timed region."""
    return build(), build_timing(build)


def ours(variant: Variant, inputs: Inputs, *, expand_kv: bool = False, prebuilt_mask: bool = False) -> Callable:
    """fn(q, k, v) -> o with our default kernels and the variant's options. ``expand_kv``: K/V copied out to
    every query head on each call, as a model without GQA support does (the copy is in its time, and small:
    it moves the K/V bytes once, the attention reads them N / BLOCK_M times). ``prebuilt_mask``: the block mask
    built here, once, and passed to every call; its build time is the function's ``block_mask_build``."""
    from flashcourse import kernels
    from flashcourse.bench import mask_rules

    options = {"causal": variant.causal, "softcap": variant.softcap, "document_ids": inputs.ids,
               "window": None if variant.window_left is None else (variant.window_left, 0),
               "mask_mod": None if variant.mask_rule is None else mask_rules.triton_mask_mod(variant.mask_rule,
                                                                                             variant.mask_size),
               "enable_gqa": variant.group > 1}
    if prebuilt_mask:
        mask_options = {name: options.pop(name) for name in ("causal", "document_ids", "window")}
        mask_mod = options.pop("mask_mod")  # the rules read neither b nor h: one map for every row and head
        block_mask, timing = timed_build(lambda: kernels.create_block_mask(
            mask_mod, None, None, variant.n, variant.n, **mask_options, device=inputs.q.device))

        def attend(q, k, v):
            return kernels.flash_attention(q, k, v, block_mask=block_mask, **options)

        attend.block_mask_build = timing
        return attend
    if expand_kv:
        group = variant.group
        return lambda q, k, v: kernels.flash_attention(q, k.repeat_interleave(group, dim=1),
                                                       v.repeat_interleave(group, dim=1), **options)
    return lambda q, k, v: kernels.flash_attention(q, k, v, **options)


def flex_mask_mod(variant: Variant, ids) -> Callable | None:
    """The variant's rule as FlexAttention's mask_mod(b, h, q_idx, kv_idx) (None: every key visible)."""
    left = variant.window_left
    if variant.mask_rule is not None:
        from flashcourse.bench.mask_rules import MASK_RULES

        rule, size = MASK_RULES[variant.mask_rule], variant.mask_size
        return lambda b, h, q_idx, kv_idx: rule(q_idx, kv_idx, size)
    if ids is not None:
        return lambda b, h, q_idx, kv_idx: (ids[b, q_idx] == ids[b, kv_idx]) & (q_idx >= kv_idx)
    if left is not None:
        return lambda b, h, q_idx, kv_idx: (q_idx >= kv_idx) & (q_idx - kv_idx <= left)
    if variant.causal:
        return lambda b, h, q_idx, kv_idx: q_idx >= kv_idx
    return None


def flex(variant: Variant, inputs: Inputs) -> Callable:
    """fn(q, k, v) -> o: compiled flex_attention, its block mask built here (outside any timed region)."""
    import torch
    import torch._functorch.config  # not loaded by `import torch` alone (torch 2.11): its flag is set below
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    mask_mod = flex_mask_mod(variant, inputs.ids)
    block_mask = timing = None
    if mask_mod is not None:
        batch = variant.batch if inputs.ids is not None else None  # only documents differ per batch row
        block_mask, timing = timed_build(
            lambda: create_block_mask(mask_mod, batch, None, variant.n, variant.n, device=DEVICE))
    score_mod = None
    if variant.softcap is not None:
        cap = variant.softcap

        def score_mod(score, b, h, q_idx, kv_idx):
            return cap * torch.tanh(score / cap)

    # The backward is timed by replaying one kept graph (retain_graph=True, as for every provider), which a
    # compiled backward that donates its saved buffers refuses.
    torch._functorch.config.donated_buffer = False
    compiled = torch.compile(flex_attention, dynamic=False)  # one compiled graph per variant, dtype, grad mode

    def attend(q, k, v):
        return compiled(q, k, v, score_mod=score_mod, block_mask=block_mask, enable_gqa=variant.group > 1)

    if timing is not None:
        attend.block_mask_build = timing
    return attend


def provider_fn(provider: str, variant: Variant, inputs: Inputs) -> Callable:
    from flashcourse.bench.providers import sdpa

    if provider == "flashcourse":
        return ours(variant, inputs)
    if provider == "flashcourse_expanded_kv":
        return ours(variant, inputs, expand_kv=True)
    if provider == "flashcourse_block_mask":
        return ours(variant, inputs, prebuilt_mask=True)
    if provider == "flex":
        return flex(variant, inputs)
    attend = sdpa(provider, enable_gqa=variant.group > 1)
    return lambda q, k, v: attend(q, k, v, variant.causal)


def providers_for(variant: Variant, wanted=PROVIDERS) -> list[str]:
    """The providers that can run a variant: SDPA only where it has the rule, the expanded-K/V run only for GQA,
    the prebuilt block mask only where the rule needs one."""
    chosen = []
    for p in wanted:
        if p.startswith("sdpa") and not variant.sdpa_can:
            continue
        if p == "flashcourse_expanded_kv" and variant.group == 1:
            continue
        if p == "flashcourse_block_mask" and not variant.needs_block_mask:
            continue
        chosen.append(p)
    return chosen


# ------------------------------------------------------------------------------------------ validate, time
def visible_rows(variant: Variant, rows, ids_row=None):
    """(len(rows), N) bool on rows' device: the keys each query of ``rows`` (int64 positions) sees, from the
    rule. ``ids_row`` (N,): one batch row's document ids, or None."""
    import torch

    from flashcourse.bench.mask_rules import MASK_RULES

    i = rows[:, None]
    j = torch.arange(variant.n, device=rows.device)[None, :]
    keep = torch.ones(len(rows), variant.n, dtype=torch.bool, device=rows.device)
    if variant.causal or variant.window_left is not None:
        keep &= j <= i
    if variant.window_left is not None:
        keep &= j >= i - variant.window_left
    if ids_row is not None:
        keep &= ids_row[rows][:, None] == ids_row[None, :]
    if variant.mask_rule is not None:
        keep &= MASK_RULES[variant.mask_rule](i, j, variant.mask_size)
    return keep


def visible_mask(variant: Variant, ids, batch_index: int):
    """(N, N) bool on ``DEVICE`` for one batch row, from the rule."""
    import torch

    return visible_rows(variant, torch.arange(variant.n, device=DEVICE),
                        None if ids is None else ids[batch_index])


def reference_slice(variant: Variant, inputs: Inputs, kv_heads: int):
    """Float32 o and gradients for batch 0, the first ``kv_heads`` K/V heads and their query heads, one query
    head at a time (an N x N float32 score matrix is 1 GiB at N=16K)."""
    import torch

    q_heads = kv_heads * variant.group
    q, k, v = (t[:1, :h].detach().float().requires_grad_() for t, h in
               ((inputs.q, q_heads), (inputs.k, kv_heads), (inputs.v, kv_heads)))
    do = inputs.do[:1, :q_heads].float()
    keep = visible_mask(variant, inputs.ids, 0)
    outputs = []
    for h in range(q_heads):
        s = (q[0, h] @ k[0, h // variant.group].T) / math.sqrt(variant.head_dim)
        if variant.softcap is not None:
            s = variant.softcap * torch.tanh(s / variant.softcap)
        o_h = torch.softmax(s.masked_fill(~keep, float("-inf")), dim=-1) @ v[0, h // variant.group]
        (o_h * do[0, h]).sum().backward()
        outputs.append(o_h.detach())
    return torch.stack(outputs)[None], (q.grad, k.grad, v.grad)


def relative_errors(variant: Variant, inputs: Inputs, fn: Callable, reference) -> tuple[dict, str | None]:
    """Relative errors of o and, where the backward runs, of dq, dk, dv on the reference's slice (the provider
    runs on the whole input); and the backward's error, or None. A backward that raises (a kernel out of shared
    memory at D = 256, say) leaves the forward checked, so that its forward is still timed."""
    import torch

    q, k, v = (t.detach().requires_grad_() for t in (inputs.q, inputs.k, inputs.v))
    o = fn(q, k, v)
    o_ref, grads_ref = reference
    q_heads, kv_heads = o_ref.shape[1], grads_ref[1].shape[1]

    def rel(a, b):
        return float((a.detach().float() - b).norm() / b.norm())

    errors = {"o": rel(o[:1, :q_heads], o_ref)}
    try:
        grads = torch.autograd.grad(o, (q, k, v), inputs.do)
    except Exception as err:  # noqa: BLE001 - a backward that cannot run is a result
        return errors, _error_text(err)
    errors.update(dq=rel(grads[0][:1, :q_heads], grads_ref[0]), dk=rel(grads[1][:1, :kv_heads], grads_ref[1]),
                  dv=rel(grads[2][:1, :kv_heads], grads_ref[2]))
    return errors, None


def time_modes(fn: Callable, inputs: Inputs, modes=MODES) -> dict[str, Timing]:
    """The forward (no autograd) and the backward alone (autograd.grad of a kept graph), those of ``modes``,
    each timed ``bench.REPEATS`` times: median ms and range."""
    import torch

    from flashcourse.bench.attention import bench_timing

    q, k, v = (t.detach().requires_grad_() for t in (inputs.q, inputs.k, inputs.v))
    times = {}
    if "fwd" in modes:
        with torch.no_grad():
            times["fwd"] = bench_timing(lambda: fn(q, k, v))
    if "bwd" in modes:
        o = fn(q, k, v)
        times["bwd"] = bench_timing(lambda: torch.autograd.grad(o, (q, k, v), inputs.do, retain_graph=True))
    return times


def failed_modes(errors: dict, backward_error: str | None) -> dict[str, dict]:
    """The modes a provider may not be timed in, each with its row's status and error: the forward needs o
    within ``VALID_REL_ERR``, the backward o and every gradient."""
    def wrong(names):
        return not all(math.isfinite(errors[n]) and errors[n] < VALID_REL_ERR for n in names)

    failed = {}
    if wrong(["o"]):
        failed["fwd"] = {"status": "wrong", "error": f"relative errors {errors} over {VALID_REL_ERR}"}
    if backward_error is not None:
        failed["bwd"] = {"status": "error", "error": backward_error}
    elif wrong(["o", "dq", "dk", "dv"]):
        failed["bwd"] = {"status": "wrong", "error": f"relative errors {errors} over {VALID_REL_ERR}"}
    return failed


def _error_text(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0][:300] if text else ''}"


def run_variant(variant: Variant, dtype: str, providers=PROVIDERS, log=print) -> list[dict]:
    """Validate every provider on one variant and dtype, then time the valid ones: rows per (provider, mode)."""
    import torch

    inputs = make_inputs(variant, dtype)
    ids = None if inputs.ids is None else inputs.ids.cpu().numpy()
    visible = visible_entries(variant, ids)
    base = {"variant": variant.name, "dtype": dtype, **asdict(variant), "visible_entries": visible,
            "density": visible / (variant.batch * variant.heads * variant.n ** 2)}
    reference = reference_slice(variant, inputs, kv_heads=max(1, 2 // variant.group))
    ready, rows = {}, []
    for provider in providers_for(variant, providers):
        row = {**base, "provider": provider}
        try:
            start = time.perf_counter()
            fn = provider_fn(provider, variant, inputs)
            errors, backward_error = relative_errors(variant, inputs, fn, reference)  # the first call: compiles
            if inputs.q.is_cuda:
                torch.cuda.synchronize()
            row.update(compile_s=time.perf_counter() - start, rel_err=errors)
            build = getattr(fn, "block_mask_build", None)  # built outside the timed region: its cost apart
            if build is not None:
                row.update(block_mask_build_ms=build.ms, block_mask_build_ms_min=build.ms_min,
                           block_mask_build_ms_max=build.ms_max)
            failed = failed_modes(errors, backward_error)
        except Exception as err:  # noqa: BLE001 - a provider that cannot run this variant is a result
            failed = {mode: {"status": "error", "error": _error_text(err)} for mode in MODES}
        log(f"validate {variant.name} {dtype} {provider}: {row.get('rel_err')} "
            + " ".join(f"{mode}: {f['error']}" for mode, f in failed.items()))
        rows += [{**row, "mode": mode, **f} for mode, f in failed.items()]
        modes = [mode for mode in MODES if mode not in failed]
        if modes:
            ready[provider] = (fn, row, modes)
        torch.cuda.empty_cache()
    for fn, row, modes in ready.values():
        try:
            times = time_modes(fn, inputs, modes)
            rows += [{**row, "mode": mode, "status": "ok", **times[mode].fields(variant_flops(variant, visible, mode))}
                     for mode in modes]
        except Exception as err:  # noqa: BLE001
            rows += [{**row, "mode": mode, "status": "error", "error": _error_text(err)} for mode in modes]
        torch.cuda.empty_cache()
    kv_bytes = 2 * inputs.k.numel() * inputs.k.element_size()
    for r in rows:  # K/V bytes each provider reads: the GQA saving
        r["kv_bytes"] = kv_bytes * (variant.group if r["provider"] == "flashcourse_expanded_kv" else 1)
    return rows


def add_ratios(rows: list[dict]) -> None:
    """Our rows get ratio_vs_<provider> per (variant, dtype, mode) (the per-call and the prebuilt block mask
    against each other too), and window rows ``vs_our_causal``: their TFLOP/s over our dense causal TFLOP/s at
    the same N (the target is >= 0.8 for window 1024)."""
    for mine in OURS:
        shared_add_ratios(rows, rate="tflops", ours=(mine,), key=lambda r: (r["variant"], r["dtype"], r["mode"]))
    causal = {(r["dtype"], r["mode"], r["n"]): r for r in rows
              if r["provider"] == "flashcourse" and r["variant"] == "causal" and r.get("status") == "ok"}
    for r in rows:
        key = (r["dtype"], r["mode"], r["n"])
        if r["provider"] == "flashcourse" and r.get("window_left") is not None and r.get("status") == "ok" \
                and key in causal:
            dense = causal[key]
            r["vs_our_causal"] = r["tflops"] / dense["tflops"]
            if all(x.get(f"tflops_{end}") for x in (r, dense) for end in ("min", "max")):
                r["vs_our_causal_min"] = r["tflops_min"] / dense["tflops_max"]
                r["vs_our_causal_max"] = r["tflops_max"] / dense["tflops_min"]


def merge_rows(old: list[dict], new: list[dict]) -> list[dict]:
    """Rows of an earlier run of the same day and device (another dtype, other variants) kept, the same
    (variant, dtype, provider, mode) replaced by the new measurement."""
    def key(r):
        return r["variant"], r["dtype"], r["provider"], r["mode"]

    replaced = {key(r) for r in new}
    return [r for r in old if key(r) not in replaced] + new


def earlier_rows_today(directory) -> list[dict]:
    """The rows of today's variants file for this device in ``directory`` (none yet: an empty list)."""
    meta = environment_info()
    for found in reversed(load_results("*-variants.json", directory=directory)):
        if found["meta"].get("date") == meta["date"] and found["meta"].get("device") == meta["device"]:
            return found["rows"]
    return []


def format_table(rows: list[dict]) -> str:
    """One line per (variant, dtype, mode): TFLOP/s over visible entries of every provider, our ratios."""
    providers = [p for p in PROVIDERS if any(r["provider"] == p for r in rows)]
    lines = [f"{'variant':25}{'dtype':>9}{'mode':>5}{'density':>8}" + "".join(f"{p[:14]:>15}" for p in providers)
             + "   ours/flex  ours/expanded  vs our causal"]
    groups: dict = {}
    for r in rows:
        groups.setdefault((r["variant"], r["dtype"], r["mode"]), {})[r["provider"]] = r
    for (variant, dtype, mode), group in groups.items():
        any_row = next(iter(group.values()))
        cells = "".join(f"{group[p]['tflops']:15.1f}" if group.get(p, {}).get("status") == "ok"
                        else f"{group.get(p, {}).get('status', '-'):>15}" for p in providers)
        mine = group.get("flashcourse", {})
        extras = "".join(f"{mine[k]:{w}.2f}" if k in mine else f"{'-':>{w}}" for k, w in
                         (("ratio_vs_flex", 12), ("ratio_vs_flashcourse_expanded_kv", 15), ("vs_our_causal", 15)))
        lines.append(f"{variant:25}{dtype:>9}{mode:>5}{any_row['density']:8.3f}{cells}{extras}")
    return "\n".join(lines)


def allow_flex_recompiles(limit: int = 64) -> None:
    """Each variant and dtype compiles flex_attention anew (other closures, shapes): past dynamo's default
    limit of 8 it would silently fall back to eager FlexAttention, so the limit is raised for this run."""
    import torch._dynamo

    for name in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit",
                 "accumulated_cache_size_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, max(limit, getattr(torch._dynamo.config, name)))


def run(dtypes=DTYPES, names=None, providers=PROVIDERS, log=print, on_variant=None) -> list[dict]:
    """Every variant (or those named) in every dtype; ``on_variant(rows)`` after each (saves partial runs)."""
    from flashcourse.bench.attention import warm_up_gpu

    unknown = sorted(set(names or ()) - {v.name for v in VARIANTS})
    if unknown:  # a misspelt name would otherwise measure nothing, silently
        raise ValueError(f"no variant named {unknown}: the variants are {[v.name for v in VARIANTS]}")
    allow_flex_recompiles()
    warm_up_gpu()
    rows: list[dict] = []
    for variant in VARIANTS:
        if names and variant.name not in names:
            continue
        for dtype in dtypes:
            rows += run_variant(variant, dtype, providers, log=log)
            add_ratios(rows)
            log(format_table([r for r in rows if r["variant"] == variant.name and r["dtype"] == dtype]))
            if on_variant:
                on_variant(rows)
    return rows
