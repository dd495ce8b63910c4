"""The session channel's limits and endings on a live 3-node cluster, spoken raw (aiohttp's WebSocket).

The upgrade is refused as any request would be: no token 401, a plain GET 400, a follower 307 with
the leader in the body and no ``Location`` (a WebSocket client would follow it and drop the token),
past ``session_channels_per_client_max`` 503 ``too_many_connections``. An open channel holds at most
``session_in_flight_max`` requests: past it the node stops reading (back-pressure) and refuses
nothing. It ends with 1000 when idle for ``session_idle_timeout_s``, with an id-null 401 then 1008
when its token is revoked or expires, and with 1012 once its node stops leading, after the requests
in flight were answered. One cluster with small limits serves the module; the leadership test,
which moves the leader, comes last.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import aiohttp
import pytest

from rcq.local.cluster import LocalCluster
from rcq.testing import async_wait_until
from tests.helpers import LOCAL_WAIT_S, QUIET_CLUSTER_WAIT_S
from tests.helpers.cluster import fresh_queue, running_cluster
from tests.helpers.raw_channel import RawChannel, bearer, gather_answers, open_channel, upgrade

pytestmark = pytest.mark.cluster

IN_FLIGHT_MAX = 4
IDLE_S = 1.5
CHANNELS_PER_CLIENT_MAX = 3
LIMITED_NODE_SETTINGS = {"session_in_flight_max": IN_FLIGHT_MAX, "session_idle_timeout_s": IDLE_S,
                         "session_channels_per_client_max": CHANNELS_PER_CLIENT_MAX}
PIPELINED = 50
LONG_POLL_MS = 25_000  # within dequeue_wait_max_ms (30 s): long enough to keep a request in flight
CONSUMER = [{"queues": "*", "actions": ["produce", "consume"]}]
# Endings are awaited for LOCAL_WAIT_S, "a few seconds": the token is re-checked every second, the
# nodes re-read the tokens file within about a second, idleness and leadership are looked at every second.


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with running_cluster(overrides=LIMITED_NODE_SETTINGS) as local_cluster:
        yield local_cluster


@pytest.fixture
async def http(cluster: LocalCluster) -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session
    assert cluster.unexpected_exits() == {}


def leader_url(cluster: LocalCluster) -> str:
    return cluster.url(cluster.wait_for_leader(QUIET_CLUSTER_WAIT_S))


async def consumer_token(cluster: LocalCluster, name: str, expires_at: datetime | None = None) -> str:
    return await asyncio.to_thread(cluster.add_token, name, CONSUMER, False, expires_at)


def error_code(body: Any) -> str:
    assert isinstance(body, dict) and isinstance(body.get("error"), dict), body
    return str(body["error"]["code"])


# =========================================================================== the upgrade
async def test_an_upgrade_without_a_token_is_answered_401(cluster: LocalCluster, http: aiohttp.ClientSession) -> None:
    for token in (None, "not-a-token-of-this-cluster"):
        refusal = await upgrade(http, leader_url(cluster), token)
        assert refusal.status == 401 and error_code(refusal.body) == "unauthorized", refusal
        assert refusal.headers.get("WWW-Authenticate"), refusal


async def test_a_plain_get_without_the_upgrade_is_answered_400(cluster: LocalCluster,
                                                               http: aiohttp.ClientSession) -> None:
    refusal = await upgrade(http, leader_url(cluster), cluster.token, websocket=False)
    assert refusal.status == 400 and error_code(refusal.body) == "invalid_request", refusal


async def test_a_follower_answers_the_upgrade_307_with_the_leader_in_the_body_and_no_location(
        cluster: LocalCluster, http: aiohttp.ClientSession) -> None:
    leader = cluster.wait_for_leader(QUIET_CLUSTER_WAIT_S)
    await asyncio.to_thread(cluster.wait_for_applied, QUIET_CLUSTER_WAIT_S)  # the followers know the leader
    for follower in (i for i in range(len(cluster.nodes)) if i != leader):
        refusal = await upgrade(http, cluster.url(follower), cluster.token)
        assert refusal.status == 307 and error_code(refusal.body) == "not_leader", refusal
        assert refusal.body["error"]["leader_url"] == cluster.url(leader), refusal
        assert "Location" not in refusal.headers, refusal.headers


async def test_channels_past_the_per_client_cap_are_refused_503_and_others_still_connect(
        cluster: LocalCluster, http: aiohttp.ClientSession) -> None:
    url = leader_url(cluster)
    token = await consumer_token(cluster, "capped")
    async with open_channel(http, url, token), open_channel(http, url, token), \
            open_channel(http, url, token) as third:
        refusal = await upgrade(http, url, token)
        assert refusal.status == 503 and error_code(refusal.body) == "too_many_connections", refusal
        assert refusal.headers.get("Retry-After"), refusal.headers
        # the cap is per client: another principal connects, and the capped one's channels serve
        async with open_channel(http, url, cluster.token) as other:
            assert (await other.request({"id": 1, "op": "begin"}))["status"] == 201
        assert (await third.request({"id": 1, "op": "begin"}))["status"] == 201
    # the channels closed, the client may open new ones (the node counts a channel out once it ends)

    async def reopened() -> bool:
        async with open_channel(http, url, token) as channel:
            return bool((await channel.request({"id": 1, "op": "begin"}))["status"] == 201)

    await async_wait_until(reopened, QUIET_CLUSTER_WAIT_S, interval_s=0.1, what="a channel under the cap again")


# ============================================================================ in flight
async def test_past_in_flight_max_the_node_stops_reading_and_answers_everything_once_items_arrive(
        cluster: LocalCluster, http: aiohttp.ClientSession) -> None:
    url = leader_url(cluster)
    token = await consumer_token(cluster, "pipeliner")
    queue, label = fresh_queue("bp"), fresh_queue("bp-label")
    seen: list[int] = []

    async def waiting(expected: int) -> bool:
        """The receives the node has read: each began a transaction (labelled) and waits in it."""
        async with http.get(f"{url}/v1/transactions", params={"label_prefix": label}, headers=bearer(token)) as got:
            assert got.status == 200
            seen.append(len((await got.json())["transactions"]))
        return seen[-1] >= expected  # then checked to be exactly that: the node read no more

    async with open_channel(http, url, token) as channel:
        for frame_id in range(1, PIPELINED + 1):
            await channel.send({"id": frame_id, "op": "receive", "queue": queue, "wait_ms": LONG_POLL_MS,
                                "label": label})
        await async_wait_until(lambda: waiting(IN_FLIGHT_MAX), QUIET_CLUSTER_WAIT_S, what=f"{IN_FLIGHT_MAX} receives read")
        assert seen[-1] == IN_FLIGHT_MAX, f"open receives seen over time: {seen}"
        await enqueue(http, url, token, queue, ["first"])
        [first] = await gather_answers(channel, 1)
        assert first["status"] == 200 and [i["value"] for i in first["body"]["items"]] == ["first"], first
        # one answer out, one more frame read: 4 waiting again, beside the one holding "first"
        await async_wait_until(lambda: waiting(IN_FLIGHT_MAX + 1), QUIET_CLUSTER_WAIT_S, what="a fifth receive read")
        assert max(seen) == IN_FLIGHT_MAX + 1, f"open receives seen over time: {seen}"
        values = [f"item-{n}" for n in range(PIPELINED - 1)]
        await enqueue(http, url, token, queue, values)
        answers = [first, *await gather_answers(channel, PIPELINED - 1)]
        assert sorted(a["id"] for a in answers) == list(range(1, PIPELINED + 1))
        assert {a["status"] for a in answers} == {200}, answers  # nothing refused
        received = [item["value"] for a in answers for item in a["body"]["items"]]
        assert sorted(received) == sorted(["first", *values])
        for n, answer in enumerate(answers, start=PIPELINED + 1):  # committed: the queue is left empty
            await channel.send({"id": n, "op": "commit", "transaction_id": answer["body"]["transaction_id"]})
        assert {a["status"] for a in await gather_answers(channel, PIPELINED)} == {200}


async def enqueue(http: aiohttp.ClientSession, url: str, token: str, queue: str, values: list[str]) -> None:
    async with http.post(f"{url}/v1/queues/{queue}/enqueue", json={"items": values}, headers=bearer(token)) as answer:
        assert answer.status == 200, await answer.text()


# =============================================================================== endings
async def test_an_idle_channel_is_closed_with_1000(cluster: LocalCluster, http: aiohttp.ClientSession) -> None:
    async with open_channel(http, leader_url(cluster), cluster.token) as channel:
        assert (await channel.request({"id": 1, "op": "begin"}))["status"] == 201
        answered = time.monotonic()
        code, reason = await channel.close_code(LOCAL_WAIT_S)
        idle_s = time.monotonic() - answered
    assert code == 1000 and "idle" in reason, (code, reason)
    assert idle_s >= IDLE_S - 0.1, f"closed after {idle_s:.2f} s idle; the timeout is {IDLE_S} s"


async def token_ended(channel: RawChannel) -> tuple[dict[str, Any], int]:
    """The id-null error frame and the close code that end a channel whose token stopped working."""
    frame = await channel.answer(LOCAL_WAIT_S)
    code, _reason = await channel.close_code(LOCAL_WAIT_S)
    return frame, code


async def test_a_channel_whose_token_is_revoked_gets_an_id_null_401_then_close_1008(
        cluster: LocalCluster, http: aiohttp.ClientSession) -> None:
    token = await consumer_token(cluster, "revoked")
    async with open_channel(http, leader_url(cluster), token) as channel:
        # a long poll in flight keeps the channel from idling out while the revocation lands
        await channel.send({"id": 1, "op": "receive", "queue": fresh_queue("empty"), "wait_ms": LONG_POLL_MS})
        await asyncio.to_thread(cluster.revoke_token, "revoked")  # returns once every node refuses it
        frame, code = await token_ended(channel)
    assert frame["id"] is None and frame["status"] == 401 and error_code(frame["body"]) == "unauthorized", frame
    assert code == 1008


async def test_a_channel_whose_token_expires_gets_an_id_null_401_then_close_1008(
        cluster: LocalCluster, http: aiohttp.ClientSession) -> None:
    token = await consumer_token(cluster, "expiring", expires_at=datetime.now(UTC) + timedelta(seconds=3))
    async with open_channel(http, leader_url(cluster), token) as channel:
        await channel.send({"id": 1, "op": "receive", "queue": fresh_queue("empty"), "wait_ms": LONG_POLL_MS})
        frame, code = await token_ended(channel)
    assert frame["id"] is None and frame["status"] == 401 and error_code(frame["body"]) == "token_expired", frame
    assert code == 1008


async def test_when_leadership_ends_in_flight_requests_are_answered_then_the_channel_closes_1012(
        cluster: LocalCluster, http: aiohttp.ClientSession) -> None:
    old_leader = cluster.wait_for_leader(QUIET_CLUSTER_WAIT_S)
    url = cluster.url(old_leader)
    async with open_channel(http, url, cluster.token) as channel:
        await channel.send({"id": 1, "op": "receive", "queue": fresh_queue("empty"), "wait_ms": LONG_POLL_MS})
        assert (await channel.request({"id": 2, "op": "begin"}))["status"] == 201  # both in flight now
        async with http.post(f"{url}/v1/cluster/leadership", json={}, headers=cluster.auth_headers()) as handed:
            assert handed.status == 200, await handed.text()
        # the long poll is answered (its transaction died with the leadership), then the channel ends
        answer = await channel.answer(LOCAL_WAIT_S)
        assert answer["id"] == 1 and answer["status"] == 409, answer
        assert error_code(answer["body"]) == "leader_changed", answer
        code, _reason = await channel.close_code(LOCAL_WAIT_S)
    assert code == 1012
    new_leader = cluster.wait_for_leader(QUIET_CLUSTER_WAIT_S)
    assert new_leader != old_leader

    async def sent_to_the_new_leader() -> bool:  # once the old leader knows it, it names it to new channels
        refusal = await upgrade(http, url, cluster.token)
        return refusal.status == 307 and refusal.body["error"]["leader_url"] == cluster.url(new_leader)

    await async_wait_until(sent_to_the_new_leader, QUIET_CLUSTER_WAIT_S, interval_s=0.1, what="307 to the new leader")
