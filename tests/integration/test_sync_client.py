"""SyncClient against a real 3-node cluster, used as synchronous code uses it: the verbs and
transactions, eight threads sharing one client, a threaded WSGI server whose handler enqueues
per request, and a leader killed while threads enqueue (nothing acknowledged lost).

The module shares one cluster; each test starts from a healed one and works on queues of its own.
The tests are plain functions: the client's loop is its own thread, not the test's.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import json
import socketserver
import threading
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import pytest

from rcq.client import RcqClient, RcqError, SyncClient, TransactionAborted
from rcq.local.cluster import LocalCluster
from rcq.testing import wait_until
from tests.helpers import CLUSTER_WAIT_S, LEADER_TIMEOUT_S, QUIET_CLUSTER_WAIT_S
from tests.helpers.cluster import fresh_queue
from tests.integration.workload import History, check_nothing_lost

pytestmark = pytest.mark.cluster

THREADS = 8
TRANSACTIONS_PER_THREAD = 10
ITEMS_PER_TRANSACTION = 3


@pytest.fixture
def client(healthy_cluster: LocalCluster) -> Iterator[SyncClient]:
    with SyncClient(healthy_cluster.urls, request_timeout_s=10.0, retry_timeout_s=CLUSTER_WAIT_S,
                    **healthy_cluster.client_options()) as sync_client:
        yield sync_client


def in_threads(work: Callable[[int], Any], count: int = THREADS) -> list[Any]:
    """``work(0)`` ... ``work(count - 1)``, each on a thread of its own, all at once; their results
    (the first exception, raised here)."""
    with concurrent.futures.ThreadPoolExecutor(count) as pool:
        return list(pool.map(work, range(count), timeout=CLUSTER_WAIT_S))


def test_the_verbs_and_transactions(client: SyncClient):
    queue, moved = fresh_queue("s"), fresh_queue("s")
    assert client.enqueue(queue, "a", "b", "c").enqueued == 3
    assert client.peek(queue) == b"a"
    with client.transaction(timeout_s=30) as tx:  # moves the head to another queue, atomically
        item = tx.dequeue(queue)
        assert item == b"a"
        tx.enqueue(moved, item)
    assert tx.state == "committed"
    with pytest.raises(KeyError), client.transaction(timeout_s=30) as tx:
        assert tx.dequeue(queue) == b"b"
        raise KeyError("the handler failed")
    assert tx.state == "aborted"
    received = client.receive(queue, 5, wait_ms=1000)
    assert received is not None and [item.value for item in received.items] == [b"b", b"c"]
    assert received.commit_and_receive(wait_ms=100) is None
    assert (client.count(queue), client.dequeue(moved, 5)) == (0, [b"a"])


def test_eight_threads_share_a_client_and_everything_comes_out_once(client: SyncClient):
    queue = fresh_queue("s")

    def produce(worker: int) -> None:
        for n in range(TRANSACTIONS_PER_THREAD):
            with client.transaction(timeout_s=30) as tx:
                tx.enqueue_batch(queue, [f"{worker}-{n}-{i}" for i in range(ITEMS_PER_TRANSACTION)])

    def consume(worker: int) -> list[str]:
        values: list[str] = []
        tx = client.receive(queue, 10)
        while tx is not None:
            values += [item.value.decode() for item in tx.items]
            tx = tx.commit_and_receive(max_items=10)
        return values

    in_threads(produce)
    came_out = Counter(value for values in in_threads(consume) for value in values)
    enqueued = {f"{worker}-{n}-{i}" for worker in range(THREADS) for n in range(TRANSACTIONS_PER_THREAD)
                for i in range(ITEMS_PER_TRANSACTION)}
    assert set(came_out) == enqueued
    assert {value: n for value, n in came_out.items() if n > 1} == {}
    assert client.count(queue) == 0


# ====================================================================== a WSGI application
def enqueuing_app(client: SyncClient) -> Callable[..., Iterable[bytes]]:
    """A WSGI app: ``POST /{queue}`` enqueues the request's body; 201 with the commit's index,
    or 400 with the name of the rcq error."""

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        value = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
        try:
            status, answer = "201 Created", {"index": client.enqueue(environ["PATH_INFO"][1:], value).index}
        except RcqError as exc:
            status, answer = "400 Bad Request", {"error": type(exc).__name__}
        start_response(status, [("Content-Type", "application/json")])
        return [json.dumps(answer).encode()]

    return app


class ThreadingWSGIServer(socketserver.ThreadingMixIn, WSGIServer):
    """wsgiref's server with a thread per request, as a threaded application server runs views;
    closing it joins them."""


class QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextlib.contextmanager
def serving(app: Callable[..., Iterable[bytes]]) -> Iterator[str]:
    """``app`` served on a loopback port by a thread; its base URL. Shut down and joined after."""
    server = make_server("127.0.0.1", 0, app, server_class=ThreadingWSGIServer, handler_class=QuietHandler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, name="wsgi")
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(QUIET_CLUSTER_WAIT_S)
        assert not thread.is_alive()


def post(url: str, body: bytes) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(url, data=body, timeout=QUIET_CLUSTER_WAIT_S) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        with error:
            return error.code, json.loads(error.read())


def test_a_wsgi_handler_enqueues_per_request(client: SyncClient):
    queue = fresh_queue("s")
    with serving(enqueuing_app(client)) as base_url:
        answers = in_threads(lambda worker: [post(f"{base_url}/{queue}", f"{worker}-{n}".encode()) for n in range(5)])
        refused = post(f"{base_url}/no%20spaces", b"x")
    assert {status for requests in answers for status, _ in requests} == {201}
    assert refused == (400, {"error": "InvalidQueueName"})
    assert sorted(value.decode() for value in client.dequeue(queue, 100)) == sorted(
        f"{worker}-{n}" for worker in range(THREADS) for n in range(5))


# ====================================================================== failover
def produce_until(stop: threading.Event, client: SyncClient, queue: str, name: str, history: History) -> None:
    """Enqueue one value per transaction until ``stop``; each ends acknowledged, failed or unknown."""
    for n in itertools.count():
        if stop.is_set():
            return
        value, enqueued = f"{name}-{n}", False
        try:
            with client.transaction(timeout_s=30) as tx:
                tx.enqueue(queue, value)
                enqueued = True
        except TransactionAborted:
            continue  # definitely not committed
        except RcqError:
            if enqueued:  # the commit failed: it may have happened
                history.unknown_enqueues[value] = tx.transaction_id
            continue  # else: never committed (the with block aborted it)
        history.acknowledged.add(value)


async def check_with_a_client_of_its_own(cluster: LocalCluster, queue: str, history: History) -> None:
    async with RcqClient(cluster.urls, request_timeout_s=10.0, retry_timeout_s=CLUSTER_WAIT_S,
                         **cluster.client_options()) as checking:
        await check_nothing_lost(checking, queue, history)


def test_killing_the_leader_while_threads_enqueue_loses_nothing_acknowledged(healthy_cluster: LocalCluster,
                                                                             client: SyncClient):
    cluster, queue, history, stop = healthy_cluster, fresh_queue("s"), History(), threading.Event()
    with concurrent.futures.ThreadPoolExecutor(THREADS) as pool:
        producers = [pool.submit(produce_until, stop, client, queue, f"p{i}", history) for i in range(THREADS)]
        try:
            wait_until(lambda: len(history.acknowledged) >= 40, CLUSTER_WAIT_S, what="the producers getting going")
            old_leader = cluster.wait_for_leader(LEADER_TIMEOUT_S)
            cluster.kill_node(old_leader)
            assert cluster.wait_for_leader(LEADER_TIMEOUT_S) != old_leader
            acknowledged = len(history.acknowledged)
            wait_until(lambda: len(history.acknowledged) >= acknowledged + 40, CLUSTER_WAIT_S,
                       what="the producers going on through the new leader")
        finally:
            stop.set()
            for producer in producers:
                producer.result(CLUSTER_WAIT_S)  # a producer's exception fails the test
    asyncio.run(check_with_a_client_of_its_own(cluster, queue, history))
    cluster.start_node(old_leader)
    cluster.wait_for_convergence(CLUSTER_WAIT_S)
