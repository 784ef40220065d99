"""A tiny transformer on a toy copy task: lesson 08 trains it with our attention and with PyTorch's.

``python -m flashcourse.toy`` (on a GPU) trains ``GPU_CONFIG`` both ways for 300 steps and saves the losses to
``benchmarks/results/<date>-<device>-toy.json``, which lesson 08 shows on machines without a GPU.

The model is a two-layer, decoder-only transformer whose attention is a function passed in, so the same weights
and the same batches can run once through ``kernels.flash_attention`` and once through
``torch.nn.functional.scaled_dot_product_attention``. If our forward or backward were wrong anywhere, the two loss
curves would part; if both are right, they agree step by step up to rounding.

The task (copy): a sequence of ``prefix_len`` random tokens, a separator, then the same tokens again. Predicting
the second copy needs attention (look back ``prefix_len + 1`` positions), so a model with broken attention
cannot learn it. Only the second copy is scored: the first half is random, there is nothing to learn there.

Everything here is torch only; ``kernels`` (and so Triton) is imported only when the flash attention is used.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from flashcourse import device

# Now, not later: building an optimizer imports Triton (through torch._dynamo), and Triton's own helpers
# (tl.zeros, tl.sum, ...) take interpreter mode or not once, at import. setup() only sets an environment variable.
device.setup()

__all__ = [
    "ATTENTIONS",
    "GPU_CONFIG",
    "ToyConfig",
    "ToyRun",
    "TinyTransformer",
    "chance_loss",
    "copy_batch",
    "flash_attention",
    "sdpa_attention",
    "train",
    "train_side_by_side",
]

IGNORE = -100  # target value that cross_entropy skips: positions of the random first copy

# An attention function: q, k, v (B, H, N, D) -> o (B, H, N, D), causal.
AttentionFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def sdpa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """PyTorch's causal attention: q, k, v (B, H, N, D) -> (B, H, N, D)."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The course's Triton kernel, causal: q, k, v (B, H, N, D) -> (B, H, N, D)."""
    from flashcourse import kernels  # here, not at the top: Triton is optional for the SDPA path

    return kernels.flash_attention(q, k, v, causal=True)


ATTENTIONS: dict[str, AttentionFn] = {"flash (ours)": flash_attention, "SDPA (PyTorch)": sdpa_attention}


@dataclass(frozen=True)
class ToyConfig:
    """Sizes of the model and the task. The defaults are tiny so that the Triton interpreter can train them
    (every program of the launch grid runs one after another in Python: keep batch * heads small)."""

    vocab: int = 16  # token ids 0..vocab-1; the separator is one more id
    prefix_len: int = 8  # tokens to copy; the model sees 2 * prefix_len positions
    d_model: int = 32
    heads: int = 1  # head dim = d_model / heads, which must be a head dim the kernels support (16, 32, ...)
    layers: int = 2  # copying needs two: one layer finds the earlier position, the next reads its successor
    mlp_ratio: int = 4

    @property
    def seq_len(self) -> int:
        """Positions the model sees: the prefix, the separator, the copy without its last token."""
        return 2 * self.prefix_len

    @property
    def head_dim(self) -> int:
        return self.d_model // self.heads


# Learns the copy task in a few hundred steps (measured with SDPA on a CPU, batch 64, lr 3e-3: loss 0.005 at
# step 75, 100% accuracy after 300 steps); too big for the interpreter.
GPU_CONFIG = ToyConfig(prefix_len=16, d_model=64, heads=2)


def copy_batch(config: ToyConfig, batch_size: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """One batch of the copy task: inputs and targets, both (batch_size, seq_len) int64.

    Sequence: x_1..x_L, SEP, x_1..x_L. Inputs are all but its last token, targets all but its first; targets of
    the first copy (random, unpredictable) are IGNORE, so the loss measures copying alone.
    """
    prefix = torch.randint(0, config.vocab, (batch_size, config.prefix_len), generator=generator)
    separator = torch.full((batch_size, 1), config.vocab)
    sequence = torch.cat([prefix, separator, prefix], dim=1)  # (B, 2L + 1)
    inputs, targets = sequence[:, :-1], sequence[:, 1:].clone()  # (B, 2L) each
    targets[:, : config.prefix_len] = IGNORE
    return inputs, targets


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention around a pluggable attention function."""

    def __init__(self, config: ToyConfig, attention: AttentionFn):
        super().__init__()
        if config.d_model % config.heads:
            raise ValueError(f"d_model {config.d_model} is not a multiple of heads {config.heads}")
        self.heads = config.heads
        self.attention = attention
        self.qkv = nn.Linear(config.d_model, 3 * config.d_model)
        self.out = nn.Linear(config.d_model, config.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, n, width = x.shape  # (B, N, C)
        qkv = self.qkv(x).view(batch, n, 3, self.heads, width // self.heads)  # (B, N, 3, H, Dh)
        # transpose, not copy: the kernels take (B, H, N, D) views with any strides
        q, k, v = (t.transpose(1, 2) for t in qkv.unbind(dim=2))  # each (B, H, N, Dh)
        o = self.attention(q, k, v)  # (B, H, N, Dh)
        return self.out(o.transpose(1, 2).reshape(batch, n, width))  # (B, N, C)


class Block(nn.Module):
    """Pre-norm transformer block: x + attention(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, config: ToyConfig, attention: AttentionFn):
        super().__init__()
        self.norm1 = nn.LayerNorm(config.d_model)
        self.attn = CausalSelfAttention(config, attention)
        self.norm2 = nn.LayerNorm(config.d_model)
        hidden = config.mlp_ratio * config.d_model
        self.mlp = nn.Sequential(nn.Linear(config.d_model, hidden), nn.GELU(), nn.Linear(hidden, config.d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class TinyTransformer(nn.Module):
    """Token and position embeddings, ``layers`` blocks, a final norm and a linear head over the vocabulary."""

    def __init__(self, config: ToyConfig, attention: AttentionFn):
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab + 1, config.d_model)  # + 1: the separator
        self.position = nn.Embedding(config.seq_len, config.d_model)
        self.blocks = nn.ModuleList(Block(config, attention) for _ in range(config.layers))
        self.norm = nn.LayerNorm(config.d_model)
        self.head = nn.Linear(config.d_model, config.vocab + 1)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens (B, N) int64 -> logits (B, N, vocab + 1)."""
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.embed(tokens) + self.position(positions)  # (B, N, C)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


@dataclass
class ToyRun:
    """One training run: the loss of every step, the final copy accuracy and the wall time."""

    name: str
    losses: list[float] = field(default_factory=list)
    accuracy: float = float("nan")  # fraction of second-copy tokens predicted right, on a fresh batch
    seconds: float = 0.0


def _copy_accuracy(model: TinyTransformer, config: ToyConfig, batch_size: int, generator: torch.Generator,
                   device: torch.device) -> float:
    inputs, targets = copy_batch(config, batch_size, generator)
    inputs, targets = inputs.to(device), targets.to(device)
    with torch.no_grad():
        predicted = model(inputs).argmax(dim=-1)
    scored = targets != IGNORE
    return (predicted[scored] == targets[scored]).float().mean().item()


def train(attention: AttentionFn, config: ToyConfig = ToyConfig(), *, steps: int = 20, batch_size: int = 4,
          lr: float = 3e-3, seed: int = 0, device: str | torch.device = "cpu", eval_batch_size: int = 32,
          name: str = "") -> ToyRun:
    """Train a fresh TinyTransformer for ``steps`` AdamW steps; return its ToyRun.

    The accuracy is measured afterwards on ``eval_batch_size`` fresh sequences (0: not measured).

    ``seed`` fixes both the initial weights and the batches, so two calls that differ only in ``attention``
    see the same model and the same data: any difference in their losses comes from the attention.
    """
    device = torch.device(device)
    torch.manual_seed(seed)
    model = TinyTransformer(config, attention).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    data = torch.Generator().manual_seed(seed)
    run = ToyRun(name=name)
    start = time.perf_counter()
    for _ in range(steps):
        inputs, targets = copy_batch(config, batch_size, data)
        inputs, targets = inputs.to(device), targets.to(device)
        logits = model(inputs)  # (B, N, vocab + 1)
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        run.losses.append(loss.item())
    run.seconds = time.perf_counter() - start
    if eval_batch_size:
        run.accuracy = _copy_accuracy(model, config, eval_batch_size, torch.Generator().manual_seed(seed + 1),
                                      device)
    return run


def train_side_by_side(attentions: dict[str, AttentionFn] | None = None, config: ToyConfig = ToyConfig(),
                       **train_kwargs) -> dict[str, ToyRun]:
    """Train one model per attention function (default: ours and SDPA), same seed, weights and batches."""
    attentions = ATTENTIONS if attentions is None else attentions
    return {name: train(fn, config, name=name, **train_kwargs) for name, fn in attentions.items()}


def chance_loss(config: ToyConfig = ToyConfig()) -> float:
    """Cross-entropy of guessing uniformly among the vocab + 1 tokens: where every run starts."""
    return math.log(config.vocab + 1)


def main(argv: list[str] | None = None) -> None:
    """Train GPU_CONFIG with both attentions on the GPU and save the runs with ``bench.save_results``."""
    parser = argparse.ArgumentParser(prog="python -m flashcourse.toy", description=main.__doc__)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--out", default=None, help="directory (default benchmarks/results)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("python -m flashcourse.toy trains on a GPU; without one, lesson 08 trains the tiny config")
    from flashcourse.bench import save_results

    runs = train_side_by_side(config=GPU_CONFIG, steps=args.steps, batch_size=args.batch_size, device="cuda",
                              eval_batch_size=1024)
    rows = [{**asdict(run), "config": asdict(GPU_CONFIG), "batch_size": args.batch_size} for run in runs.values()]
    for run in runs.values():
        print(f"{run.name:15} last loss {run.losses[-1]:.4f}, copy accuracy {100 * run.accuracy:.1f}%")
    print(f"wrote {save_results('toy', rows, directory=args.out)}")


if __name__ == "__main__":
    main()
