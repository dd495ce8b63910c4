"""The leader's limits over the in-memory replicator: storage, fair use, lifetimes, unknown outcomes,
answer sizes, queue purge and delete."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from rcq.errors import (
    CommitOutcomeUnknown,
    OutcomeExpired,
    PayloadTooLarge,
    QueueFull,
    QueueNotFound,
    StorageFull,
    TooManyQueues,
    TooManyTransactions,
    TransactionAborted,
    TransactionBusy,
    TransactionLifetimeExceeded,
)
from rcq.server.core import state_machine as sm_module
from rcq.server.core.commands import ItemsAction, QueueSettings
from rcq.server.leader.session import EnqueueStep, Session
from rcq.server.leader.transactions import TransactionManager
from rcq.testing import InMemoryReplicator, async_wait_until
from tests.helpers import LOCAL_WAIT_S, NODE_SERVING_TIMEOUT_S
from tests.helpers.nodes import drain, enqueue_committed, make_config, skip_loop_time

OVERHEAD = sm_module.ITEM_OVERHEAD_BYTES


async def started(**overrides: object) -> tuple[TransactionManager, InMemoryReplicator]:
    replicator = InMemoryReplicator()
    manager = TransactionManager(make_config(**overrides), replicator, leader_url=lambda: None)
    await manager.start()
    await async_wait_until(lambda: manager.serving, NODE_SERVING_TIMEOUT_S, what="serving")
    return manager, replicator


@pytest.fixture
async def limited():
    manager, replicator = await started(queue_items_max_default=3)
    yield manager, replicator
    await manager.stop()


async def test_a_full_queue_refuses_the_enqueue_and_the_transaction_stays_open(limited):
    manager, replicator = limited
    await enqueue_committed(manager, "q", b"1", b"2")
    tx = manager.begin()
    manager.enqueue(tx.transaction_id, "q", [b"3"])
    with pytest.raises(QueueFull) as caught:
        manager.enqueue(tx.transaction_id, "q", [b"4"])
    assert caught.value.http_status == 429 and caught.value.details["queue"] == "q"
    assert caught.value.message == "queue 'q' holds 2 items and this transaction adds 2: over its limit of 3 items"
    await manager.commit(tx.transaction_id)  # what it held still fits
    assert replicator.state_machine.count("q") == 3


async def test_commits_in_flight_count_against_the_limit(limited):
    manager, replicator = limited
    first, second = manager.begin(), manager.begin()
    manager.enqueue(first.transaction_id, "q", [b"1", b"2"])
    manager.enqueue(second.transaction_id, "q", [b"3", b"4"])  # fits alone
    commit = asyncio.ensure_future(manager.commit(first.transaction_id))
    await asyncio.sleep(0)  # the first is proposed, not yet applied
    with pytest.raises(QueueFull):
        await manager.commit(second.transaction_id)
    await commit
    assert manager.describe(second.transaction_id)["state"] == "open"  # commit again later, or abort
    assert replicator.state_machine.count("q") == 2


async def test_a_one_request_enqueue_is_refused_by_a_full_queue_and_leaves_nothing_behind(limited):
    """A lone enqueue skips the enqueue-time room check and its deadline (its commit follows with
    no await between): the commit's check refuses it with the same error, counting commits in flight."""
    manager, replicator = limited
    await enqueue_committed(manager, "q", b"1")
    deadlines = len(manager._open.deadlines)
    in_flight = asyncio.ensure_future(manager.execute([EnqueueStep("q", [b"2"])]))
    await asyncio.sleep(0)  # proposed, not yet applied: its growth is reserved
    with pytest.raises(QueueFull) as caught:
        await manager.execute([EnqueueStep("q", [b"3", b"4"])])
    assert caught.value.http_status == 429 and caught.value.details == {"queue": "q", "max_items": 3}
    await in_flight
    assert manager.open_count == 0 and replicator.state_machine.count("q") == 2
    assert len(manager._open.deadlines) == deadlines  # a one-request enqueue never waits for a deadline
    await manager.execute([EnqueueStep("q", [b"3"])])
    with pytest.raises(QueueFull):
        await manager.execute([EnqueueStep("q", [b"4"])])
    assert replicator.state_machine.count("q") == 3 and manager.open_count == 0


async def test_a_full_queue_still_drains_and_then_accepts_again(limited):
    manager, _ = limited
    await enqueue_committed(manager, "q", b"1", b"2", b"3")
    with pytest.raises(QueueFull):
        await enqueue_committed(manager, "q", b"4")
    assert await drain(manager, "q") == [b"1", b"2", b"3"]
    await enqueue_committed(manager, "q", b"4")


async def test_the_storage_budget_counts_empty_items():
    manager, _ = await started(storage_bytes_max=1 << 20)
    try:
        fits = (1 << 20) // OVERHEAD
        tx = manager.begin()
        manager.enqueue(tx.transaction_id, "q", [b""] * fits)
        with pytest.raises(StorageFull) as caught:
            manager.enqueue(tx.transaction_id, "q", [b""])
        assert caught.value.http_status == 507
        await manager.commit(tx.transaction_id)
        with pytest.raises(StorageFull):
            await enqueue_committed(manager, "other", b"")
    finally:
        await manager.stop()


async def test_queue_settings_override_the_defaults(limited):
    manager, replicator = limited
    await manager.change_queue("big", "configure", max_items=5)
    await enqueue_committed(manager, "big", *[b"x"] * 5)
    with pytest.raises(QueueFull):
        await enqueue_committed(manager, "big", b"y")
    assert replicator.state_machine.queue_settings("big") == (5, None)


async def test_items_per_transaction_are_bounded():
    manager, _ = await started(transaction_items_max=4)
    try:
        await enqueue_committed(manager, "q", *[b"x"] * 4)
        tx = manager.begin()
        items = await manager.dequeue(tx.transaction_id, "q", max_items=10)
        assert len(items) == 4  # the dequeue is clamped to what the transaction may still hold
        with pytest.raises(PayloadTooLarge):
            manager.enqueue(tx.transaction_id, "r", [b"1"])
        with pytest.raises(PayloadTooLarge):
            await manager.dequeue(tx.transaction_id, "q")
    finally:
        await manager.stop()


async def test_a_dequeue_answer_is_bounded_in_bytes_and_the_rest_stays_available():
    manager, _ = await started(dequeue_answer_bytes_max=1024)
    try:
        await enqueue_committed(manager, "q", *[bytes([i]) * 400 for i in range(5)])
        tx = manager.begin()
        items = await manager.dequeue(tx.transaction_id, "q", max_items=5)
        assert [i.value[0] for i in items] == [0, 1]  # 800 bytes fit, 1200 do not
        assert manager.locked_count("q") == 2
        other = manager.begin()
        rest = await manager.dequeue(other.transaction_id, "q", max_items=1)
        assert rest[0].value[0] == 2  # the ones not answered went back to the head
        await manager.commit(tx.transaction_id)
        manager.abort(other.transaction_id)
        # an item bigger than the budget is still answered, alone
        await enqueue_committed(manager, "big", b"z" * 2000, b"y")
        tx = manager.begin()
        assert [len(i.value) for i in await manager.dequeue(tx.transaction_id, "big", max_items=2)] == [2000]
    finally:
        await manager.stop()


async def test_one_client_cannot_take_every_transaction_slot():
    manager, _ = await started(transactions_open_per_client_max=3, transactions_open_max=10)
    try:
        held = [manager.begin(client="10.0.0.1") for _ in range(3)]
        with pytest.raises(TooManyTransactions) as caught:
            manager.begin(client="10.0.0.1")
        assert caught.value.details == {"scope": "client"}
        manager.begin(client="10.0.0.2")  # someone else still gets in
        manager.abort(held[0].transaction_id)
        manager.begin(client="10.0.0.1")  # a slot freed
    finally:
        await manager.stop()


async def test_extends_stop_at_the_lifetime_limit():
    manager, _ = await started(transaction_lifetime_max_s=3.0, transaction_timeout_max_s=2.0,
                               transaction_timeout_default_s=1.0)
    try:
        tx = manager.begin(timeout_s=2.0)
        manager.extend(tx.transaction_id, 2.0)
        skip_loop_time(1.05)  # it has lived 1.05 s: 2 s more would take it past its 3 s
        with pytest.raises(TransactionLifetimeExceeded) as caught:
            manager.extend(tx.transaction_id, 2.0)
        assert caught.value.http_status == 409 and caught.value.details["remaining_s"] < 2.0
        assert manager.describe(tx.transaction_id)["state"] == "open"
    finally:
        await manager.stop()


async def test_an_extend_loop_does_not_grow_the_deadline_heap():
    manager, _ = await started()
    try:
        tx = manager.begin()
        for _ in range(20_000):
            manager.extend(tx.transaction_id, 30.0)
        assert len(manager._deadlines) <= 2 * manager.open_count + 1024 + 1
    finally:
        await manager.stop()


async def test_an_unknown_commit_that_never_applied_is_settled_and_its_items_freed():
    manager, replicator = await started(commit_timeout_s=0.5)
    try:
        await enqueue_committed(manager, "q", b"1")
        tx = manager.begin()
        await manager.dequeue(tx.transaction_id, "q")
        replicator.lose_next_submits = 1
        with pytest.raises(CommitOutcomeUnknown):
            await manager.commit(tx.transaction_id)
        # a fence settles it: the entry was never appended, so the transaction is aborted
        await async_wait_until(lambda: manager.locked_count("q") == 0, LOCAL_WAIT_S, what="locks freed")
        assert manager.describe(tx.transaction_id)["state"] == "aborted"
        assert await drain(manager, "q") == [b"1"]
    finally:
        await manager.stop()


async def test_an_unknown_commit_that_did_apply_ends_committed():
    manager, replicator = await started()
    try:
        await enqueue_committed(manager, "q", b"1")
        tx = manager.begin()
        await manager.dequeue(tx.transaction_id, "q")
        replicator.lose_next_answers = 1
        with pytest.raises(CommitOutcomeUnknown):
            await manager.commit(tx.transaction_id)
        await async_wait_until(lambda: manager.describe(tx.transaction_id)["state"] == "committed", LOCAL_WAIT_S,
                               what="committed")
        assert replicator.state_machine.count("q") == 0
    finally:
        await manager.stop()


async def test_purge_aborts_the_transactions_holding_its_items(limited):
    manager, replicator = limited
    await enqueue_committed(manager, "q", b"1", b"2")
    await enqueue_committed(manager, "r", b"keep")
    holder = manager.begin()
    await manager.dequeue(holder.transaction_id, "q", max_items=2)
    await manager.dequeue(holder.transaction_id, "r")
    producer = manager.begin()
    manager.enqueue(producer.transaction_id, "q", [b"3"])
    waiter = manager.begin()
    waiting = asyncio.ensure_future(manager.dequeue(waiter.transaction_id, "q", wait_ms=2000))
    await async_wait_until(lambda: manager.dequeues_waiting("q") == 1, LOCAL_WAIT_S, what="the dequeue waiting")
    result = await manager.change_queue("q", "purge")
    assert result.removed == 2
    with pytest.raises(TransactionAborted, match="queue_purged"):
        await manager.commit(holder.transaction_id)
    assert await drain(manager, "r") == [b"keep"]  # what it held elsewhere went back
    await manager.commit(producer.transaction_id)  # an enqueue into a purged queue is fine
    assert [i.value for i in await waiting] == [b"3"]
    manager.abort(waiter.transaction_id)
    assert replicator.state_machine.count("q") == 1


async def test_delete_aborts_producers_and_holders_and_frees_the_queue_cap(limited, monkeypatch):
    manager, replicator = limited
    monkeypatch.setattr(sm_module, "QUEUES_MAX", 2)
    replicator.state_machine.__init__()  # the cap is read when a state machine is built
    await manager.stop()
    manager, replicator = await started()
    try:
        await enqueue_committed(manager, "a", b"1")
        await enqueue_committed(manager, "b", b"2")
        with pytest.raises(TooManyQueues):
            await enqueue_committed(manager, "c", b"3")
        producer = manager.begin()
        manager.enqueue(producer.transaction_id, "a", [b"x"])
        assert (await manager.change_queue("a", "delete")).removed == 1
        with pytest.raises(TransactionAborted, match="queue_deleted"):
            await manager.commit(producer.transaction_id)
        await enqueue_committed(manager, "c", b"3")
        assert replicator.state_machine.queue_names() == ["b", "c"]
        with pytest.raises(QueueNotFound):
            await manager.change_queue("a", "delete")
    finally:
        await manager.stop()


async def test_a_forgotten_outcome_is_never_answered_as_a_definite_abort(monkeypatch):
    monkeypatch.setattr(sm_module, "OUTCOME_RETENTION_MS", 1)
    old_leader, replicator = await started()
    tx = old_leader.begin()
    old_leader.enqueue(tx.transaction_id, "q", [b"1"])
    await old_leader.commit(tx.transaction_id)
    await old_leader.stop()
    # another node leads a later term: it never saw the transaction, and its clock is a second
    # ahead, so that its first entry comes after the outcome's retention (no waiting for time)
    replicator.depose()
    replicator.elect()
    manager = TransactionManager(make_config(test_clock_offset_ms=1_000), replicator, leader_url=lambda: None)
    await manager.start()
    try:
        await async_wait_until(lambda: manager.serving, NODE_SERVING_TIMEOUT_S, what="serving")
        await enqueue_committed(manager, "q", b"2")  # an entry later than the retention forgets it
        assert replicator.state_machine.outcome(tx.transaction_id) is None
        with pytest.raises(OutcomeExpired) as caught:
            await manager.commit(tx.transaction_id)
        assert caught.value.maybe_committed and caught.value.http_status == 410
        assert manager.describe(tx.transaction_id)["state"] == "unknown"
    finally:
        await manager.stop()


async def test_a_queue_change_that_must_fail_proposes_nothing(limited, monkeypatch):
    manager, replicator = limited
    submitted = len(replicator.submitted)
    with pytest.raises(QueueNotFound):
        await manager.change_queue("missing", "delete")
    with pytest.raises(QueueNotFound):
        await manager.change_queue("missing", "purge")
    monkeypatch.setattr(sm_module, "QUEUES_MAX", 1)
    await enqueue_committed(manager, "a", b"1")
    submitted += 1
    with pytest.raises(TooManyQueues):
        await manager.change_queue("b", "configure", max_items=3)
    await manager.change_queue("a", "configure", max_items=3)  # an existing queue is no new queue
    assert len(replicator.submitted) == submitted + 1


@pytest.mark.parametrize("max_deliveries", [None, 3])
async def test_a_dequeue_sent_again_while_the_first_is_still_running_gets_the_same_items(max_deliveries):
    """A client re-sends a dequeue (same key) when its channel drops; the first attempt may still
    be running on the leader (recording deliveries in the log, or waiting for items). The re-sent
    one must answer what the first took, not take more: the commit removes everything the
    transaction holds, and items the client never saw would be gone without anyone having them."""
    manager, _ = await started()
    try:
        if max_deliveries is not None:
            await manager.change_queue("q", "configure", settings=QueueSettings(max_deliveries=max_deliveries))
        tx = manager.begin()
        first = asyncio.ensure_future(manager.dequeue(tx.transaction_id, "q", 1, wait_ms=2000, key="k"))
        await async_wait_until(lambda: manager.dequeues_waiting("q") == 1, LOCAL_WAIT_S,
                               what="the first attempt waiting for an item (nothing queued yet)")
        await enqueue_committed(manager, "q", b"1", b"2", b"3")
        again = await manager.dequeue(tx.transaction_id, "q", 1, wait_ms=2000, key="k")  # the re-sent one
        taken = await first
        assert [i.value for i in again] == [i.value for i in taken] == [b"1"]
        await manager.commit(tx.transaction_id)
        assert await drain(manager, "q") == [b"2", b"3"]  # nothing the client was not given is gone
    finally:
        await manager.stop()


async def a_dequeue_recording_its_delivery(manager: TransactionManager, replicator: InMemoryReplicator,
                                           key: str | None = None) -> tuple[Session, asyncio.Future[Any]]:
    """A transaction and its dequeue of the one item of ``q`` (max_deliveries 5), running: its
    delivery entry is proposed and never applies (its outcome will be unknown)."""
    await manager.change_queue("q", "configure", settings=QueueSettings(max_deliveries=5))
    await enqueue_committed(manager, "q", b"1")
    tx = manager.begin()
    replicator.hold_submits = True
    dequeue = asyncio.ensure_future(manager.dequeue(tx.transaction_id, "q", 1, key=key))
    await async_wait_until(lambda: any(isinstance(u, ItemsAction) for c in replicator.submitted
                                 for u in getattr(c, "units", ())), LOCAL_WAIT_S, what="the delivery entry proposed")
    return tx, dequeue


async def test_items_of_a_transaction_closed_while_their_delivery_fails_to_commit_are_offered_once():
    """A dequeue on a queue with max_deliveries records the delivery in the log first. If the
    transaction closes meanwhile (an abort, its deadline), closing gives the items back; when the
    delivery entry then fails, they must not be given back a second time: an item offered twice
    goes to two transactions, and the second commit fails."""
    manager, replicator = await started(commit_timeout_s=0.2)
    try:
        tx, dequeue = await a_dequeue_recording_its_delivery(manager, replicator, key="k")
        assert manager.abort(tx.transaction_id) == 1  # closing gives the item back
        with pytest.raises(CommitOutcomeUnknown):
            await dequeue
        replicator.hold_submits = False
        first, second = manager.begin(), manager.begin()
        taken = await manager.dequeue(first.transaction_id, "q", 5)
        assert [i.value for i in taken] == [b"1"]
        assert await manager.dequeue(second.transaction_id, "q", 5) == []  # offered once, not twice
        await manager.commit(first.transaction_id)
        manager.abort(second.transaction_id)
    finally:
        await manager.stop()


async def test_a_commit_sent_while_a_dequeue_records_its_deliveries_is_refused_busy_and_loses_nothing():
    """A client that pipelines (commit sent before the dequeue's answer; rcq's client never does)
    must not commit items no answer has carried yet: on a max_deliveries queue the dequeue holds
    them while its delivery entry is on its way. If that entry then failed, the commit would have
    removed items the client never saw. The commit is refused, retryable, until the dequeue answers."""
    manager, replicator = await started(commit_timeout_s=0.3)
    try:
        tx, dequeue = await a_dequeue_recording_its_delivery(manager, replicator)
        with pytest.raises(TransactionBusy) as caught:
            await manager.commit(tx.transaction_id)
        assert caught.value.retryable and "dequeue" in caught.value.message
        with pytest.raises(CommitOutcomeUnknown):
            await dequeue
        replicator.hold_submits = False
        await manager.commit(tx.transaction_id)  # the dequeue has answered (an error): nothing held now
        assert await drain(manager, "q") == [b"1"]
    finally:
        await manager.stop()
