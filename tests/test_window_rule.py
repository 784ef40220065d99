"""One window rule, written once in ``flashcourse.validation``, used by ``reference.validate_window`` (NumPy code)
and ``kernels.rules.check_window``.

Both names must stay that one function, and this table holds the rule itself: every window is accepted, to the
value below, or refused, with the exception below and one message, through each name and through each side's
entry point under every causal alignment.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from flashcourse import device  # noqa: E402

if not device.triton_available():
    pytest.skip("Triton is not installed here", allow_module_level=True)

from flashcourse import reference, validation  # noqa: E402
from flashcourse.kernels import rules  # noqa: E402

ACCEPTED = {  # window -> the checked value
    "none": (None, None),
    "local (0, 0)": ((0, 0), (0, 0)),
    "left only": ((128, 0), (128, 0)),
    "list": ([3, 2], (3, 2)),
    "left unbounded": ((-1, 4), (-1, 4)),
    "right unbounded": ((4, -1), (4, -1)),
    "both unbounded is no window": ((-1, -1), None),
    "NumPy ints": ((np.int64(5), np.int32(0)), (5, 0)),
    "past any length": ((2**40, 0), (2**40, 0)),
}
REFUSED = {  # window -> the exception both raise
    "an int": (4, TypeError),
    "a string": ("30", TypeError),
    "a float side": ((1.5, 0), TypeError),
    "a whole float": ((2.0, 0), TypeError),
    "a bool side": ((True, 0), TypeError),
    "a NumPy bool": ((0, np.bool_(False)), TypeError),
    "a None side": ((None, 0), TypeError),
    "three sides": ((1, 2, 3), TypeError),
    "one side": ((4,), TypeError),
    "empty": ((), TypeError),
    "an array": (np.array([3, 0]), TypeError),
    "a tensor": (torch.tensor([3, 0]), TypeError),
    "a range": (range(2), TypeError),
    "left below -1": ((-2, 0), ValueError),
    "right below -1": ((0, -5), ValueError),
    "NumPy side below -1": ((np.int64(-3), 0), ValueError),
}
CAUSALS = [False, True, "top_left", "bottom_right"]


def outcome(check, window):
    """("ok", value) or (exception type, message): what a validator does with ``window``."""
    try:
        return "ok", check(window)
    except (TypeError, ValueError) as error:
        return type(error), str(error)


def test_one_function_serves_both_sides():
    assert reference.validate_window is validation.check_window
    assert rules.check_window is validation.check_window


@pytest.mark.parametrize("window,expected", ACCEPTED.values(), ids=ACCEPTED.keys())
def test_both_accept_to_the_same_python_ints(window, expected):
    for check in (reference.validate_window, rules.check_window):
        verdict, value = outcome(check, window)
        assert verdict == "ok" and value == expected, f"{check.__qualname__}({window!r}) gave {verdict}: {value}"
        assert value is None or all(type(side) is int for side in value)


@pytest.mark.parametrize("window,error", REFUSED.values(), ids=REFUSED.keys())
def test_both_refuse_with_one_message(window, error):
    ours, theirs = outcome(reference.validate_window, window), outcome(rules.check_window, window)
    assert ours == theirs
    kind, message = ours
    assert kind is error
    # The message says what came and what is expected, with an example or the bound.
    assert message.startswith("window is ") and ("e.g. window=(1024, 0)" in message or ">= -1" in message)


@pytest.mark.parametrize("causal", CAUSALS, ids=str)
@pytest.mark.parametrize("window", [w for w, _ in ACCEPTED.values()] + [w for w, _ in REFUSED.values()],
                         ids=list(ACCEPTED) + list(REFUSED))
def test_entry_points_agree_under_every_causal_alignment(window, causal):
    """reference.attention_rule and rules.parse_rules (the kernels' entry) with the same causal and window."""
    q = torch.zeros(1, 1, 8, 16)

    def numpy_side(w):
        rule = reference.attention_rule(8, 8, batch=1, heads=1, causal=causal, window=w)
        return rule.causal, rule.window

    def kernel_side(w):
        rule = rules.parse_rules(q, q, causal=causal, window=w)
        return rule.causal, rule.window

    assert outcome(numpy_side, window) == outcome(kernel_side, window)
