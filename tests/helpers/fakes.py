"""What the client's unit tests talk to instead of a cluster: a recording fake node and a wire recorder.

:class:`FakeNode` serves canned answers and keeps every request it got (the exact bodies of the
wire contract, which a real node would accept or refuse without telling the test what it was
sent); :class:`Wire` is a client middleware that records requests and can lose answers. The
constants are answers a real node gives, shared by the client's and the CLI's tests.

Must not import: a test module or a conftest; rcq.server (a fake node is no node).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
from aiohttp import web

from rcq.errors import RouteNotFound


# ------------------------------------------------------------------ the fake node
class FakeNode:
    """An rcq node reduced to a recorder: each request's method, path and JSON body is kept, and the
    answer comes from :meth:`answer` (by method and path; by ``op`` for a part of ``/v1/batch``)."""

    def __init__(self) -> None:
        self.url = ""
        self.requests: list[tuple[str, str, Any]] = []
        self._answers: dict[tuple[str, str], list[tuple[int, dict[str, Any]]]] = {}

    def answer(self, method: str, path: str, body: dict[str, Any], status: int = 200) -> None:
        """Queue an answer to ``method path`` (``"BATCH", op`` for batch parts); the last one given repeats."""
        self._answers.setdefault((method, path), []).append((status, body))

    def bodies(self, method: str, path: str) -> list[Any]:
        return [body for m, p, body in self.requests if (m, p) == (method, path)]

    def _next(self, method: str, path: str) -> tuple[int, dict[str, Any]]:
        queued = self._answers.get((method, path))
        if not queued:
            return 404, RouteNotFound(f"the fake node has no answer to {method} {path}").to_body()
        return queued.pop(0) if len(queued) > 1 else queued[0]

    async def handle(self, request: web.Request) -> web.Response:
        body: Any = await request.json() if request.can_read_body else None
        self.requests.append((request.method, request.path, body))
        if request.path == "/v1/batch":
            self.requests.extend(("BATCH", part["op"], part) for part in body["requests"])
            responses = [dict(zip(("status", "body"), self._next("BATCH", part["op"]), strict=True))
                         for part in body["requests"]]
            return web.json_response({"responses": responses})
        status, answer = self._next(request.method, request.path)
        return web.json_response(answer, status=status)


@asynccontextmanager
async def serving_fake(node: FakeNode | None = None) -> AsyncIterator[FakeNode]:
    """A :class:`FakeNode` (a new one by default) serving HTTP on a loopback port (its ``url``)."""
    node = FakeNode() if node is None else node
    app = web.Application()
    app.router.add_route("*", "/{path:.*}", node.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    node.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        yield node
    finally:
        await runner.cleanup()


# ------------------------------------------------------------------ the wire
class Wire:
    """A client middleware: records every request and can lose the answers of chosen ones
    (the server executed the request; the client sees the connection drop)."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, int | None, str]] = []
        self.lose: dict[str, int] = {}  # path suffix -> how many answers to lose

    async def __call__(self, request: aiohttp.ClientRequest, handler: Any) -> aiohttp.ClientResponse:
        self.requests.append((request.method, request.url.port, request.url.path))
        response = await handler(request)
        for suffix, remaining in self.lose.items():
            if remaining and request.url.path.endswith(suffix):
                self.lose[suffix] = remaining - 1
                await response.read()
                response.release()
                raise aiohttp.ServerDisconnectedError()
        return response

    def count(self, suffix: str, port: int | None = None) -> int:
        return sum(1 for _, p, path in self.requests if path.endswith(suffix) and port in (None, p))


# ------------------------------------------------------------------ answers of a real node
COMMITTED = {"transaction_id": "x", "index": 7, "duplicate": False, "enqueued": 1, "dequeued": 0,
             "transaction_ids": ["x"], "results": [{"op": "enqueue", "queue": "q", "enqueued": 1}]}
FULL_ITEM = {"item_id": 17, "queue": "jobs.dlq", "value": "job", "encoding": "utf-8", "delivery_count": 2,
             "priority": 5, "enqueued_at_ms": 1795000000000, "expires_at_ms": 1795000060000,
             "dead_letter": {"reason": "max_deliveries", "source_queue": "jobs", "delivery_count": 3}}
OLD_ITEM = {"item_id": 18, "queue": "jobs.dlq", "value": "b2xk", "encoding": "base64"}  # an older server's

# Cluster membership: the routes, three members and the answers of each change.
MEMBERS = "/v1/cluster/members"
LEADERSHIP = "/v1/cluster/leadership"
N1 = {"node_id": "n1", "raft_address": "127.0.0.1:10001", "url": "http://127.0.0.1:7001", "role": "leader",
      "self": True, "connected": True, "match_index": 42}
N2 = {"node_id": "n2", "raft_address": "127.0.0.1:10002", "url": "http://127.0.0.1:7002", "role": "follower",
      "self": False, "connected": True, "match_index": 41}
N4 = {"node_id": "n4", "raft_address": "127.0.0.1:10004", "url": "http://127.0.0.1:7004", "role": "follower",
      "self": False, "connected": True, "match_index": 42}
ADD_BODY = {"node_id": "n4", "raft_address": "127.0.0.1:10004", "url": "http://127.0.0.1:7004", "catch_up_timeout_s": 60.0}
ADDED = {"added": N4, "caught_up": True, "members": [N1, N2, N4]}
REMOVED = {"removed": N2, "members": [N1]}
TRANSFERRED = {"leader_id": "n2", "previous_leader_id": "n1"}
