"""The chaos checkers on hand-written histories: each violation is caught, clean runs pass.

Histories are written op by op with a tiny builder (:class:`tests.helpers.history.History`) so each test
reads as the story it checks: who enqueued what, who took it out, what the
nemesis did. The writer/reader tests use real files.
"""

from __future__ import annotations

import itertools
import json
import random
import threading
from pathlib import Path

import pytest

from chaos.checkers import (
    check,
    check_aborted_return,
    check_atomicity,
    check_convergence,
    check_file,
    check_liveness,
    check_ordering,
    check_total_queue,
)
from chaos.checkers.__main__ import main
from chaos.checkers.ordering import _count_inversions
from chaos.checkers.report import summary_text, write_results
from chaos.history import HistoryError, HistoryWriter, pair_ops, read_history
from tests.helpers.history import History


def test_a_clean_history_is_valid_by_every_checker() -> None:
    h = History()
    h.checker_input("leaders", [{"time_s": 0.05, "node": "node-0", "term": 1}])
    h.op(0, "ok", "enqueue", {"writes": [{"queue": "a", "values": ["x1", "x2"]}, {"queue": "b", "values": ["y1"]}]})
    h.enqueue(1, "ok", "a", "x3")
    h.nemesis("kill", "start", "node-0")
    h.abort(2, "a", "x1", head_rank=0)
    h.peek(2, "a", "x1")
    h.dequeue(2, "ok", "a", "x1")
    h.nemesis("kill", "stop", "node-0")
    h.move(3, "ok", "a", "b", "x2")
    h.vanish(2, "a", "x3")
    h.enqueue(1, "fail", "a", "x4")
    h.checker_input("leaders", [{"time_s": 1.0, "node": "node-1", "term": 2}])
    h.drain("a", "x3")
    h.drain("b", "y1", "x2")
    h.checker_input("digests", {"node-0": "abc@40", "node-1": "abc@40", "node-2": "abc@40"})
    h.checker_input("open-transactions", {"count": 0, "oldest_age_s": None})

    result = check(h.lines)

    assert result["valid"], result["invalid_checkers"]
    assert result["invalid_checkers"] == []
    tq = result["total_queue"]
    assert (tq["acknowledged_count"], tq["dequeued_count"], tq["failed_enqueue_count"]) == (4, 4, 1)
    assert tq["lost_count"] == tq["unexpected_count"] == tq["duplicated_count"] == 0
    assert result["aborted_return"]["returned_count"] == {"dequeue-abort": 1, "vanish": 1, "peek": 1}
    assert result["atomicity"]["committed_moves_count"] == 1
    assert result["convergence"]["checked"] and result["convergence"]["distinct_count"] == 1
    assert result["liveness"]["by_fault"]["kill"]["windows"] == 1
    assert result["stats"]["client_ops"] == 10
    assert result["security"] == {"valid": True, "checked": False, "skipped": "no intruder in this history"}


def test_committed_enqueue_never_dequeued_is_lost() -> None:
    h = History().enqueue(0, "ok", "a", "v1", "v2").dequeue(1, "ok", "a", "v1").drain("a")
    result = check_total_queue(h.lines)
    assert not result["valid"]
    assert result["lost_count"] == 1 and result["lost"] == ["v2"]


def test_value_that_was_never_enqueued_is_unexpected() -> None:
    h = History().enqueue(0, "ok", "a", "v1").dequeue(1, "ok", "a", "v1").drain("a", "ghost")
    result = check_total_queue(h.lines)
    assert not result["valid"]
    assert result["unexpected"] == ["ghost"] and result["lost_count"] == 0


def test_value_of_a_failed_enqueue_that_comes_out_is_unexpected() -> None:
    h = History().enqueue(0, "fail", "a", "v1").peek(1, "a", "v1").drain("a", "v1")
    result = check_total_queue(h.lines)
    assert not result["valid"]
    assert result["unexpected"] == ["v1"]
    assert result["unexpected_from_failed_enqueue_count"] == 1


def test_failed_enqueue_that_never_appears_is_fine() -> None:
    h = History().enqueue(0, "fail", "a", "v1").drain("a")
    result = check_total_queue(h.lines)
    assert result["valid"] and result["failed_enqueue_count"] == 1


def test_value_dequeued_by_two_committed_transactions_is_duplicated() -> None:
    h = History().enqueue(0, "ok", "a", "v1").dequeue(1, "ok", "a", "v1").dequeue(2, "ok", "a", "v1")
    result = check_total_queue(h.lines)
    assert not result["valid"]
    assert result["duplicated_count"] == 1
    assert result["duplicated"][0]["value"] == "v1"
    assert [by["process"] for by in result["duplicated"][0]["by"]] == [1, 2]
    assert result["duplicated_with_unknown_count"] == 0


def test_drain_of_a_dequeued_value_is_a_duplicate_too() -> None:
    h = History().enqueue(0, "ok", "a", "v1").dequeue(1, "ok", "a", "v1").drain("a", "v1")
    assert check_total_queue(h.lines)["duplicated_count"] == 1


def test_duplicate_where_one_dequeue_had_unknown_outcome_is_reported_apart_and_valid() -> None:
    h = History().enqueue(0, "ok", "a", "v1").dequeue(1, "info", "a", "v1").dequeue(2, "ok", "a", "v1")
    result = check_total_queue(h.lines)
    assert result["valid"]
    assert result["duplicated_count"] == 0
    assert result["duplicated_with_unknown_count"] == 1
    assert {by["type"] for by in result["duplicated_with_unknown"][0]["by"]} == {"info", "ok"}


def test_value_enqueued_twice_with_one_unknown_outcome_may_come_out_twice() -> None:
    h = History().enqueue(0, "info", "a", "v1").enqueue(0, "ok", "a", "v1")
    h.dequeue(1, "ok", "a", "v1").dequeue(2, "ok", "a", "v1")
    result = check_total_queue(h.lines)
    assert result["valid"]
    assert (result["duplicated_count"], result["duplicated_with_unknown_count"]) == (0, 1)
    h.dequeue(3, "ok", "a", "v1")
    assert check_total_queue(h.lines)["duplicated_count"] == 1


def test_info_enqueue_recovered_or_absent_are_both_valid() -> None:
    h = History().enqueue(0, "info", "a", "recovered").enqueue(0, "info", "a", "absent")
    h.dequeue(1, "ok", "a", "recovered").drain("a")
    result = check_total_queue(h.lines)
    assert result["valid"]
    assert result["recovered"] == ["recovered"]
    assert result["unknown_enqueue_absent_count"] == 1
    assert result["lost_count"] == 0


def test_info_enqueue_seen_but_never_taken_out_is_lost() -> None:
    h = History().enqueue(0, "info", "a", "v1").peek(1, "a", "v1").drain("a")
    result = check_total_queue(h.lines)
    assert not result["valid"] and result["lost"] == ["v1"]


def test_invoke_without_completion_counts_as_info() -> None:
    h = History().invoke(0, "enqueue", {"writes": [{"queue": "a", "values": ["v1"]}]}).drain("a")
    result = check_total_queue(h.lines)
    assert result["valid"] and result["unknown_enqueue_count"] == 1


def test_value_in_an_info_dequeue_never_seen_again_is_maybe_removed_not_lost() -> None:
    h = History().enqueue(0, "ok", "a", "v1").dequeue(1, "info", "a", "v1").drain("a")
    result = check_total_queue(h.lines)
    assert result["valid"]
    assert result["maybe_removed"] == ["v1"] and result["lost_count"] == 0


def test_value_seen_in_a_queue_it_never_went_to_is_misplaced() -> None:
    h = History().enqueue(0, "ok", "a", "v1").drain("b", "v1")
    result = check_total_queue(h.lines)
    assert not result["valid"]
    assert result["misplaced_count"] == 1 and result["misplaced"][0]["queue"] == "b"


def test_partially_visible_info_enqueue_is_not_atomic() -> None:
    h = History().enqueue(0, "info", "a", "v1", "v2").dequeue(1, "ok", "a", "v1").drain("a")
    result = check_atomicity(h.lines)
    assert not result["valid"]
    assert result["partial_info_enqueues_count"] == 1
    assert result["partial_info_enqueues"][0]["missing"] == ["v2"]


def test_ok_enqueue_spanning_two_queues_must_appear_in_both() -> None:
    h = History().op(0, "ok", "enqueue", {"writes": [{"queue": "a", "values": ["x"]}, {"queue": "b", "values": ["y"]}]})
    h.drain("a", "x").drain("b")
    result = check_atomicity(h.lines)
    assert not result["valid"]
    assert result["incomplete_ok_enqueues"][0]["missing"] == ["y"]
    assert result["multi_queue_enqueue_transactions_count"] == 1


def test_all_or_nothing_info_enqueue_is_atomic() -> None:
    h = History().enqueue(0, "info", "a", "v1", "v2").enqueue(0, "info", "a", "w1", "w2").drain("a", "v1", "v2")
    assert check_atomicity(h.lines)["valid"]


def test_moved_value_also_taken_from_its_source_is_in_both_queues() -> None:
    h = History().enqueue(0, "ok", "a", "v1").move(1, "ok", "a", "b", "v1").dequeue(2, "ok", "a", "v1")
    h.drain("a").drain("b", "v1")
    atomicity = check_atomicity(h.lines)
    assert not atomicity["valid"]
    assert atomicity["moves_in_both_queues_count"] == 1
    assert atomicity["moves_in_both_queues"][0]["value"] == "v1"
    assert check_total_queue(h.lines)["duplicated_count"] == 1


def test_committed_move_whose_value_never_reaches_the_target_is_caught() -> None:
    h = History().enqueue(0, "ok", "a", "v1").move(1, "ok", "a", "b", "v1").drain("a").drain("b")
    assert check_atomicity(h.lines)["moves_not_in_target_count"] == 1
    assert check_total_queue(h.lines)["lost"] == ["v1"]


@pytest.mark.parametrize("queue", ["a", "b"])
def test_info_move_value_may_end_in_either_queue(queue: str) -> None:
    h = History().enqueue(0, "ok", "a", "v1").move(1, "info", "a", "b", "v1").drain("a").drain("b")
    h.drain(queue, "v1")
    assert check(h.lines)["total_queue"]["valid"]
    assert check_atomicity(h.lines)["valid"]


def test_a_failed_move_whose_value_reaches_the_target_by_another_move_is_fine() -> None:
    # Seen in a soak (seed 7): a move failed with leader_changed; a later ok move carried one of
    # its values to the same target, and the other value was dequeued from the source.
    h = History().enqueue(0, "ok", "q2", "v1", "v2").move(1, "fail", "q2", "q1", "v1", "v2")
    h.move(2, "ok", "q2", "q1", "v2").dequeue(3, "ok", "q2", "v1").drain("q1", "v2").drain("q2")
    result = check(h.lines)
    assert result["total_queue"]["duplicated_count"] == 0
    assert result["atomicity"]["moves_in_both_queues_count"] == 0
    assert result["valid"]


def test_an_info_move_whose_values_a_later_ok_move_carried_is_not_a_duplicate() -> None:
    # Soak seed 2026: a move's commit was unknown (leader lost); the next leader's move took the
    # same values from the source to the same target; each value was drained from it once.
    h = History().enqueue(0, "ok", "q2", "v1", "v2").move(1, "info", "q2", "q1", "v1", "v2")
    h.move(2, "ok", "q2", "q1", "v1").move(3, "ok", "q2", "q1", "v2").drain("q1", "v1", "v2").drain("q2")
    result = check(h.lines)
    assert result["total_queue"]["duplicated_count"] == 0
    assert result["atomicity"]["moves_in_both_queues_count"] == 0
    assert result["valid"]


def test_info_move_value_in_neither_queue_is_lost() -> None:
    h = History().enqueue(0, "ok", "a", "v1").move(1, "info", "a", "b", "v1").drain("a").drain("b")
    assert check_total_queue(h.lines)["lost"] == ["v1"]


def test_info_move_value_in_both_queues_is_a_violation() -> None:
    h = History().enqueue(0, "ok", "a", "v1").move(1, "info", "a", "b", "v1")
    h.drain("a", "v1").drain("b", "v1")
    assert check_atomicity(h.lines)["moves_in_both_queues_count"] == 1
    assert check_total_queue(h.lines)["duplicated_count"] == 1


def test_aborted_dequeue_that_never_comes_back_is_invalid() -> None:
    h = History().enqueue(0, "ok", "a", "v1", "v2").abort(1, "a", "v1", "v2").dequeue(2, "ok", "a", "v2").drain("a")
    result = check_aborted_return(h.lines)
    assert not result["valid"]
    assert result["not_returned_count"] == 1 and result["not_returned"][0]["value"] == "v1"


def test_vanished_values_must_come_back_after_the_deadline() -> None:
    h = History().enqueue(0, "ok", "a", "v1").vanish(1, "a", "v1").drain("a")
    result = check_aborted_return(h.lines)
    assert not result["valid"] and result["not_returned"][0]["f"] == "vanish"


def test_a_sighting_before_the_abort_does_not_count_as_coming_back() -> None:
    h = History().enqueue(0, "ok", "a", "v1").peek(2, "a", "v1").abort(1, "a", "v1").drain("a")
    result = check_aborted_return(h.lines)
    assert not result["valid"] and result["not_returned"][0]["f"] == "dequeue-abort"


def test_returned_aborts_report_how_soon_and_how_near_the_head() -> None:
    h = History().enqueue(0, "ok", "a", "v1", "v2", "v3").abort(1, "a", "v1", head_rank=[0])
    h.dequeue(2, "ok", "a", "v2").dequeue(2, "ok", "a", "v3", "v1")
    result = check_aborted_return(h.lines)
    assert result["valid"]
    assert result["head_rank"]["max"] == 0
    # v2 left the queue between the abort and v1's return, and v1 came second in its batch.
    assert result["observed_rank"]["max"] == 2
    assert result["time_to_return_s"]["max"] == pytest.approx(0.4)


def test_divergent_digests_fail_convergence() -> None:
    h = History().checker_input("digests", {"node-0": "aaa@10", "node-1": "aaa@10", "node-2": "bbb@10"})
    result = check_convergence(h.lines)
    assert not result["valid"]
    assert result["distinct_count"] == 2 and result["groups"]["bbb@10"] == ["node-2"]


def test_same_digest_at_another_applied_index_is_divergent() -> None:
    h = History().checker_input("digests", {"node-0": "aaa@10", "node-1": "aaa@11"})
    result = check_convergence(h.lines)
    assert not result["valid"] and result["applied_index"] == {"node-0": 10, "node-1": 11}


def test_node_without_a_digest_fails_convergence() -> None:
    h = History().checker_input("digests", {"node-0": "aaa@10", "node-1": None})
    result = check_convergence(h.lines)
    assert not result["valid"] and result["missing"] == ["node-1"]


def test_convergence_without_digests_is_unchecked() -> None:
    result = check_convergence(History().enqueue(0, "ok", "a", "v").lines)
    assert result == {"valid": True, "checked": False, "nodes_count": 0}


def test_transaction_stuck_open_after_its_deadline_fails_liveness() -> None:
    h = History().checker_input("open-transactions", {"count": 2, "oldest_age_s": 95.0})
    result = check_liveness(h.lines)
    assert not result["valid"]
    assert result["stuck_transactions"]["count"] == 2
    assert check(h.lines)["invalid_checkers"] == ["liveness"]


def test_no_open_transactions_passes_liveness() -> None:
    h = History().checker_input("open-transactions", {"count": 0, "oldest_age_s": None})
    result = check_liveness(h.lines)
    assert result["valid"] and result["stuck_transactions"]["checked"]


def graceful_restart(h: History, node: str, variant: str, release: str, stop_exit: int | None) -> History:
    h.nemesis("upgrade", "start", node, node=node, variant=variant, how="graceful", to="current",
              **{"from": release}, stop_exit=stop_exit)
    return h.nemesis("upgrade", "stop", node)


def test_a_node_of_the_code_under_test_killed_after_sigterm_fails_liveness() -> None:
    h = graceful_restart(History(), "node-0", "follower", "current", 0)
    graceful_restart(h, "node-1", "leader", "current", -9)  # waited for until the harness killed it
    result = check_liveness(h.lines)
    assert not result["valid"]
    assert result["graceful_stops"] == {"count": 2, "current_code": 2, "leaders": 1,
                                        "killed": [{"node": "node-1", "variant": "leader", "exit": -9}]}
    assert check(h.lines)["invalid_checkers"] == ["liveness"]


def test_graceful_stops_that_exit_by_themselves_pass_and_a_previous_release_is_not_judged() -> None:
    h = graceful_restart(History(), "node-0", "leader", "current", 0)
    graceful_restart(h, "node-1", "leader", "rcq-0.1.0", -9)  # an older release: counted only
    result = check_liveness(h.lines)
    assert result["valid"], result["graceful_stops"]
    assert result["graceful_stops"] == {"count": 2, "current_code": 1, "leaders": 1, "killed": []}


def test_releases_say_which_release_led_and_which_losses_came_after_another_release_led() -> None:
    h = History().nemesis("downgrade", "start", "node-1", node="node-1", to="0.1.0")  # 0.1
    h.enqueue(0, "ok", "a", "v1")  # acknowledged at 0.3: lost, and node-1 leads on 0.1.0 after
    h.nemesis("upgrade", "start", "node-1", node="node-1", to="current")  # 0.4
    h.enqueue(0, "ok", "a", "v2")  # acknowledged at 0.6: lost while only the code under test led
    h.enqueue(0, "ok", "a", "v3")  # taken out below: not lost
    h.dequeue(1, "ok", "a", "v3")
    h.checker_input("leaders", [{"time_s": 0.0, "node": "node-1", "term": 1},
                                {"time_s": 0.35, "node": "node-1", "term": 1},  # on 0.1.0 since 0.1
                                {"time_s": 0.45, "node": "node-0", "term": 2}])
    result = check(h.lines)
    assert result["invalid_checkers"] == ["total_queue", "atomicity"]  # the losses stay losses
    releases = result["releases"]
    assert releases["checked"] and set(releases["led_s"]) == {"0.1.0", "current"}
    assert releases["led_s"]["0.1.0"] == pytest.approx(0.1, abs=0.06)
    assert releases["lost_after_another_release_led"] == 1 and releases["lost_after_another_release_led_sample"] == ["v1"]
    assert releases["lost_with_only_the_code_under_test_leading"] == 1
    assert "releases: led 0.1.0" in summary_text(result, 1)


def test_releases_are_not_checked_without_restarts_into_another_release() -> None:
    assert check(History().enqueue(0, "ok", "a", "v1").lines)["releases"] == {"checked": False}


def test_liveness_measures_leader_changes_and_availability_per_fault_window() -> None:
    h = History()
    h.enqueue(0, "ok", "a", "v1")  # 0.1 .. 0.2, outside any fault
    h.nemesis("partition", "start", "node-0")  # 0.3
    h.enqueue(0, "info", "a", "v2")  # 0.4
    h.enqueue(0, "fail", "a", "v3")  # 0.6
    h.enqueue(0, "ok", "a", "v4")  # 0.8
    h.nemesis("partition", "stop", "node-0")  # 1.0
    h.checker_input("leaders", [
        {"time_s": 0.0, "node": "node-0", "term": 3},
        {"time_s": 0.5, "node": "node-0", "term": 3},
        {"time_s": 0.9, "node": "node-1", "term": 4},
        {"time_s": 1.5, "node": "node-1", "term": 4},
    ])
    result = check_liveness(h.lines)
    assert result["valid"]
    (window,) = result["windows"]
    assert (window["leader_before"], window["new_leader"], window["new_term"]) == ("node-0", "node-1", 4)
    assert window["time_to_new_leader_s"] == pytest.approx(0.6)
    assert window["time_to_leader_after_stop_s"] == pytest.approx(0.5)
    assert (window["ops"], window["ok"], window["fail"], window["info"]) == (3, 1, 1, 1)
    assert window["availability"] == pytest.approx(1 / 3, abs=1e-3)
    assert result["outside_faults"]["availability"] == 1.0
    assert result["by_fault"]["partition"]["max_time_to_new_leader_s"] == pytest.approx(0.6)


def test_a_leader_change_after_a_fault_stopped_is_not_charged_to_it() -> None:
    h = History().nemesis("pause-follower", "start", "node-2")  # 0.1
    h.nemesis("pause-follower", "stop", "node-2")  # 0.2
    h.checker_input("leaders", [{"time_s": 0.0, "node": "node-0", "term": 3},
                                {"time_s": 0.15, "node": "node-0", "term": 3},
                                {"time_s": 5.0, "node": "node-1", "term": 4}])
    (window,) = check_liveness(h.lines)["windows"]
    assert window["new_leader"] is None and window["time_to_new_leader_s"] is None


def test_fault_never_stopped_runs_to_the_end_of_the_history() -> None:
    h = History().nemesis("pause", "start", "node-2").enqueue(0, "ok", "a", "v1")
    (window,) = check_liveness(h.lines)["windows"]
    assert not window["stopped"] and window["stop_s"] == pytest.approx(0.3) and window["ops"] == 1


def test_ordering_inversions_are_counted_but_never_invalid() -> None:
    h = History().enqueue(0, "ok", "a", "p1").enqueue(0, "ok", "a", "p2").enqueue(0, "ok", "a", "p3")
    h.enqueue(1, "ok", "a", "q1", "q2")
    h.dequeue(2, "ok", "a", "p3", "q1").dequeue(2, "ok", "a", "p1", "p2", "q2")
    result = check_ordering(h.lines)
    assert result["valid"]
    assert result["inversions_count"] == 2
    assert result["by_producer"] == {"0": {"values": 3, "inversions": 2}, "1": {"values": 2, "inversions": 0}}
    assert result["late_values"] == ["p1", "p2"]
    assert check(h.lines)["valid"]


def test_count_inversions_matches_brute_force() -> None:
    rng = random.Random(7)
    for length in range(12):
        ranks = [rng.randrange(6) for _ in range(length)]
        expected = sum(1 for i, j in itertools.combinations(range(length), 2) if ranks[i] > ranks[j])
        assert _count_inversions(list(ranks)) == expected


def test_history_writer_round_trips_through_the_reader(tmp_path: Path) -> None:
    path = tmp_path / "history.jsonl"
    clock = iter([100.0, 100.5, 101.0, 101.25, 102.0]).__next__
    with HistoryWriter(path, clock=clock) as writer:
        invoke = writer.invoke(0, "enqueue", {"writes": [{"queue": "a", "values": ["v1"]}]})
        writer.complete(invoke, "ok")
        writer.info("nemesis", "kill", {"phase": "start", "nodes": ["node-0"]})
        pending = writer.invoke(1, "dequeue", {"queue": "a", "max": 1})
        assert writer.open_ops() == [pending]
    history = read_history(path)
    assert [op["index"] for op in history] == [0, 1, 2, 3]
    assert [op["time_s"] for op in history] == [0.5, 1.0, 1.25, 2.0]
    assert history[1] == {"index": 1, "time_s": 1.0, "process": 0, "type": "ok", "f": "enqueue",
                          "value": {"writes": [{"queue": "a", "values": ["v1"]}]}, "error": None}
    pairs = pair_ops(history)
    assert [(p.f, p.type, p.completion is None) for p in pairs] == [("enqueue", "ok", False), ("dequeue", "info", True)]
    assert pairs[0].latency_s == pytest.approx(0.5)


def test_every_line_is_flushed_before_close(tmp_path: Path) -> None:
    path = tmp_path / "history.jsonl"
    writer = HistoryWriter(path)
    writer.info("nemesis", "kill", {"phase": "start", "nodes": []})
    assert len(read_history(path)) == 1
    writer.close()


def test_reader_drops_a_truncated_last_line(tmp_path: Path) -> None:
    path = tmp_path / "history.jsonl"
    whole = json.dumps({"index": 0, "time_s": 0.1, "process": 0, "type": "invoke", "f": "dequeue",
                        "value": {"queue": "a", "max": 1}, "error": None})
    path.write_text(whole + "\n" + '{"index": 1, "time_s": 0.2, "proc', encoding="utf-8")
    history = read_history(path)
    assert len(history) == 1 and history[0]["index"] == 0
    assert pair_ops(history)[0].type == "info"


def test_reader_refuses_a_broken_line_in_the_middle(tmp_path: Path) -> None:
    path = tmp_path / "history.jsonl"
    path.write_text('{"index": 0}\n{"ind\n{"index": 2}\n', encoding="utf-8")
    with pytest.raises(HistoryError, match="line 2"):
        read_history(path)


def test_writer_refuses_a_second_completion_and_an_overlapping_invoke(tmp_path: Path) -> None:
    with HistoryWriter(tmp_path / "history.jsonl") as writer:
        op = writer.invoke(0, "peek", {"queue": "a"})
        with pytest.raises(HistoryError, match="is open"):
            writer.invoke(0, "peek", {"queue": "a"})
        writer.complete(op, "fail", error="unavailable")
        with pytest.raises(HistoryError, match="not open"):
            writer.complete(op, "ok")
        with pytest.raises(HistoryError, match="completion type"):
            writer.complete(writer.invoke(0, "peek", None), "invoke")


def test_writer_is_safe_across_threads(tmp_path: Path) -> None:
    path = tmp_path / "history.jsonl"
    with HistoryWriter(path) as writer:

        def worker(process: int) -> None:
            for n in range(200):
                writer.complete(writer.invoke(process, "enqueue", {"writes": [{"queue": "a", "values": [f"{process}-{n}"]}]}),
                                "ok")

        threads = [threading.Thread(target=worker, args=(process,)) for process in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    history = read_history(path)
    assert [op["index"] for op in history] == list(range(8 * 2 * 200))
    times = [op["time_s"] for op in history]
    assert times == sorted(times)
    assert len(pair_ops(history)) == 8 * 200


def test_pair_ops_refuses_a_completion_without_an_invoke() -> None:
    h = History().complete(0, "ok", "dequeue", {"queue": "a", "values": []})
    with pytest.raises(HistoryError, match="matches no open invoke"):
        pair_ops(h.lines)


def test_completion_without_a_value_falls_back_to_the_invoke_value() -> None:
    h = History().invoke(0, "enqueue", {"writes": [{"queue": "a", "values": ["v1"]}]}).complete(0, "fail", "enqueue", None)
    (pair,) = pair_ops(h.lines)
    assert pair.type == "fail" and pair.value == {"writes": [{"queue": "a", "values": ["v1"]}]}


def test_check_file_and_reports_name_the_verdict_and_seed(tmp_path: Path) -> None:
    path = tmp_path / "history.jsonl"
    lost = History().enqueue(0, "ok", "a", "v1").drain("a")
    path.write_text("".join(json.dumps(line) + "\n" for line in lost.lines), encoding="utf-8")
    results = check_file(path)
    assert not results["valid"]
    text = summary_text(results, seed=1234, nodes=3)
    assert text.startswith("rcq chaos run: INVALID  (seed 1234)")
    assert "INVALID total_queue" in text and "lost 1" in text and "v1" in text
    assert "nodes=3" in text and "--seed 1234" in text
    document = json.loads(write_results(tmp_path / "results.json", results, seed=1234, nodes=3).read_text())
    assert document["valid"] is False and document["seed"] == 1234 and document["parameters"] == {"nodes": 3}
    assert document["results"]["total_queue"]["lost"] == ["v1"]

    clean = check(History().enqueue(0, "ok", "a", "v1").drain("a", "v1").lines)
    assert summary_text(clean, seed=5).startswith("rcq chaos run: VALID  (seed 5)")


def test_checker_command_rechecks_a_saved_history(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "history.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in History().enqueue(0, "ok", "a", "v1").lines))
    assert main([str(path), "--seed", "9"]) == 1
    assert "INVALID" in capsys.readouterr().out
    path.write_text("".join(json.dumps(line) + "\n" for line in History().enqueue(0, "ok", "a", "v1").drain("a", "v1").lines))
    assert main([str(path)]) == 0


def test_the_limits_checker_flags_a_read_over_the_limit_and_counts_refusals():
    from chaos.checkers.limits import check_limits
    from chaos.checkers.model import build_model

    history = [
        {"process": 1, "type": "invoke", "f": "count", "value": {"queue": "q0"}, "index": 0},
        {"process": 1, "type": "ok", "f": "count", "value": {"queue": "q0", "count": 40, "max_items": 40},
         "index": 1},
        {"process": 2, "type": "invoke", "f": "enqueue", "value": {"writes": [{"queue": "q0", "values": ["a"]}]},
         "index": 2},
        {"process": 2, "type": "fail", "f": "enqueue", "value": {"writes": [{"queue": "q0", "values": ["a"]}]},
         "error": "queue_full", "index": 3},
    ]
    result = check_limits(build_model(history))
    assert result["valid"] and result["limited_reads"] == 1 and result["queue_full_refusals"] == 1
    history.append({"process": 1, "type": "invoke", "f": "count", "value": {"queue": "q0"}, "index": 4})
    history.append({"process": 1, "type": "ok", "f": "count", "value": {"queue": "q0", "count": 41, "max_items": 40},
                    "index": 5})
    result = check_limits(build_model(history))
    assert not result["valid"] and result["over_limit"][0]["count"] == 41
