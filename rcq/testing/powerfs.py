"""powerfs: a FUSE filesystem that models a disk with a volatile write cache, and its power cut.

Test support for power failures (the chaos harness's ``power`` nemesis, issue 9): mount it on a
node's data directory, let the node run, kill it, :meth:`PowerMount.cut` the power, restart
it, and the node finds on "disk" exactly what it had made durable, nothing more::

    with PowerMount(data_dir) as disk:     # mounted; unmounted on close, also on failure
        ...                                 # the node writes, fsyncs, mmaps, renames
        disk.cut()                          # everything not made durable is gone

The filesystem is a child process (``python -m rcq.testing.powerfs MOUNTPOINT``) holding all
data in memory, driven over its stdin/stdout by :class:`PowerMount`; it is a separate process
so that libfuse's signal handlers and its request threads never share the harness's
interpreter (and so a harness that dies closes the child's stdin: the child unmounts itself;
``auto_unmount`` makes fusermount3 unmount it even after a kill -9 of the child).

The durability model: strict, like the worst real filesystem POSIX allows
---------------------------------------------------------------------------
Every file and directory has a *current* state (what processes see) and a *durable* state
(what a power failure leaves). The mount's root directory always exists, initially empty.

* **File contents and length** (write, pwrite, truncate, ftruncate, O_TRUNC, and a shared
  mmap's dirty pages once the kernel writes them back: periodic writeback, msync, munmap, or
  the exit of a killed process) become durable only with ``fsync`` or ``fdatasync`` of that
  file; ``msync(MS_SYNC)`` reaches the filesystem as writes then an fdatasync, so it counts.
  An fsync makes the whole file durable (not only the synced range); ``mode`` (chmod) is
  durable with the file's fsync too. Owner and times are not modelled (kept as they are).
* **Directory entries** (create, mkdir, unlink, rmdir, rename, a rename over an existing
  name) become durable only with ``fsync`` of *that directory*; fsync of a file never makes
  its name durable. So a file created, written and fsynced in a directory that was not
  fsynced afterwards **vanishes** in a cut; a rename not followed by an fsync of the
  directory is **undone** (the old file is back under the target name, and the source name
  only if it had been made durable);
  a rename across directories is durable in each directory by that directory's own fsync.
  An unlinked file whose unlink was not made durable comes back with its durable contents.
* **A cut** reverts, from the root down through durable entries only, every directory to its
  durable entries and every file reached to its durable contents and length. Anything not
  reached is gone. Unsynced data is dropped whole (no torn or partially written-back pages:
  a real disk may keep some of it, which would only be kinder). A file whose name was durable
  but whose data never was is there, empty: exactly what the issue measured (a 0-byte journal).
* **Processes keep running** after a cut, against the reverted state (their open handles
  stay valid; a handle on a vanished file reaches an orphan). The harness kills a node
  *before* cutting it: a killed process's dirty mmap pages reach the filesystem while it
  exits (FUSE writes them back when the mapping is closed), and the cut then drops them.
  The kernel caches nothing that would outlive a cut for a new opener: entry, negative and
  attribute timeouts are 0 and files are opened without keep_cache (the page cache of a file
  is dropped when it is opened again). A handle kept open across a cut reads the reverted
  data too (a cut changes each reverted file's mtime, and libfuse's auto_inval_data makes the
  kernel drop the cached pages); pages a running process has mapped may stay stale.
* :meth:`PowerMount.sync` makes everything durable (``sync`` of the whole disk: used after
  a wipe, which models a new, empty disk). A mount made with ``drop_unsynced=False`` is the
  *control*: its cut drops nothing (a disk with a battery-backed cache).

Binding: ``mfusepy`` (ctypes over Debian's libfuse3; pure Python, so nothing to compile).
:func:`fuse_unavailable_reason` says, in plain words, why a mount cannot work here (no
/dev/fuse, no permission, no libfuse3, no mfusepy) so tests can skip loudly.

Must not import: rcq.server (nor pysyncobj, lmdb, aiohttp); mfusepy only inside the child.
"""

from __future__ import annotations

import contextlib
import ctypes.util
import errno
import importlib.util
import json
import os
import select
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Self

from rcq.testing.polls import deadline_loop

PAGE_BYTES = 4096  # bookkeeping granularity of unsynced data (what a page cache tracks)
START_TIMEOUT_S = 20.0  # mount and FUSE_INIT on a loaded 2-core machine
REQUEST_TIMEOUT_S = 30.0  # one control request (a cut copies every unsynced page of the mount)
CLOSE_TIMEOUT_S = 15.0  # unmount (retried while busy), then the child's exit
UNMOUNT_RETRY_S = 0.05
UNMOUNT_COMMAND_TIMEOUT_S = 10.0
STATFS_BLOCKS = 1 << 24  # what df shows: 64 GiB, all free (memory is the real limit)
LOG_TAIL_BYTES = 4_000


class PowerFSError(RuntimeError):
    """The filesystem could not be mounted, driven or unmounted (the message says why)."""


class PowerFSUnavailable(PowerFSError):
    """FUSE cannot work on this machine (see :func:`fuse_unavailable_reason`)."""


# ====================================================================== availability
def fuse_unavailable_reason() -> str | None:
    """None when a powerfs mount can work here; otherwise why not, in plain words."""
    if not sys.platform.startswith("linux"):
        return f"powerfs needs Linux FUSE (this is {sys.platform})"
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse on this machine (a container without the fuse device?)"
    try:
        os.close(os.open("/dev/fuse", os.O_RDWR))
    except OSError as exc:
        return f"cannot open /dev/fuse ({exc.strerror}; mounting FUSE needs root or the fuse group)"
    if ctypes.util.find_library("fuse3") is None:
        return "libfuse3 is not installed (Debian: apt-get install fuse3; ./run tests does it as root)"
    if os.geteuid() != 0 and shutil.which("fusermount3") is None:
        return "not root and no fusermount3 (Debian: apt-get install fuse3)"
    if importlib.util.find_spec("mfusepy") is None:
        return "the mfusepy package is not installed (pip install -e '.[chaos]')"
    return None


# ====================================================================== the model
class _File:
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


class _Directory:
    """A directory: current names and the names its last fsync made durable."""

    def __init__(self, number: int, mode: int) -> None:
        self.number = number
        self.mode = mode
        self.durable_mode = mode
        self.entries: dict[str, _File | _Directory] = {}
        self.durable_entries: dict[str, _File | _Directory] = {}
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


_Node = _File | _Directory


def _errno_error(code: int, what: str = "") -> OSError:
    return OSError(code, os.strerror(code) + (f": {what}" if what else ""))


class PowerModel:
    """The in-memory filesystem with the durability model of the module docstring.

    Thread-safe (one lock: libfuse calls from several threads). Paths are absolute within the
    mount (``/a/b``); handles are the numbers :meth:`open`, :meth:`create` and :meth:`opendir`
    return. Errors are ``OSError`` with the errno a real filesystem would give.
    """

    def __init__(self, drop_unsynced: bool = True) -> None:
        self.drop_unsynced = drop_unsynced
        self._lock = threading.Lock()
        self._next_number = 2
        self.root = _Directory(1, stat.S_IFDIR | 0o755)
        self.root.make_durable()
        self._handles: dict[int, _Node] = {}
        self._next_handle = 1
        self.counters = {"cuts": 0, "fsyncs": 0, "fsyncdirs": 0, "writes": 0, "syncs": 0}

    # ------------------------------------------------------------ helpers (lock held)
    def _number(self) -> int:
        self._next_number += 1
        return self._next_number

    def _resolve(self, path: str) -> _Node:
        node: _Node = self.root
        for part in (p for p in path.split("/") if p):
            if not isinstance(node, _Directory):
                raise _errno_error(errno.ENOTDIR, path)
            child = node.entries.get(part)
            if child is None:
                raise _errno_error(errno.ENOENT, path)
            node = child
        return node

    def _parent(self, path: str) -> tuple[_Directory, str]:
        head, _, name = path.rstrip("/").rpartition("/")
        if not name:
            raise _errno_error(errno.EBUSY, "the mount's root")
        parent = self._resolve(head or "/")
        if not isinstance(parent, _Directory):
            raise _errno_error(errno.ENOTDIR, head)
        return parent, name

    def _node(self, path: str | None, handle: int | None) -> _Node:
        if handle is not None and handle in self._handles:
            return self._handles[handle]
        if path is None:
            raise _errno_error(errno.EBADF)
        return self._resolve(path)

    def _file(self, path: str | None, handle: int | None) -> _File:
        node = self._node(path, handle)
        if not isinstance(node, _File):
            raise _errno_error(errno.EISDIR, path or "")
        return node

    def _new_handle(self, node: _Node) -> int:
        handle = self._next_handle
        self._next_handle += 1
        self._handles[handle] = node
        return handle

    def _reachable(self) -> list[_Node]:
        """Every file and directory processes can reach now."""
        seen: dict[int, _Node] = {}
        stack: list[_Node] = [self.root]
        while stack:
            node = stack.pop()
            if id(node) in seen:
                continue
            seen[id(node)] = node
            if isinstance(node, _Directory):
                stack.extend(node.entries.values())
        return list(seen.values())

    # ------------------------------------------------------------ attributes
    def getattr(self, path: str | None, handle: int | None = None) -> dict[str, Any]:
        with self._lock:
            node = self._node(path, handle)
            atime_ns, mtime_ns = node.times_ns
            attrs: dict[str, Any] = {"st_mode": node.mode, "st_ino": node.number, "st_uid": os.getuid(),
                                     "st_gid": os.getgid(), "st_atime": atime_ns, "st_mtime": mtime_ns,
                                     "st_ctime": mtime_ns, "st_blksize": PAGE_BYTES}
            if isinstance(node, _Directory):
                attrs["st_nlink"] = 2 + sum(isinstance(c, _Directory) for c in node.entries.values())
                attrs["st_size"] = 0
            else:
                attrs["st_nlink"] = 1
                attrs["st_size"] = len(node.data)
                attrs["st_blocks"] = (len(node.data) + 511) // 512
            return attrs

    def chmod(self, path: str | None, mode: int) -> None:
        with self._lock:
            node = self._resolve(path) if path is not None else None
            if node is not None:
                node.mode = stat.S_IFMT(node.mode) | stat.S_IMODE(mode)

    def utimens(self, path: str | None, times_ns: tuple[int, int] | None) -> None:
        with self._lock:
            if path is not None:
                node = self._resolve(path)
                now = time.time_ns()
                node.times_ns = (int(times_ns[0]), int(times_ns[1])) if times_ns else (now, now)

    # ------------------------------------------------------------ files
    def create(self, path: str, mode: int) -> int:
        with self._lock:
            parent, name = self._parent(path)
            existing = parent.entries.get(name)
            if isinstance(existing, _Directory):
                raise _errno_error(errno.EISDIR, path)
            node = existing if existing is not None else _File(self._number(), stat.S_IFREG | stat.S_IMODE(mode))
            parent.entries[name] = node
            parent.times_ns = (parent.times_ns[0], time.time_ns())
            return self._new_handle(node)

    def open(self, path: str, flags: int = os.O_RDONLY) -> int:
        with self._lock:
            node = self._resolve(path)
            if isinstance(node, _Directory) and flags & os.O_ACCMODE != os.O_RDONLY:
                raise _errno_error(errno.EISDIR, path)
            if isinstance(node, _File) and flags & os.O_TRUNC:
                node.truncate(0)
            return self._new_handle(node)

    def opendir(self, path: str) -> int:
        with self._lock:
            node = self._resolve(path)
            if not isinstance(node, _Directory):
                raise _errno_error(errno.ENOTDIR, path)
            return self._new_handle(node)

    def release(self, handle: int) -> None:
        with self._lock:
            self._handles.pop(handle, None)

    def read(self, path: str | None, size: int, offset: int, handle: int | None) -> bytes:
        with self._lock:
            return self._file(path, handle).read(size, offset)

    def write(self, path: str | None, chunk: bytes, offset: int, handle: int | None) -> int:
        with self._lock:
            self.counters["writes"] += 1
            return self._file(path, handle).write(chunk, offset)

    def truncate(self, path: str | None, length: int, handle: int | None = None) -> None:
        with self._lock:
            self._file(path, handle).truncate(length)

    def fsync(self, path: str | None, handle: int | None = None) -> None:
        """fsync/fdatasync (and so msync(MS_SYNC)) of a file, or fsync of a directory."""
        with self._lock:
            node = self._node(path, handle)
            if isinstance(node, _Directory):
                self.counters["fsyncdirs"] += 1
            else:
                self.counters["fsyncs"] += 1
            node.make_durable()

    # ------------------------------------------------------------ directories
    def readdir(self, path: str | None, handle: int | None = None) -> list[tuple[str, dict[str, int], int]]:
        """(name, {st_mode, st_ino}, 0) for ``.``, ``..`` and each entry (readdir skips inode 0)."""
        with self._lock:
            node = self._node(path, handle)
            if not isinstance(node, _Directory):
                raise _errno_error(errno.ENOTDIR, path or "")
            here = {"st_mode": node.mode, "st_ino": node.number}
            return [(".", here, 0), ("..", here, 0),
                    *((name, {"st_mode": child.mode, "st_ino": child.number}, 0) for name, child in node.entries.items())]

    def mkdir(self, path: str, mode: int) -> None:
        with self._lock:
            parent, name = self._parent(path)
            if name in parent.entries:
                raise _errno_error(errno.EEXIST, path)
            parent.entries[name] = _Directory(self._number(), stat.S_IFDIR | stat.S_IMODE(mode))
            parent.times_ns = (parent.times_ns[0], time.time_ns())

    def unlink(self, path: str) -> None:
        with self._lock:
            parent, name = self._parent(path)
            node = parent.entries.get(name)
            if node is None:
                raise _errno_error(errno.ENOENT, path)
            if isinstance(node, _Directory):
                raise _errno_error(errno.EISDIR, path)
            del parent.entries[name]
            parent.times_ns = (parent.times_ns[0], time.time_ns())

    def rmdir(self, path: str) -> None:
        with self._lock:
            parent, name = self._parent(path)
            node = parent.entries.get(name)
            if node is None:
                raise _errno_error(errno.ENOENT, path)
            if not isinstance(node, _Directory):
                raise _errno_error(errno.ENOTDIR, path)
            if node.entries:
                raise _errno_error(errno.ENOTEMPTY, path)
            del parent.entries[name]
            parent.times_ns = (parent.times_ns[0], time.time_ns())

    def rename(self, old: str, new: str) -> None:
        with self._lock:
            old_parent, old_name = self._parent(old)
            new_parent, new_name = self._parent(new)
            node = old_parent.entries.get(old_name)
            if node is None:
                raise _errno_error(errno.ENOENT, old)
            target = new_parent.entries.get(new_name)
            if target is node:
                return
            if isinstance(node, _Directory):
                if target is not None and not isinstance(target, _Directory):
                    raise _errno_error(errno.ENOTDIR, new)
                if isinstance(target, _Directory) and target.entries:
                    raise _errno_error(errno.ENOTEMPTY, new)
                ancestor: _Node = self.root  # a directory cannot move into itself
                for part in (p for p in new.split("/")[:-1] if p):
                    assert isinstance(ancestor, _Directory)
                    ancestor = ancestor.entries[part]
                    if ancestor is node:
                        raise _errno_error(errno.EINVAL, new)
            elif isinstance(target, _Directory):
                raise _errno_error(errno.EISDIR, new)
            del old_parent.entries[old_name]
            new_parent.entries[new_name] = node
            now = time.time_ns()
            old_parent.times_ns = new_parent.times_ns = (now, now)

    # ------------------------------------------------------------ the disk
    def cut(self) -> dict[str, Any]:
        """A power failure: everything not made durable is gone (see the module docstring)."""
        with self._lock:
            self.counters["cuts"] += 1
            stats = {"drop_unsynced": self.drop_unsynced, "files_reverted": 0, "bytes_dropped": 0, "names_undone": 0,
                     "files_vanished": 0, "directories_vanished": 0}
            if not self.drop_unsynced:
                return stats
            before = self._reachable()
            after: set[int] = set()
            stack: list[_Node] = [self.root]
            while stack:
                node = stack.pop()
                if id(node) in after:
                    continue
                after.add(id(node))
                if isinstance(node, _Directory):
                    stats["names_undone"] += node.revert()
                    stack.extend(node.entries.values())
                else:
                    dropped = node.revert()
                    if dropped:
                        stats["files_reverted"] += 1
                        stats["bytes_dropped"] += dropped
            for node in before:
                if id(node) not in after:
                    key = "directories_vanished" if isinstance(node, _Directory) else "files_vanished"
                    stats[key] += 1
                    if isinstance(node, _File):
                        stats["bytes_dropped"] += len(node.data)
            return stats

    def sync(self) -> dict[str, Any]:
        """sync(1) of the whole disk: everything reachable now becomes durable."""
        with self._lock:
            self.counters["syncs"] += 1
            nodes = self._reachable()
            for node in nodes:
                node.make_durable()
            return {"synced_nodes": len(nodes)}

    def stats(self) -> dict[str, Any]:
        with self._lock:
            files = [n for n in self._reachable() if isinstance(n, _File)]
            return {**self.counters, "files": len(files), "bytes_stored": sum(len(f.data) for f in files),
                    "unsynced_pages": sum(len(f.dirty) for f in files), "open_handles": len(self._handles),
                    "drop_unsynced": self.drop_unsynced}


# ====================================================================== FUSE adapter (in the child)
class _Operations:
    """mfusepy's Operations protocol over a PowerModel (a plain class: mfusepy looks methods
    up by name, and mfusepy itself is imported only in the child)."""

    use_ns = True  # times in nanoseconds
    # With both set, libfuse passes no path to operations that have a handle (read, write,
    # fsync, ftruncate, fstat...): the handle names the file, also after a rename or unlink.
    flag_nopath = True
    flag_nullpath_ok = True

    def __init__(self, model: PowerModel, on_init: Any) -> None:
        self.model = model
        self._on_init = on_init

    def init(self, path: str) -> None:
        self._on_init()

    def getattr(self, path: str | None, fh: int | None = None) -> dict[str, Any]:
        return self.model.getattr(path, fh)

    def chmod(self, path: str | None, mode: int) -> int:
        self.model.chmod(path, mode)
        return 0

    def chown(self, path: str | None, uid: int, gid: int) -> int:
        return 0  # owners are not modelled

    def utimens(self, path: str | None, times: tuple[int, int] | None = None) -> int:
        self.model.utimens(path, times)
        return 0

    def create(self, path: str, mode: int, flags: int = 0) -> int:
        return self.model.create(path, mode)

    def open(self, path: str, flags: int) -> int:
        return self.model.open(path, flags)

    def read(self, path: str | None, size: int, offset: int, fh: int) -> bytes:
        return self.model.read(path, size, offset, fh)

    def write(self, path: str | None, data: bytes, offset: int, fh: int) -> int:
        return self.model.write(path, data, offset, fh)

    def truncate(self, path: str | None, length: int, fh: int | None = None) -> int:
        self.model.truncate(path, length, fh)
        return 0

    def flush(self, path: str | None, fh: int) -> int:
        return 0  # close() does not make anything durable

    def release(self, path: str | None, fh: int) -> int:
        self.model.release(fh)
        return 0

    def fsync(self, path: str | None, datasync: int, fh: int) -> int:
        self.model.fsync(path, fh)
        return 0

    def opendir(self, path: str) -> int:
        return self.model.opendir(path)

    def readdir(self, path: str | None, fh: int) -> list[tuple[str, dict[str, int], int]]:
        return self.model.readdir(path, fh)

    def releasedir(self, path: str | None, fh: int) -> int:
        self.model.release(fh)
        return 0

    def fsyncdir(self, path: str | None, datasync: int, fh: int) -> int:
        self.model.fsync(path, fh)
        return 0

    def mkdir(self, path: str, mode: int) -> int:
        self.model.mkdir(path, mode)
        return 0

    def unlink(self, path: str) -> int:
        self.model.unlink(path)
        return 0

    def rmdir(self, path: str) -> int:
        self.model.rmdir(path)
        return 0

    def rename(self, old: str, new: str) -> int:
        self.model.rename(old, new)
        return 0

    def statfs(self, path: str) -> dict[str, int]:
        return {"f_bsize": PAGE_BYTES, "f_frsize": PAGE_BYTES, "f_blocks": STATFS_BLOCKS, "f_bfree": STATFS_BLOCKS,
                "f_bavail": STATFS_BLOCKS, "f_files": 1 << 20, "f_ffree": 1 << 20, "f_namemax": 255}


def _serve(mountpoint: str, drop_unsynced: bool) -> int:
    """The child: mount, answer control requests on stdin/stdout, return once unmounted."""
    model = PowerModel(drop_unsynced)
    out_lock = threading.Lock()

    def reply(document: dict[str, Any]) -> None:
        with out_lock:
            sys.stdout.write(json.dumps(document) + "\n")
            sys.stdout.flush()

    try:
        import mfusepy
    except (ImportError, OSError) as exc:  # mfusepy raises OSError when libfuse is missing
        reply({"ok": False, "error": f"cannot load mfusepy/libfuse3: {exc}"})
        return 1

    class PowerFUSE(mfusepy.FUSE):
        # mfusepy 3.x drops the handle of an ftruncate (libfuse 3 passes it, and no path with
        # nullpath_ok): Python's mmap.resize ftruncates, so the handle must reach truncate.
        # (mfusepy's per-version hook name: pyproject pins mfusepy below 4.)
        def truncate_fuse_3(self, path: bytes | None, length: int, fip: Any) -> int:
            handle = fip.contents.fh if fip else None
            name = None if path is None else path.decode(self.encoding, self.errors)
            return int(self.operations.truncate(name, length, handle) or 0)

    ready = threading.Event()

    def on_init() -> None:
        ready.set()
        reply({"ok": True, "ready": True, "pid": os.getpid()})

    threading.Thread(target=_control_loop, args=(model, reply, mountpoint, ready), daemon=True,
                     name="powerfs-control").start()
    options: dict[str, Any] = {
        "foreground": True, "fsname": "powerfs", "subtype": "powerfs",
        # Nothing cached by the kernel may outlive a cut: names, absences and sizes are asked every time.
        "attr_timeout": 0, "entry_timeout": 0, "negative_timeout": 0,
        "hard_remove": True, "use_ino": True,
    }
    if shutil.which("fusermount3"):
        options["auto_unmount"] = True  # fusermount3 unmounts even if this process is killed
    try:
        PowerFUSE(_Operations(model, on_init), mountpoint, **options)
    except Exception as exc:  # the mount failed, or the loop did
        reply({"ok": False, "error": f"mount failed: {exc!r}"})
        return 1
    return 0


def _control_loop(model: PowerModel, reply: Any, mountpoint: str, ready: threading.Event) -> None:
    """Control requests, one JSON line each; end of input (the harness closed or died) unmounts."""
    for line in sys.stdin:
        try:
            op = json.loads(line).get("op")
            if op == "cut":
                reply({"ok": True, **model.cut()})
            elif op == "sync":
                reply({"ok": True, **model.sync()})
            elif op == "stats":
                reply({"ok": True, **model.stats()})
            else:
                reply({"ok": False, "error": f"unknown op {op!r}"})
        except Exception as exc:  # a bad request must not kill the filesystem
            reply({"ok": False, "error": repr(exc)})
    if ready.is_set():
        unmount(mountpoint, lazy=True)


# ====================================================================== mounts
def _unescape_mount_path(field: str) -> str:
    # /proc/self/mounts escapes space, tab, newline and backslash as \ooo (octal).
    out, i = [], 0
    while i < len(field):
        code = field[i + 1:i + 4]
        if field[i] == "\\" and len(code) == 3 and code.isdigit():
            out.append(chr(int(code, 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def is_mounted(path: str | os.PathLike[str]) -> bool:
    """Whether something is mounted at ``path`` (from /proc/self/mounts, so a mount whose
    daemon died, which stat cannot reach, still counts)."""
    target = os.path.realpath(path)
    try:
        with open("/proc/self/mounts", encoding="utf-8") as mounts:
            return any(_unescape_mount_path(line.split()[1]) == target for line in mounts if line.strip())
    except OSError:
        return os.path.ismount(target)


def unmount(path: str | os.PathLike[str], lazy: bool = False) -> bool:
    """Unmount ``path`` (fusermount3, else umount); ``lazy`` detaches it even while busy.
    Returns whether nothing is mounted there afterwards."""
    path = os.fspath(path)
    commands = []
    if shutil.which("fusermount3"):
        commands.append(["fusermount3", "-u", "-q", *(["-z"] if lazy else []), path])
    if shutil.which("umount"):
        commands.append(["umount", *(["-l"] if lazy else []), path])
    for command in commands:
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            subprocess.run(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           timeout=UNMOUNT_COMMAND_TIMEOUT_S, check=False)
        if not is_mounted(path):
            return True
    return not is_mounted(path)


class PowerMount:
    """A powerfs mounted at ``mountpoint`` (an existing, empty directory) by a child process.

    :meth:`cut` drops everything not made durable, :meth:`sync` makes everything durable,
    :meth:`close` unmounts (retrying while the mount is busy, then detaching it) and stops
    the child. Thread-safe. ``drop_unsynced=False`` makes the control filesystem whose cut
    drops nothing. The child's stderr goes to ``log_path`` (default: this process's stderr).
    """

    def __init__(self, mountpoint: str | os.PathLike[str], *, drop_unsynced: bool = True,
                 log_path: str | os.PathLike[str] | None = None, start_timeout_s: float = START_TIMEOUT_S) -> None:
        reason = fuse_unavailable_reason()
        if reason is not None:
            raise PowerFSUnavailable(reason)
        self.mountpoint = Path(mountpoint).resolve()
        self.drop_unsynced = drop_unsynced
        self.log_path = Path(log_path) if log_path is not None else None
        self._lock = threading.Lock()
        self._buffer = b""
        self._closed = False
        if not self.mountpoint.is_dir():
            raise PowerFSError(f"{self.mountpoint} is not a directory")
        if is_mounted(self.mountpoint):
            raise PowerFSError(f"something is already mounted at {self.mountpoint}")
        command = [sys.executable, "-m", "rcq.testing.powerfs", str(self.mountpoint)]
        if not drop_unsynced:
            command.append("--keep-unsynced")
        log_file = open(self.log_path, "ab") if self.log_path is not None else None
        try:
            # Its own session: a Ctrl-C meant for the harness must not unmount the disk under
            # nodes that are still running; the harness closes it after stopping them.
            self._process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                             stderr=log_file, start_new_session=True)
        finally:
            if log_file is not None:
                log_file.close()
        try:
            answer = self._read_answer(time.monotonic() + start_timeout_s, "mount")
            if not answer.get("ready"):
                raise PowerFSError(f"powerfs at {self.mountpoint} did not start: {answer.get('error', answer)}"
                                   + self._log_tail())
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------ control
    def cut(self) -> dict[str, Any]:
        """Power failure: drop everything not made durable (see the module docstring). Returns
        what was dropped: files_reverted, bytes_dropped, names_undone, files_vanished..."""
        return self._request("cut")

    def sync(self) -> dict[str, Any]:
        """Make everything durable, as sync(1) of the whole disk."""
        return self._request("sync")

    def stats(self) -> dict[str, Any]:
        return self._request("stats")

    def _request(self, op: str) -> dict[str, Any]:
        with self._lock:
            if self._closed:
                raise PowerFSError(f"powerfs at {self.mountpoint} is closed")
            stdin = self._process.stdin
            assert stdin is not None
            try:
                stdin.write(json.dumps({"op": op}).encode() + b"\n")
                stdin.flush()
            except OSError as exc:
                raise PowerFSError(f"powerfs at {self.mountpoint} is gone ({exc})" + self._log_tail()) from exc
            answer = self._read_answer(time.monotonic() + REQUEST_TIMEOUT_S, op)
        if not answer.pop("ok", False):
            raise PowerFSError(f"powerfs {op} at {self.mountpoint}: {answer.get('error', answer)}")
        return answer

    def _read_answer(self, deadline: float, what: str) -> dict[str, Any]:
        """The child's next JSON line, waiting until ``deadline`` at most."""
        stdout = self._process.stdout
        assert stdout is not None
        fd = stdout.fileno()
        while b"\n" not in self._buffer:
            remaining_s = deadline - time.monotonic()
            if remaining_s <= 0:
                raise PowerFSError(f"powerfs at {self.mountpoint}: no answer to {what} in time" + self._log_tail())
            readable, _, _ = select.select([fd], [], [], remaining_s)
            if not readable:
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                code = self._process.poll()
                raise PowerFSError(f"powerfs at {self.mountpoint} exited ({code}) during {what}" + self._log_tail())
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return dict(json.loads(line))

    def _log_tail(self) -> str:
        if self.log_path is None:
            return " (its stderr is this process's)"
        try:
            with open(self.log_path, "rb") as log_file:
                log_file.seek(0, os.SEEK_END)
                log_file.seek(max(0, log_file.tell() - LOG_TAIL_BYTES))
                return f"; its log {self.log_path}:\n" + log_file.read().decode("utf-8", errors="replace")
        except OSError:
            return ""

    # ------------------------------------------------------------ lifecycle
    @property
    def mounted(self) -> bool:
        return is_mounted(self.mountpoint)

    @property
    def pid(self) -> int:
        return self._process.pid

    def close(self, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        """Unmount and stop the child; never leaves a mount behind (PowerFSError if it could not).

        A mount still busy (a process has a file open there) is retried for half of
        ``timeout_s``, then detached (lazy unmount: it leaves the namespace at once) and the
        child stopped at once: it would serve the files still open for as long as they are.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
        deadline = time.monotonic() + timeout_s
        try:
            for _ in deadline_loop(max(0.0, timeout_s / 2), UNMOUNT_RETRY_S):
                if not self.mounted or unmount(self.mountpoint):
                    break
            if self.mounted:
                unmount(self.mountpoint, lazy=True)
                deadline = time.monotonic()  # detached while busy: no point waiting for the child
        finally:
            self._stop_child(deadline)
        if self.mounted:
            raise PowerFSError(f"powerfs at {self.mountpoint} is still mounted after close")

    def _stop_child(self, deadline: float) -> None:
        process = self._process
        with contextlib.suppress(OSError):
            if process.stdin is not None:
                process.stdin.close()  # end of input: the child unmounts (if still mounted) and exits
        try:
            process.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)  # auto_unmount's fusermount3 unmounts after it
            process.wait(UNMOUNT_COMMAND_TIMEOUT_S)
            if self.mounted:
                unmount(self.mountpoint, lazy=True)
        if process.stdout is not None:
            process.stdout.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"pid {self._process.pid}"
        return f"PowerMount({str(self.mountpoint)!r}, {state}, drop_unsynced={self.drop_unsynced})"


def close_all(mounts: Iterable[PowerMount]) -> list[str]:
    """Close every mount, even when some fail; returns the failures' messages."""
    errors = []
    for mount in mounts:
        try:
            mount.close()
        except Exception as exc:
            errors.append(f"{mount.mountpoint}: {exc}")
    return errors


def main(argv: list[str] | None = None) -> int:
    """``python -m rcq.testing.powerfs MOUNTPOINT [--keep-unsynced]``: the child (see PowerMount)."""
    args = sys.argv[1:] if argv is None else argv
    positional = [a for a in args if not a.startswith("--")]
    if len(positional) != 1 or set(args) - {*positional, "--keep-unsynced"}:
        print("usage: python -m rcq.testing.powerfs MOUNTPOINT [--keep-unsynced]\n"
              "  (driven by rcq.testing.powerfs.PowerMount over stdin/stdout)", file=sys.stderr)
        return 2
    return _serve(positional[0], drop_unsynced="--keep-unsynced" not in args)


if __name__ == "__main__":
    sys.exit(main())
