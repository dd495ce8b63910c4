"""The local chaos target: the cluster harness with every Raft and client link through its proxy.

The wiring (who dials whom through which link, what each node advertises) is checked on
the configuration files of a cluster that is never started; one real 3-node run shows the
harness's waits see through the proxy: clients are cut, the harness's polls are not.
"""

from __future__ import annotations

import json
import socket

import pytest

from chaos.cluster import CHAOS_NODE_OVERRIDES, ChaosCluster
from chaos.netproxy import LinkFault
from chaos.target import ChaosTarget, client_link, partition_links, partition_raft_link, raft_link
from rcq.testing import wait_until
from tests.helpers import LEADER_TIMEOUT_S, LOCAL_WAIT_S


def connects(url: str) -> bool:
    host, _, port = url.removeprefix("http://").partition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=2):
            return True
    except OSError:
        return False


@pytest.fixture
def unstarted(tmp_path):
    cluster = ChaosCluster(3, seed=4, base_dir=tmp_path / "cluster", node_overrides={"commit_timeout_s": 7.0})
    yield cluster
    cluster.close()


def test_it_is_a_chaos_target_with_link_faults(unstarted):
    assert isinstance(unstarted, ChaosTarget) and unstarted.target == "local"
    assert unstarted.link_faults() is unstarted.proxy and unstarted.node_isolation() is None
    assert sorted(unstarted.proxy.link_names()) == sorted(
        [raft_link(1, 0), raft_link(2, 0), raft_link(2, 1), client_link(0), client_link(1), client_link(2)])


def test_every_link_goes_through_the_proxy_and_the_greater_address_dials(unstarted):
    configs = [json.loads(node.config_path.read_text()) for node in unstarted.nodes]
    for i, config in enumerate(configs):
        node = unstarted.nodes[i]
        assert config["advertise_url"] == unstarted.client_urls[i] != node.url  # clients cross the proxy
        assert config["raft_address"] == node.raft_address
        assert config["tokens_file"] == str(node.tokens_path) and unstarted.token  # tokens, as in production
        assert config["commit_timeout_s"] == 7.0  # an override wins over chaos's own
        assert config["log_compaction_entries_min"] == CHAOS_NODE_OVERRIDES["log_compaction_entries_min"]
        dials = config["raft_dial_addresses"]
        for peer in config["peers"]:
            j = int(peer["node_id"].removeprefix("node-"))
            assert peer["http_url"] == unstarted.client_urls[j]
            assert peer["raft_address"] == unstarted.nodes[j].raft_address  # one identity cluster-wide
            if j < i:  # i dials j (its address is the greater), through the link
                assert node.raft_address > peer["raft_address"]
                assert dials[peer["raft_address"]] == f"127.0.0.1:{unstarted.raft_proxy_ports[(i, j)]}"
            else:  # j dials i
                assert node.raft_address < peer["raft_address"] and peer["raft_address"] not in dials
    assert [unstarted.poll_url(i) for i in range(3)] == [node.url for node in unstarted.nodes]  # polls go direct


def test_each_partitions_raft_links_go_through_the_proxy_and_the_greater_address_dials(tmp_path):
    cluster = ChaosCluster(3, seed=4, base_dir=tmp_path / "cluster", partitions=2)
    try:
        numbers = range(1, cluster.partitions_max + 1)
        assert len(cluster.partition_link_ports) == 3 * len(numbers)  # one per pair and partition number
        configs = [json.loads(node.config_path.read_text()) for node in cluster.nodes]
        for (number, dialler, acceptor), port in cluster.partition_link_ports.items():
            ours, theirs = (f"127.0.0.1:{cluster._partition_raft_port(i, number)}" for i in (dialler, acceptor))
            assert ours > theirs  # pysyncobj's rule: the greater address dials
            assert configs[dialler]["partition_raft_dial_addresses"][theirs] == f"127.0.0.1:{port}"
            assert theirs not in configs[acceptor]["partition_raft_dial_addresses"]
            assert partition_raft_link(number, dialler, acceptor) in cluster.proxy.link_names()
        dialler = max((0, 2), key=lambda i: f"127.0.0.1:{cluster._partition_raft_port(i, 1)}")
        assert cluster.partition_raft_links(0, 2, 1) == [(partition_raft_link(1, dialler, 2 - dialler), dialler)]
        assert partition_links(cluster) is cluster
    finally:
        cluster.close()


def test_a_chaos_cluster_without_partitions_proxies_no_partition_link(unstarted):
    assert unstarted.partition_link_ports == {} and partition_links(unstarted) is None


def test_a_chaos_cluster_is_not_reopened(unstarted):
    with pytest.raises(TypeError, match="cannot be reopened"):
        ChaosCluster.reopen(unstarted.base_dir)


def test_close_closes_the_proxy_and_keeps_the_logs(tmp_path):
    cluster = ChaosCluster(1, base_dir=tmp_path / "cluster")
    url = cluster.client_urls[0]
    assert connects(url)  # the proxy accepts even with no node behind it
    # Let the proxy finish with that connection (upstream refused, closed): a connection still
    # being accepted when the proxy's loop stops is never closed (a ResourceWarning later).
    def handled() -> bool:
        stats = cluster.proxy.stats()[client_link(0)]
        return (stats["accepted"], stats["open"]) == (1, 0)

    wait_until(handled, LOCAL_WAIT_S, what="the proxy closing it")
    cluster.close()
    assert not connects(url)
    assert cluster.base_dir.exists()


@pytest.mark.chaos
@pytest.mark.timeout(240)
def test_the_harness_polls_past_a_client_partition_and_a_raft_partition_moves_the_leader(tmp_path):
    with ChaosCluster(3, seed=1, base_dir=tmp_path / "cluster") as cluster:
        try:
            old = cluster.wait_for_leader(LEADER_TIMEOUT_S)
            links = cluster.link_faults()
            cut = LinkFault(drop_forward=True, drop_backward=True)
            links.set_faults({client_link(i): cut for i in range(3)})
            assert cluster.leader() == old  # clients are cut; the harness is not
            links.set_faults({raft_link(old, j): cut for j in range(3) if j != old})
            # Right after the cut the followers still name the old leader: wait for another.
            wait_until(lambda: cluster.leader() not in (None, old), LEADER_TIMEOUT_S,
                       what="a new leader while the old one is cut off")
            assert cluster.heal() == []  # every node ran: nothing to start
            assert cluster.proxy.faults() == {}
            cluster.wait_for_applied(LEADER_TIMEOUT_S)
            cluster.wait_for_convergence(LEADER_TIMEOUT_S, indices=range(3))
        except BaseException:
            print(cluster.dump_logs())
            raise
