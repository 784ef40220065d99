"""Input rules that the NumPy reference and the Triton kernels share, written once.

The layering keeps the reference and the kernels apart (the reference imports nothing of ours, the kernels only
themselves and ``device``); this module is the one exception both may import, so it imports nothing of ours and
nothing outside the standard library. ``reference.validate_window`` and ``kernels.rules.check_window`` are the
function below, so a window means the same, and is refused with the same message, on both sides.
"""

from __future__ import annotations

import numbers

# A window side this long is unbounded (check_window): it reaches past any sequence a machine can hold, and it and
# the sum of two such fit in int64.
UNBOUNDED_FROM = 2**62


def check_window(window) -> tuple[int, int] | None:
    """``window`` as (left, right) Python ints, each >= -1 (-1 = unbounded on that side), or None for no window
    (None, or (-1, -1)). TypeError unless a pair of ints (NumPy's too, never bools); ValueError below -1. A side of
    ``UNBOUNDED_FROM`` or more reaches past any sequence a machine can hold: it is -1, the same mask (the reference's
    masks and the ``torch.library`` ops hold a side in int64, where 2**70 overflowed)."""
    if window is None:
        return None
    if (not isinstance(window, (tuple, list)) or len(window) != 2
            or not all(isinstance(w, numbers.Integral) and not isinstance(w, bool) for w in window)):
        raise TypeError(f"window is {window!r} ({type(window).__name__}): expected a (left, right) pair of ints, "
                        "-1 for unbounded, e.g. window=(1024, 0) for 1024 keys back and none ahead")
    left, right = int(window[0]), int(window[1])
    if left < -1 or right < -1:
        raise ValueError(f"window is {(left, right)}: each side must be >= -1 (-1 = unbounded on that side, 0 = no "
                         "key past the query's own position on that side)")
    left, right = (-1 if side >= UNBOUNDED_FROM else side for side in (left, right))
    return None if (left, right) == (-1, -1) else (left, right)


def shown_number(value: int | float) -> str:
    """A number as an error message shows it: as Python prints it, or for an int too long to read (10**400) its
    first digits and length."""
    text = str(value)
    if isinstance(value, float) or len(text) <= 24:
        return text
    return f"{text[:4]}... (an int of {len(text.lstrip('-'))} digits)"


def foreign_number_hint(name: str, value) -> str:
    """For an option given as another library's number (NumPy's float32 or int64, a 0-dim tensor), which the
    checks refuse: the words that say so and how to pass it; "" for anything else. Without it, "scale is 0.2:
    expected a number" left a learner holding a number."""
    python = (int, float)
    if type(value) in python or isinstance(value, bool):
        return ""
    if isinstance(value, numbers.Real) or getattr(value, "ndim", None) == 0:
        cast = "int" if isinstance(value, numbers.Integral) or "int" in str(getattr(value, "dtype", "")) else "float"
        kind = f"{type(value).__module__}.{type(value).__name__}"
        return f" ({kind} is not a Python number: pass {cast}({name}))"
    return ""

