"""The docker target, against FAKE ``docker``, ``podman`` and ``podman-compose`` executables first on
PATH: they record every command line (and whether the cluster secret and the admin token came in
its environment) and answer like Docker with the compose plugin, or Podman with podman-compose,
would. Checks the exact commands behind every harness action on each engine, the faults refused on
docker, the engine ``--engine`` picks, and the plain "no engine" answer. A real compose cluster
runs in tests/chaos/test_docker_run.py."""

from __future__ import annotations

import asyncio
import json
import random
import sys
import textwrap
from pathlib import Path

import pytest

import chaos.__main__ as chaos_main
from chaos.docker_cluster import COMPOSE_FILE, DockerCluster, DockerError, run_docker
from chaos.nemesis import DOCKER_KINDS, KINDS, Nemesis, check_target
from chaos.target import ChaosTarget
from cluster.engine import Engine
from rcq.local.polls import PolledCluster

PROJECT = "rcq-chaos-test"
PREFIX = ["compose", "-f", str(COMPOSE_FILE), "-p", PROJECT]
NETWORK = f"{PROJECT}_raft"
DOCKER = Engine("docker", ("docker",), ("docker", "compose"), {}, "Docker (fake)")

FAKE_DOCKER = textwrap.dedent("""\
    import json, os, sys, time
    prog, argv = os.path.basename(sys.argv[0]), sys.argv[1:]
    if prog == "podman-compose":  # as `docker compose`: the same arguments after the program
        argv = ["compose", *argv]
    with open(os.environ["FAKE_DOCKER_LOG"], "a") as log:
        log.write(json.dumps({"prog": prog, "argv": argv, "secret": os.environ.get("RCQ_CLUSTER_SECRET"),
                              "token": os.environ.get("RCQ_ADMIN_TOKEN"),
                              "conf": os.environ.get("CONTAINERS_CONF")}) + "\\n")
    line = " ".join([prog, *argv])
    fail = os.environ.get("FAKE_DOCKER_FAIL")
    if fail and fail in line:
        sys.stderr.write("boom: fake docker refuses " + " ".join(argv) + "\\n")
        sys.exit(1)
    if os.environ.get("FAKE_DOCKER_SLEEP"):
        time.sleep(float(os.environ["FAKE_DOCKER_SLEEP"]))
    services = [a.rpartition("=")[2] for a in argv if a.startswith("label=com.docker.compose.service=")]
    if argv[:1] == ["version"]:
        print("0.0-fake")
    elif argv[:1] == ["ps"] and services:  # podman ps -a -q --filter label=...
        print("cid-" + services[0])
    elif argv[:1] == ["compose"] and "version" in argv:
        print("Docker Compose version v2.0-fake")
    elif argv[:1] == ["compose"] and "ps" in argv:
        print("cid-" + argv[-1])
    elif argv[:1] == ["compose"] and "logs" in argv:
        print(argv[-1] + "  | a log line of " + argv[-1])
    elif argv[:1] == ["inspect"]:
        exited = os.environ.get("FAKE_DOCKER_EXITED", "").split(",")
        for container in argv[3:]:
            print("exited 137" if container in exited else "running 0")
    """)


class Fake:
    def __init__(self, log: Path) -> None:
        self.log = log

    def records(self) -> list[dict]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines()]

    def calls(self) -> list[list[str]]:
        """Every command since the last call, compose ones shortened to ``["compose", *args]``
        (after checking their -f / -p prefix and that the secret and the token came in the environment);
        podman's and podman-compose's headed by their name."""
        shown = []
        for record in self.records():
            argv = record["argv"]
            if record["prog"] != "docker":
                assert record["conf"], "podman runs with the containers.conf written for it"
            if argv[:1] == ["compose"] and argv[1:2] != ["version"]:
                assert argv[:5] == PREFIX, argv
                assert record["secret"] and len(record["secret"]) >= 16, "compose needs RCQ_CLUSTER_SECRET"
                assert record["secret"] not in " ".join(argv), "the secret is never on a command line"
                assert record["token"] and record["token"].startswith("rcq_"), "compose needs RCQ_ADMIN_TOKEN"
                assert record["token"] not in " ".join(argv), "the token is never on a command line"
                argv = ["compose", *argv[5:]]
            if record["prog"] != "docker":
                argv = [record["prog"], *(argv[1:] if argv[:1] == ["compose"] else argv)]
            shown.append(argv)
        self.log.unlink(missing_ok=True)
        return shown


@pytest.fixture
def fake(tmp_path, monkeypatch) -> Fake:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("docker", "podman", "podman-compose", "runc"):
        script = bin_dir / name
        script.write_text(f"#!{sys.executable}\n" + FAKE_DOCKER)
        script.chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))  # the fakes only: no real engine is ever asked
    monkeypatch.setenv("FAKE_DOCKER_LOG", str(tmp_path / "docker-calls.jsonl"))
    monkeypatch.delenv("FAKE_DOCKER_FAIL", raising=False)
    monkeypatch.delenv("RCQ_CLUSTER_SECRET", raising=False)
    monkeypatch.delenv("RCQ_ADMIN_TOKEN", raising=False)
    return Fake(tmp_path / "docker-calls.jsonl")


@pytest.fixture
def http_waits(monkeypatch) -> list[list[int]]:
    """No HTTP: the nodes the harness would wait for are recorded instead."""
    waited: list[list[int]] = []
    monkeypatch.setattr(PolledCluster, "wait_for_http",
                        lambda self, indices=None, timeout_s=None: waited.append(list(indices)))
    return waited


@pytest.fixture
def cluster(fake, http_waits, tmp_path) -> DockerCluster:
    started = DockerCluster(3, tmp_path / "cluster", project=PROJECT, engine=DOCKER, build=False)
    started.start()
    fake.calls()
    http_waits.clear()
    return started


# ------------------------------------------------------------------- commands
def test_start_brings_the_compose_project_up_and_waits_for_every_node(fake, http_waits, tmp_path):
    cluster = DockerCluster(3, tmp_path / "cluster", project=PROJECT, engine=DOCKER, build=False)
    cluster.start()
    # Every compose call has the run's admin token, the one the harness's polls and clients send.
    assert {record["token"] for record in fake.records()} == {cluster.token}
    assert fake.calls() == [
        ["compose", "down", "-v", "--remove-orphans"],
        ["compose", "up", "-d"],  # the image is built before (cluster.image), not by compose
        ["compose", "ps", "-a", "-q", "node-0"],
        ["compose", "ps", "-a", "-q", "node-1"],
        ["compose", "ps", "-a", "-q", "node-2"],
    ]
    assert http_waits == [[0, 1, 2]]
    assert cluster.client_urls == ["http://127.0.0.1:7001", "http://127.0.0.1:7002", "http://127.0.0.1:7003"]
    assert cluster.live_indices() == [0, 1, 2]
    assert cluster.status.__func__ is PolledCluster.status  # HTTP views straight to the published ports
    assert cluster.nodes[2].direct_url == "http://127.0.0.1:7003"


def test_kill_is_sigkill_and_start_restarts_the_same_container(cluster, fake, http_waits):
    cluster.kill_node(1)
    assert fake.calls() == [["compose", "kill", "-s", "SIGKILL", "node-1"]]
    assert cluster.running_indices() == [0, 2]
    cluster.kill_node(1)  # already down: nothing to do
    assert fake.calls() == []
    cluster.start_node(1)
    assert fake.calls() == [["compose", "start", "node-1"]]
    assert http_waits == [[1]] and cluster.running_indices() == [0, 1, 2]


def test_pause_and_resume_freeze_the_container(cluster, fake):
    cluster.pause_node(0)
    assert fake.calls() == [["pause", "cid-node-0"]]
    assert cluster.live_indices() == [1, 2] and cluster.running_indices() == [0, 1, 2]
    cluster.resume_node(0)
    assert fake.calls() == [["unpause", "cid-node-0"]]
    assert cluster.live_indices() == [0, 1, 2]


def test_killing_a_paused_node_thaws_it_first(cluster, fake):
    cluster.pause_node(2)
    fake.calls()
    cluster.kill_node(2)
    assert fake.calls() == [["unpause", "cid-node-2"], ["compose", "kill", "-s", "SIGKILL", "node-2"]]


def test_a_partition_takes_whole_nodes_off_the_raft_network_and_heal_reconnects_them_by_alias(cluster, fake, http_waits):
    cluster.isolate_nodes([2])
    assert fake.calls() == [["network", "disconnect", NETWORK, "cid-node-2"]]
    assert cluster.live_indices() == [0, 1]  # its published port is gone too: not polled
    cluster.wait_for_http([0, 2])
    assert http_waits == [[0]]  # nor waited for
    cluster.reconnect_nodes([0, 1, 2])  # only the isolated one needs it
    assert fake.calls() == [["network", "connect", "--alias", "node-2", NETWORK, "cid-node-2"]]
    assert cluster.live_indices() == [0, 1, 2]


def test_wipe_removes_the_container_and_its_volume_and_start_creates_them_anew(cluster, fake, http_waits):
    with pytest.raises(RuntimeError, match="stop node-1 before wiping it"):
        cluster.wipe_node(1)
    cluster.kill_node(1)
    cluster.wipe_node(1)
    cluster.start_node(1)
    assert fake.calls() == [
        ["compose", "kill", "-s", "SIGKILL", "node-1"],
        ["compose", "rm", "-f", "-s", "-v", "node-1"],
        ["volume", "rm", "-f", f"{PROJECT}_node-1-data"],
        ["compose", "up", "-d", "--no-deps", "--no-build", "node-1"],
        ["compose", "ps", "-a", "-q", "node-1"],
    ]
    assert http_waits == [[1]]


def test_logs_come_from_compose(cluster, fake):
    assert "a log line of node-0" in cluster.log_tail(0)
    assert fake.calls() == [["compose", "logs", "--no-color", "node-0"]]


def test_heal_resumes_reconnects_and_restarts(cluster, fake, http_waits):
    cluster.pause_node(0)
    cluster.isolate_nodes([1])
    cluster.kill_node(2)
    fake.calls()
    assert cluster.heal() == [2]
    assert fake.calls() == [
        ["unpause", "cid-node-0"],
        ["network", "connect", "--alias", "node-1", NETWORK, "cid-node-1"],
        ["compose", "start", "node-2"],
    ]
    assert http_waits == [[2]] and cluster.live_indices() == [0, 1, 2]


def test_close_saves_every_log_then_takes_the_project_down_with_its_volumes(cluster, fake, tmp_path):
    cluster.pause_node(1)
    fake.calls()
    cluster.close()
    assert fake.calls() == [
        ["compose", "logs", "--no-color", "node-0"],
        ["compose", "logs", "--no-color", "node-1"],
        ["unpause", "cid-node-1"],
        ["compose", "logs", "--no-color", "node-2"],
        ["compose", "down", "-v", "--remove-orphans"],
    ]
    assert cluster.log_paths() == [tmp_path / "cluster" / f"node-{i}.log" for i in range(3)]
    assert "a log line of node-2" in (tmp_path / "cluster" / "node-2.log").read_text()
    cluster.close()
    assert fake.calls() == []
    with pytest.raises(RuntimeError, match="closed"):
        cluster.start_node(0)


def test_unexpected_exits_are_the_containers_that_stopped_on_their_own(cluster, fake, monkeypatch):
    monkeypatch.setenv("FAKE_DOCKER_EXITED", "cid-node-1")
    assert cluster.unexpected_exits() == {1: 137}
    assert fake.calls() == [["inspect", "--format", "{{.State.Status}} {{.State.ExitCode}}",
                             "cid-node-0", "cid-node-1", "cid-node-2"]]


def test_a_failed_command_names_itself_and_quotes_its_stderr(cluster, fake, monkeypatch):
    monkeypatch.setenv("FAKE_DOCKER_FAIL", "pause")
    with pytest.raises(DockerError, match=r"`docker pause cid-node-0` exited 1: boom: fake docker refuses pause"):
        cluster.pause_node(0)
    assert cluster.live_indices() == [0, 1, 2]  # state unchanged when docker refused


def test_every_command_has_a_timeout(fake, monkeypatch):
    monkeypatch.setenv("FAKE_DOCKER_SLEEP", "5")
    with pytest.raises(DockerError, match=r"`docker ps` timed out after 0 s"):
        run_docker(["ps"], timeout_s=0.3)


def test_it_is_a_chaos_target_with_whole_node_isolation_and_no_link_faults(cluster):
    assert isinstance(cluster, ChaosTarget) and cluster.target == "docker"
    assert cluster.link_faults() is None and cluster.node_isolation() is cluster


def test_only_the_compose_files_three_nodes(tmp_path):
    with pytest.raises(ValueError, match="3 nodes, not 5"):
        DockerCluster(5, tmp_path, engine=DOCKER)


# --------------------------------------------------------------------- podman
def podman_engine(tmp_path) -> Engine:
    return Engine("podman", ("podman",), ("podman-compose",),
                  {"CONTAINERS_CONF": str(tmp_path / "containers.conf"), "BUILDAH_FORMAT": "docker"}, "Podman (fake)")


def by_labels(service: str) -> list[str]:
    return ["podman", "ps", "-a", "-q", "--filter", f"label=com.docker.compose.project={PROJECT}",
            "--filter", f"label=com.docker.compose.service={service}"]


@pytest.fixture
def on_podman(fake, http_waits, tmp_path) -> DockerCluster:
    started = DockerCluster(3, tmp_path / "cluster", project=PROJECT, engine=podman_engine(tmp_path), build=False)
    started.start()
    assert fake.calls() == [["podman-compose", "down", "-v", "--remove-orphans"], ["podman-compose", "up", "-d"],
                            by_labels("node-0"), by_labels("node-1"), by_labels("node-2")]
    http_waits.clear()
    return started


def test_on_podman_kill_restart_pause_and_logs_go_to_the_container(on_podman, fake):
    on_podman.kill_node(1)
    on_podman.start_node(1)
    on_podman.pause_node(0)
    on_podman.resume_node(0)
    assert "a log line of" not in on_podman.log_tail(2)  # podman's own logs, not compose's
    assert fake.calls() == [["podman", "kill", "--signal", "KILL", "cid-node-1"], ["podman", "start", "cid-node-1"],
                            ["podman", "pause", "cid-node-0"], ["podman", "unpause", "cid-node-0"],
                            ["podman", "logs", "cid-node-2"]]


def test_on_podman_a_partition_and_a_wipe_use_podmans_network_volume_and_compose(on_podman, fake, http_waits):
    on_podman.isolate_nodes([2])
    on_podman.reconnect_nodes([2])
    on_podman.kill_node(1)
    on_podman.wipe_node(1)
    on_podman.start_node(1)
    assert fake.calls() == [
        ["podman", "network", "disconnect", NETWORK, "cid-node-2"],
        ["podman", "network", "connect", "--alias", "node-2", NETWORK, "cid-node-2"],
        ["podman", "kill", "--signal", "KILL", "cid-node-1"],
        ["podman", "rm", "-f", "-v", "cid-node-1"],
        ["podman", "volume", "rm", "-f", f"{PROJECT}_node-1-data"],
        ["podman-compose", "up", "-d", "--no-deps", "--no-build", "node-1"],
        by_labels("node-1"),
    ]
    assert http_waits == [[1]]


def test_on_podman_close_takes_the_project_down_with_podman_compose(on_podman, fake):
    on_podman.close()
    calls = fake.calls()
    assert calls[:3] == [["podman", "logs", f"cid-node-{i}"] for i in range(3)]
    assert calls[3:] == [["podman-compose", "down", "-v", "--remove-orphans"]]


# -------------------------------------------------------------------- nemesis
class History:
    def __init__(self) -> None:
        self.lines: list[tuple[str, str, dict]] = []

    def info(self, process, f, value=None, error=None):
        self.lines.append((process, f, value))
        return type("Op", (), {"time_s": float(len(self.lines))})()


def test_the_nemesis_partitions_docker_nodes_whole_and_heals_them(cluster, fake, monkeypatch):
    monkeypatch.setattr(DockerCluster, "leader", lambda self: 1)
    nemesis = Nemesis(cluster, History(), 5, ["partition"])
    seen = set()
    for salt in range(12):
        fault = nemesis._begin("partition", random.Random(salt))
        assert fault is not None and fault.f in ("partition-leader", "partition-halves")
        assert len(fault.nodes) == 1 and fault.details["whole_node"]  # a minority of 3: one node
        if fault.f == "partition-leader":
            assert fault.nodes == [1]
        (i,) = fault.nodes
        assert fake.calls() == [["network", "disconnect", NETWORK, f"cid-node-{i}"]]
        fault.stop()
        assert fake.calls() == [["network", "connect", "--alias", f"node-{i}", NETWORK, f"cid-node-{i}"]]
        seen.add(fault.f)
    assert seen == {"partition-leader", "partition-halves"}


def test_the_nemesis_heal_on_docker_reconnects_resumes_and_restarts(cluster, fake, http_waits, monkeypatch):
    monkeypatch.setattr(DockerCluster, "leader", lambda self: 0)
    history = History()
    nemesis = Nemesis(cluster, history, 1, ["kill", "pause", "partition"])

    async def faults_then_heal() -> None:
        await nemesis._start("partition", random.Random(0))
        cluster.kill_node(2)
        await nemesis.heal()

    asyncio.run(faults_then_heal())
    calls = fake.calls()
    (isolated,) = history.lines[0][2]["nodes"]  # the leader or a random minority of one
    assert calls[0] == ["network", "disconnect", NETWORK, f"cid-{isolated}"]
    assert calls[1] == ["compose", "kill", "-s", "SIGKILL", "node-2"]
    assert calls[2:] == [["network", "connect", "--alias", isolated, NETWORK, f"cid-{isolated}"],  # the fault's stop
                         ["compose", "start", "node-2"]]  # the heal: nothing left to reconnect
    assert cluster.live_indices() == [0, 1, 2]
    assert [line[2]["phase"] for line in history.lines] == ["start", "stop"]


@pytest.mark.parametrize("kind", ["one-way", "client-partition", "delay", "loss"])
def test_the_nemesis_refuses_faults_docker_cannot_make(cluster, kind):
    with pytest.raises(ValueError, match=f"nemesis {kind} not supported with --target docker: .*whole-node"):
        Nemesis(cluster, History(), 1, ["kill", kind])


def test_the_docker_kinds():
    assert set(DOCKER_KINDS) == {"kill", "pause", "partition", "wipe", "snapshot"} and set(DOCKER_KINDS) <= set(KINDS)
    check_target(list(KINDS), "local")
    check_target(list(DOCKER_KINDS), "docker")


# ------------------------------------------------------------------------ CLI
@pytest.mark.parametrize(("argv", "message"), [
    (["--nemesis", "kill,delay"], "nemesis delay not supported with --target docker"),
    (["--nemesis", "one-way,client-partition,loss"], "nemesis one-way, client-partition, loss not supported"),
    (["--nodes", "5"], "--target docker runs docker-compose.yml's 3 nodes; --nodes 5 needs --target local"),
    (["--node-override", "unsafe_memory_journal=true"], "--node-override needs --target local"),
])
def test_the_cli_refuses_what_docker_cannot_do_before_asking_docker(fake, capsys, argv, message):
    assert chaos_main.main(["--target", "docker", *argv]) == 2
    assert message in capsys.readouterr().err
    assert fake.calls() == []


def test_the_cli_runs_the_docker_target_when_an_engine_and_compose_answer(fake, monkeypatch, tmp_path, capsys):
    configs = []

    def fake_run(config, progress):
        configs.append(config)
        return {"valid": True}

    monkeypatch.setattr(chaos_main, "run", fake_run)
    assert chaos_main.main(["--target", "docker", "--nemesis", "all", "--seed", "3", "--out", str(tmp_path / "o")]) == 0
    (config,) = configs
    assert config.target == "docker" and config.nodes == 3 and config.nemesis == list(DOCKER_KINDS)
    assert config.engine == "auto"
    server_version = ["version", "--format", "{{.Server.Version}}"]  # the engine's, not the client's
    assert fake.calls() == [server_version, ["compose", "version"], server_version, ["compose", "version", "--short"]]
    assert "engine: Docker 0.0-fake" in capsys.readouterr().err
    assert chaos_main.main(["--target", "docker", "--nemesis", "all,backup", "--seed", "3",
                            "--out", str(tmp_path / "b")]) == 0
    assert configs[1].nemesis == [*DOCKER_KINDS, "backup"]  # all on docker, and what it leaves out


@pytest.mark.parametrize("fail", ["docker version", "docker compose version"])
def test_auto_takes_podman_when_docker_has_no_engine_or_no_compose_plugin(fake, monkeypatch, tmp_path, capsys, fail):
    monkeypatch.setenv("FAKE_DOCKER_FAIL", fail)  # this machine's case: a docker client, no engine, no plugin
    monkeypatch.setattr(chaos_main, "run", lambda config, progress: {"valid": True})
    assert chaos_main.main(["--target", "docker", "--out", str(tmp_path / "o")]) == 0
    assert "engine: Podman 0.0-fake" in capsys.readouterr().err


def test_a_docker_failure_during_the_run_exits_2_with_the_command(fake, monkeypatch, tmp_path, capsys):
    def failing_run(config, progress):
        raise DockerError("`docker compose ... up -d --build` exited 1: port is already allocated")

    monkeypatch.setattr(chaos_main, "run", failing_run)
    assert chaos_main.main(["--target", "docker", "--out", str(tmp_path / "o")]) == 2
    assert "port is already allocated" in capsys.readouterr().err


def test_no_engine_is_said_plainly(fake, monkeypatch, capsys):
    monkeypatch.setenv("FAKE_DOCKER_FAIL", "docker version")
    assert chaos_main.main(["--target", "docker", "--engine", "docker", "--time-limit-s", "1"]) == 2
    err = capsys.readouterr().err
    assert "Docker: `docker version` reaches no engine: `docker version --format '{{.Server.Version}}'` exited 1: boom" in err
    assert "use --target local" in err and "Podman" not in err.splitlines()[0]  # asked for docker: only docker said


def test_no_engine_command_is_said_plainly(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr("cluster.engine.podman_compose_command", lambda: None)  # nor the one beside this Python
    assert chaos_main.main(["--target", "docker"]) == 2
    err = capsys.readouterr().err
    assert "Docker: the docker command is not installed" in err and "Podman: podman is not installed" in err


def test_no_compose_plugin_is_said_plainly(fake, monkeypatch, capsys):
    monkeypatch.setenv("FAKE_DOCKER_FAIL", "docker compose version")
    assert chaos_main.main(["--target", "docker", "--engine", "docker"]) == 2
    assert "no docker compose plugin" in capsys.readouterr().err


def test_the_runner_refuses_node_overrides_on_docker_without_touching_docker(fake, tmp_path):
    from chaos.runner import Progress, RunConfig, run

    config = RunConfig(target="docker", node_overrides={"unsafe_memory_journal": True}, out=tmp_path / "o")
    with pytest.raises(ValueError, match="no node overrides"):
        run(config, Progress(quiet=True))
    assert fake.calls() == []
