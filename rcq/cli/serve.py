"""``rcq serve``: run one node. Needs the server extra (``pip install 'rcq[server]'``), imported when it runs.

A partition process is ``rcq serve`` too, started by its node's supervisor with a private
config file (docs/partitions.md): it dies with its node (rcq.server.partitions.child).

Secrets never reach an argument list, an error message or a child process: the cluster secret
comes from a private file or ``RCQ_CLUSTER_SECRET`` and an admin token from ``RCQ_ADMIN_TOKEN``;
both variables leave the environment, and the node creates its files private (umask 077).

Must not import: pysyncobj, lmdb (reached through rcq.server.node); rcq.server at module level.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import faulthandler
import logging
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rcq.cli.tokens import admin_token_entry
from rcq.errors import InvalidRequest
from rcq.private_files import read_private

STDERR_FD = 2


def _peer(text: str) -> dict[str, str]:
    """``node_id=raft_host:port=http://host:port[=http://peer_host:port]`` -> a peers[] entry, and
    its ``peer_url`` when a fourth part names where this node reaches the peer's HTTP API (the
    NodeConfig's ``peer_urls``: the advertised URL, the third part, is the clients')."""
    parts = text.split("=", 3)
    if len(parts) not in (3, 4) or not all(parts):
        raise argparse.ArgumentTypeError(f"peer {text!r}: expected node_id=raft_host:port=http_url[=peer_url]")
    node_id, raft_address, http_url = parts[:3]
    entry = {"node_id": node_id, "raft_address": raft_address, "http_url": http_url}
    if len(parts) == 4:
        entry["peer_url"] = parts[3]
    return entry


def _partition_port(text: str) -> tuple[str, dict[str, int]]:
    """``NAME=HTTP,RAFT[,ADVERTISED_HTTP,ADVERTISED_RAFT]`` -> a partition_port_map entry."""
    name, equals, ports_text = text.partition("=")
    ports = ports_text.split(",")
    if not equals or not name or len(ports) not in (2, 4) or not all(p.strip().isdigit() for p in ports):
        raise argparse.ArgumentTypeError(
            f"partition port {text!r}: expected NAME=HTTP,RAFT[,ADVERTISED_HTTP,ADVERTISED_RAFT], e.g. orders=7100,7101")
    keys = ("http", "raft", "advertise_http", "advertise_raft")
    return name, {key: int(port) for key, port in zip(keys, ports, strict=False)}


def split_peers(entries: list[dict[str, str]] | None) -> dict[str, Any]:
    """``--peer`` entries as NodeConfig fields: ``peers``, and ``peer_urls`` from those with a
    fourth part (None: not given, so that a config file's own value stands)."""
    if not entries:
        return {"peers": None, "peer_urls": None}
    return {"peers": [{k: v for k, v in entry.items() if k != "peer_url"} for entry in entries],
            "peer_urls": {entry["node_id"]: entry["peer_url"] for entry in entries if "peer_url" in entry} or None}


def add_serve_parser(commands: Any) -> None:
    serve = commands.add_parser("serve", help="run one rcq node")
    serve.add_argument("--config", type=Path, help="JSON file with NodeConfig fields")
    serve.add_argument("--node-id")
    serve.add_argument("--http-host")
    serve.add_argument("--http-port", type=int)
    serve.add_argument("--advertise-url")
    serve.add_argument("--raft-address", help="host:port for Raft traffic")
    serve.add_argument("--raft-bind-address",
                       help="host:port the Raft listener binds to (default --raft-address; in a container 0.0.0.0:PORT)")
    serve.add_argument("--peer", action="append", type=_peer, default=None,
                       help="another node as node_id=raft_host:port=http_url[=peer_url] (repeat): http_url is "
                            "what clients are given for it; peer_url, if the nodes cannot use that, where this "
                            "node reaches it (peer_urls)")
    serve.add_argument("--data-dir", type=Path)
    serve.add_argument("--partition-ports", metavar="START-END",
                       help="the ports this node's partition processes serve on (docs/partitions.md)")
    serve.add_argument("--partition-advertise-ports", metavar="START-END",
                       help="the same ports as clients and the other nodes reach them, if they differ")
    serve.add_argument("--partition-port", action="append", type=_partition_port, default=None,
                       metavar="NAME=HTTP,RAFT[,ADV_HTTP,ADV_RAFT]",
                       help="ports of one named partition on this node, instead of a pair of --partition-ports "
                            "(repeat; partition_port_map)")
    serve.add_argument("--secret-file", type=Path,
                       help="file holding the cluster secret, mode 0600 (or set RCQ_CLUSTER_SECRET)")
    serve.add_argument("--previous-secret-file", type=Path, action="append", default=None,
                       help="file holding an older cluster secret still accepted from peers while the secret is "
                            "rotated, mode 0600 (repeat; see docs/security.md)")
    serve.add_argument("--insecure", action="store_true", default=None,
                       help="run without a cluster secret (development only: Raft traffic is pickled)")
    serve.add_argument("--tokens-file", type=Path,
                       help="JSON file of hashed API tokens, mode 0600 (see rcq token create); re-read when it "
                            "changes. RCQ_ADMIN_TOKEN adds one admin token")
    serve.add_argument("--insecure-http", action="store_true", default=None,
                       help="allow an HTTP API without tokens on a non-loopback address (development only)")
    serve.add_argument("--tls-cert-file", type=Path, help="PEM certificate chain: serve HTTPS")
    serve.add_argument("--tls-key-file", type=Path, help="PEM private key of --tls-cert-file, mode 0600")
    serve.add_argument("--tls-client-ca-file", type=Path,
                       help="require client certificates signed by this CA (mutual TLS)")
    serve.add_argument("--tls-peer-ca-file", type=Path,
                       help="CA bundle to verify the other nodes' HTTPS with (default: the system's)")
    serve.add_argument("--log-level", default="INFO")
    serve.set_defaults(func=cmd_serve)


@contextlib.contextmanager
def _server_extra() -> Iterator[None]:
    """Around the imports of rcq.server: the server is an extra (pip install 'rcq[server]')."""
    try:
        yield
    except ImportError as exc:
        raise InvalidRequest(f"rcq serve needs the server extra (pip install 'rcq[server]'): {exc}") from exc


def read_cluster_secret(secret_file: Path | None) -> str | None:
    """The cluster secret: the content of ``secret_file`` (refused unless private), else
    ``$RCQ_CLUSTER_SECRET``. The variable leaves the environment either way, so no process this one
    starts inherits it (Linux still shows this process's initial environment to its owner and root
    in /proc/<pid>/environ: the file is the safer way)."""
    from_environment = os.environ.pop("RCQ_CLUSTER_SECRET", None)
    if secret_file is not None:
        return read_private(secret_file, "cluster secret")
    return from_environment or None


def cmd_serve(args: argparse.Namespace) -> int:
    os.umask(0o077)  # the data dir, journal, snapshot and logs this node creates are its user's only
    with _server_extra():
        from rcq.server.partitions.child import die_with_parent
    die_with_parent()  # a partition process started by its node's supervisor dies with that node
    # SIGUSR1 writes every thread's stack to stderr (the node log) and the node goes on: how a node
    # that does not stop on SIGTERM says where it is stuck (rcq.local's stop asks before its SIGKILL).
    # The descriptor, not sys.stderr: a caller may have replaced sys.stderr with an object that has none.
    faulthandler.register(signal.SIGUSR1, file=STDERR_FD, all_threads=True)
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    secret = read_cluster_secret(args.secret_file)
    admin = admin_token_entry()
    with _server_extra():
        from rcq.server.config import load_config
        from rcq.server.node import run_node
    config = load_config(
        args.config, node_id=args.node_id, http_host=args.http_host, http_port=args.http_port,
        advertise_url=args.advertise_url, raft_address=args.raft_address, raft_bind_address=args.raft_bind_address,
        **split_peers(args.peer),
        data_dir=args.data_dir, cluster_secret=secret, insecure=args.insecure,
        partition_ports=args.partition_ports, partition_advertise_ports=args.partition_advertise_ports,
        partition_port_map=dict(args.partition_port) if args.partition_port else None,
        cluster_secrets_previous=[read_private(path, "previous cluster secret") for path in args.previous_secret_file]
        if args.previous_secret_file else None,
        extra_tokens=(admin,) if admin is not None else (), tokens_file=args.tokens_file, insecure_http=args.insecure_http,
        tls_cert_file=args.tls_cert_file, tls_key_file=args.tls_key_file,
        tls_client_ca_file=args.tls_client_ca_file, tls_peer_ca_file=args.tls_peer_ca_file)
    if config.partition_name is not None:  # each line says which partition's process wrote it
        for handler in logging.getLogger().handlers:
            handler.setFormatter(logging.Formatter(f"%(asctime)s %(levelname)s [{config.partition_name}] "
                                                   "%(name)s: %(message)s"))
    asyncio.run(run_node(config))
    return 0
