"""The partition directory in p0's state machine (rcq.server.core.directory; docs/partitions.md):
its entries apply only at feature level 4, refuse what cannot be (the same on every replica), and
survive a snapshot."""

from __future__ import annotations

from typing import Any

import pytest

from rcq.server.core.commands import (
    Barrier,
    CommitBatch,
    CommitUnit,
    MalformedCommand,
    QueueChange,
    SetLevel,
    TransactionWrite,
    decode,
    encode,
)
from rcq.server.core.directory import (
    P0,
    Directory,
    DirectoryResult,
    NodePorts,
    PartitionChange,
    QueuePlacement,
    partition_name_problem,
)
from rcq.server.core.features import LEVEL_OF_PARTITIONS
from rcq.server.core.state_machine import QueueStateMachine
from tests.helpers.state import Node


def ports(node_id: str, first: int = 7010, last: int = 7019, term: int = 1) -> NodePorts:
    return NodePorts(term, 1_000, node_id, f"10.0.0.{node_id[-1]}", f"http://10.0.0.{node_id[-1]}:8000",
                     (first, last), (first, last))


def create(name: str, number: int, members: tuple[str, ...] = ("n1", "n2", "n3"), term: int = 1,
           preferred: str | None = None) -> PartitionChange:
    return PartitionChange(term, 1_000, "create", name, number, members, preferred)


def reason(result: Any) -> str | None:
    assert isinstance(result, DirectoryResult), result
    return result.reason


@pytest.fixture
def node() -> Node:
    """A replica at level 4 whose three nodes recorded their partition ports."""
    replica = Node()
    replica.apply_raw(encode(SetLevel(1, 1_000, LEVEL_OF_PARTITIONS, "0.3.0")))
    for node_id in ("n1", "n2", "n3"):
        assert replica.apply_raw(encode(ports(node_id))) == DirectoryResult("done")
    return replica


def apply(node: Node, command: Any) -> Any:
    return node.apply_raw(encode(command))


def test_below_level_4_every_directory_entry_is_refused_and_nothing_changes() -> None:
    replica = Node()
    replica.apply_raw(encode(SetLevel(1, 1_000, 3, "0.2.0")))
    def state() -> dict[str, Any]:
        return {k: v for k, v in replica.sm.snapshot_meta().items() if k != "last_index"}

    before = state()
    for command in (ports("n1"), create("p1", 1), QueuePlacement(1, 1_000, "q", ("p0",))):
        assert reason(apply(replica, command)) == "level_too_low"
    assert state() == before and replica.sm.directory.empty
    assert "directory" not in replica.sm.snapshot_meta()


def test_a_partition_is_created_once_with_a_new_number_among_nodes_that_recorded_ports(node: Node) -> None:
    assert apply(node, create("p1", 1, preferred="n2")) == DirectoryResult("done")
    assert node.sm.directory.partitions["p1"].members == ("n1", "n2", "n3")
    assert reason(apply(node, create("p1", 2))) == "partition_exists"
    assert reason(apply(node, create("p2", 1))) == "invalid"  # numbers are never reused
    assert reason(apply(node, create("p2", 2, members=("n1", "n4")))) == "node_has_no_partition_ports"
    assert reason(apply(node, create("p2", 6))) == "partition_ports_exhausted"  # 7010-7019 holds 5
    assert reason(apply(node, create("p2", 2, preferred="n9"))) == "invalid"
    assert reason(apply(node, create("p2", 2, members=("n1", "n1")))) == "invalid"
    assert apply(node, create("p2", 2, members=("n3",))) == DirectoryResult("done")
    assert node.sm.directory.next_number == 3


@pytest.mark.parametrize("name", ["p0", "P1", "1p", "", "p" * 33, "p/1", "p 1", "p.1"])
def test_names_unsafe_in_paths_labels_or_ids_and_p0_are_refused(node: Node, name: str) -> None:
    assert partition_name_problem(name) is not None
    assert reason(apply(node, create(name, 1))) == "invalid"
    assert node.sm.directory.partitions == {}


def test_a_queue_is_placed_once_and_never_moves(node: Node) -> None:
    apply(node, create("p1", 1))
    assert apply(node, QueuePlacement(1, 1_000, "jobs", ("p1",))) == DirectoryResult("done")
    assert apply(node, QueuePlacement(1, 1_000, "jobs", ("p1",))) == DirectoryResult("done")  # the same: fine
    assert reason(apply(node, QueuePlacement(1, 1_000, "jobs", ("p0",)))) == "queue_placement_fixed"
    assert reason(apply(node, QueuePlacement(1, 1_000, "other", ("p9",)))) == "partition_not_found"
    assert reason(apply(node, QueuePlacement(1, 1_000, "other", ("p1", "p1")))) == "invalid"
    assert apply(node, QueuePlacement(1, 1_000, "spread", ("p0", "p1"))) == DirectoryResult("done")  # a spread queue
    assert reason(apply(node, QueuePlacement(1, 1_000, "spread", ("p1",)))) == "queue_placement_fixed"
    assert node.sm.directory.placed("jobs") == ("p1",) and node.sm.directory.placed("never-placed") == (P0,)
    assert node.sm.directory.placed("spread") == ("p0", "p1") and not node.sm.directory.placed_elsewhere("spread")


def test_a_placement_with_no_partitions_forgets_one_and_the_queue_may_be_placed_anew(node: Node) -> None:
    apply(node, create("p1", 1))
    assert apply(node, QueuePlacement(1, 1_000, "jobs", ("p1",))) == DirectoryResult("done")
    assert apply(node, QueuePlacement(1, 1_000, "jobs", ())) == DirectoryResult("done")  # deleted in p1
    assert node.sm.directory.placed("jobs") == (P0,) and "jobs" not in node.sm.directory.placement
    assert apply(node, QueuePlacement(1, 1_000, "never-placed", ())) == DirectoryResult("done")  # nothing to forget
    assert apply(node, QueuePlacement(1, 1_000, "jobs", ("p1",))) == DirectoryResult("done")  # placed anew


def test_a_queue_that_exists_in_p0_cannot_be_placed_elsewhere_until_it_is_deleted(node: Node) -> None:
    apply(node, create("p1", 1))
    node.commit(CommitUnit((TransactionWrite("t1", enqueues=(("old", (b"x",)),)),)))
    assert reason(apply(node, QueuePlacement(1, 1_000, "old", ("p1",)))) == "queue_placement_fixed"
    assert apply(node, QueuePlacement(1, 1_000, "old", ("p0",))) == DirectoryResult("done")
    apply(node, QueueChange(1, 1_000, "old", "delete"))
    assert node.sm.directory.placed("old") == (P0,) and "old" not in node.sm.directory.placement
    assert apply(node, QueuePlacement(1, 1_000, "old", ("p1",))) == DirectoryResult("done")


def test_p0_refuses_a_commit_that_would_create_a_queue_placed_elsewhere(node: Node) -> None:
    """The leader checks at each verb; a placement that applied between a verb and its commit is
    caught here, the same on every replica: the unit is rejected whole, p0 never holds the queue."""
    apply(node, create("p1", 1))
    apply(node, QueuePlacement(1, 1_000, "jobs", ("p1",)))
    node.commit(CommitUnit((TransactionWrite("t0", enqueues=(("mine", (b"x",)),)),)))
    outcome = node.commit_one(CommitUnit((TransactionWrite(
        "t1", enqueues=(("mine", (b"y",)), ("jobs", (b"z",)))),)))
    assert (outcome.status, outcome.reason, outcome.queue) == ("rejected", "queue_placed_elsewhere", "jobs")
    assert "jobs" not in node.sm._queues and len(node.sm._queues["mine"].items) == 1
    assert node.sm.snapshot_meta()["directory"]["placement"] == [["jobs", ["p1"]]]
    change = apply(node, QueueChange(1, 1_000, "jobs", "configure"))
    assert (change.status, change.reason) == ("rejected", "queue_placed_elsewhere")
    assert "jobs" not in node.sm._queues
    assert apply(node, QueuePlacement(1, 1_000, "here", ("p0",))) == DirectoryResult("done")
    assert node.commit_one(CommitUnit((TransactionWrite("t2", enqueues=(("here", (b"x",)),)),))).status == "committed"


def test_a_partition_other_than_p0_creates_a_queue_only_by_a_queue_change() -> None:
    replica = Node(QueueStateMachine(partition="p1"))
    outcome = replica.commit_one(CommitUnit((TransactionWrite("t1", enqueues=(("jobs", (b"x",)),)),)))
    assert (outcome.status, outcome.reason, outcome.queue) == ("rejected", "queue_not_found", "jobs")
    assert "jobs" not in replica.sm._queues
    assert apply(replica, QueueChange(1, 1_000, "jobs", "configure")).status == "done"
    assert replica.commit_one(CommitUnit((TransactionWrite("t2", enqueues=(("jobs", (b"x",)),)),))).status \
        == "committed"
    apply(replica, QueueChange(1, 1_000, "jobs", "delete"))
    outcome = replica.commit_one(CommitUnit((TransactionWrite("t3", enqueues=(("jobs", (b"y",)),)),)))
    assert outcome.reason == "queue_not_found" and "jobs" not in replica.sm._queues


def test_a_partition_holding_a_queue_cannot_be_deleted(node: Node) -> None:
    apply(node, create("p1", 1))
    apply(node, QueuePlacement(1, 1_000, "jobs", ("p1",)))
    assert reason(apply(node, PartitionChange(1, 1_000, "delete", "p1"))) == "partition_not_empty"
    assert reason(apply(node, PartitionChange(1, 1_000, "delete", "p7"))) == "partition_not_found"
    apply(node, QueueChange(1, 1_000, "jobs", "delete"))
    assert apply(node, PartitionChange(1, 1_000, "delete", "p1")) == DirectoryResult("done")
    assert reason(apply(node, create("p1", 1))) == "invalid"  # its number stays used
    assert apply(node, create("p1", 2)) == DirectoryResult("done")


def test_a_deposed_leaders_directory_entries_are_refused(node: Node) -> None:
    apply(node, Barrier(5, 1_000))
    assert reason(apply(node, create("p1", 1, term=4))) == "stale_leader"
    assert reason(apply(node, ports("n1", 7100, 7109, term=4))) == "stale_leader"
    assert node.sm.directory.partitions == {} and node.sm.directory.node_ports["n1"].partition_ports == (7010, 7019)


def test_a_partition_named_in_a_nodes_ports_is_served_there_whatever_its_number(node: Node) -> None:
    """A node's named ports (partition_port_map) are recorded with its range; an entry without
    any keeps the form it had, in the log and in the snapshot."""
    plain = ports("n4")
    assert len(encode(plain)) == 9  # the version, the kind, and the seven fields it always had
    named = NodePorts(1, 1_000, "n5", "10.0.0.5", "http://10.0.0.5:8000", (0, 0), (0, 0),
                      (("orders", 7500, 7501, 7600, 7601),))
    assert decode(encode(named)) == named and decode(encode(plain)) == plain
    assert apply(node, named) == DirectoryResult("done")
    assert reason(apply(node, create("p1", 1, members=("n1", "n5")))) == "partition_ports_exhausted"
    assert apply(node, create("orders", 1, members=("n1", "n5"))) == DirectoryResult("done")
    restored = QueueStateMachine()
    restored.restore(node.sm.snapshot_meta(), list(node.sm.snapshot_items()))
    assert restored.directory.node_ports["n5"] == named and restored.digest() == node.sm.digest()
    assert [len(row) for row in node.sm.snapshot_meta()["directory"]["node_ports"]] == [7, 7, 7, 8]


def test_a_cluster_and_each_node_hold_at_most_so_many_partitions(monkeypatch: pytest.MonkeyPatch) -> None:
    """The limits hold in the apply, the same on every replica, with their own reasons."""
    from rcq.server.core import directory as directory_module

    monkeypatch.setattr(directory_module, "PARTITIONS_MAX", 3)
    monkeypatch.setattr(directory_module, "NODE_PARTITIONS_MAX", 2)
    replica = Node()
    replica.apply_raw(encode(SetLevel(1, 1_000, LEVEL_OF_PARTITIONS, "0.3.0")))
    for node_id in ("n1", "n2", "n3", "n4"):
        apply(replica, ports(node_id, 7010, 7049))
    assert apply(replica, create("p1", 1, members=("n1", "n2"))) == DirectoryResult("done")
    assert apply(replica, create("p2", 2, members=("n1", "n3"))) == DirectoryResult("done")
    refused = apply(replica, create("p3", 3, members=("n1", "n4")))
    assert reason(refused) == "node_partitions_full" and dict(refused.details)["nodes"] == ("n1",)
    assert apply(replica, create("p3", 3, members=("n2", "n4"))) == DirectoryResult("done")
    assert reason(apply(replica, create("p4", 4, members=("n4",)))) == "too_many_partitions"
    assert sorted(replica.sm.directory.partitions) == ["p1", "p2", "p3"]
    assert apply(replica, PartitionChange(1, 1_000, "delete", "p2")) == DirectoryResult("done")
    assert apply(replica, create("p4", 4, members=("n1", "n4"))) == DirectoryResult("done")  # room again


def members(name: str, new: tuple[str, ...], preferred: str | None = None) -> PartitionChange:
    return PartitionChange(1, 1_000, "members", name, 0, new, preferred)


def test_a_partitions_members_are_set_within_the_limits_the_same_on_every_replica(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from rcq.server.core import directory as directory_module

    monkeypatch.setattr(directory_module, "NODE_PARTITIONS_MAX", 2)
    replica = Node()
    replica.apply_raw(encode(SetLevel(1, 1_000, LEVEL_OF_PARTITIONS, "0.3.0")))
    for node_id in ("n1", "n2", "n3"):
        apply(replica, ports(node_id, 7010, 7049))
    apply(replica, create("p1", 1, members=("n1", "n2"), preferred="n1"))
    apply(replica, create("p2", 2, members=("n3",)))
    apply(replica, create("p3", 3, members=("n3",)))
    assert reason(apply(replica, members("p1", ("n1", "n2", "n3")))) == "node_partitions_full"  # n3 holds 2
    assert reason(apply(replica, members("p1", ("n1", "n4")))) == "node_has_no_partition_ports"
    assert reason(apply(replica, members("p1", ()))) == "invalid"
    assert reason(apply(replica, members("p1", ("n1", "n1")))) == "invalid"
    assert reason(apply(replica, members("p1", ("n2",), preferred="n1"))) == "invalid"
    assert reason(apply(replica, members("p9", ("n1",)))) == "partition_not_found"
    assert apply(replica, members("p1", ("n2",), preferred="n2")) == DirectoryResult("done")
    partition = replica.sm.directory.partitions["p1"]
    assert (partition.members, partition.preferred_leader, partition.number) == (("n2",), "n2", 1)
    # a member a node already is stays, whatever the limit: only added members are counted
    assert apply(replica, members("p2", ("n3", "n1"))) == DirectoryResult("done")
    restored = QueueStateMachine()
    restored.restore(replica.sm.snapshot_meta(), list(replica.sm.snapshot_items()))
    assert restored.digest() == replica.sm.digest()
    assert decode(encode(members("p1", ("n2", "n3"), "n3"))) == members("p1", ("n2", "n3"), "n3")


def test_the_directory_survives_a_snapshot_and_replicas_agree(node: Node) -> None:
    apply(node, create("p1", 1, preferred="n1"))
    apply(node, create("p2", 2, members=("n2", "n3")))
    apply(node, QueuePlacement(1, 1_000, "jobs", ("p2",)))
    restored = QueueStateMachine()
    restored.restore(node.sm.snapshot_meta(), list(node.sm.snapshot_items()))
    assert restored.digest() == node.sm.digest()
    directory = restored.directory
    assert directory.partitions == node.sm.directory.partitions and directory.next_number == 3
    assert directory.placed("jobs") == ("p2",) and directory.node_ports == node.sm.directory.node_ports
    assert Directory.from_meta(None).empty


@pytest.mark.parametrize("raw", [
    (1, "partition", 1, 1_000, "rename", "p1", 1, ("n1",), None),
    (1, "partition", 1, 1_000, "create", "p1", "1", ("n1",), None),
    (1, "partition", 1, 1_000, "create", "p1", 1, ["n1"], None),
    (1, "node_ports", 1, 1_000, "n1", "h", "http://h:1", (7019, 7010), (7010, 7019)),
    (1, "node_ports", 1, 1_000, "n1", "h", "http://h:1", (7010, 7019)),
    (1, "node_ports", 1, 1_000, "n1", "h", "http://h:1", (7010, 7019), (7010, 7019), (("a", 1, 2, 3),)),
    (1, "node_ports", 1, 1_000, "n1", "h", "http://h:1", (7010, 7019), (7010, 7019), (("a", 1, 2, 3, 0),)),
    (1, "node_ports", 1, 1_000, "n1", "h", "http://h:1", (7010, 7019), (7010, 7019), (), ()),
    (1, "placement", 1, 1_000, "q", "p1"),
])
def test_a_malformed_directory_entry_is_only_malformed(raw: tuple[Any, ...]) -> None:
    with pytest.raises(MalformedCommand):
        decode(raw)
    assert QueueStateMachine().apply(raw, 1).reason == "malformed_command"


def test_every_directory_command_decodes_back() -> None:
    for command in (ports("n1"), create("p1", 1, preferred="n2"), PartitionChange(2, 5, "delete", "p1"),
                    QueuePlacement(1, 1_000, "q", ("p1",))):
        assert decode(encode(command)) == command
    assert isinstance(decode(encode(CommitBatch(1, 1, ()))), CommitBatch)
