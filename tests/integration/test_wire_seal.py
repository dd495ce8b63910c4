"""The Raft wire's AES-GCM seal between real nodes (rcq.server.raft.wire_seal, transport_patches).

A real node (real pysyncobj, its Raft port on 127.0.0.1) and the test as a peer dialling it,
with or without the offer in its handshake nonce; and pairs of real nodes, with the seal on both
ends or on one only (an older node, ``raft_fast_seal`` off: Fernet both ways).
"""

from __future__ import annotations

import contextlib
import logging
import pickle
import struct
import time
from pathlib import Path
from typing import Any

import pytest

from rcq.server.core.commands import CommitBatch, CommitUnit, TransactionWrite
from rcq.server.raft import transport_patches
from rcq.server.raft.internals import connection_private, connections_of, transport_of
from rcq.server.raft.replicator import RaftReplicator
from rcq.server.raft.wire_seal import Seal, is_sealed, master_key, offering_nonce, offers
from rcq.testing import async_wait_until
from tests.helpers import LOCAL_RAFT_WAIT_S, LOCAL_WAIT_S
from tests.helpers.raft import SECRET
from tests.helpers.raft_peer import (
    RaftClient,
    client,
    heartbeat,
    node_config,
    pair_of_nodes,
    running_node,
)


class SealingRaftClient(RaftClient):
    """A peer of this version: offers the seal, and seals once the node's nonce offered it too."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.nonce = offering_nonce()
        self.seal: Seal | None = None

    def exchange_nonces(self) -> None:
        super().exchange_nonces()
        if offers(self.node_nonce):
            self.seal = Seal(master_key(SECRET), self.nonce, self.node_nonce)

    def frame(self, message: Any) -> bytes:
        if self.seal is None:
            return super().frame(message)
        data = self.seal.seal(pickle.dumps(message, transport_patches.SEALED_PICKLE_PROTOCOL))
        return struct.pack("i", len(data)) + data

    def receive_sealed(self) -> Any:
        frame = self.receive_frame()
        assert is_sealed(frame), "the node answered with a Fernet frame"
        assert self.seal is not None
        data = self.seal.open(frame)
        assert data[:2] == b"\x80\x05", "not pickle protocol 5"  # pysyncobj's frames: protocol 2
        return pickle.loads(data)


def probe(term: int) -> dict[str, Any]:
    """A leader's append_entries after entries the node lacks: it follows ``term`` and answers
    with the index it needs (a ``next_node_idx`` message)."""
    return {**heartbeat(term), "prevLogIdx": 10**6, "prevLogTerm": term, "entries": []}


def sealing_client(address: str) -> Any:
    """A peer of this version dialling the node (raft_peer.client with the offering kind)."""
    return client(address, kind=SealingRaftClient)


async def test_a_peer_offering_the_seal_gets_it_both_ways(tmp_path: Path) -> None:
    config = node_config(tmp_path)
    async with running_node(config) as replicator, sealing_client(config.raft_address) as peer:
        peer.handshake(as_address=config.peers[0].raft_address)
        assert peer.seal is not None, "the node's nonce did not offer the seal"
        peer.send(probe(term=7))  # sealed: the handshake's address was sealed too
        await async_wait_until(lambda: replicator.term == 7, LOCAL_WAIT_S, what="the node following term 7")
        assert peer.receive_sealed()["type"] == "next_node_idx"
        assert not peer.closed_by_node()


@pytest.mark.parametrize("fault", ["altered", "replayed", "reordered"])
async def test_a_sealed_frame_that_does_not_open_closes_the_connection(tmp_path: Path, fault: str) -> None:
    config = node_config(tmp_path)
    async with running_node(config) as replicator, sealing_client(config.raft_address) as peer:
        peer.handshake(as_address=config.peers[0].raft_address)
        first, second = peer.frame(heartbeat(term=7)), peer.frame(heartbeat(term=8))
        if fault == "altered":
            frames = [first[:-1] + bytes((first[-1] ^ 1,))]
        elif fault == "replayed":
            frames = [first, first]
        else:
            frames = [second]
        for frame in frames:
            peer.sock.sendall(frame)
        await async_wait_until(peer.closed_by_node, LOCAL_WAIT_S, what="the node closing the connection")
        assert replicator.term == (7 if fault == "replayed" else 0)


async def test_a_sealed_frame_without_the_offer_closes_the_connection(tmp_path: Path) -> None:
    """A peer that did not offer (pysyncobj's nonce) may not switch to sealed frames."""
    config = node_config(tmp_path)
    async with running_node(config) as replicator, client(config.raft_address) as peer:
        peer.exchange_nonces()
        assert offers(peer.node_nonce)  # the node offers; the peer did not
        seal = Seal(master_key(SECRET), peer.nonce, peer.node_nonce)
        data = seal.seal(pickle.dumps(config.peers[0].raft_address, transport_patches.SEALED_PICKLE_PROTOCOL))
        peer.sock.sendall(struct.pack("i", len(data)) + data)
        await async_wait_until(peer.closed_by_node, LOCAL_WAIT_S, what="the node closing the connection")
        assert replicator.term == 0


async def test_a_peer_that_does_not_offer_gets_fernet_frames(tmp_path: Path) -> None:
    """rcq 0.1, or pysyncobj's own tools: the node answers in Fernet, as before."""
    config = node_config(tmp_path)
    async with running_node(config) as replicator, client(config.raft_address) as peer:
        peer.handshake(as_address=config.peers[0].raft_address)
        peer.send(probe(term=7))
        await async_wait_until(lambda: replicator.term == 7, LOCAL_WAIT_S, what="the node following term 7")
        assert peer.receive()["type"] == "next_node_idx"  # RaftClient.receive opens Fernet only


@pytest.mark.parametrize("setting", [{"raft_fast_seal": False},
                                     {"cluster_secrets_previous": ("an older secret of the tests",)}],
                         ids=["off", "rotating"])
async def test_a_node_without_the_seal_does_not_offer_it(tmp_path: Path, setting: dict[str, Any]) -> None:
    config = node_config(tmp_path, **setting)
    async with running_node(config) as replicator, sealing_client(config.raft_address) as peer:
        peer.handshake(as_address=config.peers[0].raft_address)
        assert peer.seal is None and not offers(peer.node_nonce)
        peer.send(probe(term=7))  # Fernet, since the node did not offer
        await async_wait_until(lambda: replicator.term == 7, LOCAL_WAIT_S, what="the node following term 7")
        assert peer.receive()["type"] == "next_node_idx"


def sealed_connections(replicator: RaftReplicator) -> list[bool]:
    """For each of the node's connected peers: does the connection use the seal?"""
    found = []
    for conn in connections_of(transport_of(replicator._sync_obj)):
        if connection_private(conn, "socket") is None or conn.recvRandKey is None:
            continue
        seal = getattr(conn, "_rcq_seal", None)
        found.append(seal is not None and seal.own_nonce is conn.recvRandKey)
    return found


@pytest.mark.parametrize("seals", [(True, True), (True, False), (False, True)], ids=["both", "dialled-off", "dialling-off"])
async def test_two_nodes_replicate_with_the_seal_where_both_have_it(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, seals: tuple[bool, bool]) -> None:
    """Whichever of the two dials (the greater address), the seal is used iff both have it on."""
    configs = [config.model_copy(update={"raft_fast_seal": on})
               for config, on in zip(pair_of_nodes(tmp_path), seals, strict=True)]
    async with contextlib.AsyncExitStack() as stack:
        nodes = [await stack.enter_async_context(running_node(config)) for config in configs]
        await async_wait_until(lambda: any(n.is_leader() for n in nodes), LOCAL_RAFT_WAIT_S, what="a leader")
        leader = next(n for n in nodes if n.is_leader())
        follower = next(n for n in nodes if n is not leader)
        for i in range(3):
            batch = CommitBatch(term=leader.term, now_ms=time.time_ns() // 1_000_000, units=(
                CommitUnit((TransactionWrite(f"tx{i}", enqueues=(("q", (b"item %d" % i,)),)),)),))
            await leader.submit(batch, timeout_s=30)
        await async_wait_until(lambda: follower.read(lambda sm: sm.count("q") == 3), LOCAL_RAFT_WAIT_S,
                               what="the items on the follower")
        for node in nodes:
            assert sealed_connections(node) == [all(seals)]
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


async def test_with_pysyncobjs_own_handshake_a_node_never_offers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What the seal's handshake replaced (``transport_patches.REPLACED["seal"]``): pysyncobj's own
    nonces carry no offer, so an offering peer gets Fernet frames, as from rcq 0.1."""
    for replaced in transport_patches.REPLACED["seal"]:
        monkeypatch.setattr(replaced.owner, replaced.attribute, replaced.original)
    config = node_config(tmp_path)
    async with running_node(config) as replicator, sealing_client(config.raft_address) as peer:
        peer.handshake(as_address=config.peers[0].raft_address)
        assert peer.seal is None and not offers(peer.node_nonce)
        peer.send(probe(term=7))
        await async_wait_until(lambda: replicator.term == 7, LOCAL_WAIT_S, what="the node following term 7")
        assert peer.receive()["type"] == "next_node_idx"
