"""The partitions checker: no committed transaction spans two partitions, every attempt to make one
was refused, and every killed partition process came back (docs/partitions.md).

A run with ``--partitions`` places its queues over the partitions (``configure`` ops whose value
has ``partitions``; chaos.generator.Topology). Transactions over two queues (an enqueue with two
writes, a move) then sometimes name queues of two partitions: the client or the server must
refuse them before anything commits, with ``cross_partition_transaction``.

**Invalid** when:

* an ``ok`` transaction (enqueue, move) touched queues of two partitions (``spanning``; a move
  that took nothing touched its source alone);
* a refusal ``cross_partition_transaction`` came for queues that all live in one partition
  (``wrongly_refused``): the routing got a placement wrong;
* a ``kill-partition-process`` fault stopped without its process restarted (``not_restarted``;
  a node that went down meanwhile restarts its processes itself, and is not counted);
* a ``partition-lifecycle`` fault (a partition created during the run, a queue placed in it, items
  committed one request each) whose queue, deleted when the fault stopped, removed fewer items
  than were acknowledged (``lifecycle_lost``: an acknowledged commit lost in a new partition) or
  more than were sent (``lifecycle_extra``). A delete that did not answer leaves it unknown.

Counts: the attempts across partitions and how they ended (``cross_partition``: refused, or info
when the run's own timeout or a fault ended them first), the acknowledged values enqueued into each
partition (``acknowledged_by_partition``: with the total-queue checker's 0 lost and 0 duplicated
per queue, 0 per partition), and the kills. A run without partitions: ``checked: false``, valid.

Pure Python: imports nothing from rcq.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from chaos.checkers.model import SAMPLE_SIZE_MAX, QueueModel
from chaos.history import NEMESIS_PROCESS

REFUSAL = "cross_partition_transaction"


def placements(model: QueueModel) -> dict[str, str]:
    """queue -> the partition its ``configure`` op placed it in."""
    placed: dict[str, str] = {}
    for queue, settings in model.settings.items():
        partitions = settings.get("partitions")
        if isinstance(partitions, list) and partitions:
            placed[queue] = str(partitions[0])
    return placed


def _queues_of(f: str, value: Any) -> list[str]:
    if not isinstance(value, dict):
        return []
    if f == "enqueue":
        return [str(w.get("queue")) for w in value.get("writes") or [] if isinstance(w, dict)]
    if f == "move":  # a move that took nothing enqueued nothing: its transaction touched its source alone
        return [str(value.get("from"))] + ([str(value.get("to"))] if value.get("values") else [])
    return []


def check_partitions(model: QueueModel, history: list[dict[str, Any]]) -> dict[str, Any]:
    placed = placements(model)
    if not placed:
        return {"valid": True, "checked": False}
    spanning: list[dict[str, Any]] = []
    wrongly_refused: list[dict[str, Any]] = []
    attempts: Counter[str] = Counter()
    acknowledged: Counter[str] = Counter()
    for op in model.ops:
        queues = _queues_of(op.f, op.value)
        partitions = {placed.get(q, "p0") for q in queues}
        if op.type == "ok" and op.f == "enqueue" and isinstance(op.value, dict):
            for write in op.value.get("writes") or []:
                acknowledged[placed.get(str(write.get("queue")), "p0")] += len(write.get("values") or [])
        if len(partitions) > 1:
            attempts[op.type if op.type != "fail" else ("refused" if op.error == REFUSAL else "fail")] += 1
            if op.type == "ok":
                spanning.append({"f": op.f, "queues": queues, "value": op.value})
        elif op.error == REFUSAL:
            wrongly_refused.append({"f": op.f, "queues": queues, "error": op.error})
    kills = [op.get("value") or {} for op in history
             if op.get("process") == NEMESIS_PROCESS and op.get("f") == "kill-partition-process"]
    started = [k for k in kills if k.get("phase") == "start"]
    stopped = [k for k in kills if k.get("phase") == "stop"]
    not_restarted = [k for k in stopped if k.get("restarted") is False]
    lifecycles = _joined(history, "partition-lifecycle")
    checked_lifecycles = [c for c in lifecycles if isinstance(c.get("removed"), int)]
    lost = [c for c in checked_lifecycles if c["removed"] < int(c.get("acked") or 0)]
    extra = [c for c in checked_lifecycles
             if c["removed"] > int(c.get("acked") or 0) + int(c.get("unknown") or 0)]
    pauses = [v for v in _nemesis(history) if str(v.get("f", "")).startswith("pause-partition")]
    moves = _joined(history, "move-leaders")
    return {
        "valid": not spanning and not wrongly_refused and not not_restarted and not lost and not extra,
        "checked": True,
        "placement": dict(sorted(placed.items())),
        "cross_partition": dict(sorted(attempts.items())),
        "spanning_count": len(spanning),
        "spanning": spanning[:SAMPLE_SIZE_MAX],
        "wrongly_refused_count": len(wrongly_refused),
        "wrongly_refused": wrongly_refused[:SAMPLE_SIZE_MAX],
        "acknowledged_by_partition": dict(sorted(acknowledged.items())),
        "partition_processes_killed": len(started),
        "partition_processes_restarted": sum(1 for k in stopped if k.get("restarted") is True),
        "not_restarted": not_restarted[:SAMPLE_SIZE_MAX],
        "partition_processes_paused": sum(1 for v in pauses if v.get("phase") == "start"),
        "leaders_moved_by_hand": sum(len(m.get("moved") or []) for m in moves),
        "rebalance_moves": sum(len(m.get("moves") or []) for m in moves),
        "rebalance_errors": sum(1 for m in moves if m.get("rebalance_error")),
        "lifecycles": len(lifecycles),
        "lifecycles_checked": len(checked_lifecycles),
        "lifecycle_acknowledged": sum(int(c.get("acked") or 0) for c in checked_lifecycles),
        "lifecycle_lost": lost[:SAMPLE_SIZE_MAX],
        "lifecycle_extra": extra[:SAMPLE_SIZE_MAX],
    }


def _nemesis(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each nemesis line's value, with its ``f``."""
    return [{**op["value"], "f": op.get("f")} for op in history
            if op.get("process") == NEMESIS_PROCESS and isinstance(op.get("value"), dict)]


def _joined(history: list[dict[str, Any]], f: str) -> list[dict[str, Any]]:
    """Each fault ``f``: its start line's values with its stop line's (matched by ``id``)."""
    faults: dict[Any, dict[str, Any]] = {}
    for value in _nemesis(history):
        if value["f"] == f and value.get("phase") in ("start", "stop") and "id" in value:
            faults.setdefault(value["id"], {}).update({k: v for k, v in value.items() if k != "phase"})
    return list(faults.values())
