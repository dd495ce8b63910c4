"""The cluster's identity in the core (feature level 2): the 'identity' entry, set once, kept in a
format-4 snapshot, written by nobody at level 1, and left out of the data digest."""

from __future__ import annotations

from typing import Any

from rcq.server.core.commands import COMMAND_VERSION, KIND_IDENTITY, SetIdentity, SetIdentityResult, SetLevel, decode, encode
from rcq.server.core.state_machine import QueueStateMachine
from rcq.server.raft.backup_child import data_digest
from tests.helpers.state import Node

FIRST = "0b6f8a51-2c1d-4e8f-9a7b-3c5d6e7f8091"
SECOND = "7e2d4c1b-5a6f-4b3e-8d9c-0a1b2c3d4e5f"


def set_identity(node: Node, cluster_id: str, term: int | None = None) -> Any:
    return node.apply_raw(encode(SetIdentity(node.term if term is None else term, node.now_ms, cluster_id)))


def at_level_2() -> Node:
    node = Node()
    node.apply_raw(encode(SetLevel(node.term, node.now_ms, 2, "0.2.0")))
    return node


def test_an_identity_entry_gives_the_cluster_its_identity():
    node = at_level_2()
    assert node.sm.cluster_id is None
    assert set_identity(node, FIRST) == SetIdentityResult("done", FIRST)
    assert node.sm.cluster_id == FIRST


def test_a_second_identity_is_ignored_whatever_its_term():
    node = at_level_2()
    set_identity(node, FIRST)
    node.barrier(7)
    assert set_identity(node, SECOND, term=7) == SetIdentityResult("ignored", FIRST)
    assert set_identity(node, SECOND, term=1) == SetIdentityResult("ignored", FIRST)
    assert node.sm.cluster_id == FIRST


def test_a_level_1_cluster_takes_no_identity_and_its_snapshot_has_none():
    node = Node()
    node.enqueue("q", b"x")
    assert set_identity(node, FIRST) == SetIdentityResult("rejected", None, reason="level_too_low")
    meta = node.sm.snapshot_meta()
    assert node.sm.cluster_id is None and meta["format"] == 3 and "cluster_id" not in meta


def test_at_level_2_before_an_identity_the_snapshot_has_no_cluster_id():
    meta = at_level_2().sm.snapshot_meta()
    assert meta["format"] == 4 and "cluster_id" not in meta


def test_the_identity_goes_through_a_snapshot():
    node = at_level_2()
    node.enqueue("q", b"x")
    set_identity(node, FIRST)
    meta = node.sm.snapshot_meta()
    assert (meta["format"], meta["cluster_id"]) == (4, FIRST)
    restored = QueueStateMachine()
    restored.restore(meta, list(node.sm.snapshot_items()))
    assert restored.cluster_id == FIRST and restored.digest() == node.sm.digest()
    assert set_identity(Node(restored), SECOND).status == "ignored"


def test_the_identity_is_in_the_state_digest_but_not_the_data_digest():
    one, other = at_level_2(), at_level_2()
    for node, cluster_id in ((one, FIRST), (other, SECOND)):
        node.enqueue("q", b"x")
        set_identity(node, cluster_id)
    assert one.sm.digest() != other.sm.digest()
    assert data_digest(one.sm.snapshot_meta(), one.sm.snapshot_items()) == \
        data_digest(other.sm.snapshot_meta(), other.sm.snapshot_items())


def test_the_entry_decodes_back_and_a_bad_id_is_malformed():
    command = SetIdentity(3, 1_000, FIRST)
    assert decode(encode(command)) == command
    for bad in ("", 5, "x" * 65):
        result = Node().apply_raw((COMMAND_VERSION, KIND_IDENTITY, 1, 1, bad))
        assert result.reason == "malformed_command"
