"""torch.compile keeps ``kernels.flash_decode`` in the graph: one ``flashcourse::decode`` op, with a fake
implementation, passes ``torch.library.opcheck`` and compiles with ``fullgraph=True``.

Without the op, Dynamo traced into the call and, on the CPU, into Triton's interpreter, whose NumPy pointer
arithmetic (uint64) fake tensors cannot run: the call failed even with graph breaks allowed. On CPU the backend is
``aot_eager`` (kernels in the interpreter, tiny float32 sizes); the ``gpu`` test compiles with inductor at fp16.
"""

from __future__ import annotations

import pytest

from flashcourse import device

device.setup()  # before triton is imported

import torch  # noqa: E402

from flashcourse import kernels  # noqa: E402
from flashcourse.kernels import quantize_kv_cache  # noqa: E402
from flashcourse.kernels.decode import DecodeSwitches  # noqa: E402
from flashcourse.tolerance import assert_close  # noqa: E402

DEVICE = "cuda" if device.setup() == "cuda" else "cpu"
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
DECODE_OP = torch.ops.flashcourse.decode.default
DECODE_OPS = {torch.ops.flashcourse.decode, DECODE_OP}  # Dynamo's graph names the packet, AOT's the overload


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


class DecodeLayer(torch.nn.Module):
    """A decode step's attention: the token x (B, C) projected to queries, attending to a fixed KV cache."""

    def __init__(self, channels: int, heads: int, head_dim: int, options: dict):
        super().__init__()
        self.heads, self.head_dim, self.options = heads, head_dim, options
        self.to_q = torch.nn.Linear(channels, heads * head_dim)
        self.out = torch.nn.Linear(heads * head_dim, channels)

    def forward(self, x, k_cache, v_cache):
        q = self.to_q(x).view(x.shape[0], self.heads, self.head_dim)  # (B, H_q, D)
        o = kernels.flash_decode(q, k_cache, v_cache, **self.options)  # (B, H_q, D)
        return self.out(o.reshape(x.shape[0], -1))


class GraphRecorder:
    """A torch.compile backend: records each graph's call targets, then hands the graph to ``aot_eager``."""

    def __init__(self, backend: str = "aot_eager"):
        self.backend = torch._dynamo.lookup_backend(backend)
        self.targets: list[set] = []
        self.decode_args: list[tuple] = []  # each decode op's arguments, as the graph passes them

    def __call__(self, gm, example_inputs):
        self.targets.append({node.target for node in gm.graph.nodes})
        self.decode_args += [node.args for node in gm.graph.nodes if node.target in DECODE_OPS]
        return self.backend(gm, example_inputs)


def cache(rng, batch=2, h_kv=2, n=40, d=16, dtype=torch.float32):
    return [torch.tensor(rng.standard_normal((batch, h_kv, n, d)), dtype=dtype, device=DEVICE) for _ in range(2)]


def paged_cache(rng, page_size=16):
    """Two sequences of up to 48 keys in six shuffled pages of 16."""
    k, v = (torch.tensor(rng.standard_normal((6, 2, page_size, 16)), dtype=torch.float32, device=DEVICE)
            for _ in range(2))
    table = torch.tensor(rng.permutation(6).reshape(2, 3), dtype=torch.int32, device=DEVICE)
    return k, v, table


def lengths(*values):
    return torch.tensor(values, dtype=torch.int32, device=DEVICE)


def case(rng, name):
    """(layer options, k_cache, v_cache) of each compiled case."""
    k, v = cache(rng)
    if name == "contiguous, lengths":
        return {"cache_seqlens": lengths(40, 17)}, k, v
    if name == "lengths as a list, one split":
        return {"cache_seqlens": [40, 3], "num_splits": 1}, k, v
    if name == "paged, window, softcap, alibi":
        kp, vp, table = paged_cache(rng)
        slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625], device=DEVICE)
        return {"block_table": table, "cache_seqlens": lengths(48, 21), "window": (10, 0), "softcap": 2.0,
                "alibi_slopes": slopes, "block_n": 32, "num_splits": 2}, kp, vp
    if name == "paged, left padding":  # flash-attn's cache_leftpad: the keys before it are never attended
        kp, vp, table = paged_cache(rng)
        return {"block_table": table, "cache_seqlens": lengths(48, 21), "cache_leftpad": lengths(20, 3),
                "num_splits": 2}, kp, vp
    if name == "fp8 cache":
        k8, v8, k_scale, v_scale = quantize_kv_cache(k, v)
        return {"k_scale": k_scale, "v_scale": v_scale, "cache_seqlens": lengths(33, 40)}, k8, v8
    if name == "fp8 cache, switches":  # the kernel's options beyond its tiles reach the compiled op too
        k8, v8, k_scale, v_scale = quantize_kv_cache(k, v)
        switches = DecodeSwitches(programs_per_sm=2, mask_tail_only=True)
        return {"k_scale": k_scale, "v_scale": v_scale, "cache_seqlens": lengths(33, 40), "num_splits": 2,
                "switches": switches}, k8, v8
    raise KeyError(name)


CASES = ("contiguous, lengths", "lengths as a list, one split", "paged, window, softcap, alibi", "paged, left padding",
         "fp8 cache", "fp8 cache, switches")


@pytest.mark.parametrize("name", CASES)
def test_compiled_fullgraph_matches_eager(rng, name):
    options, k_cache, v_cache = case(rng, name)
    torch.manual_seed(int(rng.integers(2**31)))
    layer = DecodeLayer(24, 4, k_cache.shape[3], options).to(DEVICE)
    x = torch.tensor(rng.standard_normal((2, 24)), dtype=torch.float32, device=DEVICE)
    recorder = GraphRecorder()
    with torch.no_grad():
        compiled = torch.compile(layer, backend=recorder, fullgraph=True)(x, k_cache, v_cache)
        eager = layer(x, k_cache, v_cache)
    assert_close(compiled, eager, what=f"compiled decode layer, {name}")
    assert len(recorder.targets) == 1 and DECODE_OPS & recorder.targets[0], f"{name}: no decode op in the one graph"
    if "switches" in options:  # the op carries them, as (programs_per_sm, mask_tail_only)
        assert tuple(recorder.decode_args[0][-2:]) == tuple(options["switches"]), recorder.decode_args


def test_compiled_call_checks_its_inputs(rng):
    k, v = cache(rng, d=4)
    layer = DecodeLayer(24, 4, 4, {}).to(DEVICE)
    x = torch.zeros(2, 24, device=DEVICE)
    with pytest.raises(Exception, match="head dim 4 is not supported: expected 8 to 256"):
        torch.compile(layer, backend="aot_eager", fullgraph=True)(x, k, v)


@pytest.mark.parametrize("name", ["contiguous, lengths", "paged, window, softcap, alibi", "paged, left padding",
                                  "fp8 cache"])
def test_the_op_passes_torch_library_checks(rng, name):
    """Schema, the fake implementation against the real one (shapes, dtypes, strides), and no autograd claimed
    that the op does not have."""
    options, k_cache, v_cache = case(rng, name)
    q = torch.tensor(rng.standard_normal((2, 4, 16)), dtype=torch.float32, device=DEVICE)
    window = options.get("window", (-1, -1))
    args = (q, k_cache, v_cache, options.get("cache_seqlens"), options.get("block_table"), options.get("k_scale"),
            options.get("v_scale"), options.get("alibi_slopes"), options.get("cache_leftpad"), None,
            options.get("num_splits"), *window,
            options.get("softcap"), options.get("block_n"), None, None)
    checks = ("test_schema", "test_faketensor", "test_autograd_registration")
    if name == "fp8 cache":  # test_schema compares inputs with arithmetic the CPU lacks for float8_e4m3fn
        checks = checks[1:]
    torch.library.opcheck(DECODE_OP, args, test_utils=checks)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("kv", ["float16", "fp8"])
def test_gpu_inductor_fullgraph_matches_eager(rng, kv):
    k, v = cache(rng, batch=2, h_kv=8, n=5000, d=128, dtype=torch.float16)
    options = {"cache_seqlens": lengths(5000, 1234)}
    if kv == "fp8":
        k, v, k_scale, v_scale = quantize_kv_cache(k, v)
        options |= {"k_scale": k_scale, "v_scale": v_scale}
    torch.manual_seed(0)
    layer = DecodeLayer(256, 32, 128, options).to(DEVICE, torch.float16)
    x = torch.tensor(rng.standard_normal((2, 256)), dtype=torch.float16, device=DEVICE)
    recorder = GraphRecorder("inductor")
    with torch.no_grad():
        compiled = torch.compile(layer, backend=recorder, fullgraph=True)(x, k, v)
        eager = layer(x, k, v)
    assert_close(compiled, eager, what=f"inductor-compiled decode layer, {kv} cache")
    assert len(recorder.targets) == 1 and DECODE_OPS & recorder.targets[0]
