"""``python -m bench``: throughput, latency, failover and memory figures of a cluster.

Starts a fresh local cluster (3 nodes by default) or targets ``--urls``, runs
each scenario for ``--duration-s`` with ``--concurrency`` concurrent callers,
and prints committed transactions/s, items/s and p50/p99 commit latency.
Every scenario uses its own queue. "separate" callers each have their own
client and connections; "coalesced" callers share one client with
``coalesce=True``, so their requests share HTTP requests and Raft entries.

``--durability fsync os`` runs the scenarios on a fresh cluster per setting and prints
them side by side; the machine's raw fdatasync rate is printed first.

Security: a fresh cluster requires API tokens, as a production one does, and every client
sends its admin token. ``--tls`` adds HTTPS (certificates of a CA made for the cluster) and
``--no-auth`` drops the tokens, so the cost of either shows as the difference between two
runs' rows (their ``security`` column says which is which). Against ``--urls``, the clients
send ``$RCQ_TOKEN`` and verify HTTPS against ``$RCQ_CA_FILE`` (or the system's CAs).

Transport: the clients use the session channel, the client's default; with ``--http`` they send
one HTTP request per operation (the ``transport`` column says which).

Scenarios: enqueue-1, dequeue-1, session, enqueue-100, dequeue-100 (each in
both caller modes), failover (local clusters only: kill -9 the leader,
time to a serving new leader and to the first commit after it) and memory
(``--memory-items`` 100-byte items on a fresh cluster of their own: RSS per
node, then a forced snapshot while a probe measures the longest commit and
/healthz stall).

``--cpu`` adds CPU per transaction by process (the leader, each follower, the bench itself) and
commits per Raft entry, measured around each scenario's run (:mod:`bench.cpu`).

The scenarios and their figures live in :mod:`bench.scenarios`; this module adds failover,
memory and the command line.

Must not import: pysyncobj, lmdb, rcq.server (the bench talks to rcq as a user does).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from bench.cpu import CpuWatch, local_pids, print_cpu_table
from bench.scenarios import ITEM_100_BYTES, SCENARIOS, SYNC_SCENARIOS, Target, fresh_cluster, prefill, run_scenario
from rcq.local.cluster import LocalCluster


# ------------------------------------------------------------------ failover
async def _serving_leader(session: aiohttp.ClientSession, urls: list[str]) -> str | None:
    async def ask(url: str) -> str | None:
        try:
            async with session.get(f"{url}/v1/cluster", timeout=aiohttp.ClientTimeout(total=0.3)) as response:
                body = await response.json()
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return None
        return url if body.get("role") == "leader" and body.get("serving") else None

    found = [u for u in await asyncio.gather(*(ask(u) for u in urls)) if u]
    return found[0] if found else None


FREEZE_S = 6.0  # how long a frozen leader stays frozen: longer than an election


async def measure_failover(cluster: LocalCluster, trials: int, modes: tuple[str, ...] = ("kill", "freeze")
                           ) -> list[dict[str, Any]]:
    """Failover as clients see it: a client (given every node's URL) commits one-request enqueues
    back to back; the leader is killed (kill -9) or frozen (SIGSTOP for FREEZE_S); reported: when a
    new leader serves, and when the client's first commit after the fault succeeded (from the fault,
    and from the election)."""
    results = []
    async with Target.of(cluster).session() as session:
        for mode in modes:
            for _ in range(trials):
                results.append(await _one_failover(cluster, session, mode))
    return results


async def _one_failover(cluster: LocalCluster, session: aiohttp.ClientSession, mode: str) -> dict[str, Any]:
    leader = await asyncio.to_thread(cluster.wait_for_leader, 60)
    survivors = [cluster.url(i) for i in cluster.live_indices() if i != leader]
    commits: list[tuple[float, str | None]] = []  # when a commit was answered, and by which node
    stop = asyncio.Event()
    async with Target.of(cluster).client(retry_timeout_s=60) as client:
        async def produce() -> None:
            while not stop.is_set():
                await client.enqueue("bench-failover", b"x")
                commits.append((time.monotonic(), client.leader_url))

        producer = asyncio.create_task(produce())
        while len(commits) < 20:
            await asyncio.sleep(0.01)
        fault_at = time.monotonic()
        if mode == "kill":
            cluster.kill_node(leader)
        else:
            cluster.pause_node(leader)
        elected_at = None
        while elected_at is None and time.monotonic() - fault_at < 30:
            if await _serving_leader(session, survivors):
                elected_at = time.monotonic()
            else:
                await asyncio.sleep(0.01)
        # The first commit answered by another node: one answered by the old leader just after the
        # fault was already replicated before it.
        old_url = cluster.url(leader)

        def first_elsewhere() -> float | None:
            return min((t for t, url in commits if t > fault_at and url != old_url), default=None)

        while first_elsewhere() is None and time.monotonic() - fault_at < 60:
            await asyncio.sleep(0.01)
        first_commit = first_elsewhere() or float("nan")
        if mode == "freeze":
            await asyncio.sleep(max(0.0, fault_at + FREEZE_S - time.monotonic()))
            cluster.resume_node(leader)
        stop.set()
        await producer
    if mode == "kill":
        await asyncio.to_thread(cluster.start_node, leader)
    await asyncio.to_thread(cluster.wait_for_applied, 60)
    elected_s = (elected_at - fault_at) if elected_at is not None else float("nan")
    return {"mode": mode, "serving_leader_s": round(elected_s, 3),
            "first_commit_s": round(first_commit - fault_at, 3),
            "first_commit_after_election_s": round(first_commit - elected_at, 3) if elected_at else float("nan")}


# -------------------------------------------------------------------- memory
def rss_mib(pid: int) -> float:
    """Resident set of a process and its children (a snapshot child counts while it runs)."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


async def measure_memory(cluster: LocalCluster, items: int) -> dict[str, Any]:
    queue = "bench-memory"
    started = time.monotonic()
    await prefill(Target.of(cluster), queue, items)
    fill_s = time.monotonic() - started
    await asyncio.to_thread(cluster.wait_for_applied, 120)
    rss_before = {cluster.nodes[i].node_id: round(rss_mib(pid), 1) for i, pid in cluster.pids().items()}
    leader = await asyncio.to_thread(cluster.wait_for_leader, 60)
    stalls = await _snapshot_stalls(cluster, leader)
    rss_after = {cluster.nodes[i].node_id: round(rss_mib(pid), 1) for i, pid in cluster.pids().items()}
    return {"items": items, "item_bytes": len(ITEM_100_BYTES), "security": Target.of(cluster).security,
            "fill_s": round(fill_s, 1),
            "fill_items_per_s": round(items / fill_s), "rss_mib_after_fill": rss_before,
            "rss_mib_after_snapshot": rss_after, **stalls}


async def _snapshot_stalls(cluster: LocalCluster, leader: int) -> dict[str, Any]:
    """Force a snapshot on the leader while probes commit and ask /healthz back to back."""
    url = cluster.url(leader)
    commit_ms: list[float] = []
    health_ms: list[float] = []
    done = asyncio.Event()

    target = Target.of(cluster)
    async with target.client([url]) as client, target.session() as session:
        async def probe_commits() -> None:
            while not done.is_set():
                began = time.perf_counter()
                await client.enqueue("bench-probe", b"p")
                commit_ms.append((time.perf_counter() - began) * 1000)

        async def probe_health() -> None:
            while not done.is_set():
                began = time.perf_counter()
                async with session.get(f"{url}/healthz") as response:
                    await response.read()
                health_ms.append((time.perf_counter() - began) * 1000)
                await asyncio.sleep(0.005)

        probes = [asyncio.ensure_future(probe_commits()), asyncio.ensure_future(probe_health())]
        await asyncio.sleep(1.0)  # baseline
        baseline_commit = max(commit_ms, default=float("nan"))
        before = (await client.cluster(url))["snapshot_count"]
        async with session.post(f"{url}/v1/admin/snapshot") as response:
            await response.read()
        snapshot_started = time.monotonic()
        while (await client.cluster(url))["snapshot_count"] == before and time.monotonic() - snapshot_started < 120:
            await asyncio.sleep(0.05)
        snapshot_s = time.monotonic() - snapshot_started
        await asyncio.sleep(0.5)
        done.set()
        await asyncio.gather(*probes, return_exceptions=True)
    snapshot_file = cluster.nodes[leader].data_dir / "raft.snapshot.lmdb"
    return {"snapshot_s": round(snapshot_s, 2),
            "snapshot_file_mib": round(snapshot_file.stat().st_size / 2**20, 1) if snapshot_file.exists() else None,
            "baseline_commit_max_ms": round(baseline_commit, 1),
            "commit_max_ms_during_snapshot": round(max(commit_ms, default=float("nan")), 1),
            "healthz_max_ms_during_snapshot": round(max(health_ms, default=float("nan")), 1),
            "commit_p50_ms": round(statistics.median(commit_ms), 1) if commit_ms else None}


# ---------------------------------------------------------------------- main
def print_table(rows: list[dict[str, Any]]) -> None:
    columns = ["durability", "security", "transport", "scenario", "callers", "concurrency", "tx_per_s", "items_per_s",
               "p50_ms", "p99_ms", "errors"]
    widths = {c: max(len(c), *(len(str(r[c])) for r in rows)) for c in columns}
    print("  ".join(c.rjust(widths[c]) for c in columns))
    for row in rows:
        print("  ".join(str(row[c]).rjust(widths[c]) for c in columns), flush=True)


def node_pids(args: argparse.Namespace, cluster: LocalCluster | None, urls: list[str]) -> dict[str, int]:
    """For ``--cpu``: URL -> PID of each node (the local cluster's, ``--cpu-pids``, or found by port)."""
    if cluster is not None:
        return {cluster.url(i): pid for i, pid in cluster.pids().items()}
    if args.cpu_pids:
        return dict(zip(urls, args.cpu_pids, strict=True))
    return local_pids(urls)


async def run(args: argparse.Namespace, cluster: LocalCluster | None, durability: str) -> dict[str, Any]:
    target = Target.of(cluster) if cluster is not None else Target.from_environment(args.urls.split(","))
    target = dataclasses.replace(target, channel=not args.http)
    urls = target.urls
    async with target.client() as client:
        await client.wait_for_leader(60)
    report: dict[str, Any] = {"config": {
        "nodes": len(urls), "concurrency": args.concurrency, "duration_s": args.duration_s,
        "python": platform.python_version(), "cpus": os.cpu_count(), "target": "local" if cluster else urls,
        "security": target.security, "transport": target.transport}}
    rows = []
    rates: dict[str, float] = {}
    for name in [s for s in [*SCENARIOS, *SYNC_SCENARIOS] if s in args.scenarios]:
        for callers in args.callers:
            single = ("dequeue-1", "session", "dequeue-1-headers", "dequeue-1-sync")
            producer = "enqueue-1" if name in single or name.startswith("session-") else "enqueue-100"
            expected = rates.get(f"{producer}/{callers}", 2000.0)
            watch = CpuWatch(target, node_pids(args, cluster, urls)) if args.cpu else None
            figures = await run_scenario(target, name, callers, args.concurrency, args.duration_s, expected,
                                         window=watch.window if watch else None)
            rates[f"{name}/{callers}"] = figures.transactions_per_s
            rows.append({"durability": durability, "security": target.security, "transport": target.transport,
                         **figures.row()})
            print_table(rows[-1:]) if len(rows) == 1 else print(
                "  ".join(str(v) for v in rows[-1].values()), flush=True)
            if watch is not None:
                rows[-1]["cpu"] = watch.per_transaction(figures.transactions)
                print_cpu_table(rows[-1:])
    report["throughput"] = rows
    if rows:
        print()
        print_table(rows)
        print_cpu_table(rows)
    if cluster is not None and "failover" in args.scenarios:
        report["failover"] = await measure_failover(cluster, args.failover_trials)
        print("\nfailover (kill -9, and SIGSTOP for 6 s, of the leader):", flush=True)
        for row in report["failover"]:
            print("  " + json.dumps(row), flush=True)
    return report


def raw_fsync_rate(writes: int = 200) -> dict[str, float]:
    """The disk's own pace: small appends each followed by fdatasync, in a temporary file."""
    with tempfile.NamedTemporaryFile(prefix="rcq-fsync-probe-", dir=tempfile.gettempdir()) as probe:
        started = time.perf_counter()
        for _ in range(writes):
            probe.write(b"x" * 128)
            probe.flush()
            os.fdatasync(probe.fileno())
        elapsed_s = time.perf_counter() - started
    return {"per_s": round(writes / elapsed_s), "ms_each": round(elapsed_s / writes * 1000, 3)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--urls", help="comma-separated node URLs of a running cluster (default: start one)")
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--duration-s", type=float, default=5.0)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--callers", nargs="+", choices=["separate", "coalesced"], default=["separate", "coalesced"])
    parser.add_argument("--scenarios", nargs="+", default=[*SCENARIOS, "failover", "memory"],
                        choices=[*SCENARIOS, *SYNC_SCENARIOS, "failover", "memory"])
    parser.add_argument("--failover-trials", type=int, default=3)
    parser.add_argument("--memory-items", type=int, default=1_000_000)
    parser.add_argument("--durability", nargs="+", choices=["fsync", "os"], default=["fsync"],
                        help="the nodes' durability setting; several: a fresh cluster each, side by side")
    parser.add_argument("--no-auth", action="store_true",
                        help="a fresh cluster without API tokens (default: tokens, as in production)")
    parser.add_argument("--tls", action="store_true", help="a fresh cluster serving HTTPS (a CA made for it)")
    parser.add_argument("--http", action="store_true",
                        help="clients send one HTTP request per operation (default: the session channel)")
    parser.add_argument("--cpu", action="store_true",
                        help="also CPU per transaction by process (leader, followers, this bench) from "
                             "/proc/PID/stat, and commits per Raft entry")
    parser.add_argument("--cpu-pids", type=lambda text: [int(pid) for pid in text.split(",")],
                        help="with --urls and --cpu: the nodes' PIDs, comma-separated in --urls order "
                             "(default: found from the port each node on this machine listens on)")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args(argv)
    if args.cpu_pids and (not args.urls or len(args.cpu_pids) != len(args.urls.split(","))):
        parser.error("--cpu-pids needs --urls, one PID per URL")
    if args.urls and (args.no_auth or args.tls):
        parser.error("--no-auth and --tls set up a fresh cluster; with --urls, set RCQ_TOKEN and RCQ_CA_FILE")
    report: dict[str, Any] = {"fsync_rate": raw_fsync_rate()}
    print(f"this machine's raw fdatasync rate: {report['fsync_rate']['per_s']}/s "
          f"({report['fsync_rate']['ms_each']} ms each)", flush=True)
    durabilities = ["(the cluster's own)"] if args.urls else args.durability
    for durability in durabilities:
        cluster = None if args.urls else fresh_cluster(args.nodes, durability, auth=not args.no_auth, tls=args.tls)
        try:
            report[durability] = asyncio.run(run(args, cluster, durability))
        finally:
            if cluster is not None:
                cluster.close()
    rows = [row for d in durabilities for row in report[d]["throughput"]]
    if len(durabilities) > 1 and rows:
        print("\nside by side:")
        print_table(rows)
    if not args.urls and "memory" in args.scenarios:
        # On a cluster of its own: the other scenarios leave items behind that would be counted.
        cluster = fresh_cluster(args.nodes, args.durability[0], auth=not args.no_auth, tls=args.tls)
        try:
            report["memory"] = asyncio.run(measure_memory(cluster, args.memory_items))
        finally:
            cluster.close()
        print("\nmemory and snapshot:", json.dumps(report["memory"], indent=2), flush=True)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
