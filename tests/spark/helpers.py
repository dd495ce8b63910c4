"""Test helpers: fill and read back a queue, look at open transactions.

Each takes the cluster's URLs (comma-separated, as the Spark option ``url``) and its token (the
``token`` fixture: the test cluster requires one, as a production cluster does).
"""

from __future__ import annotations

import asyncio
import collections
import uuid
from collections.abc import Callable
from typing import Any

from rcq.client import RcqClient


def unique_queue(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def _run(urls: str, token: str | None, work: Callable[[RcqClient], Any]) -> Any:
    async def main() -> Any:
        async with RcqClient(urls.split(","), retry_timeout_s=30.0, token=token) as client:
            return await work(client)

    return asyncio.run(main())


def take_all(urls: str, token: str | None, queue: str) -> list[bytes]:
    """Every item of ``queue``, dequeued and committed (the queue is empty afterwards)."""

    async def work(client: RcqClient) -> list[bytes]:
        values: list[bytes] = []
        while True:
            got = await client.dequeue(queue, 5000)
            if not got:
                return values
            values.extend(got)

    return _run(urls, token, work)


def take_some(urls: str, token: str | None, queue: str, count: int) -> list[bytes]:
    """Up to ``count`` items of ``queue``, dequeued and committed (another consumer's share)."""
    return _run(urls, token, lambda client: client.dequeue(queue, count))


def abort_open_transactions(urls: str, token: str | None, label_prefix: str) -> int:
    """Abort the open transactions labelled ``label_prefix``...: what a leader failover does to them."""

    async def work(client: RcqClient) -> int:
        open_ones = await client.transactions(label_prefix=label_prefix)
        for described in open_ones:
            await client.attach(described["transaction_id"]).abort()
        return len(open_ones)

    return _run(urls, token, work)


def enqueue_values(urls: str, token: str | None, queue: str, values: list[str]) -> None:
    async def work(client: RcqClient) -> None:
        for start in range(0, len(values), 1000):
            await client.enqueue(queue, *values[start:start + 1000])

    _run(urls, token, work)


def queue_info(urls: str, token: str | None, queue: str) -> dict[str, Any]:
    """The leader's view: ``count`` and ``locked`` (followers do not know what is locked)."""

    async def work(client: RcqClient) -> dict[str, Any]:
        await client.wait_for_leader(30.0)
        return await client.queue_info(queue)

    return _run(urls, token, work)


def open_transactions(urls: str, token: str | None, label_prefix: str) -> list[dict[str, Any]]:
    return _run(urls, token, lambda client: client.transactions(label_prefix=label_prefix))


def duplicates(values: list[Any]) -> dict[Any, int]:
    return {v: n for v, n in collections.Counter(values).items() if n > 1}
