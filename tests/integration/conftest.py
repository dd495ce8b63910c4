"""Fixtures for tests against real multi-process rcq clusters.

``cluster``: one 3-node :class:`~rcq.local.cluster.LocalCluster` per test
module, with a serving leader. ``healthy_cluster``: the same cluster, with every
node resumed or restarted and a leader found again before the test, for tests
that kill, pause or stop nodes.

When a test that used a LocalCluster fails, the tail of every node's log is
added to its report (section "rcq node logs"). Helpers for clusters a test
starts itself are in :mod:`tests.helpers.cluster`.

Must not import: a test module.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from rcq.local.cluster import LocalCluster
from tests.helpers import LEADER_TIMEOUT_S
from tests.helpers.cluster import add_node_logs, running_cluster
from tests.helpers.launcher import Launcher


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[Any]) -> Iterator[None]:
    outcome = yield
    add_node_logs(item, outcome.get_result())


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with running_cluster() as local_cluster:
        yield local_cluster


@pytest.fixture
def healthy_cluster(cluster: LocalCluster) -> LocalCluster:
    cluster.heal()
    cluster.wait_for_leader(LEADER_TIMEOUT_S)
    return cluster


@pytest.fixture
def launchers() -> Iterator[list[Launcher]]:
    """Launchers (``python -m cluster``) a test starts; each one and its nodes gone after."""
    started: list[Launcher] = []
    yield started
    for launcher in started:
        launcher.cleanup()
