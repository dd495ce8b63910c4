"""Operating partitions on a real 3-node cluster (docs/partitions.md, docs/operations.md): the
leader balancer spreads six partitions' leaders two per node, and again after a node restarts; a
partition's members are added, removed and replaced under load, losing no commit; a node is
drained; p0's controller calls partition processes with a proof of the cluster secret that a
forged one cannot pass."""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rcq.client import LeaderChanged, SyncClient
from rcq.local.cluster import LocalCluster
from rcq.server.security import cluster_calls
from rcq.testing import wait_until
from tests.helpers import BALANCE_WAIT_S, CLUSTER_WAIT_S, LEADER_TIMEOUT_S, MEMBER_CHANGE_TIMEOUT_S
from tests.helpers.cluster import create_partition_when_ready, wait_settled

pytestmark = pytest.mark.cluster

HOLD_S = 2.0  # the balancer's hold here (60 s by default)


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(3, partitions_max=10, node_overrides={"balance_hold_s": HOLD_S}) as local:
        wait_settled(local, local.wait_for_leader(LEADER_TIMEOUT_S))
        yield local


def client(cluster: LocalCluster) -> SyncClient:
    return SyncClient(cluster.urls, **cluster.client_options())


def balance(cluster: LocalCluster) -> dict[str, Any]:
    return cluster.poll_json(cluster.url(cluster.wait_for_leader()) + "/v1/cluster/balance")


def spread_evenly(cluster: LocalCluster, names: set[str]) -> dict[str, Any] | None:
    """The balance once each node leads two of ``names``, None before."""
    answer = balance(cluster)
    led = {p["name"]: p["leader_id"] for p in answer["partitions"] if p["name"] in names}
    counts = {node.node_id: 0 for node in cluster.nodes}
    for leader in led.values():
        if leader in counts:
            counts[leader] += 1
    return answer if len(led) == len(names) and sorted(counts.values()) == [2, 2, 2] else None


def test_the_balancer_spreads_six_leaders_two_per_node_and_again_after_a_restart(cluster: LocalCluster):
    names = {f"b{i}" for i in range(6)}
    with client(cluster) as rcq:
        for name in sorted(names):
            create_partition_when_ready(rcq, name, replicas=3)
    first = wait_until(lambda: spread_evenly(cluster, names), BALANCE_WAIT_S, what="two leaders per node")
    assert first["moves_failed_total"] == 0, first
    # a node that leads partitions restarts (not p0's leader, whose balancer would move)
    p0_leader = cluster.wait_for_leader()
    restarted = next(i for i in range(3) if i != p0_leader)
    restarted_id = cluster.nodes[restarted].node_id
    cluster.stop_node(restarted)
    away = balance(cluster)
    assert away["leaders_per_node"].get(restarted_id, 0) == 0, away
    cluster.start_node(restarted)
    served = time.monotonic()
    again = wait_until(lambda: spread_evenly(cluster, names), BALANCE_WAIT_S, what="two leaders per node again")
    print(f"spread again {time.monotonic() - served:.1f} s after node-{restarted} served; "
          f"moves {first['moves_total']} then {again['moves_total']}")
    # balanced: no more moves
    moves = again["moves_total"]
    with client(cluster) as rcq:
        answer = rcq.rebalance()
    assert answer["moves"] == [] and answer["moves_total"] == moves, answer
    for name in sorted(names):
        with client(cluster) as rcq:
            rcq.delete_partition(name)


def commit_meanwhile(cluster: LocalCluster, queue: str, stop: threading.Event, outcomes: dict[str, int],
                     problems: list[BaseException]) -> None:
    """Enqueue one item per transaction until ``stop``, counting the commits acknowledged
    (``done``) and those whose outcome is unknown (``maybe``); a refusal that is not retryable ends it."""
    with client(cluster) as rcq:
        while not stop.is_set():
            try:
                with rcq.transaction() as tx:
                    tx.enqueue(queue, b"item")
                outcomes["done"] += 1
            except LeaderChanged:  # its leader moved: the transaction was aborted, nothing committed
                continue
            except Exception as exc:  # an outcome the test looks at
                if getattr(exc, "maybe_committed", False):
                    outcomes["maybe"] += 1
                elif not getattr(exc, "retryable", False):
                    problems.append(exc)
                    return


def status_of(url: str, headers: dict[str, str]) -> int:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return int(error.code)


def partition_folder(cluster: LocalCluster, i: int, name: str) -> list[Path]:
    """Node ``i``'s data folders of partition ``name`` (``<name>.<number>``)."""
    return sorted(p for p in (cluster.nodes[i].data_dir / "partitions").glob(f"{name}.*") if p.is_dir())


def test_members_are_added_removed_and_replaced_under_load_and_a_node_is_drained(cluster: LocalCluster):
    ids = [node.node_id for node in cluster.nodes]
    with client(cluster) as rcq:
        create_partition_when_ready(rcq, "m1", nodes=ids[:2])
        rcq.configure_queue("moving", partitions=["m1"])
        stop, outcomes, problems = threading.Event(), {"done": 0, "maybe": 0}, []
        writer = threading.Thread(target=commit_meanwhile, args=(cluster, "moving", stop, outcomes, problems))
        writer.start()
        try:
            wait_until(lambda: outcomes["done"] >= 20 or None, CLUSTER_WAIT_S, what="commits before the changes")
            added = rcq.add_partition_member("m1", ids[2], timeout_s=MEMBER_CHANGE_TIMEOUT_S)
            assert added["settled"] and sorted(added["raft_members"]) == sorted(ids), added
            removed = rcq.remove_partition_member("m1", ids[0], timeout_s=MEMBER_CHANGE_TIMEOUT_S)
            assert removed["settled"] and sorted(removed["raft_members"]) == sorted(ids[1:]), removed
            wait_until(lambda: not partition_folder(cluster, 0, "m1") or None, CLUSTER_WAIT_S,
                       what="node-0's data of m1 removed")
            replaced = rcq.replace_partition_member("m1", ids[1], ids[0], timeout_s=MEMBER_CHANGE_TIMEOUT_S)
            assert replaced["step"] == "done" and replaced["settled"], replaced
            assert sorted(replaced["raft_members"]) == sorted([ids[0], ids[2]]), replaced
        finally:
            stop.set()
            writer.join(timeout=CLUSTER_WAIT_S)
        assert not problems, problems
        done, maybe = outcomes["done"], outcomes["maybe"]
        assert done > 20
        assert done <= rcq.count("moving") <= done + maybe, (rcq.count("moving"), outcomes)
        committed = rcq.count("moving")
        # drain: m1 lives on node-0 and node-2; draining node-2 moves its replica to node-1
        drained = rcq.drain_node(ids[2], timeout_s=MEMBER_CHANGE_TIMEOUT_S)
        assert drained["drained"], drained
        rows = {row["name"]: row for row in rcq.partitions()}
        assert sorted(rows["m1"]["members"]) == sorted([ids[0], ids[1]])
        assert rcq.count("moving") == committed


def test_a_partition_process_takes_a_cluster_call_only_with_the_secrets_proof(cluster: LocalCluster):
    with client(cluster) as rcq:
        create_partition_when_ready(rcq, "c1", nodes=[cluster.nodes[0].node_id])
        row = next(r for r in rcq.partitions() if r["name"] == "c1")
    url = row["urls"][0]
    path = "/v1/cluster/members"
    forged = cluster_calls.sign("not-the-cluster-secret-at-all", "GET", path, b"", time.time())
    assert status_of(url + path, headers={cluster_calls.HEADER: forged}) == 401
    proof = cluster_calls.sign(cluster.secret, "GET", path, b"", time.time())
    assert status_of(url + path, headers={cluster_calls.HEADER: proof}) == 200
    stale = cluster_calls.sign(cluster.secret, "GET", path, b"", time.time() - 2 * cluster_calls.CALL_WINDOW_S)
    assert status_of(url + path, headers={cluster_calls.HEADER: stale}) == 401
    # a node's own port (p0) never takes one
    assert status_of(cluster.url(0) + path, headers={cluster_calls.HEADER: proof}) == 401
    with client(cluster) as rcq:
        rcq.delete_partition("c1")
