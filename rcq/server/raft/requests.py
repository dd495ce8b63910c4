"""Requests from the event loop's thread to pysyncobj's tick thread, and their answers.

pysyncobj's state and sockets belong to its tick thread. The loop's thread reaches it in two ways:
work queued for the tick thread's next tick (:meth:`RaftRequests.on_next_tick`), and pysyncobj's
own thread-safe requests (a proposal, a membership change), answered by a callback on the tick
thread. :meth:`RaftRequests.answer_of` waits for that answer on the loop, bounded: a callback may
never come (docs/raft-hazards.md, H7). :meth:`RaftRequests.error_for` says what each of
pysyncobj's fail reasons means to the caller. The replicator owns one RaftRequests and shares it
with its hand-over (rcq.server.raft.hand_over).

Must not import: lmdb, aiohttp, rcq.server.leader.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from pysyncobj import FAIL_REASON, SyncObj

from rcq.errors import CommitOutcomeUnknown, LeaderChanged, NoLeader, NotLeader, Unavailable
from rcq.server.config import NodeConfig
from rcq.server.raft.internals import is_leader
from rcq.server.raft.loop_calls import LoopCalls
from rcq.server.raft.protocol import Replicator, known_nodes

logger = logging.getLogger(__name__)

_FAIL_REASON_NAMES = {value: name for name, value in vars(FAIL_REASON).items() if name.isupper()}


def _resolve(future: asyncio.Future[tuple[Any, int]], result: Any, fail_reason: int) -> None:
    """Complete a request's future on the loop; must never raise (H2)."""
    if not future.done():  # e.g. cancelled by the request's timeout
        future.set_result((result, fail_reason))


class RaftRequests:
    """The way from the loop's thread to one node's pysyncobj and back."""

    def __init__(self, config: NodeConfig, node: Replicator,
                 running: Callable[[], tuple[SyncObj, asyncio.AbstractEventLoop]], to_loop: LoopCalls) -> None:
        """``node`` says who leads (NotLeader names it); ``running`` gives the node's pysyncobj and
        loop, or raises Unavailable when the node is not running; answers reach the loop through
        ``to_loop``, in order with the applied entries."""
        self._config = config
        self._node = node
        self._running = running
        self._to_loop = to_loop
        self._pending: set[asyncio.Future[tuple[Any, int]]] = set()
        # Work for the tick thread (it owns pysyncobj's state and sockets), run at its next tick.
        self._tick_tasks: collections.deque[Callable[[], None]] = collections.deque()
        self._wake: Callable[[], None] | None = None

    def set_wake(self, wake: Callable[[], None]) -> None:
        """How to end the tick thread's wait at once (once pysyncobj runs; any thread)."""
        self._wake = wake

    def on_next_tick(self, task: Callable[[], None]) -> None:
        """Run ``task`` on the tick thread at its next tick, which it starts now rather than at the
        end of its wait (rcq.server.raft.tick_wait). Thread-safe: a deque append and a pipe write."""
        self._tick_tasks.append(task)
        if self._wake is not None:
            self._wake()

    def run_tick_tasks(self) -> None:
        """Tick thread (an on-tick callback): run the tasks queued so far, in order."""
        while self._tick_tasks:
            task = self._tick_tasks.popleft()
            try:
                task()
            except Exception:  # never end a tick with an exception (H2)
                logger.exception("tick task failed")

    def leader_sync_obj(self) -> SyncObj:
        """The node's pysyncobj, when this node leads; else NotLeader or NoLeader."""
        sync_obj, _loop = self._running()
        if not is_leader(sync_obj):
            raise self.not_leader_error()
        return sync_obj

    async def answer_of(self, start: Callable[[Callable[[Any, int], None]], None], timeout_s: float,
                        adjust: Callable[[int], int] | None = None) -> tuple[Any, int]:
        """Start a pysyncobj request with a callback and wait (bounded: callbacks may never come,
        H7) for its (result, fail reason); TimeoutError when none came in ``timeout_s``.
        ``adjust`` may change the fail reason, in the thread that calls back."""
        _sync_obj, loop = self._running()
        to_loop = self._to_loop
        future: asyncio.Future[tuple[Any, int]] = loop.create_future()

        def done(result: Any, fail_reason: int) -> None:
            # Tick thread, or this thread for QUEUE_FULL (pysyncobj calls back synchronously
            # then); LoopCalls is right for both.
            if adjust is not None:
                fail_reason = adjust(fail_reason)
            with contextlib.suppress(RuntimeError):  # loop closed: never raise into pysyncobj (H2)
                to_loop.call(_resolve, future, result, fail_reason)

        self._pending.add(future)
        try:
            start(done)
            return await asyncio.wait_for(future, timeout_s)
        finally:
            self._pending.discard(future)

    def end_pending(self) -> None:
        """The node stopped: every request still waiting ends with an unknown outcome."""
        for future in list(self._pending):
            _resolve(future, None, FAIL_REASON.UNKNOWN_OUTCOME)

    def error_for(self, fail_reason: int) -> Exception:
        """What a fail reason other than SUCCESS means to the caller."""
        if fail_reason == FAIL_REASON.QUEUE_FULL:
            return Unavailable("the Raft command queue is full; retry shortly")
        if fail_reason == FAIL_REASON.MISSING_LEADER:
            return NoLeader()
        if fail_reason == FAIL_REASON.NOT_LEADER:
            return self.not_leader_error()
        if fail_reason == FAIL_REASON.DISCARDED:
            # H7: the entry's log slot went to another leader's entry.
            return LeaderChanged("the leader changed before the commit; it was not applied")
        name = _FAIL_REASON_NAMES.get(fail_reason, str(fail_reason))
        return CommitOutcomeUnknown(f"Raft reported {name}; the commit may still apply")

    def not_leader_error(self) -> Exception:
        """NotLeader naming the leader this node knows of (with its HTTP address when known), or NoLeader."""
        leader = self._node.leader_raft_address()
        if leader is None or leader == self._config.raft_address:
            return NoLeader()
        known = known_nodes(self._config, self._node).get(leader)
        return NotLeader(f"this node is not the leader; {leader} is",
                         leader_url=known.http_url if known is not None else None)
