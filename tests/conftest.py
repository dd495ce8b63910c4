"""Suite-wide hooks: the node-log check, and assertion rewriting in the shared helpers; the
fixtures of more than one folder.

**Node logs**: after each test, the ERROR lines and tracebacks that the node logs of its real
clusters gained (:mod:`tests.helpers.node_logs`) fail it, but for those its
``@pytest.mark.expected_log_errors(pattern, ...)`` declares. A test that failed already gets them
as a report section instead, beside its own failure. A failed test's report also shows the tail
of each node log of the clusters it used.

**Parallel workers** (pytest-xdist, ``./run tests`` runs ``--dist loadgroup``): each worker picks
the loopback ports of its clusters in its own slice (:data:`rcq.local.nodes.PORT_SLICE_ENV`), so
two workers never race for one port; tests that share a module's cluster, the Spark tests, and the
tests marked ``fixed_ports`` each run on one worker (:mod:`tests.helpers.worker_groups`, whose
scheduler replaces xdist's for ``--dist loadgroup``). Without xdist, none of this changes anything.

**Fixtures**: ``wire``, an aiohttp session that records every request it sends
(:class:`tests.helpers.fakes.Wire`), for a client given ``session=`` (of a fake node in the unit
tests, of a real cluster in the integration tests).

**Helpers**: the shared helpers (:mod:`tests.helpers`, ``tests/spark/helpers.py``,
``tests/integration/workload.py``) hold assertions; pytest rewrites them as it does the tests',
so that their failures show the values compared.

Must not import: a test module or another conftest.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Generator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

pytest.register_assert_rewrite("tests.helpers", "tests.integration.workload", "tests.spark.helpers")

from rcq.local.nodes import PORT_SLICE_ENV  # noqa: E402
from tests.helpers import node_logs, worker_groups  # noqa: E402  (after the rewrite is registered)
from tests.helpers.fakes import Wire  # noqa: E402

_FAILED = pytest.StashKey[bool]()
_GROUPS_DIR = pytest.StashKey[Path]()
_monkeypatch = pytest.MonkeyPatch()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", f"{node_logs.MARKER}(*patterns): regular expressions of the ERROR lines and tracebacks "
                   "the test causes in its clusters' node logs (tests/helpers/node_logs.py)")
    config.addinivalue_line(
        "markers", "fixed_ports: binds ports no other test may bind at the same time (one parallel worker runs "
                   "every such test)")
    config.addinivalue_line(
        "markers", "cluster_overrides(**settings): NodeConfig settings of every own_cluster of the tests it marks "
                   "(an indirect parameter's settings win over them)")
    config.addinivalue_line(
        "markers", "one_worker(name): tests that load the machine so that two at once would starve each other's "
                   "clusters; one parallel worker runs the tests of one name, one after another")
    node_logs.watch_local_clusters(_monkeypatch)
    worker, workers = os.environ.get("PYTEST_XDIST_WORKER"), os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if worker and workers:  # "gw3" of 4
        _monkeypatch.setenv(PORT_SLICE_ENV, f"{int(worker.removeprefix('gw'))}/{workers}")
    elif config.pluginmanager.hasplugin("xdist") and config.getoption("dist", "no") == "loadgroup":
        config.stash[_GROUPS_DIR] = Path(tempfile.mkdtemp(prefix="rcq-worker-groups-"))


def pytest_unconfigure(config: pytest.Config) -> None:
    _monkeypatch.undo()
    if _GROUPS_DIR in config.stash:
        shutil.rmtree(config.stash[_GROUPS_DIR], ignore_errors=True)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """xdist, on the controller: each worker is told where to write its tests' groups."""
    if _GROUPS_DIR in node.config.stash:
        node.workerinput[worker_groups.WORKER_INPUT_KEY] = str(node.config.stash[_GROUPS_DIR])


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """xdist, on the controller: ``--dist loadgroup`` keeps each group on one worker."""
    if _GROUPS_DIR not in config.stash:
        return None
    return worker_groups.make_scheduler(config, log, config.stash[_GROUPS_DIR])


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    directory = getattr(config, "workerinput", {}).get(worker_groups.WORKER_INPUT_KEY)
    if directory is not None:
        worker_groups.write_groups(items, Path(directory), config.workerinput["workerid"])


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[Any]) -> Generator[None, pytest.TestReport,
                                                                                               pytest.TestReport]:
    report = yield
    if report.failed:
        item.stash[_FAILED] = True
    if report.when == "teardown":
        errors = node_logs.unexpected(node_logs.NODE_LOGS.take(), node_logs.expected_patterns(item))
        if errors and item.stash.get(_FAILED, False):
            report.sections.append(("node log errors", node_logs.report(errors)))
        elif errors:
            report.outcome = "failed"
            report.longrepr = node_logs.report(errors)
    node_logs.add_log_tails(item, report)
    return report


@pytest.fixture
async def wire() -> AsyncIterator[tuple[Wire, aiohttp.ClientSession]]:
    recorder = Wire()
    async with aiohttp.ClientSession(middlewares=[recorder]) as session:
        yield recorder, session
