"""The live status page (``GET /``) and the one JSON document it polls (``GET /v1/cluster/overview``).

The page is a single static file (``static/status.html``: HTML, CSS and a small script, no build
step, nothing fetched from the network) served by every node. It polls the overview once a second
and draws rates and commit latency over the last five minutes from successive samples, without a
page reload.

The overview is this node's view plus what each peer says of itself: the node asks every peer's
``/v1/cluster`` with a short timeout (a dead or frozen peer shows as unreachable, it does not hold
the page up). Queue figures are this node's replicated state (``locked`` on the leader only); each
node's view carries its commit-latency sum and count, and the page plots the leader's mean per interval.

Must not import: pysyncobj, lmdb.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

PAGE_PATH = Path(__file__).parent / "static" / "status.html"
PEER_TIMEOUT_S = 0.8
QUEUES_SHOWN_MAX = 50


async def _peer_view(session: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    try:
        async with session.get(f"{url.rstrip('/')}/v1/cluster",
                               timeout=aiohttp.ClientTimeout(total=PEER_TIMEOUT_S)) as response:
            body = await response.json()
            return {**body, "reachable": True}
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        return {"url": url, "reachable": False, "error": type(exc).__name__}


def overview_handler(own_status: Any, queues: Any, peers: list[str]) -> Any:
    """Build the handler. ``own_status()``: this node's /v1/cluster body; ``queues()``: a list of queue
    rows; ``peers``: their URLs."""
    sessions: dict[str, aiohttp.ClientSession] = {}

    async def handle(request: web.Request) -> web.Response:
        if "session" not in sessions or sessions["session"].closed:
            sessions["session"] = aiohttp.ClientSession()
        mine = own_status()
        others = await asyncio.gather(*(_peer_view(sessions["session"], url) for url in peers))
        return web.json_response({
            "at": time.time(),
            "served_by": mine["node_id"],
            "nodes": [{**mine, "reachable": True}, *others],
            "queues": queues(),
        })

    async def close(app: web.Application) -> None:
        if "session" in sessions:
            await sessions["session"].close()

    handle.on_cleanup = close  # type: ignore[attr-defined]
    return handle


async def page(request: web.Request) -> web.Response:
    return web.Response(body=PAGE_PATH.read_bytes(), content_type="text/html", charset="utf-8",
                        headers={"Cache-Control": "no-cache"})
