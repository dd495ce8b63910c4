"""Limits over HTTP and through the client: codes, Retry-After, queue admin routes, per-request bounds."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest

from rcq.client import RcqClient
from rcq.errors import PayloadTooLarge, QueueFull, QueueNotFound, StorageFull
from tests.helpers.nodes import running_node, url_of


async def call(session: aiohttp.ClientSession, method: str, path: str, **kwargs):
    async with session.request(method, path, allow_redirects=False, **kwargs) as response:
        return response.status, dict(response.headers), await response.json()


async def test_queue_full_is_429_with_retry_after_and_the_client_gets_QueueFull(tmp_path: Path):
    async with running_node(tmp_path, queue_items_max_default=2) as node, \
            aiohttp.ClientSession(url_of(node)) as session:
        status, _, _ = await call(session, "POST", "/v1/queues/q/enqueue", json={"items": ["a", "b"]})
        assert status == 200
        status, headers, body = await call(session, "POST", "/v1/queues/q/enqueue", json={"items": ["c"]})
        assert status == 429 and headers["Retry-After"] == "1"
        assert body["error"]["code"] == "queue_full" and body["error"]["retryable"] is True
        async with RcqClient(url_of(node), retry_timeout_s=0.3) as client:
            with pytest.raises(QueueFull):
                await client.enqueue("q", b"c")
            assert await client.dequeue("q", max_items=2) == [b"a", b"b"]  # draining works
            await client.enqueue("q", b"c")


async def test_storage_full_is_507(tmp_path: Path):
    async with running_node(tmp_path, storage_bytes_max=1 << 20) as node, \
            RcqClient(url_of(node), retry_timeout_s=0.3) as client:
        await client.enqueue("q", *[b"x" * 1000] * 800)
        with pytest.raises(StorageFull):
            await client.enqueue("q", *[b"x" * 1000] * 300)
        storage = await client.storage()
        assert storage["storage_bytes"] <= storage["storage_bytes_max"] == 1 << 20
        assert storage["items"] == 800


async def test_queue_settings_purge_and_delete_through_the_client(tmp_path: Path):
    async with running_node(tmp_path) as node, RcqClient(url_of(node), retry_timeout_s=0.5) as client:
        answer = await client.configure_queue("jobs", max_items=3)
        assert answer["settings"] == {"max_items": 3, "max_bytes": None, "max_deliveries": None,
                                      "dead_letter_queue": None, "default_ttl_s": None, "default_delay_s": None,
                                      "max_priority": None, "partitions": ["p0"]}
        info = await client.queue_info("jobs")
        assert info["exists"] and info["limits"]["max_items"] == 3 and info["count"] == 0
        await client.enqueue("jobs", b"1", b"2", b"3")
        with pytest.raises(QueueFull):
            await client.enqueue("jobs", b"4")
        assert await client.purge_queue("jobs") == 3
        assert (await client.stats("jobs"))["purged_total"] == 3
        await client.enqueue("jobs", b"5")
        assert await client.delete_queue("jobs") == 1
        assert [q["queue"] for q in await client.queues()] == []
        with pytest.raises(QueueNotFound):
            await client.delete_queue("jobs")
        with pytest.raises(QueueNotFound):
            await client.purge_queue("jobs")
        assert (await client.queue_info("jobs"))["exists"] is False


async def test_bad_queue_settings_are_refused_with_a_clear_error(tmp_path: Path):
    async with running_node(tmp_path) as node, aiohttp.ClientSession(url_of(node)) as session:
        status, _, body = await call(session, "PUT", "/v1/queues/q", json={"max_items": 0})
        assert status == 400 and "max_items" in body["error"]["message"]
        status, _, body = await call(session, "PUT", "/v1/queues/q", json={"max_itemz": 5})
        assert status == 400
        status, _, body = await call(session, "PUT", "/v1/queues/.", json={})
        assert status in (400, 404)
        assert node.replicator.read(lambda sm: sm.queue_names()) == []


async def test_requests_are_bounded_in_items_and_sub_requests(tmp_path: Path):
    async with running_node(tmp_path, request_items_max=5, batch_requests_max=3) as node, \
            aiohttp.ClientSession(url_of(node)) as session:
        status, _, body = await call(session, "POST", "/v1/queues/q/enqueue", json={"items": ["x"] * 6})
        assert status == 413 and "the limit is 5" in body["error"]["message"]
        status, _, body = await call(session, "POST", "/v1/batch", json={"requests": [{"op": "begin"}] * 4})
        assert status == 413 and "the limit is 3" in body["error"]["message"]
        status, _, body = await call(session, "POST", "/v1/execute-batch", json={"transactions": [
            {"operations": [{"op": "enqueue", "queue": "q", "items": ["x"]}]}] * 4})
        assert status == 413
        assert node.manager.open_count == 0
        assert node.replicator.read(lambda sm: sm.count("q")) == 0
        async with RcqClient(url_of(node), retry_timeout_s=0.3) as client:
            with pytest.raises(PayloadTooLarge):
                await client.enqueue("q", *[b"x"] * 6)


async def test_one_client_cannot_fill_the_transaction_table_over_http(tmp_path: Path):
    async with running_node(tmp_path, transactions_open_per_client_max=4, batch_requests_max=100) as node, \
            aiohttp.ClientSession(url_of(node)) as session:
        status, _, body = await call(session, "POST", "/v1/batch",
                                     json={"requests": [{"op": "begin", "timeout_s": 3600}] * 10})
        assert status == 200
        codes = [r["status"] for r in body["responses"]]
        assert codes.count(201) == 4 and codes.count(429) == 6
        refused = next(r["body"] for r in body["responses"] if r["status"] == 429)
        assert refused["error"]["code"] == "too_many_transactions"
        assert refused["error"]["details"] == {"scope": "client"}
        assert node.manager.open_count == 4


def test_the_client_re_exports_every_error_class():
    import rcq.client
    import rcq.errors

    missing = [cls.__name__ for cls in rcq.errors.ERRORS_BY_CODE.values() if not hasattr(rcq.client, cls.__name__)]
    assert missing == []


async def test_one_request_answers_at_most_the_answer_budget_however_many_dequeues_it_carries(tmp_path: Path):
    async with running_node(tmp_path, dequeue_answer_bytes_max=4096, item_bytes_max=1024) as node, \
            aiohttp.ClientSession(url_of(node)) as session:
        for _ in range(4):
            status, _, _ = await call(session, "POST", "/v1/queues/q/enqueue", json={"items": ["x" * 1000] * 10})
            assert status == 200
        status, _, body = await call(session, "POST", "/v1/execute", json={"operations": [
            {"op": "dequeue", "queue": "q", "max_items": 100}] * 10})
        assert status == 200
        assert sum(len(r["items"]) for r in body["results"]) == 4  # 4,000 bytes fit, not 40 items
        assert node.replicator.read(lambda sm: sm.count("q")) == 36  # only what was answered was taken
        status, _, body = await call(session, "POST", "/v1/batch", json={"requests": [
            {"op": "execute", "operations": [{"op": "dequeue", "queue": "q", "max_items": 100}]}] * 10})
        answered = sum(len(r["body"]["results"][0]["items"]) for r in body["responses"] if r["status"] == 200)
        assert answered == 4
        assert node.replicator.read(lambda sm: sm.count("q")) == 32
        tx = (await call(session, "POST", "/v1/transactions", json={}))[2]["transaction_id"]
        status, _, body = await call(session, "POST", "/v1/batch", json={"requests": [
            {"op": "dequeue", "transaction_id": tx, "queue": "q", "max_items": 100}] * 10})
        assert sum(len(r["body"]["items"]) for r in body["responses"]) == 4
        assert node.manager.locked_count("q") == 4
