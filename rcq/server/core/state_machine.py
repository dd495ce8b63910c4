"""QueueStateMachine: the replicated state, driven only by committed log entries.

Pure and deterministic: the same entries applied in the same order give the
same state and the same results on every replica. No I/O, no clock (time comes
in the command as the leader's ``now_ms``), no randomness, and no iteration
over sets whose order could reach a result or a snapshot.

:meth:`QueueStateMachine.apply` never raises: a malformed entry or a bug
becomes an :class:`~rcq.server.core.commands.ApplyFailed` value, because an exception in a
replicated method would be re-applied by pysyncobj on every tick, for ever.

Each queue is a deque of item ids in id order plus a dict id -> value. Ids are
assigned from one counter at apply time, so a queue's id order is its commit
order. Committed dequeues delete from the dict; the deque keeps a tombstone id
until it reaches the head (dequeues almost always take the head).

Not thread-safe: the replicator serialises applies and reads with a lock.

Must not import: asyncio, aiohttp, pysyncobj, lmdb, time, random, uuid, os.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict, deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from rcq.server.core.commands import (
    ApplyFailed,
    ApplyResult,
    Barrier,
    BarrierResult,
    BatchResult,
    Command,
    CommitBatch,
    CommitUnit,
    EnqueuedRange,
    MalformedCommand,
    UnitOutcome,
    decode,
)

# Limits are constants, not node configuration: every replica must apply the
# same rules or their states would diverge.
OUTCOMES_MAX = 200_000  # remembered transaction outcomes (for retried commits and status)
IDEMPOTENCY_KEYS_MAX = 100_000
IDEMPOTENCY_RETENTION_MS = 7 * 24 * 3600 * 1000
QUEUES_MAX = 10_000
SNAPSHOT_FORMAT = 1


@dataclass(frozen=True, slots=True)
class TransactionOutcome:
    status: str  # "committed" or "rejected"
    index: int
    at_ms: int
    reason: str | None = None


@dataclass(slots=True)
class QueueStats:
    enqueued_total: int = 0
    dequeued_total: int = 0
    bytes: int = 0


class _Queue:
    __slots__ = ("ids", "items", "stats")

    def __init__(self) -> None:
        self.ids: deque[int] = deque()
        self.items: dict[int, bytes] = {}
        self.stats = QueueStats()

    def drop_head_tombstones(self) -> None:
        ids, items = self.ids, self.items
        while ids and ids[0] not in items:
            ids.popleft()

    def live_ids(self) -> Iterator[int]:
        items = self.items
        return (i for i in self.ids if i in items)


class QueueStateMachine:
    def __init__(self) -> None:
        self._queues: dict[str, _Queue] = {}
        self._next_item_id = 1
        self._now_ms = 0
        self._last_index = 0
        self._barrier_term = 0
        self._outcomes: OrderedDict[str, TransactionOutcome] = OrderedDict()
        # key -> (transaction ids, index, at_ms)
        self._idempotency: OrderedDict[str, tuple[tuple[str, ...], int, int]] = OrderedDict()

    # ------------------------------------------------------------------ apply
    def apply(self, raw_command: Any, index: int) -> ApplyResult:
        """Apply one committed log entry at ``index``. Never raises."""
        return self.decode_and_apply(raw_command, index)[1]

    def decode_and_apply(self, raw_command: Any, index: int) -> tuple[Command | None, ApplyResult]:
        """:meth:`apply`, also returning the decoded command (None when malformed), so that
        whoever follows the stream of applied entries never decodes an entry twice."""
        try:
            command = decode(raw_command)
        except MalformedCommand as exc:
            self._last_index = max(self._last_index, index)
            return None, ApplyFailed(reason="malformed_command", details={"error": str(exc)})
        return command, self._apply_command(command, index)

    def _apply_command(self, command: Command, index: int) -> ApplyResult:
        try:
            self._now_ms = max(self._now_ms, command.now_ms)
            # Expire first: a key past its retention at this entry's time is forgotten by it.
            self._expire_idempotency_keys()
            if isinstance(command, Barrier):
                self._barrier_term = max(self._barrier_term, command.term)
                result: ApplyResult = BarrierResult(term=command.term)
            else:
                result = self._apply_batch(command, index)
        except Exception as exc:  # a bug: report it, keep the node alive
            result = ApplyFailed(reason="apply_error", details={"error": repr(exc)})
        self._last_index = max(self._last_index, index)
        return result

    def _apply_batch(self, batch: CommitBatch, index: int) -> BatchResult:
        if batch.term < self._barrier_term:
            # Proposed by a leader that was deposed before this entry reached the log's
            # applied part (pysyncobj may forward it to the new leader). The new leader
            # built its view of the queues at its barrier; this entry must not change them.
            return BatchResult(outcomes=tuple(self._fence(u, index) for u in batch.units))
        return BatchResult(outcomes=tuple(self._apply_unit(u, index) for u in batch.units))

    def _fence(self, unit: CommitUnit, index: int) -> UnitOutcome:
        previous = self._previous_outcome(unit, index)
        if previous is not None:
            return previous
        self._record(unit, TransactionOutcome("rejected", index, self._now_ms, "stale_leader"))
        return UnitOutcome("rejected", index, reason="stale_leader")

    def _apply_unit(self, unit: CommitUnit, index: int) -> UnitOutcome:
        previous = self._previous_outcome(unit, index)
        if previous is not None:
            return previous
        rejection = self._check_unit(unit)
        if rejection is not None:
            reason, missing = rejection
            self._record(unit, TransactionOutcome("rejected", index, self._now_ms, reason))
            return UnitOutcome("rejected", index, reason=reason, missing_item_ids=missing)
        enqueued = []
        for transaction in unit.transactions:
            for queue_name, ids in transaction.dequeues:
                if not ids:
                    continue  # _check_unit guarantees the queue exists when ids are given
                queue = self._queues[queue_name]
                for item_id in ids:
                    value = queue.items.pop(item_id)
                    queue.stats.bytes -= len(value)
                queue.stats.dequeued_total += len(ids)
                queue.drop_head_tombstones()
            for queue_name, values in transaction.enqueues:
                if values:
                    enqueued.append(self._append(queue_name, values))
        self._record(unit, TransactionOutcome("committed", index, self._now_ms))
        return UnitOutcome("committed", index, enqueued=tuple(enqueued))

    def _previous_outcome(self, unit: CommitUnit, index: int) -> UnitOutcome | None:
        """A retried commit (same idempotency key or same transaction ids) answers what happened first."""
        key = unit.idempotency_key
        if key is not None and key in self._idempotency:
            _, first_index, _ = self._idempotency[key]
            return UnitOutcome("duplicate", first_index)
        seen = [self._outcomes.get(t.transaction_id) for t in unit.transactions]
        if not any(seen):
            return None
        first = seen[0]
        if all(s is not None and s.status == "committed" for s in seen) and first is not None:
            return UnitOutcome("duplicate", first.index)
        if first is not None and first.status == "rejected" and all(s == first for s in seen):
            return UnitOutcome("rejected", first.index, reason=first.reason)
        return UnitOutcome("rejected", index, reason="transaction_reused")

    def _check_unit(self, unit: CommitUnit) -> tuple[str, tuple[int, ...]] | None:
        taken: set[int] = set()
        missing: list[int] = []
        new_queues: list[str] = []
        transaction_ids = [t.transaction_id for t in unit.transactions]
        if len(set(transaction_ids)) != len(transaction_ids):
            return "duplicate_transaction", ()
        for transaction in unit.transactions:
            for queue_name, ids in transaction.dequeues:
                queue = self._queues.get(queue_name)
                for item_id in ids:
                    if queue is None or item_id not in queue.items:
                        missing.append(item_id)
                    elif item_id in taken:
                        return "item_dequeued_twice", (item_id,)
                    taken.add(item_id)
            for queue_name, values in transaction.enqueues:
                if values and queue_name not in self._queues and queue_name not in new_queues:
                    new_queues.append(queue_name)
        if missing:
            return "items_missing", tuple(missing)
        if len(self._queues) + len(new_queues) > QUEUES_MAX:
            return "too_many_queues", ()
        return None

    def _append(self, queue_name: str, values: tuple[bytes, ...]) -> EnqueuedRange:
        queue = self._queues.get(queue_name)
        if queue is None:
            queue = self._queues[queue_name] = _Queue()
        first = self._next_item_id
        item_id = first
        for value in values:
            queue.ids.append(item_id)
            queue.items[item_id] = value
            queue.stats.bytes += len(value)
            item_id += 1
        self._next_item_id = item_id
        queue.stats.enqueued_total += len(values)
        return EnqueuedRange(queue_name, first, len(values))

    def _record(self, unit: CommitUnit, outcome: TransactionOutcome) -> None:
        for transaction in unit.transactions:
            self._outcomes[transaction.transaction_id] = outcome
            self._outcomes.move_to_end(transaction.transaction_id)
        while len(self._outcomes) > OUTCOMES_MAX:
            self._outcomes.popitem(last=False)
        if unit.idempotency_key is not None and outcome.status == "committed":
            ids = tuple(t.transaction_id for t in unit.transactions)
            self._idempotency[unit.idempotency_key] = (ids, outcome.index, outcome.at_ms)
            while len(self._idempotency) > IDEMPOTENCY_KEYS_MAX:
                self._idempotency.popitem(last=False)

    def _expire_idempotency_keys(self) -> None:
        horizon = self._now_ms - IDEMPOTENCY_RETENTION_MS
        keys = self._idempotency
        while keys:
            key, (_, _, at_ms) = next(iter(keys.items()))
            if at_ms >= horizon:
                break
            del keys[key]

    # ---------------------------------------------------------------- queries
    @property
    def last_index(self) -> int:
        return self._last_index

    @property
    def barrier_term(self) -> int:
        return self._barrier_term

    @property
    def now_ms(self) -> int:
        return self._now_ms

    def count(self, queue_name: str) -> int:
        queue = self._queues.get(queue_name)
        return len(queue.items) if queue is not None else 0

    def queue_names(self) -> list[str]:
        return sorted(self._queues)

    def queue_stats(self, queue_name: str) -> dict[str, int] | None:
        queue = self._queues.get(queue_name)
        if queue is None:
            return None
        return {
            "count": len(queue.items),
            "bytes": queue.stats.bytes,
            "enqueued_total": queue.stats.enqueued_total,
            "dequeued_total": queue.stats.dequeued_total,
        }

    def item_ids(self, queue_name: str) -> list[int]:
        """Ids of the items in ``queue_name``, head first."""
        queue = self._queues.get(queue_name)
        return list(queue.live_ids()) if queue is not None else []

    def item_ranges(self, queue_name: str) -> list[tuple[int, int]]:
        """The queue's item ids as [first, end) ranges of consecutive ids, head first."""
        queue = self._queues.get(queue_name)
        return coalesce_ranges(queue.live_ids()) if queue is not None else []

    def values(self, queue_name: str, item_ids: Iterable[int]) -> list[bytes | None]:
        queue = self._queues.get(queue_name)
        if queue is None:
            return [None for _ in item_ids]
        get = queue.items.get
        return [get(i) for i in item_ids]

    def contains(self, queue_name: str, item_id: int) -> bool:
        queue = self._queues.get(queue_name)
        return queue is not None and item_id in queue.items

    def outcome(self, transaction_id: str) -> TransactionOutcome | None:
        return self._outcomes.get(transaction_id)

    def idempotency_key_index(self, key: str) -> int | None:
        record = self._idempotency.get(key)
        return record[1] if record is not None else None

    def digest(self) -> str:
        """A hash of the whole replicated state: equal on replicas that applied the same log."""
        h = hashlib.sha256()
        for key, value in self.snapshot_meta().items():
            h.update(repr((key, value)).encode())
        for queue_name, item_id, value in self.snapshot_items():
            h.update(repr((queue_name, item_id, len(value))).encode())
            h.update(value)
        return h.hexdigest()

    # -------------------------------------------------------------- snapshots
    def snapshot_meta(self) -> dict[str, Any]:
        """Everything but the items, as plain values (lists, tuples, ints, str)."""
        return {
            "format": SNAPSHOT_FORMAT,
            "next_item_id": self._next_item_id,
            "now_ms": self._now_ms,
            "last_index": self._last_index,
            "barrier_term": self._barrier_term,
            "queues": [
                (name, q.stats.enqueued_total, q.stats.dequeued_total)
                for name, q in sorted(self._queues.items())
            ],
            "outcomes": [
                (tid, o.status, o.index, o.at_ms, o.reason) for tid, o in self._outcomes.items()
            ],
            "idempotency": [(k, ids, i, at) for k, (ids, i, at) in self._idempotency.items()],
        }

    def snapshot_items(self) -> Iterator[tuple[str, int, bytes]]:
        """Every item as (queue, item id, value), sorted by queue then id."""
        for name in sorted(self._queues):
            queue = self._queues[name]
            items = queue.items
            for item_id in queue.ids:
                value = items.get(item_id)
                if value is not None:
                    yield name, item_id, value

    def restore(self, meta: dict[str, Any], items: Iterable[tuple[str, int, bytes]]) -> None:
        """Discard all state and load a snapshot (``items`` sorted as snapshot_items yields them)."""
        if meta.get("format") != SNAPSHOT_FORMAT:
            raise ValueError(f"snapshot format {meta.get('format')!r}, expected {SNAPSHOT_FORMAT}")
        queues: dict[str, _Queue] = {}
        for name, enqueued_total, dequeued_total in meta["queues"]:
            queue = queues[name] = _Queue()
            queue.stats.enqueued_total = enqueued_total
            queue.stats.dequeued_total = dequeued_total
        for name, item_id, value in items:
            if name not in queues:
                queues[name] = _Queue()
            queue = queues[name]
            queue.ids.append(item_id)
            queue.items[item_id] = value
            queue.stats.bytes += len(value)
        self._queues = queues
        self._next_item_id = meta["next_item_id"]
        self._now_ms = meta["now_ms"]
        self._last_index = meta["last_index"]
        self._barrier_term = meta["barrier_term"]
        self._outcomes = OrderedDict(
            (tid, TransactionOutcome(status, index, at_ms, reason))
            for tid, status, index, at_ms, reason in meta["outcomes"]
        )
        self._idempotency = OrderedDict(
            (key, (tuple(ids), index, at_ms)) for key, ids, index, at_ms in meta["idempotency"]
        )


def coalesce_ranges(item_ids: Iterable[int]) -> list[tuple[int, int]]:
    """Turn increasing ids into [first, end) ranges of consecutive ids."""
    ranges: list[tuple[int, int]] = []
    for item_id in item_ids:
        if ranges and item_id == ranges[-1][1]:
            ranges[-1] = (ranges[-1][0], item_id + 1)
        else:
            ranges.append((item_id, item_id + 1))
    return ranges
