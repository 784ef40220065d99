"""``python -m flashcourse.grading release [--check]``: write exercises/ from solutions/ (or check they agree)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .release import release


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flashcourse.grading",
                                     description="Make the exercise notebooks from the solution notebooks.")
    commands = parser.add_subparsers(dest="command", required=True)
    release_cmd = commands.add_parser("release", help="write exercises/ from solutions/")
    release_cmd.add_argument("--solutions", type=Path, default=Path("solutions"))
    release_cmd.add_argument("--exercises", type=Path, default=Path("exercises"))
    release_cmd.add_argument("--check", action="store_true",
                             help="write nothing; fail if exercises/ differs from a fresh release")
    args = parser.parse_args(argv)
    if not any(args.solutions.glob("ex*.ipynb")):
        print(f"no solutions/ex*.ipynb under {args.solutions.resolve()}: run this from the repository root",
              file=sys.stderr)
        return 2
    names = release(args.solutions, args.exercises, check=args.check)
    if args.check:
        if names:
            print("out of date (run `python -m flashcourse.grading release`): " + ", ".join(names), file=sys.stderr)
            return 1
        print("exercises/ matches solutions/")
        return 0
    print(f"wrote {len(names)} exercise notebooks to {args.exercises}/: " + ", ".join(names))
    return 0


if __name__ == "__main__":
    sys.exit(main())
