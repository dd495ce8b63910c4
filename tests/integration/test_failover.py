"""Failover against real 3-node clusters: kill -9 of the leader under a workload, and commits
whose outcome is unknown (both followers paused while the leader has the entry).

Each test kills or pauses nodes, so each gets a cluster of its own. The workload keeps
Jepsen's bookkeeping: every operation ends ``ok`` (acknowledged), ``fail``
(definitely did not happen) or ``info`` (unknown); after a final drain, every
acknowledged enqueue must come out exactly once, nothing that was never
enqueued may come out, and an unknown one at most once. Node logs are added to
the report of a failing test by the hook in conftest.py.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from rcq.client import (
    CommitOutcomeUnknown,
    RcqClient,
    Transaction,
    TransactionAborted,
)
from rcq.local.cluster import LocalCluster
from rcq.testing import async_wait_until
from tests.helpers import CLUSTER_WAIT_S, LEADER_TIMEOUT_S
from tests.helpers.cluster import drain_until_empty
from tests.integration.workload import History, check_nothing_lost, consumer, producer

pytestmark = pytest.mark.cluster

PRODUCERS = 4
CONSUMERS = 2


async def kill_the_leader(cluster: LocalCluster, client: RcqClient, history: History,
                          round_number: int) -> tuple[Transaction, str]:
    """One round: open a witness transaction on the leader, kill -9 the leader, wait until a new one
    serves and every worker has committed through it, restart the killed node. Returns the witness
    and its queue, which holds one item."""
    old_leader = await asyncio.to_thread(cluster.wait_for_leader, LEADER_TIMEOUT_S)
    witness_queue = f"witness-{round_number}-{uuid.uuid4().hex[:8]}"
    item = f"w-item-{round_number}"
    await client.enqueue(witness_queue, item)
    # A transaction open on the old leader when it dies: it holds a lock and a buffered enqueue.
    witness = await client.begin(timeout_s=120)
    assert await witness.dequeue_batch(witness_queue, 10) == [item.encode()]
    await witness.enqueue(witness_queue, f"w-never-{round_number}")

    await asyncio.to_thread(cluster.kill_node, old_leader)  # returns once the process is gone
    history.killed_at, history.first_ack_after_kill = time.monotonic(), None
    history.acks_after_kill.clear()
    new_leader = await asyncio.to_thread(cluster.wait_for_leader, LEADER_TIMEOUT_S)
    serving_s = time.monotonic() - history.killed_at
    assert new_leader != old_leader

    # Every worker commits again through the same client.
    workers = [f"p{i}" for i in range(PRODUCERS)] + [f"c{i}" for i in range(CONSUMERS)]
    await async_wait_until(lambda: all(history.acks_after_kill[w] >= 3 for w in workers), CLUSTER_WAIT_S,
                           what=f"every worker to commit after the failover: {history.acks_after_kill}")
    assert history.first_ack_after_kill is not None
    first_commit_s = history.first_ack_after_kill - history.killed_at
    print(f"\nfailover {round_number}: node-{new_leader} serving {serving_s:.2f} s after kill -9 of leader "
          f"node-{old_leader}; first commit of a transaction begun after the kill: {first_commit_s:.2f} s")
    await asyncio.to_thread(cluster.start_node, old_leader)  # under load; the next round needs 3 nodes
    return witness, witness_queue


async def test_killing_the_leader_under_load_loses_no_acknowledged_enqueue_and_the_client_carries_on(
        own_cluster: LocalCluster, own_client: RcqClient) -> None:
    queue = f"load-{uuid.uuid4().hex[:8]}"
    history = History()
    stop = asyncio.Event()
    witnesses: list[tuple[Transaction, str]] = []
    tasks = [asyncio.create_task(producer(own_client, queue, f"p{i}", history, stop)) for i in range(PRODUCERS)]
    tasks += [asyncio.create_task(consumer(own_client, queue, f"c{i}", history, stop)) for i in range(CONSUMERS)]
    try:
        for round_number in (1, 2):
            acknowledged = len(history.acknowledged)
            await async_wait_until(lambda n=acknowledged: len(history.acknowledged) >= n + 40, CLUSTER_WAIT_S,
                                   what="the workload to get going")
            witnesses.append(await kill_the_leader(own_cluster, own_client, history, round_number))
        assert len(history.consumed) > 0
    finally:
        stop.set()
        results = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), CLUSTER_WAIT_S)
    assert not [r for r in results if isinstance(r, BaseException)], results

    # Each witness was aborted by its leader's death: its lock released, its enqueue gone.
    for round_number, (witness, witness_queue) in enumerate(witnesses, 1):
        with pytest.raises(TransactionAborted):
            await witness.commit()
        assert (await witness.status())["state"] == "aborted"
        assert await drain_until_empty(own_client, witness_queue) == [f"w-item-{round_number}"]

    await check_nothing_lost(own_client, queue, history)
    await asyncio.to_thread(own_cluster.wait_for_convergence, CLUSTER_WAIT_S)


async def test_a_killed_leader_restarted_rejoins_as_a_follower_and_converges(
        own_cluster: LocalCluster, own_client: RcqClient) -> None:
    queue = f"rejoin-{uuid.uuid4().hex[:8]}"
    await own_client.enqueue(queue, *[f"before-{i}" for i in range(20)])
    old_leader = await asyncio.to_thread(own_cluster.wait_for_leader, LEADER_TIMEOUT_S)
    await asyncio.to_thread(own_cluster.kill_node, old_leader)
    new_leader = await asyncio.to_thread(own_cluster.wait_for_leader, LEADER_TIMEOUT_S)
    assert new_leader != old_leader
    for i in range(20):
        await own_client.enqueue(queue, f"after-{i}")
    assert len(await own_client.dequeue(queue, max_items=5)) == 5

    await asyncio.to_thread(own_cluster.start_node, old_leader)
    await asyncio.to_thread(own_cluster.wait_for_convergence, CLUSTER_WAIT_S)
    status = own_cluster.status(old_leader)
    assert (status["role"], status["leader_url"]) == ("follower", own_cluster.url(new_leader))
    assert own_cluster.status(new_leader)["role"] == "leader"
    # The client learns the leader from the follower.
    async with RcqClient(own_cluster.url(old_leader), **own_cluster.client_options()) as rejoined:
        assert await rejoined.count(queue) == 35
        assert await rejoined.peek(queue) is not None


# ------------------------------------------------------ commits of unknown outcome
# A commit answers "unknown" after 2 s. A leader cut off from its followers steps down after
# leader_fallback_timeout_s: 1.5 s (not 0.6 s) so that on a loaded machine the commit surely reaches
# it while it still leads; the Raft timeouts must stay above it.
SHORT_COMMITS = {"commit_timeout_s": 2.0, "leader_fallback_timeout_s": 1.5, "raft_timeout_min_s": 1.8,
                 "raft_timeout_max_s": 3.0, "connection_timeout_s": 3.5}


def process_stopped(pid: int | None) -> bool:
    """True once SIGSTOP has taken effect (it is delivered asynchronously); True where /proc is missing."""
    stat = Path(f"/proc/{pid}/stat")
    if pid is None or not stat.parent.parent.exists():
        return True
    fields = stat.read_text().rsplit(")", 1)[1].split()
    return fields[0] in ("T", "t")


async def commit_with_followers_paused(cluster: LocalCluster) -> tuple[int, list[int], str, str]:
    """Open a transaction that moves an item, pause both followers, commit: the entry reaches the
    leader's log only, and the commit's outcome is unknown. Returns (leader, followers, queue,
    transaction id)."""
    queue = f"unknown-{uuid.uuid4().hex[:8]}"
    leader = await asyncio.to_thread(cluster.wait_for_leader, LEADER_TIMEOUT_S)
    followers = [i for i in range(3) if i != leader]
    async with RcqClient(cluster.urls, request_timeout_s=3.0, retry_timeout_s=3.0, **cluster.client_options()) as client:
        await client.enqueue(queue, "kept", "moved")
        tx = await client.begin(timeout_s=120)
        assert await tx.dequeue(queue) == b"kept"
        await tx.enqueue(queue, "added")
        for i in followers:
            cluster.pause_node(i)
        await async_wait_until(lambda: all(process_stopped(cluster.nodes[i].pid) for i in followers), CLUSTER_WAIT_S,
                               what="the followers to stop")
        with pytest.raises(CommitOutcomeUnknown):
            await tx.commit()
    return leader, followers, queue, tx.transaction_id


async def status_on(cluster: LocalCluster, url: str, transaction_id: str) -> dict[str, Any]:
    """The transaction's status asked of one node (a follower may send the client to the leader)."""
    async with RcqClient(url, request_timeout_s=10.0, retry_timeout_s=CLUSTER_WAIT_S, **cluster.client_options()) as one:
        return await one.transaction_status(transaction_id)


@pytest.mark.parametrize("own_cluster", [SHORT_COMMITS], ids=["short-commits"], indirect=True)
async def test_an_unknown_commit_whose_leader_dies_is_reported_aborted_everywhere_and_changes_nothing(
        own_cluster: LocalCluster, own_client: RcqClient) -> None:
    leader, followers, queue, transaction_id = await commit_with_followers_paused(own_cluster)
    await asyncio.to_thread(own_cluster.kill_node, leader)  # the only log holding the entry is gone
    for i in followers:
        own_cluster.resume_node(i)
    await asyncio.to_thread(own_cluster.wait_for_leader, LEADER_TIMEOUT_S)
    await asyncio.to_thread(own_cluster.start_node, leader)
    await asyncio.to_thread(own_cluster.wait_for_convergence, CLUSTER_WAIT_S)

    for url in own_cluster.urls:
        assert (await status_on(own_cluster, url, transaction_id))["state"] == "aborted", url
    with pytest.raises(TransactionAborted):  # a retry with the same id never applies it
        await own_client.attach(transaction_id).commit()
    assert sorted(await drain_until_empty(own_client, queue)) == ["kept", "moved"]


@pytest.mark.parametrize("own_cluster", [SHORT_COMMITS], ids=["short-commits"], indirect=True)
async def test_an_unknown_commit_completed_by_its_reelected_leader_is_reported_committed_everywhere(
        own_cluster: LocalCluster, own_client: RcqClient) -> None:
    leader, followers, queue, transaction_id = await commit_with_followers_paused(own_cluster)
    # With one follower back, only the old leader can win (its log is longer): the entry commits.
    own_cluster.resume_node(followers[0])
    assert await asyncio.to_thread(own_cluster.wait_for_leader, LEADER_TIMEOUT_S) == leader
    own_cluster.resume_node(followers[1])
    await asyncio.to_thread(own_cluster.wait_for_convergence, CLUSTER_WAIT_S)

    states = {url: (await status_on(own_cluster, url, transaction_id))["state"] for url in own_cluster.urls}
    assert own_cluster.status(leader)["open_transactions"] == 0, states
    assert set(states.values()) == {"committed"}, states
    assert (await own_client.attach(transaction_id).commit()).duplicate  # a retry never applies twice
    assert sorted(await drain_until_empty(own_client, queue)) == ["added", "moved"]
