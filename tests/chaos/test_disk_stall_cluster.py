"""What a stalled disk does to a running cluster (powerfs mounts, every sync on one node hanging):

* a follower's stalled disk costs nothing: the same leader commits with the other follower;
* the leader's stalled disk costs its leadership: its Raft ticks hang in the log's fdatasync, the
  others elect a leader of their own within an election, and a client that knows every node goes
  on committing; once the disk is released the old leader steps down and catches up, and every
  node holds the same state;
* a leader that ticks Raft on pysyncobj's own thread (node 0 of a chaos cluster) still serves HTTP
  while that thread hangs in a sync: a dequeue asked of it directly hands out nothing (its read
  fence cannot commit; docs/raft-hazards.md, H22) while the new leader hands the same items out.

The chaos ``disk-stall`` nemesis draws these faults at random and the checker holds the history
safe; this test holds the cluster available through them, which the checker does not judge.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from chaos.cluster import ChaosCluster
from chaos.powerfs import fuse_unavailable_reason
from rcq.client import RcqClient
from tests.helpers import CLUSTER_WAIT_S, LEADER_TIMEOUT_S, QUIET_CLUSTER_WAIT_S
from tests.helpers.cluster import drain_until_empty

FUSE_UNAVAILABLE = fuse_unavailable_reason()
pytestmark = pytest.mark.skipif(FUSE_UNAVAILABLE is not None, reason=f"powerfs cannot mount here: {FUSE_UNAVAILABLE}")

COMMITS = 20  # one-item enqueues, each acknowledged, while a disk is stalled


async def enqueue_each(cluster: ChaosCluster, urls: list[str], queue: str, label: str) -> None:
    async with RcqClient(urls, **cluster.client_options()) as client:
        for k in range(COMMITS):
            await asyncio.wait_for(client.enqueue(queue, f"{label}-{k}"), CLUSTER_WAIT_S)


async def drain(cluster: ChaosCluster, queue: str) -> list[str]:
    async with RcqClient(cluster.urls, **cluster.client_options()) as client:
        return await drain_until_empty(client, queue)


async def dequeue_on(cluster: ChaosCluster, i: int, queue: str) -> tuple[int, dict[str, Any]]:
    """Open a transaction on node ``i`` itself and dequeue from ``queue`` in it: (status, body)."""
    timeout = aiohttp.ClientTimeout(total=CLUSTER_WAIT_S)
    async with aiohttp.ClientSession(timeout=timeout, headers=cluster.auth_headers()) as http:
        async with http.post(f"{cluster.url(i)}/v1/transactions", json={}, allow_redirects=False) as opened:
            assert opened.status == 201, await opened.text()
            url = f"{cluster.url(i)}/v1/transactions/{(await opened.json())['transaction_id']}/dequeue"
        async with http.post(url, json={"queue": queue, "max_items": 10}, allow_redirects=False) as answer:
            return answer.status, await answer.json()


async def held_leader_hands_out_nothing(cluster: ChaosCluster, held: int, queue: str) -> tuple[int, dict[str, Any]]:
    """Node ``held``'s disk stalled: its dequeue waits on its fence while the others elect, and
    drain ``queue``; then the disk is released and the dequeue's answer returned (it may come
    sooner: the fence gives up after ``commit_timeout_s``)."""
    cluster.stall_disk(held)
    asked = asyncio.ensure_future(dequeue_on(cluster, held, queue))
    others = [cluster.url(i) for i in range(3) if i != held]
    async with RcqClient(others, **cluster.client_options()) as client:
        drained = await drain_until_empty(client, queue)
    assert sorted(drained) == ["f-0", "f-1", "f-2"]
    await asyncio.to_thread(cluster.release_disk, held)
    return await asked


async def lead_with(cluster: ChaosCluster, i: int) -> None:
    async with RcqClient(cluster.urls, **cluster.client_options()) as client:
        await client.transfer_leadership(f"node-{i}")
    assert await asyncio.to_thread(cluster.wait_for_leader, LEADER_TIMEOUT_S) == i


async def enqueue_all(cluster: ChaosCluster, queue: str, items: list[str]) -> None:
    async with RcqClient(cluster.urls, **cluster.client_options()) as client:
        await client.enqueue(queue, *items)


def test_a_stalled_follower_costs_nothing_and_a_stalled_leader_is_replaced(tmp_path: Path) -> None:
    cluster = ChaosCluster(3, seed=11, base_dir=tmp_path / "cluster", power_fs=True)
    try:
        cluster.start()
        leader = cluster.wait_for_leader(LEADER_TIMEOUT_S)
        follower = (leader + 1) % 3

        cluster.stall_disk(follower)
        asyncio.run(enqueue_each(cluster, [cluster.url(leader)], "stalled", "follower"))
        assert cluster.wait_for_leader(LEADER_TIMEOUT_S) == leader, "a follower's disk moved the leadership"
        assert cluster.power_mounts[follower].stats()["syncs_blocked"] >= 1, "the follower's syncs did not hang"
        assert cluster.release_disk(follower)["released"] >= 1

        cluster.stall_disk(leader)
        asyncio.run(enqueue_each(cluster, cluster.urls, "stalled", "leader"))
        assert cluster.power_mounts[leader].stats()["syncs_blocked"] >= 1, "the leader's syncs did not hang"
        others = [i for i in range(3) if i != leader]
        assert cluster.wait_for_leader(LEADER_TIMEOUT_S) in others, "the stalled leader kept its leadership"
        cluster.release_disk(leader)
        cluster.wait_for_convergence(CLUSTER_WAIT_S)  # the old leader caught up with the new one's log

        items = asyncio.run(drain(cluster, "stalled"))
        wanted = [f"{label}-{k}" for label in ("follower", "leader") for k in range(COMMITS)]
        assert sorted(items) == sorted(wanted), "an acknowledged enqueue was lost or doubled"

        # Node 0 ticks Raft on its own thread: held in a sync, its event loop still answers.
        asyncio.run(lead_with(cluster, 0))
        asyncio.run(enqueue_all(cluster, "fenced", ["f-0", "f-1", "f-2"]))
        cluster.wait_for_convergence(QUIET_CLUSTER_WAIT_S)
        status, body = asyncio.run(held_leader_hands_out_nothing(cluster, 0, "fenced"))
        assert status != 200 or not body.get("items"), f"a deposed leader handed out consumed items: {body}"
        cluster.wait_for_convergence(CLUSTER_WAIT_S)
        assert asyncio.run(drain(cluster, "fenced")) == []
    finally:
        cluster.close()
