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

from rcq.testing.cluster import LocalCluster
from tests.helpers import CLUSTER_WAIT_S

pytestmark = pytest.mark.cluster

README = Path(__file__).resolve().parents[2] / "README.md"
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
    leader = cluster.wait_for_leader(30)
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
