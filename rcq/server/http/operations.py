"""What each API verb does, apart from HTTP: validated model in, (status, JSON body) out.

The REST handlers of :mod:`rcq.server.http.api` and the sub-requests of ``POST /v1/batch``
both call these, so a verb behaves the same whichever way it arrives. Errors
are raised as :mod:`rcq.errors` classes; the caller renders them.

Must not import: pysyncobj, lmdb, aiohttp.
"""

from __future__ import annotations

import asyncio
from typing import Any

from rcq.encoding import Encoding, encode_item
from rcq.errors import RcqError
from rcq.server.config import NodeConfig
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
    decode_items,
)
from rcq.server.leader.session import CommitResult, DequeuedItem
from rcq.server.leader.transactions import TransactionManager

Answer = tuple[int, dict[str, Any]]


def items_body(items: list[DequeuedItem], encoding: Encoding) -> list[dict[str, Any]]:
    rendered = []
    for item in items:
        value, used = encode_item(item.value, encoding)
        rendered.append({"item_id": item.item_id, "queue": item.queue, "value": value, "encoding": used})
    return rendered


def commit_body(result: CommitResult) -> dict[str, Any]:
    return {"transaction_ids": list(result.transaction_ids), "committed": True,
            "duplicate": result.duplicate, "index": result.index,
            "enqueued": result.enqueued, "dequeued": result.dequeued}


def _now() -> float:
    return asyncio.get_running_loop().time()


async def begin(manager: TransactionManager, body: BeginRequest) -> Answer:
    transaction = manager.begin(body.timeout_s, body.label)
    return 201, transaction.describe(_now())


async def enqueue(manager: TransactionManager, config: NodeConfig, transaction_id: str,
                  body: EnqueueRequest) -> Answer:
    values = decode_items(body.items, body.encoding, config.item_bytes_max)
    buffered = manager.enqueue(transaction_id, body.queue, values, body.key)
    return 200, {"transaction_id": transaction_id, "queue": body.queue, "enqueued": len(values),
                 "buffered": buffered}


async def dequeue(manager: TransactionManager, transaction_id: str, body: DequeueRequest) -> Answer:
    items = await manager.dequeue(transaction_id, body.queue, body.max_items, body.wait_ms, body.key)
    return 200, {"transaction_id": transaction_id, "queue": body.queue,
                 "items": items_body(items, body.encoding)}


async def commit(manager: TransactionManager, transaction_id: str, body: CommitRequest) -> Answer:
    return 200, commit_body(await manager.commit(transaction_id, body.idempotency_key))


async def abort(manager: TransactionManager, transaction_id: str) -> Answer:
    returned = manager.abort(transaction_id)
    return 200, {"transaction_id": transaction_id, "aborted": True, "returned": returned}


async def extend(manager: TransactionManager, transaction_id: str, body: ExtendRequest) -> Answer:
    return 200, manager.extend(transaction_id, body.timeout_s).describe(_now())


async def status(manager: TransactionManager, transaction_id: str) -> Answer:
    return 200, manager.describe(transaction_id)


async def commit_many(manager: TransactionManager, body: CommitManyRequest) -> Answer:
    return 200, commit_body(await manager.commit_many(body.transaction_ids, body.idempotency_key))


async def execute(manager: TransactionManager, config: NodeConfig, body: ExecuteRequest) -> Answer:
    """A one-request transaction: run the operations in a fresh transaction and commit it."""
    decoded = [decode_items(op.items, op.encoding, config.item_bytes_max)
               if isinstance(op, EnqueueOperation) else None for op in body.operations]
    transaction_id = manager.begin().transaction_id
    try:
        results: list[dict[str, Any]] = []
        for op, values in zip(body.operations, decoded, strict=True):
            if isinstance(op, EnqueueOperation):
                assert values is not None
                manager.enqueue(transaction_id, op.queue, values)
                results.append({"op": "enqueue", "queue": op.queue, "enqueued": len(values)})
            else:
                assert isinstance(op, DequeueOperation)
                items = await manager.dequeue(transaction_id, op.queue, op.max_items, op.wait_ms)
                results.append({"op": "dequeue", "queue": op.queue, "items": items_body(items, op.encoding)})
        result = await manager.commit(transaction_id, body.idempotency_key)
        if result.duplicate:
            # An earlier commit with this key already happened; this run's dequeues did not
            # apply (the items went back to their queues), so they must not be handed out.
            for entry in results:
                if entry["op"] == "dequeue":
                    entry["items"] = []
    except BaseException:
        try:
            manager.abort(transaction_id)
        except RcqError:
            pass  # already closed, or committing: nothing left to give back here
        raise
    return 200, {"transaction_id": transaction_id, **commit_body(result), "results": results}
