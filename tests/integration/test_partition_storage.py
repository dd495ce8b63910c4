"""A node's memory budget shared by its partitions, on a real 3-node cluster (docs/partitions.md,
"Memory budget"): every node has an 8 MiB budget and hosts p0 and p1. p1's queue is filled until
``507 storage_full``, again and again: p0's leader gives p1 more at each survey, well past a
static half, at every member; each node's partitions together hold no more than its budget, and
their allowances add up to no more; p0, which holds nothing, still takes a small enqueue (its
floor), while p1 stays full."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from rcq.local.cluster import LocalCluster
from rcq.server.core.state_machine import ITEM_OVERHEAD_BYTES
from rcq.testing import wait_until
from tests.helpers import CLUSTER_WAIT_S, FLOOD_REQUEST_TIMEOUT_S, LEADER_TIMEOUT_S
from tests.helpers.cluster import wait_settled

pytestmark = pytest.mark.cluster

BUDGET_BYTES = 8 << 20
ITEM = "x" * 4000
ITEMS_PER_REQUEST = 50
REQUESTS_MAX = BUDGET_BYTES // ((len(ITEM) + ITEM_OVERHEAD_BYTES) * ITEMS_PER_REQUEST) + 2  # one fill, at most


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    overrides = {"storage_bytes_max": BUDGET_BYTES, "balance_leaders": False}  # leaders stay put
    with LocalCluster(3, partitions_max=2, node_overrides=overrides) as local:
        wait_settled(local, local.wait_for_leader(LEADER_TIMEOUT_S))
        local.ensure_partitions(2)
        placed = local.poll_json(local.url(0) + "/v1/queues/hot", method="PUT", body={"partitions": ["p1"]})
        assert placed["settings"]["partitions"] == ["p1"], placed
        yield local


def enqueue(cluster: LocalCluster, queue: str, items: list[str]) -> dict[str, Any]:
    return cluster.poll_json(f"{cluster.url(0)}/v1/queues/{queue}/enqueue", FLOOD_REQUEST_TIMEOUT_S, method="POST",
                             body={"items": items})


def fill(cluster: LocalCluster) -> dict[str, Any]:
    """Enqueue into p1's queue until refused; the refusal (it must be storage_full)."""
    for _ in range(REQUESTS_MAX):
        answer = enqueue(cluster, "hot", [ITEM] * ITEMS_PER_REQUEST)
        if "error" in answer:
            assert answer["error"]["code"] == "storage_full", answer
            return answer
    raise AssertionError(f"{REQUESTS_MAX} requests of {ITEMS_PER_REQUEST} items and still no 507")


def storage(cluster: LocalCluster, i: int) -> dict[str, Any]:
    """Node ``i``'s /v1/cluster/storage: p0's figures, and its p1 process's under ``partitions``."""
    return cluster.poll_json(cluster.url(i) + "/v1/cluster/storage")


def metrics(cluster: LocalCluster, i: int) -> dict[str, float]:
    """Node ``i``'s /metrics: each series (its name and labels, as written) -> its value."""
    request = urllib.request.Request(cluster.url(i) + "/metrics", headers=cluster.auth_headers())
    with urllib.request.urlopen(request, timeout=FLOOD_REQUEST_TIMEOUT_S) as response:
        lines = response.read().decode().splitlines()
    pairs = (line.rpartition(" ") for line in lines if line and not line.startswith("#"))
    return {series: float(value) for series, _, value in pairs}


def test_a_filling_partition_gets_most_of_each_nodes_budget_and_the_other_keeps_its_floor(cluster: LocalCluster):
    refusal = fill(cluster)["error"]
    assert f"share of the node's budget is {refusal['details']['storage_bytes_max']} of {BUDGET_BYTES}" in \
        refusal["message"], refusal
    assert refusal["details"]["node_storage_bytes_max"] == BUDGET_BYTES

    def filled_three_quarters() -> int | None:
        fill(cluster)  # what it is allowed now, until refused again
        held = max(storage(cluster, i)["partitions"]["p1"]["storage_bytes"] for i in range(3))
        return held if held > BUDGET_BYTES * 3 // 4 else None

    held = wait_until(filled_three_quarters, CLUSTER_WAIT_S, what="p1 holding over three quarters of the budget")
    print(f"p1 holds {held} bytes of each node's {BUDGET_BYTES}")

    # p0 holds nothing but its floor's worth is still its own: a small enqueue there commits
    assert enqueue(cluster, "small", ["hello"]).get("committed") is True
    assert fill(cluster)["error"]["code"] == "storage_full"  # p1 is still full

    def applied_there(i: int) -> dict[str, Any] | None:
        """Node ``i``'s storage once its p0 applied the small item (and the allowance p0's leader
        stamped on it: a follower shows that)."""
        own = storage(cluster, i)
        return own if own["storage_bytes"] > 0 and own["storage_bytes_max"] < BUDGET_BYTES else None

    allowances = set()
    for i in range(3):
        own = wait_until(lambda i=i: applied_there(i), CLUSTER_WAIT_S, what=f"node-{i} applying p0's commit")
        hot = own["partitions"]["p1"]
        assert own["node_storage_bytes_max"] == hot["node_storage_bytes_max"] == BUDGET_BYTES
        assert own["storage_bytes"] + hot["storage_bytes"] <= BUDGET_BYTES, (i, own)
        assert own["storage_bytes_max"] + hot["storage_bytes_max"] <= BUDGET_BYTES, (i, own)
        assert hot["storage_bytes_max"] > BUDGET_BYTES // 2
        allowances.add(hot["storage_bytes_max"])
    assert len(allowances) == 1, f"every member holds p1's allowance, followers too: {allowances}"
    scraped = metrics(cluster, 0)
    assert scraped['rcq_node_storage_max_bytes{partition="p1"}'] == scraped["rcq_node_storage_max_bytes"] == BUDGET_BYTES
    assert scraped['rcq_storage_max_bytes{partition="p1"}'] == allowances.pop()
