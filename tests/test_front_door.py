"""The shape of a call's path, read from the source: every entry point hands its call to the front door
(``kernels/call.py``) and does nothing else; the plan imports no check; decode keeps no plan, key or check of its
own; one forward and one backward implementation serve the eager calls and the ``torch.library`` ops.

The checks read the modules with ``ast`` (nothing is compiled or run but one small call), so they take a fraction
of a second.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

KERNELS = Path(__file__).resolve().parents[1] / "src" / "flashcourse" / "kernels"
ENTRY_POINTS = {"flash_attention": "attention_call", "flash_attention_forward": "forward_call",
                "flash_attention_backward": "backward_call", "explain": "explain_call", "flash_decode": "decode_call"}


def _tree(name: str) -> ast.Module:
    return ast.parse((KERNELS / name).read_text())


def _functions(tree: ast.AST) -> dict[str, ast.FunctionDef]:
    return {node.name: node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}


def _imported(tree: ast.Module, module: str) -> set[str]:
    """The names ``tree`` imports from the sibling ``module`` (``from .module import ...``), or "*module" for
    ``from . import module``."""
    names = set()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module == module:
                names |= {alias.name for alias in node.names}
            elif node.module is None:
                names |= {f"*{alias.name}" for alias in node.names if alias.name == module}
    return names


def _called(function: ast.FunctionDef) -> set[str]:
    return {ast.unparse(node.func) for node in ast.walk(function) if isinstance(node, ast.Call)}


@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
def test_each_entry_point_makes_exactly_one_front_door_call(entry):
    body = _functions(_tree("__init__.py"))[entry].body
    statements = [s for s in body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    assert len(statements) == 1 and isinstance(statements[0], ast.Return), (
        f"{entry} does more than hand its call to the front door: {[ast.unparse(s)[:60] for s in statements]}")
    call = statements[0].value
    assert isinstance(call, ast.Call) and ast.unparse(call.func) == f"call.{ENTRY_POINTS[entry]}"
    assert ENTRY_POINTS[entry] in _functions(_tree("call.py"))


def test_the_plan_imports_no_check_and_no_parse_function():
    tree = _tree("plan.py")
    assert not _imported(tree, "_checks"), "plan.py imports checks: they belong to the front door (call.py)"
    assert _imported(tree, "rules") <= {"Rules"}, "plan.py parses options: the front door does (call.py)"


def test_decode_keeps_no_plan_key_or_check_of_its_own():
    tree = _tree("decode.py")
    classes = {node.name for node in ast.walk(tree) if isinstance(node, ast.ClassDef)}
    assert not any("Plan" in name for name in classes), classes
    assert not _imported(tree, "plan") and not _imported(tree, "_checks"), "decode.py reaches the plan or checks"
    functions = set(_functions(tree))
    assert not functions & {"_launch_key", "keyable_options", "_first_call", "flash_decode"}, functions
    assert not any(name.startswith("check_") for name in functions), functions


def test_the_ops_and_the_eager_function_run_one_implementation():
    functions = _functions(_tree("ops.py"))
    assert "attention_forward_impl" in _called(functions["attention_forward"])  # the op's body
    assert "attention_forward_impl" in _called(functions["forward"])  # FlashAttentionFunction.forward
    assert "attention_backward_impl" in _called(functions["attention_backward"])
    assert "attention_backward_impl" in _called(functions["backward"])
    assert "decode_eager" in _called(functions["decode"])  # the decode op's body is the eager call's


def test_an_eager_call_does_not_go_through_the_dispatcher(monkeypatch):
    """The op costs host time on every call (ops.py's docstring): eager calls run the implementation directly."""
    torch = pytest.importorskip("torch")
    from flashcourse import kernels
    from flashcourse.kernels import ops

    def refuse(*args, **kwargs):
        raise AssertionError("an eager call went through the torch.library op")

    monkeypatch.setattr(ops, "attention_forward", refuse)
    monkeypatch.setattr(ops, "attention_backward", refuse)
    q = torch.randn(1, 2, 20, 16, requires_grad=True)
    kernels.flash_attention(q, q, q, causal=True).sum().backward()
    assert q.grad is not None
