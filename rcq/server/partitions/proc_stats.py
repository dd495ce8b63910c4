"""CPU time and resident memory of a process, read from Linux's ``/proc`` (the partition
processes' figures on ``/v1/cluster``, ``/metrics`` and the status page, read by their node:
they are there even while a process does not answer).

Must not import: asyncio, aiohttp, pysyncobj, lmdb.
"""

from __future__ import annotations

import os
from pathlib import Path

PROC = Path("/proc")
_TICKS_S = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def usage(pid: int, proc: Path = PROC) -> tuple[float, int] | None:
    """(CPU seconds, user and system, since it started; resident bytes) of ``pid``, None when it is
    gone or this is not Linux."""
    try:
        stat = (proc / str(pid) / "stat").read_text()
        statm = (proc / str(pid) / "statm").read_text()
    except OSError:
        return None
    # the command may hold spaces and parentheses: the fields start after its last ")"
    fields = stat[stat.rindex(")") + 2:].split()
    try:
        cpu_s = (int(fields[11]) + int(fields[12])) / _TICKS_S  # utime, stime (fields 14, 15)
        rss = int(statm.split()[1]) * _PAGE_BYTES
    except (IndexError, ValueError):
        return None
    return cpu_s, rss
