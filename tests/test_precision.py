"""The emulated 16-bit kernel: its roundings are the real conversions, and switching them off gives float32."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from flashcourse import precision, reference
from flashcourse.tolerance import assert_close


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_round_to_is_the_conversion_torch_makes(rng, dtype):
    x = (rng.standard_normal(20_000) * 10.0 ** rng.uniform(-6, 6, 20_000)).astype(np.float32)
    x[:4] = [65_504.0, 65_520.0, 3.3e38, -0.0]  # fp16 max, a tie that overflows fp16, near float32 max
    expected = torch.from_numpy(x).to(getattr(torch, dtype)).float().numpy()
    np.testing.assert_array_equal(precision.round_to(x, dtype), expected)


def test_round_to_rejects_an_unknown_dtype():
    with pytest.raises(ValueError, match="float16"):
        precision.round_to([1.0], "float8")


def test_kernel_emulation_in_float32_is_attention(rng):
    q, k, v = rng.standard_normal((3, 70, 16))
    for causal in (False, True):
        o = precision.attention_like_kernel(q, k, v, dtype="float32", block_k=16, causal=causal)
        assert_close(o, reference.attention(q, k, v, causal=causal), dtype="float32", what=f"causal={causal}")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_rounding_p_adds_error_but_less_than_twice(rng, dtype):
    q, k, v = rng.standard_normal((3, 256, 32))
    exact = reference.attention(*(precision.round_to(x, dtype).astype(np.float64) for x in (q, k, v)))
    kept = np.abs(precision.attention_like_kernel(q, k, v, dtype=dtype, p_dtype="float32") - exact).mean()
    rounded = np.abs(precision.attention_like_kernel(q, k, v, dtype=dtype) - exact).mean()
    assert 1.0 < rounded / kept < 2.0, f"{dtype}: rounding P changed the mean error by {rounded / kept:.2f}x"
