"""``python -m bench.soak``: fill a cluster's storage budget to the brim, drain it to zero, watch memory.

Starts a fresh local 3-node cluster whose ``storage_bytes_max`` is ``--storage-mib`` (default
256), then:

1. **fill**: ``--producers`` concurrent producers each POST ``--batch`` items of ``--item-bytes``
   bytes per one-request enqueue (``/v1/queues/soak/enqueue``, with an idempotency key) until the
   cluster refuses them (507 ``storage_full``): each producer stops at its first refusal;
2. **drain**: ``--consumers`` concurrent consumers dequeue ``--batch`` items per transaction and
   commit, until the leader's storage holds no item;
3. **settle**: ``--settle-s`` more seconds of sampling with nothing running.

``--cycles N`` repeats fill and drain N times (default 1): memory a node keeps after a drain is
reused by the next fill when it is only the allocator's, and grows cycle after cycle when it leaks.

All along, every ``--interval-s`` (0.5 s), a sampler records the leader's ``/v1/cluster/storage``
(items, storage_bytes) and every node's resident memory (``VmRSS`` of ``/proc/<pid>/status``).
It prints the curve (time, phase, items, storage, RSS per node in MiB), then a summary: peak RSS
per node and RSS at the end, the refused enqueues by status and code, and the items acknowledged
against the items drained. Every item carries its producer and sequence number, so the drain
also proves that no acknowledged item was lost or came out twice, and that no refused one came
out at all. The exit status is 1 when they differ, a phase times out, or a node exited or changed.

The cluster requires tokens, as a production one does: the producers' raw requests, the sampler
and the consumers all send its admin token.

Bounded in time (``--fill-timeout-s``, ``--drain-timeout-s``) and in count (a producer sends at
most what the budget can hold, plus a margin); the cluster is closed and its temporary directory
removed however the run ends.

Must not import: rcq.server (the nodes are separate processes), pysyncobj, lmdb.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import secrets
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp

from rcq.client import RcqClient, RcqError
from rcq.local.cluster import LocalCluster

QUEUE = "soak"
ITEM_OVERHEAD_BYTES = 160  # what the server counts per item besides its bytes (rcq.server.core.state_machine)
REQUEST_TIMEOUT_S = 60.0
ATTEMPTS_MAX = 20  # tries of one enqueue request whose answer was lost (same idempotency key)
SEQUENCE_DIGITS = 10


# ---------------------------------------------------------------------- bookkeeping
@dataclasses.dataclass
class Ledger:
    """What the producers were told, and what the consumers got, item by item.

    An item's value starts with ``PP-SSSSSSSSSS-`` (producer, sequence number), padded to the item
    size. Per producer, ``acked[seq]`` is 1 when a 200 covered the item and ``seen[seq]`` counts
    how often a committed dequeue returned it."""

    producers: int
    acked: list[bytearray] = dataclasses.field(default_factory=list)
    seen: list[bytearray] = dataclasses.field(default_factory=list)
    next_sequence: list[int] = dataclasses.field(default_factory=list)
    acked_count: int = 0
    drained_count: int = 0
    duplicates: int = 0
    strangers: int = 0  # drained items that were never acknowledged (refused, or garbage)
    refusals: Counter[str] = dataclasses.field(default_factory=Counter)  # "507 storage_full" -> count
    errors: Counter[str] = dataclasses.field(default_factory=Counter)  # consumer-side errors

    def __post_init__(self) -> None:
        self.acked = [bytearray() for _ in range(self.producers)]
        self.seen = [bytearray() for _ in range(self.producers)]
        self.next_sequence = [0] * self.producers

    def ack(self, producer: int, first: int, count: int) -> None:
        acked, seen = self.acked[producer], self.seen[producer]
        if len(acked) < first + count:
            acked.extend(bytes(first + count - len(acked)))
            seen.extend(bytes(first + count - len(seen)))
        acked[first:first + count] = b"\x01" * count
        self.acked_count += count

    def drained(self, value: bytes) -> None:
        self.drained_count += 1
        try:
            producer_text, sequence_text, _ = value.split(b"-", 2)
            producer, sequence = int(producer_text), int(sequence_text)
            if not self.acked[producer][sequence]:
                raise IndexError
        except (ValueError, IndexError):
            self.strangers += 1
            return
        if self.seen[producer][sequence]:
            self.duplicates += 1
        self.seen[producer][sequence] = min(255, self.seen[producer][sequence] + 1)

    def missing(self) -> int:
        return sum(1 for p in range(self.producers) for a, s in zip(self.acked[p], self.seen[p], strict=True)
                   if a and not s)


def item_value(producer: int, sequence: int, item_bytes: int) -> str:
    head = f"{producer:02d}-{sequence:0{SEQUENCE_DIGITS}d}-"
    return head.ljust(item_bytes, "x")[:max(item_bytes, len(head))]


# ---------------------------------------------------------------------- the nodes
def rss_mib(pid: int) -> float | None:
    """Resident memory of a process (VmRSS), MiB; None when it is gone."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


@dataclasses.dataclass
class Sample:
    t_s: float
    cycle: int
    phase: str
    items: int | None
    storage_bytes: int | None
    rss_mib: dict[int, float | None]


@dataclasses.dataclass
class Cycle:
    number: int
    fill_s: float
    acked: int
    full: dict[str, Any]  # the leader's /v1/cluster/storage once the producers were refused
    drain_s: float = float("nan")
    drained: int = 0


@dataclasses.dataclass
class Run:
    cluster: LocalCluster
    leader_url: str
    pids: dict[int, int]
    started: float
    cycle: int = 1
    phase: str = "start"
    samples: list[Sample] = dataclasses.field(default_factory=list)
    last_storage: dict[str, Any] = dataclasses.field(default_factory=dict)

    async def storage(self, session: aiohttp.ClientSession) -> dict[str, Any]:
        async with session.get(f"{self.leader_url}/v1/cluster/storage",
                               timeout=aiohttp.ClientTimeout(total=10)) as response:
            body = await response.json()
        if response.status != 200:
            raise RuntimeError(f"GET /v1/cluster/storage: HTTP {response.status} {body}")
        self.last_storage = dict(body)
        return self.last_storage

    async def sample_forever(self, session: aiohttp.ClientSession, interval_s: float) -> None:
        next_at = time.monotonic()
        while True:
            storage: dict[str, Any] = {}
            with contextlib.suppress(aiohttp.ClientError, TimeoutError, RuntimeError):
                storage = await self.storage(session)
            sample = Sample(round(time.monotonic() - self.started, 2), self.cycle, self.phase, storage.get("items"),
                            storage.get("storage_bytes"), {i: rss_mib(pid) for i, pid in self.pids.items()})
            self.samples.append(sample)
            print_sample(sample, self.pids)
            next_at += interval_s
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))  # the sampling period


# ---------------------------------------------------------------------- fill and drain
async def produce(run: Run, session: aiohttp.ClientSession, ledger: Ledger, producer: int,
                  args: argparse.Namespace, requests_max: int) -> None:
    """One-request enqueues of ``args.batch`` items until refused; each keyed, so a lost answer is
    asked again without enqueueing twice."""
    url = f"{run.leader_url}/v1/queues/{QUEUE}/enqueue"
    sequence = ledger.next_sequence[producer]
    for _ in range(requests_max):
        values = [item_value(producer, sequence + i, args.item_bytes) for i in range(args.batch)]
        body = json.dumps({"items": values, "idempotency_key": secrets.token_hex(16)}).encode()
        for _attempt in range(ATTEMPTS_MAX):
            try:
                async with session.post(url, data=body, headers={"Content-Type": "application/json"},
                                        timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)) as response:
                    answer = await response.json()
                    status = response.status
            except (aiohttp.ClientError, TimeoutError):
                continue  # maybe applied: the same key again
            if status in (502, 503, 504):
                await asyncio.sleep(0.2)  # back-off before asking again with the same key
                continue
            break
        else:
            raise RuntimeError(f"producer {producer}: no definite answer after {ATTEMPTS_MAX} attempts")
        if status == 200:
            ledger.ack(producer, sequence, args.batch)
            sequence += args.batch
            ledger.next_sequence[producer] = sequence
            continue
        error = answer.get("error", {}) if isinstance(answer, dict) else {}
        ledger.refusals[f"{status} {error.get('code')}"] += 1
        return  # refused (storage_full expected): this producer is done
    raise RuntimeError(f"producer {producer}: {requests_max} requests and never refused; is the budget set?")


async def consume(run: Run, client: RcqClient, ledger: Ledger, args: argparse.Namespace,
                  session: aiohttp.ClientSession) -> None:
    """Transactions of up to ``args.batch`` dequeues, committed, until the leader holds no item."""
    while True:
        try:
            async with client.transaction(timeout_s=60) as tx:
                values = await tx.dequeue_batch(QUEUE, args.batch, wait_ms=100)
        except RcqError as exc:
            ledger.errors[exc.code] += 1  # not committed: the items went back, a later dequeue takes them
            continue
        for value in values:
            ledger.drained(value)
        if not values and (await run.storage(session))["items"] == 0:
            return


async def soak(args: argparse.Namespace, cluster: LocalCluster) -> int:
    leader = await asyncio.to_thread(cluster.wait_for_leader, 60)
    await asyncio.to_thread(cluster.wait_for_applied, 60)
    before = cluster.status(leader)
    run = Run(cluster, cluster.url(leader), cluster.pids(), time.monotonic())
    ledger = Ledger(args.producers)
    budget = args.storage_mib << 20
    per_item = args.item_bytes + ITEM_OVERHEAD_BYTES
    requests_max = budget // (per_item * args.batch) + 10  # each producer; it could take all the room
    connector = aiohttp.TCPConnector(limit=0)
    cycles: list[Cycle] = []
    async with aiohttp.ClientSession(connector=connector, headers=cluster.auth_headers()) as session, \
            RcqClient(cluster.urls, request_timeout_s=REQUEST_TIMEOUT_S, retry_timeout_s=30,
                      **cluster.client_options()) as client:
        print_header(run.pids, cluster)
        sampler = asyncio.get_running_loop().create_task(run.sample_forever(session, args.interval_s))
        try:
            for cycle in range(1, args.cycles + 1):
                run.cycle = cycle
                run.phase = "fill"
                acked_before, began = ledger.acked_count, time.monotonic()
                await asyncio.wait_for(asyncio.gather(*(produce(run, session, ledger, p, args, requests_max)
                                                        for p in range(args.producers))), args.fill_timeout_s)
                figures = Cycle(cycle, fill_s=time.monotonic() - began, acked=ledger.acked_count - acked_before,
                                full=await run.storage(session))
                run.phase = "drain"
                drained_before, began = ledger.drained_count, time.monotonic()
                await asyncio.wait_for(asyncio.gather(*(consume(run, client, ledger, args, session)
                                                        for _ in range(args.consumers))), args.drain_timeout_s)
                figures.drain_s = time.monotonic() - began
                figures.drained = ledger.drained_count - drained_before
                cycles.append(figures)
            run.phase = "settle"
            await asyncio.sleep(args.settle_s)  # sampling only: what memory does with nothing to do
        finally:
            sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sampler
        end = await run.storage(session)
    after = cluster.status(leader)
    undisturbed = (cluster.pids() == run.pids and not cluster.unexpected_exits()
                   and (after["term"], after["role"]) == (before["term"], "leader"))
    ok = print_summary(args, run, ledger, cycles, end, undisturbed, before, after)
    if args.json is not None:
        args.json.write_text(json.dumps({
            "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
            "cycles": [dataclasses.asdict(c) for c in cycles], "storage_end": end,
            "acked": ledger.acked_count, "drained": ledger.drained_count, "duplicates": ledger.duplicates,
            "strangers": ledger.strangers, "refusals": dict(ledger.refusals), "consumer_errors": dict(ledger.errors),
            "samples": [dataclasses.asdict(s) for s in run.samples], "ok": ok}, indent=2))
    return 0 if ok else 1


# ---------------------------------------------------------------------- printing
def print_header(pids: dict[int, int], cluster: LocalCluster) -> None:
    nodes = "  ".join(f"{cluster.nodes[i].node_id + ' MiB':>12}" for i in pids)
    print(f"{'t_s':>7}  {'cycle':>5}  {'phase':<6}  {'items':>9}  {'storage MiB':>11}  {nodes}", flush=True)


def print_sample(sample: Sample, pids: dict[int, int]) -> None:
    items = "?" if sample.items is None else str(sample.items)
    storage = "?" if sample.storage_bytes is None else f"{sample.storage_bytes / 2**20:.1f}"
    rss = "  ".join(f"{'gone' if sample.rss_mib[i] is None else f'{sample.rss_mib[i]:.1f}':>12}" for i in pids)
    print(f"{sample.t_s:>7.1f}  {sample.cycle:>5}  {sample.phase:<6}  {items:>9}  {storage:>11}  {rss}", flush=True)


def print_summary(args: argparse.Namespace, run: Run, ledger: Ledger, cycles: list[Cycle], end: dict[str, Any],
                  undisturbed: bool, before: dict[str, Any], after: dict[str, Any]) -> bool:
    missing = ledger.missing()
    balanced = (ledger.acked_count == ledger.drained_count and not missing and not ledger.duplicates
                and not ledger.strangers)
    names = {i: run.cluster.nodes[i].node_id + (" (leader)" if run.leader_url == run.cluster.url(i) else "")
             for i in run.pids}
    print("\nsummary")
    print(f"  budget {args.storage_mib} MiB, items of {args.item_bytes} B (+{ITEM_OVERHEAD_BYTES} B counted each), "
          f"{args.producers} producers x {args.batch} items/request, {args.consumers} consumers, "
          f"{args.cycles} cycle(s)")
    for c in cycles:
        full = c.full
        print(f"  cycle {c.number}: fill {c.acked} items acknowledged in {c.fill_s:.1f} s ({c.acked / c.fill_s:.0f}/s), "
              f"full at {full['storage_bytes'] / 2**20:.1f} of {full['storage_bytes_max'] / 2**20:.0f} MiB "
              f"({full['storage_bytes'] / full['storage_bytes_max']:.3%}); drain {c.drained} items in "
              f"{c.drain_s:.1f} s ({c.drained / c.drain_s:.0f}/s)")
        in_cycle = [s for s in run.samples if s.cycle == c.number and s.phase in ("fill", "drain")]
        for i in run.pids:
            values = [v for s in in_cycle if (v := s.rss_mib.get(i)) is not None]
            if values:
                print(f"    {names[i]:<18} RSS MiB: start {values[0]:.1f}, peak {max(values):.1f}, "
                      f"end of drain {values[-1]:.1f}")
    print(f"  refused enqueues (status and code): {dict(ledger.refusals)}")
    print(f"  consumer errors: {dict(ledger.errors) or 'none'}")
    print(f"  at the end: {end['items']} items, {end['storage_bytes']} storage bytes")
    print(f"  acknowledged {ledger.acked_count} vs drained {ledger.drained_count}: "
          f"{'EQUAL' if balanced else 'DIFFERENT'} (missing {missing}, duplicates {ledger.duplicates}, "
          f"never acknowledged {ledger.strangers})")
    print("  RSS MiB per node over the run (start -> peak -> end):")
    for i, pid in run.pids.items():
        values = [v for s in run.samples if (v := s.rss_mib.get(i)) is not None]
        if values:
            print(f"    {names[i]:<18} pid {pid}: {values[0]:.1f} -> {max(values):.1f} -> {values[-1]:.1f}")
    print(f"  nodes: {'same pids, no exit, same leader and term' if undisturbed else 'DISTURBED'} "
          f"(term {before['term']} -> {after['term']}, exits {run.cluster.unexpected_exits() or 'none'})")
    return balanced and undisturbed and end["items"] == 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__.split("\n\n")[0])
    parser.add_argument("--storage-mib", type=int, default=256, help="the nodes' storage_bytes_max, MiB")
    parser.add_argument("--item-bytes", type=int, default=100)
    parser.add_argument("--batch", type=int, default=1000, help="items per enqueue request and per dequeue")
    parser.add_argument("--producers", type=int, default=4)
    parser.add_argument("--consumers", type=int, default=4)
    parser.add_argument("--cycles", type=int, default=1, help="fill and drain this many times")
    parser.add_argument("--interval-s", type=float, default=0.5, help="sampling period")
    parser.add_argument("--settle-s", type=float, default=3.0, help="sampling after the drain")
    parser.add_argument("--fill-timeout-s", type=float, default=300.0)
    parser.add_argument("--drain-timeout-s", type=float, default=300.0)
    parser.add_argument("--json", type=Path, help="also write the samples and summary to this file")
    args = parser.parse_args(argv)
    if args.item_bytes < SEQUENCE_DIGITS + 4 or min(args.batch, args.producers, args.consumers, args.cycles) < 1:
        parser.error(f"--item-bytes must be at least {SEQUENCE_DIGITS + 4}; --batch, --producers, "
                     "--consumers and --cycles at least 1")
    if args.storage_mib < 1 or args.producers > 99:
        parser.error("--storage-mib must be at least 1 and --producers at most 99")
    cluster = LocalCluster(3, log_level="WARNING", node_overrides={"storage_bytes_max": args.storage_mib << 20})
    with cluster:
        print(f"cluster of 3 nodes in {cluster.base_dir}, storage_bytes_max {args.storage_mib} MiB", flush=True)
        try:
            return asyncio.run(soak(args, cluster))
        except TimeoutError:
            print("a phase did not finish within its timeout", file=sys.stderr)
            return 1


if __name__ == "__main__":
    sys.exit(main())
