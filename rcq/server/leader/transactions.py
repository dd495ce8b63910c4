"""TransactionManager: the leader's open transactions, dequeue locks and deadlines.

Lives on the leader only and is volatile: a dequeue locks items in memory and
costs no replication; only a commit goes through Raft (grouped with others by
the GroupCommitter). A new leader serves nothing until its barrier entry is
applied, i.e. until every entry of earlier terms is applied; it then builds
its queue views from the replicated state. Losing leadership, or any change
of term, aborts every open transaction: their items are simply no longer
locked, so they are back at the head of their queues.

Transaction ids carry the term that created them (``<term hex>.<random>``),
so any later leader can say "aborted: leader changed" about a transaction it
never saw, or "committed" if the replicated outcomes say so (see answers.py).

Its neighbours: ``session`` (one transaction's state), ``deadlines`` (the reaper),
``answers`` (what a closed transaction answers), ``group_commit``, ``queue_view``.
Over 400 lines on purpose: leadership (epochs, the barrier), the verbs, the stream of applied
entries, the settling of unknown commit outcomes and the effects of a purge or delete share one
invariant — a queue view's locks are exactly the items this epoch's open or committing sessions
hold — and splitting them would spread it over files. What is refused before anything is
proposed (storage limits, per-client caps) lives in ``admission``.

Must not import: pysyncobj, lmdb, aiohttp.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from rcq.errors import (
    CommitConflict,
    CommitOutcomeUnknown,
    Forbidden,
    InternalError,
    InvalidRequest,
    LeaderChanged,
    NoLeader,
    NotLeader,
    NotReady,
    OutcomeExpired,
    PayloadTooLarge,
    QueueInUse,
    QueueNotFound,
    RcqError,
    TooManyQueues,
    TooManyRequests,
    TransactionAborted,
    TransactionBusy,
    TransactionCommitted,
    TransactionLifetimeExceeded,
    TransactionNotFound,
    Unavailable,
)
from rcq.names import check_queue_name
from rcq.server.config import NodeConfig
from rcq.server.core import state_machine
from rcq.server.core.commands import (
    ApplyResult,
    Barrier,
    BarrierResult,
    BatchResult,
    Command,
    CommitBatch,
    CommitUnit,
    EnqueueOptions,
    ItemsAction,
    ItemsOutcome,
    QueueChange,
    QueueChangeResult,
    QueueSettings,
    TransactionWrite,
    UnitOutcome,
)
from rcq.server.leader.admission import Admission, merge_growth
from rcq.server.leader.answers import ClosedTransactions
from rcq.server.leader.clock import LeaderClock
from rcq.server.leader.deadlines import DeadlineReaper
from rcq.server.leader.group_commit import GroupCommitter
from rcq.server.leader.item_rules import ItemRules
from rcq.server.leader.queue_view import QueueView
from rcq.server.leader.session import (
    AnswerBudget,
    CommitResult,
    DeadLetter,
    DequeuedItem,
    RandomHex,
    Session,
    State,
)
from rcq.server.raft.protocol import Replicator

log = logging.getLogger(__name__)

# How a transaction ended, as a bounded set of metric labels.
_OUTCOME_LABELS = {"expired": "expired", "leader_changed": "leader_changed", "aborted": "aborted",
                   "queue_purged": "queue_removed", "queue_deleted": "queue_removed",
                   "commit_not_applied": "unknown_settled", "stale_leader": "leader_changed"}


def outcome_label(state: State, reason: str) -> str:
    if state is State.COMMITTED:
        return "committed"
    return _OUTCOME_LABELS.get(reason, "rejected")


class TransactionManager:
    def __init__(self, config: NodeConfig, replicator: Replicator,
                 leader_url: Callable[[], str | None]) -> None:
        self._config = config
        self._replicator = replicator
        self._leader_url = leader_url
        self._transactions: dict[str, Session] = {}
        self._closed = ClosedTransactions(config.closed_transactions_remembered_max)
        self._views: dict[str, QueueView] = {}
        self._deadlines = DeadlineReaper(find=self._open_session, expire=self._expire,
                                         live=lambda: self._transactions.values())
        self._admission = Admission(config)
        self._epoch = 0
        self._serving_term = 0  # term whose barrier is applied; 0 = not serving
        self._leader_term = 0
        self._clock = LeaderClock(config.test_clock_offset_ms)
        self._random_ids = RandomHex(12)
        self._committer = GroupCommitter(
            replicator,
            units_max=config.commit_batch_units_max,
            bytes_max=config.commit_batch_bytes_max,
            in_flight_max=config.commits_in_flight_max,
            timeout_s=config.commit_timeout_s,
            limits=self._admission.limits,
            clock=self._clock.now_ms,
        )
        self._tasks: set[asyncio.Task[Any]] = set()
        self._rules = ItemRules(replicator, self._committer, self._clock, lambda: self._views, self._spawn,
                                lambda: self._serving_term, config.commit_timeout_s)
        self._settling = False  # a fence that settles unknown commit outcomes is on its way
        # What the metrics read (rcq.server.http.metrics): plain counters, kept here once.
        self.closed_total: Counter[str] = Counter()  # how transactions ended, by outcome
        self.returned_total: Counter[str] = Counter()  # items given back to the head, by queue
        self.on_commit_latency: Callable[[float], None] | None = None  # seconds from commit to outcome

    # ------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        self._deadlines.start()
        self._replicator.set_role_listener(self.on_role_change)
        self._replicator.set_apply_listener(self.on_applied)
        if self._replicator.is_leader():
            self.on_role_change(True, self._replicator.term)

    async def stop(self) -> None:
        self._reset(LeaderChanged("the node is shutting down"))
        await self._deadlines.stop()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._committer.close()

    @property
    def serving(self) -> bool:
        return (self._serving_term != 0 and self._replicator.is_leader()
                and self._replicator.term == self._serving_term)

    @property
    def open_count(self) -> int:
        return len(self._transactions)

    @property
    def committer(self) -> GroupCommitter:
        return self._committer

    def on_role_change(self, is_leader: bool, term: int) -> None:
        """Called on the loop thread whenever leadership or term changes."""
        if is_leader and term == self._leader_term and self._epoch:
            return
        self._reset(LeaderChanged())
        self._leader_term = term if is_leader else 0
        if is_leader:
            self._spawn(self._establish(term, self._epoch))

    def _reset(self, error: RcqError) -> None:
        self._epoch += 1
        self._serving_term = 0
        self._committer.start_term(0)
        for transaction in list(self._transactions.values()):
            if transaction.state is State.OPEN:
                self._close(transaction, State.ABORTED, "leader_changed")
            else:
                # Committing, or outcome unknown: its entry may still apply (before a later
                # barrier) or be dropped. Forget it here, so questions about it are answered
                # from the replicated outcome, or by the term rule once that is definite.
                self._drop(transaction)
        for view in self._views.values():
            view.fail_waiters(error)
        self._views = {}
        self._rules.reset()
        self._deadlines.clear()
        self._admission.clear_reservations()

    async def _establish(self, term: int, epoch: int) -> None:
        """Propose a barrier for ``term`` until it is applied (see on_applied)."""
        delay_s = 0.05
        while (epoch == self._epoch and self._serving_term != term and self._replicator.is_leader()
               and self._replicator.term == term):
            try:
                await self._replicator.submit(
                    Barrier(term=term, now_ms=self._clock.now_ms()), self._config.commit_timeout_s)
            except RcqError as exc:
                log.info("barrier for term %d not applied yet: %s", term, exc.code)
                await asyncio.sleep(delay_s)
                delay_s = min(delay_s * 2, 1.0)

    def on_applied(self, index: int, command: Command | None, result: ApplyResult) -> None:
        """Every applied entry, in apply order, on the loop thread: keep the views in step."""
        if command is not None:
            self._clock.observe(command.now_ms)
        if isinstance(result, QueueChangeResult):
            if self._serving_term and result.status == "done" and result.action in ("purge", "delete"):
                self._on_queue_emptied(result.queue, result.action)
            if self._serving_term and result.status == "done" and isinstance(command, QueueChange) \
                    and result.action == "configure":
                view = self._views.get(result.queue)
                if view is None:
                    view = self._views[result.queue] = QueueView()
                view.max_deliveries = command.settings.max_deliveries if command.settings else None
            return
        if isinstance(result, BarrierResult):
            if (result.term == self._leader_term and not self._serving_term
                    and self._replicator.term == result.term):
                # Every entry of earlier terms is applied, and nothing after the barrier can
                # change the queues but this leader's own commits: build the views now.
                seeds = self._replicator.read(lambda sm: [
                    (q, sm.view_seed(q), (sm.queue_features(q) or QueueSettings()).max_deliveries)
                    for q in sm.queue_names()])
                self._views = {q: QueueView.from_seed(seed, limit) for q, seed, limit in seeds}
                self._committer.start_term(result.term)
                self._serving_term = result.term
                for queue, seed, _ in seeds:  # locked when their leader died, at their limit: they die now
                    self._rules.propose("dead_letter", queue, seed.at_limit)
                epoch = self._epoch
                self._spawn(self._rules.run_timer(lambda: self._epoch == epoch and self.serving))
                log.info("serving as leader of term %d from index %d", result.term, index)
            return
        if not self._serving_term or not isinstance(result, BatchResult):
            return
        if isinstance(command, CommitBatch) and len(command.units) == len(result.outcomes):
            for unit, outcome in zip(command.units, result.outcomes, strict=True):
                if isinstance(unit, ItemsAction) and isinstance(outcome, ItemsOutcome):
                    self._rules.on_applied(outcome, unit, command.now_ms)
                elif isinstance(unit, CommitUnit) and isinstance(outcome, UnitOutcome):
                    self._on_unit_applied(unit, outcome, command.now_ms)

    def leader_url(self) -> str | None:
        """The URL of the leader this node knows of (None: none, or its URL is unknown)."""
        return self._leader_url()

    def entry_stamp(self) -> tuple[int, int]:
        """(term, now in ms) for an administrative entry this serving leader proposes."""
        self.require_serving()
        return self._serving_term, self._clock.now_ms()

    # -------------------------------------------------------------- guards
    def require_serving(self) -> None:
        if self.serving:
            return
        if self._replicator.is_leader():
            raise NotReady()
        url = self.leader_url()
        if url:
            raise NotLeader(leader_url=url)
        raise NoLeader()

    def _get(self, transaction_id: str) -> Session:
        self.require_serving()
        transaction = self._transactions.get(transaction_id)
        if transaction is not None:
            return transaction
        raise self._closed_error(transaction_id)

    def _get_open(self, transaction_id: str) -> Session:
        transaction = self._get(transaction_id)
        if transaction.state is State.OPEN:
            return transaction
        if transaction.state is State.COMMITTING:
            raise TransactionBusy()
        if transaction.state is State.UNKNOWN:
            raise CommitOutcomeUnknown("the transaction's commit was proposed; its outcome is not known yet")
        raise self._closed_error(transaction_id)

    def _closed_error(self, transaction_id: str) -> RcqError:
        outcome, forgotten_term = self._replicator.read(
            lambda sm: (sm.outcome(transaction_id), sm.outcomes_forgotten_term))
        return self._closed.error_for(transaction_id, outcome, self._serving_term, forgotten_term)

    # ------------------------------------------------------------ sessions
    def begin(self, timeout_s: float | None = None, label: str | None = None, client: str = "",
              owner: str = "") -> Session:
        """Open a transaction owned by ``owner`` (a principal); caps count it against ``client``."""
        self.require_serving()
        self._admission.check_begin(client, len(self._transactions))
        timeout_s = self._timeout(timeout_s)
        now = asyncio.get_running_loop().time()
        transaction = Session(
            transaction_id=f"{self._serving_term:x}.{self._random_ids.next()}",
            term=self._serving_term, epoch=self._epoch, label=label, timeout_s=timeout_s,
            deadline=now + timeout_s, created_ms=int(time.time() * 1000), client=client, owner=owner,
            lifetime_deadline=now + self._config.transaction_lifetime_max_s)
        self._transactions[transaction.transaction_id] = transaction
        self._admission.opened(client)
        self._schedule_deadline(transaction)
        return transaction

    def _timeout(self, timeout_s: float | None) -> float:
        if timeout_s is None:
            return self._config.transaction_timeout_default_s
        if timeout_s > self._config.transaction_timeout_max_s:
            raise InvalidRequest(f"timeout_s {timeout_s} is over the limit "
                                 f"{self._config.transaction_timeout_max_s}")
        return timeout_s

    def extend(self, transaction_id: str, timeout_s: float) -> Session:
        transaction = self._get_open(transaction_id)
        timeout_s = self._timeout(timeout_s)
        now = asyncio.get_running_loop().time()
        if now + timeout_s > transaction.lifetime_deadline:
            left = max(0.0, transaction.lifetime_deadline - now)
            raise TransactionLifetimeExceeded(
                f"a transaction lives at most {self._config.transaction_lifetime_max_s} s, extends included; "
                f"this one has {left:.1f} s left", details={"remaining_s": round(left, 3)})
        transaction.timeout_s = timeout_s
        transaction.deadline = now + timeout_s
        self._schedule_deadline(transaction)
        return transaction

    def describe(self, transaction_id: str) -> dict[str, Any]:
        now = asyncio.get_running_loop().time()
        transaction = self._transactions.get(transaction_id) if self.serving else None
        if transaction is not None:
            return transaction.describe(now)
        try:
            error = self._closed_error(transaction_id) if self.serving else None
        except RcqError:
            error = None
        if error is None:
            outcome = self._replicator.read(lambda sm: sm.outcome(transaction_id))
            if outcome is not None:
                return {"transaction_id": transaction_id, "state": outcome.status,
                        "index": outcome.index, "reason": outcome.reason}
            self.require_serving()
            raise TransactionNotFound(f"no transaction {transaction_id!r}")
        if isinstance(error, TransactionNotFound):
            raise error
        state = ("committed" if isinstance(error, TransactionCommitted)
                 else "unknown" if isinstance(error, OutcomeExpired) else "aborted")
        body = {"transaction_id": transaction_id, "state": state, "reason": error.code}
        body.update(error.details)
        return body

    def check_owner(self, transaction_id: str, owner: str) -> None:
        """A transaction open on this leader, or closed by it recently (the last
        ``closed_transactions_remembered_max``), is invisible to every principal but its owner: the
        same 404 as for an id never seen, so another principal learns nothing of it. (An outcome
        from before this leader is answered to whoever holds the id: owners are not replicated.)"""
        transaction = self._transactions.get(transaction_id)
        known_owner = transaction.owner if transaction is not None else self._closed.owner_of(transaction_id)
        if known_owner is not None and known_owner != owner:
            raise TransactionNotFound(f"no transaction {transaction_id!r}")

    def list_open(self, label_prefix: str | None = None, owner: str = "") -> list[dict[str, Any]]:
        """The open transactions of ``owner``."""
        self.require_serving()
        now = asyncio.get_running_loop().time()
        return [t.describe(now) for t in self._transactions.values()
                if t.owner == owner and (label_prefix is None or (t.label or "").startswith(label_prefix))]

    # ---------------------------------------------------------- operations
    def enqueue(self, transaction_id: str, queue: str, values: list[bytes], key: str | None = None,
                options: EnqueueOptions | None = None) -> int:
        """Buffer items; returns how many the transaction holds. A repeated ``key`` buffers nothing."""
        transaction = self._get_open(transaction_id)
        check_queue_name(queue)
        if options is not None and options.priority:
            features = self._replicator.read(lambda sm: sm.queue_features(queue))
            allowed = (features.max_priority if features is not None else None) or 0
            if options.priority > allowed:
                raise InvalidRequest(f"priority {options.priority} is over queue {queue!r}'s max_priority {allowed} "
                                     "(set it with PUT /v1/queues/{queue})",
                                     details={"queue": queue, "max_priority": allowed})
        if key is not None and key in transaction.enqueue_keys:
            if transaction.enqueue_keys[key] != (queue, len(values)):
                raise InvalidRequest(f"enqueue key {key!r} was used for other items")
            return sum(len(v) for v in transaction.enqueues.values())
        size = sum(len(v) for v in values)
        if transaction.enqueued_bytes + size > self._config.commit_batch_bytes_max:
            raise PayloadTooLarge(
                f"the transaction would hold {transaction.enqueued_bytes + size} bytes of items; "
                f"the limit is {self._config.commit_batch_bytes_max}")
        if transaction.items_count + len(values) > self._config.transaction_items_max:
            raise PayloadTooLarge(
                f"the transaction would hold {transaction.items_count + len(values)} items; the limit is "
                f"{self._config.transaction_items_max}")
        growth = merge_growth([transaction.growth(), {queue: (len(values), size)}])
        self._replicator.read(lambda sm: self._admission.check_growth(growth, sm))
        items_before, bytes_before = transaction.enqueued_sizes.get(queue, (0, 0))
        transaction.enqueues.setdefault((queue, options), []).extend(values)
        transaction.enqueued_bytes += size
        transaction.enqueued_sizes[queue] = (items_before + len(values), bytes_before + size)
        transaction.items_count += len(values)
        if key is not None:
            transaction.enqueue_keys[key] = (queue, len(values))
        return sum(len(v) for v in transaction.enqueues.values())

    def answer_budget(self) -> AnswerBudget:
        """What one HTTP answer may carry in item bytes: share it between the dequeues of one request."""
        return AnswerBudget(self._config.dequeue_answer_bytes_max)

    async def dequeue(self, transaction_id: str, queue: str, max_items: int = 1, wait_ms: int = 0,
                      key: str | None = None, budget: AnswerBudget | None = None) -> list[DequeuedItem]:
        transaction = self._get_open(transaction_id)
        budget = budget if budget is not None else self.answer_budget()
        check_queue_name(queue)
        if max_items > self._config.dequeue_items_max:
            raise InvalidRequest(f"max_items {max_items} is over the limit {self._config.dequeue_items_max}")
        if wait_ms > self._config.dequeue_wait_max_ms:
            raise InvalidRequest(f"wait_ms {wait_ms} is over the limit {self._config.dequeue_wait_max_ms}")
        allowance = self._config.transaction_items_max - transaction.items_count
        if allowance <= 0:
            raise PayloadTooLarge(f"the transaction holds {transaction.items_count} items; the limit is "
                                  f"{self._config.transaction_items_max}")
        max_items = min(max_items, allowance)
        if key is not None and key in transaction.dequeue_keys:
            key_queue, replayed = transaction.dequeue_keys[key]
            if key_queue != queue:
                raise InvalidRequest(f"dequeue key {key!r} was used for queue {key_queue!r}")
            return self._items(queue, replayed, delivered=True)
        if budget.exhausted:
            return []  # this request's answer is full: the items stay at the head for the next one
        loop = asyncio.get_running_loop()
        give_up_at = loop.time() + wait_ms / 1000
        while True:
            view = self._views.get(queue)
            ids: list[int] = []
            if view is not None:
                ids, expired = view.take(max_items, self._clock.now_ms())
                self._rules.propose("expire", queue, expired)  # found past their expiry on the way
            if ids:
                break
            remaining_s = min(give_up_at, transaction.deadline) - loop.time()
            if remaining_s <= 0:
                return []
            if view is None:
                view = self._views[queue] = QueueView()
            waiter = view.waiter()
            try:
                async with asyncio.timeout(remaining_s):
                    await waiter
            except TimeoutError:
                pass
            transaction = self._get_open(transaction_id)
        if transaction.state is not State.OPEN or transaction.epoch != self._epoch:
            self._views[queue].give_back(ids)
            raise self._closed_error(transaction_id)
        transaction.dequeued.setdefault(queue, []).extend(ids)
        items = self._items(queue, ids)
        self._drop_missing(transaction, queue, items, ids)
        items = self._fit_answer(transaction, queue, items, budget)
        if items and view is not None and view.max_deliveries is not None:
            items = await self._deliver(transaction, queue, items)
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
        if transaction.state is not State.OPEN or transaction.epoch != self._epoch:
            raise self._closed_error(transaction.transaction_id)  # closing gave the items back
        counts = dict(zip(outcome.acted, outcome.counts, strict=True))
        lost = [item for item in items if item.item_id not in counts]
        if lost:  # dead at their limit, or gone: no longer this transaction's
            self._drop_held(transaction, queue, lost)
        return [dataclasses.replace(item, delivery_count=counts[item.item_id] - 1)
                for item in items if item.item_id in counts]

    def _release_held(self, transaction: Session, queue: str, items: list[DequeuedItem]) -> None:
        """Items whose delivery could not be recorded: not handed out, back to the head."""
        self._drop_held(transaction, queue, items)
        view = self._views.get(queue)
        if view is not None and transaction.epoch == self._epoch:
            view.give_back([item.item_id for item in items])

    @staticmethod
    def _drop_held(transaction: Session, queue: str, items: list[DequeuedItem]) -> None:
        dropped = {item.item_id for item in items}
        held = transaction.dequeued.get(queue, [])
        held[:] = [i for i in held if i not in dropped]
        dropped_bytes = sum(len(item.value) for item in items)
        transaction.dequeued_bytes[queue] = transaction.dequeued_bytes.get(queue, 0) - dropped_bytes
        transaction.items_count -= len(items)

    def _items(self, queue: str, ids: list[int], *, delivered: bool = False) -> list[DequeuedItem]:
        """The items with their values and what they carry; ``delivered``: their delivery is
        counted already (a replayed dequeue)."""
        values, metas = self._replicator.read(lambda sm: (sm.values(queue, ids), sm.item_meta(queue, ids)))
        view = self._views.get(queue)
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
                                      meta.expires_at_ms))
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
                self._views[queue].give_back(extra)  # never handed out: no delivery to count
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
        self._views[queue].forget(gone)
        gone_set = set(gone)
        held = transaction.dequeued[queue]
        held[:] = [i for i in held if i not in gone_set]
        log.warning("queue %s: %d item(s) offered by the view were already removed", queue, len(gone))

    def abort(self, transaction_id: str) -> int:
        transaction = self._get_open(transaction_id)
        returned = sum(len(ids) for ids in transaction.dequeued.values())
        self._close(transaction, State.ABORTED, "aborted")
        return returned

    async def commit(self, transaction_id: str, idempotency_key: str | None = None) -> CommitResult:
        try:
            transaction = self._get(transaction_id)
        except TransactionCommitted as exc:  # a retried commit: answer, never apply twice
            return CommitResult((transaction_id,), int(exc.details.get("index", 0)), True, 0, 0)
        if transaction.state is State.COMMITTING and transaction.commit_future is not None:
            return await asyncio.shield(transaction.commit_future)  # a retry joins the first attempt
        if transaction.state is State.UNKNOWN:
            # Proposed, outcome not applied yet; once it applies, the stream of applied
            # entries closes the transaction and a retry answers from the outcome.
            raise CommitOutcomeUnknown()
        transaction = self._get_open(transaction_id)
        return await self._commit_unit([transaction], idempotency_key)

    async def commit_many(self, transaction_ids: list[str],
                          idempotency_key: str | None = None) -> CommitResult:
        if len(set(transaction_ids)) != len(transaction_ids):
            raise InvalidRequest("transaction_ids repeats an id")
        committed_index = None
        try:
            transactions = [self._get_open(t) for t in transaction_ids]
        except TransactionCommitted as exc:
            committed_index = exc.details.get("index")
            # A retried commit_many: a duplicate only if every transaction is committed.
            for transaction_id in transaction_ids:
                try:
                    self._get_open(transaction_id)
                except TransactionCommitted:
                    continue
                raise InvalidRequest(f"transaction {transaction_id} is not committed, others are") from exc
            return CommitResult(tuple(transaction_ids), int(committed_index or 0), True, 0, 0)
        return await self._commit_unit(transactions, idempotency_key)

    async def _commit_unit(self, transactions: list[Session],
                           idempotency_key: str | None) -> CommitResult:
        writes = [self._write_of(t) for t in transactions]
        ids = tuple(t.transaction_id for t in transactions)
        enqueued = sum(len(v) for t in transactions for v in t.enqueues.values())
        dequeued = sum(len(v) for t in transactions for v in t.dequeued.values())
        if idempotency_key is None and not enqueued and not dequeued:
            for transaction in transactions:  # nothing to replicate
                self._close(transaction, State.COMMITTED, "committed")
            return CommitResult(ids, 0, False, 0, 0)
        size = sum(t.enqueued_bytes for t in transactions)
        if size > self._config.commit_unit_bytes_max:
            raise PayloadTooLarge(f"the commit would carry {size} bytes of items in one Raft entry; the limit "
                                  f"is {self._config.commit_unit_bytes_max}: commit fewer transactions together")
        # Refused before anything is proposed: the transactions stay open (commit again, or abort).
        growth = merge_growth(t.growth() for t in transactions)
        self._replicator.read(lambda sm: self._check_room(sm, growth, len(transactions), idempotency_key))
        future: asyncio.Future[CommitResult] = asyncio.get_running_loop().create_future()
        for transaction in transactions:
            transaction.state = State.COMMITTING
            transaction.commit_future = future
        self._admission.reserve(growth)
        transactions[0].reserved = growth  # released when the transaction is forgotten, however it ends
        unit_future = self._committer.commit(CommitUnit(tuple(writes), idempotency_key), size)
        started = time.monotonic()
        try:
            outcome = await unit_future
            if not isinstance(outcome, UnitOutcome):
                raise InternalError(f"a commit unit got {outcome!r}")
            if self.on_commit_latency is not None:
                self.on_commit_latency(time.monotonic() - started)
        except CommitOutcomeUnknown as exc:
            now = asyncio.get_running_loop().time()
            for transaction in transactions:
                # Locks stay until the outcome arrives, leadership ends, or a fence settles it.
                transaction.state = State.UNKNOWN
                transaction.unknown_since = now
            self._settle_unknown_soon()
            future.set_exception(exc)
            future.exception()  # retrieved: a joined retry may never come
            raise
        except RcqError as exc:
            for transaction in transactions:
                if transaction.state is not State.ABORTED:
                    self._close(transaction, State.ABORTED, exc.code)
            # Definitely not applied (not proposed, or its slot went to another leader's entry):
            # said as leader_changed, with a message that says so, whatever the cause was.
            error: RcqError = exc if isinstance(exc, TransactionAborted) else LeaderChanged(
                f"the leader changed before this commit was applied; it was not ({exc.code}): commit "
                "again in a new transaction", details={"cause": exc.code})
            future.set_exception(error)
            future.exception()
            raise error from exc
        if outcome.status == "rejected":
            error = self._rejection_error(outcome)
            future.set_exception(error)
            future.exception()
            raise error
        result = CommitResult(ids, outcome.index, outcome.status == "duplicate", enqueued, dequeued)
        future.set_result(result)
        return result

    def _check_room(self, sm: state_machine.QueueStateMachine, growth: dict[str, tuple[int, int]], transactions: int,
                    idempotency_key: str | None) -> None:
        self._admission.check_growth(growth, sm)
        if not sm.can_remember(transactions, idempotency_key is not None, self._clock.now_ms()):
            raise TooManyRequests("the cluster remembers as many recent commits (or idempotency keys) as it "
                                  "can; retry shortly")

    @staticmethod
    def _rejection_error(outcome: UnitOutcome) -> RcqError:
        """What a client hears when the state machine rejected its commit (the transaction is aborted)."""
        reason = outcome.reason
        if reason == "stale_leader":
            return LeaderChanged()
        if reason == "too_many_queues":
            return TooManyQueues(f"the commit would create queue {outcome.queue!r}, but the cluster holds the "
                                 "most queues it may; the transaction was aborted", details={"queue": outcome.queue})
        if reason in ("outcomes_full", "idempotency_keys_full"):
            return TooManyRequests(f"commit rejected ({reason}); the transaction was aborted")
        return CommitConflict(f"commit rejected: {reason}", details={
            "reason": reason, "queue": outcome.queue, "missing_item_ids": list(outcome.missing_item_ids)})

    @staticmethod
    def _write_of(transaction: Session) -> TransactionWrite:
        groups = [(queue, options, tuple(v)) for (queue, options), v in transaction.enqueues.items() if v]
        return TransactionWrite(
            transaction_id=transaction.transaction_id,
            enqueues=tuple((queue, values) for queue, _, values in groups),
            dequeues=tuple((q, tuple(ids)) for q, ids in transaction.dequeued.items() if ids),
            enqueue_options=tuple(options for _, options, _ in groups) if any(o for _, o, _ in groups) else (),
        )

    def _on_unit_applied(self, unit: CommitUnit, outcome: UnitOutcome, now_ms: int) -> None:
        applied = outcome.status == "committed"
        missing = set(outcome.missing_item_ids)
        for write in unit.transactions:
            # Only this leader's own transactions hold locks in the views. A unit of another
            # leader (a forwarded, fenced entry) may name items one of ours holds now: giving
            # them back would hand them out twice.
            ours = self._transactions.get(write.transaction_id)
            for queue, ids in write.dequeues:
                view = self._views.get(queue)
                if view is None:
                    continue
                if applied:
                    view.forget(list(ids))  # gone from the queue, whoever held them
                elif ours is not None and ours.epoch == self._epoch:
                    # duplicate or rejected: nothing was removed but what was already missing
                    view.forget([i for i in ids if i in missing])
                    self._rules.return_items(queue, view, [i for i in ids if i not in missing], delivered=True)
        for enqueued in outcome.enqueued:
            view = self._views.get(enqueued.queue)
            if view is None:
                view = self._views[enqueued.queue] = QueueView()
            view.add_range(enqueued.first_item_id, enqueued.count, enqueued.priority, enqueued.visible_at_ms,
                           enqueued.expires_at_ms, now_ms)
            if enqueued.visible_at_ms > now_ms or enqueued.expires_at_ms is not None:
                self._rules.wake()  # the timer may have to run sooner
        state = State.ABORTED if outcome.status == "rejected" else State.COMMITTED
        for write in unit.transactions:
            transaction = self._transactions.get(write.transaction_id)
            if transaction is not None:
                self._forget_transaction(transaction, state, outcome.reason or outcome.status)

    # ------------------------------------------------------------- closing
    def _close(self, transaction: Session, state: State, reason: str) -> None:
        """End an open transaction without a commit: its locked items go back to the head."""
        if transaction.epoch == self._epoch:
            for queue, ids in transaction.dequeued.items():
                view = self._views.get(queue)
                if view is not None:
                    self.returned_total[queue] += self._rules.return_items(queue, view, ids, delivered=True)
        self._forget_transaction(transaction, state, reason)

    def _forget_transaction(self, transaction: Session, state: State, reason: str) -> None:
        transaction.state = state
        self.closed_total[outcome_label(state, reason)] += 1
        self._drop(transaction)
        self._closed.remember(transaction.transaction_id, state, reason, transaction.owner)

    def _drop(self, transaction: Session) -> None:
        if self._transactions.pop(transaction.transaction_id, None) is not None:
            self._admission.closed(transaction.client)
        if transaction.reserved is not None:
            self._admission.release(transaction.reserved)
            transaction.reserved = None

    # ------------------------------------------------------- unknown outcomes
    def _settle_unknown_soon(self) -> None:
        if not self._settling:
            self._settling = True
            self._spawn(self._settle_unknown(self._epoch))

    async def _settle_unknown(self, epoch: int) -> None:
        """Commits whose outcome is unknown hold their locks; settle them within a bound.

        A fence (a barrier of this term) is proposed after them: entries of one leader are
        appended in the order they are proposed, so once the fence is applied, a commit of ours
        that is still unknown was never appended, and never will be — it is aborted, its items
        are free again. One that did apply was closed by the stream of applied entries already
        (it reaches the loop before the fence's answer)."""
        delay_s = 0.05
        try:
            while epoch == self._epoch and self.serving:
                fence_from = asyncio.get_running_loop().time()
                waiting = [t for t in self._transactions.values()
                           if t.state is State.UNKNOWN and t.unknown_since is not None and t.unknown_since <= fence_from]
                if not waiting:
                    return
                try:
                    await self._replicator.submit(Barrier(term=self._serving_term, now_ms=self._clock.now_ms()),
                                                  self._config.commit_timeout_s)
                except RcqError as exc:
                    log.info("fence for unknown commit outcomes not applied yet: %s", exc.code)
                    await asyncio.sleep(delay_s)
                    delay_s = min(delay_s * 2, 1.0)
                    continue
                if epoch != self._epoch:
                    return
                for transaction in waiting:
                    if self._transactions.get(transaction.transaction_id) is transaction \
                            and transaction.state is State.UNKNOWN:
                        self._close(transaction, State.ABORTED, "commit_not_applied")
        finally:
            if epoch == self._epoch:
                self._settling = False

    # ------------------------------------------------------------ queue admin
    def queue_limits(self, queue: str) -> tuple[tuple[int | None, int | None] | None, tuple[int, int],
                                                QueueSettings | None]:
        """The queue's own (max_items, max_bytes) (None: no such queue), the limits that apply to it,
        and its other settings."""
        return self._replicator.read(lambda sm: (
            sm.queue_settings(queue), sm.effective_limits(queue, self._admission.limits), sm.queue_features(queue)))

    async def change_queue(self, queue: str, action: str, max_items: int | None = None,
                           max_bytes: int | None = None, settings: QueueSettings | None = None) -> QueueChangeResult:
        """Configure, purge or delete ``queue`` through Raft; answers once applied."""
        self.require_serving()
        check_queue_name(queue)
        # Refused here, a request changes nothing at all (not even the log): a queue that is not
        # there, one more queue than the cap, bad settings, a dead-letter queue still in use. The
        # state machine checks again when it applies.
        exists, queues, problem, users = self._replicator.read(lambda sm: (
            sm.queue_settings(queue) is not None, sm.table_sizes()["queues"],
            sm.settings_problem(queue, settings) if settings is not None else None, sm.dead_letter_users(queue)))
        if not exists and action != "configure":
            raise QueueNotFound(f"no queue {queue!r}")
        if not exists and queues >= state_machine.QUEUES_MAX:
            raise TooManyQueues(details={"queue": queue})
        if action == "configure" and problem is not None:
            raise self._settings_error(queue, settings, problem)
        if action == "delete" and users:
            raise self._in_use_error(queue, users)
        change = QueueChange(term=self._serving_term, now_ms=self._clock.now_ms(), queue=queue,
                             action=action, max_items=max_items, max_bytes=max_bytes,  # type: ignore[arg-type]
                             settings=settings if settings != QueueSettings() else None)
        result = await self._replicator.submit(change, self._config.commit_timeout_s)
        if not isinstance(result, QueueChangeResult):
            raise InternalError(f"queue change not applied: {result!r}")
        if result.reason == "queue_not_found":
            raise QueueNotFound(f"no queue {queue!r}")
        if result.reason == "too_many_queues":
            raise TooManyQueues(details={"queue": queue})
        if result.reason == "queue_in_use":
            raise self._in_use_error(queue, self._replicator.read(lambda sm: sm.dead_letter_users(queue)))
        if result.status != "done" and result.reason and result.reason != "stale_leader" and settings is not None:
            raise self._settings_error(queue, settings, result.reason)
        if result.status != "done":
            raise Unavailable(f"the leader changed before the queue change applied ({result.reason}); retry")
        return result

    @staticmethod
    def _settings_error(queue: str, settings: QueueSettings | None, problem: str) -> InvalidRequest:
        target = settings.dead_letter_queue if settings is not None else None
        messages = {
            "dead_letter_queue_self": f"queue {queue!r} cannot be its own dead-letter queue",
            "dead_letter_queue_unknown": f"dead-letter queue {target!r} does not exist: create it first "
                                         "(PUT /v1/queues/{name})",
            "dead_letter_queue_cycle": f"dead-letter queue {target!r} leads back to {queue!r}: dead-letter "
                                       "queues must not form a cycle",
        }
        return InvalidRequest(messages.get(problem, f"invalid queue settings: {problem}"),
                              details={"queue": queue, "reason": problem})

    @staticmethod
    def _in_use_error(queue: str, users: list[str]) -> QueueInUse:
        return QueueInUse(f"queue {queue!r} is the dead-letter queue of {', '.join(map(repr, users[:5]))}; "
                          "remove that setting first", details={"queue": queue, "used_by": users[:100]})

    # ----------------------------------------------------- dead letters
    async def reject(self, transaction_id: str, queue: str, item_ids: list[int], note: str | None = None
                     ) -> tuple[int, str | None]:
        """Items this transaction dequeued from ``queue`` die at once (reason ``rejected``): to the
        dead-letter queue, or dropped. They are no longer the transaction's, whatever it does next.
        Returns how many were rejected and the dead-letter queue (None: dropped)."""
        transaction = self._get_open(transaction_id)
        check_queue_name(queue)
        held = transaction.dequeued.get(queue, [])
        not_held = sorted(set(item_ids) - set(held))
        if not_held:
            raise InvalidRequest(f"item(s) {not_held[:10]} of queue {queue!r} are not held by this transaction",
                                 details={"item_ids": not_held[:100]})
        if not item_ids:
            return 0, None
        values = self._replicator.read(lambda sm: sm.values(queue, item_ids))
        self._drop_held(transaction, queue, [DequeuedItem(i, queue, v or b"") for i, v in
                                             zip(item_ids, values, strict=True)])
        view = self._views[queue]
        unique = list(dict.fromkeys(item_ids))
        view.release(unique)
        outcomes = await self._rules.settle(self._rules.propose("reject", queue, unique, note))
        target = self._replicator.read(lambda sm: (sm.queue_features(queue) or QueueSettings()).dead_letter_queue)
        return sum(len(o.acted) for o in outcomes), target

    async def redrive(self, dead_letter_queue: str, max_items: int | None = None, source_queue: str | None = None,
                      may_redrive_to: Callable[[str], bool] = lambda _: True) -> dict[str, int]:
        """Move dead items of ``dead_letter_queue`` that no transaction holds back to their source
        queues (at most ``max_items``, and only from ``source_queue`` when given), in one entry.
        Returns how many went to each source queue."""
        self.require_serving()
        check_queue_name(dead_letter_queue)
        limit = min(max_items or state_machine.ITEM_ACTION_IDS_MAX, state_machine.ITEM_ACTION_IDS_MAX)
        view = self._views.get(dead_letter_queue)
        locked = view.locked if view is not None else set()
        exists, candidates = self._replicator.read(lambda sm: (
            sm.queue_settings(dead_letter_queue) is not None,
            sm.dead_items(dead_letter_queue, limit, source_queue, locked)))
        if not exists:
            raise QueueNotFound(f"no queue {dead_letter_queue!r}")
        sources = sorted({source for _, source in candidates})
        refused = [s for s in sources if not may_redrive_to(s)]
        if refused:
            raise Forbidden(f"redriving needs produce permission on {refused[0]!r}", details={"queue": refused[0]})
        if not candidates or view is None:
            return {}
        ids = [item_id for item_id, _ in candidates]
        view.withhold(ids)
        outcomes = await self._rules.settle(self._rules.propose("redrive", dead_letter_queue, ids, taken=False))
        moved: Counter[str] = Counter()
        for outcome in outcomes:
            for arrival in outcome.moved:
                moved[arrival.queue] += arrival.count
        return dict(sorted(moved.items()))

    def queue_counts(self, queue: str) -> dict[str, int] | None:
        """What this leader knows of a queue's items: locked, delayed, ready; None when not serving."""
        if not self.serving:
            return None
        view = self._views.get(queue)
        if view is None:
            return {"locked": 0, "delayed": 0, "ready": 0}
        return {"locked": len(view.locked), "delayed": view.delayed_count(), "ready": view.available_count()}

    def _on_queue_emptied(self, queue: str, action: str) -> None:
        """A purge or delete applied: transactions holding its items (or, for a delete, about to
        enqueue into it) are aborted; the items they held are gone, not given back."""
        reason = "queue_purged" if action == "purge" else "queue_deleted"
        for transaction in list(self._transactions.values()):
            if transaction.epoch != self._epoch or transaction.state is not State.OPEN:
                continue
            held = bool(transaction.dequeued.get(queue))
            if held or (action == "delete" and queue in transaction.enqueued_queues()):
                transaction.dequeued.pop(queue, None)
                self._close(transaction, State.ABORTED, reason)
        view = self._views.pop(queue, None) if action == "delete" else self._views.get(queue)
        if view is not None:
            view.clear()  # wakes waiting dequeuers: they look again
        if action == "purge":
            self._views[queue] = view if view is not None else QueueView()

    # ----------------------------------------------------------- deadlines
    def _schedule_deadline(self, transaction: Session) -> None:
        self._deadlines.schedule(transaction)

    def _open_session(self, transaction_id: str) -> Session | None:
        transaction = self._transactions.get(transaction_id)
        return transaction if transaction is not None and transaction.state is State.OPEN else None

    def _expire(self, transaction: Session) -> None:
        self._close(transaction, State.ABORTED, "expired")

    # --------------------------------------------------------------- stats
    def locked_count(self, queue: str) -> int | None:
        if not self.serving:
            return None
        view = self._views.get(queue)
        return len(view.locked) if view is not None else 0

    def _spawn(self, coroutine: Any) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
