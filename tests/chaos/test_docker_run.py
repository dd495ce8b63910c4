"""A short seeded chaos run through containers: ``--target docker`` on the engine ``auto`` picks
(Docker with its compose plugin, else Podman with podman-compose), docker-compose.yml's three
nodes killed, paused, cut off the compose network and wiped while the workload runs; the run must
be VALID and leave no container, volume or network behind. Skipped, saying why, where no engine
runs. ``fixed_ports``: the compose file publishes 127.0.0.1:7001..7003 (one worker runs every such
test, so the image tests/integration/test_compose.py built in this process is reused)."""

from __future__ import annotations

import json

import pytest

from chaos.history import read_history
from chaos.runner import Progress, RunConfig, run
from cluster.engine import project_leftovers
from tests.helpers.containers import engine_or_skip, fixed_ports_lock, node_image

pytestmark = [pytest.mark.fixed_ports, pytest.mark.chaos]

DOCKER_SEED = 7  # its schedule makes every fault below at least once within the time limit
FAULTS = ("kill", "pause", "partition", "wipe")
SAFETY_CHECKERS = ("total_queue", "atomicity", "aborted_return", "convergence")


@pytest.mark.timeout(900)  # the host's compose ports' lock may be waited for first
def test_a_short_seeded_run_through_containers_with_kill_pause_disconnect_and_wipe_is_valid(tmp_path):
    engine = engine_or_skip()
    node_image(engine)  # built once per process; the run's own build then reuses it
    config = RunConfig(target="docker", engine=engine.name, nodes=3, time_limit_s=40, nemesis=list(FAULTS),
                       seed=DOCKER_SEED, out=tmp_path, workers=4)
    with fixed_ports_lock(f"chaos seed {DOCKER_SEED}"):
        document = run(config, Progress())
    results = document["results"]
    described = document["summary"] + "\nruntime: " + json.dumps(results.get("runtime", {}), default=str)[:3000]
    started = {line["f"] for line in read_history(tmp_path / "history.jsonl")
               if line.get("process") == "nemesis" and (line.get("value") or {}).get("phase") == "start"}
    for fault in FAULTS:  # kill-leader, pause-follower, partition-leader, wipe, ...
        assert any(f.startswith(fault) for f in started), f"no {fault} fault started: {sorted(started)}"
    assert results["stats"]["client_ops"] > 100, described
    assert results["runtime"]["drain"]["complete"], described
    for name in SAFETY_CHECKERS:
        assert results[name]["valid"], described
    assert document["valid"], described
    assert project_leftovers(engine, f"rcq-chaos-{DOCKER_SEED}") == {"containers": [], "volumes": [], "networks": []}
