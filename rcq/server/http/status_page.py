"""The live status page (``GET /``) and the one JSON document it polls (``GET /v1/cluster/overview``).

The page is a single static file (``static/status.html``: HTML, CSS and a small script, no build
step, nothing fetched from the network) served by every node. It polls the overview once a second
and draws rates and commit latency over the last five minutes from successive samples, without a
page reload.

The overview is this node's view plus what each peer says of itself: the node asks every peer's
``/v1/cluster`` with a short timeout (a dead or frozen peer shows as unreachable, it does not hold
the page up). Queue figures are this node's replicated state (``locked`` on the leader only); each
node's view carries its commit-latency sum and count, and the page plots the leader's mean per interval.
``partitions`` (docs/partitions.md) is every partition but p0 as its members' processes answer
now (leader, Raft members, each member's lag, the leader's item count); each node's view names
its own partition processes (restarts, running), which the page draws as a grid of nodes by partitions.

Both need an admin token where tokens are on: a browser asks for it (HTTP Basic, the token as the
password) and sends it with every poll; the node passes the same ``Authorization`` on to its peers
(tokens are the same on every node) over HTTPS verified with ``tls_peer_ca_file`` when TLS is on.
A page opened with the token in its URL (``http://admin:TOKEN@host:port/``) takes it from there
and sends it as a Bearer token: its polls go to ``location.origin``, since ``fetch()`` refuses a
URL with credentials, which a relative one resolved against such a page's URL would be.

Must not import: pysyncobj, lmdb.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

PAGE_PATH = Path(__file__).parent / "static" / "status.html"
PEER_TIMEOUT_S = 0.8
QUEUES_SHOWN_MAX = 50


async def _peer_view(session: aiohttp.ClientSession, url: str, authorization: str | None,
                     dial_url: str | None = None) -> dict[str, Any]:
    """A peer's /v1/cluster, asked at ``dial_url`` (default ``url``, the one it advertises)."""
    headers = {"Authorization": authorization} if authorization else None
    try:
        async with session.get(f"{(dial_url or url).rstrip('/')}/v1/cluster", headers=headers,
                               timeout=aiohttp.ClientTimeout(total=PEER_TIMEOUT_S)) as response:
            body = await response.json()
            return {**body, "reachable": True}
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        return {"url": url, "reachable": False, "error": type(exc).__name__}


class Overview:
    """``GET /v1/cluster/overview``. ``own_status()``: this node's /v1/cluster body (whose ``peers``,
    the other members, are asked for theirs); ``queues()``: the queue rows. Its HTTP session is made
    on first use and closed with the app (``close`` is an on_cleanup handler). ``dial_url(node_id,
    url)``: where this node reaches a peer advertised as ``url`` (``NodeConfig.peer_url``)."""

    def __init__(self, own_status: Callable[[], dict[str, Any]], queues: Callable[[], list[dict[str, Any]]],
                 peer_tls: ssl.SSLContext | None = None,
                 dial_url: Callable[[str, str], str] | None = None,
                 partitions: Callable[[], Awaitable[list[dict[str, Any]]]] | None = None) -> None:
        self._own_status = own_status
        self._partitions = partitions
        self._dial_url = dial_url
        self._queues = queues
        self._peer_tls = peer_tls
        self._session: aiohttp.ClientSession | None = None

    async def handle(self, request: web.Request) -> web.Response:
        if self._session is None:
            connector = aiohttp.TCPConnector(ssl=self._peer_tls if self._peer_tls is not None else True)
            self._session = aiohttp.ClientSession(connector=connector)
        mine = self._own_status()
        authorization = request.headers.get("Authorization")
        dial = self._dial_url
        others, partitions = await asyncio.gather(
            asyncio.gather(*(_peer_view(self._session, peer["url"], authorization,
                                        dial(peer["node_id"], peer["url"]) if dial and peer["url"] else None)
                             for peer in mine["peers"])),
            self._partitions() if self._partitions is not None else _none())
        return web.json_response({
            "at": time.time(),
            "served_by": mine["node_id"],
            "nodes": [{**mine, "reachable": True}, *others],
            "queues": self._queues(),
            "partitions": partitions,
        })

    async def close(self, app: web.Application) -> None:
        if self._session is not None:
            await self._session.close()


async def _none() -> list[dict[str, Any]]:
    return []


async def page(request: web.Request) -> web.Response:
    return web.Response(body=PAGE_PATH.read_bytes(), content_type="text/html", charset="utf-8",
                        headers={"Cache-Control": "no-cache"})
