"""Feature levels on a real 3-node cluster of the code under test: what nodes report, raising
the level by hand and by itself, refusals, and a member that cannot read the active level.

The previous release beside this code (rolling upgrades, downgrades) is tests/upgrade/.
"""

from __future__ import annotations

import asyncio
import urllib.request

import pytest

from rcq.client import FeatureLevelUnsupported, RcqClient
from rcq.local.cluster import LocalCluster
from rcq.local.polls import http_json
from rcq.server.core.features import LEVEL_BASE, LEVEL_MAX
from rcq.testing import async_wait_until
from rcq.version import rcq_version
from tests.helpers import CLUSTER_WAIT_S, QUIET_CLUSTER_WAIT_S
from tests.helpers.cluster import running_cluster

HELD = {"feature_level_auto": False}  # the level moves only when asked


def client_of(cluster: LocalCluster) -> RcqClient:
    return RcqClient(cluster.urls, request_timeout_s=10.0, retry_timeout_s=QUIET_CLUSTER_WAIT_S,
                     **cluster.client_options())


def metrics_text(cluster: LocalCluster, i: int) -> str:
    request = urllib.request.Request(cluster.url(i) + "/metrics", headers=cluster.auth_headers())
    with urllib.request.urlopen(request, timeout=QUIET_CLUSTER_WAIT_S) as response:
        return str(response.read().decode())


def levels(cluster: LocalCluster) -> list[int]:
    return [cluster.poll_json(cluster.url(i) + "/v1/cluster")["feature_level"] for i in range(len(cluster.nodes))]


@pytest.mark.cluster
def test_every_node_states_its_version_and_levels_and_a_new_cluster_raises_its_level_by_itself() -> None:
    with running_cluster() as cluster:
        for i in range(3):
            health = http_json(cluster.url(i) + "/healthz", QUIET_CLUSTER_WAIT_S)  # no token needed
            assert (health["version"], health["feature_level_max"]) == (rcq_version(), LEVEL_MAX)
            status = cluster.poll_json(cluster.url(i) + "/v1/cluster")
            assert (status["version"], status["feature_level_max"]) == (rcq_version(), LEVEL_MAX)
        # Every member reads LEVEL_MAX: the leader raises the level within a few of its 5 s rounds.
        asyncio.run(async_wait_until(lambda: levels(cluster) == [LEVEL_MAX] * 3, CLUSTER_WAIT_S,
                                     what="the level raised on every node"))
        metrics = metrics_text(cluster, 1)
        assert f'rcq_build_info{{version="{rcq_version()}"}} 1.0' in metrics
        assert f'rcq_feature_level{{level="active"}} {float(LEVEL_MAX)}' in metrics
        assert f'rcq_feature_level{{level="max"}} {float(LEVEL_MAX)}' in metrics


@pytest.mark.cluster
async def test_a_held_cluster_stays_at_its_level_until_an_admin_raises_it_and_never_lowers_it() -> None:
    with running_cluster(overrides=HELD) as cluster:
        async with client_of(cluster) as client:
            report = await client.feature_level()
            assert (report["active"], report["max"], report["auto"]) == (LEVEL_BASE, LEVEL_MAX, False)
            assert [lv["level"] for lv in report["levels"]] == list(range(1, LEVEL_MAX + 1))
            assert sorted((m["node_id"], m["version"], m["level_max"]) for m in report["members"]) == \
                [(f"node-{i}", rcq_version(), LEVEL_MAX) for i in range(3)]
            with pytest.raises(FeatureLevelUnsupported, match="not read by"):
                await client.raise_feature_level(LEVEL_MAX + 1)
            assert levels(cluster) == [LEVEL_BASE] * 3

            raised = await client.raise_feature_level()  # to the highest every member reads
            assert raised == {"level": LEVEL_MAX, "previous": LEVEL_BASE, "changed": True}
            assert await client.raise_feature_level(LEVEL_MAX) == \
                {"level": LEVEL_MAX, "previous": LEVEL_MAX, "changed": False}
            with pytest.raises(FeatureLevelUnsupported, match="never goes down"):
                await client.raise_feature_level(LEVEL_BASE)
            await async_wait_until(lambda: levels(cluster) == [LEVEL_MAX] * 3, QUIET_CLUSTER_WAIT_S,
                                   what="every node applied the level")
            assert (await client.feature_level())["raised_by_version"] == rcq_version()

            # The level survives a snapshot (format 4) and a restart from it.
            leader = cluster.wait_for_leader(QUIET_CLUSTER_WAIT_S)
            follower = (leader + 1) % 3
            assert cluster.poll_json(cluster.url(follower) + "/v1/admin/snapshot", method="POST", body={})
            await async_wait_until(lambda: cluster.poll_json(cluster.url(follower) + "/v1/cluster")["snapshot_count"] > 0,
                                   QUIET_CLUSTER_WAIT_S, what="the follower's snapshot")
            cluster.stop_node(follower)
            cluster.start_node(follower)
            cluster.wait_for_convergence(CLUSTER_WAIT_S)  # it serves HTTP before it has applied everything
            assert levels(cluster) == [LEVEL_MAX] * 3


@pytest.mark.cluster
async def test_a_member_behind_holds_the_level_and_a_node_that_cannot_read_it_is_not_added() -> None:
    with running_cluster(overrides=HELD) as cluster:
        # Node 2 as a node of an older release would be: it reads only level 1.
        cluster.restart_node_with(2, test_feature_level_max=LEVEL_BASE)
        async with client_of(cluster) as client:
            assert (await client.raise_feature_level())["changed"] is False  # the highest all read: 1
            with pytest.raises(FeatureLevelUnsupported, match=r"node-2 \(rcq .*up to level 1\)"):
                await client.raise_feature_level(LEVEL_MAX)
            report = await client.feature_level()
            assert report["active"] == LEVEL_BASE
            assert {m["node_id"]: m["level_max"] for m in report["members"]}["node-2"] == LEVEL_BASE
            assert levels(cluster) == [LEVEL_BASE] * 3

            # Once node 2 reads the level, the raise goes through; a new node that cannot is refused.
            cluster.restart_node_with(2, test_feature_level_max=None)
            assert (await client.raise_feature_level(LEVEL_MAX))["level"] == LEVEL_MAX
            new = await asyncio.to_thread(cluster.add_node, None, start=False)
            cluster.set_node_override(new, test_feature_level_max=LEVEL_BASE)
            cluster.start_node(new)
            node = cluster.nodes[new]
            with pytest.raises(Exception, match="reads feature levels up to 1") as refused:
                await client.add_node(node.node_id, node.raft_address, cluster.url(new), catch_up_timeout_s=5)
            assert getattr(refused.value, "code", None) == "node_unreachable"
            members = cluster.poll_json(cluster.url(0) + "/v1/cluster/members")["members"]
            assert node.node_id not in {m["node_id"] for m in members}

