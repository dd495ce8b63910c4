"""How long a state digest holds up applies: the in-lock digest against the forked one.

``python -m bench.stall [--items N] [--item-bytes B]`` builds a QueueStateMachine of N items
of B bytes (CommitBatch entries through ``QueueStateMachine.apply``), then, while an "apply"
thread keeps applying one-item entries under the state lock as pysyncobj's tick thread does,
computes the digest (a) the old way, ``digest()`` while holding the lock, and (b) the new way,
:func:`rcq.server.raft.digest.forked_digest`. It prints the worst wait for the lock (the apply
stall) in each case, the digest latency, and the memory of the forked child, sampled from
``/proc/<pid>/smaps_rollup``: its private (copied-on-write) memory is the real cost.

The one bench that runs server code in process (the state machine and the digest it measures).
Must not import: pysyncobj, lmdb.
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from rcq.server.core.commands import CommitBatch, CommitUnit, TransactionWrite, encode
from rcq.server.core.state_machine import QueueStateMachine
from rcq.server.raft.digest import forked_digest

QUEUE = "bench"
ITEMS_PER_ENTRY = 1000
PROBE_INTERVAL_S = 0.001
SAMPLE_INTERVAL_S = 0.005


def build_state(items: int, item_bytes: int) -> QueueStateMachine:
    """``items`` distinct items of ``item_bytes`` bytes, applied as 1000-item commit entries."""
    state_machine = QueueStateMachine()
    for entry, first in enumerate(range(0, items, ITEMS_PER_ENTRY), start=1):
        values = tuple((b"%012d" % i).ljust(item_bytes, b"x")[:item_bytes]
                       for i in range(first, min(items, first + ITEMS_PER_ENTRY)))
        state_machine.apply(_entry(f"load-{entry}", values, entry), entry)
    return state_machine


def _entry(transaction_id: str, values: tuple[bytes, ...], now_ms: int) -> object:
    write = TransactionWrite(transaction_id, enqueues=((QUEUE, values),))
    return encode(CommitBatch(term=1, now_ms=now_ms, units=(CommitUnit((write,)),)))


@dataclass
class Applier:
    """Applies one-item entries under ``lock`` every millisecond until stopped; records how late each
    got the lock: waits for the lock and for the GIL alike (``os.fork()`` holds the GIL)."""

    state_machine: QueueStateMachine
    lock: threading.Lock
    item_bytes: int
    waits_s: list[float] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        index = self.state_machine.last_index
        due = time.perf_counter()
        while not self._stop.is_set():
            index += 1
            raw = _entry(f"probe-{index}", (b"p" * self.item_bytes,), index)
            with self.lock:
                self.waits_s.append(max(0.0, time.perf_counter() - due))
                self.state_machine.apply(raw, index)
            due = time.perf_counter() + PROBE_INTERVAL_S
            time.sleep(PROBE_INTERVAL_S)

    def during(self, work: Callable[[], object]) -> tuple[float, float, int]:
        """Run ``work`` while applying; (worst lateness, work's duration, entries applied), seconds."""
        self.waits_s = []
        self._stop.clear()
        thread = threading.Thread(target=self.run, name="bench-apply")
        thread.start()
        time.sleep(0.05)  # let the applier reach its steady state first
        started = time.perf_counter()
        work()
        elapsed = time.perf_counter() - started
        time.sleep(0.05)
        self._stop.set()
        thread.join()
        return max(self.waits_s), elapsed, len(self.waits_s)


class ChildMemory:
    """Peak Rss / Pss / Private_Dirty (kB) of a child, sampled while it runs."""

    def __init__(self) -> None:
        self.peak: dict[str, int] = {}
        self._threads: list[threading.Thread] = []

    def watch(self, pid: int) -> None:
        thread = threading.Thread(target=self._sample, args=(pid,), name="bench-rss", daemon=True)
        thread.start()
        self._threads.append(thread)

    def _sample(self, pid: int) -> None:
        path = f"/proc/{pid}/smaps_rollup"
        while True:
            try:
                with open(path) as rollup:
                    text = rollup.read()
            except OSError:
                return
            if not text:  # a zombie: gone but not yet reaped
                return
            for line in text.splitlines():
                key, _, rest = line.partition(":")
                if key in ("Rss", "Pss", "Private_Dirty") and rest.split():
                    self.peak[key] = max(self.peak.get(key, 0), int(rest.split()[0]))
            time.sleep(SAMPLE_INTERVAL_S)

    def join(self) -> None:
        for thread in self._threads:
            thread.join(timeout=5)


def fork_time_s(times: int = 5) -> float:
    """The worst duration of a bare ``os.fork()`` of this process (what the forked digest holds the lock for)."""
    worst = 0.0
    for _ in range(times):
        started = time.perf_counter()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            os._exit(0)
        worst = max(worst, time.perf_counter() - started)
        os.waitpid(pid, 0)
    return worst


def rss_kb(pid: int | str = "self") -> int:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.stall", description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--items", type=int, default=1_000_000)
    parser.add_argument("--item-bytes", type=int, default=100)
    parser.add_argument("--runs", type=int, default=3, help="forked digests to measure (the worst is shown)")
    args = parser.parse_args(argv)

    started = time.perf_counter()
    state_machine = build_state(args.items, args.item_bytes)
    lock = threading.Lock()
    print(f"state: {args.items:,} items of {args.item_bytes} B built in {time.perf_counter() - started:.1f} s; "
          f"process RSS {rss_kb() / 1024:.0f} MiB")

    def compute() -> tuple[str, int]:
        return state_machine.digest(), state_machine.last_index

    # Same state, both ways: the forked digest is the in-process one.
    with lock:
        in_process = compute()
    forked = forked_digest(compute, lock)
    print(f"same digest in process and forked: {in_process == forked} ({forked[0][:16]}... @ {forked[1]})")

    applier = Applier(state_machine, lock, args.item_bytes)
    idle_wait, _, idle_count = applier.during(lambda: time.sleep(1.0))
    print(f"no digest:         worst apply stall {idle_wait * 1000:8.2f} ms  ({idle_count} entries in 1.1 s)")

    def in_lock_digest() -> None:
        with lock:
            compute()

    worst, elapsed, count = applier.during(in_lock_digest)
    print(f"(a) in-lock digest: worst apply stall {worst * 1000:8.2f} ms  (digest {elapsed:.2f} s, "
          f"{count} entries applied meanwhile)")

    memory = ChildMemory()
    runs = [applier.during(lambda: forked_digest(compute, lock, on_fork=memory.watch)) for _ in range(args.runs)]
    memory.join()
    worst, elapsed, count = max(runs)
    print(f"(b) forked digest:  worst apply stall {worst * 1000:8.2f} ms  (worst of {args.runs} runs; digest "
          f"{max(r[1] for r in runs):.2f} s, {min(r[2] for r in runs)}+ entries applied meanwhile)")
    print(f"    the lock is held only for os.fork(): {fork_time_s() * 1000:.2f} ms (worst of 5 bare forks)")
    peak = memory.peak
    print(f"child memory (peak): Rss {peak.get('Rss', 0) / 1024:.0f} MiB, Pss {peak.get('Pss', 0) / 1024:.0f} MiB, "
          f"Private_Dirty (copied on write) {peak.get('Private_Dirty', 0) / 1024:.0f} MiB; "
          f"parent RSS {rss_kb() / 1024:.0f} MiB")
    print(f"pid {os.getpid()} done")


if __name__ == "__main__":
    main()
