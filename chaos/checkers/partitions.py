"""The partitions checker: no committed transaction spans two partitions, every attempt to make one
was refused, and every killed partition process came back (docs/partitions.md).

A run with ``--partitions`` places its queues over the partitions (``configure`` ops whose value
has ``partitions``; chaos.generator.Topology). Transactions over two queues (an enqueue with two
writes, a move) then sometimes name queues of two partitions: the client or the server must
refuse them before anything commits, with ``cross_partition_transaction``. A **spread** queue
(``partitions`` naming several) lives in each of them, a fragment in each: a transaction touching
it runs in one of them, which the op records (``partition``, chaos.executor) in a run with
spread queues. A transaction *fits* a partition when every queue it touched lives there.

**Invalid** when:

* an ``ok`` transaction (enqueue, move) touched queues of two partitions (``spanning``; a move
  that took nothing touched its source alone): it does not fit the partition it ran in (when
  recorded), or no partition holds all its queues;
* a refusal ``cross_partition_transaction`` came for a transaction that fits the partition it ran
  in (when recorded), or, not recorded, for queues of one partition and none spread
  (``wrongly_refused``): the routing got a placement wrong;
* a ``kill-partition-process`` fault stopped without its process restarted (``not_restarted``;
  a node that went down meanwhile restarts its processes itself, and is not counted);
* a ``partition-lifecycle`` fault (a partition created during the run, a queue placed in it, items
  committed one request each) whose queue, deleted when the fault stopped, removed fewer items
  than were acknowledged (``lifecycle_lost``: an acknowledged commit lost in a new partition) or
  more than were sent (``lifecycle_extra``). A delete that did not answer leaves it unknown.

* the spread checker (chaos.checkers.spread, under ``spread``) finds a spread queue's fragments
  losing, duplicating or inventing an item, an item out of a fragment it was never put into, or
  a fragment a lone consumer did not drain within the starvation probe's bound.

Counts: the attempts across partitions and how they ended (``cross_partition``: refused, or info
when the run's own timeout or a fault ended them first), the acknowledged values enqueued into each
partition (``acknowledged_by_partition``: with the total-queue checker's 0 lost and 0 duplicated
per queue, 0 per partition; a value of a one-request enqueue into a spread queue under
``unknown``), and the kills. ``placement`` maps each queue placed in one partition to it,
``spread_placement`` each spread queue to its partitions. A run without partitions:
``checked: false``, valid.

Pure Python: imports nothing from rcq.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from chaos.checkers.model import SAMPLE_SIZE_MAX, QueueModel
from chaos.checkers.spread import UNKNOWN, check_spread, ran_in
from chaos.history import NEMESIS_PROCESS, PairedOp

REFUSAL = "cross_partition_transaction"
P0 = "p0"


def placements(model: QueueModel) -> dict[str, tuple[str, ...]]:
    """queue -> the partitions its ``configure`` op placed it in (several: spread)."""
    placed: dict[str, tuple[str, ...]] = {}
    for queue, settings in model.settings.items():
        partitions = settings.get("partitions")
        if isinstance(partitions, list) and partitions:
            placed[queue] = tuple(str(p) for p in partitions)
    return placed


def _fits(op: PairedOp, queues: list[str], placed: dict[str, tuple[str, ...]]) -> bool | None:
    """Whether one partition holds every queue of ``queues``: the one ``op`` ran in, when it
    recorded it; else any (None: not known, a spread queue among them and no partition recorded)."""
    lives = [set(placed.get(q, (P0,))) for q in queues]
    partition = ran_in(op)
    if partition is not None:
        return all(partition in where for where in lives)
    common = set.intersection(*lives) if lives else {P0}
    if not common:
        return False
    return True if all(len(where) == 1 for where in lives) else None


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
        if op.type == "ok" and op.f == "enqueue" and isinstance(op.value, dict):
            for write in op.value.get("writes") or []:
                where = placed.get(str(write.get("queue")), (P0,))
                partition = where[0] if len(where) == 1 else (ran_in(op) or UNKNOWN)
                acknowledged[partition] += len(write.get("values") or [])
        fits = _fits(op, queues, placed) if queues else True
        if fits is False:
            attempts[op.type if op.type != "fail" else ("refused" if op.error == REFUSAL else "fail")] += 1
            if op.type == "ok":
                spanning.append({"f": op.f, "queues": queues, "partition": ran_in(op), "value": op.value})
        elif op.error == REFUSAL and fits is True:
            wrongly_refused.append({"f": op.f, "queues": queues, "partition": ran_in(op), "error": op.error})
        elif op.error == REFUSAL:  # a spread queue's fragment not recorded: cannot tell
            attempts["refused_unjudged"] += 1
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
    spread = check_spread(model, history, placed)
    return {
        "valid": (not spanning and not wrongly_refused and not not_restarted and not lost and not extra
                  and spread["valid"]),
        "checked": True,
        "placement": {q: where[0] for q, where in sorted(placed.items()) if len(where) == 1},
        "spread_placement": {q: list(where) for q, where in sorted(placed.items()) if len(where) > 1},
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
        "spread": spread,
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
