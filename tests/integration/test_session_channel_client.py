"""The client's session channel against a real 3-node cluster: transactions over one channel to the
leader, a client sent from a follower's refused upgrade to the leader's channel, a killed leader
under load (nothing acknowledged lost, nothing duplicated), and the same client over HTTP alone.

The module shares one cluster; each test starts from a healed one and works on queues of its own.
What went over HTTP and what over the channel is read from a wire recorder on the client's
session (the upgrade is a GET of ``/v1/session``; every other request a POST or a GET of its own).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from urllib.parse import urlsplit

import pytest

from rcq.client import RcqClient
from rcq.client.channel import PATH
from rcq.local.cluster import LocalCluster
from rcq.testing import async_wait_until
from tests.helpers import CLUSTER_WAIT_S, LEADER_TIMEOUT_S, QUIET_CLUSTER_WAIT_S
from tests.helpers.cluster import fresh_queue
from tests.helpers.fakes import Wire
from tests.integration.workload import History, check_nothing_lost, consumer, producer

pytestmark = pytest.mark.cluster


def port_of(url: str) -> int | None:
    return urlsplit(url).port


def posts(recorder: Wire, port: int | None = None) -> list[str]:
    return [path for method, p, path in recorder.requests if method != "GET" and port in (None, p)]


def upgrades(recorder: Wire) -> list[int | None]:
    return [p for method, p, path in recorder.requests if (method, path) == ("GET", PATH)]


class ChannelOnly:
    """A predicate: the last 40 acknowledged enqueues came with no HTTP request at all."""

    def __init__(self, recorder: Wire, history: History) -> None:
        self.recorder, self.history = recorder, history
        self.posts, self.since = -1, 0

    def __call__(self) -> bool:
        if len(posts(self.recorder)) != self.posts:
            self.posts, self.since = len(posts(self.recorder)), len(self.history.acknowledged)
        return len(self.history.acknowledged) - self.since >= 40


async def leader_index(cluster: LocalCluster) -> int:
    return await asyncio.to_thread(cluster.wait_for_leader, LEADER_TIMEOUT_S)


async def test_a_transaction_goes_over_one_channel_to_the_leader(healthy_cluster: LocalCluster, wire):
    recorder, session = wire
    leader_url = healthy_cluster.url(await leader_index(healthy_cluster))
    queue, moved = fresh_queue("t"), fresh_queue("t")
    async with RcqClient(leader_url, session=session, request_timeout_s=15.0, retry_timeout_s=QUIET_CLUSTER_WAIT_S,
                         **healthy_cluster.client_options()) as client:
        await client.enqueue(queue, "a", "b")
        async with client.transaction() as tx:
            assert await tx.dequeue(queue) == b"a"
            await tx.enqueue(moved, "a")
        received = await client.receive(queue, max_items=5)
        assert received is not None and [item.value for item in received.items] == [b"b"]
        await received.commit()
        assert await client.dequeue(moved) == [b"a"]
        assert await client.count(queue) == 0  # a GET: HTTP
    assert posts(recorder) == []
    assert upgrades(recorder) == [port_of(leader_url)]


async def test_a_client_given_a_follower_is_sent_to_the_leaders_channel(healthy_cluster: LocalCluster, wire):
    recorder, session = wire
    leader = await leader_index(healthy_cluster)
    follower_url = healthy_cluster.url((leader + 1) % 3)
    leader_url = healthy_cluster.url(leader)
    queue = fresh_queue("t")
    async with RcqClient(follower_url, session=session, request_timeout_s=15.0, retry_timeout_s=QUIET_CLUSTER_WAIT_S,
                         **healthy_cluster.client_options()) as client:
        async with client.transaction() as tx:
            await tx.enqueue(queue, "via-follower")
        assert client.leader_url == leader_url
        assert await client.dequeue(queue) == [b"via-follower"]
    # the follower refused the upgrade (307), then answered the request itself over HTTP with its redirect
    assert upgrades(recorder) == [port_of(follower_url), port_of(leader_url)]
    assert posts(recorder, port_of(follower_url)) == ["/v1/transactions"]
    assert posts(recorder, port_of(leader_url)) == []


async def test_without_the_channel_every_operation_is_an_http_request(healthy_cluster: LocalCluster, wire):
    recorder, session = wire
    queue = fresh_queue("t")
    async with RcqClient(healthy_cluster.urls, session=session, channel=False, request_timeout_s=15.0,
                         retry_timeout_s=QUIET_CLUSTER_WAIT_S, **healthy_cluster.client_options()) as client:
        async with client.transaction() as tx:
            await tx.enqueue(queue, "over-http")
        assert await client.dequeue(queue) == [b"over-http"]
    assert upgrades(recorder) == []
    assert recorder.count("/commit") == 1 and recorder.count(f"/v1/queues/{queue}/dequeue") == 1


async def workload_through_a_leader_change(cluster: LocalCluster, producing: RcqClient, consuming: RcqClient,
                                           end_leadership: Callable[[int], Awaitable[None]],
                                           then: Callable[[History], Awaitable[None]] | None = None) -> tuple[int, int]:
    """Producers and consumers on a fresh queue; once they run, ``end_leadership(leader)``; they must
    go on through a new leader (then ``then``, if any), and lose and duplicate nothing. Returns
    (old leader, new leader)."""
    queue = fresh_queue("t")
    history = History()
    stop = asyncio.Event()
    tasks = [asyncio.create_task(producer(producing, queue, f"p{i}", history, stop)) for i in range(4)]
    tasks += [asyncio.create_task(consumer(consuming, queue, f"c{i}", history, stop)) for i in range(2)]
    try:
        await async_wait_until(lambda: len(history.acknowledged) >= 40 and len(history.consumed) >= 5, CLUSTER_WAIT_S,
                               what="the workload to get going")
        old_leader = await leader_index(cluster)
        await end_leadership(old_leader)
        new_leader = await leader_index(cluster)
        assert new_leader != old_leader
        acknowledged, consumed = len(history.acknowledged), len(history.consumed)
        await async_wait_until(lambda: len(history.acknowledged) >= acknowledged + 40
                               and len(history.consumed) > consumed, CLUSTER_WAIT_S,
                               what="the workload to go on through the new leader")
        if then is not None:
            await then(history)
    finally:
        stop.set()
        results = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), CLUSTER_WAIT_S)
    assert not [result for result in results if isinstance(result, BaseException)], results
    await check_nothing_lost(consuming, queue, history)
    return old_leader, new_leader


async def test_killing_the_leader_under_load_over_the_channel_loses_and_duplicates_nothing(
        healthy_cluster: LocalCluster, wire):
    """Producers share a coalescing client (batch frames), consumers a plain one (one frame each)."""
    recorder, session = wire
    cluster = healthy_cluster
    options = {"request_timeout_s": 10.0, "retry_timeout_s": CLUSTER_WAIT_S, "session": session,
               **cluster.client_options()}

    async def kill(leader: int) -> None:
        await asyncio.to_thread(cluster.kill_node, leader)

    async def channel_only(history: History) -> None:
        # HTTP carries a request only while an upgrade is refused (an election, a follower):
        # then the workload goes on over the new leader's channels alone
        await async_wait_until(ChannelOnly(recorder, history), CLUSTER_WAIT_S,
                               what="40 enqueues in a row with no HTTP request")

    async with RcqClient(cluster.urls, coalesce=True, **options) as producing, \
            RcqClient(cluster.urls, **options) as consuming:
        old_leader, new_leader = await workload_through_a_leader_change(cluster, producing, consuming, kill,
                                                                        channel_only)
    assert port_of(cluster.url(new_leader)) in upgrades(recorder)
    await asyncio.to_thread(cluster.start_node, old_leader)
    await asyncio.to_thread(cluster.wait_for_convergence, CLUSTER_WAIT_S)


async def test_a_leader_stopped_with_sigterm_under_channel_load_hands_over_and_exits_by_itself_losing_nothing(
        healthy_cluster: LocalCluster):
    """SIGTERM, as an orchestrator's rolling update sends it to whichever node it restarts: the
    leader hands leadership over, answers what its channels have in flight, closes them and exits
    by itself. Before, its channels kept aiohttp's shutdown waiting until the launcher killed it."""
    cluster = healthy_cluster
    options = {"request_timeout_s": 10.0, "retry_timeout_s": CLUSTER_WAIT_S, **cluster.client_options()}

    async def sigterm(leader: int) -> None:
        exit_code = await asyncio.to_thread(cluster.stop_node, leader)
        assert exit_code == 0, f"the leader did not stop by itself on SIGTERM (exit {exit_code})"

    async with RcqClient(cluster.urls, **options) as producing, RcqClient(cluster.urls, **options) as consuming:
        old_leader, _ = await workload_through_a_leader_change(cluster, producing, consuming, sigterm)
    log = (cluster.nodes[old_leader].directory / "node.log").read_text()
    assert "before stopping" in log and "closing" in log, log[-2000:]
    await asyncio.to_thread(cluster.start_node, old_leader)
    await asyncio.to_thread(cluster.wait_for_convergence, CLUSTER_WAIT_S)
