"""SyncClient: the async client's API for synchronous code, on a loop thread of its own.

Three parts: the API matches RcqClient's and Transaction's method for method (checked on the
classes, so that a new verb without its synchronous twin fails here); the loop thread
(:class:`LoopThread`) starts, stops, refuses and cancels as documented; and a SyncClient drives
an in-process node (the HTTP app over the in-memory replicator). That node runs on a loop thread
of its own too, as a server would, so the tests themselves are plain synchronous code.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import inspect
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rcq.client import (
    InvalidQueueName,
    InvalidRequest,
    QueueNotFound,
    RcqClient,
    SyncClient,
    SyncTransaction,
    Transaction,
    TransactionNotFound,
)
from rcq.client.loop_thread import LoopThread
from rcq.testing import wait_until
from tests.helpers import LOCAL_WAIT_S
from tests.helpers.nodes import running_node, url_of

UNKNOWN_TRANSACTION_ID = "1." + "0" * 24
THREADS = 8


# ====================================================================== the API, method for method
ASYNC_TO_SYNC = {"__aenter__": "__enter__", "__aexit__": "__exit__"}


def synchronous(annotation: str) -> str:
    """An annotation of the async API as the synchronous API writes it."""
    return re.sub(r"\bTransaction(Context)?\b", r"SyncTransaction\1", annotation)


def counterpart_problems(async_class: type, sync_class: type, *, constructor: bool = False) -> list[str]:
    """What ``sync_class`` lacks to be ``async_class`` for synchronous code: each public method
    (coroutine or not) with the same parameters, not a coroutine, its annotations with
    SyncTransaction for Transaction; each property; ``with`` for ``async with``; ``constructor``:
    ``__init__`` with the same parameters too."""
    own = (*ASYNC_TO_SYNC, "__init__") if constructor else tuple(ASYNC_TO_SYNC)
    problems = []
    for name, member in inspect.getmembers(async_class):
        if isinstance(member, property):
            if not isinstance(getattr(sync_class, name, None), property):
                problems.append(f"{name}: no property")
            continue
        if not inspect.isfunction(member) or (name.startswith("_") and name not in own):
            continue
        counterpart = getattr(sync_class, ASYNC_TO_SYNC.get(name, name), None)
        if counterpart is None or not inspect.isfunction(counterpart):
            problems.append(f"{name}: missing")
        elif inspect.iscoroutinefunction(counterpart):
            problems.append(f"{name}: a coroutine function")
        elif name not in ASYNC_TO_SYNC:
            problems += _signature_problems(name, inspect.signature(member), inspect.signature(counterpart))
    return problems


def _signature_problems(name: str, wanted: inspect.Signature, got: inspect.Signature) -> list[str]:
    def shape(signature: inspect.Signature) -> list[tuple[Any, ...]]:
        return [(p.name, p.kind, p.default, synchronous(str(p.annotation))) for p in signature.parameters.values()]

    problems = []
    if shape(wanted) != shape(got):
        problems.append(f"{name}: parameters {shape(got)}, not {shape(wanted)}")
    if synchronous(str(wanted.return_annotation)) != str(got.return_annotation):
        problems.append(f"{name}: returns {got.return_annotation}, not {synchronous(str(wanted.return_annotation))}")
    return problems


def test_every_public_method_of_rcq_client_has_a_synchronous_twin_with_the_same_parameters():
    assert inspect.iscoroutinefunction(RcqClient.enqueue), "the checker would compare nothing async"
    assert counterpart_problems(RcqClient, SyncClient, constructor=True) == []


def test_every_public_method_and_attribute_of_transaction_has_a_synchronous_twin():
    assert counterpart_problems(Transaction, SyncTransaction) == []
    attributes = [name for name in vars(Transaction(None, "t")) if not name.startswith("_")]
    assert "state" in attributes
    assert [name for name in attributes if not isinstance(getattr(SyncTransaction, name, None), property)] == []


def test_the_checker_finds_a_forgotten_verb_a_changed_default_and_an_unwrapped_transaction():
    class Async:
        async def old(self, queue: str, wait_ms: int = 0) -> Transaction: ...
        async def new(self) -> None: ...

    class Sync:
        def old(self, queue: str, wait_ms: int = 1) -> Transaction: ...

    problems = counterpart_problems(Async, Sync)
    assert [problem.split(":")[0] for problem in problems] == ["new", "old", "old"]
    assert problems[0] == "new: missing"
    assert problems[1].startswith("old: parameters") and "1, 'int')], not" in problems[1]
    assert problems[2] == "old: returns Transaction, not SyncTransaction"


def test_the_synchronous_client_is_exported_from_the_package():
    import rcq.client

    assert {"SyncClient", "SyncTransaction"} <= set(rcq.client.__all__)


# ====================================================================== the loop thread
async def answer(value: Any) -> Any:
    return value


async def nothing() -> None:
    return None


def test_the_thread_starts_on_the_first_call_and_is_gone_after_close():
    runner = LoopThread(nothing, name="test-loop")
    assert runner.thread is None
    assert runner.run(answer(1)) == 1
    thread = runner.thread
    assert thread is not None and thread.is_alive() and thread.daemon
    assert runner.run(answer(2)) == 2 and runner.thread is thread  # one thread for every call
    runner.close()
    assert not thread.is_alive() and thread not in threading.enumerate()


def test_a_closed_runner_refuses_calls_and_closing_again_is_harmless():
    closes = []

    async def on_close() -> None:
        closes.append(1)

    runner = LoopThread(on_close)
    runner.run(answer(1))
    runner.close()
    runner.close()
    assert closes == [1]
    with pytest.raises(RuntimeError, match="closed"):
        runner.run(answer(1))


def test_a_runner_closed_before_any_call_never_starts_a_thread_nor_runs_on_close():
    closes = []

    async def on_close() -> None:
        closes.append(1)

    runner = LoopThread(on_close)
    runner.close()
    assert runner.thread is None and closes == []


def test_a_call_from_the_loop_thread_raises_instead_of_waiting_for_itself():
    runner = LoopThread(nothing)

    async def call_back_in() -> Any:
        return runner.run(answer(1))  # as a logging handler using the client would, on the loop

    try:
        with pytest.raises(RuntimeError, match="own event loop's thread"):
            runner.run(call_back_in())
    finally:
        runner.close()


def test_an_exception_comes_back_as_the_coroutine_raised_it():
    runner = LoopThread(nothing)
    error = QueueNotFound("gone")

    async def fail() -> None:
        raise error

    try:
        with pytest.raises(QueueNotFound) as raised:
            runner.run(fail())
        assert raised.value is error
    finally:
        runner.close()


def test_on_close_failing_is_raised_by_close_and_the_thread_still_ends():
    async def on_close() -> None:
        raise OSError("socket trouble")

    runner = LoopThread(on_close)
    runner.run(answer(1))
    with pytest.raises(OSError, match="socket trouble"):
        runner.close()
    assert runner.thread is not None and not runner.thread.is_alive()


def test_calls_from_several_threads_run_at_once_on_the_loop():
    """One thread's call waits for what another thread's call does: serialised calls would time out."""
    runner = LoopThread(nothing)
    released = asyncio.Event()
    waiting = threading.Event()

    async def wait_for_release() -> str:
        waiting.set()
        await asyncio.wait_for(released.wait(), LOCAL_WAIT_S)
        return "released"

    async def release() -> None:
        released.set()

    try:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            waiter = pool.submit(runner.run, wait_for_release())
            assert waiting.wait(LOCAL_WAIT_S)
            runner.run(release())
            assert waiter.result(LOCAL_WAIT_S) == "released"
    finally:
        runner.close()


def test_closing_cancels_a_call_still_running_and_its_caller_is_told():
    runner = LoopThread(nothing)
    started = threading.Event()

    async def forever() -> None:
        started.set()
        await asyncio.Event().wait()

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        caller = pool.submit(runner.run, forever())
        assert started.wait(LOCAL_WAIT_S)
        runner.close()
        with pytest.raises(RuntimeError, match="closed while this call ran"):
            caller.result(LOCAL_WAIT_S)


def run_python(source: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", source], capture_output=True, text=True, timeout=LOCAL_WAIT_S,
                          cwd=Path(__file__).resolve().parents[2], check=False)


def test_a_runner_the_program_forgot_to_close_is_closed_at_exit():
    done = run_python(
        "from rcq.client.loop_thread import LoopThread\n"
        "async def on_close():\n    print('on_close ran', flush=True)\n"
        "async def one():\n    return 1\n"
        "runner = LoopThread(on_close)\nassert runner.run(one()) == 1\n")
    assert (done.returncode, done.stdout, done.stderr) == (0, "on_close ran\n", "")


def test_a_runner_used_in_a_forked_child_raises_there_and_still_works_in_the_parent():
    done = run_python(
        "import os\nfrom rcq.client.loop_thread import LoopThread\n"
        "async def nothing():\n    pass\n"
        "async def one():\n    return 1\n"
        "runner = LoopThread(nothing)\nrunner.run(one())\n"
        "child = os.fork()\n"
        "if child == 0:\n"
        "    try:\n        runner.run(one())\n    except RuntimeError as exc:\n        print('child:', exc, flush=True)\n"
        "    os._exit(0)\n"
        "os.waitpid(child, 0)\nprint('parent:', runner.run(one()), flush=True)\nrunner.close()\n")
    assert done.returncode == 0, done.stderr
    assert "child: this client's thread was started in process" in done.stdout
    assert "parent: 1" in done.stdout


# ====================================================================== a SyncClient and a node
@pytest.fixture
def node_url(tmp_path: Path) -> Iterator[str]:
    """An in-process node, served by a loop on a thread of its own."""
    stack = contextlib.AsyncExitStack()
    server = LoopThread(stack.aclose, name="test-node")
    node = server.run(stack.enter_async_context(running_node(tmp_path)))
    try:
        yield url_of(node)
    finally:
        server.close()


@pytest.fixture
def client(node_url: str) -> Iterator[SyncClient]:
    with SyncClient(node_url, retry_timeout_s=2) as sync_client:
        yield sync_client


def sync_client_threads() -> set[threading.Thread]:
    return {thread for thread in threading.enumerate() if thread.name.startswith("rcq-sync-client")}


def test_a_client_starts_its_thread_on_the_first_call_and_ends_it_on_close(node_url):
    before = sync_client_threads()
    client = SyncClient(node_url)
    assert sync_client_threads() == before
    assert client.count("q") == 0
    (thread,) = sync_client_threads() - before
    assert thread.daemon
    client.close()
    assert sync_client_threads() == before and not thread.is_alive()
    assert client.closed
    with pytest.raises(RuntimeError, match="closed"):
        client.count("q")


def test_with_closes_the_client(node_url):
    before = sync_client_threads()
    with SyncClient(node_url) as client:
        client.enqueue("q", "a")
    assert client.closed and sync_client_threads() == before


def test_bad_arguments_are_refused_at_construction_without_a_thread():
    before = sync_client_threads()
    with pytest.raises(InvalidRequest, match="no URL"):
        SyncClient([])
    with pytest.raises(InvalidRequest, match="session"):
        SyncClient("http://127.0.0.1:1", session=object())
    assert sync_client_threads() == before


def test_one_request_verbs(client):
    info = client.enqueue("q", "a", b"b")
    assert info.enqueued == 2
    assert client.count("q") == 2
    assert client.peek("q") == b"a"
    assert client.queue_info("q")["count"] == 2  # the peek consumed nothing
    assert client.dequeue("q", 5) == [b"a", b"b"]
    assert [queue["queue"] for queue in client.queues()] == ["q"]


def test_a_transaction_commits_on_a_clean_exit(client):
    with client.transaction(timeout_s=30, label="job") as tx:
        assert isinstance(tx, SyncTransaction) and tx.label == "job"
        assert tx.enqueue_batch("q", (value for value in ("a", "b"))) == 2
    assert tx.state == "committed" and tx.commit_info is not None and tx.commit_info.enqueued == 2
    assert client.count("q") == 2


def test_a_transaction_aborts_on_an_exception_which_comes_out_unchanged(client):
    client.enqueue("q", "a")
    failure = ValueError("the handler failed")
    with pytest.raises(ValueError) as raised, client.transaction() as tx:
        assert tx.dequeue("q") == b"a"
        raise failure
    assert raised.value is failure
    assert tx.state == "aborted"
    assert client.dequeue("q") == [b"a"]  # back at the head


def test_receive_and_commit_and_receive(client):
    client.enqueue("jobs", "1", "2", "3")
    tx = client.receive("jobs", 2, wait_ms=100)
    assert tx is not None and [item.value for item in tx.items] == [b"1", b"2"] and tx.queue == "jobs"
    following = tx.commit_and_receive(max_items=2)
    assert tx.state == "committed"
    assert following is not None and [item.value for item in following.items] == [b"3"]
    assert following.commit_and_receive() is None
    assert client.count("jobs") == 0
    assert client.receive("jobs") is None


def test_commit_many_takes_synchronous_handles(client):
    first, second = client.begin(), client.begin()
    first.enqueue("q", "a")
    second.enqueue("q", "b")
    info = client.commit_many([first, second.transaction_id])
    assert info.transaction_ids == (first.transaction_id, second.transaction_id)
    assert first.state == "committed"
    assert sorted(client.dequeue("q", 5)) == [b"a", b"b"]


def test_the_errors_of_rcq_come_out_as_their_own_classes(client):
    with pytest.raises(QueueNotFound):
        client.delete_queue("never-made")
    with pytest.raises(TransactionNotFound):
        client.transaction_status(UNKNOWN_TRANSACTION_ID)
    with pytest.raises(TransactionNotFound):
        client.attach(UNKNOWN_TRANSACTION_ID).enqueue("q", b"x")
    with pytest.raises(InvalidQueueName):
        client.enqueue("no spaces", "a")


def test_a_deprecated_timeout_warns_at_the_callers_line(client):
    with pytest.warns(DeprecationWarning, match="timeout_s") as warned:
        context = client.transaction(timeout=20)
    assert warned[0].filename == __file__
    with context as tx, pytest.warns(DeprecationWarning, match="timeout_s") as warned:
        assert tx.extend(timeout=30)["expires_in_s"] > 20
    assert warned[0].filename == __file__


def test_a_waiting_receive_in_one_thread_holds_up_no_other_thread(client):
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(client.receive, "q", 1, int(LOCAL_WAIT_S * 1000), None, "waiter")
        # Behind the waiting receive, if calls were serialised: then it would come back empty.
        wait_until(lambda: client.transactions("waiter"), LOCAL_WAIT_S, what="the receive waiting")
        client.enqueue("q", "a")
        tx = waiting.result(LOCAL_WAIT_S * 2)
    assert tx is not None and [item.value for item in tx.items] == [b"a"]
    tx.commit()


def test_threads_share_one_client(client):
    def produce(worker: int) -> None:
        for n in range(10):
            with client.transaction() as tx:
                tx.enqueue("q", f"{worker}-{n}")

    with concurrent.futures.ThreadPoolExecutor(THREADS) as pool:
        list(pool.map(produce, range(THREADS), timeout=LOCAL_WAIT_S * 3))
    drained = [value.decode() for value in client.dequeue("q", 1000)]
    assert sorted(drained) == sorted(f"{worker}-{n}" for worker in range(THREADS) for n in range(10))
