"""ManualRaft: one real node (real pysyncobj, real journal) whose Raft the test drives step by
step (RaftReplicator(auto_tick=False)), and whose two peers the test plays with messages.

For deterministic tests of exact Raft sequences; no timing decides anything (election and
fallback timeouts are set far beyond a test's length).

Must not import: a test module or a conftest.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pysyncobj import SyncObj

from rcq.server.config import NodeConfig, PeerConfig
from rcq.server.raft.replicator import RaftReplicator
from tests.helpers.raft import SECRET, free_port

STEPS_MAX = 200


def config_of(data_dir: Path, **overrides: Any) -> NodeConfig:
    # Timeouts far beyond the test's length: only the test's messages change roles.
    peers = tuple(PeerConfig(node_id=f"peer{i}", raft_address=f"127.0.0.1:{free_port()}",
                             http_url=f"http://127.0.0.1:{free_port()}") for i in (1, 2))
    return NodeConfig(node_id="deposed", http_port=0, raft_address=f"127.0.0.1:{free_port()}", peers=peers,
                      data_dir=data_dir, cluster_secret=SECRET, raft_timeout_min_s=300, raft_timeout_max_s=600,
                      leader_fallback_timeout_s=200, connection_timeout_s=600, commit_timeout_s=300,
                      **overrides)


class ManualRaft:
    """Plays one node's Raft step by step, and its two peers' messages."""

    def __init__(self, replicator: RaftReplicator) -> None:
        self.replicator = replicator
        self.sync_obj: SyncObj = replicator._sync_obj  # type: ignore[assignment]
        self.peers = sorted(self.sync_obj.otherNodes, key=str)

    def log(self) -> list[tuple[int, int]]:
        journal = self.sync_obj._SyncObj__raftLog  # type: ignore[attr-defined]
        return [(journal[i][1], journal[i][2]) for i in range(len(journal))]

    def entry(self, index: int) -> tuple[Any, int, int]:
        journal = self.sync_obj._SyncObj__raftLog  # type: ignore[attr-defined]
        return tuple(journal[index - journal[0][1]])  # type: ignore[return-value]

    def become_leader(self, term: int) -> None:
        self.sync_obj._SyncObj__setCurrentTerm(term, self.sync_obj.selfNode.id)  # type: ignore[attr-defined]
        self.sync_obj._SyncObj__onBecomeLeader()  # type: ignore[attr-defined]

    def receive(self, peer: Any, message: dict[str, Any]) -> None:
        self.sync_obj._SyncObj__onMessageReceived(peer, message)  # type: ignore[attr-defined]

    def acknowledge_everything(self) -> None:
        """Both peers report the node's whole log as replicated."""
        next_index = self.log()[-1][0] + 1
        for peer in self.peers:
            self.receive(peer, {"type": "next_node_idx", "next_node_idx": next_index, "reset": False,
                                "success": True})

    async def step(self, acknowledge: bool = False) -> None:
        self.replicator.tick()
        if acknowledge:
            self.acknowledge_everything()
            self.replicator.tick()
        self.replicator._check_role()
        for _ in range(10):  # callbacks travel tick -> loop with call_soon_threadsafe
            await asyncio.sleep(0)

    async def run_until(self, predicate: Callable[[], Any], what: str, acknowledge: bool = False) -> None:
        for _ in range(STEPS_MAX):
            if predicate():
                return
            await self.step(acknowledge)
        raise AssertionError(f"not reached in {STEPS_MAX} Raft steps: {what}")


