"""The course's Triton kernels: FlashAttention forward and backward, and split-KV decoding.

Public API (torch tensors; q (B, H_q, N_q, D), k and v (B, H_kv, N_kv, D), H_kv = H_q or, with
``enable_gqa=True``, a divisor of it; any strides; any head dim D from 8 to 256)::

    flash_attention(q, k, v, *, causal=False, scale=None, window=None, softcap=None, alibi_slopes=None,
                    document_ids=None, mask_mod=None, block_mask=None, enable_gqa=False, is_causal=None,
                    return_lse=False) -> o, or (o, lse)                       # differentiable; is_causal: SDPA's
    explain(q, k, v, **<the same options>) -> Route        # which forward and backward kernels run, and why
    flash_attention_forward(q, k, v, *, <same options>) -> (o, lse)                # lse (B, H_q, N_q) float32
    flash_attention_forward(q8, k8, v8, *, q_descale=None, k_descale=None, v_descale=None,
                            out_dtype=torch.bfloat16, causal=False, scale=None) -> (o, lse)  # FP8, sm_90+
    flash_attention_backward(q, k, v, o, lse, do, *, <same options>) -> (dq, dk, dv)
    create_block_mask(mask_mod, B, H, N_q, N_kv, *, document_ids=None, causal=False, window=None,
                      BLOCK_SIZE=128, device=None) -> BlockMask   # pass as block_mask=, reuse every step
    flash_decode(q, k_cache, v_cache, *, cache_seqlens=None, block_table=None, scale=None,
                 num_splits=None, window=None, softcap=None, alibi_slopes=None) -> o  # q (B, H_q, D)

The options (``rules.py`` says exactly what each means): ``causal`` False | True (= "top_left") | "top_left" |
"bottom_right"; ``window=(left, right)``, -1 unbounded; ``softcap``; ``alibi_slopes`` (H_q,) float32;
``document_ids`` (B, N) integer; ``mask_mod`` a ``@triton.jit`` (b, h, q_idx, kv_idx) -> bool. All combine by
AND. Documents and ``mask_mod`` need a block mask (which tiles are empty, partial or full): each call builds its
own (a ``mask_mod``'s is kept for later calls of those shapes), or ``create_block_mask`` builds one ahead. Every
numbered version stays runnable (``FORWARD_VERSIONS``, ``BACKWARD_VERSIONS``); the versions without rules, v1-v6
and b1, b2, b4, b5, know only plain and top-left causal attention and refuse the rest by name. The version
history with measurements is ``docs/KERNELS.md``. Without a GPU the kernels run in Triton's interpreter on CPU
tensors.

Layout: the modules of this package serve calls (v7 and b3, b1 for dense calls, decoding, FP8, block masks, the
rules, the plan of a call, the ``torch.library`` ops); ``teaching/`` holds what only teaches (forward v1-v6, the
dQ schemes b2, b4, b5); ``hopper/`` holds the Gluon kernels for sm_90 (v8, b6). On Hopper with a tested Triton
the default forward is the kernel measured fastest for the call's head dim, causality and length, mostly a Gluon
stage (``plan.FORWARD_BANDS``), where a call fits it, imported only then; ``explain(q, k, v, **options)`` says
which kernels a call runs and why (``plan.py``).
"""

from flashcourse import device as _device

_device.require_triton()  # a clear ImportError on macOS/Windows, before `import triton` fails obscurely
_device.setup()  # must run before any @triton.jit below: the interpreter is chosen at decoration time
if _device.setup() == "cpu":
    from ._interpreter_compat import apply as _apply_interpreter_compat

    _apply_interpreter_compat()

import torch  # noqa: E402

# Some names are here for other modules and lessons to import (kernels.run_forward, kernels.padded_head_dim...).
from . import backward, call, configs, forward, fp8, ops  # noqa: E402, F401
from ._checks import check_head_dim, check_qkv, check_saved, padded_head_dim  # noqa: E402, F401
from .backward import BACKWARD_VERSIONS, DEFAULT_BACKWARD, run_backward  # noqa: E402, F401
from .blockmask import BlockMask  # noqa: E402
from .decode import DecodeSwitches, Fp8KVCache  # noqa: E402
from .dropout import draw_seed, dropout_mask, seed_tensor  # noqa: E402, F401
from .forward import DEFAULT_FORWARD, FORWARD_VERSIONS, run_forward  # noqa: E402, F401
from .plan import Route  # noqa: E402
from .rules import parse_mask_rules  # noqa: E402

__all__ = [
    "BACKWARD_VERSIONS",
    "BlockMask",
    "DEFAULT_BACKWARD",
    "DEFAULT_FORWARD",
    "FORWARD_VERSIONS",
    "configs",
    "create_block_mask",
    "explain",
    "flash_attention",
    "flash_attention_backward",
    "flash_attention_forward",
    "flash_decode",
    "fp8",
    "quantize_kv_cache",
]


def create_block_mask(mask_mod, B: int | None, H: int | None, N_q: int, N_kv: int, *, document_ids=None,
                      causal=False, window=None, BLOCK_SIZE: int | tuple[int, int] = 128,
                      device=None) -> BlockMask:
    """Classify a mask rule once, in sparse blocks of 128 x 128, for every call of these shapes.

    FlexAttention's ``create_block_mask(mask_mod, B, H, Q_LEN, KV_LEN, BLOCK_SIZE=128)`` for our rules (Dong et
    al. 2024): pass the result as ``flash_attention(q, k, v, block_mask=bm)`` (or to ``flash_attention_forward``
    / ``_backward``), and the forward, the backward and every later training step take their tile lists from it
    instead of classifying tiles again (a call without one classifies its own tiles, the backward twice: dK/dV
    by key tile, dQ by query tile; a ``mask_mod``'s lists are then kept for later calls, documents' are not).
    The call takes its mask options from the block mask; it may repeat them, but the same. Build a new one when
    the shapes or the rule change.

    The mask does not depend on the head dim, the dtype or the GPU. It records one kind per sparse block of
    ``BLOCK_SIZE`` (empty: no query of the block sees a key of it; full: every one does; else partial). A kernel
    whose tiles are another size derives its lists from these blocks on first use and keeps them: a tile is full
    where every block under it is full, empty where every one is empty, partial (it runs the mask code) otherwise.
    The lists are always correct; a kernel tile smaller than a block, inside a partial block, is run as partial
    even where it is full or empty, as FlexAttention's kernels do with the sub-blocks of a 128-wide block. A
    smaller ``BLOCK_SIZE`` classifies finer and skips more such tiles, for a larger map.

    Args:
        mask_mod: None or a ``@triton.jit`` function ``mask_mod(b, h, q_idx, kv_idx) -> bool``, as for
            :func:`flash_attention`.
        B: the batch size, or None for a mask that is the same on every batch row (``mask_mod`` is then
            classified at b = 0); with ``document_ids``, None means their batch.
        H: the number of query heads, or None for a mask that is the same on every head (classified at h = 0).
            Only a ``mask_mod`` sees the head: without one, the blocks are shared by every head either way.
        N_q, N_kv: the numbers of queries and keys.
        document_ids: None or a (B, N) int32/int64 tensor on ``device``, N = N_q = N_kv, as for
            :func:`flash_attention`.
        causal, window: as for :func:`flash_attention`; they narrow the blocks too. A block mask needs
            ``document_ids`` or ``mask_mod`` (causal and window alone are classified inside the kernels).
        BLOCK_SIZE: the sparse block, an int (square) or (query rows, key columns): powers of two from 16 to
            256; 128 (default) as FlexAttention.
        device: where the calls run; None (default) means document_ids' device, else the GPU, or the CPU (the
            interpreter) on a machine without one.

    Returns:
        A :class:`BlockMask` (a frozen dataclass). Its repr shows the shape, the rules, how many sparse blocks
        are full, partial and empty (``sparsity``: the share of empty ones, never loaded), and the same for each
        kernel tile size derived so far.

    A call with other shapes (B, H, N_q, N_kv, where not None), another device or other mask options raises a
    ValueError that names the difference. Under ``torch.compile`` a call with ``block_mask`` runs eagerly, a
    graph break (a Python object fits no op schema), so ``fullgraph=True`` raises for it.

    Example::

        @triton.jit
        def prefix_lm(b, h, q_idx, kv_idx):  # the first 256 positions see each other, the rest are causal
            return (kv_idx <= q_idx) | (kv_idx < 256)

        bm = create_block_mask(prefix_lm, None, None, 4096, 4096, device="cuda")
        print(bm)  # the sparse blocks: full / partial / empty, sparsity
        for step in range(steps):
            o = flash_attention(q, k, v, block_mask=bm)  # q (B, H, 4096, D), any D and dtype; nothing reclassified
            o.sum().backward()
    """
    for name, value in (("B", B), ("H", H), ("N_q", N_q), ("N_kv", N_kv)):
        if (value is not None or name.startswith("N")) and (
                not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise ValueError(f"{name} is {value!r}: expected an int >= 1"
                             + (" or None (the same mask for every one)" if name in ("B", "H") else ""))
    block_size = (BLOCK_SIZE, BLOCK_SIZE) if isinstance(BLOCK_SIZE, int) else BLOCK_SIZE
    if not (isinstance(block_size, tuple) and len(block_size) == 2 and all(
            isinstance(s, int) and not isinstance(s, bool) and s in (16, 32, 64, 128, 256) for s in block_size)):
        raise ValueError(f"BLOCK_SIZE is {BLOCK_SIZE!r}: expected a power of two from 16 to 256, or a (rows, "
                         "columns) tuple of two (a block is classified as one Triton tile)")
    if device is None:
        device = document_ids.device if isinstance(document_ids, torch.Tensor) else _device.setup()
    device = torch.device(device)
    if device.type not in ("cuda", "cpu") or (device.type == "cuda" and not torch.cuda.is_available()):
        why = "this machine has no CUDA GPU" if device.type == "cuda" else "expected 'cuda' or 'cpu'"
        raise ValueError(f"device is {str(device)!r}: a block mask is classified by a kernel, on a CUDA GPU or, in "
                         f"Triton's interpreter, on the CPU ({why})")
    if device.type == "cuda" and device.index is None:  # "cuda" and "cuda:0" must compare equal to q.device
        device = torch.device("cuda", torch.cuda.current_device())
    rules = parse_mask_rules(B, N_q, N_kv, device, causal=causal, window=window, document_ids=document_ids,
                             mask_mod=mask_mod)
    batch = rules.document_ids.shape[0] if rules.document_ids is not None else B
    return BlockMask.build(rules, batch, H, N_q, N_kv, device, block_size)


def flash_attention_forward(q, k, v, *, causal=False, scale: float | None = None, window=None, softcap=None,
                            alibi_slopes=None, document_ids=None, mask_mod=None, block_mask=None,
                            enable_gqa: bool = False, is_causal: bool | None = None, version: str | None = None,
                            q_descale=None, k_descale=None, v_descale=None, out_dtype=torch.bfloat16,
                            cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None,
                            dropout_p: float = 0.0, dropout_seed=None):
    """FlashAttention forward without autograd: returns (o, lse), the log-sum-exp the backward needs.

    Args:
        q: (B, H_q, N_q, D) queries, float16, bfloat16 or float32, any strides. D is any head dim from 8 to
            256 (flash-attn's range; outside it a ValueError, where flash-attn raises a RuntimeError). The
            kernels tile D at the next power of two >= 16 and mask the rest, with the scale from the true D:
            no copy, but the padded columns' share of the FLOPs (D = 59: 8%; D = 160: 60%). bfloat16 needs
            a GPU of compute capability 8.0 or newer (on a T4, use float16);
            without a GPU the kernels run in Triton's CPU interpreter on CPU tensors, in float16 or float32.
        k, v: (B, H_kv, N_k, D), q's dtype and device. H_kv = H_q, or, with ``enable_gqa=True``, a divisor
            of H_q: query head h reads K/V head h // (H_q // H_kv) (grouped-query attention; H_kv = 1 is
            multi-query attention).
        causal: False (default): no causal mask. True or "top_left": query i sees keys j <= i, as
            ``F.scaled_dot_product_attention(is_causal=True)``. "bottom_right": query i sees keys
            j <= i + N_k - N_q, the last query lined up with the last key (new tokens after a KV cache).
            With N_q = N_k the two are the same mask.
        scale: the factor on q.k before the softmax, a number from 1e-30 to 1e30 (float32 holds it in the
            kernels; 0, negatives, inf, nan and values outside raise a ValueError); None (default) means 1/sqrt(D).
        window: None (default) or (left, right), two ints >= -1: query i sees only keys
            c - left <= j <= c + right, where c is query i's key on the call's diagonal (below); -1 leaves that
            side unbounded. ``window=(255, 0)`` with ``causal=True`` is a sliding window of 256 keys.
        softcap: None (default) or a float from 1e-30 to 1e30 (float32 holds the cap; outside, a ValueError):
            each score s becomes softcap * tanh(s / softcap) (Gemma 2).
        alibi_slopes: None (default) or a (H_q,) float32 tensor on q's device: head h adds
            -alibi_slopes[h] * |c - j| to each score, after the softcap. Constants to the kernels: slopes that
            require grad raise a ValueError (no gradient would reach them). Their values are not read on the host
            (on a GPU that would wait for it on every call): an inf or NaN slope gives that head NaN.
        document_ids: None (default) or a (B, N) int32/int64 tensor, N = N_q = N_k: query i sees key j only
            when both carry the same id (several sequences packed into one row). int64 ids are compared exactly.
        cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k: flash-attn's varlen spelling of packed sequences,
            instead of ``document_ids``: q (1, H_q, total, D) (flash-attn's (total, H, D) is
            ``x.transpose(0, 1).unsqueeze(0)``), ``cu_seqlens_q`` (n + 1,) int32 cumulative lengths from 0;
            ``cu_seqlens_k`` the same lengths or None (cross-attention lengths raise a ValueError); the max
            lengths optional (checked against the row's length). ``causal=True`` is causal inside each sequence.
        mask_mod: None (default) or a ``@triton.jit`` function ``mask_mod(b, h, q_idx, kv_idx) -> bool``
            (FlexAttention's signature): key j is visible where it returns True.
        block_mask: None (default) or a :class:`BlockMask` from :func:`create_block_mask` for these shapes: its
            tile lists are read instead of rebuilt, and the call takes causal, window, document_ids and mask_mod
            from it (given again, they must be the same). A mismatch raises a ValueError saying what differs.
        enable_gqa: False (default): k and v must have q's number of heads, else a ValueError says to pass
            ``enable_gqa=True`` (as ``F.scaled_dot_product_attention`` and FlexAttention require); True allows
            H_kv < H_q (grouped-query attention).
        is_causal: None (default) or a bool, SDPA's spelling of ``causal`` (True is "top_left"); given with a
            different ``causal``, a ValueError.
        version: a numbered forward kernel, "v1" ... "v7" (``FORWARD_VERSIONS``); None (default) is
            ``DEFAULT_FORWARD``, the one that supports every option. v1-v6 know only plain and top-left causal
            attention and refuse the other options by name.
        q_descale, k_descale, v_descale, out_dtype: for FP8 inputs only (below); given with 16/32-bit inputs
            they raise a ValueError.
        dropout_p: 0.0 (default) or a float in [0, 1): each attention weight is dropped with this probability and
            the kept ones scaled by 1 / (1 - p), as ``F.scaled_dot_product_attention(dropout_p=...)`` does (and,
            as it, whenever p > 0: pass 0.0 at evaluation). The returned lse is the undropped softmax's. NaN, 1.0
            (every weight dropped) and values outside [0, 1) raise a ValueError. Runs v7 (``kernels/dropout.py``).
        dropout_seed: None (default: a fresh seed from torch's generator on q's device, so
            ``torch.manual_seed`` repeats it) or an int or a (1,) int64 tensor (``kernels.dropout.draw_seed``):
            the mask is a function of the seed and each weight's position. Pass the same seed to
            :func:`flash_attention_backward` to get the gradients of this forward.

    The call's diagonal: the causal mask, the window and ALiBi's distance are all measured from one diagonal,
    query i lined up with key c = i + shift: shift = 0 (key j = i) with top-left causal; shift = N_k - N_q (key
    j = i + N_k - N_q) with bottom-right causal, and also with causal=False, as the FlashAttention library does.
    With N_q = N_k both give c = i. All masks combine by AND; a query row that sees no key gives o = 0 (and
    lse = -inf), never NaN.

    Returns:
        o: (B, H_q, N_q, D), q's dtype (``out_dtype`` for FP8 inputs).
        lse: (B, H_q, N_q) float32, each row's natural-log log-sum-exp of its (scaled, capped, biased) visible
            scores; -inf for a row that sees no key (whose o is 0).

    FP8 (Hopper): q, k, v all ``torch.float8_e4m3fn`` on a GPU of compute capability 9.0 or newer (else a
    RuntimeError saying so) run ``fp8.py``'s kernel. The true tensors are ``fp8 * descale``, with ``q_descale``,
    ``k_descale``, ``v_descale`` (B, H_kv) float32 (None = 1; ``fp8.quantize_fp8`` makes all six); o comes in
    ``out_dtype`` (torch.bfloat16, the default, or torch.float16). Plain and causal attention only: the other
    options raise a ValueError naming them.

    Not differentiable: use :func:`flash_attention` for gradients, or pass o and lse to
    :func:`flash_attention_backward`. Under ``torch.compile`` the call is the ``flashcourse::attention_forward``
    op (and :func:`flash_attention_backward` the ``flashcourse::attention_backward`` op), so
    ``fullgraph=True`` keeps both in the graph; ``mask_mod`` and ``block_mask`` run eagerly (a graph break).

    Example::

        q, k, v = (torch.randn(1, 4, 512, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        o, lse = flash_attention_forward(q, k, v, causal="bottom_right", softcap=30.0)
        o.shape, lse.shape, lse.dtype  # (1, 4, 512, 128), (1, 4, 512), torch.float32
    """
    return call.forward_call(
        q, k, v, causal=causal, scale=scale, window=window, softcap=softcap, alibi_slopes=alibi_slopes,
        document_ids=document_ids, mask_mod=mask_mod, block_mask=block_mask, enable_gqa=enable_gqa,
        is_causal=is_causal, version=version, q_descale=q_descale, k_descale=k_descale, v_descale=v_descale,
        out_dtype=out_dtype, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q,
        max_seqlen_k=max_seqlen_k, dropout_p=dropout_p, dropout_seed=dropout_seed)


def flash_attention_backward(q, k, v, o, lse, do, *, causal=False, scale: float | None = None, window=None,
                             softcap=None, alibi_slopes=None, document_ids=None, mask_mod=None, block_mask=None,
                             enable_gqa: bool = False, is_causal: bool | None = None, version: str | None = None,
                             cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None,
                             dropout_p: float = 0.0, dropout_seed=None):
    """FlashAttention backward from the forward's saved (o, lse): returns (dq, dk, dv).

    P is recomputed from (q, k, lse) tile by tile, so no N_q x N_k matrix is kept between the two passes; a
    caller that merged partial results (ring attention) passes the merged o and lse.

    Args:
        q, k, v: as given to :func:`flash_attention_forward` (q (B, H_q, N_q, D); k, v (B, H_kv, N_k, D)).
        o: (B, H_q, N_q, D), the forward's output, q's dtype.
        lse: (B, H_q, N_q) float32, the forward's log-sum-exp.
        do: (B, H_q, N_q, D), the gradient of the loss with respect to o, q's dtype.
        causal, scale, window, softcap, alibi_slopes, document_ids, mask_mod, enable_gqa, is_causal: the
            forward's options, with the same meanings and defaults (see :func:`flash_attention_forward`); they
            must be the forward's, or the gradients belong to another attention.
        cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k: the forward's packed sequences, if it had
            them (flash-attn's varlen spelling of ``document_ids``).
        block_mask: None (default) or the forward's :class:`BlockMask` (:func:`create_block_mask`): the dK/dV
            and dQ kernels read its lists (per key tile and per query tile) instead of building them.
        version: a numbered backward kernel, "b1" ... "b5" (``BACKWARD_VERSIONS``); None (default) runs b3 (every
            option), or b1 (faster) when the call needs none of b3's options.
        dropout_p, dropout_seed: the forward's (see :func:`flash_attention_forward`); with dropout_p > 0 the seed
            is required (an int or (1,) int64 tensor), and b3 regenerates the forward's mask from it.

    Returns:
        (dq, dk, dv): shaped and typed like q, k, v; dk and dv summed over the query heads that share a K/V head.
        A query row that saw no key contributes nothing.

    Example::

        o, lse = flash_attention_forward(q, k, v, causal=True)
        dq, dk, dv = flash_attention_backward(q, k, v, o, lse, torch.ones_like(o), causal=True)
    """
    return call.backward_call(
        q, k, v, o, lse, do, causal=causal, scale=scale, window=window, softcap=softcap, alibi_slopes=alibi_slopes,
        document_ids=document_ids, mask_mod=mask_mod, block_mask=block_mask, enable_gqa=enable_gqa,
        is_causal=is_causal, version=version, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
        max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k, dropout_p=dropout_p, dropout_seed=dropout_seed)


def flash_attention(q, k, v, *, causal=False, scale: float | None = None, window=None, softcap=None,
                    alibi_slopes=None, document_ids=None, mask_mod=None, block_mask=None, enable_gqa: bool = False,
                    is_causal: bool | None = None, return_lse: bool = False, forward_version: str | None = None,
                    backward_version: str | None = None, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None,
                    max_seqlen_k=None, dropout_p: float = 0.0):
    """Differentiable FlashAttention: softmax(scale * q @ k^T + masks) @ v, without an N_q x N_k matrix.

    A drop-in for ``F.scaled_dot_product_attention(q, k, v, is_causal=...)`` with more options. Gradients flow
    to q, k and v (dk and dv summed over the query heads that share a K/V head). Without grad (inference, or
    no input requiring it) it skips autograd and runs the forward alone.

    Args:
        q: (B, H_q, N_q, D) queries, float16, bfloat16 or float32, any strides. D is any head dim from 8 to
            256 (flash-attn's range; outside it a ValueError, where flash-attn raises a RuntimeError). The
            kernels tile D at the next power of two >= 16 and mask the rest, with the scale from the true D:
            no copy, but the padded columns' share of the FLOPs (D = 59: 8%; D = 160: 60%). bfloat16 needs
            a GPU of compute capability 8.0 or newer (on a T4, use float16);
            without a GPU the kernels run in Triton's CPU interpreter on CPU tensors, in float16 or float32.
        k, v: (B, H_kv, N_k, D), q's dtype and device. H_kv = H_q, or, with ``enable_gqa=True``, a divisor
            of H_q: query head h reads K/V head h // (H_q // H_kv) (grouped-query attention; H_kv = 1 is
            multi-query attention).
        causal: False (default): no causal mask. True or "top_left": query i sees keys j <= i, as
            ``F.scaled_dot_product_attention(is_causal=True)``. "bottom_right": query i sees keys
            j <= i + N_k - N_q, the last query lined up with the last key (new tokens after a KV cache).
            With N_q = N_k the two are the same mask.
        scale: the factor on q.k before the softmax, a number from 1e-30 to 1e30 (float32 holds it in the
            kernels; 0, negatives, inf, nan and values outside raise a ValueError); None (default) means 1/sqrt(D).
        window: None (default) or (left, right), two ints >= -1: query i sees only keys
            c - left <= j <= c + right, where c is query i's key on the call's diagonal (below); -1 leaves that
            side unbounded. ``window=(255, 0)`` with ``causal=True`` is a sliding window of 256 keys.
        softcap: None (default) or a float from 1e-30 to 1e30 (float32 holds the cap; outside, a ValueError):
            each score s becomes softcap * tanh(s / softcap) (Gemma 2).
        alibi_slopes: None (default) or a (H_q,) float32 tensor on q's device: head h adds
            -alibi_slopes[h] * |c - j| to each score, after the softcap. Constants to the kernels: slopes that
            require grad raise a ValueError (no gradient would reach them). Their values are not read on the host
            (on a GPU that would wait for it on every call): an inf or NaN slope gives that head NaN.
        document_ids: None (default) or a (B, N) int32/int64 tensor, N = N_q = N_k: query i sees key j only
            when both carry the same id (several sequences packed into one row). int64 ids are compared exactly.
        cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k: flash-attn's varlen spelling of packed sequences,
            instead of ``document_ids``: q (1, H_q, total, D) (flash-attn's (total, H, D) is
            ``x.transpose(0, 1).unsqueeze(0)``), ``cu_seqlens_q`` (n + 1,) int32 cumulative lengths from 0;
            ``cu_seqlens_k`` the same lengths or None (cross-attention lengths raise a ValueError); the max
            lengths optional (checked against the row's length). ``causal=True`` is causal inside each sequence.
        mask_mod: None (default) or a ``@triton.jit`` function ``mask_mod(b, h, q_idx, kv_idx) -> bool``
            (FlexAttention's signature): key j is visible where it returns True.
        block_mask: None (default) or a :class:`BlockMask` from :func:`create_block_mask` for these shapes: the
            forward and the backward read its tile lists instead of rebuilding them (build it once, pass it at
            every step). The call takes causal, window, document_ids and mask_mod from it (given again, they
            must be the same); a mismatch of shapes, rules, device or tiles raises a ValueError saying what
            differs.
        enable_gqa: False (default): k and v must have q's number of heads, else a ValueError says to pass
            ``enable_gqa=True`` (as ``F.scaled_dot_product_attention`` and FlexAttention require); True allows
            H_kv < H_q (grouped-query attention).
        is_causal: None (default) or a bool, SDPA's spelling of ``causal`` (True is "top_left"), so a call
            written for SDPA runs unchanged; given with a different ``causal``, a ValueError.
        return_lse: False (default) returns o; True returns (o, lse), lse (B, H_q, N_q) float32, each row's
            natural-log log-sum-exp (-inf for a row that sees no key). The lse is differentiable, as
            FlexAttention's: a loss that uses it gets its term in the gradients. No double backward: a backward
            with ``create_graph=True`` raises a RuntimeError (SDPA's flash backend has none either).
        dropout_p: 0.0 (default) or a float in [0, 1): dropout on the attention weights, as
            ``F.scaled_dot_product_attention(dropout_p=...)``: each weight dropped with probability p, the kept
            ones scaled by 1 / (1 - p), whenever p > 0 (pass 0.0 at evaluation, ``p if self.training else 0.0``).
            Each call draws a seed from torch's generator on q's device (``torch.manual_seed`` repeats it); the
            backward regenerates the same mask from that seed instead of storing it (``kernels/dropout.py``).
            The lse stays the undropped softmax's. Runs v7 and b3. NaN, 1.0 and values outside [0, 1) raise a
            ValueError.

    The call's diagonal: the causal mask, the window and ALiBi's distance are all measured from one diagonal,
    query i lined up with key c = i + shift: shift = 0 (key j = i) with top-left causal; shift = N_k - N_q (key
    j = i + N_k - N_q) with bottom-right causal, and also with causal=False, as the FlashAttention library does.
    With N_q = N_k both give c = i. All masks combine by AND; a query row that sees no key gives o = 0 (and
    lse = -inf), never NaN.

    Which kernels run: by default v7 and b3 (b1 when the call needs none of b3's options); on a Hopper GPU
    with a tested Triton, the forward is the one measured fastest for the head dim, causality and length
    (``plan.FORWARD_BANDS``: a Gluon stage of ``kernels/hopper/fa3.py``, v8f at D = 64 and v8d at D = 128 and 256
    but for causal bands at D = 64 and 128) wherever the call fits it (float16 / bfloat16, no GQA, plain or
    top-left causal, no other option, contiguous inputs, N_k a multiple of its key tile). :func:`explain` says
    which kernels a call runs and why. A repeat call (same shapes, strides, dtype, device and options) reuses
    the plan its first call made (``plan.py``): no checks again, only the launches.

    Other keywords: ``forward_version`` ("v1" ... "v7") and ``backward_version`` ("b1" ... "b5") pick a numbered
    kernel of the course (``FORWARD_VERSIONS``, ``BACKWARD_VERSIONS``, docs/KERNELS.md). v1-v6 and b1, b2, b4,
    b5 know only plain and top-left causal attention and refuse the other options by name.

    Under ``torch.compile``: the call is a ``torch.library`` op (``flashcourse::attention_forward`` and its
    backward), so ``torch.compile(model, fullgraph=True)`` keeps it in the graph with every option but two:
    ``mask_mod``, a ``@triton.jit`` function, and ``block_mask``, a Python object, fit no op schema, so such a
    call runs eagerly, a graph break (``fullgraph=True`` then raises; compile without it). Eager calls do not go
    through the op.

    Returns:
        o: (B, H_q, N_q, D), q's dtype and device; with ``return_lse=True``, (o, lse).

    Example::

        q = torch.randn(2, 8, 1024, 64, device="cuda", dtype=torch.float16, requires_grad=True)
        k, v = (torch.randn(2, 2, 1024, 64, device="cuda", dtype=torch.float16) for _ in range(2))  # GQA
        o = flash_attention(q, k, v, causal=True, window=(255, 0), enable_gqa=True)  # 256 keys back at most
        o.sum().backward()  # q.grad: (2, 8, 1024, 64)
    """
    # Positional, in call.attention_call's order: on every call, and keywords cost about a microsecond more here.
    return call.attention_call(q, k, v, causal, scale, window, softcap, alibi_slopes, document_ids, mask_mod,
                               block_mask, enable_gqa, is_causal, return_lse, forward_version, backward_version,
                               (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k), dropout_p)


def explain(q, k, v, *, causal=False, scale: float | None = None, window=None, softcap=None, alibi_slopes=None,
            document_ids=None, mask_mod=None, block_mask=None, enable_gqa: bool = False,
            is_causal: bool | None = None, forward_version: str | None = None,
            backward_version: str | None = None, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None,
            max_seqlen_k=None, dropout_p: float = 0.0) -> Route:
    """Which forward and backward kernels ``flash_attention(q, k, v, **options)`` runs here, and why.

    The same decision the call makes (``plan.choose_route``, through the call's own plan), so what it says is what
    runs: on a Hopper GPU with a tested Triton, the forward measured fastest for the call's head dim, causality
    and length on this GPU (``plan.BANDS_BY_GPU``, the H200's where this GPU has no measurement) where the call
    fits the Gluon stages, else v7; b1 for a backward that needs
    none of b3's options, else b3.
    Nothing is launched.

    Args:
        q, k, v: as for :func:`flash_attention`: q (B, H_q, N_q, D), k and v (B, H_kv, N_k, D).
        causal, scale, window, softcap, alibi_slopes, document_ids, mask_mod: as for :func:`flash_attention`.
        cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k: as for :func:`flash_attention`.
        block_mask, enable_gqa, is_causal, forward_version, backward_version, dropout_p: as for
            :func:`flash_attention`, checked as it checks them (dropout runs v7 and b3: the Gluon kernels and b1
            have none).

    Returns:
        A :class:`Route` (frozen dataclass): ``forward`` and ``backward`` (kernel names), ``forward_why`` and
        ``backward_why``; ``print(route)`` shows both lines.

    Example::

        q = torch.randn(2, 8, 4096, 128, device="cuda", dtype=torch.bfloat16)
        print(explain(q, q, q, causal=True))
        # forward  v8f: the fastest forward measured on the H200 at causal, D = 128, N_q = 4096 <= 8192
        #          (plan.BANDS_BY_GPU)        (on an H200; another Hopper GPU's own measurement where it has one,
        #                                      else the H200's, said as the fallback)
        # backward b1: the call needs none of b3's options, and b1 is faster
    """
    return call.explain_call(
        q, k, v, causal=causal, scale=scale, window=window, softcap=softcap, alibi_slopes=alibi_slopes,
        document_ids=document_ids, mask_mod=mask_mod, block_mask=block_mask, enable_gqa=enable_gqa,
        is_causal=is_causal, forward_version=forward_version, backward_version=backward_version,
        cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k,
        dropout_p=dropout_p)


def flash_decode(q, k_cache, v_cache, *, cache_seqlens=None, block_table=None, scale=None, num_splits=None,
                 k_scale=None, v_scale=None, window=None, softcap=None, alibi_slopes=None,
                 block_n: int | None = None, num_warps: int | None = None, num_stages: int | None = None,
                 switches: DecodeSwitches | None = None, causal: bool = True, cache_leftpad=None):
    """Attention of the new query tokens of each sequence (one, or a few) over its KV cache, split along the cache
    length.

    Each program reads one piece ("split") of the cache and keeps a partial output and its log-sum-exp; a
    second small kernel merges the partials (the (m, l) merge of ``reference.merge_partials``). So a single
    token still spreads over every SM, where a FlashAttention forward would give it one program per
    (batch, head). A call that needs one split (a short cache, or many sequences and heads) writes its output
    directly: one launch. Several new tokens (speculative decoding's drafts to verify, a chunk of a long prompt)
    are extra rows of the same programs: every K/V tile is read once for all of a sequence's new tokens and the
    query heads that share its K/V head.

    Args:
        q: (B, H_q, D), one new token per sequence, or (B, H_q, n_new, D), n_new new tokens per sequence whose
            keys and values are already written at the end of the cache (positions seqlen - n_new .. seqlen - 1,
            as flash-attn's ``flash_attn_with_kvcache`` has them after appending); float16, bfloat16 (compute
            capability 8.0+) or float32;
            D any head dim from 8 to 256 (tiled at the next power of two >= 16, the rest masked: no copy of
            the cache; outside the range a ValueError, where flash-attn raises a RuntimeError).
        k_cache, v_cache: q's dtype, or both float8_e4m3fn (with ``k_scale`` and ``v_scale``; compute
            capability 8.9+ or the CPU interpreter), on q's device. Contiguous cache: (B, H_kv, N_max, D). Paged cache:
            (num_blocks, H_kv, page_size, D), pages shared by all sequences, with ``block_table``. H_q must
            be a multiple of H_kv (grouped-query attention: query head h reads K/V head h // (H_q // H_kv)).
        cache_seqlens: None (default: every sequence uses all N_max keys, or max_blocks * page_size), or the
            keys in use per sequence, the new tokens' own keys included (flash-attn's convention): a (B,) int32
            tensor on q's device, an int for every sequence, or a list or tuple of B ints (copied to q's device
            on each call). A sequence of length 0 gives o = 0. Each length must lie in 0 .. N_max
            (max_blocks * page_size for a paged cache) and, with n_new new tokens, be 0 or at least n_new, else a
            ValueError. Lengths given as a list
            are checked on every call; a tensor's values are read once, when a call first meets its shapes and
            options (reading a GPU tensor waits for the GPU, so not on every call), and on every call the
            kernel clamps each length to 0 .. N_max: a length changed in place past the cache reads the whole
            cache, never another sequence's rows.
        block_table: None (default: contiguous cache) or (B, max_blocks) int32, each sequence's pages in
            order. ``page_size`` must be a power of two >= 16 (vLLM's default page is 16 rows); the table is
            read once per page, by tiles that never straddle a page edge.
        scale: the factor on q.k, from 1e-30 to 1e30 as for :func:`flash_attention`; None (default) means
            1/sqrt(D).
        num_splits: pieces of the cache length; None (default) gives about one program per SM.
        k_scale, v_scale: None (default, a 16-bit cache) or, for a float8_e4m3fn cache, (B, H_kv) float32: the
            true K of sequence b, KV head h is ``k_cache * k_scale[b, h]`` (for a paged cache, on every page of
            b's block-table row), V likewise; :func:`quantize_kv_cache` makes the cache and its scales. The
            kernel reads one byte per element and widens it to q's dtype in registers (exact); k_scale joins
            the score scale, v_scale multiplies the output.
        window: None (default) or (left, right), -1 = unbounded: a new token at position p (``seqlen - 1`` for
            the last) sees only keys p - left .. p (with ``causal``; ``right`` reaches no key after the last
            token); only the windows' keys are read, the splits share out the windows, not the cache.
        softcap: None (default) or a float from 1e-30 to 1e30: scores s become softcap * tanh(s / softcap).
        alibi_slopes: None (default) or (H_q,) float32, not requiring grad: head h adds -alibi_slopes[h] * |p - j|
            for the token at position p.
        block_n, num_warps, num_stages: override the launch, for tuning (``block_n`` a power of two >= 16);
            None (default) takes ``configs.decode_config``'s.
        switches: None (default: :func:`default_switches`, chosen by the GPU, the cache's dtype and V's layout) or
            a :class:`DecodeSwitches`, the split kernel's options beyond its tiles, for tuning; its None fields
            are chosen as by default.
        causal: True (default): bottom-right causal among the new tokens, new token t (0-based) of a sequence
            of length L sees keys 0 .. L - n_new + t, the last one the whole sequence (flash-attn's
            ``causal=True``, aligned to the bottom right); False: every new token sees all L keys (flash-attn's
            default). With one new token the two are the same.
        cache_leftpad: None (default: every sequence's keys start at row 0 of its cache row or first page) or a
            (B,) int32 tensor on q's device, flash-attn's ``cache_leftpad``: the first real key P of each
            sequence; rows 0 .. P - 1 are left padding, never read (a paged cache's first tile masks them) and
            never attended, so sequence b attends keys P .. L - 1 of its L = ``cache_seqlens[b]``. Positions stay
            the cache's: the new tokens are still L - n_new .. L - 1 (bottom-right causal against L), and the
            window and ALiBi measure from them; the splits share out P .. L - 1. Each P must lie in 0 .. L (P = L:
            no key, o = 0) and leave the new tokens' own keys, L - P >= n_new, else a ValueError (flash-attn does
            not check the values, and refuses cache_leftpad with a paged cache; both layouts take it here). Its
            values are read as a tensor's lengths are, once per plan; the kernel clamps each P to 0 .. L on every
            call.

    Not differentiable (decoding is inference): q or a cache that requires grad raises a RuntimeError naming
    ``torch.no_grad()``, where its output would otherwise come back detached and a loss would lose its gradient.
    Under ``torch.compile`` the call is one custom op, ``flashcourse::decode``.

    Returns:
        o: q's shape, (B, H_q, D) or (B, H_q, n_new, D), and q's dtype.

    Example::

        k_cache, v_cache = (torch.randn(4, 2, 8192, 128, device="cuda", dtype=torch.float16) for _ in range(2))
        q = torch.randn(4, 16, 128, device="cuda", dtype=torch.float16)  # 8 query heads per K/V head
        lengths = torch.tensor([8192, 100, 5000, 1], device="cuda", dtype=torch.int32)
        o = flash_decode(q, k_cache, v_cache, cache_seqlens=lengths)  # (4, 16, 128)
        k8, v8, k_scale, v_scale = quantize_kv_cache(k_cache, v_cache)  # half the bytes to read (sm_89+)
        o8 = flash_decode(q, k8, v8, cache_seqlens=lengths, k_scale=k_scale, v_scale=v_scale)
        drafts = torch.randn(4, 16, 5, 128, device="cuda", dtype=torch.float16)  # 5 tokens, keys already cached
        o5 = flash_decode(drafts, k_cache, v_cache, cache_seqlens=[8192, 105, 5005, 5])  # (4, 16, 5, 128)
        first_real = torch.tensor([0, 40, 4000, 0], device="cuda", dtype=torch.int32)  # left-padded prompts
        o_left = flash_decode(q, k_cache, v_cache, cache_seqlens=lengths, cache_leftpad=first_real)
    """
    # Positional, in call.decode_call's order: on every call, and keywords cost about a microsecond more here.
    return call.decode_call(q, k_cache, v_cache, cache_seqlens, block_table, scale, num_splits, k_scale, v_scale,
                            window, softcap, alibi_slopes, block_n, num_warps, num_stages, switches, causal,
                            cache_leftpad)


def quantize_kv_cache(k_cache, v_cache, *, block_table=None, cache_seqlens=None, cache_leftpad=None) -> Fp8KVCache:
    """Quantise a KV cache to float8_e4m3fn with one scale per (sequence, KV head), for :func:`flash_decode`.

    Each scale is amax / 448 over everything that sequence's head stores, so the largest value lands on e4m3's
    largest and the rest keep 3 mantissa bits (a relative rounding error of at most 2^-4) down to 2^-6 of the
    scale. Why this granularity: a decode kernel program reads one (sequence, KV head), so its two scales are two
    scalar loads per program, folded into the score scale (K) and the output (V): nothing per key. e4m3 is
    floating point, so values within 448 / 2^-6 of their head's largest keep all 3 mantissa bits whatever the
    outliers; finer scales (per page or per token) only help ranges wider than that, at the cost of a scale read
    per page or per row inside the loop (and a scale column beside the block table). Coarser ones (per head or
    per tensor, what vLLM uses with a scale calibrated offline) let a serving engine write new tokens without
    ever rescaling old ones: an amax taken after the fact, as here, suits a cache quantised once after prefill; a
    growing cache whose new token exceeds the amax must clamp it or requantise.

    Args:
        k_cache, v_cache: float16, bfloat16 or float32, one shape: (B, H_kv, N_max, D) contiguous, or
            (num_blocks, H_kv, page_size, D) pages with ``block_table``.
        block_table: None (contiguous) or (B, max_blocks) int32: sequence b's scale comes from the pages of its
            row (the first ceil(cache_seqlens[b] / page_size) of them); a page listed by several sequences gives
            them all one scale, the largest their rows in use need. Pages no sequence lists keep a scale of
            their own.
        cache_seqlens: None (every row, or every listed page, in use), an int, a list of B ints or a (B,) int32
            tensor, as :func:`flash_decode` takes it. One rule for both layouts: rows past a sequence's length
            (stale or never written) do not count towards its scale, whether they lie in a contiguous cache or
            on a paged sequence's last page; they are quantised with the others, clamped to e4m3's range (never
            NaN), and the kernel never reads them.
        cache_leftpad: None (no left padding) or (B,) int32, as :func:`flash_decode` takes it: rows before a
            sequence's first real key do not count towards its scale either (padding may hold anything, NaN
            included; it stays what it was, quantised, and is never read); block-table entries of pages wholly
            inside the padding are not looked up.

    Lengths, paddings and pages are checked as :func:`flash_decode` checks them (a ValueError names the value),
    and so are the rows in use: an inf or NaN among them raises a ValueError, where its head's scale would not be
    finite and the whole head would quantise to 0 or NaN.

    Returns:
        :class:`Fp8KVCache` ``(k, v, k_scale, v_scale)``: the cache in float8_e4m3fn, its shape and layout, and
        (B, H_kv) float32 scales (true K = ``k * k_scale[b, h]``).

    Example::

        k8, v8, k_scale, v_scale = quantize_kv_cache(k_cache, v_cache)
        o = flash_decode(q, k8, v8, k_scale=k_scale, v_scale=v_scale)  # half the bytes of a float16 cache
    """
    return call.quantize_call(k_cache, v_cache, block_table, cache_seqlens, cache_leftpad)
