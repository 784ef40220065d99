"""The hidden tests' entry point as a fresh copy of the grading package, read from its files on disk.

A hidden-test cell runs in the student's kernel, after the student's cells, which may have replaced any function
of any ``flashcourse.grading`` module in memory (``fresh_judge.hidden_test`` too). So the cell does not import
the judge: it runs this file with ``runpy.run_module`` (which executes the file's code anew, importing nothing of
it from memory), and this file loads the grading package from its folder under a new name, every module of it
fresh. The cell then calls that copy's ``hidden_test``::

    import runpy  # the judge read afresh from the installed files, out of this notebook's reach
    hidden_test = runpy.run_module("flashcourse.grading.fresh_copy")["fresh_hidden_test"]()

What stays within a student's reach (Python itself, NumPy, the other flashcourse packages) is in
docs/GRADING.md.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import uuid


def fresh_hidden_test():
    """``hidden_test`` of a copy of the grading package loaded now from its files (every module anew)."""
    return fresh_grading_package().fresh_judge.hidden_test


def fresh_grading_package():
    """A copy of the grading package loaded now from its files under a new name (also the batch grader's worker's
    copy for the restored check cells)."""
    folder = os.path.dirname(os.path.abspath(__file__))  # set by runpy from the installed file's location
    name = f"flashcourse._fresh_grading_{uuid.uuid4().hex}"  # beside grading: its "from .. import" still work
    spec = importlib.util.spec_from_file_location(name, os.path.join(folder, "__init__.py"),
                                                  submodule_search_locations=[folder])
    package = importlib.util.module_from_spec(spec)
    sys.modules[name] = package  # its relative imports (from ._core ...) load fresh copies beside it
    spec.loader.exec_module(package)
    importlib.import_module(f"{name}.fresh_judge")
    return package
