"""Start-up journal repair: finish a log compaction that a crash interrupted (H1).

Runs before pysyncobj opens its files; reads and rewrites the journal with pysyncobj's own
FileJournal (so the format is pysyncobj's), replacing it by rename, never in place.

Must not import: anything of rcq's but rcq.server.raft.snapshots, wal, files and internals.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import warnings
from collections.abc import Iterator
from typing import Any

from pysyncobj.journal import FileJournal

from rcq.server.raft import wal
from rcq.server.raft.files import fsync_path, replace_durably
from rcq.server.raft.internals import destroy_journal
from rcq.server.raft.snapshots import read_raft_data, remove_stale_files

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, slots=True)
class CompactionRepair:
    """What :func:`repair_interrupted_compaction` found and did."""

    removed_files: tuple[str, ...] = ()
    snapshot_last_index: int | None = None
    journal_first_index: int | None = None  # before the repair
    dropped_entries: int = 0
    # False: pysyncobj will replace the journal by the snapshot's two entries on load
    journal_matches_snapshot: bool = True


def repair_interrupted_compaction(journal_path: str | os.PathLike[str],
                                  snapshot_path: str | os.PathLike[str]) -> CompactionRepair:
    """Finish a log compaction that a crash interrupted, before pysyncobj opens the files.

    H1 (docs/raft-hazards.md): compaction renames the new snapshot into place and only then trims the
    journal so that it starts at the snapshot's previous entry. After a crash
    between the two, pysyncobj sees ``journal[0:2] != (prevEntry, lastEntry)``
    on load and clears the whole journal, entries after the snapshot included:
    acknowledged writes are lost and replicas diverge. Here, if the journal
    holds exactly the snapshot's two entries further in, the entries before them
    are dropped, which is the trim the crash prevented. Any other mismatch (a
    journal behind or diverging from the snapshot) is left for pysyncobj to
    reset, which is right then. Also removes temporary files of an interrupted
    snapshot write or transfer.
    """
    journal_path, snapshot_path = os.fspath(journal_path), os.fspath(snapshot_path)
    removed = tuple(remove_stale_files(snapshot_path))
    if not (os.path.isfile(snapshot_path) and os.path.isfile(journal_path)):
        return CompactionRepair(removed_files=removed)
    last_entry, previous_entry = read_raft_data(snapshot_path)[:2]
    entries = _read_journal(journal_path)
    report = CompactionRepair(removed_files=removed, snapshot_last_index=last_entry[1],
                              journal_first_index=entries[0][1] if entries else None)
    if entries[:2] == [previous_entry, last_entry]:
        return report
    position = previous_entry[1] - entries[0][1] if entries else -1
    if 0 < position < len(entries) - 1 and entries[position:position + 2] == [previous_entry, last_entry]:
        _rewrite_journal(journal_path, entries[position:])
        logger.warning("finished an interrupted log compaction: dropped %d journal entries before %d",
                       position, previous_entry[1])
        return dataclasses.replace(report, dropped_entries=position)
    logger.warning("journal (entries %s..%s) does not contain snapshot entries %d..%d: "
                   "pysyncobj will restart the log from the snapshot",
                   report.journal_first_index, entries[-1][1] if entries else None,
                   previous_entry[1], last_entry[1])
    return dataclasses.replace(report, journal_matches_snapshot=False)


@contextlib.contextmanager
def quiet_journal_open() -> Iterator[None]:
    """Open pysyncobj journals without its ResourceWarning.

    FileJournal's MetaStorer reads ``<journal>.meta`` with ``open(path).read()``
    and never closes the file; the warning fires at once (refcounting), inside
    the constructor. Harmless, but fatal under ``-W error`` (our pytest config).
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=ResourceWarning)
        yield


def _read_journal(journal_path: str) -> list[tuple[Any, int, int]]:
    if _is_wal(journal_path):
        return list(wal.read_entries(journal_path)[0])
    with quiet_journal_open():
        journal = FileJournal(journal_path)
    try:
        return [journal[i] for i in range(len(journal))]
    finally:
        destroy_journal(journal)


def _rewrite_journal(journal_path: str, entries: list[tuple[Any, int, int]]) -> None:
    # A new file renamed over the old one: pysyncobj's own deleteEntriesTo
    # rewrites in place, and a crash inside it would lose the journal's tail.
    if _is_wal(journal_path):
        wal.write_entries(journal_path, entries)
        return
    temporary = journal_path + ".repair"
    with contextlib.suppress(FileNotFoundError):
        os.remove(temporary)
    journal = FileJournal(temporary)
    try:
        for command, index, term in entries:
            journal.add(command, index, term)
    finally:
        destroy_journal(journal)
    fsync_path(temporary)
    replace_durably(temporary, journal_path)


def _is_wal(journal_path: str) -> bool:
    """rcq's write-ahead log (durability=fsync) or pysyncobj's journal (durability=os)?"""
    return journal_path.endswith(".wal")
