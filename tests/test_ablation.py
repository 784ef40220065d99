"""Lesson 09's softmax-cost variants: wrong on purpose, and wrong only where the softmax matters."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from flashcourse import device  # noqa: E402

if not device.triton_available():
    pytest.skip("Triton is not installed here", allow_module_level=True)
from flashcourse import kernels  # noqa: E402
from flashcourse.bench.ablation import ablated_forward  # noqa: E402
from flashcourse.tolerance import assert_close  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def randn(rng, shape):
    return torch.tensor(rng.standard_normal(shape), dtype=torch.float32, device=DEVICE)


@pytest.mark.filterwarnings("ignore:invalid value encountered")  # the no-softmax variant is wrong on purpose
def test_dropping_the_rescale_is_harmless_in_one_tile_and_wrong_across_many(rng):
    q, k, v = (randn(rng, (1, 1, 16, 16)) for _ in range(3))
    exact, _ = kernels.flash_attention_forward(q, k, v, version="v6")
    assert_close(ablated_forward(q, k, v, causal=False, ablate=1), exact)  # one key tile: alpha is never used
    q = randn(rng, (1, 1, 16, 16))
    k, v = randn(rng, (1, 1, 200, 16)), randn(rng, (1, 1, 200, 16))
    k[..., 150:, :] *= 20  # a late key tile raises the running max, so the missing rescale shows
    exact, _ = kernels.flash_attention_forward(q, k, v, version="v6")
    for ablate in (1, 2):
        with pytest.raises(AssertionError):
            assert_close(ablated_forward(q, k, v, causal=False, ablate=ablate), exact)


def test_ablation_is_not_in_the_shipping_kernels():
    import inspect

    from flashcourse.kernels import forward

    assert "ABLATE" not in inspect.getsource(forward)
    with pytest.raises(ValueError, match="ablate must be 1"):
        ablated_forward(*(torch.zeros(1, 1, 16, 16, device=DEVICE) for _ in range(3)), causal=False, ablate=3)
