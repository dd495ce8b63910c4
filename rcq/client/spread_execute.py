"""The client's ``execute`` on queues spread over the same partitions (docs/partitions.md, "Spread queues").

One transaction lives in one partition, so an execute on spread queues runs in one of their
partitions, chosen here as a node's own port would (rcq.server.http.spread_queues): with the
caller's idempotency key, the key's partition (a retry reaches the one that remembers it); dequeues
alone, from the first fragment that has items (rcq.client.spread.each_fragment, dark ones passed
over); operations that enqueue, in the next partition in turn, moving on while one is full or dark.

Must not import: rcq.client.client (it builds on this), rcq.server, pysyncobj, lmdb.
"""

from __future__ import annotations

from typing import Any, cast

from rcq.client.retry import WRITE, WRITE_ELSEWHERE_IF_FULL, Request, RetryPolicy
from rcq.client.spread import FRAGMENT_PASS_BUDGET_S, each_fragment
from rcq.client.transport import Transport
from rcq.client.wire import ExecuteResult, execute_result, operations_wait_ms, retry_key
from rcq.errors import QueueFull, Unavailable
from rcq.names import fragment_for


async def execute_spread(transport: Transport, spread: tuple[str, ...], bodies: list[dict[str, Any]], key: str,
                         keyed: bool) -> ExecuteResult:
    """Run the operations ``bodies`` in one of ``spread``'s partitions (see the module docstring).
    ``key``: the idempotency key sent; ``keyed``: the caller gave it (else the client made it)."""

    async def run(partition: str, wait_ms: int | None, budget_s: float | None,
                  policy: RetryPolicy = WRITE, sent_key: str = key) -> ExecuteResult:
        sent = bodies if wait_ms is None else [
            {**b, "wait_ms": min(int(b.get("wait_ms") or 0), wait_ms)} if b.get("op") == "dequeue" else b for b in bodies]
        body = {"operations": sent, "idempotency_key": sent_key}
        return execute_result(await transport.request(Request(
            "POST", "/v1/execute", body, policy, batch_operation={"op": "execute", **body},
            wait_ms=operations_wait_ms(sent), partition=partition, budget_s=budget_s)))

    routes = transport.routes
    queue = str(bodies[0].get("queue"))  # whose turn: the first queue's
    if keyed:
        return await run(fragment_for(key, spread), None, None)
    if all(b.get("op") == "dequeue" for b in bodies):
        async def send(partition: str | None, wait_ms: int, budget_s: float | None) -> ExecuteResult:
            # a key of its own per fragment tried: one that took nothing may be asked again to wait
            assert partition is not None
            return await run(partition, wait_ms, budget_s, sent_key=retry_key())

        return cast(ExecuteResult, await each_fragment(routes, queue, operations_wait_ms(bodies), send,
                                   lambda result: any(done.items for done in result.results)))
    first = routes.next_fragment(queue, spread)
    start = spread.index(first)
    order = spread[start:] + spread[:start]
    for partition in order[:-1]:
        try:  # Unavailable: nothing ran there (ran maybe: CommitOutcomeUnknown), so the key is free
            return await run(partition, None, FRAGMENT_PASS_BUDGET_S, WRITE_ELSEWHERE_IF_FULL)
        except (QueueFull, Unavailable):
            continue
    return await run(order[-1], None, None)
