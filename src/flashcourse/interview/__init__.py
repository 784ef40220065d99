"""Interview preparation: a bilingual question bank backed by the course's own evidence, and a quiz.

``load()`` returns the bank shipped with the package (``questions.yaml``), ``validate()`` lists every problem
in it (missing translations, evidence that does not resolve, quoted numbers that do not match),
``render_markdown(lang="zh")`` renders it as Markdown (docs/interview_*.md), ``render_html`` for lesson 10 (answers
hidden until opened), ``flashcourse interview quiz`` drills it in a terminal with spaced repetition
(:mod:`.terminal`), and ``Quiz`` (in
:mod:`flashcourse.interview.quiz`,
imported on demand because it needs ipywidgets) drills it.
"""

from .bank import (
    LANGUAGES,
    Bank,
    load,
    numbers_in,
    render_entry,
    render_entry_html,
    render_evidence_table,
    render_html,
    render_markdown,
    render_question_list,
    validate,
)

__all__ = ["LANGUAGES", "Bank", "Quiz", "load", "numbers_in", "render_entry", "render_entry_html",
           "render_evidence_table", "render_html", "render_markdown", "render_question_list", "validate"]


def __getattr__(name):
    if name == "Quiz":
        from .quiz import Quiz

        return Quiz
    raise AttributeError(f"module 'flashcourse.interview' has no attribute {name!r}")
