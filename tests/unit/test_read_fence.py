"""The leader's read fence (docs/raft-hazards.md, H22): no item is handed out before an entry
proposed after it was taken has committed in this term.

A leader stopped (SIGSTOP) or whose Raft thread hung on its disk still has its queue views when it
runs again; without the fence it handed out, from them, items a newer leader had seen consumed
(chaos seed 39102). Over the in-memory replicator: an entry that does not commit stands for the
newer leader's fencing.
"""

from __future__ import annotations

import asyncio

import pytest

from rcq.errors import LeaderChanged, TransactionAborted, TransactionBusy
from rcq.server.core.commands import CommitBatch, ItemsAction, QueueSettings
from rcq.server.leader.session import DequeueStep
from rcq.server.leader.transactions import TransactionManager
from rcq.testing import InMemoryReplicator, async_wait_until
from tests.helpers import LOCAL_WAIT_S, NODE_SERVING_TIMEOUT_S
from tests.helpers.nodes import drain, enqueue_committed, make_config


@pytest.fixture
async def setup():
    replicator = InMemoryReplicator()
    manager = TransactionManager(make_config(commit_timeout_s=0.5), replicator, leader_url=lambda: None)
    await manager.start()
    await async_wait_until(lambda: manager.serving, NODE_SERVING_TIMEOUT_S, what="serving")
    yield manager, replicator
    await manager.stop()


def batches_since(replicator: InMemoryReplicator, start: int) -> list[CommitBatch]:
    return [c for c in replicator.submitted[start:] if isinstance(c, CommitBatch)]


async def test_a_dequeue_answers_after_an_empty_entry_proposed_after_its_take_commits(setup):
    manager, replicator = setup
    await enqueue_committed(manager, "q", b"a")
    tx = manager.begin()
    start = len(replicator.submitted)
    items = await manager.dequeue(tx.transaction_id, "q")
    assert [i.value for i in items] == [b"a"]
    assert [b.units for b in batches_since(replicator, start)] == [()]  # the fence: an empty entry


async def test_a_dequeue_whose_fence_entry_does_not_commit_hands_nothing_out(setup):
    manager, replicator = setup
    await enqueue_committed(manager, "q", b"a", b"b")
    tx = manager.begin()
    replicator.lose_next_submits = 1  # the fence entry: never appended (a deposed leader's)
    with pytest.raises(LeaderChanged):
        await manager.dequeue(tx.transaction_id, "q", max_items=2)
    with pytest.raises(TransactionAborted):  # aborted: what it held went back
        await manager.dequeue(tx.transaction_id, "q")
    assert sorted(await drain(manager, "q")) == [b"a", b"b"]


async def test_a_leader_deposed_while_its_fence_is_on_the_way_hands_nothing_out(setup):
    manager, replicator = setup
    await enqueue_committed(manager, "q", b"a")
    tx = manager.begin()
    replicator.hold_submits = True  # the fence entry on its way, not yet committed
    dequeue = asyncio.create_task(manager.dequeue(tx.transaction_id, "q"))
    await async_wait_until(lambda: replicator.submitted and isinstance(replicator.submitted[-1], CommitBatch)
                           and replicator.submitted[-1].units == (), LOCAL_WAIT_S, what="the fence proposed")
    replicator.depose()  # a newer leader: the entry will never commit in this term
    with pytest.raises(TransactionAborted):
        await dequeue
    assert not manager.serving


async def test_a_dequeue_rides_on_a_commit_proposed_after_its_take(setup):
    manager, replicator = setup
    await enqueue_committed(manager, "q", b"a")
    writer, reader = manager.begin(), manager.begin()
    manager.enqueue(writer.transaction_id, "other", [b"x"])
    start = len(replicator.submitted)
    dequeued, _ = await asyncio.gather(manager.dequeue(reader.transaction_id, "q"),
                                       manager.commit(writer.transaction_id))
    assert [i.value for i in dequeued] == [b"a"]
    assert [len(b.units) for b in batches_since(replicator, start)] == [1]  # one entry: the commit's


async def test_an_empty_dequeue_and_an_execute_propose_no_fence(setup):
    manager, replicator = setup
    tx = manager.begin()
    start = len(replicator.submitted)
    assert await manager.dequeue(tx.transaction_id, "empty") == []
    assert batches_since(replicator, start) == []
    await enqueue_committed(manager, "q", b"a")
    start = len(replicator.submitted)
    executed = await manager.execute([DequeueStep("q", 1, 0)])
    assert [i.value for i in executed.steps[0]] == [b"a"]
    assert [len(b.units) for b in batches_since(replicator, start)] == [1]  # its commit only


async def test_on_a_queue_with_max_deliveries_the_delivery_entry_is_the_fence(setup):
    manager, replicator = setup
    await manager.change_queue("limited", "configure", settings=QueueSettings(max_deliveries=3))
    await enqueue_committed(manager, "limited", b"a")
    tx = manager.begin()
    start = len(replicator.submitted)
    assert [i.value for i in await manager.dequeue(tx.transaction_id, "limited")] == [b"a"]
    units = [b.units for b in batches_since(replicator, start)]
    assert len(units) == 1 and isinstance(units[0][0], ItemsAction)


async def test_a_commit_while_the_fence_is_on_the_way_is_refused(setup):
    manager, replicator = setup
    await enqueue_committed(manager, "q", b"a")
    tx = manager.begin()
    replicator.hold_submits = True
    dequeue = asyncio.create_task(manager.dequeue(tx.transaction_id, "q"))
    await async_wait_until(lambda: manager._leader.sessions[tx.transaction_id].deliveries_running == 1,
                           LOCAL_WAIT_S, what="the fence on its way")
    with pytest.raises(TransactionBusy):
        await manager.commit(tx.transaction_id)
    replicator.hold_submits = False
    with pytest.raises(LeaderChanged):  # the held entry's outcome is unknown: no fence, nothing out
        await dequeue
