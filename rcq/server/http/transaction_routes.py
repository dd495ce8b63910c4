"""The transaction routes: ``/v1/transactions/...``, ``/v1/commit``, ``/v1/execute``,
``/v1/execute-batch`` and ``/v1/batch``.

Each handler reads its model, names the caller and hands both to the verb's function in
:mod:`rcq.server.http.operations`, which calls the leader; a batch runs its independent
sub-requests concurrently, each answered with its own status.

Must not import: pysyncobj, lmdb.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import Any

from aiohttp import web

from rcq.errors import InternalError, RcqError
from rcq.server.config import NodeConfig
from rcq.server.http import operations
from rcq.server.http.auth import principal_of
from rcq.server.http.handlers import CONFIG, MANAGER, caller_of, json_response, read_model
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
    BatchRequest,
    BatchStatus,
    BeginRequest,
    CommitManyRequest,
    CommitRequest,
    DequeueRequest,
    EnqueueRequest,
    ExecuteBatchRequest,
    ExecuteRequest,
    ExtendRequest,
    RejectRequest,
)
from rcq.server.leader.session import AnswerBudget
from rcq.server.leader.transactions import TransactionManager

log = logging.getLogger(__name__)


async def begin(request: web.Request) -> web.Response:
    status, body = await operations.begin(request.app[MANAGER], await read_model(request, BeginRequest),
                                          caller_of(request))
    return json_response(body, status)


async def list_transactions(request: web.Request) -> web.Response:
    prefix = request.query.get("label_prefix")
    return json_response({"transactions": request.app[MANAGER].list_open(prefix, principal_of(request).name)})


async def transaction_status(request: web.Request) -> web.Response:
    status, body = await operations.status(request.app[MANAGER], request.match_info["transaction_id"],
                                           caller_of(request))
    return json_response(body, status)


async def enqueue(request: web.Request) -> web.Response:
    status, body = await operations.enqueue(request.app[MANAGER], request.app[CONFIG],
                                            request.match_info["transaction_id"],
                                            await read_model(request, EnqueueRequest), caller_of(request))
    return json_response(body, status)


async def dequeue(request: web.Request) -> web.Response:
    status, body = await operations.dequeue(request.app[MANAGER], request.match_info["transaction_id"],
                                            await read_model(request, DequeueRequest), caller_of(request))
    return json_response(body, status)


async def commit(request: web.Request) -> web.Response:
    status, body = await operations.commit(request.app[MANAGER], request.match_info["transaction_id"],
                                           await read_model(request, CommitRequest), caller_of(request))
    return json_response(body, status)


async def abort(request: web.Request) -> web.Response:
    status, body = await operations.abort(request.app[MANAGER], request.match_info["transaction_id"],
                                          caller_of(request))
    return json_response(body, status)


async def reject(request: web.Request) -> web.Response:
    status, body = await operations.reject(request.app[MANAGER], request.match_info["transaction_id"],
                                           await read_model(request, RejectRequest), caller_of(request))
    return json_response(body, status)


async def extend(request: web.Request) -> web.Response:
    status, body = await operations.extend(request.app[MANAGER], request.match_info["transaction_id"],
                                           await read_model(request, ExtendRequest), caller_of(request))
    return json_response(body, status)


async def commit_many(request: web.Request) -> web.Response:
    status, body = await operations.commit_many(request.app[MANAGER], request.app[CONFIG],
                                                await read_model(request, CommitManyRequest), caller_of(request))
    return json_response(body, status)


async def execute(request: web.Request) -> web.Response:
    status, body = await operations.execute(request.app[MANAGER], request.app[CONFIG],
                                            await read_model(request, ExecuteRequest), caller_of(request))
    return json_response(body, status)


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


async def execute_batch(request: web.Request) -> web.Response:
    body = await read_model(request, ExecuteBatchRequest)
    manager, config = request.app[MANAGER], request.app[CONFIG]
    operations.check_count("transactions", len(body.transactions), config)
    manager.require_serving()  # fail the whole request fast (e.g. 307) rather than each part
    caller, budget = caller_of(request), manager.answer_budget()  # one answer, one budget
    answers = await answer_each([operations.execute(manager, config, t, caller, budget)
                                  for t in body.transactions])
    return json_response({"results": [a["body"] if a["status"] < 300 else {**a["body"], "status": a["status"]}
                                      for a in answers]})


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


async def batch(request: web.Request) -> web.Response:
    """Many independent sub-requests (any verb, any transaction) in one HTTP request."""
    body = await read_model(request, BatchRequest)
    return json_response(await batch_answer(request.app[MANAGER], request.app[CONFIG], caller_of(request),
                                            body.requests))


def add_routes(app: web.Application) -> None:

    app.router.add_post("/v1/transactions", begin)
    app.router.add_get("/v1/transactions", list_transactions)
    app.router.add_get("/v1/transactions/{transaction_id}", transaction_status)
    app.router.add_post("/v1/transactions/{transaction_id}/enqueue", enqueue)
    app.router.add_post("/v1/transactions/{transaction_id}/dequeue", dequeue)
    app.router.add_post("/v1/transactions/{transaction_id}/commit", commit)
    app.router.add_post("/v1/transactions/{transaction_id}/abort", abort)
    app.router.add_post("/v1/transactions/{transaction_id}/extend", extend)
    app.router.add_post("/v1/transactions/{transaction_id}/reject", reject)
    app.router.add_post("/v1/commit", commit_many)
    app.router.add_post("/v1/execute", execute)
    app.router.add_post("/v1/execute-batch", execute_batch)
    app.router.add_post("/v1/batch", batch)
