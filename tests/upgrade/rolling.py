"""Steps of a rolling upgrade for the upgrade tests: a load that commits throughout, a leadership
hand-over, the levels each node reports, and the format of a node's snapshot file.

:class:`Load` is the failover tests' workload (tests/integration/workload.py: producers and
consumers that record every acknowledged enqueue and committed dequeue) run in the background of
the test's own event loop, over plain HTTP (no session channel: what rcq 0.1 and this code both
serve the same way); the cluster steps that block (restarting a node, a hand-over) run in threads
meanwhile, so the load keeps committing while a node is down.

Must not import: a test module or a conftest.
"""

from __future__ import annotations

import asyncio
import pickle
from pathlib import Path
from typing import Any

import lmdb

from rcq.client import RcqClient
from rcq.local.cluster import LocalCluster
from rcq.server.raft.snapshots import META_KEY
from rcq.testing import async_wait_until, wait_until
from tests.helpers import CLUSTER_WAIT_S, LEADER_TIMEOUT_S
from tests.helpers.cluster import fresh_queue
from tests.integration.workload import History, check_nothing_lost, consumer, producer

SNAPSHOT_FILE = "raft.snapshot.lmdb"  # NodeConfig.snapshot_path, in the node's data directory


def client_of(cluster: LocalCluster, indices: list[int] | None = None) -> RcqClient:
    """A client of the cluster (of nodes ``indices`` only: rcq 0.1 has no feature-level routes, and
    the client asks the node it knows first)."""
    urls = cluster.urls if indices is None else [cluster.url(i) for i in indices]
    return RcqClient(urls, request_timeout_s=10.0, retry_timeout_s=CLUSTER_WAIT_S, channel=False,
                     **cluster.client_options())


class Load:
    """``producers`` and ``consumers`` on one fresh queue, committing until :meth:`finish`, which
    drains the queue and checks nothing acknowledged was lost or came out twice."""

    def __init__(self, cluster: LocalCluster, producers: int = 2, consumers: int = 2) -> None:
        self.cluster = cluster
        self.queue = fresh_queue("rolling")
        self.history = History()
        self._stop = asyncio.Event()
        self._client = client_of(cluster)
        self._tasks = [asyncio.create_task(producer(self._client, self.queue, f"p{n}", self.history, self._stop))
                       for n in range(producers)]
        self._tasks += [asyncio.create_task(consumer(self._client, self.queue, f"c{n}", self.history, self._stop))
                        for n in range(consumers)]

    def commits(self) -> int:
        """Acknowledged enqueues and committed dequeues so far."""
        return len(self.history.acknowledged) + len(self.history.consumed)

    async def commits_more(self, at_least: int = 5, what: str = "") -> None:
        """Wait until ``at_least`` more commits are acknowledged than now: the cluster commits."""
        wanted = self.commits() + at_least
        await async_wait_until(lambda: self.commits() >= wanted, CLUSTER_WAIT_S, interval_s=0.05,
                               what=f"{at_least} more commits {what}")

    async def finish(self) -> History:
        """Stop the workers, drain, check (nothing lost, nothing twice, nothing unknown came out)."""
        self._stop.set()
        await asyncio.gather(*self._tasks)
        try:
            await check_nothing_lost(self._client, self.queue, self.history)
        finally:
            await self._client.close()
        return self.history

    async def cancel(self) -> None:
        self._stop.set()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._client.close()


HAND_OVER_ATTEMPTS = 3


def hand_over(cluster: LocalCluster, to: int) -> None:
    """The leader hands leadership to node ``to`` (POST /v1/cluster/leadership); wait until it leads.
    A refusal the API calls retryable (the election went back to the old leader, on a loaded
    machine) is retried, as its answer says, against whichever node leads then."""
    for attempt in range(1, HAND_OVER_ATTEMPTS + 1):
        leader = cluster.wait_for_leader(LEADER_TIMEOUT_S)
        if leader == to:
            return
        handed = cluster.poll_json(cluster.url(leader) + "/v1/cluster/leadership", method="POST",
                                   body={"node_id": f"node-{to}"}, timeout_s=CLUSTER_WAIT_S)
        if handed.get("leader_id") == f"node-{to}":
            break
        assert handed.get("error", {}).get("retryable") and attempt < HAND_OVER_ATTEMPTS, handed
    wait_until(lambda: cluster.leader() == to, LEADER_TIMEOUT_S, what=f"node-{to} leading")


def levels(cluster: LocalCluster, indices: list[int] | None = None) -> list[Any]:
    """``feature_level`` of each node's /v1/cluster (None from rcq 0.1, which states none)."""
    indices = list(range(len(cluster.nodes))) if indices is None else indices
    return [cluster.status(i).get("feature_level") for i in indices]


def snapshot_format(cluster: LocalCluster, i: int) -> int:
    """The format written in node ``i``'s snapshot file (read-only, beside the running node)."""
    path = Path(cluster.nodes[i].data_dir) / SNAPSHOT_FILE
    env = lmdb.open(str(path), subdir=False, lock=False, readonly=True, max_dbs=0)
    try:
        with env.begin() as txn:
            raw = txn.get(META_KEY)
    finally:
        env.close()
    assert raw is not None, f"{path} has no meta"
    return int(pickle.loads(raw)["format"])


async def snapshot_now(cluster: LocalCluster, i: int) -> int:
    """Node ``i`` writes a snapshot now (POST /v1/admin/snapshot); the format it wrote."""
    before = int(cluster.status(i)["snapshot_count"])
    assert cluster.poll_json(cluster.url(i) + "/v1/admin/snapshot", method="POST", body={})
    await async_wait_until(lambda: int(cluster.status(i)["snapshot_count"]) > before, CLUSTER_WAIT_S,
                           what=f"node-{i}'s snapshot")
    return snapshot_format(cluster, i)


def create_partition(cluster: LocalCluster, name: str, indices: list[int] | None = None) -> dict[str, Any]:
    """POST /v1/cluster/partitions to whichever of ``indices`` leads (any node: the leader): the
    new partition's entry, or the error body."""
    leader = cluster.wait_for_leader(LEADER_TIMEOUT_S)
    assert indices is None or leader in indices, f"node-{leader} leads, not one of {indices}"
    return cluster.poll_json(cluster.url(leader) + "/v1/cluster/partitions", method="POST", body={"name": name})


def partition_led(cluster: LocalCluster, name: str, i: int) -> dict[str, Any]:
    """Partition ``name``'s entry in node ``i``'s listing once it names a leader."""
    def row() -> dict[str, Any] | None:
        rows = {r["name"]: r for r in cluster.poll_json(cluster.url(i) + "/v1/cluster/partitions")["partitions"]}
        found = rows.get(name)
        return found if found is not None and found["leader_url"] else None

    return wait_until(row, LEADER_TIMEOUT_S, what=f"{name} led, as node-{i} lists it")
