"""The cluster under test as a compose project: ``docker-compose.yml``'s three nodes, on Docker or Podman.
Why over 400 lines: one class maps every harness action onto two engines' commands; the table below is the mapping.

The engine is :mod:`cluster.engine`'s (``--engine auto|docker|podman``; auto: Docker only when
``docker version`` reaches an engine and ``docker compose version`` answers, else Podman with
podman-compose and the containers.conf written for the host). The image (``rcq:local``) is built
from this checkout by :func:`cluster.image.build_image` when the cluster starts: no network inside
the build, and an unchanged checkout reuses the image. Every command is bounded by a timeout; a
failure raises :class:`DockerError` naming the command and its stderr. Each compose call gets
``-f docker-compose.yml -p <project>``, a cluster secret generated for the run in
``RCQ_CLUSTER_SECRET`` and an admin token generated for the run in ``RCQ_ADMIN_TOKEN`` (the file
refuses to parse without them, so even ``kill`` and ``logs`` need them; neither is ever on a
command line). The harness's polls and the workload's clients send that token
(:attr:`DockerCluster.token`).

How each harness action maps (``S`` is the service ``node-i``, ``C`` its container id, ``P`` the
project; ``E`` is ``docker`` or ``podman``; compose is ``docker compose`` or ``podman-compose``):

======================  =======================================  ===========================================
action                  Docker                                   Podman
======================  =======================================  ===========================================
the container ``C``     ``compose ps -a -q S``                   ``podman ps -a -q`` by the project's and
                                                                 the service's compose labels
start the cluster       ``compose down -v``, build, ``compose up -d``, then ``C`` per node (both)
kill -9                 ``compose kill -s SIGKILL S``            ``podman kill --signal KILL C``
restart                 ``compose start S``                      ``podman start C``
pause / resume          ``E pause C`` / ``E unpause C`` (cgroup freezer, like SIGSTOP)
partition / heal        ``E network disconnect P_raft C`` / ``E network connect --alias S P_raft C``
wipe                    ``compose rm -f -s -v S``,               ``podman rm -f -v C``,
                        ``docker volume rm -f P_node-i-data``    ``podman volume rm -f P_node-i-data``
restart after a wipe    ``compose up -d --no-deps --no-build S`` (both)
logs                    ``compose logs --no-color S``            ``podman logs C`` (its stdout and stderr)
exits                   ``E inspect --format '{{.State.Status}} {{.State.ExitCode}}' C...``
close                   ``E unpause`` of paused nodes, then ``compose down -v`` (containers, network and
                        volumes go; the logs, saved to ``<base_dir>/node-i.log``, stay)
======================  =======================================  ===========================================

The reconnect names the service alias because that is how peers resolve ``node-i:7100`` (a plain
reconnect would lose compose's alias). A restarted, recreated or reconnected container comes back
at a new address: the nodes bind Raft to 0.0.0.0 and re-resolve their peers' names
(docs/raft-hazards.md, H21).

**Partitions here are whole-node.** A container is either on the compose network ``raft`` or off
it, so the only cut is isolating nodes from every other node (the isolated nodes also lose each
other). Per-link cuts (a non-transitive ring, one-way drops), delay and loss and client-only
partitions need the harness's proxy, which this target does not have: the nemesis refuses those
kinds. And since a published port lives on the container's network endpoint, an isolated node's
HTTP port (127.0.0.1:700(i+1)) is gone too while it is cut off: a partition also cuts that node
from clients and from the harness's status polls (it counts as not live meanwhile and is not
waited for).

Nodes run with the compose file's configuration (no ``--node-override``) on the fixed host ports
127.0.0.1:7001..7003, so one such project runs at a time.

The HTTP views and bounded waits are the cluster harness's own
(:class:`rcq.local.polls.PolledCluster`, asking the published ports); this module adds only the
engine's commands behind each action. It implements :class:`chaos.target.ChaosTarget` with
whole-node isolation and no per-link faults.

Must not import: any rcq module but rcq.client, rcq.errors and rcq.testing's cluster harness; of
the product's cluster package, only the engine and the image builder.
"""

from __future__ import annotations

import contextlib
import dataclasses
import secrets
import subprocess
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

from chaos.target import TARGET_START_TIMEOUT_S
from cluster.engine import (
    COMPOSE_FILE,
    Engine,
    EngineCommandFailed,
    EngineUnavailable,
    choose_engine,
    project_containers,
    run_command,
)
from cluster.image import build_image
from rcq.local.polls import PolledCluster
from rcq.tokens import new_token

COMPOSE_NODES = 3  # the services docker-compose.yml defines: node-0..node-2
HTTP_BASE_PORT = 7001  # node-i publishes its HTTP API on 127.0.0.1:7001+i
NETWORK = "raft"
UP_TIMEOUT_S = 900.0  # compose up; the first build of the image (and its base) is bounded in cluster/image.py
COMMAND_TIMEOUT_S = 60.0
DOWN_TIMEOUT_S = 120.0
LOG_TAIL_BYTES = 4000


class DockerError(EngineCommandFailed):
    """An engine or compose command failed or timed out; the message names it and quotes its stderr."""


def run_docker(args: Sequence[str], timeout_s: float = COMMAND_TIMEOUT_S,
               env: dict[str, str] | None = None, program: Sequence[str] = ("docker",)) -> subprocess.CompletedProcess[str]:
    """``program *args`` (``docker`` unless told); :class:`DockerError` unless it exits 0 within ``timeout_s``."""
    try:
        return run_command([*program, *args], timeout_s, env)
    except EngineCommandFailed as exc:
        raise DockerError(str(exc)) from exc


def docker_compose_error() -> str | None:
    """None when ``docker compose`` (the v2 plugin) answers; otherwise why not."""
    try:
        run_docker(["compose", "version"], timeout_s=20.0)
    except DockerError as exc:
        return f"no docker compose plugin: {exc}"
    return None


def say_image(line: str) -> None:
    print(f"[image] {line}", file=sys.stderr, flush=True)


@dataclasses.dataclass
class DockerNode:
    index: int
    container: str | None = None  # None: no container (before up, after a wipe)
    state: str = "absent"  # absent / running / stopped (killed)
    paused: bool = False
    isolated: bool = False  # disconnected from the raft network
    starts: int = 0

    @property
    def node_id(self) -> str:
        return f"node-{self.index}"

    @property
    def service(self) -> str:
        return self.node_id

    @property
    def client_url(self) -> str:
        return f"http://127.0.0.1:{HTTP_BASE_PORT + self.index}"

    @property
    def direct_url(self) -> str:  # no proxy: clients and the harness use the published port
        return self.client_url

    def running(self) -> bool:
        return self.state == "running"

    def live(self) -> bool:
        return self.running() and not self.paused and not self.isolated

    def describe(self) -> str:
        container = self.container or "no container"
        return f"{container} {self.state}" + (" paused" if self.paused else "") + (" isolated" if self.isolated else "")


class DockerCluster(PolledCluster[DockerNode]):
    """docker-compose.yml's three nodes as the compose project ``project`` (see the module docstring).

    ``engine``: an :class:`~cluster.engine.Engine`, or what :func:`~cluster.engine.choose_engine`
    takes (``auto``, ``docker``, ``podman``). ``build``: build the image when the cluster starts
    (False: ``rcq:local`` is there already)."""

    target = "docker"
    start_timeout_s = TARGET_START_TIMEOUT_S

    def __init__(self, nodes: int = COMPOSE_NODES, base_dir: Path | None = None, project: str = "rcq-chaos",
                 compose_file: Path = COMPOSE_FILE, engine: Engine | str = "auto", build: bool = True) -> None:
        if nodes != COMPOSE_NODES:
            raise ValueError(f"the docker target runs docker-compose.yml's {COMPOSE_NODES} nodes, not {nodes}; "
                             "use --target local for other sizes")
        try:
            self.engine = choose_engine(engine) if isinstance(engine, str) else engine
        except (EngineUnavailable, EngineCommandFailed) as exc:
            raise DockerError(str(exc)) from exc
        self.project = project
        self.compose_file = Path(compose_file)
        self.build = build
        self.base_dir = Path(base_dir) if base_dir is not None else Path.cwd() / f"{project}-logs"
        self.base_dir.mkdir(parents=True, exist_ok=True)
        self._secret = secrets.token_urlsafe(32)
        self._admin_token = new_token()  # as `rcq token create` makes one, for this run
        self.token = self._admin_token  # what the polls and the workload send
        self.nodes = [DockerNode(i) for i in range(nodes)]
        self._closed = False
        self._started = False

    # ----------------------------------------------------------- commands
    @property
    def podman(self) -> bool:
        return self.engine.name == "podman"

    @property
    def network(self) -> str:
        return f"{self.project}_{NETWORK}"

    def volume(self, i: int) -> str:
        return f"{self.project}_node-{i}-data"

    def _env(self) -> dict[str, str]:
        return self.engine.environment({"RCQ_CLUSTER_SECRET": self._secret, "RCQ_ADMIN_TOKEN": self._admin_token})

    def compose(self, *args: str, timeout_s: float = COMMAND_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
        return run_docker(["-f", str(self.compose_file), "-p", self.project, *args], timeout_s, self._env(),
                          program=self.engine.compose)

    def docker(self, *args: str, timeout_s: float = COMMAND_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
        """The engine's own CLI (``docker`` or ``podman``)."""
        return run_docker(list(args), timeout_s, self.engine.environment(), program=self.engine.cli)

    def _container(self, i: int) -> str:
        node = self.nodes[i]
        if node.container is None:
            if self.podman:  # podman-compose's ps takes no service
                try:
                    found = project_containers(self.engine, self.project, node.service, COMMAND_TIMEOUT_S)
                except EngineCommandFailed as exc:
                    raise DockerError(str(exc)) from exc
            else:
                found = self.compose("ps", "-a", "-q", node.service).stdout.split()
            if not found:
                raise DockerError(f"no container for {node.service} in compose project {self.project}")
            node.container = found[0]
        return node.container

    # ---------------------------------------------------------- processes
    def build_image(self) -> None:
        """``rcq:local`` from this checkout (cluster.image; an unchanged checkout reuses the image)."""
        try:
            build_image(self.engine, say=say_image)
        except EngineCommandFailed as exc:
            raise DockerError(f"the image could not be built: {exc}") from exc

    def start(self, timeout_s: float | None = None) -> None:
        if self._closed:
            raise RuntimeError("the cluster is closed")
        self.compose("down", "-v", "--remove-orphans", timeout_s=DOWN_TIMEOUT_S)  # a same-named project's leftovers
        if self.build:
            self.build_image()
        self._started = True
        self.compose("up", "-d", timeout_s=UP_TIMEOUT_S)
        for node in self.nodes:
            node.container = None
            self._container(node.index)
            node.state, node.paused, node.isolated = "running", False, False
            node.starts += 1
        self.wait_for_http([n.index for n in self.nodes], timeout_s)

    def start_node(self, i: int, wait: bool = True, timeout_s: float | None = None) -> int:
        if self._closed:
            raise RuntimeError("the cluster is closed")
        node = self.nodes[i]
        if node.running():
            raise RuntimeError(f"{node.node_id} is already running")
        if node.container is None:  # wiped: a new container (and an empty volume)
            self.compose("up", "-d", "--no-deps", "--no-build", node.service, timeout_s=UP_TIMEOUT_S)
            node.isolated = False
            self._container(i)
        elif self.podman:
            self.docker("start", node.container)
        else:
            self.compose("start", node.service)
        node.state, node.paused = "running", False
        node.starts += 1
        if wait:
            self.wait_for_http([i], timeout_s)
        return node.starts

    def kill_node(self, i: int) -> None:
        """SIGKILL to the container's process, as a crash would; it stays down (``restart: "no"``)."""
        node = self.nodes[i]
        if not node.running():
            return
        if node.paused:  # a frozen container takes SIGKILL only once thawed
            self.resume_node(i)
        if self.podman:
            self.docker("kill", "--signal", "KILL", self._container(i))
        else:
            self.compose("kill", "-s", "SIGKILL", node.service)
        node.state, node.paused = "stopped", False

    def pause_node(self, i: int) -> None:
        node = self.nodes[i]
        if node.running() and not node.paused:
            self.docker("pause", self._container(i))
            node.paused = True

    def resume_node(self, i: int) -> None:
        node = self.nodes[i]
        if node.paused:
            self.docker("unpause", self._container(i))
        node.paused = False

    def wipe_node(self, i: int) -> None:
        """The container and its data volume removed; ``start_node`` creates both anew, empty."""
        node = self.nodes[i]
        if node.running():
            raise RuntimeError(f"stop {node.node_id} before wiping it")
        if self.podman:
            self.docker("rm", "-f", "-v", self._container(i))
        else:
            self.compose("rm", "-f", "-s", "-v", node.service)
        self.docker("volume", "rm", "-f", self.volume(i))
        node.container, node.state, node.isolated = None, "absent", False

    # ------------------------------------------------------------ network
    def isolate_nodes(self, indices: Iterable[int]) -> None:
        """Off the raft network: cut from every other node (and, its published port gone, from clients)."""
        for i in indices:
            node = self.nodes[i]
            if not node.isolated:
                self.docker("network", "disconnect", self.network, self._container(i))
                node.isolated = True

    def reconnect_nodes(self, indices: Iterable[int]) -> None:
        for i in indices:
            node = self.nodes[i]
            if node.isolated:
                self.docker("network", "connect", "--alias", node.service, self.network, self._container(i))
                node.isolated = False

    def heal_network(self) -> None:
        """Resume paused nodes (a frozen container's network is left alone) and reconnect isolated ones."""
        for node in self.nodes:
            if node.paused:
                self.resume_node(node.index)
        self.reconnect_nodes([node.index for node in self.nodes])

    def heal(self, timeout_s: float | None = None) -> list[int]:
        """Resume paused nodes, reconnect isolated ones, start stopped ones; returns the indices started."""
        self.heal_network()
        stopped = [node.index for node in self.nodes if not node.running()]
        for i in stopped:
            self.start_node(i, wait=False)
        if stopped:
            self.wait_for_http(stopped, timeout_s)
        return stopped

    def wait_for_http(self, indices: Iterable[int] | None = None, timeout_s: float | None = None) -> None:
        """As the harness's, but an isolated node is not waited for: its port is unpublished until healed."""
        reachable = [i for i in (self.live_indices() if indices is None else indices) if not self.nodes[i].isolated]
        if reachable:
            super().wait_for_http(reachable, timeout_s)

    def close(self) -> None:
        """Save every node's log into ``base_dir``, then ``docker compose down -v`` (containers,
        network and volumes go; the logs are what is kept)."""
        if self._closed:
            return
        self._closed = True
        if not self._started:
            return
        for node in self.nodes:
            with contextlib.suppress(DockerError):
                (self.base_dir / f"{node.node_id}.log").write_text(self.logs(node.index), encoding="utf-8")
            if node.paused:
                with contextlib.suppress(DockerError):
                    self.resume_node(node.index)
        self.compose("down", "-v", "--remove-orphans", timeout_s=DOWN_TIMEOUT_S)

    # -------------------------------------------------------------- views
    @property
    def client_urls(self) -> list[str]:
        return [node.client_url for node in self.nodes]

    @property
    def urls(self) -> list[str]:
        return self.client_urls  # what each node advertises (--advertise-url in docker-compose.yml)

    @property
    def node_urls(self) -> list[str]:
        return self.client_urls  # no proxy on this target: the published ports are the nodes'

    def poll_url(self, i: int) -> str:
        return self.nodes[i].direct_url

    def link_faults(self) -> None:
        return None  # a container is on the compose network or off it: no per-link control

    def node_isolation(self) -> DockerCluster:
        return self

    def unexpected_exits(self) -> dict[int, int | None]:
        """Nodes the harness started whose container has exited anyway, with its exit code."""
        running = [n for n in self.nodes if n.running() and n.container is not None]
        if not running:
            return {}
        try:
            lines = self.docker("inspect", "--format", "{{.State.Status}} {{.State.ExitCode}}",
                                *[n.container for n in running if n.container]).stdout.splitlines()
        except DockerError:
            return {}
        exits: dict[int, int | None] = {}
        for node, line in zip(running, lines, strict=False):
            status, _, code = line.strip().partition(" ")
            if status in ("exited", "dead"):
                exits[node.index] = int(code) if code.lstrip("-").isdigit() else None
        return exits

    # --------------------------------------------------------------- logs
    def logs(self, i: int) -> str:
        if self.podman:  # rcq logs to stderr, which podman logs keeps apart
            done = self.docker("logs", self._container(i))
            return done.stdout + done.stderr
        return self.compose("logs", "--no-color", self.nodes[i].service).stdout

    def log_tail(self, i: int, tail_bytes: int = LOG_TAIL_BYTES) -> str:
        try:
            return self.logs(i)[-tail_bytes:]
        except DockerError as exc:
            return f"(no log: {exc})"

    def log_paths(self) -> list[Path]:
        return [self.base_dir / f"{node.node_id}.log" for node in self.nodes]
