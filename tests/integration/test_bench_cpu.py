"""``python -m bench --cpu`` against a running cluster: the nodes' PIDs found from their ports,
and CPU per transaction by process in the printed table and the JSON report; ``python -m
bench.threads`` against the same cluster: each node's process, its Raft role and its threads.

Must not import: a test module.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.__main__ import main
from bench.cpu import local_pids
from bench.threads import main as threads_main
from rcq.local.cluster import LocalCluster

pytestmark = pytest.mark.cluster


def test_the_nodes_pids_are_found_from_the_ports_they_listen_on(cluster: LocalCluster) -> None:
    assert local_pids(cluster.urls) == {cluster.url(i): pid for i, pid in cluster.pids().items()}


def test_bench_cpu_reports_the_leader_each_follower_and_the_client(
        cluster: LocalCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("RCQ_TOKEN", cluster.client_options()["token"])
    monkeypatch.delenv("RCQ_CA_FILE", raising=False)
    report_path = tmp_path / "bench.json"
    assert main(["--urls", ",".join(cluster.urls), "--scenarios", "enqueue-1", "--callers", "separate",
                 "--concurrency", "4", "--duration-s", "1", "--cpu", "--json", str(report_path)]) == 0

    row = json.loads(report_path.read_text())["(the cluster's own)"]["throughput"][0]
    cpu = row["cpu"]
    leader_id = cpu["leader_id"]
    followers = sorted(node.node_id for node in cluster.nodes if node.node_id != leader_id)
    assert list(cpu["us_per_tx"]) == ["leader", *followers, "client"]
    assert row["errors"] == 0 and cpu["transactions"] > 0 and row["transport"] == "channel"
    assert all(us > 0 for us in cpu["us_per_tx"].values()), cpu
    assert cpu["commits_per_entry"] >= 1.0
    assert "notes" not in cpu, cpu["notes"]

    out = capsys.readouterr().out
    assert "CPU per transaction by process" in out
    expected = f"{leader_id} {cpu['us_per_tx']['leader']}"
    assert any(line.split()[:2] == ["enqueue-1", "separate"] and expected in line
               and all(f"{follower} {cpu['us_per_tx'][follower]}" in line for follower in followers)
               for line in out.splitlines()), out


def test_bench_threads_names_each_nodes_process_its_raft_role_and_its_loop_thread(
        cluster: LocalCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pids = [pid for _index, pid in sorted(cluster.pids().items())]
    report_path = tmp_path / "threads.json"
    assert threads_main(["--pids", ",".join(map(str, pids)), "--urls", ",".join(cluster.urls),
                         "--token", cluster.client_options()["token"], "--window-s", "0.3",
                         "--json", str(report_path)]) == 0

    report = json.loads(report_path.read_text())
    rows = {row["node"]: row for row in report["processes"]}
    assert sorted(rows) == sorted(node.node_id for node in cluster.nodes)
    assert [rows[node.node_id]["pid"] for node in cluster.nodes] == pids
    roles = sorted(row["role"] for row in rows.values())
    assert roles == ["follower", "follower", "leader"] and all(row["partition"] == "p0" for row in rows.values())
    assert all(row["core_pct"] >= 0 for row in rows.values())
    assert report["machine_busy_pct"] >= 0 and report["window_s"] >= 0.3
    out = capsys.readouterr().out
    assert all(f"{node.node_id}/p0" in out for node in cluster.nodes), out
