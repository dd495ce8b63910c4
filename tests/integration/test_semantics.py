"""The queue semantics of docs/design.md §1, against one real 3-node cluster.

Every test here leaves the nodes running, so the module shares one cluster
(small item and open-transaction limits, so the 413 and 429 cases are cheap)
and each test works on queues of its own. Node logs are added to the report of
a failing test by the hook in conftest.py.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any

import aiohttp
import pytest

from rcq.client import (
    Dequeue,
    Enqueue,
    RcqClient,
    TransactionExpired,
)
from rcq.local.cluster import LocalCluster
from rcq.testing import async_wait_until
from tests.helpers import LEADER_TIMEOUT_S, QUIET_CLUSTER_WAIT_S
from tests.helpers.cluster import fresh_queue, running_cluster

pytestmark = pytest.mark.cluster

ITEM_BYTES_MAX = 4096
TRANSACTIONS_OPEN_MAX = 24


@pytest.fixture(scope="module")
def semantics_cluster() -> Iterator[LocalCluster]:
    # Settled (running_cluster): the leader's own entries (feature level, identity) come before the
    # tests, not in the middle of one comparing digests (run alone, the bad-input test caught them).
    with running_cluster(overrides={"item_bytes_max": ITEM_BYTES_MAX,
                                    "transactions_open_max": TRANSACTIONS_OPEN_MAX}) as cluster:
        yield cluster


@pytest.fixture
async def cluster(semantics_cluster: LocalCluster) -> LocalCluster:
    """The module's cluster with a serving leader (found off the event loop: the wait blocks)."""
    await asyncio.to_thread(semantics_cluster.wait_for_leader, LEADER_TIMEOUT_S)
    return semantics_cluster


@pytest.fixture
async def client(cluster: LocalCluster) -> AsyncIterator[RcqClient]:
    async with RcqClient(cluster.urls, request_timeout_s=15.0, retry_timeout_s=QUIET_CLUSTER_WAIT_S,
                         **cluster.client_options()) as rcq_client:
        yield rcq_client


@pytest.fixture
async def http(cluster: LocalCluster) -> AsyncIterator[aiohttp.ClientSession]:
    """Raw HTTP, with the cluster's admin token on every request."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=15),
                                     headers=cluster.auth_headers()) as session:
        yield session


async def count_on(http: aiohttp.ClientSession, url: str, queue: str) -> int:
    async with http.get(f"{url}/v1/queues/{queue}", allow_redirects=False) as response:
        assert response.status == 200, await response.text()
        return int((await response.json())["count"])


async def fill(client: RcqClient, queue: str, values: list[str]) -> None:
    """Enqueue each value in its own commit, so they leave in this order (best effort, one client)."""
    for value in values:
        await client.enqueue(queue, value)


async def drain(client: RcqClient, queue: str) -> list[bytes]:
    """Dequeue and commit everything in ``queue``."""
    async with client.transaction() as tx:
        return await tx.dequeue_batch(queue, 10_000)


# --------------------------------------------------------------- enqueue, commit
async def test_two_enqueues_in_one_transaction_both_come_out_after_commit(client: RcqClient) -> None:
    queue = fresh_queue()
    async with client.transaction() as tx:
        await tx.enqueue(queue, "a")
        await tx.enqueue(queue, "b")
    assert await client.count(queue) == 2
    assert set(await drain(client, queue)) == {b"a", b"b"}


async def test_two_parallel_producers_each_enqueuing_two_items_deliver_all_four(client: RcqClient) -> None:
    queue = fresh_queue()
    both_open = asyncio.Barrier(2)

    async def produce(name: str) -> None:
        async with client.transaction() as tx:
            await tx.enqueue(queue, f"{name}-1")
            await both_open.wait()  # the two transactions overlap
            await tx.enqueue(queue, f"{name}-2")

    await asyncio.gather(produce("x"), produce("y"))
    assert sorted(await drain(client, queue)) == [b"x-1", b"x-2", b"y-1", b"y-2"]


async def test_parallel_dequeuers_never_receive_the_same_item_and_together_take_each_once(
        client: RcqClient) -> None:
    queue = fresh_queue()
    values = [f"item-{i:03d}" for i in range(200)]
    await client.execute([Enqueue(queue, values)])
    all_open = asyncio.Barrier(8)

    async def dequeuer(step: int) -> list[bytes]:
        taken: list[bytes] = []
        async with client.transaction(timeout_s=60) as tx:
            await all_open.wait()  # eight transactions hold locks at the same time
            while batch := await tx.dequeue_batch(queue, step):
                taken.extend(batch)
        return taken

    results = await asyncio.gather(*(dequeuer(1 + i % 3) for i in range(8)))
    received = [value for taken in results for value in taken]
    assert len(received) == len(set(received)), "an item was handed to two transactions"
    assert sorted(received) == sorted(v.encode() for v in values)
    assert sum(1 for taken in results if taken) > 1, "one dequeuer took everything: no concurrency was tested"
    assert await client.count(queue) == 0


# ------------------------------------------------------------- abort, isolation
async def test_dequeue_dequeue_abort_puts_both_items_back_at_the_head(client: RcqClient) -> None:
    queue = fresh_queue()
    await fill(client, queue, ["a", "b", "c", "d"])
    tx = await client.begin()
    first = [await tx.dequeue(queue), await tx.dequeue(queue)]
    assert None not in first
    assert await tx.abort() == 2
    async with client.transaction() as again:
        assert sorted(await again.dequeue_batch(queue, 2)) == sorted(first)  # type: ignore[type-var]
    assert await client.count(queue) == 2


async def test_an_enqueue_is_invisible_to_its_own_transaction_and_to_others_until_commit(
        client: RcqClient, cluster: LocalCluster, http: aiohttp.ClientSession) -> None:
    queue = fresh_queue()
    writer = await client.begin()
    await writer.enqueue(queue, "hidden")
    assert await writer.dequeue(queue) is None  # does not read its own writes
    async with client.transaction() as other:
        assert await other.dequeue(queue) is None
    assert await client.peek(queue) is None
    for url in cluster.urls:
        assert await count_on(http, url, queue) == 0
    await writer.commit()
    assert await client.peek(queue) == b"hidden"


async def test_peek_does_not_consume(client: RcqClient) -> None:
    queue = fresh_queue()
    await fill(client, queue, ["first", "second"])
    assert await client.peek(queue) == b"first"
    assert await client.count(queue) == 2
    assert (await client.queue_info(queue))["locked"] == 0
    async with client.transaction() as tx:
        assert await tx.dequeue(queue) == b"first"


async def test_a_move_between_queues_is_one_atomic_commit_and_an_aborted_move_changes_nothing(
        client: RcqClient) -> None:
    source, target = fresh_queue("a"), fresh_queue("b")
    await fill(client, source, ["parcel"])

    aborted = await client.begin()
    parcel = await aborted.dequeue(source)
    assert parcel == b"parcel"
    await aborted.enqueue(target, parcel)
    await aborted.abort()
    assert (await client.count(source), await client.count(target)) == (1, 0)
    assert await client.peek(source) == b"parcel"

    async with client.transaction() as tx:
        moved = await tx.dequeue(source)
        assert moved is not None
        await tx.enqueue(target, moved)
    assert (await client.count(source), await client.count(target)) == (0, 1)
    assert await drain(client, target) == [b"parcel"]


async def test_an_expired_transaction_returns_its_items_to_the_head(client: RcqClient) -> None:
    queue = fresh_queue()
    await fill(client, queue, ["a", "b", "c"])
    tx = await client.begin(timeout_s=1)
    assert await tx.dequeue(queue) == b"a"

    async def expired() -> bool:
        return (await tx.status())["state"] == "aborted"

    await async_wait_until(expired, QUIET_CLUSTER_WAIT_S, what="the transaction to expire")
    assert (await tx.status())["reason"] == "transaction_expired"
    with pytest.raises(TransactionExpired):
        await tx.commit()
    async with client.transaction() as again:
        assert await again.dequeue(queue) == b"a"
    assert await client.count(queue) == 2


# ------------------------------------------------------------------------ count
async def test_count_converges_on_the_leader_and_every_follower(
        client: RcqClient, cluster: LocalCluster, http: aiohttp.ClientSession) -> None:
    queue = fresh_queue()

    async def counts_are(expected: int) -> bool:
        counts = await asyncio.gather(*(count_on(http, url, queue) for url in cluster.urls))
        return all(c == expected for c in counts)

    await client.execute([Enqueue(queue, [f"v{i}" for i in range(30)])])
    await async_wait_until(lambda: counts_are(30), QUIET_CLUSTER_WAIT_S, what="count 30 on every node")
    taken = await client.dequeue(queue, max_items=12)
    assert len(taken) == 12
    await async_wait_until(lambda: counts_are(18), QUIET_CLUSTER_WAIT_S, what="count 18 on every node")


# --------------------------------------------------- one-request transactions
async def test_execute_is_one_transaction_and_a_replayed_idempotency_key_applies_once(client: RcqClient) -> None:
    source, target = fresh_queue("src"), fresh_queue("dst")
    await fill(client, source, ["one", "two"])
    key = uuid.uuid4().hex
    first = await client.execute([Dequeue(source, 1), Enqueue(target, ["moved"])], idempotency_key=key)
    assert not first.duplicate
    assert (first.enqueued, first.dequeued) == (1, 1)
    assert first.results[0].values == [b"one"]

    replay = await client.execute([Dequeue(source, 1), Enqueue(target, ["moved"])], idempotency_key=key)
    assert replay.duplicate and replay.index == first.index
    assert replay.results[0].values == []  # a duplicate hands out no items: they went back
    assert (await client.count(source), await client.count(target)) == (1, 1)

    again = await client.enqueue(target, "x", idempotency_key=key + "-enqueue")
    assert not again.duplicate
    assert (await client.enqueue(target, "x", idempotency_key=key + "-enqueue")).duplicate
    assert sorted(await drain(client, target)) == [b"moved", b"x"]
    assert await drain(client, source) == [b"two"]


async def test_a_replayed_key_into_a_queue_now_full_answers_duplicate_not_queue_full(client: RcqClient) -> None:
    # The first attempt committed (its answer, say, was lost); the queue is full now, with its item.
    # The repeat must say what happened, a duplicate, not queue_full: the caller would think it never ran.
    queue = fresh_queue("full-replay")
    await client.configure_queue(queue, max_items=1)
    first = await client.enqueue(queue, "x", idempotency_key=queue + "-k")
    again = await client.enqueue(queue, "x", idempotency_key=queue + "-k")
    assert again.duplicate and again.index == first.index and await client.count(queue) == 1


async def test_commit_many_commits_together_and_a_replayed_idempotency_key_applies_once(client: RcqClient) -> None:
    queue = fresh_queue()
    key = uuid.uuid4().hex
    first, second = await client.begin(), await client.begin()
    await first.enqueue(queue, "from-first")
    await second.enqueue(queue, "from-second")
    info = await client.commit_many([first, second], idempotency_key=key)
    assert not info.duplicate and info.enqueued == 2
    assert (first.state, second.state) == ("committed", "committed")

    # The same key on new transactions: answered as a duplicate, their enqueues vanish.
    third, fourth = await client.begin(), await client.begin()
    await third.enqueue(queue, "from-third")
    await fourth.enqueue(queue, "from-fourth")
    replay = await client.commit_many([third, fourth], idempotency_key=key)
    assert replay.duplicate and replay.index == info.index
    assert await client.count(queue) == 2
    assert sorted(await drain(client, queue)) == [b"from-first", b"from-second"]


# -------------------------------------------------------------------- bad input
async def call(http: aiohttp.ClientSession, method: str, url: str, *, body: Any = None,
               raw: bytes | None = None, redirect: bool = False) -> tuple[int, dict[str, Any], Mapping[str, str]]:
    """One request, redirects not followed; ``redirect``: ask a follower for its 307 instead of
    having it forward the request to the leader."""
    headers = {"Rcq-Redirect": "1"} if redirect else {}
    kwargs: dict[str, Any] = {"allow_redirects": False, "headers": headers}
    if raw is not None:
        kwargs["data"] = raw
        headers["Content-Type"] = "application/json"
    elif body is not None:
        kwargs["json"] = body
    async with http.request(method, url, **kwargs) as response:
        return response.status, await response.json(), response.headers.copy()


async def expect_error(http: aiohttp.ClientSession, method: str, url: str, status: int, code: str, *,
                       body: Any = None, raw: bytes | None = None) -> dict[str, Any]:
    got_status, got_body, _ = await call(http, method, url, body=body, raw=raw)
    assert (got_status, got_body.get("error", {}).get("code")) == (status, code), \
        f"{method} {url} {body!r}{raw!r}: {got_status} {got_body}"
    return dict(got_body["error"])


def digests(cluster: LocalCluster) -> dict[int, tuple[str, int]]:
    """Every node's (digest, applied index), once all of them applied the leader's commit index."""
    cluster.wait_for_applied(QUIET_CLUSTER_WAIT_S)
    return {i: (d["digest"], d["applied_index"]) for i in range(len(cluster.nodes))
            for d in [cluster.digest(i, timeout_s=5)]}


async def test_bad_input_gets_its_status_code_and_changes_nothing_on_any_node(
        client: RcqClient, cluster: LocalCluster, http: aiohttp.ClientSession) -> None:
    queue = fresh_queue()
    await fill(client, queue, ["a", "b", "c"])
    leader = await asyncio.to_thread(cluster.wait_for_leader, LEADER_TIMEOUT_S)
    base = cluster.url(leader)
    follower = cluster.url((leader + 1) % 3)

    # An open transaction that holds an item, to aim bad requests at.
    status, opened, _ = await call(http, "POST", f"{base}/v1/transactions", body={"timeout_s": 60})
    assert status == 201
    tid = opened["transaction_id"]
    tx_url = f"{base}/v1/transactions/{tid}"
    status, _, _ = await call(http, "POST", f"{tx_url}/dequeue", body={"queue": queue})
    assert status == 200
    # Taken after the dequeue: its read fence commits an entry of its own (docs/raft-hazards.md, H22).
    before = await asyncio.to_thread(digests, cluster)
    assert len(set(before.values())) == 1, before

    # 400 malformed body
    for raw in (b"{not json", b"[]", b'"text"'):
        await expect_error(http, "POST", f"{tx_url}/enqueue", 400, "invalid_request", raw=raw)
    for body in ({"queue": queue}, {"queue": queue, "items": "a"}, {"queue": queue, "items": []},
                 {"queue": queue, "items": ["a"], "surprise": 1},
                 {"queue": queue, "items": ["%%%"], "encoding": "base64"},
                 {"queue": queue, "items": ["a"], "encoding": "latin-1"}):
        await expect_error(http, "POST", f"{tx_url}/enqueue", 400, "invalid_request", body=body)
    await expect_error(http, "POST", f"{base}/v1/execute", 400, "invalid_request", body={"operations": "x"})
    await expect_error(http, "POST", f"{base}/v1/execute", 400, "invalid_request",
                       body={"operations": [{"op": "drop", "queue": queue}]})
    await expect_error(http, "POST", f"{base}/v1/queues/{queue}/enqueue", 400, "invalid_request", raw=b"\xff\xfe")
    await expect_error(http, "POST", f"{tx_url}/dequeue", 400, "invalid_request", body={"queue": queue, "max_items": 0})

    # 400 bad queue names, in a body and in a path
    for name in ("has space", "a" * 129, "", "..", "slash/inside", "ünïcode"):
        await expect_error(http, "POST", f"{tx_url}/enqueue", 400, "invalid_queue_name",
                           body={"queue": name, "items": ["x"]})
    for segment in ("bad!name", "a" * 129, "sp ace"):
        await expect_error(http, "POST", f"{base}/v1/queues/{segment}/enqueue", 400, "invalid_queue_name",
                           body={"items": ["x"]})

    # 404 unknown transaction (an id of the current term that was never handed out)
    term = int((await client.cluster(base))["term"])
    unknown = f"{base}/v1/transactions/{term:x}.{uuid.uuid4().hex[:24]}"
    for verb, body in (("enqueue", {"queue": queue, "items": ["x"]}), ("dequeue", {"queue": queue}),
                       ("commit", {}), ("abort", None)):
        await expect_error(http, "POST", f"{unknown}/{verb}", 404, "transaction_not_found", body=body)
    await expect_error(http, "GET", unknown, 404, "transaction_not_found")

    # 413 an item over item_bytes_max, in a transaction and in one-request transactions
    too_big = "x" * (ITEM_BYTES_MAX + 1)
    await expect_error(http, "POST", f"{tx_url}/enqueue", 413, "payload_too_large",
                       body={"queue": queue, "items": ["fine", too_big]})
    await expect_error(http, "POST", f"{base}/v1/queues/{queue}/enqueue", 413, "payload_too_large",
                       body={"items": [too_big]})
    await expect_error(http, "POST", f"{base}/v1/execute", 413, "payload_too_large",
                       body={"operations": [{"op": "dequeue", "queue": queue},
                                            {"op": "enqueue", "queue": queue, "items": [too_big]}]})
    status, described, _ = await call(http, "GET", tx_url)
    assert (status, described["state"], described["enqueued"], described["dequeued"]) == (200, "open", 0, 1), \
        "a refused enqueue buffered something"

    # 409 closed transactions: aborted (its item goes back), committed with nothing to do
    status, aborted, _ = await call(http, "POST", f"{tx_url}/abort")
    assert (status, aborted["returned"]) == (200, 1)
    for verb, body in (("enqueue", {"queue": queue, "items": ["x"]}), ("dequeue", {"queue": queue}),
                       ("commit", {})):
        await expect_error(http, "POST", f"{tx_url}/{verb}", 409, "transaction_aborted", body=body)
    status, empty, _ = await call(http, "POST", f"{base}/v1/transactions", body={})
    empty_url = f"{base}/v1/transactions/{empty['transaction_id']}"
    status, _, _ = await call(http, "POST", f"{empty_url}/commit", body={})
    assert status == 200
    await expect_error(http, "POST", f"{empty_url}/enqueue", 409, "transaction_committed",
                       body={"queue": queue, "items": ["x"]})

    # 429 too many open transactions: back-pressure with Retry-After, not a crash
    opened_ids: list[str] = []
    try:
        for _ in range(TRANSACTIONS_OPEN_MAX + 1):
            status, answer, headers = await call(http, "POST", f"{base}/v1/transactions", body={"timeout_s": 60})
            if status != 201:
                break
            opened_ids.append(answer["transaction_id"])
        assert (status, answer["error"]["code"], answer["error"]["retryable"]) == (429, "too_many_transactions", True)
        assert headers.get("Retry-After")
        assert 0 < len(opened_ids) <= TRANSACTIONS_OPEN_MAX
    finally:
        for opened_id in opened_ids:
            await call(http, "POST", f"{base}/v1/transactions/{opened_id}/abort")
    status, _, _ = await call(http, "POST", f"{base}/v1/transactions", body={"timeout_s": 1})
    assert status == 201, "aborting released the open-transaction slots"

    # 307 from a follower asked for one (Rcq-Redirect): not executed there, sent to the leader
    for path, body in (("/v1/transactions", {}), (f"/v1/queues/{queue}/enqueue", {"items": ["x"]}),
                       ("/v1/execute", {"operations": [{"op": "dequeue", "queue": queue}]})):
        status, answer, headers = await call(http, "POST", follower + path, body=body, redirect=True)
        assert (status, answer["error"]["code"], answer["error"]["leader_url"]) == (307, "not_leader", base)
        assert headers["Location"] == base + path

    after = await asyncio.to_thread(digests, cluster)
    assert after == before, "a refused request changed the replicated state"
    assert sorted(await drain(client, queue)) == [b"a", b"b", b"c"]
