"""``python -m cluster up``, run as a user would: the demo, and a clean stop on SIGTERM.

Whatever happens, every process the launcher started is gone at the end: the
test kills the launcher and the node pids it printed if a check failed first.
"""

from __future__ import annotations

import re
import signal
from pathlib import Path

import pytest

from rcq.testing import async_wait_until
from tests.helpers import LAUNCHER_EXIT_TIMEOUT_S, LAUNCHER_START_TIMEOUT_S
from tests.helpers.launcher import TEMP_DIR_LINE, Launcher, is_rcq_node

LEADER_LINE = re.compile(r"^leader: (node-\d+) (https?://127\.0\.0\.1:\d+)$")

pytestmark = pytest.mark.cluster


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
    await async_wait_until(lambda: "ready" in launcher.lines or launcher.process.poll() is not None,
                           LAUNCHER_START_TIMEOUT_S, interval_s=0.1, what="the launcher printing ready")
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


PARTITION_LINE = re.compile(r"^  (p\d+)  members (\S+)  leader (node-\d+) (https?://127\.0\.0\.1:\d+)$")


async def test_partitions_are_created_led_and_reopened_before_ready(launchers: list[Launcher], tmp_path: Path) -> None:
    """--partitions 3: p0, p1 and p2 each with a leader before 'ready'; p1 and p2 in processes of
    their own (other URLs than the nodes'); the same partitions again on the same --data-dir."""
    data_dir = tmp_path / "cluster"
    for run in range(2):
        launcher = Launcher("up", "--partitions", "3", "--data-dir", str(data_dir))
        launchers.append(launcher)
        await async_wait_until(lambda started=launcher: "ready" in started.lines or started.process.poll() is not None,
                               LAUNCHER_START_TIMEOUT_S, interval_s=0.1, what="the launcher printing ready")
        assert launcher.process.poll() is None, launcher.output
        nodes = check_nodes_printed(launcher, 3)
        ready_at = launcher.lines.index("ready")
        rows = [m for m in map(PARTITION_LINE.match, launcher.lines[:ready_at]) if m]
        assert [m[1] for m in rows] == ["p0", "p1", "p2"], launcher.output
        node_urls = {url for _, url, _, _ in nodes}
        assert rows[0][4] in node_urls and not {m[4] for m in rows[1:]} & node_urls, launcher.output
        assert all(sorted(m[2].split(",")) == ["node-0", "node-1", "node-2"] for m in rows), launcher.output
        launcher.process.send_signal(signal.SIGTERM)
        assert launcher.wait(LAUNCHER_EXIT_TIMEOUT_S) == 0, launcher.output
        for _, _, pid, _ in nodes:
            assert not is_rcq_node(pid), f"node pid {pid} outlived the launcher"
        assert ("reopening the 3-node cluster" in launcher.output) == (run == 1), launcher.output
