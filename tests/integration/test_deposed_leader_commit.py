"""A deposed leader never acknowledges a commit that the cluster did not commit (chaos seed 90413).

The sequence, played deterministically on one real node (real pysyncobj, real journal, real
LMDB snapshot, no tick thread: the test calls ``tick()``) whose two peers are played by the test:

1. the node leads term 5: its barrier commits (the peers acknowledge), it serves;
2. a transaction enqueues an item and commits: the entry is appended to the node's log in term 5,
   and no peer acknowledges it;
3. a new leader of term 6 (a peer) reaches the node: either with the first chunk of a snapshot
   (the node is too far behind) or by re-sending entries the node already has; both carry the new
   leader's commit index, which is beyond the node's own uncommitted entry;
4. the snapshot transfer completes.

pysyncobj alone moves the node's commit index over its own uncommitted entry at step 3, applies it
and calls the proposal back with success: the client hears "committed" for an entry no other node
has, and step 4 then wipes it. rcq must instead answer "outcome unknown" (the client asks again)
and end with the cluster's state. See docs/raft-hazards.md, H6.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from rcq.errors import CommitOutcomeUnknown
from rcq.server.core.commands import CommitBatch, CommitUnit, TransactionWrite, encode
from rcq.server.core.state_machine import QueueStateMachine
from rcq.server.leader.session import CommitResult
from rcq.server.leader.transactions import TransactionManager
from rcq.server.raft import consumer, patches
from rcq.server.raft.replicator import RaftReplicator
from rcq.server.raft.snapshots import write_snapshot
from tests.helpers import LOCAL_WAIT_S
from tests.helpers.manual_raft import ManualRaft, config_of

QUEUE = "q"
OLD_TERM, NEW_TERM = 5, 6


@contextlib.asynccontextmanager
async def deposable_leader(data_dir: Path) -> AsyncIterator[tuple[ManualRaft, TransactionManager, QueueStateMachine]]:
    config = config_of(data_dir)
    state_machine = QueueStateMachine()
    replicator = RaftReplicator(config, state_machine, auto_tick=False)
    await replicator.start()
    manager = TransactionManager(config, replicator, leader_url=lambda: None)
    try:
        await manager.start()
        raft = ManualRaft(replicator)
        raft.become_leader(OLD_TERM)
        await raft.run_until(lambda: manager.serving, "the node serves as leader", acknowledge=True)
        yield raft, manager, state_machine
    finally:
        await manager.stop()
        await replicator.stop()


def new_leaders_snapshot(path: Path, last_index: int) -> bytes:
    """The new leader's state at ``last_index`` (one item of its own), as an LMDB snapshot file."""
    state = QueueStateMachine()
    command = encode(CommitBatch(term=NEW_TERM, now_ms=time.time_ns() // 1_000_000, units=(
        CommitUnit((TransactionWrite("6.theirs", enqueues=((QUEUE, (b"theirs",)),)),)),)))
    state.apply(command, last_index)
    entry = b"\x00"  # pysyncobj's no-op command byte: what the entries are does not matter here
    write_snapshot(path, state, ((entry, last_index, NEW_TERM), (entry, last_index - 1, NEW_TERM), set()))
    return path.read_bytes()


async def commit_one_item(raft: ManualRaft, manager: TransactionManager) -> tuple[asyncio.Task[CommitResult], int]:
    """Begin, enqueue, commit: returns the commit (pending) and its entry's index, once it is in the log."""
    transaction = manager.begin()
    manager.enqueue(transaction.transaction_id, QUEUE, [b"ours"])
    log_end = raft.log()[-1][0]
    commit = asyncio.create_task(manager.commit(transaction.transaction_id))
    await raft.run_until(lambda: raft.log()[-1][0] > log_end, "the commit entry is in the log")
    index, term = raft.log()[-1]
    assert term == OLD_TERM
    return commit, index


async def depose(raft: ManualRaft, how: str, proposed_index: int, snapshot: bytes) -> None:
    """A leader of NEW_TERM reaches the node, its commit index beyond the node's proposal."""
    new_leader = raft.peers[0]
    commit_index = proposed_index + 3
    if how == "snapshot chunk":
        raft.receive(new_leader, {"type": "append_entries", "term": NEW_TERM, "commit_index": commit_index,
                                  "serialized": (snapshot[:4096], True, False)})
    else:  # entries the node has, re-sent: they match, so the node keeps its own entry after them
        previous = raft.entry(proposed_index - 2)
        raft.receive(new_leader, {"type": "append_entries", "term": NEW_TERM, "commit_index": commit_index,
                                  "prevLogIdx": previous[1], "prevLogTerm": previous[2],
                                  "entries": [raft.entry(proposed_index - 1)]})
    for _ in range(5):
        await raft.step()


async def install_snapshot(raft: ManualRaft, snapshot: bytes, commit_index: int) -> None:
    new_leader = raft.peers[0]
    first = (snapshot[:4096], True, False) if len(snapshot) > 4096 else None
    if first is not None:  # the first chunk again: a transfer restarts from its first chunk
        raft.receive(new_leader, {"type": "append_entries", "term": NEW_TERM, "commit_index": commit_index,
                                  "serialized": first})
    raft.receive(new_leader, {"type": "append_entries", "term": NEW_TERM, "commit_index": commit_index,
                              "serialized": (snapshot[4096:] if first else snapshot, first is None, True)})
    for _ in range(5):
        await raft.step()


HOW = ["snapshot chunk", "matching entries re-sent"]


@pytest.mark.parametrize("how", HOW)
async def test_a_deposed_leader_answers_unknown_and_ends_with_the_clusters_state(tmp_path: Path, how: str) -> None:
    async with deposable_leader(tmp_path / "node") as (raft, manager, state_machine):
        commit, index = await commit_one_item(raft, manager)
        snapshot = new_leaders_snapshot(tmp_path / "theirs.lmdb", index + 3)

        await depose(raft, how, index, snapshot)

        assert not manager.serving
        assert raft.sync_obj.raftCommitIndex < index, "the commit index covers an entry nobody acknowledged"
        assert state_machine.count(QUEUE) == 0, "the deposed leader applied its own uncommitted entry"
        assert not commit.done(), "the commit was answered before anything was known"

        await install_snapshot(raft, snapshot, index + 3)

        with pytest.raises(CommitOutcomeUnknown):
            await asyncio.wait_for(commit, LOCAL_WAIT_S)
        assert state_machine.values(QUEUE, state_machine.item_ids(QUEUE)) == [b"theirs"]
        assert raft.log()[-1] == (index + 3, NEW_TERM)


@pytest.mark.parametrize("how", HOW)
@pytest.mark.parametrize("layer", ["commit index bound", "leader-only success"])
async def test_each_layer_alone_prevents_the_false_acknowledgement(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   how: str, layer: str) -> None:
    if layer == "commit index bound":  # the other layer off: any applied proposal would succeed
        monkeypatch.setattr(consumer, "_leads_term_of_entry", lambda sync_obj, index: True)
    else:
        monkeypatch.setattr(patches, "_bound_commit_index", lambda *args: None)
    async with deposable_leader(tmp_path / "node") as (raft, manager, _state_machine):
        commit, index = await commit_one_item(raft, manager)
        snapshot = new_leaders_snapshot(tmp_path / "theirs.lmdb", index + 3)

        await depose(raft, how, index, snapshot)
        await install_snapshot(raft, snapshot, index + 3)

        with pytest.raises(CommitOutcomeUnknown):
            await asyncio.wait_for(commit, LOCAL_WAIT_S)


@pytest.mark.parametrize("how", HOW)
async def test_without_the_workaround_pysyncobj_acknowledges_the_lost_commit(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    """The dependency's bug, shown: if this fails, pysyncobj changed; revisit the workaround."""
    monkeypatch.setattr(consumer, "_leads_term_of_entry", lambda sync_obj, index: True)
    monkeypatch.setattr(patches, "_bound_commit_index", lambda *args: None)
    async with deposable_leader(tmp_path / "node") as (raft, manager, state_machine):
        commit, index = await commit_one_item(raft, manager)
        snapshot = new_leaders_snapshot(tmp_path / "theirs.lmdb", index + 3)

        await depose(raft, how, index, snapshot)

        result = await asyncio.wait_for(commit, LOCAL_WAIT_S)
        assert not result.duplicate and result.enqueued == 1  # "committed", acknowledged
        await install_snapshot(raft, snapshot, index + 3)
        assert state_machine.count(QUEUE) == 1  # ...and the cluster's state does not have it
        assert state_machine.values(QUEUE, state_machine.item_ids(QUEUE)) == [b"theirs"]
