"""H5 (docs/raft-hazards.md): a follower keeps log entries that match a repeated append_entries (pysyncobj deleted them).

Drives pysyncobj's message handler directly on a follower with a real (file) journal and no
tick thread, with the messages a leader sends when it re-sends entries it already sent.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from pysyncobj import SyncObj, SyncObjConf
from pysyncobj.node import TCPNode

import rcq.server.raft.replicator  # noqa: F401  (installs the fixes on pysyncobj's SyncObj)
from tests.helpers.raft import free_port


@pytest.fixture
def follower(tmp_path: Path):
    conf = SyncObjConf(autoTick=False, journalFile=str(tmp_path / "journal"), appendEntriesUseBatch=True)
    leader_address = f"127.0.0.1:{free_port()}"
    sync_obj = SyncObj(f"127.0.0.1:{free_port()}", [leader_address], conf=conf)
    yield sync_obj, TCPNode(leader_address)
    sync_obj.destroy()


def log_of(sync_obj: SyncObj) -> list[tuple[int, int]]:
    journal = sync_obj._SyncObj__raftLog
    return [(entry[1], entry[2]) for entry in (journal[i] for i in range(len(journal)))]


def append(sync_obj: SyncObj, leader: TCPNode, term: int, prev: tuple[int, int], entries: list[tuple[int, int]]) -> None:
    sync_obj._SyncObj__onMessageReceived(leader, {
        "type": "append_entries", "term": term, "commit_index": 0,
        "prevLogIdx": prev[0], "prevLogTerm": prev[1],
        "entries": [(b"\x00", index, entry_term) for index, entry_term in entries],
    })


def test_a_repeated_append_keeps_the_entries_the_follower_already_has(follower):
    sync_obj, leader = follower
    first = log_of(sync_obj)[0]
    append(sync_obj, leader, 1, first, [(2, 1), (3, 1), (4, 1)])
    assert log_of(sync_obj)[-3:] == [(2, 1), (3, 1), (4, 1)]
    append(sync_obj, leader, 1, first, [(2, 1)])  # the leader re-sends from an older nextIndex
    assert log_of(sync_obj)[-3:] == [(2, 1), (3, 1), (4, 1)], "matching entries were truncated"


def test_a_conflicting_entry_is_deleted_with_everything_after_it(follower):
    sync_obj, leader = follower
    first = log_of(sync_obj)[0]
    append(sync_obj, leader, 1, first, [(2, 1), (3, 1), (4, 1)])
    append(sync_obj, leader, 2, (2, 1), [(3, 2)])  # a new leader's entry 3 differs
    assert log_of(sync_obj)[-2:] == [(2, 1), (3, 2)]
    append(sync_obj, leader, 2, (3, 2), [(4, 2), (5, 2)])
    assert log_of(sync_obj)[-4:] == [(2, 1), (3, 2), (4, 2), (5, 2)]
