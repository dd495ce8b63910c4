"""The state machine's storage limits and queue changes: deterministic refusals, draining always works."""

from __future__ import annotations

import pytest

from rcq.server.core import state_machine as sm_module
from rcq.server.core.commands import Limits, QueueChange, QueueChangeResult, encode
from tests.helpers.state import Node, replicated_state, tx, unit

OVERHEAD = sm_module.ITEM_OVERHEAD_BYTES
ROOMY = Limits(storage_bytes_max=1 << 30, queue_items_max=1_000_000, queue_bytes_max=1 << 30)


class LimitedNode(Node):
    def commit_limited(self, *units, limits: Limits):
        from rcq.server.core.commands import BatchResult, CommitBatch

        result = self.apply_raw(encode(CommitBatch(self.term, self.now_ms, tuple(units), limits)))
        assert isinstance(result, BatchResult)
        return result.outcomes

    def change(self, queue: str, action: str, max_items=None, max_bytes=None, term=None) -> QueueChangeResult:
        result = self.apply_raw(encode(QueueChange(self.term if term is None else term, self.now_ms, queue,
                                                   action, max_items, max_bytes)))
        assert isinstance(result, QueueChangeResult)
        return result


@pytest.fixture
def node() -> LimitedNode:
    return LimitedNode()


def test_empty_items_are_not_free(node):
    limits = Limits(storage_bytes_max=10 * OVERHEAD, queue_items_max=1_000, queue_bytes_max=1 << 30)
    (ok,) = node.commit_limited(unit(tx("t1", [("a", [b""] * 10)])), limits=limits)
    assert ok.status == "committed"
    assert node.sm.storage_cost == 10 * OVERHEAD
    (full,) = node.commit_limited(unit(tx("t2", [("a", [b""])])), limits=limits)
    assert (full.status, full.reason) == ("rejected", "storage_full")
    assert node.sm.count("a") == 10


def test_a_queue_past_max_items_refuses_growth_but_drains(node):
    limits = Limits(storage_bytes_max=1 << 30, queue_items_max=3, queue_bytes_max=1 << 30)
    assert node.commit_limited(unit(tx("t1", [("a", [b"1", b"2", b"3"])])), limits=limits)[0].status == "committed"
    (full,) = node.commit_limited(unit(tx("t2", [("a", [b"4"])])), limits=limits)
    assert (full.status, full.reason, full.queue) == ("rejected", "queue_full", "a")
    assert node.sm.outcome("t2").reason == "queue_full"
    # another queue is not affected
    assert node.commit_limited(unit(tx("t3", [("b", [b"x"])])), limits=limits)[0].status == "committed"
    # a unit that takes one and puts one keeps the count: allowed
    (swap,) = node.commit_limited(unit(tx("t4", [("a", [b"5"])], [("a", [1])])), limits=limits)
    assert swap.status == "committed"
    # draining always works, even with limits lower than the queue already holds
    tight = Limits(storage_bytes_max=1 << 20, queue_items_max=1, queue_bytes_max=1)
    assert node.commit_limited(unit(tx("t5", dequeue=[("a", [2])])), limits=tight)[0].status == "committed"
    assert node.sm.count("a") == 2


def test_queue_settings_override_the_defaults_and_survive_a_snapshot(node):
    assert node.change("a", "configure", max_items=2).status == "done"
    assert node.sm.queue_settings("a") == (2, None)
    (full,) = node.commit_limited(unit(tx("t1", [("a", [b"1", b"2", b"3"])])), limits=ROOMY)
    assert full.reason == "queue_full"
    assert node.commit_limited(unit(tx("t2", [("a", [b"1", b"2"])])), limits=ROOMY)[0].status == "committed"
    node.change("a", "configure", max_bytes=2 + 2 * OVERHEAD + 5)
    (by_bytes,) = node.commit_limited(unit(tx("t3", [("b", [b"123456"])]), tx("t4", [("a", [b"123456"])])),
                                      limits=ROOMY)
    assert (by_bytes.reason, by_bytes.queue) == ("queue_full", "a")
    restored = sm_module.QueueStateMachine()
    restored.restore(node.sm.snapshot_meta(), node.sm.snapshot_items())
    assert restored.queue_settings("a") == (None, 2 + 2 * OVERHEAD + 5)
    assert restored.storage_cost == node.sm.storage_cost
    assert restored.digest() == node.sm.digest()


def test_entries_without_limits_are_not_limited(node):
    node.change("a", "configure", max_items=1)
    assert node.commit_one(unit(tx("t1", [("a", [b"1", b"2"])]))).status == "committed"


def test_purge_removes_the_items_and_keeps_the_queue(node):
    node.enqueue("a", b"1", b"22")
    node.change("a", "configure", max_items=5)
    result = node.change("a", "purge")
    assert result == QueueChangeResult("done", "a", "purge", removed=2)
    assert node.sm.count("a") == 0 and node.sm.queue_names() == ["a"]
    assert node.sm.queue_settings("a") == (5, None)
    assert node.sm.storage_cost == 0
    assert node.sm.queue_stats("a")["purged_total"] == 2
    # a commit of an item the purge removed is rejected: it is missing
    assert node.commit_one(unit(tx("t", dequeue=[("a", [1])]))).reason == "items_missing"


def test_delete_frees_the_queue_cap(node, monkeypatch):
    monkeypatch.setattr(sm_module, "QUEUES_MAX", 2)
    node = LimitedNode()
    node.enqueue("a", b"1")
    node.enqueue("b", b"2")
    assert node.commit_one(unit(tx("t1", [("c", [b"3"])]))).reason == "too_many_queues"
    assert node.change("c", "configure").reason == "too_many_queues"
    assert node.change("a", "delete") == QueueChangeResult("done", "a", "delete", removed=1)
    assert node.sm.queue_names() == ["b"]
    assert node.commit_one(unit(tx("t2", [("c", [b"3"])]))).status == "committed"
    assert node.change("a", "delete").reason == "queue_not_found"
    assert node.change("a", "purge").reason == "queue_not_found"


def test_a_queue_change_of_a_deposed_leader_changes_nothing(node):
    node.enqueue("a", b"1")
    node.barrier(2)
    before = replicated_state(node.sm, "last_index")
    assert node.change("a", "delete", term=1).reason == "stale_leader"
    assert replicated_state(node.sm, "last_index") == before


def test_a_transaction_growing_two_queues_is_refused_whole(node):
    limits = Limits(storage_bytes_max=1 << 30, queue_items_max=2, queue_bytes_max=1 << 30)
    node.enqueue("b", b"1", b"2")
    (outcome,) = node.commit_limited(unit(tx("t1", [("a", [b"x"])]), tx("t2", [("b", [b"y"])])), limits=limits)
    assert (outcome.reason, outcome.queue) == ("queue_full", "b")
    assert node.sm.queue_names() == ["b"] and node.sm.count("b") == 2
