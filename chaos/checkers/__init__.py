"""The chaos checkers: ``check(history) -> dict`` runs them all, with an overall ``"valid"``.

Jepsen's protocol: a checker reads the whole history after the run (after the final heal and
drain) and says whether it is valid. One module per concern (``queue``: lost, duplicated,
unexpected items and atomicity; ``aborts``: aborted items come back; ``cluster``: convergence
and liveness; ``membership``: what the membership nemesis did, and every node a voting member of
one converged cluster at the end; ``limits``: a queue never holds more than its max_items, a spread
queue's fragment more than its share; ``security``: the intruder is refused everything its token
does not grant; ``ordering``), each
``check_x(...) -> dict`` with a ``"valid"`` key, counts and at most 20 sample offenders per
kind; ``model`` parses the history once for them. Ordering and the liveness timings are
metrics: only stuck transactions (and a node of the code under test killed after SIGTERM) make
liveness invalid, nothing makes ordering so; ``releases`` (runs with the ``upgrade`` nemesis)
says which release led when, and which lost values were lost after another release led. Liveness
measures the workload: the intruder's ops are left out of its availability (a refusal is the
cluster working).
``features`` holds poison, dead letters, delays, time to live and priorities to
docs/queue-features.md (the queue checkers let dead items leave through dead-letter queues and
expired or dropped ones vanish by rule; it checks those rules). ``headers``: every item seen
carries exactly the headers its value says it was enqueued with, and only headers are refused
for the feature level. ``backups``: every backup the ``backup`` nemesis restored held what its
own probe history says (chaos.backups). ``partitions``: no committed transaction spans two
partitions and every attempt to was refused; killed partition processes came back; a spread
queue's fragments hand out every acknowledged item exactly once, and a lone consumer drains them
all (``spread``, within it).
``python -m chaos.checkers history.jsonl`` re-checks a saved history.

Pure Python: imports nothing from rcq.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from chaos.checkers.aborts import check_aborted_return
from chaos.checkers.backups import check_backups
from chaos.checkers.cluster import check_convergence, check_liveness, check_releases, fault_windows
from chaos.checkers.features import check_features
from chaos.checkers.headers import check_headers
from chaos.checkers.limits import check_limits
from chaos.checkers.membership import check_membership
from chaos.checkers.model import QueueModel, build_model
from chaos.checkers.ordering import check_ordering
from chaos.checkers.partitions import check_partitions
from chaos.checkers.queue import check_atomicity, check_total_queue, lost_values
from chaos.checkers.security import check_security, is_security_op
from chaos.history import NEMESIS_PROCESS, read_history

__all__ = [
    "CHECKER_NAMES",
    "check",
    "check_aborted_return",
    "check_atomicity",
    "check_backups",
    "check_convergence",
    "check_features",
    "check_file",
    "check_headers",
    "check_limits",
    "check_liveness",
    "check_membership",
    "check_ordering",
    "check_partitions",
    "check_security",
    "check_total_queue",
    "fault_windows",
]

CHECKER_NAMES = ("total_queue", "atomicity", "aborted_return", "features", "headers", "convergence", "membership",
                 "liveness", "limits", "security", "ordering", "backups", "partitions")


def check(history: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Run every checker; ``valid`` is true only when all of them are."""
    history = list(history)
    model = build_model(history)  # parsed once, shared by the queue checkers
    results: dict[str, Any] = {
        "total_queue": check_total_queue(model),
        "atomicity": check_atomicity(model),
        "aborted_return": check_aborted_return(model),
        "features": check_features(model, history),
        "headers": check_headers(model),
        "convergence": check_convergence(history),
        "membership": check_membership(history),
        "liveness": check_liveness([op for op in history if not is_security_op(str(op.get("f")))]),
        "limits": check_limits(model, history),
        "security": check_security(model, history),
        "ordering": check_ordering(model),
        "backups": check_backups(history),
        "partitions": check_partitions(model, history),
    }
    results["releases"] = check_releases(history, _acknowledged_at_s(model, lost_values(model)))
    op_counts = Counter(f"{op.f}:{op.type}" for op in model.ops)
    # One-request enqueues (exactly once through the client's retry keys): the total-queue checker
    # finds one applied twice as a duplicated value; here, how many there were, by outcome.
    one_request = Counter(op.type for op in model.ops
                          if op.f == "enqueue" and isinstance(op.value, dict) and op.value.get("one_request"))
    return {
        "valid": all(results[name]["valid"] for name in CHECKER_NAMES),
        "invalid_checkers": [name for name in CHECKER_NAMES if not results[name]["valid"]],
        **results,
        "stats": {
            "history_lines": len(history),
            "client_ops": len(model.ops),
            "nemesis_lines": sum(1 for op in history if op.get("process") == NEMESIS_PROCESS),
            "ops_by_f_and_type": dict(sorted(op_counts.items())),
            "one_request_enqueues_by_type": dict(sorted(one_request.items())),
        },
    }


def _acknowledged_at_s(model: QueueModel, values: set[Any]) -> dict[Any, float]:
    """When each of ``values`` was enqueued for sure: its enqueue's completion (its invoke when the
    outcome is unknown, the earliest it can have been in)."""
    acknowledged: dict[Any, float] = {}
    for tx in model.enqueues:
        for value in tx.values:
            if value in values:
                done_s = tx.op.complete_time_s if tx.op.type == "ok" else None
                at_s = tx.op.invoke_time_s if done_s is None else done_s
                acknowledged[value] = min(acknowledged.get(value, float("inf")), at_s)
    return acknowledged


def check_file(path: str | Path) -> dict[str, Any]:
    return check(read_history(path))
