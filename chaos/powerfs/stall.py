"""powerfs's stalled disk: a gate every fsync, fdatasync and fsyncdir passes before the model
makes anything durable (chaos.powerfs.model.PowerModel.fsync), closed while the disk is stalled.

A stall models a disk whose cache flush hangs: the syncing thread waits in its system call
(the FUSE request stays unanswered) until :meth:`SyncStall.release`, and then its sync completes
as usual, making durable what the file or directory holds at that moment. Reads, writes and every
other call go on meanwhile: a blocked sync waits here, on this gate's own condition, never
holding the model's lock (the kernel itself holds the synced inode's lock across a FUSE fsync,
so writes to that very file, and readdir or changes of that very directory, wait with it).
A power cut while syncs wait fails them with EIO (:meth:`interrupt`: the flush they waited for
was lost with the power, so nothing they covered becomes durable); the disk stays stalled until
released.

Pure Python, no FUSE. Must not import: rcq.server, mfusepy.
"""

from __future__ import annotations

import errno
import threading
from typing import Any

from chaos.powerfs.files import errno_error


class SyncStall:
    """Whether syncs hang now, and the syncs hanging. Thread-safe (its own condition)."""

    def __init__(self) -> None:
        self._condition = threading.Condition()
        self._stalled = False
        self._blocked = 0
        self._epoch = 0  # a cut's count: a sync waiting across one fails
        self.counters = {"stalls": 0, "syncs_stalled": 0, "syncs_failed_by_cut": 0}

    def stall(self) -> dict[str, Any]:
        """From now on every sync hangs until :meth:`release` (stalling twice is one stall)."""
        with self._condition:
            if not self._stalled:
                self._stalled = True
                self.counters["stalls"] += 1
            return self._state()

    def release(self) -> dict[str, Any]:
        """Syncs go through again, and those waiting complete; ``released``: how many were waiting."""
        with self._condition:
            released = self._blocked if self._stalled else 0
            self._stalled = False
            self._condition.notify_all()
            return {**self._state(), "released": released}

    def interrupt(self) -> int:
        """A power cut: the syncs waiting now fail with EIO; returns how many. The stall stays."""
        with self._condition:
            self._epoch += 1
            self._condition.notify_all()
            return self._blocked

    def wait(self) -> None:
        """Called by a sync before it touches the model: returns at once unless stalled, else once
        released; raises EIO when a cut came first."""
        with self._condition:
            if not self._stalled:
                return
            epoch = self._epoch
            self._blocked += 1
            self.counters["syncs_stalled"] += 1
            try:
                while self._stalled and self._epoch == epoch:
                    self._condition.wait()
            finally:
                self._blocked -= 1
            if self._epoch != epoch:
                self.counters["syncs_failed_by_cut"] += 1
                raise errno_error(errno.EIO, "the power was cut while this sync waited on a stalled disk")

    def stats(self) -> dict[str, Any]:
        with self._condition:
            return {**self.counters, **self._state()}

    def _state(self) -> dict[str, Any]:
        return {"stalled": self._stalled, "syncs_blocked": self._blocked}
