"""The LocalCluster harness tested on its own: its waits must be able to fail as well as succeed.

The pure decisions (who is leader, have the nodes converged) and the bounded poll are tested
on made-up views; the waits, signals and restarts on real node processes.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket
import ssl
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from rcq.client import RcqClient
from rcq.local.cluster import LocalCluster
from rcq.local.nodes import LOW_PORTS_MIN, STOP_TIMEOUT_S, LocalNode, free_ports, read_tail
from rcq.local.polls import NodeStartError, converged, deadline_loop, leader_from_views
from rcq.testing import wait_until
from tests.helpers import EXPIRING_WAIT_S, LEADER_TIMEOUT_S
from tests.helpers.cluster import fresh_queue

URLS = ["http://127.0.0.1:1", "http://127.0.0.1:2", "http://127.0.0.1:3"]


def request_json(cluster: LocalCluster, url: str, body: dict[str, Any] | None = None,
                 headers: dict[str, str] | None = None) -> dict[str, Any]:
    """GET (or POST ``body``) with the cluster's admin token (or ``headers``), its CA verifying HTTPS."""
    request = urllib.request.Request(url, data=None if body is None else json.dumps(body).encode(),
                                     method="GET" if body is None else "POST",
                                     headers={"Content-Type": "application/json",
                                              **(cluster.auth_headers() if headers is None else headers)})
    context = None if cluster.ca_file is None else ssl.create_default_context(cafile=str(cluster.ca_file))
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=context))
    with opener.open(request, timeout=15) as response:
        return dict(json.loads(response.read()))


def enqueue(cluster: LocalCluster, leader: int, queue: str, items: list[str]) -> int:
    """Commit ``items`` into ``queue`` through the leader; the commit's Raft index."""
    answer = request_json(cluster, f"{cluster.url(leader)}/v1/queues/{queue}/enqueue", {"items": items})
    assert answer["committed"] is True
    return int(answer["index"])


def count_on(cluster: LocalCluster, i: int, queue: str) -> int:
    return int(request_json(cluster, f"{cluster.url(i)}/v1/queues/{queue}")["count"])


def http_status(cluster: LocalCluster, url: str, headers: dict[str, str]) -> int:
    """The status of GET ``url`` with exactly ``headers``."""
    try:
        request_json(cluster, url, headers=headers)
    except urllib.error.HTTPError as exc:
        return exc.code
    return 200


def pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def view(role: str, leader: int | None, serving: bool = False) -> dict[str, Any]:
    return {"role": role, "serving": serving, "leader_url": None if leader is None else URLS[leader]}


# ------------------------------------------------------------ pure decisions
def test_leader_from_views_returns_the_serving_leader_a_majority_follows() -> None:
    views = {0: view("follower", 1), 1: view("leader", 1, serving=True), 2: view("follower", None)}
    assert leader_from_views(views, URLS) == 1


def test_leader_from_views_needs_a_majority_of_the_whole_cluster_not_of_those_who_answered() -> None:
    # A node cut off from the others still calls itself leader for a while: alone it is no majority.
    assert leader_from_views({1: view("leader", 1, serving=True)}, URLS) is None
    assert leader_from_views({0: view("follower", None), 1: view("leader", 1, serving=True)}, URLS) is None


def test_leader_from_views_ignores_a_leader_that_is_not_serving_yet() -> None:
    views = {0: view("follower", 1), 1: view("leader", 1, serving=False), 2: view("follower", 1)}
    assert leader_from_views(views, URLS) is None


def test_leader_from_views_picks_the_leader_the_majority_names_when_two_claim_it() -> None:
    views = {0: view("leader", 0, serving=True), 1: view("leader", 1, serving=True), 2: view("follower", 1)}
    assert leader_from_views(views, URLS) == 1


def test_leader_from_views_counts_a_majority_of_the_membership_the_leader_reports() -> None:
    # Node 0 was removed: the cluster is nodes 1 and 2, and both of them are a majority of it...
    leader = {**view("leader", 1, serving=True), "peers": [{"url": URLS[2]}]}
    assert leader_from_views({1: leader, 2: view("follower", 1)}, URLS) == 1
    # ...but not the leader alone, and the removed node's view does not count.
    assert leader_from_views({0: view("follower", 1), 1: leader, 2: view("follower", None)}, URLS) is None


def test_converged_needs_every_live_node_to_answer_the_same_digest_at_the_same_index() -> None:
    same = {"digest": "a", "applied_index": 7}
    assert converged({0: same, 1: same, 2: same}, [0, 1, 2])
    assert converged({0: same, 2: same}, [0, 2])  # node 1 is not live: not asked
    assert not converged({0: same, 1: None, 2: same}, [0, 1, 2])
    assert not converged({0: same, 2: same}, [0, 1, 2])
    assert not converged({0: same, 1: {"digest": "b", "applied_index": 7}}, [0, 1])
    assert not converged({0: same, 1: {"digest": "a", "applied_index": 8}}, [0, 1])
    assert not converged({}, [])


def test_converged_needs_each_partitions_processes_to_agree_too() -> None:
    def node(p1: dict[str, object] | None, **more: object) -> dict[str, object]:
        return {"digest": "a", "applied_index": 7, "partitions": {"p1": p1, **more}}

    p1 = {"digest": "x", "applied_index": 3}
    assert converged({0: node(p1), 1: node(p1), 2: {"digest": "a", "applied_index": 7}}, [0, 1, 2])
    assert not converged({0: node(p1), 1: node(None)}, [0, 1])  # a process that did not answer
    assert not converged({0: node(p1), 1: node({"digest": "y", "applied_index": 3})}, [0, 1])
    assert not converged({0: node(p1), 1: node(p1, p2={"digest": "z", "applied_index": 1}),
                          2: node(p1, p2={"digest": "z", "applied_index": 2})}, [0, 1, 2])


def test_a_deadline_loop_runs_at_least_once_even_with_no_time_left() -> None:
    assert sum(1 for _ in deadline_loop(0.0)) == 1


def test_the_harness_loads_nothing_of_the_server_nor_its_libraries() -> None:
    # It starts `python -m rcq serve` processes and talks HTTP; what a tokens file holds is
    # rcq.tokens (standard library only), so it needs nothing of the node, Raft or the HTTP stack.
    code = ("import sys, rcq.local.cluster; print(sorted({m.split('.')[0] if not m.startswith('rcq.') else m"
            " for m in sys.modules if m.startswith(('rcq.server', 'pysyncobj', 'lmdb', 'aiohttp', 'pydantic'))}))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.strip() == "[]", done.stdout


def test_free_ports_are_distinct_and_bindable() -> None:
    ports = free_ports(8)
    assert len(set(ports)) == 8
    for port in ports:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


def test_free_ports_lie_below_the_ephemeral_range_that_outgoing_connections_draw_from(tmp_path: Path) -> None:
    # An outgoing connection's local port comes from the ephemeral range: a port picked in it
    # could be taken by a dial before the node binds it (a CI run's "address already in use").
    range_file = tmp_path / "ip_local_port_range"
    range_file.write_text("32768\t60999\n")
    ports = free_ports(8, range_file)
    assert len(set(ports)) == 8 and all(LOW_PORTS_MIN <= p < 32768 for p in ports), ports
    range_file.write_text(f"{LOW_PORTS_MIN + 100}\t60999\n")  # no room below: the OS picks
    assert all(p >= LOW_PORTS_MIN + 100 for p in free_ports(4, range_file))
    range_file.write_text("nonsense")
    assert len(set(free_ports(4, range_file))) == 4


# --------------------------------------------------------- a real 3-node cluster

@pytest.mark.cluster
def test_wait_for_leader_returns_a_serving_leader_that_every_node_follows(healthy_cluster: LocalCluster) -> None:
    leader = healthy_cluster.wait_for_leader(LEADER_TIMEOUT_S)
    status = healthy_cluster.status(leader)
    assert (status["role"], status["serving"]) == ("leader", True)
    healthy_cluster.wait_for_applied(LEADER_TIMEOUT_S)  # followers learn the leader by its entries
    for i in range(3):
        assert healthy_cluster.status(i)["leader_url"] == healthy_cluster.url(leader)


@pytest.mark.cluster
def test_killing_the_leader_makes_wait_for_leader_find_another(healthy_cluster: LocalCluster) -> None:
    old = healthy_cluster.wait_for_leader(LEADER_TIMEOUT_S)
    pid = healthy_cluster.pids()[old]
    healthy_cluster.kill_node(old)
    assert not pid_exists(pid)
    assert old not in healthy_cluster.live_indices()
    new = healthy_cluster.wait_for_leader(LEADER_TIMEOUT_S)
    assert new != old
    assert healthy_cluster.status(new)["serving"] is True


@pytest.mark.cluster
def test_a_paused_node_is_neither_asked_nor_waited_for(healthy_cluster: LocalCluster) -> None:
    queue = fresh_queue("t")
    old = healthy_cluster.wait_for_leader(LEADER_TIMEOUT_S)
    healthy_cluster.pause_node(old)
    assert old not in healthy_cluster.live_indices()
    new = healthy_cluster.wait_for_leader(LEADER_TIMEOUT_S)
    assert new != old
    enqueue(healthy_cluster, new, queue, ["a", "b"])
    # Could never succeed if the paused node were asked: it answers nothing.
    healthy_cluster.wait_for_convergence(LEADER_TIMEOUT_S)
    healthy_cluster.resume_node(old)
    assert old in healthy_cluster.live_indices()
    healthy_cluster.wait_for_convergence(LEADER_TIMEOUT_S)
    assert count_on(healthy_cluster, old, queue) == 2
    assert healthy_cluster.status(old)["leader_url"] == healthy_cluster.url(new)


@pytest.mark.cluster
def test_leader_is_one_poll_and_none_without_a_majority(healthy_cluster: LocalCluster) -> None:
    leader = healthy_cluster.wait_for_leader(LEADER_TIMEOUT_S)
    healthy_cluster.wait_for_applied(LEADER_TIMEOUT_S)  # every follower names it by now
    assert healthy_cluster.leader() == leader
    assert set(healthy_cluster.statuses()) == {0, 1, 2}
    followers = [i for i in range(3) if i != leader]
    for i in followers:
        healthy_cluster.pause_node(i)
    assert set(healthy_cluster.statuses()) == {leader}  # paused nodes are not asked
    assert healthy_cluster.leader() is None  # its own view is no majority


@pytest.mark.cluster
def test_a_convergence_wait_on_given_nodes_waits_for_a_paused_one(healthy_cluster: LocalCluster) -> None:
    leader = healthy_cluster.wait_for_leader(LEADER_TIMEOUT_S)
    follower = (leader + 1) % 3
    healthy_cluster.pause_node(follower)
    enqueue(healthy_cluster, leader, fresh_queue("t"), ["p"])
    healthy_cluster.wait_for_convergence(LEADER_TIMEOUT_S)  # the live nodes agree
    with pytest.raises(TimeoutError, match=r"nodes \[0, 1, 2\] did not converge") as raised:
        healthy_cluster.wait_for_convergence(EXPIRING_WAIT_S, indices=range(3))
    assert "paused" in str(raised.value)
    healthy_cluster.resume_node(follower)
    agreed = healthy_cluster.wait_for_convergence(LEADER_TIMEOUT_S, indices=range(3))
    assert {(d["digest"], d["applied_index"]) for d in healthy_cluster.digests().values()} == {
        (agreed["digest"], agreed["applied_index"])}


@pytest.mark.cluster
def test_a_requested_snapshot_is_taken(healthy_cluster: LocalCluster) -> None:
    leader = healthy_cluster.wait_for_leader(LEADER_TIMEOUT_S)
    enqueue(healthy_cluster, leader, fresh_queue("t"), ["s"])
    before = int(healthy_cluster.status(leader)["snapshot_count"])
    healthy_cluster.request_snapshot(leader)
    wait_until(lambda: int(healthy_cluster.status(leader)["snapshot_count"]) > before, LEADER_TIMEOUT_S,
               what="a snapshot")


@pytest.mark.cluster
def test_wait_for_leader_times_out_without_a_majority_and_shows_what_it_saw(healthy_cluster: LocalCluster) -> None:
    leader = healthy_cluster.wait_for_leader(LEADER_TIMEOUT_S)
    followers = [i for i in range(3) if i != leader]
    for i in followers:
        healthy_cluster.pause_node(i)
    started = time.monotonic()
    with pytest.raises(TimeoutError) as raised:
        healthy_cluster.wait_for_leader(timeout_s=EXPIRING_WAIT_S)
    assert time.monotonic() - started < 10
    message = str(raised.value)
    for i in followers:
        assert f"node-{i}" in message and "paused" in message
    assert f"node-{leader}" in message and "role=" in message


@pytest.mark.cluster
def test_wait_for_applied_returns_an_index_every_live_node_has_applied(healthy_cluster: LocalCluster) -> None:
    queue = fresh_queue("t")
    leader = healthy_cluster.wait_for_leader(LEADER_TIMEOUT_S)
    index = enqueue(healthy_cluster, leader, queue, ["x", "y", "z"])
    applied = healthy_cluster.wait_for_applied(LEADER_TIMEOUT_S)
    assert applied >= index
    for i in range(3):
        assert healthy_cluster.status(i)["last_applied"] >= index
        assert count_on(healthy_cluster, i, queue) == 3


@pytest.mark.cluster
def test_a_stopped_node_exits_cleanly_and_restarts_with_its_data_and_ports(healthy_cluster: LocalCluster) -> None:
    queue = fresh_queue("t")
    leader = healthy_cluster.wait_for_leader(LEADER_TIMEOUT_S)
    follower = (leader + 1) % 3
    enqueue(healthy_cluster, leader, queue, ["before"])
    healthy_cluster.wait_for_applied(LEADER_TIMEOUT_S)
    url = healthy_cluster.url(follower)
    assert healthy_cluster.stop_node(follower) == 0  # SIGTERM is a clean shutdown
    enqueue(healthy_cluster, leader, queue, ["while-stopped"])
    healthy_cluster.start_node(follower)
    assert healthy_cluster.url(follower) == url
    healthy_cluster.wait_for_convergence(LEADER_TIMEOUT_S)
    assert count_on(healthy_cluster, follower, queue) == 2
    assert "start #2 of node-" in healthy_cluster.log_tail(follower, 100_000)


@pytest.mark.cluster
def test_sigusr1_writes_every_threads_stack_into_the_node_log_and_the_node_goes_on(
        healthy_cluster: LocalCluster) -> None:
    leader = healthy_cluster.wait_for_leader(LEADER_TIMEOUT_S)
    node = healthy_cluster.nodes[(leader + 1) % 3]
    assert node.process is not None
    node.process.send_signal(signal.SIGUSR1)
    wait_until(lambda: "(most recent call first)" in read_tail(node.log_path, 100_000), LEADER_TIMEOUT_S,
               what="the stacks in the node log")
    dump = read_tail(node.log_path, 100_000)
    assert dump.count("hread 0x") >= 2  # every thread: the loop and the tick guard ("Current thread 0x...")
    assert "cmd_serve" in dump and "_guard_ticks" in dump and node.running()  # the loop, the guard
    queue = fresh_queue("t")
    enqueue(healthy_cluster, leader, queue, ["after the dump"])
    healthy_cluster.wait_for_applied(LEADER_TIMEOUT_S)
    assert count_on(healthy_cluster, (leader + 1) % 3, queue) == 1


STUCK_NODE = """
import faulthandler, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
faulthandler.register(signal.SIGUSR1, all_threads=True)
def stuck_in_shutdown():
    print("ready", file=sys.stderr, flush=True)
    while True:
        time.sleep(0.05)
stuck_in_shutdown()
"""


def test_a_node_that_ignores_sigterm_leaves_its_stacks_in_the_stops_warning_then_is_killed(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    node = LocalNode(0, "node-0", 1, 2, tmp_path)
    with open(node.log_path, "ab") as log_file:
        node.process = subprocess.Popen([sys.executable, "-c", STUCK_NODE], stdin=subprocess.DEVNULL,
                                        stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True)
    wait_until(lambda: "ready" in read_tail(node.log_path), LEADER_TIMEOUT_S, what="the stuck process's handlers")
    node.request_stop()
    with caplog.at_level(logging.WARNING, logger="rcq.local.nodes"):
        node.finish_stop(0.2)
    warning = next(r.getMessage() for r in caplog.records if "ignored SIGTERM" in r.getMessage())
    assert "(most recent call first)" in warning and "stuck_in_shutdown" in warning, warning
    assert node.process is None or node.process.poll() is not None


@pytest.mark.cluster
def test_a_wiped_node_gets_the_whole_state_back_from_its_peers(healthy_cluster: LocalCluster) -> None:
    queue = fresh_queue("t")
    leader = healthy_cluster.wait_for_leader(LEADER_TIMEOUT_S)
    follower = (leader + 2) % 3
    enqueue(healthy_cluster, leader, queue, ["kept-1", "kept-2"])
    healthy_cluster.wait_for_applied(LEADER_TIMEOUT_S)
    with pytest.raises(RuntimeError, match="stop"):
        healthy_cluster.wipe_node(follower)  # refused while it runs
    healthy_cluster.stop_node(follower)
    healthy_cluster.wipe_node(follower)
    assert not healthy_cluster.nodes[follower].data_dir.exists()
    healthy_cluster.start_node(follower)
    healthy_cluster.wait_for_convergence(LEADER_TIMEOUT_S)
    assert count_on(healthy_cluster, follower, queue) == 2


@pytest.mark.cluster
def test_configs_are_private_and_the_secret_never_reaches_a_command_line(cluster: LocalCluster) -> None:
    assert cluster.secret is not None
    for node in cluster.nodes:
        assert stat.S_IMODE(node.config_path.stat().st_mode) == 0o600
        assert json.loads(node.config_path.read_text())["cluster_secret"] == cluster.secret
    for pid in cluster.pids().values():
        command_line = Path(f"/proc/{pid}/cmdline").read_bytes()
        assert b"serve" in command_line and cluster.secret.encode() not in command_line


# ------------------------------------------------------- lifecycles of its own
@pytest.mark.cluster
def test_close_stops_every_node_even_a_paused_one_and_removes_its_temp_dir() -> None:
    local_cluster = LocalCluster(nodes=1)
    with local_cluster:
        local_cluster.wait_for_leader(LEADER_TIMEOUT_S)
        pid = local_cluster.pids()[0]
        local_cluster.pause_node(0)
        base_dir = local_cluster.base_dir
        started = time.monotonic()
    # A paused node keeps SIGTERM pending: without a SIGCONT first, close would need the SIGKILL bound.
    assert time.monotonic() - started < STOP_TIMEOUT_S
    assert not pid_exists(pid)
    assert not base_dir.exists()


@pytest.mark.cluster
def test_wait_for_convergence_times_out_while_a_live_node_lags_then_succeeds() -> None:
    # Slow elections hold a restarted node behind for seconds. (A paused follower would not do:
    # the kernel keeps receiving the leader's entries for it, and it applies them on SIGCONT.)
    slow_elections = {"raft_timeout_min_s": 5.0, "raft_timeout_max_s": 6.0, "connection_timeout_s": 6.0}
    with LocalCluster(nodes=3, node_overrides=slow_elections) as local_cluster:
        queue = fresh_queue("t")
        leader = local_cluster.wait_for_leader(LEADER_TIMEOUT_S)
        lagging, other = (i for i in range(3) if i != leader)
        local_cluster.stop_node(lagging)
        enqueue(local_cluster, leader, queue, ["1", "2", "3"])
        local_cluster.wait_for_applied(LEADER_TIMEOUT_S)  # `other` has applied the items
        # With the leader paused, the restarted node cannot catch up until `other` wins an
        # election, at least raft_timeout_min_s (5 s) from now: the two live nodes differ meanwhile.
        local_cluster.pause_node(leader)
        local_cluster.start_node(lagging)
        with pytest.raises(TimeoutError, match="did not converge") as raised:
            local_cluster.wait_for_convergence(timeout_s=EXPIRING_WAIT_S)
        assert "digest=" in str(raised.value)
        converged_at = local_cluster.wait_for_convergence(LEADER_TIMEOUT_S)
        assert count_on(local_cluster, lagging, queue) == 3
        assert local_cluster.wait_for_leader(LEADER_TIMEOUT_S) == other
        local_cluster.resume_node(leader)
        final = local_cluster.wait_for_convergence(LEADER_TIMEOUT_S)
        assert final["applied_index"] >= converged_at["applied_index"]


@pytest.mark.cluster
def test_a_node_that_cannot_start_fails_start_with_its_log_and_is_cleaned_up() -> None:
    local_cluster = LocalCluster(nodes=1, node_overrides={"item_bytes_max": 0})
    with pytest.raises(NodeStartError, match="invalid node configuration"):
        with local_cluster:
            pytest.fail("started a node with an invalid configuration")
    assert not local_cluster.base_dir.exists()
    assert local_cluster.pids() == {}


@pytest.mark.cluster
def test_reopen_restarts_the_cluster_with_its_ports_secret_tokens_and_queues(tmp_path: Path) -> None:
    base_dir = tmp_path / "cluster"
    with LocalCluster(nodes=1, base_dir=base_dir) as first:
        enqueue(first, first.wait_for_leader(LEADER_TIMEOUT_S), "kept", ["a", "b", "c"])
        reader = first.add_token("reader", grants=[{"queues": "kept", "actions": ["consume"]}])
        url, secret, token = first.url(0), first.secret, first.token
    assert base_dir.exists()  # a directory the caller gave is never removed
    with pytest.raises(FileExistsError):
        LocalCluster(nodes=1, base_dir=base_dir)
    with LocalCluster.reopen(base_dir) as second:
        leader = second.wait_for_leader(LEADER_TIMEOUT_S)
        assert (second.url(0), second.secret, second.token) == (url, secret, token)
        assert count_on(second, leader, "kept") == 3
        assert request_json(second, f"{second.url(leader)}/v1/queues/kept",
                            headers={"Authorization": f"Bearer {reader}"})["count"] == 3


# ------------------------------------------------------------ tokens and TLS
@pytest.mark.cluster
def test_an_auth_cluster_refuses_requests_without_its_tokens_and_keeps_them_private(cluster: LocalCluster) -> None:
    assert cluster.auth and cluster.token is not None and cluster.token.startswith("rcq_")
    url = f"{cluster.url(0)}/v1/queues"
    assert http_status(cluster, url, {}) == 401
    assert http_status(cluster, url, {"Authorization": "Bearer rcq_not-a-token"}) == 401
    assert http_status(cluster, url, cluster.auth_headers()) == 200
    assert request_json(cluster, f"{cluster.url(0)}/healthz", headers={})["ok"]  # probes need no token
    token_file = cluster.base_dir / "admin.token"
    assert token_file.read_text().strip() == cluster.token
    for path in [token_file, *(node.tokens_path for node in cluster.nodes)]:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    for node in cluster.nodes:  # hashed only
        assert cluster.token not in node.tokens_path.read_text() + node.config_path.read_text()
        assert json.loads(node.config_path.read_text())["tokens_file"] == str(node.tokens_path)
    for pid in cluster.pids().values():
        assert cluster.token.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes()
    assert cluster.client_options() == {"token": cluster.token, "ca_file": None}


@pytest.mark.cluster
def test_added_tokens_work_at_once_on_every_node_with_their_grants_and_revoked_ones_stop(
        cluster: LocalCluster) -> None:
    leader = cluster.wait_for_leader(LEADER_TIMEOUT_S)
    queue = fresh_queue("t")
    enqueue(cluster, leader, queue, ["x"])
    cluster.wait_for_applied(LEADER_TIMEOUT_S)
    reader = cluster.add_token("reader", grants=[{"queues": "t-*", "actions": ["consume"]}])
    for i in range(3):  # add_token waited until every node re-read its tokens file
        answer = request_json(cluster, f"{cluster.url(i)}/v1/queues/{queue}",
                              headers={"Authorization": f"Bearer {reader}"})
        assert answer["count"] == 1
    assert http_status(cluster, f"{cluster.url(leader)}/metrics", {"Authorization": f"Bearer {reader}"}) == 403
    expired = cluster.add_token("late", admin=True, expires_at=datetime.now(UTC) - timedelta(minutes=1))
    assert http_status(cluster, f"{cluster.url(leader)}/v1/queues", {"Authorization": f"Bearer {expired}"}) == 401
    assert cluster.revoke_token("reader") == 1
    for i in range(3):
        assert http_status(cluster, f"{cluster.url(i)}/v1/queues/{queue}",
                           {"Authorization": f"Bearer {reader}"}) == 401
    assert cluster.revoke_token("late") == 1
    assert http_status(cluster, f"{cluster.url(leader)}/v1/queues", cluster.auth_headers()) == 200


@pytest.mark.cluster
def test_a_tls_cluster_serves_https_that_its_ca_verifies_and_nothing_else() -> None:
    with LocalCluster(nodes=1, tls=True) as local_cluster:
        leader = local_cluster.wait_for_leader(LEADER_TIMEOUT_S)
        assert local_cluster.urls == [local_cluster.url(0)] and local_cluster.url(0).startswith("https://127.0.0.1:")
        assert local_cluster.ca_file is not None
        for key in (local_cluster.base_dir / "tls").glob("*.key"):
            assert stat.S_IMODE(key.stat().st_mode) == 0o600, key
        enqueue(local_cluster, leader, "secure", ["s"])
        local_cluster.wait_for_convergence(LEADER_TIMEOUT_S)  # the harness's polls verify the CA too
        untrusted = ssl.create_default_context()  # the system's CAs do not know the cluster's
        with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
            urllib.request.build_opener(urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(
                context=untrusted)).open(f"{local_cluster.url(0)}/healthz", timeout=15)

        async def with_the_client() -> int:
            async with RcqClient(local_cluster.urls, **local_cluster.client_options()) as client:
                return await client.count("secure")

        assert asyncio.run(with_the_client()) == 1


@pytest.mark.cluster
def test_a_cluster_without_auth_needs_no_token() -> None:
    with LocalCluster(nodes=1, auth=False) as local_cluster:
        leader = local_cluster.wait_for_leader(LEADER_TIMEOUT_S)
        assert (local_cluster.token, local_cluster.auth_headers()) == (None, {})
        assert not local_cluster.nodes[0].tokens_path.exists()
        assert not (local_cluster.base_dir / "admin.token").exists()
        enqueue(local_cluster, leader, "open", ["o"])
        assert http_status(local_cluster, f"{local_cluster.url(0)}/v1/queues/open", {}) == 200
        with pytest.raises(RuntimeError, match="without tokens"):
            local_cluster.add_token("nobody")
