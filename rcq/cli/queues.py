"""The queue verbs: ``enqueue``, ``dequeue``, ``peek``, ``count``, ``queues`` and ``queue ACTION``.

Each runs one client call (``enqueue`` and ``dequeue`` commit their own transaction) and prints
for people, or JSON with ``--json``.

Must not import: rcq.server, pysyncobj, lmdb.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from rcq.cli.connection import seconds, with_client
from rcq.cli.output import item_wire, print_items, print_table, wire
from rcq.client import PEEK_TIMEOUT_S
from rcq.encoding import decode_item
from rcq.errors import InvalidRequest

# The flags of ``rcq queue ACTION`` by action (the attribute names; the flag is ``--`` and dashes).
QUEUE_SETTINGS = ("max_items", "max_bytes", "max_deliveries", "dead_letter_queue", "default_ttl_s",
                  "default_delay_s", "max_priority", "partitions")
QUEUE_FLAGS = {"configure": QUEUE_SETTINGS, "set": QUEUE_SETTINGS, "redrive": ("max_items", "source_queue")}


def header(text: str) -> tuple[str, str]:
    """``KEY=VALUE`` (an argument type): split at the first ``=``; the key must not be empty."""
    key, equals, value = text.partition("=")
    if not equals or not key:
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE")
    return key, value


def add_queue_parsers(commands: Any, common: argparse.ArgumentParser) -> None:
    enqueue = commands.add_parser("enqueue", parents=[common], help="enqueue items in one committed transaction")
    enqueue.add_argument("queue")
    enqueue.add_argument("items", nargs="+", metavar="ITEM")
    enqueue.add_argument("--base64", action="store_true", help="the ITEMs are base64 (binary items)")
    enqueue.add_argument("--priority", type=int, default=None,
                         help="0 to 255, at most the queue's max_priority; higher ones are dequeued first (default 0)")
    enqueue.add_argument("--delay-s", type=seconds, default=None,
                         help="invisible to dequeues this long after the commit (default: the queue's default_delay_s)")
    enqueue.add_argument("--ttl-s", type=seconds, default=None,
                         help="leaves the queue (expired) if not consumed this long after the commit "
                              "(default: the queue's default_ttl_s)")
    enqueue.add_argument("--header", action="append", type=header, default=[], dest="headers", metavar="KEY=VALUE",
                         help="a header every ITEM carries (repeatable; needs feature level 2)")
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
    _add_queue_parser(commands, common)


def _add_queue_parser(commands: Any, common: argparse.ArgumentParser) -> None:
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
    queue.add_argument("--default-ttl-s", type=seconds, default=None,
                       help="with configure: an item not consumed this long after its enqueue leaves (expired)")
    queue.add_argument("--default-delay-s", type=seconds, default=None,
                       help="with configure: an item is invisible this long after its enqueue")
    queue.add_argument("--max-priority", type=int, default=None,
                       help="with configure: the highest priority an enqueue may give, 0 to 255")
    queue.add_argument("--partitions", type=lambda text: [p for p in text.split(",") if p], default=None,
                       metavar="P[,P...]", help="with configure: the partition a new queue lives in, fixed once it "
                                                "exists (docs/partitions.md); absent: kept")
    queue.add_argument("--source-queue", default=None, metavar="QUEUE",
                       help="with redrive: only the dead items that came from this queue")
    queue.set_defaults(func=cmd_queue)


def cmd_enqueue(args: argparse.Namespace) -> int:
    items: list[bytes | str] = list(args.items)
    if args.base64:
        try:
            items = [decode_item(i, "base64") for i in args.items]
        except ValueError as exc:
            raise InvalidRequest(f"an ITEM is not valid base64: {exc}") from exc

    async def verb(client: Any) -> int:
        info = await client.enqueue(args.queue, *items, priority=args.priority, delay_s=args.delay_s, ttl_s=args.ttl_s,
                                    headers=dict(args.headers) or None)
        if args.json:
            print(json.dumps({"queue": args.queue, "enqueued": len(items), "index": info.index,
                              "duplicate": info.duplicate, "transaction_ids": list(info.transaction_ids)}))
        else:
            print(f"enqueued {len(items)} item{'s' if len(items) != 1 else ''} into {args.queue} "
                  f"(commit index {info.index})")
        return 0

    return with_client(args, verb)


def cmd_dequeue(args: argparse.Namespace) -> int:
    async def verb(client: Any) -> int:
        print_items(args, [item_wire(item) for item in await client.dequeue_items(args.queue, args.max_items,
                                                                                  args.wait_ms)])
        return 0

    return with_client(args, verb)


def cmd_peek(args: argparse.Namespace) -> int:
    async def verb(client: Any) -> int:
        # What client.peek does (dequeue and abort), keeping the item's headers to show them.
        transaction = await client.begin(PEEK_TIMEOUT_S, "rcq.peek")
        try:
            items = await transaction.dequeue_items(args.queue)
        finally:
            await transaction.abort_quietly()
        print_items(args, [wire(item.value, item.headers) for item in items])
        return 0

    return with_client(args, verb)


def cmd_count(args: argparse.Namespace) -> int:
    async def verb(client: Any) -> int:
        info = await client.queue_info(args.queue)
        print(json.dumps(info) if args.json else info["count"])
        return 0

    return with_client(args, verb)


def cmd_queues(args: argparse.Namespace) -> int:
    async def verb(client: Any) -> int:
        queues = await client.queues()
        if args.json:
            print(json.dumps(queues))
        else:
            print_table(["QUEUE", "COUNT", "LOCKED"], [[q["queue"], q["count"], q.get("locked")] for q in queues])
        return 0

    return with_client(args, verb)


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

    return with_client(args, verb)
