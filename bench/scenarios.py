"""The benchmark's workload: the cluster under test (:class:`Target`), the scenarios, and one
scenario's run with its figures; shared by ``python -m bench`` and ``python -m bench.spark``.

Must not import: pysyncobj, lmdb, rcq.server (the bench talks to rcq as a user does).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import ssl
import threading
import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from rcq.client import RcqClient, SyncClient
from rcq.local.cluster import LocalCluster

ITEM_100_BYTES = b"x" * 100
# What an OpenTelemetry producer puts on an item: a W3C traceparent (55 bytes) and a tracestate.
TRACE_HEADERS = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
                 "tracestate": "rcq=bench"}
PREFILL_BATCH_ITEMS = 1000


@dataclass(frozen=True)
class Target:
    """The cluster under test as its clients see it: its URLs, the token they send and the CA
    file they verify HTTPS against (None: no token; the system's CAs), and whether its clients
    use the session channel (the client's default) or one HTTP request per operation."""

    urls: list[str]
    token: str | None = None
    ca_file: str | None = None
    security: str = "(the cluster's own)"  # what the figures were measured with
    channel: bool = True

    @classmethod
    def of(cls, cluster: LocalCluster) -> Target:
        return cls(cluster.urls, **cluster.client_options(), security=security_label(cluster.auth, cluster.tls))

    @classmethod
    def from_environment(cls, urls: list[str]) -> Target:
        return cls(urls, os.environ.get("RCQ_TOKEN") or None, os.environ.get("RCQ_CA_FILE") or None)

    @property
    def transport(self) -> str:
        return "channel" if self.channel else "http"

    def client(self, urls: list[str] | None = None, **options: Any) -> RcqClient:
        return RcqClient(self.urls if urls is None else urls, token=self.token, ca_file=self.ca_file,
                         **{"channel": self.channel, **options})

    def session(self) -> aiohttp.ClientSession:
        """Raw HTTP to the nodes, with the token and the CA."""
        ssl_context: ssl.SSLContext | bool = ssl.create_default_context(cafile=self.ca_file) if self.ca_file else True
        return aiohttp.ClientSession(headers={"Authorization": f"Bearer {self.token}"} if self.token else None,
                                     connector=aiohttp.TCPConnector(ssl=ssl_context))


def security_label(auth: bool, tls: bool) -> str:
    return "+".join([*(["token"] if auth else []), *(["tls"] if tls else [])]) or "none"


@dataclass
class Figures:
    scenario: str
    callers: str
    concurrency: int
    duration_s: float
    transactions: int
    items: int
    errors: int
    latencies_ms: list[float] = field(default_factory=list, repr=False)
    error_codes: dict[str, int] = field(default_factory=dict)  # error code (or class) -> count

    @property
    def transactions_per_s(self) -> float:
        return self.transactions / self.duration_s if self.duration_s else 0.0

    @property
    def items_per_s(self) -> float:
        return self.items / self.duration_s if self.duration_s else 0.0

    def percentile_ms(self, q: float) -> float:
        if not self.latencies_ms:
            return float("nan")
        ordered = sorted(self.latencies_ms)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    def record(self, began: float, moved: int) -> None:
        """One transaction done: it began at ``began`` (perf_counter) and moved ``moved`` items."""
        self.latencies_ms.append((time.perf_counter() - began) * 1000)
        self.transactions += 1
        self.items += moved

    def record_error(self, exc: BaseException) -> None:
        self.errors += 1
        code = getattr(exc, "code", type(exc).__name__)
        self.error_codes[code] = self.error_codes.get(code, 0) + 1

    def row(self) -> dict[str, Any]:
        return {"scenario": self.scenario, "callers": self.callers, "concurrency": self.concurrency,
                "tx_per_s": round(self.transactions_per_s), "items_per_s": round(self.items_per_s),
                "p50_ms": round(self.percentile_ms(0.50), 1), "p99_ms": round(self.percentile_ms(0.99), 1),
                "errors": self.errors, **({"error_codes": dict(self.error_codes)} if self.error_codes else {})}


Operation = Callable[[RcqClient, str], Awaitable[int]]  # returns items moved; raises on failure


async def _enqueue_one(client: RcqClient, queue: str) -> int:
    await client.enqueue(queue, ITEM_100_BYTES)
    return 1


async def _dequeue_one(client: RcqClient, queue: str) -> int:
    return len(await client.dequeue(queue))


async def _enqueue_one_with_headers(client: RcqClient, queue: str) -> int:
    await client.enqueue(queue, ITEM_100_BYTES, headers=TRACE_HEADERS)
    return 1


async def _dequeue_one_items(client: RcqClient, queue: str) -> int:
    """A dequeue that decodes whole items (their headers too), as a traced consumer does."""
    return len(await client.dequeue_items(queue))


def _enqueue_one_sync(client: SyncClient, queue: str) -> int:
    client.enqueue(queue, ITEM_100_BYTES)
    return 1


def _dequeue_one_sync(client: SyncClient, queue: str) -> int:
    return len(client.dequeue(queue))


async def _session(client: RcqClient, queue: str) -> int:
    async with client.transaction() as transaction:
        return 1 if await transaction.dequeue(queue) is not None else 0


async def enqueue_hundred(client: RcqClient, queue: str) -> int:
    await client.enqueue(queue, *[ITEM_100_BYTES] * 100)
    return 100


async def dequeue_hundred(client: RcqClient, queue: str) -> int:
    async with client.transaction() as transaction:
        return len(await transaction.dequeue_batch(queue, 100))


POISON = b"P" * 100  # a consumer that gets this aborts: it dies after max_deliveries deliveries
POISON_EVERY = 10  # 10% of the items of the poison scenario
POISON_MAX_DELIVERIES = 3
PRIORITIES = 3


async def _session_poison(client: RcqClient, queue: str) -> int:
    """A consumer that cannot process poison items: it aborts them (they die at max_deliveries)."""
    transaction = await client.begin()
    items = await transaction.dequeue_items(queue, 1)
    if items and items[0].value == POISON:
        await transaction.abort()
        return 0
    await transaction.commit()
    return len(items)


SCENARIOS: dict[str, tuple[Operation, int]] = {  # name -> (operation, items it needs queued)
    "enqueue-1": (_enqueue_one, 0),
    "dequeue-1": (_dequeue_one, 1),
    "session": (_session, 1),
    "enqueue-100": (enqueue_hundred, 0),
    "dequeue-100": (dequeue_hundred, 100),
    # The session scenario on queues with settings (docs/queue-features.md): delivery counts
    # replicated at each dequeue (max_deliveries), 10% poison items, 3 priorities.
    "session-limited": (_session, 1),
    "session-poison": (_session_poison, 1),
    "session-priority": (_session, 1),
    # Item headers (feature level 2): a traceparent and a tracestate on every item.
    "enqueue-1-headers": (_enqueue_one_with_headers, 0),
    "dequeue-1-headers": (_dequeue_one_items, 1),
}
# The synchronous client (rcq.client.SyncClient): caller threads instead of tasks, each with a
# client of its own ("separate") or all sharing one ("coalesced"), as WSGI worker threads would.
SYNC_SCENARIOS: dict[str, tuple[Callable[[SyncClient, str], int], int]] = {
    "enqueue-1-sync": (_enqueue_one_sync, 0),
    "dequeue-1-sync": (_dequeue_one_sync, 1),
}
HEADER_SCENARIOS = frozenset({"enqueue-1-headers", "dequeue-1-headers"})
# Scenarios whose queue has settings: name -> configure_queue arguments
QUEUE_SETTINGS: dict[str, dict[str, Any]] = {
    "session-limited": {"max_deliveries": POISON_MAX_DELIVERIES},
    "session-poison": {"max_deliveries": POISON_MAX_DELIVERIES},
    "session-priority": {"max_priority": PRIORITIES - 1},
}


async def prefill(target: Target, queue: str, items: int, scenario: str = "") -> None:
    async with target.client(coalesce=True) as client:
        if scenario in HEADER_SCENARIOS:
            await client.raise_feature_level()  # headers need level 2 (a new cluster raises it within seconds)
        if scenario in QUEUE_SETTINGS:
            await client.configure_queue(queue, **QUEUE_SETTINGS[scenario])
        batches = [min(PREFILL_BATCH_ITEMS, items - start) for start in range(0, items, PREFILL_BATCH_ITEMS)]
        for start in range(0, len(batches), 16):
            await asyncio.gather(*(_prefill_batch(client, queue, n, scenario, position)
                                   for position, n in enumerate(batches[start:start + 16], start)))


async def _prefill_batch(client: RcqClient, queue: str, count: int, scenario: str, position: int) -> None:
    if scenario == "session-poison":
        await client.enqueue(queue, *[POISON if i % POISON_EVERY == 0 else ITEM_100_BYTES for i in range(count)])
    elif scenario == "session-priority":
        await client.enqueue(queue, *[ITEM_100_BYTES] * count, priority=position % PRIORITIES)
    elif scenario in HEADER_SCENARIOS:
        await client.enqueue(queue, *[ITEM_100_BYTES] * count, headers=TRACE_HEADERS)
    else:
        await client.enqueue(queue, *[ITEM_100_BYTES] * count)


async def run_scenario(target: Target, name: str, callers: str, concurrency: int, duration_s: float,
                       expected_tx_per_s: float,
                       window: Callable[[], AbstractAsyncContextManager[None]] | None = None) -> Figures:
    """One scenario; ``window`` (``bench.cpu``'s, say) wraps the callers' run alone: neither the
    prefill nor the clients' set-up and closing."""
    if name in SYNC_SCENARIOS:
        return await _run_sync_scenario(target, name, callers, concurrency, duration_s, expected_tx_per_s, window)
    operation, items_per_tx = SCENARIOS[name]
    queue = f"bench-{name}-{callers}-{int(time.time() * 1000)}"
    if items_per_tx or name in HEADER_SCENARIOS:  # enough for the whole run, from the rate so far, with a margin
        await prefill(target, queue, int(expected_tx_per_s * duration_s * 1.5 * items_per_tx) + 1000 * items_per_tx,
                      name)
    shared = target.client(coalesce=True) if callers == "coalesced" else None
    clients = [shared] * concurrency if shared else [target.client() for _ in range(concurrency)]
    figures = Figures(name, callers, concurrency, duration_s, 0, 0, 0)

    async def caller(client: RcqClient, stop_at: float) -> None:
        while time.monotonic() < stop_at:
            began = time.perf_counter()
            try:
                moved = await operation(client, queue)
            except Exception as exc:
                figures.record_error(exc)
                continue
            figures.record(began, moved)

    try:
        await _measured(figures, duration_s, window, lambda stop_at: [caller(c, stop_at) for c in clients])
    finally:
        for client in {id(c): c for c in clients}.values():
            await client.close()
    return figures


async def _run_sync_scenario(target: Target, name: str, callers: str, concurrency: int, duration_s: float,
                             expected_tx_per_s: float,
                             window: Callable[[], AbstractAsyncContextManager[None]] | None) -> Figures:
    """A SYNC_SCENARIOS scenario: ``concurrency`` caller threads, each looping on the sync client."""
    operation, items_per_tx = SYNC_SCENARIOS[name]
    queue = f"bench-{name}-{callers}-{int(time.time() * 1000)}"
    if items_per_tx:
        await prefill(target, queue, int(expected_tx_per_s * duration_s * 1.5 * items_per_tx) + 1000)

    def sync_client(coalesce: bool = False) -> SyncClient:
        return SyncClient(target.urls, coalesce=coalesce, token=target.token, ca_file=target.ca_file,
                          channel=target.channel)

    shared = sync_client(coalesce=True) if callers == "coalesced" else None
    clients = [shared] * concurrency if shared else [sync_client() for _ in range(concurrency)]
    figures = Figures(name, callers, concurrency, duration_s, 0, 0, 0)
    lock = threading.Lock()

    def caller(client: SyncClient, stop_at: float) -> None:
        while time.monotonic() < stop_at:
            began = time.perf_counter()
            try:
                moved = operation(client, queue)
            except Exception as exc:
                with lock:
                    figures.record_error(exc)
                continue
            with lock:
                figures.record(began, moved)

    try:
        await _measured(figures, duration_s, window,
                        lambda stop_at: [asyncio.to_thread(caller, c, stop_at) for c in clients])
    finally:
        for client in {id(c): c for c in clients}.values():
            await asyncio.to_thread(client.close)
    return figures


async def _measured(figures: Figures, duration_s: float, window: Callable[[], AbstractAsyncContextManager[None]] | None,
                    callers: Callable[[float], list[Awaitable[None]]]) -> None:
    """Run the callers (given when to stop) for ``duration_s`` inside ``window``; the duration
    they really ran goes into ``figures``."""
    async with window() if window is not None else contextlib.nullcontext():
        started = time.monotonic()
        try:
            await asyncio.gather(*callers(started + duration_s))
        finally:
            figures.duration_s = time.monotonic() - started


def fresh_cluster(nodes: int, durability: str = "fsync", *, auth: bool = True, tls: bool = False) -> LocalCluster:
    cluster = LocalCluster(nodes, log_level="WARNING", node_overrides={"durability": durability}, auth=auth, tls=tls)
    try:
        cluster.start()
        cluster.wait_for_leader(60)
    except BaseException:
        cluster.close()
        raise
    return cluster
