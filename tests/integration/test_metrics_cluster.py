"""GET /metrics on a real 3-node cluster: Raft figures on every node, fsync timings, leader changes."""

from __future__ import annotations

import asyncio
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from rcq.client import RcqClient
from rcq.testing import async_wait_until
from tests.helpers import LEADER_TIMEOUT_S, QUIET_CLUSTER_WAIT_S
from tests.helpers.cluster import running_cluster

pytestmark = pytest.mark.cluster


def scrape(url: str, headers: dict[str, str]) -> dict[str, float]:
    """Sample name with its labels -> value, e.g. ``rcq_raft_role{role="leader"}`` (``headers``: an admin token)."""
    with urllib.request.urlopen(urllib.request.Request(f"{url}/metrics", headers=headers), timeout=10) as response:
        text = response.read().decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            samples[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return samples


async def test_every_node_reports_raft_and_the_leader_reports_commits():
    with running_cluster() as cluster:
        leader = cluster.wait_for_leader(LEADER_TIMEOUT_S)
        async with RcqClient(cluster.urls, retry_timeout_s=20, **cluster.client_options()) as client:
            for i in range(20):
                await client.enqueue("jobs", f"item-{i}")
        cluster.wait_for_applied(QUIET_CLUSTER_WAIT_S)
        scraped = {i: await asyncio.to_thread(scrape, cluster.url(i), cluster.auth_headers()) for i in range(3)}
        roles = {i: [r for r in ("leader", "follower", "candidate") if s[f'rcq_raft_role{{role="{r}"}}'] == 1]
                 for i, s in scraped.items()}
        assert roles[leader] == ["leader"] and all(roles[i] == ["follower"] for i in range(3) if i != leader)
        assert len({s["rcq_raft_term"] for s in scraped.values()}) == 1
        assert len({s["rcq_raft_applied_index"] for s in scraped.values()}) == 1
        for s in scraped.values():
            assert s['rcq_queue_enqueued_total{queue="jobs"}'] == 20  # replicated figures on every node
            assert s["rcq_raft_guard_ticks_total"] >= 0  # ticks on the loop: the guard's are counted
            assert s["rcq_raft_messages_sent_total"] > 0 and s["rcq_raft_messages_received_total"] > 0
            assert s["rcq_wal_fsync_duration_seconds_count"] > 0  # durability=fsync: every node syncs
            assert s["process_resident_memory_bytes"] > 10 << 20
        assert scraped[leader]["rcq_commit_duration_seconds_count"] >= 20
        assert scraped[leader]["rcq_serving"] == 1
        follower = next(i for i in range(3) if i != leader)
        seen_before = scraped[follower]["rcq_raft_leader_changes_seen_total"]

        cluster.kill_node(leader)
        new_leader = cluster.wait_for_leader(LEADER_TIMEOUT_S)
        assert new_leader != leader

        def follower_saw_the_change() -> bool:
            return scrape(cluster.url(follower), cluster.auth_headers())["rcq_raft_leader_changes_seen_total"] > seen_before

        await async_wait_until(lambda: asyncio.to_thread(follower_saw_the_change), QUIET_CLUSTER_WAIT_S, interval_s=0.2,
                               what="the surviving follower counting the leader change")
