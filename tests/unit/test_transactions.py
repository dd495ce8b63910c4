"""TransactionManager over the in-memory replicator: the session semantics of docs/design.md §1."""

from __future__ import annotations

import asyncio

import pytest

from rcq.errors import (
    CommitConflict,
    CommitOutcomeUnknown,
    InvalidQueueName,
    LeaderChanged,
    NoLeader,
    NotReady,
    PayloadTooLarge,
    TooManyTransactions,
    TransactionBusy,
    TransactionCommitted,
    TransactionExpired,
    TransactionNotFound,
)
from rcq.server.leader.answers import ClosedTransactions
from rcq.server.leader.transactions import TransactionManager
from rcq.testing import InMemoryReplicator, async_wait_until
from tests.helpers import LOCAL_WAIT_S, NODE_SERVING_TIMEOUT_S
from tests.helpers.nodes import drain, enqueue_committed, make_config, skip_loop_time


@pytest.fixture
async def setup():
    replicator = InMemoryReplicator()
    manager = TransactionManager(make_config(), replicator, leader_url=lambda: None)
    await manager.start()
    await async_wait_until(lambda: manager.serving, NODE_SERVING_TIMEOUT_S, what="serving")
    yield manager, replicator
    await manager.stop()


async def test_a_new_leader_serves_only_after_its_barrier_is_applied():
    replicator = InMemoryReplicator()
    replicator.hold_submits = True
    manager = TransactionManager(make_config(commit_timeout_s=0.2), replicator, leader_url=lambda: None)
    await manager.start()
    with pytest.raises(NotReady):
        manager.begin()
    replicator.hold_submits = False
    await async_wait_until(lambda: manager.serving, NODE_SERVING_TIMEOUT_S, what="serving after barrier")
    manager.begin()
    await manager.stop()


async def test_committed_enqueues_are_dequeued_in_commit_order(setup):
    manager, _ = setup
    await enqueue_committed(manager, "q", b"a", b"b")
    await enqueue_committed(manager, "q", b"c")
    assert await drain(manager, "q") == [b"a", b"b", b"c"]


async def test_enqueue_is_invisible_to_a_dequeue_in_the_same_transaction(setup):
    manager, _ = setup
    tx = manager.begin()
    manager.enqueue(tx.transaction_id, "q", [b"mine"])
    assert await manager.dequeue(tx.transaction_id, "q") == []
    await manager.commit(tx.transaction_id)
    assert await drain(manager, "q") == [b"mine"]


async def test_dequeue_dequeue_abort_puts_both_back_at_the_head(setup):
    manager, replicator = setup
    await enqueue_committed(manager, "q", b"1", b"2", b"3")
    tx = manager.begin()
    first = await manager.dequeue(tx.transaction_id, "q")
    second = await manager.dequeue(tx.transaction_id, "q")
    assert [first[0].value, second[0].value] == [b"1", b"2"]
    assert replicator.state_machine.count("q") == 3  # still replicated until commit
    assert manager.abort(tx.transaction_id) == 2
    assert sorted((await drain(manager, "q"))[:2]) == [b"1", b"2"]


async def test_parallel_dequeuers_never_receive_the_same_item(setup):
    manager, _ = setup
    await enqueue_committed(manager, "q", *[str(i).encode() for i in range(50)])
    transactions = [manager.begin() for _ in range(10)]
    results = await asyncio.gather(*(manager.dequeue(t.transaction_id, "q", max_items=7) for t in transactions))
    ids = [item.item_id for items in results for item in items]
    assert len(ids) == len(set(ids)) == 50


async def test_a_dequeued_item_is_invisible_to_other_transactions_until_abort(setup):
    manager, _ = setup
    await enqueue_committed(manager, "q", b"only")
    holder, other = manager.begin(), manager.begin()
    assert len(await manager.dequeue(holder.transaction_id, "q")) == 1
    assert await manager.dequeue(other.transaction_id, "q") == []
    manager.abort(holder.transaction_id)
    assert [i.value for i in await manager.dequeue(other.transaction_id, "q")] == [b"only"]


async def test_a_waiting_dequeue_wakes_when_a_commit_adds_an_item(setup):
    manager, _ = setup
    consumer = manager.begin()
    waiting = asyncio.ensure_future(manager.dequeue(consumer.transaction_id, "q", wait_ms=5000))
    await asyncio.sleep(0)
    await enqueue_committed(manager, "q", b"late")
    items = await asyncio.wait_for(waiting, LOCAL_WAIT_S)
    assert [i.value for i in items] == [b"late"]


async def test_a_waiting_dequeue_gives_up_after_wait_ms(setup):
    manager, _ = setup
    tx = manager.begin()
    assert await manager.dequeue(tx.transaction_id, "q", wait_ms=50) == []


async def test_an_expired_transaction_returns_its_items(setup):
    manager, _ = setup
    await enqueue_committed(manager, "q", b"x")
    tx = manager.begin(timeout_s=0.1)
    assert len(await manager.dequeue(tx.transaction_id, "q")) == 1
    await async_wait_until(lambda: manager.open_count == 0, LOCAL_WAIT_S, what="expiry")
    with pytest.raises(TransactionExpired):
        await manager.commit(tx.transaction_id)
    assert await drain(manager, "q") == [b"x"]


async def test_extend_pushes_the_deadline(setup):
    manager, _ = setup
    tx = manager.begin(timeout_s=0.2)
    manager.extend(tx.transaction_id, 30)
    witness = manager.begin(timeout_s=0.2)  # not extended: its deadline comes at or after tx's first one
    skip_loop_time(0.4)
    await async_wait_until(lambda: manager.open_count == 1, LOCAL_WAIT_S, what="the witness to expire")
    with pytest.raises(TransactionExpired):
        await manager.commit(witness.transaction_id)
    assert manager.describe(tx.transaction_id)["state"] == "open"


async def test_a_move_between_queues_is_one_atomic_commit(setup):
    manager, replicator = setup
    await enqueue_committed(manager, "a", b"v")
    tx = manager.begin()
    [item] = await manager.dequeue(tx.transaction_id, "a")
    manager.enqueue(tx.transaction_id, "b", [item.value])
    await manager.commit(tx.transaction_id)
    assert (replicator.state_machine.count("a"), replicator.state_machine.count("b")) == (0, 1)


async def test_a_retried_commit_answers_duplicate_and_applies_nothing(setup):
    manager, replicator = setup
    tx = manager.begin()
    manager.enqueue(tx.transaction_id, "q", [b"once"])
    first = await manager.commit(tx.transaction_id)
    again = await manager.commit(tx.transaction_id)
    assert (first.duplicate, again.duplicate, again.index) == (False, True, first.index)
    assert replicator.state_machine.count("q") == 1


async def test_an_idempotency_key_makes_a_replayed_commit_a_duplicate(setup):
    manager, replicator = setup
    await enqueue_committed(manager, "src", b"s")
    for attempt in range(2):
        tx = manager.begin()
        manager.enqueue(tx.transaction_id, "q", [b"batch"])
        taken = await manager.dequeue(tx.transaction_id, "src")
        result = await manager.commit(tx.transaction_id, idempotency_key="job-1")
        assert result.duplicate is (attempt == 1)
        assert len(taken) == (1 if attempt == 0 else 0)
    assert replicator.state_machine.count("q") == 1


async def test_a_duplicate_commit_gives_its_dequeued_items_back(setup):
    manager, _ = setup
    await enqueue_committed(manager, "q", b"1", b"2")
    first = manager.begin()
    await manager.dequeue(first.transaction_id, "q")
    await manager.commit(first.transaction_id, idempotency_key="k")
    second = manager.begin()
    assert len(await manager.dequeue(second.transaction_id, "q")) == 1
    assert (await manager.commit(second.transaction_id, idempotency_key="k")).duplicate
    assert await drain(manager, "q") == [b"2"]


async def test_commit_many_applies_all_transactions_or_none(setup):
    manager, replicator = setup
    a, b = manager.begin(), manager.begin()
    manager.enqueue(a.transaction_id, "q", [b"a"])
    manager.enqueue(b.transaction_id, "q", [b"b"])
    result = await manager.commit_many([a.transaction_id, b.transaction_id], idempotency_key="sink:1")
    assert result.index > 0 and replicator.state_machine.count("q") == 2
    c = manager.begin()
    manager.enqueue(c.transaction_id, "q", [b"c"])
    again = await manager.commit_many([c.transaction_id], idempotency_key="sink:1")
    assert again.duplicate and replicator.state_machine.count("q") == 2


async def test_a_repeated_dequeue_key_returns_the_same_items(setup):
    manager, _ = setup
    await enqueue_committed(manager, "q", *[bytes([i]) for i in range(10)])
    tx = manager.begin()
    first = await manager.dequeue(tx.transaction_id, "q", max_items=3, key="p0")
    again = await manager.dequeue(tx.transaction_id, "q", max_items=3, key="p0")
    other = await manager.dequeue(tx.transaction_id, "q", max_items=3, key="p1")
    assert first == again and {i.item_id for i in other}.isdisjoint({i.item_id for i in first})


async def test_losing_leadership_aborts_open_transactions_and_frees_their_items(setup):
    manager, replicator = setup
    await enqueue_committed(manager, "q", b"x")
    tx = manager.begin()
    await manager.dequeue(tx.transaction_id, "q")
    replicator.depose()
    with pytest.raises(NoLeader):
        manager.begin()
    replicator.elect()
    await async_wait_until(lambda: manager.serving, NODE_SERVING_TIMEOUT_S, what="serving again")
    with pytest.raises(LeaderChanged):
        await manager.commit(tx.transaction_id)
    assert manager.describe(tx.transaction_id)["state"] == "aborted"
    assert await drain(manager, "q") == [b"x"]


async def test_a_transaction_of_an_earlier_term_is_reported_aborted_by_a_new_leader(setup):
    manager, replicator = setup
    tx = manager.begin()
    manager.enqueue(tx.transaction_id, "q", [b"x"])
    replicator.depose()
    replicator.elect()
    await async_wait_until(lambda: manager.serving, NODE_SERVING_TIMEOUT_S, what="serving again")
    manager._leader.closed = ClosedTransactions(remembered_max=10)  # a different node never saw it
    with pytest.raises(LeaderChanged):
        await manager.commit(tx.transaction_id)


async def test_a_commit_whose_outcome_is_unknown_says_so_and_keeps_its_locks(setup):
    manager, replicator = setup
    manager._committer._timeout_s = 0.1
    await enqueue_committed(manager, "q", b"x")
    tx = manager.begin()
    await manager.dequeue(tx.transaction_id, "q")
    replicator.hold_submits = True
    with pytest.raises(CommitOutcomeUnknown):
        await manager.commit(tx.transaction_id)
    replicator.hold_submits = False
    other = manager.begin()
    assert await manager.dequeue(other.transaction_id, "q") == []


async def test_a_commit_of_items_another_leader_removed_is_rejected_whole(setup):
    manager, replicator = setup
    await enqueue_committed(manager, "q", b"x", b"y")
    tx = manager.begin()
    items = await manager.dequeue(tx.transaction_id, "q", max_items=2)
    manager.enqueue(tx.transaction_id, "out", [b"z"])
    # Another transaction's entry removes one of the items behind this leader's back.
    from rcq.server.core.commands import CommitBatch, CommitUnit, TransactionWrite, encode
    replicator.apply_raw(encode(CommitBatch(term=1, now_ms=1, units=(CommitUnit((TransactionWrite(
        "1.aaaaaaaaaaaaaaaaaaaaaaaa", dequeues=(("q", (items[0].item_id,)),)),)),))))
    with pytest.raises(CommitConflict):
        await manager.commit(tx.transaction_id)
    assert replicator.state_machine.count("out") == 0
    assert await drain(manager, "q") == [b"y"]


async def test_committing_transaction_rejects_new_operations(setup):
    manager, _ = setup
    tx = manager.begin()
    manager.enqueue(tx.transaction_id, "q", [b"x"])
    commit = asyncio.ensure_future(manager.commit(tx.transaction_id))
    await asyncio.sleep(0)
    with pytest.raises(TransactionBusy):
        manager.enqueue(tx.transaction_id, "q", [b"y"])
    await commit
    with pytest.raises(TransactionCommitted):
        manager.enqueue(tx.transaction_id, "q", [b"y"])


async def test_back_pressure_refuses_transactions_over_the_limit():
    replicator = InMemoryReplicator()
    manager = TransactionManager(make_config(transactions_open_max=2), replicator, leader_url=lambda: None)
    await manager.start()
    await async_wait_until(lambda: manager.serving, NODE_SERVING_TIMEOUT_S, what="serving")
    manager.begin()
    manager.begin()
    with pytest.raises(TooManyTransactions):
        manager.begin()
    await manager.stop()


async def test_bad_input_is_refused_and_changes_nothing(setup):
    manager, replicator = setup
    tx = manager.begin()
    with pytest.raises(InvalidQueueName):
        manager.enqueue(tx.transaction_id, "bad name!", [b"x"])
    with pytest.raises(PayloadTooLarge):
        manager.enqueue(tx.transaction_id, "q", [b"x" * (9 << 20)])
    with pytest.raises(TransactionNotFound):
        manager.enqueue("1.000000000000000000000000", "q", [b"x"])
    await manager.commit(tx.transaction_id)
    assert replicator.state_machine.queue_names() == []


async def test_a_repeated_enqueue_key_buffers_nothing_more(setup):
    manager, replicator = setup
    tx = manager.begin()
    assert manager.enqueue(tx.transaction_id, "q", [b"a", b"b"], key="e1") == 2
    assert manager.enqueue(tx.transaction_id, "q", [b"a", b"b"], key="e1") == 2
    assert manager.enqueue(tx.transaction_id, "q", [b"c"], key="e2") == 3
    await manager.commit(tx.transaction_id)
    assert replicator.state_machine.count("q") == 3


async def test_a_fenced_entry_of_a_deposed_leader_does_not_free_items_this_leader_locked(setup):
    manager, replicator = setup
    await enqueue_committed(manager, "q", b"x")
    replicator.depose()
    replicator.elect()
    await async_wait_until(lambda: manager.serving, NODE_SERVING_TIMEOUT_S, what="serving in the new term")
    holder = manager.begin()
    [item] = await manager.dequeue(holder.transaction_id, "q")
    # The old leader's commit of the same item reaches the log after the new barrier: fenced.
    from rcq.server.core.commands import CommitBatch, CommitUnit, TransactionWrite, encode
    result = replicator.apply_raw(encode(CommitBatch(term=1, now_ms=1, units=(CommitUnit((TransactionWrite(
        "1.bbbbbbbbbbbbbbbbbbbbbbbb", dequeues=(("q", (item.item_id,)),)),)),))))
    assert result.outcomes[0].reason == "stale_leader"
    other = manager.begin()
    assert await manager.dequeue(other.transaction_id, "q") == []  # still locked by holder
    await manager.commit(holder.transaction_id)
    assert replicator.state_machine.count("q") == 0


async def test_an_item_removed_behind_the_views_back_is_never_handed_out(setup):
    manager, replicator = setup
    await enqueue_committed(manager, "q", b"a", b"b")
    first_id = replicator.state_machine.item_ids("q")[0]
    from rcq.server.core.commands import CommitBatch, CommitUnit, TransactionWrite, encode
    replicator.apply_raw(encode(CommitBatch(term=1, now_ms=1, units=(CommitUnit((TransactionWrite(
        "1.cccccccccccccccccccccccc", dequeues=(("q", (first_id,)),)),)),))))
    tx = manager.begin()
    items = await manager.dequeue(tx.transaction_id, "q", max_items=2)
    assert [i.value for i in items] == [b"b"]
    await manager.commit(tx.transaction_id)  # no conflict: the gone item is not part of it
    assert replicator.state_machine.count("q") == 0


async def test_a_commit_many_over_the_entry_limit_is_refused_and_changes_nothing():
    replicator = InMemoryReplicator()
    config = make_config(commit_unit_bytes_max=8 << 20, transaction_bytes_max=4 << 20, item_bytes_max=1 << 20)
    manager = TransactionManager(config, replicator, leader_url=lambda: None)
    await manager.start()
    await async_wait_until(lambda: manager.serving, NODE_SERVING_TIMEOUT_S, what="serving")
    transactions = [manager.begin() for _ in range(3)]
    for tx in transactions:
        manager.enqueue(tx.transaction_id, "q", [b"x" * (1 << 20)] * 3)
    with pytest.raises(PayloadTooLarge):
        await manager.commit_many([t.transaction_id for t in transactions])
    assert replicator.state_machine.count("q") == 0 and manager.open_count == 3
    await manager.stop()


def test_transaction_ids_come_from_a_refilled_random_pool_and_never_repeat():
    from rcq.server.leader.session import RandomHex

    source = RandomHex(12, pool=4)
    ids = [source.next() for _ in range(1000)]
    assert len(set(ids)) == 1000 and all(len(i) == 24 and int(i, 16) >= 0 for i in ids)
