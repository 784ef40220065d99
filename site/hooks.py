"""MkDocs hook (scripts/build_site.py adds it to the config): every notebook page opens with a line of links (its
.ipynb to download, the lesson's exercises or the exercise's lesson, and Binder and Colab when the repository's
address is known), and a notebook page's headings carry the ids its table of contents links to.

The repository's address has one home, ``repo_url`` in site/mkdocs.yml: unset, no Binder or Colab link is shown
anywhere (never a template with a placeholder); set to a GitHub address, every notebook page gets both, and Colab's
with the first cell to run there, which installs the course from that repository.

Headings:

mkdocs-jupyter builds a notebook's table of contents with Python-Markdown's slugs, and the page's heading ids
with a slugify of its own that drops every letter outside ASCII: a heading in Chinese gets the id "" on the page
and "_1" in the contents, so the contents of the Chinese walkthrough led nowhere. The contents list the headings
of the markdown cells in page order, so here those headings take, in order, the contents' ids.
"""

from __future__ import annotations

import html as html_text
import posixpath
import re

# A heading of a markdown cell as mkdocs-jupyter writes it: its id, its text, then its own ¶ link to that id.
CELL_HEADING = re.compile(r'<h([1-6]) id="[^"]*">(.*?)<a class="anchor-link" href="#[^"]*">', re.DOTALL)


def _contents(items, into: list) -> list:
    """(level, id) of every entry of a table of contents, in page order."""
    for item in items:
        into.append((item.level, item.id))
        _contents(item.children, into)
    return into


GITHUB = re.compile(r"^https://github\.com/([\w.-]+/[\w.-]+?)(?:\.git)?/?$")


def colab_install(repo_url: str) -> str:
    """The first cell to run in Colab: the course and its notebook extras, from the repository."""
    return f'%pip install "flashcourse[course] @ git+{repo_url.rstrip("/")}"'


def launch_links(repo_url: str, branch: str, source: str) -> str:
    """HTML links that open the notebook ``source`` (its path in the repository) on Binder and in Colab, with the
    cell Colab needs first; "" unless ``repo_url`` is a GitHub repository's address."""
    match = GITHUB.match(repo_url or "")
    if not match:
        return ""
    repository = match.group(1)
    binder = f"https://mybinder.org/v2/gh/{repository}/{branch}?urlpath=lab/tree/{source}"
    colab = f"https://colab.research.google.com/github/{repository}/blob/{branch}/{source}"
    return (f'<a class="fc-badge" href="{binder}">Open on Binder</a> '
            f'<a class="fc-badge" href="{colab}">Open in Colab</a> '
            f"(in Colab, run <code>{html_text.escape(colab_install(repo_url))}</code> first)")


def page_links(source: str, companions: list, repo_url: str, branch: str) -> str:
    """The line of links above a notebook page: download, its companions (lesson or exercises), launchers.

    ``source``: the page's notebook, ``notebooks/02_softmax.ipynb``; ``companions``: [title, notebook path] pairs.
    """
    here = posixpath.dirname(source)
    name = posixpath.basename(source)
    links = [f'<a href="{name}" download>Download {name}</a>']
    for title, target in companions:
        href = posixpath.relpath(target, here).removesuffix(".ipynb") + ".html"
        kind = "Exercise" if target.startswith("exercises/") else "Lesson"
        links.append(f'{kind}: <a href="{href}">{html_text.escape(title)}</a>')
    launch = launch_links(repo_url, branch, source)
    return '<p class="fc-launch">' + " · ".join(links + ([launch] if launch else [])) + "</p>"


def on_page_content(html: str, page, config=None, **kwargs) -> str:
    if not page.file.src_uri.endswith(".ipynb"):
        return html
    if config is not None:
        extra = config.get("extra") or {}
        header = page_links(page.file.src_uri, (extra.get("companions") or {}).get(page.file.src_uri, []),
                            config.get("repo_url") or "", extra.get("binder_branch") or "main")
        html = header + html
    if not page.toc:
        return html
    contents = _contents(page.toc, [])
    deepest = max(level for level, _ in contents)
    headings = [match for match in CELL_HEADING.finditer(html) if int(match.group(1)) <= deepest]
    if [int(match.group(1)) for match in headings] != [level for level, _ in contents]:
        return html  # not the same headings: leave the page as it is (tests/test_site.py reports dead links)
    pieces, start = [], 0
    for match, (level, anchor) in zip(headings, contents, strict=True):
        pieces += [html[start:match.start()],
                   f'<h{level} id="{anchor}">{match.group(2)}<a class="anchor-link" href="#{anchor}">']
        start = match.end()
    return "".join(pieces) + html[start:]
