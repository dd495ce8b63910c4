"""``python -m chaos.checkers history.jsonl``: re-check a saved history; exit 1 when invalid.

Must not import: anything of rcq.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from chaos.checkers import check_file
from chaos.checkers.report import summary_text


def main(argv: list[str] | None = None) -> int:
    """``python -m chaos.checkers history.jsonl``: re-check a saved history; exit 1 when invalid."""
    parser = argparse.ArgumentParser(prog="python -m chaos.checkers", description=main.__doc__)
    parser.add_argument("history", type=Path, help="a history.jsonl written by a chaos run")
    parser.add_argument("--seed", default=None, help="the run's seed, shown in the summary")
    arguments = parser.parse_args(argv)
    results = check_file(arguments.history)
    print(summary_text(results, arguments.seed, history=arguments.history.name), end="")
    return 0 if results["valid"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
