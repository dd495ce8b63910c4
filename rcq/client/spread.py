"""Where the client sends a one-request verb on a spread queue (docs/partitions.md, "Spread queues").

A spread queue has a fragment in each of its partitions. A one-request enqueue goes to the
fragment of its ``partition_key``, else of the idempotency key its caller gave (a retry under the
same key must reach the fragment that remembers it), else to the next fragment in turn (each
client keeps its own turn per queue), moving on while a fragment is full; a one-request dequeue or
receive goes to its ``partition_key``'s fragment, or tries each fragment in turn without waiting
until one has items, and spends its wait, if any, in the last one. The client learns the cluster's
partitions once (``GET /v1/cluster/partitions``; a listing of p0 alone is asked again now and
then) and, when there are several, a queue's placement once (``GET /v1/queues/{q}/placement``):
then each verb goes straight to its fragment's partition leader, and a spread queue's load is
spread over its partitions' processes.

Must not import: rcq.client.transport (it builds on the routes), rcq.server, pysyncobj, lmdb.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from rcq.client.routes import Routes
from rcq.names import fragment_for


async def one_request_partition(routes: Routes, queue: str) -> str | None:
    """Where a one-request verb on ``queue`` goes: its partition as known (None: p0, which routes
    it); a spread queue's next fragment in turn."""
    spread = routes.spread(queue)
    if spread is None and routes.placed(queue) is None and routes.single() is None:
        await routes.partitions()
    if spread is None and routes.placed(queue) is None and routes.single() is False:
        placement = await routes.placement_of(queue)
        spread = placement if len(placement) > 1 else None
    return routes.placed(queue) if spread is None else routes.next_fragment(queue, spread)


async def enqueue_partitions(routes: Routes, queue: str, key: str | None) -> list[str | None]:
    """Where a one-request enqueue on ``queue`` goes, in the order to try: one partition (None:
    p0, which routes it), or, on a spread queue without ``key`` (a partition key, or the caller's
    idempotency key), every fragment from the next in turn, each tried while the one before is
    full."""
    first = await one_request_partition(routes, queue)
    spread = routes.spread(queue)
    if spread is None:
        return [first]
    if key is not None:
        return [fragment_for(key, spread)]
    assert first is not None
    start = spread.index(first)
    return list(spread[start:] + spread[:start])


async def each_fragment(routes: Routes, queue: str, wait_ms: int, send: Callable[[str | None, int], Awaitable[Any]],
                        took: Callable[[Any], bool], partition_key: str | None = None) -> Any:
    """``send(partition, wait_ms)`` of a one-request dequeue or receive: on a spread queue, the
    ``partition_key``'s fragment, or each fragment in turn without waiting until ``took`` its
    answer, the wait then spent in the last."""
    first = await one_request_partition(routes, queue)
    spread = routes.spread(queue)
    if spread is None:
        return await send(first, wait_ms)
    if partition_key is not None:
        return await send(fragment_for(partition_key, spread), wait_ms)
    partition: str | None = first
    answer: Any = None
    for _ in range(len(spread)):
        answer = await send(partition, 0)
        if took(answer):
            return answer
        partition = routes.next_fragment(queue, spread)
    return await send(partition, wait_ms) if wait_ms else answer
