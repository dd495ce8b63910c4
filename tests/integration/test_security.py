"""Security on real clusters: tokens on every route, permissions, ownership, TLS, secret hygiene.

One 3-node cluster with tokens (the harness's admin token plus principals added per test) serves
the authorization tests; the TLS tests start their own cluster with a generated CA. The last test
greps every node log, config-free answer and error of a cluster run for the secrets it used.
"""

from __future__ import annotations

import base64
import os
import stat
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from rcq.client import CertificateError, Forbidden, RcqClient, TransactionNotFound, Unauthorized, Unavailable
from rcq.local.cluster import LocalCluster
from rcq.local.tls import write_ca
from rcq.server.http.openapi import OPERATIONS, PUBLIC
from rcq.testing import async_wait_until
from tests.helpers import LEADER_TIMEOUT_S, QUIET_CLUSTER_WAIT_S, TOKEN_RELOAD_TIMEOUT_S

PATH_VALUES = {"{queue}": "sec-q", "{transaction_id}": "1.000000000000000000000000"}


@pytest.fixture(scope="module")
def secured() -> Iterator[LocalCluster]:
    with LocalCluster(nodes=3, auth=True) as cluster:
        cluster.wait_for_leader(LEADER_TIMEOUT_S)
        yield cluster


def leader_url(cluster: LocalCluster) -> str:
    return cluster.urls[cluster.wait_for_leader(LEADER_TIMEOUT_S)]


async def add_principal(cluster: LocalCluster, name: str, grants: list[dict[str, Any]], *,
                        admin: bool = False, expires_at: datetime | None = None) -> str:
    """A new token, usable once every node has re-read its tokens file."""
    token = cluster.add_token(name, grants=grants, admin=admin, expires_at=expires_at)
    if expires_at is None or expires_at > datetime.now(UTC):
        await wait_accepted(cluster, token)
    return token


async def wait_accepted(cluster: LocalCluster, token: str) -> None:
    async with aiohttp.ClientSession() as session:
        async def everywhere() -> bool:
            for url in cluster.urls:
                async with session.get(f"{url}/v1/cluster", headers=bearer(token)) as response:
                    if response.status != 200:
                        return False
            return True

        await async_wait_until(everywhere, TOKEN_RELOAD_TIMEOUT_S, interval_s=0.1, what="the new token on every node")


def bearer(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token is not None else {}


async def call(session: aiohttp.ClientSession, method: str, url: str, token: str | None,
               body: Any = None) -> tuple[int, Any, aiohttp.typedefs.LooseHeaders]:
    async with session.request(method, url, json=body, headers=bearer(token), allow_redirects=False) as response:
        payload = await response.json(content_type=None) if response.content_type == "application/json" else None
        return response.status, payload, response.headers


def error_code(payload: Any) -> str | None:
    return payload.get("error", {}).get("code") if isinstance(payload, dict) else None


# ----------------------------------------------------------------- authentication
async def test_every_route_but_the_probes_needs_a_valid_token(secured: LocalCluster):
    url = leader_url(secured)
    checked = 0
    async with aiohttp.ClientSession() as session:
        for op in OPERATIONS:
            path = op.path
            for placeholder, value in PATH_VALUES.items():
                path = path.replace(placeholder, value)
            body = {} if op.method in ("POST", "PUT") else None
            for token in (None, "rcq_" + "A" * 43, secured.token + "x"):
                status, payload, headers = await call(session, op.method, url + path, token, body)
                if op.path in PUBLIC:
                    assert status in (200, 503), (op.path, status)
                    continue
                assert status == 401, (op.method, op.path, token is None, status, payload)
                assert error_code(payload) == "unauthorized"
                assert headers.get("WWW-Authenticate", "").startswith("Basic")
                checked += 1
    assert checked == 3 * (len(OPERATIONS) - len(PUBLIC))


async def test_basic_authentication_carries_the_token_as_its_password(secured: LocalCluster):
    url = leader_url(secured)
    basic = base64.b64encode(f"anyone:{secured.token}".encode()).decode()
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{url}/", headers={"Authorization": f"Basic {basic}"}) as response:
            assert response.status == 200 and "text/html" in response.content_type
        async with session.get(f"{url}/metrics", headers={"Authorization": f"Basic {basic}"}) as response:
            assert response.status == 200


async def test_an_expired_token_is_refused_with_its_own_code(secured: LocalCluster):
    past = datetime.now(UTC) - timedelta(minutes=1)
    expired = await add_principal(secured, "expired-svc", [{"queues": "*", "actions": ["produce"]}],
                                  expires_at=past)
    fresh = await add_principal(secured, "fresh-svc", [{"queues": "*", "actions": ["produce"]}])
    async with aiohttp.ClientSession() as session:  # the file carrying both was read: fresh works
        for node_url in secured.urls:
            status, payload, _ = await call(session, "GET", f"{node_url}/v1/cluster", expired)
            assert (status, error_code(payload)) == (401, "token_expired")
    async with RcqClient(secured.urls, token=expired, retry_timeout_s=2) as client:
        with pytest.raises(Unauthorized):
            await client.enqueue("sec-expired", b"x")
    async with RcqClient(secured.urls, token=fresh) as client:
        await client.enqueue("sec-expired", b"x")


# ------------------------------------------------------------------ authorization
async def test_a_token_without_the_permission_is_refused_and_changes_nothing(secured: LocalCluster):
    admin = secured.token
    reader = await add_principal(secured, "reader", [{"queues": "sec-other.*", "actions": ["consume"]}])
    async with RcqClient(secured.urls, token=admin) as client:
        await client.enqueue("sec-guarded", b"kept-1", b"kept-2")
        await client.enqueue("sec-other.a", b"visible")
    before = secured.wait_for_convergence(LEADER_TIMEOUT_S)
    url = leader_url(secured)
    q = "sec-guarded"
    async with aiohttp.ClientSession() as session:
        status, begun, _ = await call(session, "POST", f"{url}/v1/transactions", reader, {})
        assert status == 201
        tx = begun["transaction_id"]
        item = {"items": ["eA=="], "encoding": "base64"}
        refused = [
            ("POST", f"/v1/transactions/{tx}/enqueue", {"queue": q, **item}),
            ("POST", f"/v1/transactions/{tx}/dequeue", {"queue": q, "max_items": 5}),
            ("POST", f"/v1/transactions/{tx}/enqueue", {"queue": "sec-other.a", **item}),  # consume only
            ("POST", "/v1/execute", {"operations": [{"op": "enqueue", "queue": "sec-other.b", **item}]}),
            ("POST", "/v1/execute", {"operations": [{"op": "dequeue", "queue": "sec-other.a"},
                                                    {"op": "dequeue", "queue": q}]}),
            ("POST", f"/v1/queues/{q}/enqueue", item),
            ("POST", f"/v1/queues/{q}/dequeue", {"max_items": 10}),
            ("PUT", f"/v1/queues/{q}", {"max_items": 1}),
            ("POST", f"/v1/queues/{q}/purge", {}),
            ("DELETE", f"/v1/queues/{q}", None),
            ("PUT", "/v1/queues/sec-other.a", {"max_items": 1}),  # manage is not granted either
            ("GET", f"/v1/queues/{q}", None),
            ("GET", f"/v1/queues/{q}/stats", None),
            ("GET", "/metrics", None),
            ("GET", "/v1/cluster/digest", None),
            ("GET", "/v1/cluster/overview", None),
            ("GET", "/v1/cluster/storage", None),
            ("POST", "/v1/admin/snapshot", {}),
        ]
        for method, path, body in refused:
            status, payload, _ = await call(session, method, url + path, reader, body)
            assert (status, error_code(payload)) == (403, "forbidden"), (method, path, status, payload)
        # Inside a batch, each refused sub-request answers 403 on its own.
        status, payload, _ = await call(session, "POST", f"{url}/v1/batch", reader, {"requests": [
            {"op": "enqueue", "transaction_id": tx, "queue": q, **item},
            {"op": "execute", "operations": [{"op": "dequeue", "queue": q}]}]})
        assert status == 200 and [r["status"] for r in payload["responses"]] == [403, 403]
        status, payload, _ = await call(session, "POST", f"{url}/v1/transactions/{tx}/commit", reader, {})
        assert status == 200
        # What the reader may do, it can: see and consume its queues, find the leader.
        status, listing, _ = await call(session, "GET", f"{url}/v1/queues", reader)
        assert status == 200 and [row["queue"] for row in listing["queues"]] == ["sec-other.a"]
        status, view, _ = await call(session, "GET", f"{url}/v1/cluster", reader)
        assert status == 200 and view["leader_url"] == url and "commit_index" not in view
    assert secured.wait_for_convergence(LEADER_TIMEOUT_S)["digest"] == before["digest"]
    async with RcqClient(secured.urls, token=reader) as client:
        with pytest.raises(Forbidden):
            await client.enqueue(q, b"nope")
        assert await client.dequeue("sec-other.a", 5) == [b"visible"]
    async with RcqClient(secured.urls, token=admin) as client:
        assert sorted(await client.dequeue(q, 5)) == [b"kept-1", b"kept-2"]


# ---------------------------------------------------------------------- ownership
async def test_a_transaction_belongs_to_the_principal_that_began_it(secured: LocalCluster):
    grants = [{"queues": "sec-own*", "actions": ["produce", "consume"]}]
    alice = await add_principal(secured, "alice", grants)
    bob = await add_principal(secured, "bob", grants)
    async with RcqClient(secured.urls, token=alice) as client:
        await client.enqueue("sec-own", b"a1")
    url = leader_url(secured)
    async with aiohttp.ClientSession() as session:
        status, begun, _ = await call(session, "POST", f"{url}/v1/transactions", alice, {"label": "alice-job"})
        tx = begun["transaction_id"]
        await call(session, "POST", f"{url}/v1/transactions/{tx}/enqueue", alice,
                   {"queue": "sec-own", "items": ["YTI="], "encoding": "base64"})
        status, taken, _ = await call(session, "POST", f"{url}/v1/transactions/{tx}/dequeue", alice,
                                      {"queue": "sec-own", "max_items": 1})
        assert status == 200 and len(taken["items"]) == 1
        attempts = [
            ("GET", f"/v1/transactions/{tx}", None),
            ("POST", f"/v1/transactions/{tx}/enqueue", {"queue": "sec-own", "items": ["Yg=="], "encoding": "base64"}),
            ("POST", f"/v1/transactions/{tx}/dequeue", {"queue": "sec-own"}),
            ("POST", f"/v1/transactions/{tx}/extend", {"timeout_s": 5}),
            ("POST", f"/v1/transactions/{tx}/abort", {}),
            ("POST", f"/v1/transactions/{tx}/commit", {}),
            ("POST", "/v1/commit", {"transaction_ids": [tx]}),
        ]
        for method, path, body in attempts:
            status, payload, _ = await call(session, method, url + path, bob, body)
            assert (status, error_code(payload)) == (404, "transaction_not_found"), (method, path, payload)
            assert "alice" not in str(payload)
        status, payload, _ = await call(session, "POST", f"{url}/v1/batch", bob, {"requests": [
            {"op": "status", "transaction_id": tx}, {"op": "abort", "transaction_id": tx}]})
        assert [r["status"] for r in payload["responses"]] == [404, 404]
        # Without the permission, the same 403 for alice's id and for an id that never existed.
        for some_id in (tx, tx.split(".")[0] + ".000000000000000000000000"):
            status, payload, _ = await call(session, "POST", f"{url}/v1/transactions/{some_id}/enqueue", bob,
                                            {"queue": "sec-not-granted", "items": ["Yg=="], "encoding": "base64"})
            assert (status, error_code(payload)) == (403, "forbidden")
        status, listed, _ = await call(session, "GET", f"{url}/v1/transactions", bob)
        assert status == 200 and tx not in {t["transaction_id"] for t in listed["transactions"]}
        status, listed, _ = await call(session, "GET", f"{url}/v1/transactions?label_prefix=alice", alice)
        assert [t["transaction_id"] for t in listed["transactions"]] == [tx]
        # Untouched by bob: alice's transaction still holds its item and commits both ways.
        status, committed, _ = await call(session, "POST", f"{url}/v1/transactions/{tx}/commit", alice, {})
        assert status == 200 and (committed["enqueued"], committed["dequeued"]) == (1, 1)
        # Once committed: still 404 for bob at the leader; a follower forwards him to the leader,
        # which refuses him the same way.
        status, payload, _ = await call(session, "GET", f"{url}/v1/transactions/{tx}", bob)
        assert (status, error_code(payload)) == (404, "transaction_not_found")
        for follower in (u for u in secured.urls if u != url):
            status, payload, _ = await call(session, "GET", f"{follower}/v1/transactions/{tx}", bob)
            assert (status, error_code(payload)) == (404, "transaction_not_found"), payload
    async with RcqClient(secured.urls, token=bob) as client:
        with pytest.raises(TransactionNotFound):
            await client.commit_many([tx])
        assert await client.dequeue("sec-own", 5) == [b"a2"]


async def test_commit_many_works_within_one_principal(secured: LocalCluster):
    carol = await add_principal(secured, "carol", [{"queues": "sec-many", "actions": ["produce"]}])
    async with RcqClient(secured.urls, token=carol) as client:
        first, second = await client.begin(), await client.begin()
        await first.enqueue("sec-many", b"1")
        await second.enqueue("sec-many", b"2")
        info = await client.commit_many([first, second])
        assert info.enqueued == 2
    async with RcqClient(secured.urls, token=secured.token) as admin:
        # A new client asks the first node it knows, maybe a follower whose count may lag (by contract).
        await async_wait_until(lambda: _count_is(admin, "sec-many", 2), QUIET_CLUSTER_WAIT_S, what="both items counted")


async def _count_is(client: RcqClient, queue: str, expected: int) -> bool:
    count = await client.count(queue)
    assert count <= expected, count
    return count == expected


# ----------------------------------------------------------------------------- TLS
@pytest.fixture(scope="module")
def tls_cluster() -> Iterator[LocalCluster]:
    with LocalCluster(nodes=3, auth=True, tls=True) as cluster:
        cluster.wait_for_leader(LEADER_TIMEOUT_S)
        yield cluster


async def test_a_tls_cluster_end_to_end_with_the_client_verifying_it(tls_cluster: LocalCluster):
    assert all(url.startswith("https://") for url in tls_cluster.urls)
    async with RcqClient(tls_cluster.urls, token=tls_cluster.token, ca_file=tls_cluster.ca_file) as client:
        await client.enqueue("tls-q", b"over-tls")
        async with client.transaction() as tx:
            assert await tx.dequeue("tls-q") == b"over-tls"
        assert await client.count("tls-q") == 0
    tls_cluster.wait_for_convergence(LEADER_TIMEOUT_S)  # the harness polls over TLS too


async def test_a_client_with_a_wrong_ca_refuses_to_connect(tls_cluster: LocalCluster, tmp_path: Path):
    other_ca, _ = write_ca(tmp_path, "not-the-cluster-ca")
    for options in ({"ca_file": other_ca}, {}):  # another CA; the system's CAs
        async with RcqClient(tls_cluster.urls, token=tls_cluster.token, retry_timeout_s=1.0, **options) as client:
            with pytest.raises(CertificateError, match="cannot verify the TLS certificate"):
                await client.count("tls-q")  # at once: a wrong CA is not retried
    async with aiohttp.ClientSession() as session:  # plain HTTP to the TLS port gets nothing
        with pytest.raises(aiohttp.ClientError):
            await session.get(tls_cluster.urls[0].replace("https://", "http://") + "/healthz",
                              timeout=aiohttp.ClientTimeout(total=5))


async def test_client_certificates_when_the_node_requires_them(tmp_path: Path):
    with LocalCluster(nodes=1, auth=True, tls=True, tls_client_certificates=True) as cluster:
        cluster.wait_for_leader(LEADER_TIMEOUT_S)
        async with RcqClient(cluster.urls, token=cluster.token, ca_file=cluster.ca_file,
                             retry_timeout_s=1.0) as client:
            with pytest.raises(Unavailable):
                await client.count("mtls")  # no client certificate: the handshake fails
        async with RcqClient(cluster.urls, token=cluster.token, ca_file=cluster.ca_file,
                             client_cert=cluster.client_cert) as client:
            await client.enqueue("mtls", b"x")
            assert await client.count("mtls") == 1


# --------------------------------------------------------------------- hygiene
async def test_no_secret_reaches_a_log_or_an_answer_and_data_files_are_private(secured: LocalCluster):
    """Everything the cluster of this module said — every node log, every answer below, errors
    included — is searched for the cluster secret and every token it used."""
    intruder = "rcq_" + "Z" * 43
    answers: list[str] = []
    url = leader_url(secured)
    async with aiohttp.ClientSession() as session:
        for token in (None, intruder, secured.token):
            for method, path in (("GET", "/v1/cluster"), ("GET", "/v1/cluster/overview"), ("GET", "/metrics"),
                                 ("GET", "/v1/transactions"), ("POST", "/v1/transactions/nope/commit"),
                                 ("GET", "/v1/openapi.json"), ("GET", "/readyz"), ("POST", "/v1/execute")):
                async with session.request(method, url + path, headers=bearer(token),
                                           data=b"{not json" if method == "POST" else None) as response:
                    answers.append(await response.text())
    secrets_used = [secured.secret, secured.token, intruder, *secured.issued_tokens]
    assert all(secrets_used) and len(secrets_used) >= 3
    texts = {"answers": "\n".join(answers)}
    for node in secured.nodes:
        texts[f"{node.node_id} log"] = node.log_path.read_text(errors="replace")
    for where, text in texts.items():
        for secret in secrets_used:
            assert secret not in text, f"a secret appears in {where}"
            assert secret[-12:] not in text, f"the tail of a secret appears in {where}"
    for node in secured.nodes:
        for root, dirs, files in os.walk(node.data_dir):
            for name in [*dirs, *files]:
                mode = stat.S_IMODE(os.stat(os.path.join(root, name)).st_mode)
                assert mode & 0o077 == 0, f"{os.path.join(root, name)} has mode {mode:o}"

