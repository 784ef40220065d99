"""flashcourse.distributed: the schedule maps (pure Python), and ring attention / Ulysses across spawned gloo
processes (world sizes 2 and 3) against one process's float64 attention on the whole sequence."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from flashcourse import reference, tolerance
from flashcourse.distributed import _group, launch, schedule

LAYOUTS = ("contiguous", "zigzag")
WEIGHT = {"full": 1.0, "lower": 0.5, "skip": 0.0}  # a block's share of the work of a full block


# ------------------------------------------------------------------------------------------------ schedule
def test_zigzag_indices_hold_an_early_and_a_late_chunk():
    assert schedule.zigzag_indices(8, 2, 0).tolist() == [0, 1, 6, 7]
    assert schedule.zigzag_indices(12, 3, 1).tolist() == [2, 3, 8, 9]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_the_ranks_hold_every_position_exactly_once(layout, world):
    n = 24
    held = np.concatenate([schedule.sequence_indices(n, world, r, layout) for r in range(world)])
    assert sorted(held.tolist()) == list(range(n))


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("n", [25, 0, 6.0])
def test_a_length_that_does_not_split_evenly_is_a_clear_error(layout, n):
    with pytest.raises(ValueError, match="equal chunks"):
        schedule.sequence_indices(n, 4, 0, layout)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("world", [1, 2, 3, 5])
def test_the_schedule_computes_each_causal_block_once(layout, world):
    chunks = world * schedule.chunks_per_rank(layout)
    seen = {}
    for rank, step in itertools.product(range(world), range(world)):
        for pair, kind in schedule.block_schedule(world, rank, step, layout).items():
            assert pair not in seen, f"chunk pair {pair} computed twice"
            seen[pair] = kind
    assert seen == {(qc, kc): schedule.block_kind(qc, kc) for qc in range(chunks) for kc in range(chunks)}


@pytest.mark.parametrize("world", [2, 3, 4])
def test_zigzag_balances_causal_work_and_contiguous_does_not(world):
    def work(layout, rank):
        return sum(WEIGHT[kind] for step in range(world)
                   for kind in schedule.block_schedule(world, rank, step, layout).values())

    zigzag = [work("zigzag", r) for r in range(world)]
    contiguous = [work("contiguous", r) for r in range(world)]
    assert len(set(zigzag)) == 1
    assert contiguous == [r + 0.5 for r in range(world)]  # rank r: r full blocks and its diagonal


@pytest.mark.parametrize("world", [1, 2, 3, 5])
def test_each_dkv_partial_travels_forward_and_ends_at_the_owner_of_its_keys(world):
    for rank, step in itertools.product(range(world), range(world)):
        route = schedule.dkv_route(world, rank, step)
        owner = schedule.kv_source(world, rank, step)
        assert len(route) == (world - step) % world
        assert route == [(rank + hop) % world for hop in range(1, len(route) + 1)]
        assert (route or [rank])[-1] == owner


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_each_ring_step_computes_exactly_the_unmasked_chunk_pairs(world, layout, causal):
    from flashcourse.distributed.ring import block_work

    size = 3
    per_rank = schedule.chunks_per_rank(layout)
    n_local = per_rank * size
    for rank, step in itertools.product(range(world), range(world)):
        work = block_work(world, rank, step, n_local=n_local, causal=causal, layout=layout)
        q_chunks = schedule.rank_chunks(world, rank, layout)
        k_chunks = schedule.rank_chunks(world, schedule.kv_source(world, rank, step), layout)
        wanted = {(i, j) for i, j in itertools.product(range(per_rank), repeat=2)
                  if not causal or schedule.block_kind(q_chunks[i], k_chunks[j]) != "skip"}
        done = set() if work is None else {(i, j) for i in range(work.rows.start // size, work.rows.stop // size)
                                           for j in range(work.cols.start // size, work.cols.stop // size)
                                           if not work.causal or j <= i}  # the mask hides local chunk j > i
        assert done == wanted, f"rank {rank} step {step}"
        if work is not None:
            assert work.causal == (causal and rank == schedule.kv_source(world, rank, step))


def test_torch_merge_equals_the_reference_merge_with_empty_parts(rng):
    from flashcourse.distributed.ring import merge_partials

    o1, o2 = rng.standard_normal((2, 5, 8))
    lse1, lse2 = rng.standard_normal((2, 5)) * 30
    lse1[1] = lse2[1] = -np.inf  # a row empty in both parts
    lse2[3] = -np.inf
    o1[1] = o2[1] = o2[3] = 0.0
    o, lse = merge_partials(*(torch.from_numpy(x) for x in (o1, lse1, o2, lse2)))
    o_ref, lse_ref = reference.merge_partials(o1, lse1, o2, lse2)
    tolerance.assert_close(o.numpy(), o_ref, what="merged o")
    tolerance.assert_close(lse.numpy(), lse_ref, what="merged lse")


def test_without_a_process_group_the_error_says_how_to_start_one():
    from flashcourse.distributed import ring_attention

    q = torch.zeros(1, 1, 4, 16)
    with pytest.raises(RuntimeError, match="init_process_group"):
        ring_attention(q, q, q)


# ------------------------------------------------------------------------------------------------ across ranks
def _attention_float64(q, k, v, do, causal):
    """o and (dq, dk, dv) of softmax(q k^T / sqrt(D)) v in float64 with autograd: (B, H, N, D) tensors."""
    q, k, v = (x.double().requires_grad_() for x in (q, k, v))
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        n = q.shape[2]
        scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), -math.inf)
    o = torch.softmax(scores, dim=-1) @ v
    o.backward(do.double())
    return o.detach(), q.grad, k.grad, v.grad


def _compare_across_ranks(device: str, dtype_name: str, head_dim: int = 16) -> None:
    """In every rank: ring (both layouts) and Ulysses, causal and not, against one process's float64 attention;
    then the errors for inputs that cannot be split."""
    from flashcourse import distributed

    world = torch.distributed.get_world_size()
    dtype = getattr(torch, dtype_name)
    n, heads = 12 * world, 6  # 6 heads: Ulysses divides them over 2 or 3 ranks
    generator = torch.Generator().manual_seed(world)
    q, k, v, do = (torch.randn(1, heads, n, head_dim, generator=generator) for _ in range(4))
    cases = [("ring", layout, causal) for layout in LAYOUTS for causal in (False, True)]
    cases += [("ulysses", "contiguous", causal) for causal in (False, True)]
    for method, layout, causal in cases:
        expected = _attention_float64(*(x.to(dtype) for x in (q, k, v, do)), causal)  # the same rounded inputs
        local = [distributed.shard(x.to(device, dtype), layout=layout).requires_grad_() for x in (q, k, v)]
        if method == "ring":
            o = distributed.ring_attention(*local, causal=causal, layout=layout)
        else:
            o = distributed.ulysses_attention(*local, causal=causal)
        o.backward(distributed.shard(do.to(device, dtype), layout=layout))
        got = [distributed.unshard(t, layout=layout) for t in (o.detach(), *(x.grad for x in local))]
        for name, mine, ref in zip(("o", "dq", "dk", "dv"), got, expected, strict=True):
            tolerance.assert_close(mine.float().cpu(), ref, dtype=dtype_name,
                                   what=f"{name} of {method} ({layout}, causal={causal}) over {world} ranks")

    with pytest.raises(ValueError, match="multiple of"):
        distributed.shard(q[:, :, :-1], layout="zigzag")
    with pytest.raises(ValueError, match="H must be a multiple"):
        distributed.ulysses_attention(*(torch.zeros(1, world + 1, 4, 16, device=device, dtype=dtype),) * 3)
    with pytest.raises(ValueError, match="even"):
        distributed.ring_attention(*(torch.zeros(1, 1, 3, 16, device=device, dtype=dtype),) * 3)

    # Grouped-query attention: `world` K/V heads for the 6 query heads (G = 3 or 2), split over the ranks by Ulysses
    k_few, v_few = k[:, :world], v[:, :world]
    group_size = heads // world
    expected = _attention_float64(q.to(dtype), *(x.to(dtype).repeat_interleave(group_size, dim=1)
                                                 for x in (k_few, v_few)), do.to(dtype), True)
    expected_dkv = [g.unflatten(1, (world, group_size)).sum(2) for g in expected[2:]]  # the group's heads summed
    for method, layout in (("ring", "zigzag"), ("ulysses", "contiguous")):
        local = [distributed.shard(x.to(device, dtype), layout=layout).requires_grad_() for x in (q, k_few, v_few)]
        attention = distributed.ring_attention if method == "ring" else distributed.ulysses_attention
        options = {"layout": layout} if method == "ring" else {}
        with pytest.raises(ValueError, match="enable_gqa=True"):
            attention(*local, causal=True, **options)
        o = attention(*local, causal=True, enable_gqa=True, **options)
        o.backward(distributed.shard(do.to(device, dtype), layout=layout))
        got = [distributed.unshard(t, layout=layout) for t in (o.detach(), *(x.grad for x in local))]
        for name, mine, ref in zip(("o", "dq", "dk", "dv"), got, [*expected[:2], *expected_dkv], strict=True):
            tolerance.assert_close(mine.float().cpu(), ref, dtype=dtype_name,
                                   what=f"{name} of {method} with {world} K/V heads over {world} ranks")

    # Shards seen through a transpose (a (B, N, H, D) buffer as (B, H, N, D)) travel the ring as dense ones do
    expected = _attention_float64(*(x.to(dtype) for x in (q, k, v, do)), True)
    local = [distributed.shard(x.to(device, dtype)).transpose(1, 2).contiguous().transpose(1, 2).requires_grad_()
             for x in (q, k, v)]
    o = distributed.ring_attention(*local, causal=True)
    o.backward(distributed.shard(do.to(device, dtype)))
    got = [distributed.unshard(t) for t in (o.detach(), *(x.grad for x in local))]
    for name, mine, ref in zip(("o", "dq", "dk", "dv"), got, expected, strict=True):
        tolerance.assert_close(mine.float().cpu(), ref, dtype=dtype_name, what=f"{name} of ring from strided shards")

    # A call the kernels refuse is refused before any rank sends: a transfer left in flight would hang the group
    shard_shape = (1, heads, 4, head_dim)
    refused = [({"scale": 0.0}, dtype, ValueError, "scale is 0"),  # (options, v's dtype, error, message)
               ({}, torch.float64, TypeError, "one dtype")]
    sent = []
    ring_shift = _group.Ring.shift

    def counted_shift(ring, tensors):
        sent.append(len(tensors))
        return ring_shift(ring, tensors)

    _group.Ring.shift = counted_shift
    try:
        for options, v_dtype, error, message in refused:
            q_shard, k_shard = (torch.zeros(shard_shape, device=device, dtype=dtype) for _ in range(2))
            v_shard = torch.zeros(shard_shape, device=device, dtype=v_dtype)
            for attention in (distributed.ring_attention, distributed.ulysses_attention):
                with pytest.raises(error, match=message):
                    attention(q_shard, k_shard, v_shard, **options)
        assert sent == [], f"a refused call started {len(sent)} ring transfers"
    finally:
        _group.Ring.shift = ring_shift


@pytest.mark.slow
@pytest.mark.parametrize("world, head_dim", [(2, 16), (3, 16), (2, 59)])
def test_ring_and_ulysses_equal_one_process_attention_on_cpu(world, head_dim):
    """Head dim 59: the per-chunk kernels the ring and Ulysses call take any head dim from 8 to 256."""
    launch.run(_compare_across_ranks, world, "cpu", "float32", head_dim)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype_name, head_dim", [("float32", 16), ("bfloat16", 16), ("bfloat16", 59)])
def test_ring_and_ulysses_equal_one_process_attention_on_two_gpus_with_nccl(dtype_name, head_dim):
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 CUDA GPUs")
    launch.run(_compare_across_ranks, 2, "cuda", dtype_name, head_dim, backend="nccl")


def _exchange_by_pairs() -> None:
    from flashcourse.distributed import ulysses

    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    sent = [torch.full((2,), 10.0 * rank + peer) for peer in range(world)]  # piece for each peer
    received = [torch.empty(2) for _ in range(world)]
    ulysses.all_to_all_by_pairs(received, sent)
    assert [r[0].item() for r in received] == [10.0 * peer + rank for peer in range(world)]


@pytest.mark.slow
def test_the_all_to_all_fallback_exchanges_every_piece():
    """Where a backend has no all-to-all (some builds' gloo), Ulysses sends and receives the pieces in pairs."""
    launch.run(_exchange_by_pairs, 3)


def _print_rank() -> None:
    print(f"I am rank {torch.distributed.get_rank()} of {torch.distributed.get_world_size()}")


def _fail_on_rank_one() -> None:
    print("before the error")
    if torch.distributed.get_rank() == 1:
        raise ValueError("rank 1 fails on purpose")
    torch.distributed.barrier()  # rank 0 would wait here for ever without the launcher stopping it


def test_the_launcher_returns_each_ranks_output_in_rank_order(capsys):
    outputs = launch.run(_print_rank, 2)
    assert outputs == ["I am rank 0 of 2\n", "I am rank 1 of 2\n"]
    launch.show(outputs)
    assert capsys.readouterr().out == "[rank 0] I am rank 0 of 2\n[rank 1] I am rank 1 of 2\n"


def test_an_error_in_one_rank_stops_the_run_and_shows_what_the_ranks_printed(capsys):
    with pytest.raises(RuntimeError, match="rank 1 failed first(.|\n)*rank 1 fails on purpose"):
        launch.run(_fail_on_rank_one, 2)
    assert "[rank 1] before the error" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------ costs, figures
def test_communication_volumes_per_rank():
    from flashcourse.distributed import cost

    shard = 1 * 16 * (1024 // 4) * 128 * 2  # one bf16 tensor's shard at N=1024 over 4 ranks
    assert cost.ring_step_bytes(1, 16, 1024, 128, 4) == 2 * shard
    assert cost.ring_bytes(1, 16, 1024, 128, 4) == 3 * 2 * shard == cost.allgather_kv_bytes(1, 16, 1024, 128, 4)
    assert cost.ulysses_bytes(1, 16, 1024, 128, 4) == 4 * shard * 3 // 4
    assert cost.ring_step_flops(1, 16, 1024, 128, 4) == 4.0 * 16 * 256**2 * 128 / 2


def test_lesson_figures_have_titles_and_labelled_axes():
    import matplotlib

    matplotlib.use("agg")
    from flashcourse import plots

    figures = [plots.ring_schedule(3),
               plots.step_time([4096, 65536], world=2, heads=16, head_dim=128, tflops=400, link_gbs=450)]
    for fig in figures:
        for ax in fig.axes:
            assert ax.get_title() and ax.get_xlabel() and ax.get_ylabel()
    assert "33%, 33%, 33%" in figures[0].axes[1].get_title()  # zigzag balances 3 ranks exactly


def test_ring_benchmark_efficiency_and_table():
    from flashcourse.bench import ring as ring_bench

    rows = [{"provider": "one_gpu_ours", "n": 8, "gpus": 1, "status": "ok", "ms": 10.0},
            {"provider": "ring_zigzag", "n": 8, "gpus": 2, "status": "ok", "ms": 5.5},
            {"provider": "cp_sdpa_flash", "n": 8, "gpus": 2, "status": "error", "error": "ImportError: no"}]
    ring_bench.add_efficiency(rows, world=2)
    assert rows[1]["efficiency"] == pytest.approx(10.0 / 11.0)
    assert "efficiency" not in rows[2]
    table = ring_bench.format_table(rows)
    assert "0.91" in table and "error (ImportError: no)" in table
