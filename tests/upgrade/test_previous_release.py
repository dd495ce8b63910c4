"""The previous release of rcq, run from this repository's history beside the code under test.

The base every upgrade test builds on: a cluster of the previous release works on its own (and
runs the old code, not this checkout), a cluster with one node restarted into the code under test
works in both directions (an old leader with a new follower, then a new leader with old
followers) and its replicas converge, and the machinery fails clearly when the history is missing.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from rcq.client import RcqClient
from rcq.local.cluster import LocalCluster
from rcq.local.releases import PREVIOUS_RELEASE, REPO_ROOT, Release, ReleaseUnavailable, materialise
from tests.helpers import CLUSTER_WAIT_S, LEADER_TIMEOUT_S
from tests.helpers.cluster import fresh_queue
from tests.upgrade.rolling import hand_over


def process_argv(pid: int) -> list[str]:
    """The command line a process was started with (Linux /proc)."""
    return Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").decode().split("\0")


def assert_runs(cluster: LocalCluster, i: int, release: Release | None) -> None:
    """Node ``i``'s process is the interpreter of ``release`` (None: of the code under test)."""
    pid = cluster.pids()[i]
    argv = process_argv(pid)
    wanted = sys.executable if release is None else str(release.python)
    assert argv[0] == wanted, f"node-{i} (pid {pid}) runs {argv}"
    assert argv[argv.index("-m") + 1: argv.index("-m") + 3] == ["rcq", "serve"], argv


async def enqueue_and_dequeue(cluster: LocalCluster, queue: str, values: list[str]) -> None:
    """A transaction's enqueue and another's dequeue of ``values``, then a one-request round trip,
    each committed through the leader (the client finds it)."""
    async with RcqClient(cluster.urls, **cluster.client_options()) as client:
        async with client.transaction() as tx:
            await tx.enqueue_batch(queue, values)
        async with client.transaction() as tx:
            taken = await tx.dequeue_batch(queue, len(values) + 1)
        assert sorted(v.decode() for v in taken) == sorted(values)
        await client.enqueue(queue, "one-request")
        assert await client.dequeue(queue, max_items=2) == [b"one-request"]
        assert await client.count(queue) == 0


# ------------------------------------------------------------------ the release itself
def test_the_previous_release_imports_its_own_source_not_this_checkout(
        previous_release: Release, monkeypatch: pytest.MonkeyPatch) -> None:
    # The Spark tests' conftest puts this checkout on PYTHONPATH for the whole run: the release must
    # still import its own source (and from any working directory: its interpreter runs with -P).
    monkeypatch.setenv("PYTHONPATH", str(REPO_ROOT))
    monkeypatch.chdir(REPO_ROOT)
    assert previous_release.commit == PREVIOUS_RELEASE
    rcq_file = previous_release.rcq_file()
    assert rcq_file.is_relative_to(previous_release.src), rcq_file
    assert not rcq_file.is_relative_to(REPO_ROOT / "rcq")


def test_a_config_for_the_previous_release_keeps_only_the_fields_it_knows(previous_release: Release) -> None:
    fields = previous_release.node_config_fields
    assert {"node_id", "http_port", "raft_address", "peers", "cluster_secret", "tokens_file"} <= fields
    config = {"node_id": "node-0", "http_port": 1, "not_a_field_of_any_release": True}
    assert previous_release.node_config(config) == {"node_id": "node-0", "http_port": 1}


def test_a_commit_that_is_not_in_the_history_is_named_in_a_clear_error(tmp_path: Path) -> None:
    missing = "0123456789abcdef0123456789abcdef01234567"
    with pytest.raises(ReleaseUnavailable, match=f"commit {missing} .*a clone of rcq with its history"):
        materialise(missing, tmp_path / "release")
    assert not (tmp_path / "release").exists()


def test_without_a_repository_materialise_says_so(tmp_path: Path) -> None:
    with pytest.raises(ReleaseUnavailable, match=f"commit {PREVIOUS_RELEASE} .*not a git repository"):
        materialise(PREVIOUS_RELEASE, tmp_path / "release", root=tmp_path)


# ------------------------------------------------------------------ clusters
@pytest.mark.cluster
async def test_a_cluster_of_the_previous_release_elects_commits_and_runs_the_old_code(
        previous_release: Release, previous_cluster: LocalCluster) -> None:
    for i in range(3):
        assert_runs(previous_cluster, i, previous_release)
        assert f"(release {previous_release.name}, " in previous_cluster.log_tail(i)
    previous_cluster.wait_for_leader(LEADER_TIMEOUT_S)
    await enqueue_and_dequeue(previous_cluster, fresh_queue("old"), ["a", "b", "c"])
    previous_cluster.wait_for_convergence(CLUSTER_WAIT_S, indices=range(3))


@pytest.mark.cluster
async def test_a_node_restarted_into_the_code_under_test_works_with_the_previous_release(
        previous_release: Release, previous_cluster: LocalCluster) -> None:
    cluster = previous_cluster
    cluster.wait_for_leader(LEADER_TIMEOUT_S)
    cluster.restart_node_as(0, None)
    assert_runs(cluster, 0, None)
    for i in (1, 2):
        assert_runs(cluster, i, previous_release)
    cluster.wait_for_applied(LEADER_TIMEOUT_S)  # node 0 has caught up with the old leader

    # The old code leads, the new code follows.
    if cluster.wait_for_leader(LEADER_TIMEOUT_S) == 0:
        hand_over(cluster, 1)
    await enqueue_and_dequeue(cluster, fresh_queue("old-leader"), ["a", "b"])
    # The new code leads, the old code follows, as after a rolling upgrade's hand-over.
    hand_over(cluster, 0)
    await enqueue_and_dequeue(cluster, fresh_queue("new-leader"), ["c", "d"])

    # Every node's /v1/cluster/digest the same, at the same applied index: the old and the new
    # code replicated and applied the same entries into the same state.
    converged = cluster.wait_for_convergence(CLUSTER_WAIT_S, indices=range(3))
    assert converged["applied_index"] > 0
