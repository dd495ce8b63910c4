"""docker-compose.yml for real, as an operator runs it: the image built (once per test process, by
``python -m cluster image``'s code), the project up with the engine ``auto`` picks (Docker with its
compose plugin, else Podman with podman-compose), and the nodes used with plain ``curl`` on their
published ports. Every node ready and healthy; a commit through each node's port; the leader's
container killed, another leader commits within seconds; the container started again catches up
to the same state digest; ``down -v`` leaves no container, volume or network. Skipped, saying why,
where no engine runs.

The tests share one module-scoped project, each taking it as it finds it (a test given a fresh
project passes too); ``fixed_ports``: the compose file publishes 127.0.0.1:7001..7003, and the
project holds the host's lock of those ports while it is up.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from rcq.testing import wait_until
from tests.helpers import (
    COMPOSE_CONVERGED_TIMEOUT_S,
    COMPOSE_FAILOVER_TIMEOUT_S,
    COMPOSE_HEALTHY_TIMEOUT_S,
    COMPOSE_READY_TIMEOUT_S,
)
from tests.helpers.containers import NODES, ComposeProject, curl_json, engine_or_skip, fixed_ports_lock, node_image

pytestmark = [pytest.mark.fixed_ports, pytest.mark.cluster, pytest.mark.timeout(900)]  # a first build included

PROJECT = "rcq-compose-test"
QUEUE = "compose"


@pytest.fixture(scope="module")
def project() -> Iterator[ComposeProject]:
    engine = engine_or_skip()
    built = node_image(engine)
    print(f"[compose] {engine.version}; image {built.image} {built.size_bytes / 1e6:.0f} MB on {built.base}")
    compose = ComposeProject(engine, PROJECT)
    with fixed_ports_lock(PROJECT):
        compose.compose("down", "-v", "--remove-orphans")  # an interrupted run's leftovers
        try:
            compose.compose("up", "-d")
            yield compose
        finally:
            compose.compose("down", "-v", "--remove-orphans")


def ready(project: ComposeProject, i: int) -> bool:
    status, answer = curl_json(project.url(i) + "/readyz")  # not listening yet: curl fails, the wait asks again
    return status == 200 and bool(answer.get("ready"))


def agreed_leader(project: ComposeProject, indices: list[int]) -> list[int] | None:
    """[the node every one of ``indices`` names as leader, serving] (a list: node 0 is falsy), or None."""
    views = {i: curl_json(project.url(i) + "/v1/cluster", project.token)[1] for i in indices}
    named = {view.get("leader_id") for view in views.values()}
    if len(named) != 1 or None in named:
        return None
    leader = int(str(named.pop()).removeprefix("node-"))
    return [leader] if leader in views and views[leader].get("serving") else None


def wait_for_agreed_leader(project: ComposeProject, indices: list[int]) -> int:
    (leader,) = wait_until(lambda: agreed_leader(project, indices), COMPOSE_READY_TIMEOUT_S,
                           what=f"a leader nodes {indices} agree on")
    return leader


def enqueue(project: ComposeProject, i: int, value: str) -> dict:
    status, answer = curl_json(f"{project.url(i)}/v1/queues/{QUEUE}/enqueue", project.token, {"items": [value]})
    assert status == 200 and answer.get("committed") is True, (status, answer)
    return answer


def queued(project: ComposeProject, i: int) -> int:
    """The queue's count on node ``i`` (0 before its first enqueue)."""
    status, queue = curl_json(f"{project.url(i)}/v1/queues/{QUEUE}", project.token)
    assert status == 200, queue
    return int(queue["count"])


def test_every_node_is_ready_and_healthy(project: ComposeProject) -> None:
    started = time.monotonic()
    for i in range(NODES):
        wait_until(lambda i=i: ready(project, i), COMPOSE_READY_TIMEOUT_S, what=f"node-{i} to be ready")
    print(f"[compose] every node ready {time.monotonic() - started:.1f} s after up")
    for i in range(NODES):
        wait_until(lambda i=i: project.healthy(i), COMPOSE_HEALTHY_TIMEOUT_S, what=f"node-{i}'s healthcheck to pass")
    status, refusal = curl_json(project.url(0) + "/v1/cluster")  # without the token
    assert status == 401, refusal


def test_a_commit_through_each_nodes_published_port_with_curl(project: ComposeProject) -> None:
    leader = wait_for_agreed_leader(project, list(range(NODES)))
    before = queued(project, leader)
    for i in range(NODES):  # a follower forwards to the leader at its peer URL (docker-compose.yml's peer_urls)
        answer = enqueue(project, i, f"through node-{i}")
        assert answer["enqueued"] == 1
    assert queued(project, leader) == before + NODES


def test_the_leaders_container_killed_another_leader_commits_within_seconds(project: ComposeProject) -> None:
    leader = wait_for_agreed_leader(project, list(range(NODES)))
    before = queued(project, leader)
    others = [i for i in range(NODES) if i != leader]
    project.cli("kill", "--signal", "KILL", project.container(leader))
    killed_at = time.monotonic()

    def committed_elsewhere() -> list[int] | None:
        agreed = agreed_leader(project, others)
        if agreed is None:
            return None
        (new_leader,) = agreed
        status, answer = curl_json(f"{project.url(others[0])}/v1/queues/{QUEUE}/enqueue", project.token,
                                   {"items": ["after the kill"]})
        return [new_leader] if status == 200 and answer.get("committed") else None

    (new_leader,) = wait_until(committed_elsewhere, COMPOSE_FAILOVER_TIMEOUT_S,
                               what="another leader and a commit after the leader's container was killed")
    print(f"[compose] node-{leader} killed: node-{new_leader} leads and committed {time.monotonic() - killed_at:.1f} s later")
    assert new_leader != leader

    project.cli("start", project.container(leader))
    started_at = time.monotonic()
    wait_until(lambda: ready(project, leader), COMPOSE_READY_TIMEOUT_S, what=f"node-{leader} ready again")

    def one_digest() -> dict | None:
        digests = [curl_json(project.url(i) + "/v1/cluster/digest", project.token)[1] for i in range(NODES)]
        return digests[0] if len({(d.get("digest"), d.get("applied_index")) for d in digests}) == 1 else None

    digest = wait_until(one_digest, COMPOSE_CONVERGED_TIMEOUT_S, what="every node's state digest equal")
    print(f"[compose] node-{leader} started again: every digest {digest['digest'][:12]} at index "
          f"{digest['applied_index']} {time.monotonic() - started_at:.1f} s later")
    assert queued(project, leader) == before + 1  # the commit made without it, on the node killed


def test_down_leaves_no_container_volume_or_network(project: ComposeProject) -> None:
    assert all(project.leftovers().values())  # the project is there before
    started = time.monotonic()
    project.compose("down", "-v", "--remove-orphans")
    print(f"[compose] down -v took {time.monotonic() - started:.1f} s")
    assert project.leftovers() == {"containers": [], "volumes": [], "networks": []}
