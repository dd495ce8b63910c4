"""powerfs (chaos/powerfs/), the disk with a volatile write cache behind the ``power``
nemesis: what is made durable survives a power cut, nothing else does. And its stall, behind the
``disk-stall`` nemesis: syncs hang until released, everything else goes on.

Through a real FUSE mount and real system calls (write, fsync, fdatasync, rename, ftruncate,
a shared mmap with and without msync, a process killed -9 with dirty pages). Every scenario
is also run on the *control* filesystem (``drop_unsynced=False``, a cut that drops nothing)
and must come out differently there: the assertions fail on a filesystem that never drops
anything. The page bookkeeping is checked against a plain reference model, without FUSE.

Skipped, with the reason, where FUSE cannot work (no /dev/fuse, not root, no libfuse3).
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chaos.powerfs import PowerFSError, PowerMount, fuse_unavailable_reason, is_mounted
from chaos.powerfs.model import PAGE_BYTES, PowerModel
from rcq.testing import wait_until
from tests.helpers import LOCAL_WAIT_S

FUSE_UNAVAILABLE = fuse_unavailable_reason()
needs_fuse = pytest.mark.skipif(FUSE_UNAVAILABLE is not None, reason=f"powerfs cannot mount here: {FUSE_UNAVAILABLE}")


# ------------------------------------------------------------------ helpers
def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write(path: Path, data: bytes, *, sync: bool = False, datasync: bool = False) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
        if sync:
            os.fsync(fd)
        if datasync:
            os.fdatasync(fd)
    finally:
        os.close(fd)


def read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


def durable_file(directory: Path, name: str, data: bytes) -> Path:
    """A file whose name and contents are both durable."""
    path = directory / name
    write(path, data, sync=True)
    fsync_dir(directory)
    return path


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Callable[..., PowerMount]]:
    """Mounts made by the test (``disk()`` or ``disk(drop_unsynced=False)``), all closed after it;
    none may be left mounted."""
    if FUSE_UNAVAILABLE is not None:
        pytest.skip(f"powerfs cannot mount here: {FUSE_UNAVAILABLE}")
    mounts: list[PowerMount] = []

    def make(drop_unsynced: bool = True) -> PowerMount:
        mountpoint = tmp_path / f"disk-{len(mounts)}"
        mountpoint.mkdir()
        mount = PowerMount(mountpoint, drop_unsynced=drop_unsynced, log_path=tmp_path / f"disk-{len(mounts)}.log")
        mounts.append(mount)
        return mount

    try:
        yield make
    finally:
        for mount in mounts:
            mount.close()
        assert not any(is_mounted(m.mountpoint) for m in mounts)


# ------------------------------------------------------------------ scenarios
# Each makes changes on a mount, cuts its power, and returns what is seen afterwards. Each test
# checks the strict filesystem's answer and that the control filesystem's answer differs.
def fsynced_data(root: Path, mount: PowerMount) -> object:
    write(root / "synced", b"made durable", sync=True)
    write(root / "datasynced", b"fdatasync too", datasync=True)
    fsync_dir(root)
    mount.cut()
    return read(root / "synced"), read(root / "datasynced")


def unsynced_data(root: Path, mount: PowerMount) -> object:
    path = durable_file(root, "file", b"version 1")
    with open(path, "r+b") as file:
        file.write(b"VERSION 2 and then some")  # written, never synced
    fresh = root / "never-synced"
    write(fresh, b"data never synced")
    fsync_dir(root)  # its name is durable, its data is not
    mount.cut()
    return read(path), read(fresh), os.stat(fresh).st_size


def mmap_writes(root: Path, mount: PowerMount) -> object:
    path = durable_file(root, "journal", bytes(3 * PAGE_BYTES))
    with open(path, "r+b") as file, mmap.mmap(file.fileno(), 0) as mapped:
        mapped[0:6] = b"msync!"
        mapped.flush()  # msync(MS_SYNC)
        mapped[PAGE_BYTES:PAGE_BYTES + 8] = b"unsynced"  # reaches the filesystem at munmap, unsynced
    mount.cut()
    data = read(path)
    assert data is not None
    return data[0:6], data[PAGE_BYTES:PAGE_BYTES + 8]


def killed_process_mmap(root: Path, mount: PowerMount) -> object:
    path = durable_file(root, "journal", b"")
    program = (
        "import mmap, os, sys, time\n"
        "f = open(sys.argv[1], 'r+b'); f.truncate(2 * 4096); os.fsync(f.fileno())\n"
        "m = mmap.mmap(f.fileno(), 0)\n"
        "m[0:4] = b'SYNC'; m.flush()\n"
        "m[4096:4100] = b'LOST'\n"
        "print('ready', flush=True); time.sleep(120)\n")
    with subprocess.Popen([sys.executable, "-c", program, str(path)], stdout=subprocess.PIPE) as child:
        try:
            assert child.stdout is not None and child.stdout.readline() == b"ready\n"
        finally:
            child.kill()  # kill -9
            child.wait()
    # Its dirty page was written back to the filesystem as it exited: there, but not durable.
    seen_before = read(path)
    assert seen_before is not None and seen_before[4096:4100] == b"LOST"
    assert mount.stats()["unsynced_pages"] >= 1
    mount.cut()
    data = read(path)
    assert data is not None
    return len(data), data[0:4], data[4096:4100]


def rename_without_directory_fsync(root: Path, mount: PowerMount) -> object:
    durable_file(root, "state", b"old state")
    write(root / "state.tmp", b"new state", sync=True)
    os.rename(root / "state.tmp", root / "state")
    mount.cut()
    return read(root / "state"), read(root / "state.tmp")


def new_file_in_unsynced_directory(root: Path, mount: PowerMount) -> object:
    write(root / "new", b"fsynced, but its name is not", sync=True)
    os.mkdir(root / "sub")
    write(root / "sub" / "inner", b"inner", sync=True)
    fsync_dir(root / "sub")  # inner's name is durable in sub, but sub's name is not in root
    mount.cut()
    return read(root / "new"), (root / "sub").exists(), sorted(os.listdir(root))


def unlink_without_directory_fsync(root: Path, mount: PowerMount) -> object:
    path = durable_file(root, "doomed", b"still here")
    os.unlink(path)
    mount.cut()
    return read(path)


def truncation(root: Path, mount: PowerMount) -> object:
    shrunk = durable_file(root, "shrunk", b"x" * 10_000)
    os.truncate(shrunk, 100)  # not synced: the cut gives the 10,000 bytes back
    grown = durable_file(root, "grown", b"abc")
    with open(grown, "r+b") as file:
        file.truncate(3 * PAGE_BYTES + 5)
        os.fsync(file.fileno())
        file.seek(2 * PAGE_BYTES)
        file.write(b"after the sync")
    holed = durable_file(root, "holed", b"")
    fd = os.open(holed, os.O_WRONLY)
    try:
        os.pwrite(fd, b"end", 2 * PAGE_BYTES)  # a hole, then three bytes
        os.fsync(fd)
        os.ftruncate(fd, 1)  # not synced
    finally:
        os.close(fd)
    mount.cut()
    grown_data, holed_data = read(grown), read(holed)
    assert grown_data is not None and holed_data is not None
    return (os.stat(shrunk).st_size, read(shrunk) == b"x" * 10_000,
            len(grown_data), grown_data[:3], grown_data[3:].count(0) == len(grown_data) - 3,
            len(holed_data), holed_data[-3:], holed_data[:-3].count(0) == len(holed_data) - 3)


def independent_files(root: Path, mount: PowerMount) -> object:
    a = durable_file(root, "a", b"a1")
    b = durable_file(root, "b", b"b1")
    fd_a, fd_b = os.open(a, os.O_WRONLY), os.open(b, os.O_WRONLY)
    try:
        for i in range(50):  # interleaved writes to both; only a is synced
            os.pwrite(fd_a, b"A%02d" % i, 3 * i)
            os.pwrite(fd_b, b"B%02d" % i, 3 * i)
        os.fsync(fd_a)
    finally:
        os.close(fd_a)
        os.close(fd_b)
    mount.cut()
    return read(a) == b"".join(b"A%02d" % i for i in range(50)), read(b)


SCENARIOS: dict[str, tuple[Callable[[Path, PowerMount], object], object, object]] = {
    # name: (scenario, after a cut on the strict filesystem, after a cut on the control one)
    "fsynced data": (fsynced_data, (b"made durable", b"fdatasync too"), (b"made durable", b"fdatasync too")),
    "unsynced data": (unsynced_data, (b"version 1", b"", 0),
                      (b"VERSION 2 and then some", b"data never synced", 17)),
    "mmap": (mmap_writes, (b"msync!", bytes(8)), (b"msync!", b"unsynced")),
    "killed process's mmap": (killed_process_mmap, (2 * PAGE_BYTES, b"SYNC", bytes(4)),
                              (2 * PAGE_BYTES, b"SYNC", b"LOST")),
    "rename": (rename_without_directory_fsync, (b"old state", None), (b"new state", None)),
    "new file": (new_file_in_unsynced_directory, (None, False, []),
                 (b"fsynced, but its name is not", True, ["new", "sub"])),
    "unlink": (unlink_without_directory_fsync, b"still here", None),
    "truncation": (truncation, (10_000, True, 3 * PAGE_BYTES + 5, b"abc", True, 2 * PAGE_BYTES + 3, b"end", True),
                   (100, False, 3 * PAGE_BYTES + 5, b"abc", False, 1, b"\x00", False)),
    "independent files": (independent_files, (True, b"b1"), (True, b"".join(b"B%02d" % i for i in range(50)))),
}


@needs_fuse
@pytest.mark.parametrize("name", SCENARIOS)
def test_a_cut_keeps_exactly_what_was_made_durable(disk, name):
    scenario, strict, _ = SCENARIOS[name]
    mount = disk()
    assert scenario(mount.mountpoint, mount) == strict


@needs_fuse
@pytest.mark.parametrize("name", [n for n in SCENARIOS if n != "fsynced data"])
def test_on_a_disk_that_drops_nothing_the_same_checks_fail(disk, name):
    """The control: a cut that drops nothing gives other answers, so the strict expectations
    above can fail: a filesystem that never drops anything does not meet them."""
    scenario, strict, control = SCENARIOS[name]
    mount = disk(drop_unsynced=False)
    seen = scenario(mount.mountpoint, mount)
    assert seen == control
    assert seen != strict


# ------------------------------------------------------------------ more of the model
@needs_fuse
def test_a_rename_made_durable_by_a_directory_fsync_survives(disk):
    mount = disk()
    root = mount.mountpoint
    durable_file(root, "state", b"old state")
    write(root / "state.tmp", b"new state", sync=True)
    os.rename(root / "state.tmp", root / "state")
    fsync_dir(root)
    mount.cut()
    assert read(root / "state") == b"new state"
    assert not (root / "state.tmp").exists()


@needs_fuse
def test_a_process_keeps_running_against_the_reverted_state(disk):
    mount = disk()
    root = mount.mountpoint
    path = durable_file(root, "open", b"durable!")
    fd = os.open(path, os.O_RDWR)
    try:
        os.pwrite(fd, b"VOLATILE" * 100, 0)
        assert os.pread(fd, 8, 0) == b"VOLATILE"
        mount.cut()
        assert os.fstat(fd).st_size == 8
        assert os.pread(fd, 100, 0) == b"durable!"  # its handle still works, on the durable state
        os.pwrite(fd, b"again", 0)
        assert read(path) == b"againle!"
    finally:
        os.close(fd)


@needs_fuse
def test_a_cut_of_one_mount_leaves_another_alone(disk):
    first, second = disk(), disk()
    for mount in (first, second):
        durable_file(mount.mountpoint, "file", b"durable")
        with open(mount.mountpoint / "file", "ab") as file:
            file.write(b" and unsynced")
    dropped = first.cut()
    assert dropped["files_reverted"] == 1 and dropped["bytes_dropped"] > 0
    assert read(first.mountpoint / "file") == b"durable"
    assert read(second.mountpoint / "file") == b"durable and unsynced"


@needs_fuse
def test_sync_makes_everything_durable(disk):
    mount = disk()
    root = mount.mountpoint
    os.makedirs(root / "a" / "b")
    write(root / "a" / "b" / "file", b"synced by sync()")
    mount.sync()
    mount.cut()
    assert read(root / "a" / "b" / "file") == b"synced by sync()"


@needs_fuse
def test_close_unmounts_also_while_a_file_is_open(disk, tmp_path):
    mount = disk()
    fd = os.open(mount.mountpoint / "busy", os.O_WRONLY | os.O_CREAT)  # kept open across the close
    try:
        assert mount.mounted
        mount.close(timeout_s=2.0)  # busy: retried, then detached
        assert not is_mounted(mount.mountpoint)
    finally:
        with contextlib.suppress(OSError):  # the filesystem behind it is gone: ENOTCONN
            os.close(fd)
    with pytest.raises(PowerFSError, match="closed"):
        mount.cut()
    mount.close()  # twice is fine


@needs_fuse
def test_a_failure_inside_the_with_block_still_unmounts(tmp_path):
    mountpoint = tmp_path / "disk"
    mountpoint.mkdir()
    with pytest.raises(ZeroDivisionError), PowerMount(mountpoint, log_path=tmp_path / "log") as mount:
        write(mountpoint / "file", b"x")
        assert mount.mounted
        1 / 0  # noqa: B018
    assert not is_mounted(mountpoint)


@needs_fuse
def test_a_killed_filesystem_process_leaves_no_mount(tmp_path):
    """Its child is killed -9 (a crash of the harness's helper): fusermount3's auto_unmount
    takes the mount away, and close still succeeds."""
    mountpoint = tmp_path / "disk"
    mountpoint.mkdir()
    mount = PowerMount(mountpoint, log_path=tmp_path / "log")
    try:
        os.kill(mount.pid, signal.SIGKILL)
        wait_until(lambda: not is_mounted(mountpoint), LOCAL_WAIT_S, what="the mount to go away")
    finally:
        mount.close()
    assert not is_mounted(mountpoint)


@needs_fuse
def test_mounting_over_a_mount_is_refused(disk):
    mount = disk()
    with pytest.raises(PowerFSError, match="already mounted"):
        PowerMount(mount.mountpoint)


# ------------------------------------------------------------------ a stalled disk
class Syncer:
    """``os.fsync`` of ``path`` in a thread of its own (where it may hang); ``error``: what it raised,
    ``mounted_on_return``: whether the mount was still there as it returned (its file still open)."""

    def __init__(self, path: Path, mountpoint: Path) -> None:
        self.path = path
        self.mountpoint = mountpoint
        self.error: BaseException | None = None
        self.mounted_on_return: bool | None = None
        self.returned = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True, name=f"fsync {path.name}")
        self.thread.start()

    def _run(self) -> None:
        fd = os.open(self.path, os.O_RDWR)
        try:
            os.fsync(fd)
        except BaseException as exc:
            self.error = exc
        finally:
            self.mounted_on_return = is_mounted(self.mountpoint)
            self.returned.set()
            with contextlib.suppress(OSError):
                os.close(fd)

    def wait(self) -> None:
        wait_until(self.returned.is_set, LOCAL_WAIT_S, what=f"the fsync of {self.path} to return")
        self.thread.join(LOCAL_WAIT_S)


def blocked(mount: PowerMount, count: int) -> None:
    wait_until(lambda: mount.stats()["syncs_blocked"] >= count, LOCAL_WAIT_S, what=f"{count} syncs hanging")


def in_a_thread(call: Callable[[], object]) -> object:
    """``call()``'s answer, made in another thread and waited for: a call that hangs fails the test."""
    answers: list[object] = []
    thread = threading.Thread(target=lambda: answers.append(call()), daemon=True)
    thread.start()
    wait_until(lambda: answers, LOCAL_WAIT_S, what="a read or write beside the hanging syncs")
    return answers[0]


@needs_fuse
def test_a_stalled_disk_holds_fsync_until_released_while_reads_and_writes_go_on(disk):
    mount = disk()
    root = mount.mountpoint
    journal = root / "journal"
    write(journal, b"durable once the stall ends")
    fsync_dir(root)  # its name is durable; its data is not yet
    assert mount.stall() == {"stalled": True, "syncs_blocked": 0}
    syncer = Syncer(journal, root)
    blocked(mount, 1)
    assert mount.stats()["stalled"]
    # Another file is written and read, the hanging one read, while the fsync hangs.
    assert in_a_thread(lambda: write(root / "other", b"written meanwhile")) is None
    assert in_a_thread(lambda: read(root / "other")) == b"written meanwhile"
    assert in_a_thread(lambda: read(journal)) == b"durable once the stall ends"
    assert syncer.thread.is_alive() and not syncer.returned.is_set(), "the fsync returned on a stalled disk"
    assert mount.stats()["syncs_blocked"] == 1
    answer = mount.release()
    assert answer["released"] == 1 and not answer["stalled"]
    syncer.wait()
    assert syncer.error is None
    assert mount.stats()["syncs_blocked"] == 0 and not mount.stats()["stalled"]
    mount.cut()
    assert read(journal) == b"durable once the stall ends"  # the fsync made it durable
    assert read(root / "other") is None  # never synced: the cut is as strict as ever


@needs_fuse
def test_more_hanging_syncs_than_libfuse_has_request_threads_by_default_leave_reads_and_writes_going(disk):
    """libfuse's loop runs at most 10 request threads unless told otherwise: 12 hanging syncs of
    12 files (one inode each: the kernel queues a second sync of one inode behind the first)."""
    mount = disk()
    root = mount.mountpoint
    paths = [durable_file(root, f"file-{i}", b"x") for i in range(12)]
    mount.stall()
    syncers = [Syncer(path, root) for path in paths]
    blocked(mount, len(paths))
    assert in_a_thread(lambda: write(root / "beside", b"still served")) is None
    assert in_a_thread(lambda: read(root / "beside")) == b"still served"
    assert mount.release()["released"] == len(paths)
    for syncer in syncers:
        syncer.wait()
        assert syncer.error is None


@needs_fuse
def test_closing_a_stalled_mount_releases_it_first(disk):
    mount = disk()
    path = durable_file(mount.mountpoint, "file", b"data")
    mount.stall()
    syncer = Syncer(path, mount.mountpoint)
    blocked(mount, 1)
    mount.close()
    syncer.wait()
    # Released before the unmount: not cut off from its filesystem (ENOTCONN), nor left hanging
    # until the busy mount was detached.
    assert syncer.error is None and syncer.mounted_on_return
    assert not is_mounted(mount.mountpoint)


def test_a_stalled_sync_holds_no_lock_and_a_cut_fails_it():
    """Without FUSE: the model's fsync waits outside its lock; a cut fails the waiting sync (EIO),
    nothing it covered becomes durable, and the disk stays stalled. On the control disk (a cut
    that drops nothing) the sync completes when released."""
    for drop_unsynced in (True, False):
        model = PowerModel(drop_unsynced)
        handle = model.create("/f", 0o644)
        model.fsync("/", None)
        model.write(None, b"unsynced", 0, handle)
        model.syncs.stall()
        outcome: list[object] = []

        def sync(model: PowerModel = model, handle: int = handle, outcome: list[object] = outcome) -> None:
            try:
                model.fsync(None, handle)
                outcome.append("synced")
            except OSError as exc:
                outcome.append(exc.errno)

        thread = threading.Thread(target=sync, daemon=True)
        thread.start()
        wait_until(lambda m=model: m.syncs.stats()["syncs_blocked"] == 1, LOCAL_WAIT_S, what="the sync to hang")
        assert in_a_thread(lambda m=model, h=handle: m.write(None, b"UN", 0, h)) == 2  # the lock is free
        dropped = model.cut()
        if drop_unsynced:
            wait_until(lambda o=outcome: o, LOCAL_WAIT_S, what="the cut to fail the hanging sync")
            assert outcome == [errno.EIO] and dropped["syncs_failed"] == 1
            assert model.read(None, 100, 0, handle) == b""  # nothing became durable
            assert model.stats()["stalled"]
        else:
            assert not outcome and dropped["syncs_failed"] == 0
        model.syncs.release()
        thread.join(LOCAL_WAIT_S)
        if not drop_unsynced:
            assert outcome == ["synced"] and model.stats()["unsynced_pages"] == 0


# ------------------------------------------------------------------ the model, without FUSE
@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(
    st.tuples(st.just("write"), st.integers(0, 5 * PAGE_BYTES), st.integers(1, 2 * PAGE_BYTES)),
    st.tuples(st.just("truncate"), st.integers(0, 6 * PAGE_BYTES), st.just(0)),
    st.tuples(st.just("fsync"), st.just(0), st.just(0)),
    st.tuples(st.just("cut"), st.just(0), st.just(0)),
), max_size=30))
def test_the_page_bookkeeping_matches_a_whole_file_reference(operations):
    """A cut leaves exactly the bytes of the last fsync, whatever the writes and truncations."""
    model = PowerModel()
    handle = model.create("/f", 0o644)
    model.fsync("/", None)
    current, durable = bytearray(), b""
    for step, (op, a, b) in enumerate(operations):
        if op == "write":
            chunk = bytes([step % 251 + 1]) * b
            model.write(None, chunk, a, handle)
            if a > len(current):
                current.extend(bytes(a - len(current)))
            current[a:a + b] = chunk
        elif op == "truncate":
            model.truncate(None, a, handle)
            current = current[:a] + bytearray(max(0, a - len(current)))
        elif op == "fsync":
            model.fsync(None, handle)
            durable = bytes(current)
        else:
            model.cut()
            current = bytearray(durable)
        assert model.read(None, 10 * PAGE_BYTES, 0, handle) == bytes(current)
    model.cut()
    assert model.read(None, 10 * PAGE_BYTES, 0, handle) == durable
    assert model.getattr("/f")["st_size"] == len(durable)


def test_the_model_refuses_what_a_filesystem_refuses():
    model = PowerModel()
    model.mkdir("/d", 0o755)
    model.release(model.create("/d/f", 0o644))
    for call, code in [(lambda: model.rmdir("/d"), "ENOTEMPTY"), (lambda: model.unlink("/d"), "EISDIR"),
                       (lambda: model.rename("/d", "/d/f/x"), "ENOTDIR"), (lambda: model.mkdir("/d", 0o755), "EEXIST"),
                       (lambda: model.getattr("/missing"), "ENOENT"), (lambda: model.rename("/d", "/d/inside"), "EINVAL")]:
        with pytest.raises(OSError) as raised:
            call()
        assert os.strerror(getattr(__import__("errno"), code)) in str(raised.value)
