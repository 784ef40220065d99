"""Exercise 13's checks: each usual mistake in the tile times and the warp schedules is rejected with its
diagnosis, the library's own schedules earn nothing, and right answers (written here, not taken from
flashcourse.schedule) pass the hidden tests."""

from __future__ import annotations

import pytest

from flashcourse import grading, schedule
from flashcourse.grading import NotImplementedYet, ex13

KINDS = ("gemm0", "softmax", "gemm1")


def _times(bq, bk, d, matmul, exp, sms, *, flops_per_term=2, per_sm=True, exps_per_score=1, to_ns=1e9):
    share = sms if per_sm else 1
    return (flops_per_term * bq * bk * d / (matmul * 1e12 / share) * to_ns,
            exps_per_score * bq * bk / (exp * 1e12 / share) * to_ns)


def _pingpong(tiles):  # warpgroup 1 starts under warpgroup 0's first softmax; then each one's GEMMs under the other's
    order = [(0, "gemm0", 0), (0, "softmax", 0), (1, "gemm0", 0)]
    for j in range(tiles):
        order += [(0, "gemm1", j)] + ([(0, "gemm0", j + 1)] if j + 1 < tiles else []) + [(1, "softmax", j)]
        order += [(1, "gemm1", j)] + ([(1, "gemm0", j + 1), (0, "softmax", j + 1)] if j + 1 < tiles else [])
    return order


def _together_from_the_start(tiles):  # the same turns, but both warpgroups begin at once
    order = [(0, "gemm0", 0), (1, "gemm0", 0)]
    for j in range(tiles):
        order += [(0, "softmax", j), (1, "softmax", j)]
        for w in (0, 1):
            order += [(w, "gemm1", j)] + ([(w, "gemm0", j + 1)] if j + 1 < tiles else [])
    return order


def _fa3(tiles):  # each warpgroup's loop is section 3.2's; it issues its GEMMs as the other's softmax starts
    order = []
    for j in range(tiles):
        for w in (0, 1):
            order += [(w, "gemm0", j)] + ([(w, "gemm1", j - 1)] if j else []) + [(w, "softmax", j)]
    return order + [(0, "gemm1", tiles - 1), (1, "gemm1", tiles - 1)]


def _overlap(tiles):
    order = [(0, "gemm0", 0), (0, "softmax", 0)]
    for j in range(1, tiles):
        order += [(0, "gemm0", j), (0, "gemm1", j - 1), (0, "softmax", j)]
    return order + [(0, "gemm1", tiles - 1)]


def test_correct_answers_pass_the_hidden_tests():
    grading.check_tile_latencies(_times, hidden=True)
    grading.check_pingpong_order(_pingpong, hidden=True)
    grading.check_overlap_order(_overlap, hidden=True)
    grading.check_fa3_order(_fa3, hidden=True)


def test_another_order_that_keeps_the_tensor_cores_as_busy_passes():
    def warpgroup_1_first(tiles):  # the same ping-pong with the roles of the warpgroups swapped
        return [(1 - w, kind, j) for w, kind, j in _pingpong(tiles)]

    grading.check_pingpong_order(warpgroup_1_first, hidden=True)


TIME_MISTAKES = {
    "2 block_q block_k D FLOPs": lambda *a: _times(*a, flops_per_term=1),
    "not of both together": lambda *a: _times(*a, flops_per_term=4),
    "one SM gets 1/sms": lambda *a: _times(*a, per_sm=False),
    "one exponential per score": lambda *a: _times(*a[:6]) [:1] + (_times(*a, exps_per_score=a[2])[1],),
    "1e9 per second); TFLOP/s": lambda *a: _times(*a, to_ns=1.0),
    "not microseconds": lambda *a: _times(*a, to_ns=1e6),
}


@pytest.mark.parametrize("diagnosis", TIME_MISTAKES)
def test_each_tile_time_mistake_is_named(diagnosis):
    with pytest.raises(AssertionError, match=diagnosis.replace("(", r"\(").replace(")", r"\)")):
        grading.check_tile_latencies(TIME_MISTAKES[diagnosis])


def test_a_malformed_tile_time_answer_says_what_to_return():
    with pytest.raises(AssertionError, match="two numbers"):
        grading.check_tile_latencies(lambda *a: 3.0)


def _lock_step(tiles):
    return [(w, kind, j) for j in range(tiles) for kind in KINDS for w in (0, 1)]


def _one_after_the_other(tiles):
    return [(w, kind, j) for w in (0, 1) for j in range(tiles) for kind in KINDS]


def _gemm1_first(tiles):
    return [(w, kind, j) for j in range(tiles) for w in (0, 1) for kind in ("gemm0", "gemm1", "softmax")]


def _gemm1s_swapped(tiles):  # warpgroup 0's GEMM1 of the second-to-last tile after that of the last tile
    order = _pingpong(tiles)
    if tiles >= 2:
        order.remove((0, "gemm1", tiles - 2))
        order.insert(order.index((0, "gemm1", tiles - 1)) + 1, (0, "gemm1", tiles - 2))
    return order


def _softmaxes_backwards(tiles):
    return ([(w, "gemm0", j) for w in (0, 1) for j in range(tiles)]
            + [(w, "softmax", j) for w in (0, 1) for j in reversed(range(tiles))]
            + [(w, "gemm1", j) for w in (0, 1) for j in range(tiles)])


PINGPONG_MISTAKES = {
    "lock step: both warpgroups run the same operation at the same moment": _lock_step,
    "issue GEMM0 of tile 0 at the same moment": _together_from_the_start,
    "no overlap: one warpgroup runs all its tiles": _one_after_the_other,
    "GEMM1 before its softmax": _gemm1_first,
    "the rescale order": _gemm1s_swapped,
    "the online softmax goes tile by tile": _softmaxes_backwards,
}


@pytest.mark.parametrize("diagnosis", PINGPONG_MISTAKES)
def test_each_pingpong_mistake_is_named(diagnosis):
    with pytest.raises(AssertionError, match=diagnosis):
        grading.check_pingpong_order(PINGPONG_MISTAKES[diagnosis])


def test_pingpong_needs_two_warpgroups_and_every_tile():
    with pytest.raises(AssertionError, match="1 warpgroup"):
        grading.check_pingpong_order(_overlap)
    with pytest.raises(AssertionError, match="is missing"):
        grading.check_pingpong_order(lambda tiles: _pingpong(tiles)[:-1])
    with pytest.raises(AssertionError, match="covers"):
        grading.check_pingpong_order(lambda tiles: _pingpong(tiles + 1))
    with pytest.raises(AssertionError, match="kind 'exp'"):
        grading.check_pingpong_order(lambda tiles: [(0, "exp", 0)])


def _fa2(tiles):
    return [(0, kind, j) for j in range(tiles) for kind in KINDS]


def _softmax_before_gemm1(tiles):
    order = [(0, "gemm0", 0), (0, "softmax", 0)]
    for j in range(1, tiles):
        order += [(0, "gemm0", j), (0, "softmax", j), (0, "gemm1", j - 1)]
    return order + [(0, "gemm1", tiles - 1)]


def _two_gemm0s_ahead(tiles):
    order = [(0, "gemm0", 0)]
    for j in range(tiles):
        order += ([(0, "gemm0", j + 1)] if j + 1 < tiles else []) + [(0, "softmax", j), (0, "gemm1", j)]
    return order


OVERLAP_MISTAKES = {
    "that is FlashAttention-2's order": _fa2,
    "GEMM1 of tile j-1 comes after the softmax of tile j": _softmax_before_gemm1,
    "too many S tiles in flight": _two_gemm0s_ahead,
    "GEMM1 before its softmax": lambda tiles: [(0, kind, j) for j in range(tiles) for kind in ("gemm0", "gemm1",
                                                                                                 "softmax")],
}


@pytest.mark.parametrize("diagnosis", OVERLAP_MISTAKES)
def test_each_overlap_mistake_is_named(diagnosis):
    with pytest.raises(AssertionError, match=diagnosis):
        grading.check_overlap_order(OVERLAP_MISTAKES[diagnosis])


def _fa3_lock_step(tiles):  # both overlap themselves, but issue everything at the same moments
    order = [(w, "gemm0", 0) for w in (0, 1)] + [(w, "softmax", 0) for w in (0, 1)]
    for j in range(1, tiles):
        for kind, tile in (("gemm0", j), ("gemm1", j - 1), ("softmax", j)):
            order += [(w, kind, tile) for w in (0, 1)]
    return order + [(w, "gemm1", tiles - 1) for w in (0, 1)]


FA3_MISTAKES = {
    "lock step": _fa3_lock_step,
    "that is ping-pong without the overlap": _pingpong,
    "1 warpgroup": _overlap,
    "too many S tiles in flight": lambda tiles: [(w, "gemm0", j) for w in (0, 1) for j in range(tiles)]
    + [(w, kind, j) for w in (0, 1) for j in range(tiles) for kind in ("softmax", "gemm1")],
}


@pytest.mark.parametrize("diagnosis", FA3_MISTAKES)
def test_each_fa3_mistake_is_named(diagnosis):
    with pytest.raises(AssertionError, match=diagnosis):
        grading.check_fa3_order(FA3_MISTAKES[diagnosis])


def test_lock_step_scores_below_pingpong_at_d128():
    # the trap the lesson warns about: at D = 128 the simulator once gave lock step ping-pong's 100%
    latencies = schedule.Latencies.hopper()
    lock = schedule.simulate(_lock_step(8), latencies).utilisation
    assert lock < 0.7 < 0.99 < schedule.simulate(_pingpong(8), latencies).utilisation


def test_the_librarys_own_answers_earn_nothing():
    with pytest.raises(AssertionError, match="schedule.pingpong_overlapped"):
        grading.check_fa3_order(schedule.pingpong_overlapped)
    with pytest.raises(AssertionError, match="schedule.pingpong"):
        grading.check_pingpong_order(schedule.pingpong)
    with pytest.raises(AssertionError, match="schedule.overlapped"):
        grading.check_overlap_order(lambda tiles: list(schedule.overlapped(tiles)))
    with pytest.raises(AssertionError, match="schedule.tile_times"):
        grading.check_tile_latencies(lambda bq, bk, d, m, e, s: tuple(
            schedule.tile_times(bq, bk, d, matmul_tflops=m, exp_tflops=e, sms=s)[k] for k in ("gemm_ns", "softmax_ns")))
    with pytest.raises(AssertionError, match="Latencies.hopper"):
        grading.check_tile_latencies(lambda bq, bk, d, m, e, s: (schedule.Latencies.hopper(bq, bk, d).gemm0, 1.0))


def test_the_graders_own_orders_earn_nothing():
    """The hole in (c): warpgroup 0 of the grader's lock-step mistake is the overlap order."""
    def borrowed(tiles):
        return [op for op in ex13._lock_step_overlapped(tiles) if op.warpgroup == 0]

    with pytest.raises(AssertionError, match="grading.ex13._lock_step_overlapped"):
        grading.check_overlap_order(borrowed)


def test_a_copy_of_the_librarys_source_earns_nothing():
    """The hole in (b): ``exec`` of ``schedule.pingpong``'s source makes a new function that the call watcher
    used to miss; a copy of ``pingpong_overlapped`` for (d) likewise."""
    import inspect
    import textwrap

    for check, function in ((grading.check_pingpong_order, schedule.pingpong),
                            (grading.check_fa3_order, schedule.pingpong_overlapped)):
        namespace = dict(vars(schedule))
        exec(textwrap.dedent(inspect.getsource(function)), namespace)
        copy = namespace[function.__name__]
        assert copy.__code__ is not function.__code__
        with pytest.raises(AssertionError, match=f"schedule.{function.__name__} \\(or a copy of it\\)"):
            check(copy)


def test_plain_pingpong_loses_part_d_once_the_softmax_thread_work_counts():
    """(d)'s payoff: at D = 64 and in FP8 with the thread work, FA3's order beats ping-pong by a third, and a
    ping-pong order that passes (b) is told that it does not overlap itself."""
    lat = schedule.Latencies.hopper(head_dim=64, thread_work=True)
    assert (schedule.simulate(_fa3(6), lat).utilisation > 1.3 * schedule.simulate(_pingpong(6), lat).utilisation)
    grading.check_pingpong_order(_pingpong)
    with pytest.raises(AssertionError, match="does not overlap itself"):
        grading.check_fa3_order(_pingpong)


def test_a_stub_says_not_implemented():
    def stub(*args):
        raise NotImplementedError("fill in the TODO")

    for check in (grading.check_tile_latencies, grading.check_pingpong_order, grading.check_overlap_order,
                  grading.check_fa3_order):
        with pytest.raises(NotImplementedYet, match="not implemented yet"):
            check(stub)


def test_the_parts_and_their_points():
    assert [part.grade_id for part in grading.parts("ex13_warp_schedule")] == ["ex13_a", "ex13_b", "ex13_c",
                                                                               "ex13_d"]
    assert sum(part.points for part in grading.parts("ex13")) == 12
    assert ex13.PARTS[1].title == "pingpong_order"


def test_an_order_as_busy_as_a_mistake_is_told_so_not_called_that_mistake():
    def turns_without_stagger(tiles):  # FA2's loop for each warpgroup in turn: as busy as one after the other
        return [(w, kind, j) for j in range(tiles) for w in (0, 1) for kind in KINDS]

    with pytest.raises(AssertionError, match="exactly as busy as a usual mistake, which may be why: no overlap"):
        grading.check_pingpong_order(turns_without_stagger)
