"""OpenTransactions: the verbs on a transaction before its commit, except dequeue.

Begin, extend, describe, list, the owner check, buffered enqueues, abort, and deadlines: its
:class:`DeadlineReaper` expires a transaction whose deadline passed (:meth:`OpenTransactions.expire`). Nothing
here is replicated: an enqueue is buffered in the session until its commit (``commit_path``);
a dequeue (``dequeue``) locks items in the views. Every session it opens or ends goes through
the :class:`LeaderState`.

Must not import: pysyncobj, lmdb, aiohttp.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from rcq.errors import (
    FeatureLevelRequired,
    InvalidRequest,
    OutcomeExpired,
    PayloadTooLarge,
    RcqError,
    TransactionCommitted,
    TransactionLifetimeExceeded,
    TransactionNotFound,
)
from rcq.names import P0, check_queue_name, new_transaction_id
from rcq.server.config import NodeConfig
from rcq.server.core.commands import EnqueueOptions, Headers
from rcq.server.core.features import LEVEL_OF_ITEM_HEADERS, LEVELS
from rcq.server.core.ledger import headers_bytes
from rcq.server.leader.admission import Admission, merge_growth
from rcq.server.leader.deadlines import DeadlineReaper
from rcq.server.leader.leader_state import LeaderState
from rcq.server.leader.placement import Placement
from rcq.server.leader.session import RandomHex, Session, State
from rcq.server.raft.protocol import Replicator


class OpenTransactions:
    def __init__(self, config: NodeConfig, leader: LeaderState, replicator: Replicator, admission: Admission) -> None:
        self._config = config
        self._leader = leader
        self._replicator = replicator
        self._admission = admission
        self._placement = Placement(config, replicator)
        self._random_ids = RandomHex(12)
        self._partition = config.partition_name or P0
        # Started, stopped and cleared (on a new epoch) by the TransactionManager.
        self.deadlines = DeadlineReaper(find=leader.open_session, expire=self.expire,
                                        live=lambda: leader.sessions.values())

    def begin(self, timeout_s: float | None = None, label: str | None = None, client: str = "",
              owner: str = "", reaped: bool = True) -> Session:
        """Open a transaction owned by ``owner`` (a principal); caps count it against ``client``.
        ``reaped`` False: its deadline is not scheduled, for a caller that commits or aborts it
        before the loop runs anything else (it cannot be open when a deadline comes)."""
        leader = self._leader
        leader.require_serving()
        self._admission.check_begin(client, len(leader.sessions))
        timeout_s = self._timeout(timeout_s)
        now = asyncio.get_running_loop().time()
        transaction = Session(
            transaction_id=new_transaction_id(self._partition, leader.serving_term, self._random_ids.next()),
            term=leader.serving_term, epoch=leader.epoch, label=label, timeout_s=timeout_s,
            deadline=now + timeout_s, created_ms=int(time.time() * 1000), client=client, owner=owner,
            lifetime_deadline=now + self._config.transaction_lifetime_max_s)
        leader.add(transaction)
        if reaped:
            self.deadlines.schedule(transaction)
        return transaction

    def _timeout(self, timeout_s: float | None) -> float:
        if timeout_s is None:
            return self._config.transaction_timeout_default_s
        if timeout_s > self._config.transaction_timeout_max_s:
            raise InvalidRequest(f"timeout_s {timeout_s} is over the limit "
                                 f"{self._config.transaction_timeout_max_s}")
        return timeout_s

    def extend(self, transaction_id: str, timeout_s: float) -> Session:
        transaction = self._leader.get_open(transaction_id)
        timeout_s = self._timeout(timeout_s)
        now = asyncio.get_running_loop().time()
        if now + timeout_s > transaction.lifetime_deadline:
            left = max(0.0, transaction.lifetime_deadline - now)
            raise TransactionLifetimeExceeded(
                f"a transaction lives at most {self._config.transaction_lifetime_max_s} s, extends included; "
                f"this one has {left:.1f} s left", details={"remaining_s": round(left, 3)})
        transaction.timeout_s = timeout_s
        transaction.deadline = now + timeout_s
        self.deadlines.schedule(transaction)
        return transaction

    def describe(self, transaction_id: str) -> dict[str, Any]:
        leader = self._leader
        now = asyncio.get_running_loop().time()
        transaction = leader.sessions.get(transaction_id) if leader.serving else None
        if transaction is not None:
            return transaction.describe(now)
        try:
            error = leader.closed_error(transaction_id) if leader.serving else None
        except RcqError:
            error = None
        if error is None:
            outcome = self._replicator.read(lambda sm: sm.outcome(transaction_id))
            if outcome is not None:
                return {"transaction_id": transaction_id, "state": outcome.status,
                        "index": outcome.index, "reason": outcome.reason}
            leader.require_serving()
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
        transaction = self._leader.sessions.get(transaction_id)
        known_owner = transaction.owner if transaction is not None else self._leader.closed.owner_of(transaction_id)
        if known_owner is not None and known_owner != owner:
            raise TransactionNotFound(f"no transaction {transaction_id!r}")

    def list_open(self, label_prefix: str | None = None, owner: str = "") -> list[dict[str, Any]]:
        """The open transactions of ``owner``."""
        self._leader.require_serving()
        now = asyncio.get_running_loop().time()
        return [t.describe(now) for t in self._leader.sessions.values()
                if t.owner == owner and (label_prefix is None or (t.label or "").startswith(label_prefix))]

    def enqueue(self, transaction_id: str, queue: str, values: list[bytes], key: str | None = None,
                options: EnqueueOptions | None = None, headers: list[Headers | None] | None = None,
                check_room: bool = True) -> int:
        """Buffer items; returns how many the transaction holds. A repeated ``key`` buffers nothing.
        ``headers``: each item's, parallel to ``values`` (None, or only Nones: plain items).
        ``check_room`` False: the queue limits and the storage budget are left to the commit, for
        a caller that commits at once (its commit checks the same growth against the same state)."""
        transaction = self._leader.get_open(transaction_id)
        check_queue_name(queue)
        self._placement.check(queue, creates=True)
        if headers is not None:
            headers = [h or None for h in headers]  # empty headers are none
            if not any(headers):
                headers = None  # nothing to write: a plain enqueue, whatever the level
        if headers is not None:
            if len(headers) != len(values):
                raise InvalidRequest(f"{len(headers)} items' headers for {len(values)} items")
            self._require_item_headers()
        if options is not None and options.priority:
            features = self._replicator.read(lambda sm: sm.queue_features(queue))
            allowed = (features.max_priority if features is not None else None) or 0
            if options.priority > allowed:
                raise InvalidRequest(f"priority {options.priority} is over the max_priority of queue {queue!r}, "
                                     f"{allowed} (raise it with `rcq queue configure {queue} --max-priority N`, "
                                     f"or PUT /v1/queues/{queue}, which replaces the settings left out)",
                                     details={"queue": queue, "max_priority": allowed})
        if key is not None and key in transaction.enqueue_keys:
            if transaction.enqueue_keys[key] != (queue, len(values)):
                raise InvalidRequest(f"enqueue key {key!r} was used for other items")
            return sum(len(v) for v in transaction.enqueues.values())
        size = sum(len(v) for v in values)
        if headers is not None:
            size += sum(headers_bytes(h) for h in headers)  # what the state machine counts too
        if transaction.enqueued_bytes + size > self._config.transaction_bytes_max:
            raise PayloadTooLarge(
                f"the transaction would hold {transaction.enqueued_bytes + size} bytes of items; "
                f"the limit is {self._config.transaction_bytes_max} (transaction_bytes_max)")
        if transaction.items_count + len(values) > self._config.transaction_items_max:
            raise PayloadTooLarge(
                f"the transaction would hold {transaction.items_count + len(values)} items; the limit is "
                f"{self._config.transaction_items_max}")
        if check_room:
            growth = merge_growth([transaction.growth(), {queue: (len(values), size)}])
            self._replicator.read(lambda sm: self._admission.check_growth(growth, sm))
        items_before, bytes_before = transaction.enqueued_sizes.get(queue, (0, 0))
        group = transaction.enqueues.setdefault((queue, options), [])
        group_headers = transaction.enqueue_headers.get((queue, options))
        if headers is not None and group_headers is None:
            group_headers = transaction.enqueue_headers[(queue, options)] = [None] * len(group)
        if group_headers is not None:
            group_headers.extend(headers if headers is not None else [None] * len(values))
        group.extend(values)
        transaction.enqueued_bytes += size
        transaction.enqueued_sizes[queue] = (items_before + len(values), bytes_before + size)
        transaction.items_count += len(values)
        if key is not None:
            transaction.enqueue_keys[key] = (queue, len(values))
        return sum(len(v) for v in transaction.enqueues.values())

    def _require_item_headers(self) -> None:
        """The one gate on item headers (every enqueue route comes through :meth:`enqueue`): they are
        written in a format of feature level 2, refused while the cluster runs below it."""
        active = int(self._replicator.read(lambda sm: sm.level))
        if active < LEVEL_OF_ITEM_HEADERS:
            raise FeatureLevelRequired(
                f"item headers need feature level {LEVEL_OF_ITEM_HEADERS}; the cluster runs at {active}. Upgrade "
                f"every member to rcq {LEVELS[LEVEL_OF_ITEM_HEADERS - 1].since} or later, then raise the level "
                "(docs/upgrades.md); nothing was enqueued",
                details={"feature": "item headers", "level_required": LEVEL_OF_ITEM_HEADERS, "level_active": active})

    def abort(self, transaction_id: str) -> int:
        """Close the transaction; its dequeued items go back to the head. Returns how many it held."""
        transaction = self._leader.get_open(transaction_id)
        returned = sum(len(ids) for ids in transaction.dequeued.values())
        self._leader.close(transaction, State.ABORTED, "aborted")
        return returned

    def expire(self, transaction: Session) -> None:
        """Its deadline passed while it was open."""
        self._leader.close(transaction, State.ABORTED, "expired")
