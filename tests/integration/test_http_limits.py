"""HTTP connection limits: the cap, the head and body deadlines, idle keep-alive, EMFILE.

Most tests run a Node in this process (in-memory replication) and talk raw HTTP/1.1 over
asyncio streams, so they control every byte and its timing. Two start real node processes
with a lowered RLIMIT_NOFILE: a 3-node cluster whose leader is flooded with idle connections
(its cap, three quarters of that limit, keeps descriptors for Raft), and a single node whose
cap is set above the limit, so accept() does fail with EMFILE.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import logging
import os
import resource
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from rcq.local.cluster import LocalCluster
from rcq.local.polls import deadline_loop, http_json
from rcq.private_files import write_private
from rcq.server.config import NodeConfig
from rcq.server.http.connections import ACCEPT_PAUSED, ConnectionLimiter, accept_backlog, connections_max_for
from rcq.server.node import Node
from rcq.testing import InMemoryReplicator, async_wait_until, wait_until
from tests.helpers import LEADER_TIMEOUT_S, LOCAL_WAIT_S, QUIET_CLUSTER_WAIT_S
from tests.helpers.cluster import wait_settled

StartNode = Callable[..., Awaitable[Node]]
HEAD = b"GET /healthz HTTP/1.1\r\nHost: rcq\r\n\r\n"
# What the descriptor floods cause in a node's log: asyncio logs each accept() that meets EMFILE, and
# pauses accepting for a moment (tests/helpers/node_logs.py).
ACCEPT_OUT_OF_DESCRIPTORS = r"socket\.accept\(\) out of system resource[\s\S]*Too many open files"


# ------------------------------------------------------------------ in-process helpers
@pytest.fixture
async def start_node(tmp_path: Path) -> AsyncIterator[StartNode]:
    nodes: list[Node] = []

    async def start(**overrides: Any) -> Node:
        config = NodeConfig(node_id="n1", http_port=0, raft_address="127.0.0.1:1", data_dir=tmp_path,
                            insecure=True, **overrides)
        node = Node(config, replicator=InMemoryReplicator())
        await node.start()
        nodes.append(node)
        return node

    yield start
    for node in nodes:
        await node.stop()


@pytest.fixture
async def connections() -> AsyncIterator[Callable[[int], Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]]:
    """Open raw connections to a port; all closed after the test."""
    writers: list[asyncio.StreamWriter] = []

    async def connect(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writers.append(writer)
        return reader, writer

    yield connect
    for writer in writers:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


def limiter_of(node: Node) -> ConnectionLimiter:
    assert node.http_listener is not None and node.http_listener.limiter is not None
    return node.http_listener.limiter


async def read_response(reader: asyncio.StreamReader, timeout_s: float = 5.0) -> tuple[int, dict[str, str], Any]:
    """(status, lower-cased headers, decoded JSON body) of one Content-Length-framed response."""
    async with asyncio.timeout(timeout_s):
        head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
        lines = head.split("\r\n")
        headers = {name.strip().lower(): value.strip()
                   for name, _, value in (line.partition(":") for line in lines[1:] if line)}
        body = await reader.readexactly(int(headers.get("content-length", "0")))
    return int(lines[0].split()[1]), headers, json.loads(body) if body else None


async def seconds_until_closed(reader: asyncio.StreamReader, timeout_s: float) -> float:
    """Read (and drop) until the server closes the connection; how long that took.
    Raises TimeoutError if it is still open after ``timeout_s``."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    async with asyncio.timeout(timeout_s):
        try:
            while await reader.read(4096):
                pass
        except ConnectionError:  # a reset is a close too
            pass
    return loop.time() - start


async def dribble(writer: asyncio.StreamWriter, data: bytes, interval_s: float) -> None:
    """Send ``data`` one byte per ``interval_s`` (the pace of a slowloris, not a synchronisation)."""
    with contextlib.suppress(ConnectionError):
        for byte in data:
            writer.write(bytes([byte]))
            await writer.drain()
            await asyncio.sleep(interval_s)  # pace: a slowloris's


# ------------------------------------------------------------------ the cap
async def test_connections_past_the_cap_are_refused_while_open_ones_are_still_served(start_node, connections):
    node = await start_node(http_connections_max=3, http_header_timeout_s=60)
    limiter = limiter_of(node)
    assert node.port is not None
    served_reader, served_writer = await connections(node.port)  # a well-behaved keep-alive client
    served_writer.write(HEAD)
    assert (await read_response(served_reader))[0] == 200
    for _ in range(2):  # idle connections that take the other two places
        await connections(node.port)
    await async_wait_until(lambda: limiter.open_count == 3, LOCAL_WAIT_S, what="3 open connections")

    for _ in range(3):
        reader, writer = await connections(node.port)
        writer.write(HEAD)
        status, headers, body = await read_response(reader)
        assert status == 503 and headers["retry-after"] == "1" and headers["connection"] == "close"
        assert body["error"]["code"] == "too_many_connections" and body["error"]["retryable"] is True
        assert await seconds_until_closed(reader, 5) < 5
    reader, _ = await connections(node.port)  # refused without sending anything: answered, then closed
    assert (await read_response(reader))[0] == 503
    assert await seconds_until_closed(reader, 5) < 5
    assert limiter.refused_total == 4 and limiter.open_count == 3

    for _ in range(3):  # the admitted connection is served all along
        served_writer.write(HEAD)
        assert (await read_response(served_reader))[0] == 200
    served_writer.close()
    await async_wait_until(lambda: limiter.open_count == 2, LOCAL_WAIT_S, what="a place freed")
    reader, writer = await connections(node.port)
    writer.write(HEAD)
    assert (await read_response(reader))[0] == 200


async def test_the_default_cap_is_three_quarters_of_the_open_file_limit(start_node):
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    node = await start_node()
    assert limiter_of(node).connections_max == soft * 3 // 4
    config = node.config.model_copy(update={"http_connections_max": 10})
    assert connections_max_for(config, 1000) == 10
    assert connections_max_for(node.config, 1000) == 750
    # asyncio accepts up to `backlog` connections per loop iteration before refusing any:
    # an eighth of what the cap leaves free, so a burst cannot take the rest.
    assert accept_backlog(750, 1000) == 31 and accept_backlog(15_000, 20_000) == 625
    assert accept_backlog(100_000, 64) == 16 and accept_backlog(10, 1 << 20) == 1024


# ------------------------------------------------------------------ the head deadline
async def test_a_request_head_sent_byte_by_byte_is_closed_after_the_header_timeout(start_node, connections):
    node = await start_node(http_header_timeout_s=0.5, http_keepalive_s=30)
    reader, writer = await connections(node.port)
    slowloris = asyncio.create_task(dribble(writer, b"GET /healthz HTTP/1.1\r\nHost: rcq\r\nX-Slow: " + b"a" * 200, 0.05))
    elapsed = await seconds_until_closed(reader, 5)
    assert 0.4 < elapsed < 3, elapsed  # the head never ends: it was closed mid-way
    slowloris.cancel()
    assert limiter_of(node).header_timeouts_total == 1


async def test_a_connection_that_sends_nothing_is_closed_after_the_header_timeout(start_node, connections):
    node = await start_node(http_header_timeout_s=0.5, http_keepalive_s=30)
    reader, _ = await connections(node.port)
    elapsed = await seconds_until_closed(reader, 5)
    assert 0.4 < elapsed < 3, elapsed


async def test_after_a_response_the_next_head_is_timed_from_its_first_byte(start_node, connections):
    node = await start_node(http_header_timeout_s=0.5, http_keepalive_s=30)
    reader, writer = await connections(node.port)
    writer.write(HEAD)
    assert (await read_response(reader))[0] == 200
    slowloris = asyncio.create_task(dribble(writer, b"GET /healthz HTTP/1.1\r\nX-Slow: " + b"a" * 200, 0.05))
    elapsed = await seconds_until_closed(reader, 5)  # not after http_keepalive_s
    assert 0.4 < elapsed < 3, elapsed
    slowloris.cancel()


async def test_a_head_begun_after_the_previous_deadline_was_set_gets_a_whole_deadline_of_its_own(
        start_node, connections):
    # One timer per connection, set for the first head: it must wait again for a later head,
    # not close the connection when the first head's deadline passes.
    node = await start_node(http_header_timeout_s=0.6, http_keepalive_s=30)
    reader, writer = await connections(node.port)
    writer.write(HEAD)
    assert (await read_response(reader))[0] == 200
    await asyncio.sleep(0.4)  # pace: the scenario's; the next head begins 0.4 s into the first one's deadline
    slowloris = asyncio.create_task(dribble(writer, b"GET /healthz HTTP/1.1\r\nX-Slow: " + b"a" * 200, 0.05))
    elapsed = await seconds_until_closed(reader, 5)
    assert 0.5 < elapsed < 3, elapsed
    slowloris.cancel()
    assert limiter_of(node).header_timeouts_total == 1


async def test_an_idle_keepalive_connection_is_closed_after_http_keepalive_s(start_node, connections):
    node = await start_node(http_header_timeout_s=0.3, http_keepalive_s=1.5)
    reader, writer = await connections(node.port)
    writer.write(HEAD)
    assert (await read_response(reader))[0] == 200
    elapsed = await seconds_until_closed(reader, 6)
    # idle between requests is the keep-alive's business, not the head deadline's (0.3 s)
    assert 1.3 < elapsed < 4, elapsed


async def test_a_handler_slower_than_the_header_timeout_is_not_cut_off(start_node, connections):
    node = await start_node(http_header_timeout_s=0.3, http_keepalive_s=30)
    reader, writer = await connections(node.port)
    body = b'{"wait_ms": 1000}'
    writer.write(b"POST /v1/queues/q/dequeue HTTP/1.1\r\nHost: rcq\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    status, _, answer = await read_response(reader, 5)  # a long poll that finds nothing
    assert status == 200 and answer["results"][0]["items"] == []
    writer.write(HEAD)  # and the connection is still good
    assert (await read_response(reader))[0] == 200


# ------------------------------------------------------------------ the body deadline
async def test_a_body_that_stops_arriving_is_answered_408_and_its_connection_closed(start_node, connections):
    node = await start_node(http_body_timeout_s=0.5, http_header_timeout_s=30)
    reader, writer = await connections(node.port)
    loop = asyncio.get_running_loop()
    start = loop.time()
    writer.write(b"POST /v1/transactions HTTP/1.1\r\nHost: rcq\r\nContent-Type: application/json\r\n"
                 b"Content-Length: 100\r\n\r\n{")
    status, _, body = await read_response(reader, 5)
    assert status == 408 and 0.4 < loop.time() - start < 3
    assert body["error"]["code"] == "request_timeout" and body["error"]["retryable"] is True
    # closed at once: not after aiohttp's lingering read of the rest (10 s), nor the keep-alive
    assert await seconds_until_closed(reader, 2) < 2
    assert node.manager.open_count == 0


async def test_a_body_dribbled_past_the_body_timeout_is_answered_408(start_node, connections):
    # The deadline is for the whole body, however steadily its bytes come.
    node = await start_node(http_body_timeout_s=0.75, http_header_timeout_s=30)
    reader, writer = await connections(node.port)
    writer.write(b"POST /v1/transactions HTTP/1.1\r\nHost: rcq\r\nContent-Type: application/json\r\n"
                 b"Content-Length: 40\r\n\r\n")
    slow = asyncio.create_task(dribble(writer, b"{" + b" " * 38 + b"}", 0.3))
    status, _, body = await read_response(reader, 5)
    assert status == 408 and body["error"]["code"] == "request_timeout"
    assert not slow.done()
    slow.cancel()
    assert await seconds_until_closed(reader, 2) < 2


async def test_a_slow_body_that_arrives_in_time_is_served(start_node, connections):
    node = await start_node(http_body_timeout_s=3, http_header_timeout_s=3)
    reader, writer = await connections(node.port)
    body = b'{"timeout_s": 5}'
    writer.write(b"POST /v1/transactions HTTP/1.1\r\nHost: rcq\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n" % len(body))
    await dribble(writer, body, 0.02)
    status, _, answer = await read_response(reader, 5)
    assert status == 201 and answer["state"] == "open"


# ------------------------------------------------------------------ real node processes
class Flood:
    """Idle connections to one port, from this process; each is open (admitted, silent) or
    refused (answered and/or closed by the node)."""

    def __init__(self) -> None:
        self.sockets: list[socket.socket] = []
        self.refused: dict[socket.socket, bytes] = {}

    def open(self, port: int, count: int, connect_timeout_s: float = 5.0) -> None:
        for _ in range(count):
            sock = socket.create_connection(("127.0.0.1", port), timeout=connect_timeout_s)
            sock.setblocking(False)
            self.sockets.append(sock)

    def sort(self) -> int:
        """Read what the node sent; returns how many are refused so far."""
        for sock in self.sockets:
            if sock in self.refused and self.refused[sock].endswith(b"<closed>"):
                continue
            try:
                data = sock.recv(65536)
            except BlockingIOError:
                continue
            except ConnectionError:
                data = b""
            self.refused[sock] = self.refused.get(sock, b"") + (data or b"<closed>")
        return len(self.refused)

    def settle(self, minimum: int, timeout_s: float, quiet_s: float = 1.0) -> int:
        """How many are refused once at least ``minimum`` are and no more were for ``quiet_s``."""
        refused, changed = -1, time.monotonic()
        for _ in deadline_loop(timeout_s):
            now_refused = self.sort()
            if now_refused != refused:
                refused, changed = now_refused, time.monotonic()
            elif refused >= minimum and time.monotonic() - changed >= quiet_s:
                return refused
        raise TimeoutError(f"{refused} of {len(self.sockets)} connections refused, {minimum} expected, "
                           f"within {timeout_s} s")

    def close(self) -> None:
        for sock in self.sockets:
            sock.close()


@contextlib.contextmanager
def logs_on_failure(cluster: LocalCluster) -> Iterator[None]:
    """Print the nodes' log tails (pytest shows them with the failure)."""
    try:
        yield
    except BaseException:
        print(cluster.dump_logs())
        raise


def healthy(url: str) -> bool:
    try:
        return bool(http_json(url + "/healthz").get("ok"))
    except (OSError, ValueError):
        return False


def recv_exactly(sock: socket.socket, count: int) -> bytes:
    data = b""
    while len(data) < count:
        chunk = sock.recv(count - len(data))
        if not chunk:
            break
        data += chunk
    return data


class KeepAliveClient(http.client.HTTPConnection):
    """One keep-alive connection to a node of ``cluster``, sending its admin token with every request."""

    def __init__(self, cluster: LocalCluster, port: int) -> None:
        super().__init__("127.0.0.1", port, timeout=10)
        self.headers = {"Content-Type": "application/json", **cluster.auth_headers()}


def keepalive_request(connection: KeepAliveClient, method: str, path: str,
                      body: dict[str, Any] | None = None) -> tuple[int, dict[str, Any]]:
    sock = connection.sock
    connection.request(method, path, body=None if body is None else json.dumps(body), headers=connection.headers)
    response = connection.getresponse()
    answer = json.loads(response.read())
    assert sock is None or connection.sock is sock, "the client had to reconnect"
    return response.status, answer


@pytest.mark.cluster
@pytest.mark.expected_log_errors(ACCEPT_OUT_OF_DESCRIPTORS)
def test_a_leader_with_few_descriptors_flooded_with_idle_connections_keeps_serving_and_raft_keeps_working() -> None:
    nofile = 256  # the default cap is 192
    flood_size = 400
    cluster = LocalCluster(3, node_overrides={"http_header_timeout_s": 60, "http_keepalive_s": 120})
    for node in cluster.nodes:
        node.nofile_limit = nofile
    flood = Flood()
    with cluster, contextlib.closing(flood), logs_on_failure(cluster):
        leader = cluster.wait_for_leader(LEADER_TIMEOUT_S)
        wait_settled(cluster, leader)  # its own entries (level, identity) before the flood, not during it
        before = cluster.statuses()
        term = before[leader]["term"]
        client = KeepAliveClient(cluster, cluster.nodes[leader].http_port)
        with contextlib.closing(client):
            assert keepalive_request(client, "POST", "/v1/queues/flood/enqueue", {"items": ["before"]})[0] == 200

            flood.open(cluster.nodes[leader].http_port, flood_size)
            refused = flood.settle(flood_size - 191, 20)  # the client's connection is the 192nd
            admitted = flood_size - refused
            assert 192 - 5 <= admitted <= 191, (admitted, refused)
            assert all(answer.startswith(b"HTTP/1.1 503") and b'"too_many_connections"' in answer
                       for answer in flood.refused.values())

            # The cap left descriptors free for the rest of the process.
            pid = cluster.nodes[leader].pid
            assert nofile - len(os.listdir(f"/proc/{pid}/fd")) >= 32
            # The well-behaved client is served, and what it asks for goes through Raft.
            for i in range(5):
                status, answer = keepalive_request(client, "POST", "/v1/queues/flood/enqueue", {"items": [f"x{i}"]})
                assert status == 200 and answer["committed"] is True
            # Log compaction too (a forked child writes the LMDB snapshot).
            snapshots = keepalive_request(client, "GET", "/v1/cluster")[1]["snapshot_count"]
            assert keepalive_request(client, "POST", "/v1/admin/snapshot", {})[0] == 202
            wait_until(lambda: keepalive_request(client, "GET", "/v1/cluster")[1]["snapshot_count"] > snapshots,
                       QUIET_CLUSTER_WAIT_S, what="the leader's snapshot")
            # A follower restarts: its Raft connection to the leader is a new descriptor on the leader.
            # (Its election timeout made longer than the leader's redial period, 0.8 s, so that it
            # hears from the leader before it would stand for election.)
            restarted = (leader + 1) % 3
            config_path = cluster.nodes[restarted].config_path
            config = json.loads(config_path.read_text())
            config.update(raft_timeout_min_s=5.0, raft_timeout_max_s=6.0, connection_timeout_s=6.0)
            cluster.stop_node(restarted)
            write_private(config_path, json.dumps(config))
            status, answer = keepalive_request(client, "POST", "/v1/queues/flood/enqueue", {"items": ["after"]})
            assert status == 200
            commit_index = int(answer["index"])
            cluster.start_node(restarted)

            followers = [i for i in range(3) if i != leader]
            wait_until(lambda: all(int(cluster.status(i)["last_applied"]) >= commit_index for i in followers),
                       QUIET_CLUSTER_WAIT_S, what="the followers applying the commits")
            after = {i: cluster.status(i) for i in followers}
            after[leader] = keepalive_request(client, "GET", "/v1/cluster")[1]
            assert {i: (s["term"], s["leader_id"]) for i, s in after.items()} == \
                {i: (term, cluster.nodes[leader].node_id) for i in range(3)}, "the leader changed"
            assert keepalive_request(client, "GET", "/v1/queues/flood")[1]["count"] == 7
        # What the reserve protects: Raft's listener and pysyncobj's tick thread never ran out of
        # descriptors. (asyncio's HTTP accept may still meet EMFILE for a moment when a burst of
        # refused connections outpaces their closing on a loaded machine; it pauses and retries,
        # and every check above shows the node serving throughout.)
        leader_log = cluster.log_tail(leader, 200_000)
        assert "cannot accept a connection" not in leader_log, "Raft's listener ran out of descriptors"
        assert "failed _onTick" not in leader_log, "pysyncobj's tick thread failed"
        flood.close()
        wait_until(lambda: healthy(cluster.url(leader)), QUIET_CLUSTER_WAIT_S, what="a new connection served")


@pytest.mark.cluster
@pytest.mark.expected_log_errors(ACCEPT_OUT_OF_DESCRIPTORS)
def test_when_accept_fails_with_emfile_open_connections_are_served_and_accepting_resumes() -> None:
    # A cap above the open-file limit: the flood runs the node out of descriptors.
    cluster = LocalCluster(1, node_overrides={"http_connections_max": 100_000, "http_header_timeout_s": 60,
                                              "http_keepalive_s": 120})
    cluster.nodes[0].nofile_limit = 64
    flood = Flood()
    with cluster, contextlib.closing(flood), logs_on_failure(cluster):
        # Settled first (its level raised, its identity given): an entry committed while the node is
        # out of descriptors would fail the tick thread's store of the log's metadata, as the comment
        # below says of commits.
        wait_settled(cluster, cluster.wait_for_leader(LEADER_TIMEOUT_S))
        # ... and the log's metadata stored (its commit index is written once a second after it moves).
        committed = cluster.status(0)["commit_index"]
        meta_path = cluster.nodes[0].data_dir / "raft.wal.meta"
        wait_until(lambda: json.loads(meta_path.read_text()).get("commit_index", 0) >= committed, QUIET_CLUSTER_WAIT_S,
                   what="the log's metadata stored")
        port = cluster.nodes[0].http_port
        client = KeepAliveClient(cluster, port)
        with contextlib.closing(client):
            assert keepalive_request(client, "GET", "/healthz")[0] == 200
            flood.open(port, 58)  # more than the node's free descriptors, within its listen backlog
            wait_until(lambda: "out of system resource" in cluster.log_tail(0, 200_000), QUIET_CLUSTER_WAIT_S,
                       what="accept() failing with EMFILE")
            assert flood.sort() == 0  # nothing refused: the cap is not what stops them

            # The open connection is still served. (Not commits: out of descriptors, pysyncobj's tick
            # thread fails too — which is what the cap's reserve is for.)
            for _ in range(3):
                status, answer = keepalive_request(client, "GET", "/v1/cluster")
                assert status == 200 and answer["role"] == "leader"
            late = socket.create_connection(("127.0.0.1", port), timeout=5)  # waits in the listen backlog
            with contextlib.closing(late):
                late.sendall(HEAD)
                late.settimeout(1.5)
                with pytest.raises(TimeoutError):  # not accepted while descriptors are out
                    late.recv(1)
                flood.close()  # descriptors free: asyncio tries accept() again within a second
                late.settimeout(10)
                assert recv_exactly(late, 12) == b"HTTP/1.1 200"
            # and, descriptors back, Raft commits again
            status, answer = keepalive_request(client, "POST", "/v1/queues/emfile/enqueue", {"items": ["x"]})
            assert status == 200 and answer["committed"] is True
            assert keepalive_request(client, "GET", "/v1/queues/emfile")[1]["count"] == 1
        assert cluster.unexpected_exits() == {}


# ------------------------------------------------------------------ asyncio's accept retry
@contextlib.contextmanager
def open_files_capped(headroom: int) -> Iterator[None]:
    """Lower this process's RLIMIT_NOFILE soft limit to its open descriptors plus ``headroom``."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + headroom, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


async def test_a_listener_closed_while_accept_is_paused_logs_no_error(start_node, caplog):
    # After EMFILE asyncio stops accepting and calls _start_serving on the socket a second later,
    # unchecked; a node stopped within that second had it raise "Invalid file descriptor: -1",
    # logged at ERROR with a traceback (docs/dependency-workarounds.md).
    loop = asyncio.get_running_loop()
    reached: list[dict[str, Any]] = []  # what the listener's exception handler passed on
    loop.set_exception_handler(lambda _loop, context: reached.append(context))
    try:
        node = await start_node(http_connections_max=100_000, http_header_timeout_s=60)
        clients = [socket.socket() for _ in range(8)]  # made before the cap: connecting needs no descriptor
        with contextlib.ExitStack() as closing:
            for client in clients:
                closing.callback(client.close)
                client.setblocking(False)
            with caplog.at_level(logging.INFO, logger="rcq.server.http.connections"):
                with open_files_capped(headroom=2):
                    for client in clients:
                        client.connect_ex(("127.0.0.1", node.port))
                    await async_wait_until(lambda: any(c.get("message") == ACCEPT_PAUSED for c in reached), LOCAL_WAIT_S,
                                           what="the node pausing its accepts")
                    assert node.http_listener is not None
                    node.http_listener.close()  # within the second: asyncio's retry is pending
                await async_wait_until(lambda: "retry found the HTTP listener closed" in caplog.text
                                       or any(c.get("message") != ACCEPT_PAUSED for c in reached), LOCAL_WAIT_S,
                                       what="the retry finding the listener closed, or another message")
        assert [c.get("exception") for c in reached if c.get("message") != ACCEPT_PAUSED] == []
    finally:
        loop.set_exception_handler(None)
