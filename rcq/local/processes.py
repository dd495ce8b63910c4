"""Processes seen through /proc: whether one is alive (not gone, not a zombie), its children, and
a node's partition processes (docs/partitions.md).

Must not import: rcq.server (the harness sees nodes from outside).
"""

from __future__ import annotations

from pathlib import Path

PARTITIONS_DIR = "partitions"  # <data_dir>/partitions/<name>.json: a partition process's config


def process_alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, exited but not reaped, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def children_of(pid: int) -> list[int]:
    """The children of every thread of ``pid`` (empty when it is gone)."""
    found: list[int] = []
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except FileNotFoundError:
        return found
    for task in tasks:
        try:
            found += [int(p) for p in (task / "children").read_text().split()]
        except FileNotFoundError:
            continue
    return found


def partition_of_process(pid: int) -> str | None:
    """The partition a process serves, from its command line (``rcq serve --config
    <data_dir>/partitions/<name>.json``); None for any other process, or one that is gone."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except FileNotFoundError:
        return None
    if b"--config" not in argv:
        return None
    position = argv.index(b"--config") + 1
    if position >= len(argv):
        return None
    config = Path(argv[position].decode(errors="replace"))
    return config.stem if config.parent.name == PARTITIONS_DIR and config.suffix == ".json" else None


def partition_processes(node_pid: int) -> dict[str, int]:
    """The partition processes a node's process runs now: partition name -> pid (alive ones)."""
    found: dict[str, int] = {}
    for child in children_of(node_pid):
        name = partition_of_process(child)
        if name is not None and process_alive(child):
            found[name] = child
    return found
