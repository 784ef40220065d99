"""The kernels' smoke set: the forward, the backward and decoding of the public API against float64, tiny sizes.

`make test-fast` leaves the full kernel tests (test_kernels_*.py, test_decode.py) to `make test`; these few runs
stay in it so that a broken kernel fails the fast tier too. The sizes are the awkward ones: N = 1 and 17 (one
row, and a tail tile that is mostly padding), head dims 16 and 32, causal and not, queries fewer than keys,
grouped-query attention (which the backward serves with b3, the kernel with the variants, and plain heads with
b1), and a decode cache cut into two splits, so that the combine kernel runs. In the Triton interpreter each
case takes a few seconds; on a GPU they run as they are, on the GPU.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from flashcourse import device  # noqa: E402

if not device.triton_available():
    pytest.skip("Triton is not installed here", allow_module_level=True)
from flashcourse import kernels, reference  # noqa: E402
from flashcourse.tolerance import assert_close  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def normal(rng, *shape) -> torch.Tensor:
    return torch.tensor(rng.standard_normal(shape), dtype=torch.float32, device=DEVICE)


def as_float64(*tensors) -> list[np.ndarray]:
    return [t.detach().cpu().double().numpy() for t in tensors]


@pytest.mark.parametrize("n_q,n_k,d,causal", [(1, 1, 16, False), (17, 17, 16, True), (17, 23, 32, False),
                                              (1, 17, 32, True)])
def test_forward_matches_float64(rng, n_q, n_k, d, causal):
    q, k, v = normal(rng, 1, 2, n_q, d), normal(rng, 1, 2, n_k, d), normal(rng, 1, 2, n_k, d)
    o, lse = kernels.flash_attention_forward(q, k, v, causal=causal)
    o_ref, lse_ref = reference.attention_lse(*as_float64(q, k, v), causal=causal)
    assert_close(o, o_ref, what=f"o (N_q={n_q}, N_k={n_k}, D={d}, causal={causal})")
    assert_close(lse, lse_ref, what=f"lse (N_q={n_q}, N_k={n_k}, D={d}, causal={causal})")


def float64_gradients(q, k, v, do, *, causal):
    """dq, dk, dv of softmax(q k^T / sqrt(D) + mask) v by autograd in float64; K/V heads repeated for GQA, so
    autograd sums dk and dv over each group as the kernels must."""
    q, k, v, do = (torch.tensor(a, requires_grad=True) for a in as_float64(q, k, v, do))
    group = q.shape[1] // k.shape[1]
    scores = q @ k.repeat_interleave(group, 1).transpose(-1, -2) / q.shape[-1] ** 0.5
    if causal:
        visible = torch.tensor(reference.causal_mask(q.shape[2], k.shape[2]))
        scores = scores.masked_fill(~visible, float("-inf"))
    o = torch.softmax(scores, dim=-1) @ v.repeat_interleave(group, 1)
    return torch.autograd.grad(o, (q, k, v), do)


@pytest.mark.parametrize("n,d,causal,h_q,h_kv", [(17, 16, True, 2, 2), (17, 32, False, 4, 2), (1, 32, True, 2, 2)])
def test_backward_matches_float64(rng, n, d, causal, h_q, h_kv):
    q = normal(rng, 1, h_q, n, d).requires_grad_()
    k, v = normal(rng, 1, h_kv, n, d).requires_grad_(), normal(rng, 1, h_kv, n, d).requires_grad_()
    do = normal(rng, 1, h_q, n, d)
    o = kernels.flash_attention(q, k, v, causal=causal, enable_gqa=h_q != h_kv)
    grads = torch.autograd.grad(o, (q, k, v), do)
    expected = float64_gradients(q, k, v, do, causal=causal)
    for name, got, want in zip(("dq", "dk", "dv"), grads, expected, strict=True):
        assert_close(got, want.numpy(), what=f"{name} (N={n}, D={d}, causal={causal}, H_q/H_kv={h_q}/{h_kv})")


@pytest.mark.parametrize("lengths,d,h_q,h_kv,num_splits", [([17], 16, 2, 2, 1), ([17, 1], 32, 4, 2, 2)])
def test_decode_matches_float64(rng, lengths, d, h_q, h_kv, num_splits):
    batch, n_max = len(lengths), max(lengths)
    q, k, v = normal(rng, batch, h_q, d), normal(rng, batch, h_kv, n_max, d), normal(rng, batch, h_kv, n_max, d)
    seqlens = torch.tensor(lengths, dtype=torch.int32, device=DEVICE)
    o = kernels.flash_decode(q, k, v, cache_seqlens=seqlens, num_splits=num_splits)
    qn, kn, vn = as_float64(q, k, v)
    group = h_q // h_kv
    for b, length in enumerate(lengths):
        keys = np.repeat(kn[b, :, :length], group, axis=0)  # (H_q, length, D): each query head's K/V head
        values = np.repeat(vn[b, :, :length], group, axis=0)
        o_ref = reference.attention(qn[b][:, None], keys, values)[:, 0]
        assert_close(o[b], o_ref, what=f"decode o[{b}] (length {length}, D={d}, {num_splits} splits)")
