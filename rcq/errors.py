"""The one exception hierarchy of rcq, shared by the server and the client.

Why over 400 lines: one class per error code, each with its docstring as its message: the codes in one place by design.

Every error carries a stable machine-readable ``code``, the HTTP status the
server answers with, whether retrying can help (``retryable``) and whether the
operation may nevertheless have taken effect (``maybe_committed``). Each
class's docstring is its default message. The server renders an error as
``{"error": {"code", "message", "retryable", "maybe_committed", "leader_url"}}``
and the client turns ``code`` back into the same class with
:func:`error_from_body`.

Must not import: aiohttp, pysyncobj, lmdb (clients import this module).
"""

from __future__ import annotations

from typing import Any, ClassVar


class RcqError(Exception):
    """An rcq operation failed."""

    code: ClassVar[str] = "internal_error"
    http_status: ClassVar[int] = 500
    retryable: ClassVar[bool] = False
    maybe_committed: ClassVar[bool] = False

    def __init__(self, message: str | None = None, *, leader_url: str | None = None,
                 details: dict[str, Any] | None = None) -> None:
        self.message = message or (self.__doc__ or self.code).strip()
        self.leader_url = leader_url
        self.details = details or {}
        super().__init__(self.message)

    def to_body(self) -> dict[str, Any]:
        error: dict[str, Any] = {
            "code": self.code,
            "message": self.message,
            "retryable": self.retryable,
            "maybe_committed": self.maybe_committed,
            "leader_url": self.leader_url,
        }
        if self.details:
            error["details"] = self.details
        return {"error": error}


class InternalError(RcqError):
    """The server hit an unexpected error; nothing is known to have changed."""


class InvalidRequest(RcqError):
    """The request is malformed."""

    code = "invalid_request"
    http_status = 400


class InvalidQueueName(InvalidRequest):
    """Queue names are 1 to 128 characters of [A-Za-z0-9._-]."""

    code = "invalid_queue_name"


class TransactionNotFound(RcqError):
    """No transaction with this id is known."""

    code = "transaction_not_found"
    http_status = 404


class TransactionClosed(RcqError):
    """The transaction is no longer active."""

    code = "transaction_closed"
    http_status = 409


class TransactionAborted(TransactionClosed):
    """The transaction was aborted; its dequeued items went back to their queues."""

    code = "transaction_aborted"


class TransactionExpired(TransactionAborted):
    """The transaction passed its deadline and was aborted."""

    code = "transaction_expired"


class LeaderChanged(TransactionAborted):
    """The leader that held the transaction lost leadership; the transaction was aborted."""

    code = "leader_changed"


class CommitConflict(TransactionAborted):
    """The commit was rejected whole: an item it dequeued is no longer in its queue."""

    code = "commit_conflict"


class TransactionCommitted(TransactionClosed):
    """The transaction is already committed."""

    code = "transaction_committed"


class TransactionBusy(TransactionClosed):
    """The transaction is committing; wait for the commit's answer."""

    code = "transaction_busy"
    retryable = True


class PayloadTooLarge(RcqError):
    """An item or the request body is over the configured limit."""

    code = "payload_too_large"
    http_status = 413


class TooManyTransactions(RcqError):
    """Too many open transactions on the leader; back off and retry."""

    code = "too_many_transactions"
    http_status = 429
    retryable = True


class TooManyQueues(RcqError):
    """The cluster holds the maximum number of queues; no new queue can be created."""

    code = "too_many_queues"
    http_status = 409


class QueueInUse(RcqError):
    """The queue is another queue's dead-letter queue: change that queue's setting first."""

    code = "queue_in_use"
    http_status = 409


class QueueNotFound(RcqError):
    """No queue with this name exists."""

    code = "queue_not_found"
    http_status = 404


class QueueFull(RcqError):
    """The queue holds as many items (or bytes) as its limit allows; dequeue some, or retry later."""

    code = "queue_full"
    http_status = 429
    retryable = True


class StorageFull(RcqError):
    """The cluster's memory budget for queued items is used up; dequeue some, or retry later."""

    code = "storage_full"
    http_status = 507
    retryable = True


class TooManyRequests(RcqError):
    """The cluster is remembering as many recent commits (or idempotency keys) as it can; retry shortly."""

    code = "too_many_requests"
    http_status = 429
    retryable = True


class TransactionLifetimeExceeded(RcqError):
    """The transaction cannot live that long: extends do not go past its lifetime limit."""

    code = "transaction_lifetime_exceeded"
    http_status = 409


class OutcomeExpired(RcqError):
    """The transaction's outcome is no longer remembered (outcomes are kept at least 2 minutes); it may have committed."""

    code = "outcome_expired"
    http_status = 410
    maybe_committed = True


class NotLeader(RcqError):
    """This node is not the leader; send the request to leader_url."""

    code = "not_leader"
    http_status = 307
    retryable = True


class Unavailable(RcqError):
    """The cluster cannot serve this request now; retry shortly."""

    code = "unavailable"
    http_status = 503
    retryable = True


class NoLeader(Unavailable):
    """The cluster has no leader right now; retry shortly."""

    code = "no_leader"


class NotReady(Unavailable):
    """The leader has not yet applied every entry of earlier terms; retry shortly."""

    code = "not_ready"


class TooManyConnections(Unavailable):
    """The node holds as many HTTP connections as it may; retry shortly, or reuse a connection."""

    code = "too_many_connections"


class CommitOutcomeUnknown(RcqError):
    """The commit may or may not have happened; ask for its outcome, or retry it with the same transaction id."""

    code = "commit_outcome_unknown"
    http_status = 504
    retryable = True
    maybe_committed = True


class RouteNotFound(InvalidRequest):
    """No such endpoint; see the README for the API."""

    code = "not_found"
    http_status = 404


class MethodNotAllowed(InvalidRequest):
    """This endpoint does not accept that HTTP method."""

    code = "method_not_allowed"
    http_status = 405


class RequestTimeout(RcqError):
    """The request body did not arrive in time; the connection was closed. Retry the request."""

    code = "request_timeout"
    http_status = 408
    retryable = True


class Unauthorized(RcqError):
    """This endpoint needs a valid token, sent as 'Authorization: Bearer TOKEN'."""

    code = "unauthorized"
    http_status = 401


class TokenExpired(Unauthorized):
    """The token has expired; ask for a new one."""

    code = "token_expired"


class CertificateError(RcqError):
    """The node's TLS certificate could not be verified (another CA, another host name, expired):
    a configuration error, not retried. Raised by the client; no server answers it."""

    code = "certificate_error"
    http_status = 495


class Forbidden(RcqError):
    """The token does not grant this; nothing was changed."""

    code = "forbidden"
    http_status = 403


class MembershipConflict(RcqError):
    """Another membership change is not yet committed, or the leader has not yet committed an entry of its term; retry shortly."""

    code = "membership_conflict"
    http_status = 409
    retryable = True


class MemberExists(RcqError):
    """A member already has this node id or Raft address; nothing was changed."""

    code = "member_exists"
    http_status = 409


class MemberNotFound(RcqError):
    """No member of the cluster has this node id."""

    code = "member_not_found"
    http_status = 404


class NodeUnreachable(RcqError):
    """The node to add does not answer its health check as that node id; start it first (its peers: the current members)."""

    code = "node_unreachable"
    http_status = 422
    retryable = True


class WouldLoseQuorum(RcqError):
    """The change would leave fewer reachable members than a majority of the new cluster; nothing was changed."""

    code = "would_lose_quorum"
    http_status = 409


class FeatureLevelRequired(RcqError):
    """The cluster's feature level is below what this request needs (docs/upgrades.md): every member
    must run a release that has the feature, and the level be raised; nothing was changed."""

    code = "feature_level_required"
    http_status = 409


class FeatureLevelUnsupported(RcqError):
    """A member (or this node) cannot read the feature level asked for, or the level would go
    down; upgrade that member first. Nothing was changed."""

    code = "feature_level_unsupported"
    http_status = 409


class PartitionExists(RcqError):
    """A partition of this name exists; nothing was changed."""

    code = "partition_exists"
    http_status = 409


class PartitionNotFound(RcqError):
    """No partition has this name (docs/partitions.md)."""

    code = "partition_not_found"
    http_status = 404


class PartitionNotEmpty(RcqError):
    """A queue is placed in this partition: delete its queues first; nothing was changed."""

    code = "partition_not_empty"
    http_status = 409


class NodeHasNoPartitionPorts(RcqError):
    """A node the partition needs has no partition ports recorded: set partition_ports on it
    (docs/partitions.md); nothing was changed."""

    code = "node_has_no_partition_ports"
    http_status = 409


class PartitionPortsExhausted(RcqError):
    """A member's partition_ports range holds no ports for another partition: widen it; nothing was changed."""

    code = "partition_ports_exhausted"
    http_status = 409


class TooManyPartitions(RcqError):
    """The cluster has as many partitions as it may (docs/limits.md): delete one first; nothing was changed."""

    code = "too_many_partitions"
    http_status = 409


class NodePartitionsFull(RcqError):
    """A member would host more partition processes than a node may (docs/limits.md): name other
    nodes, or add nodes; nothing was changed."""

    code = "node_partitions_full"
    http_status = 409


class CrossPartitionTransaction(RcqError):
    """A transaction lives in one partition, and this queue lives in another (docs/partitions.md);
    nothing was changed and the transaction is still usable."""

    code = "cross_partition_transaction"
    http_status = 409


class WrongPartition(RcqError):
    """This request belongs to another partition's leader and was not run (docs/partitions.md,
    "Routing"): ``details.partition`` names it, and ``leader_url`` its leader when known."""

    code = "wrong_partition"
    http_status = 421
    retryable = True


class DeadLetterPartitionMismatch(RcqError):
    """A dead-letter queue must live in its source queue's partition (docs/partitions.md); nothing
    was changed."""

    code = "dead_letter_partition_mismatch"
    http_status = 409


class QueuePlacementFixed(RcqError):
    """A queue's partitions are fixed when it is created (docs/partitions.md); nothing was changed."""

    code = "queue_placement_fixed"
    http_status = 409


class QueueSpreadUnsupported(InvalidRequest):
    """A queue lives in one partition; spreading one over several is not supported yet."""

    code = "queue_spread_unsupported"
    http_status = 400


def _all_subclasses(cls: type[RcqError]) -> list[type[RcqError]]:
    found: list[type[RcqError]] = []
    for sub in cls.__subclasses__():
        found.append(sub)
        found.extend(_all_subclasses(sub))
    return found


_ERROR_CLASSES: list[type[RcqError]] = [RcqError, *_all_subclasses(RcqError)]
ERRORS_BY_CODE: dict[str, type[RcqError]] = {cls.code: cls for cls in _ERROR_CLASSES}


def error_from_body(status: int, body: Any) -> RcqError:
    """Rebuild the typed error from a server's error body (client side)."""
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict):
        bare: type[RcqError] = Unavailable if status in (502, 503) else InternalError
        return bare(f"HTTP {status} without an rcq error body")
    cls = ERRORS_BY_CODE.get(str(error.get("code")), InternalError)
    return cls(str(error.get("message") or cls.__doc__),
               leader_url=error.get("leader_url"), details=error.get("details"))

