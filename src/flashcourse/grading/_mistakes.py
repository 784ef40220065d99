"""The usual mistakes, computed on purpose in float64: when a learner's output matches one of these, the check
can say which mistake it was. Nothing here is a reference; the references are ``flashcourse.reference``,
``flashcourse.tiled`` and ``flashcourse.iomodel``.
"""

from __future__ import annotations

import numpy as np

from .. import reference
from ..reference import resolve_scale

# The diagnoses, one sentence each, shared by every exercise.
SCALE_FORGOTTEN = "the scale is forgotten: multiply the scores q k^T by scale (1/sqrt(D) when scale is None)"
SCALE_TWICE = "the scale is applied twice: multiply the scores by scale exactly once"
MASK_DIAGONAL = ("the causal mask is off by one: it also hides the diagonal (key j = query i); a query may "
                 "attend to itself, so mask only j > i")
MASK_ONE_LATE = "the causal mask is off by one: it lets query i see key i + 1; mask every key j > i"
MASK_MISSING = "the causal mask is not applied: with causal=True, set the scores of keys j > i to -inf"
MASK_REVERSED = "the causal mask is reversed: it hides the past (j < i) instead of the future (j > i)"
WRONG_AXIS = ("softmax over the wrong axis: normalise each row (over the keys, axis=-1), so that every row "
              "of the weights sums to 1")
NO_MAX = ("the max is not subtracted: exp of large scores overflows to inf and inf / inf = NaN; compute "
          "exp(x - max) instead, which is the same softmax")
MASKED_ROW_NAN = ("a row whose entries are all -inf (fully masked) must give 0, not NaN: when the max is -inf, "
                  "subtract 0 instead, and do not divide by a zero sum")
SUM_NOT_RESCALED = ("the running sum is not rescaled: when the running max grows from m_old to m_new, multiply "
                    "the old sum l by exp(m_old - m_new) before adding the new block")
OUTPUT_NOT_RESCALED = ("the running output is not rescaled: when the running max grows, multiply the "
                       "accumulator by exp(m_old - m_new) before adding P_ij V_j")
NOT_NORMALISED = "the output is not normalised: divide the accumulator by the running sum l once, at the end"


EMPTY_ROW_NAN = ("NaN where a row saw no visible key (l = 0, so 0 / 0): with a right causal mask every query sees "
                 "at least itself (key j = i), so the mask is probably off by one and hides the diagonal")


def attention_nan_hint(q, k, *, causal: bool, scale) -> str | None:
    """What a NaN in an attention output most likely means on these inputs."""
    scores = np.abs(np.asarray(q, dtype=np.float64) @ np.swapaxes(np.asarray(k, dtype=np.float64), -1, -2))
    if scores.size and scores.max() * resolve_scale(scale, q.shape[-1]) > 80:
        return NO_MAX
    return EMPTY_ROW_NAN if causal else None




def causal_keep(n_q: int, n_k: int, shift: int = 0, *, reversed_: bool = False) -> np.ndarray:
    """Which keys a query sees under a (possibly wrong) causal mask: j <= i + shift, or j >= i if reversed."""
    rows = np.arange(n_q)[:, None]
    cols = np.arange(n_k)[None, :]
    return cols >= rows if reversed_ else cols <= rows + shift


def attention(q, k, v, *, causal=False, scale=None, scale_power=1.0, mask: str = "right", axis=-1) -> np.ndarray:
    """Attention with a chosen mistake. scale_power: 0 = scale forgotten, 2 = applied twice.
    mask: "right", "diagonal" (hides j = i), "late" (shows j = i + 1), "none", "reversed"; axis: softmax axis."""
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    s = (q @ np.swapaxes(k, -1, -2)) * resolve_scale(scale, q.shape[-1]) ** scale_power
    if causal and mask != "none":
        n_q, n_k = s.shape[-2:]
        keep = {"right": causal_keep(n_q, n_k), "diagonal": causal_keep(n_q, n_k, -1),
                "late": causal_keep(n_q, n_k, 1), "reversed": causal_keep(n_q, n_k, reversed_=True)}[mask]
        s = np.where(keep, s, -np.inf)
    return reference.softmax_safe(s, axis=axis) @ v


def attention_mistakes(q, k, v, *, causal: bool, scale) -> list[tuple[str, object]]:
    """(diagnosis, lazily computed output) for the usual mistakes of attention."""
    args = dict(causal=causal, scale=scale)
    found = [(SCALE_FORGOTTEN, lambda: attention(q, k, v, **args, scale_power=0)),
             (SCALE_TWICE, lambda: attention(q, k, v, **args, scale_power=2)),
             (WRONG_AXIS, lambda: attention(q, k, v, **args, axis=-2))]
    if causal:
        found += [(MASK_DIAGONAL, lambda: attention(q, k, v, **args, mask="diagonal")),
                  (MASK_ONE_LATE, lambda: attention(q, k, v, **args, mask="late")),
                  (MASK_MISSING, lambda: attention(q, k, v, **args, mask="none")),
                  (MASK_REVERSED, lambda: attention(q, k, v, **args, mask="reversed"))]
    return found


def online_stats(x, block: int, *, rescale: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """(m, l) of each row of x, block by block; rescale=False forgets to shrink the old sum."""
    x = np.asarray(x, dtype=np.float64)
    m = np.full(x.shape[:-1], -np.inf)
    l = np.zeros(x.shape[:-1])
    for start in range(0, x.shape[-1], block):
        chunk = x[..., start:start + block]
        m_new = np.maximum(m, chunk.max(axis=-1))
        safe = np.where(np.isneginf(m_new), 0.0, m_new)
        with np.errstate(invalid="ignore"):
            shrink = np.where(np.isneginf(m), 0.0, np.exp(m - safe)) if rescale else 1.0
        l = shrink * l + np.exp(chunk - safe[..., None]).sum(axis=-1)
        m = m_new
    return m, l


def flash_forward(q, k, v, *, causal=False, scale=None, block_q=16, block_k=16, rescale_l=True,
                  rescale_acc=True, normalise=True, scale_power=1.0, mask: str = "right"):
    """FA2's forward with chosen mistakes; returns (o, lse). For the running-state bugs of the tiled loop."""
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    s_all = (q @ np.swapaxes(k, -1, -2)) * resolve_scale(scale, q.shape[-1]) ** scale_power
    n_q, n_k = s_all.shape[-2:]
    if causal and mask != "none":
        keep = {"right": causal_keep(n_q, n_k), "diagonal": causal_keep(n_q, n_k, -1),
                "late": causal_keep(n_q, n_k, 1)}[mask]
        s_all = np.where(keep, s_all, -np.inf)
    o = np.zeros((*q.shape[:-1], v.shape[-1]))
    lse = np.full(q.shape[:-1], -np.inf)
    for qs in range(0, n_q, block_q):
        s_rows = s_all[..., qs:qs + block_q, :]
        m = np.full(s_rows.shape[:-1], -np.inf)
        l = np.zeros(s_rows.shape[:-1])
        acc = np.zeros((*s_rows.shape[:-1], v.shape[-1]))
        for ks in range(0, n_k, block_k):
            s = s_rows[..., ks:ks + block_k]
            m_new = np.maximum(m, s.max(axis=-1))
            safe = np.where(np.isneginf(m_new), 0.0, m_new)
            p = np.exp(s - safe[..., None])
            with np.errstate(invalid="ignore"):
                shrink = np.where(np.isneginf(m), 0.0, np.exp(m - safe))
            l = (shrink if rescale_l else 1.0) * l + p.sum(axis=-1)
            acc = (shrink[..., None] if rescale_acc else 1.0) * acc + p @ v[..., ks:ks + block_k, :]
            m = m_new
        with np.errstate(divide="ignore", invalid="ignore"):
            out = np.where(l[..., None] > 0, acc / np.where(l > 0, l, 1.0)[..., None], 0.0) if normalise else acc
            lse[..., qs:qs + block_q] = np.where(l > 0, safe + np.log(np.where(l > 0, l, 1.0)), -np.inf)
        o[..., qs:qs + block_q, :] = out
    return o, lse


def flash_mistakes(q, k, v, *, causal: bool, scale, block_q: int, block_k: int, output: int = 0):
    """(diagnosis, lazily computed output) for the running-state mistakes of a tiled forward; output 0 = o,
    1 = lse."""
    def make(**mistake):
        return lambda: flash_forward(q, k, v, causal=causal, scale=scale, block_q=block_q, block_k=block_k,
                                     **mistake)[output]
    found = [(SUM_NOT_RESCALED + " (and the output too)", make(rescale_l=False, rescale_acc=False)),
             (SUM_NOT_RESCALED, make(rescale_l=False)),
             (OUTPUT_NOT_RESCALED, make(rescale_acc=False)),
             (NOT_NORMALISED, make(normalise=False)),
             (SCALE_FORGOTTEN, make(scale_power=0)),
             (SCALE_TWICE, make(scale_power=2))]
    if causal:
        found += [(MASK_DIAGONAL, make(mask="diagonal")), (MASK_ONE_LATE, make(mask="late")),
                  (MASK_MISSING, make(mask="none"))]
    return found


def attention_grads(q, k, v, do, *, causal=False, scale=None, scale_power_dq=1.0, scale_power_dk=1.0,
                    mask: str = "right", softmax_jacobian: bool = True):
    """dq, dk, dv of attention, materialising everything, with chosen mistakes (in float64)."""
    q, k, v, do = (np.asarray(a, dtype=np.float64) for a in (q, k, v, do))
    sc = resolve_scale(scale, q.shape[-1])
    s = (q @ np.swapaxes(k, -1, -2)) * sc
    if causal and mask != "none":
        n_q, n_k = s.shape[-2:]
        keep = {"right": causal_keep(n_q, n_k), "diagonal": causal_keep(n_q, n_k, -1),
                "late": causal_keep(n_q, n_k, 1)}[mask]
        s = np.where(keep, s, -np.inf)
    p = reference.softmax_safe(s)
    dv = np.swapaxes(p, -1, -2) @ do
    dp = do @ np.swapaxes(v, -1, -2)
    ds = p * (dp - (np.sum(p * dp, axis=-1, keepdims=True) if softmax_jacobian else 0.0))
    dq = (ds @ k) * sc ** scale_power_dq
    dk = (np.swapaxes(ds, -1, -2) @ q) * sc ** scale_power_dk
    return dq, dk, dv


def grad_mistakes(q, k, v, do, *, causal: bool, scale, output: int):
    """(diagnosis, lazily computed gradient) for the usual backward mistakes; output 0 = dq, 1 = dk, 2 = dv."""
    def make(**mistake):
        return lambda: attention_grads(q, k, v, do, causal=causal, scale=scale, **mistake)[output]
    found = [("the softmax backward misses the - rowsum(P * dP) term: dS = P * (dP - D) with "
              "D = rowsum(dO * O) = rowsum(P * dP)", make(softmax_jacobian=False))]
    if output in (0, 1):
        name = "dq" if output == 0 else "dk"
        key = "scale_power_dq" if output == 0 else "scale_power_dk"
        found += [(f"{name} misses the scale: S = scale * Q K^T, so the chain rule multiplies dS by scale once",
                   make(**{key: 0})),
                  (f"{name} has the scale applied twice: multiply dS by scale exactly once", make(**{key: 2}))]
    if causal:
        found += [(MASK_DIAGONAL, make(mask="diagonal")), (MASK_ONE_LATE, make(mask="late")),
                  (MASK_MISSING, make(mask="none"))]
    return found
