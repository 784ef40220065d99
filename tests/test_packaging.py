"""The conda environments and pyproject.toml name the same packages with the same constraints, both ways; the
extras cover every package the source imports, and [dev] holds them all."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest
import tomllib
import yaml
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _conda_requirements(path: Path) -> tuple[set[str], bool]:
    """Normalised requirements of a conda environment file, and whether it installs the course (`-e .`)."""
    env = yaml.safe_load(path.read_text())
    assert env["channels"] == ["conda-forge"], f"{path.name}: use conda-forge only"
    found, editable = set(), False
    for dep in env["dependencies"]:
        if isinstance(dep, dict):
            for line in dep["pip"]:
                if line.strip() == "-e .":
                    editable = True
                else:
                    found.add(str(Requirement(line)))
        elif dep == "pip":
            continue
        else:
            found.add(str(Requirement(dep)))
    return found, editable


def _project_requirements() -> set[str]:
    """What the conda environments install: Python, the core dependencies and the `course` extra (`make lab`)."""
    project = _pyproject()["project"]
    reqs = {str(Requirement(r)) for r in project["dependencies"] + project["optional-dependencies"]["course"]}
    reqs.add(str(Requirement(f"python{project['requires-python']}")))
    return reqs


def _extras() -> dict[str, list[Requirement]]:
    return {name: [Requirement(r) for r in reqs]
            for name, reqs in _pyproject()["project"]["optional-dependencies"].items()}


# The import name of each package the source may import, and the distribution that provides it.
DISTRIBUTION = {"numpy": "numpy", "torch": "torch", "triton": "triton", "matplotlib": "matplotlib",
                "ipywidgets": "ipywidgets", "IPython": "ipython", "yaml": "pyyaml", "nbformat": "nbformat",
                "rich": "rich", "genanki": "genanki", "ipykernel": "ipykernel"}


def _third_party_imports() -> dict[str, set[str]]:
    """Top-level names the package imports that are neither the standard library nor flashcourse -> files."""
    found: dict[str, set[str]] = {}
    for path in sorted((ROOT / "src" / "flashcourse").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top != "flashcourse":
                    found.setdefault(top, set()).add(path.relative_to(ROOT).as_posix())
    return found


def test_environment_yml_matches_pyproject():
    conda, editable = _conda_requirements(ROOT / "environment.yml")
    project = _project_requirements()
    assert conda - project == set(), f"in environment.yml but not pyproject.toml: {sorted(conda - project)}"
    assert project - conda == set(), f"in pyproject.toml but not environment.yml: {sorted(project - conda)}"
    assert editable, "environment.yml must install the course itself with `-e .` in its pip section"


def test_binder_environment_matches_and_post_build_installs_the_course():
    binder, editable = _conda_requirements(ROOT / ".binder" / "environment.yml")
    assert binder == _project_requirements()
    assert not editable, "Binder builds the environment before the repository exists: install it in postBuild"
    post_build = (ROOT / ".binder" / "postBuild").read_text()
    assert "pip install" in post_build and " ." in post_build


def test_the_core_install_is_torch_triton_and_numpy():
    core = {Requirement(r).name for r in _pyproject()["project"]["dependencies"]}
    assert core == {"torch", "triton", "numpy"}, "the notebook stack, the grader and the quiz belong in extras"


def test_dev_holds_every_other_extra_and_anki_stays_an_alias():
    extras = _extras()
    assert {"course", "grading", "interview", "dev"} <= set(extras)
    own = [r for r in extras["dev"] if r.name == "flashcourse"]
    assert len(own) == 1 and own[0].extras == set(extras) - {"dev", "anki"}, (
        f"[dev] must name every other extra as flashcourse[...]: it names {own[0].extras if own else None}")
    assert {str(r) for r in extras["anki"]} <= {str(r) for r in extras["interview"]}


def test_every_package_the_source_imports_is_in_the_core_or_an_extra():
    listed = {Requirement(r).name for r in _pyproject()["project"]["dependencies"]}
    listed |= {r.name for reqs in _extras().values() for r in reqs}
    imports = _third_party_imports()
    unknown = {name: files for name, files in imports.items() if name not in DISTRIBUTION}
    assert unknown == {}, f"imports of packages this test does not know: add them to DISTRIBUTION: {unknown}"
    missing = {name: files for name, files in imports.items() if DISTRIBUTION[name] not in listed}
    assert missing == {}, f"imported but in no install of pyproject.toml: {missing}"


def test_make_installs_course_for_the_lab_and_dev_for_the_tests():
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r'pip install .*-e "\.\[\$\(1\)\]"', makefile)
    assert "$(call install,course)" in makefile and "$(call install,dev)" in makefile
    lab = re.search(r"^lab: *(.*)$", makefile, re.MULTILINE)[1]
    test = re.search(r"^test: *(.*)$", makefile, re.MULTILINE)[1]
    assert "course" in lab and test.strip() == "setup", (lab, test)


def test_triton_is_linux_only_and_version_is_consistent():
    import flashcourse

    deps = [Requirement(r) for r in _pyproject()["project"]["dependencies"]]
    triton = next(r for r in deps if r.name == "triton")
    assert triton.marker is not None and triton.marker.evaluate({"sys_platform": "darwin"}) is False
    assert triton.specifier.contains("3.6.0") and not triton.specifier.contains("3.5.0"), (
        "the lower bound is the Triton the GPU runs were made with (3.6)")
    assert _pyproject()["project"]["version"] == flashcourse.__version__
    assert f"## {flashcourse.__version__}" in (ROOT / "CHANGELOG.md").read_text()


def test_ci_runs_the_readme_test_command():
    assert "make test" in (ROOT / ".ci" / "run").read_text()
    assert "make test" in (ROOT / "README.md").read_text()
    assert "make lab" in (ROOT / "README.md").read_text()


def test_readme_links_resolve():
    readme = (ROOT / "README.md").read_text()
    targets = re.findall(r"\]\(([^)#]+)\)", readme)
    local = [t for t in targets if "://" not in t]
    assert len(local) > 20, "the syllabus links every lesson and exercise"
    missing = [t for t in local if not (ROOT / t).exists()]
    assert not missing, f"README links to files that do not exist: {missing}"


def test_a_checkout_reads_and_writes_course_files_in_place():
    from flashcourse import bench, resources
    from flashcourse.interview import evidence

    results = ROOT / "benchmarks" / "results"
    assert resources.checkout_root() == ROOT and resources.course_root() == ROOT
    assert bench.results_dir() == resources.new_results_dir() == results
    assert evidence.results_value(f"benchmarks/results/{next(results.glob('*.json')).name}", "meta.date")


def test_installed_without_a_checkout(monkeypatch, tmp_path):
    """As from a wheel: new runs go under the current folder, and a package that lacks its course files says how
    to get them (the wheel test checks the real, installed case)."""
    from flashcourse import resources
    from flashcourse.bench.__main__ import main

    monkeypatch.setattr(resources, "checkout_root", lambda: None)
    monkeypatch.chdir(tmp_path)
    assert resources.new_results_dir() == tmp_path / "benchmarks" / "results"
    # The checkout's src/flashcourse has no _data folder: only a built wheel does.
    with pytest.raises(FileNotFoundError, match=r"_data .*Reinstall from the repository"):
        resources.course_root()
    with pytest.raises(SystemExit, match="run it in a clone of the repository"):
        main(["table", "--write", "--results", str(ROOT / "benchmarks" / "results")])


def test_only_resources_counts_parent_folders():
    """Installed from a wheel, parents[3] of a module is not the repository: course files are found through
    flashcourse.resources alone."""
    allowed = {
        "resources.py": "decides between the checkout and the wheel's copy",
        "grading/_core.py": "lists its own package's source files (the grader's trust list), present in a wheel too",
    }
    package = ROOT / "src" / "flashcourse"
    counting = {path.relative_to(package).as_posix() for path in package.rglob("*.py")
                if re.search(r"\.parents\[|\.parent\.parent", path.read_text(encoding="utf-8"))}
    assert counting - set(allowed) == set(), (
        f"{sorted(counting - set(allowed))} count parent folders: find course files with flashcourse.resources")


def test_every_source_folder_is_a_package_the_wheel_ships():
    """pyproject.toml finds packages by their __init__.py (``[tool.setuptools.packages.find]``): a folder of
    modules without one (kernels/teaching/, kernels/hopper/ ...) would be left out of the wheel without a word."""
    setuptools = pytest.importorskip("setuptools")
    where = _pyproject()["tool"]["setuptools"]["packages"]["find"]["where"]
    assert where == ["src"]
    found = set(setuptools.find_packages(str(ROOT / "src")))
    folders = {".".join(p.parent.relative_to(ROOT / "src").parts) for p in (ROOT / "src").rglob("*.py")
               if "__pycache__" not in p.parts}
    assert folders - found == set(), f"these folders have modules but no __init__.py: {sorted(folders - found)}"
    assert {"flashcourse.kernels.teaching", "flashcourse.kernels.hopper"} <= found
