"""QueueView: the leader's volatile view of which items of one queue are available.

The replicated queue keeps every item until a commit removes it; which of those items open
transactions have locked, and which are visible yet, is the leader's business only and costs no
replication. Per priority, a view holds the available ids as ranges in id order (id order is
commit order) and a min-heap of ids given back by aborts (they go to the head of their priority:
they are older than anything still in the ranges). Besides: the locked ids, the delayed items
(a heap by the time they become visible), the items that expire (a heap by expiry), delivery
counts, and the dequeuers waiting for an item.

Ids that left the queue while available (expired, dead-lettered) stay in the ranges as
tombstones (``_gone``) until a take passes over them: cutting them out of a range would cost
more than skipping them once.

Times are the leader's clock in ms (``max(wall clock, state machine time)``), given by the caller:
the view never reads a clock.

Must not import: pysyncobj, lmdb, aiohttp.
"""

from __future__ import annotations

import asyncio
import heapq
from collections import deque
from dataclasses import dataclass, field

from rcq.server.core.state_machine import ViewSeed


@dataclass(slots=True)
class _Level:
    """The available ids of one priority."""

    ranges: deque[list[int]] = field(default_factory=deque)  # [next id, end id) in increasing order
    returned: list[int] = field(default_factory=list)  # heap of ids back at the head

    def count(self) -> int:
        return len(self.returned) + sum(end - first for first, end in self.ranges)

    def take(self, wanted: int, out: list[int]) -> None:
        returned = self.returned
        while returned and wanted > 0:
            out.append(heapq.heappop(returned))
            wanted -= 1
        ranges = self.ranges
        while ranges and wanted > 0:
            head = ranges[0]
            first, end = head
            stop = min(end, first + wanted)
            out.extend(range(first, stop))
            wanted -= stop - first
            if stop == end:
                ranges.popleft()
            else:
                head[0] = stop

    def add_range(self, first: int, count: int) -> None:
        if self.ranges and self.ranges[-1][1] == first:
            self.ranges[-1][1] = first + count
        else:
            self.ranges.append([first, first + count])


class QueueView:
    __slots__ = (
        "_delayed",
        "_expires_at",
        "_expiring",
        "_gone",
        "_levels",
        "_order",
        "_priority_of",
        "_waiters",
        "deliveries",
        "locked",
        "max_deliveries",
    )

    def __init__(self, max_deliveries: int | None = None) -> None:
        self._levels: dict[int, _Level] = {}
        self._order: list[int] = []  # priorities, highest first
        self._priority_of: dict[int, int] = {}  # item id -> priority, for priorities other than 0
        self._delayed: list[tuple[int, int]] = []  # heap of (visible_at_ms, item id)
        self._expiring: list[tuple[int, int]] = []  # heap of (expires_at_ms, item id)
        self._expires_at: dict[int, int] = {}  # item id -> expires_at_ms, for items that expire
        self._gone: set[int] = set()  # ids that left the queue while available: skipped by take
        self.locked: set[int] = set()
        self.deliveries: dict[int, int] = {}  # item id -> deliveries that did not commit, as known here
        self.max_deliveries = max_deliveries  # the queue's setting: deliveries are replicated when set
        self._waiters: list[asyncio.Future[None]] = []

    @classmethod
    def from_seed(cls, seed: ViewSeed, max_deliveries: int | None) -> QueueView:
        """A new leader's view of a queue (``at_limit`` items are not available: they must die)."""
        view = cls(max_deliveries)
        for priority in sorted(seed.ranges):
            level = view._level(priority)
            for first, end in seed.ranges[priority]:
                level.add_range(first, end - first)
                if priority:
                    view._priority_of.update(dict.fromkeys(range(first, end), priority))
        for visible_at_ms, item_id, priority in seed.delayed:
            view._delayed.append((visible_at_ms, item_id))
            if priority:
                view._priority_of[item_id] = priority
        heapq.heapify(view._delayed)
        view._expiring = list(seed.expiring)
        heapq.heapify(view._expiring)
        view._expires_at = {item_id: at for at, item_id in seed.expiring}
        view.deliveries = dict(seed.deliveries)
        return view

    def _level(self, priority: int) -> _Level:
        level = self._levels.get(priority)
        if level is None:
            level = self._levels[priority] = _Level()
            self._order = sorted(self._levels, reverse=True)
        return level

    # ------------------------------------------------------------- counts
    def available_count(self) -> int:
        return max(0, sum(level.count() for level in self._levels.values()) - len(self._gone))

    def delayed_count(self) -> int:
        return len(self._delayed)

    def priority_of(self, item_id: int) -> int:
        return self._priority_of.get(item_id, 0)

    # -------------------------------------------------------------- taking
    def take(self, max_items: int, now_ms: int = 0) -> tuple[list[int], list[int]]:
        """Lock and return up to ``max_items`` ids, highest priority first, head first; and the ids
        found past their expiry on the way (no longer available: the caller expires them)."""
        taken: list[int] = []
        expired: list[int] = []
        gone, expires_at = self._gone, self._expires_at
        for priority in self._order:
            level = self._levels[priority]
            while len(taken) < max_items:
                batch: list[int] = []
                level.take(max_items - len(taken), batch)
                if not batch:
                    break
                for item_id in batch:
                    if item_id in gone:
                        gone.discard(item_id)
                    elif item_id in expires_at and expires_at[item_id] <= now_ms:
                        expired.append(item_id)
                    else:
                        taken.append(item_id)
            if len(taken) >= max_items:
                break
        self.locked.update(taken)
        return taken, expired

    def give_back(self, item_ids: list[int]) -> None:
        """Unlock ids that are still in the queue: they return to the head of their priority."""
        if not item_ids:
            return
        for item_id in item_ids:
            self.locked.discard(item_id)
            heapq.heappush(self._level(self._priority_of.get(item_id, 0)).returned, item_id)
        self.wake_waiters()

    def release(self, item_ids: list[int]) -> None:
        """Unlock ids that leave the queue by a proposal under way (expiry, dead letter): they are
        not available, and are forgotten once it applies (or given back if it does not act)."""
        self.locked.difference_update(item_ids)

    def withhold(self, item_ids: list[int]) -> None:
        """Available ids a proposal under way will remove (a redrive): no take hands them out."""
        self._gone.update(item_ids)

    def forget(self, item_ids: list[int] | tuple[int, ...]) -> None:
        """Ids a replicated entry removed from the queue: unlock them, or skip them if available."""
        locked = self.locked
        for item_id in item_ids:
            if item_id in locked:
                locked.discard(item_id)
            else:
                self._gone.add(item_id)
            self._priority_of.pop(item_id, None)
            self._expires_at.pop(item_id, None)
            self.deliveries.pop(item_id, None)

    def forget_taken(self, item_ids: list[int]) -> None:
        """Ids already taken out of the ranges (locked, or handed to a proposal) that left the queue."""
        self.locked.difference_update(item_ids)
        for item_id in item_ids:
            self._priority_of.pop(item_id, None)
            self._expires_at.pop(item_id, None)
            self.deliveries.pop(item_id, None)

    def add_range(self, first: int, count: int, priority: int = 0, visible_at_ms: int = 0,
                  expires_at_ms: int | None = None, now_ms: int = 0) -> None:
        """Ids a commit appended: always above every id the view holds."""
        if count <= 0:
            return
        ids = range(first, first + count)
        if priority:
            self._priority_of.update(dict.fromkeys(ids, priority))
        if expires_at_ms is not None:
            self._expires_at.update(dict.fromkeys(ids, expires_at_ms))
            for item_id in ids:
                heapq.heappush(self._expiring, (expires_at_ms, item_id))
        if visible_at_ms > now_ms:
            for item_id in ids:
                heapq.heappush(self._delayed, (visible_at_ms, item_id))
            return
        self._level(priority).add_range(first, count)
        self.wake_waiters()

    # --------------------------------------------------------------- time
    def next_expiry_ms(self) -> int | None:
        """When the next item expires (None: none expires)."""
        return self._expiring[0][0] if self._expiring else None

    def next_visible_ms(self) -> int | None:
        """When the next delayed item becomes visible (None: none is delayed)."""
        return self._delayed[0][0] if self._delayed else None

    def promote(self, now_ms: int) -> int:
        """Delayed items whose time has come join the head of their priority; how many did."""
        delayed, gone = self._delayed, self._gone
        moved = 0
        while delayed and delayed[0][0] <= now_ms:
            _, item_id = heapq.heappop(delayed)
            if item_id in gone:
                gone.discard(item_id)
                continue
            heapq.heappush(self._level(self._priority_of.get(item_id, 0)).returned, item_id)
            moved += 1
        if moved:
            self.wake_waiters()
        return moved

    def due_expiries(self, now_ms: int) -> list[int]:
        """Ids past their expiry that nobody holds: the caller proposes their expiry. Locked ones
        are left to their transaction (committed: consumed; given back: expired then)."""
        expiring, expires_at, locked = self._expiring, self._expires_at, self.locked
        due: list[int] = []
        while expiring and expiring[0][0] <= now_ms:
            at, item_id = heapq.heappop(expiring)
            if expires_at.get(item_id) != at or item_id in locked:
                continue
            due.append(item_id)
        return due

    def expired_among(self, item_ids: list[int], now_ms: int) -> list[int]:
        expires_at = self._expires_at
        return [i for i in item_ids if i in expires_at and expires_at[i] <= now_ms]

    # ------------------------------------------------------------- waiters
    def clear(self) -> None:
        """The queue was purged or deleted: nothing is available or locked any more; waiters look again."""
        max_deliveries = self.max_deliveries
        waiters = self._waiters
        self.__init__(max_deliveries)  # type: ignore[misc]  # a reset in place: waiters keep their view
        self._waiters = waiters
        self.wake_waiters()

    @property
    def waiting(self) -> int:
        """Dequeues waiting for items (a long poll) on this queue now."""
        return sum(1 for future in self._waiters if not future.done())

    def waiter(self) -> asyncio.Future[None]:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(future)
        return future

    def wake_waiters(self) -> None:
        """Every waiting dequeue looks again."""
        waiters, self._waiters = self._waiters, []
        for future in waiters:
            if not future.done():
                future.set_result(None)

    def fail_waiters(self, error: BaseException) -> None:
        waiters, self._waiters = self._waiters, []
        for future in waiters:
            if not future.done():
                future.set_exception(error)
