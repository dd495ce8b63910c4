"""What the queue checkers read from a history: enqueues, removals, sightings.

A history is turned once into three flat lists:

* ``enqueues``  — every enqueue transaction (ok, fail or info) and its writes;
* ``removals``  — every value a dequeue, move or drain took out of a queue,
  with the op's outcome (``ok`` removed it for good; ``info`` maybe; ``fail``
  did not);
* ``sightings`` — every value any client op saw come out of a queue,
  whatever that op's outcome: a value the server handed out was in the queue
  at that moment (enqueues are invisible until they commit).

Moves appear twice: as a removal from ``from`` and as a ``MoveTx`` that
inserts into ``to``. An info move counts as committed ("resolved") when one
of its values is later seen in ``to``.

Queue features (docs/queue-features.md): ``configure`` ops give each queue's
settings, so the model knows the dead-letter queues (a value may be seen in
the dead-letter queue of any queue it may be in); a dequeue's ``rejected``
values were seen but left for the dead-letter queue, not with the commit
(sightings, never removals); ``items`` carries each value's item details
(id, delivery count, priority, dead-letter record). ``may_vanish`` names the
values the rules let leave without a trace: expired (its ttl ran out before
the run's end) or dropped (dead, in a queue without a dead-letter queue).

Pure Python: imports nothing from rcq.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field
from typing import Any

from chaos.history import PairedOp, pair_ops

SAMPLE_SIZE_MAX = 20
# Clocks: history times are the harness's monotonic clock, entry times the leader's wall clock, on
# one machine; a rule about time is broken only beyond this margin.
CLOCK_MARGIN_S = 0.25
# An info enqueue's commit may have been stamped this long after the op was given up.
UNKNOWN_COMMIT_SLACK_S = 30.0

# Ops whose value lists items that came out of one queue.
SIGHTING_FS = ("dequeue", "dequeue-abort", "vanish", "drain", "peek", "move")
# Ops that remove what they saw when they commit.
REMOVING_FS = ("dequeue", "move", "drain")


@dataclass(frozen=True, slots=True)
class EnqueueTx:
    op: PairedOp
    writes: tuple[tuple[str, tuple[Hashable, ...]], ...]
    # per write: its options (priority, delay_s, ttl_s), as sent
    options: tuple[dict[str, Any], ...] = ()

    def options_of(self, position: int) -> dict[str, Any]:
        return self.options[position] if position < len(self.options) else {}

    @property
    def values(self) -> list[Hashable]:
        return [value for _, values in self.writes for value in values]


@dataclass(frozen=True, slots=True)
class MoveTx:
    op: PairedOp
    source: str
    target: str
    values: tuple[Hashable, ...]
    committed: bool  # ok, or info and seen later in `target`


@dataclass(frozen=True, slots=True)
class Sighting:
    value: Hashable
    queue: str
    op: PairedOp
    position: int  # where the value sat in the op's list: 0 is the first out
    rejected: bool = False  # rejected by its transaction: it left for the dead-letter queue, not with a commit
    item: dict[str, Any] | None = None  # what the workload recorded of the item (id, dc, at, p, dl)

    @property
    def dead_letter(self) -> tuple[str, str, int] | None:
        """(reason, source queue, delivery count) when the item was seen as a dead letter."""
        dead = self.item.get("dl") if isinstance(self.item, dict) else None
        if isinstance(dead, list | tuple) and len(dead) == 3:
            return str(dead[0]), str(dead[1]), int(dead[2])
        return None

    @property
    def order_index(self) -> int:
        """When the sighting is known: its op's completion (or invoke) index."""
        completed = self.op.complete_index
        return self.op.invoke_index if completed is None else completed


@dataclass(frozen=True, slots=True)
class Removal:
    value: Hashable
    queue: str
    op: PairedOp
    committed: bool | None  # True: ok (or resolved info move); None: unknown; False: fail
    position: int = 0  # where the value sat in the op's list


@dataclass(slots=True)
class QueueModel:
    ops: list[PairedOp]
    enqueues: list[EnqueueTx] = field(default_factory=list)
    moves: list[MoveTx] = field(default_factory=list)
    sightings: list[Sighting] = field(default_factory=list)
    removals: list[Removal] = field(default_factory=list)
    first_index: dict[Hashable, int] = field(default_factory=dict)
    sightings_by_value: dict[Hashable, list[Sighting]] = field(default_factory=lambda: defaultdict(list))
    settings: dict[str, dict[str, Any]] = field(default_factory=dict)  # queue -> its configured settings
    end_time_s: float = 0.0  # the history's last time
    may_vanish: dict[Hashable, str] = field(default_factory=dict)  # value -> "expired" or "dropped"

    def dead_letter_queue_of(self, queue: str) -> str | None:
        value = self.settings.get(queue, {}).get("dead_letter_queue")
        return value if isinstance(value, str) and value else None

    @property
    def dead_letter_queues(self) -> set[str]:
        return {dlq for queue in self.settings if (dlq := self.dead_letter_queue_of(queue)) is not None}

    def is_dead_letter_queue(self, queue: str) -> bool:
        return queue in self.dead_letter_queues

    def sample(self, values: Iterable[Hashable]) -> list[Hashable]:
        """The first values (in history order) of a set, for a report."""
        ordered = sorted(values, key=lambda value: self.first_index.get(value, -1))
        return ordered[:SAMPLE_SIZE_MAX]

    def enqueued(self, op_type: str) -> set[Hashable]:
        return {value for tx in self.enqueues if tx.op.type == op_type for value in tx.values}

    def seen_values(self) -> set[Hashable]:
        return set(self.sightings_by_value)


def value_key(value: Any) -> Hashable:
    """Values are unique strings; anything unhashable is compared by its JSON."""
    if isinstance(value, dict | list):
        return json.dumps(value, sort_keys=True)
    return value


def build_model(history: Iterable[dict[str, Any]] | list[PairedOp]) -> QueueModel:
    items = list(history)
    ops = ([op for op in items if isinstance(op, PairedOp)] if items and isinstance(items[0], PairedOp)
           else pair_ops(op for op in items if isinstance(op, dict)))
    model = QueueModel(ops=ops)
    lines = [line for op in ops for line in (op.invoke, op.completion) if line is not None]
    lines += [op for op in items if isinstance(op, dict)]
    model.end_time_s = max((float(line["time_s"]) for line in lines if "time_s" in line), default=0.0)
    pending_moves: list[tuple[PairedOp, str, str, tuple[Hashable, ...]]] = []
    for op in model.ops:
        value = op.value if isinstance(op.value, dict) else {}
        if op.f == "configure" and op.type != "fail" and isinstance(value.get("queue"), str):
            model.settings[value["queue"]] = {k: v for k, v in value.items() if k not in ("queue", "transaction_id")}
            continue
        if op.f == "enqueue":
            model.enqueues.append(EnqueueTx(op=op, writes=_writes(value), options=_options(value)))
            for _, values in model.enqueues[-1].writes:
                for item in values:
                    model.first_index.setdefault(item, op.invoke_index)
            continue
        if op.f not in SIGHTING_FS:
            continue
        queue = str(value.get("from") if op.f == "move" else value.get("queue"))
        values = _values(op.f, value)
        rejected = tuple(value_key(item) for item in value.get("rejected") or []) if op.f != "peek" else ()
        recorded = value.get("items")
        details: dict[str, Any] = recorded if isinstance(recorded, dict) else {}
        for position, item in enumerate(values + rejected):
            model.first_index.setdefault(item, op.invoke_index)
            meta = details.get(item) if isinstance(item, str) else None
            sighting = Sighting(value=item, queue=queue, op=op, position=position, rejected=position >= len(values),
                                item=meta if isinstance(meta, dict) else None)
            model.sightings.append(sighting)
            model.sightings_by_value[item].append(sighting)
        if op.f == "move":
            pending_moves.append((op, queue, str(value.get("to")), values))
    # (value, target) pairs a committed move put there: they explain a sighting in that target.
    moved_by_ok = {(item, target) for op, _, target, values in pending_moves if op.type == "ok" for item in values}
    for op, source, target, values in pending_moves:
        # A failed move definitely did not happen, even if its values later reach its target
        # through another move; only an info move is judged by where its values show up, and
        # only by values no committed move carried to that target (soak seed 2026).
        unexplained = tuple(item for item in values if (item, target) not in moved_by_ok)
        committed = op.type == "ok" or (op.type == "info" and _seen_in(model, unexplained, target, op))
        model.moves.append(MoveTx(op, source, target, values, committed))
    committed_moves = {move.op.invoke_index for move in model.moves if move.committed}
    for sighting in model.sightings:
        op = sighting.op
        if op.f not in REMOVING_FS or sighting.rejected:
            continue
        removed: bool | None = {"ok": True, "fail": False}.get(op.type)
        if op.f == "move" and op.invoke_index in committed_moves:
            removed = True
        model.removals.append(Removal(sighting.value, sighting.queue, op, removed, sighting.position))
    model.may_vanish = _may_vanish(model)
    return model


def _options(value: dict[str, Any]) -> tuple[dict[str, Any], ...]:
    return tuple(
        {name: write[name] for name in ("priority", "delay_s", "ttl_s") if isinstance(write.get(name), int | float)}
        for write in value.get("writes") or []
        if isinstance(write, dict)
    )


def enqueue_commit_bound_s(op: PairedOp) -> float:
    """The latest history time the enqueue's commit can have been stamped: its acknowledgement,
    or, for an unknown outcome, well after the op was given up."""
    if op.type == "ok" and op.complete_time_s is not None:
        return op.complete_time_s
    return (op.complete_time_s if op.complete_time_s is not None else op.invoke_time_s) + UNKNOWN_COMMIT_SLACK_S


def _may_vanish(model: QueueModel) -> dict[Hashable, str]:
    """Values the rules let leave without a trace, in queues with no dead-letter queue: one whose
    ttl ran out (its commit's time + ttl + the clock margin before the history's end); any value
    that was in a queue with max_deliveries (dead at its limit: dropped, perhaps after deliveries
    no client saw); a value a transaction rejected there (dropped at once)."""
    if not model.settings:
        return {}
    vanish: dict[Hashable, str] = {}

    def no_dead_letters(queue: str) -> bool:
        return queue in model.settings and model.dead_letter_queue_of(queue) is None

    def limited(queue: str) -> bool:
        return no_dead_letters(queue) and model.settings[queue].get("max_deliveries") is not None

    for tx in model.enqueues:
        if tx.op.type == "fail":
            continue
        for position, (queue, values) in enumerate(tx.writes):
            if not no_dead_letters(queue):
                continue
            ttl = tx.options_of(position).get("ttl_s", model.settings[queue].get("default_ttl_s"))
            for value in values:
                if limited(queue):
                    vanish[value] = "dropped"
                elif isinstance(ttl, int | float) and (
                        enqueue_commit_bound_s(tx.op) + ttl + CLOCK_MARGIN_S < model.end_time_s):
                    vanish.setdefault(value, "expired")
    for move in model.moves:
        if move.op.type != "fail" and limited(move.target):
            for value in move.values:
                vanish[value] = "dropped"
    for sighting in model.sightings:
        if sighting.rejected and no_dead_letters(sighting.queue) and sighting.op.value.get("reject_outcome") != "fail":
            vanish[sighting.value] = "dropped"
    return vanish


def _writes(value: dict[str, Any]) -> tuple[tuple[str, tuple[Hashable, ...]], ...]:
    writes = value.get("writes") or []
    return tuple(
        (str(write.get("queue")), tuple(value_key(item) for item in write.get("values") or []))
        for write in writes
        if isinstance(write, dict)
    )


def _values(f: str, value: dict[str, Any]) -> tuple[Hashable, ...]:
    if f == "peek":
        item = value.get("value")
        return () if item is None else (value_key(item),)
    return tuple(value_key(item) for item in value.get("values") or [])


def _seen_in(model: QueueModel, values: tuple[Hashable, ...], queue: str, move: PairedOp) -> bool:
    """Whether any of an info move's values was seen in its target queue after the move began."""
    return any(
        sighting.queue == queue and sighting.op is not move and sighting.order_index > move.invoke_index
        for item in values
        for sighting in model.sightings_by_value.get(item, ())
    )
