"""Feature levels in the core: the ``level`` entry, entries of a newer format, snapshots of each
level, and the fingerprint that fails when a format changes without a new level."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

from rcq.server.core import features, snapshot_format
from rcq.server.core.commands import (
    COMMAND_VERSION,
    KIND_BARRIER,
    UNREADABLE_ENTRY,
    ApplyFailed,
    Barrier,
    CommitBatch,
    CommitUnit,
    EnqueueOptions,
    ItemsAction,
    Limits,
    MemberRecord,
    QueueChange,
    QueueSettings,
    SetIdentity,
    SetLevel,
    SetLevelResult,
    TransactionWrite,
    decode,
    encode,
)
from rcq.server.core.directory import NodePorts, PartitionChange, QueuePlacement
from rcq.server.core.features import LEVEL_BASE, LEVEL_MAX, UnreadableLevel
from rcq.server.core.state_machine import QueueStateMachine
from tests.helpers.state import Node, replicated_state

WRITER = "9.9.9"


def set_level(node: Node, level: int, term: int | None = None) -> Any:
    return node.apply_raw(encode(SetLevel(node.term if term is None else term, node.now_ms, level, WRITER)))


# ------------------------------------------------------------------ the level entry
def test_a_cluster_starts_at_the_base_level_and_a_level_entry_raises_it():
    node = Node()
    assert node.sm.level == LEVEL_BASE and node.sm.level_writer is None
    assert set_level(node, 2) == SetLevelResult("done", 2)
    assert (node.sm.level, node.sm.level_writer) == (2, WRITER)
    assert set_level(node, 2) == SetLevelResult("done", 2)  # again: nothing changes


def test_a_level_never_goes_down_and_a_deposed_leader_cannot_raise_it():
    node = Node()
    node.barrier(3)
    assert set_level(node, 2, term=2) == SetLevelResult("rejected", LEVEL_BASE, reason="stale_leader")
    assert set_level(node, 2, term=3).status == "done"
    assert set_level(node, 1, term=3) == SetLevelResult("rejected", 2, reason="level_lowered")
    assert node.sm.level == 2


def test_a_level_above_what_this_code_reads_is_unreadable_and_changes_nothing():
    node = Node()
    node.enqueue("q", b"x")
    before = replicated_state(node.sm)
    result = set_level(node, LEVEL_MAX + 1)
    assert isinstance(result, ApplyFailed) and result.reason == UNREADABLE_ENTRY
    assert result.details["level"] == LEVEL_MAX + 1 and result.details["writer_version"] == WRITER
    assert replicated_state(node.sm) == before


@pytest.mark.parametrize("raw", [
    (COMMAND_VERSION + 1, KIND_BARRIER, 9, 9),  # a newer command version
    (COMMAND_VERSION, "headers-v9", 9, 9),  # a kind this version lacks
], ids=["newer-version", "unknown-kind"])
def test_an_entry_of_a_newer_format_is_unreadable_not_skipped(raw):
    node = Node()
    node.enqueue("q", b"x")
    before = replicated_state(node.sm)
    result = node.apply_raw(raw)
    assert isinstance(result, ApplyFailed) and result.reason == UNREADABLE_ENTRY
    assert replicated_state(node.sm) == before


def test_a_malformed_entry_of_a_known_kind_is_still_only_malformed():
    result = Node().apply_raw((COMMAND_VERSION, KIND_BARRIER, "not-a-term", 9))
    assert isinstance(result, ApplyFailed) and result.reason == "malformed_command"


# ------------------------------------------------------------------ snapshots
def test_at_the_base_level_a_snapshot_is_format_3_as_rcq_0_1_wrote_it():
    node = Node()
    node.enqueue("q", b"x")
    meta = node.sm.snapshot_meta()
    assert meta["format"] == 3 and "level" not in meta and "level_writer" not in meta


def test_above_the_base_level_a_snapshot_is_format_4_and_keeps_the_level():
    node = Node()
    node.enqueue("q", b"x")
    set_level(node, 2)
    meta = node.sm.snapshot_meta()
    assert (meta["format"], meta["level"], meta["level_writer"]) == (4, 2, WRITER)
    restored = QueueStateMachine()
    restored.restore(meta, list(node.sm.snapshot_items()))
    assert (restored.level, restored.level_writer) == (2, WRITER)
    assert restored.digest() == node.sm.digest()


def test_a_snapshot_of_a_level_above_what_this_code_reads_stops_the_restore():
    node = Node()
    set_level(node, 2)
    meta = {**node.sm.snapshot_meta(), "level": LEVEL_MAX + 1}
    machine = QueueStateMachine()
    with pytest.raises(UnreadableLevel) as raised:
        machine.restore(meta, [])
    message = raised.value.explain("0.2.0")
    assert f"feature level {LEVEL_MAX + 1}" in message and "rcq 9.9.9" in message and "rcq 0.2.0" in message
    assert machine.level == LEVEL_BASE  # nothing was replaced


def test_a_snapshot_of_an_unknown_format_is_refused():
    meta = {**Node().sm.snapshot_meta(), "format": snapshot_format.SNAPSHOT_FORMAT + 1}
    with pytest.raises(ValueError, match="snapshot format"):
        QueueStateMachine().restore(meta, [])


# ------------------------------------------------------------------ the formats of each level
def sample_commands(level: int) -> list[Any]:
    """One command of every kind a cluster at ``level`` may write, with every optional field set."""
    settings = QueueSettings(max_deliveries=3, dead_letter_queue="dead", default_ttl_ms=60_000,
                             default_delay_ms=0, max_priority=5)
    commands: list[Any] = [
        Barrier(1, 1_000),
        QueueChange(1, 1_001, "dead", "configure"),
        QueueChange(1, 1_002, "q", "configure", max_items=100, max_bytes=10_000, settings=settings),
        MemberRecord(1, 1_003, "record", "n4", "127.0.0.1:9004", "http://127.0.0.1:8004"),
        CommitBatch(1, 1_004, (
            CommitUnit((TransactionWrite("t1", enqueues=(("q", (b"a", b"b")), ("q", (b"c",))),
                                         enqueue_options=(EnqueueOptions(2, 0, 5_000), None)),), "key-1"),
            CommitUnit((TransactionWrite("t2", enqueues=(("q", (b"d",)),)),)),
        ), Limits(10**9, 10**6, 10**9)),
        CommitBatch(1, 1_005, (CommitUnit((TransactionWrite("t3", dequeues=(("q", (1,)),)),)),
                               ItemsAction("deliver", "q", (2,)), ItemsAction("reject", "q", (2,), note="bad"))),
        QueueChange(1, 1_006, "q", "purge"),
    ]
    if level >= 2:
        commands.insert(1, SetLevel(1, 1_000, level, "0.2.0"))
        # The cluster's identity (level 2), kept in the snapshot's meta.
        commands.insert(2, SetIdentity(1, 1_000, "5f0c1e2a-9b7d-4c3e-8a61-2d4f7b9e0c13"))
        # Item headers (level 2): an enqueue where some items carry them, one with options too; the
        # queue is not purged, so the snapshot holds items with headers (with and without options).
        commands.append(CommitBatch(1, 1_007, (CommitUnit((TransactionWrite(
            "t4", enqueues=(("h", (b"e", b"f")), ("h", (b"g",)), ("h", (b"i",))),
            enqueue_options=(None, EnqueueOptions(0, None, 60_000), None),
            enqueue_headers=(((("traceparent", "00-1-2-01"), ("k", "v")), None), (((("k", "w"),),)), None)),)),
        ), Limits(10**9, 10**6, 10**9)))
    if level >= 3:
        # Retry keys (level 3): a unit under one is remembered in the snapshot's retry_keys.
        commands.append(CommitBatch(1, 1_008, (CommitUnit((TransactionWrite("t5", enqueues=(("q", (b"j",)),)),),
                                                          "rcq-retry:0123456789abcdef0123456789abcdef"),),
                                    Limits(10**9, 10**6, 10**9)))
    if level >= 4:
        # The partition directory (level 4): two nodes' ports, a partition of both, a queue placed in it.
        commands += [NodePorts(1, 1_009, "n1", "10.0.0.1", "http://10.0.0.1:8000", (7010, 7019), (7110, 7119)),
                     NodePorts(1, 1_009, "n2", "10.0.0.2", "http://10.0.0.2:8000", (7010, 7019), (7010, 7019)),
                     PartitionChange(1, 1_010, "create", "p1", 1, ("n1", "n2"), "n2"),
                     QueuePlacement(1, 1_011, "placed", ("p1",))]
    return commands


def formats_fingerprint(level: int) -> str:
    """A hash of what a cluster at ``level`` writes: its entries and the snapshot of their state."""
    node = Node()
    encoded = [encode(command) for command in sample_commands(level)]
    for index, raw in enumerate(encoded, start=1):
        node.sm.apply(raw, index)
    meta = node.sm.snapshot_meta()
    text = repr((encoded, sorted(meta.items()), list(node.sm.snapshot_items())))
    return hashlib.sha256(text.encode()).hexdigest()


@pytest.mark.parametrize("level", [lv.number for lv in features.LEVELS])
def test_the_formats_of_each_level_are_what_its_fingerprint_says(level):
    # Failing here: a command or snapshot format changed. A released level's formats never change:
    # add a level that writes the new format only when the cluster runs at it (docs/upgrades.md,
    # "Changing a format"), and record its fingerprint in FORMAT_FINGERPRINTS.
    assert formats_fingerprint(level) == features.FORMAT_FINGERPRINTS[level], f"the formats of level {level} changed"


def test_every_level_has_a_fingerprint_and_every_sample_command_decodes_back():
    assert sorted(features.FORMAT_FINGERPRINTS) == [lv.number for lv in features.LEVELS]
    for command in sample_commands(LEVEL_MAX):
        assert decode(encode(command)) == command
