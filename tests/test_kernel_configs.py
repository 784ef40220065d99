"""Launch configurations chosen from stated device properties: no GPU needed to check what each would get."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from flashcourse import device  # noqa: E402

if not device.triton_available():
    pytest.skip("Triton is not installed here", allow_module_level=True)
from flashcourse.kernels import configs  # noqa: E402

DEVICES = {name: configs.KNOWN_DEVICES[name] for name in ("T4", "A100", "RTX 4090", "H100", "H200")}
# The opt-in shared memory per thread block of each chip, in KB, as NVIDIA's CUDA C++ Programming Guide lists it
# per compute capability (7.5: 64, 8.0: 163, 8.9: 99, 9.0: 227). Written out here, independently of configs.
DATA_SHEET_SMEM_KB = {"T4": 64, "A100": 163, "RTX 4090": 99, "H100": 227, "H200": 227}


def tile_bytes(cfg, block_d, elem_bytes, resident_rows, streamed_rows):
    """Bytes of the tiles a kernel keeps in shared memory: resident tiles once, streamed ones per stage."""
    return elem_bytes * block_d * (resident_rows + cfg.num_stages * streamed_rows)


def test_known_devices_match_the_data_sheet():
    for name, props in DEVICES.items():
        assert props.shared_memory_per_block == DATA_SHEET_SMEM_KB[name] * 1024, name


@pytest.mark.parametrize("name", list(DEVICES))
@pytest.mark.parametrize("block_d", [16, 32, 64, 128, 256])
@pytest.mark.parametrize("elem_bytes", [2, 4])
@pytest.mark.parametrize("causal", [False, True])
def test_forward_config_fits_shared_memory(name, block_d, elem_bytes, causal):
    limit = DATA_SHEET_SMEM_KB[name] * 1024
    for cfg in (configs.forward_config(DEVICES[name], block_d, elem_bytes, causal=causal),
                configs.baseline_forward_config(DEVICES[name], block_d, elem_bytes)):
        # the Q tile stays; a K and a V tile arrive per pipeline stage
        assert tile_bytes(cfg, block_d, elem_bytes, cfg.block_m, 2 * cfg.block_n) <= limit, (name, cfg)
        assert cfg.block_m % cfg.block_n == 0, "the causal split needs BLOCK_M to be a multiple of BLOCK_N"
        assert cfg.num_warps in (4, 8)


@pytest.mark.parametrize("name", list(DEVICES))
@pytest.mark.parametrize("block_d", [16, 64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_backward_configs_fit_and_nest(name, block_d, causal):
    limit = DATA_SHEET_SMEM_KB[name] * 1024
    dkdv, dq = configs.backward_config(DEVICES[name], block_d, 2, causal=causal)
    assert dkdv.block_n % dkdv.block_m == 0 and dq.block_m % dq.block_n == 0
    # dK/dV keeps K and V of block_n rows and streams q and dO; dQ keeps q and dO and streams K and V
    assert tile_bytes(dkdv, block_d, 2, 2 * dkdv.block_n, 2 * dkdv.block_m) <= limit, (name, dkdv)
    assert tile_bytes(dq, block_d, 2, 2 * dq.block_m, 2 * dq.block_n) <= limit, (name, dq)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("head_dim", [16, 32, 64, 80, 128, 256])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_chosen_configs_compile_and_run_on_this_gpu(head_dim, dtype):
    """The proof the estimates above stand for: every kernel compiles and runs under the config chosen here."""
    from flashcourse import kernels

    dtype = getattr(torch, dtype)
    q, k, v = (torch.randn(1, 2, 300, head_dim, device="cuda", dtype=dtype, requires_grad=True) for _ in range(3))
    for causal in (False, True):
        for version in ("v3", "v6", "v7"):  # the textbook launch (v1-v3), the tuned one (v4-v7)
            kernels.flash_attention_forward(q, k, v, causal=causal, version=version)
        kernels.flash_attention(q, k, v, causal=causal).sum().backward()
    kernels.flash_decode(q[:, :, 0].detach(), k.detach(), v.detach())
    torch.cuda.synchronize()


@pytest.mark.parametrize("name", list(DEVICES))
def test_head_dim_256_gets_real_tiles_on_every_device(name):
    """D=256 must not fall through to the 16x16 emergency launch on fp16 (Gemma's head dim)."""
    fwd = configs.forward_config(DEVICES[name], 256, 2, causal=False)
    dkdv, dq = configs.backward_config(DEVICES[name], 256, 2)
    assert fwd.block_m >= 32 and fwd.block_n >= 32, fwd
    assert dkdv.block_n >= 32 and dq.block_m >= 32, (dkdv, dq)


def test_what_each_device_gets():
    t4 = configs.forward_config(DEVICES["T4"], 128, 2)
    assert t4.num_stages == 1, "Turing has no cp.async: extra stages only cost shared memory"
    assert configs.forward_smem_bytes(t4, 128, 2) <= 64 * 1024
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
