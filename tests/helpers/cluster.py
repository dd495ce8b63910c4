"""Real multi-process clusters for the tests: one started with a serving leader, a queue of one's own, a drain.

Every cluster the suite starts (here or with :class:`LocalCluster` directly) has its node logs
checked after each test (:mod:`tests.helpers.node_logs`); the failure report of a test that used
one shows the tail of each node's log (the suite's report hook, in tests/conftest.py, adds it).
``healed``: a cluster a test may have broken, whole again.

Must not import: a test module or a conftest; rcq.server (nodes are separate processes).
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Iterator
from typing import Any

import aiohttp

from rcq.client import RcqClient
from rcq.errors import NodeHasNoPartitionPorts
from rcq.local.cluster import LocalCluster
from rcq.testing import async_wait_until, wait_until
from tests.helpers import CLUSTER_WAIT_S, LEADER_TIMEOUT_S


@contextlib.contextmanager
def running_cluster(nodes: int = 3, overrides: dict[str, Any] | None = None) -> Iterator[LocalCluster]:
    """A started cluster with a serving leader (its logs printed if none comes), closed after.
    Unless its level is held (``feature_level_auto: false``), also settled: the leader has raised
    the feature level and given the cluster its identity, entries of its own that would otherwise
    land in the middle of a test comparing digests. Every node has applied what the leader had
    committed by then, so each follower knows the leader (a follower that has not heard from it
    yet answers ``503 no_leader``: a fresh cluster's third node may join a second later)."""
    with LocalCluster(nodes=nodes, node_overrides=overrides or {}) as local_cluster:
        try:
            leader = local_cluster.wait_for_leader(LEADER_TIMEOUT_S)
            if (overrides or {}).get("feature_level_auto", True):
                wait_settled(local_cluster, leader)
            local_cluster.wait_for_applied(LEADER_TIMEOUT_S)
        except TimeoutError:
            print(local_cluster.dump_logs())
            raise
        yield local_cluster


def wait_settled(cluster: LocalCluster, leader: int) -> None:
    """Until node ``leader`` applied the highest feature level it reads and the cluster's identity."""
    def settled() -> bool:
        status = cluster.poll_json(cluster.url(leader) + "/v1/cluster")
        return status.get("feature_level") == status.get("feature_level_max") and bool(status.get("cluster_id"))

    wait_until(settled, LEADER_TIMEOUT_S, what="the cluster's feature level and identity")


@contextlib.contextmanager
def partitioned_cluster(partitions: int, partitions_max: int) -> Iterator[LocalCluster]:
    """A 3-node cluster with p0 ... p{partitions-1}, each led, whose leaders stay where they were
    elected (no balancer: a test's partitions keep their leaders); closed after."""
    with LocalCluster(3, partitions_max=partitions_max, node_overrides={"balance_leaders": False}) as local:
        wait_settled(local, local.wait_for_leader(LEADER_TIMEOUT_S))
        local.ensure_partitions(partitions)
        yield local


def create_partition_when_ready(client: Any, name: str, **options: Any) -> dict[str, Any]:
    """``client.create_partition(name, **options)`` (a SyncClient) once p0's leader has recorded the
    nodes' partition ports: a new cluster records them at its feature-level loop's next turn (a few
    seconds), and refuses a partition until then (``node_has_no_partition_ports``)."""
    def created() -> dict[str, Any] | None:
        try:
            return dict(client.create_partition(name, **options))
        except NodeHasNoPartitionPorts:
            return None

    return wait_until(created, LEADER_TIMEOUT_S, what=f"partition {name} created (the nodes' ports recorded)")


def healed(cluster: LocalCluster) -> LocalCluster:
    """``cluster`` with every node resumed or restarted and a serving leader found again (the
    ``healthy_cluster`` fixtures: for tests that kill, pause or stop nodes)."""
    cluster.heal()
    cluster.wait_for_leader(LEADER_TIMEOUT_S)
    return cluster


def fresh_queue(name: str = "q") -> str:
    """A queue name no other test uses: tests sharing a cluster keep out of each other's way."""
    return f"{name}-{uuid.uuid4().hex[:10]}"


async def drain_until_empty(client: RcqClient, queue: str, timeout_s: float = CLUSTER_WAIT_S) -> list[str]:
    """Dequeue and commit until the queue is empty on the leader (items locked by a commit whose
    outcome is still pending count, and are waited for); the values, decoded."""
    drained: list[str] = []

    async def empty() -> bool:
        async with client.transaction(timeout_s=30) as tx:
            drained.extend(v.decode() for v in await tx.dequeue_batch(queue, 1000))
        return await client.count(queue) == 0

    await async_wait_until(empty, timeout_s, interval_s=0.05, what=f"{queue} to drain")
    return drained


def restored_cluster(backup: Any) -> LocalCluster:
    """A new started 3-node cluster restored from the backup file ``backup``, with a leader (its
    logs printed, and it closed, if it does not come up); the caller closes it."""
    restored = LocalCluster(3)
    try:
        restored.restore_from(backup)
        restored.start()
        restored.wait_for_leader(LEADER_TIMEOUT_S)
    except BaseException:
        print(restored.dump_logs())
        restored.close()
        raise
    return restored


async def ask(method: str, url: str, body: Any = None, headers: dict[str, str] | None = None
              ) -> tuple[int, Any, dict[str, str]]:
    """(status, body decoded if JSON else bytes, headers) of one request to ``url``, no redirect followed."""
    async with aiohttp.ClientSession() as session, session.request(
            method, url, json=body, headers=headers or {}, allow_redirects=False) as response:
        raw = await response.read()
        payload = json.loads(raw) if raw and response.content_type == "application/json" else raw
        return response.status, payload, dict(response.headers)
