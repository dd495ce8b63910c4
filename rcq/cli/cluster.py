"""The cluster verbs: ``status`` (each node's own view) and the admin verbs ``cluster members|add-node|
remove-node|transfer-leader`` (sent to the leader, with an admin token).

``status`` exits 1 when a node does not answer. A membership error is followed by what to do about
it, in the terms of the verb's flags (:func:`membership_hint`). ``cluster members`` shows the
leader's view (only the leader knows each member's match index): a follower that answers first
names the leader, which is asked next; when it cannot be, the follower's view is shown with a line
saying how to ask the leader.

Must not import: rcq.server, pysyncobj, lmdb.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from rcq.cli.connection import seconds, with_client
from rcq.cli.output import print_table
from rcq.cli.partitions import add_balance_parsers
from rcq.errors import RcqError


def add_status_parser(commands: Any, common: argparse.ArgumentParser) -> None:
    status = commands.add_parser("status", parents=[common],
                                 help="each node's view: role, term, leader, indexes (exit 1 if one is down)")
    status.set_defaults(func=cmd_status)


def add_cluster_parsers(commands: Any, common: argparse.ArgumentParser) -> None:
    """``rcq cluster members|add-node|remove-node|transfer-leader``: admin verbs, sent to the leader."""
    cluster = commands.add_parser(
        "cluster", help="list the members, add or remove a node, move leadership (admin token)",
        description="The cluster's membership. Every action needs an admin token; changes go to the leader "
                    "(found from any --url) and are refused while another change is being committed.")
    actions = cluster.add_subparsers(dest="cluster_command", required=True, metavar="ACTION")
    members = actions.add_parser("members", parents=[common],
                                 help="every member: role, Raft address, URL, replication progress (asked of the leader)")
    members.set_defaults(func=cmd_cluster_members, error_hint=membership_hint)
    add = actions.add_parser(
        "add-node", parents=[common], help="add a running node to the cluster",
        description="Add a node that is already running (rcq serve with its node id and Raft address, and the "
                    "current members as --peer): the leader checks its health first, then replicates to it and "
                    "waits up to --catch-up-timeout-s for it to catch up. --url names the nodes to ask, as in "
                    "every verb; the new node's own URL is --node-url.")
    add.add_argument("--node-id", required=True, help="the new node's id")
    add.add_argument("--raft-address", required=True, metavar="HOST:PORT", help="the new node's Raft listener")
    add.add_argument("--node-url", required=True, metavar="URL",
                     help="the URL the new node serves clients on, e.g. http://10.0.0.4:7001")
    add.add_argument("--catch-up-timeout-s", type=seconds, default=60.0,
                     help="how long the leader waits for the new node to catch up, 0 to 600 (default 60)")
    add.set_defaults(func=cmd_cluster_add_node, error_hint=membership_hint)
    remove = actions.add_parser(
        "remove-node", parents=[common], help="remove a member from the cluster",
        description="Remove a member (stop it afterwards). Removing the leader makes it hand leadership over "
                    "first; the request follows it to the new leader.")
    remove.add_argument("node_id", metavar="NODE_ID")
    remove.set_defaults(func=cmd_cluster_remove_node, error_hint=membership_hint)
    transfer = actions.add_parser(
        "transfer-leader", parents=[common], help="hand leadership to a member",
        description="Hand leadership to NODE_ID, or (without it) to the most caught-up follower.")
    transfer.add_argument("node_id", metavar="NODE_ID", nargs="?", default=None)
    transfer.set_defaults(func=cmd_cluster_transfer_leader, error_hint=membership_hint)
    level = actions.add_parser(
        "feature-level", parents=[common], help="the cluster's feature level, and what each member reads",
        description="Show the cluster's active feature level and each member's version and highest readable "
                    "level; with --raise, raise the active level (to LEVEL, or to the highest every member "
                    "reads). A level never goes down (docs/upgrades.md).")
    level.add_argument("--raise", dest="raise_to", nargs="?", const=0, default=None, type=int, metavar="LEVEL",
                       help="raise the level (without LEVEL: to the highest every member reads)")
    level.set_defaults(func=cmd_cluster_feature_level)
    add_balance_parsers(actions, common)  # the leader balancer's verbs live with the partitions' ones


def cmd_status(args: argparse.Namespace) -> int:
    """Ask every given node for its own view (no redirects): disagreements are the point."""
    async def verb(client: Any) -> int:
        urls = client.urls
        views = await asyncio.gather(*(client.cluster(url) for url in urls), return_exceptions=True)
        for view in views:
            if isinstance(view, BaseException) and not isinstance(view, RcqError):
                raise view
        nodes = [{"url": url, "ok": not isinstance(view, RcqError),
                  **({"error": view.to_body()["error"]} if isinstance(view, RcqError) else {"status": view})}
                 for url, view in zip(urls, views, strict=True)]
        if args.json:
            print(json.dumps({"nodes": nodes}))
        else:
            rows = []
            for node in nodes:
                view = node.get("status") or {}
                rows.append([node["url"], view.get("node_id"), view.get("role", "unreachable"), view.get("term"),
                             view.get("leader_id"), view.get("serving"), view.get("commit_index"),
                             view.get("last_applied"), view.get("open_transactions")])
            print_table(["URL", "NODE", "ROLE", "TERM", "LEADER", "SERVING", "COMMIT", "APPLIED", "OPEN_TX"], rows)
        for node in nodes:
            if not node["ok"]:
                print(f"rcq: {node['error']['code']}: {node['url']}: {node['error']['message']}", file=sys.stderr)
        return 0 if all(node["ok"] for node in nodes) else 1

    return with_client(args, verb)


def _print_members(members: list[dict[str, Any]]) -> None:
    def yes_no(value: Any) -> str | None:
        return None if value is None else ("yes" if value else "no")

    print_table(["NODE", "ROLE", "RAFT_ADDRESS", "URL", "CONNECTED", "MATCH_INDEX"],
                [[m.get("node_id"), m.get("role"), m.get("raft_address"), m.get("url"), yes_no(m.get("connected")),
                  m.get("match_index")] for m in members])


def cmd_cluster_members(args: argparse.Namespace) -> int:
    async def verb(client: Any) -> int:
        members, note = await leaders_members(client)
        if args.json:
            print(json.dumps(members))
        else:
            _print_members(members)
        if note is not None:
            print(f"rcq: {note}", file=sys.stderr)
        return 0

    return with_client(args, verb)


async def leaders_members(client: Any) -> tuple[list[dict[str, Any]], str | None]:
    """The members as the leader sees them, and None; or, when only a follower answered, its view
    and a note saying where the match indexes are. Any node answers first (the first ``--url``);
    a follower's answer names the leader and its URL (the member whose role is ``leader``)."""
    members: list[dict[str, Any]] = await client.cluster_members()
    answering = next((member for member in members if member.get("self")), None)
    if answering is None or answering.get("role") == "leader":
        return members, None
    leader = next((member for member in members if member.get("role") == "leader"), None)
    leader_url = leader.get("url") if leader is not None else None
    if leader_url is None:
        reason = f"{answering.get('node_id')} answered and knows no leader now"
    else:
        try:
            return await client.cluster_members(leader_url), None
        except RcqError as exc:
            reason = f"{answering.get('node_id')} answered; the leader did not ({exc.code}: {exc.message})"
    return members, (f"match indexes are known only to the leader: {reason}; ask it with "
                     f"--url {leader_url or 'LEADER_URL (rcq status names the leader)'}")


def cmd_cluster_feature_level(args: argparse.Namespace) -> int:
    async def verb(client: Any) -> int:
        if args.raise_to is not None:
            target = args.raise_to or None  # --raise alone: the highest every member reads
            answer = await client.raise_feature_level(target)
            if args.json:
                print(json.dumps(answer))
                return 0
            print(f"feature level {answer['level']}" + (f" (was {answer['previous']})" if answer["changed"]
                                                        else " (unchanged)"))
            return 0
        report = await client.feature_level()
        if args.json:
            print(json.dumps(report))
            return 0
        print(f"active feature level {report['active']} (this node reads up to {report['max']}; "
              f"raised automatically: {'yes' if report['auto'] else 'no'})")
        print_table(["NODE", "URL", "VERSION", "READS_UP_TO", "PROBLEM"],
                    [[m["node_id"], m["url"], m["version"], m["level_max"], m["problem"]] for m in report["members"]])
        return 0

    return with_client(args, verb)


def cmd_cluster_add_node(args: argparse.Namespace) -> int:
    async def verb(client: Any) -> int:
        answer = await client.add_node(args.node_id, args.raft_address, args.node_url,
                                       catch_up_timeout_s=args.catch_up_timeout_s)
        if args.json:
            print(json.dumps(answer))
            return 0
        added = answer["added"]
        progress = ("it has caught up" if answer.get("caught_up") else
                    f"it has not caught up within {args.catch_up_timeout_s:g} s and keeps catching up")
        print(f"added node {added['node_id']} ({added['raft_address']}, {added['url']}): {progress}")
        _print_members(answer["members"])
        return 0

    return with_client(args, verb)


def cmd_cluster_remove_node(args: argparse.Namespace) -> int:
    async def verb(client: Any) -> int:
        answer = await client.remove_node(args.node_id)
        if args.json:
            print(json.dumps(answer))
            return 0
        removed = answer["removed"]
        print(f"removed node {removed['node_id']} ({removed['raft_address']}, {removed['url']}); "
              f"{len(answer['members'])} member(s) left: stop it now")
        _print_members(answer["members"])
        return 0

    return with_client(args, verb)


def cmd_cluster_transfer_leader(args: argparse.Namespace) -> int:
    async def verb(client: Any) -> int:
        answer = await client.transfer_leadership(args.node_id)
        if args.json:
            print(json.dumps(answer))
        else:
            print(f"leadership moved from {answer['previous_leader_id']} to {answer['leader_id']}")
        return 0

    return with_client(args, verb)


def membership_hint(args: argparse.Namespace, error: RcqError) -> str | None:
    """What to do about an error of ``rcq cluster ACTION``, in the terms of its flags (None: the message says it)."""
    action = f"rcq cluster {args.cluster_command}"
    node_id = getattr(args, "node_id", None)
    hints = {
        "forbidden": f"{action} needs an admin token (rcq token create --admin)",
        "member_exists": f"node {node_id} or the Raft address {getattr(args, 'raft_address', None)} is already a "
                         "member: see rcq cluster members",
        "member_not_found": f"no member has the node id {node_id}: see rcq cluster members",
        "membership_conflict": "another membership change is still being committed, or the new leader has not yet "
                               "committed an entry of its term"
                               + (", or the target has not caught up" if args.cluster_command == "transfer-leader"
                                  else "") + ": try again in a moment",
        "would_lose_quorum": "refused, nothing changed: afterwards fewer members would be reachable than a majority; "
                             "rcq cluster members shows which are not connected: bring them back first",
        "node_unreachable": f"the leader cannot reach {getattr(args, 'node_url', None)}/healthz as node {node_id}: "
                            "start the node first (rcq serve with this node id and Raft address, and the current "
                            "members as --peer) and check that the leader can reach that URL",
        "commit_outcome_unknown": "the change may or may not have been applied: see rcq cluster members before "
                                  "trying again",
    }
    return hints.get(error.code)
