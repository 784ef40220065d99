"""An independent float64 specification of the attention variants in PyTorch, for the reference, tiled and
grading tests: whole (B, H, N_q, N_k) matrices, masks written out from the definitions, gradients by autograd."""

from __future__ import annotations

import numpy as np
import torch


def diagonal(n_q, n_k, causal) -> int:
    """Where query 0 sits among the keys: the first key under top-left causal, else the last query lines up with
    the last key (bottom-right causal, or none). Causal, window and ALiBi all measure from this one diagonal."""
    return 0 if causal in (True, "top_left") else n_k - n_q


def dense_keep(b, h, n_q, n_k, *, causal=False, window=None, document_ids=None, extra=None) -> torch.Tensor:
    """The (B, H, N_q, N_k) boolean mask of the variant options, from their definitions."""
    i = torch.arange(n_q)[:, None]
    position = i + diagonal(n_q, n_k, causal)
    j = torch.arange(n_k)[None, :]
    keep = torch.ones(b, h, n_q, n_k, dtype=torch.bool)
    if causal:
        keep &= j <= position
    if window is not None:
        left, right = window
        if left >= 0:
            keep &= j >= position - left
        if right >= 0:
            keep &= j <= position + right
    if document_ids is not None:
        ids = torch.as_tensor(np.asarray(document_ids))
        keep &= ids[:, None, :, None] == ids[:, None, None, :]
    if extra is not None:
        keep &= torch.as_tensor(np.broadcast_to(extra, keep.shape).copy())
    return keep


def torch_attention(q, k, v, *, causal=False, scale=None, window=None, softcap=None, alibi_slopes=None,
                    document_ids=None, extra=None, do=None):
    """(o, lse) and, with ``do``, (dq, dk, dv) of q (B, H_q, N_q, D), k, v (B, H_kv, N_k, D) in float64.

    ``extra``: a boolean array broadcastable to (B, H_q, N_q, N_k), ANDed with the rest (a mask_mod's values).
    Rows with no visible key give o = 0, lse = -inf and zero gradients."""
    tq, tk, tv = (torch.tensor(np.asarray(x, dtype=np.float64), requires_grad=True) for x in (q, k, v))
    b, h, n_q, d = tq.shape
    n_k, group = tk.shape[2], h // tk.shape[1]
    scale = 1 / np.sqrt(d) if scale is None else scale
    s = tq @ tk.repeat_interleave(group, dim=1).transpose(-1, -2) * scale
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    if alibi_slopes is not None:
        distance = (torch.arange(n_q)[:, None] + diagonal(n_q, n_k, causal) - torch.arange(n_k)[None, :]).abs()
        s = s - torch.as_tensor(np.asarray(alibi_slopes, dtype=np.float64))[:, None, None] * distance
    keep = dense_keep(b, h, n_q, n_k, causal=causal, window=window, document_ids=document_ids, extra=extra)
    seen = keep.any(dim=-1, keepdim=True)
    s = s.masked_fill(~keep, -torch.inf).masked_fill(~seen, 0.0)  # empty rows: finite, zeroed below
    p = torch.softmax(s, dim=-1) * seen
    o = p @ tv.repeat_interleave(group, dim=1)
    lse = torch.logsumexp(s, dim=-1).masked_fill(~seen[..., 0], -torch.inf)
    if do is None:
        return o.detach().numpy(), lse.detach().numpy()
    o.backward(torch.as_tensor(np.asarray(do, dtype=np.float64)))
    return o.detach().numpy(), lse.detach().numpy(), (tq.grad.numpy(), tk.grad.numpy(), tv.grad.numpy())
