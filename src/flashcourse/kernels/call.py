"""The front door: every entry point of ``kernels/__init__.py`` hands its arguments here, and each call leaves
checked and described, for the plan (``plan.py``) and the dispatch (``ops.py``) that follow.

What a call goes through here, in this order (each step asks another module once, never one asked before, so a
newcomer reads the path top to bottom, as Triton's tutorial 06 reads):

1. the options spelled another way, which need no tensor: SDPA's ``is_causal``, a block mask's options;
2. the description (:class:`Call`): q's, k's and v's layout and the scalar options, parsed (``rules.parse_options``).
   It is the key of the call's plan in ``plan.PLANS``, the one plan cache, and it holds everything the checks
   read, so a description already there belongs to a call that passed them: the checks below are skipped;
3. any other call is checked in full: the tensors (``_checks.check_call``, which reads the device's properties
   once, carried on to the plan), then the rules that hold tensors (``rules.with_call_tensors``: ALiBi slopes,
   document ids or flash-attn's ``cu_seqlens``, a ``mask_mod``);
4. the dropout seed of this call (``dropout.py``), where it has dropout;
5. on to ``ops.py`` (or, for ``explain``, straight to the plan): the autograd Function eagerly, the
   ``torch.library`` ops under ``torch.compile``.

Calls whose rules hold tensors (ALiBi slopes, document ids, a block mask) or a ``mask_mod`` have no description
kept: they are checked in full every time. Decode has the same door (:func:`decode`), with its own checks.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from . import _checks, configs, decode, fp8, ops
from .backward import BACKWARD_VERSIONS, DEFAULT_BACKWARD
from .blockmask import BlockMask
from .dropout import Dropout, draw_seed, seed_tensor
from .forward import DEFAULT_FORWARD, FORWARD_VERSIONS
from .plan import PLANS, decode_plan_for, plan_for
from .rules import parse_options, refuse_missing, with_call_tensors

_is_compiling = torch.compiler.is_compiling  # bound once: asked on every call
_grad_enabled = torch.is_grad_enabled
_new_tuple = tuple.__new__


class Call(NamedTuple):
    """One attention call, normalised: the frozen description the front door makes of its arguments, and the key
    of its plan in ``plan.PLANS``.

    It holds everything the checks read (shapes, strides, dtypes, devices, alignment, the options as checked)
    and nothing else, so the checks are a function of it: a call whose description is already a key passed them
    when that plan was made, and a cache hit can never skip a check that would have failed (a failed check keeps
    no plan). The device is the ``torch.device`` itself: ``get_device()`` is -1 for the CPU and a meta tensor
    alike, so a meta call once found a CPU call's plan and skipped the check that refuses it. A NamedTuple, not a
    dataclass: it is built on every call, and a tuple is the cheapest frozen record to build and hash (the hot
    path builds the plain tuple of these fields, which hashes and compares equal to the Call kept under them).
    A new option is one more field, with its check in :func:`describe`."""

    layout: tuple  # (q, k, v)'s shapes, strides, dtypes, devices and 16-byte alignment: what Triton specialises on
    causal: str | None
    window: tuple[int, int] | None
    softcap: float | None
    scale: float | int | None  # as given; None is 1/sqrt(D)
    enable_gqa: bool
    forward_version: str | None
    backward_version: str | None
    dropout_p: float | None = None  # checked: None or in (0, 1); the seed is per call, never in the description


# True == 1 == 1.0 as keys: a bool scale or a non-bool enable_gqa (refused by the checks) must never find the plan
# of a valid call, so only these types are described; anything else is checked in full.
_DESCRIBED_SCALES = frozenset((float, int, type(None)))


class Described(NamedTuple):
    """A checked attention call, as the plan and the dispatch take it: its description (None where no plan is
    kept), its plan where the description found one, its rules (with their tensors) and what of them the
    numbered versions lack (``Rules.missing_in_numbered_version``: the backward's route), the device's properties (None
    on a cache hit, whose plan read them, and while ``torch.compile`` traces), its block mask, scale and versions,
    and its dropout (probability and seed) or None."""

    call: tuple | None
    plan: object  # plan.Plan or None
    rules: object  # rules.Rules
    lacks: str | None  # what the numbered versions (b1 ...) cannot do for this call; read only where plan is None
    props: configs.DeviceProps | None
    block_mask: BlockMask | None
    scale: float | int | None
    enable_gqa: bool
    forward_version: str | None
    backward_version: str | None
    dropout: Dropout | None


def describe(q, k, v, causal, scale, window, softcap, alibi_slopes, document_ids, mask_mod, block_mask, enable_gqa,
             is_causal, forward_version, backward_version, varlen, dropout_p, seed, saved=None,
             tracing=False) -> Described:
    """Check and describe one attention call (the steps of this module's docstring). ``varlen``: (cu_seqlens_q,
    cu_seqlens_k, max_seqlen_q, max_seqlen_k); ``seed``: how the call's dropout gets its seed, a pair (how,
    value): ("draw", None) a fresh one, ("given", the caller's or None to draw one) for a forward, ("saved", the
    caller's, required) for a backward, ("none", None) none at all (``explain``: nothing runs); ``saved``: a
    backward's (o, lse, do); ``tracing``: under ``torch.compile``, where the device cannot be asked (the op's fake
    implementation checks the tensors instead)."""
    if is_causal is not None:
        causal = _sdpa_causal(causal, is_causal)
    if block_mask is not None:  # is_causal=False is a choice (its default is None); causal=False may be the default
        causal, window, document_ids, mask_mod = _block_mask_options(block_mask, causal, is_causal is not None,
                                                                     window, document_ids, mask_mod)
    options = parse_options(causal, window, softcap, dropout_p)
    call = plan = None
    if (alibi_slopes is None and document_ids is None and mask_mod is None and block_mask is None
            and varlen[0] is None and varlen[1] is None and varlen[2] is None and varlen[3] is None and not tracing
            and enable_gqa.__class__ is bool and scale.__class__ in _DESCRIBED_SCALES):
        try:
            # layout, then the options: Call's fields, written out (a call of a function costs more than this)
            call = ((q.shape, q.stride(), k.shape, k.stride(), v.shape, v.stride(), q.dtype, k.dtype, v.dtype,
                     q.device, k.device, v.device, q.data_ptr() % 16 == 0, k.data_ptr() % 16 == 0,
                     v.data_ptr() % 16 == 0), options.causal, options.window, options.softcap, scale, enable_gqa,
                    forward_version, backward_version, options.dropout_p)
            plan = PLANS.plans.get(call)
        except (AttributeError, TypeError):  # not tensors, or an unhashable option: the checks below say which
            call = None
        else:
            # A repeat call without dropout or saved tensors is described exactly as the last one: its description
            # is kept on the plan (building the tuple again cost 0.3 us of a 9 us call)
            if plan is not None and saved is None and options.dropout_p is None:
                if plan.repeat_description is not None:
                    return plan.repeat_description
                plan.repeat_description = _new_tuple(Described, (call, plan, options, None, None, None, scale,
                                                                 enable_gqa, forward_version, backward_version, None))
                return plan.repeat_description
    props = None
    if saved is not None or plan is None:
        props = _checks.check_call(q, k, v, enable_gqa=enable_gqa, scale=scale, block_mask=block_mask, saved=saved,
                                   described=plan is not None, tracing=tracing)
    rules, lacks = options, None
    if plan is None:
        rules = with_call_tensors(options, q, k, alibi_slopes=alibi_slopes, document_ids=document_ids,
                                  mask_mod=mask_mod, varlen=varlen)
        lacks = rules.missing_in_numbered_version(k.shape[1] != q.shape[1], q.shape[2], k.shape[2])
        if lacks is not None:  # before any kernel runs (a backward's, not first inside .backward()), explain too
            _refuse_what_a_version_lacks(forward_version, backward_version, lacks)
    dropout = None
    if rules.dropout_p is not None and seed is not _NO_SEED:
        how, value = seed
        if how == "saved" and value is None:
            raise ValueError(f"dropout_p is {rules.dropout_p} but dropout_seed is None: the backward regenerates the "
                             "forward's mask from its seed, so pass the dropout_seed given to "
                             "flash_attention_forward (or use flash_attention, which keeps it)")
        dropout = Dropout(rules.dropout_p, draw_seed(q.device) if value is None else seed_tensor(value, q.device))
    if call is not None and plan is None:
        call = Call._make(call)
    # tuple.__new__ builds the NamedTuple without its Python-level __new__ (a third of the time, on every call)
    return _new_tuple(Described, (call, plan, rules, lacks, props, block_mask, scale, enable_gqa, forward_version,
                                  backward_version, dropout))


def _refuse_what_a_version_lacks(forward_version, backward_version, lacks: str) -> None:
    """A numbered teaching version asked for by a call with an option it lacks: a ValueError naming both (an
    unknown name is left to ``plan.choose_route``, which lists the known ones)."""
    for kind, name, versions, default in (("forward", forward_version, FORWARD_VERSIONS, DEFAULT_FORWARD),
                                          ("backward", backward_version, BACKWARD_VERSIONS, DEFAULT_BACKWARD)):
        version = versions.get(name)
        if version is not None and not version.takes_rules:
            refuse_missing(kind, name, default, lacks)


def _sdpa_causal(causal, is_causal):
    """``is_causal``, SDPA's spelling, as ``causal``; both given and different is an error."""
    if not isinstance(is_causal, bool):
        raise TypeError(f"is_causal is {is_causal!r}: expected True or False, as in "
                        "F.scaled_dot_product_attention (causal= also takes 'top_left' and 'bottom_right')")
    if causal is False or causal is None:
        return is_causal
    if not (is_causal and (causal is True or causal == "top_left")):
        raise ValueError(f"causal={causal!r} and is_causal={is_causal} disagree: is_causal is SDPA's spelling of "
                         "causal (is_causal=True is causal='top_left'); pass one of them")
    return causal


def _block_mask_options(block_mask, causal, causal_given, window, document_ids, mask_mod) -> tuple:
    """(causal, window, document_ids, mask_mod) of a call with a block mask: the block mask's. ``causal_given``: the
    call chose ``causal`` even where it is False (by SDPA's ``is_causal``)."""
    if not isinstance(block_mask, BlockMask):
        raise TypeError(f"block_mask is a {type(block_mask).__module__}.{type(block_mask).__name__}: expected a "
                        "flashcourse.kernels.BlockMask from kernels.create_block_mask(...) (FlexAttention's "
                        "BlockMask holds other tiles)")
    options = block_mask.call_options(causal=causal, causal_given=causal_given, window=window,
                                      document_ids=document_ids, mask_mod=mask_mod)
    return options["causal"], options["window"], options["document_ids"], options["mask_mod"]


def _outside_graph(entry, *tensors, **options):
    """``entry(*tensors, **options)`` run eagerly (a graph break): a ``mask_mod`` or ``block_mask`` call under
    torch.compile, which no op schema can carry. Only reached while compiling, so ``torch.compiler.disable`` (which
    imports torch._dynamo, about a second and a half) is asked here, not at import."""
    return torch.compiler.disable(entry)(*tensors, **options)


def attention_call(q, k, v, causal, scale, window, softcap, alibi_slopes, document_ids, mask_mod, block_mask,
                   enable_gqa, is_causal, return_lse, forward_version, backward_version, varlen, dropout_p):
    """``kernels.flash_attention`` (``varlen``: (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)): described
    here, then dispatched by ``ops.dispatch_attention``. Arguments come positionally: this is on every call."""
    # isinstance, not a class check: torch 2.11's dynamo cannot trace a bool's __class__ (a graph break)
    if not isinstance(return_lse, bool):  # its truth would pick the return type: "no" returned (o, lse)
        raise TypeError(f"return_lse is {return_lse!r}: expected True (return (o, lse)) or False (o alone)")
    tracing = _is_compiling()
    if tracing and (mask_mod is not None or block_mask is not None):  # they fit no op schema: a graph break
        return _outside_graph(attention_call, q, k, v, causal, scale, window, softcap, alibi_slopes, document_ids,
                              mask_mod, block_mask, enable_gqa, is_causal, return_lse, forward_version,
                              backward_version, varlen, dropout_p)
    described = describe(q, k, v, causal, scale, window, softcap, alibi_slopes, document_ids, mask_mod, block_mask,
                         enable_gqa, is_causal, forward_version, backward_version, varlen, dropout_p, _DRAW, None,
                         tracing)
    return ops.dispatch_attention(q, k, v, described, return_lse, tracing)


_DRAW = ("draw", None)  # a fresh seed for each call with dropout
_NO_SEED = ("none", None)  # explain: dropout is part of the route, but nothing runs


def forward_call(q, k, v, *, causal, scale, window, softcap, alibi_slopes, document_ids, mask_mod, block_mask,
                 enable_gqa, is_causal, version, q_descale, k_descale, v_descale, out_dtype, cu_seqlens_q,
                 cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, dropout_seed):
    """``kernels.flash_attention_forward``: 16- and 32-bit inputs described here and dispatched by
    ``ops.dispatch_forward``; FP8 inputs (last) to ``fp8.py``, which parses, checks and launches its own calls."""
    if getattr(q, "dtype", None) is not fp8.FP8:
        if q_descale is not None or k_descale is not None or v_descale is not None or out_dtype is not torch.bfloat16:
            raise ValueError("q_descale, k_descale, v_descale and out_dtype are for float8_e4m3fn inputs; q is "
                             f"{getattr(q, 'dtype', type(q).__name__)}, whose output comes in q's dtype: drop them")
        tracing = _is_compiling()
        if tracing and (mask_mod is not None or block_mask is not None):  # they fit no op schema: a graph break
            return _outside_graph(forward_call, q, k, v, causal=causal, scale=scale, window=window,
                                  softcap=softcap, alibi_slopes=alibi_slopes, document_ids=document_ids,
                                  mask_mod=mask_mod, block_mask=block_mask, enable_gqa=enable_gqa,
                                  is_causal=is_causal, version=version, q_descale=q_descale, k_descale=k_descale,
                                  v_descale=v_descale, out_dtype=out_dtype, cu_seqlens_q=cu_seqlens_q,
                                  cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k,
                                  dropout_p=dropout_p, dropout_seed=dropout_seed)
        described = describe(q, k, v, causal=causal, scale=scale, window=window, softcap=softcap,
                             alibi_slopes=alibi_slopes, document_ids=document_ids, mask_mod=mask_mod,
                             block_mask=block_mask, enable_gqa=enable_gqa, is_causal=is_causal,
                             forward_version=version, backward_version=None,
                             varlen=(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k), dropout_p=dropout_p,
                             seed=("given", dropout_seed), tracing=tracing)
        return ops.dispatch_forward(q, k, v, described, tracing=tracing)
    for name, value in (("block_mask", block_mask), ("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        if value is not None:
            raise ValueError(f"{name} is given, but the FP8 forward runs plain and causal attention only: drop it, "
                             "or pass 16-bit inputs")
    if is_causal is not None:  # SDPA's spelling
        causal = _sdpa_causal(causal, is_causal)
    fp8.check_fp8_qkv(q, k, v)
    _checks.check_gqa(q, k, enable_gqa)  # as a 16-bit call: fewer K/V heads only when asked for
    if dropout_p != 0.0:
        raise ValueError(f"dropout_p is {dropout_p!r}: the FP8 forward has no dropout; pass dropout_p=0.0, or "
                         "16-bit inputs")
    return fp8.flash_attention_forward_fp8(
        q, k, v, q_descale=q_descale, k_descale=k_descale, v_descale=v_descale, out_dtype=out_dtype, causal=causal,
        scale=scale, window=window, softcap=softcap, alibi_slopes=alibi_slopes, document_ids=document_ids,
        mask_mod=mask_mod, version=version)


def backward_call(q, k, v, o, lse, do, *, causal, scale, window, softcap, alibi_slopes, document_ids,
                  mask_mod, block_mask, enable_gqa, is_causal, version, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                  max_seqlen_k, dropout_p, dropout_seed):
    """``kernels.flash_attention_backward``."""
    tracing = _is_compiling()
    if tracing and (mask_mod is not None or block_mask is not None):  # they fit no op schema: a graph break
        return _outside_graph(backward_call, q, k, v, o, lse, do, causal=causal, scale=scale, window=window,
                              softcap=softcap, alibi_slopes=alibi_slopes, document_ids=document_ids,
                              mask_mod=mask_mod, block_mask=block_mask, enable_gqa=enable_gqa, is_causal=is_causal,
                              version=version, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                              max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k, dropout_p=dropout_p,
                              dropout_seed=dropout_seed)
    described = describe(q, k, v, causal=causal, scale=scale, window=window, softcap=softcap,
                         alibi_slopes=alibi_slopes, document_ids=document_ids, mask_mod=mask_mod,
                         block_mask=block_mask, enable_gqa=enable_gqa, is_causal=is_causal, forward_version=None,
                         backward_version=version, varlen=(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k),
                         dropout_p=dropout_p, seed=("saved", dropout_seed), saved=(o, lse, do), tracing=tracing)
    return ops.dispatch_backward(q, k, v, o, lse, do, described, tracing=tracing)


def explain_call(q, k, v, *, causal, scale, window, softcap, alibi_slopes, document_ids, mask_mod, block_mask,
                 enable_gqa, is_causal, forward_version, backward_version, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                 max_seqlen_k, dropout_p):
    """``kernels.explain``: the route of the call's plan, nothing launched."""
    described = describe(q, k, v, causal=causal, scale=scale, window=window, softcap=softcap,
                         alibi_slopes=alibi_slopes, document_ids=document_ids, mask_mod=mask_mod,
                         block_mask=block_mask, enable_gqa=enable_gqa, is_causal=is_causal,
                         forward_version=forward_version, backward_version=backward_version,
                         varlen=(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k), dropout_p=dropout_p,
                         seed=_NO_SEED)
    return plan_for(described, q, k, v, described.props, described.lacks).route


def decode_call(q, k_cache, v_cache, cache_seqlens, block_table, scale, num_splits, k_scale, v_scale, window,
                softcap, alibi_slopes, block_n, num_warps, num_stages, switches, causal, cache_leftpad):
    """``kernels.flash_decode``: lengths given on the host made a tensor, then the op while ``torch.compile``
    traces, else :func:`decode_eager`. Arguments come positionally: this is on every call."""
    lengths = None
    if cache_seqlens is not None and not isinstance(cache_seqlens, torch.Tensor):
        # Known on the host (an int for all, or a list): checked on every call, at no GPU cost.
        lengths = _checks.host_lengths(cache_seqlens, q.shape[0] if isinstance(q, torch.Tensor) and q.dim() else 0)
        cache_seqlens = torch.tensor(lengths, dtype=torch.int32, device=getattr(q, "device", None))
    tensors = (q, k_cache, v_cache, cache_seqlens, block_table, k_scale, v_scale, alibi_slopes, cache_leftpad)
    options = (scale, num_splits, window, softcap, block_n, num_warps, num_stages, switches, causal)
    if not _is_compiling():
        if _grad_enabled() and (getattr(q, "requires_grad", False) or getattr(k_cache, "requires_grad", False)
                                or getattr(v_cache, "requires_grad", False)):
            _refuse_gradients(q, k_cache, v_cache)  # inline above: this is on every call
        return decode_eager(tensors, options, lengths)
    return ops.decode_in_graph(tensors, options)  # one op in the graph: tracing our Python (and Triton's) fails


def quantize_call(k_cache, v_cache, block_table, cache_seqlens, cache_leftpad) -> decode.Fp8KVCache:
    """``kernels.quantize_kv_cache``: its arguments checked as a decode call's (lengths, paddings, pages), then
    ``decode.quantize_cache``."""
    cache_seqlens = _checks.check_quantize_inputs(k_cache, v_cache, block_table, cache_seqlens, cache_leftpad)
    return decode.quantize_cache(k_cache, v_cache, block_table, cache_seqlens, cache_leftpad)


def _refuse_gradients(q, k_cache, v_cache) -> None:
    """Decode has no backward: an input that requires grad would get an output without a gradient, and a loss
    that uses it would lose that term without a word. A RuntimeError instead (three attribute reads a call)."""
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if getattr(t, "requires_grad", False):
            raise RuntimeError(f"{name} requires grad, but flash_decode has no backward (decoding is inference): "
                               "call it under torch.no_grad() (or torch.inference_mode()), or pass "
                               f"{name}.detach(); for gradients, use flash_attention")


def decode_eager(tensors: tuple, options: tuple, lengths: list[int] | None = None) -> torch.Tensor:
    """A decode call run eagerly (also the body of the ``flashcourse::decode`` op): its description (the key of
    its plan, on a GPU) looked up in ``plan.PLANS``; a call found there checks only the lengths given on the host
    (``lengths``), which the description does not hold, and launches its plan; any other call is checked in full
    (``_checks.check_decode_call``, the lengths', left paddings' and pages' values read once) and planned
    (``plan.decode_plan_for``).
    """
    q = tensors[0]
    keys = ()
    plan = None
    key = _decode_key(*tensors, options)
    if key is not None:
        try:
            plan = PLANS.plans.get(key)
        except TypeError:  # an unhashable option (a window given as a list): no plan kept for this call
            key = None
    if plan is None and key is not None:
        # A one-token call, q (B, H_q, D), is planned as its (B, H_q, 1, D) view, whose key finds the plan too.
        keys = (key, _decode_key(q.unsqueeze(2), *tensors[1:], options)) if q.dim() == 3 else (key,)
    if plan is None or lengths is not None:
        checked = _checks.check_decode_call(tensors, options, lengths, kept=plan, capturing=_capturing(q))
    if plan is None:
        return decode_plan_for(keys, tensors, options, checked)
    return plan.run(tensors)


def _capturing(q) -> bool:
    """Whether a CUDA graph is being captured on q's device: its calls run later, so no value can be read now."""
    return isinstance(q, torch.Tensor) and q.device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def _describable_decode(options: tuple) -> bool:
    """Whether a decode call's options can stand in its plan's key: True == 1 == 1.0 as keys, so a bool where a
    number goes (refused by the checks) or a window of floats would find the plan of a valid call and skip the
    check that refuses it. Such calls keep no plan and are checked in full."""
    scale, num_splits, window, softcap = options[:4]
    if scale.__class__ is bool or num_splits.__class__ is bool or softcap.__class__ is bool:
        return False
    return window is None or (window.__class__ is tuple and len(window) == 2 and window[0].__class__ is int
                              and window[1].__class__ is int)


def _decode_key(q, k_cache, v_cache, cache_seqlens, block_table, k_scale, v_scale, alibi_slopes, cache_leftpad,
                options):
    """A decode call's description, its plan's key (None on the interpreter, whose calls are not kept): every
    tensor's layout (shape, strides, dtype, device, 16-byte alignment: what Triton specialises on), None for an
    absent one, and every option. An argument that is not a tensor gives None too: the checks then say what was
    expected. Written out flat, as the attention call's: it is built on every call (the device as
    ``get_device()``, an int: only CUDA calls are kept, so no other device can share one)."""
    if not isinstance(q, torch.Tensor) or q.device.type != "cuda" or not _describable_decode(options):
        return None
    try:
        key = ("decode", q.shape, q.stride(), k_cache.shape, k_cache.stride(), v_cache.shape, v_cache.stride(),
               q.dtype, k_cache.dtype, v_cache.dtype, q.get_device(), k_cache.get_device(), v_cache.get_device(),
               q.data_ptr() % 16 == 0, k_cache.data_ptr() % 16 == 0, v_cache.data_ptr() % 16 == 0, options)
        if (cache_seqlens is None and block_table is None and k_scale is None and v_scale is None
                and alibi_slopes is None and cache_leftpad is None):
            return key
        return key + tuple(t if t is None else (t.shape, t.stride(), t.dtype, t.get_device(), t.data_ptr() % 16 == 0)
                           for t in (cache_seqlens, block_table, k_scale, v_scale, alibi_slopes, cache_leftpad))
    except AttributeError:
        return None
