"""torch.compile keeps ``kernels.flash_attention`` in the graph: a tiny attention layer compiled with
``fullgraph=True`` gives the eager layer's outputs and gradients, option by option.

On CPU the backend is ``aot_eager`` (the graph and its autograd traced, kernels run in Triton's interpreter, tiny
float32 sizes with N not a multiple of 16; about 2 s a case, most of it compiling, so `make test-fast` keeps two
cases and the rest are marked slow); the ``gpu`` tests compile with inductor on CUDA at fp16.
"""

from __future__ import annotations

import pytest

from flashcourse import device  # noqa: E402

device.setup()  # before triton is imported below

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402, F401  (Triton wants it in scope of every jit function, mask_mods too)

from flashcourse import kernels  # noqa: E402
from flashcourse.tolerance import assert_close  # noqa: E402

DEVICE = "cuda" if device.setup() == "cuda" else "cpu"
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
ATTENTION_OP = torch.ops.flashcourse.attention_forward.default


@triton.jit
def stripes(b, h, q_idx, kv_idx):
    return (kv_idx % 3) != 1


class AttentionLayer(torch.nn.Module):
    """One attention layer: x (B, N_q, C) attends to y (B, N_k, C) through q, k, v and output projections."""

    def __init__(self, channels: int, heads: int, heads_kv: int, head_dim: int, options: dict):
        super().__init__()
        self.heads, self.heads_kv, self.head_dim, self.options = heads, heads_kv, head_dim, options
        self.to_q = torch.nn.Linear(channels, heads * head_dim)
        self.to_kv = torch.nn.Linear(channels, 2 * heads_kv * head_dim)
        self.out = torch.nn.Linear(heads * head_dim, channels)

    def forward(self, x, y):
        batch, n_q, _ = x.shape
        n_k = y.shape[1]
        q = self.to_q(x).view(batch, n_q, self.heads, self.head_dim).transpose(1, 2)  # (B, H_q, N_q, D)
        kv = self.to_kv(y).view(batch, n_k, 2, self.heads_kv, self.head_dim)
        k, v = kv.permute(2, 0, 3, 1, 4)  # each (B, H_kv, N_k, D), strided views
        o = kernels.flash_attention(q, k, v, **self.options)  # (B, H_q, N_q, D)
        return self.out(o.transpose(1, 2).reshape(batch, n_q, -1))


class GraphRecorder:
    """A torch.compile backend: records each graph's call targets, then hands the graph to ``backend``."""

    def __init__(self, backend: str):
        self.backend = torch._dynamo.lookup_backend(backend)
        self.targets: list[set] = []

    def __call__(self, gm, example_inputs):
        self.targets.append({node.target for node in gm.graph.nodes})
        return self.backend(gm, example_inputs)


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Each test compiles from nothing: no recompile limit shared across tests, no cached graph."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def layer_and_inputs(rng, options, *, heads=2, heads_kv=2, n_q=20, n_k=20, head_dim=16, dtype=torch.float32,
                     channels=24):
    torch.manual_seed(int(rng.integers(2**31)))
    layer = AttentionLayer(channels, heads, heads_kv, head_dim, options).to(DEVICE, dtype)
    x = torch.tensor(rng.standard_normal((2, n_q, channels)), dtype=dtype, device=DEVICE, requires_grad=True)
    y = torch.tensor(rng.standard_normal((2, n_k, channels)), dtype=dtype, device=DEVICE, requires_grad=True)
    return layer, x, y


def outputs_and_grads(layer, x, y):
    """The layer's output and the gradients of a fixed loss for its parameters and both inputs."""
    out = layer(x, y)
    leaves = [x, y, *layer.parameters()]
    grads = torch.autograd.grad((out * torch.linspace(-1, 1, out.shape[-1], device=out.device)).sum(), leaves)
    return out.detach(), grads


def check_compiled_matches_eager(rng, options, *, backend="aot_eager", fullgraph=True, dtype=torch.float32,
                                 **shape):
    layer, x, y = layer_and_inputs(rng, options, dtype=dtype, **shape)
    recorder = GraphRecorder(backend)
    out, grads = outputs_and_grads(torch.compile(layer, backend=recorder, fullgraph=fullgraph), x, y)
    out_eager, grads_eager = outputs_and_grads(layer, x, y)
    what = f"{sorted(options)} {shape}"
    assert_close(out, out_eager, what=f"compiled output {what}")
    names = ["x", "y", *(name for name, _ in layer.named_parameters())]
    for name, grad, grad_eager in zip(names, grads, grads_eager, strict=True):
        assert_close(grad, grad_eager, what=f"compiled gradient of {name}, {what}")
    return recorder.targets


def slopes(heads):
    return torch.tensor([2.0 ** (-8.0 * (h + 1) / heads) for h in range(heads)], dtype=torch.float32, device=DEVICE)


def documents(batch, lengths):
    ids = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    return ids.expand(batch, -1).to(DEVICE, torch.int64)  # int64 and not contiguous: converted in the graph


CASES = {
    "dense": ({}, {}),
    "causal top-left": ({"causal": True}, {"n_k": 27}),
    "causal bottom-right, N_q != N_k": ({"causal": "bottom_right"}, {"n_q": 13, "n_k": 27}),
    "window": ({"window": (5, 2), "causal": "top_left"}, {}),
    "softcap": ({"softcap": 2.0, "scale": 0.5}, {}),
    "alibi": ({"alibi_slopes": "slopes"}, {"heads": 4, "heads_kv": 4}),
    "documents": ({"document_ids": "documents"}, {}),
    "GQA": ({"causal": True, "enable_gqa": True}, {"heads": 4, "heads_kv": 2}),
}


def filled(options, shape):
    fill = {"slopes": lambda: slopes(shape.get("heads", 2)), "documents": lambda: documents(2, [7, 9, 4])}
    return {k: fill[o]() if isinstance(o, str) and o in fill else o for k, o in options.items()}


FAST_CASES = ("causal bottom-right, N_q != N_k", "alibi")  # what `make test-fast` keeps: the rest is marked slow


@pytest.mark.parametrize("name", [name if name in FAST_CASES else pytest.param(name, marks=pytest.mark.slow)
                                  for name in CASES])
def test_compiled_fullgraph_matches_eager(rng, name):
    options, shape = CASES[name]
    targets = check_compiled_matches_eager(rng, filled(options, shape), **shape)
    assert len(targets) == 1 and ATTENTION_OP in targets[0], f"{name}: the attention op is not in the one graph"


@pytest.mark.slow
def test_mask_mod_compiles_with_a_graph_break(rng):
    targets = check_compiled_matches_eager(rng, {"mask_mod": stripes, "causal": True}, fullgraph=False)
    assert len(targets) >= 2, "a mask_mod call runs eagerly between two graphs"
    assert not any(ATTENTION_OP in graph for graph in targets)


def test_mask_mod_with_fullgraph_raises(rng):
    layer, x, y = layer_and_inputs(rng, {"mask_mod": stripes})
    with pytest.raises(Exception, match="disable"):
        torch.compile(layer, backend="aot_eager", fullgraph=True)(x, y)


def test_compiled_inference_without_grad(rng):
    layer, x, y = layer_and_inputs(rng, {"causal": "bottom_right"}, n_q=11, n_k=20)
    with torch.no_grad():
        compiled = torch.compile(layer, backend="aot_eager", fullgraph=True)(x, y)
        assert_close(compiled, layer(x, y), what="compiled output without grad")


def test_compiled_call_checks_its_inputs(rng):
    layer, x, y = layer_and_inputs(rng, {}, head_dim=4)
    with pytest.raises(Exception, match="head dim 4 is not supported: expected 8 to 256"):
        torch.compile(layer, backend="aot_eager", fullgraph=True)(x, y)


def test_an_awkward_head_dim_compiles_with_fullgraph(rng):
    """Any head dim from 8 to 256 (D = 40 here) is one op in the graph, as the supported ones, with the eager
    results; int64 document ids (ranked on the device) trace too."""
    ids = torch.tensor([[0] * 7 + [5 + 2**33] * 13] * 2, device=DEVICE)
    check_compiled_matches_eager(rng, {"document_ids": ids}, head_dim=40)


def test_eager_calls_keep_the_autograd_function(rng):
    q, k, v = (torch.tensor(rng.standard_normal((1, 2, 20, 16)), dtype=torch.float32, device=DEVICE,
                            requires_grad=True) for _ in range(3))
    o = kernels.flash_attention(q, k, v, alibi_slopes=slopes(2))
    assert type(o.grad_fn).__name__ == "FlashAttentionFunctionBackward"


def test_the_ops_pass_torch_library_checks(rng):
    """Schema, fake implementation against the real one, autograd registration (the ALiBi slopes saved)."""
    q, k, v = (torch.tensor(rng.standard_normal((1, 2, 18, 16)), dtype=torch.float32, device=DEVICE,
                            requires_grad=True) for _ in range(3))
    args = (q, k, v, slopes(2), None, "bottom_right", 4, -1, 3.0, None, False, None, None)
    torch.library.opcheck(torch.ops.flashcourse.attention_forward.default, args,
                          test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))


def test_the_backward_op_passes_torch_library_checks(rng):
    q, k, v, do = (torch.tensor(rng.standard_normal((1, 2, 18, 16)), dtype=torch.float32, device=DEVICE)
                   for _ in range(4))
    o, lse = kernels.flash_attention_forward(q, k, v, causal="bottom_right", window=(4, -1), softcap=3.0)
    args = (q, k, v, o, lse, do, None, None, "bottom_right", 4, -1, 3.0, None, False, None)
    torch.library.opcheck(torch.ops.flashcourse.attention_backward.default, args,
                          test_utils=("test_schema", "test_faketensor"))


def test_forward_and_backward_entry_points_compile_with_fullgraph(rng):
    """flash_attention_forward and flash_attention_backward (what ring attention calls) are the two ops in one
    graph, and give the eager results; return_lse and is_causal compile too."""
    q, k, v, do = (torch.tensor(rng.standard_normal((1, 4, 19, 16)), dtype=torch.float32, device=DEVICE)
                   for _ in range(4))
    k, v = k[:, :2], v[:, :2]  # grouped-query: asked for with enable_gqa

    def attention_and_grads(q, k, v, do):
        o, lse = kernels.flash_attention_forward(q, k, v, is_causal=True, enable_gqa=True, scale=0.3)
        return (o, lse, *kernels.flash_attention_backward(q, k, v, o, lse, do, causal=True, enable_gqa=True,
                                                          scale=0.3))

    recorder = GraphRecorder("aot_eager")
    compiled = torch.compile(attention_and_grads, backend=recorder, fullgraph=True)(q, k, v, do)
    for got, want, what in zip(compiled, attention_and_grads(q, k, v, do), ("o", "lse", "dq", "dk", "dv"),
                               strict=True):
        assert torch.equal(got, want), what
    assert len(recorder.targets) == 1
    assert {ATTENTION_OP, torch.ops.flashcourse.attention_backward.default} <= recorder.targets[0]

    def with_lse(q, k, v):
        return kernels.flash_attention(q, k, v, is_causal=True, return_lse=True, enable_gqa=True)

    o, lse = torch.compile(with_lse, backend="aot_eager", fullgraph=True)(q, k, v)
    assert torch.equal(lse, kernels.flash_attention_forward(q, k, v, causal=True, enable_gqa=True)[1])

    # The lse is differentiable compiled as eagerly: a loss on o and lse gives the eager gradients.
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    dlse = torch.ones_like(lse) * 0.5
    o, lse = torch.compile(with_lse, backend="aot_eager", fullgraph=True)(*leaves)
    compiled_grads = torch.autograd.grad((o, lse), leaves, (do, dlse))
    o, lse = with_lse(*leaves)
    for got, want, what in zip(compiled_grads, torch.autograd.grad((o, lse), leaves, (do, dlse)), "qkv",
                               strict=True):
        assert torch.allclose(got, want, atol=1e-6), f"d{what} of a compiled loss on o and lse"


def test_compiled_calls_refuse_what_eager_calls_refuse(rng):
    q = torch.tensor(rng.standard_normal((1, 4, 8, 16)), dtype=torch.float32, device=DEVICE)
    kv = q[:, :2]
    with pytest.raises(Exception, match="enable_gqa=True"):
        torch.compile(lambda q, k: kernels.flash_attention_forward(q, k, k), backend="aot_eager",
                      fullgraph=True)(q, kv)
    with pytest.raises(Exception, match="expected a number from 1e-30 to 1e"):
        torch.compile(lambda q: kernels.flash_attention(q, q, q, scale=float("inf")), backend="aot_eager",
                      fullgraph=True)(q)


GPU_CASES = {
    "dense": ({}, {}),
    "causal bottom-right": ({"causal": "bottom_right"}, {"n_q": 100, "n_k": 300}),
    "window + softcap": ({"window": (64, 0), "causal": True, "softcap": 20.0}, {}),
    "alibi": ({"alibi_slopes": "slopes"}, {"heads": 4, "heads_kv": 4}),
    "documents": ({"document_ids": "documents"}, {}),
    "GQA": ({"causal": True, "enable_gqa": True}, {"heads": 8, "heads_kv": 2}),
}


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("name", list(GPU_CASES))
def test_gpu_inductor_fullgraph_matches_eager(rng, name):
    options, shape = GPU_CASES[name]
    shape = {"n_q": 300, "n_k": 300, "head_dim": 64, "channels": 128, **shape}
    fill = {"slopes": lambda: slopes(shape.get("heads", 2)), "documents": lambda: documents(2, [100, 150, 50])}
    options = {k: fill[o]() if isinstance(o, str) and o in fill else o for k, o in options.items()}
    targets = check_compiled_matches_eager(rng, options, backend="inductor", dtype=torch.float16, **shape)
    assert len(targets) == 1 and ATTENTION_OP in targets[0]
