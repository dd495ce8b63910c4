"""``python -m bench.backup``: backup and restore figures of a cluster holding N 100-byte items.

    python -m bench.backup --items 1000000          # the figures docs/backup.md quotes
    python -m bench.backup --items 20000 --json     # a quick run
    python -m bench.backup --items 1000000 --partitions 3   # a backup set: p0, p1, p2

On a fresh local 3-node cluster (``durability: fsync``) it enqueues ``--items`` 100-byte items,
waits until every node applied them, then:

1. **commit latency without a backup**: ``--committers`` clients each commit one-item enqueues
   (a queue of their own) for ``--latency-window-s``; p50/p99 of the commit, as the clients see it;
2. **backup**: ``rcq backup PATH`` as a separate process (the CLI as an operator runs it), from a
   follower, while the same committers run: seconds, file MiB and MiB/s; the CLI's peak RSS (its
   rusage); the serving node's peak RSS (``VmHWM`` of /proc/<pid>/status before and after) and
   the peak RSS of the child it forks to write the body (sampled); and the leader's commit p50/p99
   during the backup, beside step 1's;
3. **restore**: ``rcq restore PATH --node-config ...`` into the empty data directories of a new
   3-node cluster (a separate process: seconds, MiB/s of the file, its peak RSS), then the time
   until the new cluster serves and every node's data digest equals the backup's.

With ``--partitions N`` the items are spread evenly over a queue in each of p0 ... p{N-1}, the
backup is a set (docs/backup.md), the figures of the serving node are of p0's, and the restored
cluster must have the set's combined digest.

Each node's memory counts the state of N items in the Python heap (docs/performance.md: about
107 bytes of bookkeeping per item beside the value); the backup's own cost is the increase of the
serving node's VmHWM and its child's RSS. The machine is shared with whatever else runs: run the
1M figure on a quiet machine.

Must not import: pysyncobj, lmdb, rcq.server (the bench talks to rcq as a user does).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.scenarios import Target, fresh_cluster, prefill
from rcq.local.cluster import LocalCluster

QUEUE = "backup-bench"
LOAD_QUEUE = "backup-bench-load"
SAMPLE_S = 0.1
MIB = 1 << 20


# ------------------------------------------------------------------ memory
def status_kib(pid: int, field: str) -> int | None:
    """A ``kB`` field of /proc/<pid>/status (VmHWM, VmRSS); None when the process is gone."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as file:
            for line in file:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def children_of(pid: int) -> list[int]:
    """The PIDs whose parent is ``pid`` (the node's forked backup child among them)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as file:
                fields = file.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(entry))
    return found


class ChildPeak:
    """Samples the largest RSS of ``pid``'s children until stopped (a thread)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak_kib = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> ChildPeak:
        self._thread.start()
        return self

    def __exit__(self, *_: Any) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            for child in children_of(self.pid):
                self.peak_kib = max(self.peak_kib, status_kib(child, "VmRSS") or 0)


def run_measured(command: list[str]) -> tuple[float, int, str]:
    """Run ``command``; (seconds, peak RSS in KiB from its rusage, output). RuntimeError on failure."""
    started = time.monotonic()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    output = process.stdout.read().decode() if process.stdout is not None else ""
    _pid, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    seconds = time.monotonic() - started
    if process.returncode != 0:
        raise RuntimeError(f"{' '.join(command[:4])} failed ({process.returncode}): {output.strip()[-2000:]}")
    return seconds, int(usage.ru_maxrss), output


# ------------------------------------------------------------------ commit latency
async def committers(target: Target, count: int, stop: asyncio.Event) -> list[float]:
    """``count`` clients committing one-item enqueues until ``stop``; every commit's seconds."""
    latencies: list[float] = []

    async def one(n: int) -> None:
        async with target.client() as client:
            i = 0
            while not stop.is_set():
                started = time.perf_counter()
                await client.enqueue(LOAD_QUEUE, f"c{n}-{i}".encode())
                latencies.append(time.perf_counter() - started)
                i += 1

    await asyncio.gather(*(one(n) for n in range(count)))
    return latencies


def percentiles(latencies: list[float]) -> dict[str, float | int]:
    if len(latencies) < 2:
        return {"commits": len(latencies)}
    cuts = statistics.quantiles(latencies, n=100)
    return {"commits": len(latencies), "p50_ms": round(cuts[49] * 1000, 2), "p99_ms": round(cuts[98] * 1000, 2)}


async def latency_while(target: Target, count: int, action: Any) -> tuple[Any, dict[str, float | int]]:
    """``await action()`` while ``count`` committers run; its result and their latencies."""
    stop = asyncio.Event()
    load = asyncio.create_task(committers(target, count, stop))
    try:
        result = await action()
    finally:
        stop.set()
    return result, percentiles(await load)


# ------------------------------------------------------------------ the run
def node_of(cluster: LocalCluster, node_id: str) -> int:
    return next(node.index for node in cluster.nodes if node.node_id == node_id)


async def measure(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    figures: dict[str, Any] = {"items": args.items, "item_bytes": 100, "nodes": 3,
                               "committers": args.committers, "partitions": args.partitions}
    cluster = fresh_cluster(3) if args.partitions == 1 else partitioned_cluster(args.partitions)
    try:
        target = Target.of(cluster)
        started = time.monotonic()
        names = [f"p{k}" for k in range(args.partitions)]
        async with target.client() as client:
            for name in names[1:]:  # one queue per partition, the items spread evenly
                await client.configure_queue(f"{QUEUE}-{name}", partitions=[name])
        for k, name in enumerate(names):
            share = args.items // args.partitions + (1 if k < args.items % args.partitions else 0)
            await prefill(target, QUEUE if name == "p0" else f"{QUEUE}-{name}", share)
        await asyncio.to_thread(cluster.wait_for_applied, 600.0)
        figures["prefill_s"] = round(time.monotonic() - started, 2)
        leader = cluster.wait_for_leader(60.0)
        pids = cluster.pids()
        figures["node_vmhwm_before_mib"] = {cluster.nodes[i].node_id: round((status_kib(pid, "VmHWM") or 0) / 1024, 1)
                                            for i, pid in pids.items()}

        async def pause() -> None:
            await asyncio.sleep(args.latency_window_s)

        _, figures["commit_without_backup"] = await latency_while(target, args.committers, pause)

        path = work / "bench.rcqbackup"
        env_command = [sys.executable, "-m", "rcq", "backup", str(path)]
        os.environ["RCQ_URLS"] = ",".join(cluster.urls)
        os.environ["RCQ_TOKEN"] = cluster.token or ""
        followers = [i for i in pids if i != leader]
        peaks = {i: ChildPeak(pids[i]) for i in followers}
        for peak in peaks.values():
            peak.__enter__()
        try:
            (seconds, cli_kib, output), figures["commit_during_backup"] = await latency_while(
                target, args.committers, lambda: asyncio.to_thread(run_measured, env_command))
        finally:
            for peak in peaks.values():
                peak.__exit__()
        header = json.loads(subprocess.run([sys.executable, "-m", "rcq", "restore", str(path), "--check", "--json"],
                                           capture_output=True, text=True, check=True).stdout)
        if args.partitions > 1:  # a set: its p0 part stands for the header, the sizes are the parts'
            rows = header["partitions"]
            size = sum(row["bytes"] for row in rows)
            header = {**rows[0], "items": sum(row["items"] for row in rows), "data_digest": header["combined_digest"],
                      "parts": {row["name"]: {key: row[key] for key in ("index", "items", "bytes", "node_id")}
                                for row in rows}}
        else:
            size = path.stat().st_size
        served_by = node_of(cluster, header["node_id"])
        figures["backup"] = {
            "seconds": round(seconds, 2), "file_mib": round(size / MIB, 1), "mib_per_s": round(size / MIB / seconds, 1),
            "index": header["index"], "items_in_file": header["items"], "served_by": header["node_id"],
            "cli_peak_rss_mib": round(cli_kib / 1024, 1),
            "node_vmhwm_after_mib": round((status_kib(pids[served_by], "VmHWM") or 0) / 1024, 1),
            "node_vmhwm_before_mib": figures["node_vmhwm_before_mib"][header["node_id"]],
            "forked_child_peak_rss_mib": round(peaks[served_by].peak_kib / 1024, 1) if served_by in peaks else None,
            "output": output.strip().splitlines()[0] if output.strip() else "",
            **({"parts": header["parts"]} if "parts" in header else {}),
        }
    finally:
        cluster.close()
    figures["restore"] = await restore_figures(path, size, header["data_digest"], args.partitions)
    return figures


def partitioned_cluster(partitions: int) -> LocalCluster:
    """A fresh 3-node cluster with p0 ... p{partitions-1}, each led."""
    cluster = LocalCluster(3, log_level="WARNING", node_overrides={"durability": "fsync"},
                           partitions_max=partitions - 1)
    try:
        cluster.start()
        cluster.wait_for_leader(60)
        cluster.ensure_partitions(partitions, 120.0)
    except BaseException:
        cluster.close()
        raise
    return cluster


def combined_digest_of(cluster: LocalCluster, names: list[str]) -> str:
    """The combined digest of a cluster's partitions (each read from its leader)."""
    from rcq.backup.backup_set import combined_digest

    rows = cluster.wait_partitions_led(names, 600.0)
    return combined_digest({row["name"]: cluster.poll_json(
        (cluster.url(cluster.wait_for_leader()) if row["name"] == "p0" else row["leader_url"])
        + "/v1/cluster/data-digest", timeout_s=600.0)["data_digest"] for row in rows})


async def restore_figures(path: Path, size: int, data_digest: str, partitions: int = 1) -> dict[str, Any]:
    """Restore the backup at ``path`` (``size`` bytes) into a fresh 3-node cluster: how long the
    seeding and the start took, and whether every node's data digest is the backup's (a set's:
    whether the restored partitions' combined digest is the set's)."""
    restored = LocalCluster(3, log_level="WARNING", partitions_max=partitions - 1 + 4 if partitions > 1 else 0)
    try:
        command = [sys.executable, "-m", "rcq", "restore", str(path)]
        for node in restored.nodes:
            command += ["--node-config", str(node.config_path)]
        seconds, restore_kib, _ = await asyncio.to_thread(run_measured, command)
        started = time.monotonic()
        restored.start()
        restored.wait_for_leader(600.0)
        await asyncio.to_thread(restored.wait_for_applied, 600.0)
        if partitions > 1:
            digests = [await asyncio.to_thread(combined_digest_of, restored, [f"p{k}" for k in range(partitions)])]
        else:
            digests = [restored.data_digest(i, timeout_s=600.0)["data_digest"] for i in range(3)]
        return {
            "seed_seconds": round(seconds, 2), "mib_per_s": round(size / MIB / seconds, 1),
            "cli_peak_rss_mib": round(restore_kib / 1024, 1),
            "start_to_serving_s": round(time.monotonic() - started, 2),
            "digests_match": all(d == data_digest for d in digests),
            "total_s": round(seconds + time.monotonic() - started, 2),
        }
    finally:
        restored.close()


def print_figures(figures: dict[str, Any]) -> None:
    backup, restore = figures["backup"], figures["restore"]
    without, during = figures["commit_without_backup"], figures["commit_during_backup"]
    spread = f", spread over {figures['partitions']} partitions" if figures["partitions"] > 1 else ""
    print(f"backup and restore of {figures['items']} items of 100 bytes{spread}, 3 nodes, fsync "
          f"(prefill {figures['prefill_s']} s)")
    print(f"  backup   {backup['seconds']:>8} s  {backup['file_mib']} MiB at {backup['mib_per_s']} MiB/s from "
          f"{backup['served_by']} (index {backup['index']}, {backup['items_in_file']} items)")
    print(f"           serving node VmHWM {backup['node_vmhwm_before_mib']} -> {backup['node_vmhwm_after_mib']} MiB, "
          f"its forked child's peak RSS {backup['forked_child_peak_rss_mib']} MiB; CLI peak RSS "
          f"{backup['cli_peak_rss_mib']} MiB")
    for name, part in backup.get("parts", {}).items():
        print(f"           part {name}: {part['items']} items, {round(part['bytes'] / MIB, 1)} MiB at index "
              f"{part['index']} from {part['node_id']}")
    print(f"  leader commit latency ({figures['committers']} committers): without a backup p50 "
          f"{without.get('p50_ms')} ms p99 {without.get('p99_ms')} ms ({without['commits']} commits); during it p50 "
          f"{during.get('p50_ms')} ms p99 {during.get('p99_ms')} ms ({during['commits']} commits)")
    print(f"  restore  {restore['seed_seconds']:>8} s  seeding 3 data directories at {restore['mib_per_s']} MiB/s of "
          f"backup, CLI peak RSS {restore['cli_peak_rss_mib']} MiB; serving with equal data digests after "
          f"{restore['start_to_serving_s']} s more (digests match: {restore['digests_match']}); total "
          f"{restore['total_s']} s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.backup", description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=1_000_000, help="100-byte items in the cluster (default 1M)")
    parser.add_argument("--committers", type=int, default=4, help="clients committing during the measures (4)")
    parser.add_argument("--latency-window-s", type=float, default=10.0,
                        help="how long the committers run without a backup, for comparison (10)")
    parser.add_argument("--partitions", type=int, default=1,
                        help="p0 ... p{N-1}, a queue in each, the items spread evenly: the backup is a set (1)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    if not 1 <= args.partitions <= 16:
        parser.error("--partitions is 1 to 16")
    with tempfile.TemporaryDirectory(prefix="rcq-bench-backup-") as work:
        figures = asyncio.run(measure(args, Path(work)))
    if args.json:
        print(json.dumps(figures, indent=2))
    else:
        print_figures(figures)
    return 0 if figures["restore"]["digests_match"] else 1


if __name__ == "__main__":
    sys.exit(main())
