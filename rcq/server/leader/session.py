"""One open transaction on the leader (a Session), its states, and what its verbs return.

A transaction is a server-side session: it buffers enqueues, holds the ids of the items it
dequeued (locked in the leader's queue views), and has a deadline. Ids carry the term that
created them (``<term hex>.<random>``), so any later leader can answer about a transaction it
never saw.

Must not import: pysyncobj, lmdb, aiohttp.
"""

from __future__ import annotations

import asyncio
import secrets
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from rcq.immutable import immutable
from rcq.names import transaction_term
from rcq.server.core.commands import EnqueueOptions, Headers


class State(StrEnum):
    OPEN = "open"
    COMMITTING = "committing"
    COMMITTED = "committed"
    ABORTED = "aborted"
    UNKNOWN = "unknown"  # commit proposed, outcome not known yet


@dataclass(eq=False, slots=True)
class Session:
    transaction_id: str
    term: int
    epoch: int
    label: str | None
    timeout_s: float
    deadline: float  # loop time
    created_ms: int
    client: str = ""  # whom per-client caps count it against: the principal, or the peer address
    owner: str = ""  # the principal that began it: only it may see or use it ("" without tokens)
    lifetime_deadline: float = float("inf")  # loop time past which no extend reaches
    state: State = State.OPEN
    # (queue, options) -> items, in the order the transaction enqueued them (None: plain items)
    enqueues: dict[tuple[str, EnqueueOptions | None], list[bytes]] = field(default_factory=dict)
    # the same key -> each item's headers, parallel to its ``enqueues`` list; only for the groups
    # where some item has headers (plain enqueues keep nothing here)
    enqueue_headers: dict[tuple[str, EnqueueOptions | None], list[Headers | None]] = field(default_factory=dict)
    enqueued_bytes: int = 0
    enqueued_sizes: dict[str, tuple[int, int]] = field(default_factory=dict)  # queue -> (items, bytes)
    dequeued: dict[str, list[int]] = field(default_factory=dict)
    dequeued_bytes: dict[str, int] = field(default_factory=dict)
    items_count: int = 0  # enqueued plus dequeued, against transaction_items_max
    unknown_since: float | None = None  # loop time its commit's outcome became unknown
    reserved: dict[str, tuple[int, int]] | None = None  # growth reserved while its commit is in flight
    dequeue_keys: dict[str, tuple[str, list[int]]] = field(default_factory=dict)
    # key -> done when the dequeue sent with that key ends: one sent again meanwhile waits for it
    dequeues_running: dict[str, asyncio.Future[None]] = field(default_factory=dict)
    # Dequeues holding items whose delivery entry is on its way (max_deliveries): no answer has
    # carried those items yet, so the transaction may not commit until they have answered.
    deliveries_running: int = 0
    enqueue_keys: dict[str, tuple[str, int]] = field(default_factory=dict)  # key -> (queue, items)
    commit_future: asyncio.Future[CommitResult] | None = None

    def enqueued_queues(self) -> set[str]:
        return {queue for queue, _ in self.enqueues}

    def describe(self, now: float) -> dict[str, Any]:
        return {
            "transaction_id": self.transaction_id,
            "state": self.state.value,
            "label": self.label,
            "timeout_s": self.timeout_s,
            "expires_in_s": round(max(0.0, self.deadline - now), 3),
            "created_ms": self.created_ms,
            "enqueued": sum(len(v) for v in self.enqueues.values()),
            "dequeued": sum(len(v) for v in self.dequeued.values()),
        }

    def drop_held(self, queue: str, items: list[DequeuedItem]) -> None:
        """Items that are no longer this transaction's (rejected, dead, gone, or not handed out)."""
        dropped = {item.item_id for item in items}
        held = self.dequeued.get(queue, [])
        held[:] = [i for i in held if i not in dropped]
        self.dequeued_bytes[queue] = self.dequeued_bytes.get(queue, 0) - sum(len(item.value) for item in items)
        self.items_count -= len(items)

    def growth(self) -> dict[str, tuple[int, int]]:
        """queue -> (items, item bytes) this transaction's commit adds (negative: removes)."""
        growth = dict(self.enqueued_sizes)
        for queue, ids in self.dequeued.items():
            items, item_bytes = growth.get(queue, (0, 0))
            growth[queue] = (items - len(ids), item_bytes - self.dequeued_bytes.get(queue, 0))
        return growth


@dataclass(slots=True)
class AnswerBudget:
    """Item bytes one HTTP answer may still carry, shared by every dequeue of that request (a
    ``/v1/execute`` of many dequeues, a ``/v1/batch``): one request, one bounded answer."""

    remaining: int
    answered: bool = False  # an item is in the answer already: the next must fit (the first always does)

    @property
    def exhausted(self) -> bool:
        return self.answered and self.remaining <= 0


@immutable
class CommitResult:
    transaction_ids: tuple[str, ...]
    index: int
    duplicate: bool  # an earlier commit with the same idempotency key / ids already applied
    enqueued: int
    dequeued: int


@immutable
class DeadLetter:
    """Why an item in a dead-letter queue died, and where it came from."""

    reason: str
    source_queue: str
    delivery_count: int
    note: str | None = None


@immutable
class DequeuedItem:
    item_id: int
    queue: str
    value: bytes
    delivery_count: int = 0  # earlier deliveries that ended without a commit
    priority: int = 0
    enqueued_at_ms: int | None = None
    dead_letter: DeadLetter | None = None
    expires_at_ms: int | None = None  # when it leaves unless a commit takes it first (None: never)
    headers: Headers | None = None  # None: it has none


@immutable
class EnqueueStep:
    """One enqueue of a one-request transaction (:meth:`TransactionManager.execute`)."""

    queue: str
    values: list[bytes]
    options: EnqueueOptions | None = None
    headers: list[Headers | None] | None = None  # each item's, parallel to ``values`` (None: none has any)


@immutable
class DequeueStep:
    """One dequeue of a one-request transaction (:meth:`TransactionManager.execute`)."""

    queue: str
    max_items: int = 1
    wait_ms: int = 0


@immutable
class Executed:
    """What a one-request transaction did: per step, how many items it enqueued, or the items it
    dequeued (none when the commit was a duplicate: this run's dequeues did not apply)."""

    transaction_id: str
    commit: CommitResult
    steps: list[int | list[DequeuedItem]]


class RandomHex:
    """Unguessable hex strings from a pool of random bytes refilled ``pool`` strings at a time: a
    profile of the leader under single-item transactions put 4.8% of its samples in
    ``secrets.token_hex`` (one getrandom call per transaction id)."""

    __slots__ = ("_buffer", "_nbytes", "_pool", "_position")

    def __init__(self, nbytes: int, pool: int = 512) -> None:
        self._nbytes, self._pool = nbytes, pool
        self._buffer = b""
        self._position = 0

    def next(self) -> str:
        if self._position + self._nbytes > len(self._buffer):
            self._buffer, self._position = secrets.token_bytes(self._nbytes * self._pool), 0
        start = self._position
        self._position = start + self._nbytes
        return self._buffer[start:self._position].hex()


def term_of(transaction_id: str) -> int | None:
    """The term encoded in a transaction id (rcq.names), None if it has none."""
    return transaction_term(transaction_id)
