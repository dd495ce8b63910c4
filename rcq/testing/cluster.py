"""LocalCluster: a real multi-process rcq cluster on loopback — the one cluster harness.

Used by the integration tests, the local launcher (``python -m cluster up``), the
benchmarks and the chaos harness (which puts its proxy in front of every link by
overriding :meth:`LocalCluster.allocate_ports`, :meth:`~LocalCluster.advertised_url` and
:meth:`~LocalCluster.peer_raft_address`). Each node is a separate ``python -m rcq serve``
process in its own session, with its own data directory, a JSON config file readable only by
its owner (it holds the cluster secret, which is never put on a command line), and a log
file that restarts append to.

Layout of ``base_dir``::

    cluster.json            what is needed to reopen the cluster (no secret)
    node-0/config.json      NodeConfig of node 0 (mode 0600)
    node-0/data/            its Raft journal and LMDB snapshot
    node-0/node.log         its stdout and stderr, across restarts

The harness is split by job: this module owns the cluster's files and the lifecycle of its
nodes (start, stop, kill -9, SIGSTOP/SIGCONT, wipe, heal, close); a node's ports, files and
process mechanics are :mod:`rcq.testing.nodes`; polling the nodes over HTTP and the bounded
waits (leader, applied, convergence) are :mod:`rcq.testing.polls`, which this class extends.
Node indices are 0-based; node ``i`` has node id ``node-i``.

Must not import: rcq.server (nodes are separate processes), pysyncobj, lmdb, aiohttp.
"""

from __future__ import annotations

import contextlib
import json
import logging
import secrets
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Self

from rcq.private_files import write_private
from rcq.testing.nodes import (
    HOST,
    LOG_TAIL_BYTES,
    STOP_TIMEOUT_S,
    LocalNode,
    check_ports_free,
    free_ports,
    read_tail,
)
from rcq.testing.polls import PolledCluster

log = logging.getLogger(__name__)

MANIFEST_NAME = "cluster.json"
MANIFEST_VERSION = 1


class LocalCluster(PolledCluster[LocalNode]):
    """A cluster of ``nodes`` rcq processes on 127.0.0.1; see the module docstring.

    ``base_dir`` None: a fresh temporary directory, removed by :meth:`close` unless ``keep``.
    A ``base_dir`` given by the caller is never removed; it must not already hold a cluster
    (use :meth:`reopen` for that). ``node_overrides`` are extra NodeConfig fields for every
    node. ``base_port`` fixes the ports (HTTP ``base_port + i``, Raft ``base_port + 100 + i``);
    otherwise :meth:`allocate_ports` picks free ones.
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
        if base_dir is not None and (Path(base_dir) / MANIFEST_NAME).exists():
            raise FileExistsError(f"{base_dir} already holds a cluster; use LocalCluster.reopen()")
        self.log_level = log_level
        self.node_overrides = dict(node_overrides or {})
        self.insecure = insecure
        self._secret = None if insecure else (secret or secrets.token_urlsafe(32))
        self.keep = keep
        self._closed = False
        if base_port is not None:
            http_ports = [base_port + i for i in range(nodes)]
            raft_ports = [base_port + 100 + i for i in range(nodes)]
            check_ports_free([*http_ports, *raft_ports])
        else:
            http_ports, raft_ports = self.allocate_ports(nodes)
        # The directory comes after the ports, so a failure to find ports leaves nothing behind.
        self._owns_dir = base_dir is None
        self.base_dir = Path(tempfile.mkdtemp(prefix="rcq-cluster-")) if base_dir is None else Path(base_dir)
        self.nodes = [LocalNode(i, f"node-{i}", http_ports[i], raft_ports[i], self.base_dir / f"node-{i}")
                      for i in range(nodes)]
        try:
            self.base_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            self._write_files()
        except BaseException:
            self._remove_owned_dir()
            raise

    @classmethod
    def reopen(cls, base_dir: Path, log_level: str = "INFO") -> Self:
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

    # ------------------------------------------------- wiring (extension points)
    def allocate_ports(self, count: int) -> tuple[list[int], list[int]]:
        """(HTTP ports, Raft ports) for ``count`` nodes; called once, before any file is written."""
        ports = free_ports(2 * count)
        return ports[:count], ports[count:]

    def advertised_url(self, i: int) -> str:
        """The URL node ``i`` gives clients and its peers for itself (its own port here)."""
        return self.nodes[i].url

    def peer_raft_address(self, me: int, other: int) -> str:
        """The Raft address node ``me`` is configured with for node ``other``."""
        return self.nodes[other].raft_address

    # ------------------------------------------------------------- files
    def _node_config(self, node: LocalNode) -> dict[str, Any]:
        config: dict[str, Any] = {
            **self.node_overrides,
            "node_id": node.node_id,
            "http_host": HOST,
            "http_port": node.http_port,
            "raft_address": node.raft_address,
            "data_dir": str(node.data_dir),
            "peers": [{"node_id": p.node_id, "raft_address": self.peer_raft_address(node.index, p.index),
                       "http_url": self.advertised_url(p.index)} for p in self.nodes if p is not node],
        }
        if self.advertised_url(node.index) != node.url:
            config["advertise_url"] = self.advertised_url(node.index)
        if self.insecure:
            config["insecure"] = True
        else:
            config["cluster_secret"] = self._secret
        return config

    def _write_files(self) -> None:
        for node in self.nodes:
            node.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
            write_private(node.config_path, json.dumps(self._node_config(node), indent=2) + "\n")
        manifest = {
            "version": MANIFEST_VERSION, "insecure": self.insecure, "node_overrides": self.node_overrides,
            "nodes": [{"index": n.index, "node_id": n.node_id, "http_port": n.http_port,
                       "raft_port": n.raft_port, "directory": n.directory.name} for n in self.nodes],
        }
        write_private(self.base_dir / MANIFEST_NAME, json.dumps(manifest, indent=2) + "\n")

    def _remove_owned_dir(self) -> None:
        if self._owns_dir and not self.keep:
            shutil.rmtree(self.base_dir, ignore_errors=True)

    # --------------------------------------------------------- lifecycle
    def __enter__(self) -> Self:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def start(self, timeout_s: float | None = None) -> None:
        """Start every stopped node and wait until each answers HTTP (not until a leader exists)."""
        for node in self.nodes:
            if not node.running():
                self.start_node(node.index, wait=False)
        self.wait_for_http(self.live_indices(), timeout_s)

    def start_node(self, i: int, wait: bool = True, timeout_s: float | None = None) -> int:
        """(Re)start node ``i`` with its data dir and ports; returns its pid."""
        if self._closed:
            raise RuntimeError("the cluster is closed")
        pid = self.nodes[i].spawn(self.log_level)
        if wait:
            self.wait_for_http([i], timeout_s)
        return pid

    def stop_node(self, i: int, timeout_s: float = STOP_TIMEOUT_S) -> int | None:
        """SIGTERM node ``i`` and wait; SIGKILL it after ``timeout_s``. Returns its exit code."""
        self.nodes[i].request_stop()
        return self.nodes[i].finish_stop(timeout_s)

    def kill_node(self, i: int) -> int | None:
        """SIGKILL node ``i`` (and anything it forked), as a crash would. Returns its exit code."""
        return self.nodes[i].kill()

    def pause_node(self, i: int) -> None:
        """SIGSTOP node ``i``: it keeps its sockets but answers nothing until resumed."""
        self.nodes[i].pause()

    def resume_node(self, i: int) -> None:
        self.nodes[i].resume()

    def wipe_node(self, i: int) -> None:
        """Delete node ``i``'s data dir (journal and snapshot); it must be stopped."""
        node = self.nodes[i]
        if node.running():
            raise RuntimeError(f"stop {node.node_id} before wiping it ({node.describe()})")
        shutil.rmtree(node.data_dir, ignore_errors=True)

    def heal(self, timeout_s: float | None = None) -> list[int]:
        """Resume every paused node and start every node that is not running; returns those started."""
        for node in self.nodes:
            if node.paused:
                node.resume()
        stopped = [node.index for node in self.nodes if not node.running()]
        for i in stopped:
            self.start_node(i, wait=False)
        if stopped:
            self.wait_for_http(stopped, timeout_s)
        return stopped

    def close(self) -> None:
        """Stop every node (resumed first, SIGKILL if SIGTERM is not enough); remove an owned temp dir."""
        if self._closed:
            return
        self._closed = True
        try:
            for node in self.nodes:  # SIGTERM all first, so nodes shut down in parallel
                with contextlib.suppress(Exception):
                    node.request_stop()
            deadline = time.monotonic() + STOP_TIMEOUT_S
            for node in self.nodes:
                node.finish_stop(max(0.0, deadline - time.monotonic()))
        finally:
            self._remove_owned_dir()

    # ----------------------------------------------------------- views
    @property
    def urls(self) -> list[str]:
        return [self.advertised_url(i) for i in range(len(self.nodes))]

    def url(self, i: int) -> str:
        """Node ``i``'s own HTTP URL."""
        return self.nodes[i].url

    def poll_url(self, i: int) -> str:
        return self.nodes[i].url

    @property
    def secret(self) -> str | None:
        return self._secret

    def pids(self) -> dict[int, int]:
        return {node.index: node.pid for node in self.nodes if node.pid is not None and node.running()}

    def unexpected_exits(self) -> dict[int, int]:
        """Nodes whose process exited on its own (not stopped or killed here): index -> exit code."""
        return {node.index: node.process.returncode for node in self.nodes
                if node.process is not None and node.process.poll() is not None}

    # ------------------------------------------------------------ logs
    def log_paths(self) -> list[Path]:
        return [node.log_path for node in self.nodes]

    def log_tail(self, i: int, tail_bytes: int = LOG_TAIL_BYTES) -> str:
        return read_tail(self.nodes[i].log_path, tail_bytes)

    def dump_logs(self, tail_bytes: int = LOG_TAIL_BYTES) -> str:
        """The tail of every node's log, headed by its id, URL and process state."""
        parts = []
        for node in self.nodes:
            parts.append(f"----- {node.node_id} {node.url} raft {node.raft_address} [{node.describe()}] "
                         f"log {node.log_path} -----\n{self.log_tail(node.index, tail_bytes)}")
        return "\n".join(parts)
