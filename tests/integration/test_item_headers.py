"""Item headers on a real 3-node cluster: refused at level 1, and once the level is raised, kept
through a leader's failover and a restart of every node from its snapshot."""

from __future__ import annotations

import asyncio

import pytest

from rcq.client import FeatureLevelRequired, RcqClient
from rcq.testing import async_wait_until
from tests.helpers import CLUSTER_WAIT_S, LEADER_TIMEOUT_S
from tests.helpers.cluster import fresh_queue, running_cluster

pytestmark = pytest.mark.cluster

# Held at level 1 until the test raises it; small compaction so that every node snapshots soon.
OVERRIDES = {"feature_level_auto": False, "log_compaction_entries_min": 200, "log_compaction_interval_s": 2.0}
ITEMS = 240  # one-request enqueues: more entries than a compaction waits for


def headers_of(i: int) -> dict[str, str]:
    return {"traceparent": f"00-{i:032x}-{i:016x}-01", "n": str(i)}


async def contents(client: RcqClient, queue: str) -> dict[str, dict[str, str]]:
    """value -> headers of every item of ``queue``, without consuming them (dequeue + abort)."""
    tx = await client.begin(timeout_s=30)
    try:
        return {item.value.decode(): item.headers for item in await tx.dequeue_items(queue, 10_000)}
    finally:
        await tx.abort()


async def test_headers_survive_a_leader_failover_and_a_restart_from_snapshots() -> None:
    with running_cluster(overrides=OVERRIDES) as cluster:
        async with RcqClient(cluster.urls, request_timeout_s=10.0, retry_timeout_s=CLUSTER_WAIT_S,
                             **cluster.client_options()) as client:
            queue = fresh_queue("headers")
            with pytest.raises(FeatureLevelRequired):
                await client.enqueue(queue, "early", headers={"k": "v"})
            assert await client.count(queue) == 0
            assert (await client.raise_feature_level(2))["level"] == 2

            for start in range(0, ITEMS, 20):
                await asyncio.gather(*(client.enqueue(queue, f"item-{i}", headers=headers_of(i))
                                       for i in range(start, start + 20)))
            await client.enqueue(queue, "plain")
            expected = {f"item-{i}": headers_of(i) for i in range(ITEMS)} | {"plain": {}}
            assert await contents(client, queue) == expected

            leader = await asyncio.to_thread(cluster.wait_for_leader, LEADER_TIMEOUT_S)
            await asyncio.to_thread(cluster.kill_node, leader)
            await asyncio.to_thread(cluster.wait_for_leader, LEADER_TIMEOUT_S)
            assert await contents(client, queue) == expected  # the new leader's views: same items, same headers
            await asyncio.to_thread(cluster.start_node, leader)

            def every_node_snapshotted() -> bool:
                return all(cluster.status(i, timeout_s=5)["snapshot_count"] > 0 for i in range(3))

            await async_wait_until(every_node_snapshotted, CLUSTER_WAIT_S, interval_s=0.2, what="a snapshot on every node")
            for i in range(3):
                await asyncio.to_thread(cluster.stop_node, i)
            for i in range(3):
                await asyncio.to_thread(cluster.start_node, i, False)
            await asyncio.to_thread(cluster.wait_for_leader, LEADER_TIMEOUT_S)
            await asyncio.to_thread(cluster.wait_for_convergence, CLUSTER_WAIT_S)  # equal digests
            assert await contents(client, queue) == expected
            assert (await client.feature_level())["active"] == 2
