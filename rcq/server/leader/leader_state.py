"""LeaderState: what this leader holds in memory for one epoch, and how a transaction leaves it.

It keeps the leader's open sessions (open, committing, or with an unknown commit outcome), its
queue views, and the rules that act on those views (:class:`ItemRules`). One invariant lives
here and only here: **a queue view's locks are exactly the items this epoch's open or committing
sessions hold.** Every way a transaction ends goes through :meth:`LeaderState.close` or
:meth:`LeaderState.forget`, which keep it: a transaction closed without a commit gives its items back
to the head (or to the rules, when they must leave); one whose commit applied just leaves.

An epoch is one stretch of leadership. :meth:`LeaderState.new_epoch` (leadership lost, or a new term)
aborts every open transaction and drops the views; :meth:`LeaderState.start_serving` (this term's
barrier applied) rebuilds them from the replicated state. ``serving_term`` is that term (0: not
serving). Volatile: nothing here is replicated.

Its neighbours: ``session`` (one transaction), ``answers`` (what a closed one answers),
``queue_view``, ``item_rules``, ``admission`` (whose reservations a closed transaction releases).

Must not import: pysyncobj, lmdb, aiohttp.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

from rcq.errors import CommitOutcomeUnknown, NoLeader, NotLeader, NotReady, RcqError, TransactionBusy
from rcq.server.config import NodeConfig
from rcq.server.core.state_machine import ViewSeed
from rcq.server.leader.admission import Admission
from rcq.server.leader.answers import ClosedTransactions
from rcq.server.leader.clock import LeaderClock
from rcq.server.leader.group_commit import GroupCommitter
from rcq.server.leader.item_rules import ItemRules
from rcq.server.leader.queue_view import QueueView
from rcq.server.leader.session import Session, State
from rcq.server.raft.protocol import Replicator

# How a transaction ended, as a bounded set of metric labels.
_OUTCOME_LABELS = {"expired": "expired", "leader_changed": "leader_changed", "aborted": "aborted",
                   "queue_purged": "queue_removed", "queue_deleted": "queue_removed",
                   "commit_not_applied": "unknown_settled", "stale_leader": "leader_changed"}


def outcome_label(state: State, reason: str) -> str:
    if state is State.COMMITTED:
        return "committed"
    return _OUTCOME_LABELS.get(reason, "rejected")


class LeaderState:
    def __init__(self, config: NodeConfig, replicator: Replicator, leader_url: Callable[[], str | None],
                 admission: Admission, committer: GroupCommitter, clock: LeaderClock,
                 spawn: Callable[[Any], None]) -> None:
        self._replicator = replicator
        self._leader_url = leader_url
        self._admission = admission
        self.sessions: dict[str, Session] = {}
        self.views: dict[str, QueueView] = {}
        self.closed = ClosedTransactions(config.closed_transactions_remembered_max)
        self.epoch = 0
        self.serving_term = 0  # term whose barrier is applied; 0 = not serving
        self.stopping = False  # the node stops: dequeues answer with what they have, not wait
        self.rules = ItemRules(replicator, committer, clock, lambda: self.views, spawn,
                               lambda: self.serving_term, config.commit_timeout_s)
        # What the metrics read (rcq.server.http.metrics): plain counters, kept here once.
        self.closed_total: Counter[str] = Counter()  # how transactions ended, by outcome
        self.returned_total: Counter[str] = Counter()  # items given back to the head, by queue

    # ------------------------------------------------------------ serving
    @property
    def serving(self) -> bool:
        return (self.serving_term != 0 and self._replicator.is_leader()
                and self._replicator.term == self.serving_term)

    def require_serving(self) -> None:
        if self.serving:
            return
        if self._replicator.is_leader():
            raise NotReady()
        url = self._leader_url()
        if url:
            raise NotLeader(leader_url=url)
        raise NoLeader()

    def new_epoch(self, error: RcqError) -> None:
        """Leadership ended or changed: every open transaction aborts (its items are simply no longer
        locked); waiting dequeues fail with ``error``; the views are dropped until the next barrier."""
        self.epoch += 1
        self.serving_term = 0
        for transaction in list(self.sessions.values()):
            if transaction.state is State.OPEN:
                self.close(transaction, State.ABORTED, "leader_changed")
            else:
                # Committing, or outcome unknown: its entry may still apply (before a later
                # barrier) or be dropped. Forget it here, so questions about it are answered
                # from the replicated outcome, or by the term rule once that is definite.
                self.drop(transaction)
        for view in self.views.values():
            view.fail_waiters(error)
        self.views = {}
        self.rules.reset()
        self._admission.clear_reservations()

    def end_waits(self) -> None:
        """The node stops: dequeues waiting for items answer now with what they have (nothing), and
        later ones do not wait, so the stop is not held up by long polls."""
        self.stopping = True
        for view in self.views.values():
            view.wake_waiters()

    def start_serving(self, term: int, seeds: list[tuple[str, ViewSeed, int | None]]) -> None:
        """This term's barrier applied: the views from the replicated state, (queue, seed, max_deliveries)
        each; items locked when their last leader died and at their delivery limit die now."""
        self.views = {queue: QueueView.from_seed(seed, limit) for queue, seed, limit in seeds}
        self.serving_term = term
        for queue, seed, _ in seeds:
            self.rules.propose("dead_letter", queue, seed.at_limit)

    def view(self, queue: str) -> QueueView:
        """The view of ``queue``, made empty if there is none yet."""
        view = self.views.get(queue)
        if view is None:
            view = self.views[queue] = QueueView()
        return view

    # ------------------------------------------------------------ lookups
    def get(self, transaction_id: str) -> Session:
        """The session of ``transaction_id`` in any state; the answer about it when it is closed."""
        self.require_serving()
        transaction = self.sessions.get(transaction_id)
        if transaction is not None:
            return transaction
        raise self.closed_error(transaction_id)

    def get_open(self, transaction_id: str) -> Session:
        transaction = self.get(transaction_id)
        if transaction.state is State.OPEN:
            return transaction
        if transaction.state is State.COMMITTING:
            raise TransactionBusy()
        if transaction.state is State.UNKNOWN:
            raise CommitOutcomeUnknown("the transaction's commit was proposed; its outcome is not known yet")
        raise self.closed_error(transaction_id)

    def open_session(self, transaction_id: str) -> Session | None:
        transaction = self.sessions.get(transaction_id)
        return transaction if transaction is not None and transaction.state is State.OPEN else None

    def closed_error(self, transaction_id: str) -> RcqError:
        outcome, forgotten_term = self._replicator.read(
            lambda sm: (sm.outcome(transaction_id), sm.outcomes_forgotten_term))
        return self.closed.error_for(transaction_id, outcome, self.serving_term, forgotten_term)

    # ------------------------------------------------------------ closing
    def add(self, transaction: Session) -> None:
        self.sessions[transaction.transaction_id] = transaction
        self._admission.opened(transaction.client)

    def close(self, transaction: Session, state: State, reason: str) -> None:
        """End an open transaction without a commit: its locked items go back to the head."""
        if transaction.epoch == self.epoch:
            for queue, ids in transaction.dequeued.items():
                view = self.views.get(queue)
                if view is not None:
                    self.returned_total[queue] += self.rules.return_items(queue, view, ids, delivered=True)
        self.forget(transaction, state, reason)

    def forget(self, transaction: Session, state: State, reason: str) -> None:
        """End a transaction whose items need no giving back (its commit applied, or they are gone)."""
        transaction.state = state
        self.closed_total[outcome_label(state, reason)] += 1
        self.drop(transaction)
        self.closed.remember(transaction.transaction_id, state, reason, transaction.owner)

    def drop(self, transaction: Session) -> None:
        """Forget a session without an answer (a new epoch answers for it by the term rule)."""
        if self.sessions.pop(transaction.transaction_id, None) is not None:
            self._admission.closed(transaction.client)
        if transaction.reserved is not None:
            self._admission.release(transaction.reserved)
            transaction.reserved = None
