"""GroupCommitter: many transactions' commits share one Raft entry.

Commit units that arrive while the loop is busy are gathered and proposed as
one :class:`~rcq.server.core.commands.CommitBatch` at the next loop iteration, bounded in
units and bytes per entry; up to ``commits_in_flight_max`` entries are in
flight at once. Each unit's future gets its own outcome; bookkeeping of the
queues happens elsewhere, from the stream of applied entries.

Must not import: pysyncobj, lmdb, aiohttp.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

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


@dataclass(slots=True)
class _Pending:
    unit: CommitUnit | ItemsAction
    size_bytes: int
    future: asyncio.Future[Outcome]


class GroupCommitter:
    def __init__(self, replicator: Replicator, *, units_max: int, bytes_max: int,
                 in_flight_max: int, timeout_s: float, limits: Limits | None = None,
                 clock: Callable[[], int] | None = None) -> None:
        self._replicator = replicator
        self._clock = clock or (lambda: int(time.time() * 1000))  # entry time, ms
        self._limits = limits  # stamped on every entry: the state machine enforces them
        self._units_max = units_max
        self._bytes_max = bytes_max
        self._in_flight_max = in_flight_max
        self._timeout_s = timeout_s
        self._pending: deque[_Pending] = deque()
        self._in_flight = 0
        self._flush_scheduled = False
        self._term = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self.entries_proposed = 0
        self.units_proposed = 0
        self.on_entry: Callable[[int], None] | None = None  # units in each proposed entry (metrics)

    def start_term(self, term: int) -> None:
        """A new leadership: commits still waiting to be proposed can no longer be."""
        self._term = term
        pending, self._pending = self._pending, deque()
        for p in pending:
            if not p.future.done():
                p.future.set_exception(LeaderChanged())

    def commit(self, unit: CommitUnit | ItemsAction, size_bytes: int) -> asyncio.Future[Outcome]:
        """Propose ``unit`` (a commit, or a leader's item action) in the next entry; its future gets
        the unit's own outcome."""
        future: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        self._pending.append(_Pending(unit, size_bytes, future))
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)
        return future

    def _flush(self) -> None:
        self._flush_scheduled = False
        pending = self._pending
        while pending and self._in_flight < self._in_flight_max:
            batch: list[_Pending] = []
            size = 0
            while pending and len(batch) < self._units_max:
                if batch and size + pending[0].size_bytes > self._bytes_max:
                    break
                head = pending.popleft()
                batch.append(head)
                size += head.size_bytes
            self._in_flight += 1
            task = asyncio.get_running_loop().create_task(self._propose(batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _propose(self, batch: list[_Pending]) -> None:
        units = [p.unit for p in batch]
        command = CommitBatch(term=self._term, now_ms=self._clock(), units=tuple(units),
                              limits=self._limits)
        self.entries_proposed += 1
        self.units_proposed += len(units)
        if self.on_entry is not None:
            self.on_entry(len(units))
        try:
            result = await self._replicator.submit(command, self._timeout_s)
        except RcqError as exc:
            self._settle(batch, exc)
        except Exception as exc:  # a bug below us: every waiter must still get an answer
            self._settle(batch, InternalError(f"commit failed: {exc!r}"))
        else:
            if isinstance(result, BatchResult) and len(result.outcomes) == len(batch):
                for p, outcome in zip(batch, result.outcomes, strict=True):
                    if not p.future.done():
                        p.future.set_result(outcome)
            else:
                reason = result.reason if isinstance(result, ApplyFailed) else repr(result)
                self._settle(batch, InternalError(f"commit entry not applied: {reason}"))
        finally:
            self._in_flight -= 1
            if self._pending and not self._flush_scheduled:
                self._flush_scheduled = True
                asyncio.get_running_loop().call_soon(self._flush)

    @staticmethod
    def _settle(batch: list[_Pending], error: RcqError) -> None:
        for p in batch:
            if not p.future.done():
                p.future.set_exception(error)

    async def close(self) -> None:
        self.start_term(self._term)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
