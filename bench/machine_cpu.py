"""CPU of the whole machine and of rcq's server processes around one measured block, from /proc.

``python -m bench.spark`` runs Spark, its Python workers and the rcq cluster on the same cores:
rows/s alone cannot say whether a query was bounded by the machine or by waiting. Around each
query :func:`measured` reads the machine's busy time (``/proc/stat``: every CPU's user, nice,
system, irq, softirq and steal jiffies) and the servers' (``/proc/PID/stat`` of each node and
partition process), so the print says how busy the machine was and who spent it.

Must not import: pysyncobj, lmdb, rcq.server.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from bench.cpu import CLOCK_TICKS_PER_S, PROC, cpu_seconds

_BUSY_FIELDS = (0, 1, 2, 5, 6, 7)  # user nice system (idle iowait) irq softirq steal


def machine_busy_s(proc: Path = PROC) -> float:
    """CPU seconds every core of the machine has been busy since boot."""
    fields = (proc / "stat").read_text().splitlines()[0].split()[1:]
    return sum(int(fields[i]) for i in _BUSY_FIELDS) / CLOCK_TICKS_PER_S


def servers_cpu_s(pids: Iterable[int], proc: Path = PROC) -> float:
    total = 0.0
    for pid in pids:
        with contextlib.suppress(OSError, IndexError, ValueError):
            total += cpu_seconds(pid, proc)
    return total


@dataclass
class Window:
    wall_s: float = 0.0
    machine_cpu_s: float = 0.0  # every process of the machine
    servers_cpu_s: float = 0.0  # rcq's node and partition processes

    @property
    def rest_cpu_s(self) -> float:
        """Spark's JVMs, its Python workers, the bench: everything but rcq's servers."""
        return max(0.0, self.machine_cpu_s - self.servers_cpu_s)

    def line(self, rows: int) -> str:
        cores = os.cpu_count() or 1
        busy = self.machine_cpu_s / max(self.wall_s, 1e-9) / cores
        return (f"machine {busy:.0%} busy of {cores} cores; rcq servers {self.servers_cpu_s:.1f} CPU-s "
                f"({self.servers_cpu_s * 1e6 / max(rows, 1):.0f} µs a row), the rest {self.rest_cpu_s:.1f} CPU-s "
                f"({self.rest_cpu_s * 1e6 / max(rows, 1):.0f} µs a row) in {self.wall_s:.1f} s")


@contextlib.contextmanager
def measured(server_pids: Callable[[], list[int]]) -> Iterator[Window]:
    """The block's wall time, the machine's CPU and the servers' (PIDs asked before and after: a
    restarted process's own time is lost, not counted twice)."""
    window = Window()
    pids = server_pids()
    started, machine, servers = time.perf_counter(), machine_busy_s(), servers_cpu_s(pids)
    yield window
    window.wall_s = time.perf_counter() - started
    window.machine_cpu_s = machine_busy_s() - machine
    window.servers_cpu_s = servers_cpu_s(pids) - servers
