"""The spread checker (chaos.checkers.spread, under the partitions checker) on hand-written
histories, and the workload's side of spread queues: the topology, the generator's fragment
choices, the executor's begin and what it records (docs/partitions.md, "Spread queues")."""

from __future__ import annotations

import asyncio
from typing import Any

from chaos.checkers import check
from chaos.executor import Executor
from chaos.generator import STARVATION_QUEUE, Generator, Spec, Topology
from chaos.workload import fragment_info
from rcq.client import Item
from tests.helpers.history import History

PARTS = ["p0", "p1", "p2"]
PROBE = 100_003


def spread(h: History, *queues: str, over: list[str] = PARTS) -> History:
    for queue in queues:
        h.op(0, "ok", "configure", {"queue": queue, "max_items": None, "partitions": list(over)})
    return h


def put(h: History, process: int, queue: str, fragment: str | None, *values: str, type_: str = "ok") -> History:
    """A transactional enqueue into ``queue`` that ran in ``fragment`` (None: a one-request one)."""
    value: dict[str, Any] = {"writes": [{"queue": queue, "values": list(values)}]}
    if fragment is None:
        value["one_request"] = True
    else:
        value["partition"] = fragment
    return h.op(process, type_, "enqueue", value)


def take(h: History, process: int, queue: str, fragment: str, *values: str, f: str = "dequeue") -> History:
    items = {v: {"id": 1 + i, "dc": 0, "at": None, "pt": fragment} for i, v in enumerate(values)}
    return h.op(process, "ok", f, {"queue": queue, "values": list(values), "items": items, "partition": fragment},
                invoke_value={"queue": queue, "max": max(1, len(values))})


def test_items_moved_between_spread_queues_each_taken_once_from_its_own_fragment_are_valid() -> None:
    h = spread(History(), "s0", "s1")
    put(h, 1, "s0", "p0", "a1", "a2")
    put(h, 1, "s0", "p1", "b1")
    put(h, 2, "s1", None, "c1")  # one request: its fragment unknown
    h.op(3, "ok", "move", {"from": "s0", "to": "s1", "values": ["a1"], "partition": "p0",
                           "items": {"a1": {"id": 1, "dc": 0, "pt": "p0"}}},
         invoke_value={"from": "s0", "to": "s1", "max": 1})
    take(h, 4, "s1", "p0", "a1")
    take(h, 4, "s0", "p1", "b1")  # id 1 again: another fragment's item
    take(h, 99, "s0", "p0", "a2", f="drain")
    take(h, 99, "s1", "p2", "c1", f="drain")
    whole = check(h.lines)
    result = whole["partitions"]
    assert whole["valid"], whole["invalid_checkers"]
    assert result["spread_placement"] == {"s0": PARTS, "s1": PARTS} and result["placement"] == {}
    spread_result = result["spread"]
    assert spread_result["acknowledged_by_fragment"] == {"s0": {"p0": 2, "p1": 1}, "s1": {"unknown": 1}}
    assert spread_result["taken_by_fragment"] == {"s0": {"p0": 2, "p1": 1}, "s1": {"p0": 1, "p2": 1}}
    assert result["acknowledged_by_partition"] == {"p0": 2, "p1": 1, "unknown": 1}
    assert spread_result["starvation"] == {"valid": True, "checked": False, "why": "no starvation probe ran"}


def test_an_item_handed_out_by_two_fragments_is_a_duplicate_across_fragments_and_invalid() -> None:
    h = spread(History(), "s0")
    put(h, 1, "s0", "p0", "a1")
    take(h, 2, "s0", "p0", "a1")
    take(h, 3, "s0", "p1", "a1")  # the same item out of another fragment: delivered twice
    whole = check(h.lines)
    result = whole["partitions"]["spread"]
    assert not whole["partitions"]["valid"] and "partitions" in whole["invalid_checkers"]
    assert (result["duplicated_count"], result["duplicated_across_fragments_count"]) == (1, 1)
    assert result["duplicated"][0]["fragments"] == ["p0", "p1"]
    assert [w["from_fragment"] for w in result["wrong_fragment"]] == ["p1"]  # it was put into p0 alone


def test_an_acknowledged_item_no_fragment_hands_out_is_lost_and_invalid() -> None:
    h = spread(History(), "s0")
    put(h, 1, "s0", "p2", "a1", "a2")
    take(h, 99, "s0", "p2", "a1", f="drain")
    whole = check(h.lines)
    result = whole["partitions"]["spread"]
    assert not whole["partitions"]["valid"]
    assert result["lost_count"] == 1
    assert result["lost"] == [{"value": "a2", "last_put_into": {"queue": "s0", "fragment": "p2", "by": "enqueue",
                                                                "type": "ok"}}]


def test_an_item_no_enqueue_attempted_out_of_a_fragment_is_a_phantom() -> None:
    h = spread(History(), "s0")
    put(h, 1, "s0", "p0", "a1")
    take(h, 2, "s0", "p0", "a1")
    take(h, 2, "s0", "p1", "zz")
    result = check(h.lines)["partitions"]["spread"]
    assert not result["valid"] and result["phantom_count"] == 1 and result["phantom"][0]["from_fragment"] == "p1"


def probe_round(h: History, mode: str, taken: list[str], *, fragments: dict[str, list[str]], bound_s: float = 30.0,
                unanswered: bool = False) -> History:
    """One round of the starvation probe as chaos.starvation writes it."""
    for fragment, values in fragments.items():
        h.op(PROBE, "ok", "enqueue", {"writes": [{"queue": STARVATION_QUEUE, "values": values}], "fragment": fragment,
                                      "starvation": mode, "partition": fragment})
    started_s = h.time_s
    for value in taken:
        h.op(PROBE, "ok", "dequeue", {"queue": STARVATION_QUEUE, "values": [value]},
             invoke_value={"queue": STARVATION_QUEUE, "max": 1, "starvation": mode})
    if unanswered:
        h.invoke(PROBE, "dequeue", {"queue": STARVATION_QUEUE, "max": 1, "starvation": mode})
        h.complete(PROBE, "info", "dequeue", {"queue": STARVATION_QUEUE, "values": []})
    h.checker_input("starvation", {"queue": STARVATION_QUEUE, "mode": mode, "bound_s": bound_s,
                                   "started_s": started_s, "elapsed_s": round(h.time_s - started_s, 3)})
    return h


def test_a_lone_consumer_that_leaves_a_fragment_untaken_past_the_bound_starves_it_and_is_invalid() -> None:
    h = spread(History(), STARVATION_QUEUE)
    probe_round(h, "one-request", ["r1", "r2", "r3"], fragments={"p0": ["r1"], "p1": ["r2"], "p2": ["r3"]})
    probe_round(h, "transaction", ["t1", "t2"], fragments={"p0": ["t1"], "p1": ["t2"], "p2": ["t3"]})
    h.drain(STARVATION_QUEUE, "t3")  # the drain found what the consumer left
    whole = check(h.lines)
    starvation = whole["partitions"]["spread"]["starvation"]
    assert not whole["valid"] and "partitions" in whole["invalid_checkers"]
    assert starvation["checked"] and starvation["starved_fragments"] == [{"mode": "transaction", "fragments": {"p2": 1}}]
    fine, starved = starvation["rounds"]
    assert (fine["filled"], fine["taken"], fine["starved"]) == ({"p0": 1, "p1": 1, "p2": 1},) * 2 + ({},)
    assert fine["bound_s"] == 30.0 and fine["first_fragments"] == ["p0", "p1", "p2"]
    assert starved["starved"] == {"p2": 1}
    assert "STARVED {'p2': 1}" in whole_summary(whole)


def test_values_taken_only_after_the_bound_starve_and_an_unanswered_take_leaves_it_unknown() -> None:
    late = spread(History(), STARVATION_QUEUE)
    probe_round(late, "receive", ["v1", "v2"], fragments={"p0": ["v1"], "p1": ["v2"]}, bound_s=0.15)
    assert late.lines[-1]["value"]["bound_s"] == 0.15
    assert check(late.lines)["partitions"]["spread"]["starvation"]["starved_fragments"] == [
        {"mode": "receive", "fragments": {"p1": 1}}]  # v2 asked for 0.3 s after the consumer began
    unknown = spread(History(), STARVATION_QUEUE)
    probe_round(unknown, "one-request", ["v1"], fragments={"p0": ["v1"], "p1": ["v2"]}, unanswered=True)
    starvation = check(unknown.lines)["partitions"]["spread"]["starvation"]
    assert starvation["valid"] and starvation["rounds"][0]["unknown"] == {"p1": 1}


def whole_summary(results: dict[str, Any]) -> str:
    from chaos.checkers.report import summary_text
    return summary_text(results, 1)


def test_a_refusal_is_judged_by_the_partition_the_transaction_ran_in() -> None:
    h = spread(History(), "s0")
    h.op(0, "ok", "configure", {"queue": "q1", "max_items": None, "partitions": ["p1"]})
    put(h, 1, "s0", "p1", "a1")
    h.op(2, "ok", "move", {"from": "s0", "to": "q1", "values": ["a1"], "partition": "p1"},
         invoke_value={"from": "s0", "to": "q1", "max": 1})  # both live in p1: fine
    h.invoke(3, "enqueue", {"writes": [{"queue": "s0", "values": ["x1"]}, {"queue": "q1", "values": ["x2"]}]})
    h._line(3, "fail", "enqueue", {"writes": [{"queue": "s0", "values": ["x1"]}, {"queue": "q1", "values": ["x2"]}],
                                   "partition": "p0"}, "cross_partition_transaction")  # ran in p0: rightly refused
    h.drain("q1", "a1")
    result = check(h.lines)["partitions"]
    assert result["valid"] and result["cross_partition"] == {"refused": 1}, result
    h.invoke(4, "enqueue", {"writes": [{"queue": "s0", "values": ["y1"]}, {"queue": "q1", "values": ["y2"]}]})
    h._line(4, "fail", "enqueue", {"writes": [{"queue": "s0", "values": ["y1"]}, {"queue": "q1", "values": ["y2"]}],
                                   "partition": "p1"}, "cross_partition_transaction")  # in p1: both live there
    h.op(5, "ok", "move", {"from": "s0", "to": "q1", "values": ["a9"], "partition": "p2"},
         invoke_value={"from": "s0", "to": "q1", "max": 1})  # committed in p2, where q1 does not live
    wrong = check(h.lines)["partitions"]
    assert not wrong["valid"] and (wrong["wrongly_refused_count"], wrong["spanning_count"]) == (1, 1)


# ----------------------------------------------------------------- the workload's side
def test_the_topology_spreads_s_queues_and_their_dead_letter_queues_over_every_partition() -> None:
    topology = Topology.of(["q0", "q1", "q2"], partitions=3, spread=2)
    assert topology.queues == ["q0", "q1", "q2", "s0", "s1"] and topology.spread_queues == ["s0", "s1"]
    assert topology.plans["s0"].settings()["partitions"] == PARTS and topology.plans["s0"].max_items is None
    assert topology.plans["s0"].dead_letter_queue == "s0-dlq" and topology.partitions_of("s0-dlq") == tuple(PARTS)
    assert topology.partitions_of("q1") == ("p1",) and topology.is_spread("s1") and not topology.is_spread("q2")
    assert topology.probe is not None and topology.all_queues[-1] == STARVATION_QUEUE
    assert topology.is_spread(STARVATION_QUEUE) and STARVATION_QUEUE not in topology.queues
    assert Topology.of(["q0"], partitions=3).probe is None


def test_the_generator_picks_fragments_for_spread_queues_only_and_moves_between_them() -> None:
    topology = Topology.of(["q0", "q1", "q2"], partitions=3, spread=2)
    specs = [s for w in range(4) for s in _take_specs(Generator(7, w, topology.queues, topology=topology), 400)]
    picked = [s for s in specs if "fragment" in s.value or "partition_key" in s.value]
    assert picked and all(_first_queue(s) in ("s0", "s1") for s in picked)
    assert {s.value["fragment"] for s in picked if "fragment" in s.value} <= set(PARTS)
    assert any(s.f == "move" and {s.value["from"], s.value["to"]} == {"s0", "s1"} for s in specs)
    assert all(not s.value.get("one_request") for s in picked)
    plain = Topology.of(["q0", "q1", "q2"], partitions=3)
    before = [s.value for s in _take_specs(Generator(7, 0, plain.queues, topology=plain), 200)]
    again = [s.value for s in _take_specs(Generator(7, 0, plain.queues, topology=plain), 200)]
    assert before == again and not any("fragment" in v or "partition_key" in v for v in before)


def _take_specs(generator: Generator, count: int) -> list[Spec]:
    return [generator.next() for _ in range(count)]


def _first_queue(spec: Spec) -> str:
    if spec.f == "enqueue":
        return str(spec.value["writes"][0]["queue"])
    return str(spec.value.get("from") or spec.value.get("queue"))


class FakeTx:
    def __init__(self, partition: str) -> None:
        self.transaction_id: str | None = None
        self.partition: str | None = None
        self._opens_in = partition

    async def dequeue_items(self, queue: str, max_items: int) -> list[Item]:
        self.partition = self._opens_in  # opened at its first verb
        return [Item(5, queue, b"0-1", delivery_count=0)]

    async def enqueue_batch(self, queue: str, values: list[Any], **options: Any) -> int:
        self.partition = self.partition or self._opens_in
        return len(values)

    async def commit(self) -> None:
        pass

    async def abort(self) -> None:
        pass


class FakeClient:
    def __init__(self) -> None:
        self.begins: list[dict[str, Any]] = []

    async def begin(self, timeout_s: float, label: str, **where: Any) -> FakeTx:
        self.begins.append(where)
        return FakeTx(where.get("partition") or "p2")


def test_the_executor_begins_as_the_op_says_and_records_where_it_ran() -> None:
    topology = Topology.of(["q0", "q1"], partitions=3, spread=1)
    client = FakeClient()
    executor = Executor(client, topology=topology)  # type: ignore[arg-type]

    def run(spec: Spec) -> tuple[str, Any, str | None]:
        return asyncio.run(executor.run(spec))

    type_, value, _ = run(Spec("dequeue", {"queue": "s0", "max": 1, "fragment": "p1"}))
    assert type_ == "ok" and value["partition"] == "p1" and value["items"]["0-1"]["pt"] == "p1"
    type_, value, _ = run(Spec("move", {"from": "s0", "to": "s0", "max": 1, "partition_key": "k3"}))
    assert value["partition"] == "p2"
    run(Spec("enqueue", {"writes": [{"queue": "s0", "values": ["0-9"]}]}))
    run(Spec("dequeue", {"queue": "q1", "max": 1}))
    assert client.begins == [{"partition": "p1"}, {"partition_key": "k3"}, {"partition_key": None},
                             {"partition": "p1"}]


def test_a_spread_queues_read_is_judged_by_each_fragments_own_answer() -> None:
    merged = {"queue": "s0", "spread": True, "count": 0,
              "by_partition": {"p0": {"count": 0, "locked": 0, "node_id": "node-0"},
                               "p1": {"count": 0, "locked": 0, "node_id": "node-2"}},
              "unanswered": ["p2"]}
    assert fragment_info(merged, "p1")["node_id"] == "node-2"
    assert fragment_info(merged, "p2") == {}  # no answer: not proved empty
    plain = {"queue": "q1", "count": 0, "node_id": "node-1"}
    assert fragment_info(plain, "p1") is plain
