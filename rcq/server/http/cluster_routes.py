"""The cluster routes: its status (``/v1/cluster``, ``/healthz``; ``/readyz`` is in
rcq.server.http.readiness), the status page and its overview, storage figures and a partition
process's share of its node's memory budget (``PUT /v1/cluster/storage-budget``, which p0's leader
calls: docs/partitions.md, "Memory budget"), the state digest, a snapshot on request, the OpenAPI
document and the AsyncAPI one (the session channel); the backup routes
(rcq.server.http.backup_routes).

Everything but the public part of ``/v1/cluster``, the health checks and the two API documents
needs an admin principal.

Must not import: pysyncobj, lmdb.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from aiohttp import web

from rcq.errors import InvalidRequest
from rcq.names import P0
from rcq.server.core.features import level_max_read
from rcq.server.http.asyncapi import asyncapi_spec
from rcq.server.http.auth import principal_of
from rcq.server.http.backup_routes import BACKUPS, add_backup_routes
from rcq.server.http.handlers import (
    CONFIG,
    MANAGER,
    METRICS,
    PARTITION_CONTROLLER,
    PARTITION_HOST,
    REPLICATOR,
    admin_only,
    json_response,
    read_model,
)
from rcq.server.http.membership_routes import MEMBERSHIP
from rcq.server.http.models import StorageBudgetRequest
from rcq.server.http.openapi import openapi_spec
from rcq.server.http.status_page import QUEUES_SHOWN_MAX, Overview, page
from rcq.server.leader.partition_directory import partition_ports_of
from rcq.server.security.cluster_calls import STORAGE_BUDGET_PATH
from rcq.server.security.tls import peer_context
from rcq.version import rcq_version

log = logging.getLogger(__name__)


def storage_body(app: web.Application) -> dict[str, Any]:
    """GET /v1/cluster/storage of this process: how full its budget and tables are (cheap: counters
    only). ``storage_bytes_max`` is this process's allowance, its share of the node's budget,
    ``node_storage_bytes_max``."""
    manager = app[MANAGER]
    cost, sizes = app[REPLICATOR].read(lambda sm: (sm.storage_cost, sm.table_sizes()))
    return {"node_id": app[CONFIG].node_id, "storage_bytes": cost, "storage_bytes_max": manager.storage_bytes_max,
            "node_storage_bytes_max": manager.node_storage_bytes_max, **sizes, "open_transactions": manager.open_count}


def storage_figures(app: web.Application) -> dict[str, int]:
    """What /readyz adds for p0's controller (rcq.server.leader.storage_sharing): what this
    process's replica holds, its allowance, and its node's budget. Numbers only, like ``items``."""
    manager = app[MANAGER]
    return {"storage_bytes": app[REPLICATOR].read(lambda sm: sm.storage_cost),
            "storage_bytes_max": manager.storage_bytes_max, "node_storage_bytes_max": manager.node_storage_bytes_max}


async def storage_budget(request: web.Request) -> web.Response:
    """PUT /v1/cluster/storage-budget: a partition process takes the allowance p0's leader gives it
    (as a follower too: it is the allowance it stamps once it leads)."""
    if request.app[CONFIG].partition_name is None:
        raise InvalidRequest("p0's share of the node's memory budget is set by p0's leader itself; this route is "
                             "a partition process's (docs/partitions.md, \"Memory budget\")")
    body = await read_model(request, StorageBudgetRequest)
    manager = request.app[MANAGER]
    allowance = manager.set_storage_budget(body.storage_bytes_max)
    log.debug("storage allowance %d of the node's %d", allowance, manager.node_storage_bytes_max)
    return json_response({"node_id": request.app[CONFIG].node_id, "partition": request.app[CONFIG].partition_name,
                          "storage_bytes_max": allowance, "node_storage_bytes_max": manager.node_storage_bytes_max})


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
        "leader_for_s": _leader_for_s(status.details.get("leader_history", []), leader_address),
        "recent_leader_changes": [
            {"at": at, "leader_id": next((m[0] for m in members if m[1] == address), None), "term": term}
            for at, address, term in status.details.get("leader_history", [])],
        "peers": [{"node_id": p.node_id, "url": p.http_url, "raft_address": p.raft_address} for p in peers],
        "member": config.raft_address in voting,
        "version": rcq_version(),
        "feature_level": replicator.read(lambda sm: sm.level),
        # The cluster's identity (feature level 2; docs/backup.md); None at level 1 or until given.
        "cluster_id": replicator.read(lambda sm: sm.cluster_id),
        "feature_level_max": level_max_read(config.test_feature_level_max),
        # The last backup this node served (docs/backup.md); None until one was.
        "last_backup": app[BACKUPS].last if BACKUPS in app else None,
        # The partition this process serves, and at a node's own port its partition processes
        # (docs/partitions.md): name -> pid, restarts, last exit, CPU seconds, resident bytes.
        "partition": config.partition_name or P0,
        "partition_processes": app[PARTITION_HOST].status() if PARTITION_HOST in app else {},
        "items": replicator.read(lambda sm: sm.table_sizes()["items"]),
    }


def _leader_for_s(history: list[Any], leader_address: str | None) -> float | None:
    """How long the leader this node knows has led, on this node's clock (the leader balancer's
    hold: rcq.server.leader.leader_balance); None without a leader."""
    if leader_address is None or not history or history[-1][1] != leader_address:
        return None
    return round(max(0.0, time.time() - float(history[-1][0])), 3)


# What /v1/cluster tells a principal without admin: enough to find and follow the leader.
CLUSTER_PUBLIC_KEYS = ("node_id", "url", "role", "term", "leader_id", "leader_url", "serving", "peers")


async def cluster(request: web.Request) -> web.Response:
    status = cluster_status(request.app)
    if not principal_of(request).admin:
        status = {key: status[key] for key in CLUSTER_PUBLIC_KEYS}
        status["peers"] = [{"node_id": p["node_id"], "url": p["url"]} for p in status["peers"]]
    return json_response(status)


async def digest_body(app: web.Application) -> dict[str, Any]:
    """GET /v1/cluster/digest of this process."""
    # Hashed off the apply path (a forked child on a Raft node): the state is O(items).
    digest, applied = await app[REPLICATOR].digest()
    return {"node_id": app[CONFIG].node_id, "digest": digest, "applied_index": applied}


async def request_snapshot(request: web.Request) -> web.Response:
    """Ask this node to snapshot its state and compact its log now (operators, benchmarks)."""
    request.app[REPLICATOR].request_snapshot()
    return json_response({"node_id": request.app[CONFIG].node_id, "snapshot_requested": True}, status=202)


def _commit_latency(app: web.Application) -> dict[str, float]:
    """Sum and count of this node's commit latencies (as leader): a mean per interval from two reads.
    From the histogram itself: the registry's get_sample_value collects every metric (the process
    collector reads /proc), ~0.3 ms of CPU each, on every /readyz, /healthz and /v1/cluster."""
    latencies = app[METRICS].commit_seconds
    return {"sum_s": latencies.sum, "count": float(latencies.count)}


def _queue_rows(app: web.Application) -> list[dict[str, Any]]:
    """The deepest queues (at most QUEUES_SHOWN_MAX) for the status page."""
    manager = app[MANAGER]
    rows = app[REPLICATOR].read(lambda sm: sm.deepest_queues(QUEUES_SHOWN_MAX))
    return [{"queue": name, **stats, "locked": manager.locked_count(name)} for name, stats in rows]


OVERVIEW_SURVEY_AGE_S = 1.0  # the status page's partitions: a survey at most this old


async def _partition_rows(app: web.Application) -> list[dict[str, Any]]:
    """Every partition but p0, surveyed within OVERVIEW_SURVEY_AGE_S (none in a partition process,
    or without partitions)."""
    controller = app.get(PARTITION_CONTROLLER)
    if controller is None:
        return []
    return [{"name": v.name, "number": v.number, "members": list(v.members), "leader_id": v.leader,
             "raft_members": list(v.raft_members) if v.raft_members is not None else None, "lag": v.lag(),
             "items": v.items, "settled": v.settled()} for v in await controller.survey(OVERVIEW_SURVEY_AGE_S)]


async def openapi(request: web.Request) -> web.Response:
    """The OpenAPI 3.1 description of this API (rcq.server.http.openapi), with this node as its server."""
    return json_response(openapi_spec(request.app[CONFIG].url))


async def asyncapi(request: web.Request) -> web.Response:
    """The AsyncAPI 3.0 description of the session channel (rcq.server.http.asyncapi), with this node's limits."""
    return json_response(asyncapi_spec(request.app[CONFIG]))


async def healthz(request: web.Request) -> web.Response:
    # The version and the highest feature level read: what a leader asks before raising the level
    # or adding a member (rcq.server.leader.feature_levels), and the identity of the cluster whose
    # state it holds (None: a fresh node, or a level-1 cluster): a leader refuses to add a node of
    # another cluster (rcq.server.http.membership_routes).
    # Where the node serves partitions (docs/partitions.md), when it does: the leader records it.
    config = request.app[CONFIG]
    return json_response({"ok": True, "node_id": config.node_id, "version": rcq_version(),
                          "feature_level_max": level_max_read(config.test_feature_level_max),
                          "cluster_id": request.app[REPLICATOR].read(lambda sm: sm.cluster_id),
                          "partition": config.partition_name or P0,
                          **({"partitions": sorted(request.app[PARTITION_HOST].status())}
                             if PARTITION_HOST in request.app else {}),
                          **({"partition_ports": partition_ports_of(config)} if config.serves_partitions else {})})


def add_routes(app: web.Application) -> None:
    overview = Overview(own_status=lambda: cluster_status(app), queues=lambda: _queue_rows(app),
                        peer_tls=peer_context(app[CONFIG]), dial_url=app[CONFIG].peer_url,
                        partitions=lambda: _partition_rows(app))
    app.on_cleanup.append(overview.close)
    app.router.add_get("/", page)
    app.router.add_get("/v1/cluster/overview", admin_only("read the cluster overview", overview.handle))
    app.router.add_get("/v1/openapi.json", openapi)
    app.router.add_get("/v1/asyncapi.json", asyncapi)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/v1/cluster", cluster)
    app.router.add_post("/v1/admin/snapshot", admin_only("request a snapshot", request_snapshot))
    app.router.add_put(STORAGE_BUDGET_PATH, admin_only("set a partition's storage allowance", storage_budget))
    add_backup_routes(app)
