"""The HTTP API v1: aiohttp routes, one error middleware, ``create_app()``.

Thin by design: parse and validate (pydantic), call the TransactionManager or
read the state machine, render JSON. Every failure becomes
``{"error": {...}}`` with the status of its :mod:`rcq.errors` class. A follower
answers leader-only requests with 307 and the leader's URL (``Location`` and
``error.leader_url``): clients re-send to the leader themselves; Raft never
forwards a command for them.

Must not import: pysyncobj, lmdb.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from aiohttp import web
from pydantic import BaseModel, ValidationError

from rcq.config import NodeConfig
from rcq.errors import (
    InternalError,
    InvalidRequest,
    MethodNotAllowed,
    NotLeader,
    PayloadTooLarge,
    RcqError,
    RouteNotFound,
    TransactionClosed,
)
from rcq.models import (
    BeginRequest,
    CommitManyRequest,
    CommitRequest,
    DequeueOperation,
    DequeueRequest,
    EnqueueOperation,
    EnqueueRequest,
    ExecuteBatchRequest,
    ExecuteRequest,
    ExtendRequest,
    QueueDequeueRequest,
    QueueEnqueueRequest,
    check_queue_name,
    decode_items,
    encode_item,
)
from rcq.replication import Replicator
from rcq.transactions import CommitResult, DequeuedItem, TransactionManager

log = logging.getLogger(__name__)

CONFIG = web.AppKey("config", NodeConfig)
MANAGER = web.AppKey("manager", TransactionManager)
REPLICATOR = web.AppKey("replicator", Replicator)  # type: ignore[type-abstract]

M = TypeVar("M", bound=BaseModel)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(body=json.dumps(data, separators=(",", ":")).encode(), status=status,
                        content_type="application/json")


def error_response(error: RcqError, request: web.Request | None = None) -> web.Response:
    response = _json(error.to_body(), status=error.http_status)
    if isinstance(error, NotLeader) and error.leader_url and request is not None:
        response.headers["Location"] = error.leader_url.rstrip("/") + request.path_qs
    if error.retryable and error.http_status in (429, 503):
        response.headers["Retry-After"] = "1"
    return response


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except RcqError as exc:
        return error_response(exc, request)
    except web.HTTPRequestEntityTooLarge as exc:
        return error_response(PayloadTooLarge(f"request body over the limit: {exc.text}"))
    except web.HTTPNotFound:
        return error_response(RouteNotFound(f"no endpoint {request.method} {request.path}"))
    except web.HTTPMethodNotAllowed:
        return error_response(MethodNotAllowed(f"{request.method} is not allowed on {request.path}"))
    except web.HTTPException:
        raise
    except asyncio.CancelledError:
        raise
    except Exception:
        log.exception("unexpected error in %s %s", request.method, request.path)
        return error_response(InternalError())


async def _body(request: web.Request, model: type[M]) -> M:
    raw = await request.read()
    if not raw:
        raw = b"{}"
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        problems = [{"field": ".".join(str(p) for p in e["loc"]), "problem": e["msg"]}
                    for e in exc.errors(include_url=False)[:20]]
        first = problems[0] if problems else {"field": "", "problem": "invalid"}
        raise InvalidRequest(f"invalid {model.__name__}: {first['field']}: {first['problem']}",
                             details={"problems": problems}) from exc


def _items_body(items: list[DequeuedItem], encoding: Any) -> list[dict[str, Any]]:
    rendered = []
    for item in items:
        value, used = encode_item(item.value, encoding)
        rendered.append({"item_id": item.item_id, "queue": item.queue, "value": value, "encoding": used})
    return rendered


def _commit_body(result: CommitResult) -> dict[str, Any]:
    return {"transaction_ids": list(result.transaction_ids), "committed": True,
            "duplicate": result.duplicate, "index": result.index,
            "enqueued": result.enqueued, "dequeued": result.dequeued}


# ------------------------------------------------------------------ transactions
async def begin(request: web.Request) -> web.Response:
    body = await _body(request, BeginRequest)
    transaction = request.app[MANAGER].begin(body.timeout_s, body.label)
    return _json(transaction.describe(asyncio.get_running_loop().time()), status=201)


async def list_transactions(request: web.Request) -> web.Response:
    prefix = request.query.get("label_prefix")
    return _json({"transactions": request.app[MANAGER].list_open(prefix)})


async def transaction_status(request: web.Request) -> web.Response:
    return _json(request.app[MANAGER].describe(request.match_info["transaction_id"]))


async def enqueue(request: web.Request) -> web.Response:
    body = await _body(request, EnqueueRequest)
    values = decode_items(body.items, body.encoding, request.app[CONFIG].item_bytes_max)
    buffered = request.app[MANAGER].enqueue(request.match_info["transaction_id"], body.queue, values)
    return _json({"transaction_id": request.match_info["transaction_id"], "queue": body.queue,
                  "enqueued": len(values), "buffered": buffered})


async def dequeue(request: web.Request) -> web.Response:
    body = await _body(request, DequeueRequest)
    items = await request.app[MANAGER].dequeue(
        request.match_info["transaction_id"], body.queue, body.max_items, body.wait_ms, body.key)
    return _json({"transaction_id": request.match_info["transaction_id"], "queue": body.queue,
                  "items": _items_body(items, body.encoding)})


async def commit(request: web.Request) -> web.Response:
    body = await _body(request, CommitRequest)
    result = await request.app[MANAGER].commit(request.match_info["transaction_id"], body.idempotency_key)
    return _json(_commit_body(result))


async def abort(request: web.Request) -> web.Response:
    transaction_id = request.match_info["transaction_id"]
    returned = request.app[MANAGER].abort(transaction_id)
    return _json({"transaction_id": transaction_id, "aborted": True, "returned": returned})


async def extend(request: web.Request) -> web.Response:
    body = await _body(request, ExtendRequest)
    transaction = request.app[MANAGER].extend(request.match_info["transaction_id"], body.timeout_s)
    return _json(transaction.describe(asyncio.get_running_loop().time()))


async def commit_many(request: web.Request) -> web.Response:
    body = await _body(request, CommitManyRequest)
    result = await request.app[MANAGER].commit_many(body.transaction_ids, body.idempotency_key)
    return _json(_commit_body(result))


# --------------------------------------------------------- one-request transactions
async def run_one_request_transaction(manager: TransactionManager, config: NodeConfig,
                                      body: ExecuteRequest) -> dict[str, Any]:
    """Run the operations in a fresh transaction and commit it; abort it on any error."""
    decoded = [decode_items(op.items, op.encoding, config.item_bytes_max)
               if isinstance(op, EnqueueOperation) else None for op in body.operations]
    transaction = manager.begin()
    transaction_id = transaction.transaction_id
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
                results.append({"op": "dequeue", "queue": op.queue, "items": _items_body(items, op.encoding)})
        result = await manager.commit(transaction_id, body.idempotency_key)
    except BaseException:
        try:
            manager.abort(transaction_id)
        except (RcqError, TransactionClosed):
            pass
        raise
    return {"transaction_id": transaction_id, **_commit_body(result), "results": results}


async def execute(request: web.Request) -> web.Response:
    body = await _body(request, ExecuteRequest)
    return _json(await run_one_request_transaction(request.app[MANAGER], request.app[CONFIG], body))


async def execute_batch(request: web.Request) -> web.Response:
    body = await _body(request, ExecuteBatchRequest)
    manager, config = request.app[MANAGER], request.app[CONFIG]
    manager.require_serving()  # fail the whole request fast (e.g. 307) rather than each part

    async def one(transaction: ExecuteRequest) -> dict[str, Any]:
        try:
            return await run_one_request_transaction(manager, config, transaction)
        except RcqError as exc:
            return {**exc.to_body(), "status": exc.http_status}

    results = await asyncio.gather(*(one(t) for t in body.transactions))
    return _json({"results": results})


async def queue_enqueue(request: web.Request) -> web.Response:
    queue = check_queue_name(request.match_info["queue"])
    body = await _body(request, QueueEnqueueRequest)
    request_body = ExecuteRequest(
        operations=[EnqueueOperation(op="enqueue", queue=queue, items=body.items, encoding=body.encoding)],
        idempotency_key=body.idempotency_key)
    return _json(await run_one_request_transaction(request.app[MANAGER], request.app[CONFIG], request_body))


async def queue_dequeue(request: web.Request) -> web.Response:
    queue = check_queue_name(request.match_info["queue"])
    body = await _body(request, QueueDequeueRequest)
    request_body = ExecuteRequest(operations=[DequeueOperation(
        op="dequeue", queue=queue, max_items=body.max_items, wait_ms=body.wait_ms, encoding=body.encoding)])
    return _json(await run_one_request_transaction(request.app[MANAGER], request.app[CONFIG], request_body))


# ------------------------------------------------------------------------ queues
async def list_queues(request: web.Request) -> web.Response:
    names, counts = request.app[REPLICATOR].read(
        lambda sm: (names := sm.queue_names(), [sm.count(n) for n in names]))
    manager = request.app[MANAGER]
    return _json({"approximate": True, "queues": [
        {"queue": n, "count": c, "locked": manager.locked_count(n)} for n, c in zip(names, counts, strict=True)]})


async def queue_count(request: web.Request) -> web.Response:
    queue = check_queue_name(request.match_info["queue"])
    replicator = request.app[REPLICATOR]
    count, applied = replicator.read(lambda sm: (sm.count(queue), sm.last_index))
    locked = request.app[MANAGER].locked_count(queue)
    return _json({
        "queue": queue, "count": count, "depth": count,
        "available": None if locked is None else count - locked, "locked": locked,
        "approximate": True, "applied_index": applied,
        "node_id": request.app[CONFIG].node_id, "role": replicator.status().role,
    })


async def queue_stats(request: web.Request) -> web.Response:
    queue = check_queue_name(request.match_info["queue"])
    stats, applied = request.app[REPLICATOR].read(lambda sm: (sm.queue_stats(queue), sm.last_index))
    stats = stats or {"count": 0, "bytes": 0, "enqueued_total": 0, "dequeued_total": 0}
    return _json({"queue": queue, **stats, "locked": request.app[MANAGER].locked_count(queue),
                  "approximate": True, "applied_index": applied, "node_id": request.app[CONFIG].node_id})


# ----------------------------------------------------------------------- cluster
def cluster_status(app: web.Application) -> dict[str, Any]:
    config, replicator, manager = app[CONFIG], app[REPLICATOR], app[MANAGER]
    status = replicator.status()
    leader_address = status.leader_raft_address
    members = [(config.node_id, config.raft_address, config.url),
               *((p.node_id, p.raft_address, p.http_url) for p in config.peers)]
    leader = next((m for m in members if m[1] == leader_address), None)
    return {
        "node_id": config.node_id, "url": config.url, "role": status.role, "term": status.term,
        "leader_id": leader[0] if leader else None, "leader_url": leader[2] if leader else None,
        "serving": manager.serving, "commit_index": status.commit_index,
        "last_applied": status.last_applied, "log_length": status.log_length,
        "has_quorum": status.has_quorum, "snapshot_count": status.snapshot_count,
        "open_transactions": manager.open_count,
        "peers": [{"node_id": p.node_id, "url": p.http_url, "raft_address": p.raft_address}
                  for p in config.peers],
    }


async def cluster(request: web.Request) -> web.Response:
    return _json(cluster_status(request.app))


async def state_digest(request: web.Request) -> web.Response:
    digest, applied = request.app[REPLICATOR].read(lambda sm: (sm.digest(), sm.last_index))
    return _json({"node_id": request.app[CONFIG].node_id, "digest": digest, "applied_index": applied})


async def healthz(request: web.Request) -> web.Response:
    return _json({"ok": True, "node_id": request.app[CONFIG].node_id})


async def readyz(request: web.Request) -> web.Response:
    status = cluster_status(request.app)
    ready = status["serving"] if status["role"] == "leader" else status["leader_id"] is not None
    return _json({"ready": ready, **status}, status=200 if ready else 503)


def create_app(config: NodeConfig, manager: TransactionManager, replicator: Replicator) -> web.Application:
    app = web.Application(middlewares=[error_middleware], client_max_size=config.body_bytes_max)
    app[CONFIG] = config
    app[MANAGER] = manager
    app[REPLICATOR] = replicator
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/v1/cluster", cluster)
    app.router.add_get("/v1/cluster/digest", state_digest)
    app.router.add_post("/v1/transactions", begin)
    app.router.add_get("/v1/transactions", list_transactions)
    app.router.add_get("/v1/transactions/{transaction_id}", transaction_status)
    app.router.add_post("/v1/transactions/{transaction_id}/enqueue", enqueue)
    app.router.add_post("/v1/transactions/{transaction_id}/dequeue", dequeue)
    app.router.add_post("/v1/transactions/{transaction_id}/commit", commit)
    app.router.add_post("/v1/transactions/{transaction_id}/abort", abort)
    app.router.add_post("/v1/transactions/{transaction_id}/extend", extend)
    app.router.add_post("/v1/commit", commit_many)
    app.router.add_post("/v1/execute", execute)
    app.router.add_post("/v1/execute-batch", execute_batch)
    app.router.add_get("/v1/queues", list_queues)
    app.router.add_get("/v1/queues/{queue}", queue_count)
    app.router.add_get("/v1/queues/{queue}/stats", queue_stats)
    app.router.add_post("/v1/queues/{queue}/enqueue", queue_enqueue)
    app.router.add_post("/v1/queues/{queue}/dequeue", queue_dequeue)
    return app
