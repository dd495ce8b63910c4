"""Membership changes on real clusters (docs/membership.md): grow 3 -> 5 and shrink 5 -> 3 under
load, replace a killed node by a new one that catches up from a snapshot, restart a cluster whose
static configurations predate its membership, and refused changes that change nothing.

"Nothing lost" is the failover tests' bookkeeping (tests/integration/workload.py). That a new
member *votes* is shown by killing old members until only a majority that needs it is left and
committing; that a removed one no longer counts, by killing the remaining members down to a
majority of the smaller cluster and committing.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from rcq.client import (
    MemberExists,
    MemberNotFound,
    NodeUnreachable,
    RcqClient,
    WouldLoseQuorum,
)
from rcq.local.cluster import LocalCluster
from rcq.testing import async_wait_until
from tests.helpers import CLUSTER_WAIT_S
from tests.helpers.cluster import drain_until_empty, running_cluster
from tests.integration.workload import History, check_nothing_lost, consumer, producer

pytestmark = pytest.mark.cluster

PRODUCERS = 3
CONSUMERS = 2
# Snapshots every few hundred entries: a node added later has to catch up from one.
SMALL_LOG = {"log_compaction_entries_min": 100, "log_compaction_interval_s": 5.0}


def client_of(cluster: LocalCluster, indices: list[int] | None = None) -> RcqClient:
    urls = cluster.urls if indices is None else [cluster.url(i) for i in indices]
    return RcqClient(urls, request_timeout_s=10.0, retry_timeout_s=CLUSTER_WAIT_S, **cluster.client_options())


def member_ids(cluster: LocalCluster, i: int) -> set[str]:
    """The voting members node ``i`` sees."""
    return {m["node_id"] for m in cluster.poll_json(cluster.url(i) + "/v1/cluster/members")["members"]}


async def wait_members(cluster: LocalCluster, indices: list[int], expected: set[str]) -> None:
    await async_wait_until(lambda: all(member_ids(cluster, i) == expected for i in indices), CLUSTER_WAIT_S,
                           what=f"nodes {indices} to see members {sorted(expected)}")


def leader_reaches_all(cluster: LocalCluster) -> bool:
    """The leader's Raft connection to every other member is up (what a removal's quorum check counts)."""
    leader = cluster.leader()
    if leader is None:
        return False
    members = cluster.poll_json(cluster.url(leader) + "/v1/cluster/members")["members"]
    return all(m["self"] or m["connected"] for m in members)


async def wait_leader_reaches_all(cluster: LocalCluster) -> None:
    # A fresh cluster commits once a majority is connected; the last members may connect later on a
    # busy machine, and until then a removal is refused (WouldLoseQuorum: the guard counts them out).
    await async_wait_until(lambda: leader_reaches_all(cluster), CLUSTER_WAIT_S,
                           what="the leader connected to every member")


async def add(client: RcqClient, cluster: LocalCluster, i: int) -> dict[str, Any]:
    node = cluster.nodes[i]
    return await client.add_node(node.node_id, node.raft_address, cluster.url(i), catch_up_timeout_s=CLUSTER_WAIT_S)


class Load:
    """Producers and consumers on one queue, for as long as the block runs."""

    def __init__(self, client: RcqClient) -> None:
        self.client = client
        self.queue = f"load-{uuid.uuid4().hex[:8]}"
        self.history = History()
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    async def __aenter__(self) -> Load:
        self._tasks = [asyncio.create_task(producer(self.client, self.queue, f"p{i}", self.history, self._stop))
                       for i in range(PRODUCERS)]
        self._tasks += [asyncio.create_task(consumer(self.client, self.queue, f"c{i}", self.history, self._stop))
                        for i in range(CONSUMERS)]
        return self

    async def more_acknowledged(self, count: int) -> None:
        target = len(self.history.acknowledged) + count
        await async_wait_until(lambda: len(self.history.acknowledged) >= target, CLUSTER_WAIT_S,
                               what=f"{count} more acknowledged enqueues")

    async def __aexit__(self, *exc_info: object) -> None:
        self._stop.set()
        results = await asyncio.wait_for(asyncio.gather(*self._tasks, return_exceptions=True), CLUSTER_WAIT_S)
        assert not [r for r in results if isinstance(r, BaseException)], results


async def commits_with_only(cluster: LocalCluster, alive: list[int]) -> None:
    """With only ``alive`` running, a leader serves and a commit goes through."""
    await asyncio.to_thread(cluster.wait_for_leader, CLUSTER_WAIT_S)
    async with client_of(cluster, alive) as client:
        queue = f"quorum-{uuid.uuid4().hex[:6]}"
        await client.enqueue(queue, "committed with a majority of the new membership")
        assert await drain_until_empty(client, queue) == ["committed with a majority of the new membership"]


@pytest.fixture
async def grown() -> AsyncIterator[LocalCluster]:
    with running_cluster(3, SMALL_LOG) as cluster:
        yield cluster


async def test_growing_from_3_to_5_under_load_loses_nothing_and_the_new_nodes_vote(grown: LocalCluster) -> None:
    cluster = grown
    async with client_of(cluster) as client:
        async with Load(client) as load:
            await load.more_acknowledged(40)
            for _ in range(2):
                new = await asyncio.to_thread(cluster.add_node)
                answer = await add(client, cluster, new)
                assert answer["caught_up"] is True, answer
                assert answer["added"]["node_id"] == f"node-{new}"
                await load.more_acknowledged(40)
        await check_nothing_lost(client, load.queue, load.history)
    everyone = {f"node-{i}" for i in range(5)}
    await wait_members(cluster, list(range(5)), everyone)
    await asyncio.to_thread(cluster.wait_for_convergence, CLUSTER_WAIT_S, list(range(5)))
    # Two of the first three gone: node-3 and node-4 are the majority now.
    for i in (0, 1):
        await asyncio.to_thread(cluster.kill_node, i)
    await commits_with_only(cluster, [2, 3, 4])


async def test_shrinking_from_5_to_3_under_load_even_the_leader_loses_nothing() -> None:
    with running_cluster(5, SMALL_LOG) as cluster:
        async with client_of(cluster) as client:
            async with Load(client) as load:
                await load.more_acknowledged(40)
                await wait_leader_reaches_all(cluster)
                leader = await asyncio.to_thread(cluster.wait_for_leader, CLUSTER_WAIT_S)
                removed = [leader]
                answer = await client.remove_node(f"node-{leader}")  # hands leadership over first
                assert answer["removed"]["node_id"] == f"node-{leader}"
                await load.more_acknowledged(40)
                await wait_leader_reaches_all(cluster)
                follower = next(i for i in range(5) if i != leader and i != cluster.leader())
                await client.remove_node(f"node-{follower}")
                removed.append(follower)
                for i in removed:
                    await asyncio.to_thread(cluster.stop_node, i)
                await load.more_acknowledged(40)
            await check_nothing_lost(client, load.queue, load.history)
        remaining = [i for i in range(5) if i not in removed]
        await wait_members(cluster, remaining, {f"node-{i}" for i in remaining})
        await asyncio.to_thread(cluster.wait_for_convergence, CLUSTER_WAIT_S, remaining)
        # Two of five would not be a majority; two of three are.
        await asyncio.to_thread(cluster.kill_node, remaining[0])
        await commits_with_only(cluster, remaining[1:])


async def test_a_killed_node_is_replaced_by_a_new_one_that_catches_up_from_a_snapshot(grown: LocalCluster) -> None:
    cluster = grown
    async with client_of(cluster) as client:
        queue = f"kept-{uuid.uuid4().hex[:6]}"
        for n in range(30):
            await client.enqueue(queue, *[f"v{n}-{k}" for k in range(10)])
        leader = await asyncio.to_thread(cluster.wait_for_leader, CLUSTER_WAIT_S)
        dead = next(i for i in range(3) if i != leader)
        await asyncio.to_thread(cluster.kill_node, dead)
        for i in range(3):  # every log compacted: the new node cannot catch up from entries alone
            if i != dead:
                await asyncio.to_thread(cluster.request_snapshot, i)
        await async_wait_until(lambda: all(cluster.status(i)["snapshot_count"] >= 1 for i in range(3) if i != dead),
                               CLUSTER_WAIT_S, what="snapshots on the live nodes")
        await client.remove_node(f"node-{dead}")
        alive = [i for i in range(3) if i != dead]
        new = await asyncio.to_thread(cluster.add_node, alive)
        answer = await add(client, cluster, new)
        assert answer["caught_up"] is True, answer
        assert cluster.status(new)["snapshots_received"] >= 1
        await wait_members(cluster, [*alive, new], {f"node-{i}" for i in (*alive, new)})
        await asyncio.to_thread(cluster.wait_for_convergence, CLUSTER_WAIT_S, [*alive, new])
        assert await client.count(queue) == 300
    # The other original follower gone too: the leader needs the new node's vote.
    other = next(i for i in alive if i != cluster.leader())
    await asyncio.to_thread(cluster.kill_node, other)
    await commits_with_only(cluster, [i for i in (*alive, new) if i != other])


async def test_a_restarted_cluster_keeps_its_membership_whatever_its_static_configurations_say(
        grown: LocalCluster) -> None:
    cluster = grown
    async with client_of(cluster) as client:
        new = await asyncio.to_thread(cluster.add_node)
        await add(client, cluster, new)
        for i in range(4):  # the membership with node-3 is in every snapshot...
            await asyncio.to_thread(cluster.request_snapshot, i)
        await client.remove_node("node-0")  # ...and node-0's removal only in the logs after them
    await asyncio.to_thread(cluster.stop_node, 0)
    members = [1, 2, new]
    for i in members:  # node-1 and node-2 are configured with node-0 and without node-3
        await asyncio.to_thread(cluster.stop_node, i)
    for i in members:
        await asyncio.to_thread(cluster.start_node, i)
    await wait_members(cluster, members, {"node-1", "node-2", "node-3"})
    await asyncio.to_thread(cluster.kill_node, 1)  # 2 of 3 left: enough only if node-0 is gone for good
    await commits_with_only(cluster, [2, new])


async def test_a_node_configured_before_the_leader_joined_sends_clients_to_it(grown: LocalCluster) -> None:
    cluster = grown
    async with client_of(cluster) as client:
        new = await asyncio.to_thread(cluster.add_node)
        await add(client, cluster, new)
        answer = await client.transfer_leadership(f"node-{new}")
        assert answer["leader_id"] == f"node-{new}", answer
    await async_wait_until(lambda: cluster.status(0)["leader_url"] == cluster.url(new), CLUSTER_WAIT_S,
                           what="node-0 to name node-3's URL as the leader's")
    async with client_of(cluster, [0]) as only_node_0:  # its configuration does not list node-3
        await only_node_0.enqueue("redirected", "to a leader node-0 learned from the log")
        assert await drain_until_empty(only_node_0, "redirected") == ["to a leader node-0 learned from the log"]


async def test_refused_membership_changes_change_nothing(grown: LocalCluster) -> None:
    cluster = grown
    leader = await asyncio.to_thread(cluster.wait_for_leader, CLUSTER_WAIT_S)
    before = cluster.digest(leader)
    async with client_of(cluster) as client:
        spare = await asyncio.to_thread(cluster.add_node, None, start=False)
        node = cluster.nodes[spare]
        refused: list[tuple[type[Exception], Callable[[], Awaitable[Any]]]] = [
            (NodeUnreachable, lambda: client.add_node(node.node_id, node.raft_address, node.url)),  # not running
            (NodeUnreachable, lambda: client.add_node("node-9", node.raft_address, cluster.url(1))),  # not node-9
            (MemberExists, lambda: client.add_node("node-1", node.raft_address, node.url)),
            (MemberExists, lambda: client.add_node(node.node_id, cluster.nodes[1].raft_address, node.url)),
            (MemberNotFound, lambda: client.remove_node("node-9")),
        ]
        for error, attempt in refused:
            with pytest.raises(error):
                await attempt()
        follower, other = (i for i in range(3) if i != leader)
        await asyncio.to_thread(cluster.kill_node, other)
        with pytest.raises(WouldLoseQuorum):  # the leader alone would be left of two
            await client.remove_node(f"node-{follower}")
    after = cluster.digest(leader)
    assert after == before, "a refused change wrote to the log"
    assert member_ids(cluster, leader) == {"node-0", "node-1", "node-2"}


def test_the_cli_lists_adds_and_removes_nodes(grown: LocalCluster) -> None:
    cluster = grown
    new = cluster.add_node()
    node = cluster.nodes[new]
    token_file = cluster.base_dir / "admin.token"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}

    def rcq(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "rcq", *args, "--url", cluster.url(0), "--token-file",
                               str(token_file)], capture_output=True, text=True, timeout=120, env=env, check=False)

    added = rcq("cluster", "add-node", "--node-id", node.node_id, "--raft-address", node.raft_address,
                "--node-url", node.url)
    assert added.returncode == 0, added.stderr
    listed = rcq("cluster", "members")
    assert listed.returncode == 0 and all(f"node-{i}" in listed.stdout for i in range(4)), listed
    removed = rcq("cluster", "remove-node", "node-9")
    assert removed.returncode != 0 and "member_not_found" in removed.stderr, removed
    removed = rcq("cluster", "remove-node", node.node_id)
    assert removed.returncode == 0, removed.stderr
    assert member_ids(cluster, 0) == {"node-0", "node-1", "node-2"}


async def test_a_rolling_restart_by_the_documented_procedure_loses_nothing(grown: LocalCluster) -> None:
    """docs/membership.md: followers one at a time, each back and caught up before the next; then
    leadership handed over and the old leader restarted."""
    cluster = grown

    async def back_and_caught_up(i: int) -> None:
        """Ready, and holding what the cluster had committed when it came back."""
        leader = await asyncio.to_thread(cluster.wait_for_leader, CLUSTER_WAIT_S)
        target = cluster.status(leader)["commit_index"]
        await async_wait_until(lambda: cluster.poll_json(cluster.url(i) + "/readyz").get("ready") is True
                               and cluster.status(i)["last_applied"] >= target, CLUSTER_WAIT_S,
                               what=f"node-{i} ready and caught up to index {target}")

    async with client_of(cluster) as client:
        async with Load(client) as load:
            await load.more_acknowledged(30)
            leader = await asyncio.to_thread(cluster.wait_for_leader, CLUSTER_WAIT_S)
            for i in (i for i in range(3) if i != leader):
                await asyncio.to_thread(cluster.stop_node, i)
                await asyncio.to_thread(cluster.start_node, i)
                await back_and_caught_up(i)
                await load.more_acknowledged(20)
            answer = await client.transfer_leadership()
            assert answer["previous_leader_id"] == f"node-{leader}" and answer["leader_id"] != f"node-{leader}"
            await asyncio.to_thread(cluster.stop_node, leader)
            await asyncio.to_thread(cluster.start_node, leader)
            await back_and_caught_up(leader)
            await load.more_acknowledged(20)
        await check_nothing_lost(client, load.queue, load.history)
    await asyncio.to_thread(cluster.wait_for_convergence, CLUSTER_WAIT_S, [0, 1, 2])


async def test_leadership_is_handed_over_under_load_to_the_node_asked_each_time(grown: LocalCluster) -> None:
    """A busy leader's log is always ahead of its followers': the hand-over holds new proposals
    until the target has the whole log, so pysyncobj sends TimeoutNow and the target, as up to
    date as anyone, wins at once (without the hold: "not caught up", or the old leader re-elected)."""
    cluster = grown
    async with client_of(cluster) as client:
        async with Load(client) as load:
            await load.more_acknowledged(30)
            # The client must not spend its whole budget retrying a hand-over that keeps failing.
            async with RcqClient(cluster.urls, request_timeout_s=10.0, retry_timeout_s=5.0,
                                 **cluster.client_options()) as admin:
                handed_over = 0
                for _ in range(8):  # four hand-overs; an election nobody asked for may steal a turn
                    leader = await asyncio.to_thread(cluster.wait_for_leader, CLUSTER_WAIT_S)
                    target = next(i for i in range(3) if i != leader)
                    answer = await admin.transfer_leadership(f"node-{target}")
                    if answer == {"leader_id": f"node-{target}", "previous_leader_id": f"node-{target}"}:
                        continue  # the target was elected on its own after wait_for_leader looked: nothing handed over
                    assert answer == {"leader_id": f"node-{target}", "previous_leader_id": f"node-{leader}"}, answer
                    assert await asyncio.to_thread(cluster.wait_for_leader, CLUSTER_WAIT_S) == target
                    await load.more_acknowledged(20)
                    handed_over += 1
                    if handed_over == 4:
                        break
                assert handed_over == 4
        await check_nothing_lost(client, load.queue, load.history)
    await asyncio.to_thread(cluster.wait_for_convergence, CLUSTER_WAIT_S, [0, 1, 2])


async def test_a_node_serving_https_is_probed_over_tls_and_added() -> None:
    """The leader checks a new node's health over HTTPS, verifying it with the cluster's CA."""
    with LocalCluster(3, tls=True) as cluster:
        await asyncio.to_thread(cluster.wait_for_leader, CLUSTER_WAIT_S)
        new = await asyncio.to_thread(cluster.add_node)
        assert cluster.url(new).startswith("https://")
        async with client_of(cluster) as client:
            answer = await add(client, cluster, new)
            assert answer["caught_up"] is True and answer["added"]["url"].startswith("https://")
            await client.enqueue("over-tls", "through four members")
        await wait_members(cluster, list(range(4)), {f"node-{i}" for i in range(4)})
        await asyncio.to_thread(cluster.wait_for_convergence, CLUSTER_WAIT_S, list(range(4)))
