"""``python -m bench.isolation``: one partition's leader process frozen, the other partitions' commits.

    python -m bench.isolation                      # 3 s warm-up, 10 s before, 6 s frozen, 10 s after
    python -m bench.isolation --writers 8 --before-s 20 --after-s 20 --json isolation.json

One local cluster of 3 nodes with p0 and partitions p1, p2 and p3, whose leaders are handed to three
different nodes at the start (the balancer is off, so that no move of its lands in a window). One
queue in each of p1, p2 and p3; on each queue ``--writers`` writers, each with its own client, commit
one-request enqueues of 100 B back to back, and a consumer dequeues in batches so that the queue
stays short. After a warm-up that is not counted comes the window "before"; then p1's leader
*process* (not its node: the node's p0 and its other partition processes run on) is stopped with
SIGSTOP for ``--freeze-s`` ("during") and continued with SIGCONT (in a ``finally``: never left
frozen); then the window "after".

Every commit is recorded with its partition, when it was answered (the monotonic clock) and its
latency. A commit belongs to the window in which it was answered, so "during" of p1 holds what its
new leader committed while the old one was frozen, and "after" what was stuck until the thaw.
Printed per partition and window: commits, commits/s, p50, p99 and max latency, and the writes that
failed (each error class counted); then the CPU seconds (utime + stime from ``/proc/PID/stat``) of
every rcq process and of the bench in each window, and the servers' CPU per enqueue commit (the
consumers' dequeues are in the CPU, not in the count). The conclusion: the other partitions' p99
during the freeze over their p99 before, and their commits/s likewise. Isolation holds when the p99
ratio is within the machine's noise (on 2 shared cores, runs differ by ±30%). Where the processes
share few cores, the frozen partition's load stops with it and leaves its CPU to the others: their
ratio may then fall below 1, and their commits/s rise.

Must not import: pysyncobj, lmdb, rcq.server (the bench talks to rcq as a user does).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.cpu import cpu_seconds
from bench.partitions import PROC_SELF, place, rcq_processes, spread_leaders
from bench.scenarios import ITEM_100_BYTES, Target
from rcq.client import RcqClient
from rcq.local.cluster import LocalCluster
from rcq.local.waits import async_wait_until

PARTITIONS = ("p1", "p2", "p3")
FROZEN = "p1"
WINDOWS = ("before", "during", "after")
SETUP_TIMEOUT_S = 60.0  # a leader, a queue's first commit
STOP_GRACE_S = 5.0  # writers still waiting for an answer at the end get this beyond their own timeouts
ERROR_PAUSE_S = 0.05  # a writer or consumer whose call failed tries again after this
CONSUMER_BATCH_ITEMS = 100
CONSUMER_WAIT_MS = 100
BENCH = "bench"


# ------------------------------------------------------------------ figures (pure)
@dataclass
class Record:
    """What the writers saw: each commit (partition, answered at, latency ms), each failure
    (partition, failed at, error class)."""

    commits: list[tuple[str, float, float]] = field(default_factory=list)
    failures: list[tuple[str, float, str]] = field(default_factory=list)


def percentile(ordered: Sequence[float], q: float) -> float | None:
    """The nearest-rank ``q`` quantile of ascending ``ordered`` (None when empty)."""
    if not ordered:
        return None
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def window_of(at: float, bounds: dict[str, tuple[float, float]]) -> str | None:
    """The window ``at`` falls in (its start included, its end not); None: outside every one."""
    return next((name for name, (start, end) in bounds.items() if start <= at < end), None)


def summary(latencies_ms: list[float], window_s: float, failures: dict[str, int]) -> dict[str, Any]:
    ordered = sorted(latencies_ms)

    def rounded(value: float | None) -> float | None:
        return None if value is None else round(value, 1)

    return {"commits": len(ordered), "commits_per_s": round(len(ordered) / window_s) if window_s > 0 else None,
            "p50_ms": rounded(percentile(ordered, 0.50)), "p99_ms": rounded(percentile(ordered, 0.99)),
            "max_ms": rounded(ordered[-1] if ordered else None), "failed": sum(failures.values()),
            "failures": dict(sorted(failures.items()))}


def figures(record: Record, bounds: dict[str, tuple[float, float]],
            partitions: Sequence[str] = PARTITIONS) -> dict[str, dict[str, dict[str, Any]]]:
    """partition -> window -> :func:`summary` of the commits answered and the writes failed in it."""
    latencies: dict[tuple[str, str], list[float]] = {(p, w): [] for p in partitions for w in bounds}
    failed: dict[tuple[str, str], dict[str, int]] = {(p, w): {} for p in partitions for w in bounds}
    for partition, at, latency_ms in record.commits:
        window = window_of(at, bounds)
        if window is not None and partition in partitions:
            latencies[partition, window].append(latency_ms)
    for partition, at, error in record.failures:
        window = window_of(at, bounds)
        if window is not None and partition in partitions:
            counts = failed[partition, window]
            counts[error] = counts.get(error, 0) + 1
    return {p: {w: summary(latencies[p, w], end - start, failed[p, w]) for w, (start, end) in bounds.items()}
            for p in partitions}


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    return round(numerator / denominator, 2) if numerator is not None and denominator else None


def conclusion(record: Record, bounds: dict[str, tuple[float, float]], frozen: str = FROZEN,
               partitions: Sequence[str] = PARTITIONS) -> dict[str, Any]:
    """The other partitions' commits pooled: p99 and commits/s during the freeze over before, and each one's p99 ratio."""
    others = [p for p in partitions if p != frozen]
    each = figures(record, bounds, others)
    merged = figures(Record([("others", at, ms) for p, at, ms in record.commits if p in others]), bounds,
                     ["others"])["others"]
    return {"partitions": others, "p99_before_ms": merged["before"]["p99_ms"], "p99_during_ms": merged["during"]["p99_ms"],
            "p99_during_over_before": ratio(merged["during"]["p99_ms"], merged["before"]["p99_ms"]),
            "commits_per_s_during_over_before": ratio(merged["during"]["commits_per_s"], merged["before"]["commits_per_s"]),
            "p99_during_over_before_each": {p: ratio(each[p]["during"]["p99_ms"], each[p]["before"]["p99_ms"])
                                            for p in others}}


def timeline(record: Record, start: float, end: float, partitions: Sequence[str] = PARTITIONS) -> dict[str, list[Any]]:
    """partition -> one entry per second from ``start``: commits answered in it, their p99 and max ms."""
    seconds = max(1, math.ceil(end - start))
    per_second: dict[str, list[list[float]]] = {p: [[] for _ in range(seconds)] for p in partitions}
    for partition, at, latency_ms in record.commits:
        if partition in per_second and start <= at < end:
            per_second[partition][int(at - start)].append(latency_ms)
    return {p: [{"second": i, "commits": len(ms), "p99_ms": percentile(sorted(ms), 0.99), "max_ms": max(ms, default=None)}
                for i, ms in enumerate(slots)] for p, slots in per_second.items()}


def cpu_windows(samples: list[dict[int, float]], names: dict[int, str], commits: dict[str, int]) -> dict[str, Any]:
    """CPU seconds of each process in each window, from the samples at the windows' bounds (one
    more sample than windows); the servers' µs per commit (every partition's commits of the window)."""
    per_process: dict[str, dict[str, float]] = {}
    servers: dict[str, float] = {}
    for window, before, after in zip(WINDOWS, samples, samples[1:], strict=False):
        for pid, name in names.items():
            if pid in before and pid in after:
                per_process.setdefault(name, {})[window] = round(after[pid] - before[pid], 2)
        servers[window] = sum(after[p] - before[p] for p in names if p in before and p in after and names[p] != BENCH)
    return {"seconds": per_process, "servers_s": {w: round(s, 2) for w, s in servers.items()},
            "servers_us_per_commit": {w: round(s / commits[w] * 1e6) if commits.get(w) else None
                                      for w, s in servers.items()}}


# ------------------------------------------------------------------ the load
@dataclass
class Load:
    """Writers and consumers on one queue per partition, until :meth:`stop`."""

    target: Target
    queues: dict[str, str]  # partition -> its queue
    writers: int
    request_timeout_s: float
    record: Record = field(default_factory=Record)
    clients: list[RcqClient] = field(default_factory=list)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    stopping: asyncio.Event = field(default_factory=asyncio.Event)

    def client(self) -> RcqClient:
        client = self.target.client(request_timeout_s=self.request_timeout_s, retry_timeout_s=self.request_timeout_s)
        self.clients.append(client)
        return client

    async def start(self) -> None:
        """Each writer's client commits once (it learns where its queue lives), then the load runs."""
        for partition, queue in self.queues.items():
            writers = [self.client() for _ in range(self.writers)]
            for writer in writers:
                async def first(writer: RcqClient = writer, queue: str = queue) -> bool:
                    await writer.enqueue(queue, ITEM_100_BYTES)
                    return True

                await async_wait_until(first, SETUP_TIMEOUT_S, what=f"a first commit to {queue}")
            self.tasks += [asyncio.create_task(self._write(w, partition, queue)) for w in writers]
            self.tasks.append(asyncio.create_task(self._consume(self.client(), queue)))

    async def _write(self, client: RcqClient, partition: str, queue: str) -> None:
        while not self.stopping.is_set():
            began = time.monotonic()
            try:
                await client.enqueue(queue, ITEM_100_BYTES)
            except Exception as exc:  # counted by class: a frozen leader's writers see timeouts, unknown outcomes
                self.record.failures.append((partition, time.monotonic(), type(exc).__name__))
                await asyncio.sleep(ERROR_PAUSE_S)  # pace: a failing writer must not spin on the bench's core
                continue
            answered = time.monotonic()
            self.record.commits.append((partition, answered, (answered - began) * 1000))

    async def _consume(self, client: RcqClient, queue: str) -> None:
        while not self.stopping.is_set():
            try:
                await client.dequeue(queue, CONSUMER_BATCH_ITEMS, wait_ms=CONSUMER_WAIT_MS)
            except Exception:  # a consumer of the frozen partition fails as its writers do; they are counted
                await asyncio.sleep(ERROR_PAUSE_S)  # pace: a failing consumer must not spin on the bench's core

    async def stop(self) -> None:
        """Stop the loops; calls still in flight get their own timeouts and a grace, then are cancelled."""
        self.stopping.set()
        _done, pending = await asyncio.wait(self.tasks, timeout=2 * self.request_timeout_s + STOP_GRACE_S)
        for task in pending:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        await asyncio.gather(*(client.close() for client in self.clients), return_exceptions=True)


# ------------------------------------------------------------------ the run
def cpu_sample(pids: dict[int, str]) -> dict[int, float]:
    sample: dict[int, float] = {}
    for pid in pids:
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            sample[pid] = cpu_seconds(pid)
    return sample


async def leader_of(cluster: LocalCluster, target: Target, partition: str) -> tuple[str, int]:
    """The node id and index of the node whose process of ``partition`` leads it now."""
    async with target.client() as client:
        row = next(row for row in await client.partitions() if row["name"] == partition)
    index = next((node.index for node in cluster.nodes if node.node_id == row["leader_id"]), None)
    if index is None:
        raise RuntimeError(f"{partition} has no leader to freeze: {row}")
    return row["leader_id"], index


async def frozen_window(cluster: LocalCluster, index: int, freeze_s: float) -> dict[str, Any]:
    """SIGSTOP node ``index``'s process of FROZEN for ``freeze_s``, SIGCONT it in any case; which and when."""
    pid = cluster.pause_partition_process(index, FROZEN)
    if pid is None:
        raise RuntimeError(f"{cluster.nodes[index].node_id} runs no process of {FROZEN}")
    frozen_at = time.monotonic()
    try:
        await asyncio.sleep(freeze_s)  # pace: the freeze lasts exactly this long
    finally:
        cluster.resume_process(pid)
    return {"partition": FROZEN, "node": cluster.nodes[index].node_id, "pid": pid, "frozen_at": frozen_at,
            "thawed_at": time.monotonic()}


async def measure(cluster: LocalCluster, args: argparse.Namespace) -> dict[str, Any]:
    target = Target.of(cluster)
    leaders = await spread_leaders(target, PARTITIONS)
    print(f"partition leaders: {leaders}", file=sys.stderr, flush=True)
    queues = {partition: f"isolation-{partition}" for partition in PARTITIONS}
    await place(target, {queue: partition for partition, queue in queues.items()})
    load = Load(target, queues, args.writers, args.request_timeout_s)
    try:
        await load.start()
        await asyncio.sleep(args.warmup_s)  # pace: the warm-up window, not counted
        pids = {**rcq_processes(cluster), PROC_SELF: BENCH}
        samples = [cpu_sample(pids)]
        started = time.monotonic()
        await asyncio.sleep(args.before_s)  # pace: the window before the freeze
        _node_id, index = await leader_of(cluster, target, FROZEN)
        samples.append(cpu_sample(pids))
        freeze = await frozen_window(cluster, index, args.freeze_s)
        samples.append(cpu_sample(pids))
        await asyncio.sleep(args.after_s)  # pace: the window after the thaw
        samples.append(cpu_sample(pids))
        ended = time.monotonic()
    finally:
        await load.stop()
    freeze["leader_after"], _index = await leader_of(cluster, target, FROZEN)
    bounds = {"before": (started, freeze["frozen_at"]), "during": (freeze["frozen_at"], freeze["thawed_at"]),
              "after": (freeze["thawed_at"], ended)}
    names = {pid: name + (" (frozen)" if pid == freeze["pid"] else "") for pid, name in pids.items()}
    table = figures(load.record, bounds)
    commits = {w: sum(table[p][w]["commits"] for p in PARTITIONS) for w in WINDOWS}
    return {"config": {key: value for key, value in vars(args).items() if key != "json"},
            "leaders": leaders, "frozen": {k: v for k, v in freeze.items() if not k.endswith("_at")},
            "windows_s": {w: round(end - start, 2) for w, (start, end) in bounds.items()},
            "partitions": table, "cpu": cpu_windows(samples, names, commits),
            "conclusion": conclusion(load.record, bounds), "timeline": timeline(load.record, started, ended)}


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    # leaders placed by hand (spread_leaders): the balancer left off, so none moves within a window
    with LocalCluster(3, log_level="WARNING", partitions_max=len(PARTITIONS),
                      node_overrides={"balance_leaders": False}) as cluster:
        cluster.wait_for_leader(SETUP_TIMEOUT_S)
        cluster.ensure_partitions(len(PARTITIONS) + 1)
        return await measure(cluster, args)


# ------------------------------------------------------------------ printing
def print_report(report: dict[str, Any]) -> None:
    frozen = report["frozen"]
    config = report["config"]
    print(f"3 nodes; leaders {report['leaders']}; {config['writers']} writers per queue; "
          f"{frozen['partition']}'s leader process ({frozen['node']}, pid {frozen['pid']}) frozen "
          f"{report['windows_s']['during']} s; {frozen['partition']}'s leader after: {frozen['leader_after']}")
    columns = ["partition", "window", "seconds", "commits", "commits/s", "p50_ms", "p99_ms", "max_ms", "failed"]
    lines = [columns]
    for partition, windows in report["partitions"].items():
        label = partition + (" (frozen)" if partition == frozen["partition"] else "")
        for window, row in windows.items():
            lines.append([label, window, str(report["windows_s"][window]), str(row["commits"]),
                          *(str(row[key]) for key in ("commits_per_s", "p50_ms", "p99_ms", "max_ms", "failed"))])
    widths = [max(len(line[i]) for line in lines) for i in range(len(columns))]
    for line in lines:
        print("  ".join(value.ljust(width) if i < 2 else value.rjust(width)
                        for i, (value, width) in enumerate(zip(line, widths, strict=True))))
    for partition, windows in report["partitions"].items():
        for window, row in windows.items():
            if row["failures"]:
                print(f"  {partition} {window}: " + ", ".join(f"{n} {error}" for error, n in row["failures"].items()))
    cpu = report["cpu"]
    print("\nCPU seconds by process (utime+stime from /proc) in each window:")
    name_width = max(len(name) for name in cpu["seconds"])
    print(" " * (name_width + 2) + "".join(w.rjust(9) for w in WINDOWS))
    for name, seconds in sorted(cpu["seconds"].items(), key=lambda kv: (kv[0] == BENCH, kv[0])):
        print(f"  {name:<{name_width}}" + "".join(f"{seconds.get(w, float('nan')):9.2f}" for w in WINDOWS))
    print(f"  {'servers':<{name_width}}" + "".join(f"{cpu['servers_s'][w]:9.2f}" for w in WINDOWS))
    print(f"  {'servers µs/commit':<{name_width}}"
          + "".join(f"{'?' if (us := cpu['servers_us_per_commit'][w]) is None else us:>9}" for w in WINDOWS))
    found = report["conclusion"]
    each = ", ".join(f"{p} {r}" for p, r in found["p99_during_over_before_each"].items())
    print(f"\nconclusion: {' and '.join(found['partitions'])} while {frozen['partition']}'s leader was frozen: "
          f"p99 {found['p99_during_ms']} ms during against {found['p99_before_ms']} ms before, "
          f"ratio {found['p99_during_over_before']} ({each}); commits/s ratio {found['commits_per_s_during_over_before']}. "
          f"Within noise when near 1: on 2 shared cores runs differ by ±30%.")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.isolation", description=__doc__.split("\n\n")[0])
    parser.add_argument("--writers", type=int, default=4, help="writers per queue, each its own client (default 4)")
    parser.add_argument("--warmup-s", type=float, default=3.0, help="the load's first seconds, not counted")
    parser.add_argument("--before-s", type=float, default=10.0, help="the window before the freeze")
    parser.add_argument("--freeze-s", type=float, default=6.0, help=f"how long {FROZEN}'s leader process stays frozen")
    parser.add_argument("--after-s", type=float, default=10.0, help="the window after the thaw")
    parser.add_argument("--request-timeout-s", type=float, default=10.0,
                        help="each client's request timeout, and how long it retries a request")
    parser.add_argument("--json", type=Path, default=None, help="also write every figure here")
    args = parser.parse_args(argv)
    if args.writers < 1:
        parser.error("--writers is at least 1")
    if args.warmup_s < 0 or min(args.before_s, args.freeze_s, args.after_s, args.request_timeout_s) <= 0:
        parser.error("the windows and --request-timeout-s are positive (--warmup-s may be 0)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    report = asyncio.run(main_async(args))
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    print_report(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
