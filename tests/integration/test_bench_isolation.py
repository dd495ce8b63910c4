"""``python -m bench.isolation`` for real, with windows of a few seconds: its own cluster with p1 ... p3,
p1's leader process frozen and thawed, every window's figures in the JSON report and the printed table,
and the frozen process gone with its cluster afterwards.

Must not import: a test module.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.isolation import PARTITIONS, WINDOWS, main
from rcq.local.processes import process_alive
from rcq.testing import wait_until
from tests.helpers import QUIET_CLUSTER_WAIT_S

pytestmark = pytest.mark.cluster


def test_bench_isolation_freezes_p1s_leader_and_reports_every_partitions_windows(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report_path = tmp_path / "isolation.json"
    assert main(["--writers", "1", "--warmup-s", "0.5", "--before-s", "2", "--freeze-s", "2", "--after-s", "2",
                 "--request-timeout-s", "5", "--json", str(report_path)]) == 0

    report = json.loads(report_path.read_text())
    assert list(report["partitions"]) == list(PARTITIONS)
    assert all(list(windows) == list(WINDOWS) for windows in report["partitions"].values())
    for partition in ("p2", "p3"):  # not frozen: they commit in every window
        assert all(report["partitions"][partition][w]["commits"] > 0 for w in WINDOWS), report["partitions"]
    assert report["partitions"]["p1"]["before"]["commits"] > 0
    frozen = report["frozen"]
    assert frozen["partition"] == "p1" and frozen["node"] in report["leaders"].values()
    frozen_cpu = report["cpu"]["seconds"][f"{frozen['node']}/p1 (frozen)"]
    assert frozen_cpu["during"] < 0.1, frozen_cpu  # stopped: it ran (almost) nothing in the window
    assert report["conclusion"]["partitions"] == ["p2", "p3"]
    assert report["conclusion"]["p99_during_over_before"] is not None

    out = capsys.readouterr().out
    assert "p1 (frozen)" in out and "servers µs/commit" in out and "conclusion:" in out
    # the bench's cluster is closed: the process it froze and thawed is gone with it
    wait_until(lambda: not process_alive(frozen["pid"]), QUIET_CLUSTER_WAIT_S, what="the frozen process gone")
