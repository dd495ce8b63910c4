"""The Raft log on disk while a node runs: which journal pysyncobj writes (docs/raft-hazards.md,
H8), fail-stop when a write or a sync of it fails, the periodic flush of ``durability=os``, and
compaction by size.

Everything here runs on pysyncobj's tick thread (the journal factory, the failure hook, the
on-tick callbacks), but for the start-up check :meth:`LogUpkeep.refuse_the_other_durability`.
The start-up repair of an interrupted compaction is rcq.server.raft.journal's; the journal of
``durability=fsync`` is rcq.server.raft.wal's.

Must not import: lmdb, aiohttp.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable
from typing import Any

from pysyncobj import SyncObj

from rcq.errors import Unavailable
from rcq.server.config import NodeConfig
from rcq.server.raft.internals import default_journal, journal_bytes, journal_of
from rcq.server.raft.wal import DurableJournal

logger = logging.getLogger(__name__)

FSYNC_FAILED_EXIT_CODE = 75  # EX_TEMPFAIL: restart me (a supervisor does), after looking at the disk


class LogUpkeep:
    """One node's Raft log on disk, while it runs."""

    def __init__(self, config: NodeConfig) -> None:
        self._config = config
        self._sync_observer: Callable[[float], None] | None = None
        self._next_flush_s = 0.0

    def refuse_the_other_durability(self) -> None:
        """Unavailable when the data directory holds a journal written with the other durability."""
        other = self._config.other_journal_path
        if other.is_file() and other.stat().st_size > 0 and not self._config.unsafe_memory_journal:
            raise Unavailable(
                f"node {self._config.node_id} is configured durability={self._config.durability}, but its data "
                f"directory holds {other.name}, written with the other setting; a node does not switch with data "
                "in place: wipe its data directory (it catches up from its peers) or keep the old setting")

    def make_journal(self, journal_file: str | None) -> Any:
        """pysyncobj's journal for this node: rcq's DurableJournal with durability=fsync (H8)."""
        if journal_file is not None and self._config.durability == "fsync":
            journal = DurableJournal(journal_file)
            journal.on_failure = self.on_sync_failure  # a failed write stops the node like a failed sync
            journal.on_sync = self._observe_sync
            return journal
        return default_journal(journal_file)

    def set_sync_observer(self, observer: Callable[[float], None]) -> None:
        """Called (tick thread) with the seconds each fdatasync of the Raft log took (durability=fsync)."""
        self._sync_observer = observer

    def _observe_sync(self, seconds: float) -> None:
        observer = self._sync_observer
        if observer is not None:
            with contextlib.suppress(Exception):  # never end a tick with an exception (H2)
                observer(seconds)

    def on_sync_failure(self, error: OSError) -> None:
        """A write or an fsync of the Raft log failed (EIO, ENOSPC...): what was written may not be
        on disk, and retrying the sync can report success for data the kernel already dropped. Fail-stop: never
        acknowledge, never lead; restarting reads back only what is really durable."""
        logger.critical("node %s: syncing the Raft log failed (%s); stopping so that nothing unsynced is "
                        "acknowledged", self._config.node_id, error)
        for handler in logging.getLogger().handlers:
            with contextlib.suppress(Exception):
                handler.flush()
        os._exit(FSYNC_FAILED_EXIT_CODE)

    def keep(self, sync_obj: SyncObj) -> None:
        """Flush (when configured) and check the journal's size at each of ``sync_obj``'s ticks."""
        if self._config.journal_flush_interval_s is not None:
            sync_obj.addOnTickCallback(lambda: self._flush_if_due(sync_obj))
        sync_obj.addOnTickCallback(lambda: self._compact_if_large(sync_obj))

    def _compact_if_large(self, sync_obj: SyncObj) -> None:
        # Tick thread. Entries carry items, so 50k entries can be gigabytes: snapshot by size too.
        try:
            if journal_bytes(journal_of(sync_obj)) > self._config.log_compaction_bytes:
                sync_obj.forceLogCompaction()
        except Exception:  # never end a tick with an exception
            logger.exception("journal size check failed")

    def _flush_if_due(self, sync_obj: SyncObj) -> None:
        # Tick thread (an on-tick callback), so it never races the journal's writes.
        now = time.monotonic()
        if now < self._next_flush_s:
            return
        interval_s = self._config.journal_flush_interval_s or 0.0
        self._next_flush_s = now + interval_s
        try:
            journal_of(sync_obj).flush()
        except Exception:  # an exception here would end this tick; log and go on
            logger.exception("journal flush failed")
