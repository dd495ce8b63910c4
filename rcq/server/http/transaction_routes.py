"""The transaction routes: ``/v1/transactions/...``, ``/v1/commit``, ``/v1/execute``,
``/v1/execute-batch`` and ``/v1/batch``.

Each handler reads its model, names the caller and hands both to the verb's function in
:mod:`rcq.server.http.operations`, which calls the leader; a batch runs its independent
sub-requests concurrently, each answered with its own status.

Must not import: pysyncobj, lmdb.
"""

from __future__ import annotations

import logging
from typing import Any

from aiohttp import web

from rcq.server.http import operations, spread_queues
from rcq.server.http.auth import principal_of
from rcq.server.http.dispatch import answer_each, batch_answer
from rcq.server.http.handlers import CONFIG, MANAGER, caller_of, json_response, read_model
from rcq.server.http.models import (
    BatchRequest,
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
from rcq.server.http.partition_routes import from_other_partitions

log = logging.getLogger(__name__)


async def begin(request: web.Request) -> web.Response:
    status, body = await operations.begin(request.app[MANAGER], await read_model(request, BeginRequest),
                                          caller_of(request))
    return json_response(body, status)


async def list_transactions(request: web.Request) -> web.Response:
    """The caller's open transactions; at p0's leader, those of every partition (each partition's
    leader asked; ``unanswered`` names the partitions that could not be)."""
    prefix = request.query.get("label_prefix")
    listed = request.app[MANAGER].list_open(prefix, principal_of(request).name)
    answered, unanswered = await from_other_partitions(request, request.path_qs)
    for answer in answered.values():
        listed += [t for t in answer.get("transactions") or [] if isinstance(t, dict)]
    body: dict[str, Any] = {"transactions": listed}
    if unanswered:
        body["unanswered"] = unanswered
    return json_response(body)


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
    parsed = await read_model(request, ExecuteRequest)

    async def here(sent: dict[str, Any] | None = None) -> tuple[int, dict[str, Any]]:
        run = parsed if sent is None else ExecuteRequest.model_validate(sent)
        return await operations.execute(request.app[MANAGER], request.app[CONFIG], run, caller_of(request))

    spread = spread_queues.execute_spread(request.app, [op.queue for op in parsed.operations])
    if spread is None:
        status, body = await here()
        return json_response(body, status)
    principal = principal_of(request)  # refused here first, as the transaction would be
    for op in parsed.operations:
        principal.require("produce" if op.op == "enqueue" else "consume", op.queue)
    request.app[MANAGER].require_serving()  # p0's leader shares it out: a follower forwards it there
    status, body = await spread_queues.execute(request, spread, await request.json(), here)
    return json_response(body, status)


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
