"""Forwarding where the URLs clients are given do not work between nodes (NodeConfig.peer_urls).

A real 3-node cluster whose nodes advertise URLs nothing listens on (``http://127.0.0.1:1`` and
so on, as a compose cluster advertises the host's port mappings, which its containers cannot
reach) and reach each other at their own ports through ``peer_urls``, node-local configuration.
A plain HTTP client at a follower gets a commit done (forwarded to the leader's peer URL) while
everything it is told names the advertised URLs; without ``peer_urls`` the same follower cannot
reach the leader: the case the compose cluster was in.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from rcq.local.cluster import LocalCluster
from rcq.testing import wait_until
from tests.helpers import LEADER_TIMEOUT_S
from tests.helpers.cluster import ask, wait_settled

pytestmark = pytest.mark.cluster

UNREACHABLE_PORT_FIRST = 1  # node i advertises http://127.0.0.1:(1 + i): privileged, and nothing here listens


class AdvertisedElsewhere(LocalCluster):
    """Nodes that advertise URLs no node (nor the test) can reach; the harness polls their own ports."""

    def advertised_url(self, i: int) -> str:
        return f"http://127.0.0.1:{UNREACHABLE_PORT_FIRST + i}"

    def peer_urls(self) -> dict[str, str]:
        """Every node's own URL, by node id: one map for every node (a node's entry for itself is ignored)."""
        return {node.node_id: node.url for node in self.nodes}


@pytest.fixture(scope="module")
def cluster() -> Iterator[AdvertisedElsewhere]:
    local_cluster = AdvertisedElsewhere(3)
    for node in local_cluster.nodes:
        local_cluster.set_node_override(node.index, peer_urls=local_cluster.peer_urls())
    with local_cluster:
        try:
            # the feature-level survey reaches the members at their peer URLs too: the cluster settles
            wait_settled(local_cluster, local_cluster.wait_for_leader(LEADER_TIMEOUT_S))
            local_cluster.wait_for_applied(LEADER_TIMEOUT_S)
        except TimeoutError:
            print(local_cluster.dump_logs())
            raise
        yield local_cluster


def leader_and_follower(cluster: LocalCluster) -> tuple[int, int]:
    leader = cluster.wait_for_leader(LEADER_TIMEOUT_S)
    return leader, next(i for i in range(len(cluster.nodes)) if i != leader)


def test_nothing_listens_at_the_advertised_urls(cluster: AdvertisedElsewhere) -> None:
    for i in range(len(cluster.nodes)):
        with pytest.raises(ConnectionRefusedError), socket.create_connection(
                ("127.0.0.1", UNREACHABLE_PORT_FIRST + i), timeout=5):
            pass


async def test_a_follower_forwards_a_commit_to_the_leaders_peer_url(cluster: AdvertisedElsewhere) -> None:
    leader, follower = leader_and_follower(cluster)
    at, auth = cluster.url(follower), cluster.auth_headers()
    status, begun, headers = await ask("POST", f"{at}/v1/transactions", {}, auth)
    assert status == 201, begun
    assert headers["Rcq-Forwarded-To"] == cluster.advertised_url(leader)  # the client sees the advertised URL
    tx = begun["transaction_id"]
    status, _, _ = await ask("POST", f"{at}/v1/transactions/{tx}/enqueue", {"queue": "peer-urls", "items": ["a"]}, auth)
    assert status == 200
    status, committed, _ = await ask("POST", f"{at}/v1/transactions/{tx}/commit", {}, auth)
    assert (status, committed["committed"], committed["enqueued"]) == (200, True, 1), committed
    status, queue, _ = await ask("GET", f"{cluster.url(leader)}/v1/queues/peer-urls", None, auth)
    assert (status, queue["count"]) == (200, 1), queue


async def test_clients_are_still_given_the_advertised_urls(cluster: AdvertisedElsewhere) -> None:
    leader, follower = leader_and_follower(cluster)
    at, auth = cluster.url(follower), cluster.auth_headers()
    status, view, _ = await ask("GET", f"{at}/v1/cluster", None, auth)
    assert status == 200 and view["leader_url"] == cluster.advertised_url(leader)
    assert view["url"] == cluster.advertised_url(follower)
    assert sorted(p["url"] for p in view["peers"]) == sorted(cluster.urls[:follower] + cluster.urls[follower + 1:])
    status, refusal, headers = await ask("POST", f"{at}/v1/transactions", {}, {**auth, "Rcq-Redirect": "1"})
    assert status == 307 and refusal["error"]["leader_url"] == cluster.advertised_url(leader)
    assert headers["Location"] == cluster.advertised_url(leader) + "/v1/transactions"


async def test_the_status_page_asks_the_peers_at_their_peer_urls(cluster: AdvertisedElsewhere) -> None:
    _, follower = leader_and_follower(cluster)
    status, overview, _ = await ask("GET", f"{cluster.url(follower)}/v1/cluster/overview", None, cluster.auth_headers())
    assert status == 200
    assert [node["reachable"] for node in overview["nodes"]] == [True, True, True], overview["nodes"]
    assert sorted(node["url"] for node in overview["nodes"]) == sorted(cluster.urls)


async def test_without_peer_urls_a_follower_cannot_reach_the_leader(cluster: AdvertisedElsewhere) -> None:
    leader, follower = leader_and_follower(cluster)
    cluster.restart_node_with(follower, peer_urls={})  # what every node of the compose cluster once had
    try:
        wait_until(lambda: cluster.status(follower).get("leader_url") == cluster.advertised_url(leader),
                   LEADER_TIMEOUT_S, what="the restarted follower to know the leader")
        status, refusal, _ = await ask("POST", f"{cluster.url(follower)}/v1/transactions", {}, cluster.auth_headers())
        assert (status, refusal["error"]["code"]) == (503, "no_leader"), refusal
        assert f"cannot reach the leader at {cluster.advertised_url(leader)}" in refusal["error"]["message"]
    finally:
        cluster.restart_node_with(follower, peer_urls=cluster.peer_urls())
        cluster.wait_for_applied(LEADER_TIMEOUT_S)
