"""Launch configurations chosen from stated device properties: no GPU needed to check what each would get."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
from flashcourse import device  # noqa: E402

if not device.triton_available():
    pytest.skip("Triton is not installed here", allow_module_level=True)
from flashcourse.kernels import configs  # noqa: E402

DEVICES = dict(configs.KNOWN_DEVICES)
# The opt-in shared memory per thread block of each chip, in KB, as NVIDIA's CUDA C++ Programming Guide lists it
# per compute capability (7.5: 64, 8.0: 163, 8.6 and 8.9: 99, 9.0: 227). Written out here, independently of configs.
DATA_SHEET_SMEM_KB = {"T4": 64, "A100": 163, "A10": 99, "RTX 3090": 99, "L4": 99, "RTX 4090": 99, "H100": 227,
                      "H200": 227}


def test_known_devices_match_the_data_sheet():
    assert set(DEVICES) == set(DATA_SHEET_SMEM_KB)
    for name, props in DEVICES.items():
        assert props.shared_memory_per_block == DATA_SHEET_SMEM_KB[name] * 1024, name


def area(cfg):
    return cfg.block_m * cfg.block_n * cfg.num_stages


@pytest.mark.parametrize("name", list(DEVICES))
@pytest.mark.parametrize("block_d", [16, 32, 64, 128, 256])
@pytest.mark.parametrize("elem_bytes", [2, 4])
@pytest.mark.parametrize("causal", [False, True])
def test_forward_candidates_nest_and_step_down(name, block_d, elem_bytes, causal):
    """Whether they fit is compiled, not estimated (test_launch_fit.py); here: the rules the kernels need, and
    a list whose steps down end at the smallest launch there is."""
    for candidates in (configs.forward_candidates(DEVICES[name], block_d, elem_bytes, causal=causal),
                       configs.baseline_forward_candidates(DEVICES[name], block_d, elem_bytes)):
        for cfg in candidates:
            assert cfg.block_m % cfg.block_n == 0, "the causal split needs BLOCK_M to be a multiple of BLOCK_N"
            assert cfg.num_warps in (4, 8)
        assert candidates[-1] == configs.KernelConfig(16, 16, 4, 1)
        areas = [area(c) for c in candidates]
        assert areas[-1] == min(areas) and (len(areas) == 1 or areas[-1] < areas[0]), candidates
    assert configs.forward_config(DEVICES[name], block_d, elem_bytes, causal=causal) == \
        configs.forward_candidates(DEVICES[name], block_d, elem_bytes, causal=causal)[0]


@pytest.mark.parametrize("name", list(DEVICES))
@pytest.mark.parametrize("block_d", [16, 64, 128, 256])
@pytest.mark.parametrize("elem_bytes", [2, 4])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("grouped", [False, True])
def test_backward_candidates_nest(name, block_d, elem_bytes, causal, grouped):
    dkdv, dq = configs.backward_candidates(DEVICES[name], block_d, elem_bytes, causal=causal, grouped=grouped)
    assert all(c.block_n % c.block_m == 0 for c in dkdv) and all(c.block_m % c.block_n == 0 for c in dq)
    if not grouped:
        assert configs.backward_config(DEVICES[name], block_d, elem_bytes, causal=causal) == (dkdv[0], dq[0])
    assert len(dkdv) >= 2 and len(dq) >= 2, "a GPU that offers less needs somewhere to step down to"


def test_the_sm90_backward_launches_under_rules_are_the_sweeps_fastest():
    """The H200 sweep of b3's launches under a window and under GQA 32/8 (D = 128, causal, N = 8192, one kernel's
    launch changed at a time): the launches chosen for each run within 1% of the fastest dK/dV row of that rule,
    and the grouped dK/dV launch is the one that won under GQA."""
    results = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
    rows = json.loads((results / "2026-12-02-nvidia-h200-backward-launches-rules.json").read_text())["rows"]
    h200 = DEVICES["H200"]
    for rule, grouped in (("window 1024", False), ("GQA 32/8", True)):
        timed = [r for r in rows if r["rule"] == rule and r["varied"] in ("default", "dkdv")]
        chosen = configs.backward_candidates(h200, 128, 2, causal=True, grouped=grouped)[0][0]
        ms = {tuple(r["dkdv_config"].values()): r["ms"] for r in timed}
        key = (chosen.block_m, chosen.block_n, chosen.num_warps, chosen.num_stages)
        assert ms[key] <= 1.01 * min(ms.values()), (rule, chosen, ms)
    assert configs.backward_candidates(h200, 128, 2, causal=True, grouped=True)[0][0] != \
        configs.backward_candidates(h200, 128, 2, causal=True)[0][0]


def _run_every_kernel(head_dim, dtype):
    from flashcourse import kernels

    dtype = getattr(torch, dtype)
    q, k, v = (torch.randn(1, 2, 300, head_dim, device="cuda", dtype=dtype, requires_grad=True) for _ in range(3))
    for causal in (False, True):
        for version in ("v3", "v6", "v7"):  # the textbook launch (v1-v3), the tuned one (v4-v7)
            kernels.flash_attention_forward(q, k, v, causal=causal, version=version)
        kernels.flash_attention(q, k, v, causal=causal).sum().backward()
    kernels.flash_decode(q[:, :, 0].detach(), k.detach(), v.detach())
    torch.cuda.synchronize()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("head_dim,dtype", [(64, "float16"), (128, "bfloat16"), (256, "float16")])
def test_chosen_configs_compile_and_run_on_this_gpu(head_dim, dtype):
    """Every kernel compiles, loads and runs under the launches chosen for this GPU (no step-down warning)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        _run_every_kernel(head_dim, dtype)


@pytest.mark.gpu
@pytest.mark.sweep
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("head_dim", [16, 32, 64, 80, 96, 128, 256])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_chosen_configs_compile_and_run_every_head_dim_and_dtype(head_dim, dtype):
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        _run_every_kernel(head_dim, dtype)


@pytest.mark.parametrize("name", list(DEVICES))
def test_head_dim_256_gets_real_tiles_on_every_device(name):
    """D=256 must not fall through to the 16x16 last resort on fp16 (Gemma's head dim), except where the compiler
    leaves nothing else: the T4's backward, whose 16x32 tiles compile to 81,920 B of its 65,536 (launch_fit)."""
    fwd = configs.forward_config(DEVICES[name], 256, 2, causal=False)
    dkdv, dq = configs.backward_config(DEVICES[name], 256, 2)
    assert fwd.block_m >= 32 and fwd.block_n >= 32, fwd
    if DEVICES[name].capability >= (8, 0):
        assert dkdv.block_n >= 32 and dq.block_m >= 32, (dkdv, dq)
    else:
        assert (dkdv, dq) == (configs.KernelConfig(16, 16, 4, 1),) * 2


def test_what_each_device_gets():
    t4 = configs.forward_config(DEVICES["T4"], 128, 2)
    assert t4.num_stages == 1, "Turing has no cp.async: extra stages only cost shared memory"
    h100 = configs.forward_config(DEVICES["H100"], 128, 2)
    assert h100.block_m == 128, "Hopper's warpgroup MMA wants 128-row tiles"
    assert configs.forward_config(DEVICES["H200"], 64, 2) == configs.forward_config(DEVICES["H100"], 64, 2)
    a100 = configs.forward_config(DEVICES["A100"], 128, 2)
    rtx = configs.forward_config(DEVICES["RTX 4090"], 128, 2)
    assert a100.num_stages >= rtx.num_stages, "less shared memory, fewer stages"


def test_capabilities():
    assert not configs.supports_bf16(DEVICES["T4"])
    assert all(configs.supports_bf16(DEVICES[n]) for n in ("A100", "RTX 4090", "H100"))
    assert configs.supports_tensor_descriptors(DEVICES["H200"])
    assert not any(configs.supports_tensor_descriptors(DEVICES[n]) for n in ("T4", "A100", "RTX 4090"))


def test_decode_splits_fill_the_device():
    h200 = DEVICES["H200"]
    splits = configs.decode_num_splits(h200, batch_kv_heads=8, max_len=131072, block_n=64)
    assert splits * 8 >= 0.9 * h200.num_sms, "batch 1 needs the KV length split to use every SM"
    assert configs.decode_num_splits(h200, 8, 100, 64) == 1, "a short cache is not worth splitting"
    assert configs.decode_num_splits(h200, 512, 131072, 64) == 1, "enough (batch, head) programs already"


@pytest.mark.parametrize("gpu", ["L4", "H200"])
@pytest.mark.parametrize("block_d", [64, 128, 256])
def test_the_fp8_cache_launch(gpu, block_d):
    """On the H200 up to D = 128 the FP8 cache runs the float16 cache's launch, two programs to an SM (measured
    there: 1.26-1.49x the float16 cache, against 1.07-1.16x one to an SM); elsewhere one byte per staged element
    keeps the float16 launch's bytes of K and V in flight with twice the tiles (stages - 1 each), one program to
    an SM. Either way the split count for 8 KV heads at 32K keys follows (the H200 run's 33 and 16 splits)."""
    props = DEVICES[gpu]
    fp16 = configs.decode_config(props, block_d, 2)
    fp8 = configs.decode_config(props, block_d, 2, fp8_cache=True)
    programs = configs.decode_programs_per_sm(props, block_d, 2, fp8_cache=True)
    assert configs.decode_programs_per_sm(props, block_d, 2) == 1
    if gpu == "H200" and block_d <= 128:
        assert fp8 == fp16 == configs.KernelConfig(16, 128, 4, 3) and programs == 2
    else:
        assert (fp8.num_stages - 1) * fp8.block_n == 2 * (fp16.num_stages - 1) * fp16.block_n and programs == 1
        assert (fp8.block_m, fp8.block_n, fp8.num_warps) == (fp16.block_m, fp16.block_n, fp16.num_warps)
    if gpu == "H200" and block_d == 128:
        from dataclasses import replace

        assert configs.decode_num_splits(replace(props, num_sms=programs * props.num_sms), 8, 32768, 128) == 33
        assert configs.decode_num_splits(props, 8, 32768, 128) == 16
    assert configs.decode_config(configs.INTERPRETER, block_d, 2, fp8_cache=True) == \
        configs.decode_config(configs.INTERPRETER, block_d, 2)


def test_bfloat16_on_a_t4_names_the_gpu_and_suggests_float16(monkeypatch):
    from flashcourse.kernels import _checks

    monkeypatch.setattr(configs, "device_props", lambda device: DEVICES["T4"])
    with pytest.raises(TypeError, match=r"Tesla T4 \(compute capability 7.5\) has no bfloat16.*float16"):
        _checks.check_dtype(torch.zeros(2, dtype=torch.bfloat16), "q")
    _checks.check_dtype(torch.zeros(2, dtype=torch.float16), "q")  # float16 is fine there


def test_a_launch_that_does_not_fit_steps_down_once_with_a_warning(monkeypatch):
    """On a GPU the table does not know, OutOfResources at load time takes the next candidate, says so once
    and is remembered (faked here: the interpreter has no shared-memory limit)."""
    from triton.runtime.errors import OutOfResources

    from flashcourse.kernels import stepdown

    monkeypatch.setattr(stepdown, "_FIRST_FITTING", {})
    candidates = configs.forward_candidates(DEVICES["A10"], 128, 2)
    tried = []

    def launch(cfg):
        tried.append(cfg)
        if cfg == candidates[0]:
            raise OutOfResources(200_000, 101_376, "shared memory")
        return "ran"

    with pytest.warns(RuntimeWarning, match="does not fit this GPU.*stepping down to"):
        assert stepdown.launch_fitting("key", candidates, launch, "forward v7") == "ran"
    assert tried == [candidates[0], candidates[1]]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        stepdown.launch_fitting("key", candidates, launch, "forward v7")  # no second warning, no retry
    assert tried[-1] == candidates[1] and len(tried) == 3
    with pytest.raises(OutOfResources):
        stepdown.launch_fitting("other", candidates[:1], launch, "forward v7")  # nothing left: the error stands


def test_the_forward_steps_down_through_the_public_api(rng, monkeypatch):
    """The public call survives a first launch that does not fit and still computes attention."""
    from triton.runtime.errors import OutOfResources

    from flashcourse import kernels, reference
    from flashcourse.kernels import forward, stepdown
    from flashcourse.tolerance import assert_close

    monkeypatch.setattr(stepdown, "_FIRST_FITTING", {})
    big, small = configs.KernelConfig(64, 32, 4, 1), configs.KernelConfig(32, 16, 4, 1)
    monkeypatch.setattr(configs, "forward_candidates", lambda *a, **k: (big, small))
    real = forward._fwd_v7_kernel

    class TooBig:
        fn = real.fn

        def __getitem__(self, grid):
            def launch(**kwargs):
                if kwargs["BLOCK_M"] == big.block_m:
                    raise OutOfResources(300_000, 65_536, "shared memory")
                return real[grid](**kwargs)
            return launch

    monkeypatch.setitem(forward.FORWARD_VERSIONS, "v7", forward.FORWARD_VERSIONS["v7"].__class__(
        **{**forward.FORWARD_VERSIONS["v7"].__dict__, "kernel": TooBig()}))
    q, k, v = (torch.tensor(rng.standard_normal((1, 2, 40, 16)), dtype=torch.float32) for _ in range(3))
    with pytest.warns(RuntimeWarning, match="forward v7"):
        o = kernels.flash_attention(q, k, v, causal=True)
    assert_close(o, reference.attention(q.numpy(), k.numpy(), v.numpy(), causal=True))


def test_the_interpreter_shim_squeezes_one_element_scalars(monkeypatch):
    """Triton 3.6's interpreter converts loop bounds with int(array), which NumPy 2.4 refuses for 1-d arrays;
    the shim (applied only where the interpreter does not squeeze) makes them convert."""
    import numpy as np
    from triton.runtime import interpreter

    from flashcourse.kernels import _interpreter_compat

    def old_patch_lang_tensor(tensor, scope):  # Triton 3.6's conversion: int() of the one-element array
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data))

    monkeypatch.setattr(interpreter, "_patch_lang_tensor", old_patch_lang_tensor)
    _interpreter_compat.apply()
    assert interpreter._patch_lang_tensor is not old_patch_lang_tensor

    class Handle:
        data = np.array([7], dtype=np.int32)

    class Tensor:
        handle = Handle()

    scope = interpreter._LangPatchScope()
    interpreter._patch_lang_tensor(Tensor, scope)
    assert list(range(Tensor(), 9)) == [7, 8]
    scope.restore()
    assert not hasattr(Tensor, "__index__")
