"""The cluster under test: real ``rcq serve`` processes whose every byte crosses the proxy.

Each node has its own directory (``node-i/config.json``, ``data/``, ``node.log``)
and is started as ``python -m rcq serve --config ...`` in its own session, so
kill -9, SIGSTOP and SIGCONT reach exactly it and what it forked. The harness
is a black box: it writes the node configuration files an operator would and
talks to nodes over HTTP; it imports nothing of rcq's server.

**Raft through the proxy.** pysyncobj keeps one TCP connection per pair of
nodes. Only the node whose own address (``host:port`` string) is *greater*
dials (``TCPTransport._shouldConnect``), and its first message is its own
address, which the accepting node looks up in its peer list to learn who is
calling. So:

* node ``i`` is known to every other node by its real ``raft_address``
  (that string identifies it when it dials), and
* the dialler ``i`` reaches a smaller node ``j`` through the proxy link
  ``raft:node-i->node-j``: in ``i``'s peer list, ``j``'s address is that link's
  port, which must compare *below* ``i``'s own address or ``i`` would not dial.

The harness therefore picks the ``n`` greatest ports (as strings) of a pool of
free ports for the nodes' Raft listeners and gives the links the smaller ones.
``forward`` on a Raft link is dialler -> acceptor. Client traffic reaches node
``i`` through ``client->node-i``; every node advertises that URL, so the
leader URLs the nodes give clients go through the proxy too. The harness's own
status polls go straight to the nodes' HTTP ports, so a client partition never
blinds the checker.

Must not import: any rcq module but rcq.client and rcq.errors (it needs neither).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from chaos.netproxy import HOST, ProxyThread

T = TypeVar("T")

POLL_TIMEOUT_S = 1.0
POLL_INTERVAL_S = 0.1
STOP_TIMEOUT_S = 10.0
START_TIMEOUT_S = 60.0
LOG_TAIL_BYTES = 4000
PORT_ALLOCATION_ATTEMPTS = 5

# Nodes tuned so that faults matter: short transaction deadlines (vanished clients give their
# items back quickly) and snapshots every few hundred entries or seconds, so log compaction and
# snapshot installs happen *during* faults.
CHAOS_NODE_OVERRIDES: dict[str, Any] = {
    "transaction_timeout_default_s": 10.0,
    "log_compaction_min_entries": 200,
    "log_compaction_min_time_s": 5.0,
    "commit_timeout_s": 5.0,
}

_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def http_json(url: str, method: str = "GET", timeout_s: float = POLL_TIMEOUT_S) -> dict[str, Any]:
    """One request straight to a node; error statuses with a JSON body are answers too."""
    request = urllib.request.Request(url, method=method, data=b"{}" if method == "POST" else None,
                                     headers={"Content-Type": "application/json"})
    try:
        with _OPENER.open(request, timeout=timeout_s) as response:
            return dict(json.loads(response.read()))
    except urllib.error.HTTPError as exc:
        body = exc.read()
        try:
            return dict(json.loads(body))
        except ValueError:
            raise exc from None


def free_ports(count: int) -> list[int]:
    with contextlib.ExitStack() as stack:
        ports = []
        for _ in range(count):
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind((HOST, 0))
            ports.append(sock.getsockname()[1])
        return ports


def address(port: int) -> str:
    return f"{HOST}:{port}"


def raft_link(a: int, b: int) -> str:
    """The proxy link carrying Raft between nodes ``a`` and ``b`` (the greater dials)."""
    dialler, acceptor = max(a, b), min(a, b)
    return f"raft:node-{dialler}->node-{acceptor}"


def client_link(i: int) -> str:
    return f"client->node-{i}"


@dataclasses.dataclass
class ChaosNode:
    index: int
    http_port: int
    raft_port: int
    client_port: int  # the proxy's port in front of http_port
    directory: Path
    process: subprocess.Popen[bytes] | None = None
    paused: bool = False
    starts: int = 0

    @property
    def node_id(self) -> str:
        return f"node-{self.index}"

    @property
    def direct_url(self) -> str:
        return f"http://{HOST}:{self.http_port}"

    @property
    def client_url(self) -> str:
        return f"http://{HOST}:{self.client_port}"

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def live(self) -> bool:
        return self.running() and not self.paused


class ChaosCluster:
    """``nodes`` rcq processes on 127.0.0.1 wired through ``proxy`` (see the module docstring)."""

    def __init__(self, nodes: int, proxy: ProxyThread, base_dir: Path | None = None,
                 node_overrides: dict[str, Any] | None = None, log_level: str = "INFO") -> None:
        if nodes < 1:
            raise ValueError("nodes must be at least 1")
        self.proxy = proxy
        self.log_level = log_level
        self.node_overrides = {**CHAOS_NODE_OVERRIDES, **(node_overrides or {})}
        self._owns_dir = base_dir is None
        self.base_dir = Path(base_dir) if base_dir is not None else Path(tempfile.mkdtemp(prefix="rcq-chaos-"))
        self.base_dir.mkdir(parents=True, exist_ok=True)
        self._secret = secrets.token_urlsafe(32)
        self.raft_proxy_ports: dict[tuple[int, int], int] = {}  # (dialler, acceptor) -> link port
        self.nodes: list[ChaosNode] = []
        self._allocate(nodes)
        self._closed = False
        for node in self.nodes:
            self._write_config(node)

    # ------------------------------------------------------------- wiring
    def _allocate(self, count: int) -> None:
        pairs = [(i, j) for i in range(count) for j in range(i)]
        for attempt in range(PORT_ALLOCATION_ATTEMPTS):
            pool = sorted(free_ports(2 * count + len(pairs)), key=address)
            raft_ports, rest = pool[-count:], pool[:-count]  # the greatest addresses: they dial
            http_ports, link_ports = rest[:count], rest[count:]
            added: list[str] = []
            try:
                for (i, j), port in zip(pairs, link_ports, strict=True):
                    self.proxy.add_link(raft_link(i, j), raft_ports[j], port)
                    added.append(raft_link(i, j))
                    self.raft_proxy_ports[(i, j)] = port
            except OSError:  # a port was taken between the probe and the bind: pick again
                for name in added:
                    self.proxy.remove_link(name)
                if attempt + 1 == PORT_ALLOCATION_ATTEMPTS:
                    raise
                continue
            break
        for i in range(count):
            client_port = self.proxy.add_link(client_link(i), http_ports[i])
            self.nodes.append(ChaosNode(i, http_ports[i], raft_ports[i], client_port, self.base_dir / f"node-{i}"))
        for (i, _), port in self.raft_proxy_ports.items():
            assert address(port) < address(raft_ports[i]), "node i would not dial node j"

    def _peer_address(self, me: int, other: int) -> str:
        if other < me:  # I dial it, through the proxy
            return address(self.raft_proxy_ports[(me, other)])
        return address(self.nodes[other].raft_port)  # it dials me and says its real address

    def node_config(self, node: ChaosNode) -> dict[str, Any]:
        return {
            **self.node_overrides,
            "node_id": node.node_id,
            "http_host": HOST,
            "http_port": node.http_port,
            "advertise_url": node.client_url,
            "raft_address": address(node.raft_port),
            "data_dir": str(node.directory / "data"),
            "cluster_secret": self._secret,
            "peers": [{"node_id": other.node_id, "raft_address": self._peer_address(node.index, other.index),
                       "http_url": other.client_url} for other in self.nodes if other is not node],
        }

    def _write_config(self, node: ChaosNode) -> None:
        node.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        path = node.directory / "config.json"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as file:
            json.dump(self.node_config(node), file, indent=2)

    # --------------------------------------------------------- processes
    def start(self, timeout_s: float = START_TIMEOUT_S) -> None:
        for node in self.nodes:
            if not node.running():
                self.start_node(node.index, wait=False)
        self.wait_for_http([n.index for n in self.nodes], timeout_s)

    def start_node(self, i: int, wait: bool = True, timeout_s: float = START_TIMEOUT_S) -> int:
        if self._closed:
            raise RuntimeError("the cluster is closed")
        node = self.nodes[i]
        if node.running():
            raise RuntimeError(f"{node.node_id} is already running")
        env = {k: v for k, v in os.environ.items() if k != "RCQ_CLUSTER_SECRET"}
        env["PYTHONUNBUFFERED"] = "1"
        with open(node.directory / "node.log", "ab") as log_file:
            log_file.write(f"===== {time.strftime('%H:%M:%S')} start #{node.starts + 1} =====\n".encode())
            log_file.flush()
            node.process = subprocess.Popen(
                [sys.executable, "-m", "rcq", "serve", "--config", str(node.directory / "config.json"),
                 "--log-level", self.log_level],
                stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT,
                start_new_session=True, env=env, cwd=node.directory)
        node.paused = False
        node.starts += 1
        if wait:
            self.wait_for_http([i], timeout_s)
        return node.process.pid

    def kill_node(self, i: int) -> None:
        """kill -9, as a crash would (the node's whole process group)."""
        node = self.nodes[i]
        if node.process is None:
            return
        self._signal(node, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            node.process.wait(STOP_TIMEOUT_S)
        node.process, node.paused = None, False

    def pause_node(self, i: int) -> None:
        node = self.nodes[i]
        if node.running():
            self._signal(node, signal.SIGSTOP)
            node.paused = True

    def resume_node(self, i: int) -> None:
        node = self.nodes[i]
        if node.running():
            self._signal(node, signal.SIGCONT)
        node.paused = False

    def wipe_node(self, i: int) -> None:
        node = self.nodes[i]
        if node.running():
            raise RuntimeError(f"stop {node.node_id} before wiping it")
        shutil.rmtree(node.directory / "data", ignore_errors=True)

    def heal_processes(self, timeout_s: float = START_TIMEOUT_S) -> list[int]:
        """Resume paused nodes and start stopped ones; returns the indices started."""
        for node in self.nodes:
            if node.paused:
                self.resume_node(node.index)
        stopped = [node.index for node in self.nodes if not node.running()]
        for i in stopped:
            self.start_node(i, wait=False)
        if stopped:
            self.wait_for_http(stopped, timeout_s)
        return stopped

    def close(self, keep: bool = True) -> None:
        """Stop every node (SIGCONT, SIGTERM, then SIGKILL); remove an owned dir unless ``keep``."""
        if self._closed:
            return
        self._closed = True
        for node in self.nodes:
            if node.running():
                self._signal(node, signal.SIGCONT)
                with contextlib.suppress(ProcessLookupError):
                    node.process.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for node in self.nodes:
            if node.process is None:
                continue
            with contextlib.suppress(subprocess.TimeoutExpired):
                node.process.wait(max(0.1, deadline - time.monotonic()))
            self._signal(node, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                node.process.wait(STOP_TIMEOUT_S)
            node.process = None
        if self._owns_dir and not keep:
            shutil.rmtree(self.base_dir, ignore_errors=True)

    @staticmethod
    def _signal(node: ChaosNode, signum: signal.Signals) -> None:
        if node.process is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(node.process.pid, signum)

    # ------------------------------------------------------------- views
    @property
    def client_urls(self) -> list[str]:
        return [node.client_url for node in self.nodes]

    def live_indices(self) -> list[int]:
        return [node.index for node in self.nodes if node.live()]

    def running_indices(self) -> list[int]:
        return [node.index for node in self.nodes if node.running()]

    def unexpected_exits(self) -> dict[int, int | None]:
        return {n.index: n.process.returncode for n in self.nodes if n.process is not None and n.process.poll() is not None}

    def status(self, i: int) -> dict[str, Any]:
        return http_json(self.nodes[i].direct_url + "/v1/cluster")

    def digest(self, i: int) -> dict[str, Any]:
        return http_json(self.nodes[i].direct_url + "/v1/cluster/digest")

    def request_snapshot(self, i: int) -> dict[str, Any]:
        return http_json(self.nodes[i].direct_url + "/v1/admin/snapshot", method="POST")

    def poll(self, fetch: Callable[[int], T], indices: Sequence[int]) -> dict[int, T]:
        """``fetch`` on each node in parallel; nodes that fail to answer are left out."""
        answers: dict[int, T] = {}
        if not indices:
            return answers
        with concurrent.futures.ThreadPoolExecutor(max_workers=len(indices)) as pool:
            futures = {i: pool.submit(fetch, i) for i in indices}
            for i, future in futures.items():
                with contextlib.suppress(OSError, ValueError):
                    answers[i] = future.result()
        return answers

    def leader(self) -> int | None:
        """The serving leader a majority of the whole cluster names, among live nodes' views."""
        views = self.poll(self.status, self.live_indices())
        for i, view in views.items():
            if view.get("role") != "leader" or not view.get("serving"):
                continue
            agreeing = sum(1 for v in views.values() if v.get("leader_url") == self.nodes[i].client_url)
            if agreeing >= len(self.nodes) // 2 + 1:
                return i
        return None

    # ------------------------------------------------------------- waits
    def wait_for(self, timeout_s: float, attempt: Callable[[], T | None], what: str) -> T:
        deadline = time.monotonic() + timeout_s
        while True:
            result = attempt()
            if result is not None:
                return result
            if time.monotonic() >= deadline:
                raise TimeoutError(f"{what} within {timeout_s} s")
            time.sleep(POLL_INTERVAL_S)

    def wait_for_http(self, indices: Iterable[int], timeout_s: float = START_TIMEOUT_S) -> None:
        pending = set(indices)

        def attempt() -> bool | None:
            for i in pending:
                if not self.nodes[i].running():
                    raise RuntimeError(f"node-{i} exited while starting; its log:\n{self.log_tail(i)}")
            pending.difference_update(self.poll(lambda i: http_json(self.nodes[i].direct_url + "/healthz"),
                                                sorted(pending)))
            return True if not pending else None

        self.wait_for(timeout_s, attempt, f"nodes {sorted(pending)} did not answer /healthz")

    def wait_for_leader(self, timeout_s: float = 30.0) -> int:
        return self.wait_for(timeout_s, self.leader, "no serving leader agreed by a majority")

    def wait_for_applied(self, timeout_s: float = 30.0) -> int:
        """Every live node has applied the commit index the leader reported first; returns it."""
        target: list[int] = []

        def attempt() -> int | None:
            live = self.live_indices()
            views = self.poll(self.status, live)
            if not target:
                leader = next((i for i, v in views.items() if v.get("role") == "leader" and v.get("serving")), None)
                if leader is None:
                    return None
                target.append(int(views[leader]["commit_index"]))
            if all(i in views and int(views[i]["last_applied"]) >= target[0] for i in live):
                return target[0]
            return None

        return self.wait_for(timeout_s, attempt, "live nodes did not apply the leader's commit index")

    def wait_for_convergence(self, timeout_s: float = 30.0) -> dict[str, str]:
        """Every node (all must be live) reports the same digest at the same applied index:
        ``{"node-i": "<digest>@<applied_index>"}``."""

        def attempt() -> dict[str, str] | None:
            answers = self.poll(self.digest, self.live_indices())
            if len(answers) != len(self.nodes):
                return None
            seen = {i: f"{a['digest']}@{a['applied_index']}" for i, a in answers.items()}
            return {self.nodes[i].node_id: s for i, s in sorted(seen.items())} if len(set(seen.values())) == 1 else None

        return self.wait_for(timeout_s, attempt, "nodes did not converge to one digest")

    def digests(self) -> dict[str, str | None]:
        answers = self.poll(self.digest, self.live_indices())
        return {n.node_id: (f"{answers[n.index]['digest']}@{answers[n.index]['applied_index']}"
                            if n.index in answers else None) for n in self.nodes}

    # -------------------------------------------------------------- logs
    def log_tail(self, i: int, tail_bytes: int = LOG_TAIL_BYTES) -> str:
        path = self.nodes[i].directory / "node.log"
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return "(no log)"
        return data[-tail_bytes:].decode("utf-8", errors="replace")

    def log_paths(self) -> list[Path]:
        return [node.directory / "node.log" for node in self.nodes]
