"""DurableJournal (durability=fsync): what is synced survives, torn tails are cut, damage stops the
node, compaction loses nothing at any crash point, term and vote are durable before they count."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rcq.server.raft import files, wal
from rcq.server.raft.wal import MAGIC, DurableJournal, JournalCorrupt, read_entries


def entries(count: int, first: int = 1, term: int = 1) -> list[tuple[bytes, int, int]]:
    return [(f"command-{i}".encode(), i, term) for i in range(first, first + count)]


def journal_with(path: Path, items: list[tuple[bytes, int, int]]) -> DurableJournal:
    journal = DurableJournal(str(path))
    for item in items:
        journal.add(*item)
    journal.sync()
    return journal


def reopened(path: Path) -> list[tuple[bytes, int, int]]:
    journal = DurableJournal(str(path))
    try:
        return [journal[i] for i in range(len(journal))]
    finally:
        journal._destroy()


def test_synced_entries_are_read_back_in_order(tmp_path: Path):
    path = tmp_path / "raft.wal"
    journal = journal_with(path, entries(5))
    assert journal.syncs == 1 and not journal.dirty
    journal._destroy()
    assert reopened(path) == entries(5)


def test_one_sync_covers_every_entry_added_since_the_last(tmp_path: Path):
    journal = journal_with(tmp_path / "raft.wal", entries(3))
    for item in entries(10, first=4):
        journal.add(*item)
    assert journal.dirty
    journal.sync()
    journal.sync()  # nothing new: no second fdatasync
    assert journal.syncs == 2
    journal._destroy()


@pytest.mark.parametrize("cut_bytes", [1, 5, 9, 20])
def test_a_record_torn_at_the_end_is_dropped_and_the_rest_kept(tmp_path: Path, cut_bytes: int):
    path = tmp_path / "raft.wal"
    journal_with(path, entries(4))._destroy()
    whole = path.read_bytes()
    path.write_bytes(whole[:-cut_bytes])  # the last record was being written when the power went
    assert reopened(path) == entries(3)
    assert read_entries(str(path))[2] == len(path.read_bytes()), "the torn bytes are truncated away"


def test_a_damaged_record_with_records_after_it_stops_the_node(tmp_path: Path):
    path = tmp_path / "raft.wal"
    journal_with(path, entries(4))._destroy()
    data = bytearray(path.read_bytes())
    data[len(MAGIC) + 12] ^= 0xFF  # inside the first record's payload
    path.write_bytes(bytes(data))
    with pytest.raises(JournalCorrupt, match="damaged and more records follow"):
        DurableJournal(str(path))


@pytest.mark.parametrize("content", [b"", MAGIC[:3]])
def test_a_journal_cut_before_its_first_sync_is_an_empty_log(tmp_path: Path, content: bytes):
    path = tmp_path / "raft.wal"
    path.write_bytes(content)
    assert reopened(path) == []


def test_a_journal_of_the_other_format_is_refused(tmp_path: Path):
    path = tmp_path / "raft.wal"
    path.write_bytes(b"PYSYNCOBJ" + b"\0" * 40)
    with pytest.raises(JournalCorrupt, match="not an rcq journal"):
        DurableJournal(str(path))


def test_a_conflict_truncates_the_suffix_durably(tmp_path: Path):
    path = tmp_path / "raft.wal"
    journal = journal_with(path, entries(5))
    journal.deleteEntriesFrom(3)
    journal.add(b"other", 4, 2)
    journal.sync()
    journal._destroy()
    assert reopened(path) == [*entries(3), (b"other", 4, 2)]


def test_clear_leaves_a_log_that_restarts_empty(tmp_path: Path):
    path = tmp_path / "raft.wal"
    journal = journal_with(path, entries(5))
    journal.clear()
    journal.add(b"snapshot-prev", 9, 3)
    journal.add(b"snapshot-last", 10, 3)
    journal.sync()
    journal._destroy()
    assert reopened(path) == [(b"snapshot-prev", 9, 3), (b"snapshot-last", 10, 3)]


class Crash(Exception):
    """The process dies here."""


def crash_points(monkeypatch: pytest.MonkeyPatch, crash_at: int | None) -> list[str]:
    """Count the durable steps of a compaction (fdatasync, fsync, rename); raise Crash at step ``crash_at``."""
    steps: list[str] = []

    def step(name: str, real):
        def wrapper(*args):
            if crash_at is not None and len(steps) == crash_at:
                raise Crash(name)
            steps.append(name)
            return real(*args)
        return wrapper

    monkeypatch.setattr(wal.os, "fdatasync", step("fdatasync", os.fdatasync))
    monkeypatch.setattr(files.os, "fsync", step("fsync", os.fsync))
    monkeypatch.setattr(files.os, "rename", step("rename", os.rename))
    return steps


def test_a_compaction_interrupted_at_any_step_loses_no_entry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    old, kept_from = entries(20), 12  # compaction keeps entries 13..20 (the snapshot covers the rest)
    with monkeypatch.context() as counting:
        steps = crash_points(counting, None)
        journal = journal_with(tmp_path / "count.wal", old)
        steps.clear()
        journal.deleteEntriesTo(kept_from)
        journal._destroy()
    assert {"fdatasync", "rename", "fsync"} <= set(steps), steps
    for crash_at in range(len(steps) + 1):
        path = tmp_path / f"crash-{crash_at}.wal"
        journal = journal_with(path, old)
        with monkeypatch.context() as crashing:
            crash_points(crashing, crash_at)
            with pytest.raises(Crash):
                journal.deleteEntriesTo(kept_from)
                raise Crash("after the last step")
        os.close(journal._fd)  # the process is gone: its descriptor too
        after = reopened(path)
        assert after in (old, old[kept_from:]), f"crash at step {crash_at}: {len(after)} entries"
        assert not (tmp_path / f"crash-{crash_at}.wal.new").exists()


def test_term_and_vote_are_durable_before_set_current_term_returns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    path = tmp_path / "raft.wal"
    synced: list[str] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append("meta") or real_fsync(fd))
    journal = DurableJournal(str(path))
    journal.setCurrentTerm(7, "127.0.0.1:7101")
    assert synced, "the vote was not fsynced before setCurrentTerm returned"
    os.close(journal._fd)  # a crash: no orderly close
    again = DurableJournal(str(path))
    assert (again.getCurrentTerm(), again.getVotedForNodeId()) == (7, "127.0.0.1:7101")
    again._destroy()


@pytest.mark.parametrize("content", [b"{not json", b"[1, 2]", b'{"current_term": "x"}'])
def test_an_unreadable_term_and_vote_file_stops_the_node(tmp_path: Path, content: bytes):
    path = tmp_path / "raft.wal"
    (tmp_path / "raft.wal.meta").write_bytes(content)
    with pytest.raises(JournalCorrupt, match="could vote twice"):
        DurableJournal(str(path))


def test_a_node_that_never_voted_starts_at_term_zero(tmp_path: Path):
    journal = DurableJournal(str(tmp_path / "raft.wal"))
    assert (journal.getCurrentTerm(), journal.getVotedForNodeId()) == (0, None)
    journal._destroy()


def test_the_commit_index_never_points_past_the_log_on_disk(tmp_path: Path):
    path = tmp_path / "raft.wal"
    journal = journal_with(path, entries(5))
    journal.setRaftCommitIndex(9)  # learnt from a leader; entries 6..9 never reached this disk
    journal.onOneSecondTimer()
    journal._destroy()
    again = DurableJournal(str(path))
    assert again.getRaftCommitIndex() == 5
    again._destroy()
