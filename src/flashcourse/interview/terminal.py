"""The interview drill in a terminal: ``flashcourse quiz [--lang zh|en] [--section S] [--short-only]
[--retry-missed] [--seed N]``.

A random order by default (``--seed`` makes it repeatable). Each question shows the 30-second answer on request,
the longer answer and its evidence if asked, then asks for a self-score; each follow-up is asked and scored the
same way. Scores are kept between sessions in ``$XDG_DATA_HOME/flashcourse/quiz_scores.json`` (default
``~/.local/share/flashcourse/``); ``--retry-missed`` asks only what was last scored "partly" or "missed".
Rendering is rich's (Markdown, panels, a summary table); input is one key and Enter.
"""

from __future__ import annotations

import json
import os
import random
import tempfile
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from rich.console import Console
from rich.markdown import Markdown
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table

from . import bank as bank_module

__all__ = ["POINTS", "ScoreStore", "data_dir", "run_quiz"]

POINTS = {"g": 1.0, "p": 0.5, "m": 0.0}
UI = {
    "en": {"question": "Question", "of": "of", "follow_up": "Follow-up", "short": "30-second answer",
           "long": "Longer answer", "evidence": "Evidence",
           "reveal": "[Enter] show the answer, [s] skip, [q] quit",
           "more": "[l] longer answer and evidence, [Enter] go on",
           "score": "Score yourself: [g] got it, [p] partly, [m] missed",
           "follow_reveal": "[Enter] show the answer, [s] skip the follow-ups, [q] quit",
           "again": "Please type one of", "nothing": "Nothing to retry: no question was scored partly or missed.",
           "summary": "This session", "asked": "asked", "points": "points", "missed": "to retry",
           "saved": "Scores saved in", "bye": "Stopped."},
    "zh": {"question": "问题", "of": "/", "follow_up": "追问", "short": "30 秒回答", "long": "详细回答",
           "evidence": "证据",
           "reveal": "[Enter] 显示答案，[s] 跳过，[q] 退出",
           "more": "[l] 详细回答和证据，[Enter] 继续",
           "score": "给自己打分：[g] 答对了，[p] 部分答对，[m] 没答出",
           "follow_reveal": "[Enter] 显示答案，[s] 跳过追问，[q] 退出",
           "again": "请输入以下之一：", "nothing": "没有需要重做的题：没有题目被评为“部分答对”或“没答出”。",
           "summary": "本次练习", "asked": "已答", "points": "得分", "missed": "待重做",
           "saved": "得分保存在", "bye": "已退出。"},
}


def data_dir() -> Path:
    """Where scores are kept: ``$XDG_DATA_HOME/flashcourse``, or ``~/.local/share/flashcourse``."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "flashcourse"


@dataclass
class ScoreStore:
    """Scores between sessions: per entry, how often asked, the last and best score, the follow-ups' last
    scores; and one line per session. Saved as JSON, written whole to a temporary file and renamed."""

    path: Path
    entries: dict = field(default_factory=dict)
    sessions: list = field(default_factory=list)

    @classmethod
    def open(cls, path: Path | None = None) -> ScoreStore:
        path = path or data_dir() / "quiz_scores.json"
        if path.exists():
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
                return cls(path, data.get("entries", {}), data.get("sessions", []))
            except (json.JSONDecodeError, AttributeError):
                path.rename(path.with_suffix(".corrupt.json"))  # keep it for the learner, start afresh
        return cls(path)

    def record(self, entry_id: str, points: float) -> None:
        item = self.entries.setdefault(entry_id, {"asked": 0, "best": 0.0, "follow_ups": {}})
        item["asked"] += 1
        item["last"] = points
        item["best"] = max(item["best"], points)

    def record_follow_up(self, entry_id: str, index: int, points: float) -> None:
        item = self.entries.setdefault(entry_id, {"asked": 0, "best": 0.0, "follow_ups": {}})
        item["follow_ups"][str(index)] = points

    def missed(self) -> set[str]:
        """Entries whose last score, or the last score of one of their follow-ups, was below "got it"."""
        return {entry_id for entry_id, item in self.entries.items()
                if item.get("last", 1.0) < 1.0 or any(p < 1.0 for p in item.get("follow_ups", {}).values())}

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        data = {"version": 1, "entries": self.entries, "sessions": self.sessions}
        with tempfile.NamedTemporaryFile("w", dir=self.path.parent, delete=False, encoding="utf-8",
                                         suffix=".tmp") as handle:
            json.dump(data, handle, ensure_ascii=False, indent=1)
        Path(handle.name).replace(self.path)


class _Quit(Exception):
    """The learner typed q, or the input ended."""


class _Session:
    def __init__(self, console: Console, lang: str, store: ScoreStore):
        self.console, self.lang, self.store, self.ui = console, lang, store, UI[lang]
        self.asked = 0
        self.points = 0.0
        self.to_retry: list[str] = []

    def ask(self, prompt: str, choices: tuple[str, ...]) -> str:
        """One line of input, lower-cased, until it is one of ``choices`` ("" is Enter)."""
        while True:
            try:
                answer = self.console.input(f"[bold cyan]{escape(prompt)}[/] > ").strip().lower()
            except EOFError:
                raise _Quit from None
            if answer == "q" and "q" in choices:
                raise _Quit
            if answer in choices:
                return answer
            shown = ", ".join(c or "Enter" for c in choices)
            self.console.print(escape(f"{self.ui['again']} {shown}"))

    def show(self, title: str, text: str, style: str = "green") -> None:
        self.console.print(Panel(Markdown(text), title=title, title_align="left", border_style=style))

    def score(self) -> float:
        return POINTS[self.ask(self.ui["score"], tuple(POINTS))]

    def entry(self, entry: dict, number: int, total: int, *, short_only: bool) -> None:
        ui, lang = self.ui, self.lang
        title = f"{ui['question']} {number} {ui['of']} {total}"
        self.console.print(Panel(Markdown(entry["question"][lang]), title=title, title_align="left",
                                 border_style="cyan"))
        if self.ask(ui["reveal"], ("", "s", "q")) == "s":
            return
        self.show(ui["short"], entry["short"][lang])
        if not short_only and self.ask(ui["more"], ("", "l")) == "l":
            self.show(ui["long"], entry["long"][lang].strip())
            self.show(ui["evidence"], bank_module.render_evidence(entry, lang), style="yellow")
        points = self.score()
        self.store.record(entry["id"], points)
        self.asked, self.points = self.asked + 1, self.points + points
        missed = points < 1.0
        for index, follow in enumerate(entry["follow_ups"]):
            self.console.print(Panel(Markdown(follow["question"][lang]),
                                     title=f"{ui['follow_up']} {index + 1}", title_align="left",
                                     border_style="magenta"))
            if self.ask(ui["follow_reveal"], ("", "s", "q")) == "s":
                break
            self.show(ui["follow_up"], follow["answer"][lang])
            follow_points = self.score()
            self.store.record_follow_up(entry["id"], index, follow_points)
            missed = missed or follow_points < 1.0
        if missed:
            self.to_retry.append(entry["id"])

    def summary(self) -> None:
        ui = self.ui
        table = Table(title=ui["summary"])
        for column in (ui["asked"], ui["points"], ui["missed"]):
            table.add_column(column)
        table.add_row(str(self.asked), f"{self.points:g}", escape(", ".join(self.to_retry) or "-"))
        self.console.print(table)
        self.console.print(escape(f"{ui['saved']} {self.store.path}"))


def run_quiz(*, lang: str = "en", section: str | None = None, short_only: bool = False,
             retry_missed: bool = False, seed: int | None = None, console: Console | None = None,
             store: ScoreStore | None = None, question_bank: bank_module.Bank | None = None) -> int:
    """Drill the bank in the terminal; returns the exit status (0)."""
    if lang not in UI:
        raise ValueError(f"lang must be one of {sorted(UI)}, got {lang!r}")
    question_bank = question_bank or bank_module.load()
    console = console or Console()
    store = store or ScoreStore.open()
    entries = question_bank.in_section(section) if section else list(question_bank.entries)
    if retry_missed:
        missed = store.missed()
        entries = [e for e in entries if e["id"] in missed]
        if not entries:
            console.print(UI[lang]["nothing"])
            return 0
    random.Random(seed).shuffle(entries)
    session = _Session(console, lang, store)
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    try:
        for number, entry in enumerate(entries, start=1):
            session.entry(entry, number, len(entries), short_only=short_only)
    except _Quit:
        console.print(UI[lang]["bye"])
    store.sessions.append({"started": started, "lang": lang, "section": section, "asked": session.asked,
                           "points": session.points, "retry_missed": retry_missed})
    store.save()
    session.summary()
    return 0
