"""The ``power`` nemesis: power failures of nodes whose data directories are powerfs mounts.

* where it cannot work it is refused, saying why (docker; the local target without powerfs);
* the fault kills the chosen nodes, cuts their power, records who lost power and what their
  disks dropped, and restarts them when it stops (against a recording fake target);
* whole chaos runs (issue 9): with ``durability=os`` (a Raft journal that is never synced,
  today's pysyncobj journal) power failures lose acknowledged commits or leave a node unable to
  restart, and the checker or the restart says so: the harness's teeth. With
  ``durability=fsync`` (the server made durable by issue 9) the same run must be valid.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import chaos.__main__ as chaos_main
from chaos.faults import power_failure
from chaos.nemesis import DOCKER_KINDS, KINDS, Nemesis, check_target, parse_kinds
from chaos.powerfs import fuse_unavailable_reason, is_mounted
from chaos.runner import Progress, RunConfig, every_node_exited, open_target, run
from chaos.target import ChaosTarget
from tests.helpers.chaos_runs import describe, require_valid

FUSE_UNAVAILABLE = fuse_unavailable_reason()
needs_fuse = pytest.mark.skipif(FUSE_UNAVAILABLE is not None, reason=f"powerfs cannot mount here: {FUSE_UNAVAILABLE}")
POWER_SEED = 4242


# ------------------------------------------------------------------ refused where it cannot work
def test_power_is_a_kind_but_all_has_it_only_with_powerfs():
    assert "power" in KINDS and "power" not in DOCKER_KINDS
    assert "power" not in parse_kinds("all")
    assert "power" in parse_kinds("all", power_fs=True)
    assert parse_kinds("power,kill") == ["power", "kill"]
    check_target(["power"], "local")  # the local target mounts powerfs when power is chosen


def test_docker_refuses_power_saying_why():
    with pytest.raises(ValueError, match=r"nemesis power not supported with --target docker: a power failure "
                                         r"needs each node's data directory on its own powerfs mount"):
        check_target(["kill", "power"], "docker")
    with pytest.raises(ValueError, match="powerfs and the power nemesis need the local target"):
        open_target(RunConfig(target="docker", nemesis=["power"]), Path("unused"), Progress(quiet=True))


def test_the_cli_refuses_power_on_docker_before_asking_docker(capsys):
    assert chaos_main.main(["--target", "docker", "--nemesis", "power"]) == 2
    assert "nemesis power not supported with --target docker" in capsys.readouterr().err
    assert chaos_main.main(["--target", "docker", "--power-fs", "--nemesis", "kill"]) == 2
    assert "--power-fs needs --target local" in capsys.readouterr().err


def fake_target(power: Any = None, leader: int | None = 0) -> Any:
    """What the nemesis sees of a target: three nodes, a leader, and maybe power failures."""
    nodes = [SimpleNamespace(node_id=f"node-{i}", paused=False, up=True) for i in range(3)]
    for node in nodes:
        node.running = lambda node=node: node.up
    started: list[int] = []
    waited: list[list[int]] = []

    def start_node(i: int, wait: bool = True, timeout_s: float | None = None) -> None:
        nodes[i].up = True
        started.append(i)

    target = SimpleNamespace(target="local", nodes=nodes, link_faults=lambda: object(), node_isolation=lambda: None,
                             leader=lambda: leader, running_indices=lambda: [i for i, n in enumerate(nodes) if n.up],
                             start_node=start_node, wait_for_http=lambda indices: waited.append(list(indices)),
                             started=started, waited=waited)
    if power is not None:
        target.power_failure = lambda: power
    return target


def test_the_local_target_without_powerfs_refuses_power():
    target = fake_target()
    assert power_failure(target) is None
    with pytest.raises(ValueError, match="nemesis power not supported with --target local without --power-fs"):
        Nemesis(target, history=None, seed=1, kinds=["kill", "power"])


# ------------------------------------------------------------------ the fault
class RecordingPower:
    """lose_power as the local target does it, recorded: the nodes go down, their disks report."""

    def __init__(self) -> None:
        self.target: Any = None
        self.calls: list[list[int]] = []

    def lose_power(self, indices):
        self.calls.append(list(indices))
        for i in indices:
            self.target.nodes[i].up = False
        return {i: {"drop_unsynced": True, "bytes_dropped": 4096 * (i + 1)} for i in indices}


@pytest.mark.parametrize("variant, expected", [
    ("power-leader", [[1]]), ("power-follower", None), ("power-minority", None), ("power-all", [[0, 1, 2]]),
])
def test_the_fault_cuts_the_power_of_the_chosen_nodes_and_restarts_them(monkeypatch, variant, expected):
    power = RecordingPower()
    target = fake_target(power, leader=1)
    power.target = target
    nemesis = Nemesis(target, history=None, seed=1, kinds=["power"])
    assert nemesis.faults.power is power
    monkeypatch.setattr(random.Random, "choice", lambda self, seq: variant if variant in seq else seq[0])
    fault = nemesis.faults.begin("power", random.Random(3))
    assert fault is not None and fault.f == variant
    (cut,) = power.calls
    if expected is not None:
        assert power.calls == expected
    elif variant == "power-follower":
        assert cut == [0]  # the first follower (choice is rigged), never the leader
    else:
        assert len(cut) == 1  # a minority of 3
    assert fault.nodes == cut and not any(target.nodes[i].up for i in cut)
    assert fault.details["lost_power"] == [f"node-{i}" for i in cut]
    assert fault.details["dropped"] == {f"node-{i}": {"drop_unsynced": True, "bytes_dropped": 4096 * (i + 1)} for i in cut}
    fault.stop()
    assert target.started == cut and target.waited == [cut]
    assert all(node.up for node in target.nodes)


# ------------------------------------------------------------------ after a failed heal
class StartingNodes:
    """What every_node_exited sees of a target after a heal: nodes that each, when waited for,
    answer (``"answers"``), exit (``"exits"``) or never settle (``"hangs"``)."""

    def __init__(self, fates: list[str]) -> None:
        self.fates = fates
        self.up = [True] * len(fates)
        self.waits: list[list[int]] = []

    def running_indices(self) -> list[int]:
        return [i for i, up in enumerate(self.up) if up]

    def wait_for_http(self, indices: list[int], timeout_s: float) -> None:
        self.waits.append(list(indices))
        for i in indices:
            if self.fates[i] == "exits":
                self.up[i] = False
                raise RuntimeError(f"node-{i} exited with 1 while starting")  # as NodeStartError is
        if any(self.fates[i] == "hangs" for i in indices):
            raise TimeoutError("did not answer /healthz")


def test_every_node_exited_waits_for_each_start_to_end_and_says_whether_any_node_is_left():
    exiting = StartingNodes(["exits", "exits", "exits"])
    assert every_node_exited(exiting, 10.0)
    assert exiting.waits == [[0, 1, 2], [1, 2], [2]]
    assert not every_node_exited(StartingNodes(["exits", "answers", "exits"]), 10.0)
    assert not every_node_exited(StartingNodes(["exits", "hangs", "exits"]), 10.0)
    assert not every_node_exited(StartingNodes(["exits", "exits", "exits"]), 0.0)  # no time to look: unknown


# ------------------------------------------------------------------ whole runs (issue 9)
def nemesis_starts(out: Path, prefix: str) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in (out / "history.jsonl").read_text().splitlines() if line.strip()]
    return [line["value"] for line in lines if line.get("process") == "nemesis" and str(line.get("f")).startswith(prefix)
            and line["value"].get("phase") == "start"]


def cut_every_node(cluster: ChaosTarget) -> None:
    """Before the final heal: every node loses power at once (the whole-cluster case, every run)."""
    power = power_failure(cluster)
    assert power is not None
    power.lose_power(list(range(len(cluster.nodes))))


def power_run(tmp_path: Path, durability: str, seed: int = POWER_SEED) -> tuple[dict[str, Any], str | None]:
    """A short seeded run of the power nemesis, ending with every node losing power; returns its
    document and, when the heal could not restart a node, why. No mount may be left behind."""
    overrides = {"durability": durability}
    # Short waits after the heal: with the unsynced journal no node may come back at all.
    config = RunConfig(nodes=3, time_limit_s=30, nemesis=["power"], seed=seed, out=tmp_path, workers=5,
                       node_overrides=overrides, before_heal=cut_every_node, recovery_timeout_s=20.0,
                       drain_timeout_s=30.0, convergence_timeout_s=15.0)
    document: dict[str, Any] = run(config, Progress(quiet=True))
    failure = document["results"]["runtime"]["recovery"].get("heal_error")
    mounts = [tmp_path / "cluster" / f"node-{i}" / "data" for i in range(3)]
    assert not any(is_mounted(m) for m in mounts), "a powerfs mount was left behind"
    starts = nemesis_starts(tmp_path, "power-")
    assert starts and all(start["lost_power"] for start in starts), "no power failure happened"
    return document, failure


@needs_fuse
@pytest.mark.chaos
@pytest.mark.timeout(420)
@pytest.mark.expected_log_errors(r"ValueError: cannot mmap an empty file")  # a node that cannot restart
def test_power_failures_lose_acknowledged_commits_when_the_journal_is_not_synced(tmp_path):
    """The checker's teeth against power failures (issue 9). pysyncobj's journal is an mmap'd file
    never synced before an entry is acknowledged, and its term/vote file is replaced without fsync:
    a power failure must lose acknowledged commits, or leave a node unable to restart (a journal
    of 0 bytes: "cannot mmap an empty file"). It runs with ``durability=os``, the unsynced journal,
    and must keep failing; the durable server is the next test's."""
    document, failure = power_run(tmp_path, "os")
    assert not document["valid"], describe(document)
    if failure is not None:  # the heal could not restart a node from what its disk kept
        assert "exited" in failure, failure
        assert not document["results"]["convergence"]["valid"], describe(document)
        return
    total = document["results"]["total_queue"]
    assert not total["valid"] and total["lost_count"] > 0, describe(document)


@needs_fuse
@pytest.mark.chaos
@pytest.mark.timeout(420)
@pytest.mark.parametrize("seed", [POWER_SEED, POWER_SEED + 1])
def test_with_durability_fsync_power_failures_lose_nothing(tmp_path, seed):
    """Issue 9's promise: an acknowledged commit survives power failures of one node, a minority,
    the leader and every node at once, and every node restarts from what its disk kept."""
    document, failure = power_run(tmp_path, "fsync", seed)
    assert failure is None, failure
    results = document["results"]
    assert results["stats"]["client_ops"] > 100, describe(document)
    assert results["runtime"]["drain"]["complete"], describe(document)
    require_valid(document)
