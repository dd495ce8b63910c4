"""Where the client sends a one-request verb on a spread queue (docs/partitions.md, "Spread queues").

A spread queue has a fragment in each of its partitions. A one-request enqueue goes to the next
fragment in turn (each client keeps its own turn per queue); a one-request dequeue or receive
tries each fragment in turn without waiting until one has items, and spends its wait, if any, in
the last one. The client learns the cluster's partitions once (``GET /v1/cluster/partitions``;
a listing of p0 alone is asked again now and then) and, when there are several, a queue's
placement once (``GET /v1/queues/{q}/placement``): then each verb goes straight to its fragment's
partition leader, and a spread queue's load is spread over its partitions' processes.

Must not import: rcq.client.transport (it builds on the routes), rcq.server, pysyncobj, lmdb.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from rcq.client.routes import Routes


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


async def each_fragment(routes: Routes, queue: str, wait_ms: int, send: Callable[[str | None, int], Awaitable[Any]],
                        took: Callable[[Any], bool]) -> Any:
    """``send(partition, wait_ms)`` of a one-request dequeue or receive: on a spread queue, each
    fragment in turn without waiting until ``took`` its answer, the wait then spent in the last."""
    first = await one_request_partition(routes, queue)
    spread = routes.spread(queue)
    if spread is None:
        return await send(first, wait_ms)
    partition: str | None = first
    answer: Any = None
    for _ in range(len(spread)):
        answer = await send(partition, 0)
        if took(answer):
            return answer
        partition = routes.next_fragment(queue, spread)
    return await send(partition, wait_ms) if wait_ms else answer
