"""The interview drill in a terminal: ``flashcourse interview quiz [--lang zh|en] [--mode answer|spot-the-error]
[--count N] [--due] [--new N] [--mock MINUTES] [--timer SECONDS] [--section S] [--tag TAG]... [--short-only]
[--retry-missed] [--seed N] [--stats]`` (``flashcourse quiz`` is the same command) and ``flashcourse interview
stats``.

As in an interview, you answer first: type your answer, or say it aloud, and press Enter, while a clock runs beside
the prompt (it counts down from ``--timer`` and says when the time is up, else it counts up). Questions come common
and basic first (:func:`flashcourse.interview.interviewer.round_order`). A typed answer that states one of the
bank's known myths or wrong answers is told so, with the correction, and scores at most "partly". Then the
30-second answer is shown beside yours, with the points a good answer makes (the entry's ``points``) and the
entry's common wrong answers, the longer answer and its evidence on request, and you tick the points you made: the
share ticked is the score. Each follow-up is asked the same way, scored got it / partly / missed, and counts in
the session's score and in the question's review box.

``--mode spot-the-error`` mixes true claims (entries' points) with false ones (their wrong answers): you judge each
true or false, correct the false ones, and the correction is shown. ``--mock 45`` is a 45-minute mock interview
(:func:`run_mock`): harder main questions after good answers, follow-ups only while the answers are good, and a
written debrief.

Scores are kept between sessions in ``$XDG_DATA_HOME/flashcourse/quiz_scores.json`` (default
``~/.local/share/flashcourse/``; files of the first format, without modes or times, are read as they are);
``--retry-missed`` asks only what was last scored "partly" or "missed"; ``--stats`` shows the results per section
and the history of sessions. ``--count N`` stops after N questions.

Spaced repetition (Leitner boxes, kept in the same score file): a question starts in box 1; scored "got it" (3/4 of
its points or more, as the mean with its follow-ups) it moves up a box, "partly" down one, "missed" back to box 1;
it is due again after :data:`BOX_DAYS` days for its box (1, 2, 4, 8, 16). ``--due`` asks the questions due today,
then new ones, at most ``--new`` (default :data:`NEW_PER_DAY`) first asked a day. ``--tag`` keeps the entries that
carry the tag (``freq:common``, ``level:basic``, ...); several tags of one kind (``freq:``) are alternatives, tags
of different kinds must all hold.

Rendering is rich's where rich is installed (the ``interview`` extra); without it, or with ``FLASHCOURSE_PLAIN=1``,
the same drill prints plain text (:mod:`._plaintext`). Either way text is wrapped by :func:`wrap`, between any two
Chinese characters and at spaces, never before closing punctuation (rich breaks lines only at spaces, which leaves
Chinese lines half empty).
"""

from __future__ import annotations

import codecs
import json
import os
import random
import re
import select
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta, timezone
from pathlib import Path

from . import bank as bank_module  # needs pyyaml: its message names the extra that installs it
from . import interviewer

try:
    if os.environ.get("FLASHCOURSE_PLAIN") == "1":
        raise ImportError("plain text asked for")
    from rich.cells import cell_len
    from rich.console import Console
    from rich.markup import escape
    from rich.panel import Panel
    from rich.table import Table
    from rich.text import Text

    PLAIN = False
except ImportError:  # rich is only in the interview extra: the drill runs in plain text without it
    from ._plaintext import Console, Panel, Table, Text, cell_len, escape

    PLAIN = True

__all__ = ["BOX_DAYS", "MODES", "PLAIN", "POINTS", "TAG_VOCABULARY", "ScoreStore", "data_dir", "evidence_labels",
           "filter_by_tags", "markdown_text", "parse_ticks", "run_quiz", "show_stats", "wrap"]

POINTS = {"g": 1.0, "p": 0.5, "m": 0.0}
# Leitner boxes 1..5: days until a question is due again, by the box it is in after its score.
BOX_DAYS = (1, 2, 4, 8, 16)
GOT_IT = 0.75  # the share of an entry's points that counts as "got it" for its box
MODES = ("answer", "spot-the-error")
TAG_VOCABULARY = tuple(getattr(bank_module, "TAGS", ("freq:common", "freq:occasional", "freq:rare", "level:basic",
                                                      "level:intermediate", "level:advanced")))
UI = {
    "en": {
           "myth_title": "Your answer states a known myth",
           "myth_line": "You said: {claim}",
           "myth_cap": "An answer that states a myth counts at most as partly right ({cap:g}).",
           "wrong_title": "Common wrong answers (do not say these)",
           "verdict_prompt": "True or false? [t] true, [f] false ([q] quit)",
           "judge": "Claim {n} of {total}: true or false?",
           "judged_true": "Right: this claim is true.", "judged_wrong_true": "No: this claim is true.",
           "judged_wrong_false": "No: this claim is false.",
           "new_today": "New today: {n} (at most {quota} new a day; --new changes it)",
           "no_new_left": "Nothing is due today and today's {quota} new questions are done; next review: {next}.",
           "claim_of": "{question} (wrong claim {n})",
           "mock_start": "Mock interview: {minutes:g} minutes. Main questions get harder after good answers; "
           "follow-ups go deeper while you answer well.",
           "mock_over": "Time is up: the interviewer thanks you.",
           "mock_question": "Question {n}", "debrief_saved": "Debrief written to {path}",
           "question": "Question {n} of {total}", "follow_up": "Follow-up {n}", "claim": "Wrong claim {n} of {total}",
           "context": "Asked about: {question}",
           "answer_prompt": "Your answer: type it, or say it aloud, then Enter ([s] skip, [q] quit)",
           "claim_prompt": "What is wrong? Correct it: type it, or say it aloud, then Enter ([s] skip, [q] quit)",
           "clock_left": "{time} left", "clock_over": "{time} over", "clock_up": "{time} elapsed",
           "time_up": "Time is up ({limit}): finish your sentence and press Enter.",
           "yours": "Your answer ({time})", "aloud": "Answered aloud in {time}.",
           "short": "30-second answer", "long": "Longer answer", "evidence": "Evidence", "correction": "Correction",
           "follow_answer": "Answer",
           "more": "[l] longer answer and evidence, [Enter] go on",
           "points_title": "A good answer makes these points",
           "tick": "Which points did you make? Their numbers (e.g. 1 3), [a] all, [Enter] none",
           "tick_again": "Please type point numbers from 1 to {n}, a, or Enter",
           "ticked": "{k} of {n} points: {score}", "due_none": "Nothing is due today. {new} questions never asked; "
           "next review: {next}.", "due_count": "Due today: {n}", "never": "none scheduled",
           "boxes": "Leitner boxes (questions per box; box 5 = known well)", "box": "box", "due": "due today",
           "score": "Score yourself: [g] got it, [p] partly, [m] missed",
           "again": "Please type one of: {choices}", "enter": "Enter", "list": ", ",
           "nothing": "Nothing to retry: no question was scored partly or missed.",
           "none_tagged": "No entry has the tags {tags}.",
           "summary": "This session", "asked": "scored", "points": "points", "percent": "score",
           "breakdown": "questions / follow-ups / wrong claims", "time": "time", "missed": "to retry",
           "saved": "Scores saved in {path}", "bye": "Stopped.",
           "stats_title": "Results per section (last score of each)", "section": "section",
           "seen": "questions seen", "questions": "questions", "follow_ups": "follow-ups", "claims": "wrong claims",
           "history": "History (latest {n} sessions)", "date": "date", "mode": "mode", "scope": "scope",
           "all": "all", "no_scores": "No scores yet: run flashcourse quiz first.",
           "retired": "(no longer in the bank)",
           "to_retry": "To retry: {n} (flashcourse quiz --retry-missed)", "old": "first format",
           "seconds": "{s} s", "minutes": "{m} min {s:02d} s",
           "paper": "{paper}, {section}", "computed": "computed by the course: {what}",
           "computed_args": "computed by the course: {what} ({args})",
           "lesson_cell": "lesson {number} ({title}), the cell “{tag}”",
           "lesson_heading": "lesson {number} ({title}), section “{heading}”",
           "results": "GPU result measured on {device}, {date} ({what}): {key}"},
    "zh": {
           "myth_title": "你的回答说了一个常见误区",
           "myth_line": "你说的是：{claim}",
           "myth_cap": "说出误区的回答最多算部分答对（{cap:g}）。",
           "wrong_title": "常见错误回答（面试时别这么说）",
           "verdict_prompt": "对还是错？t 对，f 错（q 退出）",
           "judge": "说法 {n}/{total}：对还是错？",
           "judged_true": "判断正确：这个说法是对的。", "judged_wrong_true": "判断错了：这个说法是对的。",
           "judged_wrong_false": "判断错了：这个说法是错的。",
           "new_today": "今天新学：{n} 道（每天最多 {quota} 道新题，用 --new 修改）",
           "no_new_left": "今天没有到期的题，今天的 {quota} 道新题也练完了；下次复习在 {next}。",
           "claim_of": "{question}（错误说法 {n}）",
           "mock_start": "模拟面试：{minutes:g} 分钟。答得好，下一道主问题更难；答得好，追问也会继续深挖。",
           "mock_over": "时间到，面试结束。",
           "mock_question": "问题 {n}", "debrief_saved": "复盘已写入 {path}",
           "question": "问题 {n}/{total}", "follow_up": "追问 {n}", "claim": "错误说法 {n}/{total}",
           "context": "原题：{question}",
           "answer_prompt": "你的回答：打字或说出来，然后按回车（s 跳过，q 退出）",
           "claim_prompt": "错在哪里？请纠正：打字或说出来，然后按回车（s 跳过，q 退出）",
           "clock_left": "剩余 {time}", "clock_over": "超时 {time}", "clock_up": "用时 {time}",
           "time_up": "时间到（{limit}）：说完这句，然后按回车。",
           "yours": "你的回答（{time}）", "aloud": "口头回答，用时 {time}。",
           "short": "30 秒回答", "long": "详细回答", "evidence": "证据", "correction": "纠正",
           "follow_answer": "答案",
           "more": "l 看详细回答和证据，回车继续",
           "points_title": "好的回答要讲到这几点",
           "tick": "你讲到了哪几点？输入编号（如 1 3），a 全部，回车表示都没讲到",
           "tick_again": "请输入 1 到 {n} 的编号、a 或回车",
           "ticked": "讲到 {k}/{n} 点：{score}", "due_none": "今天没有到期的题。还有 {new} 道题从没练过，"
           "下次复习在 {next}。", "due_count": "今天到期：{n} 道", "never": "没有安排",
           "boxes": "Leitner 盒子（每个盒子的题数；5 号盒 = 已经很熟）", "box": "盒子", "due": "今天到期",
           "score": "给自己打分：g 答对了，p 部分答对，m 没答出",
           "again": "请输入其中之一：{choices}", "enter": "回车", "list": "、",
           "nothing": "没有需要重做的题：没有题目被评为“部分答对”或“没答出”。",
           "none_tagged": "没有带标签 {tags} 的题目。",
           "summary": "本次练习", "asked": "已评分", "points": "得分", "percent": "得分率",
           "breakdown": "问题/追问/错误说法", "time": "用时", "missed": "待重做",
           "saved": "得分保存在 {path}", "bye": "已退出。",
           "stats_title": "各部分成绩（每题最近一次得分）", "section": "部分",
           "seen": "已练问题", "questions": "问题", "follow_ups": "追问", "claims": "错误说法",
           "history": "练习记录（最近 {n} 次）", "date": "日期", "mode": "模式", "scope": "范围",
           "all": "全部", "no_scores": "还没有得分：先运行 flashcourse quiz。", "retired": "（已不在题库中）",
           "to_retry": "待重做：{n} 题（flashcourse quiz --retry-missed）", "old": "旧格式",
           "seconds": "{s} 秒", "minutes": "{m} 分 {s:02d} 秒",
           "paper": "{paper}，{section}", "computed": "本课程代码算出：{what}",
           "computed_args": "本课程代码算出：{what}（{args}）",
           "lesson_cell": "第 {number} 课（{title}）的代码单元格“{tag}”",
           "lesson_heading": "第 {number} 课（{title}）的小节“{heading}”",
           "results": "GPU 实测结果（{device}，{date}，{what} 基准）"},
}
MODE_NAMES = {"en": {"answer": "answer", "spot-the-error": "spot the error"},
              "zh": {"answer": "答题", "spot-the-error": "找错"}}


def data_dir() -> Path:
    """Where scores are kept: ``$XDG_DATA_HOME/flashcourse``, or ``~/.local/share/flashcourse``."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "flashcourse"


def duration(seconds: float, lang: str = "en") -> str:
    """"42 s" or "1 min 05 s" ("42 秒", "1 分 05 秒")."""
    seconds = int(round(seconds))
    ui = UI[lang]
    if seconds < 60:
        return ui["seconds"].format(s=seconds)
    return ui["minutes"].format(m=seconds // 60, s=seconds % 60)


# ------------------------------------------------------------------------------------------- scores
@dataclass
class ScoreStore:
    """Scores between sessions: per entry, how often asked, the last and best score, the last scores of its
    follow-ups and of its wrong claims (spot the error), the last time taken; and one record per session.
    Saved as JSON, written whole to a temporary file and renamed. Files of the first format (no modes, no times,
    no wrong claims) are read as they are and rewritten in this one."""

    path: Path
    entries: dict = field(default_factory=dict)
    sessions: list = field(default_factory=list)

    @classmethod
    def open(cls, path: Path | None = None) -> ScoreStore:
        path = path or data_dir() / "quiz_scores.json"
        if path.exists():
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
                return cls(path, dict(data.get("entries", {})), list(data.get("sessions", [])))
            except (json.JSONDecodeError, AttributeError, TypeError, ValueError):
                path.rename(path.with_suffix(".corrupt.json"))  # keep it for the learner, start afresh
        return cls(path)

    def _item(self, entry_id: str) -> dict:
        item = self.entries.setdefault(entry_id, {"asked": 0, "best": 0.0, "follow_ups": {}})
        item.setdefault("follow_ups", {})
        return item

    def record(self, entry_id: str, points: float, seconds: float | None = None, *, today: date | None = None,
               follow_ups: list[float] | tuple[float, ...] = ()) -> None:
        """A question's score (0 to 1) and those of the follow-ups answered after it; the mean of all of them
        moves the question between Leitner boxes (a missed follow-up keeps a question from moving up, as it
        would in an interview) and sets when it is due again (``today``, default the local date, counts from)."""
        today = today or date.today()
        item = self._item(entry_id)
        if not item.get("asked"):  # the day it was first asked, for the daily quota of new ones
            item["first"] = today.isoformat()
        item["asked"] = item.get("asked", 0) + 1
        item["last"] = points
        item["best"] = max(item.get("best", 0.0), points)
        if seconds is not None:
            item["seconds"] = round(seconds, 1)
        for index, follow_points in enumerate(follow_ups):
            item["follow_ups"][str(index)] = follow_points
        points = (points + sum(follow_ups)) / (1 + len(follow_ups))
        box = item.get("box", 1)  # a question never scheduled (new, or from an older score file) is in box 1
        if points >= GOT_IT:
            box = min(box + 1, len(BOX_DAYS))
        elif points > 0:
            box = max(box - 1, 1)
        else:
            box = 1
        item["box"] = box
        item["due"] = (today + timedelta(days=BOX_DAYS[box - 1])).isoformat()

    def new_on(self, day: date) -> int:
        """How many questions were asked for the first time on ``day``."""
        return sum(item.get("first") == day.isoformat() for item in self.entries.values())

    def due(self, today: date | None = None) -> set[str]:
        """Questions whose review date has come (scheduled on an earlier day, due on or before ``today``)."""
        today_text = (today or date.today()).isoformat()
        return {entry_id for entry_id, item in self.entries.items() if item.get("due", "9999") <= today_text}

    def next_due(self) -> str | None:
        """The earliest review date scheduled, or None."""
        dates = [item["due"] for item in self.entries.values() if "due" in item]
        return min(dates) if dates else None

    def boxes(self) -> dict[int, int]:
        """How many questions each Leitner box holds (1 to 5)."""
        counts = dict.fromkeys(range(1, len(BOX_DAYS) + 1), 0)
        for item in self.entries.values():
            if item.get("box"):
                counts[item["box"]] += 1
        return counts

    def record_claim(self, entry_id: str, index: int, points: float) -> None:
        self._item(entry_id).setdefault("wrong_answers", {})[str(index)] = points

    def record_true_claim(self, entry_id: str, index: int, points: float) -> None:
        """A verdict on one of the entry's points shown as a claim to judge (spot the error): 1 when judged true."""
        self._item(entry_id).setdefault("true_claims", {})[str(index)] = points

    def missed(self) -> set[str]:
        """Entries whose last score, or the last score of one of their follow-ups, was below "got it"."""
        return {entry_id for entry_id, item in self.entries.items()
                if item.get("last", 1.0) < 1.0 or any(p < 1.0 for p in item.get("follow_ups", {}).values())}

    def missed_claims(self) -> set[tuple[str, int]]:
        """(entry id, index) of the wrong claims last scored below "got it" in spot-the-error mode."""
        return {(entry_id, int(index)) for entry_id, item in self.entries.items()
                for index, points in item.get("wrong_answers", {}).items() if points < 1.0}

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        data = {"version": 2, "entries": self.entries, "sessions": self.sessions}
        with tempfile.NamedTemporaryFile("w", dir=self.path.parent, delete=False, encoding="utf-8",
                                         suffix=".tmp") as handle:
            json.dump(data, handle, ensure_ascii=False, indent=1)
        Path(handle.name).replace(self.path)


# ------------------------------------------------------------------------------------------- text
_CJK_CHAR = re.compile(r"[\u2e80-\u9fff\uac00-\ud7af\uf900-\ufaff\uff00-\uffef\u3000-\u303f]")
_NO_LINE_START = set("，。：；！？、）》」』”’,.:;!?)]}%") | {"\u3001", "\u3002"}
_NO_LINE_END = set("（《「『“‘([{")


def _break_points(plain: str) -> list[int]:
    """Offsets where a line may break: after a space, and between two characters when either is Chinese
    (never before closing punctuation, never after opening punctuation)."""
    points = []
    for i in range(1, len(plain)):
        before, after = plain[i - 1], plain[i]
        if after in _NO_LINE_START or before in _NO_LINE_END:
            continue
        if before == " " and after != " ":
            points.append(i)
        elif after != " " and before != " " and (_CJK_CHAR.match(before) or _CJK_CHAR.match(after)):
            points.append(i)
    return points


def wrap(text: Text | str, width: int) -> Text:
    """``text`` wrapped to ``width`` terminal cells, breaking at spaces and between Chinese characters (rich
    breaks only at spaces); styles are kept, existing line breaks too. A word wider than the line is cut."""
    text = Text(text) if isinstance(text, str) else text
    width = max(width, 4)
    lines_out: list[Text] = []
    for line in text.split("\n", allow_blank=True):
        plain = line.plain
        if plain.startswith("• ") and width > 8:  # a list item: later lines hang under its first word
            body = wrap(line[2:], width - 2).split("\n", allow_blank=True)
            lines_out += [(line[:2] if i == 0 else Text("  ")) + piece for i, piece in enumerate(body)]
            continue
        candidates = [*_break_points(plain), len(plain)]
        cuts, start = [], 0
        while cell_len(plain[start:].rstrip()) > width:
            fit = None
            for point in candidates:
                if point > start and cell_len(plain[start:point].rstrip()) <= width:
                    fit = point
                elif point > start:
                    break
            if fit is None:  # one word wider than the line: cut it at the width
                fit, cells = start, 0
                while cells + cell_len(plain[fit]) <= width:
                    cells += cell_len(plain[fit])
                    fit += 1
                fit = max(fit, start + 1)
            cuts.append(fit)
            start = fit
        for piece in line.divide(cuts):
            piece.rstrip()
            lines_out.append(piece)
    return Text("\n").join(lines_out)


_INLINE = re.compile(r"(`[^`]+`|\*\*[^*]+\*\*|<strong>.*?</strong>|(?<![*\w])\*(?!\s)[^*]+?(?<!\s)\*(?![*\w])"
                     r"|\[[^\]]+\]\([^)\s]+\)|\$[^$]+\$)")


def _inline(line: str) -> Text:
    out = Text()
    for part in _INLINE.split(line):
        if not part:
            continue
        if part.startswith("`") and part.endswith("`") and len(part) > 1:
            out.append(part[1:-1], style="bold cyan")
        elif part.startswith("**") and part.endswith("**") and len(part) > 4:
            out.append(part[2:-2], style="bold")
        elif part.startswith("<strong>"):
            out.append(part[len("<strong>"):-len("</strong>")], style="bold")
        elif part.startswith("*") and part.endswith("*") and len(part) > 2:
            out.append(part[1:-1], style="italic")
        elif part.startswith("[") and "](" in part:
            out.append(part[1:part.index("](")], style="underline")
        elif part.startswith("$") and part.endswith("$") and len(part) > 2:
            out.append(part[1:-1], style="italic")
        else:
            out.append(part)
    return out


def markdown_text(source: str) -> Text:
    """The bank's small Markdown (paragraphs, ``- `` lists, `code`, **bold**, *italic*, links, $math$) as a rich
    Text, paragraphs separated by a blank line, list items as "• ..." lines."""
    blocks = []
    for block in re.split(r"\n\s*\n", source.strip()):
        lines = [line.strip() for line in block.splitlines() if line.strip()]
        if lines and all(line.startswith("- ") for line in lines):
            blocks.append(Text("\n").join(Text("• ") + _inline(line[2:]) for line in lines))
        elif lines:
            joined = lines[0]
            for line in lines[1:]:  # a folded line: no space between two Chinese characters
                gap = "" if _CJK_CHAR.match(joined[-1]) and _CJK_CHAR.match(line[0]) else " "
                joined += gap + line
            blocks.append(_inline(joined))
    return Text("\n\n").join(blocks)


# ------------------------------------------------------------------------------------------- evidence
_LESSON = re.compile(r"(\d\d)_(.+?)(?:_zh)?\.ipynb$")
_DEVICES = ("nvidia-h200", "nvidia-h100", "nvidia-a100", "nvidia-l4", "nvidia-a10", "nvidia-t4")


def _lesson(notebook: str) -> tuple[str, str]:
    match = _LESSON.search(Path(notebook).name)
    if not match:
        return "?", Path(notebook).stem
    return match[1], match[2].replace("_", " ")


def _results(path: str) -> tuple[str, str, str]:
    name = Path(path).name
    date = name[:10] if re.match(r"\d{4}-\d\d-\d\d", name) else "?"
    rest = name[11:].removesuffix(".json")
    device = next((d for d in _DEVICES if rest.startswith(d)), rest.split("-")[0])
    what = re.sub(r"-(run\d+|rerun)$", "", rest[len(device):].strip("-") or rest)  # earlier runs of the day
    return device.replace("nvidia-", "").upper(), date, what


def evidence_labels(entry: dict, lang: str = "en") -> list[str]:
    """Each evidence item of an entry as a line for people: which lesson, paper or GPU run holds the number, and
    the number quoted; no Python paths (a computation is named by what it computes)."""
    ui, labels = UI[lang], []
    for item in entry.get("evidence", []):
        if "notebook" in item:
            number, title = _lesson(item["notebook"])
            if "heading" in item:
                label = ui["lesson_heading"].format(number=number, title=title, heading=item["heading"])
            else:
                label = ui["lesson_cell"].format(number=number, title=title, tag=item.get("cell_tag", ""))
        elif "results" in item:
            device, date, what = _results(item["results"])
            label = ui["results"].format(device=device, date=date, what=what, key=item.get("key", ""))
        elif "compute" in item:
            what = item["compute"].replace("_", " ")
            args = (item.get("args") or {})
            joiner = ", " if lang == "en" else "，"
            label = (ui["computed_args"].format(what=what, args=joiner.join(f"{k} = {v}" for k, v in args.items()))
                     if args else ui["computed"].format(what=what))
        elif "paper" in item:
            label = ui["paper"].format(paper=item["paper"], section=item.get("section", ""))
        else:
            continue
        quote = item.get("quote", item.get("value") if "paper" in item else None)
        if quote is not None:
            full_width = lang == "zh" and label[-1] in "，。：；！？、）”"
            label += f"→ {quote}" if full_width else f" → {quote}"
        labels.append(label)
    return labels


# ------------------------------------------------------------------------------------------- tags
def filter_by_tags(entries: list[dict], tags: list[str] | tuple[str, ...]) -> list[dict]:
    """The entries that carry the tags: of several tags of one kind (``freq:common``, ``freq:rare``) any one,
    and one of each kind asked for. An entry without a ``tags`` list carries none."""
    kinds: dict[str, set[str]] = {}
    for tag in tags:
        kinds.setdefault(tag.split(":")[0], set()).add(tag)
    return [e for e in entries if all(set(e.get("tags", []) or []) & wanted for wanted in kinds.values())]


# ------------------------------------------------------------------------------------------- input
class _Quit(Exception):
    """The learner typed q, or the input ended."""


def _clock(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 60}:{seconds % 60:02d}"


class _Clock:
    """Elapsed time, and the limit if there is one: what the prompt's clock shows."""

    def __init__(self, limit: float | None, lang: str):
        self.limit, self.ui, self.start = limit, UI[lang], time.monotonic()

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.start

    @property
    def up(self) -> bool:
        return self.limit is not None and self.elapsed >= self.limit

    def label(self) -> str:
        elapsed = self.elapsed
        if self.limit is None:
            return self.ui["clock_up"].format(time=_clock(elapsed))
        if elapsed < self.limit:
            return self.ui["clock_left"].format(time=_clock(self.limit - elapsed + 0.999))
        return self.ui["clock_over"].format(time=_clock(elapsed - self.limit))


def parse_ticks(typed: str, count: int) -> set[int] | None:
    """The points ticked (0-based) from what was typed: "1 3" or "1,3", "a" for all, "" for none; None when it
    is not that (a number out of 1..count, a word)."""
    typed = typed.strip().lower()
    if typed == "a":
        return set(range(count))
    ticks = set()
    for part in re.split(r"[\s,，、]+", typed):
        if not part:
            continue
        if not part.isdigit() or not 1 <= int(part) <= count:
            return None
        ticks.add(int(part) - 1)
    return ticks


class _Session:
    def __init__(self, console: Console, lang: str, store: ScoreStore, question_bank, *, timer: float | None,
                 short_only: bool, today: date | None = None):
        self.console, self.lang, self.store, self.ui = console, lang, store, UI[lang]
        self.bank, self.timer, self.short_only, self.today = question_bank, timer, short_only, today
        self.asked = {"questions": 0, "follow_ups": 0, "claims": 0}
        self.points = 0.0
        self.seconds = 0.0
        self.by_section: dict[str, dict] = {}
        self.to_retry: list[str] = []  # the questions to retry, by their text
        self.myths_stated = 0

    # ------------------------------------------------------------------ output
    @property
    def width(self) -> int:
        return max(self.console.width, 20)

    def show(self, title: str, body: Text | str, style: str = "green") -> None:
        """A panel whose text is wrapped here (see :func:`wrap`), so that rich does not re-wrap it."""
        body = markdown_text(body) if isinstance(body, str) else body
        self.console.print(Panel(wrap(body, self.width - 4), title=escape(title), title_align="left",
                                 border_style=style))

    def say(self, line: str, style: str | None = None) -> None:
        self.console.print(wrap(Text(line, style=style or ""), self.width))

    # ------------------------------------------------------------------ input
    def ask(self, prompt: str, choices: tuple[str, ...]) -> str:
        """One line of input, lower-cased, until it is one of ``choices`` ("" is Enter); q quits."""
        ui = self.ui
        while True:
            self.say(prompt, style="bold cyan")
            try:
                answer = self.console.input("> ").strip().lower()
            except (EOFError, KeyboardInterrupt):
                raise _Quit from None
            if not sys.stdin.isatty():  # piped input is not echoed: end the prompt's line
                self.console.print()
            if answer == "q":  # q quits at every prompt
                raise _Quit
            if answer in choices:
                return answer
            shown = ui["list"].join(c or ui["enter"] for c in choices)
            self.say(ui["again"].format(choices=shown))

    def answer(self, prompt: str) -> tuple[str | None, float]:
        """The learner's answer (typed, or "" when said aloud) and the seconds it took, with a clock running
        beside the prompt; None when skipped. A terminal gets a live clock; a pipe gets the clock at the start."""
        self.say(prompt, style="bold cyan")
        clock = _Clock(self.timer, self.lang)
        if sys.stdin.isatty() and sys.stdout.isatty():
            typed = self._live_line(clock)
        else:
            self.console.print(f"[{clock.label()}] > ", end="")
            try:
                typed = input()
            except (EOFError, KeyboardInterrupt):
                raise _Quit from None
            if not sys.stdin.isatty():
                self.console.print()
            if clock.up:
                self.say(self.ui["time_up"].format(limit=duration(self.timer, self.lang)), style="bold red")
        typed = typed.strip()
        if typed.lower() == "q":
            raise _Quit
        if typed.lower() == "s":
            return None, clock.elapsed
        return typed, clock.elapsed

    def _live_line(self, clock: _Clock) -> str:
        """Read one line in cbreak mode, redrawing "[clock] > typed" every tick; says once when time is up."""
        import termios
        import tty

        fd = sys.stdin.fileno()
        saved = termios.tcgetattr(fd)
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        typed, escape_seq, warned, shown = "", False, False, None
        out = sys.stdout

        def draw(force: bool = False) -> None:
            nonlocal shown
            status = f"[{clock.label()}] > "
            room = max(self.width - cell_len(status) - 1, 8)
            tail = typed
            while cell_len(tail) > room:
                tail = tail[1:]
            line = status + tail
            if force or line != shown:
                out.write("\r" + line + "\x1b[K")
                out.flush()
                shown = line

        try:
            tty.setcbreak(fd)
            draw(force=True)
            while True:
                if clock.up and not warned:
                    warned = True
                    out.write("\r\x1b[K")
                    out.flush()
                    self.say(self.ui["time_up"].format(limit=duration(self.timer, self.lang)), style="bold red")
                    draw(force=True)
                ready, _, _ = select.select([fd], [], [], 0.2)
                if not ready:
                    draw()
                    continue
                chunk = os.read(fd, 256)
                if not chunk:
                    raise _Quit
                for char in decoder.decode(chunk):
                    if escape_seq:  # the rest of an arrow key's sequence: ignored
                        escape_seq = not (char.isalpha() or char == "~")
                    elif char == "\x1b":
                        escape_seq = True
                    elif char in "\r\n":
                        out.write("\n")
                        out.flush()
                        return typed
                    elif char in "\x7f\x08":
                        typed = typed[:-1]
                    elif char == "\x15":  # Ctrl-U
                        typed = ""
                    elif char in "\x04\x03":  # Ctrl-D, Ctrl-C
                        out.write("\n")
                        raise _Quit
                    elif char.isprintable():
                        typed += char
                draw()
        finally:
            termios.tcsetattr(fd, termios.TCSADRAIN, saved)

    def score(self) -> float:
        return POINTS[self.ask(self.ui["score"], tuple(POINTS))]

    def tick(self, points: list[dict]) -> float:
        """Ask which of the entry's points the answer made; the share ticked, rounded to a hundredth."""
        ui = self.ui
        while True:
            self.say(ui["tick"], style="bold cyan")
            try:
                typed = self.console.input("> ")
            except (EOFError, KeyboardInterrupt):
                raise _Quit from None
            if not sys.stdin.isatty():
                self.console.print()
            if typed.strip().lower() == "q":
                raise _Quit
            ticks = parse_ticks(typed, len(points))
            if ticks is not None:
                break
            self.say(ui["tick_again"].format(n=len(points)))
        score = round(len(ticks) / len(points), 2)
        self.say(ui["ticked"].format(k=len(ticks), n=len(points), score=f"{score:g}"), style="blue")
        return score

    def show_points(self, points: list[dict]) -> None:
        body = Text("\n").join(Text(f"{i + 1}. ") + _inline(p[self.lang]) for i, p in enumerate(points))
        self.show(self.ui["points_title"], body, style="yellow")

    # ------------------------------------------------------------------ one item
    def _count(self, entry: dict, kind: str, points: float, seconds: float) -> None:
        self.asked[kind] += 1
        self.points += points
        self.seconds += seconds
        section = self.by_section.setdefault(entry["section"], {"asked": 0, "points": 0.0})
        section["asked"] += 1
        section["points"] += points

    def _reveal_yours(self, typed: str, seconds: float) -> None:
        took = duration(seconds, self.lang)
        if typed:
            self.show(self.ui["yours"].format(time=took), Text(typed), style="blue")
        else:
            self.say(self.ui["aloud"].format(time=took), style="blue")

    def name_myths(self, typed: str) -> bool:
        """Name every known myth or wrong answer the typed answer states, with its correction; True if any."""
        found = interviewer.spot_myths(typed or "", self.bank)
        for myth in found:
            body = Text(self.ui["myth_line"].format(claim=""), style="bold") + markdown_text(myth.claim[self.lang])
            body.append("\n\n")
            body.append_text(markdown_text(myth.correction[self.lang]))
            self.show(self.ui["myth_title"], body, style="red")
        return bool(found)

    def show_wrong_answers(self, entry: dict) -> None:
        wrong = entry.get("wrong_answers") or []
        if wrong:
            body = Text("\n").join(Text("• ") + _inline(w["claim"][self.lang]) + Text(" → ", style="dim")
                                   + _inline(w["correction"][self.lang]) for w in wrong)
            self.show(self.ui["wrong_title"], body, style="red")

    def entry(self, entry: dict, number: int, total: int | None, *, adaptive: bool = False) -> float | None:
        """Ask one question and its follow-ups; returns the mean score of what was answered (None if skipped).
        ``adaptive`` (the mock interview) asks the next follow-up only while the answers are good, as an
        interviewer digs deeper into what a candidate knows; ``total`` is None there (the clock decides)."""
        ui, lang = self.ui, self.lang
        title = ui["mock_question"].format(n=number) if total is None else ui["question"].format(n=number, total=total)
        self.show(title, entry["question"][lang], style="cyan")
        typed, seconds = self.answer(ui["answer_prompt"])
        if typed is None:
            return None
        self._reveal_yours(typed, seconds)
        stated_myth = self.name_myths(typed)
        self.show(ui["short"], entry["short"][lang])
        checklist = entry.get("points") or []
        if checklist:
            self.show_points(checklist)
        self.show_wrong_answers(entry)
        if not self.short_only and self.ask(ui["more"], ("", "l")) == "l":
            self.show(ui["long"], entry["long"][lang].strip())
            self.show(ui["evidence"], Text("\n").join(Text("• " + line) for line in evidence_labels(entry, lang)),
                      style="yellow")
        points = self.tick(checklist) if checklist else self.score()
        if stated_myth and points > interviewer.MYTH_CAP:
            points = interviewer.MYTH_CAP
            self.say(ui["myth_cap"].format(cap=points), style="red")
        self._count(entry, "questions", points, seconds)
        self.myths_stated += stated_myth
        follow_scores: list[float] = []
        try:
            for index, follow in enumerate(entry.get("follow_ups", [])):
                if adaptive and min([points, *follow_scores]) < GOT_IT:
                    break
                self.show(ui["follow_up"].format(n=index + 1), follow["question"][lang], style="magenta")
                typed, seconds = self.answer(ui["answer_prompt"])
                if typed is None:
                    break
                self._reveal_yours(typed, seconds)
                self.myths_stated += self.name_myths(typed)
                self.show(ui["follow_answer"], follow["answer"][lang])
                follow_points = self.score()
                follow_scores.append(follow_points)
                self._count(entry, "follow_ups", follow_points, seconds)
        finally:  # scheduled even when the learner quits during a follow-up: what was answered counts
            self.store.record(entry["id"], points, seconds, today=self.today, follow_ups=follow_scores)
            if min([points, *follow_scores]) < 1.0:
                self.to_retry.append(entry["question"][lang])
        return (points + sum(follow_scores)) / (1 + len(follow_scores))

    def claim(self, entry: dict, index: int, number: int, total: int) -> None:
        ui, lang = self.ui, self.lang
        wrong = entry["wrong_answers"][index]
        body = Text(ui["context"].format(question=""), style="dim") + markdown_text(entry["question"][lang])
        body.append("\n\n")
        body.append_text(markdown_text(wrong["claim"][lang]))
        self.show(ui["claim"].format(n=number, total=total), body, style="red")
        typed, seconds = self.answer(ui["claim_prompt"])
        if typed is None:
            return
        self._reveal_yours(typed, seconds)
        self.show(ui["correction"], wrong["correction"][lang])
        points = self.score()
        self.store.record_claim(entry["id"], index, points)
        self._count(entry, "claims", points, seconds)
        if points < 1.0:
            self.to_retry.append(ui["claim_of"].format(question=entry["question"][lang], n=index + 1))

    def judge(self, entry: dict, is_true: bool, index: int, number: int, total: int) -> None:
        """A claim to judge true or false: one of the entry's points (true) or one of its wrong answers (false).
        A true claim judged true scores 1; a false one judged false is then corrected and scored like
        :meth:`claim`; a wrong verdict scores 0."""
        ui, lang = self.ui, self.lang
        claim = entry["points"][index] if is_true else entry["wrong_answers"][index]["claim"]
        body = Text(ui["context"].format(question=""), style="dim") + markdown_text(entry["question"][lang])
        body.append("\n\n")
        body.append_text(markdown_text(claim[lang]))
        self.show(ui["judge"].format(n=number, total=total), body, style="red")
        verdict = self.ask(ui["verdict_prompt"], ("t", "f")) == "t"
        if verdict != is_true:
            self.say(ui["judged_wrong_true" if is_true else "judged_wrong_false"], style="bold red")
        if is_true:
            points = float(verdict)
            if verdict:
                self.say(ui["judged_true"], style="green")
            self.store.record_true_claim(entry["id"], index, points)
            self._count(entry, "claims", points, 0.0)
            if not verdict:
                self.to_retry.append(entry["question"][lang])
            return
        if not verdict:
            typed, seconds = self.answer(ui["claim_prompt"])
            if typed is None:
                return
            self._reveal_yours(typed, seconds)
        self.show(ui["correction"], entry["wrong_answers"][index]["correction"][lang])
        points = self.score() if not verdict else 0.0
        self.store.record_claim(entry["id"], index, points)
        self._count(entry, "claims", points, 0.0)
        if points < 1.0:
            self.to_retry.append(ui["claim_of"].format(question=entry["question"][lang], n=index + 1))

    # ------------------------------------------------------------------ the end
    @property
    def scored(self) -> int:
        return sum(self.asked.values())

    def summary(self) -> None:
        ui = self.ui
        table = Table(title=ui["summary"])
        for column in (ui["asked"], ui["breakdown"], ui["points"], ui["percent"], ui["time"]):
            table.add_column(column)
        percent = f"{100 * self.points / self.scored:.0f}%" if self.scored else "-"
        breakdown = "/".join(str(self.asked[k]) for k in ("questions", "follow_ups", "claims"))
        table.add_row(str(self.scored), breakdown, f"{self.points:g}", percent, duration(self.seconds, self.lang))
        self.console.print(table)
        if self.to_retry:  # by their text: an id means nothing to the learner
            self.say(ui["missed"] + (":" if self.lang == "en" else "："))
            self.console.print(wrap(Text("\n").join(Text("• ") + _inline(q) for q in self.to_retry), self.width))
        self.say(ui["saved"].format(path=self.store.path))


# ------------------------------------------------------------------------------------------- statistics
def show_stats(*, lang: str = "en", console: Console | None = None, store: ScoreStore | None = None,
               question_bank: bank_module.Bank | None = None, history: int = 10, today: date | None = None) -> int:
    """Per section: questions seen of those in the bank, the mean last score of questions, follow-ups and wrong
    claims; then the latest sessions; then the Leitner boxes and what is due today. Returns the exit status (0)."""
    ui = UI[lang]
    question_bank = question_bank or bank_module.load()
    console = console or Console()
    store = store or ScoreStore.open()
    if not store.entries and not store.sessions:
        console.print(ui["no_scores"])
        return 0
    section_of = {e["id"]: e["section"] for e in question_bank.entries}
    rows: dict[str, dict] = {s: {"seen": 0, "q": [], "f": [], "c": []} for s in question_bank.sections}
    retired = {"seen": 0, "q": [], "f": [], "c": []}
    for entry_id, item in store.entries.items():
        row = rows.get(section_of.get(entry_id), retired)
        if "last" in item:
            row["seen"] += 1
            row["q"].append(item["last"])
        row["f"] += list(item.get("follow_ups", {}).values())
        row["c"] += list(item.get("wrong_answers", {}).values())

    def mean(values: list[float]) -> str:
        return f"{100 * sum(values) / len(values):.0f}% ({len(values)})" if values else "-"

    table = Table(title=ui["stats_title"])
    for column in (ui["section"], ui["seen"], ui["questions"], ui["follow_ups"], ui["claims"]):
        table.add_column(column)
    for section, title in question_bank.sections.items():
        row = rows[section]
        total = len(question_bank.in_section(section))
        table.add_row(escape(title[lang]), f"{row['seen']}/{total}", mean(row["q"]), mean(row["f"]), mean(row["c"]))
    if retired["seen"] or retired["f"] or retired["c"]:
        table.add_row(ui["retired"], str(retired["seen"]), mean(retired["q"]), mean(retired["f"]),
                      mean(retired["c"]))
    console.print(table)

    recent = store.sessions[-history:]
    table = Table(title=ui["history"].format(n=len(recent)))
    for column in (ui["date"], ui["mode"], ui["scope"], ui["asked"], ui["points"], ui["percent"], ui["time"]):
        table.add_column(column)
    for session in recent:
        scope = [question_bank.sections.get(session["section"], {}).get(lang, session["section"])
                 ] if session.get("section") else []
        scope += session.get("tags") or []
        asked = session.get("asked", 0)
        asked = sum(asked.values()) if isinstance(asked, dict) else asked
        points = session.get("points", 0.0)
        mode = MODE_NAMES[lang].get(session.get("mode", "answer"), session.get("mode", "?"))
        if "version" not in session:
            mode += f" ({ui['old']})" if lang == "en" else f"（{ui['old']}）"
        table.add_row(str(session.get("started", "?"))[:16].replace("T", " "), mode,
                      escape(ui["list"].join(scope) or ui["all"]), str(asked), f"{points:g}",
                      f"{100 * points / asked:.0f}%" if asked else "-",
                      duration(session["seconds"], lang) if "seconds" in session else "-")
    console.print(table)
    boxes = store.boxes()
    if any(boxes.values()):
        table = Table(title=ui["boxes"])
        for box in boxes:
            table.add_column(f"{ui['box']} {box}")
        table.add_column(ui["due"])
        table.add_row(*(str(n) for n in boxes.values()), str(len(store.due(today) & set(section_of))))
        console.print(table)
    missed = len(store.missed()) + len(store.missed_claims())
    if missed:
        console.print(ui["to_retry"].format(n=missed))
    return 0


# ------------------------------------------------------------------------------------------- the drill
NEW_PER_DAY = 10  # new questions a --due session adds a day: a pace one can keep, as Anki's default is 20 cards
LEVELS = 4  # the highest interviewer.ease (rare and advanced)
DEBRIEF = {
    "en": {"title": "# Mock interview debrief, {started}",
           "summary": "{minutes} of {limit:g} minutes; {questions} main questions, {follow_ups} follow-ups "
                      "answered; mean score {percent}. Deepest level reached: {level} of {levels} (0 = common "
                      "and basic, {levels} = rare and advanced).",
           "table": "| # | question | score | follow-ups answered | time |", "myths": "## Myths you stated",
           "myths_none": "You stated none of the myths the bank knows.",
           "strong": "## Strongest sections (mean 75% or more)", "review": "## To review (below 75%)",
           "none": "(none)", "verdict": "## Verdict (the drill's own rule: mean score and myths stated)",
           "hire": "Strong: the answers were complete and myth-free; push on to rarer questions.",
           "lean": "Borderline: review the list above, then run another mock round.",
           "no": "Not yet: drill the common, basic questions (flashcourse quiz --due) before the next round.",
           "skipped": "skipped"},
    "zh": {"title": "# 模拟面试复盘，{started}",
           "summary": "用时 {minutes}（共 {limit:g} 分钟）；主问题 {questions} 道，答了 {follow_ups} 个追问；平均得分 "
                      "{percent}。最深到第 {level} 级（共 {levels} 级，0 = 常见、基础，{levels} = 少见、深入）。",
           "table": "| # | 问题 | 得分 | 答了几个追问 | 用时 |", "myths": "## 你说出的误区",
           "myths_none": "没有说出题库里记录的误区。",
           "strong": "## 最强的部分（平均 75% 及以上）", "review": "## 需要复习（低于 75%）",
           "none": "（无）", "verdict": "## 结论（按本工具的规则：平均得分和说出的误区）",
           "hire": "表现很好：回答完整，没有误区，可以练更少见的问题。",
           "lean": "处在边缘：先复习上面的列表，再来一轮模拟面试。",
           "no": "还不够：先把常见、基础的题练熟（flashcourse quiz --due），再来下一轮。",
           "skipped": "跳过"},
}


def _pick(entries: list[dict], store: ScoreStore, *, due: bool, retry_missed: bool, new_per_day: int,
          today: date, rng: random.Random, console: Console, ui: dict) -> list[dict] | None:
    """The questions of an answer-mode session in the order asked, common and basic first; None (after saying
    why) when there is nothing to ask. ``due`` asks what is due today, then new questions up to the day's quota."""
    items = entries
    if retry_missed:
        missed = store.missed()
        items = [e for e in entries if e["id"] in missed]
        if not items:
            console.print(ui["nothing"])
            return None
    if not due:
        return interviewer.round_order(items, rng)
    due_now = store.due(today)
    due_items = interviewer.round_order([e for e in items if e["id"] in due_now], rng)
    never = [e for e in items if "last" not in store.entries.get(e["id"], {})]
    quota_left = max(new_per_day - store.new_on(today), 0)
    new_items = interviewer.round_order(never, rng)[:quota_left]
    if not due_items and not new_items:
        if never:
            console.print(ui["no_new_left"].format(quota=new_per_day, next=store.next_due() or ui["never"]))
        else:
            console.print(ui["due_none"].format(new=0, next=store.next_due() or ui["never"]))
        return None
    console.print(ui["due_count"].format(n=len(due_items)))
    if new_items:
        console.print(ui["new_today"].format(n=len(new_items), quota=new_per_day))
    return due_items + new_items


def run_quiz(*, lang: str = "en", mode: str = "answer", section: str | None = None, tags: list[str] | None = None,
             short_only: bool = False, retry_missed: bool = False, seed: int | None = None,
             timer: float | None = None, count: int | None = None, due: bool = False,
             new_per_day: int = NEW_PER_DAY, mock: float | None = None, today: date | None = None,
             console: Console | None = None, store: ScoreStore | None = None,
             question_bank: bank_module.Bank | None = None) -> int:
    """Drill the bank in the terminal; returns the exit status (0). Questions come common and basic first.
    ``count`` stops after that many questions (claims in spot-the-error mode); ``due`` asks the questions due
    for review on ``today`` (default the local date), then up to ``new_per_day`` new ones a day; ``mock`` runs a
    mock interview of that many minutes (:func:`run_mock`). Spot-the-error mixes true claims with false ones
    (with ``retry_missed``, the false ones last missed)."""
    if lang not in UI:
        raise ValueError(f"lang must be one of {sorted(UI)}, got {lang!r}")
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    ui = UI[lang]
    question_bank = question_bank or bank_module.load()
    console = console or Console()
    store = store or ScoreStore.open()
    today = today or date.today()
    rng = random.Random(seed)
    entries = question_bank.in_section(section) if section else list(question_bank.entries)
    if tags:
        entries = filter_by_tags(entries, tags)
        if not entries:
            console.print(ui["none_tagged"].format(tags=ui["list"].join(tags)))
            return 0
    session = _Session(console, lang, store, question_bank, timer=timer, short_only=short_only, today=today)
    if mock is not None:
        return run_mock(session, entries, mock, rng, count=count)
    if mode == "answer":
        items = _pick(entries, store, due=due, retry_missed=retry_missed, new_per_day=new_per_day, today=today,
                      rng=rng, console=console, ui=ui)
        if items is None:
            return 0
    elif retry_missed:
        missed_claims = store.missed_claims()
        items = [(e, False, i) for e in entries for i in range(len(e.get("wrong_answers", [])))
                 if (e["id"], i) in missed_claims]
        if not items:
            console.print(ui["nothing"])
            return 0
    else:
        items = interviewer.true_or_false_items(entries, rng)
    if count is not None:
        items = items[:count]
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    try:
        for number, item in enumerate(items, start=1):
            if mode == "answer":
                session.entry(item, number, len(items))
            elif retry_missed:
                session.claim(item[0], item[2], number, len(items))
            else:
                session.judge(*item, number, len(items))
    except _Quit:
        console.print(ui["bye"])
    _save_session(session, started, mode=mode, section=section, tags=tags, timer=timer, retry_missed=retry_missed,
                  count=count, due=due)
    session.summary()
    return 0


def _save_session(session: _Session, started: str, **settings) -> None:
    session.store.sessions.append({"version": 2, "started": started, "lang": session.lang,
                                   "section": settings.pop("section", None), "tags": list(settings.pop("tags") or []),
                                   "asked": session.scored, "points": session.points,
                                   "counts": dict(session.asked), "by_section": session.by_section,
                                   "seconds": round(session.seconds, 1), **settings})
    session.store.save()


def run_mock(session: _Session, entries: list[dict], minutes: float, rng: random.Random, *,
             count: int | None = None) -> int:
    """A mock interview: main questions until ``minutes`` have passed (checked between questions, as an
    interviewer lets you finish) or ``count`` were asked. It opens with a common, basic question; after a good
    answer (3/4 of the points or more, follow-ups included) the next one is a level harder, after a weak one (below
    half) a level easier; follow-ups go on only while the answers are good. Then a written debrief, printed and
    saved next to the scores. Returns the exit status (0)."""
    ui, lang, console = session.ui, session.lang, session.console
    console.print(wrap(Text(ui["mock_start"].format(minutes=minutes), style="bold"), session.width))
    started_at = datetime.now(timezone.utc)
    deadline = time.monotonic() + 60 * minutes
    level, deepest, last_section, asked, rows = 0, 0, None, set(), []
    try:
        while time.monotonic() < deadline and (count is None or len(rows) < count):
            entry = interviewer.next_mock_question(entries, asked, level, last_section, rng)
            if entry is None:
                break
            asked.add(entry["id"])
            last_section = entry["section"]
            before = (session.asked["follow_ups"], session.myths_stated, session.seconds)
            try:
                score = session.entry(entry, len(rows) + 1, None, adaptive=True)
            finally:  # a question interrupted by q still goes into the debrief
                rows.append({"entry": entry, "score": None, "follow_ups": session.asked["follow_ups"] - before[0],
                             "myths": session.myths_stated - before[1], "seconds": session.seconds - before[2]})
            rows[-1]["score"] = score
            deepest = max(deepest, interviewer.ease(entry))
            if score is not None and score >= GOT_IT:
                level = min(level + 1, LEVELS)
            elif score is None or score < 0.5:
                level = max(level - 1, 0)
        else:
            console.print(ui["mock_over"])
    except _Quit:
        console.print(ui["bye"])
    _save_session(session, started_at.isoformat(timespec="seconds"), mode="mock", section=None, tags=None,
                  timer=session.timer, mock_minutes=minutes)
    text = debrief(rows, lang=lang, minutes=minutes, seconds=session.seconds, deepest=deepest,
                   myths=session.myths_stated, started=started_at.strftime("%Y-%m-%d %H:%M UTC"),
                   sections=session.bank.sections)
    path = session.store.path.parent / f"mock-{started_at.strftime('%Y%m%d-%H%M%S')}.md"
    path.write_text(text, encoding="utf-8")
    console.print(Text(text))  # as written to the file: the table is Markdown
    console.print(ui["debrief_saved"].format(path=path))
    return 0


def debrief(rows: list[dict], *, lang: str, minutes: float, seconds: float, deepest: int, myths: int,
            started: str, sections: dict[str, dict[str, str]]) -> str:
    """The mock interview's written debrief (Markdown): the questions with their scores, the myths stated, the
    strongest sections, what to review, and a verdict by the drill's own rule (mean 75% or more and no myth:
    strong; 50% or more: borderline; below: not yet)."""
    words = DEBRIEF[lang]
    scores = [row["score"] or 0.0 for row in rows]
    mean = sum(scores) / len(scores) if scores else 0.0
    lines = [words["title"].format(started=started), "",
             words["summary"].format(minutes=duration(seconds, lang), limit=minutes, questions=len(rows),
                                     follow_ups=sum(row["follow_ups"] for row in rows),
                                     percent=f"{100 * mean:.0f}%", level=deepest, levels=LEVELS), "",
             words["table"], "|---|---|---|---|---|"]
    for number, row in enumerate(rows, start=1):
        score = words["skipped"] if row["score"] is None else f"{100 * row['score']:.0f}%"
        question = row["entry"]["question"][lang].replace("|", "/")
        lines.append(f"| {number} | {question} | {score} | {row['follow_ups']} | {duration(row['seconds'], lang)} |")
    lines += ["", words["myths"], "", words["myths_none"] if not myths else
              "; ".join(row["entry"]["question"][lang] for row in rows if row["myths"]), ""]
    by_section: dict[str, list[float]] = {}
    for row, score in zip(rows, scores, strict=True):
        by_section.setdefault(row["entry"]["section"], []).append(score)
    strong = [sections[s][lang] for s, values in by_section.items() if sum(values) / len(values) >= GOT_IT]
    lines += [words["strong"], "", ", ".join(strong) or words["none"], "", words["review"], ""]
    lines += [f"- {row['entry']['question'][lang]}" for row, score in zip(rows, scores, strict=True) if score < GOT_IT]
    lines += [] if any(score < GOT_IT for score in scores) else [words["none"]]
    verdict = "hire" if mean >= GOT_IT and not myths else "lean" if mean >= 0.5 else "no"
    lines += ["", words["verdict"], "", words[verdict], ""]
    return "\n".join(lines)
