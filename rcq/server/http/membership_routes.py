"""The membership routes (admin only): list members, add, remove, hand leadership over.

``GET /v1/cluster/members`` answers on any node (its own view); the changes answer on the
serving leader only (others redirect). What a change does and checks is
:class:`rcq.server.leader.membership.Membership`; this module adds HTTP, and the health probe of
a node to be added (``GET {url}/healthz`` must answer with its node id, read the active feature
level, and state no cluster identity or this cluster's: a node of another cluster, a restored
one's or the old one's, must never join: docs/backup.md).

Must not import: pysyncobj, lmdb.
"""

from __future__ import annotations

import ssl
from collections.abc import Awaitable, Callable

import aiohttp
from aiohttp import web

from rcq.server.core.features import LEVEL_BASE
from rcq.server.http.handlers import admin_only, json_response, read_model
from rcq.server.http.models import AddMemberRequest, TransferLeadershipRequest
from rcq.server.leader.membership import Membership

PROBE_TIMEOUT_S = 3.0
MEMBERSHIP = web.AppKey("membership", Membership)

def make_probe(peer_tls: ssl.SSLContext | None, active_level: Callable[[], int],
               cluster_id: Callable[[], str | None] = lambda: None) -> Callable[[str, str], Awaitable[str | None]]:
    """A probe: None when ``url``'s /healthz answers as ``node_id``, reads the cluster's active
    feature level and states no identity or ``cluster_id()``, else what went wrong (a node that
    cannot read the level, or holds another cluster's state, must not join)."""

    async def probe(url: str, node_id: str) -> str | None:
        connector = aiohttp.TCPConnector(ssl=peer_tls if peer_tls is not None else True)
        try:
            async with aiohttp.ClientSession(connector=connector) as session, session.get(
                    f"{url.rstrip('/')}/healthz", timeout=aiohttp.ClientTimeout(total=PROBE_TIMEOUT_S)) as response:
                if response.status != 200:
                    return f"/healthz answered HTTP {response.status}"
                body = await response.json()
        except (aiohttp.ClientError, TimeoutError, ValueError, ssl.SSLError) as exc:
            return f"/healthz did not answer ({type(exc).__name__}: {exc})"
        answered = body.get("node_id") if isinstance(body, dict) else None
        if answered != node_id:
            return f"the node there is {answered!r}, not {node_id!r}"
        level_max, active = body.get("feature_level_max", LEVEL_BASE), active_level()  # rcq 0.1 states none
        if not isinstance(level_max, int) or level_max < active:
            return (f"it runs rcq {body.get('version') or '0.1'}, which reads feature levels up to {level_max}; "
                    f"the cluster runs at {active} (docs/upgrades.md)")
        theirs, ours = body.get("cluster_id"), cluster_id()  # a fresh node (or rcq 0.1) states none
        if theirs is not None and theirs != ours:
            return (f"it holds the state of another cluster ({theirs}; this one is {ours or 'without identity'}): "
                    "a node of another cluster, such as one restored from a backup, never joins; give it an "
                    "empty data directory (docs/backup.md)")
        return None

    return probe


def add_routes(app: web.Application) -> None:
    async def members(request: web.Request) -> web.Response:
        membership = request.app[MEMBERSHIP]
        return json_response({"leader_id": membership.leader_id(),
                              "members": [m.as_dict() for m in membership.members()]})

    async def add_member(request: web.Request) -> web.Response:
        body = await read_model(request, AddMemberRequest)
        answer = await request.app[MEMBERSHIP].add(body.node_id, body.raft_address, body.url,
                                                   body.catch_up_timeout_s)
        return json_response(answer)

    async def remove_member(request: web.Request) -> web.Response:
        return json_response(await request.app[MEMBERSHIP].remove(request.match_info["node_id"]))

    async def transfer_leadership(request: web.Request) -> web.Response:
        body = await read_model(request, TransferLeadershipRequest)
        return json_response(await request.app[MEMBERSHIP].transfer_leadership(body.node_id))

    app.router.add_get("/v1/cluster/members", admin_only("list the members", members))
    app.router.add_post("/v1/cluster/members", admin_only("add a member", add_member))
    app.router.add_delete("/v1/cluster/members/{node_id}", admin_only("remove a member", remove_member))
    app.router.add_post("/v1/cluster/leadership", admin_only("hand leadership over", transfer_leadership))
