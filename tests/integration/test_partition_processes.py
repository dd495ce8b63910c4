"""A partition's Raft group as real processes: three supervised ``rcq serve`` children, one per
node, each with the NodeConfig that rcq.server.partitions.ports derives from its node's
(docs/partitions.md). They elect a leader among themselves on their own ports, commit, and a member
killed -9 is started again by its supervisor and catches up from its own data directory.

The nodes' own processes (p0) are not started here: what is tested is that a partition stands on
its derived configuration alone. The test creates the queue as p0's leader would: with a PUT signed
with the cluster secret (an unsigned one is refused).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import sys
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from rcq.client import RcqClient
from rcq.local.nodes import free_port_range, free_ports
from rcq.local.polls import http_json
from rcq.private_files import write_private
from rcq.server.config import NodeConfig
from rcq.server.leader.placement import PLACEMENT_HEADER, placement_token
from rcq.server.partitions.ports import MemberPorts, partition_config
from rcq.server.partitions.supervisor import ChildSpec, Supervisor, SupervisorTimes
from rcq.testing import async_wait_until
from tests.helpers import CLUSTER_WAIT_S, LEADER_TIMEOUT_S

pytestmark = pytest.mark.cluster

SECRET = "correct horse battery staple"
TIMES = SupervisorTimes(backoff_min_s=0.2, backoff_max_s=1.0, stop_timeout_s=10.0)


def node_configs(base: Path) -> list[NodeConfig]:
    """Three nodes' configs (never started), each with room for two partitions."""
    http, raft = free_ports(3), free_ports(3)
    ranges = [free_port_range(4) for _ in range(3)]
    return [NodeConfig.model_validate(dict(
        node_id=f"node-{i}", http_port=http[i], raft_address=f"127.0.0.1:{raft[i]}", cluster_secret=SECRET,
        data_dir=base / f"node-{i}", partition_ports=f"{ranges[i][0]}-{ranges[i][1]}",
        peers=[{"node_id": f"node-{j}", "raft_address": f"127.0.0.1:{raft[j]}",
                "http_url": f"http://127.0.0.1:{http[j]}"} for j in range(3) if j != i]))
        for i in range(3)]


class Partition:
    """Partition ``name`` of three nodes, each member a child of its node's supervisor."""

    def __init__(self, base: Path, name: str, number: int) -> None:
        nodes = node_configs(base)
        members = [MemberPorts.of(n) for n in nodes]
        self.name = name
        self.configs = [partition_config(n, name, number, members) for n in nodes]
        self.supervisors = [Supervisor(TIMES) for _ in nodes]
        self.specs = []
        for config in self.configs:
            path = config.data_dir.parent / f"{name}.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            write_private(path, json.dumps(config.model_dump(mode="json")))
            self.specs.append(ChildSpec((sys.executable, "-m", "rcq", "serve", "--config", str(path)),
                                        config.data_dir.parent / f"{name}.log"))

    @property
    def urls(self) -> list[str]:
        return [config.url for config in self.configs]

    async def start(self) -> None:
        for supervisor, spec in zip(self.supervisors, self.specs, strict=True):
            await supervisor.want({self.name: spec})

    async def close(self) -> None:
        for supervisor in self.supervisors:
            await supervisor.close()

    def pid(self, i: int) -> int | None:
        return self.supervisors[i].pids().get(self.name)

    def views(self) -> dict[int, dict[str, Any]]:
        answers = {}
        for i, url in enumerate(self.urls):
            with contextlib.suppress(OSError, ValueError):
                answers[i] = http_json(url + "/v1/cluster", 2.0)
        return answers

    def leader(self) -> int | None:
        """The member every running one names as leader, once it serves."""
        views = self.views()
        leaders = {v.get("leader_id") for v in views.values()}
        if len(views) < 3 or len(leaders) != 1 or None in leaders:
            return None
        leader = next(i for i, c in enumerate(self.configs) if c.node_id in leaders)
        return leader if views[leader].get("serving") else None

    def digests(self) -> set[tuple[Any, Any]]:
        found = set()
        for url in self.urls:
            with contextlib.suppress(OSError, ValueError):
                answer = http_json(url + "/v1/cluster/digest", 10.0)
                found.add((answer["digest"], answer["applied_index"]))
        return found

    def logs(self) -> str:
        return "\n".join(spec.log_path.read_text(errors="replace") for spec in self.specs if spec.log_path.exists())


@pytest.fixture
async def partition(tmp_path: Path) -> AsyncIterator[Partition]:
    started = Partition(tmp_path, "p1", 1)
    await started.start()
    try:
        yield started
    finally:
        await started.close()
        assert all(started.pid(i) is None for i in range(3))


async def test_a_partition_of_three_processes_elects_commits_and_survives_a_member_killed(
        partition: Partition) -> None:
    [leader] = await async_wait_until(lambda: [i] if (i := partition.leader()) is not None else None,
                                      LEADER_TIMEOUT_S, what="p1 electing a serving leader")
    # The queue is created as p0's leader would create it there: a PUT signed with the secret.
    url = f"{partition.urls[leader]}/v1/queues/jobs"
    assert http_json(url, 5.0, "PUT", body={})["error"]["code"] == "queue_not_found"  # unsigned: refused
    signed = urllib.request.Request(url, method="PUT", data=b"{}", headers={
        "Content-Type": "application/json", PLACEMENT_HEADER: placement_token(partition.configs[leader], "p1", "jobs")})
    with urllib.request.urlopen(signed, timeout=5.0) as answer:
        assert json.loads(answer.read())["settings"]["partitions"] == ["p1"]
    async with RcqClient(partition.urls, retry_timeout_s=CLUSTER_WAIT_S) as client:
        await client.enqueue("jobs", "a")
        await client.enqueue("jobs", "b")
        victim = (leader + 1) % 3
        killed = partition.pid(victim)
        assert killed is not None
        os.kill(killed, signal.SIGKILL)
        await client.enqueue("jobs", "c")  # two members of three still commit
        await async_wait_until(lambda: partition.pid(victim) not in (None, killed), CLUSTER_WAIT_S,
                               what="the supervisor starting the killed member again")
        await async_wait_until(lambda: len(partition.digests()) == 1 and len(partition.views()) == 3,
                               CLUSTER_WAIT_S, what="the restarted member caught up")
        assert sorted(await client.dequeue("jobs", max_items=10)) == [b"a", b"b", b"c"]
    assert partition.supervisors[victim].status()["p1"]["restarts"] == 1
    logs = partition.logs()
    assert not re.search(r" ERROR |Traceback", logs), logs[-3000:]
    # Each member's data lives under its node's data directory, in the partition's own.
    for config in partition.configs:
        assert config.data_dir.name == "p1.1" and config.data_dir.parent.name == "partitions"  # name.number
        assert any(config.data_dir.iterdir())
