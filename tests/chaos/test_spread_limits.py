"""A spread queue's max_items in the chaos harness: the limits checker holds every read of it to the
whole limit and each fragment's read to its share (the server's split), and the queue checkers take
its queue_full refusals as definite failures, neither acknowledged nor lost (docs/partitions.md,
"Spread queues"). And the workload's side: which spread queue is limited, and what a count records."""

from __future__ import annotations

import asyncio
from typing import Any

from chaos.checkers import check
from chaos.checkers.limits import shares
from chaos.executor import Executor
from chaos.generator import LIMITED_QUEUE_ITEMS_MAX, Spec, Topology, spread_items_max
from rcq.server.http.models import QueueSettingsRequest
from rcq.server.http.spread_queues import fragment_settings
from tests.helpers.history import History

PARTS = ["p0", "p1", "p2"]


def limited(h: History, queue: str = "s1", max_items: int = 7, over: list[str] = PARTS) -> History:
    return h.op(0, "ok", "configure", {"queue": queue, "max_items": max_items, "partitions": list(over)})


def count(h: History, queue: str, total: int | None, max_items: int | None, **fragments: tuple[int, int]) -> History:
    """A count of ``queue`` as the executor records it: each fragment's (count, share) by partition."""
    value: dict[str, Any] = {"queue": queue, "count": total, "max_items": max_items}
    if fragments:
        value["by_partition"] = {p: {"count": c, "share": {"max_items": s, "max_bytes": None}}
                                 for p, (c, s) in fragments.items()}
    return h.op(1, "ok", "count", value, invoke_value={"queue": queue})


def refused(h: History, process: int, queue: str, fragment: str | None, *values: str, at: int | None = 2) -> History:
    """An enqueue into ``queue`` refused queue_full in ``fragment`` (None: a one-request one), the
    refusal naming the queue and the limit it reached, ``at`` (None: naming nothing)."""
    value: dict[str, Any] = {"writes": [{"queue": queue, "values": list(values)}]}
    value.update({"partition": fragment} if fragment is not None else {"one_request": True})
    h.invoke(process, "enqueue", value)
    h._line(process, "fail", "enqueue", {**value, **({"full": {"queue": queue, "max_items": at}} if at else {})},
            "queue_full")
    return h


def test_shares_are_the_servers_split_of_the_limit() -> None:
    assert shares(7, PARTS) == {"p0": 3, "p1": 2, "p2": 2}
    assert shares(40, PARTS) == {"p0": 14, "p1": 13, "p2": 13}
    for limit in (3, 7, 40, 41, 100):
        server = fragment_settings("s1", QueueSettingsRequest(max_items=limit, partitions=PARTS), PARTS)
        assert shares(limit, PARTS) == {p: server[p].max_items for p in PARTS}


def test_reads_within_the_limit_and_each_share_are_valid() -> None:
    h = limited(History())
    count(h, "s1", 7, 7, p0=(3, 3), p1=(2, 2), p2=(2, 2))
    count(h, "s1", 5, None, p0=(3, 3), p2=(2, 2))  # p1 did not answer: no whole limit stated
    h.checker_input("queue-stats", {"s1": {"count": 0}})
    whole = check(h.lines)
    limits = whole["limits"]
    assert whole["valid"], whole["invalid_checkers"]
    assert (limits["limited_reads"], limits["fragment_reads"]) == (3, 5)
    assert limits["shares"] == {"s1": {"p0": 3, "p1": 2, "p2": 2}}


def test_a_fragment_over_its_share_is_invalid_though_the_sum_is_within_the_limit() -> None:
    h = limited(History())
    count(h, "s1", 5, 7, p0=(1, 3), p1=(3, 3), p2=(1, 2))  # p1's share is 2 by the server's rule
    whole = check(h.lines)
    limits = whole["limits"]
    assert not whole["valid"] and "limits" in whole["invalid_checkers"]
    assert limits["over_share"] == [{"queue": "s1", "partition": "p1", "count": 3, "share": 2, "index": 2}]
    assert limits["wrong_limit"][0] == {"queue": "s1", "partition": "p1", "share": 3, "configured": 2, "index": 2}
    assert limits["over_limit_count"] == 0


def test_a_spread_queue_over_its_whole_limit_is_invalid() -> None:
    over = check(count(limited(History()), "s1", 8, 7).lines)["limits"]
    assert not over["valid"] and over["over_limit"][0]["count"] == 8
    unstated = check(count(limited(History()), "s1", 8, None, p0=(3, 3), p1=(3, 2), p2=(2, 2)).lines)["limits"]
    assert not unstated["valid"] and unstated["over_limit"][0]["max_items"] == 7  # the configured limit
    assert unstated["over_share_count"] == 1
    stats = limited(History()).checker_input("queue-stats", {"s1": {"count": 9}})
    assert check(stats.lines)["limits"]["over_limit"] == [{"queue": "s1", "count": 9, "max_items": 7, "by": "queue-stats"}]


def test_a_read_stating_another_whole_limit_than_the_configured_one_is_invalid() -> None:
    result = check(count(limited(History()), "s1", 2, 9).lines)["limits"]
    assert not result["valid"] and result["wrong_limit"] == [{"queue": "s1", "max_items": 9, "configured": 7, "index": 2}]


def test_queue_full_refusals_on_a_spread_queue_are_failures_counted_not_lost() -> None:
    h = limited(History())
    h.op(1, "ok", "enqueue", {"writes": [{"queue": "s1", "values": ["a1", "a2", "a3"]}], "partition": "p0"})
    refused(h, 2, "s1", "p0", "x1", "x2", at=3)  # p0 holds its share
    refused(h, 3, "s1", None, "x3")  # a one-request enqueue: every fragment full (the last one's share)
    refused(h, 4, "s1", "p1", "x4", at=None)  # no queue named: the one limited queue it wrote
    h.op(0, "ok", "configure", {"queue": "q1", "max_items": None, "partitions": ["p1"]})
    h.op(1, "ok", "enqueue", {"writes": [{"queue": "q1", "values": ["m1"]}], "partition": "p1"})
    h.invoke(5, "move", {"from": "q1", "to": "s1", "max": 1, "partition_key": "k1"})
    h._line(5, "fail", "move", {"from": "q1", "to": "s1", "values": ["m1"], "partition": "p1",
                                "full": {"queue": "s1", "max_items": 2}}, "queue_full")
    count(h, "s1", 3, 7, p0=(3, 3), p1=(0, 2), p2=(0, 2))
    take = {"queue": "s1", "values": ["a1", "a2", "a3"], "partition": "p0",
            "items": {v: {"id": i, "dc": 0, "at": None, "pt": "p0"} for i, v in enumerate(["a1", "a2", "a3"])}}
    h.op(99, "ok", "drain", take, invoke_value={"queue": "s1", "max": 100})
    h.drain("q1", "m1")
    whole = check(h.lines)
    assert whole["valid"], whole["invalid_checkers"]
    total, spread, limits = whole["total_queue"], whole["partitions"]["spread"], whole["limits"]
    assert (total["acknowledged_count"], total["lost_count"], total["failed_enqueue_count"]) == (4, 0, 4)
    assert total["refused_full_count"] == 4
    assert spread["lost_count"] == 0 and spread["acknowledged_by_fragment"]["s1"] == {"p0": 3}
    assert spread["refused_full_by_fragment"]["s1"] == {"p0": 2, "p1": 2, "unknown": 1}
    assert limits["queue_full_refusals"] == 4 and limits["queue_full_refusals_by_queue"] == {"s1": 4}


def test_a_refusal_naming_a_limit_other_than_its_fragments_share_is_invalid() -> None:
    h = limited(History())
    refused(h, 2, "s1", "p1", "x1", at=3)  # p1's share of 7 is 2
    result = check(h.lines)["limits"]
    assert not result["valid"] and result["queue_full_refusals_by_queue"] == {"s1": 1}
    assert result["wrong_limit"] == [{"queue": "s1", "partition": "p1", "refused_at": 3, "configured": [2], "index": 2}]
    one_request = check(refused(limited(History()), 2, "s1", None, "x1", at=4).lines)["limits"]
    assert not one_request["valid"] and one_request["wrong_limit"][0]["configured"] == [2, 3]  # any share


def test_a_refused_value_that_comes_out_of_a_fragment_after_all_is_unexpected_and_a_phantom() -> None:
    h = limited(History())
    refused(h, 2, "s1", "p2", "x1")
    h.op(99, "ok", "drain", {"queue": "s1", "values": ["x1"], "partition": "p2",
                             "items": {"x1": {"id": 1, "dc": 0, "at": None, "pt": "p2"}}},
         invoke_value={"queue": "s1", "max": 100})
    whole = check(h.lines)
    assert not whole["valid"] and {"total_queue", "partitions"} <= set(whole["invalid_checkers"])
    assert whole["total_queue"]["unexpected_from_failed_enqueue_count"] == 1
    assert whole["partitions"]["spread"]["phantom_count"] == 1


# ----------------------------------------------------------------- the workload's side
def test_the_plain_spread_queue_is_limited_and_configured_with_its_whole_limit() -> None:
    topology = Topology.of(["q0", "q1", "q2"], partitions=3, spread=3)
    s1 = topology.plans["s1"]
    assert s1.max_items == spread_items_max(3) == LIMITED_QUEUE_ITEMS_MAX
    assert s1.settings() == {"max_items": LIMITED_QUEUE_ITEMS_MAX, "max_deliveries": None, "dead_letter_queue": None,
                             "max_priority": None, "partitions": PARTS}
    assert topology.plans["s0"].max_items is None and topology.plans["s2"].max_items is None
    assert spread_items_max(30) == 60  # never below two per fragment


class CountClient:
    def __init__(self, answer: dict[str, Any]) -> None:
        self.answer = answer

    async def queue_info(self, queue: str) -> dict[str, Any]:
        return self.answer


def test_a_count_of_a_spread_queue_records_each_fragments_count_and_share() -> None:
    share = {"max_items": 14, "max_bytes": None}
    answer = {"queue": "s1", "spread": True, "count": 20, "settings": {"max_items": 40, "partitions": PARTS},
              "by_partition": {"p0": {"count": 14, "locked": 1, "node_id": "node-0", "share": share},
                               "p1": {"count": 6, "locked": 0, "node_id": "node-1", "share": share}},
              "unanswered": ["p2"]}
    type_, value, _ = asyncio.run(Executor(CountClient(answer)).run(Spec("count", {"queue": "s1"})))  # type: ignore[arg-type]
    assert type_ == "ok" and value == {"queue": "s1", "count": 20, "max_items": 40,
                                       "by_partition": {"p0": {"count": 14, "share": share},
                                                        "p1": {"count": 6, "share": share}}}
    plain = {"queue": "q0", "count": 3, "settings": {"max_items": 40}}
    assert asyncio.run(Executor(CountClient(plain)).run(Spec("count", {"queue": "q0"})))[1] == {  # type: ignore[arg-type]
        "queue": "q0", "count": 3, "max_items": 40}
