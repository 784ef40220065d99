"""The bank outside the course: a Markdown document (``docs/interview_en.md``, ``docs/interview_zh.md``, kept in
sync by a test) and an Anki deck. ``flashcourse interview export --format md|anki --lang zh|en [--out PATH]``.

The Anki deck needs ``genanki`` (``pip install "flashcourse[anki]"``); the Markdown needs nothing more.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from . import bank as bank_module

__all__ = ["DOCUMENT_PATHS", "anki_deck", "render_document", "write_anki"]

DOCUMENT_PATHS = {"en": Path("docs/interview_en.md"), "zh": Path("docs/interview_zh.md")}
_INTRO = {
    "en": ("# FlashAttention interview questions\n\n"
           "Generated from `src/flashcourse/interview/questions.yaml` by "
           "`flashcourse interview export --format md --lang en --out docs/interview_en.md`; do not edit by hand. "
           "Every number an answer quotes is backed by the evidence listed under it (a computation of the course, a "
           "lesson, a GPU result in `benchmarks/results/`, or a cited paper), and a test checks that the evidence "
           "still holds it. Drill it in a terminal with `flashcourse quiz`, or in lesson 10. Chinese: "
           "[interview_zh.md](interview_zh.md).\n"),
    "zh": ("# FlashAttention 面试题\n\n"
           "本文件由 `src/flashcourse/interview/questions.yaml` 生成（"
           "`flashcourse interview export --format md --lang zh --out docs/interview_zh.md`），请勿手工修改。"
           "回答中引用的每个数字都附有证据（本课程的计算、某一课、`benchmarks/results/` 中的 GPU 结果或所引论文），"
           "测试会检查证据仍然给出这个数字。在终端中用 `flashcourse quiz --lang zh` 练习，或在第 10 课中练习。"
           "英文版：[interview_en.md](interview_en.md)。术语对照见 [glossary.md](glossary.md)。\n"),
}


def render_document(question_bank: bank_module.Bank | None = None, lang: str = "en") -> str:
    """The whole bank as one Markdown document: an introduction, a contents list, every section and entry."""
    question_bank = question_bank or bank_module.load()
    count = "{} ({})" if lang == "en" else "{}（{} 题）"
    contents = "\n".join("- " + count.format(title[lang], len(question_bank.in_section(section)))
                         for section, title in question_bank.sections.items())
    body = bank_module.render_markdown(question_bank, lang)
    # Links in the bank's evidence point from a lesson (../notebooks/...); from docs/ they are the same.
    return f"{_INTRO[lang]}\n{contents}\n\n{body.rstrip()}\n"


def _stable_id(text: str) -> int:
    """A 31-bit id that stays the same between exports, so re-importing a deck updates it in Anki."""
    return int(hashlib.sha256(text.encode()).hexdigest()[:8], 16) & 0x7FFFFFFF


_CARD_TEXT = {
    "en": {"follow_up": "Follow-up to: {question}", "spot": "Spot the error. Asked: {question}",
           "claim": "Wrong answer: {claim}", "correction": "Correction"},
    "zh": {"follow_up": "追问，原题：{question}", "spot": "找错。原题：{question}",
           "claim": "错误回答：{claim}", "correction": "纠正"},
}


def _tags(entry: dict) -> list[str]:
    """Anki tags of a note: its section and its entry's tags (``freq:common`` -> ``flashcourse::freq::common``)."""
    return [f"flashcourse::{entry['section']}",
            *(f"flashcourse::{tag.replace(':', '::')}" for tag in entry.get("tags", []) or [])]


def anki_deck(question_bank: bank_module.Bank | None = None, lang: str = "en"):
    """A genanki Deck: per entry one note for the question (back: the 30-second answer, the checklist of points a
    good answer makes, the longer answer and the evidence), one note per follow-up (front: the follow-up under its
    question; back: its answer) and one per common wrong answer (front: the wrong claim to correct; back: the
    correction), tagged with the section and the entry's tags. Each note has a stable id (``ENTRY``,
    ``ENTRY/follow-up-N``, ``ENTRY/wrong-N``), so re-importing a deck updates the cards instead of adding new
    ones."""
    try:
        import genanki
    except ImportError:
        raise SystemExit('the Anki export needs genanki: pip install "flashcourse[anki]" (or pip install genanki)'
                         ) from None
    question_bank = question_bank or bank_module.load()
    labels, words = bank_module.LABELS[lang], _CARD_TEXT[lang]
    model = genanki.Model(
        _stable_id(f"flashcourse-interview-model-{lang}"), f"flashcourse interview ({lang})",
        fields=[{"name": "Id"}, {"name": "Question"}, {"name": "Answer"}],
        templates=[{"name": "Card", "qfmt": "{{Question}}",
                    "afmt": '{{FrontSide}}<hr id="answer">{{Answer}}'}])
    deck = genanki.Deck(_stable_id(f"flashcourse-interview-deck-{lang}"),
                        "FlashAttention interview" if lang == "en" else "FlashAttention 面试题")
    html = bank_module.markdown_to_html

    def add(note_id: str, front: str, back: str, entry: dict) -> None:
        deck.add_note(genanki.Note(model=model, fields=[note_id, front, back],
                                   guid=genanki.guid_for("flashcourse", lang, note_id), tags=_tags(entry)))

    for entry in question_bank.entries:
        question = entry["question"][lang]
        evidence = html(bank_module.render_evidence(entry, lang))
        checklist = "".join(f"<li>{html(point[lang])}</li>" for point in entry.get("points") or [])
        checklist = f"<h4>{labels['points']}</h4><ol class=\"checklist\">{checklist}</ol>" if checklist else ""
        add(entry["id"], html(question),
            f"<h4>{labels['short']}</h4>{html(entry['short'][lang])}{checklist}"
            f"<h4>{labels['long']}</h4>{html(entry['long'][lang])}{evidence}", entry)
        for number, follow in enumerate(entry.get("follow_ups", []), start=1):
            add(f"{entry['id']}/follow-up-{number}",
                f"<p><small>{html(words['follow_up'].format(question=question))}</small></p>"
                f"{html(follow['question'][lang])}", html(follow["answer"][lang]), entry)
        for number, wrong in enumerate(entry.get("wrong_answers", []), start=1):
            add(f"{entry['id']}/wrong-{number}",
                f"<p><small>{html(words['spot'].format(question=question))}</small></p>"
                f"{html(words['claim'].format(claim=wrong['claim'][lang]))}",
                f"<h4>{words['correction']}</h4>{html(wrong['correction'][lang])}", entry)
    return deck


def write_anki(path: Path, question_bank: bank_module.Bank | None = None, lang: str = "en") -> Path:
    """Write the deck as an .apkg file; returns its path."""
    deck = anki_deck(question_bank, lang)  # says how to install genanki when it is missing
    import genanki

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    genanki.Package(deck).write_to_file(str(path))
    return path
