"""Build the course website into build/site/ with MkDocs and mkdocs-jupyter, from PyPI packages alone.

    python scripts/build_site.py    # what `make book` runs; open build/site/index.html, or serve the folder

Lessons come executed from build/executed/, where tests/test_notebooks.py leaves them. Only a lesson missing
there, or whose cells changed since it was executed, is executed here (and written back there for next time).
Exercises are shown as they are handed out, without outputs. The site needs no network to build or to view:
MathJax is copied from the django-static-mathjax wheel and the theme loads no web fonts.

Stages: build/site-src/ (the pages MkDocs reads) and build/mkdocs.yml (site/mkdocs.yml plus the generated nav).
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import yaml

ROOT = Path(__file__).resolve().parents[1]
LESSONS_DIR = ROOT / "notebooks"
EXERCISES_DIR = ROOT / "exercises"
BENCHMARKS_DIR = ROOT / "benchmarks"
SITE_CONFIG_DIR = ROOT / "site"
BUILD = ROOT / "build"
EXECUTED = BUILD / "executed"
STAGE = BUILD / "site-src"
SITE = BUILD / "site"
EXECUTION_TIMEOUT_S = 900

# The syllabus in parts: lesson numbers from..to (inclusive). A lesson outside every part lands in the last one.
PARTS = [
    ("Foundations, in NumPy on the CPU", 0, 5),
    ("Triton kernels on the GPU", 6, 8),
    ("Beyond FlashAttention-2, and the interview", 9, 10),
]

README = ROOT / "README.md"
# A row of the README's syllabus: | 10 | [lesson](notebooks/...) | ... | [ex12_from_memory](exercises/...), ... |
SYLLABUS_ROW = re.compile(r"^\|\s*(\d+)\s*\|.*\|([^|]*)\|\s*$")
EXERCISE_IN_ROW = re.compile(r"\(exercises/([\w-]+)\.ipynb\)")
# Benchmarks drawn as kernel-speed figures: our kernel (by version, or the default one) beside SDPA's backends.
FIGURE_KINDS = ("attention", "versions")
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
IMAGE_MIME_TYPES = ("image/png", "image/jpeg", "image/gif", "image/svg+xml")
# A relative link to a notebook inside a markdown cell: ](path.ipynb) or ](path.ipynb#anchor).
NOTEBOOK_LINK = re.compile(r"(\]\((?![a-z][a-z0-9+.-]*:)[^)\s]*?)\.ipynb((?:#[^)\s]*)?\))")
# The same in HTML outputs (lesson 10's answers cite lessons): href="path.ipynb" or href="path.ipynb#anchor".
NOTEBOOK_HREF = re.compile(r'(href="(?![a-z][a-z0-9+.-]*:)[^"\s]*?)\.ipynb((?:#[^"\s]*)?")')
HEADING = re.compile(r"^#{1,6} .*$", re.MULTILINE)
INLINE_CODE = re.compile(r"`([^`\n]+)`")


def lesson_number(path: Path) -> int | None:
    """00_memory_hierarchy.ipynb -> 0, ex02_softmax.ipynb -> 2, anything else -> None."""
    match = re.match(r"(?:ex)?(\d+)_", path.name)
    return int(match.group(1)) if match else None


def notebook_title(nb: nbformat.NotebookNode, fallback: str) -> str:
    """The first markdown heading of level 1, without its #, else ``fallback``."""
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            for line in cell.source.splitlines():
                if line.startswith("# "):
                    return line[2:].strip()
    return fallback


def image_output_count(nb: nbformat.NotebookNode) -> int:
    """How many figures a notebook's outputs hold (each output with an image MIME type counts once)."""
    return sum(1 for cell in nb.cells if cell.cell_type == "code" for output in cell.get("outputs", [])
               if any(mime in output.get("data", {}) for mime in IMAGE_MIME_TYPES))


def _cell_sources(nb: nbformat.NotebookNode) -> list[tuple[str, str]]:
    return [(cell.cell_type, cell.source) for cell in nb.cells]


def execute(nb: nbformat.NotebookNode, working_dir: Path) -> None:
    """Run a notebook in place on a fresh python3 kernel, as tests/test_notebooks.py does."""
    from nbclient import NotebookClient

    os.environ["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"
    NotebookClient(nb, timeout=EXECUTION_TIMEOUT_S, kernel_name="python3",
                   resources={"metadata": {"path": str(working_dir)}}).execute()


def executed_lesson(path: Path) -> tuple[nbformat.NotebookNode, bool]:
    """The executed form of a lesson and whether it was reused from build/executed/ (False: executed now)."""
    source = nbformat.read(path, as_version=4)
    cached_path = EXECUTED / path.name
    if cached_path.exists():
        cached = nbformat.read(cached_path, as_version=4)
        if _cell_sources(cached) == _cell_sources(source):
            return cached, True
    print(f"[book] executing {path.name} (not in {EXECUTED.relative_to(ROOT)} or changed since)", flush=True)
    execute(source, path.parent)
    EXECUTED.mkdir(parents=True, exist_ok=True)
    nbformat.write(source, cached_path)
    return source, False


def widget_note(output: nbformat.NotebookNode) -> str:
    """HTML that stands in for an interactive widget on the static site, naming the widget's class."""
    fallback = output.get("data", {}).get("text/plain", "")
    name = re.match(r"\w*", fallback).group(0) or "widget"
    return (f'<div class="fc-widget-note"><b>Interactive: {name}.</b> It needs a running Python kernel, so it '
            "shows nothing on this page. Run this notebook in JupyterLab (<code>make lab</code> in a clone of the "
            "repository) to use it.</div>")


def code_in_headings(markdown: str) -> str:
    """Inline code in headings as HTML: mkdocs-jupyter builds a page's table of contents from its Markdown with
    every `code` span deleted ("Register reallocation ()"), but keeps HTML tags' text."""
    def as_html(heading: re.Match) -> str:
        return INLINE_CODE.sub(lambda code: f"<code>{html.escape(code.group(1))}</code>", heading.group(0))

    return HEADING.sub(as_html, markdown)


def prepare_for_site(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """A copy for the site: links to notebooks (in markdown cells and HTML outputs) point to their pages; widgets
    become a note; inline code in headings survives into the table of contents."""
    nb = nbformat.from_dict(json.loads(json.dumps(nb)))
    nb.metadata.pop("widgets", None)  # rendering saved widget state would load JavaScript from a CDN
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            cell.source = code_in_headings(NOTEBOOK_LINK.sub(r"\1.html\2", cell.source))
        for output in cell.get("outputs", []):
            if WIDGET_VIEW in output.get("data", {}):
                output.data = nbformat.from_dict({"text/html": widget_note(output)})
            elif "text/html" in output.get("data", {}):
                page = output.data["text/html"]
                page = "".join(page) if isinstance(page, list) else page
                output.data["text/html"] = NOTEBOOK_HREF.sub(r"\1.html\2", page)
    return nb


def copy_mathjax(destination: Path) -> None:
    """The parts of MathJax 3 that tex-chtml.js loads, from the django-static-mathjax wheel."""
    import mathjax

    es5 = Path(mathjax.__file__).parent / "static" / "mathjax" / "es5"
    destination.mkdir(parents=True, exist_ok=True)
    shutil.copy2(es5 / "tex-chtml.js", destination / "tex-chtml.js")
    for part in ("input", "output/chtml", "ui", "a11y", "adaptors"):
        shutil.copytree(es5 / part, destination / part)


def results_figures(results: list[Path], destination: Path) -> list[dict]:
    """PNG figures of the kernel speeds by version, for each results file of the attention and versions
    benchmarks, drawn by ``flashcourse.figures_gpu`` as lessons 07 and 08 draw them; beside each PNG, a JSON of
    what it draws (TFLOP/s by shape, then by kernel). Returns, per figure: its path, data path and kernels."""
    from flashcourse import bench, figures_gpu

    figures = []
    for path in results:
        data = json.loads(path.read_text())
        rows, meta = data.get("rows", []), data.get("meta", {})
        if not rows or bench.result_kind({**data, "meta": meta, "path": str(path)}) not in FIGURE_KINDS:
            continue
        for mode, what in (("fwd", "forward"), ("bwd", "backward")):
            rates = figures_gpu.version_rates(rows, mode)
            if rates:
                title = f"{what}, {meta.get('device', '?')}, {meta.get('date', '?')}"
                figure = destination / f"{path.stem}-{mode}.png"
                figures_gpu.version_speeds(rates, title=title).savefig(figure, dpi=100)
                figure.with_suffix(".json").write_text(json.dumps({"source": path.name, "mode": mode,
                                                                   "tflops": rates}, indent=1))
                kernels = list(dict.fromkeys(kernel for by_kernel in rates.values() for kernel in by_kernel))
                figures.append({"path": figure, "data": figure.with_suffix(".json"), "what": what,
                                "kernels": kernels, "shapes": len(rates)})
    return figures


def benchmarks_page(figures: list[Path], drawn: list[dict], results: list[Path]) -> str:
    """Markdown for the GPU benchmark figures (copied ones, then those drawn from results files, each with what it
    shows and its data), then every results file as a table that opens on a click."""
    lines = ["# GPU benchmarks", "",
             "Measured on a GPU with `python -m flashcourse.bench`; each file in `benchmarks/results/` records the "
             "device, the library versions and the date of its run.", ""]
    if not figures and not drawn and not results:
        lines += ["No GPU results are recorded yet.", ""]
    for figure in figures:
        lines += [f"![{figure.stem}](benchmarks/{figure.name})", ""]
    for figure in drawn:
        kernels = ", ".join(figure["kernels"])
        lines += [f"![{figure['what']} TFLOP/s of {kernels}, {figure['shapes']} shapes]"
                  f"(benchmarks/{figure['path'].name})", "",
                  f"*{figure['path'].stem}*: {figure['what']} TFLOP/s of {kernels}; one bar per shape "
                  f"({figure['shapes']}), a causal shape hatched in the colour of its non-causal twin "
                  f"([data](benchmarks/{figure['data'].name})).", ""]
    if results:
        lines += ["## Recorded results", ""]
    for path in results:
        data = json.loads(path.read_text())
        meta, rows = data.get("meta", {}), data.get("rows", [])
        columns = list(dict.fromkeys(key for row in rows for key in row))
        described = ", ".join(f"{key} {value}" for key, value in meta.items() if not isinstance(value, (dict, list)))
        lines += [f"<details><summary><code>{html.escape(path.name)}</code>: {len(rows)} rows; "
                  f"{html.escape(described)}</summary>", "<table>",
                  "<tr>" + "".join(f"<th>{html.escape(column)}</th>" for column in columns) + "</tr>"]
        lines += ["<tr>" + "".join(f"<td>{html.escape(_table_cell(row.get(column, '')))}</td>" for column in columns)
                  + "</tr>" for row in rows]
        lines += ["</table></details>", ""]
    return "\n".join(lines)


def _table_cell(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, dict):
        return " ".join(f"{key}={_table_cell(item)}" for key, item in value.items())
    return str(value)


def syllabus_exercises(readme: Path = README) -> dict[int, list[str]]:
    """Lesson number -> the exercises the README's syllabus gives it (by notebook stem), in its order."""
    exercises: dict[int, list[str]] = {}
    section = readme.read_text().split("\n## Syllabus", 1)[-1].split("\n## ", 1)[0]
    for line in section.splitlines():
        if match := SYLLABUS_ROW.match(line):
            exercises[int(match.group(1))] = EXERCISE_IN_ROW.findall(match.group(2))
    return exercises


def syllabus_table(lessons: list[tuple[Path, str]], exercises: list[tuple[Path, str]],
                   by_lesson: dict[int, list[str]]) -> str:
    """Markdown table: lesson number, lesson page, the exercise pages the README's syllabus gives that lesson."""
    published = {path.stem: path for path, _ in exercises}
    rows = ["| # | Lesson | Exercise |", "|---|---|---|"]
    for path, title in lessons:
        number = lesson_number(path)
        links = [f"[{stem}](exercises/{published[stem].name})" for stem in by_lesson.get(number, [])
                 if stem in published]
        rows.append(f"| {'' if number is None else f'{number:02d}'} | [{title}](notebooks/{path.name}) "
                    f"| {', '.join(links)} |")
    return "\n".join(rows)


def navigation(lessons: list[tuple[Path, str]], exercises: list[tuple[Path, str]]) -> list:
    """MkDocs nav: home, the lessons in their parts, every exercise, the benchmarks."""
    parts = {title: [] for title, _, _ in PARTS}
    for path, title in lessons:
        number = lesson_number(path)
        part = next((name for name, first, last in PARTS if number is not None and first <= number <= last),
                    PARTS[-1][0])
        parts[part].append({title: f"notebooks/{path.name}"})
    nav: list = [{"Home": "index.md"}]
    nav += [{part: pages} for part, pages in parts.items() if pages]
    if exercises:
        nav.append({"Exercises": [{title: f"exercises/{path.name}"} for path, title in exercises]})
    nav.append({"GPU benchmarks": "benchmarks.md"})
    return nav


def stage() -> dict:
    """Write build/site-src/ and build/mkdocs.yml; return counts for the log."""
    shutil.rmtree(STAGE, ignore_errors=True)
    (STAGE / "notebooks").mkdir(parents=True)
    (STAGE / "exercises").mkdir()
    reused = executed_now = 0
    lessons = []
    for path in sorted(LESSONS_DIR.glob("*.ipynb")):
        nb, was_reused = executed_lesson(path)
        reused, executed_now = reused + was_reused, executed_now + (not was_reused)
        nbformat.write(prepare_for_site(nb), STAGE / "notebooks" / path.name)
        lessons.append((path, notebook_title(nb, path.stem)))
    exercises = []
    for path in sorted(EXERCISES_DIR.glob("ex*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        nbformat.write(prepare_for_site(nb), STAGE / "exercises" / path.name)
        exercises.append((path, notebook_title(nb, path.stem)))

    (STAGE / "benchmarks").mkdir()
    figures = [Path(shutil.copy2(figure, STAGE / "benchmarks" / figure.name))
               for figure in sorted(BENCHMARKS_DIR.glob("*.png"))]
    results = sorted((BENCHMARKS_DIR / "results").glob("*.json"))
    drawn = results_figures(results, STAGE / "benchmarks")
    (STAGE / "benchmarks.md").write_text(benchmarks_page(figures, drawn, results))

    index = (SITE_CONFIG_DIR / "index.md").read_text()
    syllabus = syllabus_table(lessons, exercises, syllabus_exercises())
    (STAGE / "index.md").write_text(index.replace("<!-- syllabus -->", syllabus))
    shutil.copytree(SITE_CONFIG_DIR / "javascripts", STAGE / "javascripts")
    shutil.copytree(SITE_CONFIG_DIR / "stylesheets", STAGE / "stylesheets")
    copy_mathjax(STAGE / "javascripts" / "mathjax")

    config = yaml.safe_load((SITE_CONFIG_DIR / "mkdocs.yml").read_text())
    config.update(docs_dir=str(STAGE), site_dir=str(SITE), nav=navigation(lessons, exercises))
    config["theme"]["custom_dir"] = str(SITE_CONFIG_DIR / "overrides")
    config["hooks"] = [str(SITE_CONFIG_DIR / "hooks.py")]  # headings carry the ids the contents link to
    for plugin in config["plugins"]:
        if isinstance(plugin, dict) and "mkdocs-jupyter" in plugin:
            plugin["mkdocs-jupyter"]["cache_dir"] = str(BUILD / "mkdocs-jupyter-cache")
    (BUILD / "mkdocs.yml").write_text(yaml.safe_dump(config, sort_keys=False, allow_unicode=True))
    return {"lessons": len(lessons), "reused": reused, "executed": executed_now, "exercises": len(exercises),
            "benchmark figures": len(figures) + len(drawn), "results files": len(results)}


def main() -> int:
    start = time.perf_counter()
    counts = stage()
    staged = time.perf_counter()
    subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "-f", str(BUILD / "mkdocs.yml")],
                   check=True, cwd=ROOT, env=dict(os.environ, NO_MKDOCS_2_WARNING="1"))
    done = time.perf_counter()
    print(f"[book] {', '.join(f'{value} {key}' for key, value in counts.items())}; staged in "
          f"{staged - start:.1f} s, MkDocs built in {done - staged:.1f} s: {SITE.relative_to(ROOT)}/index.html")
    return 0


if __name__ == "__main__":
    sys.exit(main())
