"""bench.threads: each rcq process's and thread's share of a core over a window, from /proc samples."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from bench.threads import Process, Snapshot, figures, main, processes, thread_name


def test_figures_give_each_process_and_thread_its_share_of_a_core_and_the_rest_of_the_machine() -> None:
    found = [Process(10, "node-0", "p0"), Process(11, "node-1", "p0"), Process(12, "node-1", "p1")]
    before = Snapshot(0.0, 100.0, {10: 1.0, 11: 2.0}, {(10, 10): 0.9, (10, 99): 0.1, (11, 11): 2.0})
    after = Snapshot(2.0, 103.0, {10: 2.5, 11: 2.4, 12: 5.0},
                     {(10, 10): 2.3, (10, 99): 0.2, (11, 11): 2.4, (12, 12): 5.0})
    result = figures(found, before, after, {("p0", "node-0"): "leader", ("p0", "node-1"): "follower"}, items=1000)
    assert result["window_s"] == 2.0
    assert result["machine_busy_pct"] == 150  # 3 busy CPU-seconds in 2 s
    assert result["servers_pct"] == 95 and result["rest_pct"] == 55
    assert result["servers_us_per_item"] == 1900  # 1.9 CPU-s over 1,000 items
    leader, follower = result["processes"]  # pid 12 was born in the window: left out
    assert (leader["node"], leader["role"], leader["core_pct"], leader["us_per_item"]) == ("node-0", "leader", 75.0, 1500)
    assert leader["threads"] == [{"tid": 10, "name": "loop (main)", "core_pct": 70.0},
                                 {"tid": 99, "name": "?", "core_pct": 5.0}]
    assert (follower["role"], follower["core_pct"], follower["threads"][0]["core_pct"]) == ("follower", 20.0, 20.0)


def test_figures_without_items_or_roles_leave_the_per_item_figures_out() -> None:
    found = [Process(10, "node-0", "p0")]
    result = figures(found, Snapshot(0.0, 0.0, {10: 0.0}, {}), Snapshot(1.0, 0.5, {10: 0.25}, {}), {}, None)
    assert result["servers_us_per_item"] is None
    assert result["processes"][0]["role"] == "?" and result["processes"][0]["us_per_item"] is None


def test_a_thread_other_than_the_main_one_is_named_by_its_comm() -> None:
    assert thread_name(os.getpid(), os.getpid()) == "loop (main)"
    assert thread_name(os.getpid(), 2**22 + 54321) == "?"


def test_main_reads_this_process_over_a_short_window_and_writes_the_json(tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "threads.json"
    assert main(["--pids", str(os.getpid()), "--window-s", "0.05", "--items", "10", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert [row["pid"] for row in result["processes"]] == [os.getpid()]
    assert result["processes"][0]["node"] == "node-0" and result["processes"][0]["partition"] == "p0"
    assert "node-0/p0" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    ([], "give the node processes"),
    (["--pids", "1", "--window-s", "0"], "--window-s must be above 0"),
])
def test_main_refuses_bad_arguments_with_a_clear_error(argv: list[str], message: str,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


def test_processes_list_each_node_first_then_its_partition_processes_in_name_order(
        monkeypatch: pytest.MonkeyPatch) -> None:
    children = {100: {"p2": 102, "p1": 101}, 200: {}}
    monkeypatch.setattr("bench.threads.partition_processes", lambda pid: children[pid])
    assert processes([100, 200]) == [Process(100, "node-0", "p0"), Process(101, "node-0", "p1"),
                                     Process(102, "node-0", "p2"), Process(200, "node-1", "p0")]
