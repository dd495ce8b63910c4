"""``python -m bench --cpu``: CPU per transaction by process, and commits per Raft entry.

Around each scenario's measured window (its callers running; not the prefill, not the clients'
set-up), :class:`CpuWatch` reads utime + stime from ``/proc/PID/stat`` of every node and of the
bench process itself, and divides what each spent by the transactions the bench counted: the
leader, each follower by node id, and the client (the bench). On two shared cores this is
steadier than throughput, and it says where the cost is. From the leader's ``/metrics`` (an
admin route) it also reads ``rcq_group_commit_units`` before and after: its sum over its count
in the window is how many commits shared one Raft entry.

A node's PID comes from the local cluster the bench started, from ``--cpu-pids`` (in
``--urls`` order), or, for a node on this machine, from the process listening on its port
(``/proc/net/tcp*`` and the sockets in ``/proc/PID/fd``; only processes of the same user can
be seen). A node whose PID is unknown is left out. Children a node forks (a snapshot's digest)
are not counted until it has waited for them.

Must not import: pysyncobj, lmdb, rcq.server (the bench talks to rcq as a user does).
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from bench.scenarios import Target

PROC = Path("/proc")
CLOCK_TICKS_PER_S = os.sysconf("SC_CLK_TCK")
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1", "0.0.0.0"})
TCP_LISTEN = "0A"
STATUS_TIMEOUT_S = 5.0
CLIENT = "client"
_UNITS_SAMPLE = re.compile(r"^rcq_group_commit_units_(sum|count) (\S+)$", re.M)


# ------------------------------------------------------------------ /proc
def parse_stat(text: str) -> float:
    """CPU seconds (utime + stime) of a ``/proc/PID/stat`` line. The command name (field 2) is in
    parentheses and may hold spaces and parentheses itself: fields are counted after the last ')'."""
    fields = text.rsplit(")", 1)[1].split()
    # fields[0] is field 3 (state); utime and stime are fields 14 and 15 (proc(5)).
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS_PER_S


def cpu_seconds(pid: int, proc: Path = PROC) -> float:
    """CPU seconds a process has used, all its threads, from ``/proc/PID/stat``."""
    return parse_stat((proc / str(pid) / "stat").read_text())


def thread_seconds(pid: int) -> dict[int, float]:
    """CPU seconds of each thread of ``pid`` (gone threads and processes left out)."""
    seconds: dict[int, float] = {}
    try:
        tasks = list((PROC / str(pid) / "task").iterdir())
    except FileNotFoundError:
        return seconds
    for task in tasks:
        try:
            seconds[int(task.name)] = parse_stat((task / "stat").read_text())
        except FileNotFoundError:
            continue
    return seconds


def process_and_thread_seconds(pids: Iterable[int]) -> tuple[dict[int, float], dict[tuple[int, int], float]]:
    """CPU seconds of each of ``pids`` and of each of its threads, (pid, tid) -> seconds; a process
    that is gone (its ``/proc`` entry unreadable) is left out of both."""
    processes: dict[int, float] = {}
    threads: dict[tuple[int, int], float] = {}
    for pid in pids:
        try:
            processes[pid] = cpu_seconds(pid)
        except OSError:
            continue
        threads.update({(pid, tid): s for tid, s in thread_seconds(pid).items()})
    return processes, threads


def listening_inodes(port: int, proc: Path = PROC) -> set[str]:
    """Socket inodes listening on TCP ``port`` (any address, IPv4 or IPv6)."""
    inodes = set()
    for table in ("net/tcp", "net/tcp6"):
        with contextlib.suppress(OSError):
            for line in (proc / table).read_text().splitlines()[1:]:
                fields = line.split()
                if len(fields) > 9 and fields[3] == TCP_LISTEN and int(fields[1].rsplit(":", 1)[1], 16) == port:
                    inodes.add(fields[9])
    return inodes


def pid_listening_on(port: int, proc: Path = PROC) -> int | None:
    """The process listening on TCP ``port`` on this machine, if it can be seen (same user)."""
    wanted = {f"socket:[{inode}]" for inode in listening_inodes(port, proc)}
    if not wanted:
        return None
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            for descriptor in (entry / "fd").iterdir():
                with contextlib.suppress(OSError):
                    if os.readlink(descriptor) in wanted:
                        return int(entry.name)
    return None


def local_pids(urls: list[str], proc: Path = PROC) -> dict[str, int]:
    """URL -> PID of the nodes among ``urls`` that listen on this machine and can be seen."""
    found = {}
    for url in urls:
        parts = urlsplit(url)
        if parts.hostname in LOOPBACK_HOSTS:
            pid = pid_listening_on(parts.port or (443 if parts.scheme == "https" else 80), proc)
            if pid is not None:
                found[url] = pid
    return found


# ------------------------------------------------------------------ one window
def units_per_entry(metrics_text: str) -> tuple[float, float] | None:
    """``rcq_group_commit_units`` (sum, count) from a ``/metrics`` page; None if absent."""
    samples = dict(_UNITS_SAMPLE.findall(metrics_text))
    if "sum" not in samples or "count" not in samples:
        return None
    return float(samples["sum"]), float(samples["count"])


@dataclass
class CpuWatch:
    """CPU used by each node and by the bench over one measured window (:meth:`window`), then
    :meth:`per_transaction`. ``node_pids``: node URL -> PID."""

    target: Target
    node_pids: Mapping[str, int]
    proc: Path = PROC
    client_pid: int = field(default_factory=os.getpid)
    labels: dict[str, str] = field(default_factory=dict)  # URL -> "leader" or the follower's node id
    leader_id: str | None = None
    leader_url: str | None = None
    cpu_s: dict[str, float] = field(default_factory=dict)  # label -> CPU seconds in the window
    units: tuple[float, float] | None = None  # commit units, Raft entries in the window
    notes: list[str] = field(default_factory=list)

    @contextlib.asynccontextmanager
    async def window(self) -> AsyncIterator[None]:
        """Measure what the block costs. The nodes' roles and the leader's metrics are read
        outside it, so that reading them is not counted."""
        async with self.target.session() as session:
            await self._find_roles(session)
            units_before = await self._units(session)
            before = self._sample()
            yield
            after = self._sample()
            units_after = await self._units(session)
            leader_before = self.leader_id
            await self._find_roles(session)
        if self.leader_id != leader_before:
            self.notes.append(f"the leader changed during the window ({leader_before} -> {self.leader_id})")
        self.cpu_s = {label: after[label] - before[label] for label in before if label in after}
        if units_before and units_after:
            self.units = (units_after[0] - units_before[0], units_after[1] - units_before[1])

    def per_transaction(self, transactions: int) -> dict[str, Any]:
        """The window's report: µs of CPU per transaction by process, commits per Raft entry."""
        per_tx = {label: round(seconds * 1e6 / transactions) if transactions else None
                  for label, seconds in self.cpu_s.items()}
        ordered = {"leader": per_tx.pop("leader", None), **dict(sorted(per_tx.items()))}
        ordered[CLIENT] = ordered.pop(CLIENT, None)
        report: dict[str, Any] = {
            "leader_id": self.leader_id, "transactions": transactions, "us_per_tx": ordered,
            "cpu_s": {label: round(seconds, 3) for label, seconds in self.cpu_s.items()},
            "commits_per_entry": round(self.units[0] / self.units[1], 2) if self.units and self.units[1] else None}
        if self.notes:
            report["notes"] = list(self.notes)
        return report

    # ------------------------------------------------------------ internals
    def _sample(self) -> dict[str, float]:
        sample = {}
        processes = {**{self.labels[url]: pid for url, pid in self.node_pids.items() if url in self.labels},
                     CLIENT: self.client_pid}
        for label, pid in processes.items():
            try:
                sample[label] = cpu_seconds(pid, self.proc)
            except (OSError, IndexError, ValueError):
                self.notes.append(f"could not read /proc/{pid}/stat ({label})")
        return sample

    async def _find_roles(self, session: aiohttp.ClientSession) -> None:
        self.labels, self.leader_id, self.leader_url = {}, None, None
        for url in self.node_pids:
            status = await _get(session, f"{url}/v1/cluster")
            if not isinstance(status, dict) or "node_id" not in status:
                self.notes.append(f"{url} did not say its role")
                continue
            if status.get("role") == "leader":
                self.labels[url], self.leader_id, self.leader_url = "leader", status["node_id"], url
            else:
                self.labels[url] = str(status["node_id"])

    async def _units(self, session: aiohttp.ClientSession) -> tuple[float, float] | None:
        if self.leader_url is None:
            return None
        text = await _get(session, f"{self.leader_url}/metrics", as_text=True)
        return units_per_entry(text) if isinstance(text, str) else None


async def _get(session: aiohttp.ClientSession, url: str, as_text: bool = False) -> Any:
    """A GET's body (JSON, or text), or None if the node did not answer it with 200."""
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=STATUS_TIMEOUT_S)) as response:
            if response.status != 200:
                return None
            return await response.text() if as_text else await response.json()
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return None


# ------------------------------------------------------------------ printing
def print_cpu_table(rows: list[dict[str, Any]]) -> None:
    """One line per scenario row that has a ``cpu`` report."""
    measured = [row for row in rows if row.get("cpu")]
    if not measured:
        return
    lines = [["scenario", "callers", "leader_us", "followers_us", "client_us", "commits_per_entry"]]
    for row in measured:
        cpu = row["cpu"]
        us = cpu["us_per_tx"]
        followers = ", ".join(f"{label} {value}" for label, value in us.items() if label not in ("leader", CLIENT))
        leader = f"{cpu['leader_id']} {us['leader']}" if us.get("leader") is not None else "?"
        lines.append([row["scenario"], row["callers"], leader, followers or "?", str(us.get(CLIENT, "?")),
                      str(cpu["commits_per_entry"] if cpu["commits_per_entry"] is not None else "?")])
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    print("CPU per transaction by process (µs of utime+stime over the measured window):")
    for line in lines:
        print("  ".join(value.rjust(width) for value, width in zip(line, widths, strict=True)), flush=True)
    for row in measured:
        for note in row["cpu"].get("notes", []):
            print(f"  {row['scenario']}/{row['callers']}: {note}", flush=True)
