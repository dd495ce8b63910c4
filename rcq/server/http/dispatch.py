"""The one verb dispatcher: a validated sub-request (of ``POST /v1/batch``, or a session channel
frame) to the verb of :mod:`~rcq.server.http.operations` it names, and independent sub-requests
answered concurrently, each with its own status.

The HTTP routes and the session channel both call this, as siblings: a verb behaves the same
whichever front door it came in by. Errors are rendered here only for batches, where each
sub-request answers alone; a single verb's error goes to its caller.

Must not import: pysyncobj, lmdb, aiohttp.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import Any

from rcq.errors import InternalError, RcqError
from rcq.server.config import NodeConfig
from rcq.server.http import operations
from rcq.server.http.models import (
    BatchAbort,
    BatchBegin,
    BatchCommit,
    BatchCommitMany,
    BatchDequeue,
    BatchEnqueue,
    BatchExecute,
    BatchExtend,
    BatchReceive,
    BatchReject,
    BatchStatus,
)
from rcq.server.leader.session import AnswerBudget
from rcq.server.leader.transactions import TransactionManager

log = logging.getLogger(__name__)


async def answer_each(coroutines: list[Awaitable[operations.Answer]]) -> list[dict[str, Any]]:
    """Run independent sub-requests concurrently; each gets its own status and body."""

    async def one(coroutine: Awaitable[operations.Answer]) -> dict[str, Any]:
        try:
            status, body = await coroutine
        except RcqError as exc:
            return {"status": exc.http_status, "body": exc.to_body()}
        except Exception:
            log.exception("unexpected error in a batched request")
            error = InternalError()
            return {"status": error.http_status, "body": error.to_body()}
        return {"status": status, "body": body}

    return list(await asyncio.gather(*(one(c) for c in coroutines)))


def batch_operation(manager: TransactionManager, config: NodeConfig, caller: operations.Caller,
                     budget: AnswerBudget, sub: Any) -> Awaitable[operations.Answer]:
    if isinstance(sub, BatchBegin):
        return operations.begin(manager, sub, caller)
    if isinstance(sub, BatchEnqueue):
        return operations.enqueue(manager, config, sub.transaction_id, sub, caller)
    if isinstance(sub, BatchDequeue):
        return operations.dequeue(manager, sub.transaction_id, sub, caller, budget)
    if isinstance(sub, BatchCommit):
        return operations.commit(manager, sub.transaction_id, sub, caller)
    if isinstance(sub, BatchAbort):
        return operations.abort(manager, sub.transaction_id, caller)
    if isinstance(sub, BatchExtend):
        return operations.extend(manager, sub.transaction_id, sub, caller)
    if isinstance(sub, BatchReceive):
        return operations.receive(manager, sub.queue, sub, caller, budget)
    if isinstance(sub, BatchReject):
        return operations.reject(manager, sub.transaction_id, sub, caller)
    if isinstance(sub, BatchStatus):
        return operations.status(manager, sub.transaction_id, caller)
    if isinstance(sub, BatchExecute):
        return operations.execute(manager, config, sub, caller, budget)
    assert isinstance(sub, BatchCommitMany)
    return operations.commit_many(manager, config, sub, caller)


async def batch_answer(manager: TransactionManager, config: NodeConfig, caller: operations.Caller,
                       requests: list[Any]) -> dict[str, Any]:
    """The answer of ``POST /v1/batch`` (and of a session channel's ``batch`` frame)."""
    operations.check_count("sub-requests", len(requests), config)
    manager.require_serving()
    budget = manager.answer_budget()  # one answer, one budget
    return {"responses": await answer_each([batch_operation(manager, config, caller, budget, sub) for sub in requests])}


