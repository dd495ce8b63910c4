"""Restore: the data directories of a NEW cluster whose state is a backup's (docs/backup.md).

A node starts from what its data directory holds: an LMDB snapshot, the Raft log and the term.
A restore writes exactly that, for every node of the new cluster, before any of them starts:

* **the snapshot** (:func:`build_snapshot`): the backup's items streamed into an LMDB file, then
  its meta with what belongs to a cluster and not to its data replaced: no directory of members
  (the old cluster's nodes are not this one's), and never the old cluster's identity: a new one
  when the caller seeds every node from this snapshot and the feature level keeps one, else none
  (the restored cluster's first leader gives it one), and no ports of the old nodes in the
  partition directory (each new node states its own, and p0's leader records them). Its Raft
  part names the backup's index and term as the last applied entries and the new cluster's Raft
  addresses as the members. The data
  digest of the items and meta is computed on the way and must equal the header's, or nothing is
  written. One file, copied to each node.
* **the Raft log and term** (:func:`seed_data_dir`): a journal holding the two entries the
  snapshot names (no-ops, never applied: they are at or below the last applied index), and a
  current term of the backup's. The first election of the restored cluster is then at a term
  above every term of the backup, so its leader's entries pass the state's stale-leader checks,
  its transaction ids never collide with remembered ones, and Raft's log order holds.

Items locked by open transactions at backup time are in the queues (locks live only in a
leader's memory), so they are available after the restore, as after a failover.

Only ``durability: fsync`` data directories are written (rcq's journal, the default); a
directory that holds anything is refused.

Must not import: aiohttp, lmdb (rcq.server.raft.snapshots writes the file).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Collection, Iterable
from pathlib import Path
from typing import Any

from pysyncobj.node import TCPNode

from rcq.backup.fileformat import BackupCorrupt, BackupUnsupported, Header, read_body, verify
from rcq.server.core.features import LEVEL_BASE, LEVEL_MAX, LEVEL_OF_CLUSTER_IDENTITY
from rcq.server.raft.backup_child import DataDigest, digested
from rcq.server.raft.files import fsync_path, replace_durably
from rcq.server.raft.snapshots import replace_raft_data, write_snapshot_parts
from rcq.server.raft.wal import write_entries

SNAPSHOT_NAME = "raft.snapshot.lmdb"  # NodeConfig.snapshot_path's name
JOURNAL_NAME = "raft.wal"  # NodeConfig.journal_path's name with durability=fsync
NO_OP = b"\x01"  # pysyncobj's no-op entry (its _COMMAND_TYPE.NO_OP)


class RestoreRefused(BackupCorrupt):
    """The restore cannot go ahead; nothing was changed."""

    code = "restore_refused"


def check_readable(header: Header) -> None:
    """BackupUnsupported when this rcq cannot run the backup's feature level."""
    level = int(header["feature_level"])
    if level > LEVEL_MAX:
        raise BackupUnsupported(f"the backup is at feature level {level} (rcq {header['rcq_version']}); this rcq "
                                f"reads levels up to {LEVEL_MAX}: restore it with a newer rcq")
    if header.index < 2:
        raise BackupCorrupt(f"the backup names Raft index {header.index}; a served state is at 2 or more")


def build_snapshot(backup_path: str | os.PathLike[str], out_path: str | os.PathLike[str],
                   cluster_id: str | None = None, partitions: Collection[str] = ()) -> Header:
    """Write the snapshot of a restored cluster to ``out_path``; the backup's header.

    ``partitions``: those restored with this p0 state (a backup set's other parts); a state whose
    partition directory lists others is refused, for their data is not restored.

    BackupCorrupt (nothing left at ``out_path``) when the file fails its checksum or its data
    digest; BackupUnsupported when it is newer than this rcq."""
    header = verify(backup_path)
    check_readable(header)
    _header, meta, items = read_body(backup_path)
    listed = sorted(str(row[0]) for row in (meta.get("directory") or {}).get("partitions", ()))
    if listed != sorted(partitions):
        getattr(items, "close", lambda: None)()
        raise RestoreRefused(f"{backup_path} is the p0 part of a cluster with partitions {', '.join(listed)}: restore "
                             "the whole backup set (the directory rcq backup wrote), not this part alone"
                             if listed else f"{backup_path} holds no partition directory to restore partitions into")
    index, term = header.index, header.term
    digest = DataDigest(meta)

    def restored_meta() -> dict[str, Any]:  # called once every item is written and hashed
        computed = digest.hexdigest()
        if computed != header.data_digest:
            raise BackupCorrupt(f"the backup's data digest is {header.data_digest}, its content hashes to "
                                f"{computed}: refusing to restore it")
        # Never the old cluster's identity: the given new one where the level keeps one, else none
        # (the restored cluster's first leader then gives it one: rcq.server.leader.feature_levels).
        new = {key: value for key, value in meta.items() if key not in ("members", "cluster_id")}
        if new.get("directory"):  # where the old cluster's nodes served partitions: the new ones record theirs
            new["directory"] = {**new["directory"], "node_ports": []}
        new["last_index"], new["barrier_term"] = index, term
        if cluster_id is not None and int(meta.get("level", LEVEL_BASE)) >= LEVEL_OF_CLUSTER_IDENTITY:
            new["cluster_id"] = cluster_id
        return new

    out = os.fspath(out_path)
    raft_data = _raft_data(header, [])  # each node gets its own in seed_data_dir
    try:
        write_snapshot_parts(out, digested(items, digest), restored_meta, raft_data)
    except BaseException:
        for leftover in (out, out + "-lock"):
            if os.path.exists(leftover):
                os.remove(leftover)
        raise
    return header


def _raft_data(header: Header, members: Iterable[str]) -> tuple[Any, ...]:
    """pysyncobj's part of a snapshot: the last applied entry, the one before, the members."""
    index, term = header.index, header.term
    return (NO_OP, index, term), (NO_OP, index - 1, term), {TCPNode(address) for address in members}


def seed_data_dir(snapshot_file: str | os.PathLike[str], data_dir: str | os.PathLike[str], header: Header,
                  raft_address: str, peers: Iterable[str]) -> None:
    """A node's data directory for the restored cluster: the snapshot (whose members are the node
    and ``peers``, as its config names them), a journal, the term."""
    data_dir = Path(data_dir)
    refuse_non_empty(data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    index, term = header.index, header.term
    target = data_dir / SNAPSHOT_NAME
    shutil.copyfile(snapshot_file, str(target) + ".part")
    replace_raft_data(str(target) + ".part", _raft_data(header, [raft_address, *peers]))
    replace_durably(str(target) + ".part", str(target))
    journal = data_dir / JOURNAL_NAME
    write_entries(str(journal), [(NO_OP, index - 1, term), (NO_OP, index, term)])
    meta_path = str(journal) + ".meta"
    with open(meta_path + ".tmp", "w", encoding="utf-8") as file:
        file.write(f'{{"current_term": {term}, "voted_for": null, "commit_index": {index}}}')
        file.flush()
        os.fsync(file.fileno())
    replace_durably(meta_path + ".tmp", meta_path)
    fsync_path(str(data_dir))


def refuse_non_empty(data_dir: Path) -> None:
    """RestoreRefused when ``data_dir`` holds anything: a restore never writes over a node's data."""
    if data_dir.exists() and (not data_dir.is_dir() or any(data_dir.iterdir())):
        raise RestoreRefused(f"{data_dir} is not empty: a restore makes a new cluster and never writes over "
                             "a node's data (give an empty or new directory)")
