"""The chaos drain ends as soon as the leader proves that nothing can come back, and never before:
not while a transaction is open anywhere on it (a vanished client's items come back on its
deadline), nor while an item waits for its delay."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from chaos.executor import make_client
from chaos.history import HistoryWriter
from chaos.workload import drain, empty_for_good
from rcq.local.cluster import LocalCluster
from rcq.testing import async_wait_until
from tests.helpers import LEADER_TIMEOUT_S, QUIET_CLUSTER_WAIT_S
from tests.helpers.cluster import fresh_queue, running_cluster

pytestmark = [pytest.mark.cluster, pytest.mark.chaos]

DELAY_S = 0.5
VANISH_S = 1.0  # shorter than the workload's VANISH_TIMEOUT_S: the same path, sooner


@pytest.fixture(scope="module")
def one_node() -> Iterator[LocalCluster]:
    with running_cluster(nodes=1) as cluster:
        yield cluster


async def test_the_leader_shows_queues_empty_for_good_only_with_no_item_and_no_open_transaction(
        one_node: LocalCluster) -> None:
    queue, urls = fresh_queue(), one_node.urls
    async with make_client(urls, one_node.token) as client:
        assert await empty_for_good(client, urls, [queue])  # never used: empty, nothing open
        tx = await client.begin(30, "chaos")
        assert not await empty_for_good(client, urls, [queue])  # open, it could still commit an enqueue
        await tx.abort()
        assert await empty_for_good(client, urls, [queue])
        await client.enqueue(queue, b"later", delay_s=DELAY_S)
        assert not await empty_for_good(client, urls, [queue])  # not visible yet, but counted
        later: list[bytes] = []

        async def delivered() -> bool:
            later.extend(item.value for item in await client.dequeue_items(queue))
            return bool(later)

        await async_wait_until(delivered, QUIET_CLUSTER_WAIT_S, interval_s=0.1, what="the delayed item")
        assert later == [b"later"]
        assert await empty_for_good(client, urls, [queue])


async def test_the_drain_waits_for_a_vanished_transactions_items_and_ends_once_they_are_drained(
        one_node: LocalCluster, tmp_path: Path) -> None:
    queue, urls = fresh_queue(), one_node.urls
    one_node.wait_for_leader(LEADER_TIMEOUT_S)
    async with make_client(urls, one_node.token) as client:
        await client.enqueue(queue, b"held", b"free")
        vanished = await client.begin(VANISH_S, "chaos-vanish")
        assert [item.value for item in await vanished.dequeue_items(queue)] == [b"held"]  # then walks away
    history = HistoryWriter(tmp_path / "history.jsonl")
    try:
        drained = await drain(history, urls, [queue], 0, QUIET_CLUSTER_WAIT_S, token=one_node.token)
    finally:
        history.close()
    # Both items, the vanished transaction's too once its deadline gave it back; then no quiet period.
    assert drained == {"complete": True, "drained": {queue: 2}, "ended_by": "leader"}
