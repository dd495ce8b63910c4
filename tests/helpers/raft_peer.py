"""The test's end of a real node's Raft connection: pysyncobj's frames and handshake, spoken by the
test (RaftClient), and the nodes it talks to (running_node, node_config, pair_of_nodes).

Must not import: a test module or a conftest.
"""

from __future__ import annotations

import contextlib
import functools
import os
import select
import socket
import struct
import zlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from pysyncobj import pickle as pysyncobj_pickle
from pysyncobj.encryptor import getEncryptor

from rcq.server.config import NodeConfig, PeerConfig
from rcq.server.core.state_machine import QueueStateMachine
from rcq.server.raft.replicator import RaftReplicator
from tests.helpers import LOCAL_WAIT_S
from tests.helpers.manual_raft import config_of
from tests.helpers.raft import SECRET, free_port

HANDSHAKE_MAX = 4096  # raft_handshake_frame_bytes_max in these tests (its default is 64 KiB)


@functools.cache
def encryptor(secret: str) -> Any:
    return getEncryptor(secret)  # pysyncobj's key derivation from the cluster secret


class RaftClient:
    """The test's end of a Raft connection: pysyncobj's frames, its handshake, nothing checked."""

    def __init__(self, sock: socket.socket, secret: str | None = SECRET) -> None:
        self.sock = sock
        self.sock.settimeout(LOCAL_WAIT_S)
        self.encryptor = encryptor(secret) if secret else None
        self.nonce = os.urandom(32)  # what the node must send back with every message
        self.node_nonce: bytes | None = None  # what we send with ours, once the node chose it

    @classmethod
    def connect(cls, address: str, secret: str | None = SECRET) -> RaftClient:
        host, port = address.rsplit(":", 1)
        return cls(socket.create_connection((host, int(port)), timeout=LOCAL_WAIT_S), secret)

    def frame(self, message: Any) -> bytes:
        if self.node_nonce is not None:
            message = (self.node_nonce, message)
        data = zlib.compress(pysyncobj_pickle.dumps(message), 3)
        if self.encryptor is not None:
            data = self.encryptor.encrypt(data)
        return struct.pack("i", len(data)) + data

    def send(self, message: Any) -> None:
        self.sock.sendall(self.frame(message))

    def receive_frame(self) -> bytes:
        """The next frame's bytes after its length, as they came."""
        (length,) = struct.unpack("i", self._read(4))
        return self._read(length)

    def receive(self) -> Any:
        data = self.receive_frame()
        if self.encryptor is not None:
            data = self.encryptor.decrypt(data)
        nonce, message = pysyncobj_pickle.loads(zlib.decompress(data))
        assert nonce == self.nonce
        return message

    def _read(self, size: int) -> bytes:
        chunks = []
        while size:
            chunk = self.sock.recv(size)
            if not chunk:
                raise ConnectionError("the node closed the connection")
            chunks.append(chunk)
            size -= len(chunk)
        return b"".join(chunks)

    def exchange_nonces(self) -> None:
        """The handshake's first half: our nonce out, the node's back (sealed with ours)."""
        self.send(self.nonce)
        self.node_nonce = self.receive()

    def handshake(self, as_address: str) -> None:
        """pysyncobj's whole handshake, as the peer at ``as_address``: authenticated after it."""
        self.exchange_nonces()
        self.send(as_address)

    def closed_by_node(self) -> bool:
        if not select.select([self.sock], [], [], 0)[0]:
            return False  # nothing to read, not even the end: open
        try:
            return self.sock.recv(1, socket.MSG_PEEK) == b""
        except ConnectionError:
            return True

    def close(self) -> None:
        self.sock.close()


@contextlib.asynccontextmanager
async def client(address: str, secret: str | None = SECRET, kind: type[RaftClient] = RaftClient
                 ) -> AsyncIterator[RaftClient]:
    raft_client = kind.connect(address, secret)
    try:
        yield raft_client
    finally:
        raft_client.close()


@contextlib.asynccontextmanager
async def running_node(config: NodeConfig) -> AsyncIterator[RaftReplicator]:
    """A real node with its tick thread; its peers do not exist (the test plays one of them)."""
    replicator = RaftReplicator(config, QueueStateMachine())
    await replicator.start()
    try:
        yield replicator
    finally:
        await replicator.stop()


def node_config(data_dir: Path, **overrides: Any) -> NodeConfig:
    return config_of(data_dir, raft_handshake_frame_bytes_max=HANDSHAKE_MAX, **overrides)


def heartbeat(term: int, padding: int = 0) -> dict[str, Any]:
    """A leader's append_entries without entries (the node then follows ``term``), padded."""
    return {"type": "append_entries", "term": term, "commit_index": 0, "padding": os.urandom(padding)}


def pair_of_nodes(base: Path) -> list[NodeConfig]:
    """Two nodes of a three-node cluster (the third never starts), with rcq's default limits."""
    ids = ["a", "b", "c"]
    raft = {i: f"127.0.0.1:{free_port()}" for i in ids}
    peers = {i: PeerConfig(node_id=i, raft_address=raft[i], http_url=f"http://{i}.test:80") for i in ids}
    return [NodeConfig(node_id=i, http_port=0, raft_address=raft[i], data_dir=base / i, cluster_secret=SECRET,
                       peers=tuple(peers[j] for j in ids if j != i)) for i in ids[:2]]
