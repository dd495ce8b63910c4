"""What a backup test's clients were told, with each commit's index, and the load that writes
it: producers, consumers that commit or abort, and a drain (tests/integration/test_backup.py,
test_backup_partitions.py).

Must not import: a test module or a conftest.
"""

from __future__ import annotations

import asyncio
from typing import Any

from rcq.client import RcqClient
from rcq.errors import RcqError


class History:
    """What the clients were told: enqueues and dequeues acknowledged, with their commit index."""

    def __init__(self) -> None:
        self.enqueued: dict[bytes, int] = {}
        self.dequeued: dict[bytes, int] = {}
        self.unknown: set[bytes] = set()  # enqueues whose outcome is not known
        self.maybe_dequeued: set[bytes] = set()

    def check_restored(self, present: set[bytes], index: int) -> None:
        """``present`` (what a queue holds, restored at Raft ``index``) is what this history says it
        held then: every value enqueued at or before ``index`` and not dequeued by then, and none
        other it names; values whose dequeue's outcome was not known go either way."""
        checked = 0
        for value, at in self.enqueued.items():
            if value in self.maybe_dequeued:
                continue
            gone_at = self.dequeued.get(value)
            if at <= index and (gone_at is None or gone_at > index):
                assert value in present, f"{value!r} enqueued at {at}, dequeued at {gone_at}: missing at {index}"
                checked += 1
            elif at > index:
                assert value not in present, f"{value!r} enqueued at {at} > backup index {index} was restored"
            else:
                assert value not in present, f"{value!r} dequeued at {gone_at} <= {index} reappeared"
        assert checked > 0


async def producer(client: RcqClient, queue: str, name: str, history: History, stop: asyncio.Event) -> None:
    n = 0
    while not stop.is_set():
        values = [f"{name}-{n + i}".encode() for i in range(5)]
        n += 5
        try:
            info = await client.enqueue(queue, *values)
        except RcqError:
            history.unknown.update(values)
            continue
        for value in values:
            history.enqueued[value] = info.index


async def consumer(client: RcqClient, queue: str, history: History, stop: asyncio.Event, abort: bool) -> None:
    while not stop.is_set():
        values: list[bytes] = []
        try:
            tx = await client.begin(timeout_s=30)
            values = await tx.dequeue_batch(queue, 3)
            if abort or not values:
                await tx.abort()
                await asyncio.sleep(0.01)  # pace: a consumer that aborts does not spin
                continue
            info = await tx.commit()
        except RcqError:
            history.maybe_dequeued.update(values)  # a commit whose outcome is not known
            continue
        for value in values:
            history.dequeued[value] = info.index


async def drain(urls: list[str], options: dict[str, Any], queue: str) -> list[bytes]:
    """Every item of ``queue``, dequeued and committed."""
    got: list[bytes] = []
    async with RcqClient(urls, **options) as client:
        while True:
            tx = await client.begin(timeout_s=30)
            batch = []
            for _ in range(200):
                value = await tx.dequeue(queue)
                if value is None:
                    break
                batch.append(value)
            await tx.commit()
            if not batch:
                return got
            got.extend(batch)
