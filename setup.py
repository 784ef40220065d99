"""Builds flashcourse with the course files its lessons read at run time; everything else is in pyproject.toml.

Git keeps one copy of the lesson notebooks (the interview bank's evidence reads their tagged cells) and of the
recorded GPU results (lessons 00 and 07-09 show them), at the repository's root. An installed wheel cannot see the
repository, so building one copies those files into the package as ``flashcourse/_data/``, laid out as in the
repository, where ``flashcourse.resources`` finds them. MANIFEST.in puts the same files in the sdist, so a wheel
built from it (``python -m build``, ``pip install git+...``) has them too.
"""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
COURSE_FILES = ("notebooks/*.ipynb", "benchmarks/results/*.json")  # MANIFEST.in names the same
PACKAGED_DIR = Path("flashcourse", "_data")  # flashcourse.resources.PACKAGED_DIR inside the package


class BuildPyWithCourseFiles(build_py):
    """build_py, then COURSE_FILES copied into the built package. An editable install skips the copy: its package
    stays in the checkout and reads the files where they are."""

    def run(self):
        super().run()
        if self.editable_mode:
            return
        target = Path(self.build_lib) / PACKAGED_DIR
        shutil.rmtree(target, ignore_errors=True)  # a notebook removed since an earlier build must not linger
        for pattern in COURSE_FILES:
            found = sorted(HERE.glob(pattern))
            if not found:
                raise FileNotFoundError(
                    f"building flashcourse found no {pattern} in {HERE}, and the lessons read those files at run "
                    "time: build from a clone of the repository or from its sdist (`python -m build`), which "
                    "carries them through MANIFEST.in")
            for source in found:
                destination = target / source.relative_to(HERE)
                self.mkpath(str(destination.parent))
                self.copy_file(str(source), str(destination))


setup(cmdclass={"build_py": BuildPyWithCourseFiles})
