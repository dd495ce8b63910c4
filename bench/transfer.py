"""rcq on the side-by-side "transfer" workload, through its one-request consumer.

The peers' harness (a directory holding ``common.py``, which runs P producers and C consumers
against NATS JetStream, RabbitMQ quorum queues and rcq and counts lost, duplicated and phantom
items) ships an rcq adapter that uses rcq's public client the way a first user would: a consumer
transaction is begin, dequeue, commit — three requests. This module is the same adapter with the
consumer rcq recommends now: ``receive`` (begin and dequeue in one request), then
``commit_and_receive`` (commit, and the next transaction's items in the same answer) — one request
per transaction. Producers are unchanged: one one-request enqueue per transaction.

    RCQ_TOKEN=... python -m bench.transfer --harness DIR --configs 8x8x1,32x32x1,32x32x10

``--mode``: ``receive`` (independent clients, one per worker: the issue's "separate"),
``receive-coalesce`` (one shared client per process). The cluster is the harness's: URLs and node
pids are read from ``$PEERS_DATA_ROOT/rcq`` (default ``/tmp/peers/rcq``), as its own rcq adapter
does; start it with the harness's ``setup_rcq.sh`` from the project root.

Must not import: pysyncobj, lmdb.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid
from typing import Any

from rcq.client import RcqClient, Transaction

PEER = "rcq"
DATA_DIR = os.environ.get("PEERS_DATA_ROOT", "/tmp/peers") + "/rcq"
RECEIVE_WAIT_MS = 20  # a short long-poll: an empty queue answers "nothing" within this

_clients: list[RcqClient] = []


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--mode", choices=["receive", "receive-coalesce"], default="receive")
    parser.add_argument("--harness", help="(read before the harness parses its arguments)")


def _urls() -> list[str]:
    with open(f"{DATA_DIR}/urls") as file:
        return [u.strip() for u in file.read().split() if u.strip()]


def topology(args: argparse.Namespace) -> str:
    return f"3 nodes (pysyncobj Raft, aiohttp), {args.mode} consumers, journal fsynced per entry"


def server_pids(args: argparse.Namespace) -> list[int]:
    try:
        with open(f"{DATA_DIR}/pids") as file:
            return [int(p) for p in file.read().split()]
    except OSError:
        return []


async def prepare(args: argparse.Namespace) -> dict[str, Any]:
    # The harness's summary names a row by its peer: "rcq receive" stands apart from the rows of
    # the harness's own rcq adapter ("rcq separate", "rcq coalesce").
    global PEER
    PEER = f"rcq {args.mode}"
    return {"queue": "bench-" + uuid.uuid4().hex[:10]}


class Producer:
    def __init__(self, client: RcqClient, queue: str) -> None:
        self.client, self.queue = client, queue

    async def enqueue(self, payloads: list[bytes]) -> None:
        await self.client.enqueue(self.queue, *payloads)


class Consumer:
    """Keeps the transaction it received open until the harness asks for the next items: then
    commits it and receives the next ones in the same request."""

    def __init__(self, client: RcqClient, queue: str) -> None:
        self.client, self.queue = client, queue
        self.pending: Transaction | None = None

    async def dequeue(self, n: int) -> list[bytes]:
        pending, self.pending = self.pending, None
        if pending is None:
            received = await self.client.receive(self.queue, n, wait_ms=RECEIVE_WAIT_MS)
            if received is None:
                return []
            pending = received
            # the harness counts a dequeue once its transaction committed: commit before answering
        following = await pending.commit_and_receive(max_items=n, wait_ms=RECEIVE_WAIT_MS)
        self.pending = following
        return [item.value for item in pending.items]

    async def close(self) -> None:
        if self.pending is not None:
            await self.pending.abort_quietly()
            self.pending = None


async def open_workers(args: argparse.Namespace, ctx: dict[str, Any], role: str, n: int) -> list[Any]:
    urls = _urls()
    shared = None
    if args.mode == "receive-coalesce":
        shared = RcqClient(urls, coalesce=True)
        _clients.append(shared)
        await shared.wait_for_leader()
    workers: list[Any] = []
    for _ in range(n):
        client = shared
        if client is None:
            client = RcqClient(urls)
            _clients.append(client)
            await client.wait_for_leader()
        workers.append(Producer(client, ctx["queue"]) if role == "producer" else Consumer(client, ctx["queue"]))
    return workers


async def close_workers(workers: list[Any]) -> None:
    for worker in workers:
        if isinstance(worker, Consumer):
            await worker.close()
    for client in _clients:
        await client.close()
    _clients.clear()


async def leftover_ids(args: argparse.Namespace, ctx: dict[str, Any]) -> list[int]:
    import common  # the harness's, on sys.path (see main)

    ids: list[int] = []
    async with RcqClient(_urls()) as client:
        give_up_at = time.time() + 120
        while time.time() < give_up_at:
            got = await client.dequeue(ctx["queue"], max_items=1000)
            if not got:
                break
            ids.extend(common.parse_id(p) for p in got)
    return ids


def main() -> int:
    """Put the harness on the path, then hand over to its ``common.main`` with this adapter."""
    harness = None
    for position, arg in enumerate(sys.argv):
        if arg == "--harness" and position + 1 < len(sys.argv):
            harness = sys.argv[position + 1]
        elif arg.startswith("--harness="):
            harness = arg.split("=", 1)[1]
    if harness is None and {"-h", "--help"} & set(sys.argv[1:]):
        print(__doc__)  # the harness's own flags are known only once it is on the path
        return 0
    if harness is None or not os.path.isfile(os.path.join(harness, "common.py")):
        print("bench.transfer: --harness DIR (the directory of the side-by-side harness's common.py)",
              file=sys.stderr)
        return 2
    sys.path.insert(0, os.path.abspath(harness))
    import common

    return int(common.main(__name__ if __name__ != "__main__" else "bench.transfer") or 0)


if __name__ == "__main__":
    sys.exit(main())
