"""powerfs's model: an in-memory filesystem with a durable and a current state per file and
directory (chaos.powerfs.files), and the power cut that reverts one to the other. The durability
model is written out at the top of chaos/powerfs/__init__.py (the FUSE mount that serves it).

Pure Python, no FUSE: testable without a mount (tests/chaos/test_powerfs.py checks its page
bookkeeping against a whole-file model with hypothesis).

Must not import: rcq.server, mfusepy.
"""

from __future__ import annotations

import errno
import os
import stat
import threading
import time
from typing import Any

from chaos.powerfs.files import PAGE_BYTES, Directory, File, Node, errno_error
from chaos.powerfs.stall import SyncStall


class PowerModel:
    """The in-memory filesystem with the durability model of the module docstring.

    Thread-safe (one lock: libfuse calls from several threads). Paths are absolute within the
    mount (``/a/b``); handles are the numbers :meth:`open`, :meth:`create` and :meth:`opendir`
    return. Errors are ``OSError`` with the errno a real filesystem would give. ``syncs`` is the
    stall gate every :meth:`fsync` passes first, outside the lock (chaos.powerfs.stall).
    """

    def __init__(self, drop_unsynced: bool = True) -> None:
        self.drop_unsynced = drop_unsynced
        self._lock = threading.Lock()
        self._next_number = 2
        self.root = Directory(1, stat.S_IFDIR | 0o755)
        self.root.make_durable()
        self._handles: dict[int, Node] = {}
        self._next_handle = 1
        self.counters = {"cuts": 0, "fsyncs": 0, "fsyncdirs": 0, "writes": 0, "syncs": 0}
        self.syncs = SyncStall()

    # ------------------------------------------------------------ helpers (lock held)
    def _number(self) -> int:
        self._next_number += 1
        return self._next_number

    def _resolve(self, path: str) -> Node:
        node: Node = self.root
        for part in (p for p in path.split("/") if p):
            if not isinstance(node, Directory):
                raise errno_error(errno.ENOTDIR, path)
            child = node.entries.get(part)
            if child is None:
                raise errno_error(errno.ENOENT, path)
            node = child
        return node

    def _parent(self, path: str) -> tuple[Directory, str]:
        head, _, name = path.rstrip("/").rpartition("/")
        if not name:
            raise errno_error(errno.EBUSY, "the mount's root")
        parent = self._resolve(head or "/")
        if not isinstance(parent, Directory):
            raise errno_error(errno.ENOTDIR, head)
        return parent, name

    def _node(self, path: str | None, handle: int | None) -> Node:
        if handle is not None and handle in self._handles:
            return self._handles[handle]
        if path is None:
            raise errno_error(errno.EBADF)
        return self._resolve(path)

    def _file(self, path: str | None, handle: int | None) -> File:
        node = self._node(path, handle)
        if not isinstance(node, File):
            raise errno_error(errno.EISDIR, path or "")
        return node

    def _new_handle(self, node: Node) -> int:
        handle = self._next_handle
        self._next_handle += 1
        self._handles[handle] = node
        return handle

    def _reachable(self) -> list[Node]:
        """Every file and directory processes can reach now."""
        seen: dict[int, Node] = {}
        stack: list[Node] = [self.root]
        while stack:
            node = stack.pop()
            if id(node) in seen:
                continue
            seen[id(node)] = node
            if isinstance(node, Directory):
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
            if isinstance(node, Directory):
                attrs["st_nlink"] = 2 + sum(isinstance(c, Directory) for c in node.entries.values())
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
            if isinstance(existing, Directory):
                raise errno_error(errno.EISDIR, path)
            node = existing if existing is not None else File(self._number(), stat.S_IFREG | stat.S_IMODE(mode))
            parent.entries[name] = node
            parent.times_ns = (parent.times_ns[0], time.time_ns())
            return self._new_handle(node)

    def open(self, path: str, flags: int = os.O_RDONLY) -> int:
        with self._lock:
            node = self._resolve(path)
            if isinstance(node, Directory) and flags & os.O_ACCMODE != os.O_RDONLY:
                raise errno_error(errno.EISDIR, path)
            if isinstance(node, File) and flags & os.O_TRUNC:
                node.truncate(0)
            return self._new_handle(node)

    def opendir(self, path: str) -> int:
        with self._lock:
            node = self._resolve(path)
            if not isinstance(node, Directory):
                raise errno_error(errno.ENOTDIR, path)
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
        """fsync/fdatasync (and so msync(MS_SYNC)) of a file, or fsync of a directory. On a
        stalled disk it waits first, without the lock, until released (EIO if a cut comes first)."""
        self.syncs.wait()
        with self._lock:
            node = self._node(path, handle)
            if isinstance(node, Directory):
                self.counters["fsyncdirs"] += 1
            else:
                self.counters["fsyncs"] += 1
            node.make_durable()

    # ------------------------------------------------------------ directories
    def readdir(self, path: str | None, handle: int | None = None) -> list[tuple[str, dict[str, int], int]]:
        """(name, {st_mode, st_ino}, 0) for ``.``, ``..`` and each entry (readdir skips inode 0)."""
        with self._lock:
            node = self._node(path, handle)
            if not isinstance(node, Directory):
                raise errno_error(errno.ENOTDIR, path or "")
            here = {"st_mode": node.mode, "st_ino": node.number}
            return [(".", here, 0), ("..", here, 0),
                    *((name, {"st_mode": child.mode, "st_ino": child.number}, 0) for name, child in node.entries.items())]

    def mkdir(self, path: str, mode: int) -> None:
        with self._lock:
            parent, name = self._parent(path)
            if name in parent.entries:
                raise errno_error(errno.EEXIST, path)
            parent.entries[name] = Directory(self._number(), stat.S_IFDIR | stat.S_IMODE(mode))
            parent.times_ns = (parent.times_ns[0], time.time_ns())

    def unlink(self, path: str) -> None:
        with self._lock:
            parent, name = self._parent(path)
            node = parent.entries.get(name)
            if node is None:
                raise errno_error(errno.ENOENT, path)
            if isinstance(node, Directory):
                raise errno_error(errno.EISDIR, path)
            del parent.entries[name]
            parent.times_ns = (parent.times_ns[0], time.time_ns())

    def rmdir(self, path: str) -> None:
        with self._lock:
            parent, name = self._parent(path)
            node = parent.entries.get(name)
            if node is None:
                raise errno_error(errno.ENOENT, path)
            if not isinstance(node, Directory):
                raise errno_error(errno.ENOTDIR, path)
            if node.entries:
                raise errno_error(errno.ENOTEMPTY, path)
            del parent.entries[name]
            parent.times_ns = (parent.times_ns[0], time.time_ns())

    def rename(self, old: str, new: str) -> None:
        with self._lock:
            old_parent, old_name = self._parent(old)
            new_parent, new_name = self._parent(new)
            node = old_parent.entries.get(old_name)
            if node is None:
                raise errno_error(errno.ENOENT, old)
            target = new_parent.entries.get(new_name)
            if target is node:
                return
            if isinstance(node, Directory):
                if target is not None and not isinstance(target, Directory):
                    raise errno_error(errno.ENOTDIR, new)
                if isinstance(target, Directory) and target.entries:
                    raise errno_error(errno.ENOTEMPTY, new)
                ancestor: Node = self.root  # a directory cannot move into itself
                for part in (p for p in new.split("/")[:-1] if p):
                    assert isinstance(ancestor, Directory)
                    ancestor = ancestor.entries[part]
                    if ancestor is node:
                        raise errno_error(errno.EINVAL, new)
            elif isinstance(target, Directory):
                raise errno_error(errno.EISDIR, new)
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
                     "files_vanished": 0, "directories_vanished": 0, "syncs_failed": 0}
            if not self.drop_unsynced:
                return stats  # a battery-backed cache: syncs waiting on a stall still complete when released
            stats["syncs_failed"] = self.syncs.interrupt()  # those waiting on a stall never completed: EIO
            before = self._reachable()
            after: set[int] = set()
            stack: list[Node] = [self.root]
            while stack:
                node = stack.pop()
                if id(node) in after:
                    continue
                after.add(id(node))
                if isinstance(node, Directory):
                    stats["names_undone"] += node.revert()
                    stack.extend(node.entries.values())
                else:
                    dropped = node.revert()
                    if dropped:
                        stats["files_reverted"] += 1
                        stats["bytes_dropped"] += dropped
            for node in before:
                if id(node) not in after:
                    key = "directories_vanished" if isinstance(node, Directory) else "files_vanished"
                    stats[key] += 1
                    if isinstance(node, File):
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
            files = [n for n in self._reachable() if isinstance(n, File)]
            return {**self.counters, "files": len(files), "bytes_stored": sum(len(f.data) for f in files),
                    "unsynced_pages": sum(len(f.dirty) for f in files), "open_handles": len(self._handles),
                    "drop_unsynced": self.drop_unsynced, **self.syncs.stats()}
