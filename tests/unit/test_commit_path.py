"""The leader's commit path over the in-memory replicator: unknown outcomes settled across epochs."""

from __future__ import annotations

import pytest

from rcq.errors import CommitOutcomeUnknown, TransactionAborted
from rcq.server.leader.transactions import TransactionManager
from rcq.testing import InMemoryReplicator, async_wait_until
from tests.helpers import NODE_SERVING_TIMEOUT_S
from tests.helpers.nodes import enqueue_committed, make_config


async def test_an_unknown_commit_is_settled_even_when_an_earlier_epochs_settle_was_cut_short():
    replicator = InMemoryReplicator()
    manager = TransactionManager(make_config(commit_timeout_s=0.2), replicator, leader_url=lambda: None)
    await manager.start()
    try:
        await async_wait_until(lambda: manager.serving, NODE_SERVING_TIMEOUT_S, what="serving")
        await enqueue_committed(manager, "q", b"first")
        # Epoch 1: a commit whose outcome is unknown starts a settle, whose fence is held too...
        tx = manager.begin()
        await manager.dequeue(tx.transaction_id, "q")
        replicator.hold_submits = True
        with pytest.raises(CommitOutcomeUnknown):
            await manager.commit(tx.transaction_id)
        # ...when leadership changes under it: that settle ends without settling anything.
        replicator.depose()
        replicator.elect()
        replicator.hold_submits = False
        await async_wait_until(lambda: manager.serving, NODE_SERVING_TIMEOUT_S, what="serving in the new term")
        # Epoch 2: a commit proposed but never appended must be settled, its item free again.
        await enqueue_committed(manager, "q", b"second")
        holder = manager.begin()
        taken = await manager.dequeue(holder.transaction_id, "q", max_items=2)
        assert sorted(item.value for item in taken) == [b"first", b"second"]
        replicator.lose_next_submits = 1
        with pytest.raises(CommitOutcomeUnknown):
            await manager.commit(holder.transaction_id)

        async def items_free_again() -> bool:
            probe = manager.begin()
            try:
                return len(await manager.dequeue(probe.transaction_id, "q", max_items=2)) == 2
            finally:
                manager.abort(probe.transaction_id)

        await async_wait_until(items_free_again, NODE_SERVING_TIMEOUT_S, what="the unknown commit settled")
        with pytest.raises(TransactionAborted):  # settled as never applied: a retry cannot commit it
            await manager.commit(holder.transaction_id)
    finally:
        await manager.stop()
