"""How a node's process asks partition processes (rcq.server.http.partition_asker): who leads is
asked at /readyz, which needs no token, so a token the caller just added that a partition process
has not read yet does not make a partition look leaderless; a process that is down, slow or
answers something else is no answer."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from rcq.server.http import partition_asker
from rcq.server.http.partition_asker import LeaderAsker


@pytest.fixture
async def member() -> AsyncIterator[tuple[str, list[str]]]:
    """A partition process that knows no token yet (every route but /readyz answers 401) and
    names node-1 as its leader; the paths it was asked."""
    asked: list[str] = []
    released = asyncio.Event()  # the slow answer waits for the test to be done with it

    async def readyz(request: web.Request) -> web.Response:
        asked.append(request.path)
        return web.json_response({"ready": False, "leader_id": "node-1", "leader_url": "http://node-1:7010"},
                                 status=503)

    async def other(request: web.Request) -> web.Response:
        asked.append(request.path)
        if request.path == "/slow":
            await released.wait()
        return web.json_response({"error": {"code": "unauthorized"}}, status=401)

    app = web.Application()
    app.router.add_get("/readyz", readyz)
    app.router.add_route("*", "/{tail:.*}", other)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}", asked
    finally:
        released.set()
        await runner.cleanup()


async def test_who_leads_is_asked_without_a_token(member: tuple[str, list[str]]) -> None:
    url, asked = member
    asker = LeaderAsker(None)
    try:
        assert await asker.leader([url, "http://127.0.0.1:9"]) == ("node-1", "http://node-1:7010")
        assert asked == ["/readyz"]
        assert await asker.leader(["http://127.0.0.1:9"]) == (None, None)  # nobody there
    finally:
        await asker.close(web.Application())


async def test_an_ask_that_fails_is_none_and_a_slow_one_is_cut(member: tuple[str, list[str]]) -> None:
    url, _asked = member
    asker = LeaderAsker(None)
    try:
        assert await asker.get(f"{url}/v1/cluster", {}) is None  # 401
        assert await asker.call("GET", f"{url}/v1/cluster", {}) == (401, {"error": {"code": "unauthorized"}})
        assert await asker.text(f"{url}/metrics", {}) is None
        assert await asker.call("GET", f"{url}/slow", {}, timeout_s=0.2) is None
        assert await asker.call("GET", "http://127.0.0.1:9/", {}) is None
    finally:
        await asker.close(web.Application())
    assert partition_asker.READY_ASK_TIMEOUT_S < 1.0  # within a probe's usual 1 s
