"""The README's shell walk-through works as written: each block after a ``<!-- tested: readme-shell``
marker runs in bash (``set -euo pipefail``: any failed step fails the test) against a live 3-node
cluster, with the variables the README says to set (``RCQ_URLS``, ``RCQ_TOKEN``), and its output
says what the README says it does. The block sends requests to every node, followers included,
with plain ``curl`` and no redirect following: the followers forward them to the leader."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from rcq.local.cluster import LocalCluster
from rcq.testing import WaitTimeout, wait_until
from tests.helpers import CLUSTER_WAIT_S, LAUNCHER_START_TIMEOUT_S, LEADER_TIMEOUT_S
from tests.helpers.launcher import REPO_ROOT, Launcher

pytestmark = pytest.mark.cluster

README = REPO_ROOT / "README.md"
MARKER = "<!-- tested: readme-shell"
BLOCK = re.compile(re.escape(MARKER) + r"[^\n]*-->\n```(?:sh|bash)\n(.*?)\n```", re.DOTALL)


def readme_blocks() -> list[str]:
    blocks = BLOCK.findall(README.read_text(encoding="utf-8"))
    assert blocks, f"no shell block after a {MARKER!r} marker in README.md"
    return blocks


def json_lines(output: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in output.splitlines() if line.startswith("{")]


def test_the_readme_marks_a_shell_block_that_uses_no_redirect() -> None:
    for block in readme_blocks():
        assert not re.search(r"\s(-L|--location(-trusted)?)\b", block), "the walk-through must not need a redirect"


@pytest.mark.skipif(shutil.which("curl") is None, reason="no curl on this machine")
def test_the_readmes_shell_walk_through_runs_against_any_node(cluster: LocalCluster) -> None:
    leader = cluster.wait_for_leader(LEADER_TIMEOUT_S)
    assert cluster.token is not None
    followers = [url for i, url in enumerate(cluster.urls) if i != leader]
    bin_dir = str(Path(sys.executable).parent)  # python3 of the README: this interpreter
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
           "RCQ_URLS": ",".join(cluster.urls), "RCQ_TOKEN": cluster.token}
    for block in readme_blocks():
        done = subprocess.run(["bash", "-c", "set -euo pipefail\n" + block], env=env, capture_output=True,
                              text=True, timeout=CLUSTER_WAIT_S, check=False)
        assert done.returncode == 0, f"exit {done.returncode}\nstdout:\n{done.stdout}\nstderr:\n{done.stderr}"
        answers = json_lines(done.stdout)
        assert all("error" not in answer for answer in answers), done.stdout
        enqueued, committed, *one_request, dequeued = answers
        assert (enqueued["enqueued"], committed["committed"], committed["enqueued"]) == (2, True, 2)
        assert len(one_request) == len(cluster.urls) and all(a["committed"] for a in one_request)
        values = sorted(item["value"] for item in dequeued["results"][0]["items"])
        assert values == sorted(["a", "b", *(f"via {url}" for url in cluster.urls)])
        assert followers and all(f"via {url}" in values for url in followers)  # followers answered plain curl


# ------------------------------------------------------------------ the tour, against `./run up`'s cluster
TOUR_BLOCK = re.compile(r"<!-- tested: readme-(cli|python|shell)[^\n]*-->\n```(?:sh|bash|python)\n(.*?)\n```", re.DOTALL)
EXPORT_LINE = re.compile(r"^  (export RCQ_(?:URLS|TOKEN)=.*?)(?:\s+#.*)?$")


def tour_blocks() -> list[tuple[str, str]]:
    """The README's tested blocks, in the order a reader meets them: (kind, code)."""
    blocks = TOUR_BLOCK.findall(README.read_text(encoding="utf-8"))
    assert [kind for kind, _ in blocks] == ["cli", "python", "shell"], blocks
    return blocks


@pytest.mark.skipif(shutil.which("curl") is None, reason="no curl on this machine")
def test_the_readmes_tour_runs_as_written_in_order_against_the_cluster_run_up_starts(
        launchers: list[Launcher]) -> None:
    launcher = Launcher("up", "--nodes", "3")  # what `./run up` runs, after installing
    launchers.append(launcher)
    wait_for_line(launcher, "ready", LAUNCHER_START_TIMEOUT_S)
    # the export lines exactly as the launcher printed them, as a reader pastes them
    exports = [m[1] for m in map(EXPORT_LINE.match, launcher.lines) if m]
    assert len(exports) == 2, launcher.output
    env = {k: v for k, v in os.environ.items() if not k.startswith("RCQ_")}
    shell_env = subprocess.run(["bash", "-c", "\n".join(exports) + "\nenv"], env=env, capture_output=True,
                               text=True, check=True, timeout=CLUSTER_WAIT_S).stdout
    env |= dict(line.split("=", 1) for line in shell_env.splitlines() if line.startswith("RCQ_"))
    assert set(env) >= {"RCQ_URLS", "RCQ_TOKEN"}
    outputs = []
    for kind, code in tour_blocks():
        command = [sys.executable, "-c", code] if kind == "python" else ["bash", "-c", "set -euo pipefail\n" + code]
        done = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                              timeout=CLUSTER_WAIT_S, check=False)
        assert done.returncode == 0, f"{kind}: exit {done.returncode}\nstdout:\n{done.stdout}\nstderr:\n{done.stderr}"
        outputs.append(done.stdout)
    cli, python, curl = outputs
    assert cli.count("hello") >= 2 and "world" in cli, cli  # peeked, then dequeued with "world"
    assert python.split() == ["b'order-2'", "2", "1"], python  # the head; orders and processing counts
    assert all("error" not in answer for answer in json_lines(curl)), curl


def wait_for_line(launcher: Launcher, line: str, timeout_s: float) -> None:
    """Until the launcher prints ``line``; its output in the failure (it exited, or the wait ran out)."""
    def printed() -> bool:
        assert launcher.process.poll() is None, launcher.output
        return line in launcher.lines

    try:
        wait_until(printed, timeout_s, what=f"the launcher printing {line!r}")
    except WaitTimeout as exc:
        raise AssertionError(f"{exc}:\n{launcher.output}") from exc
