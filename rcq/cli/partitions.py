"""The partition verbs (docs/partitions.md): ``rcq partition create|list|delete``.

``create`` answers once the new partition has a leader (or says it has none yet after
``--leader-wait-s``: it is created, and its members are still starting it). ``delete`` refuses a
partition that holds a queue, naming them. Creating and deleting need an admin token; ``list``
any valid one.

Must not import: rcq.server, pysyncobj, lmdb.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from rcq.cli.connection import seconds, with_client
from rcq.cli.output import print_table
from rcq.errors import RcqError


def add_partition_parsers(commands: Any, common: argparse.ArgumentParser) -> None:
    partition = commands.add_parser(
        "partition", help="create, list and delete partitions (Raft groups of their own)",
        description="A partition is a Raft group of its own, with a process on each member node; a queue lives "
                    "in the partition it was placed in (docs/partitions.md).")
    actions = partition.add_subparsers(dest="partition_command", required=True, metavar="ACTION")
    create = actions.add_parser(
        "create", parents=[common], help="create a partition online (admin token)",
        description="Create partition NAME on --nodes, or on --replicas nodes with the fewest partitions; "
                    "answers once it has a leader.")
    create.add_argument("name", metavar="NAME")
    create.add_argument("--replicas", type=int, default=None, help="members to choose (default 3, or fewer nodes)")
    create.add_argument("--nodes", type=_node_list, default=None, metavar="ID,ID,...",
                        help="the members, by node id (instead of --replicas)")
    create.add_argument("--leader-wait-s", type=seconds, default=30.0,
                        help="how long to wait for its first leader, 0 to 600 (default 30)")
    create.set_defaults(func=cmd_partition_create, error_hint=partition_hint)
    listing = actions.add_parser("list", parents=[common], help="every partition: members, leader")
    listing.set_defaults(func=cmd_partition_list)
    delete = actions.add_parser(
        "delete", parents=[common], help="delete a partition that holds no queue (admin token)",
        description="Delete partition NAME: refused while a queue is placed in it. Its members stop its "
                    "processes and remove its data; its number is never used again.")
    delete.add_argument("name", metavar="NAME")
    delete.set_defaults(func=cmd_partition_delete, error_hint=partition_hint)


def _node_list(text: str) -> list[str]:
    nodes = [n.strip() for n in text.split(",") if n.strip()]
    if not nodes:
        raise argparse.ArgumentTypeError("expected node ids separated by commas")
    return nodes


def _rows(partitions: list[dict[str, Any]]) -> list[list[Any]]:
    return [[p["name"], ",".join(p["members"]), p.get("leader_id"), p.get("leader_url"), p.get("preferred_leader")]
            for p in partitions]


HEADERS = ["partition", "members", "leader", "leader_url", "preferred_leader"]


def cmd_partition_create(args: argparse.Namespace) -> int:
    async def verb(client: Any) -> int:
        row = await client.create_partition(args.name, args.replicas, args.nodes, leader_wait_s=args.leader_wait_s)
        if args.json:
            print(json.dumps(row))
        elif row.get("leader_id"):
            print(f"created partition {row['name']} on {', '.join(row['members'])}; led by {row['leader_id']} "
                  f"({row['leader_url']})")
        else:
            print(f"created partition {row['name']} on {', '.join(row['members'])}; no leader within "
                  f"{args.leader_wait_s:g} s yet (its members are starting it): rcq partition list shows it")
        return 0

    return with_client(args, verb)


def cmd_partition_list(args: argparse.Namespace) -> int:
    async def verb(client: Any) -> int:
        partitions = await client.partitions()
        if args.json:
            print(json.dumps(partitions))
        else:
            print_table(HEADERS, _rows(partitions))
        return 0

    return with_client(args, verb)


def cmd_partition_delete(args: argparse.Namespace) -> int:
    async def verb(client: Any) -> int:
        answer = await client.delete_partition(args.name)
        print(json.dumps(answer) if args.json else f"deleted partition {args.name}")
        return 0

    return with_client(args, verb)


def partition_hint(args: argparse.Namespace, error: RcqError) -> str | None:
    """What to do about a refused create or delete, in the verbs' terms."""
    details = error.details or {}
    hints = {
        "partition_not_empty": f"delete its queues first ({', '.join(details.get('queues') or [])}): "
                               "rcq queue delete QUEUE",
        "partition_exists": "rcq partition list shows it",
        "partition_not_found": "rcq partition list shows the partitions",
        "node_has_no_partition_ports": "start those nodes with --partition-ports (or partition_port_map), "
                                       "or name other --nodes",
        "partition_ports_exhausted": "widen those nodes' --partition-ports, or name ports for this partition "
                                     "(--partition-port NAME=HTTP,RAFT)",
        "feature_level_required": "raise the cluster's feature level first: rcq cluster feature-level --raise",
    }
    return hints.get(error.code)
