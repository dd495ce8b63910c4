"""``python -m bench.partition_memory``: memory of a cluster whose items are split over partitions.

    python -m bench.partition_memory                  # 6 nodes, 1,000,000 items of 100 B per partition
    python -m bench.partition_memory --items 200000

A local cluster of 6 nodes: partition p1 on node-0, node-1 and node-2, p2 on node-3, node-4 and
node-5 (docs/partitions.md). ``--items`` items of 100 B go into a queue placed in p1 and as many
into one placed in p2; then, once every process has snapshotted and compacted its log, the
resident memory of every process is read (``/proc/PID/status``), each node's total with it.
Then twice ``--items`` go into a queue of p0, whose members are all six
nodes: what one group holding every item costs each node, read the same way (the p0 process).

Must not import: pysyncobj, lmdb, rcq.server (the bench talks to rcq as a user does).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import sys
import time
from pathlib import Path
from typing import Any

from bench.partitions import rcq_processes, rss_mib
from bench.scenarios import Target, prefill
from rcq.local.cluster import LocalCluster
from rcq.local.waits import wait_until

NODES = 6
CREATE_TIMEOUT_S = 60.0
SNAPSHOT_TIMEOUT_S = 300.0
LOG_LENGTH_COMPACTED = 16  # entries: a log this short holds no item worth a reading
PLACED = {"p1": ["node-0", "node-1", "node-2"], "p2": ["node-3", "node-4", "node-5"]}


def create(cluster: LocalCluster, name: str, members: list[str]) -> None:
    """Create ``name`` on ``members`` once every node's ports are recorded (within a turn of the
    leader's feature-level loop), and wait until it has a leader."""
    def attempt() -> bool:
        leader = cluster.url(cluster.wait_for_leader(60))
        answer = cluster.poll_json(leader + "/v1/cluster/partitions", method="POST",
                                   body={"name": name, "nodes": members})
        code = answer.get("error", {}).get("code")
        if code not in (None, "partition_exists", "node_has_no_partition_ports", "feature_level_required",
                        "not_leader", "no_leader"):
            raise RuntimeError(f"creating {name}: {answer}")
        return code in (None, "partition_exists")

    wait_until(attempt, CREATE_TIMEOUT_S, what=f"partition {name} created")
    wait_until(lambda: {r["name"]: r for r in cluster.partitions()}[name]["leader_url"] is not None,
               CREATE_TIMEOUT_S, what=f"partition {name} led")


def compact_all(cluster: LocalCluster) -> None:
    """Every process snapshots and compacts its log now, and the reading waits for each: resident
    memory then holds the state, not a log of entries waiting for their snapshot."""
    urls = list(cluster.urls) + [url for row in cluster.partitions() if row["name"] != "p0" for url in row["urls"]]
    before = {url: cluster.poll_json(url + "/v1/cluster")["snapshot_count"] for url in urls}
    for url in urls:
        cluster.poll_json(url + "/v1/admin/snapshot", method="POST")
    def compacted(url: str) -> bool:  # a log with nothing new since its last snapshot is not snapshotted again
        view = cluster.poll_json(url + "/v1/cluster")
        return view["snapshot_count"] > before[url] or view["log_length"] <= LOG_LENGTH_COMPACTED

    for url in urls:
        wait_until(functools.partial(compacted, url), SNAPSHOT_TIMEOUT_S, what=f"a snapshot of {url}")


def memory(cluster: LocalCluster) -> dict[str, dict[str, float]]:
    """node id -> {"p0": MiB, "p1": MiB, ..., "total": MiB}, resident memory of each of its processes."""
    by_node: dict[str, dict[str, float]] = {}
    for pid, name in rcq_processes(cluster).items():
        node, partition = name.split("/")
        by_node.setdefault(node, {})[partition] = round(rss_mib(pid), 1)
    for entry in by_node.values():
        entry["total"] = round(sum(entry.values()), 1)
    return dict(sorted(by_node.items()))


async def fill(target: Target, queue: str, items: int) -> float:
    started = time.monotonic()
    await prefill(target, queue, items)
    return time.monotonic() - started


async def main_async(items: int) -> dict[str, Any]:
    with LocalCluster(NODES, log_level="WARNING", partitions_max=1 + len(PLACED)) as cluster:
        cluster.wait_for_leader(60)
        for name, members in PLACED.items():
            create(cluster, name, members)
        target = Target.of(cluster)
        async with target.client() as client:
            for name in PLACED:
                await client.configure_queue(f"memory-{name}", partitions=[name])
        idle = memory(cluster)
        fills = await asyncio.gather(*(fill(target, f"memory-{name}", items) for name in PLACED))
        await asyncio.to_thread(cluster.wait_for_applied, 300)
        await asyncio.to_thread(compact_all, cluster)
        split = memory(cluster)
        one_group_s = await fill(target, "memory-p0", 2 * items)
        await asyncio.to_thread(cluster.wait_for_applied, 300)
        await asyncio.to_thread(compact_all, cluster)
        one_group = memory(cluster)
    return {"items_per_partition": items, "item_bytes": 100, "idle": idle,
            "fill_s": {name: round(s, 1) for name, s in zip(PLACED, fills, strict=True)},
            "split": split, "one_group_fill_s": round(one_group_s, 1), "one_group": one_group}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.partition_memory", description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=1_000_000, help="items of 100 B per partition")
    parser.add_argument("--json", type=Path, default=None, help="also write every figure here")
    args = parser.parse_args(argv)
    report = asyncio.run(main_async(args.items))
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(f"{args.items} items of 100 B in p1 (node-0..2) and as many in p2 (node-3..5); "
          f"filled in {report['fill_s']} s")
    print("resident MiB per process: idle | items split over p1 and p2 | then 2x items in p0 (all six nodes)")
    for node in report["idle"]:
        print(f"  {node}: idle {report['idle'][node]}  split {report['split'][node]}  "
              f"p0 with all {report['one_group'][node].get('p0')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
