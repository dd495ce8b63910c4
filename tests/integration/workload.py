"""The failover tests' workload, shared by the tests that change a cluster under load.

Jepsen's bookkeeping: every operation ends ``ok`` (acknowledged), ``fail`` (definitely did not
happen) or ``info`` (unknown); after a final drain, every acknowledged enqueue must come out
exactly once, nothing that was never enqueued may come out, and an unknown one at most once.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import time
from collections import Counter

from rcq.client import RcqClient, RcqError, Transaction, TransactionAborted
from tests.helpers.cluster import drain_until_empty


@dataclasses.dataclass
class History:
    """What the workload knows about each value it tried to enqueue or dequeue."""

    acknowledged: set[str] = dataclasses.field(default_factory=set)  # enqueue committed
    unknown_enqueues: dict[str, str] = dataclasses.field(default_factory=dict)  # value -> transaction id
    consumed: list[str] = dataclasses.field(default_factory=list)  # dequeued by a committed transaction
    unknown_dequeues: dict[str, list[str]] = dataclasses.field(default_factory=dict)  # transaction id -> values
    # worker -> commits of transactions begun after the old leader's process was gone
    acks_after_kill: Counter[str] = dataclasses.field(default_factory=Counter)
    killed_at: float | None = None
    first_ack_after_kill: float | None = None

    def ack(self, worker: str, began: float) -> None:
        if self.killed_at is not None and began >= self.killed_at:
            self.acks_after_kill[worker] += 1
            if self.first_ack_after_kill is None:
                self.first_ack_after_kill = time.monotonic()


async def abort_quietly(tx: Transaction) -> None:
    with contextlib.suppress(RcqError):
        await tx.abort()


async def producer(client: RcqClient, queue: str, name: str, history: History, stop: asyncio.Event) -> None:
    for n in itertools.count():
        if stop.is_set():
            return
        value = f"{name}-{n}"
        began = time.monotonic()
        try:
            tx = await client.begin(timeout_s=30)
        except RcqError:
            continue  # nothing was buffered anywhere
        try:
            await tx.enqueue(queue, value)
        except RcqError:
            await abort_quietly(tx)  # never committed: the value cannot appear
            continue
        try:
            await tx.commit()
        except TransactionAborted:
            continue  # definitely not committed
        except RcqError:
            history.unknown_enqueues[value] = tx.transaction_id
            continue
        history.acknowledged.add(value)
        history.ack(name, began)


async def consumer(client: RcqClient, queue: str, name: str, history: History, stop: asyncio.Event) -> None:
    while not stop.is_set():
        began = time.monotonic()
        try:
            tx = await client.begin(timeout_s=30)
        except RcqError:
            continue
        try:
            values = [v.decode() for v in await tx.dequeue_batch(queue, 3, wait_ms=100)]
        except RcqError:
            await abort_quietly(tx)
            continue
        if not values:
            await abort_quietly(tx)
            continue
        try:
            await tx.commit()
        except TransactionAborted:
            continue  # the values went back to the queue
        except RcqError:
            history.unknown_dequeues[tx.transaction_id] = values
            continue
        history.consumed.extend(values)
        history.ack(name, began)


async def committed(client: RcqClient, transaction_id: str) -> bool | None:
    """What the cluster says became of a commit whose answer was lost (None: still unknown)."""
    try:
        state = (await client.transaction_status(transaction_id))["state"]
    except RcqError:
        return None
    return {"committed": True, "aborted": False}.get(state)



async def check_nothing_lost(client: RcqClient, queue: str, history: History) -> None:
    """After the workload stopped: settle the unknown outcomes by asking the cluster, drain the
    queue, and check that every acknowledged enqueue came out exactly once and nothing else did."""
    # Ask the cluster what became of the commits whose answers were lost.
    for value, transaction_id in list(history.unknown_enqueues.items()):
        outcome = await committed(client, transaction_id)
        if outcome is not None:
            del history.unknown_enqueues[value]
            if outcome:
                history.acknowledged.add(value)
    consumed_maybe: set[str] = set()
    for transaction_id, values in history.unknown_dequeues.items():
        outcome = await committed(client, transaction_id)
        if outcome:
            history.consumed.extend(values)
        elif outcome is None:
            consumed_maybe.update(values)

    came_out = Counter(history.consumed) + Counter(await drain_until_empty(client, queue))
    duplicated = {v: n for v, n in came_out.items() if n > 1}
    unexpected = set(came_out) - history.acknowledged - set(history.unknown_enqueues)
    lost = {v for v in history.acknowledged if v not in came_out and v not in consumed_maybe}
    print(f"acknowledged {len(history.acknowledged)}, came out {sum(came_out.values())}, unknown enqueues "
          f"{len(history.unknown_enqueues)}, unknown dequeues {len(consumed_maybe)}")
    assert not duplicated, f"dequeued by two committed transactions: {duplicated}"
    assert not unexpected, f"came out but never enqueued: {sorted(unexpected)}"
    assert not lost, f"acknowledged but lost: {sorted(lost)}"
