"""Rolling upgrades from the previous release (rcq 0.1.0) to the code under test, and back.

Upgrade: a 3-node cluster of the previous release under load is upgraded one node at a time, the
followers first and the leader last, after it handed leadership to an upgraded node; nothing
acknowledged is lost or duplicated and every replica ends with the same digest. The cluster stays
at feature level 1 (what rcq 0.1 reads) while any old node is a member: a raise is refused naming
it, the new feature of level 2 (item headers) is refused with 409 feature_level_required, and a
level-1 cluster writes rcq 0.1's snapshot format (3). Once every node is upgraded the level is
raised (by hand, or by the leader itself within a round of its 5 s check); then headers work and
the snapshots are format 4, which a restarted node reads back. A node of the new code joins an old
cluster, which stays at level 1.

Downgrade: below the level the cluster runs at, the new code refuses (a raise that a member held
at level 1 cannot read) or stops (exit 78, CRITICAL, both versions named) on the level entry or
the format-4 snapshot it meets; rcq 0.1, which knows nothing of levels, fails to load a format-4
snapshot: it logs the error, stays running, never serves and never applies another entry (it
does not exit: it is stuck, not diverging), which a test pins down.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator

import pytest

from rcq.client import FeatureLevelRequired, FeatureLevelUnsupported, InvalidRequest, RcqClient
from rcq.local.cluster import LocalCluster
from rcq.local.releases import Release
from rcq.server.core.features import LEVEL_BASE, LEVEL_MAX
from rcq.server.raft.unreadable import UNREADABLE_EXIT_CODE
from rcq.testing import async_wait_until, wait_until
from rcq.version import rcq_version
from tests.helpers import CLUSTER_WAIT_S, LEADER_TIMEOUT_S, QUIET_CLUSTER_WAIT_S
from tests.helpers.cluster import fresh_queue
from tests.upgrade.rolling import Load, client_of, hand_over, levels, snapshot_now

HELD = {"feature_level_auto": False}  # new nodes raise nothing by themselves (rcq 0.1 drops the field)
AUTO_RAISE_BOUND = 15.0  # the leader checks every 5 s; a raise comes within a round or two

pytestmark = pytest.mark.cluster


@pytest.fixture
def held_previous_cluster(previous_release: Release) -> Iterator[LocalCluster]:
    """A started 3-node cluster of the previous release whose nodes, once upgraded, hold the level."""
    with LocalCluster(3, release=previous_release, node_overrides=HELD) as cluster:
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


async def round_trip(cluster: LocalCluster) -> None:
    """One enqueue and its dequeue, committed."""
    queue = fresh_queue("trip")
    async with client_of(cluster) as client:
        await client.enqueue(queue, "x")
        assert await client.dequeue(queue, max_items=2) == [b"x"]


HEADERS = {"trace-id": "rolling-1", "origin": "upgrade-test"}


async def headers_refused(client: RcqClient) -> None:
    """An enqueue with headers (level 2's feature) is refused, clearly, and nothing is enqueued."""
    queue = fresh_queue("headers-refused")
    refusal = r"item headers need feature level 2; the cluster runs at 1\. Upgrade every member"
    with pytest.raises(FeatureLevelRequired, match=refusal) as refused:
        await client.enqueue(queue, "h", headers=HEADERS)
    assert refused.value.code == "feature_level_required"
    assert await client.count(queue) == 0


def wait_exit(cluster: LocalCluster, i: int) -> int:
    """The exit code of node ``i``, which is to stop on its own."""
    wait_until(lambda: i in cluster.unexpected_exits(), CLUSTER_WAIT_S, what=f"node-{i} to exit")
    code = cluster.unexpected_exits()[i]  # an exited process keeps its code
    cluster.nodes[i].forget()
    return code


# ------------------------------------------------------------------ upgrades
async def test_a_rolling_upgrade_under_load_loses_nothing_and_new_formats_wait_for_the_raise(
        held_previous_cluster: LocalCluster) -> None:
    cluster = held_previous_cluster
    old_leader = cluster.wait_for_leader(LEADER_TIMEOUT_S)
    followers = [i for i in range(3) if i != old_leader]
    load = Load(cluster)
    try:
        await load.commits_more(what="on the previous release")
        async with client_of(cluster) as client:  # rcq 0.1 refuses an item with headers: never dropped
            queue = fresh_queue("headers-old")
            with pytest.raises(InvalidRequest, match="Input should be a valid string"):
                await client.enqueue(queue, "h", headers=HEADERS)
            assert await client.count(queue) == 0
        for i in followers:  # the followers first, one at a time, the load committing throughout
            await upgrade(cluster, i)
            await load.commits_more(what=f"after node-{i}'s upgrade")
        # The old leader hands over to an upgraded node: the new code leads, one old node follows.
        await asyncio.to_thread(hand_over, cluster, followers[0])
        await load.commits_more(what="under the new leader")
        async with client_of(cluster, followers) as client:
            report = await client.feature_level()
            assert report["active"] == LEVEL_BASE and report["auto"] is False
            members = {m["node_id"]: (m["version"], m["level_max"]) for m in report["members"]}
            assert members == {f"node-{old_leader}": (None, LEVEL_BASE),
                               **{f"node-{i}": (rcq_version(), LEVEL_MAX) for i in followers}}
            # The raise is refused while the old node is a member, naming it.
            with pytest.raises(FeatureLevelUnsupported, match=rf"not read by node-{old_leader} \(rcq 0\.1, up to level 1\)"):
                await client.raise_feature_level(LEVEL_MAX)
            await headers_refused(client)
            # A level-1 cluster writes what rcq 0.1 writes: snapshot format 3.
            assert await snapshot_now(cluster, followers[1]) == 3
        assert levels(cluster, followers) == [LEVEL_BASE, LEVEL_BASE]

        await upgrade(cluster, old_leader)  # the last one
        await load.commits_more(what="with every node upgraded")
        assert levels(cluster) == [LEVEL_BASE] * 3  # held: nothing raised it

        headed = fresh_queue("headers")
        async with client_of(cluster) as client:
            await headers_refused(client)  # every node reads level 2, but the level is still 1
            assert await client.raise_feature_level(LEVEL_MAX) == \
                {"level": LEVEL_MAX, "previous": LEVEL_BASE, "changed": True}
            await async_wait_until(lambda: levels(cluster) == [LEVEL_MAX] * 3, CLUSTER_WAIT_S,
                                   what=f"level {LEVEL_MAX} everywhere")
            await client.enqueue(headed, "h1", headers=HEADERS)  # the feature works now
            await client.enqueue(headed, "h2", headers=HEADERS)
            (item,) = await client.dequeue_items(headed)
            assert (item.value, item.headers) == (b"h1", HEADERS)
        await load.commits_more(what="at level 2")
        # Level 2 writes snapshot format 4, and a node restarted from it reads it back.
        follower = next(i for i in range(3) if i != cluster.wait_for_leader(LEADER_TIMEOUT_S))
        assert await snapshot_now(cluster, follower) == 4
        await asyncio.to_thread(cluster.stop_node, follower)
        await asyncio.to_thread(cluster.start_node, follower)
        # (its log was compacted into the snapshot: the level it applies comes from the snapshot)
        await async_wait_until(lambda: levels(cluster, [follower]) == [LEVEL_MAX], CLUSTER_WAIT_S,
                               what=f"the restarted node at level {LEVEL_MAX}")
        await load.commits_more(what="after a restart from a format-4 snapshot")
        # The item with headers went through the snapshot too: the restarted node leads, and gives it.
        await asyncio.to_thread(hand_over, cluster, follower)
        async with client_of(cluster, [follower]) as client:
            (item,) = await client.dequeue_items(headed)
            assert (item.value, item.headers) == (b"h2", HEADERS)
        history = await load.finish()
    except BaseException:
        await load.cancel()
        raise
    assert len(history.acknowledged) > 20
    converged = await asyncio.to_thread(cluster.wait_for_convergence, CLUSTER_WAIT_S, range(3))
    assert converged["applied_index"] > 0


async def test_with_automatic_levels_the_upgraded_cluster_raises_its_level_by_itself(
        previous_cluster: LocalCluster) -> None:
    cluster = previous_cluster  # feature_level_auto: the default of the new nodes
    old_leader = cluster.wait_for_leader(LEADER_TIMEOUT_S)
    followers = [i for i in range(3) if i != old_leader]
    for i in followers:
        await upgrade(cluster, i)
    await asyncio.to_thread(hand_over, cluster, followers[0])
    await round_trip(cluster)
    async with client_of(cluster, followers) as client:  # an old member holds the new leader's raise back
        assert (await client.feature_level())["active"] == LEVEL_BASE
    await upgrade(cluster, old_leader)
    await async_wait_until(lambda: levels(cluster) == [LEVEL_MAX] * 3, AUTO_RAISE_BOUND, interval_s=0.2,
                           what="the level raised by the leader once every node reads it")
    async with client_of(cluster) as client:
        assert (await client.feature_level())["raised_by_version"] == rcq_version()
    await round_trip(cluster)
    await asyncio.to_thread(cluster.wait_for_convergence, CLUSTER_WAIT_S, range(3))


async def test_a_node_of_the_new_code_joins_a_cluster_of_the_previous_release_which_stays_at_level_1(
        previous_cluster: LocalCluster) -> None:
    cluster = previous_cluster
    cluster.wait_for_leader(LEADER_TIMEOUT_S)
    new = await asyncio.to_thread(cluster.add_node, None, start=False)  # a node of the release
    await asyncio.to_thread(cluster.restart_node_as, new, None)  # ... started as the new code instead
    node = cluster.nodes[new]
    async with client_of(cluster) as client:
        added = await client.add_node(node.node_id, node.raft_address, cluster.url(new),
                                      catch_up_timeout_s=CLUSTER_WAIT_S)  # the old leader adds it
        assert added
        await round_trip(cluster)
        # The client asks the first node it knows, an old one without the route: it asks the next.
        assert (await client.feature_level())["members"]
        with pytest.raises(FeatureLevelUnsupported, match="leader runs a release before feature levels"):
            await client.raise_feature_level(LEVEL_MAX)  # the old leader knows no levels
        # Leading (it raises levels by itself by default), the new node still keeps level 1.
        await asyncio.to_thread(hand_over, cluster, new)
    async with client_of(cluster, [new]) as client:
        # "as high as every member reads" is where it is; level 2 is refused, naming the old nodes.
        assert await client.raise_feature_level() == {"level": LEVEL_BASE, "previous": LEVEL_BASE, "changed": False}
        with pytest.raises(FeatureLevelUnsupported, match="not read by") as refused:
            await client.raise_feature_level(LEVEL_MAX)
        for i in range(3):
            assert f"node-{i} (rcq 0.1, up to level 1)" in str(refused.value)
        report = await client.feature_level()
        assert report["active"] == LEVEL_BASE
        assert {m["node_id"]: m["level_max"] for m in report["members"]} == {
            "node-0": LEVEL_BASE, "node-1": LEVEL_BASE, "node-2": LEVEL_BASE, node.node_id: LEVEL_MAX}
        await round_trip(cluster)
    assert levels(cluster) == [None, None, None, LEVEL_BASE]
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


@pytest.mark.expected_log_errors(r"failed to load full dump", r"snapshot format 4, expected one of \(1, 2, 3\)")
async def test_the_previous_release_on_a_format_4_snapshot_fails_loudly_and_never_serves(
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
    await asyncio.to_thread(cluster.restart_node_as, old, previous_release)

    # rcq 0.1 cannot read the snapshot: pysyncobj logs the error and carries on with an empty state.
    def load_failed() -> bool:
        return "snapshot format 4, expected one of (1, 2, 3)" in cluster.log_tail(old)
    await async_wait_until(load_failed, QUIET_CLUSTER_WAIT_S, interval_s=0.1, what="rcq 0.1's failed snapshot load")
    assert "ERROR pysyncobj.syncobj: failed to load full dump" in cluster.log_tail(old)
    # It does not exit; it applies nothing after the snapshot, so it never serves and never
    # diverges: its digest stays at applied index 0 while the others move on.
    async with client_of(cluster) as client:
        await client.enqueue(queue, "d")
    moved_on = await asyncio.to_thread(cluster.wait_for_convergence, CLUSTER_WAIT_S,
                                       [i for i in range(3) if i != old])
    assert cluster.nodes[old].running()
    status = cluster.status(old)
    assert status["serving"] is False and int(status["last_applied"]) < moved_on["applied_index"], status
    assert cluster.digest(old)["applied_index"] == 0
    # Back on the code under test, the node reads the snapshot and catches up.
    await asyncio.to_thread(cluster.restart_node_as, old, None)
    await asyncio.to_thread(cluster.wait_for_convergence, CLUSTER_WAIT_S, range(3))
