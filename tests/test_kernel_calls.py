"""No call in ``kernels/`` passes more than 20 positional arguments.

Past a handful, positional arguments are a trap: two of the same type swapped still compile, and the kernel is
wrong. Calls between kernel functions pass keywords (flags as ``MASKED=True``) or bundle state (Gluon
``aggregate`` classes). A Gluon ``warp_specialize`` partition receives its arguments as a tuple, which Gluon
passes positionally (no keywords there), so each such tuple counts as a call of the partition's function.

The check reads the source with ``ast``: no kernel is compiled or run, so it takes a fraction of a second.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

KERNELS = Path(__file__).resolve().parents[1] / "src" / "flashcourse" / "kernels"
MAX_POSITIONAL = 20


def _name(node: ast.AST) -> str:
    return ast.unparse(node)


def positional_calls(source: str) -> list[tuple[int, str, int]]:
    """(line, callee, positional arguments) of every call in ``source``, warp_specialize partitions included."""
    calls = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        calls.append((node.lineno, _name(node.func), len(node.args)))
        if _name(node.func).split(".")[-1] == "warp_specialize" and node.args:
            partitions = node.args[0]
            if isinstance(partitions, (ast.List, ast.Tuple)):
                for partition in partitions.elts:
                    if (isinstance(partition, ast.Tuple) and len(partition.elts) == 2
                            and isinstance(partition.elts[1], ast.Tuple)):
                        function, arguments = partition.elts
                        calls.append((partition.lineno, f"{_name(function)} (warp_specialize partition)",
                                      len(arguments.elts)))
    return calls


def too_long(source: str) -> list[str]:
    return [f"line {line}: {callee} with {count} positional arguments"
            for line, callee, count in positional_calls(source) if count > MAX_POSITIONAL]


SOURCES = sorted(KERNELS.rglob("*.py"))


def test_the_kernels_are_where_the_check_looks():
    names = {path.relative_to(KERNELS).as_posix() for path in SOURCES}
    assert {"forward.py", "teaching/forward.py", "hopper/fa3_backward.py"} <= names, sorted(names)


@pytest.mark.parametrize("path", SOURCES, ids=lambda path: path.relative_to(KERNELS).as_posix())
def test_no_call_passes_more_than_20_positional_arguments(path):
    found = too_long(path.read_text())
    assert not found, (f"{path.relative_to(KERNELS)}: pass keywords (or bundle the state in a Gluon aggregate) "
                       "instead of " + "; ".join(found))


def test_the_check_sees_calls_and_partitions():
    many = ", ".join(f"a{i}" for i in range(MAX_POSITIONAL + 1))
    ok = ", ".join(f"a{i}" for i in range(MAX_POSITIONAL))
    source = (f"f({many})\n"
              f"g({ok}, flag=True)\n"
              f"gl.warp_specialize([(worker, ({many},)), (other, ({ok},))], [4], [24])\n")
    assert too_long(source) == [
        f"line 1: f with {MAX_POSITIONAL + 1} positional arguments",
        f"line 3: worker (warp_specialize partition) with {MAX_POSITIONAL + 1} positional arguments",
    ]


def test_the_backward_partitions_are_counted():
    # fa3_backward.py launches its consumers through warp_specialize: the check must see those tuples.
    source = (KERNELS / "hopper" / "fa3_backward.py").read_text()
    assert any("warp_specialize partition" in callee for _, callee, _ in positional_calls(source))
