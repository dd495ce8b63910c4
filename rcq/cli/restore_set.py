"""``rcq restore`` of a backup set: a NEW cluster with the same partitions (docs/backup.md).

The new cluster is given by every node's NodeConfig (``--node-config`` for each, or the configs
``--data-dir`` makes). Before any file is written the whole set is verified
(:func:`rcq.backup.backup_set.verify_set`), and the new cluster must be able to run it: every
member a partition names is one of its nodes (node ids are kept: a partition's members are node
ids in p0's directory), and each such node has ports for that partition's number. Then, per
node: p0's data directory from the p0 part (as a backup file is restored), and for each partition
it is a member of, ``<data_dir>/partitions/<name>.<number>`` from that partition's part, with the
partition's Raft addresses on the new nodes as its members (where the node's partition host will
run it: rcq.server.partitions.ports). A partition process that finds its data directory seeded
starts from it; p0's leader records the new nodes' ports (the restored directory holds none), and
the hosts then start the partitions. Each snapshot is built once and copied; anything seeded is
removed when one step fails.

Must not import: pysyncobj, lmdb; rcq.server at module level.
"""

from __future__ import annotations

import shutil
import tempfile
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

from rcq.backup.backup_set import P0, BackupSet
from rcq.errors import InvalidRequest

if TYPE_CHECKING:
    from rcq.server.config import NodeConfig


def check_runnable(backup_set: BackupSet, configs: list[NodeConfig]) -> None:
    """InvalidRequest when the nodes of ``configs`` cannot run the set's partitions."""
    from rcq.server.partitions.ports import MemberPorts, PartitionPortsExhausted

    by_id = {config.node_id: config for config in configs}
    for part in backup_set.parts[1:]:
        unknown = [member for member in part.members if member not in by_id]
        if unknown:
            raise InvalidRequest(
                f"partition {part.name}'s members are {', '.join(part.members)}; the new cluster has no node "
                f"{', '.join(unknown)} (it has {', '.join(sorted(by_id))}): restore into nodes with the same ids")
        for member in part.members:
            config = by_id[member]
            try:
                MemberPorts.of(config).bound(part.name, part.number)
            except PartitionPortsExhausted as exc:
                raise InvalidRequest(f"node {member} cannot serve partition {part.name} (number {part.number}): "
                                     f"{exc}") from exc


def seed_set(backup_set: BackupSet, configs: list[NodeConfig]) -> None:
    """Seed the data directories of every node of the new cluster from ``backup_set``."""
    from rcq.server.partitions.ports import PARTITIONS_DIR, MemberPorts, data_dir_name
    from rcq.server.raft.restore_seed import build_snapshot, check_readable, refuse_non_empty, seed_data_dir

    for part in backup_set.parts:
        check_readable(part.header)
    check_runnable(backup_set, configs)
    for config in configs:
        refuse_non_empty(config.data_dir)
    by_id = {config.node_id: config for config in configs}
    seeded: list[Path] = []
    with tempfile.TemporaryDirectory(prefix="rcq-restore-", dir=configs[0].data_dir.parent) as scratch:
        snapshots = {}
        for part in backup_set.parts:
            snapshots[part.name] = Path(scratch) / f"{part.name}.lmdb"
            others = [p.name for p in backup_set.parts[1:]] if part.name == P0 else ()
            build_snapshot(part.path, snapshots[part.name], cluster_id=str(uuid.uuid4()), partitions=others)
        try:
            for config in configs:
                seed_data_dir(snapshots[P0], config.data_dir, backup_set.p0.header, config.raft_address,
                              [peer.raft_address for peer in config.peers])
                seeded.append(config.data_dir)
                for part in backup_set.parts[1:]:
                    if config.node_id not in part.members:
                        continue
                    addresses = {m: MemberPorts.of(by_id[m]).advertised(part.name, part.number)[1] for m in part.members}
                    seed_data_dir(snapshots[part.name],
                                  config.data_dir / PARTITIONS_DIR / data_dir_name(part.name, part.number), part.header,
                                  addresses[config.node_id], [a for m, a in addresses.items() if m != config.node_id])
        except BaseException:
            for data_dir in seeded:
                shutil.rmtree(data_dir, ignore_errors=True)
            raise
