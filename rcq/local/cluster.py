"""LocalCluster: a real multi-process rcq cluster on loopback — the one cluster harness.

Why over 400 lines: the one class every harness drives and extends; each method is a few lines over its collaborators.

Used by the integration tests, the local launcher (``python -m cluster up``), the
benchmarks and the chaos harness (which puts its proxy in front of every link by
overriding :meth:`LocalCluster.allocate_ports`, :meth:`~LocalCluster.advertised_url` and
:meth:`~LocalCluster.peer_raft_address`). Each node is a separate ``python -m rcq serve``
process in its own session, with its own data directory, a JSON config file readable only by
its owner (it holds the cluster secret, which is never put on a command line), and a log
file that restarts append to.

**Tokens** (``auth=True``, the default): the nodes accept API tokens from their tokens file
and nothing else, as a production cluster would. The harness makes an admin token, keeps it
in ``admin.token`` (so a reopened cluster has it), sends it with every poll and hands it to
clients through :meth:`LocalCluster.client_options`; :meth:`~LocalCluster.add_token` and
:meth:`~LocalCluster.revoke_token` change every node's tokens file (nodes re-read it within a
second; both wait until they have). ``auth=False``: no tokens at all, which a node allows
because it binds 127.0.0.1 only. **TLS** (``tls=True``): the nodes serve HTTPS with
certificates of a CA made for the cluster (:mod:`rcq.local.tls`); every URL is
``https://``, and clients verify the nodes against ``ca_file``. With
``tls_client_certificates=True`` the nodes also require a client certificate of that CA
(mutual TLS): the harness makes one (``client_cert``) and presents it itself.

**Releases** (:mod:`rcq.local.releases`): a node runs the code under test unless it is given a
:class:`~rcq.local.releases.Release`, another version of rcq from this repository's history:
``LocalCluster(3, release=previous)`` starts every node of that release, and
:meth:`LocalCluster.restart_node_as` restarts one node into another release (or, with None, into
the code under test), as a rolling upgrade does. A node of a release gets a config file with only
the fields that release's NodeConfig knows (it forbids any other); the tokens file is the same for
every node. A reopened cluster runs the code under test (a release is not in the manifest).

The harness is split by job: this module owns what each node is configured with and the
lifecycle of the nodes (start, stop, kill -9, SIGSTOP/SIGCONT, wipe, heal, close); the layout of
``base_dir`` and what each file holds (manifest, TLS material, tokens files) are
:mod:`rcq.local.cluster_files`; a node's ports, files and process mechanics are
:mod:`rcq.local.nodes`; polling the nodes over HTTP and the bounded waits (leader, applied,
convergence) are :mod:`rcq.local.polls`, which this class extends; the partitions' views and
their processes' signals are :mod:`rcq.local.partitioned`, its base.
Node indices are 0-based; node ``i`` has node id ``node-i``.

Must not import: rcq.server (nodes are separate processes; the token model, what a tokens file
holds, is rcq.tokens), pysyncobj, lmdb, aiohttp.
"""

from __future__ import annotations

import contextlib
import json
import logging
import secrets
import shutil
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, Self

from rcq.local.cluster_files import (
    ADMIN_TOKEN_NAME,
    CLIENT_CERT_NAME,
    MANIFEST_NAME,
    ClusterTokens,
    add_node_certificate,
    make_certificates,
    read_manifest,
    tls_files,
    write_manifest,
    write_node_config,
)
from rcq.local.nodes import (
    HOST,
    LOG_TAIL_BYTES,
    STOP_TIMEOUT_S,
    LocalNode,
    check_ports_free,
    free_port_range,
    free_ports,
    read_tail,
)
from rcq.local.partitioned import PartitionedCluster, range_partitions
from rcq.local.polls import WAIT_TIMEOUT_S, deadline_loop, http_json
from rcq.local.releases import Release
from rcq.local.tls import CA_NAME, CertFiles
from rcq.private_files import read_private, write_private
from rcq.tokens import Grant, new_token

# The file names, where the launcher and rcq restore have always found them.
__all__ = ["ADMIN_TOKEN_NAME", "MANIFEST_NAME", "LocalCluster"]

log = logging.getLogger(__name__)


class LocalCluster(PartitionedCluster):
    """A cluster of ``nodes`` rcq processes on 127.0.0.1; see the module docstring.

    ``base_dir`` None: a fresh temporary directory, removed by :meth:`close` unless ``keep``.
    A ``base_dir`` given by the caller is never removed; it must not already hold a cluster
    (use :meth:`reopen` for that). ``node_overrides`` are extra NodeConfig fields for every
    node. ``base_port`` fixes the ports (HTTP ``base_port + i``, Raft ``base_port + 100 + i``);
    otherwise :meth:`allocate_ports` picks free ones. ``auth``: the nodes require tokens (an
    admin token is made: :attr:`token`); ``tls``: they serve HTTPS (:attr:`ca_file`);
    ``tls_client_certificates``: they also require a client certificate signed by the cluster's
    CA (one is made: :attr:`client_cert`, which the harness's polls present too). ``release``:
    every node runs that release instead of the code under test (nodes added later too).
    ``partitions_max``: each node gets ``partition_ports`` for that many partitions besides p0.
    """

    token: str | None  # the admin token (None: auth is off)
    ca_file: Path | None  # the CA that signed the nodes' certificates (None: plain HTTP)
    client_cert: CertFiles | None  # the client certificate, when the nodes require one
    release: Release | None  # what nodes run unless restart_node_as changes it (None: the code under test)

    def __init__(self, nodes: int = 3, base_dir: Path | None = None, secret: str | None = None,
                 node_overrides: dict[str, Any] | None = None, log_level: str = "INFO", *,
                 keep: bool = False, insecure: bool = False, base_port: int | None = None,
                 auth: bool = True, tls: bool = False, tls_client_certificates: bool = False,
                 admin_token: str | None = None, release: Release | None = None, partitions_max: int = 0) -> None:
        if nodes < 1:
            raise ValueError("nodes must be at least 1")
        if tls_client_certificates and not tls:
            raise ValueError("tls_client_certificates needs tls")
        if insecure and secret is not None:
            raise ValueError("insecure and secret exclude each other")
        if secret is not None and len(secret) < 16:
            raise ValueError("secret must be at least 16 characters (NodeConfig.cluster_secret)")
        if base_dir is not None and (Path(base_dir) / MANIFEST_NAME).exists():
            raise FileExistsError(f"{base_dir} already holds a cluster; use LocalCluster.reopen()")
        self.log_level = log_level
        self.node_overrides = dict(node_overrides or {})
        self.node_settings: dict[int, dict[str, Any]] = {}  # one node's own extra fields (set_node_override)
        self.insecure = insecure
        self._secret = None if insecure else (secret or secrets.token_urlsafe(32))
        self.auth = auth
        self.tls = tls
        self.tls_client_certificates = tls_client_certificates
        if admin_token is not None and (not auth or len(admin_token) < 16):
            raise ValueError("admin_token needs auth and at least 16 characters")
        self.token = (admin_token or new_token()) if auth else None
        self._tokens = ClusterTokens.for_admin(self.token) if self.token is not None else ClusterTokens()
        self.ca_file = None
        self.client_cert = None
        self.keep = keep
        self.release = release
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
        self.nodes = [LocalNode(i, f"node-{i}", http_ports[i], raft_ports[i], self.base_dir / f"node-{i}",
                                tls=tls, release=release) for i in range(nodes)]
        self.partitions_max = partitions_max
        for i in range(nodes if partitions_max > 0 else 0):  # each node's own range (docs/partitions.md)
            first, last = free_port_range(2 * partitions_max)
            self.node_settings[i] = {"partition_ports": f"{first}-{last}"}
        try:
            self.base_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            if self.token is not None:
                write_private(self.base_dir / ADMIN_TOKEN_NAME, self.token + "\n")
            if tls:
                self.ca_file, self.client_cert = make_certificates(
                    self.base_dir, [node.node_id for node in self.nodes], tls_client_certificates)
            self._write_files()
        except BaseException:
            self._remove_owned_dir()
            raise

    @classmethod
    def reopen(cls, base_dir: Path, log_level: str = "INFO") -> Self:
        """The cluster whose files are in ``base_dir`` (same ids, ports, secret and data)."""
        base_dir = Path(base_dir)
        manifest = read_manifest(base_dir)
        self = cls.__new__(cls)
        self.log_level = log_level
        self.node_overrides = dict(manifest.get("node_overrides", {}))
        self.node_settings = {int(i): dict(fields) for i, fields in manifest.get("node_settings", {}).items()}
        self.partitions_max = max((range_partitions(fields.get("partition_ports"))
                                   for fields in self.node_settings.values()), default=0)
        self.insecure = bool(manifest.get("insecure", False))
        self.auth = bool(manifest.get("auth", False))
        self.tls = bool(manifest.get("tls", False))
        self.tls_client_certificates = bool(manifest.get("tls_client_certificates", False))
        self._owns_dir = False
        self.keep = True
        self.release = None
        self.base_dir = base_dir
        self.nodes = [LocalNode(n["index"], n["node_id"], n["http_port"], n["raft_port"], base_dir / n["directory"],
                                tls=self.tls) for n in manifest["nodes"]]
        first_config = json.loads(self.nodes[0].config_path.read_text())
        self._secret = first_config.get("cluster_secret")
        self.token = read_private(base_dir / ADMIN_TOKEN_NAME, "admin token") if self.auth else None
        self._tokens = ClusterTokens.read(self.nodes[0].tokens_path) if self.auth else ClusterTokens()
        self.ca_file = tls_files(base_dir, CA_NAME).cert if self.tls else None
        self.client_cert = tls_files(base_dir, CLIENT_CERT_NAME) if self.tls_client_certificates else None
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
    def _node_config(self, node: LocalNode, peers: Sequence[int] | None = None) -> dict[str, Any]:
        config: dict[str, Any] = {
            **self.node_overrides,
            **self.node_settings.get(node.index, {}),
            "node_id": node.node_id,
            "http_host": HOST,
            "http_port": node.http_port,
            "raft_address": node.raft_address,
            "data_dir": str(node.data_dir),
            "peers": [{"node_id": p.node_id, "raft_address": self.peer_raft_address(node.index, p.index),
                       "http_url": self.advertised_url(p.index)} for p in self.nodes
                      if p is not node and (peers is None or p.index in peers)],
        }
        if self.advertised_url(node.index) != node.url:
            config["advertise_url"] = self.advertised_url(node.index)
        if self.insecure:
            config["insecure"] = True
        else:
            config["cluster_secret"] = self._secret
        if self.auth:
            config["tokens_file"] = str(node.tokens_path)
        if self.tls:
            files = tls_files(self.base_dir, node.node_id)
            ca_file = str(tls_files(self.base_dir, CA_NAME).cert)
            config.update(tls_cert_file=str(files.cert), tls_key_file=str(files.key), tls_peer_ca_file=ca_file)
            if self.tls_client_certificates:
                config["tls_client_ca_file"] = ca_file
        return config

    def _write_files(self) -> None:
        for node in self.nodes:
            self._write_node_config(node)
        self._write_shared_files()

    def _write_node_config(self, node: LocalNode, peers: Sequence[int] | None = None) -> None:
        write_node_config(node, self._node_config(node, peers))

    def _write_shared_files(self) -> None:
        """The tokens every node reads (with auth) and the manifest that reopens the cluster."""
        if self.auth:
            self._tokens.write(self.nodes)
        self._write_manifest()

    def _write_manifest(self) -> None:
        write_manifest(self.base_dir, {
            "insecure": self.insecure, "auth": self.auth, "tls": self.tls,
            "tls_client_certificates": self.tls_client_certificates, "node_overrides": self.node_overrides,
            "node_settings": {str(i): fields for i, fields in self.node_settings.items()}}, self.nodes)

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

    def add_node(self, peers: Sequence[int] | None = None, *, start: bool = True) -> int:
        """A new node (the next index), configured with ``peers`` (default: every other node) as the
        members it starts with, and started unless ``start`` is false; returns its index. It is not
        a member until the cluster adds it (``POST /v1/cluster/members``, docs/membership.md). The
        other nodes' configurations are left as they are, as an operator's would be at first."""
        if self._closed:
            raise RuntimeError("the cluster is closed")
        http_port, raft_port = free_ports(2)
        index = len(self.nodes)
        node = LocalNode(index, f"node-{index}", http_port, raft_port, self.base_dir / f"node-{index}", tls=self.tls,
                         release=self.release)
        self.nodes.append(node)
        if self.tls:
            add_node_certificate(self.base_dir, node.node_id)
        self._write_node_config(node, peers)
        self._write_shared_files()
        if start:
            self.start_node(index)
        return index

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

    def restart_node_as(self, i: int, release: Release | None, wait: bool = True,
                        timeout_s: float | None = None) -> int:
        """Stop node ``i`` (if it runs), make it run ``release`` (None: the code under test) with a
        config file that release accepts, and start it again on the same data, as a rolling upgrade
        (or downgrade) does; waits for its HTTP unless ``wait`` is false. Returns its pid. Its config
        gets every other node as a peer, as :meth:`reopen` writes it."""
        if self._closed:
            raise RuntimeError("the cluster is closed")
        if self.nodes[i].running():
            self.stop_node(i)
        self.nodes[i].release = release
        self._write_node_config(self.nodes[i])
        return self.start_node(i, wait=wait, timeout_s=timeout_s)

    def set_node_override(self, i: int, **fields: Any) -> None:
        """Give node ``i`` NodeConfig fields of its own (a value of None removes one), written to its
        config file now; it reads them when it (re)starts."""
        own = self.node_settings.setdefault(i, {})
        for name, value in fields.items():
            if value is None:
                own.pop(name, None)
            else:
                own[name] = value
        self._write_node_config(self.nodes[i])
        self._write_manifest()  # a reopened cluster keeps them

    def restart_node_with(self, i: int, wait: bool = True, **fields: Any) -> int:
        """Stop node ``i``, give it ``fields`` (:meth:`set_node_override`), start it again."""
        self.stop_node(i)
        self.set_node_override(i, **fields)
        return self.start_node(i, wait=wait)

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

    # ------------------------------------------------------------- backups
    def restore_from(self, backup: Path, timeout_s: float = 600.0) -> None:
        """Seed every node's data directory from ``backup`` before the cluster first starts, as
        ``rcq restore PATH --node-config ...`` does (a subprocess: this module does not import the
        server). RuntimeError with its output when the restore fails."""
        import subprocess
        import sys

        command = [sys.executable, "-m", "rcq", "restore", str(backup)]
        for node in self.nodes:
            command += ["--node-config", str(node.config_path)]
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"rcq restore failed ({done.returncode}): {done.stderr.strip() or done.stdout.strip()}")

    def data_digest(self, i: int, timeout_s: float = 60.0) -> dict[str, Any]:
        """Node ``i``'s data digest and applied index (GET /v1/cluster/data-digest)."""
        return self.poll_json(self.poll_url(i) + "/v1/cluster/data-digest", timeout_s=timeout_s)

    def add_token(self, name: str, grants: Iterable[Grant | Mapping[str, Any]] = (), admin: bool = False,
                  expires_at: datetime | None = None, *, wait: bool = True) -> str:
        """A new token of principal ``name`` in every node's tokens file; returns it (the files keep
        only its hash). ``grants``: :class:`Grant` or its fields (``{"queues": "jobs-*", "actions":
        ["produce"]}``). ``wait``: return once every live node knows it (they re-read the file
        within a second), so it works at once on any of them."""
        if not self.auth:
            raise RuntimeError("this cluster runs without tokens (auth=False)")
        token = self._tokens.add(name, grants, admin, expires_at)
        self._tokens.write(self.nodes)
        if wait:
            self.wait_for_token([token], known=True)
        return token

    def revoke_token(self, name: str, *, wait: bool = True) -> int:
        """Remove every token of principal ``name`` from the tokens files; returns how many.
        ``wait``: return once every live node refuses those :meth:`add_token` made here."""
        if not self.auth:
            raise RuntimeError("this cluster runs without tokens (auth=False)")
        count, plain = self._tokens.revoke(name)
        self._tokens.write(self.nodes)
        if wait and plain:
            self.wait_for_token(plain, known=False)
        return count

    def wait_for_token(self, tokens: Iterable[str], known: bool, timeout_s: float = WAIT_TIMEOUT_S) -> None:
        """Wait until every live node knows each of ``tokens`` (answers anything but 401
        ``unauthorized``: an expired token is known), or, ``known`` False, refuses each as unknown;
        each of a node's partition processes too (each re-reads the tokens file on its own)."""
        tokens = list(tokens)
        context = self._poll_context()

        def all_as_wanted(i: int) -> bool:
            for url in [self.poll_url(i), *self._partition_process_urls(i)]:
                for token in tokens:
                    answer = http_json(url + "/v1/cluster", token=token, context=context)
                    if (answer.get("error", {}).get("code") != "unauthorized") != known:
                        return False
            return True

        pending = set(self.live_indices())
        errors: dict[int, str] = {}
        for _ in deadline_loop(timeout_s, self.poll_interval_s):
            answers, errors = self.poll(all_as_wanted, sorted(pending))
            pending -= {i for i, done in answers.items() if done}
            if not pending:
                return
        raise TimeoutError(f"nodes {sorted(pending)} did not {'accept' if known else 'refuse'} the token within "
                           f"{timeout_s} s (tokens file re-read?): {errors or 'answered otherwise'}")

    def client_options(self) -> dict[str, Any]:
        """What a client needs besides the URLs: ``RcqClient(cluster.urls, **cluster.client_options())``:
        ``token`` and ``ca_file``, and ``client_cert`` when the nodes require client certificates."""
        options: dict[str, Any] = {"token": self.token, "ca_file": None if self.ca_file is None else str(self.ca_file)}
        if self.client_cert is not None:
            options["client_cert"] = (str(self.client_cert.cert), str(self.client_cert.key))
        return options

    def auth_headers(self) -> dict[str, str]:
        """The admin token as an ``Authorization`` header, for raw HTTP requests (empty without auth)."""
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

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

    @property
    def issued_tokens(self) -> list[str]:
        """Every token :meth:`add_token` made here, revoked ones too."""
        return list(self._tokens.issued_tokens)

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

