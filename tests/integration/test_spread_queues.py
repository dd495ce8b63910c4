"""A queue spread over several partitions on a real 3-node cluster (docs/partitions.md, "Spread
queues"): created with a fragment in each partition, written in each partition's transactions,
read as one (count and stats summed, each fragment under ``by_partition``), purged and deleted as
one; its dead-letter queue spread over the same partitions; one-request enqueues going round the
fragments, or to a partition key's; one consumer draining every fragment, and a long poll finding
an item committed in any fragment while it waits."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from rcq.client import Dequeue, Enqueue, RcqClient, SyncClient
from rcq.errors import CommitOutcomeUnknown, QueueFull
from rcq.local.cluster import LocalCluster
from rcq.names import fragment_for, transaction_partition
from tests.helpers import CLUSTER_WAIT_S, FRAGMENT_PASS_WAIT_S, LEADER_TIMEOUT_S, SPREAD_RECEIVE_WAIT_S
from tests.helpers.cluster import fresh_queue, partitioned_cluster

pytestmark = pytest.mark.cluster

SPREAD = ["p0", "p1", "p2"]


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with partitioned_cluster(3, partitions_max=2) as local:
        yield local


def ask(cluster: LocalCluster, path: str, method: str = "GET", body: dict[str, Any] | None = None,
        node: int | None = None, timeout_s: float = CLUSTER_WAIT_S) -> dict[str, Any]:
    """``method path`` at node ``node``'s own port (default: p0's leader, whose directory is current)."""
    i = cluster.wait_for_leader(LEADER_TIMEOUT_S) if node is None else node
    return cluster.poll_json(cluster.url(i) + path, timeout_s, method=method, body=body)


def enqueue_in(cluster: LocalCluster, partition: str, queue: str, items: list[str]) -> dict[str, Any]:
    """Commit ``items`` into ``queue`` in a transaction of ``partition`` (through node 1's own port)."""
    begun = ask(cluster, "/v1/transactions", "POST", {"partition": partition}, node=1)
    transaction = begun["transaction_id"]
    assert transaction.startswith(f"{partition}.") or partition == "p0", begun
    assert ask(cluster, f"/v1/transactions/{transaction}/enqueue", "POST", {"queue": queue, "items": items},
               node=1)["buffered"] == len(items)
    return ask(cluster, f"/v1/transactions/{transaction}/commit", "POST", {}, node=1)


def test_a_spread_queue_has_a_fragment_in_each_partition_and_reads_as_one(cluster: LocalCluster) -> None:
    queue = fresh_queue("spread")
    created = ask(cluster, f"/v1/queues/{queue}", "PUT", {"partitions": SPREAD, "max_priority": 2})
    assert created["settings"]["partitions"] == SPREAD and created["settings"]["max_priority"] == 2, created
    assert set(created["by_partition"]) == set(SPREAD)
    assert ask(cluster, f"/v1/queues/{queue}/placement")["partitions"] == SPREAD
    for n, partition in enumerate(SPREAD):
        assert enqueue_in(cluster, partition, queue, [f"{partition}-{i}" for i in range(n + 1)])["committed"]
    for node in range(3):  # any node's own port reads the whole queue
        count = ask(cluster, f"/v1/queues/{queue}", node=node)
        assert count["count"] == 6 and count["spread"] and "unanswered" not in count, count
        assert {p: row["count"] for p, row in count["by_partition"].items()} == {"p0": 1, "p1": 2, "p2": 3}
        assert count["settings"]["partitions"] == SPREAD and count["settings"]["max_priority"] == 2
    with SyncClient(cluster.urls, **cluster.client_options()) as client:  # the client reads it as one too
        assert client.count(queue) == 6 and client.queue_info(queue)["by_partition"]["p1"]["count"] == 2
    stats = ask(cluster, f"/v1/queues/{queue}/stats")
    assert stats["count"] == 6 and stats["enqueued_total"] == 6 and stats["by_partition"]["p2"]["enqueued_total"] == 3, stats
    purged = ask(cluster, f"/v1/queues/{queue}/purge", "POST", {})
    assert purged["removed"] == 6 and ask(cluster, f"/v1/queues/{queue}")["count"] == 0, purged


def test_a_spread_queue_is_deleted_in_every_partition_and_may_be_placed_anew(cluster: LocalCluster) -> None:
    queue = fresh_queue("gone")
    ask(cluster, f"/v1/queues/{queue}", "PUT", {"partitions": ["p1", "p2"]})
    enqueue_in(cluster, "p1", queue, ["a"])
    enqueue_in(cluster, "p2", queue, ["b", "c"])
    deleted = ask(cluster, f"/v1/queues/{queue}", "DELETE")
    assert deleted["removed"] == 3 and set(deleted["by_partition"]) == {"p1", "p2"}, deleted
    assert ask(cluster, f"/v1/queues/{queue}/placement")["partitions"] == ["p0"]  # forgotten
    again = ask(cluster, f"/v1/queues/{queue}", "PUT", {"partitions": ["p2"]})
    assert again["settings"]["partitions"] == ["p2"], again


def test_a_spread_queues_dead_letter_queue_is_spread_over_the_same_partitions(cluster: LocalCluster) -> None:
    queue, dead, elsewhere = fresh_queue("src"), fresh_queue("dlq"), fresh_queue("dlq-p1")
    ask(cluster, f"/v1/queues/{dead}", "PUT", {"partitions": ["p1", "p2"]})
    ask(cluster, f"/v1/queues/{elsewhere}", "PUT", {"partitions": ["p1"]})
    refused = ask(cluster, f"/v1/queues/{queue}", "PUT", {"partitions": ["p1", "p2"], "dead_letter_queue": elsewhere})
    assert refused["error"]["code"] == "dead_letter_partition_mismatch", refused
    made = ask(cluster, f"/v1/queues/{queue}", "PUT", {"partitions": ["p1", "p2"], "dead_letter_queue": dead})
    assert made["settings"]["dead_letter_queue"] == dead, made
    assert all(row["settings"]["dead_letter_queue"] == dead for row in made["by_partition"].values())


def test_one_request_enqueues_go_round_the_fragments_and_a_partition_key_keeps_to_one(cluster: LocalCluster) -> None:
    queue = fresh_queue("rr")
    ask(cluster, f"/v1/queues/{queue}", "PUT", {"partitions": SPREAD})
    went = [ask(cluster, f"/v1/queues/{queue}/enqueue", "POST", {"items": [f"v{i}"]})["partition"] for i in range(9)]
    assert sorted(went) == sorted(SPREAD * 3), went  # each fragment in turn
    home = fragment_for("customer-7", SPREAD)
    keyed = {ask(cluster, f"/v1/queues/{queue}/enqueue", "POST",
                 {"items": [f"k{i}"], "partition_key": "customer-7"})["partition"] for i in range(4)}
    assert keyed == {home}
    follower = next(i for i in range(3) if i != cluster.wait_for_leader(LEADER_TIMEOUT_S))
    via = ask(cluster, f"/v1/queues/{queue}/enqueue", "POST", {"items": ["f"], "partition_key": "customer-7"},
              node=follower)  # forwarded to p0's leader, which shares it out
    assert via["partition"] == home, via
    count = ask(cluster, f"/v1/queues/{queue}")
    assert {p: row["count"] for p, row in count["by_partition"].items()} == {
        p: 3 + (5 if p == home else 0) for p in SPREAD}, count
    # the key's items come back from its fragment, in their order
    taken = ask(cluster, f"/v1/queues/{queue}/dequeue", "POST", {"max_items": 10, "partition_key": "customer-7"})
    assert taken["partition"] == home, taken
    assert [i["value"] for i in taken["results"][0]["items"]][-5:] == ["k0", "k1", "k2", "k3", "f"]


def test_one_consumer_drains_every_fragment_and_a_long_poll_finds_an_item_in_any(cluster: LocalCluster) -> None:
    queue = fresh_queue("drain")
    ask(cluster, f"/v1/queues/{queue}", "PUT", {"partitions": SPREAD})
    for n, partition in enumerate(SPREAD):  # uneven fragments: 1, 2 and 3 items
        enqueue_in(cluster, partition, queue, [f"{partition}-{i}" for i in range(n + 1)])
    got: list[str] = []
    for _ in range(10):
        answer = ask(cluster, f"/v1/queues/{queue}/dequeue", "POST", {"max_items": 1})
        got += [item["value"] for item in answer["results"][0]["items"]]
    assert sorted(got) == sorted(f"{p}-{i}" for n, p in enumerate(SPREAD) for i in range(n + 1))
    for verb in ("dequeue", "receive"):  # a wait over the node's limit is refused, as on a plain queue
        refused = ask(cluster, f"/v1/queues/{queue}/{verb}", "POST", {"wait_ms": 10**9})
        assert refused["error"]["code"] == "invalid_request" and "over the limit" in refused["error"]["message"]
    # every fragment empty: a receive waits, and an item committed in p2 meanwhile is found
    answers: list[dict[str, Any]] = []
    waiter = threading.Thread(target=lambda: answers.append(ask(
        cluster, f"/v1/queues/{queue}/receive", "POST", {"wait_ms": int(SPREAD_RECEIVE_WAIT_S * 1000)},
        timeout_s=SPREAD_RECEIVE_WAIT_S + CLUSTER_WAIT_S)))
    waiter.start()
    enqueue_in(cluster, "p2", queue, ["late"])
    waiter.join(SPREAD_RECEIVE_WAIT_S + CLUSTER_WAIT_S)
    assert answers and [i["value"] for i in answers[0]["items"]] == ["late"], answers
    assert answers[0]["partition"] == "p2" and answers[0]["transaction_id"].startswith("p2.")
    assert ask(cluster, f"/v1/transactions/{answers[0]['transaction_id']}/commit", "POST", {})["committed"]


def test_an_execute_over_spread_queues_runs_in_one_partition_and_no_fragment_starves(cluster: LocalCluster) -> None:
    queue, other = fresh_queue("ex"), fresh_queue("ex-to")
    for name in (queue, other):
        ask(cluster, f"/v1/queues/{name}", "PUT", {"partitions": SPREAD})
    went = [ask(cluster, "/v1/execute", "POST", {"operations": [
        {"op": "enqueue", "queue": queue, "items": [f"v{i}"]}]})["partition"] for i in range(6)]
    assert sorted(went) == sorted(SPREAD * 2), went  # keyless writes: each partition in turn
    keyed = [ask(cluster, "/v1/execute", "POST", {"idempotency_key": "ex-key", "operations": [
        {"op": "enqueue", "queue": queue, "items": ["k"]}]}) for _ in range(2)]
    assert {a["partition"] for a in keyed} == {fragment_for("ex-key", SPREAD)} and keyed[1]["duplicate"], keyed
    # a move between two queues spread over the same partitions: one transaction, one partition
    moved = ask(cluster, "/v1/execute", "POST", {"operations": [
        {"op": "dequeue", "queue": queue, "max_items": 1}, {"op": "enqueue", "queue": other, "items": ["m"]}]})
    assert len(moved["results"][0]["items"]) == 1, moved
    assert ask(cluster, f"/v1/queues/{other}")["by_partition"][moved["partition"]]["count"] == 1
    # dequeues alone take from whichever fragment has items: one consumer drains them all
    got: list[str] = []
    for _ in range(12):
        answer = ask(cluster, "/v1/execute", "POST", {"operations": [{"op": "dequeue", "queue": queue, "max_items": 1}]})
        got += [item["value"] for item in answer["results"][0]["items"]]
    assert len(got) == len(set(got)) == 6 and set(got) < {f"v{i}" for i in range(6)} | {"k"}, got  # one was moved
    assert ask(cluster, f"/v1/queues/{queue}")["count"] == 0
    refused = ask(cluster, "/v1/execute", "POST", {"operations": [{"op": "dequeue", "queue": queue, "wait_ms": 10**9}]})
    assert refused["error"]["code"] == "invalid_request", refused
    # every fragment empty: an execute's waiting dequeue finds an item committed in p2 meanwhile
    answers: list[dict[str, Any]] = []
    waiter = threading.Thread(target=lambda: answers.append(ask(
        cluster, "/v1/execute", "POST", {"operations": [
            {"op": "dequeue", "queue": queue, "wait_ms": int(SPREAD_RECEIVE_WAIT_S * 1000)}]},
        timeout_s=SPREAD_RECEIVE_WAIT_S + CLUSTER_WAIT_S)))
    waiter.start()
    enqueue_in(cluster, "p2", queue, ["late"])
    waiter.join(SPREAD_RECEIVE_WAIT_S + CLUSTER_WAIT_S)
    assert answers and [i["value"] for i in answers[0]["results"][0]["items"]] == ["late"], answers
    assert answers[0]["partition"] == "p2", answers


async def test_the_clients_execute_on_spread_queues_runs_in_one_partition_and_finds_items(cluster: LocalCluster) -> None:
    queue, other = fresh_queue("cx"), fresh_queue("cx-to")
    for name in (queue, other):
        ask(cluster, f"/v1/queues/{name}", "PUT", {"partitions": SPREAD})
    async with RcqClient(cluster.urls, **cluster.client_options()) as client:
        went = [transaction_partition((await client.execute([Enqueue(queue, [f"v{i}"])])).transaction_id)
                for i in range(6)]
        assert sorted(went) == sorted(SPREAD * 2), went  # keyless writes: each partition in turn
        keyed = [await client.execute([Enqueue(queue, ["k"])], idempotency_key="cx-key") for _ in range(2)]
        assert {transaction_partition(r.transaction_id) for r in keyed} == {fragment_for("cx-key", SPREAD)}
        assert keyed[1].duplicate, keyed
        moved = await client.execute([Dequeue(queue, 1), Enqueue(other, ["m"])])  # one transaction, one partition
        assert len(moved.results[0].items) == 1, moved
        home = transaction_partition(moved.transaction_id)
        assert (await client.queue_info(other))["by_partition"][home]["count"] == 1
        got: list[bytes] = []
        for _ in range(12):  # dequeues alone find the fragment that has items: one consumer drains them all
            got += (await client.execute([Dequeue(queue, 1)])).results[0].values
        assert len(got) == len(set(got)) == 6 and await client.count(queue) == 0, got
        waiting = asyncio.ensure_future(client.execute([Dequeue(queue, 1, wait_ms=int(SPREAD_RECEIVE_WAIT_S * 1000))]))
        await asyncio.sleep(0)
        await asyncio.to_thread(enqueue_in, cluster, "p2", queue, ["late"])
        late = await asyncio.wait_for(waiting, SPREAD_RECEIVE_WAIT_S + CLUSTER_WAIT_S)
        assert late.results[0].values == [b"late"], late


async def test_the_clients_transactions_take_the_fragments_in_turn_and_a_key_keeps_to_one(
        cluster: LocalCluster) -> None:
    queue = fresh_queue("tx")
    ask(cluster, f"/v1/queues/{queue}", "PUT", {"partitions": SPREAD})
    async with RcqClient(cluster.urls, **cluster.client_options()) as client:
        went = []
        for i in range(6):
            async with client.transaction() as tx:
                await tx.enqueue(queue, f"t{i}")
            went.append(tx.partition)
        assert sorted(went) == sorted(SPREAD * 2), went  # each fragment in turn
        home = fragment_for("order-42", SPREAD)
        for i in range(3):
            async with client.transaction(partition_key="order-42") as tx:
                await tx.enqueue(queue, f"o{i}")
            assert tx.partition == home
        info = await client.queue_info(queue)
        assert {p: row["count"] for p, row in info["by_partition"].items()} == {
            p: 2 + (3 if p == home else 0) for p in SPREAD}, info
        taken = await client.begin(partition_key="order-42")
        values = await taken.dequeue_batch(queue, 10)
        await taken.commit()
        assert [v for v in values if v.startswith(b"o")] == [b"o0", b"o1", b"o2"] and taken.partition == home


async def test_a_transactions_first_dequeue_moves_on_from_empty_fragments(cluster: LocalCluster) -> None:
    queue = fresh_queue("roam")
    ask(cluster, f"/v1/queues/{queue}", "PUT", {"partitions": SPREAD})
    enqueue_in(cluster, "p2", queue, ["only-in-p2"])
    async with RcqClient(cluster.urls, **cluster.client_options()) as client:
        for _ in range(len(SPREAD)):  # whichever fragment its turn starts at
            tx = await client.begin()
            values = await tx.dequeue_batch(queue, 5)
            assert values == [b"only-in-p2"] and tx.partition == "p2", (values, tx.partition)
            await tx.abort()  # back to its fragment's head for the next round
        tx = await client.begin()
        assert await tx.dequeue_batch(queue, 5, wait_ms=200) == [b"only-in-p2"]  # a wait, and one item
        await tx.commit()
        tx = await client.begin()
        assert await tx.dequeue_batch(queue, 5, wait_ms=200) == []  # every fragment empty: waits, then nothing
        await tx.abort()


async def test_the_clients_one_request_verbs_over_its_session_channel_go_round_the_fragments(
        cluster: LocalCluster) -> None:
    queue = fresh_queue("chan")
    ask(cluster, f"/v1/queues/{queue}", "PUT", {"partitions": SPREAD})
    async with RcqClient(cluster.urls, **cluster.client_options()) as client:  # the channel: the default
        for i in range(6):  # a fresh client: it asks for the cluster's partitions itself, once
            await client.enqueue(queue, f"c{i}")
        info = await client.queue_info(queue)
        assert {p: row["count"] for p, row in info["by_partition"].items()} == dict.fromkeys(SPREAD, 2), info
        got = [v for _ in range(6) for v in await client.dequeue(queue)]
        assert sorted(got) == sorted(f"c{i}".encode() for i in range(6)) and await client.dequeue(queue) == []
        enqueue_in(cluster, "p1", queue, ["for-receive"])
        tx = await client.receive(queue, wait_ms=200)
        assert tx is not None and tx.items[0].value == b"for-receive" and tx.partition == "p1"
        await tx.commit()


async def test_a_fresh_clients_first_receive_and_transaction_find_their_fragments(cluster: LocalCluster) -> None:
    queue = fresh_queue("fresh")
    ask(cluster, f"/v1/queues/{queue}", "PUT", {"partitions": SPREAD})
    enqueue_in(cluster, "p2", queue, ["in-p2"])
    async with RcqClient(cluster.urls, **cluster.client_options()) as client:
        tx = await client.receive(queue, wait_ms=200)  # its first verb: no listing asked before
        assert tx is not None and tx.items[0].value == b"in-p2" and tx.partition == "p2"
        await tx.abort()
    async with RcqClient(cluster.urls, **cluster.client_options()) as client:
        went = set()
        for i in range(3):
            async with client.transaction() as t:  # begun before the client knew the partitions
                await t.enqueue(queue, f"f{i}")
            went.add(t.partition)
        assert went == set(SPREAD), went


def test_a_spread_queues_limits_hold_for_the_whole_queue_in_shares(cluster: LocalCluster) -> None:
    queue = fresh_queue("cap")
    made = ask(cluster, f"/v1/queues/{queue}", "PUT", {"partitions": SPREAD, "max_items": 7, "max_bytes": 100_000})
    assert made["settings"]["max_items"] == 7 and made["settings"]["max_bytes"] == 100_000, made
    assert {p: row["share"]["max_items"] for p, row in made["by_partition"].items()} == {"p0": 3, "p1": 2, "p2": 2}
    stats = ask(cluster, f"/v1/queues/{queue}/stats")
    assert stats["settings"]["max_items"] == 7 and stats["by_partition"]["p1"]["share"] == {
        "max_items": 2, "max_bytes": 33_333}, stats
    # plain HTTP without keys: a full fragment gives way to the next; the queue refuses at its limit
    went = [ask(cluster, f"/v1/queues/{queue}/enqueue", "POST", {"items": [f"v{i}"]}) for i in range(8)]
    assert all("partition" in w for w in went[:7]) and went[7]["error"]["code"] == "queue_full", went
    assert ask(cluster, f"/v1/queues/{queue}")["count"] == 7


def test_a_limit_below_one_per_fragment_is_refused_before_anything_is_placed(cluster: LocalCluster) -> None:
    queue = fresh_queue("tiny")
    refused = ask(cluster, f"/v1/queues/{queue}", "PUT", {"partitions": SPREAD, "max_items": 2})
    assert refused["error"]["code"] == "invalid_request" and "below one per fragment" in refused["error"]["message"]
    assert ask(cluster, f"/v1/queues/{queue}/placement")["partitions"] == ["p0"]  # nothing placed: a new queue's p0
    assert ask(cluster, f"/v1/queues/{queue}/stats").get("exists") is not True


async def test_the_clients_enqueue_moves_on_from_a_full_fragment_and_keys_keep_to_theirs(
        cluster: LocalCluster) -> None:
    queue = fresh_queue("room")
    ask(cluster, f"/v1/queues/{queue}", "PUT", {"partitions": SPREAD, "max_items": 3})  # one item per fragment
    async with RcqClient(cluster.urls, retry_timeout_s=1.0, **cluster.client_options()) as client:
        for i in range(3):
            await client.enqueue(queue, f"r{i}")
        info = await client.queue_info(queue)
        assert {p: row["count"] for p, row in info["by_partition"].items()} == dict.fromkeys(SPREAD, 1), info
        with pytest.raises(QueueFull):
            await client.enqueue(queue, "one-too-many")
        assert await client.count(queue) == 3
        await client.purge_queue(queue)
        home = fragment_for("acct-9", SPREAD)
        await client.enqueue(queue, "a0", partition_key="acct-9")
        with pytest.raises(QueueFull):  # its fragment is full: a keyed enqueue does not move
            await client.enqueue(queue, "a1", partition_key="acct-9")
        assert await client.dequeue(queue, partition_key="acct-9") == [b"a0"]
        tx = await client.receive(queue, partition_key="acct-9")
        assert tx is None  # its fragment alone, now empty
        # the caller's idempotency key picks the fragment: a repeat finds the one that remembers it
        first = await client.enqueue(queue, "once", idempotency_key="k-77")
        again = await client.enqueue(queue, "once", idempotency_key="k-77")
        assert again.duplicate and not first.duplicate and await client.count(queue) == 1
        info = await client.queue_info(queue)
        assert info["by_partition"][fragment_for("k-77", SPREAD)]["count"] == 1 and home in SPREAD


async def test_a_spread_dead_letter_queue_is_redriven_in_every_fragment(cluster: LocalCluster) -> None:
    queue, dead = fresh_queue("redrive-src"), fresh_queue("redrive-dlq")
    async with RcqClient(cluster.urls, **cluster.client_options()) as client:
        await client.configure_queue(dead, partitions=["p1", "p2"])
        await client.configure_queue(queue, partitions=["p1", "p2"], dead_letter_queue=dead)
        for partition in ("p1", "p2"):
            async with client.transaction() as tx:  # the client knows the placement it configured
                await tx.enqueue(queue, f"doomed-{partition}")
            enqueue_in(cluster, partition, queue, [f"doomed-{partition}-2"])
        for partition in ("p1", "p2"):
            tx = await client.begin(partition=partition)
            items = await tx.dequeue_items(queue, 10)
            assert len(items) == 2, (partition, items)
            assert await tx.reject(queue, items, "test") == 2
            await tx.commit()
        info = await client.queue_info(dead)
        assert {p: row["count"] for p, row in info["by_partition"].items()} == {"p1": 2, "p2": 2}, info
        moved = await client.redrive(dead)
        assert moved["redriven"] == 4 and moved["by_queue"] == {queue: 4}, moved
        back = await client.queue_info(queue)
        assert {p: row["count"] for p, row in back["by_partition"].items()} == {"p1": 2, "p2": 2}, back
        assert await client.count(dead) == 0


def test_a_read_and_a_take_pass_over_a_fragment_whose_partition_has_no_leader(cluster: LocalCluster) -> None:
    queue = fresh_queue("dark")
    ask(cluster, f"/v1/queues/{queue}", "PUT", {"partitions": SPREAD})
    enqueue_in(cluster, "p1", queue, ["in-p1"])
    enqueue_in(cluster, "p2", queue, ["in-p2"])
    paused = [cluster.pause_partition_process(i, "p2") for i in range(3)]  # p2 has no leader now
    try:
        started = time.monotonic()
        count = ask(cluster, f"/v1/queues/{queue}")
        assert count["unanswered"] == ["p2"] and count["count"] == 1, count  # p0's and p1's fragments
        taken = ask(cluster, f"/v1/queues/{queue}/dequeue", "POST", {"max_items": 5})
        assert taken["partition"] == "p1", taken
        # each waited FRAGMENT_LEADER_WAIT_S (2 s) for p2, not the 30 s a placed queue's verb waits
        assert time.monotonic() - started < 20, time.monotonic() - started
    finally:
        for pid in paused:
            if pid is not None:
                cluster.resume_process(pid)
    cluster.wait_partitions_led(["p2"], CLUSTER_WAIT_S)
    back = ask(cluster, f"/v1/queues/{queue}")
    assert "unanswered" not in back and back["by_partition"]["p2"]["count"] == 1, back


async def test_the_clients_one_request_takes_pass_over_a_fragment_whose_leader_stopped(cluster: LocalCluster) -> None:
    queue = fresh_queue("dark-client")
    ask(cluster, f"/v1/queues/{queue}", "PUT", {"partitions": SPREAD})
    enqueue_in(cluster, "p1", queue, ["in-p1"])
    enqueue_in(cluster, "p2", queue, ["in-p2"])
    async with RcqClient(cluster.urls, **cluster.client_options()) as client:
        assert await client.count(queue) == 2  # the client knows the placement and p2's leader now
        paused = [cluster.pause_partition_process(i, "p2") for i in range(3)]  # p2's leader stops answering
        try:
            for _ in SPREAD:  # a receive from every turn: the one that meets p2 first passes over it
                started = time.monotonic()
                tx = await client.receive(queue, 5)
                assert time.monotonic() - started < FRAGMENT_PASS_WAIT_S, time.monotonic() - started
                assert tx is not None and [item.value for item in tx.items] == [b"in-p1"], tx
                await tx.abort()
            taken: list[bytes] = []
            for _ in range(2):  # a dequeue that met p2's stopped leader cannot know whether it took items there
                started = time.monotonic()
                with contextlib.suppress(CommitOutcomeUnknown):
                    taken.extend(await client.dequeue(queue, 5))
                assert time.monotonic() - started < FRAGMENT_PASS_WAIT_S, time.monotonic() - started
            assert taken in ([], [b"in-p1"]), taken
        finally:
            for pid in paused:
                if pid is not None:
                    cluster.resume_process(pid)
    cluster.wait_partitions_led(["p2"], CLUSTER_WAIT_S)


def test_the_readmes_spread_command_spreads_a_queue(cluster: LocalCluster) -> None:
    queue = fresh_queue("jobs")
    assert cluster.token is not None
    env = {**os.environ, "RCQ_URLS": ",".join(cluster.urls), "RCQ_TOKEN": cluster.token}
    done = subprocess.run([sys.executable, "-m", "rcq", "queue", "configure", queue, "--partitions", "p0,p1,p2"],
                          env=env, capture_output=True, text=True, timeout=CLUSTER_WAIT_S, check=False)
    assert done.returncode == 0, done.stderr
    stats = ask(cluster, f"/v1/queues/{queue}/stats")
    assert stats["spread"] and stats["settings"]["partitions"] == SPREAD, stats
