"""Check a history: ``check(history) -> dict`` with an overall ``"valid"``.

Jepsen's protocol: a checker reads the whole history after the run (after
the final heal and drain) and says whether it is valid. The checkers live in
``chaos/checkers/``; this module runs them all on one parsed history and
combines their verdicts. Ordering and the liveness timings are metrics:
only stuck transactions make liveness invalid, nothing makes ordering so.

Pure Python: imports nothing from rcq.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from chaos.checkers.aborts import check_aborted_return
from chaos.checkers.cluster import check_convergence, check_liveness, fault_windows
from chaos.checkers.model import build_model
from chaos.checkers.ordering import check_ordering
from chaos.checkers.queue import check_atomicity, check_total_queue
from chaos.history import NEMESIS_PROCESS, read_history

__all__ = [
    "CHECKER_NAMES",
    "check",
    "check_aborted_return",
    "check_atomicity",
    "check_convergence",
    "check_file",
    "check_liveness",
    "check_ordering",
    "check_total_queue",
    "fault_windows",
]

CHECKER_NAMES = ("total_queue", "atomicity", "aborted_return", "convergence", "liveness", "ordering")


def check(history: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Run every checker; ``valid`` is true only when all of them are."""
    history = list(history)
    model = build_model(history)  # parsed once, shared by the queue checkers
    results: dict[str, Any] = {
        "total_queue": check_total_queue(model),
        "atomicity": check_atomicity(model),
        "aborted_return": check_aborted_return(model),
        "convergence": check_convergence(history),
        "liveness": check_liveness(history),
        "ordering": check_ordering(model),
    }
    op_counts = Counter(f"{op.f}:{op.type}" for op in model.ops)
    return {
        "valid": all(results[name]["valid"] for name in CHECKER_NAMES),
        "invalid_checkers": [name for name in CHECKER_NAMES if not results[name]["valid"]],
        **results,
        "stats": {
            "history_lines": len(history),
            "client_ops": len(model.ops),
            "nemesis_lines": sum(1 for op in history if op.get("process") == NEMESIS_PROCESS),
            "ops_by_f_and_type": dict(sorted(op_counts.items())),
        },
    }


def check_file(path: str | Path) -> dict[str, Any]:
    return check(read_history(path))


def main(argv: list[str] | None = None) -> int:
    """``python -m chaos.checker history.jsonl``: re-check a saved history; exit 1 when invalid."""
    import argparse

    from chaos.report import summary_text

    parser = argparse.ArgumentParser(prog="python -m chaos.checker", description=main.__doc__)
    parser.add_argument("history", type=Path, help="a history.jsonl written by a chaos run")
    parser.add_argument("--seed", default=None, help="the run's seed, shown in the summary")
    arguments = parser.parse_args(argv)
    results = check_file(arguments.history)
    print(summary_text(results, arguments.seed, history=arguments.history.name), end="")
    return 0 if results["valid"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
