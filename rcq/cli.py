"""The ``rcq`` command: ``rcq serve`` runs one node; client verbs talk to a cluster.

Client verbs: ``enqueue``, ``dequeue``, ``peek``, ``count``, ``queues``, ``status``. They
find the cluster from ``--url`` (repeatable) or ``RCQ_URLS`` (comma-separated), print
for people by default and JSON with ``--json``. Errors print ``rcq: <code>: <message>``
on stderr and exit 2; ``status`` exits 1 when a node does not answer.

Must not import: pysyncobj, lmdb (``serve`` reaches them through rcq.server.node).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from rcq.encoding import decode_item, encode_item
from rcq.errors import InvalidRequest, RcqError


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
    try:  # the server is an extra: pip install 'rcq[server]'
        from rcq.server.config import load_config
        from rcq.server.node import run_node
    except ImportError as exc:
        raise InvalidRequest(f"rcq serve needs the server extra (pip install 'rcq[server]'): {exc}") from exc
    config = load_config(
        args.config, node_id=args.node_id, http_host=args.http_host, http_port=args.http_port,
        advertise_url=args.advertise_url, raft_address=args.raft_address, peers=args.peer,
        data_dir=args.data_dir, cluster_secret=secret, insecure=args.insecure)
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
    enqueue = commands.add_parser("enqueue", parents=[common], help="enqueue items in one committed transaction")
    enqueue.add_argument("queue")
    enqueue.add_argument("items", nargs="+", metavar="ITEM")
    enqueue.add_argument("--base64", action="store_true", help="the ITEMs are base64 (binary items)")
    enqueue.set_defaults(func=cmd_enqueue)
    dequeue = commands.add_parser("dequeue", parents=[common],
                                  help="dequeue and commit (at most once: items are gone once printed)")
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
                                help="show, configure, purge or delete one queue (replicated)")
    queue.add_argument("action", choices=["show", "set", "purge", "delete"])
    queue.add_argument("queue")
    queue.add_argument("--max-items", type=int, default=None, help="with set: most items the queue may hold")
    queue.add_argument("--max-bytes", type=int, default=None,
                       help="with set: most bytes it may hold, each item's bookkeeping included")
    queue.set_defaults(func=cmd_queue)
    status = commands.add_parser("status", parents=[common],
                                 help="each node's view: role, term, leader, indexes (exit 1 if one is down)")
    status.set_defaults(func=cmd_status)


def _urls(args: argparse.Namespace) -> list[str]:
    urls = [u for given in (args.url or []) for u in given.split(",") if u.strip()]
    if not urls:
        urls = [u for u in os.environ.get("RCQ_URLS", "").split(",") if u.strip()]
    if not urls:
        raise InvalidRequest("no node URL: pass --url or set RCQ_URLS")
    return urls


def _with_client(args: argparse.Namespace, verb: Callable[[Any], Awaitable[int]]) -> int:
    from rcq.client import RcqClient

    async def run() -> int:
        async with RcqClient(_urls(args), retry_timeout_s=args.retry_timeout_s) as client:
            return await verb(client)

    return asyncio.run(run())


def _wire(value: bytes) -> dict[str, str]:
    text, used = encode_item(value)
    return {"value": text, "encoding": used}


def _print_items(args: argparse.Namespace, values: list[bytes]) -> None:
    if args.json:
        print(json.dumps({"queue": args.queue, "items": [_wire(v) for v in values]}))
        return
    for value in values:
        wire = _wire(value)
        print(wire["value"] if wire["encoding"] == "utf-8" else f"base64:{wire['value']}")
    if not values:
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
        info = await client.enqueue(args.queue, *items)
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
        _print_items(args, await client.dequeue(args.queue, args.max_items, args.wait_ms))
        return 0

    return _with_client(args, verb)


def cmd_peek(args: argparse.Namespace) -> int:
    async def verb(client: Any) -> int:
        value = await client.peek(args.queue)
        _print_items(args, [] if value is None else [value])
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


def cmd_queue(args: argparse.Namespace) -> int:
    async def verb(client: Any) -> int:
        if args.action == "show":
            answer: dict[str, Any] = await client.stats(args.queue)
        elif args.action == "set":
            answer = await client.configure_queue(args.queue, max_items=args.max_items, max_bytes=args.max_bytes)
        elif args.action == "purge":
            answer = {"queue": args.queue, "purged": True, "removed": await client.purge_queue(args.queue)}
        else:
            answer = {"queue": args.queue, "deleted": True, "removed": await client.delete_queue(args.queue)}
        if args.json or args.action in ("show", "set"):
            print(json.dumps(answer, indent=None if args.json else 2))
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rcq", description="rcq: a transactional, Raft-replicated queue")
    commands = parser.add_subparsers(dest="command", required=True)
    add_serve_parser(commands)
    add_client_parsers(commands)
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
