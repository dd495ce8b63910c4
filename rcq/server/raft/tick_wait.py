"""How long pysyncobj's tick thread sleeps between ticks: until something happens, or its next timer.

pysyncobj's tick thread ends every tick in ``poller.poll(autoTickPeriod)``: a wait that any
socket event ends at once (a message, an acknowledgement), and so does a proposal (a pipe wakes
the poller unless entries are batched). What needs a tick without any event is a timer: a
leader's next heartbeat, a follower's election deadline, the leader's step-down check
(leader_fallback_timeout_s), the snapshot child's progress, connection retries. Polling every
few milliseconds for those made an idle node spend several percent of a core on ticks that found
nothing to do. Here the wait ends at the next heartbeat or election deadline, and at the latest
after ``auto_tick_period_s``, which therefore bounds how late the other timers are seen (the
step-down check: leader_fallback_timeout_s + auto_tick_period_s, still below raft_timeout_min_s,
which the config checks). Work rcq queues for the tick thread wakes it itself
(rcq.server.raft.requests).

Must not import: anything of rcq's but rcq.server.raft.internals.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pysyncobj import SyncObj

from rcq.server.raft.internals import poller_of, seconds_to_next_timer

# The poller's wait is in whole milliseconds; waking a little after the deadline saves a tick
# that would find the heartbeat not yet due and wait again for the remaining fraction.
DEADLINE_SLACK_S = 0.001


def time_to_next_tick(sync_obj: SyncObj, longest_s: float) -> float:
    """How long the next tick may wait: until the next heartbeat or election deadline (a little
    after it), at most ``longest_s``. A deadline already past is one the tick could not act on (a
    follower connected to no one does not start elections): wait the whole period, never spin."""
    remaining_s = seconds_to_next_timer(sync_obj)
    if 0 < remaining_s < longest_s:
        return remaining_s + DEADLINE_SLACK_S
    return longest_s


def wait_until_next_timer(sync_obj: SyncObj) -> None:
    """Make ``sync_obj``'s tick wait end at its next heartbeat or election deadline when that comes
    before the tick period ends (once; tick thread not yet started, or any time: one assignment)."""
    poller = poller_of(sync_obj)
    if getattr(poller, "_rcq_timely", False):
        return
    poll: Callable[[float], Any] = poller.poll

    def poll_until_next_timer(timeout_s: float) -> Any:
        return poll(time_to_next_tick(sync_obj, timeout_s) if timeout_s > 0 else timeout_s)

    poller.poll = poll_until_next_timer
    poller._rcq_timely = True
