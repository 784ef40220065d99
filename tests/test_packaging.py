"""The conda environments and pyproject.toml name the same packages with the same constraints, both ways."""

from __future__ import annotations

import re
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
    project = _pyproject()["project"]
    reqs = {str(Requirement(r)) for r in project["dependencies"]}
    reqs.add(str(Requirement(f"python{project['requires-python']}")))
    return reqs


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


def test_triton_is_linux_only_and_version_is_consistent():
    import flashcourse

    deps = [Requirement(r) for r in _pyproject()["project"]["dependencies"]]
    triton = next(r for r in deps if r.name == "triton")
    assert triton.marker is not None and triton.marker.evaluate({"sys_platform": "darwin"}) is False
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
                if re.search(r"parents\[|\.parent\.parent", path.read_text(encoding="utf-8"))}
    assert counting - set(allowed) == set(), (
        f"{sorted(counting - set(allowed))} count parent folders: find course files with flashcourse.resources")
