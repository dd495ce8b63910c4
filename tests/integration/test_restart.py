"""Restarts against real 3-node clusters: clean stop, whole-cluster crash, a wiped node, a lagging follower.

Each test stops or kills nodes, so each gets a cluster of its own (the
``own_cluster`` fixture of conftest.py, parametrized indirectly with NodeConfig
overrides where a test needs them). Node logs are added to the report of a
failing test by the hook in conftest.py.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import uuid
from collections import Counter
from typing import Any

import aiohttp
import pytest

from rcq.client import Enqueue, RcqClient, TransactionAborted
from rcq.local.cluster import LocalCluster
from rcq.testing import async_wait_until
from tests.helpers import CLUSTER_WAIT_S, LEADER_TIMEOUT_S
from tests.helpers.cluster import drain_until_empty, fresh_queue

pytestmark = pytest.mark.cluster

SNAPSHOT_OVERRIDES = {"log_compaction_entries_min": 200, "log_compaction_interval_s": 2.0}


async def contents(client: RcqClient, queue: str) -> list[tuple[int, bytes]]:
    """Every item of ``queue`` as (item id, value), head first, without consuming (dequeue + abort)."""
    tx = await client.begin(timeout_s=30)
    try:
        return [(item.item_id, item.value) for item in await tx.dequeue_items(queue, 10_000)]
    finally:
        await tx.abort()


async def queue_counts(client: RcqClient) -> dict[str, int]:
    return {q["queue"]: int(q["count"]) for q in await client.queues()}


def all_at_once(cluster: LocalCluster, action: str) -> list[Any]:
    """Call ``cluster.<action>(i)`` for every node in parallel (a whole-cluster crash or stop)."""
    with concurrent.futures.ThreadPoolExecutor(len(cluster.nodes)) as pool:
        return list(pool.map(getattr(cluster, action), range(len(cluster.nodes))))


async def wait_for_commits(cluster: LocalCluster, leader: int, entries: int) -> None:
    """Until the leader's commit index has grown by ``entries``."""
    start = int(cluster.status(leader)["commit_index"])
    await async_wait_until(lambda: int(cluster.status(leader, timeout_s=5)["commit_index"]) >= start + entries,
                           CLUSTER_WAIT_S, interval_s=0.1, what=f"{entries} more Raft entries")


class Load:
    """Writers of one-request enqueues (one Raft entry each when alone) and, every fourth, a
    transactional dequeue, until stopped; what they acknowledged."""

    def __init__(self, client: RcqClient, queue: str, writers: int = 3, already: tuple[str, ...] = ()) -> None:
        self.client, self.queue = client, queue
        self.enqueued: list[str] = list(already)  # items in the queue before the load
        self.dequeued: list[str] = []
        self._stop = asyncio.Event()
        self._tasks = [asyncio.create_task(self._write(f"w{i}")) for i in range(writers)]

    async def _write(self, name: str) -> None:
        for n in itertools.count():
            if self._stop.is_set():
                return
            await self.client.enqueue(self.queue, f"{name}-{n}")
            self.enqueued.append(f"{name}-{n}")
            if n % 4 == 3:
                async with self.client.transaction() as tx:
                    self.dequeued.extend(v.decode() for v in await tx.dequeue_batch(self.queue, 1))

    async def stop(self) -> None:
        self._stop.set()
        results = await asyncio.wait_for(asyncio.gather(*self._tasks, return_exceptions=True), CLUSTER_WAIT_S)
        assert not [r for r in results if isinstance(r, BaseException)], results

    def remaining(self) -> set[str]:
        assert len(set(self.dequeued)) == len(self.dequeued) and set(self.dequeued) <= set(self.enqueued)
        return set(self.enqueued) - set(self.dequeued)


# ----------------------------------------------------------------- clean stop
async def test_a_cluster_stopped_with_sigterm_restarts_from_its_data_dirs_with_the_same_state(
        own_cluster: LocalCluster, own_client: RcqClient) -> None:
    first, second = fresh_queue("a"), fresh_queue("b")
    await own_client.execute([Enqueue(first, [f"a{i}" for i in range(30)]), Enqueue(second, ["b0", "b1"])])
    for i in range(10):
        await own_client.enqueue(first, f"late{i}")
    assert len(await own_client.dequeue(first, max_items=7)) == 7
    key = uuid.uuid4().hex
    assert not (await own_client.enqueue(second, "keyed", idempotency_key=key)).duplicate
    before = await asyncio.to_thread(own_cluster.wait_for_convergence, CLUSTER_WAIT_S)
    queues_before = await queue_counts(own_client)
    items_before = {q: await contents(own_client, q) for q in (first, second)}
    stats_before = {q: await own_client.stats(q) for q in (first, second)}

    assert await asyncio.to_thread(all_at_once, own_cluster, "stop_node") == [0, 0, 0], "a node did not stop cleanly on SIGTERM"

    # One node alone has no leader: it refuses writes with 503 and a Retry-After, and changes nothing.
    await asyncio.to_thread(own_cluster.start_node, 0)
    async with aiohttp.ClientSession(headers=own_cluster.auth_headers()) as http:
        async with http.post(own_cluster.url(0) + f"/v1/queues/{first}/enqueue", json={"items": ["x"]},
                             allow_redirects=False) as response:
            body = await response.json()
            assert (response.status, body["error"]["code"], body["error"]["retryable"]) == (503, "no_leader", True)
            assert response.headers.get("Retry-After")
    await asyncio.to_thread(own_cluster.start)
    await asyncio.to_thread(own_cluster.wait_for_leader, LEADER_TIMEOUT_S)
    after = await asyncio.to_thread(own_cluster.wait_for_convergence, CLUSTER_WAIT_S)

    # The digest covers the applied index, and a new leader first commits a barrier entry: the same
    # state shows as the same queues, items (ids included), statistics and idempotency keys.
    assert after["applied_index"] > before["applied_index"]
    assert await queue_counts(own_client) == queues_before
    assert {q: await contents(own_client, q) for q in (first, second)} == items_before
    for queue, stats in stats_before.items():
        restarted = await own_client.stats(queue)
        assert {k: restarted[k] for k in ("count", "bytes", "enqueued_total", "dequeued_total")} == \
            {k: stats[k] for k in ("count", "bytes", "enqueued_total", "dequeued_total")}
    assert (await own_client.enqueue(second, "keyed", idempotency_key=key)).duplicate
    assert await own_client.count(first) == 33


# ---------------------------------------------------------- whole-cluster crash
async def test_every_acknowledged_commit_survives_kill_9_of_every_node(
        own_cluster: LocalCluster, own_client: RcqClient) -> None:
    queue = fresh_queue()
    acknowledged: set[str] = set()
    attempted: set[str] = set()  # sent, outcome unknown unless acknowledged
    aborted: set[str] = set()  # definitely not committed

    async def producer(name: str) -> None:
        for n in itertools.count():
            value = f"{name}-{n}"
            attempted.add(value)
            if n % 2:
                await own_client.enqueue(queue, value)
            else:
                tx = await own_client.begin()
                await tx.enqueue(queue, value)
                try:
                    await tx.commit()
                except TransactionAborted:
                    aborted.add(value)
                    continue
            acknowledged.add(value)

    tasks = [asyncio.create_task(producer(f"p{i}")) for i in range(4)]
    try:
        await async_wait_until(lambda: len(acknowledged) >= 150, CLUSTER_WAIT_S, what="150 acknowledged enqueues")
        await asyncio.to_thread(all_at_once, own_cluster, "kill_node")
    finally:
        for task in tasks:
            task.cancel()
        results = await asyncio.gather(*tasks, return_exceptions=True)
    assert all(isinstance(r, asyncio.CancelledError) for r in results), results
    acknowledged_at_crash = set(acknowledged)

    await asyncio.to_thread(own_cluster.start)
    await asyncio.to_thread(own_cluster.wait_for_leader, LEADER_TIMEOUT_S)
    await asyncio.to_thread(own_cluster.wait_for_convergence, CLUSTER_WAIT_S)
    came_out = Counter(await drain_until_empty(own_client, queue))
    duplicated = {v: n for v, n in came_out.items() if n > 1}
    lost = acknowledged_at_crash - set(came_out)
    unexpected = set(came_out) - attempted
    print(f"\nkill -9 of every node: {len(acknowledged_at_crash)} acknowledged, {len(came_out)} came out "
          f"({len(attempted) - len(acknowledged_at_crash) - len(aborted)} in flight at the crash)")
    assert not lost, f"acknowledged but lost: {sorted(lost)}"
    assert not duplicated, f"came out twice: {duplicated}"
    assert not unexpected, f"never enqueued: {sorted(unexpected)}"
    assert not (set(came_out) & aborted), "an aborted transaction's enqueue came out"
    await asyncio.to_thread(own_cluster.wait_for_convergence, CLUSTER_WAIT_S)


# ----------------------------------------------------------- catching up
@pytest.mark.parametrize("own_cluster", [SNAPSHOT_OVERRIDES], ids=["small-compaction"], indirect=True)
async def test_a_wiped_node_rejoins_from_the_leaders_snapshot_under_load(
        own_cluster: LocalCluster, own_client: RcqClient) -> None:
    queue = fresh_queue()
    leader = await asyncio.to_thread(own_cluster.wait_for_leader, LEADER_TIMEOUT_S)
    wiped = (leader + 1) % 3
    load = Load(own_client, queue)
    try:
        await wait_for_commits(own_cluster, leader, 250)
        await asyncio.to_thread(own_cluster.stop_node, wiped)
        own_cluster.wipe_node(wiped)
        assert not own_cluster.nodes[wiped].data_dir.exists()

        def leader_compacted() -> bool:  # its log no longer reaches back to the wiped node's index 0
            status = own_cluster.status(leader, timeout_s=5)
            return status["snapshot_count"] > 0 and status["log_length"] < status["commit_index"] - 50

        await async_wait_until(leader_compacted, CLUSTER_WAIT_S, interval_s=0.1, what="the leader to compact its log")
        await asyncio.to_thread(own_cluster.start_node, wiped)
        await wait_for_commits(own_cluster, leader, 50)  # the wiped node catches up while writes go on
    finally:
        await load.stop()

    converged = await asyncio.to_thread(own_cluster.wait_for_convergence, CLUSTER_WAIT_S)
    status = own_cluster.status(wiped)
    assert status["snapshot_count"] > 0, "the wiped node caught up without installing a snapshot"
    assert any("snapshot" in path.name for path in own_cluster.nodes[wiped].data_dir.iterdir())
    assert status["last_applied"] == converged["applied_index"]
    async with aiohttp.ClientSession(headers=own_cluster.auth_headers()) as http:
        async with http.get(f"{own_cluster.url(wiped)}/v1/queues/{queue}") as response:
            assert (await response.json())["count"] == len(load.remaining())
    assert sorted(await drain_until_empty(own_client, queue)) == sorted(load.remaining())


async def test_a_follower_restarted_after_missing_many_entries_catches_up(
        own_cluster: LocalCluster, own_client: RcqClient) -> None:
    queue = fresh_queue()
    leader = await asyncio.to_thread(own_cluster.wait_for_leader, LEADER_TIMEOUT_S)
    follower = (leader + 2) % 3
    await own_client.enqueue(queue, "before")
    await asyncio.to_thread(own_cluster.wait_for_convergence, CLUSTER_WAIT_S)
    await asyncio.to_thread(own_cluster.stop_node, follower)

    load = Load(own_client, queue, already=("before",))
    try:
        await wait_for_commits(own_cluster, leader, 300)
    finally:
        await load.stop()

    await asyncio.to_thread(own_cluster.start_node, follower)
    converged = await asyncio.to_thread(own_cluster.wait_for_convergence, CLUSTER_WAIT_S)
    status = own_cluster.status(follower)
    assert (status["role"], status["last_applied"]) == ("follower", converged["applied_index"])
    assert status["leader_url"] == own_cluster.url(leader)
    async with aiohttp.ClientSession(headers=own_cluster.auth_headers()) as http:
        async with http.get(f"{own_cluster.url(follower)}/v1/queues/{queue}") as response:
            assert (await response.json())["count"] == len(load.remaining())
    assert sorted(await drain_until_empty(own_client, queue)) == sorted(load.remaining())
