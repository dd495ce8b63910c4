"""The queue routes: ``/v1/queues`` and ``/v1/queues/{queue}/...``.

One-request enqueue and dequeue (a one-operation ``execute``), receive, counts and stats (read
from the replicated state; the leader adds what only it knows: locked, delayed, ready), and the
administration of a queue (configure, purge, delete, redrive), which needs ``manage``.

Must not import: pysyncobj, lmdb.
"""

from __future__ import annotations

from typing import Any, Literal

from aiohttp import web

from rcq.errors import DeadLetterPartitionMismatch, QueueNotFound
from rcq.names import P0, check_queue_name
from rcq.server.core.queue import QueueStats
from rcq.server.http import operations, spread_queues
from rcq.server.http.auth import principal_of
from rcq.server.http.handlers import CONFIG, MANAGER, REPLICATOR, caller_of, json_response, read_model
from rcq.server.http.models import (
    DequeueOperation,
    EnqueueOperation,
    ExecuteRequest,
    QueueDequeueRequest,
    QueueEnqueueRequest,
    QueueSettingsRequest,
    ReceiveRequest,
    RedriveRequest,
)
from rcq.server.http.partition_routes import (
    PARTITION_DIRECTORY,
    forward_configure,
    forward_delete,
    from_other_partitions,
)
from rcq.server.leader.placement import PLACEMENT_HEADER, placement_allowed
from rcq.server.leader.transactions import TransactionManager


async def queue_enqueue(request: web.Request) -> web.Response:
    queue = check_queue_name(request.match_info["queue"])
    body = await read_model(request, QueueEnqueueRequest)
    request_body = ExecuteRequest(
        operations=[EnqueueOperation(op="enqueue", queue=queue, items=body.items, encoding=body.encoding,
                                     priority=body.priority, delay_s=body.delay_s, ttl_s=body.ttl_s)],
        idempotency_key=body.idempotency_key)

    async def here() -> tuple[int, dict[str, Any]]:
        return await operations.execute(request.app[MANAGER], request.app[CONFIG], request_body, caller_of(request))

    spread = _spread_here(request, queue, "produce")
    status, answer = await (spread_queues.enqueue(request, queue, spread, await request.json(), here)
                            if spread is not None else here())
    return json_response(answer, status)


def _spread_here(request: web.Request, queue: str, action: Literal["produce", "consume"]) -> list[str] | None:
    """The partitions of a spread queue whose one-request verb this node's own port shares out
    (rcq.server.http.spread_queues), refused first as the verb would be; None: not spread, or not
    here. p0's leader shares them out: a follower forwards the request to it."""
    spread = spread_queues.spread_over(request.app, queue)
    if spread is not None:
        principal_of(request).require(action, queue)
        request.app[MANAGER].require_serving()
    return spread


async def queue_dequeue(request: web.Request) -> web.Response:
    queue = check_queue_name(request.match_info["queue"])
    body = await read_model(request, QueueDequeueRequest)

    async def here(sent: dict[str, Any] | None = None) -> tuple[int, dict[str, Any]]:
        wait_ms = body.wait_ms if sent is None else int(sent["wait_ms"])
        request_body = ExecuteRequest(operations=[DequeueOperation(
            op="dequeue", queue=queue, max_items=body.max_items, wait_ms=wait_ms, encoding=body.encoding)])
        return await operations.execute(request.app[MANAGER], request.app[CONFIG], request_body, caller_of(request))

    spread = _spread_here(request, queue, "consume")
    status, answer = await (spread_queues.take(request, queue, spread, "dequeue", await request.json(), here)
                            if spread is not None else here())
    return json_response(answer, status)


async def list_queues(request: web.Request) -> web.Response:
    """Every queue the caller may see. At a node's own port, those of every partition (each
    partition's leader asked, ``partition`` on each row); ``unanswered`` names the partitions that
    could not be asked now (their queues are missing from the list)."""
    principal = principal_of(request)
    names, counts = request.app[REPLICATOR].read(
        lambda sm: (names := [n for n in sm.queue_names() if principal.may_see(n)], [sm.count(n) for n in names]))
    manager = request.app[MANAGER]
    own = manager.routing.own
    rows = [{"queue": n, "count": c, "locked": manager.locked_count(n), "partition": own}
            for n, c in zip(names, counts, strict=True)]
    answered, unanswered = await from_other_partitions(request, "/v1/queues")
    for partition, answer in answered.items():
        rows += [{**row, "partition": partition} for row in answer.get("queues") or [] if isinstance(row, dict)]
    body: dict[str, Any] = {"approximate": True, "queues": rows}
    if unanswered:
        body["unanswered"] = unanswered
    return json_response(body)


async def queue_count(request: web.Request) -> web.Response:
    queue = check_queue_name(request.match_info["queue"])
    principal_of(request).require_see(queue)
    spread = spread_queues.spread_over(request.app, queue)
    if spread is not None:  # every fragment's, summed (rcq.server.http.spread_queues)
        answers = await spread_queues.each_fragment(request, spread, "GET", f"/v1/queues/{queue}",
                                                    lambda: _answered(_count_body(request.app, queue)),
                                                    leader_wait_s=spread_queues.FRAGMENT_LEADER_WAIT_S)
        return json_response(spread_queues.merged_read(queue, spread, answers))
    request.app[MANAGER].routing.queue(queue)  # permitted here first; placed elsewhere: forwarded there
    return json_response(_count_body(request.app, queue))


def _count_body(app: web.Application, queue: str) -> dict[str, Any]:
    replicator, config = app[REPLICATOR], app[CONFIG]
    count, applied, stats = replicator.read(lambda sm: (sm.count(queue), sm.last_index, sm.queue_stats(queue)))
    return {
        "queue": queue, "count": count, "depth": count, **_item_states(app[MANAGER], queue, count, stats),
        "approximate": True, "applied_index": applied,
        "node_id": config.node_id, "role": replicator.status().role,
        **operations.queue_settings_body(app[MANAGER], queue),
    }


async def _answered(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    return 200, body


async def queue_stats(request: web.Request) -> web.Response:
    queue = check_queue_name(request.match_info["queue"])
    principal_of(request).require_see(queue)
    spread = spread_queues.spread_over(request.app, queue)
    if spread is not None:
        answers = await spread_queues.each_fragment(request, spread, "GET", f"/v1/queues/{queue}/stats",
                                                    lambda: _answered(_stats_body(request.app, queue)),
                                                    leader_wait_s=spread_queues.FRAGMENT_LEADER_WAIT_S)
        return json_response(spread_queues.merged_read(queue, spread, answers))
    request.app[MANAGER].routing.queue(queue)  # permitted here first; placed elsewhere: forwarded there
    return json_response(_stats_body(request.app, queue))


def _stats_body(app: web.Application, queue: str) -> dict[str, Any]:
    config = app[CONFIG]
    stats, applied = app[REPLICATOR].read(lambda sm: (sm.queue_stats(queue), sm.last_index))
    stats = stats or {"count": 0, "bytes": 0, "cost_bytes": 0, **dict.fromkeys(QueueStats.TOTALS, 0)}
    states = _item_states(app[MANAGER], queue, stats["count"], stats)
    return {"queue": queue, **stats, **states, "approximate": True, "applied_index": applied,
            "node_id": config.node_id, **operations.queue_settings_body(app[MANAGER], queue)}


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
    body = await read_model(request, ReceiveRequest)

    async def here(sent: dict[str, Any] | None = None) -> tuple[int, dict[str, Any]]:
        asked = body if sent is None else body.model_copy(update={"wait_ms": int(sent["wait_ms"])})
        return await operations.receive(request.app[MANAGER], queue, asked, caller_of(request))

    spread = _spread_here(request, queue, "consume")
    status, answer = await (spread_queues.take(request, queue, spread, "receive", await request.json(), here)
                            if spread is not None else here())
    return json_response(answer, status)


async def queue_placement(request: web.Request) -> web.Response:
    """GET /v1/queues/{queue}/placement: the partitions ``queue`` lives in, from this node's copy of
    the directory (p0 for a queue never placed, where a first enqueue creates it). How clients route
    (docs/partitions.md); a partition process answers only for the queues it holds."""
    queue = check_queue_name(request.match_info["queue"])
    principal_of(request).require_see(queue)
    app = request.app
    config = app[CONFIG]
    if config.partition_name is not None and not app[REPLICATOR].read(lambda sm: sm.queue_stats(queue) is not None):
        raise QueueNotFound(f"queue {queue!r} is not in partition {config.partition_name}; ask a node's own port",
                            details={"queue": queue, "partition": config.partition_name})
    return json_response({"queue": queue, "partitions": list(app[MANAGER].routing.placed(queue))})


async def redrive(request: web.Request) -> web.Response:
    queue = check_queue_name(request.match_info["queue"])
    principal_of(request).require("manage", queue)  # as operations.redrive does, before a forward
    manager = request.app[MANAGER]
    spread = spread_queues.spread_over(request.app, queue)
    model = await read_model(request, RedriveRequest)
    if spread is not None:
        manager.require_serving()
        status, body = await spread_queues.redrive(request, queue, spread, model.model_dump(exclude_none=True), lambda: (
            operations.redrive(manager, queue, model, caller_of(request))))
        return json_response(body, status)
    manager.routing.queue(queue)  # permitted here first; placed elsewhere: forwarded there
    status, body = await operations.redrive(manager, queue, model, caller_of(request))
    return json_response(body, status)


async def configure_queue(request: web.Request) -> web.Response:
    """PUT /v1/queues/{queue}. With ``partitions`` (or a queue already placed elsewhere), p0's leader
    places it in the directory and has that partition's leader create or configure it there."""
    queue = check_queue_name(request.match_info["queue"])
    principal_of(request).require("manage", queue)
    body = await read_model(request, QueueSettingsRequest)
    app = request.app
    config = app[CONFIG]
    if config.partition_name is not None:  # a partition process: its queues come placed by p0
        exists = app[REPLICATOR].read(lambda sm: sm.queue_stats(queue) is not None)
        if body.partitions not in (None, [config.partition_name]) or not (
                exists or placement_allowed(config, queue, request.headers.get(PLACEMENT_HEADER))):
            raise QueueNotFound(
                f"queue {queue!r} is not in partition {config.partition_name}: create a queue in a partition "
                f"through p0 (PUT /v1/queues/{queue} with {{\"partitions\": [\"{config.partition_name}\"]}} "
                "to any node's own port)", details={"queue": queue, "partition": config.partition_name})
    else:
        directory = app[PARTITION_DIRECTORY]
        if body.dead_letter_queue is not None:
            wanted = body.partitions if body.partitions is not None else directory.placed(queue)
            if directory.placed(body.dead_letter_queue) != wanted:
                raise DeadLetterPartitionMismatch(
                    f"dead-letter queue {body.dead_letter_queue!r} lives in partition "
                    f"{', '.join(directory.placed(body.dead_letter_queue))} and queue {queue!r} in {', '.join(wanted)}: a "
                    "dead item moves in its source's transaction, so both live in one partition (docs/partitions.md)",
                    details={"queue": queue, "queue_partitions": wanted, "dead_letter_queue": body.dead_letter_queue,
                             "dead_letter_queue_partitions": directory.placed(body.dead_letter_queue)})
        wanted = body.partitions if body.partitions is not None else directory.placed(queue)
        if len(wanted) > 1:  # a limit below one per fragment is refused before anything is placed
            spread_queues.fragment_settings(queue, body, wanted)
        placed = await directory.place(queue, body.partitions) if body.partitions is not None \
            else directory.placed(queue)
        if len(placed) > 1:  # spread: every fragment configured (rcq.server.http.spread_queues)
            app[MANAGER].require_serving()
            status, answer = await spread_queues.configure(
                request, queue, placed, body, lambda share: operations.configure_queue(app[MANAGER], queue, share))
            return json_response(answer, status)
        if placed != [P0]:
            status, answer = await forward_configure(request, placed[0], queue, body)
            return json_response(answer, status)
    status, answer = await operations.configure_queue(app[MANAGER], queue, body)
    return json_response(answer, status)


async def purge_queue(request: web.Request) -> web.Response:
    queue = check_queue_name(request.match_info["queue"])
    principal_of(request).require("manage", queue)
    manager = request.app[MANAGER]
    spread = spread_queues.spread_over(request.app, queue)
    if spread is not None:
        manager.require_serving()
        status, body = await spread_queues.purge(request, queue, spread, lambda: operations.purge_queue(manager, queue))
        return json_response(body, status)
    manager.routing.queue(queue)  # permitted here first; placed elsewhere: forwarded there
    status, body = await operations.purge_queue(manager, queue)
    return json_response(body, status)


async def delete_queue(request: web.Request) -> web.Response:
    """DELETE /v1/queues/{queue}. A queue placed in another partition is deleted there by p0's
    leader, which then forgets the placement (the name may be placed anew)."""
    queue = check_queue_name(request.match_info["queue"])
    principal_of(request).require("manage", queue)
    manager = request.app[MANAGER]
    spread = spread_queues.spread_over(request.app, queue)
    if spread is not None:  # every fragment, then the placement forgotten
        manager.require_serving()
        status, answer = await spread_queues.delete(request, queue, spread,
                                                    lambda: operations.delete_queue(manager, queue))
        return json_response(answer, status)
    placed = manager.routing.placed(queue)
    if request.app[CONFIG].partition_name is None and placed[0] != P0:
        status, answer = await forward_delete(request, placed[0], queue)
        return json_response(answer, status)
    status, body = await operations.delete_queue(request.app[MANAGER], queue)
    return json_response(body, status)


def add_routes(app: web.Application) -> None:
    app[spread_queues.SPREAD_TURNS] = spread_queues.Turns()
    app.router.add_get("/v1/queues", list_queues)
    app.router.add_get("/v1/queues/{queue}", queue_count)
    app.router.add_put("/v1/queues/{queue}", configure_queue)
    app.router.add_delete("/v1/queues/{queue}", delete_queue)
    app.router.add_post("/v1/queues/{queue}/purge", purge_queue)
    app.router.add_post("/v1/queues/{queue}/redrive", redrive)
    app.router.add_get("/v1/queues/{queue}/stats", queue_stats)
    app.router.add_get("/v1/queues/{queue}/placement", queue_placement)
    app.router.add_post("/v1/queues/{queue}/enqueue", queue_enqueue)
    app.router.add_post("/v1/queues/{queue}/dequeue", queue_dequeue)
    app.router.add_post("/v1/queues/{queue}/receive", receive)
