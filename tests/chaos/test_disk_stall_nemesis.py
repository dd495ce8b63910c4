"""The ``disk-stall`` nemesis: a node's disk (its powerfs mount) stalled for a few seconds, every
sync on it hanging, then released.

* where it cannot work it is refused, saying why (docker; the local target without powerfs), and
  ``all`` has it only with powerfs, as ``power``;
* the fault stalls the disk of p0's leader or of a random node, releases it by itself after the
  drawn time or at its stop if sooner, never twice, and its start and stop lines say what
  happened (against a recording fake target);
* the chaos cluster stalls and releases one node's mount, and its heal and close release every
  stalled disk (a real mount, nodes never started).
"""

from __future__ import annotations

import asyncio
import os
import random
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import chaos.__main__ as chaos_main
import chaos.faults.disks as disks_module
from chaos.cluster import ChaosCluster
from chaos.faults import disk_stall
from chaos.nemesis import DOCKER_KINDS, KINDS, MIXABLE, Nemesis, check_target, parse_kinds
from chaos.powerfs import fuse_unavailable_reason
from chaos.runner import Progress, RunConfig, open_target
from rcq.local.cluster import LocalCluster
from rcq.local.nodes import STOP_TIMEOUT_S
from rcq.testing import wait_until
from tests.helpers import LOCAL_WAIT_S

FUSE_UNAVAILABLE = fuse_unavailable_reason()
needs_fuse = pytest.mark.skipif(FUSE_UNAVAILABLE is not None, reason=f"powerfs cannot mount here: {FUSE_UNAVAILABLE}")


# ------------------------------------------------------------------ where it works
def test_disk_stall_is_a_mixable_kind_but_all_has_it_only_with_powerfs():
    assert "disk-stall" in KINDS and "disk-stall" in MIXABLE and "disk-stall" not in DOCKER_KINDS
    assert "disk-stall" not in parse_kinds("all")
    assert "disk-stall" in parse_kinds("all", power_fs=True) and "power" in parse_kinds("all", power_fs=True)
    assert parse_kinds("disk-stall,kill") == ["disk-stall", "kill"]
    check_target(["disk-stall"], "local")  # the local target mounts powerfs when disk-stall is chosen


def test_docker_refuses_disk_stall_saying_why(capsys):
    with pytest.raises(ValueError, match=r"nemesis disk-stall not supported with --target docker: a stalled disk "
                                         r"needs each node's data directory on its own powerfs mount"):
        check_target(["kill", "disk-stall"], "docker")
    with pytest.raises(ValueError, match=r"nemesis power, disk-stall not supported .*: a power failure and a "
                                         r"stalled disk need each node's data directory"):
        check_target(["power", "disk-stall"], "docker")
    with pytest.raises(ValueError, match="powerfs and the power nemesis need the local target"):
        open_target(RunConfig(target="docker", nemesis=["disk-stall"]), Path("unused"), Progress(quiet=True))
    assert chaos_main.main(["--target", "docker", "--nemesis", "disk-stall"]) == 2
    assert "nemesis disk-stall not supported with --target docker" in capsys.readouterr().err


def test_a_stall_is_short_enough_for_a_kill_to_wait_it_out():
    """A node killed while its sync hangs exits only once released: the longest stall must end
    before a kill gives up waiting for the node to exit."""
    low, high = disks_module.DISK_STALL_S
    assert 0 < low < high < STOP_TIMEOUT_S


class RecordingDisks:
    """stall_disk / release_disk as the chaos cluster does them, recorded."""

    def __init__(self, hanging: int = 3) -> None:
        self.calls: list[tuple[str, int]] = []
        self.hanging = hanging
        self.released = threading.Event()

    def stall_disk(self, i: int) -> dict[str, Any]:
        self.calls.append(("stall", i))
        return {"stalled": True, "syncs_blocked": 0}

    def release_disk(self, i: int) -> dict[str, Any]:
        self.calls.append(("release", i))
        self.released.set()
        return {"stalled": False, "syncs_blocked": 0, "released": self.hanging}


def fake_target(disks: Any = None, leader: int | None = 1) -> Any:
    """What the nemesis sees of a target: three nodes, a leader, and maybe stalled disks."""
    nodes = [SimpleNamespace(node_id=f"node-{i}", paused=False) for i in range(3)]
    healed: list[bool] = []
    target = SimpleNamespace(target="local", nodes=nodes, link_faults=lambda: object(), node_isolation=lambda: None,
                             leader=lambda: leader, heal=lambda: healed.append(True), healed=healed)
    if disks is not None:
        target.disk_stall = lambda: disks
    return target


def test_the_local_target_without_powerfs_refuses_disk_stall():
    target = fake_target()
    assert disk_stall(target) is None
    with pytest.raises(ValueError, match="nemesis disk-stall not supported with --target local without --power-fs"):
        Nemesis(target, history=None, seed=1, kinds=["kill", "disk-stall"])


class Draws(random.Random):
    """A Random whose ``random()`` is ``value`` (the leader or not, and the stall's length: uniform
    uses it), its other draws seeded."""

    def __init__(self, value: float) -> None:
        super().__init__(7)
        self.value = value

    def random(self) -> float:
        return self.value


# ------------------------------------------------------------------ the fault
@pytest.mark.parametrize("draw, variant, target", [(0.1, "disk-stall-leader", 1), (0.9, "disk-stall-random", None)])
def test_the_fault_stalls_a_disk_and_its_stop_releases_it_once(draw, variant, target):
    disks = RecordingDisks()
    nemesis = Nemesis(fake_target(disks, leader=1), history=None, seed=1, kinds=["disk-stall"])
    assert nemesis.faults.disks is disks
    fault = nemesis.faults.begin("disk-stall", Draws(draw))
    assert fault is not None and fault.f == variant
    (stalled,) = fault.nodes
    assert target is None or stalled == target
    assert disks.calls == [("stall", stalled)]
    low, high = disks_module.DISK_STALL_S
    assert fault.details == {"disk": f"node-{stalled}", "hold_s": round(low + draw * (high - low), 2),
                             "leader": stalled == 1}
    fault.stop()  # before the drawn time: the stop releases it
    assert disks.calls == [("stall", stalled), ("release", stalled)]
    assert fault.outcome["released_by"] == "stop" and fault.outcome["syncs_released"] == 3
    fault.stop()
    assert disks.calls[-1] == ("release", stalled) and len(disks.calls) == 2  # released once only


def test_the_stall_ends_by_itself_after_the_drawn_time(monkeypatch):
    monkeypatch.setattr(disks_module, "DISK_STALL_S", (0.01, 0.02))
    disks = RecordingDisks()
    nemesis = Nemesis(fake_target(disks), history=None, seed=1, kinds=["disk-stall"])
    fault = nemesis.faults.begin("disk-stall", Draws(0.1))
    assert fault is not None
    wait_until(disks.released.is_set, LOCAL_WAIT_S, what="the stall's own timer to release it")
    fault.stop()
    assert [call for call, _ in disks.calls] == ["stall", "release"]
    assert fault.outcome["released_by"] == "timer" and fault.outcome["stalled_s"] < LOCAL_WAIT_S


class Recorder:
    """The history, as the nemesis writes it."""

    def __init__(self) -> None:
        self.lines: list[dict[str, Any]] = []

    def info(self, process: str, f: str, value: Any) -> Any:
        self.lines.append({"process": process, "f": f, "value": value})
        return SimpleNamespace(time_s=float(len(self.lines)))


def test_the_history_has_its_start_and_stop_lines_and_a_fault_window_and_the_heal_releases(monkeypatch):
    monkeypatch.setattr(random.Random, "random", lambda self: 0.1)  # the leader's disk
    disks, history = RecordingDisks(hanging=2), Recorder()
    target = fake_target(disks, leader=2)
    nemesis = Nemesis(target, history, seed=1, kinds=["disk-stall"])
    asyncio.run(nemesis._start("disk-stall", random.Random(0)))
    assert disks.calls == [("stall", 2)]
    asyncio.run(nemesis.heal())  # stops the fault (released), then heals the target
    assert target.healed == [True]
    start, stop = history.lines
    assert start["f"] == stop["f"] == "disk-stall-leader"
    assert start["value"]["phase"] == "start" and start["value"]["nodes"] == ["node-2"]
    assert start["value"]["disk"] == "node-2" and start["value"]["leader"] is True and "hold_s" in start["value"]
    assert stop["value"]["phase"] == "stop" and stop["value"]["released_by"] == "stop"
    assert stop["value"]["syncs_released"] == 2 and "stalled_s" in stop["value"]
    assert nemesis.windows == [{"id": 0, "f": "disk-stall-leader", "nodes": ["node-2"], "start_s": 1.0, "stop_s": 2.0}]
    assert disks.calls == [("stall", 2), ("release", 2)]


# ------------------------------------------------------------------ the chaos cluster
def test_the_chaos_cluster_without_powerfs_has_no_disk_stalls(tmp_path):
    cluster = ChaosCluster(3, seed=5, base_dir=tmp_path / "cluster")
    try:
        assert cluster.disk_stall() is None and disk_stall(cluster) is None
        with pytest.raises(RuntimeError, match="no stalled disks without powerfs: make the cluster with power_fs=True"):
            cluster.stall_disk(0)
        with pytest.raises(RuntimeError, match="no stalled disks without powerfs"):
            cluster.release_disk(0)
    finally:
        cluster.close()


def hanging_fsync(path: Path) -> list[object]:
    """fsync of ``path`` in a thread; the list it returns gets "synced" or the error once it returns."""
    outcome: list[object] = []

    def sync() -> None:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            os.fsync(fd)
            outcome.append("synced")
        except OSError as exc:
            outcome.append(exc)
        finally:
            os.close(fd)

    threading.Thread(target=sync, daemon=True).start()
    return outcome


@needs_fuse
def test_the_chaos_cluster_stalls_one_disk_and_its_heal_and_close_release_every_one(tmp_path, monkeypatch):
    cluster = ChaosCluster(2, seed=5, base_dir=tmp_path / "cluster", power_fs=True)
    try:
        assert disk_stall(cluster) is cluster
        first, second = cluster.power_mounts
        assert cluster.stall_disk(0)["stalled"] and not second.stats()["stalled"]  # one node's disk only
        outcome = hanging_fsync(cluster.nodes[0].data_dir / "journal")
        wait_until(lambda: first.stats()["syncs_blocked"] == 1, LOCAL_WAIT_S, what="the sync to hang")
        assert not outcome
        assert cluster.release_disk(0)["released"] == 1
        wait_until(lambda: outcome, LOCAL_WAIT_S, what="the released sync to return")
        assert outcome == ["synced"]
        # The heal releases every stalled disk (the nodes' restarts left out: they were never started).
        monkeypatch.setattr(LocalCluster, "heal", lambda self, timeout_s=None: [])
        cluster.stall_disk(0)
        cluster.stall_disk(1)
        cluster.heal()
        assert not first.stats()["stalled"] and not second.stats()["stalled"]
        # And so does the close, before it unmounts: a sync hanging then returns, not cut off.
        cluster.stall_disk(1)
        outcome = hanging_fsync(cluster.nodes[1].data_dir / "journal")
        wait_until(lambda: second.stats()["syncs_blocked"] == 1, LOCAL_WAIT_S, what="the sync to hang")
    finally:
        cluster.close()
    wait_until(lambda: outcome, LOCAL_WAIT_S, what="the sync to return at the close")
    assert outcome == ["synced"]
    assert not first.mounted and not second.mounted
