"""LMDB snapshots of the QueueStateMachine: one self-contained file per snapshot.

A snapshot is a single LMDB environment file (``subdir=False``, ``lock=False``)
because pysyncobj streams the raw bytes of its dump file to lagging followers,
so the file must stand alone. Layout, all in the main database:

* ``i:<queue name utf-8>\\x00<item id, 8 bytes big-endian>`` -> item value,
  written with ``putmulti(append=True)`` in key order;
* ``m:meta`` -> pickle of :meth:`QueueStateMachine.snapshot_meta`;
* ``m:raft`` -> pickle of pysyncobj's ``raftData`` ``(last entry, previous
  entry, cluster nodes)``. Pickle, not JSON or msgpack: pysyncobj compares the
  entries with ``!=`` against its journal and wipes the journal when they are
  lists instead of tuples (docs/raft-hazards.md, H12).

:class:`ForkingSnapshotWriter` provides pysyncobj's ``serializer``,
``serializeChecker`` and ``deserializer`` hooks. A custom serializer runs in
pysyncobj's tick thread, and writing a big state there stops heartbeats long
enough to cause elections (docs/raft-hazards.md, H9), so the writer forks and the child writes
the file from its copy-on-write image of the state.

This is the only module that imports lmdb. Must not import: pysyncobj (it is
given pysyncobj's values and returns plain ones), asyncio, aiohttp.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import os
import pickle
import signal
import struct
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import lmdb

from rcq.server.core.features import UnreadableLevel
from rcq.server.core.state_machine import QueueStateMachine
from rcq.server.raft.digest import fork_child
from rcq.server.raft.files import fsync_path, replace_durably
from rcq.server.raft.unreadable import stop_unreadable
from rcq.version import rcq_version

logger = logging.getLogger(__name__)

RAFT_KEY = b"m:raft"
META_KEY = b"m:meta"
ITEM_PREFIX = b"i:"
QUEUE_NAME_END = b"\x00"  # queue names are [A-Za-z0-9._-]: every byte sorts after \x00
PICKLE_PROTOCOL = 5

# Address space reserved for the map, not disk: without writemap LMDB grows the
# file only as pages are written, so 64 GiB costs nothing until used. The state
# lives in RAM, so a snapshot of it cannot outgrow this on any sane machine.
MAP_SIZE_BYTES = 1 << 36

PART_SUFFIX = ".part"  # the forked child writes here; the parent renames it into place
# Files an interrupted snapshot can leave next to the snapshot: ours, pysyncobj's
# serializer temp name (we never create it, see serialize()), and pysyncobj's
# half-received install-snapshot stream.
STALE_SUFFIXES = (PART_SUFFIX, ".tmp", ".1.tmp")

_ITEM_ID = struct.Struct(">Q")


class SnapshotError(Exception):
    """A snapshot file is missing a key, has an unknown layout or cannot be read."""


@dataclass(frozen=True, slots=True)
class SnapshotInfo:
    path: str
    item_count: int
    file_bytes: int


# ----------------------------------------------------------------- write / read
def write_snapshot(path: str | os.PathLike[str], state_machine: QueueStateMachine,
                   raft_data: Any) -> SnapshotInfo:
    """Write the whole state and ``raft_data`` to a new LMDB file at ``path`` and fsync it.

    ``path`` is replaced if it exists. Not atomic by itself: write to a temporary
    name and rename (see :func:`replace_durably`).
    """
    return write_snapshot_parts(path, state_machine.snapshot_items(), state_machine.snapshot_meta, raft_data)


def write_snapshot_parts(path: str | os.PathLike[str], items: Iterable[tuple[str, int, bytes]],
                         meta: Callable[[], dict[str, Any]], raft_data: Any) -> SnapshotInfo:
    """:func:`write_snapshot` from its parts: ``items`` (queue, id, value) sorted by queue then id,
    streamed into the file, then ``meta()``, called once every item is written (a restore from a
    backup checks the items' digest there). Raises what ``items`` or ``meta`` raise."""
    path = os.fspath(path)
    for leftover in (path, path + "-lock"):
        with contextlib.suppress(FileNotFoundError):
            os.remove(leftover)
    env = lmdb.open(path, subdir=False, lock=False, map_size=MAP_SIZE_BYTES, meminit=False,
                    max_dbs=0, readahead=False)
    try:
        with env.begin(write=True) as txn:
            consumed, added = txn.cursor().putmulti(_item_records(items), append=True)
            if consumed != added:  # append=True refuses out-of-order keys instead of raising
                raise SnapshotError(f"wrote {added} of {consumed} items: keys out of order")
            txn.put(META_KEY, pickle.dumps(meta(), protocol=PICKLE_PROTOCOL))
            txn.put(RAFT_KEY, pickle.dumps(raft_data, protocol=PICKLE_PROTOCOL))
        env.sync(True)
    finally:
        env.close()
    fsync_path(path)
    return SnapshotInfo(path=path, item_count=added, file_bytes=os.path.getsize(path))


def replace_raft_data(path: str | os.PathLike[str], raft_data: Any) -> None:
    """Put another ``raft_data`` into the snapshot at ``path`` (a restore gives each node its own
    view of the members) and fsync it."""
    path = os.fspath(path)
    env = lmdb.open(path, subdir=False, lock=False, map_size=MAP_SIZE_BYTES, max_dbs=0, readahead=False)
    try:
        with env.begin(write=True) as txn:
            txn.put(RAFT_KEY, pickle.dumps(raft_data, protocol=PICKLE_PROTOCOL))
        env.sync(True)
    finally:
        env.close()
    fsync_path(path)


def _item_records(items: Iterable[tuple[str, int, bytes]]) -> Iterator[tuple[bytes, bytes]]:
    """Item keys and values in strictly increasing key order, or SnapshotError."""
    pack = _ITEM_ID.pack
    previous_name = None
    prefix = b""
    previous_key = b""
    for queue_name, item_id, value in items:
        if queue_name != previous_name:
            prefix = ITEM_PREFIX + queue_name.encode() + QUEUE_NAME_END
            previous_name = queue_name
        key = prefix + pack(item_id)
        # Key order must equal (queue, id) order for append=True; it does for
        # [A-Za-z0-9._-] names, and this check keeps it honest at little cost.
        if key <= previous_key:
            raise SnapshotError(f"item key {key!r} does not sort after {previous_key!r}")
        previous_key = key
        yield key, value


def read_snapshot(path: str | os.PathLike[str], state_machine: QueueStateMachine) -> Any:
    """Restore ``state_machine`` from the snapshot at ``path``; return its ``raft_data`` unchanged."""
    env = _open_readonly(path)
    try:
        with env.begin(buffers=False) as txn:
            raft_data = _load(txn, RAFT_KEY, path)
            meta = _load(txn, META_KEY, path)
            state_machine.restore(meta, _read_items(txn.cursor()))
    finally:
        env.close()
    return raft_data


def read_raft_data(path: str | os.PathLike[str]) -> Any:
    """Only the ``raft_data`` of a snapshot (for the start-up journal repair)."""
    env = _open_readonly(path)
    try:
        with env.begin() as txn:
            return _load(txn, RAFT_KEY, path)
    finally:
        env.close()


def _read_items(cursor: lmdb.Cursor) -> Iterator[tuple[str, int, bytes]]:
    if not cursor.set_range(ITEM_PREFIX):
        return
    unpack = _ITEM_ID.unpack
    name_key = b""
    name = ""
    for key, value in cursor:  # bytes: the transaction is opened with buffers=False
        key, value = bytes(key), bytes(value)
        if not key.startswith(ITEM_PREFIX):
            break
        if key[:-8] != name_key:  # decode each queue name once
            name_key = key[:-8]
            name = name_key[len(ITEM_PREFIX):-1].decode()
        yield name, unpack(key[-8:])[0], value


def _open_readonly(path: str | os.PathLike[str]) -> lmdb.Environment:
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise SnapshotError(f"no snapshot at {path}")
    try:
        # LMDB maps at least the size recorded in the file, whatever map_size says.
        return lmdb.open(path, subdir=False, lock=False, readonly=True, max_dbs=0)
    except lmdb.Error as exc:
        raise SnapshotError(f"cannot open snapshot {path}: {exc}") from exc


def _load(txn: lmdb.Transaction, key: bytes, path: Any) -> Any:
    raw = txn.get(key)
    if raw is None:
        raise SnapshotError(f"snapshot {os.fspath(path)} has no {key.decode()} key")
    return pickle.loads(raw)


def remove_stale_files(snapshot_path: str | os.PathLike[str]) -> list[str]:
    """Delete what an interrupted snapshot write or transfer left beside ``snapshot_path``."""
    removed = []
    base = os.fspath(snapshot_path)
    for suffix in STALE_SUFFIXES:
        for candidate in (base + suffix, base + suffix + "-lock"):
            if os.path.exists(candidate):
                os.remove(candidate)
                removed.append(candidate)
    return removed


# --------------------------------------------------------- pysyncobj's hooks
class SnapshotState(enum.IntEnum):
    """What :meth:`ForkingSnapshotWriter.check` reports; same values as pysyncobj's SERIALIZER_STATE."""

    IDLE = 0
    WRITING = 1
    SUCCEEDED = 2  # reported once per finished snapshot
    FAILED = 3  # reported once per failed (or cancelled) snapshot


class ForkingSnapshotWriter:
    """pysyncobj's ``serializer`` / ``serializeChecker`` / ``deserializer``, writing in a forked child.

    ``serialize`` and ``check`` and ``deserialize`` are all called by pysyncobj's
    tick thread, which also applies entries, so the state is consistent as of
    the entry ``raft_data`` names when the child forks. ``lock`` is the lock
    readers of the state machine take; ``deserialize`` holds it while restoring.
    """

    def __init__(self, state_machine: QueueStateMachine, snapshot_path: str | os.PathLike[str],
                 lock: threading.Lock, node_id: str = "?") -> None:
        self._state_machine = state_machine
        self._node_id = node_id
        self._final_path = os.fspath(snapshot_path)
        self._part_path = self._final_path + PART_SUFFIX
        self._lock = lock
        self._child_pid = 0
        self._unreported_failure = False
        self.written_count = 0  # snapshots written and renamed into place
        self.loaded_count = 0  # snapshots restored (start-up and received)

    def serialize(self, file_name: str, raft_data: Any) -> None:
        """Start writing a snapshot in a forked child; pysyncobj's ``serializer`` hook.

        Deliberately do NOT create ``file_name`` (pysyncobj's ``<dump>.tmp``):
        pysyncobj's rename of it then fails, it marks itself busy and from then
        on trusts only :meth:`check`, which reports the child's outcome. The
        child writes ``<dump>.part``; the parent renames it in ``check``.
        """
        if self._child_pid:
            return
        try:
            # The child only reads its copy-on-write image (rcq.server.raft.digest.fork_child's discipline).
            pid = fork_child(lambda: write_snapshot(self._part_path, self._state_machine, raft_data),
                             label="snapshot")
        except OSError:
            logger.exception("cannot fork to write a snapshot")
            self._unreported_failure = True  # pysyncobj waits for a SUCCEEDED or FAILED
            return
        self._child_pid = pid

    def check(self) -> SnapshotState:
        """Report the child's progress; pysyncobj's ``serializeChecker`` hook."""
        if self._unreported_failure:
            self._unreported_failure = False
            return SnapshotState.FAILED
        if not self._child_pid:
            return SnapshotState.IDLE
        pid, status = os.waitpid(self._child_pid, os.WNOHANG)
        if pid == 0:
            return SnapshotState.WRITING
        self._child_pid = 0
        if status != 0:
            logger.warning("snapshot child exited with status %#x", status)
            return SnapshotState.FAILED
        # The rename happens here, in the tick thread, and not in the child:
        # pysyncobj installs received snapshots from this thread too, and a child
        # renaming on its own could put an older state over a newer installed one.
        try:
            replace_durably(self._part_path, self._final_path)
        except OSError:
            logger.exception("cannot rename the new snapshot into place")
            return SnapshotState.FAILED
        self.written_count += 1
        return SnapshotState.SUCCEEDED

    def deserialize(self, file_name: str) -> Any:
        """Restore the state machine from ``file_name``; pysyncobj's ``deserializer`` hook.

        Returns ``raft_data`` exactly as it was given to the writer (tuples).
        """
        if self._child_pid:
            # A snapshot received from the leader replaces a state the child is
            # still writing: that file is obsolete and must not be renamed later.
            self._stop_child(signal.SIGKILL, timeout_s=10.0)
            self._unreported_failure = True
        # A received snapshot was written and renamed into place by pysyncobj without fsync; make
        # it durable before it replaces the state and pysyncobj clears the journal for it (H8).
        fsync_path(file_name)
        fsync_path(os.path.dirname(os.path.abspath(file_name)))
        try:
            with self._lock:
                raft_data = read_snapshot(file_name, self._state_machine)
        except UnreadableLevel as exc:  # at start, or received from a leader: this code cannot go on
            stop_unreadable(self._node_id, exc.explain(rcq_version()))
        self.loaded_count += 1
        return raft_data

    def close(self, timeout_s: float = 60.0) -> None:
        """Wait for a running child (killing it after ``timeout_s``) and drop its partial file.

        Call only after pysyncobj's tick thread has stopped. The finished file
        is not renamed: pysyncobj did not trim its journal for it, so the next
        start loads the previous snapshot plus the whole journal.
        """
        if self._child_pid:
            self._stop_child(None, timeout_s=timeout_s)
        with contextlib.suppress(FileNotFoundError):
            os.remove(self._part_path)

    def _stop_child(self, first_signal: signal.Signals | None, timeout_s: float) -> None:
        pid = self._child_pid
        if first_signal is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, first_signal)
        deadline = time.monotonic() + timeout_s
        while True:
            reaped, _ = os.waitpid(pid, os.WNOHANG)
            if reaped:
                break
            if time.monotonic() > deadline:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                break
            time.sleep(0.01)
        self._child_pid = 0
        with contextlib.suppress(FileNotFoundError):
            os.remove(self._part_path)
