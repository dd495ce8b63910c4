"""Answers about transactions that are no longer open on this leader.

A verb on a closed transaction must say what happened to it, never just "not found" when
something is known. In order of authority: the replicated outcome (committed or rejected,
identical on every node); this leader's memory of how it closed a transaction (aborted,
expired, leader changed; bounded); the term in the id (a transaction of an earlier term whose
commit never applied before this leader's barrier can never commit: "leader changed").

Outcomes are forgotten after their retention (rcq.server.core.retention). The state machine
remembers the highest term of a forgotten outcome: a transaction of that term or an older one
without an outcome may have committed long ago, so it is answered ``outcome_expired`` (maybe
committed), never a definite "leader changed".

Must not import: pysyncobj, lmdb, aiohttp.
"""

from __future__ import annotations

from collections import OrderedDict

from rcq.errors import (
    CommitConflict,
    LeaderChanged,
    OutcomeExpired,
    RcqError,
    TransactionAborted,
    TransactionCommitted,
    TransactionExpired,
    TransactionNotFound,
)
from rcq.server.core.state_machine import TransactionOutcome
from rcq.server.leader.session import State, term_of


class ClosedTransactions:
    """How this leader closed recent transactions (the last ``remembered_max``), and the answer rules."""

    def __init__(self, remembered_max: int) -> None:
        self._remembered_max = remembered_max
        self._closed: OrderedDict[str, tuple[State, str, str]] = OrderedDict()

    def remember(self, transaction_id: str, state: State, reason: str, owner: str = "") -> None:
        self._closed[transaction_id] = (state, reason, owner)
        while len(self._closed) > self._remembered_max:
            self._closed.popitem(last=False)

    def owner_of(self, transaction_id: str) -> str | None:
        """The principal that began a transaction this leader closed (None: not remembered)."""
        closed = self._closed.get(transaction_id)
        return closed[2] if closed is not None else None

    def error_for(self, transaction_id: str, outcome: TransactionOutcome | None, serving_term: int,
                  forgotten_term: int = 0) -> RcqError:
        """The error a verb on ``transaction_id`` (not open here) answers; ``outcome`` is the replicated
        one, ``forgotten_term`` the highest term of a transaction whose outcome was forgotten."""
        if outcome is not None:
            if outcome.status == "committed":
                return TransactionCommitted(details={"index": outcome.index})
            return CommitConflict(f"the commit was rejected: {outcome.reason}")
        closed = self._closed.get(transaction_id)
        if closed is not None:
            state, reason, _ = closed
            if reason == "expired":
                return TransactionExpired()
            if reason == "leader_changed":
                return LeaderChanged()
            if state is State.COMMITTED:
                return TransactionCommitted()
            return TransactionAborted(f"the transaction was aborted ({reason})")
        term = term_of(transaction_id)
        if term is not None and 0 < term <= forgotten_term:
            return OutcomeExpired()
        if term is not None and 0 < term < serving_term:
            return LeaderChanged()
        return TransactionNotFound(f"no transaction {transaction_id!r}")
