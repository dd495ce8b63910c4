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
import logging
import secrets
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from rcq.errors import (
    CommitConflict,
    CommitOutcomeUnknown,
    InternalError,
    InvalidRequest,
    LeaderChanged,
    NoLeader,
    NotLeader,
    NotReady,
    OutcomeExpired,
    PayloadTooLarge,
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
    QueueChange,
    QueueChangeResult,
    TransactionWrite,
    UnitOutcome,
)
from rcq.server.leader.admission import Admission, merge_growth
from rcq.server.leader.answers import ClosedTransactions
from rcq.server.leader.deadlines import DeadlineReaper
from rcq.server.leader.group_commit import GroupCommitter
from rcq.server.leader.queue_view import QueueView
from rcq.server.leader.session import AnswerBudget, CommitResult, DequeuedItem, Session, State
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
        self._committer = GroupCommitter(
            replicator,
            units_max=config.commit_batch_units_max,
            bytes_max=config.commit_batch_bytes_max,
            in_flight_max=config.commits_in_flight_max,
            timeout_s=config.commit_timeout_s,
            limits=self._admission.limits,
        )
        self._tasks: set[asyncio.Task[Any]] = set()
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
        self._deadlines.clear()
        self._admission.clear_reservations()

    async def _establish(self, term: int, epoch: int) -> None:
        """Propose a barrier for ``term`` until it is applied (see on_applied)."""
        delay_s = 0.05
        while (epoch == self._epoch and self._serving_term != term and self._replicator.is_leader()
               and self._replicator.term == term):
            try:
                await self._replicator.submit(
                    Barrier(term=term, now_ms=int(time.time() * 1000)), self._config.commit_timeout_s)
            except RcqError as exc:
                log.info("barrier for term %d not applied yet: %s", term, exc.code)
                await asyncio.sleep(delay_s)
                delay_s = min(delay_s * 2, 1.0)

    def on_applied(self, index: int, command: Command | None, result: ApplyResult) -> None:
        """Every applied entry, in apply order, on the loop thread: keep the views in step."""
        if isinstance(result, QueueChangeResult):
            if self._serving_term and result.status == "done" and result.action in ("purge", "delete"):
                self._on_queue_emptied(result.queue, result.action)
            return
        if isinstance(result, BarrierResult):
            if (result.term == self._leader_term and not self._serving_term
                    and self._replicator.term == result.term):
                # Every entry of earlier terms is applied, and nothing after the barrier can
                # change the queues but this leader's own commits: build the views now.
                self._views = self._replicator.read(
                    lambda sm: {q: QueueView.from_ranges(sm.item_ranges(q)) for q in sm.queue_names()})
                self._committer.start_term(result.term)
                self._serving_term = result.term
                log.info("serving as leader of term %d from index %d", result.term, index)
            return
        if not self._serving_term or not isinstance(result, BatchResult):
            return
        if isinstance(command, CommitBatch) and len(command.units) == len(result.outcomes):
            for unit, outcome in zip(command.units, result.outcomes, strict=True):
                self._on_unit_applied(unit, outcome)

    # -------------------------------------------------------------- guards
    def require_serving(self) -> None:
        if self.serving:
            return
        if self._replicator.is_leader():
            raise NotReady()
        url = self._leader_url()
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
            transaction_id=f"{self._serving_term:x}.{secrets.token_hex(12)}",
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
    def enqueue(self, transaction_id: str, queue: str, values: list[bytes], key: str | None = None) -> int:
        """Buffer items; returns how many the transaction holds. A repeated ``key`` buffers nothing."""
        transaction = self._get_open(transaction_id)
        check_queue_name(queue)
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
        transaction.enqueues.setdefault(queue, []).extend(values)
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
            key_queue, ids = transaction.dequeue_keys[key]
            if key_queue != queue:
                raise InvalidRequest(f"dequeue key {key!r} was used for queue {key_queue!r}")
            return self._items(queue, ids)
        if budget.exhausted:
            return []  # this request's answer is full: the items stay at the head for the next one
        loop = asyncio.get_running_loop()
        give_up_at = loop.time() + wait_ms / 1000
        while True:
            view = self._views.get(queue)
            ids = view.take(max_items) if view is not None else []
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
        if key is not None:
            transaction.dequeue_keys[key] = (queue, [item.item_id for item in items])
        return items

    def _items(self, queue: str, ids: list[int]) -> list[DequeuedItem]:
        values = self._replicator.read(lambda sm: sm.values(queue, ids))
        return [DequeuedItem(i, queue, v) for i, v in zip(ids, values, strict=True) if v is not None]

    def _fit_answer(self, transaction: Session, queue: str, items: list[DequeuedItem],
                    budget: AnswerBudget) -> list[DequeuedItem]:
        """Keep what fits the request's answer budget (the first item of an answer always fits); the
        rest goes back to the head."""
        size = 0
        for position, item in enumerate(items):
            size += len(item.value)
            if size > budget.remaining and (position > 0 or budget.answered):
                extra = [i.item_id for i in items[position:]]
                self._views[queue].give_back(extra)
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
            error: RcqError = exc if isinstance(exc, TransactionAborted) else LeaderChanged(exc.message)
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
        if not sm.can_remember(transactions, idempotency_key is not None, int(time.time() * 1000)):
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
        return TransactionWrite(
            transaction_id=transaction.transaction_id,
            enqueues=tuple((q, tuple(v)) for q, v in transaction.enqueues.items() if v),
            dequeues=tuple((q, tuple(ids)) for q, ids in transaction.dequeued.items() if ids),
        )

    def _on_unit_applied(self, unit: CommitUnit, outcome: UnitOutcome) -> None:
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
                    view.give_back([i for i in ids if i not in missing])
        for enqueued in outcome.enqueued:
            view = self._views.get(enqueued.queue)
            if view is None:
                view = self._views[enqueued.queue] = QueueView()
            view.add_range(enqueued.first_item_id, enqueued.count)
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
                    view.give_back(ids)
                    self.returned_total[queue] += len(ids)
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
                    await self._replicator.submit(Barrier(term=self._serving_term, now_ms=int(time.time() * 1000)),
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
    def queue_limits(self, queue: str) -> tuple[tuple[int | None, int | None] | None, tuple[int, int]]:
        """The queue's own (max_items, max_bytes) (None: no such queue), and the limits that apply to it."""
        return self._replicator.read(
            lambda sm: (sm.queue_settings(queue), sm.effective_limits(queue, self._admission.limits)))

    async def change_queue(self, queue: str, action: str, max_items: int | None = None,
                           max_bytes: int | None = None) -> QueueChangeResult:
        """Configure, purge or delete ``queue`` through Raft; answers once applied."""
        self.require_serving()
        check_queue_name(queue)
        # Refused here, a request changes nothing at all (not even the log): a queue that is not
        # there, or one more queue than the cap. The state machine checks again when it applies.
        exists, queues = self._replicator.read(
            lambda sm: (sm.queue_settings(queue) is not None, sm.table_sizes()["queues"]))
        if not exists and action != "configure":
            raise QueueNotFound(f"no queue {queue!r}")
        if not exists and queues >= state_machine.QUEUES_MAX:
            raise TooManyQueues(details={"queue": queue})
        change = QueueChange(term=self._serving_term, now_ms=int(time.time() * 1000), queue=queue,
                             action=action, max_items=max_items, max_bytes=max_bytes)  # type: ignore[arg-type]
        result = await self._replicator.submit(change, self._config.commit_timeout_s)
        if not isinstance(result, QueueChangeResult):
            raise InternalError(f"queue change not applied: {result!r}")
        if result.reason == "queue_not_found":
            raise QueueNotFound(f"no queue {queue!r}")
        if result.reason == "too_many_queues":
            raise TooManyQueues(details={"queue": queue})
        if result.status != "done":
            raise Unavailable(f"the leader changed before the queue change applied ({result.reason}); retry")
        return result

    def _on_queue_emptied(self, queue: str, action: str) -> None:
        """A purge or delete applied: transactions holding its items (or, for a delete, about to
        enqueue into it) are aborted; the items they held are gone, not given back."""
        reason = "queue_purged" if action == "purge" else "queue_deleted"
        for transaction in list(self._transactions.values()):
            if transaction.epoch != self._epoch or transaction.state is not State.OPEN:
                continue
            held = bool(transaction.dequeued.get(queue))
            if held or (action == "delete" and queue in transaction.enqueues):
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
