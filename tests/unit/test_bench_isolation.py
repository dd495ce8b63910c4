"""``python -m bench.isolation``'s pure parts: percentiles, commits sorted into windows by when they
were answered, the conclusion's ratios, CPU per window, and its command line."""

from __future__ import annotations

import pytest

from bench.isolation import Record, conclusion, cpu_windows, figures, parse_args, percentile, timeline, window_of

BOUNDS = {"before": (0.0, 10.0), "during": (10.0, 16.0), "after": (16.0, 26.0)}


def test_percentile_is_the_nearest_rank_and_none_of_nothing() -> None:
    ordered = [float(ms) for ms in range(1, 101)]
    assert percentile(ordered, 0.50) == 50.0
    assert percentile(ordered, 0.99) == 99.0
    assert percentile(ordered, 1.0) == 100.0
    assert percentile([7.0], 0.99) == 7.0
    assert percentile([], 0.5) is None


def test_a_moment_belongs_to_the_window_it_starts_and_to_none_outside() -> None:
    assert window_of(0.0, BOUNDS) == "before"
    assert window_of(10.0, BOUNDS) == "during"
    assert window_of(15.999, BOUNDS) == "during"
    assert window_of(26.0, BOUNDS) is None
    assert window_of(-0.1, BOUNDS) is None


def test_figures_count_each_commit_and_failure_in_the_window_it_was_answered() -> None:
    record = Record(commits=[("p1", 1.0, 5.0), ("p1", 2.0, 7.0), ("p1", 17.0, 5900.0),  # stuck until the thaw
                             ("p2", 12.0, 4.0), ("p2", 30.0, 1.0)],  # after the last window: left out
                    failures=[("p1", 11.0, "CommitOutcomeUnknown"), ("p1", 12.0, "CommitOutcomeUnknown"),
                              ("p1", 13.0, "Unavailable")])
    table = figures(record, BOUNDS)
    assert table["p1"]["before"] == {"commits": 2, "commits_per_s": 0, "p50_ms": 5.0, "p99_ms": 7.0, "max_ms": 7.0,
                                     "failed": 0, "failures": {}}
    assert table["p1"]["during"]["commits"] == 0 and table["p1"]["during"]["p99_ms"] is None
    assert table["p1"]["during"]["failures"] == {"CommitOutcomeUnknown": 2, "Unavailable": 1}
    assert table["p1"]["during"]["failed"] == 3
    assert table["p1"]["after"]["max_ms"] == 5900.0
    assert table["p2"]["during"]["commits"] == 1 and table["p2"]["after"]["commits"] == 0
    assert table["p3"]["before"]["commits"] == 0


def test_the_conclusion_pools_the_partitions_not_frozen_and_leaves_the_frozen_one_out() -> None:
    before = [(p, 1.0 + i / 100, 10.0) for i in range(100) for p in ("p2", "p3")]
    during = [("p2", 11.0 + i / 100, 12.0) for i in range(50)] + [("p3", 11.0 + i / 100, 15.0) for i in range(50)]
    frozen = [("p1", 12.0, 6000.0)]
    found = conclusion(Record(commits=before + during + frozen), BOUNDS)
    assert found["partitions"] == ["p2", "p3"]
    assert found["p99_before_ms"] == 10.0 and found["p99_during_ms"] == 15.0
    assert found["p99_during_over_before"] == 1.5
    assert found["p99_during_over_before_each"] == {"p2": 1.2, "p3": 1.5}
    # 200 commits in 10 s before, 100 in 6 s during
    assert found["commits_per_s_during_over_before"] == round(17 / 20, 2)


def test_the_conclusion_has_no_ratio_without_commits_before() -> None:
    found = conclusion(Record(commits=[("p2", 11.0, 3.0)]), BOUNDS)
    assert found["p99_during_over_before"] is None and found["p99_before_ms"] is None


def test_cpu_per_window_sums_the_servers_without_the_bench_and_divides_by_the_window_commits() -> None:
    names = {10: "node-0/p0", 11: "node-1/p1 (frozen)", 99: "bench"}
    samples = [{10: 1.0, 11: 2.0, 99: 5.0}, {10: 1.5, 11: 3.0, 99: 5.5}, {10: 2.0, 11: 3.0, 99: 6.0},
               {10: 2.5, 11: 3.5}]  # the bench's last sample missing: its window left out
    cpu = cpu_windows(samples, names, {"before": 1000, "during": 500, "after": 0})
    assert cpu["seconds"]["node-1/p1 (frozen)"] == {"before": 1.0, "during": 0.0, "after": 0.5}
    assert cpu["seconds"]["bench"] == {"before": 0.5, "during": 0.5}
    assert cpu["servers_s"] == {"before": 1.5, "during": 0.5, "after": 1.0}
    assert cpu["servers_us_per_commit"] == {"before": 1500, "during": 1000, "after": None}


def test_the_timeline_has_a_slot_per_second_of_each_partition() -> None:
    record = Record(commits=[("p1", 0.5, 4.0), ("p1", 0.7, 9.0), ("p2", 2.2, 3.0)])
    found = timeline(record, 0.0, 3.0, ["p1", "p2"])
    assert [slot["commits"] for slot in found["p1"]] == [2, 0, 0]
    assert found["p1"][0]["max_ms"] == 9.0 and found["p1"][1]["p99_ms"] is None
    assert found["p2"][2] == {"second": 2, "commits": 1, "p99_ms": 3.0, "max_ms": 3.0}


def test_the_default_run_is_bounded_under_a_minute_and_a_half() -> None:
    args = parse_args([])
    assert (args.writers, args.freeze_s) == (4, 6.0)
    assert args.warmup_s + args.before_s + args.freeze_s + args.after_s < 60  # and about 20 s of setup and teardown
    assert args.json is None


@pytest.mark.parametrize("argv", [["--writers", "0"], ["--freeze-s", "0"], ["--before-s", "-1"], ["--warmup-s", "-1"],
                                  ["--request-timeout-s", "0"]])
def test_the_command_line_refuses_empty_windows_and_no_writers(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        parse_args(argv)
    assert exited.value.code == 2
