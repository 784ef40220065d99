"""The ``flashcourse`` command (also ``python -m flashcourse``).

- ``flashcourse grade SUBMISSION.ipynb... --out DIR`` grades notebooks in batch (docs/GRADING.md). Grading runs
  student code: run it in a container or a dedicated grading account.
- ``flashcourse interview quiz [--lang zh|en] [--mode answer|spot-the-error] [--count N] [--due] [--timer SECONDS]
  [--section S] [--tag TAG]... [--short-only] [--retry-missed] [--seed N] [--new N] [--mock MINUTES] [--stats]``
  drills the interview questions in a terminal, answer first and against a clock, with spaced repetition
  (:mod:`flashcourse.interview.terminal`); ``--mock 45`` is a mock interview with a written debrief.
- ``flashcourse interview stats [--lang zh|en]`` shows the scores per section, the sessions and the review boxes.
- ``flashcourse interview export --format md|anki --lang zh|en [--out PATH]`` writes the questions as Markdown or
  an Anki deck (:mod:`flashcourse.interview.export`).
- ``flashcourse quiz ...`` is the older spelling of ``interview quiz``, kept.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="flashcourse", description="The FlashAttention course's tools.")
    commands = parser.add_subparsers(dest="command", required=True)
    grade = commands.add_parser(
        "grade", help="grade exercise notebooks in batch",
        description="Run each submission in its own process with a time limit, call its functions on graded "
                    "inputs from --seed, and score what they return against the reference. Writes "
                    "DIR/grades.csv (with flags), DIR/gradebook.csv (one row per student), DIR/grades.json and "
                    "DIR/feedback/. This runs student code: use a "
                    "container or a dedicated grading account.")
    grade.add_argument("submissions", nargs="+", type=Path, help="notebooks (.ipynb), one per student")
    grade.add_argument("--out", type=Path, required=True, help="folder for grades and feedback")
    grade.add_argument("--seed", type=int, default=None,
                       help="seed of the graded inputs (default: a random one, recorded in grades.json)")
    grade.add_argument("--timeout", type=float, default=300, help="seconds per notebook (default 300)")
    grade.add_argument("--exercise", default=None,
                       help="the exercise, e.g. ex01_naive_attention or ex01 (default: from each file's name)")
    grade.add_argument("--solutions", type=Path, default=None,
                       help="folder of solution notebooks whose check cells (with hidden tests) replace the "
                            "submission's (default: ./solutions if present)")
    grade.add_argument("--jobs", type=int, default=1, help="submissions graded at once (default 1)")

    quiz = commands.add_parser(
        "quiz", help="drill the interview questions in a terminal (the same as: flashcourse interview quiz)",
        description=QUIZ_DESCRIPTION)
    _add_quiz_options(quiz)

    interview = commands.add_parser("interview", help="the interview question bank: quiz, stats, export")
    interview_commands = interview.add_subparsers(dest="interview_command", required=True)
    _add_quiz_options(interview_commands.add_parser("quiz", help="drill the interview questions in a terminal",
                                                    description=QUIZ_DESCRIPTION))
    stats = interview_commands.add_parser(
        "stats", help="show the quiz's scores per section, the sessions and the review boxes",
        description="Show the last score of each question per section, the latest sessions, how many questions "
                    "each Leitner box holds and how many are due today.")
    stats.add_argument("--lang", choices=("en", "zh"), default="en", help="language (default en)")
    stats.add_argument("--bank", type=Path, default=None, metavar="FILE",
                       help="a question bank of your own, in the format of the course's questions.yaml")
    export = interview_commands.add_parser(
        "export", help="write the questions as Markdown or an Anki deck",
        description="Markdown goes to --out or to standard output; an Anki deck (needs genanki: "
                    'pip install "flashcourse[anki]") goes to --out or ./flashcourse-interview-LANG.apkg.')
    export.add_argument("--format", choices=("md", "anki"), required=True)
    export.add_argument("--lang", choices=("en", "zh"), default="en", help="language (default en)")
    export.add_argument("--out", type=Path, default=None, help="output file")

    args = parser.parse_args(argv)
    if args.command == "quiz":
        return _quiz(parser, args)
    if args.command == "interview" and args.interview_command == "export":
        return _export(args)
    if args.command == "interview":
        args.stats = args.stats if args.interview_command == "quiz" else True
        return _quiz(parser, args)
    from .grading.batch import NothingGradedError, grade_all

    try:
        results = grade_all(args.submissions, args.out, seed=args.seed, timeout=args.timeout,
                            exercise=args.exercise, solutions=args.solutions, jobs=args.jobs)
    except NothingGradedError as error:
        print(f"flashcourse grade: nothing graded: {error}", file=sys.stderr)
        return 2
    print(f"wrote {args.out / 'grades.csv'}, {args.out / 'gradebook.csv'}, {args.out / 'grades.json'} and "
          f"{len(results)} feedback file(s) in "
          f"{args.out / 'feedback'}")
    return 0


QUIZ_DESCRIPTION = (
    "Ask the interview questions as an interviewer would, common and basic ones first: you answer first (type "
    "it, or say it aloud and press Enter) while a clock runs, then the 30-second answer is shown with the points "
    "a good answer makes and the common wrong answers, the longer one and its evidence on request, and you tick "
    "the points you made; each follow-up the same way (scored got it / partly / missed), and it counts in the "
    "session's score and the question's review box. A known myth in a typed answer is named. --mode "
    "spot-the-error mixes true and false claims for you to judge and correct. --mock 45 is a 45-minute mock "
    "interview with a written debrief. Scores are kept in $XDG_DATA_HOME/flashcourse/ (default "
    "~/.local/share/flashcourse/), with a Leitner box per question: one well answered comes back after 2, 4, 8, "
    "16 days, one missed the next day; --due asks what is due today, then new questions (10 a day, --new). Runs "
    "in plain text where rich is not installed.")


def _add_quiz_options(quiz: argparse.ArgumentParser) -> None:
    quiz.add_argument("--lang", choices=("en", "zh"), default="en", help="language (default en)")
    quiz.add_argument("--mode", choices=("answer", "spot-the-error"), default="answer",
                      help="answer the questions (default), or spot the error in the bank's wrong answers")
    quiz.add_argument("--count", type=_count, default=None, metavar="N",
                      help="stop after N questions (wrong claims in spot-the-error mode); default: all")
    quiz.add_argument("--due", action="store_true",
                      help="only the questions due for review today (spaced repetition: Leitner boxes)")
    quiz.add_argument("--timer", type=_seconds, default=None, metavar="SECONDS",
                      help="seconds per answer: the clock counts down and says when the time is up "
                           "(default: it counts up)")
    quiz.add_argument("--section", default=None, help="only this section (e.g. myths, serving, telling)")
    quiz.add_argument("--tag", action="append", default=None, metavar="TAG",
                      help="only entries with this tag (repeatable; two tags of one kind are alternatives): "
                           "freq:common|freq:occasional|freq:rare, level:basic|level:intermediate|level:advanced")
    quiz.add_argument("--short-only", action="store_true", help="30-second answers only, no longer answers")
    quiz.add_argument("--retry-missed", action="store_true",
                      help="only what was last scored partly or missed (a question or one of its follow-ups; in "
                           "spot-the-error mode, a wrong claim)")
    quiz.add_argument("--seed", type=int, default=None, help="seed of the order (default: a new order each time)")
    quiz.add_argument("--bank", type=Path, default=None, metavar="FILE",
                      help="a question bank of your own, in the format of the course's questions.yaml")
    quiz.add_argument("--new", type=_count, default=None, metavar="N", dest="new_per_day",
                      help="with --due: at most N new questions a day, common and basic first (default 10)")
    quiz.add_argument("--mock", type=_minutes, default=None, metavar="MINUTES",
                      help="a mock interview of MINUTES minutes: main questions harder after good answers, "
                           "follow-ups deeper while you answer well, a written debrief at the end")
    quiz.add_argument("--stats", action="store_true",
                      help="show the results per section, the history of sessions and the review boxes, then stop "
                           "(the same as: flashcourse interview stats)")


def _count(value: str) -> int:
    count = int(value)
    if count < 1:
        raise argparse.ArgumentTypeError(f"expected a number of questions of 1 or more, got {value!r}")
    return count


def _minutes(value: str) -> float:
    minutes = float(value)
    if not minutes > 0:
        raise argparse.ArgumentTypeError(f"expected a number of minutes above 0, got {value!r}")
    return minutes


def _seconds(value: str) -> float:
    seconds = float(value)
    if not seconds > 0:
        raise argparse.ArgumentTypeError(f"expected a number of seconds above 0, got {value!r}")
    return seconds


def _quiz(parser: argparse.ArgumentParser, args) -> int:
    from .interview import bank
    from .interview.terminal import TAG_VOCABULARY, run_quiz, show_stats

    if args.bank is not None and not args.bank.is_file():
        parser.error(f"--bank {args.bank}: no such file")
    import yaml

    try:
        question_bank = bank.load(args.bank)
    except (ValueError, KeyError, TypeError, yaml.YAMLError) as error:
        parser.error(f"--bank {args.bank}: not a question bank ({error})")
    if getattr(args, "section", None) is not None and args.section not in question_bank.sections:
        parser.error(f"--section {args.section!r}: expected one of {', '.join(question_bank.sections)}")
    for tag in getattr(args, "tag", None) or []:
        if tag not in TAG_VOCABULARY:
            parser.error(f"--tag {tag!r}: expected one of {', '.join(TAG_VOCABULARY)}")
    if args.stats:
        return show_stats(lang=args.lang, question_bank=question_bank)
    return run_quiz(lang=args.lang, mode=args.mode, section=args.section, tags=args.tag,
                    short_only=args.short_only, retry_missed=args.retry_missed, seed=args.seed, timer=args.timer,
                    count=args.count, due=args.due, mock=args.mock, question_bank=question_bank,
                    **({"new_per_day": args.new_per_day} if args.new_per_day else {}))


def _export(args) -> int:
    from .interview import export

    if args.format == "md":
        text = export.render_document(lang=args.lang)
        if args.out is None:
            sys.stdout.write(text)
        else:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(text, encoding="utf-8")
            print(f"wrote {args.out}")
        return 0
    path = export.write_anki(args.out or Path(f"flashcourse-interview-{args.lang}.apkg"), lang=args.lang)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
