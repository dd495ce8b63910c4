"""RcqClient against real in-process nodes (the HTTP app over InMemoryReplicator).

Two-node tests share one state machine between two nodes (``SharedLog``): whichever
replicator leads applies to it, the other is a follower whose leader is the first, so
307s, failover and stale transactions are real server answers.

Tests that count or lose HTTP requests with the wire recorder make their client with
``channel=False``: otherwise the hot verbs leave as frames of the session channel, which
``tests/unit/test_client_channel.py`` tests.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from rcq.client import (
    CommitOutcomeUnknown,
    Dequeue,
    Enqueue,
    InvalidQueueName,
    InvalidRequest,
    LeaderChanged,
    NoLeader,
    PayloadTooLarge,
    RcqClient,
    TransactionAborted,
    TransactionCommitted,
    TransactionExpired,
    TransactionNotFound,
    Unavailable,
    encode_items,
    hooks,
)
from rcq.client.coalescer import COALESCE_PARTS_MAX
from rcq.server.core.state_machine import QueueStateMachine
from rcq.server.node import Node
from rcq.testing import InMemoryReplicator, async_wait_until
from tests.helpers import EXPIRING_WAIT_S, LOCAL_WAIT_S, NODE_SERVING_TIMEOUT_S
from tests.helpers.nodes import make_config, running_node, url_of

UNKNOWN_TRANSACTION_ID = "1." + "0" * 24


# ------------------------------------------------------------------ helpers
class SharedLog:
    """One log and state machine for several in-process nodes; one replicator leads at a time."""

    def __init__(self) -> None:
        self.state_machine = QueueStateMachine()
        self.index = 0
        self.leader_address: str | None = None
        self.members: list[ClusterReplicator] = []


class ClusterReplicator(InMemoryReplicator):
    def __init__(self, log: SharedLog, raft_address: str) -> None:
        super().__init__(log.state_machine, leader=False)
        self.log = log
        self.raft_address = raft_address
        log.members.append(self)

    def leader_raft_address(self) -> str | None:
        return self.log.leader_address

    def apply_raw(self, raw: Any) -> Any:
        self._index = self.log.index
        result = super().apply_raw(raw)
        self.log.index = self._index
        return result

    def lead(self, term: int) -> None:
        for member in self.log.members:
            if member is not self and member.is_leader():
                member.depose()
        self.log.leader_address = self.raft_address
        self.elect(term)

    def step_down(self) -> None:
        self.log.leader_address = None
        self.depose()


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[Node]:
    async with running_node(tmp_path) as node:
        yield node


@pytest.fixture
async def client(node: Node) -> AsyncIterator[RcqClient]:
    async with RcqClient(url_of(node), retry_timeout_s=2) as client:
        yield client


@pytest.fixture
async def pair(tmp_path: Path) -> AsyncIterator[tuple[Node, Node]]:
    """Node a leads; node b is a follower that knows a's URL."""
    log = SharedLog()
    a_replicator = ClusterReplicator(log, "127.0.0.1:10001")
    b_replicator = ClusterReplicator(log, "127.0.0.1:10002")
    a = Node(make_config(tmp_path / "a", "a", a_replicator.raft_address), replicator=a_replicator)
    await a.start()
    peers = [{"node_id": "a", "raft_address": a_replicator.raft_address, "http_url": url_of(a)}]
    b = Node(make_config(tmp_path / "b", "b", b_replicator.raft_address, peers), replicator=b_replicator)
    await b.start()
    try:
        a_replicator.lead(term=1)
        await async_wait_until(lambda: a.manager.serving, NODE_SERVING_TIMEOUT_S, what="a serving")
        yield a, b
    finally:
        await b.stop()
        await a.stop()


# --------------------------------------------------------------- transactions
async def test_transaction_context_commits_on_clean_exit(client: RcqClient):
    async with client.transaction(label="job") as tx:
        assert tx.label == "job"
        assert await tx.enqueue("q", b"a") == 1
        assert await tx.enqueue_batch("q", [b"b", "c"]) == 3
        assert await client.count("q") == 0  # invisible until commit
    assert tx.state == "committed"
    assert tx.commit_info is not None and tx.commit_info.enqueued == 3
    assert await client.dequeue("q", max_items=10) == [b"a", b"b", b"c"]


async def test_transaction_context_aborts_on_exception_and_returns_items(client: RcqClient):
    await client.enqueue("q", b"first", b"second")
    with pytest.raises(ValueError, match="boom"):
        async with client.transaction() as tx:
            assert await tx.dequeue("q") == b"first"
            await tx.enqueue("other", b"never")
            raise ValueError("boom")
    assert tx.state == "aborted"
    assert await client.dequeue("q", max_items=10) == [b"first", b"second"]
    assert await client.count("other") == 0


async def test_an_abort_failure_does_not_mask_the_original_exception(client: RcqClient):
    with pytest.raises(ValueError, match="original"):
        async with client.attach(UNKNOWN_TRANSACTION_ID):  # its abort answers 404
            raise ValueError("original")


async def test_explicit_begin_commit_and_status(client: RcqClient):
    tx = await client.begin(timeout_s=20, label="explicit")
    await tx.enqueue("q", "x")
    status = await tx.status()
    assert status["state"] == "open" and status["label"] == "explicit" and status["enqueued"] == 1
    extended = await tx.extend(120)
    assert extended["expires_in_s"] > 60
    info = await tx.commit()
    assert (info.enqueued, info.duplicate, info.transaction_ids) == (1, False, (tx.transaction_id,))
    assert (await client.transaction_status(tx.transaction_id))["state"] == "committed"


async def test_open_transactions_are_listed_by_label_prefix(client: RcqClient):
    job = await client.begin(label="job-1")
    other = await client.begin(label="other")
    listed = await client.transactions(label_prefix="job-")
    assert [t["transaction_id"] for t in listed] == [job.transaction_id]
    assert len(await client.transactions()) == 2
    await other.abort()
    await job.abort()


async def test_a_repeated_dequeue_key_returns_the_same_items(client: RcqClient):
    await client.enqueue("q", b"1", b"2")
    async with client.transaction() as tx:
        first = await tx.dequeue_items("q", key="k")
        again = await tx.dequeue_items("q", key="k")
        assert first == again and first[0].value == b"1"
        assert await tx.dequeue("q") == b"2"  # a fresh key each call: the next item
    assert await client.count("q") == 0


async def test_a_waiting_dequeue_outlives_the_request_timeout_and_gets_a_later_item(node: Node):
    async with RcqClient(url_of(node), request_timeout_s=0.2) as client, client.transaction() as tx:
        waiting = asyncio.create_task(tx.dequeue("q", wait_ms=10_000))
        started_s = time.monotonic()
        await async_wait_until(lambda: dequeue_waiters(node, "q") == 1, LOCAL_WAIT_S, what="dequeue waiting on the server")
        # the point is elapsed time: the item arrives after the plain request timeout
        await async_wait_until(lambda: time.monotonic() - started_s > 0.3, LOCAL_WAIT_S, what="past the request timeout")
        assert not waiting.done()
        await client.enqueue("q", b"late")
        assert await waiting == b"late"


def dequeue_waiters(node: Node, queue: str) -> int:
    """White box: dequeues waiting in the leader's view of ``queue``."""
    view = node.manager._leader.views.get(queue)
    return len(view._waiters) if view is not None else 0


async def test_commit_many_commits_transactions_as_one_unit(client: RcqClient):
    first, second = await client.begin(), await client.begin()
    await first.enqueue("q", b"from-first")
    await second.enqueue("q", b"from-second")
    info = await client.commit_many([first, second.transaction_id])
    assert set(info.transaction_ids) == {first.transaction_id, second.transaction_id}
    assert first.state == "committed"
    assert sorted(await client.dequeue("q", max_items=10)) == [b"from-first", b"from-second"]


# ---------------------------------------------------------------- queue reads
async def test_peek_does_not_consume(client: RcqClient):
    await client.enqueue("q", b"head", b"tail")
    assert await client.peek("q") == b"head"
    assert await client.peek("q") == b"head"
    assert await client.count("q") == 2
    info = await client.queue_info("q")
    assert (info["count"], info["locked"], info["available"]) == (2, 0, 2)


async def test_dequeue_returns_none_or_nothing_when_the_queue_is_empty(client: RcqClient):
    assert await client.peek("empty") is None
    assert await client.dequeue("empty") == []
    async with client.transaction() as tx:
        assert await tx.dequeue("empty") is None
        assert await tx.dequeue_batch("empty", 5) == []


async def test_queues_and_stats(client: RcqClient):
    await client.enqueue("a", b"1", b"22")
    await client.enqueue("b", b"3")
    assert [(q["queue"], q["count"]) for q in await client.queues()] == [("a", 2), ("b", 1)]
    stats = await client.stats("a")
    assert (stats["count"], stats["bytes"], stats["enqueued_total"]) == (2, 3, 2)


async def test_dot_segments_are_refused_as_queue_names(client: RcqClient):
    for name in (".", ".."):
        with pytest.raises(InvalidQueueName):
            await client.enqueue(name, b"dots")
        with pytest.raises(InvalidQueueName):
            await client.count(name)
    assert await client.queues() == []


# --------------------------------------------------------------------- bytes
async def test_every_byte_value_round_trips(client: RcqClient):
    items = [bytes([b]) for b in range(256)] + [bytes(range(256)), b""]
    async with client.transaction() as tx:
        await tx.enqueue_batch("bin", items)
    async with client.transaction() as tx:
        assert await tx.dequeue_batch("bin", 1000) == items
    await client.enqueue("bin", *items)
    assert await client.dequeue("bin", max_items=1000) == items


async def test_invalid_utf8_goes_as_base64_and_round_trips(client: RcqClient):
    invalid = [b"\xc3\x28", b"\xed\xa0\x80", b"\xff\xfe", b"ok\x80"]
    assert encode_items([b"plain", "t\u00e9xt"]) == (["plain", "t\u00e9xt"], "utf-8")
    assert encode_items([b"plain", b"\xff"])[1] == "base64"
    await client.enqueue("q", "t\u00e9xt \u2713", *invalid)
    assert await client.dequeue("q", max_items=10) == ["t\u00e9xt \u2713".encode(), *invalid]


async def test_text_that_is_not_unicode_is_refused_before_sending(client: RcqClient):
    with pytest.raises(InvalidRequest):
        await client.enqueue("q", "lone \ud800 surrogate")
    assert await client.count("q") == 0


# ----------------------------------------------------------------- typed errors
async def test_an_unknown_transaction_raises_transaction_not_found(client: RcqClient):
    with pytest.raises(TransactionNotFound):
        await client.transaction_status(UNKNOWN_TRANSACTION_ID)
    with pytest.raises(TransactionNotFound):
        await client.attach(UNKNOWN_TRANSACTION_ID).enqueue("q", b"x")


async def test_closed_transactions_raise_the_matching_409(client: RcqClient):
    aborted = await client.begin()
    await aborted.abort()
    with pytest.raises(TransactionAborted) as raised:
        await client.attach(aborted.transaction_id).enqueue("q", b"x")
    assert type(raised.value) is TransactionAborted and raised.value.http_status == 409
    with pytest.raises(TransactionAborted):
        await client.attach(aborted.transaction_id).commit()

    committed = await client.begin()
    await committed.commit()
    with pytest.raises(TransactionCommitted):
        await committed.extend(10)

    expiring = await client.begin(timeout_s=0.1)
    await async_wait_until(lambda: expired(client, expiring.transaction_id), LOCAL_WAIT_S, what="expired")
    with pytest.raises(TransactionExpired):
        await expiring.dequeue("q")
    assert await expiring.abort() == 0  # aborting an expired transaction is not an error


async def expired(client: RcqClient, transaction_id: str) -> bool:
    return (await client.transaction_status(transaction_id)).get("reason") == "transaction_expired"


async def test_bad_queue_names_and_requests_raise_invalid_request(client: RcqClient):
    async with client.transaction() as tx:
        with pytest.raises(InvalidQueueName) as raised:
            await tx.enqueue("no spaces", b"x")
        assert raised.value.http_status == 400
        with pytest.raises(InvalidRequest, match="max_items") as raised:  # checked by the server
            await tx.dequeue_batch("q", 0)
        assert raised.value.code == "invalid_request"
    for call in (client.count("a/b"), client.enqueue("", b"x"), client.peek("x" * 129)):
        with pytest.raises(InvalidQueueName):
            await call


async def test_an_oversized_item_raises_payload_too_large(tmp_path: Path):
    async with running_node(tmp_path, item_bytes_max=1024) as node, RcqClient(url_of(node)) as client:
        with pytest.raises(PayloadTooLarge) as raised:
            await client.enqueue("q", b"x" * 1025)
        assert raised.value.http_status == 413
        await client.enqueue("q", b"x" * 1024)
        assert await client.count("q") == 1


# --------------------------------------------------------- retries and outcomes
async def test_a_commit_whose_answer_was_lost_is_retried_and_applied_once(node: Node, wire):
    recorder, session = wire
    recorder.lose["/commit"] = 1
    async with RcqClient(url_of(node), session=session, channel=False) as client:
        await client.enqueue("q", b"seed")
        tx = await client.begin()
        await tx.enqueue("q", b"once")
        assert await tx.dequeue("q") == b"seed"
        info = await tx.commit()
        assert info.duplicate is True
        assert recorder.count("/commit") == 2
        assert await client.dequeue("q", max_items=10) == [b"once"]


async def test_a_one_request_enqueue_whose_answer_was_lost_is_applied_once(node: Node, wire):
    recorder, session = wire
    recorder.lose["/enqueue"] = 1
    async with RcqClient(url_of(node), session=session, channel=False) as client:
        info = await client.enqueue("q", b"only-once")
        assert info.duplicate is True and recorder.count("/enqueue") == 2
        assert await client.count("q") == 1


async def test_commit_many_whose_answer_was_lost_reports_a_duplicate(node: Node, wire):
    recorder, session = wire
    recorder.lose["/v1/commit"] = 1
    async with RcqClient(url_of(node), session=session, channel=False) as client:
        first, second = await client.begin(), await client.begin()
        await first.enqueue("q", b"1")
        await second.enqueue("q", b"2")
        info = await client.commit_many([first, second])
        assert info.duplicate is True and recorder.count("/v1/commit") == 2
        assert await client.count("q") == 2


async def test_an_enqueue_into_a_transaction_resent_after_a_lost_answer_is_buffered_once(node: Node, wire):
    recorder, session = wire
    recorder.lose["/enqueue"] = 1
    async with RcqClient(url_of(node), session=session, channel=False) as client:
        tx = await client.begin()
        assert await tx.enqueue("q", b"x") == 1
        assert recorder.count("/enqueue") == 2
        assert (await tx.status())["enqueued"] == 1  # the key made the resend a no-op
        await tx.abort()


async def test_a_transactional_dequeue_whose_answer_was_lost_gets_the_same_items(node: Node, wire):
    recorder, session = wire
    async with RcqClient(url_of(node), session=session, channel=False) as client:
        await client.enqueue("q", b"1", b"2")
        recorder.lose["/dequeue"] = 1
        async with client.transaction() as tx:
            assert await tx.dequeue("q") == b"1"
            assert recorder.count("/dequeue") == 2
            assert (await tx.status())["dequeued"] == 1
        assert await client.dequeue("q", max_items=10) == [b"2"]


async def test_a_commit_that_stays_unknown_raises_commit_outcome_unknown(tmp_path: Path):
    replicator = InMemoryReplicator()
    async with (running_node(tmp_path, replicator, commit_timeout_s=0.2) as node,
                RcqClient(url_of(node), retry_timeout_s=1.0) as client):
        tx = await client.begin()
        await tx.enqueue("q", b"x")
        replicator.hold_submits = True
        with pytest.raises(CommitOutcomeUnknown) as raised:
            await tx.commit()
        assert raised.value.maybe_committed and tx.state == "unknown"


async def test_server_answers_a_retried_unknown_commit_with_unknown_not_404(tmp_path: Path):
    replicator = InMemoryReplicator()
    async with running_node(tmp_path, replicator, commit_timeout_s=0.1) as node, aiohttp.ClientSession() as http:
        async with http.post(f"{url_of(node)}/v1/transactions", json={}) as response:
            transaction_id = (await response.json())["transaction_id"]
        async with http.post(f"{url_of(node)}/v1/transactions/{transaction_id}/enqueue",
                             json={"queue": "q", "items": ["x"]}) as response:
            assert response.status == 200
        replicator.hold_submits = True
        commit_url = f"{url_of(node)}/v1/transactions/{transaction_id}/commit"
        async with http.post(commit_url, json={}) as response:
            assert response.status == 504
        async with http.post(commit_url, json={}) as response:
            assert response.status != 404, await response.text()


async def test_a_duplicate_execute_returns_no_items(client: RcqClient):
    await client.enqueue("src", b"a", b"b")
    first = await client.execute([Dequeue("src"), Enqueue("dst", [b"moved"])], idempotency_key="move-1")
    assert first.results[0].values == [b"a"] and first.results[1].enqueued == 1 and not first.duplicate
    again = await client.execute([Dequeue("src"), {"op": "enqueue", "queue": "dst", "items": [b"\xff"]}],
                                 idempotency_key="move-1")
    assert again.duplicate and again.results[0].values == []  # b"b" went back to src
    assert await client.count("src") == 1 and await client.count("dst") == 1


# ---------------------------------------------------------- leader and failover
async def test_a_follower_redirect_is_followed_and_the_leader_remembered(pair, wire):
    a, b = pair
    recorder, session = wire
    async with RcqClient(url_of(b), session=session, channel=False) as client:
        async with client.transaction() as tx:
            await tx.enqueue("q", b"via-follower")
        assert client.leader_url == url_of(a)
        assert await client.count("q") == 1
    assert recorder.count("/v1/transactions", b.port) == 1  # only the first request went to b
    assert recorder.count("/commit", a.port) == 1


async def test_wait_for_leader_learns_the_leader_from_a_follower(pair):
    a, b = pair
    async with RcqClient(url_of(b)) as client:
        assert await client.wait_for_leader(LOCAL_WAIT_S) == url_of(a)
        assert url_of(a) in client.urls
        assert (await client.cluster())["role"] == "leader"
        assert (await client.cluster(url_of(b)))["role"] == "follower"


async def test_a_leader_change_aborts_the_open_transaction_and_the_next_one_works(pair):
    a, b = pair
    async with RcqClient([url_of(a), url_of(b)], retry_timeout_s=5) as client:
        await client.enqueue("q", b"committed-before")
        tx = await client.begin()
        assert await tx.dequeue("q") == b"committed-before"
        await tx.enqueue("q", b"lost-with-the-leader")
        b.replicator.lead(term=2)  # a is deposed: it aborts every open transaction
        await async_wait_until(lambda: b.manager.serving, NODE_SERVING_TIMEOUT_S, what="b serving")
        with pytest.raises(LeaderChanged):
            await tx.commit()  # a answers 503 (it does not know b's URL): the client rotates to b
        assert tx.state == "aborted"
        async with client.transaction() as next_tx:
            assert await next_tx.dequeue("q") == b"committed-before"  # back at the head
        assert client.leader_url == url_of(b)
        assert await client.count("q") == 0


async def test_a_dead_leader_is_left_for_the_next_url(pair):
    a, b = pair
    async with RcqClient([url_of(a), url_of(b)], retry_timeout_s=5) as client:
        await client.enqueue("q", b"1")
        assert client.leader_url == url_of(a)
        b.replicator.lead(term=2)
        await async_wait_until(lambda: b.manager.serving, NODE_SERVING_TIMEOUT_S, what="b serving")
        await a.stop()  # connections to a are now refused
        await client.enqueue("q", b"2")
        assert client.leader_url == url_of(b)
        assert await client.dequeue("q", max_items=10) == [b"1", b"2"]


async def test_without_a_leader_requests_give_up_with_no_leader(pair):
    a, _ = pair
    a.replicator.step_down()
    async with RcqClient([url_of(a)], retry_timeout_s=0.3) as client:
        with pytest.raises(NoLeader):
            await client.begin()
        with pytest.raises(NoLeader):
            await client.wait_for_leader(EXPIRING_WAIT_S)


async def test_an_unreachable_cluster_raises_unavailable():
    async with RcqClient("http://127.0.0.1:1", retry_timeout_s=0.2) as client:
        with pytest.raises(Unavailable, match="cannot connect"):
            await client.count("q")


# ------------------------------------------------------------------- coalescing
async def test_concurrent_one_request_calls_share_one_http_request(node: Node, wire):
    recorder, session = wire
    async with RcqClient(url_of(node), coalesce=True, session=session, channel=False) as client:
        await client.partitions()  # the listing a client asks for once, before its first routed verb
        recorder.requests.clear()
        infos = await asyncio.gather(*(client.enqueue(f"q{i}", f"v{i}") for i in range(50)))
        assert recorder.count("/v1/batch") == 1 and len(recorder.requests) == 1
        assert len({info.transaction_ids for info in infos}) == 50
        values = await asyncio.gather(*(client.dequeue(f"q{i}") for i in range(50)))
        assert values == [[f"v{i}".encode()] for i in range(50)]
        assert len(recorder.requests) == 2


async def test_a_coalesced_error_reaches_only_its_caller(node: Node, wire):
    recorder, session = wire
    async with RcqClient(url_of(node), coalesce=True, session=session, channel=False) as client:
        await client.partitions()  # else the enqueues wait for the listing and the executes go first
        results = await asyncio.gather(
            client.enqueue("q", b"fine"),
            client.enqueue("q", b"x" * ((1 << 20) + 1)),  # over item_bytes_max: a part error
            client.execute([{"op": "dequeue", "queue": "q", "max_items": 0}]),  # spoils the whole body
            client.execute([Enqueue("q", [b"also-fine"])]),
            return_exceptions=True)
        assert not isinstance(results[0], BaseException) and not isinstance(results[3], BaseException)
        assert isinstance(results[1], PayloadTooLarge)
        assert isinstance(results[2], InvalidRequest)
        assert recorder.count("/v1/batch") == 1 + 4  # the spoilt body, then each part on its own
        assert sorted(await client.dequeue("q", max_items=10)) == [b"also-fine", b"fine"]


async def test_a_coalesced_batch_is_bounded_in_parts(node: Node, wire):
    recorder, session = wire
    async with RcqClient(url_of(node), coalesce=True, session=session, channel=False) as client:
        await asyncio.gather(*(client.enqueue("q", b"x") for _ in range(COALESCE_PARTS_MAX + 1)))
        assert recorder.count("/v1/batch") == 2
        assert await client.count("q") == COALESCE_PARTS_MAX + 1


async def test_coalescing_is_off_by_default(node: Node, wire):
    recorder, session = wire
    async with RcqClient(url_of(node), session=session, channel=False) as client:
        await asyncio.gather(*(client.enqueue("q", b"x") for _ in range(5)))
        assert recorder.count("/v1/batch") == 0 and recorder.count("/enqueue") == 5


def test_the_client_imports_neither_pysyncobj_nor_lmdb():
    code = "import sys, rcq.client, rcq.cli; sys.exit(any(m in sys.modules for m in ('pysyncobj', 'lmdb')))"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


async def test_coalesced_interactive_transactions_share_requests(node: Node, wire):
    recorder, session = wire
    async with RcqClient(url_of(node), coalesce=True, session=session, channel=False) as client:
        await client.enqueue("q", *[f"i{i}".encode() for i in range(20)])
        before = len(recorder.requests)

        async def consume() -> bytes | None:
            async with client.transaction() as tx:
                return await tx.dequeue("q")

        values = await asyncio.gather(*(consume() for _ in range(20)))
        assert sorted(values) == sorted(f"i{i}".encode() for i in range(20))
        sent = [path for _, _, path in recorder.requests[before:]]
        # begin, dequeue, commit: one batch each; and the partition listing, asked once (a first
        # verb asks where its queue lives, which may be a spread queue: docs/partitions.md)
        assert sent.count("/v1/batch") == 3 and sent.count("/v1/cluster/partitions") <= 1 and len(sent) <= 4, sent
        assert await client.count("q") == 0


# ------------------------------------------------------- one transport, one retry engine
async def test_a_coalesced_batch_whose_answer_was_lost_is_resent_once_as_one_batch(node: Node, wire):
    recorder, session = wire
    async with RcqClient(url_of(node), coalesce=True, session=session, channel=False) as client:
        first, second = await asyncio.gather(client.begin(), client.begin())
        await asyncio.gather(first.enqueue("q", b"from-first"), second.enqueue("q", b"from-second"))
        before = recorder.count("/v1/batch")
        recorder.lose["/v1/batch"] = 1
        infos = await asyncio.gather(first.commit(), second.commit(), client.enqueue("q", b"one-request"))
        # one engine: the lost batch is re-sent once, its parts together; no part is retried again inside it
        assert recorder.count("/v1/batch") - before == 2
        assert all(info.duplicate for info in infos)
        assert (first.state, second.state) == ("committed", "committed")
        assert sorted(await client.dequeue("q", max_items=10)) == [b"from-first", b"from-second", b"one-request"]


async def test_a_coalesced_batch_follows_a_redirect_once(pair, wire):
    a, b = pair
    recorder, session = wire
    async with RcqClient(url_of(b), coalesce=True, session=session, channel=False) as client:
        await asyncio.gather(client.enqueue("q", b"1"), client.enqueue("q", b"2"))
        assert recorder.count("/v1/batch", b.port) == 1 and recorder.count("/v1/batch", a.port) == 1
        assert client.leader_url == url_of(a)
        assert await client.count("q") == 2


@pytest.mark.parametrize("coalesce", [False, True], ids=["rest", "coalesced"])
async def test_lost_answers_fail_a_request_the_same_way_coalesced_or_not(node: Node, wire, coalesce: bool):
    recorder, session = wire
    async with RcqClient(url_of(node), coalesce=coalesce, retry_timeout_s=0.3, session=session,
                         channel=False) as client:
        tx = await client.begin()
        await tx.enqueue("q", b"x")
        recorder.lose.update({suffix: 1_000_000 for suffix in ("/v1/batch", "/v1/transactions", "/commit", "/enqueue")})
        with pytest.raises(Unavailable) as raised:
            await client.begin()
        assert type(raised.value) is Unavailable  # a lost begin is not a commit whose outcome is unknown
        with pytest.raises(CommitOutcomeUnknown):
            await tx.commit()
        assert tx.state == "unknown"
        with pytest.raises(CommitOutcomeUnknown):
            await client.enqueue("q", b"y")


async def test_a_coalesced_commit_that_stays_unknown_is_retried_then_raises_commit_outcome_unknown(tmp_path: Path, wire):
    recorder, session = wire
    replicator = InMemoryReplicator()
    async with (running_node(tmp_path, replicator, commit_timeout_s=0.2) as node,
                RcqClient(url_of(node), coalesce=True, retry_timeout_s=1.0, session=session, channel=False) as client):
        tx = await client.begin()
        await tx.enqueue("q", b"x")
        before = recorder.count("/v1/batch")
        replicator.hold_submits = True
        with pytest.raises(CommitOutcomeUnknown):
            await tx.commit()
        assert tx.state == "unknown" and recorder.count("/v1/batch") - before >= 2


async def test_waiting_dequeues_are_never_coalesced(node: Node, wire):
    recorder, session = wire
    async with RcqClient(url_of(node), coalesce=True, session=session, channel=False) as client:
        await client.enqueue("q", b"1", b"2")
        async with client.transaction() as tx:
            assert await tx.dequeue("q", wait_ms=50) == b"1"
        assert await client.dequeue("q", wait_ms=50) == [b"2"]
        assert recorder.count("/v1/transactions/" + tx.transaction_id + "/dequeue") == 1
        assert recorder.count("/v1/queues/q/dequeue") == 1


# ------------------------------------------------------------------- public names
async def test_the_old_timeout_arguments_still_work_with_a_deprecation_warning(client: RcqClient):
    with pytest.warns(DeprecationWarning, match="timeout_s"):
        tx = await client.begin(timeout=20)
    assert 10 < (await tx.status())["expires_in_s"] <= 20
    with pytest.warns(DeprecationWarning, match="timeout_s"):
        extended = await tx.extend(timeout=120)
    assert extended["expires_in_s"] > 60
    with pytest.raises(TypeError):
        await tx.extend(timeout_s=10, timeout=10)
    await tx.abort()
    with pytest.warns(DeprecationWarning, match="timeout_s"):
        context = client.transaction(timeout=20)
    async with context as other:
        assert 10 < (await other.status())["expires_in_s"] <= 20


def test_every_name_importable_before_the_split_still_is():
    import rcq.client

    before_the_split = {
        "CommitConflict", "CommitInfo", "CommitOutcomeUnknown", "Dequeue", "Enqueue", "ExecuteResult",
        "InternalError", "InvalidQueueName", "InvalidRequest", "Item", "LeaderChanged", "MethodNotAllowed",
        "NoLeader", "NotLeader", "NotReady", "OperationResult", "PayloadTooLarge", "RcqClient", "RcqError",
        "RouteNotFound", "TooManyQueues", "TooManyTransactions", "Transaction", "TransactionAborted",
        "TransactionBusy", "TransactionClosed", "TransactionCommitted", "TransactionExpired",
        "TransactionNotFound", "Unavailable", "encode_items", "ItemValue", "PEEK_TIMEOUT_S", "CONNECTIONS_MAX",
    }
    assert before_the_split <= set(rcq.client.__all__)
    assert all(hasattr(rcq.client, name) for name in rcq.client.__all__)


async def test_installed_hooks_wrap_the_one_request_verbs_and_the_no_op_ones_are_skipped(client: RcqClient):
    calls: list[str] = []

    class Recording(hooks.Hooks):
        async def send(self, target: Any, queue: str, count: int, headers: Any, call: Any, *,
                       transaction_id: str | None = None) -> Any:
            calls.append(f"send {queue} {count}")
            return await call(headers)

        async def receive(self, target: Any, queue: str, call: Any, items_of: Any, *,
                          transaction_id: str | None = None) -> Any:
            calls.append(f"receive {queue}")
            return await call()

        async def execute(self, target: Any, operations: Any, call: Any, items_of: Any) -> Any:
            calls.append(f"execute {len(operations)}")
            return await call(operations)

    assert not hooks.instrumented()
    previous = hooks.install(hooks.Hooks())  # a plain one does nothing either
    assert not hooks.instrumented()
    hooks.install(Recording())
    try:
        assert hooks.instrumented()
        await client.enqueue("hooked", b"a", b"b")
        assert await client.dequeue("hooked") == [b"a"]
        await client.execute([Enqueue("hooked", [b"c"])])
    finally:
        hooks.install(previous)
    assert calls == ["send hooked 2", "receive hooked", "execute 1"]
    assert not hooks.instrumented()
    assert await client.dequeue("hooked", 2) == [b"b", b"c"]
