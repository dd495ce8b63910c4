"""Raw session channels (``GET /v1/session``) for the tests: aiohttp's WebSocket client, frames as
JSON the test writes itself, so that each test sees exactly the frames and the close code a node
sends (the rcq client would hide them). Also the upgrade request sent by hand, to read a refusal's
status, headers and body (aiohttp's ``ws_connect`` keeps only the status).

Must not import: a test module or a conftest; rcq.server (nodes are separate processes).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp

from tests.helpers import QUIET_CLUSTER_WAIT_S

PATH = "/v1/session"
SUBPROTOCOL = "rcq.session.v1"


def bearer(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


@dataclass
class RawChannel:
    """One open channel: send frames, read answers and the close."""

    ws: aiohttp.ClientWebSocketResponse

    async def send(self, frame: Any) -> None:
        """``frame``: a dict or list (sent as JSON text), a str (sent as is) or bytes (a binary frame)."""
        if isinstance(frame, bytes):
            await self.ws.send_bytes(frame)
        else:
            await self.ws.send_str(frame if isinstance(frame, str) else json.dumps(frame))

    async def answer(self, timeout_s: float = QUIET_CLUSTER_WAIT_S) -> dict[str, Any]:
        """The next frame the node sends, which must be a text frame holding an answer."""
        message = await self.ws.receive(timeout=timeout_s)
        assert message.type == aiohttp.WSMsgType.TEXT, f"expected an answer frame, got {message}"
        answer = json.loads(message.data)
        assert isinstance(answer, dict) and set(answer) == {"id", "status", "body"}, answer
        return answer

    async def request(self, frame: dict[str, Any], timeout_s: float = QUIET_CLUSTER_WAIT_S) -> dict[str, Any]:
        """Send ``frame`` and return its answer (the only request in flight on this channel)."""
        await self.send(frame)
        answer = await self.answer(timeout_s)
        assert answer["id"] == frame["id"], (frame, answer)
        return answer

    async def close_code(self, timeout_s: float = QUIET_CLUSTER_WAIT_S) -> tuple[int, str]:
        """Wait for the node to close the channel, no frame before: the code and reason of its close
        frame (``ws.close_code`` may say 1006 instead, when the node drops the connection before our
        close frame answering its own reaches it)."""
        message = await self.ws.receive(timeout=timeout_s)
        assert message.type == aiohttp.WSMsgType.CLOSE, f"expected the close, got {message}"
        return int(message.data), str(message.extra or "")


@contextlib.asynccontextmanager
async def open_channel(http: aiohttp.ClientSession, url: str, token: str | None) -> AsyncIterator[RawChannel]:
    """A channel to the node at ``url`` (http://...) authenticated with ``token``; closed after."""
    async with http.ws_connect(url.replace("http", "ws", 1) + PATH, protocols=(SUBPROTOCOL,),
                               headers=bearer(token), max_msg_size=0, autoclose=True) as ws:
        assert ws.protocol == SUBPROTOCOL
        yield RawChannel(ws)


@dataclass(frozen=True)
class Refusal:
    status: int
    headers: dict[str, str]
    body: Any


async def upgrade(http: aiohttp.ClientSession, url: str, token: str | None, websocket: bool = True) -> Refusal:
    """``GET /v1/session`` by hand (an upgrade request unless ``websocket`` is False), for a node
    that refuses it: the answer, redirects not followed."""
    headers = bearer(token)
    if websocket:
        headers |= {"Upgrade": "websocket", "Connection": "Upgrade", "Sec-WebSocket-Version": "13",
                    "Sec-WebSocket-Key": base64.b64encode(os.urandom(16)).decode(),
                    "Sec-WebSocket-Protocol": SUBPROTOCOL}
    async with http.get(url + PATH, headers=headers, allow_redirects=False,
                        timeout=aiohttp.ClientTimeout(total=QUIET_CLUSTER_WAIT_S)) as response:
        assert response.status != 101, "the node accepted the upgrade"
        raw = await response.read()
        return Refusal(response.status, dict(response.headers), json.loads(raw) if raw else None)


async def gather_answers(channel: RawChannel, count: int, timeout_s: float = QUIET_CLUSTER_WAIT_S) -> list[dict[str, Any]]:
    """The next ``count`` answers, in the order they came, within ``timeout_s`` in all."""
    async with asyncio.timeout(timeout_s):
        return [await channel.answer(timeout_s) for _ in range(count)]
