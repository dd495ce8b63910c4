"""``python -m cluster ...`` run as a user runs it (what ``./run up`` and ``./run demo`` do), its
output collected line by line, and every process it started gone at the end (:meth:`Launcher.cleanup`
kills the launcher and the node pids it printed if a check failed first).

Must not import: a test module or a conftest; rcq.server (nodes are separate processes).
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
from pathlib import Path

from tests.helpers import LAUNCHER_EXIT_TIMEOUT_S

REPO_ROOT = Path(__file__).resolve().parents[2]
NODE_LINE = re.compile(r"^\s+(node-\d+)\s+(https?://127\.0\.0\.1:\d+)\s+raft \S+\s+pid (\d+)\s+(leader|follower)$")
TEMP_DIR_LINE = re.compile(r" in (\S+) \(removed on exit\)$")


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
