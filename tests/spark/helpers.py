"""Test helpers: fill and read back a queue, look at open transactions."""

from __future__ import annotations

import asyncio
import collections
import uuid
from collections.abc import Callable
from typing import Any

from rcq.client import RcqClient


def unique_queue(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def _run(urls: str, work: Callable[[RcqClient], Any]) -> Any:
    async def main() -> Any:
        async with RcqClient(urls.split(","), retry_timeout_s=30.0) as client:
            return await work(client)

    return asyncio.run(main())


def take_all(urls: str, queue: str) -> list[bytes]:
    """Every item of ``queue``, dequeued and committed (the queue is empty afterwards)."""

    async def work(client: RcqClient) -> list[bytes]:
        values: list[bytes] = []
        while True:
            got = await client.dequeue(queue, 5000)
            if not got:
                return values
            values.extend(got)

    return _run(urls, work)


def enqueue_values(urls: str, queue: str, values: list[str]) -> None:
    async def work(client: RcqClient) -> None:
        for start in range(0, len(values), 1000):
            await client.enqueue(queue, *values[start:start + 1000])

    _run(urls, work)


def queue_info(urls: str, queue: str) -> dict[str, Any]:
    """The leader's view: ``count`` and ``locked`` (followers do not know what is locked)."""

    async def work(client: RcqClient) -> dict[str, Any]:
        await client.wait_for_leader(30.0)
        return await client.queue_info(queue)

    return _run(urls, work)


def open_transactions(urls: str, label_prefix: str) -> list[dict[str, Any]]:
    return _run(urls, lambda client: client.transactions(label_prefix=label_prefix))


def duplicates(values: list[Any]) -> dict[Any, int]:
    return {v: n for v, n in collections.Counter(values).items() if n > 1}
