"""Dequeuer: taking items into an open transaction.

A dequeue locks items in the leader's queue view and waits (up to ``wait_ms``) for items to
arrive, reads their values from the state machine, and keeps within the request's answer budget;
items it does not hand out go back to the head at once.

No item is handed out before a replicated entry proposed after it was taken has committed in this
term (docs/raft-hazards.md, H22): a leader that was stopped, or whose Raft thread hung on its disk,
would otherwise hand out, from its view, items a newer leader had already seen consumed. On a queue
with ``max_deliveries`` that entry is the delivery record (an :class:`ItemsAction` through the group
committer); elsewhere it is the next commit entry, or an empty one (:meth:`GroupCommitter.confirm`).
A one-request transaction (``execute``) needs none: its own commit answers first.

Must not import: pysyncobj, lmdb, aiohttp.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging

from rcq.errors import InvalidRequest, LeaderChanged, PayloadTooLarge, RcqError
from rcq.names import check_queue_name
from rcq.server.config import NodeConfig
from rcq.server.core.commands import ItemsAction, ItemsOutcome
from rcq.server.leader.clock import LeaderClock
from rcq.server.leader.group_commit import GroupCommitter
from rcq.server.leader.leader_state import LeaderState
from rcq.server.leader.placement import Placement
from rcq.server.leader.session import AnswerBudget, DeadLetter, DequeuedItem, Session, State
from rcq.server.raft.protocol import Replicator

log = logging.getLogger(__name__)


class Dequeuer:
    def __init__(self, config: NodeConfig, leader: LeaderState, replicator: Replicator, committer: GroupCommitter,
                 clock: LeaderClock) -> None:
        self._config = config
        self._leader = leader
        self._replicator = replicator
        self._placement = Placement(config, replicator)
        self._committer = committer
        self._clock = clock

    def answer_budget(self) -> AnswerBudget:
        """What one HTTP answer may carry in item bytes: share it between the dequeues of one request."""
        return AnswerBudget(self._config.dequeue_answer_bytes_max)

    async def dequeue(self, transaction_id: str, queue: str, max_items: int = 1, wait_ms: int = 0,
                      key: str | None = None, budget: AnswerBudget | None = None, *,
                      fenced: bool = True) -> list[DequeuedItem]:
        """``fenced=False``: the caller commits the transaction before anyone sees the items (execute)."""
        leader = self._leader
        transaction = leader.get_open(transaction_id)
        budget = budget if budget is not None else self.answer_budget()
        check_queue_name(queue)
        self._placement.check(queue, creates=False)
        if max_items > self._config.dequeue_items_max:
            raise InvalidRequest(f"max_items {max_items} is over the limit {self._config.dequeue_items_max}")
        if wait_ms > self._config.dequeue_wait_max_ms:
            raise InvalidRequest(f"wait_ms {wait_ms} is over the limit {self._config.dequeue_wait_max_ms}")
        allowance = self._config.transaction_items_max - transaction.items_count
        if allowance <= 0:
            raise PayloadTooLarge(f"the transaction holds {transaction.items_count} items; the limit is "
                                  f"{self._config.transaction_items_max}")
        max_items = min(max_items, allowance)
        running = transaction.dequeues_running.get(key) if key is not None else None
        if running is not None:
            # Sent again while the first is still running (a client re-sends what was in flight when
            # its channel dropped; the first goes on, recording deliveries or waiting for items). It
            # answers what the first took, never takes more: the commit removes everything the
            # transaction holds, and items no answer carried would be gone without anyone having them.
            await asyncio.shield(running)
            transaction = leader.get_open(transaction_id)
        if key is not None and key in transaction.dequeue_keys:
            key_queue, replayed = transaction.dequeue_keys[key]
            if key_queue != queue:
                raise InvalidRequest(f"dequeue key {key!r} was used for queue {key_queue!r}")
            return self._items(queue, replayed, delivered=True)
        if budget.exhausted:
            return []  # this request's answer is full: the items stay at the head for the next one
        if key is None:
            return await self._take(transaction, queue, max_items, wait_ms, key, budget, fenced)
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        transaction.dequeues_running[key] = done
        try:
            return await self._take(transaction, queue, max_items, wait_ms, key, budget, fenced)
        finally:
            del transaction.dequeues_running[key]
            done.set_result(None)

    async def _take(self, transaction: Session, queue: str, max_items: int, wait_ms: int, key: str | None,
                    budget: AnswerBudget, fenced: bool) -> list[DequeuedItem]:
        """Lock up to ``max_items`` into the transaction (waiting up to ``wait_ms`` for the first)
        and return them as the answer carries them."""
        leader = self._leader
        transaction_id = transaction.transaction_id
        loop = asyncio.get_running_loop()
        give_up_at = loop.time() + wait_ms / 1000
        while True:
            view = leader.views.get(queue)
            ids: list[int] = []
            if view is not None:
                ids, expired = view.take(max_items, self._clock.now_ms())
                leader.rules.propose("expire", queue, expired)  # found past their expiry on the way
            if ids:
                break
            remaining_s = min(give_up_at, transaction.deadline) - loop.time()
            if remaining_s <= 0 or leader.stopping:
                return []
            waiter = leader.view(queue).waiter()
            try:
                async with asyncio.timeout(remaining_s):
                    await waiter
            except TimeoutError:
                pass
            transaction = leader.get_open(transaction_id)
        if transaction.state is not State.OPEN or transaction.epoch != leader.epoch:
            leader.views[queue].give_back(ids)
            raise leader.closed_error(transaction_id)
        transaction.dequeued.setdefault(queue, []).extend(ids)
        items = self._items(queue, ids)
        self._drop_missing(transaction, queue, items, ids)
        items = self._fit_answer(transaction, queue, items, budget)
        delivers = view is not None and view.max_deliveries is not None  # its delivery record fences it
        if items and (delivers or fenced):
            transaction.deliveries_running += 1  # a commit meanwhile is refused: no answer has the items yet
            try:
                if delivers:
                    items = await self._deliver(transaction, queue, items)
                else:
                    await self._fence(transaction)
            finally:
                transaction.deliveries_running -= 1
        if key is not None:
            transaction.dequeue_keys[key] = (queue, [item.item_id for item in items])
        return items

    async def _deliver(self, transaction: Session, queue: str, items: list[DequeuedItem]) -> list[DequeuedItem]:
        """On a queue with ``max_deliveries``, record each delivery in the replicated state before the
        item is handed out, so a crash of this leader cannot lose the count. Items the entry found at
        their limit went to the dead-letter queue instead: they are not handed out."""
        ids = tuple(item.item_id for item in items)
        try:
            outcome = await self._committer.commit(ItemsAction("deliver", queue, ids), 16 * len(ids))
        except RcqError:
            self._release_held(transaction, queue, items)
            raise
        if not isinstance(outcome, ItemsOutcome) or outcome.status != "done":
            self._release_held(transaction, queue, items)
            raise LeaderChanged()
        if transaction.state is not State.OPEN or transaction.epoch != self._leader.epoch:
            raise self._leader.closed_error(transaction.transaction_id)  # closing gave the items back
        counts = dict(zip(outcome.acted, outcome.counts, strict=True))
        lost = [item for item in items if item.item_id not in counts]
        if lost:  # dead at their limit, or gone: no longer this transaction's
            transaction.drop_held(queue, lost)
        return [dataclasses.replace(item, delivery_count=counts[item.item_id] - 1)
                for item in items if item.item_id in counts]

    async def _fence(self, transaction: Session) -> None:
        """Hand nothing out until an entry proposed after the take commits in this term: a newer
        leader would have fenced it off (docs/raft-hazards.md, H22). Failing (deposed, or no entry
        commits in time), the transaction aborts: every item it holds goes back."""
        try:
            await self._committer.confirm()
        except RcqError:
            leader = self._leader
            if transaction.state is State.OPEN and transaction.epoch == leader.epoch:
                leader.close(transaction, State.ABORTED, "leader_changed")
            raise LeaderChanged() from None
        if transaction.state is not State.OPEN or transaction.epoch != self._leader.epoch:
            raise self._leader.closed_error(transaction.transaction_id)  # closing gave the items back

    def _release_held(self, transaction: Session, queue: str, items: list[DequeuedItem]) -> None:
        """Items whose delivery could not be recorded: not handed out, back to the head. Only
        while the transaction is open: closing it gave them back already (given back twice, an
        item is offered twice), and a commit under way ends them itself (removed, or given back)."""
        transaction.drop_held(queue, items)
        view = self._leader.views.get(queue)
        if view is not None and transaction.epoch == self._leader.epoch and transaction.state is State.OPEN:
            view.give_back([item.item_id for item in items])

    def _items(self, queue: str, ids: list[int], *, delivered: bool = False) -> list[DequeuedItem]:
        """The items with their values and what they carry; ``delivered``: their delivery is
        counted already (a replayed dequeue)."""
        values, metas = self._replicator.read(lambda sm: (sm.values(queue, ids), sm.item_meta(queue, ids)))
        view = self._leader.views.get(queue)
        replicated = view is None or view.max_deliveries is not None
        items = []
        for item_id, value, (meta, enqueued_at_ms) in zip(ids, values, metas, strict=True):
            if value is None:
                continue
            if replicated:
                deliveries = max(0, meta.deliveries - 1) if delivered else meta.deliveries
            else:
                deliveries = view.deliveries.get(item_id, 0) if view is not None else 0
            dead = None if meta.dead_reason is None else DeadLetter(
                meta.dead_reason, meta.dead_source or "", meta.dead_deliveries, meta.dead_note)
            items.append(DequeuedItem(item_id, queue, value, deliveries, meta.priority, enqueued_at_ms, dead,
                                      meta.expires_at_ms, meta.headers))
        return items

    def _fit_answer(self, transaction: Session, queue: str, items: list[DequeuedItem],
                    budget: AnswerBudget) -> list[DequeuedItem]:
        """Keep what fits the request's answer budget (the first item of an answer always fits); the
        rest goes back to the head."""
        size = 0
        for position, item in enumerate(items):
            size += len(item.value)
            if size > budget.remaining and (position > 0 or budget.answered):
                extra = [i.item_id for i in items[position:]]
                self._leader.views[queue].give_back(extra)  # never handed out: no delivery to count
                dropped = set(extra)
                held = transaction.dequeued[queue]
                held[:] = [i for i in held if i not in dropped]
                items = items[:position]
                break
        kept_bytes = sum(len(i.value) for i in items)
        budget.remaining -= kept_bytes
        budget.answered = budget.answered or bool(items)
        transaction.dequeued_bytes[queue] = transaction.dequeued_bytes.get(queue, 0) + kept_bytes
        transaction.items_count += len(items)
        return items

    def _drop_missing(self, transaction: Session, queue: str, items: list[DequeuedItem],
                      ids: list[int]) -> None:
        """Ids the view offered that the replicated queue no longer holds: never commit them."""
        if len(items) == len(ids):
            return
        present = {item.item_id for item in items}
        gone = [i for i in ids if i not in present]
        self._leader.views[queue].forget(gone)
        gone_set = set(gone)
        held = transaction.dequeued[queue]
        held[:] = [i for i in held if i not in gone_set]
        log.warning("queue %s: %d item(s) offered by the view were already removed", queue, len(gone))
