"""Exercise 11's checks: each usual mistake in the ring schedule is rejected with its diagnosis, the library's own
functions earn nothing, and the answers of flashcourse.distributed.schedule (the reference) pass."""

from __future__ import annotations

import numpy as np
import pytest

from flashcourse import grading
from flashcourse.distributed import schedule
from flashcourse.grading import ex11


def _chunks(world, rank, layout):
    return [rank] if layout == "contiguous" else [rank, 2 * world - 1 - rank]


def _causal_kind(q_chunk, k_chunk):
    # written here, not taken from schedule.block_kind: the checks refuse answers that call the library
    return "full" if k_chunk < q_chunk else ("lower" if k_chunk == q_chunk else "skip")


def _schedule(world, rank, step, layout, *, source=None, kind=_causal_kind):
    source = (rank - step) % world if source is None else source
    return {(qc, kc): kind(qc, kc) for qc in _chunks(world, rank, layout) for kc in _chunks(world, source, layout)}


def _route(world, rank, step):
    owner = (rank - step) % world
    return [(rank + hop) % world for hop in range(1, (owner - rank) % world + 1)]


def _positions(chunks, size):
    return np.concatenate([np.arange(c * size, (c + 1) * size) for c in chunks])


def test_correct_answers_pass_the_hidden_tests():
    grading.check_zigzag_indices(lambda n, w, r: _positions([r, 2 * w - 1 - r], n // (2 * w)), hidden=True)
    grading.check_block_schedule(lambda w, r, s, layout: _schedule(w, r, s, layout), hidden=True)
    grading.check_dkv_route(_route, hidden=True)


ZIGZAG_MISTAKES = {
    "contiguous layout": lambda n, w, r: _positions([r], n // w),
    "off by one": lambda n, w, r: _positions([r, (2 * w - r) % (2 * w)], n // (2 * w)),
    "N/\\(2P\\) positions each, not N/P": lambda n, w, r: _positions([r, 2 * w - 1 - r], n // w) % n,
    "dtype float64: positions are integers": lambda n, w, r: _positions([r, 2 * w - 1 - r], n // (2 * w)) * 1.0,
    "differs at index": lambda n, w, r: _positions([2 * w - 1 - r, r], n // (2 * w)),  # not ascending
}


@pytest.mark.parametrize("diagnosis", ZIGZAG_MISTAKES)
def test_zigzag_mistakes_are_rejected_with_their_diagnosis(diagnosis):
    with pytest.raises(AssertionError, match=diagnosis):
        grading.check_zigzag_indices(ZIGZAG_MISTAKES[diagnosis])


SCHEDULE_MISTAKES = {
    "not \\(r \\+ s\\) mod P": lambda w, r, s, layout: _schedule(w, r, s, layout, source=(r + s) % w),
    "diagonal block .* is 'lower'": lambda w, r, s, layout: _schedule(
        w, r, s, layout, kind=lambda qc, kc: "full" if kc <= qc else "skip"),
    "the mask is reversed": lambda w, r, s, layout: _schedule(
        w, r, s, layout, kind=lambda qc, kc: "full" if kc > qc else "lower" if kc == qc else "skip"),
    "must return a dict": lambda w, r, s, layout: list(_schedule(w, r, s, layout).items()),
    "has kind 'triangle'": lambda w, r, s, layout: {
        pair: "triangle" if kind == "lower" else kind for pair, kind in _schedule(w, r, s, layout).items()},
    "yours nothing \\(pair not held\\), expected 'skip'": lambda w, r, s, layout: {
        pair: kind for pair, kind in _schedule(w, r, s, layout).items() if kind != "skip"},
}


@pytest.mark.parametrize("diagnosis", SCHEDULE_MISTAKES)
def test_schedule_mistakes_are_rejected_with_their_diagnosis(diagnosis):
    with pytest.raises(AssertionError, match=diagnosis):
        grading.check_block_schedule(SCHEDULE_MISTAKES[diagnosis])


ROUTE_MISTAKES = {
    "not this rank itself": lambda w, r, s: [r, *_route(w, r, s)],
    "travel forward .* not backward": lambda w, r, s: [(r - hop) % w for hop in range(1, len(_route(w, r, s)) + 1)],
    "the partial stays home": lambda w, r, s: _route(w, r, s) or [(r + hop) % w for hop in range(1, w + 1)],
    "must return a list of ranks": lambda w, r, s: (r - s) % w,
}


@pytest.mark.parametrize("diagnosis", ROUTE_MISTAKES)
def test_route_mistakes_are_rejected_with_their_diagnosis(diagnosis):
    with pytest.raises(AssertionError, match=diagnosis):
        grading.check_dkv_route(ROUTE_MISTAKES[diagnosis])


def _hide(tflops, link_gbs, element_bytes, heads, kv_heads):
    # written here, not taken from distributed.cost: n > e R / (G W) for a causal zigzag step
    return element_bytes * tflops * 1e12 / ((heads // kv_heads) * link_gbs * 1e9)


def test_hide_threshold_passes_the_hidden_tests():
    ex11.check_ring_hide_positions(_hide, hidden=True)


HIDE_MISTAKES = {
    "you forgot the group size G": lambda t, w, e, h, g: _hide(t, w, e, h, h),
    "G divides the threshold, it does not multiply it": lambda t, w, e, h, g: _hide(t, w, e, h, g) * (h // g) ** 2,
    "half of an n x n block": lambda t, w, e, h, g: _hide(t, w, e, h, g) / 2,
    r"Diagnosis: units(?s:.*)off by 10\^-3": lambda t, w, e, h, g: _hide(t, w, e, h, g) / 1e3,
    "must return one number": lambda t, w, e, h, g: [_hide(t, w, e, h, g)] * 2,
}


@pytest.mark.parametrize("diagnosis", HIDE_MISTAKES)
def test_hide_threshold_mistakes_are_rejected_with_their_diagnosis(diagnosis):
    with pytest.raises(AssertionError, match=diagnosis):
        ex11.check_ring_hide_positions(HIDE_MISTAKES[diagnosis])


def test_bytes_per_element_left_out_is_named_beside_the_half_block():
    with pytest.raises(AssertionError, match="bytes per element are missing"):
        ex11.check_ring_hide_positions(lambda t, w, e, h, g: _hide(t, w, 1, h, g))


def test_the_cost_module_earns_nothing():
    from flashcourse.distributed import cost

    def through_the_library(t, w, e, h, g):
        return cost.hide_positions(t, w * 1e9, element_bytes=e, group=h // g)

    with pytest.raises(AssertionError, match="hide_positions"):
        ex11.check_ring_hide_positions(through_the_library)


@pytest.mark.parametrize(("check", "library"), [(grading.check_zigzag_indices, schedule.zigzag_indices),
                                               (grading.check_block_schedule, schedule.block_schedule),
                                               (grading.check_dkv_route, schedule.dkv_route)])
def test_the_librarys_own_function_earns_nothing(check, library):
    with pytest.raises(AssertionError, match="earns no points"):
        check(library)


def test_the_exercise_is_registered_with_its_parts():
    assert [part.grade_id for part in grading.parts("ex11_ring_schedule")] == ["ex11_a", "ex11_b", "ex11_c", "ex11_d"]
    assert sum(part.points for part in grading.parts("ex11")) == 10


def test_calling_the_librarys_function_inside_your_own_is_caught():
    """A wrapper that hands the work to distributed.schedule is a library call the guard names."""
    with pytest.raises(AssertionError, match="schedule.zigzag_indices"):
        grading.check_zigzag_indices(lambda n, world, rank: schedule.zigzag_indices(n, world, rank))
