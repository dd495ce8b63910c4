"""Real pysyncobj nodes in this process: free ports, a single-node configuration, a running node.

``single_node_config`` is a one-node RaftReplicator configuration with fast timeouts; ``running``
starts a replicator, waits until it leads and stops it after. Waits are :mod:`rcq.testing`'s
(``wait_until`` in a thread, ``async_wait_until`` in a coroutine).

Must not import: a test module or a conftest.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from rcq.local.nodes import free_ports
from rcq.server.config import NodeConfig
from rcq.server.core.commands import CommitBatch, CommitUnit, TransactionWrite
from rcq.server.core.state_machine import QueueStateMachine
from rcq.server.raft.replicator import RaftReplicator
from rcq.testing import async_wait_until
from tests.helpers import LOCAL_WAIT_S

QUEUE = "q"
SECRET = "correct horse battery staple"
# Short timeouts keep the tests fast; they still satisfy NodeConfig's cross-field rules.
FAST_RAFT = dict(raft_timeout_min_s=0.5, raft_timeout_max_s=1.0, leader_fallback_timeout_s=0.4,
                 connection_timeout_s=1.0, append_entries_period_s=0.02, auto_tick_period_s=0.005)


def free_port() -> int:
    """A loopback port nothing listened on a moment ago, below the ephemeral range (see free_ports)."""
    return free_ports(1)[0]


def commit_batch(term: int, transaction_id: str, *values: bytes) -> CommitBatch:
    """One transaction enqueueing ``values`` into QUEUE, as a leader of ``term`` would propose it."""
    return CommitBatch(term=term, now_ms=time.time_ns() // 1_000_000,
                       units=(CommitUnit((TransactionWrite(transaction_id, enqueues=((QUEUE, values),)),)),))


def child_pids() -> set[int]:
    """This process's children (of every thread), from /proc."""
    pids: set[int] = set()
    for task in Path("/proc/self/task").iterdir():
        with contextlib.suppress(OSError):
            pids.update(int(p) for p in (task / "children").read_text().split())
    return pids


def single_node_config(data_dir: Path, **overrides: Any) -> NodeConfig:
    """A cluster of one node ``solo`` on a free Raft port, with FAST_RAFT timeouts."""
    fields: dict[str, Any] = dict(node_id="solo", http_port=0, raft_address=f"127.0.0.1:{free_port()}",
                                  data_dir=data_dir, cluster_secret=SECRET, **FAST_RAFT)
    fields.update(overrides)
    return NodeConfig.model_validate(fields)


@contextlib.asynccontextmanager
async def running(config: NodeConfig, state_machine: QueueStateMachine | None = None,
                  ) -> AsyncIterator[RaftReplicator]:
    """A started replicator of ``config`` once it leads; stopped after."""
    replicator = RaftReplicator(config, state_machine or QueueStateMachine())
    await replicator.start()
    try:
        await async_wait_until(replicator.is_leader, LOCAL_WAIT_S, what="the single node to lead")
        yield replicator
    finally:
        await replicator.stop()
