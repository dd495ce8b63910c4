"""The one middleware every request goes through (``rcq.server.http.api.request_middleware``):
authentication, errors rendered as JSON with their headers, and each request counted by route,
method and status class and timed, but for the session channel's WebSocket, which is counted only.

Must not import: a test module.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from prometheus_client.parser import text_string_to_metric_families

from rcq.errors import NotLeader, StorageFull, TokenExpired
from rcq.server.http import session_channel
from rcq.server.http.api import request_middleware
from rcq.server.http.auth import CHALLENGE, principal_of
from rcq.server.http.metrics import UNTIMED_ROUTES
from rcq.testing import async_wait_until
from rcq.tokens import TokenEntry, TokenRegistry, new_token, token_hash
from tests.helpers import LOCAL_WAIT_S
from tests.helpers.nodes import running_node, url_of

TOKEN = new_token()
ADMIN = new_token()
BODY_BYTES_MAX = 64


class RecordedRequests:
    """Stands in for NodeMetrics: what the middleware reports of each request."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, int]] = []

    def observe_request(self, request: web.Request, status: int, started: float) -> None:
        self.seen.append((request.method, request.path, status))


def small_app(recorded: RecordedRequests) -> web.Application:
    registry = TokenRegistry((TokenEntry(name="svc", sha256=token_hash(TOKEN), admin=False, grants=(),
                                         expires_at=None),))

    async def who(request: web.Request) -> web.Response:
        return web.json_response({"name": principal_of(request).name})

    async def healthz(request: web.Request) -> web.Response:
        return web.json_response({"ok": True, "authenticated": principal_of(request).authenticated})

    async def fails(request: web.Request) -> web.Response:
        raise ValueError("a bug")

    async def follower(request: web.Request) -> web.Response:
        raise NotLeader("not the leader", leader_url="http://leader:8000/")

    async def full(request: web.Request) -> web.Response:
        raise StorageFull()

    async def expired(request: web.Request) -> web.Response:
        raise TokenExpired()

    async def moved(request: web.Request) -> web.Response:
        raise web.HTTPFound("/v1/who")

    async def upload(request: web.Request) -> web.Response:
        return web.json_response({"bytes": len(await request.read())})

    app = web.Application(middlewares=[request_middleware(recorded, registry)],  # type: ignore[arg-type]
                          client_max_size=BODY_BYTES_MAX)
    app.router.add_get("/v1/who", who)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/v1/fails", fails)
    app.router.add_get("/v1/follower", follower)
    app.router.add_get("/v1/full", full)
    app.router.add_get("/v1/expired", expired)
    app.router.add_get("/v1/moved", moved)
    app.router.add_post("/v1/upload", upload)
    return app


@pytest.fixture
async def small() -> AsyncIterator[tuple[str, RecordedRequests]]:
    recorded = RecordedRequests()
    server = TestServer(small_app(recorded))
    await server.start_server()
    try:
        yield str(server.make_url("")).rstrip("/"), recorded
    finally:
        await server.close()


async def ask(url: str, method: str = "GET", token: str | None = TOKEN, authorization: str | None = None,
              **options: Any) -> tuple[int, dict[str, str], Any]:
    """(status, headers, body) of one request sending ``token`` as Bearer (or ``authorization``)."""
    authorization = authorization or (f"Bearer {token}" if token else None)
    headers = {"Authorization": authorization} if authorization else {}
    async with aiohttp.ClientSession() as session, \
            session.request(method, url, headers=headers, allow_redirects=False, **options) as response:
        body = await response.json() if response.content_type == "application/json" else await response.text()
        return response.status, dict(response.headers), body


async def test_a_valid_token_becomes_the_requests_principal(small: tuple[str, RecordedRequests]) -> None:
    url, recorded = small
    assert (await ask(f"{url}/v1/who"))[::2] == (200, {"name": "svc"})
    basic = "Basic " + base64.b64encode(f"anyone:{TOKEN}".encode()).decode()
    assert (await ask(f"{url}/v1/who", authorization=basic))[::2] == (200, {"name": "svc"})
    assert recorded.seen == [("GET", "/v1/who", 200)] * 2


@pytest.mark.parametrize("token", [None, "not-a-token"])
async def test_a_missing_or_bad_token_is_401_as_json_with_a_basic_challenge(
        small: tuple[str, RecordedRequests], token: str | None) -> None:
    url, recorded = small
    status, headers, body = await ask(f"{url}/v1/who", token=token)
    assert status == 401 and body["error"]["code"] == "unauthorized"
    assert headers["WWW-Authenticate"] == CHALLENGE
    assert headers["Content-Type"].startswith("application/json")
    assert recorded.seen == [("GET", "/v1/who", 401)]


async def test_public_paths_need_no_token(small: tuple[str, RecordedRequests]) -> None:
    url, recorded = small
    assert (await ask(f"{url}/healthz", token=None))[::2] == (200, {"ok": True, "authenticated": False})
    assert (await ask(f"{url}/healthz", token="not-a-token"))[0] == 200
    assert recorded.seen == [("GET", "/healthz", 200)] * 2


async def test_rcq_errors_keep_their_headers(small: tuple[str, RecordedRequests]) -> None:
    url, recorded = small
    status, headers, body = await ask(f"{url}/v1/follower?x=1")
    assert status == 307 and headers["Location"] == "http://leader:8000/v1/follower?x=1"
    assert body["error"]["code"] == "not_leader" and body["error"]["leader_url"] == "http://leader:8000/"
    status, headers, body = await ask(f"{url}/v1/full")
    assert status == 507 and headers["Retry-After"] == "1" and body["error"]["code"] == "storage_full"
    status, headers, body = await ask(f"{url}/v1/expired")
    assert status == 401 and headers["WWW-Authenticate"] == CHALLENGE and body["error"]["code"] == "token_expired"
    assert [s for _, _, s in recorded.seen] == [307, 507, 401]


async def test_aiohttps_refusals_are_answered_as_rcq_errors(small: tuple[str, RecordedRequests]) -> None:
    url, recorded = small
    status, _, body = await ask(f"{url}/v1/nowhere")
    assert status == 404 and body["error"]["code"] == "not_found"
    assert body["error"]["message"] == "no endpoint GET /v1/nowhere"
    status, _, body = await ask(f"{url}/v1/who", method="DELETE")
    assert status == 405 and body["error"]["code"] == "method_not_allowed"
    status, _, body = await ask(f"{url}/v1/upload", method="POST", data=b"x" * (BODY_BYTES_MAX + 1))
    assert status == 413 and body["error"]["code"] == "payload_too_large"
    assert [s for _, _, s in recorded.seen] == [404, 405, 413]


async def test_without_a_token_an_unknown_route_is_401_not_404(
        small: tuple[str, RecordedRequests]) -> None:
    url, _ = small
    status, _, body = await ask(f"{url}/v1/nowhere", token=None)
    assert status == 401 and body["error"]["code"] == "unauthorized"  # authentication comes first


async def test_other_http_exceptions_pass_through_and_are_counted(small: tuple[str, RecordedRequests]) -> None:
    url, recorded = small
    status, headers, _ = await ask(f"{url}/v1/moved")
    assert status == 302 and headers["Location"] == "/v1/who"
    assert recorded.seen == [("GET", "/v1/moved", 302)]


async def test_an_unexpected_error_is_logged_and_answered_500(
        small: tuple[str, RecordedRequests], caplog: pytest.LogCaptureFixture) -> None:
    url, recorded = small
    with caplog.at_level(logging.ERROR, logger="rcq.server.http.api"):
        status, _, body = await ask(f"{url}/v1/fails")
    assert status == 500 and body["error"]["code"] == "internal_error"
    assert "unexpected error in GET /v1/fails" in caplog.text and "a bug" in caplog.text
    assert recorded.seen == [("GET", "/v1/fails", 500)]


# ------------------------------------------------------------------ with the node's metrics
def samples(text: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    found: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return found


def test_the_session_channels_route_is_not_timed() -> None:
    assert session_channel.PATH in UNTIMED_ROUTES


async def test_requests_are_counted_by_template_and_timed_but_a_websocket_session_only_counted(tmp_path: Path) -> None:
    admin = TokenEntry(name="ops", sha256=token_hash(ADMIN), admin=True, grants=(), expires_at=None)
    async with running_node(tmp_path, tokens=(admin,)) as node, \
            aiohttp.ClientSession(url_of(node), headers={"Authorization": f"Bearer {ADMIN}"}) as session:
        async with session.get("/v1/queues/jobs") as response:
            assert response.status == 200
        async with aiohttp.ClientSession(url_of(node)) as anonymous, anonymous.get("/v1/cluster") as response:
            assert response.status == 401
        async with session.ws_connect(session_channel.PATH, protocols=(session_channel.SUBPROTOCOL,)) as ws:
            await ws.send_json({"id": 1, "op": "status", "transaction_id": "none"})
            assert (await ws.receive_json())["id"] == 1

        async def scraped() -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
            async with session.get("/metrics") as response:
                return samples(await response.text())

        async def session_counted() -> bool:
            counted = (await scraped()).get("rcq_http_requests_total", {})
            return (("method", "GET"), ("route", session_channel.PATH), ("status", "1xx")) in counted

        await async_wait_until(session_counted, LOCAL_WAIT_S, what="the ended WebSocket session counted")
        found = await scraped()
    counted = found["rcq_http_requests_total"]
    assert counted[(("method", "GET"), ("route", "/v1/queues/{queue}"), ("status", "2xx"))] == 1
    assert counted[(("method", "GET"), ("route", "/v1/cluster"), ("status", "4xx"))] == 1
    assert counted[(("method", "GET"), ("route", session_channel.PATH), ("status", "1xx"))] == 1
    timed = found["rcq_http_request_duration_seconds_count"]
    assert timed[(("route", "/v1/queues/{queue}"),)] == 1 and timed[(("route", "/v1/cluster"),)] == 1
    assert (("route", session_channel.PATH),) not in timed
