"""QueueStateMachine: examples, a model-based test against a reference model, snapshots, determinism.

Commands always go in as a replica receives them: ``commands.encode(cmd)`` tuples
with an explicit log index.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

import rcq.server.core.state_machine as sm_module
from rcq.server.core.commands import (
    COMMAND_VERSION,
    KIND_BARRIER,
    KIND_COMMIT,
    QUEUE_ACTIONS,
    ApplyFailed,
    ApplyResult,
    Barrier,
    BarrierResult,
    BatchResult,
    CommitBatch,
    CommitUnit,
    EnqueuedRange,
    Limits,
    QueueChange,
    TransactionWrite,
    UnitOutcome,
    encode,
)
from rcq.server.core.state_machine import QueueStateMachine
from tests.helpers.state import (
    Node,
    assert_plain_meta,
    replicated_state,
    restored_copy,
    tx,
    unit,
)

FAST = settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))


# ====================================================================== helpers
def queue_contents(sm: QueueStateMachine) -> dict[str, list[tuple[int, bytes]]]:
    return {name: list(zip(sm.item_ids(name), sm.values(name, sm.item_ids(name)), strict=True))
            for name in sm.queue_names()}


def visible_state(sm: QueueStateMachine) -> tuple[Any, ...]:
    """What the queues hold and their stats (no bookkeeping of outcomes, keys, clock, index)."""
    return (queue_contents(sm), {q: sm.queue_stats(q) for q in sm.queue_names()},
            sm.snapshot_meta()["next_item_id"])


def observable(sm: QueueStateMachine, queues: Iterable[str] = (), transaction_ids: Iterable[str] = (),
               keys: Iterable[str] = ()) -> dict[str, Any]:
    """Every query answer, for comparing two machines."""
    names = sorted(set(sm.queue_names()) | set(queues))
    return {
        "names": sm.queue_names(),
        "queues": {q: (sm.count(q), sm.item_ids(q), sm.values(q, sm.item_ids(q)), sm.queue_stats(q),
                       [sm.contains(q, i) for i in range(0, 40)]) for q in names},
        "outcomes": {t: sm.outcome(t) for t in transaction_ids},
        "keys": {k: sm.idempotency_key_index(k) for k in keys},
        "scalars": (sm.last_index, sm.barrier_term, sm.now_ms),
        "digest": sm.digest(),
    }


@pytest.fixture
def node() -> Node:
    return Node()


# ====================================================================== examples
def test_enqueue_assigns_increasing_ids_in_commit_order(node):
    first = node.commit_one(unit(tx("t1", [("a", [b"x", b"y"])])))
    second = node.commit_one(unit(tx("t2", [("a", [b"z"]), ("b", [b"w"])])))
    assert first == UnitOutcome("committed", 1, enqueued=(EnqueuedRange("a", 1, 2),))
    assert second == UnitOutcome("committed", 2, enqueued=(EnqueuedRange("a", 3, 1), EnqueuedRange("b", 4, 1)))
    assert queue_contents(node.sm) == {"a": [(1, b"x"), (2, b"y"), (3, b"z")], "b": [(4, b"w")]}


def test_ids_within_one_batch_follow_unit_order_then_transaction_order(node):
    outcomes = node.commit(unit(tx("t1", [("a", [b"1"])]), tx("t2", [("a", [b"2"])])),
                           unit(tx("t3", [("b", [b"3"]), ("a", [b"4"])])))
    assert [o.enqueued for o in outcomes] == [
        (EnqueuedRange("a", 1, 1), EnqueuedRange("a", 2, 1)),
        (EnqueuedRange("b", 3, 1), EnqueuedRange("a", 4, 1)),
    ]
    assert node.sm.item_ids("a") == [1, 2, 4]


def test_an_enqueue_of_no_items_creates_no_queue_and_uses_no_id(node):
    assert node.commit_one(unit(tx("t1", [("a", [])]))) == UnitOutcome("committed", 1)
    assert node.sm.queue_names() == []
    assert node.enqueue("b", b"x").first_item_id == 1


def test_a_unit_of_two_transactions_applies_all_or_nothing(node):
    node.enqueue("a", b"1", b"2", b"3")
    before = visible_state(node.sm)
    rejected = node.commit_one(unit(tx("t1", [("b", [b"moved"])], [("a", [1])]),
                                    tx("t2", [("c", [b"new"])], [("a", [2, 99])])))
    assert rejected == UnitOutcome("rejected", 2, reason="items_missing", missing_item_ids=(99,))
    assert visible_state(node.sm) == before
    assert node.sm.outcome("t1").status == node.sm.outcome("t2").status == "rejected"

    committed = node.commit_one(unit(tx("t3", [("b", [b"moved"])], [("a", [1])]),
                                     tx("t4", [("c", [b"new"])], [("a", [2])])))
    assert committed.status == "committed"
    assert queue_contents(node.sm) == {"a": [(3, b"3")], "b": [(4, b"moved")], "c": [(5, b"new")]}


def test_commit_is_rejected_whole_when_a_dequeued_item_is_gone(node):
    node.enqueue("a", b"1", b"2")
    assert node.commit_one(unit(tx("t1", dequeue=[("a", [1])]))).status == "committed"
    before = visible_state(node.sm)
    outcome = node.commit_one(unit(tx("t2", [("b", [b"x"])], [("a", [2, 1])])))
    assert outcome == UnitOutcome("rejected", 3, reason="items_missing", missing_item_ids=(1,))
    assert visible_state(node.sm) == before
    assert node.sm.outcome("t2") == sm_module.TransactionOutcome("rejected", 3, 0, "items_missing")


def test_an_item_named_under_the_wrong_queue_counts_as_missing(node):
    node.enqueue("a", b"1")
    node.enqueue("b", b"2")
    outcome = node.commit_one(unit(tx("t", dequeue=[("b", [1]), ("nope", [2])])))
    assert (outcome.status, outcome.reason, outcome.missing_item_ids) == ("rejected", "items_missing", (1, 2))
    assert node.sm.count("a") == node.sm.count("b") == 1


def test_a_retried_commit_answers_duplicate_with_the_original_index_and_changes_nothing(node):
    node.enqueue("a", b"1", b"2")
    original = unit(tx("t1", [("b", [b"x"])], [("a", [1])]))
    assert node.commit_one(original, index=5).status == "committed"
    before = replicated_state(node.sm, "last_index")
    assert node.commit_one(original, index=9) == UnitOutcome("duplicate", 5)
    assert replicated_state(node.sm, "last_index") == before
    # also when grouped with a new unit, and when the retry lists only some of its content
    outcomes = node.commit(unit(tx("t2", [("c", [b"y"])])), original, unit(tx("t1")), index=10)
    assert [o.status for o in outcomes] == ["committed", "duplicate", "duplicate"]
    assert [o.index for o in outcomes] == [10, 5, 5]
    assert queue_contents(node.sm) == {"a": [(2, b"2")], "b": [(3, b"x")], "c": [(4, b"y")]}


def test_a_retried_unit_of_several_transactions_answers_duplicate(node):
    node.enqueue("a", b"1")
    original = unit(tx("t1", dequeue=[("a", [1])]), tx("t2", [("b", [b"x"])]))
    assert node.commit_one(original).status == "committed"
    before = visible_state(node.sm)
    assert node.commit_one(original) == UnitOutcome("duplicate", 2)
    assert visible_state(node.sm) == before


def test_a_retried_rejected_commit_stays_rejected_even_if_it_could_now_apply(node):
    node.enqueue("a", b"1")
    retry = unit(tx("t1", [("b", [b"x"])], [("a", [2])]))
    assert node.commit_one(retry).reason == "items_missing"
    node.enqueue("a", b"2")  # item 2 now exists
    before = visible_state(node.sm)
    outcome = node.commit_one(retry)
    assert (outcome.status, outcome.index, outcome.reason) == ("rejected", 2, "items_missing")
    assert visible_state(node.sm) == before


def test_reusing_a_committed_transaction_id_with_a_new_one_is_rejected(node):
    node.enqueue("a", b"1", tid="t1")
    before = visible_state(node.sm)
    outcome = node.commit_one(unit(tx("t1"), tx("t9", [("a", [b"x"])])))
    assert (outcome.status, outcome.reason) == ("rejected", "transaction_reused")
    assert visible_state(node.sm) == before
    assert node.sm.outcome("t9") is None


def test_a_transaction_reused_rejection_reports_this_entrys_index(node):
    node.enqueue("a", b"1", tid="t1")
    node.barrier(1)
    outcome = node.commit_one(unit(tx("t1"), tx("t9")), index=7)
    assert (outcome.status, outcome.index) == ("rejected", 7)


def test_a_unit_listing_one_transaction_twice_is_rejected(node):
    node.enqueue("a", b"1")
    outcome = node.commit_one(unit(tx("t1", [("b", [b"x"])]), tx("t1", dequeue=[("a", [1])])))
    assert (outcome.status, outcome.reason) == ("rejected", "duplicate_transaction")
    assert node.sm.count("a") == 1 and node.sm.count("b") == 0


def test_the_same_idempotency_key_answers_duplicate(node):
    node.enqueue("a", b"1", b"2")
    first = node.commit_one(unit(tx("t1", [("b", [b"x"])], [("a", [1])]), key="k"))
    assert first.status == "committed"
    before = replicated_state(node.sm, "last_index")
    # a different transaction (the client lost the first one's id) with the same key
    again = node.commit_one(unit(tx("t2", [("b", [b"y"])], [("a", [2])]), key="k"))
    assert again == UnitOutcome("duplicate", first.index)
    assert replicated_state(node.sm, "last_index") == before
    assert node.sm.outcome("t2") is None
    assert node.sm.idempotency_key_index("k") == first.index


def test_a_rejected_commit_does_not_claim_its_idempotency_key(node):
    assert node.commit_one(unit(tx("t1", dequeue=[("a", [1])]), key="k")).status == "rejected"
    assert node.sm.idempotency_key_index("k") is None
    assert node.commit_one(unit(tx("t2", [("a", [b"x"])]), key="k")).status == "committed"


def test_idempotency_keys_expire_after_the_retention_of_leader_time(node, monkeypatch):
    monkeypatch.setattr(sm_module, "IDEMPOTENCY_RETENTION_MS", 1000)
    node = Node()  # the limits are read when a state machine is built
    node.now_ms = 10_000
    first = node.commit_one(unit(tx("t1", [("a", [b"1"])]), key="k"))
    assert node.commit_one(unit(tx("t2", [("a", [b"2"])]), key="k"), now_ms=10_999) == \
        UnitOutcome("duplicate", first.index)
    node.barrier(1, now_ms=11_000)  # exactly the retention: still kept
    assert node.sm.idempotency_key_index("k") == first.index
    node.barrier(1, now_ms=11_001)  # older than the retention: gone
    assert node.sm.idempotency_key_index("k") is None
    outcome = node.commit_one(unit(tx("t3", [("a", [b"3"])]), key="k"), now_ms=11_001)
    assert outcome.status == "committed"
    assert node.sm.count("a") == 2
    # a retry by transaction id is still recognised: outcomes are kept separately
    assert node.commit_one(unit(tx("t1", [("a", [b"1"])]))) == UnitOutcome("duplicate", first.index)
    assert node.sm.count("a") == 2


def test_idempotency_expiry_follows_the_leader_clock_not_the_entry_count(node, monkeypatch):
    monkeypatch.setattr(sm_module, "IDEMPOTENCY_RETENTION_MS", 1000)
    node = Node()  # the limits are read when a state machine is built
    node.commit_one(unit(tx("t1", [("a", [b"1"])]), key="old"), now_ms=0)
    for i in range(20):  # many entries, little time
        node.commit_one(unit(tx(f"u{i}", [("a", [b"x"])])), now_ms=10 * i)
    assert node.sm.idempotency_key_index("old") is not None
    # the clock never goes back: a late entry stamped earlier does not revive anything
    node.barrier(1, now_ms=5000)
    node.barrier(1, now_ms=0)
    assert node.sm.now_ms == 5000
    assert node.sm.idempotency_key_index("old") is None


def test_an_expired_idempotency_key_is_forgotten_by_the_entry_that_expires_it(node, monkeypatch):
    monkeypatch.setattr(sm_module, "IDEMPOTENCY_RETENTION_MS", 1000)
    node = Node()  # the limits are read when a state machine is built
    node.commit_one(unit(tx("t1", [("a", [b"1"])]), key="k"), now_ms=0)
    outcome = node.commit_one(unit(tx("t2", [("a", [b"2"])]), key="k"), now_ms=5000)
    assert outcome.status == "committed"


def test_a_full_idempotency_table_refuses_new_keys_until_the_oldest_pass_the_minimum_retention(monkeypatch):
    monkeypatch.setattr(sm_module, "IDEMPOTENCY_KEYS_MAX", 3)
    monkeypatch.setattr(sm_module, "IDEMPOTENCY_RETENTION_MIN_MS", 1000)
    node = Node()
    indices = [node.commit_one(unit(tx(f"t{i}", [("a", [b"x"])]), key=f"k{i}"), now_ms=i).index
               for i in range(3)]
    # full, and every key younger than the minimum: a new key is refused, nothing forgotten early
    refused = node.commit_one(unit(tx("t3", [("a", [b"x"])]), key="k3"), now_ms=999)
    assert (refused.status, refused.reason) == ("rejected", "idempotency_keys_full")
    assert [node.sm.idempotency_key_index(f"k{i}") for i in range(3)] == indices
    assert node.sm.count("a") == 3
    # work without a key still commits, and a retry under a remembered key is still a duplicate
    assert node.commit_one(unit(tx("t4", [("a", [b"y"])])), now_ms=999).status == "committed"
    assert node.commit_one(unit(tx("t5", [("a", [b"z"])]), key="k2"), now_ms=999).status == "duplicate"
    # once the oldest key is past the minimum, it makes room for one
    assert node.commit_one(unit(tx("t6", [("a", [b"x"])]), key="k3"), now_ms=1001).status == "committed"
    assert node.sm.idempotency_key_index("k0") is None
    assert node.sm.idempotency_key_index("k1") == indices[1]


def test_a_full_outcome_table_refuses_new_commits_until_the_oldest_pass_the_minimum_retention(monkeypatch):
    monkeypatch.setattr(sm_module, "OUTCOMES_MAX", 3)
    monkeypatch.setattr(sm_module, "OUTCOME_RETENTION_MIN_MS", 1000)
    node = Node()
    for i in range(3):
        node.now_ms = i
        node.enqueue("a", b"x", tid=f"{1:x}.t{i}")
    refused = node.commit_one(unit(tx("1.t3", [("a", [b"x"])])), now_ms=999)
    assert (refused.status, refused.reason) == ("rejected", "outcomes_full")
    assert node.sm.outcome("1.t3") is None  # no room to remember the refusal either
    assert node.sm.count("a") == 3
    assert node.sm.outcomes_forgotten_term == 0
    # a retry of a remembered one is still a duplicate
    assert node.commit_one(unit(tx("1.t2", [("a", [b"x"])])), now_ms=999).status == "duplicate"
    node.now_ms = 1001
    node.enqueue("a", b"y", tid="2.t4")  # t0 is past the minimum: forgotten to make room
    assert node.sm.outcome("1.t0") is None
    assert node.sm.outcome("1.t1") is not None
    # a transaction of term 1 without an outcome may have committed: the machine says so
    assert node.sm.outcomes_forgotten_term == 1


def test_outcomes_are_forgotten_after_the_retention(monkeypatch):
    monkeypatch.setattr(sm_module, "OUTCOME_RETENTION_MS", 5000)
    node = Node()
    node.now_ms = 1000
    node.enqueue("a", b"x", tid="3.t0")
    node.barrier(1, now_ms=6000)
    assert node.sm.outcome("3.t0") is not None  # exactly the retention: kept
    node.barrier(1, now_ms=6001)
    assert node.sm.outcome("3.t0") is None
    assert node.sm.outcomes_forgotten_term == 3


def test_a_batch_below_the_barrier_term_is_fenced_as_stale_leader_and_changes_no_queue(node):
    node.enqueue("a", b"1", b"2", tid="t0")
    assert node.barrier(2) == BarrierResult(term=2)
    assert node.sm.barrier_term == 2
    before = visible_state(node.sm)
    outcomes = node.commit(unit(tx("t1", [("b", [b"x"])], [("a", [1])])),
                           unit(tx("t2", [("c", [b"y"])]), key="k"),
                           unit(tx("t0", [("a", [b"1", b"2"])])),  # a retry: keeps its first answer
                           term=1)
    assert outcomes == (UnitOutcome("rejected", node.index, reason="stale_leader"),
                        UnitOutcome("rejected", node.index, reason="stale_leader"),
                        UnitOutcome("duplicate", 1))
    assert visible_state(node.sm) == before
    assert node.sm.outcome("t1").reason == "stale_leader"
    assert node.sm.idempotency_key_index("k") is None
    # the current leader's term (and later ones) apply
    assert node.commit_one(unit(tx("t3", dequeue=[("a", [1])])), term=2).status == "committed"
    assert node.commit_one(unit(tx("t4", dequeue=[("a", [2])])), term=3).status == "committed"
    assert node.sm.count("a") == 0


def test_a_barrier_never_lowers_the_barrier_term(node):
    node.barrier(3)
    assert node.barrier(2) == BarrierResult(term=2)
    assert node.sm.barrier_term == 3
    assert node.commit_one(unit(tx("t", [("a", [b"x"])])), term=2).reason == "stale_leader"


MALFORMED = [
    None,
    (),
    "commit",
    (COMMAND_VERSION, KIND_BARRIER, 9),
    (COMMAND_VERSION, KIND_BARRIER, True, 9),
    (COMMAND_VERSION, KIND_COMMIT, 9, 10**9, ((None, (("t", (("a", ("not bytes",)),), ()),)),)),
    (COMMAND_VERSION, KIND_COMMIT, 9, 10**9, ((None, (("t", (), (("a", (1.0,)),)),)),)),
    (COMMAND_VERSION, KIND_COMMIT, 9, 10**9, ((5, ()),)),
]


@pytest.mark.parametrize("raw", MALFORMED, ids=repr)
def test_a_malformed_command_gives_ApplyFailed_and_changes_nothing_but_last_index(node, raw):
    node.enqueue("a", b"1", b"2")
    node.barrier(1, now_ms=100)
    before = replicated_state(node.sm, "last_index")
    result = node.apply_raw(raw, index=42)
    assert isinstance(result, ApplyFailed)
    assert result.reason == "malformed_command"
    assert replicated_state(node.sm, "last_index") == before
    assert node.sm.last_index == 42
    assert (node.sm.now_ms, node.sm.barrier_term) == (100, 1)


def test_last_index_never_goes_back(node):
    node.apply_raw(encode(Barrier(1, 0)), index=10)
    node.apply_raw(None, index=3)
    node.apply_raw(encode(Barrier(1, 0)), index=4)
    assert node.sm.last_index == 10


def test_QUEUES_MAX_is_enforced(node, monkeypatch):
    monkeypatch.setattr(sm_module, "QUEUES_MAX", 3)
    node = Node()
    node.enqueue("a", b"1")
    node.enqueue("b", b"2")
    before = visible_state(node.sm)
    # two new queues when only one is left: rejected whole
    outcome = node.commit_one(unit(tx("t1", [("a", [b"3"]), ("c", [b"4"])]), tx("t2", [("d", [b"5"])])))
    assert (outcome.status, outcome.reason) == ("rejected", "too_many_queues")
    assert visible_state(node.sm) == before
    # the same new queue named by two transactions counts once
    outcome = node.commit_one(unit(tx("t3", [("c", [b"4"])]), tx("t4", [("c", [b"5"])])))
    assert outcome.status == "committed"
    assert node.commit_one(unit(tx("t5", [("d", [b"6"])]))).reason == "too_many_queues"
    # existing queues keep working, even once emptied
    node.commit_one(unit(tx("t6", dequeue=[("a", [1])])))
    assert node.commit_one(unit(tx("t7", [("a", [b"7"]), ("b", [b"8"])]))).status == "committed"
    assert node.sm.queue_names() == ["a", "b", "c"]


def test_the_same_item_dequeued_twice_in_one_unit_is_rejected(node):
    node.enqueue("a", b"1", b"2")
    before = visible_state(node.sm)
    across = node.commit_one(unit(tx("t1", dequeue=[("a", [1])]), tx("t2", [("b", [b"x"])], [("a", [2, 1])])))
    assert across == UnitOutcome("rejected", node.index, reason="item_dequeued_twice", missing_item_ids=(1,))
    within = node.commit_one(unit(tx("t3", dequeue=[("a", [2, 2])])))
    assert (within.status, within.reason) == ("rejected", "item_dequeued_twice")
    assert visible_state(node.sm) == before


def test_the_same_item_dequeued_by_two_units_of_one_batch_goes_to_the_first(node):
    node.enqueue("a", b"1")
    first, second = node.commit(unit(tx("t1", [("b", [b"x"])], [("a", [1])])),
                                unit(tx("t2", [("c", [b"y"])], [("a", [1])])))
    assert first.status == "committed"
    assert (second.status, second.missing_item_ids) == ("rejected", (1,))
    assert queue_contents(node.sm) == {"a": [], "b": [(2, b"x")]}


def test_count_queue_stats_and_item_ids_reflect_state(node):
    assert (node.sm.count("a"), node.sm.queue_stats("a"), node.sm.item_ids("a")) == (0, None, [])
    assert node.sm.values("a", [1, 2]) == [None, None]
    assert not node.sm.contains("a", 1)
    node.enqueue("a", b"one", b"three", b"")
    node.enqueue("b", b"xy")
    node.commit_one(unit(tx("t", dequeue=[("a", [2])])))
    assert node.sm.count("a") == 2
    assert node.sm.item_ids("a") == [1, 3]
    assert node.sm.values("a", [1, 2, 3, 4]) == [b"one", None, b"", None]
    assert node.sm.contains("a", 1) and not node.sm.contains("a", 2) and not node.sm.contains("b", 1)
    quiet = {"delayed": 0, "dead_lettered_total": 0, "dropped_total": 0, "expired_total": 0, "rejected_total": 0,
             "max_deliveries_total": 0, "redriven_total": 0}
    assert node.sm.queue_stats("a") == {"count": 2, "bytes": 3, "cost_bytes": 3 + 2 * sm_module.ITEM_OVERHEAD_BYTES,
                                        "enqueued_total": 3, "dequeued_total": 1, "purged_total": 0, **quiet}
    assert node.sm.queue_stats("b") == {"count": 1, "bytes": 2, "cost_bytes": 2 + sm_module.ITEM_OVERHEAD_BYTES,
                                        "enqueued_total": 1, "dequeued_total": 0, "purged_total": 0, **quiet}
    assert node.sm.queue_names() == ["a", "b"]
    assert list(node.sm.snapshot_items()) == [("a", 1, b"one"), ("a", 3, b""), ("b", 4, b"xy")]


def test_dequeuing_a_middle_item_leaves_a_tombstone_that_keeps_head_order(node):
    node.enqueue("a", b"1", b"2", b"3", b"4", b"5")
    node.commit_one(unit(tx("t1", dequeue=[("a", [3])])))
    assert node.sm.item_ids("a") == [1, 2, 4, 5]
    node.commit_one(unit(tx("t2", dequeue=[("a", [1])])))
    assert node.sm.item_ids("a") == [2, 4, 5]
    node.commit_one(unit(tx("t3", dequeue=[("a", [2])])))  # the head now meets the tombstone of 3
    assert node.sm.item_ids("a") == [4, 5]
    node.enqueue("a", b"6")
    node.commit_one(unit(tx("t4", dequeue=[("a", [5])])))
    assert node.sm.item_ids("a") == [4, 6]
    assert node.sm.values("a", node.sm.item_ids("a")) == [b"4", b"6"]
    assert node.sm.count("a") == 2
    assert restored_copy(node.sm).item_ids("a") == [4, 6]
    node.commit_one(unit(tx("t5", dequeue=[("a", [4, 6])])))
    assert node.sm.item_ids("a") == [] and node.sm.count("a") == 0
    node.enqueue("a", b"7")
    assert node.sm.item_ids("a") == [7]


def test_a_dequeue_of_no_items_from_an_unknown_queue_neither_fails_nor_half_applies_a_unit(node):
    # regression: this used to raise KeyError after t1 was applied (ApplyFailed with the state changed)
    outcome = node.commit_one(unit(tx("t1", [("a", [b"x"])]), tx("t2", dequeue=[("ghost", [])])))
    assert outcome == UnitOutcome("committed", 1, enqueued=(EnqueuedRange("a", 1, 1),))
    assert node.sm.queue_names() == ["a"]
    assert node.sm.outcome("t2").status == "committed"


def test_restore_rejects_an_unknown_snapshot_format():
    meta = QueueStateMachine().snapshot_meta()
    with pytest.raises(ValueError, match="format"):
        QueueStateMachine().restore({**meta, "format": 999}, [])


def test_restore_discards_the_previous_state(node):
    node.enqueue("a", b"1")
    other = Node()
    other.enqueue("z", b"zz", tid="other")
    restored_copy(node.sm, into=other.sm)
    assert other.sm.queue_names() == ["a"]
    assert other.sm.outcome("other") is None
    assert other.sm.digest() == node.sm.digest()


def test_snapshot_of_an_empty_machine_round_trips():
    sm = QueueStateMachine()
    assert_plain_meta(sm.snapshot_meta())
    assert restored_copy(sm, "json").digest() == sm.digest()


# ====================================================================== model-based test
QUEUE_NAMES = ("a", "b", "c")
PICK = st.integers(0, 99)
VALUES = st.binary(max_size=4)


@dataclass
class OpenTransaction:
    """A client-side view of one open transaction, as the TransactionManager would buffer it."""

    tid: str
    term: int
    enqueues: list[tuple[str, bytes]] = field(default_factory=list)
    dequeues: list[tuple[str, int]] = field(default_factory=list)

    def write(self) -> TransactionWrite:
        enqueues: dict[str, list[bytes]] = {}
        for queue, value in self.enqueues:
            enqueues.setdefault(queue, []).append(value)
        dequeues: dict[str, list[int]] = {}
        for queue, item_id in self.dequeues:
            dequeues.setdefault(queue, []).append(item_id)
        return tx(self.tid, enqueues.items(), dequeues.items())


class QueueModel(RuleBasedStateMachine):
    """QueueStateMachine against a plain reference model (queue -> [(id, value)]).

    Every command also goes to a twin fed from the start (determinism) and, after a
    snapshot rule, to a machine restored from that snapshot: all must answer alike.
    """

    @initialize()
    def start(self) -> None:
        self.sm = QueueStateMachine()
        self.twin = QueueStateMachine()
        self.restored: QueueStateMachine | None = None
        self.index = 0
        self.term = 1
        self.now = 0
        self.counter = 0
        # the reference model
        self.model: dict[str, list[tuple[int, bytes]]] = {}
        self.enqueued_total: dict[str, int] = {}
        self.dequeued_total: dict[str, int] = {}
        self.next_id = 1
        # the leader's volatile view
        self.open: dict[str, OpenTransaction] = {}
        self.locks: dict[int, str] = {}
        self.zombies: dict[str, OpenTransaction] = {}  # open on a deposed leader
        # history, for retries and stale commits
        self.removed: list[tuple[str, int]] = []
        self.committed: list[tuple[CommitUnit, int]] = []
        self.rejected: list[tuple[CommitUnit, int, str]] = []
        self.keys: dict[str, int] = {}
        self.transaction_ids: list[str] = []
        # the first leader's barrier
        assert self.apply(encode(Barrier(self.term, self.now))) == BarrierResult(self.term)

    # ------------------------------------------------------------ plumbing
    def fresh(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    def apply(self, raw: Any) -> ApplyResult:
        self.index += 1
        result = self.sm.apply(raw, self.index)
        assert self.twin.apply(raw, self.index) == result
        if self.restored is not None:
            assert self.restored.apply(raw, self.index) == result
        return result

    def apply_batch(self, units: list[CommitUnit], term: int | None = None) -> tuple[UnitOutcome, ...]:
        for u in units:
            self.transaction_ids.extend(t.transaction_id for t in u.transactions)
        result = self.apply(encode(CommitBatch(self.term if term is None else term, self.now, tuple(units))))
        assert isinstance(result, BatchResult), result
        assert len(result.outcomes) == len(units)
        return result.outcomes

    def pick_open(self, pick: int) -> OpenTransaction:
        tids = list(self.open)
        return self.open[tids[pick % len(tids)]]

    def finish(self, transaction: OpenTransaction) -> None:
        """Commit, abort or rejection: the transaction is gone and its locks released."""
        del self.open[transaction.tid]
        for _, item_id in transaction.dequeues:
            del self.locks[item_id]

    def model_commit(self, u: CommitUnit) -> tuple[EnqueuedRange, ...]:
        ranges = []
        for t in u.transactions:
            for queue, ids in t.dequeues:
                gone = set(ids)
                assert gone <= {i for i, _ in self.model[queue]}
                self.model[queue] = [(i, v) for i, v in self.model[queue] if i not in gone]
                self.dequeued_total[queue] += len(ids)
                self.removed.extend((queue, i) for i in ids)
            for queue, values in t.enqueues:
                if values:
                    first = self.next_id
                    self.model.setdefault(queue, []).extend((first + k, v) for k, v in enumerate(values))
                    self.enqueued_total[queue] = self.enqueued_total.get(queue, 0) + len(values)
                    self.dequeued_total.setdefault(queue, 0)
                    self.next_id += len(values)
                    ranges.append(EnqueuedRange(queue, first, len(values)))
        return tuple(ranges)

    # ------------------------------------------------------------ client operations
    @precondition(lambda self: len(self.open) < 6)
    @rule()
    def begin(self) -> None:
        tid = self.fresh("tx")
        self.open[tid] = OpenTransaction(tid, self.term)

    @precondition(lambda self: self.open)
    @rule(pick=PICK, queue=st.sampled_from(QUEUE_NAMES), value=VALUES)
    def enqueue(self, pick: int, queue: str, value: bytes) -> None:
        self.pick_open(pick).enqueues.append((queue, value))

    @precondition(lambda self: self.open)
    @rule(pick=PICK, queue=st.sampled_from(QUEUE_NAMES))
    def try_dequeue(self, pick: int, queue: str) -> None:
        transaction = self.pick_open(pick)
        for item_id, _ in self.model.get(queue, []):
            if item_id not in self.locks:
                self.locks[item_id] = transaction.tid
                transaction.dequeues.append((queue, item_id))
                return
        # empty (for this transaction): nothing to do

    @precondition(lambda self: len(self.open) < 6 and any(self.model.values()))
    @rule(source=st.sampled_from(QUEUE_NAMES), count=st.integers(1, 3),
          move_to=st.none() | st.sampled_from(QUEUE_NAMES), commit_now=st.booleans())
    def consumer(self, source: str, count: int, move_to: str | None, commit_now: bool) -> None:
        """Dequeue a few items (and move them to ``move_to``); commit now or leave the transaction open."""
        self.begin()
        transaction = self.open[list(self.open)[-1]]
        values = dict(self.model.get(source, []))
        for _ in range(count):
            self.try_dequeue(len(self.open) - 1, source)
        if move_to is not None:
            transaction.enqueues.extend((move_to, values[i]) for _, i in transaction.dequeues)
        if commit_now:
            u = unit(transaction.write())
            assert self.apply_batch([u]) == (UnitOutcome("committed", self.index, enqueued=self.model_commit(u)),)
            self.committed.append((u, self.index))
            self.finish(transaction)

    @rule(queue=st.sampled_from(QUEUE_NAMES), values=st.lists(VALUES, min_size=1, max_size=4))
    def producer(self, queue: str, values: list[bytes]) -> None:
        u = unit(tx(self.fresh("producer"), [(queue, values)]))
        assert self.apply_batch([u]) == (UnitOutcome("committed", self.index, enqueued=self.model_commit(u)),)
        self.committed.append((u, self.index))

    @precondition(lambda self: self.open)
    @rule(pick=PICK)
    def abort(self, pick: int) -> None:
        self.finish(self.pick_open(pick))

    @precondition(lambda self: self.open)
    @rule(groups=st.lists(st.lists(PICK, min_size=1, max_size=3), min_size=1, max_size=3),
          keyed=st.lists(st.booleans(), min_size=3, max_size=3),
          retry=st.none() | st.integers(0, 999), advance=st.integers(0, 2000))
    def commit(self, groups: list[list[int]], keyed: list[bool], retry: int | None, advance: int) -> None:
        self.now += advance
        tids = list(self.open)
        used: set[str] = set()
        units: list[CommitUnit] = []
        for group, with_key in zip(groups, keyed, strict=False):
            chosen = []
            for pick in group:
                tid = tids[pick % len(tids)]
                if tid not in used:
                    used.add(tid)
                    chosen.append(self.open[tid].write())
            if chosen:
                units.append(unit(*chosen, key=self.fresh("key") if with_key else None))
        retried = None
        if retry is not None and self.committed:
            retried = self.committed[retry % len(self.committed)]
            units.insert(retry % (len(units) + 1), retried[0])
        outcomes = self.apply_batch(units)
        for u, outcome in zip(units, outcomes, strict=True):
            if retried is not None and u is retried[0]:
                assert outcome == UnitOutcome("duplicate", retried[1])
                continue
            assert outcome == UnitOutcome("committed", self.index, enqueued=self.model_commit(u))
            self.committed.append((u, self.index))
            if u.idempotency_key is not None:
                self.keys[u.idempotency_key] = self.index
            for t in u.transactions:
                self.finish(self.open[t.transaction_id])

    @precondition(lambda self: self.committed)
    @rule(pick=st.integers(0, 999))
    def retry_commit(self, pick: int) -> None:
        u, index = self.committed[pick % len(self.committed)]
        assert self.apply_batch([u]) == (UnitOutcome("duplicate", index),)

    @precondition(lambda self: self.keys)
    @rule(pick=st.integers(0, 999), queue=st.sampled_from(QUEUE_NAMES), value=VALUES)
    def retry_with_same_key_and_new_transaction(self, pick: int, queue: str, value: bytes) -> None:
        key = sorted(self.keys)[pick % len(self.keys)]
        heads = [(q, items[0][0]) for q, items in sorted(self.model.items())
                 if items and items[0][0] not in self.locks]
        retry = tx(self.fresh("again"), [(queue, [value])], [(q, [i]) for q, i in heads[:1]])
        assert self.apply_batch([unit(retry, key=key)]) == (UnitOutcome("duplicate", self.keys[key]),)

    @precondition(lambda self: self.removed)
    @rule(pick_removed=st.integers(0, 999), with_open=st.booleans(), pick=PICK,
          queue=st.sampled_from(QUEUE_NAMES), value=VALUES, keyed=st.booleans())
    def stale_commit_of_a_removed_item(self, pick_removed: int, with_open: bool, pick: int, queue: str,
                                       value: bytes, keyed: bool) -> None:
        gone_queue, gone_id = self.removed[pick_removed % len(self.removed)]
        stale = tx(self.fresh("stale"), [(queue, [value])], [(gone_queue, [gone_id])])
        writes = []
        victim = None
        if with_open and self.open:
            victim = self.pick_open(pick)
            writes.append(victim.write())
        writes.append(stale)
        u = unit(*writes, key=self.fresh("key") if keyed else None)
        outcomes = self.apply_batch([u])
        assert outcomes == (UnitOutcome("rejected", self.index, reason="items_missing",
                                        missing_item_ids=(gone_id,)),)
        self.rejected.append((u, self.index, "items_missing"))
        if victim is not None:
            self.finish(victim)  # the client is told its commit was rejected

    @precondition(lambda self: self.rejected)
    @rule(pick=st.integers(0, 999))
    def retry_rejected_commit(self, pick: int) -> None:
        u, index, reason = self.rejected[pick % len(self.rejected)]
        (outcome,) = self.apply_batch([u])
        assert (outcome.status, outcome.index, outcome.reason) == ("rejected", index, reason)

    # ------------------------------------------------------------ leadership and time
    @rule(advance=st.integers(0, 5000))
    def new_leader(self, advance: int) -> None:
        self.term += 1
        self.now += advance
        assert self.apply(encode(Barrier(self.term, self.now))) == BarrierResult(self.term)
        # the deposed leader's transactions linger there; the new leader starts with no locks
        self.zombies.update(self.open)
        self.open = {}
        self.locks = {}

    @precondition(lambda self: self.zombies)
    @rule(picks=st.lists(PICK, min_size=1, max_size=3), keyed=st.booleans(), retry=st.none() | st.integers(0, 999))
    def deposed_leader_commit(self, picks: list[int], keyed: bool, retry: int | None) -> None:
        tids = list(self.zombies)
        first = self.zombies[tids[picks[0] % len(tids)]]
        chosen = {}
        for pick in picks:
            z = self.zombies[tids[pick % len(tids)]]
            if z.term == first.term:
                chosen[z.tid] = z
        units = [unit(z.write(), key=self.fresh("key") if keyed else None) for z in chosen.values()]
        expected = [UnitOutcome("rejected", self.index + 1, reason="stale_leader")] * len(units)
        if retry is not None and self.committed:
            u, index = self.committed[retry % len(self.committed)]
            units.append(u)
            expected.append(UnitOutcome("duplicate", index))
        assert list(self.apply_batch(units, term=first.term)) == expected
        for tid in chosen:
            del self.zombies[tid]
        for u, outcome in zip(units, expected, strict=True):
            if outcome.status == "rejected":
                self.rejected.append((u, outcome.index, "stale_leader"))

    @rule(garbage=st.sampled_from(MALFORMED))
    def malformed_entry(self, garbage: Any) -> None:
        before = replicated_state(self.sm, "last_index")
        result = self.apply(garbage)
        assert isinstance(result, ApplyFailed) and result.reason == "malformed_command"
        assert replicated_state(self.sm, "last_index") == before
        assert self.sm.last_index == self.index

    @rule(via=st.sampled_from(["json", "pickle", "direct"]))
    def restart_from_snapshot(self, via: str) -> None:
        meta = self.sm.snapshot_meta()
        assert_plain_meta(meta)
        restored = restored_copy(self.sm, via)
        assert observable(restored, QUEUE_NAMES, self.transaction_ids, self.keys) == \
            observable(self.sm, QUEUE_NAMES, self.transaction_ids, self.keys)
        self.restored = restored

    # ------------------------------------------------------------ invariants
    @invariant()
    def queues_match_the_model(self) -> None:
        if not hasattr(self, "sm"):
            return
        sm = self.sm
        assert sm.queue_names() == sorted(self.model)
        for queue in QUEUE_NAMES:
            expected = self.model.get(queue, [])
            ids = [i for i, _ in expected]
            assert sm.item_ids(queue) == ids
            assert sm.values(queue, ids) == [v for _, v in expected]
            assert sm.count(queue) == len(expected)
            if queue in self.model:
                assert sm.queue_stats(queue) == {
                    "count": len(expected), "bytes": sum(len(v) for _, v in expected),
                    "cost_bytes": sum(len(v) + sm_module.ITEM_OVERHEAD_BYTES for _, v in expected),
                    "enqueued_total": self.enqueued_total[queue],
                    "dequeued_total": self.dequeued_total[queue], "purged_total": 0, "delayed": 0,
                    "dead_lettered_total": 0, "dropped_total": 0, "expired_total": 0, "rejected_total": 0,
                    "max_deliveries_total": 0, "redriven_total": 0}
            else:
                assert sm.queue_stats(queue) is None
        assert sm.snapshot_meta()["next_item_id"] == self.next_id
        assert sm.last_index == self.index and sm.barrier_term == self.term

    @invariant()
    def every_item_is_in_exactly_one_place(self) -> None:
        if not hasattr(self, "sm"):
            return
        where: dict[int, str] = {}
        for queue, item_id, _ in self.sm.snapshot_items():
            assert item_id not in where, f"item {item_id} in {where[item_id]} and {queue}"
            where[item_id] = queue
            assert 0 < item_id < self.next_id
        for item_id, queue in where.items():
            assert [q for q in QUEUE_NAMES if self.sm.contains(q, item_id)] == [queue]
        for _, item_id in self.removed:
            assert item_id not in where
        # the leader's locks only ever point at items still in the replicated state
        assert set(self.locks) <= set(where)

    @invariant()
    def replicas_agree(self) -> None:
        if not hasattr(self, "sm"):
            return
        digest = self.sm.digest()
        assert self.twin.digest() == digest
        if self.restored is not None:
            assert self.restored.digest() == digest


QueueModel.TestCase.settings = settings(max_examples=150, stateful_step_count=50, deadline=None,
                                        derandomize=True, suppress_health_check=list(HealthCheck))
TestQueueModel = QueueModel.TestCase


# ====================================================================== random command sequences
SEQ_TX_IDS = st.sampled_from([f"t{i}" for i in range(10)])
SEQ_QUEUES = st.sampled_from(["a", "b", "c", "d"])
seq_transactions = st.builds(
    TransactionWrite,
    transaction_id=SEQ_TX_IDS,
    enqueues=st.lists(st.tuples(SEQ_QUEUES, st.lists(st.binary(max_size=3), max_size=3).map(tuple)),
                      max_size=2).map(tuple),
    dequeues=st.lists(st.tuples(SEQ_QUEUES, st.lists(st.integers(1, 15), min_size=1, max_size=2).map(tuple)),
                      max_size=2).map(tuple),
)
seq_units = st.builds(CommitUnit, transactions=st.lists(seq_transactions, min_size=1, max_size=2).map(tuple),
                      idempotency_key=st.none() | st.sampled_from(["k1", "k2", "k3", "k4"]))
seq_limits = st.none() | st.builds(Limits, storage_bytes_max=st.integers(1, 2000),
                                   queue_items_max=st.integers(1, 8), queue_bytes_max=st.integers(1, 900))
seq_commands = st.one_of(
    st.builds(CommitBatch, term=st.integers(0, 3), now_ms=st.integers(0, 200),
              units=st.lists(seq_units, min_size=1, max_size=3).map(tuple), limits=seq_limits).map(encode),
    st.builds(Barrier, term=st.integers(0, 3), now_ms=st.integers(0, 200)).map(encode),
    st.builds(QueueChange, term=st.integers(0, 3), now_ms=st.integers(0, 200), queue=SEQ_QUEUES,
              action=st.sampled_from(QUEUE_ACTIONS), max_items=st.none() | st.integers(1, 6),
              max_bytes=st.none() | st.integers(1, 900)).map(encode),
    st.sampled_from(MALFORMED),
)
SEQ_KEYS = ["k1", "k2", "k3", "k4"]
SEQ_TIDS = [f"t{i}" for i in range(10)]
SMALL_LIMITS = {"OUTCOMES_MAX": 4, "IDEMPOTENCY_KEYS_MAX": 2, "IDEMPOTENCY_RETENTION_MS": 60, "QUEUES_MAX": 3,
                "OUTCOME_RETENTION_MS": 120, "OUTCOME_RETENTION_MIN_MS": 40, "IDEMPOTENCY_RETENTION_MIN_MS": 20}


def with_limits(limits: dict[str, int]) -> pytest.MonkeyPatch:
    mp = pytest.MonkeyPatch()
    for name, value in limits.items():
        mp.setattr(sm_module, name, value)
    return mp


@pytest.mark.parametrize("limits", [{}, SMALL_LIMITS], ids=["default_limits", "small_limits"])
@FAST
@given(commands=st.lists(seq_commands, max_size=25))
def test_two_machines_fed_the_same_commands_give_identical_results_and_digests(limits, commands):
    mp = with_limits(limits)
    try:
        a, b = QueueStateMachine(), QueueStateMachine()
        for index, raw in enumerate(commands, start=1):
            result = a.apply(raw, index)
            assert b.apply(raw, index) == result
            assert a.digest() == b.digest()
        assert observable(a, (), SEQ_TIDS, SEQ_KEYS) == observable(b, (), SEQ_TIDS, SEQ_KEYS)
    finally:
        mp.undo()


@pytest.mark.parametrize("limits", [{}, SMALL_LIMITS], ids=["default_limits", "small_limits"])
@FAST
@given(before=st.lists(seq_commands, max_size=25), after=st.lists(seq_commands, max_size=15),
       junk=st.lists(seq_commands, max_size=3), via=st.sampled_from(["json", "pickle", "direct"]))
def test_a_restored_snapshot_matches_the_original_and_evolves_identically(limits, before, after, junk, via):
    mp = with_limits(limits)
    try:
        original = QueueStateMachine()
        for index, raw in enumerate(before, start=1):
            original.apply(raw, index)
        meta = original.snapshot_meta()
        assert_plain_meta(meta)
        json.dumps(meta)  # JSON-friendly as it is
        target = QueueStateMachine()
        for index, raw in enumerate(junk, start=1):  # restore discards whatever was there
            target.apply(raw, index)
        restored = restored_copy(original, via, into=target)
        assert restored.digest() == original.digest()
        assert observable(restored, (), SEQ_TIDS, SEQ_KEYS) == observable(original, (), SEQ_TIDS, SEQ_KEYS)
        assert list(restored.snapshot_items()) == list(original.snapshot_items())
        for index, raw in enumerate(after, start=original.last_index + 1):
            assert restored.apply(raw, index) == original.apply(raw, index)
            assert restored.digest() == original.digest()
        assert observable(restored, (), SEQ_TIDS, SEQ_KEYS) == observable(original, (), SEQ_TIDS, SEQ_KEYS)
    finally:
        mp.undo()


@FAST
@given(commands=st.lists(seq_commands, max_size=25), garbage=st.lists(
    st.recursive(st.none() | st.integers() | st.text(max_size=3) | st.binary(max_size=3) | st.booleans(),
                 lambda c: st.lists(c, max_size=4).map(tuple), max_leaves=12), max_size=5))
def test_apply_never_raises_and_garbage_changes_nothing_but_last_index(commands, garbage):
    sm = QueueStateMachine()
    index = 0
    for raw in commands:
        index += 1
        sm.apply(raw, index)
    before = replicated_state(sm, "last_index")
    for raw in garbage:
        index += 1
        result = sm.apply(raw, index)
        if isinstance(result, ApplyFailed) and result.reason == "unreadable_entry":
            break  # a newer format (a string kind this version lacks): the node stops here
        if isinstance(result, ApplyFailed):
            assert result.reason == "malformed_command"
            assert replicated_state(sm, "last_index") == before
        before = replicated_state(sm, "last_index")
