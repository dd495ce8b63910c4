"""The HTTP API through a real aiohttp server (in-memory replication): shapes, codes, bad input."""

from __future__ import annotations

import base64
from pathlib import Path

import aiohttp
import pytest

from rcq.server.config import NodeConfig
from rcq.server.node import Node
from rcq.testing import InMemoryReplicator
from tests.helpers.nodes import begin, call


@pytest.fixture
async def api(tmp_path: Path):
    config = NodeConfig(node_id="n1", http_port=0, raft_address="127.0.0.1:1", data_dir=tmp_path,
                        insecure=True, item_bytes_max=1000, body_bytes_max=64 * 1024,
                        transactions_open_max=5)
    replicator = InMemoryReplicator()
    node = Node(config, replicator=replicator)
    await node.start()
    async with aiohttp.ClientSession(f"http://127.0.0.1:{node.port}") as session:
        yield session, replicator
    await node.stop()


async def test_a_transaction_round_trip_over_http(api):
    session, replicator = api
    tx = await begin(session)
    assert (await call(session, "POST", f"/v1/transactions/{tx}/enqueue",
                       json={"queue": "q", "items": ["a", "b"]}))[0] == 200
    status, body = await call(session, "POST", f"/v1/transactions/{tx}/commit", json={})
    assert status == 200 and body["committed"] and body["enqueued"] == 2
    status, body = await call(session, "GET", "/v1/queues/q")
    assert status == 200 and body["count"] == 2 and body["locked"] == 0 and body["approximate"] is True
    tx2 = await begin(session)
    status, body = await call(session, "POST", f"/v1/transactions/{tx2}/dequeue",
                              json={"queue": "q", "max_items": 5})
    assert [i["value"] for i in body["items"]] == ["a", "b"]
    assert (await call(session, "GET", "/v1/queues/q"))[1]["locked"] == 2
    status, body = await call(session, "POST", f"/v1/transactions/{tx2}/abort")
    assert status == 200 and body["returned"] == 2
    assert replicator.state_machine.count("q") == 2


async def test_arbitrary_bytes_round_trip_as_base64(api):
    session, _ = api
    payload = bytes(range(256))
    status, _ = await call(session, "POST", "/v1/queues/bin/enqueue",
                           json={"items": [base64.b64encode(payload).decode()], "encoding": "base64"})
    assert status == 200
    status, body = await call(session, "POST", "/v1/queues/bin/dequeue", json={})
    [item] = body["results"][0]["items"]
    assert item["encoding"] == "base64" and base64.b64decode(item["value"]) == payload


async def test_one_request_transaction_runs_operations_atomically(api):
    session, replicator = api
    await call(session, "POST", "/v1/queues/a/enqueue", json={"items": ["x"]})
    status, body = await call(session, "POST", "/v1/execute", json={"operations": [
        {"op": "dequeue", "queue": "a"}, {"op": "enqueue", "queue": "b", "items": ["moved"]}]})
    assert status == 200 and body["results"][0]["items"][0]["value"] == "x"
    assert (replicator.state_machine.count("a"), replicator.state_machine.count("b")) == (0, 1)


async def test_execute_batch_answers_each_transaction_on_its_own(api):
    session, replicator = api
    status, body = await call(session, "POST", "/v1/execute-batch", json={"transactions": [
        {"operations": [{"op": "enqueue", "queue": "q", "items": ["1"]}]},
        {"operations": [{"op": "enqueue", "queue": "q", "items": ["2"]}], "idempotency_key": "k"},
        {"operations": [{"op": "enqueue", "queue": "q", "items": ["3"]}], "idempotency_key": "k"},
    ]})
    assert status == 200
    assert [r.get("duplicate") for r in body["results"]] == [False, False, True]
    assert replicator.state_machine.count("q") == 2


async def test_cluster_and_health_endpoints(api):
    session, _ = api
    assert (await call(session, "GET", "/healthz"))[0] == 200
    status, body = await call(session, "GET", "/readyz")
    assert status == 200 and body["role"] == "leader" and body["serving"]
    status, body = await call(session, "GET", "/v1/cluster")
    assert body["node_id"] == "n1" and body["term"] == 1


@pytest.mark.parametrize(("method", "path", "payload", "status", "code"), [
    ("POST", "/v1/queues/bad name/enqueue", {"items": ["x"]}, 400, "invalid_queue_name"),
    ("POST", "/v1/queues/q/enqueue", {"items": []}, 400, "invalid_request"),
    ("POST", "/v1/queues/q/enqueue", {"items": ["x"], "extra": 1}, 400, "invalid_request"),
    ("POST", "/v1/queues/q/enqueue", {"items": ["x" * 1001]}, 413, "payload_too_large"),
    ("POST", "/v1/queues/q/enqueue", {"items": ["!!"], "encoding": "base64"}, 400, "invalid_request"),
    ("POST", "/v1/queues/q/enqueue", {"items": ["x"], "encoding": "rot13"}, 400, "invalid_request"),
    ("POST", "/v1/queues/" + "q" * 129 + "/enqueue", {"items": ["x"]}, 400, "invalid_queue_name"),
    ("POST", "/v1/execute", {"operations": [{"op": "fly", "queue": "q"}]}, 400, "invalid_request"),
    ("POST", "/v1/transactions", {"timeout_s": -1}, 400, "invalid_request"),
    ("POST", "/v1/transactions", {"timeout_s": 10**7}, 400, "invalid_request"),
    ("POST", "/v1/transactions/1.000000000000000000000000/commit", {}, 404, "transaction_not_found"),
    ("GET", "/v1/transactions/nonsense", None, 404, "transaction_not_found"),
    ("POST", "/v1/commit", {"transaction_ids": ["zz"]}, 400, "invalid_request"),
    ("GET", "/v1/nowhere", None, 404, "not_found"),
    ("DELETE", "/v1/queues", None, 405, "method_not_allowed"),
])
async def test_bad_input_gets_its_status_and_changes_nothing(api, method, path, payload, status, code):
    session, replicator = api
    before = replicator.state_machine.digest()
    got_status, body = await call(session, method, path, json=payload)
    assert (got_status, body["error"]["code"]) == (status, code), body
    assert body["error"]["message"] and body["error"]["maybe_committed"] is False
    assert replicator.state_machine.digest() == before


async def test_malformed_json_and_oversized_bodies_are_refused(api):
    session, replicator = api
    before = replicator.state_machine.digest()
    status, body = await call(session, "POST", "/v1/queues/q/enqueue", data=b"{not json",
                              headers={"Content-Type": "application/json"})
    assert (status, body["error"]["code"]) == (400, "invalid_request")
    status, body = await call(session, "POST", "/v1/queues/q/enqueue", data=b"x" * (65 * 1024),
                              headers={"Content-Type": "application/json"})
    assert (status, body["error"]["code"]) == (413, "payload_too_large")
    assert replicator.state_machine.digest() == before


async def test_too_many_open_transactions_is_back_pressure(api):
    session, _ = api
    for _ in range(5):
        await begin(session)
    status, body = await call(session, "POST", "/v1/transactions", json={})
    assert (status, body["error"]["code"], body["error"]["retryable"]) == (429, "too_many_transactions", True)


async def test_operations_on_a_closed_transaction_get_409(api):
    session, _ = api
    tx = await begin(session)
    await call(session, "POST", f"/v1/transactions/{tx}/abort")
    status, body = await call(session, "POST", f"/v1/transactions/{tx}/enqueue", json={"queue": "q", "items": ["x"]})
    assert (status, body["error"]["code"]) == (409, "transaction_aborted")
    status, body = await call(session, "GET", f"/v1/transactions/{tx}")
    assert status == 200 and body["state"] == "aborted"


async def test_labels_list_open_transactions_by_prefix(api):
    session, _ = api
    await call(session, "POST", "/v1/transactions", json={"label": "spark:1"})
    await call(session, "POST", "/v1/transactions", json={"label": "other"})
    status, body = await call(session, "GET", "/v1/transactions", params={"label_prefix": "spark:"})
    assert status == 200 and [t["label"] for t in body["transactions"]] == ["spark:1"]


async def test_a_follower_sends_clients_to_the_leader(tmp_path: Path):
    config = NodeConfig(node_id="n2", http_port=0, raft_address="127.0.0.1:2", data_dir=tmp_path, insecure=True,
                        peers=[{"node_id": "n1", "raft_address": "memory:0", "http_url": "http://leader:1"}])
    replicator = InMemoryReplicator(leader=False)
    replicator.leader_raft_address = lambda: "memory:0"  # type: ignore[method-assign]
    node = Node(config, replicator=replicator)
    await node.start()
    try:
        async with aiohttp.ClientSession(f"http://127.0.0.1:{node.port}") as session:
            async with session.post("/v1/transactions", json={}, allow_redirects=False,
                                    headers={"Rcq-Redirect": "1"}) as response:
                body = await response.json()
                assert response.status == 307
                assert response.headers["Location"] == "http://leader:1/v1/transactions"
                assert body["error"]["leader_url"] == "http://leader:1"
            status, body = await call(session, "GET", "/v1/queues/q")
            assert status == 200 and body["role"] == "follower" and body["locked"] is None
    finally:
        await node.stop()


async def test_dot_segments_are_not_queue_names(api):
    session, replicator = api
    status, body = await call(session, "POST", "/v1/execute",
                              json={"operations": [{"op": "enqueue", "queue": "..", "items": ["x"]}]})
    assert (status, body["error"]["code"]) == (400, "invalid_queue_name")
    assert replicator.state_machine.queue_names() == []


async def test_a_retried_commit_many_answers_duplicate(api):
    session, replicator = api
    tx = await begin(session)
    await call(session, "POST", f"/v1/transactions/{tx}/enqueue", json={"queue": "q", "items": ["x"]})
    first = await call(session, "POST", "/v1/commit", json={"transaction_ids": [tx]})
    again = await call(session, "POST", "/v1/commit", json={"transaction_ids": [tx]})
    assert first[0] == again[0] == 200 and (first[1]["duplicate"], again[1]["duplicate"]) == (False, True)
    assert replicator.state_machine.count("q") == 1


async def test_batch_runs_sub_requests_of_any_verb_independently(api):
    session, replicator = api
    tx = await begin(session)
    status, body = await call(session, "POST", "/v1/batch", json={"requests": [
        {"op": "enqueue", "transaction_id": tx, "queue": "q", "items": ["a"]},
        {"op": "begin", "label": "x"},
        {"op": "commit", "transaction_id": "1.000000000000000000000000"},
        {"op": "execute", "operations": [{"op": "enqueue", "queue": "q", "items": ["b"]}]},
    ]})
    assert status == 200
    assert [r["status"] for r in body["responses"]] == [200, 201, 404, 200]
    assert body["responses"][2]["body"]["error"]["code"] == "transaction_not_found"
    status, body = await call(session, "POST", "/v1/batch", json={"requests": [
        {"op": "commit", "transaction_id": tx}]})
    assert body["responses"][0]["status"] == 200 and replicator.state_machine.count("q") == 2


async def test_an_operator_can_ask_a_node_for_a_snapshot(api):
    session, replicator = api
    status, body = await call(session, "POST", "/v1/admin/snapshot")
    assert (status, body["snapshot_requested"], replicator.snapshots_requested) == (202, True, 1)
