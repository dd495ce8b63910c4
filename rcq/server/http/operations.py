"""What each API verb does, apart from HTTP: validated model in, (status, JSON body) out.

The route handlers (``transaction_routes``, ``queue_routes``) and the sub-requests of
``POST /v1/batch`` both call these, so a verb behaves the same whichever way it arrives. Each
goes one way: the caller's permissions and ownership first, items checked and decoded, then the
leader's verb (:class:`~rcq.server.leader.transactions.TransactionManager`; a commit that also
receives calls two), then the answer rendered. The leader never calls back here. Errors are
raised as :mod:`rcq.errors` classes; the caller renders them.

Must not import: pysyncobj, lmdb, aiohttp.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import Any

from rcq.encoding import Encoding, encode_item
from rcq.errors import PayloadTooLarge, RcqError, TooManyTransactions
from rcq.server.config import NodeConfig
from rcq.server.core.commands import QueueSettings
from rcq.server.http.models import (
    BeginRequest,
    CommitManyRequest,
    CommitRequest,
    DequeueOperation,
    DequeueRequest,
    EnqueueOperation,
    EnqueueRequest,
    ExecuteRequest,
    ExtendRequest,
    ItemInput,
    QueueSettingsRequest,
    ReceiveRequest,
    RedriveRequest,
    RejectRequest,
    decode_items,
    enqueue_options,
    items_headers,
)
from rcq.server.leader.session import AnswerBudget, CommitResult, DequeuedItem, DequeueStep, EnqueueStep
from rcq.server.leader.transactions import TransactionManager
from rcq.tokens import Principal

Answer = tuple[int, dict[str, Any]]


@dataclass(frozen=True)
class Caller:
    """Who sent a request: the principal of its token (what it may do; transactions belong to its
    name) and whom per-client caps count it against (the principal, or the peer address on a node
    without tokens, where every caller is the same anonymous principal)."""

    principal: Principal
    client: str

    @property
    def owner(self) -> str:
        return self.principal.name


def items_body(items: list[DequeuedItem], encoding: Encoding) -> list[dict[str, Any]]:
    rendered = []
    for item in items:
        value, used = encode_item(item.value, encoding)
        entry: dict[str, Any] = {"item_id": item.item_id, "queue": item.queue, "value": value, "encoding": used,
                                 "delivery_count": item.delivery_count, "priority": item.priority,
                                 "enqueued_at_ms": item.enqueued_at_ms, "expires_at_ms": item.expires_at_ms}
        if item.headers is not None:  # only items with headers have the field: plain answers are unchanged
            entry["headers"] = dict(item.headers)
        dead = item.dead_letter
        if dead is not None:
            entry["dead_letter"] = {"reason": dead.reason, "source_queue": dead.source_queue,
                                    "delivery_count": dead.delivery_count, "note": dead.note}
        rendered.append(entry)
    return rendered


def commit_body(result: CommitResult) -> dict[str, Any]:
    return {"transaction_ids": list(result.transaction_ids), "committed": True,
            "duplicate": result.duplicate, "index": result.index,
            "enqueued": result.enqueued, "dequeued": result.dequeued}


def _now() -> float:
    return asyncio.get_running_loop().time()


def check_items_count(items: list[ItemInput], config: NodeConfig) -> None:
    if len(items) > config.request_items_max:
        raise PayloadTooLarge(f"{len(items)} items in one request; the limit is {config.request_items_max}")


def check_count(what: str, count: int, config: NodeConfig) -> None:
    if count > config.batch_requests_max:
        raise PayloadTooLarge(f"{count} {what} in one request; the limit is {config.batch_requests_max}")


async def begin(manager: TransactionManager, body: BeginRequest, caller: Caller) -> Answer:
    transaction = manager.begin(body.timeout_s, body.label, caller.client, caller.owner, body.partition)
    return 201, transaction.describe(_now())


async def enqueue(manager: TransactionManager, config: NodeConfig, transaction_id: str,
                  body: EnqueueRequest, caller: Caller) -> Answer:
    caller.principal.require("produce", body.queue)  # before ownership: a 403 says nothing of the id
    manager.check_owner(transaction_id, caller.owner)
    check_items_count(body.items, config)
    values = decode_items(body.items, body.encoding, config.item_bytes_max)
    buffered = manager.enqueue(transaction_id, body.queue, values, body.key,
                               enqueue_options(body.priority, body.delay_s, body.ttl_s), items_headers(body.items))
    return 200, {"transaction_id": transaction_id, "queue": body.queue, "enqueued": len(values),
                 "buffered": buffered}


async def dequeue(manager: TransactionManager, transaction_id: str, body: DequeueRequest, caller: Caller,
                  budget: AnswerBudget | None = None) -> Answer:
    caller.principal.require("consume", body.queue)  # before ownership: a 403 says nothing of the id
    manager.check_owner(transaction_id, caller.owner)
    items = await manager.dequeue(transaction_id, body.queue, body.max_items, body.wait_ms, body.key, budget)
    return 200, {"transaction_id": transaction_id, "queue": body.queue,
                 "items": items_body(items, body.encoding)}


async def commit(manager: TransactionManager, transaction_id: str, body: CommitRequest, caller: Caller) -> Answer:
    manager.check_owner(transaction_id, caller.owner)
    if body.receive is not None:
        caller.principal.require("consume", body.receive.queue)  # refused before anything commits
    if body.receive is None:
        return 200, commit_body(await manager.commit(transaction_id, body.idempotency_key))
    # The receive starts first: items it takes at once are fenced by the commit's own entry (a
    # read fence, docs/raft-hazards.md H22, needs an entry proposed after the take), not by one more.
    receiving = asyncio.ensure_future(receive(manager, body.receive.queue, body.receive, caller))
    try:
        answer = commit_body(await manager.commit(transaction_id, body.idempotency_key))
    except BaseException:
        await _abandon(manager, receiving)
        raise
    # The commit is done whatever happens next: a failed receive is reported, not raised.
    try:
        try:
            answer["next"] = (await receiving)[1]
        except TooManyTransactions:  # the committed one held the last place: it is free now
            answer["next"] = (await receive(manager, body.receive.queue, body.receive, caller))[1]
    except RcqError as exc:
        answer["next"] = {"transaction_id": None, "queue": body.receive.queue, "items": [],
                          "error": exc.to_body()["error"]}
    return 200, answer


async def _abandon(manager: TransactionManager, receiving: asyncio.Future[Answer]) -> None:
    """The commit failed: the receive begun beside it gives back what it took."""
    receiving.cancel()
    try:
        _, received = await receiving
    except (asyncio.CancelledError, RcqError):
        return  # cancelled or failed inside the leader, which aborted its transaction
    if received.get("transaction_id"):
        with contextlib.suppress(RcqError):
            manager.abort(received["transaction_id"])


async def receive(manager: TransactionManager, queue: str, body: ReceiveRequest, caller: Caller,
                  budget: AnswerBudget | None = None) -> Answer:
    """Begin a transaction and dequeue into it; nothing received, the answer has no transaction id
    (the leader aborted it at once)."""
    caller.principal.require("consume", queue)
    transaction, items = await manager.receive(queue, body.timeout_s, body.label, body.max_items, body.wait_ms,
                                               caller.client, caller.owner, budget)
    if transaction is None:
        return 200, {"transaction_id": None, "queue": queue, "items": []}
    return 200, {**transaction.describe(_now()), "queue": queue, "items": items_body(items, body.encoding)}


async def abort(manager: TransactionManager, transaction_id: str, caller: Caller) -> Answer:
    manager.check_owner(transaction_id, caller.owner)
    returned = manager.abort(transaction_id)
    return 200, {"transaction_id": transaction_id, "aborted": True, "returned": returned}


async def reject(manager: TransactionManager, transaction_id: str, body: RejectRequest, caller: Caller) -> Answer:
    caller.principal.require("consume", body.queue)  # before ownership: a 403 says nothing of the id
    manager.check_owner(transaction_id, caller.owner)
    rejected, target = await manager.reject(transaction_id, body.queue, body.item_ids, body.reason)
    return 200, {"transaction_id": transaction_id, "queue": body.queue, "rejected": rejected,
                 "dead_letter_queue": target}


async def extend(manager: TransactionManager, transaction_id: str, body: ExtendRequest, caller: Caller) -> Answer:
    manager.check_owner(transaction_id, caller.owner)
    return 200, manager.extend(transaction_id, body.timeout_s).describe(_now())


async def status(manager: TransactionManager, transaction_id: str, caller: Caller) -> Answer:
    manager.routing.transaction(transaction_id)  # before the 307 below: another partition's id goes there
    if caller.principal.authenticated and not caller.principal.admin:
        # Only the leader knows owners (they are not replicated): a follower would answer a
        # replicated outcome to anyone holding the id, so it redirects (307) like other verbs.
        manager.require_serving()
    manager.check_owner(transaction_id, caller.owner)
    return 200, manager.describe(transaction_id)


async def commit_many(manager: TransactionManager, config: NodeConfig, body: CommitManyRequest,
                      caller: Caller) -> Answer:
    check_count("transaction ids", len(body.transaction_ids), config)
    manager.routing.transactions(body.transaction_ids)
    for transaction_id in body.transaction_ids:
        manager.check_owner(transaction_id, caller.owner)
    return 200, commit_body(await manager.commit_many(body.transaction_ids, body.idempotency_key))


async def execute(manager: TransactionManager, config: NodeConfig, body: ExecuteRequest,
                  caller: Caller, budget: AnswerBudget | None = None) -> Answer:
    """A one-request transaction (the leader's ``execute``). Its dequeues share one answer budget
    (``budget``: the enclosing request's, if it has one). Every permission is checked, every item
    decoded, before anything starts."""
    check_count("operations", len(body.operations), config)
    for op in body.operations:
        caller.principal.require("produce" if isinstance(op, EnqueueOperation) else "consume", op.queue)
        if isinstance(op, EnqueueOperation):
            check_items_count(op.items, config)
    steps = [EnqueueStep(op.queue, decode_items(op.items, op.encoding, config.item_bytes_max),
                         enqueue_options(op.priority, op.delay_s, op.ttl_s), items_headers(op.items))
             if isinstance(op, EnqueueOperation) else DequeueStep(op.queue, op.max_items, op.wait_ms)
             for op in body.operations]
    executed = await manager.execute(steps, body.idempotency_key, caller.client, caller.owner, budget)
    results: list[dict[str, Any]] = []
    for op, done in zip(body.operations, executed.steps, strict=True):
        if isinstance(op, EnqueueOperation):
            results.append({"op": "enqueue", "queue": op.queue, "enqueued": done})
        else:
            assert isinstance(op, DequeueOperation) and isinstance(done, list)
            results.append({"op": "dequeue", "queue": op.queue, "items": items_body(done, op.encoding)})
    return 200, {"transaction_id": executed.transaction_id, **commit_body(executed.commit), "results": results}


# ------------------------------------------------------------------ queue admin
def queue_settings_body(manager: TransactionManager, queue: str) -> dict[str, Any]:
    """The queue's own settings and the limits that apply to it (its own, else this node's defaults)."""
    settings, (max_items, max_bytes), features = manager.queue_limits(queue)
    own_items, own_bytes = settings or (None, None)
    return {"queue": queue, "exists": settings is not None,
            "settings": {"max_items": own_items, "max_bytes": own_bytes, **features_body(features),
                         "partitions": manager.queue_partitions(queue)},
            "limits": {"max_items": max_items, "max_bytes": max_bytes}}


def features_body(features: QueueSettings | None) -> dict[str, Any]:
    features = features or QueueSettings()
    return {"max_deliveries": features.max_deliveries, "dead_letter_queue": features.dead_letter_queue,
            "default_ttl_s": None if features.default_ttl_ms is None else features.default_ttl_ms / 1000,
            "default_delay_s": None if features.default_delay_ms is None else features.default_delay_ms / 1000,
            "max_priority": features.max_priority}


async def configure_queue(manager: TransactionManager, queue: str, body: QueueSettingsRequest) -> Answer:
    await manager.change_queue(queue, "configure", body.max_items, body.max_bytes, body.features())
    return 200, queue_settings_body(manager, queue)


async def redrive(manager: TransactionManager, queue: str, body: RedriveRequest, caller: Caller) -> Answer:
    """Dead items back to their sources: manage on the dead-letter queue, produce on each source."""
    caller.principal.require("manage", queue)
    if body.source_queue is not None:
        caller.principal.require("produce", body.source_queue)
    moved = await manager.redrive(queue, body.max_items, body.source_queue,
                                  may_redrive_to=lambda source: caller.principal.may("produce", source))
    return 200, {"queue": queue, "redriven": sum(moved.values()), "by_queue": moved}


async def purge_queue(manager: TransactionManager, queue: str) -> Answer:
    result = await manager.change_queue(queue, "purge")
    return 200, {"queue": queue, "purged": True, "removed": result.removed}


async def delete_queue(manager: TransactionManager, queue: str) -> Answer:
    result = await manager.change_queue(queue, "delete")
    return 200, {"queue": queue, "deleted": True, "removed": result.removed}
