"""The processes of this machine as ``/proc`` shows them (Linux): each one's parent, start time
and state, its command line, its descendants, and whether it still lives (a reused pid told
apart by its start time). For bench.spark_standalone, which finds and kills the executor JVMs of
its cluster and what they forked.

Must not import: rcq, pyspark.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path


@dataclasses.dataclass(frozen=True)
class Process:
    """A process as /proc shows it; ``started`` (clock ticks after boot) tells a reused pid apart."""

    pid: int
    ppid: int
    started: int
    state: str


def read_process(pid: int) -> Process | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # "pid (comm) state ppid ... starttime ...": comm may hold spaces and parentheses.
    fields = stat[stat.rindex(")") + 2:].split()
    return Process(pid, int(fields[1]), int(fields[19]), fields[0])


def processes() -> dict[int, Process]:
    table = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            process = read_process(int(entry.name))
            if process is not None:
                table[process.pid] = process
    return table


def descendants(root: int, table: dict[int, Process]) -> list[Process]:
    children: dict[int, list[Process]] = {}
    for process in table.values():
        children.setdefault(process.ppid, []).append(process)
    found: list[Process] = []
    pending = [root]
    while pending:
        for child in children.get(pending.pop(), []):
            found.append(child)
            pending.append(child.pid)
    return found


def cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode("utf-8", "replace").split("\0")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return []


def alive(process: Process) -> bool:
    """The same process (not a reuse of its pid) still exists and is not a zombie."""
    now = read_process(process.pid)
    return now is not None and now.started == process.started and now.state != "Z"
