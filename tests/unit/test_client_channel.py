"""The client's session channel: :class:`rcq.client.channel.Channel` against a fake WebSocket node, and
the transport's use of it against a real in-process node.

The fake (:class:`SessionNode`) accepts or refuses the upgrade as the test says and hands each
frame to the test, which answers it when and how it likes (out of order, late, never) or drops
the channel; its plain HTTP routes are a recording :class:`~tests.helpers.fakes.FakeNode`.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from rcq.client import RcqClient, Unauthorized
from rcq.client import channel as channel_module
from rcq.client.channel import PATH, SUBPROTOCOL, Channel, ChannelUnusable
from rcq.client.exchange import ExchangeFailed
from rcq.errors import NotLeader, RouteNotFound
from rcq.server.node import Node
from rcq.testing import async_wait_until
from tests.helpers import LOCAL_WAIT_S
from tests.helpers.fakes import FakeNode, Wire
from tests.helpers.nodes import running_node, url_of

BEGUN = {"transaction_id": "1.000000000000000000000001", "label": None}


# ------------------------------------------------------------------ the fake node
class SessionNode:
    """A node with a session channel that the test drives: ``refusal`` (status, body) refuses
    upgrades; otherwise each frame goes to ``frames`` with its socket, unanswered. Pings are
    counted, and answered while ``answer_pings``; the pongs that come are kept in ``pongs``."""

    def __init__(self) -> None:
        self.url = ""
        self.rest = FakeNode()
        self.refusal: tuple[int, dict[str, Any]] | None = None
        self.upgrades: list[dict[str, str]] = []  # the headers of each upgrade request
        self.frames: asyncio.Queue[tuple[web.WebSocketResponse, dict[str, Any]]] = asyncio.Queue()
        self.sockets: list[web.WebSocketResponse] = []
        self.closed_by_client = 0
        self.answer_pings = True
        self.pings = 0
        self.pongs: list[bytes] = []
        self.hold_upgrades: asyncio.Event | None = None  # set: upgrades wait for it (a hung node)

    async def session(self, request: web.Request) -> web.StreamResponse:
        self.upgrades.append(dict(request.headers))
        if self.hold_upgrades is not None:
            await self.hold_upgrades.wait()
        if self.refusal is not None:
            status, body = self.refusal
            return web.json_response(body, status=status)
        ws = web.WebSocketResponse(protocols=(SUBPROTOCOL,), autoping=False)
        await ws.prepare(request)
        self.sockets.append(ws)
        async for message in ws:
            if message.type is aiohttp.WSMsgType.PING:
                self.pings += 1
                if self.answer_pings:
                    await ws.pong(message.data)
            elif message.type is aiohttp.WSMsgType.PONG:
                self.pongs.append(message.data)
            else:
                self.frames.put_nowait((ws, json.loads(message.data)))
        if ws.close_code == aiohttp.WSCloseCode.OK:
            self.closed_by_client += 1
        return ws

    async def next_frame(self) -> tuple[web.WebSocketResponse, dict[str, Any]]:
        return await asyncio.wait_for(self.frames.get(), LOCAL_WAIT_S)

    @staticmethod
    async def answer(ws: web.WebSocketResponse, frame: dict[str, Any], body: dict[str, Any], status: int = 200) -> None:
        await ws.send_str(json.dumps({"id": frame["id"], "status": status, "body": body}))


@asynccontextmanager
async def serving_session_node() -> AsyncIterator[SessionNode]:
    fake = SessionNode()
    app = web.Application()
    app.router.add_get(PATH, fake.session)
    app.router.add_route("*", "/{path:.*}", fake.rest.handle)
    runner = web.AppRunner(app, shutdown_timeout=0)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    fake.url = fake.rest.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        yield fake
    finally:
        await runner.cleanup()


@pytest.fixture
async def node() -> AsyncIterator[SessionNode]:
    async with serving_session_node() as fake:
        yield fake


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


@pytest.fixture
async def channel(node: SessionNode, session: aiohttp.ClientSession) -> AsyncIterator[Channel]:
    channel = Channel(lambda: session, node.url, authorization="Bearer secret", connect_timeout_s=LOCAL_WAIT_S)
    yield channel
    await channel.close()


def begin(label: str) -> dict[str, Any]:
    return {"op": "begin", "label": label}


# ------------------------------------------------------------------ one channel
async def test_answers_that_come_out_of_order_reach_their_own_requests(node: SessionNode, channel: Channel):
    exchanges = [asyncio.ensure_future(channel.exchange(begin(label), LOCAL_WAIT_S)) for label in "abc"]
    frames = [await node.next_frame() for _ in exchanges]
    assert sorted(frame["label"] for _, frame in frames) == ["a", "b", "c"]
    assert len({frame["id"] for _, frame in frames}) == 3
    for ws, frame in reversed(frames):
        await node.answer(ws, frame, {"label": frame["label"]})
    answers = await asyncio.gather(*exchanges)
    assert [(answer.status, answer.payload["label"]) for answer in answers] == [(200, "a"), (200, "b"), (200, "c")]
    assert len(node.upgrades) == 1
    assert node.upgrades[0]["Authorization"] == "Bearer secret"
    assert node.upgrades[0]["Sec-WebSocket-Protocol"] == SUBPROTOCOL


async def test_concurrent_requests_share_one_upgrade(node: SessionNode, channel: Channel):
    exchanges = [asyncio.ensure_future(channel.exchange(begin(str(n)), LOCAL_WAIT_S)) for n in range(20)]
    for _ in exchanges:
        ws, frame = await node.next_frame()
        await node.answer(ws, frame, {"label": frame["label"]})
    answers = await asyncio.gather(*exchanges)
    assert [answer.payload["label"] for answer in answers] == [str(n) for n in range(20)]
    assert len(node.upgrades) == 1


async def test_a_307_answer_carries_the_leader_url_as_its_location(node: SessionNode, channel: Channel):
    exchanging = asyncio.ensure_future(channel.exchange(begin("a"), LOCAL_WAIT_S))
    ws, frame = await node.next_frame()
    await node.answer(ws, frame, NotLeader(leader_url="http://127.0.0.1:7002").to_body(), status=307)
    answer = await exchanging
    assert (answer.status, answer.location) == (307, "http://127.0.0.1:7002")
    assert answer.payload["error"]["code"] == "not_leader"


async def test_a_channel_dropped_mid_request_fails_it_as_maybe_sent_and_the_next_request_reconnects(
        node: SessionNode, channel: Channel):
    exchanging = asyncio.ensure_future(channel.exchange(begin("lost"), LOCAL_WAIT_S))
    ws, _ = await node.next_frame()
    await ws.close(code=1012, message=b"leadership ended")
    with pytest.raises(ExchangeFailed) as failed:
        await exchanging
    assert failed.value.maybe_sent is True
    exchanging = asyncio.ensure_future(channel.exchange(begin("next"), LOCAL_WAIT_S))
    ws, frame = await node.next_frame()
    await node.answer(ws, frame, {"label": "next"})
    assert (await exchanging).payload == {"label": "next"}
    assert len(node.upgrades) == 2


async def test_a_request_that_never_left_is_not_maybe_sent(session: aiohttp.ClientSession):
    closed_port = Channel(lambda: session, "http://127.0.0.1:1", authorization=None, connect_timeout_s=LOCAL_WAIT_S)
    with pytest.raises(ExchangeFailed) as failed:
        await closed_port.exchange(begin("a"), LOCAL_WAIT_S)
    assert failed.value.maybe_sent is False
    await closed_port.close()


async def test_closing_fails_what_is_in_flight_and_refuses_more(node: SessionNode, channel: Channel):
    exchanging = asyncio.ensure_future(channel.exchange(begin("a"), LOCAL_WAIT_S))
    await node.next_frame()
    await channel.close()
    with pytest.raises(ExchangeFailed) as failed:
        await exchanging
    assert failed.value.maybe_sent is True
    with pytest.raises(ExchangeFailed) as refused:
        await channel.exchange(begin("b"), LOCAL_WAIT_S)
    assert refused.value.maybe_sent is False


async def test_a_timed_out_request_forgets_its_id_and_its_late_answer_is_dropped(node: SessionNode, channel: Channel):
    slow = asyncio.ensure_future(channel.exchange(begin("slow"), 0.3))
    slow_ws, slow_frame = await node.next_frame()
    quick = asyncio.ensure_future(channel.exchange(begin("quick"), LOCAL_WAIT_S))
    ws, frame = await node.next_frame()
    await node.answer(ws, frame, {"label": "quick"})  # the channel is alive: the slow one is merely slow
    assert (await quick).payload == {"label": "quick"}
    with pytest.raises(ExchangeFailed) as failed:
        await slow
    assert failed.value.maybe_sent is True
    await node.answer(slow_ws, slow_frame, {"label": "slow"})  # late: nobody waits for it
    after = asyncio.ensure_future(channel.exchange(begin("after"), LOCAL_WAIT_S))
    ws, frame = await node.next_frame()
    await node.answer(ws, frame, {"label": "after"})
    assert (await after).payload == {"label": "after"}
    assert len(node.upgrades) == 1


async def test_a_timeout_with_no_frame_at_all_since_the_request_closes_the_channel(node: SessionNode,
                                                                                  channel: Channel):
    with pytest.raises(ExchangeFailed):
        await asyncio.gather(channel.exchange(begin("a"), 0.3), node.next_frame())
    exchanging = asyncio.ensure_future(channel.exchange(begin("b"), LOCAL_WAIT_S))
    ws, frame = await node.next_frame()
    await node.answer(ws, frame, {"label": "b"})
    assert (await exchanging).payload == {"label": "b"}
    assert len(node.upgrades) == 2


async def test_each_request_times_out_at_its_own_deadline_whatever_the_order_they_left_in(
        node: SessionNode, channel: Channel):
    patient = asyncio.ensure_future(channel.exchange(begin("patient"), LOCAL_WAIT_S))
    patient_ws, patient_frame = await node.next_frame()
    loop = asyncio.get_running_loop()
    began = loop.time()
    hasty = asyncio.ensure_future(channel.exchange(begin("hasty"), 0.3))  # left later, due sooner
    await node.next_frame()
    quick = asyncio.ensure_future(channel.exchange(begin("quick"), LOCAL_WAIT_S))
    ws, frame = await node.next_frame()
    await node.answer(ws, frame, {"label": "quick"})  # the channel is alive: the hasty one is merely unanswered
    assert (await quick).payload == {"label": "quick"}
    with pytest.raises(ExchangeFailed) as failed:
        await hasty
    assert 0.3 <= loop.time() - began < LOCAL_WAIT_S / 2
    assert failed.value.maybe_sent is True
    await node.answer(patient_ws, patient_frame, {"label": "patient"})
    assert (await patient).payload == {"label": "patient"}
    assert len(node.upgrades) == 1


async def test_an_overdue_request_starts_its_watch_which_may_abandon_it(node: SessionNode, channel: Channel):
    loop = asyncio.get_running_loop()
    watched_at: list[float] = []

    async def watch(abandon: channel_module.Abandon) -> None:
        watched_at.append(loop.time())
        assert abandon(RuntimeError("another leader"))

    began = loop.time()
    exchanging = asyncio.ensure_future(channel.exchange(begin("a"), LOCAL_WAIT_S, 0.2, watch))
    ws, frame = await node.next_frame()
    with pytest.raises(RuntimeError, match="another leader"):
        await exchanging
    assert len(watched_at) == 1 and 0.2 <= watched_at[0] - began < LOCAL_WAIT_S / 2
    await node.answer(ws, frame, {"label": "a"})  # late: nobody waits for it
    assert channel.in_flight == 0


async def test_a_watch_that_does_not_abandon_ends_with_the_answer_and_an_answer_in_time_starts_none(
        node: SessionNode, channel: Channel):
    watches: list[str] = []

    async def watch(abandon: channel_module.Abandon) -> None:
        watches.append("started")
        try:
            await asyncio.Event().wait()  # never set: the watch runs until it is cancelled
        except asyncio.CancelledError:
            watches.append("cancelled")
            raise

    quick = asyncio.ensure_future(channel.exchange(begin("quick"), LOCAL_WAIT_S, 0.2, watch))
    ws, frame = await node.next_frame()
    await node.answer(ws, frame, {"label": "quick"})
    assert (await quick).payload == {"label": "quick"}
    slow = asyncio.ensure_future(channel.exchange(begin("slow"), LOCAL_WAIT_S, 0.2, watch))
    ws, frame = await node.next_frame()
    await async_wait_until(lambda: watches == ["started"], LOCAL_WAIT_S, what="the watch started")
    await node.answer(ws, frame, {"label": "slow"})
    assert (await slow).payload == {"label": "slow"}
    await async_wait_until(lambda: watches == ["started", "cancelled"], LOCAL_WAIT_S, what="the watch cancelled")


async def test_an_overdue_request_still_times_out_at_its_deadline(node: SessionNode, channel: Channel):
    watches: list[str] = []

    async def watch(abandon: channel_module.Abandon) -> None:
        watches.append("started")
        await asyncio.Event().wait()  # never set: the watch runs until it is cancelled

    with pytest.raises(ExchangeFailed) as failed:
        await asyncio.gather(channel.exchange(begin("a"), 0.3, 0.1, watch), node.next_frame())
    assert failed.value.maybe_sent is True
    assert watches == ["started"]


async def test_an_idle_channel_pings_the_node_and_stays_open_while_it_answers(
        node: SessionNode, channel: Channel, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(channel_module, "HEARTBEAT_S", 0.1)
    exchanging = asyncio.ensure_future(channel.exchange(begin("a"), LOCAL_WAIT_S))
    ws, frame = await node.next_frame()
    await node.answer(ws, frame, {"label": "a"})
    await exchanging
    await async_wait_until(lambda: node.pings >= 4, LOCAL_WAIT_S, what="four pings")  # well past a pong's deadline
    exchanging = asyncio.ensure_future(channel.exchange(begin("b"), LOCAL_WAIT_S))
    ws, frame = await node.next_frame()
    await node.answer(ws, frame, {"label": "b"})
    assert (await exchanging).payload == {"label": "b"}
    assert len(node.upgrades) == 1


async def test_a_busy_channel_sends_no_ping(node: SessionNode, channel: Channel,
                                            monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(channel_module, "HEARTBEAT_S", 0.2)
    loop = asyncio.get_running_loop()
    until = loop.time() + 0.6
    while loop.time() < until:  # an answer every 50 ms: never idle for a heartbeat
        exchanging = asyncio.ensure_future(channel.exchange(begin("a"), LOCAL_WAIT_S))
        ws, frame = await node.next_frame()
        await asyncio.sleep(0.05)  # pace: the node answers after 50 ms, under the heartbeat
        await node.answer(ws, frame, {"label": "a"})
        await exchanging
    assert node.pings == 0


async def test_a_node_that_falls_silent_is_found_dead_within_one_and_a_half_heartbeats(
        node: SessionNode, channel: Channel, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(channel_module, "HEARTBEAT_S", 0.2)
    node.answer_pings = False
    loop = asyncio.get_running_loop()
    began = loop.time()
    exchanging = asyncio.ensure_future(channel.exchange(begin("a"), LOCAL_WAIT_S))
    await node.next_frame()  # never answered, nor is the ping
    with pytest.raises(ExchangeFailed, match=r"(?i)ping|pong") as failed:
        await exchanging
    assert failed.value.maybe_sent is True
    assert 0.3 <= loop.time() - began < 0.3 + LOCAL_WAIT_S / 4
    assert node.pings == 1


async def test_the_channel_answers_the_nodes_pings(node: SessionNode, channel: Channel):
    exchanging = asyncio.ensure_future(channel.exchange(begin("a"), LOCAL_WAIT_S))
    ws, frame = await node.next_frame()
    await node.answer(ws, frame, {"label": "a"})
    await exchanging
    await ws.ping(b"are you there")
    await async_wait_until(lambda: node.pongs == [b"are you there"], LOCAL_WAIT_S, what="the pong")


async def test_a_send_that_must_wait_finishes_in_the_background_with_its_outcome():
    loop = asyncio.get_running_loop()
    go: asyncio.Future[None] = loop.create_future()
    steps: list[str] = []

    async def sending(fail: bool) -> None:
        steps.append("written")
        await go  # the socket's buffer drains
        await asyncio.sleep(0)
        steps.append("drained")
        if fail:
            raise ConnectionResetError("gone")

    async def at_once() -> None:
        steps.append("at once")

    assert channel_module._start(at_once()) is None
    rest = channel_module._start(sending(fail=True))
    assert rest is not None and steps == ["at once", "written"]
    go.set_result(None)
    with pytest.raises(ConnectionResetError):
        await rest
    assert steps == ["at once", "written", "drained"]


async def test_a_cancelled_request_forgets_its_id(node: SessionNode, channel: Channel):
    cancelled = asyncio.ensure_future(channel.exchange(begin("gone"), LOCAL_WAIT_S))
    ws, gone = await node.next_frame()
    cancelled.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    assert channel.in_flight == 0
    await node.answer(ws, gone, {"label": "gone"})
    exchanging = asyncio.ensure_future(channel.exchange(begin("next"), LOCAL_WAIT_S))
    ws, frame = await node.next_frame()
    await node.answer(ws, frame, {"label": "next"})
    assert (await exchanging).payload == {"label": "next"}


async def test_an_error_frame_without_id_is_logged_and_the_channel_stays(node: SessionNode, channel: Channel,
                                                                        caplog: pytest.LogCaptureFixture):
    exchanging = asyncio.ensure_future(channel.exchange(begin("a"), LOCAL_WAIT_S))
    ws, frame = await node.next_frame()
    with caplog.at_level(logging.WARNING, logger="rcq.client.channel"):
        await ws.send_str(json.dumps({"id": None, "status": 400, "body": {"error": {"message": "not JSON"}}}))
        await node.answer(ws, frame, {"label": "a"})
        assert (await exchanging).payload == {"label": "a"}
    assert any("HTTP 400: not JSON" in record.getMessage() for record in caplog.records)
    assert len(node.upgrades) == 1


async def test_a_401_error_frame_closes_the_channel_and_fails_what_is_in_flight_as_maybe_sent(
        node: SessionNode, channel: Channel):
    exchanging = asyncio.ensure_future(channel.exchange(begin("a"), LOCAL_WAIT_S))
    ws, _ = await node.next_frame()
    await ws.send_str(json.dumps({"id": None, "status": 401, "body": Unauthorized("token revoked").to_body()}))
    with pytest.raises(ExchangeFailed) as failed:
        await exchanging
    assert failed.value.maybe_sent is True
    assert "token" in failed.value.error.message


@pytest.mark.parametrize("status", [404, 405])
async def test_a_node_without_the_channel_is_reported_for_a_long_while(node: SessionNode, channel: Channel,
                                                                       status: int):
    node.refusal = (status, RouteNotFound().to_body())
    with pytest.raises(ChannelUnusable) as unusable:
        await channel.exchange(begin("a"), LOCAL_WAIT_S)
    assert unusable.value.pause_s is not None and unusable.value.pause_s >= 10


async def test_a_refused_upgrade_is_reported_for_a_moment(node: SessionNode, channel: Channel):
    node.refusal = (307, NotLeader(leader_url="http://127.0.0.1:7002").to_body())
    with pytest.raises(ChannelUnusable) as unusable:
        await channel.exchange(begin("a"), LOCAL_WAIT_S)
    assert unusable.value.pause_s is not None and 0 < unusable.value.pause_s <= 5


async def test_a_frame_too_large_for_the_channel_is_reported_for_itself_alone(node: SessionNode, channel: Channel):
    with pytest.raises(ChannelUnusable) as unusable:
        await channel.exchange({"op": "enqueue", "items": ["x" * (2 << 20)]}, LOCAL_WAIT_S)
    assert unusable.value.pause_s is None
    assert node.upgrades == []


# ------------------------------------------------------------------ the transport falls back to HTTP
async def test_a_node_without_the_channel_is_asked_over_http(node: SessionNode):
    node.refusal = (404, RouteNotFound().to_body())
    node.rest.answer("POST", "/v1/transactions", BEGUN)
    async with RcqClient(node.url, retry_timeout_s=1) as client:
        await client.begin()
        await client.begin()
    assert len(node.rest.bodies("POST", "/v1/transactions")) == 2
    assert len(node.upgrades) == 1  # not asked again on the second request


async def test_a_refused_upgrade_gets_the_nodes_own_answer_over_http(node: SessionNode):
    node.refusal = (401, Unauthorized().to_body())
    node.rest.answer("POST", "/v1/transactions", Unauthorized("no such token").to_body(), status=401)
    async with RcqClient(node.url, retry_timeout_s=1) as client:
        with pytest.raises(Unauthorized, match="no such token"):
            await client.begin()


async def test_a_follower_refusing_the_upgrade_redirects_to_the_leaders_channel(node: SessionNode):
    async with serving_session_node() as leader:
        node.refusal = (307, NotLeader(leader_url=leader.url).to_body())
        node.rest.answer("POST", "/v1/transactions", NotLeader(leader_url=leader.url).to_body(), status=307)
        async with RcqClient(node.url, retry_timeout_s=2) as client:
            beginning = asyncio.ensure_future(client.begin(label="via-follower"))
            ws, frame = await leader.next_frame()
            assert frame["op"] == "begin" and frame["label"] == "via-follower"
            await SessionNode.answer(ws, frame, BEGUN)
            assert (await beginning).transaction_id == BEGUN["transaction_id"]
            assert client.leader_url == leader.url


async def test_an_upgrade_that_hangs_gives_way_to_another_node_long_before_the_request_timeout(node: SessionNode):
    """A node that accepts the connection and never answers the upgrade (its event loop held, as
    a leader's whose Raft ticks hang in an fdatasync) costs one upgrade timeout, not the request's."""
    node.hold_upgrades = held = asyncio.Event()
    try:
        async with serving_session_node() as other, \
                RcqClient([node.url, other.url], request_timeout_s=10 * LOCAL_WAIT_S) as client:
            beginning = asyncio.ensure_future(client.begin(label="past-the-hung-node"))
            try:
                ws, frame = await asyncio.wait_for(other.frames.get(), channel_module.UPGRADE_TIMEOUT_S + LOCAL_WAIT_S)
            finally:
                held.set()  # whatever happens: the hung upgrade ends, so that the client can close
            await SessionNode.answer(ws, frame, BEGUN)
            assert (await beginning).transaction_id == BEGUN["transaction_id"]
        assert len(node.upgrades) == 1, "the hung node was not the first asked: the test proves nothing"
    finally:
        held.set()


# ------------------------------------------------------------------ the transport on a real node
@pytest.fixture
async def real_node(tmp_path: Path) -> AsyncIterator[Node]:
    async with running_node(tmp_path, item_bytes_max=4 << 20) as node:
        yield node


def posts(recorder: Wire) -> list[str]:
    return [path for method, _, path in recorder.requests if method != "GET"]


async def test_the_hot_verbs_go_over_one_channel(real_node: Node, wire):
    recorder, session = wire
    async with RcqClient(url_of(real_node), session=session) as client:
        await client.enqueue("q", b"a", b"b")
        async with client.transaction() as tx:
            assert await tx.dequeue("q") == b"a"
            await tx.enqueue("r", b"moved")
        assert await client.dequeue("q") == [b"b"]
        assert await client.dequeue("r") == [b"moved"]
    assert posts(recorder) == []
    assert recorder.count(PATH) == 1


async def test_coalesced_requests_go_as_batch_frames(real_node: Node, wire):
    recorder, session = wire
    async with RcqClient(url_of(real_node), coalesce=True, session=session) as client:
        await asyncio.gather(*(client.enqueue("q", str(n)) for n in range(10)))
        assert sorted(await client.dequeue("q", max_items=10)) == sorted(str(n).encode() for n in range(10))
    assert posts(recorder) == []
    assert recorder.count(PATH) == 1


async def test_a_waiting_dequeue_holds_nothing_else_up_on_the_channel(real_node: Node, wire):
    recorder, session = wire
    async with RcqClient(url_of(real_node), session=session) as client:
        waiting = asyncio.ensure_future(client.dequeue("later", wait_ms=int(LOCAL_WAIT_S * 1000)))
        for n in range(3):
            await client.enqueue("now", str(n))
            assert await client.dequeue("now") == [str(n).encode()]
        assert not waiting.done()
        await client.enqueue("later", b"woken")
        assert await waiting == [b"woken"]
    assert posts(recorder) == []
    assert recorder.count(PATH) == 1


async def test_a_request_too_large_for_a_frame_goes_over_http(real_node: Node, wire):
    recorder, session = wire
    async with RcqClient(url_of(real_node), session=session) as client:
        await client.enqueue("q", b"x" * (2 << 20))
        await client.enqueue("q", b"small")
        assert [len(item) for item in await client.dequeue("q", max_items=2)] == [2 << 20, 5]
    assert posts(recorder) == ["/v1/queues/q/enqueue"]


async def test_without_the_channel_every_operation_is_one_http_request(real_node: Node, wire):
    recorder, session = wire
    async with RcqClient(url_of(real_node), session=session, channel=False) as client:
        await client.enqueue("q", b"a")
        assert await client.dequeue("q") == [b"a"]
    assert recorder.count(PATH) == 0
    assert posts(recorder) == ["/v1/queues/q/enqueue", "/v1/queues/q/dequeue"]
