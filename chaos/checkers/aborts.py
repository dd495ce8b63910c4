"""Aborted work comes back: values handed out by transactions that never commit.

A ``dequeue-abort`` (dequeue then abort), a ``vanish`` (dequeue then walk
away: the server's deadline must abort it) and a ``peek`` (dequeue + abort
inside the client) all saw values come out of a queue in a transaction that
never commits — whatever the op's own outcome. Each such value must be seen
again, by another op that completes after this one was invoked (the final
drain sees everything left). A value never seen again was lost by the abort.
Seen again in a dead-letter queue counts (it died at its delivery limit, or
expired, when the abort returned it); a value the rules let vanish (expired
or dropped where there is no dead-letter queue) needs not come back.

How soon, as metrics: the time until the value was next seen, and its rank
near the head — ``head_rank`` when the workload recorded one, and an
observed rank: how many other values left the same queue between the abort
and the value's return, plus its place in the batch that returned it.

Pure Python: imports nothing from rcq.
"""

from __future__ import annotations

import bisect
import statistics
from typing import Any

from chaos.checkers.model import SAMPLE_SIZE_MAX, QueueModel, Sighting, build_model

RETURNING_FS = ("dequeue-abort", "vanish", "peek")


def check_aborted_return(history: Any) -> dict[str, Any]:
    model = history if isinstance(history, QueueModel) else build_model(history)
    out_of_queue = _ok_outflow_by_queue(model)
    not_returned: list[dict[str, Any]] = []
    returned_count: dict[str, int] = dict.fromkeys(RETURNING_FS, 0)
    handed_out_count: dict[str, int] = dict.fromkeys(RETURNING_FS, 0)
    time_to_return_s: list[float] = []
    head_ranks: list[int] = []
    observed_ranks: list[int] = []
    for sighting in model.sightings:
        op = sighting.op
        if op.f not in RETURNING_FS:
            continue
        handed_out_count[op.f] += 1
        back = _next_sighting(model, sighting)
        if back is None and sighting.value in model.may_vanish:
            continue  # expired or dropped where there is no dead-letter queue: allowed to leave no trace
        if back is None:
            not_returned.append({"value": sighting.value, "queue": sighting.queue, "f": op.f, "type": op.type,
                                 "process": op.process, "invoke_index": op.invoke_index})
            continue
        returned_count[op.f] += 1
        left_s = op.complete_time_s if op.complete_time_s is not None else op.invoke_time_s
        back_s = back.op.complete_time_s if back.op.complete_time_s is not None else back.op.invoke_time_s
        time_to_return_s.append(max(0.0, back_s - left_s))
        rank = _head_rank(op.value, sighting)
        if rank is not None:
            head_ranks.append(rank)
        observed_ranks.append(_observed_rank(out_of_queue, sighting, back))
    return {
        "valid": not not_returned,
        "handed_out_count": handed_out_count,
        "returned_count": returned_count,
        "not_returned_count": len(not_returned),
        "not_returned": not_returned[:SAMPLE_SIZE_MAX],
        "time_to_return_s": _distribution(time_to_return_s),
        "head_rank": _distribution(head_ranks),
        "observed_rank": _distribution(observed_ranks),
    }


def _next_sighting(model: QueueModel, sighting: Sighting) -> Sighting | None:
    """The first sighting of the value by another op completing after this op began."""
    after = sighting.op.invoke_index
    candidates = [
        other
        for other in model.sightings_by_value.get(sighting.value, ())
        if other.op is not sighting.op and other.order_index > after
    ]
    return min(candidates, key=lambda other: other.order_index, default=None)


def _head_rank(value: Any, sighting: Sighting) -> int | None:
    """The workload's ``head_rank``: one number for the op, a list by position, or a map by value."""
    rank = value.get("head_rank") if isinstance(value, dict) else None
    if isinstance(rank, list):
        rank = rank[sighting.position] if sighting.position < len(rank) else None
    elif isinstance(rank, dict):
        rank = rank.get(str(sighting.value))
    return rank if isinstance(rank, int) and not isinstance(rank, bool) else None


def _ok_outflow_by_queue(model: QueueModel) -> dict[str, list[int]]:
    """Per queue, the completion indexes (sorted) of the values committed out of it."""
    outflow: dict[str, list[int]] = {}
    for removal in model.removals:
        if removal.committed and removal.op.complete_index is not None:
            outflow.setdefault(removal.queue, []).append(removal.op.complete_index)
    for indexes in outflow.values():
        indexes.sort()
    return outflow


def _observed_rank(outflow: dict[str, list[int]], left: Sighting, back: Sighting) -> int:
    indexes = outflow.get(left.queue, [])
    start = left.op.complete_index if left.op.complete_index is not None else left.op.invoke_index
    between = bisect.bisect_left(indexes, back.op.invoke_index) - bisect.bisect_right(indexes, start)
    return max(0, between) + back.position


def _distribution(samples: list[float] | list[int]) -> dict[str, Any]:
    if not samples:
        return {"count": 0}
    ordered = sorted(samples)
    return {
        "count": len(ordered),
        "min": ordered[0],
        "median": statistics.median(ordered),
        "p99": ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))],
        "max": ordered[-1],
        "mean": round(statistics.fmean(ordered), 6),
    }
