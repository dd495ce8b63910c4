"""The cluster's identity on real 3-node clusters (feature level 2; docs/backup.md): none while the
cluster is held at level 1, one given by the leader once the level rises, the same on every node;
a backup's header carries it; a cluster restored from the backup has a new one; and a node of the
restored cluster is refused as a member of the old one."""

from __future__ import annotations

import asyncio
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from rcq.cli.backup import describe, save_backup
from rcq.client import RcqClient
from rcq.local.cluster import LocalCluster
from rcq.local.polls import http_json
from rcq.server.core.features import LEVEL_BASE, LEVEL_MAX
from rcq.testing import async_wait_until
from tests.helpers import CLUSTER_WAIT_S, LEADER_TIMEOUT_S, QUIET_CLUSTER_WAIT_S
from tests.helpers.cluster import restored_cluster, running_cluster

pytestmark = pytest.mark.cluster

HELD = {"feature_level_auto": False}  # the level moves only when asked


def client_of(cluster: LocalCluster) -> RcqClient:
    return RcqClient(cluster.urls, request_timeout_s=10.0, retry_timeout_s=QUIET_CLUSTER_WAIT_S,
                     **cluster.client_options())


def identities(cluster: LocalCluster) -> list[Any]:
    return [cluster.poll_json(cluster.url(i) + "/v1/cluster")["cluster_id"] for i in range(len(cluster.nodes))]


async def the_identity(cluster: LocalCluster) -> str:
    """The cluster's identity once every node applied the same one (the leader's loop gives it)."""
    await async_wait_until(lambda: len(set(ids := identities(cluster))) == 1 and ids[0] is not None, CLUSTER_WAIT_S,
                           interval_s=0.2, what="one identity on every node")
    (cluster_id,) = set(identities(cluster))
    return str(cluster_id)


async def test_a_cluster_held_at_level_1_has_no_identity_and_gets_one_when_the_level_rises() -> None:
    with running_cluster(overrides=HELD) as cluster:
        async with client_of(cluster) as client:
            await client.enqueue("q", b"x")  # entries flow; still no identity at level 1
            assert (await client.feature_level())["active"] == LEVEL_BASE
            assert identities(cluster) == [None] * 3
            assert all(http_json(cluster.url(i) + "/healthz", QUIET_CLUSTER_WAIT_S)["cluster_id"] is None
                       for i in range(3))
            assert (await client.raise_feature_level())["level"] == LEVEL_MAX
            cluster_id = await the_identity(cluster)
        assert all(http_json(cluster.url(i) + "/healthz", QUIET_CLUSTER_WAIT_S)["cluster_id"] == cluster_id
                   for i in range(3))
        request = urllib.request.Request(cluster.url(1) + "/metrics", headers=cluster.auth_headers())
        with urllib.request.urlopen(request, timeout=QUIET_CLUSTER_WAIT_S) as response:
            assert f'rcq_cluster_info{{cluster_id="{cluster_id}"}} 1.0' in response.read().decode()
        # A new leader keeps it: the identity is replicated state, not the leader's.
        leader = cluster.wait_for_leader(QUIET_CLUSTER_WAIT_S)
        cluster.stop_node(leader)
        cluster.wait_for_leader(LEADER_TIMEOUT_S)
        cluster.start_node(leader)
        cluster.wait_for_convergence(CLUSTER_WAIT_S)
        assert identities(cluster) == [cluster_id] * 3


async def test_a_backup_carries_the_identity_a_restore_makes_a_new_one_and_never_joins_the_old(
        tmp_path: Path) -> None:
    backup = tmp_path / "cluster.rcqbackup"
    with running_cluster() as old:
        old_id = await the_identity(old)  # the leader raises the level by itself, then gives the identity
        async with client_of(old) as client:
            await client.enqueue("q", b"a", b"b")
        header = await save_backup(old.urls, backup, token=old.token)
        assert header["cluster_id"] == old_id
        assert f"cluster {old_id}" in describe(header, backup, backup.stat().st_size)
        restored = await asyncio.to_thread(restored_cluster, backup)
        try:
            new_id = await the_identity(restored)
            assert new_id != old_id
            leader = old.wait_for_leader(QUIET_CLUSTER_WAIT_S)
            gone = (leader + 1) % 3
            stranger = restored.nodes[gone]  # the restored cluster's node of the same id
            async with client_of(old) as client:
                await client.remove_node(old.nodes[gone].node_id)
                with pytest.raises(Exception, match="another cluster") as refused:
                    await client.add_node(stranger.node_id, stranger.raft_address, restored.url(gone),
                                          catch_up_timeout_s=5)
                assert getattr(refused.value, "code", None) == "node_unreachable"
                members = (await asyncio.to_thread(old.poll_json, old.url(leader) + "/v1/cluster/members"))["members"]
                assert stranger.raft_address not in {m["raft_address"] for m in members}
            assert identities(restored) == [new_id] * 3
        finally:
            restored.close()
