"""The interview question bank: load it, validate it, render it to Markdown.

The bank is data (``questions.yaml``, shipped in this package). Each entry has an ``id``, a ``section``, and
these text fields, every one a mapping ``{en: ..., zh: ...}``: ``question``, ``short`` (the 30-second answer),
``long``; plus ``points`` (the 3 to 5 points a good answer makes, each ``{en: ..., zh: ...}``: shown after the
candidate answers and ticked for the score), ``follow_ups`` (each a ``question`` and an ``answer``),
``wrong_answers`` (each a ``claim`` and its ``correction``) and ``evidence`` (see
:mod:`flashcourse.interview.evidence`). An entry may carry ``tags``, a
list from the fixed vocabulary :data:`TAGS`: how often interviewers ask it (``freq:common``, ``freq:occasional``,
``freq:rare``) and how deep it goes (``level:basic``, ``level:intermediate``, ``level:advanced``), one of each;
:func:`tags_of` reads them and :meth:`Bank.with_tags` filters by them.

Numbers: every number an answer states (in ``short``, ``long``, follow-up answers and corrections, in either
language) must be the ``quote`` of one of the entry's evidence items, and that evidence must hold it. What does
not count as a stated number: digits inside names (FA2, H100, FP8, 64K, MiniMax-01),
exponents (N^2), single-digit counts
(not followed by x, % or 倍), years, run dates (2026-11-30) and arXiv ids in citations, references such as
"lesson 04", "section 3.1", "第 3.1 节", "练习 17", and anything inside a `code span` or $math$ (formulas).
:func:`validate` reports every breach.

A myth entry or a wrong answer may carry ``detect``: the key phrases by which the drill recognises it in a typed
answer (:mod:`flashcourse.interview.interviewer`); :func:`validate` checks that each recognises its own claim.
"""

from __future__ import annotations

import functools
import html
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from .._extras import missing

try:
    import yaml
except ImportError as error:  # not in the core install
    raise missing("interview", "pyyaml", __name__) from error

from . import evidence as ev

__all__ = [
    "LANGUAGES",
    "TAGS",
    "Bank",
    "evidence_label",
    "load",
    "markdown_to_html",
    "numbers_in",
    "one_line_answer",
    "render_entry",
    "render_evidence",
    "render_evidence_table",
    "render_entry_html",
    "render_html",
    "render_markdown",
    "render_question_list",
    "run_in",
    "tags_of",
    "text",
    "validate",
]

LANGUAGES = ("en", "zh")
TEXT_FIELDS = ("question", "short", "long")
POINTS_PER_ENTRY = (3, 5)  # the fewest and the most points an entry lists
CJK = re.compile(r"[\u4e00-\u9fff]")
ID_FORMAT = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")
# The tag vocabulary: each kind (the part before the colon) with its values. A tagged entry has one of each kind.
TAG_KINDS = {"freq": ("common", "occasional", "rare"), "level": ("basic", "intermediate", "advanced")}
TAGS = tuple(f"{kind}:{value}" for kind, values in TAG_KINDS.items() for value in values)
LABELS = {
    "en": {"show": "Show the answer", "show_follow_up": "answer", "claim": "Wrong answer", "correction": "Correction",
           "short": "30-second answer", "long": "Longer answer", "points": "Points to make",
           "follow_ups": "Follow-up questions",
           "wrong": "Common wrong answers", "evidence": "Evidence", "wrong_prefix": "Wrong:",
           "right_prefix": "Correction:", "cell": "cell", "heading": "section",
           "end": ".", "gap": " ", "results": "results", "computed": "computed by",
           "table": "| question | number | value held by the evidence | evidence |"},
    "zh": {"show": "显示答案", "show_follow_up": "答案", "claim": "错误说法", "correction": "纠正",
           "short": "30 秒回答", "long": "详细回答", "points": "要点", "follow_ups": "追问", "wrong": "常见错误回答",
           "evidence": "证据", "wrong_prefix": "错误说法：", "right_prefix": "纠正：", "cell": "单元格",
           "heading": "小节", "end": "：", "gap": "",
           "results": "结果", "computed": "计算函数", "table": "| 问题 | 数字 | 证据中的值 | 证据 |"},
}


@dataclass(frozen=True)
class Bank:
    """The parsed bank: ``sections`` (id -> title per language) in order, and ``entries`` in order."""

    sections: dict[str, dict[str, str]]
    entries: list[dict]

    def entry(self, entry_id: str) -> dict:
        """The entry with this id."""
        for entry in self.entries:
            if entry["id"] == entry_id:
                return entry
        raise KeyError(f"no entry {entry_id!r}; the bank has {[e['id'] for e in self.entries]}")

    def in_section(self, section: str) -> list[dict]:
        """Entries of one section, in bank order."""
        if section not in self.sections:
            raise KeyError(f"no section {section!r}; the bank has {list(self.sections)}")
        return [e for e in self.entries if e["section"] == section]

    def with_tags(self, *tags: str) -> list[dict]:
        """Entries carrying every one of ``tags`` (e.g. ``"freq:common"``, ``"level:advanced"``), in bank order."""
        unknown = [t for t in tags if t not in TAGS]
        if unknown:
            raise KeyError(f"unknown tags {unknown}; the vocabulary is {list(TAGS)}")
        return [e for e in self.entries if set(tags) <= set(tags_of(e))]


def tags_of(entry: dict) -> list[str]:
    """The entry's tags (an empty list for an untagged entry)."""
    return list(entry.get("tags") or [])


@functools.cache
def _load_packaged() -> Bank:
    source = resources.files("flashcourse.interview").joinpath("questions.yaml").read_text(encoding="utf-8")
    return _parse(yaml.safe_load(source))


def load(path: str | Path | None = None) -> Bank:
    """The bank from ``path``, or the one shipped with the package (parsed once, then cached)."""
    if path is None:
        return _load_packaged()
    return _parse(yaml.safe_load(Path(path).read_text(encoding="utf-8")))


# YAML folds a line break into a space; between two Chinese characters that space does not belong.
_CJK_GAP = re.compile(r"(?<=[\u3000-\u303f\u4e00-\u9fff\uff00-\uffef])\s+(?=[\u3000-\u303f\u4e00-\u9fff\uff00-\uffef])")


# ... and after or before full-width punctuation, whatever the neighbour ("，`code`", not "， `code`").
_PUNCT_GAP = re.compile(r"(?<=[，。：；！？、（）“”])[ \t\n]+|[ \t\n]+(?=[，。：；！？、（）“”])")


def _tidy_zh(text: str) -> str:
    return _PUNCT_GAP.sub("", _CJK_GAP.sub("", text))


def _tidy(node):
    """Remove the spaces YAML folding left between Chinese characters, in every ``zh`` text of ``node``."""
    if isinstance(node, dict):
        return {k: (_tidy_zh(v) if k == "zh" and isinstance(v, str) else _tidy(v)) for k, v in node.items()}
    if isinstance(node, list):
        return [_tidy(item) for item in node]
    return node


def _parse(data) -> Bank:
    if not isinstance(data, dict) or "sections" not in data or "entries" not in data:
        raise ValueError("the question bank must be a mapping with 'sections' and 'entries'")
    data = _tidy(data)
    sections = {s["id"]: s["title"] for s in data["sections"]}
    return Bank(sections=sections, entries=list(data["entries"]))


def text(field, lang: str) -> str:
    """One language of a bilingual text field."""
    if lang not in LANGUAGES:
        raise ValueError(f"lang must be one of {LANGUAGES}, got {lang!r}")
    return field[lang]


# ------------------------------------------------------------------------------------------- numbers
_FORMULA = re.compile(r"`[^`]*`|\$[^$]*\$")
_CITATION = re.compile(r"\b20\d\d-\d\d-\d\d\b|\b\d{4}\.\d{4,5}\b|\b20[0-2]\d\b")
_REFERENCE = re.compile(
    r"(?:\b[Ll]essons?|\b[Nn]otebooks?|\b[Ss]ections?|§|\bAlgorithm|\bTheorem|\bProposition|\bFigure|\bTable|\bexercises?"
    r"|\bissue|第|练习)\s*\d+(?:\.\d+)*(?:\s*(?:-|–|,|、|and|和|与)\s*\d+(?:\.\d+)*)*"
)
# A number, letters glued to it (a name when not "x"), and, looked ahead, a multiplier or percent sign, directly
# or at the end of a range ("2-4x"), which makes even a single digit a claim.
_NUMBER = re.compile(
    r"(?<![A-Za-z_\d.^/])(?<![A-Za-z]-)(\d+(?:\.\d+)?)(?P<suffix>[A-Za-z]*)"
    r"(?=(?P<after>\s*[x×%倍]|[-–]\d+(?:\.\d+)?\s*[x×%倍])?)"
)


def numbers_in(passage: str) -> list[str]:
    """The numbers a passage states as facts (see the module docstring for what is left out), as written."""
    passage = _REFERENCE.sub(" ", _CITATION.sub(" ", _FORMULA.sub(" ", passage)))
    found = []
    for match in _NUMBER.finditer(passage):
        number, suffix = match[1], match["suffix"]
        if suffix and suffix != "x":
            continue  # part of a name or a size label: 64K, 3rd, 2D
        if "." not in number and len(number) == 1 and not (suffix or match["after"]):
            continue  # a small count: "2 passes"
        found.append(number)
    return found


def _answer_passages(entry: dict, lang: str) -> list[str]:
    """Every passage of an entry that states facts: answers, follow-up answers, corrections (not the myths)."""
    passages = [entry["short"][lang], entry["long"][lang]] + [p[lang] for p in entry.get("points", [])]
    passages += [f["answer"][lang] for f in entry.get("follow_ups", [])]
    passages += [w["correction"][lang] for w in entry.get("wrong_answers", [])]
    return passages


# ------------------------------------------------------------------------------------------- validation
def _check_text(problems: list[str], where: str, field) -> None:
    if not isinstance(field, dict) or set(field) != set(LANGUAGES):
        problems.append(f"{where}: expected a mapping with exactly the keys {LANGUAGES}, got {field!r:.80}")
        return
    en, zh = field["en"], field["zh"]
    if not all(isinstance(t, str) and t.strip() for t in (en, zh)):
        problems.append(f"{where}: both en and zh must be non-empty text")
        return
    if en.strip() == zh.strip():
        problems.append(f"{where}: the zh text is the en text; translate it")
    if not CJK.search(zh):
        problems.append(f"{where}: the zh text has no Chinese characters: {zh!r:.80}")
    if CJK.search(en):
        problems.append(f"{where}: the en text contains Chinese characters: {en!r:.80}")


def _check_tags(problems: list[str], where: str, entry: dict) -> None:
    if "tags" not in entry:
        return
    tags = entry["tags"]
    if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
        problems.append(f"{where}: tags must be a list of strings such as {list(TAGS[:1])}, got {tags!r:.80}")
        return
    for tag in tags:
        if tag not in TAGS:
            problems.append(f"{where}: unknown tag {tag!r}; the vocabulary is {list(TAGS)}")
    for kind in TAG_KINDS:
        count = sum(t.startswith(f"{kind}:") and t in TAGS for t in tags)
        if count != 1:
            problems.append(f"{where}: has {count} {kind}: tags; a tagged entry has exactly one "
                            f"({', '.join(t for t in TAGS if t.startswith(kind))})")


def _check_points(problems: list[str], where: str, entry: dict) -> None:
    points = entry.get("points")
    low, high = POINTS_PER_ENTRY
    if not isinstance(points, list) or not low <= len(points) <= high:
        problems.append(f"{where}: points must list the {low} to {high} points a good answer makes, "
                        f"each {{en: ..., zh: ...}}; got {points!r:.80}")
        return
    for i, point in enumerate(points):
        _check_text(problems, f"{where} points[{i}]", point)


def evidence_value(item: dict, *, root: Path | None = None):
    """The number an evidence item holds (None for a pure pointer); raises EvidenceError if it does not resolve.

    A notebook item with ``compute`` must name a function its tagged cell calls.
    """
    if "notebook" in item and "heading" in item:
        ev.notebook_heading(item["notebook"], item["heading"], root=root)
        return None
    if "notebook" in item:
        cell = ev.notebook_cell(item["notebook"], item["cell_tag"], root=root)
        if "compute" in item:
            source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
            if f"{item['compute']}(" not in source:
                raise ev.EvidenceError(f"{item['notebook']} cell {item['cell_tag']!r} does not call "
                                       f"{item['compute']}(...), so it does not show the quoted number")
            return ev.compute(item["compute"], item.get("args"))
        return None
    if "results" in item:
        value = ev.results_value(item["results"], item["key"], root=root)
        if "divide_by" in item:
            value = value / ev.results_value(item["results"], item["divide_by"], root=root)
        return value * item.get("multiply", 1) if "quote" in item else value
    if "compute" in item:
        return ev.compute(item["compute"], item.get("args")) * item.get("multiply", 1)
    if "paper" in item:
        if not str(item.get("section", "")).strip():
            raise ev.EvidenceError(f"paper evidence {item['paper']!r} needs a section")
        return item.get("value")
    raise ev.EvidenceError(f"evidence {item!r:.80} is none of notebook, results, compute, paper")


def _quote(item: dict) -> str | None:
    if "quote" in item:
        return str(item["quote"])
    if "paper" in item and "value" in item:
        return str(item["value"])
    return None


def _check_evidence(problems: list[str], entry: dict, root: Path | None) -> set[str]:
    """Resolve every evidence item of an entry; return the quotes that hold."""
    where = f"entry {entry['id']}"
    quotes = set()
    items = entry.get("evidence") or []
    if not items:
        problems.append(f"{where}: no evidence")
    for index, item in enumerate(items):
        try:
            value = evidence_value(item, root=root)
        except (ev.EvidenceError, TypeError, ValueError) as error:
            problems.append(f"{where} evidence {index}: {error}")
            continue
        quote = _quote(item)
        if quote is None:
            if "compute" in item and "notebook" not in item and not value:
                problems.append(f"{where} evidence {index}: the check {item['compute']} failed (returned {value})")
            continue
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            problems.append(f"{where} evidence {index}: quotes {quote!r} but holds no number ({value!r})")
        elif not ev.quote_matches(quote, value):
            problems.append(f"{where} evidence {index}: the answer quotes {quote} but the evidence holds {value:.6g}")
        else:
            quotes.add(quote)
    return quotes


def validate(bank: Bank | None = None, *, root: Path | None = None) -> list[str]:
    """Every problem of the bank, as messages; an empty list means valid.

    Checks: ids unique and well formed; each entry's section exists; tags from the vocabulary, one of each kind;
    every text field has en and zh, the zh is Chinese and not the en; every evidence item resolves (files, cell
    tags, JSON keys, compute functions); every quoted number matches its evidence and appears in both languages;
    every number the answers state is quoted by some evidence of the entry.
    """
    bank = bank or load()
    problems: list[str] = []
    for section, title in bank.sections.items():
        _check_text(problems, f"section {section} title", title)
    seen = set()
    for entry in bank.entries:
        entry_id = entry.get("id", "?")
        where = f"entry {entry_id}"
        if not ID_FORMAT.match(str(entry_id)) or entry_id in seen:
            problems.append(f"{where}: id must be unique and lower-case-with-dashes")
        seen.add(entry_id)
        if entry.get("section") not in bank.sections:
            problems.append(f"{where}: section {entry.get('section')!r} is not one of {list(bank.sections)}")
        _check_tags(problems, where, entry)
        missing = [f for f in (*TEXT_FIELDS, "follow_ups", "wrong_answers", "evidence") if not entry.get(f)]
        if missing:
            problems.append(f"{where}: missing or empty fields {missing}")
            continue
        for field in TEXT_FIELDS:
            _check_text(problems, f"{where} {field}", entry[field])
        for i, follow in enumerate(entry["follow_ups"]):
            for part in ("question", "answer"):
                _check_text(problems, f"{where} follow_ups[{i}].{part}", follow.get(part))
        for i, wrong in enumerate(entry["wrong_answers"]):
            for part in ("claim", "correction"):
                _check_text(problems, f"{where} wrong_answers[{i}].{part}", wrong.get(part))
        _check_points(problems, where, entry)
        if any(p.startswith(where) and "expected a mapping" in p for p in problems):
            continue
        quotes = _check_evidence(problems, entry, root)
        for lang in LANGUAGES:
            stated = [n for passage in _answer_passages(entry, lang) for n in numbers_in(passage)]
            for number in sorted(set(stated) - quotes):
                problems.append(f"{where} ({lang}): states {number} but no evidence of the entry quotes it")
            for quote in sorted(quotes - set(stated)):
                problems.append(f"{where} ({lang}): evidence quotes {quote} but the {lang} answer never states it")
    from .interviewer import detect_problems  # imported here: interviewer imports this module

    return problems + detect_problems(bank)


# ------------------------------------------------------------------------------------------- rendering
def evidence_label(item: dict, lang: str = "en") -> str:
    """One evidence item as a line of Markdown, in ``lang``."""
    labels = LABELS[lang]
    comma = ", " if lang == "en" else "，"
    if "notebook" in item:
        name = Path(item["notebook"]).name
        if "heading" in item:
            space = " " if lang == "en" else ""
            return f"[{name}](../{item['notebook']}){comma}{labels['heading']}{space}“{item['heading']}”"
        return f"[{name}](../{item['notebook']}){comma}{labels['cell']} `{item['cell_tag']}`"
    if "results" in item:
        ratio = f" / `{item['divide_by']}`" if "divide_by" in item else ""
        return f"{labels['results']} `{item['results']}`{comma}`{item['key']}`{ratio}"
    if "compute" in item:
        args = ", ".join(f"{k}={v}" for k, v in (item.get("args") or {}).items())
        return f"{labels['computed']} `flashcourse.interview.evidence.{item['compute']}({args})`"
    return f"{item['paper']}, {item['section']}"


def run_in(label: str, lang: str) -> str:
    """A bold run-in heading: "**Evidence:** " in English; "<strong>证据：</strong>" in Chinese, because CommonMark
    (GitHub, JupyterLab, the website) does not close "**" right after a full-width colon that a Chinese
    character follows."""
    if lang == "en":
        return f"**{label}** "
    return f"<strong>{label}</strong>"


def render_evidence(entry: dict, lang: str = "en") -> str:
    """The evidence of an entry as one Markdown paragraph: "**Evidence:** a; b" or "<strong>证据：</strong>a；b"."""
    labels = LABELS[lang]
    separator = "; " if lang == "en" else "；"
    return (run_in(labels["evidence"] + (":" if lang == "en" else labels["end"]), lang)
            + separator.join(evidence_label(i, lang) for i in entry["evidence"]))


def render_entry(entry: dict, lang: str = "en", *, heading_level: int = 3) -> str:
    """One entry as Markdown: question, 30-second answer, points to make, longer answer, follow-ups, wrong answers,
    evidence."""
    labels = LABELS[lang]
    hashes = "#" * heading_level
    end = labels["end"]
    lines = [f"{hashes} {entry['question'][lang]}", "", f"{run_in(labels['short'] + end, lang)}{entry['short'][lang]}",
             "", f"**{labels['points']}**", "", *(f"- {p[lang]}" for p in entry.get("points", [])),
             "", f"{run_in(labels['long'] + end, lang)}{entry['long'][lang].strip()}", "",
             f"**{labels['follow_ups']}**", ""]
    for follow in entry["follow_ups"]:
        lines.append(f"- *{follow['question'][lang]}* {follow['answer'][lang]}")
    lines += ["", f"**{labels['wrong']}**", ""]
    for wrong in entry["wrong_answers"]:
        gap = labels["gap"]
        lines.append(f"- {labels['wrong_prefix']}{gap}{wrong['claim'][lang]}{gap}{labels['right_prefix']}{gap}"
                     f"{wrong['correction'][lang]}")
    lines += ["", render_evidence(entry, lang), ""]
    return "\n".join(lines)


def render_entry_html(entry: dict, lang: str = "en") -> str:
    """One entry as HTML for lesson 10: the question, then the answer hidden in a ``<details>`` until opened (the
    30-second answer, the points to make, the longer answer, then the evidence behind them), each follow-up with
    its answer hidden, and the wrong answers beside their corrections in a two-column table. CSS classes:
    ``fc-entry``, ``fc-answer``, ``fc-points``, ``fc-evidence``, ``fc-follow-up``, ``fc-wrong``."""
    labels = LABELS[lang]
    html_of = markdown_to_html
    end = labels["end"]
    follow_ups = "".join(
        f'<li class="fc-follow-up">{html_of(f["question"][lang])}<details><summary>{labels["show_follow_up"]}'
        f"</summary>{html_of(f['answer'][lang])}</details></li>" for f in entry["follow_ups"])
    points = "\n".join(f"- {p[lang]}" for p in entry.get("points", []))
    # Jupyter's stylesheet right-aligns table cells; these hold prose, read from the left (inline: the lesson's
    # output and the website keep an element's style, not a stylesheet of ours).
    left = ' style="text-align: left; vertical-align: top"'
    wrong_rows = "".join(f"<tr><td{left}>{html_of(w['claim'][lang])}</td><td{left}>{html_of(w['correction'][lang])}"
                         f"</td></tr>" for w in entry["wrong_answers"])
    return (
        f'<div class="fc-entry" id="fc-{entry["id"]}"><h3>{html.escape(entry["question"][lang])}</h3>'
        f'<details class="fc-answer"><summary>{labels["show"]}</summary>'
        f"<p><strong>{labels['short']}{end}</strong>{labels['gap']}</p>{html_of(entry['short'][lang])}"
        f'<div class="fc-points"><p><strong>{labels["points"]}</strong></p>{html_of(points)}</div>'
        f"<p><strong>{labels['long']}{end}</strong></p>{html_of(entry['long'][lang])}"
        f'<div class="fc-evidence">{html_of(render_evidence(entry, lang))}</div></details>'
        f"<p><strong>{labels['follow_ups']}</strong></p><ul>{follow_ups}</ul>"
        f'<table class="fc-wrong"><tr><th{left}>{labels["claim"]}</th><th{left}>{labels["correction"]}</th></tr>'
        f"{wrong_rows}"
        "</table></div>")


def render_html(bank: Bank | None = None, lang: str = "en", *, section: str) -> str:
    """A section of the bank as HTML, answers hidden (:func:`render_entry_html`)."""
    bank = bank or load()
    return "".join(render_entry_html(e, lang) for e in bank.in_section(section))


def render_markdown(bank: Bank | None = None, lang: str = "en", *, section: str | None = None) -> str:
    """A whole section (or the whole bank, with section headings) as Markdown, in ``lang``."""
    bank = bank or load()
    if section is not None:
        return "\n".join(render_entry(e, lang) for e in bank.in_section(section))
    parts = []
    for section_id, title in bank.sections.items():
        parts.append(f"## {title[lang]}\n")
        parts.extend(render_entry(e, lang) for e in bank.in_section(section_id))
    return "\n".join(parts)


def _sentences(passage: str) -> list[str]:
    """A passage cut into sentences at '. ', '? ', '。' or '？', never inside a `code span`."""
    sentences, start, in_code = [], 0, False
    for i, char in enumerate(passage):
        if char == "`":
            in_code = not in_code
        ends = char in "。？" or (char in ".?" and (i + 1 == len(passage) or passage[i + 1].isspace()))
        if ends and not in_code:
            sentences.append(passage[start:i + 1].strip())
            start = i + 1
    if passage[start:].strip():
        sentences.append(passage[start:].strip())
    return sentences


def one_line_answer(entry: dict, lang: str = "en") -> str:
    """The first sentence of the 30-second answer, or the first two when the first is a bare "No." or "False."."""
    sentences = _sentences(entry["short"][lang])
    short_enough = 12 if lang == "zh" else 30
    if len(sentences) > 1 and len(sentences[0]) < short_enough:
        return f"{sentences[0]} {sentences[1]}" if lang == "en" else sentences[0] + sentences[1]
    return sentences[0]


def render_question_list(bank: Bank | None = None, lang: str = "en") -> str:
    """Every question with a one-line answer (the first sentence of its 30-second answer), as a Markdown list."""
    bank = bank or load()
    return "\n".join(f"- *{e['question'][lang]}* {one_line_answer(e, lang)}" for e in bank.entries)


def render_evidence_table(bank: Bank | None = None, lang: str = "en", *, root: Path | None = None) -> str:
    """A Markdown table of every number the answers quote, the value its evidence holds now, and the evidence.

    The values are resolved on the spot (computed, read from results JSON, or as the paper reports them).
    """
    bank = bank or load()
    lines = [LABELS[lang]["table"], "|---|---|---|---|"]
    for entry in bank.entries:
        for item in entry["evidence"]:
            quote = _quote(item)
            if quote is None:
                continue
            value = evidence_value(item, root=root)
            lines.append(f"| {entry['question'][lang]} | {quote} | {value:.4g} | {evidence_label(item, lang)} |")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------- HTML
def markdown_to_html(source: str) -> str:
    """The small Markdown subset the bank uses (paragraphs, ``- `` lists, `code`, **bold**, *italic*) as HTML."""
    def inline(line: str) -> str:
        parts = re.split(r"(`[^`]*`)", line)
        out = []
        for part in parts:
            if part.startswith("`") and part.endswith("`") and len(part) > 1:
                out.append(f"<code>{html.escape(part[1:-1])}</code>")
            else:
                part = html.escape(part).replace("&lt;strong&gt;", "<strong>").replace("&lt;/strong&gt;", "</strong>")
                part = re.sub(r"\[([^\]]+)\]\(([^)\s]+)\)", r'<a href="\2">\1</a>', part)
                part = re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", part)
                part = re.sub(r"(?<![*\w])\*(?!\s)(.+?)(?<!\s)\*(?![*\w])", r"<em>\1</em>", part)
                out.append(part)
        return "".join(out)

    blocks = []
    for block in re.split(r"\n\s*\n", source.strip()):
        lines = [line.strip() for line in block.splitlines() if line.strip()]
        if lines and all(line.startswith("- ") for line in lines):
            items = "".join(f"<li>{inline(line[2:])}</li>" for line in lines)
            blocks.append(f"<ul>{items}</ul>")
        elif lines:
            blocks.append(f"<p>{inline(' '.join(lines))}</p>")
    return "".join(blocks)
