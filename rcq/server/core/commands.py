"""What goes through the Raft log: explicit, versioned commands and their results.

A command travels as a tuple of plain values (str, int, bytes, tuples), never
as a pickled object of ours, so the log stays readable by any later version
that knows ``COMMAND_VERSION``. :func:`encode` and :func:`decode` are the only
way in and out; :func:`decode` rejects anything it does not recognise with
:class:`MalformedCommand` (the state machine turns that into a result value,
never an exception that would wedge the replication thread).

Must not import: asyncio, aiohttp, pysyncobj, lmdb, time, random, uuid, os.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

COMMAND_VERSION = 1

KIND_COMMIT = "commit"
KIND_BARRIER = "barrier"
KIND_QUEUE = "queue"
QUEUE_ACTIONS = ("configure", "purge", "delete")


class MalformedCommand(ValueError):
    """A log entry that is not a command this version understands."""


@dataclass(frozen=True, slots=True)
class TransactionWrite:
    """Everything one transaction asks for at commit time."""

    transaction_id: str
    # queue -> items to append, in the order the transaction enqueued them
    enqueues: tuple[tuple[str, tuple[bytes, ...]], ...] = ()
    # queue -> ids of the items the transaction dequeued
    dequeues: tuple[tuple[str, tuple[int, ...]], ...] = ()


@dataclass(frozen=True, slots=True)
class CommitUnit:
    """Transactions applied all together or not at all, optionally under an idempotency key."""

    transactions: tuple[TransactionWrite, ...]
    idempotency_key: str | None = None


@dataclass(frozen=True, slots=True)
class Limits:
    """The storage limits an entry is applied under, as the proposing leader's configuration says.

    Limits enter the log as data, like time: every replica enforces the same numbers for the same
    entry, whatever its own configuration. A queue's own ``max_items``/``max_bytes`` (replicated
    queue settings) override the two defaults. Bytes count each item's bookkeeping too
    (``ITEM_OVERHEAD_BYTES`` in the state machine), so empty items are not free.
    """

    storage_bytes_max: int
    queue_items_max: int
    queue_bytes_max: int


@dataclass(frozen=True, slots=True)
class CommitBatch:
    """Many independent commit units grouped into one Raft entry (group commit)."""

    term: int  # the proposing leader's term: entries of a deposed leader are fenced off
    now_ms: int  # the leader's clock when it proposed the entry: time enters as data
    units: tuple[CommitUnit, ...]
    limits: Limits | None = None  # None (entries of older versions): no storage limit is checked


@dataclass(frozen=True, slots=True)
class QueueChange:
    """Configure, purge or delete one queue: an administrative entry of its own.

    ``configure`` creates the queue if needed and sets its limits (None: the defaults of the
    entries that grow it); ``purge`` removes every item and keeps the queue; ``delete`` removes
    the queue, its items and its settings.
    """

    term: int
    now_ms: int
    queue: str
    action: Literal["configure", "purge", "delete"]
    max_items: int | None = None
    max_bytes: int | None = None


@dataclass(frozen=True, slots=True)
class Barrier:
    """Proposed by a new leader; once applied, every entry of earlier terms is applied."""

    term: int
    now_ms: int


Command = CommitBatch | Barrier | QueueChange


@dataclass(frozen=True, slots=True)
class EnqueuedRange:
    """Ids ``first_item_id .. first_item_id + count - 1`` were given to items appended to ``queue``."""

    queue: str
    first_item_id: int
    count: int


@dataclass(frozen=True, slots=True)
class UnitOutcome:
    """The domain outcome of one commit unit, identical on every replica."""

    status: Literal["committed", "duplicate", "rejected"]
    index: int  # log index that committed (for duplicates: the original one; rejected: this one)
    enqueued: tuple[EnqueuedRange, ...] = ()
    reason: str | None = None  # why a unit was rejected
    missing_item_ids: tuple[int, ...] = ()
    queue: str | None = None  # the queue a rejection is about (queue_full, too_many_queues)


@dataclass(frozen=True, slots=True)
class BatchResult:
    outcomes: tuple[UnitOutcome, ...]


@dataclass(frozen=True, slots=True)
class QueueChangeResult:
    status: Literal["done", "rejected"]
    queue: str
    action: str
    removed: int = 0  # items purge or delete removed
    reason: str | None = None  # why it was rejected: queue_not_found, too_many_queues, stale_leader


@dataclass(frozen=True, slots=True)
class BarrierResult:
    term: int


@dataclass(frozen=True, slots=True)
class ApplyFailed:
    """The entry could not be applied.

    Malformed entries change nothing. An exception inside apply is a bug: the
    unit it hit may be partly applied, identically on every replica (apply is
    deterministic), and the node keeps going instead of wedging.
    """

    reason: str
    details: dict[str, Any] = field(default_factory=dict)


ApplyResult = BatchResult | BarrierResult | QueueChangeResult | ApplyFailed


def encode(command: Command) -> tuple[Any, ...]:
    if isinstance(command, Barrier):
        return (COMMAND_VERSION, KIND_BARRIER, command.term, command.now_ms)
    if isinstance(command, QueueChange):
        return (COMMAND_VERSION, KIND_QUEUE, command.term, command.now_ms, command.queue, command.action,
                command.max_items, command.max_bytes)
    units = tuple(
        (
            unit.idempotency_key,
            tuple((t.transaction_id, t.enqueues, t.dequeues) for t in unit.transactions),
        )
        for unit in command.units
    )
    if command.limits is None:
        return (COMMAND_VERSION, KIND_COMMIT, command.term, command.now_ms, units)
    limits = command.limits
    return (COMMAND_VERSION, KIND_COMMIT, command.term, command.now_ms, units,
            (limits.storage_bytes_max, limits.queue_items_max, limits.queue_bytes_max))


def decode(raw: Any) -> Command:
    """Turn a log entry back into a command; raise MalformedCommand on anything unexpected."""
    try:
        version, kind = raw[0], raw[1]
    except (TypeError, IndexError, KeyError) as exc:
        raise MalformedCommand(f"not a command tuple: {type(raw).__name__}") from exc
    if type(version) is not int or version != COMMAND_VERSION:
        raise MalformedCommand(f"command version {version!r}, this node knows {COMMAND_VERSION}")
    try:
        if kind == KIND_BARRIER:
            _, _, term, now_ms = raw
            return Barrier(term=_int(term), now_ms=_int(now_ms))
        if kind == KIND_COMMIT:
            # Five fields: written before limits existed; six: with the proposing leader's limits.
            _, _, term, now_ms, units, *rest = raw
            if len(rest) > 1:
                raise ValueError(f"{len(raw)} fields")
            limits = Limits(*(_positive(v) for v in _seq(rest[0]))) if rest else None
            return CommitBatch(term=_int(term), now_ms=_int(now_ms),
                               units=tuple(_decode_unit(u) for u in _seq(units)), limits=limits)
        if kind == KIND_QUEUE:
            _, _, term, now_ms, queue, action, max_items, max_bytes = raw
            if action not in QUEUE_ACTIONS:
                raise ValueError(f"unknown queue action {action!r}")
            return QueueChange(term=_int(term), now_ms=_int(now_ms), queue=_str(queue), action=action,
                               max_items=_optional_positive(max_items), max_bytes=_optional_positive(max_bytes))
    except (TypeError, ValueError) as exc:
        raise MalformedCommand(f"bad {kind} command: {exc}") from exc
    raise MalformedCommand(f"unknown command kind {kind!r}")


def _decode_unit(raw: Any) -> CommitUnit:
    key, transactions = raw
    if key is not None and not isinstance(key, str):
        raise ValueError("idempotency key must be str or None")
    return CommitUnit(
        transactions=tuple(_decode_transaction(t) for t in _seq(transactions)),
        idempotency_key=key,
    )


def _decode_transaction(raw: Any) -> TransactionWrite:
    transaction_id, enqueues, dequeues = raw
    if not isinstance(transaction_id, str):
        raise ValueError("transaction id must be str")
    return TransactionWrite(
        transaction_id=transaction_id,
        enqueues=tuple((_str(q), tuple(_bytes(i) for i in _seq(items))) for q, items in _seq(enqueues)),
        dequeues=tuple((_str(q), tuple(_int(i) for i in _seq(ids))) for q, ids in _seq(dequeues)),
    )


def _seq(value: Any) -> tuple[Any, ...] | list[Any]:
    if not isinstance(value, tuple | list):
        raise ValueError(f"expected a tuple, got {type(value).__name__}")
    return value


def _int(value: Any) -> int:
    if type(value) is not int:
        raise ValueError(f"expected int, got {type(value).__name__}")
    return value


def _positive(value: Any) -> int:
    if _int(value) < 1:
        raise ValueError(f"expected a positive int, got {value}")
    return int(value)


def _optional_positive(value: Any) -> int | None:
    return None if value is None else _positive(value)


def _str(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"expected str, got {type(value).__name__}")
    return value


def _bytes(value: Any) -> bytes:
    if not isinstance(value, bytes):
        raise ValueError(f"expected bytes, got {type(value).__name__}")
    return value
