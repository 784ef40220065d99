"""Launch configurations chosen from stated device properties: no GPU needed to check what each would get."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
from flashcourse import device  # noqa: E402

if not device.triton_available():
    pytest.skip("Triton is not installed here", allow_module_level=True)
from flashcourse.kernels import configs  # noqa: E402

DEVICES = {name: configs.KNOWN_DEVICES[name] for name in ("T4", "A100", "RTX 4090", "H100", "H200")}


@pytest.mark.parametrize("name", list(DEVICES))
@pytest.mark.parametrize("block_d", [16, 32, 64, 128])
@pytest.mark.parametrize("elem_bytes", [2, 4])
@pytest.mark.parametrize("causal", [False, True])
def test_forward_config_fits_shared_memory(name, block_d, elem_bytes, causal):
    props = DEVICES[name]
    for cfg in (configs.forward_config(props, block_d, elem_bytes, causal=causal),
                configs.baseline_forward_config(props, block_d, elem_bytes)):
        assert configs.forward_smem_bytes(cfg, block_d, elem_bytes) <= props.shared_memory_per_block
        assert cfg.block_m % cfg.block_n == 0, "the causal split needs BLOCK_M to be a multiple of BLOCK_N"
        assert cfg.num_warps in (4, 8)


@pytest.mark.parametrize("name", list(DEVICES))
@pytest.mark.parametrize("block_d", [16, 64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_backward_configs_fit_and_nest(name, block_d, causal):
    props = DEVICES[name]
    dkdv, dq = configs.backward_config(props, block_d, 2, causal=causal)
    assert dkdv.block_n % dkdv.block_m == 0 and dq.block_m % dq.block_n == 0
    for cfg, resident, streamed in ((dkdv, dkdv.block_n, dkdv.block_m), (dq, dq.block_m, dq.block_n)):
        assert 2 * block_d * (2 * resident + 2 * cfg.num_stages * streamed) <= props.shared_memory_per_block


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
