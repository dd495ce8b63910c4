"""The forked state digest: the same value as in process, the lock free while the child hashes,
clear errors (never a hang, never a zombie) when the child dies or hangs, one child for callers
that wait together."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import gc
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from bench.stall import build_state
from rcq.errors import Unavailable
from rcq.server.core.commands import CommitBatch, CommitUnit, TransactionWrite, encode
from rcq.server.core.state_machine import QueueStateMachine
from rcq.server.raft import digest as digest_module
from rcq.server.raft.digest import ForkedDigest, forked_digest
from rcq.testing import InMemoryReplicator, async_wait_until, wait_until
from tests.helpers import LOCAL_WAIT_S
from tests.helpers.imports import imported_modules, top_level

APPLY_EVERY_S = 0.002  # while the digest child hashes, an apply this often (a pace, not a bound)


# ------------------------------------------------------------------ helpers
def apply_one(state_machine: QueueStateMachine, name: str, queue: str = "q") -> None:
    index = state_machine.last_index + 1
    write = TransactionWrite(name, enqueues=((queue, (name.encode(),)),))
    state_machine.apply(encode(CommitBatch(term=1, now_ms=1_000 + index, units=(CommitUnit((write,)),))), index)


def small_state() -> QueueStateMachine:
    """A few queues, a dequeue leaving tombstones, an idempotency key."""
    state_machine = QueueStateMachine()
    for i in range(30):
        apply_one(state_machine, f"t{i}", queue=("a", "a.b", "z_9")[i % 3])
    ids = state_machine.item_ids("a")
    index = state_machine.last_index + 1
    take = CommitUnit((TransactionWrite("take", dequeues=(("a", tuple(ids[2:5])),)),), idempotency_key="k")
    state_machine.apply(encode(CommitBatch(term=1, now_ms=5_000, units=(take,))), index)
    return state_machine


def in_process(state_machine: QueueStateMachine) -> tuple[str, int]:
    return state_machine.digest(), state_machine.last_index


def wait_for_file(path: Path, timeout_s: float = LOCAL_WAIT_S) -> None:
    """Bounded: raises WaitTimeout, a TimeoutError (in a child: it exits 1), when ``path`` never appears."""
    wait_until(path.exists, timeout_s, what=f"{path} to appear", interval_s=0.005)


def gated(compute: Callable[[], tuple[str, int]], gate: Path) -> Callable[[], tuple[str, int]]:
    """``compute`` that, in the child, first says it started (gate/started) and waits for gate/go."""
    def run() -> tuple[str, int]:
        (gate / "started").touch()
        wait_for_file(gate / "go")
        return compute()
    return run


def is_reaped(pid: int) -> bool:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True  # not (or no longer) our child: reaped
    return False


def open_fds() -> set[int]:
    return {int(fd) for fd in os.listdir("/proc/self/fd")}


@pytest.fixture
def gate(tmp_path: Path) -> Path:
    return tmp_path


@pytest.fixture
def pool() -> Iterator[concurrent.futures.ThreadPoolExecutor]:
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as executor:
        yield executor


# ------------------------------------------------------------------ the value
def test_the_forked_digest_is_the_in_process_digest() -> None:
    for state_machine in (QueueStateMachine(), small_state(), build_state(5_000, 100)):
        assert forked_digest(lambda sm=state_machine: in_process(sm), threading.Lock()) == in_process(state_machine)


async def test_the_in_memory_replicator_digest_is_the_in_process_digest() -> None:
    replicator = InMemoryReplicator(small_state())
    assert await replicator.digest() == in_process(replicator.state_machine)


# --------------------------------------------------- applies while it hashes
def test_applies_take_the_lock_while_the_child_hashes_a_big_state(
        gate: Path, pool: concurrent.futures.ThreadPoolExecutor) -> None:
    state_machine = build_state(200_000, 100)
    lock = threading.Lock()
    at_fork = in_process(state_machine)

    running = pool.submit(forked_digest, gated(lambda: in_process(state_machine), gate), lock, LOCAL_WAIT_S)
    wait_for_file(gate / "started")
    # The child exists and holds its copy: the state lock is free, the state moves on.
    started = time.monotonic()
    assert lock.acquire(timeout=0.5)
    try:
        apply_one(state_machine, "while-forked")
    finally:
        lock.release()
    (gate / "go").touch()
    applied_while_hashing = 0
    while not concurrent.futures.wait([running], timeout=APPLY_EVERY_S).done:
        assert lock.acquire(timeout=0.5), "an apply waited for the digest"
        try:
            apply_one(state_machine, f"while-hashing-{applied_while_hashing}")
        finally:
            lock.release()
        applied_while_hashing += 1
        assert time.monotonic() - started < LOCAL_WAIT_S

    assert running.result() == at_fork != in_process(state_machine)  # the state at the fork
    assert applied_while_hashing > 0


def test_the_lock_is_held_only_for_the_fork(monkeypatch: pytest.MonkeyPatch) -> None:
    lock = threading.Lock()
    held_at_fork: list[bool] = []
    real_fork = os.fork

    def fork() -> int:
        held_at_fork.append(lock.locked())
        return real_fork()

    monkeypatch.setattr(os, "fork", fork)
    state_machine = small_state()
    assert forked_digest(lambda: in_process(state_machine), lock) == in_process(state_machine)
    assert held_at_fork == [True] and not lock.locked()


# -------------------------------------------------- failures: clear, bounded
@pytest.mark.parametrize(("compute", "message"), [
    (lambda: os._exit(3), "exited with status 3 without an answer"),
    (lambda: os.kill(os.getpid(), signal.SIGKILL), "was killed by signal 9 without an answer"),
    (lambda: 1 / 0, "exited with status 1 without an answer"),  # traceback on stderr
    (lambda: ("two words", 1), "answered"),
])
def test_a_child_that_dies_or_answers_nonsense_gives_a_clear_error_and_no_zombie(
        compute: Callable[[], tuple[str, int]], message: str) -> None:
    fds = open_fds()
    with pytest.raises(Unavailable, match=message) as raised:
        forked_digest(compute, threading.Lock(), LOCAL_WAIT_S)
    assert is_reaped(raised.value.details["pid"])
    assert open_fds() == fds


def test_a_hung_child_is_killed_at_the_timeout_and_reaped(gate: Path) -> None:
    started = time.monotonic()
    with pytest.raises(Unavailable, match=r"gave no answer within 0\.3 s; it was killed") as raised:
        forked_digest(gated(lambda: ("never", 0), gate), threading.Lock(), timeout_s=0.3)
    assert time.monotonic() - started < 5
    assert is_reaped(raised.value.details["pid"])


def test_a_busy_lock_or_a_failed_fork_gives_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    fds = open_fds()
    lock = threading.Lock()
    with lock, pytest.raises(Unavailable, match=r"stayed locked for 0\.1 s"):
        forked_digest(lambda: ("x", 0), lock, timeout_s=0.1)

    def no_fork() -> int:
        raise OSError("no more processes")

    monkeypatch.setattr(os, "fork", no_fork)
    with pytest.raises(Unavailable, match=r"cannot fork .*no more processes"):
        forked_digest(lambda: ("x", 0), lock)
    assert not lock.locked() and open_fds() == fds


def test_the_child_keeps_only_its_pipe_no_gc_and_default_signal_actions() -> None:
    def inspect() -> tuple[str, int]:
        fds = sorted(int(fd) for fd in os.listdir("/proc/self/fd"))  # listdir's own fd included
        actions = [signal.getsignal(s) == signal.SIG_DFL for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)]
        return f"fds={fds}|gc={gc.isenabled()}|dfl={all(actions)}".replace(" ", ""), len(fds)

    previous = signal.signal(signal.SIGTERM, lambda *_: None)
    try:
        with contextlib.ExitStack() as stack:
            for _ in range(3):  # descriptors the parent holds: the child must not keep them
                stack.enter_context(open(os.devnull))
            answer, count = forked_digest(inspect, threading.Lock())
    finally:
        signal.signal(signal.SIGTERM, previous)
    # 0, 1, 2, the answer pipe and listdir's own descriptor.
    assert count == 5 and "gc=False|dfl=True" in answer, answer


# ------------------------------------------------------ one child at a time
async def test_concurrent_callers_share_one_child(gate: Path) -> None:
    state_machine = small_state()
    digests = ForkedDigest(gated(lambda: in_process(state_machine), gate), threading.Lock(), timeout_s=LOCAL_WAIT_S)
    calls = [asyncio.ensure_future(digests.digest()) for _ in range(5)]
    await async_wait_until(lambda: (gate / "started").exists(), LOCAL_WAIT_S, what="the child to start")
    (gate / "go").touch()
    assert await asyncio.wait_for(asyncio.gather(*calls), LOCAL_WAIT_S) == [in_process(state_machine)] * 5
    assert digests.children_forked == 1


async def test_a_caller_arriving_during_a_digest_gets_a_state_at_least_as_new_as_its_call(gate: Path) -> None:
    state_machine = small_state()
    lock = threading.Lock()
    digests = ForkedDigest(gated(lambda: in_process(state_machine), gate), lock, timeout_s=LOCAL_WAIT_S)
    first = asyncio.ensure_future(digests.digest())
    await async_wait_until(lambda: (gate / "started").exists(), LOCAL_WAIT_S, what="the first child to start")
    before = in_process(state_machine)
    with lock:
        apply_one(state_machine, "after-the-first-fork")
    later = [asyncio.ensure_future(digests.digest()) for _ in range(3)]
    await asyncio.sleep(0)  # one loop iteration (not a timed wait): the later calls arrive
    assert not any(call.done() for call in later)  # the first child is held at its gate
    (gate / "go").touch()

    assert await asyncio.wait_for(first, LOCAL_WAIT_S) == before
    assert await asyncio.wait_for(asyncio.gather(*later), LOCAL_WAIT_S) == [in_process(state_machine)] * 3
    assert digests.children_forked == 2  # the later callers shared the second child


async def test_a_caller_that_gives_up_leaves_the_child_to_be_reaped(gate: Path) -> None:
    digests = ForkedDigest(gated(lambda: ("d", 7), gate), threading.Lock(), timeout_s=LOCAL_WAIT_S)
    caller = asyncio.ensure_future(digests.digest())
    await async_wait_until(lambda: digests.child_pid is not None, LOCAL_WAIT_S, what="the child to fork")
    caller.cancel()  # as aiohttp does when a client disconnects
    with pytest.raises(asyncio.CancelledError):
        await caller
    (gate / "go").touch()
    await async_wait_until(lambda: digests.child_pid is None, LOCAL_WAIT_S, what="the child to be reaped")
    assert await asyncio.wait_for(digests.digest(), LOCAL_WAIT_S) == ("d", 7)


async def test_close_kills_a_running_child_and_later_calls_fail(gate: Path) -> None:
    digests = ForkedDigest(gated(lambda: ("d", 1), gate), threading.Lock(), timeout_s=60)
    running = asyncio.ensure_future(digests.digest())
    await async_wait_until(lambda: digests.child_pid is not None, LOCAL_WAIT_S, what="the child to fork")
    pid = digests.child_pid
    assert pid is not None

    started = time.monotonic()
    await asyncio.wait_for(digests.close(), LOCAL_WAIT_S)
    assert time.monotonic() - started < 5  # not the 60 s timeout
    with pytest.raises(Unavailable, match="cancelled: the node is stopping"):
        await running
    assert is_reaped(pid)
    with pytest.raises(Unavailable, match="stopping"):
        await digests.digest()


def test_the_module_imports_neither_pysyncobj_nor_aiohttp() -> None:
    path = "rcq/server/raft/digest.py"
    imports = imported_modules(Path(digest_module.__file__).read_text(encoding="utf-8"), path)
    assert "rcq.errors.Unavailable" in imports  # the checker sees its imports
    assert {top_level(module) for module in imports} & {"pysyncobj", "aiohttp", "lmdb"} == set()


def test_fork_child_exits_by_its_body_and_reap_knows_a_child_reaped_elsewhere() -> None:
    assert os.waitstatus_to_exitcode(digest_module.reap(digest_module.fork_child(lambda: None), LOCAL_WAIT_S)) == 0
    failing = digest_module.fork_child(lambda: 1 / 0, label="test")  # its traceback goes to stderr
    assert digest_module.describe_status(digest_module.reap(failing, LOCAL_WAIT_S)) == "exited with status 1"
    pid = digest_module.fork_child(lambda: None)
    os.waitpid(pid, 0)  # as a waitpid(-1) elsewhere in the process would
    assert digest_module.reap(pid, LOCAL_WAIT_S) == digest_module.REAPED_ELSEWHERE
