"""Plain-text stand-ins for the few pieces of rich that the terminal drill uses, so that ``flashcourse quiz`` runs
without rich (it is only in the ``interview`` extra): the same names and calls, no colours, no boxes.

:mod:`.terminal` imports these when rich is missing or ``FLASHCOURSE_PLAIN=1`` is set (a screen reader, a log).
Only what the drill calls is here: ``Text`` (a string that ignores styles), ``Panel`` (a titled block),
``Table`` (columns padded to their widest cell), ``Console`` (print, input, width), ``cell_len``, ``escape``.
"""

from __future__ import annotations

import shutil
import sys
import unicodedata


def cell_len(text: str) -> int:
    """Terminal cells the text takes: two for a wide (Chinese) character, none for a combining mark."""
    cells = 0
    for char in text:
        if unicodedata.combining(char):
            continue
        cells += 2 if unicodedata.east_asian_width(char) in "WF" else 1
    return cells


def escape(text: str) -> str:
    """rich escapes its markup; plain text has none."""
    return text


class Text:
    """A string with rich's Text interface where the drill uses it; styles are accepted and dropped."""

    def __init__(self, text: str = "", style: str | None = None):
        self.plain = text

    def __str__(self) -> str:
        return self.plain

    def __len__(self) -> int:
        return len(self.plain)

    def __getitem__(self, key) -> Text:
        return Text(self.plain[key])

    def __add__(self, other) -> Text:
        return Text(self.plain + str(other))

    def append(self, text, style: str | None = None) -> Text:
        self.plain += str(text)
        return self

    def append_text(self, text: Text) -> Text:
        return self.append(text)

    def split(self, separator: str = "\n", *, allow_blank: bool = False) -> list[Text]:
        parts = self.plain.split(separator)
        return [Text(p) for p in parts if allow_blank or p]

    def divide(self, offsets) -> list[Text]:
        bounds = [0, *offsets, len(self.plain)]
        return [Text(self.plain[a:b]) for a, b in zip(bounds, bounds[1:], strict=False)]

    def rstrip(self) -> None:
        self.plain = self.plain.rstrip()

    def join(self, lines) -> Text:
        return Text(self.plain.join(str(line) for line in lines))


class Panel:
    """A block of text under its title: "── title ─────" then the body."""

    def __init__(self, body, title: str = "", title_align: str = "left", border_style: str | None = None):
        self.body, self.title = body, title

    def render(self, width: int) -> str:
        head = f"── {self.title} " if self.title else ""
        return head + "─" * max(width - cell_len(head), 4) + "\n" + str(self.body) + "\n"


class Table:
    """Rows of cells in columns as wide as their widest cell, under a title and a header row."""

    def __init__(self, title: str | None = None):
        self.title, self.columns, self.rows = title, [], []

    def add_column(self, name: str) -> None:
        self.columns.append(name)

    def add_row(self, *cells: str) -> None:
        self.rows.append([str(c) for c in cells])

    def render(self, width: int) -> str:
        widths = [max(cell_len(row[i]) for row in [self.columns, *self.rows]) for i in range(len(self.columns))]

        def line(cells: list[str]) -> str:
            return " | ".join(c + " " * (w - cell_len(c)) for c, w in zip(cells, widths, strict=True)).rstrip()

        lines = [self.title] if self.title else []
        lines += [line(self.columns), "-+-".join("-" * w for w in widths)]
        lines += [line(row) for row in self.rows]
        return "\n".join(lines)


class Console:
    """Prints text, panels and tables to standard output (or ``file``); reads a line with ``input``."""

    def __init__(self, *, file=None, width: int | None = None, **_ignored):
        self.file, self._width = file, width

    @property
    def width(self) -> int:
        return self._width or shutil.get_terminal_size((80, 24)).columns

    def print(self, *objects, end: str = "\n", **_ignored) -> None:
        out = self.file or sys.stdout
        parts = [o.render(self.width) if isinstance(o, (Panel, Table)) else str(o) for o in objects]
        out.write(" ".join(parts) + end)
        out.flush()

    def input(self, prompt: str = "") -> str:
        self.print(prompt, end="")
        return input()
