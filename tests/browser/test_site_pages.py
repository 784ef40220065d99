"""The website as a reader sees it: every page of build/site/ opened from disk in headless Chromium.

Checks that the math is typeset (MathJax ships with the site), that the figures load, that the page asks
nothing from the network and logs no JavaScript error; saves a screenshot of the top of every page and of the
whole home page and lesson 02 to build/screenshots/site-*.png. Builds the site first if build/site/ is missing.
"""

from __future__ import annotations

import importlib.util
import re

import pytest

from .conftest import ROOT, SCREENSHOTS

pytestmark = pytest.mark.browser

MATHJAX_TIMEOUT_MS = 20_000
RAW_TEX = re.compile(r"\$\$|\\(?:frac|sum|max|exp|mathrm|text|ell|cdot|le|ge|times)\b")
FULL_PAGE_SHOTS = ("index.html", "notebooks/02_softmax.html")


def _site_pages() -> list[str]:
    """The pages to open, relative to build/site/: home, lessons, exercises, benchmarks."""
    names = ["index.html", "benchmarks.html"]
    names += [f"notebooks/{path.stem}.html" for path in sorted((ROOT / "notebooks").glob("*.ipynb"))]
    names += [f"exercises/{path.stem}.html" for path in sorted((ROOT / "exercises").glob("ex*.ipynb"))]
    return names


@pytest.fixture(scope="module")
def site_dir():
    site = ROOT / "build" / "site"
    if not (site / "index.html").exists():
        spec = importlib.util.spec_from_file_location("build_site", ROOT / "scripts" / "build_site.py")
        builder = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(builder)
        builder.main()
    return site


@pytest.mark.parametrize("name", _site_pages())
def test_page_renders_offline(page, site_dir, name):
    path = site_dir / name
    assert path.exists(), f"the site has no page {name}"
    network = []
    page.on("request", lambda request: request.url.startswith(("http:", "https:")) and network.append(request.url))
    failed = []
    page.on("requestfailed", lambda request: failed.append(request.url))
    page.goto(path.as_uri())
    page.wait_for_load_state("load")

    if "mathjax-setup.js" in path.read_text(encoding="utf-8"):
        page.wait_for_function("() => window.MathJax?.startup?.promise", timeout=MATHJAX_TIMEOUT_MS)
        page.evaluate("() => MathJax.startup.promise")
        prose = "\n".join(page.locator(".jp-MarkdownCell").all_inner_texts())
        raw_tex = RAW_TEX.findall(prose)
        assert not raw_tex, f"{name}: formulas left as raw TeX (MathJax did not typeset them): {raw_tex[:5]}"
    broken_images = page.evaluate(
        "() => [...document.images].filter(img => !img.complete || img.naturalWidth === 0).map(img => img.alt)")
    assert not broken_images, f"{name}: images that did not load: {broken_images}"
    assert not network, f"{name}: asked the network for {network}"
    assert not failed, f"{name}: requests that failed: {failed}"
    assert not page.console_errors, f"{name}: JavaScript errors: {page.console_errors}"

    shot = SCREENSHOTS / f"site-{name.replace('/', '-').removesuffix('.html')}.png"
    page.screenshot(path=str(shot), full_page=name in FULL_PAGE_SHOTS)


# No page links an exercise with code as the text any more (tests/test_lesson_links.py), so the check writes such a
# link into a Markdown cell of exercise 12's page, as its link to the drill once was.
CODE_LINK_JS = """() => {
    const paragraph = document.querySelector('.jp-MarkdownCell .jp-RenderedHTMLCommon p');
    const link = paragraph.appendChild(document.createElement('a'));
    link.href = 'ex12_from_memory_no_hints.html';
    const code = link.appendChild(document.createElement('code'));
    code.textContent = 'ex12_from_memory_no_hints.ipynb';
    return {link: getComputedStyle(link).color, text: getComputedStyle(code).color,
            line: getComputedStyle(code).textDecorationLine};
}"""


def test_exercise_links_written_as_code_look_like_links(page, site_dir):
    """A link whose text is code (`ex12_from_memory_no_hints.ipynb`) takes the link colour and is underlined, so
    it does not read as code."""
    page.goto((site_dir / "exercises" / "ex12_from_memory.html").as_uri())
    page.wait_for_load_state("load")
    link = page.evaluate(CODE_LINK_JS)
    assert link["text"] == link["link"] and "underline" in link["line"], (
        f"code in a link: its text is {link['text']} ({link['line']}), the link colour is {link['link']}")
