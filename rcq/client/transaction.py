"""The handle on one server-side transaction: its verbs, its state, and ``async with`` (commit or abort).

Why over 400 lines: one short documented method per verb, and where the transaction lives (its partition).

A :class:`Transaction` builds each verb's request (the REST form and, where the server has one,
the ``/v1/batch`` form) and hands it to :meth:`Transport.request`, which chooses between them
and retries (see :mod:`rcq.client.retry` for what is safe to re-send, and why).

Must not import: rcq.client.client (a transaction talks to the transport, never to the
client's internals), rcq.server, pysyncobj, lmdb.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import warnings
from collections.abc import Awaitable, Callable, Iterable, Mapping
from types import TracebackType
from typing import Any

from rcq.client import hooks
from rcq.client.retry import COMMIT, ONCE, SAFE, Request, RetryPolicy
from rcq.client.transport import Transport
from rcq.client.wire import (
    CommitInfo,
    Item,
    ItemValue,
    commit_info,
    enqueue_body,
    enqueue_items_body,
    item_from_wire,
    receive_body,
    transaction_path,
)
from rcq.errors import (
    CommitOutcomeUnknown,
    CrossPartitionTransaction,
    InvalidRequest,
    QueueNotFound,
    RcqError,
    TransactionAborted,
    error_from_body,
)
from rcq.names import P0, check_queue_name, fragment_for, transaction_partition

log = logging.getLogger(__name__)


def timeout_s_of(timeout_s: float | None, timeout: float | None, where: str) -> float | None:
    """``timeout_s``, or the value of the deprecated ``timeout`` it replaced (with a DeprecationWarning)."""
    if timeout is None:
        return timeout_s
    if timeout_s is not None:
        raise TypeError(f"{where}() takes timeout_s, not both timeout_s and timeout")
    # stacklevel 3: the warning names the caller's line, not this helper's or the method's
    warnings.warn(f"{where}(timeout=...) is deprecated: use timeout_s=...", DeprecationWarning, stacklevel=3)
    return timeout


class Transaction:
    """An open server-side transaction. Use as ``async with`` to commit on a clean exit.

    **Where it lives** (docs/partitions.md): a transaction lives in one partition, and its id names
    it. In a cluster of several partitions, :meth:`RcqClient.begin` opens the server's transaction
    at the first verb, in that verb's queue's partition: until then ``transaction_id`` is None. A
    verb on a queue of another partition raises CrossPartitionTransaction, sends nothing and
    leaves the transaction usable."""

    def __init__(self, transport: Transport, transaction_id: str | None, *, label: str | None = None,
                 items: list[Item] | None = None, queue: str | None = None,
                 begin: dict[str, Any] | None = None, partition_key: str | None = None) -> None:
        self._transport = transport
        self.partition_key = partition_key  # a spread queue: the fragment this transaction uses
        self.transaction_id = transaction_id
        # the partition it lives in; None: not opened yet, decided by its first verb's queue
        self.partition: str | None = transaction_partition(transaction_id) if transaction_id else None
        self._begin = begin  # the begin's body, for a transaction opened at its first verb
        self._verbs = 0  # verbs answered: a first verb refused for its queue's partition opens again
        self._opening: asyncio.Future[None] | None = None  # the begin of a transaction opened at its first verb
        self._moving = asyncio.Lock()  # one move at a time to the first verb's partition (_verb)
        self.label = label
        self.state = "open"  # open, committed, aborted, unknown (commit outcome unknown)
        self.commit_info: CommitInfo | None = None
        self.items: list[Item] = items or []  # what a receive dequeued into it
        self.queue = queue  # the queue it received from, if it was received
        self.receive_error: RcqError | None = None  # why commit_and_receive's receive failed, if it did

    def __repr__(self) -> str:
        return f"Transaction({self.transaction_id!r}, state={self.state!r})"

    def _request(self, verb: str, body: dict[str, Any] | None, policy: RetryPolicy = SAFE, *,
                 wait_ms: int = 0, coalescable: bool = True) -> Request:
        """``POST /v1/transactions/{id}/{verb}``, and the same as a sub-request of ``/v1/batch``."""
        assert self.transaction_id is not None, "opened first (_ready)"
        operation = {"op": verb, "transaction_id": self.transaction_id, **(body or {})} if coalescable else None
        return Request("POST", transaction_path(self.transaction_id, verb), body, policy,
                       batch_operation=operation, wait_ms=wait_ms, partition=self.partition)

    @property
    def opened_id(self) -> str:
        """``transaction_id`` of a transaction the server has opened (InvalidRequest before that)."""
        if self.transaction_id is None:
            raise InvalidRequest("this transaction is opened at its first verb, and it has had none")
        return self.transaction_id

    async def open(self) -> str:
        """Open the server's transaction now if it is not open yet (in p0, or the partition it was
        begun for); its id."""
        await self._ready(None)
        return self.opened_id

    # ------------------------------------------------------------ its partition
    async def _ready(self, queue: str | None) -> None:
        """Open the server's transaction if it is not yet (in ``queue``'s partition); raise
        CrossPartitionTransaction, sending nothing, if ``queue`` lives in another partition."""
        routes = self._transport.routes
        partition = routes.placed(queue) if queue is not None else None
        spread = routes.spread(queue) if queue is not None else None
        # p0 knows where every queue lives and refuses a verb on another partition's itself; any
        # other partition knows only its own queues, so the client asks before it sends one there.
        # A transaction opened in p0 that has sent no verb yet asks too: its queue may be spread,
        # and its first verb then picks the fragment (the placement is asked once per queue).
        if queue is not None and partition is None and spread is None and (
                self.transaction_id is None or self.partition != P0 or self._movable()):
            placement = await routes.placement_of(queue)
            spread, partition = (placement, None) if len(placement) > 1 else (None, placement[0])
        if queue is not None and spread is not None:
            partition = self._fragment(queue, spread)
        if partition is not None and partition != self.partition and self._movable():
            await self._move()
        if self.transaction_id is None:
            opening = self._opening
            if opening is None:  # verbs sent at once share one open
                opening = self._opening = asyncio.ensure_future(self._open(partition or self.partition or P0))
            try:
                await asyncio.shield(opening)
            finally:
                if opening.done():
                    self._opening = None
            assert self.transaction_id is not None
        if partition is not None and partition != self.partition:
            raise CrossPartitionTransaction(
                f"queue {queue!r} lives in partition {partition}; this transaction lives in {self.partition}. A "
                "transaction touches the queues of one partition (docs/partitions.md); nothing was sent",
                details={"queue": queue, "queue_partitions": [partition], "transaction_partition": self.partition})

    def _fragment(self, queue: str, spread: tuple[str, ...]) -> str:
        """The fragment of spread ``queue`` this transaction uses: the one of its partition when it
        has one there (opened for it, or a verb sent), else its partition key's, else the next in
        turn (docs/partitions.md, "Spread queues")."""
        opened = self.transaction_id is not None and self.partition in spread
        if opened and not self._movable():  # begun for it, or a verb sent there: it stays
            return str(self.partition)
        if self.partition_key is not None:
            return fragment_for(self.partition_key, spread)
        if opened:  # opened in a fragment already (p0's, before the client knew): it stays, its turn taken
            self._transport.routes.took_turn(queue, spread, str(self.partition))
            return str(self.partition)
        return self._transport.routes.next_fragment(queue, spread)

    def _movable(self) -> bool:
        """Begun without a partition, opened, and no verb yet: it may move to its first verb's partition."""
        return self._begin is not None and self._verbs == 0 and self.transaction_id is not None

    async def _move(self) -> None:
        """Give up the empty server transaction (aborted) so that the next verb opens one where its queue lives."""
        await self.abort_quietly()
        self.transaction_id, self.partition, self.state = None, None, "open"

    async def _open(self, partition: str) -> None:
        body = dict(self._begin or {})
        if partition != P0:
            body["partition"] = partition
        answer = await self._transport.request(Request("POST", "/v1/transactions", body, SAFE, partition=partition,
                                                       batch_operation={"op": "begin", **body}))
        self.transaction_id, self.partition = answer["transaction_id"], partition
        self._verbs = 0

    async def _verb(self, queue: str, send: Callable[[], Awaitable[Any]]) -> Any:
        """``send()`` once the transaction is ready for ``queue``. A first verb refused because the
        queue lives elsewhere than the client believed (placed or deleted since) opens the
        transaction again where it lives, once; the empty transaction left behind is aborted.
        Verbs sent at once (the Spark connector's) that meet the same refusal move it once."""
        await self._ready(queue)
        sent_in = self.transaction_id
        try:
            answer = await send()
        except (CrossPartitionTransaction, QueueNotFound) as exc:
            refused_in = transaction_partition(sent_in) if sent_in is not None else P0
            if self._begin is None or self._verbs or (isinstance(exc, QueueNotFound) and refused_in == P0):
                raise
            async with self._moving:
                if self.transaction_id == sent_in:  # the first of them to get here moves it
                    routes = self._transport.routes
                    routes.forget(queue)
                    named = exc.details.get("queue_partitions") if isinstance(exc, CrossPartitionTransaction) else None
                    if named:
                        routes.learn_placement(queue, [str(p) for p in named])
                    await routes.partitions(refresh=True)  # the next begin knows to wait for its first verb
                    await self._move()
                await self._ready(queue)
            if self.partition == refused_in:
                raise
            answer = await send()
        self._verbs += 1
        return answer

    async def enqueue(self, queue: str, item: ItemValue, *, priority: int | None = None,
                      delay_s: float | None = None, ttl_s: float | None = None,
                      headers: Mapping[str, str] | None = None) -> int:
        """Buffer one item; returns the transaction's buffered item count (retry-safe: keyed).
        ``priority``, ``delay_s``, ``ttl_s``, ``headers``: as :meth:`enqueue_batch`."""
        return await self.enqueue_batch(queue, [item], priority=priority, delay_s=delay_s, ttl_s=ttl_s,
                                        headers=headers)

    async def enqueue_batch(self, queue: str, items: Iterable[ItemValue], *, priority: int | None = None,
                            delay_s: float | None = None, ttl_s: float | None = None,
                            headers: Mapping[str, str] | None = None) -> int:
        """Buffer items; returns the buffered item count. The options apply to every item (None: the
        queue's default): ``priority`` 0..255 (at most the queue's ``max_priority``), ``delay_s``
        invisible this long after the commit, ``ttl_s`` gone this long after the commit unless consumed;
        ``headers`` (str to str) travel with each item and come back with it (``Item.headers``); a
        cluster below feature level 2 refuses them (FeatureLevelRequired, not retried)."""
        values = list(items)
        return await hooks.active().send(self._transport, queue, len(values), headers, lambda sent: self._enqueue(
            queue, values, priority=priority, delay_s=delay_s, ttl_s=ttl_s, headers=sent),
            transaction_id=self.transaction_id)

    async def _enqueue(self, queue: str, items: list[ItemValue], *, priority: int | None, delay_s: float | None,
                       ttl_s: float | None, headers: Mapping[str, str] | None) -> int:
        # The key makes a re-sent enqueue buffer nothing twice, so it is safe to retry.
        body = {**enqueue_body(queue, items, priority=priority, delay_s=delay_s, ttl_s=ttl_s, headers=headers),
                "key": secrets.token_hex(12)}
        answer = await self._verb(queue, lambda: self._transport.request(self._request("enqueue", body)))
        return int(answer["buffered"])

    async def enqueue_items(self, queue: str, items: Iterable[tuple[ItemValue, Mapping[str, str] | None]], *,
                            priority: int | None = None, delay_s: float | None = None,
                            ttl_s: float | None = None) -> int:
        """:meth:`enqueue_batch` where each item has headers of its own: ``items`` are (value,
        headers or None) pairs, in order, in one request. Returns the buffered item count. With
        tracing on, the trace context goes under each item's own headers."""
        pairs = list(items)

        async def send(added: Mapping[str, str] | None) -> int:
            body = {**enqueue_items_body(queue, pairs, added, priority=priority, delay_s=delay_s, ttl_s=ttl_s),
                    "key": secrets.token_hex(12)}  # a re-sent enqueue buffers nothing twice
            answer = await self._verb(queue, lambda: self._transport.request(self._request("enqueue", body)))
            return int(answer["buffered"])

        # (A cluster below level 2 refuses items with headers of their own, traced or not.)
        return await hooks.active().send(self._transport, queue, len(pairs), None, send,
                                         transaction_id=self.transaction_id)

    async def dequeue_items(self, queue: str, max_items: int = 1, wait_ms: int = 0,
                            key: str | None = None) -> list[Item]:
        """Take up to ``max_items``, waiting up to ``wait_ms`` for the first; ``key`` makes a retry
        return the same items (one is generated when None)."""
        body = {"queue": check_queue_name(queue), "max_items": max_items, "wait_ms": wait_ms,
                "key": key if key is not None else secrets.token_hex(12)}
        return await hooks.active().receive(self._transport, queue, lambda: self._dequeue_items(body, wait_ms), list,
                                            transaction_id=self.transaction_id)

    async def _dequeue_items(self, body: dict[str, Any], wait_ms: int) -> list[Item]:
        # A first verb that dequeues from a spread queue moves on from an empty fragment: each is
        # tried in turn without waiting, then the wait (if any) is spent in the last one tried.
        spread: tuple[str, ...] | None = None
        if self._begin is not None and self._verbs == 0 and self.partition_key is None:
            await self._ready(body["queue"])  # learns where the queue lives (the verb's own is then a no-op)
            spread = self._transport.routes.spread(body["queue"])
        first = {**body, "wait_ms": 0} if spread and wait_ms else body
        answer = await self._verb(body["queue"], lambda: self._transport.request(
            self._request("dequeue", first, wait_ms=int(first["wait_ms"]))))
        for _ in range(len(spread or ()) - 1):
            if answer["items"]:
                break
            self._verbs = 0  # it took nothing: free to move to the next fragment
            await self._move()
            answer = await self._verb(body["queue"], lambda: self._transport.request(
                self._request("dequeue", first, wait_ms=int(first["wait_ms"]))))
        if not answer["items"] and first is not body:  # every fragment empty: wait where it is
            answer = await self._transport.request(self._request("dequeue", body, wait_ms=wait_ms))
        return [item_from_wire(entry) for entry in answer["items"]]

    async def dequeue_batch(self, queue: str, max_items: int, wait_ms: int = 0, key: str | None = None) -> list[bytes]:
        return [item.value for item in await self.dequeue_items(queue, max_items, wait_ms, key)]

    async def dequeue(self, queue: str, wait_ms: int = 0, key: str | None = None) -> bytes | None:
        items = await self.dequeue_items(queue, 1, wait_ms, key)
        return items[0].value if items else None

    async def reject(self, queue: str, item_ids_or_items: Iterable[int | Item], reason: str | None = None) -> int:
        """Send items this transaction dequeued from ``queue`` to its dead-letter queue at once (dropped
        if it has none), whatever the transaction does next; they leave the transaction. Returns how many.

        Not re-sent after an attempt that may have executed (policy ONCE): the request has no key, and
        a repeat of one that applied would meet items the transaction no longer holds and fail. Such an
        attempt raises CommitOutcomeUnknown: each item is dead or still held, never lost; abort to give
        back whatever is still held."""
        body: dict[str, Any] = {"queue": check_queue_name(queue), "item_ids": item_ids(queue, item_ids_or_items)}
        if reason is not None:
            body["reason"] = reason
        await self._ready(queue)
        answer = await self._transport.request(self._request("reject", body, ONCE))
        return int(answer["rejected"])

    async def commit(self, idempotency_key: str | None = None) -> CommitInfo:
        """Commit; retried with the same transaction id until definite. Raises TransactionAborted
        and its subclasses when definitely not committed, CommitOutcomeUnknown when it cannot know."""
        body = {} if idempotency_key is None else {"idempotency_key": idempotency_key}
        await self._commit(body, 0)
        assert self.commit_info is not None
        return self.commit_info

    async def _commit(self, body: dict[str, Any], wait_ms: int) -> dict[str, Any]:
        """Send the commit (retried as COMMIT says) and record how it ended; returns the answer."""
        await self._ready(None)  # a transaction with no verb commits as it always has: opened, then committed
        try:
            answer = await hooks.active().settle(
                self._transport, self.items,
                lambda: self._transport.request(self._request("commit", body, COMMIT, wait_ms=wait_ms)),
                transaction_ids=(self.opened_id,))
        except TransactionAborted:
            self.state = "aborted"
            raise
        except CommitOutcomeUnknown:
            self.state = "unknown"
            raise
        self.state, self.commit_info = "committed", commit_info(answer)
        return dict(answer)

    async def commit_and_receive(self, queue: str | None = None, max_items: int = 1, wait_ms: int = 0,
                                 timeout_s: float | None = None, idempotency_key: str | None = None
                                 ) -> Transaction | None:
        """Commit, and in the same request begin the next transaction and dequeue up to ``max_items``
        of ``queue`` (default: the queue this one received from) into it, waiting up to ``wait_ms``
        for the first. Returns the next transaction, None when nothing came (nothing is held then).

        The commit is retried exactly as :meth:`commit` is; the receive part of an attempt whose
        answer was lost holds its items until that transaction's deadline, then they return."""
        target = queue if queue is not None else self.queue
        if target is None:
            raise InvalidRequest("commit_and_receive needs a queue: this transaction was not received")
        receive = receive_body(check_queue_name(target), max_items, wait_ms, timeout_s, self.label)
        await self._ready(target)  # the next transaction opens in this one's partition
        body: dict[str, Any] = {"receive": {"queue": target, **receive}}
        if idempotency_key is not None:
            body["idempotency_key"] = idempotency_key
        # for the hooks, a receive whose request is also this transaction's commit
        return await hooks.active().receive(self._transport, target, lambda: self._commit_and_receive(body, wait_ms),
                                            items_received)

    async def _commit_and_receive(self, body: dict[str, Any], wait_ms: int) -> Transaction | None:
        answer = await self._commit(body, wait_ms)
        following = answer.get("next") or {}
        if following.get("error"):
            # Committed; only the receive failed (e.g. too many transactions): say it, return None,
            # and let the caller's next receive() meet the error itself if it persists.
            self.receive_error = error_from_body(200, {"error": following["error"]})
            log.info("committed %s; the receive after it failed: %s", self.transaction_id, self.receive_error)
        return received(self._transport, following, self.label)

    async def abort(self) -> int:
        """Abort: dequeued items return to the head of their queues. Returns how many did.
        An already aborted (or expired) transaction is not an error; a committed one is."""
        if self.transaction_id is None:  # never opened: nothing to give back
            self.state = "aborted"
            return 0
        try:
            answer = await self._transport.request(self._request("abort", None))
        except TransactionAborted:
            self.state = "aborted"
            return 0
        self.state = "aborted"
        return int(answer.get("returned", 0))

    async def extend(self, timeout_s: float | None = None, *, timeout: float | None = None) -> dict[str, Any]:
        """Move the deadline to ``timeout_s`` seconds from now (``timeout``: its deprecated name)."""
        seconds = timeout_s_of(timeout_s, timeout, "extend")
        if seconds is None:
            raise TypeError("extend() missing its argument timeout_s")
        await self._ready(None)
        # not coalesced, as before the client was split up; the batch form exists if that should change
        request = self._request("extend", {"timeout_s": seconds}, coalescable=False)
        return dict(await self._transport.request(request))

    async def status(self) -> dict[str, Any]:
        """``state``: open, committing, unknown, committed or aborted (with ``reason``)."""
        await self._ready(None)
        assert self.transaction_id is not None
        return dict(await self._transport.request(Request("GET", transaction_path(self.transaction_id),
                                                          partition=self.partition)))

    async def abort_quietly(self) -> None:
        """Abort, logging instead of raising a failure: for cleanup, where the transaction expires anyway."""
        try:
            await self.abort()
        except (RcqError, OSError) as exc:  # it expires on the server anyway
            log.warning("abort of %s failed (%s); it will expire", self.transaction_id, exc)


    async def __aenter__(self) -> Transaction:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        traceback: TracebackType | None) -> None:
        if self.state != "open":
            return
        if exc is None:
            await self.commit()
        elif isinstance(exc, Exception):
            await self.abort_quietly()
        else:  # cancelled: do not hold the cancellation up; abort in the background
            self._transport.spawn(self.abort_quietly())


def item_ids(queue: str, item_ids_or_items: Iterable[int | Item]) -> list[int]:
    """Item ids, from ids or from :class:`Item` objects of ``queue`` (one of another queue is refused
    here: the server would only say it is not held)."""
    ids = []
    for entry in item_ids_or_items:
        if isinstance(entry, Item):
            if entry.queue != queue:
                raise InvalidRequest(f"item {entry.item_id} was dequeued from {entry.queue!r}, not {queue!r}")
            ids.append(entry.item_id)
        elif isinstance(entry, int) and not isinstance(entry, bool):
            ids.append(entry)
        else:
            raise InvalidRequest(f"items to reject are item ids or Items, not {type(entry).__name__}")
    return ids


class TransactionContext:
    """``async with client.transaction() as tx``: begins on entry, then as :class:`Transaction`."""

    def __init__(self, begin: Callable[[], Awaitable[Transaction]]) -> None:
        self._begin = begin
        self._transaction: Transaction | None = None

    async def __aenter__(self) -> Transaction:
        self._transaction = await self._begin()
        return self._transaction

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        traceback: TracebackType | None) -> None:
        assert self._transaction is not None, "__aexit__ without __aenter__"
        await self._transaction.__aexit__(exc_type, exc, traceback)


def received(transport: Transport, answer: dict[str, Any], label: str | None) -> Transaction | None:
    """The transaction a receive answered with (None: nothing was received, nothing is held)."""
    if not answer.get("transaction_id"):
        return None
    items = [item_from_wire(entry) for entry in answer.get("items") or ()]
    return Transaction(transport, answer["transaction_id"], label=answer.get("label", label), items=items,
                       queue=answer.get("queue"))


def items_received(transaction: Transaction | None) -> list[Item]:
    """What a receive took (for the hooks): the items of the transaction it began, if any."""
    return [] if transaction is None else transaction.items
