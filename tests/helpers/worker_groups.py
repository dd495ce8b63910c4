"""Which tests one parallel worker must run together, and the pytest-xdist scheduler that does it.

A group is a set of tests that share something expensive or exclusive: the tests of a module that
share a module- or class-scoped fixture (the module's cluster), every Spark test (one driver JVM
and one rcq cluster for all of them), every test marked ``fixed_ports`` (ports no other test may
bind at the same time), every test marked ``one_worker(name)`` with the same name (tests that load
the machine so that two at once would starve each other's clusters: the abuse suite's floods).
Every other test is a group of its own: any worker may run it.

Why not xdist's own ``--dist loadgroup``: it groups by a suffix it writes into each item's
``_nodeid`` on the workers, and pytest 9.2 computes ``nodeid`` from another attribute, so the
suffix is silently lost and every test is scheduled alone (docs/dependency-workarounds.md). Here
the workers write each grouped test's group into a file of the run's own directory as they
collect, and the controller's scheduler (xdist's ``LoadScopeScheduling``, which keeps a scope on
one worker, largest scopes first) reads them: a test's scope is its group.

Must not import: a test module or a conftest; xdist at import time (the suite also runs without it).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

SHARED_SCOPES = frozenset({"module", "class", "package"})
TESTS_ROOT = Path(__file__).resolve().parents[1]
SPARK_FOLDER = TESTS_ROOT / "spark"
FIXED_PORTS_GROUP = "fixed-ports"
SPARK_GROUP = "spark"
WORKER_INPUT_KEY = "rcq_worker_groups_dir"  # the controller's directory, as the workers are given it


def worker_group(item: pytest.Item) -> str | None:
    """The group ``item`` must share a worker with (None: a group of its own)."""
    if item.get_closest_marker("fixed_ports") is not None:
        return FIXED_PORTS_GROUP
    if (marker := item.get_closest_marker("one_worker")) is not None:
        return f"one-worker:{marker.args[0]}"
    if SPARK_FOLDER in item.path.parents:
        return SPARK_GROUP
    definitions = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
    if any(defs and defs[-1].scope in SHARED_SCOPES for defs in definitions.values()):
        return item.path.relative_to(TESTS_ROOT.parent).as_posix()
    return None


def write_groups(items: list[pytest.Item], directory: Path, worker_id: str) -> Path:
    """The groups of ``items`` (grouped ones only: nodeid -> group) in ``directory``, a file per worker."""
    groups = {item.nodeid: group for item in items if (group := worker_group(item)) is not None}
    path = directory / f"{worker_id}.json"
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(groups), encoding="utf-8")
    temporary.replace(path)  # whole or absent, for the controller
    return path


def read_groups(directory: Path) -> dict[str, str]:
    """nodeid -> group, as the workers wrote them (every worker collects the same tests)."""
    files = sorted(directory.glob("*.json"))
    if not files:
        raise RuntimeError(f"no worker wrote its test groups into {directory}: cannot keep groups together")
    groups: dict[str, str] = {}
    for path in files:
        groups.update(json.loads(path.read_text(encoding="utf-8")))
    return groups


def make_scheduler(config: pytest.Config, log: Any, directory: Path) -> Any:
    """xdist's scope scheduler, a test's scope being its group (or the test itself)."""
    from xdist.scheduler import LoadScopeScheduling

    class WorkerGroupScheduling(LoadScopeScheduling):
        _groups: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self._groups is None:
                self._groups = read_groups(directory)
            return self._groups.get(nodeid, nodeid)

    return WorkerGroupScheduling(config, log)
