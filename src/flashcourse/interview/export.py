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


def anki_deck(question_bank: bank_module.Bank | None = None, lang: str = "en"):
    """A genanki Deck: one note per entry (front: the question; back: the 30-second answer, the longer answer,
    the follow-ups with their answers and the evidence), tagged with its section."""
    try:
        import genanki
    except ImportError:
        raise SystemExit('the Anki export needs genanki: pip install "flashcourse[anki]" (or pip install genanki)'
                         ) from None
    question_bank = question_bank or bank_module.load()
    labels = bank_module.LABELS[lang]
    model = genanki.Model(
        _stable_id(f"flashcourse-interview-model-{lang}"), f"flashcourse interview ({lang})",
        fields=[{"name": "Id"}, {"name": "Question"}, {"name": "Answer"}],
        templates=[{"name": "Card", "qfmt": "{{Question}}",
                    "afmt": '{{FrontSide}}<hr id="answer">{{Answer}}'}])
    deck = genanki.Deck(_stable_id(f"flashcourse-interview-deck-{lang}"),
                        "FlashAttention interview" if lang == "en" else "FlashAttention 面试题")
    html = bank_module.markdown_to_html
    for entry in question_bank.entries:
        follow = "".join(f"<li><em>{html(f['question'][lang])}</em> {html(f['answer'][lang])}</li>"
                         for f in entry["follow_ups"])
        answer = (f"<h4>{labels['short']}</h4>{html(entry['short'][lang])}"
                  f"<h4>{labels['long']}</h4>{html(entry['long'][lang])}"
                  f"<h4>{labels['follow_ups']}</h4><ul>{follow}</ul>"
                  f"{html(bank_module.render_evidence(entry, lang))}")
        deck.add_note(genanki.Note(model=model, fields=[entry["id"], html(entry["question"][lang]), answer],
                                   guid=genanki.guid_for("flashcourse", lang, entry["id"]),
                                   tags=[f"flashcourse::{entry['section']}"]))
    return deck


def write_anki(path: Path, question_bank: bank_module.Bank | None = None, lang: str = "en") -> Path:
    """Write the deck as an .apkg file; returns its path."""
    deck = anki_deck(question_bank, lang)  # says how to install genanki when it is missing
    import genanki

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    genanki.Package(deck).write_to_file(str(path))
    return path
