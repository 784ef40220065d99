"""What a hostile notebook runs in its own kernel before the hidden tests, shared by the grading tests."""

# Replaces every function and class of every module of flashcourse.grading in memory (the judge's own entry point,
# fresh_judge.hidden_test, included) by one that prints a pass.
BLANKET_PATCH = """
import importlib, pkgutil, types
import flashcourse.grading as grading

def passes(*args, **kwargs):
    print("passed all hidden tests")

# every module imported first (a class replaced early would break a later module's import), then patched
modules = [grading, *(importlib.import_module(f"flashcourse.grading.{info.name}")
                      for info in pkgutil.iter_modules(grading.__path__))]
for module in modules:
    for name, value in vars(module).copy().items():
        if callable(value) and not isinstance(value, types.ModuleType):
            setattr(module, name, passes)
"""
