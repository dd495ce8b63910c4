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

# Ops whose value lists items that came out of one queue.
SIGHTING_FS = ("dequeue", "dequeue-abort", "vanish", "drain", "peek", "move")
# Ops that remove what they saw when they commit.
REMOVING_FS = ("dequeue", "move", "drain")


@dataclass(frozen=True, slots=True)
class EnqueueTx:
    op: PairedOp
    writes: tuple[tuple[str, tuple[Hashable, ...]], ...]

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
    pending_moves: list[tuple[PairedOp, str, str, tuple[Hashable, ...]]] = []
    for op in model.ops:
        value = op.value if isinstance(op.value, dict) else {}
        if op.f == "enqueue":
            model.enqueues.append(EnqueueTx(op=op, writes=_writes(value)))
            for _, values in model.enqueues[-1].writes:
                for item in values:
                    model.first_index.setdefault(item, op.invoke_index)
            continue
        if op.f not in SIGHTING_FS:
            continue
        queue = str(value.get("from") if op.f == "move" else value.get("queue"))
        values = _values(op.f, value)
        for position, item in enumerate(values):
            model.first_index.setdefault(item, op.invoke_index)
            sighting = Sighting(value=item, queue=queue, op=op, position=position)
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
        if op.f not in REMOVING_FS:
            continue
        removed: bool | None = {"ok": True, "fail": False}.get(op.type)
        if op.f == "move" and op.invoke_index in committed_moves:
            removed = True
        model.removals.append(Removal(sighting.value, sighting.queue, op, removed, sighting.position))
    return model


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
