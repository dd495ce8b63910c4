"""The ``rcq`` command: ``rcq serve`` runs one node; client verbs talk to a cluster.

Must not import: pysyncobj, lmdb (``serve`` reaches them through rcq.node).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from pathlib import Path
from typing import Any

from rcq.config import load_config
from rcq.errors import RcqError


def _peer(text: str) -> dict[str, str]:
    """``node_id=raft_host:port=http://host:port`` -> a peers[] entry."""
    parts = text.split("=", 2)
    if len(parts) != 3:
        raise argparse.ArgumentTypeError(f"peer {text!r}: expected node_id=raft_host:port=http_url")
    node_id, raft_address, http_url = parts
    return {"node_id": node_id, "raft_address": raft_address, "http_url": http_url}


def add_serve_parser(commands: Any) -> None:
    serve = commands.add_parser("serve", help="run one rcq node")
    serve.add_argument("--config", type=Path, help="JSON file with NodeConfig fields")
    serve.add_argument("--node-id")
    serve.add_argument("--http-host")
    serve.add_argument("--http-port", type=int)
    serve.add_argument("--advertise-url")
    serve.add_argument("--raft-address", help="host:port for Raft traffic")
    serve.add_argument("--peer", action="append", type=_peer, default=None,
                       help="another node as node_id=raft_host:port=http_url (repeat)")
    serve.add_argument("--data-dir", type=Path)
    serve.add_argument("--secret-file", type=Path,
                       help="file holding the cluster secret (or set RCQ_CLUSTER_SECRET)")
    serve.add_argument("--insecure", action="store_true", default=None,
                       help="run without a cluster secret (development only: Raft traffic is pickled)")
    serve.add_argument("--log-level", default="INFO")
    serve.set_defaults(func=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    secret = os.environ.get("RCQ_CLUSTER_SECRET")
    if args.secret_file is not None:
        secret = args.secret_file.read_text().strip()
    config = load_config(
        args.config, node_id=args.node_id, http_host=args.http_host, http_port=args.http_port,
        advertise_url=args.advertise_url, raft_address=args.raft_address, peers=args.peer,
        data_dir=args.data_dir, cluster_secret=secret, insecure=args.insecure)
    from rcq.node import run_node

    asyncio.run(run_node(config))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rcq", description="rcq: a transactional, Raft-replicated queue")
    commands = parser.add_subparsers(dest="command", required=True)
    add_serve_parser(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except RcqError as exc:
        print(f"rcq: {exc.code}: {exc.message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
