"""rcq's durable Raft log against a real power cut (powerfs): term and vote, and acknowledged
entries, survive; pysyncobj's own journal (durability=os) loses them — the test's teeth.

Issue 9, test (4): a node whose vote file was dropped could vote twice in a term.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
from pysyncobj.journal import FileJournal

from chaos.powerfs import PowerMount, fuse_unavailable_reason, is_mounted
from rcq.server.raft.wal import DurableJournal

FUSE_UNAVAILABLE = fuse_unavailable_reason()
pytestmark = pytest.mark.skipif(FUSE_UNAVAILABLE is not None, reason=f"powerfs cannot mount here: {FUSE_UNAVAILABLE}")


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[tuple[Path, PowerMount]]:
    mountpoint = tmp_path / "disk"
    mountpoint.mkdir()
    mount = PowerMount(mountpoint, log_path=tmp_path / "powerfs.log")
    try:
        yield mountpoint, mount
    finally:
        mount.close()
        assert not is_mounted(mountpoint)


def open_pysyncobj_journal(path: Path) -> FileJournal:
    with warnings.catch_warnings():  # its meta reader leaves a file open (a ResourceWarning)
        warnings.simplefilter("ignore", ResourceWarning)
        return FileJournal(str(path))


def test_a_vote_given_before_a_power_cut_is_still_there_after_it(disk):
    root, mount = disk
    journal = DurableJournal(str(root / "raft.wal"))
    journal.setCurrentTerm(7, "127.0.0.1:7101")  # pysyncobj sends the vote right after this returns
    mount.cut()
    again = DurableJournal(str(root / "raft.wal"))
    assert (again.getCurrentTerm(), again.getVotedForNodeId()) == (7, "127.0.0.1:7101"), (
        "the node forgot its vote: it could vote again in term 7")
    again._destroy()
    journal._destroy()  # a file left open keeps the mount busy: its close would wait, then detach it


def test_synced_entries_survive_a_power_cut_and_unsynced_ones_are_never_half_there(disk):
    root, mount = disk
    journal = DurableJournal(str(root / "raft.wal"))
    for index in range(1, 51):
        journal.add(f"entry-{index}".encode(), index, 1)
    journal.sync()  # what a follower does before it acknowledges
    for index in range(51, 61):
        journal.add(f"entry-{index}".encode(), index, 1)  # never synced, never acknowledged
    mount.cut()
    again = DurableJournal(str(root / "raft.wal"))
    kept = [again[i] for i in range(len(again))]
    assert kept[:50] == [(f"entry-{i}".encode(), i, 1) for i in range(1, 51)]
    assert len(kept) == 50, "entries that were never synced came back"
    again._destroy()
    journal._destroy()


# pysyncobj's journal is left open on purpose (closing it would msync it), and a journal it cannot
# map leaks its file: both end as ResourceWarnings at garbage collection.
@pytest.mark.filterwarnings("ignore::ResourceWarning")
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_without_rcqs_log_the_vote_and_the_entries_are_lost(disk):
    """Teeth: pysyncobj's journal, as durability=os uses it, after the same cut."""
    root, mount = disk
    journal = open_pysyncobj_journal(root / "raft.journal")
    journal.setCurrentTerm(7, "127.0.0.1:7101")
    for index in range(1, 51):
        journal.add(f"entry-{index}".encode(), index, 1)
    mount.cut()
    try:
        again = open_pysyncobj_journal(root / "raft.journal")
    except ValueError as exc:  # "cannot mmap an empty file": the node cannot even start
        assert "empty" in str(exc)
        return
    lost_vote = again.getVotedForNodeId() != "127.0.0.1:7101"
    lost_entries = len(again) < 50
    again._destroy()
    assert lost_vote or lost_entries
