"""LocalCluster: a real multi-process rcq cluster on loopback.

Used by the integration tests, the local launcher (``python -m cluster up``),
benchmarks and the chaos harness. Each node is a separate ``python -m rcq
serve`` process in its own session (so a signal sent to the test runner or the
launcher's terminal never reaches it), with its own data directory, a JSON
config file readable only by its owner (it holds the cluster secret, which is
never put on a command line), and a log file that restarts append to.

Layout of ``base_dir``::

    cluster.json            what is needed to reopen the cluster (no secret)
    node-0/config.json      NodeConfig of node 0 (mode 0600)
    node-0/data/            its Raft journal and LMDB snapshot
    node-0/node.log         its stdout and stderr, across restarts

Everything here is synchronous (``urllib``), so it works from plain pytest
fixtures, scripts and the launcher alike. Every wait is bounded by a deadline
and fails with a ``TimeoutError`` that shows what each node reported last.

Node indices are 0-based; node ``i`` has node id ``node-i``. A node is *live*
when its process was started by this object, has not exited, and is not
paused: only live nodes are polled.

Must not import: pysyncobj, lmdb, aiohttp (it talks to nodes over HTTP only).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import json
import logging
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
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")

HOST = "127.0.0.1"
MANIFEST_NAME = "cluster.json"
MANIFEST_VERSION = 1
POLL_TIMEOUT_S = 1.0  # socket timeout of one status poll: a stuck node must not stall a wait
POLL_INTERVAL_S = 0.05
STOP_TIMEOUT_S = 10.0  # SIGTERM, then SIGKILL after this
START_TIMEOUT_S = 30.0
LOG_TAIL_BYTES = 6_000
# Keys of /v1/cluster worth showing in a TimeoutError (the whole body is noisy).
STATUS_SUMMARY_KEYS = ("role", "term", "leader_id", "serving", "commit_index", "last_applied", "has_quorum")


class NodeStartError(RuntimeError):
    """A node process exited while the cluster was starting (its log tail is in the message)."""


@dataclasses.dataclass
class LocalNode:
    """One node's fixed identity (stable across restarts) and its current process."""

    index: int
    node_id: str
    http_port: int
    raft_port: int
    directory: Path
    process: subprocess.Popen[bytes] | None = None
    paused: bool = False
    starts: int = 0

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.http_port}"

    @property
    def raft_address(self) -> str:
        return f"{HOST}:{self.raft_port}"

    @property
    def data_dir(self) -> Path:
        return self.directory / "data"

    @property
    def config_path(self) -> Path:
        return self.directory / "config.json"

    @property
    def log_path(self) -> Path:
        return self.directory / "node.log"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def running(self) -> bool:
        """Its process exists and has not exited (it may be paused)."""
        return self.process is not None and self.process.poll() is None

    def live(self) -> bool:
        return self.running() and not self.paused

    def describe(self) -> str:
        if self.process is None:
            return "stopped"
        code = self.process.poll()
        if code is not None:
            return f"exited with {code}"
        return f"pid {self.process.pid}" + (" paused" if self.paused else "")


# ------------------------------------------------------------------ free ports
def free_ports(count: int) -> list[int]:
    """``count`` distinct loopback ports the OS reports free (all bound at once, so no repeats)."""
    with contextlib.ExitStack() as stack:
        ports = []
        for _ in range(count):
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind((HOST, 0))
            ports.append(sock.getsockname()[1])
        return ports


def check_ports_free(ports: Iterable[int]) -> None:
    """Raise OSError naming the first port something listens on (TIME_WAIT leftovers are fine:
    the nodes bind with SO_REUSEADDR too)."""
    for port in ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((HOST, port))
            except OSError as exc:
                raise OSError(f"port {HOST}:{port} is not free: {exc}") from exc


# ------------------------------------------------------------------ HTTP polls
# No proxy: an http_proxy variable in the environment must not route loopback polls elsewhere.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def http_json(url: str, timeout_s: float = POLL_TIMEOUT_S) -> dict[str, Any]:
    """GET ``url`` and decode its JSON body; error statuses with a JSON body are returned too."""
    try:
        with _OPENER.open(url, timeout=timeout_s) as response:
            return dict(json.loads(response.read()))
    except urllib.error.HTTPError as exc:  # /readyz answers 503 with a JSON body
        body = exc.read()
        try:
            return dict(json.loads(body))
        except ValueError:
            raise exc from None


# ------------------------------------------------------- decisions (pure, tested)
def majority(size: int) -> int:
    return size // 2 + 1


def leader_from_views(views: dict[int, dict[str, Any]], urls: Sequence[str]) -> int | None:
    """The node that says it is leader and serving, whose URL a majority of the whole cluster
    (``len(urls)``) names as leader in ``views`` (index -> /v1/cluster body); else None.

    The majority is of the cluster, not of the nodes that answered: a node cut off from the
    others may still call itself leader for a while, and its own view alone must not count.
    """
    for index, view in views.items():
        if view.get("role") != "leader" or not view.get("serving"):
            continue
        agreeing = sum(1 for other in views.values() if other.get("leader_url") == urls[index])
        if agreeing >= majority(len(urls)):
            return index
    return None


def converged(digests: dict[int, dict[str, Any] | None], live: Iterable[int]) -> bool:
    """True when every live node answered, all with the same digest at the same applied index."""
    answers = [digests.get(i) for i in live]
    if not answers or any(a is None for a in answers):
        return False
    return len({(a["digest"], a["applied_index"]) for a in answers if a is not None}) == 1


# ----------------------------------------------------------------- the cluster
class LocalCluster:
    """A cluster of ``nodes`` rcq processes on 127.0.0.1; see the module docstring.

    ``base_dir`` None: a fresh temporary directory, removed by :meth:`close` unless ``keep``.
    A ``base_dir`` given by the caller is never removed; it must not already hold a cluster
    (use :meth:`reopen` for that). ``node_overrides`` are extra NodeConfig fields for every
    node. ``base_port`` fixes the ports (HTTP ``base_port + i``, Raft ``base_port + 100 + i``);
    otherwise free ports are found by binding port 0.
    """

    def __init__(self, nodes: int = 3, base_dir: Path | None = None, secret: str | None = None,
                 node_overrides: dict[str, Any] | None = None, log_level: str = "INFO", *,
                 keep: bool = False, insecure: bool = False, base_port: int | None = None) -> None:
        if nodes < 1:
            raise ValueError("nodes must be at least 1")
        if insecure and secret is not None:
            raise ValueError("insecure and secret exclude each other")
        if secret is not None and len(secret) < 16:
            raise ValueError("secret must be at least 16 characters (NodeConfig.cluster_secret)")
        self.log_level = log_level
        self.node_overrides = dict(node_overrides or {})
        self.insecure = insecure
        self._secret = None if insecure else (secret or secrets.token_urlsafe(32))
        self._owns_dir = base_dir is None
        self.keep = keep
        if base_dir is None:
            self.base_dir = Path(tempfile.mkdtemp(prefix="rcq-cluster-"))
        else:
            self.base_dir = Path(base_dir)
            if (self.base_dir / MANIFEST_NAME).exists():
                raise FileExistsError(f"{self.base_dir} already holds a cluster; use LocalCluster.reopen()")
            self.base_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        if base_port is not None:
            http_ports = [base_port + i for i in range(nodes)]
            raft_ports = [base_port + 100 + i for i in range(nodes)]
            check_ports_free([*http_ports, *raft_ports])
        else:
            ports = free_ports(2 * nodes)
            http_ports, raft_ports = ports[:nodes], ports[nodes:]
        self.nodes = [LocalNode(i, f"node-{i}", http_ports[i], raft_ports[i], self.base_dir / f"node-{i}")
                      for i in range(nodes)]
        self._closed = False
        self._write_files()

    @classmethod
    def reopen(cls, base_dir: Path, log_level: str = "INFO") -> LocalCluster:
        """The cluster whose files are in ``base_dir`` (same ids, ports, secret and data)."""
        base_dir = Path(base_dir)
        manifest = json.loads((base_dir / MANIFEST_NAME).read_text())
        if manifest.get("version") != MANIFEST_VERSION:
            raise ValueError(f"{base_dir / MANIFEST_NAME}: unknown version {manifest.get('version')!r}")
        self = cls.__new__(cls)
        self.log_level = log_level
        self.node_overrides = dict(manifest.get("node_overrides", {}))
        self.insecure = bool(manifest.get("insecure", False))
        self._owns_dir = False
        self.keep = True
        self.base_dir = base_dir
        self.nodes = [LocalNode(n["index"], n["node_id"], n["http_port"], n["raft_port"], base_dir / n["directory"])
                      for n in manifest["nodes"]]
        first_config = json.loads(self.nodes[0].config_path.read_text())
        self._secret = first_config.get("cluster_secret")
        self._closed = False
        check_ports_free([p for n in self.nodes for p in (n.http_port, n.raft_port)])
        self._write_files()  # picks up a changed log level; rewrites the same configs otherwise
        return self

    # ------------------------------------------------------------- files
    def _node_config(self, node: LocalNode) -> dict[str, Any]:
        config: dict[str, Any] = {
            **self.node_overrides,
            "node_id": node.node_id,
            "http_host": HOST,
            "http_port": node.http_port,
            "raft_address": node.raft_address,
            "data_dir": str(node.data_dir),
            "peers": [{"node_id": p.node_id, "raft_address": p.raft_address, "http_url": p.url}
                      for p in self.nodes if p is not node],
        }
        if self.insecure:
            config["insecure"] = True
        else:
            config["cluster_secret"] = self._secret
        return config

    def _write_files(self) -> None:
        for node in self.nodes:
            node.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
            _write_private(node.config_path, json.dumps(self._node_config(node), indent=2) + "\n")
        manifest = {
            "version": MANIFEST_VERSION, "insecure": self.insecure, "node_overrides": self.node_overrides,
            "nodes": [{"index": n.index, "node_id": n.node_id, "http_port": n.http_port,
                       "raft_port": n.raft_port, "directory": n.directory.name} for n in self.nodes],
        }
        _write_private(self.base_dir / MANIFEST_NAME, json.dumps(manifest, indent=2) + "\n")

    # --------------------------------------------------------- lifecycle
    def __enter__(self) -> LocalCluster:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def start(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Start every stopped node and wait until each answers HTTP (not until a leader exists)."""
        for node in self.nodes:
            if not node.running():
                self.start_node(node.index, wait=False)
        self.wait_for_http(timeout_s, self.live_indices())

    def start_node(self, i: int, wait: bool = True, timeout_s: float = START_TIMEOUT_S) -> int:
        """(Re)start node ``i`` with its data dir and ports; returns its pid."""
        self._check_open()
        node = self.nodes[i]
        if node.running():
            raise RuntimeError(f"{node.node_id} is already running ({node.describe()})")
        node.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        env = {k: v for k, v in os.environ.items() if k != "RCQ_CLUSTER_SECRET"}  # the config file decides
        env["PYTHONUNBUFFERED"] = "1"
        with open(node.log_path, "ab") as log_file:
            log_file.write(f"===== {_now()} start #{node.starts + 1} of {node.node_id} =====\n".encode())
            log_file.flush()
            node.process = subprocess.Popen(
                [sys.executable, "-m", "rcq", "serve", "--config", str(node.config_path),
                 "--log-level", self.log_level],
                stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT,
                start_new_session=True, env=env, cwd=node.directory)
        node.paused = False
        node.starts += 1
        log.debug("started %s pid %d", node.node_id, node.process.pid)
        if wait:
            self.wait_for_http(timeout_s, [i])
        return node.process.pid

    def stop_node(self, i: int, timeout_s: float = STOP_TIMEOUT_S) -> int | None:
        """SIGTERM node ``i`` and wait; SIGKILL it after ``timeout_s``. Returns its exit code."""
        node = self.nodes[i]
        if node.process is None:
            return None
        if node.running():
            if node.paused:  # a stopped process would hold SIGTERM until continued
                self.resume_node(i)
            with contextlib.suppress(ProcessLookupError):
                node.process.send_signal(signal.SIGTERM)
            try:
                node.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                log.warning("%s ignored SIGTERM for %.1f s; killing it", node.node_id, timeout_s)
                self._signal_group(node, signal.SIGKILL)
                node.process.wait(timeout_s)
        self._signal_group(node, signal.SIGKILL)  # a forked snapshot writer must not outlive it
        return self._forget_process(node)

    def kill_node(self, i: int) -> int | None:
        """SIGKILL node ``i`` (and anything it forked), as a crash would. Returns its exit code."""
        node = self.nodes[i]
        if node.process is None:
            return None
        self._signal_group(node, signal.SIGKILL)
        node.process.wait(STOP_TIMEOUT_S)
        return self._forget_process(node)

    def pause_node(self, i: int) -> None:
        """SIGSTOP node ``i``: it keeps its sockets but answers nothing until resumed."""
        node = self.nodes[i]
        if not node.running():
            raise RuntimeError(f"{node.node_id} is not running ({node.describe()})")
        self._signal_group(node, signal.SIGSTOP)
        node.paused = True

    def resume_node(self, i: int) -> None:
        node = self.nodes[i]
        if node.running():
            self._signal_group(node, signal.SIGCONT)
        node.paused = False

    def wipe_node(self, i: int) -> None:
        """Delete node ``i``'s data dir (journal and snapshot); it must be stopped."""
        node = self.nodes[i]
        if node.running():
            raise RuntimeError(f"stop {node.node_id} before wiping it ({node.describe()})")
        shutil.rmtree(node.data_dir, ignore_errors=True)

    def heal(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Resume every paused node and start every node that is not running."""
        for node in self.nodes:
            if node.paused:
                self.resume_node(node.index)
        stopped = [node.index for node in self.nodes if not node.running()]
        for i in stopped:
            self.start_node(i, wait=False)
        if stopped:
            self.wait_for_http(timeout_s, stopped)

    def close(self) -> None:
        """Stop every node (resumed first, SIGKILL if SIGTERM is not enough); remove an owned temp dir."""
        if self._closed:
            return
        self._closed = True
        try:
            for node in self.nodes:
                if node.paused:
                    with contextlib.suppress(Exception):
                        self.resume_node(node.index)
            for node in self.nodes:  # SIGTERM all first, so nodes shut down in parallel
                if node.running():
                    with contextlib.suppress(ProcessLookupError):
                        node.process.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
            deadline = time.monotonic() + STOP_TIMEOUT_S
            for node in self.nodes:
                if node.process is None:
                    continue
                try:
                    node.process.wait(max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    log.warning("%s ignored SIGTERM; killing it", node.node_id)
                self._signal_group(node, signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    node.process.wait(STOP_TIMEOUT_S)
                self._forget_process(node)
        finally:
            if self._owns_dir and not self.keep:
                shutil.rmtree(self.base_dir, ignore_errors=True)

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("the cluster is closed")

    @staticmethod
    def _signal_group(node: LocalNode, signum: signal.Signals) -> None:
        # Each node leads its own session and process group (start_new_session), so the
        # group id is its pid; the group also holds any child it forked.
        if node.process is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(node.process.pid, signum)

    @staticmethod
    def _forget_process(node: LocalNode) -> int | None:
        code = node.process.returncode if node.process is not None else None
        node.process = None
        node.paused = False
        return code

    # ----------------------------------------------------------- views
    @property
    def urls(self) -> list[str]:
        return [node.url for node in self.nodes]

    def url(self, i: int) -> str:
        return self.nodes[i].url

    @property
    def secret(self) -> str | None:
        return self._secret

    def pids(self) -> dict[int, int]:
        return {node.index: node.pid for node in self.nodes if node.pid is not None and node.running()}

    def live_indices(self) -> list[int]:
        return [node.index for node in self.nodes if node.live()]

    def unexpected_exits(self) -> dict[int, int]:
        """Nodes whose process exited on its own (not stopped or killed here): index -> exit code."""
        return {node.index: node.process.returncode for node in self.nodes
                if node.process is not None and node.process.poll() is not None}

    def status(self, i: int, timeout_s: float = POLL_TIMEOUT_S) -> dict[str, Any]:
        """Node ``i``'s GET /v1/cluster (raises OSError if it does not answer)."""
        return http_json(self.url(i) + "/v1/cluster", timeout_s)

    def digest(self, i: int, timeout_s: float = POLL_TIMEOUT_S) -> dict[str, Any]:
        """Node ``i``'s GET /v1/cluster/digest: ``digest`` and ``applied_index``."""
        return http_json(self.url(i) + "/v1/cluster/digest", timeout_s)

    def _poll(self, fetch: Callable[[int], T], indices: Sequence[int]) -> tuple[dict[int, T], dict[int, str]]:
        """Call ``fetch`` on each node in parallel: (answers, errors) by index."""
        answers: dict[int, T] = {}
        errors: dict[int, str] = {}
        if not indices:
            return answers, errors
        with concurrent.futures.ThreadPoolExecutor(max_workers=len(indices)) as pool:
            futures = {i: pool.submit(fetch, i) for i in indices}
            for i, future in futures.items():
                try:
                    answers[i] = future.result()
                except (OSError, ValueError) as exc:  # refused, timed out, garbled
                    errors[i] = f"{type(exc).__name__}: {exc}"
        return answers, errors

    def _describe_seen(self, answers: dict[int, dict[str, Any]], errors: dict[int, str],
                       keys: Sequence[str] = STATUS_SUMMARY_KEYS) -> str:
        lines = []
        for node in self.nodes:
            i = node.index
            if i in answers:
                seen = ", ".join(f"{k}={answers[i].get(k)!r}" for k in keys)
            elif i in errors:
                seen = f"no answer: {errors[i]}"
            else:
                seen = "not polled"
            lines.append(f"  {node.node_id} {node.url} [{node.describe()}]: {seen}")
        return "\n".join(lines)

    # ----------------------------------------------------------- waits
    def wait_for_http(self, timeout_s: float, indices: Iterable[int] | None = None) -> None:
        """Wait until the given nodes (default: live ones) answer GET /healthz.

        Raises NodeStartError at once if one of them exits, with its log tail.
        """
        pending = set(self.live_indices() if indices is None else indices)
        deadline = time.monotonic() + timeout_s
        errors: dict[int, str] = {}
        while True:
            for i in sorted(pending):
                node = self.nodes[i]
                if not node.running():
                    raise NodeStartError(f"{node.node_id} {node.describe()} while starting; its log:\n"
                                         + self.log_tail(i))
            answers, errors = self._poll(lambda i: http_json(self.url(i) + "/healthz"), sorted(pending))
            pending -= set(answers)
            if not pending:
                return
            if time.monotonic() >= deadline:
                raise TimeoutError(f"nodes {sorted(pending)} did not answer /healthz within {timeout_s} s:\n"
                                   + self._describe_seen({}, errors))
            time.sleep(POLL_INTERVAL_S)

    def _deadline_loop(self, timeout_s: float) -> Iterator[float]:
        """Yield until the deadline (always at least once), sleeping between iterations."""
        deadline = time.monotonic() + timeout_s
        while True:
            yield deadline
            if time.monotonic() >= deadline:
                return
            time.sleep(POLL_INTERVAL_S)

    def wait_for_leader(self, timeout_s: float = 30.0) -> int:
        """Index of the node that is leader *and* serving, named as leader by a majority of the
        cluster among the live nodes' /v1/cluster views. Paused and stopped nodes are not asked.
        """
        answers: dict[int, dict[str, Any]] = {}
        errors: dict[int, str] = {}
        for _ in self._deadline_loop(timeout_s):
            answers, errors = self._poll(self.status, self.live_indices())
            leader = leader_from_views(answers, self.urls)
            if leader is not None:
                return leader
        raise TimeoutError(f"no serving leader agreed by {majority(len(self.nodes))} of {len(self.nodes)} "
                           f"nodes within {timeout_s} s; last seen:\n" + self._describe_seen(answers, errors))

    def wait_for_applied(self, timeout_s: float = 30.0) -> int:
        """Wait until every live node has applied the commit index the leader reported when it
        was first found by this call; returns that index. Finding the leader counts against the
        same deadline.
        """
        target: int | None = None
        answers: dict[int, dict[str, Any]] = {}
        errors: dict[int, str] = {}
        for _ in self._deadline_loop(timeout_s):
            live = self.live_indices()
            answers, errors = self._poll(self.status, live)
            if target is None:
                leader = leader_from_views(answers, self.urls)
                if leader is None:
                    continue
                target = int(answers[leader]["commit_index"])
            if all(i in answers and int(answers[i]["last_applied"]) >= target for i in live):
                return target
        what = "no serving leader was found" if target is None else f"live nodes did not apply index {target}"
        raise TimeoutError(f"{what} within {timeout_s} s; last seen:\n" + self._describe_seen(answers, errors))

    def wait_for_convergence(self, timeout_s: float = 30.0) -> dict[str, Any]:
        """Wait until every live node reports the same state digest at the same applied index;
        returns ``{"digest", "applied_index"}``.
        """
        answers: dict[int, dict[str, Any]] = {}
        errors: dict[int, str] = {}
        for _ in self._deadline_loop(timeout_s):
            live = self.live_indices()
            answers, errors = self._poll(self.digest, live)
            if converged(dict(answers), live):
                first = answers[live[0]]
                return {"digest": first["digest"], "applied_index": first["applied_index"]}
        raise TimeoutError(f"live nodes did not converge within {timeout_s} s; last seen:\n"
                           + self._describe_seen(answers, errors, ("applied_index", "digest")))

    # ------------------------------------------------------------ logs
    def log_tail(self, i: int, tail_bytes: int = LOG_TAIL_BYTES) -> str:
        path = self.nodes[i].log_path
        try:
            with open(path, "rb") as log_file:
                log_file.seek(0, os.SEEK_END)
                size = log_file.tell()
                log_file.seek(max(0, size - tail_bytes))
                text = log_file.read().decode("utf-8", errors="replace")
        except FileNotFoundError:
            return "(no log yet)"
        return ("...\n" if size > tail_bytes else "") + text

    def dump_logs(self, tail_bytes: int = LOG_TAIL_BYTES) -> str:
        """The tail of every node's log, headed by its id, URL and process state."""
        parts = []
        for node in self.nodes:
            parts.append(f"----- {node.node_id} {node.url} raft {node.raft_address} [{node.describe()}] "
                         f"log {node.log_path} -----\n{self.log_tail(node.index, tail_bytes)}")
        return "\n".join(parts)


def _write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` readable by its owner only, from the first byte on."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as file:
        file.write(text)
    os.chmod(tmp, 0o600)  # O_CREAT's mode does not apply when the file already existed
    os.replace(tmp, path)


def _now() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S")
