"""Fixtures for tests against real multi-process rcq clusters.

``cluster``: one 3-node :class:`~rcq.local.cluster.LocalCluster` per test
module, with a serving leader (a module may override it with a cluster of other
node settings). ``healthy_cluster``: the module's ``cluster``, with every node
resumed or restarted and a leader found again before the test, for tests that
kill, pause or stop nodes. ``own_cluster``: a 3-node cluster of one test's own,
which it may break; its ``request.param`` (indirect parametrization) is
NodeConfig overrides, on top of a ``cluster_overrides`` marker's. ``own_client``: a client of ``own_cluster`` that retries
through a failover.

When a test that used a LocalCluster fails, the tail of every node's log is
added to its report (section "rcq node logs", by the hook of tests/conftest.py).
Helpers for clusters a test starts itself are in :mod:`tests.helpers.cluster`.

Must not import: a test module.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

from rcq.client import RcqClient
from rcq.local.cluster import LocalCluster
from tests.helpers import CLUSTER_WAIT_S
from tests.helpers.cluster import healed, running_cluster
from tests.helpers.launcher import Launcher


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with running_cluster() as local_cluster:
        yield local_cluster


@pytest.fixture
def healthy_cluster(cluster: LocalCluster) -> LocalCluster:
    return healed(cluster)


@pytest.fixture
def own_cluster(request: pytest.FixtureRequest) -> Iterator[LocalCluster]:
    marked = request.node.get_closest_marker("cluster_overrides")
    overrides = {**(marked.kwargs if marked else {}), **(getattr(request, "param", None) or {})}
    with running_cluster(overrides=overrides) as local_cluster:
        yield local_cluster


@pytest.fixture
async def own_client(own_cluster: LocalCluster) -> AsyncIterator[RcqClient]:
    async with RcqClient(own_cluster.urls, request_timeout_s=10.0, retry_timeout_s=CLUSTER_WAIT_S,
                         **own_cluster.client_options()) as client:
        yield client


@pytest.fixture
def launchers() -> Iterator[list[Launcher]]:
    """Launchers (``python -m cluster``) a test starts; each one and its nodes gone after."""
    started: list[Launcher] = []
    yield started
    for launcher in started:
        launcher.cleanup()
