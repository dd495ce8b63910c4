"""One replicated queue: its items, their metadata, settings and counters.

Items live in an :class:`~rcq.server.core.item_store.ItemStore`: values by id, in id order (id
order is commit order), packed into chunks at a few bytes per item besides the value.

Everything else is paid for only by the items that use it:

* ``meta`` holds an :class:`ItemMeta` only for items with a priority, a delay, a time to live, a
  delivery count, a dead-letter record or headers; a plain item costs nothing more than before
  (headers are one more slot of the ItemMeta of the items that have some);
* enqueue times are a step function of the id (ids and entry times both only grow), kept as
  boundaries (first id of an entry, entry time) in two ``array('q')`` — 16 bytes per entry whose
  time differs from the previous one, pruned as the head moves on.

Must not import: asyncio, aiohttp, pysyncobj, lmdb, time, random, uuid, os.
"""

from __future__ import annotations

import heapq
from array import array
from bisect import bisect_right
from collections.abc import Iterator
from dataclasses import dataclass

from rcq.server.core.commands import Headers, QueueSettings
from rcq.server.core.item_store import ItemStore

_TIMES_COMPACT_AT = 4096  # pruned boundaries are deleted from the arrays in bulk past this many


@dataclass(slots=True)
class ItemMeta:
    """What an item carries besides its value, when it carries anything."""

    priority: int = 0
    visible_at_ms: int = 0  # 0: visible from its enqueue
    expires_at_ms: int | None = None
    deliveries: int = 0  # deliveries recorded in the replicated state (queues with max_deliveries)
    dead_reason: str | None = None  # set on an item in a dead-letter queue
    dead_source: str | None = None
    dead_deliveries: int = 0
    dead_note: str | None = None
    headers: Headers | None = None  # None: none (feature level 2); kept through every move

    def is_plain(self) -> bool:
        return (self.priority == 0 and self.visible_at_ms == 0 and self.expires_at_ms is None
                and self.deliveries == 0 and self.dead_reason is None and self.headers is None)

    def as_tuple(self) -> tuple[int | str | Headers | None, ...]:
        """The snapshot's fields: eight, and a ninth only for an item with headers (snapshot format
        4; a cluster at level 1 has none, so its format 3 snapshots stay as they were)."""
        fields = (self.priority, self.visible_at_ms, self.expires_at_ms, self.deliveries, self.dead_reason,
                  self.dead_source, self.dead_deliveries, self.dead_note)
        return fields if self.headers is None else (*fields, self.headers)


PLAIN = ItemMeta()  # what an item without metadata reads as (never mutated)


@dataclass(slots=True)
class QueueStats:
    enqueued_total: int = 0
    dequeued_total: int = 0
    purged_total: int = 0
    bytes: int = 0
    dead_lettered_total: int = 0  # items that left for the dead-letter queue, whatever the reason
    dropped_total: int = 0  # items that died without a dead-letter queue to go to
    expired_total: int = 0  # items that left because their time to live ran out
    rejected_total: int = 0  # items a transaction rejected
    max_deliveries_total: int = 0  # items that reached max_deliveries
    redriven_total: int = 0  # dead items this queue sent back to their sources

    TOTALS = ("enqueued_total", "dequeued_total", "purged_total", "dead_lettered_total", "dropped_total",
              "expired_total", "rejected_total", "max_deliveries_total", "redriven_total")

    def totals(self) -> tuple[int, ...]:
        return tuple(getattr(self, name) for name in self.TOTALS)


class Queue:
    __slots__ = ("_delayed", "_delayed_ids", "_times_ids", "_times_ms", "_times_start", "items", "max_bytes",
                 "max_items", "meta", "settings", "stats")

    def __init__(self, max_items: int | None = None, max_bytes: int | None = None,
                 settings: QueueSettings | None = None) -> None:
        self.items = ItemStore()
        self.meta: dict[int, ItemMeta] = {}
        self.stats = QueueStats()
        self.max_items = max_items  # None: the default the entry's limits carry
        self.max_bytes = max_bytes
        self.settings = settings or QueueSettings()
        self._times_ids = array("q")
        self._times_ms = array("q")
        self._times_start = 0
        # Delayed items, to count them without a scan (stats, metrics and the status page ask often,
        # under the state machine's lock): a heap by visible_at, and which of its ids are still
        # here and not yet visible. Derived state: not in snapshots or the digest.
        self._delayed: list[tuple[int, int]] = []
        self._delayed_ids: set[int] = set()

    # ----------------------------------------------------------------- items
    def append(self, item_id: int, value: bytes, meta: ItemMeta | None) -> None:
        self.items.append(item_id, value)
        if meta is not None and not meta.is_plain():
            self.meta[item_id] = meta
            if meta.visible_at_ms:
                heapq.heappush(self._delayed, (meta.visible_at_ms, item_id))
                self._delayed_ids.add(item_id)

    def remove(self, item_id: int) -> bytes:
        """Take an item out and return its value."""
        value = self.items.pop(item_id)
        self.meta.pop(item_id, None)
        self._delayed_ids.discard(item_id)
        return value

    def delayed_count(self, now_ms: int) -> int:
        """Items not visible yet at ``now_ms`` (amortised O(log n) per item, never a scan)."""
        delayed, ids = self._delayed, self._delayed_ids
        while delayed and delayed[0][0] <= now_ms:
            ids.discard(heapq.heappop(delayed)[1])
        if not ids:
            delayed.clear()  # only entries of items that left before their time remain
        return len(ids)

    def meta_of(self, item_id: int) -> ItemMeta:
        return self.meta.get(item_id, PLAIN)

    def own_meta(self, item_id: int) -> ItemMeta:
        """The item's metadata, created when it has none, to be changed in place."""
        meta = self.meta.get(item_id)
        if meta is None:
            meta = self.meta[item_id] = ItemMeta()
        return meta

    def live_ids(self) -> Iterator[int]:
        return self.items.ids()

    def clear(self) -> int:
        removed = len(self.items)
        self.items.clear()
        self.meta.clear()
        self._delayed, self._delayed_ids = [], set()
        self.stats.bytes = 0
        self._times_ids, self._times_ms, self._times_start = array("q"), array("q"), 0
        return removed

    # ----------------------------------------------------------------- times
    def note_enqueue_time(self, first_id: int, at_ms: int) -> None:
        """Items from ``first_id`` on were appended by an entry of time ``at_ms``."""
        ms = self._times_ms
        if len(ms) > self._times_start and ms[-1] == at_ms:
            return
        self._times_ids.append(first_id)
        ms.append(at_ms)

    def enqueued_at_ms(self, item_id: int) -> int | None:
        """When the item's enqueue committed (entry time); None when unknown (a snapshot of an
        older version)."""
        position = bisect_right(self._times_ids, item_id, lo=self._times_start) - 1
        return self._times_ms[position] if position >= self._times_start else None

    def time_boundaries(self) -> tuple[list[int], list[int]]:
        start = self._times_start
        return self._times_ids[start:].tolist(), self._times_ms[start:].tolist()

    def restore_times(self, ids: list[int], times: list[int]) -> None:
        self._times_ids, self._times_ms, self._times_start = array("q", ids), array("q", times), 0

    def forget_old_times(self) -> None:
        """Items left: enqueue-time boundaries wholly below the head item describe no item any more."""
        head = self.items.first_id()
        ids, start, end = self._times_ids, self._times_start, len(self._times_ids)
        if head is None:
            start = max(start, end - 1)  # keep the last: the next entry may repeat its time
        else:
            while start + 1 < end and ids[start + 1] <= head:
                start += 1
        if start >= _TIMES_COMPACT_AT and start * 2 >= end:
            del self._times_ids[:start]
            del self._times_ms[:start]
            start = 0
        self._times_start = start
