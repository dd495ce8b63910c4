"""QueueView: the leader's volatile view of which items of one queue are available.

The replicated queue keeps every item until a commit removes it; which of
those items open transactions have locked is the leader's business only and
costs no replication. A view holds the available ids as ranges in id order
(id order is commit order), a min-heap of ids given back by aborts (they go to
the head: they are older than anything still in the ranges), the set of
locked ids, and the dequeuers waiting for an item.

Must not import: pysyncobj, lmdb, aiohttp.
"""

from __future__ import annotations

import asyncio
import heapq
from collections import deque


class QueueView:
    __slots__ = ("_ranges", "_returned", "_waiters", "locked")

    def __init__(self) -> None:
        self._ranges: deque[list[int]] = deque()  # [next id, end id) in increasing order
        self._returned: list[int] = []  # heap of ids back from aborts
        self.locked: set[int] = set()
        self._waiters: list[asyncio.Future[None]] = []

    @classmethod
    def from_ranges(cls, ranges: list[tuple[int, int]]) -> QueueView:
        view = cls()
        view._ranges.extend([first, end] for first, end in ranges)
        return view

    def available_count(self) -> int:
        return len(self._returned) + sum(end - first for first, end in self._ranges)

    def take(self, max_items: int) -> list[int]:
        """Lock and return up to ``max_items`` ids, head first."""
        taken: list[int] = []
        returned = self._returned
        while returned and len(taken) < max_items:
            taken.append(heapq.heappop(returned))
        ranges = self._ranges
        while ranges and len(taken) < max_items:
            head = ranges[0]
            first, end = head
            stop = min(end, first + max_items - len(taken))
            taken.extend(range(first, stop))
            if stop == end:
                ranges.popleft()
            else:
                head[0] = stop
        self.locked.update(taken)
        return taken

    def give_back(self, item_ids: list[int]) -> None:
        """Unlock ids that are still in the queue: they return to the head."""
        if not item_ids:
            return
        for item_id in item_ids:
            self.locked.discard(item_id)
            heapq.heappush(self._returned, item_id)
        self._wake()

    def forget(self, item_ids: list[int]) -> None:
        """Unlock ids a commit removed from the queue."""
        self.locked.difference_update(item_ids)

    def add_range(self, first: int, count: int) -> None:
        """Ids a commit appended: always above every id the view holds."""
        if count <= 0:
            return
        if self._ranges and self._ranges[-1][1] == first:
            self._ranges[-1][1] = first + count
        else:
            self._ranges.append([first, first + count])
        self._wake()

    def clear(self) -> None:
        """The queue was purged or deleted: nothing is available or locked any more; waiters look again."""
        self._ranges.clear()
        self._returned = []
        self.locked.clear()
        self._wake()

    def waiter(self) -> asyncio.Future[None]:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(future)
        return future

    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, []
        for future in waiters:
            if not future.done():
                future.set_result(None)

    def fail_waiters(self, error: BaseException) -> None:
        waiters, self._waiters = self._waiters, []
        for future in waiters:
            if not future.done():
                future.set_exception(error)
