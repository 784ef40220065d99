"""MkDocs hook (scripts/build_site.py adds it to the config): a notebook page's headings carry the ids its table
of contents links to.

mkdocs-jupyter builds a notebook's table of contents with Python-Markdown's slugs, and the page's heading ids
with a slugify of its own that drops every letter outside ASCII: a heading in Chinese gets the id "" on the page
and "_1" in the contents, so the contents of the Chinese walkthrough led nowhere. The contents list the headings
of the markdown cells in page order, so here those headings take, in order, the contents' ids.
"""

from __future__ import annotations

import re

# A heading of a markdown cell as mkdocs-jupyter writes it: its id, its text, then its own ¶ link to that id.
CELL_HEADING = re.compile(r'<h([1-6]) id="[^"]*">(.*?)<a class="anchor-link" href="#[^"]*">', re.DOTALL)


def _contents(items, into: list) -> list:
    """(level, id) of every entry of a table of contents, in page order."""
    for item in items:
        into.append((item.level, item.id))
        _contents(item.children, into)
    return into


def on_page_content(html: str, page, **kwargs) -> str:
    if not page.file.src_uri.endswith(".ipynb") or not page.toc:
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
