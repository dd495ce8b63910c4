"""The partitions' administration verbs of :class:`rcq.client.RcqClient` (docs/partitions.md):
listing, creating and deleting partitions, their members, their leaders and their balance.

Must not import: rcq.server, pysyncobj, lmdb (``pip install rcq`` has no server).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from typing import Any

from rcq.client.retry import MEMBERSHIP, Request
from rcq.client.transport import Transport

# How long a membership change or a leadership hand-over may take the server (a Raft commit, an
# election) beyond any wait asked for: the attempt's timeout grows by that, and it is not abandoned
# for another leader (which would make its outcome unknown) before.
MEMBERSHIP_CHANGE_S = 10.0
MEMBERSHIP_CHANGE_MS = int(MEMBERSHIP_CHANGE_S * 1000)
PARTITIONS_PATH = "/v1/cluster/partitions"
NODE_PARTITIONS_MAX = 16  # a node is a member of at most this many partitions (docs/limits.md)
PARTITION_LEADER_WAIT_S = 30.0  # create_partition waits this long for the new partition's leader


def waited_ms(timeout_s: float) -> int:
    """How long the server may hold a request that waits ``timeout_s`` for a change, and then some."""
    return math.ceil((timeout_s + MEMBERSHIP_CHANGE_S) * 1000)


class PartitionAdmin:
    """The partitions' verbs, on the client's transport."""

    _transport: Transport

    async def partitions(self) -> list[dict[str, Any]]:
        """The cluster's partitions (docs/partitions.md), p0 first: each has ``name``, ``members``
        (node ids), ``urls`` (each member's URL for it), ``leader_id`` and ``leader_url`` (None
        while it has no leader). Any node answers, for any valid token. The client routes by it
        from then on (a spread queue's one-request verbs go round its fragments)."""
        answer = await self._transport.request(Request("GET", PARTITIONS_PATH))
        rows = list(answer["partitions"])
        self._transport.routes.remember(rows)
        return rows

    async def create_partition(self, name: str, replicas: int | None = None, nodes: Sequence[str] | None = None,
                               *, leader_wait_s: float = PARTITION_LEADER_WAIT_S) -> dict[str, Any]:
        """Create partition ``name`` (docs/partitions.md) on ``nodes``, or on ``replicas`` nodes
        (default 3) with the fewest partitions; answers its listing entry once it has a leader, or
        after ``leader_wait_s`` with ``leader_id`` None. Raises PartitionExists,
        NodeHasNoPartitionPorts, PartitionPortsExhausted, FeatureLevelRequired. Needs an admin token."""
        body: dict[str, Any] = {"name": name}
        if replicas is not None:
            body["replicas"] = replicas
        if nodes is not None:
            body["nodes"] = list(nodes)
        created = dict(await self._transport.request(Request("POST", PARTITIONS_PATH, body, MEMBERSHIP)))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + leader_wait_s
        while True:
            row = next((r for r in await self.partitions() if r["name"] == name), None)
            if row is not None and (row.get("leader_id") or loop.time() >= deadline):
                return row
            if row is None and loop.time() >= deadline:
                return created
            await asyncio.sleep(0.2)  # pace: its members start its processes, which elect in about a second

    async def delete_partition(self, name: str) -> dict[str, Any]:
        """Delete partition ``name``, which must hold no queue (PartitionNotEmpty names them);
        its members stop its processes and remove its data. Needs an admin token."""
        return dict(await self._transport.request(Request("DELETE", f"{PARTITIONS_PATH}/{name}", None, MEMBERSHIP)))

    async def add_partition_member(self, name: str, node_id: str, *, timeout_s: float = 120.0) -> dict[str, Any]:
        """Make ``node_id`` a member of partition ``name``: p0's leader records it, the node starts
        the partition's process, and the partition's leader adds it and waits for it to catch up.
        Answers ``members``, ``raft_members``, ``leader_id``, ``lag`` and ``settled`` (False after
        ``timeout_s``, 0 to 600: the change goes on). Raises MemberExists, PartitionNotFound,
        NodePartitionsFull, NodeHasNoPartitionPorts. Needs an admin token."""
        return dict(await self._transport.request(Request(
            "POST", f"{PARTITIONS_PATH}/{name}/members", {"node_id": node_id, "timeout_s": timeout_s}, MEMBERSHIP,
            wait_ms=waited_ms(timeout_s))))

    async def remove_partition_member(self, name: str, node_id: str, *, timeout_s: float = 120.0) -> dict[str, Any]:
        """Take ``node_id`` out of partition ``name`` (its process stops, its data of it is removed);
        answers as :meth:`add_partition_member`. Raises MemberNotFound, InvalidRequest (its only
        member). Needs an admin token."""
        return dict(await self._transport.request(Request(
            "DELETE", f"{PARTITIONS_PATH}/{name}/members/{node_id}?timeout_s={timeout_s:g}", None, MEMBERSHIP,
            wait_ms=waited_ms(timeout_s))))

    async def replace_partition_member(self, name: str, node_id: str, by: str | None = None, *,
                                       timeout_s: float = 120.0) -> dict[str, Any]:
        """Give ``node_id``'s place in partition ``name`` to ``by`` (None: the node with the fewest
        partitions that can take it): added first, caught up, then ``node_id`` removed. Answers as
        :meth:`add_partition_member`, with ``replaced``, ``by`` and ``step`` ("done", or "adding"
        when the new member had not caught up within ``timeout_s``). Needs an admin token."""
        return dict(await self._transport.request(Request(
            "POST", f"{PARTITIONS_PATH}/{name}/members/{node_id}/replace", {"node_id": by, "timeout_s": timeout_s},
            MEMBERSHIP, wait_ms=waited_ms(2 * timeout_s))))

    async def drain_node(self, node_id: str, *, timeout_s: float = 120.0) -> dict[str, Any]:
        """Move every partition replica of ``node_id`` to other nodes, one partition after the other
        (before the node is retired: docs/operations.md). Answers ``moved`` (one replace answer
        each), ``partitions_left`` and ``drained``. Needs an admin token."""
        # one replace after the other: the answer may take each one's two waits
        return dict(await self._transport.request(Request(
            "POST", f"/v1/cluster/nodes/{node_id}/drain", {"timeout_s": timeout_s}, MEMBERSHIP,
            wait_ms=waited_ms(2 * timeout_s * NODE_PARTITIONS_MAX))))

    async def transfer_partition_leadership(self, name: str, node_id: str | None = None) -> dict[str, Any]:
        """Hand partition ``name``'s leadership to member ``node_id`` (None: its most caught-up
        follower); answers ``leader_id`` and ``previous_leader_id`` once the new leader is seen.
        The balancer may move it again later (docs/partitions.md). Needs an admin token."""
        return dict(await self._transport.request(Request(
            "POST", f"{PARTITIONS_PATH}/{name}/leadership", {"node_id": node_id}, MEMBERSHIP,
            wait_ms=MEMBERSHIP_CHANGE_MS + 15_000)))

    async def leader_balance(self) -> dict[str, Any]:
        """Leaders per node, each partition's leader and lag, and the balancer's counts
        (docs/partitions.md, "Leaders spread"). Needs an admin token."""
        return dict(await self._transport.request(Request("GET", "/v1/cluster/balance")))

    async def rebalance(self) -> dict[str, Any]:
        """Move partition leaders now until each node leads about as many as the others: answers
        the ``moves`` made and ``leaders_per_node`` after. Needs an admin token."""
        return dict(await self._transport.request(Request("POST", "/v1/cluster/rebalance", {}, MEMBERSHIP,
                                                          wait_ms=waited_ms(120.0))))
