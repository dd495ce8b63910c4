"""The partition processes' side of p0's controller (rcq.server.leader.partition_controller): how
it surveys them and asks them to change, over HTTP.

* **Survey**: every member's ``/readyz`` (no token; 200 or 503, both with the process's status),
  at the address this node reaches it by. The leader's own answer gives the partition's Raft
  members (itself and its ``peers``), its commit index and how long it has led; each member's
  its last applied index and its storage figures (what it holds, its allowance, its node's budget:
  rcq.server.leader.storage_sharing).
* **Changes**: calls to the partition's leader signed with the cluster secret
  (rcq.server.security.cluster_calls), to the routes p0's members use for the same
  (docs/membership.md): ``POST /v1/cluster/leadership``, ``POST /v1/cluster/members`` (the new
  member's partition process must answer its ``/healthz``: its node starts it within a second
  of seeing itself a member in the directory), ``DELETE /v1/cluster/members/{node}``; and to
  every member, ``PUT /v1/cluster/storage-budget`` (its share of its node's memory budget:
  docs/partitions.md, "Memory budget").

Must not import: pysyncobj, lmdb.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from typing import Any

from aiohttp import web

from rcq.server.core.directory import Directory, Partition
from rcq.server.http.handlers import CONFIG
from rcq.server.http.partition_asker import LEADER_ASK_TIMEOUT_S, LEADER_ASKER
from rcq.server.leader.partition_controller import PartitionView
from rcq.server.leader.storage_budget import MemberStorage
from rcq.server.partitions.ports import member_ports, partition_urls
from rcq.server.security.cluster_calls import STORAGE_BUDGET_PATH

TRANSFER_TIMEOUT_S = 15.0  # a hand-over takes an election or so; refused ones answer at once
CATCH_UP_TIMEOUT_S = 60.0  # how long the partition's leader waits for a member it added to catch up
ADD_TIMEOUT_S = CATCH_UP_TIMEOUT_S + 15.0
REMOVE_TIMEOUT_S = 20.0
BUDGET_TIMEOUT_S = 5.0  # a member takes an allowance at once


class PartitionCalls:
    """``read_directory``: a copy of the directory (p0's replica, under its lock)."""

    def __init__(self, app: web.Application, read_directory: Callable[[], Directory]) -> None:
        self._app = app
        self._read_directory = read_directory

    # ------------------------------------------------------------------ survey
    async def survey(self, directory: Directory) -> list[PartitionView]:
        partitions = sorted(directory.partitions.values(), key=lambda p: p.number)
        return list(await asyncio.gather(*(self._view(directory, p) for p in partitions)))

    async def _view(self, directory: Directory, partition: Partition) -> PartitionView:
        asker = self._app[LEADER_ASKER]
        members = [m for m in partition.members if m in directory.node_ports]
        urls = partition_urls(self._app[CONFIG], partition.name, partition.number,
                              [directory.node_ports[m] for m in members])
        answers = await asyncio.gather(*(asker.call("GET", f"{url}/readyz", {}, None, LEADER_ASK_TIMEOUT_S)
                                         for url in urls))
        bodies: dict[str, dict[str, Any]] = {m: a[1] for m, a in zip(members, answers, strict=True)
                                             if a is not None and a[1].get("node_id") == m}
        applied = {m: _int(bodies[m].get("last_applied")) if m in bodies else None for m in partition.members}
        leader = next((m for m, body in bodies.items() if body.get("role") == "leader"), None)
        storage = {m: MemberStorage(_int(body.get("storage_bytes")), _int(body.get("storage_bytes_max")),
                                    _int(body.get("node_storage_bytes_max"))) for m, body in bodies.items()}
        view = PartitionView(partition.name, partition.number, partition.members, partition.preferred_leader,
                             applied=applied, urls=dict(zip(members, urls, strict=True)), storage=storage)
        if leader is None:
            return view
        own = bodies[leader]
        peers = [p.get("node_id") for p in own.get("peers") or [] if isinstance(p, dict)]
        raft_members = tuple(sorted({leader, *(p for p in peers if isinstance(p, str))}))
        for_s = own.get("leader_for_s")
        return dataclasses.replace(view, leader=leader, leader_url=urls[members.index(leader)],
                                   leader_for_s=float(for_s) if isinstance(for_s, int | float) else None,
                                   raft_members=raft_members, commit_index=_int(own.get("commit_index")),
                                   items=_int(own.get("items")))

    # ------------------------------------------------------------------ changes
    async def _call(self, view: PartitionView, method: str, path: str, body: dict[str, Any] | None,
                    timeout_s: float, done: tuple[int, ...] = (200,), url: str | None = None) -> str | None:
        """The call to ``view``'s leader (or the process at ``url``); None when it answered ``done``,
        else why not."""
        url = url or view.leader_url
        if url is None:
            return "it has no leader"
        answered = await self._app[LEADER_ASKER].cluster_call(method, url, path, body,
                                                               self._app[CONFIG].cluster_secret, timeout_s)
        if answered is None:
            return f"{'its leader' if url == view.leader_url else 'it'} did not answer within {timeout_s:.0f} s"
        status, answer = answered
        if status in done:
            return None
        error = answer.get("error")
        error = error if isinstance(error, dict) else {}
        return f"HTTP {status} {error.get('code', '')}: {error.get('message', '')}".strip()

    async def transfer(self, view: PartitionView, to_node: str | None) -> str | None:
        return await self._call(view, "POST", "/v1/cluster/leadership", {"node_id": to_node}, TRANSFER_TIMEOUT_S)

    async def add_member(self, view: PartitionView, node_id: str) -> str | None:
        directory = self._read_directory()
        entry = directory.node_ports.get(node_id)
        if entry is None:
            return f"no ports are recorded for {node_id}"
        url, raft_address = member_ports(entry).advertised(view.name, view.number)
        return await self._call(view, "POST", "/v1/cluster/members",
                                {"node_id": node_id, "raft_address": raft_address, "url": url,
                                 "catch_up_timeout_s": CATCH_UP_TIMEOUT_S}, ADD_TIMEOUT_S)

    async def set_storage_budget(self, view: PartitionView, node_id: str, storage_bytes_max: int) -> str | None:
        url = view.urls.get(node_id)
        if url is None:
            return f"no address of {node_id}'s process is known"
        return await self._call(view, "PUT", STORAGE_BUDGET_PATH, {"storage_bytes_max": storage_bytes_max},
                                BUDGET_TIMEOUT_S, url=url)

    async def remove_member(self, view: PartitionView, node_id: str) -> str | None:
        problem = await self._call(view, "DELETE", f"/v1/cluster/members/{node_id}", None, REMOVE_TIMEOUT_S)
        if problem is not None and problem.startswith("HTTP 307"):
            return f"{node_id} led the partition: it handed leadership over, and is removed by the next leader"
        return problem


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None

