"""The ``rcq`` command: ``rcq serve`` runs one node; client verbs talk to a cluster; ``rcq token`` edits a tokens file.

Client verbs: ``enqueue``, ``dequeue``, ``peek``, ``count``, ``queues``, ``queue``, ``status``, and the
admin verbs ``cluster members|add-node|remove-node|transfer-leader``. They
find the cluster from ``--url`` (repeatable) or ``RCQ_URLS`` (comma-separated), print
for people by default and JSON with ``--json``. Their token comes from ``--token-file`` or
``RCQ_TOKEN``, never from an argument (process lists show arguments); HTTPS nodes are verified
against ``--ca-file`` or ``RCQ_CA_FILE`` (default: the system's CAs). Errors print
``rcq: <code>: <message>`` on stderr (then, for some, ``rcq: <what to do>``) and exit 2; ``status``
exits 1 when a node does not answer.

``rcq backup`` (:mod:`.backup`) and ``rcq restore`` (:mod:`.restore`) save a backup of the cluster and
restore one.

``rcq token create|list|revoke|hash`` are file operations on a node's tokens file: no node is
asked, and nodes re-read the file on their own.

The command groups, one module each: :mod:`.serve`, :mod:`.queues` (the queue verbs),
:mod:`.cluster` (``status`` and membership), :mod:`.tokens`; :mod:`.connection` is how a client
verb reaches the cluster (shared flags, token, TLS), :mod:`.output` how verbs print.

Must not import: pysyncobj, lmdb (``serve`` reaches them through rcq.server.node); rcq.server at
module level (the client verbs run where only the client is installed; ``serve`` imports it when
it runs).
"""

from __future__ import annotations

import argparse
import sys

from rcq.cli.backup import add_backup_parser
from rcq.cli.cluster import add_cluster_parsers, add_status_parser
from rcq.cli.connection import client_flags, client_security
from rcq.cli.partitions import add_partition_parsers
from rcq.cli.queues import add_queue_parsers
from rcq.cli.restore import add_restore_parser
from rcq.cli.serve import add_serve_parser, read_cluster_secret
from rcq.cli.tokens import add_token_parsers, admin_token_entry
from rcq.errors import RcqError, TokenExpired, Unauthorized
from rcq.version import rcq_version

__all__ = ["admin_token_entry", "build_parser", "client_security", "main", "read_cluster_secret"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rcq", description="rcq: a transactional, Raft-replicated queue")
    parser.add_argument("--version", action="version", version=f"rcq {rcq_version()}")
    commands = parser.add_subparsers(dest="command", required=True)
    common = client_flags()
    add_serve_parser(commands)
    add_queue_parsers(commands, common)
    add_status_parser(commands, common)
    add_cluster_parsers(commands, common)
    add_partition_parsers(commands, common)
    add_token_parsers(commands)
    add_backup_parser(commands, common)
    add_restore_parser(commands, common)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except RcqError as exc:
        print(f"rcq: {exc.code}: {exc.message}", file=sys.stderr)
        if isinstance(exc, Unauthorized) and not isinstance(exc, TokenExpired):
            print("rcq: the token comes from --token-file FILE or the RCQ_TOKEN variable", file=sys.stderr)
        hint = args.error_hint(args, exc) if getattr(args, "error_hint", None) is not None else None
        if hint:
            print(f"rcq: {hint}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
