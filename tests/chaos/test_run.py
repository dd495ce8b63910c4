"""Whole chaos runs against real clusters: the short seeded CI run must pass, and the
harness must have teeth (a node that forgets acknowledged commits is caught)."""

from __future__ import annotations

import json

import pytest

from chaos.__main__ import docker_engine_error, main
from chaos.runner import Progress, RunConfig, run

pytestmark = pytest.mark.chaos

CI_SEED = 20240603
SAFETY_CHECKERS = ("total_queue", "atomicity", "aborted_return", "convergence")


def describe(document) -> str:
    return document["summary"] + "\nruntime: " + json.dumps(document["results"].get("runtime", {}), default=str)[:3000]


@pytest.mark.timeout(420)
def test_a_short_seeded_run_with_kill_pause_and_partition_is_valid(tmp_path):
    config = RunConfig(nodes=3, time_limit_s=60, nemesis=["kill", "pause", "partition"], seed=CI_SEED,
                       out=tmp_path, workers=5)
    document = run(config, Progress(quiet=True))
    results = document["results"]
    assert {"history.jsonl", "results.json", "summary.txt", "timeline.png"} <= {p.name for p in tmp_path.iterdir()}
    assert results["liveness"]["faults_count"] >= 3, describe(document)
    assert results["stats"]["client_ops"] > 100, describe(document)
    assert results["runtime"]["drain"]["complete"], describe(document)
    for name in SAFETY_CHECKERS:
        assert results[name]["valid"], describe(document)
    assert document["valid"], describe(document)


@pytest.mark.timeout(300)
def test_the_checker_catches_a_node_that_loses_acknowledged_commits(tmp_path):
    """Teeth: one node with an in-memory journal and no snapshots, killed during the run and at
    its end, comes back empty: every acknowledged enqueue still queued is lost."""
    config = RunConfig(
        nodes=1, time_limit_s=15, nemesis=["kill"], seed=7, out=tmp_path, workers=4,
        node_overrides={"unsafe_memory_journal": True, "log_compaction_min_entries": 1_000_000_000,
                        "log_compaction_min_time_s": 86_400.0},
        before_heal=lambda cluster: cluster.kill_node(0))
    document = run(config, Progress(quiet=True))
    total = document["results"]["total_queue"]
    assert not document["valid"], describe(document)
    assert not total["valid"] and total["lost_count"] > 0, describe(document)


def test_the_docker_target_says_plainly_when_there_is_no_engine(capsys):
    error = docker_engine_error()
    if error is None:
        pytest.skip("a Docker engine answers here")
    assert main(["--target", "docker", "--time-limit-s", "1"]) == 2
    assert "no Docker engine" in capsys.readouterr().err


def test_unknown_nemesis_names_are_refused(capsys):
    assert main(["--nemesis", "kill,meteor"]) == 2
    assert "unknown nemesis meteor" in capsys.readouterr().err
