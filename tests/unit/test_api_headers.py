"""Item headers over HTTP (in-memory replication): given on every enqueue route, returned with the
item, validated (400) and bounded (413), and refused below feature level 2 (409) with nothing changed."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest

from rcq.limits import HEADER_KEY_BYTES_MAX, HEADER_VALUE_BYTES_MAX, HEADERS_BYTES_MAX, HEADERS_PER_ITEM_MAX
from rcq.server.config import NodeConfig
from rcq.server.core.commands import SetLevel, encode
from rcq.server.core.ledger import headers_bytes
from rcq.server.node import Node
from rcq.testing import InMemoryReplicator
from tests.helpers.nodes import begin, call

TRACE = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "tenant": "acme"}


@pytest.fixture
async def api(tmp_path: Path):
    config = NodeConfig(node_id="n1", http_port=0, raft_address="127.0.0.1:1", data_dir=tmp_path,
                        insecure=True, feature_level_auto=False)
    replicator = InMemoryReplicator()
    node = Node(config, replicator=replicator)
    await node.start()
    async with aiohttp.ClientSession(f"http://127.0.0.1:{node.port}") as session:
        yield session, replicator
    await node.stop()


def raise_level(replicator: InMemoryReplicator) -> None:
    replicator.apply_raw(encode(SetLevel(replicator.term, 1, 2, "0.2.0")))
    assert replicator.state_machine.level == 2


async def dequeue_all(session, queue: str) -> list[dict]:
    status, body = await call(session, "POST", f"/v1/queues/{queue}/dequeue", json={"max_items": 100})
    assert status == 200, body
    return body["results"][0]["items"] if "results" in body else body["items"]


# ------------------------------------------------------------------ the gate
async def test_below_level_2_every_enqueue_route_refuses_headers_and_changes_nothing(api):
    session, replicator = api
    item = {"value": "a", "headers": TRACE}
    tx = await begin(session)
    routes = [
        (f"/v1/transactions/{tx}/enqueue", {"queue": "q", "items": ["plain", item]}),
        ("/v1/queues/q/enqueue", {"items": [item]}),
        ("/v1/execute", {"operations": [{"op": "enqueue", "queue": "q", "items": [item]}]}),
    ]
    before = replicator.state_machine.digest()
    for path, body in routes:
        status, answer = await call(session, "POST", path, json=body)
        assert status == 409, (path, answer)
        error = answer["error"]
        assert error["code"] == "feature_level_required" and not error["retryable"]
        assert "item headers need feature level 2" in error["message"]
        assert error["details"] == {"feature": "item headers", "level_required": 2, "level_active": 1}
    status, answer = await call(session, "POST", "/v1/batch", json={"requests": [
        {"op": "enqueue", "transaction_id": tx, "queue": "q", "items": [item]}]})
    assert status == 200 and answer["responses"][0]["status"] == 409
    status, described = await call(session, "GET", f"/v1/transactions/{tx}")
    assert described["enqueued"] == 0  # nothing was buffered
    assert replicator.state_machine.digest() == before
    # Plain items, and items given as objects without headers, are fine at level 1.
    status, answer = await call(session, "POST", "/v1/queues/q/enqueue",
                                json={"items": ["x", {"value": "y"}, {"value": "z", "headers": {}}]})
    assert status == 200, answer
    items = await dequeue_all(session, "q")
    assert [i["value"] for i in items] == ["x", "y", "z"] and all("headers" not in i for i in items)


# ------------------------------------------------------------------ at level 2
async def test_headers_go_in_on_every_route_and_come_back_with_the_item(api):
    session, replicator = api
    raise_level(replicator)
    tx = await begin(session)
    status, answer = await call(session, "POST", f"/v1/transactions/{tx}/enqueue", json={
        "queue": "q", "items": ["plain", {"value": "a", "headers": TRACE}], "priority": 0})
    assert status == 200 and answer["enqueued"] == 2
    assert (await call(session, "POST", f"/v1/transactions/{tx}/commit", json={}))[0] == 200
    assert (await call(session, "POST", "/v1/queues/q/enqueue", json={
        "items": [{"value": "b", "headers": {"k": "v"}}]}))[0] == 200
    assert (await call(session, "POST", "/v1/execute", json={"operations": [
        {"op": "enqueue", "queue": "q", "items": [{"value": "Yw==", "headers": {"k": "c"}}], "encoding": "base64"}]}
    ))[0] == 200
    status, answer = await call(session, "POST", "/v1/batch", json={"requests": [
        {"op": "execute", "operations": [{"op": "enqueue", "queue": "q", "items": [{"value": "d", "headers": {"k": "d"}}]}]}]})
    assert answer["responses"][0]["status"] == 200, answer

    # An abort gives the items back with their headers; a receive sees them too.
    status, received = await call(session, "POST", "/v1/queues/q/receive", json={"max_items": 100})
    assert [i.get("headers") for i in received["items"]] == [None, TRACE, {"k": "v"}, {"k": "c"}, {"k": "d"}]
    assert "headers" not in received["items"][0]  # a plain item's answer is what it always was
    assert (await call(session, "POST", f"/v1/transactions/{received['transaction_id']}/abort"))[0] == 200
    items = await dequeue_all(session, "q")
    assert [(i["value"], i.get("headers")) for i in items] == [
        ("plain", None), ("a", TRACE), ("b", {"k": "v"}), ("c", {"k": "c"}), ("d", {"k": "d"})]
    assert list(items[1]["headers"]) == ["traceparent", "tenant"]  # in the order given


async def test_headers_count_in_the_queue_bytes(api):
    session, replicator = api
    raise_level(replicator)
    assert (await call(session, "POST", "/v1/queues/q/enqueue", json={
        "items": [{"value": "a", "headers": {"k": "v"}}]}))[0] == 200
    status, stats = await call(session, "GET", "/v1/queues/q/stats")
    assert status == 200 and stats["bytes"] == 1 + headers_bytes((("k", "v"),))  # the value and its headers


# ------------------------------------------------------------------ validation and limits
@pytest.mark.parametrize("headers", [
    {"": "v"},  # an empty key
    {"a\nb": "v"},  # a key that is not printable
    {"k": 5},  # a value that is not a string
    ["k", "v"],  # not an object
], ids=["empty_key", "control_key", "int_value", "list"])
async def test_bad_headers_are_400(api, headers):
    session, replicator = api
    raise_level(replicator)
    status, answer = await call(session, "POST", "/v1/queues/q/enqueue",
                                json={"items": [{"value": "a", "headers": headers}]})
    assert status == 400 and answer["error"]["code"] == "invalid_request", answer
    assert replicator.state_machine.count("q") == 0


@pytest.mark.parametrize(("headers", "detail"), [
    ({f"k{i}": "v" for i in range(HEADERS_PER_ITEM_MAX + 1)}, {"headers": HEADERS_PER_ITEM_MAX + 1}),
    ({"k" * (HEADER_KEY_BYTES_MAX + 1): "v"}, {"key_bytes": HEADER_KEY_BYTES_MAX + 1}),
    ({"k": "é" * (HEADER_VALUE_BYTES_MAX // 2 + 1)}, {"value_bytes": HEADER_VALUE_BYTES_MAX + 2}),
    ({f"k{i}": "v" * HEADER_VALUE_BYTES_MAX for i in range(HEADERS_BYTES_MAX // HEADER_VALUE_BYTES_MAX)},
     {"headers_bytes": HEADERS_BYTES_MAX + 2 * (HEADERS_BYTES_MAX // HEADER_VALUE_BYTES_MAX)}),
], ids=["count", "key_bytes", "value_bytes", "total_bytes"])
async def test_headers_past_a_limit_are_413_with_details(api, headers, detail):
    session, replicator = api
    raise_level(replicator)
    tx = await begin(session)
    status, answer = await call(session, "POST", f"/v1/transactions/{tx}/enqueue",
                                json={"queue": "q", "items": ["fine", {"value": "a", "headers": headers}]})
    assert status == 413 and answer["error"]["code"] == "payload_too_large", answer
    details = answer["error"]["details"]
    assert details["item"] == 1 and {k: details[k] for k in detail} == detail and "limit" in details
    assert (await call(session, "GET", f"/v1/transactions/{tx}"))[1]["enqueued"] == 0
