"""The ``flashcourse`` command (also ``python -m flashcourse``). ``flashcourse grade SUBMISSION.ipynb... --out DIR``
grades notebooks in batch (docs/GRADING.md). Grading runs student code: run it in a container or a dedicated
grading account."""

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
                    "DIR/grades.csv, DIR/grades.json and DIR/feedback/. This runs student code: use a "
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
    args = parser.parse_args(argv)
    from .grading.batch import DuplicateSubmissionError, grade_all

    try:
        results = grade_all(args.submissions, args.out, seed=args.seed, timeout=args.timeout,
                            exercise=args.exercise, solutions=args.solutions, jobs=args.jobs)
    except DuplicateSubmissionError as error:
        print(f"flashcourse grade: nothing graded: {error}", file=sys.stderr)
        return 2
    print(f"wrote {args.out / 'grades.csv'}, {args.out / 'grades.json'} and {len(results)} feedback file(s) in "
          f"{args.out / 'feedback'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
