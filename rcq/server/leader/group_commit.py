"""GroupCommitter: many transactions' commits share one Raft entry.

Commit units that arrive while the loop is busy are gathered and proposed as
one :class:`~rcq.server.core.commands.CommitBatch`, bounded in units and bytes per entry. The
depth in flight adapts to the load: with no entry in flight, what is pending is proposed at the
next loop iteration (a lone commit waits one round trip, no more); while entries are in flight,
units fill the next entry, which is proposed as soon as it is full (up to
``commits_in_flight_max`` entries in flight), or once a fraction of the recent commit round trip
has passed since the last proposal (at most PARTIAL_ENTRIES_PER_ROUND_TRIP partial entries per
round trip: a busy node, whose round trips grow, fills its entries more), or when the entries in
flight are applied. Every
replica pays per entry (receive, decrypt, journal, acknowledge, apply): under load, fuller entries
are what lets a node keep up. Each unit's future gets its own outcome; bookkeeping of the
queues happens elsewhere, from the stream of applied entries.

Must not import: pysyncobj, lmdb, aiohttp.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from rcq.errors import InternalError, LeaderChanged, RcqError
from rcq.server.core.commands import (
    ApplyFailed,
    BatchResult,
    CommitBatch,
    CommitUnit,
    ItemsAction,
    ItemsOutcome,
    Limits,
    UnitOutcome,
)
from rcq.server.raft.protocol import Replicator

Outcome = UnitOutcome | ItemsOutcome

# While entries are in flight, a partial entry waits until 1/N of the recent commit round trip has
# passed since the last proposal: a unit waits at most that much longer than alone, and entries
# leave at most N per round trip however many callers commit. N was 2 while fsync set the round
# trip (1 then halved 32 callers' throughput); now that CPU sets it, 1 fills entries with ~40%
# more commits (10.7 -> 14.7 at 32 callers) for ~40% more commits/s, and is no slower with 4.
PARTIAL_ENTRIES_PER_ROUND_TRIP = 1
ROUND_TRIP_WEIGHT = 0.2  # weight of each new commit's round trip in the running estimate


@dataclass(slots=True)
class _Pending:
    unit: CommitUnit | ItemsAction
    size_bytes: int
    future: asyncio.Future[Outcome]


class GroupCommitter:
    def __init__(self, replicator: Replicator, *, units_max: int, bytes_max: int,
                 in_flight_max: int, timeout_s: float, limits: Callable[[], Limits] | None = None,
                 clock: Callable[[], int] | None = None) -> None:
        self._replicator = replicator
        self._clock = clock or (lambda: int(time.time() * 1000))  # entry time, ms
        # Stamped on every entry, as they are when it is proposed (the storage allowance changes:
        # rcq.server.leader.admission): the state machine enforces them.
        self._limits = limits
        self._units_max = units_max
        self._bytes_max = bytes_max
        self._in_flight_max = in_flight_max
        self._timeout_s = timeout_s
        self._pending: deque[_Pending] = deque()
        self._pending_bytes = 0
        self._round_trip_s = 0.0  # running estimate of an entry's commit round trip
        self._last_proposed_s = 0.0  # monotonic time of the last proposal
        self._flush_timer: asyncio.TimerHandle | None = None  # a partial entry's flush, when due
        self._in_flight = 0
        self._flush_scheduled = False
        self._term = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._confirming: list[asyncio.Future[None]] = []  # read fences waiting for the next entry
        self.entries_proposed = 0
        self.units_proposed = 0
        self.on_entry: Callable[[int], None] | None = None  # units in each proposed entry (metrics)

    def start_term(self, term: int) -> None:
        """A new leadership: commits still waiting to be proposed can no longer be."""
        self._term = term
        pending, self._pending = self._pending, deque()
        self._pending_bytes = 0
        for p in pending:
            if not p.future.done():
                p.future.set_exception(LeaderChanged())
        confirming, self._confirming = self._confirming, []
        self._settle([], LeaderChanged(), confirming)

    def commit(self, unit: CommitUnit | ItemsAction, size_bytes: int) -> asyncio.Future[Outcome]:
        """Propose ``unit`` (a commit, or a leader's item action) in the next entry; its future gets
        the unit's own outcome."""
        future: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        self._pending.append(_Pending(unit, size_bytes, future))
        self._pending_bytes += size_bytes
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)
        return future

    def confirm(self) -> asyncio.Future[None]:
        """Resolves once an entry proposed from now on has committed in this term (fails with the
        entry's error, or LeaderChanged if the term ends first): then no leader of a later term
        had been elected when this was called, so what this leader read before it was the latest."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._confirming.append(future)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)
        return future

    def _flush(self) -> None:
        self._flush_scheduled = False
        pending = self._pending
        while (pending or self._confirming) and self._in_flight < self._in_flight_max:
            if self._in_flight and not self._full_entry_pending():
                wait_s = self._last_proposed_s + self._round_trip_s / PARTIAL_ENTRIES_PER_ROUND_TRIP - time.monotonic()
                if wait_s > 0:
                    # It fills meanwhile; the end of an entry in flight, or a full entry, flushes sooner.
                    if self._flush_timer is None:
                        self._flush_timer = asyncio.get_running_loop().call_later(wait_s, self._flush_on_time)
                    break
            batch: list[_Pending] = []
            size = 0
            while pending and len(batch) < self._units_max:
                if batch and size + pending[0].size_bytes > self._bytes_max:
                    break
                head = pending.popleft()
                batch.append(head)
                size += head.size_bytes
            self._pending_bytes -= size
            self._in_flight += 1
            self._last_proposed_s = time.monotonic()
            confirming, self._confirming = self._confirming, []  # asked before this entry: it answers them
            task = asyncio.get_running_loop().create_task(self._propose(batch, confirming))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _flush_on_time(self) -> None:
        self._flush_timer = None
        self._flush()

    def _full_entry_pending(self) -> bool:
        """Is there enough pending for a whole entry (no more would fit in it)?"""
        return len(self._pending) >= self._units_max or self._pending_bytes >= self._bytes_max

    async def _propose(self, batch: list[_Pending], confirming: list[asyncio.Future[None]]) -> None:
        units = [p.unit for p in batch]
        term = self._term
        command = CommitBatch(term=term, now_ms=self._clock(), units=tuple(units),
                              limits=self._limits() if self._limits is not None else None)
        self.entries_proposed += 1
        self.units_proposed += len(units)
        if self.on_entry is not None:
            self.on_entry(len(units))
        started_s = time.monotonic()
        try:
            result = await self._replicator.submit(command, self._timeout_s)
            self._round_trip_s += ROUND_TRIP_WEIGHT * (time.monotonic() - started_s - self._round_trip_s)
        except RcqError as exc:
            self._settle(batch, exc, confirming)
        except Exception as exc:  # a bug below us: every waiter must still get an answer
            self._settle(batch, InternalError(f"commit failed: {exc!r}"), confirming)
        else:
            if isinstance(result, BatchResult) and len(result.outcomes) == len(batch):
                for p, outcome in zip(batch, result.outcomes, strict=True):
                    if not p.future.done():
                        p.future.set_result(outcome)
                if term == self._term:
                    for future in confirming:
                        if not future.done():
                            future.set_result(None)
                else:  # committed, but this leadership is not the one that asked
                    self._settle([], LeaderChanged(), confirming)
            else:
                reason = result.reason if isinstance(result, ApplyFailed) else repr(result)
                self._settle(batch, InternalError(f"commit entry not applied: {reason}"), confirming)
        finally:
            self._in_flight -= 1
            if (self._pending or self._confirming) and not self._flush_scheduled:
                self._flush_scheduled = True
                asyncio.get_running_loop().call_soon(self._flush)

    @staticmethod
    def _settle(batch: list[_Pending], error: RcqError, confirming: Sequence[asyncio.Future[None]] = ()) -> None:
        """Fail every unit of ``batch`` and every read fence of ``confirming`` with ``error``."""
        futures: list[asyncio.Future[Any]] = [p.future for p in batch]
        for future in [*futures, *confirming]:
            if not future.done():
                future.set_exception(error)

    async def close(self) -> None:
        if self._flush_timer is not None:
            self._flush_timer.cancel()
            self._flush_timer = None
        self.start_term(self._term)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
