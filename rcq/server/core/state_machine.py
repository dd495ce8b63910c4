"""QueueStateMachine: the replicated state, driven only by committed log entries.

Why over 400 lines: one class answers every read of the replicated state under the replicator's lock; the applies are modules.

Pure and deterministic: the same entries applied in the same order give the same state and the
same results on every replica. No I/O, no clock (time comes in the command as the leader's
``now_ms``), no randomness, and no iteration over sets whose order could reach a result or a
snapshot.

:meth:`QueueStateMachine.apply` never raises: a malformed entry or a bug becomes an
:class:`~rcq.server.core.commands.ApplyFailed` value, because an exception in a replicated method
would be re-applied by pysyncobj on every tick, for ever.

This class decodes an entry, hands it to the job that applies it, and answers the reads. The jobs:

* :mod:`~rcq.server.core.commits`: a commit entry's units, each whole or not at all, within the
  storage limits (docs/limits.md);
* :mod:`~rcq.server.core.item_actions`: what a leader does to named items (deliver, expire,
  dead-letter, reject, redrive; docs/queue-features.md);
* :mod:`~rcq.server.core.queue_admin`: configure, purge, delete;
* the directory of members (docs/membership.md), here: a membership change records where a node is;
* :mod:`~rcq.server.core.directory`: the partition directory (feature level 4, docs/partitions.md);
* :mod:`~rcq.server.core.ledger` keeps the queues and their totals, :mod:`~rcq.server.core.outcomes`
  what is remembered of committed units, :mod:`~rcq.server.core.snapshot_format` the snapshot's
  content, :mod:`~rcq.server.core.view_seed` what a new leader's views start from.

Time (docs/queue-features.md): the state machine's clock is the largest ``now_ms`` of the entries
it applied. Delays and TTLs become absolute times when an enqueue commits; expiry, dead-lettering
and redrive are :class:`~rcq.server.core.commands.ItemsAction` units that a leader proposes, and
that apply only where the rule holds at the entry's time.

Not thread-safe: the replicator serialises applies and reads with a lock.

Must not import: asyncio, aiohttp, pysyncobj, lmdb, time, random, uuid, os.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from rcq.names import P0
from rcq.server.core import snapshot_format
from rcq.server.core.commands import (
    UNREADABLE_ENTRY,
    ApplyFailed,
    ApplyResult,
    Barrier,
    BarrierResult,
    Command,
    Limits,
    MalformedCommand,
    MemberRecord,
    MemberRecordResult,
    QueueChange,
    QueueChangeResult,
    QueueSettings,
    SetIdentity,
    SetIdentityResult,
    SetLevel,
    SetLevelResult,
    UnreadableCommand,
    decode,
)
from rcq.server.core.commits import apply_batch
from rcq.server.core.directory import Directory, DirectoryResult, NodePorts, PartitionChange, QueuePlacement
from rcq.server.core.features import LEVEL_BASE, LEVEL_MAX, LEVEL_OF_CLUSTER_IDENTITY, LEVEL_OF_PARTITIONS, LEVEL_OF_RETRY_KEYS
from rcq.server.core.ledger import ITEM_OVERHEAD_BYTES, Ledger, item_cost
from rcq.server.core.outcomes import KeyRecord, Retention, TransactionOutcome, TransactionRecords, id_term
from rcq.server.core.queue import ItemMeta, Queue
from rcq.server.core.queue_admin import (
    MAX_DELIVERIES_MAX,
    MAX_PRIORITY_MAX,
    apply_queue_change,
    dead_letter_users,
    settings_problem,
)
from rcq.server.core.snapshot_format import SNAPSHOT_FORMAT, SNAPSHOT_FORMATS_READ
from rcq.server.core.view_seed import ViewSeed, coalesce_ranges, view_seed

__all__ = [
    "IDEMPOTENCY_KEYS_MAX", "IDEMPOTENCY_RETENTION_MIN_MS", "IDEMPOTENCY_RETENTION_MS", "ITEM_ACTION_IDS_MAX",
    "ITEM_OVERHEAD_BYTES", "MAX_DELIVERIES_MAX", "MAX_PRIORITY_MAX", "OUTCOMES_MAX", "OUTCOME_RETENTION_MIN_MS",
    "OUTCOME_RETENTION_MS", "QUEUES_MAX", "SNAPSHOT_FORMAT", "SNAPSHOT_FORMATS_READ", "KeyRecord",
    "QueueStateMachine", "TransactionOutcome", "ViewSeed", "coalesce_ranges", "id_term", "item_cost",
]

# Limits are constants, not node configuration: every replica must apply the same rules or their
# states would diverge. The retention limits are read when a state machine is built, the others
# at each apply.
OUTCOME_RETENTION_MS = 10 * 60_000  # a transaction's outcome is kept this long after its commit...
OUTCOME_RETENTION_MIN_MS = 2 * 60_000  # ...and at least this long, when the table is full
OUTCOMES_MAX = 1_000_000
IDEMPOTENCY_RETENTION_MS = 24 * 3600_000  # an idempotency key is kept this long...
IDEMPOTENCY_RETENTION_MIN_MS = 15 * 60_000  # ...and at least this long, when the table is full
IDEMPOTENCY_KEYS_MAX = 500_000
RETRY_KEY_RETENTION_MS = 10 * 60_000  # a retry key (feature level 3; rcq.server.core.outcomes) is kept this long...
RETRY_KEY_RETENTION_MIN_MS = 2 * 60_000  # ...and at least this long, when the table is full
RETRY_KEYS_MAX = 1_000_000
QUEUES_MAX = 10_000
ITEM_ACTION_IDS_MAX = 10_000  # items one ItemsAction may name (redrive moves at most this many at once)


class QueueStateMachine:
    def __init__(self, level_max: int = LEVEL_MAX, partition: str = P0) -> None:
        # The highest feature level this replica reads; an entry or snapshot above it is unreadable.
        self._level_max = level_max
        # Its partition: p0 creates a queue at its first enqueue unless the directory places it
        # elsewhere; another only by a queue change (a PUT p0's leader signed). Replicas agree.
        self._partition = partition
        self._ledger = Ledger()
        self._records = TransactionRecords(
            outcomes=Retention(OUTCOME_RETENTION_MS, OUTCOME_RETENTION_MIN_MS, OUTCOMES_MAX),
            keys=Retention(IDEMPOTENCY_RETENTION_MS, IDEMPOTENCY_RETENTION_MIN_MS, IDEMPOTENCY_KEYS_MAX),
            retry_keys=Retention(RETRY_KEY_RETENTION_MS, RETRY_KEY_RETENTION_MIN_MS, RETRY_KEYS_MAX))
        self._last_index = 0
        self._barrier_term = 0
        # The cluster's directory: node id -> (Raft address, HTTP URL) of members recorded by
        # membership changes (docs/membership.md). Empty until the first change.
        self._members: dict[str, tuple[str, str]] = {}
        # The active feature level and the rcq version of the node that raised it (docs/upgrades.md).
        self._level = LEVEL_BASE
        self._level_writer: str | None = None
        # The cluster's identity (feature level 2; docs/backup.md): set once by an 'identity' entry,
        # renewed only by a restore (a new cluster). None: a level-1 cluster, or not given yet.
        self._cluster_id: str | None = None
        # The partition directory (feature level 4; docs/partitions.md): empty until used.
        self._directory = Directory()

    @property
    def _queues(self) -> dict[str, Queue]:
        """The queues by name (tests look inside them)."""
        return self._ledger.queues

    # ------------------------------------------------------------------ apply
    def apply(self, raw_command: Any, index: int) -> ApplyResult:
        """Apply one committed log entry at ``index``. Never raises."""
        return self.decode_and_apply(raw_command, index)[1]

    def decode_and_apply(self, raw_command: Any, index: int) -> tuple[Command | None, ApplyResult]:
        """:meth:`apply`, also returning the decoded command (None when malformed), so that
        whoever follows the stream of applied entries never decodes an entry twice."""
        try:
            command = decode(raw_command)
        except UnreadableCommand as exc:  # the replicator stops the node: nothing more is applied
            return None, ApplyFailed(reason=UNREADABLE_ENTRY, details={"error": str(exc)})
        except MalformedCommand as exc:
            self._last_index = max(self._last_index, index)
            return None, ApplyFailed(reason="malformed_command", details={"error": str(exc)})
        if isinstance(command, SetLevel) and command.level > self._level_max:
            return command, ApplyFailed(reason=UNREADABLE_ENTRY, details={
                "error": f"feature level {command.level} raised by rcq {command.writer_version}; "
                         f"this node reads levels up to {self._level_max}",
                "level": command.level, "writer_version": command.writer_version, "level_max": self._level_max})
        return command, self._apply_command(command, index)

    def _apply_command(self, command: Command, index: int) -> ApplyResult:
        ledger = self._ledger
        try:
            ledger.now_ms = max(ledger.now_ms, command.now_ms)
            # Expire first: what is past its retention at this entry's time is forgotten by it.
            self._records.expire(ledger.now_ms)
            if isinstance(command, Barrier):
                self._barrier_term = max(self._barrier_term, command.term)
                result: ApplyResult = BarrierResult(term=command.term)
            elif isinstance(command, QueueChange):
                result = self._apply_queue_change(command)
            elif isinstance(command, PartitionChange | NodePorts | QueuePlacement):
                result = self._apply_directory(command)
            elif isinstance(command, MemberRecord):
                result = self._apply_member_record(command)
            elif isinstance(command, SetLevel):
                result = self._apply_set_level(command)
            elif isinstance(command, SetIdentity):
                result = self._apply_set_identity(command)
            else:
                result = apply_batch(ledger, self._records, command, index, self._barrier_term,
                                     QUEUES_MAX, ITEM_ACTION_IDS_MAX, self.new_queue_refusal)
        except Exception as exc:  # a bug: report it, keep the node alive
            result = ApplyFailed(reason="apply_error", details={"error": repr(exc)})
        self._last_index = max(self._last_index, index)
        return result

    def _apply_queue_change(self, command: QueueChange) -> QueueChangeResult:
        if command.action == "configure" and command.queue not in self._ledger.queues \
                and self._directory.placed_elsewhere(command.queue) and command.term >= self._barrier_term:
            return QueueChangeResult("rejected", command.queue, command.action, reason="queue_placed_elsewhere")
        result = apply_queue_change(self._ledger, command, self._barrier_term, QUEUES_MAX)
        if command.action == "delete" and command.queue not in self._ledger.queues:
            self._directory.forget_queue(command.queue)
        return result

    def new_queue_refusal(self, queue: str) -> str | None:
        """Why an enqueue may not create ``queue`` here, or None: the leaders check each verb
        (rcq.server.leader.placement); this holds for a placement or delete applied since."""
        if self._partition != P0:
            return "queue_not_found"
        return "queue_placed_elsewhere" if self._directory.placed_elsewhere(queue) else None

    # ----------------------------------------------------------- the directory
    def _apply_member_record(self, record: MemberRecord) -> MemberRecordResult:
        if record.term < self._barrier_term:
            return MemberRecordResult("rejected", record.node_id, reason="stale_leader")
        self._members.pop(record.node_id, None)
        if record.action == "record":
            for node_id, (raft_address, _url) in list(self._members.items()):
                if raft_address == record.raft_address:
                    del self._members[node_id]  # the address now belongs to another node
            self._members[record.node_id] = (record.raft_address, record.http_url)
        return MemberRecordResult("done", record.node_id)

    def _apply_directory(self, command: PartitionChange | NodePorts | QueuePlacement) -> DirectoryResult:
        if self._level < LEVEL_OF_PARTITIONS:
            return DirectoryResult("rejected", "level_too_low")
        return self._directory.apply(command, self._barrier_term, self._ledger.queues.__contains__)

    @property
    def directory(self) -> Directory:
        """The partition directory (read it only under the replicator's lock, as every read)."""
        return self._directory

    # ----------------------------------------------------------- feature level
    def _apply_set_level(self, command: SetLevel) -> SetLevelResult:
        if command.term < self._barrier_term:
            return SetLevelResult("rejected", self._level, reason="stale_leader")
        if command.level < self._level:
            return SetLevelResult("rejected", self._level, reason="level_lowered")
        if command.level > self._level:
            self._set_level(command.level, command.writer_version)
        return SetLevelResult("done", self._level)

    def _set_level(self, level: int, writer: str | None) -> None:
        self._level, self._level_writer = level, writer
        self._records.retry_keys_on = level >= LEVEL_OF_RETRY_KEYS  # what the level changes in the apply

    def _apply_set_identity(self, command: SetIdentity) -> SetIdentityResult:
        # No stale-leader check: whichever identity commits first is the cluster's, from any term;
        # every later one is ignored, so racing leaders cannot make replicas disagree.
        if self._level < LEVEL_OF_CLUSTER_IDENTITY:
            return SetIdentityResult("rejected", self._cluster_id, reason="level_too_low")
        if self._cluster_id is not None:
            return SetIdentityResult("ignored", self._cluster_id)
        self._cluster_id = command.cluster_id
        return SetIdentityResult("done", self._cluster_id)

    @property
    def cluster_id(self) -> str | None:
        """The cluster's identity (None: feature level 1, or no leader has given it one yet)."""
        return self._cluster_id

    @property
    def level(self) -> int:
        """The cluster's active feature level: what may be written (rcq.server.core.features)."""
        return self._level

    @property
    def level_writer(self) -> str | None:
        """The rcq version of the node that raised the level to what it is (None: never raised)."""
        return self._level_writer

    def member_directory(self) -> dict[str, tuple[str, str]]:
        """node id -> (Raft address, HTTP URL) of every member a membership change recorded."""
        return dict(self._members)

    # ------------------------------------------------------- queue settings
    def settings_problem(self, queue_name: str, settings: QueueSettings) -> str | None:
        """Why ``settings`` cannot be given to ``queue_name`` now (a reason code), or None."""
        return settings_problem(self._ledger.queues, queue_name, settings)

    def dead_letter_users(self, queue_name: str) -> list[str]:
        """The queues whose dead-letter queue is ``queue_name``."""
        return dead_letter_users(self._ledger.queues, queue_name)

    # ---------------------------------------------------------------- queries
    @property
    def last_index(self) -> int:
        return self._last_index

    @property
    def barrier_term(self) -> int:
        return self._barrier_term

    @property
    def now_ms(self) -> int:
        return self._ledger.now_ms

    @property
    def storage_cost(self) -> int:
        """What every queued item costs together, bookkeeping included (what the budget limits)."""
        return self._ledger.storage_cost

    @property
    def outcomes_forgotten_term(self) -> int:
        return self._records.forgotten_term

    def table_sizes(self) -> dict[str, int]:
        ledger = self._ledger
        return {"queues": len(ledger.queues), "items": ledger.items_total, "item_bytes": ledger.bytes_total,
                "outcomes": len(self._records.outcomes), "idempotency_keys": len(self._records.keys),
                "retry_keys": len(self._records.retry_keys)}

    def can_remember(self, transactions: int, key: str | None, now_ms: int) -> bool:
        """Whether a unit of ``transactions`` (under ``key``, or none) would find room in the outcome
        and key tables at ``now_ms``: the leader asks before it proposes. Changes nothing."""
        return self._records.can_remember(transactions, key, now_ms)

    def usage(self, queue_name: str) -> tuple[int, int]:
        """(items, cost) of a queue; (0, 0) when it does not exist."""
        return self._ledger.usage(queue_name)

    def effective_limits(self, queue_name: str, limits: Limits) -> tuple[int, int]:
        """(max_items, max_bytes) that apply to a queue: its own settings, else the defaults in ``limits``."""
        return self._ledger.effective_limits(queue_name, limits)

    def deepest_queues(self, count_max: int | None = None) -> list[tuple[str, dict[str, int]]]:
        """(name, queue_stats) of the queues holding the most items (then by name), at most ``count_max``."""
        rows = [(name, self._ledger.stats_of(queue)) for name, queue in self._ledger.queues.items()]
        rows.sort(key=lambda row: (-row[1]["count"], row[0]))
        return rows if count_max is None else rows[:count_max]

    def queue_settings(self, queue_name: str) -> tuple[int | None, int | None] | None:
        """The queue's own (max_items, max_bytes), None for a default; None when there is no queue."""
        queue = self._ledger.queues.get(queue_name)
        return (queue.max_items, queue.max_bytes) if queue is not None else None

    def queue_features(self, queue_name: str) -> QueueSettings | None:
        """The queue's delivery, dead-letter, time and priority settings; None when there is no queue."""
        queue = self._ledger.queues.get(queue_name)
        return queue.settings if queue is not None else None

    def count(self, queue_name: str) -> int:
        queue = self._ledger.queues.get(queue_name)
        return len(queue.items) if queue is not None else 0

    def queue_names(self) -> list[str]:
        return sorted(self._ledger.queues)

    def queue_stats(self, queue_name: str) -> dict[str, int] | None:
        queue = self._ledger.queues.get(queue_name)
        return self._ledger.stats_of(queue) if queue is not None else None

    def item_meta(self, queue_name: str, item_ids: Iterable[int]) -> list[tuple[ItemMeta, int | None]]:
        """(metadata, enqueue time) of items (plain metadata for an item not there)."""
        queue = self._ledger.queues.get(queue_name)
        if queue is None:
            return [(ItemMeta(), None) for _ in item_ids]
        return [(queue.meta_of(i), queue.enqueued_at_ms(i)) for i in item_ids]

    def dead_items(self, queue_name: str, limit: int, source_queue: str | None = None,
                   exclude: set[int] | frozenset[int] = frozenset()) -> list[tuple[int, str]]:
        """Up to ``limit`` (item id, source queue) of dead items in ``queue_name``, head first, from
        ``source_queue`` only when given, leaving out ``exclude``."""
        queue = self._ledger.queues.get(queue_name)
        if queue is None:
            return []
        found: list[tuple[int, str]] = []
        for item_id in queue.live_ids():
            meta = queue.meta.get(item_id)
            if meta is None or meta.dead_source is None or item_id in exclude:
                continue
            if source_queue is None or meta.dead_source == source_queue:
                found.append((item_id, meta.dead_source))
                if len(found) >= limit:
                    break
        return found

    def view_seed(self, queue_name: str) -> ViewSeed:
        """What a new leader's view of the queue starts from, at the state machine's time."""
        return view_seed(self._ledger.queues.get(queue_name), self._ledger.now_ms)

    def item_ids(self, queue_name: str) -> list[int]:
        """Ids of the items in ``queue_name``, head first."""
        queue = self._ledger.queues.get(queue_name)
        return list(queue.live_ids()) if queue is not None else []

    def values(self, queue_name: str, item_ids: Iterable[int]) -> list[bytes | None]:
        queue = self._ledger.queues.get(queue_name)
        if queue is None:
            return [None for _ in item_ids]
        get = queue.items.get
        return [get(i) for i in item_ids]

    def contains(self, queue_name: str, item_id: int) -> bool:
        queue = self._ledger.queues.get(queue_name)
        return queue is not None and item_id in queue.items

    def outcome(self, transaction_id: str) -> TransactionOutcome | None:
        return self._records.outcome(transaction_id)

    def idempotency_key_index(self, key: str) -> int | None:
        return self._records.key_index(key)

    # -------------------------------------------------------------- snapshots
    def digest(self) -> str:
        """A hash of the whole replicated state: equal on replicas that applied the same log."""
        return snapshot_format.digest(self.snapshot_meta(), self.snapshot_items())

    def snapshot_meta(self) -> dict[str, Any]:
        """Everything but the items, as plain values (lists, tuples, ints, str)."""
        return snapshot_format.encode_meta(self._ledger, self._records, self._last_index, self._barrier_term,
                                           self._members, self._level, self._level_writer, self._cluster_id,
                                           None if self._directory.empty else self._directory.to_meta())

    def snapshot_items(self) -> Iterator[tuple[str, int, bytes]]:
        """Every item as (queue, item id, value), sorted by queue then id."""
        return snapshot_format.encode_items(self._ledger)

    def restore(self, meta: dict[str, Any], items: Iterable[tuple[str, int, bytes]]) -> None:
        """Discard all state and load a snapshot (``items`` sorted as snapshot_items yields them)."""
        decoded = snapshot_format.decode(meta, items, self._level_max)
        self._ledger = decoded.ledger
        self._last_index = decoded.last_index
        self._barrier_term = decoded.barrier_term
        self._records.replace_all(decoded.outcomes, decoded.outcomes_forgotten_term, decoded.keys,
                                  decoded.retry_keys)
        self._members = decoded.members
        self._set_level(decoded.level, decoded.level_writer)
        self._cluster_id = decoded.cluster_id
        self._directory = Directory.from_meta(decoded.directory)
