"""The ``rcq`` command: ``rcq serve`` runs one node; client verbs talk to a cluster; ``rcq token`` edits a tokens file.

Client verbs: ``enqueue``, ``dequeue``, ``peek``, ``count``, ``queues``, ``queue``, ``status``, and the
admin verbs ``cluster members|add-node|remove-node|transfer-leader``. They
find the cluster from ``--url`` (repeatable) or ``RCQ_URLS`` (comma-separated), print
for people by default and JSON with ``--json``. Their token comes from ``--token-file`` or
``RCQ_TOKEN``, never from an argument (process lists show arguments); HTTPS nodes are verified
against ``--ca-file`` or ``RCQ_CA_FILE`` (default: the system's CAs). Errors print
``rcq: <code>: <message>`` on stderr (then, for some, ``rcq: <what to do>``) and exit 2; ``status``
exits 1 when a node does not answer.

``rcq token create|list|revoke|hash`` are file operations on a node's tokens file: no node is
asked, and nodes re-read the file on their own.

Secrets never reach an argument list, an error message or a child process: ``serve`` reads the
cluster secret from a private file or ``RCQ_CLUSTER_SECRET`` and an admin token from
``RCQ_ADMIN_TOKEN``, removes both variables from its environment, and creates its files private
(umask 077).

Must not import: pysyncobj, lmdb (``serve`` reaches them through rcq.server.node); rcq.server at
module level (the client verbs run where only the client is installed; ``serve`` and ``token``
import it when they run).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import getpass
import json
import logging
import math
import os
import re
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rcq.encoding import decode_item, encode_item
from rcq.errors import InvalidRequest, RcqError, TokenExpired, Unauthorized
from rcq.private_files import check_private, read_private, write_private

if TYPE_CHECKING:
    from rcq.server.security.tokens import Grant, TokenEntry

ADMIN_TOKEN_MIN_CHARS = 16
TOKEN_CHARACTERS = re.compile(r"^[\x21-\x7e]+$")  # printable ASCII, no spaces: it travels in a header
EXPIRES_IN_DAYS_MAX = 36_500.0
# The flags of ``rcq queue ACTION`` by action (the attribute names; the flag is ``--`` and dashes).
QUEUE_SETTINGS = ("max_items", "max_bytes", "max_deliveries", "dead_letter_queue", "default_ttl_s",
                  "default_delay_s", "max_priority")
QUEUE_FLAGS = {"configure": QUEUE_SETTINGS, "set": QUEUE_SETTINGS, "redrive": ("max_items", "source_queue")}


def _peer(text: str) -> dict[str, str]:
    """``node_id=raft_host:port=http://host:port`` -> a peers[] entry."""
    parts = text.split("=", 2)
    if len(parts) != 3:
        raise argparse.ArgumentTypeError(f"peer {text!r}: expected node_id=raft_host:port=http_url")
    node_id, raft_address, http_url = parts
    return {"node_id": node_id, "raft_address": raft_address, "http_url": http_url}


def _seconds(text: str) -> float:
    """A number of seconds; NaN and infinity are refused here (JSON has no form for them)."""
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds")
    return seconds


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
def _server_extra(command: str) -> Iterator[None]:
    """Around the imports of rcq.server: the server is an extra (pip install 'rcq[server]')."""
    try:
        yield
    except ImportError as exc:
        raise InvalidRequest(f"rcq {command} needs the server extra (pip install 'rcq[server]'): {exc}") from exc


def read_cluster_secret(secret_file: Path | None) -> str | None:
    """The cluster secret: the content of ``secret_file`` (refused unless private), else
    ``$RCQ_CLUSTER_SECRET``. The variable leaves the environment either way, so no process this one
    starts inherits it (Linux still shows this process's initial environment to its owner and root
    in /proc/<pid>/environ: the file is the safer way)."""
    from_environment = os.environ.pop("RCQ_CLUSTER_SECRET", None)
    if secret_file is not None:
        return read_private(secret_file, "cluster secret")
    return from_environment or None


def admin_token_entry() -> TokenEntry | None:
    """``$RCQ_ADMIN_TOKEN`` (how docker-compose gives a node its first token) as an inline admin
    entry, hashed; the variable leaves the environment. None when it is not set. Errors never
    show the value."""
    token = (os.environ.pop("RCQ_ADMIN_TOKEN", None) or "").strip()
    if not token:
        return None
    if len(token) < ADMIN_TOKEN_MIN_CHARS or not TOKEN_CHARACTERS.match(token):
        raise InvalidRequest(f"RCQ_ADMIN_TOKEN must be at least {ADMIN_TOKEN_MIN_CHARS} printable characters "
                             "without spaces; make a random one, e.g. python3 -c "
                             "'import secrets; print(\"rcq_\" + secrets.token_urlsafe(32))'")
    with _server_extra("serve"):
        from rcq.server.security.tokens import TokenEntry, token_hash
    return TokenEntry(name="admin", admin=True, sha256=token_hash(token), grants=(), expires_at=None)


def cmd_serve(args: argparse.Namespace) -> int:
    os.umask(0o077)  # the data dir, journal, snapshot and logs this node creates are its user's only
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    secret = read_cluster_secret(args.secret_file)
    admin = admin_token_entry()
    with _server_extra("serve"):
        from rcq.server.config import load_config
        from rcq.server.node import run_node
    config = load_config(
        args.config, node_id=args.node_id, http_host=args.http_host, http_port=args.http_port,
        advertise_url=args.advertise_url, raft_address=args.raft_address, peers=args.peer,
        data_dir=args.data_dir, cluster_secret=secret, insecure=args.insecure,
        cluster_secrets_previous=[read_private(path, "previous cluster secret") for path in args.previous_secret_file]
        if args.previous_secret_file else None,
        extra_tokens=(admin,) if admin is not None else (), tokens_file=args.tokens_file, insecure_http=args.insecure_http,
        tls_cert_file=args.tls_cert_file, tls_key_file=args.tls_key_file,
        tls_client_ca_file=args.tls_client_ca_file, tls_peer_ca_file=args.tls_peer_ca_file)
    asyncio.run(run_node(config))
    return 0


# -------------------------------------------------------------------- client verbs
def add_client_parsers(commands: Any) -> None:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--url", action="append", default=None,
                        help="a node's URL, e.g. http://127.0.0.1:7001 (repeat; default: $RCQ_URLS, comma-separated)")
    common.add_argument("--json", action="store_true", help="print JSON for machines")
    common.add_argument("--retry-timeout-s", type=float, default=15.0,
                        help="how long to keep retrying while the cluster fails over (default 15)")
    security = common.add_argument_group("security")
    security.add_argument("--token-file", type=Path, default=None,
                          help="file holding the API token, mode 0600 (default: $RCQ_TOKEN; never the token itself "
                               "as an argument: process lists show arguments)")
    security.add_argument("--ca-file", type=Path, default=None,
                          help="verify HTTPS nodes against this CA bundle (default: $RCQ_CA_FILE, else the system's CAs)")
    security.add_argument("--client-cert", type=Path, default=None,
                          help="PEM certificate to present to nodes that require client certificates")
    security.add_argument("--client-key", type=Path, default=None,
                          help="its private key, mode 0600 (default: in the --client-cert file)")
    enqueue = commands.add_parser("enqueue", parents=[common], help="enqueue items in one committed transaction")
    enqueue.add_argument("queue")
    enqueue.add_argument("items", nargs="+", metavar="ITEM")
    enqueue.add_argument("--base64", action="store_true", help="the ITEMs are base64 (binary items)")
    enqueue.add_argument("--priority", type=int, default=None,
                         help="0 to 255, at most the queue's max_priority; higher ones are dequeued first (default 0)")
    enqueue.add_argument("--delay-s", type=_seconds, default=None,
                         help="invisible to dequeues this long after the commit (default: the queue's default_delay_s)")
    enqueue.add_argument("--ttl-s", type=_seconds, default=None,
                         help="leaves the queue (expired) if not consumed this long after the commit "
                              "(default: the queue's default_ttl_s)")
    enqueue.set_defaults(func=cmd_enqueue)
    dequeue = commands.add_parser("dequeue", parents=[common],
                                  help="dequeue and commit (at most once: items are gone once printed); --json adds "
                                       "each item's delivery_count, priority, expires_at_ms and dead_letter")
    dequeue.add_argument("queue")
    dequeue.add_argument("--max", type=int, default=1, dest="max_items", help="most items to take (default 1)")
    dequeue.add_argument("--wait-ms", type=int, default=0, help="wait this long for an item (default 0)")
    dequeue.set_defaults(func=cmd_dequeue)
    peek = commands.add_parser("peek", parents=[common], help="show the head item without consuming it")
    peek.add_argument("queue")
    peek.set_defaults(func=cmd_peek)
    count = commands.add_parser("count", parents=[common], help="how many items a queue holds")
    count.add_argument("queue")
    count.set_defaults(func=cmd_count)
    queues = commands.add_parser("queues", parents=[common], help="every queue and its count")
    queues.set_defaults(func=cmd_queues)
    queue = commands.add_parser("queue", parents=[common],
                                help="show, configure, purge, delete or redrive one queue (replicated)",
                                description="configure (or set) replaces every setting of the queue: a flag not "
                                            "given unsets its setting. redrive moves the dead items of a dead-letter "
                                            "queue back to their source queues. See docs/queue-features.md.")
    queue.add_argument("action", choices=["show", "configure", "set", "purge", "delete", "redrive"])
    queue.add_argument("queue")
    queue.add_argument("--max-items", type=int, default=None,
                       help="with configure: most items the queue may hold; with redrive: most items to move back")
    queue.add_argument("--max-bytes", type=int, default=None,
                       help="with configure: most bytes it may hold, each item's bookkeeping included")
    queue.add_argument("--max-deliveries", type=int, default=None,
                       help="with configure: an item delivered this many times without a commit goes to the "
                            "dead-letter queue (dropped without one)")
    queue.add_argument("--dead-letter-queue", default=None, metavar="QUEUE",
                       help="with configure: where dead items go (an existing queue)")
    queue.add_argument("--default-ttl-s", type=_seconds, default=None,
                       help="with configure: an item not consumed this long after its enqueue leaves (expired)")
    queue.add_argument("--default-delay-s", type=_seconds, default=None,
                       help="with configure: an item is invisible this long after its enqueue")
    queue.add_argument("--max-priority", type=int, default=None,
                       help="with configure: the highest priority an enqueue may give, 0 to 255")
    queue.add_argument("--source-queue", default=None, metavar="QUEUE",
                       help="with redrive: only the dead items that came from this queue")
    queue.set_defaults(func=cmd_queue)
    status = commands.add_parser("status", parents=[common],
                                 help="each node's view: role, term, leader, indexes (exit 1 if one is down)")
    status.set_defaults(func=cmd_status)
    add_cluster_parsers(commands, common)


def add_cluster_parsers(commands: Any, common: argparse.ArgumentParser) -> None:
    """``rcq cluster members|add-node|remove-node|transfer-leader``: admin verbs, sent to the leader."""
    cluster = commands.add_parser(
        "cluster", help="list the members, add or remove a node, move leadership (admin token)",
        description="The cluster's membership. Every action needs an admin token; changes go to the leader "
                    "(found from any --url) and are refused while another change is being committed.")
    actions = cluster.add_subparsers(dest="cluster_command", required=True, metavar="ACTION")
    members = actions.add_parser("members", parents=[common],
                                 help="every member: role, Raft address, URL, replication progress")
    members.set_defaults(func=cmd_cluster_members, error_hint=_membership_hint)
    add = actions.add_parser(
        "add-node", parents=[common], help="add a running node to the cluster",
        description="Add a node that is already running (rcq serve with its node id and Raft address, and the "
                    "current members as --peer): the leader checks its health first, then replicates to it and "
                    "waits up to --catch-up-timeout-s for it to catch up. --url names the nodes to ask, as in "
                    "every verb; the new node's own URL is --node-url.")
    add.add_argument("--node-id", required=True, help="the new node's id")
    add.add_argument("--raft-address", required=True, metavar="HOST:PORT", help="the new node's Raft listener")
    add.add_argument("--node-url", required=True, metavar="URL",
                     help="the URL the new node serves clients on, e.g. http://10.0.0.4:7001")
    add.add_argument("--catch-up-timeout-s", type=_seconds, default=60.0,
                     help="how long the leader waits for the new node to catch up, 0 to 600 (default 60)")
    add.set_defaults(func=cmd_cluster_add_node, error_hint=_membership_hint)
    remove = actions.add_parser(
        "remove-node", parents=[common], help="remove a member from the cluster",
        description="Remove a member (stop it afterwards). Removing the leader makes it hand leadership over "
                    "first; the request follows it to the new leader.")
    remove.add_argument("node_id", metavar="NODE_ID")
    remove.set_defaults(func=cmd_cluster_remove_node, error_hint=_membership_hint)
    transfer = actions.add_parser(
        "transfer-leader", parents=[common], help="hand leadership to a member",
        description="Hand leadership to NODE_ID, or (without it) to the most caught-up follower.")
    transfer.add_argument("node_id", metavar="NODE_ID", nargs="?", default=None)
    transfer.set_defaults(func=cmd_cluster_transfer_leader, error_hint=_membership_hint)


def _urls(args: argparse.Namespace) -> list[str]:
    urls = [u for given in (args.url or []) for u in given.split(",") if u.strip()]
    if not urls:
        urls = [u for u in os.environ.get("RCQ_URLS", "").split(",") if u.strip()]
    if not urls:
        raise InvalidRequest("no node URL: pass --url or set RCQ_URLS")
    return urls


def _token(args: argparse.Namespace) -> str | None:
    """The token of ``--token-file`` (None: RcqClient falls back to $RCQ_TOKEN). Messages never show it."""
    if args.token_file is None:
        return None
    token = read_private(args.token_file, "token")
    if not TOKEN_CHARACTERS.match(token):
        raise InvalidRequest(f"the token file {args.token_file} must hold one token (printable characters, "
                             "no spaces) and nothing else")
    return token


def _client_security(args: argparse.Namespace) -> dict[str, Any]:
    """RcqClient's ``token``, ``ca_file`` and ``client_cert`` from the flags and the environment."""
    if args.client_key is not None and args.client_cert is None:
        raise InvalidRequest("--client-key goes with --client-cert")
    security: dict[str, Any] = {"token": _token(args),
                                "ca_file": args.ca_file or os.environ.get("RCQ_CA_FILE") or None}
    if args.client_cert is not None:
        key = args.client_key or args.client_cert
        check_private(key, "client key")
        security["client_cert"] = (args.client_cert, key)
    return security


def _with_client(args: argparse.Namespace, verb: Callable[[Any], Awaitable[int]]) -> int:
    from rcq.client import RcqClient

    urls, security = _urls(args), _client_security(args)
    files = ", ".join(str(f) for f in (security["ca_file"], *security.get("client_cert", ())) if f is not None)

    async def run() -> int:
        try:
            client = RcqClient(urls, retry_timeout_s=args.retry_timeout_s, **security)
        except OSError as exc:  # ssl.SSLError too: a CA, certificate or key file that cannot be used
            raise InvalidRequest(f"cannot use the TLS files ({files}): {exc}") from None
        async with client:
            return await verb(client)

    return asyncio.run(run())


def _wire(value: bytes) -> dict[str, str]:
    text, used = encode_item(value)
    return {"value": text, "encoding": used}


def _item_wire(item: Any) -> dict[str, Any]:
    """A dequeued Item for --json: its value, then how it was delivered (dead_letter only on a dead item,
    expires_at_ms only on an item that expires)."""
    wire: dict[str, Any] = {**_wire(item.value), "delivery_count": item.delivery_count, "priority": item.priority}
    if item.expires_at_ms is not None:
        wire["expires_at_ms"] = item.expires_at_ms
    if item.dead_letter is not None:
        dead = item.dead_letter
        wire["dead_letter"] = {"reason": dead.reason, "source_queue": dead.source_queue,
                               "delivery_count": dead.delivery_count}
    return wire


def _print_items(args: argparse.Namespace, items: list[dict[str, Any]]) -> None:
    """``items``: wire dicts. For people, one value per line and nothing else, so scripts can read it."""
    if args.json:
        print(json.dumps({"queue": args.queue, "items": items}))
        return
    for wire in items:
        print(wire["value"] if wire["encoding"] == "utf-8" else f"base64:{wire['value']}")
    if not items:
        print(f"(queue {args.queue} is empty)", file=sys.stderr)


def _print_table(headers: list[str], rows: list[list[Any]]) -> None:
    cells = [headers, *[["-" if c is None else str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    for row in cells:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())


def cmd_enqueue(args: argparse.Namespace) -> int:
    items: list[bytes | str] = list(args.items)
    if args.base64:
        try:
            items = [decode_item(i, "base64") for i in args.items]
        except ValueError as exc:
            raise InvalidRequest(f"an ITEM is not valid base64: {exc}") from exc

    async def verb(client: Any) -> int:
        info = await client.enqueue(args.queue, *items, priority=args.priority, delay_s=args.delay_s, ttl_s=args.ttl_s)
        if args.json:
            print(json.dumps({"queue": args.queue, "enqueued": len(items), "index": info.index,
                              "duplicate": info.duplicate, "transaction_ids": list(info.transaction_ids)}))
        else:
            print(f"enqueued {len(items)} item{'s' if len(items) != 1 else ''} into {args.queue} "
                  f"(commit index {info.index})")
        return 0

    return _with_client(args, verb)


def cmd_dequeue(args: argparse.Namespace) -> int:
    async def verb(client: Any) -> int:
        _print_items(args, [_item_wire(item) for item in await client.dequeue_items(args.queue, args.max_items,
                                                                                    args.wait_ms)])
        return 0

    return _with_client(args, verb)


def cmd_peek(args: argparse.Namespace) -> int:
    async def verb(client: Any) -> int:
        value = await client.peek(args.queue)
        _print_items(args, [] if value is None else [_wire(value)])
        return 0

    return _with_client(args, verb)


def cmd_count(args: argparse.Namespace) -> int:
    async def verb(client: Any) -> int:
        info = await client.queue_info(args.queue)
        print(json.dumps(info) if args.json else info["count"])
        return 0

    return _with_client(args, verb)


def cmd_queues(args: argparse.Namespace) -> int:
    async def verb(client: Any) -> int:
        queues = await client.queues()
        if args.json:
            print(json.dumps(queues))
        else:
            _print_table(["QUEUE", "COUNT", "LOCKED"], [[q["queue"], q["count"], q.get("locked")] for q in queues])
        return 0

    return _with_client(args, verb)


def _queue_flags(args: argparse.Namespace) -> dict[str, Any]:
    """The flags given to ``rcq queue ACTION``, by name; one that ACTION does not take is an error, not
    silently ignored."""
    given = {name: getattr(args, name) for names in QUEUE_FLAGS.values() for name in names
             if getattr(args, name) is not None}
    for name in given:
        if name not in QUEUE_FLAGS.get(args.action, ()):
            takers = " or ".join(action for action, names in QUEUE_FLAGS.items() if name in names and action != "set")
            raise InvalidRequest(f"--{name.replace('_', '-')} goes with rcq queue {takers}, not {args.action}")
    return given


def cmd_queue(args: argparse.Namespace) -> int:
    flags = _queue_flags(args)

    async def verb(client: Any) -> int:
        if args.action == "show":
            answer: dict[str, Any] = await client.stats(args.queue)
        elif args.action in ("configure", "set"):
            answer = await client.configure_queue(args.queue, **flags)
        elif args.action == "redrive":
            answer = await client.redrive(args.queue, **flags)
        elif args.action == "purge":
            answer = {"queue": args.queue, "purged": True, "removed": await client.purge_queue(args.queue)}
        else:
            answer = {"queue": args.queue, "deleted": True, "removed": await client.delete_queue(args.queue)}
        if args.json or args.action in ("show", "configure", "set"):
            print(json.dumps(answer, indent=None if args.json else 2))
        elif args.action == "redrive":
            by_queue = ", ".join(f"{count} to {source}" for source, count in sorted(answer["by_queue"].items()))
            print(f"redrove {args.queue}: {answer['redriven']} item(s) moved back" + (f" ({by_queue})" if by_queue else ""))
        else:
            print(f"{args.action}d {args.queue}: {answer['removed']} item(s) removed")
        return 0

    return _with_client(args, verb)


def cmd_status(args: argparse.Namespace) -> int:
    """Ask every given node for its own view (no redirects): disagreements are the point."""
    async def verb(client: Any) -> int:
        urls = client.urls
        views = await asyncio.gather(*(client.cluster(url) for url in urls), return_exceptions=True)
        for view in views:
            if isinstance(view, BaseException) and not isinstance(view, RcqError):
                raise view
        nodes = [{"url": url, "ok": not isinstance(view, RcqError),
                  **({"error": view.to_body()["error"]} if isinstance(view, RcqError) else {"status": view})}
                 for url, view in zip(urls, views, strict=True)]
        if args.json:
            print(json.dumps({"nodes": nodes}))
        else:
            rows = []
            for node in nodes:
                view = node.get("status") or {}
                rows.append([node["url"], view.get("node_id"), view.get("role", "unreachable"), view.get("term"),
                             view.get("leader_id"), view.get("serving"), view.get("commit_index"),
                             view.get("last_applied"), view.get("open_transactions")])
            _print_table(["URL", "NODE", "ROLE", "TERM", "LEADER", "SERVING", "COMMIT", "APPLIED", "OPEN_TX"], rows)
        for node in nodes:
            if not node["ok"]:
                print(f"rcq: {node['error']['code']}: {node['url']}: {node['error']['message']}", file=sys.stderr)
        return 0 if all(node["ok"] for node in nodes) else 1

    return _with_client(args, verb)


# -------------------------------------------------------------------- cluster
def _print_members(members: list[dict[str, Any]]) -> None:
    def yes_no(value: Any) -> str | None:
        return None if value is None else ("yes" if value else "no")

    _print_table(["NODE", "ROLE", "RAFT_ADDRESS", "URL", "CONNECTED", "MATCH_INDEX"],
                 [[m.get("node_id"), m.get("role"), m.get("raft_address"), m.get("url"), yes_no(m.get("connected")),
                   m.get("match_index")] for m in members])


def cmd_cluster_members(args: argparse.Namespace) -> int:
    async def verb(client: Any) -> int:
        members = await client.cluster_members()
        if args.json:
            print(json.dumps(members))
        else:
            _print_members(members)
        return 0

    return _with_client(args, verb)


def cmd_cluster_add_node(args: argparse.Namespace) -> int:
    async def verb(client: Any) -> int:
        answer = await client.add_node(args.node_id, args.raft_address, args.node_url,
                                       catch_up_timeout_s=args.catch_up_timeout_s)
        if args.json:
            print(json.dumps(answer))
            return 0
        added = answer["added"]
        progress = ("it has caught up" if answer.get("caught_up") else
                    f"it has not caught up within {args.catch_up_timeout_s:g} s and keeps catching up")
        print(f"added node {added['node_id']} ({added['raft_address']}, {added['url']}): {progress}")
        _print_members(answer["members"])
        return 0

    return _with_client(args, verb)


def cmd_cluster_remove_node(args: argparse.Namespace) -> int:
    async def verb(client: Any) -> int:
        answer = await client.remove_node(args.node_id)
        if args.json:
            print(json.dumps(answer))
            return 0
        removed = answer["removed"]
        print(f"removed node {removed['node_id']} ({removed['raft_address']}, {removed['url']}); "
              f"{len(answer['members'])} member(s) left: stop it now")
        _print_members(answer["members"])
        return 0

    return _with_client(args, verb)


def cmd_cluster_transfer_leader(args: argparse.Namespace) -> int:
    async def verb(client: Any) -> int:
        answer = await client.transfer_leadership(args.node_id)
        if args.json:
            print(json.dumps(answer))
        else:
            print(f"leadership moved from {answer['previous_leader_id']} to {answer['leader_id']}")
        return 0

    return _with_client(args, verb)


def _membership_hint(args: argparse.Namespace, error: RcqError) -> str | None:
    """What to do about an error of ``rcq cluster ACTION``, in the terms of its flags (None: the message says it)."""
    action = f"rcq cluster {args.cluster_command}"
    node_id = getattr(args, "node_id", None)
    hints = {
        "forbidden": f"{action} needs an admin token (rcq token create --admin)",
        "member_exists": f"node {node_id} or the Raft address {getattr(args, 'raft_address', None)} is already a "
                         "member: see rcq cluster members",
        "member_not_found": f"no member has the node id {node_id}: see rcq cluster members",
        "membership_conflict": "another membership change is still being committed, or the new leader has not yet "
                               "committed an entry of its term"
                               + (", or the target has not caught up" if args.cluster_command == "transfer-leader"
                                  else "") + ": try again in a moment",
        "would_lose_quorum": "refused, nothing changed: afterwards fewer members would be reachable than a majority; "
                             "rcq cluster members shows which are not connected: bring them back first",
        "node_unreachable": f"the leader cannot reach {getattr(args, 'node_url', None)}/healthz as node {node_id}: "
                            "start the node first (rcq serve with this node id and Raft address, and the current "
                            "members as --peer) and check that the leader can reach that URL",
        "commit_outcome_unknown": "the change may or may not have been applied: see rcq cluster members before "
                                  "trying again",
    }
    return hints.get(error.code)


# -------------------------------------------------------------------- tokens
TOKENS_HELP = ("Nodes re-read a changed tokens file within about a second: a created token works and a revoked "
               "one stops working without a restart. Each node reads its own file: copy it to every node.")


def add_token_parsers(commands: Any) -> None:
    token = commands.add_parser("token", help="create, list or revoke API tokens in a tokens file (no server needed)",
                                description="Edit a node's tokens file (NodeConfig.tokens_file, rcq serve --tokens-file). "
                                            + TOKENS_HELP)
    actions = token.add_subparsers(dest="token_command", required=True)
    tokens_file = argparse.ArgumentParser(add_help=False)
    tokens_file.add_argument("--tokens-file", type=Path, required=True,
                             help="the tokens file (created mode 0600; an existing one must be private)")
    create = actions.add_parser(
        "create", parents=[tokens_file], help="make a token, add its hash to the file, print it once",
        description="Make a random token, add its SHA-256 to the tokens file and print the token: it is not kept "
                    "anywhere, so store it now. " + TOKENS_HELP)
    create.add_argument("--name", required=True,
                        help="the principal (transactions belong to it); tokens may share a name, for rotation")
    create.add_argument("--admin", action="store_true", help="every permission, and the cluster's own routes")
    create.add_argument("--grant", action="append", default=[], metavar="ACTIONS:PATTERN",
                        help="actions (comma-separated: produce, consume, manage) on the queues matching PATTERN "
                             "('*' any run of characters, '?' one), e.g. produce,consume:orders.* (repeat)")
    create.add_argument("--expires-in-days", type=float, default=None, help="refused after this (default: never)")
    create.add_argument("--json", action="store_true", help="print JSON for machines")
    create.set_defaults(func=cmd_token_create)
    listing = actions.add_parser("list", parents=[tokens_file], help="the file's tokens, without their hashes")
    listing.add_argument("--json", action="store_true", help="print JSON for machines")
    listing.set_defaults(func=cmd_token_list)
    revoke = actions.add_parser("revoke", parents=[tokens_file], help="remove every token of a name",
                                description="Remove every token of NAME from the tokens file. " + TOKENS_HELP)
    revoke.add_argument("--name", required=True)
    revoke.set_defaults(func=cmd_token_revoke)
    hashing = actions.add_parser("hash", help="print the SHA-256 of a token read from stdin (for NodeConfig.tokens)")
    hashing.set_defaults(func=cmd_token_hash)


def _grant(text: str) -> Grant:
    """``produce,consume:orders.*`` -> a Grant; a clear error for anything else."""
    with _server_extra("token"):
        from rcq.server.security.tokens import ACTIONS, QUEUE_PATTERN_PATTERN, Grant
    actions_text, colon, pattern = text.partition(":")
    if not colon or not actions_text.strip() or not pattern:
        raise InvalidRequest(f"--grant {text!r}: expected ACTIONS:PATTERN, e.g. produce,consume:orders.*")
    actions = [a.strip() for a in actions_text.split(",")]
    unknown = [a for a in actions if a not in ACTIONS]
    if unknown:
        raise InvalidRequest(f"--grant {text!r}: unknown action {unknown[0]!r}: use produce, consume or manage, "
                             "comma-separated")
    if not re.match(QUEUE_PATTERN_PATTERN, pattern):
        raise InvalidRequest(f"--grant {text!r}: the queue pattern {pattern!r} is malformed: use 1 to 128 characters "
                             "of [A-Za-z0-9._-] and the wildcards * and ?")
    return Grant(queues=pattern, actions=tuple(dict.fromkeys(actions)))  # type: ignore[arg-type]


def _read_tokens(path: Path, *, missing_ok: bool = False) -> list[TokenEntry]:
    """The entries of a tokens file (refused unless private); with ``missing_ok``, none for a
    file that does not exist yet or is empty."""
    with _server_extra("token"):
        from rcq.server.security.tokens import parse_tokens_file
    if missing_ok and not os.path.lexists(path):
        return []
    text = read_private(path, "tokens")
    if missing_ok and not text:
        return []
    return list(parse_tokens_file(text, path))


def _write_tokens(path: Path, entries: list[TokenEntry]) -> None:
    with _server_extra("token"):
        from rcq.server.security.tokens import TokensFile
    text = json.dumps(TokensFile(tokens=entries).model_dump(mode="json"), indent=2) + "\n"
    try:
        write_private(path, text)
    except OSError as exc:
        raise InvalidRequest(f"cannot write the tokens file {path}: {exc.strerror or exc}") from None


def _new_entry(args: argparse.Namespace, token: str) -> TokenEntry:
    """The entry of a new token, every flag checked first (a bad one changes nothing)."""
    with _server_extra("token"):
        from rcq.server.security.tokens import PRINCIPAL_PATTERN, TokenEntry, expiry_in, token_hash
    if not re.match(PRINCIPAL_PATTERN, args.name):
        raise InvalidRequest(f"--name {args.name!r} is not a principal name: use 1 to 64 characters of "
                             "[A-Za-z0-9._@-]")
    grants = tuple(_grant(text) for text in args.grant)
    if not args.admin and not grants:
        raise InvalidRequest("a token needs --admin or at least one --grant ACTIONS:PATTERN: without either it "
                             "may touch no queue")
    days = args.expires_in_days
    if days is not None and not (math.isfinite(days) and 0 < days <= EXPIRES_IN_DAYS_MAX):
        raise InvalidRequest(f"--expires-in-days must be more than 0 and at most {EXPIRES_IN_DAYS_MAX:g}")
    return TokenEntry(name=args.name, sha256=token_hash(token), admin=args.admin, grants=grants,
                      expires_at=expiry_in(days))


def _described(entry: TokenEntry) -> dict[str, Any]:
    """An entry as people see it: everything but its hash."""
    return entry.model_dump(mode="json", exclude={"sha256"})


def cmd_token_create(args: argparse.Namespace) -> int:
    with _server_extra("token"):
        from rcq.server.security.tokens import new_token
    token = new_token()
    entry = _new_entry(args, token)
    entries = _read_tokens(args.tokens_file, missing_ok=True)
    _write_tokens(args.tokens_file, [*entries, entry])
    print(json.dumps({"name": entry.name, "token": token, **_described(entry)}) if args.json else token)
    print(f"rcq: token of {entry.name!r} added to {args.tokens_file}; store it now: it is not kept anywhere",
          file=sys.stderr)
    return 0


def cmd_token_list(args: argparse.Namespace) -> int:
    now = time.time()
    described = [{**_described(entry), "expired": entry.expires_at is not None and entry.expires_at.timestamp() <= now}
                 for entry in _read_tokens(args.tokens_file)]
    if args.json:
        print(json.dumps({"tokens": described}))
        return 0
    rows = [[d["name"], "yes" if d["admin"] else "no",
             " ".join(f"{','.join(g['actions'])}:{g['queues']}" for g in d["grants"]) or None,
             d["expires_at"] or "never", "yes" if d["expired"] else "no"] for d in described]
    _print_table(["NAME", "ADMIN", "GRANTS", "EXPIRES_AT", "EXPIRED"], rows)
    return 0


def cmd_token_revoke(args: argparse.Namespace) -> int:
    entries = _read_tokens(args.tokens_file)
    kept = [entry for entry in entries if entry.name != args.name]
    revoked = len(entries) - len(kept)
    if not revoked:
        raise InvalidRequest(f"no token of {args.name!r} in {args.tokens_file}")
    _write_tokens(args.tokens_file, kept)
    print(f"revoked {revoked} token{'s' if revoked != 1 else ''} of {args.name!r}; nodes stop accepting "
          f"{'them' if revoked != 1 else 'it'} within about a second")
    return 0


def cmd_token_hash(args: argparse.Namespace) -> int:
    """stdin, not an argument: process lists show arguments. A terminal is asked without echo."""
    with _server_extra("token"):
        from rcq.server.security.tokens import token_hash
    token = (getpass.getpass("token: ") if sys.stdin.isatty() else sys.stdin.read()).strip()
    if not token:
        raise InvalidRequest("no token on stdin: e.g. rcq token hash < token-file")
    if not TOKEN_CHARACTERS.match(token):
        raise InvalidRequest("stdin must hold one token (printable characters, no spaces) and nothing else")
    print(token_hash(token))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rcq", description="rcq: a transactional, Raft-replicated queue")
    commands = parser.add_subparsers(dest="command", required=True)
    add_serve_parser(commands)
    add_client_parsers(commands)
    add_token_parsers(commands)
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


if __name__ == "__main__":
    sys.exit(main())
