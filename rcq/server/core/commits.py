"""The apply of a commit entry (:class:`~rcq.server.core.commands.CommitBatch`): its units in order.

A :class:`~rcq.server.core.commands.CommitUnit` (one or more transactions committed together)
applies whole or not at all: a retry answers what happened first; a unit whose dequeued items
are gone, or that would take a queue past its limits or every queue past the storage budget,
is rejected whole (``queue_full``/``storage_full``, docs/limits.md); a unit that only shrinks
the state always applies, so a full cluster can drain. A unit whose enqueue would create a queue
its partition may not hold is rejected whole too (the partition's rule, docs/partitions.md). Every
outcome is recorded, rejections too. An :class:`~rcq.server.core.commands.ItemsAction` among the units goes to
:mod:`~rcq.server.core.item_actions`.

A batch proposed by a leader deposed before it reached the log's applied part is fenced: the
new leader built its view of the queues at its barrier, and this entry must not change them.

Must not import: asyncio, aiohttp, pysyncobj, lmdb, time, random, uuid, os.
"""

from __future__ import annotations

from collections.abc import Callable

from rcq.server.core.commands import BatchResult, CommitBatch, CommitUnit, ItemsAction, ItemsOutcome, Limits, UnitOutcome
from rcq.server.core.item_actions import apply_action
from rcq.server.core.ledger import Ledger, headers_bytes, item_cost
from rcq.server.core.outcomes import TransactionOutcome, TransactionRecords

Rejection = tuple[str, tuple[int, ...], str | None]  # (reason, missing item ids, the queue it is about)
# Why an enqueue may not create this queue here (a reason code), or None: the partition's rule
# (rcq.server.core.state_machine.QueueStateMachine.new_queue_refusal).
NewQueueRule = Callable[[str], str | None]


def apply_batch(ledger: Ledger, records: TransactionRecords, batch: CommitBatch, index: int, barrier_term: int,
                queues_max: int, item_action_ids_max: int, new_queue_rule: NewQueueRule | None = None) -> BatchResult:
    if batch.term < barrier_term:
        # Proposed by a leader that was deposed before this entry reached the log's applied part
        # (pysyncobj may forward it to the new leader).
        return BatchResult(outcomes=tuple(_fence(records, unit, index, ledger.now_ms) for unit in batch.units))
    return BatchResult(outcomes=tuple(
        apply_action(ledger, unit, index, item_action_ids_max) if isinstance(unit, ItemsAction)
        else _apply_unit(ledger, records, unit, index, batch.limits, queues_max, new_queue_rule)
        for unit in batch.units))


def _fence(records: TransactionRecords, unit: CommitUnit | ItemsAction, index: int, now_ms: int
           ) -> UnitOutcome | ItemsOutcome:
    if isinstance(unit, ItemsAction):
        return ItemsOutcome("rejected", index, unit.action, unit.queue, reason="stale_leader")
    previous = records.previous(unit, index)
    if previous is not None:
        return previous
    records.record(unit, TransactionOutcome("rejected", index, now_ms, "stale_leader"))
    return UnitOutcome("rejected", index, reason="stale_leader")


def _apply_unit(ledger: Ledger, records: TransactionRecords, unit: CommitUnit, index: int, limits: Limits | None,
                queues_max: int, new_queue_rule: NewQueueRule | None) -> UnitOutcome:
    previous = records.previous(unit, index)
    if previous is not None:
        return previous
    full = records.room_problem(unit, ledger.now_ms)
    if full is not None:
        # Not recorded (there is no room): the proposer gets this answer, and a retry of the
        # same transaction is refused by the leader, which closed it.
        return UnitOutcome("rejected", index, reason=full)
    rejection = _check_unit(ledger, unit, limits, queues_max, new_queue_rule)
    if rejection is not None:
        reason, missing, about_queue = rejection
        records.record(unit, TransactionOutcome("rejected", index, ledger.now_ms, reason))
        return UnitOutcome("rejected", index, reason=reason, missing_item_ids=missing, queue=about_queue)
    enqueued = []
    for transaction in unit.transactions:
        for queue_name, ids in transaction.dequeues:
            if ids:  # _check_unit guarantees the queue exists when ids are given
                ledger.dequeue(queue_name, ids)
        for position, (queue_name, values) in enumerate(transaction.enqueues):
            if values:
                enqueued.append(ledger.append(queue_name, values, transaction.options_of(position),
                                              transaction.headers_of(position)))
    records.record(unit, TransactionOutcome("committed", index, ledger.now_ms))
    return UnitOutcome("committed", index, enqueued=tuple(enqueued))


def _check_unit(ledger: Ledger, unit: CommitUnit, limits: Limits | None, queues_max: int,
                new_queue_rule: NewQueueRule | None) -> Rejection | None:
    """Why the unit must be rejected whole; None: apply it."""
    taken: set[int] = set()
    missing: list[int] = []
    new_queues: list[str] = []
    growth: dict[str, list[int]] = {}  # queue -> [items added - removed, bytes added - removed]
    transactions = unit.transactions
    if len(transactions) > 1 and len({t.transaction_id for t in transactions}) != len(transactions):
        return "duplicate_transaction", (), None
    queues = ledger.queues
    for transaction in transactions:
        for queue_name, ids in transaction.dequeues:
            queue = queues.get(queue_name)
            delta = growth.setdefault(queue_name, [0, 0])
            for item_id in ids:
                value = queue.items.get(item_id) if queue is not None else None
                if queue is None or value is None:
                    missing.append(item_id)
                    continue
                if item_id in taken:
                    return "item_dequeued_twice", (item_id,), None
                taken.add(item_id)
                delta[0] -= 1
                delta[1] -= len(value)
                if queue.meta:  # only items with a priority, delay, expiry, deliveries or headers have any
                    delta[1] -= headers_bytes(queue.meta_of(item_id).headers)
        for position, (queue_name, values) in enumerate(transaction.enqueues):
            if values and queue_name not in queues and queue_name not in new_queues:
                new_queues.append(queue_name)
            delta = growth.setdefault(queue_name, [0, 0])
            delta[0] += len(values)
            delta[1] += len(values[0]) if len(values) == 1 else sum(map(len, values))
            headers = transaction.headers_of(position)
            if headers is not None:
                delta[1] += sum(headers_bytes(h) for h in headers)
    if missing:
        return "items_missing", tuple(missing), None
    if new_queue_rule is not None:
        for queue_name in new_queues:
            refusal = new_queue_rule(queue_name)
            if refusal is not None:
                return refusal, (), queue_name
    if len(queues) + len(new_queues) > queues_max:
        return "too_many_queues", (), new_queues[0]
    if limits is not None:
        return _check_limits(ledger, growth, limits)
    return None


def _check_limits(ledger: Ledger, growth: dict[str, list[int]], limits: Limits) -> Rejection | None:
    """Only growth is refused: a unit that shrinks a queue (or the whole state) always applies."""
    total_cost = 0
    for queue_name, (items, item_bytes) in growth.items():
        cost = item_cost(items, item_bytes)
        total_cost += cost
        count_now, cost_now = ledger.usage(queue_name)
        max_items, max_bytes = ledger.effective_limits(queue_name, limits)
        if (items > 0 and count_now + items > max_items) or (cost > 0 and cost_now + cost > max_bytes):
            return "queue_full", (), queue_name
    if total_cost > 0 and ledger.storage_cost + total_cost > limits.storage_bytes_max:
        return "storage_full", (), None
    return None
