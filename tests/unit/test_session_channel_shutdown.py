"""A node that stops ends its session channels itself: in-flight requests answered, later frames
refused (503, not run), then close 1001. Without it aiohttp's shutdown waits for the channel's
handler, which a client that keeps its channel open holds up until the node is killed. A dequeue
waiting for items (a long poll) is answered at once, empty: over the channel it would otherwise
hold the drain to its end (5 s) and then go unanswered, over HTTP the stop for up to ``wait_ms``.

One node over the in-memory replicator (no peers: nothing to hand leadership to).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp

from rcq.server.http.session_channel import OPEN_CHANNELS, close_all
from rcq.server.node import Node
from rcq.testing import InMemoryReplicator, async_wait_until
from tests.helpers import LOCAL_WAIT_S
from tests.helpers.nodes import make_config, running_node, url_of
from tests.helpers.raw_channel import gather_answers, open_channel

# The receive in flight while the node stops: far longer than the stop may take (the drain is 5 s).
# It is answered (empty) as soon as the node stops, not when it would have given up.
LONG_POLL_MS = 30_000
HELD_COMMIT_S = 1.0  # the commit in flight while the node stops: its entry is never applied


async def test_a_stopping_node_answers_what_is_in_flight_refuses_later_frames_and_closes_1001(tmp_path: Path):
    replicator = InMemoryReplicator()
    node = Node(make_config(tmp_path / "n1", commit_timeout_s=HELD_COMMIT_S), replicator=replicator)
    await node.start()
    stopping: asyncio.Task[None] | None = None
    try:
        await async_wait_until(lambda: node.manager.serving, LOCAL_WAIT_S, what="node serving")
        async with aiohttp.ClientSession() as http, open_channel(http, url_of(node), None) as channel:
            begun = await channel.request({"id": 2, "op": "begin"})
            assert begun["status"] == 201, begun
            transaction_id = begun["body"]["transaction_id"]
            enqueued = await channel.request({"id": 4, "op": "enqueue", "transaction_id": transaction_id,
                                              "queue": "q", "items": [{"value": "x"}]})
            assert enqueued["status"] == 200, enqueued
            await channel.send({"id": 1, "op": "receive", "queue": "q2", "wait_ms": LONG_POLL_MS})
            replicator.hold_submits = True  # the commit stays in flight until its timeout
            await channel.send({"id": 5, "op": "commit", "transaction_id": transaction_id})
            # frames are read in order: once 6 is answered, 1 and 5 are in flight
            assert (await channel.request({"id": 6, "op": "status", "transaction_id": transaction_id}))["status"] == 200
            stopping = asyncio.create_task(node.stop())
            channels = node.app[OPEN_CHANNELS].channels
            await async_wait_until(lambda: all(c.refusing for c in channels), LOCAL_WAIT_S,
                                   what="the node to start ending its channel")
            await channel.send({"id": 3, "op": "begin"})
            answers = await gather_answers(channel, 3, LOCAL_WAIT_S)
            by_id = {a["id"]: a for a in answers}
            # the long poll did not hold the stop: answered at once, empty, before the held commit
            assert by_id[1]["status"] == 200 and by_id[1]["body"]["items"] == [], answers
            assert [a["id"] for a in answers].index(1) < [a["id"] for a in answers].index(5), answers
            assert by_id[3]["status"] == 503 and by_id[3]["body"]["error"]["code"] == "unavailable", answers
            assert "did not run" in by_id[3]["body"]["error"]["message"], answers
            assert by_id[5]["status"] == 504, answers  # in flight when the node stopped: answered, not cut
            code, reason = await channel.close_code(LOCAL_WAIT_S)
            assert (code, reason) == (1001, "the node is shutting down")
        await asyncio.wait_for(stopping, LOCAL_WAIT_S)
        assert node.manager.open_count == 0  # the begin refused while stopping opened nothing
    finally:
        if stopping is None:
            await node.stop()
        elif not stopping.done():
            stopping.cancel()


async def test_a_channel_opened_after_the_channels_were_ended_is_closed_at_once_with_1001(tmp_path: Path):
    """An upgrade can still arrive on a connection that was open before the node stopped accepting
    new ones (keep-alive): that channel is closed as soon as it opens, not left holding the stop."""
    async with running_node(tmp_path) as node, aiohttp.ClientSession() as http:
        await close_all(node.app)  # what Node.stop does before the HTTP shutdown
        async with open_channel(http, url_of(node), None) as channel:
            code, reason = await channel.close_code(LOCAL_WAIT_S)
        assert (code, reason) == (1001, "the node is shutting down")
        channels = node.app[OPEN_CHANNELS].channels
        await async_wait_until(lambda: not channels, LOCAL_WAIT_S, what="the channel's handler to end")


async def test_a_long_poll_over_http_is_answered_empty_when_the_node_stops(tmp_path: Path):
    """The same over plain HTTP: aiohttp's shutdown waits for the handler, which waited for items."""
    node = Node(make_config(tmp_path / "n1"), replicator=InMemoryReplicator())
    await node.start()
    stopping: asyncio.Task[None] | None = None
    try:
        await async_wait_until(lambda: node.manager.serving, LOCAL_WAIT_S, what="node serving")
        async with aiohttp.ClientSession() as http:
            polling = asyncio.ensure_future(http.post(f"{url_of(node)}/v1/queues/q/receive",
                                                      json={"wait_ms": LONG_POLL_MS}))
            await async_wait_until(lambda: node.manager.open_count == 1, LOCAL_WAIT_S,
                                   what="the receive to wait for items")
            stopping = asyncio.create_task(node.stop())
            async with asyncio.timeout(LOCAL_WAIT_S):
                response = await polling
                body = await response.json()
            assert response.status == 200 and body["items"] == [], body
        await asyncio.wait_for(stopping, LOCAL_WAIT_S)
    finally:
        if stopping is None:
            await node.stop()
        elif not stopping.done():
            stopping.cancel()
