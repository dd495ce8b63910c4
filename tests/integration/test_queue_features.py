"""Delivery limits, dead letters, reject, redrive, delays, priorities, TTL and time in the state
machine (docs/queue-features.md), against real 3-node clusters.

Most tests share the module's cluster (``healthy_cluster``: every node restarted and a leader
found before each test) and work on queues of their own; the tests that kill a leader restart it
through that fixture. The bad-settings test compares the leader's state digest before and after,
so it runs on a quiet cluster of its own; the clock-skew tests need one node configured apart
from the others, so each builds a cluster whose node configs it edits before starting them.

Time: the nodes and the test run on the same machine, so an item's ``enqueued_at_ms`` (the
entry time of its enqueue) and the test's wall clock are the same clock: an item handed out in
an answer received before ``enqueued_at_ms + delay`` was handed out early, and one handed out
by a request sent at or after ``enqueued_at_ms + ttl`` was handed out expired.

Node logs are added to the report of a failing test by the hook in conftest.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest

from rcq.client import (
    DeadLetter,
    Enqueue,
    InvalidRequest,
    Item,
    QueueInUse,
    RcqClient,
    TransactionAborted,
)
from rcq.local.cluster import LocalCluster
from rcq.private_files import write_private
from rcq.testing import async_wait_until
from tests.helpers import CLUSTER_WAIT_S, LEADER_TIMEOUT_S, QUIET_CLUSTER_WAIT_S
from tests.helpers.cluster import fresh_queue, running_cluster

pytestmark = pytest.mark.cluster

HOUR_MS = 3_600_000


# ----------------------------------------------------------------------- helpers
def wall_ms() -> float:
    return time.time() * 1000


async def leader_index(cluster: LocalCluster) -> int:
    return await asyncio.to_thread(cluster.wait_for_leader, LEADER_TIMEOUT_S)


async def leader_stats(cluster: LocalCluster, queue: str) -> dict[str, Any]:
    """GET /v1/queues/{queue}/stats of the serving leader (its view: ready, delayed, locked)."""

    def ask() -> dict[str, Any] | None:  # refused or garbled while a failover settles: asked again
        leader = cluster.wait_for_leader(LEADER_TIMEOUT_S)
        answer = cluster.poll_json(cluster.url(leader) + f"/v1/queues/{queue}/stats", timeout_s=5.0)
        return answer if answer.get("ready") is not None else None  # answered by a node that serves as leader

    return await async_wait_until(lambda: asyncio.to_thread(ask), CLUSTER_WAIT_S, what=f"a serving leader's stats of {queue}",
                                  interval_s=0.1)


async def count_on_leader(cluster: LocalCluster, queue: str) -> int:
    return int((await leader_stats(cluster, queue))["count"])


async def wait_for_count(cluster: LocalCluster, queue: str, wanted: int, timeout_s: float = QUIET_CLUSTER_WAIT_S) -> None:
    seen: list[int] = []

    async def reached() -> bool:
        seen.append(await count_on_leader(cluster, queue))
        return seen[-1] == wanted

    await async_wait_until(reached, timeout_s, interval_s=0.05,
                           what=f"{queue} to hold {wanted} item(s) (last seen {seen[-1:]})")


async def peek_items(client: RcqClient, queue: str, max_items: int = 1) -> list[Item]:
    """Dequeue and abort: the items go back to the head (a delivery on a queue with max_deliveries)."""
    transaction = await client.begin(timeout_s=30)
    try:
        return await transaction.dequeue_items(queue, max_items)
    finally:
        await transaction.abort()


async def take_all(client: RcqClient, queue: str) -> list[Item]:
    """Dequeue and commit everything available in ``queue``."""
    async with client.transaction(timeout_s=30) as transaction:
        return await transaction.dequeue_items(queue, 1000)


def values(items: list[Item]) -> list[bytes]:
    return [item.value for item in items]


@pytest.fixture
async def client(healthy_cluster: LocalCluster) -> AsyncIterator[RcqClient]:
    async with RcqClient(healthy_cluster.urls, request_timeout_s=15.0, retry_timeout_s=QUIET_CLUSTER_WAIT_S,
                         **healthy_cluster.client_options()) as rcq_client:
        await rcq_client.wait_for_leader(LEADER_TIMEOUT_S)
        yield rcq_client


# ------------------------------------------------------------ 1. delivery limits
async def test_a_poison_item_reaches_the_dead_letter_queue_after_exactly_max_deliveries_aborts(
        healthy_cluster: LocalCluster, client: RcqClient) -> None:
    cluster = healthy_cluster
    queue, dlq = fresh_queue("poison"), fresh_queue("poison-dlq")
    await client.configure_queue(dlq)
    await client.configure_queue(queue, max_deliveries=3, dead_letter_queue=dlq, max_priority=5)
    await client.enqueue(queue, "poison", priority=4)
    await client.enqueue(queue, "healthy")  # behind it: priority 0

    for attempt in range(3):
        transaction = await client.begin(timeout_s=30)
        items = await transaction.dequeue_items(queue)
        assert values(items) == [b"poison"], f"delivery {attempt + 1}"
        assert items[0].delivery_count == attempt, f"delivery {attempt + 1}: {items[0]}"
        assert items[0].priority == 4 and items[0].dead_letter is None
        if attempt > 0:
            # It came back after `attempt` aborts: not dead yet (entries apply in order, and its
            # delivery was recorded after the abort, so a wrong move would show here).
            assert await count_on_leader(cluster, dlq) == 0, f"dead after only {attempt} abort(s)"
            assert await count_on_leader(cluster, queue) == 2
        await transaction.abort()

    await wait_for_count(cluster, dlq, 1)
    await wait_for_count(cluster, queue, 1)
    dead = await take_all(client, dlq)
    assert values(dead) == [b"poison"]
    assert dead[0].dead_letter == DeadLetter("max_deliveries", queue, 3)
    assert dead[0].delivery_count == 0
    stats = await leader_stats(cluster, queue)
    assert (stats["dead_lettered_total"], stats["dropped_total"], stats["expired_total"]) == (1, 0, 0)
    healthy = await take_all(client, queue)
    assert values(healthy) == [b"healthy"] and healthy[0].delivery_count == 0
    assert dead[0].priority == 4, f"the dead item lost its priority: {dead[0]}"


async def test_transaction_deadlines_count_as_deliveries_and_send_a_poison_item_to_the_dead_letter_queue(
        healthy_cluster: LocalCluster, client: RcqClient) -> None:
    cluster = healthy_cluster
    queue, dlq = fresh_queue("deadline"), fresh_queue("deadline-dlq")
    await client.configure_queue(dlq)
    await client.configure_queue(queue, max_deliveries=2, dead_letter_queue=dlq)
    await client.enqueue(queue, "slow")

    for attempt in range(2):
        transaction = await client.begin(timeout_s=1.0)
        items = await transaction.dequeue_items(queue)
        assert values(items) == [b"slow"] and items[0].delivery_count == attempt, items
        if attempt > 0:
            assert await count_on_leader(cluster, dlq) == 0, "dead after one expired transaction"

        async def expired(tx: Any = transaction) -> bool:
            return (await tx.status())["state"] == "aborted"

        await async_wait_until(expired, QUIET_CLUSTER_WAIT_S, interval_s=0.1, what=f"transaction {attempt + 1} to expire")
        with pytest.raises(TransactionAborted):
            await transaction.commit()

    await wait_for_count(cluster, dlq, 1)
    assert await count_on_leader(cluster, queue) == 0
    dead = await take_all(client, dlq)
    assert values(dead) == [b"slow"]
    assert dead[0].dead_letter == DeadLetter("max_deliveries", queue, 2)


async def test_a_delivery_counted_before_a_leader_crash_sends_the_item_to_the_dead_letter_queue(
        healthy_cluster: LocalCluster, client: RcqClient) -> None:
    cluster = healthy_cluster
    queue, dlq, other = fresh_queue("crash"), fresh_queue("crash-dlq"), fresh_queue("crash-other")
    await client.configure_queue(dlq)
    await client.configure_queue(queue, max_deliveries=2, dead_letter_queue=dlq, max_priority=1)
    await client.enqueue(queue, "poison", priority=1)
    await client.enqueue(queue, *[f"plain-{i}" for i in range(5)])
    await client.enqueue(other, *[f"other-{i}" for i in range(5)])

    first = await peek_items(client, queue)  # delivery 1, aborted
    assert values(first) == [b"poison"] and first[0].delivery_count == 0
    held = await client.begin(timeout_s=120)
    second = await held.dequeue_items(queue)  # delivery 2: the limit, recorded before the answer
    assert values(second) == [b"poison"] and second[0].delivery_count == 1

    old_leader = await leader_index(cluster)
    await asyncio.to_thread(cluster.kill_node, old_leader)
    new_leader = await leader_index(cluster)
    assert new_leader != old_leader

    # The new leader finds the item at its limit, locked by a transaction that died: it dies now.
    await wait_for_count(cluster, dlq, 1)
    await wait_for_count(cluster, queue, 5)
    with pytest.raises(TransactionAborted):
        await held.commit()
    dead = await take_all(client, dlq)
    assert values(dead) == [b"poison"]
    assert dead[0].dead_letter == DeadLetter("max_deliveries", queue, 2)
    # Nothing else was lost or touched.
    assert sorted(values(await take_all(client, queue))) == [f"plain-{i}".encode() for i in range(5)]
    assert sorted(values(await take_all(client, other))) == [f"other-{i}".encode() for i in range(5)]

    await asyncio.to_thread(cluster.start_node, old_leader)
    await asyncio.to_thread(cluster.wait_for_convergence, QUIET_CLUSTER_WAIT_S, range(len(cluster.nodes)))
    assert dead[0].priority == 1, f"the dead item lost its priority: {dead[0]}"


# ------------------------------------------------------------ 4. reject, redrive, drops
async def test_redrive_brings_dead_items_back_with_their_priority_and_a_fresh_count(
        healthy_cluster: LocalCluster, client: RcqClient) -> None:
    cluster = healthy_cluster
    dlq, source_a, source_b = fresh_queue("redrive-dlq"), fresh_queue("redrive-a"), fresh_queue("redrive-b")
    await client.configure_queue(dlq)
    await client.configure_queue(source_a, max_deliveries=1, dead_letter_queue=dlq, max_priority=3)
    await client.configure_queue(source_b, max_deliveries=1, dead_letter_queue=dlq)
    await client.execute([Enqueue(source_a, ["a-high"], priority=3), Enqueue(source_a, ["a-mid"], priority=1),
                          Enqueue(source_a, ["a-low"])])
    await client.enqueue(source_b, "b-1", "b-2", "b-3")
    for queue, count in ((source_a, 3), (source_b, 3)):  # one delivery each, aborted: dead
        for _ in range(count):
            assert len(await peek_items(client, queue)) == 1
    await wait_for_count(cluster, dlq, 6)
    assert await count_on_leader(cluster, source_a) == 0 and await count_on_leader(cluster, source_b) == 0

    # A dead item locked by a transaction is not redriven.
    holder = await client.begin(timeout_s=60)
    locked = await holder.dequeue_items(dlq)
    assert len(locked) == 1 and locked[0].dead_letter is not None
    locked_source = locked[0].dead_letter.source_queue

    answer = await client.redrive(dlq, max_items=1, source_queue=source_b)
    assert (answer["redriven"], answer["by_queue"]) == (1, {source_b: 1})
    assert await count_on_leader(cluster, source_b) == 1
    answer = await client.redrive(dlq, source_queue=source_a)
    expected_a = 3 - (locked_source == source_a)
    assert (answer["redriven"], answer["by_queue"]) == (expected_a, {source_a: expected_a})
    answer = await client.redrive(dlq)
    expected_b = 2 - (locked_source == source_b)
    assert (answer["redriven"], answer["by_queue"]) == (expected_b, {source_b: expected_b})
    assert await count_on_leader(cluster, dlq) == 1  # the locked one
    await holder.abort()
    answer = await client.redrive(dlq)
    assert (answer["redriven"], answer["by_queue"]) == (1, {locked_source: 1})
    assert await count_on_leader(cluster, dlq) == 0
    assert (await leader_stats(cluster, dlq))["redriven_total"] == 6

    # Back at the tail of their sources: priority kept, delivery count 0, no dead-letter record.
    back_a = await take_all(client, source_a)
    back_b = await take_all(client, source_b)
    assert sorted(values(back_a)) == [b"a-high", b"a-low", b"a-mid"]
    assert sorted(values(back_b)) == [b"b-1", b"b-2", b"b-3"]
    for item in back_a + back_b:
        assert item.delivery_count == 0 and item.dead_letter is None, item
    assert [(i.value, i.priority) for i in back_a] == [(b"a-high", 3), (b"a-mid", 1), (b"a-low", 0)], \
        "redriven items lost their priority"


async def test_redriven_items_get_a_whole_new_delivery_budget(healthy_cluster: LocalCluster, client: RcqClient) -> None:
    cluster = healthy_cluster
    dlq, queue = fresh_queue("budget-dlq"), fresh_queue("budget")
    await client.configure_queue(dlq)
    await client.configure_queue(queue, max_deliveries=2, dead_letter_queue=dlq)
    await client.enqueue(queue, "x")
    for _ in range(2):
        await peek_items(client, queue)
    await wait_for_count(cluster, dlq, 1)
    assert (await client.redrive(dlq))["redriven"] == 1
    again = await peek_items(client, queue)  # 1 of 2 again: it must come back once more
    assert values(again) == [b"x"] and again[0].delivery_count == 0
    last = await peek_items(client, queue)
    assert values(last) == [b"x"] and last[0].delivery_count == 1
    await wait_for_count(cluster, dlq, 1)
    dead = await take_all(client, dlq)
    assert dead[0].dead_letter == DeadLetter("max_deliveries", queue, 2)


async def test_reject_sends_items_to_the_dead_letter_queue_at_once_whatever_the_transaction_does(
        healthy_cluster: LocalCluster, client: RcqClient) -> None:
    cluster = healthy_cluster
    dlq, queue = fresh_queue("reject-dlq"), fresh_queue("reject")
    await client.configure_queue(dlq)
    await client.configure_queue(queue, dead_letter_queue=dlq)
    await client.enqueue(queue, "bad-1", "good-1", "bad-2", "good-2")

    # Rejected, then the transaction aborts: the rejected item stays dead, the other returns.
    transaction = await client.begin(timeout_s=30)
    items = await transaction.dequeue_items(queue, 2)
    assert values(items) == [b"bad-1", b"good-1"]
    assert await transaction.reject(queue, [items[0]], reason="malformed") == 1
    assert await count_on_leader(cluster, dlq) == 1  # at once, before the transaction ends
    await transaction.abort()
    assert await count_on_leader(cluster, dlq) == 1
    assert await count_on_leader(cluster, queue) == 3

    # Rejected, then the transaction commits: the rest is consumed, the rejected item is dead.
    transaction = await client.begin(timeout_s=30)
    items = await transaction.dequeue_items(queue, 2)
    assert values(items) == [b"good-1", b"bad-2"]
    assert await transaction.reject(queue, [items[1].item_id]) == 1
    info = await transaction.commit()
    assert info.dequeued == 1
    assert values(await take_all(client, queue)) == [b"good-2"]

    dead = await take_all(client, dlq)
    assert values(dead) == [b"bad-1", b"bad-2"]
    assert [d.dead_letter for d in dead] == [DeadLetter("rejected", queue, 0)] * 2
    stats = await leader_stats(cluster, queue)
    assert (stats["rejected_total"], stats["dead_lettered_total"], stats["dropped_total"]) == (2, 2, 0)


async def test_without_a_dead_letter_queue_rejected_and_dead_items_are_dropped_and_counted(
        healthy_cluster: LocalCluster, client: RcqClient) -> None:
    cluster = healthy_cluster
    queue = fresh_queue("drop")
    await client.configure_queue(queue, max_deliveries=1)
    await client.enqueue(queue, "rejected", "poison", "kept")

    transaction = await client.begin(timeout_s=30)
    items = await transaction.dequeue_items(queue)
    assert values(items) == [b"rejected"]
    assert await transaction.reject(queue, items) == 1
    await transaction.abort()
    assert values(await peek_items(client, queue)) == [b"poison"]  # its one delivery, aborted
    await wait_for_count(cluster, queue, 1)
    stats = await leader_stats(cluster, queue)
    assert (stats["dropped_total"], stats["rejected_total"], stats["dead_lettered_total"]) == (2, 1, 0)
    assert values(await take_all(client, queue)) == [b"kept"]


# ------------------------------------------------------------------- 5. delays
async def test_a_delayed_item_is_invisible_until_its_time_and_visible_soon_after(
        healthy_cluster: LocalCluster, client: RcqClient) -> None:
    cluster = healthy_cluster
    queue = fresh_queue("delay")
    sent = wall_ms()
    await client.enqueue(queue, "later", delay_s=1.5)
    stats = await leader_stats(cluster, queue)
    if wall_ms() < sent + 1200:  # still well before its time (the box may be slow)
        assert (stats["count"], stats["delayed"], stats["ready"]) == (1, 1, 0), stats
        assert await peek_items(client, queue) == []

    seen: list[tuple[float, Item]] = []

    async def visible() -> bool:
        items = await peek_items(client, queue)
        received = wall_ms()
        seen.extend((received, item) for item in items)
        return bool(items)

    await async_wait_until(visible, QUIET_CLUSTER_WAIT_S, interval_s=0.02, what="the delayed item to become visible")
    received, item = seen[0]
    assert item.enqueued_at_ms is not None
    visible_at = item.enqueued_at_ms + 1500
    assert received >= visible_at, f"handed out {visible_at - received:.0f} ms before its time"
    assert received <= visible_at + 2000, f"visible only {received - visible_at:.0f} ms after its time"
    stats = await leader_stats(cluster, queue)
    assert (stats["delayed"], stats["ready"]) == (0, 1), stats


async def test_a_long_poll_dequeue_wakes_when_a_delayed_item_becomes_visible(
        healthy_cluster: LocalCluster, client: RcqClient) -> None:
    queue = fresh_queue("delay-poll")
    await client.enqueue(queue, "wake-me", delay_s=1.0)
    async with client.transaction(timeout_s=30) as transaction:
        items = await transaction.dequeue_items(queue, 1, wait_ms=10_000)
        received = wall_ms()
    assert values(items) == [b"wake-me"]
    assert items[0].enqueued_at_ms is not None
    visible_at = items[0].enqueued_at_ms + 1000
    assert received >= visible_at, f"handed out {visible_at - received:.0f} ms early"
    assert received <= visible_at + 1500, f"the waiting dequeue woke {received - visible_at:.0f} ms late"


async def test_a_new_leader_hands_out_a_delayed_item_neither_before_nor_long_after_its_time(
        healthy_cluster: LocalCluster, client: RcqClient) -> None:
    cluster = healthy_cluster
    queue = fresh_queue("delay-failover")
    await client.enqueue(queue, "after-failover", delay_s=3.0)
    old_leader = await leader_index(cluster)
    await asyncio.to_thread(cluster.kill_node, old_leader)
    new_leader = await leader_index(cluster)
    assert new_leader != old_leader
    serving_at = wall_ms()

    seen: list[tuple[float, float, Item]] = []

    async def handed_out() -> bool:
        sent = wall_ms()
        items = await peek_items(client, queue)
        seen.extend((sent, wall_ms(), item) for item in items)
        return bool(items)

    await async_wait_until(handed_out, QUIET_CLUSTER_WAIT_S, interval_s=0.02, what="the delayed item after the failover")
    _, received, item = seen[0]
    assert item.enqueued_at_ms is not None and item.value == b"after-failover"
    visible_at = item.enqueued_at_ms + 3000
    assert received >= visible_at, f"the new leader handed it out {visible_at - received:.0f} ms early"
    assert received <= max(visible_at, serving_at) + 3000, \
        f"handed out {received - max(visible_at, serving_at):.0f} ms after it could be"
    assert values(await take_all(client, queue)) == [b"after-failover"]


# ---------------------------------------------------------------- 6. priorities
@dataclass(frozen=True)
class Delivery:
    sent: float  # monotonic, when the dequeue left
    received: float  # monotonic, when its answer came
    item: Item


async def test_concurrent_consumers_take_every_item_once_highest_priority_first(
        healthy_cluster: LocalCluster, client: RcqClient) -> None:
    queue = fresh_queue("prio")
    await client.configure_queue(queue, max_priority=2)
    per_priority = 15
    enqueued = {f"p{p}-{n:02d}": p for n in range(per_priority) for p in (0, 1, 2)}
    # One commit, priorities interleaved: id order is not priority order.
    await client.execute([Enqueue(queue, [value], priority=p) for value, p in enqueued.items()])

    deliveries: list[Delivery] = []
    committed: list[bytes] = []

    async def consume() -> None:
        while True:
            transaction = await client.begin(timeout_s=30)
            sent = time.monotonic()
            items = await transaction.dequeue_items(queue, 1)
            received = time.monotonic()
            if not items:
                await transaction.abort()
                return
            deliveries.append(Delivery(sent, received, items[0]))
            await transaction.commit()
            committed.append(items[0].value)

    await asyncio.wait_for(asyncio.gather(*(consume() for _ in range(4))), 2 * CLUSTER_WAIT_S)

    assert sorted(committed) == sorted(v.encode() for v in enqueued), "every item exactly once"
    assert Counter(committed).most_common(1)[0][1] == 1
    for delivery in deliveries:
        assert delivery.item.priority == enqueued[delivery.item.value.decode()], delivery
    # An item whose answer came before another dequeue was sent cannot have a lower priority.
    inversions = [(a.item.value, b.item.value) for a, b in itertools.permutations(deliveries, 2)
                  if a.received < b.sent and a.item.priority < b.item.priority]
    assert not inversions, f"lower priority handed out first: {inversions[:5]}"


async def test_an_aborted_item_returns_to_the_head_of_its_priority(
        healthy_cluster: LocalCluster, client: RcqClient) -> None:
    queue = fresh_queue("prio-abort")
    await client.configure_queue(queue, max_priority=2)
    await client.execute([Enqueue(queue, ["mid-1", "mid-2"], priority=1), Enqueue(queue, ["top"], priority=2),
                          Enqueue(queue, ["low"], priority=0)])
    first = await peek_items(client, queue)
    assert values(first) == [b"top"] and first[0].delivery_count == 0
    again = await peek_items(client, queue)
    assert values(again) == [b"top"] and again[0].delivery_count == 1  # counted in memory by this leader
    assert values(await take_all_n(client, queue, 1)) == [b"top"]
    mid = await peek_items(client, queue)
    assert values(mid) == [b"mid-1"]
    rest = await take_all(client, queue)
    assert [(i.value, i.priority) for i in rest] == [(b"mid-1", 1), (b"mid-2", 1), (b"low", 0)]


async def take_all_n(client: RcqClient, queue: str, count: int) -> list[Item]:
    async with client.transaction(timeout_s=30) as transaction:
        return await transaction.dequeue_items(queue, count)


# ----------------------------------------------------------------------- 7. TTL
async def test_an_item_past_its_ttl_goes_to_the_dead_letter_queue_and_is_never_handed_out_after(
        healthy_cluster: LocalCluster, client: RcqClient) -> None:
    cluster = healthy_cluster
    dlq, queue = fresh_queue("ttl-dlq"), fresh_queue("ttl")
    await client.configure_queue(dlq)
    await client.configure_queue(queue, dead_letter_queue=dlq)
    await client.enqueue(queue, "short", ttl_s=1.5)
    await client.enqueue(queue, "long", ttl_s=600)
    await client.enqueue(queue, "plain")

    late: list[str] = []
    handouts = Counter[bytes]()

    async def expired() -> bool:  # peek at everything until the short one is gone
        sent = wall_ms()
        for item in await peek_items(client, queue, 10):
            handouts[item.value] += 1
            if item.value == b"short":
                assert item.enqueued_at_ms is not None
                if sent >= item.enqueued_at_ms + 1500:
                    late.append(f"sent {sent - item.enqueued_at_ms - 1500:.0f} ms after its expiry")
        return await count_on_leader(cluster, dlq) == 1

    await async_wait_until(expired, QUIET_CLUSTER_WAIT_S, interval_s=0.05, what="the short item to expire")
    assert not late, f"handed out after its expiry: {late}"
    assert handouts[b"short"] > 0  # it was visible before
    dead = await take_all(client, dlq)
    assert values(dead) == [b"short"] and dead[0].dead_letter == DeadLetter("expired", queue, 0)
    assert sorted(values(await peek_items(client, queue, 10))) == [b"long", b"plain"]
    stats = await leader_stats(cluster, queue)
    assert (stats["expired_total"], stats["dead_lettered_total"], stats["count"]) == (1, 1, 2)


async def test_without_a_dead_letter_queue_expired_items_are_dropped_and_counted(
        healthy_cluster: LocalCluster, client: RcqClient) -> None:
    cluster = healthy_cluster
    queue = fresh_queue("ttl-drop")
    await client.configure_queue(queue, default_ttl_s=1.0)
    await client.enqueue(queue, "a", "b", "c")  # the queue's default TTL
    await client.enqueue(queue, "d", ttl_s=600)
    await client.enqueue(other := fresh_queue("ttl-none"), "e")
    await wait_for_count(cluster, queue, 1)
    stats = await leader_stats(cluster, queue)
    assert (stats["expired_total"], stats["dropped_total"], stats["dead_lettered_total"]) == (3, 3, 0)
    [item] = await take_all(client, queue)
    assert item.value == b"d" and item.enqueued_at_ms is not None
    assert item.expires_at_ms == item.enqueued_at_ms + 600_000  # what each item carries: its own expiry
    [plain] = await take_all(client, other)
    assert plain.value == b"e" and plain.expires_at_ms is None  # never expires


async def test_an_item_dequeued_before_its_ttl_is_consumed_by_a_commit_after_it(
        healthy_cluster: LocalCluster, client: RcqClient) -> None:
    cluster = healthy_cluster
    dlq, queue = fresh_queue("ttl-late-dlq"), fresh_queue("ttl-late")
    await client.configure_queue(dlq)
    await client.configure_queue(queue, dead_letter_queue=dlq)
    await client.enqueue(queue, "committed-late", "aborted-late", ttl_s=1.5)
    committing = await client.begin(timeout_s=60)
    aborting = await client.begin(timeout_s=60)
    first = await committing.dequeue_items(queue)
    second = await aborting.dequeue_items(queue)
    assert values(first) == [b"committed-late"] and values(second) == [b"aborted-late"]
    assert first[0].enqueued_at_ms is not None
    expires_at = first[0].enqueued_at_ms + 1500
    assert first[0].expires_at_ms == expires_at and second[0].expires_at_ms == second[0].enqueued_at_ms + 1500
    # Well past the expiry (the leader's timer has looked at least once since): both still held.
    await async_wait_until(lambda: wall_ms() >= expires_at + 1500, QUIET_CLUSTER_WAIT_S, what="the TTL to pass")
    assert await count_on_leader(cluster, dlq) == 0
    info = await committing.commit()
    assert info.dequeued == 1  # delivered in time: consumed
    await aborting.abort()  # given back after its expiry: it expires now instead
    await wait_for_count(cluster, dlq, 1)
    await wait_for_count(cluster, queue, 0)
    dead = await take_all(client, dlq)
    assert values(dead) == [b"aborted-late"] and dead[0].dead_letter == DeadLetter("expired", queue, 0)
    stats = await leader_stats(cluster, queue)
    assert (stats["dequeued_total"], stats["expired_total"]) == (1, 1)


async def test_a_new_leader_expires_items_whose_ttl_passes_after_a_failover(
        healthy_cluster: LocalCluster, client: RcqClient) -> None:
    cluster = healthy_cluster
    dlq, queue = fresh_queue("ttl-failover-dlq"), fresh_queue("ttl-failover")
    await client.configure_queue(dlq)
    await client.configure_queue(queue, dead_letter_queue=dlq)
    await client.enqueue(queue, *[f"short-{i}" for i in range(5)], ttl_s=5.0)
    await client.enqueue(queue, "plain-1", "plain-2")
    enqueued_at = (await peek_items(client, queue))[0].enqueued_at_ms
    assert enqueued_at is not None
    expires_at = enqueued_at + 5000

    old_leader = await leader_index(cluster)
    await asyncio.to_thread(cluster.kill_node, old_leader)
    killed_at = wall_ms()
    assert killed_at < expires_at, "the kill came after the TTL: the box is too slow for this test"
    new_leader = await leader_index(cluster)
    assert new_leader != old_leader

    late: list[str] = []

    async def all_expired() -> bool:
        sent = wall_ms()
        for item in await peek_items(client, queue, 10):
            if item.value.startswith(b"short-") and sent >= expires_at:
                late.append(f"{item.value.decode()} sent {sent - expires_at:.0f} ms after its expiry")
        return await count_on_leader(cluster, dlq) == 5

    await async_wait_until(all_expired, QUIET_CLUSTER_WAIT_S, interval_s=0.05, what="the new leader to expire the items")
    assert not late, f"the new leader handed out expired items: {late}"
    dead = await take_all(client, dlq)
    assert sorted(values(dead)) == [f"short-{i}".encode() for i in range(5)]
    assert {d.dead_letter for d in dead} == {DeadLetter("expired", queue, 0)}
    assert sorted(values(await take_all(client, queue))) == [b"plain-1", b"plain-2"]
    await asyncio.to_thread(cluster.start_node, old_leader)
    await asyncio.to_thread(cluster.wait_for_convergence, QUIET_CLUSTER_WAIT_S, range(len(cluster.nodes)))


# -------------------------------------------------------------- 8. bad settings
@pytest.fixture
def quiet_cluster() -> Iterator[LocalCluster]:
    """A cluster of this test's own: nothing else proposes entries while it compares digests."""
    with running_cluster() as local_cluster:
        yield local_cluster


async def test_bad_settings_and_options_are_clear_400s_that_change_nothing(quiet_cluster: LocalCluster) -> None:
    cluster = quiet_cluster
    async with RcqClient(cluster.urls, **cluster.client_options()) as client, \
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=15), headers=cluster.auth_headers()) as http:
        source, dlq, dlq2, plain = "src", "dlq", "dlq2", "plain"
        await client.configure_queue(dlq2)
        await client.configure_queue(dlq, dead_letter_queue=dlq2)
        await client.configure_queue(source, max_deliveries=3, dead_letter_queue=dlq, max_priority=2)
        await client.enqueue(plain, "x")
        await client.enqueue(source, "y", priority=2)
        leader = await leader_index(cluster)
        base = cluster.url(leader)
        await asyncio.to_thread(cluster.wait_for_convergence, QUIET_CLUSTER_WAIT_S)
        before = await asyncio.to_thread(cluster.digest, leader)
        settings_before = (await client.queue_info(source))["settings"]

        async def call(method: str, path: str, body: Any) -> tuple[int, dict[str, Any]]:
            async with http.request(method, base + path, json=body, allow_redirects=False) as response:
                return response.status, await response.json()

        bad_settings: list[tuple[str, dict[str, Any]]] = [
            (source, {"max_deliveries": -1}), (source, {"max_deliveries": 0}), (source, {"max_deliveries": 1001}),
            (source, {"max_deliveries": 3, "default_ttl_s": 0}), (source, {"default_ttl_s": -1}),
            (source, {"default_ttl_s": 366 * 86400}),
            (source, {"default_delay_s": -0.5}), (source, {"default_delay_s": 8 * 86400}),
            (source, {"max_priority": -1}), (source, {"max_priority": 256}),
            (source, {"dead_letter_queue": "no-such-queue"}),  # unknown
            (source, {"dead_letter_queue": source}),  # itself
            (dlq2, {"dead_letter_queue": source}),  # dlq2 -> src -> dlq -> dlq2: a cycle
            (dlq2, {"dead_letter_queue": dlq}),  # dlq2 -> dlq -> dlq2
            ("brand-new", {"max_deliveries": 0}),  # a refused configure creates no queue
            ("brand-new", {"dead_letter_queue": "brand-new"}),
        ]
        problems: list[str] = []
        for queue, body in bad_settings:
            status, answer = await call("PUT", f"/v1/queues/{queue}", body)
            if status != 400 or answer.get("error", {}).get("code") != "invalid_request":
                problems.append(f"PUT {queue} {body}: {status} {answer}")
        bad_enqueues: list[tuple[str, dict[str, Any]]] = [
            (source, {"priority": 3}),  # over max_priority 2
            (plain, {"priority": 1}),  # a queue without max_priority takes none
            (source, {"priority": 256}), (source, {"priority": -1}),
            (source, {"delay_s": -1}), (source, {"delay_s": 7 * 86400 + 1}),
            (source, {"ttl_s": 0}), (source, {"ttl_s": -3}), (source, {"ttl_s": 365 * 86400 + 1}),
        ]
        for queue, options in bad_enqueues:
            status, answer = await call("POST", f"/v1/queues/{queue}/enqueue", {"items": ["z"], **options})
            if status != 400 or answer.get("error", {}).get("code") != "invalid_request":
                problems.append(f"enqueue to {queue} {options}: {status} {answer}")
            status, answer = await call("POST", "/v1/execute", {
                "operations": [{"op": "enqueue", "queue": queue, "items": ["z"], **options}]})
            if status != 400 or answer.get("error", {}).get("code") != "invalid_request":
                problems.append(f"execute enqueue to {queue} {options}: {status} {answer}")
        status, answer = await call("POST", f"/v1/queues/{source}/enqueue", {"items": ["z"], "priority": 3})
        message = answer["error"]["message"]  # names the CLI's flag beside the route, and reads as English
        assert f"rcq queue configure {source} --max-priority" in message and "'s max" not in message, message
        # Through the client and a transaction as well.
        with pytest.raises(InvalidRequest):
            await client.configure_queue(source, dead_letter_queue="no-such-queue")
        with pytest.raises(InvalidRequest):
            await client.enqueue(source, "z", priority=3)
        transaction = await client.begin(timeout_s=30)
        with pytest.raises(InvalidRequest):
            await transaction.enqueue(source, "z", priority=3)
        await transaction.abort()
        # A dead-letter queue in use cannot be deleted.
        status, answer = await call("DELETE", f"/v1/queues/{dlq}", None)
        if status != 409 or answer.get("error", {}).get("code") != "queue_in_use":
            problems.append(f"DELETE {dlq} (in use): {status} {answer}")
        with pytest.raises(QueueInUse):
            await client.delete_queue(dlq2)

        after = await asyncio.to_thread(cluster.digest, leader)
        assert not problems, "\n".join(problems)
        assert after == before, "a refused request changed the replicated state"
        assert (await client.queue_info(source))["settings"] == settings_before
        assert (await client.queue_info("brand-new"))["exists"] is False

        # Once no queue names it, the dead-letter queue can go.
        await client.configure_queue(source, max_deliveries=3, max_priority=2)
        assert await client.delete_queue(dlq) == 0
        assert (await client.queue_info(dlq))["exists"] is False


# ------------------------------------------------------------------ 9. clock skew
SKEWED = 0  # the node whose clock is skewed: it has the short election timeouts
# The other nodes time out much later than the skewed one (0.8..1.6 s): when a leader dies, the
# skewed node always stands first, and wins as soon as its log is up to date.
SLOW_ELECTIONS = {"raft_timeout_min_s": 3.0, "raft_timeout_max_s": 3.5, "connection_timeout_s": 3.5}


def configure_node(cluster: LocalCluster, index: int, extra: dict[str, Any]) -> None:
    path = cluster.nodes[index].config_path
    config = json.loads(path.read_text())
    config.update(extra)
    write_private(path, json.dumps(config, indent=2) + "\n")


@pytest.fixture
def skew_cluster(request: pytest.FixtureRequest) -> Iterator[LocalCluster]:
    """Three nodes, none started: node SKEWED with ``test_clock_offset_ms`` = ``request.param``
    and normal election timeouts, the others with slow ones. The test starts them."""
    local_cluster = LocalCluster(nodes=3)
    with contextlib.closing(local_cluster):
        configure_node(local_cluster, SKEWED, {"test_clock_offset_ms": request.param})
        for i in range(len(local_cluster.nodes)):
            if i != SKEWED:
                configure_node(local_cluster, i, SLOW_ELECTIONS)
        yield local_cluster


async def start_without_the_skewed_node(cluster: LocalCluster) -> int:
    """Start the nodes with correct clocks only; returns the leader they elect."""
    for i in range(len(cluster.nodes)):
        if i != SKEWED:
            await asyncio.to_thread(cluster.start_node, i)
    leader = await leader_index(cluster)
    assert leader != SKEWED
    return leader


async def hand_leadership_to_the_skewed_node(cluster: LocalCluster) -> None:
    """Start the skewed node, let it catch up, kill -9 the leader: the skewed node leads (it stands
    first, its log is up to date). If it won an election while it joined, it leads already."""
    await asyncio.to_thread(cluster.start_node, SKEWED)
    await asyncio.to_thread(cluster.wait_for_applied, QUIET_CLUSTER_WAIT_S)
    await asyncio.to_thread(cluster.wait_for_convergence, QUIET_CLUSTER_WAIT_S)
    old_leader = await leader_index(cluster)
    if old_leader != SKEWED:
        await asyncio.to_thread(cluster.kill_node, old_leader)
    assert await leader_index(cluster) == SKEWED


@pytest.mark.parametrize("skew_cluster", [-HOUR_MS], indirect=True)
async def test_a_leader_an_hour_behind_neither_hides_visible_items_nor_brings_back_expired_ones(
        skew_cluster: LocalCluster) -> None:
    cluster = skew_cluster
    await start_without_the_skewed_node(cluster)
    async with RcqClient(cluster.urls, request_timeout_s=10.0, retry_timeout_s=QUIET_CLUSTER_WAIT_S,
                         **cluster.client_options()) as client:
        dlq, queue = "behind-dlq", "behind"
        await client.configure_queue(dlq)
        await client.configure_queue(queue, dead_letter_queue=dlq)
        await client.enqueue(queue, "first")
        await client.enqueue(queue, "expiring", ttl_s=1.0)
        await client.enqueue(queue, "delayed", delay_s=1.5)
        # Under the correct leader: the TTL passes (a replicated expiry), the delay ends (no entry).
        await wait_for_count(cluster, dlq, 1)

        async def delayed_visible() -> bool:
            stats = await leader_stats(cluster, queue)
            return (stats["ready"], stats["delayed"]) == (2, 0)

        await async_wait_until(delayed_visible, QUIET_CLUSTER_WAIT_S, interval_s=0.05, what="the delay to end")
        before = {item.value: item for item in await peek_items(client, queue, 10)}
        assert set(before) == {b"first", b"delayed"}
        latest_ms = max(item.enqueued_at_ms or 0 for item in before.values())

        await hand_leadership_to_the_skewed_node(cluster)
        await client.wait_for_leader(LEADER_TIMEOUT_S)
        problems: list[str] = []

        # The expired item does not come back.
        if await count_on_leader(cluster, dlq) != 1:
            problems.append("the dead-letter queue lost the expired item")
        # The item that had become visible stays visible (not hidden for an hour).
        seen: list[bytes] = []

        async def both_visible() -> bool:
            seen[:] = sorted(values(await peek_items(client, queue, 10)))
            return seen == [b"delayed", b"first"]

        try:
            await async_wait_until(both_visible, QUIET_CLUSTER_WAIT_S, interval_s=0.1, what="both items visible")
        except TimeoutError:
            stats = await leader_stats(cluster, queue)
            problems.append(f"under the leader an hour behind, the queue shows {seen} "
                            f"(ready {stats['ready']}, delayed {stats['delayed']}): the item whose delay "
                            "had ended is hidden again")
        if b"expiring" in seen:
            problems.append("the expired item was handed out again")
        # Enqueue times never go back.
        await client.enqueue(queue, "under-skewed")
        items = await take_all(client, queue)
        later = [i for i in items if i.value == b"under-skewed"]
        assert len(later) == 1 and later[0].enqueued_at_ms is not None
        if later[0].enqueued_at_ms < latest_ms:
            problems.append(f"enqueue time went back {latest_ms - later[0].enqueued_at_ms} ms")
        dead = await take_all(client, dlq)
        if [(d.value, d.dead_letter) for d in dead] != [(b"expiring", DeadLetter("expired", queue, 0))]:
            problems.append(f"dead-letter queue holds {dead}")
        assert not problems, "\n".join(problems)


@pytest.mark.parametrize("skew_cluster", [HOUR_MS], indirect=True)
async def test_a_leader_an_hour_ahead_expires_ttls_early_by_its_skew_and_time_never_goes_back(
        skew_cluster: LocalCluster) -> None:
    cluster = skew_cluster
    await start_without_the_skewed_node(cluster)
    async with RcqClient(cluster.urls, request_timeout_s=10.0, retry_timeout_s=QUIET_CLUSTER_WAIT_S,
                         **cluster.client_options()) as client:
        dlq, queue = "ahead-dlq", "ahead"
        await client.configure_queue(dlq)
        await client.configure_queue(queue, dead_letter_queue=dlq)
        await client.enqueue(queue, "ttl-30min", ttl_s=1800)
        await client.enqueue(queue, "ttl-2h", ttl_s=7200)
        await client.enqueue(queue, "plain")
        before = await peek_items(client, queue)
        assert before[0].enqueued_at_ms is not None
        correct_ms = before[0].enqueued_at_ms

        await hand_leadership_to_the_skewed_node(cluster)
        await client.wait_for_leader(LEADER_TIMEOUT_S)
        # The documented limit: its clock is an hour ahead, so a 30 min TTL is over at once...
        await wait_for_count(cluster, dlq, 1, timeout_s=QUIET_CLUSTER_WAIT_S)
        dead = await peek_items(client, dlq)
        assert [(d.value, d.dead_letter) for d in dead] == [(b"ttl-30min", DeadLetter("expired", queue, 0))]
        # ...but a 2 h TTL is not lost: it still has about an hour by that clock.
        assert sorted(values(await peek_items(client, queue, 10))) == [b"plain", b"ttl-2h"]
        await client.enqueue(queue, "under-ahead")
        ahead = [i for i in await peek_items(client, queue, 10) if i.value == b"under-ahead"]
        assert ahead and ahead[0].enqueued_at_ms is not None
        ahead_ms = ahead[0].enqueued_at_ms
        assert ahead_ms >= correct_ms + HOUR_MS - 60_000, "the entry time is the leader's (skewed) clock"

        # Back to a correct clock: time in the state machine does not go back.
        await asyncio.to_thread(cluster.kill_node, SKEWED)
        for i in range(len(cluster.nodes)):
            if i != SKEWED and not cluster.nodes[i].running():
                await asyncio.to_thread(cluster.start_node, i)
        assert await leader_index(cluster) != SKEWED
        await client.wait_for_leader(LEADER_TIMEOUT_S)
        await client.enqueue(queue, "after")
        items = {i.value: i for i in await take_all(client, queue)}
        assert set(items) == {b"plain", b"ttl-2h", b"under-ahead", b"after"}
        after_ms = items[b"after"].enqueued_at_ms
        assert after_ms is not None and after_ms >= ahead_ms, \
            f"enqueue time went back {ahead_ms - (after_ms or 0)} ms"
        assert await count_on_leader(cluster, dlq) == 1
        # ...nor does it stand still until the wall clock catches up: a 1 s delay under the
        # correct leader still ends about 1 s later (its clock carries on from the skewed time).
        await client.enqueue(queue, "delayed-after", delay_s=1.0)
        started = time.monotonic()
        tx = await client.begin()
        got = await tx.dequeue_items(queue, 1, wait_ms=10_000)
        await tx.commit()
        assert values(got) == [b"delayed-after"] and time.monotonic() - started < 5.0
