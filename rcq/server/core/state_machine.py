"""QueueStateMachine: the replicated state, driven only by committed log entries.

Pure and deterministic: the same entries applied in the same order give the
same state and the same results on every replica. No I/O, no clock (time comes
in the command as the leader's ``now_ms``), no randomness, and no iteration
over sets whose order could reach a result or a snapshot.

:meth:`QueueStateMachine.apply` never raises: a malformed entry or a bug
becomes an :class:`~rcq.server.core.commands.ApplyFailed` value, because an exception in a
replicated method would be re-applied by pysyncobj on every tick, for ever.

Each queue (:mod:`rcq.server.core.queue`) is a deque of item ids in id order plus a dict
id -> value, and sparse metadata for the items that have any. Ids are assigned from one counter
at apply time, so a queue's id order is its commit order.

Time (docs/queue-features.md): the state machine's clock is the largest ``now_ms`` of the
entries it applied. Delays and TTLs become absolute times when an enqueue commits; expiry,
dead-lettering and redrive are :class:`~rcq.server.core.commands.ItemsAction` units that a leader
proposes, and that apply only where the rule holds at the entry's time.

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
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from rcq.server.core.commands import (
    DEAD_REASONS,
    ApplyFailed,
    ApplyResult,
    Barrier,
    BarrierResult,
    BatchResult,
    Command,
    CommitBatch,
    CommitUnit,
    EnqueuedRange,
    EnqueueOptions,
    ItemsAction,
    ItemsOutcome,
    Limits,
    MalformedCommand,
    MemberRecord,
    MemberRecordResult,
    QueueChange,
    QueueChangeResult,
    QueueSettings,
    UnitOutcome,
    decode,
)
from rcq.server.core.queue import ItemMeta, Queue, QueueStats
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
SNAPSHOT_FORMAT = 3
SNAPSHOT_FORMATS_READ = (1, 2, 3)
MAX_DELIVERIES_MAX = 1000
MAX_PRIORITY_MAX = 255
ITEM_ACTION_IDS_MAX = 10_000  # items one ItemsAction may name (redrive moves at most this many at once)


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


def id_term(transaction_id: str) -> int:
    """The term in a transaction id (``<term hex>.<random>``); 0 when it has none."""
    head, _, _ = transaction_id.partition(".")
    try:
        return int(head, 16)
    except ValueError:
        return 0


class QueueStateMachine:
    def __init__(self) -> None:
        self._queues: dict[str, Queue] = {}
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
        # The cluster's directory: node id -> (Raft address, HTTP URL) of members recorded by
        # membership changes (docs/membership.md). Empty until the first change.
        self._members: dict[str, tuple[str, str]] = {}

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
            elif isinstance(command, MemberRecord):
                result = self._apply_member_record(command)
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
        return BatchResult(outcomes=tuple(
            self._apply_action(u, index) if isinstance(u, ItemsAction) else self._apply_unit(u, index, batch.limits)
            for u in batch.units))

    def _fence(self, unit: CommitUnit | ItemsAction, index: int) -> UnitOutcome | ItemsOutcome:
        if isinstance(unit, ItemsAction):
            return ItemsOutcome("rejected", index, unit.action, unit.queue, reason="stale_leader")
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
                    removed_bytes += len(queue.remove(item_id))
                queue.stats.bytes -= removed_bytes
                queue.stats.dequeued_total += len(ids)
                self._items_total -= len(ids)
                self._bytes_total -= removed_bytes
                queue.forget_old_times()
            for position, (queue_name, values) in enumerate(transaction.enqueues):
                if values:
                    enqueued.append(self._append(queue_name, values, transaction.options_of(position)))
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

    def _queue(self, queue_name: str) -> Queue:
        queue = self._queues.get(queue_name)
        if queue is None:
            queue = self._queues[queue_name] = Queue()
        return queue

    def _append(self, queue_name: str, values: tuple[bytes, ...], options: EnqueueOptions | None) -> EnqueuedRange:
        queue = self._queue(queue_name)
        meta = self._enqueue_meta(queue, options)
        first = self._next_item_id
        item_id = first
        added_bytes = 0
        for value in values:
            queue.append(item_id, value, None if meta is None else ItemMeta(
                priority=meta.priority, visible_at_ms=meta.visible_at_ms, expires_at_ms=meta.expires_at_ms))
            added_bytes += len(value)
            item_id += 1
        self._next_item_id = item_id
        queue.note_enqueue_time(first, self._now_ms)
        queue.stats.bytes += added_bytes
        queue.stats.enqueued_total += len(values)
        self._items_total += len(values)
        self._bytes_total += added_bytes
        if meta is None:
            return EnqueuedRange(queue_name, first, len(values))
        return EnqueuedRange(queue_name, first, len(values), meta.priority, meta.visible_at_ms, meta.expires_at_ms)

    def _enqueue_meta(self, queue: Queue, options: EnqueueOptions | None) -> ItemMeta | None:
        """Absolute times from the options (or the queue's defaults) at this entry's time; None: plain."""
        settings = queue.settings
        priority = options.priority if options is not None else 0
        delay_ms = options.delay_ms if options is not None and options.delay_ms is not None \
            else settings.default_delay_ms
        ttl_ms = options.ttl_ms if options is not None and options.ttl_ms is not None else settings.default_ttl_ms
        priority = min(priority, settings.max_priority or 0)  # the setting may have shrunk since the enqueue
        if not priority and not delay_ms and ttl_ms is None:
            return None
        return ItemMeta(priority=priority, visible_at_ms=self._now_ms + delay_ms if delay_ms else 0,
                        expires_at_ms=None if ttl_ms is None else self._now_ms + ttl_ms)

    def _move(self, queue: Queue, item_id: int, target_name: str, meta: ItemMeta) -> EnqueuedRange:
        """Move one item to the tail of ``target_name`` under a new id (storage does not change)."""
        value = queue.remove(item_id)
        queue.stats.bytes -= len(value)
        target = self._queue(target_name)
        new_id = self._next_item_id
        self._next_item_id += 1
        target.append(new_id, value, meta)
        target.note_enqueue_time(new_id, self._now_ms)
        target.stats.bytes += len(value)
        target.stats.enqueued_total += 1
        return EnqueuedRange(target_name, new_id, 1, meta.priority, meta.visible_at_ms, meta.expires_at_ms)

    def _kill(self, queue_name: str, queue: Queue, item_id: int, reason: str, note: str | None = None
              ) -> EnqueuedRange | None:
        """An item dies (``reason`` in DEAD_REASONS): to the queue's dead-letter queue, or dropped."""
        assert reason in DEAD_REASONS
        old = queue.meta_of(item_id)
        stats = queue.stats
        if reason == "expired":
            stats.expired_total += 1
        elif reason == "rejected":
            stats.rejected_total += 1
        else:
            stats.max_deliveries_total += 1
        target_name = queue.settings.dead_letter_queue
        if target_name is None or target_name == queue_name:
            value = queue.remove(item_id)
            stats.bytes -= len(value)
            stats.dropped_total += 1
            self._items_total -= 1
            self._bytes_total -= len(value)
            return None
        stats.dead_lettered_total += 1
        target = self._queue(target_name)
        ttl_ms = target.settings.default_ttl_ms
        # Dead items keep their priority (docs/queue-features.md): a move is not an enqueue, and redrive
        # gives it back to the source (clamped to the source's max_priority there).
        meta = ItemMeta(priority=old.priority,
                        expires_at_ms=None if ttl_ms is None else self._now_ms + ttl_ms,
                        dead_reason=reason, dead_source=queue_name, dead_deliveries=old.deliveries, dead_note=note)
        return self._move(queue, item_id, target_name, meta)

    # ------------------------------------------------------------ item actions
    def _apply_action(self, action: ItemsAction, index: int) -> ItemsOutcome:
        queue = self._queues.get(action.queue)
        if queue is None:
            return ItemsOutcome("done", index, action.action, action.queue)
        if len(action.item_ids) > ITEM_ACTION_IDS_MAX:
            return ItemsOutcome("rejected", index, action.action, action.queue, reason="too_many_items")
        acted: list[int] = []
        counts: list[int] = []
        dead: list[int] = []
        removed: list[int] = []
        moved: list[EnqueuedRange] = []
        max_deliveries = queue.settings.max_deliveries
        now = self._now_ms
        for item_id in dict.fromkeys(action.item_ids):  # each id once, in the order given
            if item_id not in queue.items:
                continue
            meta = queue.meta_of(item_id)
            kind = action.action
            if kind == "deliver":
                if max_deliveries is not None and meta.deliveries >= max_deliveries:
                    dead.append(item_id)
                    reason = "max_deliveries"
                else:
                    own = queue.own_meta(item_id)
                    own.deliveries += 1
                    acted.append(item_id)
                    counts.append(own.deliveries)
                    continue
            elif kind == "dead_letter":
                if max_deliveries is None or meta.deliveries < max_deliveries:
                    continue
                reason = "max_deliveries"
            elif kind == "expire":
                if meta.expires_at_ms is None or meta.expires_at_ms > now:
                    continue
                reason = "expired"
            elif kind == "reject":
                reason = "rejected"
            else:  # redrive
                if meta.dead_reason is None or meta.dead_source is None:
                    continue
                acted.append(item_id)
                removed.append(item_id)
                moved.append(self._redrive(queue, item_id, meta))
                continue
            if kind != "deliver":
                acted.append(item_id)
            removed.append(item_id)
            arrival = self._kill(action.queue, queue, item_id, reason, action.note if kind == "reject" else None)
            if arrival is not None:
                moved.append(arrival)
        if removed:
            queue.forget_old_times()
        return ItemsOutcome("done", index, action.action, action.queue, acted=tuple(acted), counts=tuple(counts),
                            dead=tuple(dead), removed=tuple(removed), moved=tuple(moved))

    def _redrive(self, queue: Queue, item_id: int, meta: ItemMeta) -> EnqueuedRange:
        assert meta.dead_source is not None
        source = self._queue(meta.dead_source)
        ttl_ms = source.settings.default_ttl_ms
        queue.stats.redriven_total += 1
        fresh = ItemMeta(priority=min(meta.priority, source.settings.max_priority or 0),
                         expires_at_ms=None if ttl_ms is None else self._now_ms + ttl_ms)
        return self._move(queue, item_id, meta.dead_source, fresh)

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
            settings = change.settings or QueueSettings()
            problem = self.settings_problem(change.queue, settings)
            if problem is not None:
                return rejected(problem)
            if queue is None:
                if len(self._queues) >= QUEUES_MAX:
                    return rejected("too_many_queues")
                queue = self._queues[change.queue] = Queue()
            queue.max_items, queue.max_bytes = change.max_items, change.max_bytes
            queue.settings = settings
            return QueueChangeResult("done", change.queue, change.action)
        if queue is None:
            return rejected("queue_not_found")
        if change.action == "delete" and self.dead_letter_users(change.queue):
            return rejected("queue_in_use")
        bytes_before = queue.stats.bytes
        removed = queue.clear()
        self._items_total -= removed
        self._bytes_total -= bytes_before
        if change.action == "delete":
            del self._queues[change.queue]
        else:
            queue.stats.purged_total += removed
        return QueueChangeResult("done", change.queue, change.action, removed=removed)

    # ----------------------------------------------------------- the directory
    def _apply_member_record(self, record: MemberRecord) -> MemberRecordResult:
        if record.term < self._barrier_term:
            return MemberRecordResult("rejected", record.node_id, reason="stale_leader")
        self._members.pop(record.node_id, None)
        if record.action == "record":
            for node_id, (raft_address, _url) in list(self._members.items()):
                if raft_address == record.raft_address:
                    del self._members[node_id]  # the address now belongs to another node
            self._members[record.node_id] = (record.raft_address, record.http_url)
        return MemberRecordResult("done", record.node_id)

    def member_directory(self) -> dict[str, tuple[str, str]]:
        """node id -> (Raft address, HTTP URL) of every member a membership change recorded."""
        return dict(self._members)

    def settings_problem(self, queue_name: str, settings: QueueSettings) -> str | None:
        """Why ``settings`` cannot be given to ``queue_name`` now (a reason code), or None."""
        if settings.max_deliveries is not None and not 1 <= settings.max_deliveries <= MAX_DELIVERIES_MAX:
            return "max_deliveries_out_of_range"
        if settings.max_priority is not None and not 0 <= settings.max_priority <= MAX_PRIORITY_MAX:
            return "max_priority_out_of_range"
        target = settings.dead_letter_queue
        if target is None:
            return None
        if target == queue_name:
            return "dead_letter_queue_self"
        if target not in self._queues:
            return "dead_letter_queue_unknown"
        seen = {queue_name}
        while target is not None:  # follow the chain of dead-letter queues: it must end
            if target in seen:
                return "dead_letter_queue_cycle"
            seen.add(target)
            next_queue = self._queues.get(target)
            target = next_queue.settings.dead_letter_queue if next_queue is not None else None
        return None

    def dead_letter_users(self, queue_name: str) -> list[str]:
        """The queues whose dead-letter queue is ``queue_name``."""
        return sorted(name for name, q in self._queues.items() if q.settings.dead_letter_queue == queue_name)

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
        return (len(queue.items), item_cost(len(queue.items), queue.stats.bytes)) if queue is not None else (0, 0)

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

    def queue_features(self, queue_name: str) -> QueueSettings | None:
        """The queue's delivery, dead-letter, time and priority settings; None when there is no queue."""
        queue = self._queues.get(queue_name)
        return queue.settings if queue is not None else None

    def count(self, queue_name: str) -> int:
        queue = self._queues.get(queue_name)
        return len(queue.items) if queue is not None else 0

    def queue_names(self) -> list[str]:
        return sorted(self._queues)

    def queue_stats(self, queue_name: str) -> dict[str, int] | None:
        queue = self._queues.get(queue_name)
        return self._stats_of(queue) if queue is not None else None

    def _stats_of(self, queue: Queue) -> dict[str, int]:
        stats = queue.stats
        return {
            "count": len(queue.items),
            "delayed": self._delayed_count(queue),
            "bytes": stats.bytes,
            "cost_bytes": item_cost(len(queue.items), stats.bytes),
            **dict(zip(QueueStats.TOTALS, stats.totals(), strict=True)),
        }

    def _delayed_count(self, queue: Queue) -> int:
        """Items not visible yet at the state machine's time."""
        return queue.delayed_count(self._now_ms)

    def item_meta(self, queue_name: str, item_ids: Iterable[int]) -> list[tuple[ItemMeta, int | None]]:
        """(metadata, enqueue time) of items (plain metadata for an item not there)."""
        queue = self._queues.get(queue_name)
        if queue is None:
            return [(ItemMeta(), None) for _ in item_ids]
        return [(queue.meta_of(i), queue.enqueued_at_ms(i)) for i in item_ids]

    def dead_items(self, queue_name: str, limit: int, source_queue: str | None = None,
                   exclude: set[int] | frozenset[int] = frozenset()) -> list[tuple[int, str]]:
        """Up to ``limit`` (item id, source queue) of dead items in ``queue_name``, head first, from
        ``source_queue`` only when given, leaving out ``exclude``."""
        queue = self._queues.get(queue_name)
        if queue is None:
            return []
        found: list[tuple[int, str]] = []
        for item_id in queue.live_ids():
            meta = queue.meta.get(item_id)
            if meta is None or meta.dead_source is None or item_id in exclude:
                continue
            if source_queue is None or meta.dead_source == source_queue:
                found.append((item_id, meta.dead_source))
                if len(found) >= limit:
                    break
        return found

    def view_seed(self, queue_name: str) -> ViewSeed:
        """What a new leader's view of the queue starts from: the items visible at the state
        machine's time by priority (ranges, head first), the delayed ones, the expiring ones,
        the recorded delivery counts, and the items already at their delivery limit."""
        queue = self._queues.get(queue_name)
        seed = ViewSeed({}, [], [], {}, [])
        if queue is None:
            return seed
        now, meta_of = self._now_ms, queue.meta
        max_deliveries = queue.settings.max_deliveries
        plain: list[int] = []
        by_priority: dict[int, list[int]] = {}
        for item_id in queue.live_ids():
            meta = meta_of.get(item_id)
            if meta is None:
                plain.append(item_id)
                continue
            if meta.expires_at_ms is not None:
                seed.expiring.append((meta.expires_at_ms, item_id))
            if meta.deliveries:
                seed.deliveries[item_id] = meta.deliveries
                if max_deliveries is not None and meta.deliveries >= max_deliveries:
                    seed.at_limit.append(item_id)
                    continue
            if meta.visible_at_ms > now:
                seed.delayed.append((meta.visible_at_ms, item_id, meta.priority))
            elif meta.priority:
                by_priority.setdefault(meta.priority, []).append(item_id)
            else:
                plain.append(item_id)
        if plain:
            by_priority[0] = plain
        seed.ranges = {p: coalesce_ranges(ids) for p, ids in by_priority.items()}
        return seed

    def item_ids(self, queue_name: str) -> list[int]:
        """Ids of the items in ``queue_name``, head first."""
        queue = self._queues.get(queue_name)
        return list(queue.live_ids()) if queue is not None else []

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
                 q.max_bytes, q.settings.as_tuple(), q.stats.totals(), q.time_boundaries())
                for name, q in sorted(self._queues.items())
            ],
            "item_meta": [
                (name, item_id, meta.as_tuple())
                for name, q in sorted(self._queues.items()) for item_id, meta in sorted(q.meta.items())
            ],
            "outcomes": [
                (tid, o.status, o.index, o.at_ms, o.reason) for tid, o in self._outcomes.items()
            ],
            "outcomes_forgotten_term": self._outcomes_forgotten_term,
            "idempotency": [(k, (), r.index, r.at_ms) for k, r in self._idempotency.items()],
            # Only once a membership change recorded one: older states keep their digest.
            **({"members": sorted((node_id, *where) for node_id, where in self._members.items())}
               if self._members else {}),
        }

    def snapshot_items(self) -> Iterator[tuple[str, int, bytes]]:
        """Every item as (queue, item id, value), sorted by queue then id."""
        for name in sorted(self._queues):
            for item_id, value in self._queues[name].items.items():
                yield name, item_id, value

    def restore(self, meta: dict[str, Any], items: Iterable[tuple[str, int, bytes]]) -> None:
        """Discard all state and load a snapshot (``items`` sorted as snapshot_items yields them)."""
        if meta.get("format") not in SNAPSHOT_FORMATS_READ:
            raise ValueError(f"snapshot format {meta.get('format')!r}, expected one of {SNAPSHOT_FORMATS_READ}")
        queues: dict[str, Queue] = {}
        for name, enqueued_total, dequeued_total, *rest in meta["queues"]:
            purged_total, max_items, max_bytes = rest[:3] if rest else (0, None, None)  # format 1: no settings
            queue = queues[name] = Queue(max_items, max_bytes)
            queue.stats.enqueued_total = enqueued_total
            queue.stats.dequeued_total = dequeued_total
            queue.stats.purged_total = purged_total
            if len(rest) > 3:  # format 3: settings, every total, enqueue times
                settings, totals, (time_ids, time_ms) = rest[3:6]
                queue.settings = QueueSettings(*settings)
                for field_name, total in zip(QueueStats.TOTALS, totals, strict=True):
                    setattr(queue.stats, field_name, total)
                queue.restore_times(time_ids, time_ms)
        item_meta = {(name, item_id): fields for name, item_id, fields in meta.get("item_meta", ())}
        self._items_total = self._bytes_total = 0
        for name, item_id, value in items:
            if name not in queues:
                queues[name] = Queue()
            queue = queues[name]
            fields = item_meta.get((name, item_id))
            queue.append(item_id, value, None if fields is None else ItemMeta(*fields))
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
        self._members = {node_id: (raft_address, url) for node_id, raft_address, url in meta.get("members", ())}


@dataclass(slots=True)
class ViewSeed:
    ranges: dict[int, list[tuple[int, int]]]  # priority -> [first, end) ranges of visible ids, head first
    delayed: list[tuple[int, int, int]]  # (visible_at_ms, item id, priority)
    expiring: list[tuple[int, int]]  # (expires_at_ms, item id)
    deliveries: dict[int, int]  # item id -> recorded deliveries
    at_limit: list[int]  # items whose deliveries reached max_deliveries: they must die


def coalesce_ranges(item_ids: Iterable[int]) -> list[tuple[int, int]]:
    """Turn increasing ids into [first, end) ranges of consecutive ids."""
    ranges: list[tuple[int, int]] = []
    for item_id in item_ids:
        if ranges and item_id == ranges[-1][1]:
            ranges[-1] = (ranges[-1][0], item_id + 1)
        else:
            ranges.append((item_id, item_id + 1))
    return ranges
