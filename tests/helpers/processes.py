"""Processes seen through /proc: whether one is alive (not gone, not a zombie), and its children.

Must not import: a test module or a conftest.
"""

from __future__ import annotations

from pathlib import Path


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
