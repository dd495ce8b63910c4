"""The async client of rcq: transactions, one-request transactions, leader discovery and failover.

::

    async with RcqClient(["http://127.0.0.1:7001", "http://127.0.0.1:7002"]) as client:
        async with client.transaction(timeout=30) as tx:    # commits on a clean exit,
            item = await tx.dequeue("in")                   # aborts on an exception
            if item is not None:
                await tx.enqueue("out", item)
        await client.enqueue("in", b"\\x00\\xff", "text")    # one request, one transaction

**Where requests go.** The client remembers the leader's URL. A ``307 not_leader``
means the request was not executed: it is re-sent to ``leader_url`` at once.
Connection errors, timeouts and 503 (``no_leader``, ``not_ready``,
``unavailable``) rotate through the known URLs with jittered exponential
backoff (50 ms doubling up to 1 s; a ``Retry-After`` becomes the ceiling, so
repeated 503s settle at the server's pace while the first retries stay quick
enough for a failover) until ``retry_timeout_s`` has passed.

**What is re-sent after a failure that may have executed** (the connection
broke after the request was sent, a timeout, a 504):

* reads, ``begin`` (a lost one leaves an empty transaction that expires),
  ``abort``, ``extend``, and transactional dequeues and enqueues: each carries
  a key (one is generated per call); the server answers a repeated dequeue key
  with the same items and buffers nothing more for a repeated enqueue key;
* commits: a retried commit with the same transaction id is never applied
  twice (the server answers ``duplicate``); until the answer is definite the
  client keeps asking, then raises :class:`CommitOutcomeUnknown`;
* one-request ``enqueue``/``execute``: they carry an idempotency key (one is
  generated per call), so a retry answers ``duplicate`` instead of applying
  twice; the dequeues of a duplicate answer are dropped (they were returned to
  their queues, and what the first attempt took is unknown);
* one-request ``dequeue`` is **at most once**: if the answer of an attempt that
  committed is lost, the items it took are gone and the retry takes others.

**Item encodings.** Items are bytes; ``str`` items are sent as their UTF-8
bytes. A request's items travel as ``utf-8`` text when every one is valid
UTF-8, else as ``base64``: the check costs about 0.2 us per KiB while base64
costs about 1.5 us per KiB to encode, makes the JSON a third bigger and the
server decode it. Answers are decoded by each item's own ``encoding``.

Must not import: pysyncobj, lmdb.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import random
import secrets
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any
from urllib.parse import quote, urlsplit

import aiohttp
import yarl

from rcq import encoding
from rcq.client.coalescer import BACKOFF_FIRST_S, BACKOFF_MAX_S, Attempts, Coalescer
from rcq.errors import (
    CommitConflict,
    CommitOutcomeUnknown,
    InternalError,
    InvalidQueueName,
    InvalidRequest,
    LeaderChanged,
    MethodNotAllowed,
    NoLeader,
    NotLeader,
    NotReady,
    PayloadTooLarge,
    RcqError,
    RouteNotFound,
    TooManyQueues,
    TooManyTransactions,
    TransactionAborted,
    TransactionBusy,
    TransactionClosed,
    TransactionCommitted,
    TransactionExpired,
    TransactionNotFound,
    Unavailable,
    error_from_body,
)
from rcq.names import check_queue_name

__all__ = [
    "CommitConflict", "CommitInfo", "CommitOutcomeUnknown", "Dequeue", "Enqueue", "ExecuteResult",
    "InternalError", "InvalidQueueName", "InvalidRequest", "Item", "LeaderChanged", "MethodNotAllowed",
    "NoLeader", "NotLeader", "NotReady", "OperationResult", "PayloadTooLarge", "RcqClient", "RcqError",
    "RouteNotFound", "TooManyQueues", "TooManyTransactions", "Transaction", "TransactionAborted",
    "TransactionBusy", "TransactionClosed", "TransactionCommitted", "TransactionExpired",
    "TransactionNotFound", "Unavailable", "encode_items",
]

log = logging.getLogger(__name__)

CONNECTIONS_MAX = 256
PEEK_TIMEOUT_S = 10.0  # how long a peeked item stays locked if the peek's abort is lost
ItemValue = bytes | bytearray | memoryview | str


# ------------------------------------------------------------------------- results
@dataclass(frozen=True, slots=True)
class Item:
    item_id: int
    queue: str
    value: bytes


@dataclass(frozen=True, slots=True)
class CommitInfo:
    """A definite commit. ``duplicate``: an earlier attempt (same transaction ids or idempotency
    key) had already committed; then ``enqueued``/``dequeued`` are 0, they count this attempt."""

    index: int
    duplicate: bool
    enqueued: int
    dequeued: int
    transaction_ids: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Enqueue:
    """An operation of :meth:`RcqClient.execute`."""

    queue: str
    items: Sequence[ItemValue]


@dataclass(frozen=True, slots=True)
class Dequeue:
    """An operation of :meth:`RcqClient.execute`."""

    queue: str
    max_items: int = 1
    wait_ms: int = 0


@dataclass(frozen=True, slots=True)
class OperationResult:
    op: str  # "enqueue" or "dequeue"
    queue: str
    enqueued: int = 0
    items: tuple[Item, ...] = ()

    @property
    def values(self) -> list[bytes]:
        return [item.value for item in self.items]


@dataclass(frozen=True, slots=True)
class ExecuteResult:
    """A committed one-request transaction; ``results`` line up with the operations sent."""

    transaction_id: str
    index: int
    duplicate: bool
    enqueued: int
    dequeued: int
    results: tuple[OperationResult, ...]


# ------------------------------------------------------------------------ encoding
def _as_bytes(value: ItemValue) -> bytes:
    if isinstance(value, str):
        try:
            return value.encode("utf-8")
        except UnicodeEncodeError as exc:  # lone surrogates
            raise InvalidRequest(f"item {value[:32]!r} is not valid Unicode text") from exc
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    raise InvalidRequest(f"items are bytes or str, not {type(value).__name__}")


def encode_items(items: Iterable[ItemValue]) -> tuple[list[str], str]:
    """Items -> (wire strings, encoding): UTF-8 text when all are valid UTF-8, else base64."""
    return encoding.encode_items([_as_bytes(item) for item in items])


def _decode_item(entry: Mapping[str, Any]) -> Item:
    text = entry["value"]
    try:
        value = encoding.decode_item(text, "base64" if entry.get("encoding") == "base64" else "utf-8")
    except ValueError as exc:
        raise InternalError(f"the server sent an item that is {exc}: {text[:32]!r}") from exc
    return Item(int(entry["item_id"]), str(entry["queue"]), value)


def _dumps(body: Any) -> bytes:
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def _commit_info(body: Mapping[str, Any]) -> CommitInfo:
    return CommitInfo(index=int(body.get("index") or 0), duplicate=bool(body.get("duplicate")),
                      enqueued=int(body.get("enqueued") or 0), dequeued=int(body.get("dequeued") or 0),
                      transaction_ids=tuple(body.get("transaction_ids") or ()))


def _execute_result(body: Mapping[str, Any]) -> ExecuteResult:
    duplicate = bool(body.get("duplicate"))
    results = []
    for result in body.get("results") or ():
        if result.get("op") == "enqueue":
            results.append(OperationResult("enqueue", result["queue"], enqueued=int(result["enqueued"])))
        else:  # a duplicate's dequeues were not committed: the server gave those items back
            items = () if duplicate else tuple(_decode_item(e) for e in result.get("items") or ())
            results.append(OperationResult("dequeue", result["queue"], items=items))
    info = _commit_info(body)
    return ExecuteResult(str(body.get("transaction_id", "")), info.index, info.duplicate,
                         info.enqueued, info.dequeued, tuple(results))


def _operation_body(operation: Enqueue | Dequeue | Mapping[str, Any]) -> dict[str, Any]:
    if isinstance(operation, Enqueue):
        texts, encoding = encode_items(operation.items)
        return {"op": "enqueue", "queue": check_queue_name(operation.queue), "items": texts, "encoding": encoding}
    if isinstance(operation, Dequeue):
        return {"op": "dequeue", "queue": check_queue_name(operation.queue), "max_items": operation.max_items,
                "wait_ms": operation.wait_ms}
    if not isinstance(operation, Mapping):
        raise InvalidRequest(f"an operation is Enqueue, Dequeue or a dict, not {type(operation).__name__}")
    body = dict(operation)
    check_queue_name(body.get("queue"))  # type: ignore[arg-type]
    if body.get("op") == "enqueue" and "encoding" not in body:
        body["items"], body["encoding"] = encode_items(body.get("items") or ())
    return body


def _queue_path(queue: str, verb: str = "") -> str:
    """The URL path of a queue (names are checked first: no name needs escaping)."""
    segment = check_queue_name(queue)
    return f"/v1/queues/{segment}" + (f"/{verb}" if verb else "")


def _normalize_url(url: str) -> str:
    url = url.strip().rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise InvalidRequest(f"bad URL {url!r}: expected http://host:port")
    return url


def _retry_after_s(value: str | None) -> float | None:
    try:
        return min(max(float(value), 0.1), 5.0) if value is not None else None
    except ValueError:
        return None


# -------------------------------------------------------------------- request policy
@dataclass(frozen=True, slots=True)
class _Policy:
    """How a kind of request may be re-sent."""

    retry_ambiguous: bool  # re-send after a failure that may have executed
    maybe_committed: bool  # once such a failure happened, giving up means CommitOutcomeUnknown
    # After an ambiguous attempt these answers mean "still unknown", not a definite failure: a
    # leader answers a commit whose Raft outcome is pending with 404 (see the report of the client).
    unknown_after_ambiguous: tuple[type[RcqError], ...] = ()


_SAFE = _Policy(retry_ambiguous=True, maybe_committed=False)
_WRITE = _Policy(retry_ambiguous=True, maybe_committed=True)
_COMMIT = _Policy(retry_ambiguous=True, maybe_committed=True, unknown_after_ambiguous=(TransactionNotFound,))


@dataclass(slots=True)
class _Answer:
    status: int
    payload: Any
    retry_after_s: float | None
    location: str | None


class _TransportError(Exception):
    def __init__(self, error: RcqError, maybe_sent: bool) -> None:
        super().__init__(error.message)
        self.error = error
        self.maybe_sent = maybe_sent


# ---------------------------------------------------------------------- transaction
class Transaction:
    """An open server-side transaction. Use as ``async with`` to commit on a clean exit."""

    def __init__(self, client: RcqClient, transaction_id: str, *, label: str | None = None) -> None:
        self._client = client
        self.transaction_id = transaction_id
        self.label = label
        self.state = "open"  # open, committed, aborted, unknown (commit outcome unknown)
        self.commit_info: CommitInfo | None = None

    def __repr__(self) -> str:
        return f"Transaction({self.transaction_id!r}, state={self.state!r})"

    def _path(self, verb: str = "") -> str:
        return f"/v1/transactions/{quote(self.transaction_id, safe='')}" + (f"/{verb}" if verb else "")

    async def enqueue(self, queue: str, item: ItemValue) -> int:
        """Buffer one item; returns the transaction's buffered item count (retry-safe: keyed, see module)."""
        return await self.enqueue_batch(queue, [item])

    async def enqueue_batch(self, queue: str, items: Iterable[ItemValue]) -> int:
        check_queue_name(queue)  # refuse before any request leaves
        texts, encoding = encode_items(items)
        # The key makes a re-sent enqueue buffer nothing twice, so it is safe to retry.
        request = {"queue": queue, "items": texts, "encoding": encoding, "key": secrets.token_hex(12)}
        body = await self._client._verb({"op": "enqueue", "transaction_id": self.transaction_id}, "POST",
                                        self._path("enqueue"), request, _SAFE, sum(map(len, texts)) + 64)
        return int(body["buffered"])

    async def dequeue_items(self, queue: str, max_items: int = 1, wait_ms: int = 0,
                            key: str | None = None) -> list[Item]:
        """Take up to ``max_items``, waiting up to ``wait_ms`` for the first; ``key`` makes a retry
        return the same items (one is generated when None)."""
        body = {"queue": check_queue_name(queue), "max_items": max_items, "wait_ms": wait_ms,
                "key": key if key is not None else secrets.token_hex(12)}
        if wait_ms == 0:  # a waiting dequeue would hold a whole coalesced batch up
            answer = await self._client._verb({"op": "dequeue", "transaction_id": self.transaction_id},
                                              "POST", self._path("dequeue"), body, _SAFE)
        else:
            answer = await self._client._call("POST", self._path("dequeue"), body, policy=_SAFE,
                                              timeout_s=self._client._request_timeout_s + wait_ms / 1000)
        return [_decode_item(entry) for entry in answer["items"]]

    async def dequeue_batch(self, queue: str, max_items: int, wait_ms: int = 0, key: str | None = None) -> list[bytes]:
        return [item.value for item in await self.dequeue_items(queue, max_items, wait_ms, key)]

    async def dequeue(self, queue: str, wait_ms: int = 0, key: str | None = None) -> bytes | None:
        items = await self.dequeue_items(queue, 1, wait_ms, key)
        return items[0].value if items else None

    async def commit(self, idempotency_key: str | None = None) -> CommitInfo:
        """Commit; retried until definite (see module). Raises TransactionAborted and its
        subclasses when definitely not committed, CommitOutcomeUnknown when it cannot know."""
        body = {} if idempotency_key is None else {"idempotency_key": idempotency_key}
        try:
            info = await self._client._commit(self._path("commit"), body, [self.transaction_id], many=False)
        except TransactionAborted:
            self.state = "aborted"
            raise
        except CommitOutcomeUnknown:
            self.state = "unknown"
            raise
        self.state, self.commit_info = "committed", info
        return info

    async def abort(self) -> int:
        """Abort: dequeued items return to the head of their queues. Returns how many did.
        An already aborted (or expired) transaction is not an error; a committed one is."""
        try:
            body = await self._client._verb({"op": "abort", "transaction_id": self.transaction_id},
                                            "POST", self._path("abort"), None, _SAFE)
        except TransactionAborted:
            self.state = "aborted"
            return 0
        self.state = "aborted"
        return int(body.get("returned", 0))

    async def extend(self, timeout: float) -> dict[str, Any]:
        """Move the deadline to ``timeout`` seconds from now."""
        return dict(await self._client._call("POST", self._path("extend"), {"timeout_s": timeout}, policy=_SAFE))

    async def status(self) -> dict[str, Any]:
        return await self._client.transaction_status(self.transaction_id)

    async def _abort_quietly(self) -> None:
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
            await self._abort_quietly()
        else:  # cancelled: do not hold the cancellation up; abort in the background
            self._client._spawn(self._abort_quietly())


class _TransactionContext:
    def __init__(self, client: RcqClient, timeout: float | None, label: str | None) -> None:
        self._client, self._timeout, self._label = client, timeout, label
        self._transaction: Transaction | None = None

    async def __aenter__(self) -> Transaction:
        self._transaction = await self._client.begin(self._timeout, self._label)
        return self._transaction

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        traceback: TracebackType | None) -> None:
        assert self._transaction is not None
        await self._transaction.__aexit__(exc_type, exc, traceback)


# --------------------------------------------------------------------------- client
class RcqClient:
    """An rcq cluster seen from one program. One instance per event loop; close it (or use
    ``async with``). ``urls``: any nodes of the cluster; the leader is found from them."""

    def __init__(self, urls: str | Sequence[str], *, request_timeout_s: float = 30.0,
                 retry_timeout_s: float = 15.0, coalesce: bool = False,
                 session: aiohttp.ClientSession | None = None) -> None:
        listed = [urls] if isinstance(urls, str) else list(urls)
        self._urls = list(dict.fromkeys(_normalize_url(u) for part in listed for u in part.split(",") if u.strip()))
        if not self._urls:
            raise InvalidRequest("no URL given: pass at least one http://host:port")
        if request_timeout_s <= 0 or retry_timeout_s < 0:
            raise InvalidRequest("request_timeout_s must be positive and retry_timeout_s not negative")
        self._request_timeout_s = request_timeout_s
        self._retry_timeout_s = retry_timeout_s
        self._session = session
        self._owns_session = session is None
        self._leader: str | None = None
        self._next_url = 0
        self._coalescer = Coalescer(self._send_batch, self._spawn, retry_timeout_s) if coalesce else None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closed = False

    # ----------------------------------------------------------- lifecycle
    @property
    def urls(self) -> list[str]:
        return list(self._urls)

    @property
    def leader_url(self) -> str | None:
        """The leader's URL as last learnt (None: unknown)."""
        return self._leader

    async def __aenter__(self) -> RcqClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        self._closed = True
        if self._coalescer is not None:
            self._coalescer.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._owns_session and self._session is not None:
            await self._session.close()
        self._session = None

    def _http(self) -> aiohttp.ClientSession:
        if self._closed:
            raise Unavailable("the client is closed")
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=CONNECTIONS_MAX, limit_per_host=0, keepalive_timeout=30)
            self._session = aiohttp.ClientSession(connector=connector)
        return self._session

    def _spawn(self, coroutine: Any) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("rcq client background task failed", exc_info=task.exception())

    async def _send_batch(self, bodies: list[dict[str, Any]], deadline: float, attempts: Attempts) -> Any:
        return await self._call("POST", "/v1/batch", {"requests": bodies}, policy=_WRITE,
                                deadline=deadline, attempts=attempts)

    async def _verb(self, op: dict[str, Any], method: str, path: str, body: dict[str, Any] | None,
                    policy: _Policy, size_bytes: int = 64) -> Any:
        """One request: shares a POST /v1/batch with concurrent ones when coalescing, else REST."""
        if self._coalescer is not None:
            return await self._coalescer.submit({**op, **(body or {})}, size_bytes)
        return await self._call(method, path, body, policy=policy)

    # -------------------------------------------------------- transactions
    def transaction(self, timeout: float | None = None, label: str | None = None) -> _TransactionContext:
        """``async with client.transaction() as tx``: begins; commits on a clean exit; aborts on an
        exception (an abort failure is logged, never raised over the original exception)."""
        return _TransactionContext(self, timeout, label)

    async def begin(self, timeout: float | None = None, label: str | None = None) -> Transaction:
        """Open a transaction whose deadline is ``timeout`` seconds away (node default if None)."""
        body: dict[str, Any] = {}
        if timeout is not None:
            body["timeout_s"] = timeout
        if label is not None:
            body["label"] = label
        answer = await self._verb({"op": "begin"}, "POST", "/v1/transactions", body, policy=_SAFE)
        return Transaction(self, answer["transaction_id"], label=answer.get("label"))

    def attach(self, transaction_id: str, label: str | None = None) -> Transaction:
        """A handle on a transaction begun elsewhere (to commit, abort or ask about it)."""
        return Transaction(self, transaction_id, label=label)

    async def commit_many(self, transactions_or_ids: Iterable[Transaction | str],
                          idempotency_key: str | None = None) -> CommitInfo:
        """Commit several open transactions atomically, as one unit."""
        handles = list(transactions_or_ids)
        ids = [h.transaction_id if isinstance(h, Transaction) else str(h) for h in handles]
        body: dict[str, Any] = {"transaction_ids": ids}
        if idempotency_key is not None:
            body["idempotency_key"] = idempotency_key
        try:
            info = await self._commit("/v1/commit", body, ids, many=True)
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

    async def _commit(self, path: str, body: dict[str, Any], ids: list[str], *, many: bool) -> CommitInfo:
        attempts = Attempts()
        try:
            if self._coalescer is not None and not many:
                answer = await self._coalescer.submit({"op": "commit", "transaction_id": ids[0], **body}, 64)
            else:
                answer = await self._call("POST", path, body, policy=_COMMIT, attempts=attempts)
        except TransactionCommitted as exc:
            # /v1/commit answers a retry with 409 transaction_committed instead of "duplicate"
            if many and attempts.ambiguous:
                return CommitInfo(int(exc.details.get("index", 0)), True, 0, 0, tuple(ids))
            raise
        return _commit_info(answer)

    async def transactions(self, label_prefix: str | None = None) -> list[dict[str, Any]]:
        """The leader's open transactions, optionally only those whose label starts with a prefix."""
        params = {"label_prefix": label_prefix} if label_prefix is not None else None
        answer = await self._call("GET", "/v1/transactions", params=params, policy=_SAFE)
        return list(answer["transactions"])

    async def transaction_status(self, transaction_id: str) -> dict[str, Any]:
        """``state``: open, committing, unknown, committed or aborted (with ``reason``)."""
        return dict(await self._call("GET", f"/v1/transactions/{quote(transaction_id, safe='')}", policy=_SAFE))

    # ------------------------------------------------- one-request transactions
    async def enqueue(self, queue: str, *items: ItemValue, idempotency_key: str | None = None) -> CommitInfo:
        """Enqueue and commit in one request. Exactly once under retries (idempotency key)."""
        check_queue_name(queue)
        texts, encoding = encode_items(items)
        key = idempotency_key if idempotency_key is not None else secrets.token_hex(16)
        if self._coalescer is not None:
            body = {"op": "execute", "idempotency_key": key,
                    "operations": [{"op": "enqueue", "queue": queue, "items": texts, "encoding": encoding}]}
            answer = await self._coalescer.submit(body, sum(map(len, texts)) + 64)
        else:
            answer = await self._call("POST", _queue_path(queue, "enqueue"),
                                      {"items": texts, "encoding": encoding, "idempotency_key": key}, policy=_WRITE)
        return _commit_info(answer)

    async def dequeue(self, queue: str, max_items: int = 1, wait_ms: int = 0) -> list[bytes]:
        """Dequeue and commit in one request: **at most once**. A failed attempt is re-sent; if the
        lost attempt had committed, the items it took are lost. Use a transaction for at least once."""
        check_queue_name(queue)
        if self._coalescer is not None and wait_ms == 0:
            body = {"op": "execute", "operations": [{"op": "dequeue", "queue": queue, "max_items": max_items}]}
            answer = await self._coalescer.submit(body, 64)
        else:
            answer = await self._call("POST", _queue_path(queue, "dequeue"),
                                      {"max_items": max_items, "wait_ms": wait_ms}, policy=_WRITE,
                                      timeout_s=self._request_timeout_s + wait_ms / 1000)
        return [item.value for result in _execute_result(answer).results for item in result.items]

    async def execute(self, operations: Iterable[Enqueue | Dequeue | Mapping[str, Any]],
                      idempotency_key: str | None = None) -> ExecuteResult:
        """Run the operations in one transaction and commit it, in one request. Enqueues are
        exactly once under retries (an idempotency key is generated if None); dequeues are at
        most once, and a ``duplicate`` answer carries no items."""
        ops = [_operation_body(op) for op in operations]
        body = {"operations": ops,
                "idempotency_key": idempotency_key if idempotency_key is not None else secrets.token_hex(16)}
        wait_ms = sum(int(op.get("wait_ms") or 0) for op in ops)
        if self._coalescer is not None and wait_ms == 0:  # a waiting part would hold the whole batch up
            size = sum(len(t) for op in ops for t in op.get("items") or ()) + 64 * len(ops)
            answer = await self._coalescer.submit({"op": "execute", **body}, size)
        else:
            answer = await self._call("POST", "/v1/execute", body, policy=_WRITE,
                                      timeout_s=self._request_timeout_s + wait_ms / 1000)
        return _execute_result(answer)

    # ------------------------------------------------------------- queues
    async def peek(self, queue: str) -> bytes | None:
        """The head item without consuming it (begin, dequeue, abort). While the peek runs the
        item is invisible to other dequeuers; if the abort is lost it stays so for PEEK_TIMEOUT_S."""
        transaction = await self.begin(PEEK_TIMEOUT_S, "rcq.peek")
        try:
            return await transaction.dequeue(queue)
        finally:
            await transaction._abort_quietly()

    async def queue_info(self, queue: str) -> dict[str, Any]:
        """``count`` (replicated, includes locked items), ``locked`` and ``available`` (leader only)."""
        return dict(await self._call("GET", _queue_path(queue), policy=_SAFE))

    async def count(self, queue: str) -> int:
        return int((await self.queue_info(queue))["count"])

    async def stats(self, queue: str) -> dict[str, Any]:
        return dict(await self._call("GET", _queue_path(queue, "stats"), policy=_SAFE))

    async def queues(self) -> list[dict[str, Any]]:
        """Every queue with its ``count`` and ``locked`` items."""
        return list((await self._call("GET", "/v1/queues", policy=_SAFE))["queues"])

    # ------------------------------------------------------------ cluster
    async def cluster(self, url: str | None = None) -> dict[str, Any]:
        """A node's view of the cluster: the leader's (or any node's) if ``url`` is None, else
        exactly that node's, asked once (raises Unavailable if it does not answer)."""
        if url is None:
            return dict(await self._call("GET", "/v1/cluster", policy=_SAFE))
        try:
            answer = await self._send(_normalize_url(url), "GET", "/v1/cluster", None, None, None)
        except _TransportError as exc:
            raise exc.error from exc
        if answer.status != 200 or not isinstance(answer.payload, dict):
            raise error_from_body(answer.status, answer.payload)
        return answer.payload

    async def wait_for_leader(self, timeout_s: float = 30.0) -> str:
        """Poll every known node until one is a serving leader; remember and return its URL."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        pause_s = 0.02
        while True:
            urls = list(self._urls)
            views = await asyncio.gather(*(self._probe(u, deadline) for u in urls))
            for url, view in zip(urls, views, strict=True):
                if view is None:
                    continue
                if view.get("role") == "leader" and view.get("serving"):
                    self._leader = url
                    return url
                if view.get("leader_url"):
                    self._learn(view["leader_url"])
            remaining_s = deadline - loop.time()
            if remaining_s <= 0:
                raise NoLeader(f"no serving leader among {', '.join(self._urls)} within {timeout_s} s")
            await asyncio.sleep(min(pause_s, remaining_s))
            pause_s = min(pause_s * 2, 0.5)

    async def _probe(self, url: str, deadline: float) -> dict[str, Any] | None:
        timeout_s = max(0.05, min(self._request_timeout_s, 2.0, deadline - asyncio.get_running_loop().time()))
        try:
            answer = await self._send(url, "GET", "/v1/cluster", None, None, timeout_s)
        except _TransportError:
            return None
        return answer.payload if answer.status == 200 and isinstance(answer.payload, dict) else None

    # ------------------------------------------------------- request machinery
    def _target(self) -> str:
        return self._leader or self._urls[self._next_url % len(self._urls)]

    def _learn(self, url: str) -> str | None:
        try:
            url = _normalize_url(url)
        except InvalidRequest:
            return None
        if url not in self._urls:
            self._urls.append(url)
        return url

    def _demote(self, url: str) -> None:
        """``url`` failed: forget it as the leader and move the rotation past it."""
        if self._leader == url:
            self._leader = None
        if url in self._urls:
            self._next_url = self._urls.index(url) + 1

    async def _send(self, base: str, method: str, path: str, data: bytes | None,
                    params: Mapping[str, str] | None, timeout_s: float | None) -> _Answer:
        """One HTTP exchange; transport failures become _TransportError (the one translation)."""
        timeout = aiohttp.ClientTimeout(total=timeout_s or self._request_timeout_s)
        headers = {"Content-Type": "application/json"} if data is not None else None
        # aiohttp warns (ResourceWarning) about raw bodies over 1 MiB; a stream of one buffer is the same
        body: bytes | io.BytesIO | None = io.BytesIO(data) if data is not None and len(data) >= 1 << 20 else data
        try:
            url = yarl.URL(base + path, encoded=True)  # paths are built pre-encoded (see _queue_path)
            async with self._http().request(method, url, data=body, params=params, headers=headers,
                                            allow_redirects=False, timeout=timeout) as response:
                raw = await response.read()
                status, headers_in = response.status, response.headers
        except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as exc:
            raise _TransportError(Unavailable(f"cannot connect to {base}: {exc}"), maybe_sent=False) from exc
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise _TransportError(Unavailable(f"no answer from {base} to {method} {path}: {exc!r}"),
                                  maybe_sent=True) from exc
        try:
            payload = json.loads(raw) if raw else None
        except ValueError:
            payload = None
        return _Answer(status, payload, _retry_after_s(headers_in.get("Retry-After")), headers_in.get("Location"))

    async def _call(self, method: str, path: str, body: Any = None, *, policy: _Policy,
                    params: Mapping[str, str] | None = None, timeout_s: float | None = None,
                    deadline: float | None = None, attempts: Attempts | None = None) -> Any:
        """Send to the leader, following 307s and retrying as ``policy`` allows until the deadline."""
        loop = asyncio.get_running_loop()
        deadline = deadline if deadline is not None else loop.time() + self._retry_timeout_s
        attempts = attempts if attempts is not None else Attempts()
        data = None if body is None else _dumps(body)
        delay_s, failures, redirects, sent = BACKOFF_FIRST_S, 0, 0, 0
        while True:
            base = self._target()
            retry_after_s: float | None = None
            sent += 1
            try:
                answer = await self._send(base, method, path, data, params, timeout_s)
            except _TransportError as exc:
                error, ambiguous, rotate = exc.error, exc.maybe_sent, True
            else:
                if 200 <= answer.status < 300 and isinstance(answer.payload, dict):
                    if method != "GET":  # only the serving leader executes a POST; any node answers a GET
                        self._leader = base
                    return answer.payload
                error = error_from_body(answer.status, answer.payload)
                if isinstance(error, NotLeader):
                    leader = self._learn(error.leader_url or _origin(answer.location))
                    redirects += 1
                    if leader is not None and leader != base and redirects <= len(self._urls) + 1:
                        self._leader = leader  # not executed: re-send there at once
                        continue
                    self._leader = None
                has_body = isinstance(answer.payload, dict) and isinstance(answer.payload.get("error"), dict)
                ambiguous = ((answer.status in (502, 503, 504) and not has_body)
                             or isinstance(error, CommitOutcomeUnknown)
                             or (attempts.ambiguous and isinstance(error, policy.unknown_after_ambiguous)))
                if not ambiguous and not (error.retryable and has_body):
                    raise error
                rotate = isinstance(error, Unavailable | NotLeader) or not has_body
                retry_after_s = answer.retry_after_s
            if ambiguous:
                if not policy.retry_ambiguous:
                    raise Unavailable(f"{error.message}; the request may or may not have been applied") from error
                attempts.ambiguous = True
            failures += 1
            if rotate:
                self._demote(base)
            pause_s = 0.0 if rotate and failures < len(self._urls) else delay_s * random.uniform(0.5, 1.0)
            if loop.time() + pause_s >= deadline:
                if attempts.ambiguous and policy.maybe_committed:
                    raise CommitOutcomeUnknown(
                        f"gave up after {sent} attempts, one with an unknown outcome: {error.message}") from error
                raise error
            if pause_s:
                await asyncio.sleep(pause_s)
                ceiling_s = retry_after_s if retry_after_s is not None else BACKOFF_MAX_S
                delay_s = min(delay_s * 2, ceiling_s)
                failures, redirects = 0 if rotate else failures, 0


def _origin(location: str | None) -> str:
    if not location:
        return ""
    parts = urlsplit(location)
    return f"{parts.scheme}://{parts.netloc}" if parts.scheme and parts.netloc else ""
