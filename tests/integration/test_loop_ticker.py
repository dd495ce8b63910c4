"""Raft ticks on the event loop (rcq.server.raft.loop_ticker): a loop busy for longer than an
election timeout keeps its leader, because the guard thread ticks meanwhile; nothing of the
ticker outlives a stop.

Three real replicators (real pysyncobj, sockets, journals) in this process, on one loop: blocking
the loop blocks all three, as a long request would block one node's.
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

from rcq.server.config import NodeConfig, PeerConfig
from rcq.server.core.commands import BatchResult
from rcq.server.core.state_machine import QueueStateMachine
from rcq.server.raft import loop_ticker
from rcq.server.raft.replicator import RaftReplicator
from rcq.testing import async_wait_until
from tests.helpers import LOCAL_WAIT_S
from tests.helpers.raft import FAST_RAFT, SECRET, commit_batch, free_port

BUSY_S = 2.0  # two to four election timeouts of FAST_RAFT


def three_configs(base: Path) -> list[NodeConfig]:
    peers = [PeerConfig(node_id=f"n{i}", raft_address=f"127.0.0.1:{free_port()}", http_url=f"http://n{i}.test:80")
             for i in range(3)]
    return [NodeConfig.model_validate(dict(
        node_id=p.node_id, http_port=0, raft_address=p.raft_address, data_dir=base / p.node_id,
        peers=[q for q in peers if q is not p], cluster_secret=SECRET, **FAST_RAFT)) for p in peers]


def guard_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "rcq-raft-tick-guard"]


async def test_a_loop_busy_past_an_election_timeout_keeps_its_leader(tmp_path: Path) -> None:
    nodes = [RaftReplicator(config, QueueStateMachine()) for config in three_configs(tmp_path)]
    for node in nodes:
        await node.start()
    try:
        def one_leader() -> RaftReplicator | None:
            leaders = [n for n in nodes if n.is_leader()]
            return leaders[0] if len(leaders) == 1 and len({n.term for n in nodes}) == 1 else None

        await async_wait_until(lambda: one_leader() is not None, LOCAL_WAIT_S, what="one leader")
        leader = one_leader()
        assert leader is not None
        term = leader.term
        guarded = [n._ticker.guard_ticks for n in nodes]  # type: ignore[union-attr]
        time.sleep(BUSY_S)  # pace: the loop is busy this long, no tick of its own, no socket event
        assert all(n._ticker.guard_ticks > g for n, g in zip(nodes, guarded, strict=True))  # type: ignore[union-attr]
        assert [n.term for n in nodes] == [term] * 3 and leader.is_leader()
        assert leader.status().details["guard_ticks"] == leader._ticker.guard_ticks > 0  # type: ignore[union-attr]
        result = await leader.submit(commit_batch(term, "after-the-busy-loop", b"x"), timeout_s=5)
        assert isinstance(result, BatchResult) and result.outcomes[0].status == "committed"
    finally:
        for node in nodes:
            await node.stop()
    assert not guard_threads()


async def test_the_loop_ticks_when_it_is_free_and_the_guard_stays_idle(tmp_path: Path) -> None:
    nodes = [RaftReplicator(config, QueueStateMachine()) for config in three_configs(tmp_path)]
    for node in nodes:
        await node.start()
    try:
        await async_wait_until(lambda: any(n.is_leader() for n in nodes), LOCAL_WAIT_S, what="a leader")
        guarded = [n._ticker.guard_ticks for n in nodes]  # type: ignore[union-attr]
        ticks = [n._ticker.ticks for n in nodes]  # type: ignore[union-attr]
        await asyncio.sleep(loop_ticker.STALL_S * 3)  # pace: three stalls' time, in which the guard would tick
        assert [n._ticker.guard_ticks for n in nodes] == guarded  # type: ignore[union-attr]
        assert all(n._ticker.ticks > t for n, t in zip(nodes, ticks, strict=True))  # type: ignore[union-attr]
    finally:
        for node in nodes:
            await node.stop()
