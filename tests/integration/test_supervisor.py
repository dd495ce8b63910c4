"""The supervision of a node's child processes (rcq.server.partitions.supervisor, .child), with
real processes: started, restarted with back-off, stopped (SIGKILL for one that ignores SIGTERM),
and gone when the supervising process is killed -9 (no orphan)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rcq.server.partitions.child import die_with_parent
from rcq.server.partitions.supervisor import PARENT_PID_ENV, ChildSpec, Supervisor, SupervisorTimes
from rcq.testing import async_wait_until, wait_until
from tests.helpers import LOCAL_WAIT_S
from tests.helpers.processes import process_alive

FAST = SupervisorTimes(backoff_min_s=0.05, backoff_max_s=0.2, healthy_after_s=2.0, stop_timeout_s=1.0)

# A child: dies with its parent, arranges what its first argument says, writes its pid, then does it.
CHILD = textwrap.dedent("""
    import os, signal, sys, time
    from rcq.server.partitions.child import die_with_parent
    die_with_parent()
    what, pids = sys.argv[1], sys.argv[2]
    if what == "ignore-term":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # before the pid: a test that sees it may stop us
    with open(pids, "a") as f:
        f.write(f"{os.getpid()}\\n")
    if what == "exit":
        sys.exit(3)
    while True:
        time.sleep(1)  # pace: a child that only waits to be stopped
""")

# A supervising process with one child: prints the child's pid, then waits to be killed.
PARENT = textwrap.dedent("""
    import asyncio, sys
    from pathlib import Path
    from rcq.server.partitions.supervisor import ChildSpec, Supervisor

    async def main():
        supervisor = Supervisor()
        await supervisor.want({"p1": ChildSpec((sys.executable, sys.argv[1], "wait", sys.argv[2]), Path(sys.argv[3]))})
        while "p1" not in supervisor.pids():
            await asyncio.sleep(0.01)  # pace: the child's pid is known once it is spawned
        print(supervisor.pids()["p1"], flush=True)
        await asyncio.Event().wait()

    asyncio.run(main())
""")


def pids_written(path: Path) -> list[int]:
    return [int(line) for line in path.read_text().split()] if path.exists() else []


@pytest.fixture
def child_script(tmp_path: Path) -> Path:
    path = tmp_path / "child.py"
    path.write_text(CHILD)
    return path


def spec(child_script: Path, tmp_path: Path, what: str, name: str = "p1") -> ChildSpec:
    return ChildSpec((sys.executable, str(child_script), what, str(tmp_path / f"{name}.pids")),
                     tmp_path / f"{name}.log")


async def test_children_run_until_stopped_and_a_child_no_longer_wanted_stops(child_script: Path,
                                                                          tmp_path: Path) -> None:
    supervisor = Supervisor(FAST)
    try:
        await supervisor.want({"p1": spec(child_script, tmp_path, "wait", "p1"),
                               "p2": spec(child_script, tmp_path, "wait", "p2")})
        await async_wait_until(lambda: pids_written(tmp_path / "p1.pids") and pids_written(tmp_path / "p2.pids"),
                               LOCAL_WAIT_S, what="both children running")
        first, second = pids_written(tmp_path / "p1.pids")[0], pids_written(tmp_path / "p2.pids")[0]
        assert supervisor.pids() == {"p1": first, "p2": second}

        await supervisor.want({"p1": spec(child_script, tmp_path, "wait", "p1")})
        assert not process_alive(second) and process_alive(first)
        assert supervisor.status()["p1"]["starts"] == 1 and list(supervisor.status()) == ["p1"]
    finally:
        await supervisor.close()
    assert not process_alive(first)
    assert supervisor.status() == {}


async def test_a_child_that_exits_is_started_again_with_a_growing_back_off(child_script: Path,
                                                                       tmp_path: Path) -> None:
    supervisor = Supervisor(FAST)
    try:
        await supervisor.want({"p1": spec(child_script, tmp_path, "exit")})
        await async_wait_until(lambda: len(set(pids_written(tmp_path / "p1.pids"))) >= 4, LOCAL_WAIT_S,
                               what="the exiting child run four times")
        status = supervisor.status()["p1"]
        assert status["last_exit"] == 3 and status["restarts"] >= 3
        # The back-off doubled from 0.05 s up to its cap of 0.2 s.
        await async_wait_until(lambda: supervisor.status()["p1"]["backoff_s"] == FAST.backoff_max_s, LOCAL_WAIT_S,
                               what="the back-off at its cap")
    finally:
        await supervisor.close()
    assert all(not process_alive(pid) for pid in pids_written(tmp_path / "p1.pids"))


async def test_a_child_killed_from_outside_is_replaced(child_script: Path, tmp_path: Path) -> None:
    supervisor = Supervisor(FAST)
    try:
        await supervisor.want({"p1": spec(child_script, tmp_path, "wait")})
        await async_wait_until(lambda: supervisor.pids().get("p1"), LOCAL_WAIT_S, what="the child running")
        first = supervisor.pids()["p1"]
        os.kill(first, signal.SIGKILL)
        await async_wait_until(lambda: supervisor.pids().get("p1", first) != first, LOCAL_WAIT_S,
                               what="another process for the child")
        assert supervisor.status()["p1"]["last_exit"] == -signal.SIGKILL
        assert not process_alive(first)
    finally:
        await supervisor.close()


async def test_a_child_that_ignores_sigterm_is_killed_after_the_stop_timeout(child_script: Path,
                                                                          tmp_path: Path) -> None:
    supervisor = Supervisor(FAST)
    await supervisor.want({"p1": spec(child_script, tmp_path, "ignore-term")})
    await async_wait_until(lambda: pids_written(tmp_path / "p1.pids"), LOCAL_WAIT_S, what="the child running")
    pid = pids_written(tmp_path / "p1.pids")[0]
    started = asyncio.get_running_loop().time()
    await supervisor.close()
    assert not process_alive(pid)
    assert asyncio.get_running_loop().time() - started >= FAST.stop_timeout_s


def test_killing_the_supervising_process_with_sigkill_leaves_no_orphan(child_script: Path, tmp_path: Path) -> None:
    parent_script = tmp_path / "parent.py"
    parent_script.write_text(PARENT)
    with subprocess.Popen([sys.executable, str(parent_script), str(child_script), str(tmp_path / "p1.pids"),
                           str(tmp_path / "p1.log")], stdout=subprocess.PIPE, text=True) as parent:
        try:
            assert parent.stdout is not None
            child = int(parent.stdout.readline())
            wait_until(lambda: pids_written(tmp_path / "p1.pids") == [child], LOCAL_WAIT_S,
                       what="the child past die_with_parent")
            parent.kill()
            parent.wait(LOCAL_WAIT_S)
            wait_until(lambda: not process_alive(child), LOCAL_WAIT_S, what="the child gone with its parent")
        finally:
            if parent.poll() is None:
                parent.kill()
                parent.wait(LOCAL_WAIT_S)


def test_a_child_whose_parent_is_not_the_one_named_refuses_to_run(monkeypatch: pytest.MonkeyPatch) -> None:
    code = "from rcq.server.partitions.child import die_with_parent; die_with_parent()"
    env = {**os.environ, PARENT_PID_ENV: str(os.getpid() + 1_000_000)}
    answer = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                            timeout=LOCAL_WAIT_S, check=False)
    assert answer.returncode == 1 and "ParentGone" in answer.stderr and "no longer is" in answer.stderr
    monkeypatch.delenv(PARENT_PID_ENV, raising=False)
    assert die_with_parent() is None  # not started by a supervisor: nothing arranged


def test_times_that_make_no_sense_are_refused() -> None:
    with pytest.raises(ValueError, match="backoff_min_s"):
        SupervisorTimes(backoff_min_s=2.0, backoff_max_s=1.0)
    with pytest.raises(ValueError, match="stop_timeout_s"):
        SupervisorTimes(stop_timeout_s=0)
