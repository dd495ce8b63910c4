"""Suite-wide hooks: the node-log check, and assertion rewriting in the shared helpers; the
fixtures of more than one folder.

**Node logs**: after each test, the ERROR lines and tracebacks that the node logs of its real
clusters gained (:mod:`tests.helpers.node_logs`) fail it, but for those its
``@pytest.mark.expected_log_errors(pattern, ...)`` declares. A test that failed already gets them
as a report section instead, beside its own failure. A failed test's report also shows the tail
of each node log of the clusters it used.

**Parallel workers** (pytest-xdist, ``./run tests`` runs ``--dist loadgroup``): each worker picks
the loopback ports of its clusters in its own slice (:data:`rcq.local.nodes.PORT_SLICE_ENV`), so
two workers never race for one port; tests of a module that share a module- or class-scoped
fixture (a module's cluster) run on one worker, in one group; the Spark tests share one worker (one
driver JVM and one cluster for all of them); tests marked ``fixed_ports`` (ports no other test may
bind at the same time) share one worker too. Without xdist, nothing of this changes anything.

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
from collections.abc import AsyncIterator, Generator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

pytest.register_assert_rewrite("tests.helpers", "tests.integration.workload", "tests.spark.helpers")

from rcq.local.nodes import PORT_SLICE_ENV  # noqa: E402
from tests.helpers import node_logs  # noqa: E402  (after the rewrite is registered)
from tests.helpers.fakes import Wire  # noqa: E402

_FAILED = pytest.StashKey[bool]()
_monkeypatch = pytest.MonkeyPatch()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", f"{node_logs.MARKER}(*patterns): regular expressions of the ERROR lines and tracebacks "
                   "the test causes in its clusters' node logs (tests/helpers/node_logs.py)")
    config.addinivalue_line(
        "markers", "fixed_ports: binds ports no other test may bind at the same time (one parallel worker runs "
                   "every such test)")
    # pytest-xdist registers it too; registered here so that the suite also runs without xdist
    config.addinivalue_line("markers", "xdist_group(name): tests a parallel worker runs together")
    node_logs.watch_local_clusters(_monkeypatch)
    worker, workers = os.environ.get("PYTEST_XDIST_WORKER"), os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if worker and workers:  # "gw3" of 4
        _monkeypatch.setenv(PORT_SLICE_ENV, f"{int(worker.removeprefix('gw'))}/{workers}")


SHARED_SCOPES = frozenset({"module", "class", "package"})
SPARK_FOLDER = Path(__file__).parent / "spark"


def worker_group(item: pytest.Item) -> str | None:
    """The parallel worker group ``item`` must share with others (None: any worker may run it)."""
    if item.get_closest_marker("fixed_ports") is not None:
        return "fixed-ports"
    if SPARK_FOLDER in item.path.parents:
        return "spark"
    definitions = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
    if any(defs and defs[-1].scope in SHARED_SCOPES for defs in definitions.values()):
        return item.path.relative_to(Path(__file__).parent.parent).as_posix()
    return None


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        group = worker_group(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))


def pytest_unconfigure(config: pytest.Config) -> None:
    _monkeypatch.undo()


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
