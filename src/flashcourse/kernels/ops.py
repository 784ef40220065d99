"""The dispatch of an attention call: one implementation per op, run eagerly by the autograd Function and, under
``torch.compile``, by the ``torch.library`` ops that keep the call in the graph.

The front door (``call.py``) hands each checked call here as a ``call.Described``. :func:`attention_forward_impl`
and :func:`attention_backward_impl` are the one forward and the one backward: they take the call's plan
(``plan.plan_for``) and launch it. Eagerly, ``flash_attention`` reaches them through
:class:`FlashAttentionFunction` (or, without grad, directly), ``flash_attention_forward`` and ``_backward``
directly; under ``torch.compile`` the custom ops ``flashcourse::attention_forward`` (-> o, lse) and
``flashcourse::attention_backward`` (-> dq, dk, dv) call the same two functions from their bodies, each op with a
fake implementation (shapes and dtypes only, what the compiler traces with) and the forward with an autograd
formula that calls the backward op. So the decision and the launch code exist once.

Why the eager call does not go through the op: the dispatcher's hop costs host time on every call. Measured on a
CPU (torch 2.13, 2026-12-06, the best of 5 x 20,000 calls of a one-tensor op): a ``torch.library.custom_op`` whose
body clones its input costs 18.8 us against 3.1 us for the same body called as a plain function, and an op made
with the low-level ``torch.library.Library.define`` and ``impl("CompositeExplicitAutograd")`` returning its input
2.8 us against 0.1 us. No registration tried costs under 1 us more than the plain call, against a whole eager
forward of about 9 us of host time (``benchmarks/host_profile.py``), so eager calls call the implementation
functions directly and only the compiler sees the ops.

Every tensor the backward needs, the ALiBi slopes, document ids and dropout seed included, is saved with
``save_for_backward``; the rest of the rules are plain numbers and strings. A ``mask_mod`` is a ``@triton.jit``
function and a ``block_mask`` a Python object holding tile lists, which an op's schema cannot carry: the front door
runs such a call eagerly, outside the graph (a graph break).
"""

# No `from __future__ import annotations`, and Optional rather than `X | None`: torch.library reads the op's schema
# from the annotations, and typing.Optional is the spelling every torch version's schema inference knows.
# ruff: noqa: UP045
from dataclasses import replace
from typing import Optional

import torch

from ..validation import check_window
from . import configs
from ._checks import (
    HEAD_SPAN_LIMIT,
    check_decode_dtypes,
    check_decode_inputs,
    check_decode_options,
    check_qkv,
    check_scale,
    head_span,
)
from .decode import DecodeSwitches
from .dropout import Dropout
from .plan import plan_for
from .rules import Rules, check_alibi_slopes, check_softcap


class _OpCall:
    """The ``call.Described`` an op's body makes of its flat arguments (the front door checked them while the
    compiler traced): the description is the op's own key in ``plan.PLANS``, so a compiled call's plan is made once
    too; the device's properties and what the numbered versions lack are asked by :func:`_plan_of` at run time
    (tracing could not read the device)."""

    __slots__ = ("call", "plan", "rules", "lacks", "props", "block_mask", "scale", "enable_gqa",
                 "forward_version", "backward_version", "dropout")

    def __init__(self, q, k, v, rules: Rules, scale, enable_gqa, forward_version, backward_version, dropout):
        cacheable = rules.alibi_slopes is None and rules.document_ids is None
        self.call = (("op", q.shape, q.stride(), k.shape, k.stride(), v.shape, v.stride(), q.dtype, q.device,
                      q.data_ptr() % 16 == 0, k.data_ptr() % 16 == 0, v.data_ptr() % 16 == 0), rules.causal,
                     rules.window, rules.softcap, scale, enable_gqa, forward_version, backward_version,
                     rules.dropout_p) if cacheable else None
        self.plan = self.lacks = self.props = self.block_mask = None  # props None: asked by _plan_of
        self.rules, self.scale, self.enable_gqa, self.dropout = rules, scale, enable_gqa, dropout
        self.forward_version, self.backward_version = forward_version, backward_version


def _op_call(q, k, v, alibi_slopes, document_ids, causal, window_left, window_right, softcap, scale, enable_gqa,
             forward_version, backward_version, dropout_p, dropout_seed) -> _OpCall:
    """The op's flat arguments back into a described call; causal "" and window (-1, -1) are none."""
    window = None if (window_left, window_right) == (-1, -1) else (window_left, window_right)
    rules = Rules(causal=causal or None, window=window, softcap=softcap, alibi_slopes=alibi_slopes,
                  document_ids=document_ids, dropout_p=dropout_p or None)
    dropout = None if rules.dropout_p is None else Dropout(rules.dropout_p, dropout_seed)
    return _OpCall(q, k, v, rules, scale, enable_gqa, forward_version, backward_version, dropout)


def _plan_of(described, q, k, v):
    """The plan of a call whose description found none: ``plan.plan_for``'s. An op's body under ``torch.compile``
    comes without the device's properties, which tracing could not read, and without what the numbered versions
    lack: asked here, at run time."""
    props, lacks = described.props, described.lacks
    if props is None:
        props = configs.device_props(q.device)
        lacks = described.rules.missing_in_numbered_version(k.shape[1] != q.shape[1], q.shape[2], k.shape[2])
    return plan_for(described, q, k, v, props, lacks, in_graph=isinstance(described, _OpCall))


def attention_forward_impl(q, k, v, described) -> tuple:
    """(plan, o, lse): the one forward, eager or compiled."""
    plan = described.plan
    if plan is None:
        plan = _plan_of(described, q, k, v)
    o, lse = plan.forward(q, k, v, described.rules, described.block_mask, described.dropout)
    return plan, o, lse


def attention_backward_impl(q, k, v, o, lse, do, described, dlse=None) -> tuple:
    """(dq, dk, dv): the one backward, eager or compiled, from the forward's (o, lse); ``dlse``, the lse's gradient
    where a loss used it, or None."""
    plan = described.plan
    if plan is None:
        plan = _plan_of(described, q, k, v)
    return plan.backward(q, k, v, o, lse, do, described.rules, described.block_mask, described.dropout, dlse=dlse)


def dispatch_attention(q, k, v, described, return_lse: bool, tracing: bool):
    """``flash_attention``'s dispatch: the op while ``torch.compile`` traces; eagerly the autograd Function where a
    gradient is wanted, else the forward alone (no autograd node)."""
    if tracing:
        o, lse = _in_graph(q, k, v, described, lse_grad=return_lse)
        return (o, lse) if return_lse else o
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        rules, dropout = described.rules, described.dropout
        if (described.block_mask is None and not return_lse and rules.alibi_slopes is None
                and rules.document_ids is None and dropout is None):
            return FlashAttentionFunction.apply(q, k, v, _Opaque(described), None)  # the usual call: five arguments
        kept = described._replace(rules=replace(rules, alibi_slopes=None, document_ids=None), dropout=None)
        return FlashAttentionFunction.apply(q, k, v, _Opaque(kept), (rules.alibi_slopes, rules.document_ids,
                                                                     None if dropout is None else dropout.seed,
                                                                     return_lse))
    _, o, lse = attention_forward_impl(q, k, v, described)
    return (o, lse) if return_lse else o


def dispatch_forward(q, k, v, described, *, tracing: bool):
    """``flash_attention_forward``'s dispatch: (o, lse), the op while ``torch.compile`` traces."""
    if tracing:
        return _in_graph(q, k, v, described)
    _, o, lse = attention_forward_impl(q, k, v, described)
    return o, lse


def dispatch_backward(q, k, v, o, lse, do, described, *, tracing: bool):
    """``flash_attention_backward``'s dispatch: (dq, dk, dv), the backward op while ``torch.compile`` traces."""
    if tracing:
        rules, dropout = described.rules, described.dropout
        scale = None if described.scale is None else float(described.scale)
        return attention_backward(q, k, v, o, lse, do, *flat_rules(rules), scale, described.enable_gqa,
                                  described.backward_version, dropout_p=rules.dropout_p or 0.0,
                                  dropout_seed=None if dropout is None else dropout.seed)
    return attention_backward_impl(q, k, v, o, lse, do, described)


class _Opaque:
    """The described call as one opaque argument of ``FlashAttentionFunction.apply``, which maps over its arguments'
    pytrees on every call (to unwrap functorch's tensors): a NamedTuple is a pytree node, and walking it and its
    description cost the training step about 1.5 us of host time (``benchmarks/host_profile.py``)."""

    __slots__ = ("described",)

    def __init__(self, described):
        self.described = described


class FlashAttentionFunction(torch.autograd.Function):
    """Saves (q, k, v, o, lse) and the rules' tensors in the forward; the backward recomputes P from them (no N x N
    matrix) through the forward's plan, which prepares its launches on first use.

    ``apply(q, k, v, _Opaque(described), tensors)``: ``tensors`` is None for the usual call (no tensor in its rules, no
    block mask, no dropout, o alone returned), else (alibi_slopes, document_ids, dropout seed, return_lse), with
    ``described`` holding the rules without those tensors. Autograd's own work grows with the number of
    arguments, so the usual call passes five. The tensors are saved with ``save_for_backward``, never kept on ctx.

    With ``return_lse`` the lse is differentiable (as FlexAttention's): its gradient enters the backward's
    preprocess, delta = rowsum(dO * O) - dLSE, since d lse_i / d s_ij = P_ij. The backward itself has no
    derivative: a backward with ``create_graph=True`` raises a RuntimeError at once (SDPA's flash backend raises
    for a double backward too), instead of gradients whose own gradients would be wrong or silently zero."""

    @staticmethod
    def forward(ctx, q, k, v, opaque: _Opaque, tensors):
        described = opaque.described
        if tensors is None:
            plan, o, lse = attention_forward_impl(q, k, v, described)
            ctx.save_for_backward(q, k, v, o, lse)
            ctx.described = described if described.plan is not None else described._replace(plan=plan)
            ctx.with_tensors = False
            return o
        alibi_slopes, document_ids, seed, return_lse = tensors
        rules = described.rules
        call = described._replace(rules=_with_tensors(rules, alibi_slopes, document_ids),
                                  dropout=None if seed is None else Dropout(rules.dropout_p, seed))
        plan, o, lse = attention_forward_impl(q, k, v, call)
        ctx.save_for_backward(q, k, v, o, lse, alibi_slopes, document_ids, seed)  # None where there is no tensor
        ctx.described = described._replace(plan=plan)  # its rules without tensors
        ctx.with_tensors = True
        if not return_lse:  # one output: the usual call pays for no second one
            return o
        ctx.set_materialize_grads(False)  # an unused output's gradient comes as None, no zeros allocated
        return o, lse

    @staticmethod
    def backward(ctx, do, dlse=None):
        if torch.is_grad_enabled():  # autograd runs a backward with grad mode on only for create_graph=True
            raise RuntimeError("flash_attention has no double backward: its gradients cannot be differentiated "
                               "again, so a backward with create_graph=True (a gradient penalty, Hessian-vector "
                               "products) is refused. Compute that term with reference attention in float64 or "
                               "F.scaled_dot_product_attention's math backend")
        if do is None and dlse is None:
            return None, None, None, None, None
        described = ctx.described
        if ctx.with_tensors:
            q, k, v, o, lse, alibi_slopes, document_ids, seed = ctx.saved_tensors
            rules = described.rules
            described = described._replace(rules=_with_tensors(rules, alibi_slopes, document_ids),
                                           dropout=None if seed is None else Dropout(rules.dropout_p, seed))
        else:
            q, k, v, o, lse = ctx.saved_tensors
        if do is None:  # only the lse is in the loss: o's gradient is 0
            do = torch.zeros_like(o)
        elif do.stride() != o.stride() and head_span(do) >= HEAD_SPAN_LIMIT:
            do = do.contiguous()  # a gradient laid out wider than the kernels index inside a head: spans what o does
        dq, dk, dv = attention_backward_impl(q, k, v, o, lse, do, described, dlse)
        return dq, dk, dv, None, None


def _with_tensors(rules: Rules, alibi_slopes, document_ids) -> Rules:
    """The rules with their saved tensors put back."""
    if alibi_slopes is None and document_ids is None:
        return rules
    return replace(rules, alibi_slopes=alibi_slopes, document_ids=document_ids)


@torch.library.custom_op("flashcourse::attention_forward", mutates_args=())
def attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, alibi_slopes: Optional[torch.Tensor],
                      document_ids: Optional[torch.Tensor], causal: str, window_left: int, window_right: int,
                      softcap: Optional[float], scale: Optional[float], enable_gqa: bool,
                      forward_version: Optional[str], backward_version: Optional[str], lse_grad: bool = False,
                      dropout_p: float = 0.0, dropout_seed: Optional[torch.Tensor] = None
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    described = _op_call(q, k, v, alibi_slopes, document_ids, causal, window_left, window_right, softcap, scale,
                         enable_gqa, forward_version, backward_version, dropout_p, dropout_seed)
    _, o, lse = attention_forward_impl(q, k, v, described)
    return o, lse


@attention_forward.register_fake
def _attention_forward_fake(q, k, v, alibi_slopes, document_ids, causal, window_left, window_right, softcap, scale,
                            enable_gqa, forward_version, backward_version, lse_grad=False, dropout_p=0.0,
                            dropout_seed=None):
    check_qkv(q, k, v)  # while tracing: the compiled call refuses what the eager one does
    batch, heads, n_q, _ = q.shape
    # As the kernels allocate them: o like q (strides too), lse (B, H_q, N_q) float32 contiguous.
    return torch.empty_like(q), q.new_empty((batch, heads, n_q), dtype=torch.float32)


@torch.library.custom_op("flashcourse::attention_backward", mutates_args=())
def attention_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
                       do: torch.Tensor, alibi_slopes: Optional[torch.Tensor], document_ids: Optional[torch.Tensor],
                       causal: str, window_left: int, window_right: int, softcap: Optional[float],
                       scale: Optional[float], enable_gqa: bool, backward_version: Optional[str],
                       dlse: Optional[torch.Tensor] = None, dropout_p: float = 0.0,
                       dropout_seed: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    described = _op_call(q, k, v, alibi_slopes, document_ids, causal, window_left, window_right, softcap, scale,
                         enable_gqa, None, backward_version, dropout_p, dropout_seed)
    dq, dk, dv = attention_backward_impl(q, k, v, o, lse, do, described, dlse)
    # The fake promises q's, k's and v's strides (a compiler may check them); b2, b4 and b5 build dq contiguous.
    if dq.stride() != q.stride():
        dq = torch.empty_like(q).copy_(dq)
    return dq, dk, dv


@attention_backward.register_fake
def _attention_backward_fake(q, k, v, o, lse, do, alibi_slopes, document_ids, causal, window_left, window_right,
                             softcap, scale, enable_gqa, backward_version, dlse=None, dropout_p=0.0,
                             dropout_seed=None):
    check_qkv(q, k, v)
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup_context(ctx, inputs, output):
    (q, k, v, alibi_slopes, document_ids, causal, window_left, window_right, softcap, scale, enable_gqa, _,
     backward_version, lse_grad, dropout_p, dropout_seed) = inputs
    o, lse = output
    # None where a rule has no tensor; the dropout seed is the forward's, so the backward regenerates its mask
    ctx.save_for_backward(q, k, v, o, lse, alibi_slopes, document_ids, dropout_seed)
    ctx.options = (causal, window_left, window_right, softcap, scale, enable_gqa, backward_version, dropout_p)
    ctx.lse_grad = lse_grad
    if not lse_grad:  # a call that does not return the lse: its (zero) gradient is not passed on
        ctx.mark_non_differentiable(lse)


def _backward(ctx, do, dlse):
    q, k, v, o, lse, alibi_slopes, document_ids, dropout_seed = ctx.saved_tensors
    causal, window_left, window_right, softcap, scale, enable_gqa, backward_version, dropout_p = ctx.options
    # The returned lse is differentiable (return_lse=True): its gradient enters delta (plan.Plan.backward).
    dq, dk, dv = attention_backward(q, k, v, o, lse, do, alibi_slopes, document_ids, causal, window_left,
                                    window_right, softcap, scale, enable_gqa, backward_version,
                                    dlse if ctx.lse_grad else None, dropout_p, dropout_seed)
    return dq, dk, dv, None, None, None, None, None, None, None, None, None, None, None, None, None


attention_forward.register_autograd(_backward, setup_context=_setup_context)


def flat_rules(rules: Rules) -> tuple:
    """The rules as the ops' flat arguments: (alibi_slopes, document_ids, causal, window_left, window_right,
    softcap); causal None is "" and window None is (-1, -1)."""
    window_left, window_right = rules.window if rules.window is not None else (-1, -1)
    return rules.alibi_slopes, rules.document_ids, rules.causal or "", window_left, window_right, rules.softcap


def _in_graph(q, k, v, described, lse_grad: bool = False):
    """The forward as the compiler sees it: one ``attention_forward`` op (and its backward op); (o, lse), the lse
    differentiable with ``lse_grad`` (a call with return_lse=True). The dropout seed was drawn outside the op (a
    random op the graph keeps)."""
    rules, dropout = described.rules, described.dropout
    scale = None if described.scale is None else float(described.scale)
    return attention_forward(q, k, v, *flat_rules(rules), scale, described.enable_gqa, described.forward_version,
                             described.backward_version, lse_grad, rules.dropout_p or 0.0,
                             None if dropout is None else dropout.seed)


# ------------------------------------------------------------------------------------------ decode
@torch.library.custom_op("flashcourse::decode", mutates_args=())
def decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, cache_seqlens: Optional[torch.Tensor],
           block_table: Optional[torch.Tensor], k_scale: Optional[torch.Tensor], v_scale: Optional[torch.Tensor],
           alibi_slopes: Optional[torch.Tensor], cache_leftpad: Optional[torch.Tensor], scale: Optional[float],
           num_splits: Optional[int], window_left: int, window_right: int, softcap: Optional[float],
           block_n: Optional[int], num_warps: Optional[int], num_stages: Optional[int], causal: bool = True,
           programs_per_sm: Optional[int] = None, mask_tail_only: Optional[bool] = None) -> torch.Tensor:
    """``flash_decode`` as one op of a compiled graph; the window as two ints, (-1, -1) for none; the switches as
    their two fields (None: chosen per call). Its body is the eager call's (``call.decode_eager``)."""
    from .call import decode_eager  # call.py imports this module: the front door hands its calls here

    window = None if (window_left, window_right) == (-1, -1) else (window_left, window_right)
    tensors = (q, k_cache, v_cache, cache_seqlens, block_table, k_scale, v_scale, alibi_slopes, cache_leftpad)
    switches = (None if (programs_per_sm, mask_tail_only) == (None, None)
                else DecodeSwitches(programs_per_sm, mask_tail_only))
    return decode_eager(tensors, (scale, num_splits, window, softcap, block_n, num_warps, num_stages, switches,
                                  causal))


@decode.register_fake
def _decode_fake(q, k_cache, v_cache, cache_seqlens, block_table, k_scale, v_scale, alibi_slopes, cache_leftpad,
                 scale, num_splits, window_left, window_right, softcap, block_n, num_warps, num_stages, causal=True,
                 programs_per_sm=None, mask_tail_only=None):
    # While tracing: the compiled call refuses what the eager one does, but for the lengths' and left paddings'
    # values (no values exist here; the kernel clamps them).
    check_decode_inputs(q, k_cache, v_cache, cache_seqlens, block_table, k_scale, v_scale, cache_leftpad)
    check_decode_dtypes(q, k_cache)
    check_softcap(softcap)
    check_alibi_slopes(alibi_slopes, q)
    check_scale(scale)
    check_decode_options(num_splits, block_n, num_warps, num_stages, None, causal)
    return torch.empty_like(q)


def decode_in_graph(tensors: tuple, options: tuple) -> torch.Tensor:
    """``flash_decode`` as the compiler sees it: the ``flashcourse::decode`` op, its options checked here (the
    tensors in the op's fake implementation)."""
    scale, num_splits, window, softcap, block_n, num_warps, num_stages, switches, causal = options
    check_decode_options(num_splits, block_n, num_warps, num_stages, switches, causal)
    window = check_window(window)
    window_left, window_right = window if window is not None else (-1, -1)
    programs_per_sm, mask_tail_only = switches if switches is not None else (None, None)
    return decode(*tensors, scale, num_splits, window_left, window_right, softcap, block_n, num_warps, num_stages,
                  causal, programs_per_sm, mask_tail_only)
