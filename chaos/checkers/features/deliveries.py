"""The features checks of deliveries: priorities an item's writes gave it, delivery counts within
the queue's limit and never falling, values committed out for good no more often than enqueued and
never seen after, and their statistics.

Pure Python: imports nothing from rcq, nothing of the workload.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Callable, Hashable
from typing import Any

from chaos.checkers.features.given import Findings, Given, distribution, item_key, where
from chaos.checkers.model import QueueModel, Sighting


def check_priorities(model: QueueModel, given: Given, findings: Findings) -> dict[int, list[int]]:
    """Every item's priority one its writes into that queue (or a move: 0) gave it; a dead letter's,
    one its source gave it (``wrong_priority``). Returns the priorities of each op's batch, in
    order, on queues with priorities (for the inversions statistic)."""
    batches: dict[int, list[int]] = defaultdict(list)
    for sighting in model.sightings:
        queue, item, dead = sighting.queue, sighting.item, sighting.dead_letter
        dead_letter = queue in given.dead_letter_queues
        if item is None or (dead_letter and dead is None):
            continue
        given_by = dead[1] if dead_letter and dead is not None else queue  # a dead letter's: its source's
        allowed = given.possible_priorities(sighting.value, given_by)
        if allowed and int(item.get("p", 0)) not in allowed:
            findings.add("wrong_priority", allowed=sorted(allowed), **where(sighting))
        if not dead_letter and not sighting.rejected and given.settings.get(queue, {}).get("max_priority"):
            batches[sighting.op.invoke_index].append(int(item.get("p", 0)))
    return batches


def check_delivery_counts(model: QueueModel, given: Given, findings: Findings) -> dict[str, Any]:
    """On a queue with ``max_deliveries`` (counts replicated), no item handed out at the limit or
    more times than it (``over_delivered``), nor with a lower count than before
    (``delivery_count_decreased``). Returns the counts' statistics, those of the queues that count
    in the leader's memory (which may fall after a leader change) beside them."""
    by_item: dict[tuple[str, Hashable], list[Sighting]] = defaultdict(list)
    memory_counts: dict[tuple[str, Hashable], list[Sighting]] = defaultdict(list)
    for sighting in model.sightings:
        queue, item = sighting.queue, sighting.item
        if queue in given.dead_letter_queues or item is None:
            continue
        limit = given.max_deliveries_of(queue)
        if limit is not None and isinstance(item.get("dc"), int):
            if item["dc"] >= limit:
                findings.add("over_delivered", why=f"delivered with count {item['dc']}, limit {limit}",
                             **where(sighting))
            by_item[(queue, item_key(item))].append(sighting)
        elif isinstance(item.get("dc"), int):
            memory_counts[(queue, item_key(item))].append(sighting)
    return {"replicated": _check_delivery_order(findings, by_item, given.max_deliveries_of),
            "in_leader_memory": _delivery_order_stats(memory_counts)}


def _check_delivery_order(findings: Findings, by_item: dict[tuple[str, Hashable], list[Sighting]],
                          max_deliveries_of: Callable[[str], int | None]) -> dict[str, Any]:
    """Deliveries of one item (same id) on a queue with max_deliveries, in real-time order (one op
    completed before the other began): the count never falls; an equal count is a statistic."""
    deliveries = repeats = 0
    highest = 0
    for (queue, item_id), sightings in by_item.items():
        deliveries += len(sightings)
        limit = max_deliveries_of(queue)
        ops = {s.op.invoke_index for s in sightings}
        if item_id is not None and limit is not None and len(ops) > limit:
            findings.add("over_delivered", why=f"item {item_id} handed out {len(ops)} times, limit {limit}",
                         **where(sightings[-1]))
        ordered = sorted(sightings, key=lambda s: s.op.invoke_index)
        for s in ordered:
            highest = max(highest, int(s.item["dc"]))  # type: ignore[index]
        if item_id is None:
            continue
        for i, earlier in enumerate(ordered):
            for later in ordered[i + 1:]:
                if earlier.op.complete_index is None or earlier.op.complete_index > later.op.invoke_index:
                    continue  # overlapping ops: no order known
                before, after = int(earlier.item["dc"]), int(later.item["dc"])  # type: ignore[index]
                if after < before:
                    findings.add("delivery_count_decreased", before=before, after=after, earlier=where(earlier),
                                 **where(later))
                elif after == before:
                    repeats += 1
    return {"items": len(by_item), "deliveries": deliveries, "max_delivery_count": highest,
            "repeated_counts": repeats}


def _delivery_order_stats(by_item: dict[tuple[str, Hashable], list[Sighting]]) -> dict[str, Any]:
    decreases = highest = 0
    for sightings in by_item.values():
        ordered = sorted(sightings, key=lambda s: s.op.invoke_index)
        for earlier, later in itertools.pairwise(ordered):
            if int(later.item["dc"]) < int(earlier.item["dc"]):  # type: ignore[index]
                decreases += 1
        highest = max([highest, *(int(s.item["dc"]) for s in sightings)])  # type: ignore[index]
    return {"items": len(by_item), "deliveries": sum(len(s) for s in by_item.values()),
            "max_delivery_count": highest, "decreases": decreases}


def check_exits(model: QueueModel, given: Given, findings: Findings) -> dict[str, Any]:
    """Commits that took a value out for good (ok dequeue or drain), from workload queues and from
    dead-letter queues: together never more than the value's enqueues, and nothing handed out after."""
    writes, dlqs = given.writes, given.dead_letter_queues
    by_value: dict[Hashable, list[Any]] = defaultdict(list)
    for removal in model.removals:
        if removal.committed and removal.op.f in ("dequeue", "drain"):
            by_value[removal.value].append(removal)
    consumed = dead_consumed = 0
    for value, removals in by_value.items():
        from_dlq = [r for r in removals if r.queue in dlqs]
        consumed += len(removals) - len(from_dlq)
        dead_consumed += len(from_dlq)
        capacity = max(len(writes.get(value, ())), 1)
        if from_dlq and len(from_dlq) < len(removals) and len(removals) > capacity:
            findings.add("consumed_and_dead", value=value,
                         by=[{"queue": r.queue, "f": r.op.f, "invoke_index": r.op.invoke_index} for r in removals])
        if capacity > 1:
            continue
        first = min((r.op.complete_index for r in removals if r.op.complete_index is not None), default=None)
        if first is None:
            continue
        for sighting in model.sightings_by_value.get(value, ()):
            if sighting.op.invoke_index > first:
                findings.add("seen_after_consumed", consumed_at_index=first, **where(sighting))
    return {"consumed_values": consumed, "dead_consumed_values": dead_consumed,
            "taken_out": set(by_value)}


def priority_stats(model: QueueModel, given: Given, batches: dict[int, list[int]]) -> dict[str, Any]:
    first_out: dict[tuple[Hashable, str], float] = {}
    for removal in model.removals:
        if removal.committed and removal.op.complete_time_s is not None:
            key = (removal.value, removal.queue)
            first_out[key] = min(first_out.get(key, removal.op.complete_time_s), removal.op.complete_time_s)
    by_priority: dict[int, dict[str, Any]] = {}
    latencies: dict[int, list[float]] = defaultdict(list)
    for value, writes in given.writes.items():
        for tx, queue, options in writes:
            if tx.op.type != "ok" or not model.settings.get(queue, {}).get("max_priority"):
                continue
            priority = int(options.get("priority", 0))
            entry = by_priority.setdefault(priority, {"values": 0, "consumed": 0})
            entry["values"] += 1
            out = first_out.get((value, queue))
            if out is not None:
                entry["consumed"] += 1
                if "delay_s" not in options and tx.op.complete_time_s is not None:
                    latencies[priority].append(out - tx.op.complete_time_s)
    for priority, entry in by_priority.items():
        entry["time_to_consume_s"] = distribution(latencies[priority])
    inversions = sum(1 for ps in batches.values() for a, b in itertools.pairwise(ps) if b > a)
    return {"by_priority": {str(p): by_priority[p] for p in sorted(by_priority)},
            "batches": sum(1 for ps in batches.values() if len(ps) > 1),
            "in_batch_inversions": inversions}
