"""Suite-wide hooks: the node-log check, and assertion rewriting in the shared helpers.

**Node logs**: after each test, the ERROR lines and tracebacks that the node logs of its real
clusters gained (:mod:`tests.helpers.node_logs`) fail it, but for those its
``@pytest.mark.expected_log_errors(pattern, ...)`` declares. A test that failed already gets them
as a report section instead, beside its own failure.

**Helpers**: the shared helpers (:mod:`tests.helpers`, ``tests/spark/helpers.py``,
``tests/integration/workload.py``) hold assertions; pytest rewrites them as it does the tests',
so that their failures show the values compared.

Must not import: a test module or another conftest.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest

pytest.register_assert_rewrite("tests.helpers", "tests.integration.workload", "tests.spark.helpers")

from tests.helpers import node_logs  # noqa: E402  (after the rewrite is registered)

_FAILED = pytest.StashKey[bool]()
_monkeypatch = pytest.MonkeyPatch()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", f"{node_logs.MARKER}(*patterns): regular expressions of the ERROR lines and tracebacks "
                   "the test causes in its clusters' node logs (tests/helpers/node_logs.py)")
    node_logs.watch_local_clusters(_monkeypatch)


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
    return report
