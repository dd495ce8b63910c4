"""What a node's PartitionHost removes of deleted partitions' data (rcq.server.partitions.host):
only a folder whose number the directory has given out and no partition has now, so a replica
that lags behind a creation never takes a live partition's data for a deleted one's."""

from __future__ import annotations

from pathlib import Path

from rcq.server.core.directory import Directory, Partition
from rcq.server.partitions.host import PartitionHost
from rcq.testing import InMemoryReplicator
from tests.helpers.nodes import make_config


def test_only_the_data_of_partitions_the_directory_deleted_is_removed(tmp_path: Path) -> None:
    config = make_config(tmp_path, partition_ports="17000-17009")
    host = PartitionHost(config, InMemoryReplicator())
    for folder in ("p1.1", "p2.2", "p3.3", "p9.9", "notes", "p4.x"):
        (host.directory_path / folder).mkdir(parents=True)
    (host.directory_path / "p2.2" / "journal").write_bytes(b"old")
    (host.directory_path / "p5.5").write_text("a file, not a partition's folder")
    directory = Directory()
    directory.partitions = {"p1": Partition("p1", 1, ("n1",), None), "p3": Partition("p3", 4, ("n1",), None)}
    directory.next_number = 5  # p2 (2) and p3's first life (3) were deleted; 9 is not given out yet here
    assert sorted(p.name for p in host.remove_deleted(directory)) == ["p2.2", "p3.3"]
    assert sorted(p.name for p in host.directory_path.iterdir()) == ["notes", "p1.1", "p4.x", "p5.5", "p9.9"]
    assert host.remove_deleted(Directory()) == []  # an empty directory (not yet applied) removes nothing
