"""The state digest, computed in a forked child from a copy-on-write image of the state.

:meth:`QueueStateMachine.digest` hashes the whole state: O(state), over a second per million
100-byte items. Computed under the state lock, it blocks pysyncobj's tick thread (applies,
heartbeats) for that long, and a big state then changes the leader (the same hazard as
snapshots, docs/raft-hazards.md, H9). :class:`ForkedDigest` holds the lock only for ``os.fork()``
(copying page tables: about 5-10 ms for a 250 MiB process, the GIL held too); the child computes
the digest and ``last_index`` on its frozen image, writes them to a pipe as one line and exits.
The value is the one ``digest()`` computes in process for the same state. The cost is memory:
reading an object changes its reference count, so the child copies most of the pages it reads
(about 170 MiB for a million 100-byte items; ``python -m bench.stall`` measures both).

The parent waits in a worker thread (never on the event loop), bounded by a timeout after which
the child is killed; it always reaps the child. At most one child runs at a time. A caller
shares a computation that has not forked yet; one that arrives after the fork waits for that
child, then shares the next one with every other caller that arrived meanwhile. So an answer is
never older than its request (read-your-writes, as the in-lock read was) and a caller waits for
at most two children.

:func:`fork_child` is the discipline of every forked child in rcq (the snapshot writer's too):
the child of a multi-threaded process owns only a copy of the forking thread, and every lock
another thread held stays held for ever, so it logs nothing, never collects garbage (a
collection would touch every object and copy the heap page by page), restores the default
action of the signals the node handles (asyncio's handlers would write to the *parent's*
wake-up fd), closes every descriptor it does not need (a child outliving a killed parent must
not keep the node's ports or files open) and ends with ``os._exit``.

Must not import: pysyncobj, aiohttp, lmdb.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import select
import signal
import threading
import time
import traceback
from collections.abc import Callable, Collection

from rcq.errors import Unavailable

DIGEST_TIMEOUT_S = 120.0  # a few million items take seconds; past this the child is killed
REAP_GRACE_S = 5.0  # a child that answered has this long to exit before it is killed
CANCEL_CHECK_S = 0.05  # how often a waiting parent looks at its cancel event
ANSWER_BYTES_MAX = 4096
REAPED_ELSEWHERE = -1  # reap()'s answer for a child something else reaped (a waitpid(-1) somewhere)
_CHILD_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

DigestCompute = Callable[[], tuple[str, int]]


# ------------------------------------------------------------ forked children
def fork_child(body: Callable[[], object], *, keep_fds: Collection[int] = (), label: str = "forked") -> int:
    """Fork; the child runs ``body`` and exits 0 (1 if it raised); the parent gets the child's pid.

    Raises OSError when the fork fails. The caller must reap the child (``os.waitpid``).
    """
    pid = os.fork()
    if pid:
        return pid
    status = 1  # pragma: no cover - everything below runs in the child, which never returns
    try:
        _settle_child(keep_fds)
        body()
        status = 0
    except BaseException:
        # No logging: a logging lock held by another parent thread at fork time stays held.
        with contextlib.suppress(BaseException):
            os.write(2, f"{label} child {os.getpid()} failed:\n{traceback.format_exc()}".encode())
    finally:
        os._exit(status)


def _settle_child(keep_fds: Collection[int]) -> None:  # pragma: no cover - runs in the child
    gc.disable()
    # ValueError: not the main thread; after a fork the forking thread is the child's main thread.
    with contextlib.suppress(ValueError):
        signal.set_wakeup_fd(-1)
    for signum in _CHILD_SIGNALS:
        with contextlib.suppress(ValueError, OSError):
            signal.signal(signum, signal.SIG_DFL)
    keep = sorted({fd for fd in keep_fds if fd > 2})
    low = 3
    for fd in keep:
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, os.sysconf("SC_OPEN_MAX"))


def reap(pid: int, timeout_s: float, *, kill_first: bool = False) -> int:
    """Wait for child ``pid`` to exit (SIGKILL after ``timeout_s``, or at once) and reap it; its wait
    status, or REAPED_ELSEWHERE when something else in the process reaped it first."""
    try:
        if kill_first:
            os.kill(pid, signal.SIGKILL)  # not reaped yet, so the pid is still this child's
        deadline = time.monotonic() + timeout_s
        delay_s = 0.001
        while time.monotonic() < deadline:
            reaped, status = os.waitpid(pid, os.WNOHANG)
            if reaped:
                return status
            time.sleep(delay_s)
            delay_s = min(delay_s * 2, 0.05)
        os.kill(pid, signal.SIGKILL)
        return os.waitpid(pid, 0)[1]
    except (ChildProcessError, ProcessLookupError):
        return REAPED_ELSEWHERE


def describe_status(status: int) -> str:
    if status == REAPED_ELSEWHERE:
        return "ended (reaped elsewhere, status unknown)"
    code = os.waitstatus_to_exitcode(status)
    return f"was killed by signal {-code}" if code < 0 else f"exited with status {code}"


# ------------------------------------------------------------- one digest
class ChildTimeout(Exception):
    """A forked child gave no answer line before the deadline."""


class ChildCancelled(Exception):
    """Waiting for a forked child's answer was cancelled (the node is stopping)."""


def forked_digest(compute: DigestCompute, lock: threading.Lock, timeout_s: float = DIGEST_TIMEOUT_S, *,
                  cancel: threading.Event | None = None,
                  on_fork: Callable[[int], None] | None = None) -> tuple[str, int]:
    """``compute()`` run in a child forked while holding ``lock``; blocking, so call it off the event loop.

    Raises :class:`~rcq.errors.Unavailable` when the lock stays busy, the fork fails, the child
    dies, or it does not answer within ``timeout_s`` (it is killed) or ``cancel`` is set. The child
    is reaped in every case.
    """
    deadline = time.monotonic() + timeout_s
    if cancel is not None and cancel.is_set():
        raise Unavailable("the state digest was cancelled: the node is stopping")
    read_fd, write_fd = os.pipe()
    try:
        if not lock.acquire(timeout=timeout_s):
            raise Unavailable(f"the state stayed locked for {timeout_s} s; no digest")
        try:  # the only moment applies wait for a digest
            pid = fork_child(lambda: _answer(write_fd, compute), keep_fds=(write_fd,), label="digest")
        except OSError as exc:
            raise Unavailable(f"cannot fork to compute the state digest: {exc}") from exc
        finally:
            lock.release()
    except BaseException:
        os.close(read_fd)
        os.close(write_fd)
        raise
    os.close(write_fd)  # the child's copy is now the only writer: EOF when it dies
    try:
        if on_fork is not None:
            on_fork(pid)
        answer = read_answer_line(read_fd, deadline, cancel)
    except BaseException as exc:
        reap(pid, 0.0, kill_first=True)
        if isinstance(exc, ChildTimeout):
            raise Unavailable(f"the digest child {pid} gave no answer within {timeout_s} s; it was killed",
                              details={"pid": pid}) from None
        if isinstance(exc, ChildCancelled):
            raise Unavailable("the state digest was cancelled: the node is stopping",
                              details={"pid": pid}) from None
        raise
    finally:
        os.close(read_fd)
    status = reap(pid, REAP_GRACE_S)  # an answer came (the child is exiting) or the pipe closed (it died)
    if answer is None:
        raise Unavailable(f"the digest child {pid} {describe_status(status)} without an answer",
                          details={"pid": pid})
    return _parse(answer, pid)


def _answer(write_fd: int, compute: DigestCompute) -> None:  # pragma: no cover - runs in the child
    digest, index = compute()
    line = f"{digest} {int(index)}\n".encode()
    while line:
        line = line[os.write(write_fd, line):]


def read_answer_line(read_fd: int, deadline: float, cancel: threading.Event | None) -> bytes | None:
    """A forked child's answer line; None when the pipe closes before a whole line (or the line
    is too long). Raises ChildTimeout past ``deadline``, ChildCancelled once ``cancel`` is set."""
    poller = select.poll()  # not select.select: descriptors past 1024 are common in a server
    poller.register(read_fd, select.POLLIN)
    data = b""
    while not data.endswith(b"\n"):
        if cancel is not None and cancel.is_set():
            raise ChildCancelled()
        remaining_s = deadline - time.monotonic()
        if remaining_s <= 0:
            raise ChildTimeout()
        if not poller.poll(max(1, int(min(remaining_s, CANCEL_CHECK_S) * 1000))):
            continue
        chunk = os.read(read_fd, ANSWER_BYTES_MAX)
        if not chunk or len(data) + len(chunk) > ANSWER_BYTES_MAX:
            return None
        data += chunk
    return data


def _parse(answer: bytes, pid: int) -> tuple[str, int]:
    try:
        digest, index = answer.decode().split()
        return digest, int(index)
    except ValueError:
        raise Unavailable(f"the digest child {pid} answered {answer[:100]!r}", details={"pid": pid}) from None


# ------------------------------------------------------ shared, one at a time
class ForkedDigest:
    """Digests of one state, one child at a time, shared by the callers that wait together.

    ``compute`` runs in the child (the replicator's: the state machine's ``digest()`` and
    ``last_index``); ``lock`` is the state lock, held only while forking.
    """

    def __init__(self, compute: DigestCompute, lock: threading.Lock, *, timeout_s: float = DIGEST_TIMEOUT_S) -> None:
        self._compute = compute
        self._lock = lock
        self._timeout_s = timeout_s
        self._closing = threading.Event()
        self._current: asyncio.Future[tuple[str, int]] | None = None
        self._current_number = 0  # computations started, the current one included
        self._current_sealed = False  # set by the current one's thread just before it takes the lock
        self.children_forked = 0
        self.child_pid: int | None = None  # the running child, for tests and logs (do not signal it)

    async def digest(self) -> tuple[str, int]:
        """``compute()`` on the state as of a moment after this call began; Unavailable on failure."""
        current = self._current
        if current is not None and not current.done() and not self._current_sealed:
            return await asyncio.shield(current)  # it has not forked yet: it will fork after now
        arrived = self._current_number
        while True:
            current = self._current
            if current is not None and self._current_number > arrived:
                return await asyncio.shield(current)  # started after this call began
            if current is not None and not current.done():
                await asyncio.wait([current])  # forked before this call began: its state may be older
                continue
            if self._closing.is_set():
                raise Unavailable("the replicator is stopping: no state digest")
            self._current_number += 1
            self._current_sealed = False
            self._current = asyncio.ensure_future(asyncio.to_thread(self._run))
            self._current.add_done_callback(_retrieve)

    def _run(self) -> tuple[str, int]:
        self._current_sealed = True  # callers arriving from now on may be later than the fork
        try:
            return forked_digest(self._compute, self._lock, self._timeout_s, cancel=self._closing,
                                 on_fork=self._forked)
        finally:
            self.child_pid = None

    def _forked(self, pid: int) -> None:
        self.children_forked += 1
        self.child_pid = pid

    async def close(self) -> None:
        """Kill a running child, wait until it is reaped; later calls raise Unavailable."""
        self._closing.set()
        if self._current is not None:
            await asyncio.wait([self._current])


def _retrieve(future: asyncio.Future[tuple[str, int]]) -> None:
    """Mark a failure as seen: the callers that shared it may all have been cancelled."""
    if not future.cancelled():
        future.exception()
