"""Fixtures for tests against real multi-process rcq clusters.

``cluster``: one 3-node :class:`~rcq.testing.cluster.LocalCluster` per test
module, with a serving leader. ``healthy_cluster``: the same cluster, with every
node resumed or restarted and a leader found again before the test, for tests
that kill, pause or stop nodes.

When a test that used a LocalCluster fails, the tail of every node's log is
added to its report (section "rcq node logs").
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

from rcq.client import RcqClient
from rcq.testing import wait_until
from rcq.testing.cluster import LocalCluster

LEADER_TIMEOUT_S = 60.0


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[Any]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if not report.failed:
        return
    funcargs = getattr(item, "funcargs", {})
    seen: set[int] = set()
    for value in funcargs.values():
        if isinstance(value, LocalCluster) and id(value) not in seen:
            seen.add(id(value))
            report.sections.append((f"rcq node logs ({value.base_dir}, {report.when})", value.dump_logs()))


@contextlib.contextmanager
def running_cluster(nodes: int = 3, overrides: dict[str, Any] | None = None) -> Iterator[LocalCluster]:
    """A started cluster with a serving leader (its logs printed if none comes), closed after."""
    with LocalCluster(nodes=nodes, node_overrides=overrides or {}) as local_cluster:
        try:
            local_cluster.wait_for_leader(LEADER_TIMEOUT_S)
        except TimeoutError:
            print(local_cluster.dump_logs())
            raise
        yield local_cluster


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with running_cluster() as local_cluster:
        yield local_cluster


@pytest.fixture
def healthy_cluster(cluster: LocalCluster) -> LocalCluster:
    cluster.heal()
    cluster.wait_for_leader(LEADER_TIMEOUT_S)
    return cluster


async def drain_until_empty(client: RcqClient, queue: str, timeout_s: float = 60.0) -> list[str]:
    """Dequeue and commit until the queue is empty on the leader (items locked by a commit whose
    outcome is still pending count, and are waited for); the values, decoded."""
    drained: list[str] = []

    async def empty() -> bool:
        async with client.transaction(timeout_s=30) as tx:
            drained.extend(v.decode() for v in await tx.dequeue_batch(queue, 1000))
        return await client.count(queue) == 0

    await wait_until(empty, timeout_s, interval_s=0.05, message=f"{queue} to drain")
    return drained
