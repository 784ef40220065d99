"""The terminal drill (``flashcourse quiz``) driven through a pseudo-terminal: answer first against a clock, the
timer, spot-the-error, follow-ups in the score, scores between sessions (old files too), --stats, --tag, Chinese
wrapped per character in a narrow terminal; and the export of the bank (``flashcourse interview export``): Markdown
in sync with docs/, an Anki deck with a card per question, follow-up and wrong answer."""

from __future__ import annotations

import json
import os
import random
import re
import sqlite3
import subprocess
import sys
import zipfile
from pathlib import Path

import pexpect
import pytest
import yaml
from child_env import child_pythonpath
from rich.cells import cell_len

from flashcourse import interview
from flashcourse.interview import bank as bank_module
from flashcourse.interview import export
from flashcourse.interview.interviewer import round_order, true_or_false_items
from flashcourse.interview.terminal import ScoreStore

ROOT = Path(__file__).resolve().parents[1]
BANK = interview.load()

# A small bank of our own (the drill takes --bank), so these tests do not depend on the course bank's content.
PARA_ZH = ("标准实现先把分数矩阵写入显存，做归一化时再读回，写出概率矩阵，计算输出时又读一遍概率矩阵，"
           "对平方大小的矩阵一共四遍访存，"
           "而分块算法读入一个查询块，让键和值的块依次流过，每行只保存当前最大值和指数和，最大值变大时重新缩放已有的部分输出。")
SMALL_BANK = {
    "sections": [{"id": "alpha", "title": {"en": "Alpha things", "zh": "甲部分"}},
                 {"id": "beta", "title": {"en": "Beta things", "zh": "乙部分"}}],
    "entries": [
        {"id": "one", "section": "alpha", "tags": ["freq:common", "level:basic"],
         "question": {"en": "What is one?", "zh": "一是什么？"},
         "short": {"en": "One is the first number.", "zh": PARA_ZH},
         "long": {"en": "Longer: one is the unit.", "zh": "详细：一是单位。"},
         "follow_ups": [{"question": {"en": "And two?", "zh": "那二呢？"},
                         "answer": {"en": "Two follows one.", "zh": "二在一之后。"}},
                        {"question": {"en": "And three?", "zh": "那三呢？"},
                         "answer": {"en": "Three follows two.", "zh": "三在二之后。"}}],
         "wrong_answers": [{"claim": {"en": "One is zero.", "zh": "一就是零。"},
                            "correction": {"en": "One is one more than zero.", "zh": "一比零大一。"}}],
         "evidence": [{"compute": "io_traffic_ratio", "args": {"n": 1024, "d": 32, "sram": 16384}, "quote": "5.6"},
                      {"notebook": "notebooks/04_io_complexity.ipynb", "cell_tag": "io-ratio"},
                      {"paper": "A paper (2022)", "section": "Section 3.1"}]},
        {"id": "two", "section": "beta", "tags": ["freq:rare", "level:advanced"],
         "question": {"en": "What is two?", "zh": "二是什么？"},
         "short": {"en": "Two is even.", "zh": "二是偶数。"},
         "long": {"en": "Two is the only even prime.", "zh": "二是唯一的偶素数。"},
         "follow_ups": [{"question": {"en": "Is it prime?", "zh": "它是素数吗？"},
                         "answer": {"en": "Yes.", "zh": "是。"}}],
         "wrong_answers": [{"claim": {"en": "Two is odd.", "zh": "二是奇数。"},
                            "correction": {"en": "Two is even.", "zh": "二是偶数。"}},
                           {"claim": {"en": "Two is not prime.", "zh": "二不是素数。"},
                            "correction": {"en": "Two is prime.", "zh": "二是素数。"}}],
         "evidence": [{"paper": "A paper (2022)", "section": "Section 3.2"}]},
        {"id": "three", "section": "beta",  # no tags: older banks have none
         "question": {"en": "What is three?", "zh": "三是什么？"},
         "short": {"en": "Three is odd.", "zh": "三是奇数。"},
         "long": {"en": "Three is prime.", "zh": "三是素数。"},
         "follow_ups": [{"question": {"en": "Odd?", "zh": "奇数？"}, "answer": {"en": "Yes.", "zh": "是。"}}],
         "wrong_answers": [{"claim": {"en": "Three is even.", "zh": "三是偶数。"},
                            "correction": {"en": "Three is odd.", "zh": "三是奇数。"}}],
         "evidence": [{"paper": "A paper (2022)", "section": "Section 3.3"}]},
    ],
}


@pytest.fixture
def small_bank(tmp_path) -> Path:
    path = tmp_path / "bank.yaml"
    path.write_text(yaml.safe_dump(SMALL_BANK, allow_unicode=True, sort_keys=False), encoding="utf-8")
    return path


def _order(section: str, seed: int) -> list[dict]:
    """The order the quiz asks a section in, for a seed: common and basic first, shuffled within each step."""
    return round_order(BANK.in_section(section), random.Random(seed))


def _spawn(tmp_path: Path, *args: str, columns: int = 200) -> pexpect.spawn:
    env = dict(os.environ, XDG_DATA_HOME=str(tmp_path / "data"), NO_COLOR="1", TERM="dumb",
               COLUMNS=str(columns), LINES="60")
    child = pexpect.spawn(sys.executable, ["-m", "flashcourse", "quiz", *args], env=env, encoding="utf-8",
                          timeout=30, dimensions=(60, columns))
    return child


def _scores(tmp_path: Path) -> dict:
    return json.loads((tmp_path / "data" / "flashcourse" / "quiz_scores.json").read_text(encoding="utf-8"))


def _end(child: pexpect.spawn) -> str:
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    return child.before


def test_you_answer_first_against_a_clock_then_the_answer_shows_and_follow_ups_count(tmp_path, small_bank):
    child = _spawn(tmp_path, "--bank", str(small_bank), "--section", "alpha")
    child.expect("Question 1 of 1")
    child.expect_exact("type it, or say it aloud, then Enter")
    child.expect(r"\[0:0\d elapsed\] > ")  # the clock counts up when there is no --timer
    assert "30-second answer" not in child.before  # hidden until you have answered
    child.send("one is the unit\r")
    child.expect_exact("Your answer (")
    child.expect_exact("one is the unit")
    child.expect("30-second answer")
    child.expect_exact("One is the first number.")
    child.expect_exact("[l] longer answer and evidence")
    child.sendline("l")
    child.expect("Longer answer")
    child.expect("Evidence")
    child.expect_exact("computed by the course: io traffic ratio (n = 1024, d = 32, sram = 16384) → 5.6")
    child.expect_exact("lesson 04 (io complexity), the cell “io-ratio”")
    child.expect_exact("[g] got it")
    child.sendline("x")  # not a choice: asked again
    child.expect("Please type one of: g, p, m")
    child.sendline("g")
    child.expect("Follow-up 1")
    child.expect("elapsed")
    child.send("\r")  # said aloud
    child.expect("Answered aloud in")
    child.expect_exact("Two follows one.")
    child.sendline("m")
    child.expect("Follow-up 2")
    child.send("three\r")
    child.expect_exact("Three follows two.")
    child.sendline("p")
    child.expect("This session")
    child.expect(r"3\s+.\s+1/2/0\s+.\s+1\.5\s+.\s+50%")  # scored 3 (1 question, 2 follow-ups), 1.5 points
    _end(child)

    scores = _scores(tmp_path)
    assert scores["version"] == 2
    assert scores["entries"]["one"]["last"] == 1.0 and scores["entries"]["one"]["follow_ups"] == {"0": 0.0, "1": 0.5}
    session = scores["sessions"][-1]
    assert session["asked"] == 3 and session["points"] == 1.5 and session["mode"] == "answer"
    assert session["counts"] == {"questions": 1, "follow_ups": 2, "claims": 0}

    # A second session asks only what was missed (here: follow-ups of the first question).
    child = _spawn(tmp_path, "--bank", str(small_bank), "--retry-missed", "--short-only")
    child.expect("Question 1 of 1")
    child.send("\r")
    child.expect("30-second answer")
    child.expect_exact("[g] got it")  # short-only: no offer of the longer answer
    assert "[l] longer answer" not in child.before
    child.sendline("g")
    for _ in range(2):
        child.expect("Follow-up")
        child.send("\r")
        child.expect_exact("[g] got it")
        child.sendline("g")
    child.expect("This session")
    _end(child)
    assert ScoreStore.open(tmp_path / "data" / "flashcourse" / "quiz_scores.json").missed() == set()

    child = _spawn(tmp_path, "--bank", str(small_bank), "--retry-missed")
    child.expect("Nothing to retry")
    _end(child)


def test_the_timer_counts_down_and_says_when_the_time_is_up(tmp_path, small_bank):
    child = _spawn(tmp_path, "--bank", str(small_bank), "--section", "alpha", "--timer", "2")
    child.expect("Question 1 of 1")
    child.expect(r"\[0:0[12] left\] > ")
    child.send("one")  # typing shows beside the clock while it runs
    child.expect(r"\[0:0[01] left\] > one")
    child.expect_exact("Time is up (2 s): finish your sentence and press Enter.")
    child.expect(r"\[0:0\d over\] > one")
    child.send(" is one\r")
    child.expect_exact("one is one")
    child.expect_exact("[l] longer answer")
    child.sendline("q")
    child.expect("This session")
    _end(child)
    assert _scores(tmp_path)["sessions"][-1]["timer"] == 2.0


def test_a_timer_must_be_positive(tmp_path):
    result = subprocess.run([sys.executable, "-m", "flashcourse", "quiz", "--timer", "0"], capture_output=True,
                            text=True, env=dict(os.environ, XDG_DATA_HOME=str(tmp_path)))
    assert result.returncode == 2 and "above 0" in result.stderr


def test_spot_the_error_asks_true_or_false_then_the_correction(tmp_path, small_bank):
    child = _spawn(tmp_path, "--bank", str(small_bank), "--mode", "spot-the-error", "--section", "beta",
                   "--seed", "0")
    entries = [e for e in SMALL_BANK["entries"] if e["section"] == "beta"]
    claims = true_or_false_items(entries, random.Random(0))  # beta has no points: three false claims
    assert [is_true for _, is_true, _ in claims] == [False] * 3
    for number, (entry, _, index) in enumerate(claims, start=1):
        wrong = entry["wrong_answers"][index]
        child.expect(f"Claim {number} of 3: true or false")
        child.expect_exact(entry["question"]["en"])
        child.expect_exact(wrong["claim"]["en"])
        child.expect_exact("[t] true, [f] false")
        assert "Correction" not in child.before
        if number == 2:  # judged true: told it is false, shown the correction, scored 0 without asking
            child.sendline("t")
            child.expect_exact("No: this claim is false.")
            child.expect("Correction")
            continue
        child.sendline("f")
        child.expect_exact("What is wrong? Correct it")
        child.send("it is the other way round\r")
        child.expect("Correction")
        child.expect_exact(wrong["correction"]["en"])
        child.expect_exact("[g] got it")
        child.sendline("g" if number < 3 else "m")
    child.expect("This session")
    child.expect(r"3\s+.\s+0/0/3\s+.\s+1\s+")
    child.expect_exact("to retry:")
    child.expect_exact(f"{claims[1][0]['question']['en']} (wrong claim {claims[1][2] + 1})")  # by text, not id
    _end(child)
    last = claims[-1]
    scores = _scores(tmp_path)
    assert scores["entries"][last[0]["id"]]["wrong_answers"][str(last[2])] == 0.0
    assert scores["sessions"][-1]["mode"] == "spot-the-error"

    child = _spawn(tmp_path, "--bank", str(small_bank), "--mode", "spot-the-error", "--retry-missed")
    child.expect("Wrong claim 1 of 2")
    child.expect(r"elapsed\] > ")
    child.sendeof()  # Ctrl-D at the clock's prompt ends the session too
    child.expect("Stopped")
    _end(child)


def test_spot_the_error_mixes_true_claims_from_the_points(tmp_path, points_bank):
    items = true_or_false_items([e for e in yaml.safe_load(points_bank.read_text())["entries"]],
                                random.Random(1))  # seed 1: two true claims first
    assert {is_true for _, is_true, _ in items} == {True, False}  # both kinds: the 3 points, the 4 wrong answers
    assert sum(is_true for _, is_true, _ in items) == 3 and len(items) == 7
    child = _spawn(tmp_path, "--bank", str(points_bank), "--mode", "spot-the-error", "--seed", "1")
    for number, (entry, is_true, index) in enumerate(items, start=1):
        child.expect(f"Claim {number} of {len(items)}")
        if not is_true:
            child.sendline("q")
            break
        child.expect_exact(entry["points"][index]["en"])
        child.sendline("t")
        child.expect_exact("Right: this claim is true.")
    _end(child)
    true_claims = _scores(tmp_path)["entries"].get("one", {}).get("true_claims", {})
    answered = [index for _, is_true, index in items[:number - 1] if is_true]
    assert len(answered) == 2
    assert sorted(true_claims) == sorted(str(i) for i in answered) and set(true_claims.values()) <= {1.0}


def test_stats_show_each_section_and_the_history_and_read_old_score_files(tmp_path, small_bank):
    store = tmp_path / "data" / "flashcourse" / "quiz_scores.json"
    store.parent.mkdir(parents=True)
    old = {"version": 1,  # the first format: no modes, times or wrong claims
           "entries": {"one": {"asked": 2, "best": 1.0, "last": 0.5, "follow_ups": {"0": 1.0}},
                       "gone": {"asked": 1, "best": 0.0, "last": 0.0, "follow_ups": {}}},
           "sessions": [{"started": "2026-11-01T10:00:00+00:00", "lang": "en", "section": "alpha", "asked": 2,
                         "points": 1.5, "retry_missed": False}]}
    store.write_text(json.dumps(old), encoding="utf-8")
    child = _spawn(tmp_path, "--bank", str(small_bank), "--stats")
    child.expect("Results per section")
    child.expect(r"Alpha things\s+.\s+1/1\s+.\s+50% \(1\)\s+.\s+100% \(1\)\s+.\s+-")
    child.expect(r"Beta things\s+.\s+0/2\s+.\s+-")
    child.expect_exact("(no longer in the bank)")
    child.expect("History")
    child.expect(r"2026-11-01 10:00\s+.\s+answer \(first format\)\s+.\s+Alpha things\s+.\s+2\s+.\s+1\.5\s+.\s+75%")
    _end(child)

    # A spot-the-error session on top of it, then the stats again (in Chinese).
    child = _spawn(tmp_path, "--bank", str(small_bank), "--mode", "spot-the-error", "--section", "alpha")
    child.expect("Claim 1 of 1")
    child.sendline("f")
    child.expect_exact("What is wrong?")
    child.send("\r")
    child.expect_exact("[g] got it")
    child.sendline("p")
    _end(child)
    child = _spawn(tmp_path, "--bank", str(small_bank), "--stats", "--lang", "zh")
    child.expect("各部分成绩")
    child.expect(r"甲部分\s+.\s+1/1\s+.\s+50% \(1\)\s+.\s+100% \(1\)\s+.\s+50% \(1\)")
    child.expect("练习记录（最近 2 次）")
    child.expect(r"找错\s+.\s+甲部分\s+.\s+1\s+.\s+0\.5\s+.\s+50%")
    _end(child)
    assert _scores(tmp_path)["entries"]["gone"]["last"] == 0.0  # nothing of the old file is lost


def test_tags_filter_the_entries(tmp_path, small_bank):
    child = _spawn(tmp_path, "--bank", str(small_bank), "--tag", "freq:rare", "--tag", "freq:common",
                   "--tag", "level:advanced", "--mode", "spot-the-error")
    child.expect("Claim 1 of 2")  # freq:(rare or common) and level:advanced: entry "two" only
    child.expect("Two is")
    child.sendline("q")
    _end(child)
    child = _spawn(tmp_path, "--bank", str(small_bank), "--tag", "level:intermediate")
    child.expect("No entry has the tags level:intermediate")
    _end(child)
    # The course's bank: the questions asked often, at the basic level.
    from flashcourse.interview.terminal import filter_by_tags

    common = filter_by_tags(BANK.entries, ["freq:common", "level:basic"])
    assert all({"freq:common", "level:basic"} <= set(e["tags"]) for e in common)
    child = _spawn(tmp_path, "--tag", "freq:common", "--tag", "level:basic")
    child.expect(f"Question 1 of {len(common)}" if common else "No entry has the tags")
    child.sendline("q")
    _end(child)
    result = subprocess.run([sys.executable, "-m", "flashcourse", "quiz", "--tag", "freq:often"],
                            capture_output=True, text=True, env=dict(os.environ, XDG_DATA_HOME=str(tmp_path)))
    assert result.returncode == 2 and "freq:common" in result.stderr


def _panel_lines(text: str) -> list[str]:
    return [line.strip()[1:-1].rstrip() for line in text.replace("\r", "").split("\n")
            if line.strip().startswith("│") and line.strip().endswith("│")]


def test_chinese_wraps_per_character_in_a_narrow_terminal_with_the_house_punctuation(tmp_path, small_bank):
    child = _spawn(tmp_path, "--bank", str(small_bank), "--lang", "zh", "--section", "alpha", columns=40)
    child.expect("问题 1/1")
    child.expect_exact("你的回答：打字或说出来，")  # the prompt wraps at 40 columns
    child.expect(r"\[用时 0:0\d\] > ")
    child.send("\r")
    child.expect("口头回答，用时")
    child.expect("30 秒回答")
    child.expect("常见错误回答")  # after the 30-second answer, every time
    shown = child.before
    child.expect("l 看详细回答和证据")
    child.sendline("l")
    child.expect("给自己打分：g 答对了")
    evidence = child.before
    child.sendline("q")
    _end(child)
    lines = [line for line in _panel_lines(shown) if line.strip()]
    paragraph = [line for line in lines if re.search(r"[\u4e00-\u9fff]", line)]
    assert len(paragraph) >= 4
    for line in paragraph[:-1]:  # every line but the last is filled to within a character of the width
        assert cell_len(line) >= 40 - 4 - 2, f"a half-empty line: {line!r}"
        assert line.lstrip()[0] not in "，。：；！？、）", line  # no line starts with closing punctuation
    assert "".join(line.strip() for line in paragraph) == PARA_ZH
    assert "flashcourse." not in evidence and "evidence.io_traffic_ratio" not in evidence  # no Python paths
    assert "本课程代码算出" in evidence and "第 04 课" in evidence


def test_the_chinese_interface_follows_the_house_style():
    from flashcourse.interview import zh_style
    from flashcourse.interview.terminal import UI

    for key, text in UI["zh"].items():
        assert not zh_style.problems(text.format_map(_Blank()), key)
        assert not re.search(r"\b(Enter|Press|skip|quit)\b", text), f"{key}: English in the Chinese interface"


class _Blank(dict):
    def __missing__(self, key):
        return 0


def test_the_chinese_session_and_the_end_of_input(tmp_path):
    entry = _order("telling", seed=0)[0]
    child = _spawn(tmp_path, "--lang", "zh", "--section", "telling", "--seed", "0")
    child.expect(r"问题 1/\d+")
    child.expect_exact("你的回答")
    child.send("\r")
    child.expect("30 秒回答")
    child.expect_exact(re.split(r"[`*$]", entry["short"]["zh"])[0][:4])  # as rendered: Markdown marks are gone
    child.sendeof()  # Ctrl-D ends the session like q, and the scores are still written
    child.expect("本次练习")
    _end(child)
    assert _scores(tmp_path)["sessions"][-1]["lang"] == "zh"


def test_an_unknown_section_is_refused_with_the_known_ones(tmp_path):
    result = subprocess.run([sys.executable, "-m", "flashcourse", "quiz", "--section", "nope"],
                            capture_output=True, text=True, env=dict(os.environ, XDG_DATA_HOME=str(tmp_path)))
    assert result.returncode == 2 and "myths" in result.stderr and "serving" in result.stderr


# ------------------------------------------------------------------------------------------- drill v4
POINTS = [{"en": "It is the unit.", "zh": "它是单位。"}, {"en": "It comes first.", "zh": "它排第一。"},
          {"en": "It is odd.", "zh": "它是奇数。"}]


@pytest.fixture
def points_bank(tmp_path) -> Path:
    data = json.loads(json.dumps(SMALL_BANK))
    data["entries"][0]["points"] = POINTS
    path = tmp_path / "points.yaml"
    path.write_text(yaml.safe_dump(data, allow_unicode=True, sort_keys=False), encoding="utf-8")
    return path


@pytest.mark.parametrize("command", [["quiz"], ["interview", "quiz"]])
def test_both_spellings_offer_count_and_due(command):
    result = subprocess.run([sys.executable, "-m", "flashcourse", *command, "--help"], capture_output=True,
                            text=True)
    assert result.returncode == 0 and "--count" in result.stdout and "--due" in result.stdout


def test_count_stops_after_n_questions(tmp_path, small_bank):
    child = _spawn(tmp_path, "--bank", str(small_bank), "--count", "1", "--short-only", "--seed", "0")
    child.expect("Question 1 of 1")  # three entries in the bank, one asked
    child.sendline("q")
    _end(child)
    result = subprocess.run([sys.executable, "-m", "flashcourse", "quiz", "--count", "0"], capture_output=True,
                            text=True, env=dict(os.environ, XDG_DATA_HOME=str(tmp_path)))
    assert result.returncode == 2 and "1 or more" in result.stderr


def test_the_points_show_after_the_answer_and_the_ticks_are_the_score(tmp_path, points_bank):
    child = _spawn(tmp_path, "--bank", str(points_bank), "--section", "alpha", "--short-only")
    child.expect("Question 1 of 1")
    child.send("the unit\r")
    child.expect("30-second answer")
    child.expect("A good answer makes these points")
    child.expect_exact("1. It is the unit.")
    child.expect_exact("3. It is odd.")
    child.expect_exact("Which points did you make?")
    child.sendline("4")  # no such point: asked again
    child.expect_exact("Please type point numbers from 1 to 3")
    child.sendline("1 3")
    child.expect_exact("2 of 3 points: 0.67")
    child.expect("Follow-up 1")
    child.sendline("q")
    _end(child)
    item = _scores(tmp_path)["entries"]["one"]
    assert item["last"] == 0.67 and item["box"] == 1  # below 3/4 of the points: "partly", stays in box 1


def test_parse_ticks():
    from flashcourse.interview.terminal import parse_ticks

    assert parse_ticks("1 3", 3) == {0, 2} and parse_ticks("2,1", 3) == {0, 1} and parse_ticks("", 4) == set()
    assert parse_ticks("a", 3) == {0, 1, 2} and parse_ticks("1、2", 3) == {0, 1}
    assert parse_ticks("0", 3) is None and parse_ticks("4", 3) is None and parse_ticks("one", 3) is None


def test_leitner_boxes_move_with_the_score_and_set_the_due_date(tmp_path):
    from datetime import date

    store = ScoreStore(tmp_path / "scores.json")
    day = date(2026, 12, 1)
    store.record("a", 1.0, today=day)  # got it: box 1 -> 2, back in 2 days
    assert store.entries["a"]["box"] == 2 and store.entries["a"]["due"] == "2026-12-03"
    store.record("a", 1.0, today=date(2026, 12, 3))
    assert store.entries["a"]["box"] == 3 and store.entries["a"]["due"] == "2026-12-07"
    store.record("a", 0.5, today=date(2026, 12, 7))  # partly: down one box
    assert store.entries["a"]["box"] == 2 and store.entries["a"]["due"] == "2026-12-09"
    store.record("a", 0.0, today=date(2026, 12, 9))  # missed: back to box 1, tomorrow
    assert store.entries["a"]["box"] == 1 and store.entries["a"]["due"] == "2026-12-10"
    for _ in range(9):
        store.record("b", 1.0, today=day)
    assert store.entries["b"]["box"] == 5 and store.entries["b"]["due"] == "2026-12-17"  # the top box: 16 days
    assert store.due(date(2026, 12, 10)) == {"a"} and store.due(date(2026, 12, 17)) == {"a", "b"}
    assert store.due(date(2026, 12, 9)) == set() and store.next_due() == "2026-12-10"
    assert store.boxes() == {1: 1, 2: 0, 3: 0, 4: 0, 5: 1}
    store.save()
    assert ScoreStore.open(store.path).entries["b"]["box"] == 5


def test_due_asks_only_what_is_due_and_stats_show_the_boxes(tmp_path, small_bank):
    store = tmp_path / "data" / "flashcourse" / "quiz_scores.json"
    store.parent.mkdir(parents=True)
    entries = {"one": {"asked": 1, "best": 1.0, "last": 1.0, "follow_ups": {}, "box": 2, "due": "2026-01-01"},
               "two": {"asked": 1, "best": 1.0, "last": 1.0, "follow_ups": {}, "box": 4, "due": "2999-01-01"}}
    store.write_text(json.dumps({"version": 2, "entries": entries, "sessions": []}), encoding="utf-8")
    child = _spawn(tmp_path, "--bank", str(small_bank), "--due", "--short-only")
    child.expect("Due today: 1")
    child.expect(r"New today: 1 \(at most 10 new a day")  # "three" was never asked
    child.expect("Question 1 of 2")
    child.expect_exact("What is one?")
    child.send("\r")
    child.expect_exact("[g] got it")
    child.sendline("g")
    child.expect("Follow-up 1")
    child.sendline("q")
    _end(child)
    assert _scores(tmp_path)["entries"]["one"]["box"] == 3
    assert "first" not in _scores(tmp_path)["entries"]["one"]  # asked before the day's count began: not new
    # Nothing due, but new questions left: --due serves them, at most --new a day.
    child = _spawn(tmp_path, "--bank", str(small_bank), "--due", "--short-only", "--new", "1")
    child.expect("Due today: 0")
    child.expect("Question 1 of 1")
    child.expect_exact("What is three?")
    child.send("\r")
    child.expect_exact("[g] got it")
    child.sendline("g")
    child.expect("Follow-up 1")
    child.sendline("q")
    _end(child)
    child = _spawn(tmp_path, "--bank", str(small_bank), "--due")
    child.expect(r"Nothing is due today\. 0 questions never asked; next review: \d{4}-\d\d-\d\d")
    _end(child)
    env = dict(os.environ, XDG_DATA_HOME=str(tmp_path / "data"), COLUMNS="200")
    for command in (["interview", "stats"], ["quiz", "--stats"]):
        result = subprocess.run([sys.executable, "-m", "flashcourse", *command, "--bank", str(small_bank)],
                                capture_output=True, text=True, env=env)
        assert result.returncode == 0, result.stderr
        assert "Leitner boxes" in result.stdout and "due today" in result.stdout


# rich made unimportable, as on an install without the interview extra.
_NO_RICH = """
import importlib.abc, runpy, sys
class NoRich(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "rich":
            raise ImportError("No module named 'rich' (blocked)", name=name)
sys.meta_path.insert(0, NoRich())
sys.argv = ["flashcourse", *sys.argv[1:]]
runpy.run_module("flashcourse", run_name="__main__")
"""


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_the_quiz_runs_in_plain_text_without_rich(tmp_path, points_bank, lang):
    env = dict(os.environ, XDG_DATA_HOME=str(tmp_path / "data"), COLUMNS="60")
    answers = "one\n\na\nq\n"  # answer, no longer answer, all points ticked, quit at the first follow-up
    result = subprocess.run([sys.executable, "-c", _NO_RICH, "quiz", "--bank", str(points_bank), "--section",
                             "alpha", "--lang", lang], input=answers, capture_output=True, text=True, env=env,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "\x1b[" not in out and "│" not in out  # no colours, no boxes
    expected = {"en": ["Question 1 of 1", "One is the first number.", "1. It is the unit.", "3 of 3 points: 1",
                       "This session"],
                "zh": ["问题 1/1", "标准实现先把分数矩阵", "1. 它是单位。", "讲到 3/3 点：1", "本次练习"]}[lang]
    positions = [out.find(text) for text in expected]
    assert -1 not in positions and positions == sorted(positions), out
    from flashcourse.interview._plaintext import cell_len as plain_cells

    # Lines of text (not panel titles, tables or paths) fit the terminal, Chinese wrapped per character.
    text_lines = [line for line in out.splitlines() if not {"─", "|", "+", "/"} & set(line)]
    assert max(plain_cells(line) for line in text_lines) <= 60
    assert _scores(tmp_path)["entries"]["one"]["last"] == 1.0
    result = subprocess.run([sys.executable, "-c", _NO_RICH, "interview", "stats"], capture_output=True, text=True,
                            env=env, timeout=60)
    assert result.returncode == 0 and "Leitner boxes" in result.stdout, result.stderr


# ------------------------------------------------------------------------------------------- export
@pytest.mark.parametrize("lang", interview.LANGUAGES)
def test_the_markdown_in_docs_is_the_bank_as_generated_now(lang):
    committed = (ROOT / export.DOCUMENT_PATHS[lang]).read_text(encoding="utf-8")
    assert committed == export.render_document(BANK, lang), (
        f"docs/interview_{lang}.md is out of date: run "
        f"`flashcourse interview export --format md --lang {lang} --out docs/interview_{lang}.md`")
    for entry in BANK.entries:
        assert entry["question"][lang] in committed and entry["long"][lang].strip() in committed


def test_export_markdown_to_standard_output():
    result = subprocess.run([sys.executable, "-m", "flashcourse", "interview", "export", "--format", "md",
                             "--lang", "zh"], capture_output=True, text=True, check=True)
    assert result.stdout == export.render_document(BANK, "zh")


def test_export_anki_writes_a_card_per_question_follow_up_and_wrong_answer(tmp_path):
    path = export.write_anki(tmp_path / "deck.apkg", lang="zh")
    with zipfile.ZipFile(path) as package:
        package.extract("collection.anki2", tmp_path)
    with sqlite3.connect(tmp_path / "collection.anki2") as db:
        notes = [(row[0], row[1]) for row in db.execute("select flds, tags from notes")]
    fields = [flds for flds, _ in notes]
    follow_ups = sum(len(e["follow_ups"]) for e in BANK.entries)
    wrong = sum(len(e["wrong_answers"]) for e in BANK.entries)
    assert len(fields) == len(BANK.entries) + follow_ups + wrong
    assert len({f.split("\x1f")[0] for f in fields}) == len(fields)  # every card its own id
    entry = BANK.entries[0]
    note = next(f for f in fields if f.startswith(entry["id"] + "\x1f"))
    assert "30 秒回答" in note and "<strong>证据：</strong>" in note
    assert "<h4>要点</h4>" in note  # the checklist of points, each as an item
    assert all(f"<li>{bank_module.markdown_to_html(p['zh'])}</li>" in note for p in entry["points"])
    follow = next(f for f in fields if f.startswith(entry["id"] + "/follow-up-1\x1f"))
    assert bank_module.markdown_to_html(entry["follow_ups"][0]["answer"]["zh"]) in follow
    assert entry["follow_ups"][1]["answer"]["zh"][:6] not in follow  # one follow-up per card
    claim = next(f for f in fields if f.startswith(entry["id"] + "/wrong-1\x1f"))
    front, back = claim.split("\x1f")[1:]
    assert "错误回答" in front and "纠正" in back and "纠正" not in front


def test_export_anki_without_genanki_says_how_to_install_it(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "genanki", None)  # as if it were not installed
    with pytest.raises(SystemExit, match=r'pip install "flashcourse\[anki\]"'):
        export.write_anki(tmp_path / "deck.apkg")


# ------------------------------------------------------------------------------------------- the interviewer
SEED_MYTHS = {  # the three answers of the seed articles the review typed, and the myths they state
    "SRAM 约 20MB": {"myth-sram-20mb"},
    "FlashAttention 把显存从 O(N²) 降到 O(N)": {"myth-io-linear"},
    "用 cuBLAS batched GEMM，计算量只增加约 20-30%": {"myth-cublas", "myth-rescale-cost"},
    "The GPU has about 20 MB of SRAM, and FA cuts HBM traffic from O(N^2) to O(N).": {"myth-sram-20mb",
                                                                                     "myth-io-linear"},
}


@pytest.mark.parametrize("typed", SEED_MYTHS)
def test_the_seed_articles_myths_are_recognised_in_a_typed_answer(typed):
    from flashcourse.interview.interviewer import spot_myths

    assert {myth.entry_id for myth in spot_myths(typed, BANK)} == SEED_MYTHS[typed]


@pytest.mark.parametrize("typed", [
    "Each SM has its own 228 KB; the 20 MB is the sum over all SMs of SRAM.",
    "它不调用 cuBLAS，矩阵乘是自己发的 Tensor Core 指令。",
    "额外显存从 O(N^2) 降到 O(N)，但访存量仍是 Theta(N^2 d^2 / M)。",
    "It computes exact attention, not an approximation.",
    "",
])
def test_a_correct_answer_that_mentions_a_myth_to_refute_it_is_not_flagged(typed):
    from flashcourse.interview.interviewer import spot_myths

    assert spot_myths(typed, BANK) == []


def test_every_detector_recognises_its_own_claim_and_the_bank_validates_them():
    from flashcourse.interview.interviewer import detect_problems, myths_of

    assert len(myths_of(BANK)) >= 10 and detect_problems(BANK) == []
    broken = json.loads(json.dumps({"sections": [{"id": "s", "title": {"en": "S", "zh": "甲"}}],
                                    "entries": [SMALL_BANK["entries"][0]]}))
    broken["entries"][0]["section"] = "s"
    broken["entries"][0]["wrong_answers"][0]["detect"] = [{"all": ["never matches"]}]
    problems = detect_problems(bank_module._parse(broken))
    assert problems and "does not recognise its own claim in en" in problems[0]


def test_a_stated_myth_is_named_and_caps_the_score(tmp_path, small_bank):
    data = yaml.safe_load(small_bank.read_text(encoding="utf-8"))
    data["entries"][1]["wrong_answers"][0]["detect"] = [{"all": ["two is odd|二是奇数"]}]
    small_bank.write_text(yaml.safe_dump(data, allow_unicode=True, sort_keys=False), encoding="utf-8")
    child = _spawn(tmp_path, "--bank", str(small_bank), "--section", "alpha", "--short-only")
    child.expect("Question 1 of 1")
    child.send("one is one, and two is odd\r")
    child.expect_exact("Your answer states a known myth")
    child.expect_exact("Two is odd.")
    child.expect_exact("Two is even.")
    child.expect("30-second answer")
    child.expect_exact("Common wrong answers")  # the entry's own, shown after every answer
    child.expect_exact("One is zero.")
    child.expect_exact("[g] got it")
    child.sendline("g")
    child.expect_exact("counts at most as partly right (0.5)")
    child.expect("Follow-up 1")
    child.sendline("q")
    _end(child)
    assert _scores(tmp_path)["entries"]["one"]["last"] == 0.5


def test_follow_ups_count_toward_the_leitner_box():
    from datetime import date

    store = ScoreStore(Path("/nonexistent/scores.json"))
    store.record("a", 1.0, today=date(2026, 12, 1), follow_ups=[0.0, 0.0])  # main right, both follow-ups missed
    assert store.entries["a"]["box"] == 1 and store.entries["a"]["follow_ups"] == {"0": 0.0, "1": 0.0}
    store.record("b", 1.0, today=date(2026, 12, 1), follow_ups=[1.0, 0.5])  # mean 0.83: got it
    assert store.entries["b"]["box"] == 2
    assert store.new_on(date(2026, 12, 1)) == 2
    store.record("b", 1.0, today=date(2026, 12, 3))
    assert store.new_on(date(2026, 12, 3)) == 0  # asked again: not new


def test_the_mock_interview_goes_harder_after_good_answers_and_writes_a_debrief(tmp_path):
    from flashcourse.interview.interviewer import ease, next_mock_question

    rng = random.Random(0)
    first = next_mock_question(BANK.entries, set(), 0, None, rng)
    assert ease(first) == 0  # it opens with a common, basic question
    harder = next_mock_question(BANK.entries, {first["id"]}, 2, first["section"], rng)
    assert ease(harder) == 2 and harder["section"] != first["section"]
    child = _spawn(tmp_path, "--mock", "45", "--count", "2", "--short-only", "--seed", "0")
    child.expect_exact("Mock interview: 45 minutes")
    child.expect("Question 1")
    child.send("\r")
    child.expect_exact("Which points did you make?")
    child.sendline("a")  # every point: a good answer, so the follow-up comes
    child.expect("Follow-up 1")
    child.send("\r")
    child.expect_exact("[g] got it")
    child.sendline("m")  # missed: no deeper follow-up, the next question is asked
    child.expect("Question 2")
    child.send("\r")
    child.expect_exact("Which points did you make?")
    child.sendline("")  # none
    child.expect_exact("# Mock interview debrief")
    child.expect_exact("| 1 | ")
    child.expect_exact("## To review (below 75%)")
    child.expect_exact("## Verdict")
    child.expect("Debrief written to")
    _end(child)
    debriefs = list((tmp_path / "data" / "flashcourse").glob("mock-*.md"))
    assert len(debriefs) == 1 and "| 2 | " in debriefs[0].read_text(encoding="utf-8")
    session = _scores(tmp_path)["sessions"][-1]
    assert session["mode"] == "mock" and session["counts"] == {"questions": 2, "follow_ups": 1, "claims": 0}


def _readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    return [line.split("#")[0].strip() for block in re.findall(r"```bash\n(.*?)```", text, re.S)
            for line in block.splitlines() if line.startswith("flashcourse ")]


def test_the_readme_lists_quiz_commands():
    commands = _readme_commands()
    assert any("--stats" in c for c in commands) and any("--mock" in c for c in commands), commands


@pytest.mark.parametrize("command", _readme_commands())
def test_every_readme_quiz_command_works_as_written(tmp_path, command):
    """Run with no input (the quiz ends at its first prompt, as Ctrl-D would); exit status 0, no usage error."""
    env = dict(os.environ, XDG_DATA_HOME=str(tmp_path / "data"), COLUMNS="120", FLASHCOURSE_PLAIN="1",
               PYTHONPATH=child_pythonpath())  # run in tmp_path (the export writes there): this checkout
    result = subprocess.run([sys.executable, "-m", "flashcourse", *command.split()[1:]], capture_output=True,
                            text=True, env=env, cwd=tmp_path, stdin=subprocess.DEVNULL, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "usage:" not in result.stderr
