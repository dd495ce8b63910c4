"""``python -m bench.threads``: CPU of every rcq process and thread of a running cluster, over a window.

    python -m bench.threads --pids 3646,3647,3648 --urls-file /tmp/peers/rcq/urls --after-s 6 --window-s 10

For a workload that some other program drives (the side-by-side harness: its rcq cluster's node
pids and URLs are files), this waits ``--after-s`` (the workload's warm-up), then reads, around
``--window-s`` of wall time, ``/proc/PID/stat`` and ``/proc/PID/task/TID/stat`` of each node
process (``--pids``, in node order: node-0 first) and of each partition process it runs, and the
machine's busy time (``/proc/stat``). It prints one line per process (node, partition, Raft role
when ``--urls``/``--urls-file`` and a token are given) with its CPU as a share of one core, then
each thread that used any (the loop is the process's main thread; another is named by its
``comm``). ``--items N`` (the items the workload moved in the window, if known) adds µs per item.
``--json FILE`` writes the same figures as one JSON object.

One Raft group's leader is one Python thread (its event loop: requests, Raft messages, applies and
the log's fsync): this is how to see whether that thread is the bound, and how far each is from a
whole core.

Must not import: pysyncobj, lmdb, rcq.server (the bench talks to rcq as a user does).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.cpu import PROC, process_and_thread_seconds
from bench.machine_cpu import machine_busy_s
from rcq.client import RcqClient
from rcq.local.processes import partition_processes


@dataclass(frozen=True)
class Process:
    pid: int
    node: str
    partition: str  # "p0" for the node's own process


def processes(node_pids: Sequence[int]) -> list[Process]:
    """Each node's process (p0's group and the node's HTTP) and the partition processes it runs."""
    found = []
    for index, pid in enumerate(node_pids):
        node = f"node-{index}"
        found.append(Process(pid, node, "p0"))
        found.extend(Process(child, node, name) for name, child in sorted(partition_processes(pid).items()))
    return found


def thread_name(pid: int, tid: int) -> str:
    if tid == pid:
        return "loop (main)"
    try:
        return (PROC / str(pid) / "task" / str(tid) / "comm").read_text().strip()
    except OSError:
        return "?"


@dataclass
class Snapshot:
    at: float
    machine_s: float
    processes: dict[int, float] = field(default_factory=dict)
    threads: dict[tuple[int, int], float] = field(default_factory=dict)

    @classmethod
    def take(cls, found: Sequence[Process]) -> Snapshot:
        processes, threads = process_and_thread_seconds(process.pid for process in found)
        return cls(time.monotonic(), machine_busy_s(), processes, threads)


def figures(found: Sequence[Process], before: Snapshot, after: Snapshot, roles: dict[tuple[str, str], str],
            items: int | None) -> dict[str, Any]:
    """The window's CPU: the machine, each process and its threads (shares of one core)."""
    wall = after.at - before.at
    cores = os.cpu_count() or 1
    rows: list[dict[str, Any]] = []
    servers_s = 0.0
    for process in found:
        if process.pid not in before.processes or process.pid not in after.processes:
            continue
        used = after.processes[process.pid] - before.processes[process.pid]
        servers_s += used
        threads = []
        for (pid, tid), seconds in sorted(after.threads.items()):
            if pid != process.pid or (pid, tid) not in before.threads:
                continue
            spent = seconds - before.threads[(pid, tid)]
            if spent > 0:
                threads.append({"tid": tid, "name": thread_name(pid, tid), "core_pct": round(spent / wall * 100, 1)})
        rows.append({"pid": process.pid, "node": process.node, "partition": process.partition,
                     "role": roles.get((process.partition, process.node), "?"),
                     "core_pct": round(used / wall * 100, 1),
                     "us_per_item": round(used / items * 1e6) if items else None, "threads": threads})
    servers = servers_s / wall * 100
    machine = (after.machine_s - before.machine_s) / wall * 100
    return {"window_s": round(wall, 2), "cores": cores, "machine_busy_pct": round(machine),
            "servers_pct": round(servers), "rest_pct": round(max(0.0, machine - servers)),
            "servers_us_per_item": round(servers_s / items * 1e6) if items else None,
            "processes": rows}


async def partition_roles(urls: list[str], token: str | None) -> dict[tuple[str, str], str]:
    """(partition, node id) -> "leader" or "follower", as the cluster lists them now."""
    async with RcqClient(urls, token=token) as client:
        rows = await client.partitions()
    roles = {}
    for row in rows:
        for member in row["members"]:
            roles[(row["name"], member)] = "leader" if member == row.get("leader_id") else "follower"
    return roles


def print_figures(result: dict[str, Any]) -> None:
    print(f"window {result['window_s']} s: machine {result['machine_busy_pct']}% busy of "
          f"{result['cores'] * 100}%; rcq servers {result['servers_pct']}%, everything else "
          f"{result['rest_pct']}%" + (f"; servers {result['servers_us_per_item']} µs per item"
                                      if result["servers_us_per_item"] is not None else ""))
    for row in sorted(result["processes"], key=lambda r: -r["core_pct"]):
        per_item = f", {row['us_per_item']} µs per item" if row["us_per_item"] is not None else ""
        print(f"  {row['node']}/{row['partition']} {row['role']:<8} pid {row['pid']:<7} "
              f"{row['core_pct']:5.1f}% of a core{per_item}")
        for thread in sorted(row["threads"], key=lambda t: -t["core_pct"]):
            print(f"      thread {thread['tid']:<7} {thread['name']:<22} {thread['core_pct']:5.1f}%")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.threads", description=__doc__.split("\n\n")[0])
    parser.add_argument("--pids", help="the node processes' pids, comma-separated, node-0 first")
    parser.add_argument("--pids-file", type=Path, help="a file of node pids, whitespace-separated (node order)")
    parser.add_argument("--urls", help="node URLs, comma-separated: to name each partition's leader")
    parser.add_argument("--urls-file", type=Path, help="a file of node URLs, whitespace-separated")
    parser.add_argument("--token", default=os.environ.get("RCQ_TOKEN"), help="default: $RCQ_TOKEN")
    parser.add_argument("--after-s", type=float, default=0.0, help="wait this long before the window")
    parser.add_argument("--window-s", type=float, default=10.0)
    parser.add_argument("--items", type=int, help="items the workload moved in the window: adds µs per item")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    text = args.pids.replace(",", " ") if args.pids else (args.pids_file.read_text() if args.pids_file else "")
    pids = [int(p) for p in text.split()]
    if not pids:
        parser.error("give the node processes with --pids or --pids-file")
    if args.window_s <= 0 or args.after_s < 0:
        parser.error("--window-s must be above 0 and --after-s not below 0")
    urls = (args.urls.split(",") if args.urls else
            (args.urls_file.read_text().split() if args.urls_file else []))
    time.sleep(args.after_s)
    found = processes(pids)
    roles = asyncio.run(partition_roles(urls, args.token)) if urls else {}
    before = Snapshot.take(found)
    time.sleep(args.window_s)
    result = figures(found, before, Snapshot.take(found), roles, args.items)
    print_figures(result)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
