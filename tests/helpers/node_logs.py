"""No ERROR line and no traceback in a cluster's node logs but those the test declares it causes.

A traceback in a production log is a bug, or a fault the test made on purpose. So every node log
of a real cluster the suite starts is watched: :func:`watch_local_clusters` (installed for the
whole run by ``tests/conftest.py``) registers each node log of a
:class:`~rcq.local.cluster.LocalCluster` (and so of a chaos cluster) when the node starts, with
the logs of its partition processes (``<data_dir>/partitions/*.log``, docs/partitions.md), and
reads the rest of it when the cluster is closed, before its directory is removed; other clusters
of separate processes register their logs with :meth:`NodeLogs.watch` and :meth:`NodeLogs.release`.
After each test the conftest takes what the logs gained during it (its setup and teardown
included, so a module's shared cluster counts for the test that was running) and fails the test
with every error entry that none of its declared patterns matches:

    @pytest.mark.expected_log_errors(r"ConnectionResetError", r"failed to reach node-\\d")

(on a test, a class, or a module's ``pytestmark``; each pattern is a regular expression searched
in the entry: its first line and the traceback under it). A test that kills, cuts or floods names
the errors it causes; an error that no test should cause is a bug to fix, never a pattern.

An entry is one log record with the lines that follow it (a traceback, a multi-line message);
it is an error when its level is ERROR or CRITICAL, or when it holds a traceback (a warning with
``exc_info``, an exception printed to stderr). Records are recognised by their leading timestamp
(``logging``'s default ``asctime``) and a level among their first three fields, which fits the
nodes' format (``rcq serve``: time, level, logger) and the replicator tests' (time, thread,
logger, level).

A test that fails also gets the tail of every node log of each cluster it used
(:func:`add_log_tails`, called by the same report hook), beside its own failure.

Must not import: a test module or a conftest; rcq.server (nodes are separate processes).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pytest

from rcq.local.cluster import LocalCluster
from rcq.local.processes import PARTITIONS_DIR

MARKER = "expected_log_errors"
RECORD = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (?:\S+ ){0,3}?(DEBUG|INFO|WARNING|ERROR|CRITICAL)\b")
ERROR_LEVELS = frozenset({"ERROR", "CRITICAL"})
TRACEBACK = "Traceback (most recent call last):"
SHOWN_HEAD_LINES = 10  # of a long entry in a failure report: its first lines, and its last ones
SHOWN_TAIL_LINES = 30  # (where a traceback says what was raised)
SHOWN_ENTRIES_MAX = 20


@dataclasses.dataclass(frozen=True)
class LogError:
    """An error entry of a node log: the record's lines, and the log it is in."""

    log_path: Path
    text: str

    def describe(self) -> str:
        lines = self.text.splitlines()
        if len(lines) > SHOWN_HEAD_LINES + SHOWN_TAIL_LINES:
            left_out = len(lines) - SHOWN_HEAD_LINES - SHOWN_TAIL_LINES
            lines = [*lines[:SHOWN_HEAD_LINES], f"... ({left_out} lines)", *lines[-SHOWN_TAIL_LINES:]]
        return f"{self.log_path}:\n" + "\n".join("    " + line for line in lines)


def error_entries(text: str) -> list[str]:
    """The error entries in a piece of node log (see the module docstring), in order."""
    entries: list[tuple[str | None, list[str]]] = []  # (level or None, lines)
    for line in text.splitlines():
        record = RECORD.match(line)
        if record is not None or not entries:
            entries.append((record[1] if record is not None else None, [line]))
        else:
            entries[-1][1].append(line)
    return ["\n".join(lines) for level, lines in entries
            if level in ERROR_LEVELS or any(line.startswith(TRACEBACK) for line in lines)]


class NodeLogs:
    """The node logs being watched, each read from where the last read stopped."""

    def __init__(self) -> None:
        self._offsets: dict[Path, int] = {}  # a watched log -> the bytes of it already read
        self._released: list[LogError] = []  # read from logs no longer watched, not yet taken
        self._folders: dict[Path, Path] = {}  # a watched log -> the folder of its node's partition logs

    def watch(self, path: Path, partition_logs: Path | None = None) -> None:
        """Watch the log ``path`` from its present end (nothing it holds now is read), and with it
        every ``*.log`` of ``partition_logs`` (a node's partition processes, docs/partitions.md):
        those there now from their present end, those that appear later from their start."""
        if path not in self._offsets:
            self._offsets[path] = path.stat().st_size if path.exists() else 0
        if partition_logs is not None:
            self._folders[path] = partition_logs
            for log in sorted(partition_logs.glob("*.log")):
                self.watch(log)

    def release(self, paths: Iterable[Path]) -> None:
        """Read the rest of these logs now (they are about to go) and stop watching them."""
        for path in paths:
            folder = self._folders.pop(path, None)
            partition_logs = sorted(folder.glob("*.log")) if folder is not None else []
            for log in [path, *partition_logs]:
                if log not in self._offsets and log in partition_logs:
                    self._offsets[log] = 0  # appeared since the last take
                if log in self._offsets:
                    self._released += self._read(log)
                    del self._offsets[log]

    def take(self) -> list[LogError]:
        """The error entries the logs gained since the last take."""
        taken = self._released
        self._released = []
        for folder in list(self._folders.values()):
            for log in sorted(folder.glob("*.log")):
                self._offsets.setdefault(log, 0)  # appeared since the last take: all of it is new
        for path in list(self._offsets):
            taken += self._read(path)
        return taken

    def _read(self, path: Path) -> list[LogError]:
        try:
            with open(path, "rb") as log_file:
                log_file.seek(self._offsets[path])
                data = log_file.read()
        except FileNotFoundError:  # gone with its cluster's directory
            return []
        complete = data[: data.rfind(b"\n") + 1]  # a line still being written is read next time
        self._offsets[path] += len(complete)
        return [LogError(path, entry) for entry in error_entries(complete.decode("utf-8", errors="replace"))]


NODE_LOGS = NodeLogs()


def watch_local_clusters(monkeypatch: pytest.MonkeyPatch, logs: NodeLogs = NODE_LOGS) -> None:
    """Watch the node logs of every LocalCluster: from each node's start (before it writes a line),
    to the close of its cluster (after its nodes stopped, before its directory is removed)."""
    start_node = LocalCluster.start_node
    remove_owned_dir = LocalCluster._remove_owned_dir

    def watched_start_node(self: LocalCluster, i: int, *args: Any, **kwargs: Any) -> int:
        logs.watch(self.nodes[i].log_path, self.nodes[i].data_dir / PARTITIONS_DIR)
        return start_node(self, i, *args, **kwargs)

    def releasing_remove_owned_dir(self: LocalCluster) -> None:
        logs.release(node.log_path for node in getattr(self, "nodes", ()))
        remove_owned_dir(self)

    monkeypatch.setattr(LocalCluster, "start_node", watched_start_node)
    monkeypatch.setattr(LocalCluster, "_remove_owned_dir", releasing_remove_owned_dir)


def add_log_tails(item: pytest.Item, report: pytest.TestReport) -> None:
    """For a failed test's report: the tail of every node log of each LocalCluster among the
    fixture values of ``item`` (one section per cluster)."""
    if not report.failed:
        return
    clusters = {id(v): v for v in getattr(item, "funcargs", {}).values() if isinstance(v, LocalCluster)}
    for cluster in clusters.values():
        report.sections.append((f"rcq node logs ({cluster.base_dir}, {report.when})", cluster.dump_logs()))


def expected_patterns(item: pytest.Item) -> list[re.Pattern[str]]:
    """The patterns of every ``expected_log_errors`` marker of ``item`` (its own, its class's, its module's)."""
    return [re.compile(pattern) for marker in item.iter_markers(MARKER) for pattern in marker.args]


def unexpected(errors: Sequence[LogError], patterns: Sequence[re.Pattern[str]]) -> list[LogError]:
    """The errors no pattern matches."""
    return [error for error in errors if not any(pattern.search(error.text) for pattern in patterns)]


def report(errors: Sequence[LogError]) -> str:
    """The failure message for ``errors``."""
    shown = "\n".join(error.describe() for error in errors[:SHOWN_ENTRIES_MAX])
    more = f"\n... and {len(errors) - SHOWN_ENTRIES_MAX} more" if len(errors) > SHOWN_ENTRIES_MAX else ""
    return (f"{len(errors)} error(s) in node logs that the test did not declare it causes "
            f"(@pytest.mark.{MARKER}(pattern, ...) names those it does):\n{shown}{more}")
