"""The ``upgrade`` nemesis: nodes restarted into the previous release of rcq and back.

* where it cannot work it is refused, saying why (docker; a target given no previous release), and
  a run that needs the previous release refuses to start, naming the commit, when the history
  does not hold it;
* on a real chaos cluster given the previous release, one fault restarts a node into it and the
  next back into the code under test, the cluster at feature level 1 and converged throughout;
  a fault that would leave no majority running does nothing.
(The short seeded chaos run, tests/chaos/test_run.py, runs it among the other faults.)
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

import chaos.__main__ as chaos_main
import chaos.cluster as chaos_cluster
from chaos.cluster import ChaosCluster, previous_release
from chaos.faults import FaultMaker
from chaos.nemesis import DOCKER_KINDS, KINDS, MIXABLE, Nemesis, check_target, parse_kinds
from rcq.local.releases import PREVIOUS_RELEASE_NAME
from tests.helpers import CLUSTER_WAIT_S, LEADER_TIMEOUT_S

MISSING = "0123456789abcdef0123456789abcdef01234567"


# ------------------------------------------------------------------ where it works
def test_upgrade_is_a_kind_mixed_with_the_others_in_all_on_the_local_target_only(capsys):
    assert "upgrade" in KINDS and "upgrade" in MIXABLE and "upgrade" not in DOCKER_KINDS
    assert "upgrade" in parse_kinds("all")
    check_target(["upgrade", "kill"], "local")
    with pytest.raises(ValueError, match="nemesis upgrade not supported with --target docker: its nodes run the "
                                         "image built from this checkout only"):
        check_target(["kill", "upgrade"], "docker")
    assert chaos_main.main(["--target", "docker", "--nemesis", "upgrade"]) == 2
    assert "need the local target" in capsys.readouterr().err


def test_a_target_given_no_previous_release_refuses_upgrade():
    target = SimpleNamespace(target="local", nodes=[0, 1, 2], link_faults=lambda: object(), node_isolation=lambda: None,
                             previous_release=None, restart_node_as=lambda *a, **k: 0)
    with pytest.raises(ValueError, match="nemesis upgrade not supported with --target local: the target was given "
                                         "no previous release"):
        Nemesis(target, history=None, seed=1, kinds=["kill", "upgrade"])


def test_without_the_previous_release_in_the_history_a_run_with_upgrade_refuses_to_start(
        monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(chaos_cluster, "PREVIOUS_RELEASE", MISSING)
    out = tmp_path / "out"
    assert chaos_main.main(["--nemesis", "upgrade,kill", "--time-limit-s", "1", "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "the upgrade nemesis needs the previous release of rcq" in err and f"commit {MISSING}" in err, err
    assert not (out / "cluster").exists()  # no node was started


# ------------------------------------------------------------------ on a cluster
@pytest.fixture
def two_release_cluster(tmp_path: Path) -> Iterator[ChaosCluster]:
    release = previous_release(tmp_path / "release")
    cluster = ChaosCluster(3, seed=5, base_dir=tmp_path / "cluster", node_overrides={"feature_level_auto": False},
                           previous_release=release)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.close()


@pytest.mark.cluster
def test_each_fault_restarts_a_node_into_the_other_version_and_the_cluster_stays_at_level_1(
        two_release_cluster: ChaosCluster) -> None:
    cluster = two_release_cluster
    cluster.wait_for_leader(LEADER_TIMEOUT_S)
    maker = FaultMaker(cluster, others_active=lambda: False)
    seen: list[str] = []
    # Every fault flips one node, and at most a minority (one of three) runs the previous release:
    # the second fault at the latest picks the node of the release, so both directions are seen.
    for seed in range(4):
        before = maker.versions()
        fault = maker.begin("upgrade", random.Random(seed))
        assert fault is not None
        (i,) = fault.nodes
        name = f"node-{i}"
        assert fault.f == ("downgrade" if before[name] == "current" else "upgrade"), fault
        assert fault.details["from"] == before[name]
        assert fault.details["to"] == (PREVIOUS_RELEASE_NAME if before[name] == "current" else "current")
        assert cluster.nodes[i].release is (cluster.previous_release if fault.f == "downgrade" else None)
        fault.stop()
        assert fault.outcome["versions"] == {**before, name: fault.details["to"]}
        assert list(fault.outcome["versions"].values()).count(PREVIOUS_RELEASE_NAME) <= 1
        levels = fault.outcome["feature_levels"]
        assert levels == dict.fromkeys(fault.outcome["versions"], 1), levels  # rcq 0.2.0 reports its level too
        seen.append(fault.f)
        cluster.wait_for_leader(LEADER_TIMEOUT_S)
        if {"upgrade", "downgrade"} <= set(seen):
            break
    assert {"upgrade", "downgrade"} <= set(seen), seen
    cluster.wait_for_convergence(CLUSTER_WAIT_S, range(3))

    # With one node down, restarting another would leave no majority running: nothing is done.
    cluster.kill_node(0)
    assert maker.begin("upgrade", random.Random(2)) is None
    cluster.start_node(0)
