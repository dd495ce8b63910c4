"""The session channel on real clusters, spoken raw (aiohttp's WebSocket, not rcq's client): the
same verbs, answers and errors as HTTP, requests pipelined and answered out of order, the
principal of the upgrade bound to every frame, and wss:// with mutual TLS.

Limits, close codes and malformed frames: test_session_channel_limits.py and
test_session_channel_fuzz.py; the client over the channel: test_session_channel_client.py.
"""

from __future__ import annotations

import base64
import json
import ssl
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import pytest

from rcq.local.cluster import LocalCluster
from rcq.testing import async_wait_until
from tests.helpers import LEADER_TIMEOUT_S, LOCAL_WAIT_S
from tests.helpers.cluster import fresh_queue

SUBPROTOCOL = "rcq.session.v1"


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(nodes=3, auth=True) as local_cluster:
        local_cluster.wait_for_leader(LEADER_TIMEOUT_S)
        yield local_cluster


class Channel:
    """A raw channel: ``ask`` sends one request and returns its answer; ``send``/``answers`` pipeline."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.next_id = 0
        self.early: dict[int, dict[str, Any]] = {}

    async def send(self, op: str, **fields: Any) -> int:
        self.next_id += 1
        await self.ws.send_str(json.dumps({"id": self.next_id, "op": op, **fields}))
        return self.next_id

    async def answer(self, frame_id: int) -> dict[str, Any]:
        while frame_id not in self.early:
            message = await self.ws.receive(timeout=LOCAL_WAIT_S)
            assert message.type == aiohttp.WSMsgType.TEXT, message
            frame = json.loads(message.data)
            self.early[frame["id"]] = frame
        return self.early.pop(frame_id)

    async def ask(self, op: str, **fields: Any) -> tuple[int, dict[str, Any]]:
        frame = await self.answer(await self.send(op, **fields))
        return frame["status"], frame["body"]


async def open_channel(session: aiohttp.ClientSession, cluster: LocalCluster, token: str | None = None,
                       **options: Any) -> Channel:
    url = cluster.urls[cluster.wait_for_leader(LEADER_TIMEOUT_S)]
    headers = {"Authorization": f"Bearer {token or cluster.token}"}
    ws = await session.ws_connect(f"{url}/v1/session", headers=headers, protocols=(SUBPROTOCOL,), **options)
    assert ws.protocol == SUBPROTOCOL
    return Channel(ws)


@pytest.fixture
async def channel(cluster: LocalCluster) -> AsyncIterator[Channel]:
    async with aiohttp.ClientSession() as session:
        opened = await open_channel(session, cluster)
        yield opened
        await opened.ws.close()


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def values(items: list[dict[str, Any]]) -> list[str]:
    return [base64.b64decode(item["value"]).decode() for item in items]


async def test_a_transaction_over_the_channel_answers_as_http_does(channel: Channel):
    queue = fresh_queue("ch")
    status, begun = await channel.ask("begin", timeout_s=30, label="over-the-channel")
    assert status == 201 and begun["state"] == "open" and begun["label"] == "over-the-channel"
    tx = begun["transaction_id"]
    status, enqueued = await channel.ask("enqueue", transaction_id=tx, queue=queue,
                                         items=[b64("a"), b64("b")], encoding="base64")
    assert (status, enqueued["enqueued"]) == (200, 2)
    status, committed = await channel.ask("commit", transaction_id=tx)
    assert status == 200 and committed["committed"] and committed["enqueued"] == 2

    # dequeue, abort: back at the head; the same transaction id answers as over HTTP afterwards
    status, received = await channel.ask("receive", queue=queue, max_items=2, encoding="base64")
    assert status == 200 and values(received["items"]) == ["a", "b"]
    status, aborted = await channel.ask("abort", transaction_id=received["transaction_id"])
    assert (status, aborted["returned"]) == (200, 2)
    status, gone = await channel.ask("commit", transaction_id=received["transaction_id"])
    assert status == 409 and gone["error"]["code"] == "transaction_aborted"

    # commit-and-receive: the commit and the next transaction's items in one answer
    status, first = await channel.ask("receive", queue=queue, max_items=1, encoding="base64")
    assert values(first["items"]) == ["a"]
    status, both = await channel.ask("commit", transaction_id=first["transaction_id"],
                                     receive={"queue": queue, "max_items": 1, "encoding": "base64"})
    assert status == 200 and both["committed"] and values(both["next"]["items"]) == ["b"]
    status, described = await channel.ask("status", transaction_id=both["next"]["transaction_id"])
    assert (status, described["state"]) == (200, "open")
    status, extended = await channel.ask("extend", transaction_id=both["next"]["transaction_id"], timeout_s=60)
    assert status == 200 and extended["timeout_s"] == 60
    status, done = await channel.ask("commit", transaction_id=both["next"]["transaction_id"])
    assert status == 200 and done["dequeued"] == 1

    # one-request transactions, with their idempotency key
    operation = {"op": "enqueue", "queue": queue, "items": ["c"]}
    status, executed = await channel.ask("execute", idempotency_key="ch-key-1", operations=[operation])
    assert status == 200 and not executed["duplicate"]
    status, again = await channel.ask("execute", idempotency_key="ch-key-1", operations=[operation])
    assert status == 200 and again["duplicate"]
    status, batch = await channel.ask("batch", requests=[
        {"op": "execute", "operations": [{"op": "dequeue", "queue": queue, "max_items": 5}]},
        {"op": "status", "transaction_id": "1.000000000000000000000000"}])
    assert status == 200 and [r["status"] for r in batch["responses"]] == [200, 404]
    assert [item["value"] for item in batch["responses"][0]["body"]["results"][0]["items"]] == ["c"]


async def test_a_waiting_dequeue_holds_up_nothing_sent_after_it_and_answers_last(channel: Channel):
    queue = fresh_queue("wait")
    status, begun = await channel.ask("begin")
    waiting = await channel.send("dequeue", transaction_id=begun["transaction_id"], queue=queue,
                                 max_items=1, wait_ms=20_000, encoding="base64")
    # sent after the waiting dequeue, answered while it still waits
    status, _ = await channel.ask("execute", operations=[{"op": "enqueue", "queue": fresh_queue("other"), "items": ["x"]}])
    assert status == 200 and waiting not in channel.early
    # what this one enqueues ends the wait (the two answers may come in either order)
    enqueued = await channel.send("execute", operations=[{"op": "enqueue", "queue": queue, "items": ["late"]}])
    answer = await channel.answer(waiting)
    assert (await channel.answer(enqueued))["status"] == 200
    assert answer["status"] == 200 and values(answer["body"]["items"]) == ["late"]
    status, committed = await channel.ask("commit", transaction_id=begun["transaction_id"])
    assert status == 200 and committed["dequeued"] == 1


async def test_many_requests_in_flight_are_each_answered_once_with_their_own_id(channel: Channel):
    queue = fresh_queue("pipe")
    sent = [await channel.send("execute", operations=[{"op": "enqueue", "queue": queue, "items": [str(i)]}])
            for i in range(100)]
    answers = [await channel.answer(frame_id) for frame_id in sent]
    assert all(answer["status"] == 200 and answer["body"]["committed"] for answer in answers)
    assert not channel.early
    _, drained = await channel.ask("execute", operations=[{"op": "dequeue", "queue": queue, "max_items": 200}])
    assert sorted(int(item["value"]) for item in drained["results"][0]["items"]) == list(range(100))


async def test_every_frame_runs_as_the_principal_of_the_upgrade(cluster: LocalCluster):
    producer_token = cluster.add_token("channel-producer", grants=[{"queues": "ch-p-*", "actions": ["produce"]}])
    queue = fresh_queue("ch-p")
    async with aiohttp.ClientSession() as session:
        producer = await open_channel(session, cluster, producer_token)
        admin = await open_channel(session, cluster)
        status, _ = await producer.ask("execute", operations=[{"op": "enqueue", "queue": queue, "items": ["x"]}])
        assert status == 200
        status, refused = await producer.ask("execute", operations=[{"op": "dequeue", "queue": queue}])
        assert (status, refused["error"]["code"]) == (403, "forbidden")
        status, refused = await producer.ask("execute", operations=[{"op": "enqueue", "queue": "other", "items": ["x"]}])
        assert status == 403
        # a transaction belongs to whoever began it: another principal's channel cannot touch it
        status, begun = await admin.ask("begin")
        status, hidden = await producer.ask("enqueue", transaction_id=begun["transaction_id"], queue=queue, items=["y"])
        assert status == 404 and hidden["error"]["code"] == "transaction_not_found"
        status, _ = await admin.ask("abort", transaction_id=begun["transaction_id"])
        assert status == 200
        # the channel stays usable after refusals
        status, _ = await producer.ask("execute", operations=[{"op": "enqueue", "queue": queue, "items": ["z"]}])
        assert status == 200
        await producer.ws.close()
        await admin.ws.close()


async def test_the_channel_runs_over_mutual_tls():
    with LocalCluster(nodes=1, auth=True, tls=True, tls_client_certificates=True) as secure:
        secure.wait_for_leader(LEADER_TIMEOUT_S)
        assert secure.ca_file is not None and secure.client_cert is not None
        context = ssl.create_default_context(cafile=str(secure.ca_file))
        async with aiohttp.ClientSession() as session:
            with pytest.raises(aiohttp.ClientError):  # no client certificate: no handshake
                await open_channel(session, secure, ssl=context)
            context.load_cert_chain(str(secure.client_cert.cert), str(secure.client_cert.key))
            channel = await open_channel(session, secure, ssl=context)
            assert secure.urls[0].startswith("https://")

            async def committed() -> bool:
                status, body = await channel.ask("execute", operations=[{"op": "enqueue", "queue": "tls-q", "items": ["s"]}])
                return status == 200 and body["committed"]

            await async_wait_until(committed, LOCAL_WAIT_S, what="a commit over wss://")
            await channel.ws.close()


def metric(text: str, name: str, labels: str = "") -> float:
    line = f"{name}{{{labels}}} " if labels else f"{name} "
    return sum(float(row.split()[-1]) for row in text.splitlines() if row.startswith(line))


async def test_metrics_count_channels_frames_and_closes(cluster: LocalCluster):
    url = cluster.urls[cluster.wait_for_leader(LEADER_TIMEOUT_S)]
    async with aiohttp.ClientSession() as session:
        async def scrape() -> str:
            async with session.get(f"{url}/metrics", headers=cluster.auth_headers()) as response:
                return await response.text()

        before = await scrape()
        channel = await open_channel(session, cluster)
        for _ in range(3):
            status, _ = await channel.ask("begin")
            assert status == 201
        during = await scrape()
        assert metric(during, "rcq_session_channels") >= 1
        assert metric(during, "rcq_session_channels_opened_total") >= metric(before, "rcq_session_channels_opened_total") + 1
        assert metric(during, "rcq_session_frames_in_total") >= metric(before, "rcq_session_frames_in_total") + 3
        assert metric(during, "rcq_session_frames_out_total") >= metric(before, "rcq_session_frames_out_total") + 3
        assert "rcq_session_requests_in_flight " in during
        await channel.ws.close()

        async def counted_closed() -> bool:
            return (metric(await scrape(), "rcq_session_channels_closed_total", 'code="1000"')
                    > metric(before, "rcq_session_channels_closed_total", 'code="1000"'))

        await async_wait_until(counted_closed, LOCAL_WAIT_S, what="the closed channel counted by its close code")
