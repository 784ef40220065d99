"""What makes the drill act like an interviewer, shared by the terminal quiz and lesson 10's widget.

- :func:`spot_myths` recognises the bank's known myths and common wrong answers in a typed answer, by the key
  phrases of their ``detect`` field (both languages), so the drill can name the myth the candidate just said.
- :func:`ease` and :func:`round_order` put common, basic questions first (an interviewer opens with those).
- :func:`true_or_false_items` mixes true claims (an entry's points) with false ones (its wrong answers), so
  spot-the-error trains spotting, not only correcting.
- :func:`next_mock_question` picks the next main question of a mock interview: harder after a good answer,
  easier after a weak one.

A ``detect`` field (on a myth entry, or on one of an entry's ``wrong_answers``) is a list of alternatives; each
alternative is a mapping with ``all`` (regular expressions that must all occur) and optionally ``none``
(expressions that clear the answer: a correct answer that mentions the myth to refute it). Matching is on the
answer normalised by NFKC (full-width digits and ``²`` become ``2``) and lower-cased.
"""

from __future__ import annotations

import random
import re
import unicodedata
from dataclasses import dataclass

from . import bank as bank_module

__all__ = ["Myth", "detect_problems", "ease", "myths_of", "next_mock_question", "normalise", "round_order",
           "spot_myths", "true_or_false_items"]

# An answer that states a known myth scores at most "partly": said in an interview, it costs the question.
MYTH_CAP = 0.5


@dataclass(frozen=True)
class Myth:
    """A myth or wrong answer the bank can recognise: the entry that holds it, the claim and its correction
    (bilingual mappings). ``index`` is the wrong answer's position, or None for a myth entry (its question is the
    claim, its 30-second answer the correction)."""

    entry_id: str
    index: int | None
    claim: dict
    correction: dict
    detect: tuple


def normalise(text: str) -> str:
    """The text matched against ``detect``: NFKC (full-width forms and superscripts folded), lower case."""
    return unicodedata.normalize("NFKC", text).lower()


def myths_of(question_bank: bank_module.Bank) -> list[Myth]:
    """Every myth and wrong answer of the bank that carries a ``detect`` field, in bank order."""
    found = []
    for entry in question_bank.entries:
        if entry.get("detect"):
            found.append(Myth(entry["id"], None, entry["question"], entry["short"], tuple(entry["detect"])))
        for index, wrong in enumerate(entry.get("wrong_answers") or []):
            if wrong.get("detect"):
                found.append(Myth(entry["id"], index, wrong["claim"], wrong["correction"], tuple(wrong["detect"])))
    return found


def _matches(alternative: dict, text: str) -> bool:
    return (all(re.search(pattern, text) for pattern in alternative.get("all", []))
            and not any(re.search(pattern, text) for pattern in alternative.get("none", [])))


def spot_myths(typed: str, question_bank: bank_module.Bank) -> list[Myth]:
    """The bank's myths and wrong answers that ``typed`` states (by their key phrases), each once."""
    if not typed.strip():
        return []
    text = normalise(typed)
    return [myth for myth in myths_of(question_bank) if any(_matches(alt, text) for alt in myth.detect)]


def detect_problems(question_bank: bank_module.Bank) -> list[str]:
    """What is wrong with the bank's ``detect`` fields: the shape, expressions that do not compile, and a myth
    that does not recognise its own claim (in either language) — a detector that cannot fire is a defect."""
    problems = []
    for entry in question_bank.entries:
        holders = [(f"entry {entry['id']} detect", entry, entry.get("question"))]
        holders += [(f"entry {entry['id']} wrong_answers[{i}].detect", wrong, wrong.get("claim"))
                    for i, wrong in enumerate(entry.get("wrong_answers") or [])]
        for where, holder, claim in holders:
            detect = holder.get("detect")
            if detect is None:
                continue
            if not isinstance(detect, list) or not all(isinstance(a, dict) and a.get("all") for a in detect):
                problems.append(f"{where}: expected a list of mappings, each with a non-empty 'all' list")
                continue
            try:
                for alternative in detect:
                    for pattern in [*alternative["all"], *alternative.get("none", [])]:
                        re.compile(pattern)
            except re.error as error:
                problems.append(f"{where}: {error}")
                continue
            for lang in bank_module.LANGUAGES:
                if not any(_matches(alt, normalise(claim[lang])) for alt in detect):
                    problems.append(f"{where}: does not recognise its own claim in {lang}: {claim[lang]!r}")
    return problems


# ------------------------------------------------------------------------------------------- order
def ease(entry: dict) -> int:
    """How early an entry is asked: 0 for a common, basic question, up to 4 for a rare, advanced one (the sum of
    the positions of its ``freq:`` and ``level:`` tags in the vocabulary); an untagged entry comes last."""
    tags = bank_module.tags_of(entry)
    rank = 0
    for kind, values in bank_module.TAG_KINDS.items():
        found = [values.index(t.split(":", 1)[1]) for t in tags if t.startswith(f"{kind}:")]
        if not found:
            return 2 * len(bank_module.TAG_KINDS)
        rank += found[0]
    return rank


def round_order(entries: list[dict], rng: random.Random) -> list[dict]:
    """The entries in the order a round asks them: by :func:`ease`, shuffled within each value."""
    shuffled = list(entries)
    rng.shuffle(shuffled)
    return sorted(shuffled, key=ease)  # sorted() is stable: the shuffle survives within each step


def true_or_false_items(entries: list[dict], rng: random.Random) -> list[tuple[dict, bool, int]]:
    """Claims to judge, shuffled: ``(entry, is_true, index)``, every wrong answer (false, ``index`` into
    ``wrong_answers``) and as many true claims drawn from the entries' points (``index`` into ``points``)."""
    false = [(e, False, i) for e in entries for i in range(len(e.get("wrong_answers") or []))]
    true = [(e, True, i) for e in entries for i in range(len(e.get("points") or []))]
    rng.shuffle(true)
    items = false + true[:len(false)]
    rng.shuffle(items)
    return items


def next_mock_question(entries: list[dict], asked: set[str], level: int, last_section: str | None,
                       rng: random.Random) -> dict | None:
    """The next main question of a mock interview: one not asked yet whose :func:`ease` is nearest ``level``
    (the interviewer raises it after a good answer, lowers it after a weak one), from another section than the
    last where one is as near; None when every entry was asked."""
    left = [e for e in entries if e["id"] not in asked]
    if not left:
        return None
    rng.shuffle(left)
    return min(left, key=lambda e: (abs(ease(e) - level), e["section"] == last_section))
