"""The one-request consumer: receive (begin + dequeue) and commit-and-receive, over HTTP and the client."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest

from rcq.client import RcqClient
from rcq.errors import TransactionAborted, TransactionNotFound
from rcq.server.core.commands import CommitBatch
from rcq.testing import InMemoryReplicator
from tests.helpers import LOCAL_WAIT_S
from tests.helpers.nodes import running_node, url_of


async def test_receive_then_commit_and_receive_drains_a_queue_in_order_with_one_request_each(tmp_path: Path):
    async with running_node(tmp_path) as node, RcqClient(url_of(node)) as client:
        await client.enqueue("jobs", *[f"job-{i}" for i in range(7)])
        tx = await client.receive("jobs", 3)
        assert tx is not None and [i.value for i in tx.items] == [b"job-0", b"job-1", b"job-2"]
        seen = [i.value for i in tx.items]
        while tx is not None:
            previous = tx
            tx = await tx.commit_and_receive(max_items=3)
            assert previous.state == "committed" and previous.commit_info is not None
            if tx is not None:
                seen += [i.value for i in tx.items]
        assert seen == [f"job-{i}".encode() for i in range(7)]
        assert await client.count("jobs") == 0
        assert await client.transactions() == []  # the last, empty receive holds nothing


async def test_an_empty_receive_holds_no_transaction_and_a_long_poll_wakes_on_an_enqueue(tmp_path: Path):
    async with running_node(tmp_path) as node, RcqClient(url_of(node)) as client:
        assert await client.receive("idle") is None
        assert await client.transactions() == []
        waiting = asyncio.create_task(client.receive("idle", 1, wait_ms=5000))
        await client.enqueue("idle", b"x")
        tx = await asyncio.wait_for(waiting, LOCAL_WAIT_S)
        assert tx is not None and [i.value for i in tx.items] == [b"x"]
        await tx.abort()
        assert await client.count("idle") == 1


async def test_an_aborted_received_transaction_gives_its_items_back_to_the_head(tmp_path: Path):
    async with running_node(tmp_path) as node, RcqClient(url_of(node)) as client:
        await client.enqueue("q", b"a", b"b")
        tx = await client.receive("q", 1)
        assert tx is not None and tx.items[0].value == b"a" and tx.items[0].delivery_count == 0
        await tx.abort()
        again = await client.receive("q", 1)
        assert again is not None and again.items[0].value == b"a" and again.items[0].delivery_count == 1
        await again.commit()
        assert await client.dequeue("q") == [b"b"]


async def test_commit_and_receive_commits_even_when_the_receive_part_fails(tmp_path: Path):
    async with running_node(tmp_path) as node, RcqClient(url_of(node)) as client:
        await client.enqueue("q", b"a", b"b")
        tx = await client.receive("q", 1)
        assert tx is not None
        # over the node's dequeue_items_max: the receive fails after the commit applied
        following = await tx.commit_and_receive(max_items=10_001)
        assert following is None and tx.state == "committed"
        assert tx.receive_error is not None and tx.receive_error.code == "invalid_request"
        assert await client.transactions() == []  # the failed receive's transaction was aborted
        assert await client.dequeue("q", max_items=5) == [b"b"]


async def test_receive_http_contract_and_bad_input(tmp_path: Path):
    async with running_node(tmp_path) as node, aiohttp.ClientSession(url_of(node)) as session:
        async with session.post("/v1/queues/q/enqueue", json={"items": ["a"]}) as response:
            assert response.status == 200
        async with session.post("/v1/queues/q/receive", json={"max_items": 5, "timeout_s": 30}) as response:
            body = await response.json()
            assert response.status == 200 and body["state"] == "open" and body["queue"] == "q"
            assert [i["value"] for i in body["items"]] == ["a"] and 0 < body["expires_in_s"] <= 30
        tid = body["transaction_id"]
        async with session.post(f"/v1/transactions/{tid}/commit",
                                json={"receive": {"queue": "q", "max_items": 1}}) as response:
            answer = await response.json()
            assert response.status == 200 and answer["committed"] is True
            assert answer["next"] == {"transaction_id": None, "queue": "q", "items": []}
        for bad in ({"max_items": 0}, {"wait_ms": -1}, {"timeout_s": 0}, {"queue": "q"}):
            async with session.post("/v1/queues/q/receive", json=bad) as response:
                assert response.status == 400, bad
        async with session.post("/v1/queues/q/receive", json={"max_items": 1}) as response:
            assert (await response.json())["transaction_id"] is None
        async with session.post(f"/v1/transactions/{tid}/commit",
                                json={"receive": {"queue": "bad name!"}}) as response:
            assert response.status == 400


async def test_commit_and_receive_needs_a_queue_when_the_transaction_was_not_received(tmp_path: Path):
    async with running_node(tmp_path) as node, RcqClient(url_of(node)) as client:
        tx = await client.begin()
        with pytest.raises(Exception, match="needs a queue"):
            await tx.commit_and_receive()
        await tx.abort()
        with pytest.raises(TransactionNotFound):
            await client.attach("1.000000000000000000000000").commit_and_receive("q")


async def test_commit_and_receive_fences_what_it_receives_with_the_commits_own_entry(tmp_path: Path):
    # No item leaves before an entry proposed after its take commits (docs/raft-hazards.md, H22):
    # the receive starts beside the commit, so the commit's entry is that entry; not one more.
    replicator = InMemoryReplicator()
    async with running_node(tmp_path, replicator) as node, RcqClient(url_of(node)) as client:
        await client.enqueue("q", b"a", b"b", b"c")
        tx = await client.receive("q", 1)
        assert tx is not None
        start = len(replicator.submitted)
        following = await tx.commit_and_receive(max_items=2)
        assert following is not None and [i.value for i in following.items] == [b"b", b"c"]
        entries = [c for c in replicator.submitted[start:] if isinstance(c, CommitBatch)]
        assert [len(e.units) for e in entries] == [1]
        await following.commit()


async def test_commit_and_receive_whose_commit_fails_gives_back_what_its_receive_took(tmp_path: Path):
    async with running_node(tmp_path) as node, RcqClient(url_of(node)) as client:
        await client.enqueue("q", b"a", b"b")
        tx = await client.receive("q", 1)
        assert tx is not None
        async with aiohttp.ClientSession() as http:  # aborted behind the client's back
            async with http.post(f"{url_of(node)}/v1/transactions/{tx.transaction_id}/abort") as answer:
                assert answer.status == 200
        with pytest.raises(TransactionAborted):
            await tx.commit_and_receive(max_items=2)
        assert await client.transactions() == []  # the receive begun beside the commit is gone
        assert await client.count("q") == 2
        again = await client.receive("q", 2)
        assert again is not None and sorted(i.value for i in again.items) == [b"a", b"b"]
        await again.commit()
