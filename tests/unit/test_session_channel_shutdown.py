"""A node that stops ends its session channels itself: in-flight requests answered, later frames
refused (503, not run), then close 1001. Without it aiohttp's shutdown waits for the channel's
handler, which a client that keeps its channel open holds up until the node is killed.

One node over the in-memory replicator (no peers: nothing to hand leadership to).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp

from rcq.server.http.session_channel import OPEN_CHANNELS, close_all
from rcq.server.node import Node
from rcq.testing import InMemoryReplicator, wait_until
from tests.helpers import LOCAL_WAIT_S
from tests.helpers.nodes import make_config, running_node, url_of
from tests.helpers.raw_channel import gather_answers, open_channel

LONG_POLL_MS = 1_500  # the receive in flight while the node stops: it ends within the drain (5 s)


async def test_a_stopping_node_answers_what_is_in_flight_refuses_later_frames_and_closes_1001(tmp_path: Path):
    node = Node(make_config(tmp_path / "n1"), replicator=InMemoryReplicator())
    await node.start()
    stopping: asyncio.Task[None] | None = None
    try:
        await wait_until(lambda: node.manager.serving, LOCAL_WAIT_S, message="node serving")
        async with aiohttp.ClientSession() as http, open_channel(http, url_of(node), None) as channel:
            await channel.send({"id": 1, "op": "receive", "queue": "q", "wait_ms": LONG_POLL_MS})
            # frames are read in order: once 2 is answered, 1 is in flight, waiting for items
            assert (await channel.request({"id": 2, "op": "begin"}))["status"] == 201
            stopping = asyncio.create_task(node.stop())
            channels = node.app[OPEN_CHANNELS].channels
            await wait_until(lambda: all(c._refusing for c in channels), LOCAL_WAIT_S,
                             message="the node to start ending its channel")
            await channel.send({"id": 3, "op": "begin"})
            answers = {a["id"]: a for a in await gather_answers(channel, 2, LOCAL_WAIT_S)}
            assert answers[3]["status"] == 503 and answers[3]["body"]["error"]["code"] == "unavailable", answers
            assert "did not run" in answers[3]["body"]["error"]["message"], answers
            assert answers[1]["status"] == 200 and answers[1]["body"]["items"] == [], answers
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
        await wait_until(lambda: not channels, LOCAL_WAIT_S, message="the channel's handler to end")
