"""powerfs's files and directories: each with a current and a durable state, and the two moves
between them, an fsync (current becomes durable) and a power cut (back to the durable state).
The durability model is written out at the top of chaos/powerfs/__init__.py; :mod:`chaos.powerfs.model`
holds them in a tree and answers the filesystem's calls.

Pure Python, no FUSE. Must not import: rcq.server, mfusepy.
"""

from __future__ import annotations

import os
import time

PAGE_BYTES = 4096  # bookkeeping granularity of unsynced data (what a page cache tracks)


class File:
    """A regular file: current bytes, durable bytes, and the pages where they may differ."""

    def __init__(self, number: int, mode: int) -> None:
        self.number = number
        self.mode = mode
        self.durable_mode = mode
        self.data = bytearray()
        self.durable = bytearray()
        # Invariant: every byte where data and durable differ (or where only one of them has a
        # byte) lies in a page listed here.
        self.dirty: set[int] = set()
        self.times_ns = (time.time_ns(), time.time_ns())  # atime, mtime

    def _mark(self, start: int, end: int) -> None:
        if end > start:
            self.dirty.update(range(start // PAGE_BYTES, (end - 1) // PAGE_BYTES + 1))

    def read(self, size: int, offset: int) -> bytes:
        return bytes(self.data[offset:offset + size])

    def write(self, chunk: bytes, offset: int) -> int:
        length = len(self.data)
        if offset > length:  # a hole reads as zeros
            self.data.extend(bytes(offset - length))
            self._mark(length, offset)
        self.data[offset:offset + len(chunk)] = chunk
        self._mark(offset, offset + len(chunk))
        self.times_ns = (self.times_ns[0], time.time_ns())
        return len(chunk)

    def truncate(self, length: int) -> None:
        old = len(self.data)
        if length < old:
            del self.data[length:]
        else:
            self.data.extend(bytes(length - old))
        self._mark(min(old, length), max(old, length))
        self.times_ns = (self.times_ns[0], time.time_ns())

    def make_durable(self) -> int:
        """fsync: the durable state becomes the current one; returns the pages written."""
        size = len(self.data)
        if len(self.durable) > size:
            del self.durable[size:]
        elif len(self.durable) < size:
            self.durable.extend(bytes(size - len(self.durable)))
        for page in self.dirty:
            start = page * PAGE_BYTES
            if start < size:
                end = min(start + PAGE_BYTES, size)
                self.durable[start:end] = self.data[start:end]
        written = len(self.dirty)
        self.dirty.clear()
        self.durable_mode = self.mode
        return written

    def revert(self) -> int:
        """A cut: back to the durable state; returns the unsynced bytes dropped (whole pages)."""
        if not self.dirty and self.mode == self.durable_mode:
            return 0
        span = max(len(self.data), len(self.durable))
        dropped = sum(min(PAGE_BYTES, span - page * PAGE_BYTES) for page in self.dirty if page * PAGE_BYTES < span)
        size = len(self.durable)
        if len(self.data) > size:
            del self.data[size:]
        else:
            self.data.extend(bytes(size - len(self.data)))
        for page in self.dirty:
            start = page * PAGE_BYTES
            if start < size:
                end = min(start + PAGE_BYTES, size)
                self.data[start:end] = self.durable[start:end]
        self.dirty.clear()
        self.mode = self.durable_mode
        # A new mtime makes the kernel drop its cached pages of the file at the next read of a
        # handle opened before the cut (libfuse asks for auto_inval_data; attr_timeout is 0).
        self.times_ns = (self.times_ns[0], time.time_ns())
        return max(dropped, 1)  # a mode change alone still counts as a reverted file


class Directory:
    """A directory: current names and the names its last fsync made durable."""

    def __init__(self, number: int, mode: int) -> None:
        self.number = number
        self.mode = mode
        self.durable_mode = mode
        self.entries: dict[str, File | Directory] = {}
        self.durable_entries: dict[str, File | Directory] = {}
        self.times_ns = (time.time_ns(), time.time_ns())

    def make_durable(self) -> None:
        self.durable_entries = dict(self.entries)
        self.durable_mode = self.mode

    def revert(self) -> int:
        """A cut: back to the durable names; returns how many names changed."""
        current, durable = self.entries, self.durable_entries
        changed = sum(1 for name in current.keys() | durable.keys() if current.get(name) is not durable.get(name))
        self.entries = dict(durable)
        self.mode = self.durable_mode
        return changed


Node = File | Directory


def errno_error(code: int, what: str = "") -> OSError:
    return OSError(code, os.strerror(code) + (f": {what}" if what else ""))
