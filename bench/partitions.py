"""``python -m bench.partitions``: K hot queues in K partitions against the same K queues in p0.

    python -m bench.partitions                        # K = 1, 2, 3; 15 s each; 48 callers
    python -m bench.partitions --k 2,3 --duration-s 20 --rounds 2 --concurrency 48

One local cluster of 3 nodes with partitions p0, p1 and p2 (docs/partitions.md), each led by
another node (hand-overs at the start). For each K, K queues, ``--concurrency`` callers spread
evenly over them, each with its own client, committing one-request enqueues of 100 B for
``--duration-s``: once with queue j placed in partition p{j} (``spread``; the leader work of K
queues on K processes of K nodes), once with the K queues in p0 (``p0``). K = 1 is both at
once. The placements alternate within a round, rounds repeat (one sitting: the figures compare).

Printed per run: commits/s; CPU per commit summed over every rcq process (the nodes' processes and
their partition processes, from ``/proc/PID/stat`` around the measured window) and the bench's
own; and **the busiest thread**: the rcq thread (``/proc/PID/task/TID/stat``) that used the most
CPU in the window, as a share of one core and per commit, with the process it is in. One Raft
group's leader is one Python thread: where leaders spread, the busiest thread carries a share of
the work. Then the fixed cost of a partition: each partition process's CPU over an idle
``--idle-s``, its resident memory, and the Raft messages it sent per second (its
``rcq_raft_messages_sent_total``).

Must not import: pysyncobj, lmdb, rcq.server (the bench talks to rcq as a user does).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from bench.cpu import PROC, cpu_seconds, process_and_thread_seconds
from bench.scenarios import ITEM_100_BYTES, Target
from rcq.client import RcqClient
from rcq.local.cluster import LocalCluster
from rcq.local.processes import partition_processes

PARTITIONS = ("p0", "p1", "p2")
HAND_OVER_TIMEOUT_S = 30.0


# ------------------------------------------------------------------ /proc
def rcq_processes(cluster: LocalCluster) -> dict[int, str]:
    """pid -> "node-i/pX" of every rcq process of the cluster: each node's, and its partition processes."""
    found: dict[int, str] = {}
    for node in cluster.nodes:
        if node.pid is None:
            continue
        found[node.pid] = f"{node.node_id}/p0"
        for name, pid in partition_processes(node.pid).items():
            found[pid] = f"{node.node_id}/{name}"
    return found


def rss_mib(pid: int) -> float:
    for line in (PROC / str(pid) / "status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


@dataclass
class Sample:
    at: float
    processes: dict[int, float]
    threads: dict[tuple[int, int], float]
    client: float

    @classmethod
    def take(cls, pids: dict[int, str]) -> Sample:
        processes, threads = process_and_thread_seconds(pids)
        return cls(time.monotonic(), processes, threads, cpu_seconds(PROC_SELF))


PROC_SELF = int(Path("/proc/self").resolve().name)


def usage(before: Sample, after: Sample, pids: dict[int, str], commits: int) -> dict[str, Any]:
    """What the window cost: CPU per commit of the servers and the bench, and the busiest thread."""
    window_s = after.at - before.at
    servers_s = sum(after.processes[p] - before.processes[p] for p in after.processes if p in before.processes)
    deltas = {key: after.threads[key] - before.threads[key] for key in after.threads if key in before.threads}
    (pid, _tid), busiest_s = max(deltas.items(), key=lambda kv: kv[1]) if deltas else ((0, 0), 0.0)
    per = max(commits, 1)
    return {"commits_per_s": round(commits / window_s), "servers_us_per_commit": round(servers_s / per * 1e6),
            "bench_us_per_commit": round((after.client - before.client) / per * 1e6),
            "servers_busy_pct": round(servers_s / window_s * 100),
            "busiest_thread_pct": round(busiest_s / window_s * 100), "busiest_thread_us_per_commit":
                round(busiest_s / per * 1e6), "busiest_thread_in": pids.get(pid, "?")}


# ---------------------------------------------------------------- the cluster
async def spread_leaders(target: Target, names: Sequence[str] = PARTITIONS) -> dict[str, str]:
    """Hand the leadership of each of ``names`` to a node of its own (the first one's stays: p0's, by
    default); partition -> its leader's node id."""
    async with target.client() as client:
        rows = {row["name"]: row for row in await client.partitions()}
        taken = {rows[names[0]]["leader_id"]}
        for name in names[1:]:
            row = rows[name]
            if row["leader_id"] not in taken:
                taken.add(row["leader_id"])
                continue
            wanted = next(m for m in row["members"] if m not in taken)
            async with RcqClient([row["leader_url"]], token=target.token, ca_file=target.ca_file) as leader:
                await leader.transfer_leadership(wanted)
            taken.add(wanted)
        deadline = time.monotonic() + HAND_OVER_TIMEOUT_S
        while True:
            rows = {row["name"]: row for row in await client.partitions()}
            leaders = {name: rows[name]["leader_id"] for name in names}
            if None not in leaders.values() and len(set(leaders.values())) == len(names):
                return leaders
            if time.monotonic() > deadline:
                raise TimeoutError(f"partition leaders not spread: {leaders}")
            await asyncio.sleep(0.2)


async def place(target: Target, queues: dict[str, str]) -> None:
    async with target.client() as client:
        for queue, partition in queues.items():
            await client.configure_queue(queue, partitions=[partition])


async def run_once(cluster: LocalCluster, target: Target, queues: list[str], concurrency: int,
                   duration_s: float) -> dict[str, Any]:
    """``concurrency`` callers over ``queues`` committing one-request enqueues for ``duration_s``."""
    clients = [target.client() for _ in range(concurrency)]
    try:
        for n, client in enumerate(clients):  # warm: each client's channel and routes before the window
            await client.enqueue(queues[n % len(queues)], ITEM_100_BYTES)
        commits = 0
        errors = 0

        async def caller(client: RcqClient, queue: str, stop_at: float) -> None:
            nonlocal commits, errors
            while time.monotonic() < stop_at:
                try:
                    await client.enqueue(queue, ITEM_100_BYTES)
                except Exception:  # counted; a benchmark of a healthy cluster sees none
                    errors += 1
                    continue
                commits += 1

        pids = rcq_processes(cluster)
        before = Sample.take(pids)
        stop_at = time.monotonic() + duration_s
        await asyncio.gather(*(caller(c, queues[n % len(queues)], stop_at) for n, c in enumerate(clients)))
        after = Sample.take(pids)
        return {**usage(before, after, pids, commits), "errors": errors}
    finally:
        await asyncio.gather(*(client.close() for client in clients))


def raft_messages(cluster: LocalCluster) -> dict[str, int]:
    """"node-i/pX" -> Raft messages that process sent, from each node's /metrics (its own series,
    and its partition processes' labelled ``partition``)."""
    sent: dict[str, int] = {}
    for i, node in enumerate(cluster.nodes):
        request = urllib.request.Request(cluster.url(i) + "/metrics", headers=cluster.auth_headers())
        with urllib.request.urlopen(request, timeout=10) as response:
            text = response.read().decode()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == "rcq_raft_messages_sent_total":
                    sent[f"{node.node_id}/{sample.labels.get('partition', 'p0')}"] = int(sample.value)
    return sent


async def idle_cost(cluster: LocalCluster, idle_s: float) -> list[dict[str, Any]]:
    """Each rcq process's CPU over ``idle_s`` of an idle cluster, its resident memory, and the
    Raft messages it sent per second."""
    pids = rcq_processes(cluster)
    messages_before = await asyncio.to_thread(raft_messages, cluster)
    before = Sample.take(pids)
    await asyncio.sleep(idle_s)
    after = Sample.take(pids)
    messages_after = await asyncio.to_thread(raft_messages, cluster)
    window_s = after.at - before.at
    return [{"process": name, "idle_cpu_pct": round((after.processes[pid] - before.processes[pid]) / window_s * 100, 2),
             "rss_mib": round(rss_mib(pid), 1),
             "raft_messages_sent_per_s": round((messages_after.get(name, 0) - messages_before.get(name, 0)) / window_s, 1)}
            for pid, name in sorted(pids.items(), key=lambda kv: kv[1]) if pid in after.processes]


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    ks = [int(k) for k in args.k.split(",")]
    # leaders placed by hand here (spread_leaders): the balancer left off
    with LocalCluster(3, log_level="WARNING", partitions_max=len(PARTITIONS) - 1,
                      node_overrides={"balance_leaders": False}) as cluster:
        cluster.wait_for_leader(60)
        cluster.ensure_partitions(len(PARTITIONS))
        target = Target.of(cluster)
        leaders = await spread_leaders(target)
        print(f"partition leaders: {leaders}", file=sys.stderr, flush=True)
        idle = await idle_cost(cluster, args.idle_s)
        runs: list[dict[str, Any]] = []
        for round_ in range(args.rounds):
            for k in ks:
                for placement in (("spread", "p0") if k > 1 else ("spread",)):
                    queues = {f"hot-{round_}-{k}-{placement}-{j}": (PARTITIONS[j] if placement == "spread" else "p0")
                              for j in range(k)}
                    await place(target, queues)
                    figures = await run_once(cluster, target, list(queues), args.concurrency, args.duration_s)
                    row = {"round": round_, "k": k, "placement": placement if k > 1 else "p0 (= spread)", **figures}
                    runs.append(row)
                    print(json.dumps(row), file=sys.stderr, flush=True)
        return {"leaders": leaders, "idle": idle, "runs": runs}


def print_report(report: dict[str, Any]) -> None:
    columns = ["k", "placement", "commits_per_s", "servers_us_per_commit", "bench_us_per_commit", "servers_busy_pct",
               "busiest_thread_pct", "busiest_thread_us_per_commit", "busiest_thread_in", "errors"]
    groups: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for run in report["runs"]:
        groups.setdefault((run["k"], run["placement"]), []).append(run)
    rows = []
    for (k, placement), runs in groups.items():
        row: dict[str, Any] = {"k": k, "placement": placement}
        for column in columns[2:]:
            values = [r[column] for r in runs]
            row[column] = statistics.median(values) if isinstance(values[0], int | float) else values[-1]
        rows.append(row)
    widths = {c: max(len(c), *(len(str(r[c])) for r in rows)) for c in columns}
    print(f"medians of {max(len(r) for r in groups.values())} round(s); partition leaders {report['leaders']}")
    print("  ".join(c.rjust(widths[c]) for c in columns))
    for row in rows:
        print("  ".join(str(row[c]).rjust(widths[c]) for c in columns))
    print("\nidle cluster, per process:")
    for entry in report["idle"]:
        print(f"  {entry['process']:>12}  cpu {entry['idle_cpu_pct']:5.2f}%  rss {entry['rss_mib']:6.1f} MiB  "
              f"raft messages sent {entry['raft_messages_sent_per_s']:6.1f}/s")
    per_partition: dict[str, float] = {}
    for entry in report["idle"]:
        partition = entry["process"].rsplit("/", 1)[1]
        per_partition[partition] = per_partition.get(partition, 0.0) + entry["raft_messages_sent_per_s"]
    print("  raft messages per second, each partition's members together: "
          + ", ".join(f"{name} {rate:.0f}" for name, rate in sorted(per_partition.items())))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.partitions", description=__doc__.split("\n\n")[0])
    parser.add_argument("--k", default="1,2,3", help="numbers of hot queues (each at most 3; default 1,2,3)")
    parser.add_argument("--duration-s", type=float, default=15.0)
    parser.add_argument("--concurrency", type=int, default=48, help="callers in all, spread over the K queues")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--idle-s", type=float, default=10.0, help="the idle window of the fixed cost")
    parser.add_argument("--json", type=Path, default=None, help="also write every figure here")
    args = parser.parse_args(argv)
    if any(not 1 <= int(k) <= len(PARTITIONS) for k in args.k.split(",")):
        parser.error(f"--k takes numbers from 1 to {len(PARTITIONS)}")
    report = asyncio.run(main_async(args))
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    print_report(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
