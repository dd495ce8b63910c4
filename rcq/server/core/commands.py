"""What goes through the Raft log: explicit, versioned commands and their results.

Why over 400 lines: each command and result of the log sits beside the one codec that writes and reads it (one format).

A command travels as a tuple of plain values (str, int, bytes, tuples), never
as a pickled object of ours, so the log stays readable by any later version
that knows ``COMMAND_VERSION``. :func:`encode` and :func:`decode` are the only
way in and out; :func:`decode` rejects anything it does not recognise with
:class:`MalformedCommand` (the state machine turns that into a result value,
never an exception that would wedge the replication thread).

Must not import: asyncio, aiohttp, pysyncobj, lmdb, time, random, uuid, os.
"""

from __future__ import annotations

import sys
from dataclasses import field
from typing import Any, Literal

from rcq.immutable import immutable
from rcq.server.core.directory import DirectoryCommand, DirectoryResult, decode_directory, encode_directory

COMMAND_VERSION = 1

KIND_COMMIT = "commit"
KIND_BARRIER = "barrier"
KIND_QUEUE = "queue"
KIND_ITEMS = "items"  # an ItemsAction inside a commit entry's units
KIND_MEMBER = "member"
KIND_LEVEL = "level"  # feature level 2 (rcq.server.core.features)
KIND_IDENTITY = "identity"  # feature level 2: the cluster's identity, set once
CLUSTER_ID_CHARS_MAX = 64
MEMBER_ACTIONS = ("record", "forget")
QUEUE_ACTIONS = ("configure", "purge", "delete")
# What an ItemsAction does to the items it names (docs/queue-features.md):
ITEM_ACTIONS = (
    "deliver",  # count a delivery before the leader hands the items out (queues with max_deliveries)
    "dead_letter",  # items whose delivery count reached max_deliveries leave for the dead-letter queue
    "expire",  # items past their expiry leave (dead-letter queue, or dropped)
    "reject",  # a transaction rejected items it holds: to the dead-letter queue at once
    "redrive",  # dead items go back to their source queues
)
DEAD_REASONS = ("max_deliveries", "expired", "rejected")


class MalformedCommand(ValueError):
    """A log entry that is not a command this version understands."""


class UnreadableCommand(MalformedCommand):
    """A log entry of a newer format (a newer command version, an unknown kind): written by a
    newer rcq at a feature level this node does not read. The node must stop, not skip it."""


UNREADABLE_ENTRY = "unreadable_entry"  # ApplyFailed.reason of an entry this node cannot read: it stops


@immutable
class EnqueueOptions:
    """How the items of one enqueue are stored: priority, delay and time to live.

    ``delay_ms``/``ttl_ms`` None: the queue's default when the commit applies; a delay of 0: none.
    Times are relative: the state machine adds them to the time of the entry that commits.
    """

    priority: int = 0
    delay_ms: int | None = None
    ttl_ms: int | None = None


# An item's headers (feature level 2): string keys to string values, in the order given. Only
# items that carry some have any; the leader checks them (rcq.server.leader.item_headers).
Headers = tuple[tuple[str, str], ...]


@immutable
class TransactionWrite:
    """Everything one transaction asks for at commit time."""

    transaction_id: str
    # queue -> items to append, in the order the transaction enqueued them
    enqueues: tuple[tuple[str, tuple[bytes, ...]], ...] = ()
    # queue -> ids of the items the transaction dequeued
    dequeues: tuple[tuple[str, tuple[int, ...]], ...] = ()
    # the options of each enqueue, parallel to ``enqueues``; () when every one is plain
    enqueue_options: tuple[EnqueueOptions | None, ...] = ()
    # the headers of each enqueued item, parallel to ``enqueues``: per enqueue None (no item of it
    # has headers) or one entry per item (None: that item has none); () when no item has any
    enqueue_headers: tuple[tuple[Headers | None, ...] | None, ...] = ()

    def options_of(self, position: int) -> EnqueueOptions | None:
        return self.enqueue_options[position] if self.enqueue_options else None

    def headers_of(self, position: int) -> tuple[Headers | None, ...] | None:
        return self.enqueue_headers[position] if self.enqueue_headers else None


@immutable
class ItemsAction:
    """A leader's action on named items of one queue, a unit of a CommitBatch of its own.

    The state machine checks each item against the rule (present, at the limit, past its
    expiry...) at the entry's time and acts only where the rule holds, so a stale or repeated
    action changes nothing it should not. ``note``: a rejecting client's reason, kept with the item.
    """

    action: Literal["deliver", "dead_letter", "expire", "reject", "redrive"]
    queue: str
    item_ids: tuple[int, ...]
    note: str | None = None


@immutable
class CommitUnit:
    """Transactions applied all together or not at all, optionally under an idempotency key."""

    transactions: tuple[TransactionWrite, ...]
    idempotency_key: str | None = None


@immutable
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


@immutable
class CommitBatch:
    """Many independent commit units (and item actions) grouped into one Raft entry (group commit)."""

    term: int  # the proposing leader's term: entries of a deposed leader are fenced off
    now_ms: int  # the leader's clock when it proposed the entry: time enters as data
    units: tuple[CommitUnit | ItemsAction, ...]
    limits: Limits | None = None  # None (entries of older versions): no storage limit is checked


@immutable
class QueueChange:
    """Configure, purge or delete one queue: an administrative entry of its own.

    ``configure`` creates the queue if needed and sets every setting (None: the default: the
    limits of the entries that grow it, no delivery limit...); ``purge`` removes every item and
    keeps the queue; ``delete`` removes the queue, its items and its settings.
    """

    term: int
    now_ms: int
    queue: str
    action: Literal["configure", "purge", "delete"]
    max_items: int | None = None
    max_bytes: int | None = None
    settings: QueueSettings | None = None  # the settings beyond the limits (None: all default)


@immutable
class QueueSettings:
    """A queue's delivery, dead-letter, time and priority settings (docs/queue-features.md)."""

    max_deliveries: int | None = None
    dead_letter_queue: str | None = None
    default_ttl_ms: int | None = None
    default_delay_ms: int | None = None
    max_priority: int | None = None

    def as_tuple(self) -> tuple[int | str | None, ...]:
        return (self.max_deliveries, self.dead_letter_queue, self.default_ttl_ms, self.default_delay_ms,
                self.max_priority)


@immutable
class Barrier:
    """Proposed by a new leader; once applied, every entry of earlier terms is applied."""

    term: int
    now_ms: int


@immutable
class MemberRecord:
    """Record (or forget) how to reach one node: its Raft address and the URL it serves clients on.

    The cluster's directory (docs/membership.md). Who votes is Raft's membership, changed by
    pysyncobj's own entries; the directory only names members, so a node whose static
    configuration predates a member can still send clients to it. ``record`` replaces whatever
    entry had the same node id or Raft address; ``forget`` removes the node id's entry.
    """

    term: int
    now_ms: int
    action: Literal["record", "forget"]
    node_id: str
    raft_address: str = ""
    http_url: str = ""


@immutable
class SetLevel:
    """Raise the cluster's active feature level (docs/upgrades.md). Proposed by a leader only once
    every member reads ``level``; ``writer_version`` is the proposing node's rcq version, named in
    the message of a node that cannot read the level."""

    term: int
    now_ms: int
    level: int
    writer_version: str


@immutable
class SetIdentity:
    """Give the cluster its identity (docs/backup.md), once: a leader proposes it at feature level 2
    when the state has none, with an id it generated (the state machine stays deterministic); a
    second identity is ignored, so two leaders racing to propose one leave the first."""

    term: int
    now_ms: int
    cluster_id: str


Command = CommitBatch | Barrier | QueueChange | MemberRecord | SetLevel | SetIdentity | DirectoryCommand


@immutable
class EnqueuedRange:
    """Ids ``first_item_id .. first_item_id + count - 1`` were given to items appended to ``queue``,
    all with this priority, visible from ``visible_at_ms`` (0: at once), expiring at
    ``expires_at_ms`` (None: never)."""

    queue: str
    first_item_id: int
    count: int
    priority: int = 0
    visible_at_ms: int = 0
    expires_at_ms: int | None = None


@immutable
class UnitOutcome:
    """The domain outcome of one commit unit, identical on every replica."""

    status: Literal["committed", "duplicate", "rejected"]
    index: int  # log index that committed (for duplicates: the original one; rejected: this one)
    enqueued: tuple[EnqueuedRange, ...] = ()
    reason: str | None = None  # why a unit was rejected
    missing_item_ids: tuple[int, ...] = ()
    queue: str | None = None  # the queue a rejection is about (queue_full, too_many_queues)


@immutable
class ItemsOutcome:
    """What an ItemsAction did, identical on every replica.

    ``acted``: the named items the rule applied to (delivered, dead-lettered, expired, rejected,
    redriven); ``counts``: for ``deliver``, each acted item's delivery count after this one;
    ``dead``: items a ``deliver`` found at the limit and dead-lettered instead; ``removed``: every
    item that left ``queue``; ``moved``: where the items that left went (ranges of new ids).
    """

    status: Literal["done", "rejected"]
    index: int
    action: str
    queue: str
    acted: tuple[int, ...] = ()
    counts: tuple[int, ...] = ()
    dead: tuple[int, ...] = ()
    removed: tuple[int, ...] = ()
    moved: tuple[EnqueuedRange, ...] = ()
    reason: str | None = None


@immutable
class BatchResult:
    outcomes: tuple[UnitOutcome | ItemsOutcome, ...]


@immutable
class QueueChangeResult:
    status: Literal["done", "rejected"]
    queue: str
    action: str
    removed: int = 0  # items purge or delete removed
    # why it was rejected: queue_not_found, too_many_queues, stale_leader, queue_in_use,
    # dead_letter_queue_unknown, dead_letter_queue_self, dead_letter_queue_cycle
    reason: str | None = None


@immutable
class MemberRecordResult:
    status: Literal["done", "rejected"]
    node_id: str
    reason: str | None = None  # stale_leader


@immutable
class BarrierResult:
    term: int


@immutable
class SetLevelResult:
    status: Literal["done", "rejected"]
    level: int  # the active level after the entry
    reason: str | None = None  # stale_leader, level_lowered


@immutable
class SetIdentityResult:
    status: Literal["done", "ignored", "rejected"]  # ignored: the cluster already had an identity
    cluster_id: str | None  # the cluster's identity after the entry
    reason: str | None = None  # level_too_low


@immutable
class ApplyFailed:
    """The entry could not be applied.

    Malformed entries change nothing. An exception inside apply is a bug: the
    unit it hit may be partly applied, identically on every replica (apply is
    deterministic), and the node keeps going instead of wedging.
    """

    reason: str
    details: dict[str, Any] = field(default_factory=dict)


ApplyResult = (BatchResult | BarrierResult | QueueChangeResult | MemberRecordResult | SetLevelResult
               | SetIdentityResult | DirectoryResult | ApplyFailed)


def encode(command: Command) -> tuple[Any, ...]:
    if isinstance(command, Barrier):
        return (COMMAND_VERSION, KIND_BARRIER, command.term, command.now_ms)
    if isinstance(command, QueueChange):
        head = (COMMAND_VERSION, KIND_QUEUE, command.term, command.now_ms, command.queue, command.action,
                command.max_items, command.max_bytes)
        return head if command.settings is None else (*head, command.settings.as_tuple())
    if isinstance(command, MemberRecord):
        return (COMMAND_VERSION, KIND_MEMBER, command.term, command.now_ms, command.action, command.node_id,
                command.raft_address, command.http_url)
    if isinstance(command, SetLevel):
        return (COMMAND_VERSION, KIND_LEVEL, command.term, command.now_ms, command.level, command.writer_version)
    if isinstance(command, SetIdentity):
        return (COMMAND_VERSION, KIND_IDENTITY, command.term, command.now_ms, command.cluster_id)
    if not isinstance(command, CommitBatch):  # the partition directory's (feature level 4)
        return encode_directory(command, COMMAND_VERSION)
    units = tuple(_encode_unit(unit) for unit in command.units)
    if command.limits is None:
        return (COMMAND_VERSION, KIND_COMMIT, command.term, command.now_ms, units)
    limits = command.limits
    return (COMMAND_VERSION, KIND_COMMIT, command.term, command.now_ms, units,
            (limits.storage_bytes_max, limits.queue_items_max, limits.queue_bytes_max))


def _encode_unit(unit: CommitUnit | ItemsAction) -> tuple[Any, ...]:
    """A commit unit is a pair (key, transactions); an item action a 5-tuple (the lengths tell them apart)."""
    if isinstance(unit, ItemsAction):
        return (KIND_ITEMS, unit.action, unit.queue, unit.item_ids, unit.note)
    return (unit.idempotency_key, tuple(_encode_transaction(t) for t in unit.transactions))


def _encode_transaction(t: TransactionWrite) -> tuple[Any, ...]:
    # Optional trailing fields, each written only when used, so that a transaction without them is
    # exactly what an older version writes: options (4th), item headers (5th, feature level 2).
    has_headers = any(h is not None for h in t.enqueue_headers)
    if not any(t.enqueue_options) and not has_headers:
        return (t.transaction_id, t.enqueues, t.dequeues)
    options = tuple(None if o is None else (o.priority, o.delay_ms, o.ttl_ms) for o in t.enqueue_options) \
        if any(t.enqueue_options) else ()
    if not has_headers:
        return (t.transaction_id, t.enqueues, t.dequeues, options)
    return (t.transaction_id, t.enqueues, t.dequeues, options, t.enqueue_headers)


def decode(raw: Any) -> Command:
    """Turn a log entry back into a command; raise MalformedCommand on anything unexpected."""
    try:
        version, kind = raw[0], raw[1]
    except (TypeError, IndexError, KeyError) as exc:
        raise MalformedCommand(f"not a command tuple: {type(raw).__name__}") from exc
    if type(version) is int and version > COMMAND_VERSION:
        raise UnreadableCommand(f"command version {version}, this node reads up to {COMMAND_VERSION}")
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
            # Eight fields: limits only (older versions); nine: with the other settings.
            _, _, term, now_ms, queue, action, max_items, max_bytes, *rest = raw
            if action not in QUEUE_ACTIONS:
                raise ValueError(f"unknown queue action {action!r}")
            if len(rest) > 1:
                raise ValueError(f"{len(raw)} fields")
            return QueueChange(term=_int(term), now_ms=_int(now_ms), queue=_str(queue), action=action,
                               max_items=_optional_positive(max_items), max_bytes=_optional_positive(max_bytes),
                               settings=_decode_settings(rest[0]) if rest else None)
        if kind == KIND_MEMBER:
            _, _, term, now_ms, action, node_id, raft_address, http_url = raw
            if action not in MEMBER_ACTIONS:
                raise ValueError(f"unknown member action {action!r}")
            return MemberRecord(term=_int(term), now_ms=_int(now_ms), action=action, node_id=_str(node_id),
                                raft_address=_str(raft_address), http_url=_str(http_url))
        if kind == KIND_LEVEL:
            _, _, term, now_ms, level, writer_version = raw
            return SetLevel(term=_int(term), now_ms=_int(now_ms), level=_positive(level),
                            writer_version=_str(writer_version))
        if kind == KIND_IDENTITY:
            _, _, term, now_ms, cluster_id = raw
            if not _str(cluster_id) or len(cluster_id) > CLUSTER_ID_CHARS_MAX:
                raise ValueError(f"bad cluster id {cluster_id!r}")
            return SetIdentity(term=_int(term), now_ms=_int(now_ms), cluster_id=cluster_id)
        directory_command = decode_directory(raw)  # feature level 4 (rcq.server.core.directory)
        if directory_command is not None:
            return directory_command
    except (TypeError, ValueError) as exc:
        raise MalformedCommand(f"bad {kind} command: {exc}") from exc
    if isinstance(kind, str):  # a kind a newer version writes
        raise UnreadableCommand(f"unknown command kind {kind!r}")
    raise MalformedCommand(f"unknown command kind {kind!r}")


def _decode_settings(raw: Any) -> QueueSettings:
    max_deliveries, dead_letter_queue, ttl_ms, delay_ms, max_priority = _seq(raw)
    return QueueSettings(
        max_deliveries=_optional_positive(max_deliveries),
        dead_letter_queue=None if dead_letter_queue is None else _str(dead_letter_queue),
        default_ttl_ms=_optional_positive(ttl_ms), default_delay_ms=_optional_natural(delay_ms),
        max_priority=_optional_natural(max_priority))


def _decode_unit(raw: Any) -> CommitUnit | ItemsAction:
    if len(_seq(raw)) == 5:
        kind, action, queue, item_ids, note = raw
        if kind != KIND_ITEMS or action not in ITEM_ACTIONS:
            raise ValueError(f"unknown item action {action!r}")
        if note is not None:
            _str(note)
        return ItemsAction(action=action, queue=_str(queue), item_ids=tuple(_int(i) for i in _seq(item_ids)),
                           note=note)
    key, transactions = raw
    if key is not None and not isinstance(key, str):
        raise ValueError("idempotency key must be str or None")
    return CommitUnit(
        transactions=tuple(_decode_transaction(t) for t in _seq(transactions)),
        idempotency_key=key,
    )


def _decode_transaction(raw: Any) -> TransactionWrite:
    # Three fields: no enqueue options (older versions, and plain enqueues); four: with them; five:
    # with item headers too (feature level 2; the options field is () when every enqueue is plain).
    transaction_id, enqueues, dequeues, *rest = raw
    if not isinstance(transaction_id, str):
        raise ValueError("transaction id must be str")
    if len(rest) > 2:
        raise ValueError(f"{len(raw)} transaction fields")
    write = TransactionWrite(
        transaction_id=transaction_id,
        enqueues=_decode_named(enqueues, bytes),
        dequeues=_decode_named(dequeues, int),
        enqueue_options=tuple(_decode_options(o) for o in _seq(rest[0])) if rest else (),
        enqueue_headers=tuple(_decode_enqueue_headers(h) for h in _seq(rest[1])) if len(rest) > 1 else (),
    )
    if write.enqueue_options and len(write.enqueue_options) != len(write.enqueues):
        raise ValueError("enqueue options do not match the enqueues")
    if len(rest) > 1:
        if len(write.enqueue_headers) != len(write.enqueues):
            raise ValueError("item headers do not match the enqueues")
        for headers, (_, values) in zip(write.enqueue_headers, write.enqueues, strict=True):
            if headers is not None and len(headers) != len(values):
                raise ValueError("item headers do not match the items")
    return write


def _decode_named(raw: Any, kind: type) -> tuple[tuple[str, tuple[Any, ...]], ...]:
    """Pairs (queue, values) whose values are all exactly of ``kind`` (bytes: items; int: ids).
    Loops rather than nested generators: this runs for every transaction on every replica."""
    pairs = []
    for pair in _seq(raw):
        queue, values = pair
        if not isinstance(queue, str):
            raise ValueError(f"expected str, got {type(queue).__name__}")
        values = tuple(_seq(values))
        for v in values:
            if type(v) is not kind:
                raise ValueError(f"expected {kind.__name__}, got {type(v).__name__}")
        pairs.append((queue, values))
    return tuple(pairs)


def _decode_enqueue_headers(raw: Any) -> tuple[Headers | None, ...] | None:
    return None if raw is None else tuple(None if h is None else decode_headers(h) for h in _seq(raw))


def decode_headers(raw: Any) -> Headers:
    """An item's headers as the log or a snapshot holds them: pairs of strings. Keys are interned:
    the same few keys (a ``traceparent``...) on a million items are one string, not a million."""
    pairs = []
    for pair in _seq(raw):
        key, value = _seq(pair)
        pairs.append((sys.intern(_str(key)), _str(value)))
    return tuple(pairs)


def _decode_options(raw: Any) -> EnqueueOptions | None:
    if raw is None:
        return None
    priority, delay_ms, ttl_ms = _seq(raw)
    return EnqueueOptions(priority=_natural(priority), delay_ms=_optional_natural(delay_ms),
                          ttl_ms=_optional_positive(ttl_ms))


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


def _natural(value: Any) -> int:
    if _int(value) < 0:
        raise ValueError(f"expected an int >= 0, got {value}")
    return int(value)


def _optional_natural(value: Any) -> int | None:
    return None if value is None else _natural(value)


def _str(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"expected str, got {type(value).__name__}")
    return value
