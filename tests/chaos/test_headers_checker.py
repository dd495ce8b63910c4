"""Item headers in chaos: the headers checker on hand-written histories, and the workload's side of
them (which values carry headers, how they are sent, moved and recorded) on fakes.

Histories are written with ``History`` from tests/helpers: enqueues of marked values (``-h``),
the item details a consumer records (``h``: the headers it saw), refusals for the feature level.
"""

from __future__ import annotations

import asyncio
from typing import Any

from chaos.checkers import check, check_headers
from chaos.checkers.headers import expected_headers
from chaos.checkers.report import summary_text
from chaos.executor import Executor, item_meta
from chaos.generator import Generator, Spec, Topology, has_headers, headers_of, is_poison, runs_by_headers
from rcq.client import Item
from rcq.client.wire import DeadLetter
from rcq.errors import FeatureLevelRequired
from tests.helpers.history import History


def seen(h: History, process: int, queue: str, *entries: tuple[str, dict[str, str] | None], f: str = "dequeue",
         type: str = "ok") -> History:
    """Values handed out by ``f``, each with the headers its consumer recorded (None: no details)."""
    items = {v: {"id": n, "dc": 0, "at": None, **({"h": hd} if hd else {})}
             for n, (v, hd) in enumerate(entries) if hd is not None}
    return h.op(process, type, f, {"queue": queue, "values": [v for v, _ in entries], "items": items},
                invoke_value={"queue": queue, "max": max(1, len(entries))})


def own(value: str) -> dict[str, str]:
    return {"rcq-chaos": value}


def refused(h: History, process: int, *values: str) -> History:
    h.invoke(process, "enqueue", {"writes": [{"queue": "q1", "values": list(values)}]})
    h._line(process, "fail", "enqueue", {"writes": [{"queue": "q1", "values": list(values)}]}, "feature_level_required")
    return h


def clean_story() -> History:
    h = History()
    h.enqueue(0, "ok", "q1", "0-1-h", "0-2-h").enqueue(1, "ok", "q1", "1-1", "1-2-poison")
    refused(h, 2, "2-1-h", "2-2-poison")  # a cluster still at level 1: nothing enqueued
    seen(h, 3, "q1", ("0-1-h", own("0-1-h")), ("1-1", {}), f="dequeue-abort")
    h.op(3, "ok", "move", {"from": "q1", "to": "q2", "values": ["0-1-h"],
                           "items": {"0-1-h": {"id": 1, "dc": 1, "h": own("0-1-h")}}},
         invoke_value={"from": "q1", "to": "q2", "max": 1})
    h.peek(4, "q2", "0-1-h")  # a peek records no details: not checked
    seen(h, 4, "q2", ("0-1-h", own("0-1-h")))
    seen(h, 5, "q1-dlq", ("0-2-h", own("0-2-h")))  # dead letters keep them
    seen(h, 6, "q1", ("1-1", {}), f="drain")
    seen(h, 6, "q1-dlq", ("1-2-poison", {}), f="drain")
    return h


def test_a_clean_story_is_valid_and_counted() -> None:
    result = check_headers(clean_story().lines)
    assert result["valid"] and result["checked"], result["samples"]
    assert (result["items_checked"], result["items_with_headers"], result["items_without_details"]) == (7, 4, 1)
    assert result["marked_values_enqueued"] == {"fail": 1, "ok": 2} and result["refused_for_level"] == 1
    whole = check(clean_story().lines)
    assert whole["headers"]["valid"]
    assert "headers: 7 items seen checked, 4 with headers; values with headers enqueued: fail 1, ok 2; 1 ops refused" \
        in summary_text(whole, 7)


def test_missing_wrong_and_unexpected_headers_are_caught() -> None:
    h = History().enqueue(0, "ok", "q1", "0-1-h", "0-2-h", "0-3")
    seen(h, 1, "q1", ("0-1-h", {}), ("0-2-h", own("0-1-h")), ("0-3", own("0-3")))
    seen(h, 2, "q1-dlq", ("0-2-h", {"rcq-chaos": "0-2-h", "more": "x"}))
    result = check_headers(h.lines)
    assert not result["valid"]
    assert result["violations"] == {"headers_missing": 1, "headers_wrong": 2, "headers_unexpected": 1,
                                    "refused_without_headers": 0}
    assert result["samples"]["headers_missing"][0] == {"value": "0-1-h", "queue": "q1", "f": "dequeue", "index": 2,
                                                       "headers": {}, "expected": own("0-1-h")}
    whole = check(h.lines)
    assert "headers" in whole["invalid_checkers"]
    assert "headers_wrong: 2 e.g. 0-2-h, 0-2-h" in summary_text(whole, 7)


def test_a_level_refusal_of_a_plain_enqueue_or_move_is_caught() -> None:
    h = refused(History(), 0, "0-1", "0-2-poison")
    h.invoke(1, "move", {"from": "q1", "to": "q2", "max": 1})
    h._line(1, "fail", "move", {"from": "q1", "to": "q2", "values": ["0-3"]}, "feature_level_required")
    result = check_headers(h.lines)
    assert result["violations"]["refused_without_headers"] == 2 and not result["valid"]
    assert not result["checked"]  # no item was seen with its details
    assert "not checked (no item details in this history)" in summary_text(check(h.lines), 7)


def test_a_refused_enqueue_enqueued_nothing_for_the_queue_checkers_too() -> None:
    h = refused(History(), 0, "0-1-h")
    seen(h, 1, "q1", ("0-1-h", own("0-1-h")))  # yet it came out: the total-queue checker says so
    result = check(h.lines)
    assert result["headers"]["valid"] and not result["total_queue"]["valid"]


# ----------------------------------------------------------------------------------- workload
def test_the_checker_and_the_workload_agree_on_each_values_headers() -> None:
    for value in ("3-17-h", "3-17", "3-17-poison", "h", "-h"):
        assert expected_headers(value) == headers_of(value)
    assert headers_of("3-17-h") == {"rcq-chaos": "3-17-h"} and has_headers("3-17-h") and not has_headers("3-17")


def test_the_generator_marks_some_writes_to_featured_queues_and_never_poison() -> None:
    queues = ["q0", "q1", "q2"]
    topology = Topology.of(queues)

    def writes_of(seed: int) -> list[dict[str, Any]]:
        specs = [g.next() for g in [Generator(seed, w, queues, topology=topology) for w in range(6)] for _ in range(300)]
        return [write for spec in specs if spec.f == "enqueue" for write in spec.value["writes"]]

    writes = writes_of(7)
    assert writes == writes_of(7)
    values = [v for w in writes for v in w["values"]]
    assert len(values) == len(set(values))
    marked = [w for w in writes if any(has_headers(v) for v in w["values"])]
    assert marked and all(w["queue"] != "q0" for w in marked)
    assert all(has_headers(v) != is_poison(v) for w in marked for v in w["values"])  # every value but poison
    assert 0.1 < len(marked) / len([w for w in writes if w["queue"] != "q0"]) < 0.35
    assert not any(has_headers(v) for spec in [Generator(7, 0, queues).next() for _ in range(300)]
                   for w in spec.value.get("writes", []) for v in w["values"])  # no topology: the old workload


def test_runs_keep_the_order_with_each_item_with_headers_alone() -> None:
    assert runs_by_headers(["a-h", "b", "c", "d-h", "e-h", "f"], headers_of) == [
        (["a-h"], own("a-h")), (["b", "c"], {}), (["d-h"], own("d-h")), (["e-h"], own("e-h")), (["f"], {})]
    assert runs_by_headers(["a", "b"], headers_of) == [(["a", "b"], {})]
    assert runs_by_headers([], headers_of) == []


class FakeTx:
    def __init__(self, items: list[Item] | None = None, refuse: BaseException | None = None) -> None:
        self.transaction_id = "1.000000000000000000000001"
        self.items = items or []
        self.refuse = refuse
        self.calls: list[tuple[Any, ...]] = []

    async def dequeue_items(self, queue: str, max_items: int) -> list[Item]:
        return self.items

    async def enqueue_batch(self, queue: str, values: list[Any], **options: Any) -> int:
        self.calls.append(("enqueue", queue, list(values), options))
        if options.get("headers") and self.refuse is not None:
            raise self.refuse
        return len(values)

    async def commit(self) -> None:
        self.calls.append(("commit",))

    async def abort(self) -> int:
        self.calls.append(("abort",))
        return 0


class FakeClient:
    def __init__(self, tx: FakeTx) -> None:
        self.tx = tx

    async def begin(self, timeout_s: float, label: str) -> FakeTx:
        return self.tx


def run(spec: Spec, tx: FakeTx) -> tuple[str, Any, str | None]:
    return asyncio.run(Executor(FakeClient(tx), topology=Topology.of(["q0", "q1", "q2"])).run(spec))  # type: ignore[arg-type]


def test_an_enqueue_sends_each_marked_value_with_its_headers_and_the_write_options() -> None:
    tx = FakeTx()
    spec = Spec("enqueue", {"writes": [{"queue": "q1", "values": ["1-1-h", "1-2-poison", "1-3-h"], "priority": 2},
                                       {"queue": "q0", "values": ["1-4", "1-5"]}]})
    type_, _, error = run(spec, tx)
    assert (type_, error) == ("ok", None)
    assert tx.calls == [("enqueue", "q1", ["1-1-h"], {"priority": 2, "headers": own("1-1-h")}),
                        ("enqueue", "q1", ["1-2-poison"], {"priority": 2}),
                        ("enqueue", "q1", ["1-3-h"], {"priority": 2, "headers": own("1-3-h")}),
                        ("enqueue", "q0", ["1-4", "1-5"], {}), ("commit",)]


def test_a_refusal_for_the_feature_level_is_a_definite_failure_and_aborts() -> None:
    tx = FakeTx(refuse=FeatureLevelRequired("item headers need feature level 2"))
    type_, value, error = run(Spec("enqueue", {"writes": [{"queue": "q1", "values": ["1-1", "1-2-h"]}]}), tx)
    assert (type_, error) == ("fail", "feature_level_required") and tx.calls[-1] == ("abort",)
    assert value["writes"] == [{"queue": "q1", "values": ["1-1", "1-2-h"]}]


def test_a_mover_keeps_each_items_headers_and_records_them() -> None:
    items = [Item(1, "q1", b"0-1-h", headers=own("0-1-h")), Item(2, "q1", b"0-2"), Item(3, "q1", b"0-3")]
    tx = FakeTx(items)
    type_, value, _ = run(Spec("move", {"from": "q1", "to": "q2", "max": 3}), tx)
    assert type_ == "ok"
    assert tx.calls == [("enqueue", "q2", [b"0-1-h"], {"headers": own("0-1-h")}),
                        ("enqueue", "q2", [b"0-2", b"0-3"], {}), ("commit",)]
    assert value["items"]["0-1-h"]["h"] == own("0-1-h") and "h" not in value["items"]["0-2"]


def test_an_items_details_carry_its_headers_only_when_it_has_some() -> None:
    dead = Item(9, "q1-dlq", b"0-1-h", dead_letter=DeadLetter("max_deliveries", "q1", 3), headers=own("0-1-h"))
    assert item_meta(dead)["h"] == own("0-1-h") and item_meta(dead)["dl"] == ["max_deliveries", "q1", 3]
    assert "h" not in item_meta(Item(1, "q1", b"x"))
