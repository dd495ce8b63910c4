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

from rcq.errors import (
    InternalError,
    InvalidQueueName,
    InvalidRequest,
    MethodNotAllowed,
    NotLeader,
    PayloadTooLarge,
    RcqError,
    RouteNotFound,
    Unauthorized,
)
from rcq.names import check_queue_name
from rcq.server.config import NodeConfig
from rcq.server.core.queue import QueueStats
from rcq.server.http import operations
from rcq.server.http.auth import CHALLENGE, auth_middleware, principal_of
from rcq.server.http.connections import read_body
from rcq.server.http.membership_routes import MEMBERSHIP, add_routes, make_probe
from rcq.server.http.metrics import NodeMetrics
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
    DequeueOperation,
    DequeueRequest,
    EnqueueOperation,
    EnqueueRequest,
    ExecuteBatchRequest,
    ExecuteRequest,
    ExtendRequest,
    QueueDequeueRequest,
    QueueEnqueueRequest,
    QueueSettingsRequest,
    ReceiveRequest,
    RedriveRequest,
    RejectRequest,
)
from rcq.server.http.openapi import openapi_spec
from rcq.server.http.status_page import QUEUES_SHOWN_MAX, Overview, page
from rcq.server.leader.membership import Membership
from rcq.server.leader.session import AnswerBudget
from rcq.server.leader.transactions import TransactionManager
from rcq.server.raft.protocol import Replicator
from rcq.server.security.tls import peer_context
from rcq.server.security.tokens import TokenRegistry

log = logging.getLogger(__name__)

CONFIG = web.AppKey("config", NodeConfig)
MANAGER = web.AppKey("manager", TransactionManager)
REPLICATOR = web.AppKey("replicator", Replicator)
METRICS = web.AppKey("metrics", NodeMetrics)

M = TypeVar("M", bound=BaseModel)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(body=json.dumps(data, separators=(",", ":")).encode(), status=status,
                        content_type="application/json")


def error_response(error: RcqError, request: web.Request | None = None) -> web.Response:
    response = _json(error.to_body(), status=error.http_status)
    if isinstance(error, NotLeader) and error.leader_url and request is not None:
        response.headers["Location"] = error.leader_url.rstrip("/") + request.path_qs
    if error.retryable and error.http_status in (429, 503, 507):
        response.headers["Retry-After"] = "1"
    if isinstance(error, Unauthorized):
        response.headers["WWW-Authenticate"] = CHALLENGE
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
    raw = await read_body(request, request.app[CONFIG].http_body_timeout_s)
    if not raw:
        raw = b"{}"
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        problems = [{"field": ".".join(str(p) for p in e["loc"]), "problem": e["msg"]}
                    for e in exc.errors(include_url=False)[:20]]
        first = problems[0] if problems else {"field": "", "problem": "invalid"}
        error_class = InvalidQueueName if first["field"].split(".")[-1] == "queue" else InvalidRequest
        raise error_class(f"invalid {model.__name__}: {first['field']}: {first['problem']}",
                             details={"problems": problems}) from exc


# ------------------------------------------------------------------ transactions
def caller_of(request: web.Request) -> operations.Caller:
    """Who is asking: the token's principal; per-client caps count the principal, or the peer
    address on a node without tokens (where every caller is the same anonymous principal)."""
    principal = principal_of(request)
    return operations.Caller(principal, principal.name if principal.authenticated else request.remote or "")


def admin_only(what: str, handler: Handler) -> Handler:
    async def guarded(request: web.Request) -> web.StreamResponse:
        principal_of(request).require_admin(what)
        return await handler(request)

    return guarded


async def begin(request: web.Request) -> web.Response:
    status, body = await operations.begin(request.app[MANAGER], await _body(request, BeginRequest),
                                          caller_of(request))
    return _json(body, status)


async def list_transactions(request: web.Request) -> web.Response:
    prefix = request.query.get("label_prefix")
    return _json({"transactions": request.app[MANAGER].list_open(prefix, principal_of(request).name)})


async def transaction_status(request: web.Request) -> web.Response:
    status, body = await operations.status(request.app[MANAGER], request.match_info["transaction_id"],
                                           caller_of(request))
    return _json(body, status)


async def enqueue(request: web.Request) -> web.Response:
    status, body = await operations.enqueue(request.app[MANAGER], request.app[CONFIG],
                                            request.match_info["transaction_id"],
                                            await _body(request, EnqueueRequest), caller_of(request))
    return _json(body, status)


async def dequeue(request: web.Request) -> web.Response:
    status, body = await operations.dequeue(request.app[MANAGER], request.match_info["transaction_id"],
                                            await _body(request, DequeueRequest), caller_of(request))
    return _json(body, status)


async def commit(request: web.Request) -> web.Response:
    status, body = await operations.commit(request.app[MANAGER], request.match_info["transaction_id"],
                                           await _body(request, CommitRequest), caller_of(request))
    return _json(body, status)


async def abort(request: web.Request) -> web.Response:
    status, body = await operations.abort(request.app[MANAGER], request.match_info["transaction_id"],
                                          caller_of(request))
    return _json(body, status)


async def reject(request: web.Request) -> web.Response:
    status, body = await operations.reject(request.app[MANAGER], request.match_info["transaction_id"],
                                           await _body(request, RejectRequest), caller_of(request))
    return _json(body, status)


async def extend(request: web.Request) -> web.Response:
    status, body = await operations.extend(request.app[MANAGER], request.match_info["transaction_id"],
                                           await _body(request, ExtendRequest), caller_of(request))
    return _json(body, status)


async def commit_many(request: web.Request) -> web.Response:
    status, body = await operations.commit_many(request.app[MANAGER], request.app[CONFIG],
                                                await _body(request, CommitManyRequest), caller_of(request))
    return _json(body, status)


async def execute(request: web.Request) -> web.Response:
    status, body = await operations.execute(request.app[MANAGER], request.app[CONFIG],
                                            await _body(request, ExecuteRequest), caller_of(request))
    return _json(body, status)


async def _answer_each(coroutines: list[Awaitable[operations.Answer]]) -> list[dict[str, Any]]:
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
    body = await _body(request, ExecuteBatchRequest)
    manager, config = request.app[MANAGER], request.app[CONFIG]
    operations.check_count("transactions", len(body.transactions), config)
    manager.require_serving()  # fail the whole request fast (e.g. 307) rather than each part
    caller, budget = caller_of(request), manager.answer_budget()  # one answer, one budget
    answers = await _answer_each([operations.execute(manager, config, t, caller, budget)
                                  for t in body.transactions])
    return _json({"results": [a["body"] if a["status"] < 300 else {**a["body"], "status": a["status"]}
                              for a in answers]})


def _batch_operation(manager: TransactionManager, config: NodeConfig, caller: operations.Caller,
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


async def batch(request: web.Request) -> web.Response:
    """Many independent sub-requests (any verb, any transaction) in one HTTP request."""
    body = await _body(request, BatchRequest)
    manager, config = request.app[MANAGER], request.app[CONFIG]
    operations.check_count("sub-requests", len(body.requests), config)
    manager.require_serving()
    caller, budget = caller_of(request), manager.answer_budget()  # one answer, one budget
    answers = await _answer_each([_batch_operation(manager, config, caller, budget, sub) for sub in body.requests])
    return _json({"responses": answers})


async def queue_enqueue(request: web.Request) -> web.Response:
    queue = check_queue_name(request.match_info["queue"])
    body = await _body(request, QueueEnqueueRequest)
    request_body = ExecuteRequest(
        operations=[EnqueueOperation(op="enqueue", queue=queue, items=body.items, encoding=body.encoding,
                                     priority=body.priority, delay_s=body.delay_s, ttl_s=body.ttl_s)],
        idempotency_key=body.idempotency_key)
    status, answer = await operations.execute(request.app[MANAGER], request.app[CONFIG], request_body,
                                              caller_of(request))
    return _json(answer, status)


async def queue_dequeue(request: web.Request) -> web.Response:
    queue = check_queue_name(request.match_info["queue"])
    body = await _body(request, QueueDequeueRequest)
    request_body = ExecuteRequest(operations=[DequeueOperation(
        op="dequeue", queue=queue, max_items=body.max_items, wait_ms=body.wait_ms, encoding=body.encoding)])
    status, answer = await operations.execute(request.app[MANAGER], request.app[CONFIG], request_body,
                                              caller_of(request))
    return _json(answer, status)


# ------------------------------------------------------------------------ queues
async def list_queues(request: web.Request) -> web.Response:
    principal = principal_of(request)
    names, counts = request.app[REPLICATOR].read(
        lambda sm: (names := [n for n in sm.queue_names() if principal.may_see(n)], [sm.count(n) for n in names]))
    manager = request.app[MANAGER]
    return _json({"approximate": True, "queues": [
        {"queue": n, "count": c, "locked": manager.locked_count(n)} for n, c in zip(names, counts, strict=True)]})


async def queue_count(request: web.Request) -> web.Response:
    queue = check_queue_name(request.match_info["queue"])
    principal_of(request).require_see(queue)
    replicator, config = request.app[REPLICATOR], request.app[CONFIG]
    count, applied, stats = replicator.read(lambda sm: (sm.count(queue), sm.last_index, sm.queue_stats(queue)))
    return _json({
        "queue": queue, "count": count, "depth": count, **_item_states(request.app[MANAGER], queue, count, stats),
        "approximate": True, "applied_index": applied,
        "node_id": config.node_id, "role": replicator.status().role,
        **operations.queue_settings_body(request.app[MANAGER], queue),
    })


async def queue_stats(request: web.Request) -> web.Response:
    queue = check_queue_name(request.match_info["queue"])
    principal_of(request).require_see(queue)
    config = request.app[CONFIG]
    stats, applied = request.app[REPLICATOR].read(
        lambda sm: (sm.queue_stats(queue), sm.last_index))
    stats = stats or {"count": 0, "bytes": 0, "cost_bytes": 0, **dict.fromkeys(QueueStats.TOTALS, 0)}
    states = _item_states(request.app[MANAGER], queue, stats["count"], stats)
    return _json({"queue": queue, **stats, **states,
                  "approximate": True, "applied_index": applied, "node_id": config.node_id,
                  **operations.queue_settings_body(request.app[MANAGER], queue)})


def _item_states(manager: TransactionManager, queue: str, count: int, stats: dict[str, int] | None
                 ) -> dict[str, int | None]:
    """ready / delayed / locked: the leader's view when this node serves; elsewhere the delayed count
    from the replicated state at its time, and nothing for locks (only the leader knows them)."""
    counts = manager.queue_counts(queue)
    if counts is not None:
        return {"available": counts["ready"], **counts}
    delayed = (stats or {}).get("delayed", 0)
    return {"available": None, "locked": None, "delayed": delayed, "ready": None}


async def receive(request: web.Request) -> web.Response:
    queue = check_queue_name(request.match_info["queue"])
    status, body = await operations.receive(request.app[MANAGER], queue, await _body(request, ReceiveRequest),
                                            caller_of(request))
    return _json(body, status)


async def redrive(request: web.Request) -> web.Response:
    queue = check_queue_name(request.match_info["queue"])
    status, body = await operations.redrive(request.app[MANAGER], queue, await _body(request, RedriveRequest),
                                            caller_of(request))
    return _json(body, status)


async def configure_queue(request: web.Request) -> web.Response:
    queue = check_queue_name(request.match_info["queue"])
    principal_of(request).require("manage", queue)
    status, body = await operations.configure_queue(request.app[MANAGER], queue,
                                                    await _body(request, QueueSettingsRequest))
    return _json(body, status)


async def purge_queue(request: web.Request) -> web.Response:
    queue = check_queue_name(request.match_info["queue"])
    principal_of(request).require("manage", queue)
    status, body = await operations.purge_queue(request.app[MANAGER], queue)
    return _json(body, status)


async def delete_queue(request: web.Request) -> web.Response:
    queue = check_queue_name(request.match_info["queue"])
    principal_of(request).require("manage", queue)
    status, body = await operations.delete_queue(request.app[MANAGER], queue)
    return _json(body, status)


async def storage(request: web.Request) -> web.Response:
    """GET /v1/cluster/storage: how full the node's budget and tables are (cheap: counters only)."""
    config = request.app[CONFIG]
    cost, sizes = request.app[REPLICATOR].read(lambda sm: (sm.storage_cost, sm.table_sizes()))
    return _json({"node_id": config.node_id, "storage_bytes": cost, "storage_bytes_max": config.storage_bytes_max,
                  **sizes, "open_transactions": request.app[MANAGER].open_count})


# ----------------------------------------------------------------------- cluster
def cluster_status(app: web.Application) -> dict[str, Any]:
    config, replicator, manager = app[CONFIG], app[REPLICATOR], app[MANAGER]
    status = replicator.status()
    directory = app[MEMBERSHIP].directory()
    leader_address = status.leader_raft_address
    members = [(p.node_id, p.raft_address, p.http_url) for p in directory.values()]
    leader = next((m for m in members if m[1] == leader_address), None)
    voting = replicator.members()
    peers = [directory[address] for address in voting[1:] if address in directory]
    return {
        "node_id": config.node_id, "url": config.url, "role": status.role, "term": status.term,
        "leader_id": leader[0] if leader else None, "leader_url": leader[2] if leader else None,
        "serving": manager.serving, "commit_index": status.commit_index,
        "last_applied": status.last_applied, "log_length": status.log_length,
        "has_quorum": status.has_quorum, "snapshot_count": status.snapshot_count,
        "snapshots_received": int(status.details.get("snapshots_received", 0)),
        "open_transactions": manager.open_count,
        "leader_changes_seen": int(status.details.get("leader_changes_seen", 0)),
        "commit_latency": _commit_latency(app),
        "recent_leader_changes": [
            {"at": at, "leader_id": next((m[0] for m in members if m[1] == address), None), "term": term}
            for at, address, term in status.details.get("leader_history", [])],
        "peers": [{"node_id": p.node_id, "url": p.http_url, "raft_address": p.raft_address} for p in peers],
        "member": config.raft_address in voting,
    }


# What /v1/cluster tells a principal without admin: enough to find and follow the leader.
CLUSTER_PUBLIC_KEYS = ("node_id", "url", "role", "term", "leader_id", "leader_url", "serving", "peers")


async def cluster(request: web.Request) -> web.Response:
    status = cluster_status(request.app)
    if not principal_of(request).admin:
        status = {key: status[key] for key in CLUSTER_PUBLIC_KEYS}
        status["peers"] = [{"node_id": p["node_id"], "url": p["url"]} for p in status["peers"]]
    return _json(status)


async def state_digest(request: web.Request) -> web.Response:
    # Hashed off the apply path (a forked child on a Raft node): the state is O(items).
    digest, applied = await request.app[REPLICATOR].digest()
    return _json({"node_id": request.app[CONFIG].node_id, "digest": digest, "applied_index": applied})


async def request_snapshot(request: web.Request) -> web.Response:
    """Ask this node to snapshot its state and compact its log now (operators, benchmarks)."""
    request.app[REPLICATOR].request_snapshot()
    return _json({"node_id": request.app[CONFIG].node_id, "snapshot_requested": True}, status=202)


def _commit_latency(app: web.Application) -> dict[str, float]:
    """Sum and count of this node's commit latencies (as leader): a mean per interval from two reads."""
    registry = app[METRICS].registry
    return {"sum_s": registry.get_sample_value("rcq_commit_duration_seconds_sum") or 0.0,
            "count": registry.get_sample_value("rcq_commit_duration_seconds_count") or 0.0}


def _queue_rows(app: web.Application) -> list[dict[str, Any]]:
    """The deepest queues (at most QUEUES_SHOWN_MAX) for the status page."""
    manager = app[MANAGER]
    rows = app[REPLICATOR].read(lambda sm: sm.deepest_queues(QUEUES_SHOWN_MAX))
    return [{"queue": name, **stats, "locked": manager.locked_count(name)} for name, stats in rows]


async def openapi(request: web.Request) -> web.Response:
    """The OpenAPI 3.1 description of this API (rcq.server.http.openapi), with this node as its server."""
    return _json(openapi_spec(request.app[CONFIG].url))


async def healthz(request: web.Request) -> web.Response:
    return _json({"ok": True, "node_id": request.app[CONFIG].node_id})


async def readyz(request: web.Request) -> web.Response:
    status = cluster_status(request.app)
    ready = status["serving"] if status["role"] == "leader" else status["leader_id"] is not None
    return _json({"ready": ready, **status}, status=200 if ready else 503)


def create_app(config: NodeConfig, manager: TransactionManager, replicator: Replicator) -> web.Application:
    metrics = NodeMetrics(config, manager, replicator)
    tokens = TokenRegistry(config.tokens, config.tokens_file)
    # The metrics middleware is outermost: it counts the status error_middleware answered with,
    # and error_middleware renders what authentication refuses.
    app = web.Application(middlewares=[metrics.middleware, error_middleware, auth_middleware(tokens)],
                          client_max_size=config.body_bytes_max)
    app[CONFIG] = config
    app[MANAGER] = manager
    app[REPLICATOR] = replicator
    app[METRICS] = metrics
    app[MEMBERSHIP] = Membership(config, manager, replicator, make_probe(peer_context(config)))
    overview = Overview(own_status=lambda: cluster_status(app), queues=lambda: _queue_rows(app),
                        peer_tls=peer_context(config))
    app.on_cleanup.append(overview.close)
    app.router.add_get("/", page)
    app.router.add_get("/v1/cluster/overview", admin_only("read the cluster overview", overview.handle))
    app.router.add_get("/metrics", admin_only("read metrics", metrics.handle))
    app.router.add_get("/v1/openapi.json", openapi)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/v1/cluster", cluster)
    app.router.add_get("/v1/cluster/digest", admin_only("read the state digest", state_digest))
    app.router.add_post("/v1/admin/snapshot", admin_only("request a snapshot", request_snapshot))
    add_routes(app, _body, lambda body, status: _json(body, status), admin_only)
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
    app.router.add_get("/v1/queues", list_queues)
    app.router.add_get("/v1/cluster/storage", admin_only("read storage figures", storage))
    app.router.add_get("/v1/queues/{queue}", queue_count)
    app.router.add_put("/v1/queues/{queue}", configure_queue)
    app.router.add_delete("/v1/queues/{queue}", delete_queue)
    app.router.add_post("/v1/queues/{queue}/purge", purge_queue)
    app.router.add_post("/v1/queues/{queue}/redrive", redrive)
    app.router.add_get("/v1/queues/{queue}/stats", queue_stats)
    app.router.add_post("/v1/queues/{queue}/enqueue", queue_enqueue)
    app.router.add_post("/v1/queues/{queue}/dequeue", queue_dequeue)
    app.router.add_post("/v1/queues/{queue}/receive", receive)
    return app
