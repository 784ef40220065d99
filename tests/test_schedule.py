"""The warp-schedule simulator (lesson 13, exercise 13) against timelines worked out by hand, its dependency and
input errors, and the tensor-core utilisation of the three schedules the lesson draws."""

from __future__ import annotations

import json

import pytest

from flashcourse import schedule
from flashcourse.schedule import Latencies, Op, ScheduleError

UNIT = Latencies(1, 1, 1)


def spans(timeline):
    """{(warpgroup, kind, tile): (start, end)} of a timeline."""
    return {(s.warpgroup, s.kind, s.tile): (s.start, s.end) for s in timeline.spans}


def test_one_warpgroup_in_sequence_by_hand():
    # GEMM0 1, softmax 2, GEMM1 3: each tile is 6 long and the tensor cores wait during the softmax
    timeline = schedule.simulate(schedule.sequential(2), Latencies(1, 2, 3))
    assert spans(timeline) == {(0, "gemm0", 0): (0, 1), (0, "softmax", 0): (1, 3), (0, "gemm1", 0): (3, 6),
                               (0, "gemm0", 1): (6, 7), (0, "softmax", 1): (7, 9), (0, "gemm1", 1): (9, 12)}
    assert timeline.makespan == 12 and timeline.busy(schedule.TENSOR) == 8
    assert timeline.utilisation == pytest.approx(8 / 12)


def test_pingpong_by_hand():
    # warpgroup 1 starts under warpgroup 0's first softmax; from then on each issues its GEMM1 and next GEMM0 when
    # its softmax ends, the tensor cores take them in that order, and the other's softmax runs under them
    timeline = schedule.simulate(schedule.pingpong(2), UNIT)
    assert spans(timeline) == {
        (0, "gemm0", 0): (0, 1), (0, "softmax", 0): (1, 2), (1, "gemm0", 0): (1, 2), (0, "gemm1", 0): (2, 3),
        (1, "softmax", 0): (2, 3), (0, "gemm0", 1): (3, 4), (1, "gemm1", 0): (4, 5), (0, "softmax", 1): (4, 5),
        (1, "gemm0", 1): (5, 6), (1, "softmax", 1): (6, 7), (0, "gemm1", 1): (6, 7), (1, "gemm1", 1): (7, 8)}
    assert timeline.utilisation == 1.0  # the tensor cores never wait
    assert not any(span.shared for span in timeline.spans)  # nothing issued at the same moment


def test_lock_step_shares_every_unit_and_gains_nothing_by_hand():
    # both GEMM0s at once: each at half speed, both end at 2; then both softmaxes together, while nothing else runs
    timeline = schedule.simulate(schedule.lock_step(2), UNIT)
    at = spans(timeline)
    assert at[(0, "gemm0", 0)] == at[(1, "gemm0", 0)] == (0, 2)
    assert at[(0, "softmax", 0)] == at[(1, "softmax", 0)] == (2, 4)
    assert at[(0, "gemm1", 0)] == at[(1, "gemm1", 0)] == (4, 6)  # then GEMM1 0 and GEMM0 1 of each, shared
    assert at[(0, "gemm0", 1)] == at[(1, "gemm0", 1)] == (6, 8)
    assert timeline.makespan == 12 and timeline.utilisation == pytest.approx(8 / 12)


def test_intra_warpgroup_overlap_by_hand():
    # the softmax of tile 1 runs while GEMM1 of tile 0 is on the tensor cores
    timeline = schedule.simulate(schedule.overlapped(2), UNIT)
    assert spans(timeline) == {(0, "gemm0", 0): (0, 1), (0, "softmax", 0): (1, 2), (0, "gemm0", 1): (2, 3),
                               (0, "gemm1", 0): (3, 4), (0, "softmax", 1): (3, 4), (0, "gemm1", 1): (4, 5)}
    assert timeline.utilisation == pytest.approx(4 / 5)


def test_the_three_schedules_at_hopper_rates():
    times = schedule.tile_times()
    gemm, soft = times["gemm_ns"], times["softmax_ns"]
    assert times["flop_ratio"] == 512 and times["rate_ratio"] == pytest.approx(989 / 3.9)
    assert gemm == pytest.approx(2 * 128**3 / (989e12 / 132) * 1e9)
    assert soft == pytest.approx(128**2 / (3.9e12 / 132) * 1e9)
    assert times["softmax_over_gemms"] == pytest.approx(0.4953, abs=1e-4)  # FA3 section 3: about half the GEMMs' time
    n = 8
    results = {name: schedule.simulate(build(n)) for name, build in
               [("sequential", schedule.sequential), ("pingpong", schedule.pingpong),
                ("overlapped", schedule.overlapped)]}
    assert results["sequential"].utilisation == pytest.approx(2 * gemm / (2 * gemm + soft))
    assert results["pingpong"].utilisation == pytest.approx(1.0)
    assert results["overlapped"].utilisation == pytest.approx(2 * n * gemm / (2 * n * gemm + soft))
    assert results["sequential"].utilisation < results["overlapped"].utilisation < results["pingpong"].utilisation


def test_lock_step_scores_below_pingpong_at_every_head_dim():
    # lock step is the FA2 order twice over: the softmaxes of both warpgroups leave the tensor cores idle together
    for latencies in (Latencies.hopper(), Latencies.hopper(head_dim=64), Latencies.hopper(matmul_tflops=1979.0)):
        lock = schedule.simulate(schedule.lock_step(8), latencies).utilisation
        assert lock == pytest.approx(schedule.simulate(schedule.sequential(8), latencies).utilisation)
        assert lock < 0.7 < 0.9 < schedule.simulate(schedule.pingpong(8), latencies).utilisation


def test_fa3_schedule_covers_a_softmax_twice_a_gemm():
    # D = 64 (or FP8 GEMMs): one warpgroup's own overlap falls to about two thirds; the two warpgroups together
    # keep the tensor cores busy, ping-pong alone as well as with the overlap, since the exp units are then full
    slow_exp = Latencies(1, 2, 1)
    alone = schedule.simulate(schedule.overlapped(16), slow_exp).utilisation
    both = schedule.simulate(schedule.pingpong_overlapped(16), slow_exp)
    assert alone < 0.7 < 0.95 < both.utilisation
    # past the first tile (where warpgroup 1's first softmax starts under warpgroup 0's) the softmaxes take turns
    assert not any(s.shared for s in both.spans if s.unit == schedule.EXP and s.tile > 0)
    assert both.busy(schedule.EXP) / both.makespan > 0.95


def test_units_do_their_work_and_dependencies_hold():
    for build in (schedule.sequential, schedule.pingpong, schedule.overlapped, schedule.lock_step,
                  schedule.pingpong_overlapped):
        timeline = schedule.simulate(build(5), Latencies(0.7, 1.3, 1.1, load=0.9))
        for unit in (schedule.TENSOR, schedule.EXP):  # shared or not, a unit's busy time is exactly its work
            work = sum(s.work for s in timeline.spans if s.unit == unit)
            assert timeline.busy(unit) == pytest.approx(work)
        for w in range(timeline.warpgroups):  # one warpgroup's GEMMs run one after the other
            ordered = sorted((s.start, s.end) for s in timeline.spans if s.unit == schedule.TENSOR
                             and s.warpgroup == w)
            assert all(a[1] <= b[0] + 1e-12 for a, b in zip(ordered, ordered[1:], strict=False))
        loads = sorted((s.start, s.end) for s in timeline.spans if s.unit == schedule.TMA)
        assert all(a[1] <= b[0] + 1e-12 for a, b in zip(loads, loads[1:], strict=False))
        at = spans(timeline)
        for (w, kind, j), (start, _) in at.items():
            if kind == "softmax":
                assert start >= at[(w, "gemm0", j)][1]
            if kind == "gemm1":
                assert start >= at[(w, "softmax", j)][1]
            if kind == "gemm0":
                assert start >= at[(-1, "load", j)][1]


def test_the_producer_ring_waits_for_a_free_buffer():
    timeline = schedule.simulate(schedule.sequential(3), Latencies(1, 1, 1, load=0.5), stages=1)
    at = spans(timeline)
    assert at[(-1, "load", 0)] == (0, 0.5) and at[(0, "gemm0", 0)] == (0.5, 1.5)
    assert at[(-1, "load", 1)] == (3.5, 4.0)  # buffer 0 frees when GEMM1 of tile 0 ends
    assert schedule.TMA in {s.unit for s in timeline.spans}
    with pytest.raises(ScheduleError, match="deadlock") as error:
        schedule.simulate(schedule.overlapped(3), Latencies(1, 1, 1, load=1), stages=1)
    assert error.value.rule == "deadlock"
    assert schedule.simulate(schedule.overlapped(3), Latencies(1, 1, 1, load=1), stages=2).makespan > 0


def test_ring_phases_flip_at_every_pass():
    phases = schedule.ring_phases(3, 7)
    assert [p["stage"] for p in phases] == [0, 1, 2, 0, 1, 2, 0]
    assert [p["phase"] for p in phases] == [0, 0, 0, 1, 1, 1, 0]


@pytest.mark.parametrize(("order", "rule", "words"), [
    ([Op(0, "softmax", 0), Op(0, "gemm0", 0), Op(0, "gemm1", 0)], "softmax_before_gemm0", "reads S"),
    ([Op(0, "gemm0", 0), Op(0, "gemm1", 0), Op(0, "softmax", 0)], "gemm1_before_softmax", "multiplies P"),
    ([Op(0, "gemm0", 1), Op(0, "softmax", 1), Op(0, "gemm0", 0), Op(0, "softmax", 0), Op(0, "gemm1", 0),
      Op(0, "gemm1", 1)], "softmax_order", "tile by tile"),
    ([Op(0, "gemm0", 0), Op(0, "softmax", 0), Op(0, "gemm0", 1), Op(0, "softmax", 1), Op(0, "gemm1", 1),
      Op(0, "gemm1", 0)], "gemm1_order", "rescale"),
    ([Op(0, "gemm0", 0), Op(0, "gemm0", 1), Op(0, "softmax", 0), Op(0, "gemm1", 0), Op(0, "softmax", 1),
      Op(0, "gemm1", 1)], "registers", "registers"),
])
def test_a_broken_dependency_is_named(order, rule, words):
    with pytest.raises(ScheduleError, match=words) as error:
        schedule.simulate(order, UNIT)
    assert error.value.rule == rule and "warpgroup 0" in str(error.value)


def test_two_live_score_tiles_allow_two_gemm0s_ahead():
    order = [Op(0, "gemm0", 0), Op(0, "gemm0", 1), Op(0, "softmax", 0), Op(0, "gemm1", 0), Op(0, "softmax", 1),
             Op(0, "gemm1", 1)]
    assert schedule.simulate(order, UNIT, live_scores=2).utilisation == 1.0


@pytest.mark.parametrize(("order", "rule", "words"), [
    ([], "format", "empty"),
    (5, "format", "list"),
    ([(0, "gemm0")], "format", "tuple"),
    ([(0, "exp", 0)], "format", "kind"),
    ([(0, "gemm0", -1)], "format", "non-negative"),
    ([(True, "gemm0", 0)], "format", "warpgroup"),
    ([(0, "gemm0", 0), (0, "gemm0", 0)], "duplicate", "twice"),
    ([(0, "gemm0", 0), (0, "softmax", 0)], "missing", "gemm1, tile 0"),
    (schedule.sequential(2) + [(1, "gemm0", 0), (1, "softmax", 0), (1, "gemm1", 0)], "missing", "warpgroup 1"),
])
def test_bad_orders_are_refused(order, rule, words):
    with pytest.raises(ScheduleError, match=words) as error:
        schedule.validate(order)
    assert error.value.rule == rule


def test_bad_latencies_and_options_are_refused():
    with pytest.raises(ValueError, match="softmax"):
        Latencies(1, 0, 1)
    with pytest.raises(ValueError, match="load"):
        Latencies(1, 1, 1, load=-2)
    with pytest.raises(TypeError, match="Latencies"):
        schedule.simulate(schedule.sequential(1), (1, 1, 1))
    with pytest.raises(ValueError, match="stages"):
        schedule.simulate(schedule.sequential(1), stages=0)
    with pytest.raises(ValueError, match="live_scores"):
        schedule.validate(schedule.sequential(1), live_scores=0)
    with pytest.raises(ValueError, match="tiles"):
        schedule.pingpong(0)
    with pytest.raises(ValueError, match="head_dim"):
        schedule.tile_times(head_dim=0)


def test_plain_tuples_work_and_the_table_lists_every_span():
    order = [(0, "gemm0", 0), (0, "softmax", 0), (0, "gemm1", 0)]
    timeline = schedule.simulate(order, UNIT)
    assert timeline.span(0, "gemm1", 0).start == 2
    assert len(timeline.table().splitlines()) == 4


def test_pictures_are_figures():
    from matplotlib.figure import Figure

    fig = schedule.draw_timeline(schedule.simulate(schedule.pingpong(3), Latencies(1, 1, 1, load=0.5)))
    assert isinstance(fig, Figure) and "busy" in fig.axes[0].get_title()
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()][-2:] == [schedule.TENSOR, schedule.TMA]
    def legend(figure):
        return " | ".join(t.get_text() for t in figure.axes[0].get_legend().get_texts())

    assert "pale" in legend(fig) and "hatched" not in legend(fig)  # every colour named; nothing shared here
    assert "hatched" in legend(schedule.draw_timeline(schedule.simulate(schedule.lock_step(2), UNIT)))
    assert isinstance(schedule.draw_ring(3, 7), Figure)


def test_recorded_stages_reads_the_newest_run(tmp_path):
    assert schedule.recorded_stages(tmp_path) is None
    for date in ("2026-12-01", "2026-12-03"):
        (tmp_path / f"{date}-h200-fa3-stages.json").write_text(json.dumps({"meta": {"date": date}, "rows": []}))
    assert schedule.recorded_stages(tmp_path)["meta"]["date"] == "2026-12-03"
    by_length = tmp_path / "2026-12-04-h200-fa3-stages-v8a-n1024-2048.json"  # not the complete table's name
    by_length.write_text(json.dumps({"meta": {"date": "2026-12-04"}, "rows": []}))
    assert schedule.recorded_stages(tmp_path)["meta"]["date"] == "2026-12-03"
    assert schedule.recorded_stages(tmp_path, pattern="*-fa3-stages-*-n1024-*.json")["path"] == str(by_length)


def test_stage_rates_reads_the_committed_h200_run():
    run = schedule.recorded_stages()
    assert run is not None and run["meta"]["device"] == "NVIDIA H200"
    rates = schedule.stage_rates(run, n=16384)
    assert {provider for provider, _, _ in rates} >= {"fa3-v8a", "fa3-v8e", "v7", "sdpa_cudnn"}
    assert all(100 < value < 990 for value in rates.values())  # TFLOP/s, below the dense FP16 peak
    assert set(schedule.STAGE_MODELS) == {s for s in run["meta"]["stages"]}


def test_stages_are_modelled_as_their_compiled_code_runs():
    """v8d, v8e and v8f wait for PV(j-1) before their exponentials (the SASS test), so the mapped model gives v8d
    v8c's figure and only v8g its softmax under PV; every stage of the committed run gets a row."""
    assert [s for s, m in schedule.STAGE_MODELS.items() if m.softmax_waits_for_pv] == ["v8d", "v8e", "v8f"]
    busy = {stage: schedule.predict_stage(stage, 128, tiles=8).utilisation for stage in schedule.STAGE_MODELS}
    assert busy["v8d"] == pytest.approx(busy["v8c"], rel=0.02)
    assert busy["v8g"] > 1.2 * busy["v8d"] and busy["v8e"] > 1.3 * busy["v8d"]
    rows = schedule.stage_comparison(schedule.recorded_stages())
    assert {(r["stage"], r["head_dim"]) for r in rows} == {(s, d) for s in schedule.STAGE_MODELS for d in (64, 128)}
    assert all(0.3 < r["measured"] < 0.7 and 0.3 < r["model"] <= 1.0 for r in rows)
    with pytest.raises(ValueError, match="stage='v9z'"):
        schedule.predict_stage("v9z", 128)


def test_thread_work_runs_beside_the_other_warpgroups_exponentials_by_hand():
    # softmax = thread 1 (max, scale) + exp 2 + thread 1 (sum, convert, rescale): 4 alone
    one = schedule.simulate(schedule.sequential(1), Latencies(1, 2, 1, thread=2))
    assert spans(one)[(0, "softmax", 0)] == (1, 5) and one.makespan == 6
    # two warpgroups that start their softmaxes one unit apart: w0's exponentials (1-3 after its max) overlap w1's
    # thread phase, which runs at full speed on the FMA units; lock step shares both units and takes longer
    staggered = [(0, "gemm0", 0), (0, "softmax", 0), (1, "gemm0", 0), (1, "softmax", 0), (0, "gemm1", 0),
                 (1, "gemm1", 0)]
    assert schedule.simulate(staggered, Latencies(1, 2, 1, thread=2)).makespan < schedule.simulate(
        schedule.lock_step(1), Latencies(1, 2, 1, thread=2)).makespan


def test_fa3_order_beats_pingpong_only_when_the_whole_softmax_outlasts_two_gemms():
    for head_dim, matmul in ((64, 989.0), (128, 1979.0)):  # D = 64, FP8 GEMMs: the combined order wins
        lat = Latencies.hopper(head_dim=head_dim, matmul_tflops=matmul, thread_work=True)
        assert lat.softmax + lat.thread > 2 * lat.gemm0
        assert (schedule.simulate(schedule.pingpong_overlapped(16), lat).utilisation
                > 1.3 * schedule.simulate(schedule.pingpong(16), lat).utilisation)
    lat = Latencies.hopper(thread_work=True)  # D = 128, FP16: the softmax fits, about the same
    assert lat.softmax + lat.thread < 2 * lat.gemm0
    assert schedule.simulate(schedule.pingpong_overlapped(16), lat).utilisation == pytest.approx(
        schedule.simulate(schedule.pingpong(16), lat).utilisation, rel=0.02)
    # only exponentials (the old model): identical
    lat = Latencies.hopper(head_dim=64)
    assert schedule.simulate(schedule.pingpong_overlapped(16), lat).utilisation == pytest.approx(
        schedule.simulate(schedule.pingpong(16), lat).utilisation, rel=0.01)


def test_thread_work_counts_by_hand():
    # 64 x 128 scores, (3.5 + 128/128) instructions a score at 8 x 3.9 TFLOP/s over 132 SMs
    assert schedule.thread_ns(64, 128, 128) == pytest.approx(64 * 128 * 4.5 / (3.9e12 * 8 / 132) * 1e9)
    assert Latencies.hopper(thread_work=True).thread == pytest.approx(schedule.thread_ns())
    assert Latencies.hopper().thread == 0.0
    with pytest.raises(ValueError, match="exp_on_fma"):
        Latencies.hopper(exp_on_fma=1.5)


def test_exponentials_on_the_fma_units_run_beside_the_exp_units_by_hand():
    # exp 8, a quarter on the FMA units at 6 instructions each (8 to an exp's time): 6 on MUFU beside 1.5 on FMA
    lat = Latencies(1, 8, 1, thread=2, exp_on_fma=0.25)
    assert lat.softmax_phases() == [[[schedule.FMA, 1.0]], [[schedule.EXP, 6.0], [schedule.FMA, 1.5]],
                                    [[schedule.FMA, 1.0]]]
    assert spans(schedule.simulate(schedule.sequential(1), lat))[(0, "softmax", 0)] == (1, 9)  # 1 + 6 + 1
    # the exp units alone: 8; everything on the FMA units: 6; half and half: max(4, 3) = 4
    assert schedule.simulate(schedule.sequential(1), Latencies(1, 8, 1, exp_on_fma=1.0)).makespan == 8
    assert schedule.simulate(schedule.sequential(1), Latencies(1, 8, 1, exp_on_fma=0.5)).makespan == 6


def test_softmax_waits_for_pv_when_asked():
    lat = Latencies(1, 1, 1)
    free = schedule.simulate(schedule.overlapped(2), lat)
    held = schedule.simulate(schedule.overlapped(2), lat, softmax_waits_for_pv=True)
    assert spans(free)[(0, "softmax", 1)] == (3, 4)  # under GEMM1 of tile 0
    assert spans(held)[(0, "softmax", 1)] == (4, 5)  # after it: FA2's utilisation
    assert held.utilisation == pytest.approx(4 / 6)


def test_k_and_v_released_apart_by_hand_and_no_one_buffer_deadlock():
    lat = Latencies(1, 1, 1, load=1)  # K and V half a unit each
    timeline = schedule.simulate(schedule.sequential(2), lat, stages=1, split_kv=True)
    at = spans(timeline)
    assert at[(-1, "load_k", 0)] == (0, 0.5) and at[(-1, "load_v", 0)] == (0.5, 1.0)
    assert at[(-1, "load_k", 1)] == (1.5, 2.0)  # K's one buffer frees when GEMM0 of tile 0 ends, V's waits
    assert at[(-1, "load_v", 1)] == (3.5, 4.0)  # for GEMM1 of tile 0 (GEMM0 0.5-1.5, softmax, GEMM1 2.5-3.5)
    with pytest.raises(ScheduleError, match="deadlock"):
        schedule.simulate(schedule.pingpong(4), lat, stages=1)
    assert schedule.simulate(schedule.pingpong(4), lat, stages=1, split_kv=True).makespan > 0


def test_load_times_and_the_l2_floor_by_hand():
    # a 64 KiB K/V pair at one SM's share of 4.8 TB/s; a 64-row program at 474 TFLOP/s reads 474 / 64 TB/s
    assert schedule.load_ns(128, 128) == pytest.approx(65536 / (4.8e12 / 132) * 1e9)
    assert schedule.kv_tbps_implied(474.0, 64) == pytest.approx(474 * 2 / 128)
    with pytest.raises(ValueError, match="tbps"):
        schedule.load_ns(tbps=0)


def test_lesson_13_and_14_figures_have_their_panels_and_labels():
    from matplotlib.figure import Figure

    from flashcourse import plots

    rows = schedule.stage_comparison(schedule.recorded_stages())
    fig = plots.stage_model_vs_measured(rows, title="model vs measured")
    assert isinstance(fig, Figure) and [ax.get_title() for ax in fig.axes] == ["D = 64", "D = 128"]
    assert all("peak" in ax.get_ylabel() for ax in fig.axes)
    assert len(fig.axes[0].patches) == 2 * len([r for r in rows if r["head_dim"] == 64])  # model and measured
    sweep = plots.exp_share_sweep([0.0, 0.5], {"a": [0.5, 0.9], "b": [0.6, 0.7]}, title="sweep")
    assert len(sweep.axes[0].get_lines()) == 2 and "FMA" in sweep.axes[0].get_xlabel()
