"""powerfs's child process: serves a PowerModel over FUSE (mfusepy over libfuse3) at a
mountpoint, and answers the harness's control requests (cut, sync, stall, release, stats) on
stdin/stdout. Started and driven by chaos.powerfs.PowerMount; the durability model is written
out at the top of that module, the stall in chaos/powerfs/stall.py.

libfuse runs its multi-threaded loop here (mfusepy passes no ``-s``: ``nothreads`` is not set),
so a sync hanging on a stalled disk holds one request thread while the others serve reads and
writes; ``max_threads`` lifts libfuse's cap of 10 such threads (libfuse 3.12 and later), so that
many hanging syncs (several processes of a node, a killed one's among them) cannot take them all.

Must not import: rcq.server; mfusepy is imported here only, in the child.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import threading
from typing import Any

from chaos.powerfs import unmount
from chaos.powerfs.files import PAGE_BYTES
from chaos.powerfs.model import PowerModel

STATFS_BLOCKS = 1 << 24  # what df shows: 64 GiB, all free (memory is the real limit)
FUSE_MAX_THREADS = 256  # request threads at most: each sync hanging on a stall holds one


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
        "hard_remove": True, "use_ino": True, "max_threads": FUSE_MAX_THREADS,
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
            elif op == "stall":
                reply({"ok": True, **model.syncs.stall()})
            elif op == "release":
                reply({"ok": True, **model.syncs.release()})
            elif op == "stats":
                reply({"ok": True, **model.stats()})
            else:
                reply({"ok": False, "error": f"unknown op {op!r}"})
        except Exception as exc:  # a bad request must not kill the filesystem
            reply({"ok": False, "error": repr(exc)})
    # No sync may hang through the unmount: libfuse cancels its request threads when its loop ends.
    model.syncs.release()
    if ready.is_set():
        unmount(mountpoint, lazy=True)


def main(argv: list[str] | None = None) -> int:
    """``python -m chaos.powerfs.serve MOUNTPOINT [--keep-unsynced]``: the child (see PowerMount)."""
    args = sys.argv[1:] if argv is None else argv
    positional = [a for a in args if not a.startswith("--")]
    if len(positional) != 1 or set(args) - {*positional, "--keep-unsynced"}:
        print("usage: python -m chaos.powerfs.serve MOUNTPOINT [--keep-unsynced]\n"
              "  (driven by chaos.powerfs.PowerMount over stdin/stdout)", file=sys.stderr)
        return 2
    return _serve(positional[0], drop_unsynced="--keep-unsynced" not in args)


if __name__ == "__main__":
    sys.exit(main())
