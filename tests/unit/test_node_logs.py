"""The node-log check of the suite (tests/helpers/node_logs.py), tested: it finds every ERROR line
and traceback, nothing else, reads each log once, and keeps what a closed cluster logged."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from rcq.local.cluster import LocalCluster
from tests.helpers.node_logs import LogError, NodeLogs, error_entries, report, unexpected, watch_local_clusters

RCQ_LOG = """\
===== 2025-01-01T10:00:00 start #1 of node-0 =====
2025-01-01 10:00:00,001 INFO rcq.server.node: serving on http://127.0.0.1:7000
2025-01-01 10:00:01,002 WARNING rcq.server.raft: a slow tick; ERROR is only a word here
2025-01-01 10:00:02,003 ERROR pysyncobj.syncobj: failed _onTick
Traceback (most recent call last):
  File "syncobj.py", line 1, in _onTick
_pickle.UnpicklingError: pickle data was truncated
2025-01-01 10:00:03,004 INFO rcq.server.node: still serving
2025-01-01 10:00:04,005 WARNING aiohttp.server: a handler failed
Traceback (most recent call last):
ConnectionResetError: [Errno 104] Connection reset by peer
2025-01-01 10:00:05,006 CRITICAL rcq.server.node: out of disk
"""


def test_error_entries_are_error_records_and_records_with_a_traceback_each_with_its_lines() -> None:
    entries = error_entries(RCQ_LOG)
    assert [entry.splitlines()[0][24:] for entry in entries] == [
        "ERROR pysyncobj.syncobj: failed _onTick",
        "WARNING aiohttp.server: a handler failed",
        "CRITICAL rcq.server.node: out of disk",
    ]
    assert entries[0].splitlines()[-1] == "_pickle.UnpicklingError: pickle data was truncated"
    assert entries[1].splitlines()[-1].startswith("ConnectionResetError")


def test_the_level_is_found_among_the_first_fields_whatever_the_format() -> None:
    replicator_format = ("2025-01-01 10:00:00,001 MainThread test-node INFO n0 started\n"
                         "2025-01-01 10:00:00,002 Thread-3 (tick) pysyncobj.syncobj ERROR failed _onTick\n"
                         "2025-01-01 10:00:00,003 MainThread rcq.server INFO a message saying ERROR\n")
    assert error_entries(replicator_format) == [
        "2025-01-01 10:00:00,002 Thread-3 (tick) pysyncobj.syncobj ERROR failed _onTick"]


def test_a_traceback_printed_without_a_record_is_an_error() -> None:
    printed = "Exception in thread Thread-1:\nTraceback (most recent call last):\nValueError: boom\n"
    assert error_entries(printed) == [printed.rstrip("\n")]
    assert error_entries("plain output\n2025-01-01 10:00:00,001 INFO x: fine\n") == []


def test_each_log_is_read_from_where_the_last_read_stopped_and_a_partial_line_waits(tmp_path: Path) -> None:
    log = tmp_path / "node.log"
    log.write_text("2025-01-01 10:00:00,001 ERROR old: before the watch\n")
    logs = NodeLogs()
    logs.watch(log)
    assert logs.take() == []
    with open(log, "a") as out:
        out.write("2025-01-01 10:00:01,001 ERROR new: one\n2025-01-01 10:00:02,001 ERR")
    assert [e.text for e in logs.take()] == ["2025-01-01 10:00:01,001 ERROR new: one"]
    with open(log, "a") as out:
        out.write("OR new: two\n")
    assert [e.text for e in logs.take()] == ["2025-01-01 10:00:02,001 ERROR new: two"]
    assert logs.take() == []


def test_a_released_log_is_read_at_once_and_taken_later_though_it_is_gone(tmp_path: Path) -> None:
    log = tmp_path / "node.log"
    logs = NodeLogs()
    logs.watch(log)  # before the node wrote anything: the log does not exist yet
    log.write_text("2025-01-01 10:00:00,001 ERROR x: at shutdown\n")
    logs.release([log])
    log.unlink()
    assert logs.take() == [LogError(log, "2025-01-01 10:00:00,001 ERROR x: at shutdown")]
    assert logs.take() == []


def test_a_nodes_partition_logs_are_watched_with_it_those_that_appear_later_from_their_start(tmp_path: Path) -> None:
    log, folder = tmp_path / "node.log", tmp_path / "partitions"
    folder.mkdir()
    (folder / "p1.log").write_text("2025-01-01 10:00:00,001 ERROR old: before the node started\n")
    logs = NodeLogs()
    logs.watch(log, folder)
    assert logs.take() == []
    with open(folder / "p1.log", "a") as out:
        out.write("2025-01-01 10:00:01,001 ERROR p1: since\n")
    (folder / "p2.log").write_text("2025-01-01 10:00:02,001 ERROR p2: a process started later\n")
    assert sorted(e.text for e in logs.take()) == ["2025-01-01 10:00:01,001 ERROR p1: since",
                                                   "2025-01-01 10:00:02,001 ERROR p2: a process started later"]
    (folder / "p3.log").write_text("2025-01-01 10:00:03,001 ERROR p3: just before the close\n")
    logs.release([log])
    assert [e.text for e in logs.take()] == ["2025-01-01 10:00:03,001 ERROR p3: just before the close"]


def test_every_local_cluster_is_watched_from_a_nodes_start_to_the_clusters_close(tmp_path: Path) -> None:
    logs = NodeLogs()

    def start_node(self: LocalCluster, i: int, *args: Any, **kwargs: Any) -> int:
        with open(self.nodes[i].log_path, "a") as out:
            out.write(f"2025-01-01 10:00:00,001 ERROR node-{i}: started badly\n")
        return 1234

    def remove_owned_dir(self: LocalCluster) -> None:
        for node in self.nodes:
            node.log_path.unlink()

    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setattr(LocalCluster, "start_node", start_node)
        monkeypatch.setattr(LocalCluster, "_remove_owned_dir", remove_owned_dir)
        watch_local_clusters(monkeypatch, logs)
        cluster = LocalCluster.__new__(LocalCluster)
        cluster.nodes = [SimpleNamespace(log_path=tmp_path / f"node-{i}.log", data_dir=tmp_path / f"data-{i}")  # type: ignore[misc]
                         for i in range(2)]
        (tmp_path / "node-1.log").write_text("2025-01-01 10:00:00,000 ERROR node-1: a previous run\n")
        cluster.start_node(0)
        cluster.start_node(1)
        assert [e.text[24:] for e in logs.take()] == ["ERROR node-0: started badly", "ERROR node-1: started badly"]
        cluster.start_node(1)  # a restart appends to the same log
        cluster._remove_owned_dir()
        assert not any(tmp_path.iterdir())
        assert [e.log_path.name for e in logs.take()] == ["node-1.log"]


def test_only_errors_that_no_declared_pattern_matches_fail_a_test(tmp_path: Path) -> None:
    errors = [LogError(tmp_path / "node.log", entry) for entry in error_entries(RCQ_LOG)]
    patterns = [re.compile(r"ConnectionResetError"), re.compile(r"out of disk")]
    assert unexpected(errors, patterns) == errors[:1]
    assert unexpected(errors, []) == errors
    message = report(errors[:1])
    assert message.startswith("1 error(s) in node logs that the test did not declare")
    assert "pickle data was truncated" in message and str(tmp_path / "node.log") in message
