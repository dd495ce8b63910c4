"""Whole chaos runs against real clusters: the short seeded CI run must pass, and the
harness must have teeth (a node that forgets acknowledged commits is caught)."""

from __future__ import annotations

import json

import pytest

from chaos.__main__ import main
from chaos.runner import Progress, RunConfig, run
from cluster.engine import docker_problem
from tests.helpers.chaos_runs import describe, require_valid

pytestmark = pytest.mark.chaos

CI_SEED = 20240603
SAFETY_CHECKERS = ("total_queue", "atomicity", "aborted_return", "convergence")


@pytest.mark.timeout(420)
def test_a_short_seeded_run_with_kill_pause_partition_client_drops_and_upgrades_is_valid(tmp_path):
    """Upgrades: nodes restarted into the previous release of rcq and back during the other faults."""
    config = RunConfig(nodes=3, time_limit_s=60, nemesis=["kill", "pause", "partition", "client-drop", "upgrade"],
                       seed=CI_SEED, out=tmp_path, workers=5)
    document = run(config, Progress(quiet=True))
    results = document["results"]
    assert {"history.jsonl", "results.json", "summary.txt", "timeline.png"} <= {p.name for p in tmp_path.iterdir()}
    assert results["liveness"]["faults_count"] >= 3, describe(document)
    assert nemesis_lines(tmp_path, "downgrade", "start"), "no node was restarted into the previous release"
    assert results["stats"]["client_ops"] > 100, describe(document)
    assert results["stats"]["one_request_enqueues_by_type"].get("ok", 0) > 10, describe(document)  # retry keys
    assert results["runtime"]["drain"]["complete"], describe(document)
    require_valid(document, SAFETY_CHECKERS)


def nemesis_lines(out, f: str, phase: str) -> list[dict]:
    lines = [json.loads(line) for line in (out / "history.jsonl").read_text().splitlines() if line.strip()]
    return [line["value"] for line in lines
            if line.get("process") == "nemesis" and line.get("f") == f and line["value"].get("phase") == phase]


@pytest.mark.timeout(420)
def test_a_leader_deposed_with_commits_in_flight_and_healed_into_a_snapshot_install_acknowledges_nothing_lost(
        tmp_path):
    """The pattern of chaos seed 90413, made on purpose: a leader cut off from its peers (clients
    still reach it, so its commits are in flight), lossy links among the others, a new leader
    that compacts its log, the old leader rejoining through a snapshot install."""
    config = RunConfig(nodes=3, time_limit_s=60, nemesis=["deposed-leader"], seed=CI_SEED + 1, out=tmp_path,
                       workers=5)
    document = run(config, Progress(quiet=True))
    results = document["results"]
    stops = nemesis_lines(tmp_path, "deposed-leader", "stop")
    assert len(stops) >= 3, describe(document)
    assert any(stop.get("snapshot_installed") for stop in stops), stops
    assert results["stats"]["client_ops"] > 100, describe(document)
    assert results["runtime"]["drain"]["complete"], describe(document)
    require_valid(document, SAFETY_CHECKERS)


@pytest.mark.timeout(420)
def test_queues_over_three_partitions_with_partition_processes_killed_lose_nothing_and_commit_in_one(tmp_path):
    """docs/partitions.md: queues placed in p0, p1 and p2; transactions over two of them, refused
    when they span partitions; partition processes killed -9 on live nodes, nodes killed and paused;
    backup sets taken meanwhile, restored and checked against each partition's probe (docs/chaos.md)."""
    config = RunConfig(nodes=3, time_limit_s=45, nemesis=["kill-partition-process", "kill", "pause", "backup"],
                       seed=CI_SEED + 3, out=tmp_path, workers=5, partitions=3)
    document = run(config, Progress(quiet=True))
    results = document["results"]
    partitions = results["partitions"]
    assert partitions["checked"] and set(partitions["placement"].values()) == {"p0", "p1", "p2"}, describe(document)
    assert partitions["cross_partition"].get("refused", 0) >= 5, describe(document)
    assert partitions["partition_processes_killed"] >= 1, describe(document)
    assert all(partitions["acknowledged_by_partition"].get(p, 0) > 10 for p in ("p0", "p1", "p2")), describe(document)
    assert set(results["convergence"]["partitions"]) == {"p1", "p2"}, describe(document)
    assert results["runtime"]["drain"]["complete"], describe(document)
    backups = results["backups"]
    assert backups["sets_taken"] >= 1 and backups["restores_checked"] >= 1, describe(document)
    require_valid(document, (*SAFETY_CHECKERS, "partitions", "backups"))


@pytest.mark.timeout(420)
def test_partitions_frozen_leaders_moved_and_partitions_made_and_deleted_during_faults_lose_nothing(tmp_path):
    """docs/partitions.md: a partition's process frozen (its leader's, mostly), leaders piled on a
    node and spread again by the balancer, partitions created, filled and deleted, mixed: every item
    acknowledged in a new partition was there when its queue was deleted."""
    config = RunConfig(nodes=3, time_limit_s=45,
                       nemesis=["pause-partition-process", "move-leaders", "partition-lifecycle"],
                       # its first three fault windows draw all three kinds (the kinds are seeded; how many
                       # windows fit in the time limit is not: a loaded machine ran 6 where another ran 8)
                       seed=CI_SEED + 38, out=tmp_path, workers=5, partitions=3)
    document = run(config, Progress(quiet=True))
    partitions = document["results"]["partitions"]
    assert partitions["partition_processes_paused"] >= 1, describe(document)
    assert partitions["leaders_moved_by_hand"] >= 1, describe(document)
    assert partitions["lifecycles_checked"] >= 1 and partitions["lifecycle_acknowledged"] >= 1, describe(document)
    assert not partitions["lifecycle_lost"] and not partitions["lifecycle_extra"], describe(document)
    assert document["results"]["runtime"]["drain"]["complete"], describe(document)
    require_valid(document, (*SAFETY_CHECKERS, "partitions"))


@pytest.mark.timeout(420)
def test_spread_queues_under_partition_faults_deliver_every_item_once_and_a_lone_consumer_drains_every_fragment(
        tmp_path):
    """docs/partitions.md, "Spread queues": s0 and s1 spread over p0, p1 and p2 beside queues placed in
    one, transactions in a named fragment, by partition key or as the client chooses, moves between
    the two spread queues; partition processes killed and frozen, nodes killed; then the starvation
    probe: one consumer alone drains every fragment within its bound."""
    config = RunConfig(nodes=3, time_limit_s=35, nemesis=["kill-partition-process", "pause-partition-process", "kill"],
                       seed=CI_SEED + 39, out=tmp_path, workers=5, partitions=3, spread_queues=2)
    document = run(config, Progress(quiet=True))
    results = document["results"]
    partitions = results["partitions"]
    spread = partitions["spread"]
    assert spread["checked"] and set(partitions["spread_placement"]) == {"s0", "s1", "s0-dlq", "spread-probe"}, \
        describe(document)
    for queue in ("s0", "s1"):
        assert all(spread["acknowledged_by_fragment"][queue].get(p, 0) >= 5 for p in ("p0", "p1", "p2")), \
            describe(document)
    assert (spread["lost_count"], spread["duplicated_count"], spread["wrong_fragment_count"]) == (0, 0, 0)
    rounds = spread["starvation"]["rounds"]
    assert [r["mode"] for r in rounds] == ["one-request", "receive", "transaction"], describe(document)
    assert all(r["filled"] == {"p0": 4, "p1": 4, "p2": 4} and r["taken"] == r["filled"] for r in rounds), \
        describe(document)
    moves = [line for line in history_lines(tmp_path) if line.get("f") == "move" and line["type"] == "ok"
             and {line["value"]["from"], line["value"]["to"]} == {"s0", "s1"} and line["value"]["values"]]
    assert moves and all(line["value"].get("partition") in ("p0", "p1", "p2") for line in moves), describe(document)
    assert results["runtime"]["drain"]["complete"], describe(document)
    assert results["runtime"]["drain"]["ended_by"] == "leader", describe(document)  # every fragment proved empty
    require_valid(document, (*SAFETY_CHECKERS, "partitions", "features"))


def history_lines(out) -> list[dict]:
    return [json.loads(line) for line in (out / "history.jsonl").read_text().splitlines() if line.strip()]


@pytest.mark.timeout(420)
def test_network_faults_on_partitions_own_raft_links_lose_nothing_and_every_group_converges(tmp_path):
    """docs/chaos.md: partitions' Raft links go through the proxy; one partition's links around
    its leader cut while p0 stays whole, and whole-node partitions that cut every group's links."""
    config = RunConfig(nodes=3, time_limit_s=35, nemesis=["isolate-partition-member", "partition"],
                       # its first window isolates a partition's member, its second mixes both kinds
                       seed=CI_SEED + 42, out=tmp_path, workers=5, partitions=3)
    document = run(config, Progress(quiet=True))
    results = document["results"]
    windows = [w["f"] for w in results["liveness"]["windows"]]
    assert any(f.startswith("isolate-partition-") for f in windows), describe(document)
    assert any(f.startswith("partition-") for f in windows), describe(document)
    assert set(results["convergence"]["partitions"]) == {"p1", "p2"}, describe(document)
    assert results["runtime"]["drain"]["complete"], describe(document)
    require_valid(document, (*SAFETY_CHECKERS, "partitions"))


@pytest.mark.timeout(480)
def test_membership_changes_during_faults_lose_nothing_and_every_node_ends_a_voting_member(tmp_path):
    """docs/membership.md: members removed (the leader too) and re-added (with their data, or wiped
    and caught up from a snapshot) while nodes are killed and links cut."""
    config = RunConfig(nodes=5, time_limit_s=45, nemesis=["membership", "kill", "partition"], seed=CI_SEED + 2,
                       out=tmp_path, workers=5)
    document = run(config, Progress(quiet=True))
    results = document["results"]
    membership = results["membership"]
    assert membership["removals_count"] >= 1, describe(document)
    assert sum(membership["readds"].values()) >= 1, describe(document)
    assert membership["final"]["checked"] and membership["final"]["members_count"] == 5, describe(document)
    require_valid(document, (*SAFETY_CHECKERS, "membership"))


@pytest.mark.timeout(300)
def test_the_checker_catches_a_node_that_loses_acknowledged_commits(tmp_path):
    """Teeth: one node with an in-memory journal and no snapshots, killed during the run and at
    its end, comes back empty: every acknowledged enqueue still queued is lost."""
    config = RunConfig(
        nodes=1, time_limit_s=15, nemesis=["kill"], seed=7, out=tmp_path, workers=4,
        node_overrides={"unsafe_memory_journal": True, "log_compaction_entries_min": 1_000_000_000,
                        "log_compaction_interval_s": 86_400.0},
        before_heal=lambda cluster: cluster.kill_node(0))
    document = run(config, Progress(quiet=True))
    total = document["results"]["total_queue"]
    assert not document["valid"], describe(document)
    assert not total["valid"] and total["lost_count"] > 0, describe(document)


def test_the_docker_target_says_plainly_when_docker_has_no_engine(capsys):
    if docker_problem() is None:
        pytest.skip("a Docker engine with its compose plugin answers here")
    assert main(["--target", "docker", "--engine", "docker", "--time-limit-s", "1"]) == 2
    assert "no container engine for the compose cluster: Docker: " in capsys.readouterr().err


def test_unknown_nemesis_names_are_refused(capsys):
    assert main(["--nemesis", "kill,meteor"]) == 2
    assert "unknown nemesis meteor" in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "says"), [
    (["--nemesis", "kill-partition-process"], "kill-partition-process needs --partitions 2 or more"),
    (["--partitions", "0"], "--partitions counts p0: at least 1"),
    (["--partitions", "2", "--target", "docker", "--nemesis", "kill"], "--partitions needs --target local"),
    (["--partitions", "2", "--nemesis", "kill,upgrade"], "--partitions and nemesis upgrade exclude each other"),
    (["--spread-queues", "2"], "--spread-queues needs --partitions 2 or more"),
])
def test_partition_arguments_that_cannot_work_are_refused_before_anything_starts(capsys, argv, says):
    assert main(argv) == 2
    assert says in capsys.readouterr().err


# ------------------------------------------------------------ docker-compose.yml
# No Docker engine (nor compose plugin, nor PyYAML) here: read the file's plain block YAML
# (mappings, lists, quoted scalars, {}) with a small reader and check what compose needs.
ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]


def read_block_yaml(text: str):
    lines = []
    for raw in text.splitlines():
        stripped = raw.split(" #")[0].rstrip() if not raw.lstrip().startswith("#") else ""
        if stripped.strip():
            lines.append((len(stripped) - len(stripped.lstrip()), stripped.strip()))

    def scalar(token: str):
        if token == "{}":
            return {}
        if len(token) >= 2 and token[0] == token[-1] == '"':
            return token[1:-1]
        assert not token.startswith(("&", "*", "[", "{")), f"unsupported YAML: {token}"
        return token

    def block(position: int, indent: int):
        if lines[position][1].startswith("- "):
            items = []
            while position < len(lines) and lines[position][0] == indent and lines[position][1].startswith("- "):
                items.append(scalar(lines[position][1][2:]))
                position += 1
            return items, position
        mapping = {}
        while position < len(lines) and lines[position][0] == indent:
            key, _, rest = lines[position][1].partition(":")
            assert key not in mapping, f"duplicate key {key}"
            position += 1
            if rest.strip():
                mapping[key] = scalar(rest.strip())
            else:
                mapping[key], position = block(position, lines[position][0])
        return mapping, position

    document, end = block(0, 0)
    assert end == len(lines), f"could not read line {end}: {lines[end]}"
    return document


@pytest.mark.parametrize(("file", "project", "nodes"), [("docker-compose.yml", "rcq", 3),
                                                     ("docker-compose.5-nodes.yml", "rcq5", 5)])
def test_docker_compose_defines_a_consistent_cluster(file, project, nodes):
    compose = read_block_yaml((ROOT / file).read_text())
    services = compose["services"]
    assert compose["name"] == project and sorted(services) == [f"node-{i}" for i in range(nodes)]
    three = read_block_yaml((ROOT / "docker-compose.yml").read_text())["services"]["node-0"]
    for service in services.values():  # the 5-node variant is docker-compose.yml with two more nodes
        assert {key: value for key, value in service.items() if key not in ("hostname", "command", "ports", "volumes")} \
            == {key: value for key, value in three.items() if key not in ("hostname", "command", "ports", "volumes")}
    assert (ROOT / services["node-0"]["build"]["dockerfile"]).is_file()
    host_ports = set()
    partition_ports: set[int] = set()
    for name, service in services.items():
        flags = dict(flag[2:].split("=", 1) for flag in service["command"] if not flag.startswith("--peer="))
        peers = [flag.split("=", 1)[1] for flag in service["command"] if flag.startswith("--peer=")]
        assert flags["node-id"] == name and flags["raft-address"] == f"{name}:7100"
        assert flags["raft-bind-address"] == "0.0.0.0:7100"  # a reconnected container's new address too
        assert sorted(p.split("=")[0] for p in peers) == sorted(set(services) - {name})
        port_mapping, partition_mapping = service["ports"]
        assert port_mapping.startswith("127.0.0.1:") and port_mapping.endswith(":7000")
        host_ports.add(port_mapping.split(":")[1])
        # its partitions' ports (docs/partitions.md): the same numbers on the host and in the container, so
        # the URLs and Raft addresses a node derives for them work from the host and on the network alike
        first, last = (int(port) for port in flags["partition-ports"].split("-"))
        assert partition_mapping == f"127.0.0.1:{first}-{last}:{first}-{last}" and last - first + 1 >= 20
        assert not {7000, 7100} & set(range(first, last + 1))
        assert not partition_ports & set(range(first, last + 1))  # no two nodes share a port
        partition_ports.update(range(first, last + 1))
        assert flags["advertise-url"] == f"http://127.0.0.1:{port_mapping.split(':')[1]}"
        for peer in peers:  # every peer's URL is the one that peer advertises; nodes reach it on the network
            peer_id, raft_address, url, peer_url = peer.split("=", 3)
            assert raft_address == f"{peer_id}:7100" and peer_url == f"http://{peer_id}:7000"
            assert f"--advertise-url={url}" in services[peer_id]["command"]
        assert "RCQ_CLUSTER_SECRET:?" in service["environment"]["RCQ_CLUSTER_SECRET"]  # no secret committed
        assert service["environment"]["RCQ_ADMIN_TOKEN"].startswith("${RCQ_ADMIN_TOKEN:?")  # nor a token
        assert sorted(service["environment"]) == ["RCQ_ADMIN_TOKEN", "RCQ_CLUSTER_SECRET"]
        assert service["volumes"] == [f"{name}-data:/var/lib/rcq"]
        assert service["volumes"][0].split(":")[0] in compose["volumes"]
        assert service["networks"] == ["raft"] and "raft" in compose["networks"]
        assert service["build"]["args"] == {"BASE_IMAGE": "${RCQ_BASE_IMAGE:-python:3.11-slim}"}
        assert service["healthcheck"]["test"][:3] == ["CMD", "python", "-c"] and "/healthz" in service["healthcheck"]["test"][3]
    assert host_ports == {str(7001 + i) for i in range(nodes)}
    dockerfile = (ROOT / "cluster" / "Dockerfile").read_text()
    assert "ARG BASE_IMAGE=python:3.11-slim\nFROM ${BASE_IMAGE}" in dockerfile and "(3, 11)" in dockerfile  # 3.11 checked
    assert '"rcq", "serve"' in dockerfile and "USER rcq" in dockerfile
    # the wheels made on the host, rcq[server]'s closure (pip check), installed without an index; pip removed after
    assert dockerfile.count("pip install --no-index") == 2 and "pip check" in dockerfile and "pip uninstall" in dockerfile
    healthcheck = services["node-0"]["healthcheck"]["test"]
    assert f'CMD ["python", "-c", "{healthcheck[3]}"]' in dockerfile  # the image's HEALTHCHECK is the compose one
    ignored = [line for line in (ROOT / ".dockerignore").read_text().splitlines() if line and not line.startswith("#")]
    assert ignored == ["*", "!build/image/wheels/"]  # the build context is the wheels alone
