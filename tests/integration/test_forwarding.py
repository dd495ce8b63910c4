"""A follower forwards leader-only requests to the leader (rcq.server.http.forwarding).

In process: a follower node over the in-memory replicator, whose leader is a stub HTTP server
that answers, cuts the connection, says it is not the leader, or holds the request; and the
leader's side, the forwarded-for proof, on a bare request. Real clusters: a plain HTTP client
talks to a follower only, with its token, and gets everything done; a leader frozen under a
forwarded commit makes it ``504 commit_outcome_unknown``; a TLS cluster forwards over HTTPS.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer, make_mocked_request

from rcq.errors import NotLeader
from rcq.local.cluster import LocalCluster
from rcq.server.http import forwarding
from rcq.server.http.forwarding import FORWARD_PROOF, FORWARDED_AT, FORWARDED_BY, FORWARDED_FOR, Forwarder, proof
from rcq.server.node import Node
from rcq.testing import InMemoryReplicator
from tests.helpers import LEADER_TIMEOUT_S, NODE_SERVING_TIMEOUT_S
from tests.helpers.cluster import ask, running_cluster
from tests.helpers.nodes import make_config, url_of

SECRET = "forwarding-test-secret-0123456789"
PREVIOUS = "the-previous-secret-0123456789"
Stub = Callable[[web.Request], Awaitable[web.StreamResponse]]


# ====================================================================== in process
@asynccontextmanager
async def follower_of(stub: Stub, **overrides: Any) -> AsyncIterator[str]:
    """A follower node (its URL) whose leader is ``stub``, an HTTP server answering every path."""
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", stub)
    leader = TestServer(app)
    await leader.start_server()
    config = make_config(node_id="n2", peers=[{"node_id": "n1", "raft_address": "memory:0",
                                                "http_url": str(leader.make_url("")).rstrip("/")}], **overrides)
    replicator = InMemoryReplicator(leader=False)
    replicator.leader_raft_address = lambda: "memory:0"  # type: ignore[method-assign]
    node = Node(config, replicator=replicator)
    await node.start()
    try:
        yield url_of(node)
    finally:
        await node.stop()
        await leader.close()


def code(payload: Any) -> str | None:
    return payload.get("error", {}).get("code") if isinstance(payload, dict) else None


async def test_the_follower_relays_the_leaders_answer_with_the_callers_token_and_address() -> None:
    seen: list[tuple[str, str, bytes, dict[str, str]]] = []

    async def leader(request: web.Request) -> web.Response:
        seen.append((request.method, request.raw_path, await request.read(), dict(request.headers)))
        return web.json_response({"transaction_id": "1.x"}, status=201,
                                 headers={"Retry-After": "3", "Rcq-Hint": "kept", "X-Other": "dropped"})

    async with follower_of(leader, cluster_secret=SECRET) as url:
        status, payload, headers = await ask("POST", f"{url}/v1/transactions?label=a%20b", {"timeout_s": 5},
                                             {"Authorization": "Bearer rcq_caller", "Rcq-Forwarded-For": "forged"})
    assert (status, payload) == (201, {"transaction_id": "1.x"})
    assert headers["Retry-After"] == "3" and headers["Rcq-Hint"] == "kept" and "X-Other" not in headers
    assert headers["Rcq-Forwarded-To"].startswith("http://127.0.0.1:")
    [(method, raw_path, body, sent)] = seen
    assert (method, raw_path, json.loads(body)) == ("POST", "/v1/transactions?label=a%20b", {"timeout_s": 5})
    assert sent["Authorization"] == "Bearer rcq_caller"  # as is: the leader authenticates the caller
    assert sent[FORWARDED_BY] == "n2" and sent[FORWARDED_FOR] == "127.0.0.1"  # the caller's, not the forged one
    # the proof verifies with the cluster secret's key, and binds the address it vouches for
    keys = forwarding.ProofKeys(SECRET)
    assert keys.verify(method, raw_path, sent[FORWARDED_AT], "127.0.0.1", "n2", sent[FORWARD_PROOF], time.time())
    assert not keys.verify(method, raw_path, sent[FORWARDED_AT], "10.9.9.9", "n2", sent[FORWARD_PROOF], time.time())


async def test_a_cut_answer_is_outcome_unknown_for_a_write_and_unavailable_for_a_read() -> None:
    async def leader(request: web.Request) -> web.Response:
        await request.read()
        assert request.transport is not None
        request.transport.close()  # the leader died with the request in hand
        return web.Response()

    async with follower_of(leader) as url:
        status, payload, _ = await ask("POST", f"{url}/v1/transactions/1.x/commit", {})
        assert (status, code(payload), payload["error"]["maybe_committed"]) == (504, "commit_outcome_unknown", True)
        status, payload, headers = await ask("GET", f"{url}/v1/transactions/1.x")
        assert (status, code(payload), headers.get("Retry-After")) == (503, "unavailable", "1")


async def test_a_leader_that_cannot_be_reached_is_no_leader(unused_tcp_port: int) -> None:
    config = make_config(node_id="n2", peers=[{"node_id": "n1", "raft_address": "memory:0",
                                                "http_url": f"http://127.0.0.1:{unused_tcp_port}"}])
    replicator = InMemoryReplicator(leader=False)
    replicator.leader_raft_address = lambda: "memory:0"  # type: ignore[method-assign]
    node = Node(config, replicator=replicator)
    await node.start()
    try:
        status, payload, headers = await ask("POST", f"{url_of(node)}/v1/transactions/1.x/commit", {})
    finally:
        await node.stop()
    assert (status, code(payload), payload["error"]["maybe_committed"]) == (503, "no_leader", False)
    assert headers["Retry-After"] == "1"


async def test_a_leader_that_stopped_leading_is_no_leader_and_a_forwarded_request_is_not_forwarded_again() -> None:
    async def leader(request: web.Request) -> web.Response:
        body = NotLeader(leader_url="http://elsewhere:1").to_body()
        return web.json_response(body, status=307, headers={"Location": "http://elsewhere:1/v1/transactions"})

    async with follower_of(leader) as url:
        status, payload, headers = await ask("POST", f"{url}/v1/transactions", {})
        assert (status, code(payload), payload["error"]["leader_url"]) == (503, "no_leader", "http://elsewhere:1")
        assert headers["Retry-After"] == "1" and "Location" not in headers
        # what the leader itself does when a forwarded request reaches it after it stopped leading:
        # a request already forwarded once gets the 307, never a second forward
        status, payload, headers = await ask("POST", f"{url}/v1/transactions", {}, {FORWARDED_BY: "n3"})
        assert (status, code(payload)) == (307, "not_leader") and headers["Location"].endswith("/v1/transactions")
        status, payload, _ = await ask("POST", f"{url}/v1/transactions", {}, {"Rcq-Redirect": "1"})
        assert (status, code(payload)) == (307, "not_leader")
        status, payload, headers = await ask("GET", f"{url}/v1/session")  # the channel is never forwarded
        assert (status, code(payload)) == (307, "not_leader") and "Location" not in headers


async def test_forwards_in_flight_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(forwarding, "IN_FLIGHT_MAX", 1)
    arrived, release = asyncio.Event(), asyncio.Event()

    async def leader(request: web.Request) -> web.Response:
        arrived.set()
        await release.wait()
        return web.json_response({"ok": True})

    async with follower_of(leader) as url:
        held = asyncio.create_task(ask("POST", f"{url}/v1/transactions", {}))
        await asyncio.wait_for(arrived.wait(), NODE_SERVING_TIMEOUT_S)
        status, payload, headers = await ask("POST", f"{url}/v1/transactions", {})
        assert (status, code(payload), headers["Retry-After"]) == (503, "unavailable", "1")
        release.set()
        assert (await held)[0] == 200


def forwarded_request(secret: str, client: str = "10.1.2.3", at_s: float | None = None,
                      path: str = "/v1/transactions", signed_path: str | None = None) -> web.Request:
    at_ms = int((time.time() if at_s is None else at_s) * 1000)
    signature = proof(forwarding.derive_key(secret), "POST", signed_path or path, at_ms, client, "n2")
    return make_mocked_request("POST", path, headers={FORWARDED_FOR: client, FORWARDED_BY: "n2",
                                                      FORWARDED_AT: str(at_ms), FORWARD_PROOF: signature})


def test_the_leader_takes_the_forwarded_address_only_with_a_valid_recent_proof() -> None:
    leader = Forwarder(make_config(cluster_secret=SECRET, cluster_secrets_previous=[PREVIOUS]), None)
    assert leader.trusted(forwarded_request(SECRET)).remote == "10.1.2.3"
    assert leader.trusted(forwarded_request(PREVIOUS)).remote == "10.1.2.3"  # a rotation in progress
    for untrusted in (forwarded_request("some-other-secret-0123456789"),
                      forwarded_request(SECRET, at_s=time.time() - 2 * forwarding.PROOF_WINDOW_S),
                      forwarded_request(SECRET, signed_path="/v1/queues/q/purge"),
                      make_mocked_request("POST", "/v1/transactions", headers={FORWARDED_FOR: "10.1.2.3"})):
        assert leader.trusted(untrusted).remote != "10.1.2.3"
    # a node without a cluster secret trusts no proof
    assert Forwarder(make_config(), None).trusted(forwarded_request(SECRET)).remote != "10.1.2.3"


# ====================================================================== real clusters
pytest_cluster = pytest.mark.cluster


def leader_and_follower(cluster: LocalCluster) -> tuple[int, int]:
    leader = cluster.wait_for_leader(LEADER_TIMEOUT_S)
    return leader, next(i for i in range(len(cluster.nodes)) if i != leader)


@pytest_cluster
async def test_a_plain_http_client_with_a_token_gets_everything_done_at_a_follower(cluster: LocalCluster) -> None:
    leader, follower = leader_and_follower(cluster)
    at, auth = cluster.url(follower), cluster.auth_headers()
    status, begun, headers = await ask("POST", f"{at}/v1/transactions", {}, auth)
    assert status == 201 and headers["Rcq-Forwarded-To"] == cluster.url(leader)
    tx = begun["transaction_id"]
    status, _, _ = await ask("POST", f"{at}/v1/transactions/{tx}/enqueue", {"queue": "fwd", "items": ["a", "b"]}, auth)
    assert status == 200
    status, committed, _ = await ask("POST", f"{at}/v1/transactions/{tx}/commit", {}, auth)
    assert (status, committed["committed"], committed["enqueued"]) == (200, True, 2)
    status, received, _ = await ask("POST", f"{at}/v1/queues/fwd/dequeue", {"max_items": 1}, auth)
    assert status == 200 and [i["value"] for i in received["results"][0]["items"]] == ["a"], received
    # the leader authenticates the forwarded caller itself: a follower's 401 or the leader's answer
    status, payload, _ = await ask("POST", f"{at}/v1/transactions", {}, {"Authorization": "Bearer rcq_nope"})
    assert (status, code(payload)) == (401, "unauthorized")
    # reads a follower serves itself are not forwarded
    status, queue, headers = await ask("GET", f"{at}/v1/queues/fwd", None, auth)
    assert status == 200 and queue["role"] == "follower" and "Rcq-Forwarded-To" not in headers
    status, metrics, _ = await ask("GET", f"{at}/metrics", None, auth)
    assert b'rcq_http_forwarded_total{outcome="answered"} 4.0' in metrics


@pytest_cluster
async def test_a_forwarded_commit_to_a_leader_that_froze_is_outcome_unknown() -> None:
    with running_cluster(overrides={"commit_timeout_s": 2.0, "dequeue_wait_max_ms": 0}) as cluster:
        leader, follower = leader_and_follower(cluster)
        at, auth = cluster.url(follower), cluster.auth_headers()
        status, begun, _ = await ask("POST", f"{at}/v1/transactions", {}, auth)
        tx = begun["transaction_id"]
        await ask("POST", f"{at}/v1/transactions/{tx}/enqueue", {"queue": "frozen", "items": ["a"]}, auth)
        cluster.pause_node(leader)
        try:  # sent at once, before the followers' election timeout: they still name the frozen leader
            started = time.monotonic()
            status, payload, _ = await ask("POST", f"{at}/v1/transactions/{tx}/commit", {}, auth)
        finally:
            cluster.resume_node(leader)
        assert (status, code(payload), payload["error"]["maybe_committed"]) == (504, "commit_outcome_unknown", True)
        assert time.monotonic() - started >= 2.0 + forwarding.SLACK_S - 0.5  # the forward's own timeout


@pytest_cluster
async def test_a_tls_cluster_forwards_over_https() -> None:
    with LocalCluster(tls=True) as cluster:
        leader, follower = leader_and_follower(cluster)
        # every node applied what the leader committed: the follower knows it (else 503 no_leader)
        cluster.wait_for_applied(LEADER_TIMEOUT_S)
        assert cluster.ca_file is not None
        context = ssl.create_default_context(cafile=str(cluster.ca_file))
        async with aiohttp.ClientSession() as session, session.post(
                f"{cluster.url(follower)}/v1/queues/tls/enqueue", json={"items": ["x"]},
                headers=cluster.auth_headers(), ssl=context, allow_redirects=False) as response:
            assert response.status == 200, await response.text()
            assert response.headers["Rcq-Forwarded-To"] == cluster.url(leader)
            assert cluster.url(leader).startswith("https://")
