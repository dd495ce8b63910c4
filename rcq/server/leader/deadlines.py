"""The deadline reaper: expires open transactions whose deadline passed.

A heap of ``(deadline, transaction id)``; extending a transaction pushes a new entry, and a
popped entry whose transaction is gone or was extended is skipped. Such stale entries would pile
up (a client extending in a loop, or many short transactions with long deadlines), so the heap is
rebuilt from the live sessions whenever it holds more than twice as many entries as there are
sessions (plus slack): its size stays O(open transactions), at an amortised O(1) per schedule.
The reaper sleeps until the earliest deadline (at most a second) and is woken when an earlier one
is scheduled.

Must not import: pysyncobj, lmdb, aiohttp.
"""

from __future__ import annotations

import asyncio
import heapq
from collections.abc import Callable, Iterable

from rcq.server.leader.session import Session

WAKE_AT_LEAST_EVERY_S = 1.0
STALE_SLACK = 1024  # entries allowed beyond twice the live sessions before a rebuild


class DeadlineReaper:
    def __init__(self, find: Callable[[str], Session | None], expire: Callable[[Session], None],
                 live: Callable[[], Iterable[Session]] | None = None) -> None:
        """``find`` returns the open session of an id (or None); ``expire`` ends one whose deadline
        passed; ``live`` lists the sessions that may still need a deadline (for rebuilds)."""
        self._find = find
        self._expire = expire
        self._live = live
        self._deadlines: list[tuple[float, str]] = []
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._reap_forever(), name="rcq-deadlines")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def clear(self) -> None:
        self._deadlines = []

    def schedule(self, session: Session) -> None:
        first = self._deadlines[0][0] if self._deadlines else None
        heapq.heappush(self._deadlines, (session.deadline, session.transaction_id))
        if first is None or session.deadline < first:
            self._wakeup.set()
        if self._live is not None and len(self._deadlines) > STALE_SLACK:
            sessions = list(self._live())
            if len(self._deadlines) > 2 * len(sessions) + STALE_SLACK:
                self._deadlines = [(s.deadline, s.transaction_id) for s in sessions]
                heapq.heapify(self._deadlines)

    def __len__(self) -> int:
        return len(self._deadlines)

    def expire_due(self, now: float) -> None:
        while self._deadlines and self._deadlines[0][0] <= now:
            _deadline, transaction_id = heapq.heappop(self._deadlines)
            session = self._find(transaction_id)
            if session is not None and session.deadline <= now:
                self._expire(session)

    async def _reap_forever(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            now = loop.time()
            self.expire_due(now)
            wait_s = min(WAKE_AT_LEAST_EVERY_S, self._deadlines[0][0] - now) if self._deadlines else WAKE_AT_LEAST_EVERY_S
            self._wakeup.clear()
            # asyncio.timeout, not wait_for: 3.11's wait_for swallows a cancellation that
            # arrives just as the event is set, and the reaper would never stop.
            try:
                async with asyncio.timeout(max(wait_s, 0.001)):
                    await self._wakeup.wait()
            except TimeoutError:
                pass
