"""What the features checks share: what the history gave each value (its writes, the queues moves
took it to, the rejects that named it, its queues' settings), the findings they add to, and how a
sighting is shown.

Pure Python: imports nothing from rcq, nothing of the workload.
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from collections.abc import Hashable
from typing import Any

from chaos.checkers.model import SAMPLE_SIZE_MAX, EnqueueTx, QueueModel, Sighting
from chaos.history import CHECKER_INPUT_PROCESS

POISON_SUFFIX = "-poison"  # chaos.generator's marker (checkers import nothing of the workload)

# value -> each write of it: (the enqueue, the queue, the write's options)
Writes = dict[Hashable, list[tuple[EnqueueTx, str, dict[str, Any]]]]
# (dead-letter queue, item id) -> (value, reason, source queue)
Deaths = dict[tuple[str, Hashable], tuple[Hashable, str, str]]


def is_poison(value: Hashable) -> bool:
    return isinstance(value, str) and value.endswith(POISON_SUFFIX)


class Findings:
    """The violations found, by kind: how many, and the first samples of each."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.samples: dict[str, list[dict[str, Any]]] = defaultdict(list)

    def add(self, kind: str, **details: Any) -> None:
        self.counts[kind] += 1
        if len(self.samples[kind]) < SAMPLE_SIZE_MAX:
            self.samples[kind].append(details)


def where(sighting: Sighting) -> dict[str, Any]:
    op = sighting.op
    return {"value": sighting.value, "queue": sighting.queue, "f": op.f, "type": op.type, "process": op.process,
            "invoke_index": op.invoke_index, "item": sighting.item}


def done_s(sighting: Sighting, model: QueueModel) -> float:
    """The latest the sighting's delivery can have happened: its op's completion (or the end)."""
    done = sighting.op.complete_time_s
    return model.end_time_s if done is None else done


def distribution(samples: list[float]) -> dict[str, Any]:
    if not samples:
        return {"count": 0}
    ordered = sorted(samples)
    return {"count": len(ordered), "min": round(ordered[0], 3), "median": round(statistics.median(ordered), 3),
            "p90": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.9))], 3), "max": round(ordered[-1], 3)}


def ttl_ms(ttl_s: Any) -> int:
    """A ttl in ms as the server rounds it."""
    return max(1, round(float(ttl_s) * 1000))


def model_moved_into(model: QueueModel, value: Hashable) -> set[str]:
    return {move.target for move in model.moves if move.op.type != "fail" and value in move.values}


def queue_stats(history: list[dict[str, Any]] | None) -> dict[str, dict[str, Any]] | None:
    """The queues' replicated counters after the drain (the ``queue-stats`` checker input), if recorded."""
    if not history:
        return None
    recorded = [op.get("value") for op in history
                if op.get("process") == CHECKER_INPUT_PROCESS and op.get("f") == "queue-stats"]
    return recorded[-1] if recorded and isinstance(recorded[-1], dict) else None


class Given:
    """What the history gave each value: its writes (enqueue, queue, options) that may have
    committed, the queues moves took it to, the rejects that named it, and the queues' settings."""

    def __init__(self, model: QueueModel) -> None:
        self.model = model
        self.settings = model.settings
        self.dead_letter_queues = model.dead_letter_queues
        self.writes: Writes = defaultdict(list)
        for tx in model.enqueues:
            if tx.op.type == "fail":
                continue
            for position, (queue, values) in enumerate(tx.writes):
                for value in values:
                    self.writes[value].append((tx, queue, tx.options_of(position)))
        self.moved_into: dict[Hashable, set[str]] = defaultdict(set)
        for move in model.moves:
            if move.op.type != "fail":
                for value in move.values:
                    self.moved_into[value].add(move.target)
        self.rejects = {(s.value, s.queue) for s in model.sightings
                        if s.rejected and s.op.value.get("reject_outcome") != "fail"}

    def max_deliveries_of(self, queue: str) -> int | None:
        value = self.settings.get(queue, {}).get("max_deliveries")
        return value if isinstance(value, int) else None

    def possible_queues(self, value: Hashable) -> set[str]:
        return {queue for _, queue, _ in self.writes.get(value, ())} | self.moved_into.get(value, set())

    def possible_priorities(self, value: Hashable, queue: str) -> set[int]:
        ceiling = self.settings.get(queue, {}).get("max_priority") or 0
        allowed = {min(int(options.get("priority", 0)), ceiling)
                   for _, q, options in self.writes.get(value, ()) if q == queue}
        if queue in self.moved_into.get(value, set()):
            allowed.add(0)
        return allowed

    def possible_ttls_ms(self, value: Hashable, queue: str) -> set[int]:
        """The ttls an item of ``value`` in ``queue`` may carry: its writes' into that queue, the queue's default."""
        ttls = {ttl_ms(options["ttl_s"]) for _, q, options in self.writes.get(value, ())
                if q == queue and "ttl_s" in options}
        default = self.settings.get(queue, {}).get("default_ttl_s")
        if isinstance(default, int | float):
            ttls.add(ttl_ms(default))
        return ttls


def item_key(item: dict[str, Any]) -> Hashable:
    """Which item it is: its id, and on a spread queue its fragment (``pt``: ids are a partition's
    own, so one id in two fragments is two items). None: no id recorded."""
    item_id = item.get("id")
    fragment = item.get("pt")
    return item_id if item_id is None or fragment is None else f"{fragment}/{item_id}"
