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
    timeline = schedule.simulate(schedule.pingpong(2), UNIT)
    assert spans(timeline) == {
        (0, "gemm0", 0): (0, 1), (1, "gemm0", 0): (1, 2), (0, "softmax", 0): (1, 2), (1, "softmax", 0): (2, 3),
        (0, "gemm1", 0): (2, 3), (0, "gemm0", 1): (3, 4), (1, "gemm1", 0): (4, 5), (1, "gemm0", 1): (5, 6),
        (0, "softmax", 1): (4, 5), (1, "softmax", 1): (6, 7), (0, "gemm1", 1): (6, 7), (1, "gemm1", 1): (7, 8)}
    assert timeline.utilisation == 1.0  # each warpgroup's softmax runs under the other's GEMMs


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


def test_a_longer_softmax_separates_pingpong_from_lock_step():
    lock_step = [Op(w, kind, j) for j in range(8) for kind in schedule.KINDS for w in (0, 1)]
    slow_exp = Latencies(1, 1.5, 1)  # the softmax outlasts one GEMM (D = 64, or FP8 GEMMs)
    assert schedule.simulate(lock_step, slow_exp).utilisation == pytest.approx(0.8)
    assert schedule.simulate(schedule.pingpong(8), slow_exp).utilisation > 0.96


def test_units_never_run_two_operations_at_once_and_dependencies_hold():
    for build in (schedule.sequential, schedule.pingpong, schedule.overlapped):
        timeline = schedule.simulate(build(5), Latencies(0.7, 1.3, 1.1, load=0.9))
        for unit in (schedule.TENSOR, schedule.EXP, schedule.TMA):
            ordered = sorted((s.start, s.end) for s in timeline.spans if s.unit == unit)
            assert all(a[1] <= b[0] + 1e-12 for a, b in zip(ordered, ordered[1:], strict=False))
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
    assert isinstance(schedule.draw_ring(3, 7), Figure)


def test_recorded_stages_reads_the_newest_run(tmp_path):
    assert schedule.recorded_stages(tmp_path) is None
    for date in ("2026-12-01", "2026-12-03"):
        (tmp_path / f"{date}-h200-fa3-stages.json").write_text(json.dumps({"meta": {"date": date}, "rows": []}))
    assert schedule.recorded_stages(tmp_path)["meta"]["date"] == "2026-12-03"
