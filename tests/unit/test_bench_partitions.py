"""bench.partitions' figures from /proc samples: CPU per commit and the busiest thread."""

from __future__ import annotations

from bench.partitions import Sample, usage


def test_usage_sums_the_processes_and_names_the_busiest_thread_and_its_process() -> None:
    pids = {10: "node-0/p0", 11: "node-1/p1"}
    before = Sample(0.0, {10: 1.0, 11: 2.0}, {(10, 1): 0.5, (10, 2): 0.5, (11, 3): 2.0}, 5.0)
    after = Sample(2.0, {10: 1.6, 11: 3.0}, {(10, 1): 0.9, (10, 2): 0.7, (11, 3): 2.8, (11, 4): 9.0}, 5.2)
    figures = usage(before, after, pids, commits=1000)
    assert figures == {"commits_per_s": 500, "servers_us_per_commit": 1600, "bench_us_per_commit": 200,
                       "servers_busy_pct": 80, "busiest_thread_pct": 40, "busiest_thread_us_per_commit": 800,
                       "busiest_thread_in": "node-1/p1"}  # a thread born in the window (tid 4) is left out

