"""``python -m bench.balance``: how the leader balancer spreads partition leaders, and how soon it
spreads them again after a node restarts (docs/partitions.md, "Leaders spread").

    python -m bench.balance                       # 3 nodes, 6 partitions, the default 60 s hold
    python -m bench.balance --partitions 6 --hold-s 60 --rounds 2

One local cluster of 3 nodes. Six partitions (``b0`` ... ``b5``) are created, each on every node;
the bench polls ``GET /v1/cluster/balance`` once a second and prints the leaders per node as the
partitions first elect, how long after the last creation each node led P/N of them, and the
hand-overs the balancer made. Then, each round, a node that leads partitions and is not p0's
leader is stopped (SIGTERM: it hands its leaderships over) and started again; printed: the leaders
per node while it is away, the seconds from its serving again to P/N each again, and the moves.

Must not import: pysyncobj, lmdb, rcq.server (the bench talks to rcq as a user does).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from rcq.client import SyncClient
from rcq.errors import FeatureLevelRequired, NodeHasNoPartitionPorts
from rcq.local.cluster import LocalCluster

POLL_S = 1.0
SPREAD_TIMEOUT_S = 300.0


def balance(cluster: LocalCluster) -> dict[str, Any]:
    return cluster.poll_json(cluster.url(cluster.wait_for_leader(60)) + "/v1/cluster/balance")


def counts(answer: dict[str, Any], cluster: LocalCluster, names: set[str]) -> dict[str, int]:
    per_node = {node.node_id: 0 for node in cluster.nodes}
    for row in answer["partitions"]:
        if row["name"] in names and row["leader_id"] in per_node:
            per_node[row["leader_id"]] += 1
    return per_node


def wait_even(cluster: LocalCluster, names: set[str], since: float) -> tuple[float, dict[str, Any]]:
    """Seconds from ``since`` until every node leads len(names)/N of ``names``, and the balance then."""
    share = len(names) // len(cluster.nodes)
    deadline = time.monotonic() + SPREAD_TIMEOUT_S
    while True:
        answer = balance(cluster)
        if all(c == share for c in counts(answer, cluster, names).values()):
            return time.monotonic() - since, answer
        if time.monotonic() > deadline:
            raise TimeoutError(f"leaders not spread within {SPREAD_TIMEOUT_S:.0f} s: {counts(answer, cluster, names)}")
        time.sleep(POLL_S)  # pace: a survey asks every member of every partition


def create(client: SyncClient, name: str) -> None:
    """Create ``name`` once the new cluster has raised its level and recorded every node's ports."""
    deadline = time.monotonic() + SPREAD_TIMEOUT_S
    while True:
        try:
            client.create_partition(name, replicas=3)
            return
        except (FeatureLevelRequired, NodeHasNoPartitionPorts):
            if time.monotonic() > deadline:
                raise
            time.sleep(POLL_S)  # pace: the leader raises the level and records ports at its next turn (5 s)


def run(args: argparse.Namespace) -> dict[str, Any]:
    names = {f"b{i}" for i in range(args.partitions)}
    report: dict[str, Any] = {"partitions": args.partitions, "hold_s": args.hold_s, "rounds": []}
    with LocalCluster(3, log_level="WARNING", partitions_max=args.partitions,
                      node_overrides={"balance_hold_s": args.hold_s}) as cluster:
        cluster.wait_for_leader(60)
        cluster.ensure_partitions(1)  # waits for level 4 and every node's ports (p0 alone: creates none)
        with SyncClient(cluster.urls, **cluster.client_options()) as client:
            for name in sorted(names):
                create(client, name)
        created = time.monotonic()
        first = counts(balance(cluster), cluster, names)
        seconds, answer = wait_even(cluster, names, created)
        report.update(after_creation=first, spread_after_creation_s=round(seconds, 1),
                      moves_after_creation=answer["moves_total"])
        print(json.dumps({"created": first, "spread_s": round(seconds, 1), "moves": answer["moves_total"]}),
              file=sys.stderr, flush=True)
        for round_ in range(args.rounds):
            p0_leader = cluster.wait_for_leader(60)
            leading = counts(balance(cluster), cluster, names)
            restarted = next(i for i, node in enumerate(cluster.nodes)
                             if i != p0_leader and leading[node.node_id] > 0)
            moves_before = balance(cluster)["moves_total"]
            cluster.stop_node(restarted)
            away = counts(balance(cluster), cluster, names)
            cluster.start_node(restarted)
            served = time.monotonic()
            seconds, answer = wait_even(cluster, names, served)
            row = {"round": round_, "restarted": cluster.nodes[restarted].node_id, "while_away": away,
                   "spread_again_s": round(seconds, 1), "moves": answer["moves_total"] - moves_before,
                   "moves_failed_total": answer["moves_failed_total"]}
            report["rounds"].append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    return report


def print_report(report: dict[str, Any]) -> None:
    print(f"{report['partitions']} partitions on 3 nodes, balancer hold {report['hold_s']:g} s")
    print(f"  as first elected: {report['after_creation']}")
    print(f"  P/N each {report['spread_after_creation_s']} s after the last creation, "
          f"{report['moves_after_creation']} hand-overs")
    for row in report["rounds"]:
        print(f"  {row['restarted']} restarted: away {row['while_away']}; P/N each again {row['spread_again_s']} s "
              f"after it served, {row['moves']} hand-overs ({row['moves_failed_total']} failed in all)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.balance", description=__doc__.split("\n\n")[0])
    parser.add_argument("--partitions", type=int, default=6, help="partitions besides p0, a multiple of 3")
    parser.add_argument("--hold-s", type=float, default=60.0, help="the balancer's hold (balance_hold_s)")
    parser.add_argument("--rounds", type=int, default=1, help="node restarts")
    parser.add_argument("--json", type=Path, default=None, help="also write every figure here")
    args = parser.parse_args(argv)
    if args.partitions < 3 or args.partitions % 3:
        parser.error("--partitions is a multiple of 3 (P/N leaders per node)")
    report = run(args)
    print_report(report)
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
