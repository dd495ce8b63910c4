"""Item headers in the core (feature level 2): the commit entry's optional field, the apply, the
snapshot (format 4 only), the digest, moves (dead letters, redrive) and what headers cost."""

from __future__ import annotations

import pickle
from typing import Any

import pytest

from rcq.server.core.commands import (
    BatchResult,
    CommitBatch,
    CommitUnit,
    EnqueueOptions,
    Headers,
    ItemsAction,
    Limits,
    SetLevel,
    TransactionWrite,
    decode,
    encode,
)
from rcq.server.core.ledger import HEADER_OVERHEAD_BYTES, HEADERS_ITEM_OVERHEAD_BYTES, headers_bytes, item_cost
from rcq.server.core.state_machine import QueueStateMachine
from tests.helpers.state import Node, replicated_state, restored_copy

TRACE: Headers = (("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),)
TENANT: Headers = (("tenant", "acme"), ("content-type", "application/json"))


def htx(transaction_id: str, queue: str, values: tuple[bytes, ...], headers: tuple[Headers | None, ...] | None,
        options: EnqueueOptions | None = None) -> TransactionWrite:
    return TransactionWrite(transaction_id, enqueues=((queue, values),),
                            enqueue_options=(options,) if options is not None else (),
                            enqueue_headers=(headers,) if headers is not None else ())


class HeaderNode(Node):
    def put(self, queue: str, values: tuple[bytes, ...], headers: tuple[Headers | None, ...] | None,
            options: EnqueueOptions | None = None, limits: Limits | None = None) -> Any:
        write = htx(f"put-{self.index + 1}", queue, values, headers, options)
        result = self.apply_raw(encode(CommitBatch(self.term, self.now_ms, (CommitUnit((write,)),), limits)))
        assert isinstance(result, BatchResult), result
        (outcome,) = result.outcomes
        return outcome

    def act(self, action: str, queue: str, *ids: int, note: str | None = None) -> Any:
        result = self.apply_raw(encode(CommitBatch(self.term, self.now_ms, (
            ItemsAction(action, queue, ids, note),))))  # type: ignore[arg-type]
        assert isinstance(result, BatchResult), result
        return result.outcomes[0]

    def headers(self, queue: str, item_id: int) -> Headers | None:
        ((meta, _),) = self.sm.item_meta(queue, [item_id])
        return meta.headers


@pytest.fixture
def node() -> HeaderNode:
    n = HeaderNode()
    n.now_ms = 1_000
    n.apply_raw(encode(SetLevel(n.term, n.now_ms, 2, "0.2.0")))
    return n


# ------------------------------------------------------------------ the entry
def test_a_transaction_without_headers_is_encoded_as_level_1_wrote_it():
    plain = TransactionWrite("t", enqueues=(("q", (b"a",)),))
    assert encode(CommitBatch(1, 1, (CommitUnit((plain,)),)))[4][0][1][0] == ("t", (("q", (b"a",)),), ())
    with_options = TransactionWrite("t", enqueues=(("q", (b"a",)),), enqueue_options=(EnqueueOptions(1),))
    assert len(encode(CommitBatch(1, 1, (CommitUnit((with_options,)),)))[4][0][1][0]) == 4
    # Headers given as "none for any item" are no headers: the shape stays the old one.
    no_headers = TransactionWrite("t", enqueues=(("q", (b"a",)),), enqueue_headers=(None,))
    assert len(encode(CommitBatch(1, 1, (CommitUnit((no_headers,)),)))[4][0][1][0]) == 3


def test_headers_travel_as_a_fifth_field_and_decode_back_with_and_without_options():
    for write in (htx("t", "q", (b"a", b"b"), (TRACE, None)),
                  htx("t", "q", (b"a",), (TENANT,), EnqueueOptions(0, None, 5_000))):
        raw = encode(CommitBatch(1, 1, (CommitUnit((write,)),)))
        (encoded,) = raw[4][0][1]
        assert len(encoded) == 5
        back = decode(pickle.loads(pickle.dumps(raw)))
        assert back.units[0].transactions[0] == write  # type: ignore[union-attr]


@pytest.mark.parametrize("fifth", [
    (((("k", "v"),), (("k", "v"),)),),  # two items' headers for one item
    ((("k", "v"),), (("k", "v"),)),  # headers for two enqueues, there is one
    ((((1, "v"),),),),  # a key that is not a string
    (((("k", b"v"),),),),  # a value that is not a string
    (((("k",),),),),  # a pair of one
    5,
], ids=["too_many_items", "too_many_enqueues", "int_key", "bytes_value", "short_pair", "not_a_tuple"])
def test_malformed_headers_are_rejected_and_change_nothing(node, fifth):
    before = replicated_state(node.sm, "last_index")
    raw = (1, "commit", 1, 1, ((None, (("t", (("q", (b"a",)),), (), (), fifth),)),))
    result = node.apply_raw(raw)
    assert result.reason == "malformed_command"  # type: ignore[union-attr]
    assert replicated_state(node.sm, "last_index") == before


# ------------------------------------------------------------------ apply and state
def test_headers_are_kept_per_item_and_plain_items_store_nothing(node):
    outcome = node.put("q", (b"a", b"b", b"c"), (TRACE, None, TENANT))
    assert outcome.status == "committed"
    first = outcome.enqueued[0].first_item_id
    assert [node.headers("q", first + i) for i in range(3)] == [TRACE, None, TENANT]
    assert sorted(node.sm._queues["q"].meta) == [first, first + 2]  # the plain one has no metadata
    node.put("q", (b"d",), None)
    assert len(node.sm._queues["q"].meta) == 2


def test_empty_headers_are_no_headers(node):
    outcome = node.put("q", (b"a",), ((),))
    assert node.headers("q", outcome.enqueued[0].first_item_id) is None
    assert node.sm._queues["q"].meta == {}


def test_headers_count_in_bytes_cost_and_storage_and_leave_with_the_item(node):
    value_bytes = 3
    expected = value_bytes + headers_bytes(TENANT)
    assert headers_bytes(TENANT) == HEADERS_ITEM_OVERHEAD_BYTES + 2 * HEADER_OVERHEAD_BYTES + len(
        "tenantacmecontent-typeapplication/json")
    outcome = node.put("q", (b"abc",), (TENANT,))
    stats = node.sm.queue_stats("q")
    assert stats["bytes"] == expected and stats["cost_bytes"] == item_cost(1, expected)
    assert node.sm.storage_cost == item_cost(1, expected)
    item_id = outcome.enqueued[0].first_item_id
    result = node.apply_raw(encode(CommitBatch(node.term, node.now_ms, (CommitUnit((
        TransactionWrite("d", dequeues=(("q", (item_id,)),)),)),))))
    assert result.outcomes[0].status == "committed"  # type: ignore[union-attr]
    assert node.sm.queue_stats("q")["bytes"] == 0 and node.sm.storage_cost == 0


def test_headers_can_take_a_queue_past_its_byte_limit(node):
    room = item_cost(1, 3 + headers_bytes(TENANT)) - 1
    limits = Limits(10**9, 10**6, room)
    assert node.put("q", (b"abc",), None, limits=limits).status == "committed"  # the value alone fits
    node2 = HeaderNode()
    refused = node2.put("q", (b"abc",), (TENANT,), limits=limits)
    assert (refused.status, refused.reason) == ("rejected", "queue_full")
    storage = Limits(room, 10**6, 10**9)
    refused = node2.put("q", (b"abc",), (TENANT,), limits=storage)
    assert (refused.status, refused.reason) == ("rejected", "storage_full")


def test_dead_letters_and_redrive_keep_headers_and_bytes(node):
    node.apply_raw(encode(_configure(node, "dlq")))
    node.apply_raw(encode(_configure(node, "q", dead_letter_queue="dlq", max_deliveries=1)))
    outcome = node.put("q", (b"a", b"b", b"c"), (TRACE, TENANT, None), EnqueueOptions(0, None, 500))
    first = outcome.enqueued[0].first_item_id
    bytes_before = node.sm.storage_cost
    rejected = node.act("reject", "q", first, note="bad")
    (moved,) = rejected.moved
    assert node.headers("dlq", moved.first_item_id) == TRACE
    node.act("deliver", "q", first + 1)
    dead = node.act("dead_letter", "q", first + 1)
    assert node.headers("dlq", dead.moved[0].first_item_id) == TENANT
    node.now_ms += 1_000
    expired = node.act("expire", "q", first + 2)
    assert node.headers("dlq", expired.moved[0].first_item_id) is None
    assert node.sm.storage_cost == bytes_before  # moves add nothing, take nothing
    assert node.sm.queue_stats("dlq")["bytes"] == 3 + headers_bytes(TRACE) + headers_bytes(TENANT)
    redriven = node.act("redrive", "dlq", moved.first_item_id, dead.moved[0].first_item_id)
    assert [node.headers("q", r.first_item_id) for r in redriven.moved] == [TRACE, TENANT]
    assert node.sm.queue_stats("q")["bytes"] == 2 + headers_bytes(TRACE) + headers_bytes(TENANT)
    assert node.sm.storage_cost == bytes_before


def _configure(node: HeaderNode, queue: str, **settings: Any) -> Any:
    from rcq.server.core.commands import QueueChange, QueueSettings
    return QueueChange(node.term, node.now_ms, queue, "configure", settings=QueueSettings(**settings))


# ------------------------------------------------------------------ snapshots and digest
def test_a_snapshot_keeps_headers_in_format_4_and_the_restored_state_is_the_same(node):
    node.put("q", (b"a", b"b"), (TRACE, None), EnqueueOptions(0, None, 60_000))
    node.put("p", (b"c",), (TENANT,))
    meta = node.sm.snapshot_meta()
    assert meta["format"] == 4
    assert [fields[8] for _, _, fields in meta["item_meta"] if len(fields) == 9] == [TENANT, TRACE]
    for via in ("pickle", "json"):
        restored = restored_copy(node.sm, via)
        assert restored.digest() == node.sm.digest(), via
        assert restored.item_meta("q", [1])[0][0].headers == TRACE
        assert restored.storage_cost == node.sm.storage_cost
        assert restored.queue_stats("p") == node.sm.queue_stats("p")


def test_replicas_that_apply_the_same_entries_have_the_same_digest():
    entries = [encode(SetLevel(1, 1, 2, "0.2.0")),
               encode(CommitBatch(1, 2, (CommitUnit((htx("t", "q", (b"a", b"b"), (TRACE, TENANT)),)),)))]
    machines = [QueueStateMachine(), QueueStateMachine()]
    for machine in machines:
        for index, raw in enumerate(entries, start=1):
            machine.apply(pickle.loads(pickle.dumps(raw)), index)
    assert machines[0].digest() == machines[1].digest()
    other = QueueStateMachine()
    other.apply(entries[0], 1)
    other.apply(encode(CommitBatch(1, 2, (CommitUnit((htx("t", "q", (b"a", b"b"), (TRACE, None)),)),))), 2)
    assert other.digest() != machines[0].digest()  # headers are part of the state


def test_a_level_1_snapshot_without_headers_is_format_3_as_before():
    node = HeaderNode()
    node.put("q", (b"a",), None, EnqueueOptions(1, None, 5_000))
    meta = node.sm.snapshot_meta()
    assert meta["format"] == 3 and all(len(fields) == 8 for _, _, fields in meta["item_meta"])
