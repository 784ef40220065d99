"""The course website (`make book`): every lesson has a page with all its figures, no traceback, working links.

Builds the site once per test session with scripts/build_site.py, which reuses the lessons that
tests/test_notebooks.py executed into build/executed/ (run this file after that one, not beside it under
xdist, or the build executes the missing lessons itself).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
LESSONS = sorted((ROOT / "notebooks").glob("*.ipynb"))
EXERCISES = sorted((ROOT / "exercises").glob("ex*.ipynb"))
TRACEBACK = "Traceback (most recent call last)"


def _load_builder():
    spec = importlib.util.spec_from_file_location("build_site", ROOT / "scripts" / "build_site.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


build_site = _load_builder()


class PageParser(HTMLParser):
    """Collects what the checks need from one page: figures in outputs, links, scripts, text."""

    def __init__(self):
        super().__init__()
        self.figures = 0  # image outputs of notebook cells
        self.links: list[str] = []  # every href and src
        self.table_links: list[str] = []  # the hrefs inside tables (the syllabus)
        self._table_depth = 0
        self.external_assets: list[str] = []  # scripts and stylesheets that would be fetched from the network
        self.nav_titles: list[str] = []
        self.nav_links: list[tuple[str, str]] = []  # (href, text) of every navigation link, the page's contents too
        self.ids: set[str] = set()
        self.images: list[tuple[str, str]] = []  # (src, alt)
        self.text_parts: list[str] = []
        self._in_nav_link = False
        self._nav_text: list[str] = []
        self._nav_href = ""

    def handle_starttag(self, tag, attrs):
        attributes = dict(attrs)
        classes = (attributes.get("class") or "").split()
        if {"jp-RenderedImage", "jp-RenderedSVG"} & set(classes) and "jp-OutputArea-output" in classes:
            self.figures += 1
        for name in ("href", "src"):
            if attributes.get(name):
                self.links.append(attributes[name])
        self._table_depth += tag == "table"
        if tag == "a" and self._table_depth and attributes.get("href"):
            self.table_links.append(attributes["href"])
        is_asset = tag == "script" or (tag == "link" and attributes.get("rel") == "stylesheet")
        target = attributes.get("src") or attributes.get("href") or ""
        if is_asset and urlsplit(target).netloc:  # http://host/..., https://host/... or //host/...
            self.external_assets.append(target)
        if attributes.get("id"):
            self.ids.add(attributes["id"])
        if tag == "img":
            self.images.append((attributes.get("src") or "", attributes.get("alt") or ""))
        if tag == "a":
            self._in_nav_link = "md-nav__link" in classes
            self._nav_text, self._nav_href = [], attributes.get("href") or ""

    def handle_endtag(self, tag):
        self._table_depth -= tag == "table"
        if tag == "a":
            if self._in_nav_link and "".join(self._nav_text).strip():
                self.nav_links.append((self._nav_href, " ".join("".join(self._nav_text).split())))
            self._in_nav_link = False

    def handle_data(self, data):
        self.text_parts.append(data)
        if self._in_nav_link:
            self._nav_text.append(data)
            if data.strip():
                self.nav_titles.append(data.strip())

    @property
    def text(self) -> str:
        return "".join(self.text_parts)


def parse(page: Path) -> PageParser:
    parser = PageParser()
    parser.feed(page.read_text(encoding="utf-8"))
    return parser


@pytest.fixture(scope="session")
def site() -> Path:
    """The built site folder (build/site/), built once for the session; under ``make test``, which builds it just
    before and sets FLASHCOURSE_SITE_BUILT=1, that build, so that its two workers read one site and none rebuilds
    it under the other."""
    if os.environ.get("FLASHCOURSE_SITE_BUILT") != "1":
        assert build_site.main() == 0
    return build_site.SITE


def lesson_page(site: Path, lesson: Path) -> Path:
    page = site / "notebooks" / f"{lesson.stem}.html"
    assert page.exists(), f"lesson {lesson.name} has no page {page.relative_to(ROOT)}"
    return page


def test_there_are_lessons_to_publish():
    assert LESSONS, "notebooks/ holds no lesson: the site would be empty"


@pytest.mark.parametrize("lesson", LESSONS, ids=lambda p: p.stem)
def test_lesson_page_has_every_figure_and_no_traceback(site, lesson):
    executed = nbformat.read(build_site.EXECUTED / lesson.name, as_version=4)
    page = parse(lesson_page(site, lesson))
    expected = build_site.image_output_count(executed)
    assert page.figures == expected, (
        f"{lesson.name}: its executed notebook has {expected} figures but its page shows {page.figures}")
    assert TRACEBACK not in page.text, (
        f"{lesson.name}: its page shows a traceback: {page.text[page.text.index(TRACEBACK) - 300:][:1200]}")
    title = build_site.notebook_title(executed, lesson.stem)
    assert title in page.nav_titles, f"{lesson.name}: '{title}' is missing from the navigation {page.nav_titles}"


@pytest.mark.parametrize("exercise", EXERCISES, ids=lambda p: p.stem)
def test_exercise_has_a_page(site, exercise):
    assert (site / "exercises" / f"{exercise.stem}.html").exists(), f"{exercise.name} has no page"


def test_home_page_lists_the_syllabus_in_order(site):
    home = parse(site / "index.html")
    linked = [link for link in home.table_links if link.startswith("notebooks/")]
    expected = [f"notebooks/{lesson.stem}.html" for lesson in LESSONS]
    assert linked == expected, (
        f"the syllabus on the home page links {linked}, expected every lesson in order: {expected}")


def test_interview_walkthrough_in_both_languages(site):
    walkthroughs = sorted((ROOT / "notebooks").glob("10_*.ipynb"))
    if not walkthroughs:
        pytest.skip("lesson 10 (the interview walkthrough) does not exist yet")
    assert len(walkthroughs) >= 2, f"the walkthrough should exist in English and Chinese, found {walkthroughs}"
    texts = {path.name: parse(lesson_page(site, path)).text for path in walkthroughs}
    chinese = [name for name, text in texts.items() if re.search(r"[\u4e00-\u9fff]{20}", text)]
    english = [name for name in texts if name not in chinese]
    assert chinese and english, f"expected one page in Chinese and one in English: Chinese {chinese}, all {list(texts)}"


def test_benchmark_figures_are_published(site):
    page = parse(site / "benchmarks.html")
    for figure in sorted((ROOT / "benchmarks").glob("*.png")):
        assert f"benchmarks/{figure.name}" in page.links, f"{figure.name} is missing from the benchmarks page"
        assert (site / "benchmarks" / figure.name).exists()


def test_links_resolve_and_nothing_loads_from_the_network(site):
    broken, external = [], []
    for page_path in sorted(site.rglob("*.html")):
        if page_path.name == "404.html":  # MkDocs writes it with absolute links for a server's root
            continue
        page = parse(page_path)
        external += [f"{page_path.relative_to(site)}: {asset}" for asset in page.external_assets]
        for link in page.links:
            parts = urlsplit(link)
            if parts.scheme or parts.netloc or not parts.path:  # external, or an anchor on the same page
                continue
            if not (page_path.parent / unquote(parts.path)).resolve().exists():
                broken.append(f"{page_path.relative_to(site)} -> {link}")
    assert not broken, "links to files that the site lacks:\n" + "\n".join(broken)
    assert not external, "scripts or stylesheets fetched from the network (the site must work offline):\n" + \
        "\n".join(external)


def test_the_syllabus_is_read_from_the_readme():
    by_lesson = build_site.syllabus_exercises()
    assert by_lesson[10] == ["ex12_from_memory", "ex14_interview_code", "ex15_handwritten_kernels", "ex17_cuda_kernels"]
    assert by_lesson[11] == ["ex10_mask_rules"]
    assert set(by_lesson) == {build_site.lesson_number(lesson) for lesson in LESSONS}


def test_inline_code_in_headings_becomes_html():
    markdown = "## 7. Register reallocation (`setmaxnreg`)\nBody `x` stays.\n### `a<b`"
    assert build_site.code_in_headings(markdown) == (
        "## 7. Register reallocation (<code>setmaxnreg</code>)\nBody `x` stays.\n### <code>a&lt;b</code>")


def test_every_exercise_is_in_the_navigation_and_the_readmes_in_the_syllabus(site):
    home = parse(site / "index.html")
    for exercise in EXERCISES:
        title = build_site.notebook_title(nbformat.read(exercise, as_version=4), exercise.stem)
        assert title in home.nav_titles, f"{exercise.name} ('{title}') is missing from the navigation"
    linked = {link for link in home.table_links if link.startswith("exercises/")}
    expected = {f"exercises/{stem}.html" for stems in build_site.syllabus_exercises().values() for stem in stems}
    assert linked == expected, f"the syllabus links {sorted(linked)}, the README's gives {sorted(expected)}"


@pytest.mark.parametrize("lesson", LESSONS, ids=lambda p: p.stem)
def test_the_table_of_contents_keeps_inline_code_and_leads_to_its_headings(site, lesson):
    page = parse(lesson_page(site, lesson))
    contents = [(href, text) for href, text in page.nav_links if href.startswith("#")]
    headings = [line.lstrip("#").strip() for cell in nbformat.read(lesson, as_version=4).cells
                if cell.cell_type == "markdown" for line in cell.source.splitlines()
                if re.match(r"##? ", line) and "`" in line]
    for heading in headings:
        shown = " ".join(heading.replace("`", "").split())
        assert any(text == shown for _, text in contents), (
            f"{lesson.name}: the heading '{heading}' is not in the table of contents as '{shown}': "
            f"{[text for _, text in contents]}")
    missing = [href for href, _ in contents if unquote(href[1:]) not in page.ids]
    assert not missing, f"{lesson.name}: table-of-contents links to no heading: {missing}"


def test_no_page_promises_links_it_does_not_have(site):
    for page_path in sorted(site.rglob("*.html")):
        page = parse(page_path)
        for service, address in (("Binder", "mybinder.org"), ("Colab", "colab.research.google.com")):
            if service in page.text:
                assert any(address in link for link in page.links), (
                    f"{page_path.relative_to(site)} mentions {service} but has no link to it")


HEADLINE_HEADINGS = ["Forward and backward against PyTorch", "The version ladder", "Decoding", "Attention variants",
                     "FP8", "History of runs"]
# The benchmark each headline figure must come from: the newest results file whose name ends so.
HEADLINE_SOURCES = {"Forward and backward against PyTorch": ("-attention-fp16.json", "-attention-bf16.json"),
                    "The version ladder": ("-versions.json",), "Decoding": ("-decode.json",),
                    "Attention variants": ("-variants.json",), "FP8": ("-fa3-fp8.json",)}


def _sections(page_html: str) -> list[tuple[str, list[str]]]:
    """(h2 heading, the image sources under it) in page order."""
    sections = []
    for piece in re.split(r"(?=<h2 )", page_html)[1:]:
        inner = re.match(r"<h2[^>]*>(.*?)</h2>", piece, re.DOTALL).group(1)
        heading = re.sub(r"<[^>]+>|¶|&para;", "", inner).strip()  # the text, without its permalink
        sections.append((heading, re.findall(r'<img [^>]*src="([^"]+)"', piece)))
    return sections


def test_the_benchmarks_page_opens_on_the_newest_headline_results_under_headings(site):
    results = sorted((ROOT / "benchmarks" / "results").glob("*.json"))
    sections = _sections((site / "benchmarks.html").read_text(encoding="utf-8"))
    assert [heading for heading, _ in sections] == HEADLINE_HEADINGS, [heading for heading, _ in sections]
    for heading, images in sections[:-1]:
        assert images, f"the section '{heading}' shows no figure"
        newest = {[path for path in results if path.name.endswith(suffix)][-1].name
                  for suffix in HEADLINE_SOURCES[heading]}
        drawn = {json.loads((site / image.removesuffix(".png")).with_suffix(".json").read_text())["source"]
                 for image in images}
        assert drawn == newest, f"'{heading}' draws {sorted(drawn)}, not the newest run {sorted(newest)}"
    assert not sections[-1][1], "the history holds tables only: the figures are the newest runs'"
    newest_grid = [path for path in results if path.name.endswith("-attention-fp16.json")][-1]
    assert sections[0][1][0] == f"benchmarks/{newest_grid.stem}.png", "the page does not open on the newest grid"


def test_every_headline_figure_draws_our_kernel(site):
    """Each figure of the benchmarks page shows our kernel beside the references of the same run."""
    page = parse(site / "benchmarks.html")
    data_links = [link for link in page.links if link.startswith("benchmarks/") and link.endswith(".json")]
    assert len(data_links) >= 5, f"the benchmarks page links {data_links}"
    for link in data_links:
        figure = json.loads((site / link).read_text())
        assert (ROOT / "benchmarks" / "results" / figure["source"]).exists(), f"{link}: no source {figure['source']}"
        drawn = figure.get("series") or figure.get("tflops") or figure.get("bandwidth_tbs")
        for case, by_label in drawn.items():
            ours = [label for label in by_label if "ours" in label or re.fullmatch(r"[vb]\d+", label)]
            assert ours, f"{link}: {case} shows only {list(by_label)}, not our kernel"
        assert (site / link.removesuffix(".json")).with_suffix(".png").exists(), f"{link}: no figure beside it"


def test_notebook_pages_link_their_download_and_their_lesson_or_exercise(site):
    lesson = parse(site / "notebooks" / "03_flash_forward_numpy.html")
    assert "03_flash_forward_numpy.ipynb" in lesson.links and "../exercises/ex03_tiled_forward.html" in lesson.links
    exercise = parse(site / "exercises" / "ex03_tiled_forward.html")
    assert "ex03_tiled_forward.ipynb" in exercise.links
    assert "../notebooks/03_flash_forward_numpy.html" in exercise.links
    assert (site / "exercises" / "ex03_tiled_forward.ipynb").exists()
    repo_url = build_site.yaml.safe_load((ROOT / "site" / "mkdocs.yml").read_text()).get("repo_url")
    if not repo_url:  # no address: no Binder or Colab link at all
        assert not any("mybinder.org" in link or "colab.research" in link for link in lesson.links)


def _hooks():
    spec = importlib.util.spec_from_file_location("site_hooks", ROOT / "site" / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_binder_and_colab_links_come_from_the_repository_address_or_not_at_all():
    hooks = _hooks()
    assert hooks.launch_links("", "main", "notebooks/02_softmax.ipynb") == ""
    assert hooks.launch_links("https://gitlab.com/acme/flashcourse", "main", "notebooks/02_softmax.ipynb") == ""
    links = hooks.launch_links("https://github.com/acme/flashcourse", "main", "notebooks/02_softmax.ipynb")
    assert "https://mybinder.org/v2/gh/acme/flashcourse/main?urlpath=lab/tree/notebooks/02_softmax.ipynb" in links
    assert "https://colab.research.google.com/github/acme/flashcourse/blob/main/notebooks/02_softmax.ipynb" in links
    assert "%pip install &quot;flashcourse[course] @ git+https://github.com/acme/flashcourse&quot;" in links
    assert "<" + "owner>" not in links and "OWNER" not in links


def test_make_book_reports_its_time_under_its_own_name():
    recipe = (ROOT / "Makefile").read_text().split("\nbook:", 1)[1].split("\n\n", 1)[0]
    assert "[make book]" in recipe and "call timed" not in recipe, (
        "`make book` must say its time as its own, not as a stage of `make test`")


def test_no_page_shows_a_temporary_path(site):
    """A warning shown the default way names the cell's temporary file (/tmp/ipykernel_123/456.py:4); the
    interpreter notice is one plain line instead, and no other output should show such a path either."""
    for page_path in sorted(site.rglob("*.html")):
        text = parse(page_path).text
        found = re.search(r"\S*ipykernel_\d+\S*", text)
        assert not found, f"{page_path.relative_to(site)} shows a temporary path: {found.group(0)}"
