"""The error a module raises when it needs a package of an extra that this install lacks.

The core install (``pip install flashcourse``: torch, triton, numpy) runs the kernels, the benchmarks, distributed
attention and the NumPy algorithms. The rest needs an extra (pyproject.toml): ``course`` (the lessons: JupyterLab,
ipywidgets, matplotlib, PyYAML), ``grading`` (the batch grader: nbformat, IPython), ``interview`` (the terminal
quiz and the Anki export: rich, PyYAML, genanki); ``dev`` has them all. A module that needs one imports it as

    try:
        import matplotlib
    except ImportError as error:
        raise missing("course", "matplotlib", __name__) from error
"""

from __future__ import annotations


def missing(extra: str, package: str, module: str) -> ModuleNotFoundError:
    """The error for ``module`` finding no ``package``: what to install, in words a learner can act on."""
    return ModuleNotFoundError(
        f"{module} needs {package}, which the core install of flashcourse (torch, triton, numpy) leaves out: "
        f'install the {extra} extra, pip install "flashcourse[{extra}]" (in a clone: pip install -e ".[{extra}]")',
        name=package)
