"""Where the client sends a one-request verb on a spread queue (docs/partitions.md, "Spread queues").

A spread queue has a fragment in each of its partitions. A one-request enqueue goes to the
fragment of its ``partition_key``, else of the idempotency key its caller gave (a retry under the
same key must reach the fragment that remembers it), else to the next fragment in turn (each
client keeps its own turn per queue), moving on while a fragment is full or dark (below); a one-request dequeue or
receive goes to its ``partition_key``'s fragment, or tries each fragment in turn without waiting
until one has items, and spends its wait, if any, in the last one. A fragment is given
FRAGMENT_PASS_BUDGET_S there (a node's own port: 2 s): one whose partition has no leader that
answers (``Unavailable``: nothing ran) is passed over; a leader that took the request and never
answered leaves a dequeue's outcome unknown (``CommitOutcomeUnknown``, raised: it may have taken
items) and a receive's transaction holding what it took until its deadline (passed over). The client learns the cluster's
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
from rcq.errors import Unavailable
from rcq.names import fragment_for

# How long a one-request verb gives one fragment of several, retries included, before passing over
# it. Longer than the 2 s a node's own port waits (rcq.server.http.spread_queues), which waits for a
# leader its directory knows: the client cannot tell a stopped leader from a slow one, and a slow
# answer cut short leaves a dequeue's or an enqueue's outcome unknown.
FRAGMENT_PASS_BUDGET_S = 5.0


async def spread_of(routes: Routes, queue: str) -> tuple[str, ...] | None:
    """``queue``'s partitions if it is spread over several (learnt once), else None."""
    spread = routes.spread(queue)
    if spread is None and routes.placed(queue) is None and routes.single() is None:
        await routes.partitions()
    if spread is None and routes.placed(queue) is None and routes.single() is False:
        placement = await routes.placement_of(queue)
        spread = placement if len(placement) > 1 else None
    return spread


async def one_request_partition(routes: Routes, queue: str) -> str | None:
    """Where a one-request verb on ``queue`` goes: its partition as known (None: p0, which routes
    it); a spread queue's next fragment in turn."""
    spread = await spread_of(routes, queue)
    return routes.placed(queue) if spread is None else routes.next_fragment(queue, spread)


async def shared_spread(routes: Routes, queues: list[str]) -> tuple[str, ...] | None:
    """The partitions of an ``execute``'s queues when they are all spread over the same ones (it
    then runs in one of them, chosen here); None otherwise (the node of p0 chooses, or refuses)."""
    spreads = {await spread_of(routes, queue) for queue in queues}
    spread = spreads.pop() if len(spreads) == 1 else None
    return spread


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


async def each_fragment(routes: Routes, queue: str, wait_ms: int,
                        send: Callable[[str | None, int, float | None], Awaitable[Any]],
                        took: Callable[[Any], bool], partition_key: str | None = None) -> Any:
    """``send(partition, wait_ms, budget_s)`` of a one-request dequeue or receive: on a spread
    queue, the ``partition_key``'s fragment, or each fragment in turn without waiting until ``took``
    its answer, passing over the dark ones (the module docstring), the wait then spent in the last
    one that answered; every fragment dark: its ``Unavailable``."""
    first = await one_request_partition(routes, queue)
    spread = routes.spread(queue)
    if spread is None:
        return await send(first, wait_ms, None)
    if partition_key is not None:
        return await send(fragment_for(partition_key, spread), wait_ms, None)
    partition: str | None = first
    answered: str | None = None
    answer: Any = None
    dark: Unavailable | None = None
    for _ in range(len(spread)):
        try:
            answer = await send(partition, 0, FRAGMENT_PASS_BUDGET_S)
        except Unavailable as exc:
            dark = exc
        else:
            if took(answer):
                return answer
            answered = partition
        partition = routes.next_fragment(queue, spread)
    if answered is None:
        assert dark is not None
        raise dark
    return await send(answered, wait_ms, None) if wait_ms else answer
