"""Every close code a node can send is documented, and a node sends each one.

The node's list (``CLOSE_CODES``), the table of ``docs/session-channel.md`` and the AsyncAPI
description hold the same codes; each code is provoked here on a node over the in-memory
replicator (1011, which only a bug produces, through the ``test_session_fault`` hook), and the
codes provoked are the list: a new way to close a channel needs its row and its test.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import aiohttp
import pytest

from rcq.server.http.session_channel import CLOSE_CODES, OPEN_CHANNELS, TEST_FAULT_OP, close_all
from rcq.server.node import Node
from rcq.testing import InMemoryReplicator, async_wait_until
from rcq.tokens import new_token, token_hash
from tests.helpers import LOCAL_WAIT_S
from tests.helpers.nodes import running_node, url_of
from tests.helpers.raw_channel import RawChannel, open_channel
from tests.helpers.unread_socket import OPCODE_CLOSE, UnreadSocket, flood_until_paused

DOC = Path(__file__).resolve().parents[2] / "docs" / "session-channel.md"
BODY_BYTES_MAX = 4096
UNREAD_CLOSE_AFTER_S = 1.0  # the nodes' session_unsent_timeout_s
TOKEN_LIFETIME_S = 2.0  # the token outlives the channel's opening, then expires
SETTINGS = {"body_bytes_max": BODY_BYTES_MAX, "item_bytes_max": 1024, "session_unsent_bytes_max": 4096,
            "session_unsent_timeout_s": UNREAD_CLOSE_AFTER_S, "session_in_flight_max": 8, "test_session_fault": True}

Provoke = Callable[[Node, InMemoryReplicator, RawChannel], Awaitable[None]]


async def idle(node: Node, replicator: InMemoryReplicator, channel: RawChannel) -> None:
    pass  # the node's session_idle_timeout_s is short here


async def shutdown(node: Node, replicator: InMemoryReplicator, channel: RawChannel) -> None:
    # what Node.stop does first (the node itself is stopped by running_node)
    asyncio.get_running_loop().create_task(close_all(node.app))


async def reused_id(node: Node, replicator: InMemoryReplicator, channel: RawChannel) -> None:
    await channel.send({"id": 1, "op": "receive", "queue": "empty", "wait_ms": 5000})
    await channel.send({"id": 1, "op": "begin"})


async def binary(node: Node, replicator: InMemoryReplicator, channel: RawChannel) -> None:
    await channel.send(b'{"id": 1, "op": "begin"}')


async def not_utf8(node: Node, replicator: InMemoryReplicator, channel: RawChannel) -> None:
    await channel.ws.send_frame(b'{"id": 1, "op": "begin", "label": "\xff"}', aiohttp.WSMsgType.TEXT)


async def token_expires(node: Node, replicator: InMemoryReplicator, channel: RawChannel) -> None:
    pass  # the token the channel was opened with expires TOKEN_LIFETIME_S after the node started


async def too_big(node: Node, replicator: InMemoryReplicator, channel: RawChannel) -> None:
    await channel.send(json.dumps({"id": 1, "op": "begin", "label": "x" * BODY_BYTES_MAX}))


async def bug(node: Node, replicator: InMemoryReplicator, channel: RawChannel) -> None:
    await channel.send({"id": 1, "op": TEST_FAULT_OP})


async def deposed(node: Node, replicator: InMemoryReplicator, channel: RawChannel) -> None:
    replicator.depose()


PROVOKED: dict[int, Provoke] = {1000: idle, 1001: shutdown, 1002: reused_id, 1003: binary, 1007: not_utf8,
                                1008: token_expires, 1009: too_big, 1011: bug, 1012: deposed}
UNREAD = 4000  # provoked below with a raw socket that never reads


def documented_codes() -> set[int]:
    section = DOC.read_text().split("## How a channel ends", 1)[1].split("\n## ", 1)[0]
    return {int(code) for code in re.findall(r"^\| (\d{4}) \|", section, re.MULTILINE)}


def test_the_node_the_docs_and_the_asyncapi_description_list_the_same_close_codes_and_each_is_tested():
    assert documented_codes() == set(CLOSE_CODES)
    assert set(PROVOKED) | {UNREAD} == set(CLOSE_CODES)


@pytest.mark.parametrize("code", sorted(PROVOKED))
async def test_a_node_closes_a_channel_with_each_documented_code(tmp_path: Path, code: int):
    token = new_token()
    expires = datetime.now(UTC) + timedelta(seconds=TOKEN_LIFETIME_S if code == 1008 else 3600)
    tokens = [{"name": "app", "sha256": token_hash(token), "admin": True,
               "expires_at": expires.isoformat().replace("+00:00", "Z")}]
    replicator = InMemoryReplicator()
    idle_s = 0.5 if code == 1000 else 300.0
    async with running_node(tmp_path, replicator, tokens=tokens, session_idle_timeout_s=idle_s, **SETTINGS) as node, \
            aiohttp.ClientSession() as http, open_channel(http, url_of(node), token) as channel:
        await PROVOKED[code](node, replicator, channel)
        message = await channel.ws.receive(timeout=LOCAL_WAIT_S)
        while message.type == aiohttp.WSMsgType.TEXT:  # answers, or the id-null 401 before 1008
            message = await channel.ws.receive(timeout=LOCAL_WAIT_S)
        assert message.type == aiohttp.WSMsgType.CLOSE, message
        assert int(message.data) == code, (message.data, message.extra)


async def test_a_node_closes_a_channel_whose_client_does_not_read_its_answers_4000(tmp_path: Path):
    async with running_node(tmp_path, **SETTINGS) as node:
        flood = await UnreadSocket.session_channel(int(url_of(node).rsplit(":", 1)[1]), None, LOCAL_WAIT_S)
        try:
            channel, _written = await flood_until_paused(node.app[OPEN_CHANNELS].channels, flood)
            await async_wait_until(lambda: channel.closing_code is not None, UNREAD_CLOSE_AFTER_S + LOCAL_WAIT_S,
                                   what="the node to close the channel")
            received = await flood.read_until_close(UNREAD_CLOSE_AFTER_S + LOCAL_WAIT_S)
            opcode, payload = received[-1]
            assert opcode == OPCODE_CLOSE and int.from_bytes(payload[:2], "big") == UNREAD, received[-1]
        finally:
            flood.abort()
