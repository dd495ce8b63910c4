"""TransactionRecords: what the state machine remembers of committed units, for a while.

A retried commit must get the answer of the first attempt: each transaction's outcome is kept
(by transaction id) and each idempotency key of a committed unit (by key), in
:class:`~rcq.server.core.retention.TimedTable` s that forget by entry time with a guaranteed
minimum (docs/limits.md, "Remembering outcomes by time").

Keys come in two kinds, one namespace: a user's idempotency key is kept a day (at least 15
minutes), so a job replayed long after a crash commits nothing twice; a **retry key** (one
beginning with ``RETRY_KEY_PREFIX``, what the client library makes for its own one-request
transactions, which only its retries within seconds use) is kept 10 minutes (at least 2), in a
table of its own, so that a client committing thousands of single items a second does not fill
the day-long table (500,000 keys at 15 minutes' minimum: 555 keyed commits a second at most).
Retry keys have their table only once the cluster runs at feature level 3
(``retry_keys_on``); below it they are idempotency keys like any other, as older releases keep
them. A retried unit is looked up in both tables, whatever its key's kind.

Once an outcome is forgotten, "never committed" is no longer a safe answer for an older transaction
without one: the highest term of a forgotten transaction is kept (``forgotten_term``), and the
leader answers "unknown" below it.

Must not import: asyncio, aiohttp, pysyncobj, lmdb, time, random, uuid, os.
"""

from __future__ import annotations

from collections.abc import Iterable

from rcq.immutable import immutable
from rcq.limits import RETRY_KEY_PREFIX
from rcq.names import transaction_term
from rcq.server.core.commands import CommitUnit, UnitOutcome
from rcq.server.core.retention import TimedTable


@immutable
class TransactionOutcome:
    status: str  # "committed" or "rejected"
    index: int
    at_ms: int
    reason: str | None = None


@immutable
class KeyRecord:
    """An idempotency key: the index of the entry that committed under it."""

    index: int
    at_ms: int


def id_term(transaction_id: str) -> int:
    """The term in a transaction id (rcq.names); 0 when it has none."""
    return transaction_term(transaction_id) or 0


@immutable
class Retention:
    """How long a table keeps its entries, and how many it may hold (see TimedTable)."""

    retention_ms: int
    retention_min_ms: int
    entries_max: int


class TransactionRecords:
    def __init__(self, outcomes: Retention, keys: Retention, retry_keys: Retention) -> None:
        self.outcomes: TimedTable[TransactionOutcome] = TimedTable(
            outcomes.retention_ms, outcomes.retention_min_ms, outcomes.entries_max, on_forget=self._forgotten)
        self.forgotten_term = 0
        self.keys: TimedTable[KeyRecord] = TimedTable(keys.retention_ms, keys.retention_min_ms, keys.entries_max)
        self.retry_keys: TimedTable[KeyRecord] = TimedTable(
            retry_keys.retention_ms, retry_keys.retention_min_ms, retry_keys.entries_max)
        self.retry_keys_on = False  # the cluster's feature level has retry keys (the state machine sets it)

    def _forgotten(self, transaction_id: str) -> None:
        self.forgotten_term = max(self.forgotten_term, id_term(transaction_id))

    def _table_of(self, key: str) -> TimedTable[KeyRecord]:
        return self.retry_keys if self.retry_keys_on and key.startswith(RETRY_KEY_PREFIX) else self.keys

    def expire(self, now_ms: int) -> None:
        """Forget what is past its retention at an entry of time ``now_ms``."""
        self.keys.expire(now_ms)
        self.retry_keys.expire(now_ms)
        self.outcomes.expire(now_ms)

    def previous(self, unit: CommitUnit, index: int) -> UnitOutcome | None:
        """A retried commit (same idempotency key or same transaction ids) answers what happened first."""
        key = unit.idempotency_key
        if key is not None:
            index_then = self.key_index(key)
            if index_then is not None:
                return UnitOutcome("duplicate", index_then)
        transactions = unit.transactions
        if len(transactions) == 1 and transactions[0].transaction_id not in self.outcomes:
            return None  # the commonest case, on every replica for every commit: a first attempt
        seen = [self.outcomes.get(t.transaction_id) for t in transactions]
        if not any(seen):
            return None
        first = seen[0]
        if all(s is not None and s.status == "committed" for s in seen) and first is not None:
            return UnitOutcome("duplicate", first.index)
        if first is not None and first.status == "rejected" and all(s == first for s in seen):
            return UnitOutcome("rejected", first.index, reason=first.reason)
        return UnitOutcome("rejected", index, reason="transaction_reused")

    def room_problem(self, unit: CommitUnit, now_ms: int) -> str | None:
        """Make room for the unit's records (forgetting past the minimum retention); the reason
        code when there is none."""
        if not self.outcomes.make_room(len(unit.transactions), now_ms):
            return "outcomes_full"
        key = unit.idempotency_key
        if key is not None and not self._table_of(key).make_room(1, now_ms):
            return "idempotency_keys_full"
        return None

    def can_remember(self, transactions: int, key: str | None, now_ms: int) -> bool:
        """What :meth:`room_problem` would allow, changing nothing."""
        return self.outcomes.has_room(transactions, now_ms) and (
            key is None or self._table_of(key).has_room(1, now_ms))

    def record(self, unit: CommitUnit, outcome: TransactionOutcome) -> None:
        for transaction in unit.transactions:
            self.outcomes.put(transaction.transaction_id, outcome)
        key = unit.idempotency_key
        if key is not None and outcome.status == "committed":
            self._table_of(key).put(key, KeyRecord(outcome.index, outcome.at_ms))

    def outcome(self, transaction_id: str) -> TransactionOutcome | None:
        return self.outcomes.get(transaction_id)

    def key_index(self, key: str) -> int | None:
        """The index of the entry that committed under ``key`` (either kind); None: none remembered."""
        record = self.keys.get(key)
        if record is None:
            record = self.retry_keys.get(key)
        return record.index if record is not None else None

    def replace_all(self, outcomes: Iterable[tuple[str, TransactionOutcome]], forgotten_term: int,
                    keys: Iterable[tuple[str, KeyRecord]], retry_keys: Iterable[tuple[str, KeyRecord]]) -> None:
        """Discard every record and load these (oldest first), as a snapshot restore does."""
        self.outcomes.replace_all(iter(outcomes))
        self.forgotten_term = forgotten_term
        self.keys.replace_all(iter(keys))
        self.retry_keys.replace_all(iter(retry_keys))
