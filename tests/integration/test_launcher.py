"""``python -m cluster up``, run as a user would: the demo, and a clean stop on SIGTERM.

Whatever happens, every process the launcher started is gone at the end: the
test kills the launcher and the node pids it printed if a check failed first.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from rcq.testing import wait_until
from tests.helpers import LAUNCHER_EXIT_TIMEOUT_S, LAUNCHER_START_TIMEOUT_S

REPO_ROOT = Path(__file__).resolve().parents[2]
NODE_LINE = re.compile(r"^\s+(node-\d+)\s+(https?://127\.0\.0\.1:\d+)\s+raft \S+\s+pid (\d+)\s+(leader|follower)$")
LEADER_LINE = re.compile(r"^leader: (node-\d+) (https?://127\.0\.0\.1:\d+)$")
TEMP_DIR_LINE = re.compile(r" in (\S+) \(removed on exit\)$")

pytestmark = pytest.mark.cluster


class Launcher:
    """A ``python -m cluster ...`` process whose stdout is collected line by line."""

    def __init__(self, *args: str, extra_env: dict[str, str] | None = None) -> None:
        env = {k: v for k, v in os.environ.items() if k not in ("RCQ_CLUSTER_SECRET", "RCQ_TOKEN", "RCQ_ADMIN_TOKEN")}
        env.update(extra_env or {})
        self.process = subprocess.Popen(
            [sys.executable, "-m", "cluster", *args], cwd=REPO_ROOT, env=env, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        with self.process.stdout:
            for line in self.process.stdout:
                self.lines.append(line.rstrip("\n"))

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def nodes(self) -> list[tuple[str, str, int, str]]:
        return [(m[1], m[2], int(m[3]), m[4]) for m in map(NODE_LINE.match, self.lines) if m]

    def wait(self, timeout_s: float) -> int:
        code = self.process.wait(timeout_s)
        self._reader.join(timeout_s)
        return code

    def cleanup(self) -> None:
        """Kill the launcher and any node it printed that is still an rcq process; remove its temp dir."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self._reader.join(LAUNCHER_EXIT_TIMEOUT_S)  # it closes the pipe when the launcher's output ends
        for _, _, pid, _ in self.nodes():
            if is_rcq_node(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)  # each node leads its own process group
        for line in self.lines:
            match = TEMP_DIR_LINE.search(line)
            if match and Path(match[1]).parent == Path(tempfile.gettempdir()):
                shutil.rmtree(match[1], ignore_errors=True)


def is_rcq_node(pid: int) -> bool:
    try:
        command_line = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        state = next(line for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                     if line.startswith("State:"))
    except (FileNotFoundError, ProcessLookupError, StopIteration):
        return False
    return b"rcq" in command_line and b"serve" in command_line and "zombie" not in state


@pytest.fixture
def launchers() -> Iterator[list[Launcher]]:
    started: list[Launcher] = []
    yield started
    for launcher in started:
        launcher.cleanup()


def check_nodes_printed(launcher: Launcher, count: int) -> list[tuple[str, str, int, str]]:
    nodes = launcher.nodes()
    assert len(nodes) == count, launcher.output
    assert len({url for _, url, _, _ in nodes}) == count, launcher.output
    assert [role for *_, role in nodes].count("leader") == 1, launcher.output
    leader_lines = [m for m in map(LEADER_LINE.match, launcher.lines) if m]
    assert len(leader_lines) == 1, launcher.output
    leader_id, leader_url = leader_lines[0][1], leader_lines[0][2]
    assert (leader_id, leader_url, "leader") in [(n, u, r) for n, u, _, r in nodes], launcher.output
    return nodes


@pytest.mark.parametrize("tls", [False, True], ids=["http", "https"])
async def test_demo_runs_against_three_nodes_with_a_token_and_exits_zero(launchers: list[Launcher], tls: bool) -> None:
    launcher = Launcher("up", "--nodes", "3", "--demo", *(["--tls"] if tls else []))
    launchers.append(launcher)
    assert launcher.wait(LAUNCHER_START_TIMEOUT_S + LAUNCHER_EXIT_TIMEOUT_S) == 0, launcher.output
    nodes = check_nodes_printed(launcher, 3)
    output = launcher.output
    assert "== demo done ==" in output
    assert "head of 'demo': 'apple'" in output
    assert "count(demo) = 2" in output  # three enqueued, one dequeued and committed
    assert "every node has state digest" in output
    for _, _, pid, _ in nodes:
        assert not is_rcq_node(pid), f"node pid {pid} outlived the launcher"
    temp_dirs = [m[1] for m in map(TEMP_DIR_LINE.search, launcher.lines) if m]
    assert len(temp_dirs) == 1 and not Path(temp_dirs[0]).exists(), output
    # How to use the cluster: its URLs, the token by the path of its private file (never the token)
    assert f"  export RCQ_URLS={','.join(url for _, url, _, _ in nodes)}" in launcher.lines, output
    assert f"  export RCQ_TOKEN=$(cat {temp_dirs[0]}/admin.token)" in output, output
    assert "rcq_" not in output
    assert all(url.startswith("https://" if tls else "http://") for _, url, _, _ in nodes)
    assert (f"  export RCQ_CA_FILE={temp_dirs[0]}/tls/ca.pem" in output) == tls, output


async def test_a_preset_admin_token_is_the_clusters_admin_token(launchers: list[Launcher], tmp_path: Path) -> None:
    token = "rcq_" + "ab" * 32
    launcher = Launcher("up", "--nodes", "3", "--demo", "--data-dir", str(tmp_path / "cluster"),
                        extra_env={"RCQ_ADMIN_TOKEN": token})
    launchers.append(launcher)
    assert launcher.wait(LAUNCHER_START_TIMEOUT_S + LAUNCHER_EXIT_TIMEOUT_S) == 0, launcher.output
    assert "== demo done ==" in launcher.output and token not in launcher.output
    assert (tmp_path / "cluster" / "admin.token").read_text().strip() == token


async def test_sigterm_stops_every_node_and_exits_zero(launchers: list[Launcher], tmp_path: Path) -> None:
    launcher = Launcher("up", "--nodes", "3", "--data-dir", str(tmp_path / "cluster"))
    launchers.append(launcher)
    await wait_until(lambda: "ready" in launcher.lines or launcher.process.poll() is not None,
                     LAUNCHER_START_TIMEOUT_S, interval_s=0.1, message="the launcher printing ready")
    assert launcher.process.poll() is None, launcher.output
    nodes = check_nodes_printed(launcher, 3)
    assert all(is_rcq_node(pid) for _, _, pid, _ in nodes)
    launcher.process.send_signal(signal.SIGTERM)
    assert launcher.wait(LAUNCHER_EXIT_TIMEOUT_S) == 0, launcher.output
    assert "SIGTERM: stopping the cluster" in launcher.output
    for _, _, pid, _ in nodes:
        assert not is_rcq_node(pid), f"node pid {pid} outlived the launcher"
    assert (tmp_path / "cluster" / "cluster.json").exists()  # --data-dir is kept for a restart


async def test_a_restart_on_the_same_data_dir_keeps_the_nodes_and_their_queues(
        launchers: list[Launcher], tmp_path: Path) -> None:
    data_dir = tmp_path / "cluster"
    first = Launcher("up", "--nodes", "3", "--data-dir", str(data_dir), "--demo")
    launchers.append(first)
    assert first.wait(LAUNCHER_START_TIMEOUT_S + LAUNCHER_EXIT_TIMEOUT_S) == 0, first.output
    second = Launcher("up", "--data-dir", str(data_dir), "--demo")
    launchers.append(second)
    assert second.wait(LAUNCHER_START_TIMEOUT_S + LAUNCHER_EXIT_TIMEOUT_S) == 0, second.output
    assert "reopening the 3-node cluster" in second.output
    assert {u for _, u, _, _ in first.nodes()} == {u for _, u, _, _ in second.nodes()}
    assert "count(demo) = 4" in second.output  # 2 left by the first demo, +3 -1 by the second
    assert f"export RCQ_TOKEN=$(cat {data_dir}/admin.token)" in second.output  # the same token, kept
