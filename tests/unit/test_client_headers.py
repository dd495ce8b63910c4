"""Item headers through the clients (async and sync) against a node with in-memory replication:
given on every enqueue verb, returned as ``Item.headers``, refused below feature level 2."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from rcq.client import RcqClient
from rcq.client.sync import SyncClient
from rcq.client.wire import Enqueue, enqueue_body, estimated_item_bytes
from rcq.errors import FeatureLevelRequired, InvalidRequest
from rcq.server.core.commands import SetLevel, encode
from rcq.testing import InMemoryReplicator
from tests.helpers import LOCAL_WAIT_S
from tests.helpers.nodes import running_node, url_of

TRACE = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}


def at_level_2() -> InMemoryReplicator:
    """A replicator whose state runs at feature level 2 (an in-memory node has no members to survey,
    so the level is applied as a leader would replicate it)."""
    replicator = InMemoryReplicator()
    replicator.apply_raw(encode(SetLevel(replicator.term, 1, 2, "0.2.0")))
    return replicator


async def test_below_level_2_an_enqueue_with_headers_raises_feature_level_required_at_once(tmp_path: Path):
    async with running_node(tmp_path, feature_level_auto=False) as node, RcqClient(url_of(node)) as client:
        with pytest.raises(FeatureLevelRequired) as raised:
            await asyncio.wait_for(client.enqueue("q", "a", headers=TRACE), LOCAL_WAIT_S)  # not retried until a deadline
        assert not raised.value.retryable and raised.value.details["level_required"] == 2
        async with client.transaction() as tx:
            with pytest.raises(FeatureLevelRequired):
                await tx.enqueue("q", "a", headers=TRACE)
            await tx.abort()
        await client.enqueue("q", "plain", headers={})  # no headers: fine at level 1
        (item,) = await client.dequeue_items("q")
        assert item.value == b"plain" and item.headers == {}


async def test_headers_go_in_on_every_verb_and_come_back_on_every_item(tmp_path: Path):
    async with running_node(tmp_path, at_level_2()) as node, RcqClient(url_of(node)) as client:
        assert (await client.feature_level())["active"] == 2
        await client.enqueue("q", "one", headers=TRACE)
        async with client.transaction() as tx:
            await tx.enqueue("q", "two", headers={"k": "v"})
            await tx.enqueue_batch("q", [b"three", b"four"], headers={"n": "3-4"})
            await tx.enqueue("q", "plain")
        await client.execute([Enqueue("q", ["five"], headers={"k": "5"})])
        tx = await client.receive("q", 10)
        assert tx is not None
        assert [(i.value, i.headers) for i in tx.items] == [
            (b"one", TRACE), (b"two", {"k": "v"}), (b"three", {"n": "3-4"}), (b"four", {"n": "3-4"}),
            (b"plain", {}), (b"five", {"k": "5"})]
        await tx.abort()
        assert await client.peek("q") == b"one"
        async with client.transaction() as tx:
            (head,) = await tx.dequeue_items("q")
            assert head.headers == TRACE  # still there after an abort and a peek
            await tx.abort()


def test_the_sync_client_sends_and_returns_headers(tmp_path: Path):
    async def main() -> None:
        async with running_node(tmp_path, at_level_2()) as node:
            url = url_of(node)

            def produce_and_consume() -> list[dict[str, str]]:
                with SyncClient(url) as sync:
                    sync.enqueue("q", "a", headers=TRACE)
                    with sync.transaction() as tx:
                        tx.enqueue("q", "b", headers={"k": "v"})
                        tx.enqueue_batch("q", ["c"], headers={"k": "c"})
                        tx.enqueue_items("q", (pair for pair in [("d", {"k": "d"}), ("e", None)]))
                    return [item.headers for item in sync.dequeue_items("q", 10)]

            assert await asyncio.to_thread(produce_and_consume) == [TRACE, {"k": "v"}, {"k": "c"}, {"k": "d"}, {}]

    asyncio.run(main())


@pytest.mark.parametrize("headers", [{"": "v"}, {"a\tb": "v"}, {"k": 1}, {1: "v"}, [("k", "v")]],
                         ids=["empty_key", "tab_key", "int_value", "int_key", "list"])
def test_bad_headers_are_refused_before_sending(headers):
    with pytest.raises(InvalidRequest):
        enqueue_body("q", ["a"], headers=headers)


def test_items_travel_as_strings_without_headers_and_as_objects_with_them():
    assert enqueue_body("q", ["a"])["items"] == ["a"]
    assert enqueue_body("q", ["a"], headers={})["items"] == ["a"]
    body = enqueue_body("q", ["a", "b"], headers={"k": "v"})
    assert body["items"] == [{"value": "a", "headers": {"k": "v"}}, {"value": "b", "headers": {"k": "v"}}]
    assert estimated_item_bytes(body) > estimated_item_bytes(enqueue_body("q", ["a", "b"]))


async def test_enqueue_items_gives_each_item_its_own_headers_in_one_request(tmp_path: Path):
    async with running_node(tmp_path, at_level_2()) as node, RcqClient(url_of(node)) as client:
        async with client.transaction() as tx:
            assert await tx.enqueue_items("q", [(b"a", TRACE), ("b", None), ("c", {}), ("d", {"k": "d"})],
                                          ttl_s=60) == 4
        items = await client.dequeue_items("q", 10)
        assert [(i.value, i.headers) for i in items] == [(b"a", TRACE), (b"b", {}), (b"c", {}), (b"d", {"k": "d"})]
        async with client.transaction() as tx:
            with pytest.raises(InvalidRequest):  # checked before anything is sent
                await tx.enqueue_items("q", [("x", {"": "empty key"})])
            await tx.abort()
    async with running_node(tmp_path / "held", feature_level_auto=False) as node, RcqClient(url_of(node)) as client:
        async with client.transaction() as tx:
            assert await tx.enqueue_items("q", [("plain", None)]) == 1  # no headers: fine at level 1
            with pytest.raises(FeatureLevelRequired):
                await tx.enqueue_items("q", [("x", {"k": "v"})])

