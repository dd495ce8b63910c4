"""DurableJournal: rcq's Raft log for ``durability=fsync``, in pysyncobj's journal interface.

pysyncobj's own FileJournal writes through mmap and never syncs, and compacts in place (clear,
then re-add entry by entry): a power cut loses acknowledged entries, and a crash inside a
compaction loses the log's tail (docs/raft-hazards.md, H8). This journal is an append-only file
written with ``pwrite`` and made durable with ``fdatasync``:

* ``add`` only writes; :meth:`sync` makes everything written so far durable, once for all the
  entries that arrived since the last sync (group fsync). The replicator calls it before a
  follower acknowledges entries and before the leader counts its own log (rcq.server.raft.patches).
* each record carries its length and a CRC32: a record torn by a crash at the end of the file
  (never synced, so never acknowledged) is cut off at open; a bad record *followed by more data*
  is corruption, and the node refuses to start rather than guess.
* dropping a prefix (compaction) writes the kept entries to a new file, fsyncs it, renames it
  over the old one and fsyncs the directory: at every crash point the file on disk is either the
  old log or the new one. Dropping a suffix (a Raft conflict) truncates; ``clear`` (a received
  snapshot replaces the log) truncates to the header.
* term and vote live in ``<path>.meta`` (JSON), replaced durably (tmp, fsync, rename, fsync dir)
  before pysyncobj sends any message that depends on them; the commit index rides along, written
  at most once a second. An unreadable meta file stops the node with a clear message: starting at
  term 0 could make it vote twice in one term.
* a file shorter than its header (a crash before its first sync) is an empty log: the node starts
  and catches up from its peers.

Must not import: pysyncobj (it is handed to pysyncobj by rcq.server.raft.internals), lmdb.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import struct
import time
import zlib
from collections.abc import Callable, Iterable
from typing import Any

from rcq.server.raft.files import replace_durably

log = logging.getLogger(__name__)

MAGIC = b"RCQWAL1\n"
_HEADER = struct.Struct("<II")  # a record: payload length, crc32 of the payload, then the payload:
_INDEX_TERM = struct.Struct("<QQ")  # index, term, then the command's bytes
Entry = tuple[bytes, int, int]  # (command, index, term), as pysyncobj's journals hold them


class JournalCorrupt(Exception):
    """A journal or its meta file is damaged where a crash cannot have left it so: the node must not start."""


def _record(command: bytes, index: int, term: int) -> bytes:
    payload = _INDEX_TERM.pack(index, term) + command
    return _HEADER.pack(len(payload), zlib.crc32(payload)) + payload


def read_entries(path: str) -> tuple[list[Entry], list[int], int]:
    """Entries, each record's offset, and the offset where the valid log ends (a torn tail starts)."""
    with open(path, "rb") as file:
        data = file.read()
    if len(data) < len(MAGIC):
        return [], [], 0  # never synced past its creation: an empty log
    if not data.startswith(MAGIC):
        raise JournalCorrupt(f"{path} is not an rcq journal (written with durability=os, or damaged)")
    entries: list[Entry] = []
    offsets: list[int] = []
    offset = len(MAGIC)
    while offset < len(data):
        if offset + _HEADER.size > len(data):
            break  # a torn header at the very end
        length, crc = _HEADER.unpack_from(data, offset)
        end = offset + _HEADER.size + length
        payload = data[offset + _HEADER.size:end]
        if end > len(data) or length < _INDEX_TERM.size or zlib.crc32(payload) != crc:
            if end < len(data):
                raise JournalCorrupt(f"{path}: record at byte {offset} is damaged and more records follow; "
                                     "refusing to start (restore the node from its peers: wipe its data directory)")
            break  # torn at the end: written, never synced, never acknowledged
        index, term = _INDEX_TERM.unpack_from(payload)
        entries.append((payload[_INDEX_TERM.size:], index, term))
        offsets.append(offset)
        offset = end
    return entries, offsets, offset


def write_entries(path: str, entries: Iterable[Entry]) -> None:
    """A new journal at ``path`` holding ``entries``, durably, replacing any file there."""
    temporary = path + ".new"
    with open(temporary, "wb") as file:
        file.write(MAGIC)
        for command, index, term in entries:
            file.write(_record(bytes(command), index, term))
        file.flush()
        os.fdatasync(file.fileno())
    replace_durably(temporary, path)


class DurableJournal:
    """pysyncobj's Journal interface (add, clear, delete, meta) on an fdatasync'ed append-only file."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._meta_path = path + ".meta"
        with contextlib.suppress(FileNotFoundError):
            os.remove(path + ".new")  # a compaction interrupted before its rename: the old log stands
        if not os.path.exists(path) or os.path.getsize(path) < len(MAGIC):
            write_entries(path, [])
        entries, offsets, end = read_entries(path)
        self._entries = entries
        self._offsets = offsets
        self._fd = os.open(path, os.O_RDWR)
        if end < os.fstat(self._fd).st_size:
            log.warning("journal %s: dropped a torn record at byte %d (written, never synced)", path, end)
            os.ftruncate(self._fd, end)
            os.fdatasync(self._fd)
        self._end = end
        self._dirty = False
        self._meta = self._read_meta()
        self._meta_dirty = False
        self.syncs = 0
        # Called with the OSError when a write fails (the replicator fail-stops the node; a failed
        # sync reaches the same handler through rcq.server.raft.patches).
        self.on_failure: Callable[[OSError], None] | None = None
        self.on_sync: Callable[[float], None] | None = None  # seconds each fdatasync took (metrics)

    # ----------------------------------------------------------- durability
    def sync(self) -> None:
        """Make every entry written so far durable; a no-op when nothing was written since."""
        if self._dirty:
            started = time.monotonic()
            os.fdatasync(self._fd)
            self._dirty = False
            self.syncs += 1
            if self.on_sync is not None:
                self.on_sync(time.monotonic() - started)

    @property
    def dirty(self) -> bool:
        return self._dirty

    @property
    def bytes_written(self) -> int:
        return self._end

    # ------------------------------------------------- pysyncobj's interface (its camelCase names)
    def add(self, command: Any, idx: int, term: int) -> None:
        command = bytes(command)
        record = _record(command, idx, term)
        try:
            os.pwrite(self._fd, record, self._end)
        except OSError as exc:  # ENOSPC, EIO: the entry is not in the log; nothing may acknowledge it
            if self.on_failure is not None:
                self.on_failure(exc)
            raise
        self._entries.append((command, idx, term))
        self._offsets.append(self._end)
        self._end += len(record)
        self._dirty = True

    def clear(self) -> None:
        self._truncate_to(0, len(MAGIC))

    def __getitem__(self, position: Any) -> Any:
        return self._entries[position]

    def __len__(self) -> int:
        return len(self._entries)

    def deleteEntriesFrom(self, entryFrom: int) -> None:
        if entryFrom < len(self._entries):
            self._truncate_to(entryFrom, self._offsets[entryFrom])

    def deleteEntriesTo(self, entryTo: int) -> None:
        kept = self._entries[entryTo:]
        self.sync()
        write_entries(self._path, kept)
        os.close(self._fd)
        self._entries, self._offsets, self._end = read_entries(self._path)
        self._fd = os.open(self._path, os.O_RDWR)
        self._dirty = False

    def _truncate_to(self, position: int, offset: int) -> None:
        os.ftruncate(self._fd, offset)
        del self._entries[position:]
        del self._offsets[position:]
        self._end = offset
        self._dirty = True

    def flush(self) -> None:
        self.sync()

    def _destroy(self) -> None:
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                self.sync()
                self._store_meta_if_changed()
            os.close(self._fd)
            self._fd = -1

    def setRaftCommitIndex(self, raftCommitIndex: int) -> None:
        if self._meta.get("commit_index") != raftCommitIndex:
            self._meta["commit_index"] = raftCommitIndex
            self._meta_dirty = True

    def getRaftCommitIndex(self) -> int:
        # Never beyond the log on disk: entries past it were not synced here.
        last_index = self._entries[-1][1] if self._entries else 1
        return min(int(self._meta.get("commit_index", 1)), last_index)

    def setCurrentTerm(self, term: int, votedForNodeId: Any) -> None:
        # Raft: term and vote are durable before any message that reflects them is sent;
        # pysyncobj sends the vote right after this returns.
        self._meta["current_term"] = int(term)
        self._meta["voted_for"] = None if votedForNodeId is None else str(votedForNodeId)
        self._store_meta()

    def getCurrentTerm(self) -> int:
        return int(self._meta.get("current_term", 0))

    def getVotedForNodeId(self) -> Any:
        return self._meta.get("voted_for")

    def onOneSecondTimer(self) -> None:
        self._store_meta_if_changed()

    # ------------------------------------------------------------------ meta
    def _read_meta(self) -> dict[str, Any]:
        try:
            with open(self._meta_path, "rb") as file:
                text = file.read()
        except FileNotFoundError:
            return {}  # a node that never voted
        try:
            meta = json.loads(text)
            if not isinstance(meta, dict) or not isinstance(meta.get("current_term", 0), int):
                raise ValueError("not a meta object")
        except ValueError as exc:
            raise JournalCorrupt(f"{self._meta_path} (term and vote) is unreadable: {exc}; refusing to start, "
                                 "since starting at term 0 could vote twice in a term (wipe the node's data "
                                 "directory to rebuild it from its peers)") from exc
        return meta

    def _store_meta(self) -> None:
        temporary = self._meta_path + ".tmp"
        with open(temporary, "w", encoding="utf-8") as file:
            json.dump(self._meta, file)
            file.flush()
            os.fsync(file.fileno())
        replace_durably(temporary, self._meta_path)
        self._meta_dirty = False

    def _store_meta_if_changed(self) -> None:
        if self._meta_dirty:
            self._store_meta()

