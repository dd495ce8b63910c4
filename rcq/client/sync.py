"""The client for synchronous code: :class:`SyncClient`, the async :class:`RcqClient` run on a thread of its own.

::

    with SyncClient(["http://127.0.0.1:7001", "http://127.0.0.1:7002"]) as client:
        with client.transaction(timeout_s=30) as tx:  # commits on a clean exit,
            item = tx.dequeue("in")                   # aborts on an exception
            if item is not None:
                tx.enqueue("out", item)
        client.enqueue("in", b"\\x00\\xff", "text")

For Django and Flask views, scripts, notebooks and worker threads. A SyncClient is one
:class:`RcqClient` on a private event loop (:mod:`rcq.client.loop_thread`): each method is the
RcqClient method of the same name, with the same arguments, answers and errors (those of
:mod:`rcq.errors`, unchanged), run there while the calling thread waits. It is not a second
implementation: leader discovery, retries, the session channel and coalescing are the async
client's. One SyncClient serves every thread of a process, and calls from many threads run
concurrently. A transaction is a :class:`SyncTransaction`, the handle of a :class:`Transaction`.

Close it (or use ``with``): that closes the RcqClient and ends the thread. A closed client, a
call from the client's own loop thread, and a client started before a fork and used in the
child raise RuntimeError. In async code, use RcqClient.

Must not import: rcq.server, pysyncobj, lmdb (``pip install rcq`` has no server).
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any

import aiohttp

from rcq.client.client import DEFAULT_CATCH_UP_TIMEOUT_S, RcqClient
from rcq.client.loop_thread import LoopThread
from rcq.client.partition_admin import PARTITION_LEADER_WAIT_S
from rcq.client.transaction import Transaction, timeout_s_of
from rcq.client.wire import CommitInfo, Dequeue, Enqueue, ExecuteResult, Item, ItemValue
from rcq.errors import InvalidRequest, RcqError


class SyncTransaction:
    """An open server-side transaction, for synchronous code: each method is the :class:`Transaction`
    method of the same name. Use as ``with`` to commit on a clean exit, abort on an exception."""

    def __init__(self, transaction: Transaction, runner: LoopThread) -> None:
        self._transaction = transaction
        self._runner = runner

    def __repr__(self) -> str:
        return f"Sync{self._transaction!r}"

    # What the transaction knows of itself (changed by its calls, on the loop's thread).
    @property
    def transaction_id(self) -> str | None:
        """None until the first verb, in a cluster of several partitions (Transaction)."""
        return self._transaction.transaction_id

    @property
    def label(self) -> str | None:
        return self._transaction.label

    @property
    def partition_key(self) -> str | None:
        """A spread queue: the fragment this transaction uses (Transaction)."""
        return self._transaction.partition_key

    @property
    def state(self) -> str:
        """open, committed, aborted, unknown (commit outcome unknown)."""
        return self._transaction.state

    @property
    def commit_info(self) -> CommitInfo | None:
        return self._transaction.commit_info

    @property
    def items(self) -> list[Item]:
        """What a receive dequeued into it."""
        return self._transaction.items

    @property
    def queue(self) -> str | None:
        """The queue it received from, if it was received."""
        return self._transaction.queue

    @property
    def receive_error(self) -> RcqError | None:
        """Why commit_and_receive's receive failed, if it did."""
        return self._transaction.receive_error

    @property
    def partition(self) -> str | None:
        """The partition it lives in (None: opened at its first verb, which has not come)."""
        return self._transaction.partition

    @property
    def opened_id(self) -> str:
        return self._transaction.opened_id

    def open(self) -> str:
        return self._runner.run(self._transaction.open())

    def enqueue(self, queue: str, item: ItemValue, *, priority: int | None = None,
                delay_s: float | None = None, ttl_s: float | None = None,
                headers: Mapping[str, str] | None = None) -> int:
        return self._runner.run(self._transaction.enqueue(queue, item, priority=priority, delay_s=delay_s, ttl_s=ttl_s,
                                                          headers=headers))

    def enqueue_batch(self, queue: str, items: Iterable[ItemValue], *, priority: int | None = None,
                      delay_s: float | None = None, ttl_s: float | None = None,
                      headers: Mapping[str, str] | None = None) -> int:
        items = list(items)  # a generator is read here, in the caller's thread
        return self._runner.run(self._transaction.enqueue_batch(queue, items, priority=priority, delay_s=delay_s,
                                                                ttl_s=ttl_s, headers=headers))

    def enqueue_items(self, queue: str, items: Iterable[tuple[ItemValue, Mapping[str, str] | None]], *,
                      priority: int | None = None, delay_s: float | None = None, ttl_s: float | None = None) -> int:
        pairs = list(items)  # a generator is read here, in the caller's thread
        return self._runner.run(self._transaction.enqueue_items(queue, pairs, priority=priority, delay_s=delay_s,
                                                                ttl_s=ttl_s))

    def dequeue_items(self, queue: str, max_items: int = 1, wait_ms: int = 0, key: str | None = None) -> list[Item]:
        return self._runner.run(self._transaction.dequeue_items(queue, max_items, wait_ms, key))

    def dequeue_batch(self, queue: str, max_items: int, wait_ms: int = 0, key: str | None = None) -> list[bytes]:
        return self._runner.run(self._transaction.dequeue_batch(queue, max_items, wait_ms, key))

    def dequeue(self, queue: str, wait_ms: int = 0, key: str | None = None) -> bytes | None:
        return self._runner.run(self._transaction.dequeue(queue, wait_ms, key))

    def reject(self, queue: str, item_ids_or_items: Iterable[int | Item], reason: str | None = None) -> int:
        return self._runner.run(self._transaction.reject(queue, list(item_ids_or_items), reason))

    def commit(self, idempotency_key: str | None = None) -> CommitInfo:
        return self._runner.run(self._transaction.commit(idempotency_key))

    def commit_and_receive(self, queue: str | None = None, max_items: int = 1, wait_ms: int = 0,
                           timeout_s: float | None = None, idempotency_key: str | None = None
                           ) -> SyncTransaction | None:
        return self._wrap(self._runner.run(
            self._transaction.commit_and_receive(queue, max_items, wait_ms, timeout_s, idempotency_key)))

    def abort(self) -> int:
        return self._runner.run(self._transaction.abort())

    def extend(self, timeout_s: float | None = None, *, timeout: float | None = None) -> dict[str, Any]:
        seconds = timeout_s_of(timeout_s, timeout, "extend")  # here: the warning names the caller's line
        return self._runner.run(self._transaction.extend(seconds))

    def status(self) -> dict[str, Any]:
        return self._runner.run(self._transaction.status())

    def abort_quietly(self) -> None:
        self._runner.run(self._transaction.abort_quietly())

    def __enter__(self) -> SyncTransaction:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        if self._transaction.state == "open":
            self._runner.run(self._transaction.__aexit__(exc_type, exc, traceback))

    def _wrap(self, transaction: Transaction | None) -> SyncTransaction | None:
        return None if transaction is None else SyncTransaction(transaction, self._runner)


class SyncTransactionContext:
    """``with client.transaction() as tx``: begins on entry, then as :class:`SyncTransaction`."""

    def __init__(self, begin: Callable[[], SyncTransaction]) -> None:
        self._begin = begin
        self._transaction: SyncTransaction | None = None

    def __enter__(self) -> SyncTransaction:
        self._transaction = self._begin()
        return self._transaction

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        assert self._transaction is not None, "__exit__ without __enter__"
        self._transaction.__exit__(exc_type, exc, traceback)


class SyncClient:
    """An rcq cluster seen from synchronous code: each method is the :class:`RcqClient` method of the
    same name (see its documentation), run on the client's own event-loop thread. One instance per
    process, shared by its threads; close it (or use ``with``). The arguments are RcqClient's, but
    ``session``: the client makes its own on its thread (an aiohttp session belongs to one loop)."""

    def __init__(self, urls: str | Sequence[str], *, request_timeout_s: float = 30.0,
                 retry_timeout_s: float = 15.0, coalesce: bool = False,
                 session: aiohttp.ClientSession | None = None, token: str | None = None,
                 ca_file: str | os.PathLike[str] | None = None,
                 client_cert: tuple[str | os.PathLike[str], str | os.PathLike[str]] | None = None,
                 ssl_context: ssl.SSLContext | None = None, channel: bool = True) -> None:
        if session is not None:
            raise InvalidRequest("a SyncClient makes its aiohttp session on its own loop: pass session=None")
        self._client = RcqClient(urls, request_timeout_s=request_timeout_s, retry_timeout_s=retry_timeout_s,
                                 coalesce=coalesce, token=token, ca_file=ca_file, client_cert=client_cert,
                                 ssl_context=ssl_context, channel=channel)
        self._runner = LoopThread(self._client.close, name="rcq-sync-client")

    # ----------------------------------------------------------- lifecycle
    @property
    def urls(self) -> list[str]:
        return self._client.urls

    @property
    def leader_url(self) -> str | None:
        """The leader's URL as last learnt (None: unknown)."""
        return self._client.leader_url

    @property
    def closed(self) -> bool:
        return self._runner.closed

    def __enter__(self) -> SyncClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the RcqClient and end its thread (bounded; see :mod:`rcq.client.loop_thread`).
        Calls still running are cancelled: they raise RuntimeError. Closing twice is harmless."""
        self._runner.close()

    # -------------------------------------------------------- transactions
    def transaction(self, timeout_s: float | None = None, label: str | None = None, *,
                    timeout: float | None = None, partition_key: str | None = None) -> SyncTransactionContext:
        seconds = timeout_s_of(timeout_s, timeout, "transaction")
        return SyncTransactionContext(lambda: self.begin(seconds, label, partition_key=partition_key))

    def begin(self, timeout_s: float | None = None, label: str | None = None, *,
              timeout: float | None = None, partition: str | None = None,
              partition_key: str | None = None) -> SyncTransaction:
        seconds = timeout_s_of(timeout_s, timeout, "begin")
        return SyncTransaction(self._runner.run(self._client.begin(seconds, label, partition=partition,
                                                                   partition_key=partition_key)), self._runner)

    def receive(self, queue: str, max_items: int = 1, wait_ms: int = 0, timeout_s: float | None = None,
                label: str | None = None, partition_key: str | None = None) -> SyncTransaction | None:
        received = self._runner.run(self._client.receive(queue, max_items, wait_ms, timeout_s, label, partition_key))
        return None if received is None else SyncTransaction(received, self._runner)

    def attach(self, transaction_id: str, label: str | None = None) -> SyncTransaction:
        return SyncTransaction(self._client.attach(transaction_id, label), self._runner)

    def commit_many(self, transactions_or_ids: Iterable[SyncTransaction | str],
                    idempotency_key: str | None = None) -> CommitInfo:
        handles = [entry._transaction if isinstance(entry, SyncTransaction) else entry for entry in transactions_or_ids]
        return self._runner.run(self._client.commit_many(handles, idempotency_key))

    def transactions(self, label_prefix: str | None = None, *, complete: bool = False) -> list[dict[str, Any]]:
        return self._runner.run(self._client.transactions(label_prefix, complete=complete))

    def transaction_status(self, transaction_id: str) -> dict[str, Any]:
        return self._runner.run(self._client.transaction_status(transaction_id))

    # ------------------------------------------------- one-request transactions
    def enqueue(self, queue: str, *items: ItemValue, idempotency_key: str | None = None,
                priority: int | None = None, delay_s: float | None = None, ttl_s: float | None = None,
                headers: Mapping[str, str] | None = None, partition_key: str | None = None) -> CommitInfo:
        return self._runner.run(self._client.enqueue(queue, *items, idempotency_key=idempotency_key, priority=priority,
                                                   delay_s=delay_s, ttl_s=ttl_s, headers=headers,
                                                   partition_key=partition_key))

    def dequeue(self, queue: str, max_items: int = 1, wait_ms: int = 0, partition_key: str | None = None) -> list[bytes]:
        return self._runner.run(self._client.dequeue(queue, max_items, wait_ms, partition_key))

    def dequeue_items(self, queue: str, max_items: int = 1, wait_ms: int = 0,
                      partition_key: str | None = None) -> list[Item]:
        return self._runner.run(self._client.dequeue_items(queue, max_items, wait_ms, partition_key))

    def execute(self, operations: Iterable[Enqueue | Dequeue | Mapping[str, Any]],
                idempotency_key: str | None = None) -> ExecuteResult:
        return self._runner.run(self._client.execute(list(operations), idempotency_key))

    # ------------------------------------------------------------- queues
    def peek(self, queue: str) -> bytes | None:
        return self._runner.run(self._client.peek(queue))

    def queue_info(self, queue: str) -> dict[str, Any]:
        return self._runner.run(self._client.queue_info(queue))

    def count(self, queue: str) -> int:
        return self._runner.run(self._client.count(queue))

    def stats(self, queue: str) -> dict[str, Any]:
        return self._runner.run(self._client.stats(queue))

    def queues(self) -> list[dict[str, Any]]:
        return self._runner.run(self._client.queues())

    def configure_queue(self, queue: str, *, max_items: int | None = None, max_bytes: int | None = None,
                        max_deliveries: int | None = None, dead_letter_queue: str | None = None,
                        default_ttl_s: float | None = None, default_delay_s: float | None = None,
                        max_priority: int | None = None, partitions: list[str] | None = None) -> dict[str, Any]:
        return self._runner.run(self._client.configure_queue(
            queue, max_items=max_items, max_bytes=max_bytes, max_deliveries=max_deliveries,
            dead_letter_queue=dead_letter_queue, default_ttl_s=default_ttl_s, default_delay_s=default_delay_s,
            max_priority=max_priority, partitions=partitions))

    def redrive(self, dlq: str, *, max_items: int | None = None, source_queue: str | None = None) -> dict[str, Any]:
        return self._runner.run(self._client.redrive(dlq, max_items=max_items, source_queue=source_queue))

    def purge_queue(self, queue: str) -> int:
        return self._runner.run(self._client.purge_queue(queue))

    def delete_queue(self, queue: str) -> int:
        return self._runner.run(self._client.delete_queue(queue))

    def storage(self) -> dict[str, Any]:
        return self._runner.run(self._client.storage())

    # ------------------------------------------------------------ cluster
    def cluster(self, url: str | None = None) -> dict[str, Any]:
        return self._runner.run(self._client.cluster(url))

    def wait_for_leader(self, timeout_s: float = 30.0) -> str:
        return self._runner.run(self._client.wait_for_leader(timeout_s))

    # ------------------------------------------------------- membership (admin)
    def partitions(self) -> list[dict[str, Any]]:
        return self._runner.run(self._client.partitions())

    def create_partition(self, name: str, replicas: int | None = None, nodes: Sequence[str] | None = None,
                         *, leader_wait_s: float = PARTITION_LEADER_WAIT_S) -> dict[str, Any]:
        return self._runner.run(self._client.create_partition(name, replicas, nodes, leader_wait_s=leader_wait_s))

    def delete_partition(self, name: str) -> dict[str, Any]:
        return self._runner.run(self._client.delete_partition(name))

    def add_partition_member(self, name: str, node_id: str, *, timeout_s: float = 120.0) -> dict[str, Any]:
        return self._runner.run(self._client.add_partition_member(name, node_id, timeout_s=timeout_s))

    def remove_partition_member(self, name: str, node_id: str, *, timeout_s: float = 120.0) -> dict[str, Any]:
        return self._runner.run(self._client.remove_partition_member(name, node_id, timeout_s=timeout_s))

    def replace_partition_member(self, name: str, node_id: str, by: str | None = None, *,
                                 timeout_s: float = 120.0) -> dict[str, Any]:
        return self._runner.run(self._client.replace_partition_member(name, node_id, by, timeout_s=timeout_s))

    def drain_node(self, node_id: str, *, timeout_s: float = 120.0) -> dict[str, Any]:
        return self._runner.run(self._client.drain_node(node_id, timeout_s=timeout_s))

    def transfer_partition_leadership(self, name: str, node_id: str | None = None) -> dict[str, Any]:
        return self._runner.run(self._client.transfer_partition_leadership(name, node_id))

    def leader_balance(self) -> dict[str, Any]:
        return self._runner.run(self._client.leader_balance())

    def rebalance(self) -> dict[str, Any]:
        return self._runner.run(self._client.rebalance())

    def cluster_members(self, url: str | None = None) -> list[dict[str, Any]]:
        return self._runner.run(self._client.cluster_members(url))

    def add_node(self, node_id: str, raft_address: str, url: str, *,
                 catch_up_timeout_s: float = DEFAULT_CATCH_UP_TIMEOUT_S) -> dict[str, Any]:
        return self._runner.run(self._client.add_node(node_id, raft_address, url, catch_up_timeout_s=catch_up_timeout_s))

    def remove_node(self, node_id: str) -> dict[str, Any]:
        return self._runner.run(self._client.remove_node(node_id))

    def transfer_leadership(self, node_id: str | None = None) -> dict[str, Any]:
        return self._runner.run(self._client.transfer_leadership(node_id))

    def feature_level(self) -> dict[str, Any]:
        return self._runner.run(self._client.feature_level())

    def raise_feature_level(self, level: int | None = None) -> dict[str, Any]:
        return self._runner.run(self._client.raise_feature_level(level))
