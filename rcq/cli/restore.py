"""``rcq restore PATH``: check a backup made by ``rcq backup``, restore it into a new cluster, or one queue of it
(docs/backup.md).

Four forms, each refusing a file that fails its checksum or is newer than this rcq before it
changes anything:

* ``--check``: verify the file and print its header;
* ``--data-dir DIR --nodes N``: a new local cluster in DIR (the layout ``python -m cluster up
  --data-dir DIR`` runs), each node's data directory seeded from the backup, with a new cluster
  secret and admin token;
* ``--node-config FILE`` (repeat) or ``--node-data-dir DIR --raft-address A --peer ...``: seed the
  data directory of nodes you configure yourself (docker-compose, your own deployment);
* ``--queue Q --into-queue Q2`` (with the client flags): one queue's items and settings into a
  running cluster as a new queue, through ordinary replicated commits.

Must not import: pysyncobj, lmdb; rcq.server at module level (seeding a data directory imports
it when it runs).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

from rcq.backup.backup_set import BackupSet, is_backup_set, partitions_room, verify_set
from rcq.backup.fileformat import Header, verify
from rcq.cli.backup import describe
from rcq.cli.connection import with_client
from rcq.cli.serve import _peer
from rcq.errors import InvalidRequest


def add_restore_parser(commands: Any, common: argparse.ArgumentParser) -> None:
    restore = commands.add_parser(
        "restore", parents=[common], help="check a backup, restore it into a new cluster, or one queue of it",
        description="Restore a backup made by rcq backup (docs/backup.md). A file that fails its checksum, or "
                    "of a newer format, is refused before anything changes.")
    restore.add_argument("path", type=Path, metavar="PATH")
    restore.add_argument("--check", action="store_true", help="only verify the file and print its header")
    restore.add_argument("--data-dir", type=Path, metavar="DIR",
                         help="make a new local cluster in DIR (run it with python -m cluster up --data-dir DIR)")
    restore.add_argument("--nodes", type=int, default=3, help="with --data-dir: the number of nodes (default 3)")
    restore.add_argument("--base-port", type=int, default=None, help="with --data-dir: fixed ports, as cluster up")
    restore.add_argument("--node-config", type=Path, action="append", default=None, metavar="FILE",
                         help="seed the data directory of the node this NodeConfig file describes (repeat)")
    restore.add_argument("--node-data-dir", type=Path, metavar="DIR", help="seed this one node's data directory")
    restore.add_argument("--raft-address", help="with --node-data-dir: the node's Raft address")
    restore.add_argument("--peer", action="append", type=_peer, default=None,
                         help="with --node-data-dir: another node as node_id=raft_host:port=http_url (repeat)")
    restore.add_argument("--queue", help="restore only this queue, into a running cluster (with --into-queue)")
    restore.add_argument("--into-queue", help="the new queue that receives it (must not exist)")
    restore.set_defaults(func=cmd_restore)


def cmd_restore(args: argparse.Namespace) -> int:
    forms = [args.check, args.data_dir is not None, bool(args.node_config), args.node_data_dir is not None,
             args.queue is not None]
    if sum(bool(form) for form in forms) != 1:
        raise InvalidRequest("give exactly one of --check, --data-dir, --node-config, --node-data-dir, --queue")
    if is_backup_set(args.path):
        return restore_set(args)
    header = verify(args.path)  # a damaged or newer file is refused before anything else
    if args.check:
        print(json.dumps({"path": str(args.path), **header.fields}) if args.json
              else describe(header, args.path, args.path.stat().st_size, "verified")
              + "\n  checked: the SHA-256 trailer over the whole file, and the header")
        return 0
    if args.queue is not None:
        return restore_queue(args)
    from rcq.server.raft.restore_seed import check_readable

    check_readable(header)
    if args.data_dir is not None:
        return restore_local_cluster(args)
    if args.node_config:
        from rcq.server.config import load_config

        configs = [load_config(path) for path in args.node_config]
        nodes = [(c.data_dir, c.raft_address, [p.raft_address for p in c.peers]) for c in configs]
    else:
        if args.raft_address is None or not args.peer:
            raise InvalidRequest("--node-data-dir needs --raft-address and --peer for every other node")
        nodes = [(args.node_data_dir, args.raft_address, [p["raft_address"] for p in args.peer])]
    # --node-config names every node of the new cluster at once; --node-data-dir one of them per run.
    seed_nodes(args.path, nodes, new_identity=bool(args.node_config))
    for data_dir, _, _ in nodes:
        print(f"restored {data_dir}: index {header.index}, data digest {header.data_digest}")
    print("start the nodes with a NEW cluster secret (docs/backup.md): the restored cluster must never meet the old one")
    return 0


def seed_nodes(backup: Path, nodes: list[tuple[Path, str, list[str]]], new_identity: bool = True) -> Header:
    """Seed each (data dir, Raft address, peers' Raft addresses) from ``backup``; nothing is left
    behind when one fails. Builds the snapshot once, then gives each node its own copy.

    ``new_identity`` (``nodes`` are the whole new cluster): it gets a NEW identity at feature level
    2, one uuid in the one snapshot every node starts from. Otherwise (``--node-data-dir``, run once
    per node) none, so that nodes seeded by separate runs agree: the first leader gives it one."""
    from rcq.server.raft.restore_seed import build_snapshot, refuse_non_empty, seed_data_dir

    for data_dir, _, _ in nodes:
        refuse_non_empty(Path(data_dir))
    seeded: list[Path] = []
    with tempfile.TemporaryDirectory(prefix="rcq-restore-", dir=Path(nodes[0][0]).parent) as scratch:
        snapshot = Path(scratch) / "snapshot.lmdb"
        header = build_snapshot(backup, snapshot, cluster_id=str(uuid.uuid4()) if new_identity else None)
        try:
            for data_dir, self_address, peers in nodes:
                seed_data_dir(snapshot, data_dir, header, self_address, peers)
                seeded.append(Path(data_dir))
        except BaseException:
            import shutil

            for data_dir in seeded:
                shutil.rmtree(data_dir, ignore_errors=True)
            raise
    return header


def restore_local_cluster(args: argparse.Namespace, backup_set: BackupSet | None = None) -> int:
    from rcq.local.cluster import ADMIN_TOKEN_NAME, MANIFEST_NAME, LocalCluster

    directory: Path = args.data_dir
    if (directory / MANIFEST_NAME).exists() or (directory.exists() and any(directory.iterdir())):
        raise InvalidRequest(f"{directory} is not empty (it may hold a cluster): a restore makes a new cluster "
                             "in an empty or new directory")
    # A set's partitions keep their numbers, so every node needs ports up to the highest of them.
    partitions_max = partitions_room(backup_set) if backup_set is not None else 0
    cluster = LocalCluster(args.nodes, base_dir=directory, base_port=args.base_port, keep=True,
                           partitions_max=partitions_max)
    try:
        if backup_set is not None:
            from rcq.cli.restore_set import seed_set
            from rcq.server.config import load_config

            seed_set(backup_set, [load_config(node.config_path) for node in cluster.nodes])
            done = (f"{backup_set.items} items in {len(backup_set.parts)} partitions, combined digest "
                    f"{backup_set.combined_digest}")
        else:
            header = seed_nodes(args.path, [(node.data_dir, node.raft_address,
                                             [cluster.peer_raft_address(node.index, other.index)
                                              for other in cluster.nodes if other is not node])
                                            for node in cluster.nodes])
            done = f"index {header.index}, {header['items']} items, data digest {header.data_digest}"
    except BaseException:
        import shutil

        shutil.rmtree(directory, ignore_errors=True)
        raise
    print(f"restored a new {args.nodes}-node cluster in {directory} from {args.path}: {done}")
    print(f"run it with: python -m cluster up --data-dir {directory}")
    print(f"its admin token is in {directory / ADMIN_TOKEN_NAME} (a new one; so is the cluster secret)")
    return 0


# ------------------------------------------------------------ a backup set
def restore_set(args: argparse.Namespace) -> int:
    """The four forms for a backup set (rcq.cli.restore_set): every part verified first."""
    from rcq.cli.cluster_backup import describe_set

    backup_set = verify_set(args.path)
    if args.check:
        print(json.dumps({"path": str(args.path), **backup_set.manifest}) if args.json
              else describe_set(backup_set, "verified") + "\n  checked: each part's SHA-256 trailer and header, the "
              "manifest, the combined digest, and p0's directory against the parts")
        return 0
    if args.queue is not None:
        return restore_queue(args)
    if args.node_data_dir is not None:
        raise InvalidRequest("a backup set (a cluster with partitions) is restored into every node at once: give "
                             "--node-config for each node, or --data-dir; --node-data-dir seeds one node of p0 only")
    from rcq.cli.restore_set import seed_set
    from rcq.server.config import load_config

    if args.data_dir is not None:
        return restore_local_cluster(args, backup_set)
    configs = [load_config(path) for path in args.node_config]
    seed_set(backup_set, configs)
    for config in configs:
        print(f"restored {config.data_dir}: p0 and partitions "
              f"{', '.join(p.name for p in backup_set.parts[1:] if config.node_id in p.members) or '(none)'}")
    print(f"combined digest {backup_set.combined_digest}")
    print("start the nodes with a NEW cluster secret (docs/backup.md): the restored cluster must never meet the old one")
    return 0


# ------------------------------------------------------------ one queue back
def restore_queue(args: argparse.Namespace) -> int:
    if not args.into_queue:
        raise InvalidRequest("--queue needs --into-queue (the new queue that receives the items)")
    from rcq.backup.queue_restore import restore_one_queue

    async def verb(client: Any) -> int:
        report = await restore_one_queue(client, args.path, args.queue, args.into_queue,
                                         progress=None if args.json else _progress)
        print(json.dumps(report) if args.json else
              f"restored {report['items']} items of {args.queue!r} (backup index {report['index']}) into "
              f"{args.into_queue!r} in {report['commits']} commits" +
              "".join(f"\n  note: {note}" for note in report["notes"]))
        return 0

    return with_client(args, verb)


def _progress(done: int, total: int) -> None:
    print(f"\r  {done}/{total} items", end="", file=sys.stderr, flush=True)
    if done == total:
        print(file=sys.stderr)
