"""LoopCalls: calls from pysyncobj's tick thread to the event loop, in order, one wake-up per burst.

Every applied entry and every proposal's answer crosses from the tick thread to the loop. Each
``call_soon_threadsafe`` writes a byte to the loop's self-pipe and wakes it; py-spy showed that
write as the largest single cost of a follower's apply under load (15% of its busy samples).
Here the calls queue up and one scheduled drain runs them all: a burst of entries costs one
wake-up, and the order of the calls is the order they were made (an entry is delivered before
the answer to its proposal, as with call_soon_threadsafe alone).

A call that may wait (:meth:`LoopCalls.call_unhurried`: an entry a follower applied, which its
loop only notes) is queued in the same order without waking the loop: the next ordinary call's
drain runs it first, or the loop's own periodic :meth:`LoopCalls.run_queued`. A follower under
load applies an entry every few milliseconds; it now wakes its loop for them a few times a second.

Must not import: anything of rcq's, pysyncobj.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)


class LoopCalls:
    """Runs callbacks on one event loop in the order they were queued, from any thread."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._calls: collections.deque[tuple[Callable[..., None], tuple[Any, ...]]] = collections.deque()
        self._drain_scheduled = False

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """The loop the calls run on (set once, before any call)."""
        self._loop = loop

    def call(self, callback: Callable[..., None], *args: Any) -> None:
        """Run ``callback(*args)`` on the loop after every call queued before it. Any thread;
        RuntimeError when the loop is closed (as call_soon_threadsafe), nothing when unbound."""
        loop = self._loop
        if loop is None:
            return
        self._calls.append((callback, args))
        # The drain clears the flag before it takes calls: a call queued after the drain took its
        # last one finds the flag clear and schedules the next drain (the GIL orders the two).
        if not self._drain_scheduled:
            self._drain_scheduled = True
            try:
                loop.call_soon_threadsafe(self._drain)
            except RuntimeError:
                self._drain_scheduled = False
                raise

    def call_unhurried(self, callback: Callable[..., None], *args: Any) -> None:
        """Queue ``callback(*args)`` in order like :meth:`call`, without waking the loop: it runs
        at the next drain or :meth:`run_queued`. Any thread; nothing when unbound."""
        if self._loop is None:
            return
        self._calls.append((callback, args))

    def run_queued(self) -> None:
        """On the loop: run what is queued now (the loop calls it periodically, so that unhurried
        calls never wait longer than that period). A drain already scheduled still runs."""
        self._run(len(self._calls))

    def _drain(self) -> None:
        self._drain_scheduled = False
        # Only what is queued now: calls queued meanwhile have scheduled their own drain, and
        # other callbacks of the loop run in between.
        self._run(len(self._calls))

    def _run(self, count: int) -> None:
        calls = self._calls
        for _ in range(min(count, len(calls))):
            callback, args = calls.popleft()
            try:
                callback(*args)
            except Exception:
                logger.exception("a call from the Raft thread failed")
