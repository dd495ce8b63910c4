"""A client that writes requests and does not read its answers cannot grow the node's memory.

Before, every frame was read (the in-flight slot was released before the answer was written, and
aiohttp waits for the connection to drain only about once per 64 KiB), so answers piled up in
the connection's write buffer: ~240 B per frame, 228 MiB after a million. Now the node stops
reading a channel while its unsent answers are past ``session_unsent_bytes_max``, closes it with
4000 when that lasts ``session_unsent_timeout_s``, and drops the connection if even the close is
not taken within as long again. HTTP keep-alive pipelining is bounded by aiohttp itself (it stops
reading a connection holding a few pipelined requests); a test keeps it so.

One node over the in-memory replicator; the flooding client is a raw socket with a 4 KiB receive
buffer; another client commits meanwhile.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import aiohttp

from rcq.server.http.handlers import METRICS
from rcq.server.http.session_channel import CLOSE_ANSWERS_UNREAD, OPEN_CHANNELS
from rcq.server.node import Node
from rcq.testing import async_wait_until
from tests.helpers import LOCAL_WAIT_S
from tests.helpers.nodes import running_node, url_of
from tests.helpers.unread_socket import FRAMES_MAX, OPCODE_CLOSE, OPCODE_TEXT, UnreadSocket, flood_until_paused

UNSENT_MAX = 16 << 10
UNREAD_CLOSE_AFTER_S = 1.0  # the nodes' session_unsent_timeout_s
IN_FLIGHT_MAX = 16
ANSWER_BYTES_MAX = 1024  # a status answer is ~200 bytes
STALLED_S = 0.2  # a write the node has not taken for this long: look whether it stopped reading
SETTINGS = {"session_unsent_bytes_max": UNSENT_MAX, "session_unsent_timeout_s": UNREAD_CLOSE_AFTER_S,
            "session_in_flight_max": IN_FLIGHT_MAX}


def port_of(node: Node) -> int:
    return int(url_of(node).rsplit(":", 1)[1])


async def commit_meanwhile(url: str, stop: asyncio.Event) -> list[int]:
    """One-request transactions over HTTP until ``stop``; their statuses."""
    statuses = []
    body = {"operations": [{"op": "enqueue", "queue": "bystander", "items": ["x"]}]}
    async with aiohttp.ClientSession() as http:
        while not stop.is_set():
            async with http.post(url + "/v1/execute", json=body) as response:
                statuses.append(response.status)
    return statuses


async def sample_unsent(node: Node, stop: asyncio.Event) -> int:
    """The most unsent answer bytes of the node's channels, seen every millisecond until ``stop``."""
    most = 0
    while not stop.is_set():
        most = max(most, node.app[METRICS].sessions.unsent_bytes())
        await asyncio.sleep(0.001)  # pace: a sample each millisecond
    return most


async def test_a_client_that_does_not_read_is_not_read_and_is_closed_4000_while_others_commit(tmp_path: Path):
    async with running_node(tmp_path, **SETTINGS) as node:
        stats = node.app[METRICS].sessions
        stop = asyncio.Event()
        committing = asyncio.create_task(commit_meanwhile(url_of(node), stop))
        sampling = asyncio.create_task(sample_unsent(node, stop))
        flood = await UnreadSocket.session_channel(port_of(node), None, LOCAL_WAIT_S)
        try:
            channel, written = await flood_until_paused(node.app[OPEN_CHANNELS].channels, flood)
            # The node may read on while the client's kernel still takes answers (its window opens
            # as it fills); once it decides to close, it reads nothing more.
            await async_wait_until(lambda: channel.closing_code is not None, UNREAD_CLOSE_AFTER_S + LOCAL_WAIT_S,
                                   what="the node to close the channel that does not read")
            read_when_paused = stats.frames_in
            assert channel.closing_code == CLOSE_ANSWERS_UNREAD
            assert read_when_paused < written, (read_when_paused, written)
            stop.set()
            most_unsent = await sampling
            assert most_unsent <= UNSENT_MAX + IN_FLIGHT_MAX * ANSWER_BYTES_MAX, most_unsent
            # the client reads at last: every request read was answered, then comes the close
            received = await flood.read_until_close(UNREAD_CLOSE_AFTER_S + LOCAL_WAIT_S)
            answers = [payload for opcode, payload in received if opcode == OPCODE_TEXT]
            assert len(answers) == read_when_paused
            assert {json.loads(answer)["status"] for answer in answers} == {404}
            opcode, payload = received[-1]
            assert opcode == OPCODE_CLOSE and int.from_bytes(payload[:2], "big") == CLOSE_ANSWERS_UNREAD, received[-1]
            assert b"answers unread" in payload
            assert stats.frames_in == read_when_paused, "the node read a channel it was closing"
        finally:
            stop.set()
            flood.abort()
            statuses = await committing
        assert len(statuses) > 1 and set(statuses) == {200}, statuses
        await async_wait_until(lambda: stats.closed_total[CLOSE_ANSWERS_UNREAD] == 1, LOCAL_WAIT_S,
                               what="the close counted by its code")


async def test_a_client_that_never_reads_has_its_connection_dropped_when_the_close_is_not_taken(tmp_path: Path):
    async with running_node(tmp_path, **SETTINGS) as node:
        stats = node.app[METRICS].sessions
        flood = await UnreadSocket.session_channel(port_of(node), None, LOCAL_WAIT_S)
        try:
            await flood_until_paused(node.app[OPEN_CHANNELS].channels, flood)
            await async_wait_until(lambda: not node.app[OPEN_CHANNELS].channels, 2 * UNREAD_CLOSE_AFTER_S + LOCAL_WAIT_S,
                                   what="the channel gone, its connection dropped")
            assert stats.closed_total[CLOSE_ANSWERS_UNREAD] == 1
            assert stats.unsent_bytes() == 0
        finally:
            flood.abort()


async def test_pipelined_http_requests_are_not_read_while_their_answers_are_not(tmp_path: Path):
    async with running_node(tmp_path) as node:
        requests = node.app[METRICS].requests
        flood = await UnreadSocket.connect(port_of(node))
        try:
            written = await flood.write_until_refused(b"GET /healthz HTTP/1.1\r\nHost: rcq\r\n\r\n", FRAMES_MAX,
                                                      STALLED_S)
            assert written < FRAMES_MAX, "the node read every pipelined request"

            def answered() -> float:
                return sum(sample.value for metric in requests.collect() for sample in metric.samples
                           if sample.name.endswith("_total") and sample.labels.get("route") == "/healthz")

            seen: list[float] = []

            def settled() -> bool:  # the same count at two looks STALLED_S apart
                seen.append(answered())
                return len(seen) > 1 and seen[-1] == seen[-2]

            await async_wait_until(settled, LOCAL_WAIT_S, what="the count of answered requests to stop growing",
                                   interval_s=STALLED_S)
            assert seen[-1] < written / 2, (seen[-1], written)  # most of them were never read
            async with aiohttp.ClientSession() as http, http.get(url_of(node) + "/healthz") as response:
                assert response.status == 200  # everyone else is served
        finally:
            flood.abort()
