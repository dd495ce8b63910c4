"""LoopTicker: pysyncobj's ticks on the event loop's thread instead of a tick thread of their own.

With a tick thread, every commit crossed between two threads four times (the proposal to the
tick thread, each acknowledgement's wake-up, the applied entry back to the loop), and the two
threads took turns at one GIL: each wake-up waited for the other thread to let go (up to the
interpreter's switch interval, 5 ms, while the loop was busy). Here one thread does both:

* :class:`LoopPoller` is the poller pysyncobj is built with (``createPoller`` is swapped for the
  construction, as the journal's factory is): a socket pysyncobj subscribes is watched by the
  loop (``add_reader``/``add_writer``), and its callback runs on the loop when it is ready —
  that is where messages are received and decoded, as inside pysyncobj's own ``poll``. Every
  event asks for a tick.
* :class:`LoopTicker` runs pysyncobj's tick (``_onTick(0)``: commit, apply, send, propose; its
  poll returns at once) soon after an event or a proposal, and at the next timer otherwise (the
  leader's next heartbeat, a follower's election deadline), at the latest ``period_s`` after the
  last tick: the same deadlines the tick thread keeps (rcq.server.raft.tick_wait, one function).
* **The guard.** Whatever else the loop runs delays ticks; a loop busy for longer than an
  election timeout (a huge request, a long apply) would cost the cluster its leader, which the
  tick thread never did. A guard thread looks every :data:`GUARD_PERIOD_S`: when no tick ran for
  :data:`STALL_S`, it polls pysyncobj's sockets itself and ticks, until the loop ticks again.
  One lock keeps the loop's ticks and events and the guard's apart; what the guard changes in
  the sockets the loop watches reaches the loop through ``call_soon_threadsafe``.

What a tick does blocks the loop while it runs: with durability fsync that includes the Raft
log's fdatasync (a tenth of a millisecond on a quiet disk). Snapshots and digests are forked
children (H9), so the longest work of a tick is what it always was, and requests that arrive
meanwhile wait in the socket's buffer and fill the next entry.

Must not import: anything of rcq's but rcq.server.raft.internals and rcq.server.raft.tick_wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import select
import threading
import time
from collections.abc import Callable
from typing import Any

from pysyncobj import SyncObj
from pysyncobj.poller import POLL_EVENT_TYPE

from rcq.server.raft.internals import redirect_proposal_wake, tick_once
from rcq.server.raft.tick_wait import time_to_next_tick

logger = logging.getLogger(__name__)

Callback = Callable[[int, int], Any]

READ, WRITE, ERROR = POLL_EVENT_TYPE.READ, POLL_EVENT_TYPE.WRITE, POLL_EVENT_TYPE.ERROR
GUARD_PERIOD_S = 0.05  # how often the guard looks
STALL_S = 0.2  # a loop that ran no tick for this long gets the guard's ticks (elections take 0.8 s)


class LoopPoller:
    """pysyncobj's Poller interface on an asyncio loop. Subscriptions may change on the loop's
    thread (at once) or the guard's (the loop follows through call_soon_threadsafe)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._loop_thread = threading.get_ident()  # built on the loop's thread
        self.lock = threading.RLock()  # pysyncobj's state: one of the loop or the guard at a time
        self._callbacks: dict[int, Callback] = {}
        self._wanted: dict[int, int] = {}  # descriptor -> READ | WRITE, what pysyncobj asked for
        # A descriptor number is reused as soon as a socket closes: each unsubscribe starts a new
        # generation of it, so the loop never takes a new socket for the closed one it still watches.
        self._generation: dict[int, int] = {}
        self._watched: dict[int, tuple[int, int]] = {}  # descriptor -> (events, generation) the loop watches
        self.on_event: Callable[[], None] = lambda: None

    # ------------------------------------------------------------ pysyncobj's interface
    def subscribe(self, descr: int, callback: Callback, event_mask: int) -> None:
        # An error or a hang-up makes a descriptor readable (and writable) for the loop: pysyncobj
        # then reads nothing, or finds the socket's error, and disconnects, as on an ERROR event.
        wanted = event_mask & (READ | WRITE)
        if event_mask & ERROR:
            wanted |= READ
        self._callbacks[descr] = callback
        self._wanted[descr] = wanted
        self._follow(descr)

    def unsubscribe(self, descr: int) -> None:
        self._callbacks.pop(descr, None)
        self._wanted.pop(descr, None)
        self._generation[descr] = self._generation.get(descr, 0) + 1
        self._follow(descr)

    def poll(self, timeout: float) -> None:
        """Nothing to wait for in a tick: the loop (or the guard) delivers events as they come."""

    # ------------------------------------------------------------ the loop's side
    def on_loop_thread(self) -> bool:
        return threading.get_ident() == self._loop_thread

    def _follow(self, descr: int) -> None:
        if self.on_loop_thread():
            self._watch(descr)
        else:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nothing to watch any more
                self._loop.call_soon_threadsafe(self._watch, descr)

    def _watch(self, descr: int) -> None:
        """Make the loop watch ``descr`` for what pysyncobj wants now (loop thread)."""
        wanted, generation = self._wanted.get(descr, 0), self._generation.get(descr, 0)
        if self._watched.get(descr, (0, generation)) == (wanted, generation):
            return
        # Start over: what the loop holds for this number may be a socket closed since (pysyncobj
        # closes before it unsubscribes; the selector then forgets it, failing with EBADF/ENOENT).
        for remove in (self._loop.remove_reader, self._loop.remove_writer):
            with contextlib.suppress(OSError):
                remove(descr)
        self._watched.pop(descr, None)
        if not wanted:
            return
        with contextlib.suppress(OSError):  # closed again already: its unsubscribe comes next
            if wanted & READ:
                self._loop.add_reader(descr, self._ready, descr, READ)
            if wanted & WRITE:
                self._loop.add_writer(descr, self._ready, descr, WRITE)
            self._watched[descr] = (wanted, generation)

    def _ready(self, descr: int, event: int) -> None:
        with self.lock:
            self.dispatch(descr, event)
        self.on_event()

    def dispatch(self, descr: int, event: int) -> None:
        """Run pysyncobj's callback for an event on ``descr`` (the caller holds the lock)."""
        callback = self._callbacks.get(descr)  # None: unsubscribed since (a stale event of the loop)
        if callback is None:
            return
        try:
            callback(descr, event)
        except Exception:  # what pysyncobj's tick thread would have logged and carried on from
            logger.exception("a Raft connection's event failed")

    # ------------------------------------------------------------ the guard's side
    def poll_now(self) -> None:
        """Poll every descriptor pysyncobj wants, without waiting, and dispatch what is ready
        (the guard, holding the lock)."""
        poller = select.poll()
        for descr, wanted in list(self._wanted.items()):
            poller.register(descr, (select.POLLIN if wanted & READ else 0) | (select.POLLOUT if wanted & WRITE else 0))
        for descr, revents in poller.poll(0):
            event = (READ if revents & (select.POLLIN | select.POLLHUP | select.POLLERR) else 0) \
                | (WRITE if revents & select.POLLOUT else 0)
            if revents & select.POLLNVAL:
                continue
            self.dispatch(descr, event)


class LoopTicker:
    """Runs ``sync_obj``'s ticks on the loop: soon after an event, else at its next timer; and on
    its guard thread while the loop is too busy to."""

    def __init__(self, sync_obj: SyncObj, loop: asyncio.AbstractEventLoop, poller: LoopPoller,
                 period_s: float) -> None:
        self._sync_obj = sync_obj
        self._loop = loop
        self._poller = poller
        self._period_s = period_s
        self._soon: asyncio.Handle | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._stopped = threading.Event()
        self._guard: threading.Thread | None = None
        self._last_tick_at = time.monotonic()
        self.ticks = 0
        self.guard_ticks = 0  # ticks the guard ran because the loop was busy
        poller.on_event = self.soon
        redirect_proposal_wake(sync_obj, self.wake)  # a proposal asks for a tick without a pipe

    def start(self) -> None:
        self.soon()
        self._guard = threading.Thread(target=self._guard_ticks, name="rcq-raft-tick-guard", daemon=True)
        self._guard.start()

    def stop(self) -> None:
        """Stop ticking (loop thread); the guard ends within its period."""
        self._stopped.set()
        for handle in (self._soon, self._timer):
            if handle is not None:
                handle.cancel()
        if self._guard is not None:
            self._guard.join(timeout=1.0)

    def wake(self) -> None:
        """A tick soon, from any thread (rcq's own work for the tick: rcq.server.raft.requests)."""
        if self._poller.on_loop_thread():
            self.soon()
        else:
            with contextlib.suppress(RuntimeError):  # the loop is closed
                self._loop.call_soon_threadsafe(self.soon)

    def soon(self) -> None:
        """A tick at the loop's next turn (one, however many ask before it runs). Loop thread."""
        if self._soon is None and not self._stopped.is_set():
            self._soon = self._loop.call_soon(self._tick)

    def _tick(self) -> None:
        self._soon = None
        if self._stopped.is_set():
            return
        with self._poller.lock:
            self._run_tick()
        self._schedule_timer()

    def _run_tick(self) -> None:
        try:
            tick_once(self._sync_obj)
        except Exception:  # as pysyncobj's tick thread: log, and tick again at the next timer
            logger.exception("a Raft tick failed")
        self._last_tick_at = time.monotonic()
        self.ticks += 1

    def _schedule_timer(self) -> None:
        at = self._loop.time() + time_to_next_tick(self._sync_obj, self._period_s)
        if self._timer is not None:
            if self._timer.when() <= at:
                return  # an earlier tick is already due; it schedules the next
            self._timer.cancel()
        self._timer = self._loop.call_at(at, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self.soon()

    def _guard_ticks(self) -> None:
        stalled_since: float | None = None
        while not self._stopped.wait(GUARD_PERIOD_S):
            idle_s = time.monotonic() - self._last_tick_at
            if idle_s < STALL_S:
                if stalled_since is not None:
                    logger.info("the event loop ticks Raft again after %.2f s busy (%d guard ticks so far)",
                                time.monotonic() - stalled_since, self.guard_ticks)
                    stalled_since = None
                continue
            if stalled_since is None:
                stalled_since = self._last_tick_at
            with self._poller.lock:
                if self._stopped.is_set():
                    return
                try:
                    self._poller.poll_now()
                except Exception:
                    logger.exception("the Raft tick guard could not poll")
                self._run_tick()
                self.guard_ticks += 1
