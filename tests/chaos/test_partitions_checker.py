"""The partitions checker (chaos.checkers.partitions) on hand-written histories, and the workload's
placement of queues over partitions (chaos.generator.Topology)."""

from __future__ import annotations

from typing import Any

from chaos.checkers import check
from chaos.generator import Topology
from tests.helpers.history import History


def placed(h: History, **queues: str) -> History:
    for queue, partition in queues.items():
        h.op(0, "ok", "configure", {"queue": queue, "max_items": None, "partitions": [partition]})
    return h


def refused(h: History, process: int, f: str, value: dict[str, Any]) -> History:
    h.invoke(process, f, value)
    h._line(process, "fail", f, value, "cross_partition_transaction")
    return h


def test_refused_attempts_across_partitions_and_killed_processes_that_came_back_are_valid() -> None:
    h = placed(History(), a="p0", b="p1")
    h.op(1, "ok", "enqueue", {"writes": [{"queue": "a", "values": ["a1"]}, {"queue": "a", "values": ["a2"]}]})
    h.enqueue(1, "ok", "b", "b1")
    refused(h, 2, "enqueue", {"writes": [{"queue": "a", "values": ["x1"]}, {"queue": "b", "values": ["x2"]}]})
    refused(h, 2, "move", {"from": "a", "to": "b", "values": ["a1"]})
    h.move(3, "ok", "b", "a")  # took nothing: it touched its source alone
    h.nemesis("kill-partition-process", "start", "node-1", partition="p1", pid=10)
    h.nemesis("kill-partition-process", "stop", "node-1", restarted=True, pid=11)
    h.drain("a", "a1", "a2")
    h.drain("b", "b1")
    result = check(h.lines)["partitions"]
    assert result["valid"] and result["checked"], result
    assert result["cross_partition"] == {"refused": 2}
    assert result["acknowledged_by_partition"] == {"p0": 2, "p1": 1}
    assert (result["partition_processes_killed"], result["partition_processes_restarted"]) == (1, 1)


def test_a_commit_across_partitions_a_refusal_within_one_and_a_process_never_back_are_each_invalid() -> None:
    h = placed(History(), a="p0", b="p1", c="p1")
    h.op(1, "ok", "enqueue", {"writes": [{"queue": "a", "values": ["a1"]}, {"queue": "b", "values": ["b1"]}]})
    refused(h, 2, "move", {"from": "b", "to": "c", "values": ["b1"]})
    h.nemesis("kill-partition-process", "start", "node-0", partition="p1", pid=10)
    h.nemesis("kill-partition-process", "stop", "node-0", restarted=False)
    whole = check(h.lines)
    result = whole["partitions"]
    assert not result["valid"] and "partitions" in whole["invalid_checkers"]
    assert (result["spanning_count"], result["wrongly_refused_count"], len(result["not_restarted"])) == (1, 1, 1)
    assert result["spanning"][0]["queues"] == ["a", "b"]


def test_a_run_without_partitions_is_not_checked_and_stays_valid() -> None:
    h = History()
    h.enqueue(1, "ok", "a", "a1")
    h.drain("a", "a1")
    assert check(h.lines)["partitions"] == {"valid": True, "checked": False}


def test_the_topology_places_queues_round_robin_and_each_dead_letter_queue_with_its_source() -> None:
    topology = Topology.of(["q0", "q1", "q2", "q3"], partitions=3)
    assert [topology.partition_of(q) for q in ("q0", "q1", "q2", "q3")] == ["p0", "p1", "p2", "p0"]
    assert {p.name: p.partition for p in topology.dead_letter_plans} == {"q1-dlq": "p1", "q2-dlq": "p2"}
    assert topology.plans["q1"].settings()["partitions"] == ["p1"] and topology.partitioned
    alone = Topology.of(["q0", "q1"])
    assert "partitions" not in alone.plans["q1"].settings() and not alone.partitioned
    assert alone.partition_of("q1") == "p0"


def test_a_new_partitions_queue_that_removed_fewer_items_than_were_acknowledged_is_invalid() -> None:
    h = placed(History(), a="p0", b="p1")
    h.enqueue(1, "ok", "a", "a1")
    h.drain("a", "a1")
    h.nemesis("partition-lifecycle", "start", id=0, partition="t1", queue="t1-q", acked=5, unknown=0, refused=0)
    h.nemesis("partition-lifecycle", "stop", id=0, removed=5, partition_deleted=True)
    h.nemesis("partition-lifecycle", "start", id=1, partition="t2", queue="t2-q", acked=4, unknown=1, refused=0)
    h.nemesis("partition-lifecycle", "stop", id=1, removed=5, partition_deleted=True)  # the unknown one landed
    h.nemesis("partition-lifecycle", "start", id=2, partition="t3", queue="t3-q", acked=5, unknown=0, refused=0)
    h.nemesis("partition-lifecycle", "stop", id=2, queue_error="no_leader")  # not checked: no count
    h.nemesis("pause-partition-leader", "start", "node-1", id=3, partition="p1", pid=7)
    h.nemesis("pause-partition-leader", "stop", "node-1", id=3)
    valid = check(h.lines)["partitions"]
    assert valid["valid"], valid
    assert (valid["lifecycles"], valid["lifecycles_checked"], valid["lifecycle_acknowledged"]) == (3, 2, 9)
    assert valid["partition_processes_paused"] == 1
    h.nemesis("partition-lifecycle", "start", id=4, partition="t4", queue="t4-q", acked=5, unknown=0, refused=0)
    h.nemesis("partition-lifecycle", "stop", id=4, removed=4, partition_deleted=True)  # one acknowledged item gone
    h.nemesis("partition-lifecycle", "start", id=5, partition="t5", queue="t5-q", acked=2, unknown=0, refused=3)
    h.nemesis("partition-lifecycle", "stop", id=5, removed=3, partition_deleted=True)  # a refused one appeared
    invalid = check(h.lines)["partitions"]
    assert not invalid["valid"]
    assert [c["partition"] for c in invalid["lifecycle_lost"]] == ["t4"]
    assert [c["partition"] for c in invalid["lifecycle_extra"]] == ["t5"]
