"""CommitPath: a commit from the verb to its answer, and the stream of applied commits.

The walk, one way: :meth:`CommitPath.commit` (or ``commit_many``) checks what can be refused
before anything is proposed (size, storage room, remembered outcomes), marks the sessions
COMMITTING, and hands one :class:`CommitUnit` to the :class:`GroupCommitter`, which proposes it
with others in one Raft entry. When the entry is applied, the replicator's apply listener
(:meth:`TransactionManager.on_applied`) brings the unit's outcome here,
:meth:`CommitPath.on_unit_applied`, which updates the views (items gone, items arrived) and
closes the sessions; the committer's future then answers the waiting verb.

An outcome can be unknown (the entry was proposed, no outcome came within the timeout): such a
transaction keeps its locks until the stream of applied entries closes it, leadership ends, or a
fence settles it (:meth:`CommitPath._settle_unknown`).

Must not import: pysyncobj, lmdb, aiohttp.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from rcq.errors import (
    CommitConflict,
    CommitOutcomeUnknown,
    CrossPartitionTransaction,
    InternalError,
    InvalidRequest,
    LeaderChanged,
    PayloadTooLarge,
    QueueNotFound,
    RcqError,
    TooManyQueues,
    TooManyRequests,
    TransactionAborted,
    TransactionBusy,
    TransactionCommitted,
)
from rcq.names import P0
from rcq.server.config import NodeConfig
from rcq.server.core.commands import Barrier, CommitUnit, TransactionWrite, UnitOutcome
from rcq.server.core.state_machine import QueueStateMachine
from rcq.server.leader.admission import Admission, Growth, merge_growth
from rcq.server.leader.clock import LeaderClock
from rcq.server.leader.group_commit import GroupCommitter
from rcq.server.leader.leader_state import LeaderState
from rcq.server.leader.session import CommitResult, Session, State
from rcq.server.raft.protocol import Replicator

log = logging.getLogger(__name__)


class CommitPath:
    def __init__(self, config: NodeConfig, leader: LeaderState, replicator: Replicator, committer: GroupCommitter,
                 admission: Admission, clock: LeaderClock, spawn: Callable[[Any], None]) -> None:
        self._config = config
        self._leader = leader
        self._replicator = replicator
        self._committer = committer
        self._admission = admission
        self._clock = clock
        self._spawn = spawn
        # The epoch whose fence settling unknown commit outcomes is on its way (None: none is). Kept
        # per epoch: a settle of an earlier epoch may still be winding down when a new one is needed.
        self._settling_epoch: int | None = None
        self.on_latency: Callable[[float], None] | None = None  # seconds from commit to outcome (metrics)

    # ------------------------------------------------------------ the verbs
    async def commit(self, transaction_id: str, idempotency_key: str | None = None) -> CommitResult:
        try:
            transaction = self._leader.get(transaction_id)
        except TransactionCommitted as exc:  # a retried commit: answer, never apply twice
            return CommitResult((transaction_id,), int(exc.details.get("index", 0)), True, 0, 0)
        if transaction.state is State.COMMITTING and transaction.commit_future is not None:
            return await asyncio.shield(transaction.commit_future)  # a retry joins the first attempt
        if transaction.state is State.UNKNOWN:
            # Proposed, outcome not applied yet; once it applies, the stream of applied
            # entries closes the transaction and a retry answers from the outcome.
            raise CommitOutcomeUnknown()
        if transaction.state is not State.OPEN:
            transaction = self._leader.get_open(transaction_id)  # raises what a commit of it gets
        return await self._commit_unit([transaction], idempotency_key)

    async def commit_many(self, transaction_ids: list[str],
                          idempotency_key: str | None = None) -> CommitResult:
        if len(set(transaction_ids)) != len(transaction_ids):
            raise InvalidRequest("transaction_ids repeats an id")
        committed_index = None
        try:
            transactions = [self._leader.get_open(t) for t in transaction_ids]
        except TransactionCommitted as exc:
            committed_index = exc.details.get("index")
            # A retried commit_many: a duplicate only if every transaction is committed.
            for transaction_id in transaction_ids:
                try:
                    self._leader.get_open(transaction_id)
                except TransactionCommitted:
                    continue
                raise InvalidRequest(f"transaction {transaction_id} is not committed, others are") from exc
            return CommitResult(tuple(transaction_ids), int(committed_index or 0), True, 0, 0)
        return await self._commit_unit(transactions, idempotency_key)

    # ------------------------------------------------------------ one unit
    async def _commit_unit(self, transactions: list[Session],
                           idempotency_key: str | None) -> CommitResult:
        writes, ids = [], []
        enqueued = dequeued = size = 0
        for t in transactions:  # loops, not generators: this runs for every commit
            if t.deliveries_running:
                raise TransactionBusy(f"a dequeue of transaction {t.transaction_id} has not answered yet (its "
                                      "items are in no answer yet): commit once it has")
            writes.append(write_of(t))
            ids.append(t.transaction_id)
            for values in t.enqueues.values():
                enqueued += len(values)
            for item_ids in t.dequeued.values():
                dequeued += len(item_ids)
            size += t.enqueued_bytes
        if idempotency_key is None and not enqueued and not dequeued:
            for transaction in transactions:  # nothing to replicate
                self._leader.close(transaction, State.COMMITTED, "committed")
            return CommitResult(tuple(ids), 0, False, 0, 0)
        if size > self._config.commit_unit_bytes_max:
            raise PayloadTooLarge(f"the commit would carry {size} bytes of items in one Raft entry; the limit "
                                  f"is {self._config.commit_unit_bytes_max}: commit fewer transactions together")
        # Refused before anything is proposed: the transactions stay open (commit again, or abort).
        growth = transactions[0].growth() if len(transactions) == 1 else merge_growth(t.growth() for t in transactions)
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
            if self.on_latency is not None:
                self.on_latency(time.monotonic() - started)
        except CommitOutcomeUnknown as exc:
            now = asyncio.get_running_loop().time()
            for transaction in transactions:
                # Locks stay until the outcome arrives, leadership ends, or a fence settles it.
                transaction.state = State.UNKNOWN
                transaction.unknown_since = now
            self._settle_unknown_soon()
            _fail(future, exc)
            raise
        except RcqError as exc:
            for transaction in transactions:
                if transaction.state is not State.ABORTED:
                    self._leader.close(transaction, State.ABORTED, exc.code)
            # Definitely not applied (not proposed, or its slot went to another leader's entry):
            # said as leader_changed, with a message that says so, whatever the cause was.
            error: RcqError = exc if isinstance(exc, TransactionAborted) else LeaderChanged(
                f"the leader changed before this commit was applied; it was not ({exc.code}): commit "
                "again in a new transaction", details={"cause": exc.code})
            _fail(future, error)
            raise error from exc
        if outcome.status == "rejected":
            queue = outcome.queue
            placed = self._replicator.read(lambda sm: sm.directory.placed(queue)) \
                if outcome.reason == "queue_placed_elsewhere" and queue is not None else ()
            error = rejection_error(outcome, placed)
            _fail(future, error)
            raise error
        result = CommitResult(tuple(ids), outcome.index, outcome.status == "duplicate", enqueued, dequeued)
        future.set_result(result)
        return result

    def _check_room(self, sm: QueueStateMachine, growth: Growth, transactions: int,
                    idempotency_key: str | None) -> None:
        if idempotency_key is not None and sm.idempotency_key_index(idempotency_key) is not None:
            return  # a repeat of a commit made: proposed, it answers "duplicate", however full the queues are now
        self._admission.check_growth(growth, sm)
        if not sm.can_remember(transactions, idempotency_key, self._clock.now_ms()):
            raise TooManyRequests("the cluster remembers as many recent commits (or idempotency keys) as it "
                                  "can; retry shortly")

    # ------------------------------------------------------------ applied
    def on_unit_applied(self, unit: CommitUnit, outcome: UnitOutcome, now_ms: int) -> None:
        """A commit unit applied (this leader's or, forwarded and fenced, another's): the views follow
        what it removed and added, and its transactions close."""
        leader = self._leader
        applied = outcome.status == "committed"
        missing = set(outcome.missing_item_ids)
        for write in unit.transactions:
            # Only this leader's own transactions hold locks in the views. A unit of another
            # leader (a forwarded, fenced entry) may name items one of ours holds now: giving
            # them back would hand them out twice.
            ours = leader.sessions.get(write.transaction_id)
            for queue, ids in write.dequeues:
                view = leader.views.get(queue)
                if view is None:
                    continue
                if applied:
                    view.forget(list(ids))  # gone from the queue, whoever held them
                elif ours is not None and ours.epoch == leader.epoch:
                    # duplicate or rejected: nothing was removed but what was already missing
                    view.forget([i for i in ids if i in missing])
                    leader.rules.return_items(queue, view, [i for i in ids if i not in missing], delivered=True)
        for enqueued in outcome.enqueued:
            leader.view(enqueued.queue).add_range(
                enqueued.first_item_id, enqueued.count, enqueued.priority, enqueued.visible_at_ms,
                enqueued.expires_at_ms, now_ms)
            if enqueued.visible_at_ms > now_ms or enqueued.expires_at_ms is not None:
                leader.rules.wake()  # the timer may have to run sooner
        state = State.ABORTED if outcome.status == "rejected" else State.COMMITTED
        for write in unit.transactions:
            transaction = leader.sessions.get(write.transaction_id)
            if transaction is not None:
                leader.forget(transaction, state, outcome.reason or outcome.status)

    # ------------------------------------------------------------ unknown outcomes
    def _settle_unknown_soon(self) -> None:
        epoch = self._leader.epoch
        if self._settling_epoch != epoch:
            self._settling_epoch = epoch
            self._spawn(self._settle_unknown(epoch))

    async def _settle_unknown(self, epoch: int) -> None:
        """Commits whose outcome is unknown hold their locks; settle them within a bound.

        A fence (a barrier of this term) is proposed after them: entries of one leader are
        appended in the order they are proposed, so once the fence is applied, a commit of ours
        that is still unknown was never appended, and never will be — it is aborted, its items
        are free again. One that did apply was closed by the stream of applied entries already
        (it reaches the loop before the fence's answer)."""
        leader = self._leader
        delay_s = 0.05
        try:
            while epoch == leader.epoch and leader.serving:
                fence_from = asyncio.get_running_loop().time()
                waiting = [t for t in leader.sessions.values()
                           if t.state is State.UNKNOWN and t.unknown_since is not None and t.unknown_since <= fence_from]
                if not waiting:
                    return
                try:
                    await self._replicator.submit(Barrier(term=leader.serving_term, now_ms=self._clock.now_ms()),
                                                  self._config.commit_timeout_s)
                except RcqError as exc:
                    log.info("fence for unknown commit outcomes not applied yet: %s", exc.code)
                    await asyncio.sleep(delay_s)
                    delay_s = min(delay_s * 2, 1.0)
                    continue
                if epoch != leader.epoch:
                    return
                for transaction in waiting:
                    if leader.sessions.get(transaction.transaction_id) is transaction \
                            and transaction.state is State.UNKNOWN:
                        leader.close(transaction, State.ABORTED, "commit_not_applied")
        finally:
            if self._settling_epoch == epoch:
                self._settling_epoch = None


def _fail(future: asyncio.Future[CommitResult], error: BaseException) -> None:
    """Fail the future a retried commit would join; marked retrieved, as a retry may never come."""
    future.set_exception(error)
    future.exception()


def write_of(transaction: Session) -> TransactionWrite:
    """What a transaction's commit writes: its buffered enqueues and the ids it dequeued."""
    groups = [(queue, options, tuple(v)) for (queue, options), v in transaction.enqueues.items() if v]
    headers = transaction.enqueue_headers
    return TransactionWrite(
        transaction_id=transaction.transaction_id,
        enqueues=tuple((queue, values) for queue, _, values in groups),
        dequeues=tuple((q, tuple(ids)) for q, ids in transaction.dequeued.items() if ids),
        enqueue_options=tuple(options for _, options, _ in groups) if any(o for _, o, _ in groups) else (),
        # Only when some item has headers: a commit without any is written as level 1 writes it.
        enqueue_headers=tuple(
            tuple(headers[(queue, options)]) if (queue, options) in headers else None
            for queue, options, _ in groups) if headers else (),
    )


def rejection_error(outcome: UnitOutcome, placed: tuple[str, ...] = ()) -> RcqError:
    """What a client hears when the state machine rejected its commit (the transaction is aborted);
    ``placed``: where the directory places the queue of a ``queue_placed_elsewhere``."""
    reason = outcome.reason
    if reason == "stale_leader":
        return LeaderChanged()
    if reason == "too_many_queues":
        return TooManyQueues(f"the commit would create queue {outcome.queue!r}, but the cluster holds the "
                             "most queues it may; the transaction was aborted", details={"queue": outcome.queue})
    if reason == "queue_placed_elsewhere":  # placed in another partition after the verb was let in
        return CrossPartitionTransaction(
            f"queue {outcome.queue!r} was placed in another partition before this commit applied; the "
            "transaction was aborted (docs/partitions.md)",
            details={"queue": outcome.queue, "queue_partitions": list(placed), "transaction_partition": P0})
    if reason == "queue_not_found":  # a partition process creates a queue only by a placed PUT
        return QueueNotFound(f"queue {outcome.queue!r} is not in this partition (deleted before the commit "
                             "applied?); the transaction was aborted", details={"queue": outcome.queue})
    if reason in ("outcomes_full", "idempotency_keys_full"):
        return TooManyRequests(f"commit rejected ({reason}); the transaction was aborted")
    return CommitConflict(f"commit rejected: {reason}", details={
        "reason": reason, "queue": outcome.queue, "missing_item_ids": list(outcome.missing_item_ids)})
