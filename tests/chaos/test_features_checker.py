"""The features checker (poison, dead letters, delays, ttl, priorities) on hand-written histories,
and the workload's side of them on fakes: each violation is caught, clean stories pass.

Histories are written with test_checker's ``History`` builder, plus the verbs of the features:
queue settings, enqueue options, the item details a consumer records (id, delivery count, enqueue
time, priority, dead-letter record), rejects, redrives and the queues' final counters.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from chaos.checkers import check, check_aborted_return, check_atomicity, check_features, check_total_queue
from chaos.checkers.report import summary_text
from chaos.executor import Executor
from chaos.generator import FEATURE_MIX, MAX_DELIVERIES, Generator, Spec, Topology, is_poison
from rcq.client import Item
from rcq.client.wire import DeadLetter
from rcq.errors import CommitOutcomeUnknown
from tests.helpers.history import History

SETUP = 100_001
WALL0_MS = 1_800_000_000_000  # the fake wall clock at history time 0


def m(item_id: int, dc: int = 0, *, p: int = 0, dl: tuple[str, str, int] | None = None,
      at: int | None = None, exp: int | None = None) -> dict[str, Any]:
    """An item's details as the workload records them (``exp`` only when given: a server that does
    not report expiries leaves it out)."""
    meta: dict[str, Any] = {"id": item_id, "dc": dc, "at": at}
    if exp is not None:
        meta["exp"] = exp
    if p:
        meta["p"] = p
    if dl is not None:
        meta["dl"] = list(dl)
    return meta


class FH(History):
    """History plus the features' verbs. Times advance 0.1 s per line; ``wait`` jumps ahead."""

    def wait(self, seconds: float) -> FH:
        self.time_s += seconds
        return self

    def wall_ms(self) -> int:
        return WALL0_MS + round(self.time_s * 1000)

    def configure(self, queue: str, **settings: Any) -> FH:
        value = {"queue": queue, "max_items": None, "max_deliveries": None, "dead_letter_queue": None,
                 "max_priority": None, **settings}
        return self.op(SETUP, "ok", "configure", value)  # type: ignore[return-value]

    def standard(self) -> FH:
        """q0 plain, q1 with a dead-letter queue and max_deliveries 3, q2 with a dead-letter queue and
        no limit, q3 with max_deliveries and no dead-letter queue — the workload's topology."""
        self.configure("q1-dlq").configure("q2-dlq")
        self.configure("q0", max_items=40)
        self.configure("q1", max_deliveries=3, dead_letter_queue="q1-dlq", max_priority=2)
        self.configure("q2", dead_letter_queue="q2-dlq", max_priority=2)
        return self.configure("q3", max_deliveries=3, max_priority=2)

    def put(self, process: int, queue: str, *values: str, type: str = "ok", **options: Any) -> FH:
        """An enqueue of one write with options; returns the builder. The ack's wall time rides along."""
        write = {"queue": queue, "values": list(values), **options}
        self._line(process, "invoke", "enqueue", {"writes": [write]})
        value: dict[str, Any] = {"writes": [write]}
        if type == "ok":
            value["ack_ms"] = self.wall_ms() + 100  # the completion line's time
        self._line(process, type, "enqueue", value, None if type == "ok" else "boom")
        return self

    def took(self, process: int, queue: str, *entries: tuple[str, dict[str, Any] | None], f: str = "dequeue",
             type: str = "ok", rejected: tuple[tuple[str, dict[str, Any]], ...] = (), reject_outcome: str = "ok",
             poison: list[str] | None = None) -> FH:
        """Values handed out (with their details) by ``f``; ``rejected`` ones left for the dead letters."""
        value: dict[str, Any] = {"queue": queue, "values": [v for v, _ in entries],
                                 "items": {v: meta for v, meta in (*entries, *rejected) if meta is not None}}
        if rejected:
            value["rejected"] = [v for v, _ in rejected]
            value["reject_outcome"] = reject_outcome
        if poison:
            value["poison"] = poison
        self._line(process, "invoke", f, {"queue": queue, "max": max(1, len(entries))})
        self._line(process, type, f, value, None if type == "ok" else "boom")
        return self

    def drained(self, queue: str, *entries: tuple[str, dict[str, Any] | None]) -> FH:
        return self.took(99, queue, *entries, f="drain")

    def redrive(self, process: int, dlq: str, redriven: int, type: str = "ok") -> FH:
        return self.op(process, type, "redrive", {"dlq": dlq, "max_items": 5, "redriven": redriven},  # type: ignore[return-value]
                       invoke_value={"dlq": dlq, "max_items": 5})

    def stats(self, **totals: dict[str, int]) -> FH:
        return self.checker_input("queue-stats", totals)  # type: ignore[return-value]


def violations(result: dict[str, Any]) -> dict[str, int]:
    return {kind: count for kind, count in result["violations"].items() if count}


# ---------------------------------------------------------------------------- a clean story
def clean_story() -> FH:
    h = FH().standard()
    h.put(0, "q1", "0-1", "0-2-poison", priority=2)
    h.put(1, "q1", "1-1", delay_s=1.0)
    h.put(2, "q1", "2-1", ttl_s=1.0)
    h.put(3, "q2", "3-1-poison", "3-2")
    h.put(4, "q0", "4-1")
    # the poison in q1: three deliveries, each aborted; then dead at its limit
    h.took(5, "q1", ("0-2-poison", m(11, 0, p=2)), f="dequeue-abort")
    h.took(5, "q1", ("0-2-poison", m(11, 1, p=2)), ("0-1", m(10, 0, p=2)), type="fail", poison=["0-2-poison"])
    h.took(5, "q1", ("0-2-poison", m(11, 2, p=2)), f="vanish")
    h.took(6, "q1", ("0-1", m(10, 1, p=2)))  # consumed, after one aborted delivery
    h.took(6, "q2", ("3-2", m(20, 0)), rejected=(("3-1-poison", m(21, 0)),))  # poison rejected, the rest committed
    h.wait(1.5)  # the delayed item is visible, the ttl one expired (no one took it)
    h.took(7, "q1", ("1-1", m(12, 0)))
    h.took(7, "q1-dlq", ("0-2-poison", m(40, 0, p=2, dl=("max_deliveries", "q1", 3))))
    h.redrive(8, "q2-dlq", 1)  # the rejected poison goes back to q2...
    h.took(6, "q2", rejected=(("3-1-poison", m(41, 0)),))  # ... and is rejected again
    h.drained("q0", ("4-1", m(1, 0)))
    h.drained("q1")
    h.drained("q2")
    h.drained("q1-dlq", ("2-1", m(42, 0, dl=("expired", "q1", 0))))
    h.drained("q2-dlq", ("3-1-poison", m(43, 0, dl=("rejected", "q2", 0))))
    h.stats(q0={"dropped_total": 0}, q1={"dead_lettered_total": 2, "max_deliveries_total": 1, "expired_total": 1},
            q2={"dead_lettered_total": 2, "rejected_total": 2}, q3={"dropped_total": 0},
            **{"q1-dlq": {"redriven_total": 0}, "q2-dlq": {"redriven_total": 1}})
    return h


def test_a_clean_story_with_poison_delays_ttls_and_priorities_is_valid_and_counted() -> None:
    result = check(clean_story().lines)
    assert result["valid"], (result["invalid_checkers"], result["features"]["samples"])
    features = result["features"]
    assert features["checked"] and violations(features) == {}
    assert features["dead"]["by_reason"] == {"expired": 1, "max_deliveries": 1, "rejected": 1}
    assert features["dead"]["poison"] == {"known": 2, "dead": 2, "dropped_by_rule": 0, "died_more_than_once": 0,
                                          "deaths_by_reason": {"max_deliveries": 1, "rejected": 1}}
    assert features["expired"]["values_with_ttl"] == features["expired"]["expired_to_dead_letters"] == 1
    assert features["delayed"]["values_with_delay"] == features["delayed"]["seen"] == 1
    assert features["delayed"]["max_early_s"] < 0  # seen after its time
    assert features["priorities"]["by_priority"]["2"] == {
        "values": 2, "consumed": 1, "time_to_consume_s": features["priorities"]["by_priority"]["2"]["time_to_consume_s"]}
    assert features["delivery_counts"]["replicated"]["max_delivery_count"] == 2
    assert features["rejects"] == {"reject_ops": {"ok": 2}, "values_rejected": 2, "poison_aborts": 1}
    assert features["redrives"]["redriven_acknowledged"] == 1
    assert features["counters"]["checked"]
    # the old checkers account for dead letters: nothing lost, misplaced or duplicated
    total = result["total_queue"]
    assert (total["lost_count"], total["misplaced_count"], total["duplicated_count"]) == (0, 0, 0)
    assert result["aborted_return"]["not_returned_count"] == 0
    text = summary_text(result, seed=3)
    assert "ok      features: dead 3 (expired 1, max_deliveries 1, rejected 1)" in text
    assert "poison 2/2 dead" in text


def test_a_history_without_configured_queues_is_not_checked_and_valid() -> None:
    h = History().enqueue(0, "ok", "a", "v1").drain("a", "v1")
    result = check(h.lines)
    assert result["valid"] and not result["features"]["checked"]
    assert "features: not checked" in summary_text(result, seed=1)


# ---------------------------------------------------------------------------- poison
def test_poison_committed_out_of_its_queue_is_caught() -> None:
    h = FH().standard().put(0, "q1", "0-1-poison").took(1, "q1", ("0-1-poison", m(1, 0)))
    result = check_features(h.lines)
    assert violations(result) == {"poison_consumed": 1, "poison_not_dead": 1}
    assert result["samples"]["poison_consumed"][0]["value"] == "0-1-poison"


def test_poison_in_a_commit_of_unknown_outcome_is_caught_too() -> None:
    h = FH().standard().put(0, "q1", "0-1-poison").took(1, "q1", ("0-1-poison", m(1, 0)), type="info")
    assert violations(check_features(h.lines)) == {"poison_consumed": 1, "poison_not_dead": 1}


def test_poison_that_never_dies_is_caught_and_lost() -> None:
    h = FH().standard().put(0, "q1", "0-1-poison")
    h.took(1, "q1", ("0-1-poison", m(1, 0)), f="dequeue-abort").drained("q1").drained("q1-dlq")
    result = check(h.lines)
    assert violations(result["features"]) == {"poison_not_dead": 1}
    assert result["total_queue"]["lost"] == ["0-1-poison"]
    assert not result["valid"]


def test_poison_dead_of_expiry_is_a_bad_reason() -> None:
    h = FH().standard().put(0, "q1", "0-1-poison", ttl_s=1.0).wait(2)
    h.drained("q1-dlq", ("0-1-poison", m(9, 0, dl=("expired", "q1", 0))))
    assert violations(check_features(h.lines)) == {"poison_bad_reason": 1}


def test_poison_dropped_where_there_is_no_dead_letter_queue_may_vanish() -> None:
    h = FH().standard().put(0, "q3", "0-1-poison")
    h.took(1, "q3", ("0-1-poison", m(1, 0)), f="dequeue-abort").drained("q3")
    h.stats(q3={"dropped_total": 1, "max_deliveries_total": 1})
    result = check(h.lines)
    assert result["valid"], result["invalid_checkers"]
    assert result["total_queue"]["vanished_by_rule"] == ["0-1-poison"]
    assert result["features"]["dead"]["dropped_by_rule"] == 1
    assert result["features"]["counters"]["vanished_by_rule"] == 1


def test_more_values_vanished_than_the_counters_dropped_is_caught() -> None:
    h = FH().standard().put(0, "q3", "0-1", "0-2").drained("q3")
    h.stats(q3={"dropped_total": 1})
    result = check_features(h.lines)
    assert violations(result) == {"counter_mismatch": 1}
    assert result["samples"]["counter_mismatch"][0]["counter"] == "dropped_total"


# ---------------------------------------------------------------------------- dead letters
def test_dead_before_the_delivery_limit_is_caught() -> None:
    h = FH().standard().put(0, "q1", "0-1").drained("q1-dlq", ("0-1", m(9, 0, dl=("max_deliveries", "q1", 2))))
    assert violations(check_features(h.lines)) == {"dead_too_early": 1}


def test_dead_of_max_deliveries_from_a_queue_without_a_limit_is_caught() -> None:
    h = FH().standard().put(0, "q2", "0-1").drained("q2-dlq", ("0-1", m(9, 0, dl=("max_deliveries", "q2", 5))))
    assert violations(check_features(h.lines)) == {"dead_too_early": 1}


@pytest.mark.parametrize("queue, meta, why", [
    ("q1-dlq", m(9, 0), "no dead-letter record"),
    ("q1-dlq", m(9, 0, dl=("max_deliveries", "q3", 3)), "does not send its dead"),
    ("q1", m(9, 0, dl=("max_deliveries", "q1", 3)), "outside a dead-letter queue"),
    ("q1-dlq", m(9, 0, dl=("sunburn", "q1", 3)), "unknown reason"),
])
def test_a_dead_letter_record_out_of_place_is_caught(queue: str, meta: dict[str, Any], why: str) -> None:
    h = FH().standard().put(0, "q1", "0-1").drained(queue, ("0-1", meta))
    result = check_features(h.lines)
    assert violations(result) == {"bad_dead_letter": 1}
    assert why in result["samples"]["bad_dead_letter"][0]["why"]


def test_a_dead_value_whose_source_never_held_it_is_bad_and_misplaced() -> None:
    h = FH().standard().put(0, "q2", "0-1").drained("q1-dlq", ("0-1", m(9, 0, dl=("max_deliveries", "q1", 3))))
    result = check(h.lines)
    assert violations(result["features"]) == {"bad_dead_letter": 1}
    assert result["total_queue"]["misplaced_count"] == 1


def test_rejected_without_any_reject_is_caught() -> None:
    h = FH().standard().put(0, "q1", "0-1").drained("q1-dlq", ("0-1", m(9, 0, dl=("rejected", "q1", 1))))
    assert violations(check_features(h.lines)) == {"rejected_without_reject": 1}
    h2 = FH().standard().put(0, "q1", "0-1").took(1, "q1", rejected=(("0-1", m(1, 0)),), reject_outcome="unknown",
                                                  type="fail")
    h2.drained("q1-dlq", ("0-1", m(9, 0, dl=("rejected", "q1", 1))))
    assert violations(check_features(h2.lines)) == {}  # a reject of unknown outcome may have done it
    h3 = FH().standard().put(0, "q1", "0-1").took(1, "q1", rejected=(("0-1", m(1, 0)),), reject_outcome="fail",
                                                  type="fail")
    h3.drained("q1-dlq", ("0-1", m(9, 0, dl=("rejected", "q1", 1))))
    assert violations(check_features(h3.lines)) == {"rejected_without_reject": 1}


def test_rejected_values_are_seen_but_not_removed() -> None:
    h = FH().standard().put(0, "q1", "0-1", "0-2").took(1, "q1", ("0-1", m(1, 0)), rejected=(("0-2", m(2, 0)),))
    h.drained("q1").drained("q1-dlq", ("0-2", m(9, 0, dl=("rejected", "q1", 1))))
    result = check(h.lines)
    assert result["valid"], result["invalid_checkers"]
    assert result["total_queue"]["dequeued_count"] == 2 and result["total_queue"]["duplicated_count"] == 0


def test_consumed_and_dead_is_caught() -> None:
    h = FH().standard().put(0, "q1", "0-1").took(1, "q1", ("0-1", m(1, 0)))
    h.drained("q1-dlq", ("0-1", m(9, 0, dl=("max_deliveries", "q1", 3))))
    result = check(h.lines)
    assert violations(result["features"]) == {"consumed_and_dead": 1, "seen_after_consumed": 1}
    assert result["total_queue"]["duplicated_count"] == 0  # one removal per queue: only features sees it


def test_a_value_seen_after_its_consuming_commit_is_caught() -> None:
    h = FH().standard().put(0, "q0", "0-1").took(1, "q0", ("0-1", m(1, 0))).took(2, "q0", ("0-1", m(1, 1)),
                                                                                f="dequeue-abort")
    result = check_features(h.lines)
    assert violations(result) == {"seen_after_consumed": 1}


def test_dead_redriven_and_consumed_at_home_is_fine() -> None:
    h = FH().standard().put(0, "q1", "0-1")
    h.took(1, "q1-dlq", ("0-1", m(9, 0, dl=("max_deliveries", "q1", 3))), f="dequeue-abort")
    h.redrive(2, "q1-dlq", 1).took(3, "q1", ("0-1", m(12, 0))).drained("q1").drained("q1-dlq")
    result = check(h.lines)
    assert result["valid"], (result["invalid_checkers"], result["features"]["samples"])


def test_more_deaths_seen_than_counted_is_caught() -> None:
    h = FH().standard().put(0, "q1", "0-1", "0-2")
    h.drained("q1-dlq", ("0-1", m(8, 0, dl=("max_deliveries", "q1", 3))), ("0-2", m(9, 0, dl=("max_deliveries", "q1", 3))))
    h.stats(q1={"dead_lettered_total": 2, "max_deliveries_total": 1})
    result = check_features(h.lines)
    assert violations(result) == {"counter_mismatch": 1}
    assert result["samples"]["counter_mismatch"][0]["counter"] == "max_deliveries_total"


def test_more_redriven_than_counted_is_caught() -> None:
    h = FH().standard().redrive(1, "q1-dlq", 3).stats(**{"q1-dlq": {"redriven_total": 2}})
    assert violations(check_features(h.lines)) == {"counter_mismatch": 1}


# ---------------------------------------------------------------------------- time
def test_a_delayed_value_handed_out_early_is_caught_and_the_margin_reported() -> None:
    h = FH().standard().put(0, "q1", "0-1", delay_s=2.0).took(1, "q1", ("0-1", m(1, 0)))
    result = check_features(h.lines)
    assert violations(result) == {"delivered_early": 1}
    assert result["samples"]["delivered_early"][0]["early_s"] == pytest.approx(1.7, abs=0.01)


def test_a_delayed_value_handed_out_within_the_clock_margin_is_fine() -> None:
    h = FH().standard().put(0, "q1", "0-1", delay_s=0.5).took(1, "q1", ("0-1", m(1, 0)))  # done 0.3 s after invoke
    result = check_features(h.lines)
    assert violations(result) == {}
    assert result["delayed"]["max_early_s"] == pytest.approx(0.2, abs=0.01)


def test_expired_before_its_ttl_is_caught() -> None:
    h = FH().standard().put(0, "q1", "0-1", ttl_s=5.0).wait(1)
    h.drained("q1-dlq", ("0-1", m(9, 0, dl=("expired", "q1", 0))))
    assert violations(check_features(h.lines)) == {"expired_early": 1}
    later = FH().standard().put(0, "q1", "0-1", ttl_s=5.0).wait(4.9)  # 5.1 s after the invoke: fine
    later.drained("q1-dlq", ("0-1", m(10, 0, dl=("expired", "q1", 0))))
    assert violations(check_features(later.lines)) == {}


def test_expired_without_a_ttl_is_caught() -> None:
    h = FH().standard().put(0, "q1", "0-1").wait(10).drained("q1-dlq", ("0-1", m(9, 0, dl=("expired", "q1", 0))))
    assert violations(check_features(h.lines)) == {"expired_without_ttl": 1}


def test_handed_out_past_its_expiry_is_caught_and_the_lateness_reported() -> None:
    h = FH().standard()
    at = h.wall_ms()  # the enqueue's time; expiry 1 s later; taken 3.3 s after it
    h.put(0, "q1", "0-1", ttl_s=1.0).wait(3)
    h.took(1, "q1", ("0-1", m(1, 0, at=at, exp=at + 1000)), f="dequeue-abort")
    result = check_features(h.lines)
    assert violations(result) == {"delivered_after_expiry": 1}
    assert result["samples"]["delivered_after_expiry"][0]["late_s"] == pytest.approx(2.3, abs=0.01)
    in_time = FH().standard()
    at = in_time.wall_ms()
    in_time.put(0, "q1", "0-1", ttl_s=3.1).wait(3)  # taken 0.2 s after its expiry: within the margin
    in_time.took(1, "q1", ("0-1", m(1, 0, at=at, exp=at + 3100)), f="dequeue-abort")
    assert violations(check_features(in_time.lines)) == {}


def test_a_value_redriven_before_its_enqueue_was_acknowledged_is_not_held_to_its_first_ttl() -> None:
    """CI's seed 20240604 (deposed leader): an enqueue's commit applied while its answer was late (the
    leader that took it was cut off; the client learnt the outcome from the next leader seconds
    later). Meanwhile the item expired, died and was redriven: its new life began before the
    acknowledgement and carries no ttl. The old rule (an enqueue time not after the ack is the
    acknowledged life) held that life to the first ttl; the expiry the server reports tells them apart."""
    h = FH().standard()
    at = h.wall_ms()
    write = {"queue": "q1", "values": ["4-99"], "ttl_s": 2.5}
    h.invoke(0, "enqueue", {"writes": [write]})
    h.wait(2.8)
    h.took(2, "q1-dlq", ("4-99", m(50, 0, at=h.wall_ms(), dl=("expired", "q1", 0))), f="dequeue-abort")
    h.redrive(3, "q1-dlq", 1)
    redriven_at = h.wall_ms()
    h.wait(2)  # the producer hears of its commit at last
    h.complete(0, "ok", "enqueue", {"writes": [write], "ack_ms": h.wall_ms() + 100})
    h.wait(10)
    h.took(1, "q1", ("4-99", {**m(60, 0, at=redriven_at), "exp": None}))  # no ttl in this life
    assert redriven_at - at < 4000
    assert violations(check_features(h.lines)) == {}


def test_an_expiry_no_ttl_of_the_value_gives_is_caught() -> None:
    h = FH().standard()
    at = h.wall_ms()
    h.put(0, "q1", "0-1", ttl_s=5.0)
    h.took(1, "q1", ("0-1", m(1, 0, at=at, exp=at + 4000)), f="dequeue-abort")
    result = check_features(h.lines)
    assert violations(result) == {"wrong_expiry": 1}
    assert result["samples"]["wrong_expiry"][0]["ttl_ms"] == 4000
    never = FH().standard().put(0, "q1", "0-1")  # no ttl anywhere, yet an expiry
    never.took(1, "q1", ("0-1", m(1, 0, at=at, exp=at + 4000)), f="dequeue-abort")
    assert violations(check_features(never.lines)) == {"wrong_expiry": 1}
    default = FH().standard().configure("q0", default_ttl_s=4.0).put(0, "q0", "0-1")  # the queue's default
    default.took(1, "q0", ("0-1", m(1, 0, at=at, exp=at + 4000)), f="dequeue-abort")
    assert violations(check_features(default.lines)) == {}


def test_the_wall_offset_is_a_lower_bound_from_the_acknowledgements() -> None:
    """An acknowledgement read late (ack_ms early for its completion) never moves an op later."""
    def story(ack_early_ms: int) -> FH:
        h = FH().standard()
        at = h.wall_ms()
        h.put(0, "q1", "0-1", ttl_s=1.0)
        h.invoke(5, "enqueue", {"writes": [{"queue": "q2", "values": ["5-1"]}]})
        h.complete(5, "ok", "enqueue", {"writes": [{"queue": "q2", "values": ["5-1"]}],
                                        "ack_ms": h.wall_ms() + 100 - ack_early_ms})
        h.wait(1)  # taken 1.5 s after the enqueue time: 0.5 s late
        h.took(1, "q1", ("0-1", m(1, 0, at=at, exp=at + 1000)), f="dequeue-abort")
        return h

    assert violations(check_features(story(0).lines)) == {"delivered_after_expiry": 1}
    assert violations(check_features(story(900).lines)) == {"delivered_after_expiry": 1}  # the best bound wins


def test_a_ttl_value_may_vanish_where_there_is_no_dead_letter_queue_only_once_its_time_passed() -> None:
    def story(wait_s: float) -> FH:
        h = FH().configure("p", max_items=None)
        h.put(0, "p", "0-1", ttl_s=2.0).wait(wait_s).drained("p")
        return h

    assert check(story(3.0).lines)["valid"]
    assert check_total_queue(story(3.0).lines)["vanished_by_rule"] == ["0-1"]
    early = check(story(0.5).lines)
    assert early["total_queue"]["lost"] == ["0-1"] and not early["valid"]


def test_vanished_by_rule_is_neither_incomplete_nor_unreturned() -> None:
    h = FH().standard().put(0, "q3", "0-1", "0-2").took(1, "q3", ("0-1", m(1, 0)), f="dequeue-abort").drained("q3")
    assert check_atomicity(h.lines)["valid"]
    assert check_aborted_return(h.lines)["valid"]


# ---------------------------------------------------------------------------- delivery counts
def test_handed_out_at_the_limit_or_beyond_it_is_caught() -> None:
    h = FH().standard().put(0, "q1", "0-1").took(1, "q1", ("0-1", m(1, 3)), f="dequeue-abort")
    assert violations(check_features(h.lines)) == {"over_delivered": 1}
    h = FH().standard().put(0, "q1", "0-1")
    for _ in range(MAX_DELIVERIES + 1):  # the same count each time: the server would not count them
        h.took(1, "q1", ("0-1", m(1, 0)), f="dequeue-abort")
    result = check_features(h.lines)
    assert violations(result) == {"over_delivered": 1}
    assert result["delivery_counts"]["replicated"]["repeated_counts"] == 6


def test_a_delivery_count_that_falls_is_caught_on_a_limited_queue_only() -> None:
    h = FH().standard().put(0, "q1", "0-1").put(0, "q2", "0-2")
    h.took(1, "q1", ("0-1", m(1, 2)), f="dequeue-abort").took(1, "q1", ("0-1", m(1, 1)), f="dequeue-abort")
    h.took(1, "q2", ("0-2", m(2, 2)), f="dequeue-abort").took(1, "q2", ("0-2", m(2, 0)), f="dequeue-abort")
    result = check_features(h.lines)
    assert violations(result) == {"delivery_count_decreased": 1}
    assert result["delivery_counts"]["in_leader_memory"]["decreases"] == 1


def test_overlapping_ops_are_not_ordered_and_a_new_item_id_starts_again() -> None:
    h = FH().standard().put(0, "q1", "0-1")
    h.invoke(1, "dequeue-abort", {"queue": "q1", "max": 1})
    h.took(2, "q1", ("0-1", m(1, 1)), f="dequeue-abort")
    h.complete(1, "ok", "dequeue-abort", {"queue": "q1", "values": ["0-1"], "items": {"0-1": m(1, 2)}})
    h.took(3, "q1", ("0-1", m(7, 0)), f="dequeue-abort")  # another id: another life (redriven, moved back)
    assert violations(check_features(h.lines)) == {}


# ---------------------------------------------------------------------------- priorities
def test_a_priority_no_enqueue_gave_is_caught() -> None:
    h = FH().standard().put(0, "q1", "0-1", priority=1).took(1, "q1", ("0-1", m(1, 0, p=2)))
    assert violations(check_features(h.lines)) == {"wrong_priority": 1}
    h = FH().standard().put(0, "q1", "0-1", priority=1)
    h.drained("q1-dlq", ("0-1", m(9, 0, p=0, dl=("max_deliveries", "q1", 3))))  # dead items keep it
    assert violations(check_features(h.lines)) == {"wrong_priority": 1}


def test_a_moved_value_has_priority_zero_in_its_new_queue() -> None:
    h = FH().standard().put(0, "q1", "0-1", priority=2)
    h.took(1, "q1", ("0-1", m(1, 0, p=2)), f="move")
    h.lines[-1]["value"]["to"] = "q2"
    h.lines[-2]["value"]["to"] = "q2"
    h.took(2, "q2", ("0-1", m(5, 0)))
    result = check_features(h.lines)
    assert violations(result) == {}


def test_in_batch_priority_inversions_are_counted_not_judged() -> None:
    h = FH().standard().put(0, "q1", "0-1", priority=0).put(0, "q1", "0-2", priority=2)
    h.took(1, "q1", ("0-1", m(1, 0)), ("0-2", m(2, 0, p=2)))
    result = check_features(h.lines)
    assert result["valid"] and result["priorities"]["in_batch_inversions"] == 1


# ---------------------------------------------------------------------------- the workload's side
def test_the_topology_keeps_q0_plain_and_gives_the_others_dead_letters_limits_and_priorities() -> None:
    topology = Topology.of(["q0", "q1", "q2", "q3"])
    assert topology.plans["q0"].settings() == {"max_items": 40, "max_deliveries": None, "dead_letter_queue": None,
                                               "max_priority": None}
    assert topology.plans["q1"].settings() == {"max_items": None, "max_deliveries": 3, "dead_letter_queue": "q1-dlq",
                                               "max_priority": 2}
    assert topology.plans["q2"].max_deliveries is None and topology.plans["q2"].dead_letter_queue == "q2-dlq"
    assert topology.plans["q3"].dead_letter_queue is None and topology.plans["q3"].max_deliveries == 3
    assert topology.all_queues == ["q0", "q1", "q2", "q3", "q1-dlq", "q2-dlq"]
    assert topology.poison_policy("q1") == "reject" and topology.poison_policy("q1-dlq") is None


def test_the_generator_writes_options_and_poison_only_to_featured_queues_and_consumes_dead_letters() -> None:
    queues = ["q0", "q1", "q2"]
    topology = Topology.of(queues)
    def specs_of(seed: int, topology: Topology | None) -> list[Spec]:
        generators = [Generator(seed, w, queues, topology=topology) for w in range(6)]
        return [g.next() for g in generators for _ in range(300)]

    specs = specs_of(7, topology)
    assert specs == specs_of(7, topology) and specs != specs_of(8, topology)
    writes = [write for spec in specs if spec.f == "enqueue" for write in spec.value["writes"]]
    featured = [w for w in writes if w["queue"] != "q0"]
    assert all(set(w) == {"queue", "values"} and not any(is_poison(v) for v in w["values"])
               for w in writes if w["queue"] == "q0")
    for option in ("priority", "delay_s", "ttl_s"):
        assert any(option in w for w in featured), option
    assert any(is_poison(v) for w in featured for v in w["values"])
    assert not any("ttl_s" in w and any(is_poison(v) for v in w["values"]) for w in featured)
    assert all(0 <= w.get("priority", 0) <= 2 for w in featured)
    assert {spec.value["queue"] for spec in specs if spec.f == "dequeue"} >= {"q1-dlq", "q2-dlq"}
    assert {spec.value["dlq"] for spec in specs if spec.f == "redrive"} == {"q1-dlq", "q2-dlq"}
    assert {spec.value.get("poison") for spec in specs if spec.f == "dequeue" and spec.value["queue"] == "q1"} == {
        "abort", "reject"}
    assert {spec.value.get("poison") for spec in specs if spec.f == "dequeue" and spec.value["queue"] == "q2"} == {
        "reject"}
    plain = specs_of(7, None)  # no topology: the old workload
    assert not {spec.f for spec in plain} & {"redrive", *FEATURE_MIX}
    assert all(set(w) == {"queue", "values"} for spec in plain if spec.f == "enqueue" for w in spec.value["writes"])


class FakeTx:
    def __init__(self, items: list[Item], reject_error: BaseException | None = None) -> None:
        self.transaction_id = "1.000000000000000000000001"
        self.items = items
        self.reject_error = reject_error
        self.calls: list[str] = []

    async def dequeue_items(self, queue: str, max_items: int) -> list[Item]:
        self.calls.append("dequeue")
        return self.items

    async def enqueue_batch(self, queue: str, values: list[Any], **options: Any) -> int:
        self.calls.append(f"enqueue {queue} {sorted(options)}")
        return len(values)

    async def reject(self, queue: str, items: list[Item], reason: str | None = None) -> int:
        self.calls.append(f"reject {[i.item_id for i in items]} {reason}")
        if self.reject_error is not None:
            raise self.reject_error
        return len(items)

    async def commit(self) -> None:
        self.calls.append("commit")

    async def abort(self) -> int:
        self.calls.append("abort")
        return 0


class FakeClient:
    def __init__(self, tx: FakeTx) -> None:
        self.tx = tx

    async def begin(self, timeout_s: float, label: str) -> FakeTx:
        return self.tx

    async def redrive(self, dlq: str, max_items: int | None = None) -> dict[str, Any]:
        return {"redriven": 2, "by_queue": {"q1": 2}}


ITEMS = [Item(1, "q1", b"0-1", delivery_count=1, priority=2, enqueued_at_ms=5, expires_at_ms=2505),
         Item(2, "q1", b"0-2-poison", delivery_count=0)]


def run(spec: Spec, tx: FakeTx) -> tuple[str, Any, str | None]:
    return asyncio.run(Executor(FakeClient(tx), topology=Topology.of(["q0", "q1", "q2"])).run(spec))  # type: ignore[arg-type]


def test_a_consumer_aborts_on_poison_and_records_what_it_saw() -> None:
    tx = FakeTx(ITEMS)
    type_, value, error = run(Spec("dequeue", {"queue": "q1", "max": 2, "poison": "abort"}), tx)
    assert (type_, error) == ("fail", "poison_abort") and tx.calls == ["dequeue", "abort"]
    assert value["values"] == ["0-1", "0-2-poison"] and value["poison"] == ["0-2-poison"]
    assert value["items"]["0-1"] == {"id": 1, "dc": 1, "at": 5, "exp": 2505, "p": 2}
    assert value["items"]["0-2-poison"]["exp"] is None  # never expires


def test_a_consumer_rejects_poison_and_commits_the_rest() -> None:
    tx = FakeTx(ITEMS)
    type_, value, error = run(Spec("dequeue", {"queue": "q1", "max": 2, "poison": "reject"}), tx)
    assert (type_, error) == ("ok", None) and tx.calls == ["dequeue", "reject [2] poison", "commit"]
    assert value["values"] == ["0-1"] and value["rejected"] == ["0-2-poison"] and value["reject_outcome"] == "ok"


def test_a_reject_of_unknown_outcome_aborts_and_says_so() -> None:
    tx = FakeTx(ITEMS, reject_error=CommitOutcomeUnknown())
    type_, value, _ = run(Spec("dequeue", {"queue": "q1", "max": 2, "poison": "reject"}), tx)
    assert type_ == "fail" and tx.calls[-1] == "abort"  # no commit was sent
    assert value["rejected"] == ["0-2-poison"] and value["reject_outcome"] == "unknown"


def test_dead_letters_are_consumed_poison_and_all() -> None:
    dead = [Item(9, "q1-dlq", b"0-2-poison", dead_letter=DeadLetter("max_deliveries", "q1", 3))]
    tx = FakeTx(dead)
    type_, value, _ = run(Spec("dequeue", {"queue": "q1-dlq", "max": 1}), tx)
    assert type_ == "ok" and tx.calls == ["dequeue", "commit"]
    assert value["items"]["0-2-poison"]["dl"] == ["max_deliveries", "q1", 3]


def test_a_mover_never_carries_poison() -> None:
    tx = FakeTx(ITEMS)
    type_, value, error = run(Spec("move", {"from": "q1", "to": "q2", "max": 2}), tx)
    assert (type_, error) == ("fail", "poison_abort") and "commit" not in tx.calls
    assert value["values"] == ["0-1", "0-2-poison"]


def test_an_enqueue_sends_its_options_and_records_the_ack_time() -> None:
    tx = FakeTx([])
    spec = Spec("enqueue", {"writes": [{"queue": "q1", "values": ["0-1"], "priority": 1, "ttl_s": 3.0},
                                       {"queue": "q0", "values": ["0-2"]}]})
    type_, value, _ = run(spec, tx)
    assert type_ == "ok" and isinstance(value["ack_ms"], int)
    assert tx.calls == ["enqueue q1 ['priority', 'ttl_s']", "enqueue q0 []", "commit"]


def test_a_redrive_records_what_it_moved() -> None:
    type_, value, _ = run(Spec("redrive", {"dlq": "q1-dlq", "max_items": 3}), FakeTx([]))
    assert type_ == "ok" and value == {"dlq": "q1-dlq", "max_items": 3, "redriven": 2, "by_queue": {"q1": 2}}
