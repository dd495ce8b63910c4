"""Raft timers are read on pysyncobj's own clock (rcq.server.raft.internals): pysyncobj keeps its
deadlines on CLOCK_MONOTONIC_RAW, which drifts from time.monotonic (0.1 s after ten hours on the
development machine); mixing the two made a due heartbeat look past, or a brought-forward one
come later than the one it replaced."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from pysyncobj import syncobj as syncobj_module

from rcq.server.raft import internals

LEADER, FOLLOWER = syncobj_module._RAFT_STATE.LEADER, syncobj_module._RAFT_STATE.FOLLOWER


@pytest.fixture
def raft_clock(monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    clock = SimpleNamespace(now=5_000.0)  # far from time.monotonic: any mix-up shows
    monkeypatch.setattr(internals, "raft_monotonic", lambda: clock.now)
    return clock


def node(state: int, heartbeat_at: float, election_at: float) -> Any:
    return SimpleNamespace(_SyncObj__raftState=state, _SyncObj__newAppendEntriesTime=heartbeat_at,
                           _SyncObj__raftElectionDeadline=election_at)


def test_the_next_timer_is_the_leader_s_heartbeat_or_the_follower_s_election(raft_clock: SimpleNamespace) -> None:
    assert internals.seconds_to_next_timer(node(LEADER, 5_000.04, 5_001.0)) == pytest.approx(0.04)
    assert internals.seconds_to_next_timer(node(FOLLOWER, 5_000.04, 5_000.5)) == pytest.approx(0.5)
    assert internals.seconds_to_next_timer(node(FOLLOWER, 0, 4_999.0)) == pytest.approx(-1.0)


def test_a_heartbeat_is_brought_forward_never_put_back(raft_clock: SimpleNamespace) -> None:
    leader = node(LEADER, 5_000.1, 0)
    internals.heartbeat_within(leader, 0.005)
    assert leader._SyncObj__newAppendEntriesTime == pytest.approx(5_000.005)
    internals.heartbeat_within(leader, 0.05)  # later than the one due: unchanged
    assert leader._SyncObj__newAppendEntriesTime == pytest.approx(5_000.005)
