"""`help()` is enough to call the public API: every public function documents its arguments (shapes, dtypes,
defaults), what it returns, and shows one call, as flash-attn's ``flash_attn_func`` does."""

from __future__ import annotations

import inspect
import re

import pytest

from flashcourse import reference

PUBLIC = {
    "reference": ["attention", "attention_lse", "softmax_naive", "softmax_safe", "softmax_online", "merge",
                  "merge_partials"],
    "kernels": ["flash_attention", "flash_attention_forward", "flash_attention_backward", "flash_decode",
                "create_block_mask", "quantize_kv_cache", "explain"],
    "kernels.fp8": ["quantize_fp8"],
    "distributed": ["shard", "unshard", "ring_attention", "ulysses_attention"],
}


def _function(module: str, name: str):
    if module == "reference":
        return getattr(reference, name)
    pytest.importorskip("torch")
    from flashcourse import device

    if not device.triton_available():
        pytest.skip("Triton is not installed here")
    import importlib

    return getattr(importlib.import_module(f"flashcourse.{module}"), name)


@pytest.mark.parametrize(("module", "name"), [(m, n) for m, names in PUBLIC.items() for n in names],
                         ids=lambda x: x)
def test_each_public_function_documents_its_arguments_its_result_and_an_example(module, name):
    function = _function(module, name)
    doc = inspect.getdoc(function) or ""
    for section in ("Args:", "Returns:", "Example"):
        assert section in doc, f"{module}.{name}'s docstring has no {section!r} section"
    args_section = doc.split("Args:")[1].split("Returns:")[0]
    # an entry starts "    name:" or "    name, other, ...:" (one level in), or is an "Other keywords" paragraph
    named = {n.strip() for entry in re.findall(r"^ {4}(\w+(?:, \w+)*):", args_section, re.MULTILINE)
             for n in entry.split(",")}
    named |= set(re.findall(r"``(\w+)``", doc.split("Other keywords:")[1])) if "Other keywords:" in doc else set()
    undocumented = [p for p in inspect.signature(function).parameters if p not in named]
    assert not undocumented, f"{module}.{name}: Args has no entry for {undocumented}"


def test_the_kernels_export_what_is_documented():
    pytest.importorskip("torch")
    from flashcourse import device

    if not device.triton_available():
        pytest.skip("Triton is not installed here")
    from flashcourse import kernels

    functions = {n for n in kernels.__all__ if inspect.isfunction(getattr(kernels, n))}
    assert functions <= set(PUBLIC["kernels"]), f"document {functions - set(PUBLIC['kernels'])} and list it here"
