"""The client's wire types and their JSON form: what goes into a request body and comes out of an answer.

* the result types (:class:`Item`, :class:`CommitInfo`, :class:`OperationResult`,
  :class:`ExecuteResult`) and the operations of :meth:`RcqClient.execute`
  (:class:`Enqueue`, :class:`Dequeue`);
* body builders and answer decoders, and the URL paths of queues and transactions.

**Item encodings.** Items are bytes; ``str`` items are sent as their UTF-8
bytes. A request's items travel as ``utf-8`` text when every one is valid
UTF-8, else as ``base64``: the check costs about 0.2 us per KiB while base64
costs about 1.5 us per KiB to encode, makes the JSON a third bigger and the
server decode it. Answers are decoded by each item's own ``encoding``. The
encoding itself is :mod:`rcq.encoding` (shared with the server and the CLI) and
queue names are checked by :mod:`rcq.names`: neither rule is repeated here.

Must not import: aiohttp, the other client modules (this is the bottom layer: no I/O,
no retries), rcq.server, pysyncobj, lmdb.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from rcq import encoding
from rcq.errors import InternalError, InvalidRequest
from rcq.names import check_queue_name

ItemValue = bytes | bytearray | memoryview | str
# What one sub-request adds to a batch besides its items' text, in the coalescer's size estimate.
OPERATION_OVERHEAD_BYTES = 64


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


# -------------------------------------------------------------------------- items
def item_bytes(value: ItemValue) -> bytes:
    """An item as bytes: ``str`` becomes its UTF-8; refused before sending if it has none."""
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
    return encoding.encode_items([item_bytes(item) for item in items])


def item_from_wire(entry: Mapping[str, Any]) -> Item:
    text = entry["value"]
    try:
        value = encoding.decode_item(text, "base64" if entry.get("encoding") == "base64" else "utf-8")
    except ValueError as exc:  # the server broke the protocol: nothing the caller did
        raise InternalError(f"the server sent an item that is {exc}: {text[:32]!r}") from exc
    return Item(int(entry["item_id"]), str(entry["queue"]), value)


# ------------------------------------------------------------------ request bodies
def dumps(body: Any) -> bytes:
    # ensure_ascii=False: UTF-8 items travel as themselves, not as \\u escapes six times their size
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def begin_body(timeout_s: float | None, label: str | None) -> dict[str, Any]:
    body: dict[str, Any] = {}
    if timeout_s is not None:
        body["timeout_s"] = timeout_s
    if label is not None:
        body["label"] = label
    return body


def enqueue_body(queue: str, items: Iterable[ItemValue]) -> dict[str, Any]:
    """``queue`` (checked before any request leaves), ``items`` and their ``encoding``."""
    check_queue_name(queue)
    texts, item_encoding = encode_items(items)
    return {"queue": queue, "items": texts, "encoding": item_encoding}


def operation_body(operation: Enqueue | Dequeue | Mapping[str, Any]) -> dict[str, Any]:
    """One operation of ``/v1/execute``; a dict is passed on, its queue checked and its items encoded."""
    if isinstance(operation, Enqueue):
        return {"op": "enqueue", **enqueue_body(operation.queue, operation.items)}
    if isinstance(operation, Dequeue):
        return {"op": "dequeue", "queue": check_queue_name(operation.queue), "max_items": operation.max_items,
                "wait_ms": operation.wait_ms}
    if not isinstance(operation, Mapping):
        raise InvalidRequest(f"an operation is Enqueue, Dequeue or a dict, not {type(operation).__name__}")
    body = dict(operation)
    queue: Any = body.get("queue")  # anything at all: check_queue_name refuses what is not a name
    check_queue_name(queue)
    if body.get("op") == "enqueue" and "encoding" not in body:
        body["items"], body["encoding"] = encode_items(body.get("items") or ())
    return body


def operations_wait_ms(operations: Iterable[Mapping[str, Any]]) -> int:
    return sum(int(operation.get("wait_ms") or 0) for operation in operations)


def estimated_item_bytes(body: Mapping[str, Any]) -> int:
    """A sub-request's size for the coalescer's bound on a batch: its items' text plus a fixed overhead."""
    operations = body.get("operations")
    if isinstance(operations, list):
        return sum(estimated_item_bytes(operation) for operation in operations)
    return sum(len(text) for text in body.get("items") or ()) + OPERATION_OVERHEAD_BYTES


# ------------------------------------------------------------------------- paths
def queue_path(queue: str, verb: str = "") -> str:
    """The URL path of a queue (names are checked first: no name needs escaping)."""
    segment = check_queue_name(queue)
    return f"/v1/queues/{segment}" + (f"/{verb}" if verb else "")


def transaction_path(transaction_id: str, verb: str = "") -> str:
    """The URL path of a transaction, its id escaped (an attached id comes from anywhere)."""
    return f"/v1/transactions/{quote(transaction_id, safe='')}" + (f"/{verb}" if verb else "")


# ------------------------------------------------------------------------ answers
def commit_info(body: Mapping[str, Any]) -> CommitInfo:
    return CommitInfo(index=int(body.get("index") or 0), duplicate=bool(body.get("duplicate")),
                      enqueued=int(body.get("enqueued") or 0), dequeued=int(body.get("dequeued") or 0),
                      transaction_ids=tuple(body.get("transaction_ids") or ()))


def execute_result(body: Mapping[str, Any]) -> ExecuteResult:
    duplicate = bool(body.get("duplicate"))
    results = []
    for result in body.get("results") or ():
        if result.get("op") == "enqueue":
            results.append(OperationResult("enqueue", result["queue"], enqueued=int(result["enqueued"])))
        else:  # a duplicate's dequeues were not committed: the server gave those items back
            items = () if duplicate else tuple(item_from_wire(entry) for entry in result.get("items") or ())
            results.append(OperationResult("dequeue", result["queue"], items=items))
    info = commit_info(body)
    return ExecuteResult(str(body.get("transaction_id", "")), info.index, info.duplicate,
                         info.enqueued, info.dequeued, tuple(results))
