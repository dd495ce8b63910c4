"""Abuse resistance against a real 3-node cluster: one test per attack, each on a cluster of its own.

Every test runs the same frame around its attack:

* before: the serving leader, its id and term, and every node's pid (:func:`take_baseline`);
* during: a *bystander* — an honest client with a token of its own (per-client caps count each
  principal apart) on another loopback address (127.0.0.2; the nodes listen on 127.0.0.1 and
  Linux routes all of 127/8 on ``lo``) — keeps committing transactions that enqueue distinct
  values into a queue of its own, and must make progress while the attack runs;
* after (:meth:`Arena.check_unharmed`): no node died or restarted (same pids, no unexpected
  exit), the leader and the term are the same on every node (no election happened anywhere:
  terms never go back), the replicas converge to the same state digest, and the bystander's
  queue drains to exactly the values it was told were committed.

The attacker speaks raw HTTP (aiohttp, from 127.0.0.1) so that each test can check the exact
status, error code, details and ``Retry-After`` it is answered with. It holds a valid token (an
admin one, principal ``attacker``: it also reads the storage budget, the digest and the open
transactions): these attacks are on resources, by a client the cluster lets in. Every wait is
bounded.

"Full" is full to within one item: the leader's admission counts a commit twice for a moment,
once in the replicated usage (applied on the Raft thread) and once as still reserved (released
when the applied entry reaches the event loop), so a refusal may come with one in-flight
commit's worth of room left; never past the budget.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import io
import itertools
import json
import time
from collections import Counter
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from rcq.client import RcqClient, RcqError
from rcq.errors import StorageFull
from rcq.local.cluster import LocalCluster
from rcq.server.core.state_machine import ITEM_OVERHEAD_BYTES, QUEUES_MAX
from rcq.testing import async_wait_until
from tests.helpers import CLUSTER_WAIT_S, FLOOD_REQUEST_TIMEOUT_S

# Each test floods its own cluster and checks that nothing else suffered: two at once on a small
# machine starve each other's clusters, so one parallel worker runs them in turn.
# "Nothing else suffered" includes "no election": the flood must not hold a node's Raft back long
# enough for a follower to give up on its leader. Other workers' tests share the machine's two
# cores and its disk, though, and in one CI run a node of a flooded cluster started an election
# while its flood's event loop was busy 0.3 s at a time, as it always is here: something outside
# held it back for the rest. The clusters here wait three times the default election timeout: a
# stall the flood itself causes lasts as long as the flood and still shows; a neighbour's second
# does not.
PATIENT_RAFT = dict(raft_timeout_min_s=2.4, raft_timeout_max_s=4.8, leader_fallback_timeout_s=1.8,
                    connection_timeout_s=4.8)
pytestmark = [pytest.mark.cluster, pytest.mark.one_worker("floods"), pytest.mark.cluster_overrides(**PATIENT_RAFT)]

ATTACKER_ADDRESS = "127.0.0.1"
BYSTANDER_ADDRESS = "127.0.0.2"
BYSTANDER_PROGRESS = 3  # commits the bystander must make while an attack is on
STREAMED_BODY_MIN_BYTES = 1 << 20  # aiohttp warns about raw bodies over 1 MiB; stream those
FLOODERS = 4  # concurrent attacker requests in the flood


# ======================================================================= raw HTTP
@dataclasses.dataclass(frozen=True)
class Answer:
    status: int
    body: Any
    headers: Mapping[str, str]
    size: int  # bytes of the body on the wire

    def error(self) -> dict[str, Any]:
        assert isinstance(self.body, dict) and isinstance(self.body.get("error"), dict), self.short()
        return dict(self.body["error"])

    def short(self) -> str:
        text = json.dumps(self.body)
        return f"HTTP {self.status}: {text[:400]}{'...' if len(text) > 400 else ''}"


async def call(session: aiohttp.ClientSession, method: str, url: str, body: Any = None,
               timeout_s: float = FLOOD_REQUEST_TIMEOUT_S) -> Answer:
    data: bytes | io.BytesIO | None = None
    if body is not None:
        encoded = json.dumps(body).encode()
        data = io.BytesIO(encoded) if len(encoded) >= STREAMED_BODY_MIN_BYTES else encoded
    async with session.request(method, url, data=data, headers={"Content-Type": "application/json"},
                               timeout=aiohttp.ClientTimeout(total=timeout_s), allow_redirects=False) as response:
        raw = await response.read()
        return Answer(response.status, json.loads(raw) if raw else None, dict(response.headers), len(raw))


def assert_error(answer: Answer, status: int, code: str, **details: Any) -> dict[str, Any]:
    """The answer is the clear error ``code`` with HTTP ``status`` (and Retry-After when it says to come back)."""
    assert answer.status == status, answer.short()
    error = answer.error()
    assert error["code"] == code, answer.short()
    for key, value in details.items():
        assert error.get("details", {}).get(key) == value, answer.short()
    if error["retryable"] and status in (429, 503, 507):
        assert answer.headers.get("Retry-After"), f"no Retry-After on {answer.short()}"
    return error


def assert_sub_error(response: Mapping[str, Any], status: int, code: str, **details: Any) -> None:
    """One sub-response of POST /v1/batch (``{"status", "body"}``) is the error ``code``."""
    assert response["status"] == status, response
    error = response["body"]["error"]
    assert error["code"] == code, response
    for key, value in details.items():
        assert error.get("details", {}).get(key) == value, response


def session_from(address: str, token: str | None) -> aiohttp.ClientSession:
    """An HTTP session whose connections leave from ``address`` (another loopback client), sending ``token``."""
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(local_addr=(address, 0), limit=0),
                                 headers={"Authorization": f"Bearer {token}"} if token else None)


# ============================================================ the cluster's health
@dataclasses.dataclass(frozen=True)
class Baseline:
    leader: int
    leader_id: str
    term: int
    pids: dict[int, int]


def node_views(cluster: LocalCluster) -> dict[int, dict[str, Any]]:
    """Every node's /v1/cluster; a busy node gets a generous socket timeout, and a bounded wait."""
    views: dict[int, dict[str, Any]] = {}
    errors: dict[int, str] = {}
    deadline = time.monotonic() + CLUSTER_WAIT_S
    while time.monotonic() < deadline:
        answers, errors = cluster.poll(lambda i: cluster.status(i, timeout_s=10.0), range(len(cluster.nodes)))
        views.update(answers)
        if len(views) == len(cluster.nodes):
            return views
    raise TimeoutError(f"nodes did not answer /v1/cluster within {CLUSTER_WAIT_S} s: {errors}")


def take_baseline(cluster: LocalCluster) -> Baseline:
    leader = cluster.wait_for_leader(CLUSTER_WAIT_S)
    cluster.wait_for_applied(CLUSTER_WAIT_S)  # every follower names the leader by now
    views = node_views(cluster)
    assert {v["term"] for v in views.values()} == {views[leader]["term"]}, views
    return Baseline(leader, str(views[leader]["node_id"]), int(views[leader]["term"]), cluster.pids())


def process_state(pid: int) -> str:
    """The state letter of /proc/<pid>/stat (R, S, D, Z, T, ...); 'gone' if there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return "gone"
    return stat.rpartition(")")[2].split()[0]


def assert_cluster_undisturbed(cluster: LocalCluster, before: Baseline) -> None:
    assert cluster.unexpected_exits() == {}, f"nodes exited: {cluster.unexpected_exits()}"
    assert cluster.pids() == before.pids, f"node processes changed: {before.pids} -> {cluster.pids()}"
    for pid in before.pids.values():
        assert process_state(pid) not in ("gone", "Z"), f"node pid {pid} is {process_state(pid)}"
    views = node_views(cluster)
    seen = {i: (v["term"], v["leader_id"], v["role"]) for i, v in views.items()}
    for i, (term, leader_id, role) in seen.items():
        # Terms never go back: the same term everywhere means no node ever started an election.
        assert term == before.term, f"term changed from {before.term}: {seen}"
        assert leader_id == before.leader_id, f"leader changed from {before.leader_id}: {seen}"
        assert role == ("leader" if i == before.leader else "follower"), seen
    assert views[before.leader]["serving"] is True, views[before.leader]


# ================================================================== the bystander
@dataclasses.dataclass
class Bystander:
    """An honest client: transactions that each enqueue one distinct value into its own queue
    and commit, back to back, plus a read each time. Errors of the ``tolerated`` classes are
    counted as refusals (nothing committed: the transaction is aborted); any other error ends
    it, and :meth:`stop` raises it."""

    client: RcqClient
    queue: str
    tolerated: tuple[type[RcqError], ...] = ()
    acked: list[str] = dataclasses.field(default_factory=list)
    ack_times: list[float] = dataclasses.field(default_factory=list)
    refused: Counter[str] = dataclasses.field(default_factory=Counter)
    slowest_s: float = 0.0
    _stop: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    _task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        for n in itertools.count():
            if self._stop.is_set():
                return
            value = f"{self.queue}-{n}"
            began = time.monotonic()
            tx = await self.client.begin()
            try:
                await tx.enqueue(self.queue, value)
                await tx.commit()
            except self.tolerated as exc:
                self.refused[exc.code] += 1
                await tx.abort_quietly()
            else:
                self.acked.append(value)
                self.ack_times.append(time.monotonic())
            await self.client.count(self.queue)
            self.slowest_s = max(self.slowest_s, time.monotonic() - began)

    def acks_since(self, moment: float) -> int:
        return sum(1 for t in self.ack_times if t >= moment)

    async def wait_for_progress(self, commits: int = BYSTANDER_PROGRESS, what: str = "") -> None:
        """Wait (bounded) until it has committed ``commits`` more transactions from now."""
        assert self._task is not None
        target = len(self.acked) + commits
        task = self._task

        def progressed() -> bool:
            if task.done():
                task.result()  # raises what stopped it
                raise AssertionError("the bystander stopped")
            return len(self.acked) >= target

        await async_wait_until(progressed, CLUSTER_WAIT_S, interval_s=0.05,
                               what=f"the bystander committing {commits} more {what}")

    async def stop(self) -> None:
        """Let the transaction in progress finish (its outcome must be known), then stop."""
        self._stop.set()
        if self._task is not None:
            await asyncio.wait_for(self._task, CLUSTER_WAIT_S)

    def summary(self) -> str:
        return (f"bystander: {len(self.acked)} commits, refusals {dict(self.refused)}, "
                f"slowest round {self.slowest_s:.2f} s")


async def drain(client: RcqClient, queue: str, batch: int = 1000) -> list[bytes]:
    """Dequeue and commit until the queue is empty on the leader; every value taken, in order."""
    taken: list[bytes] = []

    async def empty() -> bool:
        async with client.transaction() as tx:
            got = await tx.dequeue_batch(queue, batch)
        taken.extend(got)  # committed: taken for good (a failed try is tried again, its items back)
        return await client.count(queue) == 0

    await async_wait_until(empty, CLUSTER_WAIT_S, interval_s=0.01, what=f"{queue} to drain")
    return taken


# ====================================================================== the arena
@dataclasses.dataclass
class Arena:
    cluster: LocalCluster
    baseline: Baseline
    attacker: aiohttp.ClientSession  # connections from 127.0.0.1, principal "attacker"
    bystander: Bystander  # its client connects from 127.0.0.2, principal "bystander"
    bystander_http: aiohttp.ClientSession  # the bystander's connections (from 127.0.0.2), for raw requests
    started: float

    @property
    def leader_url(self) -> str:
        return self.cluster.url(self.baseline.leader)

    async def storage(self) -> dict[str, Any]:
        answer = await call(self.attacker, "GET", f"{self.leader_url}/v1/cluster/storage")
        assert answer.status == 200, answer.short()
        return dict(answer.body)

    async def queue_info(self, queue: str) -> dict[str, Any]:
        answer = await call(self.attacker, "GET", f"{self.leader_url}/v1/queues/{queue}")
        assert answer.status == 200, answer.short()
        return dict(answer.body)

    async def check_unharmed(self) -> None:
        """The bystander stops; no node died, restarted or lost leadership; every value the
        bystander was told was committed is in its queue, once, and nothing else is."""
        await self.bystander.stop()
        await asyncio.to_thread(assert_cluster_undisturbed, self.cluster, self.baseline)
        await asyncio.to_thread(self.cluster.wait_for_convergence, CLUSTER_WAIT_S)  # the replicas agree
        drained = [v.decode() for v in await drain(self.bystander.client, self.bystander.queue)]
        assert Counter(drained) == Counter(self.bystander.acked), (
            f"bystander: {len(self.bystander.acked)} acknowledged, {len(drained)} drained")
        print(f"{self.bystander.summary()}; test took {time.monotonic() - self.started:.1f} s")


@pytest.fixture
def tolerated() -> tuple[type[RcqError], ...]:
    """Errors the bystander counts as refusals rather than failures (overridden by parametrize)."""
    return ()


@pytest.fixture
async def arena(own_cluster: LocalCluster, tolerated: tuple[type[RcqError], ...]) -> AsyncIterator[Arena]:
    started = time.monotonic()
    attacker_token = own_cluster.add_token("attacker", admin=True, wait=False)
    bystander_token = own_cluster.add_token("bystander", grants=[{"queues": "*", "actions": ["produce", "consume"]}],
                                        wait=False)
    await asyncio.to_thread(own_cluster.wait_for_token, [attacker_token, bystander_token], True)
    baseline = await asyncio.to_thread(take_baseline, own_cluster)
    async with contextlib.AsyncExitStack() as stack:
        attacker = await stack.enter_async_context(session_from(ATTACKER_ADDRESS, attacker_token))
        bystander_session = await stack.enter_async_context(session_from(BYSTANDER_ADDRESS, bystander_token))
        # A refused (retryable) answer is retried by the client for retry_timeout_s: keep it short
        # when refusals are expected, so they are counted rather than waited out.
        client = await stack.enter_async_context(RcqClient(
            own_cluster.urls, request_timeout_s=FLOOD_REQUEST_TIMEOUT_S, retry_timeout_s=3.0 if tolerated else CLUSTER_WAIT_S,
            session=bystander_session, token=bystander_token))
        bystander = Bystander(client, "bystander", tolerated)
        bystander.start()
        try:
            await bystander.wait_for_progress(what="before the attack")
            yield Arena(own_cluster, baseline, attacker, bystander, bystander_session, started)
        finally:
            await bystander.stop()


# ======================================================================= attacks
@pytest.mark.parametrize("own_cluster", [{"storage_bytes_max": 64 << 20}], indirect=True)
@pytest.mark.parametrize("tolerated", [(StorageFull,)])
async def test_a_flood_of_empty_items_fills_the_budget_then_gets_507_while_dequeues_keep_working(
        arena: Arena) -> None:
    budget = 64 << 20
    flood_url = f"{arena.leader_url}/v1/queues/flood/enqueue"
    acked = 0
    refusals: list[Answer] = []

    async def flooder() -> None:
        """POST 10,000 empty items at a time until refused."""
        nonlocal acked
        # Empty items cost their bookkeeping: 64 MiB / 160 B is about 420k of them, 42 requests.
        for _ in range(budget // (ITEM_OVERHEAD_BYTES * 10_000) + 5):
            answer = await call(arena.attacker, "POST", flood_url, {"items": [""] * 10_000})
            if answer.status != 200:
                refusals.append(answer)
                return
            assert answer.body["committed"] is True and answer.body["enqueued"] == 10_000, answer.short()
            acked += 10_000
        raise AssertionError(f"{acked} empty items and still no 507")

    flood_started = time.monotonic()
    # Concurrent flooders: commits in flight race for the last room. The bystander must commit
    # meanwhile (or right after: what the flooders could not use is still room for one item).
    await asyncio.gather(*(flooder() for _ in range(FLOODERS)),
                         arena.bystander.wait_for_progress(1, what="during the flood"))
    flood_s = time.monotonic() - flood_started
    assert len(refusals) == FLOODERS
    for refusal in refusals:
        error = assert_error(refusal, 507, "storage_full", storage_bytes_max=budget)
        assert error["retryable"] is True
    size = 10_000
    # Top off: ever smaller requests, until not even one empty item fits.
    while size > 1:
        size = max(1, size // 4)
        while (answer := await call(arena.attacker, "POST", flood_url, {"items": [""] * size})).status == 200:
            acked += size
        assert_error(answer, 507, "storage_full")
    storage = await arena.storage()
    # Full to within one item: the last refusal may also have counted the bystander's commit in
    # flight (one item) twice, as applied and as still reserved (see the module docstring).
    assert budget - 2 * (ITEM_OVERHEAD_BYTES + 64) < storage["storage_bytes"] <= budget, storage
    assert (await arena.queue_info("flood"))["count"] == acked  # the refusals changed nothing
    # Full for everyone: another client's enqueue is refused the same way.
    other = await call(arena.bystander_http, "POST",
                       f"{arena.leader_url}/v1/queues/another/enqueue", {"items": ["x"]})
    assert_error(other, 507, "storage_full")

    # A normal consumer drains while the storage is full: dequeues and their commits need no room.
    consumer = arena.bystander.client
    drained = 0
    draining_started = time.monotonic()
    while True:
        async with consumer.transaction() as tx:
            got = await tx.dequeue_batch("flood", 10_000)
        if not got:
            break
        assert set(got) == {b""}
        drained += len(got)
        assert drained <= acked
    assert drained == acked, f"{acked} empty items acknowledged, {drained} drained"
    assert (await arena.queue_info("flood"))["count"] == 0
    drain_s = time.monotonic() - draining_started
    # Enqueues work again, for the attacker and for everyone else.
    again = await call(arena.attacker, "POST", flood_url, {"items": [""] * 10_000})
    assert again.status == 200 and again.body["enqueued"] == 10_000, again.short()
    assert (await arena.queue_info("flood"))["count"] == 10_000
    await arena.bystander.wait_for_progress(what="after the drain")
    print(f"\nflood: {acked} empty items in {flood_s:.1f} s until 507, drained in {drain_s:.1f} s")
    await arena.check_unharmed()
    # The budget's accounting came back exactly: what is left is the last 10,000 empty items.
    storage = await arena.storage()
    assert (storage["items"], storage["storage_bytes"]) == (10_000, 10_000 * ITEM_OVERHEAD_BYTES), storage


@pytest.mark.parametrize("own_cluster", [{"dequeue_answer_bytes_max": 4 << 20}], indirect=True)
async def test_a_dequeue_of_10000_huge_items_answers_at_most_the_answer_budget_and_leaves_the_rest(
        arena: Arena) -> None:
    budget = 4 << 20
    item_bytes = 1 << 20  # item_bytes_max
    values = [f"{i:04d}".ljust(item_bytes, "x") for i in range(40)]
    fits = budget // item_bytes
    client = arena.bystander.client
    for first in range(0, len(values), 4):  # 4 MiB per request, under transaction_bytes_max (8 MiB)
        await client.enqueue("huge", *values[first:first + 4])
    assert (await arena.queue_info("huge"))["count"] == len(values)

    begun = await call(arena.attacker, "POST", f"{arena.leader_url}/v1/transactions", {"timeout_s": 60})
    assert begun.status == 201, begun.short()
    tx_url = f"{arena.leader_url}/v1/transactions/{begun.body['transaction_id']}"
    consumed: list[str] = []
    under_attack = time.monotonic()
    answer = await call(arena.attacker, "POST", f"{tx_url}/dequeue", {"queue": "huge", "max_items": 10_000})
    assert answer.status == 200, answer.short()
    got = [item["value"] for item in answer.body["items"]]
    assert sum(len(v) for v in got) <= budget and len(got) == fits, [len(v) for v in got]
    assert answer.size <= budget + 4096 * len(got), answer.size  # the answer itself is bounded too
    assert got == values[:fits]  # the head, in order
    info = await arena.queue_info("huge")
    assert (info["count"], info["locked"], info["available"]) == (40, fits, 40 - fits), info  # the rest is there
    await arena.bystander.wait_for_progress(what="while a transaction holds 4 MiB of items")
    # A second huge dequeue in the same transaction is bounded the same way, and takes the next items.
    answer = await call(arena.attacker, "POST", f"{tx_url}/dequeue", {"queue": "huge", "max_items": 10_000})
    assert [item["value"] for item in answer.body["items"]] == values[fits:2 * fits], answer.short()[:200]
    committed = await call(arena.attacker, "POST", f"{tx_url}/commit", {})
    assert committed.status == 200 and committed.body["dequeued"] == 2 * fits, committed.short()
    consumed += values[:2 * fits]
    # One-request dequeue (at most once): it commits only what it answers.
    answer = await call(arena.attacker, "POST", f"{arena.leader_url}/v1/queues/huge/dequeue", {"max_items": 10_000})
    assert answer.status == 200, answer.short()
    got = [item["value"] for result in answer.body["results"] for item in result["items"]]
    assert got == values[2 * fits:3 * fits], [v[:4] for v in got]
    consumed += got
    assert (await arena.queue_info("huge"))["count"] == 40 - 3 * fits
    assert arena.bystander.acks_since(under_attack) >= BYSTANDER_PROGRESS
    consumed += [v.decode() for v in await drain(client, "huge", batch=10_000)]
    assert Counter(consumed) == Counter(values)  # every item acknowledged, once
    await arena.check_unharmed()


async def test_one_client_flooding_the_transaction_table_is_capped_and_other_clients_still_transact(
        arena: Arena) -> None:
    per_client_max = 2_500  # transactions_open_per_client_max, the default
    begins = [{"op": "begin", "timeout_s": 3600, "label": "flood"}] * 1000
    opened: list[str] = []
    refusals: list[dict[str, Any]] = []
    for _ in range(per_client_max // 1000 + 2):
        answer = await call(arena.attacker, "POST", f"{arena.leader_url}/v1/batch", {"requests": begins})
        assert answer.status == 200, answer.short()
        for response in answer.body["responses"]:
            if response["status"] == 201:
                opened.append(response["body"]["transaction_id"])
            else:
                refusals.append(response)
    assert len(opened) == per_client_max, f"{len(opened)} transactions opened by one client"
    assert len(refusals) == 1000 * (per_client_max // 1000 + 2) - per_client_max
    for response in refusals:
        assert_sub_error(response, 429, "too_many_transactions", scope="client")
    # The plain REST form says so too, with Retry-After.
    single = await call(arena.attacker, "POST", f"{arena.leader_url}/v1/transactions", {"timeout_s": 3600})
    assert_error(single, 429, "too_many_transactions", scope="client")
    # Another client (another principal) still begins, enqueues and commits.
    await arena.bystander.wait_for_progress(what="while one client holds its whole share of transactions")
    cluster_view = await call(arena.attacker, "GET", f"{arena.leader_url}/v1/cluster")
    assert cluster_view.body["open_transactions"] >= per_client_max
    # The cap counts open transactions: the attacker gets back exactly what it gives back.
    aborts = [{"op": "abort", "transaction_id": t} for t in opened[:10]]
    answer = await call(arena.attacker, "POST", f"{arena.leader_url}/v1/batch", {"requests": aborts})
    assert [r["status"] for r in answer.body["responses"]] == [200] * 10, answer.short()
    answer = await call(arena.attacker, "POST", f"{arena.leader_url}/v1/batch", {"requests": begins[:11]})
    assert [r["status"] for r in answer.body["responses"]] == [201] * 10 + [429], answer.short()
    await arena.check_unharmed()


LIFETIME_S = 4.0
TIMEOUT_MAX_S = 2.0


@pytest.mark.parametrize("own_cluster", [{"transaction_lifetime_max_s": LIFETIME_S, "transaction_timeout_max_s": TIMEOUT_MAX_S,
                                      "transaction_timeout_default_s": TIMEOUT_MAX_S}], indirect=True)
async def test_a_transaction_extended_for_ever_hits_its_lifetime_and_its_items_come_back(arena: Arena) -> None:
    values = [f"held-{i}" for i in range(5)]
    await arena.bystander.client.enqueue("held", *values)
    begun = await call(arena.attacker, "POST", f"{arena.leader_url}/v1/transactions", {"timeout_s": TIMEOUT_MAX_S})
    began = time.monotonic()
    assert begun.status == 201, begun.short()
    tx_url = f"{arena.leader_url}/v1/transactions/{begun.body['transaction_id']}"
    answer = await call(arena.attacker, "POST", f"{tx_url}/dequeue", {"queue": "held", "max_items": 100})
    assert [item["value"] for item in answer.body["items"]] == values, answer.short()
    extends = 0
    while True:  # extend for ever, as fast as the answers come
        answer = await call(arena.attacker, "POST", f"{tx_url}/extend", {"timeout_s": TIMEOUT_MAX_S})
        if answer.status != 200:
            break
        extends += 1
        assert time.monotonic() - began < LIFETIME_S, "extended past the transaction's lifetime"
    refused_at = time.monotonic() - began
    error = assert_error(answer, 409, "transaction_lifetime_exceeded")
    assert 0 <= error["details"]["remaining_s"] <= TIMEOUT_MAX_S, error
    assert extends >= 1 and TIMEOUT_MAX_S - 0.5 <= refused_at < LIFETIME_S, (extends, refused_at)
    info = await arena.queue_info("held")
    assert (info["count"], info["locked"]) == (5, 5), info  # still held: it lives until its last deadline

    # It expires by its lifetime; its items come back to the queue.
    async def returned() -> bool:
        info = await arena.queue_info("held")
        return bool(info["available"] == 5 and info["locked"] == 0)

    await async_wait_until(returned, CLUSTER_WAIT_S, interval_s=0.05, what="the held items to come back")
    back_after = time.monotonic() - began
    assert back_after < LIFETIME_S + 5.0, f"items came back {back_after:.1f} s after the begin"
    answer = await call(arena.attacker, "POST", f"{tx_url}/extend", {"timeout_s": 1})
    assert_error(answer, 409, "transaction_expired")
    status = await call(arena.attacker, "GET", tx_url)
    assert (status.body["state"], status.body["reason"]) == ("aborted", "transaction_expired"), status.short()
    await arena.bystander.wait_for_progress(what="after the expiry")
    drained = [v.decode() for v in await drain(arena.bystander.client, "held")]
    assert drained == values  # back at the head, in order, nothing lost
    print(f"\nlifetime: {extends} extends, refused {refused_at:.2f} s in, items back {back_after:.2f} s in")
    await arena.check_unharmed()


async def test_creating_queues_until_the_cap_gets_409_too_many_queues_and_a_delete_makes_room(arena: Arena) -> None:
    execute_url = f"{arena.leader_url}/v1/execute"
    names = (f"cap-{n:05d}" for n in itertools.count())
    created: list[str] = []
    for _ in range(QUEUES_MAX // 1000 + 3):
        room = QUEUES_MAX - (await arena.storage())["queues"]
        if room == 0:
            break
        batch = [next(names) for _ in range(min(1000, room))]
        answer = await call(arena.attacker, "POST", execute_url,
                            {"operations": [{"op": "enqueue", "queue": q, "items": ["x"]} for q in batch]})
        assert answer.status == 200 and answer.body["committed"] is True, answer.short()
        created += batch
    storage = await arena.storage()
    assert storage["queues"] == QUEUES_MAX, storage
    await arena.bystander.wait_for_progress(what="with 10,000 queues")

    # Every way of creating one more queue: 409 too_many_queues, never commit_conflict.
    fresh = next(names)
    answer = await call(arena.attacker, "POST", execute_url, {"operations": [{"op": "enqueue", "queue": fresh, "items": ["x"]}]})
    assert_error(answer, 409, "too_many_queues", queue=fresh)
    many = [{"op": "enqueue", "queue": q, "items": ["x"]} for q in itertools.islice(names, 1000)]
    assert_error(await call(arena.attacker, "POST", execute_url, {"operations": many}), 409, "too_many_queues")
    assert_error(await call(arena.attacker, "PUT", f"{arena.leader_url}/v1/queues/{fresh}", {"max_items": 10}),
                 409, "too_many_queues")
    begun = await call(arena.attacker, "POST", f"{arena.leader_url}/v1/transactions", {})
    tx_url = f"{arena.leader_url}/v1/transactions/{begun.body['transaction_id']}"
    assert (await call(arena.attacker, "POST", f"{tx_url}/enqueue", {"queue": fresh, "items": ["x"]})).status == 200
    assert_error(await call(arena.attacker, "POST", f"{tx_url}/commit", {}), 409, "too_many_queues", queue=fresh)
    assert (await arena.storage())["queues"] == QUEUES_MAX
    # Existing queues can still be configured, and still take items.
    answer = await call(arena.attacker, "PUT", f"{arena.leader_url}/v1/queues/{created[2]}", {"max_items": 10})
    assert answer.status == 200, answer.short()
    answer = await call(arena.attacker, "POST", f"{arena.leader_url}/v1/queues/{created[1]}/enqueue", {"items": ["y"]})
    assert answer.status == 200, answer.short()

    # Deleting one makes room for exactly one.
    deleted = await call(arena.attacker, "DELETE", f"{arena.leader_url}/v1/queues/{created[0]}")
    assert deleted.status == 200 and deleted.body["removed"] == 1, deleted.short()
    answer = await call(arena.attacker, "PUT", f"{arena.leader_url}/v1/queues/{fresh}", {"max_items": 10})
    assert answer.status == 200, answer.short()
    assert_error(await call(arena.attacker, "POST", execute_url,
                            {"operations": [{"op": "enqueue", "queue": next(names), "items": ["x"]}]}),
                 409, "too_many_queues")
    # Every acknowledged item is where it was put.
    listing = await call(arena.attacker, "GET", f"{arena.leader_url}/v1/queues")
    counts = {q["queue"]: q["count"] for q in listing.body["queues"]}
    assert len(counts) == QUEUES_MAX
    expected = {q: 1 for q in created[1:]} | {created[1]: 2, fresh: 0}
    assert {q: c for q, c in counts.items() if q != "bystander"} == expected
    await arena.check_unharmed()


DEDUP_KEYS = 120_000
KEYS_KEPT_BEFORE = 100_000  # before the time-based retention, only the last 100k keys were kept


async def test_an_idempotency_key_is_still_remembered_after_120k_newer_keys(arena: Arena) -> None:
    assert DEDUP_KEYS > KEYS_KEPT_BEFORE
    url = f"{arena.leader_url}/v1/execute-batch"

    def execute(i: int) -> dict[str, Any]:
        return {"operations": [{"op": "enqueue", "queue": "dedup", "items": [f"v{i}"]}],
                "idempotency_key": f"dedup-{i:06d}"}

    pending = list(range(DEDUP_KEYS))
    codes: Counter[str] = Counter()
    # Two requests at a time: 2,000 transactions open at once stay under the per-client cap.
    semaphore = asyncio.Semaphore(2)

    async def send(chunk: list[int]) -> list[int]:
        """One execute-batch of 1,000 keyed executes; the ones to send again (refused, or unknown)."""
        async with semaphore:
            answer = await call(arena.attacker, "POST", url, {"transactions": [execute(i) for i in chunk]})
        assert answer.status == 200, answer.short()
        again = []
        for i, result in zip(chunk, answer.body["results"], strict=True):
            if result.get("committed") is not True:
                codes[result["error"]["code"]] += 1
                again.append(i)
        return again

    committing_started = time.monotonic()
    for _ in range(10):  # rounds: a refused (429) or unknown execute goes again, with its key
        if not pending:
            break
        chunks = [pending[i:i + 1000] for i in range(0, len(pending), 1000)]
        pending = [i for again in await asyncio.gather(*(send(c) for c in chunks)) for i in again]
    assert not pending, f"{len(pending)} keyed executes never committed: {dict(codes)}"
    committing_s = time.monotonic() - committing_started
    storage = await arena.storage()
    assert storage["idempotency_keys"] >= DEDUP_KEYS, storage
    assert (await arena.queue_info("dedup"))["count"] == DEDUP_KEYS
    await arena.bystander.wait_for_progress(what="after 120k keyed commits")

    # The very first key, retried: a duplicate, nothing enqueued twice.
    retried = await call(arena.attacker, "POST", f"{arena.leader_url}/v1/execute", execute(0))
    assert retried.status == 200 and retried.body["duplicate"] is True, retried.short()
    assert (await arena.queue_info("dedup"))["count"] == DEDUP_KEYS
    # ...and through an interactive transaction's commit as well.
    async with arena.bystander.client.transaction() as tx:
        await tx.enqueue("dedup", "v0")
        info = await tx.commit(idempotency_key="dedup-000000")
    assert info.duplicate is True
    assert (await arena.queue_info("dedup"))["count"] == DEDUP_KEYS
    drained = Counter(v.decode() for v in await drain(arena.bystander.client, "dedup", batch=10_000))
    assert drained == Counter(f"v{i}" for i in range(DEDUP_KEYS))
    print(f"\ndedup: {DEDUP_KEYS} keyed commits in {committing_s:.1f} s (retried: {dict(codes)})")
    await arena.check_unharmed()



def node_rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


async def test_an_unauthenticated_raft_frame_of_2_gib_is_refused_on_its_header(arena: Arena) -> None:
    """Anyone who reaches a Raft port may announce a frame: before the peer has proven it knows the
    cluster secret, more than 64 KiB closes the connection with nothing buffered (H13)."""
    for node in (arena.baseline.leader, (arena.baseline.leader + 1) % 3):
        host, port = arena.cluster.nodes[node].raft_address.rsplit(":", 1)
        pid = arena.baseline.pids[node]
        rss_before = node_rss_bytes(pid)
        for announced in ((1 << 31) - 1, -1, 65 * 1024):
            reader, writer = await asyncio.open_connection(host, int(port))
            try:
                writer.write(announced.to_bytes(4, "little", signed=True))  # pysyncobj's 'i' header
                writer.write(b"\0" * 60_000)  # the start of the body the header promised
                await writer.drain()
                try:
                    closed = await asyncio.wait_for(reader.read(1 << 16), CLUSTER_WAIT_S)
                except ConnectionResetError:
                    closed = b""  # closed with our unread body in its buffer: a reset is a close
                assert closed == b"", f"node {node} answered a {announced}-byte frame instead of closing"
            finally:
                writer.close()
                with contextlib.suppress(OSError):
                    await writer.wait_closed()
        assert node_rss_bytes(pid) - rss_before < 32 << 20, "the node buffered what was announced"
        await arena.bystander.wait_for_progress(what="after the frames")
    await arena.check_unharmed()


@pytest.mark.parametrize("own_cluster", [{"log_compaction_entries_min": 1_000_000}], indirect=True)
async def test_digests_of_a_million_items_do_not_stall_replication(arena: Arena) -> None:
    """The digest is computed by a forked child: hammering every node's digest with 1M items queued
    neither stalls commits nor costs the leader its leadership."""
    url = f"{arena.leader_url}/v1/queues/big/enqueue"
    for _ in range(100):  # 1M empty items, 10k per request
        answer = await call(arena.attacker, "POST", url, {"items": [""] * 10_000})
        assert answer.status == 200, answer.short()
    assert (await arena.queue_info("big"))["count"] == 1_000_000
    await asyncio.to_thread(arena.cluster.wait_for_applied, CLUSTER_WAIT_S)
    arena.bystander.slowest_s = 0.0
    commits_before = len(arena.bystander.acked)
    digests: dict[int, set[str]] = {}

    async def hammer(node: int) -> None:
        for _ in range(4):
            answer = await call(arena.attacker, "GET", f"{arena.cluster.url(node)}/v1/cluster/digest")
            assert answer.status == 200, answer.short()
            digests.setdefault(node, set()).add(answer.body["digest"])

    await asyncio.gather(*(hammer(node) for node in range(3)), *(hammer(arena.baseline.leader) for _ in range(2)))
    assert len(arena.bystander.acked) > commits_before, "no commit went through while the digests ran"
    # Before the fork each digest held apply's lock for over a second, and they queued up.
    assert arena.bystander.slowest_s < 1.0, arena.bystander.summary()
    print(f"digests: {sum(len(d) for d in digests.values())} distinct answers; {arena.bystander.summary()}")
    # A purge is one replicated entry, however big the queue: the digests are quick again.
    answer = await call(arena.attacker, "POST", f"{arena.leader_url}/v1/queues/big/purge")
    assert answer.status == 200 and answer.body["removed"] == 1_000_000, answer.short()
    await arena.check_unharmed()
