"""The partition routes (docs/partitions.md): ``GET /v1/cluster/partitions`` on any node for any
valid token, ``POST /v1/cluster/partitions`` (admin) on p0's serving leader (others redirect),
and the :class:`PartitionRouter`: what a request that belongs to another partition is answered.

A request another partition must run raises ``WrongPartition`` (rcq.server.leader.routing). At a
node's own port (p0's process) it is forwarded to that partition's leader under the rules of
rcq.server.http.forwarding, so plain HTTP to any node reaches every partition, a request a p0
follower forwarded to p0's leader included (another group: it cannot loop); a request that asks
for the redirect (``Rcq-Redirect: 1``, the Python client) is answered ``421 wrong_partition``
instead, naming the partition and, when known, its leader's URL. A partition process knows no
directory: it always answers the 421.

A listing names each partition's leader as its members' processes see it: each member of a
partition other than p0 is asked its ``/readyz`` (no token: who leads is not refused to a caller
whose token a process has not read yet), at the address this node reaches it by
(rcq.server.partitions.ports.reach_url); ``leader_id`` and ``leader_url`` are null while none of
them names one.

Must not import: pysyncobj, lmdb.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from rcq.errors import NoLeader, PartitionNotFound, Unavailable, WrongPartition
from rcq.names import P0
from rcq.server.http.cluster_routes import cluster_status, digest_body, storage_body
from rcq.server.http.forwarding import Forwarder
from rcq.server.http.handlers import (
    CONFIG,
    MANAGER,
    METRICS,
    REPLICATOR,
    admin_only,
    error_response,
    json_response,
    read_model,
)
from rcq.server.http.metrics import CONTENT_TYPE
from rcq.server.http.metrics_merge import merged
from rcq.server.http.models import CreatePartitionRequest, QueueSettingsRequest
from rcq.server.http.partition_asker import FORWARD_TIMEOUT_S, LEADER_ASKER, LeaderAsker
from rcq.server.leader.partition_directory import PartitionDirectory
from rcq.server.leader.placement import PLACEMENT_HEADER, placement_token
from rcq.server.partitions.ports import member_ports, partition_urls
from rcq.server.raft.protocol import known_nodes

PARTITION_DIRECTORY = web.AppKey("partition_directory", PartitionDirectory)
LEADER_REMEMBERED_S = 2.0  # how long a partition's leader, once found, is dialled without asking again


def member_urls(app: web.Application, partition: str) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """``partition``'s directory row, and (node id, the URL this node reaches it at) per member."""
    row = next((r for r in app[PARTITION_DIRECTORY].listing(partition)), None)
    if row is None:
        raise PartitionNotFound(f"partition {partition} is not in the directory", details={"partition": partition})
    node_ports = app[REPLICATOR].read(lambda sm: dict(sm.directory.node_ports))  # a copy, under the lock
    members = [m for m in row["members"] if m in node_ports]
    urls = partition_urls(app[CONFIG], row["name"], row["number"], [node_ports[m] for m in members])
    return row, list(zip(members, urls, strict=True))


async def find_leader(app: web.Application, partition: str) -> tuple[str, str] | None:
    """(the URL this node reaches ``partition``'s leader at, the URL it advertises), None while
    none of its members names one."""
    _row, members = member_urls(app, partition)
    leader_id, leader_url = await app[LEADER_ASKER].leader([url for _, url in members])
    reach = next((url for member, url in members if member == leader_id), None)
    return (reach, leader_url or reach) if reach is not None else None


def credentials(request: web.Request) -> dict[str, str]:
    authorization = request.headers.get("Authorization")
    return {"Authorization": authorization} if authorization else {}


async def at_partition_leader(app: web.Application, partition: str,
                              send: Callable[[str], Awaitable[tuple[int, dict[str, Any]] | None]],
                              timeout_s: float = FORWARD_TIMEOUT_S) -> tuple[int, dict[str, Any]]:
    """``send(leader_url)`` to ``partition``'s leader until it answers as the leader (not 307, 421
    or 503) or ``timeout_s`` passes (Unavailable: nothing ran); its answer."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        leader = await find_leader(app, partition)
        if leader is not None:
            answer = await send(leader[0])
            if answer is not None and answer[0] not in (307, 421, 503):
                return answer
        if asyncio.get_running_loop().time() > deadline:
            raise Unavailable(f"partition {partition} has no leader that answered within {timeout_s:g} s; "
                              "retry", details={"partition": partition})
        await asyncio.sleep(0.2)  # pace: a partition electing a leader takes about a second


async def forward_configure(request: web.Request, partition: str, queue: str, body: QueueSettingsRequest
                            ) -> tuple[int, dict[str, Any]]:
    """PUT the queue's settings to ``partition``'s leader, signed as placed there by p0 (the
    caller's credentials with it); its answer."""
    app = request.app
    headers = {PLACEMENT_HEADER: placement_token(app[CONFIG], partition, queue), **credentials(request)}
    settings = body.model_dump(exclude={"partitions"}, mode="json")
    return await at_partition_leader(app, partition, lambda leader: app[LEADER_ASKER].call(
        "PUT", f"{leader}/v1/queues/{queue}", headers, settings))


async def forward_delete(request: web.Request, partition: str, queue: str) -> tuple[int, dict[str, Any]]:
    """DELETE ``queue`` at ``partition``'s leader (the caller's credentials), then, once it is gone
    there, have p0 forget its placement; the partition's answer."""
    app = request.app
    app[MANAGER].require_serving()  # p0's leader forgets the placement: a follower forwards the whole delete
    status, body = await at_partition_leader(
        app, partition, lambda leader: app[LEADER_ASKER].call("DELETE", f"{leader}/v1/queues/{queue}", credentials(request)))
    if status == 200 or (status == 404 and (body.get("error") or {}).get("code") == "queue_not_found"):
        await app[PARTITION_DIRECTORY].forget(queue)
    return status, body


class PartitionRouter:
    """What a request raising ``WrongPartition`` is answered (see the module docstring)."""

    def __init__(self, forwarder: Forwarder) -> None:
        self._forwarder = forwarder
        self._leaders: dict[str, tuple[float, tuple[str, str]]] = {}  # partition -> (until, leader)

    async def answer(self, request: web.Request, refusal: WrongPartition) -> web.Response:
        app = request.app
        partition = str(refusal.details.get("partition") or "")
        if app[CONFIG].partition_name is not None or not partition or partition == P0:
            return error_response(refusal, request)
        try:
            leader = await self.leader(app, partition)
        except PartitionNotFound as exc:
            return error_response(exc, request)
        # A request a p0 follower forwarded here goes on to the partition's leader: another group, so
        # it cannot loop (a partition process never forwards to p0; its followers answer it a 307).
        if self._forwarder.asks_redirect(request):
            refusal.leader_url = leader[1] if leader is not None else None
            return error_response(refusal, request)
        if leader is None:
            return error_response(NoLeader(f"partition {partition} has no leader now; retry shortly",
                                           details={"partition": partition}), request)
        response = await self._forwarder.forward(request, leader[1], leader[0])
        if response.status in (307, 421, 503):  # it moved, or is electing: ask again next time
            self._leaders.pop(partition, None)
        return response

    async def leader(self, app: web.Application, partition: str) -> tuple[str, str] | None:
        """(reach URL, advertised URL) of ``partition``'s leader, remembered for LEADER_REMEMBERED_S."""
        now = asyncio.get_running_loop().time()
        remembered = self._leaders.get(partition)
        if remembered is not None and remembered[0] > now:
            return remembered[1]
        leader = await find_leader(app, partition)
        if leader is not None:
            self._leaders[partition] = (now + LEADER_REMEMBERED_S, leader)
        return leader


PARTITION_ROUTER = web.AppKey("partition_router", PartitionRouter)


async def from_other_partitions(request: web.Request, path_qs: str) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """``GET path_qs`` of each partition but p0, from its leader, with the caller's credentials:
    (partition -> answer) of those that answered, and the partitions that did not (no leader, no
    answer). Empty at once in a partition process and in a cluster without other partitions."""
    app = request.app
    if app[CONFIG].partition_name is not None:
        return {}, []
    others = [row["name"] for row in app[PARTITION_DIRECTORY].listing() if row["name"] != P0]
    if not others:
        return {}, []
    headers = credentials(request)
    router = app[PARTITION_ROUTER]

    async def ask(partition: str) -> dict[str, Any] | None:
        try:
            leader = await router.leader(app, partition)
        except PartitionNotFound:  # deleted meanwhile
            return None
        return await app[LEADER_ASKER].get(f"{leader[0]}{path_qs}", headers) if leader is not None else None

    answers = await asyncio.gather(*(ask(p) for p in others))
    answered = {p: a for p, a in zip(others, answers, strict=True) if a is not None}
    return answered, [p for p in others if p not in answered]


async def list_partitions(request: web.Request) -> web.Response:
    """Each row: ``name``, ``number``, ``members`` (node ids), ``preferred_leader``, ``urls`` (each
    member's URL for the partition as clients reach it, in the order of ``members``), ``leader_id``
    and ``leader_url`` (null while no member names a leader)."""
    app = request.app
    config = app[CONFIG]
    own = app[MANAGER]
    rows = app[PARTITION_DIRECTORY].listing()
    node_ports = app[REPLICATOR].read(lambda sm: dict(sm.directory.node_ports))  # a copy, under the lock
    status = cluster_status(app)  # the p0 row: this node's own view
    p0_urls = {node.node_id: node.http_url for node in known_nodes(config, app[REPLICATOR]).values()}
    p0_urls[config.node_id] = config.url

    async def with_leader(row: dict[str, Any]) -> dict[str, Any]:
        if row["name"] == P0:
            return {**row, "urls": [p0_urls[m] for m in row["members"] if m in p0_urls],
                    "leader_id": status["leader_id"], "leader_url": status["leader_url"],
                    "serving": own.serving if status["role"] == "leader" else None}
        members = [m for m in row["members"] if m in node_ports]
        urls = partition_urls(config, row["name"], row["number"], [node_ports[m] for m in members])
        leader_id, leader_url = await app[LEADER_ASKER].leader(urls)
        advertised = [member_ports(node_ports[m]).advertised(row["name"], row["number"])[0] for m in members]
        return {**row, "urls": advertised, "leader_id": leader_id, "leader_url": leader_url}

    return json_response({"partitions": list(await asyncio.gather(*(with_leader(row) for row in rows)))})


def local_partitions(app: web.Application) -> list[tuple[str, str]]:
    """(partition, the URL of its process on this node) of each partition but p0 this node runs
    (none in a partition process)."""
    config = app[CONFIG]
    local: list[tuple[str, str]] = []
    if config.partition_name is None:
        for row in app[PARTITION_DIRECTORY].listing():
            if row["name"] != P0 and config.node_id in row["members"]:
                local += [(row["name"], url) for member, url in member_urls(app, row["name"])[1]
                          if member == config.node_id]
    return local


async def from_local_partitions(request: web.Request, path: str) -> dict[str, dict[str, Any] | None]:
    """``GET path`` of each of this node's partition processes: partition -> answer (None: none)."""
    local = local_partitions(request.app)
    answers = await asyncio.gather(*(request.app[LEADER_ASKER].get(f"{url}{path}", credentials(request))
                                     for _, url in local))
    return {name: answer for (name, _), answer in zip(local, answers, strict=True)}


async def node_digest(request: web.Request) -> web.Response:
    """GET /v1/cluster/digest: this process's state digest; at a node's own port also each of its
    partition processes' (``partitions``: name -> its answer, null when it did not answer)."""
    own = await digest_body(request.app)
    partitions = await from_local_partitions(request, "/v1/cluster/digest")
    return json_response({**own, **({"partitions": partitions} if partitions else {})})


async def node_storage(request: web.Request) -> web.Response:
    """GET /v1/cluster/storage: this process's figures; at a node's own port also each of its
    partition processes' (``partitions``), each with its own budget (docs/partitions.md)."""
    partitions = await from_local_partitions(request, "/v1/cluster/storage")
    return json_response({**storage_body(request.app), **({"partitions": partitions} if partitions else {})})


async def node_metrics(request: web.Request) -> web.Response:
    """GET /metrics: this process's series, and at a node's own port its partition processes'
    (rcq.server.http.metrics_merge)."""
    app = request.app
    own = list(app[METRICS].registry.collect())
    local = local_partitions(app)
    texts = await asyncio.gather(*(app[LEADER_ASKER].text(f"{url}/metrics", credentials(request))
                                   for _, url in local))
    others = {name: text for (name, _), text in zip(local, texts, strict=True) if text is not None}
    body = merged(own, others, len(local) - len(others))
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


async def create_partition(request: web.Request) -> web.Response:
    """POST /v1/cluster/partitions: ``201`` once the partition is in the directory, its leader
    null (its members start its processes within a second; the client and the CLI wait for the
    leader, listing it)."""
    body = await read_model(request, CreatePartitionRequest)
    request.app[MANAGER].require_serving()
    created = await request.app[PARTITION_DIRECTORY].create(body.name, body.replicas, body.nodes)
    return json_response({**created, "leader_id": None, "leader_url": None}, status=201)


async def delete_partition(request: web.Request) -> web.Response:
    """DELETE /v1/cluster/partitions/{name}: a partition that holds no queue (docs/partitions.md)."""
    request.app[MANAGER].require_serving()
    return json_response(await request.app[PARTITION_DIRECTORY].delete(request.match_info["name"]))


def add_partition_routes(app: web.Application, peer_tls: ssl.SSLContext | None, forwarder: Forwarder) -> None:
    asker = LeaderAsker(peer_tls)
    app[LEADER_ASKER] = asker
    app[PARTITION_ROUTER] = PartitionRouter(forwarder)
    app.on_cleanup.append(asker.close)
    app.router.add_get("/v1/cluster/partitions", list_partitions)
    app.router.add_get("/metrics", admin_only("read metrics", node_metrics))
    app.router.add_get("/v1/cluster/digest", admin_only("read the state digest", node_digest))
    app.router.add_get("/v1/cluster/storage", admin_only("read storage figures", node_storage))
    app.router.add_post("/v1/cluster/partitions", admin_only("create a partition", create_partition))
    app.router.add_delete("/v1/cluster/partitions/{name}", admin_only("delete a partition", delete_partition))
