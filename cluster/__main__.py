"""The local launcher: ``python -m cluster up`` runs an rcq cluster on 127.0.0.1.

    python -m cluster up [--nodes N] [--base-port P] [--data-dir DIR] [--insecure] [--no-auth] [--tls]
                         [--restore BACKUP] [--keep] [--demo [--stay]] [--log-level LEVEL]
    python -m cluster image [--engine auto|docker|podman] [--base IMAGE]     # rcq:local (cluster/image.py)
    python -m cluster compose [--engine auto|docker|podman] [--file FILE] ARGS...   # docker-compose.yml's cluster

``image`` builds the node image docker-compose.yml runs, with no network inside the build;
``compose`` runs ``docker compose`` or ``podman-compose`` on docker-compose.yml with what the
engine needs in its environment (:mod:`cluster.engine`): ``python -m cluster compose up -d``.

Starts N node processes (a :class:`rcq.local.cluster.LocalCluster`), waits for a
serving leader, prints every node's URL and pid and which one leads, then runs
until Ctrl-C or SIGTERM, when it stops every node and exits 0. ``--demo`` runs a
short walk through the queue semantics with the async client (:mod:`rcq.client`)
and then shuts down, unless ``--stay``.

The nodes require an API token, as a production cluster does: an admin token is made (or taken
from ``$RCQ_ADMIN_TOKEN``, as docker-compose does) and kept in ``DIR/admin.token`` (mode 0600).
The launcher prints how to use it, naming that file rather than printing the token: a
terminal's scrollback and a CI log are not private
(``--no-auth``: no tokens, anyone on this machine may use the cluster). ``--tls``: the nodes
serve HTTPS with certificates of a CA made for the cluster (``DIR/tls/ca.pem``, which clients
verify against).

Data: a fresh temporary directory, removed on exit unless ``--keep``; with
``--data-dir DIR`` the cluster lives in DIR and is never removed, and a DIR that
already holds a cluster is reopened with the same ports, secret and queues.

Must not import: pysyncobj, lmdb (nodes are separate processes).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import threading
from pathlib import Path
from types import FrameType

from cluster.engine import COMPOSE_FILE, ENGINES, EngineCommandFailed, EngineUnavailable, choose_engine
from cluster.image import build_image
from rcq.backup.backup_set import is_backup_set, read_manifest
from rcq.client import RcqClient
from rcq.errors import RcqError
from rcq.local.cluster import ADMIN_TOKEN_NAME, MANIFEST_NAME, LocalCluster
from rcq.local.polls import NodeStartError

LEADER_TIMEOUT_S = 60.0
DEMO_QUEUE = "demo"
HEALTH_CHECK_INTERVAL_S = 1.0


class Shutdown(BaseException):
    """SIGINT or SIGTERM arrived: stop the cluster and exit 0."""


def _install_signal_handlers() -> threading.Event:
    """SIGINT/SIGTERM raise Shutdown once; after that (or once the returned event is set) they are ignored."""
    shutting_down = threading.Event()

    def handler(signum: int, frame: FrameType | None) -> None:
        if shutting_down.is_set():
            return  # already stopping; a second Ctrl-C must not interrupt the cleanup
        shutting_down.set()
        raise Shutdown(signal.Signals(signum).name)

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
    return shutting_down


PARTITIONS_ROOM = 4  # partitions a launched cluster has ports for beyond those --partitions asks for


def say(text: str = "") -> None:
    print(text, flush=True)


# ------------------------------------------------------------------ cluster set-up
def open_cluster(args: argparse.Namespace) -> LocalCluster:
    if args.restore is not None and args.data_dir is not None and (args.data_dir / MANIFEST_NAME).exists():
        raise SystemExit(f"cluster: {args.data_dir} already holds a cluster; --restore makes a new one "
                         "(give an empty or new --data-dir)")
    if args.data_dir is not None and (args.data_dir / MANIFEST_NAME).exists():
        cluster = LocalCluster.reopen(args.data_dir, log_level=args.log_level)
        if args.nodes is not None and args.nodes != len(cluster.nodes):
            raise SystemExit(f"cluster: {args.data_dir} holds a {len(cluster.nodes)}-node cluster; "
                             f"drop --nodes or use another --data-dir")
        if args.base_port is not None and args.base_port != cluster.nodes[0].http_port:
            raise SystemExit(f"cluster: {args.data_dir} fixes the ports (HTTP from {cluster.nodes[0].http_port}); "
                             "drop --base-port or use another --data-dir")
        if args.tls and not cluster.tls:
            raise SystemExit(f"cluster: the cluster in {args.data_dir} serves plain HTTP; drop --tls or use "
                             "another --data-dir")
        if args.no_auth and cluster.auth:
            raise SystemExit(f"cluster: the cluster in {args.data_dir} requires tokens; drop --no-auth or use "
                             "another --data-dir")
        say(f"reopening the {len(cluster.nodes)}-node cluster in {args.data_dir} (queues kept)")
        return cluster
    nodes = args.nodes if args.nodes is not None else 3
    # RCQ_ADMIN_TOKEN, as for docker-compose: a token chosen beforehand (a benchmark harness that
    # starts the launcher can then hand it to its clients); otherwise one is made.
    admin_token = os.environ.pop("RCQ_ADMIN_TOKEN", None) or None
    # Partitions beyond p0 need ports on every node: those asked for, and room for four more.
    partitions_max = args.partitions - 1 + PARTITIONS_ROOM if args.partitions > 1 else 0
    if args.restore is not None and is_backup_set(args.restore):  # its partitions keep their numbers (ports)
        numbers = [int(row["number"]) for row in read_manifest(args.restore)["partitions"]]
        partitions_max = max(partitions_max, max(numbers) + PARTITIONS_ROOM)
    cluster = LocalCluster(nodes, base_dir=args.data_dir, log_level=args.log_level, keep=args.keep,
                           insecure=args.insecure, base_port=args.base_port, auth=not args.no_auth, tls=args.tls,
                           admin_token=None if args.no_auth else admin_token, partitions_max=partitions_max)
    if args.restore is not None:
        try:  # a new cluster (new secret, new token) whose state is the backup's (docs/backup.md)
            cluster.restore_from(args.restore)
        except BaseException:
            cluster.close()
            raise
        say(f"restored the backup {args.restore} into the new cluster")
    if args.data_dir is None:
        kept = "kept on exit" if args.keep else "removed on exit"
        say(f"starting a {nodes}-node cluster in {cluster.base_dir} ({kept})")
    else:
        say(f"starting a new {nodes}-node cluster in {cluster.base_dir}")
    return cluster


def print_nodes(cluster: LocalCluster, leader: int, stops_after_demo: bool = False) -> None:
    pids = cluster.pids()
    for node in cluster.nodes:
        role = "leader" if node.index == leader else "follower"
        say(f"  {node.node_id}  {node.url}  raft {node.raft_address}  pid {pids.get(node.index)}  {role}")
    say(f"leader: {cluster.nodes[leader].node_id} {cluster.url(leader)}")
    secret_note = ("insecure: Raft traffic is not encrypted" if cluster.insecure
                   else "cluster secret in node-*/config.json (mode 0600)")
    say(f"logs: {cluster.base_dir}/node-*/node.log; {secret_note}")
    say("to use it from a shell (it stops after the demo: --demo --stay, or ./run up, keeps one running):"
        if stops_after_demo else "to use it from a shell:")
    say(f"  export RCQ_URLS={','.join(cluster.urls)}")
    if cluster.token is not None:
        say(f"  export RCQ_TOKEN=$(cat {cluster.base_dir / ADMIN_TOKEN_NAME})   # the admin token (mode 0600)")
    else:
        say("  (no tokens: --no-auth, anyone on this machine may use the cluster)")
    if cluster.ca_file is not None:
        say(f"  export RCQ_CA_FILE={cluster.ca_file}   # the CA that signed the nodes' certificates")


def watch(cluster: LocalCluster) -> None:
    """Block until a signal; report nodes that exit on their own meanwhile."""
    reported: set[int] = set()
    idle = threading.Event()  # never set: its wait() is an interruptible sleep
    while True:
        idle.wait(HEALTH_CHECK_INTERVAL_S)
        for index, code in cluster.unexpected_exits().items():
            if index not in reported:
                reported.add(index)
                say(f"warning: {cluster.nodes[index].node_id} exited with {code}; its log:\n"
                    + cluster.log_tail(index, 2_000))


# ---------------------------------------------------------------------- the demo
def _text(value: bytes | None) -> str:
    return repr(None if value is None else value.decode("utf-8", errors="replace"))


async def run_demo(cluster: LocalCluster, leader: int) -> None:
    """A walk through the queue semantics with the async client (rcq.client)."""
    async with RcqClient(cluster.urls, **cluster.client_options()) as client:

        async def show_count(note: str = "") -> None:
            info = await client.queue_info(DEMO_QUEUE)
            say(f"    count({DEMO_QUEUE}) = {info['count']} (available {info['available']}, "
                f"locked {info['locked']})" + (f" {note}" if note else ""))

        say("\n== demo: the async client against the cluster ==")
        say(f"1. a transaction enqueues three items into {DEMO_QUEUE!r}")
        async with client.transaction(timeout_s=30) as tx:
            await tx.enqueue_batch(DEMO_QUEUE, ["apple", "banana", "cherry"])
            say(f"    transaction {tx.transaction_id}: 3 items buffered")
            await show_count("<- before commit: enqueues are invisible")
        assert tx.commit_info is not None
        say(f"    committed at Raft index {tx.commit_info.index} (a majority has it in its log)")
        await show_count("<- after commit")

        say("2. peek = dequeue + abort")
        say(f"    head of {DEMO_QUEUE!r}: {_text(await client.peek(DEMO_QUEUE))} (left in place)")

        say("3. dequeue, then abort: the item returns to the head")
        tx = await client.begin(timeout_s=30)
        say(f"    dequeued {_text(await tx.dequeue(DEMO_QUEUE))}")
        await show_count("<- locked by the open transaction, invisible to others")
        say(f"    aborted: {await tx.abort()} item returned")
        await show_count()

        say("4. dequeue, then commit: the item is gone for good")
        async with client.transaction(timeout_s=30) as tx:
            value = await tx.dequeue(DEMO_QUEUE)
        assert tx.commit_info is not None
        say(f"    dequeued {_text(value)} (the head again) and committed at index {tx.commit_info.index}")
        await show_count()

        followers = [node.index for node in cluster.nodes if node.index != leader]
        if followers:
            follower = cluster.nodes[followers[0]]
            say(f"5. a follower ({follower.node_id}) answers count too, once it has applied the commit")
            await asyncio.to_thread(cluster.wait_for_applied, LEADER_TIMEOUT_S)
            async with RcqClient(follower.url, **cluster.client_options()) as follower_client:
                info = await follower_client.queue_info(DEMO_QUEUE)
            say(f"    count({DEMO_QUEUE}) on {info['node_id']} ({info['role']}) = {info['count']}")

        say("6. cluster status")
        converged = await asyncio.to_thread(cluster.wait_for_convergence, LEADER_TIMEOUT_S)
        for node in cluster.nodes:
            status = await client.cluster(node.url)
            say(f"    {status['node_id']}: {status['role']:<9} term {status['term']} commit {status['commit_index']} "
                f"applied {status['last_applied']} serving {status['serving']}")
        say(f"    every node has state digest {converged['digest'][:16]}... at index {converged['applied_index']}")
    say("== demo done ==\n")


# -------------------------------------------------------------------------- main
def cmd_up(args: argparse.Namespace) -> int:
    shutting_down = _install_signal_handlers()
    cluster: LocalCluster | None = None
    try:
        cluster = open_cluster(args)
        cluster.start()
        leader = cluster.wait_for_leader(LEADER_TIMEOUT_S)
        partitions = cluster.ensure_partitions(args.partitions, LEADER_TIMEOUT_S) if args.partitions > 1 else []
        if args.restore is not None and is_backup_set(args.restore):  # 'ready' once every restored one leads
            names = [str(row["name"]) for row in read_manifest(args.restore)["partitions"]]
            partitions = cluster.wait_partitions_led(names, LEADER_TIMEOUT_S)
        print_nodes(cluster, leader, stops_after_demo=args.demo and not args.stay)
        for row in partitions:
            say(f"  {row['name']}  members {','.join(row['members'])}  leader {row['leader_id']} {row['leader_url']}")
        say("ready")
        if args.demo:
            asyncio.run(run_demo(cluster, leader))
            if not args.stay:
                say("stopping the cluster")
                return 0
        say("press Ctrl-C to stop")
        watch(cluster)
        return 0  # not reached: watch() returns only by an exception
    except Shutdown as exc:
        say(f"\n{exc}: stopping the cluster")
        return 0
    except (NodeStartError, TimeoutError, RuntimeError, OSError, RcqError) as exc:
        say(f"cluster: {exc}")
        if cluster is not None:
            say(cluster.dump_logs())
        return 1
    finally:
        shutting_down.set()  # a signal now must not interrupt the shutdown below
        if cluster is not None:
            cluster.close()
            say("stopped")


def cmd_image(args: argparse.Namespace) -> int:
    try:
        engine = choose_engine(args.engine)
        say(f"engine: {engine.version}")
        built = build_image(engine, base=args.base)
    except (EngineUnavailable, EngineCommandFailed) as exc:
        say(f"cluster image: {exc}")
        return 1
    steps = ", ".join(f"{name.removesuffix('_s')} {value:.0f} s" for name, value in built.seconds.items())
    say(f"built {built.image} on {built.base}: {built.size_bytes / 1e6:.0f} MB ({steps})")
    for name, value in engine.env.items():
        say(f"for the engine's own commands: export {name}={value}")
    return 0


def cmd_compose(args: argparse.Namespace) -> int:
    try:
        engine = choose_engine(args.engine)
    except (EngineUnavailable, EngineCommandFailed) as exc:
        say(f"cluster compose: {exc}")
        return 1
    command = [*engine.compose, "-f", str(args.file), *args.compose_args]
    os.execvpe(command[0], command, engine.environment())


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m cluster", description="run an rcq cluster on 127.0.0.1")
    commands = parser.add_subparsers(dest="command", required=True)
    up = commands.add_parser("up", help="start a local cluster and run it until Ctrl-C")
    up.add_argument("--nodes", type=int, choices=range(1, 10), metavar="N",
                    help="number of nodes, 1..9 (default 3, or the count of the cluster in --data-dir)")
    up.add_argument("--base-port", type=int, metavar="P",
                    help="HTTP on P..P+N-1 and Raft on P+100..P+100+N-1 (default: free ports)")
    up.add_argument("--data-dir", type=Path, metavar="DIR",
                    help="keep the cluster here; a DIR holding one is reopened (default: a temp dir)")
    up.add_argument("--insecure", action="store_true", help="no cluster secret (Raft traffic unencrypted)")
    up.add_argument("--no-auth", action="store_true",
                    help="no API tokens: anyone on this machine may use the cluster (default: an admin token "
                         "in DIR/admin.token)")
    up.add_argument("--tls", action="store_true", help="HTTPS, with certificates of a CA made for the cluster")
    up.add_argument("--restore", type=Path, metavar="BACKUP",
                    help="start a NEW cluster whose state is this backup's (rcq backup; docs/backup.md)")
    up.add_argument("--partitions", type=int, choices=range(1, 17), default=1, metavar="N",
                    help="partitions p0 ... p{N-1} (docs/partitions.md; default 1: p0 alone); 'ready' once each "
                         "has a serving leader")
    up.add_argument("--keep", action="store_true", help="keep the temporary data dir on exit")
    up.add_argument("--demo", action="store_true", help="run a short demonstration, then stop")
    up.add_argument("--stay", action="store_true", help="with --demo: keep running afterwards")
    up.add_argument("--log-level", default="INFO", help="the nodes' log level (default INFO)")
    up.set_defaults(func=cmd_up)
    image = commands.add_parser("image", help="build the node image of docker-compose.yml (rcq:local)")
    image.add_argument("--engine", choices=ENGINES, default="auto",
                       help="docker (an engine and its compose plugin), podman (with podman-compose), or auto: "
                            "docker when it answers, else podman")
    image.add_argument("--base", metavar="IMAGE",
                       help="the base image, with Python 3.11 (default $RCQ_BASE_IMAGE or python:3.11-slim; made "
                            "from the Debian archive with debootstrap when it cannot be pulled)")
    image.set_defaults(func=cmd_image)
    compose = commands.add_parser("compose", help="docker compose / podman-compose on docker-compose.yml")
    compose.add_argument("--engine", choices=ENGINES, default="auto", help="as for image")
    compose.add_argument("--file", type=Path, default=COMPOSE_FILE, metavar="FILE",
                         help="the compose file (default docker-compose.yml; docker-compose.5-nodes.yml: 5 nodes)")
    compose.add_argument("compose_args", nargs=argparse.REMAINDER, metavar="ARGS",
                         help="what compose is given, e.g. up -d, ps, down -v")
    compose.set_defaults(func=cmd_compose)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "stay", False) and not args.demo:
        build_parser().error("--stay needs --demo")
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
