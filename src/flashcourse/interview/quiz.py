"""The interview quiz: a question, its answer hidden until asked, a chain of follow-ups, a self-score.

A round asks every question once, the common and basic ones first (by the entries' ``freq:`` and ``level:``
tags), shuffled within each step of that ladder. "Show answer" shows the 30-second answer and the points a good
answer makes; the longer answer stays folded under it (a ``<details>``, class ``fc-quiz-long``) until opened.

Every control is an attribute (``next_button``, ``reveal_button``, ``follow_up_button``, ``score_buttons``), so
a test drives the quiz with ``quiz.reveal_button.click()`` and reads ``quiz.question_view.value`` without a
browser. The HTML it shows carries stable CSS classes for a browser test: ``fc-quiz`` (the whole widget),
``fc-quiz-question``, ``fc-quiz-answer`` (present only once revealed: a hidden answer is not in the page at
all), ``fc-quiz-long``, ``fc-quiz-points``, ``fc-quiz-wrong`` (the common wrong answers, shown with every
answer), ``fc-quiz-myth`` (a known myth stated in the typed answer, ``answer_box``, named with its correction),
``fc-quiz-followup``, ``fc-quiz-score``.
"""

from __future__ import annotations

import html
import random

from .._extras import missing

try:
    import ipywidgets as widgets
except ImportError as error:  # not in the core install
    raise missing("course", "ipywidgets", __name__) from error

from . import bank as bank_module
from . import interviewer
from .bank import markdown_to_html
from .interviewer import ease, round_order

__all__ = ["Quiz", "ease", "markdown_to_html", "round_order"]

POINTS = {"got_it": 1.0, "partly": 0.5, "missed": 0.0}
UI = {
    "en": {"next": "New question", "reveal": "Show answer", "follow_up": "Follow-up", "got_it": "Got it",
           "partly": "Partly", "missed": "Missed", "short": "30-second answer", "long": "Longer answer",
           "score": "Score", "follow_up_label": "Follow-up", "points": "A good answer says",
           "start": "Press “New question” to start.", "your_answer": "Your answer (type it before you look)",
           "myth": "Your answer states a known myth", "wrong": "Common wrong answers (do not say these)",
           "no_more": "No more follow-ups: score yourself, then take a new question."},
    "zh": {"next": "新问题", "reveal": "显示答案", "follow_up": "追问", "got_it": "答对了", "partly": "部分答对",
           "missed": "没答出", "short": "30 秒回答", "long": "详细回答", "score": "得分", "points": "好的回答要讲到",
           "follow_up_label": "追问", "start": "点击“新问题”开始。", "your_answer": "你的回答（先写，再看答案）",
           "myth": "你的回答说了一个常见误区", "wrong": "常见错误回答（面试时别这么说）",
           "no_more": "没有更多追问：先给自己打分，再换一道新问题。"},
}


class Quiz:
    """Drill the question bank: ``Quiz(lang="zh", seed=0).widget`` displays it in a notebook.

    State a test can read: ``current`` (the entry asked, or None), ``follow_up_index`` (-1 while on the main
    question), ``revealed`` (whether the answer to what is on screen is shown), ``scores`` (entry id ->
    points: 1 got it, 0.5 partly, 0 missed) and ``total``.
    """

    def __init__(self, question_bank: bank_module.Bank | None = None, *, lang: str = "en", seed: int | None = None,
                 section: str | None = None):
        if lang not in UI:
            raise ValueError(f"lang must be one of {sorted(UI)}, got {lang!r}")
        self.bank = question_bank or bank_module.load()
        self.entries = self.bank.in_section(section) if section else list(self.bank.entries)
        if not self.entries:
            raise ValueError("the quiz needs at least one question")
        self.lang = lang
        self._rng = random.Random(seed)
        self._unasked: list[dict] = []
        self.current: dict | None = None
        self.follow_up_index = -1
        self.revealed = False
        self.scores: dict[str, float] = {}

        ui = UI[lang]
        self.next_button = widgets.Button(description=ui["next"], button_style="primary")
        self.reveal_button = widgets.Button(description=ui["reveal"], disabled=True)
        self.follow_up_button = widgets.Button(description=ui["follow_up"], disabled=True)
        self.score_buttons = {kind: widgets.Button(description=ui[kind], disabled=True) for kind in POINTS}
        self.question_view = widgets.HTML(f'<div class="fc-quiz-question">{html.escape(ui["start"])}</div>')
        self.answer_box = widgets.Textarea(placeholder=ui["your_answer"], layout=widgets.Layout(width="100%"))
        self.answer_view = widgets.HTML("")
        self.follow_up_view = widgets.HTML("")
        self.score_view = widgets.HTML("")
        self.next_button.on_click(lambda _: self.next_question())
        self.reveal_button.on_click(lambda _: self.reveal())
        self.follow_up_button.on_click(lambda _: self.next_follow_up())
        for kind, button in self.score_buttons.items():
            button.on_click(lambda _, kind=kind: self.score(kind))
        controls = widgets.HBox([self.next_button, self.reveal_button, self.follow_up_button])
        scoring = widgets.HBox(list(self.score_buttons.values()) + [self.score_view])
        self.widget = widgets.VBox([controls, self.question_view, self.answer_box, self.answer_view,
                                    self.follow_up_view, scoring])
        self.widget.add_class("fc-quiz")
        self._show_score()

    # ----------------------------------------------------------------------------------- actions
    def next_question(self) -> dict:
        """Ask the next question of this round: every question once, the common and basic ones first."""
        if not self._unasked:
            self._unasked = round_order(self.entries, self._rng)
            if self.current is not None and len(self._unasked) > 1 and self._unasked[0] is self.current:
                self._unasked.append(self._unasked.pop(0))  # never the same question twice in a row
        self.current = self._unasked.pop(0)
        self.follow_up_index = -1
        self.revealed = False
        question = self.current["question"][self.lang]
        self.question_view.value = f'<div class="fc-quiz-question">{markdown_to_html(question)}</div>'
        self.answer_view.value = ""
        self.answer_box.value = ""
        self.follow_up_view.value = ""
        self.reveal_button.disabled = False
        self.follow_up_button.disabled = True
        for button in self.score_buttons.values():
            button.disabled = True
        return self.current

    def reveal(self) -> None:
        """Show the answer to what is on screen: the main question's 30-second answer and points, its longer answer
        folded under them; or the follow-up's answer."""
        if self.current is None:
            return
        ui = UI[self.lang]
        self.revealed = True
        self.reveal_button.disabled = True
        if self.follow_up_index < 0:
            short = markdown_to_html(self.current["short"][self.lang])
            long = markdown_to_html(self.current["long"][self.lang])
            points = "".join(f"<li>{markdown_to_html(p[self.lang]).removeprefix('<p>').removesuffix('</p>')}</li>"
                             for p in self.current.get("points", []))
            points = (f'<div class="fc-quiz-points"><p><strong>{ui["points"]}</strong></p><ul>{points}</ul></div>'
                      if points else "")
            self.answer_view.value = (
                f'{self._myths_html()}<div class="fc-quiz-answer"><p><strong>{ui["short"]}</strong></p>{short}'
                f'{points}{self._wrong_answers_html()}'
                f'<details class="fc-quiz-long"><summary>{ui["long"]}</summary>{long}</details></div>'
            )
            for button in self.score_buttons.values():
                button.disabled = self.current["id"] in self.scores
        else:
            follow = self.current["follow_ups"][self.follow_up_index]
            self.follow_up_view.value = self._myths_html() + self._follow_up_html(follow, with_answer=True)
        self.follow_up_button.disabled = self.follow_up_index + 1 >= len(self.current["follow_ups"])
        if self.follow_up_button.disabled and self.follow_up_index >= 0:
            self.follow_up_view.value += f'<div class="fc-quiz-followup"><em>{ui["no_more"]}</em></div>'

    def next_follow_up(self) -> dict | None:
        """Ask the next follow-up of the current question (its answer hidden); None when there is no more."""
        if self.current is None or not self.revealed:
            return None
        if self.follow_up_index + 1 >= len(self.current["follow_ups"]):
            return None
        self.follow_up_index += 1
        self.revealed = False
        follow = self.current["follow_ups"][self.follow_up_index]
        self.follow_up_view.value = self._follow_up_html(follow, with_answer=False)
        self.answer_box.value = ""
        self.follow_up_button.disabled = True
        self.reveal_button.disabled = False
        return follow

    def score(self, kind: str) -> float:
        """Score yourself on the current question (``"got_it"``, ``"partly"``, ``"missed"``), once per question
        per quiz; returns the running total."""
        if kind not in POINTS:
            raise ValueError(f"kind must be one of {sorted(POINTS)}, got {kind!r}")
        if self.current is None or self.current["id"] in self.scores:
            return self.total
        self.scores[self.current["id"]] = POINTS[kind]
        for button in self.score_buttons.values():
            button.disabled = True
        self._show_score()
        return self.total

    # ----------------------------------------------------------------------------------- display
    @property
    def total(self) -> float:
        """Points so far."""
        return sum(self.scores.values())

    def _show_score(self) -> None:
        ui = UI[self.lang]
        self.score_view.value = (f'<span class="fc-quiz-score">{ui["score"]}: {self.total:g} / '
                                 f"{len(self.scores)}</span>")

    def _myths_html(self) -> str:
        """The known myths the typed answer states, each with its correction (class ``fc-quiz-myth``)."""
        parts = [f'<div class="fc-quiz-myth"><p><strong>{UI[self.lang]["myth"]}</strong></p>'
                 f'{markdown_to_html(myth.claim[self.lang])}{markdown_to_html(myth.correction[self.lang])}</div>'
                 for myth in interviewer.spot_myths(self.answer_box.value, self.bank)]
        return "".join(parts)

    def _wrong_answers_html(self) -> str:
        """The entry's common wrong answers with their corrections, shown with every answer (``fc-quiz-wrong``)."""
        items = "".join(f"<li>{markdown_to_html(w['claim'][self.lang])}{markdown_to_html(w['correction'][self.lang])}"
                        f"</li>" for w in self.current.get("wrong_answers") or [])
        return (f'<div class="fc-quiz-wrong"><p><strong>{UI[self.lang]["wrong"]}</strong></p><ul>{items}</ul></div>'
                if items else "")

    def _follow_up_html(self, follow: dict, *, with_answer: bool) -> str:
        ui = UI[self.lang]
        question = markdown_to_html(follow["question"][self.lang])
        parts = [f'<div class="fc-quiz-followup"><p><strong>{ui["follow_up_label"]} '
                 f'{self.follow_up_index + 1}</strong></p>{question}</div>']
        if with_answer:
            parts.append(f'<div class="fc-quiz-answer">{markdown_to_html(follow["answer"][self.lang])}</div>')
        return "".join(parts)
