"""The lessons' NumPy helpers (the I/O model, the schedule model, FlashAttention-4's softmax, the precision
emulator) refuse a bad argument with an error that names it, and take empty inputs as the reference does: a
learner who passes 0 for a block or a negative threshold gets told so, not a ZeroDivisionError or a quiet answer."""

from __future__ import annotations

import numpy as np
import pytest

from flashcourse import fa4, iomodel, measure, precision, reference, schedule, trees

_X = np.random.default_rng(0).standard_normal((64, 100))
_Q = np.random.default_rng(1).standard_normal((6, 8))
_TREE = [-1, 0, 0, 1]  # drafts 1 and 2 are siblings under draft 0; draft 3 is draft 1's child
_KV = np.random.default_rng(2).standard_normal((3 + len(_TREE), 8))  # a cache of 3, then one key per draft

REFUSED = [
    ("kv_tbps_implied, block_q 0", lambda: schedule.kv_tbps_implied(500.0, 0), "block_q=0"),
    ("kv_tbps_implied, negative rate", lambda: schedule.kv_tbps_implied(-1.0, 128), "tflops=-1.0"),
    ("kv_tbps_implied, NaN rate", lambda: schedule.kv_tbps_implied(float("nan"), 128), "tflops=nan"),
    ("flash_block_sizes, d 0", lambda: iomodel.flash_block_sizes(4096, 0), "d must be a positive int"),
    ("flash_block_sizes, sram 0", lambda: iomodel.flash_block_sizes(0, 64), "sram must be a positive int"),
    ("naive bytes, negative n", lambda: iomodel.naive_attention_hbm_bytes(1, 1, -5, 64), "n=-5"),
    ("naive bytes, 0 bytes a value", lambda: iomodel.naive_attention_hbm_bytes(1, 1, 8, 64, bytes_per_element=0),
     "bytes_per_element"),
    ("forward_conditional, negative threshold",
     lambda: fa4.forward_conditional(_Q, _Q, _Q, threshold=-1.0), "threshold=-1.0"),
    ("forward_conditional, NaN threshold",
     lambda: fa4.forward_conditional(_Q, _Q, _Q, threshold=float("nan")), "threshold=nan"),
    ("forward_conditional, block_k 0", lambda: fa4.forward_conditional(_Q, _Q, _Q, threshold=8.0, block_k=0),
     "block_k"),
    ("forward_conditional, k of another head dim",
     lambda: fa4.forward_conditional(_Q, _Q[:, :4], _Q, threshold=8.0), "head dim"),
    ("forward_conditional, heads", lambda: fa4.forward_conditional(_Q[None], _Q[None], _Q[None], threshold=8.0),
     "one head"),
    ("forward_conditional, infinite p_shift",
     lambda: fa4.forward_conditional(_Q, _Q, _Q, threshold=8.0, p_shift=float("inf")), "p_shift"),
    ("group_rescale_share, group 0", lambda: fa4.group_rescale_share(_X, block=16, threshold=8.0, group=0),
     "group must be a positive int"),
    ("group_rescale_share, block 0", lambda: fa4.group_rescale_share(_X, block=0, threshold=8.0),
     "block must be a positive int"),
    ("group_rescale_share, negative threshold",
     lambda: fa4.group_rescale_share(_X, block=16, threshold=-2.0), "threshold=-2.0"),
    ("attention_like_kernel, block_k 0", lambda: precision.attention_like_kernel(_Q, _Q, _Q, block_k=0),
     "block_k"),
    ("attention_like_kernel, p_dtype", lambda: precision.attention_like_kernel(_Q, _Q, _Q, p_dtype="float8"),
     "p_dtype"),
    ("attention_like_kernel, heads", lambda: precision.attention_like_kernel(_Q[None], _Q[None], _Q[None]),
     "one head"),
    ("path_attention, siblings as a path", lambda: trees.path_attention(_KV[3:], _KV, _KV, _TREE, [0, 2, 1]),
     "not a chain"),
    ("path_attention, not from a root", lambda: trees.path_attention(_KV[3:], _KV, _KV, _TREE, [1, 3]),
     "not a chain"),
    ("path_attention, a draft past the tree", lambda: trees.path_attention(_KV[3:], _KV, _KV, _TREE, [0, 7]),
     "from 0 to 3"),
    ("matmul_gflops, n 0", lambda: measure.matmul_gflops(0), "n=0"),
    ("copy_bandwidth_gbs, 0 MB", lambda: measure.copy_bandwidth_gbs(0), "megabytes=0"),
    ("read_bandwidth_gbs, 0 MB", lambda: measure.read_bandwidth_gbs(0), "megabytes=0"),
]


@pytest.mark.parametrize("call, match", [case[1:] for case in REFUSED], ids=[case[0] for case in REFUSED])
def test_a_bad_argument_is_refused_by_name(call, match):
    with pytest.raises(ValueError, match=match):
        call()


@pytest.mark.parametrize("n_q, n_k", [(0, 5), (5, 0), (1, 1), (9, 5)])
@pytest.mark.parametrize("causal", [False, True])
def test_empty_and_tiny_inputs_give_the_reference_answer(n_q, n_k, causal):
    rng = np.random.default_rng(n_q * 10 + n_k)
    q, k, v = rng.standard_normal((n_q, 8)), rng.standard_normal((n_k, 8)), rng.standard_normal((n_k, 3))
    expected = reference.attention(q, k, v, causal=causal)
    for name in ("standard", "flash", "flash2"):
        o, _ = iomodel.simulate(name, q, k, v, sram=2000, causal=causal)
        np.testing.assert_allclose(o, expected, atol=1e-12, err_msg=name)
    o, *_ = fa4.forward_conditional(q, k, v, threshold=8.0, block_k=4, causal=causal)
    np.testing.assert_allclose(o, expected, atol=1e-12)
    o = precision.attention_like_kernel(q, k, v, dtype="float32", block_k=4, causal=causal)
    np.testing.assert_allclose(o, expected, atol=1e-5)
