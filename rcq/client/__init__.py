"""The async client of rcq: transactions, one-request transactions, leader discovery and failover.

::

    async with RcqClient(["http://127.0.0.1:7001", "http://127.0.0.1:7002"]) as client:
        async with client.transaction(timeout_s=30) as tx:  # commits on a clean exit,
            item = await tx.dequeue("in")                   # aborts on an exception
            if item is not None:
                await tx.enqueue("out", item)
        await client.enqueue("in", b"\\x00\\xff", "text")    # one request, one transaction

The package, by job: :mod:`~rcq.client.client` (:class:`RcqClient`, the API),
:mod:`~rcq.client.sync` (:class:`SyncClient`, the same API for synchronous code: RcqClient run
on a thread of its own), :mod:`~rcq.client.loop_thread` (that thread: a private event loop that
other threads run coroutines on),
:mod:`~rcq.client.transaction` (:class:`Transaction`), :mod:`~rcq.client.transport`
(where a request goes, the one retry loop, coalescing), :mod:`~rcq.client.retry` (its rules:
each kind of request's policy, what is safe to re-send, the backoff),
:mod:`~rcq.client.leader_tracker` (which node leads, and a new leader when it stops answering),
:mod:`~rcq.client.coalescer` (the transport's batching helper),
:mod:`~rcq.client.channel` (the session channel: one WebSocket to a node, requests pipelined on
it; the transport's default for the hot verbs), :mod:`~rcq.client.exchange` (one HTTP exchange) and
:mod:`~rcq.client.wire` (result types, item encodings, request bodies),
:mod:`~rcq.client.hooks` (what sending, receiving and settling go through: nothing by default) and
:mod:`~rcq.client.tracing` (OpenTelemetry spans and trace context in item headers, with the
``rcq[otel]`` extra, once ``tracing.instrument()`` is called; docs/tracing.md). The errors are
those of :mod:`rcq.errors`, re-exported here.

Must not import: rcq.server, pysyncobj, lmdb (``pip install rcq`` has no server).
"""

from __future__ import annotations

from rcq.client.client import PEEK_TIMEOUT_S, RcqClient
from rcq.client.exchange import CONNECTIONS_MAX
from rcq.client.sync import SyncClient, SyncTransaction
from rcq.client.transaction import Transaction
from rcq.client.wire import (
    CommitInfo,
    DeadLetter,
    Dequeue,
    Enqueue,
    ExecuteResult,
    Item,
    ItemValue,
    OperationResult,
    encode_items,
)
from rcq.errors import (
    CertificateError,
    CommitConflict,
    CommitOutcomeUnknown,
    CrossPartitionTransaction,
    DeadLetterPartitionMismatch,
    FeatureLevelRequired,
    FeatureLevelUnsupported,
    Forbidden,
    InternalError,
    InvalidQueueName,
    InvalidRequest,
    LeaderChanged,
    MemberExists,
    MemberNotFound,
    MembershipConflict,
    MethodNotAllowed,
    NodeHasNoPartitionPorts,
    NodePartitionsFull,
    NodeUnreachable,
    NoLeader,
    NotLeader,
    NotReady,
    OutcomeExpired,
    PartitionExists,
    PartitionNotEmpty,
    PartitionNotFound,
    PartitionPortsExhausted,
    PayloadTooLarge,
    QueueFull,
    QueueInUse,
    QueueNotFound,
    QueuePlacementFixed,
    QueueSpreadUnsupported,
    RcqError,
    RequestTimeout,
    RouteNotFound,
    StorageFull,
    TokenExpired,
    TooManyConnections,
    TooManyPartitions,
    TooManyQueues,
    TooManyRequests,
    TooManyTransactions,
    TransactionAborted,
    TransactionBusy,
    TransactionClosed,
    TransactionCommitted,
    TransactionExpired,
    TransactionLifetimeExceeded,
    TransactionNotFound,
    Unauthorized,
    Unavailable,
    WouldLoseQuorum,
    WrongPartition,
)

__all__ = [
    "CONNECTIONS_MAX",
    "PEEK_TIMEOUT_S",
    "CertificateError",
    "CommitConflict",
    "CommitInfo",
    "CommitOutcomeUnknown",
    "CrossPartitionTransaction",
    "DeadLetter",
    "DeadLetterPartitionMismatch",
    "Dequeue",
    "Enqueue",
    "ExecuteResult",
    "FeatureLevelRequired",
    "FeatureLevelUnsupported",
    "Forbidden",
    "InternalError",
    "InvalidQueueName",
    "InvalidRequest",
    "Item",
    "ItemValue",
    "LeaderChanged",
    "MemberExists",
    "MemberNotFound",
    "MembershipConflict",
    "MethodNotAllowed",
    "NoLeader",
    "NodeHasNoPartitionPorts",
    "NodePartitionsFull",
    "NodeUnreachable",
    "NotLeader",
    "NotReady",
    "OperationResult",
    "OutcomeExpired",
    "PartitionExists",
    "PartitionNotEmpty",
    "PartitionNotFound",
    "PartitionPortsExhausted",
    "PayloadTooLarge",
    "QueueFull",
    "QueueInUse",
    "QueueNotFound",
    "QueuePlacementFixed",
    "QueueSpreadUnsupported",
    "RcqClient",
    "RcqError",
    "RequestTimeout",
    "RouteNotFound",
    "StorageFull",
    "SyncClient",
    "SyncTransaction",
    "TokenExpired",
    "TooManyConnections",
    "TooManyPartitions",
    "TooManyQueues",
    "TooManyRequests",
    "TooManyTransactions",
    "Transaction",
    "TransactionAborted",
    "TransactionBusy",
    "TransactionClosed",
    "TransactionCommitted",
    "TransactionExpired",
    "TransactionLifetimeExceeded",
    "TransactionNotFound",
    "Unauthorized",
    "Unavailable",
    "WouldLoseQuorum",
    "WrongPartition",
    "encode_items",
]
