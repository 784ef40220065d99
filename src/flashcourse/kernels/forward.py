"""The forward FlashAttention kernel that serves calls, v7, and the registry of every numbered forward version.

- v7  ``_fwd_v7_kernel``: v6 plus the variant rules of ``rules.py``, each a compile-time switch: grouped-query
      attention, both causal alignments, a sliding window (tile ranges from the bounds: empty tiles skipped,
      whole visible ones unmasked), softcap, ALiBi, and documents / ``mask_mod`` through a block mask
      (``blockmask.py``). Tensor descriptors on Hopper, pointer tiles elsewhere (``USE_DESC``).

The versions before it, v1-v6, the steps lesson 07 builds v7 from, only teach: their kernels are in
``teaching/forward.py``. ``FORWARD_VERSIONS`` holds all seven by name and ``run_forward`` launches any of them.

Shapes: q (B, H, N_q, D), k and v (B, H_kv, N_kv, D) with H_kv a divisor of H, any strides; o like q;
lse (B, H, N_q) float32, natural log.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import blockmask, configs
from ._checks import dot_precision, padded_head_dim
from .common import (
    LOG2E,
    LOG2E_IN_KERNEL,
    NO_KEY_YET,
    default_scale,
    key_tile_range,
    load_tile,
    modified_scores,
    normalise_rows,
    online_softmax_update,
    store_output,
    strides,
    tma_scratch,
    visible,
)
from .dropout import Dropout, kept_weight_factor, online_softmax_update_dropped
from .dropout import kernel_args as dropout_args
from .launch import LaunchCache, layout_key, prepare_launch
from .rules import Rules, causal_rules, refuse_missing
from .stepdown import launch_fitting
from .teaching import forward as teaching
from .teaching.forward import _fwd_v5_kernel  # what v6 launches where TMA is missing
from .versions import ForwardVersion


# ------------------------------------------------------------------------------------------ v7 (rules)
@triton.jit
def _attend_tile_v7(acc, l_i, m_i, q, seed, bh, dropout_p, DROPOUT: tl.constexpr,
                    k_src, v_src, start_n, b, h, offs_m, stride_kn, stride_kd, stride_vn,
                    stride_vd, N_Q, N_KV, qk_scale, UPPER, LOWER, SHIFT, doc_ids, softcap2, slope2,
                    MASKED: tl.constexpr, HAS_UPPER: tl.constexpr, HAS_LOWER: tl.constexpr,
                    HAS_DOCS: tl.constexpr, MASK_MOD: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
                    HAS_ALIBI: tl.constexpr, SCORE_MOD: tl.constexpr, USE_DESC: tl.constexpr,
                    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
                    DOT_PRECISION: tl.constexpr):
    """Key tile [start_n, start_n + BLOCK_N) of the online softmax under the rules. MASKED=False: every score of
    the tile is visible, so no mask code runs (the scores are still capped and biased)."""
    cols = start_n + tl.arange(0, BLOCK_N)
    if USE_DESC:  # k_src, v_src: tensor descriptors (rows past N_KV come back as 0)
        k = k_src.load([start_n, 0])  # (BLOCK_N, BLOCK_D)
        v = v_src.load([start_n, 0])
    else:  # k_src, v_src: this (batch, KV head)'s base pointers
        offs_d = tl.arange(0, BLOCK_D)
        k = load_tile(k_src + cols[:, None] * stride_kn + offs_d[None, :] * stride_kd,
                      cols, N_KV, offs_d, HEAD_DIM, BLOCK_D, MASKED)
        v = load_tile(v_src + cols[:, None] * stride_vn + offs_d[None, :] * stride_vd,
                      cols, N_KV, offs_d, HEAD_DIM, BLOCK_D, MASKED)
    qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)  # (BLOCK_M, BLOCK_N), unscaled
    step_scale = qk_scale
    if SCORE_MOD:  # capped and biased scores come out already scaled, in base 2
        qk, _ = modified_scores(
            qk, q_idx=offs_m[:, None], kv_idx=cols[None, :], qk_scale=qk_scale, softcap2=softcap2, slope2=slope2,
            SHIFT=SHIFT, HAS_SOFTCAP=HAS_SOFTCAP, HAS_ALIBI=HAS_ALIBI)
        step_scale = 1.0
    if MASKED:
        ok = visible(
            b, h, q_idx=offs_m[:, None], kv_idx=cols[None, :], N_Q=N_Q, N_KV=N_KV, UPPER=UPPER, LOWER=LOWER,
            doc_ids=doc_ids, HAS_UPPER=HAS_UPPER, HAS_LOWER=HAS_LOWER, HAS_DOCS=HAS_DOCS, MASK_MOD=MASK_MOD)
        qk = tl.where(ok, qk, float("-inf"))
    if DROPOUT:  # the softmax statistics stay the undropped ones; only the weights on V are dropped and rescaled
        factor = kept_weight_factor(seed, bh, q_idx=offs_m[:, None], kv_idx=cols[None, :], N_Q=N_Q, N_KV=N_KV,
                                    dropout_p=dropout_p)
        return online_softmax_update_dropped(acc, l_i, m_i, qk, v, step_scale, factor, DOT_PRECISION)
    return online_softmax_update(acc, l_i, m_i, qk, v, step_scale, DOT_PRECISION)


@triton.jit
def _fwd_v7_kernel(
    Q, K, V, O, LSE, qk_scale,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_on, stride_od,
    H, GROUP, N_Q, N_KV,
    UPPER, LOWER, SHIFT, DOC_IDS, stride_doc_b, softcap2, ALIBI_SLOPES,
    FULL_COUNTS, FULL_TILES, PARTIAL_COUNTS, PARTIAL_TILES, B_MASK, H_MASK, TILES_PER_ROW, SEED, dropout_p,
    HAS_UPPER: tl.constexpr, HAS_LOWER: tl.constexpr, HAS_DOCS: tl.constexpr, MASK_MOD: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr, SCORE_MOD: tl.constexpr, BLOCK_SPARSE: tl.constexpr,
    DROPOUT: tl.constexpr, USE_DESC: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    pid_m = tl.program_id(0)
    if HAS_UPPER:  # causal-like: the bottom query tiles see the most keys, start them first (v5)
        pid_m = tl.num_programs(0) - 1 - pid_m
    pid_bh = tl.program_id(1)
    b = (pid_bh // H).to(tl.int64)
    h = (pid_bh % H).to(tl.int64)
    h_kv = h // GROUP  # grouped-query attention: GROUP consecutive query heads share a K/V head
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    if USE_DESC:  # Hopper: TMA copies through one 2-D (N, D) descriptor per (batch, head), as v6
        q_desc = tl.make_tensor_descriptor(Q + b * stride_qb + h * stride_qh, shape=[N_Q, HEAD_DIM],
                                           strides=[stride_qn, 1], block_shape=[BLOCK_M, BLOCK_D])
        k_src = tl.make_tensor_descriptor(K + b * stride_kb + h_kv * stride_kh, shape=[N_KV, HEAD_DIM],
                                          strides=[stride_kn, 1], block_shape=[BLOCK_N, BLOCK_D])
        v_src = tl.make_tensor_descriptor(V + b * stride_vb + h_kv * stride_vh, shape=[N_KV, HEAD_DIM],
                                          strides=[stride_vn, 1], block_shape=[BLOCK_N, BLOCK_D])
        q = q_desc.load([pid_m * BLOCK_M, 0])
    else:  # pointer tiles, as v5
        q = load_tile(Q + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qn + offs_d[None, :] * stride_qd,
                      offs_m, N_Q, offs_d, HEAD_DIM, BLOCK_D, CHECK_ROWS=True)
        k_src = K + b * stride_kb + h_kv * stride_kh
        v_src = V + b * stride_vb + h_kv * stride_vh
    doc_ids = DOC_IDS + b * stride_doc_b
    slope2 = 0.0
    if HAS_ALIBI:
        slope2 = tl.load(ALIBI_SLOPES + h) * LOG2E_IN_KERNEL
    seed = 0
    bh = b * H + h  # the dropout stream's row of heads, in int64 (its offsets pass 2**31 at N = 46341)
    if DROPOUT:
        seed = tl.load(SEED)

    m_i = tl.full([BLOCK_M], NO_KEY_YET, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    if BLOCK_SPARSE:  # documents / mask_mod: the block mask lists this query tile's full and partial key tiles
        row = ((b % B_MASK) * H_MASK + h % H_MASK) * tl.num_programs(0) + pid_m  # B_MASK, H_MASK: 1 = broadcast
        for i in range(0, tl.load(FULL_COUNTS + row)):
            start_n = tl.load(FULL_TILES + row * TILES_PER_ROW + i) * BLOCK_N
            acc, l_i, m_i = _attend_tile_v7(
                acc, l_i, m_i, q, seed=seed, bh=bh, dropout_p=dropout_p, DROPOUT=DROPOUT,
                k_src=k_src, v_src=v_src, start_n=start_n, b=b, h=h, offs_m=offs_m,
                stride_kn=stride_kn, stride_kd=stride_kd, stride_vn=stride_vn, stride_vd=stride_vd, N_Q=N_Q, N_KV=N_KV,
                qk_scale=qk_scale, UPPER=UPPER, LOWER=LOWER, SHIFT=SHIFT, doc_ids=doc_ids, softcap2=softcap2,
                slope2=slope2, MASKED=False, HAS_UPPER=HAS_UPPER, HAS_LOWER=HAS_LOWER, HAS_DOCS=HAS_DOCS,
                MASK_MOD=MASK_MOD, HAS_SOFTCAP=HAS_SOFTCAP, HAS_ALIBI=HAS_ALIBI, SCORE_MOD=SCORE_MOD, USE_DESC=USE_DESC,
                HEAD_DIM=HEAD_DIM, BLOCK_D=BLOCK_D, BLOCK_N=BLOCK_N, DOT_PRECISION=DOT_PRECISION)
        for i in range(0, tl.load(PARTIAL_COUNTS + row)):
            start_n = tl.load(PARTIAL_TILES + row * TILES_PER_ROW + i) * BLOCK_N
            acc, l_i, m_i = _attend_tile_v7(
                acc, l_i, m_i, q, seed=seed, bh=bh, dropout_p=dropout_p, DROPOUT=DROPOUT,
                k_src=k_src, v_src=v_src, start_n=start_n, b=b, h=h, offs_m=offs_m,
                stride_kn=stride_kn, stride_kd=stride_kd, stride_vn=stride_vn, stride_vd=stride_vd, N_Q=N_Q, N_KV=N_KV,
                qk_scale=qk_scale, UPPER=UPPER, LOWER=LOWER, SHIFT=SHIFT, doc_ids=doc_ids, softcap2=softcap2,
                slope2=slope2, MASKED=True, HAS_UPPER=HAS_UPPER, HAS_LOWER=HAS_LOWER, HAS_DOCS=HAS_DOCS,
                MASK_MOD=MASK_MOD, HAS_SOFTCAP=HAS_SOFTCAP, HAS_ALIBI=HAS_ALIBI, SCORE_MOD=SCORE_MOD, USE_DESC=USE_DESC,
                HEAD_DIM=HEAD_DIM, BLOCK_D=BLOCK_D, BLOCK_N=BLOCK_N, DOT_PRECISION=DOT_PRECISION)
    else:
        # Key tiles from the bounds alone: keys [lo, hi) reach some row of this tile; the tiles inside
        # [full_lo, full_hi) are whole and visible to every row (no mask), the ones around them are masked.
        first_row = pid_m * BLOCK_M
        lo, hi, full_lo, full_hi = key_tile_range(
            first_row, last_row=tl.minimum(first_row + BLOCK_M, N_Q) - 1, N_KV=N_KV, UPPER=UPPER, LOWER=LOWER,
            HAS_UPPER=HAS_UPPER, HAS_LOWER=HAS_LOWER, BLOCK_N=BLOCK_N)
        if HAS_LOWER:  # the window's left edge
            for start_n in range(lo, full_lo, BLOCK_N):
                acc, l_i, m_i = _attend_tile_v7(
                    acc, l_i, m_i, q, seed=seed, bh=bh, dropout_p=dropout_p, DROPOUT=DROPOUT,
                    k_src=k_src, v_src=v_src, start_n=start_n, b=b, h=h, offs_m=offs_m,
                    stride_kn=stride_kn, stride_kd=stride_kd, stride_vn=stride_vn, stride_vd=stride_vd, N_Q=N_Q,
                    N_KV=N_KV, qk_scale=qk_scale, UPPER=UPPER, LOWER=LOWER, SHIFT=SHIFT, doc_ids=doc_ids,
                    softcap2=softcap2, slope2=slope2, MASKED=True, HAS_UPPER=HAS_UPPER, HAS_LOWER=HAS_LOWER,
                    HAS_DOCS=HAS_DOCS, MASK_MOD=MASK_MOD, HAS_SOFTCAP=HAS_SOFTCAP, HAS_ALIBI=HAS_ALIBI,
                    SCORE_MOD=SCORE_MOD, USE_DESC=USE_DESC, HEAD_DIM=HEAD_DIM, BLOCK_D=BLOCK_D, BLOCK_N=BLOCK_N,
                    DOT_PRECISION=DOT_PRECISION)
        for start_n in range(full_lo, full_hi, BLOCK_N):
            acc, l_i, m_i = _attend_tile_v7(
                acc, l_i, m_i, q, seed=seed, bh=bh, dropout_p=dropout_p, DROPOUT=DROPOUT,
                k_src=k_src, v_src=v_src, start_n=start_n, b=b, h=h, offs_m=offs_m,
                stride_kn=stride_kn, stride_kd=stride_kd, stride_vn=stride_vn, stride_vd=stride_vd, N_Q=N_Q, N_KV=N_KV,
                qk_scale=qk_scale, UPPER=UPPER, LOWER=LOWER, SHIFT=SHIFT, doc_ids=doc_ids, softcap2=softcap2,
                slope2=slope2, MASKED=False, HAS_UPPER=HAS_UPPER, HAS_LOWER=HAS_LOWER, HAS_DOCS=HAS_DOCS,
                MASK_MOD=MASK_MOD, HAS_SOFTCAP=HAS_SOFTCAP, HAS_ALIBI=HAS_ALIBI, SCORE_MOD=SCORE_MOD, USE_DESC=USE_DESC,
                HEAD_DIM=HEAD_DIM, BLOCK_D=BLOCK_D, BLOCK_N=BLOCK_N, DOT_PRECISION=DOT_PRECISION)
        # The diagonal / right edge and the tail tile past the last whole one.
        for start_n in range(full_hi, hi, BLOCK_N):
            acc, l_i, m_i = _attend_tile_v7(
                acc, l_i, m_i, q, seed=seed, bh=bh, dropout_p=dropout_p, DROPOUT=DROPOUT,
                k_src=k_src, v_src=v_src, start_n=start_n, b=b, h=h, offs_m=offs_m,
                stride_kn=stride_kn, stride_kd=stride_kd, stride_vn=stride_vn, stride_vd=stride_vd, N_Q=N_Q, N_KV=N_KV,
                qk_scale=qk_scale, UPPER=UPPER, LOWER=LOWER, SHIFT=SHIFT, doc_ids=doc_ids, softcap2=softcap2,
                slope2=slope2, MASKED=True, HAS_UPPER=HAS_UPPER, HAS_LOWER=HAS_LOWER, HAS_DOCS=HAS_DOCS,
                MASK_MOD=MASK_MOD, HAS_SOFTCAP=HAS_SOFTCAP, HAS_ALIBI=HAS_ALIBI, SCORE_MOD=SCORE_MOD, USE_DESC=USE_DESC,
                HEAD_DIM=HEAD_DIM, BLOCK_D=BLOCK_D, BLOCK_N=BLOCK_N, DOT_PRECISION=DOT_PRECISION)

    o, lse = normalise_rows(acc, l_i, m_i)
    store_output(
        O, LSE, o, lse, pid_bh=pid_bh, offs_m=offs_m, offs_d=offs_d, o_base=b * stride_ob + h * stride_oh,
        stride_on=stride_on, stride_od=stride_od, N_Q=N_Q, HEAD_DIM=HEAD_DIM)


# ------------------------------------------------------------------------------------------ launching
def descriptors_usable(props: configs.DeviceProps, *tensors: torch.Tensor) -> bool:
    """TMA needs Hopper (the interpreter emulates it), a unit stride in the last dim, 16-byte aligned rows."""
    if not (configs.supports_tensor_descriptors(props) or props.interpreter):
        return False
    for t in tensors:
        es = t.element_size()
        if t.stride(3) != 1 or any((s * es) % 16 for s in t.stride()[:3]) or t.data_ptr() % 16:
            return False
    return True


def check_forward_launch(version: ForwardVersion, config: configs.KernelConfig, *, causal: bool) -> None:
    """A launch that breaks the kernel's own rule is an error, never a silently wrong output."""
    if causal and version.splits_causal_keys and config.block_m % config.block_n:
        raise ValueError(
            f"forward {version.name} with causal=True splits each row's keys at a query-tile edge, so BLOCK_M "
            f"({config.block_m}) must be a multiple of BLOCK_N ({config.block_n}): use e.g. "
            f"KernelConfig({config.block_m}, {min(config.block_m, config.block_n)}, ...)"
        )


def launch_candidates(version: ForwardVersion, props: configs.DeviceProps, block_d: int, elem_bytes: int,
                      rules: Rules, block_mask: blockmask.BlockMask | None, q, k) -> tuple[configs.KernelConfig, ...]:
    """The launches a version takes for these rules, best first."""
    if not version.tuned_launch:
        return configs.baseline_forward_candidates(props, block_d, elem_bytes)
    if not version.takes_rules:  # v3-v6 mask every diagonal tile: under causal, small tiles waste less
        return configs.forward_candidates(props, block_d, elem_bytes, causal=rules.causal is not None)
    # v7 skips empty tiles and runs full ones unmasked, so the dense launch serves causal; small tiles win where
    # many visited tiles are partial: a window's edges (the 2026-11-30 sweeps), short documents, sparse rules.
    dense = configs.forward_config(props, block_d, elem_bytes)
    masked = rules.window is not None or blockmask.many_partial_tiles(rules, block_mask, q, k, dense.block_m,
                                                                      dense.block_n)
    return configs.forward_candidates(props, block_d, elem_bytes, causal=masked)


def run_forward(version: ForwardVersion, q, k, v, *, causal=False, scale: float | None,
                config: configs.KernelConfig | None = None, rules: Rules | None = None,
                block_mask: blockmask.BlockMask | None = None, record: list | None = None,
                dropout: Dropout | None = None):
    """Launch one forward version on checked inputs; returns (o, lse). ``config`` overrides the launch;
    ``rules`` (from ``rules.parse_rules``), when given, replaces ``causal``; ``block_mask`` (checked against the
    call) gives v7 its tile lists instead of building them. ``record``: a list that gets the launch prepared to
    repeat on other tensors of this layout (``launch.prepare_launch``), where the compiled kernel allows it and
    the rules hold no tensor (a plan keeps it: ``plan.py``). ``dropout``: the probability and seed of
    ``dropout.py``, v7 only (the other versions refuse it)."""
    batch, heads, n_q, head_dim = q.shape
    n_kv = k.shape[2]
    rules = causal_rules(causal) if rules is None else rules
    o = torch.empty_like(q)
    lse = torch.empty((batch, heads, n_q), device=q.device, dtype=torch.float32)
    if batch * heads * n_q == 0:
        return o, lse
    if dropout is not None and not version.takes_rules:
        refuse_missing("forward", version.name, DEFAULT_FORWARD, "dropout (dropout_p)")
    key = None if dropout is not None else _launch_key(version, rules, scale, config, q, k, v)
    if version.needs_descriptors and key is not None:
        triton.set_allocator(tma_scratch(q.device))  # Triton's allocator is per thread: set it on every call
    remembered = _LAUNCHES.get(key)
    if remembered is not None:
        remembered((q, k, v, o, lse))
        if record is not None:
            record.append(remembered)
        return o, lse
    if not version.takes_rules:
        refuse_missing("forward", version.name, DEFAULT_FORWARD,
                       rules.missing_in_numbered_version(k.shape[1] != heads, n_q, n_kv))
    scale = default_scale(head_dim, scale)
    block_d = padded_head_dim(head_dim)
    props = configs.device_props(q.device)
    candidates = (config,) if config is not None else launch_candidates(version, props, block_d, q.element_size(),
                                                                         rules, block_mask, q, k)
    use_descriptors = version.needs_descriptors and descriptors_usable(props, q, k, v)
    if use_descriptors:
        triton.set_allocator(tma_scratch(q.device))

    def launch_with(config: configs.KernelConfig) -> None:
        check_forward_launch(version, config, causal=rules.causal is not None)
        launch = dict(
            Q=q, K=k, V=v, O=o, **strides(q, "q"), **strides(k, "k"), **strides(v, "v"), **strides(o, "o"),
            N_Q=n_q, N_KV=n_kv, HEAD_DIM=head_dim, BLOCK_D=block_d, BLOCK_M=config.block_m,
            BLOCK_N=config.block_n, DOT_PRECISION=dot_precision(q.dtype), num_warps=config.num_warps,
            num_stages=config.num_stages,
        )
        grid = (triton.cdiv(n_q, config.block_m), batch * heads)
        if version.takes_rules:
            lists = blockmask.call_lists(rules, block_mask, q, k, config.block_m, config.block_n, by_key=False)
            kernel = version.kernel
            launch.update(LSE=lse, qk_scale=scale * LOG2E, H=heads, GROUP=heads // k.shape[1],
                          **blockmask.rule_args(rules, q, k), **lists, **dropout_args(dropout, q),
                          USE_DESC=use_descriptors)
        else:
            kernel = _fwd_v5_kernel if version.needs_descriptors and not use_descriptors else version.kernel
            scale_arg = {"qk_scale": scale * LOG2E} if version.base2 else {"scale": scale}
            launch.update(LSE=lse, **scale_arg, H=heads, CAUSAL=rules.causal is not None)
        compiled = kernel[grid](**launch)
        _LAUNCHES.remember(key, kernel, compiled, grid, launch, PER_CALL_TENSORS)
        if record is not None and rules.alibi_slopes is None and not rules.needs_block_mask and dropout is None:
            prepared = prepare_launch(kernel, compiled, grid, launch, PER_CALL_TENSORS)
            if prepared is not None:
                record.append(prepared)

    launch_fitting(("forward", version.name, props, block_d, q.dtype, candidates), candidates, launch_with,
                   f"forward {version.name} at head dim {head_dim}")
    return o, lse


# Forward launches by layout and options, for calls that repeat a shape (launch.py says why).
_LAUNCHES = LaunchCache()
PER_CALL_TENSORS = ("Q", "K", "V", "O", "LSE")  # what changes from call to call, in a prepared launch's order


def _launch_key(version: ForwardVersion, rules: Rules, scale, config, q, k, v):
    """The cache key of a launch, or None when the call must take the full path: an explicit config, the
    interpreter, or a rule that brings tensors of its own (ALiBi slopes, documents, a block mask)."""
    if config is not None or q.device.type != "cuda" or rules.alibi_slopes is not None or rules.needs_block_mask:
        return None
    return version.name, rules.causal, rules.window, rules.softcap, scale, layout_key(q, k, v)


FORWARD_VERSIONS: dict[str, ForwardVersion] = {
    v.name: v
    for v in [
        *teaching.VERSIONS,
        ForwardVersion("v7", "rules: GQA, causal alignment, window, softcap, ALiBi, documents, mask_mod",
                       "v6 with every variant as a compile-time switch: tile ranges from the causal/window bounds "
                       "(empty tiles skipped, full ones unmasked), a block mask for documents and mask_mod, "
                       "K/V head h // (H_q / H_kv), capped and biased scores",
                       "dense: same as v6 (every switch off compiles to v6's loops); window (1024, 0) at N=16K: "
                       "time proportional to the visible tiles, >= 80% of dense causal TFLOP/s over visible "
                       "entries; GQA as fast as K/V expanded to every head",
                       _fwd_v7_kernel, tuned_launch=True, base2=True, splits_causal_keys=False,
                       needs_descriptors=True, takes_rules=True),
    ]
}
DEFAULT_FORWARD = "v7"  # supports every option; with none it compiles to v6's work (docs/KERNELS.md)
