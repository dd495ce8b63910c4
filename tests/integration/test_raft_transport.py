"""pysyncobj's Raft transport, hardened (docs/raft-hazards.md, H13, H14, H15, H20).

A real node (real pysyncobj, its tick thread, its Raft port on 127.0.0.1) and the test as the
other end of its connections, speaking pysyncobj's framing and handshake itself:

* H13: a frame over its cap (the handshake's before authentication, raft_frame_bytes_max after)
  closes the connection on its header alone, logged; pysyncobj buffers whatever is announced;
* H14: a frame is read into one buffer extended in place, and a large entry sent in parts is
  reassembled in one; pysyncobj copies everything buffered at every step (quadratic);
* H15: a listener whose accept() fails with EMFILE accepts again once descriptors are free;
  pysyncobj closes it for good;
* H20: a large entry whose parts pysyncobj's sender marks 'finish' too early is taken at its last
  part, without an error; pysyncobj fails a tick at each early one ("pickle data was truncated").

Each fix has a test that puts pysyncobj's own methods back (``transport_patches.REPLACED``,
``reassembly.REPLACED``) and shows the hazard; if one of those fails, pysyncobj changed: revisit
the fix.

Measurements (pysyncobj's read path and reassembly against rcq's):
``.venv/bin/python -m tests.integration.test_raft_transport``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pickle
import resource
import socket
import struct
import tempfile
import threading
import time
import traceback
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pysyncobj import pickle as pysyncobj_pickle
from pysyncobj.encryptor import getEncryptor
from pysyncobj.tcp_connection import TcpConnection

from rcq.server.config import NodeConfig
from rcq.server.core.commands import CommitBatch, CommitUnit, TransactionWrite
from rcq.server.core.state_machine import QueueStateMachine
from rcq.server.raft import reassembly, transport_patches
from rcq.server.raft.internals import (
    connection_private,
    connections_of,
    entry_term,
    journal_of,
    reassembled_so_far,
    server_private,
    transport_of,
    transport_server,
)
from rcq.server.raft.replicator import RaftReplicator
from rcq.testing import async_wait_until
from tests.helpers import LOCAL_RAFT_WAIT_S, LOCAL_WAIT_S
from tests.helpers.manual_raft import ManualRaft, config_of
from tests.helpers.raft import SECRET
from tests.helpers.raft_peer import (
    HANDSHAKE_MAX,
    RaftClient,
    client,
    heartbeat,
    node_config,
    pair_of_nodes,
    running_node,
)

FRAME_MAX = 1 << 20  # raft_frame_bytes_max in the cap tests (its smallest allowed value)
PART_BYTES = 1 << 16  # pysyncobj's appendEntriesBatchSizeBytes: a larger entry travels in parts of this size
LOGGER = "rcq.server.raft.transport_patches"


# =========================================================================== the node's end
def node_side(replicator: RaftReplicator, raft_client: RaftClient) -> Any:
    """The node's TcpConnection for the test's socket, once it has one."""
    wanted = raft_client.sock.getsockname()
    for conn in connections_of(transport_of(replicator._sync_obj)):
        sock = connection_private(conn, "socket")
        with contextlib.suppress(OSError):
            if sock is not None and sock.getpeername() == wanted:
                return conn
    return None


def buffered(replicator: RaftReplicator, raft_client: RaftClient) -> Any:
    """What the node holds of the test's connection, not yet handled (None without a connection)."""
    conn = node_side(replicator, raft_client)
    return None if conn is None else connection_private(conn, "readBuffer")


def pysyncobj_own(monkeypatch: pytest.MonkeyPatch, fix: str) -> None:
    """Put back pysyncobj's own methods in place of one of rcq's fixes, for this test."""
    for replaced in {**transport_patches.REPLACED, **reassembly.REPLACED}[fix]:
        monkeypatch.setattr(replaced.owner, replaced.attribute, replaced.original)


def refusals(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and "announced a frame" in r.getMessage()]


@pytest.fixture(autouse=True)
def _fresh_refusal_reports(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts with the refused-frame warning not rate-limited by an earlier test's."""
    monkeypatch.setattr(transport_patches, "_refused_frames", {"next_report": 0.0, "unreported": 0})


# =========================================================================== H13: frame caps
def test_connections_without_a_node_config_get_its_defaults() -> None:
    fields = NodeConfig.model_fields
    assert transport_patches.FrameLimits() == transport_patches.FrameLimits(
        handshake_bytes_max=fields["raft_handshake_frame_bytes_max"].default,
        authenticated_bytes_max=fields["raft_frame_bytes_max"].default)


@pytest.mark.parametrize("announced", [HANDSHAKE_MAX + 1, 2**31 - 1, -1, -(2**31)])
async def test_an_unauthenticated_client_announcing_too_big_a_frame_is_closed_on_the_header_alone(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, announced: int) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    async with running_node(node_config(tmp_path)) as replicator, \
            client(replicator._config.raft_address) as raft_client:
        raft_client.sock.sendall(struct.pack("i", announced))  # the header, nothing of the frame

        await async_wait_until(raft_client.closed_by_node, LOCAL_WAIT_S, what="the node closing the connection")

        host, port = raft_client.sock.getsockname()[:2]
        assert refusals(caplog) == [f"Raft connection with {host}:{port} announced a frame of {announced} bytes, "
                                    f"over the {HANDSHAKE_MAX} allowed before authentication: closing it"]
        assert node_side(replicator, raft_client) is None
        assert SECRET not in caplog.text


async def test_refused_frames_are_reported_at_most_once_per_interval(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    async with running_node(node_config(tmp_path)) as replicator:
        for _ in range(5):  # someone connecting in a loop
            async with client(replicator._config.raft_address) as raft_client:
                raft_client.sock.sendall(struct.pack("i", 2**31 - 1))
                await async_wait_until(raft_client.closed_by_node, LOCAL_WAIT_S, what="the node closing the connection")
        assert len(refusals(caplog)) == 1
        assert transport_patches._refused_frames["unreported"] == 4
        transport_patches._refused_frames["next_report"] = 0.0  # the interval is over
        async with client(replicator._config.raft_address) as raft_client:
            raft_client.sock.sendall(struct.pack("i", -1))
            await async_wait_until(raft_client.closed_by_node, LOCAL_WAIT_S, what="the node closing the connection")
        assert refusals(caplog)[-1].endswith("closing it (4 more refused since the last report)")


async def test_a_frame_at_the_handshake_limit_is_read(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    async with running_node(node_config(tmp_path)) as replicator, \
            client(replicator._config.raft_address) as raft_client:
        raft_client.sock.sendall(struct.pack("i", HANDSHAKE_MAX) + b"x" * HANDSHAKE_MAX)
        # Read whole, then refused by pysyncobj's own check: it is not sealed with the secret.
        await async_wait_until(raft_client.closed_by_node, LOCAL_WAIT_S, what="the node closing the connection")
        assert refusals(caplog) == []


async def test_a_valid_first_frame_does_not_authenticate(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The first frame on an incoming connection is the peer's nonce, sealed with the secret, but a
    recorded one could be replayed: only a frame carrying the node's nonce proves the secret."""
    caplog.set_level(logging.WARNING, logger=LOGGER)
    async with running_node(node_config(tmp_path)) as replicator, \
            client(replicator._config.raft_address) as raft_client:
        raft_client.exchange_nonces()
        raft_client.sock.sendall(struct.pack("i", HANDSHAKE_MAX + 1))
        await async_wait_until(raft_client.closed_by_node, LOCAL_WAIT_S, what="the node closing the connection")
        assert len(refusals(caplog)) == 1
        assert "before authentication" in refusals(caplog)[0]


async def test_an_authenticated_peer_may_send_frames_up_to_raft_frame_bytes_max(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    config = node_config(tmp_path, raft_frame_bytes_max=FRAME_MAX)
    async with running_node(config) as replicator, client(config.raft_address) as raft_client:
        raft_client.handshake(as_address=config.peers[0].raft_address)
        frame = raft_client.frame(heartbeat(term=7, padding=FRAME_MAX // 2))
        assert HANDSHAKE_MAX < len(frame) - 4 <= FRAME_MAX
        raft_client.sock.sendall(frame)
        await async_wait_until(lambda: replicator.term == 7, LOCAL_WAIT_S, what="the node following term 7")
        assert not raft_client.closed_by_node()
        assert refusals(caplog) == []

        raft_client.sock.sendall(struct.pack("i", FRAME_MAX + 1))
        await async_wait_until(raft_client.closed_by_node, LOCAL_WAIT_S, what="the node closing the connection")
        assert len(refusals(caplog)) == 1
        assert f"announced a frame of {FRAME_MAX + 1} bytes, over the {FRAME_MAX} allowed to a peer" in refusals(caplog)[0]


async def test_without_a_cluster_secret_only_raft_frame_bytes_max_applies(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Without a secret (insecure, local development only: H10) there is nothing to prove."""
    caplog.set_level(logging.WARNING, logger=LOGGER)
    config = node_config(tmp_path, raft_frame_bytes_max=FRAME_MAX).model_copy(
        update={"cluster_secret": None, "insecure": True})
    async with running_node(config) as replicator, client(config.raft_address, secret=None) as raft_client:
        # The peer's address, padded past the handshake's cap (zlib and pickle ignore what follows).
        first = zlib.compress(pysyncobj_pickle.dumps(config.peers[0].raft_address)) + b"x" * HANDSHAKE_MAX
        raft_client.sock.sendall(struct.pack("i", len(first)) + first)
        raft_client.send(heartbeat(term=7))
        await async_wait_until(lambda: replicator.term == 7, LOCAL_WAIT_S, what="the node following term 7")
        assert refusals(caplog) == []

        raft_client.sock.sendall(struct.pack("i", FRAME_MAX + 1))
        await async_wait_until(raft_client.closed_by_node, LOCAL_WAIT_S, what="the node closing the connection")
        assert [f"over the {FRAME_MAX} allowed to a peer" in line for line in refusals(caplog)] == [True]


async def test_without_the_cap_pysyncobj_buffers_what_an_unauthenticated_client_announces(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """The dependency's behaviour, shown: if this fails, pysyncobj changed; revisit H13."""
    caplog.set_level(logging.WARNING, logger=LOGGER)
    pysyncobj_own(monkeypatch, "read path")
    junk = 1 << 20
    async with running_node(node_config(tmp_path)) as replicator, \
            client(replicator._config.raft_address) as raft_client:
        raft_client.sock.sendall(struct.pack("i", 2**31 - 1) + b"x" * junk)  # "2 GiB follow", from anyone

        await async_wait_until(lambda: len(buffered(replicator, raft_client)) == 4 + junk, LOCAL_WAIT_S,
                               what="the node buffering the junk")
        assert not raft_client.closed_by_node()  # ...and it would wait for the rest of the 2 GiB
        assert refusals(caplog) == []


# =========================================================================== H14: linear buffers
@pytest.mark.parametrize("fixed", [True, False], ids=["rcq", "pysyncobj"])
async def test_a_large_frame_is_read_into_one_buffer_extended_in_place(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fixed: bool) -> None:
    """pysyncobj makes a new, longer bytes object (a copy of all so far) for every recv(): quadratic."""
    if not fixed:
        pysyncobj_own(monkeypatch, "read path")
    config = node_config(tmp_path)
    async with running_node(config) as replicator, client(config.raft_address) as raft_client:
        raft_client.handshake(as_address=config.peers[0].raft_address)
        frame = raft_client.frame(heartbeat(term=8, padding=3 << 20))
        third = len(frame) // 3
        raft_client.sock.sendall(frame[:third])
        await async_wait_until(lambda: len(buffered(replicator, raft_client) or b"") == third, LOCAL_WAIT_S,
                               what="the first third buffered")
        first = buffered(replicator, raft_client)
        raft_client.sock.sendall(frame[third:2 * third])
        await async_wait_until(lambda: len(buffered(replicator, raft_client)) == 2 * third, LOCAL_WAIT_S,
                               what="two thirds buffered")
        if fixed:
            assert buffered(replicator, raft_client) is first, "the read buffer was copied"
        else:
            assert buffered(replicator, raft_client) is not first
        raft_client.sock.sendall(frame[2 * third:])
        await async_wait_until(lambda: replicator.term == 8, LOCAL_WAIT_S, what="the message handled")
        assert not buffered(replicator, raft_client)


def transmission(entry: tuple[bytes, int, int], term: int, prev: tuple[int, int], part_bytes: int = PART_BYTES,
                 finish_from: int | None = None) -> list[dict[str, Any]]:
    """A leader's messages for one large entry: its pickle in parts ('start', 'process'..., 'finish'),
    each part from the one reaching ``finish_from`` bytes marked 'finish' (by default the pickle's
    length: the last part only)."""
    data = pysyncobj_pickle.dumps(entry)
    end = len(data) if finish_from is None else finish_from

    def kind(pos: int) -> str:
        return "start" if pos == 0 else "finish" if pos + part_bytes >= end else "process"

    return [{"type": "append_entries", "transmission": kind(pos), "data": data[pos:pos + part_bytes], "term": term,
             "commit_index": 1, "prevLogIdx": prev[0], "prevLogTerm": prev[1]} for pos in range(0, len(data), part_bytes)]


def as_pysyncobj_sends(entry: tuple[bytes, int, int], term: int, prev: tuple[int, int]) -> list[dict[str, Any]]:
    """The parts as pysyncobj 0.3.17's leader marks them (``__sendAppendEntries``): 'finish' from the
    part reaching the *command's* length, ``pos + part_bytes >= len(entry[0])``, though the pickle
    of the entry goes on."""
    return transmission(entry, term, prev, finish_from=len(entry[0]))


@pytest.mark.parametrize("fixed", [True, False], ids=["rcq", "pysyncobj"])
async def test_a_large_entry_is_reassembled_in_one_buffer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          fixed: bool) -> None:
    """pysyncobj's ``__recvTransmission += data`` makes a new bytes object per part: quadratic."""
    if not fixed:
        pysyncobj_own(monkeypatch, "reassembly")
    replicator = RaftReplicator(config_of(tmp_path), QueueStateMachine(), auto_tick=False)
    await replicator.start()
    try:
        raft = ManualRaft(replicator)
        prev = raft.log()[-1]
        entry = (os.urandom(1 << 20), prev[0] + 1, 6)
        seen = []
        for message in transmission(entry, term=6, prev=prev, part_bytes=1 << 16):
            raft.receive(raft.peers[0], message)
            seen.append(raft.sync_obj._SyncObj__recvTransmission)  # type: ignore[attr-defined]
        reassembling = seen[:-1]  # after 'finish' pysyncobj resets it
        if fixed:
            assert all(buffer is reassembling[0] for buffer in reassembling), "the parts were copied"
        else:
            assert len({id(buffer) for buffer in reassembling}) == len(reassembling)
        assert raft.entry(entry[1]) == entry
        assert raft.log()[-1] == (entry[1], 6)
    finally:
        await replicator.stop()


async def test_two_nodes_replicate_a_large_entry_over_the_hardened_transport(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """pysyncobj's own sender on the other side: the handshake under the default cap, a 1 MiB binary
    item travelling in 64 KiB parts, read and reassembled by rcq's code, several of them marked
    'finish' too early (H20), and not one error logged (without H20 the follower logged a failed
    tick, with a traceback, for each)."""
    item = os.urandom(1 << 20)
    async with contextlib.AsyncExitStack() as stack:
        nodes = [await stack.enter_async_context(running_node(config)) for config in pair_of_nodes(tmp_path)]
        await async_wait_until(lambda: any(n.is_leader() for n in nodes), LOCAL_RAFT_WAIT_S, what="a leader")
        leader = next(n for n in nodes if n.is_leader())
        follower = next(n for n in nodes if n is not leader)
        batch = CommitBatch(term=leader.term, now_ms=time.time_ns() // 1_000_000, units=(
            CommitUnit((TransactionWrite("big", enqueues=(("q", (item,)),)),)),))
        await leader.submit(batch, timeout_s=30)

        def replicated() -> bool:
            return follower.read(lambda sm: sm.count("q") == 1 and sm.values("q", sm.item_ids("q")) == [item])

        await async_wait_until(replicated, LOCAL_RAFT_WAIT_S, what="the item on the follower")
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


# =========================================================================== H20: 'finish' too early
@pytest.mark.parametrize("fixed", [True, False], ids=["rcq", "pysyncobj"])
async def test_a_large_entry_marked_finish_too_early_is_taken_at_its_last_part(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fixed: bool) -> None:
    """pysyncobj unpickles the parts so far at every 'finish': at each early one "pickle data was
    truncated" escapes the message handler, and so the tick (logged "failed _onTick" with its
    traceback); rcq takes an early 'finish' for what it is, one more part."""
    if not fixed:
        pysyncobj_own(monkeypatch, "whole entries")
    replicator = RaftReplicator(config_of(tmp_path), QueueStateMachine(), auto_tick=False)
    await replicator.start()
    try:
        raft = ManualRaft(replicator)
        answers: list[dict[str, Any]] = []

        def send(_node: Any, message: dict[str, Any]) -> bool:  # what the node answers the leader
            answers.append(message)
            return True

        monkeypatch.setattr(transport_of(raft.sync_obj), "send", send)
        prev = raft.log()[-1]
        entry = (os.urandom(1 << 20), prev[0] + 1, 6)  # binary: its pickle is about 1.5 times as long
        messages = as_pysyncobj_sends(entry, term=6, prev=prev)
        early = sum(message["transmission"] == "finish" for message in messages[:-1])
        assert early >= 2, "pysyncobj's sender no longer marks parts 'finish' too early: revisit H20"
        failures = []
        for message in messages:
            try:
                raft.receive(raft.peers[0], message)
            except Exception as exc:
                failures.append(exc)
        if fixed:
            # (with where each failure came from: one KeyError was seen once, on a loaded machine)
            assert failures == [], ["".join(traceback.format_exception(f)) for f in failures]
            assert [(a["success"], a["reset"]) for a in answers] == [(False, False)] * (len(messages) - 1) + [(True, False)]
            assert answers[-1]["next_node_idx"] == entry[1] + 1  # the entry acknowledged once, at its last part
            assert raft.entry(entry[1]) == entry  # taken whole at the last part
            assert reassembled_so_far(raft.sync_obj) == ""  # and nothing kept of it
        else:
            # UnpicklingError, then its fallback's EOFError or UnicodeDecodeError, at every early
            # 'finish'. Once (a loaded CI machine, 2026-11-26) pysyncobj's own path failed the last
            # part too, holding a truncated entry: the hazard at its worst, not what rcq runs.
            assert len(failures) >= early, failures
            assert all(isinstance(f, pickle.UnpicklingError | EOFError | UnicodeDecodeError) for f in failures), failures
    finally:
        await replicator.stop()


async def test_an_entry_cut_off_with_its_connection_is_taken_whole_when_sent_again(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The test plays the leader over real sockets, as pysyncobj's leader goes on: a connection
    closed in the middle of a large entry (and of a frame) takes the rest of the entry with it;
    on the next connection the node refuses the leader's next message (it lacks the entry: a reset
    to its index), and the leader sends the entry again from its 'start'. The node takes it whole,
    its early 'finish' parts included, and logs no error."""
    config = node_config(tmp_path)
    async with running_node(config) as replicator:
        sync_obj = replicator._sync_obj
        assert sync_obj is not None
        journal = journal_of(sync_obj)  # read while the node idles: no leader but the test's
        prev = (int(journal[-1][1]), int(journal[-1][2]))
        entry = (os.urandom(1 << 20), prev[0] + 1, 9)
        messages = as_pysyncobj_sends(entry, term=9, prev=prev)
        peer = config.peers[0].raft_address
        async with client(config.raft_address) as cut:
            cut.handshake(as_address=peer)
            cut.sock.sendall(b"".join(cut.frame(message) for message in messages[:4]) + cut.frame(messages[4])[:1000])
            await async_wait_until(lambda: len(reassembled_so_far(sync_obj)) == 4 * PART_BYTES, LOCAL_WAIT_S,
                                   what="four parts received")
        async with client(config.raft_address) as again:
            again.handshake(as_address=peer)
            again.send({"type": "append_entries", "term": 9, "commit_index": 1, "prevLogIdx": entry[1],
                        "prevLogTerm": 9, "entries": []})  # pysyncobj's leader counted the entry as sent
            assert again.receive() == {"type": "next_node_idx", "next_node_idx": entry[1], "reset": True,
                                       "success": False}
            for message in messages:
                again.send(message)
            answers = [again.receive() for _ in messages]
            assert [(a["success"], a["next_node_idx"]) for a in answers][-1] == (True, entry[1] + 1)
            assert not any(a["success"] for a in answers[:-1])
        assert entry_term(sync_obj, entry[1]) == 9 and tuple(journal[-1]) == entry
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


# =========================================================================== H15: EMFILE
@contextlib.contextmanager
def descriptors_exhausted() -> Iterator[None]:
    """No free file descriptor in this process until the block ends: the soft limit lowered to
    just above the highest one open, the gaps below it filled."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    highest = max(int(fd) for fd in os.listdir("/proc/self/fd"))
    filler = os.open(os.devnull, os.O_RDONLY)
    held = [filler]
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, max(highest, filler) + 1), hard))
    try:
        for _ in range(highest + 1):  # bounded: at most every number below the limit
            try:
                held.append(os.dup(filler))
            except OSError:
                break
        yield
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def listener(replicator: RaftReplicator) -> Any:
    return transport_server(transport_of(replicator._sync_obj))


async def a_tick_passed(replicator: RaftReplicator) -> None:
    """Wait for a whole tick: the first one dials the peers (their sockets need descriptors too)."""
    sync_obj, ticked = replicator._sync_obj, threading.Event()
    assert sync_obj is not None
    sync_obj.addOnTickCallback(ticked.set)
    try:
        await async_wait_until(ticked.is_set, LOCAL_WAIT_S, what="a tick")
    finally:
        sync_obj.removeOnTickCallback(ticked.set)


async def test_the_listener_accepts_again_once_descriptors_are_free(tmp_path: Path,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    config = node_config(tmp_path)
    async with running_node(config) as replicator:
        await a_tick_passed(replicator)
        host, port = config.raft_address.rsplit(":", 1)
        waiting = RaftClient(socket.socket())  # its descriptor taken while there are some
        try:
            retries: set[float] = set()

            def retried_twice() -> bool:
                retries.add(getattr(listener(replicator), transport_patches._RESUME_AT, None) or 0.0)
                return len(retries - {0.0}) >= 2

            with descriptors_exhausted():
                waiting.sock.connect((host, int(port)))  # in the backlog; the node's accept() fails
                await async_wait_until(retried_twice, LOCAL_WAIT_S, interval_s=0.01, what="accept failing, twice")

            waiting.exchange_nonces()  # accepted from the backlog, and answered
            async with client(config.raft_address) as new:
                new.handshake(as_address=config.peers[0].raft_address)
                new.send(heartbeat(term=9))
                await async_wait_until(lambda: replicator.term == 9, LOCAL_WAIT_S, what="the new connection served")
        finally:
            waiting.close()
        lines = [r.getMessage() for r in caplog.records if r.name == LOGGER]
        assert len(lines) == 2, lines  # once per episode, however many retries
        assert lines[0].startswith(f"Raft listener {config.raft_address} cannot accept a connection (EMFILE")
        assert lines[1].startswith(f"Raft listener {config.raft_address} accepts connections again")


async def test_without_the_fix_one_emfile_closes_pysyncobjs_listener_for_good(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The dependency's behaviour, shown: if this fails, pysyncobj changed; revisit H15."""
    pysyncobj_own(monkeypatch, "accept")
    config = node_config(tmp_path)
    async with running_node(config) as replicator:
        await a_tick_passed(replicator)
        host, port = config.raft_address.rsplit(":", 1)
        waiting = socket.socket()
        try:
            with descriptors_exhausted():
                waiting.connect((host, int(port)))
                await async_wait_until(lambda: server_private(listener(replicator), "fileno") is None, LOCAL_WAIT_S,
                                       what="the listener closed")
        finally:
            waiting.close()
        with pytest.raises(ConnectionRefusedError):  # descriptors are free again, the port is not
            RaftClient.connect(config.raft_address).close()


# =========================================================================== measurements
def _measure_frame(size: int) -> float:
    """Seconds for a node-side TcpConnection to receive and decode one ``size``-byte message."""
    from pysyncobj.poller import createPoller

    # zlib level 0 (pysyncobj sends level 3): random bytes do not compress, and compressing 64 MiB
    # would only make the measurement slower to prepare.
    data = zlib.compress(pysyncobj_pickle.dumps({"type": "x", "data": os.urandom(size)}), 0)
    frame = struct.pack("i", len(data)) + data
    with socket.create_server(("127.0.0.1", 0)) as server, socket.create_connection(server.getsockname()) as sender:
        accepted, _ = server.accept()
        accepted.setblocking(False)
        poller, received = createPoller("auto"), []
        conn = TcpConnection(poller, onMessageReceived=received.append, socket=accepted, timeout=600,
                             recvBufferSize=2**16)  # SyncObjConf's default recvBufferSize
        conn._rcq_frame_limits = transport_patches.FrameLimits()  # as the transport stamps it
        sending = threading.Thread(target=sender.sendall, args=(frame,))
        started = time.perf_counter()
        sending.start()
        while not received:
            poller.poll(0.1)
        elapsed = time.perf_counter() - started
        sending.join()
        conn.disconnect()
    return elapsed


async def _measure_reassembly(size: int, data_dir: Path) -> float:
    replicator = RaftReplicator(config_of(data_dir), QueueStateMachine(), auto_tick=False)
    await replicator.start()
    try:
        raft = ManualRaft(replicator)
        prev = raft.log()[-1]
        messages = transmission((os.urandom(size), prev[0] + 1, 6), term=6, prev=prev, part_bytes=1 << 16)
        started = time.perf_counter()
        for message in messages:
            raft.receive(raft.peers[0], message)
        return time.perf_counter() - started
    finally:
        await replicator.stop()


def measure() -> None:
    monkeypatch = pytest.MonkeyPatch()
    for fixed in (True, False):
        if not fixed:
            pysyncobj_own(monkeypatch, "read path")
            pysyncobj_own(monkeypatch, "reassembly")
        who = "rcq" if fixed else "pysyncobj"
        for mib in (16, 32, 64):
            print(f"{who:9}: receive a {mib} MiB frame: {_measure_frame(mib << 20):.2f} s", flush=True)
        for mib in (8, 16, 32):
            with tempfile.TemporaryDirectory() as data_dir:
                seconds = asyncio.run(_measure_reassembly(mib << 20, Path(data_dir)))
            print(f"{who:9}: reassemble a {mib} MiB entry from 64 KiB parts: {seconds:.2f} s", flush=True)
    monkeypatch.undo()


if __name__ == "__main__":
    measure()


@pytest.mark.parametrize("error", ["ECONNABORTED", "EPROTO", "EPERM", "EINTR"])
def test_an_accept_error_about_one_connection_keeps_the_listener(error: str) -> None:
    """accept() failing for the connection being accepted (reset before we got to it, a firewall
    rule) says nothing about the listener: pysyncobj would unbind it for good; rcq goes on."""
    import errno as errno_module

    from pysyncobj.poller import POLL_EVENT_TYPE

    class FailingSocket:
        def accept(self) -> Any:
            raise OSError(getattr(errno_module, error), error)

    class Listener:
        unbound = False
        _TcpServer__socket = FailingSocket()

        def unbind(self) -> None:
            self.unbound = True

    listener = Listener()
    transport_patches._on_new_connection(listener, 0, POLL_EVENT_TYPE.READ)
    assert listener.unbound is False
    # any other error keeps pysyncobj's answer
    FailingSocket.accept = lambda self: (_ for _ in ()).throw(OSError(errno_module.EBADF, "EBADF"))  # type: ignore[method-assign]
    transport_patches._on_new_connection(listener, 0, POLL_EVENT_TYPE.READ)
    assert listener.unbound is True


# ------------------------------------------------------------------ the send path's compression
def sent_frames(send: Any, message: Any, encryptor: Any) -> bytes:
    """What ``send`` (pysyncobj's TcpConnection.send, or rcq's) writes for ``message``: one frame."""
    conn: Any = TcpConnection.__new__(TcpConnection)
    conn.sendRandKey, conn.encryptor = b"nonce", encryptor
    conn._TcpConnection__writeBuffer = b""
    conn._TcpConnection__trySendBuffer = lambda: None
    send(conn, message)
    written = conn._TcpConnection__writeBuffer
    (length,) = struct.unpack("i", written[:4])
    assert len(written) == 4 + length
    return written[4:]


@pytest.mark.parametrize("sealed", [True, False])
def test_frames_are_compressed_faster_and_read_by_any_node_as_before(sealed: bool) -> None:
    encryptor = getEncryptor("a cluster secret") if sealed else None
    entry = (pysyncobj_pickle.dumps({"units": [f"item-{i}" for i in range(200)]}), 7, 3)
    message = {"type": "append_entries", "term": 3, "commit_index": 6, "entries": [entry],
               "prevLogIdx": 6, "prevLogTerm": 3}
    pysyncobjs = next(r.original for r in transport_patches.REPLACED["send"])
    assert TcpConnection.send is transport_patches._send  # installed
    for send in (transport_patches._send, pysyncobjs):
        frame = sent_frames(send, message, encryptor)
        receiver: Any = TcpConnection.__new__(TcpConnection)
        receiver.encryptor, receiver.recvRandKey, receiver.recvLastTimestamp = encryptor, b"nonce", 0
        assert transport_patches._decode(receiver, frame) == message  # what every node reads
        compressed = encryptor.decrypt(frame) if encryptor else frame
        level = {transport_patches._send: transport_patches.WIRE_COMPRESSION_LEVEL, pysyncobjs: 3}[send]
        assert compressed == zlib.compress(pysyncobj_pickle.dumps((b"nonce", message)), level)
