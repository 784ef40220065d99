"""The Triton exercises' checks (06-09) reject each usual mistake with the right diagnosis. The buggy answers
are plain NumPy behind the exercises' signatures (fast); two are real buggy kernels run through Triton."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import nbformat
import numpy as np
import pytest

from flashcourse import device, grading, reference
from flashcourse.grading import _mistakes as mistakes
from flashcourse.grading import ex08

device.setup()  # before anything imports triton: the interpreter is chosen when a kernel is defined
pytest.importorskip("triton")
torch = pytest.importorskip("torch")
ROOT = Path(__file__).resolve().parents[1]


def _np(t):
    return t.detach().cpu().numpy()


def _like(array, t):
    return torch.from_numpy(np.ascontiguousarray(array, dtype=np.float32)).to(t.device)


def _rejects(check, answer, *needles):
    with pytest.raises(AssertionError) as info, np.errstate(all="ignore"):
        check(answer, seed=0)
    message = str(info.value)
    for needle in needles:
        assert needle in message, f"expected {needle!r} in the message:\n{message}"


# ------------------------------------------------------------------------------------------ ex06
def _softmax_np(x, axis=-1, subtract_max=True, pad_to=None):
    x = x.astype(np.float32)
    m = x.max(axis=axis, keepdims=True) if subtract_max else np.float32(0)
    if pad_to:  # padding lanes loaded as 0 instead of -inf
        m = np.maximum(m, 0)
    e = np.exp(x - m)
    total = e.sum(axis=axis, keepdims=True)
    if pad_to:
        total = total + (pad_to - x.shape[-1]) * np.exp(-m)
    return e / total


def _long_not_rescaled(x):
    xs = _np(x).astype(np.float64)
    m, l = mistakes.online_stats(xs, 16, rescale=False)
    return _like(np.exp(xs - m[..., None]) / l[..., None], x)


EX06 = {
    "fused: max not subtracted": (grading.check_triton_softmax,
                                  lambda x: _like(_softmax_np(_np(x), subtract_max=False), x), mistakes.NO_MAX),
    "fused: wrong axis": (grading.check_triton_softmax, lambda x: _like(_softmax_np(_np(x), axis=0), x),
                          mistakes.WRONG_AXIS),
    "fused: padding loaded as 0": (grading.check_triton_softmax,
                                   lambda x: _like(_softmax_np(_np(x), pad_to=1 << (x.shape[1] - 1).bit_length()), x),
                                   "other=-float('inf')"),
    "fused: wrong dtype": (grading.check_triton_softmax,
                           lambda x: torch.from_numpy(_softmax_np(_np(x)).astype(np.float64)),
                           "dtype float64, expected float32"),
    "fused: calls torch.softmax": (grading.check_triton_softmax, lambda x: torch.softmax(x, dim=-1),
                                   "torch softmax"),
    "long rows: running sum not rescaled": (grading.check_triton_softmax_long_rows, _long_not_rescaled,
                                            mistakes.SUM_NOT_RESCALED),
}


@pytest.mark.parametrize("bug", EX06, ids=list(EX06))
def test_ex06_rejects(bug):
    check, answer, *needles = EX06[bug]
    _rejects(check, answer, *needles)


# ------------------------------------------------------------------------------------------ ex07
def _forward_np(q, k, v, causal, scale, *, rescale_l=True, rescale_acc=True, power=1, shift=0,
                subtract_max=True, block=16):
    """A tiled forward in NumPy float32 with one chosen mistake; returns torch (o, lse) like q."""
    qs, ks, vs = _np(q), _np(k), _np(v)
    scale = qs.shape[-1] ** -0.5 if scale is None else scale
    s_all = qs @ np.swapaxes(ks, -1, -2) * np.float32(scale**power)
    n_q, n_k = s_all.shape[-2:]
    if causal:
        s_all = np.where(np.arange(n_k)[None, :] > np.arange(n_q)[:, None] + shift, -np.inf, s_all)
    m = np.full(s_all.shape[:-1], -np.inf, np.float32)
    l = np.zeros(s_all.shape[:-1], np.float32)
    acc = np.zeros(qs.shape, np.float32)
    for start in range(0, n_k, block):
        s = s_all[..., start:start + block]
        m_new = np.maximum(m, s.max(-1)) if subtract_max else np.zeros_like(m)
        alpha = np.exp(m - m_new) if subtract_max else np.ones_like(m)
        p = np.exp(s - m_new[..., None])
        l = (alpha if rescale_l else 1) * l + p.sum(-1)
        acc = (alpha[..., None] if rescale_acc else 1) * acc + p @ vs[..., start:start + block, :]
        m = m_new
    return _like(acc / l[..., None], q), _like(m + np.log(l), q)


def _forward(**mistake):
    return lambda q, k, v, causal=False, scale=None: _forward_np(q, k, v, causal, scale, **mistake)


def _library_forward(q, k, v, causal=False, scale=None):
    from flashcourse.kernels import _checks  # any call into the course's kernels counts (this one is cheap)

    _checks.check_qkv(q, k, v)
    return _forward_np(q, k, v, causal, scale)


def _sdpa_forward(q, k, v, causal=False, scale=None):
    o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
    return o, torch.zeros(q.shape[:-1])


def _matmul_forward(q, k, v, causal=False, scale=None):
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    s = (q @ k.transpose(-1, -2)) * scale  # the N x N matrix, materialised outside any kernel
    if causal:
        s = s.masked_fill(torch.ones_like(s, dtype=torch.bool).triu(1), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    return torch.exp(s - lse[..., None]) @ v, lse


EX07 = {
    "forward: running sum not rescaled": (grading.check_flash_forward_triton, _forward(rescale_l=False),
                                          mistakes.SUM_NOT_RESCALED),
    "forward: output not rescaled": (grading.check_flash_forward_triton, _forward(rescale_acc=False),
                                     mistakes.OUTPUT_NOT_RESCALED),
    "forward: max not subtracted": (grading.check_flash_forward_triton, _forward(subtract_max=False),
                                    mistakes.NO_MAX),
    "forward: scale forgotten": (grading.check_flash_forward_triton, _forward(power=0), mistakes.SCALE_FORGOTTEN),
    "forward: scale twice": (grading.check_flash_forward_triton, _forward(power=2), mistakes.SCALE_TWICE),
    "forward: calls flashcourse.kernels": (grading.check_flash_forward_triton, _library_forward,
                                           "flashcourse.kernels"),
    "forward: calls SDPA": (grading.check_flash_forward_triton, _sdpa_forward, "scaled_dot_product_attention"),
    "forward: materialises N x N with torch": (grading.check_flash_forward_triton, _matmul_forward,
                                               "materialises the N x N"),
    "causal: mask off by one (one late)": (grading.check_flash_forward_triton_causal, _forward(shift=1),
                                           mistakes.MASK_ONE_LATE),
    "causal: diagonal hidden": (grading.check_flash_forward_triton_causal, _forward(shift=-1), "hides the diagonal"),
}


@pytest.mark.parametrize("bug", EX07, ids=list(EX07))
def test_ex07_rejects(bug):
    check, answer, *needles = EX07[bug]
    _rejects(check, answer, *needles)


# ------------------------------------------------------------------------------------------ ex08
def _dkdv(power_dk=1, shift=0, jacobian=True, transpose_p=True):
    def flash_backward_dkdv(q, k, v, o, lse, do, causal=False, scale=None):
        _, dk, dv = _grads_np(q, k, v, do, causal, scale, power_dk=power_dk, shift=shift, jacobian=jacobian,
                              transpose_p=transpose_p)
        return _like(dk, q), _like(dv, q)
    return flash_backward_dkdv


def _dq(power=1, shift=0, jacobian=True, also_dk=False):
    def flash_backward_dq(q, k, v, o, lse, do, causal=False, scale=None):
        dq, dk, _ = _grads_np(q, k, v, do, causal, scale, power_dq=power, shift=shift, jacobian=jacobian)
        return (_like(dq, q), _like(dk, q)) if also_dk else _like(dq, q)
    return flash_backward_dq


def _grads_np(q, k, v, do, causal, scale, *, power_dq=1, power_dk=1, shift=0, jacobian=True, transpose_p=True):
    """dq, dk, dv in float64 NumPy from the whole score matrix, with a chosen mistake."""
    qs, ks, vs, dos = (_np(t).astype(np.float64) for t in (q, k, v, do))
    scale_ = qs.shape[-1] ** -0.5 if scale is None else scale
    s = qs @ np.swapaxes(ks, -1, -2) * scale_
    if causal:
        s = np.where(np.arange(s.shape[-1])[None, :] > np.arange(s.shape[-2])[:, None] + shift, -np.inf, s)
    p = np.exp(s - s.max(-1, keepdims=True))
    p = p / p.sum(-1, keepdims=True)
    dp = dos @ np.swapaxes(vs, -1, -2)
    ds = p * (dp - (p * dp).sum(-1, keepdims=True)) if jacobian else p * dp
    dv = (np.swapaxes(p, -1, -2) if transpose_p else p) @ dos
    return ds @ ks * scale_**power_dq, np.swapaxes(ds, -1, -2) @ qs * scale_**power_dk, dv


def _attention_function(order=(0, 1, 2), nones=(None, None), power_dq=1, backward_scale=None,
                        save_unnormalised=False, returns_lse=False):
    """flash_attention through a torch.autograd.Function computed in NumPy, with a chosen wrapping mistake."""

    class Attention(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, causal, scale):
            qs, ks, vs = (_np(t).astype(np.float64) for t in (q, k, v))
            scale_ = qs.shape[-1] ** -0.5 if scale is None else scale
            s = qs @ np.swapaxes(ks, -1, -2) * scale_
            if causal:
                s = np.where(np.arange(s.shape[-1])[None, :] > np.arange(s.shape[-2])[:, None], -np.inf, s)
            m = s.max(-1)
            acc = np.exp(s - m[..., None]) @ vs  # the output before dividing by l
            l = np.exp(s - m[..., None]).sum(-1)
            o, lse = _like(acc / l[..., None], q), _like(m + np.log(l), q)
            ctx.save_for_backward(q, k, v, _like(acc, q) if save_unnormalised else o, lse)
            ctx.causal, ctx.scale = causal, scale
            return (o, lse) if returns_lse else o

        @staticmethod
        def backward(ctx, do):
            q, k, v, o, lse = (_np(t).astype(np.float64) for t in ctx.saved_tensors)
            dos = _np(do).astype(np.float64)
            scale = q.shape[-1] ** -0.5 if ctx.scale is None else ctx.scale
            scale = scale if backward_scale is None else backward_scale
            keep = np.arange(k.shape[-2])[None, :] <= np.arange(q.shape[-2])[:, None] if ctx.causal else True
            p = np.where(keep, np.exp(q @ np.swapaxes(k, -1, -2) * scale - lse[..., None]), 0.0)  # from lse
            ds = p * (dos @ np.swapaxes(v, -1, -2) - (dos * o).sum(-1, keepdims=True))
            grads = (ds @ k * scale**power_dq, np.swapaxes(ds, -1, -2) @ q * scale, np.swapaxes(p, -1, -2) @ dos)
            return (*(_like(grads[i], do) for i in order), *nones)

    def flash_attention(q, k, v, causal=False, scale=None):
        return Attention.apply(q, k, v, causal, scale)
    return flash_attention


def _without_function(q, k, v, causal=False, scale=None):
    return _like(mistakes.attention(_np(q), _np(k), _np(v), causal=causal, scale=scale), q)  # no grad_fn


def _course_backward(q, k, v, causal=False, scale=None):
    from flashcourse import kernels

    class Attention(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v):
            o, lse = kernels.flash_attention_forward(q, k, v, causal=causal, scale=scale)
            ctx.save_for_backward(q, k, v, o, lse)
            return o

        @staticmethod
        def backward(ctx, do):
            return kernels.flash_attention_backward(*ctx.saved_tensors, do, causal=causal, scale=scale)

    return Attention.apply(q, k, v)


EX08 = {
    "dv: P not transposed": (grading.check_dkdv_triton_dv, _dkdv(transpose_p=False), "dv differs"),
    "dk: scale forgotten": (grading.check_dkdv_triton_dk, _dkdv(power_dk=0), "dk misses the scale"),
    "dk: scale twice": (grading.check_dkdv_triton_dk, _dkdv(power_dk=2), "dk has the scale applied twice"),
    "dk: softmax jacobian term missing": (grading.check_dkdv_triton_dk, _dkdv(jacobian=False), "misses the - rowsum"),
    "causal: mask off by one": (grading.check_dkdv_triton_causal, _dkdv(shift=1), mistakes.MASK_ONE_LATE),
    "dq: scale forgotten": (ex08.check_dq_triton, _dq(power=0), "dq misses the scale"),
    "dq: scale twice": (ex08.check_dq_triton, _dq(power=2), "dq has the scale applied twice"),
    "dq: softmax jacobian term missing": (ex08.check_dq_triton, _dq(jacobian=False), "misses the - rowsum"),
    "dq: causal mask off by one": (ex08.check_dq_triton, _dq(shift=1), mistakes.MASK_ONE_LATE),
    "dq: returns (dq, dk)": (ex08.check_dq_triton, _dq(also_dk=True), "must return dq alone"),
    "function: gradients in the wrong order": (ex08.check_attention_function, _attention_function(order=(1, 0, 2)),
                                               "your dq is the gradient of k", "dq, dk, dv, None, None"),
    "function: no None for causal and scale": (ex08.check_attention_function, _attention_function(nones=()),
                                               "wrong number of gradients", "None for causal and scale"),
    "function: a gradient for causal": (ex08.check_attention_function,
                                        _attention_function(nones=(torch.zeros(()), None)),
                                        "gradient for causal or scale", "return None in their places"),
    "function: dq scale forgotten": (ex08.check_attention_function, _attention_function(power_dq=0),
                                     "dq misses the scale"),
    "function: backward with the default scale": (ex08.check_attention_function,
                                                  _attention_function(backward_scale=16**-0.5),
                                                  "default scale", "ctx.scale = scale"),
    "function: unnormalised output saved": (ex08.check_attention_function,
                                            _attention_function(save_unnormalised=True), "unnormalised output"),
    "function: returns (o, lse)": (ex08.check_attention_function, _attention_function(returns_lse=True),
                                   "returned a tuple of 2", "expected o alone"),
    "function: no autograd.Function": (ex08.check_attention_function, _without_function, "has no grad_fn",
                                       "FlashAttention.apply"),
    "function: calls the course's backward": (ex08.check_attention_function, _course_backward,
                                              "flashcourse.kernels.__init__.flash_attention_backward",
                                              "earns no points"),
}


@pytest.mark.parametrize("bug", EX08, ids=list(EX08))
def test_ex08_rejects(bug):
    check, answer, *needles = EX08[bug]
    _rejects(check, answer, *needles)


# ------------------------------------------------------------------------------------------ ex09
def _combine_np(o_parts, lse_parts, *, weights="right"):
    if weights == "mean":
        return o_parts.mean(axis=0), lse_parts.max(axis=0)
    if weights == "no max":
        w = np.exp(lse_parts)
        return (w[..., None] * o_parts).sum(0) / w.sum(0)[..., None], np.log(w.sum(0))
    m = lse_parts.max(axis=0)  # no guard for -inf
    w = np.exp(lse_parts - m)
    return (w[..., None] * o_parts).sum(0) / w.sum(0)[..., None], m + np.log(w.sum(0))


def _combine_shifted_by_min(o_parts, lse_parts):
    """Shifts by the smallest finite lse instead of the largest: right until the partials lie ~709 apart."""
    m = np.where(np.isneginf(lse_parts), np.inf, lse_parts).min(axis=0)
    w = np.exp(lse_parts - m)
    return (w[..., None] * o_parts).sum(0) / w.sum(0)[..., None], m + np.log(w.sum(0))


def _split_kv_shifted_by_min(q, k, v, num_splits):
    o_parts, lse_parts = [], []
    for kc, vc in zip(np.array_split(k, num_splits, axis=1), np.array_split(v, num_splits, axis=1), strict=True):
        s = np.einsum("hd,hnd->hn", q, kc) / np.sqrt(q.shape[-1])
        m = s.max(axis=1, initial=-np.inf)
        m = np.where(np.isneginf(m), 0.0, m)  # an empty split: (o, lse) = (0, -inf), as it should
        p = np.exp(s - m[:, None])
        l = p.sum(1)
        o_parts.append(np.einsum("hn,hnd->hd", p, vc) / np.where(l > 0, l, 1.0)[:, None])
        lse_parts.append(m + np.log(l))
    return _combine_shifted_by_min(np.stack(o_parts), np.stack(lse_parts))[0]


def _split_averaged(q, k, v, num_splits):
    parts = [_softmax_np(np.einsum("hd,hnd->hn", q, kc) / np.sqrt(q.shape[-1])).astype(np.float64)[:, :, None] * vc
             for kc, vc in zip(np.array_split(k, num_splits, axis=1), np.array_split(v, num_splits, axis=1),
                               strict=True) if kc.shape[1]]
    return np.mean([p.sum(axis=1) for p in parts], axis=0)


def _triton_mean(o_parts, lse_parts):
    return o_parts.mean(dim=0), lse_parts.max(dim=0).values


EX09 = {
    "combine: not rescaled (plain mean)": (grading.check_combine_partials,
                                           lambda o, lse: _combine_np(o, lse, weights="mean"),
                                           "averaged without their weights"),
    "combine: max not subtracted": (grading.check_combine_partials,
                                    lambda o, lse: _combine_np(o, lse, weights="no max"), mistakes.NO_MAX),
    "combine: NaN for a row with no keys": (grading.check_combine_partials, _combine_np, "NaN", "empty"),
    "combine: calls reference.merge_partials": (grading.check_combine_partials,
                                                lambda o, lse: reference.merge_partials(o[0], lse[0], o[1], lse[1])
                                                if len(o) > 1 else (o[0], lse[0]), "merge_partials"),
    "combine: shifted by the smallest lse": (grading.check_combine_partials, _combine_shifted_by_min,
                                             "largest lse_s", "not the smallest"),
    "split-KV: outputs averaged": (grading.check_split_kv_attention, _split_averaged, "averaged"),
    "split-KV: combine shifted by the smallest lse": (grading.check_split_kv_attention, _split_kv_shifted_by_min,
                                                      "not the smallest"),
    "triton combine: not rescaled": (grading.check_combine_triton, _triton_mean, "averaged without their weights"),
}


@pytest.mark.parametrize("bug", EX09, ids=list(EX09))
def test_ex09_rejects(bug):
    check, answer, *needles = EX09[bug]
    _rejects(check, answer, *needles)


# ------------------------------------------------------------------------------------------ real buggy kernels
def _solution_module(name: str, tmp_path: Path, edits: dict[str, str]):
    """The solution notebook's code cells (checks left out) as a module file, with text edits applied: Triton
    reads a kernel's source from its file."""
    nb = nbformat.read(ROOT / "solutions" / f"{name}.ipynb", as_version=4)
    cells = [c.source for c in nb.cells
             if c.cell_type == "code" and not c.metadata.get("nbgrader", {}).get("grade", False)]
    source = "\n\n".join(cells)
    for old, new in edits.items():
        assert old in source, old
        source = source.replace(old, new)
    path = tmp_path / f"buggy_{name}.py"
    path.write_text(re.sub(r"### (BEGIN|END) SOLUTION", "", source))
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_a_real_kernel_with_padding_loaded_as_zero_is_diagnosed(tmp_path):
    module = _solution_module("ex06_triton_softmax", tmp_path,
                              {'mask=in_row, other=-float("inf"))': "mask=in_row, other=0.0)"})
    _rejects(grading.check_triton_softmax, module.softmax_rows, "other=-float('inf')")


@pytest.mark.slow
def test_a_real_combine_kernel_that_shifts_by_the_smallest_lse_is_rejected(tmp_path):
    first_loop = "m = tl.maximum(m, tl.load(LSE_PARTS + split * n_rows + row))"
    module = _solution_module("ex09_decode_combine", tmp_path, {
        'm = tl.full([], -float("inf"), tl.float32)': 'm = tl.full([], float("inf"), tl.float32)',
        first_loop: "lse_s = tl.load(LSE_PARTS + split * n_rows + row)\n"
                    "        m = tl.where(lse_s > -float('inf'), tl.minimum(m, lse_s), m)  # empty splits skipped"})
    _rejects(grading.check_combine_triton, module.combine_triton, "not the smallest")


@pytest.mark.slow
def test_a_real_kernel_that_forgets_to_rescale_the_output_is_diagnosed(tmp_path):
    module = _solution_module("ex07_triton_forward", tmp_path,
                              {"acc = alpha[:, None] * acc + tl.dot": "acc = acc + tl.dot"})
    _rejects(grading.check_flash_forward_triton, module.flash_forward_triton, mistakes.OUTPUT_NOT_RESCALED)


@pytest.mark.slow
def test_ex08_a_real_dq_kernel_that_forgets_the_scale_is_diagnosed(tmp_path):
    module = _solution_module("ex08_triton_backward", tmp_path,
                              {"tl.store(DQ + q_offsets, dq * scale,": "tl.store(DQ + q_offsets, dq,"})
    _rejects(ex08.check_dq_triton, module.flash_backward_dq, "dq misses the scale")
    _rejects(ex08.check_attention_function, module.flash_attention, "dq misses the scale")
