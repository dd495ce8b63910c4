"""The state machine's queue features (docs/queue-features.md), by example.

Delivery counts, dead-letter queues, delays, priorities, TTL, redrive; their commands
(EnqueueOptions, QueueSettings, ItemsAction), the views a new leader starts from, and snapshots.
Commands always go in as a replica receives them: ``encode(cmd)`` tuples at explicit log indices.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import pytest

import rcq.server.core.queue as queue_module
import rcq.server.core.state_machine as sm_module
from rcq.server.core.commands import (
    COMMAND_VERSION,
    KIND_COMMIT,
    KIND_ITEMS,
    KIND_QUEUE,
    ApplyFailed,
    Barrier,
    BatchResult,
    CommitBatch,
    CommitUnit,
    EnqueuedRange,
    EnqueueOptions,
    ItemsAction,
    ItemsOutcome,
    Limits,
    MalformedCommand,
    QueueChange,
    QueueChangeResult,
    QueueSettings,
    TransactionWrite,
    decode,
    encode,
)
from rcq.server.core.queue import ItemMeta
from rcq.server.core.state_machine import QueueStateMachine, ViewSeed
from tests.helpers.state import (
    Node,
    assert_plain_meta,
    replicated_state,
    restored_copy,
    to_lists,
    tx,
    unit,
)

OVERHEAD = sm_module.ITEM_OVERHEAD_BYTES


# ====================================================================== helpers
def otx(transaction_id: str, *enqueues: tuple[str, list[bytes], EnqueueOptions | None],
        dequeue: tuple[tuple[str, tuple[int, ...]], ...] = ()) -> TransactionWrite:
    """A transaction whose enqueues carry options (None: plain)."""
    return TransactionWrite(transaction_id, enqueues=tuple((q, tuple(v)) for q, v, _ in enqueues),
                            dequeues=dequeue, enqueue_options=tuple(o for _, _, o in enqueues))


class FeatureNode(Node):
    def change(self, queue: str, action: str = "configure", *, max_items: int | None = None,
               max_bytes: int | None = None, term: int | None = None, settings: QueueSettings | None = None,
               **fields: Any) -> QueueChangeResult:
        if fields:
            assert settings is None
            settings = QueueSettings(**fields)
        result = self.apply_raw(encode(QueueChange(self.term if term is None else term, self.now_ms, queue,
                                                   action,  # type: ignore[arg-type]
                                                   max_items, max_bytes, settings)))
        assert isinstance(result, QueueChangeResult), result
        return result

    def configure(self, queue: str, **fields: Any) -> None:
        result = self.change(queue, **fields)
        assert result.status == "done", result

    def put(self, queue: str, *values: bytes, options: EnqueueOptions | None = None,
            now_ms: int | None = None, limits: Limits | None = None) -> EnqueuedRange:
        write = otx(f"put-{self.index + 1}", (queue, list(values), options))
        batch = CommitBatch(self.term, self.now_ms if now_ms is None else now_ms, (CommitUnit((write,)),), limits)
        result = self.apply_raw(encode(batch))
        assert isinstance(result, BatchResult), result
        (outcome,) = result.outcomes
        assert outcome.status == "committed", outcome
        (enqueued,) = outcome.enqueued
        return enqueued

    def act(self, action: str, queue: str, ids: Any, note: str | None = None, *, term: int | None = None,
            now_ms: int | None = None) -> ItemsOutcome:
        items_action = ItemsAction(action, queue, tuple(ids), note)  # type: ignore[arg-type]
        (outcome,) = self.acts(items_action, term=term, now_ms=now_ms)
        return outcome

    def acts(self, *actions: ItemsAction | CommitUnit, term: int | None = None, now_ms: int | None = None,
             limits: Limits | None = None) -> tuple[Any, ...]:
        batch = CommitBatch(self.term if term is None else term, self.now_ms if now_ms is None else now_ms,
                            tuple(actions), limits)
        result = self.apply_raw(encode(batch))
        assert isinstance(result, BatchResult), result
        assert len(result.outcomes) == len(actions)
        return result.outcomes

    def meta(self, queue: str, item_id: int) -> ItemMeta:
        ((meta, _),) = self.sm.item_meta(queue, [item_id])
        return meta

    def enqueued_at(self, queue: str, item_id: int) -> int | None:
        ((_, at),) = self.sm.item_meta(queue, [item_id])
        return at

    def stored_meta(self, queue: str) -> dict[int, ItemMeta]:
        return dict(self.sm._queues[queue].meta)

    def stats(self, queue: str) -> dict[str, int]:
        stats = self.sm.queue_stats(queue)
        assert stats is not None
        return stats

    def unchanged_state(self) -> Any:
        return replicated_state(self.sm, "last_index")


@pytest.fixture
def node() -> FeatureNode:
    n = FeatureNode()
    n.now_ms = 1_000
    return n


def totals(stats: dict[str, int]) -> dict[str, int]:
    return {k: v for k, v in stats.items() if k.endswith("_total") and k not in ("enqueued_total",)}


ZERO_TOTALS = {"dequeued_total": 0, "purged_total": 0, "dead_lettered_total": 0, "dropped_total": 0,
               "expired_total": 0, "rejected_total": 0, "max_deliveries_total": 0, "redriven_total": 0}


# ====================================================================== commands
def test_transactions_with_enqueue_options_round_trip_including_mixed_none():
    options = (EnqueueOptions(priority=3, delay_ms=0, ttl_ms=5), None, EnqueueOptions(),
               EnqueueOptions(priority=0, delay_ms=7, ttl_ms=None))
    write = TransactionWrite("t", enqueues=(("a", (b"1",)), ("b", (b"2", b"3")), ("c", ()), ("a", (b"4",))),
                             dequeues=(("a", (9,)),), enqueue_options=options)
    batch = CommitBatch(4, 123, (CommitUnit((write, tx("plain", [("a", [b"x"])])), "key"),),
                        Limits(10, 20, 30))
    raw = encode(batch)
    assert decode(raw) == batch
    assert decode(to_lists(raw)) == batch
    assert decode(pickle.loads(pickle.dumps(raw))) == batch
    decoded = decode(raw).units[0].transactions[0]
    assert [decoded.options_of(i) for i in range(4)] == list(options)
    # a plain transaction still travels as the three fields older versions wrote
    assert len(raw[4][0][1][1]) == 3
    assert len(raw[4][0][1][0]) == 4


def test_options_that_are_all_none_travel_as_a_plain_transaction_and_mean_the_same():
    write = TransactionWrite("t", enqueues=(("a", (b"1",)), ("b", (b"2",))), enqueue_options=(None, None))
    raw = encode(CommitBatch(1, 1, (CommitUnit((write,)),)))
    assert len(raw[4][0][1][0]) == 3
    decoded = decode(raw).units[0].transactions[0]
    assert (decoded.enqueues, decoded.dequeues) == (write.enqueues, write.dequeues)
    assert [decoded.options_of(i) for i in range(2)] == [None, None]


def test_queue_changes_with_and_without_settings_round_trip():
    full = QueueChange(2, 50, "jobs", "configure", 10, 2000,
                       QueueSettings(max_deliveries=3, dead_letter_queue="dlq", default_ttl_ms=60_000,
                                     default_delay_ms=0, max_priority=9))
    empty = QueueChange(2, 50, "jobs", "configure", settings=QueueSettings())
    bare = QueueChange(2, 50, "jobs", "purge")
    for change in (full, empty, bare):
        raw = encode(change)
        assert decode(raw) == change
        assert decode(to_lists(raw)) == change
    assert len(encode(bare)) == 8  # what older versions wrote
    assert len(encode(full)) == 9
    assert decode(encode(bare)).settings is None


@pytest.mark.parametrize("action", ["deliver", "dead_letter", "expire", "reject", "redrive"])
def test_items_actions_round_trip_inside_a_commit_batch(action):
    units = (ItemsAction(action, "q", (3, 1, 2), "why" if action == "reject" else None),
             CommitUnit((tx("t", [("q", [b"x"])]),)),
             ItemsAction(action, "other", ()))
    batch = CommitBatch(7, 99, units, Limits(1, 2, 3))
    raw = encode(batch)
    assert decode(raw) == batch
    assert decode(to_lists(raw)) == batch
    assert decode(pickle.loads(pickle.dumps(raw))) == batch


def _commit_raw(*units: Any) -> tuple[Any, ...]:
    return (COMMAND_VERSION, KIND_COMMIT, 1, 1, tuple(units))


def _tx_raw(options: Any, enqueues: Any = (("a", (b"1",)),)) -> tuple[Any, ...]:
    return (None, (("t", enqueues, (), options),))


MALFORMED_FEATURES = {
    "options_longer_than_enqueues": _commit_raw(_tx_raw(((0, None, None), (0, None, None)))),
    "options_shorter_than_enqueues": _commit_raw(_tx_raw(((1, None, None),), (("a", (b"1",)), ("b", (b"2",))))),
    "options_not_a_tuple": _commit_raw(_tx_raw(5)),
    "option_negative_priority": _commit_raw(_tx_raw(((-1, None, None),))),
    "option_bool_priority": _commit_raw(_tx_raw(((True, None, None),))),
    "option_negative_delay": _commit_raw(_tx_raw(((0, -1, None),))),
    "option_zero_ttl": _commit_raw(_tx_raw(((0, None, 0),))),
    "option_float_ttl": _commit_raw(_tx_raw(((0, None, 1.5),))),
    "option_two_fields": _commit_raw(_tx_raw(((0, None),))),
    "transaction_six_fields": _commit_raw((None, (("t", (), (), (), (), ()),))),
    "unknown_item_action": _commit_raw((KIND_ITEMS, "explode", "q", (1,), None)),
    "queue_action_as_item_action": _commit_raw((KIND_ITEMS, "purge", "q", (1,), None)),
    "wrong_items_kind": _commit_raw(("things", "deliver", "q", (1,), None)),
    "note_not_str": _commit_raw((KIND_ITEMS, "reject", "q", (1,), 7)),
    "note_bytes": _commit_raw((KIND_ITEMS, "reject", "q", (1,), b"why")),
    "item_queue_not_str": _commit_raw((KIND_ITEMS, "deliver", None, (1,), None)),
    "item_ids_not_a_tuple": _commit_raw((KIND_ITEMS, "deliver", "q", 1, None)),
    "item_id_not_int": _commit_raw((KIND_ITEMS, "deliver", "q", ("1",), None)),
    "settings_too_short": (COMMAND_VERSION, KIND_QUEUE, 1, 1, "q", "configure", None, None, (None, None)),
    "settings_too_many_fields": (COMMAND_VERSION, KIND_QUEUE, 1, 1, "q", "configure", None, None,
                                 (None,) * 5, None),
    "settings_zero_max_deliveries": (COMMAND_VERSION, KIND_QUEUE, 1, 1, "q", "configure", None, None,
                                     (0, None, None, None, None)),
    "settings_negative_priority": (COMMAND_VERSION, KIND_QUEUE, 1, 1, "q", "configure", None, None,
                                   (None, None, None, None, -1)),
    "settings_negative_delay": (COMMAND_VERSION, KIND_QUEUE, 1, 1, "q", "configure", None, None,
                                (None, None, None, -5, None)),
    "settings_zero_ttl": (COMMAND_VERSION, KIND_QUEUE, 1, 1, "q", "configure", None, None,
                          (None, None, 0, None, None)),
    "settings_dlq_not_str": (COMMAND_VERSION, KIND_QUEUE, 1, 1, "q", "configure", None, None,
                             (None, 5, None, None, None)),
    "settings_not_a_tuple": (COMMAND_VERSION, KIND_QUEUE, 1, 1, "q", "configure", None, None, "settings"),
}


@pytest.mark.parametrize("raw", list(MALFORMED_FEATURES.values()), ids=list(MALFORMED_FEATURES))
def test_malformed_feature_commands_are_rejected_and_change_nothing(raw):
    with pytest.raises(MalformedCommand):
        decode(raw)
    n = FeatureNode()
    n.configure("q", max_deliveries=2)
    n.put("q", b"1")
    before = n.unchanged_state()
    result = n.apply_raw(raw, index=50)
    assert isinstance(result, ApplyFailed) and result.reason == "malformed_command"
    assert n.unchanged_state() == before


# ====================================================================== enqueue options
def test_an_enqueue_stores_absolute_times_from_its_entry_time(node):
    node.configure("a", max_priority=9)
    node.now_ms = 5_000
    enqueued = node.put("a", b"x", b"y", options=EnqueueOptions(priority=3, delay_ms=500, ttl_ms=2_000))
    assert enqueued == EnqueuedRange("a", 1, 2, priority=3, visible_at_ms=5_500, expires_at_ms=7_000)
    for item_id in (1, 2):
        assert node.meta("a", item_id) == ItemMeta(priority=3, visible_at_ms=5_500, expires_at_ms=7_000)
        assert node.enqueued_at("a", item_id) == 5_000
    # each item has its own metadata object (a delivery of one must not count for the other)
    stored = node.stored_meta("a")
    assert stored[1] is not stored[2]
    node.act("deliver", "a", [1])
    assert (node.meta("a", 1).deliveries, node.meta("a", 2).deliveries) == (1, 0)


def test_the_queue_defaults_apply_when_options_leave_them_out(node):
    node.configure("a", default_ttl_ms=1_000, default_delay_ms=100, max_priority=4)
    assert node.put("a", b"plain") == EnqueuedRange("a", 1, 1, 0, 1_100, 2_000)
    assert node.put("a", b"p", options=EnqueueOptions(priority=2)) == EnqueuedRange("a", 2, 1, 2, 1_100, 2_000)
    # delay 0 given explicitly: no delay; the default TTL still applies
    assert node.put("a", b"now", options=EnqueueOptions(delay_ms=0)) == EnqueuedRange("a", 3, 1, 0, 0, 2_000)
    # an explicit TTL and delay override the defaults
    assert node.put("a", b"own", options=EnqueueOptions(delay_ms=7, ttl_ms=9)) == \
        EnqueuedRange("a", 4, 1, 0, 1_007, 1_009)
    assert node.meta("a", 3) == ItemMeta(expires_at_ms=2_000)
    assert node.meta("a", 4) == ItemMeta(visible_at_ms=1_007, expires_at_ms=1_009)
    assert node.stats("a")["delayed"] == 3


def test_the_defaults_in_force_when_the_commit_applies_are_the_ones_used(node):
    node.configure("a", default_ttl_ms=1_000)
    node.configure("a", default_ttl_ms=50, max_priority=1)
    assert node.put("a", b"x", options=EnqueueOptions(priority=3)) == EnqueuedRange("a", 1, 1, 1, 0, 1_050)


def test_a_priority_over_max_priority_is_clamped_when_the_commit_applies(node):
    node.configure("a", max_priority=5)
    assert node.put("a", b"x", options=EnqueueOptions(priority=9)).priority == 5
    assert node.meta("a", 1).priority == 5
    # the setting shrank to none: no priorities, the item is plain
    node.configure("a", max_priority=None)
    assert node.put("a", b"y", options=EnqueueOptions(priority=9)) == EnqueuedRange("a", 2, 1)
    assert 2 not in node.stored_meta("a")


def test_plain_items_store_no_metadata(node):
    node.configure("a", max_priority=3)  # settings alone cost plain items nothing
    node.put("a", b"1")
    node.put("a", b"2", options=EnqueueOptions())
    node.put("a", b"3", options=EnqueueOptions(priority=0, delay_ms=0))
    node.put("b", b"4", options=EnqueueOptions(priority=2))  # no max_priority: clamped to 0
    node.commit_one(unit(otx("mixed", ("a", [b"5"], None), ("b", [b"6", b"7"], EnqueueOptions(delay_ms=0)))))
    assert node.sm.count("a") == 4 and node.sm.count("b") == 3
    assert node.stored_meta("a") == {} and node.stored_meta("b") == {}
    assert node.sm.snapshot_meta()["item_meta"] == []
    for item_id in node.sm.item_ids("a"):
        assert node.meta("a", item_id) == ItemMeta()


def test_options_apply_per_enqueue_of_a_transaction(node):
    node.configure("a", max_priority=9)
    (outcome,) = node.acts(CommitUnit((otx("t", ("a", [b"1", b"2"], EnqueueOptions(priority=4)),
                                             ("b", [b"3"], None),
                                             ("a", [b"4"], EnqueueOptions(ttl_ms=10))),)))
    assert outcome.enqueued == (EnqueuedRange("a", 1, 2, 4), EnqueuedRange("b", 3, 1),
                                EnqueuedRange("a", 4, 1, 0, 0, 1_010))
    assert sorted(node.stored_meta("a")) == [1, 2, 4]
    assert node.stored_meta("b") == {}


def test_an_entry_with_an_older_clock_does_not_move_time_back(node):
    node.configure("a", default_delay_ms=100)
    node.barrier(1, now_ms=10_000)
    assert node.sm.now_ms == 10_000
    enqueued = node.put("a", b"x", options=EnqueueOptions(ttl_ms=50), now_ms=2_000)
    assert node.sm.now_ms == 10_000
    assert (enqueued.visible_at_ms, enqueued.expires_at_ms) == (10_100, 10_050)
    assert node.enqueued_at("a", enqueued.first_item_id) == 10_000


# ====================================================================== enqueue times
def test_enqueue_times_are_a_step_function_of_ids(node):
    expected: dict[int, int] = {}
    for now in (100, 100, 250, 250, 250, 400, 900):
        enqueued = node.put("a", b"v", b"w", now_ms=now)
        expected.update({enqueued.first_item_id: now, enqueued.first_item_id + 1: now})
    assert {i: node.enqueued_at("a", i) for i in expected} == expected
    assert node.sm._queues["a"].time_boundaries() == ([1, 5, 11, 13], [100, 250, 400, 900])
    assert restored_copy(node.sm, "json").item_meta("a", list(expected)) == node.sm.item_meta("a", list(expected))


def test_enqueue_times_survive_pruning_as_the_head_moves(node, monkeypatch):
    monkeypatch.setattr(queue_module, "_TIMES_COMPACT_AT", 3)  # compaction happens in this test
    expected: dict[int, int] = {}
    for step in range(12):
        enqueued = node.put("a", b"x", b"y", now_ms=1_000 + 10 * step)
        node.put("b", b"other", now_ms=1_000 + 10 * step)  # ids of the queue are not consecutive
        expected[enqueued.first_item_id] = expected[enqueued.first_item_id + 1] = 1_000 + 10 * step
    ids = node.sm.item_ids("a")
    for done, item_id in enumerate(ids):
        node.commit_one(unit(tx(f"take{item_id}", dequeue=[("a", [item_id])])), now_ms=2_000 + done)
        rest = ids[done + 1:]
        assert [node.enqueued_at("a", i) for i in rest] == [expected[i] for i in rest]
        boundary_ids, _boundary_ms = node.sm._queues["a"].time_boundaries()
        if rest:
            assert boundary_ids[0] <= rest[0] and (len(boundary_ids) == 1 or boundary_ids[1] > rest[0])
            assert len(boundary_ids) == len({expected[i] for i in rest})
            assert restored_copy(node.sm).item_meta("a", rest) == node.sm.item_meta("a", rest)
    # emptied: one boundary is kept (the next entry may share its time), and new items get theirs
    assert node.sm._queues["a"].time_boundaries()[1] == [1_110]
    enqueued = node.put("a", b"z", now_ms=1_110)  # stamped earlier than the state machine's time
    assert node.enqueued_at("a", enqueued.first_item_id) == node.sm.now_ms == 2_000 + len(ids) - 1
    node.put("a", b"z2")
    node.commit_one(unit(tx("take-z", dequeue=[("a", [enqueued.first_item_id])])))
    assert node.sm._queues["a"].time_boundaries()[1] == [node.sm.now_ms]


def test_many_entries_at_one_time_add_one_boundary(node):
    node.now_ms = 777
    node.configure("dlq")
    node.configure("a", dead_letter_queue="dlq")
    for i in range(200):
        node.put("a", b"x", b"y")
        if i % 5 == 0:
            node.act("reject", "a", [node.sm.item_ids("a")[-1]])
        if i % 3 == 0:
            node.commit_one(unit(tx(f"t{i}", dequeue=[("a", [node.sm.item_ids("a")[0]])])))
    for name in ("a", "dlq"):
        queue = node.sm._queues[name]
        assert len(queue._times_ms) == len(queue._times_ids) == 1
        assert queue.time_boundaries()[1] == [777]
    assert {at for _, at in node.sm.item_meta("a", node.sm.item_ids("a"))} == {777}


def test_a_moved_item_is_enqueued_at_the_time_of_its_move(node):
    node.configure("dlq")
    node.configure("a", dead_letter_queue="dlq")
    node.put("a", b"x", now_ms=1_000)
    outcome = node.act("reject", "a", [1], now_ms=3_000)
    (moved,) = outcome.moved
    assert node.enqueued_at("dlq", moved.first_item_id) == 3_000
    redriven = node.act("redrive", "dlq", [moved.first_item_id], now_ms=4_000).moved[0]
    assert node.enqueued_at("a", redriven.first_item_id) == 4_000


# ====================================================================== settings
def test_a_bad_dead_letter_queue_is_rejected_and_changes_nothing(node):
    node.configure("a")
    node.configure("b", dead_letter_queue="a")
    node.configure("c", dead_letter_queue="b")
    node.put("a", b"1")
    cases = [
        ("a", QueueSettings(dead_letter_queue="a"), "dead_letter_queue_self"),
        ("a", QueueSettings(dead_letter_queue="nope"), "dead_letter_queue_unknown"),
        ("new", QueueSettings(dead_letter_queue="new"), "dead_letter_queue_self"),
        ("new", QueueSettings(dead_letter_queue="nope"), "dead_letter_queue_unknown"),
        ("a", QueueSettings(dead_letter_queue="b"), "dead_letter_queue_cycle"),  # a -> b -> a
        ("a", QueueSettings(dead_letter_queue="c"), "dead_letter_queue_cycle"),  # a -> c -> b -> a
        ("b", QueueSettings(dead_letter_queue="c"), "dead_letter_queue_cycle"),  # b -> c -> b
        ("a", QueueSettings(max_deliveries=1001), "max_deliveries_out_of_range"),
        ("a", QueueSettings(max_priority=256), "max_priority_out_of_range"),
        ("new", QueueSettings(max_priority=1000), "max_priority_out_of_range"),
    ]
    for queue, settings, reason in cases:
        before = node.unchanged_state()
        digest_inputs = (node.sm.queue_names(), [node.sm.queue_features(q) for q in ("a", "b", "c")])
        result = node.change(queue, max_items=5, settings=settings)
        assert result == QueueChangeResult("rejected", queue, "configure", reason=reason), (queue, settings)
        assert node.unchanged_state() == before
        assert (node.sm.queue_names(), [node.sm.queue_features(q) for q in ("a", "b", "c")]) == digest_inputs
    assert node.sm.queue_names() == ["a", "b", "c"]
    assert node.sm.queue_settings("a") == (None, None)


def test_valid_settings_at_their_bounds_are_accepted(node):
    node.configure("dlq")
    node.configure("a", max_items=1, max_bytes=1, max_deliveries=1000, dead_letter_queue="dlq",
                   default_ttl_ms=1, default_delay_ms=0, max_priority=255)
    assert node.sm.queue_features("a") == QueueSettings(1000, "dlq", 1, 0, 255)
    assert node.sm.queue_settings("a") == (1, 1)
    node.configure("a", max_deliveries=1, max_priority=0)
    assert node.sm.queue_features("a") == QueueSettings(max_deliveries=1, max_priority=0)
    # a chain without a cycle: dlq -> dlq2 is fine while a -> dlq
    node.configure("a", dead_letter_queue="dlq")
    node.configure("dlq2")
    node.configure("dlq", dead_letter_queue="dlq2")
    assert node.sm.dead_letter_users("dlq") == ["a"]
    assert node.sm.dead_letter_users("dlq2") == ["dlq"]


def test_configure_replaces_every_setting(node):
    node.configure("dlq")
    node.configure("a", max_items=3, max_deliveries=2, dead_letter_queue="dlq", max_priority=2)
    node.configure("a", default_ttl_ms=10)
    assert node.sm.queue_features("a") == QueueSettings(default_ttl_ms=10)
    assert node.sm.queue_settings("a") == (None, None)
    assert node.sm.dead_letter_users("dlq") == []


def test_a_queue_in_use_as_a_dead_letter_queue_cannot_be_deleted_until_released(node):
    node.configure("dlq")
    node.configure("a", dead_letter_queue="dlq")
    node.configure("b", dead_letter_queue="dlq")
    node.put("dlq", b"x")
    before = node.unchanged_state()
    assert node.change("dlq", "delete") == QueueChangeResult("rejected", "dlq", "delete", reason="queue_in_use")
    assert node.unchanged_state() == before
    # purging it is fine
    assert node.change("dlq", "purge") == QueueChangeResult("done", "dlq", "purge", removed=1)
    node.configure("a")
    assert node.change("dlq", "delete").reason == "queue_in_use"  # b still uses it
    node.configure("b", max_deliveries=3)
    assert node.change("dlq", "delete") == QueueChangeResult("done", "dlq", "delete")
    assert node.sm.queue_names() == ["a", "b"]
    # and a queue that uses a dead-letter queue can itself be deleted
    node.configure("dlq")
    node.configure("a", dead_letter_queue="dlq")
    assert node.change("a", "delete").status == "done"
    assert node.change("dlq", "delete").status == "done"


def test_a_stale_leaders_configure_is_fenced(node):
    node.barrier(3)
    before = node.unchanged_state()
    result = node.change("a", term=2, max_deliveries=2)
    assert result == QueueChangeResult("rejected", "a", "configure", reason="stale_leader")
    assert node.unchanged_state() == before


def test_purge_and_delete_forget_item_metadata_and_times(node):
    node.configure("a", max_priority=3, default_ttl_ms=100)
    node.put("a", b"x", b"y", options=EnqueueOptions(priority=2))
    assert node.change("a", "purge").removed == 2
    assert node.stored_meta("a") == {}
    assert node.sm._queues["a"].time_boundaries() == ([], [])
    assert node.stats("a")["purged_total"] == 2
    node.put("a", b"z", options=EnqueueOptions(priority=1))
    assert node.change("a", "delete").removed == 1
    assert node.sm.snapshot_meta()["item_meta"] == []
    assert node.sm.table_sizes()["items"] == 0 and node.sm.storage_cost == 0


# ====================================================================== deliver and dead letters
def test_deliver_counts_deliveries_and_answers_the_counts(node):
    node.configure("a", max_deliveries=3)
    node.put("a", b"1", b"2", b"3")
    assert node.act("deliver", "a", [1, 2]) == ItemsOutcome("done", node.index, "deliver", "a", acted=(1, 2),
                                                           counts=(1, 1))
    # the same id twice counts once; an absent id is ignored
    outcome = node.act("deliver", "a", [2, 2, 99, 1])
    assert (outcome.acted, outcome.counts, outcome.removed) == ((2, 1), (2, 2), ())
    assert [node.meta("a", i).deliveries for i in (1, 2, 3)] == [2, 2, 0]
    assert node.sm.count("a") == 3
    assert sorted(node.stored_meta("a")) == [1, 2]


def test_a_deliver_at_the_limit_moves_the_item_to_the_dead_letter_queue(node):
    node.configure("dlq")
    node.configure("a", max_deliveries=2, dead_letter_queue="dlq", max_priority=9)
    node.put("a", b"poison", b"fine", options=EnqueueOptions(priority=7, ttl_ms=60_000))
    node.act("deliver", "a", [1, 2])
    assert node.act("deliver", "a", [1]).counts == (2,)
    before = (node.sm.table_sizes(), node.sm.storage_cost)
    outcome = node.act("deliver", "a", [1, 2], now_ms=2_000)
    assert outcome == ItemsOutcome("done", node.index, "deliver", "a", acted=(2,), counts=(2,), dead=(1,),
                                   removed=(1,), moved=(EnqueuedRange("dlq", 3, 1, 7),))
    assert node.sm.item_ids("a") == [2] and node.sm.item_ids("dlq") == [3]
    assert node.sm.values("dlq", [3]) == [b"poison"]
    assert node.meta("dlq", 3) == ItemMeta(priority=7, dead_reason="max_deliveries", dead_source="a",
                                           dead_deliveries=2)
    assert (node.sm.table_sizes(), node.sm.storage_cost) == before
    assert totals(node.stats("a")) == {**ZERO_TOTALS, "dead_lettered_total": 1, "max_deliveries_total": 1}
    assert totals(node.stats("dlq")) == ZERO_TOTALS
    assert node.stats("dlq")["enqueued_total"] == 1
    assert (node.stats("a")["bytes"], node.stats("dlq")["bytes"]) == (4, 6)


def test_a_deliver_at_the_limit_without_a_dead_letter_queue_drops_the_item(node):
    node.configure("a", max_deliveries=1)
    node.put("a", b"12345", b"ok")
    node.act("deliver", "a", [1])
    outcome = node.act("deliver", "a", [1])
    assert (outcome.acted, outcome.dead, outcome.removed, outcome.moved) == ((), (1,), (1,), ())
    assert node.sm.item_ids("a") == [2]
    assert node.sm.table_sizes()["items"] == 1 and node.sm.table_sizes()["item_bytes"] == 2
    assert node.sm.storage_cost == 2 + OVERHEAD
    assert totals(node.stats("a")) == {**ZERO_TOTALS, "dropped_total": 1, "max_deliveries_total": 1}
    assert node.stored_meta("a") == {}


def test_dead_letter_acts_only_on_items_at_the_limit(node):
    node.configure("dlq")
    node.configure("a", max_deliveries=2, dead_letter_queue="dlq")
    node.put("a", b"1", b"2", b"3")
    node.act("deliver", "a", [1, 2])
    node.act("deliver", "a", [1])
    outcome = node.act("dead_letter", "a", [1, 2, 3, 42])
    assert (outcome.acted, outcome.removed, outcome.counts) == ((1,), (1,), ())
    assert outcome.moved == (EnqueuedRange("dlq", 4, 1),)
    assert node.sm.item_ids("a") == [2, 3]
    # a lowered limit puts more items at it
    node.configure("a", max_deliveries=1, dead_letter_queue="dlq")
    assert node.act("dead_letter", "a", [2, 3]).acted == (2,)
    # without a limit, nothing is ever at it
    node.act("deliver", "a", [3])
    node.configure("a")
    assert node.act("dead_letter", "a", [3]).acted == ()
    assert node.stats("a")["max_deliveries_total"] == 2


def test_expire_acts_only_on_items_past_their_expiry_at_the_entry_time(node):
    node.configure("a", default_ttl_ms=1_000)
    node.put("a", b"1", b"2", now_ms=1_000)  # expire at 2000
    node.put("a", b"3", options=EnqueueOptions(ttl_ms=5_000), now_ms=1_000)  # at 6000
    node.put("a", b"forever", options=EnqueueOptions(ttl_ms=None), now_ms=1_000)  # default: 2000
    node.configure("a")
    node.put("a", b"never", now_ms=1_000)
    everything = node.sm.item_ids("a")
    assert node.act("expire", "a", everything, now_ms=1_999).acted == ()
    outcome = node.act("expire", "a", [2, 5], now_ms=2_000)
    assert (outcome.acted, outcome.removed, outcome.moved) == ((2,), (2,), ())
    # an entry stamped earlier does not take time back: the state machine's time is 2000
    assert node.act("expire", "a", [1, 3, 4], now_ms=0).acted == (1, 4)
    assert node.sm.now_ms == 2_000
    assert node.act("expire", "a", [3, 5], now_ms=100_000).acted == (3,)
    assert node.sm.item_ids("a") == [5]
    assert totals(node.stats("a")) == {**ZERO_TOTALS, "expired_total": 4, "dropped_total": 4}


def test_an_expired_item_goes_to_the_dead_letter_queue_with_its_deliveries(node):
    node.configure("dlq", default_ttl_ms=500)
    node.configure("a", dead_letter_queue="dlq", default_ttl_ms=10, max_deliveries=5)
    node.put("a", b"x")
    node.act("deliver", "a", [1])
    (moved,) = node.act("expire", "a", [1], now_ms=1_010).moved
    assert moved == EnqueuedRange("dlq", 2, 1, 0, 0, 1_510)
    assert node.meta("dlq", 2) == ItemMeta(expires_at_ms=1_510, dead_reason="expired", dead_source="a",
                                           dead_deliveries=1)
    assert totals(node.stats("a")) == {**ZERO_TOTALS, "expired_total": 1, "dead_lettered_total": 1}


def test_a_dead_letter_queue_of_a_dead_letter_queue_receives_what_dies_there(node):
    node.configure("dlq2")
    node.configure("dlq", dead_letter_queue="dlq2", default_ttl_ms=100)
    node.configure("a", dead_letter_queue="dlq")
    node.put("a", b"x")
    node.act("reject", "a", [1], "bad")
    assert node.act("expire", "dlq", [2], now_ms=1_100).moved == (EnqueuedRange("dlq2", 3, 1),)
    assert node.meta("dlq2", 3) == ItemMeta(dead_reason="expired", dead_source="dlq")
    # redrive from the last one goes back to its direct source
    assert node.act("redrive", "dlq2", [3]).moved == (EnqueuedRange("dlq", 4, 1, 0, 0, 1_200),)
    assert node.meta("dlq", 4) == ItemMeta(expires_at_ms=1_200)


def test_reject_moves_items_at_once_with_the_note(node):
    node.configure("dlq")
    node.configure("a", dead_letter_queue="dlq", max_deliveries=10)
    node.configure("b")
    node.put("a", b"1", b"2")
    node.put("b", b"3")
    node.act("deliver", "a", [2])
    outcome = node.act("reject", "a", [2, 3, 1], "malformed json")
    assert (outcome.acted, outcome.removed) == ((2, 1), (2, 1))
    assert outcome.moved == (EnqueuedRange("dlq", 4, 1), EnqueuedRange("dlq", 5, 1))
    assert node.sm.item_meta("dlq", [4, 5]) == [
        (ItemMeta(dead_reason="rejected", dead_source="a", dead_deliveries=1, dead_note="malformed json"), 1_000),
        (ItemMeta(dead_reason="rejected", dead_source="a", dead_deliveries=0, dead_note="malformed json"), 1_000)]
    assert node.sm.values("dlq", [4, 5]) == [b"2", b"1"]
    # without a dead-letter queue a rejected item is dropped; a note is optional
    assert node.act("reject", "b", [3]).removed == (3,)
    assert totals(node.stats("a")) == {**ZERO_TOTALS, "rejected_total": 2, "dead_lettered_total": 2}
    assert totals(node.stats("b")) == {**ZERO_TOTALS, "rejected_total": 1, "dropped_total": 1}
    assert node.sm.table_sizes()["items"] == 2


def test_the_note_of_other_actions_is_not_kept(node):
    node.configure("dlq")
    node.configure("a", dead_letter_queue="dlq", max_deliveries=1, default_ttl_ms=5)
    node.put("a", b"1", b"2")
    node.act("deliver", "a", [1])
    node.act("dead_letter", "a", [1], "note")
    node.act("expire", "a", [2], "note", now_ms=5_000)
    assert [m.dead_note for m, _ in node.sm.item_meta("dlq", node.sm.item_ids("dlq"))] == [None, None]


def test_redrive_sends_dead_items_back_to_their_sources(node):
    node.configure("dlq")
    node.configure("a", dead_letter_queue="dlq", max_deliveries=1, max_priority=9, default_ttl_ms=10_000)
    node.configure("b", dead_letter_queue="dlq", max_priority=2)
    node.put("a", b"a1", options=EnqueueOptions(priority=6))  # 1
    node.put("b", b"b1", options=EnqueueOptions(priority=2))  # 2
    node.put("dlq", b"plain")  # 3: an ordinary item of the dead-letter queue
    node.act("deliver", "a", [1])
    assert node.act("deliver", "a", [1]).moved == (EnqueuedRange("dlq", 4, 1, 6),)
    node.act("reject", "b", [2], "no")  # 5
    assert [m.priority for m, _ in node.sm.item_meta("dlq", [4, 5])] == [6, 2]
    node.configure("a", dead_letter_queue="dlq", max_deliveries=1, max_priority=4, default_ttl_ms=10_000)
    assert node.act("deliver", "dlq", [4, 4]).counts == (1,)  # delivered from the dead-letter queue too
    before = (node.sm.table_sizes(), node.sm.storage_cost)
    outcome = node.act("redrive", "dlq", [3, 5, 4, 77], now_ms=3_000)
    assert outcome == ItemsOutcome("done", node.index, "redrive", "dlq", acted=(5, 4), removed=(5, 4),
                                   moved=(EnqueuedRange("b", 6, 1, 2), EnqueuedRange("a", 7, 1, 4, 0, 13_000)))
    assert node.sm.item_ids("dlq") == [3]
    assert node.meta("a", 7) == ItemMeta(priority=4, expires_at_ms=13_000)  # kept, clamped; deliveries 0
    assert node.meta("b", 6) == ItemMeta(priority=2)
    assert (node.sm.table_sizes(), node.sm.storage_cost) == before
    assert totals(node.stats("dlq")) == {**ZERO_TOTALS, "redriven_total": 2}
    assert node.stats("a")["enqueued_total"] == 2
    # redriven items are ordinary items again: a second redrive finds nothing
    assert node.act("redrive", "a", [7]).acted == ()


def test_a_dead_item_keeps_its_priority_in_a_dead_letter_queue_without_priorities(node):
    """docs/queue-features.md: dead items keep their priority; redrive gives it back (clamped)."""
    node.configure("dlq")  # no max_priority
    node.configure("a", dead_letter_queue="dlq", max_priority=9)
    node.put("a", b"x", options=EnqueueOptions(priority=5))
    (moved,) = node.act("reject", "a", [1]).moved
    assert node.meta("dlq", moved.first_item_id).priority == 5
    (back,) = node.act("redrive", "dlq", [moved.first_item_id]).moved
    assert back.priority == 5
    assert node.meta("a", back.first_item_id) == ItemMeta(priority=5)


def test_dead_items_lists_what_redrive_may_move(node):
    node.configure("dlq")
    node.configure("a", dead_letter_queue="dlq")
    node.configure("b", dead_letter_queue="dlq")
    node.put("a", b"1", b"2")
    node.put("b", b"3")
    node.put("dlq", b"ordinary")  # 4
    node.act("reject", "a", [1, 2])  # 5, 6
    node.act("reject", "b", [3])  # 7
    assert node.sm.dead_items("dlq", 100) == [(5, "a"), (6, "a"), (7, "b")]
    assert node.sm.dead_items("dlq", 2) == [(5, "a"), (6, "a")]
    assert node.sm.dead_items("dlq", 100, source_queue="b") == [(7, "b")]
    assert node.sm.dead_items("dlq", 100, exclude={5}) == [(6, "a"), (7, "b")]
    assert node.sm.dead_items("a", 100) == node.sm.dead_items("ghost", 100) == []
    node.act("redrive", "dlq", [4, 5, 6, 7])
    assert node.sm.dead_items("dlq", 100) == []
    assert node.sm.item_ids("dlq") == [4]


def test_a_redriven_plain_item_stores_no_metadata(node):
    node.configure("dlq")
    node.configure("a", dead_letter_queue="dlq")
    node.put("a", b"x")
    node.act("reject", "a", [1])
    node.act("redrive", "dlq", [2])
    assert node.sm.item_ids("a") == [3]
    assert node.stored_meta("a") == {} and node.stored_meta("dlq") == {}


def test_moves_into_a_full_dead_letter_queue_are_not_refused(node):
    limits = Limits(storage_bytes_max=10_000, queue_items_max=1_000, queue_bytes_max=10_000)
    node.configure("dlq", max_items=1, max_bytes=1)
    node.configure("a", dead_letter_queue="dlq", max_deliveries=1)
    node.put("a", b"1", b"2", b"3", limits=limits)
    node.act("reject", "a", [1])
    assert node.sm.count("dlq") == 1
    outcomes = node.acts(ItemsAction("reject", "a", (2,)), ItemsAction("deliver", "a", (3,)),
                         ItemsAction("deliver", "a", (3,)), limits=limits)
    assert [o.status for o in outcomes] == ["done"] * 3
    assert node.sm.count("dlq") == 3 and node.sm.count("a") == 0
    # an ordinary enqueue into it is still refused by its own limits
    write = CommitUnit((tx("more", [("dlq", [b"4"])]),))
    (refused,) = node.acts(write, limits=limits)
    assert (refused.status, refused.reason, refused.queue) == ("rejected", "queue_full", "dlq")
    # even when the whole storage budget is used up
    tight = Limits(storage_bytes_max=1, queue_items_max=1, queue_bytes_max=1)
    node.put("a", b"5", limits=limits)
    assert node.acts(ItemsAction("reject", "a", (node.sm.item_ids("a")[0],)), limits=tight)[0].moved


def test_a_committed_dequeue_of_an_item_with_metadata_forgets_it(node):
    node.configure("a", max_priority=3, max_deliveries=4)
    node.put("a", b"x", b"y", options=EnqueueOptions(priority=1, ttl_ms=99))
    node.act("deliver", "a", [1])
    node.commit_one(unit(tx("take", dequeue=[("a", [1])])))
    assert sorted(node.stored_meta("a")) == [2]
    assert node.act("deliver", "a", [1]) == ItemsOutcome("done", node.index, "deliver", "a")


def test_actions_on_an_unknown_queue_or_too_many_items(node, monkeypatch):
    assert node.act("deliver", "ghost", [1]) == ItemsOutcome("done", node.index, "deliver", "ghost")
    assert node.sm.queue_names() == []
    monkeypatch.setattr(sm_module, "ITEM_ACTION_IDS_MAX", 3)
    node.configure("a")
    node.put("a", b"1", b"2", b"3", b"4")
    before = node.unchanged_state()
    outcome = node.act("reject", "a", [1, 2, 3, 4])
    assert (outcome.status, outcome.reason) == ("rejected", "too_many_items")
    assert node.unchanged_state() == before
    assert node.act("reject", "a", [1, 2, 3]).acted == (1, 2, 3)


def test_a_stale_leaders_item_actions_are_fenced(node):
    node.configure("dlq")
    node.configure("a", dead_letter_queue="dlq", max_deliveries=1, default_ttl_ms=1)
    node.put("a", b"1", b"2", b"3")
    node.act("deliver", "a", [1])
    node.act("reject", "a", [3])
    node.barrier(2, now_ms=5_000)
    before = node.unchanged_state()
    outcomes = node.acts(*(ItemsAction(kind, queue, ids) for kind, queue, ids in [
        ("deliver", "a", (1, 2)), ("dead_letter", "a", (1,)), ("expire", "a", (1, 2)), ("reject", "a", (2,)),
        ("redrive", "dlq", (4,))]), term=1)
    assert outcomes == tuple(ItemsOutcome("rejected", node.index, kind, queue, reason="stale_leader")
                             for kind, queue in [("deliver", "a"), ("dead_letter", "a"), ("expire", "a"),
                                                 ("reject", "a"), ("redrive", "dlq")])
    assert node.unchanged_state() == before
    assert node.act("expire", "a", [1, 2], term=2).acted == (1, 2)


def test_items_actions_and_commits_in_one_entry_apply_in_order(node):
    node.configure("a", max_deliveries=1)
    node.put("a", b"1", b"2")
    outcomes = node.acts(ItemsAction("deliver", "a", (1, 2)),
                         CommitUnit((tx("take", dequeue=[("a", [1])]),)),
                         ItemsAction("deliver", "a", (1, 2)))
    assert outcomes[0].counts == (1, 1)
    assert outcomes[1].status == "committed"
    assert (outcomes[2].acted, outcomes[2].dead) == ((), (2,))
    assert node.sm.count("a") == 0
    assert node.stats("a")["dequeued_total"] == 1 and node.stats("a")["dropped_total"] == 1


# ====================================================================== views
def test_view_seed_groups_items_for_a_new_leader(node):
    node.configure("dlq")
    node.configure("a", max_priority=9, max_deliveries=2, dead_letter_queue="dlq")
    node.put("a", b"1", b"2")  # 1, 2: plain
    node.put("a", b"3", b"4", options=EnqueueOptions(priority=5))  # 3, 4
    node.put("a", b"5", options=EnqueueOptions(delay_ms=500, priority=3))  # 5: delayed until 1500
    node.put("a", b"6", options=EnqueueOptions(ttl_ms=700))  # 6: expiring at 1700
    node.put("a", b"7")  # 7
    node.put("a", b"8", options=EnqueueOptions(priority=5))  # 8
    node.act("deliver", "a", [2, 4, 4])
    node.act("deliver", "a", [4])  # 4 is at the limit
    node.commit_one(unit(tx("take", dequeue=[("a", [7])])))
    seed = node.sm.view_seed("a")
    assert seed == ViewSeed(ranges={0: [(1, 3), (6, 7)], 5: [(3, 4), (8, 9)]},
                            delayed=[(1_500, 5, 3)], expiring=[(1_700, 6)], deliveries={2: 1, 4: 2},
                            at_limit=[4])
    assert node.stats("a")["delayed"] == 1
    # time passes: the delayed item is visible
    node.barrier(1, now_ms=1_500)
    assert node.sm.view_seed("a").ranges == {0: [(1, 3), (6, 7)], 3: [(5, 6)], 5: [(3, 4), (8, 9)]}
    assert node.sm.view_seed("a").delayed == []
    assert node.stats("a")["delayed"] == 0
    assert node.sm.view_seed("ghost") == ViewSeed({}, [], [], {}, [])
    assert restored_copy(node.sm, "json").view_seed("a") == node.sm.view_seed("a")


# ====================================================================== snapshots
def _featureful_node() -> FeatureNode:
    """Every kind of metadata: priorities, delays, TTLs, deliveries, dead items of every reason, notes."""
    n = FeatureNode()
    n.now_ms = 1_000
    n.configure("dlq", default_ttl_ms=90_000, max_priority=3, max_items=50)
    n.configure("a", max_deliveries=2, dead_letter_queue="dlq", max_priority=9, default_ttl_ms=60_000,
                default_delay_ms=10, max_bytes=10_000)
    n.configure("b", dead_letter_queue="dlq")
    n.put("a", b"p1", b"p2", options=EnqueueOptions(priority=4))
    n.put("a", b"plain", options=EnqueueOptions(delay_ms=0, ttl_ms=None))
    n.now_ms = 2_000
    n.put("a", b"late", options=EnqueueOptions(delay_ms=5_000, ttl_ms=9_000))
    n.put("b", b"b1", b"b2", b"b3")
    n.put("c", b"")
    n.act("deliver", "a", [1, 2])
    n.act("deliver", "a", [1])
    n.act("dead_letter", "a", [1])
    n.act("reject", "b", [7], "bad input")
    n.now_ms = 70_000
    n.act("expire", "a", [3])
    n.act("redrive", "dlq", [n.sm.item_ids("dlq")[0]])
    n.commit_one(unit(tx("take", dequeue=[("b", [6])])))
    n.act("reject", "b", [8])
    return n


def test_snapshot_round_trip_keeps_every_kind_of_metadata():
    n = _featureful_node()
    sm = n.sm
    reasons = {m.dead_reason for m, _ in sm.item_meta("dlq", sm.item_ids("dlq"))}
    assert reasons == {"expired", "rejected"}
    meta = sm.snapshot_meta()
    assert meta["format"] == 3
    assert_plain_meta(meta)
    names = sm.queue_names()
    for via in ("json", "pickle", "direct"):
        restored = restored_copy(sm, via)
        assert restored.digest() == sm.digest(), via
        for name in names:
            ids = sm.item_ids(name)
            assert restored.item_ids(name) == ids
            assert restored.item_meta(name, ids) == sm.item_meta(name, ids)
            assert restored.queue_stats(name) == sm.queue_stats(name)
            assert restored.queue_features(name) == sm.queue_features(name)
            assert restored.queue_settings(name) == sm.queue_settings(name)
            assert restored.view_seed(name) == sm.view_seed(name)
            assert restored._queues[name].meta == sm._queues[name].meta
        assert restored.table_sizes() == sm.table_sizes()
        assert restored.storage_cost == sm.storage_cost
        assert restored.dead_letter_users("dlq") == ["a", "b"]
        # and both evolve alike
        follow = [
            encode(CommitBatch(1, 80_000, (ItemsAction("deliver", "a", tuple(sm.item_ids("a"))),
                                           ItemsAction("redrive", "dlq", tuple(sm.item_ids("dlq"))),
                                           CommitUnit((otx("more", ("a", [b"n"], EnqueueOptions(priority=2))),))))),
            encode(CommitBatch(1, 200_000, (ItemsAction("expire", "a", tuple(range(1, 30))),
                                            ItemsAction("deliver", "a", tuple(range(1, 30))),
                                            ItemsAction("deliver", "a", tuple(range(1, 30)))))),
            encode(QueueChange(1, 200_000, "dlq", "purge")),
        ]
        twin = restored_copy(sm)
        for offset, raw in enumerate(follow, start=1):
            assert restored.apply(raw, sm.last_index + offset) == twin.apply(raw, sm.last_index + offset)
            assert restored.digest() == twin.digest()


def test_snapshot_round_trip_through_lmdb_keeps_every_kind_of_metadata(tmp_path: Path):
    from rcq.server.raft import snapshots

    sm = _featureful_node().sm
    path = tmp_path / "snapshot.lmdb"
    snapshots.write_snapshot(path, sm, ("raft",))
    restored = QueueStateMachine()
    assert snapshots.read_snapshot(path, restored) == ("raft",)
    assert restored.digest() == sm.digest()
    for name in sm.queue_names():
        ids = sm.item_ids(name)
        assert restored.item_meta(name, ids) == sm.item_meta(name, ids)
        assert restored.view_seed(name) == sm.view_seed(name)
        assert restored.queue_stats(name) == sm.queue_stats(name)


def test_the_digest_sees_metadata_settings_and_totals():
    base = _featureful_node()
    digest = base.sm.digest()
    changed = [
        lambda n: n.act("deliver", "a", [n.sm.item_ids("a")[-1]]),
        lambda n: n.configure("c", max_priority=1),
        lambda n: n.act("reject", "c", n.sm.item_ids("c")),
    ]
    for change in changed:
        n = FeatureNode(restored_copy(base.sm))
        n.now_ms = base.sm.now_ms
        twin = FeatureNode(restored_copy(base.sm))
        twin.apply_raw(encode(Barrier(1, base.sm.now_ms)))
        assert twin.sm.digest() != digest  # last_index moved
        change(n)
        assert n.sm.digest() != twin.sm.digest()


def _as_format_2(meta: dict[str, Any]) -> dict[str, Any]:
    """What a node of the previous version wrote: no settings, totals, enqueue times or item metadata."""
    old = {k: v for k, v in meta.items() if k != "item_meta"}
    old["format"] = 2
    old["queues"] = [row[:6] for row in meta["queues"]]
    return old


def test_a_format_2_snapshot_still_restores():
    n = FeatureNode()
    n.now_ms = 1_000
    n.put("a", b"1", b"2")
    n.put("b", b"3")
    n.commit_one(unit(tx("take", dequeue=[("a", [1])])))
    n.apply_raw(encode(QueueChange(1, 1_000, "b", "configure", 5, None)))
    old = _as_format_2(n.sm.snapshot_meta())
    restored = QueueStateMachine()
    restored.restore(json.loads(json.dumps(old)), iter(list(n.sm.snapshot_items())))
    assert restored.item_ids("a") == [2] and restored.values("a", [2]) == [b"2"]
    assert restored.queue_settings("b") == (5, None)
    assert restored.queue_features("b") == QueueSettings()
    assert restored.queue_stats("a") == n.sm.queue_stats("a")
    # enqueue times are unknown for items of the old version, known for the new ones
    assert restored.item_meta("a", [2]) == [(ItemMeta(), None)]
    node = FeatureNode(restored)
    node.now_ms = 4_000
    node.configure("a", max_priority=2)
    enqueued = node.put("a", b"new", options=EnqueueOptions(priority=1))
    assert node.sm.item_meta("a", [2, enqueued.first_item_id]) == [(ItemMeta(), None), (ItemMeta(priority=1), 4_000)]
    assert restored_copy(node.sm, "json").digest() == node.sm.digest()


def test_a_format_1_snapshot_still_restores():
    n = FeatureNode()
    n.put("a", b"1", b"2")
    meta = n.sm.snapshot_meta()
    old = {k: v for k, v in meta.items() if k not in ("item_meta", "outcomes_forgotten_term")}
    old["format"] = 1
    old["queues"] = [row[:3] for row in meta["queues"]]
    restored = QueueStateMachine()
    restored.restore(old, iter(list(n.sm.snapshot_items())))
    assert restored.item_ids("a") == [1, 2]
    assert restored.queue_features("a") == QueueSettings()
