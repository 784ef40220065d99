"""The terminal drill (``flashcourse quiz``) driven through a pseudo-terminal, its scores between sessions, and the
export of the bank (``flashcourse interview export``): Markdown in sync with docs/, an Anki deck."""

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

from flashcourse import interview
from flashcourse.interview import export
from flashcourse.interview.terminal import ScoreStore

ROOT = Path(__file__).resolve().parents[1]
BANK = interview.load()


def _order(section: str, seed: int) -> list[dict]:
    """The order the quiz asks a section in, for a seed (the same shuffle as flashcourse.interview.terminal)."""
    entries = BANK.in_section(section)
    random.Random(seed).shuffle(entries)
    return entries


def _spawn(tmp_path: Path, *args: str) -> pexpect.spawn:
    env = dict(os.environ, XDG_DATA_HOME=str(tmp_path / "data"), NO_COLOR="1", TERM="dumb", COLUMNS="200")
    child = pexpect.spawn(sys.executable, ["-m", "flashcourse", "quiz", *args], env=env, encoding="utf-8",
                          timeout=30, dimensions=(60, 200))
    return child


def _scores(tmp_path: Path) -> dict:
    return json.loads((tmp_path / "data" / "flashcourse" / "quiz_scores.json").read_text(encoding="utf-8"))


def test_a_session_shows_answers_on_request_scores_follow_ups_and_keeps_the_scores(tmp_path):
    first, second = _order("myths", seed=3)[:2]
    child = _spawn(tmp_path, "--section", "myths", "--seed", "3")
    child.expect("Question 1 of 8")
    child.expect_exact("[Enter] show the answer")
    assert "30-second answer" not in child.before  # hidden until asked
    child.sendline("")
    child.expect("30-second answer")
    child.expect_exact("[l] longer answer and evidence")
    child.sendline("l")
    child.expect("Longer answer")
    child.expect("Evidence")
    child.expect_exact("[g] got it")
    child.sendline("x")  # not a choice: asked again
    child.expect("Please type one of")
    child.sendline("g")
    child.expect("Follow-up 1")
    child.sendline("")
    child.expect_exact("[g] got it")
    child.sendline("m")  # missed the first follow-up
    child.expect("Follow-up 2")
    child.sendline("s")  # skip the rest of the follow-ups
    child.expect("Question 2 of 8")
    child.sendline("q")
    child.expect("This session")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0

    scores = _scores(tmp_path)
    assert set(scores["entries"]) == {first["id"]}
    assert scores["entries"][first["id"]]["last"] == 1.0
    assert scores["entries"][first["id"]]["follow_ups"] == {"0": 0.0}
    assert second["id"] not in scores["entries"]  # quit before answering it
    assert scores["sessions"][-1]["asked"] == 1 and scores["sessions"][-1]["points"] == 1.0

    # A second session asks only what was missed (here: a follow-up of the first question).
    child = _spawn(tmp_path, "--retry-missed", "--short-only")
    child.expect("Question 1 of 1")
    child.sendline("")
    child.expect("30-second answer")
    child.expect_exact("[g] got it")  # short-only: no offer of the longer answer
    assert "[l] longer answer" not in child.before
    child.sendline("g")
    for _ in first["follow_ups"]:
        child.expect("Follow-up")
        child.sendline("")
        child.expect_exact("[g] got it")
        child.sendline("g")
    child.expect("This session")
    child.expect(pexpect.EOF)
    assert ScoreStore.open(tmp_path / "data" / "flashcourse" / "quiz_scores.json").missed() == set()
    assert len(_scores(tmp_path)["sessions"]) == 2

    child = _spawn(tmp_path, "--retry-missed")
    child.expect("Nothing to retry")
    child.expect(pexpect.EOF)


def test_the_chinese_session_and_the_end_of_input(tmp_path):
    entry = _order("telling", seed=0)[0]
    child = _spawn(tmp_path, "--lang", "zh", "--section", "telling", "--seed", "0")
    child.expect("问题 1 / 6")
    child.expect_exact("[Enter] 显示答案")
    child.sendline("")
    child.expect("30 秒回答")
    child.expect_exact(re.split(r"[`*$]", entry["short"]["zh"])[0][:4])  # as rendered: Markdown marks are gone
    child.sendeof()  # Ctrl-D ends the session like q, and the scores are still written
    child.expect("本次练习")
    child.expect(pexpect.EOF)
    assert _scores(tmp_path)["sessions"][-1]["lang"] == "zh"


def test_an_unknown_section_is_refused_with_the_known_ones(tmp_path):
    result = subprocess.run([sys.executable, "-m", "flashcourse", "quiz", "--section", "nope"],
                            capture_output=True, text=True, env=dict(os.environ, XDG_DATA_HOME=str(tmp_path)))
    assert result.returncode == 2 and "myths" in result.stderr and "serving" in result.stderr


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


def test_export_anki_writes_one_note_per_entry(tmp_path):
    path = export.write_anki(tmp_path / "deck.apkg", lang="zh")
    with zipfile.ZipFile(path) as package:
        package.extract("collection.anki2", tmp_path)
    with sqlite3.connect(tmp_path / "collection.anki2") as db:
        fields = [row[0] for row in db.execute("select flds from notes")]
    assert len(fields) == len(BANK.entries)
    entry = BANK.entries[0]
    note = next(f for f in fields if f.startswith(entry["id"] + "\x1f"))
    assert "30 秒回答" in note and "<strong>证据：</strong>" in note


def test_export_anki_without_genanki_says_how_to_install_it(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "genanki", None)  # as if it were not installed
    with pytest.raises(SystemExit, match=r'pip install "flashcourse\[anki\]"'):
        export.write_anki(tmp_path / "deck.apkg")
