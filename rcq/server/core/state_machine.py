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

Storage limits (docs/design.md, "Limits"): a unit that would grow a queue past its
``max_items``/``max_bytes``, or every queue together past the storage budget, is rejected whole
(``queue_full``/``storage_full``); a unit that only shrinks the state always applies, so a full
cluster can drain. The limits come with each entry (:class:`~rcq.server.core.commands.Limits`),
a queue's own settings override the defaults, and bytes count each item's bookkeeping
(``ITEM_OVERHEAD_BYTES``), so a flood of empty items fills the budget too.

Not thread-safe: the replicator serialises applies and reads with a lock.

Must not import: asyncio, aiohttp, pysyncobj, lmdb, time, random, uuid, os.
"""

from __future__ import annotations

import hashlib
from collections import deque
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
    Limits,
    MalformedCommand,
    QueueChange,
    QueueChangeResult,
    UnitOutcome,
    decode,
)
from rcq.server.core.retention import TimedTable

# Limits are constants, not node configuration: every replica must apply the
# same rules or their states would diverge (read when a state machine is built).
OUTCOME_RETENTION_MS = 10 * 60_000  # a transaction's outcome is kept this long after its commit...
OUTCOME_RETENTION_MIN_MS = 2 * 60_000  # ...and at least this long, when the table is full
OUTCOMES_MAX = 1_000_000
IDEMPOTENCY_RETENTION_MS = 24 * 3600_000  # an idempotency key is kept this long...
IDEMPOTENCY_RETENTION_MIN_MS = 15 * 60_000  # ...and at least this long, when the table is full
IDEMPOTENCY_KEYS_MAX = 500_000
QUEUES_MAX = 10_000
# What one item costs in RAM besides its bytes: the bytes object's header, its id (an int
# object), a dict slot and a deque slot, measured with tracemalloc (docs/design.md, "Limits").
ITEM_OVERHEAD_BYTES = 160
SNAPSHOT_FORMAT = 2
SNAPSHOT_FORMATS_READ = (1, 2)


def item_cost(items: int, item_bytes: int) -> int:
    """What ``items`` items of ``item_bytes`` bytes in all cost against the limits (negative: freed)."""
    return item_bytes + ITEM_OVERHEAD_BYTES * items


@dataclass(frozen=True, slots=True)
class TransactionOutcome:
    status: str  # "committed" or "rejected"
    index: int
    at_ms: int
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class KeyRecord:
    """An idempotency key: the index of the entry that committed under it."""

    index: int
    at_ms: int


@dataclass(slots=True)
class QueueStats:
    enqueued_total: int = 0
    dequeued_total: int = 0
    purged_total: int = 0
    bytes: int = 0


class _Queue:
    __slots__ = ("ids", "items", "max_bytes", "max_items", "stats")

    def __init__(self, max_items: int | None = None, max_bytes: int | None = None) -> None:
        self.ids: deque[int] = deque()
        self.items: dict[int, bytes] = {}
        self.stats = QueueStats()
        self.max_items = max_items  # None: the default the entry's limits carry
        self.max_bytes = max_bytes

    @property
    def cost(self) -> int:
        return item_cost(len(self.items), self.stats.bytes)

    def drop_head_tombstones(self) -> None:
        ids, items = self.ids, self.items
        while ids and ids[0] not in items:
            ids.popleft()

    def live_ids(self) -> Iterator[int]:
        items = self.items
        return (i for i in self.ids if i in items)


def id_term(transaction_id: str) -> int:
    """The term in a transaction id (``<term hex>.<random>``); 0 when it has none."""
    head, _, _ = transaction_id.partition(".")
    try:
        return int(head, 16)
    except ValueError:
        return 0


class QueueStateMachine:
    def __init__(self) -> None:
        self._queues: dict[str, _Queue] = {}
        self._next_item_id = 1
        self._now_ms = 0
        self._last_index = 0
        self._barrier_term = 0
        self._items_total = 0
        self._bytes_total = 0
        self._outcomes: TimedTable[TransactionOutcome] = TimedTable(
            OUTCOME_RETENTION_MS, OUTCOME_RETENTION_MIN_MS, OUTCOMES_MAX, on_forget=self._outcome_forgotten)
        # Highest term of a transaction whose outcome was forgotten: for an older transaction
        # without an outcome, "never committed" is no longer a safe answer (answers.py).
        self._outcomes_forgotten_term = 0
        self._idempotency: TimedTable[KeyRecord] = TimedTable(
            IDEMPOTENCY_RETENTION_MS, IDEMPOTENCY_RETENTION_MIN_MS, IDEMPOTENCY_KEYS_MAX)

    def _outcome_forgotten(self, transaction_id: str) -> None:
        self._outcomes_forgotten_term = max(self._outcomes_forgotten_term, id_term(transaction_id))

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
            # Expire first: what is past its retention at this entry's time is forgotten by it.
            self._idempotency.expire(self._now_ms)
            self._outcomes.expire(self._now_ms)
            if isinstance(command, Barrier):
                self._barrier_term = max(self._barrier_term, command.term)
                result: ApplyResult = BarrierResult(term=command.term)
            elif isinstance(command, QueueChange):
                result = self._apply_queue_change(command)
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
        return BatchResult(outcomes=tuple(self._apply_unit(u, index, batch.limits) for u in batch.units))

    def _fence(self, unit: CommitUnit, index: int) -> UnitOutcome:
        previous = self._previous_outcome(unit, index)
        if previous is not None:
            return previous
        self._record(unit, TransactionOutcome("rejected", index, self._now_ms, "stale_leader"))
        return UnitOutcome("rejected", index, reason="stale_leader")

    def _apply_unit(self, unit: CommitUnit, index: int, limits: Limits | None) -> UnitOutcome:
        previous = self._previous_outcome(unit, index)
        if previous is not None:
            return previous
        if not self._outcomes.make_room(len(unit.transactions), self._now_ms):
            # Not recorded (there is no room): the proposer gets this answer, and a retry of the
            # same transaction is refused by the leader, which closed it.
            return UnitOutcome("rejected", index, reason="outcomes_full")
        if unit.idempotency_key is not None and not self._idempotency.make_room(1, self._now_ms):
            return UnitOutcome("rejected", index, reason="idempotency_keys_full")
        rejection = self._check_unit(unit, limits)
        if rejection is not None:
            reason, missing, about_queue = rejection
            self._record(unit, TransactionOutcome("rejected", index, self._now_ms, reason))
            return UnitOutcome("rejected", index, reason=reason, missing_item_ids=missing, queue=about_queue)
        enqueued = []
        for transaction in unit.transactions:
            for queue_name, ids in transaction.dequeues:
                if not ids:
                    continue  # _check_unit guarantees the queue exists when ids are given
                queue = self._queues[queue_name]
                removed_bytes = 0
                for item_id in ids:
                    removed_bytes += len(queue.items.pop(item_id))
                queue.stats.bytes -= removed_bytes
                queue.stats.dequeued_total += len(ids)
                self._items_total -= len(ids)
                self._bytes_total -= removed_bytes
                queue.drop_head_tombstones()
            for queue_name, values in transaction.enqueues:
                if values:
                    enqueued.append(self._append(queue_name, values))
        self._record(unit, TransactionOutcome("committed", index, self._now_ms))
        return UnitOutcome("committed", index, enqueued=tuple(enqueued))

    def _previous_outcome(self, unit: CommitUnit, index: int) -> UnitOutcome | None:
        """A retried commit (same idempotency key or same transaction ids) answers what happened first."""
        key = unit.idempotency_key
        record = self._idempotency.get(key) if key is not None else None
        if record is not None:
            return UnitOutcome("duplicate", record.index)
        seen = [self._outcomes.get(t.transaction_id) for t in unit.transactions]
        if not any(seen):
            return None
        first = seen[0]
        if all(s is not None and s.status == "committed" for s in seen) and first is not None:
            return UnitOutcome("duplicate", first.index)
        if first is not None and first.status == "rejected" and all(s == first for s in seen):
            return UnitOutcome("rejected", first.index, reason=first.reason)
        return UnitOutcome("rejected", index, reason="transaction_reused")

    def _check_unit(self, unit: CommitUnit, limits: Limits | None
                    ) -> tuple[str, tuple[int, ...], str | None] | None:
        """Why the unit must be rejected whole, as (reason, missing item ids, queue); None: apply it."""
        taken: set[int] = set()
        missing: list[int] = []
        new_queues: list[str] = []
        growth: dict[str, list[int]] = {}  # queue -> [items added - removed, bytes added - removed]
        transaction_ids = [t.transaction_id for t in unit.transactions]
        if len(set(transaction_ids)) != len(transaction_ids):
            return "duplicate_transaction", (), None
        for transaction in unit.transactions:
            for queue_name, ids in transaction.dequeues:
                queue = self._queues.get(queue_name)
                delta = growth.setdefault(queue_name, [0, 0])
                for item_id in ids:
                    value = queue.items.get(item_id) if queue is not None else None
                    if value is None:
                        missing.append(item_id)
                        continue
                    if item_id in taken:
                        return "item_dequeued_twice", (item_id,), None
                    taken.add(item_id)
                    delta[0] -= 1
                    delta[1] -= len(value)
            for queue_name, values in transaction.enqueues:
                if values and queue_name not in self._queues and queue_name not in new_queues:
                    new_queues.append(queue_name)
                delta = growth.setdefault(queue_name, [0, 0])
                delta[0] += len(values)
                delta[1] += sum(len(v) for v in values)
        if missing:
            return "items_missing", tuple(missing), None
        if len(self._queues) + len(new_queues) > QUEUES_MAX:
            return "too_many_queues", (), new_queues[0]
        if limits is not None:
            return self._check_limits(growth, limits)
        return None

    def _check_limits(self, growth: dict[str, list[int]], limits: Limits
                      ) -> tuple[str, tuple[int, ...], str | None] | None:
        """Only growth is refused: a unit that shrinks a queue (or the whole state) always applies."""
        total_cost = 0
        for queue_name, (items, item_bytes) in growth.items():
            cost = item_cost(items, item_bytes)
            total_cost += cost
            count_now, cost_now = self.usage(queue_name)
            max_items, max_bytes = self.effective_limits(queue_name, limits)
            if (items > 0 and count_now + items > max_items) or (cost > 0 and cost_now + cost > max_bytes):
                return "queue_full", (), queue_name
        if total_cost > 0 and self.storage_cost + total_cost > limits.storage_bytes_max:
            return "storage_full", (), None
        return None

    def _append(self, queue_name: str, values: tuple[bytes, ...]) -> EnqueuedRange:
        queue = self._queues.get(queue_name)
        if queue is None:
            queue = self._queues[queue_name] = _Queue()
        first = self._next_item_id
        item_id = first
        added_bytes = 0
        for value in values:
            queue.ids.append(item_id)
            queue.items[item_id] = value
            added_bytes += len(value)
            item_id += 1
        self._next_item_id = item_id
        queue.stats.bytes += added_bytes
        queue.stats.enqueued_total += len(values)
        self._items_total += len(values)
        self._bytes_total += added_bytes
        return EnqueuedRange(queue_name, first, len(values))

    def _record(self, unit: CommitUnit, outcome: TransactionOutcome) -> None:
        for transaction in unit.transactions:
            self._outcomes.put(transaction.transaction_id, outcome)
        if unit.idempotency_key is not None and outcome.status == "committed":
            self._idempotency.put(unit.idempotency_key, KeyRecord(outcome.index, outcome.at_ms))

    # ---------------------------------------------------------- queue changes
    def _apply_queue_change(self, change: QueueChange) -> QueueChangeResult:
        def rejected(reason: str) -> QueueChangeResult:
            return QueueChangeResult("rejected", change.queue, change.action, reason=reason)

        if change.term < self._barrier_term:
            return rejected("stale_leader")
        queue = self._queues.get(change.queue)
        if change.action == "configure":
            if queue is None:
                if len(self._queues) >= QUEUES_MAX:
                    return rejected("too_many_queues")
                queue = self._queues[change.queue] = _Queue()
            queue.max_items, queue.max_bytes = change.max_items, change.max_bytes
            return QueueChangeResult("done", change.queue, change.action)
        if queue is None:
            return rejected("queue_not_found")
        removed = len(queue.items)
        self._items_total -= removed
        self._bytes_total -= queue.stats.bytes
        if change.action == "delete":
            del self._queues[change.queue]
        else:
            queue.ids.clear()
            queue.items.clear()
            queue.stats.bytes = 0
            queue.stats.purged_total += removed
        return QueueChangeResult("done", change.queue, change.action, removed=removed)

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

    @property
    def storage_cost(self) -> int:
        """What every queued item costs together, bookkeeping included (what the budget limits)."""
        return item_cost(self._items_total, self._bytes_total)

    @property
    def outcomes_forgotten_term(self) -> int:
        return self._outcomes_forgotten_term

    def table_sizes(self) -> dict[str, int]:
        return {"queues": len(self._queues), "items": self._items_total, "item_bytes": self._bytes_total,
                "outcomes": len(self._outcomes), "idempotency_keys": len(self._idempotency)}

    def can_remember(self, transactions: int, keyed: bool, now_ms: int) -> bool:
        """Whether a unit of ``transactions`` (with a key or not) would find room in the outcome and
        idempotency tables at ``now_ms``: the leader asks before it proposes. Changes nothing."""
        return (self._outcomes.has_room(transactions, now_ms)
                and (not keyed or self._idempotency.has_room(1, now_ms)))

    def usage(self, queue_name: str) -> tuple[int, int]:
        """(items, cost) of a queue; (0, 0) when it does not exist."""
        queue = self._queues.get(queue_name)
        return (len(queue.items), queue.cost) if queue is not None else (0, 0)

    def effective_limits(self, queue_name: str, limits: Limits) -> tuple[int, int]:
        """(max_items, max_bytes) that apply to a queue: its own settings, else the defaults in ``limits``."""
        queue = self._queues.get(queue_name)
        own_items, own_bytes = (queue.max_items, queue.max_bytes) if queue is not None else (None, None)
        return own_items or limits.queue_items_max, own_bytes or limits.queue_bytes_max

    def deepest_queues(self, count_max: int | None = None) -> list[tuple[str, dict[str, int]]]:
        """(name, queue_stats) of the queues holding the most items (then by name), at most ``count_max``."""
        rows = [(name, self._stats_of(queue)) for name, queue in self._queues.items()]
        rows.sort(key=lambda row: (-row[1]["count"], row[0]))
        return rows if count_max is None else rows[:count_max]

    def queue_settings(self, queue_name: str) -> tuple[int | None, int | None] | None:
        """The queue's own (max_items, max_bytes), None for a default; None when there is no queue."""
        queue = self._queues.get(queue_name)
        return (queue.max_items, queue.max_bytes) if queue is not None else None

    def count(self, queue_name: str) -> int:
        queue = self._queues.get(queue_name)
        return len(queue.items) if queue is not None else 0

    def queue_names(self) -> list[str]:
        return sorted(self._queues)

    def queue_stats(self, queue_name: str) -> dict[str, int] | None:
        queue = self._queues.get(queue_name)
        return self._stats_of(queue) if queue is not None else None

    @staticmethod
    def _stats_of(queue: _Queue) -> dict[str, int]:
        return {
            "count": len(queue.items),
            "bytes": queue.stats.bytes,
            "cost_bytes": queue.cost,
            "enqueued_total": queue.stats.enqueued_total,
            "dequeued_total": queue.stats.dequeued_total,
            "purged_total": queue.stats.purged_total,
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
        return record.index if record is not None else None

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
                (name, q.stats.enqueued_total, q.stats.dequeued_total, q.stats.purged_total, q.max_items,
                 q.max_bytes)
                for name, q in sorted(self._queues.items())
            ],
            "outcomes": [
                (tid, o.status, o.index, o.at_ms, o.reason) for tid, o in self._outcomes.items()
            ],
            "outcomes_forgotten_term": self._outcomes_forgotten_term,
            "idempotency": [(k, (), r.index, r.at_ms) for k, r in self._idempotency.items()],
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
        if meta.get("format") not in SNAPSHOT_FORMATS_READ:
            raise ValueError(f"snapshot format {meta.get('format')!r}, expected one of {SNAPSHOT_FORMATS_READ}")
        queues: dict[str, _Queue] = {}
        for name, enqueued_total, dequeued_total, *rest in meta["queues"]:
            purged_total, max_items, max_bytes = rest if rest else (0, None, None)  # format 1: no settings
            queue = queues[name] = _Queue(max_items, max_bytes)
            queue.stats.enqueued_total = enqueued_total
            queue.stats.dequeued_total = dequeued_total
            queue.stats.purged_total = purged_total
        self._items_total = self._bytes_total = 0
        for name, item_id, value in items:
            if name not in queues:
                queues[name] = _Queue()
            queue = queues[name]
            queue.ids.append(item_id)
            queue.items[item_id] = value
            queue.stats.bytes += len(value)
            self._items_total += 1
            self._bytes_total += len(value)
        self._queues = queues
        self._next_item_id = meta["next_item_id"]
        self._now_ms = meta["now_ms"]
        self._last_index = meta["last_index"]
        self._barrier_term = meta["barrier_term"]
        self._outcomes.replace_all(
            (tid, TransactionOutcome(status, index, at_ms, reason))
            for tid, status, index, at_ms, reason in meta["outcomes"]
        )
        self._outcomes_forgotten_term = int(meta.get("outcomes_forgotten_term", 0))
        self._idempotency.replace_all(
            (key, KeyRecord(index, at_ms)) for key, _ids, index, at_ms in meta["idempotency"]
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
