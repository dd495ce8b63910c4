"""Wire models of the HTTP API v1 (pydantic).

Requests are validated here; responses are plain dicts built by the API
handlers (see docs/http-api.md for their shapes). Items are bytes inside rcq; on the
wire each item is a string with an encoding: ``utf-8`` (the default, for text)
or ``base64`` (for arbitrary bytes). Dequeued items come back as UTF-8 when
they decode as such and the caller did not ask for base64; otherwise as
base64, and each item says which.

Why over 400 lines: every request body of the API, one short model each, so that the OpenAPI
description is generated from one place.

Must not import: pysyncobj, lmdb.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from rcq.encoding import Encoding, decode_item
from rcq.errors import InvalidRequest, PayloadTooLarge
from rcq.limits import (
    DELAY_MAX_S,
    HEADER_KEY_BYTES_MAX,
    HEADER_VALUE_BYTES_MAX,
    HEADERS_BYTES_MAX,
    HEADERS_PER_ITEM_MAX,
    MAX_DELIVERIES_MAX,
    PRIORITY_MAX,
    TTL_MAX_S,
)
from rcq.names import DOT_SEGMENTS, PARTITION_KEY_CHARS_MAX, QUEUE_NAME_PATTERN, TRANSACTION_ID_PATTERN
from rcq.server.config import HOST_PORT_PATTERN, NODE_ID_PATTERN
from rcq.server.core.commands import EnqueueOptions, Headers, QueueSettings

LABEL_MAX_CHARS = 256
KEY_MAX_CHARS = 256
ITEMS_PER_REQUEST_MAX = 100_000

def _queue_name_is_not_a_dot_segment(name: str) -> str:
    if name in DOT_SEGMENTS:
        raise ValueError("'.' and '..' are not queue names")
    return name


QueueName = Annotated[str, Field(pattern=QUEUE_NAME_PATTERN), AfterValidator(_queue_name_is_not_a_dot_segment)]
OptionalKey = Annotated[str | None, Field(default=None, min_length=1, max_length=KEY_MAX_CHARS)]


NOTE_MAX_CHARS = 256
Priority = Annotated[int | None, Field(None, ge=0, le=PRIORITY_MAX,
                                       description="0..the queue's max_priority; higher is dequeued first")]
DelayS = Annotated[float | None, Field(None, ge=0, le=DELAY_MAX_S,
                                       description="invisible this long after the commit (default: the queue's)")]
TtlS = Annotated[float | None, Field(None, gt=0, le=TTL_MAX_S,
                                     description="leaves this long after the commit unless consumed (default: the queue's)")]


def enqueue_options(priority: int | None, delay_s: float | None, ttl_s: float | None) -> EnqueueOptions | None:
    """The state machine's options for an enqueue request (None: a plain enqueue)."""
    if priority is None and delay_s is None and ttl_s is None:
        return None
    return EnqueueOptions(priority=priority or 0, delay_ms=None if delay_s is None else round(delay_s * 1000),
                          ttl_ms=None if ttl_s is None else max(1, round(ttl_s * 1000)))


def _printable_header_key(key: str) -> str:
    if not key.isprintable():
        raise ValueError("a header key must be printable (no control characters or line breaks)")
    return key


HeaderKey = Annotated[str, Field(min_length=1), AfterValidator(_printable_header_key)]



class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ItemIn(_Model):
    """An item given as an object: its value (in the request's ``encoding``) and its headers."""

    value: str
    headers: dict[HeaderKey, str] | None = Field(
        None, description=f"string keys (non-empty, printable) to string values, kept with the item and returned "
                          f"with it; at most {HEADERS_PER_ITEM_MAX} headers, keys of at most "
                          f"{HEADER_KEY_BYTES_MAX} and values of at most {HEADER_VALUE_BYTES_MAX} UTF-8 bytes, "
                          f"{HEADERS_BYTES_MAX} in all (413 past them); needs feature level 2")


# An item on the wire: its value as a string, or an object with its value and headers.
ItemInput = str | ItemIn


def decode_items(items: list[ItemInput], encoding: Encoding, item_bytes_max: int) -> list[bytes]:
    """Wire items -> item bytes; every item is checked before anything is used."""
    out: list[bytes] = []
    for position, item in enumerate(items):
        text = item if isinstance(item, str) else item.value
        try:
            value = decode_item(text, encoding)
        except ValueError as exc:
            raise InvalidRequest(f"items[{position}] is {exc}") from exc
        if len(value) > item_bytes_max:
            raise PayloadTooLarge(
                f"items[{position}] is {len(value)} bytes; the limit is {item_bytes_max}")
        out.append(value)
    return out


def items_headers(items: list[ItemInput]) -> list[Headers | None] | None:
    """Each item's headers, parallel to ``items`` (None: no item has any), checked against the
    limits (413 past one, naming it); keys and values keep the order given."""
    found: list[Headers | None] = []
    for position, item in enumerate(items):
        headers = None if isinstance(item, str) else item.headers
        if not headers:
            found.append(None)
            continue
        if len(headers) > HEADERS_PER_ITEM_MAX:
            raise PayloadTooLarge(f"items[{position}] has {len(headers)} headers; the limit is {HEADERS_PER_ITEM_MAX}",
                                  details={"item": position, "headers": len(headers),
                                           "limit": HEADERS_PER_ITEM_MAX})
        total = 0
        for key, value in headers.items():
            key_bytes, value_bytes = len(key.encode()), len(value.encode())
            if key_bytes > HEADER_KEY_BYTES_MAX:
                raise PayloadTooLarge(f"items[{position}] has a header key of {key_bytes} bytes; the limit is "
                                      f"{HEADER_KEY_BYTES_MAX}", details={"item": position, "key_bytes": key_bytes,
                                                                          "limit": HEADER_KEY_BYTES_MAX})
            if value_bytes > HEADER_VALUE_BYTES_MAX:
                raise PayloadTooLarge(f"items[{position}]'s header {key!r} is {value_bytes} bytes; the limit is "
                                      f"{HEADER_VALUE_BYTES_MAX}", details={"item": position, "header": key,
                                                                            "value_bytes": value_bytes,
                                                                            "limit": HEADER_VALUE_BYTES_MAX})
            total += key_bytes + value_bytes
        if total > HEADERS_BYTES_MAX:
            raise PayloadTooLarge(f"items[{position}]'s headers are {total} bytes; the limit is {HEADERS_BYTES_MAX}",
                                  details={"item": position, "headers_bytes": total, "limit": HEADERS_BYTES_MAX})
        found.append(tuple(headers.items()))
    return found if any(h is not None for h in found) else None


class BeginRequest(_Model):
    timeout_s: float | None = Field(None, gt=0, description="deadline from now; default from the node config")
    label: str | None = Field(None, min_length=1, max_length=LABEL_MAX_CHARS)
    partition: str | None = Field(None, pattern=r"^[a-z][a-z0-9_-]{0,31}$",
                                  description="the partition the transaction lives in (default: the process "
                                              "asked, p0 at a node's own port)")


class EnqueueRequest(_Model):
    queue: QueueName
    items: list[ItemInput] = Field(min_length=1, max_length=ITEMS_PER_REQUEST_MAX)
    encoding: Encoding = "utf-8"
    key: OptionalKey = None  # repeating an enqueue with the same key in a transaction buffers nothing more
    priority: Priority = None
    delay_s: DelayS = None
    ttl_s: TtlS = None


class DequeueRequest(_Model):
    queue: QueueName
    max_items: int = Field(1, ge=1)
    wait_ms: int = Field(0, ge=0)
    key: OptionalKey = None
    encoding: Encoding = "utf-8"


class ReceiveRequest(_Model):
    """POST /v1/queues/{queue}/receive: begin a transaction and dequeue in one request."""

    max_items: int = Field(1, ge=1)
    wait_ms: int = Field(0, ge=0, description="long poll: wait this long for the first item")
    timeout_s: float | None = Field(None, gt=0, description="the transaction's deadline from now")
    label: str | None = Field(None, min_length=1, max_length=LABEL_MAX_CHARS)
    encoding: Encoding = "utf-8"
    partition_key: str | None = Field(None, min_length=1, max_length=PARTITION_KEY_CHARS_MAX, description=(
        "a spread queue: the fragment this key's items go to and come from (the same key, the same fragment, "
        "so they keep their relative order); without one, the node chooses (docs/partitions.md)"))


class ReceiveNext(ReceiveRequest):
    """What a commit also receives: the next transaction's items (SQS's delete-and-receive)."""

    queue: QueueName
    partition_key: None = Field(None, description="not here: the next transaction is in the committed one's partition")


class CommitRequest(_Model):
    idempotency_key: OptionalKey = None
    receive: ReceiveNext | None = Field(None, description="once committed, begin the next transaction and "
                                                          "dequeue into it, in the same request")


class ExtendRequest(_Model):
    timeout_s: float = Field(gt=0)


class CommitManyRequest(_Model):
    transaction_ids: list[Annotated[str, Field(pattern=TRANSACTION_ID_PATTERN)]] = Field(
        min_length=1, max_length=10_000)
    idempotency_key: OptionalKey = None


class EnqueueOperation(_Model):
    op: Literal["enqueue"]
    queue: QueueName
    items: list[ItemInput] = Field(min_length=1, max_length=ITEMS_PER_REQUEST_MAX)
    encoding: Encoding = "utf-8"
    priority: Priority = None
    delay_s: DelayS = None
    ttl_s: TtlS = None


class DequeueOperation(_Model):
    op: Literal["dequeue"]
    queue: QueueName
    max_items: int = Field(1, ge=1)
    wait_ms: int = Field(0, ge=0)
    encoding: Encoding = "utf-8"


Operation = Annotated[EnqueueOperation | DequeueOperation, Field(discriminator="op")]


class ExecuteRequest(_Model):
    operations: list[Operation] = Field(min_length=1, max_length=10_000)
    idempotency_key: OptionalKey = None


class ExecuteBatchRequest(_Model):
    transactions: list[ExecuteRequest] = Field(min_length=1, max_length=10_000)


class QueueEnqueueRequest(_Model):
    items: list[ItemInput] = Field(min_length=1, max_length=ITEMS_PER_REQUEST_MAX)
    encoding: Encoding = "utf-8"
    idempotency_key: OptionalKey = None
    priority: Priority = None
    delay_s: DelayS = None
    ttl_s: TtlS = None
    partition_key: str | None = Field(None, min_length=1, max_length=PARTITION_KEY_CHARS_MAX, description=(
        "a spread queue: the fragment this key's items go to and come from (the same key, the same fragment, "
        "so they keep their relative order); without one, the node chooses (docs/partitions.md)"))


class QueueSettingsRequest(_Model):
    """PUT /v1/queues/{queue}: every setting of the queue (an absent one is null: the default)."""

    max_items: int | None = Field(None, ge=1, description="most items the queue may hold")
    max_bytes: int | None = Field(None, ge=1, description="most bytes it may hold, each item's bookkeeping included")
    max_deliveries: int | None = Field(None, ge=1, le=MAX_DELIVERIES_MAX,
                                       description="deliveries without a commit before an item dies")
    dead_letter_queue: QueueName | None = Field(None, description="an existing queue where dead items go")
    default_ttl_s: float | None = Field(None, gt=0, le=TTL_MAX_S, description="time to live of items without ttl_s")
    default_delay_s: float | None = Field(None, ge=0, le=DELAY_MAX_S, description="delay of items without delay_s")
    max_priority: int | None = Field(None, ge=0, le=PRIORITY_MAX, description="the highest priority an enqueue may give")
    partitions: list[Annotated[str, Field(max_length=32)]] | None = Field(
        None, min_length=1, max_length=16, description="where the queue lives, fixed when it is created (feature "
        "level 4, docs/partitions.md); absent: kept (p0 for a new queue)")

    def features(self) -> QueueSettings:
        return QueueSettings(
            max_deliveries=self.max_deliveries, dead_letter_queue=self.dead_letter_queue,
            default_ttl_ms=None if self.default_ttl_s is None else max(1, round(self.default_ttl_s * 1000)),
            default_delay_ms=None if self.default_delay_s is None else round(self.default_delay_s * 1000),
            max_priority=self.max_priority)


class RejectRequest(_Model):
    """Items this transaction dequeued go to the queue's dead-letter queue at once."""

    queue: QueueName
    item_ids: list[Annotated[int, Field(ge=1)]] = Field(min_length=1, max_length=10_000)
    reason: str | None = Field(None, min_length=1, max_length=NOTE_MAX_CHARS, description="kept with the dead item")


class RedriveRequest(_Model):
    """Dead items of this (dead-letter) queue go back to their source queues."""

    max_items: int | None = Field(None, ge=1, le=10_000)
    source_queue: QueueName | None = None


class QueueDequeueRequest(_Model):
    max_items: int = Field(1, ge=1)
    wait_ms: int = Field(0, ge=0)
    encoding: Encoding = "utf-8"
    partition_key: str | None = Field(None, min_length=1, max_length=PARTITION_KEY_CHARS_MAX, description=(
        "a spread queue: the fragment this key's items go to and come from (the same key, the same fragment, "
        "so they keep their relative order); without one, the node chooses (docs/partitions.md)"))


class ErrorDetail(BaseModel):
    """What every error answer carries (see rcq.errors)."""

    code: str
    message: str
    retryable: bool
    maybe_committed: bool
    leader_url: str | None = None
    details: dict[str, object] | None = None


class ErrorBody(BaseModel):
    error: ErrorDetail


# ------------------------------------------------------- POST /v1/batch sub-requests
TransactionId = Annotated[str, Field(min_length=1, max_length=80)]  # at most 74 (rcq.names: partition, term, random)


class BatchBegin(BeginRequest):
    op: Literal["begin"]


class BatchEnqueue(EnqueueRequest):
    op: Literal["enqueue"]
    transaction_id: TransactionId


class BatchDequeue(DequeueRequest):
    op: Literal["dequeue"]
    transaction_id: TransactionId


class BatchCommit(CommitRequest):
    op: Literal["commit"]
    transaction_id: TransactionId


class BatchAbort(_Model):
    op: Literal["abort"]
    transaction_id: TransactionId


class BatchExtend(ExtendRequest):
    op: Literal["extend"]
    transaction_id: TransactionId


class BatchReceive(ReceiveNext):
    op: Literal["receive"]


class BatchReject(RejectRequest):
    op: Literal["reject"]
    transaction_id: TransactionId


class BatchStatus(_Model):
    op: Literal["status"]
    transaction_id: TransactionId


class BatchExecute(ExecuteRequest):
    op: Literal["execute"]


class BatchCommitMany(CommitManyRequest):
    op: Literal["commit_many"]


BatchOperation = Annotated[
    BatchBegin | BatchEnqueue | BatchDequeue | BatchCommit | BatchAbort | BatchExtend | BatchStatus
    | BatchExecute | BatchCommitMany | BatchReject | BatchReceive,
    Field(discriminator="op"),
]


class BatchRequest(_Model):
    """Independent requests sharing one HTTP request: each succeeds or fails on its own."""

    requests: list[BatchOperation] = Field(min_length=1, max_length=10_000)


# ------------------------------------------------------------------ membership
NodeId = Annotated[str, Field(pattern=NODE_ID_PATTERN, description="the node's id")]


class AddMemberRequest(_Model):
    """POST /v1/cluster/members: add a running node as a voting member (docs/membership.md)."""

    node_id: NodeId
    raft_address: str = Field(pattern=HOST_PORT_PATTERN, max_length=300,
                              description="host:port of its Raft listener, as every member reaches it")
    url: str = Field(pattern=r"^https?://[^/\s]+", max_length=2000, description="the base URL it serves clients on")
    catch_up_timeout_s: float = Field(60.0, ge=0, le=600, description="how long to wait for it to catch up")


class CreatePartitionRequest(_Model):
    """POST /v1/cluster/partitions: create a partition (docs/partitions.md)."""

    name: str = Field(max_length=32, description="1 to 32 of a-z, 0-9, '_' and '-', starting with a letter; not p0")
    replicas: int | None = Field(None, ge=1, le=9, description="how many members (default min(3, nodes)), chosen "
                                                              "among the nodes with the fewest partitions")
    nodes: list[NodeId] | None = Field(None, min_length=1, max_length=9, description="the members, by node id")


class PartitionMemberRequest(_Model):
    """POST /v1/cluster/partitions/{name}/members: add a member to a partition (docs/partitions.md)."""

    node_id: NodeId
    timeout_s: float = Field(120.0, ge=0, le=600, description="how long to wait for the partition's Raft "
                                                              "membership to match and every member to catch up")


class ReplaceMemberRequest(_Model):
    """POST /v1/cluster/partitions/{name}/members/{node_id}/replace: a member's place to another node."""

    node_id: NodeId | None = Field(None, description="the node to take its place (null: the voting member "
                                                     "holding the fewest partitions that can)")
    timeout_s: float = Field(120.0, ge=0, le=600, description="how long to wait for each of the two changes")


class DrainNodeRequest(_Model):
    """POST /v1/cluster/nodes/{node_id}/drain: move a node's partition replicas to other nodes."""

    timeout_s: float = Field(120.0, ge=0, le=600, description="how long to wait for each change")


class RaiseFeatureLevelRequest(_Model):
    """POST /v1/cluster/feature-level: raise the cluster's feature level (docs/upgrades.md)."""

    level: int | None = Field(None, ge=1, le=1000,
                              description="the level to raise to (null: the highest every member reads)")


class StorageBudgetRequest(_Model):
    """PUT /v1/cluster/storage-budget: a partition process's share of its node's memory budget."""

    storage_bytes_max: int = Field(ge=1, le=1 << 62, description="the allowance its leader stamps on the entries "
                                   "it proposes (at most the node's storage_bytes_max: docs/partitions.md)")


class TransferLeadershipRequest(_Model):
    """POST /v1/cluster/leadership: hand leadership to a member (null: the most caught-up follower)."""

    node_id: NodeId | None = None
