"""RaftReplicator.digest() on real pysyncobj: the in-process value, commits that go on while the
digest child hashes, a hung child killed by stop(), and GET /v1/cluster/digest."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import aiohttp
import pytest

from rcq.errors import Unavailable
from rcq.server.core.commands import BatchResult
from rcq.server.core.state_machine import QueueStateMachine
from rcq.server.node import Node
from rcq.server.raft.replicator import RaftReplicator
from rcq.testing import InMemoryReplicator, async_wait_until, wait_until
from tests.helpers import GATE_WAIT_S, LOCAL_WAIT_S
from tests.helpers.raft import QUEUE, child_pids, commit_batch, running, single_node_config


class GatedStateMachine(QueueStateMachine):
    """Its digest, in a forked child only, says it started (gate/started) and waits for gate/go."""

    def __init__(self, gate: Path) -> None:
        super().__init__()
        self.gate = gate
        self.parent_pid = os.getpid()

    def digest(self) -> str:
        if os.getpid() != self.parent_pid:
            (self.gate / "started").touch()
            wait_until((self.gate / "go").exists, GATE_WAIT_S, what="the test to open the gate", interval_s=0.005)
        return super().digest()


def in_process(replicator: RaftReplicator) -> tuple[str, int]:
    return replicator.read(lambda sm: (sm.digest(), sm.last_index))


async def commit(replicator: RaftReplicator, name: str, *values: bytes) -> int:
    result = await replicator.submit(commit_batch(replicator.term, name, *values), timeout_s=5)
    assert isinstance(result, BatchResult) and result.outcomes[0].status == "committed"
    return result.outcomes[0].index


async def test_the_replicator_digest_is_the_in_process_digest(tmp_path: Path) -> None:
    async with running(single_node_config(tmp_path)) as replicator:
        for i in range(5):
            await commit(replicator, f"t{i}", *(f"{i}-{j}".encode() for j in range(100)))
        assert await replicator.digest() == in_process(replicator)


async def test_commits_go_on_while_the_digest_child_hashes(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    gate.mkdir()
    async with running(single_node_config(tmp_path / "node"), GatedStateMachine(gate)) as replicator:
        await commit(replicator, "before", b"a")
        at_fork = in_process(replicator)
        digest = asyncio.ensure_future(replicator.digest())
        await async_wait_until(lambda: (gate / "started").exists(), LOCAL_WAIT_S, what="the digest child to start")

        # The child holds its copy; applies (and so commits) need the state lock: it is free.
        indexes = [await asyncio.wait_for(commit(replicator, f"during-{i}", b"x"), LOCAL_WAIT_S) for i in range(3)]
        assert not digest.done()
        (gate / "go").touch()

        assert await asyncio.wait_for(digest, LOCAL_WAIT_S) == at_fork  # the state when it forked
        assert at_fork[1] < indexes[0]
        assert await asyncio.wait_for(replicator.digest(), LOCAL_WAIT_S) == in_process(replicator)
        assert replicator.read(lambda sm: sm.count(QUEUE)) == 4


async def test_stop_kills_a_digest_child_that_hangs(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    gate.mkdir()
    children_before = child_pids()
    replicator = RaftReplicator(single_node_config(tmp_path / "node"), GatedStateMachine(gate))
    await replicator.start()
    try:
        await async_wait_until(replicator.is_leader, LOCAL_WAIT_S, what="the single node to lead")
        digest = asyncio.ensure_future(replicator.digest())
        await async_wait_until(lambda: (gate / "started").exists(), LOCAL_WAIT_S, what="the digest child to start")
    finally:
        started = time.monotonic()
        await asyncio.wait_for(replicator.stop(), LOCAL_WAIT_S)
    assert time.monotonic() - started < 5
    with pytest.raises(Unavailable, match="the node is stopping"):
        await digest
    assert child_pids() <= children_before  # killed and reaped: no zombie
    with pytest.raises(Unavailable):
        await replicator.digest()


async def test_the_http_digest_comes_from_the_replicator(tmp_path: Path) -> None:
    node = Node(single_node_config(tmp_path, http_port=0))
    await node.start()
    try:
        assert isinstance(node.replicator, RaftReplicator)
        replicator = node.replicator
        await async_wait_until(replicator.is_leader, LOCAL_WAIT_S, what="the single node to lead")
        # Its own entries first (the level raised, the identity given): none may land between the two digests.
        await async_wait_until(lambda: replicator.read(lambda sm: sm.cluster_id is not None), LOCAL_WAIT_S,
                               what="the node's level and identity")
        await commit(replicator, "t", b"a", b"b")
        async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{node.port}/v1/cluster/digest") as got:
            body = await got.json()
        assert got.status == 200
        assert (body["digest"], body["applied_index"]) == in_process(replicator)
        assert body["node_id"] == "solo"
    finally:
        await node.stop()


async def test_a_digest_that_fails_is_a_503_with_its_reason(tmp_path: Path) -> None:
    class FailingReplicator(InMemoryReplicator):
        async def digest(self) -> tuple[str, int]:
            raise Unavailable("the digest child 42 gave no answer within 1 s; it was killed")

    node = Node(single_node_config(tmp_path, http_port=0, insecure=True), replicator=FailingReplicator())
    await node.start()
    try:
        async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{node.port}/v1/cluster/digest") as got:
            body = await got.json()
        assert got.status == 503
        assert body["error"]["code"] == "unavailable" and "gave no answer" in body["error"]["message"]
    finally:
        await node.stop()
