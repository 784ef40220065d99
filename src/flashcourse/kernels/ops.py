"""The attention kernels as ``torch.library`` ops, so that ``torch.compile(model, fullgraph=True)`` keeps them.

Two custom ops, ``flashcourse::attention_forward`` (-> o, lse) and ``flashcourse::attention_backward``
(-> dq, dk, dv), each with a fake implementation (shapes and dtypes only, what the compiler traces with) and the
forward with an autograd formula that calls the backward op. Every tensor the backward needs, the ALiBi slopes
and document ids included, is saved with ``save_for_backward``; the rest of the rules are plain numbers and
strings. ``kernels.flash_attention``, ``flash_attention_forward`` and ``flash_attention_backward`` route here only
while compiling: eager calls keep the plan (``plan.py``) and ``FlashAttentionFunction`` (the comment in
``flash_attention`` says why). Both ops run through the same plans as eager calls, so they dispatch the same way.

A ``mask_mod`` is a ``@triton.jit`` function and a ``block_mask`` a Python object holding tile lists, which an op's
schema cannot carry: the entry points run such a call eagerly, outside the graph (a graph break).
"""

# No `from __future__ import annotations`, and Optional rather than `X | None`: torch.library reads the op's schema
# from the annotations, and typing.Optional is the spelling every torch version's schema inference knows.
# ruff: noqa: UP045
from typing import Optional

import torch

from ._checks import check_qkv
from .dropout import Dropout
from .plan import plan_for
from .rules import Rules


def _options(causal: str, window_left: int, window_right: int, softcap: Optional[float],
             alibi_slopes: Optional[torch.Tensor], document_ids: Optional[torch.Tensor], dropout_p: float) -> dict:
    """The op's flat arguments back into the call's options; causal "" and window (-1, -1) are none."""
    window = None if (window_left, window_right) == (-1, -1) else (window_left, window_right)
    return dict(causal=causal or False, window=window, softcap=softcap, alibi_slopes=alibi_slopes,
                document_ids=document_ids, dropout_p=dropout_p)


def _dropout(rules: Rules, dropout_seed: Optional[torch.Tensor]) -> Optional[Dropout]:
    """The call's dropout for the kernels: its probability with the seed the entry point drew."""
    return None if rules.dropout_p is None else Dropout(rules.dropout_p, dropout_seed)


@torch.library.custom_op("flashcourse::attention_forward", mutates_args=())
def attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, alibi_slopes: Optional[torch.Tensor],
                      document_ids: Optional[torch.Tensor], causal: str, window_left: int, window_right: int,
                      softcap: Optional[float], scale: Optional[float], enable_gqa: bool,
                      forward_version: Optional[str], backward_version: Optional[str], lse_grad: bool = False,
                      dropout_p: float = 0.0, dropout_seed: Optional[torch.Tensor] = None
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    plan, rules = plan_for(q, k, v, **_options(causal, window_left, window_right, softcap, alibi_slopes,
                                               document_ids, dropout_p), scale=scale, enable_gqa=enable_gqa,
                           forward_version=forward_version, backward_version=backward_version)
    return plan.forward(q, k, v, rules, None, _dropout(rules, dropout_seed))


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
    plan, rules = plan_for(q, k, v, **_options(causal, window_left, window_right, softcap, alibi_slopes,
                                               document_ids, dropout_p), scale=scale, enable_gqa=enable_gqa,
                           backward_version=backward_version)
    dq, dk, dv = plan.backward(q, k, v, o, lse, do, rules, None, _dropout(rules, dropout_seed), dlse=dlse)
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


def attention_in_graph(q, k, v, rules: Rules, scale, enable_gqa, forward_version, backward_version,
                       lse_grad: bool = False, dropout_seed=None):
    """``flash_attention`` as the compiler sees it: one ``attention_forward`` op (and its backward op); (o, lse),
    the lse differentiable with ``lse_grad`` (a call with return_lse=True). ``dropout_seed``: the (1,) int64
    seed drawn outside the op (a random op the graph keeps), where the rules have a dropout_p."""
    return attention_forward(q, k, v, *flat_rules(rules), scale, enable_gqa, forward_version, backward_version,
                             lse_grad, rules.dropout_p or 0.0, dropout_seed)
