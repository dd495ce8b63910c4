"""The partition verbs (docs/partitions.md, docs/operations.md): ``rcq partition
create|list|delete|add-member|remove-member|replace-member|transfer-leader``, ``rcq node drain``, ``rcq cluster
balance|rebalance``.

``create`` answers once the new partition has a leader (or says it has none yet after
``--leader-wait-s``: it is created, and its members are still starting it). ``delete`` refuses a
partition that holds a queue, naming them. The member verbs answer once the partition's Raft group
matches and every member caught up (or say it is still settling after ``--timeout-s``). Every verb
but ``list`` needs an admin token.

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
    for verb, help_text, func in (
            ("add-member", "make NODE_ID a member of partition NAME", cmd_partition_add_member),
            ("remove-member", "take NODE_ID out of partition NAME (its data of it is removed)",
             cmd_partition_remove_member),
            ("replace-member", "give NODE_ID's place in partition NAME to another node (--by, or the node "
                               "with the fewest partitions)", cmd_partition_replace_member)):
        action = actions.add_parser(verb, parents=[common], help=f"{help_text} (admin token)", description=help_text)
        action.add_argument("name", metavar="NAME")
        action.add_argument("node_id", metavar="NODE_ID")
        if verb == "replace-member":
            action.add_argument("--by", default=None, metavar="NODE_ID", help="the node to take its place")
        action.add_argument("--timeout-s", type=seconds, default=120.0,
                            help="how long to wait for the change to settle, 0 to 600 (default 120)")
        action.set_defaults(func=func, error_hint=partition_hint)
    transfer = actions.add_parser(
        "transfer-leader", parents=[common], help="hand a partition's leadership to a member (admin token)",
        description="Hand partition NAME's leadership to NODE_ID, or (without it) to its most caught-up follower. "
                    "The balancer may move it again a minute later, if it leaves the leaders uneven.")
    transfer.add_argument("name", metavar="NAME")
    transfer.add_argument("node_id", metavar="NODE_ID", nargs="?", default=None)
    transfer.set_defaults(func=cmd_partition_transfer_leader, error_hint=partition_hint)
    node = commands.add_parser("node", help="a node's partition replicas",
                               description="A node's replicas of the partitions (docs/operations.md).")
    node_actions = node.add_subparsers(dest="node_command", required=True, metavar="ACTION")
    drain = node_actions.add_parser(
        "drain", parents=[common], help="move a node's partition replicas to other nodes (admin token)",
        description="Give NODE_ID's place in every partition it is a member of to another node, one partition "
                    "after the other (each new member caught up before the old one leaves), before the node is "
                    "retired (rcq cluster remove-node).")
    drain.add_argument("node_id", metavar="NODE_ID")
    drain.add_argument("--timeout-s", type=seconds, default=120.0,
                       help="how long to wait for each change, 0 to 600 (default 120)")
    drain.set_defaults(func=cmd_node_drain, error_hint=partition_hint)


def add_balance_parsers(actions: Any, common: argparse.ArgumentParser) -> None:
    """``rcq cluster balance`` and ``rcq cluster rebalance`` (the leader balancer)."""
    balance = actions.add_parser("balance", parents=[common], help="leaders per node and each partition's leader",
                                 description="How partition leaders are spread over the nodes, as p0's leader "
                                             "last surveyed them, and what its balancer did.")
    balance.set_defaults(func=cmd_cluster_balance)
    rebalance = actions.add_parser(
        "rebalance", parents=[common], help="move partition leaders now until they are spread (admin token)",
        description="Move partition leaders, one at a time, until no node leads two more than another; "
                    "the balancer does the same by itself, a minute after leaders change.")
    rebalance.set_defaults(func=cmd_cluster_rebalance)


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


def _settled_line(answer: dict[str, Any]) -> str:
    members = ", ".join(answer.get("members") or [])
    if answer.get("settled"):
        return f"partition {answer['partition']}: members {members}, all caught up; led by {answer.get('leader_id')}"
    return (f"partition {answer['partition']}: members {members} in the directory; Raft members "
            f"{', '.join(answer.get('raft_members') or []) or 'unknown'} so far, still settling "
            "(rcq cluster balance shows it)")


def cmd_partition_add_member(args: argparse.Namespace) -> int:
    async def verb(client: Any) -> int:
        answer = await client.add_partition_member(args.name, args.node_id, timeout_s=args.timeout_s)
        print(json.dumps(answer) if args.json else _settled_line(answer))
        return 0 if answer.get("settled") else 3

    return with_client(args, verb)


def cmd_partition_remove_member(args: argparse.Namespace) -> int:
    async def verb(client: Any) -> int:
        answer = await client.remove_partition_member(args.name, args.node_id, timeout_s=args.timeout_s)
        print(json.dumps(answer) if args.json else _settled_line(answer))
        return 0 if answer.get("settled") else 3

    return with_client(args, verb)


def cmd_partition_replace_member(args: argparse.Namespace) -> int:
    async def verb(client: Any) -> int:
        answer = await client.replace_partition_member(args.name, args.node_id, args.by, timeout_s=args.timeout_s)
        if args.json:
            print(json.dumps(answer))
        else:
            print(f"{answer['replaced']} -> {answer['by']}: {_settled_line(answer)}")
        return 0 if answer.get("settled") and answer.get("step") == "done" else 3

    return with_client(args, verb)


def cmd_partition_transfer_leader(args: argparse.Namespace) -> int:
    async def verb(client: Any) -> int:
        answer = await client.transfer_partition_leadership(args.name, args.node_id)
        print(json.dumps(answer) if args.json else
              f"partition {args.name}: leadership moved from {answer['previous_leader_id']} to {answer['leader_id']}")
        return 0

    return with_client(args, verb)


def cmd_node_drain(args: argparse.Namespace) -> int:
    async def verb(client: Any) -> int:
        answer = await client.drain_node(args.node_id, timeout_s=args.timeout_s)
        if args.json:
            print(json.dumps(answer))
        else:
            for moved in answer["moved"]:
                print(f"{moved['partition']}: {moved['replaced']} -> {moved['by']} ({moved['step']})")
            print(f"{args.node_id} drained: it is a member of no partition" if answer["drained"] else
                  f"{args.node_id} is still a member of {', '.join(answer['partitions_left'])}")
        return 0 if answer["drained"] else 3

    return with_client(args, verb)


def cmd_cluster_balance(args: argparse.Namespace) -> int:
    async def verb(client: Any) -> int:
        answer = await client.leader_balance()
        if args.json:
            print(json.dumps(answer))
            return 0
        counts = answer["leaders_per_node"]
        print("leaders per node: " + ", ".join(f"{n} {c}" for n, c in sorted(counts.items())) +
              f" (spread {answer['spread']}; balancer {'on' if answer['balance'] else 'off'}, "
              f"{answer['moves_total']} moves)")
        print_table(["partition", "leader", "members", "raft_members", "settled"],
                    [[p["name"], p["leader_id"], ",".join(p["members"]), ",".join(p["raft_members"] or []),
                      p["settled"]] for p in answer["partitions"]])
        return 0

    return with_client(args, verb)


def cmd_cluster_rebalance(args: argparse.Namespace) -> int:
    async def verb(client: Any) -> int:
        answer = await client.rebalance()
        if args.json:
            print(json.dumps(answer))
            return 0
        for move in answer["moves"]:
            print(f"{move['partition']}: {move['from']} -> {move['to']}")
        counts = answer["leaders_per_node"]
        print(f"{len(answer['moves'])} moves; leaders per node: " +
              ", ".join(f"{n} {c}" for n, c in sorted(counts.items())))
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
        "member_exists": "rcq partition list shows its members",
        "member_not_found": "rcq partition list shows its members",
        "node_partitions_full": "that node is a member of as many partitions as a node may: drain it, or name "
                                "another node",
    }
    return hints.get(error.code)
