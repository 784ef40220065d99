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
from typing import NamedTuple

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


class Headline(NamedTuple):
    """One section of the benchmarks page: the newest results file of one benchmark, drawn as figures."""

    heading: str
    path: Path
    figures: list[dict]  # {"file": PNG name, "alt": text, "caption": Markdown}
    intro: str = ""


def _newest(results: list[Path], suffix: str) -> Path | None:
    """The newest results file whose name ends in ``suffix`` (names start with the date: the last in order)."""
    found = [path for path in results if path.name.endswith(suffix)]
    return found[-1] if found else None


def _run_of(meta: dict, path: Path) -> str:
    return (f"{meta.get('device', '?')}, {meta.get('date', '?')} (torch {meta.get('torch', '?')}, Triton "
            f"{meta.get('triton', '?')}; `{path.name}`)")


def _save(figure, destination: Path, name: str, data: dict) -> str:
    """Write the figure as PNG and what it draws as JSON beside it; return the PNG's name."""
    figure.savefig(destination / f"{name}.png", dpi=100)
    (destination / f"{name}.json").write_text(json.dumps(data, indent=1))
    return f"{name}.png"


def attention_headline(results: list[Path], destination: Path) -> Headline | None:
    """Forward and backward against PyTorch: the newest fp16 grid (and the newest bf16 one), ours (the default
    kernels, as a call runs them) beside SDPA's flash and cuDNN backends, TFLOP/s against N."""
    from flashcourse import figures_gpu

    paths = [path for path in (_newest(results, "-attention-fp16.json"), _newest(results, "-attention-bf16.json"))
             if path]
    if not paths:
        return None
    figures = []
    for path in paths:
        data = json.loads(path.read_text())
        rows, meta = data["rows"], data["meta"]
        dtype = "fp16" if path.name.endswith("fp16.json") else "bf16"
        series = figures_gpu.headline_series(rows)
        kernels = sorted({f"{r.get('forward_kernel')} / {r.get('backward_kernel')}" for r in rows
                          if r["provider"] == "flashcourse" and r.get("forward_kernel")})
        batch = sorted({r["batch"] for r in rows})
        name = _save(figures_gpu.speed_panels(series, title=f"Attention, {dtype}, B = {batch[0]}: ours against "
                                                             f"PyTorch's SDPA, {meta.get('device', '?')}"),
                     destination, path.stem, {"source": path.name, "series": series})
        figures.append({"file": name, "alt": f"{dtype} forward and backward TFLOP/s against N: ours, SDPA flash, "
                                             "SDPA cuDNN",
                        "caption": f"{dtype}, B = {batch[0]}, {_run_of(meta, path)}. **ours** (red): the default "
                                   "kernels as a call runs them; the forward / backward kernel each shape ran: "
                                   f"{', '.join(kernels) or 'not recorded'} (v8*: the Hopper kernels in Gluon, "
                                   "chosen by head dim, mask and length; b1: the backward with a separate dQ "
                                   "kernel). **SDPA flash** and **SDPA cuDNN**: PyTorch's "
                                   "`scaled_dot_product_attention` backends, timed in the same run. TFLOP/s = "
                                   "4·B·H·N²·D / time, halved under causal; the backward counts 2.5 times that."})
    return Headline("Forward and backward against PyTorch", paths[0], figures)


def _version_titles() -> dict[str, str]:
    """Each kernel version's name -> its one-line title, from the kernels' own registries."""
    from flashcourse.kernels.backward import BACKWARD_VERSIONS
    from flashcourse.kernels.forward import FORWARD_VERSIONS

    return {name: version.title for name, version in {**FORWARD_VERSIONS, **BACKWARD_VERSIONS}.items()}


def versions_headline(results: list[Path], destination: Path) -> Headline | None:
    """The version ladder: the newest versions run, each version's TFLOP/s per shape, SDPA's at the end."""
    from flashcourse import bench, figures_gpu

    paths = [path for path in results if path.name.endswith("-versions.json")
             and bench.result_kind({**json.loads(path.read_text()), "path": str(path)}) == "versions"]
    if not paths:
        return None
    path = paths[-1]
    data = json.loads(path.read_text())
    titles = _version_titles()
    figures = []
    for mode, what in (("fwd", "forward"), ("bwd", "backward")):
        rates = figures_gpu.version_rates(data["rows"], mode)
        versions = list(dict.fromkeys(k for by in rates.values() for k in by if k not in
                                      figures_gpu.REFERENCES.values()))
        if not versions:
            continue
        name = _save(figures_gpu.version_ladder(rates, versions, title=f"The {what} version by version, "
                                                                        f"{data['meta'].get('device', '?')}"),
                     destination, f"{path.stem}-{mode}", {"source": path.name, "mode": mode, "tflops": rates})
        named = "; ".join(f"**{v}** {titles.get(v, '')}".strip() for v in versions)
        figures.append({"file": name, "alt": f"{what} TFLOP/s of {', '.join(versions)} and SDPA flash, SDPA cuDNN",
                        "caption": f"{what}, {_run_of(data['meta'], path)}. Each line one shape, through our "
                                   f"{what} versions in the order the course builds them: {named}. At the right, "
                                   "in the shape's colour, PyTorch's SDPA flash (square) and cuDNN (triangle) on "
                                   "the same shape. Lesson 07 (forward) and 08 (backward) build each version."})
    intro = ("The Hopper kernels in Gluon (v8, b6) came after this run: the grid above times them as the default "
             "kernels, and docs/KERNELS.md holds their stages.")
    return Headline("The version ladder", path, figures, intro)


def decode_headline(results: list[Path], destination: Path) -> Headline | None:
    """Decoding one token: effective bandwidth by KV length, ours (contiguous and paged) beside SDPA's."""
    from flashcourse import figures_gpu

    path = _newest(results, "-decode.json")
    if path is None:
        return None
    data = json.loads(path.read_text())
    labels = {"flashcourse": "ours", "sdpa_flash": "SDPA flash", "sdpa_cudnn": "SDPA cuDNN"}
    values: dict[str, dict[str, float]] = {}
    for row in data["rows"]:
        if row.get("status") != "ok" or row.get("kv_dtype", "float16") != "float16" or not row.get("kv_len"):
            continue
        label = labels.get(row["provider"])
        if row["provider"] == "flashcourse_paged":
            label = f"ours, paged ({row['page_size']}-token pages)"
        if label:
            values.setdefault(f"KV length {row['kv_len']}", {})[label] = float(row["bandwidth_tbs"])
    read = next((r["bandwidth_tbs"] for r in data["rows"] if r.get("provider") == "read"), None)
    name = _save(figures_gpu.grouped_bars(values, title=f"Decoding one token, {data['meta'].get('device', '?')}",
                                          ylabel="effective bandwidth (TB/s)"),
                 destination, path.stem, {"source": path.name, "bandwidth_tbs": values})
    ceiling = f" A plain read of the same bytes ran at {read:.2f} TB/s: the ceiling." if read else ""
    caption = (f"{_run_of(data['meta'], path)}. fp16 cache, B = 1, 32 query heads sharing 8 KV heads, D = 128; "
               f"effective bandwidth = bytes of K and V / time.{ceiling} Lesson 09 builds the split-KV kernel.")
    return Headline("Decoding", path, [{"file": name, "alt": "decode bandwidth: ours, ours paged, SDPA flash, "
                                                             "SDPA cuDNN", "caption": caption}])


def variants_headline(results: list[Path], destination: Path) -> Headline | None:
    """Attention variants: ours against compiled FlexAttention, bf16, forward and backward."""
    from flashcourse import figures_gpu

    path = _newest(results, "-variants.json")
    if path is None:
        return None
    data = json.loads(path.read_text())
    labels = {"flashcourse": "ours", "flex": "FlexAttention"}
    figures = []
    for mode, what in (("fwd", "forward"), ("bwd", "backward")):
        values: dict[str, dict[str, float]] = {}
        for row in data["rows"]:
            if (row.get("status") == "ok" and row.get("mode") == mode and row.get("dtype") == "bfloat16"
                    and row["provider"] in labels):
                values.setdefault(row["variant"], {})[labels[row["provider"]]] = float(row["tflops"])
        if not values:
            continue
        name = _save(figures_gpu.grouped_bars(values, title=f"Variants, bf16, {what}, "
                                                            f"{data['meta'].get('device', '?')}",
                                              ylabel="TFLOP/s over the visible entries"),
                     destination, f"{path.stem}-{mode}", {"source": path.name, "mode": mode, "tflops": values})
        figures.append({"file": name, "alt": f"variants {what}: ours and FlexAttention",
                        "caption": f"{what}, bf16, {_run_of(data['meta'], path)}. B = 4, H = 16, D = 128, "
                                   "N = 16384 (GQA: 32 query heads on 8 KV heads, N = 8192; head_dim: D = 256, "
                                   "N = 8192). TFLOP/s over the score entries the mask leaves visible. "
                                   "FlexAttention: PyTorch's, compiled, its block mask built outside the timed "
                                   "region. Lesson 11 builds the variants; the README's table has SDPA's numbers "
                                   "where SDPA supports the variant."})
    return Headline("Attention variants", path, figures)


FP8_LABELS = {"v8e_fp8": "v8e FP8 (ours, Gluon)", "v8c_fp8": "v8c FP8 (ours, Gluon)",
              "triton_fp8_keys_adjacent": "Triton FP8, V keys-adjacent (ours)",
              "triton_fp8_as_given": "Triton FP8, V as given (ours)", "sdpa_cudnn_fp16": "SDPA cuDNN (fp16)"}


def fp8_headline(results: list[Path], destination: Path) -> Headline | None:
    """FP8: the newest FP8 forward run, each of our FP8 kernels beside cuDNN in fp16, TFLOP/s against N."""
    from flashcourse import figures_gpu

    path = _newest(results, "-fa3-fp8.json")
    if path is None:
        return None
    data = json.loads(path.read_text())
    series: dict[str, dict[str, list]] = {}
    for row in data["rows"]:
        if row.get("kind") == "time" and row.get("status", "ok") == "ok" and row["provider"] in FP8_LABELS:
            case = f"forward, D{row['head_dim']}{', causal' if row['causal'] else ''}"
            series.setdefault(case, {}).setdefault(FP8_LABELS[row["provider"]], []).append(
                (row["n"], float(row["tflops"])))
    name = _save(figures_gpu.speed_panels(series, title=f"FP8 forward, {data['meta'].get('device', '?')}"),
                 destination, path.stem, {"source": path.name, "series": series})
    caption = (f"{_run_of(data['meta'], path)}. B = 4, H = 16; q, k, v drawn in fp16 and quantised to FP8 (e4m3), "
               "cuDNN on the fp16 inputs. **v8c / v8e**: the FP8 stages of our Hopper forward in Gluon; **Triton "
               "FP8**: our Triton forward on FP8 inputs, V in the layout it was given or copied keys-adjacent "
               "first. docs/KERNELS.md explains the stages and the accuracy.")
    return Headline("FP8", path, [{"file": name, "alt": "FP8 forward TFLOP/s against N: our FP8 kernels and "
                                                        "SDPA cuDNN fp16", "caption": caption}])


HEADLINES = (attention_headline, versions_headline, decode_headline, variants_headline, fp8_headline)


def benchmarks_page(headlines: list[Headline], results: list[Path]) -> str:
    """Markdown: the newest run of each headline benchmark under its own heading, its figures with what they show;
    then every results file, the headline ones included, by date, newest first, each folded into a table."""
    lines = ["# GPU benchmarks", "",
             "Measured on a GPU with `python -m flashcourse.bench`. Each section below shows the newest committed "
             "run of one benchmark; every run, older ones included, is listed by date under "
             "[History of runs](#history-of-runs), each file with its device, library versions and date.", ""]
    if not headlines and not results:
        lines += ["No GPU results are recorded yet.", ""]
    for headline in headlines:
        lines += [f"## {headline.heading}", ""]
        if headline.intro:
            lines += [headline.intro, ""]
        for figure in headline.figures:
            data = figure["file"].removesuffix(".png") + ".json"
            lines += [f"![{figure['alt']}](benchmarks/{figure['file']})", "",
                      f"{figure['caption']} ([data](benchmarks/{data}))", ""]
    if results:
        lines += ["## History of runs", "",
                  "Every committed results file, newest date first. A name with a suffix (a commit, `run1`) is a "
                  "rerun or an experiment kept for the record; docs/KERNELS.md says what each one decided.", ""]
    by_date: dict[str, list[Path]] = {}
    for path in results:
        by_date.setdefault(path.name[:10], []).append(path)
    for date in sorted(by_date, reverse=True):
        lines += [f"<details><summary><b>{html.escape(date)}</b>: {len(by_date[date])} files</summary>", ""]
        for path in by_date[date]:
            lines += _results_table(path)
        lines += ["</details>", ""]
    return "\n".join(lines)


def _results_table(path: Path) -> list[str]:
    """One results file as a table that opens on a click."""
    data = json.loads(path.read_text())
    meta, rows = data.get("meta", {}), data.get("rows", [])
    columns = list(dict.fromkeys(key for row in rows for key in row))
    described = ", ".join(f"{key} {value}" for key, value in meta.items() if not isinstance(value, (dict, list)))
    return [f"<details><summary><code>{html.escape(path.name)}</code>: {len(rows)} rows; "
            f"{html.escape(described)}</summary>", "<table>",
            "<tr>" + "".join(f"<th>{html.escape(column)}</th>" for column in columns) + "</tr>",
            *("<tr>" + "".join(f"<td>{html.escape(_table_cell(row.get(column, '')))}</td>" for column in columns)
              + "</tr>" for row in rows),
            "</table></details>", ""]


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


def companions(lessons: list[tuple[Path, str]], exercises: list[tuple[Path, str]],
               by_lesson: dict[int, list[str]]) -> dict[str, list[list[str]]]:
    """Each notebook page's companions, as site/hooks.py links them: a lesson's exercises (the README's syllabus)
    and an exercise's lesson(s); page source path -> [title, notebook path] pairs."""
    lesson_of = {lesson_number(path): (path, title) for path, title in lessons}
    exercise_titles = {path.stem: (path, title) for path, title in exercises}
    links: dict[str, list[list[str]]] = {}
    for number, stems in sorted(by_lesson.items()):
        if number not in lesson_of:
            continue
        lesson_path, lesson_title = lesson_of[number]
        for stem in stems:
            if stem in exercise_titles:
                path, title = exercise_titles[stem]
                links.setdefault(f"notebooks/{lesson_path.name}", []).append([title, f"exercises/{path.name}"])
                links.setdefault(f"exercises/{path.name}", []).append([lesson_title, f"notebooks/{lesson_path.name}"])
    return links


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
    results = sorted((BENCHMARKS_DIR / "results").glob("*.json"))
    headlines = [headline for make in HEADLINES if (headline := make(results, STAGE / "benchmarks"))]
    (STAGE / "benchmarks.md").write_text(benchmarks_page(headlines, results))

    index = (SITE_CONFIG_DIR / "index.md").read_text()
    syllabus = syllabus_table(lessons, exercises, syllabus_exercises())
    (STAGE / "index.md").write_text(index.replace("<!-- syllabus -->", syllabus))
    shutil.copytree(SITE_CONFIG_DIR / "javascripts", STAGE / "javascripts")
    shutil.copytree(SITE_CONFIG_DIR / "stylesheets", STAGE / "stylesheets")
    copy_mathjax(STAGE / "javascripts" / "mathjax")

    config = yaml.safe_load((SITE_CONFIG_DIR / "mkdocs.yml").read_text())
    config.update(docs_dir=str(STAGE), site_dir=str(SITE), nav=navigation(lessons, exercises))
    config.setdefault("extra", {})["companions"] = companions(lessons, exercises, syllabus_exercises())
    # the line of links above each notebook page, and headings that carry the ids the contents link to
    config["hooks"] = [str(SITE_CONFIG_DIR / "hooks.py")]
    for plugin in config["plugins"]:
        if isinstance(plugin, dict) and "mkdocs-jupyter" in plugin:
            plugin["mkdocs-jupyter"]["cache_dir"] = str(BUILD / "mkdocs-jupyter-cache")
    (BUILD / "mkdocs.yml").write_text(yaml.safe_dump(config, sort_keys=False, allow_unicode=True))
    return {"lessons": len(lessons), "reused": reused, "executed": executed_now, "exercises": len(exercises),
            "benchmark figures": sum(len(h.figures) for h in headlines), "results files": len(results)}


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
