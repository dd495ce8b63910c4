"""Child processes a node keeps running: started on demand, restarted with back-off, stopped with it.

A :class:`Supervisor` runs in the node's event loop. :meth:`Supervisor.want` names the children
that should run now (a :class:`ChildSpec` each): new ones start, ones no longer named stop, and a
changed spec restarts its child. Each child has a task that starts its process, waits for it to
exit and, unless it was asked to stop, starts it again after a back-off: ``backoff_min_s``,
doubling up to ``backoff_max_s``, back to the minimum once a run lasted ``healthy_after_s``.

A child stays in the node's process group, so the signals the launcher sends the group (SIGSTOP,
SIGCONT, SIGKILL) reach it too. When the node's process dies without stopping them (``kill -9``),
each child dies as well: :func:`rcq.server.partitions.child.die_with_parent`, which the child
calls first, asks the kernel for that. The kernel sends that signal when the *thread* that forked
the child ends; the children are forked from the event loop's thread, which lives as long as the
node does.

A child's output goes to its log file (appended). Nothing secret is put on its command line or in
its environment: a spec's ``argv`` names a private config file instead.

Must not import: pysyncobj, lmdb, aiohttp.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import signal
import time
from collections.abc import Mapping
from pathlib import Path

log = logging.getLogger(__name__)

PARENT_PID_ENV = "RCQ_PARENT_PID"  # the pid a child checks its parent against (child.die_with_parent)


@dataclasses.dataclass(frozen=True)
class ChildSpec:
    """What to run for one child: its command and the file its output is appended to."""

    argv: tuple[str, ...]
    log_path: Path
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)  # added to this process's environment


@dataclasses.dataclass(frozen=True)
class SupervisorTimes:
    backoff_min_s: float = 0.5
    backoff_max_s: float = 30.0
    healthy_after_s: float = 60.0  # a run this long resets the back-off
    stop_timeout_s: float = 10.0  # SIGTERM, then SIGKILL after this

    def __post_init__(self) -> None:
        if not 0 < self.backoff_min_s <= self.backoff_max_s:
            raise ValueError("backoff_min_s must be above 0 and at most backoff_max_s")
        if self.healthy_after_s <= 0 or self.stop_timeout_s <= 0:
            raise ValueError("healthy_after_s and stop_timeout_s must be above 0")


@dataclasses.dataclass
class ChildState:
    """What the supervisor knows of one child (``status()`` shows it)."""

    pid: int | None = None
    starts: int = 0  # processes started (restarts = starts - 1)
    last_exit: int | None = None  # the last process's return code (negative: killed by that signal)
    backoff_s: float = 0.0  # the wait before the next start, while one is pending
    started_at: float | None = None  # monotonic

    def as_json(self) -> dict[str, object]:
        return {"pid": self.pid, "running": self.pid is not None, "starts": self.starts,
                "restarts": max(0, self.starts - 1), "last_exit": self.last_exit,
                "backoff_s": round(self.backoff_s, 3)}


class _Child:
    """One child's task: run, wait, back off, run again, until stopped."""

    def __init__(self, name: str, spec: ChildSpec, times: SupervisorTimes) -> None:
        self.name = name
        self.spec = spec
        self.times = times
        self.state = ChildState()
        self._stopping = asyncio.Event()
        self._process: asyncio.subprocess.Process | None = None
        self.task = asyncio.get_running_loop().create_task(self._run(), name=f"child {name}")

    async def _run(self) -> None:
        try:
            await self._supervise()
        except Exception:  # a bug here must not leave the child unsupervised in silence
            log.exception("child %s: its supervision failed", self.name)
            raise

    async def _supervise(self) -> None:
        backoff_s = self.times.backoff_min_s
        while not self._stopping.is_set():
            started = time.monotonic()
            try:
                await self._start()
                assert self._process is not None
                code = await self._process.wait()
            except OSError as exc:  # the program could not be started (missing, not executable)
                log.error("child %s could not start: %s", self.name, exc)
                code = None
            self.state.pid = None
            self.state.last_exit = code
            if self._stopping.is_set():
                return
            ran_s = time.monotonic() - started
            backoff_s = self.times.backoff_min_s if ran_s >= self.times.healthy_after_s else backoff_s
            self.state.backoff_s = backoff_s
            log.warning("child %s exited with %s after %.1f s; starting it again in %.1f s",
                        self.name, describe_exit(code), ran_s, backoff_s)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), backoff_s)
            self.state.backoff_s = 0.0
            backoff_s = min(backoff_s * 2, self.times.backoff_max_s)

    async def _start(self) -> None:
        self.spec.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **self.spec.env, PARENT_PID_ENV: str(os.getpid())}
        with open(self.spec.log_path, "ab") as log_file:
            self._process = await asyncio.create_subprocess_exec(
                *self.spec.argv, stdin=asyncio.subprocess.DEVNULL, stdout=log_file, stderr=log_file, env=env)
        self.state.pid = self._process.pid
        self.state.starts += 1
        self.state.started_at = time.monotonic()
        log.info("child %s started: pid %d", self.name, self._process.pid)

    async def stop(self) -> None:
        """SIGTERM, SIGKILL after ``stop_timeout_s``; returns once the process and the task ended."""
        self._stopping.set()
        process = self._process
        if process is not None and process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(process.wait(), self.times.stop_timeout_s)
            except TimeoutError:
                log.warning("child %s did not stop within %.0f s of SIGTERM: killed", self.name,
                            self.times.stop_timeout_s)
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                await process.wait()
        await self.task


def describe_exit(code: int | None) -> str:
    if code is None:
        return "no process"
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"signal {signal.Signals(-code).name}"
        return f"signal {-code}"
    return f"code {code}"


class Supervisor:
    """The children one node keeps running, by name."""

    def __init__(self, times: SupervisorTimes | None = None) -> None:
        self.times = times or SupervisorTimes()
        self._children: dict[str, _Child] = {}
        self._lock = asyncio.Lock()
        self._closed = False

    async def want(self, specs: Mapping[str, ChildSpec]) -> None:
        """Run exactly the children of ``specs``: start the new ones, stop the ones no longer there,
        restart one whose spec changed."""
        async with self._lock:
            if self._closed:
                return
            for name in [n for n, child in self._children.items() if specs.get(n) != child.spec]:
                await self._children.pop(name).stop()
            for name, spec in specs.items():
                if name not in self._children:
                    self._children[name] = _Child(name, spec, self.times)

    async def close(self) -> None:
        """Stop every child (all at once), and start none after."""
        async with self._lock:
            self._closed = True
            children, self._children = list(self._children.values()), {}
            await asyncio.gather(*(child.stop() for child in children))

    def status(self) -> dict[str, dict[str, object]]:
        return {name: child.state.as_json() for name, child in sorted(self._children.items())}

    def pids(self) -> dict[str, int]:
        return {name: child.state.pid for name, child in self._children.items() if child.state.pid is not None}
