"""The public API of the client: :class:`RcqClient`, an rcq cluster seen from one program.

Why over 400 lines: the public API, one short documented method per verb; wire builds the requests, the transport sends them.

Each method builds its request (the REST form and, where the server has one, the
``/v1/batch`` form) and hands it to the transport, which chooses between them, finds the
leader and retries (see :mod:`rcq.client.transport`, and :mod:`rcq.client.retry` for what is safe to
re-send); answers are decoded by
:mod:`rcq.client.wire`. Interactive transactions are :class:`Transaction` handles.

Must not import: rcq.server, pysyncobj, lmdb (``pip install rcq`` has no server).
"""

from __future__ import annotations

import contextlib
import os
import ssl
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, cast

import aiohttp

from rcq.client import hooks
from rcq.client.exchange import tls_context
from rcq.client.partition_admin import MEMBERSHIP_CHANGE_MS, PartitionAdmin, waited_ms
from rcq.client.retry import COMMIT, MEMBERSHIP, SAFE, WRITE, WRITE_ELSEWHERE_IF_FULL, Attempts, Request
from rcq.client.spread import FRAGMENT_PASS_BUDGET_S, each_fragment, enqueue_partitions, shared_spread
from rcq.client.spread_execute import execute_spread
from rcq.client.transaction import Transaction, TransactionContext, items_received, received, timeout_s_of
from rcq.client.transport import Transport
from rcq.client.wire import (
    FEATURE_LEVEL_PATH,
    LEADERSHIP_PATH,
    MEMBERS_PATH,
    CommitInfo,
    Dequeue,
    Enqueue,
    ExecuteResult,
    Item,
    ItemValue,
    add_member_body,
    begin_body,
    commit_info,
    enqueue_body,
    execute_result,
    leadership_body,
    member_path,
    operation_body,
    operations_wait_ms,
    queue_path,
    receive_body,
    retry_key,
)
from rcq.errors import (
    CommitOutcomeUnknown,
    CrossPartitionTransaction,
    FeatureLevelUnsupported,
    InvalidRequest,
    QueueFull,
    RouteNotFound,
    TransactionAborted,
    TransactionCommitted,
    Unavailable,
)
from rcq.names import P0, check_partition_key, check_queue_name, transaction_partition

PEEK_TIMEOUT_S = 10.0  # how long a peeked item stays locked if the peek's abort is lost
DEFAULT_CATCH_UP_TIMEOUT_S = 60.0  # how long an add waits, by default, for the new node to catch up


class RcqClient(PartitionAdmin):
    """An rcq cluster seen from one program. One instance per event loop; close it (or use
    ``async with``). ``urls``: any nodes of the cluster; the leader is found from them."""

    def __init__(self, urls: str | Sequence[str], *, request_timeout_s: float = 30.0,
                 retry_timeout_s: float = 15.0, coalesce: bool = False,
                 session: aiohttp.ClientSession | None = None, token: str | None = None,
                 ca_file: str | os.PathLike[str] | None = None,
                 client_cert: tuple[str | os.PathLike[str], str | os.PathLike[str]] | None = None,
                 ssl_context: ssl.SSLContext | None = None, channel: bool = True) -> None:
        """``token``: the API token (default: ``$RCQ_TOKEN``), sent as ``Authorization: Bearer``.
        HTTPS nodes are verified against ``ca_file`` (default: the system's CAs); ``client_cert`` =
        (certificate file, key file) for nodes that require client certificates; ``ssl_context``
        instead of both. A ``session`` of the caller's keeps its own TLS settings.
        ``channel``: the session channel for the hot verbs (transactions, enqueue, dequeue, execute:
        one WebSocket per node, requests pipelined on it; nodes without it are asked over HTTP);
        False: one HTTP request per operation."""
        if ssl_context is not None and (ca_file is not None or client_cert is not None):
            raise InvalidRequest("pass ssl_context, or ca_file/client_cert, not both")
        token = token if token is not None else (os.environ.get("RCQ_TOKEN") or None)
        self._transport = Transport(urls, request_timeout_s=request_timeout_s, retry_timeout_s=retry_timeout_s,
                                    coalesce=coalesce, session=session, token=token,
                                    tls=ssl_context or tls_context(ca_file, client_cert), channel=channel)

    # ----------------------------------------------------------- lifecycle
    @property
    def urls(self) -> list[str]:
        return self._transport.urls

    @property
    def leader_url(self) -> str | None:
        """The leader's URL as last learnt (None: unknown)."""
        return self._transport.leader_url

    async def __aenter__(self) -> RcqClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._transport.close()

    # -------------------------------------------------------- transactions
    def transaction(self, timeout_s: float | None = None, label: str | None = None, *,
                    timeout: float | None = None, partition_key: str | None = None) -> TransactionContext:
        """``async with client.transaction() as tx``: begins; commits on a clean exit; aborts on an
        exception (an abort failure is logged, never raised over the original exception).
        ``timeout``: the deprecated name of ``timeout_s``; ``partition_key``: as :meth:`begin`."""
        seconds = timeout_s_of(timeout_s, timeout, "transaction")
        return TransactionContext(lambda: self.begin(seconds, label, partition_key=partition_key))

    async def begin(self, timeout_s: float | None = None, label: str | None = None, *,
                    timeout: float | None = None, partition: str | None = None,
                    partition_key: str | None = None) -> Transaction:
        """Open a transaction whose deadline is ``timeout_s`` seconds away (node default if None).
        ``timeout``: the deprecated name of ``timeout_s``. ``partition``: the partition it lives in
        (docs/partitions.md); None: the partition of the queue of its first verb. In a cluster the
        client knows to have several partitions the server's transaction is opened at that verb
        (``transaction_id`` is None until then); otherwise now, in p0. ``partition_key``: on a
        spread queue, the fragment of this key (the same key, the same fragment, so a key's items
        keep their order); without one, a transaction's first verb on a spread queue takes the
        next fragment in turn (docs/partitions.md, "Spread queues")."""
        body = begin_body(timeout_s_of(timeout_s, timeout, "begin"), label)
        if partition is None and self._transport.routes.single() is None:
            await self._transport.routes.partitions()  # once (a lone p0's listing now and then)
        if partition is None and self._transport.routes.single() is False:
            return Transaction(self._transport, None, label=label, begin=body, partition_key=partition_key)
        # Opened now: in p0 while the client knows of no other partition (then a first verb refused
        # for its queue's partition opens it again there, and the client learns the partitions).
        named, partition = partition is not None, partition or P0
        sent = {**body, "partition": partition} if partition != P0 else body
        answer = await self._transport.request(
            Request("POST", "/v1/transactions", sent, SAFE, batch_operation={"op": "begin", **sent},
                    partition=partition))
        # begun for a partition named here, it stays there; else its first verb may move it (Transaction)
        return Transaction(self._transport, answer["transaction_id"], label=answer.get("label"),
                           begin=None if named else body, partition_key=partition_key)

    async def receive(self, queue: str, max_items: int = 1, wait_ms: int = 0, timeout_s: float | None = None,
                      label: str | None = None, partition_key: str | None = None) -> Transaction | None:
        """Begin a transaction and dequeue up to ``max_items`` of ``queue`` into it, in one request,
        waiting up to ``wait_ms`` for the first (long poll). Returns the open transaction, its items in
        ``.items``; None when nothing came (nothing is held then). Commit it with
        :meth:`Transaction.commit_and_receive` to get the next one in the same request::

            tx = await client.receive("jobs", 10, wait_ms=5000)
            while tx is not None:
                handle(tx.items)
                tx = await tx.commit_and_receive(max_items=10, wait_ms=5000)

        Re-sent like ``begin``: an attempt whose answer was lost holds its items until its
        transaction's deadline, then they return to the head. ``partition_key``: on a spread
        queue, from this key's fragment alone (as :meth:`enqueue` puts them there)."""
        body = receive_body(check_queue_name(queue), max_items, wait_ms, timeout_s, label)
        if partition_key is not None:
            check_partition_key(partition_key)
        return await hooks.active().receive(self._transport, queue, lambda: self._receive(
            queue, body, wait_ms, label, partition_key), items_received)

    async def _receive(self, queue: str, body: dict[str, Any], wait_ms: int, label: str | None,
                       partition_key: str | None) -> Transaction | None:
        async def send(partition: str | None, wait: int, budget_s: float | None) -> Transaction | None:
            sent = {**body, "wait_ms": wait}
            rest = sent if partition_key is None else {**sent, "partition_key": partition_key}
            answer = await self._transport.request(
                Request("POST", queue_path(queue, "receive"), rest, SAFE,
                        batch_operation={"op": "receive", "queue": queue, **sent}, wait_ms=wait, partition=partition,
                        budget_s=budget_s))
            return received(self._transport, answer, label)

        return cast("Transaction | None", await each_fragment(self._transport.routes, queue, wait_ms, send,
                                                              lambda t: t is not None, partition_key))

    def attach(self, transaction_id: str, label: str | None = None) -> Transaction:
        """A handle on a transaction begun elsewhere (to commit, abort or ask about it)."""
        return Transaction(self._transport, transaction_id, label=label)

    async def commit_many(self, transactions_or_ids: Iterable[Transaction | str],
                          idempotency_key: str | None = None) -> CommitInfo:
        """Commit several open transactions atomically, as one unit."""
        handles = list(transactions_or_ids)
        for handle in handles:
            if isinstance(handle, Transaction):
                await handle.open()  # one opened at its first verb and never used: opened now (in p0)
        ids = [handle.opened_id if isinstance(handle, Transaction) else str(handle) for handle in handles]
        partitions = sorted({transaction_partition(i) for i in ids})
        if len(partitions) > 1:
            raise CrossPartitionTransaction(
                f"these transactions live in partitions {', '.join(partitions)}: one commit covers the transactions "
                "of one partition (docs/partitions.md); nothing was sent", details={"transaction_partitions": partitions})
        body: dict[str, Any] = {"transaction_ids": ids}
        if idempotency_key is not None:
            body["idempotency_key"] = idempotency_key
        settled = [item for handle in handles if isinstance(handle, Transaction) for item in handle.items]
        try:
            info = await hooks.active().settle(self._transport, settled, lambda: self._commit_many(body, ids),
                                               transaction_ids=ids)
        except (TransactionAborted, CommitOutcomeUnknown) as exc:
            state = "aborted" if isinstance(exc, TransactionAborted) else "unknown"
            for handle in handles:
                if isinstance(handle, Transaction):
                    handle.state = state
            raise
        for handle in handles:
            if isinstance(handle, Transaction):
                handle.state, handle.commit_info = "committed", info
        return info

    async def _commit_many(self, body: dict[str, Any], ids: list[str]) -> CommitInfo:
        attempts = Attempts()
        try:
            # not coalesced, as before the client was split up
            answer = await self._transport.request(
                Request("POST", "/v1/commit", body, COMMIT, partition=transaction_partition(ids[0]) if ids else None),
                attempts=attempts)
        except TransactionCommitted as exc:
            # /v1/commit answers a retry with 409 transaction_committed instead of "duplicate"
            if attempts.ambiguous:
                return CommitInfo(int(exc.details.get("index", 0)), True, 0, 0, tuple(ids))
            raise
        return commit_info(answer)

    async def transactions(self, label_prefix: str | None = None, *, complete: bool = False) -> list[dict[str, Any]]:
        """The leaders' open transactions (every partition's), optionally only those whose label
        starts with a prefix. ``complete``: raise Unavailable, naming them, when some partitions'
        leaders did not answer (otherwise their transactions are missing from the list): for a
        caller that must not take "not listed" for "not open"."""
        params = {"label_prefix": label_prefix} if label_prefix is not None else None
        answer = await self._transport.request(Request("GET", "/v1/transactions", params=params))
        if complete and answer.get("unanswered"):
            missing = [str(p) for p in answer["unanswered"]]
            raise Unavailable(f"partitions {', '.join(missing)} did not list their open transactions; retry",
                              details={"unanswered": missing})
        return list(answer["transactions"])

    async def transaction_status(self, transaction_id: str) -> dict[str, Any]:
        """``state``: open, committing, unknown, committed or aborted (with ``reason``)."""
        return await self.attach(transaction_id).status()

    # ------------------------------------------------- one-request transactions
    async def enqueue(self, queue: str, *items: ItemValue, idempotency_key: str | None = None,
                      priority: int | None = None, delay_s: float | None = None,
                      ttl_s: float | None = None, headers: Mapping[str, str] | None = None,
                      partition_key: str | None = None) -> CommitInfo:
        """Enqueue and commit in one request. Exactly once under retries (``idempotency_key``, or a
        retry key made here: kept 10 minutes, not a day; docs/limits.md).
        ``priority``, ``delay_s``, ``ttl_s``, ``headers``: as :meth:`Transaction.enqueue_batch`.
        ``partition_key``: on a spread queue, the fragment of this key (the same key, the same
        fragment, so a key's items keep their order); without one, the fragment of the caller's
        ``idempotency_key``, else the next in turn, the next after it while one is full
        (docs/partitions.md, "Spread queues")."""
        key = idempotency_key if idempotency_key is not None else retry_key()
        fragment_key = partition_key if partition_key is not None else idempotency_key
        if not hooks.instrumented():  # the hot path: no wrapper coroutine, no closure
            return await self._enqueue(queue, items, key, priority=priority, delay_s=delay_s, ttl_s=ttl_s,
                                       headers=headers, fragment_key=fragment_key, partition_key=partition_key)
        return await hooks.active().send(self._transport, queue, len(items), headers, lambda sent: self._enqueue(
            queue, items, key, priority=priority, delay_s=delay_s, ttl_s=ttl_s, headers=sent,
            fragment_key=fragment_key, partition_key=partition_key))

    async def _enqueue(self, queue: str, items: Sequence[ItemValue], key: str, *, priority: int | None,
                       delay_s: float | None, ttl_s: float | None, headers: Mapping[str, str] | None,
                       fragment_key: str | None, partition_key: str | None) -> CommitInfo:
        body = enqueue_body(queue, items, priority=priority, delay_s=delay_s, ttl_s=ttl_s, headers=headers)
        operation = {"op": "enqueue", **body}
        # the path names the queue; everything else of the operation is the REST body
        rest_body = {name: value for name, value in body.items() if name != "queue"}
        rest_body["idempotency_key"] = key
        if partition_key is not None:  # a node's own port routes a spread queue's enqueue by it
            check_partition_key(partition_key)
            rest_body["partition_key"] = partition_key
        batch_operation = {"op": "execute", "idempotency_key": key, "operations": [operation]}
        order = await enqueue_partitions(self._transport.routes, queue, fragment_key)
        for partition in order[:-1]:  # a spread queue's fragments but the last: on when full or dark
            try:  # Unavailable: nothing ran there (ran maybe: CommitOutcomeUnknown), so the key is free
                answer = await self._transport.request(
                    Request("POST", queue_path(queue, "enqueue"), rest_body, WRITE_ELSEWHERE_IF_FULL,
                            batch_operation=batch_operation, partition=partition, budget_s=FRAGMENT_PASS_BUDGET_S))
            except (QueueFull, Unavailable):
                continue
            return commit_info(answer)
        answer = await self._transport.request(
            Request("POST", queue_path(queue, "enqueue"), rest_body, WRITE, batch_operation=batch_operation,
                    partition=order[-1]))
        return commit_info(answer)

    async def dequeue(self, queue: str, max_items: int = 1, wait_ms: int = 0,
                      partition_key: str | None = None) -> list[bytes]:
        """Dequeue and commit in one request: **at most once**. A failed attempt is re-sent; if the
        lost attempt had committed, the items it took are lost. Use a transaction for at least once.
        ``partition_key``: as :meth:`receive`."""
        return [item.value for item in await self.dequeue_items(queue, max_items, wait_ms, partition_key)]

    async def dequeue_items(self, queue: str, max_items: int = 1, wait_ms: int = 0,
                            partition_key: str | None = None) -> list[Item]:
        """:meth:`dequeue` (at most once), as :class:`Item` objects: ids, delivery counts, priorities,
        dead-letter details."""
        check_queue_name(queue)
        if partition_key is not None:
            check_partition_key(partition_key)
        if not hooks.instrumented():
            return await self._dequeue_items(queue, max_items, wait_ms, partition_key)
        return await hooks.active().receive(self._transport, queue, lambda: self._dequeue_items(
            queue, max_items, wait_ms, partition_key), list)

    async def _dequeue_items(self, queue: str, max_items: int, wait_ms: int, partition_key: str | None) -> list[Item]:
        async def send(partition: str | None, wait: int, budget_s: float | None) -> list[Item]:
            dequeue: dict[str, Any] = {"op": "dequeue", "queue": queue, "max_items": max_items}
            if wait:  # the session channel carries waiting requests too
                dequeue["wait_ms"] = wait
            batch_operation = {"op": "execute", "operations": [dequeue]}
            rest: dict[str, Any] = {"max_items": max_items, "wait_ms": wait}
            if partition_key is not None:  # a node's own port routes a spread queue's dequeue by it
                rest["partition_key"] = partition_key
            answer = await self._transport.request(
                Request("POST", queue_path(queue, "dequeue"), rest, WRITE,
                        batch_operation=batch_operation, wait_ms=wait, partition=partition, budget_s=budget_s))
            return [item for result in execute_result(answer).results for item in result.items]

        return list(await each_fragment(self._transport.routes, queue, wait_ms, send, bool, partition_key))

    async def execute(self, operations: Iterable[Enqueue | Dequeue | Mapping[str, Any]],
                      idempotency_key: str | None = None) -> ExecuteResult:
        """Run the operations in one transaction and commit it, in one request. Enqueues are
        exactly once under retries (a retry key is made if ``idempotency_key`` is None); dequeues are at
        most once, and a ``duplicate`` answer carries no items."""
        key = idempotency_key if idempotency_key is not None else retry_key()
        keyed = idempotency_key is not None
        if not hooks.instrumented():
            return await self._execute(list(operations), key, keyed)
        return await hooks.active().execute(self._transport, list(operations),
                                            lambda sent: self._execute(sent, key, keyed),
                                            lambda result: [item for done in result.results for item in done.items])

    async def _execute(self, operations: Iterable[Enqueue | Dequeue | Mapping[str, Any]], key: str,
                       keyed: bool) -> ExecuteResult:
        bodies = [operation_body(operation) for operation in operations]
        spread = await shared_spread(self._transport.routes, list(dict.fromkeys(str(b.get("queue")) for b in bodies)))
        if spread is not None:
            return await execute_spread(self._transport, spread, bodies, key, keyed)
        body = {"operations": bodies, "idempotency_key": key}
        # Where its queues all live, if the client knows; else p0, which has the directory and sends
        # it on (421) or refuses queues of two partitions (409 cross_partition_transaction).
        placed = {self._transport.routes.placed(str(b.get("queue"))) for b in bodies}
        answer = await self._transport.request(
            Request("POST", "/v1/execute", body, WRITE, batch_operation={"op": "execute", **body},
                    wait_ms=operations_wait_ms(bodies), partition=placed.pop() if len(placed) == 1 else None))
        return execute_result(answer)

    # ------------------------------------------------------------- queues
    async def peek(self, queue: str) -> bytes | None:
        """The head item without consuming it (begin, dequeue, abort). While the peek runs the
        item is invisible to other dequeuers; if the abort is lost it stays so for PEEK_TIMEOUT_S."""
        transaction = await self.begin(PEEK_TIMEOUT_S, "rcq.peek")
        try:
            return await transaction.dequeue(queue)
        finally:
            await transaction.abort_quietly()

    async def queue_info(self, queue: str) -> dict[str, Any]:
        """``count`` (replicated, includes locked items), ``locked`` and ``available`` (leader only);
        from servers with delays and dead letters also ``ready``, ``delayed`` and the ``*_total`` counters."""
        return dict(await self._transport.request(Request("GET", queue_path(queue))))

    async def count(self, queue: str) -> int:
        return int((await self.queue_info(queue))["count"])

    async def stats(self, queue: str) -> dict[str, Any]:
        return dict(await self._transport.request(Request("GET", queue_path(queue, "stats"))))

    async def queues(self) -> list[dict[str, Any]]:
        """Every queue with its ``count`` and ``locked`` items."""
        return list((await self._transport.request(Request("GET", "/v1/queues")))["queues"])

    async def configure_queue(self, queue: str, *, max_items: int | None = None, max_bytes: int | None = None,
                              max_deliveries: int | None = None, dead_letter_queue: str | None = None,
                              default_ttl_s: float | None = None, default_delay_s: float | None = None,
                              max_priority: int | None = None, partitions: list[str] | None = None) -> dict[str, Any]:
        """Create ``queue`` if needed and replace **all** its settings (None: unset; the limits fall back
        to the node's defaults); replicated. Answers ``settings`` and ``limits``; a bad setting (an
        unknown dead-letter queue, the queue itself, a cycle) raises InvalidRequest and changes nothing.
        See docs/queue-features.md for what each setting does. ``partitions`` places a new queue in
        a partition (docs/partitions.md); None keeps where it lives."""
        if dead_letter_queue is not None:
            check_queue_name(dead_letter_queue)
        newer = {"max_deliveries": max_deliveries, "dead_letter_queue": dead_letter_queue,
                 "default_ttl_s": default_ttl_s, "default_delay_s": default_delay_s, "max_priority": max_priority,
                 "partitions": None if partitions is None else list(partitions)}
        # The limits are always sent, as before; the newer settings only when given: the server takes
        # an absent one as null, and one that predates them refuses fields it does not know.
        body = {"max_items": max_items, "max_bytes": max_bytes,
                **{name: value for name, value in newer.items() if value is not None}}
        answer = dict(await self._transport.request(Request("PUT", queue_path(queue), body)))
        placed = (answer.get("settings") or {}).get("partitions")
        if placed:
            self._transport.routes.learn_placement(queue, [str(p) for p in placed])
        return answer

    async def redrive(self, dlq: str, *, max_items: int | None = None,
                      source_queue: str | None = None) -> dict[str, Any]:
        """Move the dead items of ``dlq`` that no transaction holds back to the tail of their source queues
        (only those of ``source_queue`` if given; at most ``max_items``); replicated. Answers ``redriven``
        and ``by_queue`` (source queue -> count). Retried after an unknown outcome it redrives again
        (what died in between, or up to ``max_items`` more) and answers with the last attempt's counts."""
        body: dict[str, Any] = {}
        if max_items is not None:
            body["max_items"] = max_items
        if source_queue is not None:
            body["source_queue"] = check_queue_name(source_queue)
        return dict(await self._transport.request(Request("POST", queue_path(dlq, "redrive"), body, WRITE)))

    async def purge_queue(self, queue: str) -> int:
        """Remove every item of ``queue`` (replicated; open transactions holding its items are
        aborted); returns how many were removed. Retried after an unknown outcome it may remove
        items enqueued in between."""
        answer = await self._transport.request(Request("POST", queue_path(queue, "purge"), {}, WRITE))
        return int(answer["removed"])

    async def delete_queue(self, queue: str) -> int:
        """Delete ``queue``, its items and its settings; returns how many items went with it.
        Raises QueueNotFound when there is none (also when a retried delete already did it)."""
        answer = await self._transport.request(Request("DELETE", queue_path(queue), None, WRITE))
        return int(answer["removed"])

    async def storage(self) -> dict[str, Any]:
        """How full the leader's storage budget and tables are (``storage_bytes`` of ``storage_bytes_max``)."""
        return dict(await self._transport.request(Request("GET", "/v1/cluster/storage")))

    # ------------------------------------------------------------ cluster
    async def cluster(self, url: str | None = None) -> dict[str, Any]:
        """A node's view of the cluster: the leader's (or any node's) if ``url`` is None, else
        exactly that node's, asked once (raises Unavailable if it does not answer)."""
        if url is None:
            return dict(await self._transport.request(Request("GET", "/v1/cluster")))
        return await self._transport.ask_node(url, "/v1/cluster")

    async def wait_for_leader(self, timeout_s: float = 30.0) -> str:
        """Poll every known node until one is a serving leader; remember and return its URL."""
        return await self._transport.wait_for_leader(timeout_s)

    # ------------------------------------------------------- membership (admin)
    async def cluster_members(self, url: str | None = None) -> list[dict[str, Any]]:
        """The cluster's members as a node sees them (any node answers; ``url``: exactly that node's
        view, asked once): each has ``node_id``, ``raft_address``, ``url``, ``role`` (leader, follower,
        unknown), ``self`` (the node that answered), ``connected`` and ``match_index`` (None when the
        answering node does not know them). Needs an admin token."""
        if url is None:
            answer = await self._transport.request(Request("GET", MEMBERS_PATH))
        else:
            answer = await self._transport.ask_node(url, MEMBERS_PATH)
        return list(answer["members"])

    async def add_node(self, node_id: str, raft_address: str, url: str, *,
                       catch_up_timeout_s: float = DEFAULT_CATCH_UP_TIMEOUT_S) -> dict[str, Any]:
        """Add a node to the cluster. It must be running already (configured with the current members
        as its peers): the leader checks its ``/healthz`` first (NodeUnreachable if it does not answer).
        The leader waits up to ``catch_up_timeout_s`` (0 to 600) for the new node to catch up, and
        the request may take that long. Answers ``added`` (the new member), ``caught_up`` and
        ``members``. Raises MemberExists, WouldLoseQuorum, NodeUnreachable (retryable: the caller may
        wait for the node and try again), InvalidRequest. Re-sent only after answers that say it was
        not applied (a redirect, no leader, MembershipConflict) until the retry budget is spent; an
        attempt that may have applied (a lost answer, a 504) is never re-sent: CommitOutcomeUnknown,
        and :meth:`cluster_members` tells whether the node is a member. Needs an admin token."""
        body = add_member_body(node_id, raft_address, url, catch_up_timeout_s)
        # The server may hold the request while the node catches up: the HTTP timeout (and the
        # patience before the client looks for another leader) grow by that long.
        return dict(await self._transport.request(Request("POST", MEMBERS_PATH, body, MEMBERSHIP,
                                                          wait_ms=waited_ms(catch_up_timeout_s))))

    async def remove_node(self, node_id: str) -> dict[str, Any]:
        """Remove a member; answers ``removed`` (the member) and ``members``. Removing the leader
        makes it hand leadership over first; the request follows it to the new leader. Raises
        MemberNotFound (also when aiohttp re-sent the DELETE after a dropped connection and the first
        one had removed it, as :meth:`delete_queue`), WouldLoseQuorum; otherwise retried, and never
        re-sent by rcq after an unknown outcome, as :meth:`add_node`. Needs an admin token."""
        return dict(await self._transport.request(
            Request("DELETE", member_path(node_id), None, MEMBERSHIP, wait_ms=MEMBERSHIP_CHANGE_MS)))

    async def transfer_leadership(self, node_id: str | None = None) -> dict[str, Any]:
        """Hand leadership to ``node_id`` (None: the most caught-up follower); answers ``leader_id``
        and ``previous_leader_id``. Raises MemberNotFound; MembershipConflict (the target is not caught
        up) is retried until the retry budget is spent; never re-sent after an unknown outcome.
        Needs an admin token."""
        return dict(await self._transport.request(
            Request("POST", LEADERSHIP_PATH, leadership_body(node_id), MEMBERSHIP, wait_ms=MEMBERSHIP_CHANGE_MS)))

    async def feature_level(self) -> dict[str, Any]:
        """The cluster's feature level (docs/upgrades.md): ``active``, ``max`` (what the answering
        node reads), ``auto``, the known ``levels``, and each member's ``version`` and ``level_max``.
        Any node answers; one of a release before feature levels (rcq 0.1, during a rolling
        upgrade) does not have the route, and the next node is asked. Needs an admin token."""
        try:
            return dict(await self._transport.request(Request("GET", FEATURE_LEVEL_PATH)))
        except RouteNotFound:
            for url in self.urls:  # a mixed cluster: find a node that knows feature levels
                with contextlib.suppress(RouteNotFound, Unavailable):
                    return dict(await self._transport.ask_node(url, FEATURE_LEVEL_PATH))
            raise FeatureLevelUnsupported(
                "no node given knows feature levels: they run rcq 0.1 (docs/upgrades.md)") from None

    async def raise_feature_level(self, level: int | None = None) -> dict[str, Any]:
        """Raise the cluster's feature level to ``level`` (None: the highest every member reads);
        answers ``level``, ``previous`` and ``changed``. Raises FeatureLevelUnsupported when a member
        cannot read it, or when the leader runs rcq 0.1 (no feature levels: hand leadership to an
        upgraded node first). Raising twice is harmless, so it is re-sent after an unknown outcome.
        Needs an admin token."""
        try:
            return dict(await self._transport.request(
                Request("POST", FEATURE_LEVEL_PATH, {"level": level}, WRITE, wait_ms=MEMBERSHIP_CHANGE_MS)))
        except RouteNotFound as exc:
            raise FeatureLevelUnsupported(
                "the leader runs a release before feature levels (rcq 0.1): upgrade it, or hand leadership to an "
                "upgraded node, then raise the level (docs/upgrades.md)") from exc
