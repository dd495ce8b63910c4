"""The client's wire types and their JSON form: what goes into a request body and comes out of an answer.

Why over 400 lines: the one bottom layer that knows the JSON of every request and answer: the wire contract in one place.

* the result types (:class:`Item`, :class:`DeadLetter`, :class:`CommitInfo`,
  :class:`OperationResult`, :class:`ExecuteResult`) and the operations of
  :meth:`RcqClient.execute` (:class:`Enqueue`, :class:`Dequeue`);
* body builders and answer decoders, and the URL paths of queues, transactions and cluster members.

**Item encodings.** Items are bytes; ``str`` items are sent as their UTF-8
bytes. A request's items travel as ``utf-8`` text when every one is valid
UTF-8, else as ``base64``: the check costs about 0.2 us per KiB while base64
costs about 1.5 us per KiB to encode, makes the JSON a third bigger and the
server decode it. Answers are decoded by each item's own ``encoding``. The
encoding itself is :mod:`rcq.encoding` (shared with the server and the CLI) and
queue names are checked by :mod:`rcq.names`: neither rule is repeated here.

**Newer fields, older servers.** The per-enqueue options (``priority``, ``delay_s``,
``ttl_s``) enter a body only when given, so a server that predates them (and refuses
fields it does not know) still takes every request that does not use them; an item's
``delivery_count``, ``priority``, ``enqueued_at_ms``, ``expires_at_ms`` and ``dead_letter``
default when an answer lacks them. See docs/queue-features.md. Items with ``headers`` travel as
objects ``{"value", "headers"}``, only when headers are given: a cluster below feature level 2
refuses them (FeatureLevelRequired), every other request is as before.

Must not import: aiohttp, the other client modules (this is the bottom layer: no I/O,
no retries), rcq.server, pysyncobj, lmdb.
"""

from __future__ import annotations

import json
import math
import secrets
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field
from typing import Any
from urllib.parse import quote

import orjson

from rcq import encoding
from rcq.errors import InternalError, InvalidRequest
from rcq.limits import PRIORITY_MAX, RETRY_KEY_PREFIX
from rcq.names import check_queue_name

ItemValue = bytes | bytearray | memoryview | str
# What one sub-request adds to a batch besides its items' text, in the coalescer's size estimate.
OPERATION_OVERHEAD_BYTES = 64
MEMBERS_PATH = "/v1/cluster/members"
LEADERSHIP_PATH = "/v1/cluster/leadership"
FEATURE_LEVEL_PATH = "/v1/cluster/feature-level"
CATCH_UP_TIMEOUT_MAX_S = 600.0  # the most an add may wait for the new node to catch up (the server's bound)


# ------------------------------------------------------------------------- results
@dataclass(frozen=True, slots=True)
class DeadLetter:
    """Why an item of a dead-letter queue is there: ``reason`` (``max_deliveries``, ``expired``,
    ``rejected``), the queue it died in and its delivery count then."""

    reason: str
    source_queue: str
    delivery_count: int


@dataclass(frozen=True, slots=True)
class Item:
    """A dequeued item. ``delivery_count``: how many earlier deliveries ended without a commit;
    ``enqueued_at_ms``: when its enqueue committed (None from a server that does not say);
    ``expires_at_ms``: when it leaves (expires) unless a commit takes it first (None: never, or a
    server that does not say); ``dead_letter``: only on an item of a dead-letter queue;
    ``headers``: what its producer attached (empty when none)."""

    item_id: int
    queue: str
    value: bytes
    _: KW_ONLY
    delivery_count: int = 0
    priority: int = 0
    enqueued_at_ms: int | None = None
    dead_letter: DeadLetter | None = None
    expires_at_ms: int | None = None
    headers: dict[str, str] = field(default_factory=dict)


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
    """An operation of :meth:`RcqClient.execute`; the options apply to each of its items (None:
    not sent, the queue's default)."""

    queue: str
    items: Sequence[ItemValue]
    _: KW_ONLY
    priority: int | None = None
    delay_s: float | None = None
    ttl_s: float | None = None
    headers: Mapping[str, str] | None = None  # given to each item (None or empty: none)


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
    enqueued_at_ms, expires_at_ms = entry.get("enqueued_at_ms"), entry.get("expires_at_ms")
    return Item(int(entry["item_id"]), str(entry["queue"]), value,
                delivery_count=int(entry.get("delivery_count") or 0), priority=int(entry.get("priority") or 0),
                enqueued_at_ms=None if enqueued_at_ms is None else int(enqueued_at_ms),
                dead_letter=dead_letter_from_wire(entry.get("dead_letter")),
                expires_at_ms=None if expires_at_ms is None else int(expires_at_ms),
                headers={str(k): str(v) for k, v in (entry.get("headers") or {}).items()})


def dead_letter_from_wire(entry: Mapping[str, Any] | None) -> DeadLetter | None:
    if entry is None:
        return None
    return DeadLetter(str(entry["reason"]), str(entry["source_queue"]), int(entry["delivery_count"]))


# ------------------------------------------------------------------ request bodies
# ensure_ascii=False: UTF-8 items travel as themselves, not as \\u escapes six times their size. One
# encoder for every request: json.dumps with options builds a new one per call.
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)
# orjson writes a single-item enqueue in 0.3 us where json takes 3.9 (answers are parsed by
# rcq.json_text, as the server's end of the session channel parses frames). Its output is json's, compact
# and UTF-8, for what requests are made of (str keys; str, int, float, bool, None, lists, dicts; a
# float may be spelt differently, 1e-7 for 1e-07, the same number). json writes the rest: what orjson
# refuses (integers beyond 64 bits, lone surrogates, keys that are not str, and, passed through,
# subclasses, dataclasses and dates, which json refuses too), and every body with a null in it,
# since orjson writes NaN and the infinities as null where json writes NaN and Infinity. (orjson
# also writes enum members and UUIDs, which json refuses; no request the client builds holds one.)
_ORJSON_OPTIONS = orjson.OPT_PASSTHROUGH_SUBCLASS | orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_DATETIME


def dumps(body: Any) -> bytes:
    """A request body as compact UTF-8 JSON (see above for which encoder writes it)."""
    try:
        encoded = orjson.dumps(body, option=_ORJSON_OPTIONS)
    except TypeError:  # orjson.JSONEncodeError: json's to write, or to refuse as it always did
        return _ENCODER.encode(body).encode("utf-8")
    return encoded if b"null" not in encoded else _ENCODER.encode(body).encode("utf-8")



def receive_body(queue: str, max_items: int, wait_ms: int, timeout_s: float | None,
                 label: str | None) -> dict[str, Any]:
    """The body of ``POST /v1/queues/{queue}/receive`` (and of a commit's ``receive``, with the queue)."""
    return {"max_items": max_items, "wait_ms": wait_ms, **begin_body(timeout_s, label)}


def begin_body(timeout_s: float | None, label: str | None) -> dict[str, Any]:
    body: dict[str, Any] = {}
    if timeout_s is not None:
        body["timeout_s"] = timeout_s
    if label is not None:
        body["label"] = label
    return body


def enqueue_body(queue: str, items: Iterable[ItemValue], *, priority: int | None = None,
                 delay_s: float | None = None, ttl_s: float | None = None,
                 headers: Mapping[str, str] | None = None) -> dict[str, Any]:
    """``queue`` (checked before any request leaves), ``items``, their ``encoding`` and the options
    given; with ``headers``, each item is an object carrying them."""
    check_queue_name(queue)
    texts, item_encoding = encode_items(items)
    wire_items: list[Any] = texts
    if headers:
        checked = check_headers(headers)
        wire_items = [{"value": text, "headers": checked} for text in texts]
    body = {"queue": queue, "items": wire_items, "encoding": item_encoding}
    if priority is not None or delay_s is not None or ttl_s is not None:
        body.update(enqueue_options(priority, delay_s, ttl_s))
    return body


def enqueue_items_body(queue: str, items: Iterable[tuple[ItemValue, Mapping[str, str] | None]],
                       added: Mapping[str, str] | None = None, *, priority: int | None = None,
                       delay_s: float | None = None, ttl_s: float | None = None) -> dict[str, Any]:
    """:func:`enqueue_body` where each item has headers of its own (None or empty: none), plus
    ``added`` ones (a trace context) under each item's own, which win on a clash."""
    check_queue_name(queue)
    pairs = list(items)
    texts, item_encoding = encode_items(value for value, _ in pairs)
    wire_items: list[Any] = []
    for text, (_, own) in zip(texts, pairs, strict=True):
        merged = {**(added or {}), **(own or {})}
        wire_items.append({"value": text, "headers": check_headers(merged)} if merged else text)
    return {"queue": queue, "items": wire_items, "encoding": item_encoding,
            **enqueue_options(priority, delay_s, ttl_s)}


def check_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """Headers as they travel: string keys (non-empty, printable) to string values. Their sizes are
    the server's to bound (docs/limits.md)."""
    if not isinstance(headers, Mapping):
        raise InvalidRequest(f"headers are a mapping of str to str, not {type(headers).__name__}")
    for key, value in headers.items():
        if not isinstance(key, str) or not key or not key.isprintable():
            raise InvalidRequest(f"a header key is a non-empty printable str, not {key!r}")
        if not isinstance(value, str):
            raise InvalidRequest(f"header {key!r}'s value is a str, not {type(value).__name__}")
    return dict(headers)


def enqueue_options(priority: int | None, delay_s: float | None, ttl_s: float | None) -> dict[str, Any]:
    """The options that were given (None: left out, for servers that predate them), each checked against
    the wire's range before sending: one bad part would spoil a whole coalesced batch. The queue's own
    bounds (``max_priority``, the longest delay and TTL) are the server's to check."""
    options: dict[str, Any] = {}
    if priority is not None:
        if not _is_int(priority) or not 0 <= priority <= PRIORITY_MAX:
            raise InvalidRequest(f"priority must be an integer from 0 to {PRIORITY_MAX}, not {priority!r}")
        options["priority"] = priority
    if delay_s is not None:
        if not _is_number(delay_s) or delay_s < 0:
            raise InvalidRequest(f"delay_s must be a finite number of seconds >= 0, not {delay_s!r}")
        options["delay_s"] = delay_s
    if ttl_s is not None:
        if not _is_number(ttl_s) or ttl_s <= 0:
            raise InvalidRequest(f"ttl_s must be a finite number of seconds > 0, not {ttl_s!r}")
        options["ttl_s"] = ttl_s
    return options


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)  # True would travel as true, not 1


def _is_number(value: object) -> bool:
    """An int or a finite float (NaN and infinity have no JSON form)."""
    return _is_int(value) or (isinstance(value, float) and math.isfinite(value))


def operation_body(operation: Enqueue | Dequeue | Mapping[str, Any]) -> dict[str, Any]:
    """One operation of ``/v1/execute``; a dict is passed on, its queue checked and its items encoded."""
    if isinstance(operation, Enqueue):
        return {"op": "enqueue", **enqueue_body(operation.queue, operation.items, priority=operation.priority,
                                                delay_s=operation.delay_s, ttl_s=operation.ttl_s,
                                                headers=operation.headers)}
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
    return sum(_item_text_bytes(item) for item in body.get("items") or ()) + OPERATION_OVERHEAD_BYTES


def _item_text_bytes(item: Any) -> int:
    if isinstance(item, Mapping):  # an item with headers
        headers = item.get("headers") or {}
        return len(item.get("value") or "") + sum(len(k) + len(v) + 8 for k, v in headers.items())
    return len(item)


# ------------------------------------------------------------------------- paths
def queue_path(queue: str, verb: str = "") -> str:
    """The URL path of a queue (names are checked first: no name needs escaping)."""
    segment = check_queue_name(queue)
    return f"/v1/queues/{segment}" + (f"/{verb}" if verb else "")


def transaction_path(transaction_id: str, verb: str = "") -> str:
    """The URL path of a transaction, its id escaped (an attached id comes from anywhere)."""
    return f"/v1/transactions/{quote(transaction_id, safe='')}" + (f"/{verb}" if verb else "")


def member_path(node_id: str) -> str:
    """The URL path of a cluster member, its node id escaped."""
    return f"{MEMBERS_PATH}/{quote(check_node_id(node_id), safe='')}"


# --------------------------------------------------------------------- membership
def check_node_id(node_id: object) -> str:
    """A node id, refused before sending if it is not a non-empty string (the server checks its characters)."""
    if not isinstance(node_id, str) or not node_id:
        raise InvalidRequest(f"a node id is a non-empty string, not {node_id!r}")
    return node_id


def add_member_body(node_id: str, raft_address: str, url: str, catch_up_timeout_s: float) -> dict[str, Any]:
    """The body of ``POST /v1/cluster/members``, each field checked before sending."""
    host, colon, port = raft_address.rpartition(":") if isinstance(raft_address, str) else ("", "", "")
    if not (host and colon and port.isdigit() and 0 < int(port) < 65536):
        raise InvalidRequest(f"raft_address must be host:port, not {raft_address!r}")
    if not isinstance(url, str) or not url.startswith(("http://", "https://")) or len(url) <= len("https://"):
        raise InvalidRequest(f"url must be the node's http://host:port (or https://), not {url!r}")
    if not _is_number(catch_up_timeout_s) or not 0 <= catch_up_timeout_s <= CATCH_UP_TIMEOUT_MAX_S:
        raise InvalidRequest(f"catch_up_timeout_s must be a number of seconds from 0 to {CATCH_UP_TIMEOUT_MAX_S:g}, "
                             f"not {catch_up_timeout_s!r}")
    return {"node_id": check_node_id(node_id), "raft_address": raft_address, "url": url,
            "catch_up_timeout_s": catch_up_timeout_s}


def leadership_body(node_id: str | None) -> dict[str, Any]:
    """The body of ``POST /v1/cluster/leadership``: ``node_id`` null lets the leader choose."""
    return {"node_id": None if node_id is None else check_node_id(node_id)}


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


def retry_key() -> str:
    """A new key for a one-request transaction whose caller gave none: only the client's own
    retries use it, so a cluster at feature level 3 keeps it 10 minutes, not a day
    (``RETRY_KEY_PREFIX``, docs/limits.md); 128 random bits."""
    return RETRY_KEY_PREFIX + secrets.token_hex(16)
