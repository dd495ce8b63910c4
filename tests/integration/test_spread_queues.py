"""A queue spread over several partitions on a real 3-node cluster (docs/partitions.md, "Spread
queues"): created with a fragment in each partition, written in each partition's transactions,
read as one (count and stats summed, each fragment under ``by_partition``), purged and deleted as
one; its dead-letter queue spread over the same partitions."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from rcq.client import SyncClient
from rcq.local.cluster import LocalCluster
from tests.helpers import LEADER_TIMEOUT_S
from tests.helpers.cluster import fresh_queue, wait_settled

pytestmark = pytest.mark.cluster

SPREAD = ["p0", "p1", "p2"]


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(3, partitions_max=2, node_overrides={"balance_leaders": False}) as local:
        wait_settled(local, local.wait_for_leader(LEADER_TIMEOUT_S))
        local.ensure_partitions(3)
        yield local


def ask(cluster: LocalCluster, path: str, method: str = "GET", body: dict[str, Any] | None = None,
        node: int | None = None) -> dict[str, Any]:
    """``method path`` at node ``node``'s own port (default: p0's leader, whose directory is current)."""
    i = cluster.wait_for_leader(LEADER_TIMEOUT_S) if node is None else node
    return cluster.poll_json(cluster.url(i) + path, method=method, body=body)


def enqueue_in(cluster: LocalCluster, partition: str, queue: str, items: list[str]) -> dict[str, Any]:
    """Commit ``items`` into ``queue`` in a transaction of ``partition`` (through node 1's own port)."""
    begun = ask(cluster, "/v1/transactions", "POST", {"partition": partition}, node=1)
    transaction = begun["transaction_id"]
    assert transaction.startswith(f"{partition}.") or partition == "p0", begun
    assert ask(cluster, f"/v1/transactions/{transaction}/enqueue", "POST", {"queue": queue, "items": items},
               node=1)["buffered"] == len(items)
    return ask(cluster, f"/v1/transactions/{transaction}/commit", "POST", {}, node=1)


def test_a_spread_queue_has_a_fragment_in_each_partition_and_reads_as_one(cluster: LocalCluster) -> None:
    queue = fresh_queue("spread")
    created = ask(cluster, f"/v1/queues/{queue}", "PUT", {"partitions": SPREAD, "max_priority": 2})
    assert created["settings"]["partitions"] == SPREAD and created["settings"]["max_priority"] == 2, created
    assert set(created["by_partition"]) == set(SPREAD)
    assert ask(cluster, f"/v1/queues/{queue}/placement")["partitions"] == SPREAD
    for n, partition in enumerate(SPREAD):
        assert enqueue_in(cluster, partition, queue, [f"{partition}-{i}" for i in range(n + 1)])["committed"]
    for node in range(3):  # any node's own port reads the whole queue
        count = ask(cluster, f"/v1/queues/{queue}", node=node)
        assert count["count"] == 6 and count["spread"] and "unanswered" not in count, count
        assert {p: row["count"] for p, row in count["by_partition"].items()} == {"p0": 1, "p1": 2, "p2": 3}
        assert count["settings"]["partitions"] == SPREAD and count["settings"]["max_priority"] == 2
    with SyncClient(cluster.urls, **cluster.client_options()) as client:  # the client reads it as one too
        assert client.count(queue) == 6 and client.queue_info(queue)["by_partition"]["p1"]["count"] == 2
    stats = ask(cluster, f"/v1/queues/{queue}/stats")
    assert stats["count"] == 6 and stats["enqueued_total"] == 6 and stats["by_partition"]["p2"]["enqueued_total"] == 3, stats
    purged = ask(cluster, f"/v1/queues/{queue}/purge", "POST", {})
    assert purged["removed"] == 6 and ask(cluster, f"/v1/queues/{queue}")["count"] == 0, purged


def test_a_spread_queue_is_deleted_in_every_partition_and_may_be_placed_anew(cluster: LocalCluster) -> None:
    queue = fresh_queue("gone")
    ask(cluster, f"/v1/queues/{queue}", "PUT", {"partitions": ["p1", "p2"]})
    enqueue_in(cluster, "p1", queue, ["a"])
    enqueue_in(cluster, "p2", queue, ["b", "c"])
    deleted = ask(cluster, f"/v1/queues/{queue}", "DELETE")
    assert deleted["removed"] == 3 and set(deleted["by_partition"]) == {"p1", "p2"}, deleted
    assert ask(cluster, f"/v1/queues/{queue}/placement")["partitions"] == ["p0"]  # forgotten
    again = ask(cluster, f"/v1/queues/{queue}", "PUT", {"partitions": ["p2"]})
    assert again["settings"]["partitions"] == ["p2"], again


def test_a_spread_queues_dead_letter_queue_is_spread_over_the_same_partitions(cluster: LocalCluster) -> None:
    queue, dead, elsewhere = fresh_queue("src"), fresh_queue("dlq"), fresh_queue("dlq-p1")
    ask(cluster, f"/v1/queues/{dead}", "PUT", {"partitions": ["p1", "p2"]})
    ask(cluster, f"/v1/queues/{elsewhere}", "PUT", {"partitions": ["p1"]})
    refused = ask(cluster, f"/v1/queues/{queue}", "PUT", {"partitions": ["p1", "p2"], "dead_letter_queue": elsewhere})
    assert refused["error"]["code"] == "dead_letter_partition_mismatch", refused
    made = ask(cluster, f"/v1/queues/{queue}", "PUT", {"partitions": ["p1", "p2"], "dead_letter_queue": dead})
    assert made["settings"]["dead_letter_queue"] == dead, made
    assert all(row["settings"]["dead_letter_queue"] == dead for row in made["by_partition"].values())
