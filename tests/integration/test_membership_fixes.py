"""H16..H18 (docs/raft-hazards.md): rcq's fixes to pysyncobj's dynamic membership, each with a
test showing what pysyncobj does without it.

Drives pysyncobj's handlers directly on one node with a real (file) journal and no tick thread.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf
from pysyncobj import pickle as pysyncobj_pickle
from pysyncobj.node import TCPNode

import rcq.server.raft.replicator  # noqa: F401  (installs the fixes on pysyncobj's SyncObj)
from rcq.server.raft import membership
from rcq.server.raft.journal import quiet_journal_open

MEMBERSHIP = bytes([2])  # pysyncobj's command type of a membership entry


def free_address() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


def make_node(journal: Path, peers: list[str], self_address: str | None = None) -> SyncObj:
    conf = SyncObjConf(autoTick=False, journalFile=str(journal), appendEntriesUseBatch=True,
                       dynamicMembershipChange=True, raftMinTimeout=300, raftMaxTimeout=600,
                       leaderFallbackTimeout=200, connectionTimeout=600)
    with quiet_journal_open():  # pysyncobj leaves the reopened journal's meta file to the GC
        return SyncObj(self_address or free_address(), peers, conf=conf)


def members(sync_obj: SyncObj) -> set[str]:
    return {str(node) for node in sync_obj.otherNodes}


def change(action: str, address: str) -> bytes:
    return MEMBERSHIP + pysyncobj_pickle.dumps([action, address, TCPNode(address)])


def append(sync_obj: SyncObj, leader: TCPNode, prev: tuple[int, int], entries: list[tuple[bytes, int, int]],
           commit_index: int = 0) -> None:
    sync_obj._SyncObj__onMessageReceived(leader, {
        "type": "append_entries", "term": 1, "commit_index": commit_index,
        "prevLogIdx": prev[0], "prevLogTerm": prev[1], "entries": entries,
    })


@pytest.fixture
def follower(tmp_path: Path) -> Iterator[tuple[SyncObj, TCPNode, Path]]:
    leader = free_address()
    sync_obj = make_node(tmp_path / "journal", [leader])
    yield sync_obj, TCPNode(leader), tmp_path / "journal"
    sync_obj.destroy()


@pytest.fixture
def leader(tmp_path: Path) -> Iterator[SyncObj]:
    peers = [free_address(), free_address()]
    sync_obj = make_node(tmp_path / "journal", peers)
    sync_obj._SyncObj__setCurrentTerm(1, sync_obj.selfNode.id)
    sync_obj._SyncObj__onBecomeLeader()
    for peer in sorted(sync_obj.otherNodes, key=str):  # both peers hold the no-op: it commits
        sync_obj._SyncObj__onMessageReceived(peer, {"type": "next_node_idx", "next_node_idx": 3,
                                                    "reset": False, "success": True})
    sync_obj.doTick(0.0)
    assert sync_obj.raftLastApplied == 2, "the no-op should be applied"
    yield sync_obj
    sync_obj.destroy()


def two_changes_at_once(sync_obj: SyncObj) -> list[int]:
    answers: list[int] = []
    for _ in range(2):
        sync_obj.addNodeToCluster(free_address(), callback=lambda _result, reason: answers.append(reason))
    sync_obj.doTick(0.0)  # the leader takes both from its queue in one tick
    return answers


def membership_entries(sync_obj: SyncObj) -> int:
    journal = sync_obj._SyncObj__raftLog
    return sum(1 for i in range(len(journal)) if journal[i][0][:1] == MEMBERSHIP)


# ------------------------------------------------------------------------------- H16
def test_h16_a_second_change_is_refused_while_the_first_is_not_committed(leader: SyncObj) -> None:
    answers = two_changes_at_once(leader)
    assert answers == [FAIL_REASON.REQUEST_DENIED], "the second change was not refused"
    assert membership_entries(leader) == 1
    assert len(leader.otherNodes) == 3


def test_h16_without_the_fix_pysyncobj_appends_both_changes(leader: SyncObj, monkeypatch: pytest.MonkeyPatch) -> None:
    for replaced in membership.REPLACED:
        monkeypatch.setattr(replaced.owner, replaced.attribute, replaced.original)
    assert two_changes_at_once(leader) == []  # nobody refused
    assert membership_entries(leader) == 2
    assert len(leader.otherNodes) == 4  # two uncommitted changes in force at once


# ------------------------------------------------------------------------------- H17
def kept_tail(follower: tuple[SyncObj, TCPNode, Path]) -> tuple[SyncObj, str]:
    """A follower with entries 2 (no-op), 3 (add a node), 4, that then gets a heartbeat naming
    only entry 2: pysyncobj undoes the change of entry 3, which H5 keeps in the log."""
    sync_obj, leader, _journal = follower
    new = free_address()
    first = (sync_obj._SyncObj__raftLog[0][1], sync_obj._SyncObj__raftLog[0][2])
    append(sync_obj, leader, first, [(b"\x01", 2, 1), (change("add", new), 3, 1), (b"\x01", 4, 1)])
    assert new in members(sync_obj)
    append(sync_obj, leader, (2, 1), [])  # a heartbeat from a leader that believes we hold up to 2
    assert [entry[1] for entry in (sync_obj._SyncObj__raftLog[i] for i in range(4))][-3:] == [2, 3, 4]
    return sync_obj, new


def test_h17_a_change_kept_in_the_log_stays_in_force(follower: tuple[SyncObj, TCPNode, Path]) -> None:
    sync_obj, new = kept_tail(follower)
    assert new in members(sync_obj), "the change of an entry still in the log was undone"


def test_h17_without_the_fix_the_kept_change_is_undone(follower: tuple[SyncObj, TCPNode, Path],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(membership, "after_append_entries", lambda sync_obj, verified: None)
    sync_obj, new = kept_tail(follower)
    assert new not in members(sync_obj)


# ------------------------------------------------------------------------------- H18
def test_h18_a_restarted_node_uses_the_membership_of_its_whole_log(tmp_path: Path) -> None:
    journal, self_address, leader = tmp_path / "journal", free_address(), TCPNode(free_address())
    sync_obj = make_node(journal, [str(leader)], self_address)
    new = free_address()
    first = (sync_obj._SyncObj__raftLog[0][1], sync_obj._SyncObj__raftLog[0][2])
    append(sync_obj, leader, first, [(b"\x01", 2, 1), (change("add", new), 3, 1)])  # not committed
    assert new in members(sync_obj)
    sync_obj.destroy()

    restarted = make_node(journal, [str(leader)], self_address)  # its configuration predates the change
    try:
        assert new not in members(restarted), "pysyncobj alone: the uncommitted change is forgotten"
        assert membership.reapply_log_changes(restarted, restarted.raftLastApplied) == 1
        assert new in members(restarted)
    finally:
        restarted.destroy()


def test_replaying_a_run_of_changes_leaves_each_node_as_its_last_change_says(
        follower: tuple[SyncObj, TCPNode, Path]) -> None:
    sync_obj, leader, _journal = follower
    a, b = free_address(), free_address()
    first = (sync_obj._SyncObj__raftLog[0][1], sync_obj._SyncObj__raftLog[0][2])
    entries: list[Any] = [(b"\x01", 2, 1), (change("add", a), 3, 1), (change("add", b), 4, 1),
                          (change("rem", a), 5, 1)]
    append(sync_obj, leader, first, entries)
    assert members(sync_obj) == {str(leader), b}
    for _ in range(2):  # whatever the view before, and however often
        membership.reapply_log_changes(sync_obj, 1)
        assert members(sync_obj) == {str(leader), b}
