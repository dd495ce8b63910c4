"""Ledger: the queues, the item id counter, the state's clock, and the totals the limits count.

Every change to the items goes through here (an append, a dequeue, a move to another queue, a
death, a clear), so that each queue's bytes and counters and the totals over all queues (what the
storage budget limits) always agree with the items held. The jobs that decide *whether* to change
the items (:mod:`~rcq.server.core.commits`, :mod:`~rcq.server.core.item_actions`,
:mod:`~rcq.server.core.queue_admin`) call these; none of them touches a total itself.

Ids come from one counter at apply time, so a queue's id order is its commit order. The clock is
the largest ``now_ms`` of the entries applied: delays and time to live become absolute times here,
when an enqueue (or a move) commits.

Must not import: asyncio, aiohttp, pysyncobj, lmdb, time, random, uuid, os.
"""

from __future__ import annotations

from rcq.server.core.commands import DEAD_REASONS, EnqueuedRange, EnqueueOptions, Headers, Limits
from rcq.server.core.queue import ItemMeta, Queue, QueueStats

# What one item costs in RAM besides its bytes: the bytes object's header, its id (an int
# object), a dict slot and a deque slot, measured with tracemalloc (docs/limits.md, "What an
# item costs"). A replicated rule: every node must count the same for the same entry.
ITEM_OVERHEAD_BYTES = 160
# What headers cost besides their keys' and values' UTF-8 bytes, about what tracemalloc shows for
# an item with one header (docs/limits.md): once per item that has any, its ItemMeta, the meta
# dict's slot and the headers tuple; then per header, the pair tuple and two str objects.
# Replicated rules, like the above.
HEADERS_ITEM_OVERHEAD_BYTES = 160
HEADER_OVERHEAD_BYTES = 128


def item_cost(items: int, item_bytes: int) -> int:
    """What ``items`` items of ``item_bytes`` bytes in all cost against the limits (negative: freed).
    An item's bytes are its value's and its headers' (:func:`headers_bytes`)."""
    return item_bytes + ITEM_OVERHEAD_BYTES * items


def headers_bytes(headers: Headers | None) -> int:
    """What an item's headers add to its bytes (0 for none): counted in every byte total and limit."""
    if not headers:
        return 0
    return HEADERS_ITEM_OVERHEAD_BYTES + sum(len(key.encode()) + len(value.encode()) + HEADER_OVERHEAD_BYTES
                                             for key, value in headers)


class Ledger:
    def __init__(self) -> None:
        self.queues: dict[str, Queue] = {}
        self.next_item_id = 1
        self.now_ms = 0
        self.items_total = 0
        self.bytes_total = 0

    # ----------------------------------------------------------------- reads
    @property
    def storage_cost(self) -> int:
        """What every queued item costs together, bookkeeping included (what the budget limits)."""
        return item_cost(self.items_total, self.bytes_total)

    def usage(self, queue_name: str) -> tuple[int, int]:
        """(items, cost) of a queue; (0, 0) when it does not exist."""
        queue = self.queues.get(queue_name)
        return (len(queue.items), item_cost(len(queue.items), queue.stats.bytes)) if queue is not None else (0, 0)

    def effective_limits(self, queue_name: str, limits: Limits) -> tuple[int, int]:
        """(max_items, max_bytes) that apply to a queue: its own settings, else the defaults in ``limits``."""
        queue = self.queues.get(queue_name)
        own_items, own_bytes = (queue.max_items, queue.max_bytes) if queue is not None else (None, None)
        return own_items or limits.queue_items_max, own_bytes or limits.queue_bytes_max

    def stats_of(self, queue: Queue) -> dict[str, int]:
        stats = queue.stats
        return {
            "count": len(queue.items),
            "delayed": queue.delayed_count(self.now_ms),  # items not visible yet at the state's time
            "bytes": stats.bytes,
            "cost_bytes": item_cost(len(queue.items), stats.bytes),
            **dict(zip(QueueStats.TOTALS, stats.totals(), strict=True)),
        }

    # --------------------------------------------------------------- changes
    def queue(self, queue_name: str) -> Queue:
        """The queue, created when there is none."""
        queue = self.queues.get(queue_name)
        if queue is None:
            queue = self.queues[queue_name] = Queue()
        return queue

    def append(self, queue_name: str, values: tuple[bytes, ...], options: EnqueueOptions | None,
               headers: tuple[Headers | None, ...] | None = None) -> EnqueuedRange:
        """Enqueue ``values`` at the tail of ``queue_name`` under new ids (``headers``: each item's,
        parallel to ``values``; None: no item has any)."""
        queue = self.queue(queue_name)
        meta = self._enqueue_meta(queue, options)
        first = self.next_item_id
        item_id = first
        added_bytes = 0
        for position, value in enumerate(values):
            item_headers = (headers[position] or None) if headers is not None else None  # (): none
            if meta is None and item_headers is None:
                queue.append(item_id, value, None)
            elif meta is None:
                queue.append(item_id, value, ItemMeta(headers=item_headers))
            else:
                queue.append(item_id, value, ItemMeta(
                    priority=meta.priority, visible_at_ms=meta.visible_at_ms, expires_at_ms=meta.expires_at_ms,
                    headers=item_headers))
            added_bytes += len(value) if item_headers is None else len(value) + headers_bytes(item_headers)
            item_id += 1
        self.next_item_id = item_id
        queue.note_enqueue_time(first, self.now_ms)
        queue.stats.bytes += added_bytes
        queue.stats.enqueued_total += len(values)
        self.items_total += len(values)
        self.bytes_total += added_bytes
        if meta is None:
            return EnqueuedRange(queue_name, first, len(values))
        return EnqueuedRange(queue_name, first, len(values), meta.priority, meta.visible_at_ms, meta.expires_at_ms)

    def _enqueue_meta(self, queue: Queue, options: EnqueueOptions | None) -> ItemMeta | None:
        """Absolute times from the options (or the queue's defaults) at this entry's time; None: plain."""
        settings = queue.settings
        priority = options.priority if options is not None else 0
        delay_ms = options.delay_ms if options is not None and options.delay_ms is not None \
            else settings.default_delay_ms
        ttl_ms = options.ttl_ms if options is not None and options.ttl_ms is not None else settings.default_ttl_ms
        priority = min(priority, settings.max_priority or 0)  # the setting may have shrunk since the enqueue
        if not priority and not delay_ms and ttl_ms is None:
            return None
        return ItemMeta(priority=priority, visible_at_ms=self.now_ms + delay_ms if delay_ms else 0,
                        expires_at_ms=None if ttl_ms is None else self.now_ms + ttl_ms)

    def dequeue(self, queue_name: str, item_ids: tuple[int, ...]) -> None:
        """A committed dequeue: the items leave for good (they must be there)."""
        queue = self.queues[queue_name]
        removed_bytes = 0
        for item_id in item_ids:
            removed_bytes += self._remove(queue, item_id)[1]
        queue.stats.bytes -= removed_bytes
        queue.stats.dequeued_total += len(item_ids)
        self.items_total -= len(item_ids)
        self.bytes_total -= removed_bytes
        queue.forget_old_times()

    @staticmethod
    def _remove(queue: Queue, item_id: int) -> tuple[bytes, int]:
        """Take an item out of ``queue``: its value and its bytes (the value's and its headers')."""
        extra = headers_bytes(queue.meta_of(item_id).headers)
        value = queue.remove(item_id)
        return value, len(value) + extra

    def move(self, queue: Queue, item_id: int, target_name: str, meta: ItemMeta) -> EnqueuedRange:
        """Move one item to the tail of ``target_name`` under a new id (storage does not change;
        ``meta`` carries the item's headers on)."""
        value, size = self._remove(queue, item_id)
        queue.stats.bytes -= size
        target = self.queue(target_name)
        new_id = self.next_item_id
        self.next_item_id += 1
        target.append(new_id, value, meta)
        target.note_enqueue_time(new_id, self.now_ms)
        target.stats.bytes += size
        target.stats.enqueued_total += 1
        return EnqueuedRange(target_name, new_id, 1, meta.priority, meta.visible_at_ms, meta.expires_at_ms)

    def kill(self, queue_name: str, queue: Queue, item_id: int, reason: str, note: str | None = None
             ) -> EnqueuedRange | None:
        """An item dies (``reason`` in DEAD_REASONS): to the queue's dead-letter queue, or dropped."""
        assert reason in DEAD_REASONS
        old = queue.meta_of(item_id)
        stats = queue.stats
        if reason == "expired":
            stats.expired_total += 1
        elif reason == "rejected":
            stats.rejected_total += 1
        else:
            stats.max_deliveries_total += 1
        target_name = queue.settings.dead_letter_queue
        if target_name is None or target_name == queue_name:
            _, size = self._remove(queue, item_id)
            stats.bytes -= size
            stats.dropped_total += 1
            self.items_total -= 1
            self.bytes_total -= size
            return None
        stats.dead_lettered_total += 1
        target = self.queue(target_name)
        ttl_ms = target.settings.default_ttl_ms
        # Dead items keep their priority (docs/queue-features.md): a move is not an enqueue, and redrive
        # gives it back to the source (clamped to the source's max_priority there).
        meta = ItemMeta(priority=old.priority,
                        expires_at_ms=None if ttl_ms is None else self.now_ms + ttl_ms,
                        dead_reason=reason, dead_source=queue_name, dead_deliveries=old.deliveries, dead_note=note,
                        headers=old.headers)
        return self.move(queue, item_id, target_name, meta)

    def redrive(self, queue: Queue, item_id: int, meta: ItemMeta) -> EnqueuedRange:
        """A dead item goes back to the queue it died in, as a fresh item there."""
        assert meta.dead_source is not None
        source = self.queue(meta.dead_source)
        ttl_ms = source.settings.default_ttl_ms
        queue.stats.redriven_total += 1
        fresh = ItemMeta(priority=min(meta.priority, source.settings.max_priority or 0),
                         expires_at_ms=None if ttl_ms is None else self.now_ms + ttl_ms, headers=meta.headers)
        return self.move(queue, item_id, meta.dead_source, fresh)

    def clear(self, queue_name: str) -> int:
        """Remove every item of an existing queue (a purge, or a delete's first step); how many left."""
        queue = self.queues[queue_name]
        bytes_before = queue.stats.bytes
        removed = queue.clear()
        self.items_total -= removed
        self.bytes_total -= bytes_before
        return removed

    def load(self, queue_name: str, item_id: int, value: bytes, meta: ItemMeta | None) -> None:
        """Put back an item read from a snapshot (items come in id order within each queue)."""
        queue = self.queue(queue_name)
        queue.append(item_id, value, meta)
        size = len(value) + (0 if meta is None else headers_bytes(meta.headers))
        queue.stats.bytes += size
        self.items_total += 1
        self.bytes_total += size
