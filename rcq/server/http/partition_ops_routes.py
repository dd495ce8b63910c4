"""Operating partitions (docs/partitions.md; procedures in docs/operations.md), all admin:

* ``GET /v1/cluster/balance``: leaders per node, each partition's leader, Raft members and lag
  (surveyed as it answers, on any node), and the balancer's counts (p0's leader's);
* ``POST /v1/cluster/rebalance``: move leaders now until balanced (``rcq cluster rebalance``);
* ``POST /v1/cluster/partitions/{name}/leadership``: one partition's leader to a member
  (``rcq partition transfer-leader``), as the balancer moves them;
* ``POST /v1/cluster/partitions/{name}/members``, ``DELETE .../members/{node_id}`` and
  ``POST .../members/{node_id}/replace``: a partition's members, changed in the directory, then
  in its Raft group by p0's controller, one node at a time; each answers once the group matches
  and every member caught up (``settled``), or at its ``timeout_s`` (``settled: false``: the
  controller goes on);
* ``POST /v1/cluster/nodes/{node_id}/drain``: each partition the node is a member of has its
  place taken by another node (``rcq node drain``), one partition after the other.

Every change runs on p0's serving leader (others forward or redirect, as for every change).

Must not import: pysyncobj, lmdb.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from rcq.errors import InvalidRequest, MemberExists, MemberNotFound, Unavailable
from rcq.names import P0
from rcq.server.http.handlers import MANAGER, PARTITION_CONTROLLER, admin_only, json_response, read_model
from rcq.server.http.models import (
    DrainNodeRequest,
    PartitionMemberRequest,
    ReplaceMemberRequest,
    TransferLeadershipRequest,
)
from rcq.server.http.partition_routes import PARTITION_DIRECTORY
from rcq.server.leader.partition_controller import PartitionController, PartitionView

REBALANCE_TIMEOUT_S = 120.0


def view_body(view: PartitionView | None, members: list[str]) -> dict[str, Any]:
    if view is None:
        return {"members": members, "raft_members": None, "leader_id": None, "lag": {}, "settled": False}
    return {"members": list(view.members), "raft_members": list(view.raft_members or []) or None,
            "leader_id": view.leader, "lag": view.lag(), "settled": view.settled()}


async def _settle(request: web.Request, name: str, timeout_s: float) -> dict[str, Any]:
    view = await request.app[PARTITION_CONTROLLER].wait_settled(name, timeout_s)
    return {"partition": name, **view_body(view, request.app[PARTITION_DIRECTORY].members_of(name))}


async def balance(request: web.Request) -> web.Response:
    controller = request.app[PARTITION_CONTROLLER]
    views = await controller.survey()  # surveyed now: the controller's last may be seconds old
    partitions = [{"name": v.name, "leader_id": v.leader, "preferred_leader": v.preferred_leader,
                   "leader_for_s": v.leader_for_s, **view_body(v, list(v.members))} for v in views]
    return json_response({**controller.balance_status(), "partitions": partitions})


async def rebalance(request: web.Request) -> web.Response:
    request.app[MANAGER].require_serving()
    return json_response(await request.app[PARTITION_CONTROLLER].rebalance(REBALANCE_TIMEOUT_S))


async def move_leader(request: web.Request) -> web.Response:
    """Hand partition ``name``'s leadership to ``node_id`` (null: its most caught-up follower),
    through its leader, as the balancer does; answers once the survey names the new leader."""
    body = await read_model(request, TransferLeadershipRequest)
    request.app[MANAGER].require_serving()
    name = request.match_info["name"]
    controller = request.app[PARTITION_CONTROLLER]
    members = request.app[PARTITION_DIRECTORY].members_of(name)
    if body.node_id is not None and body.node_id not in members:
        raise MemberNotFound(f"{body.node_id} is not a member of partition {name}",
                             details={"partition": name, "node_id": body.node_id})
    view = next((v for v in await controller.survey() if v.name == name), None)
    if view is None or view.leader is None:
        raise Unavailable(f"partition {name} has no leader now; retry shortly", details={"partition": name})
    previous = view.leader
    if body.node_id != previous:
        problem = await controller.transfer(view, body.node_id)
        if problem is not None:
            raise Unavailable(f"partition {name}'s leader did not hand over: {problem}; retry",
                              details={"partition": name})
    return json_response({"partition": name, "leader_id": (await controller.leader_of(name)) or None,
                          "previous_leader_id": previous})


async def add_member(request: web.Request) -> web.Response:
    body = await read_model(request, PartitionMemberRequest)
    request.app[MANAGER].require_serving()
    name, directory = request.match_info["name"], request.app[PARTITION_DIRECTORY]
    members = directory.members_of(name)
    if body.node_id in members:
        raise MemberExists(f"{body.node_id} is a member of partition {name} already",
                           details={"partition": name, "node_id": body.node_id})
    await directory.set_members(name, [*members, body.node_id])
    return json_response(await _settle(request, name, body.timeout_s))


async def remove_member(request: web.Request) -> web.Response:
    request.app[MANAGER].require_serving()
    name, node_id = request.match_info["name"], request.match_info["node_id"]
    timeout_s = _timeout(request)
    directory = request.app[PARTITION_DIRECTORY]
    members = directory.members_of(name)
    if node_id not in members:
        raise MemberNotFound(f"{node_id} is not a member of partition {name}",
                             details={"partition": name, "node_id": node_id})
    if members == [node_id]:
        raise InvalidRequest(f"{node_id} is partition {name}'s only member: add another first, or delete the "
                             "partition", details={"partition": name, "node_id": node_id})
    await directory.set_members(name, [m for m in members if m != node_id])
    return json_response(await _settle(request, name, timeout_s))


async def replace_member(request: web.Request) -> web.Response:
    body = await read_model(request, ReplaceMemberRequest)
    request.app[MANAGER].require_serving()
    name, leaving = request.match_info["name"], request.match_info["node_id"]
    return json_response(await _replace(request, name, leaving, body.node_id, body.timeout_s))


async def _replace(request: web.Request, name: str, leaving: str, joining: str | None,
                   timeout_s: float) -> dict[str, Any]:
    """Add the new member, wait for it, then remove the old one: the partition keeps its strength."""
    directory = request.app[PARTITION_DIRECTORY]
    members = directory.members_of(name)
    if leaving not in members:
        raise MemberNotFound(f"{leaving} is not a member of partition {name}",
                             details={"partition": name, "node_id": leaving})
    joining = joining or directory.replacement(name, leaving)
    if joining in members:
        raise MemberExists(f"{joining} is a member of partition {name} already",
                           details={"partition": name, "node_id": joining})
    await directory.set_members(name, [*members, joining])
    added = await _settle(request, name, timeout_s)
    if not added["settled"]:
        return {**added, "replaced": leaving, "by": joining, "step": "adding"}
    await directory.set_members(name, [m for m in directory.members_of(name) if m != leaving])
    return {**await _settle(request, name, timeout_s), "replaced": leaving, "by": joining, "step": "done"}


async def drain_node(request: web.Request) -> web.Response:
    body = await read_model(request, DrainNodeRequest)
    request.app[MANAGER].require_serving()
    node_id = request.match_info["node_id"]
    directory = request.app[PARTITION_DIRECTORY]
    moved: list[dict[str, Any]] = []
    for row in directory.listing():
        if row["name"] == P0 or node_id not in row["members"]:
            continue
        answer = await _replace(request, row["name"], node_id, None, body.timeout_s)
        moved.append(answer)
        if answer["step"] != "done" or not answer["settled"]:
            break
    left = [row["name"] for row in directory.listing() if row["name"] != P0 and node_id in row["members"]]
    return json_response({"node_id": node_id, "moved": moved, "partitions_left": left, "drained": not left})


def _timeout(request: web.Request) -> float:
    raw = request.query.get("timeout_s", "120")
    try:
        value = float(raw)
    except ValueError:
        raise InvalidRequest(f"timeout_s {raw!r} is not a number") from None
    if not 0 <= value <= 600:
        raise InvalidRequest("timeout_s is 0 to 600")
    return value


def add_routes(app: web.Application, controller: PartitionController) -> None:
    app[PARTITION_CONTROLLER] = controller
    app.router.add_get("/v1/cluster/balance", admin_only("read the leader balance", balance))
    app.router.add_post("/v1/cluster/rebalance", admin_only("rebalance partition leaders", rebalance))
    app.router.add_post("/v1/cluster/partitions/{name}/leadership", admin_only("move a partition's leader",
                                                                                move_leader))
    app.router.add_post("/v1/cluster/partitions/{name}/members", admin_only("add a partition member", add_member))
    app.router.add_delete("/v1/cluster/partitions/{name}/members/{node_id}",
                          admin_only("remove a partition member", remove_member))
    app.router.add_post("/v1/cluster/partitions/{name}/members/{node_id}/replace",
                        admin_only("replace a partition member", replace_member))
    app.router.add_post("/v1/cluster/nodes/{node_id}/drain", admin_only("drain a node", drain_node))
