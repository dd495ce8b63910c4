"""``GET /readyz`` (no token): is this process ready to take requests (docs/http-api.md)?

A process is ready when it is its group's serving leader, or a follower that knows a leader. At a
node's own port that is p0's readiness, as before partitions: the node can take every request,
since it forwards what belongs to another partition to that partition's leader.

``GET /readyz?partitions=1`` asks more of a node: each of its partition processes is asked too
(``partitions``: name -> that process's own answer, null when it did not answer within
READY_ASK_TIMEOUT_S), and the node is ready only when every one of them is. A rolling restart
waits for it before stopping the next node, so that no partition loses two members at once
(docs/partitions.md, docs/operations.md).

The answer also gives this process's storage figures (``storage_bytes``, ``storage_bytes_max``: its
allowance, ``node_storage_bytes_max``): p0's controller shares each node's memory budget between
its partitions from them, in the survey it makes of every member's /readyz anyway
(docs/partitions.md, "Memory budget"). Numbers only, as ``items`` already is: no names, no data.

Must not import: pysyncobj, lmdb.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from rcq.server.http.cluster_routes import cluster_status, storage_figures
from rcq.server.http.handlers import json_response
from rcq.server.http.partition_asker import LEADER_ASKER, READY_ASK_TIMEOUT_S
from rcq.server.http.partition_routes import local_partitions

_YES = frozenset({"1", "true", "yes"})


def own_readiness(app: web.Application) -> dict[str, Any]:
    status = cluster_status(app)
    ready = status["serving"] if status["role"] == "leader" else status["leader_id"] is not None
    return {"ready": ready, **status, **storage_figures(app)}


async def partition_readiness(app: web.Application) -> dict[str, dict[str, Any] | None]:
    """Each of this node's partition processes' /readyz answer (None: it did not answer)."""
    local = local_partitions(app)
    answers = await asyncio.gather(*(app[LEADER_ASKER].call("GET", f"{url}/readyz", {}, None, READY_ASK_TIMEOUT_S)
                                     for _, url in local))
    return {name: answered[1] if answered is not None and "ready" in answered[1] else None
            for (name, _), answered in zip(local, answers, strict=True)}


async def readyz(request: web.Request) -> web.Response:
    body = own_readiness(request.app)
    if request.query.get("partitions", "").lower() in _YES:
        partitions = await partition_readiness(request.app)
        body["partitions"] = partitions
        body["ready"] = body["ready"] and all(p is not None and p["ready"] is True for p in partitions.values())
    return json_response(body, status=200 if body["ready"] else 503)


def add_routes(app: web.Application) -> None:
    app.router.add_get("/readyz", readyz)
