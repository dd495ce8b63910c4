"""Partitions created online in a running cluster (docs/partitions.md): nodes with partition_ports
record them, p0's leader creates a partition in the directory, each member node starts its process,
the partition elects and commits on its own ports, and the listing names its leader on any node.
A node killed -9 takes its partition processes with it; restarted, it starts them again."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from typing import Any

import pytest

from rcq.client import CrossPartitionTransaction, QueueNotFound, QueuePlacementFixed, RcqClient
from rcq.local.cluster import LocalCluster
from rcq.local.nodes import free_port_range
from rcq.testing import wait_until
from tests.helpers import CLUSTER_WAIT_S, LEADER_TIMEOUT_S
from tests.helpers.cli import rcq
from tests.helpers.cluster import wait_settled
from tests.helpers.processes import children_of, process_alive

pytestmark = pytest.mark.cluster


NAMED = "named"  # a partition every node gives ports of its own (partition_port_map)


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    local = LocalCluster(3, partitions_max=8, node_overrides={"balance_leaders": False})  # leaders stay put
    for i in range(3):
        http_port, raft_port = free_port_range(2)
        local.set_node_override(i, partition_port_map={NAMED: {"http": http_port, "raft": raft_port}})
    with local:
        leader = local.wait_for_leader(LEADER_TIMEOUT_S)
        wait_settled(local, leader)
        yield local


def listing(cluster: LocalCluster, i: int = 0) -> list[dict[str, Any]]:
    return cluster.poll_json(cluster.url(i) + "/v1/cluster/partitions")["partitions"]


def create(cluster: LocalCluster, body: dict[str, Any]) -> dict[str, Any]:
    """POST /v1/cluster/partitions to the leader: the created partition, or the error body."""
    leader = cluster.wait_for_leader(LEADER_TIMEOUT_S)
    return cluster.poll_json(cluster.url(leader) + "/v1/cluster/partitions", method="POST", body=body)


def created(cluster: LocalCluster, body: dict[str, Any]) -> dict[str, Any]:
    """Create a partition once every node's ports are recorded (the leader records them within a
    turn of its feature-level loop, 5 s); its listing entry."""
    def attempt() -> dict[str, Any] | None:
        answer = create(cluster, body)
        if answer.get("error", {}).get("code") == "node_has_no_partition_ports":
            return None
        assert "error" not in answer, answer
        return answer

    return wait_until(attempt, CLUSTER_WAIT_S, what=f"partition {body['name']} created")


def led(cluster: LocalCluster, name: str, i: int) -> dict[str, Any]:
    def row() -> dict[str, Any] | None:
        found = {r["name"]: r for r in listing(cluster, i)}[name]
        return found if found["leader_url"] else None

    return wait_until(row, LEADER_TIMEOUT_S, what=f"{name} led, as node-{i} lists it")


def _answer(url: str, cluster: LocalCluster) -> dict[str, Any] | None:
    """``url``'s JSON answer once it has a leader to name, None while nothing listens there yet."""
    try:
        answer = cluster.poll_json(url)
    except OSError:  # not listening yet
        return None
    return answer if answer.get("leader_id") else None


def put_queue(cluster: LocalCluster, url: str, queue: str, body: dict[str, Any]) -> dict[str, Any]:
    return cluster.poll_json(f"{url}/v1/queues/{queue}", method="PUT", body=body)


async def test_a_partition_created_online_runs_on_its_members_and_holds_the_queues_placed_in_it(
        cluster: LocalCluster) -> None:
    p1 = created(cluster, {"name": "p1", "replicas": 3})
    assert (p1["name"], p1["number"], sorted(p1["members"])) == ("p1", 1, ["node-0", "node-1", "node-2"])
    row = led(cluster, "p1", 2)
    assert [r["name"] for r in listing(cluster, 1)] == ["p0", "p1"]
    assert row["leader_url"] not in cluster.urls  # its own process, on its own port
    leader = cluster.url(cluster.wait_for_leader(LEADER_TIMEOUT_S))

    # Placed through p0's leader: p1's leader creates the queue in p1's log.
    placed = put_queue(cluster, leader, "in-p1", {"partitions": ["p1"], "max_items": 10})
    assert placed["settings"]["partitions"] == ["p1"] and placed["settings"]["max_items"] == 10, placed
    assert put_queue(cluster, leader, "in-p1", {"max_items": 20})["settings"]["max_items"] == 20  # kept in p1
    async with RcqClient([row["leader_url"]], retry_timeout_s=CLUSTER_WAIT_S, **cluster.client_options()) as client:
        await client.enqueue("in-p1", "x")
        assert await client.dequeue("in-p1") == [b"x"]
        # A queue never placed in p1 is not created by a first enqueue there.
        with pytest.raises(QueueNotFound, match="is not in partition p1"):
            await client.enqueue("stray", "y")
    # p0 holds no such queue, and refuses a transaction of its own on it.
    listed = {q["queue"]: q for q in cluster.poll_json(leader + "/v1/queues")["queues"]}
    assert listed["in-p1"]["partition"] == "p1"  # listed from p1's leader: p0 holds nothing of it
    async with RcqClient(cluster.urls, retry_timeout_s=CLUSTER_WAIT_S, **cluster.client_options()) as client:
        tx = await client.begin(partition="p0")
        await client.enqueue("in-p1", "z")  # p0 answers 421 naming p1; the client sends it there
        assert await client.count("in-p1") == 1
        with pytest.raises(CrossPartitionTransaction, match="lives in partition p1") as refused:
            await tx.enqueue("in-p1", "no")  # the client knows where in-p1 lives now: nothing is sent
        assert refused.value.details == {"queue": "in-p1", "queue_partitions": ["p1"], "transaction_partition": "p0"}
        await tx.enqueue("in-p0", "yes")  # and the transaction is still usable
        await tx.abort()
        assert await client.dequeue("in-p1") == [b"z"]
    # A placement is fixed; a partition takes no queue behind p0's back.
    assert put_queue(cluster, leader, "in-p1", {"partitions": ["p0"]})["error"]["code"] == "queue_placement_fixed"
    assert put_queue(cluster, leader, "other", {"partitions": ["p9"]})["error"]["code"] == "partition_not_found"
    assert put_queue(cluster, leader, "other", {"partitions": ["p1", "p1"]})["error"]["code"] == "invalid_request"
    assert put_queue(cluster, row["leader_url"], "sneaky", {})["error"]["code"] == "queue_not_found"
    assert put_queue(cluster, leader, "in-p0", {"partitions": ["p0"]})["settings"]["partitions"] == ["p0"]


def test_refusals_name_what_is_wrong_and_create_nothing(cluster: LocalCluster) -> None:
    created(cluster, {"name": "p2", "nodes": ["node-0"]})

    def with_p2() -> list[dict[str, Any]] | None:
        rows = listing(cluster)
        return rows if "p2" in [r["name"] for r in rows] else None

    before = wait_until(with_p2, CLUSTER_WAIT_S, what="node-0 listing p2")
    for body, code in [({"name": "p0"}, "invalid_request"), ({"name": "p2"}, "partition_exists"),
                       ({"name": "Bad/Name"}, "invalid_request"), ({"name": "p3", "nodes": ["node-7"]}, "invalid_request"),
                       ({"name": "p3", "replicas": 4}, "node_has_no_partition_ports")]:
        assert create(cluster, body)["error"]["code"] == code, body
    assert [r["name"] for r in listing(cluster)] == [r["name"] for r in before]


def test_a_node_killed_alone_takes_its_partition_processes_and_a_restart_brings_them_back(
        cluster: LocalCluster) -> None:
    created(cluster, {"name": "p4", "replicas": 3})
    led(cluster, "p4", 0)
    node = 1
    hosted = [r["name"] for r in listing(cluster) if r["name"] != "p0" and "node-1" in r["members"]]
    pid = cluster.nodes[node].pid
    assert pid is not None and "p4" in hosted
    children = wait_until(lambda: children_of(pid) if len(children_of(pid)) == len(hosted) else None,
                          CLUSTER_WAIT_S, what=f"node-1 running a process for each of {hosted}")
    os.kill(pid, signal.SIGKILL)  # the node's process alone, not its group: the children must follow
    wait_until(lambda: not any(process_alive(child) for child in children), CLUSTER_WAIT_S,
               what="node-1's partition processes gone with it")
    cluster.kill_node(node)  # reaps it
    cluster.start_node(node)
    new_pid = cluster.nodes[node].pid
    assert new_pid is not None
    wait_until(lambda: len(children_of(new_pid)) == len(hosted), CLUSTER_WAIT_S,
               what="node-1's partitions started again")
    for name in hosted:
        led(cluster, name, node)


async def test_the_client_and_the_cli_place_a_queue_and_a_second_placement_is_refused(
        cluster: LocalCluster, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    created(cluster, {"name": "p5", "replicas": 2})
    row = led(cluster, "p5", 0)
    async with RcqClient(cluster.urls, retry_timeout_s=CLUSTER_WAIT_S, **cluster.client_options()) as client:
        answer = await client.configure_queue("by-client", max_items=5, partitions=["p5"])
        assert answer["settings"]["partitions"] == ["p5"] and answer["settings"]["max_items"] == 5, answer
        with pytest.raises(QueuePlacementFixed, match="fixed when it is created"):
            await client.configure_queue("by-client", partitions=["p0"])
    assert cluster.token is not None
    monkeypatch.setenv("RCQ_TOKEN", cluster.token)
    code, out, err = await rcq(capsys, "queue", "configure", "by-cli", "--partitions", "p5", "--json",
                               *(arg for url in cluster.urls for arg in ("--url", url)))
    assert code == 0 and json.loads(out)["settings"]["partitions"] == ["p5"], (out, err)
    async with RcqClient([row["leader_url"]], retry_timeout_s=CLUSTER_WAIT_S, **cluster.client_options()) as client:
        for queue in ("by-client", "by-cli"):
            await client.enqueue(queue, "v")
            assert await client.count(queue) == 1


def test_a_partition_named_in_the_nodes_port_maps_serves_at_those_ports(cluster: LocalCluster) -> None:
    ports = {i: cluster.node_settings[i]["partition_port_map"][NAMED] for i in range(3)}
    stated = cluster.poll_json(cluster.url(0) + "/healthz")["partition_ports"]
    assert stated["named"] == [[NAMED, ports[0]["http"], ports[0]["raft"], ports[0]["http"], ports[0]["raft"]]]
    created(cluster, {"name": NAMED})
    row = led(cluster, NAMED, 1)
    assert sorted(row["urls"]) == sorted(f"http://127.0.0.1:{p['http']}" for p in ports.values()), row
    for i in range(3):  # each member's process serves at its node's named port, once it has started
        answer = wait_until(lambda i=i: _answer(f"http://127.0.0.1:{ports[i]['http']}/readyz", cluster),
                            CLUSTER_WAIT_S, what=f"node-{i}'s process of {NAMED} answering")
        assert answer["node_id"] == f"node-{i}" and answer["leader_id"] == row["leader_id"], answer
    placed = cluster.poll_json(cluster.url(2) + "/v1/queues/in-named", method="PUT", body={"partitions": [NAMED]})
    assert placed["settings"]["partitions"] == [NAMED], placed
    enqueued = cluster.poll_json(cluster.url(0) + "/v1/queues/in-named/enqueue", method="POST", body={"items": ["x"]})
    assert enqueued["transaction_id"].startswith(f"{NAMED}."), enqueued


async def test_rcq_partition_creates_lists_and_deletes_and_a_deleted_partitions_data_goes(
        cluster: LocalCluster, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """create answers once the partition is led; delete refuses while a queue lives there; once
    deleted, its members stop its processes and remove its data, and a partition created anew
    under its name starts empty."""
    assert cluster.token is not None
    monkeypatch.setenv("RCQ_TOKEN", cluster.token)
    urls = [arg for url in cluster.urls for arg in ("--url", url)]
    code, out, err = await rcq(capsys, "partition", "create", "gone", "--replicas", "2", "--json", *urls)
    created = json.loads(out) if code == 0 else {}
    assert code == 0 and created["leader_id"] in created["members"] and len(created["members"]) == 2, (out, err)
    code, out, _ = await rcq(capsys, "partition", "list", *urls)
    assert code == 0 and any(line.split()[:2] == ["gone", ",".join(created["members"])] for line in out.splitlines())
    members = [int(m.rsplit("-", 1)[1]) for m in created["members"]]
    folder = f"gone.{created['number']}"
    assert all((cluster.nodes[i].data_dir / "partitions" / folder).is_dir() for i in members)

    assert put_queue(cluster, cluster.url(0), "in-gone", {"partitions": ["gone"]})["settings"]["partitions"] == ["gone"]
    async with RcqClient(cluster.urls, retry_timeout_s=CLUSTER_WAIT_S, **cluster.client_options()) as client:
        await client.enqueue("in-gone", "v")
    code, out, err = await rcq(capsys, "partition", "delete", "gone", *urls)
    assert code != 0 and "partition_not_empty" in err and "in-gone" in err and "rcq queue delete" in err, (out, err)
    assert "gone" in [row["name"] for row in listing(cluster)]
    assert cluster.poll_json(cluster.url(1) + "/v1/queues/in-gone", method="DELETE").get("deleted") is not None
    code, out, err = await rcq(capsys, "partition", "delete", "gone", *urls)
    assert code == 0 and "deleted partition gone" in out, (out, err)
    wait_until(lambda: "gone" not in [row["name"] for row in listing(cluster, 2)], CLUSTER_WAIT_S,
               what="node-2 applied the delete")
    wait_until(lambda: all("gone" not in cluster.partition_processes(i)
                           and not (cluster.nodes[i].data_dir / "partitions" / folder).exists() for i in members),
               CLUSTER_WAIT_S, what="the deleted partition's processes stopped and its data removed")
    code, out, err = await rcq(capsys, "partition", "delete", "gone", *urls)
    assert code != 0 and "partition_not_found" in err, (out, err)
    code, out, err = await rcq(capsys, "partition", "delete", "p0", *urls)
    assert code != 0 and "cannot be deleted" in err, (out, err)

    async with RcqClient(cluster.urls, retry_timeout_s=CLUSTER_WAIT_S, **cluster.client_options()) as client:
        again = await client.create_partition("gone", replicas=2)
        assert again["number"] > created["number"] and again["leader_id"], again
        await client.configure_queue("in-gone", partitions=["gone"])
        assert await client.count("in-gone") == 0  # a new group: nothing of the old one's
