"""Rolling upgrades from the previous release (rcq 0.2.0) to the code under test, and back.

Upgrade: a 3-node cluster of the previous release at its highest level (3) under load is upgraded
one node at a time, the followers first and the leader last, after it handed leadership to an
upgraded node; nothing acknowledged is lost or duplicated and every replica ends with the same
digest. The cluster stays at level 3 (what rcq 0.2.0 reads) while any old node is a member: a
raise to 4 is refused naming it, and creating a partition (level 4's feature) is refused with 409
feature_level_required and creates nothing. Once every node is upgraded the level is raised (by
hand, or by the leader itself within a round of its 5 s check); then a partition is created, runs
on its own processes and commits, and its directory survives a node's restart from a snapshot. A
node of the new code joins an old cluster, which stays at level 3.

Downgrade: below the level the cluster runs at, the new code refuses (a raise that a member held
at level 1 cannot read) or stops (exit 78, CRITICAL, both versions named) on the level entry or
the snapshot it meets; rcq 0.2.0 does the same on a level-4 snapshot: it stops, naming both
versions, and the code under test reads the snapshot again.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator

import pytest

from rcq.client import FeatureLevelUnsupported, RcqClient
from rcq.local.cluster import LocalCluster
from rcq.local.releases import Release
from rcq.server.core.features import LEVEL_BASE, LEVEL_MAX
from rcq.server.raft.unreadable import UNREADABLE_EXIT_CODE
from rcq.testing import async_wait_until, wait_until
from rcq.version import rcq_version
from tests.helpers import CLUSTER_WAIT_S, LEADER_TIMEOUT_S, QUIET_CLUSTER_WAIT_S
from tests.helpers.cluster import fresh_queue
from tests.upgrade.rolling import (
    Load,
    client_of,
    create_partition,
    hand_over,
    levels,
    partition_led,
    snapshot_now,
)

HELD = {"feature_level_auto": False}  # nodes raise nothing by themselves
PREVIOUS_LEVEL_MAX = 3  # what rcq 0.2.0 reads
AUTO_RAISE_BOUND = 15.0  # the leader checks every 5 s; a raise comes within a round or two

pytestmark = pytest.mark.cluster


@pytest.fixture
def held_previous_cluster(previous_release: Release) -> Iterator[LocalCluster]:
    """A started 3-node cluster of the previous release whose nodes hold the level, with partition
    ports (which the previous release's configs leave out, and the upgraded nodes' keep)."""
    with LocalCluster(3, release=previous_release, node_overrides=HELD, partitions_max=2) as cluster:
        yield cluster


@pytest.fixture
def held_cluster() -> Iterator[LocalCluster]:
    """A started 3-node cluster of the code under test that holds its level until asked."""
    with LocalCluster(3, node_overrides=HELD) as cluster:
        yield cluster


async def upgrade(cluster: LocalCluster, i: int) -> None:
    """Node ``i`` restarted into the code under test on its data; wait until every node caught up."""
    await asyncio.to_thread(cluster.restart_node_as, i, None)
    await asyncio.to_thread(cluster.wait_for_applied, CLUSTER_WAIT_S)


async def round_trip(cluster: LocalCluster, urls: list[str] | None = None, placed_in: str | None = None) -> None:
    """One enqueue and its dequeue, committed (in a queue placed in ``placed_in`` first, through p0)."""
    queue = fresh_queue("trip")
    if placed_in is not None:
        leader = cluster.url(cluster.wait_for_leader(LEADER_TIMEOUT_S))
        placed = cluster.poll_json(f"{leader}/v1/queues/{queue}", method="PUT", body={"partitions": [placed_in]})
        assert placed["settings"]["partitions"] == [placed_in], placed
    async with RcqClient(urls or cluster.urls, request_timeout_s=10.0, retry_timeout_s=CLUSTER_WAIT_S,
                         channel=False, **cluster.client_options()) as client:
        await client.enqueue(queue, "x")
        assert await client.dequeue(queue, max_items=2) == [b"x"]


def partition_refused(cluster: LocalCluster, indices: list[int], active: int) -> None:
    """Creating a partition (level 4's feature) is refused, clearly, and creates nothing."""
    answer = create_partition(cluster, "p1", indices)
    assert answer["error"]["code"] == "feature_level_required", answer
    assert re.search(rf"creating a partition needs feature level 4; the cluster runs at {active}\. Upgrade every",
                     answer["error"]["message"]), answer
    for i in indices:
        names = [r["name"] for r in cluster.poll_json(cluster.url(i) + "/v1/cluster/partitions")["partitions"]]
        assert names == ["p0"], names


def wait_exit(cluster: LocalCluster, i: int) -> int:
    """The exit code of node ``i``, which is to stop on its own."""
    wait_until(lambda: i in cluster.unexpected_exits(), CLUSTER_WAIT_S, what=f"node-{i} to exit")
    code = cluster.unexpected_exits()[i]  # an exited process keeps its code
    cluster.nodes[i].forget()
    return code


# ------------------------------------------------------------------ upgrades
async def test_a_rolling_upgrade_under_load_loses_nothing_and_partitions_wait_for_the_raise(
        held_previous_cluster: LocalCluster) -> None:
    cluster = held_previous_cluster
    old_leader = cluster.wait_for_leader(LEADER_TIMEOUT_S)
    followers = [i for i in range(3) if i != old_leader]
    async with client_of(cluster) as client:  # the previous release at its own highest level
        assert (await client.raise_feature_level(PREVIOUS_LEVEL_MAX))["level"] == PREVIOUS_LEVEL_MAX
    load = Load(cluster)
    try:
        await load.commits_more(what="on the previous release")
        # rcq 0.2.0 has no partitions: the route is not there.
        answer = create_partition(cluster, "p1")
        assert answer["error"]["code"] == "not_found", answer
        for i in followers:  # the followers first, one at a time, the load committing throughout
            await upgrade(cluster, i)
            await load.commits_more(what=f"after node-{i}'s upgrade")
        # The old leader hands over to an upgraded node: the new code leads, one old node follows.
        await asyncio.to_thread(hand_over, cluster, followers[0])
        await load.commits_more(what="under the new leader")
        async with client_of(cluster, followers) as client:
            report = await client.feature_level()
            assert report["active"] == PREVIOUS_LEVEL_MAX and report["auto"] is False
            members = {m["node_id"]: (m["version"], m["level_max"]) for m in report["members"]}
            assert members == {f"node-{old_leader}": ("0.2.0", PREVIOUS_LEVEL_MAX),
                               **{f"node-{i}": (rcq_version(), LEVEL_MAX) for i in followers}}
            # The raise is refused while the old node is a member, naming it.
            with pytest.raises(FeatureLevelUnsupported,
                               match=rf"not read by node-{old_leader} \(rcq 0\.2\.0, up to level 3\)"):
                await client.raise_feature_level(LEVEL_MAX)
        partition_refused(cluster, followers, PREVIOUS_LEVEL_MAX)
        assert await snapshot_now(cluster, followers[1]) == 4  # what rcq 0.2.0 writes, and reads
        assert levels(cluster) == [PREVIOUS_LEVEL_MAX] * 3

        await upgrade(cluster, old_leader)  # the last one
        await load.commits_more(what="with every node upgraded")
        assert levels(cluster) == [PREVIOUS_LEVEL_MAX] * 3  # held: nothing raised it
        partition_refused(cluster, list(range(3)), PREVIOUS_LEVEL_MAX)  # every node reads 4; the level is 3

        async with client_of(cluster) as client:
            assert await client.raise_feature_level(LEVEL_MAX) == \
                {"level": LEVEL_MAX, "previous": PREVIOUS_LEVEL_MAX, "changed": True}
        await async_wait_until(lambda: levels(cluster) == [LEVEL_MAX] * 3, CLUSTER_WAIT_S,
                               what=f"level {LEVEL_MAX} everywhere")
        # The feature works now: once the leader has recorded every node's ports, p1 is created,
        # runs on its own processes and commits.
        created = wait_until(lambda: None if (a := create_partition(cluster, "p1")).get("error", {}).get("code")
                             == "node_has_no_partition_ports" else a, CLUSTER_WAIT_S, what="p1 created")
        assert created["name"] == "p1" and len(created["members"]) == 3, created
        p1 = partition_led(cluster, "p1", 0)
        await round_trip(cluster, [p1["leader_url"]], placed_in="p1")
        await load.commits_more(what="at level 4")
        # The directory goes through a snapshot: a follower restarted from one still lists p1.
        follower = next(i for i in range(3) if i != cluster.wait_for_leader(LEADER_TIMEOUT_S))
        assert await snapshot_now(cluster, follower) == 4
        await asyncio.to_thread(cluster.stop_node, follower)
        await asyncio.to_thread(cluster.start_node, follower)
        await async_wait_until(lambda: levels(cluster, [follower]) == [LEVEL_MAX], CLUSTER_WAIT_S,
                               what=f"the restarted node at level {LEVEL_MAX}")
        partition_led(cluster, "p1", follower)
        await load.commits_more(what="after a restart from a level-4 snapshot")
        history = await load.finish()
    except BaseException:
        await load.cancel()
        raise
    assert len(history.acknowledged) > 20
    converged = await asyncio.to_thread(cluster.wait_for_convergence, CLUSTER_WAIT_S, range(3))
    assert converged["applied_index"] > 0


async def test_with_automatic_levels_the_upgraded_cluster_raises_its_level_by_itself(
        previous_cluster: LocalCluster) -> None:
    cluster = previous_cluster  # feature_level_auto: the default, of the old nodes and the new
    old_leader = cluster.wait_for_leader(LEADER_TIMEOUT_S)
    await async_wait_until(lambda: levels(cluster) == [PREVIOUS_LEVEL_MAX] * 3, AUTO_RAISE_BOUND, interval_s=0.2,
                           what="the previous release at its own highest level")
    followers = [i for i in range(3) if i != old_leader]
    for i in followers:
        await upgrade(cluster, i)
    await asyncio.to_thread(hand_over, cluster, followers[0])
    await round_trip(cluster)
    async with client_of(cluster, followers) as client:  # an old member holds the new leader's raise back
        assert (await client.feature_level())["active"] == PREVIOUS_LEVEL_MAX
    await upgrade(cluster, old_leader)
    await async_wait_until(lambda: levels(cluster) == [LEVEL_MAX] * 3, AUTO_RAISE_BOUND, interval_s=0.2,
                           what="the level raised by the leader once every node reads it")
    async with client_of(cluster) as client:
        assert (await client.feature_level())["raised_by_version"] == rcq_version()
    await round_trip(cluster)
    await asyncio.to_thread(cluster.wait_for_convergence, CLUSTER_WAIT_S, range(3))


async def test_a_node_of_the_new_code_joins_a_cluster_of_the_previous_release_which_stays_at_level_3(
        previous_cluster: LocalCluster) -> None:
    cluster = previous_cluster
    cluster.wait_for_leader(LEADER_TIMEOUT_S)
    await async_wait_until(lambda: levels(cluster) == [PREVIOUS_LEVEL_MAX] * 3, AUTO_RAISE_BOUND, interval_s=0.2,
                           what="the previous release at its own highest level")
    new = await asyncio.to_thread(cluster.add_node, None, start=False)  # a node of the release
    await asyncio.to_thread(cluster.restart_node_as, new, None)  # ... started as the new code instead
    node = cluster.nodes[new]
    async with client_of(cluster) as client:
        added = await client.add_node(node.node_id, node.raft_address, cluster.url(new),
                                      catch_up_timeout_s=CLUSTER_WAIT_S)  # the old leader adds it
        assert added
        await round_trip(cluster)
        # The old leader refuses a level it does not read itself.
        with pytest.raises(FeatureLevelUnsupported, match="level 4 is not read by"):
            await client.raise_feature_level(LEVEL_MAX)
        # Leading (it raises levels by itself by default), the new node still keeps level 3.
        await asyncio.to_thread(hand_over, cluster, new)
    async with client_of(cluster, [new]) as client:
        # "as high as every member reads" is where it is; level 4 is refused, naming the old nodes.
        assert await client.raise_feature_level() == {
            "level": PREVIOUS_LEVEL_MAX, "previous": PREVIOUS_LEVEL_MAX, "changed": False}
        with pytest.raises(FeatureLevelUnsupported, match="not read by") as refused:
            await client.raise_feature_level(LEVEL_MAX)
        for i in range(3):
            assert f"node-{i} (rcq 0.2.0, up to level 3)" in str(refused.value)
        report = await client.feature_level()
        assert report["active"] == PREVIOUS_LEVEL_MAX
        assert {m["node_id"]: m["level_max"] for m in report["members"]} == {
            "node-0": PREVIOUS_LEVEL_MAX, "node-1": PREVIOUS_LEVEL_MAX, "node-2": PREVIOUS_LEVEL_MAX,
            node.node_id: LEVEL_MAX}
        await round_trip(cluster)
    assert levels(cluster) == [PREVIOUS_LEVEL_MAX] * 4
    await asyncio.to_thread(cluster.wait_for_convergence, CLUSTER_WAIT_S, range(4))


# ------------------------------------------------------------------ downgrades
STOP_MESSAGE = (r"CRITICAL .*node node-{i} stops: {where}: the cluster runs at feature level " + str(LEVEL_MAX)
                + r" \(raised by rcq "
                + re.escape(rcq_version()) + r"\); this node runs rcq " + re.escape(rcq_version())
                + r", which reads feature levels up to 1")


@pytest.mark.expected_log_errors(rf"node node-[0-2] stops: .*feature level {LEVEL_MAX}")
async def test_the_new_code_held_at_level_1_refuses_the_raise_and_stops_on_level_2_data(
        held_cluster: LocalCluster) -> None:
    cluster = held_cluster
    leader = cluster.wait_for_leader(LEADER_TIMEOUT_S)
    a, b = [i for i in range(3) if i != leader]
    # (a) node a as the new code held at the lower level (as a rolled-back node would be).
    await asyncio.to_thread(cluster.restart_node_with, a, test_feature_level_max=LEVEL_BASE)
    async with client_of(cluster) as client:
        with pytest.raises(FeatureLevelUnsupported, match=rf"not read by node-{a} \(rcq .*up to level 1\)"):
            await client.raise_feature_level(LEVEL_MAX)
        await asyncio.to_thread(cluster.restart_node_with, a, test_feature_level_max=None)
        assert (await client.raise_feature_level(LEVEL_MAX))["level"] == LEVEL_MAX
        await round_trip(cluster)
    await async_wait_until(lambda: levels(cluster) == [LEVEL_MAX] * 3, CLUSTER_WAIT_S, what=f"level {LEVEL_MAX} everywhere")

    # (b) rolled back below the active level: node a meets the level entry in its journal...
    await asyncio.to_thread(cluster.restart_node_with, a, False, test_feature_level_max=LEVEL_BASE)
    assert await asyncio.to_thread(wait_exit, cluster, a) == UNREADABLE_EXIT_CODE
    assert re.search(STOP_MESSAGE.format(i=a, where=r"log entry \d+"), cluster.log_tail(a)), cluster.log_tail(a)
    # ... node b, after a snapshot (format 4, the level in it), meets the snapshot.
    assert await snapshot_now(cluster, b) == 4
    await asyncio.to_thread(cluster.restart_node_with, b, False, test_feature_level_max=LEVEL_BASE)
    assert await asyncio.to_thread(wait_exit, cluster, b) == UNREADABLE_EXIT_CODE
    assert re.search(STOP_MESSAGE.format(i=b, where="this node's snapshot"), cluster.log_tail(b)), cluster.log_tail(b)

    # Both back on the code that reads level 2: the cluster goes on as before.
    for i in (a, b):
        await asyncio.to_thread(cluster.restart_node_with, i, test_feature_level_max=None)
    await round_trip(cluster)
    await asyncio.to_thread(cluster.wait_for_convergence, CLUSTER_WAIT_S, range(3))


PREVIOUS_STOP_MESSAGE = (r"CRITICAL .*node node-{i} stops: this node's snapshot: the cluster runs at feature level "
                         + str(LEVEL_MAX) + r" \(raised by rcq " + re.escape(rcq_version())
                         + r"\); this node runs rcq 0\.2\.0, which reads feature levels up to 3")


@pytest.mark.expected_log_errors(rf"node node-[0-2] stops: .*feature level {LEVEL_MAX}")
async def test_the_previous_release_on_a_level_4_snapshot_stops_naming_both_versions(
        previous_release: Release, held_cluster: LocalCluster) -> None:
    cluster = held_cluster
    leader = cluster.wait_for_leader(LEADER_TIMEOUT_S)
    old = (leader + 1) % 3
    queue = fresh_queue("kept")
    async with client_of(cluster) as client:
        await client.raise_feature_level(LEVEL_MAX)
        await client.enqueue(queue, "a", "b", "c")
    await asyncio.to_thread(cluster.wait_for_applied, QUIET_CLUSTER_WAIT_S)
    assert await snapshot_now(cluster, old) == 4
    await asyncio.to_thread(cluster.restart_node_as, old, previous_release, False)
    # rcq 0.2.0 reads the snapshot's level, above what it reads, and stops before it serves.
    assert await asyncio.to_thread(wait_exit, cluster, old) == UNREADABLE_EXIT_CODE
    assert re.search(PREVIOUS_STOP_MESSAGE.format(i=old), cluster.log_tail(old)), cluster.log_tail(old)
    async with client_of(cluster, [i for i in range(3) if i != old]) as client:
        await client.enqueue(queue, "d")  # two of three still commit
    # Back on the code under test, the node reads the snapshot and catches up.
    await asyncio.to_thread(cluster.restart_node_as, old, None)
    await asyncio.to_thread(cluster.wait_for_convergence, CLUSTER_WAIT_S, range(3))
    async with client_of(cluster) as client:
        assert await client.count(queue) == 4
