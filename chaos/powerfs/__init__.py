"""powerfs: a FUSE filesystem that models a disk with a volatile write cache, and its power cut.

Test support for power failures (the chaos harness's ``power`` nemesis, issue 9): mount it on a
node's data directory, let the node run, kill it, :meth:`PowerMount.cut` the power, restart
it, and the node finds on "disk" exactly what it had made durable, nothing more::

    with PowerMount(data_dir) as disk:     # mounted; unmounted on close, also on failure
        ...                                 # the node writes, fsyncs, mmaps, renames
        disk.cut()                          # everything not made durable is gone

The filesystem is a child process (``python -m chaos.powerfs.serve MOUNTPOINT``) holding all
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
* **A stalled disk** (:meth:`PowerMount.stall` until :meth:`PowerMount.release`, the chaos
  harness's ``disk-stall`` nemesis): every fsync, fdatasync and fsyncdir hangs in its system call
  (the caller's thread blocks, as on a disk whose cache flush hangs; a process killed -9 meanwhile
  stays in D state until the release) while reads and writes go on (not those the kernel holds
  behind the inode lock it keeps across a FUSE fsync: writes to the file being synced, listing or
  changing the directory being synced); released, each completes as above. A cut fails the
  syncs hanging then with EIO (nothing they covered becomes durable) and leaves the disk
  stalled. Closing a mount releases its stall first (chaos/powerfs/stall.py).

Binding: ``mfusepy`` (ctypes over Debian's libfuse3; pure Python, so nothing to compile).
:func:`fuse_unavailable_reason` says, in plain words, why a mount cannot work here (no
/dev/fuse, no permission, no libfuse3, no mfusepy) so tests can skip loudly.

The model itself (files, directories, their durable and current states, the cut) is
chaos/powerfs/model.py, each file and directory chaos/powerfs/files.py; the child that serves it
over FUSE is chaos/powerfs/serve.py; this module drives the mount from the harness. Test machinery
of the chaos harness and its tests, run from a checkout (not in the wheel): the child finds
``chaos`` through ``PYTHONPATH`` set to the checkout.

Must not import: rcq.server (nor pysyncobj, lmdb, aiohttp); mfusepy only inside the child.
"""

from __future__ import annotations

import contextlib
import ctypes.util
import importlib.util
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Self

from rcq.local.polls import deadline_loop

START_TIMEOUT_S = 20.0  # mount and FUSE_INIT on a loaded 2-core machine
REQUEST_TIMEOUT_S = 30.0  # one control request (a cut copies every unsynced page of the mount)
CLOSE_TIMEOUT_S = 15.0  # unmount (retried while busy), then the child's exit
UNMOUNT_RETRY_S = 0.05
UNMOUNT_COMMAND_TIMEOUT_S = 10.0
LOG_TAIL_BYTES = 4_000


def _child_environment() -> dict[str, str]:
    """This environment, with the checkout that holds ``chaos`` first on ``PYTHONPATH``: the
    package is not installed, and the child may start in any directory."""
    checkout = str(Path(__file__).resolve().parents[2])
    inherited = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": checkout + (os.pathsep + inherited if inherited else "")}


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
    :meth:`stall` makes every sync hang until :meth:`release`,
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
        command = [sys.executable, "-m", "chaos.powerfs.serve", str(self.mountpoint)]
        if not drop_unsynced:
            command.append("--keep-unsynced")
        log_file = open(self.log_path, "ab") if self.log_path is not None else None
        try:
            # Its own session: a Ctrl-C meant for the harness must not unmount the disk under
            # nodes that are still running; the harness closes it after stopping them.
            self._process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                             stderr=log_file, start_new_session=True, env=_child_environment())
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

    def stall(self) -> dict[str, Any]:
        """Stall the disk: from now on every fsync, fdatasync and fsyncdir on the mount hangs in
        its system call until :meth:`release` (reads and writes go on). Returns ``stalled`` and
        ``syncs_blocked``."""
        return self._request("stall")

    def release(self) -> dict[str, Any]:
        """End a stall (none: nothing happens): the hanging syncs complete, making durable what
        they cover, as if the flush had just finished. ``released``: how many were hanging."""
        return self._request("release")

    def stats(self) -> dict[str, Any]:
        """Counters of the model, and ``stalled`` and ``syncs_blocked`` (hanging right now)."""
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

        A stall is released first: the syncs hanging on it complete, and their processes can exit.
        A mount still busy (a process has a file open there) is retried for half of
        ``timeout_s``, then detached (lazy unmount: it leaves the namespace at once) and the
        child stopped at once: it would serve the files still open for as long as they are.
        """
        with contextlib.suppress(PowerFSError):  # nothing may hang in a sync through the unmount
            self.release()
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
