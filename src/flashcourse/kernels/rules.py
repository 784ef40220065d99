"""Attention variants as rules: which keys a query sees, and how a score changes before the softmax.

One diagonal per call. With N_q queries and N_k keys, query ``i`` sits at key position ``i + shift``, where

- ``shift = 0`` with ``causal="top_left"`` (or ``True``, as SDPA's ``is_causal``): the first query lines up with
  the first key;
- ``shift = N_k - N_q`` with ``causal="bottom_right"`` and with ``causal=False``: the last query lines up with
  the last key (the FlashAttention library's alignment, what a chunk of new tokens after a KV cache needs).

Every positional option is measured from that one diagonal (with N_q = N_k the two coincide):

- causal: key ``j`` visible when ``j <= i + shift``;
- ``window=(left, right)``: when ``i + shift - left <= j <= i + shift + right``, ``-1`` = unbounded on that
  side (the FlashAttention library's ``window_size``, Dao 2023, flash-attn 2.3);
- ``document_ids`` (B, N): when query and key carry the same id (sequences packed into one row);
- ``mask_mod(b, h, q_idx, kv_idx) -> bool``: a ``@triton.jit`` function, FlexAttention's signature (Dong et al.
  2024);

all combined by AND. Scores ``s = scale * q.k`` become ``softcap * tanh(s / softcap)`` (Gemma 2, Gemma Team
2024, section 2) and then get the ALiBi bias ``-slope_h * |i + shift - j|`` (Press et al. 2022).

The two bounds on ``j - i`` that causal and window give are what the kernels use to skip and classify tiles
without looking at them (:meth:`Rules.key_bounds`); documents and ``mask_mod`` need a block mask.

A ``mask_mod`` is a pure function of its four arguments: Triton captures the globals it reads as constants. So
:func:`mask_mod_reads` can tell from its source alone whether the mask differs between batch rows (the body reads
its first parameter) and between heads (its second): a prefix-LM or a sliding chunk reads neither and is one mask
for every (b, h), which the block mask then classifies once instead of B * H times.
"""

from __future__ import annotations

import ast
import functools
import inspect
import math
import textwrap
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import NamedTuple

import torch
from triton.runtime.jit import KernelInterface

from ..validation import check_window, foreign_number_hint, shown_number  # the reference's window rule, written once
from .dropout import check_dropout_p

CAUSAL_VALUES = (False, True, "top_left", "bottom_right")


@dataclass(frozen=True, eq=False)  # eq=False: tensors inside have no truth value for ==
class Rules:
    """The variant options of one attention call, checked. All None (and causal None) is plain attention."""

    causal: str | None = None  # None, "top_left" or "bottom_right"
    window: tuple[int, int] | None = None  # (left, right), -1 = unbounded; never (-1, -1), that is None
    softcap: float | None = None
    alibi_slopes: torch.Tensor | None = None  # (H_q,) float32
    document_ids: torch.Tensor | None = None  # (B, N) integer
    mask_mod: Callable | None = None  # @triton.jit (b, h, q_idx, kv_idx) -> bool
    dropout_p: float | None = None  # in (0, 1); None is no dropout (kernels/dropout.py: the mask, the seed)

    @property
    def needs_block_mask(self) -> bool:
        """Documents and mask_mod can only be classified per tile by looking at the tile (``blockmask.py``,
        per call or once ahead with ``kernels.create_block_mask``)."""
        return self.document_ids is not None or self.mask_mod is not None

    def mask_extent(self, batch: int, heads: int) -> tuple[int, int]:
        """(B_mask, H_mask): how many batch rows and heads the block mask of these rules must tell apart, 1 where
        it is the same on every one. Documents differ per batch row; a ``mask_mod`` differs per row or head only
        where it reads b or h (:func:`mask_mod_reads`); causal and window bounds never do."""
        reads = mask_mod_reads(self.mask_mod) if self.mask_mod is not None else MaskReads(batch=False, head=False)
        return (batch if self.document_ids is not None or reads.batch else 1), (heads if reads.head else 1)

    @property
    def has_score_mod(self) -> bool:
        return self.softcap is not None or self.alibi_slopes is not None

    def shift(self, n_q: int, n_kv: int) -> int:
        """The call's diagonal: query ``i`` sits at key position ``i + shift`` (0 for top-left causal, else the
        bottom-right ``n_kv - n_q``). The causal mask, the window and ALiBi's distance all measure from it."""
        return 0 if self.causal == "top_left" else n_kv - n_q

    def key_bounds(self, n_q: int, n_kv: int) -> tuple[int | None, int | None]:
        """(upper, lower): query ``i`` sees keys ``i + lower <= j <= i + upper`` (None = no bound on that side).

        A window side longer than the sequences is clamped to one that already reaches every key (upper at most
        n_kv, lower at least -n_q): the kernels add the bounds to row and key indices in 32 bits, where a side
        near 2**31 wrapped and hid keys it should have shown."""
        shift = self.shift(n_q, n_kv)
        uppers, lower = [], None
        if self.causal is not None:
            uppers.append(shift)
        if self.window is not None:
            left, right = self.window
            if right >= 0:
                uppers.append(min(shift + right, n_kv))
            if left >= 0:
                lower = max(shift - left, -n_q)
        return (min(uppers) if uppers else None), lower

    def missing_in_numbered_version(self, gqa: bool, n_q: int, n_kv: int) -> str | None:
        """What the numbered versions v1-v6, b1, b2, b4, b5 (plain or top-left causal attention) cannot do, or None."""
        if gqa:
            return "grouped-query attention (k and v with fewer heads than q)"
        if self.causal == "bottom_right" and n_q != n_kv:
            return "bottom-right causal alignment"
        for present, what in ((self.window is not None, "sliding window"), (self.softcap is not None, "softcap"),
                              (self.alibi_slopes is not None, "ALiBi (alibi_slopes)"),
                              (self.document_ids is not None, "document masking (document_ids)"),
                              (self.mask_mod is not None, "mask_mod"),
                              (self.dropout_p is not None, "dropout (dropout_p)")):
            if present:
                return what
        return None


DENSE = Rules()
TOP_LEFT_CAUSAL = Rules(causal="top_left")


def causal_alignment(causal) -> str | None:
    """``causal`` as None, "top_left" or "bottom_right" (True is "top_left"); other values raise."""
    if causal is False or causal is None:
        return None
    if causal is True or causal == "top_left":
        return "top_left"
    if causal == "bottom_right":
        return "bottom_right"
    raise ValueError(f"causal is {causal!r}: expected one of {CAUSAL_VALUES} "
                     "(True = 'top_left', as SDPA's is_causal; 'bottom_right' aligns the last query with the last key)")


# The softcaps taken. Past 2.35e38, softcap * log2(e) is inf in float32; and from about 1e31 the kernels'
# score / (softcap * log2(e)) is a subnormal number for scores of a few units, which a GPU may flush to zero. Up
# to 1e30, softcap * tanh(s / softcap) differs from s by s^3 / (3 softcap^2), under float32's rounding for every
# |s| < 1e26: the cap is then no cap, and None says so exactly. At the other end, 1e-300 is 0 in float32 and a
# score of 0 became 0 / 0 = NaN; below 1e-30 every capped score is 0 to float32's rounding anyway.
MIN_SOFTCAP, MAX_SOFTCAP = 1e-30, 1e30


def check_softcap(softcap) -> float | None:
    if softcap is None:
        return None
    if isinstance(softcap, bool) or not isinstance(softcap, (int, float)):
        raise TypeError(f"softcap is {softcap!r} ({type(softcap).__name__}): expected a positive number, "
                        "e.g. softcap=30.0 (Gemma 2's attention cap is 50)" + foreign_number_hint("softcap", softcap))
    if not 0 < softcap < math.inf:  # False for nan; a Python int of any size compares exactly
        raise ValueError(f"softcap is {shown_number(softcap)}: expected a finite number > 0 (scores become "
                         "softcap * tanh(score / softcap)); pass None for no cap")
    if softcap > MAX_SOFTCAP:
        raise ValueError(f"softcap is {shown_number(softcap)}: expected at most {MAX_SOFTCAP:g}. The kernels hold "
                         "the cap in float32 (past 2.35e38 it is inf, and every score NaN), and a cap this large "
                         "changes no score below 1e26 by as much as float32 resolves: pass None for no cap")
    if softcap < MIN_SOFTCAP:
        raise ValueError(f"softcap is {softcap:g}: expected at least {MIN_SOFTCAP:g}. The kernels hold the cap in "
                         "float32 (1e-300 is 0 there, and a score of 0 became 0 / 0 = NaN), and a cap this small "
                         "makes every score 0 to float32's rounding: uniform weights over the visible keys")
    return float(softcap)


def check_alibi_slopes(slopes, q: torch.Tensor) -> torch.Tensor | None:
    if slopes is None:
        return None
    heads = q.shape[1]
    if not isinstance(slopes, torch.Tensor):
        raise TypeError(f"alibi_slopes is a {type(slopes).__name__}: expected a torch.Tensor of shape ({heads},) "
                        "float32, one slope per query head")
    if tuple(slopes.shape) != (heads,) or slopes.dtype != torch.float32:
        raise ValueError(f"alibi_slopes has shape {tuple(slopes.shape)} and dtype {slopes.dtype}: expected "
                         f"({heads},) float32, one slope per query head (q has {heads} heads)")
    if slopes.device != q.device:
        raise ValueError(f"alibi_slopes is on {slopes.device}, q on {q.device}: move it with .to(q.device)")
    if slopes.requires_grad and torch.is_grad_enabled():  # else its gradient would be missing without a word
        raise ValueError("alibi_slopes requires grad, but the kernels take the slopes as constants (as flash-attn "
                         "does): no gradient reaches them. Pass alibi_slopes.detach() (fixed slopes, Press et al. "
                         "2022), or use a float64 reference to learn them")
    return slopes.contiguous()


def _document_ids(ids, batch: int | None, n_q: int, n_kv: int, device: torch.device) -> torch.Tensor | None:
    """``batch`` None (a block mask for any batch): the ids' own batch."""
    if ids is None:
        return None
    if not isinstance(ids, torch.Tensor):
        raise TypeError(f"document_ids is a {type(ids).__name__}: expected a torch.Tensor of shape (B, N) "
                        "with an integer document id per position")
    if n_q != n_kv:
        raise ValueError(f"document_ids needs as many queries as keys, but N_q = {n_q} and N_k = {n_kv}: "
                         "packed documents share one position axis")
    batch = ids.shape[0] if batch is None and ids.dim() == 2 else batch
    if tuple(ids.shape) != (batch, n_q) or ids.dtype not in (torch.int32, torch.int64, torch.int16):
        raise ValueError(f"document_ids has shape {tuple(ids.shape)} and dtype {ids.dtype}: expected "
                         f"({'B' if batch is None else batch}, {n_q}) int32 or int64, one document id per position")
    if ids.device != device:
        raise ValueError(f"document_ids is on {ids.device}, but the attention runs on {device}: move it with "
                         f".to({str(device)!r})")
    if ids.dtype == torch.int64:  # hash-like ids past int32 would be truncated, and two documents merge
        return document_ranks(ids).contiguous()  # the ranks come laid out as the ids; the kernels read rows
    return ids.to(torch.int32).contiguous()


def document_ranks(ids: torch.Tensor) -> torch.Tensor:
    """(B, N) integer ids as (B, N) int32 ranks: each id's rank among its row's distinct ids. The kernels compare
    ids only for equality within a row and the tile lists only by order, and ranks keep both exactly: int64 ids
    past int32 (hash-like) stay apart instead of being truncated into one. A sort per row, on the device, no
    value read on the host (so it traces under torch.compile)."""
    ordered, order = ids.sort(dim=-1, stable=True)
    new_id = torch.ones_like(ordered, dtype=torch.int32)
    new_id[:, 0] = 0
    new_id[:, 1:] = (ordered[:, 1:] != ordered[:, :-1]).to(torch.int32)
    return torch.empty_like(new_id).scatter_(-1, order, new_id.cumsum(-1, dtype=torch.int32))


def _mask_mod(mask_mod) -> Callable | None:
    if mask_mod is None or isinstance(mask_mod, KernelInterface):
        return mask_mod
    raise TypeError(f"mask_mod is {mask_mod!r}: expected a @triton.jit function mask_mod(b, h, q_idx, kv_idx) "
                    "-> bool (FlexAttention's signature; the indices arrive as broadcastable tiles)")


class MaskReads(NamedTuple):
    """Which of its first two arguments a ``mask_mod`` reads: the batch row (b) and the head (h)."""

    batch: bool
    head: bool


READS_BOTH = MaskReads(batch=True, head=True)  # what nothing can be proved about


@functools.lru_cache(maxsize=256)  # keyed by the function itself (Triton's hash of its source, then identity)
def mask_mod_reads(mask_mod) -> MaskReads:
    """Whether the body of ``mask_mod(b, h, q_idx, kv_idx)`` reads its first parameter (the batch row) and its
    second (the head), from its source.

    Any appearance of the name in the body counts, passing it on to another function included, so a True may be
    a mask that does not really change with b or h, but a False is always safe: the function never sees the
    value, and what else it reads are constants, so its mask is the same on every batch row (or head). Where the
    source cannot be read or the parameters are not plain names, both count as read (the safe answer)."""
    source = _jit_source(mask_mod)
    if source is None:
        return READS_BOTH
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return READS_BOTH
    function = next((node for node in tree.body if isinstance(node, ast.FunctionDef)), None)
    if function is None:
        return READS_BOTH
    params = [arg.arg for arg in (*function.args.posonlyargs, *function.args.args)]
    if len(params) < 2:  # b or h would arrive in *args, whose reads are not traced
        return READS_BOTH
    used = {node.id for statement in function.body for node in ast.walk(statement) if isinstance(node, ast.Name)}
    return MaskReads(batch=params[0] in used, head=params[1] in used)


def mask_mod_constants(mask_mod, _depth: int = 0) -> tuple:
    """The module-level values a ``mask_mod`` reads, as ((name, value), ...) in name order, and those of the
    ``@triton.jit`` helpers it calls (two levels down): what, besides its arguments, decides its mask.

    Kept tile lists are keyed by them, so a rule reading ``WINDOW = 256`` is classified again once a notebook
    sets ``WINDOW = 512`` (the interpreter would run the new value against the old lists: a silently wrong
    mask). Values that are not plain numbers, strings or ``tl.constexpr`` (modules, ``tl`` itself) enter by
    identity. The names come from the source once (:func:`_global_names`); each call only looks their values up."""
    names, namespace = _global_names(mask_mod), _jit_globals(mask_mod)
    if names is None or namespace is None:
        return (("<unreadable>", id(mask_mod)),)
    found = []
    for name in (name for name in names if name in namespace):
        value = namespace[name]
        value = getattr(value, "value", value) if type(value).__name__ == "constexpr" else value
        if isinstance(value, (bool, int, float, str)):
            found.append((name, value))
        elif isinstance(value, KernelInterface) and value is not mask_mod and _depth < 2:
            found.append((name, mask_mod_constants(value, _depth + 1)))
        else:
            found.append((name, id(value)))
    return tuple(found)


@functools.lru_cache(maxsize=256)
def _global_names(mask_mod) -> tuple[str, ...] | None:
    """The names a ``@triton.jit`` function's source reads, its parameters left out (None: no readable source);
    which of them its module holds is looked up on every call, so a value defined later counts too."""
    source = _jit_source(mask_mod)
    try:
        function = next(node for node in ast.parse(source or "").body if isinstance(node, ast.FunctionDef))
    except (SyntaxError, StopIteration):
        return None
    params = {arg.arg for arg in (*function.args.posonlyargs, *function.args.args)}
    return tuple(sorted({node.id for statement in function.body for node in ast.walk(statement)
                         if isinstance(node, ast.Name)} - params))


def _jit_globals(mask_mod) -> dict | None:
    """The module namespace a ``@triton.jit`` function reads its globals from (its Python function's)."""
    function = getattr(mask_mod, "fn", None)
    return getattr(function, "__globals__", None)


def _jit_source(mask_mod) -> str | None:
    """The source of a ``@triton.jit`` function: Triton's ``src`` (a compiled JITFunction, Triton 3.6 and 3.9:
    the source from ``def`` on, dedented), else the Python function's (the interpreter's InterpretedFunction keeps
    it as ``fn``), or None."""
    source = getattr(mask_mod, "src", None)
    if isinstance(source, str):
        return source
    try:
        return textwrap.dedent(inspect.getsource(mask_mod.fn))
    except (AttributeError, OSError, TypeError):
        return None


def parse_rules(q: torch.Tensor, k: torch.Tensor, *, causal=False, window=None, softcap=None, alibi_slopes=None,
                document_ids=None, mask_mod=None, dropout_p=0.0) -> Rules:
    """Check the variant options against q (B, H_q, N_q, D) and k (B, H_kv, N_k, D) and gather them: the
    options that need no tensor (:func:`parse_options`), then those that do (:func:`with_call_tensors`)."""
    options = parse_options(causal=causal, window=window, softcap=softcap, dropout_p=dropout_p)
    return with_call_tensors(options, q, k, alibi_slopes=alibi_slopes, document_ids=document_ids,
                             mask_mod=mask_mod)


def parse_options(causal=False, window=None, softcap=None, dropout_p=0.0) -> Rules:
    """The options of a call that are plain values, checked (no tensor is read: the front door asks this first,
    on every call, to describe the call). The plain call returns a shared constant after a few tests."""
    if window is None and softcap is None and type(dropout_p) is float and dropout_p == 0.0:
        if causal is False:
            return DENSE
        if causal is True:
            return TOP_LEFT_CAUSAL
    return Rules(causal=causal_alignment(causal), window=check_window(window), softcap=check_softcap(softcap),
                 dropout_p=check_dropout_p(dropout_p))


def with_call_tensors(options: Rules, q: torch.Tensor, k: torch.Tensor, *, alibi_slopes=None, document_ids=None,
                      mask_mod=None, varlen=(None, None, None, None)) -> Rules:
    """``options`` (from :func:`parse_options`) with the rules that bring tensors or code, checked against q
    (B, H_q, N_q, D) and k (B, H_kv, N_k, D): ALiBi slopes, document ids (or flash-attn's packed sequences,
    ``varlen`` = (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k), as document ids) and a ``mask_mod``."""
    if varlen[0] is not None or varlen[1] is not None:
        document_ids = varlen_document_ids(q, k, document_ids, *varlen)
    else:
        for name, longest in (("max_seqlen_q", varlen[2]), ("max_seqlen_k", varlen[3])):
            if longest is not None:  # else ignored without a word, whatever its value
                raise ValueError(f"{name} is given without cu_seqlens_q or cu_seqlens_k: it is the longest of the "
                                 "packed sequences that cu_seqlens delimits (flash-attn's varlen convention); pass "
                                 "cu_seqlens too, or drop it")
    if alibi_slopes is None and document_ids is None and mask_mod is None:
        return options
    return replace(options, alibi_slopes=check_alibi_slopes(alibi_slopes, q),
                   document_ids=_document_ids(document_ids, q.shape[0], q.shape[2], k.shape[2], q.device),
                   mask_mod=_mask_mod(mask_mod))


def parse_mask_rules(batch: int | None, n_q: int, n_kv: int, device: torch.device, *, causal=False, window=None,
                     document_ids=None, mask_mod=None) -> Rules:
    """The mask options of a block mask for (batch, n_q, n_kv) on ``device``, checked as :func:`parse_rules`
    checks a call's; they must include a rule that needs one (documents or mask_mod)."""
    ids = _document_ids(document_ids, batch, n_q, n_kv, device)
    if ids is not None and ids.data_ptr() == document_ids.data_ptr():
        # The mask's own copy: a caller that reuses its buffer (a data loader) must not change a built mask.
        ids = ids.clone()
    rules = Rules(causal=causal_alignment(causal), window=check_window(window), document_ids=ids,
                  mask_mod=_mask_mod(mask_mod))
    if not rules.needs_block_mask:
        raise ValueError("a block mask is for document_ids and mask_mod, and neither was given: causal and window "
                         "alone are classified from their bounds inside the kernels, so call flash_attention(..., "
                         "causal=..., window=...) without one")
    return rules


def causal_rules(causal) -> Rules:
    """The rules of a call that gives only ``causal`` (how the numbered versions are launched)."""
    alignment = causal_alignment(causal)
    if alignment is None:
        return DENSE
    return TOP_LEFT_CAUSAL if alignment == "top_left" else Rules(causal=alignment)


def refuse_missing(kind: str, name: str, default: str, missing: str | None) -> None:
    """A numbered teaching version asked for an option it lacks (``missing``, from
    :meth:`Rules.missing_in_numbered_version`; None: nothing): a ValueError naming it and what to use."""
    if missing is not None:
        raise ValueError(f"{kind} version {name} has no {missing}: leave the version out (the default, {default}, "
                         f"runs every option) or ask for {default}")


def varlen_document_ids(q: torch.Tensor, k: torch.Tensor, document_ids, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                        max_seqlen_k) -> torch.Tensor:
    """flash-attn's varlen convention as document ids: sequences packed along one row, q (1, H_q, total, D), and
    ``cu_seqlens_q`` (n + 1,) int32, 0 = cu[0] <= cu[1] <= ... <= cu[n] = total, sequence s holding positions
    cu[s] .. cu[s + 1] - 1. Position p's id is its sequence's index, so each sequence attends only to itself, and
    ``causal=True`` is then causal inside each sequence. ``cu_seqlens_k`` must give the same lengths (the kernels
    compare one id array for queries and keys); ``max_seqlen_q`` / ``max_seqlen_k``, which flash-attn sizes its grid
    by, are accepted and checked against the packed length only. The values of cu_seqlens are not read on the host
    (on a GPU that would wait for it; only two different tensors for q and k are compared): they must be sorted
    from 0, as flash-attn requires."""
    if document_ids is not None:
        raise ValueError("document_ids and cu_seqlens_q both given: they are two spellings of packed sequences; "
                         "pass one")
    if cu_seqlens_k is not None and cu_seqlens_q is not None and cu_seqlens_k is not cu_seqlens_q and not (
            isinstance(cu_seqlens_k, torch.Tensor) and isinstance(cu_seqlens_q, torch.Tensor)
            and cu_seqlens_k.shape == cu_seqlens_q.shape and bool(torch.equal(cu_seqlens_k, cu_seqlens_q))):
        raise ValueError("cu_seqlens_k differs from cu_seqlens_q: cross-attention lengths (each sequence's keys "
                         "fewer or more than its queries) are not supported here, where queries and keys share one "
                         "document id per position; pass the same cu_seqlens for both")
    cu = cu_seqlens_q if cu_seqlens_q is not None else cu_seqlens_k
    if not isinstance(cu, torch.Tensor) or cu.dim() != 1 or cu.dtype != torch.int32 or cu.shape[0] < 2:
        got = f"{tuple(cu.shape)} {cu.dtype}" if isinstance(cu, torch.Tensor) else type(cu).__name__
        raise ValueError(f"cu_seqlens_q is {got}: expected a (number of sequences + 1,) int32 tensor of cumulative "
                         "lengths from 0, as flash-attn's varlen functions take it")
    if cu.device != q.device:
        raise ValueError(f"cu_seqlens_q is on {cu.device}, q on {q.device}: move it with .to(q.device)")
    if q.dim() != 4 or q.shape[0] != 1 or k.shape[2] != q.shape[2]:
        raise ValueError(f"with cu_seqlens, q has shape {tuple(q.shape)} and k {tuple(k.shape)}: expected the "
                         "sequences packed along one row, q (1, H_q, total, D) and k, v (1, H_kv, total, D) (from "
                         "flash-attn's (total, H, D): x.transpose(0, 1).unsqueeze(0))")
    total = q.shape[2]
    for name, longest in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        if longest is not None and (isinstance(longest, bool) or not isinstance(longest, int) or longest < 0):
            raise ValueError(f"{name} is {longest!r}: expected an int >= 0, the longest sequence"
                             + foreign_number_hint(name, longest))
        if longest is not None and longest > total:
            raise ValueError(f"{name} is {longest}, but the packed row holds {total} positions: no sequence is "
                             "longer than the row")
    positions = torch.arange(total, device=q.device, dtype=torch.int32)
    return torch.searchsorted(cu[1:].contiguous(), positions, right=True, out_int32=True)[None]
