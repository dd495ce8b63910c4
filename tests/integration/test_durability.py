"""durability=fsync on a real node (ticks driven by the test): nothing is acknowledged or counted
before it is synced, and a failed sync stops the node instead of acknowledging.

See docs/raft-hazards.md, H8, and rcq/server/raft/wal.py.
"""

from __future__ import annotations

import errno
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from rcq.errors import Unavailable
from rcq.server.core.state_machine import QueueStateMachine
from rcq.server.raft import patches
from rcq.server.raft.internals import journal_of, transport_of
from rcq.server.raft.replicator import RaftReplicator
from rcq.server.raft.wal import DurableJournal
from tests.helpers.manual_raft import ManualRaft, config_of


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[tuple[ManualRaft, DurableJournal, list[tuple[Any, ...]]]]:
    replicator = RaftReplicator(config_of(tmp_path / "node"), QueueStateMachine(), auto_tick=False)
    await replicator.start()
    try:
        raft = ManualRaft(replicator)
        journal = journal_of(raft.sync_obj)
        assert isinstance(journal, DurableJournal), "durability=fsync is the default"
        sent: list[tuple[Any, ...]] = []
        transport = transport_of(raft.sync_obj)
        real_send = transport.send

        def recording_send(peer: Any, message: dict[str, Any]) -> Any:
            sent.append((message.get("type"), message.get("success"), journal.dirty))
            return real_send(peer, message)

        transport.send = recording_send
        yield raft, journal, sent
    finally:
        await replicator.stop()


def append_from_a_leader(raft: ManualRaft, term: int = 1) -> None:
    first_index, first_term = raft.log()[0]
    raft.receive(raft.peers[0], {"type": "append_entries", "term": term, "commit_index": 0,
                                 "prevLogIdx": first_index, "prevLogTerm": first_term,
                                 "entries": [(b"\x00", first_index + 1, term), (b"\x00", first_index + 2, term)]})


def acknowledgements(sent: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    return [s for s in sent if s[0] == "next_node_idx" and s[1]]


async def test_a_follower_syncs_its_log_before_it_acknowledges(node):
    raft, journal, sent = node
    syncs_before = journal.syncs
    append_from_a_leader(raft)
    assert acknowledgements(sent), "the follower did not acknowledge"
    assert all(not dirty for _type, _success, dirty in acknowledgements(sent)), "acknowledged before syncing"
    assert journal.syncs == syncs_before + 1, "one sync for the message's entries"


async def test_without_the_sync_an_acknowledgement_would_leave_unsynced(node, monkeypatch):
    """Teeth: with the sync removed, the same message is acknowledged while the log is unsynced."""
    monkeypatch.setattr(patches, "_sync_journal", lambda sync_obj: None)
    raft, _journal, sent = node
    append_from_a_leader(raft)
    assert any(dirty for _type, _success, dirty in acknowledgements(sent))


async def test_a_leader_syncs_what_it_appends_before_it_counts_itself(node):
    raft, journal, _sent = node
    raft.become_leader(5)  # appends its no-op
    assert not journal.dirty, "the leader's no-op was not synced"
    raft.replicator._consumer.apply_command(("not", "a", "command"), callback=lambda result, error: None)
    log_end = raft.log()[-1][0]
    await raft.step()  # the tick picks the command up and appends it
    assert raft.log()[-1][0] == log_end + 1
    assert not journal.dirty, "an appended command was left unsynced after the tick"


async def test_a_failed_sync_stops_the_node_and_acknowledges_nothing(node, monkeypatch):
    raft, _journal, sent = node
    failures: list[OSError] = []
    monkeypatch.setattr(raft.sync_obj, patches.ON_SYNC_FAILURE, failures.append)

    def failing_fdatasync(fd: int) -> None:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(os, "fdatasync", failing_fdatasync)
    with pytest.raises(OSError):
        append_from_a_leader(raft)
    assert [f.errno for f in failures] == [errno.EIO]
    assert acknowledgements(sent) == []


async def test_a_node_does_not_switch_durability_with_data_in_place(tmp_path: Path):
    data_dir = tmp_path / "node"
    data_dir.mkdir()
    (data_dir / "raft.journal").write_bytes(b"written with durability=os")
    replicator = RaftReplicator(config_of(data_dir), QueueStateMachine(), auto_tick=False)
    with pytest.raises(Unavailable, match=r"durability=fsync, but its data directory holds raft\.journal"):
        await replicator.start()
    await replicator.stop()


async def test_a_failed_write_full_disk_stops_the_node_and_acknowledges_nothing(node, monkeypatch):
    raft, journal, sent = node
    failures: list[OSError] = []
    monkeypatch.setattr(journal, "on_failure", failures.append)

    def full_disk(fd: int, data: bytes, offset: int) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "pwrite", full_disk)
    with pytest.raises(OSError):
        append_from_a_leader(raft)
    assert [f.errno for f in failures] == [errno.ENOSPC]
    assert acknowledgements(sent) == []
