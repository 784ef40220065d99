"""The toy transformer of lesson 08: the copy task is what it says, and our attention trains it as SDPA does."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from flashcourse import toy
from flashcourse.tolerance import assert_close

pytest.importorskip("triton")


def _seed(rng: np.random.Generator) -> int:
    return int(rng.integers(2**31))


def test_copy_batch_targets_are_the_second_copy(rng):
    config = toy.ToyConfig()
    inputs, targets = toy.copy_batch(config, 3, torch.Generator().manual_seed(_seed(rng)))
    length = config.prefix_len
    assert inputs.shape == targets.shape == (3, config.seq_len)
    assert (inputs[:, length] == config.vocab).all(), "the separator follows the prefix"
    assert (targets[:, : length] == toy.IGNORE).all(), "the random first copy is not scored"
    # the scored targets are the prefix again, in order
    assert torch.equal(targets[:, length:], inputs[:, :length])


def test_flash_and_sdpa_train_alike(rng):
    """Three steps from the same weights and batches: the float32 losses agree step by step."""
    seed = _seed(rng)
    runs = toy.train_side_by_side(steps=3, batch_size=2, seed=seed, eval_batch_size=0)
    ours, theirs = runs.values()
    assert ours.losses[0] == pytest.approx(toy.chance_loss(), rel=0.2), "a fresh model starts near chance"
    assert_close(np.array(ours.losses), np.array(theirs.losses), dtype="float32", what=f"losses (seed {seed})")


def test_comparison_detects_a_wrong_attention(rng):
    """The step-by-step check is sensitive: attention that sees the future (no causal mask) parts at once."""
    seed = _seed(rng)

    def leaky(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=False)

    runs = toy.train_side_by_side({"leaky": leaky, "sdpa": toy.sdpa_attention}, steps=2, batch_size=2, seed=seed,
                                  eval_batch_size=0)
    with pytest.raises(AssertionError, match="losses differ"):
        assert_close(np.array(runs["leaky"].losses), np.array(runs["sdpa"].losses), dtype="float32",
                     what="losses")
